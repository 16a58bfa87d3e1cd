/* l3policy.h — what both TCP/IP stacks let in: the rules every parsed packet read from the TUN
 * meets before a stack's own work, so the system stack and lwIP decide them the same way by
 * construction (a comparison of the two stacks compares their TCP, never their filters).
 *
 *   family  a packet of a family the TUN has no address for is dropped            drop family
 *   TCP     to a foreign destination: the stack's TCP path                        TCP
 *           a first SYN to a special destination (below): the stack answers
 *           it with an ICMP port unreachable from a NAT address so the app
 *           fails at once (l3policy_answer says which get one and why)
 *                                                                      drop special_destination
 *           a first SYN from a special address (below): no host sends from one;
 *           lwIP would drop it uncounted, the kernel as a martian    drop special_source
 *           from one of our NAT addresses: nothing legitimate comes from there
 *           (the kernel never sends from them; only the system stack's
 *           rewritten segments carry them, toward the kernel)       drop from_nat_address
 *           a first SYN from our gateway and a port of one of the proxy's own
 *           outbound sockets: its own traffic routed back into the TUN; the
 *           stack answers it with a RST so the socket fails at once              drop loop
 *           to our gateway: dropped                                          drop own_address
 *           except, with DNS over TCP on (the proxy's resolver answers TCP/53), to
 *           the gateway's port 53: a resolver on the gateway is the common setup    TCP
 *           to a NAT address: dropped                                       drop nat_address
 *           except the reply of one of the stack's own listeners, gateway:listener
 *           port -> NAT address (the system stack's downlink; lwIP has no listener
 *           ports, so none)                                                   TCP_REPLY
 *   UDP     from one of our NAT addresses: dropped (as TCP)               drop from_nat_address
 *           to port 53 with DNS hijack on, whatever the destination: hijacked
 *           (it wins over the own-address drops: a resolver on the gateway is
 *           the common setup)                                                      DNS
 *           to our gateway otherwise: dropped                                drop own_address
 *           to a NAT address otherwise: dropped                              drop nat_address
 *           to a special destination (below): dropped                  drop special_destination
 *           anything else: the shared UDP path (which also drops the proxy's own
 *           datagrams come back, once per would-be session: dispatch/udp.h)         UDP
 *   ICMP    an echo request (ICMP 8 / ICMPv6 128, code 0) to the gateway:
 *           answered in place by the stack                                         ECHO
 *           any other ICMP of the packet's family                                  drop icmp
 *   other   any other protocol, ICMPv6 in IPv4 and ICMP in IPv6 included          drop proto
 *
 * Special destinations are addresses that never name a remote host, or name one of the other
 * family: an outbound socket would reach the proxy host itself (its loopback services), send
 * multicast or broadcast onto the proxy host's networks, or — an IPv4-mapped address on a
 * dual-stack socket — reach IPv4 past the rules written for IPv4:
 *   IPv4  0.0.0.0/8 (unspecified), 127.0.0.0/8 (loopback), 224.0.0.0/4 (multicast),
 *         255.255.255.255 (limited broadcast)
 *   IPv6  ::/96 (IPv4-compatible, deprecated by RFC 4291 2.5.5.1; holds :: and ::1),
 *         ::ffff:0:0/96 (IPv4-mapped), ff00::/8 (multicast)
 * Not special: private ranges, 198.18.0.0/15 (testbeds and fake-IP use them), 240.0.0.0/4 but
 * its last address, and link-local (169.254.0.0/16, fe80::/10): a link-local address names a
 * real neighbour, not the proxy host (cloud metadata at 169.254.169.254 included: block it with
 * a rule where clients must not reach it), and an IPv6 one cannot even be connected to without
 * the interface the TUN client cannot name. Only a connection's first SYN is checked (its later
 * segments never find a connection: the stack answers them as it answers any unknown one).
 * Cost: one table load by the destination's first byte on the UDP path and a first SYN's;
 * the exact test runs only for the few first bytes that may be special.
 *
 * Address roles: per family the gateway G (the TUN's address) and the NAT addresses G+1 .. G+n
 * are consecutive in the low 32 bits (core/netaddr.h proves it at config time), so "ours, and
 * which" is one subtraction.
 *
 * Sans-IO: pure functions of the packet view and the policy; no clock, no I/O, no allocation —
 * except the loop check, which reads the loop guard's table (a relaxed atomic load) and, only
 * when the source port is on record, asks the kernel once whether that socket still lives.
 * A policy is read-only after l3policy_init / l3policy_set_listeners, so any number of threads
 * may classify with it at once; each passes its own counter block. The common cases are
 * inline (TCP and UDP: a few loads and compares on the per-packet path of both stacks).
 */
