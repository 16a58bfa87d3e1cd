/* test_udp_codec.c — core/udp_codec: accepted and rejected shapes (with their reasons), replies
 * checked by the independent verifiers of testutil (IPv4 header and RFC 768 checksums), the
 * computed-zero checksum, size limits and a randomized round trip. Parses run on heap copies of
 * exactly the packet's length, so the ASan tree catches any read past the end.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "core/udp_codec.h"
#include "testutil.h"

static uint8_t *dup_exact(const uint8_t *p, size_t len)
{
	uint8_t *c = malloc(len ? len : 1);
	cr_assert_not_null(c);
	memcpy(c, p, len);
	return c;
}

/* Parse a copy of pkt; on UDP_CODEC_OK the payload pointer is rebased onto pkt. */
static enum udp_codec_reason parse(struct udp_view *v, const uint8_t *pkt, size_t len)
{
	uint8_t *c = dup_exact(pkt, len);
	enum udp_codec_reason r = udp_codec_parse(v, c, len);
	if (r == UDP_CODEC_OK) {
		cr_assert_geq(v->payload, c);
		cr_assert_leq(v->payload + v->payload_len, c + len);
		v->payload = pkt + (v->payload - c);
	}
	free(c);
	return r;
}

static size_t build_udp(uint8_t *buf, size_t cap, const char *src, uint16_t sport,
			const char *dst, uint16_t dport, const void *payload, size_t len)
{
	struct tu_spec s;
	tu_spec_udp(&s, src, sport, dst, dport);
	s.payload = payload;
	s.payload_len = len;
	return tu_build(&s, buf, cap);
}

static void check_addr(const uint8_t got[16], const char *text)
{
	uint8_t want[16];
	tu_addr(want, text);
	cr_assert_arr_eq(got, want, 16, "address differs from %s", text);
}

Test(udp_codec, parse_v4)
{
	uint8_t pkt[256];
	const char msg[] = "hello, world";
	size_t n = build_udp(pkt, sizeof(pkt), "10.0.0.9", 5353, "1.2.3.4", 53, msg, 12);
	struct udp_view v;

	cr_assert_eq(parse(&v, pkt, n), UDP_CODEC_OK);
	cr_assert_eq(v.family, 4);
	check_addr(v.src, "10.0.0.9");
	check_addr(v.dst, "1.2.3.4");
	cr_assert_eq(ntohs(v.sport_be), 5353);
	cr_assert_eq(ntohs(v.dport_be), 53);
	cr_assert_eq(v.payload, pkt + 28);
	cr_assert_eq(v.payload_len, 12);
	cr_assert_eq(v.pkt_reason, PKT_OK);
}

Test(udp_codec, parse_v6_with_extension_headers)
{
	uint8_t pkt[256];
	struct tu_spec s;
	struct udp_view v;

	tu_spec_udp(&s, "fd00::9", 40000, "2001:db8::1", 443);
	s.ext[0] = (struct tu_ext){ 0, 0 };   /* Hop-by-Hop, 8 bytes */
	s.ext[1] = (struct tu_ext){ 60, 1 };  /* Destination Options, 16 bytes */
	s.ext_n = 2;
	s.payload_len = 33;
	s.payload_seed = 7;
	size_t n = tu_build(&s, pkt, sizeof(pkt));
	cr_assert_eq(parse(&v, pkt, n), UDP_CODEC_OK);
	cr_assert_eq(v.family, 6);
	check_addr(v.src, "fd00::9");
	check_addr(v.dst, "2001:db8::1");
	cr_assert_eq(ntohs(v.sport_be), 40000);
	cr_assert_eq(ntohs(v.dport_be), 443);
	cr_assert_eq(v.payload, pkt + 40 + 24 + 8);
	cr_assert_eq(v.payload_len, 33);
}

