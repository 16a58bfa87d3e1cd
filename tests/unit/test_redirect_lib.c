/* test_redirect_lib.c — the pure parts of `twinstack redirect` (cli/redirect_lib.c): option
 * values, and the session key (or the refusal) made from an accepted connection's addresses.
 *
 * The cli/ sources are linked only into the twinstack binary, so the library is compiled in
 * here. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "cli/redirect_lib.c"

/* ---- --listen / --listen6 -------------------------------------------------------------------- */

Test(redirect_listen, port_alone_is_the_family_loopback)
{
	struct netaddr_ep ep;
	uint8_t lo6[16] = { [15] = 1 };

	cr_assert_eq(redirect_parse_listen(":15001", 4, &ep), 0);
	cr_assert_eq(ep.addr.family, 4);
	cr_assert_eq(memcmp(ep.addr.a, "\x7f\0\0\x01", 4), 0);
	cr_assert_eq(ep.port, 15001);
	cr_assert_eq(redirect_parse_listen(":80", 6, &ep), 0);
	cr_assert_eq(ep.addr.family, 6);
	cr_assert_eq(memcmp(ep.addr.a, lo6, 16), 0);
	cr_assert_eq(ep.port, 80);
}

Test(redirect_listen, address_and_port)
{
	struct netaddr_ep ep;

	cr_assert_eq(redirect_parse_listen("0.0.0.0:1", 4, &ep), 0);
	cr_assert_eq(ep.addr.family, 4);
	cr_assert_eq(ep.port, 1);
	cr_assert_eq(redirect_parse_listen("[fd00::1]:65535", 6, &ep), 0);
	cr_assert_eq(ep.addr.family, 6);
	cr_assert_eq(ep.addr.a[0], 0xfd);
	cr_assert_eq(ep.addr.a[15], 1);
	cr_assert_eq(ep.port, 65535);
}

Test(redirect_listen, refused)
{
	static const char *const bad4[] = { "", ":", ":0", ":65536", ":-1", ":8x", "15001",
					    "127.0.0.1", "127.0.0.1:", "[::1]:80", "1.2.3:80",
					    " :80", ":80 " };
	static const char *const bad6[] = { ":0", "::1:80", "[::1]", "[::1]:", "127.0.0.1:80",
					    "[127.0.0.1]:80", "[fe80::1%lo]:80" };
	struct netaddr_ep ep;

	for (size_t i = 0; i < sizeof(bad4) / sizeof(bad4[0]); i++)
		cr_expect_eq(redirect_parse_listen(bad4[i], 4, &ep), -EINVAL, "'%s' as IPv4",
			     bad4[i]);
	for (size_t i = 0; i < sizeof(bad6) / sizeof(bad6[0]); i++)
		cr_expect_eq(redirect_parse_listen(bad6[i], 6, &ep), -EINVAL, "'%s' as IPv6",
			     bad6[i]);
	cr_expect_eq(redirect_parse_listen(":80", 5, &ep), -EINVAL, "no family 5");
}

/* ---- --udp-listen / --udp-to ------------------------------------------------------------------ */

static struct netaddr_ep ep_of(const char *s)
{
	struct netaddr_ep ep;

	cr_assert_eq(netaddr_parse_ep(s, &ep), 0, "%s", s);
	return ep;
}

Test(redirect_udp, a_forwarder_to_another_address_or_port)
{
	struct netaddr_ep l = ep_of("127.0.0.1:7400"), t = ep_of("10.200.1.2:7007");

	cr_assert_eq(redirect_udp_check(&l, &t), 0);
	t = ep_of("127.0.0.1:7401");
	cr_assert_eq(redirect_udp_check(&l, &t), 0, "another port on loopback");
	t = ep_of("[::1]:7400");
	cr_assert_eq(redirect_udp_check(&l, &t), 0, "the other family");
	l = ep_of("10.0.0.1:7400");
	t = ep_of("127.0.0.1:7400");
	cr_assert_eq(redirect_udp_check(&l, &t), 0, "listening elsewhere, loopback is not us");
}

Test(redirect_udp, to_itself_is_a_loop)
{
	struct netaddr_ep l = ep_of("127.0.0.1:7400"), t = ep_of("127.0.0.1:7400");

	cr_assert_eq(redirect_udp_check(&l, &t), -ELOOP);
	t = ep_of("127.0.0.53:7400");
	cr_assert_eq(redirect_udp_check(&l, &t), -ELOOP, "any loopback address reaches 127.0.0.1");
	l = ep_of("10.0.0.1:53");
	t = ep_of("10.0.0.1:53");
	cr_assert_eq(redirect_udp_check(&l, &t), -ELOOP);
	l = ep_of("[::1]:80");
	t = ep_of("[::1]:80");
	cr_assert_eq(redirect_udp_check(&l, &t), -ELOOP);
}

