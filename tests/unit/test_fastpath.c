/* test_fastpath.c — stacks/system/fastpath: the in-kernel NAT of established connections.
 *
 * The loaded program (fastpath_prog_fd) runs on packets of our own through BPF_PROG_TEST_RUN,
 * its context naming a TUN device of the scenario's own network namespace (a forked child:
 * tests/unit/netns_child.h). The kernel builds the skb from the input as from an Ethernet frame
 * (eth_type_trans takes bytes 12-13 as the ethertype, which gives skb->protocol) and, for a tc
 * program, pushes a hard header back before the run. Kernels push a fixed 14 bytes, whatever
 * the device: the program then sees the input from its first byte, and so does the output. The
 * input is therefore the IP packet itself, with bytes 12-13 that read as its ethertype: the
 * first two bytes of an IPv4 source address (8.0.x.x reads as 0x0800), bytes 4-5 of an IPv6
 * source (xxxx:xxxx:86dd:...). Every segment here has such a source. A kernel that pushes the
 * device's own hard header (none on a TUN) gets a 14-byte Ethernet header in front instead:
 * which of the two is probed once, with a program that returns the length it sees.
 *
 * What is asserted is bytes: a mapped segment leaves with the mapped addresses and ports, both
 * checksums right when recomputed from scratch, everything else as it came; random segments
 * leave exactly as the userspace rewrite (stacks/common/rewrite.h) leaves them; whatever the
 * program must not touch comes out as it went in. Then the map's room, the counters, the
 * loader's argument checks, and what attaching and freeing do to the TUN's qdiscs and filters.
 * Last, the filter attached to a TUN, with segments sent into the TUN's egress: those a test
 * run cannot give it, with the TCP checksum left to the device (CHECKSUM_PARTIAL, what the
 * kernel's TCP sends on a TUN with offload), and the redirect to the TUN's ingress itself.
 *
 * Without root, or where tc programs or BPF_PROG_TEST_RUN on a device are not available at all
 * (probed with a trivial program), the tests skip; where they are, our program must load.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/if_tun.h>
#include <linux/pkt_cls.h>
#include <linux/virtio_net.h>

#include "core/csum.h"
#include "core/pkt.h"
#include "stacks/common/rewrite.h"
#include "stacks/system/fastpath.h"
#include "failalloc.h"
#include "netns_child.h"
#include "testutil.h"

#define TUN_NAME "fpt0"
#define ETH_LEN 14
/* Every run's packet carries this mark; a redirected one must leave without it (a packet the
 * userspace path writes has none), a passed one keeps it. */
#define IN_MARK 0x5eed
static uint32_t mark_out;
#define PASS ((uint32_t)TC_ACT_UNSPEC) /* the verdict of a packet the program leaves alone */

/* ---- the environment of a scenario (child side) ---- */

struct env {
	int tun_fd;
	int ifindex;
	struct fastpath *fp;
	int prog;
};

/* How BPF_PROG_TEST_RUN hands a tc program its input (probe_kernel). */
enum frame_mode {
	FRAME_IS_PACKET, /* the program sees the input from byte 0 */
	FRAME_ETH_HEADER /* the program sees the input after a 14-byte Ethernet header */
};
static enum frame_mode frame_mode;

/* Frames in and packets out of BPF_PROG_TEST_RUN (static: a 64 KiB packet each). */
static uint8_t frame[ETH_LEN + TU_PKT_MAX];
static uint8_t out[TU_PKT_MAX], want[TU_PKT_MAX], pkt[TU_PKT_MAX];

static int tun_create(const char *name)
{
	struct ifreq ifr;
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);

	CHECK(fd >= 0, "/dev/net/tun: %s", strerror(errno));
	memset(&ifr, 0, sizeof(ifr));
	ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	CHECK(ioctl(fd, TUNSETIFF, &ifr) == 0, "TUNSETIFF %s: %s", name, strerror(errno));
	return fd;
}

/* Skip (not fail) where the kernel takes no tc program or cannot test-run one on a device,
 * and find how the input reaches the program: a program that returns skb->len, run on a
 * 60-byte input. */
static void probe_kernel(int ifindex)
{
	struct bpf_insn insns[] = {
		{ .code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_0, .src_reg = BPF_REG_1,
		  .off = offsetof(struct __sk_buff, len) },
		{ .code = BPF_JMP | BPF_EXIT },
	};
	struct __sk_buff ctx = { .ifindex = (uint32_t)ifindex };
	uint8_t f[60] = { [0] = 0x45, [12] = 0x08 };
	int fd = bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, "ts_probe", "GPL", insns, 2, NULL);

	if (fd < 0)
		child_report(SKIP_STATUS, "no tc BPF programs here (load: %s)", strerror(errno));
	LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = f, .data_size_in = sizeof(f),
		    .ctx_in = &ctx, .ctx_size_in = sizeof(ctx), .repeat = 1);
	if (bpf_prog_test_run_opts(fd, &o) != 0) {
		int e = errno;
		close(fd);
		child_report(SKIP_STATUS, "BPF_PROG_TEST_RUN on a device unavailable: %s",
			     strerror(e));
	}
	close(fd);
	CHECK(o.retval == sizeof(f) || o.retval == sizeof(f) - ETH_LEN,
	      "a tc program run on %zu bytes sees %u", sizeof(f), o.retval);
	frame_mode = o.retval == sizeof(f) ? FRAME_IS_PACKET : FRAME_ETH_HEADER;
}

static void env_up_udp(struct env *e, uint32_t max_conns, uint32_t max_udp)
{
	char err[256] = "";
	int ret;

	e->tun_fd = tun_create(TUN_NAME);
	e->ifindex = (int)if_nametoindex(TUN_NAME);
	CHECK(e->ifindex > 0, "if_nametoindex: %s", strerror(errno));
	probe_kernel(e->ifindex);
	ret = fastpath_open(max_conns, max_udp, &e->fp, err, sizeof(err));
	CHECK(ret == 0 && e->fp, "fastpath_open = %d: %s", ret, err);
	e->prog = fastpath_prog_fd(e->fp);
	CHECK(e->prog >= 0, "prog fd %d", e->prog);
}

static void env_up(struct env *e, uint32_t max_conns)
{
	env_up_udp(e, max_conns, 0);
}

static void env_down(struct env *e)
{
	fastpath_free(e->fp);
	close(e->tun_fd);
}

/* Run the program on pkt[0..len) as a packet of the given ethertype (its bytes 12-13 must
 * read as that: see the top of the file); the context names the TUN (gso_segs, gso_size as
 * given). The
 * output goes to out, its length to *olen; returns the program's verdict. */
static uint32_t run_gso(const struct env *e, const uint8_t *p, size_t len, uint16_t ethertype,
			uint32_t gso_segs, uint32_t gso_size, size_t *olen)
{
	struct __sk_buff ctx = { .ifindex = (uint32_t)e->ifindex, .gso_segs = gso_segs,
				 .gso_size = gso_size, .mark = IN_MARK };
	struct __sk_buff ctx_out = { 0 };
	size_t flen = len;
	int ret;

	if (frame_mode == FRAME_IS_PACKET) {
		CHECK(len >= ETH_LEN && tu_get16(p + 12) == ethertype,
		      "packet bytes 12-13 do not read as ethertype %#x", ethertype);
		memcpy(frame, p, len);
	} else {
		memset(frame, 0, ETH_LEN);
		tu_put16(frame + 12, ethertype);
		memcpy(frame + ETH_LEN, p, len);
		flen += ETH_LEN;
	}
	memset(out, 0xa5, sizeof(out));
	LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = frame, .data_size_in = (uint32_t)flen,
		    .data_out = out, .data_size_out = sizeof(out), .ctx_in = &ctx,
		    .ctx_size_in = sizeof(ctx), .ctx_out = &ctx_out,
		    .ctx_size_out = sizeof(ctx_out), .repeat = 1);
	ret = bpf_prog_test_run_opts(e->prog, &o);
	CHECK(ret == 0, "BPF_PROG_TEST_RUN (%zu bytes): %s", len, strerror(errno));
	*olen = o.data_size_out;
	mark_out = ctx_out.mark;
	return o.retval;
}

/* The same, a GSO packet's segments (if any) 1000 bytes each. */
static uint32_t run_eth(const struct env *e, const uint8_t *p, size_t len, uint16_t ethertype,
			uint32_t gso_segs, size_t *olen)
{
	return run_gso(e, p, len, ethertype, gso_segs, gso_segs ? 1000 : 0, olen);
}

/* The same, the ethertype from the IP version. */
static uint32_t run(const struct env *e, const uint8_t *p, size_t len, size_t *olen)
{
	return run_eth(e, p, len, len && p[0] >> 4 == 6 ? ETH_P_IPV6 : ETH_P_IP, 0, olen);
}

/* A connection as fastpath_add takes it (ports in host order). */
struct conn {
	struct flow_key app; /* the app's side: app -> server, as the TUN sees it */
	uint8_t nat[16], gw[16];
	uint16_t nat_port, lport;
};

static void conn_text(struct conn *c, const char *app, uint16_t sport, const char *srv,
		      uint16_t dport, const char *nat, uint16_t nat_port, const char *gw,
		      uint16_t lport)
{
	memset(c, 0, sizeof(*c));
	c->app.family = (uint8_t)tu_addr(c->app.src, app);
	CHECK(tu_addr(c->app.dst, srv) == c->app.family, "%s", srv);
	CHECK(tu_addr(c->nat, nat) == c->app.family, "%s", nat);
	CHECK(tu_addr(c->gw, gw) == c->app.family, "%s", gw);
	c->app.proto = IPPROTO_TCP;
	c->app.sport_be = htons(sport);
	c->app.dport_be = htons(dport);
	c->nat_port = nat_port;
	c->lport = lport;
}

static int conn_add(const struct env *e, const struct conn *c)
{
	return fastpath_add(e->fp, &c->app, c->nat, htons(c->nat_port), c->gw, htons(c->lport));
}

static void conn_add_ok(const struct env *e, const struct conn *c)
{
	int ret = conn_add(e, c);

	CHECK(ret == 0, "fastpath_add = %d (%s)", ret, strerror(-ret));
}

static void conn_del(const struct env *e, const struct conn *c)
{
	fastpath_del(e->fp, &c->app, c->nat, htons(c->nat_port), c->gw, htons(c->lport));
}

/* TCP specs of a connection's two directions: the segment as the TUN sees it (in) and as it
 * must leave the rewrite (to). ACK|PSH, and the rest of the header and the payload the same
 * on both sides. */
static void spec_set(struct tu_spec *s, uint8_t family, const uint8_t *src, uint16_t sport,
		     const uint8_t *dst, uint16_t dport)
{
	memcpy(s->src, src, 16);
	memcpy(s->dst, dst, 16);
	s->family = family;
	s->sport = sport;
	s->dport = dport;
}

static void spec_base(struct tu_spec *s, uint8_t family, size_t payload_len, uint64_t seed)
{
	/* Addresses and ports are the caller's (spec_set). */
	tu_spec_tcp(s, family == 4 ? "1.2.3.4" : "2001:db8::1", 1,
		    family == 4 ? "5.6.7.8" : "2001:db8::2", 2);
	s->tcp_flags = TCP_ACK | TCP_PSH;
	s->seq = 0x11223344;
	s->ack = 0x55667788;
	s->window = 501;
	s->ttl = 63;
	s->tos = 0x28;
	s->ip_id = 0x1234;
	s->ip4_frag = 0x4000; /* DF */
	s->payload_len = payload_len;
	s->payload_seed = seed;
}

