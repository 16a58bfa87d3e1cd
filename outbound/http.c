/* http.c — the HTTP CONNECT outbound (RFC 9110 section 9.3.6) on libevent: TCP connect to the
 * proxy from a marked/bound socket, the CONNECT request of http_codec (optional Basic
 * authentication, RFC 7617, and the configured extra header fields), then the proxy's response
 * head. The request's target is the flow's original destination address, or the destination's
 * name when the session has one (the proxy resolves it). A 2xx status opens the tunnel: bytes
 * after the head are the stream's first bytes and go to done() as early bytes. 407 (and 401)
 * fails the attempt with -EACCES, any other status with -ECONNREFUSED (the app gets a prompt
 * RST; the status is logged at debug level to ob->log); a
 * malformed head -EPROTO, one over HTTP_RESP_MAX bytes -EMSGSIZE.
 *
 * The connection to the proxy is made as socks5.c makes it (the same structure, see there):
 * a literal or pinned server address is connected at once, a name not pinned is resolved
 * asynchronously (ob->resolver, or a resolver of the attempt's own) and connected with Happy
 * Eyeballs; one deadline (conn.c) covers resolution, connect, request and response.
 * This file only moves bytes; every protocol decision is in the codec.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "core/log.h"
#include "core/netaddr.h"
#include "outbound/conn.h"
#include "outbound/http.h"
#include "outbound/http_codec.h"
#include "outbound/server_link.h"

_Static_assert(TS_HTTP_HEADERS_MAX <= HTTP_EXTRA_MAX, "configured headers fit the request");
_Static_assert(TS_HOST_MAX <= HTTP_HOST_MAX, "a server name fits the codec");

/* Room for the longest response head plus early bytes; more early bytes stay in the socket. */
#define HTTP_IN_CAP (HTTP_RESP_MAX + 1024)

struct http_conn {
	struct server_link link; /* the connection to the server (server_link.h) */
	struct log *log;         /* the outbound's (a refusal's status at debug), or NULL */
	char tag[TS_TAG_MAX + 1];
	uint8_t out[HTTP_REQ_MAX];
	uint8_t in[HTTP_IN_CAP];
};

void http_state_free(struct http_conn *s)
{
	if (!s)
		return;
	server_link_fini(&s->link);
	free(s);
}

/* The handshake's step (server_link.h): send the request, then parse the response head as
 * bytes arrive. 1 when the tunnel is established (*head: the head's length: the stream's bytes
 * follow it), 0 to wait for the socket, -errno on failure: the proxy's refusal mapped by
 * http_status_errno, or the parser's -EPROTO / -EMSGSIZE. */
static int advance(struct outbound_conn *c, size_t *head)
{
	struct http_conn *s = c->http;
	int n, status = 0;

	if ((n = server_link_flush(c)) < 0)
		return n;
	if (s->link.out_off < s->link.out_len || s->link.in_len == 0)
		return 0;
	n = http_parse_response(s->in, s->link.in_len, &status);
	if (n <= 0)
		return n == HTTP_NEED_MORE && s->link.in_len == sizeof(s->in) ? -EMSGSIZE : n;
	*head = (size_t)n;
	n = http_status_errno(status);
	if (n < 0 && s->log)
		log_debug(s->log, "outbound %s: the HTTP proxy answered CONNECT with status %d",
			  s->tag, status);
	return n < 0 ? n : 1;
}

/* The request to name, or without one to the flow's original destination, queued. */
static int prepare(struct outbound_conn *c, const struct ts_outbound *ob,
		   const struct flow_key *key, const char *name)
{
	char host[NETADDR_STRLEN];
	struct netaddr a = { .family = key->family };
	int ret;

	c->http = calloc(1, sizeof(*c->http));
	if (!c->http)
		return -ENOMEM;
	c->http->link.out = c->http->out;
	c->http->link.in = c->http->in;
	c->http->link.in_cap = sizeof(c->http->in);
	c->http->log = ob->log;
	memcpy(c->http->tag, ob->tag, sizeof(c->http->tag));
	memcpy(a.a, key->dst, key->family == 4 ? 4 : 16);
	netaddr_format(&a, host, sizeof(host));
	ret = http_build_connect((char *)c->http->out, sizeof(c->http->out), name ? name : host,
				 ntohs(key->dport_be), ob->has_auth ? ob->username : NULL,
				 ob->has_auth ? ob->password : NULL, ob->http_headers);
	if (ret < 0)
		return ret;
	c->http->link.out_len = (size_t)ret;
	return 0;
}

int http_start(struct outbound_conn *c, const struct ts_outbound *ob,
	       const struct flow_key *key, const char *name, uint32_t timeout_ms)
{
	int ret;

	if (!ob->has_server)
		return -EINVAL;
	if ((ret = prepare(c, ob, key, name)) != 0)
		return ret;
	return server_link_start(c, &c->http->link, ob, advance, timeout_ms);
}
