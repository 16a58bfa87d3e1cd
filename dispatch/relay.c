/* relay.c — the two-direction relay: splice between kernel sockets, copy otherwise.
 *
 * Each direction alternates two phases: pull (read from its source into an empty buffer or
 * pipe) and push (write everything out to its destination). It only reads when nothing is in
 * flight, so interest is simple and never spins: read interest iff empty and not at EOF,
 * write interest iff bytes are pending. A copy reads no more than the destination says it
 * has room for (stream_write_room; an lwIP pcb's share of the send buffers): what it cannot
 * take stays in the source, held back by the source's own flow control, and the relay
 * buffer goes back to the pool within the same callback instead of sitting full for every
 * session whose destination is the bottleneck. A destination with no room at all gets write
 * interest in place of the source's read interest (room_wait). A callback runs a bounded
 * number of pull/push rounds (RELAY_ROUNDS) so one busy connection cannot starve the loop.
 * A source that lends its buffers (an lwIP stream) into a destination that takes iovecs (a
 * socket) is gathered instead (dir_gather): no buffer, no copy of the relay's own, and a full
 * destination waits for its writable (room_wait) with the bytes still in the source.
 *
 * Ending is deferred: a failure only records the reason, drops all interest and activates
 * finish_ev; the streams are closed/aborted and the relay freed from that event, never from
 * deep inside a stream callback whose caller still holds pointers.
 *
 * A stream that cannot be written any more (write or shutdown_write failed, or its error
 * callback ran) kills only the direction INTO it (side_failed): the other direction may still
 * carry a complete stream, e.g. a server that sent its whole response and FIN, then reset
 * because the client kept uploading. That direction goes on until its source's EOF, is
 * delivered in full and FINed; then the relay lingers until the healthy peer acknowledged
 * everything (stream_unacked, polled) and closes that stream gracefully. Whether the failed
 * stream's EOF is a real FIN: a kernel socket reports a reset once, to the first call, so a
 * write that got -ECONNRESET leaves later reads with a plain 0. The reset errno tells: Linux
 * reports a reset as EPIPE in CLOSE_WAIT (the peer's FIN came first) and ECONNRESET before
 * it (tcp_reset() in net/ipv4/tcp_input.c), so any write error other than -EPIPE is kept in
 * reset_err and turns a later EOF from that stream into the failure it is.
 */
#include "dispatch/relay.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/event.h>

#define RELAY_ROUNDS 16
#define RELAY_GATHER_IOV 64            /* views of the source's buffers per writev */
#define RELAY_GATHER_BYTES (256u << 10) /* the most one writev hands over */
#define RELAY_SINK_BYTES 8192      /* discard buffer of a dead direction, on the stack */
#define RELAY_LINGER_POLL_MIN_MS 1 /* the first poll of the lingering stream's unacked */
#define RELAY_LINGER_POLL_MAX_MS 64 /* the poll interval doubles up to this */

struct relay;

struct rdir {
	struct relay *r;
	enum relay_dir_id id;
	struct stream *src, *dst;
	bool splice;     /* this direction uses splice (both fds, pipes available) */
	bool eof;        /* src returned EOF */
	bool finished;   /* EOF delivered: shutdown_write(dst) done */
	bool buf_wait;   /* the buffer pool said no: wait for retry_ev */
	bool room_wait;  /* dst had no room: wait for its writable before reading src */
	bool dead;       /* dst failed: nothing more is delivered; src is read and discarded */
	bool gather;     /* src lends its buffers and dst takes them whole: no relay buffer */
	bool empty_pull; /* the last splice found nothing (see dir_pull_splice) */
	uint8_t *early;  /* early bytes (DOWN only), from budget_malloc */
	size_t early_len, early_off;
	uint8_t *buf;    /* copy buffer while held; bytes [head, tail) pending */
	size_t head, tail;
	struct pipepool_pipe *pipe; /* held while in_pipe > 0 (or within one callback) */
	size_t in_pipe;
	uint64_t bytes;
};

/* Callback argument: which stream (0 = a, 1 = b) the event is about. */
struct side {
	struct relay *r;
	int idx;
};

