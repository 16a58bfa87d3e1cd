/* memback.h — memory back once the traffic stops.
 *
 * A load leaves the heap's free pages with the process: glibc gives a thread's arena back only
 * from its top, so the transient blocks of a burst (datagrams queued, buffers of sessions that
 * came and went) keep their pages until something calls malloc_trim. The dispatcher trims when
 * its TCP sessions fall, the system stack when its NAT table empties, lwIP when its last pcb
 * goes; a load of UDP alone (a QUIC download, a game) moves none of those. This one watches
 * the traffic itself: a queue's batches note the time and the bytes so far; once at least
 * MEMBACK_MIN_BYTES have moved since the last trim, a one-shot timer checks a second later
 * whether traffic still flows (then again when a second has passed since the last batch) and
 * otherwise calls malloc_trim(0). While traffic flows that is one wakeup a second at most; an
 * idle proxy, or one that sees only a trickle, never wakes for it. A check libevent has no
 * memory to time is not waited for: the trim happens then and there.
 *
 * Before the trim it calls the quiet hooks: the owners of large I/O buffers that a load
 * touched from end to end (the TUN driver's read buffer, the UDP path's receive buffer) give
 * their pages back there (rss_pages_release); the next load faults them in again.
 *
 * One per loop: every TUN queue's loop has its own, fed by that queue's batches (queue 0's, on
 * the main loop, also runs the UDP path's hook), so a load that one queue carries alone is
 * trimmed after too. Each is used on its own loop's thread only; trims may be read anywhere.
 */
#ifndef TS_RUNTIME_MEMBACK_H
#define TS_RUNTIME_MEMBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "core/counter.h"

struct event;
struct event_base;

#define MEMBACK_QUIET_NS 1000000000LL  /* no batch for this long: the load is over */
#define MEMBACK_MIN_BYTES (1u << 20)    /* moved since the last trim: worth one */

#define MEMBACK_HOOKS 4

typedef void (*memback_hook_fn)(void *arg);

struct memback {
	struct event *ev;
	struct {
		memback_hook_fn fn;
		void *arg;
	} hook[MEMBACK_HOOKS];
	unsigned nhooks;
	bool armed;
	int64_t last_ns;        /* the last batch */
	uint64_t bytes;         /* the queue's bytes at the last batch */
	uint64_t bytes_trimmed; /* ... at the last trim */
	ctr_t trims;            /* written by the loop's thread, read by /stats on the main one */
};

/* 0 or -ENOMEM. */
int memback_init(struct memback *m, struct event_base *base);
void memback_fini(struct memback *m);

/* fn(arg) runs on m's loop at each quiet trim, before malloc_trim. 0, or -ENOSPC. */
int memback_on_quiet(struct memback *m, memback_hook_fn fn, void *arg)
	__attribute__((warn_unused_result));

/* After a batch of m's queue: its time and the bytes it has read and written so far. */
void memback_note(struct memback *m, int64_t now_ns, uint64_t bytes);

#endif