static void spec_up(struct tu_spec *in, struct tu_spec *to, const struct conn *c)
{
	const struct flow_key *k = &c->app;

	spec_set(in, k->family, k->src, ntohs(k->sport_be), k->dst, ntohs(k->dport_be));
	spec_set(to, k->family, c->nat, c->nat_port, c->gw, c->lport);
}

static void spec_down(struct tu_spec *in, struct tu_spec *to, const struct conn *c)
{
	const struct flow_key *k = &c->app;

	spec_set(in, k->family, c->gw, c->lport, c->nat, c->nat_port);
	spec_set(to, k->family, k->dst, ntohs(k->dport_be), k->src, ntohs(k->sport_be));
}

/* The segment `in` goes through rewritten into exactly the segment `to` (built from scratch:
 * both checksums computed anew, the rest of the header and the payload as in `in`). */
static void expect_rewrite(const struct env *e, const struct tu_spec *in, const struct tu_spec *to,
			   const char *what)
{
	size_t len = tu_build(in, pkt, sizeof(pkt)), wlen = tu_build(to, want, sizeof(want)), olen;
	uint32_t rv = run(e, pkt, len, &olen);
	size_t l3 = in->family == 4 ? 20 : 40, l4h = (size_t)(pkt[l3 + 12] >> 4) * 4;

	CHECK(rv == TC_ACT_REDIRECT, "%s: verdict %u, not TC_ACT_REDIRECT", what, rv);
	CHECK(mark_out == 0, "%s: redirected with mark %#x", what, mark_out);
	CHECK(olen == len && wlen == len, "%s: %zu bytes out of %zu", what, olen, len);
	CHECK(tu_verify_l4(out, olen), "%s: TCP checksum does not verify", what);
	if (in->family == 4)
		CHECK(tu_verify_ip4_header(out), "%s: IPv4 header checksum does not verify", what);
	CHECK(memcmp(out + l3 + l4h, pkt + l3 + l4h, len - l3 - l4h) == 0, "%s: payload changed",
	      what);
	if (memcmp(out, want, len) != 0) {
		tu_dump("in", pkt, len < 80 ? len : 80);
		tu_dump("out", out, olen < 80 ? olen : 80);
		tu_dump("want", want, len < 80 ? len : 80);
		CHECK(0, "%s: output differs from the segment built with the mapped tuple", what);
	}
}

/* p goes through untouched: TC_ACT_UNSPEC (on to the next filter), the same bytes out. */
static void expect_pass_eth(const struct env *e, const uint8_t *p, size_t len, uint16_t ethertype,
			    const char *what)
{
	size_t olen;
	uint32_t rv = run_eth(e, p, len, ethertype, 0, &olen);

	CHECK(rv == PASS, "%s: verdict %u, not TC_ACT_UNSPEC", what, rv);
	CHECK(mark_out == IN_MARK, "%s: passed with mark %#x", what, mark_out);
	CHECK(olen == len, "%s: %zu bytes out of %zu", what, olen, len);
	CHECK(memcmp(out, p, len) == 0, "%s: bytes changed", what);
}

static void expect_pass(const struct env *e, const uint8_t *p, size_t len, const char *what)
{
	expect_pass_eth(e, p, len, len && p[0] >> 4 == 6 ? ETH_P_IPV6 : ETH_P_IP, what);
}

/* Map, besides the real tuple, the one a program that skipped a check would read: addresses
 * from the IP header, ports at the end of a plain IP header (20 or 40 bytes). The segment then
 * passes only because of the check under test. */
static void map_naive(const struct env *e, const uint8_t *p, struct conn *c)
{
	int fam = p[0] >> 4;

	memset(c, 0, sizeof(*c));
	c->app.family = (uint8_t)fam;
	c->app.proto = IPPROTO_TCP;
	memcpy(c->app.src, p + (fam == 4 ? 12 : 8), fam == 4 ? 4 : 16);
	memcpy(c->app.dst, p + (fam == 4 ? 16 : 24), fam == 4 ? 4 : 16);
	memcpy(&c->app.sport_be, p + (fam == 4 ? 20 : 40), 2);
	memcpy(&c->app.dport_be, p + (fam == 4 ? 22 : 42), 2);
	tu_addr(c->nat, fam == 4 ? "198.18.9.9" : "fd00:9::9");
	tu_addr(c->gw, fam == 4 ? "198.18.0.1" : "fd00::1");
	c->nat_port = 999;
	c->lport = 7890;
	conn_add_ok(e, c);
}

/* The connections of the fixed cases. The sources the TUN sees (the app's address uplink,
 * the gateway downlink) read as the family's ethertype at bytes 12-13. */
static void conn_v4(struct conn *c)
{
	conn_text(c, "8.0.0.2", 40000, "93.184.216.34", 443, "198.18.0.7", 51000, "8.0.0.1", 7890);
}

static void conn_v6(struct conn *c)
{
	conn_text(c, "fd00:0:86dd::2", 40000, "2606:2800:220:1:248:1893:25c8:1946",
		  443, "fd00:0:0:1::7", 51000, "fd00:0:86dd::1", 7890);
}

static void totals(const struct env *e, struct fastpath_totals *t)
{
	fastpath_totals(e->fp, t);
}

/* ---- 1, 2: a mapped connection's segments, both directions ---- */

static void check_mapped(void (*make)(struct conn *))
{
	struct env e;
	struct conn c;
	struct tu_spec in, to;
	static const size_t lens[] = { 0, 1, 7, 512, 1400 };

	env_up(&e, 16);
	make(&c);
	conn_add_ok(&e, &c);
	CHECK(fastpath_conns(e.fp) == 1, "conns %llu", (unsigned long long)fastpath_conns(e.fp));
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		spec_base(&in, c.app.family, lens[i], 100 + i);
		to = in;
		spec_up(&in, &to, &c);
		expect_rewrite(&e, &in, &to, "uplink");
		spec_base(&in, c.app.family, lens[i], 200 + i);
		in.mss = 1400; /* options move the payload and enter the checksum */
		to = in;
		spec_down(&in, &to, &c);
		expect_rewrite(&e, &in, &to, "downlink");
	}
	env_down(&e);
}

static void scenario_v4_mapped(void)
{
	check_mapped(conn_v4);
}

static void scenario_v6_mapped(void)
{
	check_mapped(conn_v6);
}

Test(fastpath, v4_mapped_segments_rewritten)
{
	run_in_netns(scenario_v4_mapped);
}

Test(fastpath, v6_mapped_segments_rewritten)
{
	run_in_netns(scenario_v6_mapped);
}

/* ---- 3: random segments, the kernel against the userspace rewrite ---- */

#define DIFF_SEGMENTS 2000

static void rand_addr(struct tu_rng *r, uint8_t *a, int family)
{
	memset(a, 0, 16);
	tu_rand_bytes(r, a, family == 4 ? 4 : 16);
}

/* A TCP checksum is a one's complement sum with two zeros: the kernel's update writes the one
 * a computation from scratch gives (0x0000), the userspace rewrite the other (0xFFFF, which
 * UDP needs). Both verify. Is the only difference between a and b that one? */
static bool only_zero_csum_differs(const uint8_t *a, const uint8_t *b, size_t len, size_t csum_at)
{
	return memcmp(a, b, csum_at) == 0 && memcmp(a + csum_at + 2, b + csum_at + 2,
						       len - csum_at - 2) == 0 &&
	       csum_load16(a + csum_at) == 0 && csum_load16(b + csum_at) == 0xffff;
}

static void scenario_differential(void)
{
	struct env e;
	struct tu_rng r;
	struct conn *conns = calloc(DIFF_SEGMENTS, sizeof(*conns));

	CHECK(conns != NULL, "calloc");
	env_up(&e, DIFF_SEGMENTS);
	tu_rng_seed(&r, 0x66617374);
	for (unsigned i = 0; i < DIFF_SEGMENTS; i++) {
		struct conn *c = &conns[i];
		int family = i & 1 ? 6 : 4;
		bool up = (i >> 1) & 1;
		struct tu_spec s;
		struct pkt_view v;
		uint8_t ns[16], nd[16];
		uint16_t nsp, ndp;
		size_t len, olen;
		uint32_t rv;

		c->app.family = (uint8_t)family;
		c->app.proto = IPPROTO_TCP;
		rand_addr(&r, c->app.src, family);
		rand_addr(&r, c->app.dst, family);
		rand_addr(&r, c->nat, family);
		rand_addr(&r, c->gw, family);
		c->app.sport_be = (uint16_t)tu_rand32(&r);
		c->app.dport_be = (uint16_t)tu_rand32(&r);
		c->nat_port = (uint16_t)tu_rand32(&r);
		c->lport = (uint16_t)tu_rand32(&r);
		/* The sources the TUN sees read as the ethertype (the top of the file). */
		tu_put16(c->app.src + (family == 4 ? 0 : 4), family == 4 ? ETH_P_IP : ETH_P_IPV6);
		tu_put16(c->gw + (family == 4 ? 0 : 4), family == 4 ? ETH_P_IP : ETH_P_IPV6);
		conn_add_ok(&e, c);

		/* Random header fields, TCP options and payload; no SYN, no IPv4 options or IPv6
		 * extension headers, no fragment: what the program rewrites. */
		tu_rand_spec(&r, &s, family, IPPROTO_TCP, 1400);
		s.tcp_flags &= (uint8_t)~TCP_SYN;
		s.ip4_opts_len = 0;
		s.ext_n = 0;
		if (up) {
			spec_set(&s, (uint8_t)family, c->app.src, ntohs(c->app.sport_be),
				 c->app.dst, ntohs(c->app.dport_be));
			memcpy(ns, c->nat, 16);
			memcpy(nd, c->gw, 16);
			nsp = htons(c->nat_port);
			ndp = htons(c->lport);
		} else {
			spec_set(&s, (uint8_t)family, c->gw, c->lport, c->nat, c->nat_port);
			memcpy(ns, c->app.dst, 16);
			memcpy(nd, c->app.src, 16);
			nsp = c->app.dport_be;
			ndp = c->app.sport_be;
		}
		len = tu_build(&s, pkt, sizeof(pkt));
		memcpy(want, pkt, len);
		CHECK(pkt_parse(&v, want, len) == PKT_OK, "segment %u does not parse", i);
		rewrite_l4(&v, ns, nsp, nd, ndp, false);

		rv = run(&e, pkt, len, &olen);
		CHECK(rv == TC_ACT_REDIRECT,
		      "segment %u (v%d, %s, %zu bytes, flags %#x): verdict %u", i, family,
		      up ? "up" : "down", len, s.tcp_flags, rv);
		CHECK(olen == len, "segment %u: %zu bytes out of %zu", i, olen, len);
		CHECK(tu_verify_l4(out, olen), "segment %u: TCP checksum does not verify", i);
		if (family == 4)
			CHECK(tu_verify_ip4_header(out), "segment %u: IPv4 checksum", i);
		if (memcmp(out, want, len) == 0)
			continue;
		if (only_zero_csum_differs(out, want, len, (size_t)(v.l4 - want) + TCP_OFF_CSUM))
			continue;
		tu_dump("in", pkt, len < 80 ? len : 80);
		tu_dump("bpf", out, olen < 80 ? olen : 80);
		tu_dump("rewrite_l4", want, len < 80 ? len : 80);
		CHECK(0, "segment %u (v%d, %s, %zu bytes): the kernel's rewrite differs", i, family,
		      up ? "up" : "down", len);
	}
	CHECK(fastpath_conns(e.fp) == DIFF_SEGMENTS, "conns %llu",
	      (unsigned long long)fastpath_conns(e.fp));
	for (unsigned i = 0; i < DIFF_SEGMENTS; i++)
		conn_del(&e, &conns[i]);
	CHECK(fastpath_conns(e.fp) == 0, "conns %llu after the dels",
	      (unsigned long long)fastpath_conns(e.fp));
	free(conns);
	env_down(&e);
}

