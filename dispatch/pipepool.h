/* pipepool.h — pipes for the splice relay, lent only while data is in flight.
 *
 * A splice relay needs a pipe between its two sockets, but only while bytes are actually in
 * transit: an idle connection (most of them, most of the time) holds none. So the relay borrows
 * a pipe when its source becomes readable and gives it back as soon as the pipe is empty. Each
 * pipe costs two descriptors (reserved from the budget before pipe2(), released when it is
 * closed) and its kernel buffer (counted in pipe_bytes); a budget refusal is the caller's cue to
 * fall back to the copy relay (hev-socks5-tunnel #97: fds are a budget like memory).
 *
 * Returned pipes stay open in a LIFO idle list (the most recently used is reused first, the
 * coldest sit at the tail) and are closed once idle for idle_ms, so a quiet process shrinks to
 * zero pipes. The idle ones are a cache: the pool is its budget's reclaim hook
 * (budget_set_fd_reclaim), so a descriptor reservation that would be refused (a new session's
 * socket) closes the coldest idle pipes first. The shrink timer is pending only while idle pipes exist: a pool with nothing idle
 * never wakes the loop. Work per timer run is O(pipes closed).
 *
 * Single-threaded: one pool per event loop; all calls on that loop's thread.
 */
#ifndef TS_DISPATCH_PIPEPOOL_H
#define TS_DISPATCH_PIPEPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "core/budget.h"

struct event_base;
struct pipepool;

/* A lent pipe. rd/wr are O_NONBLOCK|O_CLOEXEC; cap is the kernel capacity (F_GETPIPE_SZ) the
 * borrower may fill. The rest is the pool's. */
struct pipepool_pipe {
	int rd, wr;
	size_t cap;
	/* private */
	TAILQ_ENTRY(pipepool_pipe) link;
	int64_t idle_since_ns;
};

#define PIPEPOOL_DEFAULT_SIZE (256u << 10)
#define PIPEPOOL_DEFAULT_IDLE_MS 1000u
#define PIPEPOOL_DEFAULT_MAX_IDLE 256u

struct pipepool_params {
	size_t pipe_size;  /* wanted capacity (F_SETPIPE_SZ), bounded by /proc/sys/fs/pipe-max-size;
			    * 0 = the kernel default (64 KiB) */
	uint32_t idle_ms;  /* an idle pipe is closed after this long; 0 = PIPEPOOL_DEFAULT_IDLE_MS */
	uint32_t max_idle; /* idle pipes kept at most; beyond, a returned pipe is closed at once;
			    * 0 = PIPEPOOL_DEFAULT_MAX_IDLE */
};

/* Defaults: PIPEPOOL_DEFAULT_SIZE, _IDLE_MS, _MAX_IDLE. */
void pipepool_params_default(struct pipepool_params *p);

/* Create a pool on base drawing descriptors from b (both borrowed: they must outlive the pool).
 * The pool becomes b's descriptor reclaim hook (one pool per budget; b's reservations on
 * this pool's thread only).
 * Returns 0, -EINVAL or -ENOMEM. Opens nothing up front. */
int pipepool_new(struct event_base *base, struct budget *b, const struct pipepool_params *p,
		 struct pipepool **out) __attribute__((warn_unused_result));

/* Close every idle pipe and free the pool. Every lent pipe must have been put back or discarded
 * first (asserted in debug builds). NULL is fine. */
void pipepool_free(struct pipepool *pp);

/* Lend an empty pipe: an idle one if any, else a new one. Returns 0 with *out, -EMFILE when the
 * budget has no 2 descriptors left (counted in refused_budget), or -errno from pipe2 (counted in
 * failed). */
int pipepool_get(struct pipepool *pp, struct pipepool_pipe **out)
	__attribute__((warn_unused_result));

/* Give back a pipe that is EMPTY (every byte spliced out; asserted in debug builds). It is
 * kept idle for reuse, or closed when max_idle are idle already. */
void pipepool_put(struct pipepool *pp, struct pipepool_pipe *p);

/* Give back a pipe that may still hold data (the relay ended mid-transfer): it is closed. */
void pipepool_discard(struct pipepool *pp, struct pipepool_pipe *p);

struct pipepool_stats {
	uint32_t lent;           /* pipes held by relays now */
	uint32_t idle;           /* open, waiting for reuse */
	uint64_t pipe_bytes;     /* kernel capacity of every open pipe (lent + idle) */
	uint64_t pipe_size;      /* the capacity asked of each new pipe (after bounding; 0 = default) */
	uint64_t created, closed_full, discarded;
	uint64_t closed_idle;    /* after idle_ms; or at once, with no memory for the timer */
	uint64_t reused;         /* gets served from the idle list */
	uint64_t refused_budget; /* gets refused: no descriptors in the budget */
	uint64_t failed;         /* pipe2 failures */
	uint64_t resize_failed;  /* F_SETPIPE_SZ refused (user pipe quota): default size kept */
	uint64_t reclaimed;      /* idle pipes closed to make room for a descriptor reservation */
	bool timer_pending;      /* the shrink timer is armed (only while idle > 0) */
};
void pipepool_get_stats(const struct pipepool *pp, struct pipepool_stats *out);

/* The system's /proc/sys/fs/pipe-max-size, or 0 if it cannot be read. */
size_t pipepool_max_size(void);

#endif
