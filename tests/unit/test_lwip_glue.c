/* test_lwip_glue.c — lwIP's allocator (stacks/lwip/lwip_glue.c): blocks of more than 4 KiB are
 * rounded up to a power of two, charged at that size, and kept for reuse when freed (up to an
 * eighth of the budget's buffer bytes and 8 MiB, only while the pressure tier is normal) instead
 * of being handed back to glibc, whose heap trimming would otherwise return and re-fault the
 * pages of every large receive; smaller blocks are
 * charged exactly and freed; trimming and release empty the lists, and so does a run of timer
 * calls in which no kept block was reused. */
#include <criterion/criterion.h>

#include <string.h>

#include "core/budget.h"
#include "stacks/lwip/lwip_glue.h"

static struct budget *bud;

static void setup(void)
{
	struct budget_limits l;

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	l.buffer_bytes = 8u << 20;
	cr_assert_eq(budget_new(&l, &bud), 0);
	cr_assert_eq(lwip_glue_claim(bud), 0);
}

static void teardown(void)
{
	if (lwip_glue_claimed())
		lwip_glue_release();
	budget_free(bud);
}

static uint64_t budget_in_use(void)
{
	struct budget_buffer_stats s;

	budget_buffer_stats(bud, 0, &s);
	return s.bytes_in_use;
}

TestSuite(lwip_glue, .init = setup, .fini = teardown);

Test(lwip_glue, large_block_reused_small_block_freed)
{
	void *p = ts_lwip_malloc(60000);

	cr_assert_not_null(p);
	cr_assert_eq(lwip_glue_mem_bytes(), 65536, "charged at its rounded size");
	cr_assert_eq(budget_in_use(), 65536);
	ts_lwip_free(p);
	cr_assert_eq(lwip_glue_mem_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0, "a kept block is charged to nothing");
	cr_assert_eq(lwip_glue_cached_bytes(), 65536);

	void *q = ts_lwip_malloc(40000); /* the same 64 KiB size */
	cr_assert_eq(q, p, "the kept block is handed out again");
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	memset(q, 0xa5, 40000);

	void *s = ts_lwip_malloc(3000);
	cr_assert_not_null(s);
	cr_assert_eq(lwip_glue_mem_bytes(), 65536 + 3000, "a small block is charged exactly");
	ts_lwip_free(s);
	cr_assert_eq(lwip_glue_cached_bytes(), 0, "a small block is not kept");
	ts_lwip_free(q);
	cr_assert_eq(lwip_glue_mem_bytes(), 0);
}

Test(lwip_glue, kept_blocks_are_bounded_by_an_eighth_of_the_budget)
{
	void *b64[40], *b128[40];

	/* 8 MiB of buffer bytes: at most 1 MiB kept. */
	for (int i = 0; i < 40; i++) {
		cr_assert_not_null(b64[i] = ts_lwip_malloc(60000));
		cr_assert_not_null(b128[i] = ts_lwip_malloc(100000));
	}
	cr_assert_eq(lwip_glue_mem_bytes(), 40u * (65536 + 131072));
	for (int i = 0; i < 40; i++)
		ts_lwip_free(b64[i]);
	cr_assert_eq(lwip_glue_cached_bytes(), 1u << 20);
	for (int i = 0; i < 40; i++)
		ts_lwip_free(b128[i]);
	cr_assert_eq(lwip_glue_cached_bytes(), 1u << 20, "a full cache keeps nothing more");
	cr_assert_eq(lwip_glue_mem_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0);
	lwip_glue_trim();
	cr_assert_eq(lwip_glue_cached_bytes(), 0, "trim gives every kept block back");
}

Test(lwip_glue, kept_blocks_never_exceed_8_mib)
{
	struct budget_limits l;
	struct budget *big;
	static void *held[200];

	lwip_glue_release();
	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP); /* 256 MiB: an eighth would be 32 */
	cr_assert_eq(budget_new(&l, &big), 0);
	cr_assert_eq(lwip_glue_claim(big), 0);
	for (int i = 0; i < 200; i++)
		cr_assert_not_null(held[i] = ts_lwip_malloc(60000));
	for (int i = 0; i < 200; i++)
		ts_lwip_free(held[i]);
	cr_assert_eq(lwip_glue_cached_bytes(), 8u << 20);
	lwip_glue_release();
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	budget_free(big);
}

Test(lwip_glue, nothing_kept_under_memory_pressure)
{
	void *p = ts_lwip_malloc(60000);

	budget_force_tier(bud, BUDGET_ELEVATED);
	ts_lwip_free(p);
	cr_assert_eq(lwip_glue_cached_bytes(), 0, "an elevated tier gives freed blocks back");
	budget_force_tier(bud, BUDGET_NORMAL);
	p = ts_lwip_malloc(60000);
	ts_lwip_free(p);
	cr_assert_eq(lwip_glue_cached_bytes(), 65536);
}

Test(lwip_glue, over_budget_refused_at_rounded_size)
{
	void *held[200];
	int n = 0;

	/* 8 MiB of budget: 128 blocks of 64 KiB; a block that would pass at its requested size
	 * (33000 bytes) but not at its rounded one (64 KiB) is refused. */
	while (n < 200 && (held[n] = ts_lwip_malloc(33000)))
		n++;
	cr_assert_eq(n, 128, "8 MiB holds 128 rounded blocks, not 254 requested ones (got %d)", n);
	cr_assert_eq(budget_in_use(), 8u << 20);
	for (int i = 0; i < n; i++)
		ts_lwip_free(held[i]);
	cr_assert_eq(budget_in_use(), 0);
}

Test(lwip_glue, release_empties_and_later_frees_are_not_kept)
{
	void *a = ts_lwip_malloc(70000);
	void *b = ts_lwip_malloc(70000);

	ts_lwip_free(a);
	cr_assert_eq(lwip_glue_cached_bytes(), 131072);
	lwip_glue_release();
	cr_assert_eq(lwip_glue_cached_bytes(), 0, "release gives kept blocks back");
	ts_lwip_free(b); /* freed after the owner left: back to the system, released to its budget */
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0);
}

Test(lwip_glue, kept_blocks_unused_for_calls_in_a_row_are_given_back)
{
	void *a = ts_lwip_malloc(70000);

	cr_assert_not_null(a);
	cr_assert_not(lwip_glue_trim_unused(2), "nothing kept: nothing to give back");
	ts_lwip_free(a);
	cr_assert_eq(lwip_glue_cached_bytes(), 131072);
	cr_assert_not(lwip_glue_trim_unused(2), "first call without reuse");

	a = ts_lwip_malloc(70000); /* reused: the count starts again */
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	ts_lwip_free(a);
	cr_assert_not(lwip_glue_trim_unused(2), "a reuse since the last call");
	cr_assert_eq(lwip_glue_cached_bytes(), 131072);
	cr_assert_not(lwip_glue_trim_unused(2), "first call in a row without reuse");
	cr_assert_eq(lwip_glue_cached_bytes(), 131072, "kept until the calls-th call");
	cr_assert(lwip_glue_trim_unused(2), "second call in a row: given back");
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0);
	cr_assert_not(lwip_glue_trim_unused(2), "the trim's own pops are not reuses");

	/* Kept again afterwards, and given back again after calls in a row. */
	a = ts_lwip_malloc(70000);
	ts_lwip_free(a);
	a = ts_lwip_malloc(70000);
	ts_lwip_free(a);
	cr_assert_not(lwip_glue_trim_unused(1), "reused since the last call");
	cr_assert(lwip_glue_trim_unused(1));
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
}
