/* test_netaddr.c — address parsing, CIDR arithmetic and the address roles (core/netaddr.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/netaddr.h"
#include "testutil.h"

static struct netaddr addr(const char *s)
{
	struct netaddr a;

	cr_assert_eq(netaddr_parse(s, &a), 0, "parse %s", s);
	return a;
}

static struct netaddr_cidr cidr(const char *s)
{
	struct netaddr_cidr c;

	cr_assert_eq(netaddr_parse_cidr(s, &c), 0, "parse %s", s);
	return c;
}

Test(netaddr, parse_accepts)
{
	struct netaddr a = addr("198.18.0.1");
	uint8_t v4[16] = { 198, 18, 0, 1 };

	cr_assert_eq(a.family, 4);
	cr_assert_eq(memcmp(a.a, v4, 16), 0, "IPv4 in a[0..3], rest zero");
	a = addr("fd00:7f::1");
	cr_assert_eq(a.family, 6);
	cr_assert_eq(a.a[0], 0xfd);
	cr_assert_eq(a.a[15], 1);
	a = addr("::ffff:1.2.3.4");
	cr_assert_eq(a.family, 6, "a v4-mapped address stays IPv6");
}

Test(netaddr, parse_rejects)
{
	static const char *bad[] = { "", " 1.2.3.4", "1.2.3.4 ", "1.2.3", "1.2.3.4.5", "256.1.1.1",
				     "1.2.3.4/8", "fe80::1%eth0", "::g", "1:2:3:4:5:6:7:8:9",
				     "example.com", "[::1]" };
	struct netaddr a;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(netaddr_parse(bad[i], &a), -EINVAL, "'%s' must be rejected", bad[i]);
}

Test(netaddr, cidr)
{
	struct netaddr_cidr c = cidr("198.18.0.1/15");
	char buf[NETADDR_CIDR_STRLEN];

	cr_assert_eq(c.prefix, 15);
	cr_assert_str_eq(netaddr_cidr_format(&c, buf, sizeof(buf)), "198.18.0.1/15");
	netaddr_cidr_normalize(&c);
	cr_assert_str_eq(netaddr_cidr_format(&c, buf, sizeof(buf)), "198.18.0.0/15");
	c = cidr("fd00:7f::1/64");
	netaddr_cidr_normalize(&c);
	cr_assert_str_eq(netaddr_cidr_format(&c, buf, sizeof(buf)), "fd00:7f::/64");
	c = cidr("10.1.2.3/0");
	netaddr_cidr_normalize(&c);
	cr_assert_str_eq(netaddr_cidr_format(&c, buf, sizeof(buf)), "0.0.0.0/0");
	c = cidr("::1/128");
	cr_assert_eq(c.prefix, 128);

	static const char *bad[] = { "10.0.0.0", "10.0.0.0/", "10.0.0.0/33", "10.0.0.0/-1",
				     "10.0.0.0/8x", "10.0.0.0/ 8", "::/129", "::/1000", "/8",
				     "10.0.0.0/8/8", "10.0.0/8" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(netaddr_parse_cidr(bad[i], &c), -EINVAL, "'%s'", bad[i]);
}

Test(netaddr, endpoints)
{
	struct netaddr_ep e;
	char buf[NETADDR_EP_STRLEN];

	cr_assert_eq(netaddr_parse_ep("127.0.0.1:9090", &e), 0);
	cr_assert_eq(e.port, 9090);
	cr_assert_str_eq(netaddr_ep_format(&e, buf, sizeof(buf)), "127.0.0.1:9090");
	cr_assert_eq(netaddr_parse_ep("[::1]:53", &e), 0);
	cr_assert_eq(e.addr.family, 6);
	cr_assert_str_eq(netaddr_ep_format(&e, buf, sizeof(buf)), "[::1]:53");
	cr_assert_eq(netaddr_parse_ep("1.2.3.4:65535", &e), 0);

	static const char *bad[] = { "1.2.3.4", "1.2.3.4:", "1.2.3.4:0", "1.2.3.4:65536",
				     "1.2.3.4:123456", "::1:53", "[::1]53", "[::1]:", "[1.2.3.4]:53",
				     "host:53", ":53", "1.2.3.4:+5", "1.2.3.4:5 " };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(netaddr_parse_ep(bad[i], &e), -EINVAL, "'%s'", bad[i]);
}

Test(netaddr, in_cidr)
{
	struct netaddr_cidr c = cidr("10.1.0.0/15");
	struct netaddr a = addr("10.0.255.255"), b = addr("10.1.255.255"), d = addr("10.2.0.0");

	cr_assert(netaddr_in_cidr(&a, &c), "10.0/15 contains 10.0.255.255 (host bits of c)");
	cr_assert(netaddr_in_cidr(&b, &c));
	cr_assert_not(netaddr_in_cidr(&d, &c));
	c = cidr("0.0.0.0/0");
	cr_assert(netaddr_in_cidr(&d, &c));
	struct netaddr v6 = addr("fd00::1");
	cr_assert_not(netaddr_in_cidr(&v6, &c), "families never match");
	c = cidr("fd00::/7");
	cr_assert(netaddr_in_cidr(&v6, &c));
	v6 = addr("fe00::1");
	cr_assert_not(netaddr_in_cidr(&v6, &c));
	c = cidr("fd00::5/128");
	v6 = addr("fd00::5");
	cr_assert(netaddr_in_cidr(&v6, &c));
}

Test(netaddr, add_and_loopback)
{
	struct netaddr a = addr("10.0.0.255"), out;
	char buf[NETADDR_STRLEN];

	cr_assert_eq(netaddr_add(&a, 1, &out), 0);
	cr_assert_str_eq(netaddr_format(&out, buf, sizeof(buf)), "10.0.1.0");
	a = addr("255.255.255.255");
	cr_assert_eq(netaddr_add(&a, 1, &out), -ERANGE);
	a = addr("::ffff:ffff:ffff:ffff");
	cr_assert_eq(netaddr_add(&a, 1, &out), 0, "carry into the upper 64 bits");
	cr_assert_str_eq(netaddr_format(&out, buf, sizeof(buf)), "0:0:0:1::");
	a = addr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
	cr_assert_eq(netaddr_add(&a, 1, &out), -ERANGE);

	cr_assert(netaddr_is_loopback(&(struct netaddr){ 4, { 127, 0, 0, 1 } }));
	a = addr("127.255.0.3");
	cr_assert(netaddr_is_loopback(&a));
	a = addr("::1");
	cr_assert(netaddr_is_loopback(&a));
	a = addr("0.0.0.0");
	cr_assert_not(netaddr_is_loopback(&a));
	a = addr("::");
	cr_assert_not(netaddr_is_loopback(&a));
	a = addr("::ffff:127.0.0.1");
	cr_assert_not(netaddr_is_loopback(&a));
}

static int roles(const char *c, uint32_t n, struct netaddr_roles *r, char *why, size_t len)
{
	struct netaddr_cidr tun = cidr(c);

	return netaddr_roles_init(r, &tun, n, why, len);
}

static void expect_roles_fail(const char *c, uint32_t n, const char *reason)
{
	struct netaddr_roles r;
	char why[256] = "";

	cr_expect_eq(roles(c, n, &r, why, sizeof(why)), -EINVAL, "%s with %u NAT addresses", c, n);
	cr_expect(strstr(why, reason) != NULL, "%s: '%s' lacks '%s'", c, why, reason);
	cr_expect_eq(r.family, 0, "a failed init leaves the family unconfigured");
}

Test(netaddr, roles_reject_impossible_prefixes)
{
	expect_roles_fail("10.0.0.1/31", 1, "/31 prefix leaves no room");
	expect_roles_fail("10.0.0.1/32", 1, "/32 prefix leaves no room");
	expect_roles_fail("10.0.0.1/31", 4, "need /29 or shorter");
	expect_roles_fail("fd00::1/127", 1, "/127 prefix");
	expect_roles_fail("fd00::1/128", 4, "need /125 or shorter");
	expect_roles_fail("10.0.0.0/24", 4, "network address");
	expect_roles_fail("10.0.0.255/24", 4, "broadcast address of its /24");
	expect_roles_fail("fd00::/64", 4, "subnet-router anycast");
	/* NAT addresses running onto the broadcast address or past the prefix. */
	expect_roles_fail("10.0.0.1/30", 2, "10.0.0.3 (gateway+2) would be the broadcast");
	expect_roles_fail("10.0.0.1/30", 4, "only 1 of the 4");
	expect_roles_fail("10.0.0.254/24", 1, "10.0.0.255 (gateway+1) would be the broadcast");
	expect_roles_fail("10.0.0.250/29", 5, "10.0.0.255");
	expect_roles_fail("198.19.255.250/15", 5, "198.19.255.255");
	expect_roles_fail("fd00::1/126", 3, "fd00::4 (gateway+3) lies outside fd00::/126");
	expect_roles_fail("fd00::ffff:fffe/96", 2, "lies outside fd00::/96");
	expect_roles_fail("fd00::ffff:ffff:ffff:fffe/64", 2, "lies outside fd00::/64");
}

