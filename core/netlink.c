/* netlink.c — request/ack over NETLINK_ROUTE for links, addresses, rules and routes (see
 * netlink.h). */
#include "core/netlink.h"

#include <errno.h>
#include <net/if.h>
#include <stdalign.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <linux/fib_rules.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

#define REQ_MAX 256            /* our requests: a header, one struct and a few attributes */
#define RECV_MAX 32768         /* a dump batch never exceeds this (kernel uses <= 32 KiB) */

struct req {
	alignas(struct nlmsghdr) unsigned char buf[REQ_MAX];
};

typedef void (*msg_fn)(void *arg, const struct nlmsghdr *h);

int netlink_open(struct netlink *nl)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	socklen_t salen = sizeof(sa);
	struct timeval tv = { NETLINK_TIMEOUT_MS / 1000, (NETLINK_TIMEOUT_MS % 1000) * 1000 };
	int one = 1, ret;

	nl->fd = -1;
	nl->seq = 0;
	nl->port = 0;
	nl->ext_msg[0] = '\0';
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &salen) != 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	/* Best effort: the kernel's own words for a refusal ("MTU too small", ...) and acks that
	 * do not echo our request back. Old kernels without them still work. */
	(void)setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
	(void)setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
	nl->fd = fd;
	nl->port = sa.nl_pid;
	return 0;
}

void netlink_close(struct netlink *nl)
{
	if (nl->fd >= 0)
		close(nl->fd);
	nl->fd = -1;
}

static struct nlmsghdr *req_init(struct req *r, uint16_t type, uint16_t flags, size_t body)
{
	struct nlmsghdr *h = (struct nlmsghdr *)r->buf;

	memset(r->buf, 0, sizeof(r->buf));
	h->nlmsg_len = (uint32_t)NLMSG_LENGTH(body);
	h->nlmsg_type = type;
	h->nlmsg_flags = (uint16_t)(NLM_F_REQUEST | flags);
	return h;
}

static int add_attr(struct nlmsghdr *h, uint16_t type, const void *data, size_t len)
{
	size_t off = NLMSG_ALIGN(h->nlmsg_len), need = RTA_LENGTH(len);
	struct rtattr *rta;

	if (off + RTA_ALIGN(need) > REQ_MAX)
		return -ENOBUFS;
	rta = (struct rtattr *)((unsigned char *)h + off);
	rta->rta_type = type;
	rta->rta_len = (unsigned short)need;
	memcpy(RTA_DATA(rta), data, len);
	h->nlmsg_len = (uint32_t)(off + RTA_ALIGN(need));
	return 0;
}

/* Copy the kernel's extended-ack message (NLMSGERR_ATTR_MSG), if the error carries one. */
static void save_ext_msg(struct netlink *nl, const struct nlmsghdr *h)
{
	const struct nlmsgerr *e = NLMSG_DATA(h);
	size_t off = NLMSG_HDRLEN + sizeof(*e);

	if (!(h->nlmsg_flags & NLM_F_ACK_TLVS))
		return;
	if (!(h->nlmsg_flags & NLM_F_CAPPED)) {
		if (e->msg.nlmsg_len < NLMSG_HDRLEN)
			return;
		off += e->msg.nlmsg_len - NLMSG_HDRLEN; /* the echoed request sits in between */
	}
	while (off + NLA_HDRLEN <= h->nlmsg_len) {
		const struct nlattr *a = (const struct nlattr *)((const char *)h + off);
		if (a->nla_len < NLA_HDRLEN || off + a->nla_len > h->nlmsg_len)
			return;
		if ((a->nla_type & NLA_TYPE_MASK) == NLMSGERR_ATTR_MSG) {
			size_t n = a->nla_len - NLA_HDRLEN;
			if (n >= sizeof(nl->ext_msg))
				n = sizeof(nl->ext_msg) - 1;
			memcpy(nl->ext_msg, (const char *)a + NLA_HDRLEN, n);
			nl->ext_msg[n] = '\0';
			return;
		}
		off += NLA_ALIGN(a->nla_len);
	}
}

