/* bufpool.c — fixed-size buffer pools with a bounded LIFO cache, accounted in the budget.
 *
 * Invariants (under p->lock): in_use <= max_bufs; ncached <= cache_cap <= max_bufs; the budget
 * holds exactly in_use * buf_size bytes for this pool. malloc is called only when the cache is
 * empty, so the memory a pool owns (in_use + ncached buffers) never exceeds max_bufs buffers.
 */
#include "core/bufpool.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Under ASan, poison cached buffers so a use after bufpool_put is reported even though the
 * memory was never given back to malloc. The first word stays addressable: it links the list. */
#if defined(__SANITIZE_ADDRESS__)
#define BUFPOOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUFPOOL_ASAN 1
#endif
#endif
#ifdef BUFPOOL_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct freebuf {
	struct freebuf *next;
};

struct bufpool {
	pthread_mutex_t lock;
	struct budget *budget;
	size_t buf_size;      /* what callers get and what the budget counts */
	size_t alloc_size;    /* >= sizeof(struct freebuf): a cached buffer holds the list link */
	uint32_t max_bufs;
	uint32_t cache_cap;

	/* All below under lock. */
	struct freebuf *cache;
	uint32_t ncached;
	uint32_t in_use, peak;
	uint64_t gets, puts, refused_pool, refused_budget, failed_nomem, mallocs, frees;

	char name[16];
};

static uint32_t default_cache_cap(size_t buf_size, uint32_t max_bufs)
{
	size_t n = BUFPOOL_CACHE_BYTES / buf_size;

	if (n < BUFPOOL_CACHE_MIN)
		n = BUFPOOL_CACHE_MIN;
	return n < max_bufs ? (uint32_t)n : max_bufs;
}

int bufpool_new(struct budget *b, const char *name, size_t buf_size, uint32_t max_bufs,
		struct bufpool **out)
{
	struct bufpool *p;
	int ret;

	*out = NULL;
	if (!b || !name || buf_size == 0 || max_bufs == 0)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	if ((ret = -pthread_mutex_init(&p->lock, NULL)) != 0)
		goto fail_free;
	p->budget = b;
	p->buf_size = buf_size;
	p->alloc_size = buf_size < sizeof(struct freebuf) ? sizeof(struct freebuf) : buf_size;
	p->max_bufs = max_bufs;
	p->cache_cap = default_cache_cap(buf_size, max_bufs);
	snprintf(p->name, sizeof(p->name), "%s", name);
	*out = p;
	return 0;

fail_free:
	free(p);
	return ret;
}

/* Detach the whole cache under the lock; the caller frees it outside. */
static struct freebuf *cache_take_all(struct bufpool *p, uint32_t *n)
{
	struct freebuf *list = p->cache;

	*n = p->ncached;
	p->cache = NULL;
	p->ncached = 0;
	p->frees += *n;
	return list;
}

static void free_list(struct freebuf *list)
{
	while (list) {
		struct freebuf *next = list->next;
		free(list);
		list = next;
	}
}

void bufpool_free(struct bufpool *p)
{
	uint32_t n;

	if (!p)
		return;
	assert(p->in_use == 0);
	free_list(cache_take_all(p, &n));
	pthread_mutex_destroy(&p->lock);
	free(p);
}

size_t bufpool_buf_size(const struct bufpool *p)
{
	return p->buf_size;
}

/* Reserve one buffer's worth of pool and budget, and pop the cache if it has one.
 * Returns -ENOBUFS when refused; otherwise 0 with *fb possibly NULL (allocate outside). */
static int reserve_locked(struct bufpool *p, struct freebuf **fb)
{
	*fb = NULL;
	if (p->in_use >= p->max_bufs) {
		p->refused_pool++;
		return -ENOBUFS;
	}
	if (budget_bytes_reserve(p->budget, p->buf_size) != 0) {
		p->refused_budget++;
		return -ENOBUFS;
	}
	if (++p->in_use > p->peak)
		p->peak = p->in_use;
	p->gets++;
	if (p->cache) {
		*fb = p->cache;
		p->cache = (*fb)->next;
		p->ncached--;
	} else {
		p->mallocs++;
	}
	return 0;
}

