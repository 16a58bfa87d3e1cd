/* test_rps_policy.c — the tun.rps "auto" decision on synthetic clocks: when it turns steering
 * on and off, the hold that stops it from flapping, and what it refuses. */
#include <criterion/criterion.h>
#include <errno.h>

#include "core/clock.h"
#include "core/rps_policy.h"

#define MS TS_NS_PER_MS
#define WIN (250 * MS)

struct sim {
	struct rps_policy *p;
	int64_t now, cpu;
};

static void sim_new(struct sim *s)
{
	struct rps_policy_params prm;

	rps_policy_defaults(&prm);
	s->now = 1000 * TS_NS_PER_SEC; /* any origin */
	s->cpu = 5 * TS_NS_PER_SEC;
	cr_assert_eq(rps_policy_new(&prm, s->now, s->cpu, &s->p), 0);
	cr_assert_not(rps_policy_on(s->p), "steering starts off");
}

/* One window of `pct` percent busy; returns the policy's answer at its end. */
static enum rps_action window(struct sim *s, unsigned pct)
{
	s->now += WIN;
	s->cpu += WIN * pct / 100;
	return rps_policy_sample(s->p, s->now, s->cpu);
}

/* n windows at pct; asserts every answer but the last is KEEP and returns the last. */
static enum rps_action windows(struct sim *s, unsigned n, unsigned pct)
{
	enum rps_action a = RPS_KEEP;

	for (unsigned i = 0; i < n; i++) {
		cr_assert_eq(a, RPS_KEEP, "window %u of %u at %u%%: early answer %d", i, n, pct, a);
		a = window(s, pct);
	}
	return a;
}

Test(rps_policy, saturated_thread_turns_it_on_after_two_windows)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(window(&s, 97), RPS_KEEP, "one busy window is not enough");
	cr_assert_eq(rps_policy_busy_pct(s.p), 97);
	cr_assert_eq(window(&s, 95), RPS_TURN_ON);
	cr_assert(rps_policy_on(s.p));
	cr_assert_eq(rps_policy_switches(s.p), 1);
	/* Saturated while on: stays on. */
	cr_assert_eq(windows(&s, 40, 100), RPS_KEEP);
	cr_assert(rps_policy_on(s.p));
	rps_policy_free(s.p);
}

Test(rps_policy, one_flow_with_room_never_turns_it_on)
{
	struct sim s;

	sim_new(&s);
	/* The one-upload case: the thread ~65-85 % busy, now and then a single 95 % window. */
	for (int i = 0; i < 400; i++)
		cr_assert_eq(window(&s, i % 7 == 0 ? 95 : 65 + (unsigned)(i % 20)), RPS_KEEP,
			     "window %d", i);
	cr_assert_not(rps_policy_on(s.p));
	cr_assert_eq(rps_policy_switches(s.p), 0);
	rps_policy_free(s.p);
}

Test(rps_policy, samples_inside_a_window_are_free)
{
	struct sim s;

	sim_new(&s);
	/* Hundreds of calls per window (one per batch) evaluate nothing until it is complete. */
	for (int w = 0; w < 2; w++) {
		int64_t end = s.now + WIN;
		for (int i = 1; i < 100; i++) {
			s.now += WIN / 100;
			s.cpu += WIN / 100;
			cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu), RPS_KEEP);
		}
		s.cpu += end - s.now;
		s.now = end;
		enum rps_action a = rps_policy_sample(s.p, s.now, s.cpu);
		cr_assert_eq(a, w == 0 ? RPS_KEEP : RPS_TURN_ON, "window %d", w);
		cr_assert_eq(rps_policy_busy_pct(s.p), 100);
	}
	rps_policy_free(s.p);
}

Test(rps_policy, room_again_turns_it_off_after_the_hold)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	/* Hold 1 s = 4 windows; 4 quiet windows right away reach the hold exactly. */
	cr_assert_eq(rps_policy_hold_ns(s.p), TS_NS_PER_SEC);
	cr_assert_eq(windows(&s, 3, 40), RPS_KEEP);
	cr_assert(rps_policy_on(s.p), "3 quiet windows are not enough");
	cr_assert_eq(window(&s, 40), RPS_TURN_OFF);
	cr_assert_not(rps_policy_on(s.p));
	cr_assert_eq(rps_policy_switches(s.p), 2);
	rps_policy_free(s.p);
}

Test(rps_policy, the_band_between_thresholds_keeps_the_state)
{
	struct sim s;

	sim_new(&s);
	/* 80 % is neither busy (>= 90) nor quiet (< 75): nothing moves either way. */
	cr_assert_eq(windows(&s, 50, 80), RPS_KEEP);
	cr_assert_not(rps_policy_on(s.p));
	cr_assert_eq(windows(&s, 2, 92), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 50, 80), RPS_KEEP);
	cr_assert(rps_policy_on(s.p));
	/* A busy window interrupts a quiet run: 3 quiet, 1 in the band, 3 quiet: still on. */
	cr_assert_eq(windows(&s, 3, 10), RPS_KEEP);
	cr_assert_eq(window(&s, 80), RPS_KEEP);
	cr_assert_eq(windows(&s, 3, 10), RPS_KEEP);
	cr_assert(rps_policy_on(s.p));
	cr_assert_eq(window(&s, 10), RPS_TURN_OFF);
	rps_policy_free(s.p);
}

