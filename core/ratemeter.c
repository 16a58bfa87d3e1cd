/* ratemeter.c — see ratemeter.h. */
#include "core/ratemeter.h"

#include <string.h>

void ratemeter_init(struct ratemeter *m, unsigned n, int64_t min_window_ns, int64_t now,
		    const uint64_t *v)
{
	memset(m, 0, sizeof(*m));
	m->n = n < RATEMETER_MAX ? n : RATEMETER_MAX;
	m->min_ns = min_window_ns > 0 ? min_window_ns : 1;
	m->t_old = m->t_new = now;
	memcpy(m->v_old, v, m->n * sizeof(*v));
	memcpy(m->v_new, v, m->n * sizeof(*v));
}

int64_t ratemeter_sample(struct ratemeter *m, int64_t now, const uint64_t *v, uint64_t *out)
{
	int64_t win;

	/* The newest kept sample old enough becomes the window's start; now is kept in its place. */
	if (now - m->t_new >= m->min_ns) {
		m->t_old = m->t_new;
		memcpy(m->v_old, m->v_new, m->n * sizeof(*v));
		m->t_new = now;
		memcpy(m->v_new, v, m->n * sizeof(*v));
	}
	win = now - m->t_old;
	for (unsigned i = 0; i < m->n; i++) {
		if (win <= 0 || v[i] <= m->v_old[i]) {
			out[i] = 0;
			continue;
		}
		/* In long double: no overflow on the way; a rate past 2^64 (a huge count over a
		 * nanosecond) is held at the top. */
		long double r = (long double)(v[i] - m->v_old[i]) * 1e9L / (long double)win;
		out[i] = r >= 0x1p64L ? UINT64_MAX : (uint64_t)r;
	}
	return win > 0 ? win : 0;
}
