/* test_special_dst.c — a routed client cannot reach the proxy host's own loopback, nor any
 * other special destination, through either stack: a real proxy (the library API) on a TUN
 * with both families, loopback listeners inside the namespace, and SYNs and datagrams injected
 * into the TUN with an AF_PACKET socket as a client behind the TUN would send them.
 *
 *   client (AF_PACKET on tsd0) ─► proxy ─► would connect from the proxy host to
 *       [::ffff:127.0.0.1]:7100   the IPv4 listener 127.0.0.1:7100 (dual-stack socket)
 *       [::1]:7100                the IPv6 listener [::1]:7100
 *       127.0.0.1:7100            the IPv4 listener again, over IPv4
 *
 * Each SYN must be answered with an ICMP port unreachable from the first NAT address (the app
 * fails at once), no listener may see a connection or a datagram, and
 * drops.special_destination grows by exactly one per packet.
 * Then packets no stack carries, each dropped under its own public key: GRE and SCTP
 * (drops.protocol, both stacks) and, on the system stack, a RST for a connection it has no
 * mapping for (drops.unmapped_rst; never answered).
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/pkt.h"
#include "testutil.h"
#include "twinstack.h"
#include "netns_child.h"

#define PORT 7100
#define TUN "tsd0"
#define NAT0_4 "198.18.0.2" /* the first NAT address: the source of the stacks' ICMP answers */
#define NAT0_6 "fd00:5d::2"

static const char cfg_fmt[] =
	"{\"stack\": \"%s\", \"log\": {\"level\": \"warn\"},"
	" \"tun\": {\"name\": \"" TUN "\", \"address\": \"198.18.0.1/15\","
	" \"address6\": \"fd00:5d::1/64\"},"
	" \"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\", \"routing_mark\": 1}]}";

static void sh(const char *cmd)
{
	int st = system(cmd);

	CHECK(st == 0, "'%s' exited %d", cmd, st);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A loopback listener (TCP) or bound socket (UDP) of family on PORT, non-blocking. */
static int loopback_socket(int family, int type)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1, fd = socket(family == 4 ? AF_INET : AF_INET6,
				  type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0, "socket: %s", strerror(errno));
	memset(&ss, 0, sizeof(ss));
	if (family == 4) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_port = htons(PORT);
		a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		sl = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons(PORT);
		a->sin6_addr = in6addr_loopback;
		sl = sizeof(*a);
		CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) == 0, "v6only");
	}
	CHECK(bind(fd, (struct sockaddr *)&ss, sl) == 0, "bind %d/%d: %s", family, type,
	      strerror(errno));
	if (type == SOCK_STREAM)
		CHECK(listen(fd, 16) == 0, "listen: %s", strerror(errno));
	return fd;
}

/* Did anything arrive on fd (a connection or a datagram) within ms? */
static bool reached(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1;
}

/* drops.<key> from the proxy's /stats document; -1 if it has none. */
static double drop_count(struct ts_proxy *p, const char *key)
{
	char *json = NULL;
	cJSON *doc, *drops, *v;
	double n;

	CHECK(ts_proxy_stats_json(p, &json, NULL) == 0, "stats");
	doc = cJSON_Parse(json);
	ts_free(json);
	CHECK(doc != NULL, "stats JSON");
	drops = cJSON_GetObjectItem(doc, "drops");
	v = drops ? cJSON_GetObjectItem(drops, key) : NULL;
	n = cJSON_IsNumber(v) ? v->valuedouble : -1;
	cJSON_Delete(doc);
	return n;
}

static double special_drops(struct ts_proxy *p)
{
	return drop_count(p, "special_destination");
}

struct inject {
	int fd, ifindex;
};

static void inject_open(struct inject *in)
{
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL) };

	in->ifindex = (int)if_nametoindex(TUN);
	CHECK(in->ifindex > 0, "no %s", TUN);
	in->fd = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_ALL));
	CHECK(in->fd >= 0, "AF_PACKET: %s", strerror(errno));
	sll.sll_ifindex = in->ifindex;
	CHECK(bind(in->fd, (struct sockaddr *)&sll, sizeof(sll)) == 0, "bind: %s",
	      strerror(errno));
}

/* Hand pkt to the TUN's transmit side: the proxy reads it as a client's packet. */
static void inject_send(struct inject *in, const uint8_t *pkt, size_t len)
{
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_ifindex = in->ifindex };

	sll.sll_protocol = htons((pkt[0] >> 4) == 4 ? ETH_P_IP : ETH_P_IPV6);
	CHECK(sendto(in->fd, pkt, len, 0, (struct sockaddr *)&sll, sizeof(sll)) == (ssize_t)len,
	      "inject: %s", strerror(errno));
}

/* answer_to's value for an ICMP (ICMPv6) port unreachable quoting the packet (above any set of
 * TCP flags). */