Test(fastpath, random_segments_as_userspace_rewrite, .timeout = 60)
{
	run_in_netns(scenario_differential);
}

/* A segment whose rewritten TCP checksum is a zero sum: either zero must verify, and nothing
 * but its representation may differ from the segment built from scratch (0x0000) or from what
 * the userspace rewrite writes (0xFFFF). */
static void zero_sum_case(const struct env *e, const struct conn *c, bool up)
{
	struct tu_spec in, to;
	struct pkt_view v;
	size_t len, olen, l3 = c->app.family == 4 ? 20 : 40;
	uint32_t rv;

	spec_base(&in, c->app.family, 64, up ? 7 : 8);
	to = in;
	if (up)
		spec_up(&in, &to, c);
	else
		spec_down(&in, &to, c);
	/* Steer the rewritten segment's sum to zero through its first payload word, then give the
	 * original that word too, with its own checksum from scratch. */
	len = tu_build(&to, want, sizeof(want));
	CHECK(tu_steer_l4_csum(want, len, 20, 0x0000), "steer");
	tu_fix_checksums(want, len);
	CHECK(tu_l4_field(want, len) == 0, "steered checksum %#x", tu_l4_field(want, len));
	CHECK(tu_build(&in, pkt, sizeof(pkt)) == len, "lengths");
	memcpy(pkt + l3 + 20, want + l3 + 20, 2);
	tu_fix_checksums(pkt, len);

	rv = run(e, pkt, len, &olen);
	CHECK(rv == TC_ACT_REDIRECT && olen == len, "verdict %u, %zu bytes", rv, olen);
	CHECK(tu_verify_l4(out, olen), "%s: checksum %#x does not verify", up ? "up" : "down",
	      tu_l4_field(out, olen));
	CHECK(memcmp(out, want, len) == 0 || only_zero_csum_differs(want, out, len, l3 + 16),
	      "%s: output (checksum %#x) differs from the segment built from scratch",
	      up ? "up" : "down", tu_l4_field(out, olen));
	memcpy(want, pkt, len);
	CHECK(pkt_parse(&v, want, len) == PKT_OK, "parse");
	if (up)
		rewrite_l4(&v, c->nat, htons(c->nat_port), c->gw, htons(c->lport), false);
	else
		rewrite_l4(&v, c->app.dst, c->app.dport_be, c->app.src, c->app.sport_be, false);
	CHECK(memcmp(out, want, len) == 0 || only_zero_csum_differs(out, want, len, l3 + 16) ||
	      only_zero_csum_differs(want, out, len, l3 + 16),
	      "userspace rewrite differs beyond the zero's representation");
}

static void scenario_zero_sum(void)
{
	struct env e;
	struct conn c4, c6;

	env_up(&e, 4);
	conn_v4(&c4);
	conn_v6(&c6);
	conn_add_ok(&e, &c4);
	conn_add_ok(&e, &c6);
	zero_sum_case(&e, &c4, true);
	zero_sum_case(&e, &c4, false);
	zero_sum_case(&e, &c6, true);
	zero_sum_case(&e, &c6, false);
	env_down(&e);
}

Test(fastpath, zero_checksum_verifies)
{
	run_in_netns(scenario_zero_sum);
}

/* ---- 4: what goes through untouched ---- */

static size_t build(const struct tu_spec *s)
{
	return tu_build(s, pkt, sizeof(pkt));
}

static void check_pass_family(const struct env *e, void (*make)(struct conn *))
{
	struct conn c, naive;
	struct tu_spec in, to;
	uint8_t fam;
	size_t len, l3;

	make(&c);
	fam = c.app.family;
	l3 = fam == 4 ? 20 : 40;
	conn_add_ok(e, &c);

	/* The mapped segment itself is rewritten (what the cases below differ from). */
	spec_base(&in, fam, 100, 1);
	to = in;
	spec_up(&in, &to, &c);
	expect_rewrite(e, &in, &to, "mapped");

	/* SYN and SYN|ACK of the mapped tuple, both directions. */
	in.tcp_flags = TCP_SYN;
	in.payload_len = 0;
	in.mss = 1460;
	expect_pass(e, pkt, build(&in), "SYN");
	spec_down(&in, &to, &c);
	in.tcp_flags = TCP_SYN | TCP_ACK;
	expect_pass(e, pkt, build(&in), "SYN|ACK");

	/* Unmapped tuples: another source port, another destination address, the reverse. */
	spec_base(&in, fam, 100, 2);
	to = in;
	spec_up(&in, &to, &c);
	in.sport++;
	expect_pass(e, pkt, build(&in), "other source port");
	in.sport--;
	in.dst[fam == 4 ? 3 : 15] ^= 1;
	expect_pass(e, pkt, build(&in), "other destination");
	in.dst[fam == 4 ? 3 : 15] ^= 1;
	in.sport = ntohs(c.app.dport_be);
	in.dport = ntohs(c.app.sport_be);
	expect_pass(e, pkt, build(&in), "ports swapped");

	/* UDP with the mapped tuple (its ports where TCP's are; no SYN bit where TCP's is). */
	{
		static const uint8_t zeros[64];
		struct tu_spec u;

		tu_spec_udp(&u, fam == 4 ? "1.1.1.1" : "::1", 1, fam == 4 ? "2.2.2.2" : "::2", 2);
		spec_set(&u, fam, c.app.src, ntohs(c.app.sport_be), c.app.dst,
			 ntohs(c.app.dport_be));
		u.payload = zeros;
		u.payload_len = sizeof(zeros);
		expect_pass(e, pkt, build(&u), "UDP with a mapped TCP tuple");
	}

	/* Shorter than IP + TCP headers (the length field says so too), the ports mapped. The
	 * kernel test-runs no input shorter than an Ethernet and an IP header, and here the input
	 * is the packet: the IP header and 14 to 19 bytes of TCP. */
	spec_base(&in, fam, 0, 3);
	spec_up(&in, &to, &c);
	build(&in);
	for (size_t cut = l3 + 14; cut < l3 + 20; cut += 2) {
		if (fam == 4) {
			tu_put16(pkt + 2, (uint16_t)cut);
			tu_fix_ip4_header(pkt);
		} else {
			tu_put16(pkt + 4, (uint16_t)(cut - 40));
		}
		expect_pass(e, pkt, cut, "truncated TCP header");
	}

	/* The segment of a mapped tuple whose source reads as another ethertype: ARP, and the
	 * other IP family's. */
	for (int k = 0; k < 2; k++) {
		static const char *const srcs[2][2] = { { "8.6.0.2", "134.221.0.2" },
							{ "fd00:0:806::2", "fd00:0:800::2" } };
		struct conn o = c;

		tu_addr(o.app.src, srcs[fam == 6][k]);
		conn_add_ok(e, &o);
		spec_base(&in, fam, 20, 4);
		spec_up(&in, &to, &o);
		len = build(&in);
		expect_pass_eth(e, pkt, len, tu_get16(pkt + 12),
				k == 0 ? "ARP ethertype" : "the other family's ethertype");
		conn_del(e, &o);
	}

	if (fam == 4) {
		/* IPv4 options (IHL 6): the ports a program without the IHL check would read
		 * (the option bytes) are mapped too. */
		spec_base(&in, 4, 50, 5);
		spec_up(&in, &to, &c);
		in.ip4_opts_len = 4;
		memcpy(in.ip4_opts, "\x01\x01\x01\x00", 4);
		in.ack = 0; /* no SYN bit where a shifted read would look */
		len = build(&in);
		CHECK(pkt[0] == 0x46, "IHL %#x", pkt[0]);
		map_naive(e, pkt, &naive);
		expect_pass(e, pkt, len, "IPv4 options");
		/* Fragments: MF with offset 0 (TCP header present), an offset without MF, both. */
		static const uint16_t frags[] = { 0x2000, 0x0010, 0x2010, 0x6000, 0x1fff };
		for (size_t i = 0; i < sizeof(frags) / sizeof(frags[0]); i++) {
			spec_base(&in, 4, 80, 6);
			spec_up(&in, &to, &c);
			in.ip4_frag = frags[i];
			len = build(&in);
			expect_pass(e, pkt, len, "IPv4 fragment");
		}
	} else {
		/* Hop-by-hop, destination options, routing (segments left 0) before TCP: the
		 * ports a program without the next-header check would read are mapped too. */
		static const uint8_t types[] = { 0, 60, 43 };
		for (size_t i = 0; i < sizeof(types); i++) {
			spec_base(&in, 6, 50, 7);
			spec_up(&in, &to, &c);
			in.ext[0] = (struct tu_ext){ .type = types[i], .hdr_len = 0 };
			in.ext_n = 1;
			in.seq = 0x11003344; /* no SYN bit where a shifted read would look */
			len = build(&in);
			CHECK(pkt[6] == types[i], "next header %u", pkt[6]);
			map_naive(e, pkt, &naive);
			expect_pass(e, pkt, len, "IPv6 extension header");
			conn_del(e, &naive);
		}
	}

	/* After fastpath_del: the segment rewritten at the start now passes. */
	spec_base(&in, fam, 100, 1);
	to = in;
	spec_up(&in, &to, &c);
	conn_del(e, &c);
	expect_pass(e, pkt, build(&in), "after fastpath_del (uplink)");
	spec_down(&in, &to, &c);
	expect_pass(e, pkt, build(&in), "after fastpath_del (downlink)");
}

static void scenario_pass(void)
{
	struct env e;
	struct fastpath_totals t0;

	env_up(&e, 64);
	check_pass_family(&e, conn_v4);
	check_pass_family(&e, conn_v6);
	/* Only the two mapped segments were counted. */
	totals(&e, &t0);
	CHECK(t0.packets == 2 && t0.segments == 2, "packets %llu, segments %llu",
	      (unsigned long long)t0.packets, (unsigned long long)t0.segments);
	env_down(&e);
}

Test(fastpath, passes_what_it_must_not_touch)
{
	run_in_netns(scenario_pass);
}

/* ---- 5: the map's room ---- */

static void scenario_full(void)
{
	struct env e;
	struct conn a, b;
	struct tu_spec in, to;
	int ret;

	env_up(&e, 1);
	conn_v4(&a);
	conn_v6(&b);
	conn_add_ok(&e, &a);
	ret = conn_add(&e, &b);
	CHECK(ret == -E2BIG, "second connection in room for one: %d (%s)", ret, strerror(-ret));
	CHECK(fastpath_conns(e.fp) == 1, "conns %llu", (unsigned long long)fastpath_conns(e.fp));
	/* The first still works, both ways; the refused one's segments pass. */
	spec_base(&in, 4, 10, 1);
	to = in;
	spec_up(&in, &to, &a);
	expect_rewrite(&e, &in, &to, "first connection, uplink");
	spec_down(&in, &to, &a);
	expect_rewrite(&e, &in, &to, "first connection, downlink");
	spec_base(&in, 6, 10, 1);
	spec_up(&in, &to, &b);
	expect_pass(&e, pkt, build(&in), "refused connection, uplink");
	spec_down(&in, &to, &b);
	expect_pass(&e, pkt, build(&in), "refused connection, downlink");
	/* Its room given back, the second goes in. */
	conn_del(&e, &a);
	CHECK(fastpath_conns(e.fp) == 0, "conns %llu", (unsigned long long)fastpath_conns(e.fp));
	conn_add_ok(&e, &b);
	CHECK(fastpath_conns(e.fp) == 1, "conns %llu", (unsigned long long)fastpath_conns(e.fp));
	spec_base(&in, 6, 10, 1);
	to = in;
	spec_up(&in, &to, &b);
	expect_rewrite(&e, &in, &to, "second connection after the first's del");
	ret = conn_add(&e, &a);
	CHECK(ret == -E2BIG, "full again: %d", ret);
	env_down(&e);
}