#ifndef TS_STACKS_COMMON_L3POLICY_H
#define TS_STACKS_COMMON_L3POLICY_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/counter.h"
#include "core/loopguard.h"
#include "core/pkt.h"

/* Listener ports a stack may declare per family (the system stack's nat.listeners). */
#define L3POLICY_MAX_LISTENERS 16

/* Drop reasons, one counter each (visited as "drop_<reason>"). own_address, nat_address and
 * from_nat_address together are /stats' drops.own_address. */
#define L3POLICY_DROPS(X)                                                                     \
	X(own_address) /* to our gateway (see above) */                                          \
	X(nat_address) /* to a NAT address, but a listener's reply (a downlink look-alike) */   \
	X(from_nat_address) /* from a NAT address */                                             \
	X(icmp)        /* ICMP other than an echo request to the gateway */                     \
	X(proto)       /* neither TCP, UDP nor the family's ICMP */                              \
	X(family)      /* a family the TUN has no address for */                                \
	X(loop)        /* a SYN of one of the proxy's own sockets (UDP: dispatch/udp.h) */      \
	X(special_destination) /* a first SYN or a datagram to a special destination (above) */ \
	X(special_source) /* a first SYN from a special address (above): no host sends from it */

enum l3policy_verdict {
	L3POLICY_TCP,       /* TCP to a foreign destination: the stack's TCP path */
	L3POLICY_TCP_REPLY, /* TCP from gateway:listener to a NAT address: *reply filled */
	L3POLICY_UDP,       /* to the shared UDP path */
	L3POLICY_DNS,       /* a hijacked DNS query: to the shared UDP path */
	L3POLICY_ECHO,      /* ICMP(v6) echo request to the gateway: answer in place */
#define L3POLICY_DROP_ENUM(name) L3POLICY_DROP_##name,
	L3POLICY_DROPS(L3POLICY_DROP_ENUM)
#undef L3POLICY_DROP_ENUM
	L3POLICY_VERDICT_MAX
};

/* Every verdict from here on is a drop (exactly one reason counter was bumped). */
#define L3POLICY_DROP_FIRST L3POLICY_DROP_own_address
#define L3POLICY_N_DROPS (L3POLICY_VERDICT_MAX - L3POLICY_DROP_FIRST)

static inline bool l3policy_is_drop(enum l3policy_verdict v)
{
	return v >= L3POLICY_DROP_FIRST;
}

/* "own_address", ...; "tcp", "tcp_reply", "udp", "dns", "echo" for the others. */
const char *l3policy_verdict_name(enum l3policy_verdict v);

/* One counter per drop reason, by name or indexed by verdict - L3POLICY_DROP_FIRST. Only
 * ctr_t members: a block of them sums member by member. */
struct l3policy_counters {
	union {
		ctr_t drop[L3POLICY_N_DROPS];
		struct {
#define L3POLICY_CTR_FIELD(name) ctr_t drop_##name;
			L3POLICY_DROPS(L3POLICY_CTR_FIELD)
#undef L3POLICY_CTR_FIELD
		};
	};
};

/* Visit every counter as ("drop_<reason>", value). */
void l3policy_counters_foreach(const struct l3policy_counters *c,
			       void (*fn)(void *arg, const char *name, uint64_t value), void *arg);

/* Where a TCP_REPLY goes: NAT address nat_index (gateway + 1 + nat_index), from listener. */
struct l3policy_reply {
	uint8_t nat_index;
	uint8_t listener;
};

/* One family's roles. Not served (enabled false): every packet of it is a family drop. */
struct l3policy_family {
	bool enabled;
	uint32_t gw_low;  /* low 32 bits of the gateway, host order */
	uint32_t n_lports;
	uint16_t lport_be[L3POLICY_MAX_LISTENERS];
	uint8_t gateway[16]; /* IPv4 in [0..3] */
	uint8_t answer_src[16]; /* NAT address 0 (gateway + 1): l3policy_answer_src */
};

/* special_first[] flags by a destination's first byte: an address of this family with that
 * first byte may be special (l3policy_special_exact decides). */
#define L3POLICY_SPECIAL4 1u
#define L3POLICY_SPECIAL6 2u