Test(redirect_udp, the_unspecified_address_is_refused)
{
	struct netaddr_ep l = ep_of("0.0.0.0:7400"), t = ep_of("10.200.1.2:7007");

	cr_assert_eq(redirect_udp_check(&l, &t), -EINVAL);
	l = ep_of("[::]:7400");
	cr_assert_eq(redirect_udp_check(&l, &t), -EINVAL);
}

/* ---- --socks5 -------------------------------------------------------------------------------- */

Test(redirect_socks5, addresses)
{
	struct netaddr_ep ep;

	cr_assert_eq(redirect_parse_socks5("10.200.0.2:1080", &ep), 0);
	cr_assert_eq(ep.addr.family, 4);
	cr_assert_eq(ep.addr.a[0], 10);
	cr_assert_eq(ep.addr.a[3], 2);
	cr_assert_eq(ep.port, 1080);
	cr_assert_eq(redirect_parse_socks5("127.0.0.1:1", &ep), 0, "a local server");
	cr_assert_eq(redirect_parse_socks5("[fd03::2]:65535", &ep), 0);
	cr_assert_eq(ep.addr.family, 6);
	cr_assert_eq(ep.addr.a[0], 0xfd);
	cr_assert_eq(ep.addr.a[15], 2);
	cr_assert_eq(ep.port, 65535);
}

Test(redirect_socks5, refused)
{
	static const char *const bad[] = { "", ":1080", "10.200.0.2", "10.200.0.2:0",
					   "10.200.0.2:65536", "proxy.example:1080", "fd03::2:1080",
					   "[fd03::2]", "0.0.0.0:1080", "[::]:1080",
					   "224.0.0.1:1080", "239.255.255.250:1080", "[ff02::1]:1080",
					   " 10.200.0.2:1080", "10.200.0.2:1080 " };
	struct netaddr_ep ep;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(redirect_parse_socks5(bad[i], &ep), -EINVAL, "'%s'", bad[i]);
}

/* ---- --mark ---------------------------------------------------------------------------------- */

Test(redirect_mark, decimal_and_hex)
{
	uint32_t m = 0;

	cr_assert_eq(redirect_parse_mark("1", &m), 0);
	cr_assert_eq(m, 1);
	cr_assert_eq(redirect_parse_mark("4294967295", &m), 0);
	cr_assert_eq(m, UINT32_MAX);
	cr_assert_eq(redirect_parse_mark("0x1a3", &m), 0);
	cr_assert_eq(m, 0x1a3);
	cr_assert_eq(redirect_parse_mark("0XFFFFFFFF", &m), 0);
	cr_assert_eq(m, UINT32_MAX);
	cr_assert_eq(redirect_parse_mark("0x74000000", &m), 0);
	cr_assert_eq(m, 0x74000000u);
	cr_assert_eq(redirect_parse_mark("010", &m), 0, "a leading zero is decimal, not octal");
	cr_assert_eq(m, 10);
}

Test(redirect_mark, refused)
{
	static const char *const bad[] = { "", "0", "0x0", "00", "0x", "x1", "4294967296",
					   "0x100000000", "99999999999999999999999", "-1", "+1",
					   " 1", "1 ", "1.0", "0x1g", "1e3", "0b1" };
	uint32_t m = 7;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_expect_eq(redirect_parse_mark(bad[i], &m), -EINVAL, "'%s'", bad[i]);
		cr_expect_eq(m, 7, "'%s' left the output alone", bad[i]);
	}
}

/* ---- --relay, --stats ------------------------------------------------------------------------ */

Test(redirect_relay, modes)
{
	enum ts_relay_mode m = TS_RELAY_COPY;

	cr_assert_eq(redirect_parse_relay("splice", &m), 0);
	cr_assert_eq(m, TS_RELAY_SPLICE);
	cr_assert_eq(redirect_parse_relay("copy", &m), 0);
	cr_assert_eq(m, TS_RELAY_COPY);
	cr_assert_eq(redirect_parse_relay("Splice", &m), -EINVAL);
	cr_assert_eq(redirect_parse_relay("", &m), -EINVAL);
	cr_assert_eq(redirect_parse_relay("splice ", &m), -EINVAL);
}

Test(redirect_stats, loopback_only)
{
	struct netaddr_ep ep;

	cr_assert_eq(redirect_parse_stats("127.0.0.1:9194", &ep), 0);
	cr_assert_eq(ep.port, 9194);
	cr_assert_eq(redirect_parse_stats("127.8.9.10:1", &ep), 0);
	cr_assert_eq(redirect_parse_stats("[::1]:9194", &ep), 0);
	cr_assert_eq(redirect_parse_stats("0.0.0.0:9194", &ep), -EINVAL, "not the wildcard");
	cr_assert_eq(redirect_parse_stats("10.0.0.1:9194", &ep), -EINVAL);
	cr_assert_eq(redirect_parse_stats("[::]:9194", &ep), -EINVAL);
	cr_assert_eq(redirect_parse_stats(":9194", &ep), -EINVAL, "the address is required");
	cr_assert_eq(redirect_parse_stats("127.0.0.1:0", &ep), -EINVAL);
}