/* One datagram from the kernel. -ETIMEDOUT when the receive timeout expires. */
static int recv_batch(struct netlink *nl, void *buf, size_t cap, size_t *got)
{
	for (;;) {
		struct sockaddr_nl from;
		struct iovec iov = { buf, cap };
		struct msghdr msg = { .msg_name = &from, .msg_namelen = sizeof(from),
				      .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n = recvmsg(nl->fd, &msg, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return (errno == EAGAIN || errno == EWOULDBLOCK) ? -ETIMEDOUT : -errno;
		}
		if (msg.msg_flags & MSG_TRUNC)
			return -EMSGSIZE;
		if (from.nl_pid != 0)
			continue; /* only the kernel talks to us */
		*got = (size_t)n;
		return 0;
	}
}

/* Walk one datagram. Returns 1 when the exchange is over (ack, error or end of dump) with the
 * result in *result, 0 when more datagrams follow. */
static int walk_batch(struct netlink *nl, const void *buf, size_t len, msg_fn fn, void *arg,
		      int *result, bool *intr)
{
	const struct nlmsghdr *h = buf;
	unsigned int left = (unsigned int)len; /* NLMSG_OK compares it with the u32 nlmsg_len */

	for (; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
		if (h->nlmsg_seq != nl->seq || h->nlmsg_pid != nl->port)
			continue; /* a late reply to an earlier request */
		if (h->nlmsg_flags & NLM_F_DUMP_INTR)
			*intr = true;
		if (h->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(h);
			if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*e))) {
				*result = -EBADMSG;
				return 1;
			}
			if (e->error != 0)
				save_ext_msg(nl, h);
			*result = e->error;
			return 1;
		}
		if (h->nlmsg_type == NLMSG_DONE) {
			int err = 0;
			if (h->nlmsg_len >= NLMSG_LENGTH(sizeof(int)))
				memcpy(&err, NLMSG_DATA(h), sizeof(int));
			*result = err < 0 ? err : 0;
			return 1;
		}
		if (fn)
			fn(arg, h);
	}
	return 0;
}

/* Send req and read until its ack (requests) or NLMSG_DONE (dumps), passing every other reply
 * message to fn. Dumps are told apart by type, not by testing NLM_F_DUMP: its bits double as
 * NLM_F_REPLACE / NLM_F_EXCL on new-object requests. */
static int transact(struct netlink *nl, struct nlmsghdr *req, msg_fn fn, void *arg)
{
	bool dump = (req->nlmsg_type == RTM_GETADDR || req->nlmsg_type == RTM_GETROUTE ||
		     req->nlmsg_type == RTM_GETRULE) &&
		    (req->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
	static const struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	alignas(struct nlmsghdr) unsigned char buf[RECV_MAX];
	bool intr = false;
	int result = 0, ret;
	ssize_t n;

	if (nl->fd < 0)
		return -EBADF;
	nl->ext_msg[0] = '\0';
	if (!dump)
		req->nlmsg_flags |= NLM_F_ACK;
	req->nlmsg_seq = ++nl->seq;
	do {
		n = sendto(nl->fd, req, req->nlmsg_len, 0, (const struct sockaddr *)&kernel,
			   sizeof(kernel));
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (;;) {
		size_t got = 0;
		if ((ret = recv_batch(nl, buf, sizeof(buf), &got)) != 0)
			return ret;
		if (walk_batch(nl, buf, got, fn, arg, &result, &intr))
			break;
	}
	if (result == 0 && intr)
		return -EAGAIN;
	return result;
}

int netlink_link_set(struct netlink *nl, int ifindex, const struct netlink_link_req *lr)
{
	struct req r;
	struct nlmsghdr *h = req_init(&r, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
	struct ifinfomsg *ifi = NLMSG_DATA(h);
	int ret;

	ifi->ifi_family = AF_UNSPEC;
	ifi->ifi_index = ifindex;
	if (lr->up >= 0) {
		ifi->ifi_change = IFF_UP;
		ifi->ifi_flags = lr->up ? IFF_UP : 0;
	}
	if (lr->mtu && (ret = add_attr(h, IFLA_MTU, &lr->mtu, sizeof(lr->mtu))) != 0)
		return ret;
	if (lr->txqlen && (ret = add_attr(h, IFLA_TXQLEN, &lr->txqlen, sizeof(lr->txqlen))) != 0)
		return ret;
	return transact(nl, h, NULL, NULL);
}

struct link_get_ctx {
	int ifindex;
	bool found;
	struct netlink_link *out;
};

static void on_link(void *arg, const struct nlmsghdr *h)
{
	struct link_get_ctx *c = arg;
	const struct ifinfomsg *ifi = NLMSG_DATA(h);
	const struct rtattr *rta;
	int len;

	if (h->nlmsg_type != RTM_NEWLINK || h->nlmsg_len < NLMSG_LENGTH(sizeof(*ifi)) ||
	    ifi->ifi_index != c->ifindex)
		return;
	c->found = true;
	c->out->flags = ifi->ifi_flags;
	len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*ifi)));
	for (rta = IFLA_RTA(ifi); RTA_OK(rta, len); rta = RTA_NEXT(rta, len)) {
		if (RTA_PAYLOAD(rta) != sizeof(uint32_t))
			continue;
		if (rta->rta_type == IFLA_MTU)
			memcpy(&c->out->mtu, RTA_DATA(rta), 4);
		else if (rta->rta_type == IFLA_TXQLEN)
			memcpy(&c->out->txqlen, RTA_DATA(rta), 4);
	}
}

