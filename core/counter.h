/* counter.h — statistics counters that are cheap on the hot path and safe to read anywhere.
 *
 * Two kinds:
 *  - ctr_inc/ctr_add: single-writer counters (a worker's own block). Relaxed load+store, no
 *    locked instruction; any thread may read them. Blocks of several workers are summed on read.
 *  - ctr_add_shared: counters written by several threads (e.g. the NAT table's, bumped under
 *    different shard locks). A relaxed fetch_add.
 */
#ifndef TS_CORE_COUNTER_H
#define TS_CORE_COUNTER_H

#include <stdatomic.h>
#include <stdint.h>

typedef _Atomic uint64_t ctr_t;

static inline void ctr_add(ctr_t *c, uint64_t n)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
			      memory_order_relaxed);
}

static inline void ctr_inc(ctr_t *c)
{
	ctr_add(c, 1);
}

static inline void ctr_add_shared(ctr_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static inline uint64_t ctr_get(const ctr_t *c)
{
	return atomic_load_explicit((ctr_t *)c, memory_order_relaxed);
}

static inline void ctr_set(ctr_t *c, uint64_t v)
{
	atomic_store_explicit(c, v, memory_order_relaxed);
}

#endif
