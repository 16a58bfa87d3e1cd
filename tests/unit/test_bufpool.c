/* test_bufpool.c — pool refusal (pool max and shared budget), recovery after put, peak and
 * cache behaviour, and the budget-wide buffer totals across pools. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "core/budget.h"
#include "core/bufpool.h"
#include "testutil.h"

static struct budget *mk_budget(uint64_t bytes)
{
	struct budget_limits l;
	struct budget *b = NULL;

	budget_limits_profile(&l, BUDGET_PROFILE_MOBILE);
	l.buffer_bytes = bytes;
	cr_assert_eq(budget_new(&l, &b), 0);
	return b;
}

static struct bufpool *mk_pool(struct budget *b, const char *name, size_t size, uint32_t max)
{
	struct bufpool *p = NULL;

	cr_assert_eq(bufpool_new(b, name, size, max, &p), 0);
	cr_assert_not_null(p);
	return p;
}

static struct bufpool_stats pstats(struct bufpool *p)
{
	struct bufpool_stats s;

	bufpool_get_stats(p, &s);
	return s;
}

Test(bufpool, rejects_bad_arguments)
{
	struct budget *b = mk_budget(4096);
	struct bufpool *p = (struct bufpool *)1;

	cr_assert_eq(bufpool_new(b, "x", 0, 10, &p), -EINVAL);
	cr_assert_null(p);
	cr_assert_eq(bufpool_new(b, "x", 64, 0, &p), -EINVAL);
	cr_assert_eq(bufpool_new(NULL, "x", 64, 10, &p), -EINVAL);
	cr_assert_eq(bufpool_new(b, NULL, 64, 10, &p), -EINVAL);
	bufpool_free(NULL);
	budget_free(b);
}

Test(bufpool, get_put_counts_and_reuses_from_cache)
{
	struct budget *b = mk_budget(1 << 20);
	struct bufpool *p = mk_pool(b, "pkt-with-a-long-name", 2048, 8);

	cr_assert_eq(bufpool_buf_size(p), 2048);
	uint8_t *a = bufpool_get(p);
	uint8_t *c = bufpool_get(p);
	cr_assert_not_null(a);
	cr_assert_not_null(c);
	memset(a, 1, 2048); /* the whole buffer is ours */
	memset(c, 2, 2048);
	cr_assert_eq((uintptr_t)a % _Alignof(max_align_t), 0);

	struct bufpool_stats s = pstats(p);
	cr_assert_str_eq(s.name, "pkt-with-a-long"); /* 15 characters kept */
	cr_assert_eq(s.bufs_in_use, 2);
	cr_assert_eq(s.bytes_in_use, 4096);
	cr_assert_eq(s.gets, 2);
	cr_assert_eq(s.mallocs, 2);

	bufpool_put(p, a);
	bufpool_put(p, NULL);
	uint8_t *d = bufpool_get(p); /* LIFO: the buffer just put comes back, no malloc */
	cr_assert_eq(d, a);
	s = pstats(p);
	cr_assert_eq(s.mallocs, 2);
	cr_assert_eq(s.gets, 3);
	cr_assert_eq(s.puts, 1);
	cr_assert_eq(s.bufs_cached, 0);

	bufpool_put(p, c);
	bufpool_put(p, d);
	s = pstats(p);
	cr_assert_eq(s.bufs_in_use, 0);
	cr_assert_eq(s.bufs_peak, 2);
	cr_assert_eq(s.bytes_peak, 4096);
	cr_assert_eq(s.bufs_cached, 2);
	cr_assert_eq(s.bytes_cached, 4096);
	cr_assert_eq(s.frees, 0);

	/* Cached buffers are not "in use" in the budget. */
	struct budget_stats bs;
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 0);
	cr_assert_eq(bs.buffer_bytes_peak, 4096);
	bufpool_free(p);
	budget_free(b);
}

Test(bufpool, pool_max_refuses_and_recovers)
{
	struct budget *b = mk_budget(1 << 20);
	struct bufpool *p = mk_pool(b, "small", 100, 3);
	void *v[3];

	for (int i = 0; i < 3; i++)
		cr_assert_not_null(v[i] = bufpool_get(p));
	cr_assert_null(bufpool_get(p));
	cr_assert_null(bufpool_get(p));
	struct bufpool_stats s = pstats(p);
	cr_assert_eq(s.refused_pool, 2);
	cr_assert_eq(s.refused_budget, 0);
	cr_assert_eq(s.gets, 3);

	struct budget_stats bs;
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 300);
	cr_assert_eq(bs.buffer_refused, 0, "a pool-max refusal must not touch the budget");

	bufpool_put(p, v[1]);
	cr_assert_not_null(v[1] = bufpool_get(p));
	for (int i = 0; i < 3; i++)
		bufpool_put(p, v[i]);
	bufpool_free(p);
	budget_free(b);
}

