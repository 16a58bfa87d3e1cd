/* budget.h — the process-wide budget: every bounded resource of both stacks comes from here.
 *
 * One set of limits (NAT entries, TCP admission permits, UDP up/down queue depths, UDP sessions,
 * listener backlog, buffer bytes, file descriptors) chosen by a profile and overridable in the
 * config. Memory-pressure tiers (normal / elevated / critical) lower TCP admission and only
 * block NEW sessions: permits already held are never revoked (a live connection is never torn
 * down to reclaim memory; sessions end on their own).
 *
 * Thread-safe: permits and counts are atomics; any worker may acquire and release.
 */
#ifndef TS_CORE_BUDGET_H
#define TS_CORE_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"

enum budget_tier {
	BUDGET_NORMAL,
	BUDGET_ELEVATED,
	BUDGET_CRITICAL,
	BUDGET_TIER_MAX
};

enum budget_profile {
	BUDGET_PROFILE_DESKTOP,
	BUDGET_PROFILE_MOBILE,
};

struct budget_limits {
	uint32_t nat_entries;                  /* NAT table entries (separate from admission) */
	uint32_t tcp_sessions[BUDGET_TIER_MAX]; /* TCP admission permits per tier */
	uint32_t udp_sessions;                 /* concurrent UDP sessions */
	uint32_t udp_up_queue;                 /* datagrams queued toward an outbound, per session */
	uint32_t udp_down_queue;               /* datagrams queued toward the TUN, per session */
	uint32_t listen_backlog;               /* kernel listener backlog */
	uint64_t buffer_bytes;                 /* userspace packet and stream buffers, all pools */
	uint32_t fds;                          /* file descriptors for sessions (sockets, pipes) */
	uint32_t memory_limit_mb;              /* RSS reference for the pressure tiers; 0 = none */
};

/* Fill limits with a profile's defaults. desktop: generous; mobile: sized for an iOS Network
 * Extension's memory limit (admission 64/32/16). */
void budget_limits_profile(struct budget_limits *l, enum budget_profile p);

const char *budget_tier_name(enum budget_tier t);

/* ---- the live budget ------------------------------------------------------------------------ */

#define BUDGET_WUR __attribute__((warn_unused_result))

/* Pressure thresholds, in percent of memory_limit_mb (elevated 75 %, critical 90 %). */
enum {
	BUDGET_ELEVATED_PCT = 75,
	BUDGET_CRITICAL_PCT = 90,
};

/* Descriptors a proxy keeps outside the session budget, counted from what it really holds:
 *   per TUN queue (BUDGET_FD_PER_QUEUE): the queue's fd, its io_uring (core/uring.h), its
 *     rps_cpus file, and for a queue's own thread its event loop (epoll + notification fd),
 *     stop eventfd and UDP hand-off socket pair;
 *   fixed (BUDGET_FD_FIXED): stdin/stdout/stderr and the log, the main loop (epoll +
 *     notification fd), the API's three eventfds, the worker-died and kick eventfds, the
 *     netlink sockets (routing, route watch, auto_route), and room for what is opened for a
 *     moment (a reload reading its file and resolving names, sysfs/procfs reads, the TUN's
 *     set-up sockets);
 *   one per kernel listener of the stack (all families);
 *   the stats endpoint's (STATS_HTTP_FDS, core/stats_http.h; 0 without one).
 * BUDGET_FD_RESERVED is the reserve the process pool (core/fdpool.h) keeps per member. */
#define BUDGET_FD_RESERVED 64u
#define BUDGET_FD_PER_QUEUE 8u
#define BUDGET_FD_FIXED 32u

/* The reserve for a proxy with queues TUN queues, listeners kernel listening sockets and
 * stats_fds descriptors of its stats endpoint. Saturates at UINT32_MAX. Pure. */
uint32_t budget_fd_reserve_for(uint32_t queues, uint32_t listeners, uint32_t stats_fds);

/* Check limits for consistency. Returns 0, or -EINVAL with *field naming the offending member
 * (a static string such as "tcp_sessions[elevated]") so the config can name the JSON path.
 * Rules: every count >= 1 except tcp_sessions[elevated|critical] (0 = block all new TCP under
 * that pressure) and memory_limit_mb (0 = no pressure tiers); tiers never increase with
 * pressure (normal >= elevated >= critical). */
