/* stats_http.c — /stats and /metrics over libevent's evhttp, on a loopback listener.
 *
 * Every connection evhttp accepts is counted and has a deadline: over STATS_HTTP_MAX_CONNS the
 * new connection is closed at once (in the next loop iteration); a connection
 * that has not received a whole request within STATS_HTTP_REQUEST_MS is freed, however slowly
 * its bytes arrive (evhttp's own timeout is per read, so a client sending a byte every few
 * seconds would otherwise hold its fd and buffers for hours). */
#include "core/stats_http.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>

#include "core/counter.h"

#define MAX_BODY_SIZE 1024 /* we take no bodies; a larger one is refused (413) by evhttp */
/* What a connection may buffer, whatever evhttp counts (see make_bev), give or take one read
 * of at most CONN_READ_MAX bytes. */
#define CONN_INPUT_MAX (STATS_HTTP_MAX_HEADERS + MAX_BODY_SIZE + 4096)
#define CONN_READ_MAX 4096

/* One accepted connection: removed and freed by on_conn_close, which evhttp calls once when it
 * closes the connection for whatever reason (our deadline included), or by on_timer when it
 * was refused or already gone. */
struct conn {
	TAILQ_ENTRY(conn) link;
	struct stats_http *s;
	struct evhttp_connection *evcon; /* NULL until on_timer found it */
	struct bufferevent *bev;         /* referenced until then */
	struct event *timer;
	bool refused;                    /* over the cap: closed by on_timer */
};

struct stats_http {
	struct evhttp *http;
	TAILQ_HEAD(, conn) conns;
	ctr_t nconns, accepted, refused, timeouts, no_memory;
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
static void reply(struct stats_http *s, struct evhttp_request *req, int code,
		  const char *reason, const char *ctype, const char *body, size_t len)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	struct evbuffer *buf = evbuffer_new();
	char clen[24];

	snprintf(clen, sizeof(clen), "%zu", len);
	/* No memory for the body or one of the headers (a reply without its length, or a 405
	 * without Allow, would be misread): evhttp's own error page instead, with no header of
	 * ours (a Content-Length of the body meant would cut or stall the client's read). */
	if (!buf ||
	    (evhttp_request_get_command(req) != EVHTTP_REQ_HEAD && len &&
	     evbuffer_add(buf, body, len) != 0) ||
	    evhttp_add_header(h, "Content-Type", ctype) != 0 ||
	    evhttp_add_header(h, "Content-Length", clen) != 0 ||
	    /* Counters change on every read: no cache may serve a stale copy. */
	    evhttp_add_header(h, "Cache-Control", "no-store") != 0 ||
	    (code == 405 && evhttp_add_header(h, "Allow", "GET, HEAD") != 0)) {
		ctr_inc(&s->no_memory);
		evhttp_clear_headers(h);
		if (buf)
			evbuffer_free(buf);
		evhttp_send_error(req, 500, NULL);
		return;
	}
	evhttp_send_reply(req, code, reason, buf);
	evbuffer_free(buf);
}

/* ---- connections: cap and deadline --------------------------------------------------------- */

/* 0, or -ENOMEM: libevent had no memory for the timer (one already pending needs none). */
static int arm(struct conn *c, int ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	return evtimer_add(c->timer, &tv) == 0 ? 0 : -ENOMEM;
}

static void conn_free(struct conn *c)
{
	TAILQ_REMOVE(&c->s->conns, c, link);
	event_free(c->timer);
	if (c->bev)
		bufferevent_decref(c->bev);
	free(c);
}

static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
	struct conn *c = arg;
	struct stats_http *s = c->s;

	evhttp_connection_set_closecb(evcon, NULL, NULL); /* once, even if evhttp calls again */
	conn_free(c);
	ctr_add(&s->nconns, (uint64_t)-1);
}

