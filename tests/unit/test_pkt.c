/* test_pkt.c — core/pkt: every accepted shape, every rejection with its exact reason, every
 * prefix of valid packets, and random mutations. Each parse runs on a heap copy of exactly
 * buflen bytes so that the ASan tree catches any read past the end.
 */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "core/pkt.h"
#include "testutil.h"

/* A heap copy of exactly len bytes (ASan red zones start right after it). */
struct exact {
	uint8_t *buf;
	size_t len;
};

static uint8_t *exact_dup(struct exact *e, const uint8_t *src, size_t len)
{
	e->len = len;
	e->buf = malloc(len ? len : 1);
	cr_assert_not_null(e->buf);
	memcpy(e->buf, src, len);
	return e->buf;
}

static void exact_free(struct exact *e)
{
	free(e->buf);
	e->buf = NULL;
}

/* Reference MSS lookup over the option bytes (RFC 9293 section 3.2): EOL ends the list, NOP is one
 * byte, every other option carries a length >= 2 that must fit; malformed means "no MSS". */
static uint16_t ref_mss(const uint8_t *o, size_t n)
{
	size_t i = 0;
	while (i < n) {
		if (o[i] == 0)
			return 0;
		if (o[i] == 1) {
			i++;
			continue;
		}
		if (i + 1 >= n || o[i + 1] < 2 || i + o[i + 1] > n)
			return 0;
		if (o[i] == 2 && o[i + 1] == 4)
			return tu_get16(o + i + 2);
		i += o[i + 1];
	}
	return 0;
}

/* Invariants of any accepted packet: every pointer and length inside the buffer, and the
 * reference parser agrees on the layout. */
static void check_view(const struct pkt_view *v, const uint8_t *buf, size_t buflen)
{
	cr_assert_eq(v->ip, buf);
	cr_assert_eq(v->family, buf[0] >> 4);
	cr_assert_leq(v->len, buflen);
	cr_assert_leq(v->l3_len, v->len);
	cr_assert_eq(v->l4, v->ip + v->l3_len);
	cr_assert_eq(v->l4_len, v->len - v->l3_len);
	struct tu_layout lo;
	cr_assert(tu_layout(buf, buflen, &lo), "reference parser rejects an accepted packet");
	cr_assert_eq(lo.l3_len, v->l3_len);
	cr_assert_eq(lo.len, v->len);
	cr_assert_eq(lo.proto, v->proto);
	if (v->proto == IPPROTO_TCP) {
		cr_assert_geq(v->tcp_hlen, 20);
		cr_assert_leq(v->tcp_hlen, v->l4_len);
		cr_assert_eq(v->tcp_hlen, (v->l4[12] >> 4) * 4);
		cr_assert_eq(v->tcp_flags, v->l4[13]);
		cr_assert_eq(tu_get16((const uint8_t *)&v->sport_be), tu_get16(v->l4));
		cr_assert_eq(tu_get16((const uint8_t *)&v->dport_be), tu_get16(v->l4 + 2));
		cr_assert_leq(pkt_tcp_seglen(v), v->l4_len - v->tcp_hlen + 2);
		cr_assert_eq(pkt_tcp_mss(v), ref_mss(v->l4 + 20, v->tcp_hlen - 20u));
	} else if (v->proto == IPPROTO_UDP) {
		cr_assert_geq(v->l4_len, 8);
		uint16_t ulen = tu_get16(v->l4 + 4);
		cr_assert(ulen >= 8 && ulen <= v->l4_len);
		cr_assert_eq(tu_get16((const uint8_t *)&v->sport_be), tu_get16(v->l4));
		cr_assert_eq(tu_get16((const uint8_t *)&v->dport_be), tu_get16(v->l4 + 2));
	} else if (v->proto == IPPROTO_ICMP || v->proto == IPPROTO_ICMPV6) {
		cr_assert_geq(v->l4_len, 8);
	}
}

/* Parse a heap copy of buf[0..len); on PKT_OK check the invariants. */
static enum pkt_reason parse_copy(const uint8_t *buf, size_t len, struct pkt_view *out)
{
	struct exact e;
	struct pkt_view v;
	memset(&v, 0, sizeof(v));
	uint8_t *b = exact_dup(&e, buf, len);
	enum pkt_reason r = pkt_parse(&v, b, len);
	if (r == PKT_OK)
		check_view(&v, b, len);
	if (out) { /* rebase the pointers onto the caller's buffer */
		*out = v;
		if (r == PKT_OK) {
			out->ip = (uint8_t *)buf;
			out->l4 = (uint8_t *)buf + v.l3_len;
		}
	}
	exact_free(&e);
	return r;
}

#define assert_reason(buf, len, want)                                                           \
	do {                                                                                    \
		enum pkt_reason got_ = parse_copy((buf), (len), NULL);                            \
		cr_assert_eq(got_, (want), "got %s, want %s (line %d)", pkt_reason_name(got_),    \
			     pkt_reason_name(want), __LINE__);                                  \
	} while (0)

static uint8_t pb[TU_PKT_MAX];

/* ---- accepted shapes ---- */

Test(pkt, v4_tcp_fields)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "198.18.0.2", 40000, "10.200.1.2", 80);
	s.tcp_flags = TCP_SYN | TCP_ACK;
	s.payload_len = 13;
	size_t len = tu_build(&s, pb, sizeof(pb));
	struct pkt_view v;
	cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
	cr_assert_eq(v.family, 4);
	cr_assert_eq(v.proto, IPPROTO_TCP);
	cr_assert_eq(v.len, 20 + 20 + 13);
	cr_assert_eq(v.l3_len, 20);
	cr_assert_eq(v.l4_len, 33);
	cr_assert_eq(v.tcp_hlen, 20);
	cr_assert_eq(v.tcp_flags, TCP_SYN | TCP_ACK);
	cr_assert_eq(v.sport_be, htons(40000));
	cr_assert_eq(v.dport_be, htons(80));
	cr_assert_eq(memcmp(pkt_src(&v), s.src, 4), 0);
	cr_assert_eq(memcmp(pkt_dst(&v), s.dst, 4), 0);
	cr_assert_eq(pkt_tcp_mss(&v), 0);
	cr_assert_eq(pkt_tcp_seglen(&v), 14);
}