/* Set up once, then read-only. IPv4 first: the inline TCP path reads f4 and n_addrs only. */
struct l3policy {
	struct l3policy_family f4;
	uint32_t n_addrs;    /* NAT addresses per family, >= 1 */
	bool dns_hijack;
	bool dns_tcp;        /* TCP to gateway:53 is the stack's TCP path */
	struct l3policy_family f6;
	struct loopguard *loopguard; /* NULL: no loop check */
	uint8_t special_first[256];  /* L3POLICY_SPECIAL4/6 by first byte (l3policy_init) */
};

struct l3policy_config {
	bool has4, has6;          /* families the TUN has an address for */
	uint8_t gateway4[4];      /* the TUN addresses (the gateways) */
	uint8_t gateway6[16];
	uint32_t n_addrs;         /* NAT addresses per family: gateway+1 .. gateway+n_addrs */
	bool dns_hijack;          /* UDP/53 goes to the UDP path whatever its destination */
	bool dns_tcp;             /* TCP to gateway:53 is let in: the dispatcher answers it
				   * (dispatcher_set_dns); only with dns_hijack */
	struct loopguard *loopguard; /* the proxy's own ports, or NULL */
};

/* 0, or -EINVAL: no family, n_addrs 0, or a run of addresses that wraps the low 32 bits.
 * No listener ports until l3policy_set_listeners. */
int l3policy_init(struct l3policy *p, const struct l3policy_config *cfg)
	__attribute__((warn_unused_result));

/* Declare the stack's listener ports of family (network order, n <= L3POLICY_MAX_LISTENERS):
 * TCP from gateway:port to a NAT address becomes TCP_REPLY. Call before classifying from any
 * other thread. 0 or -EINVAL (family not served, n too large). */
int l3policy_set_listeners(struct l3policy *p, int family, const uint16_t *ports_be, uint32_t n);

/* Offset of addr (4 or 16 bytes of f's family) in the run G .. G+n: 0 the gateway, 1+i NAT
 * address i; anything above n_addrs is not ours (UINT32_MAX for another IPv6 prefix). */
static inline uint32_t l3policy_offset4(const struct l3policy_family *f, const uint8_t *addr)
{
	uint32_t a;
	memcpy(&a, addr, 4);
	return ntohl(a) - f->gw_low;
}

/* Does addr (16 bytes) share the gateway's upper 96 bits (else it is not ours)? */
static inline bool l3policy_prefix6(const struct l3policy_family *f, const uint8_t *addr)
{
	uint64_t a, g;
	uint32_t b, h;

	memcpy(&a, addr, 8);
	memcpy(&g, f->gateway, 8);
	memcpy(&b, addr + 8, 4);
	memcpy(&h, f->gateway + 8, 4);
	return !((a ^ g) | (b ^ h));
}

static inline uint32_t l3policy_offset6(const struct l3policy_family *f, const uint8_t *addr)
{
	uint32_t lo;

	if (!l3policy_prefix6(f, addr))
		return UINT32_MAX;
	memcpy(&lo, addr + 12, 4);
	return ntohl(lo) - f->gw_low;
}

/* Our gateway or one of our NAT addresses? (addr: 4 or 16 bytes of family; false for a
 * family not served) */
bool l3policy_is_own(const struct l3policy *p, int family, const uint8_t *addr);

/* TCP to our gateway: only to its port 53 with DNS over TCP on (the dispatcher answers it;
 * only this own-address branch pays for the test). */
static inline enum l3policy_verdict l3policy_gateway_tcp(const struct l3policy *p,
							 const struct pkt_view *v)
{
	return p->dns_tcp && v->dport_be == htons(53) ? L3POLICY_TCP : L3POLICY_DROP_own_address;
}

/* TCP from the gateway to the NAT address at offset d (1..n): a reply from one of its
 * listener ports is TCP_REPLY (*reply filled); anything else is ours to drop. */
static inline enum l3policy_verdict l3policy_listener_reply(const struct l3policy_family *f,
							    uint32_t d, uint16_t sport_be,
							    struct l3policy_reply *reply)
{
	for (uint32_t i = 0; i < f->n_lports; i++) {
		if (sport_be == f->lport_be[i]) {
			reply->nat_index = (uint8_t)(d - 1);
			reply->listener = (uint8_t)i;
			return L3POLICY_TCP_REPLY;
		}
	}
	return L3POLICY_DROP_nat_address;
}

