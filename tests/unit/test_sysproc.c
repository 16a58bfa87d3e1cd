/* test_sysproc.c — the system stack's per-packet processor (stacks/system/sysproc.c) over a
 * real NAT table: classification, in-place rewriting with verified checksums (plain and
 * NEEDS_CSUM), downlink recovery, RST generation, ICMP, own-address and DNS rules, counters. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "core/pkt.h"
#include "stacks/system/nat.h"
#include "stacks/system/sysproc.h"
#include "testutil.h"

#define LPORT0 40000
#define LPORT1 40001

static struct nat_table *nat;
static struct sysproc *proc;
static struct sys_counters ctr;
static uint8_t buf[TU_PKT_MAX];
static struct pkt_view view; /* where sysproc_process parsed the last packet */

static void make_with(const struct nat_config *ncp, bool hijack)
{
	struct nat_config nc = *ncp;
	struct sysproc_config pc;

	cr_assert_eq(nat_table_new(&nc, &nat), 0);
	memset(&pc, 0, sizeof(pc));
	pc.n_addrs = nc.n_addrs;
	pc.n_listeners = 2;
	pc.dns_hijack = hijack;
	pc.conn_numbers = true;
	pc.v4.enabled = true;
	tu_addr(pc.v4.gateway, "198.18.0.1");
	pc.v4.listener_ports_be[0] = htons(LPORT0);
	pc.v4.listener_ports_be[1] = htons(LPORT1);
	pc.v6.enabled = true;
	tu_addr(pc.v6.gateway, "fd00:7f::1");
	pc.v6.listener_ports_be[0] = htons(LPORT0 + 10);
	pc.v6.listener_ports_be[1] = htons(LPORT1 + 10);
	cr_assert_eq(sysproc_new(&pc, nat, &proc), 0);
	memset(&ctr, 0, sizeof(ctr));
}

static void make(uint32_t max_entries, bool hijack)
{
	struct nat_config nc;

	nat_config_default(&nc);
	nc.max_entries = max_entries;
	nc.seed = 42;
	make_with(&nc, hijack);
}

static void setup(void)
{
	make(1024, false);
}

static void teardown(void)
{
	sysproc_free(proc);
	nat_table_free(nat);
}

TestSuite(sysproc, .init = setup, .fini = teardown);

static struct sys_disp run(size_t len, int64_t now)
{
	return sysproc_process(proc, buf, len, NULL, now, &ctr, &view);
}

static const uint8_t *src_of(void) { return buf[0] >> 4 == 4 ? buf + 12 : buf + 8; }
static const uint8_t *dst_of(void) { return buf[0] >> 4 == 4 ? buf + 16 : buf + 24; }

static size_t l4off(size_t len)
{
	struct tu_layout lo;
	cr_assert(tu_layout(buf, len, &lo));
	return lo.l3_len;
}

static void assert_valid(size_t len)
{
	if (buf[0] >> 4 == 4)
		cr_assert(tu_verify_ip4_header(buf), "IPv4 header checksum");
	cr_assert(tu_verify_l4(buf, len), "L4 checksum");
}

/* Uplink SYN: rewritten to nat_addr:P -> gateway:listener, checksums valid, mapping created. */
static void uplink_syn(const char *cli, const char *srv, uint16_t cport, uint16_t sport,
		       struct nat_tuple *t_out, size_t *len_out)
{
	struct tu_spec s;
	uint8_t gw[16], natbase[16];

	tu_spec_tcp(&s, cli, cport, srv, sport);
	s.tcp_flags = TCP_SYN;
	s.mss = 1460;
	s.payload_len = 0;
	size_t len = tu_build(&s, buf, sizeof(buf));
	struct sys_disp d = run(len, SEC(1));
	cr_assert_eq(d.action, SYS_WRITE);
	cr_assert_eq(d.len, len);
	cr_assert_not(d.plain);
	assert_valid(len);
	int fam = tu_addr(gw, s.family == 4 ? "198.18.0.1" : "fd00:7f::1");
	size_t alen = fam == 4 ? 4 : 16;
	cr_assert_eq(memcmp(dst_of(), gw, alen), 0, "uplink goes to the gateway");
	memcpy(natbase, gw, 16);
	uint8_t off = (uint8_t)(src_of()[alen - 1] - gw[alen - 1]);
	cr_assert(off >= 1 && off <= 4, "source is one of the NAT addresses");
	cr_assert_eq(memcmp(src_of(), gw, alen - 1), 0);
	size_t o = l4off(len);
	uint16_t lport = tu_get16(buf + o + 2), p = tu_get16(buf + o);
	uint16_t base = fam == 4 ? LPORT0 : LPORT0 + 10;
	cr_assert(lport == base || lport == base + 1);
	t_out->family = (uint8_t)fam;
	t_out->addr = (uint8_t)(off - 1);
	t_out->listener = (uint8_t)(lport - base);
	t_out->port = p;
	*len_out = len;
}

/* The kernel's answer on the accepted socket: gateway:listener -> nat_addr:P. */
static size_t kernel_reply(const struct nat_tuple *t, uint8_t flags, size_t payload)
{
	struct tu_spec s;
	char gw[64], na[64];
	if (t->family == 4) {
		snprintf(gw, sizeof(gw), "198.18.0.1");
		snprintf(na, sizeof(na), "198.18.0.%d", 2 + t->addr);
	} else {
		snprintf(gw, sizeof(gw), "fd00:7f::1");
		snprintf(na, sizeof(na), "fd00:7f::%x", 2 + t->addr);
	}
	uint16_t base = t->family == 4 ? LPORT0 : LPORT0 + 10;
	tu_spec_tcp(&s, gw, (uint16_t)(base + t->listener), na, t->port);
	s.tcp_flags = flags;
	s.payload_len = payload;
	return tu_build(&s, buf, sizeof(buf));
}

