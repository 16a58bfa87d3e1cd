/* test_lwip_stack.c — the lwIP stack's packet path in-process (stacks/lwip/lwip_stack.c):
 * TCP to ANY address and port accepted through the input hooks with the original destination
 * recovered (v4, v6, v6 with extension headers), our filtering before lwIP (fragments, ICMP,
 * own addresses, UDP to the UDP path), admission refused at the SYN with a RST, no timer
 * at all while no pcb exists, and one lwIP stack per process (a second start refused, a new
 * start after free). Packets are hand-built; lwIP's output is captured from tx. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <string.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/log.h"
#include "core/pkt.h"
#include "dispatch/stream.h"
#include "stacks/lwip/lwip_glue.h"
#include "stacks/lwip/lwip_stack.h"
#include "core/evmem.h"
#include "failalloc.h"
#include "testutil.h"

#define MAX_OUT 64

static struct ts_config cfg;
static struct budget *bud;
static struct event_base *base;
static struct netstack *ns;
static struct log lg;
static uint8_t out[MAX_OUT][2048];
static size_t out_len[MAX_OUT];
static int n_out;
static struct flow_key acc_key[300];
static struct stream *acc_s[300];
static int n_acc;
static uint8_t buf[4096];
static struct pkt_view view; /* the view input left: the packet's own with DRIVER_UDP */

static bool tx_discard; /* a test's last packets (teardown's RSTs) are nobody's business */
static uint32_t tun_mtu;  /* the next start's tun.mtu (0: the config's) */

static int tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	if (tx_discard)
		return 0;
	cr_assert_lt(n_out, MAX_OUT);
	cr_assert_leq(len, sizeof(out[0]));
	memcpy(out[n_out], pkt, len);
	out_len[n_out++] = len;
	return 0;
}

static void on_acc(void *arg, const struct flow_key *k, struct stream *s)
{
	(void)arg;
	cr_assert_lt(n_acc, 300);
	acc_key[n_acc] = *k;
	acc_s[n_acc++] = s;
}

static void start_backlog(uint32_t tcp_sessions, uint32_t backlog);

static void start(uint32_t tcp_sessions)
{
	start_backlog(tcp_sessions, 0);
}

/* backlog 0: the profile's budgets.listen_backlog. */
static void start_backlog(uint32_t tcp_sessions, uint32_t backlog)
{
	char err[TS_ERRLEN];
	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"stack\":\"lwip\",\"tun\":{\"address\":\"198.18.0.1/15\","
					"\"address6\":\"fd00:7f::1/64\"}}",
					&cfg, err, sizeof(err)),
		     0, "%s", err);
	cfg.budget.tcp_sessions[0] = cfg.budget.tcp_sessions[1] = cfg.budget.tcp_sessions[2] =
		tcp_sessions;
	if (backlog)
		cfg.budget.listen_backlog = backlog;
	if (tun_mtu)
		cfg.tun.mtu = tun_mtu;
	cr_assert_eq(budget_new(&cfg.budget, &bud), 0);
	base = event_base_new();
	log_init(&lg, LOG_LEVEL_ERROR, 2);
	struct netstack_env env = { .base = base, .cfg = &cfg, .budget = bud, .log = &lg,
				    .tx = tx };
	cr_assert_eq(lwip_stack_ops.start(&env, &ns, err, sizeof(err)), 0, "%s", err);
	lwip_stack_set_accept_hook(ns, on_acc, NULL);
	n_out = n_acc = 0;
	tx_discard = false;
}

static void setup(void)
{
	start(64);
}

static void teardown(void)
{
	for (int i = 0; i < n_acc; i++)
		acc_s[i]->ops->abort(acc_s[i]);
	lwip_stack_ops.free(ns);
	event_base_free(base);
	budget_free(bud);
	config_fini(&cfg);
}

TestSuite(lwip_stack, .init = setup, .fini = teardown);

static enum driver_verdict feed(size_t len, size_t *olen)
{
	bool plain = false;
	size_t ol = 0;
	enum driver_verdict v = lwip_stack_ops.input(ns, 0, buf, len, NULL, 0, &ol, &plain, &view);
	if (olen)
		*olen = ol;
	event_base_loop(base, EVLOOP_NONBLOCK); /* deferred accepts and stream events */
	return v;
}

static uint64_t counter(const char *name)
{
	bool found;
	uint64_t v = tu_stack_counter(&lwip_stack_ops, ns, name, &found);

	cr_assert(found, "counter %s", name);
	return v;
}

/* Handshake with cli:cport -> srv:sport; returns the accepted key. Checks the SYN-ACK comes
 * from the ORIGINAL destination with valid checksums. */
static void handshake(const char *cli, uint16_t cport, const char *srv, uint16_t sport, int n_ext)
{
	struct tu_spec s;
	tu_spec_tcp(&s, cli, cport, srv, sport);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	s.ack = 0;
	s.mss = 1400;
	for (int i = 0; i < n_ext; i++)
		s.ext[s.ext_n++] = (struct tu_ext){ i % 2 ? 60 : 0, 0 };
	int before = n_out;
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(n_out, before + 1, "lwIP answered the SYN");
	struct pkt_view v;
	uint8_t *sa = out[before];
	cr_assert_eq(pkt_parse(&v, sa, out_len[before]), PKT_OK);
	cr_assert_eq(v.proto, IPPROTO_TCP);
	cr_assert_eq(v.tcp_flags, TCP_SYN | TCP_ACK);
	uint8_t a[16];
	size_t alen = v.family == 4 ? 4 : 16;
	tu_addr(a, srv);
	cr_assert_eq(memcmp(pkt_src(&v), a, alen), 0, "SYN-ACK from the original destination");
	tu_addr(a, cli);
	cr_assert_eq(memcmp(pkt_dst(&v), a, alen), 0);
	cr_assert_eq(ntohs(v.sport_be), sport);
	cr_assert_eq(ntohs(v.dport_be), cport);
	if (v.family == 4)
		cr_assert(tu_verify_ip4_header(sa));
	cr_assert(tu_verify_l4(sa, out_len[before]));
	uint32_t their = tu_get32(v.l4 + 4);
	/* The third ACK completes it: the accept callback, then (deferred) our hook. */
	tu_spec_tcp(&s, cli, cport, srv, sport);
	s.tcp_flags = TCP_ACK;
	s.seq = 1001;
	s.ack = their + 1;
	len = tu_build(&s, buf, sizeof(buf));
	int acc_before = n_acc;
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(n_acc, acc_before + 1, "accepted");
	struct flow_key *k = &acc_key[n_acc - 1];
	tu_addr(a, srv);
	cr_assert_eq(memcmp(k->dst, a, alen), 0, "original destination recovered");
	tu_addr(a, cli);
	cr_assert_eq(memcmp(k->src, a, alen), 0);
	cr_assert_eq(ntohs(k->dport_be), sport);
	cr_assert_eq(ntohs(k->sport_be), cport);
}

Test(lwip_stack, any_destination_v4)
{
	handshake("10.0.0.9", 40001, "93.184.216.34", 8443, 0);
	handshake("10.0.0.9", 40002, "1.2.3.4", 22, 0);
	/* Interleaved: an established flow keeps working while new SYNs move the listener. */
	handshake("10.0.0.10", 40003, "93.184.216.34", 8443, 0);
	cr_assert_eq(counter("accepted"), 3);
}

Test(lwip_stack, any_destination_v6_and_extension_headers)
{
	handshake("fd00:7f::9", 40001, "2001:db8::80", 80, 0);
	handshake("fd00:7f::9", 40002, "2001:db8:1::443", 443, 2); /* HBH + DestOpts */
	cr_assert_eq(counter("accepted"), 2);
}

/* A SYN from a multicast, broadcast or IPv4-mapped source: lwIP's IP input would drop it
 * uncounted; it is counted before (drop_special_source, in drops.malformed) and never reaches
 * lwIP or its backlog. */
Test(lwip_stack, a_syn_from_a_special_source_is_counted_before_lwip)
{
	static const char *const src[][2] = { { "224.0.0.9", "192.0.2.80" },
					      { "255.255.255.255", "192.0.2.80" },
					      { "::ffff:10.0.0.9", "2001:db8::80" },
					      { "ff02::1", "2001:db8::80" } };
	struct netstack_stats st;
	struct tu_spec s;

	for (size_t i = 0; i < sizeof(src) / sizeof(src[0]); i++) {
		tu_spec_tcp(&s, src[i][0], 40000, src[i][1], 443);
		s.tcp_flags = TCP_SYN;
		s.seq = 1000;
		cr_assert_eq(feed(tu_build(&s, buf, sizeof(buf)), NULL), DRIVER_DONE);
	}
	cr_assert_eq(counter("drop_special_source"), 4);
	cr_assert_eq(counter("to_lwip"), 0, "none reached lwIP");
	cr_assert_eq(n_out, 0, "none answered");
	lwip_stack_ops.stats(ns, &st);
	cr_assert_eq(st.drops_malformed, 4);
}

