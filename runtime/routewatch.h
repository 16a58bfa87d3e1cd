/* routewatch.h — notice routing changes: a netlink socket joined to the link, route and rule
 * groups of both families, on the main loop. Any change (or an overrun of the socket, which
 * means changes were missed) arms a short timer; when it fires, the callback looks at the
 * whole state again (auto_route's reconcile, the route check). Changes arriving meanwhile are
 * folded into that one call, so a burst (a network manager rewriting its routes, our own
 * repairs) costs one pass, at most ROUTEWATCH_DELAY_MS after the first change (at once, when
 * libevent has no memory for the timer).
 *
 * Main loop only.
 */
#ifndef TS_RUNTIME_ROUTEWATCH_H
#define TS_RUNTIME_ROUTEWATCH_H

#include <stdint.h>

#define ROUTEWATCH_DELAY_MS 100

struct event_base;
struct routewatch;

typedef void (*routewatch_fn)(void *arg);

/* Start watching the network namespace of the calling thread. 0 or -errno. */
int routewatch_new(struct event_base *base, routewatch_fn fn, void *arg, struct routewatch **out)
	__attribute__((warn_unused_result));
/* Stop; a pending callback is not made. NULL is a no-op. */
void routewatch_free(struct routewatch *rw);
/* Changes seen so far (messages and overruns). */
uint64_t routewatch_events(const struct routewatch *rw);

#endif
