/* test_l3policy.c — the policy both stacks apply to every parsed packet
 * (stacks/common/l3policy.c): one table row per rule and family, checked for its verdict, the
 * one drop counter it bumps and the listener reply it names; special destinations (each class,
 * both families, a first SYN and a datagram, and the near misses that are not special), which
 * refusals are answered and how (an ICMP port unreachable from the first NAT address for a
 * special destination, built and verified; a RST for a loop); set-up refusals; and the inline
 * classifier against its out-of-line twin on random packets. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include <sys/socket.h>
#include <unistd.h>

#include "core/loopguard.h"
#include "core/pkt.h"
#include "stacks/common/l3policy.h"
#include "stacks/common/rewrite.h"
#include "stacks/netstack.h"
#include "testutil.h"

/* Gateways 198.18.0.1 and fd00:7f::1, NAT addresses G+1 .. G+4, listeners 40000 and 40001. */
#define N_ADDRS 4
static const uint16_t lports[2] = { 40000, 40001 };
static struct loopguard *test_lg; /* the loop guard policy() installs, if any */

static void policy(struct l3policy *p, bool has6, bool hijack)
{
	struct l3policy_config c = { .has4 = true, .has6 = has6, .n_addrs = N_ADDRS,
				     .dns_hijack = hijack, .loopguard = test_lg };
	uint16_t be[2] = { htons(lports[0]), htons(lports[1]) };
	uint8_t a[16];

	tu_addr(a, "198.18.0.1");
	memcpy(c.gateway4, a, 4);
	tu_addr(c.gateway6, "fd00:7f::1");
	cr_assert_eq(l3policy_init(p, &c), 0);
	cr_assert_eq(l3policy_set_listeners(p, 4, be, 2), 0);
	if (has6)
		cr_assert_eq(l3policy_set_listeners(p, 6, be, 2), 0);
}

enum kind { K_TCP, K_SYN, K_UDP, K_ECHO, K_RAW }; /* K_TCP: an ACK segment; K_SYN: a first SYN */

struct row {
	const char *name;
	enum kind kind;
	const char *src;
	uint16_t sport;
	const char *dst;
	uint16_t dport;
	uint8_t icmp_type, icmp_code; /* K_ECHO: ICMP type and code; K_RAW: the protocol in type */
	bool hijack;
	enum l3policy_verdict want;
	struct l3policy_reply reply;  /* TCP_REPLY only */
};

static size_t build(const struct row *r, uint8_t *buf, size_t cap)
{
	struct tu_spec s;

	switch (r->kind) {
	case K_TCP:
	case K_SYN:
		tu_spec_tcp(&s, r->src, r->sport, r->dst, r->dport);
		if (r->kind == K_SYN)
			s.tcp_flags = TCP_SYN;
		break;
	case K_UDP:
		tu_spec_udp(&s, r->src, r->sport, r->dst, r->dport);
		s.payload_len = 16;
		break;
	case K_ECHO:
		tu_spec_icmp_echo(&s, r->src, r->dst, 7, 1);
		s.icmp_type = r->icmp_type;
		s.icmp_code = r->icmp_code;
		break;
	case K_RAW:
		tu_spec_raw(&s, r->src, r->dst, r->icmp_type);
		s.payload_len = 8;
		break;
	}
	return tu_build(&s, buf, cap);
}

static void check(const struct row *r, bool has6)
{
	static uint8_t buf[256];
	struct l3policy p;
	struct l3policy_counters c;
	struct l3policy_reply reply = { 0xff, 0xff };
	struct pkt_view v;

	policy(&p, has6, r->hijack);
	memset(&c, 0, sizeof(c));
	size_t len = build(r, buf, sizeof(buf));
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK, "%s: parse", r->name);
	enum l3policy_verdict got = l3policy_classify(&p, &v, &reply, &c);
	cr_assert_eq(got, r->want, "%s: verdict %s, want %s", r->name, l3policy_verdict_name(got),
		     l3policy_verdict_name(r->want));
	for (int i = 0; i < L3POLICY_N_DROPS; i++) {
		uint64_t want = l3policy_is_drop(r->want) && i == (int)(r->want - L3POLICY_DROP_FIRST);
		cr_assert_eq(ctr_get(&c.drop[i]), want, "%s: counter drop_%s", r->name,
			     l3policy_verdict_name((enum l3policy_verdict)(L3POLICY_DROP_FIRST + i)));
	}
	if (r->want == L3POLICY_TCP_REPLY) {
		cr_assert_eq(reply.nat_index, r->reply.nat_index, "%s: NAT address", r->name);
		cr_assert_eq(reply.listener, r->reply.listener, "%s: listener", r->name);
	}
	/* The out-of-line classifier is the same policy. */
	memset(&c, 0, sizeof(c));
	cr_assert_eq(l3policy_classify_slow(&p, &v, &reply, &c), r->want, "%s: slow", r->name);
}

#define OWN L3POLICY_DROP_own_address
#define NATA L3POLICY_DROP_nat_address
#define FROMNAT L3POLICY_DROP_from_nat_address