Test(udp_codec, payload_follows_udp_length_not_ip_length)
{
	uint8_t pkt[256];
	size_t n = build_udp(pkt, sizeof(pkt), "10.0.0.9", 1, "1.2.3.4", 2, "abcdefgh", 8);
	struct udp_view v;

	/* UDP length 12 inside a 36-byte datagram: the last 4 bytes are IP padding. */
	tu_put16(pkt + 28 - 8 + 4, 12);
	cr_assert_eq(parse(&v, pkt, n), UDP_CODEC_OK);
	cr_assert_eq(v.payload_len, 4);
	/* Trailing bytes after the IP datagram (e.g. link padding) are ignored too. */
	n = build_udp(pkt, sizeof(pkt), "10.0.0.9", 1, "1.2.3.4", 2, "abcdefgh", 8);
	memset(pkt + n, 0xee, 10);
	cr_assert_eq(parse(&v, pkt, n + 10), UDP_CODEC_OK);
	cr_assert_eq(v.payload_len, 8);
}

/* One rejection: the codec's reason and, for UDP_CODEC_PKT, pkt_parse's. */
static void expect_reject(const uint8_t *pkt, size_t len, enum udp_codec_reason want,
			  enum pkt_reason want_pkt, const char *what)
{
	struct udp_view v;
	enum udp_codec_reason r = parse(&v, pkt, len);
	cr_assert_eq(r, want, "%s: got %s, want %s", what, udp_codec_reason_name(r),
		     udp_codec_reason_name(want));
	cr_assert_eq(v.pkt_reason, want_pkt, "%s: pkt reason %s, want %s", what,
		     pkt_reason_name(v.pkt_reason), pkt_reason_name(want_pkt));
}

Test(udp_codec, rejections_with_reasons)
{
	uint8_t pkt[256];
	struct tu_spec s;
	size_t n;

	memset(pkt, 0, sizeof(pkt));
	expect_reject(pkt, 0, UDP_CODEC_PKT, PKT_EMPTY, "empty");
	n = build_udp(pkt, sizeof(pkt), "10.0.0.9", 1000, "1.2.3.4", 53, "q", 1);
	expect_reject(pkt, 19, UDP_CODEC_PKT, PKT_V4_TRUNCATED, "v4 header cut");
	expect_reject(pkt, n - 1, UDP_CODEC_PKT, PKT_V4_BAD_TOTLEN, "datagram cut");

	tu_spec_tcp(&s, "10.0.0.9", 1000, "1.2.3.4", 80);
	n = tu_build(&s, pkt, sizeof(pkt));
	expect_reject(pkt, n, UDP_CODEC_NOT_UDP, PKT_OK, "tcp");
	tu_spec_icmp_echo(&s, "fd00::9", "fd00::1", 1, 1);
	n = tu_build(&s, pkt, sizeof(pkt));
	expect_reject(pkt, n, UDP_CODEC_NOT_UDP, PKT_OK, "icmpv6");

	tu_spec_udp(&s, "10.0.0.9", 1000, "1.2.3.4", 53);
	s.ip4_frag = 0x2000; /* MF */
	n = tu_build(&s, pkt, sizeof(pkt));
	expect_reject(pkt, n, UDP_CODEC_PKT, PKT_V4_FRAGMENT, "v4 first fragment");

	tu_spec_udp(&s, "fd00::9", 1000, "fd00::1", 53);
	s.ext[0] = (struct tu_ext){ 44, 0 };
	s.ext_n = 1;
	n = tu_build(&s, pkt, sizeof(pkt));
	expect_reject(pkt, n, UDP_CODEC_PKT, PKT_V6_FRAGMENT, "v6 fragment");

	n = build_udp(pkt, sizeof(pkt), "10.0.0.9", 1000, "1.2.3.4", 53, "abcd", 4);
	tu_put16(pkt + 24, 7);
	expect_reject(pkt, n, UDP_CODEC_PKT, PKT_UDP_BAD_LEN, "udp length < 8");
	tu_put16(pkt + 24, 13);
	expect_reject(pkt, n, UDP_CODEC_PKT, PKT_UDP_BAD_LEN, "udp length past the datagram");

	/* An IP datagram too short for the UDP header. */
	n = build_udp(pkt, sizeof(pkt), "10.0.0.9", 1000, "1.2.3.4", 53, NULL, 0);
	tu_put16(pkt + 2, 26);
	tu_fix_ip4_header(pkt);
	expect_reject(pkt, 26, UDP_CODEC_PKT, PKT_UDP_TRUNCATED, "udp header cut");

	n = build_udp(pkt, sizeof(pkt), "10.0.0.9", 0, "1.2.3.4", 53, "x", 1);
	expect_reject(pkt, n, UDP_CODEC_ZERO_PORT, PKT_OK, "source port 0");
	n = build_udp(pkt, sizeof(pkt), "fd00::9", 9, "fd00::1", 0, "x", 1);
	expect_reject(pkt, n, UDP_CODEC_ZERO_PORT, PKT_OK, "destination port 0");

	pkt[0] = 0x55;
	expect_reject(pkt, 40, UDP_CODEC_PKT, PKT_BAD_VERSION, "version 5");
	cr_assert_str_eq(udp_codec_reason_name(UDP_CODEC_ZERO_PORT), "zero_port");
	cr_assert_str_eq(udp_codec_reason_name(UDP_CODEC_REASON_MAX), "unknown");
}