/* The connection evhttp made for bev, or NULL when it already failed and freed it
 * (bufferevent_free clears the callbacks; our reference keeps bev itself valid). evhttp
 * registers the connection as the bufferevent's callback argument;
 * evhttp_connection_get_bufferevent confirms it. */
static struct evhttp_connection *conn_of(struct bufferevent *bev)
{
	struct evhttp_connection *evcon;
	void *cbarg = NULL;

	bufferevent_getcb(bev, NULL, NULL, NULL, &cbarg);
	evcon = cbarg;
	if (!evcon || evhttp_connection_get_bufferevent(evcon) != bev)
		return NULL;
	return evcon;
}

/* First run (right after the accept): find the connection, close it if it was over the cap or
 * its deadline cannot be timed (no memory: counted as refused), else watch it. Later runs: the
 * deadline passed without a whole request. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	struct stats_http *s = c->s;
	struct evhttp_connection *evcon;

	if (c->evcon) {
		ctr_inc(&s->timeouts);
		evhttp_connection_free(c->evcon); /* calls on_conn_close: c is gone after this */
		return;
	}
	evcon = conn_of(c->bev);
	if (!evcon || c->refused || arm(c, STATS_HTTP_REQUEST_MS) != 0) {
		if (!c->refused) {
			ctr_add(&s->nconns, (uint64_t)-1);
			if (evcon)
				ctr_inc(&s->refused);
		}
		/* evhttp had no memory for the connection: it never took the bufferevent (still
		 * without its socket, which evhttp closed), so the reference made for it is
		 * dropped here. One evhttp took and freed has its socket. */
		if (!evcon && bufferevent_getfd(c->bev) < 0)
			bufferevent_free(c->bev);
		conn_free(c);
		if (evcon)
			evhttp_connection_free(evcon);
		return;
	}
	bufferevent_decref(c->bev);
	c->bev = NULL;
	c->evcon = evcon;
	evhttp_connection_set_closecb(evcon, on_conn_close, c);
}

/* A request arrived whole: the clock restarts for the answer and the next request. */
static void request_done(struct stats_http *s, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct conn *c;

	/* The timer is pending until the connection closes: re-armed in place, with no memory
	 * needed. */
	TAILQ_FOREACH(c, &s->conns, link)
		if (c->evcon == evcon) {
			(void)arm(c, STATS_HTTP_REQUEST_MS);
			return;
		}
}

/* An input buffer (of bufferevent arg) grew to CONN_INPUT_MAX: reading is disabled until evhttp
 * enables it again (after an answer, with the buffered requests to parse). The watermark alone
 * only suspends it, and libevent then runs the read callback again in every loop iteration
 * while the buffer stays full and reading enabled: the loop would spin, and the callback
 * pending when the loop stops holds a reference that keeps the bufferevent (and its buffered
 * input) alive past evhttp_free. */
static void pause_reading(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	if (info->n_added && evbuffer_get_length(buf) >= CONN_INPUT_MAX)
		bufferevent_disable(arg, EV_READ);
}

/* evhttp asks for a bufferevent for each connection it accepts, before it reads anything:
 * the one place we see a new connection. Counted (or marked refused over the cap) here; the
 * rest happens in on_timer at once, when evhttp has made the connection. A reference on the
 * bufferevent lets on_timer tell whether the connection still exists. Out of memory (the
 * timer that finds the connection included): NULL, and evhttp makes an uncounted one (still
 * bounded by its own inactivity timeout). */
