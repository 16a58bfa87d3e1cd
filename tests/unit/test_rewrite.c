/* test_rewrite.c — stacks/common/rewrite: the incremental checksum of an IPv6 TCP rewrite at
 * the edge of its 64-bit accumulator. rewrite_tcp6 sums the old and new addresses as 64-bit
 * words with end-around carry; an app chooses its destination address, so it can make that
 * sum land anywhere, up to 2^64 - 1. The checksum written must verify whatever it is.
 * And the ICMP port unreachable built in a SYN's place: its headers and checksums (verified
 * from scratch), what it quotes (IP options and extension headers, the TCP header, never the
 * payload), and the room it stays within (buffers allocated to the byte).
 */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/csum.h"
#include "core/pkt.h"
#include "stacks/common/rewrite.h"
#include "testutil.h"

typedef unsigned __int128 u128;
static const uint64_t M = UINT64_MAX; /* one's complement arithmetic on 64 bits is mod 2^64 - 1 */

static uint64_t word(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

/* A tiny deterministic generator: the cases repeat exactly. */
static uint32_t next(uint32_t *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

/* The TCP checksum over the whole segment and pseudo-header verifies. */
static bool tcp6_ok(const uint8_t *ip, size_t len)
{
	uint64_t s = csum_pseudo6(ip + 8, ip + 24, IPPROTO_TCP, (uint32_t)(len - 40));

	return csum_fold(csum_partial(ip + 40, len - 40, s)) == 0xffff;
}

static void fill_checksum(uint8_t *ip, size_t len)
{
	uint64_t s = csum_pseudo6(ip + 8, ip + 24, IPPROTO_TCP, (uint32_t)(len - 40));

	csum_store16(ip + 40 + 16, 0);
	csum_store16(ip + 40 + 16, (uint16_t)~csum_fold(csum_partial(ip + 40, len - 40, s)));
}

/* A segment (IPv6, TCP, 8 payload bytes) whose old destination's last word is chosen so that
 * the rewrite's accumulator is 2^64 - 1 - d (mod 2^64 - 1), then rewritten to nsrc:sp ->
 * ndst:dp. */
static void case_at(uint32_t *seed, unsigned d)
{
	uint8_t pkt[40 + 20 + 8], nsrc[16], ndst[16], *tcp = pkt + 40;
	uint16_t sp = (uint16_t)next(seed), dp = (uint16_t)next(seed), ports[2] = { sp, dp };
	uint32_t op, np;
	struct pkt_view v;
	u128 t, base;
	uint64_t o3;

	memset(pkt, 0, sizeof(pkt));
	pkt[0] = 0x60;
	pkt[5] = 28;  /* payload length */
	pkt[6] = IPPROTO_TCP;
	pkt[7] = 64;
	for (int i = 8; i < 40; i++)
		pkt[i] = (uint8_t)next(seed);
	for (int i = 0; i < 16; i++)
		nsrc[i] = (uint8_t)next(seed), ndst[i] = (uint8_t)next(seed);
	for (int i = 0; i < 28; i++)
		tcp[i] = (uint8_t)next(seed);
	tcp[12] = 0x50; /* data offset 5 */
	tcp[13] = 0x18; /* PSH ACK */
	memcpy(&op, tcp, 4);
	memcpy(&np, ports, 4);
	/* acc = ~(o0 + o1 + o2 + o3) + (~op + np) + n0 + n1 + n2 + n3, all mod 2^64 - 1: with
	 * T the new part, acc = M - d needs o0 + o1 + o2 + o3 = T + d. */
	t = ((u128)(uint32_t)~op + np + word(nsrc) + word(nsrc + 8) + word(ndst) + word(ndst + 8)) % M;
	base = ((u128)word(pkt + 8) + word(pkt + 16) + word(pkt + 24)) % M;
	o3 = (uint64_t)((t + d + M - base) % M);
	memcpy(pkt + 32, &o3, 8);
	fill_checksum(pkt, sizeof(pkt));
	cr_assert(tcp6_ok(pkt, sizeof(pkt)));
	cr_assert_eq(pkt_parse(&v, pkt, sizeof(pkt)), PKT_OK);
	rewrite_l4(&v, nsrc, sp, ndst, dp, false);
	cr_assert(tcp6_ok(pkt, sizeof(pkt)), "d %u: the rewritten checksum does not verify", d);
	cr_assert_eq(memcmp(pkt + 8, nsrc, 16), 0);
	cr_assert_eq(memcmp(pkt + 24, ndst, 16), 0);
}

Test(rewrite, ipv6_tcp_checksum_at_the_top_of_the_accumulator)
{
	uint32_t seed = 1;

	for (int i = 0; i < 500; i++)
		for (unsigned d = 0; d < 4; d++)
			case_at(&seed, d);
}

Test(rewrite, ipv6_tcp_checksum_anywhere)
{
	uint32_t seed = 7;

	for (int i = 0; i < 2000; i++)
		case_at(&seed, next(&seed));
}

/* A SYN from src:40000 to dst:80 with the MSS option and tcp_opts bytes of NOPs after it,
 * payload bytes of data (a Fast Open SYN carries some), in a buffer of exactly
 * max(length, REWRITE_ANSWER_ROOM) bytes (*room), so a write past the room is caught by a
 * sanitizer build. ip4_opts (IPv4) or ext (IPv6, n_ext headers) as given. */
static uint8_t *syn_in_room(const char *src, const char *dst, size_t tcp_opts, size_t payload,
			    const struct tu_ext *ext, uint8_t n_ext, bool ip4_opts, size_t *len,
			    size_t *room)
{
	static uint8_t tmp[TU_PKT_MAX];
	struct tu_spec s;

	tu_spec_tcp(&s, src, 40000, dst, 80);
	s.tcp_flags = TCP_SYN;
	s.seq = 0xa1b2c3d4u;
	s.ack = 0;
	s.mss = 1460;
	memset(s.tcp_opts, 1, tcp_opts);
	s.tcp_opts_len = (uint8_t)tcp_opts;
	s.payload_len = payload;
	for (uint8_t i = 0; i < n_ext; i++)
		s.ext[i] = ext[i];
	s.ext_n = n_ext;
	if (ip4_opts) {
		memset(s.ip4_opts, 1, 8); /* NOPs */
		s.ip4_opts_len = 8;
	}
	*len = tu_build(&s, tmp, sizeof(tmp));
	*room = *len > REWRITE_ANSWER_ROOM ? *len : REWRITE_ANSWER_ROOM;
	uint8_t *buf = malloc(*room);
	cr_assert_not_null(buf);
	memset(buf, 0xee, *room);
	memcpy(buf, tmp, *len);
	return buf;
}

/* The answer in buf (n bytes) is an ICMP(v6) port unreachable from src to the SYN's source
 * (the SYN's bytes in syn), checksums right, quoting syn's first quote bytes. */
static void check_unreach(const uint8_t *buf, size_t n, const uint8_t *syn, const char *src,
			  size_t quote)
{
	uint8_t a[16];
	int fam = tu_addr(a, src);
	size_t hl = fam == 4 ? 20 : 40, alen = fam == 4 ? 4 : 16;
	struct tu_layout lo;

	cr_assert_eq(n, hl + 8 + quote, "length %zu, want %zu", n, hl + 8 + quote);
	cr_assert(tu_layout(buf, n, &lo));
	cr_assert_eq(lo.len, n, "the IP length field");
	cr_assert_eq(lo.proto, fam == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6);
	cr_assert_eq(lo.l3_len, hl, "no options, no extension headers of its own");
	if (fam == 4) {
		cr_assert(tu_verify_ip4_header(buf), "IPv4 header checksum");
		cr_assert_eq(buf[8], 64, "TTL");
		cr_assert_arr_eq(buf + 12, a, 4, "from src");
		cr_assert_arr_eq(buf + 16, syn + 12, 4, "to the SYN's source");
		cr_assert_eq(buf[hl], 3, "destination unreachable");
		cr_assert_eq(buf[hl + 1], 3, "port unreachable");
	} else {
		cr_assert_eq(buf[7], 64, "hop limit");
		cr_assert_arr_eq(buf + 8, a, alen, "from src");
		cr_assert_arr_eq(buf + 24, syn + 8, 16, "to the SYN's source");
		cr_assert_eq(buf[hl], 1, "destination unreachable");
		cr_assert_eq(buf[hl + 1], 4, "port unreachable");
	}
	cr_assert(tu_verify_l4(buf, n), "ICMP checksum");
	cr_assert_eq(tu_get32(buf + hl + 4), 0, "the unused word");
	cr_assert_arr_eq(buf + hl + 8, syn, quote, "the quote");
}

/* IPv4 with options, TCP options, a payload: the quote is the IP header with its options and
 * the TCP header with its options, and stops before the payload. */
Test(rewrite, icmp_unreach_v4_quotes_the_headers)
{
	size_t len, room, n;
	uint8_t *buf = syn_in_room("198.18.0.1", "127.1.2.3", 12, 100, NULL, 0, true, &len, &room);
	uint8_t *syn = malloc(len);
	struct pkt_view v;

	memcpy(syn, buf, len);
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	cr_assert_eq(v.l3_len, 28);
	cr_assert_eq(v.tcp_hlen, 36);
	uint8_t src[16];
	tu_addr(src, "198.18.0.2");
	n = rewrite_icmp_unreach(&v, src);
	check_unreach(buf, n, syn, "198.18.0.2", 28 + 36);
	free(syn);
	free(buf);
}

/* IPv6 with a Hop-by-Hop and a Destination Options header: both quoted with the TCP header
 * (the receiver walks them to find the TCP header). */
Test(rewrite, icmp_unreach_v6_quotes_extension_headers)
{
	const struct tu_ext ext[2] = { { 0, 0 }, { 60, 1 } };
	size_t len, room, n;
	uint8_t *buf = syn_in_room("fd00:7f::1", "::", 0, 0, ext, 2, false, &len, &room);
	uint8_t *syn = malloc(len);
	struct pkt_view v;
	uint8_t src[16];

	memcpy(syn, buf, len);
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	cr_assert_eq(v.l3_len, 40 + 8 + 16);
	tu_addr(src, "fd00:7f::2");
	n = rewrite_icmp_unreach(&v, src);
	check_unreach(buf, n, syn, "fd00:7f::2", len);
	free(syn);
	free(buf);
}

/* Never past REWRITE_ANSWER_ROOM: extension headers long enough that the headers do not fit
 * whole get a quote cut to the room (the IP part and more than 8 bytes of TCP still in it). */
Test(rewrite, icmp_unreach_cut_to_the_room)
{
	const struct tu_ext ext[1] = { { 0, 56 } }; /* 456 bytes: the SYN is 556 bytes long */
	size_t len, room, n;
	uint8_t *buf = syn_in_room("fd00:7f::1", "::1", 36, 0, ext, 1, false, &len, &room);
	uint8_t *syn = malloc(len);
	struct pkt_view v;
	uint8_t src[16];

	memcpy(syn, buf, len);
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	cr_assert_eq(room, REWRITE_ANSWER_ROOM);
	cr_assert_gt((size_t)v.l3_len + v.tcp_hlen, room - 48, "the headers do not fit whole");
	tu_addr(src, "fd00:7f::2");
	n = rewrite_icmp_unreach(&v, src);
	cr_assert_eq(n, REWRITE_ANSWER_ROOM);
	check_unreach(buf, n, syn, "fd00:7f::2", room - 48);
	cr_assert_geq(room - 48, (size_t)v.l3_len + 8);
	free(syn);
	free(buf);
}

/* When not even the IP part and 8 bytes of TCP fit, no answer: 0, the packet untouched. */
Test(rewrite, icmp_unreach_no_room_no_answer)
{
	const struct tu_ext ext[1] = { { 0, 255 } }; /* 2048 bytes */
	size_t len, room;
	uint8_t *buf = syn_in_room("fd00:7f::1", "::1", 0, 0, ext, 1, false, &len, &room);
	uint8_t *syn = malloc(room);
	struct pkt_view v;
	uint8_t src[16];

	memcpy(syn, buf, room);
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	tu_addr(src, "fd00:7f::2");
	cr_assert_eq(rewrite_icmp_unreach(&v, src), 0);
	cr_assert_arr_eq(buf, syn, room, "untouched");
	free(syn);
	free(buf);
}