int netlink_link_get(struct netlink *nl, int ifindex, struct netlink_link *out)
{
	struct req r;
	struct nlmsghdr *h = req_init(&r, RTM_GETLINK, 0, sizeof(struct ifinfomsg));
	struct ifinfomsg *ifi = NLMSG_DATA(h);
	struct link_get_ctx c = { ifindex, false, out };
	int ret;

	memset(out, 0, sizeof(*out));
	ifi->ifi_family = AF_UNSPEC;
	ifi->ifi_index = ifindex;
	if ((ret = transact(nl, h, on_link, &c)) != 0)
		return ret;
	return c.found ? 0 : -ENODEV;
}

static int addr_req(struct netlink *nl, uint16_t type, uint16_t flags, int ifindex,
		    const struct netaddr_cidr *c, uint32_t ifa_flags)
{
	struct req r;
	struct nlmsghdr *h = req_init(&r, type, flags, sizeof(struct ifaddrmsg));
	struct ifaddrmsg *ifa = NLMSG_DATA(h);
	size_t alen = c->addr.family == 4 ? 4 : 16;
	int ret;

	if ((c->addr.family != 4 && c->addr.family != 6) || c->prefix > alen * 8 || ifindex <= 0)
		return -EINVAL;
	ifa->ifa_family = c->addr.family == 4 ? AF_INET : AF_INET6;
	ifa->ifa_prefixlen = c->prefix;
	ifa->ifa_flags = (uint8_t)ifa_flags; /* the low 8 bits; IFA_FLAGS carries all 32 */
	ifa->ifa_scope = RT_SCOPE_UNIVERSE;
	ifa->ifa_index = (uint32_t)ifindex;
	if ((ret = add_attr(h, IFA_LOCAL, c->addr.a, alen)) != 0 ||
	    (ret = add_attr(h, IFA_ADDRESS, c->addr.a, alen)) != 0)
		return ret;
	if (ifa_flags && (ret = add_attr(h, IFA_FLAGS, &ifa_flags, sizeof(ifa_flags))) != 0)
		return ret;
	return transact(nl, h, NULL, NULL);
}

int netlink_addr_add(struct netlink *nl, int ifindex, const struct netaddr_cidr *c,
		     uint32_t ifa_flags)
{
	/* REPLACE, not EXCL: attaching to a persistent TUN that already has the address is fine. */
	return addr_req(nl, RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, ifindex, c, ifa_flags);
}

int netlink_addr_del(struct netlink *nl, int ifindex, const struct netaddr_cidr *c)
{
	return addr_req(nl, RTM_DELADDR, 0, ifindex, c, 0);
}

struct route_get_ctx {
	bool found;
	struct netlink_route *out;
};

