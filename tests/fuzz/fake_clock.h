/* fake_clock.h — a fuzz target's virtual clock: the monotonic clocks read fake_now, which the
 * target moves as its input says, so timers fire when the input wants and every run of an
 * input is the same; the other clocks (libFuzzer's wall clock) are the kernel's. Included by
 * one .c of a target (it defines clock_gettime, which the target's own code and libevent
 * call in place of the C library's). */
#ifndef TS_FUZZ_FAKE_CLOCK_H
#define TS_FUZZ_FAKE_CLOCK_H

#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MS 1000000LL
#define SEC 1000000000LL

static int64_t fake_now = 1000 * SEC;

int clock_gettime(clockid_t id, struct timespec *ts);

int clock_gettime(clockid_t id, struct timespec *ts)
{
	if (id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE || id == CLOCK_MONOTONIC_RAW ||
	    id == CLOCK_BOOTTIME) {
		ts->tv_sec = fake_now / SEC;
		ts->tv_nsec = fake_now % SEC;
		return 0;
	}
	return (int)syscall(SYS_clock_gettime, id, ts);
}

#endif