static const struct row rows4[] = {
	{ "tcp foreign", K_TCP, "198.18.0.9", 5000, "93.184.216.34", 443, 0, 0, false,
	  L3POLICY_TCP, { 0, 0 } },
	{ "tcp from the gateway (local app)", K_TCP, "198.18.0.1", 5000, "1.1.1.1", 443, 0, 0,
	  false, L3POLICY_TCP, { 0, 0 } },
	{ "tcp just past the NAT run", K_TCP, "198.18.0.9", 5000, "198.18.0.6", 80, 0, 0, false,
	  L3POLICY_TCP, { 0, 0 } },
	{ "tcp to the gateway", K_TCP, "198.18.0.9", 5000, "198.18.0.1", 80, 0, 0, false, OWN,
	  { 0, 0 } },
	{ "tcp to a NAT address", K_TCP, "198.18.0.9", 5000, "198.18.0.3", 80, 0, 0, false, NATA,
	  { 0, 0 } },
	{ "tcp from a NAT address", K_TCP, "198.18.0.2", 5000, "1.1.1.1", 443, 0, 0, false,
	  FROMNAT, { 0, 0 } },
	{ "tcp from the last NAT address", K_TCP, "198.18.0.5", 5000, "1.1.1.1", 443, 0, 0, false,
	  FROMNAT, { 0, 0 } },
	{ "tcp from a NAT address to the gateway (destination first)", K_TCP, "198.18.0.2", 5000,
	  "198.18.0.1", 443, 0, 0, false, OWN, { 0, 0 } },
	{ "tcp listener reply", K_TCP, "198.18.0.1", 40001, "198.18.0.4", 1024, 0, 0, false,
	  L3POLICY_TCP_REPLY, { 2, 1 } },
	{ "tcp listener reply, last NAT address", K_TCP, "198.18.0.1", 40000, "198.18.0.5", 1024,
	  0, 0, false, L3POLICY_TCP_REPLY, { 3, 0 } },
	{ "tcp gateway, not a listener", K_TCP, "198.18.0.1", 40002, "198.18.0.4", 1024, 0, 0,
	  false, NATA, { 0, 0 } },
	{ "tcp listener port, not from the gateway", K_TCP, "198.18.0.9", 40000, "198.18.0.4",
	  1024, 0, 0, false, NATA, { 0, 0 } },
	{ "udp foreign", K_UDP, "198.18.0.9", 5000, "1.1.1.1", 443, 0, 0, false, L3POLICY_UDP,
	  { 0, 0 } },
	{ "udp to a NAT address", K_UDP, "198.18.0.9", 5000, "198.18.0.2", 443, 0, 0, true, NATA,
	  { 0, 0 } },
	{ "udp to the gateway", K_UDP, "198.18.0.9", 5000, "198.18.0.1", 443, 0, 0, true, OWN,
	  { 0, 0 } },
	{ "udp from a NAT address", K_UDP, "198.18.0.3", 5000, "1.1.1.1", 443, 0, 0, false,
	  FROMNAT, { 0, 0 } },
	{ "dns from a NAT address, hijack (source first)", K_UDP, "198.18.0.4", 5000,
	  "198.18.0.1", 53, 0, 0, true, FROMNAT, { 0, 0 } },
	{ "udp from the gateway (local app)", K_UDP, "198.18.0.1", 5000, "1.1.1.1", 443, 0, 0,
	  false, L3POLICY_UDP, { 0, 0 } },
	{ "udp from just past the NAT run", K_UDP, "198.18.0.6", 5000, "1.1.1.1", 443, 0, 0,
	  false, L3POLICY_UDP, { 0, 0 } },
	{ "dns to the gateway, hijack", K_UDP, "198.18.0.9", 5000, "198.18.0.1", 53, 0, 0, true,
	  L3POLICY_DNS, { 0, 0 } },
	{ "dns foreign, hijack", K_UDP, "198.18.0.9", 5000, "8.8.8.8", 53, 0, 0, true,
	  L3POLICY_DNS, { 0, 0 } },
	{ "dns to the gateway, no hijack", K_UDP, "198.18.0.9", 5000, "198.18.0.1", 53, 0, 0,
	  false, OWN, { 0, 0 } },
	{ "dns foreign, no hijack", K_UDP, "198.18.0.9", 5000, "8.8.8.8", 53, 0, 0, false,
	  L3POLICY_UDP, { 0, 0 } },
	{ "echo to the gateway", K_ECHO, "198.18.0.9", 0, "198.18.0.1", 0, 8, 0, false,
	  L3POLICY_ECHO, { 0, 0 } },
	{ "echo to a NAT address", K_ECHO, "198.18.0.9", 0, "198.18.0.2", 0, 8, 0, false,
	  L3POLICY_DROP_icmp, { 0, 0 } },
	{ "echo foreign", K_ECHO, "198.18.0.9", 0, "1.1.1.1", 0, 8, 0, false, L3POLICY_DROP_icmp,
	  { 0, 0 } },
	{ "echo reply to the gateway", K_ECHO, "198.18.0.9", 0, "198.18.0.1", 0, 0, 0, false,
	  L3POLICY_DROP_icmp, { 0, 0 } },
	{ "echo code 1", K_ECHO, "198.18.0.9", 0, "198.18.0.1", 0, 8, 1, false,
	  L3POLICY_DROP_icmp, { 0, 0 } },
	{ "icmpv6 in ipv4", K_RAW, "198.18.0.9", 0, "198.18.0.1", 0, IPPROTO_ICMPV6, 0, false,
	  L3POLICY_DROP_proto, { 0, 0 } },
	{ "gre", K_RAW, "198.18.0.9", 0, "1.1.1.1", 0, 47, 0, false, L3POLICY_DROP_proto,
	  { 0, 0 } },
};

static const struct row rows6[] = {
	{ "tcp foreign", K_TCP, "fd00:7f::9", 5000, "2001:db8::80", 443, 0, 0, false, L3POLICY_TCP,
	  { 0, 0 } },
	{ "tcp other prefix, same low bits", K_TCP, "fd00:7f::9", 5000, "fd00:7e::2", 443, 0, 0,
	  false, L3POLICY_TCP, { 0, 0 } },
	{ "tcp to the gateway", K_TCP, "fd00:7f::9", 5000, "fd00:7f::1", 80, 0, 0, false, OWN,
	  { 0, 0 } },
	{ "tcp to a NAT address", K_TCP, "fd00:7f::9", 5000, "fd00:7f::5", 80, 0, 0, false, NATA,
	  { 0, 0 } },
	{ "tcp from a NAT address", K_TCP, "fd00:7f::3", 5000, "2001:db8::80", 443, 0, 0, false,
	  FROMNAT, { 0, 0 } },
	{ "tcp listener reply", K_TCP, "fd00:7f::1", 40000, "fd00:7f::2", 1024, 0, 0, false,
	  L3POLICY_TCP_REPLY, { 0, 0 } },
	{ "tcp gateway, not a listener", K_TCP, "fd00:7f::1", 443, "fd00:7f::2", 1024, 0, 0,
	  false, NATA, { 0, 0 } },
	{ "udp foreign", K_UDP, "fd00:7f::9", 5000, "2001:db8::80", 443, 0, 0, false,
	  L3POLICY_UDP, { 0, 0 } },
	{ "udp to the gateway", K_UDP, "fd00:7f::9", 5000, "fd00:7f::1", 443, 0, 0, true, OWN,
	  { 0, 0 } },
	{ "udp to a NAT address", K_UDP, "fd00:7f::9", 5000, "fd00:7f::4", 443, 0, 0, false, NATA,
	  { 0, 0 } },
	{ "udp from a NAT address", K_UDP, "fd00:7f::5", 5000, "2001:db8::80", 443, 0, 0, false,
	  FROMNAT, { 0, 0 } },
	{ "udp from the NAT low bits, other prefix", K_UDP, "fd00:7e::2", 5000, "2001:db8::80",
	  443, 0, 0, false, L3POLICY_UDP, { 0, 0 } },
	{ "udp from the gateway (local app)", K_UDP, "fd00:7f::1", 5000, "2001:db8::80", 443, 0,
	  0, false, L3POLICY_UDP, { 0, 0 } },
	{ "dns to a NAT address, hijack", K_UDP, "fd00:7f::9", 5000, "fd00:7f::3", 53, 0, 0, true,
	  L3POLICY_DNS, { 0, 0 } },
	{ "dns to the gateway, no hijack", K_UDP, "fd00:7f::9", 5000, "fd00:7f::1", 53, 0, 0,
	  false, OWN, { 0, 0 } },
	{ "echo to the gateway", K_ECHO, "fd00:7f::9", 0, "fd00:7f::1", 0, 128, 0, false,
	  L3POLICY_ECHO, { 0, 0 } },
	{ "echo foreign", K_ECHO, "fd00:7f::9", 0, "2001:db8::1", 0, 128, 0, false,
	  L3POLICY_DROP_icmp, { 0, 0 } },
	{ "echo code 1", K_ECHO, "fd00:7f::9", 0, "fd00:7f::1", 0, 128, 1, false,
	  L3POLICY_DROP_icmp, { 0, 0 } },
	{ "echo reply to the gateway", K_ECHO, "fd00:7f::9", 0, "fd00:7f::1", 0, 129, 0, false,
	  L3POLICY_DROP_icmp, { 0, 0 } },
	{ "icmp in ipv6", K_RAW, "fd00:7f::9", 0, "fd00:7f::1", 0, IPPROTO_ICMP, 0, false,
	  L3POLICY_DROP_proto, { 0, 0 } },
	{ "sctp", K_RAW, "fd00:7f::9", 0, "2001:db8::1", 0, 132, 0, false, L3POLICY_DROP_proto,
	  { 0, 0 } },
};

