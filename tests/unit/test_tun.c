/* test_tun.c — the TUN device for real, each scenario in a forked child that first enters a
 * fresh network namespace (and a private mount namespace with its own sysfs, so
 * /sys/class/net shows that namespace): nothing touches the host's interfaces or sysctls, and
 * the namespace with everything in it disappears when the child exits.
 *
 * The device is checked with interfaces independent of the code under test where possible:
 * ioctl(SIOCGIF*) for MTU, txqueuelen and flags, getifaddrs() for addresses,
 * /proc/net/if_inet6 for the IPv6 flags, TUNGETIFF for the queue flags. Packets: an ICMP echo
 * written into the TUN is answered by the namespace's kernel and read back.
 *
 * Needs root and /dev/net/tun; otherwise each test is skipped with the reason. The parameter
 * checks and the rp_filter verdict run without either.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/if_tun.h>

#include "core/config.h"
#include "core/netlink.h"
#include "core/tun.h"
#include "netns_child.h"
#include "testutil.h"

#ifndef TUN_F_USO4
#define TUN_F_USO4 0x20
#define TUN_F_USO6 0x40
#endif


/* Scenarios run in a child inside their own namespaces: tests/unit/netns_child.h. */

/* ---- helpers (child side) ---- */

static void params(struct tun_params *p, const char *name, const char *a4, const char *a6)
{
	tun_params_init(p);
	snprintf(p->name, sizeof(p->name), "%s", name);
	if (a4) {
		p->has_addr4 = true;
		CHECK(netaddr_parse_cidr(a4, &p->addr4) == 0, "%s", a4);
	}
	if (a6) {
		p->has_addr6 = true;
		CHECK(netaddr_parse_cidr(a6, &p->addr6) == 0, "%s", a6);
	}
}

static struct tun *open_ok(const struct tun_params *p)
{
	char err[TS_ERRLEN];
	struct tun *t = NULL;
	int ret = tun_open(p, &t, err, sizeof(err));

	CHECK(ret == 0, "tun_open(%s) = %d: %s", p->name, ret, err);
	CHECK(t != NULL, "no tun");
	return t;
}

static void set_rp_filter(const char *ifname, int all, int dev)
{
	char path[128], v[8];

	snprintf(v, sizeof(v), "%d", all);
	write_text("/proc/sys/net/ipv4/conf/all/rp_filter", v);
	snprintf(path, sizeof(path), "/proc/sys/net/ipv4/conf/%s/rp_filter", ifname);
	snprintf(v, sizeof(v), "%d", dev);
	write_text(path, v);
}

static struct ifreq ifreq_get(const char *name, unsigned long req)
{
	struct ifreq ifr;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	CHECK(s >= 0 && ioctl(s, req, &ifr) == 0, "ioctl 0x%lx on %s: %s", req, name,
	      strerror(errno));
	close(s);
	return ifr;
}

static int prefix_of(const struct sockaddr *mask)
{
	const struct sockaddr_in *m4 = (const struct sockaddr_in *)mask;
	const struct sockaddr_in6 *m6 = (const struct sockaddr_in6 *)mask;
	const uint8_t *b = mask->sa_family == AF_INET ? (const uint8_t *)&m4->sin_addr
						      : (const uint8_t *)&m6->sin6_addr;
	int n = mask->sa_family == AF_INET ? 4 : 16, bits = 0;

	for (int i = 0; i < n; i++)
		bits += __builtin_popcount(b[i]);
	return bits;
}

/* Is text/prefix on ifname, according to getifaddrs()? */
static bool has_addr(const char *ifname, const char *text, int prefix)
{
	struct ifaddrs *ifa, *i;
	uint8_t want[16];
	int fam = tu_addr(want, text);
	bool found = false;

	CHECK(getifaddrs(&ifa) == 0, "getifaddrs: %s", strerror(errno));
	for (i = ifa; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || strcmp(i->ifa_name, ifname) != 0)
			continue;
		const struct sockaddr_in *a4 = (const struct sockaddr_in *)i->ifa_addr;
		const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)i->ifa_addr;
		if (fam == 4 && i->ifa_addr->sa_family == AF_INET)
			found = memcmp(&a4->sin_addr, want, 4) == 0 &&
				prefix_of(i->ifa_netmask) == prefix;
		if (fam == 6 && i->ifa_addr->sa_family == AF_INET6)
			found = memcmp(&a6->sin6_addr, want, 16) == 0 &&
				prefix_of(i->ifa_netmask) == prefix;
	}
	freeifaddrs(ifa);
	return found;
}