static struct udp_codec_hdr hdr(const char *src, uint16_t sport, const char *dst,
				uint16_t dport, uint16_t id)
{
	struct udp_codec_hdr h;
	memset(&h, 0, sizeof(h));
	h.family = (uint8_t)tu_addr(h.src, src);
	cr_assert_eq(tu_addr(h.dst, dst), h.family);
	h.sport_be = htons(sport);
	h.dport_be = htons(dport);
	h.ip_id = id;
	return h;
}

/* Everything a reply must be: verified by the reference code, then parsed back by ours. */
static void check_encoded(const uint8_t *pkt, size_t len, const struct udp_codec_hdr *h,
			  const uint8_t *payload, size_t plen)
{
	struct tu_layout lo;
	struct udp_view v;

	cr_assert(tu_layout(pkt, len, &lo));
	cr_assert_eq(lo.family, h->family);
	cr_assert_eq(lo.proto, IPPROTO_UDP);
	cr_assert_eq(lo.len, len);
	cr_assert_eq(lo.l3_len, udp_codec_hdr_len(h->family) - 8);
	cr_assert_eq(lo.l4_len, plen + 8);
	if (h->family == 4) {
		cr_assert(tu_verify_ip4_header(pkt), "IPv4 header checksum");
		cr_assert_eq(pkt[8], 64, "TTL");
		cr_assert_eq(tu_get16(pkt + 4), h->ip_id, "IP id");
		cr_assert_eq(tu_get16(pkt + 6), 0, "no fragment bits");
	} else {
		cr_assert_eq(pkt[7], 64, "hop limit");
		cr_assert_eq(tu_get32(pkt) >> 28, 6);
	}
	cr_assert(tu_verify_l4(pkt, len), "UDP checksum");
	cr_assert_neq(tu_l4_field(pkt, len), 0, "a checksum is always sent");
	cr_assert_eq(tu_get16(pkt + lo.l3_len + 4), plen + 8, "UDP length");
	cr_assert_eq(parse(&v, pkt, len), UDP_CODEC_OK);
	cr_assert_arr_eq(v.src, h->src, 16);
	cr_assert_arr_eq(v.dst, h->dst, 16);
	cr_assert_eq(v.sport_be, h->sport_be);
	cr_assert_eq(v.dport_be, h->dport_be);
	cr_assert_eq(v.payload_len, plen);
	if (plen)
		cr_assert_arr_eq(v.payload, payload, plen);
}

