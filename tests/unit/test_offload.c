/* test_offload.c — super-packet rewriting by the system stack's packet processor
 * (stacks/system/sysproc.c, stacks/common/rewrite.c) with TUN offload metadata.
 *
 * A TSO super-packet as the kernel hands it to us through a vnet TUN (up to 64 KiB, valid IPv4
 * header checksum, gso_size 1448, NEEDS_CSUM with the un-inverted pseudo-header sum over the
 * whole L4 length in the TCP checksum field, or a full checksum without NEEDS_CSUM) is run
 * through sysproc uplink and downlink. It must come back rewritten in place, same length, only
 * the address, port and checksum bytes changed. Then the test segments it the way the kernel
 * will when we write it back (tu_gso_segment: per-segment length adjustment of the partial sum
 * and completion from csum_start) and checks every segment from scratch: TCP checksum,
 * addresses, ports, sequence numbers and payload bytes.
 *
 * The verifier is tested too: the classic wrong updates of a NEEDS_CSUM field (RFC 1624 with
 * ports, a final inversion, no update) must make the segments fail.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "core/pkt.h"
#include "stacks/system/nat.h"
#include "stacks/system/sysproc.h"
#include "testutil.h"

#define LPORT4 40000 /* listener ports: v4 40000/40001, v6 40010/40011 */
#define LPORT6 40010
#define MSS 1448
#define MAX_SEGS 1400
#define CANARY 0xa5

static struct nat_table *nat;
static struct sysproc *proc;
static struct sys_counters ctr;
static struct pkt_view view; /* sysproc_process's parse (unused here) */
static uint8_t sp[TU_PKT_MAX + 64];  /* the super-packet, with canary bytes after it */
static uint8_t orig[TU_PKT_MAX];     /* its copy before sysproc */
static uint8_t segbuf[4 * TU_PKT_MAX];
static struct tu_seg segs[MAX_SEGS];

static void setup(void)
{
	struct nat_config nc;
	struct sysproc_config pc;

	nat_config_default(&nc);
	nc.max_entries = 4096;
	nc.seed = 6;
	cr_assert_eq(nat_table_new(&nc, &nat), 0);
	memset(&pc, 0, sizeof(pc));
	pc.n_addrs = nc.n_addrs;
	pc.n_listeners = 2;
	pc.v4.enabled = true;
	tu_addr(pc.v4.gateway, "198.18.0.1");
	pc.v4.listener_ports_be[0] = htons(LPORT4);
	pc.v4.listener_ports_be[1] = htons(LPORT4 + 1);
	pc.v6.enabled = true;
	tu_addr(pc.v6.gateway, "fd00:7f::1");
	pc.v6.listener_ports_be[0] = htons(LPORT6);
	pc.v6.listener_ports_be[1] = htons(LPORT6 + 1);
	cr_assert_eq(sysproc_new(&pc, nat, &proc), 0);
	memset(&ctr, 0, sizeof(ctr));
}

static void teardown(void)
{
	sysproc_free(proc);
	nat_table_free(nat);
}

TestSuite(offload, .init = setup, .fini = teardown);

/* ---- one NATted flow: the client's pair and the tuple the NAT gave it ---- */

struct flow {
	int fam;
	size_t alen;
	uint8_t cli[16], srv[16], gw[16], nat_addr[16];
	uint16_t cport, sport, lport;
	struct nat_tuple t;
};