struct relay {
	struct stream *s[2];
	struct side side[2];
	struct rdir dir[RELAY_DIRS]; /* dir[i] reads stream i, writes stream 1 - i */
	struct bufpool *bufs;
	size_t buf_size;
	struct pipepool *pipes;
	struct budget *budget;
	struct relay_counters *ctr;
	struct relay_counters own_ctr; /* target of ctr when the caller passes none */
	struct event *finish_ev, *idle_ev, *retry_ev, *linger_ev;
	int64_t idle_ns, last_active_ns;
	bool moved;      /* bytes moved in this callback: refresh last_active_ns */
	bool ending;
	enum relay_end reason;
	int err;
	/* A stream failed but the other direction still delivers: the end waiting for it. */
	bool failed;
	enum relay_end fail_reason;
	int fail_err;
	int reset_err[2];   /* a write to stream i failed with this (not -EPIPE): its EOF is no FIN */
	bool graceful[2];   /* close stream i (not abort) even though the relay failed */
	int linger_side;    /* the stream whose acknowledgement the linger waits for */
	uint32_t linger_ms; /* the current poll interval */
	ssize_t linger_left; /* the least unacked seen so far */
	uint64_t splice_bytes, copy_bytes;
	relay_done_fn done;
	void *done_arg;
};

static const char *const end_names[RELAY_END_MAX] = {
	[RELAY_DONE] = "done",
	[RELAY_ERROR_A] = "error_a",
	[RELAY_ERROR_B] = "error_b",
	[RELAY_IDLE] = "idle",
	[RELAY_CANCELLED] = "cancelled",
	[RELAY_NO_MEMORY] = "no_memory",
};

const char *relay_end_name(enum relay_end e)
{
	return (unsigned)e < RELAY_END_MAX ? end_names[e] : "?";
}

/* Idle accounting only needs milliseconds; the coarse clock costs no syscall. */
static int64_t coarse_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void gauge_add(ctr_t *c, uint64_t n)
{
	ctr_add(c, n);
}

static void gauge_sub(ctr_t *c, uint64_t n)
{
	ctr_add(c, (uint64_t)0 - n); /* unsigned wrap-around: exact once the matching add is in */
}

/* ---- ending ------------------------------------------------------------------------------ */

static void relay_end(struct relay *r, enum relay_end reason, int err)
{
	if (r->ending)
		return;
	r->ending = true;
	r->reason = reason;
	r->err = err;
	stream_set_interest(r->s[0], false, false);
	stream_set_interest(r->s[1], false, false);
	event_active(r->finish_ev, EV_TIMEOUT, 0);
}

/* A stream failed: side 0 is a, 1 is b. */
static void relay_fail(struct relay *r, int side, int err)
{
	if (r->failed) /* the first failure names the end */
		relay_end(r, r->fail_reason, r->fail_err);
	else
		relay_end(r, side == 0 ? RELAY_ERROR_A : RELAY_ERROR_B, err);
}

static bool dir_pending(const struct rdir *d)
{
	return d->early_off < d->early_len || d->head < d->tail || d->in_pipe > 0;
}

/* Give back what the direction holds: an empty pipe for reuse, a pipe with bytes closed. */
static void dir_release(struct rdir *d)
{
	struct relay *r = d->r;

	if (d->pipe) {
		gauge_sub(&r->ctr->pipe_bytes_inflight, d->in_pipe);
		if (d->in_pipe == 0)
			pipepool_put(r->pipes, d->pipe);
		else
			pipepool_discard(r->pipes, d->pipe);
		d->pipe = NULL;
		d->in_pipe = 0;
	}
	if (d->buf) {
		gauge_sub(&r->ctr->buf_bytes_inflight, d->tail - d->head);
		bufpool_put(r->bufs, d->buf);
		d->buf = NULL;
		d->head = d->tail = 0;
	}
	if (d->early) {
		gauge_sub(&r->ctr->buf_bytes_inflight, d->early_len - d->early_off);
		budget_mfree(r->budget, d->early);
		d->early = NULL;
		d->early_len = d->early_off = 0;
	}
}

