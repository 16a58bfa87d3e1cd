/* fastpath.bpf.c — the system stack's NAT for established connections, in the kernel.
 *
 * A tc program on the TUN's egress (clsact): a TCP segment whose address/port 4-tuple is in
 * the flows map — put there by userspace once the connection was accepted, taken out when its
 * session ends — is rewritten exactly as the userspace NAT would rewrite it (addresses, ports,
 * checksums updated incrementally) and handed to the TUN's own ingress, so it never crosses
 * into userspace and back. Everything else — SYNs, unmapped segments, fragments, IPv4 options,
 * IPv6 extension headers, other protocols — goes on untouched (TC_ACT_UNSPEC: to any filter
 * after ours, then the TUN queue), where the userspace stack sees it as before.
 *
 * A redirected packet leaves as a packet the userspace path would have written: a fresh
 * packet of the TUN's carries no mark and no receive queue, so neither does this one.
 *
 * Offload: a segment the kernel's TCP sent with its checksum left to the device
 * (CHECKSUM_PARTIAL) holds the pseudo-header sum; bpf_l4_csum_replace with BPF_F_PSEUDO_HDR
 * updates it for the addresses and leaves the ports alone (the device, or the receiving stack
 * that trusts a partial checksum, adds them later), as the userspace rewrite does. A GSO
 * super-packet stays one: the receiving TCP takes it whole, as it takes a veth's.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <stddef.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "fastpath_abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FASTPATH_MAX_FLOWS);
	__type(key, struct fastpath_key);
	__type(value, struct fastpath_key);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fastpath_counts);
} counts SEC(".maps");

#define PASS TC_ACT_UNSPEC

#define IP4_CSUM_OFF offsetof(struct iphdr, check)
#define IP4_SRC_OFF offsetof(struct iphdr, saddr)
#define IP6_SRC_OFF offsetof(struct ipv6hdr, saddr)
#define TCP_CSUM_OFF offsetof(struct tcphdr, check)

static __always_inline struct fastpath_counts *counts_here(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&counts, &zero);
}

/* The segments a packet holds: a GSO packet's count, or, where its sender left that to the
 * device (packet sockets, virtio), its payload over the segment size. hdr: the IP and TCP
 * headers' length. */
static __always_inline __u32 segments(struct __sk_buff *skb, __u32 hdr)
{
	if (skb->gso_segs > 1)
		return skb->gso_segs;
	if (skb->gso_size && skb->len > hdr)
		return (skb->len - hdr + skb->gso_size - 1) / skb->gso_size;
	return 1;
}

/* The rewrite is done: hand the packet to the TUN's ingress. hdr: as for segments(). */
static __always_inline int deliver(struct __sk_buff *skb, __u32 hdr)
{
	struct fastpath_counts *c = counts_here();

	if (c) {
		c->packets++;
		c->bytes += skb->len;
		c->segments += segments(skb, hdr);
	}
	/* Two stores the verifier checks one by one: the compiler must not merge them. */
	*(volatile __u32 *)&skb->mark = 0;
	*(volatile __u32 *)&skb->queue_mapping = 0;
	return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
}

/* A helper failed half-way through a rewrite (it cannot once the headers are pulled, but
 * a packet half rewritten must not go anywhere): dropped and counted; TCP sends it again. */
static __always_inline int failed(void)
{
	struct fastpath_counts *c = counts_here();

	if (c)
		c->failed++;
	return TC_ACT_SHOT;
}

/* The start of a packet whose IP header (l4 bytes) and TCP header are in the linear part,
 * pulled there if need be, or NULL: then the packet is not for us. proto_off: where the IP
 * header names the next protocol. */
static __always_inline void *linear_headers(struct __sk_buff *skb, __u32 l4, __u32 proto_off)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;

	if (data + l4 + sizeof(struct tcphdr) > end) {
		/* Headers outside the linear part (the kernel's own never are): pull them in, for
		 * TCP only (a pull may copy the packet's head). */
		__u8 proto;

		if (bpf_skb_load_bytes(skb, proto_off, &proto, 1) != 0 || proto != IPPROTO_TCP ||
		    bpf_skb_pull_data(skb, l4 + sizeof(struct tcphdr)) != 0)
			return NULL;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		if (data + l4 + sizeof(struct tcphdr) > end)
			return NULL;
	}
	return data;
}

