/* fastpath.bpf.c — the system stack's NAT for established connections and its UDP flows of
 * direct outbound sockets, in the kernel.
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
 *
 * UDP (udp_out, udp_in): the same egress program sends an app's datagram of a flow in udp_out
 * out of the uplink as the outbound socket would have sent it (from our local address and the
 * socket's port, with its mark), and a second program, fastpath_uplink, on the tcx ingress
 * of that (Ethernet) uplink hands the remote's replies of a flow in udp_in to the TUN's ingress
 * as from the remote to the app. Datagrams of no flow, or ones the socket would have treated
 * otherwise (fragments, options, too big for the uplink), go on untouched to userspace.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <stdbool.h>
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
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FASTPATH_MAX_UDP);
	__type(key, struct fastpath_key);
	__type(value, struct fastpath_udp_out);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} udp_out SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FASTPATH_MAX_UDP);
	__type(key, struct fastpath_key);
	__type(value, struct fastpath_udp_in);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} udp_in SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FASTPATH_COUNT_SLOTS);
	__type(key, __u32);
	__type(value, struct fastpath_counts);
} counts SEC(".maps");

#define PASS TC_ACT_UNSPEC

#define IP4_CSUM_OFF offsetof(struct iphdr, check)
#define IP4_SRC_OFF offsetof(struct iphdr, saddr)
#define IP6_SRC_OFF offsetof(struct ipv6hdr, saddr)
#define TCP_CSUM_OFF offsetof(struct tcphdr, check)
#define UDP_CSUM_OFF offsetof(struct udphdr, check)

/* Where a packet's IP header starts: skb->data on the TUN (no link-layer header), after the
 * Ethernet header on the uplink's ingress (tc sees the frame from its MAC header there). Every
 * offset given to the helpers below counts from skb->data. */
#define AT_TUN 0
#define AT_ETH ETH_HLEN

static __always_inline struct fastpath_counts *counts_at(__u32 slot)
{
	return bpf_map_lookup_elem(&counts, &slot);
}

/* The segments a packet holds: a GSO packet's count, or, where its sender left that to the
 * device (packet sockets, virtio), its payload over the segment size. hdr: the IP and L4
 * headers' length (after the link-layer header, if any: skb->len counts that too, and so must
 * hdr then). */
static __always_inline __u32 segments(struct __sk_buff *skb, __u32 hdr)
{
	if (skb->gso_segs > 1)
		return skb->gso_segs;
	if (skb->gso_size && skb->len > hdr)
		return (skb->len - hdr + skb->gso_size - 1) / skb->gso_size;
	return 1;
}

/* A packet of counter slot `slot` is rewritten and about to be redirected; its IP packet starts
 * at l2 (the bytes counted are the IP packet's, as on the TUN). */
static __always_inline void count(struct __sk_buff *skb, __u32 slot, __u32 l2, __u32 hdr)
{
	struct fastpath_counts *c = counts_at(slot);

	if (c) {
		c->packets++;
		c->bytes += skb->len - l2;
		c->segments += segments(skb, hdr);
	}
}

/* The rewrite is done: hand the packet to the TUN's ingress. hdr: as for segments(). */
static __always_inline int deliver(struct __sk_buff *skb, __u32 hdr)
{
	count(skb, FASTPATH_COUNT_TCP, AT_TUN, hdr);
	/* Two stores the verifier checks one by one: the compiler must not merge them. */
	*(volatile __u32 *)&skb->mark = 0;
	*(volatile __u32 *)&skb->queue_mapping = 0;
	return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
}

/* A helper failed half-way through a rewrite (it cannot once the headers are pulled, but
 * a packet half rewritten must not go anywhere): dropped and counted in slot `slot`; TCP
 * sends it again, and a UDP datagram is as lost as on any network. */
static __always_inline int failed(__u32 slot)
{
	struct fastpath_counts *c = counts_at(slot);

	if (c)
		c->failed++;
	return TC_ACT_SHOT;
}

/* The protocol the IP header names at proto_off, or 0 when the packet is too short. */
static __always_inline __u8 ip_proto(struct __sk_buff *skb, __u32 proto_off)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	__u8 proto;

	if (data + proto_off + 1 <= end)
		return *(__u8 *)(data + proto_off);
	if (bpf_skb_load_bytes(skb, proto_off, &proto, 1) != 0)
		return 0;
	return proto;
}