/* The flags column of /proc/net/if_inet6 for hex32 (32 hex digits) on ifname, or -1. */
static int inet6_flags(const char *hex32, const char *ifname)
{
	FILE *f = fopen("/proc/net/if_inet6", "re");
	char addr[33], name[IFNAMSIZ];
	unsigned idx, plen, scope, flags;
	int ret = -1;

	CHECK(f != NULL, "/proc/net/if_inet6: %s", strerror(errno));
	while (fscanf(f, "%32s %x %x %x %x %15s", addr, &idx, &plen, &scope, &flags, name) == 6)
		if (strcmp(addr, hex32) == 0 && strcmp(name, ifname) == 0)
			ret = (int)flags;
	fclose(f);
	return ret;
}

/* ---- scenarios ---- */

static void scenario_configures_device(void)
{
	struct tun_params p;
	struct tun *t;
	struct ifreq iff;
	int fd, fl;
	char err[TS_ERRLEN];

	params(&p, "tst0", "198.18.0.1/15", "fd00:7f::1/64");
	p.mtu = 9000;
	p.txqueuelen = 10000;
	t = open_ok(&p);
	CHECK(strcmp(tun_name(t), "tst0") == 0, "%s", tun_name(t));
	CHECK(tun_created(t), "created, not attached");
	CHECK(tun_ifindex(t) == (int)if_nametoindex("tst0"), "%d", tun_ifindex(t));
	CHECK(tun_queues(t) == 1 && !tun_vnet_hdr(t) && tun_offload(t) == 0, "single plain queue");
	fd = tun_fd(t, 0);
	fl = fcntl(fd, F_GETFL);
	CHECK(fl >= 0 && (fl & O_NONBLOCK) && (fl & O_ACCMODE) == O_RDWR, "flags 0x%x", fl);
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC, "close-on-exec");
	memset(&iff, 0, sizeof(iff));
	CHECK(ioctl(fd, TUNGETIFF, &iff) == 0, "TUNGETIFF: %s", strerror(errno));
	CHECK(strcmp(iff.ifr_name, "tst0") == 0, "%s", iff.ifr_name);
	CHECK((iff.ifr_flags & (IFF_TUN | IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE)) ==
		      (IFF_TUN | IFF_NO_PI), "tun flags 0x%x", (unsigned)iff.ifr_flags);

	CHECK(ifreq_get("tst0", SIOCGIFMTU).ifr_mtu == 9000, "mtu");
	CHECK(ifreq_get("tst0", SIOCGIFTXQLEN).ifr_qlen == 10000, "txqueuelen");
	CHECK(ifreq_get("tst0", SIOCGIFFLAGS).ifr_flags & IFF_UP, "link up");
	CHECK(has_addr("tst0", "198.18.0.1", 15), "IPv4 address");
	CHECK(has_addr("tst0", "fd00:7f::1", 64), "IPv6 address");
	fl = inet6_flags("fd00007f000000000000000000000001", "tst0");
	CHECK(fl >= 0 && !(fl & 0x40 /* IFA_F_TENTATIVE */) && (fl & 0x02 /* IFA_F_NODAD */),
	      "IPv6 flags 0x%x", fl);
	CHECK(tun_verify(t, 1, 0, err, sizeof(err)) == 0, "%s", err);

	tun_close(t);
	CHECK(if_nametoindex("tst0") == 0, "a device we created goes away with its fd");
	tun_close(NULL);
}

static void make_persistent(const char *name, short type)
{
	struct ifreq ifr;
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);

	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	ifr.ifr_flags = (short)(type | IFF_NO_PI);
	CHECK(fd >= 0 && ioctl(fd, TUNSETIFF, &ifr) == 0 && ioctl(fd, TUNSETPERSIST, 1) == 0,
	      "persistent %s: %s", name, strerror(errno));
	close(fd);
}

