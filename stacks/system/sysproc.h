/* sysproc.h — the system stack's per-packet processor (docs/architecture.md, "The system
 * stack's packet path").
 *
 * One function handles every packet read from the TUN and returns a disposition; all I/O
 * drivers (per-packet, batched offload, multi-queue workers) share it. Sans-IO: the caller
 * passes the buffer, its offload metadata, now_ns and the worker's counter block.
 * Thread-safe: the processor itself is read-only after sysproc_set_listeners(); the NAT table
 * is shared and locked; counters are per worker.
 */
#ifndef TS_STACKS_SYSTEM_SYSPROC_H
#define TS_STACKS_SYSTEM_SYSPROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>

#include "core/counter.h"
#include "core/flow.h"
#include "core/pkt.h"
#include "stacks/common/l3policy.h"
#include "stacks/system/nat.h"

enum sys_action {
	SYS_DONE,  /* consumed or dropped (a drop bumped exactly one reason counter) */
	SYS_WRITE, /* rewritten in place: write len bytes back to the TUN */
	SYS_UDP,   /* hand the packet, untouched, to the shared UDP path */
};

struct sys_disp {
	enum sys_action action;
	uint32_t len;  /* SYS_WRITE: bytes to write */
	bool plain;    /* SYS_WRITE: a packet we built (RST, echo reply): write it with a plain
			* offload header (no GSO, no NEEDS_CSUM), not the one it was read with */
	uint32_t conn; /* SYS_WRITE of a translated segment, with conn_numbers: its connection,
			* one value both ways (sysproc_conn_hash of the application's side); else 0 */
};

/* A connection's number from its application-side key (src = the application): the ports and
 * the addresses' last 32 bits, mixed so that every bit counts in the low ones; never 0. Pure. */
uint32_t sysproc_conn_hash(const struct flow_key *k);

/* Per-worker counters. Drops: one counter per reason; the shared policy's in .policy. */
#define SYS_COUNTERS(X)                                                                         \
	X(rx_packets)                                                                          \
	X(rx_bytes)                                                                            \
	X(uplink)              /* uplink TCP rewritten */                                      \
	X(downlink)            /* downlink TCP rewritten */                                    \
	X(udp)                 /* handed to the UDP path */                                    \
	X(icmp_echo_reply)     /* echo request to the gateway answered in place */             \
	X(icmp_unreach)        /* SYN to a special destination answered: port unreachable */   \
	X(rst_sent)            /* unmapped uplink non-SYN answered with RST */                 \
	X(drop_downlink_no_mapping)                                                            \
	X(drop_rst_no_mapping) /* unmapped uplink RST: never answered */                       \
	X(drop_nat_budget)     /* new flow refused (RST): NAT entry budget exhausted */        \
	X(drop_nat_ports)      /* new flow refused (RST): no free NAT tuple */                 \
	X(drop_nat_nomem)      /* new flow refused: the table could not grow (ENOMEM) */        \
	X(drop_nat_half_open)  /* new flow refused: HALF_OPEN limit (in all, source host/net) */ \
	X(drop_bad_offload)    /* NEEDS_CSUM metadata that does not point at the L4 checksum */

struct sys_counters {
#define SYS_CTR_FIELD(name) ctr_t name;
	SYS_COUNTERS(SYS_CTR_FIELD)
#undef SYS_CTR_FIELD
	struct l3policy_counters policy;  /* own_address, icmp, proto, family */
	ctr_t drop_parse[PKT_REASON_MAX]; /* index by enum pkt_reason; [PKT_OK] unused */
};

/* Visit every counter with its name (for stats output and for summing worker blocks). */
void sysproc_counters_foreach(const struct sys_counters *c,
			      void (*fn)(void *arg, const char *name, uint64_t value), void *arg);
/* Total of all drop counters. */
uint64_t sysproc_counters_drops(const struct sys_counters *c);

/* Address roles of one family: gateway G and NAT addresses G+1 .. G+n_addrs. */
struct sys_family {
	bool enabled;
	uint8_t gateway[16];  /* NAT addresses are computed: gateway + 1 + index */
	uint16_t listener_ports_be[NAT_MAX_LISTENERS]; /* set once the listeners are bound */
};