/* Which protocols a program handles: the parsers below give up on any other one before
 * they read, or pull, anything past the IP header. */
#define WANT_TCP 1u
#define WANT_UDP 2u

/* The start of a packet whose IP header (up to l4) and the header of protocol proto after it
 * are in the linear part, pulled there if need be, or NULL: then the packet is not for us
 * (proto is not one of want's). */
static __always_inline void *linear_headers(struct __sk_buff *skb, __u32 l4, __u8 proto,
					    __u32 want)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	__u32 need;

	if (proto == IPPROTO_TCP && (want & WANT_TCP))
		need = l4 + sizeof(struct tcphdr);
	else if (proto == IPPROTO_UDP && (want & WANT_UDP))
		need = l4 + sizeof(struct udphdr);
	else
		return NULL;
	if (data + need > end) {
		/* Headers outside the linear part (the kernel's own never are): pull them in, for
		 * the protocols the program handles only (a pull may copy the packet's head). */
		if (bpf_skb_pull_data(skb, need) != 0)
			return NULL;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		if (data + need > end)
			return NULL;
	}
	return data;
}

/* An IPv4 packet at off without options and not a fragment, with the header of the TCP or UDP
 * it names (one of want's) linear after it: its start (its protocol in *proto, its addresses
 * and ports in k), or NULL: not for us. Options and fragments take the userspace path, which
 * handles them. */
static __always_inline void *parse4(struct __sk_buff *skb, __u32 off, __u32 want, __u8 *proto,
				    struct fastpath_key *k)
{
	__u8 p = ip_proto(skb, off + offsetof(struct iphdr, protocol));
	void *data = linear_headers(skb, off + sizeof(struct iphdr), p, want);
	struct iphdr *ip;
	__be16 *ports;

	if (!data)
		return NULL;
	ip = data + off;
	ports = data + off + sizeof(struct iphdr);
	if (ip->version != 4 || ip->ihl != 5 || ip->protocol != p ||
	    (ip->frag_off & bpf_htons(0x3fff)))
		return NULL;
	k->family = 4;
	__builtin_memcpy(k->src, &ip->saddr, 4);
	__builtin_memcpy(k->dst, &ip->daddr, 4);
	k->sport_be = ports[0];
	k->dport_be = ports[1];
	*proto = p;
	return data;
}

/* The same for IPv6: TCP or UDP directly after the fixed header (extension headers take the
 * userspace path). */
static __always_inline void *parse6(struct __sk_buff *skb, __u32 off, __u32 want, __u8 *proto,
				    struct fastpath_key *k)
{
	__u8 p = ip_proto(skb, off + offsetof(struct ipv6hdr, nexthdr));
	void *data = linear_headers(skb, off + sizeof(struct ipv6hdr), p, want);
	struct ipv6hdr *ip;
	__be16 *ports;

	if (!data)
		return NULL;
	ip = data + off;
	ports = data + off + sizeof(struct ipv6hdr);
	if (ip->version != 6 || ip->nexthdr != p)
		return NULL;
	k->family = 6;
	__builtin_memcpy(k->src, &ip->saddr, 16);
	__builtin_memcpy(k->dst, &ip->daddr, 16);
	k->sport_be = ports[0];
	k->dport_be = ports[1];
	*proto = p;
	return data;
}

/* ---- TCP: connections of the NAT, on the TUN's egress ---- */

static __always_inline int tcp4(struct __sk_buff *skb, void *data, const struct fastpath_key *k)
{
	const struct fastpath_key *to;
	struct iphdr *ip = data;
	__u32 l4 = sizeof(struct iphdr);
	struct tcphdr *tcp = data + l4;

	if (tcp->syn)
		return PASS;
	to = bpf_map_lookup_elem(&flows, k);
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
		return failed(FASTPATH_COUNT_TCP);
	return deliver(skb, hdr);
}

