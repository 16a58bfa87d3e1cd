/* outbound.c — outbound sockets (IPv6 ones IPv6-only, marked, bound, handed to the socket
 * hook) and dispatch by outbound type; the reject outbound, which is only a deferred
 * -ECONNREFUSED. The attempt's life cycle is conn.c.
 */
#include "outbound/outbound.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/loopguard.h"
#include "outbound/conn.h"
#include "outbound/direct.h"
#include "outbound/http.h"
#include "outbound/socks5.h"

int outbound_socket(const struct ts_outbound *ob, int family, int type, int *fd_out)
{
	int fd, ret, domain, one = 1;

	if (family == 4)
		domain = AF_INET;
	else if (family == 6)
		domain = AF_INET6;
	else
		return -EAFNOSUPPORT;
	fd = socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* IPv6 only: through a dual-stack socket an IPv4-mapped destination (::ffff:a.b.c.d)
	 * would reach IPv4 — the proxy host's loopback, or past rules written for IPv4. */
	if (domain == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0)
		goto fail;
	/* Mark and bind before connect/sendto: the first packet must already avoid the TUN. */
	if (ob->has_routing_mark &&
	    setsockopt(fd, SOL_SOCKET, SO_MARK, &ob->routing_mark, sizeof(ob->routing_mark)) != 0)
		goto fail;
	if (ob->bind_interface[0] &&
	    setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ob->bind_interface,
		       (socklen_t)strlen(ob->bind_interface)) != 0)
		goto fail;
	if (ob->sock_hook.fn &&
	    (ret = ob->sock_hook.fn(ob->sock_hook.arg, fd, domain, type)) != 0) {
		close(fd);
		return ret < 0 ? ret : -EPERM;
	}
	/* A datagram socket's port on record before its first datagram, so that a datagram of it
	 * which a route sends back into the TUN is recognised there (a stream socket is recorded
	 * by conn_connect, once connect() has given it its addresses). */
	if (ob->loopguard && type == SOCK_DGRAM &&
	    (ret = loopguard_bind(ob->loopguard, fd, family, type)) != 0) {
		close(fd);
		return ret;
	}
	*fd_out = fd;
	return 0;
fail:
	ret = -errno;
	close(fd);
	return ret;
}

static int reject_start(struct outbound_conn *c, const struct ts_outbound *ob,
			const struct flow_key *key, const char *name, uint32_t timeout_ms)
{
	return conn_defer(c, -ECONNREFUSED);
}

typedef int (*start_fn)(struct outbound_conn *c, const struct ts_outbound *ob,
			const struct flow_key *key, const char *name, uint32_t timeout_ms);

static const start_fn starts[] = {
	[TS_OUT_DIRECT] = direct_start,
	[TS_OUT_SOCKS5] = socks5_start,
	[TS_OUT_REJECT] = reject_start,
	[TS_OUT_HTTP] = http_start,
};

/* A server name pinned in both to other addresses differs; one not pinned (yet) resolves
 * the same name. */
static bool hostport_same(const struct ts_hostport *a, const struct ts_hostport *b)
{
	return strcmp(a->host, b->host) == 0 && a->is_addr == b->is_addr && a->port == b->port &&
	       (a->is_addr ? netaddr_eq(&a->addr, &b->addr)
			   : !a->pinned || !b->pinned || netaddr_eq(&a->addr, &b->addr));
}

bool outbound_same(const struct ts_outbound *a, const struct ts_outbound *b)
{
	return a->type == b->type && a->has_routing_mark == b->has_routing_mark &&
	       a->routing_mark == b->routing_mark &&
	       strcmp(a->bind_interface, b->bind_interface) == 0 &&
	       a->has_server == b->has_server &&
	       (!a->has_server || hostport_same(&a->server, &b->server)) &&
	       a->has_auth == b->has_auth && strcmp(a->username, b->username) == 0 &&
	       strcmp(a->password, b->password) == 0 && a->udp == b->udp &&
	       strcmp(a->http_headers, b->http_headers) == 0 &&
	       a->domain_strategy == b->domain_strategy;
}

bool outbound_name_valid(const char *name)
{
	size_t len = name ? strnlen(name, OUTBOUND_NAME_MAX + 1) : 0;

	if (len == 0 || len > OUTBOUND_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)name[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
			return false;
	}
	return true;
}

int outbound_connect(struct event_base *base, const struct ts_outbound *ob,
		     const struct flow_key *key, uint32_t timeout_ms, outbound_done_fn done,
		     void *arg, struct outbound_conn **out)
{
	return outbound_connect_name(base, ob, key, NULL, timeout_ms, done, arg, out);
}

int outbound_connect_name(struct event_base *base, const struct ts_outbound *ob,
			  const struct flow_key *key, const char *name, uint32_t timeout_ms,
			  outbound_done_fn done, void *arg, struct outbound_conn **out)
{
	struct outbound_conn *c;
	int ret;

	if (!base || !ob || !key || !done || !out || timeout_ms == 0)
		return -EINVAL;
	if (name && !outbound_name_valid(name))
		return -EINVAL;
	if ((unsigned)ob->type >= sizeof(starts) / sizeof(starts[0]) || !starts[ob->type])
		return -EINVAL;
	if (key->family != 4 && key->family != 6)
		return -EAFNOSUPPORT;
	c = conn_new(base, done, arg);
	if (!c)
		return -ENOMEM;
	if ((ret = starts[ob->type](c, ob, key, name, timeout_ms)) != 0) {
		conn_free(c);
		return ret;
	}
	*out = c;
	return 0;
}

void outbound_conn_cancel(struct outbound_conn *c)
{
	if (c)
		conn_free(c);
}