static void scenario_name_taken_and_attach(void)
{
	struct tun_params p;
	struct tun *t, *t2 = (struct tun *)&t2;
	char err[TS_ERRLEN];
	int ret;

	params(&p, "tst1", "198.18.0.1/15", NULL);
	t = open_ok(&p);
	ret = tun_open(&p, &t2, err, sizeof(err));
	CHECK(ret == -EBUSY, "second open = %d", ret);
	CHECK(t2 == NULL, "no object on failure");
	CHECK(strstr(err, "tun: tst1: name taken") == err, "%s", err);
	tun_close(t);
	CHECK(if_nametoindex("tst1") == 0, "gone");
	tun_close(open_ok(&p)); /* the name is free again */

	/* A persistent TUN nobody has open: attached, left in place on close. */
	make_persistent("tst2", IFF_TUN);
	params(&p, "tst2", "198.18.0.1/15", "fd00:7f::1/64");
	t = open_ok(&p);
	CHECK(!tun_created(t), "attached, not created");
	CHECK(has_addr("tst2", "198.18.0.1", 15), "configured on attach");
	ret = tun_open(&p, &t2, err, sizeof(err));
	CHECK(ret == -EBUSY && strstr(err, "name taken"), "%d %s", ret, err);
	tun_close(t);
	CHECK(if_nametoindex("tst2") != 0, "a device we did not create stays");
	t = open_ok(&p); /* re-attach: addresses already there (REPLACE, not EXCL) */
	tun_close(t);

	/* Names that belong to something else. */
	make_persistent("tst3", IFF_TAP);
	params(&p, "tst3", NULL, NULL);
	ret = tun_open(&p, &t2, err, sizeof(err));
	CHECK(ret == -EINVAL && strstr(err, "not a TUN"), "%d %s", ret, err);
	params(&p, "lo", NULL, NULL);
	ret = tun_open(&p, &t2, err, sizeof(err));
	CHECK(ret == -EINVAL && strstr(err, "tun: lo: ") == err, "%d %s", ret, err);
}

static void scenario_rp_filter(void)
{
	struct tun_params p;
	struct tun *t;
	char msg[TS_ERRLEN];
	int ret;

	params(&p, "tst4", "198.18.0.1/15", NULL);
	t = open_ok(&p);
	set_rp_filter("tst4", 1, 0);
	ret = tun_rp_filter_check("tst4", msg, sizeof(msg));
	CHECK(ret == 1, "all=1: %d %s", ret, msg);
	CHECK(strstr(msg, "strict reverse-path filtering") && strstr(msg, "all=1, tst4=0") &&
		      strstr(msg, "net/ipv4/conf/all/rp_filter=2") &&
		      strstr(msg, "net/ipv4/conf/tst4/rp_filter"), "%s", msg);
	set_rp_filter("tst4", 0, 1);
	CHECK(tun_rp_filter_check("tst4", msg, sizeof(msg)) == 1, "dev=1: %s", msg);
	set_rp_filter("tst4", 0, 0);
	CHECK(tun_rp_filter_check("tst4", msg, sizeof(msg)) == 0 && msg[0] == '\0', "off: %s", msg);
	set_rp_filter("tst4", 0, 2);
	CHECK(tun_rp_filter_check("tst4", msg, sizeof(msg)) == 0, "loose: %s", msg);
	set_rp_filter("tst4", 2, 1);
	CHECK(tun_rp_filter_check("tst4", msg, sizeof(msg)) == 0, "max(2, 1) is loose: %s", msg);
	ret = tun_rp_filter_check("nope0", msg, sizeof(msg));
	CHECK(ret == -ENOENT && strstr(msg, "/proc/sys/net/ipv4/conf/nope0/rp_filter"), "%d %s",
	      ret, msg);
	tun_close(t);
}

/* Read packets from fd until one satisfies want (the kernel also sends MLD and router
 * solicitations into a fresh TUN) or 3 s pass. Returns the length, 0 on timeout. */
