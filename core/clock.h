/* clock.h — the monotonic clock, read by I/O drivers and loops (once per batch), never by the
 * sans-IO cores, which take now_ns as a parameter. */
#ifndef TS_CORE_CLOCK_H
#define TS_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

#define TS_NS_PER_MS 1000000LL
#define TS_NS_PER_SEC 1000000000LL

static inline int64_t ts_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * TS_NS_PER_SEC + ts.tv_nsec;
}

/* CPU time of the calling thread (including kernel work done in its context, such as the
 * receive processing inside a write to a TUN); a system call, unlike ts_now_ns. 0 on error. */
static inline int64_t ts_thread_cpu_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * TS_NS_PER_SEC + ts.tv_nsec;
}

#endif
