/* udpfast.h — the system stack's offer to the UDP path (dispatch/udp.h, struct udp_offload):
 * a flow that goes on through a direct outbound's socket is put in the in-kernel fast path
 * (fastpath.h), which then sends its datagrams from that socket's address and port straight
 * out of the uplink and hands the remote's replies straight to the TUN. */
#ifndef TS_STACKS_SYSTEM_UDPFAST_H
#define TS_STACKS_SYSTEM_UDPFAST_H

#include <stdint.h>

#include "core/counter.h"
#include "core/netlink.h"
#include "dispatch/udp.h"

struct fastpath;
struct log;

struct udpfast {
	struct fastpath **fp;    /* the stack's fast path: NULL while (or once) it has none */
	int tun;                 /* the TUN's ifindex: never an uplink */
	struct log *log;
	struct netlink nl;       /* route lookups */
	bool nl_open;
	bool warned;             /* an uplink refused: said once */
	/* Flows offered: taken; refused because no uplink could carry them (no route, a route
	 * into the TUN or to a local address, no source address, a device that is not
	 * Ethernet, an uplink the program could not be attached to); refused by the maps (full,
	 * or another error). */
	ctr_t added, no_uplink, map_failed;
};

/* The UDP path's ops for uf (arg: uf). */
extern const struct udp_offload udpfast_ops;

/* 0, or -errno: no netlink socket (then the stack offers nothing). */
int udpfast_init(struct udpfast *uf, struct fastpath **fp, int tun, struct log *log)
	__attribute__((warn_unused_result));
/* The netlink socket closed. Take the offload away from the UDP path first. */
void udpfast_fini(struct udpfast *uf);

#endif