Test(lwip_stack, filtering_before_lwip)
{
	struct tu_spec s;
	size_t len, ol;

	tu_spec_tcp(&s, "10.0.0.9", 1, "1.1.1.1", 2);
	s.ip4_frag = 0x2000;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_parse_v4_fragment"), 1);
	tu_spec_tcp(&s, "fd00:7f::9", 1, "2001:db8::1", 2);
	s.ext[0] = (struct tu_ext){ 44, 0 };
	s.ext_n = 1;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_parse_v6_fragment"), 1);
	tu_spec_icmp_echo(&s, "10.0.0.9", "1.1.1.1", 1, 1);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	tu_spec_icmp_echo(&s, "fd00:7f::9", "2001:db8::1", 1, 1);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_icmp"), 2);
	tu_spec_icmp_echo(&s, "10.0.0.9", "198.18.0.1", 7, 1);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, &ol), DRIVER_WRITE, "echo to the gateway answered");
	cr_assert(tu_verify_l4(buf, ol));
	tu_spec_tcp(&s, "10.0.0.9", 1, "198.18.0.3", 80);
	s.tcp_flags = TCP_SYN;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_nat_address"), 1, "to a NAT address");
	tu_spec_tcp(&s, "198.18.0.1", 40000, "198.18.0.3", 80); /* a downlink look-alike */
	s.tcp_flags = TCP_SYN | TCP_ACK;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_nat_address"), 2, "lwIP has no listener ports");
	tu_spec_tcp(&s, "10.0.0.9", 1, "198.18.0.1", 80);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_own_address"), 1, "to the gateway");
	tu_spec_tcp(&s, "198.18.0.4", 1, "1.1.1.1", 80);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	tu_spec_udp(&s, "fd00:7f::2", 1, "2001:db8::1", 443);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_from_nat_address"), 2, "from a NAT address, TCP and UDP");
	/* A wrong IPv4 header checksum: counted here, before lwIP (whose own check counted
	 * nothing), for a SYN, a segment and a datagram alike. */
	tu_spec_tcp(&s, "10.0.0.9", 7, "1.1.1.1", 80);
	s.tcp_flags = TCP_SYN;
	len = tu_build(&s, buf, sizeof(buf));
	buf[10] ^= 0x33;
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	s.tcp_flags = TCP_ACK;
	len = tu_build(&s, buf, sizeof(buf));
	buf[11] ^= 0x01;
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	tu_spec_udp(&s, "10.0.0.9", 7, "1.1.1.1", 443);
	len = tu_build(&s, buf, sizeof(buf));
	buf[10] ^= 0x80;
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_parse_v4_bad_checksum"), 3);
	cr_assert_eq(counter("udp"), 0);
	/* IPv4 options that do not add up. */
	tu_spec_tcp(&s, "10.0.0.9", 8, "1.1.1.1", 80);
	s.ip4_opts[0] = 7;
	s.ip4_opts[1] = 9; /* Record Route past the end of 4 bytes of options */
	s.ip4_opts_len = 4;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_parse_v4_bad_options"), 1);
	tu_spec_udp(&s, "10.0.0.9", 5000, "8.8.8.8", 53);
	len = tu_build(&s, buf, sizeof(buf));
	memset(&view, 0xa5, sizeof(view));
	cr_assert_eq(feed(len, NULL), DRIVER_UDP);
	/* The UDP verdict comes with the packet's view, as pkt_parse gives it. */
	struct pkt_view pv;
	cr_assert_eq(pkt_parse(&pv, buf, len), PKT_OK);
	cr_assert(view.ip == buf && view.l4 == pv.l4 && view.len == pv.len);
	cr_assert(view.proto == IPPROTO_UDP && view.family == 4 && view.l3_len == 20);
	cr_assert(view.sport_be == htons(5000) && view.dport_be == htons(53));
	tu_spec_raw(&s, "10.0.0.9", "1.1.1.1", 47);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(counter("drop_proto"), 1);
	struct netstack_stats o;
	lwip_stack_ops.stats(ns, &o);
	cr_assert_eq(o.drops_protocol, 1, "drops.protocol");
	cr_assert_eq(counter("to_lwip"), 0, "none of these reached lwIP");
	cr_assert_eq(n_out, 0, "lwIP said nothing (no ICMP errors, no echo replies)");
}

Test(lwip_stack, stray_segment_gets_rst_from_its_destination)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "10.0.0.9", 5555, "5.6.7.8", 443);
	s.tcp_flags = TCP_ACK;
	s.seq = 77;
	s.ack = 99;
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(n_out, 1);
	struct pkt_view v;
	cr_assert_eq(pkt_parse(&v, out[0], out_len[0]), PKT_OK);
	cr_assert(v.tcp_flags & TCP_RST);
	uint8_t a[16];
	tu_addr(a, "5.6.7.8");
	cr_assert_eq(memcmp(pkt_src(&v), a, 4), 0);
	cr_assert_eq(n_acc, 0);
}

/* A SYN to a special destination never reaches lwIP: written back in its place, an ICMP port
 * unreachable from the first NAT address (counted in icmp_unreach); none to a multicast one. */
Test(lwip_stack, special_destination_syn_answered_with_port_unreachable)
{
	const char *cases[][3] = { { "198.18.0.1", "127.1.2.3", "198.18.0.2" },
				   { "fd00:7f::1", "::1.2.3.4", "fd00:7f::2" } };
	for (int i = 0; i < 2; i++) {
		struct tu_spec s;
		struct pkt_view v;
		uint8_t a[16], n0[16];
		size_t ol;
		tu_spec_tcp(&s, cases[i][0], 40000, cases[i][1], 80);
		s.tcp_flags = TCP_SYN;
		s.mss = 1460;
		size_t len = tu_build(&s, buf, sizeof(buf));
		cr_assert_eq(feed(len, &ol), DRIVER_WRITE, "%s", cases[i][1]);
		cr_assert(tu_verify_l4(buf, ol), "ICMP checksum");
		cr_assert_eq(pkt_parse(&v, buf, ol), PKT_OK);
		int fam = tu_addr(a, cases[i][0]);
		tu_addr(n0, cases[i][2]);
		cr_assert_eq(v.proto, fam == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6);
		cr_assert_eq(memcmp(pkt_src(&v), n0, fam == 4 ? 4 : 16), 0, "from NAT address 0");
		cr_assert_eq(memcmp(pkt_dst(&v), a, fam == 4 ? 4 : 16), 0, "to the SYN's source");
		cr_assert_eq(v.l4[0], fam == 4 ? 3 : 1);
		cr_assert_eq(v.l4[1], fam == 4 ? 3 : 4);
		if (fam == 4)
			cr_assert(tu_verify_ip4_header(buf));
	}
	struct tu_spec s;
	tu_spec_tcp(&s, "198.18.0.1", 40001, "239.1.2.3", 80);
	s.tcp_flags = TCP_SYN;
	cr_assert_eq(feed(tu_build(&s, buf, sizeof(buf)), NULL), DRIVER_DONE, "multicast");
	cr_assert_eq(counter("icmp_unreach"), 2);
	cr_assert_eq(counter("drop_special_destination"), 3);
	cr_assert_eq(counter("to_lwip"), 0);
	cr_assert_eq(n_out, 0, "lwIP said nothing");
}

Test(lwip_stack, admission_refused_at_the_syn)
{
	teardown();
	start(1);
	handshake("10.0.0.9", 40001, "1.1.1.1", 80, 0);
	/* The one permit is taken by the accepted session (the hook did not end it). */
	cr_assert_eq(budget_tcp_acquire(bud), -EBUSY);
	struct tu_spec s;
	size_t ol = 0;
	tu_spec_tcp(&s, "10.0.0.9", 40002, "1.1.1.1", 80);
	s.tcp_flags = TCP_SYN;
	s.seq = 5;
	size_t len = tu_build(&s, buf, sizeof(buf));
	int before = n_out;
	cr_assert_eq(feed(len, &ol), DRIVER_WRITE, "answered in place");
	cr_assert_eq(n_out, before, "lwIP never saw it");
	struct pkt_view v;
	cr_assert_eq(pkt_parse(&v, buf, ol), PKT_OK);
	cr_assert_eq(v.tcp_flags, TCP_RST | TCP_ACK);
	cr_assert_eq(tu_get32(v.l4 + 8), 6);
	cr_assert(tu_verify_l4(buf, ol));
	cr_assert_eq(counter("admission_refused"), 1);
	struct budget_stats bs;
	budget_get_stats(bud, &bs);
	cr_assert_eq(bs.tcp_refused[BUDGET_NORMAL], 2,
		     "the budget counts the SYN refused, as well as the acquire above");
	/* Ending the session gives the permit back: the next SYN reaches lwIP. */
	acc_s[0]->ops->abort(acc_s[0]);
	n_acc = 0;
	lwip_stack_session_end(ns);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(n_out, before + 2, "RST for the aborted pcb, then the SYN-ACK");
}

