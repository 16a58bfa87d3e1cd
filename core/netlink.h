/* netlink.h — a minimal synchronous rtnetlink client: link attributes and addresses, set and
 * read back; route lookups; policy rules and routes added, deleted and dumped.
 *
 * Used at start-up by core/tun_linux.c, by the routing setup (runtime/autoroute.c) and by
 * tests, never on the packet path. Each request
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
	struct netaddr src; /* the source address it would choose (RTA_PREFSRC); family 0: none */
	struct netaddr gw;  /* its gateway (RTA_GATEWAY); family 0: none, the destination is on
			     * the link (or a gateway of the other family: via) */
	bool via;           /* the gateway is of the other family (RTA_VIA) */
};
int netlink_route_get(struct netlink *nl, const struct netaddr *dst, struct netlink_route *out)
	NETLINK_WUR;
/* The same lookup as a socket with SO_MARK = mark (0: none) bound to interface oif (0: none)
 * would get: RTA_MARK and RTA_OIF in the request. Policy rules matching the mark are applied.
 * The kernel's refusals come back as -errno: -ENETUNREACH (no route), -EHOSTUNREACH (an
 * "unreachable" route matched). -ENOENT if the reply carried no route. */
int netlink_route_get_ex(struct netlink *nl, const struct netaddr *dst, uint32_t mark, int oif,
			 struct netlink_route *out) NETLINK_WUR;

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

/* A policy routing rule (ip rule), as added, deleted or dumped. Fields left at their
 * netlink_rule_init() values are "not a selector" and are not sent. */
#define NETLINK_RULE_LOOKUP 1 /* FR_ACT_TO_TBL: look up table */
#define NETLINK_RULE_GOTO 2   /* FR_ACT_GOTO: continue at the first rule with priority target */
#define NETLINK_RULE_NOP 3    /* FR_ACT_NOP: match and do nothing (a goto target) */
#define NETLINK_IFNAMSIZ 16   /* IFNAMSIZ */

struct netlink_rule {
	uint8_t family;          /* 4 or 6 */
	uint8_t action;          /* NETLINK_RULE_* */
	uint8_t protocol;        /* FRA_PROTOCOL: who installed it (0: unspecified) */
	bool invert;             /* FIB_RULE_INVERT: the rule matches what the selectors do not */
	uint32_t priority;       /* FRA_PRIORITY */
	uint32_t table;          /* LOOKUP: the table */
	uint32_t target;         /* GOTO: the priority to continue at (> priority) */
	bool has_fwmark;         /* FRA_FWMARK / FRA_FWMASK */
	uint32_t fwmark, fwmask;
	bool has_uid;            /* FRA_UID_RANGE, inclusive */
	uint32_t uid_start, uid_end;
	char iifname[NETLINK_IFNAMSIZ]; /* FRA_IIFNAME; "" = any */
	struct netaddr dst;      /* FRA_DST with dst_len; dst_len 0 = any destination */
	uint8_t dst_len;
	uint8_t ip_proto;        /* FRA_IP_PROTO; 0 = any */
	uint16_t dport_start, dport_end; /* FRA_DPORT_RANGE; 0 = any */
	int suppress_prefixlen;  /* FRA_SUPPRESS_PREFIXLEN; -1 = none */
};

/* Zero r, then family, action LOOKUP and no suppress_prefixlen. */
void netlink_rule_init(struct netlink_rule *r, uint8_t family);
/* RTM_NEWRULE with NLM_F_EXCL: -EEXIST if an identical rule is there. 0 or -errno. */
int netlink_rule_add(struct netlink *nl, const struct netlink_rule *r) NETLINK_WUR;
/* RTM_DELRULE of the first rule matching every selector given (priority included when not 0).
 * -ENOENT if none does. */
int netlink_rule_del(struct netlink *nl, const struct netlink_rule *r) NETLINK_WUR;
typedef void (*netlink_rule_fn)(void *arg, const struct netlink_rule *r);
/* RTM_GETRULE dump of one family (4 or 6), read to the end; fn is called per rule. -EAGAIN if
 * the dump was interrupted by a change (ask again). */
int netlink_rule_dump(struct netlink *nl, uint8_t family, netlink_rule_fn fn, void *arg)
	NETLINK_WUR;

/* A route in a routing table (ip route ... table N), as added, deleted or dumped. */
#define NETLINK_RT_UNICAST 1     /* RTN_UNICAST */
#define NETLINK_RT_UNREACHABLE 7 /* RTN_UNREACHABLE */
#define NETLINK_RT_GW_MAX 4      /* gateways kept from a dumped multipath route */

struct netlink_rt {
	uint8_t family;          /* 4 or 6 */
	uint8_t type;            /* NETLINK_RT_*, or another RTN_* value in a dump */
	uint8_t protocol;        /* rtm_protocol: who installed it (0: RTPROT_UNSPEC) */
	uint32_t table;          /* RTA_TABLE */
	struct netaddr dst;      /* RTA_DST with dst_len; dst_len 0 = the default route */
	uint8_t dst_len;
	int oif;                 /* RTA_OIF; 0 = none */
	uint32_t metric;         /* RTA_PRIORITY; 0 = the kernel's default (add) or any (delete) */
	/* Dumps only: the gateways (RTA_GATEWAY, or each hop's of RTA_MULTIPATH). */
	uint8_t n_gw;
	struct netaddr gw[NETLINK_RT_GW_MAX];
};

/* RTM_NEWROUTE with NLM_F_CREATE | NLM_F_EXCL: a unicast route gets scope link (no gateway:
 * dev routes), an unreachable one scope universe. -EEXIST if the table has that route. */
int netlink_rt_add(struct netlink *nl, const struct netlink_rt *rt) NETLINK_WUR;
/* RTM_DELROUTE: table, dst/dst_len, type, protocol, oif and metric (those not 0) must match.
 * -ESRCH if no route does. */
int netlink_rt_del(struct netlink *nl, const struct netlink_rt *rt) NETLINK_WUR;
typedef void (*netlink_rt_fn)(void *arg, const struct netlink_rt *rt);
/* RTM_GETROUTE dump of one family (4 or 6): every table, read to the end. -EAGAIN as above. */
int netlink_rt_dump(struct netlink *nl, uint8_t family, netlink_rt_fn fn, void *arg) NETLINK_WUR;

#endif