Test(udp_codec, encode_v4_and_v6)
{
	uint8_t buf[2048], payload[333];
	struct tu_rng r;
	size_t n;

	tu_rng_seed(&r, 1);
	tu_rand_bytes(&r, payload, sizeof(payload));
	struct udp_codec_hdr h4 = hdr("8.8.8.8", 53, "10.0.0.9", 5353, 0xabcd);
	cr_assert_eq(udp_codec_encode(&h4, payload, sizeof(payload), buf, sizeof(buf), &n), 0);
	cr_assert_eq(n, 28 + sizeof(payload));
	check_encoded(buf, n, &h4, payload, sizeof(payload));

	struct udp_codec_hdr h6 = hdr("2001:db8::53", 53, "fd00::9", 5353, 0);
	cr_assert_eq(udp_codec_encode(&h6, payload, 0, buf, sizeof(buf), &n), 0, "empty payload");
	cr_assert_eq(n, 48);
	check_encoded(buf, n, &h6, payload, 0);
	cr_assert_eq(udp_codec_encode(&h6, payload, 1, buf, sizeof(buf), &n), 0, "odd length");
	check_encoded(buf, n, &h6, payload, 1);
}

Test(udp_codec, encode_in_place_and_overlapping)
{
	uint8_t buf[512], want[200];
	struct tu_rng r;
	size_t n;

	tu_rng_seed(&r, 2);
	tu_rand_bytes(&r, want, sizeof(want));
	struct udp_codec_hdr h = hdr("fd00::1", 7, "fd00::9", 9, 0);
	/* Payload already where it belongs (what the UDP path does after recvfrom). */
	memcpy(buf + 48, want, sizeof(want));
	cr_assert_eq(udp_codec_encode(&h, buf + 48, sizeof(want), buf, sizeof(buf), &n), 0);
	check_encoded(buf, n, &h, want, sizeof(want));
	/* Payload at the start of the buffer: overlaps the headers, must be moved first. */
	memcpy(buf, want, sizeof(want));
	cr_assert_eq(udp_codec_encode(&h, buf, sizeof(want), buf, sizeof(buf), &n), 0);
	check_encoded(buf, n, &h, want, sizeof(want));
}

/* A payload whose checksum computes to 0 must carry 0xFFFF (RFC 768; mandatory for IPv6). */
static void zero_csum_case(const char *src, const char *dst)
{
	uint8_t buf[256], payload[16];
	size_t n, hl;
	struct udp_codec_hdr h = hdr(src, 1234, dst, 5678, 42);

	memset(payload, 0x5a, sizeof(payload));
	cr_assert_eq(udp_codec_encode(&h, payload, sizeof(payload), buf, sizeof(buf), &n), 0);
	hl = udp_codec_hdr_len(h.family);
	/* Steer the first payload word so the from-scratch checksum is 0, take that payload. */
	cr_assert(tu_steer_l4_csum(buf, n, 8, 0), "could not steer the checksum to 0");
	memcpy(payload, buf + hl, sizeof(payload));
	cr_assert_eq(udp_codec_encode(&h, payload, sizeof(payload), buf, sizeof(buf), &n), 0);
	cr_assert_eq(tu_l4_compute(buf, n), 0, "the case really computes to 0");
	cr_assert_eq(tu_l4_field(buf, n), 0xffff, "computed 0 is sent as 0xFFFF");
	check_encoded(buf, n, &h, payload, sizeof(payload));
}

Test(udp_codec, computed_zero_checksum_is_sent_as_ffff)
{
	zero_csum_case("1.1.1.1", "10.0.0.9");
	zero_csum_case("2001:db8::1", "fd00::9");
}

