/* fastpath.h — the system stack's NAT for accepted connections, in the kernel: a tc program on
 * the TUN's egress (fastpath.bpf.c) rewrites the segments of the flows userspace put in its map
 * and hands them straight to the TUN's ingress, so an established connection's data never
 * crosses into userspace and back (docs/architecture.md, "The in-kernel fast path").
 *
 * Userspace keeps everything else: SYNs, the NAT table and its states, and every segment of a
 * flow not (or no longer) in the map. The system stack puts a connection in some milliseconds
 * after its accept and takes it out when its session ends, before its mapping starts to
 * linger, so a closing connection's last segments are translated by the userspace path that
 * times the linger.
 */
#ifndef TS_STACKS_SYSTEM_FASTPATH_H
#define TS_STACKS_SYSTEM_FASTPATH_H

#include <stddef.h>
#include <stdint.h>

#include "core/flow.h"

struct fastpath;

/* The most connections fastpath_open takes room for (the map is kernel memory: its hash
 * buckets allocated at once, its entries as connections come). */
#define FASTPATH_MAX_CONNS (1u << 20)

struct fastpath_totals {
	uint64_t packets;  /* rewritten by the kernel (a GSO super-packet counts once) */
	uint64_t segments; /* the segments those packets hold */
	uint64_t bytes;
	uint64_t failed;   /* dropped: a rewrite helper failed half-way */
};

/* Load the program with room for max_conns connections (two map entries each). 0, or -errno
 * with a message in err (-EPERM without CAP_BPF or CAP_SYS_ADMIN; -EINVAL, -EOPNOTSUPP and
 * the like when the kernel lacks what the program needs). */
int fastpath_open(uint32_t max_conns, struct fastpath **out, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* Attach the loaded program to the egress of network device ifindex (the TUN). A clsact qdisc
 * is added if the device has none (and removed again by fastpath_free); a filter of ours left
 * by an earlier process on a persistent device is replaced. 0 or -errno with err. */
int fastpath_attach(struct fastpath *fp, int ifindex, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* Remove a filter of ours from device ifindex's egress, if one is there: one an earlier process
 * left on a persistent or a caller's device, which would otherwise go on rewriting the flows
 * of its map. Errors (none there, no clsact, no device) are ignored. */
void fastpath_clear(int ifindex);
/* Detach (if attached) and unload; NULL is fine. */
void fastpath_free(struct fastpath *fp);

/* The loaded program's fd (tests run it on packets of their own: BPF_PROG_TEST_RUN). */
int fastpath_prog_fd(const struct fastpath *fp);
/* Connections in the map now (fastpath_add minus fastpath_del). */
uint64_t fastpath_conns(const struct fastpath *fp);
/* Put a connection's two directions in the map: segments from app to server (as the TUN sees
 * them) leave as from nat_src:nat_sport to gw:lport, and segments from gw:lport to nat_src:P
 * leave as from the server to the app. addrs: 4 or 16 bytes by key->family. 0 or -errno
 * (-E2BIG: the map is full; -ENOMEM): the connection then stays on the userspace path.
 * Thread-safe (the map is the kernel's), as is everything below but fastpath_free. */
int fastpath_add(struct fastpath *fp, const struct flow_key *app, const uint8_t *nat_addr,
		 uint16_t nat_port_be, const uint8_t *gw, uint16_t lport_be)
	__attribute__((warn_unused_result));
/* Take both directions out again (what fastpath_add put in; the same arguments). */
void fastpath_del(struct fastpath *fp, const struct flow_key *app, const uint8_t *nat_addr,
		  uint16_t nat_port_be, const uint8_t *gw, uint16_t lport_be);

/* Everything the kernel side rewrote, summed over CPUs. */
void fastpath_totals(struct fastpath *fp, struct fastpath_totals *out);

#endif
