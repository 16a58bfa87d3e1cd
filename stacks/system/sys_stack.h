/* sys_stack.h — the system stack behind stacks/netstack.h (sys_stack_ops): the kernel's TCP
 * terminates the app's connections. Uplink packets are rewritten through the NAT table
 * (stacks/system/nat.h) toward kernel listeners on the gateway; the accept loop turns each
 * accepted socket back into its original 5-tuple and hands it to the dispatcher. Per-packet
 * work is stacks/system/sysproc.h. */
#ifndef TS_STACKS_SYSTEM_SYS_STACK_H
#define TS_STACKS_SYSTEM_SYS_STACK_H

#include "stacks/netstack.h"

extern const struct netstack_ops sys_stack_ops;

/* What the accept loop does when accept(2) fails with err (a positive errno). */
enum sys_accept_class {
	SYS_ACCEPT_AGAIN,   /* EAGAIN: nothing pending; wait for the next readiness */
	SYS_ACCEPT_BACKOFF, /* EMFILE, ENFILE, ENOBUFS, ENOMEM: pause accepting 50 ms, warn
			     * (rate-limited) */
	SYS_ACCEPT_RETRY,   /* EINTR, EPROTO, ECONNABORTED and the errors of the pending
			     * connection itself that accept(2) lists: pause 1 ms */
	SYS_ACCEPT_FATAL,   /* anything else: the stack stops accepting and reports through
			     * env->fatal */
};

/* The class of an accept(2) error. Pure. */
enum sys_accept_class sys_stack_accept_error_class(int err);

#endif