#define PORT_UNREACH 0x100

/* Does the ICMP message at icmp (family's, len bytes) quote s, a TCP segment? */
static bool quotes(const uint8_t *icmp, size_t len, const struct tu_spec *s)
{
	const uint8_t *in = icmp + 8;
	size_t alen = s->family == 4 ? 4 : 16, hl;

	if (len < 8 + (s->family == 4 ? 20 : 40) + 8)
		return false;
	hl = s->family == 4 ? (size_t)(in[0] & 15) * 4 : 40;
	if (len < 8 + hl + 8)
		return false;
	return memcmp(in + (s->family == 4 ? PKT_V4_SRC : PKT_V6_SRC), s->src, alen) == 0 &&
	       tu_get16(in + hl) == s->sport && tu_get32(in + hl + 4) == s->seq;
}

/* The next answer the proxy writes into the TUN to s (its sender's address and port), within
 * ms: a TCP segment's flags (its sequence number in *seq), or PORT_UNREACH for an ICMP port
 * unreachable quoting s; its source address in from (16 bytes); -1 on timeout. */
static int answer_to(struct inject *in, const struct tu_spec *s, int ms, uint32_t *seq,
		     uint8_t *from)
{
	uint8_t buf[2048];
	int64_t end = now_ms() + ms;
	size_t alen = s->family == 4 ? 4 : 16;

	for (;;) {
		struct sockaddr_ll sll;
		socklen_t fl = sizeof(sll);
		struct pollfd p = { .fd = in->fd, .events = POLLIN };
		int left = (int)(end - now_ms());
		struct pkt_view v;

		if (left <= 0 || poll(&p, 1, left) != 1)
			return -1;
		ssize_t n = recvfrom(in->fd, buf, sizeof(buf), 0, (struct sockaddr *)&sll, &fl);
		/* Outgoing: the kernel's own packets into the TUN, not the proxy's. */
		if (n <= 0 || sll.sll_pkttype == PACKET_OUTGOING)
			continue;
		if (pkt_parse(&v, buf, (size_t)n) != PKT_OK || v.family != s->family ||
		    memcmp(pkt_dst(&v), s->src, alen) != 0)
			continue;
		memset(from, 0, 16);
		memcpy(from, pkt_src(&v), alen);
		if (v.proto == IPPROTO_TCP && v.dport_be == htons(s->sport)) {
			*seq = tu_get32(v.l4 + 4);
			return v.tcp_flags;
		}
		bool unreach = s->family == 4 ? v.proto == IPPROTO_ICMP && v.l4[0] == 3 && v.l4[1] == 3
					      : v.proto == IPPROTO_ICMPV6 && v.l4[0] == 1 &&
						v.l4[1] == 4;
		if (unreach && quotes(v.l4, v.l4_len, s))
			return PORT_UNREACH;
	}
}

/* A SYN from a routed client to dst:PORT: refused with an ICMP port unreachable from the first
 * NAT address (a RST would come from dst itself, a source the kernel may refuse), counted
 * once, and no loopback listener sees a connection. Before the policy refused these, the proxy
 * answered with a SYN-ACK and, once the handshake completed, connected the client to the
 * host's loopback. */
static void syn_refused(struct ts_proxy *p, struct inject *in, const char *src, uint16_t sport,
			const char *dst, const int lfd[2])
{
	uint8_t pkt[256], from[16], nat0[16];
	struct tu_spec s;
	uint32_t seq = 0;
	double before = special_drops(p);

	tu_spec_tcp(&s, src, sport, dst, PORT);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	s.ack = 0;
	s.mss = 1400;
	inject_send(in, pkt, tu_build(&s, pkt, sizeof(pkt)));
	int flags = answer_to(in, &s, 2000, &seq, from);
	if (flags == (TCP_SYN | TCP_ACK)) {
		/* Complete the handshake to show what the SYN-ACK meant. */
		s.tcp_flags = TCP_ACK;
		s.seq = 1001;
		s.ack = seq + 1;
		s.mss = 0;
		inject_send(in, pkt, tu_build(&s, pkt, sizeof(pkt)));
		bool got = reached(lfd[0], 1000) || reached(lfd[1], 200);
		CHECK(false, "%s: SYN-ACK from the proxy%s", dst,
		      got ? ", and a loopback listener of the proxy host accepted the connection"
			  : "");
	}
	CHECK(flags >= 0, "%s: no answer to the SYN", dst);
	CHECK(flags == PORT_UNREACH, "%s: answered with TCP flags 0x%x, want port unreachable",
	      dst, flags);
	tu_addr(nat0, s.family == 4 ? NAT0_4 : NAT0_6);
	CHECK(memcmp(from, nat0, s.family == 4 ? 4 : 16) == 0, "%s: not from the NAT address %s",
	      dst, s.family == 4 ? NAT0_4 : NAT0_6);
	CHECK(!reached(lfd[0], 200) && !reached(lfd[1], 0), "%s: a loopback listener got a "
	      "connection", dst);
	double after = special_drops(p);
	CHECK(before >= 0 && after == before + 1,
	      "%s: drops.special_destination %.0f -> %.0f, want +1", dst, before, after);
}

