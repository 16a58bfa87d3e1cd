/* failalloc.h — make one chosen allocation of the project's own code fail.
 *
 * A test executable named test_nomem* is linked with -Wl,--wrap for malloc, calloc, realloc,
 * aligned_alloc and strdup (tests/tests.cmake): every call to them from the project's objects
 * and the test's own goes through the wrappers in failalloc.c, which pass it on (to ASan's
 * allocator in the ASan tree, so LeakSanitizer still sees everything) unless it is the one
 * armed to fail. Shared libraries (libevent, c-ares, cJSON) are not wrapped: what is tested is
 * how this project's code meets a refused allocation of its own.
 *
 * The usual use is a sweep: for n = 1, 2, ... arm the nth allocation, run a scenario from
 * start to teardown, and stop at the first n the scenario never reached.
 */
#ifndef TS_TESTS_FAILALLOC_H
#define TS_TESTS_FAILALLOC_H

#include <stdbool.h>

/* From now on, the nth allocation (1: the next one) returns NULL, and the count starts again;
 * n <= 0 disarms, keeping what failalloc_seen and failalloc_fired report. Only the calling
 * thread's allocations count and fail. */
void failalloc_arm(long n);

/* Allocations seen on this thread since the last arm, and whether the armed one failed. */
long failalloc_seen(void);
bool failalloc_fired(void);

#endif