static void roundtrip(const char *cli, const char *srv)
{
	struct nat_tuple t;
	size_t len;
	uint8_t c[16], sv[16];
	tu_addr(c, cli);
	int fam = tu_addr(sv, srv);
	size_t alen = fam == 4 ? 4 : 16;

	uplink_syn(cli, srv, 50123, 443, &t, &len);
	cr_assert_eq(ctr_get(&ctr.uplink), 1);

	/* The accept loop finds the original pair by the tuple. */
	struct flow_key k;
	uint64_t gen;
	cr_assert_eq(nat_accept(nat, &t, SEC(1), &k, &gen), 0);
	cr_assert_eq(memcmp(k.src, c, alen), 0);
	cr_assert_eq(memcmp(k.dst, sv, alen), 0);
	cr_assert_eq(ntohs(k.sport_be), 50123);
	cr_assert_eq(ntohs(k.dport_be), 443);

	/* Downlink recovery: the reply comes back as server:443 -> client:50123. */
	len = kernel_reply(&t, TCP_SYN | TCP_ACK, 100);
	struct sys_disp d = run(len, SEC(2));
	cr_assert_eq(d.action, SYS_WRITE);
	cr_assert_eq(d.len, len);
	assert_valid(len);
	cr_assert_eq(memcmp(src_of(), sv, alen), 0, "downlink source is the original server");
	cr_assert_eq(memcmp(dst_of(), c, alen), 0, "downlink destination is the original client");
	size_t o = l4off(len);
	cr_assert_eq(tu_get16(buf + o), 443);
	cr_assert_eq(tu_get16(buf + o + 2), 50123);
	cr_assert_eq(ctr_get(&ctr.downlink), 1);
	cr_assert_eq(sysproc_counters_drops(&ctr), 0);
}

Test(sysproc, roundtrip_v4) { roundtrip("10.0.0.9", "1.1.1.1"); }
Test(sysproc, roundtrip_v6) { roundtrip("fd00:7f::99", "2001:db8::1"); }
/* Both directions of a connection carry one connection number (the multi-queue driver writes
 * all of a connection's packets to one queue by it), the packets the stack builds none, and
 * connections that differ only in the client's port spread over two queues. */
static void conn_numbers(const char *cli, const char *srv)
{
	struct nat_tuple t;
	size_t len;
	unsigned on[2] = { 0, 0 };

	for (uint16_t i = 0; i < 64; i++) {
		struct tu_spec sp;

		uplink_syn(cli, srv, (uint16_t)(40000 + i), 5201, &t, &len);
		tu_spec_tcp(&sp, cli, (uint16_t)(40000 + i), srv, 5201); /* its ACK: the same entry */
		sp.tcp_flags = TCP_ACK;
		struct sys_disp up = run(tu_build(&sp, buf, sizeof(buf)), SEC(1));
		cr_assert_eq(up.action, SYS_WRITE);
		cr_assert_not(up.plain);
		cr_assert_neq(up.conn, 0);
		len = kernel_reply(&t, TCP_SYN | TCP_ACK, 0);
		struct sys_disp down = run(len, SEC(1));
		cr_assert_eq(down.action, SYS_WRITE);
		cr_assert_eq(down.conn, up.conn, "connection %u: one number both ways", i);
		on[up.conn % 2]++;
	}
	cr_assert(on[0] >= 16 && on[1] >= 16, "64 client ports over two queues: %u / %u", on[0],
		  on[1]);
	/* A RST the stack answers with itself (no mapping) carries none. */
	struct tu_spec sp;
	tu_spec_tcp(&sp, cli, 39999, srv, 5201);
	sp.tcp_flags = TCP_ACK;
	len = tu_build(&sp, buf, sizeof(buf));
	struct sys_disp rst = run(len, SEC(1));
	cr_assert_eq(rst.action, SYS_WRITE);
	cr_assert(rst.plain);
	cr_assert_eq(rst.conn, 0);
}

Test(sysproc, conn_numbers_v4) { conn_numbers("10.0.0.9", "10.77.0.1"); }
Test(sysproc, conn_numbers_v6) { conn_numbers("fd00:7f::99", "2001:db8::1"); }

Test(sysproc, roundtrip_v4_client_is_gateway)
{
	/* Local apps send from the TUN's own address: ordinary uplink, not a loop. */
	roundtrip("198.18.0.1", "10.200.1.2");
}

Test(sysproc, uplink_established_payload_checksums_many)
{
	struct tu_rng r;
	tu_rng_seed(&r, 7);
	struct nat_tuple t;
	size_t len;
	uplink_syn("10.1.2.3", "93.184.216.34", 40000, 80, &t, &len);
	for (int i = 0; i < 500; i++) {
		struct tu_spec s;
		tu_spec_tcp(&s, "10.1.2.3", 40000, "93.184.216.34", 80);
		s.tcp_flags = TCP_ACK | (i % 3 ? TCP_PSH : 0);
		s.seq = tu_rand32(&r);
		s.ack = tu_rand32(&r);
		s.payload_len = tu_rand_below(&r, 1400);
		s.payload_seed = tu_rand64(&r);
		len = tu_build(&s, buf, sizeof(buf));
		struct sys_disp d = run(len, SEC(2));
		cr_assert_eq(d.action, SYS_WRITE);
		assert_valid(len);
	}
	cr_assert_eq(ctr_get(&ctr.uplink), 501);
}

