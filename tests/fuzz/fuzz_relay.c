/* fuzz_relay.c — libFuzzer target for the relay's state machine (dispatch/relay.c), copy mode.
 *
 * Two in-memory streams stand for the app's connection (a) and the outbound's (b); the input
 * scripts what their peers do and what their calls return. The fuzzer is the event loop: it
 * runs the libevent base that holds the relay's own events (finish, idle, retry, linger; the
 * base has no fd to watch) and calls the streams' callbacks level-triggered, as stream.h
 * promises. Time is virtual: this file provides clock_gettime for the monotonic clocks, so
 * the relay's idle accounting and libevent's timers both run on a clock that only the input
 * moves (a real clock would make runs irreproducible and timeouts unreachable).
 *
 * Input: a 4-byte configuration, then 2-byte operations [op][arg] (seed corpus:
 * tests/fuzz/make_corpus_relay.py). Configuration: byte 0 the idle timeout (bits 0-1: none,
 * 1 ms, 50 ms, 5 s), early bytes (bits 2-3: 0, 1, 300, 20000) and buffer size (bits 4-5: 1, 7,
 * 1460, 16384); byte 1 the buffer budget (bits 0-1: 1, 2, 3 or 1000 buffers; bit 7: shared
 * with the early bytes, which may then be refused) and pool size (bits 2-3: 1-4 buffers);
 * byte 2 which streams tell their room (write_room: bit 0 a, bit 1 b; the room is their send
 * window, SIZE_MAX once they failed), lend their buffers (peekv and skip: bit 2 a, bit 4 b)
 * and take iovecs (writev: bit 3 a, bit 5 b; a direction whose source lends and whose
 * destination takes iovecs gathers); byte 3 the loop's order (bit 0: b first; bit 1: run the base after each
 * callback), which streams report unacknowledged bytes (bits 2, 3), splice asked for (bit 4:
 * no fds, so copy all the same), the relay counters (bit 5). Operations: op bit 7 picks the
 * stream, op & 15:
 *   0 its peer sends size(arg) bytes          1 its peer sends FIN
 *   2 its send window opens by size(arg) (arg 255: for good)     3 the window closes
 *   4 reads return at most chunk(arg) bytes   5 the next read says -EAGAIN although readable
 *   6 reset, as a kernel socket reports it: the error once, to the first read or write (EPIPE
 *     when the peer's FIN came first, and reads then end with that FIN), later reads 0
 *   7 asynchronous error, as lwIP reports it: the error callback, then every call fails
 *   8 shutdown_write fails                    9 its peer acknowledges size(arg) bytes (arg
 *                                                bit 7: everything, FIN included)
 *  10 advance the clock by dur(arg)          11 run arg & 7 more loop iterations
 *  12 relay_cancel (arg & 15 == 15)          13 toggle running the base between callbacks
 *  14 its peer sends size(arg) bytes and FIN 15 nothing
 * Each operation is followed by one loop iteration. Then every peer finishes (FIN, open
 * window, everything acknowledged) and the loop runs, with the clock stepping forward whenever
 * nothing happens, until the relay ends; not ending within the bound is a failure.
 *
 * Invariants (abort on violation):
 *  - every byte written to a stream is the next byte of what the other side produced (b's early
 *    bytes first): nothing lost, reordered or duplicated, nothing invented;
 *  - shutdown_write(x) at most once, never followed by a write, and only after the other side's
 *    real FIN was read and every byte before it was written to x: a stream that failed before
 *    its FIN (a reset, a read error, the EOF of a kernel socket after a reset) never ends in a
 *    FIN downstream;
 *  - done runs exactly once, after both streams were closed or aborted, and no stream op or
 *    callback happens after a stream was closed or aborted;
 *  - the end matches the script: DONE only with both FINs delivered, both streams closed and no
 *    failure returned by any call; ERROR_A/B names the first stream that was seen to fail,
 *    which is aborted, and the other is closed gracefully only after it got the whole
 *    direction and FIN and reported nothing unacknowledged; IDLE only when nothing was written
 *    or acknowledged for the idle timeout; IDLE and CANCELLED abort both; without any failure
 *    in the script and without a timeout, the relay ends DONE;
 *  - the stats and counters agree with what the streams saw; at the end no buffer is held
 *    (pool and budget back to 0), the gauges are 0 and the base has no event left.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/bufpool.h"
#include "dispatch/relay.h"
#include "dispatch/stream.h"

#include "fake_clock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_DATA (48 * 1024) /* bytes a peer sends at most */
#define UNLIMITED UINT64_MAX
#define HEAL_ITERATIONS 20000

