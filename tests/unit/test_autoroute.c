/* test_autoroute.c — tun.auto_route / strict_route: the planned rule set as data, then the
 * installed one against the kernel in fresh network namespaces (tests/unit/netns_child.h).
 *
 * Namespace topology (both ends are TUN devices held open by the child, so they have carrier):
 *
 *     up0  10.0.0.2/24, fd00::2/64      main: default via 10.0.0.1 / fd00::1 (the "uplink")
 *     tst0 198.18.0.1/30, fdfe::1/126   plays the proxy's TUN
 *
 * The kernel's verdicts are read with `ip route get` (marks, uids, ports) and with
 * netlink_route_get_ex; "leaves nothing behind" compares the text of ip rule / ip route show
 * table all before and after.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/if_tun.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

#include "core/log.h"
#include "runtime/autoroute.h"
#include "netns_child.h"
#include "testutil.h"

/* ---- the plan as text ---- */

static const struct autoroute_mark default_mark = { 0x74000000, 0xff000000 };

static void base_opts(struct autoroute_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->tun_ifindex = 7;
	o->tun_name = "tun0";
	o->has_addr4 = o->has_addr6 = true;
	o->marks = &default_mark;
	o->n_marks = 1;
}

static struct netaddr a_(const char *s)
{
	struct netaddr a;

	cr_assert_eq(netaddr_parse(s, &a), 0, "%s", s);
	return a;
}

static struct netaddr_cidr c_(const char *s)
{
	struct netaddr_cidr c;

	cr_assert_eq(netaddr_parse_cidr(s, &c), 0, "%s", s);
	return c;
}

/* The plan, one formatted step per line. */
static void plan_text(const struct autoroute_opts *o, const struct netaddr *gw, size_t n_gw,
		      char *buf, size_t len)
{
	struct autoroute_step steps[64];
	size_t n = autoroute_plan(o, gw, n_gw, steps, 64), off = 0;
	char line[160];

	cr_assert_leq(n, 64);
	buf[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		autoroute_step_format(&steps[i], line, sizeof(line));
		off += (size_t)snprintf(buf + off, len - off, "%s\n", line);
		cr_assert_lt(off, len);
	}
}

static void expect_plan(const struct autoroute_opts *o, const struct netaddr *gw, size_t n_gw,
			const char *want)
{
	char got[8192];

	plan_text(o, gw, n_gw, got, sizeof(got));
	cr_assert_str_eq(got, want);
}

Test(autoroute_plan, defaults)
{
	struct autoroute_opts o;

	base_opts(&o);
	expect_plan(&o, NULL, 0,
		    "ipv4 route 0.0.0.0/0 oif 7 table 29811\n"
		    "ipv6 route ::/0 oif 7 table 29811\n"
		    "ipv4 rule 8719: nop\n"
		    "ipv4 rule 8700: fwmark 0x74000000/0xff000000 goto 8719\n"
		    "ipv4 rule 8705: lookup 254 suppress_prefixlength 0\n"
		    "ipv4 rule 8706: lookup 29811\n"
		    "ipv6 rule 8719: nop\n"
		    "ipv6 rule 8700: fwmark 0x74000000/0xff000000 goto 8719\n"
		    "ipv6 rule 8705: lookup 254 suppress_prefixlength 0\n"
		    "ipv6 rule 8706: lookup 29811\n");
}

Test(autoroute_plan, strict_dns_exclusions_gateways)
{
	struct autoroute_opts o;
	struct netaddr_cidr ex[2] = { c_("203.0.113.7/24"), c_("2001:db8:1::/48") };
	struct netaddr srv[2] = { a_("192.0.2.50"), a_("10.0.0.1") };
	struct netaddr gw[2] = { a_("10.0.0.1"), a_("fe80::1") };

	base_opts(&o);
	o.strict = o.dns_hijack = true;
	o.table = 100;
	o.priority = 5000;
	o.exclude = ex;
	o.n_exclude = 2;
	o.servers = srv;
	o.n_servers = 2;
	/* Host bits of an exclusion are cleared; a server that is also the gateway appears once;
	 * no suppress rule (strict): the LAN is captured too. */
	expect_plan(&o, gw, 2,
		    "ipv4 route 0.0.0.0/0 oif 7 table 100\n"
		    "ipv6 route ::/0 oif 7 table 100\n"
		    "ipv4 rule 5019: nop\n"
		    "ipv4 rule 5000: fwmark 0x74000000/0xff000000 goto 5019\n"
		    "ipv4 rule 5003: ipproto 17 dport 53 lookup 100\n"
		    "ipv4 rule 5003: ipproto 6 dport 53 lookup 100\n"
		    "ipv4 rule 5004: to 203.0.113.0/24 goto 5019\n"
		    "ipv4 rule 5004: to 192.0.2.50/32 goto 5019\n"
		    "ipv4 rule 5004: to 10.0.0.1/32 goto 5019\n"
		    "ipv4 rule 5006: lookup 100\n"
		    "ipv6 rule 5019: nop\n"
		    "ipv6 rule 5000: fwmark 0x74000000/0xff000000 goto 5019\n"
		    "ipv6 rule 5003: ipproto 17 dport 53 lookup 100\n"
		    "ipv6 rule 5003: ipproto 6 dport 53 lookup 100\n"
		    "ipv6 rule 5004: to 2001:db8:1::/48 goto 5019\n"
		    "ipv6 rule 5004: to fe80::1/128 goto 5019\n"
		    "ipv6 rule 5006: lookup 100\n");
	/* DNS hijack only matters with strict. */
	o.strict = false;
	char got[8192];
	plan_text(&o, gw, 2, got, sizeof(got));
	cr_assert_null(strstr(got, "dport 53"), "%s", got);
	cr_assert_not_null(strstr(got, "suppress_prefixlength 0"), "%s", got);
	/* ...unless the proxy's own resolver answers it (fake-IP needs every query): captured
	 * before the suppress rule sends a LAN resolver's traffic to main. */
	o.dns_capture = true;
	plan_text(&o, gw, 2, got, sizeof(got));
	cr_assert_not_null(strstr(got, "ipv4 rule 5003: ipproto 17 dport 53 lookup 100\n"
				       "ipv4 rule 5003: ipproto 6 dport 53 lookup 100\n"), "%s", got);
	cr_assert(strstr(got, "dport 53") < strstr(got, "suppress_prefixlength 0"), "%s", got);
}