Test(sysproc, uplink_v6_with_extension_headers)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "fd00:7f::50", 1234, "2001:db8::80", 80);
	s.tcp_flags = TCP_SYN;
	s.ext[0] = (struct tu_ext){ 0, 0 };
	s.ext[1] = (struct tu_ext){ 60, 1 };
	s.ext[2] = (struct tu_ext){ 51, 4 };
	s.ext_n = 3;
	size_t len = tu_build(&s, buf, sizeof(buf));
	struct sys_disp d = run(len, SEC(1));
	cr_assert_eq(d.action, SYS_WRITE);
	assert_valid(len);
}

Test(sysproc, partial_checksum_update_addresses_only)
{
	/* NEEDS_CSUM: the field holds the un-inverted pseudo-header sum; after rewriting it must
	 * equal the pseudo-header sum of the NEW addresses, and completing it must verify. */
	const char *cases[][2] = { { "10.0.0.9", "1.1.1.1" }, { "fd00:7f::9", "2001:db8::2" } };
	for (int i = 0; i < 2; i++) {
		struct tu_spec s;
		struct pkt_meta m;
		tu_spec_tcp(&s, cases[i][0], 3333, cases[i][1], 443);
		s.tcp_flags = TCP_SYN;
		s.payload_len = 3000;
		s.partial_csum = true;
		size_t len = tu_build(&s, buf, sizeof(buf));
		tu_meta_partial(buf, len, 1448, &m);
		cr_assert(tu_verify_partial(buf, len));
		struct sys_disp d = sysproc_process(proc, buf, len, &m, SEC(1), &ctr, &view);
		cr_assert_eq(d.action, SYS_WRITE);
		cr_assert(tu_verify_partial(buf, len), "partial sum after rewrite");
		if (s.family == 4)
			cr_assert(tu_verify_ip4_header(buf));
		tu_complete_partial(buf, len);
		cr_assert(tu_verify_l4(buf, len), "kernel-completed checksum verifies");
	}
}

Test(sysproc, unmapped_downlink_dropped)
{
	struct nat_tuple t = { .family = 4, .addr = 1, .listener = 0, .port = 5555 };
	size_t len = kernel_reply(&t, TCP_ACK, 10);
	uint8_t copy[2048];
	memcpy(copy, buf, len);
	struct sys_disp d = run(len, SEC(1));
	cr_assert_eq(d.action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_downlink_no_mapping), 1);
	cr_assert_eq(sysproc_counters_drops(&ctr), 1);
	cr_assert_eq(memcmp(copy, buf, len), 0, "a dropped packet is not modified");
}

static void unmapped_non_syn(const char *cli, const char *srv, uint8_t flags, size_t payload)
{
	struct tu_spec s;
	struct nat_stats st;
	tu_spec_tcp(&s, cli, 2222, srv, 80);
	s.tcp_flags = flags;
	s.seq = 1000;
	s.ack = 777777;
	s.payload_len = payload;
	size_t len = tu_build(&s, buf, sizeof(buf));
	struct sys_disp d = run(len, SEC(1));
	nat_get_stats(nat, &st);
	cr_assert_eq(st.entries[NAT_HALF_OPEN] + st.entries[NAT_ACTIVE] + st.entries[NAT_CLOSING], 0,
		     "nothing allocated");
	cr_assert_eq(d.action, SYS_WRITE);
	cr_assert(d.plain);
	size_t hl = s.family == 4 ? 20 : 40;
	cr_assert_eq(d.len, hl + 20);
	assert_valid(d.len);
	uint8_t c[16], sv[16];
	tu_addr(c, cli);
	tu_addr(sv, srv);
	cr_assert_eq(memcmp(src_of(), sv, s.family == 4 ? 4 : 16), 0);
	cr_assert_eq(memcmp(dst_of(), c, s.family == 4 ? 4 : 16), 0);
	const uint8_t *t = buf + hl;
	cr_assert_eq(tu_get16(t), 80);
	cr_assert_eq(tu_get16(t + 2), 2222);
	if (flags & TCP_ACK) {
		cr_assert_eq(t[13], TCP_RST);
		cr_assert_eq(tu_get32(t + 4), 777777);
	} else {
		cr_assert_eq(t[13], TCP_RST | TCP_ACK);
		cr_assert_eq(tu_get32(t + 4), 0);
		uint32_t seglen = (uint32_t)payload + ((flags & TCP_FIN) ? 1 : 0) +
				  ((flags & TCP_SYN) ? 1 : 0);
		cr_assert_eq(tu_get32(t + 8), 1000 + seglen);
	}
	cr_assert_eq(ctr_get(&ctr.rst_sent), 1);
	cr_assert_eq(sysproc_counters_drops(&ctr), 0);
}

Test(sysproc, unmapped_ack_gets_rst_v4) { unmapped_non_syn("10.0.0.9", "1.1.1.1", TCP_ACK, 50); }
Test(sysproc, unmapped_ack_gets_rst_v6) { unmapped_non_syn("fd00:7f::9", "2001:db8::1", TCP_ACK | TCP_PSH, 0); }
Test(sysproc, unmapped_fin_no_ack_gets_rst_ack) { unmapped_non_syn("10.0.0.9", "1.1.1.1", TCP_FIN, 7); }
Test(sysproc, unmapped_synack_gets_rst) { unmapped_non_syn("10.0.0.9", "1.1.1.1", TCP_SYN | TCP_ACK, 0); }

