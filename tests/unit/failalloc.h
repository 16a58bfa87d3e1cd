/* failalloc.h — make one chosen allocation of the project's own code fail.
 *
 * Every unit test executable is linked with -Wl,--wrap for malloc, calloc, realloc,
 * aligned_alloc and strdup (tests/tests.cmake): every call to them from the project's objects
 * and the test's own goes through the wrappers in failalloc.c, which pass it on (to ASan's
 * allocator in the ASan tree, so LeakSanitizer still sees everything) unless it is the one
 * armed to fail. Shared libraries (libevent, c-ares, OpenSSL, nghttp2, cJSON) are not wrapped:
 * what is tested is how this project's code meets a refused allocation of its own, and of a
 * library's that allocates through the project's allocator (libevent once core/evmem.h is
 * installed; c-ares, OpenSSL and nghttp2 once core/libmem.h is).
 *
 * With FAILALLOC_TRACE set in the environment, each refusal prints its call stack (stderr).
 *
 * The usual use is a sweep (failalloc_sweep): for n = 1, 2, ... arm the nth allocation, run a
 * scenario from start to teardown, and stop at the first n the scenario never reached.
 *
 * Two ways to count. failalloc_arm counts the calling thread's allocations only: the order is
 * the code's own, the same on every run, whatever other threads do. failalloc_arm_all counts
 * every thread's (one atomic counter), for a scenario whose work happens on threads the test
 * does not run — the public API's proxy assembles itself on the caller's thread but answers
 * stats and reloads, carries traffic and takes itself apart on its loop thread. Its order is
 * deterministic only while one thread allocates at a time: the test does one step, waits for
 * its outcome, then the next (a start; a connection; a datagram; a stats request; a reload; a
 * stop), and the configuration has no thread of its own that allocates meanwhile (one TUN
 * queue, nothing on a timer that allocates). Where that does not hold, a sweep still ends and
 * still refuses each allocation it reaches; it may only refuse a different one than a run
 * before it reached at the same n.
 */
#ifndef TS_TESTS_FAILALLOC_H
#define TS_TESTS_FAILALLOC_H

#include <stdbool.h>

#include "core/lsan.h"

/* From now on, the nth allocation (1: the next one) returns NULL, and the count starts again;
 * n <= 0 disarms, keeping what failalloc_seen and failalloc_fired report. Only the calling
 * thread's allocations count and fail. */
void failalloc_arm(long n);

/* The same for every thread's allocations (see above): the nth allocation of any thread not
 * held returns NULL; n <= 0 disarms. failalloc_seen and failalloc_fired then report the
 * process-wide count until failalloc_arm is called (arming either way disarms the other).
 * Arm it while no thread of the scenario allocates (between two steps). */
void failalloc_arm_all(long n);

/* While held, this thread's allocations are neither counted nor refused: for a test's own
 * buffers amid a scenario. Calls nest. */
void failalloc_hold(bool on);

/* Allocations seen since the last arm (on this thread, or on every thread after
 * failalloc_arm_all), and whether the armed one failed. */
long failalloc_seen(void);
bool failalloc_fired(void);

struct event;
struct event_base;

/* n timers an hour away, pending on base, made out of the count: they take the first places
 * of the base's timer heap, so that the code's next timer is the one that must grow it (a
 * sweep with evmem installed then refuses that growth). failalloc_unpad frees them. */
void failalloc_pad_timers(struct event_base *base, struct event **pads, int n);
void failalloc_unpad(struct event **pads, int n);

/* Timers an hour away added to base until its timer heap is full (at most max): the next
 * timer added that is not pending must grow the heap. Returns how many were added (pads[0..n),
 * for failalloc_unpad). Needs evmem installed (the heap's growth must be one of the counted
 * allocations); disarms any refusal armed before. */
int failalloc_fill_timers(struct event_base *base, struct event **pads, int max);

/* Run scenario(arg, false) once unarmed, then scenario(arg, true) with the nth allocation
 * refused for n = 1, 2, ... until an n it never reached (at most max; more fails the test).
 * After each run, in the ASan tree, LeakSanitizer must find nothing. The scenario asserts what
 * must hold; sweep tells it that a call may fail for want of memory. Returns the number of
 * allocations the scenario makes, and fails the test when it is below min (the wrapping not
 * linked, or a scenario that no longer reaches what it was written for). */
long failalloc_sweep(void (*scenario)(void *arg, bool sweep), void *arg, long min, long max);

/* The same for a scenario with too many allocations to refuse each in turn (a TLS handshake's
 * inside OpenSSL, with core/libmem.h installed): the unarmed run counts them (total), then
 * about `runs` runs refuse one each, spread evenly: the first, and every stride-th after it
 * (stride = total / runs, at least 1), until one the scenario never reached. Each run checks
 * as failalloc_sweep's do. Returns total; fails the test when it is below min. */
/* The runs a spread sweep asks for, given the Release tree's n: under AddressSanitizer, where
 * a run costs about twice as much and LeakSanitizer checks after each, a third of them, so
 * that `make test` stays within its time. */
#ifdef TS_LSAN
#define FAILALLOC_SPREAD_RUNS(n) ((n) / 3)
#else
#define FAILALLOC_SPREAD_RUNS(n) (n)
#endif
long failalloc_sweep_stride(void (*scenario)(void *arg, bool sweep), void *arg, long min,
			    long runs);

#endif
