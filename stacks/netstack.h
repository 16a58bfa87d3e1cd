/* netstack.h — the interface both TCP/IP stacks implement.
 *
 * The config field "stack" picks one implementation at start ("system" or "lwip"); it is never
 * switched at run time (a failed start is reported, not papered over with the other stack). A
 * stack turns packets read from the TUN into sessions (original 5-tuple + a stack-side stream) for
 * the shared dispatcher, and emits packets of its own through env->tx (the driver). Its per-packet
 * function is called by the driver.
 */
#ifndef TS_STACKS_NETSTACK_H
#define TS_STACKS_NETSTACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "core/driver.h"
#include "core/flow.h"
#include "core/pkt.h"
#include "stacks/common/l3policy.h"

struct event_base;
struct ts_config;
struct udp_path;
struct budget;
struct dispatcher;
struct log;
struct loopguard;
struct netstack;
struct driver_rxbuf;

/* What the process lends a stack. Everything is borrowed and outlives the stack. */
struct netstack_env {
	struct event_base *base;
	const struct ts_config *cfg;
	struct budget *budget;
	struct dispatcher *dispatcher;
	struct log *log;
	struct loopguard *loopguard; /* the proxy's own ports: the policy's loop check (or NULL) */
	/* Let TCP to the gateway's port 53 in (with dns.hijack): the dispatcher answers it
	 * itself. Set exactly when the dispatcher has a DNS resolver (dispatcher_set_dns). */
	bool dns_tcp;
	tun_tx_fn tx;       /* packets the stack builds itself (plain, fully checksummed) */
	void *tx_arg;
	/* With TUN offload: send a packet with offload metadata (a GSO super-packet), arg tx_arg.
	 * NULL without offload. */
	int (*tx_meta)(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m);
	/* With tx_meta: the same from memory the stack lends until release(rel_arg, lost),
	 * written with later ones in one batch; tx_flush writes what is lent now. lost: the
	 * write was lost with the driver's ring, and the kernel may still read the memory: the
	 * stack keeps it allocated for good and abandons its charge. Both NULL, or both set
	 * (core/driver.h: driver_tx_lend, driver_tx_flush). */
	int (*tx_lend)(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m,
		       void (*release)(void *rel_arg, bool lost), void *rel_arg);
	void (*tx_flush)(void *arg);
	/* With tx_meta: keep the read buffer holding the packet the stack's input was given
	 * instead of copying the packet out (core/driver.h: driver_rx_take), arg tx_arg: queue
	 * 0's driver, so only for a stack that reads that queue alone and frees what it took on
	 * its loop (lwIP). NULL without offload. */
	struct driver_rxbuf *(*rx_take)(void *arg, const uint8_t *pkt);
	/* The UDP path (dispatch/udp.h): a stack may carry some of its flows in the kernel
	 * (udp_path_set_offload), and must take the offload away again in its free. */
	struct udp_path *udp;
	const char *tun_name;
	int tun_ifindex;    /* the TUN device's index in this namespace (0: not in it) */
	/* A fatal runtime error inside the stack (e.g. the accept loop's "anything else"): the
	 * stack calls this once with -errno and a message; the process stops with exit 1. */
	void (*fatal)(void *arg, int err, const char *msg);
	void *fatal_arg;
};

/* The same figures for every stack (a figure that does not apply reads 0). */
struct netstack_stats {
	uint64_t rewrites;
	uint64_t drops_malformed, drops_fragment, drops_esp, drops_icmp;
	uint64_t drops_unmapped_downlink, drops_own_address, drops_nat_exhausted, drops_loop;
	uint64_t drops_half_open;         /* SYNs refused: the half-open limits (a SYN flood) */
	uint64_t drops_special_destination; /* first SYNs and datagrams to one (l3policy.h) */
	uint64_t drops_protocol;          /* neither TCP, UDP nor the family's ICMP */
	uint64_t drops_unmapped_rst;      /* system: unmapped uplink RSTs, never answered */
	uint64_t drops_no_memory;         /* lwIP: no memory for an input segment */
	uint64_t unmapped_uplink_rst;     /* RSTs answered to unmapped uplink segments */
	uint64_t admission_refused, fd_exhausted;
	uint64_t nat_half_open, nat_active, nat_closing, nat_quarantined;
	uint64_t accepted;                /* sessions handed to the dispatcher */
	uint64_t stack_bytes;             /* userspace bytes the stack itself holds */
	/* The system stack's in-kernel fast path (nat.fast_path): its state, the connections in
	 * its map now, those put in it, those it had no room for, those it refused otherwise, and
	 * what it rewrote (packets as the TUN saw them, the segments they hold, bytes). */
	enum netstack_fast_path { NETSTACK_FAST_PATH_NONE, NETSTACK_FAST_PATH_OFF,
				  NETSTACK_FAST_PATH_UNAVAILABLE, NETSTACK_FAST_PATH_ON } fast_path;
	uint64_t fast_path_conns, fast_path_added, fast_path_full, fast_path_failed;
	uint64_t fast_path_packets, fast_path_segments, fast_path_bytes, fast_path_dropped;
	/* Its UDP flows: their state (as fast_path's: unavailable where the kernel refused what
	 * they need); in its maps now; offers refused for want of an uplink it can use, or by
	 * the maps; datagrams and their bytes out to the uplinks and in to the TUN, datagrams
	 * dropped half-way (both ways). */
	enum netstack_fast_path fast_path_udp;
	uint64_t fast_path_udp_flows, fast_path_udp_no_uplink, fast_path_udp_map_failed;
	uint64_t fast_path_uplinks;       /* devices its reply program is attached to */
	uint64_t fast_path_udp_out, fast_path_udp_out_bytes, fast_path_udp_in,
		fast_path_udp_in_bytes, fast_path_udp_dropped;
};

