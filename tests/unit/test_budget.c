/* test_budget.c — profiles, limit checks, TCP admission under pressure tiers, UDP/fd/byte
 * accounting and the accounted allocator. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/budget.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

static struct budget *mk(const struct budget_limits *l)
{
	struct budget *b = NULL;

	cr_assert_eq(budget_new(l, &b), 0);
	cr_assert_not_null(b);
	return b;
}

static struct budget *mk_profile(enum budget_profile p)
{
	struct budget_limits l;

	budget_limits_profile(&l, p);
	return mk(&l);
}

static struct budget_stats stats(const struct budget *b)
{
	struct budget_stats s;

	budget_get_stats(b, &s);
	return s;
}

Test(profile, mobile_is_the_seeds_ios_values)
{
	struct budget_limits l;

	memset(&l, 0xAB, sizeof(l));
	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	cr_assert_eq(l.tcp_sessions[BUDGET_NORMAL], 64);
	cr_assert_eq(l.tcp_sessions[BUDGET_ELEVATED], 32);
	cr_assert_eq(l.tcp_sessions[BUDGET_CRITICAL], 16);
	cr_assert_eq(l.nat_entries, 4096);
	cr_assert_eq(l.udp_sessions, 256);
	cr_assert_eq(l.udp_up_queue, 64);
	cr_assert_eq(l.udp_down_queue, 64);
	cr_assert_eq(l.listen_backlog, 128);
	cr_assert_eq(l.buffer_bytes, 16 * MiB);
	cr_assert_eq(l.fds, 1024);
	cr_assert_eq(l.memory_limit_mb, 50);
	cr_assert_eq(budget_limits_check(&l, NULL), 0);
}

Test(profile, desktop_is_generous_but_bounded)
{
	struct budget_limits l;

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(l.nat_entries, 65536);
	cr_assert_eq(l.tcp_sessions[BUDGET_NORMAL], 4096);
	cr_assert_eq(l.tcp_sessions[BUDGET_ELEVATED], 2048);
	cr_assert_eq(l.tcp_sessions[BUDGET_CRITICAL], 1024);
	cr_assert_eq(l.udp_sessions, 4096);
	cr_assert_eq(l.udp_up_queue, 256);
	cr_assert_eq(l.udp_down_queue, 256);
	cr_assert_eq(l.listen_backlog, 4096);
	cr_assert_eq(l.buffer_bytes, 256 * MiB);
	cr_assert_eq(l.fds, 16384);
	cr_assert_eq(l.memory_limit_mb, 0);
	cr_assert_eq(budget_limits_check(&l, NULL), 0);
}

Test(profile, parse_and_names)
{
	enum budget_profile p = BUDGET_PROFILE_DESKTOP;

	cr_assert_eq(budget_profile_parse("mobile", &p), 0);
	cr_assert_eq(p, BUDGET_PROFILE_MOBILE);
	cr_assert_eq(budget_profile_parse("desktop", &p), 0);
	cr_assert_eq(p, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_profile_parse("Mobile", &p), -EINVAL);
	cr_assert_eq(budget_profile_parse(NULL, &p), -EINVAL);
	cr_assert_str_eq(budget_tier_name(BUDGET_NORMAL), "normal");
	cr_assert_str_eq(budget_tier_name(BUDGET_ELEVATED), "elevated");
	cr_assert_str_eq(budget_tier_name(BUDGET_CRITICAL), "critical");
	cr_assert_str_eq(budget_tier_name(BUDGET_TIER_MAX), "unknown");
}

Test(limits, check_names_the_bad_field)
{
	struct budget_limits l;
	struct budget *b = (struct budget *)1;
	const char *field = NULL;

	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	l.tcp_sessions[BUDGET_ELEVATED] = 65; /* pressure raising admission */
	cr_assert_eq(budget_limits_check(&l, &field), -EINVAL);
	cr_assert_str_eq(field, "tcp_sessions[elevated]");
	cr_assert_eq(budget_new(&l, &b), -EINVAL);
	cr_assert_null(b);

	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	l.tcp_sessions[BUDGET_CRITICAL] = 33;
	cr_assert_eq(budget_limits_check(&l, &field), -EINVAL);
	cr_assert_str_eq(field, "tcp_sessions[critical]");

	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	l.buffer_bytes = 0;
	cr_assert_eq(budget_limits_check(&l, &field), -EINVAL);
	cr_assert_str_eq(field, "buffer_bytes");

	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	l.nat_entries = 0;
	cr_assert_eq(budget_limits_check(&l, &field), -EINVAL);
	cr_assert_str_eq(field, "nat_entries");

	/* Zero admission under pressure is legal: block all new TCP while critical. */
	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	l.tcp_sessions[BUDGET_CRITICAL] = 0;
	l.memory_limit_mb = 0;
	cr_assert_eq(budget_limits_check(&l, &field), 0);
	cr_assert_null(field);
}

