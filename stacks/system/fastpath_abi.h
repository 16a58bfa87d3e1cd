/* fastpath_abi.h — what the system stack's in-kernel fast path (fastpath.bpf.c) and its
 * loader (fastpath.c) share: the flows map's key and value, and the counters. Both sides
 * compile it, so it uses the kernel's fixed-width types only. */
#ifndef TS_STACKS_SYSTEM_FASTPATH_ABI_H
#define TS_STACKS_SYSTEM_FASTPATH_ABI_H

#include <linux/types.h>

/* The flows map's size as compiled; the loader sets it to two entries (one per direction) per
 * connection it is asked to hold. */
#define FASTPATH_MAX_FLOWS 131072

/* A TCP segment's addresses and ports as the TUN sees it (key), or as it must leave the
 * rewrite (value). IPv4 addresses take the first 4 bytes of src/dst, the rest zero. src and dst
 * are adjacent: the IPv6 checksum update takes both in one difference. */
struct fastpath_key {
	__u8 family; /* 4 or 6 */
	__u8 pad;
	__be16 sport_be;
	__be16 dport_be;
	__u16 zero;
	__u8 src[16];
	__u8 dst[16];
};

/* Per CPU: segments the fast path rewrote (packets: as the TUN saw them, a GSO super-packet
 * once; segments: what they hold on the wire) and their bytes; failed: packets dropped
 * because a rewrite helper failed half-way. */
struct fastpath_counts {
	__u64 packets;
	__u64 segments;
	__u64 bytes;
	__u64 failed;
};

/* UDP flows of direct outbound sockets (udp_out, udp_in): room for this many each as compiled;
 * the loader sets the size it is asked for. */
#define FASTPATH_MAX_UDP 65536

/* The value of udp_out, keyed by a datagram as the TUN's egress sees it (the app's address
 * and port to the remote's): the datagram leaves on the uplink ifindex as from our local
 * address and the outbound socket's port (to.src, to.sport_be; to.dst and to.dport_be are the
 * remote's, unchanged), with the socket's mark, through the kernel's neighbour output to the
 * next hop the route had when the flow joined (no route lookup per datagram). It is
 * taken only while a socket with that mark is bound to that port to receive the replies
 * (FASTPATH_UDP_CHECK_SOCK): a filter a killed process left on a persistent TUN goes on
 * matching only as long as its sockets would. seen_ns: the
 * program's bpf_ktime_get_ns (CLOCK_MONOTONIC) at the flow's last datagram out; userspace
 * sets it to the time of the add and reads it for the session's idle time. */
struct fastpath_udp_out {
	struct fastpath_key to;
	__u8 nexthop[16];   /* the uplink's next hop: the route's gateway, or the remote itself */
	__u32 ifindex;
	__u32 mark;
	__u32 flags;
	__u32 pad;
	__u64 seen_ns;
};
/* flags: QUIC handshake datagrams (a long header) go on to userspace; the socket check is made
 * (not for a socket bound to a device: the lookup on the TUN's egress cannot find it). */
#define FASTPATH_UDP_PASS_QUIC_LONG 1u
#define FASTPATH_UDP_CHECK_SOCK 2u

/* The value of udp_in, keyed by a datagram as it arrives on the uplink (the remote's address
 * and port to our local address and the socket's port): it is handed to the ingress of the
 * TUN (ifindex) as from the remote to the app (to.dst, to.dport_be). */
struct fastpath_udp_in {
	struct fastpath_key to;
	__u32 ifindex;
	__u32 pad;
	__u64 seen_ns;      /* as udp_out's, for the flow's last reply */
};

/* The counts map's slots: TCP segments rewritten on the TUN (0), UDP datagrams out to the
 * uplink (1) and replies in to the TUN (2). */
#define FASTPATH_COUNT_TCP 0
#define FASTPATH_COUNT_UDP_OUT 1
#define FASTPATH_COUNT_UDP_IN 2
#define FASTPATH_COUNT_SLOTS 3

#endif