Test(fastpath, room_for_one_connection)
{
	run_in_netns(scenario_full);
}

/* ---- 6: counters ---- */

static void scenario_counters(void)
{
	struct env e;
	struct conn c4, c6;
	struct tu_spec in, to;
	struct fastpath_totals t0, t1, t2;
	uint64_t bytes = 0;
	size_t len, olen;
	uint32_t rv;

	env_up(&e, 8);
	conn_v4(&c4);
	conn_v6(&c6);
	conn_add_ok(&e, &c4);
	conn_add_ok(&e, &c6);
	totals(&e, &t0);
	CHECK(t0.packets == 0 && t0.segments == 0 && t0.bytes == 0, "fresh counters not zero");

	spec_base(&in, 4, 300, 1);
	to = in;
	spec_up(&in, &to, &c4);
	len = build(&in);
	CHECK(run(&e, pkt, len, &olen) == TC_ACT_REDIRECT, "v4 up");
	bytes += len;
	spec_base(&in, 6, 1000, 2);
	spec_down(&in, &to, &c6);
	len = build(&in);
	CHECK(run(&e, pkt, len, &olen) == TC_ACT_REDIRECT, "v6 down");
	bytes += len;
	/* A GSO packet of 4 segments counts once, its segments 4 times. */
	spec_base(&in, 4, 1400, 3);
	spec_down(&in, &to, &c4);
	len = build(&in);
	rv = run_eth(&e, pkt, len, ETH_P_IP, 4, &olen);
	CHECK(rv == TC_ACT_REDIRECT, "GSO: verdict %u", rv);
	bytes += len;
	/* Passed: not counted. */
	in.tcp_flags = TCP_SYN;
	CHECK(run(&e, pkt, build(&in), &olen) == PASS, "SYN");
	in.tcp_flags = TCP_ACK;
	in.sport++;
	CHECK(run(&e, pkt, build(&in), &olen) == PASS, "unmapped");

	totals(&e, &t1);
	CHECK(t1.packets - t0.packets == 3, "packets %llu",
	      (unsigned long long)(t1.packets - t0.packets));
	CHECK(t1.segments - t0.segments == 1 + 1 + 4, "segments %llu",
	      (unsigned long long)(t1.segments - t0.segments));
	CHECK(t1.bytes - t0.bytes == bytes, "bytes %llu, want %llu",
	      (unsigned long long)(t1.bytes - t0.bytes), (unsigned long long)bytes);
	/* Read with no memory to spare (failalloc.h): the same figures, never fewer; a counter
	 * that went back would read as a restart to whatever computes rates from it. */
	failalloc_arm(1);
	totals(&e, &t2);
	failalloc_arm(0);
	CHECK(t2.packets == t1.packets && t2.segments == t1.segments && t2.bytes == t1.bytes,
	      "with no memory: %llu packets, %llu segments, %llu bytes",
	      (unsigned long long)t2.packets, (unsigned long long)t2.segments,
	      (unsigned long long)t2.bytes);
	env_down(&e);
}

Test(fastpath, counters_exact)
{
	run_in_netns(scenario_counters);
}

/* ---- 7: fastpath_open's argument (checked before anything is loaded: no root needed) ---- */

Test(fastpath, open_rejects_bad_sizes)
{
	static const uint32_t bad[] = { 0, FASTPATH_MAX_CONNS + 1, UINT32_MAX };
	struct fastpath *fp = (struct fastpath *)&fp;
	char err[256];
	int ret;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		ret = fastpath_open(bad[i], 0, &fp, err, sizeof(err));
		cr_assert_eq(ret, -EINVAL, "fastpath_open(%u) = %d", bad[i], ret);
		cr_assert_null(fp, "fastpath_open(%u) left an object", bad[i]);
		cr_assert(strstr(err, "connections") != NULL, "fastpath_open(%u): message \"%s\"",
			  bad[i], err);
	}
	fastpath_free(NULL);
}

/* ---- attaching to the TUN ---- */

/* Output of a shell command (empty when it fails). */
static void sh(const char *cmd, char *buf, size_t cap)
{
	FILE *f = popen(cmd, "r");
	size_t n = 0;

	buf[0] = '\0';
	CHECK(f != NULL, "popen %s: %s", cmd, strerror(errno));
	while (n + 1 < cap) {
		size_t got = fread(buf + n, 1, cap - 1 - n, f);
		if (!got)
			break;
		n += got;
	}
	buf[n] = '\0';
	pclose(f);
}

static void sh_ok(const char *cmd)
{
	int st = system(cmd);

	CHECK(st == 0, "%s: status %d", cmd, st);
}

/* Our filter on the TUN's egress: priority 1, handle 0x7473, our program's id. */
static bool our_filter(int prog_fd)
{
	char buf[4096], id[32];
	struct bpf_prog_info info;
	uint32_t ilen = sizeof(info);

	memset(&info, 0, sizeof(info));
	CHECK(bpf_obj_get_info_by_fd(prog_fd, &info, &ilen) == 0, "prog info: %s",
	      strerror(errno));
	snprintf(id, sizeof(id), " id %u ", info.id);
	sh("tc filter show dev " TUN_NAME " egress 2>&1", buf, sizeof(buf));
	return strstr(buf, "pref 1 bpf") && strstr(buf, "handle 0x7473") && strstr(buf, id) &&
	       strstr(buf, "direct-action");
}

static bool has_clsact(void)
{
	char buf[4096];

	sh("tc qdisc show dev " TUN_NAME " 2>&1", buf, sizeof(buf));
	return strstr(buf, "qdisc clsact") != NULL;
}

/* BPF filters on the TUN's egress (tc shows each in direct-action mode with that word). */
static int egress_bpf_filters(void)
{
	char buf[4096];
	int n = 0;

	sh("tc filter show dev " TUN_NAME " egress 2>&1", buf, sizeof(buf));
	for (const char *p = buf; (p = strstr(p, "direct-action")) != NULL; p++)
		n++;
	return n;
}

static struct fastpath *open_attached(int ifindex)
{
	struct fastpath *fp;
	char err[256] = "";
	int ret = fastpath_open(4, 0, &fp, err, sizeof(err));

	CHECK(ret == 0, "fastpath_open: %s", err);
	ret = fastpath_attach(fp, ifindex, err, sizeof(err));
	CHECK(ret == 0, "fastpath_attach = %d: %s", ret, err);
	return fp;
}

static void scenario_attach(void)
{
	char buf[4096], err[256] = "";
	int tun = tun_create(TUN_NAME), idx = (int)if_nametoindex(TUN_NAME), ret;
	struct fastpath *fp, *fp2;

	probe_kernel(idx);
	if (system("tc qdisc show >/dev/null 2>&1") != 0)
		child_report(SKIP_STATUS, "no tc(8) to look at the qdiscs with");
	CHECK(!has_clsact(), "a fresh TUN with a clsact qdisc");

	/* No clsact before: attaching adds it with our filter, freeing removes both. */
	fp = open_attached(idx);
	CHECK(has_clsact(), "no clsact qdisc after fastpath_attach");
	CHECK(our_filter(fastpath_prog_fd(fp)), "our filter not on egress");
	sh("tc filter show dev " TUN_NAME " ingress 2>&1", buf, sizeof(buf));
	CHECK(strstr(buf, "bpf") == NULL, "a filter on ingress: %.300s", buf);
	CHECK(fastpath_attach(fp, idx, err, sizeof(err)) == -EALREADY, "attached twice");
	fastpath_free(fp);
	CHECK(!has_clsact(), "clsact qdisc left after fastpath_free");

	/* A filter of ours left on the device (by an earlier process): the next replaces it. */
	fp = open_attached(idx);
	fp2 = open_attached(idx);
	CHECK(our_filter(fastpath_prog_fd(fp2)), "the second program not the one on egress");
	CHECK(egress_bpf_filters() == 1, "%d filters on egress", egress_bpf_filters());
	fastpath_free(fp2);
	CHECK(egress_bpf_filters() == 0, "%d filters on egress after the second's free",
	      egress_bpf_filters());
	CHECK(has_clsact(), "the qdisc the first created went with the second");
	fastpath_free(fp);
	CHECK(!has_clsact(), "clsact qdisc left after the first's free");

	/* A clsact there before, with a filter of someone else's: both stay, ours goes. */
	sh_ok("tc qdisc add dev " TUN_NAME " clsact");
	sh_ok("tc filter add dev " TUN_NAME " egress pref 2 protocol all u32 match u32 0 0");
	fp = open_attached(idx);
	CHECK(our_filter(fastpath_prog_fd(fp)), "our filter not on egress");
	CHECK(egress_bpf_filters() == 1, "%d BPF filters on egress", egress_bpf_filters());
	fastpath_free(fp);
	CHECK(has_clsact(), "fastpath_free removed a clsact qdisc it did not create");
	sh("tc filter show dev " TUN_NAME " egress 2>&1", buf, sizeof(buf));
	CHECK(strstr(buf, "pref 2 u32") && !strstr(buf, "0x7473") && !strstr(buf, " bpf"),
	      "egress filters after free: %.300s", buf);

	/* No such device: an error with a message, and the object still frees. */
	fp = NULL;
	CHECK(fastpath_open(4, 0, &fp, err, sizeof(err)) == 0, "%s", err);
	err[0] = '\0';
	ret = fastpath_attach(fp, idx + 1000, err, sizeof(err));
	CHECK(ret < 0 && err[0], "attach to a missing device: %d \"%s\"", ret, err);
	fastpath_free(fp);
	close(tun);
}

Test(fastpath, attach_and_free_qdisc)
{
	run_in_netns(scenario_attach);
}

/* ---- on the TUN itself: the attached filter, segments sent into the TUN's egress ---- */

/* An AF_PACKET socket sends into the TUN's transmit path (through its egress hook, as the
 * kernel's TCP does), with a virtio header that can mark the TCP checksum as left to the device
 * (CHECKSUM_PARTIAL, what the kernel's TCP sends on a TUN with offload). A segment the filter
 * redirects comes in on the TUN's ingress, where a second AF_PACKET socket (incoming only, with
 * virtio headers) sees it; one it passes goes out through the TUN and is read from its fd. */
struct live {
	struct env e;
	int tx, rx; /* the sending and the capturing socket */
};

static void live_up(struct live *l)
{
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL) };
	struct ifreq ifr;
	char err[256] = "";
	int one = 1, s, ret;

	env_up(&l->e, 256);
	/* No IPv6 on the TUN: nothing of the kernel's own (router solicitations, MLD) goes out. */
	write_text("/proc/sys/net/ipv6/conf/" TUN_NAME "/disable_ipv6", "1");
	s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", TUN_NAME);
	ifr.ifr_flags = IFF_UP;
	CHECK(ioctl(s, SIOCSIFFLAGS, &ifr) == 0, "link up: %s", strerror(errno));
	close(s);
	CHECK(fcntl(l->e.tun_fd, F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
	ret = fastpath_attach(l->e.fp, l->e.ifindex, err, sizeof(err));
	CHECK(ret == 0, "fastpath_attach = %d: %s", ret, err);

	l->tx = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
	CHECK(l->tx >= 0, "AF_PACKET: %s", strerror(errno));
	CHECK(setsockopt(l->tx, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) == 0,
	      "PACKET_VNET_HDR: %s", strerror(errno));
	l->rx = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, htons(ETH_P_ALL));
	CHECK(l->rx >= 0, "AF_PACKET: %s", strerror(errno));
	CHECK(setsockopt(l->rx, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) == 0,
	      "PACKET_VNET_HDR: %s", strerror(errno));
	CHECK(setsockopt(l->rx, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) == 0,
	      "PACKET_IGNORE_OUTGOING: %s", strerror(errno));
	sll.sll_ifindex = l->e.ifindex;
	CHECK(bind(l->rx, (struct sockaddr *)&sll, sizeof(sll)) == 0, "bind: %s", strerror(errno));
	while (recv(l->rx, out, sizeof(out), 0) > 0)
		;
	while (read(l->e.tun_fd, out, sizeof(out)) > 0)
		;
}