Test(pkt, v4_options_every_length)
{
	for (uint8_t n = 0; n <= 40; n += 4) {
		struct tu_spec s;
		tu_spec_tcp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
		s.ip4_opts_len = n;
		memset(s.ip4_opts, 1, n); /* NOPs */
		s.payload_len = 5;
		size_t len = tu_build(&s, pb, sizeof(pb));
		struct pkt_view v;
		cr_assert_eq(parse_copy(pb, len, &v), PKT_OK, "options %u", n);
		cr_assert_eq(v.l3_len, 20 + n);
		cr_assert_eq(v.l4_len, 25);
		cr_assert_eq(v.sport_be, htons(1));
	}
}

/* Every option list of up to 40 bytes drawn from the option kinds (End, NOP, Record Route,
 * Timestamp, LSRR, SSRR, and an unknown kind) with random lengths, against a dumb reference
 * walk: the parser's verdict (ok, v4_source_route, v4_bad_options) is the reference's. */
static enum pkt_reason ref_options(const uint8_t *o, size_t n)
{
	size_t i = 0;

	while (i < n) {
		if (o[i] == 0)
			return PKT_OK;
		if (o[i] == 1) {
			i++;
			continue;
		}
		if (i + 2 > n)
			return PKT_V4_BAD_OPTIONS;
		size_t len = o[i + 1];
		if (len < 2 || i + len > n)
			return PKT_V4_BAD_OPTIONS;
		if (o[i] == 131 || o[i] == 137)
			return PKT_V4_SOURCE_ROUTE;
		i += len;
	}
	return PKT_OK;
}

Test(pkt, v4_options_against_reference)
{
	static const uint8_t kinds[] = { 0, 1, 7, 68, 131, 137, 148 };
	struct tu_rng r;
	int seen[PKT_REASON_MAX] = { 0 };

	tu_rng_seed(&r, 1234);
	for (int iter = 0; iter < 20000; iter++) {
		struct tu_spec s;
		uint8_t n = (uint8_t)(4 * (1 + tu_rand_below(&r, 10)));
		tu_spec_tcp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
		for (uint8_t i = 0; i < n; i++) {
			/* Mostly option kinds with plausible lengths after them. */
			uint32_t pick = tu_rand_below(&r, 4);
			s.ip4_opts[i] = pick == 0 ? (uint8_t)tu_rand_below(&r, 256)
				      : pick == 1 ? (uint8_t)tu_rand_below(&r, 12)
						  : kinds[tu_rand_below(&r, sizeof(kinds))];
		}
		s.ip4_opts_len = n;
		size_t len = tu_build(&s, pb, sizeof(pb));
		struct pkt_view v;
		enum pkt_reason want = ref_options(s.ip4_opts, n);
		cr_assert_eq(parse_copy(pb, len, &v), want, "iteration %d", iter);
		seen[want]++;
	}
	cr_assert(seen[PKT_OK] > 100 && seen[PKT_V4_SOURCE_ROUTE] > 100 &&
		  seen[PKT_V4_BAD_OPTIONS] > 100, "every verdict drawn");
}

Test(pkt, v4_bad_options_examples)
{
	static const struct {
		uint8_t o[40];
		uint8_t n;
		enum pkt_reason want;
	} cases[] = {
		{ { 7, 7, 4 }, 8, PKT_OK },                      /* Record Route, one slot */
		{ { 68, 12, 5, 0 }, 12, PKT_OK },                /* Timestamp */
		{ { 1, 1, 131, 6, 4 }, 8, PKT_V4_SOURCE_ROUTE },
		{ { 1, 1, 131, 7, 4 }, 8, PKT_V4_BAD_OPTIONS },  /* one byte past the end */
		{ { 137, 11, 4 }, 12, PKT_V4_SOURCE_ROUTE },
		{ { 7, 41, 4 }, 40, PKT_V4_BAD_OPTIONS },        /* longer than the option space */
		{ { 1, 7, 8, 4 }, 4, PKT_V4_BAD_OPTIONS },       /* past the header's end by 5 */
		{ { 68, 1 }, 4, PKT_V4_BAD_OPTIONS },            /* length 1 */
		{ { 68, 0 }, 4, PKT_V4_BAD_OPTIONS },            /* length 0 */
		{ { 1, 1, 1, 7 }, 4, PKT_V4_BAD_OPTIONS },       /* no room for the length byte */
		{ { 0, 7, 99 }, 4, PKT_OK },                     /* after End nothing is read */
		{ { 131, 2, 0, 0 }, 4, PKT_V4_SOURCE_ROUTE },    /* even an empty route */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct tu_spec s;
		struct pkt_view v;
		tu_spec_udp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
		memcpy(s.ip4_opts, cases[i].o, sizeof(cases[i].o));
		s.ip4_opts_len = cases[i].n;
		size_t len = tu_build(&s, pb, sizeof(pb));
		cr_assert_eq(parse_copy(pb, len, &v), cases[i].want, "case %zu", i);
	}
}

/* pkt_v4_csum_ok: right for every header the builder makes (with any options), wrong after
 * any one bit of the header flips; never looks past the header. */
Test(pkt, v4_header_checksum)
{
	struct tu_rng r;

	tu_rng_seed(&r, 99);
	for (int iter = 0; iter < 2000; iter++) {
		struct tu_spec s;
		struct pkt_view v;
		tu_spec_tcp(&s, "10.0.0.1", (uint16_t)iter, "192.0.2.7", 443);
		s.ip4_opts_len = (uint8_t)(4 * tu_rand_below(&r, 11));
		memset(s.ip4_opts, 1, s.ip4_opts_len);
		s.payload_len = tu_rand_below(&r, 64);
		size_t len = tu_build(&s, pb, sizeof(pb));
		cr_assert_eq(pkt_parse(&v, pb, len), PKT_OK);
		cr_assert(pkt_v4_csum_ok(&v), "iteration %d", iter);
		pb[v.l3_len] ^= 0xff; /* the L4 header is not the IP header's business */
		cr_assert(pkt_v4_csum_ok(&v));
		pb[v.l3_len] ^= 0xff;
		uint32_t bit = tu_rand_below(&r, v.l3_len * 8u);
		pb[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		cr_assert_not(pkt_v4_csum_ok(&v), "iteration %d: bit %u", iter, bit);
	}
}

Test(pkt, v4_trailing_bytes_beyond_total_length)
{
	struct tu_spec s;
	tu_spec_udp(&s, "10.0.0.1", 53, "10.0.0.2", 5353);
	s.payload_len = 3;
	size_t len = tu_build(&s, pb, sizeof(pb));
	memset(pb + len, 0xee, 17); /* link-layer padding */
	struct pkt_view v;
	cr_assert_eq(parse_copy(pb, len + 17, &v), PKT_OK);
	cr_assert_eq(v.len, len);
	cr_assert_eq(v.l4_len, 11);
}

Test(pkt, v4_df_alone_and_reserved_bit_accepted)
{
	static const uint16_t ok[] = { 0x4000, 0x8000, 0xc000 };
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		struct tu_spec s;
		tu_spec_tcp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
		s.ip4_frag = ok[i];
		size_t len = tu_build(&s, pb, sizeof(pb));
		assert_reason(pb, len, PKT_OK);
	}
}