static size_t read_reply(int fd, uint8_t *buf, size_t cap, int family, uint8_t icmp_type)
{
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct pollfd pfd = { fd, POLLIN, 0 };
		ssize_t n;

		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec >= 3)
			return 0;
		if (poll(&pfd, 1, 100) <= 0)
			continue;
		n = read(fd, buf, cap);
		if (n <= 0)
			continue;
		if (family == 4 && n >= 28 && (buf[0] >> 4) == 4 && buf[9] == IPPROTO_ICMP &&
		    buf[20] == icmp_type)
			return (size_t)n;
		if (family == 6 && n >= 48 && (buf[0] >> 4) == 6 && buf[6] == IPPROTO_ICMPV6 &&
		    buf[40] == icmp_type)
			return (size_t)n;
	}
}

static void echo_through(int fd, const char *src, const char *dst, int family)
{
	struct tu_spec s;
	uint8_t pkt[256], reply[2048], a[16];
	size_t len, n;

	tu_spec_icmp_echo(&s, src, dst, 0x1234, 7);
	s.payload_len = 32;
	s.payload_seed = 99;
	len = tu_build(&s, pkt, sizeof(pkt));
	CHECK(write(fd, pkt, len) == (ssize_t)len, "write: %s", strerror(errno));
	n = read_reply(fd, reply, sizeof(reply), family, family == 4 ? 0 : 129);
	CHECK(n == len, "echo reply from %s: got %zu bytes, want %zu", dst, n, len);
	CHECK(tu_verify_l4(reply, n), "reply checksum");
	tu_addr(a, dst);
	CHECK(memcmp(reply + (family == 4 ? 12 : 8), a, family == 4 ? 4 : 16) == 0, "reply source");
	CHECK(memcmp(reply + n - 32, pkt + len - 32, 32) == 0, "payload echoed");
}

static void scenario_packets_and_dev_stats(void)
{
	struct tun_params p;
	struct tun_dev_stats before, after;
	struct tun *t;

	params(&p, "tst5", "198.18.0.1/15", "fd00:7f::1/64");
	t = open_ok(&p);
	set_rp_filter("tst5", 0, 0);
	CHECK(tun_dev_stats("tst5", &before) == 0, "dev stats");
	echo_through(tun_fd(t, 0), "198.18.0.2", "198.18.0.1", 4);
	echo_through(tun_fd(t, 0), "fd00:7f::2", "fd00:7f::1", 6);
	CHECK(tun_dev_stats("tst5", &after) == 0, "dev stats");
	/* Our two writes are the device's receptions; the replies its transmissions. */
	CHECK(after.rx_packets == before.rx_packets + 2, "rx %llu -> %llu",
	      (unsigned long long)before.rx_packets, (unsigned long long)after.rx_packets);
	CHECK(after.tx_packets >= before.tx_packets + 2, "tx %llu -> %llu",
	      (unsigned long long)before.tx_packets, (unsigned long long)after.tx_packets);
	CHECK(after.rx_dropped == 0, "rx_dropped %llu", (unsigned long long)after.rx_dropped);
	CHECK(tun_dev_stats("nope0", &after) == -ENOENT, "no such device");
	tun_close(t);
}

static void scenario_kernel_name_multiqueue_vnet(void)
{
	struct tun_params p;
	struct tun *t;
	struct ifreq iff;
	int hdr = 0;
	uint32_t want = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_USO4 | TUN_F_USO6;

	params(&p, "", "198.18.0.1/15", NULL);
	p.queues = 2;
	p.vnet_hdr = true;
	p.offload = want;
	t = open_ok(&p);
	CHECK(strncmp(tun_name(t), "tun", 3) == 0, "kernel-picked name %s", tun_name(t));
	CHECK(tun_created(t), "created");
	CHECK(tun_queues(t) == 2 && tun_fd(t, 0) != tun_fd(t, 1), "two queues");
	for (uint32_t q = 0; q < 2; q++) {
		memset(&iff, 0, sizeof(iff));
		CHECK(ioctl(tun_fd(t, q), TUNGETIFF, &iff) == 0, "TUNGETIFF");
		CHECK(strcmp(iff.ifr_name, tun_name(t)) == 0, "%s", iff.ifr_name);
		CHECK((iff.ifr_flags & (IFF_MULTI_QUEUE | IFF_VNET_HDR | IFF_NO_PI)) ==
			      (IFF_MULTI_QUEUE | IFF_VNET_HDR | IFF_NO_PI), "flags 0x%x",
		      (unsigned)iff.ifr_flags);
		CHECK(fcntl(tun_fd(t, q), F_GETFL) & O_NONBLOCK, "queue %u non-blocking", q);
	}
	CHECK(ioctl(tun_fd(t, 0), TUNGETVNETHDRSZ, &hdr) == 0 && hdr == TUN_VNET_HDR_LEN, "%d",
	      hdr);
	CHECK(tun_vnet_hdr(t), "vnet");
	/* USO needs Linux 6.2; without it tun_open drops just those two bits. */
	CHECK((tun_offload(t) & ~(uint32_t)(TUN_F_USO4 | TUN_F_USO6)) ==
		      (want & ~(uint32_t)(TUN_F_USO4 | TUN_F_USO6)), "offload 0x%x",
	      tun_offload(t));
	tun_close(t);
}