Test(autoroute_plan, uids_and_interfaces)
{
	struct autoroute_opts o;
	struct autoroute_uid_range inc[2] = { { 1000, 1999 }, { 5000, 5000 } };
	struct autoroute_uid_range exc[1] = { { 1500, 1500 } };
	const char *ifs[2] = { "docker0", "wg0" };

	base_opts(&o);
	o.has_addr6 = false;
	o.include_uid = inc;
	o.n_include_uid = 2;
	o.exclude_uid = exc;
	o.n_exclude_uid = 1;
	o.exclude_interface = ifs;
	o.n_exclude_interface = 2;
	expect_plan(&o, NULL, 0,
		    "ipv4 route 0.0.0.0/0 oif 7 table 29811\n"
		    "ipv4 rule 8719: nop\n"
		    "ipv4 rule 8700: fwmark 0x74000000/0xff000000 goto 8719\n"
		    "ipv4 rule 8701: uidrange 1500-1500 goto 8719\n"
		    "ipv4 rule 8702: iif docker0 goto 8719\n"
		    "ipv4 rule 8702: iif wg0 goto 8719\n"
		    "ipv4 rule 8705: lookup 254 suppress_prefixlength 0\n"
		    "ipv4 rule 8706: uidrange 1000-1999 lookup 29811\n"
		    "ipv4 rule 8706: uidrange 5000-5000 lookup 29811\n");
}

Test(autoroute_plan, ipv4_only_tun)
{
	struct autoroute_opts o;

	base_opts(&o);
	o.has_addr6 = false;
	o.strict = true;
	/* Strict: IPv6 is made unreachable in T rather than left to leak past the proxy. */
	expect_plan(&o, NULL, 0,
		    "ipv4 route 0.0.0.0/0 oif 7 table 29811\n"
		    "ipv6 route unreachable ::/0 table 29811\n"
		    "ipv4 rule 8719: nop\n"
		    "ipv4 rule 8700: fwmark 0x74000000/0xff000000 goto 8719\n"
		    "ipv4 rule 8706: lookup 29811\n"
		    "ipv6 rule 8719: nop\n"
		    "ipv6 rule 8700: fwmark 0x74000000/0xff000000 goto 8719\n"
		    "ipv6 rule 8706: lookup 29811\n");
	/* Not strict: IPv6 is simply not touched. */
	o.strict = false;
	expect_plan(&o, NULL, 0,
		    "ipv4 route 0.0.0.0/0 oif 7 table 29811\n"
		    "ipv4 rule 8719: nop\n"
		    "ipv4 rule 8700: fwmark 0x74000000/0xff000000 goto 8719\n"
		    "ipv4 rule 8705: lookup 254 suppress_prefixlength 0\n"
		    "ipv4 rule 8706: lookup 29811\n");
}

Test(autoroute_plan, marks_and_route_address)
{
	struct autoroute_opts o;
	struct autoroute_mark marks[4] = {
		{ 0x74000000, 0xff000000 }, { 0x2a, 0 }, { 0, 0 }, { 0x74000000, 0xff000000 }
	};
	struct netaddr_cidr ra[2] = { c_("10.0.0.0/8"), c_("172.16.5.1/12") };

	base_opts(&o);
	o.marks = marks;
	o.n_marks = 4;
	o.route_address = ra;
	o.n_route_address = 2;
	/* Distinct marks once each, mask 0 = exact, mark 0 (unmarked) has no rule; only the
	 * IPv4 CIDRs are routed, so IPv6 gets nothing although the TUN has an IPv6 address. */
	expect_plan(&o, NULL, 0,
		    "ipv4 route 10.0.0.0/8 oif 7 table 29811\n"
		    "ipv4 route 172.16.0.0/12 oif 7 table 29811\n"
		    "ipv4 rule 8719: nop\n"
		    "ipv4 rule 8700: fwmark 0x74000000/0xff000000 goto 8719\n"
		    "ipv4 rule 8700: fwmark 0x2a/0xffffffff goto 8719\n"
		    "ipv4 rule 8705: lookup 254 suppress_prefixlength 0\n"
		    "ipv4 rule 8706: lookup 29811\n");
}

Test(autoroute_plan, count_then_fill)
{
	struct autoroute_opts o;
	struct autoroute_step steps[16];
	size_t need;

	base_opts(&o);
	need = autoroute_plan(&o, NULL, 0, NULL, 0);
	cr_assert_geq(need, 10);
	cr_assert_eq(autoroute_plan(&o, NULL, 0, steps, 3), need, "the count, whatever cap");
	cr_assert_eq(autoroute_plan(&o, NULL, 0, steps, 16), 10);
}

Test(autoroute_plan, opts_check)
{
	struct autoroute_opts o;
	struct autoroute_uid_range bad_uid = { 10, 9 };
	const char *long_if = "abcdefghijklmnopq";
	char err[160];

	base_opts(&o);
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), 0);
	o.table = 254;
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "auto_route: route_table"), "%s", err);
	o.table = 0;
	o.priority = 32001;
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), -EINVAL);
	o.priority = 32000;
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), 0);
	o.exclude_uid = &bad_uid;
	o.n_exclude_uid = 1;
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), -EINVAL);
	o.n_exclude_uid = 0;
	o.exclude_interface = &long_if;
	o.n_exclude_interface = 1;
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), -EINVAL);
	o.n_exclude_interface = 0;
	o.has_addr4 = o.has_addr6 = false;
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "nothing to route"), "%s", err);
	o.strict = true; /* strict: both families unreachable is a valid (if odd) request */
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), 0);
	o.tun_name = "../x";
	cr_assert_eq(autoroute_opts_check(&o, err, sizeof(err)), -EINVAL);
}