static void on_route(void *arg, const struct nlmsghdr *h)
{
	struct route_get_ctx *c = arg;
	const struct rtmsg *rtm = NLMSG_DATA(h);
	const struct rtattr *rta;
	int len;

	if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof(*rtm)))
		return;
	c->found = true;
	c->out->type = rtm->rtm_type;
	len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*rtm)));
	for (rta = RTM_RTA(rtm); RTA_OK(rta, len); rta = RTA_NEXT(rta, len)) {
		if (rta->rta_type == RTA_OIF && RTA_PAYLOAD(rta) == sizeof(uint32_t)) {
			memcpy(&c->out->oif, RTA_DATA(rta), sizeof(uint32_t));
		} else if ((rta->rta_type == RTA_PREFSRC || rta->rta_type == RTA_GATEWAY) &&
			   (rtm->rtm_family == AF_INET || rtm->rtm_family == AF_INET6) &&
			   RTA_PAYLOAD(rta) == (rtm->rtm_family == AF_INET ? 4u : 16u)) {
			struct netaddr *a = rta->rta_type == RTA_PREFSRC ? &c->out->src
									   : &c->out->gw;

			a->family = rtm->rtm_family == AF_INET ? 4 : 6;
			memcpy(a->a, RTA_DATA(rta), RTA_PAYLOAD(rta));
		} else if (rta->rta_type == RTA_VIA) {
			c->out->via = true;
		}
	}
}

int netlink_route_get(struct netlink *nl, const struct netaddr *dst, struct netlink_route *out)
{
	return netlink_route_get_ex(nl, dst, 0, 0, out);
}

int netlink_route_get_ex(struct netlink *nl, const struct netaddr *dst, uint32_t mark, int oif,
			 struct netlink_route *out)
{
	struct req r;
	struct nlmsghdr *h = req_init(&r, RTM_GETROUTE, 0, sizeof(struct rtmsg));
	struct rtmsg *rtm = NLMSG_DATA(h);
	struct route_get_ctx c = { false, out };
	size_t alen = dst->family == 4 ? 4 : 16;
	int ret;

	memset(out, 0, sizeof(*out));
	if (dst->family != 4 && dst->family != 6)
		return -EINVAL;
	rtm->rtm_family = dst->family == 4 ? AF_INET : AF_INET6;
	rtm->rtm_dst_len = (unsigned char)(alen * 8);
	if ((ret = add_attr(h, RTA_DST, dst->a, alen)) != 0)
		return ret;
	if (mark && (ret = add_attr(h, RTA_MARK, &mark, sizeof(mark))) != 0)
		return ret;
	if (oif > 0 && (ret = add_attr(h, RTA_OIF, &oif, sizeof(oif))) != 0)
		return ret;
	if ((ret = transact(nl, h, on_route, &c)) != 0)
		return ret;
	return c.found ? 0 : -ENOENT;
}

struct addr_dump_ctx {
	int ifindex;
	netlink_addr_fn fn;
	void *arg;
};

/* Parse one RTM_NEWADDR message into a; false if it is not a usable v4/v6 address. */
static bool parse_addr(const struct nlmsghdr *h, struct netlink_addr *a)
{
	const struct ifaddrmsg *ifa = NLMSG_DATA(h);
	const struct rtattr *rta, *local = NULL, *address = NULL;
	size_t alen;
	int len;

	if (h->nlmsg_type != RTM_NEWADDR || h->nlmsg_len < NLMSG_LENGTH(sizeof(*ifa)))
		return false;
	if (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6)
		return false;
	alen = ifa->ifa_family == AF_INET ? 4 : 16;
	memset(a, 0, sizeof(*a));
	a->ifindex = (int)ifa->ifa_index;
	a->prefix = ifa->ifa_prefixlen;
	a->flags = ifa->ifa_flags;
	a->addr.family = ifa->ifa_family == AF_INET ? 4 : 6;
	len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*ifa)));
	for (rta = IFA_RTA(ifa); RTA_OK(rta, len); rta = RTA_NEXT(rta, len)) {
		if (rta->rta_type == IFA_LOCAL && RTA_PAYLOAD(rta) == alen)
			local = rta;
		else if (rta->rta_type == IFA_ADDRESS && RTA_PAYLOAD(rta) == alen)
			address = rta;
		else if (rta->rta_type == IFA_FLAGS && RTA_PAYLOAD(rta) == sizeof(uint32_t))
			memcpy(&a->flags, RTA_DATA(rta), sizeof(uint32_t));
	}
	/* IPv4 puts the local address in IFA_LOCAL (IFA_ADDRESS is the peer on point-to-point
	 * links); IPv6 sends IFA_LOCAL only when a peer is configured. */
	if (!local)
		local = address;
	if (!local)
		return false;
	memcpy(a->addr.a, RTA_DATA(local), alen);
	return true;
}

