/* test_netlink.c — the rtnetlink client's policy rules, table routes and route lookups against
 * the kernel, each scenario in a fresh network namespace (tests/unit/netns_child.h).
 *
 * What the client adds is read back two ways: with its own dump (the parser) and with ip(8)
 * (an independent reader), so a wrong attribute cannot hide behind a matching parser bug.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include <linux/if_tun.h>

#include "core/netlink.h"
#include "netns_child.h"

/* ---- helpers (child side) ---- */

static void sh(const char *cmd)
{
	int st = system(cmd);

	CHECK(st == 0, "'%s' exited with %d", cmd, st);
}

/* The output of cmd, NUL-terminated; fails the scenario if it does not run. */
static void sh_out(const char *cmd, char *buf, size_t len)
{
	FILE *f = popen(cmd, "r");
	size_t got;

	CHECK(f != NULL, "popen %s", cmd);
	got = fread(buf, 1, len - 1, f);
	buf[got] = '\0';
	pclose(f);
}

static struct netaddr addr(const char *s)
{
	struct netaddr a;

	CHECK(netaddr_parse(s, &a) == 0, "%s", s);
	return a;
}

/* A TUN device named name, its fd left open until the child exits (carrier on, like a real
 * interface; no dummy or veth driver is needed). */
static void mklink(const char *name)
{
	struct ifreq ifr = { .ifr_flags = IFF_TUN | IFF_NO_PI };
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);

	CHECK(fd >= 0, "/dev/net/tun: %s", strerror(errno));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	CHECK(ioctl(fd, TUNSETIFF, &ifr) == 0, "TUNSETIFF %s: %s", name, strerror(errno));
}

static void setup_links(void)
{
	write_text("/proc/sys/net/ipv6/conf/all/accept_dad", "0");
	write_text("/proc/sys/net/ipv6/conf/default/accept_dad", "0");
	mklink("d0");
	mklink("d1");
	sh("ip link set lo up && ip addr add 10.0.0.2/24 dev d0 && "
	   "ip addr add 10.1.0.2/24 dev d1 && "
	   "ip -6 addr add fd00::2/64 dev d0 && ip link set d0 up && ip link set d1 up && "
	   "ip route add default via 10.0.0.1 dev d0");
}

struct found {
	const struct netlink_rule *want;
	int hits;
	struct netlink_rule got;
};

static void on_rule_find(void *arg, const struct netlink_rule *r)
{
	struct found *f = arg;

	if (r->priority == f->want->priority && r->family == f->want->family) {
		f->hits++;
		f->got = *r;
	}
}

static int count_rule(struct netlink *nl, const struct netlink_rule *want, struct netlink_rule *got)
{
	struct found f = { want, 0, { 0 } };

	CHECK(netlink_rule_dump(nl, want->family, on_rule_find, &f) == 0, "dump");
	if (got)
		*got = f.got;
	return f.hits;
}

/* ---- rules ---- */

/* Six rules that between them use every selector and action the client knows. */
static void sample_rules(struct netlink_rule r[6])
{
	for (size_t i = 0; i < 6; i++) {
		netlink_rule_init(&r[i], i < 4 ? 4 : 6);
		r[i].protocol = 116;
	}
	r[0].priority = 100;                         /* fwmark goto */
	r[0].action = NETLINK_RULE_GOTO;
	r[0].target = 119;
	r[0].has_fwmark = true;
	r[0].fwmark = 0x74000000;
	r[0].fwmask = 0xff000000;
	r[1].priority = 101;                         /* uid range + iif, lookup a big table */
	r[1].has_uid = true;
	r[1].uid_start = 1000;
	r[1].uid_end = 1999;
	snprintf(r[1].iifname, sizeof(r[1].iifname), "d1");
	r[1].table = 29811;
	r[2].priority = 102;                         /* dst + ipproto/dport, suppress, main */
	r[2].dst = addr("203.0.113.0");
	r[2].dst_len = 24;
	r[2].ip_proto = 17;
	r[2].dport_start = r[2].dport_end = 53;
	r[2].table = 254;
	r[2].suppress_prefixlen = 0;
	r[3].priority = 119;                         /* nop */
	r[3].action = NETLINK_RULE_NOP;
	r[4] = r[2];                                 /* the same for IPv6 */
	r[4].family = 6;
	r[4].dst = addr("2001:db8::");
	r[4].dst_len = 32;
	r[5] = r[0];
	r[5].family = 6;
	r[5].has_uid = true;
	r[5].uid_start = r[5].uid_end = 0;
	r[5].invert = true;
}

