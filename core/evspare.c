/* evspare.c — a place in libevent's timer heap held for a timer (see evspare.h). */
#include "core/evspare.h"

#include <errno.h>
#include <event2/event.h>
#include <stddef.h>

#define EVSPARE_FAR_S 3600 /* far enough never to matter: held again when it fires */

static void on_spare(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)evspare_hold(arg);
}

int evspare_init(struct evspare *sp, struct event_base *base)
{
	sp->ev = evtimer_new(base, on_spare, sp);
	return sp->ev ? 0 : -ENOMEM;
}

void evspare_fini(struct evspare *sp)
{
	if (sp->ev)
		event_free(sp->ev);
	sp->ev = NULL;
}

bool evspare_held(const struct evspare *sp)
{
	return sp->ev && evtimer_pending(sp->ev, NULL);
}

bool evspare_hold(struct evspare *sp)
{
	struct timeval far = { EVSPARE_FAR_S, 0 };

	if (!sp->ev)
		return false;
	return evtimer_pending(sp->ev, NULL) || evtimer_add(sp->ev, &far) == 0;
}

void evspare_release(struct evspare *sp)
{
	if (evspare_held(sp))
		evtimer_del(sp->ev);
}

int evspare_add(struct evspare *sp, struct event *ev, const struct timeval *tv)
{
	int ret = 0;

	if (evtimer_add(ev, tv) != 0) {
		if (!evspare_held(sp))
			return -ENOMEM;
		/* The spare's place, given back, takes ev without the heap growing. */
		evtimer_del(sp->ev);
		if (evtimer_add(ev, tv) != 0) { /* not expected: the heap needs no memory then */
			(void)evspare_hold(sp);
			return -ENOMEM;
		}
		ret = EVSPARE_SPENT;
	}
	(void)evspare_hold(sp);
	return ret;
}