Test(bufpool, shared_budget_exhaustion_refuses_every_pool_until_put)
{
	struct budget *b = mk_budget(10000);
	struct bufpool *big = mk_pool(b, "relay", 4000, 100);
	struct bufpool *small = mk_pool(b, "pkt", 1500, 100);

	void *b1 = bufpool_get(big), *b2 = bufpool_get(big);
	cr_assert_not_null(b1);
	cr_assert_not_null(b2);
	cr_assert_null(bufpool_get(big));     /* 8000 + 4000 > 10000 */
	void *s1 = bufpool_get(small);        /* 9500 */
	cr_assert_not_null(s1);
	cr_assert_null(bufpool_get(small));   /* 11000 > 10000 */

	cr_assert_eq(pstats(big).refused_budget, 1);
	cr_assert_eq(pstats(small).refused_budget, 1);
	struct budget_stats bs;
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 9500);
	cr_assert_eq(bs.buffer_refused, 2);

	/* The accounted heap competes for the same bytes. */
	cr_assert_null(budget_malloc(b, 501));
	void *m = budget_malloc(b, 500);
	cr_assert_not_null(m);

	cr_assert_null(bufpool_get(small));   /* 10000 exactly in use */

	bufpool_put(big, b1); /* 6000 in use: both pools can get again */
	void *s2 = bufpool_get(small);        /* 7500 */
	cr_assert_not_null(s2);
	cr_assert_null(bufpool_get(big));     /* 11500 > 10000 */
	bufpool_put(small, s2);               /* 6000 */
	void *b3 = bufpool_get(big);          /* 10000 */
	cr_assert_not_null(b3);
	cr_assert_eq(pstats(big).refused_budget, 2);
	cr_assert_eq(pstats(small).refused_budget, 2);

	struct budget_buffer_stats bb;
	budget_buffer_stats(b, 4, &bb);
	cr_assert_eq(bb.bytes_in_use, 10000);
	cr_assert_eq(bb.bytes_peak, 10000);
	cr_assert_eq(bb.malloc_bytes_in_use, 500);
	cr_assert_eq(bb.bytes_per_session, 2500);

	bufpool_put(big, b2);
	bufpool_put(big, b3);
	bufpool_put(small, s1);
	budget_mfree(b, m);
	budget_buffer_stats(b, 4, &bb);
	cr_assert_eq(bb.bytes_in_use, 0);
	cr_assert_eq(bb.bytes_per_session, 0);
	cr_assert_eq(bb.bytes_peak, 10000);
	bufpool_free(big);
	bufpool_free(small);
	budget_free(b);
}

Test(bufpool, cache_cap_returns_excess_to_the_system)
{
	struct budget *b = mk_budget(1 << 20);
	struct bufpool *p = mk_pool(b, "cap", 256, 32);
	void *v[10];

	cr_assert_eq(pstats(p).cache_cap, 32); /* 1 MiB of 256-byte buffers, capped at max_bufs */
	bufpool_set_cache_cap(p, 4);
	for (int i = 0; i < 10; i++)
		cr_assert_not_null(v[i] = bufpool_get(p));
	for (int i = 0; i < 10; i++)
		bufpool_put(p, v[i]);
	struct bufpool_stats s = pstats(p);
	cr_assert_eq(s.bufs_cached, 4);
	cr_assert_eq(s.frees, 6);
	cr_assert_eq(s.mallocs, 10);
	cr_assert_eq(s.puts, 10);
	cr_assert_eq(s.bytes_in_use, 0);

	/* Steady state within the cache: no allocator calls. */
	for (int round = 0; round < 100; round++) {
		for (int i = 0; i < 4; i++)
			v[i] = bufpool_get(p);
		for (int i = 0; i < 4; i++)
			bufpool_put(p, v[i]);
	}
	s = pstats(p);
	cr_assert_eq(s.mallocs, 10);
	cr_assert_eq(s.frees, 6);
	cr_assert_eq(s.gets, 410);

	bufpool_set_cache_cap(p, 1); /* shrinking frees the excess now */
	cr_assert_eq(pstats(p).bufs_cached, 1);
	cr_assert_eq(pstats(p).frees, 9);
	cr_assert_eq(bufpool_trim(p), 1);
	cr_assert_eq(pstats(p).bufs_cached, 0);
	cr_assert_eq(pstats(p).frees, 10);
	cr_assert_eq(bufpool_trim(p), 0);

	bufpool_set_cache_cap(p, 0); /* no cache: every put frees */
	v[0] = bufpool_get(p);
	bufpool_put(p, v[0]);
	cr_assert_eq(pstats(p).bufs_cached, 0);
	cr_assert_eq(pstats(p).frees, 11);
	bufpool_free(p);
	budget_free(b);
}

Test(bufpool, default_cache_cap_scales_with_size)
{
	struct budget *b = mk_budget(64u << 20);
	struct bufpool *p1 = mk_pool(b, "tiny", 1024, 100000);
	struct bufpool *p2 = mk_pool(b, "huge", 1 << 20, 100000);
	struct bufpool *p3 = mk_pool(b, "few", 1024, 5);

	cr_assert_eq(pstats(p1).cache_cap, BUFPOOL_CACHE_BYTES / 1024);
	cr_assert_eq(pstats(p2).cache_cap, BUFPOOL_CACHE_MIN);
	cr_assert_eq(pstats(p3).cache_cap, 5);
	bufpool_free(p1);
	bufpool_free(p2);
	bufpool_free(p3);
	budget_free(b);
}

Test(bufpool, buffers_smaller_than_a_pointer_work)
{
	struct budget *b = mk_budget(100);
	struct bufpool *p = mk_pool(b, "bytes", 1, 200);
	void *v[100];

	for (int i = 0; i < 100; i++) {
		cr_assert_not_null(v[i] = bufpool_get(p));
		*(uint8_t *)v[i] = (uint8_t)i;
	}
	cr_assert_null(bufpool_get(p)); /* 100 bytes of budget: exactly 100 one-byte buffers */
	cr_assert_eq(pstats(p).refused_budget, 1);
	for (int i = 0; i < 100; i++)
		bufpool_put(p, v[i]);
	bufpool_free(p);
	budget_free(b);
}
