/* doh.c — one DNS over HTTPS upstream: asks as HTTP/2 streams on one TLS connection (doh.h).
 *
 * An ask (struct dns_doh_q) is always in exactly one list of its upstream: wait (queued for
 * the connection), the link's sent (its try assigned to the connection: a stream once the
 * session is up, stream_id > 0) or done (finished, its callback about to run). Each ask owns
 * its try's timer and, while on a stream, the response read so far.
 *
 * The connection (struct link, embedded) is CLOSED, CONNECTING (outbound_connect), TLS (the
 * handshake), UP (the nghttp2 session), or FAILED (the connect could not start: reported from
 * the loop by the kick event). Tries are assigned to it as soon as it exists, their timers
 * running; their streams are submitted when it is UP.
 *
 * nghttp2 runs its callbacks inside nghttp2_session_mem_recv/send: there an ask only changes
 * lists (wait, done); nothing is freed, no connection closed and no user callback run. User
 * callbacks run only from libevent callbacks, through settle() and deliver(), which frees the
 * ask first. A callback may free the upstream: dns_doh_free then only drops the asks and marks
 * it dying, and deliver() finishes the job when the callback returns and tells its caller to
 * stop touching anything (false).
 */
#include "dns/doh.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/clock.h"
#include "core/flow.h"
#include "core/libmem.h"
#include "core/tlslib.h"
#include "outbound/outbound.h"

#define QUERY_MAX (DNS_HDR_LEN + DNS_WIRE_NAME_MAX + 4 + DNS_OPT_LEN)
#define BODY_MAX 65535                /* the largest DNS message */
#define RBUF_LEN 16384                /* one TLS record */
#define READS_PER_EVENT 64            /* a flooding server cannot hold the loop */
#define AUTHORITY_MAX (DNS_DOH_HOST_MAX + 2 + 6)  /* [host]:port */
#define MEDIA_TYPE "application/dns-message"

struct dns_doh_q;

struct dq_list {
	struct dns_doh_q *head, *tail;
	size_t n;
};

struct dns_doh_q {
	struct dns_doh *d;
	struct dns_doh_q *prev, *next;
	struct dq_list *list;          /* the list it is in */
	struct dns_question q;
	dns_upstream_cb cb;
	void *arg;
	struct event *timer;           /* the try's timeout; a try that could not start */
	int start_err;                 /* the try could not start (reported by timer), 0 */
	uint32_t tries_left;
	int32_t stream_id;             /* > 0: its try's stream on the session */
	uint64_t rx_mark;              /* link rx when the try was assigned */
	bool full_try;                 /* its timer is a whole timeout, not cut by the deadline */
	bool refused_once;             /* a refusal was given back during the current try */
	int64_t deadline_ns;           /* no try after this (asked + tries x timeout) */
	uint8_t req[QUERY_MAX];        /* the query, id 0: the same for every try */
	size_t req_len, req_off;
	int status;                    /* the response's :status, 0 none yet */
	bool type_ok;                  /* content-type application/dns-message */
	bool too_long;                 /* the body passed BODY_MAX */
	bool no_memory;                /* no memory to keep the body: the try fails */
	uint8_t *body;                 /* the response body, at most BODY_MAX bytes */
	size_t blen, bcap;
	int final_err;                 /* in done: what the callback gets */
	struct dns_answer a;           /* in done with final_err 0: the answer's parse */
};

enum link_state { LINK_CLOSED, LINK_CONNECTING, LINK_TLS, LINK_UP, LINK_FAILED };

struct link {
	enum link_state state;
	int err;                       /* FAILED: why */
	int fd;
	struct outbound_conn *oc;      /* CONNECTING: the attempt */
	struct event *rev, *wev;       /* TLS, UP: the socket readable, writable */
	SSL *ssl;
	nghttp2_session *h2;           /* UP */
	bool goaway;                   /* no new stream on it: replaced once its streams end */
	bool wblocked;                 /* TLS wants the socket writable to go on */
	uint64_t rx;                   /* TLS reads that returned data on this connection */
	struct dq_list sent;
};

struct dns_doh {
	struct event_base *base;
	struct ts_outbound ob;
	struct flow_key key;           /* the destination for outbound_connect */
	char host[DNS_DOH_HOST_MAX + 1];
	bool host_is_ip;
	char path[DNS_DOH_PATH_MAX + 1];
	char authority[AUTHORITY_MAX + 1];
	SSL_CTX *ctx;
	bool ctx_stale;                /* made again before the next connection */
	char *ca;                      /* the trust anchors' file, NULL: the system's */
	uint32_t timeout_ms, tries, idle_ms;
	struct dq_list wait, done;
	size_t asks;
	unsigned busy;                 /* a callback is running */
	bool dying;                    /* freed from a callback: destroy when it returns */
	bool sending;                  /* inside nghttp2_session_send */
	uint64_t send_refusals;        /* libmem_refusals() when that send began */
	struct event *idle;            /* closes the idle connection */
	struct event *kick;            /* reports a FAILED link from the loop */
	struct link l;
	struct dns_doh_stats st;
	uint8_t rbuf[RBUF_LEN];
};

