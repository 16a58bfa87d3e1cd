/* netaddr.h — IP addresses, CIDRs, "ip:port" endpoints and the TUN's address roles.
 *
 * Pure functions over caller memory: no I/O, no allocation, no shared state.
 *
 * Address roles (docs/architecture.md, "The system stack's packet path"): per family the gateway G
 * is the TUN's own address and the NAT addresses are G+1 .. G+N. netaddr_roles_init() proves once,
 * at config time, that all of them lie inside the TUN prefix and that none is the network or
 * broadcast address (IPv4) or the subnet-router anycast address (IPv6, all-zero host part).
 * Because G .. G+N are then consecutive and never wrap, "is this one of ours" is one subtraction
 * and one compare (netaddr_roles_classify), cheap enough for every packet.
 */
#ifndef TS_CORE_NETADDR_H
#define TS_CORE_NETADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Buffer sizes for the formatters, including the terminating NUL. */
#define NETADDR_STRLEN 46      /* INET6_ADDRSTRLEN */
#define NETADDR_CIDR_STRLEN 50 /* address + "/128" */
#define NETADDR_EP_STRLEN 54   /* "[" address "]:65535" */

/* An IPv4 or IPv6 address in network byte order. IPv4 occupies a[0..3] and the other bytes
 * are zero (the convention of struct flow_key), so addresses compare as plain memory. */
struct netaddr {
	uint8_t family; /* 4 or 6 */
	uint8_t a[16];
};

struct netaddr_cidr {
	struct netaddr addr; /* as written: host bits may be set (a TUN address is a host) */
	uint8_t prefix;      /* 0..32 or 0..128 */
};

struct netaddr_ep {
	struct netaddr addr;
	uint16_t port; /* host byte order, 1..65535 */
};

/* Parsers: the whole string must match, no surrounding spaces, no IPv6 zone ("%eth0").
 * Each returns 0 or -EINVAL and leaves *out unspecified on failure. */
int netaddr_parse(const char *s, struct netaddr *out);
/* "a.b.c.d/n" or "x::y/n"; the "/n" is required. */
int netaddr_parse_cidr(const char *s, struct netaddr_cidr *out);
/* "a.b.c.d:port" or "[x::y]:port", port 1..65535. */
int netaddr_parse_ep(const char *s, struct netaddr_ep *out);
/* A decimal port 1..65535: digits only, at most 5 of them. */
int netaddr_parse_port(const char *s, uint16_t *out);

static inline bool netaddr_eq(const struct netaddr *x, const struct netaddr *y)
{
	return x->family == y->family && memcmp(x->a, y->a, 16) == 0;
}

/* Clear the host bits of c->addr (route rules store networks). */
void netaddr_cidr_normalize(struct netaddr_cidr *c);
/* a inside c (same family, first c->prefix bits equal). */
bool netaddr_in_cidr(const struct netaddr *a, const struct netaddr_cidr *c);
/* 127.0.0.0/8 or ::1. */
bool netaddr_is_loopback(const struct netaddr *a);
/* 16 bytes of an IPv6 address in ::ffff:0:0/96 (an IPv4 address in its last 4). */
static inline bool netaddr_v6_is_v4mapped(const uint8_t a[16])
{
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };

	return memcmp(a, mapped, sizeof(mapped)) == 0;
}

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) becomes the IPv4 address it carries; any other
 * address stays as it is. A configured address means the host it names: this process's IPv6
 * sockets are IPv6-only, so a mapped address kept as IPv6 could never be reached. */
static inline void netaddr_unmap(struct netaddr *a)
{
	if (a->family == 6 && netaddr_v6_is_v4mapped(a->a)) {
		memmove(a->a, a->a + 12, 4);
		memset(a->a + 4, 0, 12);
		a->family = 4;
	}
}

/* out = base + k within the family's address space; -ERANGE if that wraps past the top. */
int netaddr_add(const struct netaddr *base, uint64_t k, struct netaddr *out);

