/* netaddr.c — address parsing, formatting, CIDR arithmetic and the TUN's address roles. */
#include "core/netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>

static int parse_family(const char *s, size_t n, int family, struct netaddr *out)
{
	char buf[NETADDR_STRLEN];

	if (n == 0 || n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, n);
	buf[n] = '\0';
	memset(out, 0, sizeof(*out));
	if (family == 4 && inet_pton(AF_INET, buf, out->a) == 1) {
		out->family = 4;
		return 0;
	}
	if (family == 6 && inet_pton(AF_INET6, buf, out->a) == 1) {
		out->family = 6;
		return 0;
	}
	return -EINVAL;
}

int netaddr_parse(const char *s, struct netaddr *out)
{
	size_t n = strlen(s);

	if (parse_family(s, n, 4, out) == 0)
		return 0;
	return parse_family(s, n, 6, out);
}

/* Up to max_digits decimal digits, nothing else, value <= max. */
static int parse_uint(const char *s, unsigned max_digits, unsigned long max, unsigned long *out)
{
	unsigned long v = 0;
	size_t n = 0;

	for (; s[n] != '\0'; n++) {
		if (s[n] < '0' || s[n] > '9' || n >= max_digits)
			return -EINVAL;
		v = v * 10 + (unsigned long)(s[n] - '0');
	}
	if (n == 0 || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

int netaddr_parse_port(const char *s, uint16_t *out)
{
	unsigned long v;

	if (parse_uint(s, 5, 65535, &v) != 0 || v == 0)
		return -EINVAL;
	*out = (uint16_t)v;
	return 0;
}

int netaddr_parse_cidr(const char *s, struct netaddr_cidr *out)
{
	const char *slash = strchr(s, '/');
	unsigned long plen;

	if (!slash)
		return -EINVAL;
	if (parse_family(s, (size_t)(slash - s), 4, &out->addr) != 0 &&
	    parse_family(s, (size_t)(slash - s), 6, &out->addr) != 0)
		return -EINVAL;
	if (parse_uint(slash + 1, 3, out->addr.family == 4 ? 32 : 128, &plen) != 0)
		return -EINVAL;
	out->prefix = (uint8_t)plen;
	return 0;
}

int netaddr_parse_ep(const char *s, struct netaddr_ep *out)
{
	const char *colon;

	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (!close || close[1] != ':')
			return -EINVAL;
		if (parse_family(s + 1, (size_t)(close - s - 1), 6, &out->addr) != 0)
			return -EINVAL;
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || parse_family(s, (size_t)(colon - s), 4, &out->addr) != 0)
			return -EINVAL;
	}
	return netaddr_parse_port(colon + 1, &out->port);
}

static size_t addr_len(const struct netaddr *a)
{
	return a->family == 4 ? 4 : 16;
}

void netaddr_cidr_normalize(struct netaddr_cidr *c)
{
	size_t len = addr_len(&c->addr);

	for (size_t i = 0; i < len; i++) {
		unsigned bit = (unsigned)i * 8;
		if (bit >= c->prefix)
			c->addr.a[i] = 0;
		else if (bit + 8 > c->prefix)
			c->addr.a[i] &= (uint8_t)(0xff << (8 - (c->prefix - bit)));
	}
}

bool netaddr_in_cidr(const struct netaddr *a, const struct netaddr_cidr *c)
{
	unsigned full = c->prefix / 8, rest = c->prefix % 8;

	if (a->family != c->addr.family)
		return false;
	if (memcmp(a->a, c->addr.a, full) != 0)
		return false;
	if (rest == 0)
		return true;
	uint8_t mask = (uint8_t)(0xff << (8 - rest));
	return ((a->a[full] ^ c->addr.a[full]) & mask) == 0;
}

bool netaddr_is_loopback(const struct netaddr *a)
{
	static const uint8_t v6_loop[16] = { [15] = 1 };

	if (a->family == 4)
		return a->a[0] == 127;
	return a->family == 6 && memcmp(a->a, v6_loop, 16) == 0;
}

/* The address as a 128-bit integer (IPv4: lo only). */
static void to_u128(const struct netaddr *a, uint64_t *hi, uint64_t *lo)
{
	if (a->family == 4) {
		*hi = 0;
		*lo = (uint64_t)a->a[0] << 24 | (uint64_t)a->a[1] << 16 | (uint64_t)a->a[2] << 8 |
		      a->a[3];
		return;
	}
	*hi = netaddr_load_be64(a->a);
	*lo = netaddr_load_be64(a->a + 8);
}

static void from_u128(uint8_t family, uint64_t hi, uint64_t lo, struct netaddr *out)
{
	memset(out, 0, sizeof(*out));
	out->family = family;
	if (family == 4) {
		for (int i = 0; i < 4; i++)
			out->a[i] = (uint8_t)(lo >> (24 - 8 * i));
		return;
	}
	for (int i = 0; i < 8; i++) {
		out->a[i] = (uint8_t)(hi >> (56 - 8 * i));
		out->a[8 + i] = (uint8_t)(lo >> (56 - 8 * i));
	}
}