static void fill_stats(const struct relay *r, struct relay_stats *st)
{
	memset(st, 0, sizeof(*st));
	for (int i = 0; i < RELAY_DIRS; i++) {
		const struct rdir *d = &r->dir[i];
		st->bytes[i] = d->bytes;
		st->pipe_inflight[i] = d->in_pipe;
		st->buf_inflight[i] = (d->tail - d->head) + (d->early_len - d->early_off);
		st->pipes_held += d->pipe != NULL;
		st->bufs_held += d->buf != NULL;
		st->splice[i] = d->splice;
		st->finished[i] = d->finished;
	}
	st->splice_bytes = r->splice_bytes;
	st->copy_bytes = r->copy_bytes;
	st->err = r->err;
}

static void free_events(struct relay *r)
{
	if (r->linger_ev)
		event_free(r->linger_ev);
	if (r->finish_ev)
		event_free(r->finish_ev);
	if (r->idle_ev)
		event_free(r->idle_ev);
	if (r->retry_ev)
		event_free(r->retry_ev);
}

static void relay_destroy(struct relay *r)
{
	struct relay_stats st;
	relay_done_fn done = r->done;
	void *arg = r->done_arg;
	enum relay_end reason = r->reason;

	fill_stats(r, &st);
	for (int i = 0; i < RELAY_DIRS; i++)
		dir_release(&r->dir[i]);
	for (int i = 0; i < 2; i++) {
		/* Only a clean end closes gracefully: any failure must reach the app as a RST,
		 * never as an EOF that looks like a complete response; except a stream that got
		 * its whole direction and FIN and acknowledged them (on_linger). */
		if (reason == RELAY_DONE || r->graceful[i])
			stream_close(r->s[i]);
		else
			stream_abort(r->s[i]);
	}
	free_events(r);
	gauge_sub(&r->ctr->active, 1);
	ctr_inc(&r->ctr->ends[reason]);
	free(r);
	done(arg, reason, &st);
}

static void on_finish(evutil_socket_t fd, short what, void *arg)
{
	relay_destroy(arg);
}

void relay_cancel(struct relay *r)
{
	if (!r->ending) {
		r->ending = true;
		r->reason = RELAY_CANCELLED;
	}
	relay_destroy(r);
}

/* ---- a failed stream: the surviving direction, then the linger ---------------------------- */

/* A linger no poll can be timed for would wait for good: the relay ends (both aborted). */
static void linger_arm(struct relay *r)
{
	struct timeval tv = { 0, (long)r->linger_ms * 1000 };

	if (evtimer_add(r->linger_ev, &tv) != 0)
		relay_end(r, RELAY_NO_MEMORY, -ENOMEM);
}

/* Direction d delivered everything and its FIN, and the other direction is dead, so nothing
 * more will come for d's destination. Close it only once its peer acknowledged all of it: a
 * TCP endpoint closed with unread input, or receiving more after close (the app may still be
 * uploading), answers with RST and drops what it had not delivered yet. */
static void linger_start(struct relay *r, const struct rdir *d)
{
	r->linger_side = 1 - (int)d->id;
	r->linger_ms = RELAY_LINGER_POLL_MIN_MS;
	r->linger_left = SSIZE_MAX;
	linger_arm(r);
}

/* Polls with a doubling interval. Acknowledgement progress counts as activity for the idle
 * timer, which ends a linger the peer stopped acknowledging (RELAY_LINGER_STALL_MS when the
 * relay has no idle timeout); such an end, or a peer that failed meanwhile, aborts. */
static void on_linger(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	ssize_t left;
	int64_t now;

	if (r->ending)
		return;
	left = stream_unacked(r->s[r->linger_side]);
	now = coarse_now_ns();
	if (left == 0) {
		r->graceful[r->linger_side] = true;
		ctr_inc(&r->ctr->drained_ends);
	}
	if (left <= 0) {
		relay_end(r, r->fail_reason, r->fail_err);
		return;
	}
	if (left < r->linger_left) {
		r->linger_left = left;
		r->last_active_ns = now;
	} else if (!r->idle_ns && now - r->last_active_ns >= RELAY_LINGER_STALL_MS * 1000000LL) {
		relay_end(r, r->fail_reason, r->fail_err);
		return;
	}
	if (r->linger_ms < RELAY_LINGER_POLL_MAX_MS)
		r->linger_ms *= 2;
	linger_arm(r);
}