/* Start a flow with an uplink SYN (no offload) and accept it, as the listener would. */
static void flow_open(struct flow *f, const uint8_t cli[16], uint16_t cport, const uint8_t srv[16],
		      uint16_t sport, int fam)
{
	struct tu_spec s;
	struct flow_key k;
	uint64_t gen;

	memset(f, 0, sizeof(*f));
	f->fam = fam;
	f->alen = fam == 4 ? 4 : 16;
	memcpy(f->cli, cli, 16);
	memcpy(f->srv, srv, 16);
	f->cport = cport;
	f->sport = sport;
	tu_addr(f->gw, fam == 4 ? "198.18.0.1" : "fd00:7f::1");
	tu_spec_tcp(&s, fam == 4 ? "0.0.0.0" : "::", cport, fam == 4 ? "0.0.0.0" : "::", sport);
	memcpy(s.src, cli, 16);
	memcpy(s.dst, srv, 16);
	s.tcp_flags = TCP_SYN;
	s.mss = MSS;
	size_t len = tu_build(&s, sp, sizeof(sp));
	struct sys_disp d = sysproc_process(proc, sp, len, NULL, SEC(1), &ctr, &view);
	cr_assert_eq(d.action, SYS_WRITE, "SYN accepted");
	size_t sa = fam == 4 ? 12 : 8, da = fam == 4 ? 16 : 24, l4 = fam == 4 ? 20 : 40;
	memcpy(f->nat_addr, sp + sa, f->alen);
	cr_assert_eq(memcmp(sp + da, f->gw, f->alen), 0, "SYN goes to the gateway");
	f->t.family = (uint8_t)fam;
	f->t.addr = (uint8_t)(f->nat_addr[f->alen - 1] - f->gw[f->alen - 1] - 1);
	f->t.port = tu_get16(sp + l4);
	f->lport = tu_get16(sp + l4 + 2);
	f->t.listener = (uint8_t)(f->lport - (fam == 4 ? LPORT4 : LPORT6));
	cr_assert(f->t.listener < 2, "listener port %u", f->lport);
	cr_assert_eq(nat_accept(nat, &f->t, SEC(1), &k, &gen), 0);
}

static void flow_open_text(struct flow *f, const char *cli, uint16_t cport, const char *srv,
			   uint16_t sport)
{
	uint8_t c[16], s[16];
	int fam = tu_addr(c, cli);
	cr_assert_eq(tu_addr(s, srv), fam);
	flow_open(f, c, cport, s, sport, fam);
}

/* ---- building a super-packet the way the kernel's TSO output looks ---- */

struct shape {
	bool downlink;     /* gateway:listener -> NAT address:P, else client -> server */
	bool partial;      /* NEEDS_CSUM; else a full checksum (flags 0 or DATA_VALID) */
	bool data_valid;   /* without NEEDS_CSUM: flag DATA_VALID */
	bool ip_opts;      /* IPv4: a Router Alert option (IHL 6) */
	bool ext;          /* IPv6: Hop-by-Hop, Routing (segments left 0), Destination Options */
	uint16_t gso;      /* gso_size */
	size_t payload;
	uint32_t seed;     /* payload pattern */
	uint32_t seq;
	uint8_t flags;
};

static void shape_default(struct shape *sh, bool downlink, bool partial)
{
	memset(sh, 0, sizeof(*sh));
	sh->downlink = downlink;
	sh->partial = partial;
	sh->gso = MSS;
	sh->payload = 40 * MSS + 17;
	sh->seed = 1;
	sh->seq = 0xfffff000u; /* wraps inside the super-packet */
	sh->flags = TCP_ACK | TCP_PSH;
}

static uint8_t payload_buf[TU_PKT_MAX];

/* Build the super-packet of f in sp with its metadata; returns the length. */
static size_t build_super(const struct flow *f, const struct shape *sh, struct pkt_meta *m)
{
	struct tu_spec s;
	const char *any = f->fam == 4 ? "0.0.0.0" : "::";
	static const uint8_t ts[12] = { 1, 1, 8, 10, 0, 1, 2, 3, 4, 5, 6, 7 };

	tu_spec_tcp(&s, any, 0, any, 0);
	memcpy(s.src, sh->downlink ? f->gw : f->cli, 16);
	memcpy(s.dst, sh->downlink ? f->nat_addr : f->srv, 16);
	s.sport = sh->downlink ? f->lport : f->cport;
	s.dport = sh->downlink ? f->t.port : f->sport;
	s.seq = sh->seq;
	s.ack = 0x01020304;
	s.tcp_flags = sh->flags;
	memcpy(s.tcp_opts, ts, sizeof(ts)); /* timestamps: a 32-byte TCP header, like Linux */
	s.tcp_opts_len = sizeof(ts);
	s.ip_id = 0xfff0; /* wraps across the segments */
	s.ip4_frag = 0x4000;
	if (f->fam == 4 && sh->ip_opts) {
		static const uint8_t ra[4] = { 0x94, 4, 0, 0 };
		memcpy(s.ip4_opts, ra, 4);
		s.ip4_opts_len = 4;
	}
	if (f->fam == 6 && sh->ext) {
		s.ext[0] = (struct tu_ext){ 0, 0 };
		s.ext[1] = (struct tu_ext){ 43, 0 };
		s.ext[2] = (struct tu_ext){ 60, 1 };
		s.ext_n = 3;
	}
	tu_fill_pattern(payload_buf, sh->payload, sh->seed);
	s.payload = payload_buf;
	s.payload_len = sh->payload;
	s.partial_csum = sh->partial;
	size_t len = tu_build(&s, sp, TU_PKT_MAX);
	memset(sp + len, CANARY, sizeof(sp) - len);
	memset(m, 0, sizeof(*m));
	if (sh->partial) {
		tu_meta_partial(sp, len, sh->gso, m);
		cr_assert(tu_verify_partial(sp, len), "builder: partial sum");
	} else {
		m->flags = sh->data_valid ? PKT_META_DATA_VALID : 0;
		m->gso_type = f->fam == 4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6;
		m->gso_size = sh->gso;
		cr_assert(tu_verify_l4(sp, len), "builder: full checksum");
	}
	memcpy(orig, sp, len);
	return len;
}