static void live_down(struct live *l)
{
	close(l->tx);
	close(l->rx);
	env_down(&l->e);
}

enum landing { REDIRECTED, PASSED };

/* Send p (partial: its TCP checksum field holds the pseudo-header sum, left to the device) into
 * the TUN's egress; where it lands within a second, its bytes in out (*olen) and, when it came
 * back in, its virtio header in *vh. */
static enum landing live_send(struct live *l, const uint8_t *p, size_t len, bool partial,
			      size_t *olen, struct virtio_net_hdr *vh)
{
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_ifindex = l->e.ifindex };
	struct virtio_net_hdr h = { 0 };
	size_t l3 = p[0] >> 4 == 4 ? (size_t)(p[0] & 15) * 4 : 40;
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)p, len } };
	struct msghdr m = { .msg_name = &sll, .msg_namelen = sizeof(sll), .msg_iov = iov,
			    .msg_iovlen = 2 };
	struct pollfd pf[2] = { { .fd = l->rx, .events = POLLIN },
				{ .fd = l->e.tun_fd, .events = POLLIN } };
	ssize_t n;

	if (partial) {
		h.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
		h.csum_start = (uint16_t)l3;
		h.csum_offset = TCP_OFF_CSUM;
	}
	sll.sll_protocol = htons(p[0] >> 4 == 4 ? ETH_P_IP : ETH_P_IPV6);
	CHECK(sendmsg(l->tx, &m, 0) == (ssize_t)(sizeof(h) + len), "send: %s", strerror(errno));
	CHECK(poll(pf, 2, 1000) > 0, "the segment went nowhere within a second");
	if (pf[0].revents & POLLIN) {
		uint8_t hb[sizeof(*vh)];
		struct iovec riov[2] = { { hb, sizeof(hb) }, { out, sizeof(out) } };
		struct msghdr rm = { .msg_iov = riov, .msg_iovlen = 2 };

		n = recvmsg(l->rx, &rm, 0);
		CHECK(n >= (ssize_t)sizeof(hb), "capture: %zd (%s)", n, strerror(errno));
		memcpy(vh, hb, sizeof(hb));
		*olen = (size_t)n - sizeof(hb);
		CHECK(read(l->e.tun_fd, want, sizeof(want)) < 0, "also out through the TUN");
		return REDIRECTED;
	}
	n = read(l->e.tun_fd, out, sizeof(out));
	CHECK(n > 0, "TUN read: %s", strerror(errno));
	*olen = (size_t)n;
	return PASSED;
}

static void scenario_live(void)
{
	struct live l;
	struct conn c[2];
	struct tu_spec in, to;
	struct virtio_net_hdr vh;
	struct fastpath_totals t0, t1;
	struct tu_rng r;
	uint64_t packets = 0, bytes = 0;
	size_t len, olen;

	live_up(&l);
	conn_v4(&c[0]);
	conn_v6(&c[1]);
	conn_add_ok(&l.e, &c[0]);
	conn_add_ok(&l.e, &c[1]);
	totals(&l.e, &t0);

	/* Full checksums: the segment built with the mapped tuple comes in. */
	for (int k = 0; k < 4; k++) {
		spec_base(&in, c[k & 1].app.family, 500, 10 + k);
		to = in;
		if (k < 2)
			spec_up(&in, &to, &c[k & 1]);
		else
			spec_down(&in, &to, &c[k & 1]);
		len = build(&in);
		CHECK(live_send(&l, pkt, len, false, &olen, &vh) == REDIRECTED, "segment %d passed",
		      k);
		CHECK(tu_build(&to, want, sizeof(want)) == olen && memcmp(out, want, olen) == 0,
		      "segment %d: not the segment built with the mapped tuple", k);
		packets++;
		bytes += len;
	}
	/* A SYN goes out through the TUN as it was. */
	in.tcp_flags = TCP_SYN;
	len = build(&in);
	CHECK(live_send(&l, pkt, len, false, &olen, &vh) == PASSED, "SYN redirected");
	CHECK(olen == len && memcmp(out, pkt, len) == 0, "SYN changed on its way out");

	/* Checksums left to the device (random segments, both families, both directions): the
	 * bytes are what the userspace rewrite makes of a NEEDS_CSUM packet, the checksum is
	 * still left to complete, and completed it verifies. */
	tu_rng_seed(&r, 0x6c697665);
	for (unsigned i = 0; i < 200; i++) {
		struct conn *k = &c[i & 1];
		bool up = (i >> 1) & 1;
		struct pkt_view v;
		size_t l3 = k->app.family == 4 ? 20 : 40;

		tu_rand_spec(&r, &in, k->app.family, IPPROTO_TCP, 1400);
		in.tcp_flags &= (uint8_t)~TCP_SYN;
		in.ip4_opts_len = 0;
		in.ext_n = 0;
		in.partial_csum = true;
		to = in;
		if (up)
			spec_up(&in, &to, k);
		else
			spec_down(&in, &to, k);
		len = build(&in);
		memcpy(want, pkt, len);
		CHECK(pkt_parse(&v, want, len) == PKT_OK, "parse");
		if (up)
			rewrite_l4(&v, k->nat, htons(k->nat_port), k->gw, htons(k->lport), true);
		else
			rewrite_l4(&v, k->app.dst, k->app.dport_be, k->app.src, k->app.sport_be,
				   true);
		CHECK(live_send(&l, pkt, len, true, &olen, &vh) == REDIRECTED, "partial %u passed",
		      i);
		packets++;
		bytes += len;
		if (olen != len || memcmp(out, want, len) != 0) {
			tu_dump("in", pkt, len < 80 ? len : 80);
			tu_dump("kernel", out, olen < 80 ? olen : 80);
			tu_dump("rewrite_l4", want, len < 80 ? len : 80);
			CHECK(0, "partial %u (v%u, %s): field %#x, userspace %#x", i, k->app.family,
			      up ? "up" : "down", tu_l4_field(out, olen), tu_l4_field(want, len));
		}
		CHECK(tu_verify_partial(out, olen), "partial %u: not the new pseudo-header sum", i);
		CHECK((vh.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM) && vh.csum_start == l3 &&
		      vh.csum_offset == TCP_OFF_CSUM, "partial %u: flags %#x start %u offset %u",
		      i, vh.flags, vh.csum_start, vh.csum_offset);
		tu_complete_partial(out, olen);
		CHECK(tu_verify_l4(out, olen), "partial %u: completed checksum does not verify", i);
	}

	totals(&l.e, &t1);
	CHECK(t1.packets - t0.packets == packets && t1.bytes - t0.bytes == bytes,
	      "counted %llu packets, %llu bytes; sent %llu, %llu",
	      (unsigned long long)(t1.packets - t0.packets),
	      (unsigned long long)(t1.bytes - t0.bytes), (unsigned long long)packets,
	      (unsigned long long)bytes);
	live_down(&l);
}

Test(fastpath, on_the_tun_egress)
{
	run_in_netns(scenario_live);
}

/* ---- UDP flows of direct outbound sockets ----
 *
 * The uplink is a veth device (Ethernet, MTU 1500) of the scenario's namespace: the egress
 * program checks datagrams against its MTU and names it in the redirect; the reply program
 * (attached to its ingress by fastpath_udp_uplink, its fd found through the filter) runs on
 * Ethernet frames with the veth in its context. A test run does not carry out a redirect: the
 * verdict, the bytes, the mark and the counters are what is asserted. */

#define UPLINK "fpu0"
#define UPLINK_MTU 1500
#define FLOW_MARK 0x77

struct uenv {
	struct env e;
	int uplink; /* the veth's ifindex */
	int reply;  /* the reply program (fastpath_uplink) */
};

/* The tcx hooks by number (the system's kernel headers may predate them). */
#define TCX_INGRESS 46
#define TCX_EGRESS 47

/* The programs on device ifindex's tcx hook (TCX_INGRESS or TCX_EGRESS): how many, and the
 * first's id in *id. */
static uint32_t tcx_progs(int ifindex, int hook, uint32_t *id)
{
	uint32_t ids[16] = { 0 };
	LIBBPF_OPTS(bpf_prog_query_opts, q, .prog_ids = ids, .prog_cnt = 16);

	if (bpf_prog_query_opts(ifindex, (enum bpf_attach_type)hook, &q) != 0)
		return 0;
	if (id)
		*id = ids[0];
	return q.prog_cnt;
}

/* The reply program on device ifindex's tcx ingress: its fd. */
static int ingress_prog(int ifindex)
{
	uint32_t id = 0;
	int fd;

	CHECK(tcx_progs(ifindex, TCX_INGRESS, &id) == 1, "not one program on the tcx ingress: %u",
	      tcx_progs(ifindex, TCX_INGRESS, NULL));
	fd = bpf_prog_get_fd_by_id(id);
	CHECK(fd >= 0, "program %u: %s", id, strerror(errno));
	return fd;
}

/* An Ethernet device of the scenario's namespace: one end of a veth pair (its peer: the name
 * with a "p" after it). */
static void uplink_add(const char *name)
{
	char cmd[160];

	snprintf(cmd, sizeof(cmd), "ip link add %s mtu %d type veth peer name %sp", name,
		 UPLINK_MTU, name);
	sh_ok(cmd);
}

static void uenv_up(struct uenv *u, uint32_t max_udp)
{
	char err[256] = "";
	int ret;

	env_up_udp(&u->e, 4, max_udp);
	uplink_add(UPLINK);
	u->uplink = (int)if_nametoindex(UPLINK);
	CHECK(u->uplink > 0, "if_nametoindex: %s", strerror(errno));
	ret = fastpath_udp_uplink(u->e.fp, u->uplink, err, sizeof(err));
	CHECK(ret == 0, "fastpath_udp_uplink = %d: %s", ret, err);
	u->reply = ingress_prog(u->uplink);
}

static void uenv_down(struct uenv *u)
{
	close(u->reply);
	env_down(&u->e);
}

/* The flows of the fixed cases: the app's sources read as the family's ethertype at bytes
 * 12-13 (the top of the file). */
static void uflow_text(struct fastpath_udp *f, const struct uenv *u, const char *app,
		       uint16_t sport, const char *remote, uint16_t dport, const char *local,
		       uint16_t lport)
{
	memset(f, 0, sizeof(*f));
	f->app.family = (uint8_t)tu_addr(f->app.src, app);
	CHECK(tu_addr(f->app.dst, remote) == f->app.family, "%s", remote);
	CHECK(tu_addr(f->local, local) == f->app.family, "%s", local);
	f->app.proto = IPPROTO_UDP;
	f->app.sport_be = htons(sport);
	f->app.dport_be = htons(dport);
	f->lport_be = htons(lport);
	f->uplink = u->uplink;
	f->tun = u->e.ifindex;
	f->mark = FLOW_MARK;
	/* No socket check (a socket bound to a device): the check has a scenario of its own. */
	f->sock_bound_dev = true;
}

