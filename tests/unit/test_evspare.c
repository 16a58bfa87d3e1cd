/* test_evspare.c — the place held in libevent's timer heap (core/evspare.h): a timer the full
 * heap cannot take for want of memory is added in the spare's place, the spare held again once
 * the heap can grow; without a spare held the add fails; release gives the place back. With
 * evmem installed, so that the heap's growth is an allocation the test can refuse. */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>

#include "core/evmem.h"
#include "core/evspare.h"
#include "failalloc.h"

static struct event_base *base;
static struct evspare sp;
static struct event *ev;
static struct event *pads[64];
static int npads;

static void on_ev(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

static void setup(void)
{
	cr_assert_eq(evmem_install(), 0);
	base = event_base_new();
	cr_assert_not_null(base);
	cr_assert_eq(evspare_init(&sp, base), 0);
	cr_assert_not_null(ev = evtimer_new(base, on_ev, NULL));
	npads = 0;
}

static void teardown(void)
{
	failalloc_unpad(pads, npads);
	event_free(ev);
	evspare_fini(&sp);
	evspare_fini(&sp); /* idempotent */
	event_base_free(base);
}

TestSuite(evspare, .init = setup, .fini = teardown);

static const struct timeval SOON = { 10, 0 };

Test(evspare, hold_and_release)
{
	cr_assert_not(evspare_held(&sp), "not held before the first hold");
	cr_assert(evspare_hold(&sp));
	cr_assert(evspare_held(&sp));
	cr_assert(evspare_hold(&sp), "holding again changes nothing");
	cr_assert_eq(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED), 1);
	evspare_release(&sp);
	cr_assert_not(evspare_held(&sp));
	cr_assert_eq(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED), 0,
		     "released: nothing pending");
	evspare_release(&sp);
}

Test(evspare, an_add_with_room_leaves_the_spare_held)
{
	cr_assert(evspare_hold(&sp));
	cr_assert_eq(evspare_add(&sp, ev, &SOON), 0);
	cr_assert(evtimer_pending(ev, NULL));
	cr_assert(evspare_held(&sp));
}

/* The heap full and unable to grow: ev takes the spare's place; the spare, held again, makes
 * the heap grow (the one refusal is spent). */
Test(evspare, a_full_heap_that_cannot_grow_takes_the_spare_s_place)
{
	cr_assert(evspare_hold(&sp));
	npads = failalloc_fill_timers(base, pads, 64);
	failalloc_arm(1);
	cr_assert_eq(evspare_add(&sp, ev, &SOON), EVSPARE_SPENT);
	failalloc_arm(0);
	cr_assert(failalloc_fired(), "the add needed no memory: nothing tested");
	cr_assert(evtimer_pending(ev, NULL), "ev pending in the spare's place");
	cr_assert(evspare_held(&sp), "the spare held again once the heap could grow");
}

/* The heap full, no spare held: the add fails, and says so. */
Test(evspare, no_spare_held_the_add_fails)
{
	npads = failalloc_fill_timers(base, pads, 64);
	failalloc_arm(1);
	cr_assert_eq(evspare_add(&sp, ev, &SOON), -ENOMEM);
	failalloc_arm(0);
	cr_assert(failalloc_fired());
	cr_assert_not(evtimer_pending(ev, NULL));
	/* Memory back: the next add succeeds, and holds the spare. */
	cr_assert_eq(evspare_add(&sp, ev, &SOON), 0);
	cr_assert(evtimer_pending(ev, NULL));
	cr_assert(evspare_held(&sp));
}

/* A pending timer re-added keeps its own place: no memory needed, the spare untouched. */
Test(evspare, a_pending_timer_re_added_needs_no_memory)
{
	cr_assert_eq(evspare_add(&sp, ev, &SOON), 0);
	npads = failalloc_fill_timers(base, pads, 64);
	failalloc_arm(1);
	cr_assert_eq(evspare_add(&sp, ev, &SOON), 0);
	failalloc_arm(0);
	cr_assert_not(failalloc_fired());
	cr_assert(evspare_held(&sp));
}