struct sysproc_config {
	struct sys_family v4, v6;
	uint32_t n_addrs;     /* NAT addresses per family (== nat_config.n_addrs) */
	uint32_t n_listeners; /* listeners per family (== nat_config.n_listeners) */
	bool dns_hijack;      /* UDP/53 to our own addresses goes to the UDP path */
	bool dns_tcp;         /* TCP to gateway:53 is let in (l3policy_config.dns_tcp) */
	bool conn_numbers;    /* fill sys_disp.conn (a multi-queue TUN: the queue to write to) */
	struct loopguard *loopguard; /* the proxy's own ports (l3policy's loop check), or NULL */
};

struct sysproc;

/* The NAT table is borrowed (it must outlive the processor). 0, -EINVAL or -ENOMEM. */
int sysproc_new(const struct sysproc_config *cfg, struct nat_table *nat, struct sysproc **out)
	__attribute__((warn_unused_result));
void sysproc_free(struct sysproc *p);

/* Record the kernel-chosen listener ports (network order) of a family before "ready". */
int sysproc_set_listeners(struct sysproc *p, int family, const uint16_t *ports_be, uint32_t n);

/* Process one packet in place. buf holds len bytes and has room for REWRITE_ANSWER_ROOM
 * (stacks/common/rewrite.h), or for len if that is more: an answer built in its place may be
 * longer than the packet. view (never NULL) is where the packet is
 * parsed: with SYS_UDP it is the packet's PKT_OK view (borrowing buf, valid while buf is
 * unchanged), for the UDP path to take (udp_path_input_view) instead of parsing it again;
 * otherwise its content is unspecified. */
struct sys_disp sysproc_process(struct sysproc *p, uint8_t *buf, size_t len,
				const struct pkt_meta *meta, int64_t now_ns,
				struct sys_counters *c, struct pkt_view *view);

/* Classification of a parsed TCP packet (exposed for benchmarks and tests). */
enum sys_class {
	SYS_UPLINK,
	SYS_DOWNLINK, /* *tuple filled */
	SYS_OWN,      /* to our gateway or a NAT address, not a listener reply: dropped */
};

/* The processor's address policy, shared with the lwIP stack. It is the FIRST member of struct
 * sysproc, so a struct sysproc pointer converts to it (C11 6.7.2.1p15); everything else stays
 * opaque. */
static inline const struct l3policy *sysproc_policy(const struct sysproc *p)
{
	return (const struct l3policy *)(const void *)p;
}

/* Classify a parsed TCP packet of a served family by the shared policy's TCP rules for its
 * destination (l3policy_tcp_dst): a foreign destination is uplink, gateway:listener -> NAT
 * address downlink. IPv4 inline: one load, a byte swap and a subtraction decide the
 * destination. (sysproc_process applies all of the policy, the source rule included.) */
static inline enum sys_class sysproc_classify(const struct sysproc *p, const struct pkt_view *v,
					      struct nat_tuple *tuple)
{
	struct l3policy_reply r;

	switch (l3policy_tcp_dst(sysproc_policy(p), v, &r)) {
	case L3POLICY_TCP:
		return SYS_UPLINK;
	case L3POLICY_TCP_REPLY:
		tuple->family = v->family;
		tuple->addr = r.nat_index;
		tuple->listener = r.listener;
		tuple->port = ntohs(v->dport_be);
		return SYS_DOWNLINK;
	default:
		return SYS_OWN;
	}
}

/* Our gateway or one of our NAT addresses? (addr: 4 or 16 bytes of the given family) */
bool sysproc_is_own(const struct sysproc *p, int family, const uint8_t *addr);

/* What the uplink rewrite of tuple t's mapping writes: its NAT address (t->addr), the gateway
 * and the listener port (network order), as the in-kernel fast path must write them too.
 * 0, or -EINVAL when t names no configured address or listener. */
int sysproc_tuple_rewrite(const struct sysproc *p, const struct nat_tuple *t,
			  const uint8_t **nat_addr, const uint8_t **gateway, uint16_t *lport_be);

#endif