static void pump(struct dns_doh *d);
static int tls_ctx_new(struct dns_doh *d);

/* ---- lists ---- */

static void list_unlink(struct dns_doh_q *q)
{
	struct dq_list *l = q->list;

	if (!l)
		return;
	if (q->prev)
		q->prev->next = q->next;
	else
		l->head = q->next;
	if (q->next)
		q->next->prev = q->prev;
	else
		l->tail = q->prev;
	l->n--;
	q->prev = q->next = NULL;
	q->list = NULL;
}

static void list_push(struct dq_list *l, struct dns_doh_q *q, bool head)
{
	list_unlink(q);
	q->list = l;
	if (head) {
		q->prev = NULL;
		q->next = l->head;
		if (l->head)
			l->head->prev = q;
		else
			l->tail = q;
		l->head = q;
	} else {
		q->next = NULL;
		q->prev = l->tail;
		if (l->tail)
			l->tail->next = q;
		else
			l->head = q;
		l->tail = q;
	}
	l->n++;
}

/* ---- asks ---- */

static struct timeval ms_tv(uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

static void kick_write(struct dns_doh *d)
{
	if (d->l.wev)
		event_active(d->l.wev, EV_WRITE, 1);
}

/* The ask whose try is on stream sid, or NULL (cancelled, timed out: the stream is being
 * reset). Found by its stream id rather than by nghttp2's stream user data, so that no
 * pointer to a freed ask can remain inside the session. At most DNS_DOH_MAX_STREAMS long. */
static struct dns_doh_q *stream_ask(struct dns_doh *d, int32_t sid)
{
	struct dns_doh_q *q;

	for (q = d->l.sent.head; q && q->stream_id != sid; q = q->next)
		;
	return q;
}

/* q leaves its stream: reset (CANCEL) unless the stream already closed. */
static void stream_detach(struct dns_doh *d, struct dns_doh_q *q)
{
	if (q->stream_id > 0 && d->l.h2) {
		nghttp2_submit_rst_stream(d->l.h2, NGHTTP2_FLAG_NONE, q->stream_id, NGHTTP2_CANCEL);
		kick_write(d);
	}
	q->stream_id = -1;
}

static void response_reset(struct dns_doh_q *q)
{
	free(q->body);
	q->body = NULL;
	q->blen = q->bcap = 0;
	q->status = 0;
	q->type_ok = q->too_long = q->no_memory = false;
}

static void q_release(struct dns_doh_q *q)
{
	struct dns_doh *d = q->d;

	stream_detach(d, q);
	list_unlink(q);
	event_free(q->timer);
	response_reset(q);
	d->asks--;
	free(q);
}

static void link_close(struct dns_doh *d);

static void destroy(struct dns_doh *d)
{
	link_close(d);
	if (d->idle)
		event_free(d->idle);
	if (d->kick)
		event_free(d->kick);
	SSL_CTX_free(d->ctx);
	free(d->ca);
	free(d);
}

/* Run q's callback (q freed first). false: the upstream was freed by it, touch nothing. */
static bool deliver(struct dns_doh_q *q)
{
	struct dns_doh *d = q->d;
	dns_upstream_cb cb = q->cb;
	void *arg = q->arg;
	int err = q->final_err;
	struct dns_answer a;
	uint8_t *body = NULL;
	size_t blen = 0;

	if (err == 0) {
		a = q->a;
		body = q->body;
		blen = q->blen;
		q->body = NULL;
	}
	q_release(q);
	d->busy++;
	cb(arg, err, body, blen, err == 0 ? &a : NULL);
	d->busy--;
	free(body);
	if (!d->dying)
		return true;
	if (d->busy == 0)
		destroy(d);
	return false;
}

/* Deliver every finished ask, then let waiting ones onto the connection. */
static bool settle(struct dns_doh *d)
{
	while (d->done.head)
		if (!deliver(d->done.head))
			return false;
	pump(d);
	return true;
}

/* A try of q ended without an answer (err): the next try queued first in line, or q to done
 * with err. The caller counts the reason, detached q from its stream, and settles. */
static void try_end(struct dns_doh_q *q, int err)
{
	struct dns_doh *d = q->d;

	evtimer_del(q->timer);
	q->start_err = 0;
	response_reset(q);
	q->refused_once = false;
	if (ts_now_ns() >= q->deadline_ns)
		q->tries_left = 0; /* its time is up, whatever tries were given back */
	if (q->tries_left > 0) {
		list_push(&d->wait, q, true);
		return;
	}
	q->final_err = err;
	list_push(&d->done, q, false);
}

/* q's try did not count (its stream refused unprocessed, its connection taken as dead): back
 * first in line with the try given back, unless its deadline has passed. Without the deadline,
 * N asks in flight on a silent server would each take up to N x tries timeouts: each timeout
 * voids the connection and gives the others their try back. */
static void try_refund(struct dns_doh_q *q)
{
	q->stream_id = -1;
	if (ts_now_ns() >= q->deadline_ns) {
		q->d->st.timeouts++;
		try_end(q, -ETIMEDOUT);
		return;
	}
	evtimer_del(q->timer);
	q->start_err = 0;
	response_reset(q);
	q->tries_left++;
	list_push(&q->d->wait, q, true);
}

/* ---- HTTP/2: nghttp2's callbacks (lists only, see the file comment) ---- */

static ssize_t h2_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags,
		       void *arg)
{
	struct dns_doh *d = arg;
	int n, e;

	ERR_clear_error();
	n = SSL_write(d->l.ssl, data, len > INT_MAX ? INT_MAX : (int)len);
	if (n > 0)
		return n;
	e = SSL_get_error(d->l.ssl, n);
	if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
		d->l.wblocked = e == SSL_ERROR_WANT_WRITE;
		return NGHTTP2_ERR_WOULDBLOCK;
	}
	return NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* The request body: the query. The stream's ask, not the data source, so that a cancelled
 * ask is never read. */