Test(limits, fds_fit_under_rlimit)
{
	const uint32_t r = 100;

	cr_assert_eq(budget_fds_fit(16384, 1024, r), 1024 - r);
	cr_assert_eq(budget_fds_fit(16384, 1048576, r), 16384);
	cr_assert_eq(budget_fds_fit(16384, r, r), 0);
	cr_assert_eq(budget_fds_fit(16384, 0, r), 0);
	cr_assert_eq(budget_fds_fit(100, UINT64_MAX, r), 100);
}

/* The reserve is what the proxy holds outside sessions: it grows with every TUN queue,
 * listener and stats descriptor, by exactly their cost. */
Test(limits, fd_reserve_grows_with_what_the_proxy_holds)
{
	uint32_t one = budget_fd_reserve_for(1, 2, 0);
	uint32_t sixteen = budget_fd_reserve_for(16, 2, 0);

	cr_assert_eq(sixteen - one, 15 * BUDGET_FD_PER_QUEUE, "%u -> %u", one, sixteen);
	cr_assert_eq(budget_fd_reserve_for(1, 32, 0) - one, 30, "one per listener");
	cr_assert_eq(budget_fd_reserve_for(1, 2, 25) - one, 25, "the stats endpoint's");
	cr_assert_geq(one, BUDGET_FD_FIXED + BUDGET_FD_PER_QUEUE + 2);
	/* 16 queues, 16 listeners per family, stats: far more than a fixed 64. */
	cr_assert_gt(budget_fd_reserve_for(16, 32, 25), 64 + 100);
	/* The fit uses it: with 16 queues fewer session fds fit under the same limit. */
	cr_assert_lt(budget_fds_fit(1u << 20, 1024, sixteen), budget_fds_fit(1u << 20, 1024, one));
	cr_assert_eq(budget_fds_fit(1u << 20, 1024, sixteen), 1024 - sixteen);
	/* Saturates instead of wrapping. */
	cr_assert_eq(budget_fd_reserve_for(UINT32_MAX, UINT32_MAX, UINT32_MAX), UINT32_MAX);
}

Test(budget, getter_returns_a_copy_of_the_limits)
{
	struct budget_limits l;
	struct budget *b;

	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	b = mk(&l);
	l.nat_entries = 1; /* the budget copied; later edits of ours do not leak in */
	cr_assert_eq(budget_get_limits(b)->nat_entries, 4096);
	cr_assert_eq(budget_get_limits(b)->tcp_sessions[BUDGET_CRITICAL], 16);
	budget_free(b);
	budget_free(NULL);
}

static void acquire_n(struct budget *b, int n)
{
	for (int i = 0; i < n; i++)
		cr_assert_eq(budget_tcp_acquire(b), 0, "acquire %d of %d", i, n);
}