/* Stream `side` can take nothing more. The direction into it dies: its bytes are dropped and
 * its source is from now on read only to discard (its peer may still be receiving the other
 * direction and must not stall on a full window). The direction out of it goes on: it ends
 * the relay with aborts if its next read fails (or sees the EOF of a reset, reset_err), or
 * finishes, and then the linger closes its destination gracefully. */
static void side_failed(struct relay *r, int side, int err)
{
	struct rdir *in = &r->dir[1 - side];
	struct rdir *out = &r->dir[side];

	if (r->ending || in->dead)
		return;
	if (!r->failed) {
		r->failed = true;
		r->fail_reason = side == 0 ? RELAY_ERROR_A : RELAY_ERROR_B;
		r->fail_err = err;
	}
	if (out->dead) { /* both streams failed: nothing left to deliver */
		relay_end(r, r->fail_reason, r->fail_err);
		return;
	}
	dir_release(in);
	in->dead = true;
	in->buf_wait = false;
	in->room_wait = false;
	if (out->finished)
		linger_start(r, out);
}

/* ---- one direction ----------------------------------------------------------------------- */

static void dir_delivered(struct rdir *d, size_t n, bool spliced)
{
	struct relay *r = d->r;

	d->bytes += n;
	ctr_add(&r->ctr->bytes[d->id], n);
	if (spliced) {
		r->splice_bytes += n;
		ctr_add(&r->ctr->splice_bytes, n);
		gauge_sub(&r->ctr->pipe_bytes_inflight, n);
	} else {
		r->copy_bytes += n;
		ctr_add(&r->ctr->copy_bytes, n);
		gauge_sub(&r->ctr->buf_bytes_inflight, n);
	}
	r->moved = true;
}

/* A write to d's destination failed with err (not -EAGAIN): the direction into it dies
 * (side_failed), and an error other than -EPIPE is kept as that stream's reset (see the top of
 * this file). Returns -1, for the caller to return. */
static int dir_write_failed(struct rdir *d, int err)
{
	struct relay *r = d->r;
	int side = 1 - (int)d->id;

	if (err != -EPIPE && !r->reset_err[side])
		r->reset_err[side] = err;
	side_failed(r, side, err);
	return -1;
}

/* Write pending bytes to dst. 0 (progress or -EAGAIN: see dir_pending), -1 if the relay ends
 * or the direction died. */
