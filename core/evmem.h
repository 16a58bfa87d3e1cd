/* evmem.h — libevent's smallest blocks kept off the heap.
 *
 * Why: libevent keeps a 16-byte record for every descriptor number an event base has ever
 * watched, for the base's life (its evmap). Under a load the proxy watches thousands of
 * descriptors while the heap is full of the load's transient blocks, so glibc puts each record
 * in a hole between them; when the load is gone every record pins the page around it, and
 * malloc_trim can give back none of those pages. A thousand records scattered that way keep
 * over a megabyte resident for 16 KB of data.
 *
 * evmem_install() points libevent's allocator (event_set_mem_functions, process-wide) at
 * functions that serve blocks of at most EVMEM_CELL bytes from a region of their own — one
 * reserved mapping, cells handed out in address order and reused through a free list, pages
 * touched only as cells are first used — and pass every other block to malloc. A block
 * libevent got from malloc before the install, or that did not fit the region, is recognised
 * by its address and given back to free: installing late is safe.
 *
 * Only for a program that owns its libevent: memory libevent hands to its caller (a string
 * from evbuffer_readln, say) may come from the region and must then not be passed to free().
 * twinstack never frees such memory; a program that embeds the library decides for itself.
 */
#ifndef TS_CORE_EVMEM_H
#define TS_CORE_EVMEM_H

#include <stddef.h>
#include <stdint.h>

#define EVMEM_CELL 16u                    /* the largest block served from the region */
#define EVMEM_REGION_BYTES (64u << 20)    /* reserved, not committed: 4 Mi cells */

/* Install the functions (once per process; later calls return the first call's result).
 * 0, or -ENOMEM: the region could not be reserved (libevent keeps malloc). */
int evmem_install(void) __attribute__((warn_unused_result));

struct evmem_stats {
	uint64_t cells;       /* in use now */
	uint64_t cells_high;  /* cells ever handed out (the region's used part, in cells) */
	uint64_t fallbacks;   /* small blocks sent to malloc: the region was full */
};
void evmem_get_stats(struct evmem_stats *out);

/* The functions themselves (tests; libevent calls them once installed). */
void *evmem_malloc(size_t n);
void *evmem_realloc(void *p, size_t n);
void evmem_free(void *p);

#endif
