/* relay.h — move bytes both ways between two streams until the connection is over.
 *
 * A relay joins stream a (the stack side: the app's connection) and stream b (the outbound
 * side). Its two directions, a->b ("up") and b->a ("down"), are independent state machines:
 *
 *   idle --src readable--> take a pipe or buffer --read--> in flight --write--> (empty:
 *   give the pipe/buffer back) --> idle ... src EOF + nothing in flight --> shutdown_write(dst)
 *   --> finished
 *
 * Half-close (RFC 793 section 3.5): an EOF from one side is propagated as shutdown_write on the
 * other only after every byte read before it was delivered; the other direction keeps flowing. The
 * relay ends when:
 *   - both directions finished                  -> both streams closed gracefully (DONE);
 *   - a read from either stream fails, or a stream that failed (below) shows EOF without a FIN
 *                                               -> both aborted: the app gets a RST (ERROR_A/B);
 *   - no byte moved either way for idle_ms      -> both aborted (IDLE);
 *   - relay_cancel() (dispatcher shutdown)      -> both aborted (CANCELLED).
 *
 * A failed write, shutdown_write or error report on stream X ends only the direction INTO X
 * (its bytes in flight are dropped; the other peer's further bytes are read and discarded).
 * The direction OUT of X carries on: if X's FIN came before its failure (a server that sent
 * its whole response and FIN, then reset because the client kept uploading: HTTP's "413, then
 * RST"), everything X sent is delivered, the other stream gets its FIN, and the relay lingers
 * until that peer acknowledged it all (stream_unacked, polled every 1..64 ms); then it closes
 * that stream gracefully, aborts X, and ends as ERROR_X (counted in drained_ends). A reset
 * before X's FIN, the idle timeout during the linger (acknowledgements count as activity), or
 * the other peer failing too still abort both: a truncated stream never ends in a FIN.
 *
 * Modes. splice (kernel sockets on both sides; no payload enters userspace): socket -> pipe
 * with SPLICE_F_MOVE|SPLICE_F_NONBLOCK up to the pipe's capacity, then pipe -> socket; the pipe
 * is borrowed from the pipe pool when the source becomes readable and no pipe is held, and given
 * back the moment it is empty. copy (always when either stream has no fd, e.g. lwIP, or when
 * asked): one buffer per direction from the buffer pool, likewise held only while it has bytes.
 * gather (a source that lends its own buffers into a destination that takes iovecs: an lwIP
 * stream into a socket, the upload of every lwIP session): no relay buffer; each writev hands
 * over up to 64 views and 256 KiB of the source's queue, and exactly what the destination took
 * is then skipped in the source. A direction whose pipe cannot be had (fd budget refused, pipe2 failed, splice unsupported)
 * falls back to copy for the rest of its life; counted in pipe_fallbacks.
 *
 * Back-pressure: a direction reads only what it can hold: at most one buffer (copy) or one
 * pipe's capacity (splice) is in flight per direction, and gather takes from the source only
 * what the destination accepted; while the destination does not drain, the source is not
 * read, so the kernel (or lwIP's window) pushes back on the sender.
 *
 * A stream's failure is noticed on its next read or write (or its error callback): a direction
 * held back by a slow destination learns that its source was reset once it reads again, and
 * the idle timeout bounds that wait (and any linger: RELAY_LINGER_STALL_MS without progress
 * when idle_ms is 0).
 *
 * Early bytes: bytes the outbound already read from b past a proxy handshake; they are copied
 * at relay_new (accounted through budget_malloc) and written to a before anything else b->a.
 *
 * Single-threaded: a relay and its streams live on one event loop. The process must ignore
 * SIGPIPE: splice(2) into a reset socket raises it and, unlike send(), cannot be told
 * MSG_NOSIGNAL (the copy path uses MSG_NOSIGNAL and needs nothing).
 */
#ifndef TS_DISPATCH_RELAY_H
#define TS_DISPATCH_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"
#include "core/bufpool.h"
#include "core/config.h"
#include "core/counter.h"
#include "dispatch/pipepool.h"
#include "dispatch/stream.h"

struct event_base;
struct relay;

enum relay_end {
	RELAY_DONE,      /* both directions finished (FIN both ways) */
	RELAY_ERROR_A,   /* stream a failed or was reset; b aborted, or closed after a's whole
			  * stream and FIN reached it (see above) */
	RELAY_ERROR_B,   /* stream b failed or was reset; a aborted, or closed likewise */
	RELAY_IDLE,      /* idle timeout; both aborted */
	RELAY_CANCELLED, /* relay_cancel(); both aborted */
	RELAY_NO_MEMORY, /* a timer the relay needed (idle, buffer retry, linger poll) could not
			  * be armed (libevent out of memory): both aborted, rather than a wait
			  * that nothing would end */
	RELAY_END_MAX
};