static int dir_push(struct rdir *d)
{
	struct relay *r = d->r;
	ssize_t n;

	if (d->early_off < d->early_len) {
		n = stream_write(d->dst, d->early + d->early_off, d->early_len - d->early_off);
		if (n > 0) {
			d->early_off += (size_t)n;
			dir_delivered(d, (size_t)n, false);
			if (d->early_off < d->early_len)
				return 0;
			budget_mfree(r->budget, d->early);
			d->early = NULL;
			d->early_len = d->early_off = 0;
		}
	} else if (d->head < d->tail) {
		n = stream_write(d->dst, d->buf + d->head, d->tail - d->head);
		if (n > 0) {
			d->head += (size_t)n;
			dir_delivered(d, (size_t)n, false);
			if (d->head == d->tail)
				d->head = d->tail = 0;
		}
	} else if (d->in_pipe > 0) {
		n = splice(d->pipe->rd, NULL, stream_fd(d->dst), NULL, d->in_pipe,
			   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
		if (n < 0)
			n = errno == EINTR ? -EAGAIN : -errno;
		else if (n == 0)
			n = -EIO; /* bytes in the pipe yet nothing moved: fail rather than spin */
		if (n > 0) {
			d->in_pipe -= (size_t)n;
			dir_delivered(d, (size_t)n, true);
		}
	} else {
		return 0;
	}
	if (n < 0 && n != -EAGAIN)
		return dir_write_failed(d, (int)n);
	return 0;
}

/* src returned 0: EOF, unless a write to src already reported its reset (the kernel then
 * answers reads with 0 too). 0, or -1 if the relay ends. */
static int dir_eof(struct rdir *d)
{
	int err = d->r->reset_err[d->id];

	if (err) {
		relay_fail(d->r, (int)d->id, err);
		return -1;
	}
	d->eof = true;
	return 0;
}

/* What a look into the source (peek, peekv) returned, as a pull returns it: 0 at EOF
 * (dir_eof, or -1 if that ends the relay) and for -EAGAIN, -1 after a failure; n > 0 bytes
 * to go on with. */
static ssize_t dir_peeked(struct rdir *d, ssize_t n)
{
	if (n == 0)
		return dir_eof(d);
	if (n == -EAGAIN)
		return 0;
	if (n < 0) {
		relay_fail(d->r, (int)d->id, (int)n);
		return -1;
	}
	return n;
}

/* The pool has no buffer: a source that can be looked into is passed straight to dst through
 * a buffer on the stack: peek, write what dst takes, then read exactly that from src. Bytes
 * waiting in the source may be what holds the budget (lwIP's received segments are charged to
 * it), and without this every relay could wait for a buffer that only draining them frees.
 * >0 bytes moved, 0 nothing now (no peek, nothing queued, dst full), -1 end. */
static ssize_t dir_pass(struct rdir *d)
{
	struct relay *r = d->r;
	uint8_t tmp[RELAY_SINK_BYTES];
	ssize_t n, w;

	if (!stream_can_peek(d->src))
		return 0;
	if ((n = dir_peeked(d, stream_peek(d->src, tmp, sizeof(tmp)))) <= 0)
		return n;
	w = stream_write(d->dst, tmp, (size_t)n);
	if (w == -EAGAIN)
		return 0;
	if (w < 0)
		return dir_write_failed(d, (int)w);
	if ((n = stream_read(d->src, tmp, (size_t)w)) != w) {
		relay_fail(r, (int)d->id, n < 0 ? (int)n : -EIO); /* peek promised these bytes */
		return -1;
	}
	gauge_add(&r->ctr->buf_bytes_inflight, (uint64_t)w);
	dir_delivered(d, (size_t)w, false);
	return w;
}

/* dst has no room now: wait for its writable before reading src again. */
static void dir_room_wait(struct rdir *d)
{
	d->room_wait = true;
	ctr_inc(&d->r->ctr->room_waits);
}

/* The most a pull may take now: most, or what dst says it has room for if less; 0 when it
 * has none at all (then the direction waits for room). */
static size_t dir_want(struct rdir *d, size_t most)
{
	size_t room = stream_write_room(d->dst);

	if (room == 0) {
		dir_room_wait(d);
		return 0;
	}
	return room < most ? room : most;
}

/* Read into an empty copy buffer, at most what dst has room for. >0 bytes, 0 nothing now
 * (EAGAIN, EOF, no buffer, no room), -1 end. */
static ssize_t dir_pull_copy(struct rdir *d)
{
	struct relay *r = d->r;
	size_t want = dir_want(d, r->buf_size);
	ssize_t n;

	if (want == 0)
		return 0;
	if (!d->buf) {
		d->buf = bufpool_get(r->bufs);
		if (!d->buf) {
			if ((n = dir_pass(d)) != 0 || d->eof)
				return n;
			d->buf_wait = true;
			ctr_inc(&r->ctr->buf_waits);
			if (!evtimer_pending(r->retry_ev, NULL)) {
				struct timeval tv = { 0, RELAY_BUF_RETRY_MS * 1000 };

				/* Nothing else would end the wait for a buffer. */
				if (evtimer_add(r->retry_ev, &tv) != 0) {
					relay_end(r, RELAY_NO_MEMORY, -ENOMEM);
					return -1;
				}
			}
			return 0;
		}
	}
	n = stream_read(d->src, d->buf, want);
	if (n > 0) {
		d->head = 0;
		d->tail = (size_t)n;
		gauge_add(&r->ctr->buf_bytes_inflight, (uint64_t)n);
		r->moved = true;
		return n;
	}
	if (n == 0)
		return dir_eof(d);
	if (n != -EAGAIN) {
		relay_fail(r, (int)d->id, (int)n);
		return -1;
	}
	return 0;
}

/* Gather: the source's queued bytes go to dst in one writev of views of the source's own
 * buffers (an lwIP pcb's received pbufs into a kernel socket): no relay buffer is held and
 * the relay copies nothing itself, and a socket takes up to RELAY_GATHER_BYTES per call
 * instead of one relay buffer's worth. What dst took is then skipped in the source; what it
 * did not stays there, held back by the source's flow control, and a short write or
 * -EAGAIN waits for dst's writable (room_wait). Same returns as dir_pull_copy. */
static ssize_t dir_gather(struct rdir *d)
{
	struct relay *r = d->r;
	struct iovec iov[RELAY_GATHER_IOV];
	size_t want = dir_want(d, RELAY_GATHER_BYTES);
	int cnt = RELAY_GATHER_IOV;
	ssize_t n, w;

	if (want == 0)
		return 0;
	if ((n = dir_peeked(d, stream_peekv(d->src, iov, &cnt, want))) <= 0)
		return n;
	w = stream_writev(d->dst, iov, cnt);
	if (w == -EAGAIN) {
		dir_room_wait(d);
		return 0;
	}
	if (w < 0)
		return dir_write_failed(d, (int)w);
	stream_skip(d->src, (size_t)w);
	gauge_add(&r->ctr->buf_bytes_inflight, (uint64_t)w); /* dir_delivered takes it off */
	ctr_add(&r->ctr->gather_bytes, (uint64_t)w);
	dir_delivered(d, (size_t)w, false);
	if (w < n)
		dir_room_wait(d); /* dst took what it had room for */
	return w;
}

/* The direction gives up on splice for good (no pipe, or splice unsupported) and copies. */
static void dir_fallback(struct rdir *d)
{
	d->splice = false;
	ctr_inc(&d->r->ctr->pipe_fallbacks);
}

/* Splice from src into an empty pipe. Same returns as dir_pull_copy. */
static ssize_t dir_pull_splice(struct rdir *d)
{
	struct relay *r = d->r;
	ssize_t n;

	if (!d->pipe && pipepool_get(r->pipes, &d->pipe) != 0) {
		d->pipe = NULL;
		dir_fallback(d);
		return dir_pull_copy(d);
	}
	n = splice(stream_fd(d->src), NULL, d->pipe->wr, NULL, d->pipe->cap,
		   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
	if (n > 0) {
		d->in_pipe = (size_t)n;
		d->empty_pull = false;
		gauge_add(&r->ctr->pipe_bytes_inflight, (uint64_t)n);
		r->moved = true;
		return n;
	}
	if (n == 0)
		return dir_eof(d);
	n = -errno;
	if (n == -EINTR)
		return 0;
	if (n == -EAGAIN) {
		int at_mark = 0;

		/* TCP urgent data: splice stops in front of the urgent byte and never steps over it
		 * (recv does), while the socket stays readable with the bytes behind it; the loop
		 * would spin without moving a byte. Two empty pulls in a row (a normal drain ends
		 * with one) and the socket at its urgent mark: this direction copies. */
		if (d->empty_pull && ioctl(stream_fd(d->src), SIOCATMARK, &at_mark) == 0 &&
		    at_mark) {
			pipepool_put(r->pipes, d->pipe); /* empty: nothing was spliced */
			d->pipe = NULL;
			dir_fallback(d);
			return dir_pull_copy(d);
		}
		d->empty_pull = true;
		return 0;
	}
	if (n == -EINVAL || n == -ENOSYS || n == -EOPNOTSUPP) {
		/* This socket type cannot splice; the pipe is empty, so nothing is lost. */
		pipepool_put(r->pipes, d->pipe);
		d->pipe = NULL;
		dir_fallback(d);
		return dir_pull_copy(d);
	}
	relay_fail(r, (int)d->id, (int)n);
	return -1;
}

static bool dir_wants_read(const struct rdir *d)
{
	return !d->eof && !d->buf_wait && !d->room_wait && !dir_pending(d);
}

/* dst's writable is wanted: bytes to deliver, or room to wait for before the next read. */
static bool dir_wants_write(const struct rdir *d)
{
	return dir_pending(d) || d->room_wait;
}

/* Propagate EOF after the data: shutdown_write(dst). Ends the relay when both finished; when
 * the other direction is dead, the linger decides. A failed shutdown consumes no pending
 * reset (reads still report it), so it leaves reset_err alone. */
static void dir_finish(struct rdir *d)
{
	struct relay *r = d->r;
	const struct rdir *o = &r->dir[1 - d->id];
	int ret;

	if ((ret = stream_shutdown_write(d->dst)) != 0) {
		side_failed(r, 1 - (int)d->id, ret);
		return;
	}
	d->finished = true;
	if (o->dead)
		linger_start(r, d);
	else if (o->finished)
		relay_end(r, RELAY_DONE, 0);
}

/* A dead direction reads its source only to throw the bytes away, until EOF. */
static void dir_discard(struct rdir *d)
{
	uint8_t sink[RELAY_SINK_BYTES];

	for (int round = 0; round < RELAY_ROUNDS && !d->eof; round++) {
		ssize_t n = stream_read(d->src, sink, sizeof(sink));

		if (n == -EAGAIN)
			return;
		if (n == 0)
			d->eof = true;
		else if (n < 0)
			relay_fail(d->r, (int)d->id, (int)n);
		if (n <= 0)
			return;
	}
}

/* Pull/push rounds until dst is full, src is empty, or the round budget is spent. */
static void dir_run(struct rdir *d)
{
	struct relay *r = d->r;

	if (d->dead) {
		dir_discard(d);
		return;
	}
	d->room_wait = false; /* asked again by the next pull */
	for (int round = 0; round < RELAY_ROUNDS; round++) {
		ssize_t n;

		if (dir_pending(d) && dir_push(d) != 0)
			return;
		if (dir_pending(d) || !dir_wants_read(d))
			break;
		n = d->splice ? dir_pull_splice(d) : d->gather ? dir_gather(d) : dir_pull_copy(d);
		if (n < 0)
			return;
		if (n == 0)
			break;
	}
	if (r->ending)
		return;
	/* Nothing in flight: hold no pipe and no buffer while idle. */
	if (!dir_pending(d)) {
		if (d->pipe) {
			pipepool_put(r->pipes, d->pipe);
			d->pipe = NULL;
		}
		if (d->buf) {
			bufpool_put(r->bufs, d->buf);
			d->buf = NULL;
		}
		if (d->eof && !d->finished)
			dir_finish(d);
	}
}

/* ---- interest and callbacks ---------------------------------------------------------------- */

static void relay_sync(struct relay *r)
{
	if (r->ending)
		return;
	if (r->moved) {
		r->moved = false;
		r->last_active_ns = coarse_now_ns();
	}
	for (int i = 0; i < 2; i++)
		stream_set_interest(r->s[i], dir_wants_read(&r->dir[i]),
				    dir_wants_write(&r->dir[1 - i]));
}

static void on_readable(void *arg)
{
	struct side *sd = arg;

	dir_run(&sd->r->dir[sd->idx]);
	relay_sync(sd->r);
}

static void on_writable(void *arg)
{
	struct side *sd = arg;

	dir_run(&sd->r->dir[1 - sd->idx]);
	relay_sync(sd->r);
}

/* The stream's connection is gone (lwIP: the pcb is freed, reads return the error from now
 * on): like a failed write, it ends only the direction into that stream; the other one goes on. */
static void on_error(void *arg, int err)
{
	struct side *sd = arg;
	struct relay *r = sd->r;

	if (!r->reset_err[sd->idx])
		r->reset_err[sd->idx] = err;
	side_failed(r, sd->idx, err);
	relay_sync(r);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;

	r->dir[0].buf_wait = r->dir[1].buf_wait = false;
	relay_sync(r);
}

/* In whole milliseconds, rounded up: the remainder is measured on the coarse clock, which moves
 * only once per tick, so a delay rounded down to nothing would make the timer due at once and
 * fire again and again, finding the same remainder, until that clock moved (a busy loop). */
static int arm_idle(struct relay *r, int64_t delay_ns)
{
	int64_t ms = (delay_ns + 999999) / 1000000;
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	return evtimer_add(r->idle_ev, &tv) == 0 ? 0 : -ENOMEM;
}

/* Re-armed for the remainder when bytes moved since it was set: no timer work per byte. A
 * remainder that cannot be timed ends the relay: nothing else would bound it. */
static void on_idle(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	int64_t left = r->last_active_ns + r->idle_ns - coarse_now_ns();

	if (left <= 0)
		relay_end(r, RELAY_IDLE, 0);
	else if (arm_idle(r, left) != 0)
		relay_end(r, RELAY_NO_MEMORY, -ENOMEM);
}

/* ---- creation ------------------------------------------------------------------------------ */

static int relay_alloc(struct event_base *base, const struct relay_params *p, struct relay **out)
{
	struct relay *r = calloc(1, sizeof(*r));
	int ret = -ENOMEM;

	if (!r)
		return -ENOMEM;
	r->finish_ev = event_new(base, -1, 0, on_finish, r);
	r->idle_ev = evtimer_new(base, on_idle, r);
	r->retry_ev = evtimer_new(base, on_retry, r);
	r->linger_ev = evtimer_new(base, on_linger, r);
	if (!r->finish_ev || !r->idle_ev || !r->retry_ev || !r->linger_ev)
		goto fail;
	/* A relay its idle timeout cannot bound is not started. */
	r->idle_ns = (int64_t)p->idle_ms * 1000000LL;
	if (r->idle_ns && arm_idle(r, r->idle_ns) != 0)
		goto fail;
	if (p->early_len) {
		r->dir[RELAY_DOWN].early = budget_malloc(p->budget, p->early_len);
		if (!r->dir[RELAY_DOWN].early) {
			ret = -ENOBUFS;
			goto fail;
		}
		memcpy(r->dir[RELAY_DOWN].early, p->early, p->early_len);
		r->dir[RELAY_DOWN].early_len = p->early_len;
	}
	*out = r;
	return 0;
fail:
	free_events(r);
	free(r);
	return ret;
}

int relay_new(struct event_base *base, struct stream *a, struct stream *b,
	      const struct relay_params *p, relay_done_fn done, void *arg, struct relay **out)
{
	static const struct stream_cbs cbs = { on_readable, on_writable, on_error };
	struct relay *r;
	bool splice;
	int ret;

	if (out)
		*out = NULL;
	if (!base || !a || !b || !p || !p->bufs || !done || (p->early_len && (!p->early ||
								       !p->budget)))
		return -EINVAL;
	if ((ret = relay_alloc(base, p, &r)) != 0)
		return ret;
	splice = p->mode == TS_RELAY_SPLICE && p->pipes && stream_fd(a) >= 0 &&
		 stream_fd(b) >= 0;
	r->s[0] = a;
	r->s[1] = b;
	r->bufs = p->bufs;
	r->buf_size = bufpool_buf_size(p->bufs);
	r->pipes = p->pipes;
	r->budget = p->budget;
	r->ctr = p->counters ? p->counters : &r->own_ctr;
	r->done = done;
	r->done_arg = arg;
	for (int i = 0; i < RELAY_DIRS; i++) {
		struct rdir *d = &r->dir[i];
		d->r = r;
		d->id = (enum relay_dir_id)i;
		d->src = r->s[i];
		d->dst = r->s[1 - i];
		d->splice = splice;
		d->gather = !splice && stream_can_gather(d->src, d->dst);
		r->side[i].r = r;
		r->side[i].idx = i;
		stream_set_callbacks(r->s[i], &cbs, &r->side[i]);
	}
	gauge_add(&r->ctr->buf_bytes_inflight, p->early_len);
	gauge_add(&r->ctr->active, 1);
	r->last_active_ns = coarse_now_ns();
	relay_sync(r);
	if (out)
		*out = r;
	return 0;
}

void relay_get_stats(const struct relay *r, struct relay_stats *out)
{
	fill_stats(r, out);
}
