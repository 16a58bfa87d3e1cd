/* test_rps_policy.c — the tun.rps "auto" decision on synthetic clocks and byte counts: when it
 * tries steering, when a trial keeps it, the wait after one that did not pay, when it turns
 * steering off, the hold that stops it from flapping, and what it refuses. */
#include <criterion/criterion.h>
#include <errno.h>

#include "core/clock.h"
#include "core/rps_policy.h"

#define MS TS_NS_PER_MS
#define WIN (250 * MS)

#define RATE (1000 * 1000) /* bytes per window without steering */

struct sim {
	struct rps_policy *p;
	int64_t now, cpu;
	uint64_t bytes;
	uint64_t rate_off, rate_on; /* bytes per window with steering off / on */
};

static void sim_new(struct sim *s)
{
	struct rps_policy_params prm;

	rps_policy_defaults(&prm);
	s->now = 1000 * TS_NS_PER_SEC; /* any origin */
	s->cpu = 5 * TS_NS_PER_SEC;
	s->bytes = 123456789;
	s->rate_off = RATE;
	s->rate_on = RATE * 12 / 10; /* steering pays unless a test says otherwise */
	cr_assert_eq(rps_policy_new(&prm, s->now, s->cpu, s->bytes, &s->p), 0);
	cr_assert_not(rps_policy_on(s->p), "steering starts off");
}

/* One window of `pct` percent busy moving `bytes`; returns the policy's answer at its end. */
static enum rps_action window_bytes(struct sim *s, unsigned pct, uint64_t bytes)
{
	s->now += WIN;
	s->cpu += WIN * pct / 100;
	s->bytes += bytes;
	return rps_policy_sample(s->p, s->now, s->cpu, s->bytes);
}

/* One window at the rate of the current steering state. */
static enum rps_action window(struct sim *s, unsigned pct)
{
	return window_bytes(s, pct, rps_policy_on(s->p) ? s->rate_on : s->rate_off);
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

/* The trial right after RPS_TURN_ON (1 settling + 4 measured windows) at pct, kept. */
static void trial_kept(struct sim *s, unsigned pct)
{
	cr_assert(rps_policy_trial(s->p));
	cr_assert_eq(windows(s, 5, pct), RPS_KEEP);
	cr_assert_not(rps_policy_trial(s->p), "the trial is over");
	cr_assert(rps_policy_on(s->p), "and steering paid: kept on");
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
	trial_kept(&s, 100);
	cr_assert_eq(rps_policy_last_trial_pct(s.p), 20);
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
			s.bytes += 1000;
			cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu, s.bytes), RPS_KEEP);
		}
		s.cpu += end - s.now;
		s.now = end;
		enum rps_action a = rps_policy_sample(s.p, s.now, s.cpu, s.bytes);
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
	cr_assert_eq(rps_policy_hold_ns(s.p), TS_NS_PER_SEC);
	/* Quiet during the trial does not count (steering is meant to unload the thread); after
	 * it, 4 quiet windows (the 1 s hold has passed). */
	trial_kept(&s, 40);
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
	trial_kept(&s, 80);
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
		 * the window), but not before the 5 trial windows and 4 quiet ones after them. */
		unsigned n = (unsigned)(want / WIN) > 9 ? (unsigned)(want / WIN) : 9;
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
	cr_assert_eq(windows(&s, 9, 70), RPS_TURN_OFF, "the trial, then 4 windows at 70 < 75");
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
	cr_assert_eq(windows(&s, 9, 0), RPS_TURN_OFF);
	/* Back on exactly 10 s after going off: not a flap (flap means sooner than 10 s). */
	cr_assert_eq(windows(&s, 38, 0), RPS_KEEP);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(rps_policy_hold_ns(s.p), TS_NS_PER_SEC);
	cr_assert_eq(rps_policy_off_pct(s.p), 75);
	/* And 9.75 s is one. */
	cr_assert_eq(windows(&s, 9, 0), RPS_TURN_OFF);
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
	trial_kept(&s, 100);
	/* No traffic for a minute (no calls), then the first batch: one window of ~0 %. */
	s.now += 60 * TS_NS_PER_SEC;
	cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu, s.bytes), RPS_KEEP);
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
	cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu - TS_NS_PER_SEC, s.bytes), RPS_KEEP);
	cr_assert_eq(rps_policy_busy_pct(s.p), 0);
	rps_policy_free(s.p);
}