static ssize_t h2_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len,
		       uint32_t *flags, nghttp2_data_source *src, void *arg)
{
	struct dns_doh_q *q = stream_ask(arg, sid);
	size_t n;

	if (!q) {
		*flags |= NGHTTP2_DATA_FLAG_EOF;
		return 0;
	}
	n = q->req_len - q->req_off < len ? q->req_len - q->req_off : len;
	memcpy(buf, q->req + q->req_off, n);
	q->req_off += n;
	if (q->req_off == q->req_len)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

static bool hdr_is(const uint8_t *name, size_t len, const char *want)
{
	return len == strlen(want) && memcmp(name, want, len) == 0;
}

static int h2_on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
			size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags, void *arg)
{
	struct dns_doh_q *q;

	if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_RESPONSE)
		return 0;
	if (!(q = stream_ask(arg, f->hd.stream_id)))
		return 0;
	if (hdr_is(name, nlen, ":status")) {
		q->status = vlen == 3 ? (value[0] - '0') * 100 + (value[1] - '0') * 10 +
					(value[2] - '0') : -1;
	} else if (hdr_is(name, nlen, "content-type")) {
		/* RFC 8484 section 6: the media type; no parameters are defined for it. */
		q->type_ok = vlen == strlen(MEDIA_TYPE) &&
			     strncasecmp((const char *)value, MEDIA_TYPE, vlen) == 0;
	}
	return 0;
}

static int h2_on_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data,
		      size_t len, void *arg)
{
	struct dns_doh_q *q = stream_ask(arg, sid);
	size_t cap;
	uint8_t *b;

	if (!q || q->status != 200 || !q->type_ok || q->too_long || q->no_memory)
		return 0;  /* not kept: the try fails when the stream closes */
	if (len > BODY_MAX - q->blen) {
		q->too_long = true;
		return 0;
	}
	if (q->blen + len > q->bcap) {
		cap = q->bcap ? q->bcap : 512;
		while (cap < q->blen + len)
			cap *= 2;
		cap = cap > BODY_MAX ? BODY_MAX : cap;
		if (!(b = realloc(q->body, cap))) {
			q->no_memory = true;  /* not the server's fault: an error, not a bad answer */
			return 0;
		}
		q->body = b;
		q->bcap = cap;
	}
	memcpy(q->body + q->blen, data, len);
	q->blen += len;
	return 0;
}

/* q's stream closed with error_code: its answer, or how its try ended. */
static void stream_done(struct dns_doh *d, struct dns_doh_q *q, uint32_t error_code)
{
	q->stream_id = -1;
	if (error_code == NGHTTP2_REFUSED_STREAM && d->sending) {
		/* Refused by nghttp2 itself, not by the server: its request could not be sent
		 * (nghttp2 found no memory to encode it, the session is going away). Never the
		 * server's refusal; given back once per try, as a server's is, and then ended, so
		 * that a loop short of memory does not open connection after connection. */
		if (!q->refused_once) {
			q->refused_once = true;
			try_refund(q);
			return;
		}
		d->st.errors++;
		try_end(q, libmem_refusals() != d->send_refusals ? -ENOMEM : -ECONNREFUSED);
		return;
	}
	if (error_code == NGHTTP2_REFUSED_STREAM) {
		/* RFC 9113 section 8.7: the server did not process it; safe to ask again, the try
		 * given back. Once per try: refused again, the server refuses outright (overloaded,
		 * or a GOAWAY on every connection), and the try counts; else each ask would open
		 * one connection after another until its deadline and end as a timeout. */
		d->st.refused++;
		if (!q->refused_once) {
			q->refused_once = true;
			try_refund(q);
			return;
		}
		d->st.errors++;
		try_end(q, -ECONNREFUSED);
		return;
	}
	if (error_code != NGHTTP2_NO_ERROR) {
		d->st.errors++;
		try_end(q, -ECONNRESET);
		return;
	}
	if (q->status != 200 || !q->type_ok) {
		d->st.http_errors++;
		try_end(q, -EBADMSG);
		return;
	}
	if (q->no_memory) {
		d->st.errors++;
		try_end(q, -ENOMEM);
		return;
	}
	/* RFC 8484 section 4.1: the query went with id 0, the answer carries it back. */
	if (q->too_long || !q->body || dns_parse_answer(q->body, q->blen, 0, &q->q, &q->a) != 0) {
		d->st.bad_answers++;
		try_end(q, -EPROTO);
		return;
	}
	evtimer_del(q->timer);
	q->final_err = 0;
	list_push(&d->done, q, false);
}

