/* evspare.h — a place in libevent's timer heap held for a timer that must not go unarmed.
 *
 * Why: evtimer_add fails in one case only — the timer is not pending, the event base's timer
 * heap is full, and the heap cannot grow (no memory). The heap never shrinks, and a timer that
 * fires or is deleted gives its place back, so a timer re-armed from its own callback fails
 * only when other timers took the place meanwhile (callbacks of the same loop pass that ran
 * first). For most timers a refusal can be answered at once (the wait fails, the trim happens
 * now). A timer that bounds the life of things already made — lwIP's TCP timer, the UDP path's
 * idle expiry — has no such answer: unarmed, those things live until something else happens.
 *
 * An evspare keeps one timer of its own pending, far off, while its owner has something to
 * time. When the owner's timer cannot be added, the spare is deleted and the add done again in
 * the place it gave back, which needs no memory. The spare is held again by the next call that
 * finds room for it; until then a second refusal finds no spare (the owner's own fallback).
 *
 * One owner per spare, on the loop's thread. Its far-off timeout only ever fires for an owner
 * that keeps it for an hour (it is then held again).
 */
#ifndef TS_CORE_EVSPARE_H
#define TS_CORE_EVSPARE_H

#include <stdbool.h>

struct event;
struct event_base;
struct timeval;

struct evspare {
	struct event *ev; /* the spare timer; NULL before init and after fini */
};

/* 0, or -ENOMEM: no memory for the spare's event (nothing held). Not held yet. */
int evspare_init(struct evspare *sp, struct event_base *base)
	__attribute__((warn_unused_result));

/* Frees the spare (pending or not). Idempotent. */
void evspare_fini(struct evspare *sp);

/* Hold the place: the spare pending. true if it is (it may need the heap to grow). */
bool evspare_hold(struct evspare *sp);

/* Give the place back: the owner has nothing to time any more. */
void evspare_release(struct evspare *sp);

/* Whether a place is held now. */
bool evspare_held(const struct evspare *sp);

/* evtimer_add(ev, tv); when libevent has no memory for it, in the spare's place. Either way the
 * spare is then held again if it can be. Returns 0 (ev pending), EVSPARE_SPENT (ev pending in
 * the spare's place), or -ENOMEM (ev not pending: no spare was held). */
#define EVSPARE_SPENT 1
int evspare_add(struct evspare *sp, struct event *ev, const struct timeval *tv);

#endif
