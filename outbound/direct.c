/* direct.c — the direct outbound: a non-blocking connect() to the flow's original destination
 * from a marked/bound socket (outbound_socket), so it leaves by the routing table the user set
 * up for marked traffic instead of looping back into the TUN.
 *
 * One event does the work: EV_WRITE says the connect finished (SO_ERROR tells how) and the
 * same event's timeout bounds it. TCP_NODELAY stays off: the relay moves bulk data.
 */
#include <errno.h>

#include <event2/event.h>

#include "core/netaddr.h"
#include "outbound/conn.h"
#include "outbound/direct.h"

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct outbound_conn *c = arg;

	if (what & EV_TIMEOUT) {
		conn_finish(c, -ETIMEDOUT, NULL, 0);
		return;
	}
	conn_finish(c, conn_sock_error(c->fd), NULL, 0);
}

int direct_start(struct outbound_conn *c, const struct ts_outbound *ob,
		 const struct flow_key *key, uint32_t timeout_ms)
{
	struct sockaddr_storage ss;
	struct timeval tv = conn_timeval(timeout_ms);
	socklen_t len;
	int ret, cerr;

	len = (socklen_t)netaddr_sockaddr(key->family, key->dst, key->dport_be, &ss);
	if (len == 0)
		return -EAFNOSUPPORT;
	if ((ret = conn_connect(c, ob, (const struct sockaddr *)&ss, len, &cerr)) != 0)
		return ret;
	if (cerr != 0)
		return conn_defer(c, cerr);
	c->io = event_new(c->base, c->fd, EV_WRITE, on_writable, c);
	if (!c->io)
		return -ENOMEM;
	if (event_add(c->io, &tv) != 0)
		return -EIO;
	return 0;
}
