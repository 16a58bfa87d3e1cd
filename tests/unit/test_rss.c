/* test_rss.c — the /proc/self/status parser on fixed texts (well-formed and malformed) and a
 * real sample of this process. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/rss.h"
#include "testutil.h"

static int parse(const char *text, struct rss_info *out)
{
	return rss_parse(text, strlen(text), out);
}

static const char real_status[] =
	"Name:\ttest_rss\n"
	"Umask:\t0022\n"
	"State:\tR (running)\n"
	"Pid:\t4242\n"
	"VmPeak:\t   12000 kB\n"
	"VmSize:\t   11000 kB\n"
	"VmLck:\t       0 kB\n"
	"VmHWM:\t    5120 kB\n"
	"VmRSS:\t    4096 kB\n"
	"RssAnon:\t     1024 kB\n"
	"Threads:\t1\n";

Test(rss_parse, real_layout)
{
	struct rss_info r = { 0 };

	cr_assert_eq(parse(real_status, &r), 0);
	cr_assert_eq(r.rss_bytes, 4096ull * 1024);
	cr_assert_eq(r.hwm_bytes, 5120ull * 1024);
}

Test(rss_parse, length_bounds_the_text)
{
	struct rss_info r = { 0 };
	/* Cut just before "VmRSS": the parser must not read past len (no NUL is needed). */
	size_t cut = (size_t)(strstr(real_status, "VmRSS") - real_status);

	cr_assert_eq(rss_parse(real_status, cut, &r), -ENOENT);
	/* Cut in the middle of the VmRSS number: malformed ("40" without a unit). */
	cr_assert_eq(rss_parse(real_status, cut + strlen("VmRSS:\t    40"), &r), -EINVAL);
	cr_assert_eq(rss_parse(real_status, 0, &r), -ENOENT);
}

Test(rss_parse, missing_hwm_falls_back_to_rss)
{
	struct rss_info r = { 0 };

	cr_assert_eq(parse("VmRSS: 10 kB", &r), 0); /* no trailing newline either */
	cr_assert_eq(r.rss_bytes, 10240);
	cr_assert_eq(r.hwm_bytes, 10240);
}

Test(rss_parse, field_must_start_the_line)
{
	struct rss_info r = { 0 };

	cr_assert_eq(parse("XVmRSS:\t 5 kB\nVmHWM:\t 9 kB\n", &r), -ENOENT);
	cr_assert_eq(parse("Foo: VmRSS: 5 kB\n", &r), -ENOENT);
	cr_assert_eq(parse("VmRSSx:\t5 kB\n", &r), -ENOENT);
	cr_assert_eq(parse("", &r), -ENOENT);
}

Test(rss_parse, malformed_values)
{
	struct rss_info r = { 0 };

	cr_assert_eq(parse("VmRSS:\t kB\n", &r), -EINVAL);             /* no digits */
	cr_assert_eq(parse("VmRSS:\t 12 MB\n", &r), -EINVAL);          /* other unit */
	cr_assert_eq(parse("VmRSS:\t 12\n", &r), -EINVAL);             /* no unit */
	cr_assert_eq(parse("VmRSS:\t 12 kBytes\n", &r), -EINVAL);      /* trailing junk */
	cr_assert_eq(parse("VmRSS:\t -12 kB\n", &r), -EINVAL);         /* sign */
	cr_assert_eq(parse("VmRSS:\t 1 2 kB\n", &r), -EINVAL);
	cr_assert_eq(parse("VmRSS:\t 12 kB\nVmHWM:\t x kB\n", &r), -EINVAL); /* bad HWM */
	cr_assert_eq(parse("VmRSS:\t 12 kB \r\n", &r), 0);             /* trailing blanks ok */
	cr_assert_eq(r.rss_bytes, 12 * 1024);
}

Test(rss_parse, overflow_is_erange)
{
	struct rss_info r = { 0 };

	/* 2^64 kB does not fit; neither does 2^60 kB once converted to bytes. */
	cr_assert_eq(parse("VmRSS: 18446744073709551616 kB\n", &r), -ERANGE);
	cr_assert_eq(parse("VmRSS: 1152921504606846976 kB\n", &r), -ERANGE);
	cr_assert_eq(parse("VmRSS: 18014398509481983 kB\n", &r), 0); /* (2^64-1)/1024 */
	cr_assert_eq(r.rss_bytes, 18014398509481983ull * 1024);
}

Test(rss_parse, first_occurrence_wins)
{
	struct rss_info r = { 0 };

	cr_assert_eq(parse("VmRSS: 1 kB\nVmRSS: 2 kB\nVmHWM: 3 kB\n", &r), 0);
	cr_assert_eq(r.rss_bytes, 1024);
	cr_assert_eq(r.hwm_bytes, 3072);
}