/* ---- checking the rewritten super-packet and its segments ---- */

/* Only the address, port and checksum bytes may differ from the original; nothing after len. */
static void assert_only_headers_changed(const struct flow *f, size_t len, size_t l3)
{
	for (size_t i = 0; i < len; i++) {
		bool may = f->fam == 4 ? (i >= 10 && i < 12) || (i >= 12 && i < 20)
				       : (i >= 8 && i < 40);
		may = may || (i >= l3 && i < l3 + 4) || (i >= l3 + 16 && i < l3 + 18);
		if (!may && sp[i] != orig[i])
			cr_assert_fail("byte %zu changed: 0x%02x -> 0x%02x (L4 at %zu)", i,
				       orig[i], sp[i], l3);
	}
	for (size_t i = len; i < sizeof(sp); i++)
		if (sp[i] != CANARY)
			cr_assert_fail("byte %zu past the packet (%zu bytes) written", i, len);
}

struct want {
	const uint8_t *src, *dst;
	uint16_t sport, dport;
};

static void want_of(const struct flow *f, bool downlink, struct want *w)
{
	/* Uplink goes to the listener from the NAT address; downlink back to the client. */
	w->src = downlink ? f->srv : f->nat_addr;
	w->dst = downlink ? f->cli : f->gw;
	w->sport = downlink ? f->sport : f->t.port;
	w->dport = downlink ? f->cport : f->lport;
}

static void assert_segment(const struct flow *f, const struct shape *sh, const struct want *w,
			   size_t i, size_t n, size_t l3, size_t hdr)
{
	const uint8_t *s = segbuf + segs[i].off;
	size_t slen = segs[i].len, off = i * sh->gso;
	size_t chunk = sh->payload - off < sh->gso ? sh->payload - off : sh->gso;

	cr_assert_eq(slen, hdr + chunk, "segment %zu/%zu length", i, n);
	if (f->fam == 4)
		cr_assert(tu_verify_ip4_header(s), "segment %zu IPv4 header checksum", i);
	if (!tu_verify_l4(s, slen)) {
		tu_dump("segment headers", s, hdr);
		cr_assert_fail("segment %zu/%zu: completed TCP checksum 0x%04x, want 0x%04x", i, n,
			       tu_l4_field(s, slen), tu_l4_compute(s, slen));
	}
	if (sh->partial)
		cr_assert_eq(segs[i].partial, tu_partial_pseudo(s, slen),
			     "segment %zu: adjusted partial 0x%04x, pseudo-header sum 0x%04x", i,
			     segs[i].partial, tu_partial_pseudo(s, slen));
	cr_assert_eq(memcmp(s + (f->fam == 4 ? 12 : 8), w->src, f->alen), 0, "segment %zu src", i);
	cr_assert_eq(memcmp(s + (f->fam == 4 ? 16 : 24), w->dst, f->alen), 0, "segment %zu dst", i);
	cr_assert_eq(tu_get16(s + l3), w->sport, "segment %zu sport", i);
	cr_assert_eq(tu_get16(s + l3 + 2), w->dport, "segment %zu dport", i);
	cr_assert_eq(tu_get32(s + l3 + 4), sh->seq + (uint32_t)off, "segment %zu seq", i);
	for (size_t j = 0; j < chunk; j++)
		if (s[hdr + j] != tu_pattern_byte(sh->seed, off + j))
			cr_assert_fail("segment %zu payload byte %zu: 0x%02x, want 0x%02x", i, j,
				       s[hdr + j], tu_pattern_byte(sh->seed, off + j));
}