Test(sysproc, unmapped_rst_gets_nothing)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "10.0.0.9", 2222, "1.1.1.1", 80);
	s.tcp_flags = TCP_RST | TCP_ACK;
	size_t len = tu_build(&s, buf, sizeof(buf));
	struct sys_disp d = run(len, SEC(1));
	cr_assert_eq(d.action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_rst_no_mapping), 1);
	cr_assert_eq(ctr_get(&ctr.rst_sent), 0);
}

/* The app's RST on a connection still HALF_OPEN (a SYN scan's, after the SYN-ACK) is passed on
 * to the kernel and ends the NAT entry 2 s later, not at the half-open timeout. */
Test(sysproc, rst_on_a_half_open_connection_ends_its_entry_soon)
{
	struct nat_tuple t;
	struct tu_spec s;
	size_t len;

	uplink_syn("10.0.0.9", "1.1.1.1", 2222, 80, &t, &len);
	tu_spec_tcp(&s, "10.0.0.9", 2222, "1.1.1.1", 80);
	s.tcp_flags = TCP_RST;
	len = tu_build(&s, buf, sizeof(buf));
	struct sys_disp d = run(len, SEC(2));
	cr_assert_eq(d.action, SYS_WRITE, "the RST goes on to the kernel");
	assert_valid(len);
	cr_assert_eq(ctr_get(&nat_get_counters(nat)->half_open_reset), 1);
	cr_assert_eq(nat_purge(nat, SEC(2) + NAT_RST_LINGER_NS - 1, 10), 0);
	cr_assert_eq(nat_purge(nat, SEC(2) + NAT_RST_LINGER_NS, 10), 1, "gone 2 s after the RST");
}

Test(sysproc, syn_on_closing_gets_different_port)
{
	struct nat_tuple t1, t2;
	size_t len;
	struct flow_key k;
	uint64_t gen;
	uplink_syn("10.0.0.9", "1.1.1.1", 50000, 443, &t1, &len);
	cr_assert_eq(nat_accept(nat, &t1, SEC(1), &k, &gen), 0);
	cr_assert_eq(nat_mark_closing(nat, &t1, gen, SEC(2)), 0);
	uplink_syn("10.0.0.9", "1.1.1.1", 50000, 443, &t2, &len);
	cr_assert(t1.port != t2.port || t1.addr != t2.addr || t1.listener != t2.listener);
	/* The old tuple no longer translates; the new one does. */
	len = kernel_reply(&t1, TCP_FIN | TCP_ACK, 0);
	cr_assert_eq(run(len, SEC(3)).action, SYS_DONE);
	len = kernel_reply(&t2, TCP_SYN | TCP_ACK, 0);
	cr_assert_eq(run(len, SEC(3)).action, SYS_WRITE);
}

Test(sysproc, own_address_tcp_dropped)
{
	const char *dsts[] = { "198.18.0.1", "198.18.0.2", "198.18.0.5", "fd00:7f::1", "fd00:7f::3" };
	for (int i = 0; i < 5; i++) {
		struct tu_spec s;
		tu_spec_tcp(&s, i < 3 ? "10.0.0.9" : "fd00:7f::99", 1000, dsts[i], 80);
		s.tcp_flags = TCP_SYN;
		size_t len = tu_build(&s, buf, sizeof(buf));
		cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	}
	/* The gateways are own_address, the NAT addresses nat_address: one counter each. */
	cr_assert_eq(ctr_get(&ctr.policy.drop_own_address), 2);
	cr_assert_eq(ctr_get(&ctr.policy.drop_nat_address), 3);
	/* gateway + 5 is not ours (4 NAT addresses): ordinary uplink. */
	struct tu_spec s;
	tu_spec_tcp(&s, "10.0.0.9", 1000, "198.18.0.6", 80);
	s.tcp_flags = TCP_SYN;
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_WRITE);
}

Test(sysproc, gateway_to_nat_from_non_listener_port_dropped)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "198.18.0.1", 12345, "198.18.0.2", 1024);
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.policy.drop_nat_address), 1);
	cr_assert_eq(ctr_get(&ctr.policy.drop_own_address), 0);
	cr_assert_eq(ctr_get(&ctr.drop_downlink_no_mapping), 0);
}

Test(sysproc, udp_untouched_and_own_address_rules)
{
	struct tu_spec s;
	uint8_t copy[2048];
	tu_spec_udp(&s, "10.0.0.9", 5353, "8.8.8.8", 53);
	s.payload_len = 40;
	size_t len = tu_build(&s, buf, sizeof(buf));
	memcpy(copy, buf, len);
	struct sys_disp d = run(len, SEC(1));
	cr_assert_eq(d.action, SYS_UDP);
	cr_assert_eq(d.len, len);
	cr_assert_eq(memcmp(copy, buf, len), 0, "UDP goes to the UDP path untouched");

	tu_spec_udp(&s, "10.0.0.9", 5353, "198.18.0.1", 53);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE, "DNS to gateway without hijack");
	tu_spec_udp(&s, "fd00:7f::9", 5353, "fd00:7f::2", 9999);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.policy.drop_own_address), 1);
	cr_assert_eq(ctr_get(&ctr.policy.drop_nat_address), 1);
	cr_assert_eq(ctr_get(&ctr.udp), 1);
}