Test(pkt, v6_extension_chain_hbh_routing_destopts_ah)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "fd00::2", 40000, "2001:db8::1", 443);
	s.ext[0] = (struct tu_ext){ 0, 0 };   /* 8 bytes */
	s.ext[1] = (struct tu_ext){ 43, 2 };  /* 24 */
	s.ext[2] = (struct tu_ext){ 60, 1 };  /* 16 */
	s.ext[3] = (struct tu_ext){ 51, 4 };  /* (4 + 2) * 4 = 24 */
	s.ext_n = 4;
	s.mss = 1440;
	s.payload_len = 100;
	size_t len = tu_build(&s, pb, sizeof(pb));
	struct pkt_view v;
	cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
	cr_assert_eq(v.family, 6);
	cr_assert_eq(v.proto, IPPROTO_TCP);
	cr_assert_eq(v.l3_len, 40 + 8 + 24 + 16 + 24);
	cr_assert_eq(v.len, len);
	cr_assert_eq(v.l4_len, 24 + 100);
	cr_assert_eq(v.tcp_hlen, 24);
	cr_assert_eq(pkt_tcp_mss(&v), 1440);
	cr_assert_eq(v.sport_be, htons(40000));
	cr_assert_eq(memcmp(pkt_src(&v), s.src, 16), 0);
	cr_assert_eq(memcmp(pkt_dst(&v), s.dst, 16), 0);
	cr_assert(tu_verify_l4(pb, len));
}

Test(pkt, v6_ah_in_4_byte_units)
{
	/* AH lengths that are not a multiple of 8 still walk by 4-byte units. */
	for (uint8_t hl = 0; hl < 8; hl++) {
		struct tu_spec s;
		tu_spec_udp(&s, "fd00::2", 1000, "fd00::1", 53);
		s.ext[0] = (struct tu_ext){ 51, hl };
		s.ext[1] = (struct tu_ext){ 60, 0 };
		s.ext_n = 2;
		s.payload_len = 4;
		size_t len = tu_build(&s, pb, sizeof(pb));
		struct pkt_view v;
		cr_assert_eq(parse_copy(pb, len, &v), PKT_OK, "AH len %u", hl);
		cr_assert_eq(v.l3_len, 40 + (hl + 2) * 4 + 8);
		cr_assert_eq(v.proto, IPPROTO_UDP);
		cr_assert_eq(v.dport_be, htons(53));
	}
}

Test(pkt, v6_eight_ext_headers_accepted_nine_rejected)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "fd00::2", 1, "fd00::1", 2);
	for (int i = 0; i < 9; i++)
		s.ext[i] = (struct tu_ext){ 60, 0 };
	s.ext_n = 8;
	size_t len = tu_build(&s, pb, sizeof(pb));
	struct pkt_view v;
	cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
	cr_assert_eq(v.l3_len, 40 + 64);
	s.ext_n = 9;
	len = tu_build(&s, pb, sizeof(pb));
	assert_reason(pb, len, PKT_V6_EXT_TOO_MANY);
	s.ext_n = 16;
	len = tu_build(&s, pb, sizeof(pb));
	assert_reason(pb, len, PKT_V6_EXT_TOO_MANY);
}

Test(pkt, udp_icmp_icmpv6_other)
{
	struct tu_spec s;
	struct pkt_view v;
	size_t len;

	tu_spec_udp(&s, "fd00::2", 5000, "fd00::1", 53);
	s.payload_len = 30;
	len = tu_build(&s, pb, sizeof(pb));
	cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
	cr_assert_eq(v.proto, IPPROTO_UDP);
	cr_assert_eq(v.l4_len, 38);
	cr_assert_eq(v.sport_be, htons(5000));
	cr_assert_eq(v.dport_be, htons(53));

	/* UDP length shorter than the IP payload is accepted (the rest is IP padding). */
	tu_spec_udp(&s, "10.0.0.1", 5000, "10.0.0.2", 53);
	s.payload_len = 30;
	len = tu_build(&s, pb, sizeof(pb));
	tu_put16(pb + 20 + 4, 8 + 10);
	assert_reason(pb, len, PKT_OK);

	tu_spec_icmp_echo(&s, "10.0.0.1", "10.0.0.2", 7, 1);
	s.payload_len = 56;
	len = tu_build(&s, pb, sizeof(pb));
	cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
	cr_assert_eq(v.proto, IPPROTO_ICMP);
	cr_assert_eq(v.l4_len, 64);
	cr_assert(tu_verify_l4(pb, len));

	tu_spec_icmp_echo(&s, "fd00::2", "fd00::1", 7, 1);
	s.ext[0] = (struct tu_ext){ 0, 0 };
	s.ext_n = 1;
	len = tu_build(&s, pb, sizeof(pb));
	cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
	cr_assert_eq(v.proto, IPPROTO_ICMPV6);
	cr_assert_eq(v.l3_len, 48);
	cr_assert_eq(v.l4_len, 8);
	cr_assert(tu_verify_l4(pb, len));

	/* Other protocols: IP fields only, any L4 length (0 included). */
	static const uint8_t others[] = { 47, 132, 59, 17 + 100, 255 };
	for (size_t i = 0; i < sizeof(others); i++) {
		for (size_t pl = 0; pl < 3; pl++) {
			tu_spec_raw(&s, i & 1 ? "fd00::2" : "10.0.0.1", i & 1 ? "fd00::1" : "10.0.0.2",
				    others[i]);
			s.payload_len = pl;
			len = tu_build(&s, pb, sizeof(pb));
			cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
			cr_assert_eq(v.proto, others[i]);
			cr_assert_eq(v.l4_len, pl);
		}
	}
}

