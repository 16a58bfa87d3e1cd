/* budget.c — profiles, TCP admission under pressure tiers, UDP/fd/buffer accounting.
 *
 * Every gauge is a 64-bit atomic changed by a bounded CAS loop: an acquire succeeds only if the
 * value it raises is still below the limit at the instant of the exchange, so concurrent workers
 * can never overshoot a limit. Relaxed ordering throughout: these are counts, they publish no
 * data to other threads (whatever a permit protects is synchronised by its owner).
 */
#include "core/budget.h"

#include <assert.h>
#include <errno.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/fdpool.h"

/* Profile defaults.
 *
 * | limit            | desktop             | mobile (iOS extension)       |
 * | ---------------- | ------------------- | ---------------------------- |
 * | nat_entries      | 65536               | 4096                         |
 * | tcp_sessions     | 4096 / 2048 / 1024  | 64 / 32 / 16                 |
 * | udp_sessions     | 4096                | 256                          |
 * | udp_up_queue     | 256                 | 64                           |
 * | udp_down_queue   | 256                 | 64                           |
 * | listen_backlog   | 4096                | 128                          |
 * | buffer_bytes     | 256 MiB             | 16 MiB                       |
 * | fds              | 16384               | 1024                         |
 * | memory_limit_mb  | 0 (no tiers)        | 50                           |
 *
 * NAT entries are a budget separate from admission and larger than it: a browser opens dozens of
 * connections in a burst, and entries outlive their sessions (HalfOpen until accept, Closing for
 * the 10 s linger), so 4096 entries still absorb a burst while only 64 sessions are admitted.
 * The desktop fd default is what the runtime starts from; it is cut to fit RLIMIT_NOFILE with
 * budget_fds_fit() before the budget is created. Mobile's 50 MB is the Network Extension's
 * memory wall; the tiers trip at 37.5 MiB and 45 MiB of RSS.
 */
static const struct budget_limits profiles[] = {
	[BUDGET_PROFILE_DESKTOP] = {
		.nat_entries = 65536,
		.tcp_sessions = { 4096, 2048, 1024 },
		.udp_sessions = 4096,
		.udp_up_queue = 256,
		.udp_down_queue = 256,
		.listen_backlog = 4096,
		.buffer_bytes = 256ull << 20,
		.fds = 16384,
		.memory_limit_mb = 0,
	},
	[BUDGET_PROFILE_MOBILE] = {
		.nat_entries = 4096,
		.tcp_sessions = { 64, 32, 16 },
		.udp_sessions = 256,
		.udp_up_queue = 64,
		.udp_down_queue = 64,
		.listen_backlog = 128,
		.buffer_bytes = 16ull << 20,
		.fds = 1024,
		.memory_limit_mb = 50,
	},
};

typedef _Atomic uint64_t gauge_t;

struct budget {
	struct budget_limits lim;

	_Atomic int computed_tier;   /* from the last budget_update_tier */
	_Atomic int forced_tier;     /* -1 = not forced */
	gauge_t rss_bytes;

	gauge_t tcp_in_use, tcp_peak;
	gauge_t udp_in_use, udp_peak;
	gauge_t fds_in_use, fds_peak;
	gauge_t bytes_in_use, bytes_peak;
	gauge_t bytes_abandoned;     /* in bytes_in_use for good (budget_bytes_abandon) */
	gauge_t malloc_bytes, malloc_blocks;
	_Atomic bool fd_pool;        /* also draws descriptors from the process pool */
	/* budget_set_fd_reclaim: fn and ctx are written before reclaim_on is set (release) and
	 * read only after it is seen set (acquire). */
	_Atomic bool reclaim_on;
	budget_fd_reclaim_fn *reclaim_fn;
	void *reclaim_ctx;

	/* Written by several workers: always ctr_add_shared. */
	ctr_t tcp_admitted;
	ctr_t tcp_refused[BUDGET_TIER_MAX];
	ctr_t udp_admitted, udp_refused;
	ctr_t fd_refused;
	ctr_t buffer_refused, malloc_refused, malloc_failed;
	ctr_t tier_changes;
	ctr_t release_underflow;
};

