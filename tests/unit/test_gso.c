/* test_gso.c — GSO trains (core/gso.c) and the in-place UDP super-datagram split
 * (driver_udp_split in core/driver.c).
 *
 * A train is checked the way the kernel will treat it: the super-packet's partial checksum is
 * completed over its whole L4 length and must verify; then it is segmented like
 * tcp_gso_segment (seq advanced, IPv4 id incremented, lengths fixed, PSH on the last segment
 * only, checksums recomputed) and every segment must equal, byte for byte, the segment the
 * stack originally gave the train. A segment the stack built larger than its MSS
 * (gso_train_add_big) goes out whole and is checked the same way, piece by piece. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "core/csum.h"
#include "core/driver.h"
#include "core/gso.h"
#include "core/pkt.h"
#include "testutil.h"

#define MAXOUT 64
#define SEG 1448

struct out {
	uint8_t *pkt[MAXOUT];
	size_t len[MAXOUT];
	struct pkt_meta meta[MAXOUT];
	int n;
};

static void emit(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	struct out *o = arg;
	cr_assert_lt(o->n, MAXOUT);
	o->pkt[o->n] = malloc(len);
	memcpy(o->pkt[o->n], pkt, len);
	o->len[o->n] = len;
	o->meta[o->n] = *m;
	o->n++;
}

static void out_free(struct out *o)
{
	for (int i = 0; i < o->n; i++)
		free(o->pkt[i]);
	o->n = 0;
}

/* Segment i of a flow: seq base + i*SEG, ip id 100 + i, payload from a seeded PRNG. */
static size_t seg(uint8_t *buf, const char *src, const char *dst, int i, size_t payload,
		  uint8_t flags)
{
	struct tu_spec s;

	tu_spec_tcp(&s, src, 40000, dst, 443);
	s.seq = 1000000 + (uint32_t)(i * SEG);
	s.ack = 777;
	s.window = 5000;
	s.ip_id = (uint16_t)(100 + i);
	s.tcp_flags = flags;
	s.payload_len = payload;
	s.payload_seed = 42 + (uint64_t)i;
	return tu_build(&s, buf, 2048);
}

/* Complete a NEEDS_CSUM checksum as the device would: sum from csum_start to the end with the
 * field as the seed, invert, store. */
static void complete_partial(uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	uint8_t *field = pkt + m->csum_start + m->csum_offset;
	uint16_t c = (uint16_t)~csum_fold(csum_partial(pkt + m->csum_start, len - m->csum_start, 0));
	csum_store16(field, c);
}

/* Segment a TCP super-packet like the kernel's GSO (full checksums in each segment). */
static int segment(const uint8_t *sp, size_t len, const struct pkt_meta *m, uint8_t **segs,
		   size_t *lens)
{
	size_t hl = m->hdr_len, payload = len - hl;
	int v4 = (sp[0] >> 4) == 4, n = 0;
	uint16_t l3 = m->csum_start;

	for (size_t off = 0; off < payload; off += m->gso_size, n++) {
		size_t p = payload - off < m->gso_size ? payload - off : m->gso_size;
		uint8_t *d = calloc(1, hl + p);
		bool last = off + p == payload;
		memcpy(d, sp, hl);
		memcpy(d + hl, sp + hl + off, p);
		tu_put32(d + l3 + 4, tu_get32(sp + l3 + 4) + (uint32_t)off);
		if (!last)
			d[l3 + 13] &= (uint8_t)~(TCP_PSH | TCP_FIN);
		if (v4) {
			tu_put16(d + 2, (uint16_t)(hl + p));
			tu_put16(d + 4, (uint16_t)(tu_get16(sp + 4) + n));
			tu_put16(d + 10, 0);
			csum_store16(d + 10, csum_buf(d, 20));
		} else {
			tu_put16(d + 4, (uint16_t)(hl - 40 + p));
		}
		tu_put16(d + l3 + 16, tu_l4_compute(d, hl + p));
		segs[n] = d;
		lens[n] = hl + p;
	}
	return n;
}