static void check(int cond)
{
	if (!cond)
		abort();
}

/* ---- the fake streams --------------------------------------------------------------------- */

struct fake {
	struct stream s; /* first: the relay holds &s */
	int idx;         /* 0 = a, 1 = b */
	bool open, closed, aborted;
	bool rd_int, wr_int;
	/* The peer's bytes toward the relay: byte k is gen(idx, k); read hands out [pos, avail). */
	uint64_t pos, avail;
	bool fin;      /* the peer's FIN follows avail */
	bool eof_told; /* read returned 0 for that FIN */
	size_t chunk;  /* most bytes per read, 0: no limit */
	bool eagain_once;
	/* The relay's bytes toward the peer. */
	uint64_t delivered, acked, wcap;
	bool shut, fin_acked, shut_fails;
	/* Failures: reset (kernel style, pending reported once), sticky (lwIP style). */
	bool reset;
	int pending, sticky;
	bool err_cb_due;
	bool fail_scripted; /* a reset, an error or a failing shutdown_write is in the script */
	bool truncated;     /* one that loses bytes: before the FIN was in (or, lwIP, read) */
	bool failed_op;    /* a call returned a failure (or a reset's EOF) */
	ssize_t unacked_min; /* least positive unacked reported */
	ssize_t unacked_last; /* last unacked reported; 1 until asked */
	bool has_unacked;
	struct stream_ops ops; /* ops_unacked or ops_plain, with write_room if it tells its room */
};

static struct fake F[2];
static struct event_base *base;
static int first_fail = -1;  /* the stream first seen to fail */
static uint64_t n_calls;     /* stream ops and callbacks: progress */
static int64_t start_ns, last_write_ns, last_ack_ns;
static int done_calls;
static enum relay_end done_reason;
static struct relay_stats done_st;
static bool cancelled;