/* ---- TCP options and sequence length ---- */

static uint16_t mss_of(const uint8_t *opts, uint8_t n)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
	memcpy(s.tcp_opts, opts, n);
	s.tcp_opts_len = n;
	size_t len = tu_build(&s, pb, sizeof(pb));
	struct exact e;
	uint8_t *b = exact_dup(&e, pb, len);
	struct pkt_view v;
	cr_assert_eq(pkt_parse(&v, b, len), PKT_OK);
	uint16_t mss = pkt_tcp_mss(&v);
	exact_free(&e);
	return mss;
}

Test(pkt, tcp_mss_option)
{
	static const uint8_t plain[] = { 2, 4, 0x05, 0xb4 };
	cr_assert_eq(mss_of(plain, sizeof(plain)), 1460);
	static const uint8_t after_others[] = { 1, 1, 4, 2, 1, 3, 3, 7, 8, 10, 0, 0, 0, 1,
						0, 0, 0, 2, 2, 4, 0x23, 0x28 };
	cr_assert_eq(mss_of(after_others, sizeof(after_others)), 9000);
	/* MSS as the last 4 bytes of a 60-byte header. */
	uint8_t last[40];
	memset(last, 1, sizeof(last));
	memcpy(last + 36, plain, 4);
	cr_assert_eq(mss_of(last, 40), 1460);
	static const uint8_t none[] = { 1, 1, 4, 2 };
	cr_assert_eq(mss_of(none, sizeof(none)), 0);
	static const uint8_t eol_first[] = { 0, 0, 0, 0, 2, 4, 5, 0xb4 };
	cr_assert_eq(mss_of(eol_first, sizeof(eol_first)), 0);
	static const uint8_t zero_len[] = { 3, 0, 2, 4, 5, 0xb4, 0, 0 };
	cr_assert_eq(mss_of(zero_len, sizeof(zero_len)), 0);
	static const uint8_t one_len[] = { 3, 1, 2, 4, 5, 0xb4, 0, 0 };
	cr_assert_eq(mss_of(one_len, sizeof(one_len)), 0);
	static const uint8_t overrun[] = { 1, 1, 8, 10, 2, 4, 5, 0xb4 };
	cr_assert_eq(mss_of(overrun, sizeof(overrun)), 0);
	/* A kind-2 option of the wrong length is skipped, not read as MSS. */
	static const uint8_t bad_mss_len[] = { 2, 3, 9, 2, 4, 0x01, 0x00, 0 };
	cr_assert_eq(mss_of(bad_mss_len, sizeof(bad_mss_len)), 0x0100);
	/* MSS cut by the end of the header (kind and length present, value missing). */
	uint8_t cut[40];
	memset(cut, 1, sizeof(cut));
	cut[38] = 2;
	cut[39] = 4;
	cr_assert_eq(mss_of(cut, 40), 0);
	cut[39] = 2; /* a 2-byte "MSS" at the very end */
	cr_assert_eq(mss_of(cut, 40), 0);
	/* Trailing single kind byte at the end (only NOP/EOL may be 1 byte). */
	cut[38] = 1;
	cut[39] = 2;
	cr_assert_eq(mss_of(cut, 40), 0);
}

Test(pkt, tcp_mss_random_options_never_overrun)
{
	struct tu_rng r;
	tu_rng_seed(&r, 7);
	for (int it = 0; it < 20000; it++) {
		uint8_t opts[40];
		uint8_t n = (uint8_t)(4 * tu_rand_below(&r, 11));
		tu_rand_bytes(&r, opts, n);
		for (uint8_t i = 0; i < n; i++) /* bias towards meaningful kinds and lengths */
			if (tu_rand_chance(&r, 3))
				opts[i] = (uint8_t)tu_rand_below(&r, 5);
		cr_assert_eq(mss_of(opts, n), ref_mss(opts, n), "iteration %d", it);
	}
}

