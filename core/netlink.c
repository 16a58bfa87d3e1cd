/* netlink.c — request/ack over NETLINK_ROUTE for links and addresses (see netlink.h). */
#include "core/netlink.h"

#include <errno.h>
#include <net/if.h>
#include <stdalign.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

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
	bool dump = req->nlmsg_type == RTM_GETADDR && (req->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
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
	for (rta = RTM_RTA(rtm); RTA_OK(rta, len); rta = RTA_NEXT(rta, len))
		if (rta->rta_type == RTA_OIF && RTA_PAYLOAD(rta) == sizeof(uint32_t))
			memcpy(&c->out->oif, RTA_DATA(rta), sizeof(uint32_t));
}

int netlink_route_get(struct netlink *nl, const struct netaddr *dst, struct netlink_route *out)
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
	if ((ret = add_attr(h, RTA_DST, dst->a, alen)) != 0 ||
	    (ret = transact(nl, h, on_route, &c)) != 0)
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
