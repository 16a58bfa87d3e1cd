/* test_csum.c — core/csum: full sums against a naive reference, pseudo-headers, and the RFC 1624
 * incremental and NEEDS_CSUM partial updates judged by verifying the resulting packets from
 * scratch (testutil's independent RFC 1071 code), never by comparing bytes.
 */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>

#include "core/csum.h"
#include "core/pkt.h"
#include "testutil.h"

enum { ITERS = 5000 };

/* Naive RFC 1071 over big-endian words, byte loads, 64-bit sum, folded (not inverted). */
static uint16_t naive_fold(const uint8_t *p, size_t n)
{
	uint64_t s = 0;
	for (size_t i = 0; i < n; i++)
		s += i & 1 ? p[i] : (uint64_t)p[i] << 8;
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return (uint16_t)s;
}

/* A host-order folded value as the big-endian number it represents once stored. */
static uint16_t as_be(uint16_t host_folded)
{
	uint8_t b[2];
	csum_store16(b, host_folded);
	return tu_get16(b);
}

/* ---- full checksum ---- */

Test(csum, known_answers)
{
	/* RFC 1071 section 3 example: the folded sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2. */
	static const uint8_t rfc[] = { 0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7 };
	cr_assert_eq(as_be(csum_fold(csum_partial(rfc, sizeof(rfc), 0))), 0xddf2);
	/* A real IPv4 header with its checksum field zeroed: checksum b861. */
	static const uint8_t ip[] = { 0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
				      0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7 };
	cr_assert_eq(as_be(csum_buf(ip, sizeof(ip))), 0xb861);
	cr_assert_eq(csum_partial(ip, 0, 0), 0);
	cr_assert_eq(csum_fold(0), 0);
	/* Odd length: the last byte is the high-order byte of a zero-padded word. */
	static const uint8_t odd[] = { 0x12, 0x34, 0x56 };
	cr_assert_eq(as_be(csum_fold(csum_partial(odd, 3, 0))), 0x1234 + 0x5600);
}

Test(csum, full_vs_naive_random_lengths_and_alignment)
{
	static uint8_t mem[4096 + 16];
	struct tu_rng r;
	tu_rng_seed(&r, 1);
	for (int it = 0; it < ITERS; it++) {
		size_t off = tu_rand_below(&r, 16);
		size_t len = tu_rand_chance(&r, 4) ? tu_rand_below(&r, 16) : tu_rand_below(&r, 4097);
		uint8_t *p = mem + off;
		tu_rand_bytes(&r, p, len);
		if (tu_rand_chance(&r, 8))
			memset(p, 0xff, len); /* maximal carries */
		uint16_t want = naive_fold(p, len);
		cr_assert_eq(as_be(csum_fold(csum_partial(p, len, 0))), want,
			     "len %zu off %zu", len, off);
		cr_assert_eq(as_be(csum_buf(p, len)), (uint16_t)~want, "len %zu off %zu", len, off);
		/* Chaining at an even split gives the same sum. */
		size_t split = len ? tu_rand_below(&r, (uint32_t)len + 1) & ~(size_t)1 : 0;
		uint64_t s = csum_partial(p + split, len - split, csum_partial(p, split, 0));
		cr_assert_eq(as_be(csum_fold(s)), want, "split %zu of %zu", split, len);
	}
}

Test(csum, full_large_all_ones_and_zero)
{
	static uint8_t big[65536 + 3];
	memset(big, 0xff, sizeof(big));
	for (size_t len = 65533; len <= sizeof(big); len++)
		cr_assert_eq(as_be(csum_fold(csum_partial(big, len, 0))), naive_fold(big, len));
	memset(big, 0, sizeof(big));
	cr_assert_eq(csum_fold(csum_partial(big, sizeof(big), 0)), 0);
	cr_assert_eq(csum_buf(big, sizeof(big)), 0xffff);
}

Test(csum, fold_edges)
{
	cr_assert_eq(csum_fold(0xffff), 0xffff);
	cr_assert_eq(csum_fold(0x10000), 1);
	cr_assert_eq(csum_fold(0x1fffe), 0xffff);
	cr_assert_eq(csum_fold(UINT64_MAX), 0xffff);
	cr_assert_eq(csum_fold(0xffffffffull), 0xffff);
	cr_assert_eq(csum_fold(0x100000000ull), 1);
}