Test(lwip_stack, idle_tunnel_has_no_timer)
{
	cr_assert_eq(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED), 0,
		     "nothing armed after start");
	handshake("10.0.0.9", 40001, "1.1.1.1", 80, 0);
	cr_assert_gt(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED), 0,
		     "tcp_tmr armed while a pcb exists");
	acc_s[0]->ops->abort(acc_s[0]);
	n_acc = 0;
	lwip_stack_session_end(ns);
	/* One tick notices no pcb remains and does not re-arm. */
	lwip_stack_tick(ns);
	event_base_loop(base, EVLOOP_NONBLOCK);
	struct timeval tv = { 0, 300000 };
	event_base_loopexit(base, &tv);
	event_base_dispatch(base);
	cr_assert_eq(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED), 0,
		     "no pcbs: no timer");
}

/* A second start while the first runs: refused with -EBUSY and a one-line reason, with nothing
 * of the first changed (its budget still pays for lwIP, its netif still answers). */
Test(lwip_stack, second_stack_refused_first_keeps_working)
{
	struct budget *bud2;
	struct event_base *base2 = event_base_new();
	struct netstack *ns2 = NULL;
	struct budget_stats bs;
	char err[TS_ERRLEN] = "";

	cr_assert_eq(budget_new(&cfg.budget, &bud2), 0);
	struct netstack_env env2 = { .base = base2, .cfg = &cfg, .budget = bud2, .log = &lg,
				     .tx = tx };
	cr_assert_eq(lwip_stack_ops.start(&env2, &ns2, err, sizeof(err)), -EBUSY);
	cr_assert_null(ns2);
	cr_assert(strstr(err, "a second lwIP stack in one process is not possible"), "%s", err);
	cr_assert(strstr(err, "use the system stack"), "%s", err);
	cr_assert_null(strchr(err, '\n'), "one line");
	cr_assert_eq(n_out, 0, "the refused start sent nothing");

	uint64_t mem0 = lwip_glue_mem_bytes();
	budget_get_stats(bud, &bs);
	uint64_t charged0 = bs.buffer_bytes_in_use;
	handshake("10.0.0.9", 40001, "93.184.216.34", 443, 0);
	handshake("fd00:7f::9", 40002, "2001:db8::80", 80, 0);
	cr_assert_eq(counter("accepted"), 2);
	uint64_t grown = lwip_glue_mem_bytes() - mem0;
	cr_assert_gt(grown, 0, "the pcbs live in lwIP");
	budget_get_stats(bud, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use - charged0, grown, "lwIP still charges the first");
	budget_get_stats(bud2, &bs);
	cr_assert_eq(bs.buffer_bytes_peak, 0, "nothing was charged to the refused stack's budget");

	event_base_free(base2);
	budget_free(bud2);
}

/* Free with live connections, then start again in the same process: lwIP is left holding
 * nothing, the new stack accepts, and it holds the claim in turn. */
Test(lwip_stack, free_then_start_again)
{
	char err[TS_ERRLEN] = "";
	struct netstack *ns2 = NULL;

	handshake("10.0.0.9", 40001, "1.1.1.1", 80, 0);
	handshake("10.0.0.9", 40002, "1.1.1.1", 80, 0);
	teardown();
	cr_assert_eq(lwip_glue_mem_bytes(), 0, "free left nothing in lwIP");
	start(64);
	/* The same 4-tuple as before: no pcb of the first stack survived to answer it. */
	handshake("10.0.0.9", 40001, "1.1.1.1", 80, 0);
	handshake("fd00:7f::9", 40003, "2001:db8::1", 443, 0);
	cr_assert_eq(counter("accepted"), 2, "a fresh stack: fresh counters");
	struct netstack_env env2 = { .base = base, .cfg = &cfg, .budget = bud, .log = &lg,
				     .tx = tx };
	cr_assert_eq(lwip_stack_ops.start(&env2, &ns2, err, sizeof(err)), -EBUSY, "claimed again");
	cr_assert_null(ns2);
}

static int tx_meta_stub(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	(void)arg;
	(void)pkt;
	(void)len;
	(void)m;
	return 0;
}

/* A start whose buffers the budget refuses (a 64 KiB send buffer with large segments, over a
 * 32 KiB budget) fails with its error, writes no stack out and leaves lwIP unclaimed. */
Test(lwip_stack, a_start_the_budget_refuses_fails_cleanly)
{
	char err[TS_ERRLEN] = "";
	struct netstack *ns2 = (struct netstack *)&err; /* not to be written */
	struct budget *small;
	int ret;

	teardown();
	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"stack\":\"lwip\"}", &cfg, err, sizeof(err)), 0, "%s",
		     err);
	cfg.budget.buffer_bytes = 32768;
	cr_assert_eq(budget_new(&cfg.budget, &small), 0);
	base = event_base_new();
	struct netstack_env env = { .base = base, .cfg = &cfg, .budget = small, .log = &lg,
				    .tx = tx, .tx_meta = tx_meta_stub };
	ret = lwip_stack_ops.start(&env, &ns2, err, sizeof(err));
	cr_assert_eq(ret, -ENOMEM, "start: %d %s", ret, err);
	cr_assert(strstr(err, strerror(ENOMEM)), "%s", err);
	cr_assert_eq(ns2, (struct netstack *)&err, "no stack written out");
	event_base_free(base);
	budget_free(small);
	config_fini(&cfg);
	start(64); /* lwIP is free again; the suite's teardown frees it */
	handshake("10.0.0.9", 40001, "1.1.1.1", 80, 0);
}

/* ---- half-open connections beyond lwIP's backlog (255) ------------------------------------ */

/* A SYN from src:port to 1.1.1.1:80 at now; returns lwIP's ISN from its SYN-ACK, or 0 when it
 * sent none. */
static uint32_t syn_at(const char *src, uint16_t port, int64_t now)
{
	struct tu_spec s;
	struct pkt_view v;
	bool plain = false;
	size_t ol = 0, len;

	n_out = 0;
	tu_spec_tcp(&s, src, port, "1.1.1.1", 80);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	s.ack = 0;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(lwip_stack_ops.input(ns, 0, buf, len, NULL, now, &ol, &plain, &view),
		     DRIVER_DONE);
	event_base_loop(base, EVLOOP_NONBLOCK);
	if (n_out == 0)
		return 0;
	cr_assert_eq(pkt_parse(&v, out[n_out - 1], out_len[n_out - 1]), PKT_OK);
	cr_assert_eq(v.tcp_flags, TCP_SYN | TCP_ACK);
	return tu_get32(v.l4 + 4);
}

/* The third ACK of the handshake from src:port, whose SYN-ACK carried isn. */
static void ack_at(const char *src, uint16_t port, uint32_t isn, int64_t now)
{
	struct tu_spec s;
	bool plain = false;
	size_t ol = 0, len;

	n_out = 0;
	tu_spec_tcp(&s, src, port, "1.1.1.1", 80);
	s.tcp_flags = TCP_ACK;
	s.seq = 1001;
	s.ack = isn + 1;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(lwip_stack_ops.input(ns, 0, buf, len, NULL, now, &ol, &plain, &view),
		     DRIVER_DONE);
	event_base_loop(base, EVLOOP_NONBLOCK);
}

/* Source i of a spread flood: 10.1.x.y. */
static const char *spread(unsigned i)
{
	static char a[32];

	snprintf(a, sizeof(a), "10.1.%u.%u", i / 250, 1 + i % 250);
	return a;
}

/* n spoofed SYNs from spread sources to port 80, the i-th at t + i * step; each answered. */
static void spread_syns(unsigned n, int64_t t, int64_t step)
{
	for (unsigned i = 0; i < n; i++)
		cr_assert_neq(syn_at(spread(i), 20000, t + (int64_t)i * step), 0, "SYN %u", i);
}

/* One application opens 256 connections at once: its SYNs come first, its ACKs after all of
 * them (several milliseconds later on a busy loop). The 256th SYN finds the backlog full of this
 * application's own handshakes; none of them may go (each client already has its SYN-ACK and
 * would take its ACK's RST for a broken connection): the new SYN is dropped instead, and its
 * client's retransmission gets in once there is room. */
Test(lwip_stack, syn_burst_beyond_the_backlog_keeps_every_handshake)
{
	static uint32_t isn[256];
	int64_t t = SEC(1);

	teardown();
	start(1000);
	for (uint16_t i = 0; i < 255; i++) {
		isn[i] = syn_at("10.0.1.1", (uint16_t)(20000 + i), t + i * 20000);
		cr_assert_neq(isn[i], 0, "SYN %u answered", i);
	}
	cr_expect_eq(syn_at("10.0.1.1", 20255, t + MS(8)), 0, "the 256th SYN waits for room");
	cr_expect_eq(counter("syn_rcvd_evicted"), 0, "no handshake under way evicted");
	cr_expect_eq(counter("drop_backlog_full"), 1);
	for (uint16_t i = 0; i < 255; i++)
		ack_at("10.0.1.1", (uint16_t)(20000 + i), isn[i], t + MS(10));
	cr_expect_eq(n_acc, 255, "every handshake completed");
	/* Its retransmission, a second later: room again. */
	isn[255] = syn_at("10.0.1.1", 20255, t + SEC(1));
	cr_assert_neq(isn[255], 0);
	ack_at("10.0.1.1", 20255, isn[255], t + SEC(1));
	cr_expect_eq(n_acc, 256);
	cr_expect_eq(counter("syn_rcvd_evicted"), 0);
	tx_discard = true;
}