int budget_limits_check(const struct budget_limits *l, const char **field) BUDGET_WUR;

/* The session fd budget that fits under a (raised) RLIMIT_NOFILE soft limit: min(wanted,
 * nofile - reserve) (reserve: budget_fd_reserve_for), 0 when the limit is not above the
 * reserve. Pure. */
uint32_t budget_fds_fit(uint32_t wanted, uint64_t rlimit_nofile, uint32_t reserve);

/* Parse "desktop" / "mobile". Returns 0 or -EINVAL. */
int budget_profile_parse(const char *s, enum budget_profile *out) BUDGET_WUR;

struct budget;

/* Create a budget from limits (copied; immutable afterwards). Returns 0, -EINVAL (limits fail
 * budget_limits_check) or -ENOMEM. */
int budget_new(const struct budget_limits *l, struct budget **out) BUDGET_WUR;

/* Free the budget. NULL is fine. Every pool and budget_malloc block must be gone first, every
 * reserved byte released or abandoned (budget_bytes_abandon). */
void budget_free(struct budget *b);

/* Borrowed; valid until budget_free. */
const struct budget_limits *budget_get_limits(const struct budget *b);

/* --- TCP admission ---
 * A new session is admitted only while in_use < tcp_sessions[current tier]. A tier change never
 * revokes permits: after dropping to critical with 40 held and a limit of 16, acquires fail until
 * releases bring in_use below 16. Returns 0 (one permit held; release it exactly once) or
 * -EBUSY (refused, counted in tcp_refused[tier]). Lock-free; never blocks. */
int budget_tcp_acquire(struct budget *b) BUDGET_WUR;
void budget_tcp_release(struct budget *b);
/* Would budget_tcp_acquire admit now? No side effect (a stack that must decide at SYN time
 * but acquires only when the handshake completes asks this first). */
bool budget_tcp_would_admit(const struct budget *b);
/* Count one refusal that budget_tcp_would_admit decided (in tcp_refused, under the tier in
 * force), so a stack that refuses at the SYN shows in the same counter as one that refuses
 * at accept. */
void budget_tcp_count_refusal(struct budget *b);

/* --- Pressure tier ---
 * The effective tier is the forced one if set, else the one computed by the last update. */
enum budget_tier budget_get_tier(const struct budget *b);

/* Recompute the tier from a resident-set sample (bytes): critical at >= 90 %, elevated at
 * >= 75 % of memory_limit_mb; memory_limit_mb 0 = always normal. No hysteresis: a tier only
 * gates new sessions, so flapping around a threshold costs nothing but a counter. Returns the
 * effective tier afterwards. */
enum budget_tier budget_update_tier(struct budget *b, uint64_t rss_bytes);

/* Force a tier (tests, operator override) or pass -1 to go back to the computed one. */
void budget_force_tier(struct budget *b, int tier);

/* --- UDP sessions --- 0 or -EBUSY (counted). */
int budget_udp_acquire(struct budget *b) BUDGET_WUR;
void budget_udp_release(struct budget *b);

/* --- File descriptors ---
 * Reserve n descriptors BEFORE opening them (accepted socket, outbound socket, splice pipes), so
 * a session is refused (RST) while the process can still open the fds it needs to refuse it,
 * instead of hitting EMFILE in the middle of the accept loop (hev-socks5-tunnel #97).
 * Returns 0 or -EMFILE (counted). Release the same n when the descriptors are closed. */
int budget_fd_reserve(struct budget *b, uint32_t n) BUDGET_WUR;
/* As budget_fd_reserve, but a refusal is not counted in fd_refused: for descriptors the caller
 * can do without and counts the lack of itself (the splice relay's pipes: it copies instead).
 * fd_refused stays the count of work refused for want of descriptors. */
int budget_fd_reserve_optional(struct budget *b, uint32_t n) BUDGET_WUR;
void budget_fd_release(struct budget *b, uint32_t n);
/* An owner of descriptors it can give back on demand: the splice relay's idle pipes are a
 * cache, not work, and must not cost a session its descriptors. When a reservation would be
 * refused, budget_fd_reserve first calls fn(ctx, n), which closes what it can spare (at least
 * n descriptors if it has them, releasing them to this budget), then tries once more; only a
 * refusal after that is counted. fn runs on the thread that reserves: set a hook only on a
 * budget whose reservations all happen on the hook owner's thread (a proxy's: its event
 * loop). fn NULL removes the hook; budget_clear_fd_reclaim removes it only while ctx is the
 * one set. Neither may race a reservation. */
