/* test_rewrite.c — stacks/common/rewrite: the incremental checksum of an IPv6 TCP rewrite at
 * the edge of its 64-bit accumulator. rewrite_tcp6 sums the old and new addresses as 64-bit
 * words with end-around carry; an app chooses its destination address, so it can make that
 * sum land anywhere, up to 2^64 - 1. The checksum written must verify whatever it is.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "core/csum.h"
#include "core/pkt.h"
#include "stacks/common/rewrite.h"

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