static __always_inline int tcp6(struct __sk_buff *skb, void *data, const struct fastpath_key *k)
{
	const struct fastpath_key *to;
	__u32 l4 = sizeof(struct ipv6hdr);
	struct tcphdr *tcp = data + l4;

	if (tcp->syn)
		return PASS;
	to = bpf_map_lookup_elem(&flows, k);
	if (!to)
		return PASS;

	/* The value copied at once: userspace may replace the entry meanwhile. */
	struct fastpath_key nk = *to;
	__u32 hdr = l4 + tcp->doff * 4;
	__u16 osp = tcp->source, odp = tcp->dest;
	__u16 ports[2] = { nk.sport_be, nk.dport_be };
	__s64 d = bpf_csum_diff((__be32 *)k->src, 32, (__be32 *)nk.src, 32, 0);

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
		return failed(FASTPATH_COUNT_TCP);
	return deliver(skb, hdr);
}

/* ---- UDP: flows of direct outbound sockets ---- */

/* Rewrite one end of a UDP datagram whose IP header starts at off: its source (dst false) or
 * its destination (dst true) address and port become those of `to` (the same end of it).
 *
 * The UDP checksum: BPF_F_MARK_MANGLED_0 leaves an IPv4 checksum of 0 ("none") as it is, and
 * writes a sum that comes out 0 as 0xFFFF, as UDP must; a checksum left to the device
 * (CHECKSUM_PARTIAL) holds the pseudo-header sum, which BPF_F_PSEUDO_HDR updates for the
 * address while the port is left to the device, as for TCP. A CHECKSUM_COMPLETE skb->csum
 * (replies on the uplink, from devices that sum what they receive) covers the IP and UDP
 * headers: the helpers keep it right where the bytes they change sum to nothing (an IPv4
 * address against its header checksum, a port against the UDP checksum); where they do not,
 * the store recomputes it: the IPv6 address (no header checksum, as for TCP), and the port of
 * a datagram without a checksum. A UDP GSO super-packet (segmented later, on the way out or
 * into a socket) keeps its headers in each segment: rewriting them once rewrites them all. */
static __always_inline int udp_rewrite(struct __sk_buff *skb, void *data, __u32 off, __u8 family,
				       bool dst, const struct fastpath_key *from,
				       const struct fastpath_key *to)
{
	__u32 l4 = off + (family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr));
	__u32 csum = l4 + UDP_CSUM_OFF, port_off = l4 + (dst ? 2 : 0);
	__u16 op = dst ? from->dport_be : from->sport_be, np = dst ? to->dport_be : to->sport_be;
	struct udphdr *udp = data + l4;
	__u64 port_flags = family == 4 && udp->check == 0 ? BPF_F_RECOMPUTE_CSUM : 0;

	if (family == 4) {
		__u32 oa, na, addr_off = off + IP4_SRC_OFF + (dst ? 4 : 0);

		__builtin_memcpy(&oa, dst ? from->dst : from->src, 4);
		__builtin_memcpy(&na, dst ? to->dst : to->src, 4);
		if (bpf_l4_csum_replace(skb, csum, oa, na,
					BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4) ||
		    bpf_l3_csum_replace(skb, off + IP4_CSUM_OFF, oa, na, 4) ||
		    bpf_skb_store_bytes(skb, addr_off, &na, 4, 0))
			return -1;
	} else {
		const __u8 *oa = dst ? from->dst : from->src, *na = dst ? to->dst : to->src;
		__u32 addr_off = off + IP6_SRC_OFF + (dst ? 16 : 0);
		__s64 d = bpf_csum_diff((__be32 *)oa, 16, (__be32 *)na, 16, 0);

		if (d < 0)
			return -1;
		if (bpf_l4_csum_replace(skb, csum, 0, (__u32)d,
					BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0) ||
		    bpf_skb_store_bytes(skb, addr_off, na, 16, BPF_F_RECOMPUTE_CSUM))
			return -1;
	}
	if (bpf_l4_csum_replace(skb, csum, op, np, BPF_F_MARK_MANGLED_0 | 2) ||
	    bpf_skb_store_bytes(skb, port_off, &np, 2, port_flags))
		return -1;
	return 0;
}