typedef void budget_fd_reclaim_fn(void *ctx, uint32_t n);
void budget_set_fd_reclaim(struct budget *b, budget_fd_reclaim_fn *fn, void *ctx);
void budget_clear_fd_reclaim(struct budget *b, void *ctx);
/* From now on also reserve every descriptor from the process's pool (core/fdpool.h), so that
 * several proxies in one process share RLIMIT_NOFILE. Call before any fd is reserved; once.
 * budget_free leaves the pool. */
void budget_join_fd_pool(struct budget *b);

/* --- Buffer bytes (bufpool and budget_malloc draw from here) ---
 * Returns 0 or -ENOBUFS (counted in buffer_refused). */
int budget_bytes_reserve(struct budget *b, uint64_t n) BUDGET_WUR;
void budget_bytes_release(struct budget *b, uint64_t n);
/* n reserved bytes will never be released: memory left allocated on purpose for as long as
 * the process lives (a read buffer the kernel may still write into). They stay in use, are
 * counted in buffer_bytes_abandoned, and budget_free accepts them. */
void budget_bytes_abandon(struct budget *b, uint64_t n);

/* Accounted heap for code that cannot use fixed-size pools (lwIP's heap). The size lives in a
 * 16-byte header (alignment preserved); only the n requested bytes are counted against
 * buffer_bytes. NULL when over budget (counted) or out of memory. budget_mfree(b, NULL) is a
 * no-op; a block must go back to the budget it came from. (Named mfree because budget_free is
 * the destructor.) */
void *budget_malloc(struct budget *b, size_t n) BUDGET_WUR;
void *budget_calloc(struct budget *b, size_t nmemb, size_t size) BUDGET_WUR;
void budget_mfree(struct budget *b, void *p);

/* Userspace buffer totals across all pools plus budget_malloc, and the average per session.
 * The budget has no notion of sessions, so the caller passes its session count. */
struct budget_buffer_stats {
	uint64_t bytes_in_use;
	uint64_t bytes_peak;
	uint64_t bytes_limit;
	uint64_t malloc_bytes_in_use;  /* the budget_malloc share of bytes_in_use */
	uint64_t sessions;             /* as passed in */
	uint64_t bytes_per_session;    /* bytes_in_use / sessions; 0 with no sessions */
	uint64_t peak_per_session;     /* bytes_peak / sessions; 0 with no sessions */
};
void budget_buffer_stats(const struct budget *b, uint64_t sessions,
			 struct budget_buffer_stats *out);

/* Restart peak tracking from the current in-use value (the rig measures peaks per phase). */
void budget_buffer_peak_reset(struct budget *b);

/* A snapshot of every gauge and counter. Values are read one by one with relaxed loads: each is
 * exact, the set is not one atomic instant. */
struct budget_stats {
	enum budget_tier tier;         /* effective */
	int forced_tier;               /* -1 = not forced */
	uint64_t tier_changes;         /* computed-tier transitions seen by budget_update_tier */
	uint64_t rss_bytes;            /* last sample passed to budget_update_tier */

	uint32_t tcp_in_use, tcp_peak;
	uint64_t tcp_admitted;
	uint64_t tcp_refused[BUDGET_TIER_MAX]; /* by the tier in force at refusal */

	uint32_t udp_in_use, udp_peak;
	uint64_t udp_admitted, udp_refused;

	uint32_t fds_in_use, fds_peak;
	uint64_t fd_refused;

	uint64_t buffer_bytes_in_use, buffer_bytes_peak;
	uint64_t buffer_bytes_abandoned; /* of those in use, never to be released */
	uint64_t buffer_refused;       /* every refused reserve: pools and budget_malloc */
	uint64_t malloc_bytes_in_use, malloc_blocks;
	uint64_t malloc_refused;       /* budget_malloc: over budget (also in buffer_refused) */
	uint64_t malloc_failed;        /* budget_malloc: the system allocator said no */

	uint64_t release_underflow;    /* releases without a matching acquire (a bug; clamped) */
};
void budget_get_stats(const struct budget *b, struct budget_stats *out);

#endif
