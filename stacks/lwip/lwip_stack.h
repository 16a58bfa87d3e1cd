/* lwip_stack.h — the lwIP userspace stack behind stacks/netstack.h (lwip_stack_ops).
 *
 * lwIP keeps process-global state: one lwIP stack per process (a second start fails). */
#ifndef TS_STACKS_LWIP_STACK_H
#define TS_STACKS_LWIP_STACK_H

#include <stdint.h>

#include "core/flow.h"
#include "stacks/netstack.h"

struct budget;
struct stream;

extern const struct netstack_ops lwip_stack_ops;

/* Memory glue (lwip_glue.c): the budget lwIP allocations are charged to, and what lwIP holds. */
void ts_lwip_set_budget(struct budget *b);
uint64_t ts_lwip_mem_bytes(void);

/* Test seam: hand each accepted stream and its original 5-tuple to fn instead of the
 * dispatcher (fn owns the stream; the session's permit is released when fn's caller calls
 * lwip_stack_session_end(ns)). NULL restores dispatching. */
typedef void (*lwip_accept_fn)(void *arg, const struct flow_key *key, struct stream *s);
void lwip_stack_set_accept_hook(struct netstack *ns, lwip_accept_fn fn, void *arg);
void lwip_stack_session_end(struct netstack *ns);

/* Run lwIP's TCP timer now (tests with a virtual pace); the stack normally does it itself. */
void lwip_stack_tick(struct netstack *ns);

#endif