Test(udp_codec, mtu_sized_payloads_and_small_buffers)
{
	enum { MTU = 1500 };
	uint8_t buf[MTU + 64], payload[MTU];
	size_t n = 12345;

	memset(payload, 0xa5, sizeof(payload));
	struct udp_codec_hdr h4 = hdr("1.1.1.1", 53, "10.0.0.9", 5353, 1);
	struct udp_codec_hdr h6 = hdr("2001:db8::1", 53, "fd00::9", 5353, 0);
	cr_assert_eq(udp_codec_encode(&h4, payload, MTU - 28, buf, MTU, &n), 0);
	cr_assert_eq(n, MTU);
	check_encoded(buf, n, &h4, payload, MTU - 28);
	cr_assert_eq(udp_codec_encode(&h6, payload, MTU - 48, buf, MTU, &n), 0);
	cr_assert_eq(n, MTU);
	check_encoded(buf, n, &h6, payload, MTU - 48);

	/* One byte too many for the buffer: -ENOBUFS, buffer and *out_len untouched. */
	memset(buf, 0x77, sizeof(buf));
	n = 12345;
	cr_assert_eq(udp_codec_encode(&h4, payload, MTU - 27, buf, MTU, &n), -ENOBUFS);
	cr_assert_eq(udp_codec_encode(&h6, payload, MTU - 47, buf, MTU, &n), -ENOBUFS);
	cr_assert_eq(udp_codec_encode(&h6, payload, 0, buf, 47, &n), -ENOBUFS);
	cr_assert_eq(n, 12345);
	for (size_t i = 0; i < sizeof(buf); i++)
		cr_assert_eq(buf[i], 0x77, "byte %zu written on error", i);

	struct udp_codec_hdr bad = h4;
	bad.family = 5;
	cr_assert_eq(udp_codec_encode(&bad, payload, 1, buf, sizeof(buf), &n), -EINVAL);
	cr_assert_eq(udp_codec_hdr_len(5), 0);
}

Test(udp_codec, largest_datagrams)
{
	size_t cap = 48 + 65535, n;
	uint8_t *buf = malloc(cap), *payload = malloc(65536);
	cr_assert(buf && payload);
	memset(payload, 0x3c, 65536);

	struct udp_codec_hdr h4 = hdr("1.1.1.1", 53, "10.0.0.9", 5353, 1);
	struct udp_codec_hdr h6 = hdr("2001:db8::1", 53, "fd00::9", 5353, 0);
	cr_assert_eq(udp_codec_max_payload(4), 65507);
	cr_assert_eq(udp_codec_max_payload(6), 65527);
	cr_assert_eq(udp_codec_encode(&h4, payload, 65507, buf, cap, &n), 0);
	cr_assert_eq(n, 65535);
	cr_assert(tu_verify_ip4_header(buf));
	cr_assert(tu_verify_l4(buf, n));
	cr_assert_eq(udp_codec_encode(&h4, payload, 65508, buf, cap, &n), -EMSGSIZE);
	cr_assert_eq(udp_codec_encode(&h6, payload, 65527, buf, cap, &n), 0);
	cr_assert_eq(n, 48 + 65527);
	cr_assert(tu_verify_l4(buf, n));
	cr_assert_eq(udp_codec_encode(&h6, payload, 65528, buf, cap, &n), -EMSGSIZE);
	free(buf);
	free(payload);
}

/* Randomized: random valid UDP packets parse to what the builder put in; swapping the
 * endpoints and re-encoding gives a packet the reference verifier accepts. */
Test(udp_codec, random_round_trip)
{
	struct tu_rng r;
	uint8_t pkt[4096], out[4096];

	tu_rng_seed(&r, 0x75647063);
	for (int i = 0; i < 5000; i++) {
		struct tu_spec s;
		struct udp_view v;
		size_t n, m;

		tu_rand_spec(&r, &s, 0, IPPROTO_UDP, 1400);
		if (s.sport == 0 || s.dport == 0)
			continue;
		n = tu_build(&s, pkt, sizeof(pkt));
		cr_assert_eq(parse(&v, pkt, n), UDP_CODEC_OK, "iteration %d", i);
		cr_assert_eq(v.family, s.family);
		cr_assert_arr_eq(v.src, s.src, 16);
		cr_assert_arr_eq(v.dst, s.dst, 16);
		cr_assert_eq(ntohs(v.sport_be), s.sport);
		cr_assert_eq(v.payload_len, s.payload_len);

		struct udp_codec_hdr h = { .family = v.family, .sport_be = v.dport_be,
					   .dport_be = v.sport_be, .ip_id = (uint16_t)i };
		memcpy(h.src, v.dst, 16);
		memcpy(h.dst, v.src, 16);
		cr_assert_eq(udp_codec_encode(&h, v.payload, v.payload_len, out, sizeof(out), &m), 0);
		check_encoded(out, m, &h, v.payload, v.payload_len);
	}
}
