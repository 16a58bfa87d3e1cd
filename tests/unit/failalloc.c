/* failalloc.c — the allocation wrappers of failalloc.h (linked with -Wl,--wrap=...). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/libmem.h"
#include "failalloc.h"
#include "testutil.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
char *__real_strdup(const char *s);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
char *__wrap_strdup(const char *s);

static _Thread_local long fail_at; /* 0: disarmed */
static _Thread_local long seen;
static _Thread_local bool fired;
static _Thread_local int held;
/* failalloc_arm_all: every thread's allocations, one counter. */
static atomic_long all_fail_at; /* 0: disarmed */
static atomic_long all_seen;
static atomic_bool all_fired;
static atomic_bool all_mode;    /* seen and fired report the process-wide count */

void failalloc_arm(long n)
{
	atomic_store(&all_mode, false);
	atomic_store(&all_fail_at, 0);
	if (n <= 0) {
		fail_at = 0;
		return;
	}
	fail_at = n;
	seen = 0;
	fired = false;
}

void failalloc_arm_all(long n)
{
	atomic_store(&all_mode, true);
	fail_at = 0;
	if (n <= 0) {
		atomic_store(&all_fail_at, 0);
		return;
	}
	atomic_store(&all_seen, 0);
	atomic_store(&all_fired, false);
	atomic_store(&all_fail_at, n);
}

void failalloc_hold(bool on)
{
	held += on ? 1 : -1;
}

long failalloc_seen(void)
{
	return atomic_load(&all_mode) ? atomic_load(&all_seen) : seen;
}

bool failalloc_fired(void)
{
	return atomic_load(&all_mode) ? atomic_load(&all_fired) : fired;
}

/* True when this allocation is the one to refuse: the thread's armed one, or the process's. */
static bool refuse(void)
{
	long at;

	if (held)
		return false;
	if (fail_at) {
		if (++seen != fail_at)
			return false;
		fired = true;
		at = seen;
	} else {
		long all = atomic_load_explicit(&all_fail_at, memory_order_relaxed);
		if (!all || (at = atomic_fetch_add(&all_seen, 1) + 1) != all)
			return false;
		atomic_store(&all_fired, true);
	}
	if (getenv("FAILALLOC_TRACE")) { /* where the refused allocation was asked for */
		void *pc[16];
		int n = backtrace(pc, 16);

		dprintf(2, "failalloc: allocation %ld refused at\n", at);
		backtrace_symbols_fd(pc, n, 2);
	}
	return true;
}

void *__wrap_malloc(size_t n)
{
	return refuse() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return refuse() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	return refuse() ? NULL : __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
	return refuse() ? NULL : __real_aligned_alloc(align, n);
}

char *__wrap_strdup(const char *s)
{
	return refuse() ? NULL : __real_strdup(s);
}

/* One run of scenario with the nth allocation refused, LeakSanitizer after it; whether the
 * refusal was reached. */
static bool refused_run(void (*scenario)(void *arg, bool sweep), void *arg, long n)
{
	failalloc_arm(n);
	scenario(arg, true);
	failalloc_arm(0);
	CHECK_LEAKS();
	return failalloc_fired();
}

long failalloc_sweep(void (*scenario)(void *arg, bool sweep), void *arg, long min, long max)
{
	long n;

	scenario(arg, false);
	CHECK_LEAKS();
	for (n = 1; n <= max; n++)
		if (!refused_run(scenario, arg, n))
			break;
	cr_assert_leq(n, max, "the scenario still allocated after %ld refusals", max);
	cr_assert_gt(n, min, "the scenario made %ld allocations, fewer than %ld (is the wrapping "
		     "linked?)", n - 1, min);
	return n - 1;
}

long failalloc_sweep_stride(void (*scenario)(void *arg, bool sweep), void *arg, long min,
			    long runs)
{
	long total, stride, n;

	failalloc_arm(LONG_MAX); /* counts, never reached */
	scenario(arg, false);
	total = failalloc_seen();
	failalloc_arm(0);
	CHECK_LEAKS();
	cr_assert_gt(total, min, "the scenario made %ld allocations, fewer than %ld (is the "
		     "wrapping linked?)", total, min);
	stride = total / runs > 1 ? total / runs : 1;
	for (n = 1; n <= 2 * total; n += stride)
		if (!refused_run(scenario, arg, n))
			break;
	cr_assert_leq(n, 2 * total, "the scenario still allocated after %ld refusals", n);
	return total;
}

static void on_pad(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

void failalloc_pad_timers(struct event_base *base, struct event **pads, int n)
{
	struct timeval far = { 3600, 0 };

	failalloc_hold(true);
	for (int i = 0; i < n; i++) {
		cr_assert_not_null(pads[i] = evtimer_new(base, on_pad, NULL));
		cr_assert_eq(evtimer_add(pads[i], &far), 0);
	}
	failalloc_hold(false);
}

int failalloc_fill_timers(struct event_base *base, struct event **pads, int max)
{
	struct timeval far = { 3600, 0 };
	int n, rc;

	for (n = 0; n < max; n++) {
		failalloc_hold(true);
		cr_assert_not_null(pads[n] = evtimer_new(base, on_pad, NULL));
		failalloc_hold(false);
		failalloc_arm(1); /* a place in the heap needs no allocation; its growth does */
		rc = evtimer_add(pads[n], &far);
		failalloc_arm(0);
		if (rc != 0) {
			failalloc_hold(true);
			event_free(pads[n]);
			failalloc_hold(false);
			break;
		}
	}
	cr_assert_lt(n, max, "the timer heap never filled (is evmem installed?)");
	return n;
}

void failalloc_unpad(struct event **pads, int n)
{
	failalloc_hold(true);
	for (int i = 0; i < n; i++)
		event_free(pads[i]);
	failalloc_hold(false);
}

/* OpenSSL in a test executable: Criterion's start-up (libgit2, then libssh2) initialises
 * libcrypto before main, so core/tlslib.c's hand-over to core/libmem.c when it opens the
 * library comes after OpenSSL's first allocation, and OpenSSL refuses it. These functions take
 * its place, given to OpenSSL before main: once a test has installed libmem they pass each
 * call to it (the allocations counted there and refusable here, as twinstack runs them), and
 * before that, or in a test that never installs it, to the C library unwrapped (no refusal
 * inside OpenSSL, as before). */
static void *early_malloc(size_t n, const char *file, int line)
{
	return libmem_installed() ? libmem_crypto_malloc(n, file, line) : __real_malloc(n);
}

static void *early_realloc(void *p, size_t n, const char *file, int line)
{
	return libmem_installed() ? libmem_crypto_realloc(p, n, file, line) : __real_realloc(p, n);
}

static void early_free(void *p, const char *file, int line)
{
	if (libmem_installed())
		libmem_crypto_free(p, file, line);
	else
		free(p);
}

__attribute__((constructor)) static void openssl_early(void)
{
	libmem_crypto_set_fn set = (libmem_crypto_set_fn)dlsym(RTLD_DEFAULT,
							       "CRYPTO_set_mem_functions");

	if (set)
		(void)set(early_malloc, early_realloc, early_free);
}
