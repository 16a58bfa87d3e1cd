/* test_lwip_glue.c — lwIP's allocator (stacks/lwip/lwip_glue.c): blocks of more than 4 KiB are
 * rounded up to a size class (8 to 128 KiB in four steps per doubling, plus 256 bytes), charged
 * at that size, and kept for reuse when freed (up to an eighth of the budget's buffer bytes and
 * 8 MiB, only while the pressure tier is normal) instead of being handed back to glibc, whose
 * heap trimming would otherwise return and re-fault the pages of every large receive; a block
 * asked for in a class with nothing kept first gives back kept blocks of the other classes;
 * smaller blocks are charged exactly and freed; trimming and release empty the lists, and so
 * does a run of timer calls in which no kept block was reused. A block abandoned to the kernel
 * (lwip_glue_abandon) stays allocated, is no leak, leaves lwIP's bytes and keeps its charge
 * as abandoned, so the budget still closes. */
#include <criterion/criterion.h>

#include <string.h>

#include "core/budget.h"
#include "stacks/lwip/lwip_glue.h"
#include "testutil.h"

static struct budget *bud;

/* The bytes of the size class of n KiB. */
#define CLS(n) (((uint32_t)(n) << 10) + 256u)

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
	cr_assert_eq(lwip_glue_mem_bytes(), CLS(64), "charged at its class size");
	cr_assert_eq(budget_in_use(), CLS(64));
	ts_lwip_free(p);
	cr_assert_eq(lwip_glue_mem_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0, "a kept block is charged to nothing");
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(64));

	void *q = ts_lwip_malloc(58000); /* the same 64 KiB class */
	cr_assert_eq(q, p, "the kept block is handed out again");
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	memset(q, 0xa5, 40000);

	void *s = ts_lwip_malloc(3000);
	cr_assert_not_null(s);
	cr_assert_eq(lwip_glue_mem_bytes(), CLS(64) + 3000, "a small block is charged exactly");
	ts_lwip_free(s);
	cr_assert_eq(lwip_glue_cached_bytes(), 0, "a small block is not kept");
	ts_lwip_free(q);
	cr_assert_eq(lwip_glue_mem_bytes(), 0);
}

Test(lwip_glue, kept_blocks_are_bounded_by_an_eighth_of_the_budget)
{
	void *b64[40], *b128[40];

	/* 8 MiB of buffer bytes: at most 1 MiB kept, 15 blocks of the 64 KiB class. */
	for (int i = 0; i < 40; i++) {
		cr_assert_not_null(b64[i] = ts_lwip_malloc(60000));
		cr_assert_not_null(b128[i] = ts_lwip_malloc(120000));
	}
	cr_assert_eq(lwip_glue_mem_bytes(), 40u * (CLS(64) + CLS(128)));
	for (int i = 0; i < 40; i++)
		ts_lwip_free(b64[i]);
	cr_assert_eq(lwip_glue_cached_bytes(), 15u * CLS(64));
	for (int i = 0; i < 40; i++)
		ts_lwip_free(b128[i]);
	cr_assert_eq(lwip_glue_cached_bytes(), 15u * CLS(64), "a full cache keeps nothing more");
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
	cr_assert_eq(lwip_glue_cached_bytes(), ((8u << 20) / CLS(64)) * CLS(64));
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
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(64));
}

Test(lwip_glue, over_budget_refused_at_rounded_size)
{
	void *held[300];
	int n = 0;

	/* 8 MiB of budget: 203 blocks of the 40 KiB class; a block that would pass at its
	 * requested size (33100 bytes, just over the 32 KiB class) but not at its class size is
	 * refused. */
	while (n < 300 && (held[n] = ts_lwip_malloc(33100)))
		n++;
	cr_assert_eq(n, 203, "8 MiB holds 203 rounded blocks, not 253 requested ones (got %d)", n);
	cr_assert_eq(budget_in_use(), 203u * CLS(40));
	for (int i = 0; i < n; i++)
		ts_lwip_free(held[i]);
	cr_assert_eq(budget_in_use(), 0);
}

Test(lwip_glue, release_empties_and_later_frees_are_not_kept)
{
	void *a = ts_lwip_malloc(120000);
	void *b = ts_lwip_malloc(120000);

	ts_lwip_free(a);
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(128));
	lwip_glue_release();
	cr_assert_eq(lwip_glue_cached_bytes(), 0, "release gives kept blocks back");
	ts_lwip_free(b); /* freed after the owner left: to glibc, and released to its budget */
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0);
}