/* Is a socket with the flow's mark bound to its local port, for the remote's replies? */
static __always_inline bool sock_there(struct __sk_buff *skb, __u8 family,
				       const struct fastpath_udp_out *o)
{
	struct bpf_sock_tuple t = { 0 };
	struct bpf_sock *sk;
	__u32 len;
	bool ok;

	if (family == 4) {
		__builtin_memcpy(&t.ipv4.saddr, o->to.dst, 4);
		__builtin_memcpy(&t.ipv4.daddr, o->to.src, 4);
		t.ipv4.sport = o->to.dport_be;
		t.ipv4.dport = o->to.sport_be;
		len = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, o->to.dst, 16);
		__builtin_memcpy(t.ipv6.daddr, o->to.src, 16);
		t.ipv6.sport = o->to.dport_be;
		t.ipv6.dport = o->to.sport_be;
		len = sizeof(t.ipv6);
	}
	sk = bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return false;
	ok = sk->mark == o->mark;
	bpf_sk_release(sk);
	return ok;
}

/* An app's datagram on the TUN's egress (k: as it came; data: its start, headers linear). */
static __always_inline int udp_egress(struct __sk_buff *skb, void *data, __u8 family,
				      const struct fastpath_key *k)
{
	struct fastpath_udp_out *v = bpf_map_lookup_elem(&udp_out, k);
	__u32 hdr = (family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)) +
		    sizeof(struct udphdr);
	__u32 mtu;

	if (!v)
		return PASS;
	/* The value copied at once: userspace may replace the entry meanwhile. */
	struct fastpath_udp_out o = *v;

	/* A QUIC handshake datagram (the long header's first bit) goes on to userspace, which
	 * looks at it (route.sniff) before any datagram of a new connection leaves. */
	if (o.flags & FASTPATH_UDP_PASS_QUIC_LONG) {
		__u8 first;

		if (bpf_skb_load_bytes(skb, hdr, &first, 1) != 0 || (first & 0x80))
			return PASS;
	}
	/* The outbound socket must still be there to take the replies: a filter a killed
	 * process left on a persistent TUN stops sending from a port nobody holds, or that
	 * another program's socket took. */
	if ((o.flags & FASTPATH_UDP_CHECK_SOCK) && !sock_there(skb, family, &o))
		return PASS;

	/* Too big for the uplink: the userspace path sends it through the socket, which
	 * fragments it (or refuses it) as it would any datagram of the app's. On the TUN
	 * skb->len is the IP packet: given as the length to check, it is held against the
	 * uplink's MTU (skb->len itself would be held against the MTU plus the uplink's
	 * link-layer header). A GSO packet passes the helper's check whatever its length (its
	 * segments are what goes out): they, headers and gso_size, are checked against the MTU
	 * it reports. */
	mtu = skb->len;
	if (bpf_check_mtu(skb, o.ifindex, &mtu, 0, 0) != BPF_MTU_CHK_RET_SUCCESS)
		return PASS;
	if (skb->gso_size && hdr + skb->gso_size > mtu)
		return PASS;
	if (udp_rewrite(skb, data, AT_TUN, family, false, k, &o.to) != 0)
		return failed(FASTPATH_COUNT_UDP_OUT);
	v->seen_ns = bpf_ktime_get_ns();
	/* Leaves as the socket's datagram would: with its mark (the uplink's route may be
	 * chosen by it: the route lookup of the neighbour output uses it), on the uplink's own
	 * queue choice. */
	*(volatile __u32 *)&skb->mark = o.mark;
	*(volatile __u32 *)&skb->queue_mapping = 0;
	/* The uplink's neighbour output to the flow's next hop, which fills in the link-layer
	 * header: the helper wants room for one in front of the IP header (the TUN's packet has
	 * none), with the packet's protocol in it and no multicast destination (zeros). With
	 * the next hop given it looks up no route: the skb keeps the route it had, which the
	 * uplink's transmit drops (a looked-up route would replace it, and kernels before the
	 * fix of that helper's route handling leak the one replaced). */
	__be16 eth_proto = family == 4 ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
	struct bpf_redir_neigh nh = { 0 };

	if (family == 4) {
		nh.nh_family = 2; /* AF_INET */
		__builtin_memcpy(&nh.ipv4_nh, o.nexthop, 4);
	} else {
		nh.nh_family = 10; /* AF_INET6 */
		__builtin_memcpy(nh.ipv6_nh, o.nexthop, 16);
	}
	if (bpf_skb_change_head(skb, ETH_HLEN, 0) != 0 ||
	    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &eth_proto, 2, 0) != 0)
		return failed(FASTPATH_COUNT_UDP_OUT);
	count(skb, FASTPATH_COUNT_UDP_OUT, AT_ETH, AT_ETH + hdr);
	return bpf_redirect_neigh(o.ifindex, &nh, sizeof(nh), 0);
}

