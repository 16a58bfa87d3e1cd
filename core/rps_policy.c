/* rps_policy.c — the tun.rps "auto" decision (see rps_policy.h). */
#include "core/rps_policy.h"

#include <errno.h>
#include <stdlib.h>

#include "core/clock.h"

#define BASE_WINDOWS 4 /* the "off" rate a trial must beat: the last busy windows, at most 4 */

enum phase {
	PH_OFF,
	PH_TRIAL, /* on, measuring whether it pays */
	PH_ON,    /* on, and it paid */
};

struct rps_policy {
	struct rps_policy_params prm;
	int64_t win_start_ns;   /* this window's start (wall) */
	int64_t win_cpu_ns;     /* the thread's CPU time then */
	uint64_t win_bytes;     /* the byte counter then */
	enum phase phase;
	/* PH_OFF: the busy windows just before a trial (ring), what the trial must beat. */
	uint64_t base_bytes[BASE_WINDOWS];
	int64_t base_ns[BASE_WINDOWS];
	unsigned base_n, base_next;
	int64_t retry_at_ns;    /* no trial before this (after one that did not pay) */
	int64_t calm_ns;        /* PH_OFF: time in consecutive windows under off_pct */
	int64_t retry_ns;       /* the wait after the next trial that does not pay */
	/* PH_TRIAL */
	unsigned trial_win;     /* windows into the trial, the settling ones included */
	uint64_t trial_bytes;
	int64_t trial_ns;
	uint64_t trials_failed;
	int last_trial_pct;     /* the last trial's gain in percent (negative: a loss) */
	unsigned busy_run;      /* consecutive windows >= on_pct */
	unsigned quiet_run;     /* consecutive windows < off_now */
	unsigned off_now;       /* the "quiet" threshold now: off_pct, halved by each flap */
	unsigned last_pct;
	bool on;
	bool ever_off;          /* off_since is meaningful (steering went off for a quiet load) */
	int64_t on_since_ns;
	int64_t off_since_ns;
	int64_t hold_ns;
	uint64_t switches;
};

void rps_policy_defaults(struct rps_policy_params *p)
{
	*p = (struct rps_policy_params){
		.window_ns = 250 * TS_NS_PER_MS,
		.on_pct = 90,
		.off_pct = 75,
		.off_min_pct = 10,
		.on_windows = 2,
		.off_windows = 4,
		.hold_min_ns = TS_NS_PER_SEC,
		.hold_max_ns = 64 * TS_NS_PER_SEC,
		.flap_ns = 10 * TS_NS_PER_SEC,
		.settle_windows = 1,
		.trial_windows = 4,
		.gain_pct = 5,
		.retry_min_ns = 8 * TS_NS_PER_SEC,
		.retry_max_ns = 128 * TS_NS_PER_SEC,
	};
}

int rps_policy_new(const struct rps_policy_params *params, int64_t now_ns, int64_t cpu_ns,
		   uint64_t bytes, struct rps_policy **out)
{
	struct rps_policy *p;

	*out = NULL;
	if (params->window_ns <= 0 || params->on_windows == 0 || params->off_windows == 0 ||
	    params->on_pct > 100 || params->off_pct > params->on_pct ||
	    params->off_min_pct > params->off_pct ||
	    params->hold_min_ns < 0 || params->hold_min_ns > params->hold_max_ns ||
	    params->flap_ns < 0 || params->trial_windows == 0 || params->gain_pct > 1000 ||
	    params->settle_windows > RPS_POLICY_WINDOWS_MAX ||
	    params->trial_windows > RPS_POLICY_WINDOWS_MAX ||
	    params->retry_min_ns <= 0 || params->retry_min_ns > params->retry_max_ns ||
	    params->retry_max_ns > RPS_POLICY_WAIT_MAX_NS ||
	    params->hold_max_ns > RPS_POLICY_WAIT_MAX_NS || params->flap_ns > RPS_POLICY_WAIT_MAX_NS)
		return -EINVAL;
	if (!(p = calloc(1, sizeof(*p))))
		return -ENOMEM;
	p->prm = *params;
	p->win_start_ns = now_ns;
	p->win_cpu_ns = cpu_ns;
	p->win_bytes = bytes;
	p->retry_ns = params->retry_min_ns;
	p->hold_ns = params->hold_min_ns;
	p->off_now = params->off_pct;
	*out = p;
	return 0;
}

