/* lwip_stack.h — the lwIP userspace stack behind stacks/netstack.h (lwip_stack_ops).
 *
 * lwIP keeps process-global state: one lwIP stack per process. A second start while one runs
 * fails with -EBUSY (the first is untouched); once the first is freed, a new one can start. */
#ifndef TS_STACKS_LWIP_STACK_H
#define TS_STACKS_LWIP_STACK_H

#include <stdint.h>

#include "core/flow.h"
#include "stacks/netstack.h"

struct stream;

extern const struct netstack_ops lwip_stack_ops;

/* Test seam: hand each accepted stream and its original 5-tuple to fn instead of the
 * dispatcher (fn owns the stream; the session's permit is released when fn's caller calls
 * lwip_stack_session_end(ns)). NULL restores dispatching. */
typedef void (*lwip_accept_fn)(void *arg, const struct flow_key *key, struct stream *s);
void lwip_stack_set_accept_hook(struct netstack *ns, lwip_accept_fn fn, void *arg);
void lwip_stack_session_end(struct netstack *ns);

/* Run lwIP's TCP timer now (tests with a virtual pace); the stack normally does it itself. */
void lwip_stack_tick(struct netstack *ns);

#endif