static void check_train(const char *src, const char *dst, int nseg, size_t last_payload)
{
	uint8_t orig[MAXOUT][2048];
	size_t olen[MAXOUT];
	struct gso_train *t;
	struct out o = { 0 };
	uint8_t *segs[MAXOUT];
	size_t lens[MAXOUT];

	cr_assert_eq(gso_train_new(NULL, emit, &o, &t), 0);
	for (int i = 0; i < nseg; i++) {
		size_t p = i == nseg - 1 ? last_payload : SEG;
		olen[i] = seg(orig[i], src, dst, i, p, TCP_ACK | (i == nseg - 1 ? TCP_PSH : 0));
		gso_train_add(t, orig[i], olen[i]);
	}
	cr_assert_eq(o.n, 0, "nothing leaves before the flush");
	cr_assert(gso_train_pending(t));
	gso_train_flush(t);
	cr_assert_eq(o.n, 1, "one super-packet");
	cr_assert(!gso_train_pending(t));

	struct pkt_meta m = o.meta[0];
	int v4 = strchr(src, ':') == NULL;
	cr_assert_eq(m.flags, PKT_META_NEEDS_CSUM);
	cr_assert_eq(m.gso_type, v4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6);
	cr_assert_eq(m.gso_size, SEG);
	cr_assert_eq(m.csum_start, v4 ? 20 : 40);
	cr_assert_eq(m.csum_offset, 16);
	cr_assert_eq(m.hdr_len, (v4 ? 20 : 40) + 20);
	cr_assert_eq(o.len[0], m.hdr_len + (size_t)(nseg - 1) * SEG + last_payload);
	if (v4)
		cr_assert(tu_verify_ip4_header(o.pkt[0]), "IPv4 header checksum of the train");

	/* The partial sum covers the whole L4 length: completed, the super-packet verifies. */
	uint8_t *whole = malloc(o.len[0]);
	memcpy(whole, o.pkt[0], o.len[0]);
	complete_partial(whole, o.len[0], &m);
	cr_assert(tu_verify_l4(whole, o.len[0]), "completed partial checksum");
	free(whole);

	int n = segment(o.pkt[0], o.len[0], &m, segs, lens);
	cr_assert_eq(n, nseg);
	for (int i = 0; i < n; i++) {
		cr_assert_eq(lens[i], olen[i], "segment %d length", i);
		cr_assert_arr_eq(segs[i], orig[i], olen[i], "segment %d differs from the original", i);
		free(segs[i]);
	}
	const struct gso_stats *st = gso_train_stats(t);
	cr_assert_eq(ctr_get(&st->trains), 1);
	cr_assert_eq(ctr_get(&st->train_segments), (uint64_t)nseg);
	out_free(&o);
	gso_train_free(t);
}

Test(gso, v4_train_segments_back_into_the_originals)
{
	check_train("10.0.0.2", "198.18.0.9", 44, SEG);
	check_train("10.0.0.2", "198.18.0.9", 7, 100); /* a short last segment */
}

Test(gso, v6_train_segments_back_into_the_originals)
{
	check_train("fd00::2", "fd00:7f::9", 44, SEG);
	check_train("fd00::2", "fd00:7f::9", 2, 1);
}

/* Emit exactly what it was given, with plain metadata. */
static void expect_single(const struct out *o, int i, const uint8_t *pkt, size_t len)
{
	static const struct pkt_meta plain;
	cr_assert_eq(o->len[i], len, "packet %d length", i);
	cr_assert_arr_eq(o->pkt[i], pkt, len, "packet %d changed", i);
	cr_assert_arr_eq(&o->meta[i], &plain, sizeof(plain), "packet %d not plain", i);
}