Test(rps_policy, flapping_doubles_the_hold_up_to_its_cap)
{
	struct sim s;
	int64_t want = TS_NS_PER_SEC;

	sim_new(&s);
	unsigned thr[10] = { 75, 37, 18, 10, 10, 10, 10, 10, 10, 10 };

	for (int round = 0; round < 10; round++) {
		cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON, "round %d", round);
		cr_assert_eq(rps_policy_hold_ns(s.p), want, "round %d", round);
		cr_assert_eq(rps_policy_off_pct(s.p), thr[round], "round %d: threshold %u", round,
			     rps_policy_off_pct(s.p));
		/* Quiet from now on: off exactly when the hold has passed (it is a multiple of
		 * the window). */
		unsigned n = (unsigned)(want / WIN);
		cr_assert_eq(windows(&s, n, 0), RPS_TURN_OFF, "round %d after %u windows", round, n);
		want = want * 2 > 64 * TS_NS_PER_SEC ? 64 * TS_NS_PER_SEC : want * 2;
	}
	cr_assert_eq(rps_policy_hold_ns(s.p), 64 * TS_NS_PER_SEC);
	/* Off for longer than the flap interval: the next "on" starts from the shortest hold. */
	cr_assert_eq(windows(&s, 41, 0), RPS_KEEP);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(rps_policy_hold_ns(s.p), TS_NS_PER_SEC);
	cr_assert_eq(rps_policy_off_pct(s.p), 75);
	rps_policy_free(s.p);
}

/* The load the reviewer feared: 95 % busy without steering, 70 % with it (steering moved the
 * work away). One flap, then the threshold is below what the load shows: on for good. */
Test(rps_policy, an_edge_load_settles_on_on)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(windows(&s, 2, 95), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 4, 70), RPS_TURN_OFF, "70 < 75 after the 1 s hold");
	cr_assert_eq(windows(&s, 2, 95), RPS_TURN_ON, "saturated again without steering");
	cr_assert_eq(rps_policy_off_pct(s.p), 37);
	cr_assert_eq(windows(&s, 4000, 70), RPS_KEEP, "1000 s at 70 %%: stays on");
	cr_assert(rps_policy_on(s.p));
	cr_assert_eq(rps_policy_switches(s.p), 3);
	/* The load really goes away: off, after the (doubled) hold. */
	cr_assert_eq(windows(&s, 4, 5), RPS_TURN_OFF);
	rps_policy_free(s.p);
}

Test(rps_policy, the_flap_interval_is_strict)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 4, 0), RPS_TURN_OFF);
	/* Back on exactly 10 s after going off: not a flap (flap means sooner than 10 s). */
	cr_assert_eq(windows(&s, 38, 0), RPS_KEEP);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(rps_policy_hold_ns(s.p), TS_NS_PER_SEC);
	cr_assert_eq(rps_policy_off_pct(s.p), 75);
	/* And 9.75 s is one. */
	cr_assert_eq(windows(&s, 4, 0), RPS_TURN_OFF);
	cr_assert_eq(windows(&s, 37, 0), RPS_KEEP);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(rps_policy_hold_ns(s.p), 2 * TS_NS_PER_SEC);
	rps_policy_free(s.p);
}

Test(rps_policy, a_pause_counts_as_one_quiet_window)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	/* No traffic for a minute (no calls), then the first batch: one window of ~0 %. */
	s.now += 60 * TS_NS_PER_SEC;
	cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu), RPS_KEEP);
	cr_assert_eq(rps_policy_busy_pct(s.p), 0);
	cr_assert_eq(windows(&s, 3, 0), RPS_TURN_OFF, "the pause and 3 quiet windows make 4");
	rps_policy_free(s.p);
}

Test(rps_policy, clocks_that_do_not_move_forward_are_harmless)
{
	struct sim s;

	sim_new(&s);
	/* CPU time that goes backwards (a caller bug) reads as an idle window. */
	s.now += WIN;
	cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu - TS_NS_PER_SEC), RPS_KEEP);
	cr_assert_eq(rps_policy_busy_pct(s.p), 0);
	rps_policy_free(s.p);
}

Test(rps_policy, nonsense_parameters_are_refused)
{
	struct rps_policy_params prm;
	struct rps_policy *p = (struct rps_policy *)1;

	rps_policy_defaults(&prm);
	cr_assert_eq(rps_policy_new(&prm, 0, 0, &p), 0);
	rps_policy_free(p);
	struct rps_policy_params bad[9];
	for (int i = 0; i < 9; i++)
		bad[i] = prm;
	bad[0].window_ns = 0;
	bad[1].on_windows = 0;
	bad[2].off_windows = 0;
	bad[3].off_pct = 95; /* above on_pct */
	bad[4].on_pct = 101;
	bad[5].hold_min_ns = bad[5].hold_max_ns + 1;
	bad[6].hold_min_ns = -1;
	bad[7].flap_ns = -1;
	bad[8].off_min_pct = 80; /* above off_pct */
	for (int i = 0; i < 9; i++) {
		p = (struct rps_policy *)1;
		cr_assert_eq(rps_policy_new(&bad[i], 0, 0, &p), -EINVAL, "case %d", i);
		cr_assert_null(p, "case %d: *out cleared", i);
	}
}

Test(rps_policy, due_only_once_a_window_is_complete)
{
	struct sim s;

	sim_new(&s);
	cr_assert_not(rps_policy_due(s.p, s.now));
	cr_assert_not(rps_policy_due(s.p, s.now + WIN - 1));
	cr_assert(rps_policy_due(s.p, s.now + WIN));
	cr_assert_eq(window(&s, 50), RPS_KEEP);
	cr_assert_not(rps_policy_due(s.p, s.now), "a new window started at the sample");
	rps_policy_free(s.p);
}