Test(admission, normal_limit_refuses_and_counts)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE);

	acquire_n(b, 64);
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	struct budget_stats s = stats(b);
	cr_assert_eq(s.tcp_in_use, 64);
	cr_assert_eq(s.tcp_peak, 64);
	cr_assert_eq(s.tcp_admitted, 64);
	cr_assert_eq(s.tcp_refused[BUDGET_NORMAL], 2);
	cr_assert_eq(s.tcp_refused[BUDGET_ELEVATED], 0);
	cr_assert_eq(s.tcp_refused[BUDGET_CRITICAL], 0);

	budget_tcp_release(b);
	cr_assert_eq(budget_tcp_acquire(b), 0);
	s = stats(b);
	cr_assert_eq(s.tcp_in_use, 64);
	cr_assert_eq(s.tcp_admitted, 65);
	for (int i = 0; i < 64; i++)
		budget_tcp_release(b);
	cr_assert_eq(stats(b).tcp_in_use, 0);
	cr_assert_eq(stats(b).tcp_peak, 64);
	budget_free(b);
}

/* Entering pressure revokes nothing; new sessions only once in_use < new limit. */
Test(admission, pressure_never_revokes_and_readmits_only_below_new_limit)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE);

	acquire_n(b, 40);
	budget_force_tier(b, BUDGET_CRITICAL);
	cr_assert_eq(budget_get_tier(b), BUDGET_CRITICAL);
	cr_assert_eq(stats(b).tcp_in_use, 40, "entering pressure must not revoke permits");

	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	for (int i = 0; i < 24; i++) { /* 40 -> 16: still not below the critical limit */
		budget_tcp_release(b);
		cr_assert_eq(budget_tcp_acquire(b), -EBUSY, "in_use %d", 40 - i - 1);
	}
	cr_assert_eq(stats(b).tcp_in_use, 16);
	cr_assert_eq(stats(b).tcp_refused[BUDGET_CRITICAL], 25);

	budget_tcp_release(b); /* 15 < 16 */
	cr_assert_eq(budget_tcp_acquire(b), 0);
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	cr_assert_eq(stats(b).tcp_in_use, 16);
	cr_assert_eq(stats(b).tcp_refused[BUDGET_CRITICAL], 26);
	cr_assert_eq(stats(b).tcp_refused[BUDGET_NORMAL], 0);

	/* Elevated: 32. Unforced: back to the computed tier (normal, no sample yet): 64. */
	budget_force_tier(b, BUDGET_ELEVATED);
	acquire_n(b, 16);
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	cr_assert_eq(stats(b).tcp_refused[BUDGET_ELEVATED], 1);
	budget_force_tier(b, -1);
	cr_assert_eq(stats(b).forced_tier, -1);
	cr_assert_eq(budget_get_tier(b), BUDGET_NORMAL);
	acquire_n(b, 32);
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	cr_assert_eq(stats(b).tcp_in_use, 64);
	cr_assert_eq(stats(b).tcp_admitted, 40 + 1 + 16 + 32);
	for (int i = 0; i < 64; i++)
		budget_tcp_release(b);
	budget_free(b);
}

Test(tiers, rss_thresholds_at_75_and_90_percent)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE); /* 50 MiB */
	const uint64_t lim = 50 * MiB;

	cr_assert_eq(budget_update_tier(b, 0), BUDGET_NORMAL);
	cr_assert_eq(budget_update_tier(b, lim * 75 / 100 - 1), BUDGET_NORMAL);
	cr_assert_eq(budget_update_tier(b, lim * 75 / 100), BUDGET_ELEVATED);
	cr_assert_eq(budget_update_tier(b, lim * 90 / 100 - 1), BUDGET_ELEVATED);
	cr_assert_eq(budget_update_tier(b, lim * 90 / 100), BUDGET_CRITICAL);
	cr_assert_eq(budget_update_tier(b, 10 * lim), BUDGET_CRITICAL);
	cr_assert_eq(stats(b).tier_changes, 2);
	cr_assert_eq(stats(b).rss_bytes, 10 * lim);
	cr_assert_eq(budget_update_tier(b, 1), BUDGET_NORMAL);
	cr_assert_eq(stats(b).tier_changes, 3);

	/* A forced tier wins over samples; unforcing returns to the last computed one. */
	budget_force_tier(b, BUDGET_CRITICAL);
	cr_assert_eq(budget_update_tier(b, 0), BUDGET_CRITICAL);
	cr_assert_eq(stats(b).forced_tier, BUDGET_CRITICAL);
	cr_assert_eq(budget_update_tier(b, lim * 80 / 100), BUDGET_CRITICAL);
	budget_force_tier(b, -1);
	cr_assert_eq(budget_get_tier(b), BUDGET_ELEVATED);
	budget_free(b);
}