Test(gso, what_cannot_join_flushes_first_and_keeps_order)
{
	uint8_t a[2048], b[2048], c[2048], syn[2048], gap[2048], other[2048];
	size_t la, lb, lc, lsyn, lgap, lother;
	struct gso_train *t;
	struct out o = { 0 };

	cr_assert_eq(gso_train_new(NULL, emit, &o, &t), 0);
	la = seg(a, "10.0.0.2", "198.18.0.9", 0, SEG, TCP_ACK);
	lb = seg(b, "10.0.0.2", "198.18.0.9", 1, SEG, TCP_ACK);
	/* A pure ACK (no payload): alone, after the train. */
	lc = seg(c, "10.0.0.2", "198.18.0.9", 2, 0, TCP_ACK);
	gso_train_add(t, a, la);
	gso_train_add(t, b, lb);
	gso_train_add(t, c, lc);
	cr_assert_eq(o.n, 2, "train, then the ACK");
	cr_assert_eq(o.meta[0].gso_type, PKT_GSO_TCPV4);
	expect_single(&o, 1, c, lc);
	out_free(&o);

	/* One segment alone: written exactly as built (full checksum, plain header). */
	gso_train_add(t, a, la);
	gso_train_flush(t);
	cr_assert_eq(o.n, 1);
	expect_single(&o, 0, a, la);
	out_free(&o);

	/* A sequence gap, another flow, a SYN and a FIN: no joining. */
	lgap = seg(gap, "10.0.0.2", "198.18.0.9", 5, SEG, TCP_ACK);
	lother = seg(other, "10.0.0.3", "198.18.0.9", 1, SEG, TCP_ACK);
	lsyn = seg(syn, "10.0.0.2", "198.18.0.9", 1, 0, TCP_SYN);
	gso_train_add(t, a, la);
	gso_train_add(t, gap, lgap);
	gso_train_add(t, other, lother);
	gso_train_add(t, syn, lsyn);
	gso_train_flush(t);
	cr_assert_eq(o.n, 4);
	expect_single(&o, 0, a, la);
	expect_single(&o, 1, gap, lgap);
	expect_single(&o, 2, other, lother);
	expect_single(&o, 3, syn, lsyn);
	out_free(&o);

	/* A segment with a different ack (the stack's ACK moved) starts a new train. */
	uint8_t b2[2048];
	size_t lb2 = seg(b2, "10.0.0.2", "198.18.0.9", 1, SEG, TCP_ACK);
	tu_put32(b2 + 20 + 8, 778);
	tu_put16(b2 + 20 + 16, 0);
	tu_put16(b2 + 20 + 16, tu_l4_compute(b2, lb2));
	gso_train_add(t, a, la);
	gso_train_add(t, b2, lb2);
	gso_train_flush(t);
	cr_assert_eq(o.n, 2);
	expect_single(&o, 0, a, la);
	expect_single(&o, 1, b2, lb2);
	out_free(&o);

	/* After a short segment nothing joins (only the last may be short). */
	uint8_t s1[2048], s2[2048];
	size_t ls1 = seg(s1, "10.0.0.2", "198.18.0.9", 1, 500, TCP_ACK);
	struct tu_spec sp;
	tu_spec_tcp(&sp, "10.0.0.2", 40000, "198.18.0.9", 443);
	sp.seq = 1000000 + SEG + 500;
	sp.ack = 777;
	sp.window = 5000;
	sp.ip_id = 102;
	sp.payload_len = 500;
	size_t ls2 = tu_build(&sp, s2, sizeof(s2));
	gso_train_add(t, a, la);
	gso_train_add(t, s1, ls1);
	gso_train_add(t, s2, ls2);
	gso_train_flush(t);
	cr_assert_eq(o.n, 2);
	cr_assert_eq(o.meta[0].gso_type, PKT_GSO_TCPV4);
	cr_assert_eq(o.len[0], 40 + SEG + 500);
	expect_single(&o, 1, s2, ls2);
	out_free(&o);
	gso_train_free(t);
}

Test(gso, a_push_inside_a_train_moves_to_its_end)
{
	uint8_t p[3][2048];
	size_t l[3];
	struct gso_train *t;
	struct out o = { 0 };

	cr_assert_eq(gso_train_new(NULL, emit, &o, &t), 0);
	for (int i = 0; i < 3; i++) {
		l[i] = seg(p[i], "10.0.0.2", "198.18.0.9", i, SEG, TCP_ACK | (i == 1 ? TCP_PSH : 0));
		gso_train_add(t, p[i], l[i]);
	}
	gso_train_flush(t);
	cr_assert_eq(o.n, 1, "PSH does not end a train");
	cr_assert_eq(o.pkt[0][20 + 13], TCP_ACK | TCP_PSH, "the super-packet carries PSH");
	cr_assert_eq(o.len[0], 40 + 3 * SEG);
	out_free(&o);
	gso_train_free(t);
}

/* lwIP with NETIF_CHECKSUM_GEN_TCP off leaves the TCP checksum at 0: under fill_csum the train
 * writes the partial sum for a super-packet and the full checksum for what goes out alone (a
 * pure ACK, a segment of another flow), byte for byte what the stack would have sent. Without
 * fill_csum the same packet goes out untouched. */