static uint8_t gen(int idx, uint64_t k)
{
	uint64_t x = (k + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(idx + 1) * 0x632be59bd9b4e019ULL;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 32;
	return (uint8_t)x;
}

static uint8_t lent[2][MAX_DATA + 20000]; /* what peekv lends (f_peekv) */
static size_t last_peek[2];               /* bytes of it still lent */
static size_t lent_len[2];                /* bytes the last peekv filled */
static bool skipping;                     /* inside f_skip */

static struct fake *fk(const struct stream *s)
{
	struct fake *f = (struct fake *)s;

	check(f == &F[0] || f == &F[1]);
	check(f->open); /* nothing after close/abort */
	n_calls++;
	/* Views are valid until the next call on the stream: any call but the skip that takes
	 * them ends the loan and spoils the bytes, so a relay that wrote from stale views (or
	 * skipped after another call) is caught. */
	if (!skipping && lent_len[f->idx]) {
		memset(lent[f->idx], 0xee, lent_len[f->idx]);
		lent_len[f->idx] = last_peek[f->idx] = 0;
	}
	return f;
}

static void saw_fail(struct fake *f)
{
	if (first_fail < 0)
		first_fail = f->idx;
}

static void op_fail(struct fake *f)
{
	f->failed_op = true;
	saw_fail(f);
}

/* What a read of up to n bytes does now, for read and peekv alike: a failure or EOF to return
 * as it is (< 0 or 0; a pending error and eagain_once are used up, as a read does), or 1 with
 * *m the bytes it hands out, from f->pos. */
static ssize_t f_next(struct fake *f, size_t n, size_t *m)
{
	uint64_t left = f->avail - f->pos;

	check(n > 0);
	if (f->sticky) {
		op_fail(f);
		return f->sticky;
	}
	if (left == 0) {
		if (f->fin) {
			/* The FIN (also after a reset in CLOSE_WAIT: once the FIN is in, a kernel
			 * socket's reads say 0 before the error). */
			f->eof_told = true;
			return 0;
		}
		if (f->pending) {
			int err = f->pending;

			f->pending = 0;
			op_fail(f);
			return err;
		}
		if (f->reset) { /* a reset socket's reads end in 0: no FIN behind it */
			op_fail(f);
			return 0;
		}
		return -EAGAIN;
	}
	if (f->eagain_once) {
		f->eagain_once = false;
		return -EAGAIN;
	}
	*m = n < left ? n : (size_t)left;
	if (f->chunk && *m > f->chunk)
		*m = f->chunk;
	return 1;
}

static ssize_t f_read(struct stream *s, void *buf, size_t n)
{
	struct fake *f = fk(s);
	size_t m;
	ssize_t r = f_next(f, n, &m);

	if (r <= 0)
		return r;
	for (size_t i = 0; i < m; i++)
		((uint8_t *)buf)[i] = gen(f->idx, f->pos + i);
	f->pos += m;
	return (ssize_t)m;
}

static ssize_t f_write(struct stream *s, const void *buf, size_t n)
{
	struct fake *f = fk(s);
	const struct fake *o = &F[1 - f->idx];
	size_t m;

	check(n > 0 && !f->shut); /* nothing after the FIN */
	if (f->sticky) {
		op_fail(f);
		return f->sticky;
	}
	if (f->pending) {
		int err = f->pending;

		f->pending = 0;
		op_fail(f);
		return err;
	}
	if (f->reset) {
		op_fail(f);
		return -EPIPE;
	}
	if (f->wcap == 0)
		return -EAGAIN;
	m = f->wcap < n ? (size_t)f->wcap : n;
	/* Exactly the next bytes the other side produced, none that it did not. */
	check(f->delivered + m <= o->avail);
	for (size_t i = 0; i < m; i++)
		check(((const uint8_t *)buf)[i] == gen(o->idx, f->delivered + i));
	f->delivered += m;
	if (f->wcap != UNLIMITED)
		f->wcap -= m;
	last_write_ns = fake_now;
	return (ssize_t)m;
}

/* peekv as a read that takes nothing: the same failures and EOF, views of the next bytes in
 * pieces of 1, 1460, 7 and 20000 bytes (a pbuf queue's shapes), at most chunk bytes. */
static ssize_t f_peekv(struct stream *s, struct iovec *iov, int *cnt, size_t n)
{
	static const size_t piece[4] = { 1, 1460, 7, 20000 };
	struct fake *f = fk(s);
	size_t m, done = 0;
	ssize_t r;
	int k = 0;

	check(*cnt > 0);
	if ((r = f_next(f, n, &m)) <= 0)
		return r;
	check(m <= sizeof(lent[0]));
	for (size_t i = 0; i < m; i++)
		lent[f->idx][i] = gen(f->idx, f->pos + i);
	while (done < m && k < *cnt) {
		size_t c = piece[k % 4] < m - done ? piece[k % 4] : m - done;

		iov[k].iov_base = lent[f->idx] + done;
		iov[k].iov_len = c;
		done += c;
		k++;
	}
	*cnt = k;
	last_peek[f->idx] = lent_len[f->idx] = done;
	return (ssize_t)done;
}

/* Exactly what was lent, no more: the bytes are then read. */
static void f_skip(struct stream *s, size_t n)
{
	struct fake *f;

	skipping = true;
	f = fk(s);
	skipping = false;
	check(n > 0 && n <= last_peek[f->idx]);
	last_peek[f->idx] -= n;
	f->pos += n;
}

static ssize_t f_writev(struct stream *s, const struct iovec *iov, int cnt)
{
	static uint8_t flat[MAX_DATA + 20000];
	size_t n = 0;

	check(cnt > 0);
	for (int i = 0; i < cnt; i++) {
		check(n + iov[i].iov_len <= sizeof(flat));
		memcpy(flat + n, iov[i].iov_base, iov[i].iov_len);
		n += iov[i].iov_len;
	}
	return f_write(s, flat, n);
}

static int f_shutdown_write(struct stream *s)
{
	struct fake *f = fk(s);
	const struct fake *o = &F[1 - f->idx];

	check(!f->shut);
	/* A FIN only for the other side's real FIN, after every byte before it. */
	check(o->eof_told && o->fin && f->delivered == o->avail);
	if (f->sticky) {
		op_fail(f);
		return f->sticky;
	}
	if (f->reset || f->shut_fails) {
		op_fail(f);
		return -ENOTCONN;
	}
	f->shut = true;
	return 0;
}

static void f_set_interest(struct stream *s, bool rd, bool wr)
{
	struct fake *f = fk(s);

	f->rd_int = rd;
	f->wr_int = wr;
}

static int f_fd(const struct stream *s)
{
	fk(s);
	return -1;
}

static void f_gone(struct stream *s, bool graceful)
{
	struct fake *f = fk(s);

	f->open = false;
	f->closed = graceful;
	f->aborted = !graceful;
	f->rd_int = f->wr_int = false;
}

static void f_abort(struct stream *s)
{
	f_gone(s, false);
}

static void f_close(struct stream *s)
{
	f_gone(s, true);
}

static ssize_t f_unacked(const struct stream *s)
{
	struct fake *f = fk(s);
	ssize_t left;

	if (f->sticky) {
		op_fail(f);
		return f->sticky;
	}
	if (f->pending) { /* SO_ERROR reports the reset and clears it */
		int err = f->pending;

		f->pending = 0;
		op_fail(f);
		return err;
	}
	left = (ssize_t)(f->delivered - f->acked) + (f->shut && !f->fin_acked);
	if (left > 0 && left < f->unacked_min) {
		f->unacked_min = left;
		last_ack_ns = fake_now;
	}
	f->unacked_last = left;
	return left;
}

/* 0 exactly when writable() is false, as stream.h asks; a failed stream is not limited. */
static size_t f_write_room(const struct stream *s)
{
	const struct fake *f = fk(s);

	if (f->reset || f->sticky)
		return SIZE_MAX;
	return f->wcap > SIZE_MAX ? SIZE_MAX : (size_t)f->wcap;
}

static const struct stream_ops ops_unacked = {
	.read = f_read, .write = f_write, .shutdown_write = f_shutdown_write,
	.set_interest = f_set_interest, .fd = f_fd, .abort = f_abort, .close = f_close,
	.unacked = f_unacked,
};
static const struct stream_ops ops_plain = {
	.read = f_read, .write = f_write, .shutdown_write = f_shutdown_write,
	.set_interest = f_set_interest, .fd = f_fd, .abort = f_abort, .close = f_close,
};

static bool readable(const struct fake *f)
{
	return f->pos < f->avail || f->fin || f->reset || f->sticky;
}

static bool writable(const struct fake *f)
{
	return f->wcap > 0 || f->reset || f->sticky;
}

/* ---- the loop ------------------------------------------------------------------------------ */

static bool order_ba, base_between;

static int64_t base_ran_at = -1;

/* The relay's events: activated ones (finish) and timers due by the virtual clock. Every timer
 * the relay arms lies in the future, so with nothing active and the clock where it was at the
 * last run there is nothing to do (and no epoll_wait to pay for). */
static void run_base(void)
{
	if (base_ran_at == fake_now &&
	    event_base_get_num_events(base, EVENT_BASE_COUNT_ACTIVE) == 0)
		return;
	check(event_base_loop(base, EVLOOP_NONBLOCK) >= 0);
	base_ran_at = fake_now;
}

static void after_callback(void)
{
	n_calls++;
	if (base_between)
		run_base();
}

static void loop_once(void)
{
	run_base();
	for (int j = 0; j < 2; j++) {
		struct fake *f = &F[order_ba ? 1 - j : j];

		if (f->open && f->err_cb_due) {
			f->err_cb_due = false;
			if (f->s.cb.error) {
				saw_fail(f);
				f->s.cb.error(f->s.cb_arg, f->sticky);
				after_callback();
			}
		}
		if (f->open && f->rd_int && readable(f)) {
			f->s.cb.readable(f->s.cb_arg);
			after_callback();
		}
		if (f->open && f->wr_int && writable(f)) {
			f->s.cb.writable(f->s.cb_arg);
			after_callback();
		}
	}
	run_base();
}

static void on_done(void *arg, enum relay_end reason, const struct relay_stats *st)
{
	check(++done_calls == 1);
	check(!F[0].open && !F[1].open); /* both closed or aborted before done */
	done_reason = reason;
	done_st = *st;
}

/* ---- script operations --------------------------------------------------------------------- */

static uint64_t size_of(uint8_t arg)
{
	static const uint64_t s[16] = { 1, 2, 3, 7, 16, 100, 511, 512, 1000, 1460, 4096, 8192,
					16383, 16384, 16385, 30000 };

	return s[arg & 15];
}

static void peer_send(struct fake *f, uint64_t n)
{
	if (f->fin || f->reset || f->sticky)
		return;
	if (f->avail + n > MAX_DATA + 4096)
		n = MAX_DATA + 4096 - f->avail;
	f->avail += n;
}

static void peer_reset(struct fake *f, uint8_t arg)
{
	static const int errs[4] = { -ECONNRESET, -ETIMEDOUT, -EHOSTUNREACH, -ECONNRESET };

	if (f->reset || f->sticky)
		return;
	f->reset = true;
	/* Linux reports a reset in CLOSE_WAIT (the peer's FIN came first) as EPIPE. */
	f->pending = f->fin ? -EPIPE : errs[arg & 3];
}

static void peer_error(struct fake *f, uint8_t arg)
{
	if (f->reset || f->sticky)
		return;
	f->sticky = arg & 1 ? -ECONNABORTED : -ECONNRESET;
	f->avail = f->pos; /* lwIP drops what it queued */
	f->err_cb_due = true;
}

static void peer_ack(struct fake *f, uint8_t arg)
{
	if (f->reset || f->sticky)
		return;
	if (arg & 0x80) {
		f->acked = f->delivered;
		f->fin_acked = f->shut;
		return;
	}
	f->acked += size_of(arg);
	if (f->acked > f->delivered)
		f->acked = f->delivered;
}

static int64_t dur(uint8_t arg)
{
	static const int64_t d[16] = { 0, 1, MS - 1, MS, 2 * MS, 19 * MS, 20 * MS, 64 * MS,
				       100 * MS, 999 * MS, SEC, 5 * SEC, 59 * SEC, 60 * SEC,
				       61 * SEC, 300 * SEC };

	return d[arg & 15];
}

static bool failure_scripted;

static void fail_script(struct fake *f, bool truncating)
{
	failure_scripted = true;
	f->fail_scripted = true;
	f->truncated |= truncating;
}

static void script_op(struct relay *r, uint8_t op, uint8_t arg)
{
	struct fake *f = &F[op >> 7];

	switch (op & 15) {
	case 0:
		peer_send(f, size_of(arg));
		break;
	case 1:
		if (!f->reset && !f->sticky)
			f->fin = true;
		break;
	case 2:
		f->wcap = arg == 255 ? UNLIMITED : f->wcap == UNLIMITED ? UNLIMITED :
			  f->wcap + size_of(arg);
		break;
	case 3:
		f->wcap = 0;
		break;
	case 4: {
		static const size_t c[8] = { 0, 1, 2, 3, 100, 1460, 4096, 0 };

		f->chunk = c[arg & 7];
		break;
	}
	case 5:
		f->eagain_once = true;
		break;
	case 6:
		/* A kernel socket keeps what it received before the RST readable. */
		if (!f->reset && !f->sticky)
			fail_script(f, !f->fin);
		peer_reset(f, arg);
		break;
	case 7:
		/* lwIP drops its queue: only a FIN already read survives. */
		if (!f->reset && !f->sticky)
			fail_script(f, !f->eof_told);
		peer_error(f, arg);
		break;
	case 8:
		fail_script(f, false);
		f->shut_fails = true;
		break;
	case 9:
		peer_ack(f, arg);
		break;
	case 10:
		fake_now += dur(arg);
		break;
	case 11:
		for (int i = 0; i < (arg & 7); i++)
			loop_once();
		break;
	case 12:
		if ((arg & 15) == 15 && done_calls == 0) {
			cancelled = true;
			relay_cancel(r);
			check(done_calls == 1);
		}
		break;
	case 13:
		base_between = !base_between;
		break;
	case 14:
		peer_send(f, size_of(arg));
		if (!f->reset && !f->sticky)
			f->fin = true;
		break;
	default:
		break;
	}
}

/* Every peer finishes: FIN, a window that never closes, everything acknowledged. */
static void heal(void)
{
	for (int i = 0; i < 2; i++) {
		struct fake *f = &F[i];

		f->fin |= !f->reset && !f->sticky;
		f->wcap = UNLIMITED;
		f->chunk = 0;
	}
}

static void heal_acks(void)
{
	for (int i = 0; i < 2; i++)
		if (!F[i].reset && !F[i].sticky) {
			F[i].acked = F[i].delivered;
			F[i].fin_acked = F[i].shut;
		}
}

/* ---- the end ------------------------------------------------------------------------------- */

static void check_end(const struct relay_counters *ctr, bool have_ctr, uint32_t idle_ms,
		      size_t early_len)
{
	const struct fake *a = &F[0], *b = &F[1];
	enum relay_end why = done_reason;

	check(done_calls == 1 && why < RELAY_END_MAX);
	/* What done reports is what the streams saw. */
	check(done_st.bytes[RELAY_UP] == b->delivered && done_st.bytes[RELAY_DOWN] == a->delivered);
	check(done_st.copy_bytes == a->delivered + b->delivered && done_st.splice_bytes == 0);
	check(done_st.finished[RELAY_UP] == b->shut && done_st.finished[RELAY_DOWN] == a->shut);
	check(!done_st.splice[RELAY_UP] && !done_st.splice[RELAY_DOWN]);
	switch (why) {
	case RELAY_DONE:
		check(a->closed && b->closed && a->shut && b->shut);
		check(!a->failed_op && !b->failed_op);
		break;
	case RELAY_ERROR_A:
	case RELAY_ERROR_B: {
		int x = why == RELAY_ERROR_A ? 0 : 1;
		const struct fake *fx = &F[x], *fy = &F[1 - x];

		check(first_fail == x);
		check(fx->aborted);
		/* Closed gracefully only with the whole direction, its FIN and the peer's ack. */
		if (fy->closed)
			check(fy->shut && (!fy->has_unacked || fy->unacked_last == 0));
		break;
	}
	case RELAY_IDLE:
		check(idle_ms > 0);
		{
			int64_t last = start_ns;

			if (last_write_ns > last)
				last = last_write_ns;
			if (last_ack_ns > last)
				last = last_ack_ns;
			check(fake_now - last >= (int64_t)idle_ms * MS);
		}
		check(a->aborted && b->aborted);
		break;
	case RELAY_CANCELLED:
		check(cancelled && a->aborted && b->aborted);
		break;
	default:
		check(0);
	}
	if (!failure_scripted && !cancelled && idle_ms == 0)
		check(why == RELAY_DONE); /* nothing failed, nothing timed out: a clean end */
	if (why == RELAY_DONE) /* everything arrived both ways */
		check(b->delivered == a->avail && a->delivered == b->avail);
	/* A stream whose failures lost nothing (a reset after its FIN, a failing shutdown, an
	 * lwIP error after its FIN was read) still delivers its whole direction and FIN to a
	 * healthy other side, which is closed gracefully once it acknowledged everything
	 * (unless a timeout ended the wait: the idle timeout, or a linger without
	 * acknowledgement for RELAY_LINGER_STALL_MS, possible only in a run that long). */
	for (int y = 0; y < 2; y++) {
		const struct fake *fy = &F[y], *fx = &F[1 - y];

		if (!fy->fail_scripted || fy->truncated || fx->fail_scripted || cancelled ||
		    idle_ms != 0 || fake_now - start_ns >= RELAY_LINGER_STALL_MS * MS)
			continue;
		check(why == RELAY_DONE || why == (y == 0 ? RELAY_ERROR_A : RELAY_ERROR_B));
		check(fx->closed && fx->shut && fx->delivered == fy->avail);
	}
	if (have_ctr) {
		bool drained = (why == RELAY_ERROR_A || why == RELAY_ERROR_B) &&
			       (a->closed || b->closed);

		check(ctr_get(&ctr->active) == 0);
		check(ctr_get(&ctr->buf_bytes_inflight) == 0);
		check(ctr_get(&ctr->pipe_bytes_inflight) == 0);
		check(ctr_get(&ctr->ends[why]) == 1);
		check(ctr_get(&ctr->bytes[RELAY_UP]) == b->delivered);
		check(ctr_get(&ctr->bytes[RELAY_DOWN]) == a->delivered);
		check(ctr_get(&ctr->copy_bytes) == a->delivered + b->delivered);
		check(ctr_get(&ctr->drained_ends) == (uint64_t)drained);
		/* Gathered: every byte of a direction whose source lends into a destination that
		 * takes iovecs (b's early bytes, written first, excepted), nothing else. */
		{
			uint64_t up = a->ops.peekv && b->ops.writev ? b->delivered : 0;
			uint64_t down = b->ops.peekv && a->ops.writev && a->delivered > early_len
						? a->delivered - early_len : 0;

			check(ctr_get(&ctr->gather_bytes) == up + down);
		}
	}
}

static void fake_init(struct fake *f, int idx, bool has_unacked, bool tells_room, bool lends,
		      bool takes_iov)
{
	memset(f, 0, sizeof(*f));
	last_peek[idx] = lent_len[idx] = 0;
	f->ops = has_unacked ? ops_unacked : ops_plain;
	if (tells_room)
		f->ops.write_room = f_write_room;
	if (lends) {
		f->ops.peekv = f_peekv;
		f->ops.skip = f_skip;
	}
	if (takes_iov)
		f->ops.writev = f_writev;
	f->s.ops = &f->ops;
	f->idx = idx;
	f->open = true;
	f->unacked_min = SSIZE_MAX;
	f->unacked_last = 1;
	f->has_unacked = has_unacked;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint32_t idles[4] = { 0, 1, 50, 5000 };
	static const size_t bufsz[4] = { 1, 7, 1460, 16384 };
	static const size_t earlies[4] = { 0, 1, 300, 20000 };
	struct budget_limits lim;
	struct budget *budget = NULL;
	struct bufpool *pool = NULL;
	struct relay_counters ctr;
	struct relay_params p;
	struct budget_stats bs;
	struct bufpool_stats ps;
	struct relay *r = NULL;
	uint8_t early[20000];
	int ret;

	if (size < 4)
		return 0;
	fake_now = 1000 * SEC;
	base_ran_at = -1;
	first_fail = -1;
	n_calls = 0;
	done_calls = 0;
	cancelled = false;
	failure_scripted = false;
	order_ba = data[3] & 1;
	base_between = data[3] & 2;
	fake_init(&F[0], 0, data[3] & 4, data[2] & 1, data[2] & 4, data[2] & 8);
	fake_init(&F[1], 1, data[3] & 8, data[2] & 2, data[2] & 16, data[2] & 32);

	memset(&p, 0, sizeof(p));
	memset(&ctr, 0, sizeof(ctr));
	p.mode = data[3] & 16 ? TS_RELAY_SPLICE : TS_RELAY_COPY; /* no fds: copy either way */
	p.idle_ms = idles[data[0] & 3];
	p.early_len = earlies[(data[0] >> 2) & 3];
	p.counters = data[3] & 32 ? &ctr : NULL;
	for (size_t i = 0; i < p.early_len; i++)
		early[i] = gen(1, i); /* b's stream starts with them */
	p.early = early;
	F[1].pos = F[1].avail = p.early_len;

	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	{
		size_t bs_ = bufsz[(data[0] >> 4) & 3];
		static const uint64_t mult[4] = { 1, 2, 3, 1000 };

		/* Budget for 1-3 buffers besides the early bytes, or plenty (never none: a relay
		 * that can never hold a buffer waits for one until its idle timeout); with bit 7,
		 * the early bytes must share that room or are refused. */
		lim.buffer_bytes = (data[1] & 0x80 ? 1 : p.early_len + 1) + mult[data[1] & 3] * bs_;
		check(budget_new(&lim, &budget) == 0);
		check(bufpool_new(budget, "relay", bs_, 1 + ((data[1] >> 2) & 3), &pool) == 0);
	}
	p.bufs = pool;
	p.budget = budget;
	base = event_base_new();
	check(base != NULL);
	start_ns = last_write_ns = last_ack_ns = fake_now;

	ret = relay_new(base, &F[0].s, &F[1].s, &p, on_done, NULL, &r);
	if (ret != 0) {
		/* Only the early bytes can be refused; then nothing was taken or called. */
		check(ret == -ENOBUFS && p.early_len > 0 && r == NULL);
		check(F[0].open && F[1].open && done_calls == 0 && n_calls == 0);
		goto out;
	}
	for (size_t i = 4; i + 1 < size && done_calls == 0; i += 2) {
		script_op(r, data[i], data[i + 1]);
		if (done_calls == 0)
			loop_once();
	}
	/* The peers finish; the relay must end. The clock steps forward only when nothing
	 * happens, doubling up to 1 s so a 60 s linger stall is reached in a few dozen steps. */
	heal();
	{
		int64_t step = MS;

		for (int i = 0; i < HEAL_ITERATIONS && done_calls == 0; i++) {
			uint64_t before = n_calls;

			loop_once();
			heal_acks();
			if (n_calls == before) {
				fake_now += step;
				step = step < SEC ? step * 2 : SEC;
			} else {
				step = MS;
			}
		}
	}
	check(done_calls == 1);
	check_end(&ctr, p.counters != NULL, p.idle_ms, p.early_len);
out:
	check(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED | EVENT_BASE_COUNT_ACTIVE) ==
	      0);
	bufpool_get_stats(pool, &ps);
	check(ps.bufs_in_use == 0);
	bufpool_free(pool);
	budget_get_stats(budget, &bs);
	check(bs.buffer_bytes_in_use == 0 && bs.malloc_bytes_in_use == 0);
	budget_free(budget);
	event_base_free(base);
	base = NULL;
	return 0;
}
