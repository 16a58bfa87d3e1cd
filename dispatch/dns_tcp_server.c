/* dns_tcp_server.c — the production resolver of hijacked DNS over TCP (dns_tcp.h): the
 * proxy's own DNS server (dns/server.h) behind the connection's small ops struct.
 *
 * A file of its own so that only a program that installs the real server links against it;
 * the connections and their tests need only the ops struct.
 */
#include "dispatch/dns_tcp.h"

static int server_query(void *ctx, const uint8_t *m, size_t len, bool tcp, size_t mtu_payload,
			dns_reply_fn fn, void *arg, struct dns_ticket **t)
{
	return dns_server_query(ctx, m, len, tcp, mtu_payload, fn, arg, t);
}

static void server_cancel(void *ctx, struct dns_ticket *t)
{
	dns_server_cancel(ctx, t);
}

void dns_tcp_resolver_server(struct dns_tcp_resolver *r, struct dns_server *s)
{
	r->query = server_query;
	r->cancel = server_cancel;
	r->ctx = s;
}