static void uflow_v4(struct fastpath_udp *f, const struct uenv *u)
{
	uflow_text(f, u, "8.0.0.2", 40000, "93.184.216.34", 443, "192.0.2.10", 50000);
}

static void uflow_v6(struct fastpath_udp *f, const struct uenv *u)
{
	uflow_text(f, u, "fd00:0:86dd::2", 40000, "2606:2800:220:1:248:1893:25c8:1946", 443,
		   "2001:db8:1::10", 50000);
}

static void uflow_add_ok(const struct uenv *u, const struct fastpath_udp *f)
{
	int ret = fastpath_udp_add(u->e.fp, f);

	CHECK(ret == 0, "fastpath_udp_add = %d (%s)", ret, strerror(-ret));
}

/* A UDP datagram's spec: addresses and ports (ports in network order) as given, payload of
 * plen bytes from seed, the other header fields fixed. */
static void uspec(struct tu_spec *s, uint8_t fam, const uint8_t *src, uint16_t sport_be,
		  const uint8_t *dst, uint16_t dport_be, size_t plen, uint64_t seed)
{
	tu_spec_udp(s, fam == 4 ? "1.1.1.1" : "::1", 1, fam == 4 ? "2.2.2.2" : "::2", 2);
	spec_set(s, fam, src, ntohs(sport_be), dst, ntohs(dport_be));
	s->ttl = 63;
	s->tos = 0x28;
	s->ip_id = 0x1234;
	s->ip4_frag = 0x4000; /* DF */
	s->payload_len = plen;
	s->payload_seed = seed;
}

/* A flow's datagram out as the TUN sees it (in), and as it must leave (to). */
static void uspec_out(struct tu_spec *in, struct tu_spec *to, const struct fastpath_udp *f,
		      size_t plen, uint64_t seed)
{
	const struct flow_key *a = &f->app;

	uspec(in, a->family, a->src, a->sport_be, a->dst, a->dport_be, plen, seed);
	uspec(to, a->family, f->local, f->lport_be, a->dst, a->dport_be, plen, seed);
}

/* A flow's reply as it arrives on the uplink (in), and as it must reach the app (to). */
static void uspec_in(struct tu_spec *in, struct tu_spec *to, const struct fastpath_udp *f,
		     size_t plen, uint64_t seed)
{
	const struct flow_key *a = &f->app;

	uspec(in, a->family, a->dst, a->dport_be, f->local, f->lport_be, plen, seed);
	uspec(to, a->family, a->dst, a->dport_be, a->src, a->sport_be, plen, seed);
}

/* The datagram `in` on the TUN's egress leaves redirected as exactly `to`, with the flow's
 * mark, behind an Ethernet header of zeros but for its ethertype (for the neighbour output to
 * fill in); its UDP checksum (and the IPv4 header's) verify when computed from scratch.
 * Returns the IP packet's length. */
static size_t expect_udp_out(const struct uenv *u, const struct tu_spec *in,
			     const struct tu_spec *to, const char *what)
{
	static const uint8_t zeros[12];
	size_t len = tu_build(in, pkt, sizeof(pkt)), wlen = tu_build(to, want, sizeof(want)), olen;
	uint32_t rv = run(&u->e, pkt, len, &olen);
	const uint8_t *ip = out + ETH_LEN;

	CHECK(rv == TC_ACT_REDIRECT, "%s: verdict %u, not TC_ACT_REDIRECT", what, rv);
	CHECK(mark_out == FLOW_MARK, "%s: redirected with mark %#x", what, mark_out);
	CHECK(olen == len + ETH_LEN && wlen == len, "%s: %zu bytes out of %zu", what, olen, len);
	CHECK(memcmp(out, zeros, 12) == 0 &&
	      tu_get16(out + 12) == (in->family == 4 ? ETH_P_IP : ETH_P_IPV6),
	      "%s: the Ethernet header in front is not zeros and the ethertype", what);
	CHECK(tu_verify_l4(ip, len), "%s: UDP checksum %#x does not verify", what,
	      tu_l4_field(ip, len));
	if (in->family == 4)
		CHECK(tu_verify_ip4_header(ip), "%s: IPv4 header checksum does not verify", what);
	if (memcmp(ip, want, len) != 0) {
		tu_dump("in", pkt, len < 64 ? len : 64);
		tu_dump("out", ip, len < 64 ? len : 64);
		tu_dump("want", want, len < 64 ? len : 64);
		CHECK(0, "%s: output differs from the datagram built with the mapped tuple", what);
	}
	return len;
}

/* ---- the reply program's runs: Ethernet frames on the uplink ---- */

static uint8_t uframe[ETH_LEN + TU_PKT_MAX], uwant[ETH_LEN + TU_PKT_MAX];

static size_t eth_frame(uint8_t *fr, uint16_t ethertype, const uint8_t *p, size_t len)
{
	static const uint8_t macs[12] = { 0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2 };

	memcpy(fr, macs, sizeof(macs));
	tu_put16(fr + 12, ethertype);
	memcpy(fr + ETH_LEN, p, len);
	return ETH_LEN + len;
}

static uint32_t run_uplink(const struct uenv *u, const uint8_t *fr, size_t flen, size_t *olen)
{
	struct __sk_buff ctx = { .ifindex = (uint32_t)u->uplink, .mark = IN_MARK };
	struct __sk_buff ctx_out = { 0 };

	memset(out, 0xa5, sizeof(out));
	LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = fr, .data_size_in = (uint32_t)flen,
		    .data_out = out, .data_size_out = sizeof(out), .ctx_in = &ctx,
		    .ctx_size_in = sizeof(ctx), .ctx_out = &ctx_out,
		    .ctx_size_out = sizeof(ctx_out), .repeat = 1);
	CHECK(bpf_prog_test_run_opts(u->reply, &o) == 0, "BPF_PROG_TEST_RUN (%zu bytes): %s",
	      flen, strerror(errno));
	*olen = o.data_size_out;
	mark_out = ctx_out.mark;
	return o.retval;
}

static uint16_t ethertype_of(const struct tu_spec *s)
{
	return s->family == 4 ? ETH_P_IP : ETH_P_IPV6;
}

/* The reply `in`, in an Ethernet frame on the uplink, is redirected as exactly `to` in the
 * same frame, without a mark. Returns the IP packet's length. */
static size_t expect_udp_in(const struct uenv *u, const struct tu_spec *in,
			    const struct tu_spec *to, const char *what)
{
	size_t len = tu_build(in, pkt, sizeof(pkt)), flen = eth_frame(uframe, ethertype_of(in),
								       pkt, len);
	size_t wlen = tu_build(to, want, sizeof(want)), olen;
	uint32_t rv;

	eth_frame(uwant, ethertype_of(in), want, wlen);
	rv = run_uplink(u, uframe, flen, &olen);
	CHECK(rv == TC_ACT_REDIRECT, "%s: verdict %u, not TC_ACT_REDIRECT", what, rv);
	CHECK(mark_out == 0, "%s: redirected with mark %#x", what, mark_out);
	CHECK(olen == flen && wlen == len, "%s: %zu bytes out of %zu", what, olen, flen);
	CHECK(tu_verify_l4(out + ETH_LEN, olen - ETH_LEN), "%s: UDP checksum %#x does not verify",
	      what, tu_l4_field(out + ETH_LEN, olen - ETH_LEN));
	if (in->family == 4)
		CHECK(tu_verify_ip4_header(out + ETH_LEN), "%s: IPv4 header checksum", what);
	if (memcmp(out, uwant, flen) != 0) {
		tu_dump("in", uframe, flen < 78 ? flen : 78);
		tu_dump("out", out, olen < 78 ? olen : 78);
		tu_dump("want", uwant, flen < 78 ? flen : 78);
		CHECK(0, "%s: output differs from the frame built with the app's tuple", what);
	}
	return len;
}

/* The frame fr goes through the reply program untouched. */
static void expect_uplink_pass(const struct uenv *u, const uint8_t *fr, size_t flen,
			       const char *what)
{
	size_t olen;
	uint32_t rv = run_uplink(u, fr, flen, &olen);

	CHECK(rv == PASS, "%s: verdict %u, not TC_ACT_UNSPEC", what, rv);
	CHECK(mark_out == IN_MARK, "%s: passed with mark %#x", what, mark_out);
	CHECK(olen == flen && memcmp(out, fr, flen) == 0, "%s: bytes changed", what);
}

/* The IP packet pkt[0..len) in a frame of its family's ethertype passes untouched. */
static void expect_uplink_pass_pkt(const struct uenv *u, size_t len, const char *what)
{
	size_t flen = eth_frame(uframe, pkt[0] >> 4 == 4 ? ETH_P_IP : ETH_P_IPV6, pkt, len);

	expect_uplink_pass(u, uframe, flen, what);
}

/* The rewritten datagram's UDP sum steered to zero (through its first payload word, given to
 * the original too): it must leave as 0xFFFF, the from-scratch checksum's UDP form. Returns the
 * IP packet's length. */
static size_t udp_zero_sum(const struct uenv *u, const struct fastpath_udp *f, bool up)
{
	static uint8_t payload[64];
	struct tu_spec in, to;
	size_t len, l3 = f->app.family == 4 ? 20 : 40;

	if (up)
		uspec_out(&in, &to, f, sizeof(payload), 41);
	else
		uspec_in(&in, &to, f, sizeof(payload), 42);
	len = tu_build(&to, want, sizeof(want));
	CHECK(tu_steer_l4_csum(want, len, 8, 0x0000), "steer");
	memcpy(payload, want + l3 + 8, sizeof(payload));
	in.payload = to.payload = payload;
	CHECK(tu_build(&to, want, sizeof(want)) == len && tu_l4_field(want, len) == 0xffff,
	      "steered checksum %#x", tu_l4_field(want, len));
	if (up)
		expect_udp_out(u, &in, &to, "zero sum out");
	else
		expect_udp_in(u, &in, &to, "zero sum in");
	CHECK(tu_l4_field(out + ETH_LEN, len) == 0xffff, "zero sum: field %#x",
	      tu_l4_field(out + ETH_LEN, len));
	return len;
}

/* ---- a mapped flow's datagrams, both directions, both families ---- */

