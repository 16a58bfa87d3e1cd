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

#endif