/* A UDP verdict leaves the packet's view behind, exactly as pkt_parse makes it (the UDP path
 * takes it instead of parsing again): IPv4, IPv6, IPv6 with extension headers, hijacked DNS. */
Test(sysproc, udp_verdict_leaves_the_parsed_view)
{
	static const struct {
		const char *src, *dst;
		uint16_t dport;
		int n_ext;
	} cases[] = {
		{ "10.0.0.9", "8.8.8.8", 443, 0 },
		{ "fd00:7f::9", "2001:db8::1", 443, 0 },
		{ "fd00:7f::9", "2001:db8::1", 443, 3 },
		{ "10.0.0.9", "198.18.0.1", 53, 0 },
		{ "fd00:7f::9", "fd00:7f::1", 53, 1 },
	};
	teardown();
	make(1024, true);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct tu_spec s;
		struct pkt_view pv;
		tu_spec_udp(&s, cases[i].src, 5353, cases[i].dst, cases[i].dport);
		s.payload_len = 100 + i;
		for (int e = 0; e < cases[i].n_ext; e++)
			s.ext[s.ext_n++] = (struct tu_ext){ e % 2 ? 60 : 0, 0 };
		size_t len = tu_build(&s, buf, sizeof(buf));
		memset(&view, 0xa5, sizeof(view));
		cr_assert_eq(run(len, SEC(1)).action, SYS_UDP, "case %zu", i);
		cr_assert_eq(pkt_parse(&pv, buf, len), PKT_OK);
		cr_assert(view.ip == buf && view.l4 == pv.l4, "case %zu: pointers", i);
		cr_assert(view.len == pv.len && view.l4_len == pv.l4_len && view.l3_len == pv.l3_len,
			  "case %zu: lengths", i);
		cr_assert(view.family == pv.family && view.proto == IPPROTO_UDP, "case %zu", i);
		cr_assert(view.sport_be == htons(5353) && view.dport_be == htons(cases[i].dport),
			  "case %zu: ports", i);
	}
	cr_assert_eq(ctr_get(&ctr.udp), 5);
}

Test(sysproc, dns_hijack_takes_precedence)
{
	teardown();
	make(1024, true);
	struct tu_spec s;
	tu_spec_udp(&s, "10.0.0.9", 5353, "198.18.0.1", 53);
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_UDP);
	tu_spec_udp(&s, "fd00:7f::9", 5353, "fd00:7f::1", 53);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_UDP);
	tu_spec_udp(&s, "10.0.0.9", 5353, "198.18.0.1", 54);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE, "only port 53 is hijacked");
	cr_assert_eq(ctr_get(&ctr.udp), 2);
	cr_assert_eq(ctr_get(&ctr.policy.drop_own_address), 1);
}

Test(sysproc, icmp_echo_to_gateway_answered_in_place)
{
	const char *cases[][2] = { { "10.0.0.9", "198.18.0.1" }, { "fd00:7f::9", "fd00:7f::1" } };
	for (int i = 0; i < 2; i++) {
		struct tu_spec s;
		tu_spec_icmp_echo(&s, cases[i][0], cases[i][1], 77, (uint16_t)(i + 1));
		s.payload_len = 56;
		s.ttl = 3;
		size_t len = tu_build(&s, buf, sizeof(buf));
		struct sys_disp d = run(len, SEC(1));
		cr_assert_eq(d.action, SYS_WRITE);
		cr_assert(d.plain);
		cr_assert_eq(d.len, len);
		assert_valid(len);
		uint8_t a[16], g[16];
		tu_addr(a, cases[i][0]);
		int fam = tu_addr(g, cases[i][1]);
		size_t alen = fam == 4 ? 4 : 16;
		cr_assert_eq(memcmp(src_of(), g, alen), 0);
		cr_assert_eq(memcmp(dst_of(), a, alen), 0);
		size_t o = l4off(len);
		cr_assert_eq(buf[o], fam == 4 ? 0 : 129, "echo reply type");
		cr_assert_eq(tu_get16(buf + o + 4), 77, "identifier kept");
	}
	cr_assert_eq(ctr_get(&ctr.icmp_echo_reply), 2);
}

/* A SYN to a special destination: an ICMP port unreachable from the first NAT address to the
 * SYN's source (counted in icmp_unreach, no NAT entry); none to a multicast one. */
Test(sysproc, special_destination_syn_answered_with_port_unreachable)
{
	const char *cases[][3] = { { "198.18.0.1", "127.1.2.3", "198.18.0.2" },
				   { "10.0.0.9", "0.1.2.3", "198.18.0.2" },
				   { "fd00:7f::9", "::", "fd00:7f::2" },
				   { "fd00:7f::1", "::1.2.3.4", "fd00:7f::2" } };
	for (int i = 0; i < 4; i++) {
		struct tu_spec s;
		uint8_t a[16], n0[16];
		tu_spec_tcp(&s, cases[i][0], 40000, cases[i][1], 80);
		s.tcp_flags = TCP_SYN;
		s.mss = 1460;
		size_t len = tu_build(&s, buf, sizeof(buf));
		struct sys_disp d = run(len, SEC(1));
		cr_assert_eq(d.action, SYS_WRITE, "%s", cases[i][1]);
		cr_assert(d.plain);
		assert_valid(d.len);
		int fam = tu_addr(a, cases[i][0]);
		tu_addr(n0, cases[i][2]);
		cr_assert_eq(memcmp(src_of(), n0, fam == 4 ? 4 : 16), 0, "from the first NAT address");
		cr_assert_eq(memcmp(dst_of(), a, fam == 4 ? 4 : 16), 0, "to the SYN's source");
		size_t o = l4off(d.len);
		cr_assert_eq(buf[o], fam == 4 ? 3 : 1, "destination unreachable");
		cr_assert_eq(buf[o + 1], fam == 4 ? 3 : 4, "port unreachable");
		cr_assert_eq(d.len, o + 8 + len, "the SYN quoted whole");
	}
	cr_assert_eq(ctr_get(&ctr.icmp_unreach), 4);
	cr_assert_eq(ctr_get(&ctr.policy.drop_special_destination), 4);
	struct tu_spec s;
	tu_spec_tcp(&s, "198.18.0.1", 40001, "224.0.0.9", 80);
	s.tcp_flags = TCP_SYN;
	cr_assert_eq(run(tu_build(&s, buf, sizeof(buf)), SEC(1)).action, SYS_DONE, "multicast");
	cr_assert_eq(ctr_get(&ctr.icmp_unreach), 4);
	cr_assert_eq(ctr_get(&ctr.policy.drop_special_destination), 5);
	struct nat_stats st;
	nat_get_stats(nat, &st);
	for (int k = 0; k < NAT_STATE_MAX; k++)
		cr_assert_eq(st.entries[k], 0, "no NAT entry");
}

