/* memback.h — memory back once the traffic stops.
 *
 * A load leaves the heap's free pages with the process: glibc gives a thread's arena back only
 * from its top, so the transient blocks of a burst (datagrams queued, buffers of sessions that
 * came and went) keep their pages until something calls malloc_trim. The dispatcher trims when
 * its TCP sessions fall, the system stack when its NAT table empties, lwIP when its last pcb
 * goes; a load of UDP alone (a QUIC download, a game) moves none of those. This one watches
 * the traffic itself: queue 0's batches note the time and the bytes so far; once at least
 * MEMBACK_MIN_BYTES have moved since the last trim, a one-shot timer checks a second later
 * whether traffic still flows (then again when a second has passed since the last batch) and
 * otherwise calls malloc_trim(0). While traffic flows that is one wakeup a second at most; an
 * idle proxy, or one that sees only a trickle, never wakes for it.
 *
 * Main loop only (queue 0's batch end and its timer).
 */
#ifndef TS_RUNTIME_MEMBACK_H
#define TS_RUNTIME_MEMBACK_H

#include <stdbool.h>
#include <stdint.h>

struct event;
struct event_base;

#define MEMBACK_QUIET_NS 1000000000LL  /* no batch for this long: the load is over */
#define MEMBACK_MIN_BYTES (1u << 20)    /* moved since the last trim: worth one */

struct memback {
	struct event *ev;
	bool armed;
	int64_t last_ns;        /* the last batch */
	uint64_t bytes;         /* queue 0's bytes at the last batch */
	uint64_t bytes_trimmed; /* ... at the last trim */
	uint64_t trims;
};

/* 0 or -ENOMEM. */
int memback_init(struct memback *m, struct event_base *base);
void memback_fini(struct memback *m);

/* After a batch of queue 0: its time and the bytes it has read and written so far. */
void memback_note(struct memback *m, int64_t now_ns, uint64_t bytes);

#endif