/* Run the super-packet in sp through sysproc and check it and its segments. */
static void process_and_check(const struct flow *f, const struct shape *sh, size_t len,
			      const struct pkt_meta *m)
{
	struct tu_layout lo;
	struct want w;
	uint64_t up = ctr_get(&ctr.uplink), down = ctr_get(&ctr.downlink);

	cr_assert(tu_layout(sp, len, &lo));
	size_t hdr = lo.l3_len + (size_t)(sp[lo.l3_len + 12] >> 4) * 4;
	struct sys_disp d = sysproc_process(proc, sp, len, m, SEC(2), &ctr, &view);
	cr_assert_eq(d.action, SYS_WRITE, "super-packet written back");
	cr_assert_eq(d.len, len, "same length: not split, not trimmed");
	cr_assert_not(d.plain, "written with the header it was read with");
	cr_assert_eq(ctr_get(&ctr.uplink), up + !sh->downlink);
	cr_assert_eq(ctr_get(&ctr.downlink), down + sh->downlink);
	cr_assert_eq(sysproc_counters_drops(&ctr), 0);
	assert_only_headers_changed(f, len, lo.l3_len);
	if (f->fam == 4)
		cr_assert(tu_verify_ip4_header(sp), "super-packet IPv4 header checksum");
	if (sh->partial)
		cr_assert(tu_verify_partial(sp, len), "super-packet partial 0x%04x, want 0x%04x",
			  tu_l4_field(sp, len), tu_partial_pseudo(sp, len));
	else
		cr_assert(tu_verify_l4(sp, len), "super-packet full checksum");

	size_t n = tu_gso_segment(sp, len, m, segbuf, sizeof(segbuf), segs, MAX_SEGS);
	size_t want_n = sh->payload ? (sh->payload + sh->gso - 1) / sh->gso : 1;
	cr_assert_eq(n, want_n, "segments");
	want_of(f, sh->downlink, &w);
	for (size_t i = 0; i < n; i++)
		assert_segment(f, sh, &w, i, n, lo.l3_len, hdr);
}

static void super_case(const char *cli, const char *srv, bool downlink, bool partial,
		       bool variant)
{
	struct flow f;
	struct shape sh;
	struct pkt_meta m;

	flow_open_text(&f, cli, (uint16_t)(50123 + downlink), srv, 443);
	shape_default(&sh, downlink, partial);
	sh.ip_opts = sh.ext = variant;
	sh.data_valid = variant;
	size_t len = build_super(&f, &sh, &m);
	if (f.fam == 4 && !variant)
		cr_assert_eq(len, 20 + 32 + 40 * MSS + 17);
	if (partial)
		cr_assert_eq(m.csum_start, len - 32 - sh.payload, "csum_start is the L4 offset");
	process_and_check(&f, &sh, len, &m);
}

/* variant: IPv4 options / IPv6 extension headers, and DATA_VALID on the full-checksum ones. */
static void v4(bool downlink, bool partial, bool variant)
{
	super_case("10.0.0.9", "1.1.1.1", downlink, partial, variant);
}

static void v6(bool downlink, bool partial, bool variant)
{
	super_case("fd00:1::9", "2001:db8::1", downlink, partial, variant);
}

Test(offload, v4_uplink_partial) { v4(false, true, false); }
Test(offload, v4_uplink_full) { v4(false, false, false); }
Test(offload, v4_downlink_partial) { v4(true, true, false); }
Test(offload, v4_downlink_full) { v4(true, false, false); }
Test(offload, v4_options_uplink_partial) { v4(false, true, true); }
Test(offload, v4_options_downlink_partial) { v4(true, true, true); }
Test(offload, v4_options_full_data_valid) { v4(true, false, true); }
Test(offload, v6_uplink_partial) { v6(false, true, false); }
Test(offload, v6_uplink_full) { v6(false, false, false); }
Test(offload, v6_downlink_partial) { v6(true, true, false); }
Test(offload, v6_downlink_full) { v6(true, false, false); }
Test(offload, v6_ext_uplink_partial) { v6(false, true, true); }
Test(offload, v6_ext_downlink_partial) { v6(true, true, true); }
Test(offload, v6_ext_uplink_full_data_valid) { v6(false, false, true); }
Test(offload, v6_ext_downlink_full_data_valid) { v6(true, false, true); }
Test(offload, v4_local_app_from_gateway)
{
	/* Local apps send from the TUN's own address: the gateway, rewritten like any client. */
	super_case("198.18.0.1", "10.200.1.2", false, true, false);
	super_case("198.18.0.1", "10.200.1.2", true, true, false);
}

