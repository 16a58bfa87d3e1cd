/* bufpool.h — fixed-size buffer pools: where every userspace packet and stream buffer comes from.
 *
 * One pool per size class (e.g. "pkt" for TUN reads, "relay" for the copy relay). Each buffer
 * handed out is counted against the owning budget's buffer_bytes AND the pool's own max_bufs; a
 * get that would exceed either returns NULL and is counted — callers drop or back off, they
 * never block. Returned buffers go to a free list (LIFO, so the hottest buffer is reused) up to
 * a cache cap and are returned to the system beyond it, so steady state does not call malloc
 * while an idle pool does not pin its peak. Cached buffers are NOT counted as in use: the
 * budget's buffer bytes measure what sessions hold; the cache is bounded by its cap and
 * reported separately (bytes_cached).
 *
 * Thread-safe: one mutex per pool, held only for the counter updates and the free-list pop/push;
 * malloc and free happen outside it.
 */
#ifndef TS_CORE_BUFPOOL_H
#define TS_CORE_BUFPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"

struct bufpool;

/* Default cache cap: this many bytes' worth of buffers, at least BUFPOOL_CACHE_MIN buffers and
 * never more than max_bufs. */
#define BUFPOOL_CACHE_BYTES (1u << 20)
#define BUFPOOL_CACHE_MIN 16u

/* Create a pool of max_bufs buffers of buf_size bytes drawing on budget b (borrowed: b must
 * outlive the pool). name is copied (truncated to 15 characters) for stats. Returns 0, -EINVAL
 * (buf_size 0, max_bufs 0, name NULL) or -ENOMEM. Allocates no buffer up front. */
int bufpool_new(struct budget *b, const char *name, size_t buf_size, uint32_t max_bufs,
		struct bufpool **out) BUDGET_WUR;

/* Free the pool and its cached buffers. Every buffer must have been put back (asserted in
 * debug builds). NULL is fine. */
void bufpool_free(struct bufpool *p);

/* A buffer of bufpool_buf_size(p) bytes, uninitialised, aligned for any type; or NULL, counted
 * in refused_pool (max_bufs reached), refused_budget (buffer_bytes reached) or failed_nomem. */
void *bufpool_get(struct bufpool *p) BUDGET_WUR;

/* Give a buffer from bufpool_get(p) back to the same pool. NULL is a no-op. */
void bufpool_put(struct bufpool *p, void *buf);

size_t bufpool_buf_size(const struct bufpool *p);

/* Keep at most n buffers on the free list (0 = none: every put frees). Excess is freed now. */
void bufpool_set_cache_cap(struct bufpool *p, uint32_t n);

/* Return every cached buffer to the system (e.g. on entering critical pressure). Returns how
 * many were freed. */
uint32_t bufpool_trim(struct bufpool *p);

struct bufpool_stats {
	char name[16];
	uint64_t buf_size;
	uint32_t max_bufs;
	uint32_t cache_cap;
	uint32_t bufs_in_use, bufs_peak;
	uint32_t bufs_cached;
	uint64_t bytes_in_use, bytes_peak;   /* bufs_in_use * buf_size, and its peak */
	uint64_t bytes_cached;
	uint64_t gets, puts;                 /* successful gets; puts */
	uint64_t refused_pool, refused_budget, failed_nomem;
	uint64_t mallocs, frees;             /* calls to the system allocator */
};
void bufpool_get_stats(struct bufpool *p, struct bufpool_stats *out);

#endif
