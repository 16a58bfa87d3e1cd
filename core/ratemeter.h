/* ratemeter.h — rates of cumulative counters over a recent window, sampled when read.
 *
 * The reader (the stats document) hands in the counters' values and the time. Two samples are
 * kept: a read at least min_window after the newer one replaces the older with the newer and
 * becomes the newer itself. Each rate is the growth per second since the older kept sample, so
 * the window is at least min_window and shorter than 2 x min_window + P for a reader polling
 * every P seconds (exactly P when P >= min_window); two readers at once never shrink it below
 * min_window. No timer: nothing runs
 * while nobody reads, so an idle proxy does not wake up for it. Sans-IO: the time is passed in.
 * Not thread-safe: one reader at a time (the proxy builds its document on its loop).
 */
#ifndef TS_CORE_RATEMETER_H
#define TS_CORE_RATEMETER_H

#include <stdint.h>

#define RATEMETER_MAX 8

struct ratemeter {
	unsigned n;
	int64_t min_ns;
	int64_t t_old, t_new;
	uint64_t v_old[RATEMETER_MAX], v_new[RATEMETER_MAX];
};

/* n counters (at most RATEMETER_MAX) whose values are v at now (the start: usually zeros). */
void ratemeter_init(struct ratemeter *m, unsigned n, int64_t min_window_ns, int64_t now,
		    const uint64_t *v);

/* Sample v at now. out[i]: the growth of v[i] per second over the window (0 for a counter that
 * went back). Returns the window in ns; 0 when now is not after the start (every out[i] 0). */
int64_t ratemeter_sample(struct ratemeter *m, int64_t now, const uint64_t *v, uint64_t *out);

#endif