/* The largest super-packets: IPv4 total length 65535, IPv6 payload length 65535. */
Test(offload, largest_super_packets)
{
	const char *pairs[][2] = { { "10.3.0.1", "93.184.216.34" }, { "fd00:3::1", "2001:db8::7" } };
	for (int i = 0; i < 2; i++) {
		for (int dir = 0; dir < 2; dir++) {
			struct flow f;
			struct shape sh;
			struct pkt_meta m;
			flow_open_text(&f, pairs[i][0], (uint16_t)(20000 + dir), pairs[i][1], 80);
			shape_default(&sh, dir, true);
			sh.payload = 65535 - 32 - (i == 0 ? 20 : 0);
			sh.flags = TCP_ACK | TCP_PSH | TCP_FIN;
			size_t len = build_super(&f, &sh, &m);
			cr_assert_eq(len, i == 0 ? 65535u : 40u + 65535u);
			process_and_check(&f, &sh, len, &m);
		}
	}
}

/* Random shapes, both families and directions, NEEDS_CSUM or not, many flows. */
Test(offload, random_super_packets, .timeout = 120)
{
	struct tu_rng r;
	tu_rng_seed(&r, 0x6d5);
	for (int it = 0; it < 300; it++) {
		struct flow f;
		struct shape sh;
		struct pkt_meta m;
		uint8_t c[16] = { 0 }, s[16] = { 0 };
		int fam = tu_rand_chance(&r, 2) ? 4 : 6;
		if (fam == 4) {
			tu_put32(c, 0x0a000000u | tu_rand_below(&r, 1u << 24));   /* 10/8 */
			tu_put32(s, 0x01000000u + tu_rand_below(&r, 0x7e000000u)); /* 1..127/8 */
		} else {
			tu_addr(c, "fd00:1::");
			tu_addr(s, "2001:db8::");
			tu_rand_bytes(&r, c + 8, 8);
			tu_rand_bytes(&r, s + 4, 12);
		}
		flow_open(&f, c, (uint16_t)tu_rand_range(&r, 1024, 65535), s,
			  (uint16_t)tu_rand_range(&r, 1, 65535), fam);
		shape_default(&sh, tu_rand_chance(&r, 2), !tu_rand_chance(&r, 3));
		sh.data_valid = tu_rand_chance(&r, 2);
		sh.ip_opts = sh.ext = tu_rand_chance(&r, 4);
		sh.gso = (uint16_t)tu_rand_range(&r, 48, 9000);
		sh.payload = tu_rand_below(&r, 60000);
		sh.seed = tu_rand32(&r);
		sh.seq = tu_rand32(&r);
		sh.flags = (uint8_t)(TCP_ACK | (tu_rand32(&r) & (TCP_PSH | TCP_FIN | TU_TCP_CWR)));
		size_t len = build_super(&f, &sh, &m);
		process_and_check(&f, &sh, len, &m);
	}
	cr_assert_eq(sysproc_counters_drops(&ctr), 0);
}

/* ---- NEEDS_CSUM metadata that does not point at the TCP checksum ---- */

static void bad_meta(const struct flow *f, bool downlink, bool ext, int16_t dstart, int16_t doff)
{
	struct shape sh;
	struct pkt_meta m;

	shape_default(&sh, downlink, true);
	sh.ext = sh.ip_opts = ext;
	sh.payload = 5 * MSS;
	size_t len = build_super(f, &sh, &m);
	m.csum_start = (uint16_t)(m.csum_start + dstart);
	m.csum_offset = (uint16_t)(m.csum_offset + doff);
	uint64_t bad = ctr_get(&ctr.drop_bad_offload), drops = sysproc_counters_drops(&ctr);
	uint64_t up = ctr_get(&ctr.uplink), down = ctr_get(&ctr.downlink);
	struct sys_disp d = sysproc_process(proc, sp, len, &m, SEC(2), &ctr, &view);
	cr_assert_eq(d.action, SYS_DONE, "start %+d offset %+d: dropped", dstart, doff);
	cr_assert_eq(ctr_get(&ctr.drop_bad_offload), bad + 1, "counted as drop_bad_offload");
	cr_assert_eq(sysproc_counters_drops(&ctr), drops + 1, "and nothing else");
	cr_assert_eq(ctr_get(&ctr.uplink) + ctr_get(&ctr.downlink), up + down);
	cr_assert_eq(memcmp(sp, orig, len), 0, "a dropped packet is not modified");
}

