/* csum.c — the full (reference) Internet checksum and pseudo-header sums. */
#include "core/csum.h"

#include <arpa/inet.h>

uint64_t csum_partial(const void *buf, size_t len, uint64_t sum)
{
	const uint8_t *p = buf;

	/* 32-bit chunks into a 64-bit accumulator: no carry is lost below 2^32 words. */
	while (len >= 4) {
		uint32_t w;
		memcpy(&w, p, 4);
		sum += w;
		p += 4;
		len -= 4;
	}
	if (len >= 2) {
		uint16_t w;
		memcpy(&w, p, 2);
		sum += w;
		p += 2;
		len -= 2;
	}
	if (len) {
		/* The odd byte is the high-order byte of a 16-bit word in network order. */
		uint8_t last[2] = { *p, 0 };
		uint16_t w;
		memcpy(&w, last, 2);
		sum += w;
	}
	return sum;
}

uint64_t csum_pseudo4(const uint8_t src[4], const uint8_t dst[4], uint8_t proto, uint32_t l4_len)
{
	uint64_t sum = csum_partial(src, 4, 0);
	sum = csum_partial(dst, 4, sum);
	uint8_t tail[4] = { 0, proto, (uint8_t)(l4_len >> 8), (uint8_t)l4_len };
	return csum_partial(tail, 4, sum);
}

uint64_t csum_pseudo6(const uint8_t src[16], const uint8_t dst[16], uint8_t proto, uint32_t l4_len)
{
	uint64_t sum = csum_partial(src, 16, 0);
	sum = csum_partial(dst, 16, sum);
	uint8_t tail[8] = { (uint8_t)(l4_len >> 24), (uint8_t)(l4_len >> 16), (uint8_t)(l4_len >> 8),
			    (uint8_t)l4_len, 0, 0, 0, proto };
	return csum_partial(tail, 8, sum);
}