/* ---- namespace scenarios (child side) ---- */

static void sh(const char *cmd)
{
	int st = system(cmd);

	CHECK(st == 0, "'%s' exited with %d", cmd, st);
}

static void sh_out(const char *cmd, char *buf, size_t len)
{
	FILE *f = popen(cmd, "r");
	size_t got;

	CHECK(f != NULL, "popen %s", cmd);
	got = fread(buf, 1, len - 1, f);
	buf[got] = '\0';
	pclose(f);
}

static void mklink(const char *name)
{
	struct ifreq ifr = { .ifr_flags = IFF_TUN | IFF_NO_PI };
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);

	CHECK(fd >= 0, "/dev/net/tun: %s", strerror(errno));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	CHECK(ioctl(fd, TUNSETIFF, &ifr) == 0, "TUNSETIFF %s: %s", name, strerror(errno));
}

static void setup(bool tun6)
{
	write_text("/proc/sys/net/ipv6/conf/all/accept_dad", "0");
	write_text("/proc/sys/net/ipv6/conf/default/accept_dad", "0");
	mklink("up0");
	mklink("tst0");
	sh("ip link set lo up && ip addr add 10.0.0.2/24 dev up0 && "
	   "ip -6 addr add fd00::2/64 dev up0 && ip link set up0 up && "
	   "ip route add default via 10.0.0.1 dev up0 && "
	   "ip -6 route add default via fd00::1 dev up0 && "
	   "ip addr add 198.18.0.1/30 dev tst0 && ip link set tst0 up");
	if (tun6)
		sh("ip -6 addr add fdfe::1/126 dev tst0");
}

static void snapshot(char *buf, size_t len)
{
	sh_out("ip -4 rule; ip -6 rule; ip -4 route show table all; ip -6 route show table all",
	       buf, len);
}

/* The device `ip route get ARGS` picks, or "" when the lookup fails. */
static const char *dev_for(const char *args)
{
	static char dev[32];
	char cmd[256], out[1024], *p;

	snprintf(cmd, sizeof(cmd), "ip -o route get %s 2>&1", args);
	sh_out(cmd, out, sizeof(out));
	dev[0] = '\0';
	if ((p = strstr(out, " dev ")) != NULL)
		sscanf(p + 5, "%31s", dev);
	return dev;
}

#define CHECK_DEV(args, want)                                                                   \
	do {                                                                                    \
		const char *d_ = dev_for(args);                                                 \
		CHECK(strcmp(d_, want) == 0, "route get %s: dev '%s', want %s", args, d_,      \
		      want);                                                                    \
	} while (0)

struct logbuf {
	char text[16384];
	size_t len;
};

static void sink(void *arg, enum log_level level, const char *line, size_t len)
{
	struct logbuf *b = arg;

	if (b->len + len < sizeof(b->text)) {
		memcpy(b->text + b->len, line, len);
		b->len += len;
		b->text[b->len] = '\0';
	}
}

static void logger(struct log *lg, struct logbuf *b)
{
	memset(b, 0, sizeof(*b));
	log_init(lg, LOG_LEVEL_DEBUG, -1);
	lg->clock = NULL;
	lg->sink = sink;
	lg->sink_arg = b;
}

static void tun_opts(struct autoroute_opts *o, bool tun6)
{
	memset(o, 0, sizeof(*o));
	o->tun_ifindex = (int)if_nametoindex("tst0");
	o->tun_name = "tst0";
	o->has_addr4 = true;
	o->has_addr6 = tun6;
	o->marks = &default_mark;
	o->n_marks = 1;
}

static struct autoroute *must_new(const struct autoroute_opts *o, struct log *lg)
{
	struct autoroute *ar = NULL;
	char err[256];
	int ret = autoroute_new(o, lg, &ar, err, sizeof(err));

	CHECK(ret == 0 && ar, "autoroute_new: %d %s", ret, err);
	return ar;
}

static const struct autoroute_uid_range uid1000 = { 1000, 1000 };

/* The child leaves through _exit (no LeakSanitizer pass): check explicitly, in ASan builds. */
static void child_leak_check(void)
{
#ifdef TS_LSAN
	CHECK(__lsan_do_recoverable_leak_check() == 0, "memory leaked (see the report above)");
#endif
}

/* The namespace's rules and routes are as they were before (a snapshot): nothing of ours left,
 * nothing of anyone else's touched. Then the child's leak check. */
static void expect_as_before(const char *before)
{
	char now[16384];

	snapshot(now, sizeof(now));
	CHECK(strcmp(before, now) == 0, "state differs after free:\n%.360s\n---\n%.360s", before,
	      now);
	child_leak_check();
}

static void install_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	struct netaddr_cidr ex = { { 4, { 203, 0, 113, 0 } }, 24 };
	struct netaddr srv = { 4, { 192, 0, 2, 50 } };
	const char *ifs = "up0";
	char before[16384], rules[4096];

	setup(true);
	write_text("/proc/sys/net/ipv4/ip_forward", "1");
	logger(&lg, &lb);
	tun_opts(&o, true);
	o.exclude_uid = &uid1000;
	o.n_exclude_uid = 1;
	o.exclude = &ex;
	o.n_exclude = 1;
	o.servers = &srv;
	o.n_servers = 1;
	o.exclude_interface = &ifs;
	o.n_exclude_interface = 1;
	snapshot(before, sizeof(before));
	ar = must_new(&o, &lg);

	sh_out("ip -4 rule; ip -6 rule", rules, sizeof(rules));
	CHECK(strstr(rules, "8719:\tfrom all nop proto 116") &&
	      strstr(rules, "8704:\tfrom all to 10.0.0.1 goto 8719 proto 116") &&
	      strstr(rules, "8704:\tfrom all to fd00::1 goto 8719 proto 116") &&
	      !strstr(rules, "[unresolved]"), "%.700s", rules);
	CHECK_DEV("1.1.1.1", "tst0");
	CHECK_DEV("1.1.1.1 mark 0x74000001", "up0");  /* the proxy's own traffic */
	CHECK_DEV("1.1.1.1 mark 0x75000000", "tst0"); /* outside the mask */
	CHECK_DEV("1.1.1.1 uid 1000", "up0");
	CHECK_DEV("1.1.1.1 uid 1001", "tst0");
	CHECK_DEV("203.0.113.9", "up0");
	CHECK_DEV("192.0.2.50", "up0");
	CHECK_DEV("192.0.2.51", "tst0");
	CHECK_DEV("10.0.0.7", "up0");  /* connected LAN: suppress_prefixlength 0 */
	CHECK_DEV("1.1.1.1 from 10.0.0.9 iif up0", "up0");
	CHECK_DEV("2001:db8::1", "tst0");
	CHECK_DEV("2001:db8::1 mark 0x74000000", "up0");
	CHECK_DEV("2001:db8::1 uid 1000", "up0");
	CHECK(autoroute_reconcile(ar) == 0, "a fresh install needs no repair:\n%.600s", lb.text);

	autoroute_free(ar);
	expect_as_before(before);
}