static void check_udp_mapped(void (*make)(struct fastpath_udp *, const struct uenv *))
{
	struct uenv u;
	struct fastpath_udp f;
	struct tu_spec in, to;
	struct fastpath_totals o0, i0, o1, i1, t;
	/* The kernel test-runs no input shorter than an Ethernet and an IP header: on the TUN,
	 * where the input is the packet, 6 bytes of payload at least. */
	static const size_t lens[] = { 6, 7, 512, 1400 };
	uint64_t bytes_out = 0, bytes_in = 0, n = 0;
	size_t len;

	uenv_up(&u, 16);
	make(&f, &u);
	uflow_add_ok(&u, &f);
	CHECK(fastpath_udp_flows(u.e.fp) == 1, "flows %llu",
	      (unsigned long long)fastpath_udp_flows(u.e.fp));
	fastpath_udp_totals(u.e.fp, &o0, &i0);
	CHECK(o0.packets == 0 && i0.packets == 0, "fresh UDP counters not zero");
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		uspec_out(&in, &to, &f, lens[i], 300 + i);
		bytes_out += expect_udp_out(&u, &in, &to, "out");
		uspec_in(&in, &to, &f, lens[i], 400 + i);
		bytes_in += expect_udp_in(&u, &in, &to, "in");
		n++;
		if (f.app.family != 4)
			continue;
		/* No checksum ("none", IPv4 only): it stays 0 both ways. */
		uspec_out(&in, &to, &f, lens[i], 500 + i);
		in.udp_no_csum = to.udp_no_csum = true;
		len = expect_udp_out(&u, &in, &to, "out, no checksum");
		CHECK(tu_l4_field(out + ETH_LEN, len) == 0, "out: a zero checksum became %#x",
		      tu_l4_field(out + ETH_LEN, len));
		bytes_out += len;
		uspec_in(&in, &to, &f, lens[i], 600 + i);
		in.udp_no_csum = to.udp_no_csum = true;
		len = expect_udp_in(&u, &in, &to, "in, no checksum");
		CHECK(tu_l4_field(out + ETH_LEN, len) == 0, "in: a zero checksum became %#x",
		      tu_l4_field(out + ETH_LEN, len));
		bytes_in += len;
		n++;
	}
	bytes_out += udp_zero_sum(&u, &f, true);
	bytes_in += udp_zero_sum(&u, &f, false);
	n++;

	fastpath_udp_totals(u.e.fp, &o1, &i1);
	fastpath_totals(u.e.fp, &t);
	CHECK(t.packets == 0, "the TCP counters moved: %llu", (unsigned long long)t.packets);
	CHECK(o1.packets - o0.packets == n && o1.segments - o0.segments == n &&
	      o1.bytes - o0.bytes == bytes_out && o1.failed == 0,
	      "out: %llu packets, %llu segments, %llu bytes; want %llu, %llu",
	      (unsigned long long)(o1.packets - o0.packets),
	      (unsigned long long)(o1.segments - o0.segments),
	      (unsigned long long)(o1.bytes - o0.bytes), (unsigned long long)n,
	      (unsigned long long)bytes_out);
	CHECK(i1.packets - i0.packets == n && i1.segments - i0.segments == n &&
	      i1.bytes - i0.bytes == bytes_in && i1.failed == 0,
	      "in: %llu packets, %llu segments, %llu bytes; want %llu, %llu",
	      (unsigned long long)(i1.packets - i0.packets),
	      (unsigned long long)(i1.segments - i0.segments),
	      (unsigned long long)(i1.bytes - i0.bytes), (unsigned long long)n,
	      (unsigned long long)bytes_in);

	/* Taken out: both directions pass. */
	fastpath_udp_del(u.e.fp, &f);
	CHECK(fastpath_udp_flows(u.e.fp) == 0, "flows %llu after the del",
	      (unsigned long long)fastpath_udp_flows(u.e.fp));
	CHECK(fastpath_udp_seen(u.e.fp, &f) == -ENOENT, "seen after the del");
	uspec_out(&in, &to, &f, 100, 1);
	expect_pass(&u.e, pkt, build(&in), "out after the del");
	uspec_in(&in, &to, &f, 100, 2);
	expect_uplink_pass_pkt(&u, build(&in), "in after the del");
	uenv_down(&u);
}

static void scenario_udp_v4(void)
{
	check_udp_mapped(uflow_v4);
}

static void scenario_udp_v6(void)
{
	check_udp_mapped(uflow_v6);
}

Test(fastpath, udp_v4_flow_both_ways)
{
	run_in_netns(scenario_udp_v4);
}

Test(fastpath, udp_v6_flow_both_ways)
{
	run_in_netns(scenario_udp_v6);
}

/* ---- what goes through untouched, and the uplink's MTU ---- */

static void check_udp_pass_family(struct uenv *u, void (*make)(struct fastpath_udp *,
							       const struct uenv *))
{
	struct fastpath_udp f;
	struct tu_spec in, to;
	uint8_t fam;
	size_t len, l3, flen;
	uint32_t rv;

	make(&f, u);
	fam = f.app.family;
	l3 = fam == 4 ? 20 : 40;
	uflow_add_ok(u, &f);

	/* Unmapped: another source port, another remote, another remote port in. */
	uspec_out(&in, &to, &f, 100, 1);
	in.sport++;
	expect_pass(&u->e, pkt, build(&in), "out: other source port");
	in.sport--;
	in.dst[fam == 4 ? 3 : 15] ^= 1;
	expect_pass(&u->e, pkt, build(&in), "out: other remote");
	uspec_in(&in, &to, &f, 100, 2);
	in.sport++;
	expect_uplink_pass_pkt(u, build(&in), "in: other remote port");

	/* TCP with the flow's tuple, both ways. */
	spec_base(&in, fam, 50, 3);
	spec_set(&in, fam, f.app.src, ntohs(f.app.sport_be), f.app.dst, ntohs(f.app.dport_be));
	expect_pass(&u->e, pkt, build(&in), "out: TCP with the flow's tuple");
	spec_set(&in, fam, f.app.dst, ntohs(f.app.dport_be), f.local, ntohs(f.lport_be));
	expect_uplink_pass_pkt(u, build(&in), "in: TCP with the flow's tuple");

	if (fam == 4) {
		static const uint16_t frags[] = { 0x2000, 0x0010, 0x2010, 0x6000, 0x1fff };

		for (size_t i = 0; i < sizeof(frags) / sizeof(frags[0]); i++) {
			uspec_out(&in, &to, &f, 80, 4);
			in.ip4_frag = frags[i];
			expect_pass(&u->e, pkt, build(&in), "out: IPv4 fragment");
			uspec_in(&in, &to, &f, 80, 5);
			in.ip4_frag = frags[i];
			expect_uplink_pass_pkt(u, build(&in), "in: IPv4 fragment");
		}
		uspec_out(&in, &to, &f, 50, 6);
		in.ip4_opts_len = 4;
		memcpy(in.ip4_opts, "\x01\x01\x01\x00", 4);
		expect_pass(&u->e, pkt, build(&in), "out: IPv4 options");
		uspec_in(&in, &to, &f, 50, 6);
		in.ip4_opts_len = 4;
		memcpy(in.ip4_opts, "\x01\x01\x01\x00", 4);
		expect_uplink_pass_pkt(u, build(&in), "in: IPv4 options");
	} else {
		static const uint8_t types[] = { 0, 60, 43, 44 };

		for (size_t i = 0; i < sizeof(types); i++) {
			uspec_out(&in, &to, &f, 50, 7);
			in.ext[0] = (struct tu_ext){ .type = types[i], .hdr_len = 0 };
			in.ext_n = 1;
			expect_pass(&u->e, pkt, build(&in), "out: IPv6 extension header");
			uspec_in(&in, &to, &f, 50, 7);
			in.ext[0] = (struct tu_ext){ .type = types[i], .hdr_len = 0 };
			in.ext_n = 1;
			expect_uplink_pass_pkt(u, build(&in), "in: IPv6 extension header");
		}
	}

	/* The reply in a frame of another ethertype: 802.1Q-tagged (tag, then the IP ethertype),
	 * ARP, the other IP family's. */
	uspec_in(&in, &to, &f, 60, 8);
	len = build(&in);
	flen = eth_frame(uframe, ETH_P_8021Q, pkt, len);
	memmove(uframe + 18, uframe + 14, len);
	tu_put16(uframe + 14, 5);
	tu_put16(uframe + 16, fam == 4 ? ETH_P_IP : ETH_P_IPV6);
	expect_uplink_pass(u, uframe, flen + 4, "in: VLAN-tagged");
	flen = eth_frame(uframe, ETH_P_ARP, pkt, len);
	expect_uplink_pass(u, uframe, flen, "in: ARP ethertype");
	flen = eth_frame(uframe, fam == 4 ? ETH_P_IPV6 : ETH_P_IP, pkt, len);
	expect_uplink_pass(u, uframe, flen, "in: the other family's ethertype");

	/* The uplink's MTU: a datagram of exactly the MTU goes, one byte more (up to what the
	 * link-layer header would hide) passes to userspace. */
	uspec_out(&in, &to, &f, UPLINK_MTU - l3 - 8, 9);
	expect_udp_out(u, &in, &to, "out: datagram of the uplink's MTU");
	for (size_t extra = 1; extra <= ETH_LEN; extra += ETH_LEN - 1) {
		uspec_out(&in, &to, &f, UPLINK_MTU - l3 - 8 + extra, 10);
		expect_pass(&u->e, pkt, build(&in), "out: larger than the uplink's MTU");
	}
	/* GSO: segments that fit go (counted as such); segments that do not, pass. */
	uspec_out(&in, &to, &f, 3 * 1000, 11);
	len = build(&in);
	rv = run_gso(&u->e, pkt, len, fam == 4 ? ETH_P_IP : ETH_P_IPV6, 3, 1000, &len);
	CHECK(rv == TC_ACT_REDIRECT, "out: GSO of 1000-byte segments: verdict %u", rv);
	uspec_out(&in, &to, &f, 2 * (UPLINK_MTU - l3 - 8 + 1), 12);
	len = build(&in);
	rv = run_gso(&u->e, pkt, len, fam == 4 ? ETH_P_IP : ETH_P_IPV6, 2,
		     (uint32_t)(UPLINK_MTU - l3 - 8 + 1), &flen);
	CHECK(rv == PASS && flen == len && memcmp(out, pkt, len) == 0,
	      "out: GSO of segments one byte over the MTU: verdict %u", rv);
	fastpath_udp_del(u->e.fp, &f);
}

static void scenario_udp_pass(void)
{
	struct uenv u;
	struct fastpath_totals o, i;
	size_t l4 = 8;

	uenv_up(&u, 16);
	check_udp_pass_family(&u, uflow_v4);
	check_udp_pass_family(&u, uflow_v6);
	/* Counted: per family the datagram of the MTU and the GSO packet (3 segments). */
	fastpath_udp_totals(u.e.fp, &o, &i);
	CHECK(o.packets == 4 && o.segments == 8 && i.packets == 0,
	      "out %llu packets, %llu segments; in %llu packets", (unsigned long long)o.packets,
	      (unsigned long long)o.segments, (unsigned long long)i.packets);
	CHECK(o.bytes == 2 * UPLINK_MTU + (20 + l4 + 3000) + (40 + l4 + 3000), "out %llu bytes",
	      (unsigned long long)o.bytes);
	uenv_down(&u);
}

Test(fastpath, udp_passes_what_it_must_not_touch)
{
	run_in_netns(scenario_udp_pass);
}

/* ---- datagrams out only while the socket is there; QUIC handshakes to userspace ---- */

/* A UDP socket on the wildcard address and port lport_be of family fam, with mark. */
static int udp_sock(uint8_t fam, uint16_t lport_be, uint32_t mark)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd = socket(fam == 4 ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0, "socket: %s", strerror(errno));
	memset(&ss, 0, sizeof(ss));
	if (fam == 4) {
		((struct sockaddr_in *)&ss)->sin_family = AF_INET;
		((struct sockaddr_in *)&ss)->sin_port = lport_be;
		len = sizeof(struct sockaddr_in);
	} else {
		((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
		((struct sockaddr_in6 *)&ss)->sin6_port = lport_be;
		len = sizeof(struct sockaddr_in6);
	}
	CHECK(setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) == 0, "SO_MARK: %s",
	      strerror(errno));
	CHECK(bind(fd, (struct sockaddr *)&ss, len) == 0, "bind: %s", strerror(errno));
	return fd;
}