Test(pkt, tcp_seglen)
{
	static const struct {
		uint8_t flags;
		size_t payload;
		uint32_t want;
	} cases[] = {
		{ TCP_ACK, 0, 0 },           { TCP_SYN, 0, 1 },       { TCP_SYN | TCP_ACK, 0, 1 },
		{ TCP_FIN | TCP_ACK, 0, 1 }, { TCP_SYN | TCP_FIN, 0, 2 }, { TCP_ACK | TCP_PSH, 100, 100 },
		{ TCP_FIN | TCP_ACK, 7, 8 }, { TCP_RST, 0, 0 },       { TCP_SYN | TCP_FIN, 1, 3 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		for (int fam = 4; fam <= 6; fam += 2) {
			struct tu_spec s;
			tu_spec_tcp(&s, fam == 4 ? "10.0.0.1" : "fd00::1", 1, fam == 4 ? "10.0.0.2" : "fd00::2", 2);
			s.tcp_flags = cases[i].flags;
			s.payload_len = cases[i].payload;
			s.mss = 1400; /* options must not count as payload */
			s.tcp_opts[0] = 1;
			s.tcp_opts[1] = 3;
			s.tcp_opts[2] = 3;
			s.tcp_opts[3] = 7;
			s.tcp_opts_len = 4;
			size_t len = tu_build(&s, pb, sizeof(pb));
			struct pkt_view v;
			cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
			cr_assert_eq(pkt_tcp_seglen(&v), cases[i].want, "case %zu v%d", i, fam);
		}
	}
}

/* ---- flow keys and reason names ---- */

Test(pkt, flow_key_v4_and_v6)
{
	struct tu_spec s;
	struct pkt_view v;
	struct flow_key k;
	size_t len;

	tu_spec_tcp(&s, "198.18.0.2", 40000, "10.200.1.2", 80);
	len = tu_build(&s, pb, sizeof(pb));
	cr_assert_eq(pkt_parse(&v, pb, len), PKT_OK);
	memset(&k, 0xaa, sizeof(k));
	pkt_flow_key(&v, &k);
	cr_assert_eq(k.family, 4);
	cr_assert_eq(k.proto, IPPROTO_TCP);
	cr_assert_eq(k.sport_be, htons(40000));
	cr_assert_eq(k.dport_be, htons(80));
	cr_assert_eq(k.zero, 0);
	cr_assert_eq(memcmp(k.src, s.src, 4), 0);
	cr_assert_eq(memcmp(k.dst, s.dst, 4), 0);
	for (int i = 4; i < 16; i++)
		cr_assert(k.src[i] == 0 && k.dst[i] == 0, "byte %d of a v4 key must be zero", i);
	/* The same flow parsed twice gives equal keys however the key was filled before. */
	struct flow_key k2;
	memset(&k2, 0x55, sizeof(k2));
	pkt_flow_key(&v, &k2);
	cr_assert(flow_key_eq(&k, &k2));

	tu_spec_udp(&s, "fd00::2", 5353, "2001:db8::53", 53);
	len = tu_build(&s, pb, sizeof(pb));
	cr_assert_eq(pkt_parse(&v, pb, len), PKT_OK);
	memset(&k, 0xaa, sizeof(k));
	pkt_flow_key(&v, &k);
	cr_assert_eq(k.family, 6);
	cr_assert_eq(k.proto, IPPROTO_UDP);
	cr_assert_eq(k.sport_be, htons(5353));
	cr_assert_eq(k.dport_be, htons(53));
	cr_assert_eq(k.zero, 0);
	cr_assert_eq(memcmp(k.src, s.src, 16), 0);
	cr_assert_eq(memcmp(k.dst, s.dst, 16), 0);
	/* Direction matters: the reversed flow is a different key. */
	struct tu_spec rs;
	tu_spec_udp(&rs, "2001:db8::53", 53, "fd00::2", 5353);
	len = tu_build(&rs, pb, sizeof(pb));
	cr_assert_eq(pkt_parse(&v, pb, len), PKT_OK);
	pkt_flow_key(&v, &k2);
	cr_assert(!flow_key_eq(&k, &k2));
}

Test(pkt, reason_names)
{
	static const char *const want[] = {
		[PKT_OK] = "ok",
		[PKT_EMPTY] = "empty",
		[PKT_BAD_VERSION] = "bad_version",
		[PKT_V4_TRUNCATED] = "v4_truncated",
		[PKT_V4_BAD_IHL] = "v4_bad_ihl",
		[PKT_V4_BAD_TOTLEN] = "v4_bad_total_length",
		[PKT_V4_FRAGMENT] = "v4_fragment",
		[PKT_V4_SOURCE_ROUTE] = "v4_source_route",
		[PKT_V4_BAD_OPTIONS] = "v4_bad_options",
		[PKT_V4_BAD_CSUM] = "v4_bad_checksum",
		[PKT_V6_TRUNCATED] = "v6_truncated",
		[PKT_V6_BAD_PAYLEN] = "v6_bad_payload_length",
		[PKT_V6_EXT_TRUNCATED] = "v6_ext_truncated",
		[PKT_V6_EXT_TOO_MANY] = "v6_ext_too_many",
		[PKT_V6_FRAGMENT] = "v6_fragment",
		[PKT_V6_ESP] = "v6_esp",
		[PKT_V6_ROUTING] = "v6_routing_segments_left",
		[PKT_TCP_TRUNCATED] = "tcp_truncated",
		[PKT_TCP_BAD_DOFF] = "tcp_bad_data_offset",
		[PKT_UDP_TRUNCATED] = "udp_truncated",
		[PKT_UDP_BAD_LEN] = "udp_bad_length",
		[PKT_ICMP_TRUNCATED] = "icmp_truncated",
	};
	cr_assert_eq((int)(sizeof(want) / sizeof(want[0])), PKT_REASON_MAX);
	for (int r = 0; r < PKT_REASON_MAX; r++) {
		cr_assert_not_null(want[r]);
		cr_assert_str_eq(pkt_reason_name((enum pkt_reason)r), want[r]);
		for (int q = 0; q < r; q++)
			cr_assert_str_neq(pkt_reason_name((enum pkt_reason)r),
					  pkt_reason_name((enum pkt_reason)q));
	}
	cr_assert_str_eq(pkt_reason_name(PKT_REASON_MAX), "unknown");
	cr_assert_str_eq(pkt_reason_name((enum pkt_reason)-1), "unknown");
	cr_assert_str_eq(pkt_reason_name((enum pkt_reason)1000), "unknown");
}

/* ---- rejections ---- */

Test(pkt, empty_and_bad_version)
{
	assert_reason(pb, 0, PKT_EMPTY);
	for (int ver = 0; ver < 16; ver++) {
		if (ver == 4 || ver == 6)
			continue;
		memset(pb, 0, 64);
		pb[0] = (uint8_t)(ver << 4 | 5);
		assert_reason(pb, 1, PKT_BAD_VERSION);
		assert_reason(pb, 64, PKT_BAD_VERSION);
	}
}

Test(pkt, v4_bad_ihl_and_total_length)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
	s.payload_len = 20;
	size_t len = tu_build(&s, pb, sizeof(pb)); /* 60 bytes */
	for (int ihl = 0; ihl < 5; ihl++) {
		pb[0] = (uint8_t)(0x40 | ihl);
		assert_reason(pb, len, PKT_V4_BAD_IHL);
	}
	/* IHL beyond the buffer. */
	pb[0] = 0x4f;
	assert_reason(pb, 59, PKT_V4_BAD_IHL);
	tu_put16(pb + 2, 59);
	assert_reason(pb, 59, PKT_V4_BAD_IHL);
	/* IHL inside the buffer but beyond the total length. */
	tu_put16(pb + 2, 40);
	assert_reason(pb, len, PKT_V4_BAD_TOTLEN);
	pb[0] = 0x45;
	/* Total length beyond the buffer, and below the header length. */
	for (uint32_t tot = 61; tot < 70; tot++) {
		tu_put16(pb + 2, (uint16_t)tot);
		assert_reason(pb, len, PKT_V4_BAD_TOTLEN);
	}
	tu_put16(pb + 2, 0xffff);
	assert_reason(pb, len, PKT_V4_BAD_TOTLEN);
	for (uint32_t tot = 0; tot < 20; tot++) {
		tu_put16(pb + 2, (uint16_t)tot);
		assert_reason(pb, len, PKT_V4_BAD_TOTLEN);
	}
	pb[0] = 0x46; /* 24-byte header, total length 20..23 */
	for (uint32_t tot = 20; tot < 24; tot++) {
		tu_put16(pb + 2, (uint16_t)tot);
		assert_reason(pb, len, PKT_V4_BAD_TOTLEN);
	}
	/* Header only, no L4 bytes: the L4 check rejects it. */
	pb[0] = 0x45;
	tu_put16(pb + 2, 20);
	assert_reason(pb, len, PKT_TCP_TRUNCATED);
}