struct netstack_ops {
	const char *name; /* "system" or "lwip": the config's "stack" value */
	/* Optional (NULL: always): can a stack of this kind start in this process now? Called
	 * before the proxy opens its TUN, so that a start that would be refused changes nothing.
	 * 0, or -errno with a one-line reason in err. No side effects. */
	int (*precheck)(char *err, size_t errlen);
	/* Start on env; return only when ready to carry traffic (listeners bound, ...).
	 * 0, or -errno with a one-line reason in err. */
	int (*start)(const struct netstack_env *env, struct netstack **out, char *err,
		     size_t errlen);
	/* Stop accepting new sessions (live ones go on until the dispatcher ends them). */
	void (*stop)(struct netstack *ns);
	/* Release everything. Call after the dispatcher has ended every session. */
	void (*free)(struct netstack *ns);
	/* Process one packet read from TUN queue q (see struct driver_ops.input). With
	 * tun.queues > 1 (system stack only) this runs on queue q's worker thread, concurrently
	 * with the other queues; queue 0 is always the main loop's thread. view is never NULL:
	 * with DRIVER_UDP it holds the packet as this function parsed it (it borrows buf), for
	 * the UDP path to take instead of parsing again; otherwise its content is unspecified. */
	enum driver_verdict (*input)(struct netstack *ns, unsigned q, uint8_t *buf, size_t len,
				     const struct pkt_meta *meta, int64_t now_ns, size_t *out_len,
				     bool *plain, struct pkt_view *view);
	/* Optional. After input returned DRIVER_WRITE on queue q: the queue to write the packet
	 * to (q when it does not matter). A multi-queue TUN sends each flow to the queue its
	 * packets were last written to (the kernel's automatic queue selection); a stack that
	 * writes every packet of a connection, both ways, to one queue keeps the connection on
	 * that queue, read by one thread, in order. Same thread as input. */
	unsigned (*write_queue)(struct netstack *ns, unsigned q);
	/* After each driver batch of queue q (same thread as input): re-arm timers. */
	void (*batch_end)(struct netstack *ns, unsigned q, int64_t now_ns);
	void (*stats)(struct netstack *ns, struct netstack_stats *out);
	/* Every detailed counter as (name, value). */
	void (*counters)(struct netstack *ns,
			 void (*fn)(void *arg, const char *name, uint64_t value), void *arg);
	/* Optional: every detailed level (a figure that goes up and down, read now) the same way,
	 * beside the counters under the same prefix. */
	void (*levels)(struct netstack *ns,
		       void (*fn)(void *arg, const char *name, uint64_t value), void *arg);
};

/* The parse-drop figures of netstack_stats from a per-reason counter array (both stacks parse
 * with core/pkt.c): fragments and ESP on their own, every other reason as malformed. */
void netstack_parse_drops(const ctr_t drops[PKT_REASON_MAX], struct netstack_stats *o);
/* Add the policy-drop figures from the shared policy's counters (both stacks filter with
 * stacks/common/l3policy.h): icmp, loop, special_destination and proto (as protocol) on
 * their own, own_address, nat_address and from_nat_address together as own_address, family
 * as malformed. Call after netstack_parse_drops, which sets drops_malformed. */
void netstack_policy_drops(const struct l3policy_counters *c, struct netstack_stats *o);

/* The stack named name ("system", "lwip"), or NULL if this build has none by that name. */
const struct netstack_ops *netstack_lookup(const char *name);
/* The names of the stacks of this build, NULL-terminated, static. */
const char *const *netstack_names(void);
/* The i-th stack of this build (0, 1, ...), NULL past the last. */
const struct netstack_ops *netstack_at(size_t i);

#endif