int netaddr_add(const struct netaddr *base, uint64_t k, struct netaddr *out)
{
	uint64_t hi, lo;

	to_u128(base, &hi, &lo);
	if (base->family == 4) {
		if (k > UINT32_MAX || lo + k > UINT32_MAX)
			return -ERANGE;
		from_u128(4, 0, lo + k, out);
		return 0;
	}
	uint64_t nlo = lo + k;
	uint64_t nhi = hi + (nlo < lo);
	if (nlo < lo && nhi == 0)
		return -ERANGE;
	from_u128(6, nhi, nlo, out);
	return 0;
}

char *netaddr_format(const struct netaddr *a, char *buf, size_t len)
{
	char tmp[NETADDR_STRLEN];

	if (!inet_ntop(a->family == 4 ? AF_INET : AF_INET6, a->a, tmp, sizeof(tmp)))
		snprintf(tmp, sizeof(tmp), "?");
	snprintf(buf, len, "%s", tmp);
	return buf;
}

char *netaddr_cidr_format(const struct netaddr_cidr *c, char *buf, size_t len)
{
	char tmp[NETADDR_STRLEN];

	snprintf(buf, len, "%s/%u", netaddr_format(&c->addr, tmp, sizeof(tmp)), c->prefix);
	return buf;
}

char *netaddr_ep_format(const struct netaddr_ep *e, char *buf, size_t len)
{
	char tmp[NETADDR_STRLEN];

	netaddr_format(&e->addr, tmp, sizeof(tmp));
	if (e->addr.family == 6)
		snprintf(buf, len, "[%s]:%u", tmp, e->port);
	else
		snprintf(buf, len, "%s:%u", tmp, e->port);
	return buf;
}

/* Host part of the gateway (hi, lo) under host_bits, and the largest host value. */
struct host_span {
	uint64_t gw_hi, gw_lo;   /* host part of the gateway */
	uint64_t max_hi, max_lo; /* all-ones host part */
};

static void host_span(const struct netaddr_roles *r, unsigned host_bits, struct host_span *h)
{
	h->max_hi = host_bits > 64 ? (host_bits >= 128 ? UINT64_MAX : (1ULL << (host_bits - 64)) - 1)
				   : 0;
	h->max_lo = host_bits >= 64 ? UINT64_MAX : (1ULL << host_bits) - 1;
	h->gw_hi = r->gw_hi & h->max_hi;
	h->gw_lo = r->gw_lo & h->max_lo;
}

/* (hi, lo) + n; returns true if the 128-bit sum wrapped. */
static bool add_small(uint64_t hi, uint64_t lo, uint64_t n, uint64_t *ohi, uint64_t *olo)
{
	*olo = lo + n;
	*ohi = hi + (*olo < lo);
	return *olo < lo && *ohi == 0;
}

static bool u128_gt(uint64_t ahi, uint64_t alo, uint64_t bhi, uint64_t blo)
{
	return ahi > bhi || (ahi == bhi && alo > blo);
}

static bool u128_eq(uint64_t ahi, uint64_t alo, uint64_t bhi, uint64_t blo)
{
	return ahi == bhi && alo == blo;
}

/* The longest prefix whose host part fits network + gateway + n_nat + broadcast (IPv4) or
 * anycast + gateway + n_nat (IPv6). */
static unsigned longest_prefix(uint8_t family, uint32_t n_nat)
{
	uint64_t need = (uint64_t)n_nat + (family == 4 ? 3 : 2);
	unsigned bits = 1;

	while ((1ULL << bits) < need)
		bits++;
	return (family == 4 ? 32u : 128u) - bits;
}

/* Explain which NAT address is the first that does not fit (n_nat is known not to fit). */
static int roles_overflow(const struct netaddr_roles *r, const struct host_span *h,
			  uint32_t n_nat, char *why, size_t whylen)
{
	struct netaddr_cidr net = { .addr = r->gateway, .prefix = r->prefix };
	char bad[NETADDR_STRLEN], netbuf[NETADDR_CIDR_STRLEN];
	struct netaddr a;
	/* How many fit: max - gw, minus broadcast for IPv4. Fewer than n_nat, so 64 bits hold it. */
	uint64_t fit = h->max_lo - h->gw_lo - (r->family == 4 ? 1 : 0);

	netaddr_cidr_normalize(&net);
	netaddr_cidr_format(&net, netbuf, sizeof(netbuf));
	if (netaddr_add(&r->gateway, fit + 1, &a) != 0)
		snprintf(bad, sizeof(bad), "beyond the address space");
	else
		netaddr_format(&a, bad, sizeof(bad));
	snprintf(why, whylen,
		 "NAT address %s (gateway+%llu) %s %s: only %llu of the %u NAT addresses "
		 "(nat.addresses) fit after the gateway; lower nat.addresses or widen the prefix",
		 bad, (unsigned long long)(fit + 1),
		 r->family == 4 ? "would be the broadcast address of" : "lies outside", netbuf,
		 (unsigned long long)fit, n_nat);
	return -EINVAL;
}