Test(gso, fill_csum_completes_what_the_stack_left_out)
{
	uint8_t orig[4][2048], zero[4][2048];
	size_t len[4];
	uint8_t *segs[MAXOUT];
	size_t lens[MAXOUT];
	struct gso_train *t;
	struct out o = { 0 };

	len[0] = seg(orig[0], "10.0.0.2", "198.18.0.9", 0, SEG, TCP_ACK);
	len[1] = seg(orig[1], "10.0.0.2", "198.18.0.9", 1, SEG, TCP_ACK | TCP_PSH);
	len[2] = seg(orig[2], "10.0.0.2", "198.18.0.9", 2, 0, TCP_ACK);
	len[3] = seg(orig[3], "fd00::2", "fd00:7f::9", 0, 300, TCP_ACK);
	for (int i = 0; i < 4; i++) {
		uint16_t l3 = i == 3 ? 40 : 20;
		memcpy(zero[i], orig[i], len[i]);
		csum_store16(zero[i] + l3 + TCP_OFF_CSUM, 0);
		cr_assert_neq(memcmp(zero[i], orig[i], len[i]), 0, "packet %d: a real checksum", i);
	}
	cr_assert_eq(gso_train_new(NULL, emit, &o, &t), 0);
	gso_train_fill_csum(t, 1);
	for (int i = 0; i < 4; i++)
		gso_train_add(t, zero[i], len[i]);
	gso_train_flush(t);
	cr_assert_eq(o.n, 3, "the train, the ACK, the v6 segment");
	cr_assert_eq(o.meta[0].gso_type, PKT_GSO_TCPV4);
	uint8_t *whole = malloc(o.len[0]);
	memcpy(whole, o.pkt[0], o.len[0]);
	complete_partial(whole, o.len[0], &o.meta[0]);
	cr_assert(tu_verify_l4(whole, o.len[0]), "the train's completed checksum");
	free(whole);
	cr_assert_eq(segment(o.pkt[0], o.len[0], &o.meta[0], segs, lens), 2);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(lens[i], len[i]);
		cr_assert_arr_eq(segs[i], orig[i], len[i], "segment %d", i);
		free(segs[i]);
	}
	expect_single(&o, 1, orig[2], len[2]);
	expect_single(&o, 2, orig[3], len[3]);
	cr_assert_eq(ctr_get(&gso_train_stats(t)->csum_filled), 2);
	out_free(&o);
	gso_train_fill_csum(t, 0);
	gso_train_add(t, zero[2], len[2]);
	cr_assert_eq(o.n, 1);
	cr_assert_arr_eq(o.pkt[0], zero[2], len[2], "off: untouched");
	cr_assert_eq(ctr_get(&gso_train_stats(t)->csum_filled), 2);
	out_free(&o);
	gso_train_free(t);
}

Test(gso, a_train_stops_at_64k)
{
	uint8_t p[2048];
	struct gso_train *t;
	struct out o = { 0 };
	int total = 0;

	cr_assert_eq(gso_train_new(NULL, emit, &o, &t), 0);
	for (int i = 0; i < 50; i++) {
		size_t l = seg(p, "10.0.0.2", "198.18.0.9", i, SEG, TCP_ACK);
		gso_train_add(t, p, l);
	}
	gso_train_flush(t);
	cr_assert_eq(o.n, 2);
	for (int i = 0; i < o.n; i++) {
		cr_assert_leq(o.len[i], 65535);
		total += (int)((o.len[i] - 40) / SEG);
	}
	cr_assert_eq(total, 50, "every segment went out once");
	cr_assert_eq(o.len[0], 40 + 45 * SEG, "the first train takes as many as fit");
	out_free(&o);
	gso_train_free(t);
}

/* ---- large segments (gso_train_add_big) ------------------------------------------------------ */

/* A segment the stack built of `payload` bytes at sequence number seq, flags given. */
static size_t big_seg(uint8_t *buf, size_t cap, const char *src, const char *dst, uint32_t seq,
		      size_t payload, uint8_t flags)
{
	struct tu_spec s;

	tu_spec_tcp(&s, src, 40000, dst, 443);
	s.seq = seq;
	s.ack = 777;
	s.window = 5000;
	s.ip_id = 300;
	s.tcp_flags = flags;
	s.payload_len = payload;
	s.payload_seed = 77;
	return tu_build(&s, buf, cap);
}