static void on_addr(void *arg, const struct nlmsghdr *h)
{
	struct addr_dump_ctx *c = arg;
	struct netlink_addr a;

	if (!parse_addr(h, &a))
		return;
	if (c->ifindex == 0 || a.ifindex == c->ifindex)
		c->fn(c->arg, &a);
}

int netlink_addr_dump(struct netlink *nl, int ifindex, netlink_addr_fn fn, void *arg)
{
	struct req r;
	struct nlmsghdr *h = req_init(&r, RTM_GETADDR, NLM_F_DUMP, sizeof(struct ifaddrmsg));
	struct ifaddrmsg *ifa = NLMSG_DATA(h);
	struct addr_dump_ctx c = { ifindex, fn, arg };

	ifa->ifa_family = AF_UNSPEC;
	return transact(nl, h, on_addr, &c);
}

/* ---- policy rules ---- */

_Static_assert(NETLINK_RULE_LOOKUP == FR_ACT_TO_TBL && NETLINK_RULE_GOTO == FR_ACT_GOTO &&
		       NETLINK_RULE_NOP == FR_ACT_NOP,
	       "rule actions are the kernel's");
_Static_assert(NETLINK_IFNAMSIZ == IFNAMSIZ, "interface name size");
_Static_assert(NETLINK_RT_UNICAST == RTN_UNICAST && NETLINK_RT_UNREACHABLE == RTN_UNREACHABLE,
	       "route types are the kernel's");

static size_t family_alen(uint8_t family)
{
	return family == 4 ? 4 : 16;
}

void netlink_rule_init(struct netlink_rule *r, uint8_t family)
{
	memset(r, 0, sizeof(*r));
	r->family = family;
	r->action = NETLINK_RULE_LOOKUP;
	r->suppress_prefixlen = -1;
}

static int add_u32(struct nlmsghdr *h, uint16_t type, uint32_t v)
{
	return add_attr(h, type, &v, sizeof(v));
}

/* The selectors of r as attributes (shared by add and delete). */
static int rule_selectors(struct nlmsghdr *h, const struct netlink_rule *r)
{
	int ret = 0;

	if (r->dst_len && (ret = add_attr(h, FRA_DST, r->dst.a, family_alen(r->family))) != 0)
		return ret;
	if (r->has_fwmark && ((ret = add_u32(h, FRA_FWMARK, r->fwmark)) != 0 ||
			      (ret = add_u32(h, FRA_FWMASK, r->fwmask)) != 0))
		return ret;
	if (r->has_uid) {
		struct fib_rule_uid_range u = { r->uid_start, r->uid_end };
		if ((ret = add_attr(h, FRA_UID_RANGE, &u, sizeof(u))) != 0)
			return ret;
	}
	if (r->iifname[0] && (ret = add_attr(h, FRA_IIFNAME, r->iifname,
					      strnlen(r->iifname, IFNAMSIZ - 1) + 1)) != 0)
		return ret;
	if (r->ip_proto && (ret = add_attr(h, FRA_IP_PROTO, &r->ip_proto, 1)) != 0)
		return ret;
	if (r->dport_start || r->dport_end) {
		struct fib_rule_port_range pr = { r->dport_start, r->dport_end };
		if ((ret = add_attr(h, FRA_DPORT_RANGE, &pr, sizeof(pr))) != 0)
			return ret;
	}
	if (r->suppress_prefixlen >= 0)
		ret = add_u32(h, FRA_SUPPRESS_PREFIXLEN, (uint32_t)r->suppress_prefixlen);
	return ret;
}