static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
	struct stats_http *s = arg;
	struct conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->s = s;
	c->timer = evtimer_new(base, on_timer, c);
	c->bev = bufferevent_socket_new(base, -1, 0);
	if (!c->timer || !c->bev || arm(c, 0) != 0 ||
	    !evbuffer_add_cb(bufferevent_get_input(c->bev), pause_reading, c->bev)) {
		if (c->timer)
			event_free(c->timer);
		if (c->bev)
			bufferevent_free(c->bev);
		free(c);
		return NULL;
	}
	bufferevent_incref(c->bev);
	/* What a connection may buffer, whatever evhttp counts: a chunked body's size line is
	 * counted against the body limit only once it ends, so a client streaming one endless
	 * line would otherwise grow the buffer until the request cap. Each read takes at most
	 * CONN_READ_MAX bytes, pause_reading stops reading at CONN_INPUT_MAX; the request cap
	 * then closes the connection. (Not a read watermark: libevent 2.1's
	 * bufferevent_setwatermark dereferences the callback it could not allocate.) */
	bufferevent_set_max_single_read(c->bev, CONN_READ_MAX);
	c->refused = ctr_get(&s->nconns) >= STATS_HTTP_MAX_CONNS;
	if (c->refused) {
		ctr_inc(&s->refused);
	} else {
		ctr_inc(&s->nconns);
		ctr_inc(&s->accepted);
	}
	TAILQ_INSERT_TAIL(&s->conns, c, link);
	return c->bev;
}

static void reply_text(struct stats_http *s, struct evhttp_request *req, int code,
		       const char *reason, const char *text)
{
	reply(s, req, code, reason, "text/plain; charset=utf-8", text, strlen(text));
}

/* A 500 for want of memory (the document's): counted once, whether or not the reply itself
 * had memory (reply counts it then). */
static void reply_nomem(struct stats_http *s, struct evhttp_request *req, const char *text)
{
	uint64_t counted = ctr_get(&s->no_memory);

	reply_text(s, req, 500, "Internal Server Error", text);
	if (ctr_get(&s->no_memory) == counted)
		ctr_inc(&s->no_memory);
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
	if ((ret = stats_doc_error(s->doc, &why)) != 0) {
		snprintf(msg, sizeof(msg), "%s\n", why);
		if (ret == -ENOMEM)
			reply_nomem(s, req, msg);
		else
			reply_text(s, req, 500, "Internal Server Error", msg);
		return;
	}
	ret = r == ROUTE_JSON ? stats_doc_json(s->doc, &body, &len)
			      : stats_doc_prometheus(s->doc, &body, &len);
	if (ret != 0) {
		reply_nomem(s, req, "stats: out of memory\n");
		return;
	}
	reply(s, req, 200, "OK", r == ROUTE_JSON ? STATS_HTTP_CT_JSON : STATS_HTTP_CT_PROM, body,
	      len);
	free(body);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	enum route r = route_of(req);

	request_done(arg, req);
	if (r == ROUTE_NONE) {
		reply_text(arg, req, 404, "Not Found", "not found: try " STATS_HTTP_PATH_JSON " or "
			   STATS_HTTP_PATH_PROM "\n");
		return;
	}
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
		reply_text(arg, req, 405, "Method Not Allowed", "method not allowed\n");
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
	    bind(fd, (struct sockaddr *)&ss, sslen) != 0 || listen(fd, STATS_HTTP_BACKLOG) != 0 ||
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
	TAILQ_INIT(&s->conns);
	if (!(s->doc = stats_doc_new()) || !(s->http = evhttp_new(base)))
		goto oom;
	evhttp_set_timeout(s->http, STATS_HTTP_TIMEOUT_S);
	evhttp_set_max_headers_size(s->http, STATS_HTTP_MAX_HEADERS);
	evhttp_set_bevcb(s->http, make_bev, s);
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

void stats_http_stats(const struct stats_http *s, struct stats_http_stats *out)
{
	out->connections = ctr_get(&s->nconns);
	out->accepted = ctr_get(&s->accepted);
	out->refused = ctr_get(&s->refused);
	out->timeouts = ctr_get(&s->timeouts);
	out->no_memory = ctr_get(&s->no_memory);
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
		evhttp_free(s->http); /* frees every connection: on_conn_close */
	while (!TAILQ_EMPTY(&s->conns)) /* accepted but not yet looked at by on_timer */
		conn_free(TAILQ_FIRST(&s->conns));
	stats_doc_free(s->doc);
	free(s);
}