Test(l3policy, table_ipv4)
{
	for (size_t i = 0; i < sizeof(rows4) / sizeof(rows4[0]); i++)
		check(&rows4[i], true);
}

Test(l3policy, table_ipv6)
{
	for (size_t i = 0; i < sizeof(rows6) / sizeof(rows6[0]); i++)
		check(&rows6[i], true);
}

/* Special destinations: never a remote host's address (unspecified, loopback, multicast, limited
 * broadcast) or another family's address in IPv6 clothing (IPv4-mapped, IPv4-compatible). A
 * first SYN and a datagram to one are dropped, one drop_special_destination each; private
 * ranges, link-local, benchmarking/fake-IP (198.18.0.0/15) and class E are not special. */
#define SPECIAL L3POLICY_DROP_special_destination
#define SP(name, kind, dst, want) { name, kind, SRC, 5000, dst, 7100, 0, 0, false, want, { 0, 0 } }

#define SRC "198.18.0.9"
static const struct row special4[] = {
	SP("syn 0.0.0.0", K_SYN, "0.0.0.0", SPECIAL),
	SP("udp 0.0.0.0", K_UDP, "0.0.0.0", SPECIAL),
	SP("syn 0.1.2.3 (this network)", K_SYN, "0.1.2.3", SPECIAL),
	SP("udp 0.255.255.255", K_UDP, "0.255.255.255", SPECIAL),
	SP("syn 127.0.0.1", K_SYN, "127.0.0.1", SPECIAL),
	SP("udp 127.0.0.1", K_UDP, "127.0.0.1", SPECIAL),
	SP("syn 127.255.255.254", K_SYN, "127.255.255.254", SPECIAL),
	SP("udp 127.1.2.3", K_UDP, "127.1.2.3", SPECIAL),
	SP("syn 224.0.0.1", K_SYN, "224.0.0.1", SPECIAL),
	SP("udp 224.0.0.251 (mDNS)", K_UDP, "224.0.0.251", SPECIAL),
	SP("syn 239.255.255.255", K_SYN, "239.255.255.255", SPECIAL),
	SP("udp 239.255.255.250 (SSDP)", K_UDP, "239.255.255.250", SPECIAL),
	SP("syn 255.255.255.255", K_SYN, "255.255.255.255", SPECIAL),
	SP("udp 255.255.255.255", K_UDP, "255.255.255.255", SPECIAL),
	/* Not special. */
	SP("syn 10.0.0.1", K_SYN, "10.0.0.1", L3POLICY_TCP),
	SP("udp 10.0.0.1", K_UDP, "10.0.0.1", L3POLICY_UDP),
	SP("syn 172.16.0.1", K_SYN, "172.16.0.1", L3POLICY_TCP),
	SP("udp 192.168.1.1", K_UDP, "192.168.1.1", L3POLICY_UDP),
	SP("syn 100.64.0.1", K_SYN, "100.64.0.1", L3POLICY_TCP),
	SP("syn 198.18.5.5 (fake-IP)", K_SYN, "198.18.5.5", L3POLICY_TCP),
	SP("udp 198.19.255.255", K_UDP, "198.19.255.255", L3POLICY_UDP),
	SP("syn 169.254.169.254 (link-local)", K_SYN, "169.254.169.254", L3POLICY_TCP),
	SP("udp 169.254.1.1 (link-local)", K_UDP, "169.254.1.1", L3POLICY_UDP),
	SP("syn 1.0.0.1", K_SYN, "1.0.0.1", L3POLICY_TCP),
	SP("udp 126.255.255.255", K_UDP, "126.255.255.255", L3POLICY_UDP),
	SP("syn 128.0.0.1", K_SYN, "128.0.0.1", L3POLICY_TCP),
	SP("udp 223.255.255.255", K_UDP, "223.255.255.255", L3POLICY_UDP),
	SP("syn 240.0.0.1 (class E)", K_SYN, "240.0.0.1", L3POLICY_TCP),
	SP("udp 255.255.255.254", K_UDP, "255.255.255.254", L3POLICY_UDP),
	/* Only a first SYN is checked: a later segment is the stack's (it has no connection). */
	SP("ack 127.0.0.1", K_TCP, "127.0.0.1", L3POLICY_TCP),
	/* Hijacked DNS never goes to its destination: it wins. */
	{ "dns 127.0.0.53, hijack", K_UDP, SRC, 5000, "127.0.0.53", 53, 0, 0, true, L3POLICY_DNS,
	  { 0, 0 } },
	{ "dns 127.0.0.53, no hijack", K_UDP, SRC, 5000, "127.0.0.53", 53, 0, 0, false, SPECIAL,
	  { 0, 0 } },
};
#undef SRC