static int h2_on_close(nghttp2_session *s, int32_t sid, uint32_t error_code, void *arg)
{
	struct dns_doh_q *q = stream_ask(arg, sid);

	if (q)
		stream_done(arg, q, error_code);
	return 0;
}

static int h2_on_frame(nghttp2_session *s, const nghttp2_frame *f, void *arg)
{
	struct dns_doh *d = arg;

	/* Streams above its last stream id are closed by nghttp2 as REFUSED_STREAM. */
	if (f->hd.type == NGHTTP2_GOAWAY)
		d->l.goaway = true;
	return 0;
}

static int h2_start(struct dns_doh *d)
{
	nghttp2_session_callbacks *cbs;
	nghttp2_option *opt;
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_ENABLE_PUSH, 0 },
		{ NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 0 },  /* none from the server */
		{ NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 16384 },
	};
	int rv;

	if (nghttp2_option_new(&opt) != 0)
		return -ENOMEM;
	/* Until the server's SETTINGS arrive: no more streams than we would open anyway. */
	nghttp2_option_set_peer_max_concurrent_streams(opt, DNS_DOH_MAX_STREAMS);
	if (nghttp2_session_callbacks_new(&cbs) != 0) {
		nghttp2_option_del(opt);
		return -ENOMEM;
	}
	nghttp2_session_callbacks_set_send_callback(cbs, h2_send);
	nghttp2_session_callbacks_set_on_header_callback(cbs, h2_on_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, h2_on_data);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, h2_on_close);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, h2_on_frame);
	rv = nghttp2_session_client_new3(&d->l.h2, cbs, d, opt, libmem_nghttp2());
	nghttp2_session_callbacks_del(cbs);
	nghttp2_option_del(opt);
	if (rv != 0)
		return -ENOMEM;
	if (nghttp2_submit_settings(d->l.h2, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])))
		return -ENOMEM;
	return 0;
}

/* ---- the connection ---- */

static void link_close(struct dns_doh *d)
{
	struct link *l = &d->l;

	if (l->oc)
		outbound_conn_cancel(l->oc);
	if (l->rev)
		event_free(l->rev);
	if (l->wev)
		event_free(l->wev);
	/* No callback runs from nghttp2_session_del. */
	if (l->h2)
		nghttp2_session_del(l->h2);
	if (l->ssl)
		SSL_free(l->ssl);
	if (l->fd >= 0)
		close(l->fd);
	l->oc = NULL;
	l->rev = l->wev = NULL;
	l->h2 = NULL;
	l->ssl = NULL;
	l->fd = -1;
	l->goaway = l->wblocked = false;
	l->state = LINK_CLOSED;
	if (d->idle)
		evtimer_del(d->idle);
	if (d->kick)
		event_del(d->kick);
}

/* The connection is gone (err): each ask it had not answered has its try ended by err. */
static void link_lost(struct dns_doh *d, int err)
{
	struct link *l = &d->l;

	link_close(d);
	/* From the tail, each pushed first in line: the queue keeps their order. */
	while (l->sent.tail) {
		l->sent.tail->stream_id = -1;
		d->st.errors++;
		try_end(l->sent.tail, err);
	}
	settle(d);
}

/* The connection is taken as dead: its asks go again on a new one, their tries kept. */
static void link_void(struct dns_doh *d)
{
	link_close(d);
	while (d->l.sent.tail)
		try_refund(d->l.sent.tail);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct dns_doh *d = arg;

	link_lost(d, d->l.err);
}

/* Whether a failed OpenSSL call ran out of memory: an allocation of OpenSSL's was refused
 * since refusals was read (core/libmem.h), or OpenSSL reports one. The queue is left as is. */
static bool tls_nomem(uint64_t refusals)
{
	return libmem_refusals() != refusals ||
	       ERR_GET_REASON(ERR_peek_error()) == ERR_R_MALLOC_FAILURE;
}

/* The same for an nghttp2 call that returned rv (h2_send's SSL_write runs inside one). */
static bool h2_nomem(int rv, uint64_t refusals)
{
	return rv == NGHTTP2_ERR_NOMEM || tls_nomem(refusals);
}

/* Read what TLS has, feed it to the session, send what the session has. 0, or the error
 * that loses the connection. */