static __always_inline int ipv4(struct __sk_buff *skb)
{
	struct fastpath_key k = { .family = 4 };
	const struct fastpath_key *to;
	struct iphdr *ip;
	struct tcphdr *tcp;
	__u32 l4 = sizeof(struct iphdr);
	void *data = linear_headers(skb, l4, offsetof(struct iphdr, protocol));

	if (!data)
		return PASS;
	ip = data;
	tcp = data + l4;
	/* Options, fragments and what is not TCP: the userspace path, which handles them. */
	if (ip->ihl != 5 || ip->protocol != IPPROTO_TCP || (ip->frag_off & bpf_htons(0x3fff)))
		return PASS;
	if (tcp->syn)
		return PASS;
	__builtin_memcpy(k.src, &ip->saddr, 4);
	__builtin_memcpy(k.dst, &ip->daddr, 4);
	k.sport_be = tcp->source;
	k.dport_be = tcp->dest;
	to = bpf_map_lookup_elem(&flows, &k);
	if (!to)
		return PASS;

	/* The value copied at once: userspace may replace the entry meanwhile. */
	__u32 hdr = l4 + tcp->doff * 4;
	__u32 os = ip->saddr, od = ip->daddr, ns, nd;
	__u16 osp = tcp->source, odp = tcp->dest;
	__u16 ports[2] = { to->sport_be, to->dport_be };

	__builtin_memcpy(&ns, to->src, 4);
	__builtin_memcpy(&nd, to->dst, 4);
	__u32 addrs[2] = { ns, nd };
	if (bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, os, ns, BPF_F_PSEUDO_HDR | 4) ||
	    bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, od, nd, BPF_F_PSEUDO_HDR | 4) ||
	    bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, osp, ports[0], 2) ||
	    bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, odp, ports[1], 2) ||
	    bpf_l3_csum_replace(skb, IP4_CSUM_OFF, os, ns, 4) ||
	    bpf_l3_csum_replace(skb, IP4_CSUM_OFF, od, nd, 4) ||
	    bpf_skb_store_bytes(skb, IP4_SRC_OFF, addrs, sizeof(addrs), 0) ||
	    bpf_skb_store_bytes(skb, l4, ports, sizeof(ports), 0))
		return failed();
	return deliver(skb, hdr);
}

static __always_inline int ipv6(struct __sk_buff *skb)
{
	struct fastpath_key k = { .family = 6 };
	const struct fastpath_key *to;
	struct ipv6hdr *ip;
	struct tcphdr *tcp;
	__u32 l4 = sizeof(struct ipv6hdr);
	void *data = linear_headers(skb, l4, offsetof(struct ipv6hdr, nexthdr));

	if (!data)
		return PASS;
	ip = data;
	tcp = data + l4;
	if (ip->nexthdr != IPPROTO_TCP || tcp->syn)
		return PASS;
	__builtin_memcpy(k.src, &ip->saddr, 16);
	__builtin_memcpy(k.dst, &ip->daddr, 16);
	k.sport_be = tcp->source;
	k.dport_be = tcp->dest;
	to = bpf_map_lookup_elem(&flows, &k);
	if (!to)
		return PASS;

	/* The value copied at once: userspace may replace the entry meanwhile. */
	struct fastpath_key nk = *to;
	__u32 hdr = l4 + tcp->doff * 4;
	__u16 osp = tcp->source, odp = tcp->dest;
	__u16 ports[2] = { nk.sport_be, nk.dport_be };
	__s64 d = bpf_csum_diff((__be32 *)k.src, 32, (__be32 *)nk.src, 32, 0);

	if (d < 0)
		return PASS;
	/* The address store recomputes skb->csum (BPF_F_RECOMPUTE_CSUM) should the packet carry
	 * a CHECKSUM_COMPLETE one: the pseudo-header update took the difference out of it, and
	 * IPv6 has no header checksum to put it back (forwarded and local packets reach this hook
	 * without one; the flag costs nothing then). */
	if (bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, 0, (__u32)d, BPF_F_PSEUDO_HDR) ||
	    bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, osp, ports[0], 2) ||
	    bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, odp, ports[1], 2) ||
	    bpf_skb_store_bytes(skb, IP6_SRC_OFF, nk.src, 32, BPF_F_RECOMPUTE_CSUM) ||
	    bpf_skb_store_bytes(skb, l4, ports, sizeof(ports), 0))
		return failed();
	return deliver(skb, hdr);
}

SEC("tc")
int fastpath_egress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return ipv4(skb);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return ipv6(skb);
	return PASS;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