Test(rss_sample, this_process)
{
	struct rss_info r = { 0 };

	cr_assert_eq(rss_sample(&r), 0);
	cr_assert_gt(r.rss_bytes, 0);
	cr_assert_geq(r.hwm_bytes, r.rss_bytes);
	cr_assert_eq(r.rss_bytes % 1024, 0);
}

Test(rss_sample, grows_when_memory_is_touched)
{
	struct rss_info before, after;
	const size_t n = 64u << 20;

	cr_assert_eq(rss_sample(&before), 0);
	char *p = malloc(n);
	cr_assert_not_null(p);
	memset(p, 0x11, n); /* touch every page so it becomes resident */
	cr_assert_eq(rss_sample(&after), 0);
	cr_assert_geq(after.rss_bytes, before.rss_bytes + n / 2,
		      "rss %llu -> %llu", (unsigned long long)before.rss_bytes,
		      (unsigned long long)after.rss_bytes);
	cr_assert_geq(after.hwm_bytes, after.rss_bytes);
	volatile char sink = p[n - 1];
	(void)sink;
	free(p);
}

Test(rss_sample, missing_file_is_an_errno)
{
	struct rss_info r;

	cr_assert_eq(rss_sample_path("/nonexistent/status", &r), -ENOENT);
	cr_assert_eq(rss_sample_path("/proc/self/stat", &r), -ENOENT); /* no VmRSS there */
}

static size_t resident_pages(void *p, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
	size_t n = ((uintptr_t)p + len - a + (size_t)page - 1) / (size_t)page, r = 0;
	unsigned char v[64];

	cr_assert_leq(n, sizeof(v));
	cr_assert_eq(mincore((void *)a, n * (size_t)page, v), 0);
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	return r;
}

/* A buffer's whole inner pages go back and read as zero; its edges (shared with the heap's
 * other blocks and headers) keep their bytes; the buffer stays usable. */
Test(rss_pages_release, gives_back_the_inner_pages)
{
	enum { LEN = 100000 };
	uint8_t *b = malloc(LEN);
	long page = sysconf(_SC_PAGESIZE);

	cr_assert_not_null(b);
	memset(b, 0x77, LEN);
	size_t before = resident_pages(b, LEN);
	size_t given = rss_pages_release(b, LEN);
	size_t after = resident_pages(b, LEN);

	cr_expect_geq(given, (size_t)(LEN - 2 * page), "given %zu", given);
	cr_expect_eq(given % (size_t)page, 0);
	cr_expect_eq(before - after, given / (size_t)page, "resident %zu -> %zu", before, after);
	cr_expect_eq(b[0], 0x77, "the first page is shared: kept");
	cr_expect_eq(b[LEN - 1], 0x77, "the last page is shared: kept");
	size_t inner = (size_t)(((uintptr_t)b + (uintptr_t)page - 1) / (uintptr_t)page *
				(uintptr_t)page - (uintptr_t)b);
	cr_expect_eq(b[inner], 0, "an inner page reads as zero");
	memset(b, 0x11, LEN);
	cr_expect_eq(b[inner], 0x11);
	free(b);
	cr_expect_eq(rss_pages_release(NULL, 5000), 0);
	uint8_t small[100];
	cr_expect_eq(rss_pages_release(small, sizeof(small)), 0, "no whole page inside");
}

Test(rss_tunables, the_cache_is_switched_off_and_other_settings_kept)
{
	char out[128];

	cr_assert_eq(rss_tunables_tcache_off(NULL, out, sizeof(out)), 0);
	cr_expect_str_eq(out, "glibc.malloc.tcache_count=0");
	cr_assert_eq(rss_tunables_tcache_off("", out, sizeof(out)), 0);
	cr_expect_str_eq(out, "glibc.malloc.tcache_count=0");
	cr_assert_eq(rss_tunables_tcache_off("glibc.malloc.arena_max=2", out, sizeof(out)), 0);
	cr_expect_str_eq(out, "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0");
	/* The caller's own size wins (and a second start does not add it again). */
	strcpy(out, "untouched");
	cr_expect_eq(rss_tunables_tcache_off("glibc.malloc.tcache_count=7", out, sizeof(out)), 1);
	cr_expect_eq(rss_tunables_tcache_off("a=1:glibc.malloc.tcache_count=0", out, sizeof(out)),
		     1);
	cr_expect_str_eq(out, "untouched");
	cr_expect_eq(rss_tunables_tcache_off("glibc.malloc.arena_max=2", out, 20), -ENOSPC);
	cr_expect_eq(rss_tunables_tcache_off(NULL, out, 27), -ENOSPC, "no room for the NUL");
	cr_expect_eq(rss_tunables_tcache_off(NULL, out, 28), 0);
}