/* rps_cpus of the device's one rx queue, as sysfs shows it, parsed as a hex mask ("0" when
 * steering is off; commas between 32-bit words). */
static unsigned long long rps_mask(const char *ifname)
{
	char path[128], text[256] = { 0 }, digits[256];
	size_t k = 0;
	int fd;

	snprintf(path, sizeof(path), "/sys/class/net/%s/queues/rx-0/rps_cpus", ifname);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0, "%s: %s", path, strerror(errno));
	CHECK(read(fd, text, sizeof(text) - 1) > 0, "%s", path);
	close(fd);
	for (const char *c = text; *c && *c != '\n' && k < sizeof(digits) - 1; c++)
		if (*c != ',')
			digits[k++] = *c;
	digits[k] = '\0';
	return strtoull(digits, NULL, 16);
}

/* tun.rps: "on" sets rps_cpus to the CPUs we may run on, "auto" (one queue, more than one CPU)
 * clears it and leaves the decision to the loop, tun_set_rps turns it on and off, "off"
 * leaves a device's setting alone. */
static void scenario_rps(void)
{
	struct ts_config cfg;
	struct tun *t = NULL;
	char note[256], err[TS_ERRLEN];
	cpu_set_t set;
	unsigned long long mine = 0;
	bool multi = sysconf(_SC_NPROCESSORS_ONLN) > 1;

	CHECK(sched_getaffinity(0, sizeof(set), &set) == 0, "affinity");
	for (int c = 0; c < 64; c++)
		if (CPU_ISSET(c, &set))
			mine |= 1ull << c;
	CHECK(config_load_string("{\"tun\":{\"name\":\"tsrps0\",\"address\":\"198.18.0.1/15\","
				 "\"offload\":\"off\",\"rps\":\"on\"}}", &cfg, err,
				 sizeof(err)) == 0, "%s", err);
	CHECK(tun_open_config(&cfg.tun, &t, note, sizeof(note), err, sizeof(err)) == 0, "%s",
	      err);
	CHECK(tun_rps(t) && !tun_rps_auto(t), "on: steering on, not the loop's");
	CHECK(rps_mask("tsrps0") == mine, "on: mask %llx, want %llx", rps_mask("tsrps0"), mine);
	CHECK(tun_set_rps(t, false, err, sizeof(err)) == 0, "%s", err);
	CHECK(!tun_rps(t) && rps_mask("tsrps0") == 0, "off: %llx", rps_mask("tsrps0"));
	CHECK(tun_set_rps(t, true, err, sizeof(err)) == 0, "%s", err);
	CHECK(tun_rps(t) && rps_mask("tsrps0") == mine, "on again: %llx", rps_mask("tsrps0"));
	tun_close(t);
	t = NULL;

	/* A persistent device with steering set is someone else's: "off" and "auto" leave it. */
	make_persistent("tsrps1", IFF_TUN);
	snprintf(cfg.tun.name, sizeof(cfg.tun.name), "tsrps1");
	write_text("/sys/class/net/tsrps1/queues/rx-0/rps_cpus", "1");
	for (int i = 0; i < 2; i++) {
		cfg.tun.rps = i == 0 ? TS_RPS_OFF : TS_RPS_AUTO;
		CHECK(tun_open_config(&cfg.tun, &t, note, sizeof(note), err, sizeof(err)) == 0,
		      "%s", err);
		CHECK(!tun_rps(t) && !tun_rps_auto(t) && rps_mask("tsrps1") == 1,
		      "%s leaves it: %llx", i == 0 ? "off" : "auto", rps_mask("tsrps1"));
		tun_close(t);
		t = NULL;
	}
	/* Without a setting "auto" manages it, and gives it back without steering at close. */
	write_text("/sys/class/net/tsrps1/queues/rx-0/rps_cpus", "0");
	CHECK(tun_open_config(&cfg.tun, &t, note, sizeof(note), err, sizeof(err)) == 0, "%s",
	      err);
	CHECK(note[0] == '\0', "no note: %s", note);
	CHECK(!tun_rps(t), "auto starts with steering off");
	CHECK(tun_rps_auto(t) == multi, "auto is the loop's with more CPUs to steer to");
	if (multi) {
		CHECK(tun_set_rps(t, true, err, sizeof(err)) == 0, "%s", err);
		CHECK(rps_mask("tsrps1") == mine, "the loop turned it on: %llx", rps_mask("tsrps1"));
	}
	tun_close(t);
	t = NULL;
	CHECK(rps_mask("tsrps1") == 0, "closed: cleared again: %llx", rps_mask("tsrps1"));

	/* More than one queue: "auto" is "off" (a device's setting stays). */
	make_persistent("tsrps2", IFF_TUN | IFF_MULTI_QUEUE);
	write_text("/sys/class/net/tsrps2/queues/rx-0/rps_cpus", "1");
	snprintf(cfg.tun.name, sizeof(cfg.tun.name), "tsrps2");
	cfg.tun.queues = 2;
	CHECK(tun_open_config(&cfg.tun, &t, note, sizeof(note), err, sizeof(err)) == 0, "%s",
	      err);
	CHECK(!tun_rps_auto(t) && rps_mask("tsrps2") == 1, "2 queues: untouched: %llx",
	      rps_mask("tsrps2"));
	tun_close(t);
	config_fini(&cfg);
}