Test(autoroute_ns, install_lookups_free)
{
	run_in_netns(install_scenario);
}

static int read_rpf(const char *dev)
{
	char path[96], buf[16];
	FILE *f;
	int v = -1;

	snprintf(path, sizeof(path), "/proc/sys/net/ipv4/conf/%s/rp_filter", dev);
	CHECK((f = fopen(path, "r")) != NULL, "%s", path);
	CHECK(fgets(buf, sizeof(buf), f) != NULL, "%s", path);
	fclose(f);
	sscanf(buf, "%d", &v);
	return v;
}

static void strict_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	char before[16384];

	setup(true);
	write_text("/proc/sys/net/ipv4/conf/all/rp_filter", "0");
	write_text("/proc/sys/net/ipv4/conf/tst0/rp_filter", "1");
	write_text("/proc/sys/net/ipv4/conf/up0/rp_filter", "1");
	logger(&lg, &lb);
	tun_opts(&o, true);
	o.strict = o.dns_hijack = true;
	snapshot(before, sizeof(before));
	ar = must_new(&o, &lg);

	CHECK_DEV("10.0.0.7", "tst0");                        /* the LAN is captured too */
	CHECK_DEV("10.0.0.1", "up0");                         /* but not the gateway */
	CHECK_DEV("10.0.0.1 ipproto udp dport 53", "tst0");   /* except its DNS */
	CHECK_DEV("10.0.0.1 ipproto tcp dport 53", "tst0");
	CHECK_DEV("10.0.0.1 ipproto udp dport 53 mark 0x74000000", "up0");
	CHECK_DEV("fd00::1", "up0");
	CHECK_DEV("fd00::7", "tst0");
	CHECK(read_rpf("tst0") == 2, "TUN's rp_filter loosened");
	CHECK(strstr(lb.text, "up0 has strict reverse-path filtering"), "%.600s", lb.text);
	CHECK(autoroute_reconcile(ar) == 0, "no repair:\n%.600s", lb.text);

	autoroute_free(ar);
	CHECK(read_rpf("tst0") == 1, "TUN's rp_filter restored");
	expect_as_before(before);
}

Test(autoroute_ns, strict_dns_rp_filter)
{
	run_in_netns(strict_scenario);
}

static void ipv4_only_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct netlink nl;
	struct netlink_route rt;
	struct netaddr d6 = { 6, { 0x20, 0x01, 0x0d, 0xb8, [15] = 1 } };

	setup(false);
	tun_opts(&o, false);
	o.strict = true;
	ar = must_new(&o, NULL);
	CHECK(netlink_open(&nl) == 0, "netlink");
	/* An "unreachable" route answers EHOSTUNREACH (no route at all: ENETUNREACH). */
	CHECK(netlink_route_get_ex(&nl, &d6, 0, 0, &rt) == -EHOSTUNREACH,
	      "unmarked IPv6 fails fast");
	CHECK(netlink_route_get_ex(&nl, &d6, 0x74000000, 0, &rt) == 0 &&
	      rt.oif == (int)if_nametoindex("up0"), "marked IPv6 uses the uplink");
	CHECK_DEV("1.1.1.1", "tst0");
	netlink_close(&nl);
	autoroute_free(ar);
	CHECK_DEV("2001:db8::1", "up0");
	child_leak_check();
}

Test(autoroute_ns, ipv4_only_tun_strict)
{
	run_in_netns(ipv4_only_scenario);
}

static int count_tagged(void)
{
	char out[8192];
	int n = 0;

	sh_out("ip -4 rule; ip -6 rule; ip -4 route show table all; ip -6 route show table all",
	       out, sizeof(out));
	for (char *p = out; (p = strstr(p, "proto 116")) != NULL; p++)
		n++;
	return n;
}

static void stale_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	char before[16384];
	int st, clean;
	pid_t pid;

	setup(true);
	tun_opts(&o, true);
	snapshot(before, sizeof(before));
	ar = must_new(&o, NULL);
	clean = count_tagged();
	autoroute_free(ar);
	CHECK(count_tagged() == 0, "freed");

	/* A process that installs and dies without cleaning up (as after SIGKILL). */
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct autoroute *dead = NULL;
		char err[256];
		o.table = 4242; /* another table and base: stale cleanup must not depend on them */
		o.priority = 100;
		_exit(autoroute_new(&o, NULL, &dead, err, sizeof(err)) == 0 ? 0 : 1);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");
	CHECK(count_tagged() == clean, "the dead process's state is there");
	CHECK_DEV("1.1.1.1", "tst0");

	logger(&lg, &lb);
	o.table = 0;
	o.priority = 0;
	ar = must_new(&o, &lg);
	CHECK(strstr(lb.text, "stale"), "%.600s", lb.text);
	CHECK(count_tagged() == clean, "only ours: %d vs %d", count_tagged(), clean);
	autoroute_free(ar);
	expect_as_before(before);
}

