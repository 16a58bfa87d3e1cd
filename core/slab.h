/* slab.h — small fixed-size objects packed in blocks of their own, counted by the budget.
 *
 * Why: objects that live long and come in thousands (the UDP path's sessions and sockets) are
 * allocated while the heap is full of a load's transient blocks, so glibc scatters them over
 * the heap; when the load is gone, each one pins the pages around it and malloc_trim can give
 * back only the rest. A slab keeps them together, in 64 KiB blocks mapped for them alone: the
 * heap holds none of them, and a block whose objects are all gone is unmapped at once (one
 * empty block is kept, so churn at a block's edge does not map and unmap each time).
 *
 * Each object is reserved from the budget's buffer bytes (its rounded size) while it is out,
 * as a heap block of its size would be: the budget measures what sessions hold, and a budget
 * that refuses one makes slab_zalloc fail (NULL), counted. The blocks around the objects are
 * not counted: at most one empty block, plus the unused room of partly used ones.
 * Objects are handed out zeroed, aligned to 16 bytes. Single-threaded (one owner's loop).
 */
#ifndef TS_CORE_SLAB_H
#define TS_CORE_SLAB_H

#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"

#define SLAB_BLOCK_BYTES (64u * 1024u)

struct slab;

/* Objects of size bytes (1 to a quarter of a block) drawing on budget b (borrowed: it must
 * outlive the slab). 0, -EINVAL or -ENOMEM. Maps nothing up front. */
int slab_new(struct budget *b, size_t size, struct slab **out) BUDGET_WUR;

/* Every object must have been freed (asserted in debug builds). NULL is fine. */
void slab_free(struct slab *s);

/* A zeroed object, or NULL: the budget refused its bytes (refused) or mmap failed (nomem). */
void *slab_zalloc(struct slab *s) BUDGET_WUR;

/* Give p (from slab_zalloc(s)) back. NULL is a no-op. */
void slab_put(struct slab *s, void *p);

struct slab_stats {
	uint64_t object_size;   /* as handed out (rounded up to 16) */
	uint64_t objects;       /* in use */
	uint64_t blocks;        /* mapped, the kept empty one included */
	uint64_t refused;       /* slab_zalloc NULL: the budget said no */
	uint64_t nomem;         /* slab_zalloc NULL: mmap said no */
};
void slab_get_stats(const struct slab *s, struct slab_stats *out);

#endif
