/* fdpool.h — the process's pool of session file descriptors.
 *
 * RLIMIT_NOFILE limits the whole process, so when several proxies run in one process (the
 * library allows it) their session budgets must not each assume the whole limit: every budget
 * that joins the pool (budget_join_fd_pool) reserves each descriptor from its own limit AND
 * from this pool, whose size is the soft RLIMIT_NOFILE minus BUDGET_FD_RESERVED for each
 * member (every proxy keeps fds of its own outside the session budget: TUN queues, listeners,
 * its loop, the stats endpoint).
 *
 * This is the one piece of process-wide mutable state in the library, because the resource it
 * mirrors is process-wide. Lock-free; any thread.
 */
#ifndef TS_CORE_FDPOOL_H
#define TS_CORE_FDPOOL_H

#include <stdbool.h>
#include <stdint.h>

/* A proxy starts or ends using the pool: re-reads RLIMIT_NOFILE and resizes the pool for the
 * number of members. Never revokes descriptors already taken. */
void fdpool_join(void);
void fdpool_leave(void);

/* Take n descriptors from the pool: true, or false when that would pass its size. */
bool fdpool_take(uint32_t n);
void fdpool_give(uint32_t n);

struct fdpool_stats {
	uint32_t members;
	uint64_t size;     /* descriptors the members may hold together */
	uint64_t in_use;
};
void fdpool_stats(struct fdpool_stats *out);

#endif
