/* test_ratemeter.c — rates over the window between kept samples (core/ratemeter.h). */
#include <criterion/criterion.h>

#include "core/ratemeter.h"

#define SEC(x) ((int64_t)(x) * 1000000000LL)
#define MS(x) ((int64_t)(x) * 1000000LL)

static struct ratemeter m;
static uint64_t out[2];

static int64_t at(int64_t now, uint64_t a, uint64_t b)
{
	uint64_t v[2] = { a, b };

	return ratemeter_sample(&m, now, v, out);
}

/* The first read: the rate since the start, whatever its age. */
Test(ratemeter, first_read_is_since_the_start)
{
	uint64_t zero[2] = { 0, 0 };

	ratemeter_init(&m, 2, SEC(1), SEC(10), zero);
	cr_assert_eq(at(SEC(10) + MS(500), 1000, 0), MS(500));
	cr_assert_eq(out[0], 2000, "1000 in half a second");
	cr_assert_eq(out[1], 0);
	cr_assert_eq(at(SEC(14), 9000, 400), SEC(4));
	cr_assert_eq(out[0], 2250);
	cr_assert_eq(out[1], 100);
}

/* A reader polling every 2 s sees each 2 s; one polling faster never has a window under 1 s. */
Test(ratemeter, window_follows_the_reader_and_never_shrinks_below_the_minimum)
{
	uint64_t zero[2] = { 0, 0 };

	ratemeter_init(&m, 2, SEC(1), 0, zero);
	cr_assert_eq(at(SEC(2), 2000, 0), SEC(2));
	cr_assert_eq(at(SEC(4), 6000, 0), SEC(2));
	cr_assert_eq(out[0], 2000, "the last 2 s only: (6000 - 2000) / 2");
	/* Reads 100 ms apart: each over the window since the sample at 4 s, or 2 s. */
	cr_assert_eq(at(SEC(4) + MS(100), 6100, 0), SEC(2) + MS(100));
	cr_assert_eq(at(SEC(5), 7000, 0), SEC(1));
	cr_assert_eq(out[0], 1000);
	cr_assert_eq(at(SEC(5) + MS(10), 7000, 0), SEC(1) + MS(10));
	cr_assert_eq(out[0], 990, "still averaged over at least a second");
}

/* The window starts at the older kept read, not at the newest read a second old: reads at 1,
 * 1.5, 2.4 and 2.6 s keep 1 and 2.4, so the last is over 1.6 s (from 1), not 1.1 (from 1.5).
 * A reader every 0.4 s sees up to 2 s: under 2 x 1 s + 0.4 s. */
Test(ratemeter, window_starts_at_the_older_kept_read)
{
	uint64_t zero[2] = { 0, 0 };
	int64_t w, most = 0;

	ratemeter_init(&m, 2, SEC(1), 0, zero);
	cr_assert_eq(at(SEC(1), 0, 0), SEC(1));
	cr_assert_eq(at(MS(1500), 0, 0), MS(1500));
	cr_assert_eq(at(MS(2400), 0, 0), MS(1400));
	cr_assert_eq(at(MS(2600), 0, 0), MS(1600));
	ratemeter_init(&m, 2, SEC(1), 0, zero);
	for (int i = 1; i <= 50; i++) {
		w = at(MS(400) * i, 0, 0);
		cr_assert_geq(w, i * MS(400) < SEC(1) ? i * MS(400) : SEC(1));
		most = w > most ? w : most;
	}
	cr_assert_eq(most, SEC(2));
	cr_assert_lt(most, 2 * SEC(1) + MS(400));
}

/* Traffic that stopped reads 0 once the window has moved past it. */
Test(ratemeter, idle_reads_zero)
{
	uint64_t zero[2] = { 0, 0 };

	ratemeter_init(&m, 2, SEC(1), 0, zero);
	at(SEC(1), 5000, 5000);
	at(SEC(2), 5000, 5000);
	cr_assert_eq(out[0], 0);
	cr_assert_eq(out[1], 0);
}

/* Large counters, long windows, a counter that went back, a read at the start. */
Test(ratemeter, edges)
{
	uint64_t big[2] = { UINT64_MAX - 1000000, 10 };

	ratemeter_init(&m, 2, SEC(1), SEC(1), big);
	cr_assert_eq(at(SEC(1), UINT64_MAX, 10), 0, "no time has passed");
	cr_assert_eq(out[0], 0);
	cr_assert_eq(at(SEC(3) + SEC(1), UINT64_MAX, 5), SEC(3));
	cr_assert_eq(out[0], 1000000 / 3);
	cr_assert_eq(out[1], 0, "a counter that went back reads 0");
	cr_assert_eq(at(SEC(100000) + SEC(4), UINT64_MAX, 5), SEC(100000));
}