static void check_udp_socket(struct uenv *u, void (*make)(struct fastpath_udp *,
							 const struct uenv *))
{
	struct fastpath_udp f;
	struct tu_spec in, to;
	int fd;

	make(&f, u);
	f.sock_bound_dev = false;
	uflow_add_ok(u, &f);
	/* No socket on the port: a left-over entry must not send from it. */
	uspec_out(&in, &to, &f, 40, 1);
	expect_pass(&u->e, pkt, build(&in), "out: no socket on the flow's port");
	/* Another program's socket (another mark) on it: the same. */
	fd = udp_sock(f.app.family, f.lport_be, FLOW_MARK + 1);
	expect_pass(&u->e, pkt, build(&in), "out: a socket with another mark on the flow's port");
	close(fd);
	/* The flow's socket: out it goes. */
	fd = udp_sock(f.app.family, f.lport_be, FLOW_MARK);
	expect_udp_out(u, &in, &to, "out: the flow's socket there");
	close(fd);
	expect_pass(&u->e, pkt, build(&in), "out: the socket closed again");
	/* Replies are the reply program's: no socket check there (it goes with the process).
	 * A reply is activity too: the flow's time moves with it. */
	int64_t seen0 = fastpath_udp_seen(u->e.fp, &f);

	usleep(2000);
	uspec_in(&in, &to, &f, 40, 2);
	expect_udp_in(u, &in, &to, "in: without the socket");
	CHECK(fastpath_udp_seen(u->e.fp, &f) > seen0 + 1000000, "seen %lld did not move with a "
	      "reply (was %lld)", (long long)fastpath_udp_seen(u->e.fp, &f), (long long)seen0);
	fastpath_udp_del(u->e.fp, &f);
}

static void check_udp_quic(struct uenv *u)
{
	struct fastpath_udp f;
	struct tu_spec in, to;
	uint8_t payload[40];

	uflow_v4(&f, u);
	f.quic_handshakes = true;
	uflow_add_ok(u, &f);
	memset(payload, 0x11, sizeof(payload));
	uspec_out(&in, &to, &f, sizeof(payload), 1);
	in.payload = to.payload = payload;
	/* A long header (first bit set): userspace looks at it. */
	payload[0] = 0xc3;
	expect_pass(&u->e, pkt, build(&in), "out: a QUIC long-header datagram");
	/* A short header: out it goes. */
	payload[0] = 0x43;
	expect_udp_out(u, &in, &to, "out: a QUIC short-header datagram");
	fastpath_udp_del(u->e.fp, &f);
	/* Without the flag the long header goes out too. */
	f.quic_handshakes = false;
	uflow_add_ok(u, &f);
	payload[0] = 0xc3;
	expect_udp_out(u, &in, &to, "out: a long header without the flag");
	fastpath_udp_del(u->e.fp, &f);
}

static void scenario_udp_socket(void)
{
	struct uenv u;

	uenv_up(&u, 16);
	check_udp_socket(&u, uflow_v4);
	check_udp_socket(&u, uflow_v6);
	check_udp_quic(&u);
	uenv_down(&u);
}

Test(fastpath, udp_out_only_with_the_socket_and_quic_handshakes_to_userspace)
{
	run_in_netns(scenario_udp_socket);
}

/* ---- the maps' room, and adds that cannot be ---- */

static void scenario_udp_room(void)
{
	struct uenv u;
	struct fastpath_udp a, b, c;
	struct tu_spec in, to;
	char err[256] = "";
	struct fastpath *off;
	int ret;

	uenv_up(&u, 1);
	uflow_v4(&a, &u);
	uflow_v6(&b, &u);
	uflow_add_ok(&u, &a);
	ret = fastpath_udp_add(u.e.fp, &b);
	CHECK(ret == -E2BIG, "second flow in room for one: %d (%s)", ret, strerror(-ret));
	CHECK(fastpath_udp_flows(u.e.fp) == 1, "flows %llu",
	      (unsigned long long)fastpath_udp_flows(u.e.fp));
	CHECK(fastpath_udp_seen(u.e.fp, &b) == -ENOENT, "the refused flow is in udp_out");
	ret = fastpath_udp_add(u.e.fp, &a);
	CHECK(ret == -EEXIST, "the same flow twice: %d", ret);
	uspec_out(&in, &to, &a, 20, 1);
	expect_udp_out(&u, &in, &to, "first flow out");
	uspec_in(&in, &to, &a, 20, 2);
	expect_udp_in(&u, &in, &to, "first flow in");
	fastpath_udp_del(u.e.fp, &a);
	uenv_down(&u);
	sh_ok("ip link del " UPLINK);

	/* The reply side taken (another app source on the same socket and remote): the flow's
	 * datagram side is taken out again. */
	uenv_up(&u, 4);
	uflow_v4(&a, &u);
	c = a;
	c.app.sport_be = htons(40001);
	uflow_add_ok(&u, &a);
	ret = fastpath_udp_add(u.e.fp, &c);
	CHECK(ret == -EEXIST, "a flow whose reply key is taken: %d", ret);
	CHECK(fastpath_udp_seen(u.e.fp, &c) == -ENOENT, "its udp_out entry stayed");
	CHECK(fastpath_udp_seen(u.e.fp, &a) > 0, "the first flow's entry went");
	CHECK(fastpath_udp_flows(u.e.fp) == 1, "flows %llu",
	      (unsigned long long)fastpath_udp_flows(u.e.fp));
	uspec_out(&in, &to, &c, 20, 3);
	expect_pass(&u.e, pkt, build(&in), "the refused flow's datagram");
	uenv_down(&u);

	/* No room for UDP asked: no add, no uplink. */
	CHECK(fastpath_open(4, 0, &off, err, sizeof(err)) == 0, "%s", err);
	ret = fastpath_udp_add(off, &a);
	CHECK(ret == -EINVAL, "add without UDP room: %d", ret);
	err[0] = '\0';
	ret = fastpath_udp_uplink(off, a.uplink, err, sizeof(err));
	CHECK(ret == -EINVAL && err[0], "uplink without UDP room: %d \"%s\"", ret, err);
	CHECK(fastpath_udp_seen(off, &a) == -ENOENT, "seen without UDP room");
	fastpath_udp_del(off, &a);
	fastpath_free(off);
}

Test(fastpath, udp_room_and_refused_adds)
{
	run_in_netns(scenario_udp_room);
}

Test(fastpath, open_rejects_bad_udp_sizes)
{
	static const uint32_t bad[] = { FASTPATH_MAX_UDP_FLOWS + 1, UINT32_MAX };
	struct fastpath *fp = (struct fastpath *)&fp;
	char err[256];
	int ret;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		ret = fastpath_open(4, bad[i], &fp, err, sizeof(err));
		cr_assert_eq(ret, -EINVAL, "fastpath_open(4, %u) = %d", bad[i], ret);
		cr_assert_null(fp, "fastpath_open(4, %u) left an object", bad[i]);
		cr_assert(strstr(err, "UDP flows") != NULL, "fastpath_open(4, %u): message \"%s\"",
			  bad[i], err);
	}
}

/* ---- the reply program on uplinks' ingress ---- */

static int filters_of(const char *dev, const char *hook, const char *what)
{
	char cmd[128], buf[4096];
	int n = 0;

	snprintf(cmd, sizeof(cmd), "tc filter show dev %s %s 2>&1", dev, hook);
	sh(cmd, buf, sizeof(buf));
	for (const char *p = buf; (p = strstr(p, what)) != NULL; p++)
		n++;
	return n;
}

static bool clsact_on(const char *dev)
{
	char cmd[128], buf[4096];

	snprintf(cmd, sizeof(cmd), "tc qdisc show dev %s 2>&1", dev);
	sh(cmd, buf, sizeof(buf));
	return strstr(buf, "qdisc clsact") != NULL;
}

static uint32_t tcx_in(const char *dev)
{
	return tcx_progs((int)if_nametoindex(dev), TCX_INGRESS, NULL);
}

static void scenario_uplink_attach(void)
{
	struct uenv u;
	char err[256] = "", name[16];
	struct bpf_prog_info info;
	uint32_t ilen = sizeof(info);
	int ret;

	if (system("tc qdisc show >/dev/null 2>&1") != 0)
		child_report(SKIP_STATUS, "no tc(8) to look at the qdiscs with");
	uenv_up(&u, 4);
	/* The reply program on the uplink's tcx ingress only; no qdisc added. */
	CHECK(!clsact_on(UPLINK), "a clsact qdisc on the uplink");
	CHECK(tcx_progs(u.uplink, TCX_EGRESS, NULL) == 0, "a program on the uplink's egress");
	memset(&info, 0, sizeof(info));
	CHECK(bpf_obj_get_info_by_fd(u.reply, &info, &ilen) == 0, "%s", strerror(errno));
	CHECK(strcmp(info.name, "fastpath_uplink") == 0, "the link runs \"%s\"", info.name);
	/* Again: nothing more. */
	ret = fastpath_udp_uplink(u.e.fp, u.uplink, err, sizeof(err));
	CHECK(ret == 0 && tcx_in(UPLINK) == 1, "second call: %d, %u programs", ret,
	      tcx_in(UPLINK));
	/* Not an Ethernet device (the TUN), no such device. */
	err[0] = '\0';
	ret = fastpath_udp_uplink(u.e.fp, u.e.ifindex, err, sizeof(err));
	CHECK(ret == -EOPNOTSUPP && err[0], "the TUN as an uplink: %d \"%s\"", ret, err);
	CHECK(tcx_in(TUN_NAME) == 0, "a program on the TUN's ingress");
	err[0] = '\0';
	ret = fastpath_udp_uplink(u.e.fp, u.uplink + 1000, err, sizeof(err));
	CHECK(ret < 0 && err[0], "a missing device: %d \"%s\"", ret, err);
	/* A device with a clsact and a filter of someone else's: both stay, both work on. */
	uplink_add("fpu1");
	sh_ok("tc qdisc add dev fpu1 clsact");
	sh_ok("tc filter add dev fpu1 ingress pref 2 protocol all u32 match u32 0 0");
	ret = fastpath_udp_uplink(u.e.fp, (int)if_nametoindex("fpu1"), err, sizeof(err));
	CHECK(ret == 0, "fpu1: %d %s", ret, err);
	CHECK(tcx_in("fpu1") == 1 && filters_of("fpu1", "ingress", "pref 2 u32") > 0,
	      "fpu1: %u tcx programs, the other filter %s", tcx_in("fpu1"),
	      filters_of("fpu1", "ingress", "pref 2 u32") > 0 ? "there" : "gone");
	/* Up to FASTPATH_MAX_UPLINKS devices. */
	for (int i = 2; i < FASTPATH_MAX_UPLINKS; i++) {
		snprintf(name, sizeof(name), "fpu%d", i);
		uplink_add(name);
		ret = fastpath_udp_uplink(u.e.fp, (int)if_nametoindex(name), err, sizeof(err));
		CHECK(ret == 0, "%s: %d %s", name, ret, err);
	}
	uplink_add("fpu99");
	err[0] = '\0';
	ret = fastpath_udp_uplink(u.e.fp, (int)if_nametoindex("fpu99"), err, sizeof(err));
	CHECK(ret == -ENOSPC && err[0], "one uplink too many: %d \"%s\"", ret, err);
	CHECK(tcx_in("fpu99") == 0, "a program on the refused device");

	/* Freed: our links gone everywhere, the other's qdisc and filter stay. */
	uenv_down(&u);
	CHECK(tcx_in(UPLINK) == 0, "the reply program left on the uplink after fastpath_free");
	for (int i = 1; i < FASTPATH_MAX_UPLINKS; i++) {
		snprintf(name, sizeof(name), "fpu%d", i);
		CHECK(tcx_in(name) == 0, "the reply program left on %s", name);
	}
	CHECK(clsact_on("fpu1") && filters_of("fpu1", "ingress", "pref 2 u32") > 0,
	      "fpu1's qdisc or filter gone after free");
}

Test(fastpath, uplink_attach_and_free)
{
	run_in_netns(scenario_uplink_attach);
}