static void rules_scenario(void)
{
	struct netlink nl;
	struct netlink_rule r[6], got;
	char out[4096];
	size_t i;

	setup_links();
	CHECK(netlink_open(&nl) == 0, "netlink");
	sample_rules(r);
	for (i = 0; i < 6; i++)
		CHECK(netlink_rule_add(&nl, &r[i]) == 0, "add %zu: %s", i, nl.ext_msg);
	CHECK(netlink_rule_add(&nl, &r[0]) == -EEXIST, "an identical rule is refused");

	/* Our parser reads every attribute back. */
	for (i = 0; i < 6; i++) {
		CHECK(count_rule(&nl, &r[i], &got) == 1, "rule %zu dumped once", i);
		CHECK(got.action == r[i].action && got.protocol == 116 &&
		      got.has_fwmark == r[i].has_fwmark && got.fwmark == r[i].fwmark &&
		      got.fwmask == r[i].fwmask && got.has_uid == r[i].has_uid &&
		      got.uid_start == r[i].uid_start && got.uid_end == r[i].uid_end &&
		      strcmp(got.iifname, r[i].iifname) == 0 && got.dst_len == r[i].dst_len &&
		      memcmp(got.dst.a, r[i].dst.a, 16) == 0 && got.ip_proto == r[i].ip_proto &&
		      got.dport_start == r[i].dport_start && got.dport_end == r[i].dport_end &&
		      got.suppress_prefixlen == r[i].suppress_prefixlen &&
		      got.invert == r[i].invert, "rule %zu read back", i);
		CHECK(r[i].action != NETLINK_RULE_LOOKUP || got.table == r[i].table, "table %zu",
		      i);
		CHECK(r[i].action != NETLINK_RULE_GOTO || got.target == r[i].target, "goto %zu", i);
	}

	/* ip(8) agrees. */
	sh_out("ip -4 rule", out, sizeof(out));
	CHECK(strstr(out, "100:\tfrom all fwmark 0x74000000/0xff000000 goto 119 proto 116"),
	      "%.600s", out);
	CHECK(strstr(out, "101:\tfrom all iif d1 uidrange 1000-1999 lookup 29811 proto 116"),
	      "%.600s", out);
	CHECK(strstr(out, "102:\tfrom all to 203.0.113.0/24 ipproto udp dport 53 lookup main "
			  "suppress_prefixlength 0 proto 116"), "%.600s", out);
	CHECK(strstr(out, "119:\tfrom all nop proto 116"), "%.600s", out);
	sh_out("ip -6 rule", out, sizeof(out));
	CHECK(strstr(out, "102:\tfrom all to 2001:db8::/32 ipproto udp dport 53 lookup main "
			  "suppress_prefixlength 0 proto 116"), "%.600s", out);
	/* No IPv6 rule 119: the goto is accepted but unresolved (the kernel skips it). */
	CHECK(strstr(out, "100:\tnot from all fwmark 0x74000000/0xff000000 uidrange 0-0 goto 119 "
			  "[unresolved] proto 116"), "%.600s", out);

	for (i = 0; i < 6; i++)
		CHECK(netlink_rule_del(&nl, &r[i]) == 0, "del %zu: %s", i, nl.ext_msg);
	for (i = 0; i < 6; i++)
		CHECK(count_rule(&nl, &r[i], NULL) == 0, "rule %zu gone", i);
	CHECK(netlink_rule_del(&nl, &r[0]) == -ENOENT, "deleting twice");
	netlink_close(&nl);
}

Test(netlink, rules_add_dump_del)
{
	run_in_netns(rules_scenario);
}

/* ---- routes ---- */

struct rt_seen {
	int tagged4, tagged6, unreach6;
	int main_default_gw;
	struct netaddr gw[NETLINK_RT_GW_MAX];
	struct netlink_rt last_tagged;
};

static void on_rt_seen(void *arg, const struct netlink_rt *rt)
{
	struct rt_seen *s = arg;

	if (rt->protocol == 116) {
		s->last_tagged = *rt;
		if (rt->family == 4)
			s->tagged4++;
		else
			s->tagged6++;
		if (rt->type == NETLINK_RT_UNREACHABLE && rt->family == 6)
			s->unreach6++;
	}
	if (rt->table == 254 && rt->dst_len == 0 && rt->family == 4) {
		s->main_default_gw = rt->n_gw;
		memcpy(s->gw, rt->gw, sizeof(s->gw));
	}
}

static void dump_both(struct netlink *nl, struct rt_seen *s)
{
	memset(s, 0, sizeof(*s));
	CHECK(netlink_rt_dump(nl, 4, on_rt_seen, s) == 0, "dump 4");
	CHECK(netlink_rt_dump(nl, 6, on_rt_seen, s) == 0, "dump 6");
}