/* ---- pseudo-headers ---- */

/* The pseudo-header sum, computed naively in big-endian words. */
static uint16_t naive_pseudo(int family, const uint8_t *src, const uint8_t *dst, uint8_t proto,
			     uint32_t l4_len)
{
	uint8_t ph[40];
	size_t n;
	memset(ph, 0, sizeof(ph));
	if (family == 4) {
		memcpy(ph, src, 4);
		memcpy(ph + 4, dst, 4);
		ph[9] = proto;
		tu_put16(ph + 10, (uint16_t)l4_len);
		n = 12;
	} else {
		memcpy(ph, src, 16);
		memcpy(ph + 16, dst, 16);
		tu_put32(ph + 32, l4_len);
		ph[39] = proto;
		n = 40;
	}
	return naive_fold(ph, n);
}

Test(csum, pseudo_headers)
{
	struct tu_rng r;
	tu_rng_seed(&r, 2);
	for (int it = 0; it < ITERS; it++) {
		uint8_t src[16], dst[16];
		tu_rand_bytes(&r, src, 16);
		tu_rand_bytes(&r, dst, 16);
		uint8_t proto = (uint8_t)tu_rand32(&r);
		uint32_t l4v4 = tu_rand32(&r) & 0xffff;
		uint32_t l4v6 = tu_rand_chance(&r, 2) ? tu_rand32(&r) : l4v4; /* jumbograms too */
		cr_assert_eq(as_be(csum_fold(csum_pseudo4(src, dst, proto, l4v4))),
			     naive_pseudo(4, src, dst, proto, l4v4));
		cr_assert_eq(as_be(csum_fold(csum_pseudo6(src, dst, proto, l4v6))),
			     naive_pseudo(6, src, dst, proto, l4v6));
	}
}

Test(csum, pseudo_matches_built_packets)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, 3);
	for (int it = 0; it < 1000; it++) {
		size_t len = tu_rand_packet(&r, buf, sizeof(buf), 0, 0, 1500);
		struct pkt_view v;
		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		uint64_t ps = v.family == 4 ? csum_pseudo4(pkt_src(&v), pkt_dst(&v), v.proto, v.l4_len)
					    : csum_pseudo6(pkt_src(&v), pkt_dst(&v), v.proto, v.l4_len);
		cr_assert_eq(as_be(csum_fold(ps)), tu_partial_pseudo(buf, len));
		/* And the full L4 checksum from csum.c verifies, built the production way. */
		if (v.proto == IPPROTO_ICMP)
			continue;
		uint8_t *f = v.l4 + tu_l4_csum_off(v.proto);
		csum_store16(f, 0);
		uint16_t c = (uint16_t)~csum_fold(csum_partial(v.l4, v.l4_len, ps));
		csum_store16(f, c ? c : 0xffff);
		cr_assert(tu_verify_l4(buf, len), "iteration %d", it);
	}
}

/* ---- incremental update ---- */

struct rewrite {
	uint8_t src[16], dst[16];
	uint16_t sport, dport; /* host order */
};

static void rand_rewrite(struct tu_rng *r, struct rewrite *w, int family)
{
	memset(w, 0, sizeof(*w));
	tu_rand_bytes(r, w->src, family == 4 ? 4 : 16);
	tu_rand_bytes(r, w->dst, family == 4 ? 4 : 16);
	w->sport = (uint16_t)tu_rand32(r);
	w->dport = (uint16_t)tu_rand32(r);
}

/* Rewrite addresses and ports in place the way the packet processor does: accumulate every
 * replaced word, fold once. partial = the L4 field is a NEEDS_CSUM pseudo-header sum, so only
 * the address words enter its update. */