static int h2_io(struct dns_doh *d)
{
	struct link *l = &d->l;
	uint64_t refusals = libmem_refusals();
	ssize_t rv;
	int i, n, e;

	l->wblocked = false;
	for (i = 0; i < READS_PER_EVENT; i++) {
		ERR_clear_error();
		n = SSL_read(l->ssl, d->rbuf, sizeof(d->rbuf));
		if (n > 0) {
			l->rx++;
			if ((rv = nghttp2_session_mem_recv(l->h2, d->rbuf, (size_t)n)) < 0)
				return h2_nomem((int)rv, refusals) ? -ENOMEM : -EPROTO;
			continue;
		}
		e = SSL_get_error(l->ssl, n);
		if (e == SSL_ERROR_WANT_READ)
			break;
		if (e == SSL_ERROR_WANT_WRITE) {
			l->wblocked = true;
			break;
		}
		if (tls_nomem(refusals))
			return -ENOMEM;
		return e == SSL_ERROR_SSL ? -EPROTO : -ECONNRESET;
	}
	if (i == READS_PER_EVENT)
		event_active(l->rev, EV_READ, 1);  /* more may be buffered inside TLS */
	d->sending = true;
	d->send_refusals = libmem_refusals();
	rv = nghttp2_session_send(l->h2);
	d->sending = false;
	if (rv != 0)
		return h2_nomem((int)rv, refusals) ? -ENOMEM : -ECONNRESET;
	/* Both false: the session is over (a GOAWAY and every stream done, or a fatal error). */
	if (!nghttp2_session_want_read(l->h2) && !nghttp2_session_want_write(l->h2))
		return -ECONNRESET;
	if (!l->wblocked)
		event_del(l->wev);
	else if (event_add(l->wev, NULL) != 0)
		return -ENOMEM;  /* TLS could never go on */
	return 0;
}

static void h2_run(struct dns_doh *d)
{
	int err = h2_io(d);

	if (err != 0) {
		link_lost(d, err);
		return;
	}
	settle(d);
}

/* The handshake done: ALPN must have picked h2, then the session starts. */
static void tls_up(struct dns_doh *d)
{
	struct link *l = &d->l;
	const unsigned char *p = NULL;
	unsigned int n = 0;
	int err;

	SSL_get0_alpn_selected(l->ssl, &p, &n);
	if (n != 2 || memcmp(p, "h2", 2) != 0) {
		d->st.tls_failures++;
		link_lost(d, -EPROTO);
		return;
	}
	if ((err = h2_start(d)) != 0) {
		link_lost(d, err);
		return;
	}
	l->state = LINK_UP;
	pump(d);
	h2_run(d);
}

static void tls_step(struct dns_doh *d)
{
	struct link *l = &d->l;
	uint64_t refusals = libmem_refusals();
	int r, e;

	ERR_clear_error();
	r = SSL_connect(l->ssl);
	if (r == 1) {
		event_del(l->wev);
		tls_up(d);
		return;
	}
	e = SSL_get_error(l->ssl, r);
	if (e == SSL_ERROR_WANT_READ) {
		event_del(l->wev);
		return;
	}
	if (e == SSL_ERROR_WANT_WRITE) {
		if (event_add(l->wev, NULL) != 0)
			link_lost(d, -ENOMEM);  /* the handshake could never go on */
		return;
	}
	if (tls_nomem(refusals)) {
		ERR_clear_error();
		d->ctx_stale = true;    /* see tls_new */
		link_lost(d, -ENOMEM);  /* no memory for the handshake: no fault of the server's */
		return;
	}
	if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN ||
	    ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
		ERR_clear_error();
		link_lost(d, -ECONNRESET);  /* the connection, not TLS, failed */
		return;
	}
	d->st.tls_failures++;
	r = SSL_get_verify_result(l->ssl) != X509_V_OK ? -EKEYREJECTED : -EPROTO;
	ERR_clear_error();
	link_lost(d, r);
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
	struct dns_doh *d = arg;

	if (what & EV_READ)
		d->l.rx++;  /* the handshake's bytes count as life too */
	if (d->l.state == LINK_TLS)
		tls_step(d);
	else if (d->l.state == LINK_UP)
		h2_run(d);
}

static int tls_new(struct dns_doh *d)
{
	struct link *l = &d->l;
	int ret;

	/* A handshake OpenSSL had no memory for may have left a certificate of the context's
	 * store marked invalid for good (OpenSSL caches the outcome of a certificate's first
	 * check, a failed allocation included): the next connection gets a fresh context. */
	if (d->ctx_stale) {
		SSL_CTX_free(d->ctx);
		d->ctx = NULL;
		if ((ret = tls_ctx_new(d)) != 0)
			return ret == -ENOMEM ? ret : -EKEYREJECTED;
		d->ctx_stale = false;
	}
	if (!(l->ssl = SSL_new(d->ctx)) || SSL_set_fd(l->ssl, l->fd) != 1)
		return -ENOMEM;
	if (d->host_is_ip) {
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(l->ssl), d->host) != 1)
			return -EINVAL;
	} else if (SSL_set_tlsext_host_name(l->ssl, d->host) != 1 ||
		   SSL_set1_host(l->ssl, d->host) != 1) {
		return -ENOMEM;
	}
	SSL_set_hostflags(l->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
	SSL_set_connect_state(l->ssl);
	return 0;
}

