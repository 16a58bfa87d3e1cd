/* udpfast.c — a UDP flow into the in-kernel fast path (udpfast.h): where its datagrams leave
 * (the outbound socket's port, the route's source address and device, the socket's mark), and
 * out again. */
#include "stacks/system/udpfast.h"

#include <errno.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/log.h"
#include "core/netaddr.h"
#include "stacks/system/fastpath.h"

int udpfast_init(struct udpfast *uf, struct fastpath **fp, int tun, struct log *log)
{
	int ret;

	memset(uf, 0, sizeof(*uf));
	uf->fp = fp;
	uf->tun = tun;
	uf->log = log;
	uf->nl.fd = -1;
	if ((ret = netlink_open(&uf->nl)) != 0)
		return ret;
	uf->nl_open = true;
	return 0;
}

void udpfast_fini(struct udpfast *uf)
{
	if (uf->nl_open)
		netlink_close(&uf->nl);
	uf->nl_open = false;
}

/* The port and, if it is bound to one, the address the socket sends from (family 0: none). */
static int sock_local(int fd, int family, uint16_t *port_be, struct netaddr *a)
{
	static const uint8_t any[16];
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
		return -errno;
	if (netaddr_from_sockaddr(&ss, a->a, port_be) != family || *port_be == 0)
		return -EADDRNOTAVAIL; /* never sent yet: no port */
	/* Bound to the wildcard address: the route's source decides (family 0). */
	a->family = memcmp(a->a, any, family == 4 ? 4 : 16) == 0 ? 0 : (uint8_t)family;
	return 0;
}

/* Where the socket's datagrams to f's remote go: the device and our address on it, as the
 * kernel would route them for that socket (its mark, its bound device). */
static int route_of(struct udpfast *uf, const struct udp_fast_flow *f, uint32_t mark,
		    struct netlink_route *rt, bool *bound)
{
	struct netaddr dst = { .family = f->app.family };
	int oif = 0, ret;
	socklen_t len = sizeof(oif);

	if (getsockopt(f->fd, SOL_SOCKET, SO_BINDTOIFINDEX, &oif, &len) != 0)
		oif = 0;
	memcpy(dst.a, f->app.dst, f->app.family == 4 ? 4 : 16);
	*bound = oif > 0;
	if ((ret = netlink_route_get_ex(&uf->nl, &dst, mark, oif, rt)) != 0)
		return ret;
	if (rt->type != RTN_UNICAST || rt->oif <= 0 || rt->oif == uf->tun || rt->via ||
	    (rt->gw.family && rt->gw.family != f->app.family))
		return -ENETUNREACH;
	return 0;
}

static int uf_add(void *arg, const struct udp_fast_flow *f, void **cookie)
{
	struct udpfast *uf = arg;
	struct fastpath *fp = *uf->fp;
	struct fastpath_udp *e;
	struct netlink_route rt;
	struct netaddr local;
	uint32_t mark = 0;
	uint16_t lport_be;
	bool bound;
	socklen_t len = sizeof(mark);
	char why[160];
	int ret;

	if (!fp)
		return -EOPNOTSUPP;
	/* An application's socket hook may have made the socket anything: only the kernel's
	 * own sending keeps what it did. */
	if (f->ob->sock_hook.fn) {
		ret = -EOPNOTSUPP;
		goto no_uplink;
	}
	if (getsockopt(f->fd, SOL_SOCKET, SO_MARK, &mark, &len) != 0)
		mark = 0;
	if ((ret = sock_local(f->fd, f->app.family, &lport_be, &local)) != 0 ||
	    (ret = route_of(uf, f, mark, &rt, &bound)) != 0)
		goto no_uplink;
	if (!local.family)
		local = rt.src;
	if (local.family != f->app.family) {
		ret = -EADDRNOTAVAIL;
		goto no_uplink;
	}
	if ((ret = fastpath_udp_uplink(fp, rt.oif, why, sizeof(why))) != 0) {
		char name[IF_NAMESIZE] = "?";

		if (!uf->warned) {
			if_indextoname((unsigned)rt.oif, name);
			log_info(uf->log, "system stack: UDP flows out of %s (interface %d) stay in "
				 "userspace: %s", name, rt.oif, why);
		}
		uf->warned = true;
		goto no_uplink;
	}
	if (!(e = calloc(1, sizeof(*e)))) {
		ctr_inc(&uf->map_failed);
		return -ENOMEM;
	}
	e->app = f->app;
	memcpy(e->local, local.a, sizeof(e->local));
	e->lport_be = lport_be;
	/* The next hop: the route's gateway, or the remote itself on the link. */
	memcpy(e->nexthop, rt.gw.family ? rt.gw.a : f->app.dst, sizeof(e->nexthop));
	e->uplink = rt.oif;
	e->tun = uf->tun;
	e->mark = mark;
	e->quic_handshakes = f->quic_handshakes;
	e->sock_bound_dev = bound;
	if ((ret = fastpath_udp_add(fp, e)) != 0) {
		free(e);
		ctr_inc(&uf->map_failed);
		return ret;
	}
	ctr_inc(&uf->added);
	*cookie = e;
	return 0;
no_uplink:
	ctr_inc(&uf->no_uplink);
	return ret;
}

static void uf_del(void *arg, void *cookie)
{
	struct udpfast *uf = arg;

	if (*uf->fp)
		fastpath_udp_del(*uf->fp, cookie);
	free(cookie);
}

static int64_t uf_seen(void *arg, void *cookie)
{
	struct udpfast *uf = arg;

	return *uf->fp ? fastpath_udp_seen(*uf->fp, cookie) : -ENOENT;
}

const struct udp_offload udpfast_ops = { uf_add, uf_del, uf_seen };