Test(sysproc, other_icmp_dropped)
{
	struct tu_spec s;
	tu_spec_icmp_echo(&s, "10.0.0.9", "1.1.1.1", 1, 1); /* echo to a remote address */
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	tu_spec_icmp_echo(&s, "10.0.0.9", "198.18.0.2", 1, 1); /* echo to a NAT address */
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	tu_spec_icmp_echo(&s, "10.0.0.9", "198.18.0.1", 1, 1);
	s.icmp_type = 13; /* timestamp request to the gateway */
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.policy.drop_icmp), 3);
	tu_spec_raw(&s, "10.0.0.9", "1.1.1.1", 47 /* GRE */);
	s.payload_len = 20;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.policy.drop_proto), 1);
	cr_assert_eq(sysproc_counters_drops(&ctr), 4);
}

Test(sysproc, parse_failures_counted_by_reason)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "10.0.0.9", 1, "1.1.1.1", 2);
	s.ip4_frag = 0x2000; /* MF */
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_parse[PKT_V4_FRAGMENT]), 1);
	tu_spec_tcp(&s, "fd00:7f::9", 1, "2001:db8::1", 2);
	s.ext[0] = (struct tu_ext){ 44, 0 };
	s.ext_n = 1;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_parse[PKT_V6_FRAGMENT]), 1);
	cr_assert_eq(run(10, SEC(1)).action, SYS_DONE);
	cr_assert_eq(sysproc_counters_drops(&ctr), 3);
	cr_assert_eq(ctr_get(&ctr.rx_packets), 3);
}

/* A full table refuses a new flow with a RST back to its app (not the silence a flood's SYN
 * gets), counted once; the existing flow is untouched. */
Test(sysproc, nat_budget_exhaustion_refuses_new_flows_only)
{
	teardown();
	make(1, false);
	struct nat_tuple t;
	struct sys_disp d;
	struct flow_key k;
	uint64_t gen;
	size_t len;
	uplink_syn("10.0.0.9", "1.1.1.1", 1111, 443, &t, &len);
	cr_assert_eq(nat_accept(nat, &t, SEC(1), &k, &gen), 0, "an established flow fills it");
	cr_assert_not(nat_half_open_pressure(nat));
	struct tu_spec s;
	tu_spec_tcp(&s, "10.0.0.9", 2222, "1.1.1.1", 443);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	len = tu_build(&s, buf, sizeof(buf));
	d = run(len, SEC(1));
	cr_assert_eq(d.action, SYS_WRITE);
	cr_expect(d.plain);
	cr_assert_eq(d.len, 40);
	assert_valid(d.len);
	const uint8_t *tcp = buf + 20;
	cr_expect_eq(tu_get16(tcp), 443);
	cr_expect_eq(tu_get16(tcp + 2), 2222, "the RST goes back to the app's port");
	cr_expect_eq(tcp[13], TCP_RST | TCP_ACK, "flags %#x", tcp[13]);
	cr_expect_eq(tu_get32(tcp + 8), 1001, "it acknowledges the SYN");
	cr_expect_eq(ctr_get(&ctr.drop_nat_budget), 1);
	cr_expect_eq(ctr_get(&ctr.rst_sent), 0);
	cr_expect_eq(sysproc_counters_drops(&ctr), 1);
	/* The existing flow is undisturbed. */
	len = kernel_reply(&t, TCP_SYN | TCP_ACK, 0);
	cr_assert_eq(run(len, SEC(1)).action, SYS_WRITE);
}

/* A table full of handshakes (a SYN flood's pressure): a refused SYN gets no answer (its
 * source may be spoofed), counted as a refusal all the same. */
Test(sysproc, nat_budget_exhaustion_under_syn_pressure_is_silent)
{
	struct nat_config nc;

	teardown();
	nat_config_default(&nc);
	nc.max_entries = 1;
	nc.seed = 42;
	nat_config_half_open_limits(&nc); /* per-source counting from the first handshake */
	make_with(&nc, false);
	struct nat_tuple t;
	struct tu_spec s;
	size_t len;
	uplink_syn("10.0.0.9", "1.1.1.1", 1111, 443, &t, &len);
	cr_assert(nat_half_open_pressure(nat));
	tu_spec_tcp(&s, "10.0.0.10", 2222, "1.1.1.1", 443);
	s.tcp_flags = TCP_SYN;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_expect_eq(ctr_get(&ctr.drop_nat_budget), 1);
	cr_expect_eq(sysproc_counters_drops(&ctr), 1);
}

