/* netstack.h — the interface both TCP/IP stacks implement.
 *
 * The config field "stack" picks one implementation at start ("system" or "lwip"); it is never
 * switched at run time (seed 000 §九). A stack turns packets read from the TUN into sessions
 * (original 5-tuple + a stack-side stream) for the dispatcher, and emits packets through the
 * I/O driver's tx(). The system stack's sans-IO packet path is stacks/system/sysproc.h; the
 * driver, listeners and sessions arrive with the end-to-end issue, lwIP after it.
 */
#ifndef TS_STACKS_NETSTACK_H
#define TS_STACKS_NETSTACK_H

#include <stddef.h>
#include <stdint.h>

#include "core/flow.h"

struct netstack;     /* one running stack instance */
struct netstack_env; /* what the process lends a stack: loop, TUN driver, config, budget, stats */

/* What a stack does with one packet the driver read. */
enum netstack_verdict {
	NETSTACK_CONSUMED, /* the stack took it (or dropped and counted it) */
	NETSTACK_WRITE,    /* rewritten in place: the driver writes it back */
	NETSTACK_UDP,      /* hand it to the shared UDP path */
};

struct netstack_ops {
	const char *name; /* "system" or "lwip": the config's "stack" value */
	/* Start on env; return only when ready to carry traffic (listeners bound, etc.).
	 * 0, or -errno with a one-line reason in err. */
	int (*start)(struct netstack_env *env, struct netstack **out, char *err, size_t errlen);
	/* Stop accepting, close sessions, release everything. Idempotent. */
	void (*stop)(struct netstack *ns);
	/* Process one packet read from the TUN (meta: its offload header). */
	enum netstack_verdict (*input)(struct netstack *ns, uint8_t *buf, size_t len,
				       const struct pkt_meta *meta, size_t *out_len);
	/* The stack's counters, as (name, value) pairs. */
	void (*counters)(const struct netstack *ns,
			 void (*fn)(void *arg, const char *name, uint64_t value), void *arg);
};

#endif