Test(pkt, v4_fragments)
{
	static const uint16_t frag[] = { 0x2000, 0x0001, 0x2001, 0x1fff, 0x3fff,
					 0x6000, 0x4001, 0x6001, 0x0100, 0xa000 };
	for (size_t i = 0; i < sizeof(frag) / sizeof(frag[0]); i++) {
		for (int udp = 0; udp < 2; udp++) {
			struct tu_spec s;
			if (!udp)
				tu_spec_tcp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
			else
				tu_spec_udp(&s, "10.0.0.1", 1, "10.0.0.2", 2);
			s.ip4_frag = frag[i];
			size_t len = tu_build(&s, pb, sizeof(pb));
			assert_reason(pb, len, PKT_V4_FRAGMENT);
		}
	}
}

Test(pkt, v6_bad_payload_length)
{
	struct tu_spec s;
	tu_spec_tcp(&s, "fd00::1", 1, "fd00::2", 2);
	s.payload_len = 10;
	size_t len = tu_build(&s, pb, sizeof(pb)); /* payload length 30 */
	for (uint32_t pl = 31; pl < 40; pl++) {
		tu_put16(pb + 4, (uint16_t)pl);
		assert_reason(pb, len, PKT_V6_BAD_PAYLEN);
	}
	tu_put16(pb + 4, 0xffff);
	assert_reason(pb, len, PKT_V6_BAD_PAYLEN);
	/* Payload length 0 (a jumbogram without its option): nothing for TCP. */
	tu_put16(pb + 4, 0);
	assert_reason(pb, len, PKT_TCP_TRUNCATED);
}

Test(pkt, v6_fragment_and_esp_anywhere_in_chain)
{
	static const uint8_t before[][4] = { { 0 }, { 1, 0 }, { 2, 0, 60 }, { 3, 0, 43, 51 } };
	for (size_t b = 0; b < sizeof(before) / sizeof(before[0]); b++) {
		for (int kind = 0; kind < 2; kind++) {
			struct tu_spec s;
			tu_spec_tcp(&s, "fd00::1", 1, "fd00::2", 2);
			uint8_t n = before[b][0];
			for (uint8_t i = 0; i < n; i++)
				s.ext[i] = (struct tu_ext){ before[b][1 + i], 1 };
			s.ext[n] = (struct tu_ext){ kind ? 50 : 44, 0 };
			s.ext_n = (uint8_t)(n + 1);
			s.payload_len = 32;
			size_t len = tu_build(&s, pb, sizeof(pb));
			assert_reason(pb, len, kind ? PKT_V6_ESP : PKT_V6_FRAGMENT);
		}
	}
	/* A Fragment header after 8 others is still reported as a fragment. */
	struct tu_spec s;
	tu_spec_udp(&s, "fd00::1", 1, "fd00::2", 2);
	for (int i = 0; i < 8; i++)
		s.ext[i] = (struct tu_ext){ 60, 0 };
	s.ext[8] = (struct tu_ext){ 44, 0 };
	s.ext_n = 9;
	size_t len = tu_build(&s, pb, sizeof(pb));
	assert_reason(pb, len, PKT_V6_FRAGMENT);
}

Test(pkt, v6_ext_lengths_that_overrun)
{
	static const uint8_t kinds[] = { 0, 43, 60, 51 };
	for (size_t k = 0; k < sizeof(kinds); k++) {
		struct tu_spec s;
		tu_spec_tcp(&s, "fd00::1", 1, "fd00::2", 2);
		s.ext[0] = (struct tu_ext){ 60, 0 };
		s.ext[1] = (struct tu_ext){ kinds[k], 1 };
		s.ext_n = 2;
		s.payload_len = 16;
		size_t len = tu_build(&s, pb, sizeof(pb));
		assert_reason(pb, len, PKT_OK);
		/* Grow the second header's length: once it ends past the packet it overruns; while
		 * it ends with fewer than 20 bytes left, the TCP header is what is missing. */
		for (uint32_t hl = 2; hl < 256; hl++) {
			size_t end = 48 + (kinds[k] == 51 ? (hl + 2) * 4 : (hl + 1) * 8);
			pb[48 + 1] = (uint8_t)hl;
			if (end > len)
				assert_reason(pb, len, PKT_V6_EXT_TRUNCATED);
			else if (len - end < 20)
				assert_reason(pb, len, PKT_TCP_TRUNCATED);
		}
		/* And the same overrun on the first header. */
		pb[40 + 1] = 0xff;
		assert_reason(pb, len, PKT_V6_EXT_TRUNCATED);
	}
}

Test(pkt, tcp_data_offset)
{
	for (int fam = 4; fam <= 6; fam += 2) {
		struct tu_spec s;
		tu_spec_tcp(&s, fam == 4 ? "10.0.0.1" : "fd00::1", 1, fam == 4 ? "10.0.0.2" : "fd00::2", 2);
		s.payload_len = 19; /* 39 L4 bytes */
		size_t len = tu_build(&s, pb, sizeof(pb));
		size_t l4 = fam == 4 ? 20 : 40;
		for (int doff = 0; doff < 16; doff++) {
			pb[l4 + 12] = (uint8_t)(doff << 4 | (pb[l4 + 12] & 0x0f));
			enum pkt_reason want = doff < 5 || doff * 4 > 39 ? PKT_TCP_BAD_DOFF : PKT_OK;
			assert_reason(pb, len, want);
		}
		/* Data offset exactly the segment: a header-only segment. */
		s.payload_len = 0;
		s.mss = 1200;
		len = tu_build(&s, pb, sizeof(pb));
		struct pkt_view v;
		cr_assert_eq(parse_copy(pb, len, &v), PKT_OK);
		cr_assert_eq(v.tcp_hlen, v.l4_len);
		cr_assert_eq(pkt_tcp_seglen(&v), 0);
		cr_assert_eq(pkt_tcp_mss(&v), 1200);
	}
}