/* Formatters: write a NUL-terminated string (truncated to len) and return buf. */
char *netaddr_format(const struct netaddr *a, char *buf, size_t len);
char *netaddr_cidr_format(const struct netaddr_cidr *c, char *buf, size_t len);
char *netaddr_ep_format(const struct netaddr_ep *e, char *buf, size_t len);

/* Address roles of one family. A zeroed struct (family 0) is "family not configured":
 * classify then says NONE for everything. */
struct netaddr_roles {
	uint8_t family;          /* 0, 4 or 6 */
	uint8_t prefix;          /* TUN prefix length */
	uint32_t n_nat;          /* NAT addresses: gateway+1 .. gateway+n_nat */
	struct netaddr gateway;  /* the TUN address */
	uint64_t gw_hi, gw_lo;   /* gateway as a 128-bit integer (IPv4: gw_lo only) */
};

enum netaddr_role {
	NETADDR_ROLE_NONE,    /* not one of ours */
	NETADDR_ROLE_GATEWAY, /* the TUN address */
	NETADDR_ROLE_NAT,     /* one of the NAT addresses */
};

/* Derive and validate the roles for TUN address tun (its prefix included) and n_nat NAT
 * addresses (n_nat >= 1). Returns 0, or -EINVAL with a one-line reason in why (not naming any
 * config path): prefix too long (/31, /32; /127, /128), gateway is the network/broadcast/anycast
 * address, or a NAT address falls on the broadcast address or outside the prefix. */
int netaddr_roles_init(struct netaddr_roles *r, const struct netaddr_cidr *tun, uint32_t n_nat,
		       char *why, size_t whylen);

/* The k-th NAT address (k in [0, n_nat)): gateway + 1 + k. */
void netaddr_roles_nat(const struct netaddr_roles *r, uint32_t k, struct netaddr *out);

static inline uint64_t netaddr_load_be64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = (v << 8) | p[i];
	return v;
}

/* Classify raw address bytes of r's family (4 or 16 bytes, network order, e.g. a flow_key's
 * dst). For NETADDR_ROLE_NAT, *nat_index (if not NULL) receives k: the address is gateway+1+k.
 * Valid because netaddr_roles_init proved gateway .. gateway+n_nat consecutive and unwrapped. */
static inline enum netaddr_role netaddr_roles_classify(const struct netaddr_roles *r,
						       const uint8_t *addr, uint32_t *nat_index)
{
	uint64_t off;

	if (r->family == 4) {
		uint32_t v = (uint32_t)addr[0] << 24 | (uint32_t)addr[1] << 16 |
			     (uint32_t)addr[2] << 8 | addr[3];
		off = (uint32_t)(v - (uint32_t)r->gw_lo);
	} else if (r->family == 6) {
		uint64_t hi = netaddr_load_be64(addr), lo = netaddr_load_be64(addr + 8);
		uint64_t borrow = lo < r->gw_lo;
		if (hi - r->gw_hi - borrow != 0)
			return NETADDR_ROLE_NONE;
		off = lo - r->gw_lo;
	} else {
		return NETADDR_ROLE_NONE;
	}
	if (off == 0)
		return NETADDR_ROLE_GATEWAY;
	if (off > r->n_nat)
		return NETADDR_ROLE_NONE;
	if (nat_index)
		*nat_index = (uint32_t)(off - 1);
	return NETADDR_ROLE_NAT;
}

/* Gateway or a NAT address. */
static inline bool netaddr_roles_is_ours(const struct netaddr_roles *r, const uint8_t *addr)
{
	return netaddr_roles_classify(r, addr, NULL) != NETADDR_ROLE_NONE;
}

struct sockaddr_storage;
/* Fill ss with family's address (4 or 16 bytes at addr) and port (network order); returns the
 * sockaddr length, or 0 for an unknown family. */
unsigned netaddr_sockaddr(int family, const uint8_t *addr, uint16_t port_be,
			  struct sockaddr_storage *ss);

/* The reverse: ss's address into addr (4 or 16 bytes used, the rest zeroed) and its port
 * (network order). Returns the family (4 or 6), or 0 for another address family. */
int netaddr_from_sockaddr(const struct sockaddr_storage *ss, uint8_t addr[16], uint16_t *port_be);

#endif
