/* test_relay_clock.c — the relay's timers on a virtual clock (dispatch/relay.c).
 *
 * test_relay.c drives real sockets on the real clock; here two in-memory streams and a clock
 * the test moves by hand reach instants a real run hits only by chance. This file provides
 * clock_gettime for the monotonic clocks while a test has the virtual clock on, so the relay's
 * idle accounting (CLOCK_MONOTONIC_COARSE) and libevent's timers both read it.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/bufpool.h"
#include "dispatch/relay.h"
#include "dispatch/stream.h"
#include "testutil.h"

int clock_gettime(clockid_t id, struct timespec *ts);

/* Clock reads a loop may make at one instant before the clock moves on by itself: a relay that
 * keeps a timer due at the same instant would otherwise spin forever here. */
#define SPIN_READS 1000

static bool clock_on;
static int64_t now_ns;
static unsigned reads;

int clock_gettime(clockid_t id, struct timespec *ts)
{
	if (clock_on && (id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE)) {
		if (++reads > SPIN_READS)
			now_ns += MS(1); /* the escape hatch; the test checks it was never needed */
		ts->tv_sec = now_ns / SEC(1);
		ts->tv_nsec = now_ns % SEC(1);
		return 0;
	}
	return (int)syscall(SYS_clock_gettime, id, ts);
}

/* A stream with `avail` bytes to read (then -EAGAIN) that accepts every write. */
struct mem {
	struct stream s;
	size_t avail, written;
	bool rd, wr, gone, aborted;
};

static ssize_t m_read(struct stream *s, void *buf, size_t n)
{
	struct mem *m = (struct mem *)s;
	size_t k = m->avail < n ? m->avail : n;

	if (k == 0)
		return -EAGAIN;
	memset(buf, 'x', k);
	m->avail -= k;
	return (ssize_t)k;
}

static ssize_t m_write(struct stream *s, const void *buf, size_t n)
{
	((struct mem *)s)->written += n;
	return (ssize_t)n;
}

static int m_shutdown(struct stream *s)
{
	return 0;
}

static void m_interest(struct stream *s, bool rd, bool wr)
{
	((struct mem *)s)->rd = rd;
	((struct mem *)s)->wr = wr;
}

static int m_fd(const struct stream *s)
{
	return -1;
}

static void m_abort(struct stream *s)
{
	((struct mem *)s)->gone = ((struct mem *)s)->aborted = true;
}

static void m_close(struct stream *s)
{
	((struct mem *)s)->gone = true;
}

static const struct stream_ops mem_ops = {
	.read = m_read, .write = m_write, .shutdown_write = m_shutdown,
	.set_interest = m_interest, .fd = m_fd, .abort = m_abort, .close = m_close,
};

static int done_calls;
static enum relay_end done_reason;

static void on_done(void *arg, enum relay_end reason, const struct relay_stats *st)
{
	done_calls++;
	done_reason = reason;
}

TestSuite(relay_clock, .timeout = 30);

/* The idle timer fires when the timeout has passed since the relay was made, but bytes moved
 * 300 ns after that: 300 ns remain. Re-armed for 300 ns rounded down to whole microseconds,
 * the timer was due at once, fired, found the same 300 ns left (the clock had not moved) and
 * was re-armed again: a busy loop until the coarse clock ticked (up to a few milliseconds of
 * a whole core on a real clock, which reads in jiffies). It must wait for the clock to move,
 * then end the relay IDLE. */
Test(relay_clock, idle_remainder_below_a_microsecond_does_not_spin)
{
	struct budget_limits lim;
	struct budget *b;
	struct bufpool *pool;
	struct event_base *base;
	struct relay *r;
	struct mem sa = { .s.ops = &mem_ops, .avail = 1 }, sb = { .s.ops = &mem_ops };
	struct relay_params p = { .mode = TS_RELAY_COPY, .idle_ms = 5 };
	struct budget_stats bs;
	unsigned spin;

	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&lim, &b), 0);
	cr_assert_eq(bufpool_new(b, "relay", 64, 2, &pool), 0);
	p.bufs = pool;
	now_ns = SEC(1000);
	clock_on = true;
	cr_assert_not_null(base = event_base_new());
	cr_assert_eq(relay_new(base, &sa.s, &sb.s, &p, on_done, NULL, &r), 0);
	cr_assert(sa.rd, "the relay waits for a's bytes");

	now_ns += 300;
	sa.s.cb.readable(sa.s.cb_arg); /* one byte a -> b: activity 300 ns after the start */
	cr_assert_eq(sb.written, 1);

	now_ns += MS(5) - 300; /* the first timer is due; 300 ns of the timeout remain */
	reads = 0;
	cr_assert_neq(event_base_loop(base, EVLOOP_NONBLOCK), -1);
	spin = reads;
	cr_assert_eq(done_calls, 0, "300 ns of the idle timeout remain: ended %s",
		     relay_end_name(done_reason));
	cr_assert(spin <= SPIN_READS, "the idle timer kept firing at one instant (%u clock reads)",
		  spin);

	now_ns += MS(1);
	cr_assert_neq(event_base_loop(base, EVLOOP_NONBLOCK), -1);
	cr_assert_eq(done_calls, 1);
	cr_assert_eq(done_reason, RELAY_IDLE);
	cr_assert(sa.aborted && sb.aborted, "an idle end aborts both");
	cr_assert_eq(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED), 0);
	event_base_free(base);
	clock_on = false;
	bufpool_free(pool);
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 0);
	budget_free(b);
}