/* A fresh stack with a backlog of 8, filled at t by SYNs from 10.0.1.1 ports 20000-20007;
 * isn[i]: the SYN-ACK's sequence number for port 20000 + i. */
static void backlog_of_eight(uint32_t *isn, int64_t t)
{
	teardown();
	start_backlog(1000, 8);
	for (uint16_t i = 0; i < 8; i++)
		cr_assert_neq(isn[i] = syn_at("10.0.1.1", (uint16_t)(20000 + i), t), 0, "SYN %u", i);
}

/* budgets.listen_backlog is the listener's backlog on lwIP too: with 8, the ninth handshake
 * under way finds no room (one application's burst: nothing evictable), and gets in once one
 * completes. */
Test(lwip_stack, listen_backlog_from_the_budget)
{
	static uint32_t isn[9];
	int64_t t = SEC(1);

	backlog_of_eight(isn, t);
	cr_expect_eq(syn_at("10.0.1.1", 20008, t + MS(1)), 0, "the ninth waits for room");
	cr_expect_eq(counter("drop_backlog_full"), 1);
	ack_at("10.0.1.1", 20000, isn[0], t + MS(2));
	cr_expect_eq(n_acc, 1);
	cr_assert_neq(isn[8] = syn_at("10.0.1.1", 20008, t + MS(3)), 0, "room again");
	for (uint16_t i = 1; i < 9; i++)
		ack_at("10.0.1.1", (uint16_t)(20000 + i), isn[i], t + MS(4));
	cr_expect_eq(n_acc, 9);
	tx_discard = true;
}

/* A client whose SYN-ACK was lost sends its SYN again. With the backlog full, a SYN for a
 * handshake lwIP already holds needs no room: it reaches lwIP, which answers it with its
 * SYN-ACK again at once (instead of the client waiting for lwIP's own retransmission, a
 * second or more), and it is no refused new handshake. A SYN for a new tuple is still
 * refused and counted. */
Test(lwip_stack, a_repeated_syn_of_a_held_handshake_is_answered_when_the_backlog_is_full)
{
	static uint32_t isn[8];
	int64_t t = SEC(1);

	backlog_of_eight(isn, t);
	cr_expect_eq(syn_at("10.0.1.1", 20003, t + MS(1)), isn[3],
		     "the repeated SYN gets the held handshake's SYN-ACK");
	cr_expect_eq(counter("drop_backlog_full"), 0, "a held handshake is no refused one");
	cr_expect_eq(counter("syn_rcvd_evicted") + counter("syn_rcvd_yielded"), 0);
	cr_expect_eq(syn_at("10.0.1.1", 20008, t + MS(1)), 0, "a new tuple finds no room");
	cr_expect_eq(counter("drop_backlog_full"), 1);
	ack_at("10.0.1.1", 20003, isn[3], t + MS(2));
	cr_expect_eq(n_acc, 1, "the repeated SYN's handshake completes");
	tx_discard = true;
}

/* The same with a backlog full of a flood's handshakes old enough to evict: the repeated SYN
 * of one of them evicts nothing (it needs no room) and gets its SYN-ACK again. */
Test(lwip_stack, a_repeated_syn_evicts_nothing)
{
	uint32_t isn;
	int64_t t = SEC(1);

	teardown();
	start(1000);
	cr_assert_neq(isn = syn_at(spread(0), 20000, t), 0);
	for (unsigned i = 1; i < 255; i++)
		cr_assert_neq(syn_at(spread(i), 20000, t + (int64_t)i * 20000), 0, "SYN %u", i);
	cr_expect_eq(syn_at(spread(0), 20000, t + MS(6)), isn, "its SYN-ACK again");
	cr_expect_eq(counter("syn_rcvd_evicted"), 0, "nothing evicted for it");
	cr_expect_eq(counter("drop_backlog_full"), 0);
	tx_discard = true;
}

/* A repeated SYN that meets the full session budget gets the admission RST like any SYN, and
 * its client's connection ends there: the handshake lwIP held for it is let go at once,
 * sending nothing, and its place in the backlog is free for the next SYN (it used to stay
 * until evicted or timed out, its SYN-ACK retransmitted to a client that had given up). */
Test(lwip_stack, a_repeated_syn_refused_by_the_budget_ends_its_held_handshake)
{
	static uint32_t isn[9];
	struct tu_spec s;
	struct pkt_view v;
	size_t ol = 0, len;
	int64_t t = SEC(1);

	teardown();
	start_backlog(1, 8);
	for (uint16_t i = 0; i < 8; i++)
		cr_assert_neq(isn[i] = syn_at("10.0.1.1", (uint16_t)(20000 + i), t), 0, "SYN %u", i);
	cr_assert_eq(budget_tcp_acquire(bud), 0, "the one permit taken: the budget is full");
	n_out = 0;
	tu_spec_tcp(&s, "10.0.1.1", 20003, "1.1.1.1", 80);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, &ol), DRIVER_WRITE, "the admission RST, in place");
	cr_assert_eq(pkt_parse(&v, buf, ol), PKT_OK);
	cr_assert_eq(v.tcp_flags, TCP_RST | TCP_ACK);
	cr_expect_eq(n_out, 0, "lwIP sent nothing for the handshake it let go");
	budget_tcp_release(bud);
	cr_expect_neq(isn[8] = syn_at("10.0.1.1", 20008, t + MS(1)), 0,
		      "the handshake's place in the backlog is free at once");
	cr_expect_eq(counter("drop_backlog_full"), 0);
	cr_expect_eq(counter("admission_refused"), 1, "the SYN counted once, as refused");
	cr_expect_eq(counter("syn_rcvd_refused"), 1, "the handshake it ended counted");
	cr_expect_eq(counter("syn_rcvd_evicted") + counter("syn_rcvd_yielded"), 0);
	/* The index let go of it too: with the backlog full again, a SYN for its tuple is a new
	 * handshake that finds no room, not one lwIP holds. */
	cr_expect_eq(syn_at("10.0.1.1", 20003, t + MS(1)), 0);
	cr_expect_eq(counter("drop_backlog_full"), 1);
	/* Its third ACK (a client that missed the RST) finds no handshake: lwIP resets it. */
	ack_at("10.0.1.1", 20003, isn[3], t + MS(2));
	cr_expect_eq(n_acc, 0);
	cr_expect_eq(n_out, 1);
	cr_assert_eq(pkt_parse(&v, out[0], out_len[0]), PKT_OK);
	cr_expect_eq(v.tcp_flags & TCP_RST, TCP_RST);
	/* The others are still held and complete. */
	ack_at("10.0.1.1", 20008, isn[8], t + MS(2));
	cr_expect_eq(n_acc, 1);
	tx_discard = true;
}

/* The older half goes by when each handshake was opened: a repeated SYN (which lwIP answers,
 * and for which it moves the pcb to the front of its active list) makes a handshake no
 * younger, since a flood can repeat its SYNs as cheaply as it sends new ones. */
Test(lwip_stack, a_repeated_syn_leaves_its_handshake_as_old_as_it_was)
{
	static uint32_t isn[8];
	int64_t t = SEC(1);

	backlog_of_eight(isn, t);
	cr_assert_eq(syn_at("10.0.1.1", 20000, t + MS(1)), isn[0], "the first one, repeated");
	/* Three seconds on, all eight are evictable: the four opened first go, 20000 with them. */
	cr_assert_neq(syn_at("10.0.2.2", 30000, t + SEC(3)), 0);
	cr_expect_eq(counter("syn_rcvd_evicted"), 4);
	ack_at("10.0.1.1", 20000, isn[0], t + SEC(3));
	cr_expect_eq(n_acc, 0, "the repeated one was evicted");
	ack_at("10.0.1.1", 20004, isn[4], t + SEC(3));
	cr_expect_eq(n_acc, 1, "the fifth opened is kept");
	tx_discard = true;
}

/* The handshakes the full backlog checks a SYN against are those lwIP holds now: one its
 * client reset, one that completed and one evicted are gone, and a SYN for their tuples is a
 * new handshake, refused while the backlog is full. */