static void rewrite_incremental(uint8_t *buf, size_t len, const struct rewrite *w, bool partial)
{
	struct pkt_view v;
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	size_t alen = v.family == 4 ? 4 : 16;
	uint64_t acc = 0;
	csum_acc_bytes(&acc, pkt_src(&v), w->src, alen);
	csum_acc_bytes(&acc, pkt_dst(&v), w->dst, alen);
	if (v.family == 4) {
		uint8_t *hc = v.ip + 10;
		csum_store16(hc, csum_apply(csum_load16(hc), acc));
	}
	uint8_t ports[4];
	tu_put16(ports, w->sport);
	tu_put16(ports + 2, w->dport);
	uint64_t l4acc = acc;
	if (!partial)
		csum_acc_bytes(&l4acc, v.l4, ports, 4);
	uint8_t *f = v.l4 + (v.proto == IPPROTO_TCP ? TCP_OFF_CSUM : UDP_OFF_CSUM);
	if (partial)
		csum_store16(f, csum_apply_partial(csum_load16(f), l4acc));
	else
		csum_store16(f, csum_apply_l4(csum_load16(f), l4acc));
	memcpy(pkt_src(&v), w->src, alen);
	memcpy(pkt_dst(&v), w->dst, alen);
	memcpy(v.l4, ports, 4);
}

static void incremental_many(int family, uint8_t proto, uint64_t seed)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, seed);
	for (int it = 0; it < ITERS; it++) {
		size_t len = tu_rand_packet(&r, buf, sizeof(buf), family, proto,
					    tu_rand_chance(&r, 50) ? 9000 : 1500);
		cr_assert(tu_verify_l4(buf, len), "input must start from a correct checksum");
		struct rewrite w;
		rand_rewrite(&r, &w, family);
		/* Sometimes a side keeps its address and port (words replaced by themselves). */
		if (tu_rand_chance(&r, 8)) {
			struct tu_layout lo;
			cr_assert(tu_layout(buf, len, &lo));
			memcpy(w.src, buf + (family == 4 ? PKT_V4_SRC : PKT_V6_SRC), family == 4 ? 4 : 16);
			w.sport = tu_get16(buf + lo.l3_len);
		}
		rewrite_incremental(buf, len, &w, false);
		cr_assert(tu_verify_l4(buf, len), "v%d proto %u iteration %d", family, proto, it);
		cr_assert_neq(tu_l4_field(buf, len), 0, "a produced checksum is never 0");
		if (family == 4)
			cr_assert(tu_verify_ip4_header(buf), "iteration %d", it);
	}
}

Test(csum, incremental_tcp4) { incremental_many(4, IPPROTO_TCP, 10); }
Test(csum, incremental_tcp6) { incremental_many(6, IPPROTO_TCP, 11); }
Test(csum, incremental_udp4) { incremental_many(4, IPPROTO_UDP, 12); }
Test(csum, incremental_udp6) { incremental_many(6, IPPROTO_UDP, 13); }

Test(csum, incremental_acc16_equals_acc32)
{
	struct tu_rng r;
	tu_rng_seed(&r, 14);
	for (int it = 0; it < ITERS; it++) {
		uint8_t o[4], n[4];
		tu_rand_bytes(&r, o, 4);
		tu_rand_bytes(&r, n, 4);
		uint64_t a32 = 0, a16 = 0;
		uint32_t o32, n32;
		memcpy(&o32, o, 4);
		memcpy(&n32, n, 4);
		csum_acc32(&a32, o32, n32);
		csum_acc16(&a16, csum_load16(o), csum_load16(n));
		csum_acc16(&a16, csum_load16(o + 2), csum_load16(n + 2));
		uint16_t c = (uint16_t)tu_rand32(&r);
		cr_assert_eq(csum_apply(c, a32), csum_apply(c, a16));
	}
}

/* Build a packet whose L4 checksum after the rewrite w is exactly 0x0000 when recomputed. */
static size_t build_zero_after(struct tu_rng *r, uint8_t *buf, size_t cap, int family,
			       uint8_t proto, struct rewrite *w)
{
	static uint8_t q[TU_PKT_MAX];
	for (;;) {
		struct tu_spec s;
		tu_rand_spec(r, &s, family, proto, 200);
		if (s.payload_len < 2)
			s.payload_len = 2;
		size_t len = tu_build(&s, buf, cap);
		rand_rewrite(r, w, family);
		memcpy(q, buf, len);
		tu_set_addrs(q, len, w->src, w->dst);
		tu_set_ports(q, len, w->sport, w->dport);
		struct tu_layout lo;
		cr_assert(tu_layout(q, len, &lo));
		size_t word = lo.l4_len - s.payload_len; /* first payload word; header sizes are even */
		if (!tu_steer_l4_csum(q, len, word, 0))
			continue;
		memcpy(buf + lo.l3_len + word, q + lo.l3_len + word, 2);
		tu_fix_checksums(buf, len);
		cr_assert(tu_verify_l4(buf, len));
		return len;
	}
}

