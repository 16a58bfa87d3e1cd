/* test_memback.c — memory back once traffic stops: armed only by enough bytes, never while
 * batches keep coming, one trim a second after the last batch, nothing armed after it (an idle
 * proxy never wakes for it), and a trickle does not arm it again. On the real clock and loop. */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>

#include "core/clock.h"
#include "core/evmem.h"
#include "runtime/memback.h"
#include "failalloc.h"

/* Run the loop for ms milliseconds, noting a batch (bytes so far) every step_ms if step_ms. */
static void run(struct event_base *base, struct memback *m, int ms, int step_ms, uint64_t *bytes,
		uint64_t per_step)
{
	int64_t end = ts_now_ns() + (int64_t)ms * 1000000;

	while (ts_now_ns() < end) {
		struct timeval tv = { 0, (step_ms ? step_ms : 10) * 1000 };

		event_base_loopexit(base, &tv);
		event_base_dispatch(base);
		if (step_ms) {
			*bytes += per_step;
			memback_note(m, ts_now_ns(), *bytes);
		}
	}
}

Test(memback, one_trim_a_second_after_the_traffic_stops)
{
	struct event_base *base = event_base_new();
	struct memback m;
	uint64_t bytes = 0;

	cr_assert_eq(memback_init(&m, base), 0);
	/* Less than MEMBACK_MIN_BYTES: not worth a trim, nothing armed. */
	memback_note(&m, ts_now_ns(), bytes += MEMBACK_MIN_BYTES / 2);
	cr_expect(!m.armed);
	/* A load: 1.5 s of batches, every 50 ms. Armed, no trim while they come. */
	run(base, &m, 1500, 50, &bytes, MEMBACK_MIN_BYTES / 4);
	cr_expect(m.armed);
	cr_expect_eq(ctr_get(&m.trims), 0, "a trim while traffic flowed");
	/* Quiet: one trim about a second after the last batch, then nothing armed. */
	run(base, &m, 600, 0, NULL, 0);
	cr_expect_eq(ctr_get(&m.trims), 0, "too early");
	run(base, &m, 700, 0, NULL, 0);
	cr_expect_eq(ctr_get(&m.trims), 1);
	cr_expect(!m.armed);
	cr_expect(!evtimer_pending(m.ev, NULL), "an idle proxy must not wake for it");
	/* A trickle (a few hundred bytes) after the trim does not arm it again. */
	run(base, &m, 300, 100, &bytes, 100);
	cr_expect(!m.armed);
	run(base, &m, 1200, 0, NULL, 0);
	cr_expect_eq(ctr_get(&m.trims), 1);
	memback_fini(&m);
	event_base_free(base);
}

static void count_hook(void *arg)
{
	(*(int *)arg)++;
}

/* The quiet hooks run once per quiet trim, never while batches come; a fifth is refused. */
Test(memback, hooks_run_at_the_quiet_trim)
{
	struct event_base *base = event_base_new();
	struct memback m;
	uint64_t bytes = 0;
	int a = 0, b = 0;

	cr_assert_eq(memback_init(&m, base), 0);
	cr_assert_eq(memback_on_quiet(&m, count_hook, &a), 0);
	cr_assert_eq(memback_on_quiet(&m, count_hook, &b), 0);
	cr_assert_eq(memback_on_quiet(&m, count_hook, &b), 0);
	cr_assert_eq(memback_on_quiet(&m, count_hook, &a), 0);
	cr_expect_eq(memback_on_quiet(&m, count_hook, &a), -ENOSPC);
	run(base, &m, 600, 50, &bytes, MEMBACK_MIN_BYTES / 2);
	cr_expect_eq(a + b, 0, "a hook while traffic flowed");
	run(base, &m, 1300, 0, NULL, 0);
	cr_expect_eq(ctr_get(&m.trims), 1);
	cr_expect_eq(a, 2);
	cr_expect_eq(b, 2);
	memback_fini(&m);
	event_base_free(base);
}

/* The quiet check's timer when libevent has no memory for it (a fresh loop's first timer makes
 * libevent's timer heap): a trim that cannot wait for the quiet is done at once, rather than
 * taken as armed with no timer behind it (no trim again for the process's life). */
Test(memback, a_trim_that_cannot_be_timed_is_done_at_once)
{
	struct event_base *base;
	struct memback m;
	int calls = 0;

	cr_assert_eq(evmem_install(), 0);
	failalloc_hold(true);
	cr_assert_not_null(base = event_base_new());
	cr_assert_eq(memback_init(&m, base), 0);
	cr_assert_eq(memback_on_quiet(&m, count_hook, &calls), 0);
	failalloc_hold(false);
	failalloc_arm(1); /* the timer heap's first allocation */
	memback_note(&m, ts_now_ns(), MEMBACK_MIN_BYTES);
	failalloc_arm(0);
	cr_assert(failalloc_fired(), "the timer needed no memory: nothing tested");
	cr_assert_eq(ctr_get(&m.trims), 1, "no trim, and no timer for one");
	cr_assert_eq(calls, 1);
	cr_assert(!m.armed);
	/* Memory back: the next load arms it as usual. */
	memback_note(&m, ts_now_ns(), 2 * MEMBACK_MIN_BYTES);
	cr_assert(m.armed);
	cr_assert(evtimer_pending(m.ev, NULL));
	memback_fini(&m);
	event_base_free(base);
}