/* After a train of three MSS-sized segments, one segment of 21 MSS and a bit (FIN set): the
 * train goes first, then the large one whole, as a super-packet the kernel cuts at the MSS.
 * Cut as the kernel would, every piece carries the next slice of the payload at the right
 * sequence number with a valid checksum, and the FIN ends up on the last one only. */
static void check_big(const char *src, const char *dst)
{
	static uint8_t big[70000], want[70000];
	uint8_t p[2048];
	uint8_t *segs[MAXOUT];
	size_t lens[MAXOUT];
	struct gso_train *t;
	struct out o = { 0 };
	size_t payload = 21 * SEG + 100, blen;
	int v4 = strchr(src, ':') == NULL, n;
	uint16_t l3 = v4 ? 20 : 40;

	cr_assert_eq(gso_train_new(NULL, emit, &o, &t), 0);
	for (int i = 0; i < 3; i++)
		gso_train_add_big(t, p, seg(p, src, dst, i, SEG, TCP_ACK), SEG);
	cr_assert_eq(o.n, 0, "MSS-sized segments join the train");
	blen = big_seg(big, sizeof(big), src, dst, 1000000 + 3 * SEG, payload,
		       TCP_ACK | TCP_PSH | TCP_FIN);
	memcpy(want, big, blen);
	gso_train_add_big(t, big, blen, SEG);
	cr_assert_eq(o.n, 2, "the train, then the large segment");
	cr_assert(!gso_train_pending(t));
	cr_assert_eq(o.len[0], (size_t)l3 + 20 + 3 * SEG, "the train came first");
	cr_assert_eq(o.meta[0].gso_size, SEG);

	struct pkt_meta m = o.meta[1];
	cr_assert_eq(o.len[1], blen);
	cr_assert_eq(m.flags, PKT_META_NEEDS_CSUM);
	cr_assert_eq(m.gso_type, v4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6);
	cr_assert_eq(m.gso_size, SEG);
	cr_assert_eq(m.hdr_len, l3 + 20);
	cr_assert_eq(m.csum_start, l3);
	cr_assert_eq(m.csum_offset, 16);
	if (v4)
		cr_assert(tu_verify_ip4_header(o.pkt[1]));
	uint8_t *whole = malloc(o.len[1]);
	memcpy(whole, o.pkt[1], o.len[1]);
	complete_partial(whole, o.len[1], &m);
	cr_assert(tu_verify_l4(whole, o.len[1]), "completed partial checksum");
	free(whole);

	n = segment(o.pkt[1], o.len[1], &m, segs, lens);
	cr_assert_eq(n, 22);
	for (int i = 0; i < n; i++) {
		size_t off = (size_t)i * SEG, pl = i == n - 1 ? 100 : SEG;
		uint8_t *tcp = segs[i] + l3;
		cr_assert_eq(lens[i], (size_t)l3 + 20 + pl, "piece %d length", i);
		cr_assert_eq(tu_get32(tcp + 4), 1000000 + 3 * SEG + (uint32_t)off, "piece %d seq", i);
		cr_assert_arr_eq(segs[i] + l3 + 20, want + l3 + 20 + off, pl, "piece %d payload", i);
		cr_assert(tu_verify_l4(segs[i], lens[i]), "piece %d checksum", i);
		cr_assert_eq(tcp[13] & (TCP_FIN | TCP_PSH), i == n - 1 ? TCP_FIN | TCP_PSH : 0,
			     "piece %d flags", i);
		free(segs[i]);
	}
	const struct gso_stats *st = gso_train_stats(t);
	cr_assert_eq(ctr_get(&st->big_packets), 1);
	cr_assert_eq(ctr_get(&st->big_segments), 22);
	cr_assert_eq(ctr_get(&st->trains), 1);
	cr_assert_eq(ctr_get(&st->segments), 4);
	out_free(&o);
	gso_train_free(t);
}

Test(gso, a_large_segment_goes_whole_after_the_train_v4)
{
	check_big("10.0.0.2", "198.18.0.9");
}

Test(gso, a_large_segment_goes_whole_after_the_train_v6)
{
	check_big("fd00::2", "fd00:7f::9");
}

/* Without an MSS, or at most one MSS long, or not plain data (a RST), a segment is the
 * train's business as before. */