/* A source over its HALF_OPEN share: its new SYN is dropped silently (no RST: the source may
 * be spoofed) and counted once; another source's SYN and the existing mappings still pass. */
Test(sysproc, half_open_limit_drops_counted)
{
	struct nat_config nc;
	struct nat_tuple t, t2;
	struct tu_spec s;
	size_t len;

	teardown();
	nat_config_default(&nc);
	nc.seed = 42;
	nc.half_open_quiet = 0;
	nc.half_open_per_host = 2;
	make_with(&nc, false);
	uplink_syn("10.0.0.9", "1.1.1.1", 1111, 443, &t, &len);
	uplink_syn("10.0.0.9", "1.1.1.1", 1112, 443, &t2, &len);
	for (uint16_t i = 0; i < 5; i++) {
		tu_spec_tcp(&s, "10.0.0.9", (uint16_t)(2000 + i), "1.1.1.1", 443);
		s.tcp_flags = TCP_SYN;
		len = tu_build(&s, buf, sizeof(buf));
		cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	}
	cr_expect_eq(ctr_get(&ctr.drop_nat_half_open), 5);
	cr_expect_eq(ctr_get(&ctr.rst_sent), 0);
	cr_expect_eq(ctr_get(&ctr.drop_nat_budget), 0);
	cr_expect_eq(sysproc_counters_drops(&ctr), 5);
	uplink_syn("10.0.1.9", "1.1.1.1", 1111, 443, &t2, &len);
	len = kernel_reply(&t, TCP_SYN | TCP_ACK, 0);
	cr_assert_eq(run(len, SEC(1)).action, SYS_WRITE);
}

Test(sysproc, family_disabled_dropped)
{
	teardown();
	struct nat_config nc;
	struct sysproc_config pc;
	nat_config_default(&nc);
	cr_assert_eq(nat_table_new(&nc, &nat), 0);
	memset(&pc, 0, sizeof(pc));
	pc.n_addrs = nc.n_addrs;
	pc.n_listeners = 1;
	pc.v4.enabled = true;
	tu_addr(pc.v4.gateway, "198.18.0.1");
	pc.v4.listener_ports_be[0] = htons(LPORT0);
	cr_assert_eq(sysproc_new(&pc, nat, &proc), 0);
	memset(&ctr, 0, sizeof(ctr));
	struct tu_spec s;
	tu_spec_tcp(&s, "fd00::9", 1, "2001:db8::1", 2);
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.policy.drop_family), 1);
}

Test(sysproc, classify_and_is_own)
{
	uint8_t a[16];
	tu_addr(a, "198.18.0.1");
	cr_assert(sysproc_is_own(proc, 4, a));
	tu_addr(a, "198.18.0.5");
	cr_assert(sysproc_is_own(proc, 4, a));
	tu_addr(a, "198.18.0.6");
	cr_assert_not(sysproc_is_own(proc, 4, a));
	tu_addr(a, "198.18.0.0");
	cr_assert_not(sysproc_is_own(proc, 4, a));
	tu_addr(a, "fd00:7f::5");
	cr_assert(sysproc_is_own(proc, 6, a));
	tu_addr(a, "fd00:7e::1");
	cr_assert_not(sysproc_is_own(proc, 6, a));
}

Test(sysproc, bad_config_rejected)
{
	struct sysproc_config pc;
	struct sysproc *p2;
	memset(&pc, 0, sizeof(pc));
	pc.n_addrs = 4;
	pc.n_listeners = 2;
	cr_assert_eq(sysproc_new(&pc, nat, &p2), -EINVAL, "no family enabled");
	pc.v4.enabled = true;
	tu_addr(pc.v4.gateway, "255.255.255.254");
	cr_assert_eq(sysproc_new(&pc, nat, &p2), -EINVAL, "NAT run wraps");
	pc.n_addrs = 0;
	tu_addr(pc.v4.gateway, "10.0.0.1");
	cr_assert_eq(sysproc_new(&pc, nat, &p2), -EINVAL);
}

Test(sysproc, uplink_from_nat_address_dropped)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "198.18.0.3", 1000, "1.1.1.1", 80);
	s.tcp_flags = TCP_SYN;
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.policy.drop_from_nat_address), 1);
	cr_assert_eq(ctr_get(&ctr.policy.drop_own_address), 0);
	cr_assert_eq(ctr_get(&ctr.uplink), 0);
	/* A datagram from one is dropped too (it never reaches the UDP path), v4 and v6. */
	tu_spec_udp(&s, "198.18.0.5", 1000, "1.1.1.1", 443);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	tu_spec_udp(&s, "fd00:7f::2", 1000, "2001:db8::1", 443);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.policy.drop_from_nat_address), 3);
	cr_assert_eq(ctr_get(&ctr.udp), 0);
	/* The gateway and the address after the last NAT address are not NAT addresses. */
	tu_spec_udp(&s, "198.18.0.6", 1000, "1.1.1.1", 443);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_UDP);
	tu_spec_udp(&s, "fd00:7f::1", 1000, "2001:db8::1", 443);
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_UDP);
	tu_spec_udp(&s, "fd00:7e::2", 1000, "2001:db8::1", 443); /* the low bits, another prefix */
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_UDP);
	cr_assert_eq(ctr_get(&ctr.udp), 3);
}

