/* slab.c — small fixed-size objects packed in blocks of their own (see slab.h).
 *
 * A block is SLAB_BLOCK_BYTES, mapped at an address that is a multiple of its size, so an
 * object finds its block by masking its address. The block starts with its header; objects
 * follow. A block hands out never-used objects in order (no page of it is touched before an
 * object on it is) and freed ones from its own free list. Blocks with a free object are on
 * the partial list; a full block is on no list and goes back on it when one of its objects is
 * freed.
 */
#include "core/slab.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/queue.h>

#define ALIGN 16u

struct slab_obj {
	struct slab_obj *next;
};

struct slab_block {
	LIST_ENTRY(slab_block) link; /* on s->partial while it has a free object */
	bool listed;
	uint32_t used;               /* objects handed out and not freed */
	uint32_t fresh;              /* objects never handed out: from index (per_block - fresh) */
	struct slab_obj *free;       /* freed objects */
};

struct slab {
	struct budget *b;
	size_t size;
	uint32_t per_block;
	size_t first;                /* offset of object 0 in a block */
	LIST_HEAD(, slab_block) partial;
	struct slab_block *empty;    /* the one empty block kept, or NULL */
	uint64_t objects, blocks, refused, nomem;
};

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

int slab_new(struct budget *b, size_t size, struct slab **out)
{
	struct slab *s;

	*out = NULL;
	if (!b || size == 0 || size > SLAB_BLOCK_BYTES / 4)
		return -EINVAL;
	if (!(s = calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->b = b;
	s->size = round_up(size, ALIGN);
	s->first = round_up(sizeof(struct slab_block), ALIGN);
	s->per_block = (uint32_t)((SLAB_BLOCK_BYTES - s->first) / s->size);
	LIST_INIT(&s->partial);
	*out = s;
	return 0;
}

/* A block-aligned mapping: twice the size mapped, the ends that miss the alignment unmapped. */
static struct slab_block *block_map(void)
{
	size_t len = 2 * (size_t)SLAB_BLOCK_BYTES;
	uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t at;

	if (m == MAP_FAILED)
		return NULL;
	at = round_up((uintptr_t)m, SLAB_BLOCK_BYTES);
	if (at > (uintptr_t)m)
		munmap(m, at - (uintptr_t)m);
	if ((uintptr_t)m + len > at + SLAB_BLOCK_BYTES)
		munmap((void *)(at + SLAB_BLOCK_BYTES), (uintptr_t)m + len - at - SLAB_BLOCK_BYTES);
	return (struct slab_block *)at;
}

static void block_unmap(struct slab *s, struct slab_block *k)
{
	munmap(k, SLAB_BLOCK_BYTES);
	s->blocks--;
}

void *slab_zalloc(struct slab *s)
{
	struct slab_block *k = LIST_FIRST(&s->partial);
	void *p;

	if (budget_bytes_reserve(s->b, s->size) != 0) {
		s->refused++;
		return NULL;
	}
	if (!k) {
		if (s->empty) {
			k = s->empty;
			s->empty = NULL;
		} else {
			if (!(k = block_map())) {
				budget_bytes_release(s->b, s->size);
				s->nomem++;
				return NULL;
			}
			s->blocks++;
			k->fresh = s->per_block; /* the mapping is zero: used, free, listed too */
		}
		LIST_INSERT_HEAD(&s->partial, k, link);
		k->listed = true;
	}
	if (k->free) {
		p = k->free;
		k->free = k->free->next;
	} else {
		p = (uint8_t *)k + s->first + (size_t)(s->per_block - k->fresh) * s->size;
		k->fresh--;
	}
	if (++k->used == s->per_block) {
		LIST_REMOVE(k, link);
		k->listed = false;
	}
	s->objects++;
	memset(p, 0, s->size);
	return p;
}

void slab_put(struct slab *s, void *p)
{
	struct slab_block *k;
	struct slab_obj *o = p;

	if (!p)
		return;
	k = (struct slab_block *)((uintptr_t)p & ~(uintptr_t)(SLAB_BLOCK_BYTES - 1));
	assert(k->used > 0);
	o->next = k->free;
	k->free = o;
	k->used--;
	s->objects--;
	budget_bytes_release(s->b, s->size);
	if (!k->listed) {
		LIST_INSERT_HEAD(&s->partial, k, link);
		k->listed = true;
	}
	if (k->used == 0) {
		LIST_REMOVE(k, link);
		k->listed = false;
		if (s->empty)
			block_unmap(s, k);
		else
			s->empty = k;
	}
}

void slab_free(struct slab *s)
{
	struct slab_block *k;

	if (!s)
		return;
	assert(s->objects == 0);
	while ((k = LIST_FIRST(&s->partial))) {
		LIST_REMOVE(k, link);
		block_unmap(s, k);
	}
	if (s->empty)
		block_unmap(s, s->empty);
	free(s);
}

void slab_get_stats(const struct slab *s, struct slab_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!s)
		return;
	out->object_size = s->size;
	out->objects = s->objects;
	out->blocks = s->blocks;
	out->refused = s->refused;
	out->nomem = s->nomem;
}
