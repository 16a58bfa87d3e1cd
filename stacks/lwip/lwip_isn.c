/* lwip_isn.c — RFC 6528 initial sequence numbers and the random numbers lwIP asks for
 * (contracts in lwip_isn.h). */
#include "stacks/lwip/lwip_isn.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#define ISN_TICK_NS 4000 /* RFC 6528: M is a timer incremented every 4 microseconds */

static uint64_t rotl(uint64_t x, unsigned b)
{
	return (x << b) | (x >> (64 - b));
}

static uint64_t load_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

#define SIPROUND                                                                               \
	do {                                                                                   \
		v0 += v1;                                                                      \
		v1 = rotl(v1, 13);                                                             \
		v1 ^= v0;                                                                      \
		v0 = rotl(v0, 32);                                                             \
		v2 += v3;                                                                      \
		v3 = rotl(v3, 16);                                                             \
		v3 ^= v2;                                                                      \
		v0 += v3;                                                                      \
		v3 = rotl(v3, 21);                                                             \
		v3 ^= v0;                                                                      \
		v2 += v1;                                                                      \
		v1 = rotl(v1, 17);                                                             \
		v1 ^= v2;                                                                      \
		v2 = rotl(v2, 32);                                                             \
	} while (0)

uint64_t lwip_siphash24(uint64_t k0, uint64_t k1, const uint8_t *m, size_t len)
{
	uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
	uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
	uint64_t b = (uint64_t)len << 56;
	size_t i, tail = len & 7;

	for (i = 0; i + 8 <= len; i += 8) {
		uint64_t w = load_le64(m + i);
		v3 ^= w;
		SIPROUND;
		SIPROUND;
		v0 ^= w;
	}
	for (size_t j = 0; j < tail; j++)
		b |= (uint64_t)m[i + j] << (8 * j);
	v3 ^= b;
	SIPROUND;
	SIPROUND;
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* Fill buf from the kernel's random source; blocks only until the kernel's pool is first
 * initialised (early boot). */
static int random_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int lwip_isn_init(struct lwip_isn *isn)
{
	uint64_t k[2];
	int ret = random_bytes(k, sizeof(k));

	if (ret != 0)
		return ret;
	isn->k0 = k[0];
	isn->k1 = k[1];
	return 0;
}

uint32_t lwip_isn_get(const struct lwip_isn *isn, int family, const uint8_t *local,
		      uint16_t lport, const uint8_t *remote, uint16_t rport, int64_t now_ns)
{
	uint8_t m[2 * 16 + 4];
	size_t alen = family == 6 ? 16 : 4;

	memcpy(m, local, alen);
	memcpy(m + alen, remote, alen);
	m[2 * alen] = (uint8_t)(lport >> 8);
	m[2 * alen + 1] = (uint8_t)lport;
	m[2 * alen + 2] = (uint8_t)(rport >> 8);
	m[2 * alen + 3] = (uint8_t)rport;
	return (uint32_t)((uint64_t)now_ns / ISN_TICK_NS) +
	       (uint32_t)lwip_siphash24(isn->k0, isn->k1, m, 2 * alen + 4);
}

int64_t lwip_isn_age_ns(const struct lwip_isn *isn, int family, const uint8_t *local,
			uint16_t lport, const uint8_t *remote, uint16_t rport, uint32_t iss,
			int64_t now_ns)
{
	uint32_t ticks = lwip_isn_get(isn, family, local, lport, remote, rport, now_ns) - iss;

	return (int64_t)ticks * ISN_TICK_NS;
}

uint32_t lwip_isn_rand32(void)
{
	uint32_t r;

	/* getrandom(2) with no flags cannot fail on Linux >= 3.17 once the pool is initialised
	 * (short reads happen only above 256 bytes); should it fail anyway, lwIP still needs a
	 * number and the stack would rather start: the address of r and of the code mixed by the
	 * hash are at least not constants under ASLR. */
	if (random_bytes(&r, sizeof(r)) == 0)
		return r;
	return (uint32_t)lwip_siphash24((uint64_t)(uintptr_t)&r, (uint64_t)(uintptr_t)rotl,
					(const uint8_t *)"lwip", 4);
}