static int rule_req(struct netlink *nl, uint16_t type, uint16_t flags, const struct netlink_rule *r)
{
	struct req rq;
	struct nlmsghdr *h = req_init(&rq, type, flags, sizeof(struct fib_rule_hdr));
	struct fib_rule_hdr *frh = NLMSG_DATA(h);
	int ret;

	if ((r->family != 4 && r->family != 6) || r->dst_len > family_alen(r->family) * 8)
		return -EINVAL;
	frh->family = r->family == 4 ? AF_INET : AF_INET6;
	frh->dst_len = r->dst_len;
	frh->action = r->action;
	frh->flags = r->invert ? FIB_RULE_INVERT : 0;
	if (r->action == NETLINK_RULE_LOOKUP)
		frh->table = r->table < 256 ? (uint8_t)r->table : RT_TABLE_UNSPEC;
	if ((ret = rule_selectors(h, r)) != 0)
		return ret;
	if (r->priority && (ret = add_u32(h, FRA_PRIORITY, r->priority)) != 0)
		return ret;
	if (r->action == NETLINK_RULE_LOOKUP && r->table &&
	    (ret = add_u32(h, FRA_TABLE, r->table)) != 0)
		return ret;
	if (r->action == NETLINK_RULE_GOTO && (ret = add_u32(h, FRA_GOTO, r->target)) != 0)
		return ret;
	if (r->protocol && (ret = add_attr(h, FRA_PROTOCOL, &r->protocol, 1)) != 0)
		return ret;
	return transact(nl, h, NULL, NULL);
}

int netlink_rule_add(struct netlink *nl, const struct netlink_rule *r)
{
	return rule_req(nl, RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, r);
}

int netlink_rule_del(struct netlink *nl, const struct netlink_rule *r)
{
	return rule_req(nl, RTM_DELRULE, 0, r);
}

static void rule_attr(struct netlink_rule *r, const struct rtattr *rta)
{
	const void *d = RTA_DATA(rta);
	size_t n = RTA_PAYLOAD(rta);

	switch (rta->rta_type) {
	case FRA_DST:
		if (n == family_alen(r->family))
			memcpy(r->dst.a, d, n);
		break;
	case FRA_PRIORITY: if (n == 4) memcpy(&r->priority, d, 4); break;
	case FRA_TABLE: if (n == 4) memcpy(&r->table, d, 4); break;
	case FRA_GOTO: if (n == 4) memcpy(&r->target, d, 4); break;
	case FRA_FWMARK: if (n == 4) { memcpy(&r->fwmark, d, 4); r->has_fwmark = true; } break;
	case FRA_FWMASK: if (n == 4) { memcpy(&r->fwmask, d, 4); r->has_fwmark = true; } break;
	case FRA_SUPPRESS_PREFIXLEN: if (n == 4) memcpy(&r->suppress_prefixlen, d, 4); break;
	case FRA_IP_PROTO: if (n == 1) r->ip_proto = *(const uint8_t *)d; break;
	case FRA_PROTOCOL: if (n == 1) r->protocol = *(const uint8_t *)d; break;
	case FRA_IIFNAME:
		if (n > 0) {
			size_t k = n < IFNAMSIZ ? n : IFNAMSIZ - 1;
			memcpy(r->iifname, d, k);
			r->iifname[k] = '\0';
		}
		break;
	case FRA_UID_RANGE:
		if (n == sizeof(struct fib_rule_uid_range)) {
			const struct fib_rule_uid_range *u = d;
			r->has_uid = true;
			r->uid_start = u->start;
			r->uid_end = u->end;
		}
		break;
	case FRA_DPORT_RANGE:
		if (n == sizeof(struct fib_rule_port_range)) {
			const struct fib_rule_port_range *p = d;
			r->dport_start = p->start;
			r->dport_end = p->end;
		}
		break;
	default:
		break;
	}
}