Test(lwip_glue, kept_blocks_unused_for_calls_in_a_row_are_given_back)
{
	void *a = ts_lwip_malloc(120000);

	cr_assert_not_null(a);
	cr_assert_not(lwip_glue_trim_unused(2), "nothing kept: nothing to give back");
	ts_lwip_free(a);
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(128));
	cr_assert_not(lwip_glue_trim_unused(2), "first call without reuse");

	a = ts_lwip_malloc(120000); /* reused: the count starts again */
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	ts_lwip_free(a);
	cr_assert_not(lwip_glue_trim_unused(2), "a reuse since the last call");
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(128));
	cr_assert_not(lwip_glue_trim_unused(2), "first call in a row without reuse");
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(128), "kept until the calls-th call");
	cr_assert(lwip_glue_trim_unused(2), "second call in a row: given back");
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0);
	cr_assert_not(lwip_glue_trim_unused(2), "the trim's own pops are not reuses");

	/* Kept again afterwards, and given back again after calls in a row. */
	a = ts_lwip_malloc(120000);
	ts_lwip_free(a);
	a = ts_lwip_malloc(120000);
	ts_lwip_free(a);
	cr_assert_not(lwip_glue_trim_unused(1), "reused since the last call");
	cr_assert(lwip_glue_trim_unused(1));
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
}

Test(lwip_glue, every_size_gets_the_smallest_class_that_holds_it)
{
	uint32_t cls[17];

	for (int i = 0; i < 17; i++)
		cls[i] = ((8192u << (i / 4)) / 4) * (4 + i % 4) + 256;
	cr_assert_eq(cls[16], CLS(128));
	for (size_t size = 4081; size <= (128u << 10) + 240; size += 7) {
		void *p = ts_lwip_malloc(size);
		uint64_t got = lwip_glue_mem_bytes();
		int k = 0;

		cr_assert_not_null(p);
		while (cls[k] < size + 16) /* our 16-byte header */
			k++;
		cr_assert_eq(got, cls[k], "size %zu: charged %llu, class %u expected", size,
			     (unsigned long long)got, cls[k]);
		ts_lwip_free(p);
	}
	/* Each class's edges: its bytes exactly, and one byte more (the next class). */
	for (int k = 0; k < 17; k++) {
		void *at = ts_lwip_malloc(cls[k] - 16);

		cr_assert_eq(lwip_glue_mem_bytes(), cls[k], "class %d, at its edge", k);
		void *past = ts_lwip_malloc(cls[k] - 15);

		cr_assert_eq(lwip_glue_mem_bytes(), cls[k] + (k < 16 ? cls[k + 1] : cls[k] - 15),
			     "class %d, one byte past its edge", k);
		ts_lwip_free(at);
		ts_lwip_free(past);
	}
	void *big = ts_lwip_malloc((128u << 10) + 241); /* past the largest class: exact */
	cr_assert_eq(lwip_glue_mem_bytes(), (128u << 10) + 241);
	ts_lwip_free(big);
	void *small = ts_lwip_malloc(4080); /* 4 KiB with the header: exact */
	cr_assert_eq(lwip_glue_mem_bytes(), 4080);
	ts_lwip_free(small);
}

Test(lwip_glue, a_power_of_two_of_data_and_its_headers_fit_that_class)
{
	/* A 16 KiB write's pbuf (struct pbuf and lwIP's header room come to well under 256
	 * bytes), a 64 KiB offloaded receive's pbuf. */
	void *w = ts_lwip_malloc(16384 + 150);
	void *r = ts_lwip_malloc(65535 + 40);

	cr_assert_not_null(w);
	cr_assert_not_null(r);
	cr_assert_eq(lwip_glue_mem_bytes(), CLS(16) + CLS(64), "not the 32 and 128 KiB classes");
	ts_lwip_free(w);
	ts_lwip_free(r);
	void *over = ts_lwip_malloc(16384 + 256); /* with our header, past the slack */
	cr_assert_eq(lwip_glue_mem_bytes(), CLS(20));
	ts_lwip_free(over);
}