static void scenario_verify_detects_problems(void)
{
	struct tun_params p;
	struct netlink nl;
	struct netlink_link_req down = { 0, 0, 0 }, up = { 0, 0, 1 };
	struct ifreq ifr;
	struct tun *t;
	char err[TS_ERRLEN];
	int ret, s;

	params(&p, "tst6", "198.18.0.1/15", "fd00:7f::1/64");
	t = open_ok(&p);
	CHECK(netlink_open(&nl) == 0, "netlink");

	CHECK(netlink_addr_del(&nl, tun_ifindex(t), &p.addr4) == 0, "del v4");
	ret = tun_verify(t, 3, 10, err, sizeof(err));
	CHECK(ret == -EADDRNOTAVAIL, "%d", ret);
	CHECK(strstr(err, "tun: tst6: address 198.18.0.1/15 is not on the interface (it has: ") &&
		      strstr(err, "fd00:7f::1/64") && strstr(err, "after 3 tries 10 ms apart"),
	      "%s", err);
	CHECK(netlink_addr_add(&nl, tun_ifindex(t), &p.addr4, 0) == 0, "re-add v4");
	CHECK(tun_verify(t, 1, 0, err, sizeof(err)) == 0, "%s", err);

	CHECK(netlink_link_set(&nl, tun_ifindex(t), &down) == 0, "down");
	ret = tun_verify(t, 2, 10, err, sizeof(err));
	CHECK(ret == -ENETDOWN && strstr(err, "link is not up"), "%d %s", ret, err);
	CHECK(netlink_link_set(&nl, tun_ifindex(t), &up) == 0, "up");

	/* A TUN is NOARP and gets accept_dad=-1, both of which skip DAD; undo them so a v6
	 * address added without NODAD really is tentative for a while (dad_transmits x 1 s). */
	ifr = ifreq_get("tst6", SIOCGIFFLAGS);
	ifr.ifr_flags &= ~IFF_NOARP;
	s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CHECK(ioctl(s, SIOCSIFFLAGS, &ifr) == 0, "clear NOARP: %s", strerror(errno));
	close(s);
	write_text("/proc/sys/net/ipv6/conf/tst6/accept_dad", "1");
	write_text("/proc/sys/net/ipv6/conf/tst6/dad_transmits", "2");
	ret = netlink_addr_del(&nl, tun_ifindex(t), &p.addr6);
	CHECK(ret == 0 || ret == -EADDRNOTAVAIL, "del v6: %d", ret); /* gone with the link down */
	CHECK(netlink_addr_add(&nl, tun_ifindex(t), &p.addr6, 0) == 0, "v6 with DAD");
	ret = tun_verify(t, 2, 10, err, sizeof(err));
	CHECK(ret == -EADDRNOTAVAIL && strstr(err, "fd00:7f::1/64 is still tentative"), "%d %s",
	      ret, err);
	/* Nobody answers the neighbour solicitations: DAD succeeds, and the retry loop with it. */
	ret = tun_verify(t, 60, 100, err, sizeof(err));
	CHECK(ret == 0, "after DAD: %d %s", ret, err);

	/* Listed but not routed as local: the window IPv6 leaves right after adding an address. */
	if (system("ip -6 route del local fd00:7f::1 dev tst6 table local 2>/dev/null") == 0) {
		ret = tun_verify(t, 2, 10, err, sizeof(err));
		CHECK(ret == -EADDRNOTAVAIL && strstr(err, "fd00:7f::1/64 is listed but not yet a "
						       "local address"), "%d %s", ret, err);
	}
	netlink_close(&nl);
	tun_close(t);
}