#define SRC "fd00:7f::9"
static const struct row special6[] = {
	SP("syn ::", K_SYN, "::", SPECIAL),
	SP("udp ::", K_UDP, "::", SPECIAL),
	SP("syn ::1", K_SYN, "::1", SPECIAL),
	SP("udp ::1", K_UDP, "::1", SPECIAL),
	SP("syn ::ffff:127.0.0.1 (mapped)", K_SYN, "::ffff:127.0.0.1", SPECIAL),
	SP("udp ::ffff:127.0.0.1 (mapped)", K_UDP, "::ffff:127.0.0.1", SPECIAL),
	SP("syn ::ffff:10.0.0.1 (mapped)", K_SYN, "::ffff:10.0.0.1", SPECIAL),
	SP("udp ::ffff:8.8.8.8 (mapped)", K_UDP, "::ffff:8.8.8.8", SPECIAL),
	SP("syn ::ffff:0.0.0.0 (mapped)", K_SYN, "::ffff:0.0.0.0", SPECIAL),
	SP("syn ::127.0.0.1 (compatible)", K_SYN, "::127.0.0.1", SPECIAL),
	SP("udp ::10.0.0.1 (compatible)", K_UDP, "::10.0.0.1", SPECIAL),
	SP("syn ::255.255.255.255 (compatible)", K_SYN, "::255.255.255.255", SPECIAL),
	SP("syn ff02::1", K_SYN, "ff02::1", SPECIAL),
	SP("udp ff02::fb (mDNS)", K_UDP, "ff02::fb", SPECIAL),
	SP("syn ff05::1:3", K_SYN, "ff05::1:3", SPECIAL),
	SP("udp ffff::1", K_UDP, "ffff::1", SPECIAL),
	/* Not special. */
	SP("syn 2001:db8::1", K_SYN, "2001:db8::1", L3POLICY_TCP),
	SP("udp 2001:db8::1", K_UDP, "2001:db8::1", L3POLICY_UDP),
	SP("syn fd00::1 (ULA)", K_SYN, "fd00::1", L3POLICY_TCP),
	SP("udp fc00::1 (ULA)", K_UDP, "fc00::1", L3POLICY_UDP),
	SP("syn fe80::1 (link-local)", K_SYN, "fe80::1", L3POLICY_TCP),
	SP("udp febf::1 (link-local)", K_UDP, "febf::1", L3POLICY_UDP),
	SP("syn fe00::1", K_SYN, "fe00::1", L3POLICY_TCP),
	SP("syn ::1:0:0:1", K_SYN, "::1:0:0:1", L3POLICY_TCP),
	SP("udp ::fffe:7f00:1", K_UDP, "::fffe:7f00:1", L3POLICY_UDP),
	SP("syn ::ffff:0:7f00:1 (translated, not mapped)", K_SYN, "::ffff:0:7f00:1",
	   L3POLICY_TCP),
	SP("syn 64:ff9b::7f00:1 (NAT64)", K_SYN, "64:ff9b::7f00:1", L3POLICY_TCP),
	SP("udp 100::1 (discard)", K_UDP, "100::1", L3POLICY_UDP),
	SP("syn 1::1", K_SYN, "1::1", L3POLICY_TCP),
	SP("ack ::1", K_TCP, "::1", L3POLICY_TCP),
	{ "dns ::1, hijack", K_UDP, SRC, 5000, "::1", 53, 0, 0, true, L3POLICY_DNS, { 0, 0 } },
	{ "dns ::1, no hijack", K_UDP, SRC, 5000, "::1", 53, 0, 0, false, SPECIAL, { 0, 0 } },
};
#undef SRC
#undef SP

Test(l3policy, special_destinations_ipv4)
{
	for (size_t i = 0; i < sizeof(special4) / sizeof(special4[0]); i++)
		check(&special4[i], true);
}

Test(l3policy, special_destinations_ipv6)
{
	for (size_t i = 0; i < sizeof(special6) / sizeof(special6[0]); i++)
		check(&special6[i], true);
}

/* A first SYN from a special source (unspecified, loopback, multicast, broadcast, IPv4-mapped
 * or -compatible IPv6): no host can be answered there, and lwIP would drop it uncounted. It
 * is dropped as drop_special_source, once. A later segment is the stack's; a datagram goes
 * on (the UDP path answers to where it came from). */
#define SPSRC L3POLICY_DROP_special_source
#define SS(name, kind, src, dst, want) { name, kind, src, 5000, dst, 443, 0, 0, false, want, { 0, 0 } }
static const struct row special_src[] = {
	SS("syn from 0.0.0.0", K_SYN, "0.0.0.0", "10.0.0.1", SPSRC),
	SS("syn from 127.0.0.1", K_SYN, "127.0.0.1", "10.0.0.1", SPSRC),
	SS("syn from 224.0.0.9", K_SYN, "224.0.0.9", "10.0.0.1", SPSRC),
	SS("syn from 255.255.255.255", K_SYN, "255.255.255.255", "10.0.0.1", SPSRC),
	SS("syn from ::", K_SYN, "::", "2001:db8::1", SPSRC),
	SS("syn from ::1", K_SYN, "::1", "2001:db8::1", SPSRC),
	SS("syn from ::ffff:10.0.0.9 (mapped)", K_SYN, "::ffff:10.0.0.9", "2001:db8::1", SPSRC),
	SS("syn from ff02::1", K_SYN, "ff02::1", "2001:db8::1", SPSRC),
	/* A special destination is the first reason. */
	SS("syn 224.0.0.9 -> 127.0.0.1", K_SYN, "224.0.0.9", "127.0.0.1", SPECIAL),
	/* Not a first SYN, not TCP, not special. */
	SS("ack from 224.0.0.9", K_TCP, "224.0.0.9", "10.0.0.1", L3POLICY_TCP),
	SS("ack from ff02::1", K_TCP, "ff02::1", "2001:db8::1", L3POLICY_TCP),
	SS("udp from 224.0.0.9", K_UDP, "224.0.0.9", "10.0.0.1", L3POLICY_UDP),
	SS("syn from 10.0.0.9", K_SYN, "10.0.0.9", "10.0.0.1", L3POLICY_TCP),
	SS("syn from 169.254.1.1", K_SYN, "169.254.1.1", "10.0.0.1", L3POLICY_TCP),
	SS("syn from fe80::1", K_SYN, "fe80::1", "2001:db8::1", L3POLICY_TCP),
};
#undef SS

Test(l3policy, special_sources)
{
	for (size_t i = 0; i < sizeof(special_src) / sizeof(special_src[0]); i++)
		check(&special_src[i], true);
}