Test(lwip_stack, a_handshake_gone_is_no_longer_held)
{
	static uint32_t isn[10];
	struct tu_spec s;
	bool plain = false;
	size_t ol = 0, len;
	int64_t t = SEC(1);

	backlog_of_eight(isn, t);
	/* The client of 20003 resets its handshake: lwIP frees the pcb itself. */
	tu_spec_tcp(&s, "10.0.1.1", 20003, "1.1.1.1", 80);
	s.tcp_flags = TCP_RST;
	s.seq = 1001;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(lwip_stack_ops.input(ns, 0, buf, len, NULL, t, &ol, &plain, &view),
		     DRIVER_DONE);
	/* 20000 completes. */
	ack_at("10.0.1.1", 20000, isn[0], t + MS(1));
	cr_assert_eq(n_acc, 1);
	cr_assert_neq(isn[8] = syn_at("10.0.1.1", 20008, t + MS(1)), 0);
	cr_assert_neq(isn[9] = syn_at("10.0.1.1", 20009, t + MS(1)), 0);
	cr_expect_eq(syn_at("10.0.1.1", 20003, t + MS(1)), 0, "the reset handshake is gone");
	cr_expect_eq(counter("drop_backlog_full"), 1);
	cr_expect_eq(syn_at("10.0.1.1", 20000, t + MS(1)), 0, "the completed one is no handshake");
	cr_expect_eq(counter("drop_backlog_full"), 2);
	/* Three seconds on, the next SYN evicts the older half of the eight: 20001, 20002, 20004
	 * and 20005; three more fill the backlog again. A SYN for 20001 is then a new handshake:
	 * it evicts two of the four older ones left and gets in (were it taken for one lwIP holds,
	 * it would reach lwIP's full backlog and get nothing). */
	cr_assert_neq(syn_at("10.0.2.2", 30000, t + SEC(3)), 0);
	cr_expect_eq(counter("syn_rcvd_evicted"), 4);
	for (uint16_t i = 0; i < 3; i++)
		cr_assert_neq(syn_at("10.0.2.2", (uint16_t)(30001 + i), t + SEC(3)), 0);
	cr_expect_neq(syn_at("10.0.1.1", 20001, t + SEC(3)), 0, "the evicted one is gone");
	cr_expect_eq(counter("syn_rcvd_evicted"), 6);
	cr_expect_eq(counter("drop_backlog_full"), 2);
	tx_discard = true;
}

/* Spoofed SYNs from spread sources never complete: once the backlog is full of them, a new SYN
 * evicts the older half of those a few milliseconds old and gets in (flood defence). */
Test(lwip_stack, syn_flood_evicts_the_older_half_of_stale_handshakes)
{
	uint32_t isn;
	int64_t t = SEC(1);

	teardown();
	start(1000);
	spread_syns(255, t, 20000);
	isn = syn_at("10.0.1.1", 30000, t + MS(6));
	cr_expect_neq(isn, 0, "a new SYN gets in");
	/* At 6 ms the 201 SYNs of the first 4 ms are 2 ms old: the older half of them goes. */
	cr_expect_eq(counter("syn_rcvd_evicted"), 201 - 201 / 2, "the older half goes");
	cr_expect_eq(counter("drop_backlog_full"), 0);
	ack_at("10.0.1.1", 30000, isn, t + MS(7));
	cr_expect_eq(n_acc, 1, "and completes");
	tx_discard = true;
}

/* A local application's handshake (from the TUN's own address, 198.18.0.1 by default) is not
 * the flood's to evict: its third ACK may wait behind thousands of spoofed SYNs in the TUN's
 * queue. Spoofed handshakes from spread sources go as before; the local one completes, late. */
Test(lwip_stack, a_spread_flood_keeps_the_local_applications_handshake)
{
	uint32_t isn;
	int64_t t = SEC(1);

	teardown();
	start(1000);
	isn = syn_at("198.18.0.1", 30000, t);
	cr_assert_neq(isn, 0);
	spread_syns(254, t, 20000);
	cr_expect_neq(syn_at(spread(300), 20000, t + MS(6)), 0, "a new SYN gets in");
	/* At 6 ms the 201 spoofed SYNs of the first 4 ms are 2 ms old: the older half of them
	 * goes; the local handshake, the oldest of all, stays. */
	cr_expect_eq(counter("syn_rcvd_evicted"), 201 - 201 / 2);
	ack_at("198.18.0.1", 30000, isn, t + MS(50));
	cr_expect_eq(n_acc, 1, "the local handshake completes");
	tx_discard = true;
}

/* With the backlog full of spoofed handshakes too young to evict (a burst of the flood read at
 * once), a local application's SYN still gets in: the oldest handshake from elsewhere makes
 * room. A SYN from anywhere else is dropped, as before. */
Test(lwip_stack, a_local_syn_gets_in_when_nothing_is_old_enough)
{
	uint32_t isn;
	int64_t t = SEC(1);

	teardown();
	start(1000);
	spread_syns(255, t, 0);
	cr_expect_eq(syn_at(spread(300), 20000, t + MS(1)), 0, "another spoofed SYN waits");
	cr_expect_eq(counter("drop_backlog_full"), 1);
	isn = syn_at("198.18.0.1", 30000, t + MS(1));
	cr_expect_neq(isn, 0, "the local SYN gets in");
	cr_expect_eq(counter("syn_rcvd_yielded"), 1, "one spoofed handshake made room");
	cr_expect_eq(counter("syn_rcvd_evicted"), 0);
	ack_at("198.18.0.1", 30000, isn, t + MS(2));
	cr_expect_eq(n_acc, 1, "and completes");
	tx_discard = true;
}

/* The wait before the next eviction is of the handshakes the full backlog held when it was
 * set: once they complete and a spread flood fills the backlog again, the flood's stale
 * handshakes go at once, not after the old wait (about 3 s, a single source's). */
Test(lwip_stack, the_eviction_wait_goes_with_the_backlog_it_was_set_for)
{
	static uint32_t isn[255];
	int64_t t = SEC(1);

	teardown();
	start(1000);
	for (uint16_t i = 0; i < 255; i++)
		cr_assert_neq(isn[i] = syn_at("10.0.1.1", (uint16_t)(20000 + i), t), 0);
	cr_expect_eq(syn_at(spread(300), 20000, t + MS(8)), 0, "nothing evictable yet");
	for (uint16_t i = 0; i < 255; i++)
		ack_at("10.0.1.1", (uint16_t)(20000 + i), isn[i], t + MS(10));
	cr_expect_eq(n_acc, 255, "the burst completed");
	spread_syns(255, t + MS(20), 20000);
	cr_expect_neq(syn_at(spread(400), 20000, t + MS(30)), 0, "a new SYN gets in");
	cr_expect_eq(counter("syn_rcvd_evicted"), 255 - 255 / 2, "the older half goes");
	tx_discard = true;
}

/* A SYN whose new pcb lwIP has no memory for is dropped by lwIP: counted as such. */
Test(lwip_stack, a_syn_without_memory_for_its_pcb_is_counted)
{
	struct budget_buffer_stats bs;
	uint64_t held;

	budget_buffer_stats(bud, 0, &bs);
	held = bs.bytes_limit - bs.bytes_in_use - 200;
	cr_assert_eq(budget_bytes_reserve(bud, held), 0);
	cr_expect_eq(syn_at("10.0.1.1", 20000, SEC(1)), 0, "no SYN-ACK");
	budget_bytes_release(bud, held);
	cr_expect_eq(counter("to_lwip"), 1);
	cr_expect_eq(counter("drop_nomem"), 1);
	cr_expect_neq(syn_at("10.0.1.1", 20000, SEC(2)), 0, "its retransmission gets in");
	tx_discard = true;
}

/* lwIP abandons the new pcb of a SYN whose SYN-ACK it has no memory to queue: that SYN is
 * dropped for want of memory too, and counted so. The bytes a SYN takes are measured on a
 * first one (the budget's peak: its input segment, the pcb, the SYN-ACK and its segment, all
 * held at once); one byte less fails the last of them, the SYN-ACK's. */
Test(lwip_stack, a_syn_without_memory_for_its_syn_ack_is_counted)
{
	struct budget_buffer_stats bs;
	uint64_t base_bytes, need, held;

	budget_buffer_stats(bud, 0, &bs);
	base_bytes = bs.bytes_in_use;
	budget_buffer_peak_reset(bud);
	cr_assert_neq(syn_at("10.0.1.1", 20000, SEC(1)), 0);
	budget_buffer_stats(bud, 0, &bs);
	need = bs.bytes_peak - base_bytes;
	base_bytes = bs.bytes_in_use;

	held = bs.bytes_limit - base_bytes - (need - 1);
	cr_assert_eq(budget_bytes_reserve(bud, held), 0);
	cr_expect_eq(syn_at("10.0.1.1", 20001, SEC(1)), 0, "no SYN-ACK");
	budget_bytes_release(bud, held);
	cr_expect_eq(counter("to_lwip"), 2, "lwIP had it");
	cr_expect_eq(counter("drop_nomem"), 1, "counted");
	budget_buffer_stats(bud, 0, &bs);
	cr_expect_eq(bs.bytes_in_use, base_bytes, "lwIP kept nothing of it");

	held = bs.bytes_limit - base_bytes - need;
	cr_assert_eq(budget_bytes_reserve(bud, held), 0);
	cr_expect_neq(syn_at("10.0.1.1", 20002, SEC(1)), 0, "with the bytes measured, it gets in");
	budget_bytes_release(bud, held);
	cr_expect_eq(counter("drop_nomem"), 1);
	tx_discard = true;
}