static void scenario_no_tun_device(void)
{
	struct tun_params p;
	struct tun *t = NULL;
	char err[TS_ERRLEN];
	int ret;

	CHECK(tun_available(err, sizeof(err)) == 0, "%s", err);
	CHECK(err[0] == '\0', "no message on success");
	/* Hide /dev/net/tun in our private mount namespace. */
	CHECK(mount("tmpfs", "/dev/net", "tmpfs", 0, NULL) == 0, "tmpfs: %s", strerror(errno));
	ret = tun_available(err, sizeof(err));
	CHECK(ret == -ENOENT, "%d", ret);
	CHECK(strstr(err, "tun: no TUN support: cannot open /dev/net/tun: ") == err &&
		      strstr(err, "modprobe tun"), "%s", err);
	params(&p, "tst7", "198.18.0.1/15", NULL);
	ret = tun_open(&p, &t, err, sizeof(err));
	CHECK(ret == -ENOENT && t == NULL && strstr(err, "cannot open /dev/net/tun"), "%d %s", ret,
	      err);
}

TestSuite(tun, .timeout = 60);

Test(tun, configures_device)
{
	run_in_netns(scenario_configures_device);
}

Test(tun, name_taken_and_attach)
{
	run_in_netns(scenario_name_taken_and_attach);
}

Test(tun, rp_filter_strict_detected)
{
	run_in_netns(scenario_rp_filter);
}

Test(tun, echo_through_device_and_dev_stats)
{
	run_in_netns(scenario_packets_and_dev_stats);
}

Test(tun, kernel_name_multiqueue_vnet_hdr)
{
	run_in_netns(scenario_kernel_name_multiqueue_vnet);
}

Test(tun, rps_on_off_auto)
{
	run_in_netns(scenario_rps);
}

Test(tun, verify_missing_down_tentative)
{
	run_in_netns(scenario_verify_detects_problems);
}

Test(tun, no_tun_device)
{
	run_in_netns(scenario_no_tun_device);
}

/* ---- no root needed ---- */