const char *relay_end_name(enum relay_end e);

enum relay_dir_id {
	RELAY_UP,   /* a -> b */
	RELAY_DOWN, /* b -> a */
	RELAY_DIRS
};

/* Aggregate counters shared by the relays of one loop (single writer: ctr_add). Gauges go up
 * and down through unsigned wrap-around adds and are exact whenever read from the loop. */
struct relay_counters {
	ctr_t bytes[RELAY_DIRS];  /* delivered to the destination */
	ctr_t splice_bytes;       /* delivered by splice */
	ctr_t copy_bytes;         /* delivered by copy (early bytes included) */
	ctr_t gather_bytes;       /* of copy_bytes: handed from the source's own buffers to the
				   * destination in one call (peekv/writev), no relay buffer */
	ctr_t pipe_fallbacks;     /* directions that fell back from splice to copy */
	ctr_t buf_waits;          /* a buffer was refused by the pool/budget; retried later */
	ctr_t room_waits;         /* a read waited for room in the destination (write_room 0, or a
				   * gather that dst took only part of) */
	ctr_t pipe_bytes_inflight; /* gauge: bytes now in pipes */
	ctr_t buf_bytes_inflight; /* gauge: bytes now in copy buffers (and early bytes) */
	ctr_t active;             /* gauge: live relays */
	ctr_t ends[RELAY_END_MAX];
	ctr_t drained_ends;       /* ERROR_A/B ends that still delivered the failed stream's
				   * whole direction and FIN and closed the other gracefully */
};

/* Time a direction waits before asking the buffer pool again after a refusal. */
#define RELAY_BUF_RETRY_MS 20

/* With no idle timeout: how long a linger waits without acknowledgement progress. */
#define RELAY_LINGER_STALL_MS 60000

struct relay_params {
	enum ts_relay_mode mode;   /* TS_RELAY_SPLICE: splice when both fds >= 0 and pipes given */
	struct bufpool *bufs;      /* copy buffers, one per direction while in flight (required) */
	struct pipepool *pipes;    /* splice pipes (fds reserved through the pool); NULL = copy */
	struct budget *budget;     /* accounts the early-bytes copy (required if early_len) */
	uint32_t idle_ms;          /* 0 = no idle timeout */
	const uint8_t *early;      /* bytes already read from b, written to a first; copied */
	size_t early_len;
	struct relay_counters *counters; /* aggregate counters to add to; may be NULL */
};

/* The relay's final numbers, passed to done. */
struct relay_stats {
	uint64_t bytes[RELAY_DIRS];    /* delivered per direction */
	uint64_t splice_bytes, copy_bytes;
	uint64_t pipe_inflight[RELAY_DIRS]; /* bytes in the direction's pipe now */
	uint64_t buf_inflight[RELAY_DIRS];  /* bytes in the direction's buffer now */
	uint32_t pipes_held, bufs_held;
	bool splice[RELAY_DIRS];       /* the direction (still) uses splice */
	bool finished[RELAY_DIRS];     /* EOF delivered (shutdown_write done) */
	int err;                       /* ERROR_A/B: the -errno seen (0 for a FIN-less error) */
};

/* Called exactly once, from the loop (or from inside relay_cancel), after both streams were
 * closed or aborted and everything was freed: the relay handle is dead when this runs. */
typedef void (*relay_done_fn)(void *arg, enum relay_end reason, const struct relay_stats *st);

/* Start relaying between a and b. Takes ownership of both streams on success (and replaces
 * their callbacks); on failure (-EINVAL, -ENOMEM: no memory for the relay or its idle timer,
 * -ENOBUFS for the early bytes) owns nothing and calls nothing. *out (may be NULL) is valid until done runs. */
int relay_new(struct event_base *base, struct stream *a, struct stream *b,
	      const struct relay_params *p, relay_done_fn done, void *arg, struct relay **out)
	__attribute__((warn_unused_result));

/* End the relay now: abort both streams, free everything, call done(CANCELLED) before
 * returning. Must not be called from inside done. */
void relay_cancel(struct relay *r);

/* The relay's current numbers. */
void relay_get_stats(const struct relay *r, struct relay_stats *out);

#endif