void rps_policy_free(struct rps_policy *p)
{
	free(p);
}

/* Busy percent of a window: CPU time over wall time, rounded down, capped at what fits. */
static unsigned busy_pct(int64_t cpu, int64_t wall)
{
	if (cpu <= 0 || wall <= 0)
		return 0;
	int64_t pct = cpu / (wall / 100 > 0 ? wall / 100 : 1);
	return pct > 1000 ? 1000u : (unsigned)pct;
}

static enum rps_action turn_on(struct rps_policy *p, int64_t now_ns)
{
	/* Back on soon after going off: the load sits on the edge (saturated without steering,
	 * quiet with it, because steering moved the work away). Stay on longer, and go off only
	 * for a clearly lower load next time. A return after a longer pause starts afresh. */
	if (p->ever_off && now_ns - p->off_since_ns < p->prm.flap_ns) {
		p->hold_ns = p->hold_ns * 2 < p->prm.hold_max_ns ? p->hold_ns * 2 : p->prm.hold_max_ns;
		p->off_now = p->off_now / 2 > p->prm.off_min_pct ? p->off_now / 2 : p->prm.off_min_pct;
	} else {
		p->hold_ns = p->prm.hold_min_ns;
		p->off_now = p->prm.off_pct;
	}
	p->ever_off = false; /* each quiet "off" counts as one flap at most */
	p->on = true;
	p->phase = PH_TRIAL;
	p->trial_win = 0;
	p->trial_bytes = 0;
	p->trial_ns = 0;
	p->on_since_ns = now_ns;
	p->busy_run = p->quiet_run = 0;
	p->switches++;
	return RPS_TURN_ON;
}

/* quiet: the load dropped (a later return within flap_ns is a flap); else a trial that did
 * not pay. */
static enum rps_action turn_off(struct rps_policy *p, int64_t now_ns, bool quiet)
{
	p->on = false;
	p->phase = PH_OFF;
	p->base_n = p->base_next = 0;
	if (quiet) {
		p->ever_off = true;
		p->off_since_ns = now_ns;
	}
	p->busy_run = p->quiet_run = 0;
	p->switches++;
	return RPS_TURN_OFF;
}

/* Bytes per second (0 when no time passed). */
static double rate(double bytes, int64_t ns)
{
	return ns > 0 ? bytes * 1e9 / (double)ns : 0.0;
}

/* A trial that measured nothing comparable (a pause, a counter that went back, no baseline):
 * steering off, neither a failure nor a wait. */
static enum rps_action abort_trial(struct rps_policy *p, int64_t now_ns)
{
	p->retry_at_ns = now_ns;
	return turn_off(p, now_ns, false);
}

/* One window of a trial: past the settling windows, add it up; at the end, steering stays on
 * if the trial windows together moved gain_pct more bytes per second than the busy windows
 * before it, else it goes off and the next trial waits (the wait doubling each time, up to
 * retry_max_ns). The thread's busy percent does not count here: steering is meant to lower
 * it. */
static enum rps_action trial_window(struct rps_policy *p, int64_t now_ns, uint64_t bytes,
				    int64_t wall)
{
	double bsum = 0;
	int64_t nsum = 0;

	if (wall > 2 * p->prm.window_ns) /* a pause (no traffic) is no measurement */
		return abort_trial(p, now_ns);
	if (++p->trial_win <= p->prm.settle_windows)
		return RPS_KEEP;
	p->trial_bytes += bytes;
	p->trial_ns += wall;
	if (p->trial_win < p->prm.settle_windows + p->prm.trial_windows)
		return RPS_KEEP;
	for (unsigned i = 0; i < p->base_n; i++) {
		bsum += (double)p->base_bytes[i];
		nsum += p->base_ns[i];
	}
	double on = rate((double)p->trial_bytes, p->trial_ns), off = rate(bsum, nsum);
	if (off <= 0) /* busy without moving a byte: nothing to compare with */
		return abort_trial(p, now_ns);
	/* Truncated toward zero, so the figure never reads as a pass when the trial failed. */
	double pct = (on - off) * 100.0 / off;
	p->last_trial_pct = (int)(pct > 1e6 ? 1e6 : pct);
	if (on * 100.0 >= off * (100.0 + p->prm.gain_pct)) {
		p->phase = PH_ON;
		p->quiet_run = 0; /* "off" counts from here */
		p->retry_ns = p->prm.retry_min_ns;
		return RPS_KEEP;
	}
	p->trials_failed++;
	p->retry_at_ns = now_ns + p->retry_ns;
	p->retry_ns = p->retry_ns > p->prm.retry_max_ns / 2 ? p->prm.retry_max_ns : p->retry_ns * 2;
	return turn_off(p, now_ns, false);
}