static void zero_case(int family, uint8_t proto, uint64_t seed)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, seed);
	for (int it = 0; it < 500; it++) {
		struct rewrite w;
		size_t len = build_zero_after(&r, buf, sizeof(buf), family, proto, &w);
		rewrite_incremental(buf, len, &w, false);
		cr_assert_eq(tu_l4_compute(buf, len), 0, "the recomputed checksum is 0 by construction");
		cr_assert_eq(tu_l4_field(buf, len), 0xffff, "0 must be written 0xFFFF (iteration %d)", it);
		cr_assert(tu_verify_l4(buf, len));
	}
}

Test(csum, zero_result_written_ffff_tcp4) { zero_case(4, IPPROTO_TCP, 20); }
Test(csum, zero_result_written_ffff_tcp6) { zero_case(6, IPPROTO_TCP, 21); }
Test(csum, zero_result_written_ffff_udp4) { zero_case(4, IPPROTO_UDP, 22); }
Test(csum, zero_result_written_ffff_udp6) { zero_case(6, IPPROTO_UDP, 23); }

/* Start from a field holding 0x0000 or 0xFFFF for a computed 0 (both are valid encodings). */
Test(csum, incremental_from_either_zero_encoding)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, 24);
	for (int it = 0; it < 1000; it++) {
		int family = it & 1 ? 6 : 4;
		struct tu_spec s;
		tu_rand_spec(&r, &s, family, IPPROTO_TCP, 100);
		s.payload_len = 2 + s.payload_len;
		size_t len = tu_build(&s, buf, sizeof(buf));
		struct tu_layout lo;
		cr_assert(tu_layout(buf, len, &lo));
		cr_assert(tu_steer_l4_csum(buf, len, lo.l4_len - s.payload_len, 0));
		tu_put16(buf + lo.l3_len + TCP_OFF_CSUM, it & 2 ? 0xffff : 0x0000);
		cr_assert(tu_verify_l4(buf, len));
		struct rewrite w;
		rand_rewrite(&r, &w, family);
		rewrite_incremental(buf, len, &w, false);
		cr_assert(tu_verify_l4(buf, len), "iteration %d", it);
	}
}

/* An incremental update of an IPv6 packet that never had a correct checksum looks
 * plausible but is wrong. The tests above all start from verified packets; this shows why. */
Test(csum, ipv6_must_start_from_a_correct_checksum)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, 25);
	int wrong = 0;
	for (int it = 0; it < 200; it++) {
		struct tu_spec s;
		tu_rand_spec(&r, &s, 6, IPPROTO_UDP, 300);
		s.udp_no_csum = true;
		size_t len = tu_build(&s, buf, sizeof(buf));
		cr_assert(!tu_verify_l4(buf, len) || tu_l4_compute(buf, len) == 0);
		struct rewrite w;
		rand_rewrite(&r, &w, 6);
		rewrite_incremental(buf, len, &w, false);
		wrong += !tu_verify_l4(buf, len);
	}
	cr_assert_gt(wrong, 190, "an update of a zero v6 checksum must not pass verification");
}

/* ---- NEEDS_CSUM partial update ---- */

static void partial_many(int family, uint8_t proto, uint64_t seed)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, seed);
	for (int it = 0; it < 2000; it++) {
		struct tu_spec s;
		/* GSO super-packets reach ~64 KiB. */
		tu_rand_spec(&r, &s, family, proto, tu_rand_chance(&r, 10) ? 65000 : 1500);
		s.partial_csum = true;
		size_t len = tu_build(&s, buf, sizeof(buf));
		cr_assert(tu_verify_partial(buf, len));
		struct rewrite w;
		rand_rewrite(&r, &w, family);
		rewrite_incremental(buf, len, &w, true);
		cr_assert_eq(tu_l4_field(buf, len), tu_partial_pseudo(buf, len),
			     "v%d proto %u iteration %d", family, proto, it);
		if (family == 4)
			cr_assert(tu_verify_ip4_header(buf));
		/* What the kernel then does: complete the sum over the segment. */
		tu_complete_partial(buf, len);
		cr_assert(tu_verify_l4(buf, len));
	}
}