/* A datagram from a routed client to dst:PORT: dropped and counted once, never sent. */
static void datagram_dropped(struct ts_proxy *p, struct inject *in, const char *src,
			     uint16_t sport, const char *dst, const int ufd[2])
{
	uint8_t pkt[256];
	struct tu_spec s;
	double before = special_drops(p);

	tu_spec_udp(&s, src, sport, dst, PORT);
	s.payload_len = 32;
	inject_send(in, pkt, tu_build(&s, pkt, sizeof(pkt)));
	bool got = reached(ufd[0], 500) || reached(ufd[1], 200);
	CHECK(!got, "%s: the datagram reached a loopback socket of the proxy host", dst);
	double after = special_drops(p);
	CHECK(before >= 0 && after == before + 1,
	      "%s: drops.special_destination %.0f -> %.0f, want +1", dst, before, after);
}

/* A packet to a routed destination that the stack drops without an answer: drops.<key>
 * grows by exactly one (waited for up to 5 s: a loaded machine), and nothing comes back to
 * the sender. */
static void dropped_as(struct ts_proxy *p, struct inject *in, struct tu_spec *s,
		       const char *key)
{
	uint8_t pkt[256], from[16];
	uint32_t seq;
	double before = drop_count(p, key), after = before;
	int64_t end = now_ms() + 5000;

	inject_send(in, pkt, tu_build(s, pkt, sizeof(pkt)));
	while (after == before && now_ms() < end) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };

		nanosleep(&ts, NULL);
		after = drop_count(p, key);
	}
	CHECK(before >= 0 && after == before + 1, "drops.%s %.0f -> %.0f, want +1", key, before,
	      after);
	if (s->proto == IPPROTO_TCP)
		CHECK(answer_to(in, s, 300, &seq, from) < 0, "drops.%s: the packet was answered",
		      key);
}

static const char *stack_name;

static void scenario(void)
{
	char cfg[1024], err[512] = "";
	struct ts_proxy *p = NULL;
	struct inject in;
	int lfd[2], ufd[2];

	sh("ip link set lo up");
	lfd[0] = loopback_socket(4, SOCK_STREAM);
	lfd[1] = loopback_socket(6, SOCK_STREAM);
	ufd[0] = loopback_socket(4, SOCK_DGRAM);
	ufd[1] = loopback_socket(6, SOCK_DGRAM);
	snprintf(cfg, sizeof(cfg), cfg_fmt, stack_name);
	CHECK(ts_proxy_new_json(cfg, strlen(cfg), &p, err, sizeof(err)) == 0, "new: %s", err);
	CHECK(ts_proxy_start(p, err, sizeof(err)) == 0, "start: %s", err);
	inject_open(&in);

	syn_refused(p, &in, "fd00:5e::9", 40001, "::ffff:127.0.0.1", lfd);
	syn_refused(p, &in, "fd00:5e::9", 40002, "::1", lfd);
	syn_refused(p, &in, "10.99.0.9", 40003, "127.0.0.1", lfd);
	datagram_dropped(p, &in, "fd00:5e::9", 40004, "::ffff:127.0.0.1", ufd);
	datagram_dropped(p, &in, "fd00:5e::9", 40005, "::1", ufd);
	datagram_dropped(p, &in, "10.99.0.9", 40006, "127.0.0.1", ufd);

	struct tu_spec s;
	tu_spec_raw(&s, "10.99.0.9", "10.99.7.1", 47); /* GRE, to a routed address */
	s.payload_len = 20;
	dropped_as(p, &in, &s, "protocol");
	tu_spec_raw(&s, "fd00:5e::9", "fd00:5e:7::1", 132); /* SCTP */
	s.payload_len = 20;
	dropped_as(p, &in, &s, "protocol");
	if (strcmp(stack_name, "system") == 0) {
		tu_spec_tcp(&s, "10.99.0.9", 40007, "10.99.7.1", PORT);
		s.tcp_flags = TCP_RST | TCP_ACK;
		s.seq = 5000;
		s.ack = 7000;
		dropped_as(p, &in, &s, "unmapped_rst");
	}

	close(in.fd);
	ts_proxy_free(p);
	for (int i = 0; i < 2; i++) {
		close(lfd[i]);
		close(ufd[i]);
	}
}

Test(special_dst, system_stack, .timeout = 60)
{
	stack_name = "system";
	run_in_netns(scenario);
}

Test(special_dst, lwip_stack, .timeout = 60)
{
	stack_name = "lwip";
	run_in_netns(scenario);
}