enum rps_action rps_policy_sample(struct rps_policy *p, int64_t now_ns, int64_t cpu_ns,
				  uint64_t bytes_total)
{
	int64_t wall = now_ns - p->win_start_ns;
	bool back = bytes_total < p->win_bytes; /* a caller bug: the counter went back */
	uint64_t bytes;

	if (wall < p->prm.window_ns)
		return RPS_KEEP;
	bytes = back ? 0 : bytes_total - p->win_bytes;
	p->last_pct = busy_pct(cpu_ns - p->win_cpu_ns, wall);
	p->win_start_ns = now_ns;
	p->win_cpu_ns = cpu_ns;
	p->win_bytes = bytes_total;
	p->busy_run = p->last_pct >= p->prm.on_pct ? p->busy_run + 1 : 0;
	p->quiet_run = p->last_pct < p->off_now ? p->quiet_run + 1 : 0;
	/* Calm counts with steering off only: during a trial or with steering on, a calm
	 * thread is steering's own effect, not the load gone. */
	p->calm_ns = p->phase == PH_OFF && p->last_pct < p->prm.off_pct ? p->calm_ns + wall : 0;
	switch (p->phase) {
	case PH_OFF:
		if (p->busy_run == 0 || back) {
			p->base_n = p->base_next = 0;
			/* Calm for off_windows' worth of time (a pause counts whole): the next
			 * busy spell may be another load, so it gets a trial of its own at once. */
			if (p->calm_ns >= (int64_t)p->prm.off_windows * p->prm.window_ns) {
				p->retry_at_ns = now_ns;
				p->retry_ns = p->prm.retry_min_ns;
			}
			return RPS_KEEP;
		}
		p->base_bytes[p->base_next] = bytes;
		p->base_ns[p->base_next] = wall;
		p->base_next = (p->base_next + 1) % BASE_WINDOWS;
		p->base_n += p->base_n < BASE_WINDOWS;
		if (p->busy_run >= p->prm.on_windows && now_ns >= p->retry_at_ns)
			return turn_on(p, now_ns);
		return RPS_KEEP;
	case PH_TRIAL:
		return back ? abort_trial(p, now_ns) : trial_window(p, now_ns, bytes, wall);
	case PH_ON:
		if (p->quiet_run >= p->prm.off_windows && now_ns - p->on_since_ns >= p->hold_ns)
			return turn_off(p, now_ns, true);
		return RPS_KEEP;
	}
	return RPS_KEEP;
}

bool rps_policy_due(const struct rps_policy *p, int64_t now_ns)
{
	return now_ns - p->win_start_ns >= p->prm.window_ns;
}

bool rps_policy_on(const struct rps_policy *p)
{
	return p->on;
}

unsigned rps_policy_busy_pct(const struct rps_policy *p)
{
	return p->last_pct;
}

uint64_t rps_policy_switches(const struct rps_policy *p)
{
	return p->switches;
}

int64_t rps_policy_hold_ns(const struct rps_policy *p)
{
	return p->hold_ns;
}

unsigned rps_policy_off_pct(const struct rps_policy *p)
{
	return p->off_now;
}

bool rps_policy_trial(const struct rps_policy *p)
{
	return p->phase == PH_TRIAL;
}

uint64_t rps_policy_trials_failed(const struct rps_policy *p)
{
	return p->trials_failed;
}

int rps_policy_last_trial_pct(const struct rps_policy *p)
{
	return p->last_trial_pct;
}

int64_t rps_policy_retry_at_ns(const struct rps_policy *p)
{
	return p->retry_at_ns;
}
