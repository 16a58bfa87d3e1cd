/* memback.c — memory back once the traffic stops (see memback.h). */
#include "runtime/memback.h"

#include <errno.h>
#include <event2/event.h>
#include <string.h>

#include "core/clock.h"
#include "core/rss.h"

/* false: libevent had no memory for the timer (not armed). */
static bool arm(struct memback *m, int64_t ns)
{
	struct timeval tv = { .tv_sec = ns / TS_NS_PER_SEC,
			      .tv_usec = (ns % TS_NS_PER_SEC) / 1000 + 1 };

	m->armed = evtimer_add(m->ev, &tv) == 0;
	return m->armed;
}

static void trim(struct memback *m)
{
	m->armed = false;
	m->bytes_trimmed = m->bytes;
	for (unsigned i = 0; i < m->nhooks; i++)
		m->hook[i].fn(m->hook[i].arg);
	rss_heap_trim();
	ctr_inc(&m->trims);
}

/* Traffic since: look again when it may be over. A look that cannot be timed (no memory for
 * the timer) trims now: memory back is the right answer to that too. */
static void on_quiet(evutil_socket_t fd, short what, void *arg)
{
	struct memback *m = arg;
	int64_t idle = ts_now_ns() - m->last_ns;

	(void)fd;
	(void)what;
	if (idle < MEMBACK_QUIET_NS && arm(m, MEMBACK_QUIET_NS - idle))
		return;
	trim(m);
}

int memback_init(struct memback *m, struct event_base *base)
{
	memset(m, 0, sizeof(*m));
	m->ev = evtimer_new(base, on_quiet, m);
	return m->ev ? 0 : -ENOMEM;
}

void memback_fini(struct memback *m)
{
	if (m->ev)
		event_free(m->ev);
	m->ev = NULL;
	m->armed = false;
}

int memback_on_quiet(struct memback *m, memback_hook_fn fn, void *arg)
{
	if (m->nhooks == MEMBACK_HOOKS)
		return -ENOSPC;
	m->hook[m->nhooks].fn = fn;
	m->hook[m->nhooks].arg = arg;
	m->nhooks++;
	return 0;
}

void memback_note(struct memback *m, int64_t now_ns, uint64_t bytes)
{
	m->last_ns = now_ns;
	m->bytes = bytes;
	/* Not timed (no memory for the timer): the trim now, and no other try before another
	 * MEMBACK_MIN_BYTES have moved. */
	if (!m->armed && m->ev && bytes - m->bytes_trimmed >= MEMBACK_MIN_BYTES &&
	    !arm(m, MEMBACK_QUIET_NS))
		trim(m);
}
