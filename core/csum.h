/* csum.h — Internet checksums (RFC 1071) and incremental updates (RFC 1624).
 *
 * Sums are byte-order independent (RFC 1071 section 2(B)): words are loaded in host order straight
 * from the packet and the folded result is stored back the same way, so no byte swapping is
 * needed.
 *
 * Incremental replacement accumulates every replaced 32-bit word into one 64-bit accumulator
 * and folds once at the end (RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m')).
 * Offload packets flagged NEEDS_CSUM carry, in the L4 checksum field, the UN-inverted
 * pseudo-header sum; after an address change it becomes C' = C + ~old + new, with no final
 * inversion, and only address words enter it (the kernel adds the ports with the payload).
 */
#ifndef TS_CORE_CSUM_H
#define TS_CORE_CSUM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Unfolded one's complement sum of buf (any length, any alignment) added to sum. */
uint64_t csum_partial(const void *buf, size_t len, uint64_t sum);

/* Fold a 64-bit accumulator to 16 bits (not inverted). Adding a value to itself rotated by
 * half its width leaves, in the upper half, the sum of both halves with the end-around carry
 * already applied (the low half's carry lands there): 64 -> 32 -> 16 in two add-rotates. */
static inline uint16_t csum_fold(uint64_t s)
{
	uint64_t t = s + (s >> 32 | s << 32);
	uint32_t x = (uint32_t)(t >> 32);
	uint32_t y = x + (x >> 16 | x << 16);
	return (uint16_t)(y >> 16);
}

/* Full Internet checksum of buf: the value to store in a checksum field. */
static inline uint16_t csum_buf(const void *buf, size_t len)
{
	return (uint16_t)~csum_fold(csum_partial(buf, len, 0));
}

/* Pseudo-header sums (unfolded), RFC 768/793 (v4) and RFC 8200 section 8.1 (v6); l4_len in
 * host order. */
uint64_t csum_pseudo4(const uint8_t src[4], const uint8_t dst[4], uint8_t proto, uint32_t l4_len);
uint64_t csum_pseudo6(const uint8_t src[16], const uint8_t dst[16], uint8_t proto, uint32_t l4_len);

/* Accumulate the replacement of one 32-bit word (as loaded from memory) by another. */
static inline void csum_acc32(uint64_t *acc, uint32_t old_w, uint32_t new_w)
{
	*acc += (uint32_t)~old_w;
	*acc += new_w;
}

static inline void csum_acc16(uint64_t *acc, uint16_t old_w, uint16_t new_w)
{
	*acc += (uint16_t)~old_w;
	*acc += new_w;
}

/* Accumulate the replacement of n bytes (n a multiple of 4) at old by new. */
static inline void csum_acc_bytes(uint64_t *acc, const void *old_b, const void *new_b, size_t n)
{
	const uint8_t *o = old_b, *w = new_b;
	for (size_t i = 0; i < n; i += 4) {
		uint32_t a, b;
		memcpy(&a, o + i, 4);
		memcpy(&b, w + i, 4);
		csum_acc32(acc, a, b);
	}
}

/* Apply an accumulated replacement to a full checksum field (RFC 1624 eqn. 3). */
static inline uint16_t csum_apply(uint16_t check, uint64_t acc)
{
	return (uint16_t)~csum_fold((uint16_t)~check + acc);
}

/* Same, for a TCP/UDP field: a result of 0 is sent as 0xFFFF (0 means "no checksum" in UDP). */
static inline uint16_t csum_apply_l4(uint16_t check, uint64_t acc)
{
	uint16_t c = csum_apply(check, acc);
	return c ? c : 0xffff;
}

/* Apply to a NEEDS_CSUM partial field: C' = C + acc, folded, no inversion. */
static inline uint16_t csum_apply_partial(uint16_t partial, uint64_t acc)
{
	return csum_fold((uint64_t)partial + acc);
}

/* 16-bit load/store in host order (for checksum fields and words). */
static inline uint16_t csum_load16(const void *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

static inline void csum_store16(void *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

#endif
