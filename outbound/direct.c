/* direct.c — the direct outbound: a non-blocking connect() to the flow's original destination
 * from a marked/bound socket (outbound_socket), so it leaves by the routing table the user set
 * up for marked traffic instead of looping back into the TUN.
 *
 * By address, one event does the work: EV_WRITE says the connect finished (SO_ERROR tells how)
 * and the same event's timeout bounds it. TCP_NODELAY stays off: the relay moves bulk data.
 *
 * By name (outbound_connect_name): the name is looked up without blocking (ob->resolver, or a
 * resolver of the attempt's own whose sockets carry the outbound's mark), the answers are
 * filtered and ordered by the outbound's domain_strategy, and connected with Happy Eyeballs
 * (happy.h). The attempt's timer is one deadline over the lookup and the connects.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>

#include <event2/event.h>

#include "core/netaddr.h"
#include "outbound/conn.h"
#include "outbound/direct.h"
#include "outbound/happy.h"
#include "outbound/resolver.h"

/* An attempt by name: what is in progress. */
struct direct_conn {
	struct ts_outbound *ob;        /* a copy (happy connects with it after the lookup) */
	struct resolver *own_res;      /* without ob->resolver: this attempt's own */
	struct resolver_query *rq;     /* the lookup in progress */
	struct happy *he;              /* the connect attempts in progress */
	uint16_t port_be;
};

void direct_state_free(struct direct_conn *s)
{
	if (!s)
		return;
	resolver_cancel(s->rq);
	happy_cancel(s->he);
	resolver_free(s->own_res);
	free(s->ob);
	free(s);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct outbound_conn *c = arg;

	if (what & EV_TIMEOUT) {
		conn_finish(c, -ETIMEDOUT, NULL, 0);
		return;
	}
	conn_finish(c, conn_sock_error(c->fd), NULL, 0);
}

/* ---- by name ------------------------------------------------------------------------------- */

/* The lookup's family filter for a strategy: 0 both, 4 or 6 that one only. */
static int strategy_family(enum ts_domain_strategy ds)
{
	return ds == TS_DS_IPV4_ONLY ? 4 : ds == TS_DS_IPV6_ONLY ? 6 : 0;
}

/* The addresses to try, in order, with port_be: as the resolver gave them (both families
 * interleaved IPv6 first, RFC 8305 section 4, or one family), or for prefer_ipv4 interleaved
 * again with IPv4 first. Returns how many were written to ss. */
static size_t order_addrs(enum ts_domain_strategy ds, const struct netaddr *addrs, size_t n,
			  uint16_t port_be, struct sockaddr_storage ss[HAPPY_MAX_ADDRS])
{
	const struct netaddr *v4[RESOLVER_MAX_ADDRS], *v6[RESOLVER_MAX_ADDRS];
	size_t n4 = 0, n6 = 0, m = 0;

	for (size_t i = 0; i < n && i < RESOLVER_MAX_ADDRS; i++) {
		if (addrs[i].family == 4)
			v4[n4++] = &addrs[i];
		else if (addrs[i].family == 6)
			v6[n6++] = &addrs[i];
	}
	for (size_t i = 0; (i < n4 || i < n6) && m < HAPPY_MAX_ADDRS; i++) {
		const struct netaddr *a6 = i < n6 ? v6[i] : NULL, *a4 = i < n4 ? v4[i] : NULL;
		const struct netaddr *first = a6, *second = a4;

		if (ds == TS_DS_PREFER_IPV4) {
			first = a4;
			second = a6;
		}
		if (first && netaddr_sockaddr(first->family, first->a, port_be, &ss[m]))
			m++;
		if (second && m < HAPPY_MAX_ADDRS &&
		    netaddr_sockaddr(second->family, second->a, port_be, &ss[m]))
			m++;
	}
	return m;
}

/* The connect by Happy Eyeballs finished: hand the socket over, or the last error. */
static void on_connected(void *arg, int err, int fd)
{
	struct outbound_conn *c = arg;

	c->direct->he = NULL;
	if (err == 0)
		c->fd = fd;
	conn_finish(c, err, NULL, 0);
}

static void on_resolved(void *arg, int err, const struct netaddr *addrs, size_t n)
{
	struct outbound_conn *c = arg;
	struct direct_conn *s = c->direct;
	struct sockaddr_storage ss[HAPPY_MAX_ADDRS];
	size_t m = 0;

	s->rq = NULL;
	if (err == 0)
		m = order_addrs(s->ob->domain_strategy, addrs, n, s->port_be, ss);
	if (err == 0 && m == 0)
		err = -ENXIO;
	if (err == 0)
		err = happy_start(c->base, s->ob, ss, m, HAPPY_DELAY_MS, on_connected, c, &s->he);
	if (err != 0)
		conn_finish(c, err, NULL, 0);
}

static int start_by_name(struct outbound_conn *c, const struct ts_outbound *ob,
			 const struct flow_key *key, const char *name, uint32_t timeout_ms)
{
	struct timeval tv = conn_timeval(timeout_ms);
	struct direct_conn *s;
	struct resolver *r = ob->resolver;
	int ret;

	if (!(s = c->direct = calloc(1, sizeof(*s))) || !(s->ob = malloc(sizeof(*s->ob))))
		return -ENOMEM;
	*s->ob = *ob;
	s->port_be = key->dport_be;
	if (!r) {
		struct resolver_config cfg = { .sock = ob };

		if ((ret = resolver_new(c->base, &cfg, &s->own_res)) != 0)
			return ret;
		r = s->own_res;
	}
	ret = resolver_lookup(r, name, strategy_family(ob->domain_strategy), on_resolved, c,
			      &s->rq);
	if (ret == -EINVAL)
		return conn_defer(c, -ENXIO); /* a name the resolver cannot ask for: no such host */
	if (ret != 0)
		return ret;
	return event_add(c->timer, &tv) != 0 ? -ENOMEM : 0;
}

/* ---- by address ---------------------------------------------------------------------------- */

int direct_start(struct outbound_conn *c, const struct ts_outbound *ob,
		 const struct flow_key *key, const char *name, uint32_t timeout_ms)
{
	struct sockaddr_storage ss;
	struct timeval tv = conn_timeval(timeout_ms);
	socklen_t len;
	int ret, cerr;

	if (name)
		return start_by_name(c, ob, key, name, timeout_ms);
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
		return -ENOMEM;
	return 0;
}