Test(pkt, udp_length)
{
	for (int fam = 4; fam <= 6; fam += 2) {
		struct tu_spec s;
		tu_spec_udp(&s, fam == 4 ? "10.0.0.1" : "fd00::1", 1, fam == 4 ? "10.0.0.2" : "fd00::2", 2);
		s.payload_len = 12; /* 20 L4 bytes */
		size_t len = tu_build(&s, pb, sizeof(pb));
		size_t l4 = fam == 4 ? 20 : 40;
		for (uint32_t ulen = 0; ulen < 40; ulen++) {
			tu_put16(pb + l4 + 4, (uint16_t)ulen);
			assert_reason(pb, len, ulen < 8 || ulen > 20 ? PKT_UDP_BAD_LEN : PKT_OK);
		}
		tu_put16(pb + l4 + 4, 0xffff);
		assert_reason(pb, len, PKT_UDP_BAD_LEN);
	}
}

Test(pkt, icmp_short)
{
	for (int fam = 4; fam <= 6; fam += 2) {
		struct tu_spec s;
		tu_spec_icmp_echo(&s, fam == 4 ? "10.0.0.1" : "fd00::1", fam == 4 ? "10.0.0.2" : "fd00::2", 1, 1);
		size_t full = tu_build(&s, pb, sizeof(pb));
		size_t l3 = fam == 4 ? 20 : 40;
		for (size_t n = 0; n <= 8; n++) {
			size_t len = tu_build(&s, pb, sizeof(pb));
			cr_assert_eq(len, full);
			if (fam == 4) {
				tu_put16(pb + 2, (uint16_t)(l3 + n));
				tu_fix_ip4_header(pb);
			} else {
				tu_put16(pb + 4, (uint16_t)n);
			}
			assert_reason(pb, l3 + n, n < 8 ? PKT_ICMP_TRUNCATED : PKT_OK);
			assert_reason(pb, full, n < 8 ? PKT_ICMP_TRUNCATED : PKT_OK);
		}
	}
}

/* ---- truncation at every byte ---- */

/* The shapes every truncation test runs over. */
static size_t shape(int i, uint8_t *buf, size_t cap)
{
	struct tu_spec s;
	switch (i) {
	case 0:
		tu_spec_tcp(&s, "198.18.0.2", 40000, "10.200.1.2", 80);
		s.mss = 1460;
		s.tcp_opts[0] = 1;
		s.tcp_opts[1] = 3;
		s.tcp_opts[2] = 3;
		s.tcp_opts[3] = 7;
		s.tcp_opts[4] = 4;
		s.tcp_opts[5] = 2;
		s.tcp_opts_len = 6;
		s.payload_len = 9;
		break;
	case 1:
		tu_spec_udp(&s, "198.18.0.2", 5353, "10.200.1.2", 53);
		s.ip4_opts_len = 8;
		memset(s.ip4_opts, 1, 8);
		s.payload_len = 11;
		break;
	case 2:
		tu_spec_icmp_echo(&s, "198.18.0.2", "198.18.0.1", 1, 2);
		s.payload_len = 4;
		break;
	case 3:
		tu_spec_raw(&s, "198.18.0.2", "198.18.0.1", 47);
		s.payload_len = 6;
		break;
	case 4:
		tu_spec_tcp(&s, "fd00::2", 40000, "2001:db8::1", 443);
		s.ext[0] = (struct tu_ext){ 0, 0 };
		s.ext[1] = (struct tu_ext){ 43, 1 };
		s.ext[2] = (struct tu_ext){ 60, 0 };
		s.ext[3] = (struct tu_ext){ 51, 1 };
		s.ext_n = 4;
		s.mss = 1440;
		s.payload_len = 5;
		break;
	case 5:
		tu_spec_udp(&s, "fd00::2", 5353, "fd00::1", 53);
		s.ext[0] = (struct tu_ext){ 51, 0 };
		s.ext_n = 1;
		s.payload_len = 7;
		break;
	case 6:
		tu_spec_icmp_echo(&s, "fd00::2", "fd00::1", 1, 2);
		s.payload_len = 3;
		break;
	default:
		tu_spec_raw(&s, "fd00::2", "fd00::1", 59);
		s.ext[0] = (struct tu_ext){ 60, 2 };
		s.ext_n = 1;
		s.payload_len = 4;
		break;
	}
	return tu_build(&s, buf, cap);
}

enum { SHAPES = 8 };

/* Raw prefixes: the IP length field still claims the whole packet, so every proper prefix is
 * rejected, by the first check its length fails. */
Test(pkt, truncated_prefix_every_byte)
{
	for (int i = 0; i < SHAPES; i++) {
		size_t len = shape(i, pb, sizeof(pb));
		struct tu_layout lo;
		cr_assert(tu_layout(pb, len, &lo));
		assert_reason(pb, len, PKT_OK);
		for (size_t cut = 0; cut < len; cut++) {
			enum pkt_reason want;
			if (cut == 0)
				want = PKT_EMPTY;
			else if (lo.family == 4)
				want = cut < 20 ? PKT_V4_TRUNCATED
				     : cut < (size_t)(pb[0] & 15) * 4 ? PKT_V4_BAD_IHL
				     : PKT_V4_BAD_TOTLEN;
			else
				want = cut < 40 ? PKT_V6_TRUNCATED : PKT_V6_BAD_PAYLEN;
			enum pkt_reason got = parse_copy(pb, cut, NULL);
			cr_assert_eq(got, want, "shape %d cut %zu: got %s want %s", i, cut,
				     pkt_reason_name(got), pkt_reason_name(want));
		}
	}
}

/* The reason a packet cut to `cut` bytes WITH its IP length field rewritten to match must get:
 * each header checked in turn, as a valid shorter packet "by its own headers" is accepted. */