Test(sysproc, bad_offload_metadata_dropped)
{
	struct tu_spec s;
	struct pkt_meta m;
	tu_spec_tcp(&s, "10.0.0.9", 3333, "1.1.1.1", 443);
	s.tcp_flags = TCP_SYN;
	s.partial_csum = true;
	size_t len = tu_build(&s, buf, sizeof(buf));
	tu_meta_partial(buf, len, 0, &m);
	m.csum_offset = 6; /* not the TCP checksum field */
	cr_assert_eq(sysproc_process(proc, buf, len, &m, SEC(1), &ctr, &view).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_bad_offload), 1);
	struct nat_stats st;
	nat_get_stats(nat, &st);
	cr_assert_eq(st.entries[NAT_HALF_OPEN], 0);
}

/* ---- IPv4 header checksums and options ---- */

/* Break the IPv4 header checksum of the packet in buf (any other value). */
static void break_ip4_csum(void)
{
	buf[10] ^= 0x5a;
}

/* A wrong IPv4 header checksum where no kernel will see the header — a datagram for the UDP
 * path, a SYN that would make a NAT entry, a segment that would be answered with a RST — is
 * dropped and counted as v4_bad_checksum, nothing else moving. */
Test(sysproc, bad_ip4_checksum_dropped_before_udp_nat_and_rst)
{
	struct tu_spec s;
	size_t len;

	tu_spec_udp(&s, "10.0.0.9", 5353, "8.8.8.8", 443);
	s.payload_len = 30;
	len = tu_build(&s, buf, sizeof(buf));
	break_ip4_csum();
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	tu_spec_tcp(&s, "10.0.0.9", 2000, "1.1.1.1", 80);
	s.tcp_flags = TCP_SYN;
	len = tu_build(&s, buf, sizeof(buf));
	break_ip4_csum();
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	s.tcp_flags = TCP_ACK;
	s.payload_len = 10;
	len = tu_build(&s, buf, sizeof(buf));
	break_ip4_csum();
	cr_assert_eq(run(len, SEC(1)).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_parse[PKT_V4_BAD_CSUM]), 3);
	cr_assert_eq(sysproc_counters_drops(&ctr), 3, "one counter per packet");
	cr_assert_eq(ctr_get(&ctr.udp) + ctr_get(&ctr.uplink) + ctr_get(&ctr.rst_sent), 0);
	struct nat_stats ns;
	nat_get_stats(nat, &ns);
	for (int st = 0; st < NAT_STATE_MAX; st++)
		cr_assert_eq(ns.entries[st], 0, "no NAT entry");
	/* The same SYN with its checksum right is taken. */
	s.tcp_flags = TCP_SYN;
	s.payload_len = 0;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(run(len, SEC(1)).action, SYS_WRITE);
	cr_assert_eq(ctr_get(&ctr.uplink), 1);
}

/* A mapped segment's header goes on to the kernel: rewritten, and the incremental update
 * (RFC 1624) keeps its wrong checksum wrong, so the kernel drops it. */
Test(sysproc, bad_ip4_checksum_on_mapped_segment_stays_wrong)
{
	struct nat_tuple t;
	struct tu_spec s;
	size_t len;

	uplink_syn("10.0.0.9", "1.1.1.1", 2001, 80, &t, &len);
	tu_spec_tcp(&s, "10.0.0.9", 2001, "1.1.1.1", 80);
	s.tcp_flags = TCP_ACK;
	s.payload_len = 100;
	len = tu_build(&s, buf, sizeof(buf));
	break_ip4_csum();
	cr_assert_eq(run(len, SEC(1)).action, SYS_WRITE);
	cr_assert_not(tu_verify_ip4_header(buf), "still wrong after the rewrite");
	cr_assert_eq(ctr_get(&ctr.drop_parse[PKT_V4_BAD_CSUM]), 0);
}

/* IPv4 options: well-formed ones pass through the rewrite; a list that does not add up is
 * dropped as v4_bad_options before anything else looks at the packet. */
Test(sysproc, ip4_options_checked)
{
	static const struct {
		uint8_t opts[8];
		uint8_t n;
		bool ok;
	} cases[] = {
		{ { 1, 1, 1, 0 }, 4, true },                /* NOPs, End */
		{ { 7, 7, 4, 0, 0, 0, 0, 0 }, 8, true },    /* Record Route, one slot */
		{ { 1, 7, 8, 4 }, 4, false },               /* Record Route past the header's end */
		{ { 68, 1, 0, 0 }, 4, false },              /* length 1 */
		{ { 68, 0, 0, 0 }, 4, false },              /* length 0 */
		{ { 1, 1, 1, 7 }, 4, false },               /* no room for the length byte */
	};
	uint64_t bad = 0;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct tu_spec s;
		tu_spec_tcp(&s, "10.0.0.9", (uint16_t)(3000 + i), "1.1.1.1", 80);
		s.tcp_flags = TCP_SYN;
		memcpy(s.ip4_opts, cases[i].opts, cases[i].n);
		s.ip4_opts_len = cases[i].n;
		size_t len = tu_build(&s, buf, sizeof(buf));
		cr_assert_eq(run(len, SEC(1)).action, cases[i].ok ? SYS_WRITE : SYS_DONE, "case %zu", i);
		bad += !cases[i].ok;
		cr_assert_eq(ctr_get(&ctr.drop_parse[PKT_V4_BAD_OPTIONS]), bad, "case %zu", i);
	}
	cr_assert_eq(sysproc_counters_drops(&ctr), bad);
}
