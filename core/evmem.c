/* evmem.c — libevent's smallest blocks from a region of their own (see evmem.h). */
#include "core/evmem.h"

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* A free cell holds the next free cell. */
struct cell {
	struct cell *next;
};

static struct {
	pthread_mutex_t lock;
	uint8_t *base;       /* the reserved region; NULL until installed */
	size_t used;         /* bytes handed out in address order so far */
	struct cell *free;
	uint64_t cells, fallbacks;
	int installed;       /* the result of the first install */
} E = { .lock = PTHREAD_MUTEX_INITIALIZER };

static pthread_once_t once = PTHREAD_ONCE_INIT;

static bool in_region(const void *p)
{
	const uint8_t *b = E.base;
	return b && (const uint8_t *)p >= b && (const uint8_t *)p < b + EVMEM_REGION_BYTES;
}

static void *cell_get(void)
{
	void *p = NULL;

	pthread_mutex_lock(&E.lock);
	if (E.free) {
		p = E.free;
		E.free = E.free->next;
	} else if (E.used + EVMEM_CELL <= EVMEM_REGION_BYTES) {
		p = E.base + E.used;
		E.used += EVMEM_CELL;
	}
	if (p)
		E.cells++;
	else
		E.fallbacks++;
	pthread_mutex_unlock(&E.lock);
	return p;
}

static void cell_put(void *p)
{
	struct cell *c = p;

	pthread_mutex_lock(&E.lock);
	c->next = E.free;
	E.free = c;
	E.cells--;
	pthread_mutex_unlock(&E.lock);
}

void *evmem_malloc(size_t n)
{
	void *p;

	if (n > 0 && n <= EVMEM_CELL && E.base && (p = cell_get()))
		return p;
	return malloc(n);
}

void *evmem_realloc(void *p, size_t n)
{
	void *q;

	if (!p)
		return evmem_malloc(n);
	if (!in_region(p))
		return realloc(p, n);
	if (n <= EVMEM_CELL)
		return p;
	if (!(q = malloc(n)))
		return NULL;
	memcpy(q, p, EVMEM_CELL);
	cell_put(p);
	return q;
}

void evmem_free(void *p)
{
	if (in_region(p))
		cell_put(p);
	else
		free(p);
}

static void install_once(void)
{
	/* Reserved without commitment: a page costs memory only once a cell on it is used. */
	void *m = mmap(NULL, EVMEM_REGION_BYTES, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (m == MAP_FAILED) {
		E.installed = -ENOMEM;
		return;
	}
	/* A huge page would bring 2 MiB in at the first record. */
	(void)madvise(m, EVMEM_REGION_BYTES, MADV_NOHUGEPAGE);
	E.base = m;
	event_set_mem_functions(evmem_malloc, evmem_realloc, evmem_free);
	E.installed = 0;
}

int evmem_install(void)
{
	pthread_once(&once, install_once);
	return E.installed;
}

void evmem_get_stats(struct evmem_stats *out)
{
	pthread_mutex_lock(&E.lock);
	out->cells = E.cells;
	out->cells_high = E.used / EVMEM_CELL;
	out->fallbacks = E.fallbacks;
	pthread_mutex_unlock(&E.lock);
}