Test(rps_policy, nonsense_parameters_are_refused)
{
	struct rps_policy_params prm;
	struct rps_policy *p = (struct rps_policy *)1;

	rps_policy_defaults(&prm);
	cr_assert_eq(rps_policy_new(&prm, 0, 0, 0, &p), 0);
	rps_policy_free(p);
	struct rps_policy_params bad[17];
	for (int i = 0; i < 17; i++)
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
	bad[9].trial_windows = 0;
	bad[10].retry_min_ns = -1;
	bad[11].retry_min_ns = bad[11].retry_max_ns + 1;
	bad[12].gain_pct = 1001;
	bad[13].retry_min_ns = 0;
	bad[14].trial_windows = RPS_POLICY_WINDOWS_MAX + 1;
	bad[15].retry_max_ns = RPS_POLICY_WAIT_MAX_NS + 1;
	bad[16].hold_max_ns = RPS_POLICY_WAIT_MAX_NS + 1;
	for (int i = 0; i < 17; i++) {
		p = (struct rps_policy *)1;
		cr_assert_eq(rps_policy_new(&bad[i], 0, 0, 0, &p), -EINVAL, "case %d", i);
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

/* Unpaced senders on a busy machine: steering costs 10 %. Off again after the trial, and the
 * next trial waits 8 s, then 16, 32, 64, 128, 128 s; no flap bookkeeping (a failed trial is not
 * a flap). */
Test(rps_policy, a_trial_that_does_not_pay_turns_it_off_and_waits)
{
	struct sim s;
	unsigned wait_windows = 32; /* 8 s */

	sim_new(&s);
	s.rate_on = RATE * 9 / 10;
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	for (int i = 0; i < 7; i++) {
		cr_assert_eq(windows(&s, 5, 100), RPS_TURN_OFF, "trial %d: off after 5 windows", i);
		cr_assert_not(rps_policy_on(s.p));
		cr_assert_eq(rps_policy_trials_failed(s.p), (uint64_t)i + 1);
		cr_assert_eq(rps_policy_last_trial_pct(s.p), -10);
		cr_assert_eq(rps_policy_retry_at_ns(s.p), s.now + (int64_t)wait_windows * WIN);
		cr_assert_eq(windows(&s, wait_windows, 100), RPS_TURN_ON,
			     "trial %d: the next one after %u windows", i + 1, wait_windows);
		cr_assert_eq(rps_policy_hold_ns(s.p), TS_NS_PER_SEC, "not a flap");
		cr_assert_eq(rps_policy_off_pct(s.p), 75, "not a flap");
		wait_windows = wait_windows * 2 > 512 ? 512 : wait_windows * 2;
	}
	cr_assert_eq(rps_policy_switches(s.p), 15);
	rps_policy_free(s.p);
}

/* The trial must move gain_pct (5 %) more bytes per second than the busy windows before it. */
Test(rps_policy, the_gain_must_reach_five_percent)
{
	static const struct {
		uint64_t on;
		bool kept;
	} cases[] = { { RATE * 105 / 100, true }, { RATE * 105 / 100 - 1000, false },
		      { RATE * 3, true }, { RATE, false }, { 0, false } };

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sim s;
		sim_new(&s);
		s.rate_on = cases[i].on;
		cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON, "case %zu", i);
		cr_assert_eq(windows(&s, 5, 100), cases[i].kept ? RPS_KEEP : RPS_TURN_OFF,
			     "case %zu", i);
		cr_assert_eq(rps_policy_on(s.p), cases[i].kept, "case %zu", i);
		rps_policy_free(s.p);
	}
}

/* The first trial window is not measured (the switch settles); the baseline is the busy
 * windows just before the trial, not older ones. */
Test(rps_policy, settling_window_and_baseline)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(windows(&s, 3, 80), RPS_KEEP, "in the band: not a baseline");
	s.rate_off = RATE * 2;
	cr_assert_eq(window_bytes(&s, 80, RATE * 10), RPS_KEEP);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	/* The baseline is 2 x RATE per window; a settling window of nothing, then 2.2 x. */
	cr_assert_eq(window_bytes(&s, 100, 0), RPS_KEEP);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(window_bytes(&s, 100, RATE * 22 / 10), RPS_KEEP);
	cr_assert_eq(window_bytes(&s, 100, RATE * 22 / 10), RPS_KEEP);
	cr_assert(rps_policy_on(s.p));
	cr_assert_not(rps_policy_trial(s.p));
	cr_assert_eq(rps_policy_last_trial_pct(s.p), 10);
	rps_policy_free(s.p);
}

/* A second under 75 % after a failed trial means the load changed: the next busy spell gets a
 * trial at once, and the wait after it starts again at 8 s. A dip of less, or windows in the
 * band (75-90 %), do not clear it; neither does the flap-lowered threshold matter. */
