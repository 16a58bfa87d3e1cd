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

#include "core/budget.h"
#include "core/config.h"
#include "core/log.h"
#include "core/pkt.h"
#include "dispatch/stream.h"
#include "stacks/lwip/lwip_glue.h"
#include "stacks/lwip/lwip_stack.h"
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
static struct flow_key acc_key[8];
static struct stream *acc_s[8];
static int n_acc;
static uint8_t buf[4096];
static struct pkt_view view; /* the view input left: the packet's own with DRIVER_UDP */

static int tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	cr_assert_lt(n_out, MAX_OUT);
	cr_assert_leq(len, sizeof(out[0]));
	memcpy(out[n_out], pkt, len);
	out_len[n_out++] = len;
	return 0;
}

static void on_acc(void *arg, const struct flow_key *k, struct stream *s)
{
	(void)arg;
	acc_key[n_acc] = *k;
	acc_s[n_acc++] = s;
}

static void start(uint32_t tcp_sessions)
{
	char err[TS_ERRLEN];
	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"stack\":\"lwip\",\"tun\":{\"address\":\"198.18.0.1/15\","
					"\"address6\":\"fd00:7f::1/64\"}}",
					&cfg, err, sizeof(err)),
		     0, "%s", err);
	cfg.budget.tcp_sessions[0] = cfg.budget.tcp_sessions[1] = cfg.budget.tcp_sessions[2] =
		tcp_sessions;
	cr_assert_eq(budget_new(&cfg.budget, &bud), 0);
	base = event_base_new();
	log_init(&lg, LOG_LEVEL_ERROR, 2);
	struct netstack_env env = { .base = base, .cfg = &cfg, .budget = bud, .log = &lg,
				    .tx = tx };
	cr_assert_eq(lwip_stack_ops.start(&env, &ns, err, sizeof(err)), 0, "%s", err);
	lwip_stack_set_accept_hook(ns, on_acc, NULL);
	n_out = n_acc = 0;
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

struct counter_query {
	const char *name;
	uint64_t v;
	bool found;
};

static void visit(void *arg, const char *n, uint64_t v)
{
	struct counter_query *q = arg;
	if (strcmp(n, q->name) == 0) {
		q->v = v;
		q->found = true;
	}
}

static uint64_t counter(const char *name)
{
	struct counter_query q = { name, 0, false };
	lwip_stack_ops.counters(ns, visit, &q);
	cr_assert(q.found, "counter %s", name);
	return q.v;
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
	cr_assert_eq(counter("drop_own_address"), 1);
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