Test(netaddr, roles_accept_tight_fits)
{
	struct netaddr_roles r;
	char why[256];

	cr_assert_eq(roles("10.0.0.1/30", 1, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("10.0.0.1/29", 4, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("10.0.0.250/29", 4, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("10.0.0.253/24", 1, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("198.18.0.1/15", 64, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("fd00::1/126", 2, &r, why, sizeof(why)), 0, "v6 may use all-ones");
	cr_assert_eq(roles("fd00::1/125", 4, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("fd00::ffff:ffff:ffff:fffd/64", 2, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("fd00::1/0", 4, &r, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(roles("1.0.0.1/0", 4, &r, why, sizeof(why)), 0, "%s", why);
}

Test(netaddr, roles_nat_addresses)
{
	struct netaddr_roles r;
	struct netaddr a;
	char why[256], buf[NETADDR_STRLEN];

	cr_assert_eq(roles("198.18.0.1/15", 4, &r, why, sizeof(why)), 0);
	netaddr_roles_nat(&r, 0, &a);
	cr_assert_str_eq(netaddr_format(&a, buf, sizeof(buf)), "198.18.0.2");
	netaddr_roles_nat(&r, 3, &a);
	cr_assert_str_eq(netaddr_format(&a, buf, sizeof(buf)), "198.18.0.5");
	cr_assert_eq(roles("10.0.0.254/23", 4, &r, why, sizeof(why)), 0);
	netaddr_roles_nat(&r, 1, &a);
	cr_assert_str_eq(netaddr_format(&a, buf, sizeof(buf)), "10.0.1.0", "crosses a byte");
	cr_assert_eq(roles("fd00::ffff:ffff:ffff:ffff/48", 2, &r, why, sizeof(why)), 0);
	netaddr_roles_nat(&r, 0, &a);
	cr_assert_str_eq(netaddr_format(&a, buf, sizeof(buf)), "fd00:0:0:1::", "64-bit carry");
}

Test(netaddr, classify)
{
	struct netaddr_roles r, none = { 0 };
	char why[256];
	uint32_t k = 99;
	struct netaddr a;

	cr_assert_eq(roles("198.18.0.1/15", 4, &r, why, sizeof(why)), 0);
	a = addr("198.18.0.1");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, &k), NETADDR_ROLE_GATEWAY);
	a = addr("198.18.0.2");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, &k), NETADDR_ROLE_NAT);
	cr_assert_eq(k, 0);
	a = addr("198.18.0.5");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, &k), NETADDR_ROLE_NAT);
	cr_assert_eq(k, 3);
	a = addr("198.18.0.6");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, NULL), NETADDR_ROLE_NONE);
	a = addr("198.18.0.0");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, NULL), NETADDR_ROLE_NONE);
	a = addr("0.0.0.0");
	cr_assert_not(netaddr_roles_is_ours(&r, a.a));
	cr_assert_not(netaddr_roles_is_ours(&none, a.a), "unconfigured family: nothing is ours");

	cr_assert_eq(roles("fd00::ffff:ffff:ffff:fffe/48", 4, &r, why, sizeof(why)), 0);
	a = addr("fd00::ffff:ffff:ffff:fffe");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, NULL), NETADDR_ROLE_GATEWAY);
	a = addr("fd00:0:0:1::2");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, &k), NETADDR_ROLE_NAT, "across the carry");
	cr_assert_eq(k, 3);
	a = addr("fd00:0:0:1::3");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, NULL), NETADDR_ROLE_NONE);
	a = addr("fd00::ffff:ffff:ffff:fffd");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, NULL), NETADDR_ROLE_NONE);
	a = addr("fd01::ffff:ffff:ffff:ffff");
	cr_assert_eq(netaddr_roles_classify(&r, a.a, NULL), NETADDR_ROLE_NONE);
}