Test(tiers, no_memory_limit_means_always_normal)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_DESKTOP);

	cr_assert_eq(budget_update_tier(b, UINT64_MAX), BUDGET_NORMAL);
	cr_assert_eq(budget_update_tier(b, 0), BUDGET_NORMAL);
	cr_assert_eq(stats(b).tier_changes, 0);
	budget_free(b);
}

Test(tiers, admission_follows_sampled_pressure)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE);

	acquire_n(b, 20);
	budget_update_tier(b, 46 * MiB); /* > 45 MiB: critical, limit 16 */
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	budget_update_tier(b, 40 * MiB); /* elevated, limit 32 */
	acquire_n(b, 12);
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	struct budget_stats s = stats(b);
	cr_assert_eq(s.tcp_refused[BUDGET_CRITICAL], 1);
	cr_assert_eq(s.tcp_refused[BUDGET_ELEVATED], 1);
	cr_assert_eq(s.tcp_in_use, 32);
	for (int i = 0; i < 32; i++)
		budget_tcp_release(b);
	budget_free(b);
}

Test(udp, sessions_bounded_and_counted)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE);

	for (int i = 0; i < 256; i++)
		cr_assert_eq(budget_udp_acquire(b), 0);
	cr_assert_eq(budget_udp_acquire(b), -EBUSY);
	budget_force_tier(b, BUDGET_CRITICAL); /* the tiers gate TCP admission only */
	budget_udp_release(b);
	cr_assert_eq(budget_udp_acquire(b), 0);
	struct budget_stats s = stats(b);
	cr_assert_eq(s.udp_in_use, 256);
	cr_assert_eq(s.udp_peak, 256);
	cr_assert_eq(s.udp_admitted, 257);
	cr_assert_eq(s.udp_refused, 1);
	for (int i = 0; i < 256; i++)
		budget_udp_release(b);
	cr_assert_eq(stats(b).udp_in_use, 0);
	budget_free(b);
}

Test(fds, reserve_refuses_before_running_out)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE); /* 1024 */

	cr_assert_eq(budget_fd_reserve(b, 1020), 0);
	cr_assert_eq(budget_fd_reserve(b, 5), -EMFILE); /* all-or-nothing: nothing taken */
	cr_assert_eq(stats(b).fds_in_use, 1020);
	cr_assert_eq(budget_fd_reserve(b, 4), 0);
	cr_assert_eq(budget_fd_reserve(b, 1), -EMFILE);
	cr_assert_eq(budget_fd_reserve(b, UINT32_MAX), -EMFILE);
	struct budget_stats s = stats(b);
	cr_assert_eq(s.fds_in_use, 1024);
	cr_assert_eq(s.fds_peak, 1024);
	cr_assert_eq(s.fd_refused, 3);
	budget_fd_release(b, 4);
	cr_assert_eq(budget_fd_reserve(b, 2), 0);
	budget_fd_release(b, 1022);
	cr_assert_eq(stats(b).fds_in_use, 0);
	budget_free(b);
}

/* An optional reservation (descriptors the caller can do without) is refused alike, all or
 * nothing, but is not counted as refused work. */