Test(offload, bad_csum_start_or_offset_dropped)
{
	struct flow f4, f6;
	/* UDP's offset, past the field, before it, the IP header, the L4 start off by one word. */
	const int16_t cases[][2] = { { 0, -10 }, { 0, 2 }, { 0, -16 }, { 0, 1 }, { -20, 0 },
				     { 4, 0 },   { -4, 0 }, { 1, 0 }, { 2, -2 } };

	flow_open_text(&f4, "10.0.0.9", 1111, "1.1.1.1", 443);
	flow_open_text(&f6, "fd00:1::9", 1111, "2001:db8::1", 443);
	cr_assert_eq(ctr_get(&ctr.uplink), 2, "the two SYNs");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int dir = 0; dir < 2; dir++)
			for (int ext = 0; ext < 2; ext++) {
				bad_meta(&f4, dir, ext, cases[i][0], cases[i][1]);
				bad_meta(&f6, dir, ext, cases[i][0], cases[i][1]);
			}
	/* A fixed csum_start of 40 for IPv6 forgets the extension headers. */
	struct shape sh;
	struct pkt_meta m;
	shape_default(&sh, false, true);
	sh.ext = true;
	size_t len = build_super(&f6, &sh, &m);
	cr_assert_eq(m.csum_start, 40 + 8 + 8 + 16);
	m.csum_start = 40;
	uint64_t bad = ctr_get(&ctr.drop_bad_offload);
	cr_assert_eq(sysproc_process(proc, sp, len, &m, SEC(2), &ctr, &view).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_bad_offload), bad + 1);
	cr_assert_eq(ctr_get(&ctr.uplink), 2, "no super-packet passed");
	cr_assert_eq(ctr_get(&ctr.downlink), 0);
}

Test(offload, bad_offload_syn_creates_no_mapping)
{
	struct tu_spec s;
	struct pkt_meta m;

	tu_spec_tcp(&s, "10.9.9.9", 2222, "1.2.3.4", 80);
	s.tcp_flags = TCP_SYN;
	s.partial_csum = true;
	size_t len = tu_build(&s, sp, sizeof(sp));
	tu_meta_partial(sp, len, 0, &m);
	m.csum_offset = 6;
	cr_assert_eq(sysproc_process(proc, sp, len, &m, SEC(1), &ctr, &view).action, SYS_DONE);
	cr_assert_eq(ctr_get(&ctr.drop_bad_offload), 1);
	/* Had the SYN allocated, this would be rewritten; without a mapping it gets a RST. */
	s.tcp_flags = TCP_ACK;
	s.payload_len = 100;
	len = tu_build(&s, sp, sizeof(sp));
	tu_meta_partial(sp, len, 0, &m);
	struct sys_disp d = sysproc_process(proc, sp, len, &m, SEC(1), &ctr, &view);
	cr_assert_eq(d.action, SYS_WRITE);
	cr_assert(d.plain, "our RST goes out with a plain header");
	cr_assert_eq(ctr_get(&ctr.rst_sent), 1);
	cr_assert_eq(ctr_get(&ctr.uplink), 0);
}

/* An unmapped uplink super-packet is answered by a RST we build: plain header, full checksum
 * (the super-packet's partial sum must not leak into it). */
