/* rps_auto.h — tun.rps "auto" on a loop: the policy (core/rps_policy.h) fed with the loop
 * thread's CPU time and the bytes it moved, and applied to the TUN's rps_cpus. Shared by the
 * proxy and `twinstack reflect`, so the reflector baseline sees the same kernel behaviour as the stacks. Loop
 * thread only. */
#ifndef TS_RUNTIME_RPS_AUTO_H
#define TS_RUNTIME_RPS_AUTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct log;
struct rps_policy;
struct tun;

struct rps_auto {
	struct rps_policy *policy; /* NULL: not following the load (not "auto", or ended) */
	uint64_t switches;         /* kept when a failed sysfs write ended the policy */
	uint64_t trials_failed;    /* likewise */
	int last_trial_pct;        /* likewise */
	struct tun *tun;
	struct log *log;
	int64_t (*cpu_ns)(void);   /* the loop thread's CPU clock (tests pass their own) */
	const char *who;           /* log prefix: "run", "reflect" */
};

/* Start following the load when tun_rps_auto(tun), from the loop's thread (its CPU clock is
 * the one read). No thread CPU clock: a warning, steering stays off. 0, or -errno with err. */
int rps_auto_start(struct rps_auto *ra, struct tun *tun, struct log *lg, const char *who,
		   uint64_t bytes, char *err, size_t errlen) __attribute__((warn_unused_result));
/* The same with the thread CPU clock passed in (ts_thread_cpu_ns for rps_auto_start). */
int rps_auto_start_clock(struct rps_auto *ra, struct tun *tun, struct log *lg, const char *who,
			 uint64_t bytes, int64_t (*cpu_ns)(void), char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* Once per batch, with a running count of the bytes the loop moved through the TUN: cheap
 * until a window is complete; then sample and apply. A sysfs write that fails ends the policy,
 * logged once with where steering was left. */
void rps_auto_tick(struct rps_auto *ra, int64_t now_ns, uint64_t bytes);
void rps_auto_stop(struct rps_auto *ra);

/* For /stats and the exit line: following the load now, switches so far, the busy percent of
 * the last window (0 when not following), trials that did not pay and the last trial's gain in
 * percent (kept when a failed sysfs write ended the policy). */
bool rps_auto_active(const struct rps_auto *ra);
uint64_t rps_auto_switches(const struct rps_auto *ra);
unsigned rps_auto_busy_pct(const struct rps_auto *ra);
uint64_t rps_auto_trials_failed(const struct rps_auto *ra);
int rps_auto_last_trial_pct(const struct rps_auto *ra);

#endif