Test(autoroute_ns, stale_state_cleaned)
{
	run_in_netns(stale_scenario);
}

static void reconcile_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	int n;

	setup(true);
	logger(&lg, &lb);
	tun_opts(&o, true);
	ar = must_new(&o, &lg);
	sh("ip -4 rule del pref 8706 && ip -6 rule del pref 8719 && "
	   "ip route del 0.0.0.0/0 table 29811");
	CHECK_DEV("1.1.1.1", "up0");                           /* capture gone */
	CHECK_DEV("2001:db8::1 mark 0x74000000", "tst0");      /* goto unresolved: a loop */
	n = autoroute_reconcile(ar);
	CHECK(n == 3, "3 repairs, got %d:\n%.600s", n, lb.text);
	CHECK(strstr(lb.text, "auto_route: re-installed ipv4 rule 8706: lookup 29811"), "%.600s",
	      lb.text);
	CHECK_DEV("1.1.1.1", "tst0");
	CHECK_DEV("2001:db8::1 mark 0x74000000", "up0");
	CHECK(autoroute_reconcile(ar) == 0, "settled");
	autoroute_free(ar);
	child_leak_check();
}

Test(autoroute_ns, reconcile_repairs)
{
	run_in_netns(reconcile_scenario);
}

static void gateway_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	char rules[4096], before[16384];
	int n;

	setup(true);
	logger(&lg, &lb);
	tun_opts(&o, true);
	o.strict = true;
	snapshot(before, sizeof(before));
	ar = must_new(&o, &lg);
	CHECK_DEV("10.0.0.1", "up0");
	CHECK_DEV("10.0.0.254", "tst0");
	sh("ip route replace default via 10.0.0.254 dev up0");
	n = autoroute_reconcile(ar);
	CHECK(n == 2, "one added, one removed: %d\n%.600s", n, lb.text);
	sh_out("ip -4 rule", rules, sizeof(rules));
	CHECK(strstr(rules, "to 10.0.0.254 goto 8719") && !strstr(rules, "to 10.0.0.1 goto"),
	      "%.600s", rules);
	CHECK_DEV("10.0.0.1", "tst0");
	CHECK_DEV("10.0.0.254", "up0");
	CHECK(autoroute_reconcile(ar) == 0, "settled");
	autoroute_free(ar);
	sh("ip route replace default via 10.0.0.1 dev up0");
	expect_as_before(before);
}

Test(autoroute_ns, gateway_change_moves_exclusion)
{
	run_in_netns(gateway_scenario);
}

static void busy_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar, *second = NULL;
	char err[256];

	setup(true);
	tun_opts(&o, true);
	ar = must_new(&o, NULL);
	CHECK(autoroute_new(&o, NULL, &second, err, sizeof(err)) == -EBUSY && !second, "EBUSY");
	CHECK(strstr(err, "auto_route: another twinstack proxy manages routing in this network "
			  "namespace"), "%s", err);
	CHECK_DEV("1.1.1.1", "tst0"); /* the refusal did not touch the first one's rules */
	CHECK(autoroute_reconcile(ar) == 0, "intact");
	autoroute_free(ar);
	ar = must_new(&o, NULL);
	/* A replacement (a reload) keeps the namespace: between the old set's removal and the
	 * new set's install, another owner is still refused. */
	int keep = autoroute_lock_dup(ar);
	CHECK(keep >= 0, "lock dup: %d", keep);
	autoroute_free(ar);
	CHECK(autoroute_new(&o, NULL, &second, err, sizeof(err)) == -EBUSY && !second,
	      "refused between the two sets");
	struct autoroute_opts w = o;
	w.has_lock = true;
	w.lock_fd = keep;
	ar = must_new(&w, NULL);
	close(keep);
	CHECK(autoroute_new(&o, NULL, &second, err, sizeof(err)) == -EBUSY && !second,
	      "the replacement owns the namespace once the keeper is closed");
	CHECK_DEV("1.1.1.1", "tst0");
	autoroute_free(ar);
	ar = must_new(&o, NULL); /* free released it */
	autoroute_free(ar);
	child_leak_check();
}

Test(autoroute_ns, second_owner_refused)
{
	run_in_netns(busy_scenario);
}

static void rollback_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar = NULL;
	char err[256], before[16384], after[16384];
	int ret;

	setup(true);
	sh("ip -6 route add ::/0 dev up0 table 29811"); /* somebody else's route in our table */
	tun_opts(&o, true);
	snapshot(before, sizeof(before));
	ret = autoroute_new(&o, NULL, &ar, err, sizeof(err));
	CHECK(ret == -EEXIST && !ar, "refused: %d", ret);
	CHECK(strncmp(err, "auto_route: cannot add ipv6 route ::/0", 38) == 0, "%s", err);
	snapshot(after, sizeof(after));
	CHECK(strcmp(before, after) == 0, "the IPv4 route added first was taken back");
	child_leak_check();
}

Test(autoroute_ns, failed_install_rolls_back)
{
	run_in_netns(rollback_scenario);
}

/* ---- replacing the set (a reload) and sweeping a dead one ---- */

/* A socket that hears every rule and route change of the namespace, both families. */
static int monitor_open(void)
{
	static const int groups[4] = { RTNLGRP_IPV4_RULE, RTNLGRP_IPV6_RULE, RTNLGRP_IPV4_ROUTE,
				       RTNLGRP_IPV6_ROUTE };
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);

	CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "netlink monitor");
	for (int i = 0; i < 4; i++)
		CHECK(setsockopt(fd, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &groups[i],
				 sizeof(groups[i])) == 0, "join group %d", groups[i]);
	return fd;
}