/* ---- the session key ------------------------------------------------------------------------- */

static struct sockaddr_storage sa4(const char *a, uint16_t port)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *s = (struct sockaddr_in *)&ss;

	memset(&ss, 0, sizeof(ss));
	s->sin_family = AF_INET;
	s->sin_port = htons(port);
	cr_assert_eq(inet_pton(AF_INET, a, &s->sin_addr), 1);
	return ss;
}

static struct sockaddr_storage sa6(const char *a, uint16_t port)
{
	struct sockaddr_storage ss;
	struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;

	memset(&ss, 0, sizeof(ss));
	s->sin6_family = AF_INET6;
	s->sin6_port = htons(port);
	cr_assert_eq(inet_pton(AF_INET6, a, &s->sin6_addr), 1);
	return ss;
}

Test(redirect_key, ipv4_peer_to_original_destination)
{
	struct sockaddr_storage peer = sa4("10.203.0.1", 40000), local = sa4("127.0.0.1", 15001),
				orig = sa4("10.203.0.2", 8001);
	struct flow_key k, zero;

	cr_assert_eq(redirect_session_key(&peer, &local, &orig, &k), 0);
	cr_assert_eq(k.family, 4);
	cr_assert_eq(k.proto, IPPROTO_TCP);
	cr_assert_eq(k.sport_be, htons(40000));
	cr_assert_eq(k.dport_be, htons(8001));
	cr_assert_eq(memcmp(k.src, "\x0a\xcb\x00\x01", 4), 0);
	cr_assert_eq(memcmp(k.dst, "\x0a\xcb\x00\x02", 4), 0);
	/* The rest of the key is zero: keys compare and hash as memory (core/flow.h). */
	memset(&zero, 0, sizeof(zero));
	cr_assert_eq(memcmp(k.src + 4, zero.src, 12), 0);
	cr_assert_eq(memcmp(k.dst + 4, zero.dst, 12), 0);
	cr_assert_eq(k.zero, 0);
}

Test(redirect_key, ipv6)
{
	struct sockaddr_storage peer = sa6("fd03::1", 40000), local = sa6("::1", 15001),
				orig = sa6("fd03::2", 443);
	struct flow_key k;

	cr_assert_eq(redirect_session_key(&peer, &local, &orig, &k), 0);
	cr_assert_eq(k.family, 6);
	cr_assert_eq(k.dport_be, htons(443));
	cr_assert_eq(k.dst[0], 0xfd);
	cr_assert_eq(k.dst[15], 2);
	cr_assert_eq(k.src[15], 1);
}

/* The original destination is where the connection arrived: no redirect happened (a client
 * connected to the listener directly), so relaying would connect back to ourselves. */
Test(redirect_key, loop)
{
	struct sockaddr_storage peer = sa4("127.0.0.1", 40000), local = sa4("127.0.0.1", 15001),
				orig = sa4("127.0.0.1", 15001);
	struct sockaddr_storage p6 = sa6("::1", 40000), l6 = sa6("::1", 15001),
				o6 = sa6("::1", 15001);
	struct flow_key k;

	cr_assert_eq(redirect_session_key(&peer, &local, &orig, &k), -ELOOP);
	cr_assert_eq(redirect_session_key(&p6, &l6, &o6, &k), -ELOOP);
	/* A wildcard listener reached on another local address: still itself. */
	local = sa4("10.203.0.1", 15001);
	orig = sa4("10.203.0.1", 15001);
	cr_assert_eq(redirect_session_key(&peer, &local, &orig, &k), -ELOOP);
}

Test(redirect_key, same_address_other_port_or_same_port_other_address_is_fine)
{
	struct sockaddr_storage peer = sa4("127.0.0.1", 40000), local = sa4("127.0.0.1", 15001);
	struct sockaddr_storage o1 = sa4("127.0.0.1", 15002), o2 = sa4("127.0.0.2", 15001);
	struct flow_key k;

	cr_assert_eq(redirect_session_key(&peer, &local, &o1, &k), 0);
	cr_assert_eq(redirect_session_key(&peer, &local, &o2, &k), 0);
}

Test(redirect_key, families_must_agree)
{
	struct sockaddr_storage p4 = sa4("10.0.0.1", 1), l4 = sa4("127.0.0.1", 2),
				o4 = sa4("10.0.0.2", 3), o6 = sa6("fd03::2", 3), none;
	struct flow_key k;

	memset(&none, 0, sizeof(none));
	none.ss_family = AF_UNIX;
	cr_assert_eq(redirect_session_key(&p4, &l4, &o6, &k), -EAFNOSUPPORT);
	cr_assert_eq(redirect_session_key(&p4, &l4, &none, &k), -EAFNOSUPPORT);
	cr_assert_eq(redirect_session_key(&none, &l4, &o4, &k), -EAFNOSUPPORT);
	cr_assert_eq(redirect_session_key(&p4, &none, &o4, &k), -EAFNOSUPPORT);
}