/* A burst of a local application's own connections keeps every handshake, as any burst does:
 * there is nothing from elsewhere to make room, and the 256th SYN waits for its retransmission. */
Test(lwip_stack, a_local_burst_beyond_the_backlog_keeps_every_handshake)
{
	int64_t t = SEC(1);

	teardown();
	start(1000);
	for (uint16_t i = 0; i < 255; i++)
		cr_assert_neq(syn_at("198.18.0.1", (uint16_t)(20000 + i), t), 0);
	cr_expect_eq(syn_at("198.18.0.1", 20255, t + MS(8)), 0, "the 256th SYN waits for room");
	cr_expect_eq(counter("syn_rcvd_evicted"), 0);
	cr_expect_eq(counter("syn_rcvd_yielded"), 0);
	cr_expect_eq(counter("drop_backlog_full"), 1);
	tx_discard = true;
}

/* A flood from a single source is left alone for 3 s at most (when a client sends its SYN a
 * third time): then the older half of it goes. */
Test(lwip_stack, single_source_flood_goes_after_three_seconds)
{
	int64_t t = SEC(1);

	teardown();
	start(1000);
	for (uint16_t i = 0; i < 255; i++)
		cr_assert_neq(syn_at("10.0.1.1", (uint16_t)(20000 + i), t), 0);
	cr_expect_eq(syn_at("10.0.2.2", 30000, t + MS(2999)), 0, "everything under 3 s");
	cr_expect_neq(syn_at("10.0.2.2", 30000, t + SEC(3)), 0, "then room");
	cr_expect_eq(counter("syn_rcvd_evicted"), 255 - 255 / 2);
	cr_expect_eq(counter("drop_backlog_full"), 1);
	tx_discard = true;
}

/* A connection (MSS 1400) with 9800 bytes of data written: 7 segments of 1400 bytes, the first
 * cwnd sends 3, the rest stay queued. Returns the stream; *their: lwIP's ISN. */
static struct stream *queued_segments(uint8_t *data, uint32_t *their)
{
	struct pkt_view v;
	struct stream *st;

	handshake("10.0.0.2", 40000, "198.18.0.9", 443, 0);
	cr_assert_eq(pkt_parse(&v, out[0], out_len[0]), PKT_OK);
	*their = tu_get32(v.l4 + 4);
	st = acc_s[0];
	memset(data, 'x', 9800);
	cr_assert_eq(st->ops->write(st, data, 9800), 9800);
	event_base_loop(base, EVLOOP_NONBLOCK);
	return st;
}

/* lwIP queues an out-of-order segment without trimming it to its receive window (the first one
 * queued, or a longer one with a queued one's sequence number); once the gap before it fills,
 * its receive path asserts that the window holds the segment, and the process aborts. A
 * sender that keeps to the window never sends one: it is dropped before lwIP, counted (also in
 * drops.malformed), and the connection goes on with every in-window byte delivered. */
Test(lwip_stack, an_out_of_order_segment_past_the_window_is_dropped)
{
	static uint8_t got[70000];
	struct netstack_stats ss;
	struct tu_spec s;
	struct pkt_view v;
	uint32_t wnd, edge, sent = 0;
	size_t n = 0;
	ssize_t r;

	handshake("10.0.0.2", 40000, "198.18.0.9", 443, 0); /* no window scaling: 64 KiB - 1 */
	cr_assert_eq(pkt_parse(&v, out[0], out_len[0]), PKT_OK);
	wnd = tu_get16(v.l4 + 14);
	cr_assert_gt(wnd, 4000);
	edge = 1001 + wnd;
	tu_spec_tcp(&s, "10.0.0.2", 40000, "198.18.0.9", 443);
	s.tcp_flags = TCP_ACK;
	s.ack = tu_get32(v.l4 + 4) + 1;
	s.seq = edge - 100; /* starts inside the window, ends 900 bytes past it */
	s.payload_len = 1000;
	s.payload_seed = 7;
	(void)feed(tu_build(&s, buf, sizeof(buf)), NULL);
	/* The gap filled, in order, up to 100 bytes short of the edge: the app reads nothing, so
	 * the window is then 100 bytes. */
	tx_discard = true;
	while (sent < wnd - 100) {
		s.seq = 1001 + sent;
		s.payload_len = wnd - 100 - sent < 1400 ? wnd - 100 - sent : 1400;
		s.payload_seed = 100 + sent;
		(void)feed(tu_build(&s, buf, sizeof(buf)), NULL);
		sent += (uint32_t)s.payload_len;
	}
	while ((r = acc_s[0]->ops->read(acc_s[0], got + n, sizeof(got) - n)) > 0)
		n += (size_t)r;
	cr_assert_eq(n, wnd - 100, "every in-window byte delivered");
	cr_assert_eq(counter("drop_past_window"), 1);
	lwip_stack_ops.stats(ns, &ss);
	cr_assert_geq(ss.drops_malformed, 1);
}

/* RFC 9293 (3.7.1): the MSS option is sent only in SYN segments. lwIP would take one from any
 * segment and shrink the connection's MSS below segments it has already queued, which its next
 * tcp_write asserts against (the process would abort on an app's single ACK). The option is
 * ignored outside a SYN; the connection keeps its MSS. */
Test(lwip_stack, an_mss_option_after_the_handshake_is_ignored)
{
	static uint8_t data[20000];
	struct tu_spec s;
	struct pkt_view v;
	uint32_t their;
	size_t biggest = 0;
	struct stream *st = queued_segments(data, &their);

	tu_spec_tcp(&s, "10.0.0.2", 40000, "198.18.0.9", 443);
	s.tcp_flags = TCP_ACK;
	s.seq = 1001;
	s.ack = their + 1;
	s.mss = 536;
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	ssize_t w = st->ops->write(st, data, sizeof(data) - 9800);
	cr_assert(w > 0 || w == -EAGAIN, "write after the option: %zd", w);
	for (int i = 0; i < 20 && n_out < MAX_OUT - 8; i++) {
		s.mss = 0;
		s.ack = their + 1 + (uint32_t)(i + 1) * 2800;
		len = tu_build(&s, buf, sizeof(buf));
		feed(len, NULL);
	}
	for (int i = 0; i < n_out; i++) {
		cr_assert_eq(pkt_parse(&v, out[i], out_len[i]), PKT_OK);
		/* data written after the option */
		if (tu_get32(v.l4 + 4) - (their + 1) >= 9800 &&
		    v.len - v.l3_len - v.tcp_hlen > biggest)
			biggest = v.len - v.l3_len - v.tcp_hlen;
	}
	cr_assert_eq(biggest, 1400, "new segments keep the MSS of the SYN");
	cr_assert_eq(counter("mss_option_ignored"), 1);
	tx_discard = true;
}

/* The walk over an ACK's options that finds the MSS option stops where lwIP's own parser stops
 * (end of option list, a length under 2 or past the options) and finds it after other options. */
Test(lwip_stack, mss_options_found_where_lwip_would_read_them)
{
	static const struct {
		uint8_t opts[12];
		uint8_t len;
		int stripped;
	} cases[] = {
		{ { 1, 1, 2, 4, 0x02, 0x18 }, 8, 1 },                /* NOP NOP MSS 536 */
		{ { 0, 2, 4, 0x02, 0x18 }, 8, 0 },                   /* EOL: nothing after it */
		{ { 2, 0, 2, 4, 0x02, 0x18 }, 8, 0 },                /* length 0: parsing stops */
		{ { 5, 10, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4 }, 12, 0 },   /* MSS cut off by the end */
		{ { 8, 6, 1, 2, 3, 4, 2, 4, 0x02, 0x18 }, 12, 1 },   /* after another option */
		{ { 99, 40, 2, 4, 0x02, 0x18 }, 8, 0 },              /* a length past the end */
	};
	static uint8_t data[9800];
	struct tu_spec s;
	uint32_t their;
	int want = 0;
	struct stream *st = queued_segments(data, &their);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		tu_spec_tcp(&s, "10.0.0.2", 40000, "198.18.0.9", 443);
		s.tcp_flags = TCP_ACK;
		s.seq = 1001;
		s.ack = their + 1;
		memcpy(s.tcp_opts, cases[i].opts, cases[i].len);
		s.tcp_opts_len = cases[i].len;
		size_t len = tu_build(&s, buf, sizeof(buf));
		cr_assert_eq(feed(len, NULL), DRIVER_DONE);
		want += cases[i].stripped;
		cr_assert_eq(counter("mss_option_ignored"), (uint64_t)want, "case %zu", i);
		/* queued 1400-byte segments: a lowered MSS would abort the next write */
		ssize_t w = st->ops->write(st, data, 1400);
		cr_assert(w > 0 || w == -EAGAIN, "case %zu: write %zd", i, w);
	}
	tx_discard = true;
}