struct rule_dump_ctx {
	netlink_rule_fn fn;
	void *arg;
};

static void on_rule(void *arg, const struct nlmsghdr *h)
{
	struct rule_dump_ctx *c = arg;
	const struct fib_rule_hdr *frh = NLMSG_DATA(h);
	const struct rtattr *rta;
	struct netlink_rule r;
	int len;

	if (h->nlmsg_type != RTM_NEWRULE || h->nlmsg_len < NLMSG_LENGTH(sizeof(*frh)))
		return;
	if (frh->family != AF_INET && frh->family != AF_INET6)
		return;
	netlink_rule_init(&r, frh->family == AF_INET ? 4 : 6);
	r.action = frh->action;
	r.invert = (frh->flags & FIB_RULE_INVERT) != 0;
	r.table = frh->table;
	r.dst_len = frh->dst_len;
	if (r.dst_len)
		r.dst.family = r.family;
	len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*frh)));
	for (rta = (const struct rtattr *)((const char *)frh + NLMSG_ALIGN(sizeof(*frh)));
	     RTA_OK(rta, len); rta = RTA_NEXT(rta, len))
		rule_attr(&r, rta);
	c->fn(c->arg, &r);
}

int netlink_rule_dump(struct netlink *nl, uint8_t family, netlink_rule_fn fn, void *arg)
{
	struct req rq;
	struct nlmsghdr *h = req_init(&rq, RTM_GETRULE, NLM_F_DUMP, sizeof(struct fib_rule_hdr));
	struct fib_rule_hdr *frh = NLMSG_DATA(h);
	struct rule_dump_ctx c = { fn, arg };

	if (family != 4 && family != 6)
		return -EINVAL;
	frh->family = family == 4 ? AF_INET : AF_INET6;
	return transact(nl, h, on_rule, &c);
}

/* ---- routes in tables ---- */

static int rt_req(struct netlink *nl, uint16_t type, uint16_t flags, const struct netlink_rt *rt)
{
	struct req rq;
	struct nlmsghdr *h = req_init(&rq, type, flags, sizeof(struct rtmsg));
	struct rtmsg *rtm = NLMSG_DATA(h);
	bool add = type == RTM_NEWROUTE;
	int ret;

	if ((rt->family != 4 && rt->family != 6) || rt->dst_len > family_alen(rt->family) * 8 ||
	    rt->table == 0)
		return -EINVAL;
	rtm->rtm_family = rt->family == 4 ? AF_INET : AF_INET6;
	rtm->rtm_dst_len = rt->dst_len;
	rtm->rtm_table = rt->table < 256 ? (uint8_t)rt->table : RT_TABLE_UNSPEC;
	rtm->rtm_protocol = rt->protocol;
	rtm->rtm_type = rt->type;
	/* Delete: RT_SCOPE_NOWHERE matches any scope (what ip route del sends). */
	if (!add)
		rtm->rtm_scope = RT_SCOPE_NOWHERE;
	else if (rt->type == NETLINK_RT_UNICAST && rt->n_gw == 0)
		rtm->rtm_scope = RT_SCOPE_LINK;
	else
		rtm->rtm_scope = RT_SCOPE_UNIVERSE;
	if ((ret = add_u32(h, RTA_TABLE, rt->table)) != 0)
		return ret;
	if (rt->dst_len && (ret = add_attr(h, RTA_DST, rt->dst.a, family_alen(rt->family))) != 0)
		return ret;
	if (rt->oif > 0 && (ret = add_u32(h, RTA_OIF, (uint32_t)rt->oif)) != 0)
		return ret;
	if (rt->metric && (ret = add_u32(h, RTA_PRIORITY, rt->metric)) != 0)
		return ret;
	return transact(nl, h, NULL, NULL);
}

int netlink_rt_add(struct netlink *nl, const struct netlink_rt *rt)
{
	return rt_req(nl, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, rt);
}

int netlink_rt_del(struct netlink *nl, const struct netlink_rt *rt)
{
	return rt_req(nl, RTM_DELROUTE, 0, rt);
}