/* The changes heard since monitor_open, as a string: '+' an add, '-' a removal, in order. */
static void monitor_read(int fd, char *seq, size_t len)
{
	char buf[65536];
	size_t n = 0;
	ssize_t got;

	while ((got = recv(fd, buf, sizeof(buf), 0)) > 0) {
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)got);
		     h = NLMSG_NEXT(h, got)) {
			char c = h->nlmsg_type == RTM_NEWRULE || h->nlmsg_type == RTM_NEWROUTE ? '+'
				 : h->nlmsg_type == RTM_DELRULE || h->nlmsg_type == RTM_DELROUTE ? '-'
				 : '?';
			if (n + 1 < len)
				seq[n++] = c;
		}
	}
	CHECK(got < 0 && errno == EAGAIN, "monitor overrun or error: %s", strerror(errno));
	seq[n] = '\0';
}

static void replace_scenario(void)
{
	struct autoroute_opts o, w;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	struct netaddr_cidr ex = { { 4, { 203, 0, 113, 0 } }, 24 };
	char before[16384], installed[16384], now[16384], rules[4096], seq[256], err[256];
	int mon, ret;

	setup(true);
	logger(&lg, &lb);
	tun_opts(&o, true);
	snapshot(before, sizeof(before));
	ar = must_new(&o, &lg);
	snapshot(installed, sizeof(installed));

	/* Everything moves: table, priorities, an exclusion, an excluded uid. */
	w = o;
	w.table = 4242;
	w.priority = 9000;
	w.exclude = &ex;
	w.n_exclude = 1;
	w.exclude_uid = &uid1000;
	w.n_exclude_uid = 1;
	mon = monitor_open();
	ret = autoroute_replace(ar, &w, err, sizeof(err));
	CHECK(ret == 0, "replace: %d %s", ret, err);
	monitor_read(mon, seq, sizeof(seq));
	/* Make before break: every add precedes every removal. */
	CHECK(strchr(seq, '+') && strchr(seq, '-') && !strstr(seq, "-+") && !strchr(seq, '?'),
	      "kernel saw %s", seq);
	sh_out("ip -4 rule; ip -6 rule", rules, sizeof(rules));
	CHECK(strstr(rules, "9006:\tfrom all lookup 4242 proto 116") && !strstr(rules, "8706:") &&
	      !strstr(rules, "8719:") && !strstr(rules, "[unresolved]"), "%.700s", rules);
	CHECK_DEV("1.1.1.1", "tst0");
	CHECK_DEV("1.1.1.1 mark 0x74000000", "up0");
	CHECK_DEV("203.0.113.9", "up0");
	CHECK_DEV("1.1.1.1 uid 1000", "up0");
	CHECK_DEV("2001:db8::1", "tst0");
	CHECK(autoroute_reconcile(ar) == 0, "the replaced set is the one ar plans:\n%.600s", lb.text);
	CHECK(strstr(lb.text, "auto_route: rules replaced"), "%.600s", lb.text);

	/* The same options again: nothing to do, nothing touched. */
	ret = autoroute_replace(ar, &w, err, sizeof(err));
	CHECK(ret == 0, "replace with the same: %d %s", ret, err);
	monitor_read(mon, seq, sizeof(seq));
	CHECK(seq[0] == '\0', "an unchanged set touched the kernel: %s", seq);

	/* And back: exactly the first install. */
	ret = autoroute_replace(ar, &o, err, sizeof(err));
	CHECK(ret == 0, "replace back: %d %s", ret, err);
	monitor_read(mon, seq, sizeof(seq));
	CHECK(!strstr(seq, "-+"), "kernel saw %s", seq);
	snapshot(now, sizeof(now));
	CHECK(strcmp(installed, now) == 0, "back to the first set:\n%.360s\n---\n%.360s", installed,
	      now);
	close(mon);
	autoroute_free(ar);
	expect_as_before(before);
}

Test(autoroute_ns, replace_makes_before_it_breaks)
{
	run_in_netns(replace_scenario);
}

static void replace_rollback_scenario(void)
{
	struct autoroute_opts o, w;
	struct autoroute *ar;
	char installed[16384], now[16384], err[256];
	int ret;

	setup(true);
	tun_opts(&o, true);
	ar = must_new(&o, NULL);
	sh("ip -6 route add ::/0 dev up0 table 4242"); /* somebody else's route in the new table */
	snapshot(installed, sizeof(installed));
	w = o;
	w.table = 4242;
	ret = autoroute_replace(ar, &w, err, sizeof(err));
	CHECK(ret == -EEXIST, "refused: %d", ret);
	CHECK(strncmp(err, "auto_route: cannot add ipv6 route ::/0", 38) == 0, "%s", err);
	snapshot(now, sizeof(now));
	CHECK(strcmp(installed, now) == 0, "the IPv4 route added first was taken back, the old set "
	      "stays:\n%.300s\n---\n%.300s", installed, now);
	CHECK(autoroute_reconcile(ar) == 0, "ar still plans the old set");
	CHECK_DEV("1.1.1.1", "tst0");
	/* Options that fail the check change nothing either. */
	w = o;
	w.priority = AUTOROUTE_PRIORITY_MAX + 1;
	CHECK(autoroute_replace(ar, &w, err, sizeof(err)) == -EINVAL, "bad options refused");
	autoroute_free(ar);
	sh("ip -6 route del ::/0 dev up0 table 4242");
	CHECK(count_tagged() == 0, "freed");
	child_leak_check();
}

Test(autoroute_ns, failed_replace_keeps_the_old_set)
{
	run_in_netns(replace_rollback_scenario);
}

/* ---- lookups beside the set (a reload that turns auto_route off is checked) ---- */

