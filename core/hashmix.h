/* hashmix.h — finalizers that spread every input bit over the whole word.
 *
 * The 64- and 32-bit finalizers of MurmurHash3 (Austin Appleby, public domain;
 * https://github.com/aappleby/smhasher/blob/master/src/MurmurHash3.cpp, fmix64 / fmix32):
 * xor-shift and multiply rounds after which each input bit flips each output bit with a
 * probability close to one half, so a table may index by the low bits alone.
 */
#ifndef TS_CORE_HASHMIX_H
#define TS_CORE_HASHMIX_H

#include <stdint.h>

static inline uint64_t hashmix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	return h ^ (h >> 33);
}

static inline uint32_t hashmix32(uint32_t h)
{
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	return h ^ (h >> 16);
}

#endif
