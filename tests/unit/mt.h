/* mt.h — harness for the concurrency tests (tests/unit/test_*_mt.c).
 *
 * Normally these are Criterion tests. Under TSan they run from this header's own main()
 * instead: Criterion's BoxFort maps its shared arena at random addresses inside the range TSan
 * reserves for its shadow memory, so the runner fails to start in most runs (Criterion issue
 * #274). Standalone, a race ends the process with TSan's exit code (halt_on_error=1) and a
 * failed check aborts. Include this header in exactly one file of a test executable.
 *
 *   MT_TEST(suite, name) { ... CHECK_EQ(a, b); ... }
 */
#ifndef TS_TESTS_MT_H
#define TS_TESTS_MT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__SANITIZE_THREAD__)
#define TS_MT_STANDALONE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TS_MT_STANDALONE 1
#endif
#endif

#ifdef TS_MT_STANDALONE

#define MT_MAX_TESTS 64
static struct {
	const char *name;
	void (*fn)(void);
} mt_tests[MT_MAX_TESTS];
static int mt_ntests;

static inline void mt_register(const char *name, void (*fn)(void))
{
	if (mt_ntests == MT_MAX_TESTS)
		abort();
	mt_tests[mt_ntests].name = name;
	mt_tests[mt_ntests++].fn = fn;
}

static inline void mt_check_fail(const char *file, int line, const char *expr, uint64_t a,
				 uint64_t b)
{
	fprintf(stderr, "%s:%d: check failed: %s (%llu vs %llu)\n", file, line, expr,
		(unsigned long long)a, (unsigned long long)b);
	abort();
}

#define MT_CHECK_(op, a, b, ...)                                                                \
	do {                                                                                    \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                \
		if (!(a_ op b_))                                                                \
			mt_check_fail(__FILE__, __LINE__, #a " " #op " " #b, a_, b_);           \
	} while (0)
#define CHECK_EQ(...) MT_CHECK_(==, __VA_ARGS__, "")
#define CHECK_NEQ(...) MT_CHECK_(!=, __VA_ARGS__, "")
#define CHECK_LEQ(...) MT_CHECK_(<=, __VA_ARGS__, "")
#define CHECK_LT(...) MT_CHECK_(<, __VA_ARGS__, "")
#define CHECK_GT(...) MT_CHECK_(>, __VA_ARGS__, "")
#define CHECK_GEQ(...) MT_CHECK_(>=, __VA_ARGS__, "")
#define CHECK(cond, ...) MT_CHECK_(!=, (cond) ? 1 : 0, 0, "")

#define MT_TEST(suite, name)                                                                    \
	static void suite##_##name(void);                                                       \
	__attribute__((constructor)) static void suite##_##name##_register(void)               \
	{                                                                                       \
		mt_register(#suite "::" #name, suite##_##name);                                 \
	}                                                                                       \
	static void suite##_##name(void)

int main(void)
{
	for (int i = 0; i < mt_ntests; i++) {
		fprintf(stderr, "[ RUN  ] %s\n", mt_tests[i].name);
		mt_tests[i].fn();
		fprintf(stderr, "[ PASS ] %s\n", mt_tests[i].name);
	}
	printf("%d passed, 0 failed\n", mt_ntests);
	return 0;
}

#else /* Criterion */

#include <criterion/criterion.h>
#define CHECK_EQ(...) cr_assert_eq(__VA_ARGS__)
#define CHECK_NEQ(...) cr_assert_neq(__VA_ARGS__)
#define CHECK_LEQ(...) cr_assert_leq(__VA_ARGS__)
#define CHECK_LT(...) cr_assert_lt(__VA_ARGS__)
#define CHECK_GT(...) cr_assert_gt(__VA_ARGS__)
#define CHECK_GEQ(...) cr_assert_geq(__VA_ARGS__)
#define CHECK(...) cr_assert(__VA_ARGS__)
#define MT_TEST(suite, name) Test(suite, name, .timeout = 300)

#endif
#endif