void budget_limits_profile(struct budget_limits *l, enum budget_profile p)
{
	if ((unsigned)p >= sizeof(profiles) / sizeof(profiles[0]))
		p = BUDGET_PROFILE_DESKTOP;
	*l = profiles[p];
}

const char *budget_tier_name(enum budget_tier t)
{
	static const char *const names[BUDGET_TIER_MAX] = { "normal", "elevated", "critical" };

	if ((unsigned)t >= BUDGET_TIER_MAX)
		return "unknown";
	return names[t];
}

int budget_profile_parse(const char *s, enum budget_profile *out)
{
	if (s && strcmp(s, "desktop") == 0)
		*out = BUDGET_PROFILE_DESKTOP;
	else if (s && strcmp(s, "mobile") == 0)
		*out = BUDGET_PROFILE_MOBILE;
	else
		return -EINVAL;
	return 0;
}

int budget_limits_check(const struct budget_limits *l, const char **field)
{
	const char *bad = NULL;

	if (l->nat_entries == 0)
		bad = "nat_entries";
	else if (l->tcp_sessions[BUDGET_NORMAL] == 0)
		bad = "tcp_sessions[normal]";
	else if (l->tcp_sessions[BUDGET_ELEVATED] > l->tcp_sessions[BUDGET_NORMAL])
		bad = "tcp_sessions[elevated]";   /* pressure must never raise admission */
	else if (l->tcp_sessions[BUDGET_CRITICAL] > l->tcp_sessions[BUDGET_ELEVATED])
		bad = "tcp_sessions[critical]";
	else if (l->udp_sessions == 0)
		bad = "udp_sessions";
	else if (l->udp_up_queue == 0)
		bad = "udp_up_queue";
	else if (l->udp_down_queue == 0)
		bad = "udp_down_queue";
	else if (l->listen_backlog == 0)
		bad = "listen_backlog";
	else if (l->buffer_bytes == 0)
		bad = "buffer_bytes";
	else if (l->fds == 0)
		bad = "fds";
	if (field)
		*field = bad;
	return bad ? -EINVAL : 0;
}

