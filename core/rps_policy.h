/* rps_policy.h — when receive packet steering pays: the decision behind tun.rps "auto".
 *
 * Every packet the proxy writes into the TUN is received by the kernel. Without receive packet
 * steering (RPS) that receive work runs inside the proxy's write(), on the loop's thread; with
 * it, the kernel queues the packet to another CPU's backlog and sends an inter-processor
 * interrupt. Steering pays when the loop's thread is the bottleneck (many flows: the work moves
 * to a CPU with room) and costs when it is not (one flow: an IPI and a cross-CPU wakeup per
 * write, and the steered work lands on the CPU of the sender it competes with). Measured on the
 * 2-core rig: +13–26 % at 64 streams, −8–14 % for one upload.
 *
 * So "auto" watches how busy the loop's thread is — its CPU time (which includes the kernel
 * receive work done inside its writes) over wall time, in windows — and turns steering on once
 * the thread is saturated and off again once it has room:
 *
 *   off --(on_windows consecutive windows >= on_pct)--> on
 *   on  --(off_windows consecutive windows below the quiet threshold, and on for at least
 *          `hold`)--> off
 *
 * Steering moves work off the thread, so a load that saturates it without steering can look
 * quiet with it: on the edge it would flap. So `hold` starts at hold_min_ns and the quiet
 * threshold at off_pct, and each time steering comes back on within flap_ns of going off the
 * hold doubles (up to hold_max_ns) and the threshold halves (down to off_min_pct): the load
 * must drop clearly below what it was for steering to go off again. A return after a longer
 * pause starts afresh. Turning steering off can reorder the few packets still queued on
 * another CPU (TCP absorbs that), which is why flapping is what to avoid.
 *
 * Sans-IO: the caller reads the clocks (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID of the loop's
 * thread) and applies the answer (sysfs rps_cpus). Single-threaded: one loop owns it.
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
};

enum rps_action {
	RPS_KEEP,       /* leave steering as it is */
	RPS_TURN_ON,    /* set rps_cpus now */
	RPS_TURN_OFF,   /* clear rps_cpus now */
};

struct rps_policy;

/* The defaults above. */
void rps_policy_defaults(struct rps_policy_params *p);

/* A policy whose steering is off, with its first window starting at now_ns / cpu_ns (the
 * thread's CPU time in ns). -EINVAL for nonsense parameters (a zero window or window count,
 * off_pct > on_pct, off_min_pct > off_pct, on_pct > 100, a negative hold or flap interval,
 * hold_min > hold_max); -ENOMEM. */
int rps_policy_new(const struct rps_policy_params *params, int64_t now_ns, int64_t cpu_ns,
		   struct rps_policy **out) __attribute__((warn_unused_result));
void rps_policy_free(struct rps_policy *p);

/* Feed the clocks; cheap to call more often than once per window (it returns RPS_KEEP until a
 * window has passed). A window that spans a long pause (no calls: no traffic) counts as one
 * quiet window. The answer is taken as applied: a caller that fails to apply it stops using
 * the policy. */
enum rps_action rps_policy_sample(struct rps_policy *p, int64_t now_ns, int64_t cpu_ns);

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

#endif
