/* fuzz_udp.c — libFuzzer target for the UDP codec (core/udp_codec).
 *
 * The input is one packet "read from the TUN" (seed corpus: tests/fuzz/make_corpus_udp.py).
 * It is parsed from a heap copy of exactly its length, so ASan catches any read past the end.
 * Invariants for an accepted datagram:
 *   - the view lies inside the input: payload and payload_len within the buffer, family 4/6,
 *     non-zero ports;
 *   - the reply encoded from it (endpoints swapped) has a correct IPv4 header checksum and a
 *     correct, never-zero UDP checksum by an independent byte-wise RFC 1071 sum, and parses back
 *     to exactly the swapped endpoints and the same payload;
 *   - encoding with the payload already in place gives the same bytes as encoding from a copy;
 *   - a buffer one byte too small gives -ENOBUFS and is not written;
 *   - the same payload as a train (udp_codec_encode_train, cut every seg bytes with seg taken
 *     from the payload's length so 1 to 64 datagrams result): its UDP field is the folded,
 *     un-inverted pseudo-header sum over the whole length, and each datagram Linux's UDP GSO
 *     makes of it (lengths and IPv4 ID set, the field adjusted by the length difference and
 *     completed over the datagram) is byte for byte the reply udp_codec_encode makes of that
 *     piece; one datagram is refused (-EINVAL).
 * A rejected input must not have been accepted by a different reason path: the reason is in
 * range and its name is known.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/flow.h"
#include "core/udp_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CAP (48 + 65535)
static uint8_t out_a[CAP], out_b[CAP], out_c[CAP];

static void check(int cond)
{
	if (!cond)
		abort();
}

/* Byte-wise one's complement sum of big-endian 16-bit words (RFC 1071), unfolded. */
static uint32_t ref_sum(const uint8_t *p, size_t n, uint32_t s)
{
	for (size_t i = 0; i + 1 < n; i += 2)
		s += (uint32_t)p[i] << 8 | p[i + 1];
	if (n & 1)
		s += (uint32_t)p[n - 1] << 8;
	return s;
}

static uint16_t ref_fold(uint32_t s)
{
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return (uint16_t)s;
}

/* True iff the UDP checksum of an encoded reply verifies (sum over pseudo-header and the
 * whole UDP datagram, field included, folds to 0xFFFF) and the field is not 0. */
static int ref_verify(const uint8_t *pkt, size_t len, uint8_t family)
{
	size_t alen = family == 4 ? 4 : 16, l3 = family == 4 ? 20 : 40;
	const uint8_t *src = pkt + (family == 4 ? 12 : 8), *dst = src + alen;
	size_t ulen = len - l3;
	uint32_t s = ref_sum(src, alen, 0);

	s = ref_sum(dst, alen, s);
	s += 17 + (uint32_t)ulen;
	s = ref_sum(pkt + l3, ulen, s);
	if (family == 4 && ref_fold(ref_sum(pkt, 20, 0)) != 0xffff)
		return 0;
	return ref_fold(s) == 0xffff && (pkt[l3 + 6] | pkt[l3 + 7]) != 0;
}