Test(csum, partial_tcp4) { partial_many(4, IPPROTO_TCP, 30); }
Test(csum, partial_tcp6) { partial_many(6, IPPROTO_TCP, 31); }
Test(csum, partial_udp4) { partial_many(4, IPPROTO_UDP, 32); }
Test(csum, partial_udp6) { partial_many(6, IPPROTO_UDP, 33); }

/* Ports are not in the pseudo-header: feeding them into the partial update breaks it. */
Test(csum, partial_excludes_ports)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, 34);
	for (int it = 0; it < 500; it++) {
		int family = it & 1 ? 4 : 6;
		struct tu_spec s;
		tu_rand_spec(&r, &s, family, IPPROTO_TCP, 1500);
		s.partial_csum = true;
		size_t len = tu_build(&s, buf, sizeof(buf));
		struct pkt_view v;
		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		uint16_t before = tu_partial_pseudo(buf, len);
		/* Change only the ports: the partial must stay as it was. */
		uint16_t np[2] = { (uint16_t)tu_rand32(&r), (uint16_t)tu_rand32(&r) };
		if (np[0] == s.sport && np[1] == s.dport)
			np[0]++;
		tu_set_ports(buf, len, np[0], np[1]);
		cr_assert_eq(tu_partial_pseudo(buf, len), before);
		/* A wrong update that includes the ports no longer matches. */
		uint8_t oldp[4], newp[4];
		tu_put16(oldp, s.sport);
		tu_put16(oldp + 2, s.dport);
		tu_put16(newp, np[0]);
		tu_put16(newp + 2, np[1]);
		uint64_t acc = 0;
		csum_acc_bytes(&acc, oldp, newp, 4);
		uint16_t wrong = csum_apply_partial(csum_load16(v.l4 + TCP_OFF_CSUM), acc);
		cr_assert_neq(as_be(wrong), before);
	}
}

/* ---- IPv4 header checksum ---- */

Test(csum, ip4_header_update)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, 40);
	for (int it = 0; it < ITERS; it++) {
		struct tu_spec s;
		tu_rand_spec(&r, &s, 4, 0, 64);
		if (tu_rand_chance(&r, 2)) {
			s.ip4_opts_len = (uint8_t)(4 * tu_rand_range(&r, 1, 10));
			tu_rand_bytes(&r, s.ip4_opts, s.ip4_opts_len);
		}
		tu_build(&s, buf, sizeof(buf));
		cr_assert(tu_verify_ip4_header(buf));
		uint64_t acc = 0;
		uint8_t ns[4], nd[4];
		tu_rand_bytes(&r, ns, 4);
		tu_rand_bytes(&r, nd, 4);
		csum_acc_bytes(&acc, buf + PKT_V4_SRC, ns, 4);
		csum_acc_bytes(&acc, buf + PKT_V4_DST, nd, 4);
		memcpy(buf + PKT_V4_SRC, ns, 4);
		memcpy(buf + PKT_V4_DST, nd, 4);
		/* A TTL decrement through the 16-bit variant (TTL shares a word with proto). */
		uint16_t oldw = csum_load16(buf + 8);
		buf[8] = (uint8_t)(buf[8] - 1);
		csum_acc16(&acc, oldw, csum_load16(buf + 8));
		csum_store16(buf + 10, csum_apply(csum_load16(buf + 10), acc));
		cr_assert(tu_verify_ip4_header(buf), "iteration %d", it);
	}
}

/* The identity replacement leaves a correct checksum correct (0 and 0xFFFF encodings aside). */
Test(csum, identity_replacement)
{
	static uint8_t buf[TU_PKT_MAX];
	struct tu_rng r;
	tu_rng_seed(&r, 41);
	for (int it = 0; it < 1000; it++) {
		size_t len = tu_rand_packet(&r, buf, sizeof(buf), 0, IPPROTO_TCP, 500);
		struct pkt_view v;
		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		struct rewrite w;
		memset(&w, 0, sizeof(w));
		memcpy(w.src, pkt_src(&v), v.family == 4 ? 4 : 16);
		memcpy(w.dst, pkt_dst(&v), v.family == 4 ? 4 : 16);
		w.sport = tu_get16(v.l4);
		w.dport = tu_get16(v.l4 + 2);
		rewrite_incremental(buf, len, &w, false);
		cr_assert(tu_verify_l4(buf, len));
		if (v.family == 4)
			cr_assert(tu_verify_ip4_header(buf));
	}
}