/* The dumb reference: walk gateway+0 .. gateway+n and compare memory. */
static enum netaddr_role ref_classify(const struct netaddr_roles *r, const struct netaddr *a,
				      uint32_t *k)
{
	struct netaddr x;

	if (netaddr_eq(a, &r->gateway))
		return NETADDR_ROLE_GATEWAY;
	for (uint32_t i = 0; i < r->n_nat; i++) {
		netaddr_roles_nat(r, i, &x);
		if (netaddr_eq(a, &x)) {
			*k = i;
			return NETADDR_ROLE_NAT;
		}
	}
	return NETADDR_ROLE_NONE;
}

/* Random gateways and probes near them (where off-by-ones live), against the reference. */
Test(netaddr, classify_randomized)
{
	unsigned seed = 12345;
	size_t checked = 0;

	for (int round = 0; round < 2000; round++) {
		struct netaddr_cidr tun = { 0 };
		struct netaddr_roles r;
		char why[256];
		uint32_t n = 1 + (uint32_t)(rand_r(&seed) % 64);

		tun.addr.family = (round & 1) ? 6 : 4;
		for (int i = 0; i < (tun.addr.family == 4 ? 4 : 16); i++)
			tun.addr.a[i] = (uint8_t)rand_r(&seed);
		if (rand_r(&seed) % 2)  /* often sit just below a carry */
			memset(tun.addr.a + (tun.addr.family == 4 ? 2 : 8), 0xff, 2);
		tun.prefix = (uint8_t)(rand_r(&seed) % (tun.addr.family == 4 ? 30 : 126));
		if (netaddr_roles_init(&r, &tun, n, why, sizeof(why)) != 0)
			continue;
		for (int j = -3; j < (int)n + 4; j++) {
			struct netaddr a;
			uint32_t k1 = 0, k2 = 0;
			if (j < 0) {
				/* below the gateway: flip a low bit down */
				a = tun.addr;
				a.a[(tun.addr.family == 4 ? 3 : 15)] ^= (uint8_t)(1u << (-j));
			} else if (netaddr_add(&tun.addr, (uint64_t)j, &a) != 0) {
				continue;
			}
			enum netaddr_role got = netaddr_roles_classify(&r, a.a, &k1);
			enum netaddr_role want = ref_classify(&r, &a, &k2);
			cr_assert_eq(got, want, "round %d offset %d", round, j);
			if (got == NETADDR_ROLE_NAT)
				cr_assert_eq(k1, k2);
			checked++;
		}
	}
	cr_assert_gt(checked, 10000);
}