static void bypass_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	const uint32_t marks[2] = { 0x74000001, 0x5 }; /* exempted by the set already; new */
	char before[16384], installed[16384], now[16384], rules[4096], seq[256], err[256];
	uint32_t x = 1;
	int mon, ret;

	setup(true);
	logger(&lg, &lb);
	tun_opts(&o, true);
	snapshot(before, sizeof(before));
	ar = must_new(&o, &lg);
	snapshot(installed, sizeof(installed));
	mon = monitor_open();

	/* No rule of another owner looks at marks: the set's own mark stands in for none, and
	 * only the new mark gets a temporary exemption, one per family. Nothing is removed. */
	ret = autoroute_bypass_begin(ar, marks, 2, &x, err, sizeof(err));
	CHECK(ret == 0 && x == 0x74000000, "begin: %d 0x%x %s", ret, x, err);
	monitor_read(mon, seq, sizeof(seq));
	CHECK(strcmp(seq, "++") == 0, "kernel saw %s", seq);
	sh_out("ip -4 rule; ip -6 rule", rules, sizeof(rules));
	CHECK(strstr(rules, "8700:\tfrom all fwmark 0x5 goto 8719 proto 116"), "%.700s", rules);
	CHECK_DEV("1.1.1.1", "tst0"); /* still captured */
	CHECK_DEV("2001:db8::1", "tst0");
	CHECK_DEV("1.1.1.1 mark 0x74000000", "up0");
	CHECK_DEV("1.1.1.1 mark 0x5", "up0");
	CHECK_DEV("2001:db8::1 mark 0x5", "up0");
	autoroute_bypass_end(ar);
	monitor_read(mon, seq, sizeof(seq));
	CHECK(strcmp(seq, "--") == 0, "kernel saw %s", seq);
	snapshot(now, sizeof(now));
	CHECK(strcmp(installed, now) == 0, "exactly the set again:\n%.360s\n---\n%.360s",
	      installed, now);
	CHECK_DEV("1.1.1.1 mark 0x5", "tst0");

	/* Rules of the user's that route the set's mark and the top bit their own way: the
	 * stand-in is the next bit, which neither matches, exempted for the time being. */
	sh("ip rule add pref 100 fwmark 0x74000000/0xff000000 lookup 100 && "
	   "ip rule add pref 101 fwmark 0x80000000/0x80000000 lookup 100 && "
	   "ip rule add pref 102 not fwmark 0x0/0x1 lookup 100");
	snapshot(installed, sizeof(installed));
	monitor_read(mon, seq, sizeof(seq));
	ret = autoroute_bypass_begin(ar, NULL, 0, &x, err, sizeof(err));
	CHECK(ret == 0 && x == 0x40000000, "begin: %d 0x%x %s", ret, x, err);
	CHECK_DEV("1.1.1.1 mark 0x40000000", "up0");
	CHECK_DEV("1.1.1.1", "tst0");
	autoroute_bypass_end(ar);
	snapshot(now, sizeof(now));
	CHECK(strcmp(installed, now) == 0, "exactly the set again:\n%.360s\n---\n%.360s",
	      installed, now);

	/* A rule that matches unmarked packets only: no mark can stand in; nothing is touched. */
	sh("ip rule add pref 103 fwmark 0x0/0xffffffff lookup 100");
	snapshot(installed, sizeof(installed));
	monitor_read(mon, seq, sizeof(seq));
	ret = autoroute_bypass_begin(ar, marks, 2, &x, err, sizeof(err));
	CHECK(ret == -ENOENT && x == 0 && strncmp(err, "auto_route: ", 12) == 0, "begin: %d 0x%x %s",
	      ret, x, err);
	monitor_read(mon, seq, sizeof(seq));
	CHECK(seq[0] == '\0', "kernel saw %s", seq);
	snapshot(now, sizeof(now));
	CHECK(strcmp(installed, now) == 0, "untouched");
	autoroute_bypass_end(ar); /* without a bypass: a no-op */
	monitor_read(mon, seq, sizeof(seq));
	CHECK(seq[0] == '\0', "kernel saw %s", seq);

	/* Freed in the middle of a bypass: the temporary exemptions go with the set. */
	sh("ip rule del pref 103 && ip rule del pref 102 && ip rule del pref 101 && "
	   "ip rule del pref 100");
	ret = autoroute_bypass_begin(ar, marks, 2, &x, err, sizeof(err));
	CHECK(ret == 0 && x == 0x74000000, "begin: %d 0x%x %s", ret, x, err);
	close(mon);
	autoroute_free(ar);
	expect_as_before(before);
}

Test(autoroute_ns, bypass_looks_past_the_set_in_place)
{
	run_in_netns(bypass_scenario);
}

/* CAP_NET_ADMIN in or out of this process's effective set (kept in its permitted set): the
 * kernel checks it on each rtnetlink change, so changes fail with EPERM while it is out, on
 * a socket opened before. Programs run by sh() get it back from their exec as root. */
static void net_admin(bool on)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];

	CHECK(syscall(SYS_capget, &h, d) == 0, "capget: %s", strerror(errno));
	if (on)
		d[0].effective |= 1u << CAP_NET_ADMIN;
	else
		d[0].effective &= ~(1u << CAP_NET_ADMIN);
	CHECK(syscall(SYS_capset, &h, d) == 0, "capset: %s", strerror(errno));
}

/* The kernel refuses the changes of a bypass: refused at its start, nothing is left and the
 * error names the rule; refused at its end, the exemptions stay listed and go with the set. */
