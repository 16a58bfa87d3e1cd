/* rps_auto.c — tun.rps "auto" on a loop (see rps_auto.h). */
#include "runtime/rps_auto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/rps_policy.h"
#include "core/tun.h"

static int64_t thread_cpu_ns(void)
{
	return ts_thread_cpu_ns();
}

int rps_auto_start(struct rps_auto *ra, struct tun *tun, struct log *lg, const char *who,
		   uint64_t bytes, char *err, size_t errlen)
{
	return rps_auto_start_clock(ra, tun, lg, who, bytes, thread_cpu_ns, err, errlen);
}

int rps_auto_start_clock(struct rps_auto *ra, struct tun *tun, struct log *lg, const char *who,
			 uint64_t bytes, int64_t (*cpu_ns)(void), char *err, size_t errlen)
{
	struct rps_policy_params prm;
	int64_t cpu;
	int ret;

	*ra = (struct rps_auto){ .tun = tun, .log = lg, .who = who, .cpu_ns = cpu_ns };
	if (!tun_rps_auto(tun))
		return 0;
	if ((cpu = cpu_ns()) <= 0) {
		/* Nothing to decide by: steering stays off. */
		log_warn(lg, "%s: no thread CPU clock: receive packet steering stays off", who);
		return 0;
	}
	rps_policy_defaults(&prm);
	if ((ret = rps_policy_new(&prm, ts_now_ns(), cpu, bytes, &ra->policy)) != 0)
		snprintf(err, errlen, "%s: receive packet steering: %s", who, strerror(-ret));
	return ret;
}

void rps_auto_tick(struct rps_auto *ra, int64_t now_ns, uint64_t bytes)
{
	char err[256];
	enum rps_action a;

	if (!ra->policy || !rps_policy_due(ra->policy, now_ns))
		return;
	bool trial = rps_policy_trial(ra->policy);
	uint64_t failed = rps_policy_trials_failed(ra->policy);

	a = rps_policy_sample(ra->policy, now_ns, ra->cpu_ns(), bytes);
	if (trial && !rps_policy_trial(ra->policy) && a == RPS_KEEP)
		log_debug(ra->log, "%s: receive packet steering paid (%+d%% bytes/s): kept on",
			  ra->who, rps_policy_last_trial_pct(ra->policy));
	if (a == RPS_KEEP)
		return;
	if (tun_set_rps(ra->tun, a == RPS_TURN_ON, err, sizeof(err)) == 0) {
		if (a == RPS_TURN_OFF && rps_policy_trials_failed(ra->policy) != failed)
			log_debug(ra->log, "%s: receive packet steering did not pay (%+d%% bytes/s): "
				  "off, next trial in %lld s at the earliest", ra->who,
				  rps_policy_last_trial_pct(ra->policy),
				  (long long)((rps_policy_retry_at_ns(ra->policy) - now_ns) /
					      TS_NS_PER_SEC));
		else
			log_debug(ra->log, "%s: loop thread %u%% busy: receive packet steering %s",
				  ra->who, rps_policy_busy_pct(ra->policy),
				  a == RPS_TURN_ON ? "on (trial)" : "off");
		return;
	}
	/* A failed "on" leaves it off; a failed "off" is tried once more. Either way the policy
	 * ends, and the log says where steering was left. */
	if (a == RPS_TURN_OFF && tun_set_rps(ra->tun, false, NULL, 0) == 0)
		log_warn(ra->log, "%s: %s (written on the second try); receive packet steering "
			 "stays off", ra->who, err);
	else
		log_warn(ra->log, "%s: %s: receive packet steering stays %s", ra->who, err,
			 tun_rps(ra->tun) ? "on" : "off");
	/* The policy counted the switch it asked for; count it only if it happened. */
	ra->switches = rps_policy_switches(ra->policy) -
		       (tun_rps(ra->tun) == (a == RPS_TURN_ON) ? 0 : 1);
	ra->trials_failed = rps_policy_trials_failed(ra->policy);
	ra->last_trial_pct = rps_policy_last_trial_pct(ra->policy);
	rps_policy_free(ra->policy);
	ra->policy = NULL;
}

void rps_auto_stop(struct rps_auto *ra)
{
	rps_policy_free(ra->policy);
	ra->policy = NULL;
}

bool rps_auto_active(const struct rps_auto *ra)
{
	return ra->policy != NULL;
}

uint64_t rps_auto_switches(const struct rps_auto *ra)
{
	return ra->policy ? rps_policy_switches(ra->policy) : ra->switches;
}

unsigned rps_auto_busy_pct(const struct rps_auto *ra)
{
	return ra->policy ? rps_policy_busy_pct(ra->policy) : 0;
}

uint64_t rps_auto_trials_failed(const struct rps_auto *ra)
{
	return ra->policy ? rps_policy_trials_failed(ra->policy) : ra->trials_failed;
}

int rps_auto_last_trial_pct(const struct rps_auto *ra)
{
	return ra->policy ? rps_policy_last_trial_pct(ra->policy) : ra->last_trial_pct;
}