Test(offload, rst_for_unmapped_super_packet_is_plain_and_complete)
{
	const char *pairs[][2] = { { "10.0.0.5", "8.8.8.8" }, { "fd00:1::5", "2001:db8::8" } };
	for (int i = 0; i < 2; i++) {
		struct flow f;
		struct shape sh;
		struct pkt_meta m;
		memset(&f, 0, sizeof(f));
		f.fam = tu_addr(f.cli, pairs[i][0]);
		tu_addr(f.srv, pairs[i][1]);
		f.alen = f.fam == 4 ? 4 : 16;
		f.cport = 3333;
		f.sport = 443;
		shape_default(&sh, false, true);
		size_t len = build_super(&f, &sh, &m);
		struct sys_disp d = sysproc_process(proc, sp, len, &m, SEC(1), &ctr, &view);
		cr_assert_eq(d.action, SYS_WRITE);
		cr_assert(d.plain);
		cr_assert_eq(d.len, f.fam == 4 ? 40u : 60u);
		if (f.fam == 4)
			cr_assert(tu_verify_ip4_header(sp));
		cr_assert(tu_verify_l4(sp, d.len), "RST carries a full checksum");
		size_t l4 = f.fam == 4 ? 20 : 40;
		cr_assert_eq(sp[l4 + 13], TCP_RST);
		cr_assert_eq(tu_get32(sp + l4 + 4), 0x01020304u, "SEQ = the segment's ACK");
		cr_assert_eq(ctr_get(&ctr.rst_sent), (uint64_t)i + 1);
	}
}

/* ---- the verifier itself ---- */

/* Independent one's complement helpers (RFC 1071), 16-bit big-endian words. */
static uint16_t oc_fold(uint64_t s)
{
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return (uint16_t)s;
}

static uint64_t oc_words(const uint8_t *p, size_t n, bool negate)
{
	uint64_t s = 0;
	for (size_t i = 0; i < n; i += 2)
		s += negate ? (uint16_t)~tu_get16(p + i) : tu_get16(p + i);
	return s;
}

enum update {
	UPD_RIGHT,          /* C + ~old addresses + new addresses, no inversion */
	UPD_RFC1624_PORTS,  /* the full-checksum update: ~(~C + ~old + new), ports included */
	UPD_INVERTED,       /* addresses only, but with RFC 1624's inversions */
	UPD_PORTS,          /* no inversion, but ports included */
	UPD_NONE,           /* field left as it was */
	UPD_MAX
};

static const char *const update_name[] = { "right", "rfc1624+ports", "inverted", "ports",
					    "none" };

/* Rewrite addresses and ports of the partial super-packet in sp by hand, updating its field as
 * upd says, with a correct IPv4 header checksum. */
static void manual_rewrite(size_t len, const uint8_t *ns, const uint8_t *nd, uint16_t nsp,
			   uint16_t ndp, enum update upd)
{
	struct tu_layout lo;
	cr_assert(tu_layout(sp, len, &lo));
	size_t a = lo.family == 4 ? 12 : 8, an = lo.family == 4 ? 8 : 32;
	uint8_t *l4 = sp + lo.l3_len, na[32], np[4];
	memcpy(na, ns, an / 2);
	memcpy(na + an / 2, nd, an / 2);
	tu_put16(np, nsp);
	tu_put16(np + 2, ndp);
	uint16_t c = tu_get16(l4 + 16);
	uint64_t addrs = oc_words(sp + a, an, true) + oc_words(na, an, false);
	uint64_t ports = oc_words(l4, 4, true) + oc_words(np, 4, false);
	switch (upd) {
	case UPD_RIGHT:
		c = oc_fold(c + addrs);
		break;
	case UPD_RFC1624_PORTS:
		c = (uint16_t)~oc_fold((uint16_t)~c + addrs + ports);
		break;
	case UPD_INVERTED:
		c = (uint16_t)~oc_fold((uint16_t)~c + addrs);
		break;
	case UPD_PORTS:
		c = oc_fold(c + addrs + ports);
		break;
	default:
		break;
	}
	memcpy(sp + a, na, an);
	memcpy(l4, np, 4);
	tu_put16(l4 + 16, c);
	if (lo.family == 4)
		tu_fix_ip4_header(sp);
}

/* Segments of sp whose completed checksum fails to verify. */
static size_t failing_segments(size_t len, const struct pkt_meta *m, size_t *n_out)
{
	size_t n = tu_gso_segment(sp, len, m, segbuf, sizeof(segbuf), segs, MAX_SEGS), bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += !tu_verify_l4(segbuf + segs[i].off, segs[i].len) ||
		       segs[i].partial != tu_partial_pseudo(segbuf + segs[i].off, segs[i].len);
	*n_out = n;
	return bad;
}