Test(l3policy, family_not_served)
{
	static const struct row rows[] = {
		{ "tcp6 without v6", K_TCP, "fd00:7f::9", 5000, "2001:db8::80", 443, 0, 0, false,
		  L3POLICY_DROP_family, { 0, 0 } },
		{ "udp6 without v6", K_UDP, "fd00:7f::9", 5000, "2001:db8::80", 53, 0, 0, true,
		  L3POLICY_DROP_family, { 0, 0 } },
		{ "echo6 without v6", K_ECHO, "fd00:7f::9", 0, "fd00:7f::1", 0, 128, 0, false,
		  L3POLICY_DROP_family, { 0, 0 } },
		{ "tcp4 still served", K_TCP, "198.18.0.9", 5000, "1.1.1.1", 443, 0, 0, false,
		  L3POLICY_TCP, { 0, 0 } },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		check(&rows[i], false);
}

Test(l3policy, is_own)
{
	struct l3policy p;
	uint8_t a[16];

	policy(&p, false, false);
	tu_addr(a, "198.18.0.1");
	cr_assert(l3policy_is_own(&p, 4, a));
	tu_addr(a, "198.18.0.5");
	cr_assert(l3policy_is_own(&p, 4, a));
	tu_addr(a, "198.18.0.6");
	cr_assert_not(l3policy_is_own(&p, 4, a));
	tu_addr(a, "198.18.0.0");
	cr_assert_not(l3policy_is_own(&p, 4, a));
	tu_addr(a, "fd00:7f::1");
	cr_assert_not(l3policy_is_own(&p, 6, a), "IPv6 not served: nothing is ours");
}

Test(l3policy, setup_refusals)
{
	struct l3policy p;
	struct l3policy_config c = { .has4 = true, .n_addrs = 4 };
	uint16_t be[L3POLICY_MAX_LISTENERS + 1] = { 0 };

	c.has4 = false;
	cr_assert_eq(l3policy_init(&p, &c), -EINVAL, "no family");
	c.has4 = true;
	c.n_addrs = 0;
	cr_assert_eq(l3policy_init(&p, &c), -EINVAL, "no NAT address");
	c.n_addrs = 4;
	memset(c.gateway4, 0xff, 4);
	c.gateway4[3] = 0xfd; /* 255.255.255.253 + 4 wraps */
	cr_assert_eq(l3policy_init(&p, &c), -EINVAL, "run wraps");
	c.gateway4[3] = 0xfb;
	cr_assert_eq(l3policy_init(&p, &c), 0, "255.255.255.251 + 4 fits");
	cr_assert_eq(l3policy_set_listeners(&p, 6, be, 1), -EINVAL, "IPv6 not served");
	cr_assert_eq(l3policy_set_listeners(&p, 4, be, L3POLICY_MAX_LISTENERS + 1), -EINVAL);
	cr_assert_eq(l3policy_set_listeners(&p, 5, be, 1), -EINVAL);
	cr_assert_eq(l3policy_set_listeners(&p, 4, be, L3POLICY_MAX_LISTENERS), 0);
}

struct names {
	char seen[L3POLICY_N_DROPS][32];
	int n;
	uint64_t sum;
};

static void collect(void *arg, const char *name, uint64_t value)
{
	struct names *s = arg;
	cr_assert_lt(s->n, L3POLICY_N_DROPS);
	snprintf(s->seen[s->n++], sizeof(s->seen[0]), "%s", name);
	s->sum += value;
}

Test(l3policy, counter_names)
{
	struct l3policy_counters c = { 0 };
	struct names s = { 0 };

	ctr_inc(&c.drop_own_address);
	ctr_add(&c.drop_family, 2);
	cr_assert_eq(ctr_get(&c.drop[L3POLICY_DROP_family - L3POLICY_DROP_FIRST]), 2,
		     "named and indexed counters are the same");
	l3policy_counters_foreach(&c, collect, &s);
	cr_assert_eq(s.n, L3POLICY_N_DROPS);
	cr_assert_str_eq(s.seen[0], "drop_own_address");
	cr_assert_str_eq(s.seen[1], "drop_nat_address");
	cr_assert_str_eq(s.seen[2], "drop_from_nat_address");
	cr_assert_str_eq(s.seen[3], "drop_icmp");
	cr_assert_str_eq(s.seen[4], "drop_proto");
	cr_assert_str_eq(s.seen[5], "drop_family");
	cr_assert_str_eq(s.seen[6], "drop_loop");
	cr_assert_str_eq(s.seen[7], "drop_special_destination");
	cr_assert_eq(s.sum, 3);
}

/* /stats' drops.own_address is the three own-address reasons together. */
Test(l3policy, own_address_figure_sums_its_reasons)
{
	struct l3policy_counters c = { 0 };
	struct netstack_stats o;

	memset(&o, 0, sizeof(o));
	ctr_add(&c.drop_own_address, 1);
	ctr_add(&c.drop_nat_address, 20);
	ctr_add(&c.drop_from_nat_address, 300);
	netstack_policy_drops(&c, &o);
	cr_assert_eq(o.drops_own_address, 321);
}

/* The inline classifier (TCP and UDP in the header) and the out-of-line one agree on random
 * packets, half of them aimed at our own addresses and ports. */
Test(l3policy, inline_matches_out_of_line)
{
	static uint8_t buf[2048];
	struct tu_rng rng;
	struct l3policy p[2];
	struct l3policy_counters c1 = { 0 }, c2 = { 0 };
	struct l3policy_reply r1, r2;
	struct pkt_view v;
	int counted[L3POLICY_VERDICT_MAX] = { 0 };

	/* Two live sockets of "ours" (one TCP, one UDP) whose ports the generator also uses. */
	uint16_t own[2];
	int fds[2];
	uint8_t g4[16], g6[16];
	tu_addr(g4, "198.18.0.1");
	tu_addr(g6, "fd00:7f::1");
	cr_assert_eq(loopguard_new(g4, g6, &test_lg), 0);
	for (int k = 0; k < 2; k++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		fds[k] = socket(AF_INET, k ? SOCK_DGRAM : SOCK_STREAM, 0);
		cr_assert_eq(loopguard_bind(test_lg, fds[k], 4, k ? SOCK_DGRAM : SOCK_STREAM), 0);
		cr_assert_eq(getsockname(fds[k], (struct sockaddr *)&sa, &sl), 0);
		own[k] = ntohs(sa.sin_port);
	}
	policy(&p[0], true, true);
	policy(&p[1], true, false);
	tu_rng_seed(&rng, 0x13);
	for (int i = 0; i < 20000; i++) {
		struct tu_spec s;
		tu_rand_spec(&rng, &s, 0, 0, 32);
		size_t alen = s.family == 4 ? 4 : 16;
		uint8_t gw[16];
		tu_addr(gw, s.family == 4 ? "198.18.0.1" : "fd00:7f::1");
		if (tu_rand_chance(&rng, 2)) { /* to the gateway .. G+5 */
			memcpy(s.dst, gw, alen);
			s.dst[alen - 1] = (uint8_t)(s.dst[alen - 1] + tu_rand_below(&rng, 6));
		}
		else if (tu_rand_chance(&rng, 6)) { /* a special destination, or just beside one */
			static const char *const sp4[] = { "0.0.0.1", "127.0.0.1", "239.1.1.1",
							   "255.255.255.255", "255.255.255.254",
							   "126.1.1.1", "240.0.0.1" };
			static const char *const sp6[] = { "::", "::1", "::ffff:10.0.0.1",
							   "::10.0.0.1", "ff02::1", "::1:0:0:1",
							   "fe80::1" };
			tu_addr(s.dst, s.family == 4 ? sp4[tu_rand_below(&rng, 7)]
						     : sp6[tu_rand_below(&rng, 7)]);
		}
		if (tu_rand_chance(&rng, 3)) { /* from the gateway .. G+5 */
			memcpy(s.src, gw, alen);
			s.src[alen - 1] = (uint8_t)(s.src[alen - 1] + tu_rand_below(&rng, 6));
		}
		if (tu_rand_chance(&rng, 4))
			s.sport = lports[tu_rand_below(&rng, 2)];
		else if (tu_rand_chance(&rng, 4)) {
			s.sport = own[tu_rand_below(&rng, 2)];
			if (tu_rand_chance(&rng, 2)) /* from the gateway: a first SYN loops */
				memcpy(s.src, gw, alen);
		}
		if (tu_rand_chance(&rng, 4))
			s.dport = 53;
		if (tu_rand_chance(&rng, 4)) /* a first SYN */
			s.tcp_flags = TCP_SYN;
		if (tu_rand_chance(&rng, 8)) { /* another protocol, or the other family's ICMP */
			static const uint8_t other[] = { 47, 132, IPPROTO_ICMP, IPPROTO_ICMPV6 };
			s.proto = other[tu_rand_below(&rng, 4)];
			if (s.payload_len < 8)
				s.payload_len = 8;
		}
		size_t len = tu_build(&s, buf, sizeof(buf));
		if (pkt_parse(&v, buf, len) != PKT_OK)
			continue;
		const struct l3policy *pp = &p[i & 1];
		enum l3policy_verdict a = l3policy_classify(pp, &v, &r1, &c1);
		enum l3policy_verdict b = l3policy_classify_slow(pp, &v, &r2, &c2);
		cr_assert_eq(a, b, "packet %d: %s vs %s", i, l3policy_verdict_name(a),
			     l3policy_verdict_name(b));
		if (a == L3POLICY_TCP_REPLY)
			cr_assert(r1.nat_index == r2.nat_index && r1.listener == r2.listener);
		counted[a]++;
	}
	cr_assert_eq(memcmp(&c1, &c2, sizeof(c1)), 0, "same counters");
	close(fds[0]);
	close(fds[1]);
	loopguard_free(test_lg);
	test_lg = NULL;
	/* The generator reached every verdict but the unserved family (both are served). */
	for (int vd = 0; vd < L3POLICY_VERDICT_MAX; vd++)
		if (vd != L3POLICY_DROP_family)
			cr_expect_gt(counted[vd], 0, "verdict %s never seen",
				     l3policy_verdict_name((enum l3policy_verdict)vd));
}

/* A socket recorded in g: its local port (host order). */
static uint16_t own_socket(struct loopguard *g, int family, int type, int *fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	*fd = socket(family == 4 ? AF_INET : AF_INET6, type, 0);
	cr_assert_geq(*fd, 0);
	cr_assert_eq(loopguard_bind(g, *fd, family, type), 0);
	cr_assert_eq(getsockname(*fd, (struct sockaddr *)&ss, &sl), 0);
	return ntohs(family == 4 ? ((struct sockaddr_in *)&ss)->sin_port
				 : ((struct sockaddr_in6 *)&ss)->sin6_port);
}

static enum l3policy_verdict classify_one(const struct l3policy *p, int kind, const char *src,
					  uint16_t sport, const char *dst, uint16_t dport,
					  uint8_t flags, struct l3policy_counters *c)
{
	static uint8_t buf[256];
	struct tu_spec s;
	struct pkt_view v;
	struct l3policy_reply r;

	if (kind == K_TCP) {
		tu_spec_tcp(&s, src, sport, dst, dport);
		s.tcp_flags = flags;
	} else {
		tu_spec_udp(&s, src, sport, dst, dport);
		s.payload_len = 16;
	}
	size_t len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	enum l3policy_verdict a = l3policy_classify(p, &v, &r, c);
	struct l3policy_counters c2 = { 0 };
	cr_assert_eq(l3policy_classify_slow(p, &v, &r, &c2), a, "inline and out of line agree");
	return a;
}

/* The proxy's own socket's packets coming back through the TUN: the first SYN from gateway:own
 * port is a loop (one drop_loop each); anything else is not. */
Test(l3policy, loop_detection)
{
	struct l3policy p;
	struct l3policy_counters c = { 0 };
	int tfd, ufd, t6fd;
	const uint8_t SYN = TCP_SYN, SYNACK = TCP_SYN | TCP_ACK;

	uint8_t g4[16], g6[16];
	tu_addr(g4, "198.18.0.1");
	tu_addr(g6, "fd00:7f::1");
	cr_assert_eq(loopguard_new(g4, g6, &test_lg), 0);
	uint16_t tp = own_socket(test_lg, 4, SOCK_STREAM, &tfd);
	uint16_t up = own_socket(test_lg, 4, SOCK_DGRAM, &ufd);
	uint16_t t6p = own_socket(test_lg, 6, SOCK_STREAM, &t6fd);
	policy(&p, true, true);

	cr_assert_eq(classify_one(&p, K_TCP, "198.18.0.1", tp, "10.9.0.1", 443, SYN, &c),
		     L3POLICY_DROP_loop);
	cr_assert_eq(ctr_get(&c.drop_loop), 1);
	cr_assert_eq(classify_one(&p, K_TCP, "fd00:7f::1", t6p, "fd99::1", 443, SYN, &c),
		     L3POLICY_DROP_loop);
	cr_assert_eq(ctr_get(&c.drop_loop), 2);
	/* UDP is the UDP path's to check (once per would-be session, not per datagram). */
	cr_assert_eq(classify_one(&p, K_UDP, "198.18.0.1", up, "10.9.0.1", 443, 0, &c),
		     L3POLICY_UDP);
	cr_assert_eq(classify_one(&p, K_UDP, "198.18.0.1", up, "10.9.0.1", 53, 0, &c),
		     L3POLICY_DNS);
	/* Not ours: a later segment, another source address, the other protocol's table. */
	cr_assert_eq(classify_one(&p, K_TCP, "198.18.0.1", tp, "10.9.0.1", 443, SYNACK, &c),
		     L3POLICY_TCP);
	cr_assert_eq(classify_one(&p, K_TCP, "198.18.0.9", tp, "10.9.0.1", 443, SYN, &c),
		     L3POLICY_TCP);
	if (up != tp)
		cr_assert_eq(classify_one(&p, K_TCP, "198.18.0.1", up, "10.9.0.1", 443, SYN, &c),
			     L3POLICY_TCP);
	cr_assert_eq(ctr_get(&c.drop_loop), 2);
	/* Closed: the port may be anyone's now; the stale record is cleared on first sight. */
	close(tfd);
	cr_assert_eq(classify_one(&p, K_TCP, "198.18.0.1", tp, "10.9.0.1", 443, SYN, &c),
		     L3POLICY_TCP);
	cr_assert_eq(loopguard_entry(test_lg, 0, 0, tp), 0);
	cr_assert_eq(ctr_get(&c.drop_loop), 2);
	close(ufd);
	close(t6fd);
	loopguard_free(test_lg);
	test_lg = NULL;
}

/* One counter, counted once per packet, whatever the class and family. */
Test(l3policy, special_destinations_counted_once_each)
{
	static const char *const dsts[] = { "0.0.0.0", "127.0.0.1", "224.0.0.1",
					    "255.255.255.255", "::", "::1", "::ffff:127.0.0.1",
					    "::127.0.0.1", "ff02::1" };
	struct l3policy p;
	struct l3policy_counters c = { 0 };
	uint64_t n = 0;

	policy(&p, true, false);
	for (size_t i = 0; i < sizeof(dsts) / sizeof(dsts[0]); i++) {
		const char *src = strchr(dsts[i], ':') ? "fd00:7f::9" : "198.18.0.9";
		for (int k = 0; k < 2; k++) {
			cr_assert_eq(classify_one(&p, k ? K_UDP : K_TCP, src, 5000, dsts[i], 80,
						  TCP_SYN, &c), SPECIAL, "%s", dsts[i]);
			cr_assert_eq(ctr_get(&c.drop_special_destination), ++n, "%s", dsts[i]);
		}
	}
	for (int i = 0; i < L3POLICY_N_DROPS; i++)
		if (i != SPECIAL - L3POLICY_DROP_FIRST)
			cr_assert_eq(ctr_get(&c.drop[i]), 0, "only the one counter");
}

/* A refused SYN to a special destination is answered with an ICMP port unreachable, unless it
 * was sent to a multicast or broadcast address (discarded silently) or from a source that does
 * not name one host; a datagram never is. */
Test(l3policy, special_destination_answers)
{
	static const struct {
		const char *src, *dst;
		int kind;
		enum l3policy_answer want;
	} cases[] = {
		{ "198.18.0.9", "127.0.0.1", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "198.18.0.9", "127.1.2.3", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "198.18.0.9", "0.0.0.0", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "198.18.0.9", "0.1.2.3", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "10.99.0.9", "0.1.2.3", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "198.18.0.9", "224.0.0.1", K_SYN, L3POLICY_ANSWER_NONE },
		{ "198.18.0.9", "239.1.2.3", K_SYN, L3POLICY_ANSWER_NONE },
		{ "198.18.0.9", "255.255.255.255", K_SYN, L3POLICY_ANSWER_NONE },
		{ "198.18.0.9", "127.0.0.1", K_UDP, L3POLICY_ANSWER_NONE },
		{ "127.0.0.5", "127.0.0.1", K_SYN, L3POLICY_ANSWER_NONE },
		{ "0.0.0.0", "0.1.2.3", K_SYN, L3POLICY_ANSWER_NONE },
		{ "198.18.0.2", "0.1.2.3", K_SYN, L3POLICY_ANSWER_NONE },     /* a NAT address */
		{ "198.18.0.1", "0.1.2.3", K_SYN, L3POLICY_ANSWER_UNREACH },  /* the gateway */
		{ "224.0.0.9", "127.0.0.1", K_SYN, L3POLICY_ANSWER_NONE },
		{ "fd00:7f::9", "::1", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "fd00:7f::9", "::ffff:127.0.0.1", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "fd00:7f::9", "::", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "fd00:7f::9", "::1.2.3.4", K_SYN, L3POLICY_ANSWER_UNREACH },
		{ "fd00:7f::9", "ff02::1", K_SYN, L3POLICY_ANSWER_NONE },
		{ "fd00:7f::9", "::1", K_UDP, L3POLICY_ANSWER_NONE },
		{ "::", "::1", K_SYN, L3POLICY_ANSWER_NONE },
		{ "fd00:7f::2", "::1", K_SYN, L3POLICY_ANSWER_NONE },
		{ "::ffff:10.0.0.1", "::1", K_SYN, L3POLICY_ANSWER_NONE },
		{ "ff02::9", "::1", K_SYN, L3POLICY_ANSWER_NONE },
	};
	static uint8_t buf[256];
	struct l3policy p;
	struct l3policy_counters c = { 0 };
	struct l3policy_reply r;
	struct pkt_view v;

	policy(&p, true, false);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct row row = { cases[i].dst, cases[i].kind, cases[i].src, 5000,
					 cases[i].dst, 80, 0, 0, false, SPECIAL, { 0, 0 } };
		size_t len = build(&row, buf, sizeof(buf));
		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		cr_assert_eq(l3policy_classify(&p, &v, &r, &c), SPECIAL, "%s", cases[i].dst);
		cr_assert_eq(l3policy_answer(&p, &v, SPECIAL), cases[i].want, "%s -> %s kind %d",
			     cases[i].src, cases[i].dst, cases[i].kind);
	}
}