static void on_connected(void *arg, int err, int fd, const uint8_t *early, size_t early_len)
{
	struct dns_doh *d = arg;
	struct link *l = &d->l;

	l->oc = NULL;
	if (err != 0) {
		link_lost(d, err);
		return;
	}
	l->fd = fd;
	/* The server speaks only after our ClientHello: bytes before it are no TLS of ours. */
	if (early_len) {
		link_lost(d, -EPROTO);
		return;
	}
	if ((err = tls_new(d)) != 0) {
		ERR_clear_error();
		link_lost(d, err);
		return;
	}
	if (!(l->rev = event_new(d->base, fd, EV_READ | EV_PERSIST, on_io, d)) ||
	    !(l->wev = event_new(d->base, fd, EV_WRITE | EV_PERSIST, on_io, d)) ||
	    event_add(l->rev, NULL) != 0) {
		link_lost(d, -ENOMEM);
		return;
	}
	l->state = LINK_TLS;
	tls_step(d);
}

static void link_open(struct dns_doh *d)
{
	struct link *l = &d->l;
	int err;

	l->state = LINK_CONNECTING;
	l->rx = 0;
	err = outbound_connect(d->base, &d->ob, &d->key, d->timeout_ms, on_connected, d, &l->oc);
	if (err == 0) {
		d->st.connects++;
		return;
	}
	l->state = LINK_FAILED;
	l->err = err;
	event_active(d->kick, EV_TIMEOUT, 1);
}

/* ---- asks on the connection ---- */

/* How many tries the connection takes. A server allowing 0 streams still gets one: nghttp2
 * holds its HEADERS until the server allows it, and its timer bounds the wait (asks in the
 * queue have none). */
