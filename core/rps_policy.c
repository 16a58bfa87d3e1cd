/* rps_policy.c — the tun.rps "auto" decision (see rps_policy.h). */
#include "core/rps_policy.h"

#include <errno.h>
#include <stdlib.h>

#include "core/clock.h"

struct rps_policy {
	struct rps_policy_params prm;
	int64_t win_start_ns;   /* this window's start (wall) */
	int64_t win_cpu_ns;     /* the thread's CPU time then */
	unsigned busy_run;      /* consecutive windows >= on_pct */
	unsigned quiet_run;     /* consecutive windows < off_now */
	unsigned off_now;       /* the "quiet" threshold now: off_pct, halved by each flap */
	unsigned last_pct;
	bool on;
	bool ever_off;          /* off_since is meaningful (steering was turned off once) */
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
	};
}

int rps_policy_new(const struct rps_policy_params *params, int64_t now_ns, int64_t cpu_ns,
		   struct rps_policy **out)
{
	struct rps_policy *p;

	*out = NULL;
	if (params->window_ns <= 0 || params->on_windows == 0 || params->off_windows == 0 ||
	    params->on_pct > 100 || params->off_pct > params->on_pct ||
	    params->off_min_pct > params->off_pct ||
	    params->hold_min_ns < 0 || params->hold_min_ns > params->hold_max_ns ||
	    params->flap_ns < 0)
		return -EINVAL;
	if (!(p = calloc(1, sizeof(*p))))
		return -ENOMEM;
	p->prm = *params;
	p->win_start_ns = now_ns;
	p->win_cpu_ns = cpu_ns;
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
	p->on = true;
	p->on_since_ns = now_ns;
	p->busy_run = p->quiet_run = 0;
	p->switches++;
	return RPS_TURN_ON;
}

static enum rps_action turn_off(struct rps_policy *p, int64_t now_ns)
{
	p->on = false;
	p->ever_off = true;
	p->off_since_ns = now_ns;
	p->busy_run = p->quiet_run = 0;
	p->switches++;
	return RPS_TURN_OFF;
}

enum rps_action rps_policy_sample(struct rps_policy *p, int64_t now_ns, int64_t cpu_ns)
{
	int64_t wall = now_ns - p->win_start_ns;

	if (wall < p->prm.window_ns)
		return RPS_KEEP;
	p->last_pct = busy_pct(cpu_ns - p->win_cpu_ns, wall);
	p->win_start_ns = now_ns;
	p->win_cpu_ns = cpu_ns;
	p->busy_run = p->last_pct >= p->prm.on_pct ? p->busy_run + 1 : 0;
	p->quiet_run = p->last_pct < p->off_now ? p->quiet_run + 1 : 0;
	if (!p->on && p->busy_run >= p->prm.on_windows)
		return turn_on(p, now_ns);
	if (p->on && p->quiet_run >= p->prm.off_windows && now_ns - p->on_since_ns >= p->hold_ns)
		return turn_off(p, now_ns);
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