/* Is addr (4 or 16 bytes of family) a special destination? The exact test, for any address. */
bool l3policy_special_exact(int family, const uint8_t *addr);

/* Is addr (4 or 16 bytes) special? A table load by its first byte decides for all but the
 * few first bytes that may be special; those go to the exact test. */
static inline bool l3policy_special4(const struct l3policy *p, const uint8_t *addr)
{
	return __builtin_expect(p->special_first[addr[0]] & L3POLICY_SPECIAL4, 0) &&
	       l3policy_special_exact(4, addr);
}

static inline bool l3policy_special6(const struct l3policy *p, const uint8_t *addr)
{
	return __builtin_expect(p->special_first[addr[0]] & L3POLICY_SPECIAL6, 0) &&
	       l3policy_special_exact(6, addr);
}

/* The destination of v a special one? */
static inline bool l3policy_special_dst4(const struct l3policy *p, const struct pkt_view *v)
{
	return l3policy_special4(p, v->ip + PKT_V4_DST);
}

static inline bool l3policy_special_dst6(const struct l3policy *p, const struct pkt_view *v)
{
	return l3policy_special6(p, v->ip + PKT_V6_DST);
}

/* The TCP rules by destination for a served family (v->proto is TCP): TCP, TCP_REPLY (*reply
 * filled), DROP_own_address or DROP_nat_address. Counts nothing, and leaves the source to
 * l3policy_tcp; the system stack's TCP classifier is this. IPv4 inline, IPv6 out of line. */
enum l3policy_verdict l3policy_tcp_dst6(const struct l3policy *p, const struct pkt_view *v,
				    struct l3policy_reply *reply);

static inline enum l3policy_verdict l3policy_tcp_dst(const struct l3policy *p,
						     const struct pkt_view *v,
						     struct l3policy_reply *reply)
{
	const struct l3policy_family *f = &p->f4;

	if (v->family != 4)
		return l3policy_tcp_dst6(p, v, reply);
	uint32_t d = l3policy_offset4(f, v->ip + PKT_V4_DST);
	if (d > p->n_addrs)
		return L3POLICY_TCP;
	if (d == 0)
		return l3policy_gateway_tcp(p, v);
	if (l3policy_offset4(f, v->ip + PKT_V4_SRC) != 0)
		return L3POLICY_DROP_nat_address;
	return l3policy_listener_reply(f, d, v->sport_be, reply);
}

/* The source's offset in our run of addresses: 0 the gateway (local applications send from
 * it), 1..n a NAT address (nothing legitimate comes from there: TCP from one is dropped). */
static inline uint32_t l3policy_src_offset(const struct l3policy *p, const struct pkt_view *v)
{
	if (v->family == 4)
		return l3policy_offset4(&p->f4, v->ip + PKT_V4_SRC);
	return l3policy_offset6(&p->f6, v->ip + PKT_V6_SRC);
}

/* Source offset s (l3policy_src_offset) 0 — our gateway, the source the kernel gives a socket
 * whose route leads into the TUN — and TCP port sport_be of one of the proxy's own live
 * outbound sockets: a loop. */
static inline bool l3policy_from_self(const struct l3policy *p, int family, uint32_t s,
				      uint16_t sport_be)
{
	return s == 0 && p->loopguard && loopguard_hit(p->loopguard, 0, family, sport_be);
}

/* The same for a connection's source address src (4 or 16 bytes of family) and port. */
static inline bool l3policy_addr_from_self(const struct l3policy *p, int family,
					   const uint8_t *src, uint16_t sport_be)
{
	uint32_t s = family == 4 ? l3policy_offset4(&p->f4, src) : l3policy_offset6(&p->f6, src);

	return l3policy_from_self(p, family, s, sport_be);
}

/* A connection's first SYN (SYN without ACK): only it is checked against special addresses,
 * since without it no connection exists. A segment without the SYN bit, most of them, pays
 * this one test. */