/* No answer to a segment that carries a RST (RFC 9293 section 3.10.7), a SYN|RST to a special
 * destination included; nor to a packet whose IPv4 header checksum fails. Both are still
 * refused and counted as special destinations. */
Test(l3policy, special_destination_rst_and_bad_header_get_no_answer)
{
	static uint8_t buf[256];
	static const char *const dsts[] = { "127.0.0.1", "::1" };
	struct l3policy p;
	struct l3policy_counters c = { 0 };
	struct l3policy_reply r;
	struct pkt_view v;

	policy(&p, true, false);
	for (size_t i = 0; i < 2; i++) {
		const char *src = i ? "fd00:7f::9" : "198.18.0.9";
		const struct row row = { dsts[i], K_SYN, src, 5000, dsts[i], 80, 0, 0, false,
					 SPECIAL, { 0, 0 } };
		size_t len = build(&row, buf, sizeof(buf)), l3 = i ? 40 : 20;

		buf[l3 + 13] |= TCP_RST; /* SYN|RST (the TCP checksum is not what is asked) */
		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		cr_assert_eq(l3policy_classify(&p, &v, &r, &c), SPECIAL, "%s", dsts[i]);
		cr_assert_eq(l3policy_answer(&p, &v, SPECIAL), L3POLICY_ANSWER_NONE,
			     "%s: SYN|RST answered", dsts[i]);
	}
	const struct row row = { "127.0.0.1", K_SYN, "198.18.0.9", 5000, "127.0.0.1", 80, 0, 0,
				 false, SPECIAL, { 0, 0 } };
	size_t len = build(&row, buf, sizeof(buf));
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	cr_assert_eq(l3policy_answer(&p, &v, SPECIAL), L3POLICY_ANSWER_UNREACH,
		     "the plain SYN is answered");
	buf[10] ^= 0x55; /* the IPv4 header checksum */
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	cr_assert_eq(l3policy_answer(&p, &v, SPECIAL), L3POLICY_ANSWER_NONE,
		     "a bad IPv4 header is not answered");
	cr_assert_eq(ctr_get(&c.drop_special_destination), 2);
}

