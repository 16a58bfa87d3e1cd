/* redirect_lib.c — option values and the session key of `twinstack redirect` (redirect_lib.h). */
#include "cli/redirect_lib.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>

int redirect_parse_listen(const char *s, int family, struct netaddr_ep *out)
{
	if (s[0] == ':') {
		memset(out, 0, sizeof(*out));
		out->addr.family = (uint8_t)family;
		if (family == 4) {
			out->addr.a[0] = 127;
			out->addr.a[3] = 1;
		} else if (family == 6) {
			out->addr.a[15] = 1;
		} else {
			return -EINVAL;
		}
		return netaddr_parse_port(s + 1, &out->port);
	}
	if (netaddr_parse_ep(s, out) != 0 || out->addr.family != family)
		return -EINVAL;
	return 0;
}

int redirect_parse_mark(const char *s, uint32_t *out)
{
	const char *p = s;
	unsigned base = 10;
	uint64_t v = 0;

	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		p = s + 2;
	}
	if (!*p)
		return -EINVAL; /* no digit */
	for (; *p; p++) {
		unsigned d;

		if (*p >= '0' && *p <= '9')
			d = (unsigned)(*p - '0');
		else if (base == 16 && *p >= 'a' && *p <= 'f')
			d = (unsigned)(*p - 'a' + 10);
		else if (base == 16 && *p >= 'A' && *p <= 'F')
			d = (unsigned)(*p - 'A' + 10);
		else
			return -EINVAL; /* a sign, a space, a letter */
		v = v * base + d;
		if (v > UINT32_MAX)
			return -EINVAL; /* checked per digit: v never wraps */
	}
	if (v == 0)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int redirect_parse_relay(const char *s, enum ts_relay_mode *out)
{
	if (strcmp(s, "splice") == 0)
		*out = TS_RELAY_SPLICE;
	else if (strcmp(s, "copy") == 0)
		*out = TS_RELAY_COPY;
	else
		return -EINVAL;
	return 0;
}

int redirect_parse_stats(const char *s, struct netaddr_ep *out)
{
	if (netaddr_parse_ep(s, out) != 0 || !netaddr_is_loopback(&out->addr))
		return -EINVAL;
	return 0;
}

int redirect_parse_socks5(const char *s, struct netaddr_ep *out)
{
	static const uint8_t zero[16];

	if (netaddr_parse_ep(s, out) != 0)
		return -EINVAL;
	if (out->addr.family == 4 && (memcmp(out->addr.a, zero, 4) == 0 ||
				      (out->addr.a[0] & 0xf0) == 0xe0))
		return -EINVAL; /* 0.0.0.0, 224.0.0.0/4 */
	if (out->addr.family == 6 && (memcmp(out->addr.a, zero, 16) == 0 || out->addr.a[0] == 0xff))
		return -EINVAL; /* ::, ff00::/8 */
	return 0;
}

int redirect_udp_check(const struct netaddr_ep *listen, const struct netaddr_ep *to)
{
	static const uint8_t zero[16];
	size_t n = listen->addr.family == 4 ? 4 : 16;

	if (memcmp(listen->addr.a, zero, n) == 0)
		return -EINVAL;
	if (to->addr.family != listen->addr.family || to->port != listen->port)
		return 0;
	if (memcmp(to->addr.a, listen->addr.a, n) == 0 ||
	    (netaddr_is_loopback(&listen->addr) && netaddr_is_loopback(&to->addr)))
		return -ELOOP;
	return 0;
}

int redirect_session_key(const struct sockaddr_storage *peer, const struct sockaddr_storage *local,
			 const struct sockaddr_storage *orig, struct flow_key *key)
{
	uint8_t laddr[16];
	uint16_t lport;
	int family;

	memset(key, 0, sizeof(*key));
	family = netaddr_from_sockaddr(orig, key->dst, &key->dport_be);
	if (family == 0 || netaddr_from_sockaddr(peer, key->src, &key->sport_be) != family ||
	    netaddr_from_sockaddr(local, laddr, &lport) != family)
		return -EAFNOSUPPORT;
	key->family = (uint8_t)family;
	key->proto = IPPROTO_TCP;
	if (lport == key->dport_be && memcmp(laddr, key->dst, 16) == 0)
		return -ELOOP;
	return 0;
}