static void routes_scenario(void)
{
	struct netlink nl;
	struct netlink_rt r4 = { .family = 4, .type = NETLINK_RT_UNICAST, .protocol = 116,
				 .table = 29811, .dst_len = 8 };
	struct netlink_rt r6 = { .family = 6, .type = NETLINK_RT_UNREACHABLE, .protocol = 116,
				 .table = 29811, .dst_len = 0 };
	struct rt_seen s;
	struct netaddr gw1 = { 4, { 10, 0, 0, 1 } };
	char out[4096];

	setup_links();
	CHECK(netlink_open(&nl) == 0, "netlink");
	r4.dst = addr("198.0.0.0");
	r4.oif = (int)if_nametoindex("d1");
	CHECK(netlink_rt_add(&nl, &r4) == 0, "add v4: %s", nl.ext_msg);
	CHECK(netlink_rt_add(&nl, &r6) == 0, "add v6: %s", nl.ext_msg);
	CHECK(netlink_rt_add(&nl, &r4) == -EEXIST, "added twice");
	sh_out("ip route show table 29811; ip -6 route show table 29811", out, sizeof(out));
	CHECK(strstr(out, "198.0.0.0/8 dev d1 proto 116 scope link"), "%.600s", out);
	CHECK(strstr(out, "unreachable default dev lo proto 116 metric 1024"), "%.600s", out);

	dump_both(&nl, &s);
	CHECK(s.tagged4 == 1 && s.tagged6 == 1 && s.unreach6 == 1, "%d %d %d", s.tagged4,
	      s.tagged6, s.unreach6);
	CHECK(s.main_default_gw == 1 && netaddr_eq(&s.gw[0], &gw1),
	      "the main table's default gateway");

	/* A multipath default route: every hop's gateway. */
	sh("ip route replace default nexthop via 10.0.0.1 dev d0 nexthop via 10.1.0.1 dev d1");
	dump_both(&nl, &s);
	CHECK(s.main_default_gw == 2, "%d gateways", s.main_default_gw);

	CHECK(netlink_rt_del(&nl, &r4) == 0, "del v4: %s", nl.ext_msg);
	CHECK(netlink_rt_del(&nl, &r6) == 0, "del v6: %s", nl.ext_msg);
	CHECK(netlink_rt_del(&nl, &r4) == -ESRCH, "deleting twice");
	dump_both(&nl, &s);
	CHECK(s.tagged4 == 0 && s.tagged6 == 0, "all gone");
	netlink_close(&nl);
}

Test(netlink, routes_add_dump_del)
{
	run_in_netns(routes_scenario);
}

/* ---- lookups with a mark and an output interface ---- */

static void route_get_scenario(void)
{
	struct netlink nl;
	struct netlink_route rt;
	struct netlink_rule mark_rule;
	struct netaddr dst = addr("192.0.2.1"), dst6 = addr("2001:db8::1");
	int d0, d1;

	setup_links();
	d0 = (int)if_nametoindex("d0");
	d1 = (int)if_nametoindex("d1");
	sh("ip route add default dev d1 table 100");
	CHECK(netlink_open(&nl) == 0, "netlink");
	netlink_rule_init(&mark_rule, 4);
	mark_rule.priority = 1000;
	mark_rule.has_fwmark = true;
	mark_rule.fwmark = 0x1;
	mark_rule.fwmask = 0xff;
	mark_rule.table = 100;
	CHECK(netlink_rule_add(&nl, &mark_rule) == 0, "rule: %s", nl.ext_msg);

	CHECK(netlink_route_get(&nl, &dst, &rt) == 0 && rt.oif == d0, "unmarked: main");
	CHECK(netlink_route_get_ex(&nl, &dst, 0, 0, &rt) == 0 && rt.oif == d0, "mark 0 = none");
	CHECK(netlink_route_get_ex(&nl, &dst, 0x301, 0, &rt) == 0 && rt.oif == d1,
	      "marked: table 100 (oif %d)", rt.oif);
	CHECK(netlink_route_get_ex(&nl, &dst, 0x2, 0, &rt) == 0 && rt.oif == d0,
	      "another mark: main");
	CHECK(netlink_route_get_ex(&nl, &dst, 0, d1, &rt) == 0 && rt.oif == d1,
	      "bound to d1 (oif %d)", rt.oif);
	CHECK(rt.type == 1, "unicast");
	CHECK(netlink_route_get_ex(&nl, &dst6, 0, 0, &rt) == -ENETUNREACH,
	      "no IPv6 default route");
	netlink_close(&nl);
}

Test(netlink, route_get_mark_and_oif)
{
	run_in_netns(route_get_scenario);
}