/* The proxy's own SYN come back (DROP_loop) keeps its RST: its destination is an ordinary
 * address, which the kernel takes a segment from. No other verdict is answered. */
Test(l3policy, answer_by_verdict)
{
	static uint8_t buf[256];
	static const char *const dsts[] = { "10.9.0.1", "fd99::1" };
	struct l3policy p;
	struct pkt_view v;

	policy(&p, true, false);
	for (size_t i = 0; i < 2; i++) {
		const struct row row = { dsts[i], K_SYN, i ? "fd00:7f::1" : "198.18.0.1", 5000,
					 dsts[i], 443, 0, 0, false, L3POLICY_DROP_loop, { 0, 0 } };
		size_t len = build(&row, buf, sizeof(buf));

		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		cr_assert_eq(l3policy_answer(&p, &v, L3POLICY_DROP_loop), L3POLICY_ANSWER_RST, "%s",
			     dsts[i]);
		for (int vd = 0; vd < L3POLICY_VERDICT_MAX; vd++)
			if (vd != L3POLICY_DROP_loop && vd != SPECIAL)
				cr_assert_eq(l3policy_answer(&p, &v, (enum l3policy_verdict)vd),
					     L3POLICY_ANSWER_NONE, "%s",
					     l3policy_verdict_name((enum l3policy_verdict)vd));
		buf[(i ? 40 : 20) + 13] |= TCP_RST;
		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		cr_assert_eq(l3policy_answer(&p, &v, L3POLICY_DROP_loop), L3POLICY_ANSWER_NONE,
			     "%s: a RST is not answered", dsts[i]);
	}
}