Test(fds, optional_reserve_is_refused_uncounted)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE); /* 1024 */

	cr_assert_eq(budget_fd_reserve_optional(b, 1022), 0);
	cr_assert_eq(budget_fd_reserve_optional(b, 3), -EMFILE);
	cr_assert_eq(stats(b).fds_in_use, 1022);
	cr_assert_eq(stats(b).fd_refused, 0);
	cr_assert_eq(budget_fd_reserve(b, 3), -EMFILE);
	cr_assert_eq(stats(b).fd_refused, 1);
	cr_assert_eq(budget_fd_reserve_optional(b, 2), 0);
	cr_assert_eq(stats(b).fds_peak, 1024);
	budget_fd_release(b, 1024);
	cr_assert_eq(stats(b).fds_in_use, 0);
	budget_free(b);
}

static struct budget *mk_bytes(uint64_t bytes)
{
	struct budget_limits l;

	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	l.buffer_bytes = bytes;
	return mk(&l);
}

Test(bytes, reserve_release_and_peak)
{
	struct budget *b = mk_bytes(1000);

	cr_assert_eq(budget_bytes_reserve(b, 600), 0);
	cr_assert_eq(budget_bytes_reserve(b, 401), -ENOBUFS);
	cr_assert_eq(budget_bytes_reserve(b, 400), 0);
	cr_assert_eq(budget_bytes_reserve(b, 1), -ENOBUFS);
	budget_bytes_release(b, 700);
	struct budget_stats s = stats(b);
	cr_assert_eq(s.buffer_bytes_in_use, 300);
	cr_assert_eq(s.buffer_bytes_peak, 1000);
	cr_assert_eq(s.buffer_refused, 2);

	budget_buffer_peak_reset(b);
	cr_assert_eq(stats(b).buffer_bytes_peak, 300);
	cr_assert_eq(budget_bytes_reserve(b, 50), 0);
	cr_assert_eq(stats(b).buffer_bytes_peak, 350);
	budget_bytes_release(b, 350);
	budget_free(b);
}

Test(bytes, buffer_stats_per_session)
{
	struct budget *b = mk_bytes(1 << 20);
	struct budget_buffer_stats bs;

	cr_assert_eq(budget_bytes_reserve(b, 9000), 0);
	budget_bytes_release(b, 3000);
	budget_buffer_stats(b, 4, &bs);
	cr_assert_eq(bs.bytes_in_use, 6000);
	cr_assert_eq(bs.bytes_peak, 9000);
	cr_assert_eq(bs.bytes_limit, 1 << 20);
	cr_assert_eq(bs.sessions, 4);
	cr_assert_eq(bs.bytes_per_session, 1500);
	cr_assert_eq(bs.peak_per_session, 2250);
	budget_buffer_stats(b, 0, &bs);
	cr_assert_eq(bs.bytes_per_session, 0);
	cr_assert_eq(bs.peak_per_session, 0);
	budget_bytes_release(b, 6000);
	budget_free(b);
}

/* Bytes abandoned for good (memory the kernel may still write) stay in use and under the
 * limit, are counted apart, and the budget can be freed with them outstanding. */
Test(bytes, abandoned_bytes_stay_in_use_and_the_budget_frees)
{
	struct budget *b = mk_bytes(1000);

	cr_assert_eq(budget_bytes_reserve(b, 600), 0);
	budget_bytes_abandon(b, 400);
	budget_bytes_release(b, 200);
	cr_assert_eq(stats(b).buffer_bytes_in_use, 400);
	cr_assert_eq(stats(b).buffer_bytes_abandoned, 400);
	cr_assert_eq(budget_bytes_reserve(b, 601), -ENOBUFS, "the abandoned bytes still count");
	cr_assert_eq(budget_bytes_reserve(b, 600), 0);
	budget_bytes_release(b, 600);
	budget_free(b);
}

