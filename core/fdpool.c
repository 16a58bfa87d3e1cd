/* fdpool.c — the process's pool of session file descriptors (see fdpool.h). */
#include "core/fdpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>

#include "core/budget.h"

static struct {
	pthread_mutex_t resize_lock; /* join/leave and the size they set: one at a time */
	_Atomic uint32_t members;
	_Atomic uint64_t size;
	_Atomic uint64_t in_use;
} pool = { .resize_lock = PTHREAD_MUTEX_INITIALIZER };

static void resize(uint32_t members)
{
	struct rlimit rl;
	uint64_t reserved = (uint64_t)BUDGET_FD_RESERVED * (members ? members : 1), size = 0;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		uint64_t cur = rl.rlim_cur == RLIM_INFINITY ? UINT32_MAX : rl.rlim_cur;
		size = cur > reserved ? cur - reserved : 0;
	}
	atomic_store(&pool.size, size);
}

void fdpool_join(void)
{
	pthread_mutex_lock(&pool.resize_lock);
	resize(atomic_fetch_add(&pool.members, 1) + 1);
	pthread_mutex_unlock(&pool.resize_lock);
}

void fdpool_leave(void)
{
	uint32_t m;

	pthread_mutex_lock(&pool.resize_lock);
	m = atomic_load(&pool.members);
	if (m > 0)
		atomic_store(&pool.members, --m);
	resize(m);
	pthread_mutex_unlock(&pool.resize_lock);
}

bool fdpool_take(uint32_t n)
{
	uint64_t cur = atomic_load_explicit(&pool.in_use, memory_order_relaxed);

	do {
		if (cur + n > atomic_load_explicit(&pool.size, memory_order_relaxed))
			return false;
	} while (!atomic_compare_exchange_weak_explicit(&pool.in_use, &cur, cur + n,
							memory_order_relaxed,
							memory_order_relaxed));
	return true;
}

void fdpool_give(uint32_t n)
{
	uint64_t cur = atomic_load_explicit(&pool.in_use, memory_order_relaxed);

	/* Clamp at 0: a release without its take is the caller's bug, never a wrap-around. */
	while (!atomic_compare_exchange_weak_explicit(&pool.in_use, &cur, cur >= n ? cur - n : 0,
						      memory_order_relaxed, memory_order_relaxed))
		;
}

void fdpool_stats(struct fdpool_stats *out)
{
	out->members = atomic_load(&pool.members);
	out->size = atomic_load(&pool.size);
	out->in_use = atomic_load(&pool.in_use);
}