/* The answer's source is the first NAT address, gateway + 1, in each family. */
Test(l3policy, answer_source_is_the_first_nat_address)
{
	struct l3policy p;
	uint8_t want[16];

	policy(&p, true, false);
	tu_addr(want, "198.18.0.2");
	cr_assert_arr_eq(l3policy_answer_src(&p, 4), want, 4);
	tu_addr(want, "fd00:7f::2");
	cr_assert_arr_eq(l3policy_answer_src(&p, 6), want, 16);
	cr_assert(l3policy_is_own(&p, 4, l3policy_answer_src(&p, 4)));
	cr_assert(l3policy_is_own(&p, 6, l3policy_answer_src(&p, 6)));
}

/* What a stack writes back for a SYN to each kind of special destination that gets an answer:
 * an ICMP (ICMPv6) port unreachable from the first NAT address to the SYN's source, every
 * checksum right (verified from scratch), quoting the SYN's IP and TCP headers; one that the
 * kernel hands to the TCP of the connection (tcp_v4_err / tcp_v6_err find it by the quoted
 * addresses, ports and sequence number). */
Test(l3policy, special_destination_answer_packet)
{
	static const char *const dsts[] = { "127.1.2.3", "0.1.2.3", "0.0.0.0", "::1", "::",
					    "::ffff:127.0.0.1", "::1.2.3.4" };
	uint8_t buf[REWRITE_ANSWER_ROOM], syn[128];
	struct l3policy p;
	struct l3policy_counters c = { 0 };
	struct l3policy_reply r;
	struct pkt_view v, a;
	struct tu_spec s;

	policy(&p, true, false);
	for (size_t i = 0; i < sizeof(dsts) / sizeof(dsts[0]); i++) {
		bool v6 = strchr(dsts[i], ':') != NULL;
		const char *src = v6 ? "fd00:7f::1" : "198.18.0.1";
		size_t l3 = v6 ? 40 : 20;

		tu_spec_tcp(&s, src, 40000 + (uint16_t)i, dsts[i], 80);
		s.tcp_flags = TCP_SYN;
		s.seq = 0x11223344u;
		s.ack = 0;
		s.mss = 1460;
		size_t len = tu_build(&s, buf, sizeof(buf));
		memcpy(syn, buf, len);
		cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
		cr_assert_eq(l3policy_classify(&p, &v, &r, &c), SPECIAL, "%s", dsts[i]);
		cr_assert_eq(l3policy_answer(&p, &v, SPECIAL), L3POLICY_ANSWER_UNREACH, "%s", dsts[i]);

		size_t n = rewrite_icmp_unreach(&v, l3policy_answer_src(&p, v.family));
		cr_assert_eq(n, l3 + 8 + len, "%s: the header, 8 bytes, the whole SYN (%zu)",
			     dsts[i], n);
		cr_assert_eq(pkt_parse(&a, buf, n), PKT_OK, "%s", dsts[i]);
		cr_assert_eq(a.len, n);
		cr_assert_eq(a.proto, v6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP, "%s", dsts[i]);
		cr_assert_arr_eq(pkt_src(&a), l3policy_answer_src(&p, a.family), v6 ? 16 : 4);
		cr_assert_arr_eq(pkt_dst(&a), syn + (v6 ? 8 : 12), v6 ? 16 : 4, "to the SYN's source");
		if (!v6)
			cr_assert(tu_verify_ip4_header(buf), "%s: IPv4 header checksum", dsts[i]);
		cr_assert(tu_verify_l4(buf, n), "%s: ICMP checksum", dsts[i]);
		cr_assert_eq(a.l4[0], v6 ? 1 : 3, "%s: destination unreachable", dsts[i]);
		cr_assert_eq(a.l4[1], v6 ? 4 : 3, "%s: port unreachable", dsts[i]);
		cr_assert_eq(tu_get32(a.l4 + 4), 0, "%s: unused word", dsts[i]);
		cr_assert_arr_eq(a.l4 + 8, syn, len, "%s: the SYN quoted", dsts[i]);
		cr_assert_eq(tu_get32(a.l4 + 8 + l3 + 4), 0x11223344u, "%s: its sequence number",
			     dsts[i]);
	}
}

/* The stacks' common figures carry these counters on their own (drops.special_destination,
 * drops.loop, drops.protocol). */
Test(l3policy, special_destination_in_stack_stats)
{
	struct l3policy_counters c = { 0 };
	struct netstack_stats o;

	memset(&o, 0, sizeof(o));
	ctr_add(&c.drop_special_destination, 5);
	ctr_add(&c.drop_loop, 2);
	ctr_add(&c.drop_proto, 3);
	netstack_policy_drops(&c, &o);
	cr_assert_eq(o.drops_special_destination, 5);
	cr_assert_eq(o.drops_loop, 2);
	cr_assert_eq(o.drops_protocol, 3);
	cr_assert_eq(o.drops_malformed + o.drops_own_address + o.drops_icmp, 0);
	/* A SYN from a special source cannot have come from a host: malformed. */
	ctr_add(&c.drop_special_source, 4);
	netstack_policy_drops(&c, &o);
	cr_assert_eq(o.drops_malformed, 4);
}
