/* test_fdpool.c — the process's pool of session descriptors (core/fdpool.c): budgets that
 * joined it share RLIMIT_NOFILE, each keeping its reserve, and a budget that goes away gives
 * back what it held. Each Criterion test runs in a process of its own, so the rlimit and the
 * pool are this test's. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sys/resource.h>

#include "core/budget.h"
#include "core/fdpool.h"

static struct budget *new_budget(uint32_t fds)
{
	struct budget_limits l;
	struct budget *b = NULL;

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	l.fds = fds;
	cr_assert_eq(budget_new(&l, &b), 0);
	return b;
}

static void set_nofile(rlim_t n)
{
	struct rlimit rl;

	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = n;
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

Test(fdpool, two_budgets_share_the_process_limit)
{
	struct fdpool_stats st;
	struct budget *a, *b;

	set_nofile(2 * BUDGET_FD_RESERVED + 10);
	a = new_budget(1000);
	b = new_budget(1000);
	budget_join_fd_pool(a);
	budget_join_fd_pool(b);
	fdpool_stats(&st);
	cr_assert_eq(st.members, 2);
	cr_assert_eq(st.size, 10, "the limit less one reserve per proxy: %llu",
		     (unsigned long long)st.size);

	cr_assert_eq(budget_fd_reserve(a, 6), 0);
	cr_assert_eq(budget_fd_reserve(b, 4), 0);
	/* B's own limit would allow more; the process does not. */
	cr_assert_eq(budget_fd_reserve(b, 1), -EMFILE);
	cr_assert_eq(budget_fd_reserve(a, 1), -EMFILE);
	fdpool_stats(&st);
	cr_assert_eq(st.in_use, 10);

	budget_fd_release(a, 2);
	cr_assert_eq(budget_fd_reserve(b, 2), 0, "what A gave back, B can take");
	budget_fd_release(b, 6);
	budget_fd_release(a, 4);
	fdpool_stats(&st);
	cr_assert_eq(st.in_use, 0);
	budget_free(a);
	budget_free(b);
	fdpool_stats(&st);
	cr_assert_eq(st.members, 0);
}

Test(fdpool, a_budget_that_goes_gives_back_and_resizes)
{
	struct fdpool_stats st;
	struct budget *a, *b;

	set_nofile(2 * BUDGET_FD_RESERVED + 10);
	a = new_budget(1000);
	b = new_budget(1000);
	budget_join_fd_pool(a);
	budget_join_fd_pool(b);
	cr_assert_eq(budget_fd_reserve(b, 3), 0);
	budget_fd_release(b, 3);
	budget_free(b); /* left the pool: one reserve less */
	fdpool_stats(&st);
	cr_assert_eq(st.members, 1);
	cr_assert_eq(st.size, BUDGET_FD_RESERVED + 10);
	cr_assert_eq(budget_fd_reserve(a, BUDGET_FD_RESERVED + 10), 0);
	cr_assert_eq(budget_fd_reserve(a, 1), -EMFILE);
	budget_fd_release(a, BUDGET_FD_RESERVED + 10);
	budget_free(a);
}

Test(fdpool, budgets_outside_the_pool_are_not_limited_by_it)
{
	struct budget *a = new_budget(50);

	set_nofile(BUDGET_FD_RESERVED + 1);
	cr_assert_eq(budget_fd_reserve(a, 50), 0, "tests and tools use budgets on their own");
	cr_assert_eq(budget_fd_reserve(a, 1), -EMFILE, "its own limit still holds");
	budget_fd_release(a, 50);
	budget_free(a);
}