#ifndef NDEBUG
/* Bytes neither released nor abandoned at the end are a caller's bug, abandoned or not. */
Test(bytes, outstanding_bytes_assert_at_free, .signal = SIGABRT)
{
	struct budget *b = mk_bytes(1000);

	cr_assert_eq(budget_bytes_reserve(b, 600), 0);
	budget_bytes_abandon(b, 400);
	budget_free(b);
}
#endif

Test(heap, malloc_is_accounted_and_refused_over_budget)
{
	struct budget *b = mk_bytes(1000);
	struct budget_buffer_stats bs;

	char *p = budget_malloc(b, 700);
	cr_assert_not_null(p);
	memset(p, 0x5A, 700);
	cr_assert_eq((uintptr_t)p % _Alignof(max_align_t), 0);
	cr_assert_null(budget_malloc(b, 301));
	uint32_t *q = budget_calloc(b, 75, 4);
	cr_assert_not_null(q);
	for (int i = 0; i < 75; i++)
		cr_assert_eq(q[i], 0);

	struct budget_stats s = stats(b);
	cr_assert_eq(s.buffer_bytes_in_use, 1000);
	cr_assert_eq(s.malloc_bytes_in_use, 1000);
	cr_assert_eq(s.malloc_blocks, 2);
	cr_assert_eq(s.malloc_refused, 1);
	cr_assert_eq(s.buffer_refused, 1);
	budget_buffer_stats(b, 2, &bs);
	cr_assert_eq(bs.malloc_bytes_in_use, 1000);
	cr_assert_eq(bs.bytes_per_session, 500);

	budget_mfree(b, p);
	budget_mfree(b, NULL);
	s = stats(b);
	cr_assert_eq(s.buffer_bytes_in_use, 300);
	cr_assert_eq(s.malloc_blocks, 1);
	p = budget_malloc(b, 700); /* room again after the free */
	cr_assert_not_null(p);
	budget_mfree(b, p);
	budget_mfree(b, q);
	s = stats(b);
	cr_assert_eq(s.buffer_bytes_in_use, 0);
	cr_assert_eq(s.malloc_bytes_in_use, 0);
	cr_assert_eq(s.malloc_blocks, 0);
	cr_assert_eq(s.buffer_bytes_peak, 1000);
	budget_free(b);
}

Test(heap, calloc_overflow_and_zero_size)
{
	struct budget *b = mk_bytes(1000);

	cr_assert_null(budget_calloc(b, SIZE_MAX / 2, 4));
	cr_assert_null(budget_malloc(b, SIZE_MAX));
	cr_assert_eq(stats(b).malloc_failed, 2);
	cr_assert_eq(stats(b).buffer_bytes_in_use, 0);

	void *z = budget_malloc(b, 0); /* like malloc(0): a unique pointer, nothing counted */
	cr_assert_not_null(z);
	cr_assert_eq(stats(b).buffer_bytes_in_use, 0);
	cr_assert_eq(stats(b).malloc_blocks, 1);
	budget_mfree(b, z);
	cr_assert_eq(stats(b).malloc_blocks, 0);
	budget_free(b);
}

/* A release without an acquire is a caller bug: debug builds abort on it; release builds clamp
 * at zero and count it so the gauge cannot wrap into "everything in use". */
#ifdef NDEBUG
Test(underflow, counted_and_clamped)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE);

	budget_tcp_release(b);
	budget_fd_release(b, 3);
	cr_assert_eq(stats(b).tcp_in_use, 0);
	cr_assert_eq(stats(b).fds_in_use, 0);
	cr_assert_eq(stats(b).release_underflow, 2);
	acquire_n(b, 64); /* admission still works: the gauge did not wrap */
	cr_assert_eq(budget_tcp_acquire(b), -EBUSY);
	for (int i = 0; i < 64; i++)
		budget_tcp_release(b);
	budget_free(b);
}
#else
Test(underflow, asserts_in_debug, .signal = SIGABRT)
{
	struct budget *b = mk_profile(BUDGET_PROFILE_MOBILE);

	budget_tcp_release(b);
}
#endif
