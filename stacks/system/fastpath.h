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

#include <stdbool.h>
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

/* The most UDP flows fastpath_open takes room for. */
#define FASTPATH_MAX_UDP_FLOWS (1u << 20)

/* Load the program with room for max_conns connections (two map entries each) and max_udp UDP
 * flows (0: no UDP; one entry in each UDP map). 0, or -errno
 * with a message in err (-EPERM without CAP_BPF or CAP_SYS_ADMIN; -EINVAL, -EOPNOTSUPP and
 * the like when the kernel lacks what the program needs). */
int fastpath_open(uint32_t max_conns, uint32_t max_udp, struct fastpath **out, char *err,
		  size_t errlen)
	__attribute__((warn_unused_result));
/* Room for UDP flows was asked, but the kernel refused what they need (the program with them
 * needs Linux 5.12): fastpath_open loaded the TCP-only program instead, and this says why.
 * NULL otherwise. */
const char *fastpath_udp_off(const struct fastpath *fp);
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

/* Everything the kernel side rewrote, summed over CPUs. Needs no memory; a read the kernel
 * refuses gives the last figures read. One caller at a time (the read buffer is fp's). */
void fastpath_totals(struct fastpath *fp, struct fastpath_totals *out);

/* ---- UDP flows of direct outbound sockets ----
 * A flow is one (app address and port, remote address and port) pair. Its datagrams from the
 * app leave on the uplink from the outbound socket's address and port (the TUN's egress
 * program: rewritten, then the kernel's neighbour output of the uplink), and the remote's
 * datagrams to that address and port reach the app from the remote (a program on the
 * uplink's ingress: rewritten, then the TUN's ingress). Userspace keeps everything else:
 * first datagrams, other remotes' replies, names, DNS, associations. */
struct fastpath_udp {
	struct flow_key app;    /* as the TUN sees it: family, src/sport = the app, dst/dport =
				 * the remote (proto ignored) */
	uint8_t local[16];      /* our address on the uplink (app.family's size) */
	uint16_t lport_be;      /* the outbound socket's port */
	uint8_t nexthop[16];    /* the uplink's next hop: the route's gateway, or the remote */
	int uplink;             /* the uplink's ifindex (an Ethernet device) */
	int tun;                /* the TUN's ifindex */
	uint32_t mark;          /* the outbound socket's SO_MARK (0: none) */
	bool quic_handshakes;   /* QUIC handshake datagrams (long header) stay in userspace */
	bool sock_bound_dev;    /* the socket is bound to a device (SO_BINDTODEVICE) */
};

/* Attach the reply program to the ingress of device ifindex, if it is not there yet: a tcx
 * link (Linux 6.6 or later), which goes with the process however it ends, runs after the
 * programs already there and leaves the device's qdiscs and filters alone. Up to
 * FASTPATH_MAX_UPLINKS devices. 0, or -errno with err (-EOPNOTSUPP: not an Ethernet device,
 * or a kernel without tcx; -ENOSPC: too many uplinks). Not thread-safe: the thread that calls
 * fastpath_udp_add. */
#define FASTPATH_MAX_UPLINKS 8
int fastpath_udp_uplink(struct fastpath *fp, int ifindex, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* Put a flow's two directions in the maps (its uplink attached first: fastpath_udp_uplink).
 * 0 or -errno (-E2BIG: the maps are full; -EINVAL: no room for UDP was asked). */
int fastpath_udp_add(struct fastpath *fp, const struct fastpath_udp *f)
	__attribute__((warn_unused_result));
/* Take both directions out again (what fastpath_udp_add put in). */
void fastpath_udp_del(struct fastpath *fp, const struct fastpath_udp *f);
/* When the flow's last datagram went out or its last reply came in through the kernel
 * (CLOCK_MONOTONIC ns; the time of the add if none did), or -errno (-ENOENT: not in the map). */
int64_t fastpath_udp_seen(struct fastpath *fp, const struct fastpath_udp *f);
/* UDP flows in the maps now. */
uint64_t fastpath_udp_flows(const struct fastpath *fp);
/* Uplinks the reply program is attached to (one fd each). */
int fastpath_udp_uplinks(const struct fastpath *fp);
/* What the kernel side carried, summed over CPUs: datagrams out to uplinks (out) and replies
 * in to the TUN (in). segments: datagrams (a GSO packet's count); failed: dropped half-way.
 * As fastpath_totals: no memory needed, the last figures when a read is refused. */
void fastpath_udp_totals(struct fastpath *fp, struct fastpath_totals *out,
			 struct fastpath_totals *in);

#endif
