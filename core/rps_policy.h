/* rps_policy.h — when receive packet steering pays: the decision behind tun.rps "auto".
 *
 * Every packet the proxy writes into the TUN is received by the kernel. Without receive packet
 * steering (RPS) that receive work runs inside the proxy's write(), on the loop's thread; with it,
 * the kernel queues the packet to another CPU's backlog and sends an inter-processor interrupt.
 * Steering can pay only when the loop's thread is the bottleneck, and even then not always: it
 * pays when another CPU has room for the work (measured with paced senders, bbr, at 16 and 64
 * streams) and costs when the IPIs and cross-CPU wakeups land on CPUs that are busy too (measured
 * with unpaced senders, reno, at every stream count; figures in docs/benchmarks.md, "Steering").
 * So "auto" does not guess: it tries, and keeps steering only where it measured a gain.
 *
 * It watches how busy the loop's thread is — its CPU time (which includes the kernel receive
 * work done inside its writes) over wall time, in windows — and the bytes the loop moved:
 *
 *   off   --(on_windows consecutive windows >= on_pct, and no failed trial in the last
 *            retry wait)--> trial (steering on)
 *   trial --(settle_windows ignored, then trial_windows windows that together move at least
 *            gain_pct more bytes per second than the (up to 4) busy windows before it)--> on
 *   trial --(otherwise)--> off; the next trial waits retry_min_ns, doubling per failed trial up
 *            to retry_max_ns; off_windows' worth of time under off_pct with steering off
 *            (the load changed; calm windows of a trial are steering's own doing) clears
 *            the wait
 *   trial --(a pause: a window over twice as long as it should be; or no baseline)--> off,
 *            not counted as a failure, no wait
 *   on    --(off_windows consecutive windows below the quiet threshold, and on for at least
 *            `hold`)--> off
 *
 * Steering moves work off the thread, so a load that saturates it without steering can look
 * quiet with it: on the edge it would flap. So `hold` starts at hold_min_ns and the quiet
 * threshold at off_pct, and each time steering comes back on within flap_ns of going off for a
 * quiet load (not after a failed trial) the hold doubles (up to hold_max_ns) and the
 * threshold halves (down to off_min_pct): the load must drop clearly below what it was for
 * steering to go off again. A return after a longer pause starts afresh. Turning steering off can reorder the few packets still queued on
 * another CPU (TCP absorbs that), which is why flapping is what to avoid.
 *
 * Sans-IO: the caller reads the clocks (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID of the
 * loop's thread) and its byte counter, and applies the answer (sysfs rps_cpus).
 * Single-threaded: one loop owns it.
 */
#ifndef TS_CORE_RPS_POLICY_H
#define TS_CORE_RPS_POLICY_H

#include <stdbool.h>
#include <stdint.h>

struct rps_policy_params {
	int64_t window_ns;      /* one measurement window (250 ms) */
	unsigned on_pct;        /* a window at least this busy counts toward "on" (90) */
	unsigned off_pct;       /* a window less busy than this counts toward "off" (75) */
	unsigned off_min_pct;   /* the lowest that threshold falls to after flapping (10) */
	unsigned on_windows;    /* consecutive busy windows before turning on (2) */
	unsigned off_windows;   /* consecutive quiet windows before turning off (4) */
	int64_t hold_min_ns;    /* least time on before turning off (1 s) */
	int64_t hold_max_ns;    /* the longest hold after repeated flapping (64 s) */
	int64_t flap_ns;        /* on again within this of going off: the hold doubles (10 s) */
	unsigned settle_windows; /* trial windows not measured, the switch settling (1) */
	unsigned trial_windows; /* trial windows measured (4) */
	unsigned gain_pct;      /* the gain a trial must show, percent of bytes/s (5) */
	int64_t retry_min_ns;   /* the wait after a trial that did not pay (8 s) */
	int64_t retry_max_ns;   /* ... doubling per failed trial up to this (128 s) */
};

enum rps_action {
	RPS_KEEP,       /* leave steering as it is */
	RPS_TURN_ON,    /* set rps_cpus now */
	RPS_TURN_OFF,   /* clear rps_cpus now */
};

#define RPS_POLICY_WINDOWS_MAX 1000u                         /* settle / trial windows */
#define RPS_POLICY_WAIT_MAX_NS (24 * 3600 * 1000000000LL)    /* holds, waits, flap interval */

struct rps_policy;

/* The defaults above. */
void rps_policy_defaults(struct rps_policy_params *p);

/* A policy whose steering is off, with its first window starting at now_ns / cpu_ns (the
 * thread's CPU time in ns) / bytes (a running count of the bytes the loop moved). -EINVAL for
 * nonsense parameters (a zero window or window count, more than RPS_POLICY_WINDOWS_MAX settle
 * or trial windows, off_pct > on_pct, off_min_pct > off_pct, on_pct > 100, a negative hold or
 * flap interval, a retry wait <= 0, hold_min > hold_max, retry_min > retry_max, a hold, wait
 * or flap interval over RPS_POLICY_WAIT_MAX_NS, gain_pct > 1000); -ENOMEM. */
int rps_policy_new(const struct rps_policy_params *params, int64_t now_ns, int64_t cpu_ns,
		   uint64_t bytes, struct rps_policy **out) __attribute__((warn_unused_result));
void rps_policy_free(struct rps_policy *p);

/* Feed the clocks and the byte count (which must not go back; if it does, that window moved
 * nothing and a trial is aborted); cheap to call more often than once per window (it returns
 * RPS_KEEP until a window has passed). A window that spans a long pause (no calls: no traffic)
 * counts as one quiet window (and, during a trial, aborts it). The answer is taken as
 * applied: a caller that fails to apply it stops using the policy. */
enum rps_action rps_policy_sample(struct rps_policy *p, int64_t now_ns, int64_t cpu_ns,
				  uint64_t bytes_total);

/* True when a window is complete at now_ns: the caller reads the thread's CPU clock (a system
 * call) and calls rps_policy_sample only then. */
bool rps_policy_due(const struct rps_policy *p, int64_t now_ns);

bool rps_policy_on(const struct rps_policy *p);
/* Busy percent of the last complete window that ended with traffic (0 before the first one;
 * an idle proxy does not sample, so it keeps the last value); may exceed 100 by the clocks'
 * granularity. */
unsigned rps_policy_busy_pct(const struct rps_policy *p);
/* Times steering was turned on or off. */
uint64_t rps_policy_switches(const struct rps_policy *p);
/* The current hold and quiet threshold (for the tests). */
int64_t rps_policy_hold_ns(const struct rps_policy *p);
unsigned rps_policy_off_pct(const struct rps_policy *p);
/* Steering is on for a trial (not yet kept). */
bool rps_policy_trial(const struct rps_policy *p);
/* Trials that did not pay; the last trial's gain in percent (negative: a loss; 0 before the
 * first); the earliest time of the next trial. */
uint64_t rps_policy_trials_failed(const struct rps_policy *p);
int rps_policy_last_trial_pct(const struct rps_policy *p);
int64_t rps_policy_retry_at_ns(const struct rps_policy *p);

#endif
