/* stats_http.c — /stats and /metrics over libevent's evhttp, on a loopback listener. */
#include "core/stats_http.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>

#define LISTEN_BACKLOG 16
#define MAX_HEADERS_SIZE 8192
#define MAX_BODY_SIZE 1024 /* we take no bodies; a larger one is refused (413) by evhttp */

struct stats_http {
	struct evhttp *http;
	stats_provider_fn fn;
	void *arg;
	struct stats_doc *doc;  /* reused: one loop thread serves one request at a time */
	uint16_t port;
};

enum route { ROUTE_NONE, ROUTE_JSON, ROUTE_PROM };

static enum route route_of(struct evhttp_request *req)
{
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;

	if (!path)
		return ROUTE_NONE;
	if (strcmp(path, STATS_HTTP_PATH_JSON) == 0)
		return ROUTE_JSON;
	if (strcmp(path, STATS_HTTP_PATH_PROM) == 0)
		return ROUTE_PROM;
	return ROUTE_NONE;
}

/* Reply with body (len bytes) and the given content type. Content-Length is always set:
 * evhttp adds it only for HTTP/1.1 and keep-alive, and for HEAD it must be the length a GET
 * would get. libevent 2.1 would send a HEAD reply's body, so we do not hand it one. */
static void reply(struct evhttp_request *req, int code, const char *reason, const char *ctype,
		  const char *body, size_t len)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	struct evbuffer *buf = evbuffer_new();
	char clen[24];

	snprintf(clen, sizeof(clen), "%zu", len);
	evhttp_add_header(h, "Content-Type", ctype);
	evhttp_add_header(h, "Content-Length", clen);
	/* Counters change on every read: no cache may serve a stale copy. */
	evhttp_add_header(h, "Cache-Control", "no-store");
	if (code == 405)
		evhttp_add_header(h, "Allow", "GET, HEAD");
	if (!buf) {
		evhttp_send_error(req, 500, NULL);
		return;
	}
	if (evhttp_request_get_command(req) != EVHTTP_REQ_HEAD && len &&
	    evbuffer_add(buf, body, len) != 0) {
		evbuffer_free(buf);
		evhttp_send_error(req, 500, NULL);
		return;
	}
	evhttp_send_reply(req, code, reason, buf);
	evbuffer_free(buf);
}

static void reply_text(struct evhttp_request *req, int code, const char *reason,
		       const char *text)
{
	reply(req, code, reason, "text/plain; charset=utf-8", text, strlen(text));
}

/* Ask the provider for a fresh document and render it. */
static void serve(struct stats_http *s, struct evhttp_request *req, enum route r)
{
	char *body = NULL, msg[512];
	const char *why;
	size_t len = 0;
	int ret;

	stats_doc_reset(s->doc);
	s->fn(s->arg, s->doc);
	if (stats_doc_error(s->doc, &why) != 0) {
		snprintf(msg, sizeof(msg), "%s\n", why);
		reply_text(req, 500, "Internal Server Error", msg);
		return;
	}
	ret = r == ROUTE_JSON ? stats_doc_json(s->doc, &body, &len)
			      : stats_doc_prometheus(s->doc, &body, &len);
	if (ret != 0) {
		reply_text(req, 500, "Internal Server Error", "stats: out of memory\n");
		return;
	}
	reply(req, 200, "OK", r == ROUTE_JSON ? STATS_HTTP_CT_JSON : STATS_HTTP_CT_PROM, body,
	      len);
	free(body);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	enum route r = route_of(req);

	if (r == ROUTE_NONE) {
		reply_text(req, 404, "Not Found", "not found: try " STATS_HTTP_PATH_JSON " or "
			   STATS_HTTP_PATH_PROM "\n");
		return;
	}
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
		reply_text(req, 405, "Method Not Allowed", "method not allowed\n");
		return;
	}
	serve(arg, req, r);
}

/* A listening socket on ep (loopback checked by the caller); *port gets the bound port. */
static int listen_socket(const struct netaddr_ep *ep, int *fd_out, uint16_t *port)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
	socklen_t sslen;
	int one = 1, fd, ret;

	memset(&ss, 0, sizeof(ss));
	if (ep->addr.family == 4) {
		sin->sin_family = AF_INET;
		sin->sin_port = htons(ep->port);
		memcpy(&sin->sin_addr, ep->addr.a, 4);
		sslen = sizeof(*sin);
	} else {
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(ep->port);
		memcpy(&sin6->sin6_addr, ep->addr.a, 16);
		sslen = sizeof(*sin6);
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    (ss.ss_family == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
	    bind(fd, (struct sockaddr *)&ss, sslen) != 0 || listen(fd, LISTEN_BACKLOG) != 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	*port = ntohs(ss.ss_family == AF_INET ? sin->sin_port : sin6->sin6_port);
	*fd_out = fd;
	return 0;
}

/* Hand the socket to evhttp. The listener owns (closes) fd from evconnlistener_new on. */
static int attach_listener(struct stats_http *s, struct event_base *base, int fd)
{
	struct evconnlistener *l = evconnlistener_new(base, NULL, NULL,
						      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
						      0, fd);

	if (!l) {
		close(fd);
		return -ENOMEM;
	}
	if (!evhttp_bind_listener(s->http, l)) {
		evconnlistener_free(l);
		return -ENOMEM;
	}
	return 0;
}

int stats_http_new(struct event_base *base, const struct netaddr_ep *listen,
		   stats_provider_fn fn, void *arg, struct stats_http **out, char *err,
		   size_t errlen)
{
	char ep[NETADDR_EP_STRLEN];
	struct stats_http *s;
	int fd = -1, ret;

	*out = NULL;
	netaddr_ep_format(listen, ep, sizeof(ep));
	if ((listen->addr.family != 4 && listen->addr.family != 6) ||
	    !netaddr_is_loopback(&listen->addr)) {
		if (err && errlen)
			snprintf(err, errlen, "stats: listen address %s is not a loopback address "
				 "(the endpoint is served to this host only)", ep);
		return -EINVAL;
	}
	if (!(s = calloc(1, sizeof(*s))))
		goto oom;
	s->fn = fn;
	s->arg = arg;
	if (!(s->doc = stats_doc_new()) || !(s->http = evhttp_new(base)))
		goto oom;
	evhttp_set_timeout(s->http, STATS_HTTP_TIMEOUT_S);
	evhttp_set_max_headers_size(s->http, MAX_HEADERS_SIZE);
	evhttp_set_max_body_size(s->http, MAX_BODY_SIZE);
	/* Let every method reach us, so the answer is our 405, not evhttp's 501. */
	evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
					    EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
					    EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
					    EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	evhttp_set_gencb(s->http, on_request, s);
	if ((ret = listen_socket(listen, &fd, &s->port)) != 0) {
		if (err && errlen)
			snprintf(err, errlen, "stats: cannot listen on %s: %s", ep, strerror(-ret));
		stats_http_free(s);
		return ret;
	}
	if (attach_listener(s, base, fd) != 0)
		goto oom;
	*out = s;
	return 0;
oom:
	if (err && errlen)
		snprintf(err, errlen, "stats: out of memory");
	stats_http_free(s);
	return -ENOMEM;
}

uint16_t stats_http_port(const struct stats_http *s)
{
	return s->port;
}

void stats_http_free(struct stats_http *s)
{
	if (!s)
		return;
	if (s->http)
		evhttp_free(s->http);
	stats_doc_free(s->doc);
	free(s);
}