static void rt_add_gw(struct netlink_rt *rt, const void *d, size_t n)
{
	if (n != family_alen(rt->family) || rt->n_gw >= NETLINK_RT_GW_MAX)
		return;
	memset(&rt->gw[rt->n_gw], 0, sizeof(rt->gw[0]));
	rt->gw[rt->n_gw].family = rt->family;
	memcpy(rt->gw[rt->n_gw].a, d, n);
	rt->n_gw++;
}

/* RTA_MULTIPATH: a list of struct rtnexthop, each followed by its own attributes. */
static void rt_multipath(struct netlink_rt *rt, const struct rtattr *mp)
{
	const unsigned char *p = RTA_DATA(mp);
	size_t left = RTA_PAYLOAD(mp);

	while (left >= sizeof(struct rtnexthop)) {
		const struct rtnexthop *nh = (const struct rtnexthop *)p;
		const struct rtattr *rta;
		int alen;

		if (nh->rtnh_len < sizeof(*nh) || nh->rtnh_len > left)
			return;
		alen = (int)(nh->rtnh_len - RTNH_ALIGN(sizeof(*nh)));
		for (rta = RTNH_DATA(nh); RTA_OK(rta, alen); rta = RTA_NEXT(rta, alen))
			if (rta->rta_type == RTA_GATEWAY)
				rt_add_gw(rt, RTA_DATA(rta), RTA_PAYLOAD(rta));
		if (!rt->oif)
			rt->oif = nh->rtnh_ifindex;
		size_t step = (size_t)RTNH_ALIGN(nh->rtnh_len);
		if (step >= left)
			return;
		left -= step;
		p += step;
	}
}

static void rt_attr(struct netlink_rt *rt, const struct rtattr *rta)
{
	const void *d = RTA_DATA(rta);
	size_t n = RTA_PAYLOAD(rta);

	switch (rta->rta_type) {
	case RTA_TABLE: if (n == 4) memcpy(&rt->table, d, 4); break;
	case RTA_OIF: if (n == 4) memcpy(&rt->oif, d, 4); break;
	case RTA_PRIORITY: if (n == 4) memcpy(&rt->metric, d, 4); break;
	case RTA_GATEWAY: rt_add_gw(rt, d, n); break;
	case RTA_MULTIPATH: rt_multipath(rt, rta); break;
	case RTA_DST:
		if (n == family_alen(rt->family))
			memcpy(rt->dst.a, d, n);
		break;
	default:
		break;
	}
}

struct rt_dump_ctx {
	netlink_rt_fn fn;
	void *arg;
};

static void on_rt(void *arg, const struct nlmsghdr *h)
{
	struct rt_dump_ctx *c = arg;
	const struct rtmsg *rtm = NLMSG_DATA(h);
	const struct rtattr *rta;
	struct netlink_rt rt;
	int len;

	if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof(*rtm)))
		return;
	if (rtm->rtm_family != AF_INET && rtm->rtm_family != AF_INET6)
		return;
	memset(&rt, 0, sizeof(rt));
	rt.family = rtm->rtm_family == AF_INET ? 4 : 6;
	rt.type = rtm->rtm_type;
	rt.protocol = rtm->rtm_protocol;
	rt.table = rtm->rtm_table;
	rt.dst_len = rtm->rtm_dst_len;
	rt.dst.family = rt.family;
	len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*rtm)));
	for (rta = RTM_RTA(rtm); RTA_OK(rta, len); rta = RTA_NEXT(rta, len))
		rt_attr(&rt, rta);
	c->fn(c->arg, &rt);
}

int netlink_rt_dump(struct netlink *nl, uint8_t family, netlink_rt_fn fn, void *arg)
{
	struct req rq;
	struct nlmsghdr *h = req_init(&rq, RTM_GETROUTE, NLM_F_DUMP, sizeof(struct rtmsg));
	struct rtmsg *rtm = NLMSG_DATA(h);
	struct rt_dump_ctx c = { fn, arg };

	if (family != 4 && family != 6)
		return -EINVAL;
	rtm->rtm_family = family == 4 ? AF_INET : AF_INET6;
	return transact(nl, h, on_rt, &c);
}