static size_t room(struct dns_doh *d)
{
	uint32_t m = DNS_DOH_MAX_STREAMS, r;

	if (d->l.state == LINK_UP) {
		r = nghttp2_session_get_remote_settings(d->l.h2,
							NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
		m = r < m ? r : m;
	}
	return m ? m : 1;
}

static void assign(struct dns_doh *d, struct dns_doh_q *q)
{
	int64_t left_ms = (q->deadline_ns - ts_now_ns() + 999999) / 1000000;
	struct timeval tv = ms_tv(left_ms < 1 ? 1 : left_ms < d->timeout_ms ? (uint32_t)left_ms
								       : d->timeout_ms);

	assert(q->tries_left > 0);
	q->tries_left--;
	d->st.tries++;
	q->stream_id = -1;
	q->rx_mark = d->l.rx;
	q->full_try = left_ms >= d->timeout_ms;
	list_push(&d->l.sent, q, false);
	/* A try its timeout cannot bound would wait for good on a silent connection: it fails
	 * from the loop, as one that could not start. */
	if (evtimer_add(q->timer, &tv) != 0) {
		q->start_err = -ENOMEM;
		event_active(q->timer, EV_TIMEOUT, 1);
	}
}

#define NV(n, v, vl) { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE }

/* q's try as a POST on a new stream. false: no stream can be opened on this connection. */
static bool submit(struct dns_doh *d, struct dns_doh_q *q)
{
	char clen[8];
	int cl = snprintf(clen, sizeof(clen), "%zu", q->req_len);
	const nghttp2_nv hdrs[] = {
		NV(":method", "POST", 4),
		NV(":scheme", "https", 5),
		NV(":authority", d->authority, strlen(d->authority)),
		NV(":path", d->path, strlen(d->path)),
		NV("content-type", MEDIA_TYPE, sizeof(MEDIA_TYPE) - 1),
		NV("accept", MEDIA_TYPE, sizeof(MEDIA_TYPE) - 1),
		NV("content-length", clen, (size_t)cl),
	};
	nghttp2_data_provider body = { .source.ptr = NULL, .read_callback = h2_body };
	int32_t sid;

	q->req_off = 0;
	sid = nghttp2_submit_request(d->l.h2, NULL, hdrs, sizeof(hdrs) / sizeof(hdrs[0]), &body,
				     NULL);
	if (sid < 0)
		return false;
	q->stream_id = sid;
	return true;
}

/* Streams for the tries assigned to the connection that have none yet. */
static void submit_pending(struct dns_doh *d)
{
	struct dns_doh_q *q, *next;
	bool any = false;

	for (q = d->l.sent.head; q; q = next) {
		next = q->next;
		if (q->stream_id > 0)
			continue;
		if (d->l.goaway || !submit(d, q)) {
			/* Stream ids used up: finish on this connection, the rest on the next. */
			d->l.goaway = true;
			try_refund(q);
			continue;
		}
		any = true;
	}
	if (any)
		kick_write(d);
}

/* Waiting asks onto the connection (opened if needed) while it has room; the idle timer runs
 * only while the connection is up with nothing in flight or waiting. */
static void pump(struct dns_doh *d)
{
	struct link *l = &d->l;
	struct timeval tv = ms_tv(d->idle_ms);

	if (d->dying)
		return;
	if (l->goaway && l->sent.n == 0)
		link_close(d);
	if (d->wait.head && l->state == LINK_CLOSED)
		link_open(d);
	while (!l->goaway && d->wait.head && l->sent.n < room(d))
		assign(d, d->wait.head);
	if (l->state == LINK_UP)
		submit_pending(d);
	if (l->goaway && l->sent.n == 0 && d->wait.head) {
		pump(d);  /* no stream could be opened: the next connection takes them */
		return;
	}
	if (l->state != LINK_UP || l->sent.n || d->wait.head)
		evtimer_del(d->idle);
	else if (!evtimer_pending(d->idle, NULL) && evtimer_add(d->idle, &tv) != 0)
		link_close(d);  /* idle, and no timer to close it later: now */
}

static void on_idle(evutil_socket_t fd, short what, void *arg)
{
	struct dns_doh *d = arg;

	if (d->l.sent.n == 0 && !d->wait.head)
		link_close(d);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct dns_doh_q *q = arg;
	struct dns_doh *d = q->d;
	/* Nothing at all came back for a whole timeout since this try was assigned: the
	 * connection is dead. A try cut short by its ask's deadline proves nothing; voiding the
	 * connection on it would make asks spread over time on a silent server open one
	 * connection per deadline. */
	bool dead = q->full_try && d->l.rx == q->rx_mark && d->l.state != LINK_CLOSED;

	stream_detach(d, q);
	if (q->start_err) {
		d->st.errors++;
		try_end(q, q->start_err);
		settle(d);
		return;
	}
	d->st.timeouts++;
	try_end(q, -ETIMEDOUT);
	if (dead)
		link_void(d);
	settle(d);
}

/* ---- the API ---- */

/* Every certificate of the PEM file path into ctx's trust store: at least one. */
static int load_ca(SSL_CTX *ctx, const char *path)
{
	X509_STORE *store = SSL_CTX_get_cert_store(ctx);
	FILE *f = fopen(path, "re");
	X509 *x;
	int n = 0, ret = 0;

	if (!f)
		return -errno;
	while ((x = PEM_read_X509(f, NULL, NULL, NULL))) {
		if (X509_STORE_add_cert(store, x) != 1)
			ret = -EINVAL;
		X509_free(x);
		n++;
	}
	fclose(f);
	ERR_clear_error();  /* the end of the file is reported as an error */
	return ret ? ret : n ? 0 : -EINVAL;
}

static int tls_ctx_new(struct dns_doh *d)
{
	static const unsigned char alpn[] = { 2, 'h', '2' };
	uint64_t refusals = libmem_refusals();
	int ret = -ENOMEM;

	if (!(d->ctx = SSL_CTX_new(TLS_client_method())))
		goto out;
	ret = -EINVAL;
	/* RFC 8484 section 5: HTTP/2 over TLS; RFC 9113 section 9.2: TLS 1.2 at least. */
	if (SSL_CTX_set_min_proto_version(d->ctx, TLS1_2_VERSION) != 1 ||
	    SSL_CTX_set_alpn_protos(d->ctx, alpn, sizeof(alpn)) != 0)
		goto out;
	SSL_CTX_set_verify(d->ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_mode(d->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
			 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
	if (d->ca)
		ret = load_ca(d->ctx, d->ca);
	else
		ret = SSL_CTX_set_default_verify_paths(d->ctx) == 1 ? 0 : -EINVAL;
out:
	/* A refusal is a failure, whatever OpenSSL made of it: a certificate left out of the
	 * store, or kept with a key it had no memory to decode (every handshake would then fail
	 * verification for the context's life), an ALPN list not set. */
	if (ret != -ENOMEM && (libmem_refusals() != refusals ||
			       ERR_GET_REASON(ERR_peek_error()) == ERR_R_MALLOC_FAILURE))
		ret = -ENOMEM;
	ERR_clear_error();
	if (ret != 0) {
		SSL_CTX_free(d->ctx);
		d->ctx = NULL;
	}
	return ret;
}

static bool path_valid(const char *p)
{
	if (p[0] != '/')
		return false;
	for (; *p; p++)
		if (*p <= 0x20 || *p >= 0x7f)
			return false;
	return true;
}

/* Host, path, :authority and the destination from the config. */
static int set_target(struct dns_doh *d, const struct dns_doh_config *c)
{
	const struct netaddr_ep *ep = &c->server;
	uint8_t tmp[16];
	bool v6;
	int n;

	if ((ep->addr.family != 4 && ep->addr.family != 6) || ep->port == 0 ||
	    !memchr(c->host, 0, sizeof(c->host)) || !memchr(c->path, 0, sizeof(c->path)) ||
	    !path_valid(c->path))
		return -EINVAL;
	v6 = inet_pton(AF_INET6, c->host, tmp) == 1;
	d->host_is_ip = v6 || inet_pton(AF_INET, c->host, tmp) == 1;
	if (!d->host_is_ip && !outbound_name_valid(c->host))
		return -EINVAL;
	strcpy(d->host, c->host);
	strcpy(d->path, c->path);
	n = snprintf(d->authority, sizeof(d->authority), v6 ? "[%s]" : "%s", c->host);
	if (ep->port != 443)
		snprintf(d->authority + n, sizeof(d->authority) - (size_t)n, ":%u", ep->port);
	memset(&d->key, 0, sizeof(d->key));
	d->key.family = ep->addr.family;
	d->key.proto = IPPROTO_TCP;
	d->key.dport_be = htons(ep->port);
	memcpy(d->key.dst, ep->addr.a, 16);
	return 0;
}

int dns_doh_new(struct event_base *base, const struct dns_doh_config *cfg, struct dns_doh **out)
{
	struct dns_doh *d;
	int ret;

	if (!base || !cfg || !out)
		return -EINVAL;
	if ((ret = tlslib_load(TLSLIB_TLS, NULL, 0)) != 0)
		return ret;
	if (!(d = calloc(1, sizeof(*d))))
		return -ENOMEM;
	d->base = base;
	d->l.fd = -1;
	if (cfg->detour)
		d->ob = *cfg->detour;
	else
		d->ob.type = TS_OUT_DIRECT;  /* zeroed: no mark, interface, hook or guard */
	d->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : DNS_DOH_TIMEOUT_MS;
	d->tries = cfg->tries ? cfg->tries : DNS_DOH_TRIES;
	d->idle_ms = cfg->idle_ms ? cfg->idle_ms : DNS_DOH_IDLE_MS;
	if ((ret = set_target(d, cfg)) != 0)
		goto fail;
	ret = -ENOMEM;
	if ((cfg->ca && !(d->ca = strdup(cfg->ca))) || (ret = tls_ctx_new(d)) != 0)
		goto fail;
	ret = -ENOMEM;
	if (!(d->idle = evtimer_new(base, on_idle, d)) ||
	    !(d->kick = event_new(base, -1, 0, on_kick, d)))
		goto fail;
	*out = d;
	return 0;
fail:
	destroy(d);
	return ret;
}

static void drop_all(struct dq_list *l)
{
	while (l->head)
		q_release(l->head);
}

void dns_doh_free(struct dns_doh *d)
{
	if (!d)
		return;
	drop_all(&d->wait);
	drop_all(&d->l.sent);
	drop_all(&d->done);
	if (d->busy) {
		/* Inside a callback: the answer it got is still borrowed until it returns. */
		d->dying = true;
		return;
	}
	destroy(d);
}

int dns_doh_ask(struct dns_doh *d, const struct dns_question *q, dns_upstream_cb cb, void *arg,
		struct dns_doh_q **h)
{
	struct dns_doh_q *x;
	int len;

	if (!d || !q || !cb || !h || d->dying || !q->nameable)
		return -EINVAL;
	if (d->asks >= DNS_DOH_MAX_ASKS)
		return -ENOBUFS;
	if (!(x = calloc(1, sizeof(*x))))
		return -ENOMEM;
	/* RFC 8484 section 4.1: id 0. */
	if ((len = dns_build_query(x->req, sizeof(x->req), 0, q)) < 0) {
		free(x);
		return -EINVAL;
	}
	if (!(x->timer = evtimer_new(d->base, on_timer, x))) {
		free(x);
		return -ENOMEM;
	}
	x->req_len = (size_t)len;
	x->d = d;
	x->q = *q;
	x->cb = cb;
	x->arg = arg;
	x->stream_id = -1;
	x->tries_left = d->tries;
	x->deadline_ns = ts_now_ns() + (int64_t)d->tries * d->timeout_ms * 1000000;
	d->asks++;
	d->st.queries++;
	list_push(&d->wait, x, false);
	pump(d);
	*h = x;
	return 0;
}

int dns_doh_set_detour(struct dns_doh *d, const struct ts_outbound *detour)
{
	struct link *l = &d->l;

	if (outbound_same(&d->ob, detour))
		return 0;
	d->ob = *detour;
	d->ob.resolver = NULL; /* a server is an address: never resolved (and the proxy's
				* resolver goes before the DNS server) */
	if (l->state == LINK_CLOSED)
		return 1;
	/* The open connection went through the old one: its tries are asked again on a new one
	 * through the new one, first in line, given back (never a callback here: a try past its
	 * deadline gets its last moment on the new connection, as assign bounds it). */
	link_close(d);
	while (l->sent.tail) {
		struct dns_doh_q *q = l->sent.tail;

		q->stream_id = -1;
		evtimer_del(q->timer);
		response_reset(q);
		q->tries_left++;
		list_push(&d->wait, q, true);
	}
	pump(d);
	return 1;
}

void dns_doh_cancel(struct dns_doh *d, struct dns_doh_q *h)
{
	if (!d || !h)
		return;
	q_release(h);
	pump(d);
}

void dns_doh_get_stats(const struct dns_doh *d, struct dns_doh_stats *out)
{
	*out = d->st;
	out->inflight = d->asks;
}