Test(lwip_glue, a_class_with_nothing_kept_takes_room_from_the_others)
{
	void *s32[4], *b64[3];

	for (int i = 0; i < 4; i++)
		cr_assert_not_null(s32[i] = ts_lwip_malloc(30000));
	for (int i = 0; i < 4; i++)
		ts_lwip_free(s32[i]);
	cr_assert_eq(lwip_glue_cached_bytes(), 4u * CLS(32));
	cr_assert_not(lwip_glue_trim_unused(2), "the first call in a row without reuse");

	/* Nothing kept in the 64 KiB class: two 32 KiB blocks (at least one 64 KiB block's
	 * bytes) go back to glibc first; the other two stay. */
	cr_assert_not_null(b64[0] = ts_lwip_malloc(60000));
	cr_assert_eq(lwip_glue_cached_bytes(), 2u * CLS(32));
	/* Blocks given back to make room are not reuses: the unused count goes on. */
	cr_assert(lwip_glue_trim_unused(2), "the second call in a row without reuse");
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	for (int i = 0; i < 2; i++)
		cr_assert_not_null(s32[i] = ts_lwip_malloc(30000));
	for (int i = 0; i < 2; i++)
		ts_lwip_free(s32[i]);
	cr_assert_not_null(b64[1] = ts_lwip_malloc(60000));
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	cr_assert_not_null(b64[2] = ts_lwip_malloc(60000));
	cr_assert_eq(lwip_glue_cached_bytes(), 0, "nothing left to give back");
	cr_assert_eq(lwip_glue_mem_bytes(), 3u * CLS(64));

	/* A class with a block kept reuses it and leaves the others alone. */
	void *t = ts_lwip_malloc(30000);
	ts_lwip_free(t);
	ts_lwip_free(b64[0]);
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(32) + CLS(64));
	b64[0] = ts_lwip_malloc(60000);
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(32), "its own kept block, the 32 KiB one kept");

	/* The class with the most kept bytes gives first, one block being enough. */
	ts_lwip_free(b64[0]);
	ts_lwip_free(b64[1]);
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(32) + 2u * CLS(64));
	void *x = ts_lwip_malloc(16000); /* the 16 KiB class */
	cr_assert_not_null(x);
	cr_assert_eq(lwip_glue_cached_bytes(), CLS(32) + CLS(64));
	cr_assert_eq(budget_in_use(), CLS(16) + CLS(64), "given-back blocks are not charged");
	ts_lwip_free(x);
	ts_lwip_free(b64[2]);
	lwip_glue_trim();
	cr_assert_eq(lwip_glue_mem_bytes(), 0);
	cr_assert_eq(budget_in_use(), 0);
}

Test(lwip_glue, room_comes_from_the_class_with_most_kept_bytes_not_the_largest)
{
	void *s32[3], *b64, *x;

	for (int i = 0; i < 3; i++)
		cr_assert_not_null(s32[i] = ts_lwip_malloc(30000));
	cr_assert_not_null(b64 = ts_lwip_malloc(60000));
	for (int i = 0; i < 3; i++)
		ts_lwip_free(s32[i]);
	ts_lwip_free(b64);
	cr_assert_eq(lwip_glue_cached_bytes(), 3u * CLS(32) + CLS(64));
	x = ts_lwip_malloc(16000); /* the 16 KiB class: 3 x 32 KiB outweigh 1 x 64 KiB */
	cr_assert_not_null(x);
	cr_assert_eq(lwip_glue_cached_bytes(), 2u * CLS(32) + CLS(64), "one 32 KiB block gone");
	ts_lwip_free(x);
}

/* A block the kernel may still read (a lent frame whose write the driver's ring lost) is never
 * freed: it leaves lwIP's bytes, its class-size charge stays with the budget as abandoned,
 * nothing is kept for reuse, and the budget closes with it still allocated. Blocks of every
 * kind: a class block and a small one. */
Test(lwip_glue, an_abandoned_block_stays_allocated_and_the_budget_closes)
{
	struct budget_stats st;
	uint8_t *big = ts_lwip_malloc(60000), *small = ts_lwip_malloc(300);

	cr_assert_not_null(big);
	cr_assert_not_null(small);
	memset(big, 0x5a, 60000);
	memset(small, 0x3c, 300);
	lwip_glue_abandon(big);
	lwip_glue_abandon(small);
	cr_assert_eq(lwip_glue_mem_bytes(), 0, "no longer lwIP's");
	cr_assert_eq(lwip_glue_cached_bytes(), 0);
	budget_get_stats(bud, &st);
	cr_assert_eq(st.buffer_bytes_in_use, CLS(64) + 300);
	cr_assert_eq(st.buffer_bytes_abandoned, CLS(64) + 300, "charged for good");
	lwip_glue_release();
	budget_free(bud); /* every byte still in use is abandoned */
	bud = NULL;
	for (size_t i = 0; i < 60000; i++)
		cr_assert_eq(big[i], 0x5a, "still allocated, untouched");
	for (size_t i = 0; i < 300; i++)
		cr_assert_eq(small[i], 0x3c);
	CHECK_LEAKS();
}