/* A SYN repeated while the handshake is open may carry another MSS option. lwIP 2.1 takes it
 * there (tcp_process parses the options of every segment) without the cap its listener applies
 * to the first SYN's (the MTU of the interface): a repeated SYN announcing 1440 on a TUN of MTU
 * 1280 made every data segment 1480 bytes, each dropped at output (drop_too_big), and the
 * connection stalled. The connection keeps the MSS of the SYN that opened it. */
Test(lwip_stack, a_repeated_syn_keeps_the_mss_of_the_first)
{
	static uint8_t data[6000];
	struct tu_spec s;
	struct pkt_view v;
	size_t len, biggest = 0;

	teardown();
	tun_mtu = 1280;
	start(64);
	tun_mtu = 0;
	tu_spec_tcp(&s, "10.0.0.2", 40000, "198.18.0.9", 443);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	s.mss = 1240;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	s.mss = 1440; /* the same SYN again, another MSS */
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(n_out, 2, "two SYN-ACKs");
	cr_assert_eq(pkt_parse(&v, out[0], out_len[0]), PKT_OK);
	uint32_t their = tu_get32(v.l4 + 4);
	tu_spec_tcp(&s, "10.0.0.2", 40000, "198.18.0.9", 443);
	s.tcp_flags = TCP_ACK;
	s.seq = 1001;
	s.ack = their + 1;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(feed(len, NULL), DRIVER_DONE);
	cr_assert_eq(n_acc, 1);
	memset(data, 'x', sizeof(data));
	cr_assert_eq(acc_s[0]->ops->write(acc_s[0], data, sizeof(data)), (ssize_t)sizeof(data));
	event_base_loop(base, EVLOOP_NONBLOCK);
	for (int i = 2; i < n_out; i++) {
		cr_assert_leq(out_len[i], 1280, "a packet within the MTU");
		cr_assert_eq(pkt_parse(&v, out[i], out_len[i]), PKT_OK);
		if (v.len - v.l3_len - v.tcp_hlen > biggest)
			biggest = v.len - v.l3_len - v.tcp_hlen;
	}
	cr_assert_eq(biggest, 1240, "segments of the first SYN's MSS");
	cr_assert_eq(counter("drop_too_big"), 0);
	cr_assert_eq(counter("mss_option_ignored"), 1);
	tx_discard = true;
}

/* An option kind that is the last byte of the options has no length byte: lwIP 2.1's option
 * parser reads the byte after the options as its length, one past a segment without payload
 * (a read past the end of lwIP's buffer, which AddressSanitizer reports). The options end
 * there (an EOL) before lwIP parses them, as at a malformed length; what comes before is
 * taken: the SYN's MSS of 1200. Both a SYN to the listener and an ACK of the connection. */
Test(lwip_stack, an_option_without_its_length_ends_the_options)
{
	static const uint8_t opts[][8] = {
		{ 2, 4, 0x04, 0xb0, 1, 1, 1, 30 }, /* MSS 1200, NOPs, kind 30 */
		{ 2, 4, 0x04, 0xb0, 1, 1, 1, 2 },  /* ... an MSS kind */
		{ 2, 4, 0x04, 0xb0, 1, 1, 1, 3 },  /* ... a window scale kind */
	};
	static uint8_t data[3000];
	struct tu_spec s;
	struct pkt_view v;

	for (uint16_t i = 0; i < 3; i++) {
		int before = n_out;

		tu_spec_tcp(&s, "10.0.0.2", (uint16_t)(40000 + i), "198.18.0.9", 443);
		s.tcp_flags = TCP_SYN;
		s.seq = 1000;
		memcpy(s.tcp_opts, opts[i], 8);
		s.tcp_opts_len = 8;
		cr_assert_eq(feed(tu_build(&s, buf, sizeof(buf)), NULL), DRIVER_DONE);
		cr_assert_eq(n_out, before + 1, "SYN-ACK");
		cr_assert_eq(pkt_parse(&v, out[before], out_len[before]), PKT_OK);
		s.tcp_flags = TCP_ACK;
		s.seq = 1001;
		s.ack = tu_get32(v.l4 + 4) + 1;
		memcpy(s.tcp_opts, (const uint8_t[]){ 1, 1, 1, 8 }, 4); /* a timestamps kind */
		s.tcp_opts_len = 4;
		cr_assert_eq(feed(tu_build(&s, buf, sizeof(buf)), NULL), DRIVER_DONE);
		cr_assert_eq(n_acc, i + 1, "accepted");
	}
	memset(data, 'x', sizeof(data));
	n_out = 0;
	cr_assert_eq(acc_s[0]->ops->write(acc_s[0], data, sizeof(data)), (ssize_t)sizeof(data));
	event_base_loop(base, EVLOOP_NONBLOCK);
	cr_assert_gt(n_out, 0);
	cr_assert_eq(pkt_parse(&v, out[0], out_len[0]), PKT_OK);
	cr_assert_eq(v.len - v.l3_len - v.tcp_hlen, 1200, "the MSS before the cut option");
	tx_discard = true;
}

/* lwIP 2.1 starts its persist timer when the window cannot take the next unsent segment and
 * nothing is in flight, and stops it only when tcp_output sends. A retransmission timeout moves
 * the segments in flight back to unsent; with the window shut then, the persist timer starts.
 * An ACK that acknowledges those segments (they had arrived: only the ACK was late) frees them
 * from unsent and leaves the timer running on empty queues, and lwIP's next slow timer asserts
 * ("persist ticking with empty send buffer"): the process aborted. */