/* Why a gateway address cannot be a TUN's own (NULL: it can be). The kernel puts loopback,
 * multicast, "this network" and IPv4-mapped addresses on a TUN without a word, but the apps'
 * traffic never reaches the proxy through them: refused at start instead. */
static const char *gateway_unusable(const struct netaddr *a)
{
	if (netaddr_is_loopback(a))
		return "a loopback address";
	if (a->family == 4) {
		if (a->a[0] >= 224 && a->a[0] < 240)
			return "a multicast address";
		if (a->a[0] == 0)
			return "in 0.0.0.0/8 (\"this network\")";
		return NULL;
	}
	if (a->a[0] == 0xff)
		return "a multicast address";
	if (netaddr_v6_is_v4mapped(a->a))
		return "an IPv4-mapped address (give the IPv4 address as tun.address)";
	return NULL;
}

static int roles_check(const struct netaddr_roles *r, uint32_t n_nat, char *why, size_t whylen)
{
	unsigned width = r->family == 4 ? 32 : 128;
	unsigned host_bits = width - r->prefix;
	struct host_span h;
	char gw[NETADDR_STRLEN];
	uint64_t lhi, llo;
	const char *unusable = gateway_unusable(&r->gateway);

	if (unusable) {
		netaddr_format(&r->gateway, gw, sizeof(gw));
		snprintf(why, whylen, "%s is %s: a TUN's own address must be a unicast address",
			 gw, unusable);
		return -EINVAL;
	}

	if (host_bits <= 1) {
		snprintf(why, whylen,
			 "a /%u prefix leaves no room for NAT addresses (gateway + %u NAT addresses "
			 "need /%u or shorter)",
			 r->prefix, n_nat, longest_prefix(r->family, n_nat));
		return -EINVAL;
	}
	host_span(r, host_bits, &h);
	netaddr_format(&r->gateway, gw, sizeof(gw));
	if (h.gw_hi == 0 && h.gw_lo == 0) {
		snprintf(why, whylen, "%s is the %s address of its /%u: use a host address", gw,
			 r->family == 4 ? "network" : "subnet-router anycast", r->prefix);
		return -EINVAL;
	}
	if (r->family == 4 && u128_eq(h.gw_hi, h.gw_lo, h.max_hi, h.max_lo)) {
		snprintf(why, whylen, "%s is the broadcast address of its /%u: use a host address",
			 gw, r->prefix);
		return -EINVAL;
	}
	/* The last NAT address must stay inside the prefix and (IPv4) below broadcast. */
	bool outside = add_small(h.gw_hi, h.gw_lo, n_nat, &lhi, &llo) ||
		       u128_gt(lhi, llo, h.max_hi, h.max_lo) ||
		       (r->family == 4 && u128_eq(lhi, llo, h.max_hi, h.max_lo));
	if (outside)
		return roles_overflow(r, &h, n_nat, why, whylen);
	return 0;
}

int netaddr_roles_init(struct netaddr_roles *r, const struct netaddr_cidr *tun, uint32_t n_nat,
		       char *why, size_t whylen)
{
	memset(r, 0, sizeof(*r));
	if ((tun->addr.family != 4 && tun->addr.family != 6) || n_nat == 0 ||
	    tun->prefix > (tun->addr.family == 4 ? 32 : 128)) {
		snprintf(why, whylen, "invalid address or NAT address count");
		return -EINVAL;
	}
	r->family = tun->addr.family;
	r->prefix = tun->prefix;
	r->n_nat = n_nat;
	r->gateway = tun->addr;
	to_u128(&tun->addr, &r->gw_hi, &r->gw_lo);
	int ret = roles_check(r, n_nat, why, whylen);
	if (ret != 0)
		memset(r, 0, sizeof(*r));
	return ret;
}

void netaddr_roles_nat(const struct netaddr_roles *r, uint32_t k, struct netaddr *out)
{
	uint64_t hi, lo;

	(void)add_small(r->gw_hi, r->gw_lo, (uint64_t)k + 1, &hi, &lo);
	from_u128(r->family, hi, lo, out);
}

unsigned netaddr_sockaddr(int family, const uint8_t *addr, uint16_t port_be,
			  struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (family == 4) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;
		sin->sin_family = AF_INET;
		sin->sin_port = port_be;
		memcpy(&sin->sin_addr, addr, 4);
		return sizeof(*sin);
	}
	if (family == 6) {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = port_be;
		memcpy(&sin6->sin6_addr, addr, 16);
		return sizeof(*sin6);
	}
	return 0;
}

int netaddr_from_sockaddr(const struct sockaddr_storage *ss, uint8_t addr[16], uint16_t *port_be)
{
	memset(addr, 0, 16);
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
		memcpy(addr, &sin->sin_addr, 4);
		*port_be = sin->sin_port;
		return 4;
	}
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;
		memcpy(addr, &sin6->sin6_addr, 16);
		*port_be = sin6->sin6_port;
		return 6;
	}
	return 0;
}