Test(rps_policy, a_calm_second_clears_the_wait)
{
	struct sim s;

	sim_new(&s);
	s.rate_on = RATE / 2;
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 5, 100), RPS_TURN_OFF);
	cr_assert_eq(windows(&s, 2, 100), RPS_KEEP);
	cr_assert_eq(windows(&s, 3, 20), RPS_KEEP, "3 calm windows: not yet");
	cr_assert_eq(windows(&s, 6, 80), RPS_KEEP, "the band does not clear it either");
	cr_assert_eq(windows(&s, 2, 100), RPS_KEEP, "still waiting (13 of 32 windows)");
	cr_assert_eq(rps_policy_switches(s.p), 2);
	cr_assert_eq(windows(&s, 4, 20), RPS_KEEP, "a calm second");
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON, "a new load: tried at once");
	cr_assert_eq(windows(&s, 5, 100), RPS_TURN_OFF);
	cr_assert_eq(rps_policy_retry_at_ns(s.p), s.now + 8 * TS_NS_PER_SEC, "8 s again, not 16");
	/* A pause (one long calm window) clears it too. */
	s.now += 30 * TS_NS_PER_SEC;
	cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu, s.bytes), RPS_KEEP);
	s.rate_on = RATE * 2;
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON, "after a pause: tried at once");
	trial_kept(&s, 100);
	rps_policy_free(s.p);
}

/* The calm that clears the wait is counted after the trial: calm windows during it (steering
 * moved the work away, the very effect it is meant to have) do not count, or one calm window
 * after a failed trial would clear the wait and steering would flap. */
Test(rps_policy, calm_windows_of_the_trial_do_not_clear_the_wait)
{
	struct sim s;
	int64_t retry_at;

	sim_new(&s);
	s.rate_on = RATE / 2;
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 5, 40), RPS_TURN_OFF, "the trial failed");
	retry_at = rps_policy_retry_at_ns(s.p);
	cr_assert_eq(window(&s, 60), RPS_KEEP);
	cr_assert_eq(rps_policy_retry_at_ns(s.p), retry_at, "one calm window: still waiting");
	cr_assert_eq(windows(&s, 2, 100), RPS_KEEP, "not tried again yet");
	rps_policy_free(s.p);
}

/* A trial that cannot measure is dropped, not failed: a pause (no traffic, the stream ended), a
 * byte counter that went back, a baseline of no bytes. Steering off, no wait, no failure. */
Test(rps_policy, a_trial_without_a_measurement_is_dropped)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 2, 100), RPS_KEEP);
	s.now += 60 * TS_NS_PER_SEC; /* the pause */
	cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu, s.bytes), RPS_TURN_OFF);
	cr_assert_eq(rps_policy_trials_failed(s.p), 0);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON, "no wait");
	cr_assert_eq(window(&s, 100), RPS_KEEP);
	s.now += WIN;
	cr_assert_eq(rps_policy_sample(s.p, s.now, s.cpu + WIN, s.bytes - 1), RPS_TURN_OFF,
		     "the counter went back");
	s.cpu += WIN;
	s.bytes -= 1;
	cr_assert_eq(rps_policy_trials_failed(s.p), 0);
	s.rate_off = 0;
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 5, 100), RPS_TURN_OFF, "busy without moving a byte");
	cr_assert_eq(rps_policy_trials_failed(s.p), 0);
	rps_policy_free(s.p);
}

/* The baseline is the latest busy windows (at most 4), not older ones: the load doubled during
 * the wait after a failed trial, and steering that beats the old rate but not the new fails. */
Test(rps_policy, the_baseline_is_the_latest_busy_windows)
{
	struct sim s;

	sim_new(&s);
	s.rate_on = RATE / 2;
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 5, 100), RPS_TURN_OFF);
	cr_assert_eq(windows(&s, 28, 100), RPS_KEEP);
	s.rate_off = RATE * 2;
	s.rate_on = RATE * 18 / 10;
	cr_assert_eq(windows(&s, 4, 100), RPS_TURN_ON, "the wait is over");
	cr_assert_eq(windows(&s, 5, 100), RPS_TURN_OFF);
	cr_assert_eq(rps_policy_last_trial_pct(s.p), -10, "against 2 x RATE, the last 4 windows");
	rps_policy_free(s.p);
}

/* Quiet "off", back within 10 s, a failed trial, and the next trial within 10 s of the same
 * "off": one flap, not two. */
Test(rps_policy, one_quiet_off_is_one_flap)
{
	struct sim s;

	sim_new(&s);
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON);
	cr_assert_eq(windows(&s, 9, 0), RPS_TURN_OFF, "quiet");
	s.rate_on = RATE * 9 / 10;
	cr_assert_eq(windows(&s, 2, 100), RPS_TURN_ON, "back within 10 s: a flap");
	cr_assert_eq(rps_policy_hold_ns(s.p), 2 * TS_NS_PER_SEC);
	cr_assert_eq(windows(&s, 5, 100), RPS_TURN_OFF, "the trial did not pay");
	s.rate_on = RATE * 2;
	cr_assert_eq(windows(&s, 32, 100), RPS_TURN_ON, "9.75 s after the quiet off");
	cr_assert_eq(rps_policy_hold_ns(s.p), TS_NS_PER_SEC, "not a second flap");
	cr_assert_eq(rps_policy_off_pct(s.p), 75);
	rps_policy_free(s.p);
}