Test(lwip_stack, an_ack_of_segments_a_timeout_moved_back_stops_the_persist_timer)
{
	static uint8_t data[2800];
	struct tu_spec s;
	struct pkt_view v;
	struct stream *st;
	uint32_t their;
	int before;

	handshake("10.0.0.2", 40000, "198.18.0.9", 443, 0);
	cr_assert_eq(pkt_parse(&v, out[0], out_len[0]), PKT_OK);
	their = tu_get32(v.l4 + 4);
	st = acc_s[0];
	memset(data, 'x', sizeof(data));
	cr_assert_eq(st->ops->write(st, data, sizeof(data)), (ssize_t)sizeof(data));
	event_base_loop(base, EVLOOP_NONBLOCK);
	tu_spec_tcp(&s, "10.0.0.2", 40000, "198.18.0.9", 443);
	s.tcp_flags = TCP_ACK;
	s.seq = 1001;
	s.ack = their + 1 + 1400; /* the first segment, and the window shut */
	s.window = 0;
	cr_assert_eq(feed(tu_build(&s, buf, sizeof(buf)), NULL), DRIVER_DONE);
	for (int i = 0; i < 40; i++) /* 10 s: the retransmission timeout */
		lwip_stack_tick(ns);
	s.ack = their + 1 + sizeof(data); /* everything, the window open */
	s.window = 65535;
	cr_assert_eq(feed(tu_build(&s, buf, sizeof(buf)), NULL), DRIVER_DONE);
	for (int i = 0; i < 40; i++)
		lwip_stack_tick(ns);
	before = n_out;
	cr_assert_eq(st->ops->write(st, data, 1000), 1000);
	event_base_loop(base, EVLOOP_NONBLOCK);
	cr_assert_gt(n_out, before, "the connection sends on");
	tx_discard = true;
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* start_backlog's stack, each step allowed to fail for want of memory: false then, with
 * what was made undone. */
static bool nomem_start(bool sweep)
{
	char err[TS_ERRLEN] = "";
	int rc;

	ns = NULL;
	bud = NULL;
	base = NULL;
	rc = config_load_string("{\"stack\":\"lwip\",\"tun\":{\"address\":\"198.18.0.1/15\","
				"\"address6\":\"fd00:7f::1/64\"}}", &cfg, err, sizeof(err));
	if (rc)
		goto undo;
	cfg.budget.listen_backlog = 4;
	if ((rc = budget_new(&cfg.budget, &bud)) != 0)
		goto undo;
	failalloc_hold(true); /* the test's loop */
	base = event_base_new();
	failalloc_hold(false);
	cr_assert_not_null(base);
	log_init(&lg, LOG_LEVEL_ERROR, 2);
	struct netstack_env env = { .base = base, .cfg = &cfg, .budget = bud, .log = &lg,
				    .tx = tx };
	if ((rc = lwip_stack_ops.start(&env, &ns, err, sizeof(err))) != 0) {
		ns = NULL;
		goto undo;
	}
	lwip_stack_set_accept_hook(ns, on_acc, NULL);
	n_out = n_acc = 0;
	tx_discard = false;
	return true;
undo:
	cr_assert(sweep && (rc == -ENOMEM || rc == -ENOBUFS), "start: %d: %s", rc, err);
	if (base)
		event_base_free(base);
	budget_free(bud);
	config_fini(&cfg);
	return false;
}

/* What the stack answered to the client at cport among the packets from `from` on: the
 * first one's TCP flags (0: none). */
static uint8_t answer_to(int from, uint16_t cport, uint32_t *their)
{
	for (int i = from; i < n_out; i++) {
		struct pkt_view v;

		if (pkt_parse(&v, out[i], out_len[i]) != PKT_OK || v.proto != IPPROTO_TCP ||
		    ntohs(v.dport_be) != cport)
			continue;
		if (their)
			*their = tu_get32(v.l4 + 4);
		return v.tcp_flags;
	}
	return 0;
}

/* A connection from cli:cport: its SYN answered (SYN-ACK), refused (RST) or dropped and
 * counted as no memory (the client's retransmission then gets in); once answered, the
 * handshake's ACK and a segment of data reach an accepted stream, or the client is reset.
 * Unless sweeping, it must be accepted. */
static void nomem_conn(const char *cli, uint16_t cport, bool sweep)
{
	const char *srv = cli[0] == 'f' ? "2001:db8::80" : "192.0.2.80";
	uint64_t nomem = counter("drop_nomem");
	struct tu_spec s;
	uint32_t their = 0;
	uint8_t flags = 0;
	int acc = n_acc, from;

	for (int syn = 0; syn < 2 && !flags; syn++) {
		tu_spec_tcp(&s, cli, cport, srv, 443);
		s.tcp_flags = TCP_SYN;
		s.seq = 1000;
		s.mss = 1400;
		from = n_out;
		(void)feed(tu_build(&s, buf, sizeof(buf)), NULL);
		flags = answer_to(from, cport, &their);
		cr_assert(flags || (syn == 0 && counter("drop_nomem") > nomem),
			  "port %u: SYN %d neither answered nor counted", cport, syn);
	}
	if (flags & TCP_RST) {
		cr_assert(sweep, "port %u refused", cport);
		return;
	}
	cr_assert_eq(flags, TCP_SYN | TCP_ACK);
	tu_spec_tcp(&s, cli, cport, srv, 443);
	s.tcp_flags = TCP_ACK;
	s.seq = 1001;
	s.ack = their + 1;
	from = n_out;
	(void)feed(tu_build(&s, buf, sizeof(buf)), NULL);
	if (n_acc == acc) {
		/* Refused at accept (no memory for the session): the client is reset. */
		cr_assert(sweep, "port %u not accepted", cport);
		cr_assert(answer_to(from, cport, NULL) & TCP_RST, "port %u: neither accepted nor "
			  "reset", cport);
		return;
	}
	tu_spec_tcp(&s, cli, cport, srv, 443);
	s.tcp_flags = TCP_ACK | TCP_PSH;
	s.seq = 1001;
	s.ack = their + 1;
	s.payload = (const uint8_t *)"hello";
	s.payload_len = 5;
	(void)feed(tu_build(&s, buf, sizeof(buf)), NULL);
}

/* The stack's life: started, a v4 and a v6 connection accepted (one written to), freed with
 * both open; every budget unit back. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct budget_stats bs;

	(void)arg;
	if (!nomem_start(sweep))
		return;
	nomem_conn("10.0.0.9", 40001, sweep);
	nomem_conn("fd00::9", 40002, sweep);
	nomem_conn("10.0.0.9", 40003, sweep);
	if (n_acc)
		(void)acc_s[0]->ops->write(acc_s[0], (const uint8_t *)"world", 5);
	event_base_loop(base, EVLOOP_NONBLOCK);
	tx_discard = true;
	for (int i = 0; i < n_acc; i++) {
		acc_s[i]->ops->abort(acc_s[i]);
		lwip_stack_session_end(ns);
	}
	n_acc = 0;
	lwip_stack_ops.free(ns);
	ns = NULL;
	budget_get_stats(bud, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 0, "buffer bytes kept");
	cr_assert_eq(bs.tcp_in_use, 0, "permits kept");
	event_base_free(base);
	budget_free(bud);
	config_fini(&cfg);
}

Test(lwip_stack_nomem, each_allocation_refused_in_turn, .timeout = 300)
{
	/* libevent allocates through the project's allocator, as twinstack runs it. */
	cr_assert_eq(evmem_install(), 0);
	cr_log_info("%ld allocations refused in turn",
		    failalloc_sweep(nomem_scenario, NULL, 10, 5000));
}

/* lwIP's TCP timer when libevent has no room for it in its timer heap (the first timer of a
 * fresh loop makes the heap): each allocation of a handshake refused in turn, then one batch
 * ends. While a pcb exists (here: an accepted connection) the timer must be pending by then (the only event this stack adds
 * to its loop: its other events are only ever made active); a timer taken as armed when it
 * was not would never tick again (no retransmission, no delayed ACK, no TIME_WAIT's end). */
static void timer_scenario(void *arg, bool sweep)
{
	(void)arg;
	failalloc_hold(true); /* the stack's start: not what this looks at */
	bool started = nomem_start(sweep);
	failalloc_hold(false);
	cr_assert(started);
	nomem_conn("10.0.0.9", 40001, sweep);
	failalloc_hold(true);
	lwip_stack_ops.batch_end(ns, 0, 0);
	if (n_acc > 0) /* an accepted connection: its pcb exists */
		cr_assert_gt(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED), 0,
			     "a pcb, and lwIP's timer not armed");
	tx_discard = true;
	for (int i = 0; i < n_acc; i++) {
		acc_s[i]->ops->abort(acc_s[i]);
		lwip_stack_session_end(ns);
	}
	n_acc = 0;
	lwip_stack_ops.free(ns);
	ns = NULL;
	event_base_free(base);
	budget_free(bud);
	config_fini(&cfg);
	failalloc_hold(false);
}

Test(lwip_stack_nomem, tcp_timer_armed_again_when_libevent_refused_it)
{
	cr_assert_eq(evmem_install(), 0);
	cr_log_info("%ld allocations refused in turn",
		    failalloc_sweep(timer_scenario, NULL, 3, 2000));
}

/* ---- lwIP's timer re-armed with libevent out of memory ---- */

/* A timer of the test's, due just before lwIP's in the same loop pass: it takes the places in
 * libevent's timer heap the two gave back, then refuses the next allocation. */
struct heap_taker {
	struct event *pads[64];
	int n;
};

static void on_take_heap(evutil_socket_t fd, short what, void *arg)
{
	struct heap_taker *h = arg;

	(void)fd;
	(void)what;
	h->n = failalloc_fill_timers(base, h->pads, 64);
	failalloc_arm(1);
}

/* Segments from the stack to the client at cport carrying n bytes of payload, among all sent. */
static int data_sent_to(uint16_t cport, size_t n)
{
	int count = 0;

	for (int i = 0; i < n_out; i++) {
		struct pkt_view v;

		if (pkt_parse(&v, out[i], out_len[i]) == PKT_OK && v.proto == IPPROTO_TCP &&
		    ntohs(v.dport_be) == cport && v.len - v.l3_len - v.tcp_hlen == n)
			count++;
	}
	return count;
}

/* lwIP's timer fires and is re-armed from its callback; a callback that ran first in the same
 * loop pass took the place it gave back in libevent's timer heap, and the heap cannot grow.
 * A connection whose data the client never acknowledges, and that sees no other traffic,
 * waits on lwIP's retransmission alone: the segment must still be sent again. */
Test(lwip_stack_nomem, retransmits_when_the_timer_re_arm_finds_no_memory, .timeout = 30)
{
	struct heap_taker h = { 0 };
	struct timeval soon = { 0, 1000 };
	struct event *t;
	int64_t end;

	cr_assert_eq(evmem_install(), 0);
	start(64);
	handshake("10.0.0.9", 40001, "192.0.2.80", 443, 0);
	cr_assert_eq(acc_s[0]->ops->write(acc_s[0], (const uint8_t *)"world", 5), 5);
	event_base_loop(base, EVLOOP_NONBLOCK);
	cr_assert_eq(data_sent_to(40001, 5), 1, "the data went out once");
	cr_assert_not_null(t = evtimer_new(base, on_take_heap, &h));
	cr_assert_eq(evtimer_add(t, &soon), 0); /* due before lwIP's next tick */
	usleep(300000);                          /* both due */
	event_base_loop(base, EVLOOP_NONBLOCK);
	failalloc_arm(0);
	cr_assert(failalloc_fired(), "the re-arm needed no memory: nothing tested");
	end = ts_now_ns() + 8 * TS_NS_PER_SEC; /* the retransmission timeout is a few seconds */
	while (data_sent_to(40001, 5) < 2 && ts_now_ns() < end) {
		event_base_loop(base, EVLOOP_NONBLOCK);
		usleep(5000);
	}
	cr_assert_geq(data_sent_to(40001, 5), 2, "never retransmitted");
	cr_assert_eq(counter("timer_spare_used"), 1);
	cr_assert_eq(counter("timer_unarmed"), 0);
	tx_discard = true;
	failalloc_unpad(h.pads, h.n);
	event_free(t);
	teardown();
}