uint32_t budget_fd_reserve_for(uint32_t queues, uint32_t listeners, uint32_t stats_fds)
{
	uint64_t n = BUDGET_FD_FIXED + (uint64_t)queues * BUDGET_FD_PER_QUEUE;

	n += (uint64_t)listeners + stats_fds;
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint32_t budget_fds_fit(uint32_t wanted, uint64_t rlimit_nofile, uint32_t reserve)
{
	if (rlimit_nofile <= reserve)
		return 0;
	rlimit_nofile -= reserve;
	return rlimit_nofile < wanted ? (uint32_t)rlimit_nofile : wanted;
}

int budget_new(const struct budget_limits *l, struct budget **out)
{
	struct budget *b;
	int ret;

	*out = NULL;
	if ((ret = budget_limits_check(l, NULL)) != 0)
		return ret;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->lim = *l;
	atomic_init(&b->computed_tier, BUDGET_NORMAL);
	atomic_init(&b->forced_tier, -1);
	*out = b;
	return 0;
}

void budget_free(struct budget *b)
{
	if (!b)
		return;
	/* Outstanding buffers would be freed into a dead budget later: a caller bug. Abandoned
	 * ones never come back. */
	assert(atomic_load(&b->bytes_in_use) == atomic_load(&b->bytes_abandoned));
	if (atomic_load(&b->fd_pool)) {
		fdpool_give((uint32_t)atomic_load(&b->fds_in_use));
		fdpool_leave();
	}
	free(b);
}

const struct budget_limits *budget_get_limits(const struct budget *b)
{
	return &b->lim;
}

/* ---- gauge helpers ---- */

static void peak_raise(gauge_t *peak, uint64_t v)
{
	uint64_t p = atomic_load_explicit(peak, memory_order_relaxed);

	while (p < v && !atomic_compare_exchange_weak_explicit(peak, &p, v, memory_order_relaxed,
								memory_order_relaxed))
		;
}

/* Add n to *g unless the result would exceed limit. The check and the add are one CAS, so
 * concurrent callers never overshoot. */
static bool gauge_take(gauge_t *g, gauge_t *peak, uint64_t n, uint64_t limit)
{
	uint64_t cur = atomic_load_explicit(g, memory_order_relaxed);

	do {
		if (n > limit || cur > limit - n)
			return false;
	} while (!atomic_compare_exchange_weak_explicit(g, &cur, cur + n, memory_order_relaxed,
							memory_order_relaxed));
	peak_raise(peak, cur + n);
	return true;
}

/* Subtract n, clamping at zero: a release without an acquire is a bug (asserted in debug
 * builds); in production it is counted and must not wrap the gauge into "everything in use". */
/* Returns what was really given back: less than n only after an underflow (clamped). */
static uint64_t gauge_give(struct budget *b, gauge_t *g, uint64_t n)
{
	uint64_t cur = atomic_load_explicit(g, memory_order_relaxed);
	uint64_t next;

	do {
		next = cur >= n ? cur - n : 0;
	} while (!atomic_compare_exchange_weak_explicit(g, &cur, next, memory_order_relaxed,
							memory_order_relaxed));
	if (cur < n) {
		ctr_add_shared(&b->release_underflow, 1);
		assert(!"budget: release without a matching acquire");
	}
	return cur - next;
}

static uint64_t gauge_get(const gauge_t *g)
{
	return atomic_load_explicit((gauge_t *)g, memory_order_relaxed);
}

/* ---- pressure tiers ---- */

enum budget_tier budget_get_tier(const struct budget *b)
{
	int forced = atomic_load_explicit((_Atomic int *)&b->forced_tier, memory_order_relaxed);

	if (forced >= 0)
		return (enum budget_tier)forced;
	return (enum budget_tier)atomic_load_explicit((_Atomic int *)&b->computed_tier,
						      memory_order_relaxed);
}

static enum budget_tier tier_for(const struct budget_limits *l, uint64_t rss)
{
	/* At most 2^32 MiB = 2^52 bytes, so the percentages cannot overflow. */
	uint64_t limit = (uint64_t)l->memory_limit_mb << 20;

	if (limit == 0)
		return BUDGET_NORMAL;
	if (rss >= limit * BUDGET_CRITICAL_PCT / 100)
		return BUDGET_CRITICAL;
	if (rss >= limit * BUDGET_ELEVATED_PCT / 100)
		return BUDGET_ELEVATED;
	return BUDGET_NORMAL;
}

enum budget_tier budget_update_tier(struct budget *b, uint64_t rss_bytes)
{
	int t = (int)tier_for(&b->lim, rss_bytes);

	atomic_store_explicit(&b->rss_bytes, rss_bytes, memory_order_relaxed);
	if (atomic_exchange_explicit(&b->computed_tier, t, memory_order_relaxed) != t)
		ctr_add_shared(&b->tier_changes, 1);
	return budget_get_tier(b);
}

void budget_force_tier(struct budget *b, int tier)
{
	if (tier >= BUDGET_TIER_MAX)
		tier = BUDGET_CRITICAL;
	if (tier < 0)
		tier = -1;
	atomic_store_explicit(&b->forced_tier, tier, memory_order_relaxed);
}

/* ---- admission, UDP, fds ---- */

int budget_tcp_acquire(struct budget *b)
{
	enum budget_tier t = budget_get_tier(b);

	/* in_use < limit[tier] at the CAS: held permits above a lowered limit stay held, and
	 * nobody new gets in until releases bring in_use under it. */
	if (!gauge_take(&b->tcp_in_use, &b->tcp_peak, 1, b->lim.tcp_sessions[t])) {
		ctr_add_shared(&b->tcp_refused[t], 1);
		return -EBUSY;
	}
	ctr_add_shared(&b->tcp_admitted, 1);
	return 0;
}

bool budget_tcp_would_admit(const struct budget *b)
{
	enum budget_tier t = budget_get_tier(b);
	return atomic_load_explicit(&b->tcp_in_use, memory_order_relaxed) < b->lim.tcp_sessions[t];
}

void budget_tcp_count_refusal(struct budget *b)
{
	ctr_add_shared(&b->tcp_refused[budget_get_tier(b)], 1);
}

void budget_tcp_release(struct budget *b)
{
	gauge_give(b, &b->tcp_in_use, 1);
}

int budget_udp_acquire(struct budget *b)
{
	if (!gauge_take(&b->udp_in_use, &b->udp_peak, 1, b->lim.udp_sessions)) {
		ctr_add_shared(&b->udp_refused, 1);
		return -EBUSY;
	}
	ctr_add_shared(&b->udp_admitted, 1);
	return 0;
}

void budget_udp_release(struct budget *b)
{
	gauge_give(b, &b->udp_in_use, 1);
}

static bool fd_take(struct budget *b, uint32_t n)
{
	if (!gauge_take(&b->fds_in_use, &b->fds_peak, n, b->lim.fds))
		return false;
	if (atomic_load_explicit(&b->fd_pool, memory_order_relaxed) && !fdpool_take(n)) {
		gauge_give(b, &b->fds_in_use, n);
		return false;
	}
	return true;
}

static int fd_reserve(struct budget *b, uint32_t n, bool counted)
{
	if (fd_take(b, n))
		return 0;
	if (atomic_load_explicit(&b->reclaim_on, memory_order_acquire)) {
		b->reclaim_fn(b->reclaim_ctx, n);
		if (fd_take(b, n))
			return 0;
	}
	if (counted)
		ctr_add_shared(&b->fd_refused, 1);
	return -EMFILE;
}

int budget_fd_reserve(struct budget *b, uint32_t n)
{
	return fd_reserve(b, n, true);
}

int budget_fd_reserve_optional(struct budget *b, uint32_t n)
{
	return fd_reserve(b, n, false);
}

void budget_set_fd_reclaim(struct budget *b, budget_fd_reclaim_fn *fn, void *ctx)
{
	atomic_store_explicit(&b->reclaim_on, false, memory_order_relaxed);
	if (!fn)
		return;
	b->reclaim_fn = fn;
	b->reclaim_ctx = ctx;
	atomic_store_explicit(&b->reclaim_on, true, memory_order_release);
}

void budget_clear_fd_reclaim(struct budget *b, void *ctx)
{
	if (atomic_load_explicit(&b->reclaim_on, memory_order_relaxed) && b->reclaim_ctx == ctx)
		budget_set_fd_reclaim(b, NULL, NULL);
}

void budget_fd_release(struct budget *b, uint32_t n)
{
	/* Only what this budget held goes back to the pool: a stray release here must not
	 * free descriptors another proxy holds. */
	uint64_t given = gauge_give(b, &b->fds_in_use, n);

	if (atomic_load_explicit(&b->fd_pool, memory_order_relaxed))
		fdpool_give((uint32_t)given);
}

void budget_join_fd_pool(struct budget *b)
{
	if (!atomic_exchange(&b->fd_pool, true))
		fdpool_join();
}

/* ---- buffer bytes ---- */

int budget_bytes_reserve(struct budget *b, uint64_t n)
{
	if (!gauge_take(&b->bytes_in_use, &b->bytes_peak, n, b->lim.buffer_bytes)) {
		ctr_add_shared(&b->buffer_refused, 1);
		return -ENOBUFS;
	}
	return 0;
}

void budget_bytes_release(struct budget *b, uint64_t n)
{
	gauge_give(b, &b->bytes_in_use, n);
}

void budget_bytes_abandon(struct budget *b, uint64_t n)
{
	assert(n <= gauge_get(&b->bytes_in_use) - gauge_get(&b->bytes_abandoned));
	atomic_fetch_add_explicit(&b->bytes_abandoned, n, memory_order_relaxed);
}

void budget_buffer_peak_reset(struct budget *b)
{
	atomic_store_explicit(&b->bytes_peak, gauge_get(&b->bytes_in_use), memory_order_relaxed);
}

void budget_buffer_stats(const struct budget *b, uint64_t sessions,
			 struct budget_buffer_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->bytes_in_use = gauge_get(&b->bytes_in_use);
	out->bytes_peak = gauge_get(&b->bytes_peak);
	out->bytes_limit = b->lim.buffer_bytes;
	out->malloc_bytes_in_use = gauge_get(&b->malloc_bytes);
	out->sessions = sessions;
	if (sessions) {
		out->bytes_per_session = out->bytes_in_use / sessions;
		out->peak_per_session = out->bytes_peak / sessions;
	}
}

/* ---- accounted heap ---- */

/* 16 bytes ahead of each block: keeps malloc's max_align_t alignment for the caller. */
struct mhdr {
	uint64_t size;
	uint64_t owner;   /* budget address ^ MHDR_MAGIC: catches a block freed to another budget */
};
#define MHDR_MAGIC 0x6275646765746d61ull /* "budgetma" */
_Static_assert(sizeof(struct mhdr) % alignof(max_align_t) == 0, "header breaks alignment");

static void *alloc_accounted(struct budget *b, size_t n, bool zero)
{
	struct mhdr *h;

	if (n > SIZE_MAX - sizeof(*h)) {
		ctr_add_shared(&b->malloc_failed, 1);
		return NULL;
	}
	if (budget_bytes_reserve(b, n) != 0) {
		ctr_add_shared(&b->malloc_refused, 1);
		return NULL;
	}
	h = zero ? calloc(1, sizeof(*h) + n) : malloc(sizeof(*h) + n);
	if (!h) {
		budget_bytes_release(b, n);
		ctr_add_shared(&b->malloc_failed, 1);
		return NULL;
	}
	h->size = n;
	h->owner = (uint64_t)(uintptr_t)b ^ MHDR_MAGIC;
	atomic_fetch_add_explicit(&b->malloc_bytes, n, memory_order_relaxed);
	atomic_fetch_add_explicit(&b->malloc_blocks, 1, memory_order_relaxed);
	return h + 1;
}

void *budget_malloc(struct budget *b, size_t n)
{
	return alloc_accounted(b, n, false);
}

void *budget_calloc(struct budget *b, size_t nmemb, size_t size)
{
	if (size && nmemb > SIZE_MAX / size) {
		ctr_add_shared(&b->malloc_failed, 1);
		return NULL;
	}
	return alloc_accounted(b, nmemb * size, true);
}

void budget_mfree(struct budget *b, void *p)
{
	struct mhdr *h;

	if (!p)
		return;
	h = (struct mhdr *)p - 1;
	assert(h->owner == ((uint64_t)(uintptr_t)b ^ MHDR_MAGIC));
	gauge_give(b, &b->malloc_bytes, h->size);
	gauge_give(b, &b->malloc_blocks, 1);
	budget_bytes_release(b, h->size);
	free(h);
}

/* ---- stats ---- */

void budget_get_stats(const struct budget *b, struct budget_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->tier = budget_get_tier(b);
	out->forced_tier = atomic_load_explicit((_Atomic int *)&b->forced_tier,
						memory_order_relaxed);
	out->tier_changes = ctr_get(&b->tier_changes);
	out->rss_bytes = gauge_get(&b->rss_bytes);
	out->tcp_in_use = (uint32_t)gauge_get(&b->tcp_in_use);
	out->tcp_peak = (uint32_t)gauge_get(&b->tcp_peak);
	out->tcp_admitted = ctr_get(&b->tcp_admitted);
	for (int t = 0; t < BUDGET_TIER_MAX; t++)
		out->tcp_refused[t] = ctr_get(&b->tcp_refused[t]);
	out->udp_in_use = (uint32_t)gauge_get(&b->udp_in_use);
	out->udp_peak = (uint32_t)gauge_get(&b->udp_peak);
	out->udp_admitted = ctr_get(&b->udp_admitted);
	out->udp_refused = ctr_get(&b->udp_refused);
	out->fds_in_use = (uint32_t)gauge_get(&b->fds_in_use);
	out->fds_peak = (uint32_t)gauge_get(&b->fds_peak);
	out->fd_refused = ctr_get(&b->fd_refused);
	out->buffer_bytes_in_use = gauge_get(&b->bytes_in_use);
	out->buffer_bytes_peak = gauge_get(&b->bytes_peak);
	out->buffer_bytes_abandoned = gauge_get(&b->bytes_abandoned);
	out->buffer_refused = ctr_get(&b->buffer_refused);
	out->malloc_bytes_in_use = gauge_get(&b->malloc_bytes);
	out->malloc_blocks = gauge_get(&b->malloc_blocks);
	out->malloc_refused = ctr_get(&b->malloc_refused);
	out->malloc_failed = ctr_get(&b->malloc_failed);
	out->release_underflow = ctr_get(&b->release_underflow);
}
