/* test_slab.c — objects packed in blocks of their own: zeroed, aligned, never shared; blocks
 * mapped on demand and unmapped when empty (one kept); objects counted by the budget and
 * refused by it without harm to the objects already out. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "core/budget.h"
#include "core/slab.h"

static struct budget *mk_budget(uint64_t bytes)
{
	struct budget_limits l;
	struct budget *b = NULL;

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	l.buffer_bytes = bytes;
	cr_assert_eq(budget_new(&l, &b), 0);
	return b;
}

static uint64_t budget_bytes(struct budget *b)
{
	struct budget_stats st;

	budget_get_stats(b, &st);
	return st.buffer_bytes_in_use;
}

static struct slab_stats sstats(struct slab *s)
{
	struct slab_stats st;

	slab_get_stats(s, &st);
	return st;
}

Test(slab, rejects_bad_arguments)
{
	struct budget *b = mk_budget(1 << 20);
	struct slab *s = (struct slab *)1;

	cr_assert_eq(slab_new(b, 0, &s), -EINVAL);
	cr_assert_null(s);
	cr_assert_eq(slab_new(NULL, 64, &s), -EINVAL);
	cr_assert_eq(slab_new(b, SLAB_BLOCK_BYTES / 4 + 1, &s), -EINVAL);
	slab_free(NULL);
	slab_put(NULL, NULL);
	budget_free(b);
}

/* Thousands of objects over several blocks: each zeroed, 16-aligned, distinct and writable
 * without touching another; the budget counts each object's rounded size; all back, the
 * blocks go back but one and the budget is where it started. */
Test(slab, objects_fill_blocks_and_blocks_go_back)
{
	enum { N = 3000, SIZE = 200 };
	static uint8_t *o[N];
	struct budget *b = mk_budget(64u << 20);
	struct slab *s = NULL;
	uint64_t b0 = budget_bytes(b);

	cr_assert_eq(slab_new(b, SIZE, &s), 0);
	cr_expect_eq(sstats(s).object_size, 208);
	cr_expect_eq(sstats(s).blocks, 0, "nothing mapped up front");
	for (int i = 0; i < N; i++) {
		o[i] = slab_zalloc(s);
		cr_assert_not_null(o[i]);
		cr_assert_eq((uintptr_t)o[i] % 16, 0);
		for (int j = 0; j < SIZE; j++)
			cr_assert_eq(o[i][j], 0, "object %d byte %d", i, j);
		memset(o[i], (uint8_t)(i + 1), 208);
	}
	struct slab_stats st = sstats(s);
	uint64_t per_block = (SLAB_BLOCK_BYTES - 64) / 208;

	cr_expect_eq(st.objects, N);
	cr_expect_eq(st.blocks, (N + per_block - 1) / per_block, "blocks %llu",
		     (unsigned long long)st.blocks);
	cr_expect_eq(budget_bytes(b) - b0, (uint64_t)N * 208);
	for (int i = 0; i < N; i++)
		for (int j = 0; j < 208; j += 52)
			cr_assert_eq(o[i][j], (uint8_t)(i + 1), "object %d overwritten", i);
	/* Free every other object: blocks stay (each still holds some), then the rest. */
	for (int i = 0; i < N; i += 2)
		slab_put(s, o[i]);
	cr_expect_eq(sstats(s).blocks, st.blocks);
	/* A freed object comes back zeroed. */
	uint8_t *again = slab_zalloc(s);

	for (int j = 0; j < SIZE; j++)
		cr_assert_eq(again[j], 0);
	slab_put(s, again);
	for (int i = 1; i < N; i += 2)
		slab_put(s, o[i]);
	cr_expect_eq(sstats(s).objects, 0);
	cr_expect_eq(sstats(s).blocks, 1, "one empty block kept");
	cr_expect_eq(budget_bytes(b), b0);
	slab_free(s);
	cr_expect_eq(budget_bytes(b), b0);
	budget_free(b);
}

/* Churn at a block's edge (one object in a second block, taken and freed over and over) maps
 * the second block once. */
Test(slab, churn_at_a_block_edge_keeps_one_block)
{
	struct budget *b = mk_budget(64u << 20);
	struct slab *s = NULL;

	cr_assert_eq(slab_new(b, 1024, &s), 0);
	uint64_t per_block = (SLAB_BLOCK_BYTES - 64) / 1024;
	void *full[64];

	for (uint64_t i = 0; i < per_block; i++)
		cr_assert_not_null(full[i] = slab_zalloc(s));
	cr_expect_eq(sstats(s).blocks, 1);
	for (int r = 0; r < 100; r++) {
		void *p = slab_zalloc(s);

		cr_assert_not_null(p);
		cr_assert_eq(sstats(s).blocks, 2);
		slab_put(s, p);
		cr_assert_eq(sstats(s).blocks, 2, "the empty block is kept");
	}
	for (uint64_t i = 0; i < per_block; i++)
		slab_put(s, full[i]);
	cr_expect_eq(sstats(s).blocks, 1, "two empty blocks: one unmapped");
	slab_free(s);
	budget_free(b);
}

/* A budget with room for three objects: the fourth is refused and counted, the objects out
 * are untouched, and a freed object makes room again. */
Test(slab, budget_refuses_an_object_and_recovers)
{
	struct budget *b = mk_budget(3 * 4096 + 100);
	struct slab *s = NULL;
	uint8_t *o[3];

	cr_assert_eq(slab_new(b, 4096, &s), 0);
	for (int i = 0; i < 3; i++) {
		cr_assert_not_null(o[i] = slab_zalloc(s));
		o[i][0] = (uint8_t)(0xa0 + i);
	}
	cr_expect_null(slab_zalloc(s));
	cr_expect_eq(sstats(s).refused, 1);
	cr_expect_eq(sstats(s).objects, 3);
	for (int i = 0; i < 3; i++)
		cr_expect_eq(o[i][0], (uint8_t)(0xa0 + i));
	slab_put(s, o[1]);
	cr_expect_not_null(o[1] = slab_zalloc(s));
	for (int i = 0; i < 3; i++)
		slab_put(s, o[i]);
	slab_free(s);
	budget_free(b);
}