Test(offload_verifier, catches_wrong_partial_updates)
{
	const char *fams[][4] = { { "10.0.0.9", "1.1.1.1", "198.18.0.3", "198.18.0.1" },
				  { "fd00:1::9", "2001:db8::1", "fd00:7f::3", "fd00:7f::1" } };
	for (int fi = 0; fi < 2; fi++) {
		struct flow f;
		struct shape sh;
		struct pkt_meta m;
		uint8_t ns[16], nd[16];
		memset(&f, 0, sizeof(f));
		f.fam = tu_addr(f.cli, fams[fi][0]);
		tu_addr(f.srv, fams[fi][1]);
		tu_addr(ns, fams[fi][2]);
		tu_addr(nd, fams[fi][3]);
		f.alen = f.fam == 4 ? 4 : 16;
		f.cport = 50123;
		f.sport = 443;
		shape_default(&sh, false, true);
		for (int u = 0; u < UPD_MAX; u++) {
			size_t n, len = build_super(&f, &sh, &m);
			manual_rewrite(len, ns, nd, 30001, 40000, (enum update)u);
			size_t bad = failing_segments(len, &m, &n);
			cr_assert_eq(n, 41u);
			if (u == UPD_RIGHT)
				cr_assert_eq(bad, 0, "v%d %s update: %zu segments fail", f.fam,
					     update_name[u], bad);
			else
				cr_assert_eq(bad, n, "v%d %s update: only %zu of %zu segments caught",
					     f.fam, update_name[u], bad, n);
		}
	}
}

/* The segmenter: sequence numbers, flags, IPv4 IDs, lengths; and for a correct partial sum the
 * NEEDS_CSUM completion gives byte for byte the segments a from-scratch computation gives. */
Test(offload_verifier, segmenter_matches_kernel_rules)
{
	struct flow f;
	struct shape sh;
	struct pkt_meta m, full;
	static uint8_t other[4 * TU_PKT_MAX];

	memset(&f, 0, sizeof(f));
	f.fam = tu_addr(f.cli, "10.0.0.9");
	tu_addr(f.srv, "1.1.1.1");
	f.alen = 4;
	f.cport = 1000;
	f.sport = 2000;
	shape_default(&sh, false, true);
	sh.payload = 3 * MSS + 1;
	sh.flags = TCP_ACK | TCP_PSH | TCP_FIN | TU_TCP_CWR;
	size_t len = build_super(&f, &sh, &m);
	size_t n = tu_gso_segment(sp, len, &m, segbuf, sizeof(segbuf), segs, MAX_SEGS);
	cr_assert_eq(n, 4u);
	for (size_t i = 0; i < n; i++) {
		const uint8_t *s = segbuf + segs[i].off;
		cr_assert_eq(tu_get16(s + 2), segs[i].len);
		cr_assert_eq(segs[i].len, 52u + (i < 3 ? MSS : 1));
		cr_assert_eq(tu_get16(s + 4), (uint16_t)(0xfff0 + i), "IPv4 ID increments");
		cr_assert_eq(tu_get32(s + 24), sh.seq + (uint32_t)(i * MSS));
		uint8_t want = TCP_ACK | (i == 0 ? TU_TCP_CWR : 0) | (i == 3 ? TCP_PSH | TCP_FIN : 0);
		cr_assert_eq(s[33], want, "segment %zu flags 0x%02x", i, s[33]);
		cr_assert(tu_verify_ip4_header(s) && tu_verify_l4(s, segs[i].len));
	}
	memcpy(other, segbuf, segs[n - 1].off + segs[n - 1].len);
	full = m;
	full.flags = 0;
	size_t n2 = tu_gso_segment(sp, len, &full, segbuf, sizeof(segbuf), segs, MAX_SEGS);
	cr_assert_eq(n2, n);
	cr_assert_eq(memcmp(other, segbuf, segs[n - 1].off + segs[n - 1].len), 0,
		     "partial completion == from-scratch checksums");
	/* A packet that fits is one segment; no payload is one segment too. */
	sh.payload = MSS;
	len = build_super(&f, &sh, &m);
	cr_assert_eq(tu_gso_segment(sp, len, &m, segbuf, sizeof(segbuf), segs, MAX_SEGS), 1u);
	cr_assert(tu_verify_l4(segbuf, segs[0].len));
	cr_assert_eq(segbuf[33], sh.flags, "a lone segment keeps every flag");
	sh.payload = 0;
	len = build_super(&f, &sh, &m);
	cr_assert_eq(tu_gso_segment(sp, len, &m, segbuf, sizeof(segbuf), segs, MAX_SEGS), 1u);
	cr_assert(tu_verify_l4(segbuf, segs[0].len));
}