static void bypass_refused_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	const uint32_t marks[1] = { 0x5 };
	char before[16384], installed[16384], now[16384], rules[4096], err[256];
	uint32_t x = 1;
	int ret;

	setup(true);
	logger(&lg, &lb);
	tun_opts(&o, true);
	snapshot(before, sizeof(before));
	ar = must_new(&o, &lg);
	snapshot(installed, sizeof(installed));

	net_admin(false);
	ret = autoroute_bypass_begin(ar, marks, 1, &x, err, sizeof(err));
	net_admin(true);
	CHECK(ret == -EPERM && x == 0, "begin: %d 0x%x %s", ret, x, err);
	CHECK(strstr(err, "auto_route: cannot add ") && strstr(err, "fwmark 0x5") &&
	      strstr(err, strerror(EPERM)), "%s", err);
	snapshot(now, sizeof(now));
	CHECK(strcmp(installed, now) == 0, "untouched:\n%.360s\n---\n%.360s", installed, now);
	CHECK_DEV("1.1.1.1 mark 0x5", "tst0"); /* no exemption was left */

	ret = autoroute_bypass_begin(ar, marks, 1, &x, err, sizeof(err));
	CHECK(ret == 0 && x == 0x74000000, "begin: %d 0x%x %s", ret, x, err);
	CHECK_DEV("1.1.1.1 mark 0x5", "up0");
	net_admin(false);
	autoroute_bypass_end(ar);
	net_admin(true);
	CHECK(strstr(lb.text, "auto_route: cannot remove "), "%.600s", lb.text);
	sh_out("ip -4 rule; ip -6 rule", rules, sizeof(rules));
	CHECK(strstr(rules, "fwmark 0x5 goto"), "the exemptions stay: %.700s", rules);
	CHECK_DEV("1.1.1.1 mark 0x5", "up0");
	/* The next end tries them again. */
	autoroute_bypass_end(ar);
	snapshot(now, sizeof(now));
	CHECK(strcmp(installed, now) == 0, "exactly the set again:\n%.360s\n---\n%.360s",
	      installed, now);

	/* Refused at the end once more, then freed: they go with the set. */
	ret = autoroute_bypass_begin(ar, marks, 1, &x, err, sizeof(err));
	CHECK(ret == 0, "begin: %d %s", ret, err);
	net_admin(false);
	autoroute_bypass_end(ar);
	net_admin(true);
	autoroute_free(ar);
	expect_as_before(before);
}

Test(autoroute_ns, bypass_refused_by_the_kernel_leaves_nothing)
{
	run_in_netns(bypass_refused_scenario);
}

/* A replacement whose removals the kernel refuses (an exclusion taken out): the old rule stays
 * while the process runs, a repair removes it, and if none did, it goes with the set. */
static void replace_refused_scenario(void)
{
	struct autoroute_opts o, w;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	struct netaddr_cidr ex = { { 4, { 203, 0, 113, 0 } }, 24 };
	char before[16384], rules[4096], err[256];
	int ret, tagged;

	setup(true);
	logger(&lg, &lb);
	tun_opts(&o, true);
	o.exclude = &ex;
	o.n_exclude = 1;
	snapshot(before, sizeof(before));
	ar = must_new(&o, &lg);
	tagged = count_tagged();
	w = o;
	w.n_exclude = 0;

	net_admin(false);
	ret = autoroute_replace(ar, &w, err, sizeof(err));
	net_admin(true);
	CHECK(ret == 0, "replace: %d %s", ret, err);
	CHECK(strstr(lb.text, "auto_route: cannot remove "), "%.600s", lb.text);
	sh_out("ip -4 rule", rules, sizeof(rules));
	CHECK(strstr(rules, "to 203.0.113.0/24"), "the old exclusion stays: %.700s", rules);
	CHECK(count_tagged() == tagged, "%d tagged, want %d", count_tagged(), tagged);
	/* The next repair removes it. */
	CHECK(autoroute_reconcile(ar) == 1, "one repair");
	CHECK(count_tagged() == tagged - 1, "%d tagged", count_tagged());

	/* Refused again, with no repair after: freeing the set removes it. */
	CHECK(autoroute_replace(ar, &o, err, sizeof(err)) == 0, "%s", err);
	CHECK(count_tagged() == tagged, "%d tagged", count_tagged());
	net_admin(false);
	ret = autoroute_replace(ar, &w, err, sizeof(err));
	net_admin(true);
	CHECK(ret == 0, "replace: %d %s", ret, err);
	CHECK(count_tagged() == tagged, "%d tagged", count_tagged());
	autoroute_free(ar);
	CHECK(count_tagged() == 0, "freed, %d tagged left", count_tagged());
	expect_as_before(before);
}

Test(autoroute_ns, replace_refused_by_the_kernel_leaves_nothing_after_free)
{
	run_in_netns(replace_refused_scenario);
}

/* A process that installs o and dies without cleaning up (as after SIGKILL). */
static void install_and_die(const struct autoroute_opts *o)
{
	int st;
	pid_t pid = fork();

	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct autoroute *dead = NULL;
		char err[256];
		_exit(autoroute_new(o, NULL, &dead, err, sizeof(err)) == 0 ? 0 : 1);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");
}

static void sweep_scenario(void)
{
	struct autoroute_opts o;
	struct autoroute *ar;
	struct log lg;
	struct logbuf lb;
	char before[16384], now[16384], err[256];
	int left, ret;

	setup(false);
	tun_opts(&o, false);
	o.strict = true; /* IPv6 unreachable in the table: the leftover that hurts */
	snapshot(before, sizeof(before));

	/* Owned by a live set: nothing touched. */
	ar = must_new(&o, NULL);
	left = count_tagged();
	CHECK(autoroute_sweep(NULL, err, sizeof(err)) == -EBUSY, "a live owner refuses the sweep");
	CHECK(strstr(err, "another twinstack proxy"), "%s", err);
	CHECK(count_tagged() == left, "nothing touched");
	autoroute_free(ar);

	install_and_die(&o);
	left = count_tagged();
	CHECK(left > 0, "the dead process's state is there");
	CHECK(dev_for("2001:db8::1")[0] == '\0', "IPv6 cut off by the leftovers");
	logger(&lg, &lb);
	ret = autoroute_sweep(&lg, err, sizeof(err));
	CHECK(ret == left, "swept %d of %d: %s", ret, left, err);
	CHECK(strstr(lb.text, "stale"), "%.600s", lb.text);
	CHECK(count_tagged() == 0, "nothing tagged left");
	CHECK_DEV("2001:db8::1", "up0");
	CHECK(autoroute_sweep(NULL, err, sizeof(err)) == 0, "a second sweep finds nothing");
	snapshot(now, sizeof(now));
	CHECK(strcmp(before, now) == 0, "state differs after the sweep");
	ar = must_new(&o, NULL); /* the sweep released the namespace */
	autoroute_free(ar);
	child_leak_check();
}

Test(autoroute_ns, sweep_removes_a_dead_owners_state)
{
	run_in_netns(sweep_scenario);
}