Test(gso, add_big_without_an_mss_is_add)
{
	static uint8_t big[70000];
	struct gso_train *t;
	struct out o = { 0 };
	size_t blen = big_seg(big, sizeof(big), "10.0.0.2", "198.18.0.9", 5, 3 * SEG, TCP_ACK);

	cr_assert_eq(gso_train_new(NULL, emit, &o, &t), 0);
	gso_train_add_big(t, big, blen, 0);
	gso_train_flush(t);
	cr_assert_eq(o.n, 1);
	expect_single(&o, 0, big, blen);
	blen = big_seg(big, sizeof(big), "10.0.0.2", "198.18.0.9", 5, 3 * SEG, TCP_ACK | TCP_RST);
	gso_train_add_big(t, big, blen, SEG);
	cr_assert_eq(o.n, 2, "a RST is never cut");
	expect_single(&o, 1, big, blen);
	cr_assert_eq(ctr_get(&gso_train_stats(t)->big_packets), 0);
	out_free(&o);
	gso_train_free(t);
}

/* ---- UDP split ------------------------------------------------------------------------------ */

struct dgrams {
	uint8_t buf[64][2048];
	size_t len[64];
	int n;
};

static void take(void *arg, const uint8_t *d, size_t len)
{
	struct dgrams *g = arg;
	cr_assert_lt(g->n, 64);
	cr_assert_leq(len, sizeof(g->buf[0]));
	memcpy(g->buf[g->n], d, len);
	g->len[g->n++] = len;
}

static void check_split(const char *src, const char *dst, size_t payload, uint16_t gso)
{
	static uint8_t pkt[70000], want[70000];
	struct tu_spec s;
	struct pkt_view v;
	struct dgrams *g = calloc(1, sizeof(*g));
	size_t len;
	int n;

	tu_spec_udp(&s, src, 5353, dst, 53);
	s.payload_len = payload;
	s.payload_seed = 9;
	s.partial_csum = true;
	len = tu_build(&s, pkt, sizeof(pkt));
	memcpy(want, pkt, len);
	cr_assert_eq(pkt_parse(&v, pkt, len), PKT_OK);
	n = driver_udp_split(pkt, len, v.l3_len, gso, take, g);
	cr_assert_eq(n, (int)((payload + gso - 1) / gso));
	cr_assert_eq(g->n, n);
	for (int i = 0; i < n; i++) {
		size_t p = payload - (size_t)i * gso < gso ? payload - (size_t)i * gso : gso;
		struct pkt_view d;
		cr_assert_eq(g->len[i], v.l3_len + 8 + p);
		cr_assert_eq(pkt_parse(&d, g->buf[i], g->len[i]), PKT_OK, "datagram %d parses", i);
		cr_assert_eq(d.proto, IPPROTO_UDP);
		cr_assert_eq(d.len, g->len[i]);
		cr_assert_eq(tu_get16(d.l4 + 4), 8 + p, "UDP length");
		cr_assert_arr_eq(g->buf[i] + v.l3_len + 8, want + v.l3_len + 8 + (size_t)i * gso, p,
				 "datagram %d payload", i);
		cr_assert_arr_eq(d.l4, want + v.l3_len, 4, "ports");
		if (d.family == 4)
			cr_assert(tu_verify_ip4_header(g->buf[i]), "IPv4 header checksum %d", i);
	}
	free(g);
}

Test(gso, udp_super_datagram_splits_in_place)
{
	check_split("10.0.0.2", "198.18.0.9", 4 * 1200 + 7, 1200);
	check_split("10.0.0.2", "198.18.0.9", 1200, 1200); /* one datagram */
	check_split("fd00::2", "fd00:7f::9", 10 * 1000, 1000);
	check_split("10.0.0.2", "198.18.0.9", 20 * 8, 8); /* gso smaller than the headers */
}

Test(gso, udp_split_refuses_what_does_not_add_up)
{
	uint8_t pkt[64] = { 0x45 };
	int calls = 0;
	cr_assert_eq(driver_udp_split(pkt, 28, 20, 100, NULL, &calls), -EINVAL, "no payload");
	cr_assert_eq(driver_udp_split(pkt, 20, 20, 100, NULL, &calls), -EINVAL, "truncated");
	cr_assert_eq(driver_udp_split(pkt, 40, 20, 0, NULL, &calls), -EINVAL, "gso_size 0");
	cr_assert_eq(driver_udp_split(pkt, 40, 300, 10, NULL, &calls), -EINVAL, "headers too long");
}