/* The TUN's egress: TCP segments of the NAT's connections, and (udp) datagrams of UDP flows. */
static __always_inline int egress(struct __sk_buff *skb, bool udp)
{
	struct fastpath_key k = { 0 };
	__u32 want = WANT_TCP | (udp ? WANT_UDP : 0);
	__u8 proto = 0;
	void *data;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		data = parse4(skb, AT_TUN, want, &proto, &k);
		if (!data)
			return PASS;
		if (proto == IPPROTO_TCP)
			return tcp4(skb, data, &k);
		return udp ? udp_egress(skb, data, 4, &k) : PASS;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		data = parse6(skb, AT_TUN, want, &proto, &k);
		if (!data)
			return PASS;
		if (proto == IPPROTO_TCP)
			return tcp6(skb, data, &k);
		return udp ? udp_egress(skb, data, 6, &k) : PASS;
	}
	return PASS;
}

/* With UDP flows. Its helpers need Linux 5.12 (bpf_check_mtu); the loader falls back to the
 * TCP-only program on a kernel that refuses it. */
SEC("tc")
int fastpath_egress(struct __sk_buff *skb)
{
	return egress(skb, true);
}

/* TCP only: the NAT's connections on kernels without what the UDP path needs. */
SEC("tc")
int fastpath_egress_tcp(struct __sk_buff *skb)
{
	return egress(skb, false);
}

/* A reply on the ingress of an Ethernet uplink (a tcx link: it goes with the process): one of
 * a flow in udp_in goes to the TUN's ingress as from the remote to the app; everything else on
 * to the uplink's own stack, untouched. */
SEC("tc")
int fastpath_uplink(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct fastpath_key k = { 0 };
	struct fastpath_udp_in *v;
	__u8 proto = 0, family;
	__u32 hdr;

	/* A VLAN tag taken out of the frame (vlan_present), or one still in it (the ethertype
	 * is then not the packet's protocol): the flow's address is not on that VLAN's
	 * device. */
	if (skb->vlan_present || data + ETH_HLEN > end)
		return PASS;
	if (((struct ethhdr *)data)->h_proto != skb->protocol)
		return PASS;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		family = 4;
		data = parse4(skb, AT_ETH, WANT_UDP, &proto, &k);
		hdr = sizeof(struct iphdr);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		family = 6;
		data = parse6(skb, AT_ETH, WANT_UDP, &proto, &k);
		hdr = sizeof(struct ipv6hdr);
	} else {
		return PASS;
	}
	if (!data)
		return PASS;
	v = bpf_map_lookup_elem(&udp_in, &k);
	if (!v)
		return PASS;
	/* The value copied at once: userspace may replace the entry meanwhile. */
	struct fastpath_udp_in in = *v;
	if (udp_rewrite(skb, data, AT_ETH, family, true, &k, &in.to) != 0)
		return failed(FASTPATH_COUNT_UDP_IN);
	v->seen_ns = bpf_ktime_get_ns();
	count(skb, FASTPATH_COUNT_UDP_IN, AT_ETH, AT_ETH + hdr + sizeof(struct udphdr));
	/* In as a packet the userspace path writes to the TUN: no mark, and no receive queue of
	 * the uplink's (the TUN may have fewer: the receive steering would take it for a bad
	 * one). */
	*(volatile __u32 *)&skb->mark = 0;
	*(volatile __u32 *)&skb->queue_mapping = 0;
	/* The TUN has no link-layer header: the redirect to an L3 device takes the Ethernet
	 * header off first. */
	return bpf_redirect(in.ifindex, BPF_F_INGRESS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