static enum pkt_reason expect_consistent_cut(const uint8_t *full, size_t cut)
{
	struct tu_layout lo;
	cr_assert(tu_layout(full, TU_PKT_MAX, &lo));
	size_t off = lo.family == 4 ? (size_t)(full[0] & 15) * 4 : 40;
	if (lo.family == 6) {
		uint8_t nh = full[6];
		while (nh == 0 || nh == 43 || nh == 60 || nh == 51) {
			size_t n = nh == 51 ? ((size_t)full[off + 1] + 2) * 4 : ((size_t)full[off + 1] + 1) * 8;
			if (cut < off + 8 || cut < off + n)
				return PKT_V6_EXT_TRUNCATED;
			nh = full[off];
			off += n;
		}
	}
	size_t n = cut - off;
	const uint8_t *l4 = full + off;
	switch (lo.proto) {
	case IPPROTO_TCP:
		return n < 20 ? PKT_TCP_TRUNCATED : n < (size_t)(l4[12] >> 4) * 4 ? PKT_TCP_BAD_DOFF : PKT_OK;
	case IPPROTO_UDP:
		return n < 8 ? PKT_UDP_TRUNCATED : n < tu_get16(l4 + 4) ? PKT_UDP_BAD_LEN : PKT_OK;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		return n < 8 ? PKT_ICMP_TRUNCATED : PKT_OK;
	default:
		return PKT_OK;
	}
}

Test(pkt, truncated_consistently_at_every_byte)
{
	static uint8_t full[TU_PKT_MAX], cutbuf[TU_PKT_MAX];
	for (int i = 0; i < SHAPES; i++) {
		size_t len = shape(i, full, sizeof(full));
		size_t min = full[0] >> 4 == 4 ? (size_t)(full[0] & 15) * 4 : 40;
		for (size_t cut = min; cut <= len; cut++) {
			memcpy(cutbuf, full, cut);
			if (full[0] >> 4 == 4) {
				tu_put16(cutbuf + 2, (uint16_t)cut);
				tu_fix_ip4_header(cutbuf);
			} else {
				tu_put16(cutbuf + 4, (uint16_t)(cut - 40));
			}
			enum pkt_reason want = expect_consistent_cut(full, cut);
			struct pkt_view v;
			enum pkt_reason got = parse_copy(cutbuf, cut, &v);
			cr_assert_eq(got, want, "shape %d cut %zu: got %s want %s", i, cut,
				     pkt_reason_name(got), pkt_reason_name(want));
			if (got == PKT_OK) {
				cr_assert_eq(v.len, cut);
				cr_assert_eq(v.l4_len, cut - v.l3_len);
			}
			/* The same cut inside a larger buffer gives the same answer. */
			memset(cutbuf + cut, 0x5a, 64);
			cr_assert_eq(parse_copy(cutbuf, cut + 64, NULL), want);
		}
	}
}

/* Every prefix of random valid packets: rejected, or (whole) accepted; never out of bounds. */
Test(pkt, random_packets_every_prefix)
{
	struct tu_rng r;
	tu_rng_seed(&r, 8);
	for (int it = 0; it < 300; it++) {
		size_t len = tu_rand_packet(&r, pb, sizeof(pb), 0, 0, 64);
		assert_reason(pb, len, PKT_OK);
		for (size_t cut = 0; cut < len; cut++)
			cr_assert_neq(parse_copy(pb, cut, NULL), PKT_OK, "iteration %d cut %zu", it, cut);
	}
}

/* ---- robustness ---- */

Test(pkt, random_mutations_stay_in_bounds)
{
	struct tu_rng r;
	tu_rng_seed(&r, 9);
	unsigned hits[PKT_REASON_MAX] = { 0 };
	for (int it = 0; it < 60000; it++) {
		struct tu_spec s;
		tu_rand_spec(&r, &s, 0, 0, 48);
		if (s.family == 6 && tu_rand_chance(&r, 4)) { /* also chains the builder rejects */
			static const uint8_t k[] = { 0, 43, 60, 51, 44, 50 };
			s.ext_n = (uint8_t)tu_rand_range(&r, 1, TU_EXT_MAX);
			for (int i = 0; i < s.ext_n; i++)
				s.ext[i] = (struct tu_ext){ k[tu_rand_below(&r, 6)], (uint8_t)tu_rand_below(&r, 3) };
		}
		if (s.family == 4 && tu_rand_chance(&r, 8)) { /* option lists, well-formed or not */
			static const uint8_t k[] = { 0, 1, 1, 7, 68, 131, 137 };
			s.ip4_opts_len = (uint8_t)(4 * tu_rand_range(&r, 1, 10));
			for (int i = 0; i < s.ip4_opts_len; i++)
				s.ip4_opts[i] = i % 2 ? (uint8_t)tu_rand_below(&r, 12) : k[tu_rand_below(&r, 7)];
		}
		size_t len = tu_build(&s, pb, sizeof(pb));
		tu_mutate(&r, pb, len, tu_rand_range(&r, 1, 6));
		size_t plen = len;
		if (tu_rand_chance(&r, 4))
			plen = tu_rand_below(&r, (uint32_t)len + 1);
		else if (tu_rand_chance(&r, 8))
			plen = len + tu_rand_below(&r, 16); /* trailing garbage */
		if (plen > len)
			tu_rand_bytes(&r, pb + len, plen - len);
		enum pkt_reason got = parse_copy(pb, plen, NULL); /* checks invariants on OK */
		cr_assert_lt((unsigned)got, PKT_REASON_MAX);
		hits[got]++;
	}
	/* Pure random bytes with a v4/v6 version nibble. */
	for (int it = 0; it < 20000; it++) {
		size_t plen = tu_rand_below(&r, 120);
		tu_rand_bytes(&r, pb, plen);
		if (plen)
			pb[0] = (uint8_t)((tu_rand_chance(&r, 2) ? 0x40 : 0x60) | (pb[0] & 0x0f));
		enum pkt_reason got = parse_copy(pb, plen, NULL);
		hits[got]++;
	}
	/* The loop must have reached every outcome, or it is not exploring enough (the header
	 * checksum is pkt_v4_csum_ok's, never the parser's). */
	cr_assert_eq(hits[PKT_V4_BAD_CSUM], 0);
	for (int i = 0; i < PKT_REASON_MAX; i++)
		if (i != PKT_V4_BAD_CSUM)
			cr_assert_gt(hits[i], 0, "no mutation produced %s", pkt_reason_name((enum pkt_reason)i));
}