static inline bool l3policy_first_syn(const struct pkt_view *v)
{
	return __builtin_expect((v->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN, 0);
}

/* A first SYN's addresses: to a special destination, then from a special source (no host
 * sends from one; lwIP's IP input would drop it uncounted); else TCP. */
static inline enum l3policy_verdict l3policy_first_syn4(const struct l3policy *p,
							const struct pkt_view *v)
{
	if (l3policy_special4(p, v->ip + PKT_V4_DST))
		return L3POLICY_DROP_special_destination;
	if (l3policy_special4(p, v->ip + PKT_V4_SRC))
		return L3POLICY_DROP_special_source;
	return L3POLICY_TCP;
}

static inline enum l3policy_verdict l3policy_first_syn6(const struct l3policy *p,
							const struct pkt_view *v)
{
	if (l3policy_special6(p, v->ip + PKT_V6_DST))
		return L3POLICY_DROP_special_destination;
	if (l3policy_special6(p, v->ip + PKT_V6_SRC))
		return L3POLICY_DROP_special_source;
	return L3POLICY_TCP;
}

/* All TCP rules for a served family (v->proto is TCP): by destination, then a first SYN's
 * special addresses (destination, then source), then TCP from one of our NAT addresses is
 * dropped, then a first SYN of the proxy's own. Counts nothing. */
static inline enum l3policy_verdict l3policy_tcp(const struct l3policy *p,
						 const struct pkt_view *v,
						 struct l3policy_reply *reply)
{
	enum l3policy_verdict vd;
	uint32_t s;

	if (v->family == 4) {
		if ((vd = l3policy_tcp_dst(p, v, reply)) != L3POLICY_TCP)
			return vd;
		if (l3policy_first_syn(v) && (vd = l3policy_first_syn4(p, v)) != L3POLICY_TCP)
			return vd;
		s = l3policy_offset4(&p->f4, v->ip + PKT_V4_SRC);
	} else {
		if ((vd = l3policy_tcp_dst6(p, v, reply)) != L3POLICY_TCP)
			return vd;
		if (l3policy_first_syn(v) && (vd = l3policy_first_syn6(p, v)) != L3POLICY_TCP)
			return vd;
		s = l3policy_offset6(&p->f6, v->ip + PKT_V6_SRC);
	}
	if (s - 1 < p->n_addrs)
		return L3POLICY_DROP_from_nat_address;
	/* Only a connection's first segment is checked: a looping one never gets further. */
	if (s == 0 && l3policy_first_syn(v) && l3policy_from_self(p, v->family, s, v->sport_be))
		return L3POLICY_DROP_loop;
	return vd;
}

/* Is v's source one of our NAT addresses? The low 32 bits decide first (an application's
 * source is the gateway or a foreign address: one subtraction and compare), the IPv6 prefix
 * only for the rare packet whose low bits match. */
static inline bool l3policy_from_nat4(const struct l3policy *p, const struct pkt_view *v)
{
	return l3policy_offset4(&p->f4, v->ip + PKT_V4_SRC) - 1 < p->n_addrs;
}

static inline bool l3policy_from_nat6(const struct l3policy *p, const struct pkt_view *v)
{
	const uint8_t *src = v->ip + PKT_V6_SRC;
	uint32_t lo;

	memcpy(&lo, src + 12, 4);
	return ntohl(lo) - p->f6.gw_low - 1 < p->n_addrs && l3policy_prefix6(&p->f6, src);
}

/* The UDP rules for a served family (v->proto is UDP): DNS, UDP, DROP_from_nat_address,
 * DROP_own_address, DROP_nat_address or DROP_special_destination. Counts nothing. One
 * function per family, so that a caller that already branched on the family tests it once. */
static inline enum l3policy_verdict l3policy_udp4(const struct l3policy *p,
						  const struct pkt_view *v)
{
	uint32_t d;

	if (l3policy_from_nat4(p, v))
		return L3POLICY_DROP_from_nat_address;
	if (p->dns_hijack && v->dport_be == htons(53))
		return L3POLICY_DNS;
	if ((d = l3policy_offset4(&p->f4, v->ip + PKT_V4_DST)) <= p->n_addrs)
		return d == 0 ? L3POLICY_DROP_own_address : L3POLICY_DROP_nat_address;
	return l3policy_special_dst4(p, v) ? L3POLICY_DROP_special_destination : L3POLICY_UDP;
}

static inline enum l3policy_verdict l3policy_udp6(const struct l3policy *p,
						  const struct pkt_view *v)
{
	const uint8_t *dst = v->ip + PKT_V6_DST;
	uint32_t d;

	if (l3policy_from_nat6(p, v))
		return L3POLICY_DROP_from_nat_address;
	if (p->dns_hijack && v->dport_be == htons(53))
		return L3POLICY_DNS;
	/* Another prefix (most datagrams) goes straight to the special check. */
	if (l3policy_prefix6(&p->f6, dst) && (d = l3policy_offset6(&p->f6, dst)) <= p->n_addrs)
		return d == 0 ? L3POLICY_DROP_own_address : L3POLICY_DROP_nat_address;
	return l3policy_special_dst6(p, v) ? L3POLICY_DROP_special_destination : L3POLICY_UDP;
}

static inline enum l3policy_verdict l3policy_udp(const struct l3policy *p,
						 const struct pkt_view *v)
{
	return v->family == 4 ? l3policy_udp4(p, v) : l3policy_udp6(p, v);
}

/* How a stack answers a refused first SYN, so that the app's connect fails at once instead of
 * after its SYN retransmissions (minutes). */
enum l3policy_answer {
	L3POLICY_ANSWER_NONE,
	L3POLICY_ANSWER_RST,     /* a RST from the SYN's destination (rewrite_tcp_rst) */
	L3POLICY_ANSWER_UNREACH, /* ICMP(v6) port unreachable from l3policy_answer_src
				  * (rewrite_icmp_unreach) */
};

/* The answer to a packet refused with verdict vd. Only TCP is answered, never a segment that
 * carries a RST itself (RFC 9293 section 3.10.7) and never an IPv4 packet whose header checksum
 * fails (it may not say where it came from).
 *   DROP_loop: a RST. The destination is an ordinary address the kernel routed into the TUN,
 *   so a segment from it is one the kernel takes.
 *   DROP_special_destination: an ICMP port unreachable from l3policy_answer_src, not a RST.
 *   A RST would come from the special address, and the kernel refuses many of those as a
 *   source: 127/8 on any device but lo (a martian source, without route_localnet), 0/8 before
 *   Linux 5.3, :: when forwarding. None to a multicast or broadcast destination (such a SYN is
 *   discarded silently, RFC 1122 4.2.3.10), nor for a SYN whose source does not name one host
 *   (itself special: RFC 1122 3.2.2 sends no ICMP error about such a datagram) or is one of
 *   our NAT addresses (forged: the answer would be addressed to ourselves).
 * Any other verdict: none. */
enum l3policy_answer l3policy_answer(const struct l3policy *p, const struct pkt_view *v,
				     enum l3policy_verdict vd);

/* The source of an L3POLICY_ANSWER_UNREACH of family (4 or 6, served): 4 or 16 bytes, valid as
 * long as p. It is the first NAT address, gateway + 1, because the kernel must take a packet
 * from it on the TUN: the address lies inside the TUN's prefix (core/netaddr.h proves it) and
 * is not the kernel's own, so the connected route leads back into the TUN (reverse-path
 * filtering, strict or loose, passes) and it is no martian source, as the gateway, a local
 * address of the host, would be. Nothing the stacks read from the TUN comes from it (packets
 * from a NAT address are dropped), and an ICMP error is matched to its connection by the
 * quoted header, not by its source. */
static inline const uint8_t *l3policy_answer_src(const struct l3policy *p, int family)
{
	return family == 4 ? p->f4.answer_src : p->f6.answer_src;
}

static inline enum l3policy_verdict l3policy_count(struct l3policy_counters *c,
						   enum l3policy_verdict v)
{
	if (l3policy_is_drop(v))
		ctr_inc(&c->drop[v - L3POLICY_DROP_FIRST]);
	return v;
}

/* The whole of l3policy_classify out of line; it calls this for ICMP, other protocols and
 * unserved families. */
enum l3policy_verdict l3policy_classify_slow(const struct l3policy *p, const struct pkt_view *v,
					     struct l3policy_reply *reply,
					     struct l3policy_counters *c);

/* The verdict for a parsed packet (pkt_parse returned PKT_OK). A drop bumps exactly one of
 * *c's counters; nothing else is counted (what the stack then does is its own business). */
static inline enum l3policy_verdict l3policy_classify(const struct l3policy *p,
						      const struct pkt_view *v,
						      struct l3policy_reply *reply,
						      struct l3policy_counters *c)
{
	if (!(v->family == 4 ? p->f4.enabled : p->f6.enabled))
		return l3policy_classify_slow(p, v, reply, c);
	if (v->proto == IPPROTO_TCP)
		return l3policy_count(c, l3policy_tcp(p, v, reply));
	if (v->proto == IPPROTO_UDP)
		return l3policy_count(c, v->family == 4 ? l3policy_udp4(p, v)
							: l3policy_udp6(p, v));
	return l3policy_classify_slow(p, v, reply, c);
}

#endif