static void put16(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

/* The payload as a train, cut as the kernel cuts it, against one-by-one encoding. */
static void train_trip(const struct udp_codec_hdr *h, const uint8_t *payload, size_t len)
{
	size_t hl = udp_codec_hdr_len(h->family), l3 = hl - 8, alen = h->family == 4 ? 4 : 16;
	size_t seg = len / (2 + len % 63) + 1, n = (len + seg - 1) / seg, tl = 0, m = 0;
	struct pkt_meta mt;
	uint32_t ps;
	uint16_t field;
	int r;

	memcpy(out_a + hl, payload, len);
	r = udp_codec_encode_train(h, len, seg, out_a, CAP, &tl, &mt);
	if (n < 2) {
		check(r == -EINVAL);
		return;
	}
	check(r == 0 && tl == hl + len);
	check(mt.flags == PKT_META_NEEDS_CSUM && mt.gso_type == PKT_GSO_UDP_L4);
	check(mt.gso_size == seg && mt.hdr_len == hl && mt.csum_start == l3 && mt.csum_offset == 6);
	ps = ref_sum(h->src, alen, 0);
	ps = ref_sum(h->dst, alen, ps) + 17 + 8 + (uint32_t)len;
	field = (uint16_t)(out_a[l3 + 6] << 8 | out_a[l3 + 7]);
	check(field == ref_fold(ps));
	for (size_t i = 0; i < n; i++) {
		size_t pl = i + 1 < n ? seg : len - i * seg;
		struct udp_codec_hdr hi = *h;
		uint16_t c;

		/* What __udp_gso_segment and the checksum completion make of datagram i. */
		memcpy(out_b, out_a, hl);
		memcpy(out_b + hl, out_a + hl + i * seg, pl);
		if (h->family == 4) {
			put16(out_b + 2, (uint32_t)(hl + pl));
			put16(out_b + 4, (uint32_t)(uint16_t)(h->ip_id + i));
			out_b[10] = out_b[11] = 0;
			put16(out_b + 10, (uint16_t)~ref_fold(ref_sum(out_b, 20, 0)));
		} else {
			put16(out_b + 4, (uint32_t)(8 + pl));
		}
		put16(out_b + l3 + 4, (uint32_t)(8 + pl));
		c = ref_fold((uint32_t)field + (0xffffu ^ (uint32_t)(8 + len)) + (uint32_t)(8 + pl));
		put16(out_b + l3 + 6, 0);
		c = (uint16_t)~ref_fold(ref_sum(out_b + l3, 8 + pl, c));
		put16(out_b + l3 + 6, c ? c : 0xffff);
		check(ref_verify(out_b, hl + pl, h->family));

		hi.ip_id = (uint16_t)(h->ip_id + i);
		check(udp_codec_encode(&hi, out_a + hl + i * seg, pl, out_c, CAP, &m) == 0);
		check(m == hl + pl && !memcmp(out_b, out_c, m));
	}
}

static void round_trip(const struct udp_view *v)
{
	struct udp_codec_hdr h = { .family = v->family, .sport_be = v->dport_be,
				   .dport_be = v->sport_be };
	size_t hl = udp_codec_hdr_len(v->family), n = 0, m = 0;
	struct udp_view w;

	memcpy(h.src, v->dst, 16);
	memcpy(h.dst, v->src, 16);
	h.ip_id = (uint16_t)(v->payload_len * 31u);
	check(udp_codec_encode(&h, v->payload, v->payload_len, out_a, CAP, &n) == 0);
	check(n == hl + v->payload_len);
	check(ref_verify(out_a, n, v->family));
	check(udp_codec_parse(&w, out_a, n) == UDP_CODEC_OK);
	check(w.family == v->family && !memcmp(w.src, v->dst, 16) && !memcmp(w.dst, v->src, 16));
	check(w.sport_be == v->dport_be && w.dport_be == v->sport_be);
	check(w.payload == out_a + hl && w.payload_len == v->payload_len);
	check(v->payload_len == 0 || !memcmp(w.payload, v->payload, v->payload_len));

	/* In place: the payload already sits behind the header room. */
	memcpy(out_b + hl, v->payload, v->payload_len);
	check(udp_codec_encode(&h, out_b + hl, v->payload_len, out_b, CAP, &m) == 0);
	check(m == n && !memcmp(out_a, out_b, n));

	/* One byte short: refused, nothing written. */
	memset(out_b, 0xa5, n);
	check(udp_codec_encode(&h, v->payload, v->payload_len, out_b, n - 1, &m) == -ENOBUFS);
	for (size_t i = 0; i < n; i++)
		check(out_b[i] == 0xa5);

	train_trip(&h, v->payload, v->payload_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *pkt = malloc(size ? size : 1);
	struct udp_view v;
	enum udp_codec_reason r;

	check(pkt != NULL);
	memcpy(pkt, data, size);
	r = udp_codec_parse(&v, pkt, size);
	check((unsigned)r < UDP_CODEC_REASON_MAX);
	check(strcmp(udp_codec_reason_name(r), "unknown") != 0);
	if (r == UDP_CODEC_PKT) {
		check(v.pkt_reason != PKT_OK);
	} else if (r == UDP_CODEC_OK) {
		check(v.family == 4 || v.family == 6);
		check(v.sport_be != 0 && v.dport_be != 0);
		check(v.payload >= pkt + udp_codec_hdr_len(v.family));
		check(v.payload + v.payload_len <= pkt + size);
		round_trip(&v);
	}
	free(pkt);
	return 0;
}