Test(tun, bad_params_refused_before_any_io)
{
	struct tun_params p;
	struct tun *t = (struct tun *)&t;
	char err[TS_ERRLEN];

	tun_params_init(&p);
	snprintf(p.name, sizeof(p.name), "a/b");
	cr_assert_eq(tun_open(&p, &t, err, sizeof(err)), -EINVAL);
	cr_assert_null(t);
	cr_assert_str_eq(err, "tun: invalid interface name \"a/b\"");
	memset(p.name, 'x', sizeof(p.name)); /* 16 bytes, no terminator */
	cr_assert_eq(tun_open(&p, &t, err, sizeof(err)), -EINVAL);

	tun_params_init(&p);
	snprintf(p.name, sizeof(p.name), "t0");
	p.mtu = 70000;
	cr_assert_eq(tun_open(&p, &t, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "MTU 70000 outside 68..65535"), "%s", err);
	p.mtu = 1000;
	p.has_addr6 = true;
	cr_assert_eq(netaddr_parse_cidr("fd00::1/64", &p.addr6), 0);
	cr_assert_eq(tun_open(&p, &t, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "below 1280"), "%s", err);
	p.mtu = 1500;
	p.addr6.prefix = 129;
	cr_assert_eq(tun_open(&p, &t, err, sizeof(err)), -EINVAL);
	p.addr6.prefix = 64;
	p.queues = TUN_QUEUES_MAX + 1;
	cr_assert_eq(tun_open(&p, &t, err, sizeof(err)), -EINVAL);
	p.queues = 1;
	p.offload = 1;
	cr_assert_eq(tun_open(&p, &t, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "need vnet_hdr"), "%s", err);
}

Test(tun, rp_filter_verdict)
{
	char msg[TS_ERRLEN];

	cr_assert_eq(tun_rp_filter_eval(1, 0, "tun0", msg, sizeof(msg)), 1);
	cr_assert_not_null(strstr(msg, "tun: tun0: strict reverse-path filtering (rp_filter: "
					"all=1, tun0=0"), "%s", msg);
	cr_assert_not_null(strstr(msg, "may be dropped"), "%s", msg);
	cr_assert_eq(tun_rp_filter_eval(0, 1, "tun0", msg, sizeof(msg)), 1);
	cr_assert_eq(tun_rp_filter_eval(1, 1, "tun0", msg, sizeof(msg)), 1);
	cr_assert_eq(tun_rp_filter_eval(0, 0, "tun0", msg, sizeof(msg)), 0);
	cr_assert_str_eq(msg, "");
	cr_assert_eq(tun_rp_filter_eval(2, 1, "tun0", msg, sizeof(msg)), 0);
	cr_assert_eq(tun_rp_filter_eval(1, 2, "tun0", msg, sizeof(msg)), 0);
	cr_assert_eq(tun_rp_filter_eval(0, 2, "tun0", msg, sizeof(msg)), 0);
	cr_assert_eq(tun_rp_filter_eval(1, 0, "tun0", NULL, 0), 1, "no buffer is fine");
	cr_assert_eq(tun_rp_filter_check("../x", msg, sizeof(msg)), -EINVAL);
	cr_assert_eq(tun_rp_filter_check("", msg, sizeof(msg)), -EINVAL);
}

Test(tun, dev_stats_bad_names)
{
	struct tun_dev_stats st;

	cr_assert_eq(tun_dev_stats("..", &st), -EINVAL);
	cr_assert_eq(tun_dev_stats("a/b", &st), -EINVAL);
	cr_assert_eq(tun_dev_stats("0123456789abcdef", &st), -EINVAL);
	cr_assert_eq(tun_dev_stats("nope-does-not", &st), -ENOENT);
}

Test(tun, params_from_config)
{
	struct ts_tun c;
	struct tun_params p;

	memset(&c, 0, sizeof(c));
	snprintf(c.name, sizeof(c.name), "tun9");
	cr_assert_eq(netaddr_parse_cidr("198.18.0.1/15", &c.addr4), 0);
	c.has_addr6 = true;
	cr_assert_eq(netaddr_parse_cidr("fd00:7f::1/64", &c.addr6), 0);
	c.mtu = 1500;
	c.txqueuelen = 10000;
	c.queues = 4;
	c.offload = TS_OFFLOAD_ON;
	tun_params_from_config(&p, &c);
	cr_assert_str_eq(p.name, "tun9");
	cr_assert(p.has_addr4 && netaddr_eq(&p.addr4.addr, &c.addr4.addr) && p.addr4.prefix == 15);
	cr_assert(p.has_addr6 && netaddr_eq(&p.addr6.addr, &c.addr6.addr) && p.addr6.prefix == 64);
	cr_assert_eq(p.mtu, 1500);
	cr_assert_eq(p.txqueuelen, 10000);
	cr_assert_eq(p.queues, 4);
	cr_assert(!p.vnet_hdr && p.offload == 0, "offload is the driver's decision");
}