void *bufpool_get(struct bufpool *p)
{
	struct freebuf *fb;
	int ret;

	pthread_mutex_lock(&p->lock);
	ret = reserve_locked(p, &fb);
	pthread_mutex_unlock(&p->lock);
	if (ret != 0)
		return NULL;
	if (fb) {
		UNPOISON(fb, p->alloc_size);
		return fb;
	}
	fb = malloc(p->alloc_size);
	if (fb)
		return fb;

	/* Out of system memory: undo the reservation; the get is not a success. */
	pthread_mutex_lock(&p->lock);
	p->in_use--;
	p->gets--;
	p->mallocs--;
	p->failed_nomem++;
	pthread_mutex_unlock(&p->lock);
	budget_bytes_release(p->budget, p->buf_size);
	return NULL;
}

void bufpool_put(struct bufpool *p, void *buf)
{
	struct freebuf *fb = buf;
	bool keep;

	if (!buf)
		return;
	pthread_mutex_lock(&p->lock);
	assert(p->in_use > 0);
	p->in_use--;
	p->puts++;
	keep = p->ncached < p->cache_cap;
	if (keep) {
		fb->next = p->cache;
		p->cache = fb;
		p->ncached++;
		POISON((char *)fb + sizeof(*fb), p->alloc_size - sizeof(*fb));
	} else {
		p->frees++;
	}
	pthread_mutex_unlock(&p->lock);
	budget_bytes_release(p->budget, p->buf_size);
	if (!keep)
		free(fb);
}

/* Cut the cache down to at most n buffers; returns the detached excess to free outside. */
static struct freebuf *cache_trim_locked(struct bufpool *p, uint32_t n, uint32_t *freed)
{
	struct freebuf *excess = NULL;

	*freed = 0;
	while (p->ncached > n) {
		struct freebuf *fb = p->cache;
		p->cache = fb->next;
		p->ncached--;
		fb->next = excess;
		excess = fb;
		(*freed)++;
	}
	p->frees += *freed;
	return excess;
}

void bufpool_set_cache_cap(struct bufpool *p, uint32_t n)
{
	struct freebuf *excess;
	uint32_t freed;

	pthread_mutex_lock(&p->lock);
	p->cache_cap = n < p->max_bufs ? n : p->max_bufs;
	excess = cache_trim_locked(p, p->cache_cap, &freed);
	pthread_mutex_unlock(&p->lock);
	free_list(excess);
}

uint32_t bufpool_trim(struct bufpool *p)
{
	struct freebuf *list;
	uint32_t n;

	pthread_mutex_lock(&p->lock);
	list = cache_take_all(p, &n);
	pthread_mutex_unlock(&p->lock);
	free_list(list);
	return n;
}

void bufpool_get_stats(struct bufpool *p, struct bufpool_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&p->lock);
	memcpy(out->name, p->name, sizeof(out->name));
	out->buf_size = p->buf_size;
	out->max_bufs = p->max_bufs;
	out->cache_cap = p->cache_cap;
	out->bufs_in_use = p->in_use;
	out->bufs_peak = p->peak;
	out->bufs_cached = p->ncached;
	out->gets = p->gets;
	out->puts = p->puts;
	out->refused_pool = p->refused_pool;
	out->refused_budget = p->refused_budget;
	out->failed_nomem = p->failed_nomem;
	out->mallocs = p->mallocs;
	out->frees = p->frees;
	pthread_mutex_unlock(&p->lock);
	out->bytes_in_use = (uint64_t)out->bufs_in_use * out->buf_size;
	out->bytes_peak = (uint64_t)out->bufs_peak * out->buf_size;
	out->bytes_cached = (uint64_t)out->bufs_cached * out->buf_size;
}
