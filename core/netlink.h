/* netlink.h — a minimal synchronous rtnetlink client: link attributes and addresses, set and
 * read back.
 *
 * Used at start-up by core/tun_linux.c (and by tests), never on the packet path. Each request
 * goes out on a private NETLINK_ROUTE socket and waits for the kernel's ack; every wait is
 * bounded by a receive timeout (NETLINK_TIMEOUT_MS), so a wedged kernel reply cannot hang the
 * start. Replies are length-checked before any field is read. The socket belongs to the network
 * namespace the calling thread is in when netlink_open() runs.
 *
 * Not thread-safe: one struct netlink per thread.
 */
#ifndef TS_CORE_NETLINK_H
#define TS_CORE_NETLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/netaddr.h"

#define NETLINK_WUR __attribute__((warn_unused_result))

#define NETLINK_TIMEOUT_MS 2000 /* per reply; -ETIMEDOUT after that */
#define NETLINK_EXT_MSG_MAX 160

struct netlink {
	int fd;                            /* -1 when closed */
	uint32_t seq;                      /* last sequence number sent */
	uint32_t port;                     /* our nl_pid, as bound by the kernel */
	char ext_msg[NETLINK_EXT_MSG_MAX]; /* the kernel's words on the last failure, or "" */
};

/* Open and bind a NETLINK_ROUTE socket (close-on-exec, receive timeout set). 0 or -errno. */
int netlink_open(struct netlink *nl) NETLINK_WUR;
/* Close the socket. Idempotent; a zeroed struct with fd = -1 is "closed". */
void netlink_close(struct netlink *nl);

/* RTM_NEWLINK on an existing link. mtu/txqlen 0 = leave unchanged; up: -1 leave, 0 down, 1 up.
 * 0 or the kernel's -errno (with its explanation, if any, in nl->ext_msg). */
struct netlink_link_req {
	uint32_t mtu;
	uint32_t txqlen;
	int up;
};
int netlink_link_set(struct netlink *nl, int ifindex, const struct netlink_link_req *req)
	NETLINK_WUR;

/* RTM_GETLINK for one link. -ENODEV if it does not exist. */
struct netlink_link {
	uint32_t mtu;
	uint32_t txqlen;
	uint32_t flags; /* IFF_* as in ifi_flags */
};
int netlink_link_get(struct netlink *nl, int ifindex, struct netlink_link *out) NETLINK_WUR;

/* RTM_NEWADDR (create or replace): c->addr with prefix c->prefix on ifindex. ifa_flags are
 * IFA_F_* (e.g. IFA_F_NODAD for IPv6). An IPv4 address gets IFA_LOCAL = IFA_ADDRESS, no peer,
 * no broadcast (a TUN is point-to-point). 0 or -errno. */
int netlink_addr_add(struct netlink *nl, int ifindex, const struct netaddr_cidr *c,
		     uint32_t ifa_flags) NETLINK_WUR;
/* RTM_DELADDR. -EADDRNOTAVAIL if it is not there. */
int netlink_addr_del(struct netlink *nl, int ifindex, const struct netaddr_cidr *c) NETLINK_WUR;

/* RTM_GETROUTE: the route the kernel would use to reach dst (main lookup, no mark). */
struct netlink_route {
	uint8_t type;  /* RTN_LOCAL, RTN_UNICAST, ... */
	int oif;       /* output interface index, 0 if none was reported */
};
int netlink_route_get(struct netlink *nl, const struct netaddr *dst, struct netlink_route *out)
	NETLINK_WUR;

/* One address as the kernel reports it. */
struct netlink_addr {
	int ifindex;
	struct netaddr addr; /* the local address (IFA_LOCAL, else IFA_ADDRESS) */
	uint8_t prefix;
	uint32_t flags;      /* IFA_FLAGS if present, else ifa_flags: IFA_F_TENTATIVE, ... */
};
typedef void (*netlink_addr_fn)(void *arg, const struct netlink_addr *a);

/* RTM_GETADDR dump of both families; fn is called for each address on ifindex (0 = every
 * link). The whole dump is always read, so the socket stays in step. -EAGAIN if the kernel
 * flagged the dump inconsistent (addresses changed meanwhile: ask again). */
int netlink_addr_dump(struct netlink *nl, int ifindex, netlink_addr_fn fn, void *arg)
	NETLINK_WUR;

#endif
