/* upstream.c — one upstream DNS server asked over UDP, TCP or TLS (upstream.h).
 *
 * An ask (struct dns_uq) is always in exactly one list of its upstream: udp (a UDP try in
 * progress), wait (queued for the TCP connection), the link's sent (in flight on it) or done
 * (finished, its callback about to run). Each ask owns a timer (the try's timeout, or a UDP
 * try's start error reported from the loop) and, during a UDP try, its socket and read event.
 *
 * The TCP connection (struct link, embedded in the upstream) is CLOSED, CONNECTING, HANDSHAKE
 * (tls: connected, the TLS handshake under way), UP, or FAILED (the connect could not start:
 * the error is reported from the loop by the kick event, like any connection loss). Queries are
 * assigned to it as soon as it exists, their frames queued in wbuf until it can take them.
 *
 * tls: OpenSSL on the connected socket through a small BIO of our own (send with MSG_NOSIGNAL:
 * a server gone away is an error, never a SIGPIPE). One callback serves both the read and the
 * write event: it drives the handshake, writes wbuf, reads what it can, and keeps the write
 * event armed while there are frames to write or OpenSSL asked to write (WANT_WRITE); the read
 * event is always armed, so a WANT_READ is served when bytes come.
 *
 * Callbacks run only from libevent callbacks, through deliver(), which frees the ask first. A
 * callback may free the upstream: dns_upstream_free then only drops the asks and marks it
 * dying, and deliver() finishes the job when the callback returns and tells its caller to stop
 * touching anything (false).
 */
#include "dns/upstream.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/clock.h"
#include "core/flow.h"
#include "core/libmem.h"
#include "core/tlslib.h"
#include "outbound/outbound.h"

#define QUERY_MAX (DNS_HDR_LEN + DNS_WIRE_NAME_MAX + 4 + DNS_OPT_LEN)
#define FRAME_MAX (2 + QUERY_MAX)
#define RBUF_LEN (2 + 65535)          /* one frame of the largest message */
#define WBUF_LEN (DNS_UP_TCP_INFLIGHT * FRAME_MAX)
/* We advertise DNS_EDNS_SIZE; a datagram longer than this buffer is out of spec (counted bad). */
#define UDP_BUF_LEN 4096
#define UDP_READS_PER_EVENT 16        /* a flood of bad datagrams cannot hold the loop */

struct dns_uq;

struct uq_list {
	struct dns_uq *head, *tail;
	size_t n;
};

struct dns_uq {
	struct dns_upstream *u;
	struct dns_uq *prev, *next;
	struct uq_list *list;          /* the list it is in */
	struct dns_question q;
	dns_upstream_cb cb;
	void *arg;
	struct event *timer;           /* the try's timeout; a UDP start error from the loop */
	struct event *rev;             /* udp: the try's socket readable */
	int fd;                        /* udp: the try's socket, -1 between tries */
	uint16_t id;                   /* the current try's */
	uint32_t tries_left;
	bool tcp;                      /* asked over TCP (kind tcp, or a truncated UDP answer) */
	bool bad_seen;                 /* an answer failed the check */
	int start_err;                 /* udp: the try could not start (reported by timer) */
	int transport_err;             /* the last transport error of a try, 0 none */
	int final_err;                 /* in done: what the callback gets */
	uint64_t rx_mark;              /* tcp: link rx when the query was assigned */
	bool full_try;                 /* tcp: its timer is a whole timeout, not cut by the deadline */
	int64_t deadline_ns;           /* tcp: no try after this (asked + tries x timeout) */
};

enum link_state { LINK_CLOSED, LINK_CONNECTING, LINK_HANDSHAKE, LINK_UP, LINK_FAILED };

struct link {
	enum link_state state;
	int err;                       /* FAILED, or UP and unable to wait to write: why */
	int fd;                        /* UP: the connection, else -1 */
	struct outbound_conn *oc;      /* CONNECTING: the attempt */
	struct event *rev, *wev;       /* HANDSHAKE, UP */
	SSL *ssl;                      /* tls: HANDSHAKE, UP */
	uint8_t *rbuf;                 /* RBUF_LEN bytes while not CLOSED */
	size_t rlen;
	uint8_t wbuf[WBUF_LEN];        /* frames not written yet */
	size_t wlen;
	uint64_t rx;                   /* answers received on this connection */
	uint64_t refusals;             /* tls: libmem_refusals() when this event's work began */
	struct uq_list sent;
};

struct dns_upstream {
	struct event_base *base;
	enum dns_up_kind kind;
	struct ts_outbound ob;
	struct sockaddr_storage sa;
	socklen_t salen;
	struct flow_key key;           /* the TCP destination for outbound_connect */
	uint32_t timeout_ms, tries, idle_ms;
	struct uq_list udp, wait, done;
	size_t asks;
	unsigned busy;                 /* a callback is running */
	bool dying;                    /* freed from a callback: destroy when it returns */
	struct event *idle;            /* closes the idle connection */
	struct event *kick;            /* reports a FAILED link from the loop */
	struct link l;
	SSL_CTX *tls;                  /* tls: certificates checked against ca or the system's */
	bool tls_stale;                /* tls: made again before the next connection */
	BIO_METHOD *bio;               /* tls: our socket BIO */
	char *ca;                      /* tls: the trust anchors' file, NULL: the system's */
	char sni[254];
	struct dns_upstream_stats st;
	uint8_t ubuf[UDP_BUF_LEN];
};

static void tcp_pump(struct dns_upstream *u);

/* ---- lists ---- */

static void list_unlink(struct dns_uq *q)
{
	struct uq_list *l = q->list;

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

static void list_push(struct uq_list *l, struct dns_uq *q, bool head)
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

static int rand_id(uint16_t *id)
{
	if (getrandom(id, sizeof(*id), 0) != (ssize_t)sizeof(*id))
		return errno ? -errno : -EIO;
	return 0;
}

static void udp_close(struct dns_uq *q)
{
	if (q->rev) {
		event_free(q->rev);
		q->rev = NULL;
	}
	if (q->fd >= 0) {
		close(q->fd);
		q->fd = -1;
	}
}

static void uq_release(struct dns_uq *q)
{
	list_unlink(q);
	udp_close(q);
	event_free(q->timer);
	q->u->asks--;
	free(q);
}

static void link_close(struct dns_upstream *u);

static void destroy(struct dns_upstream *u)
{
	link_close(u);
	if (u->idle)
		event_free(u->idle);
	if (u->kick)
		event_free(u->kick);
	/* Set only once OpenSSL is open (tls_setup); other kinds never open it. */
	if (u->tls)
		SSL_CTX_free(u->tls);
	if (u->bio)
		BIO_meth_free(u->bio);
	free(u->ca);
	free(u);
}

/* Run q's callback (q freed first). false: the upstream was freed by it, touch nothing. */
static bool deliver(struct dns_uq *q, int err, const uint8_t *m, size_t len,
		    const struct dns_answer *a)
{
	struct dns_upstream *u = q->u;
	dns_upstream_cb cb = q->cb;
	void *arg = q->arg;

	uq_release(q);
	u->busy++;
	cb(arg, err, m, len, a);
	u->busy--;
	if (!u->dying)
		return true;
	if (u->busy == 0)
		destroy(u);
	return false;
}

/* Deliver every finished ask, then let waiting ones onto the connection. */
static bool settle(struct dns_upstream *u)
{
	while (u->done.head)
		if (!deliver(u->done.head, u->done.head->final_err, NULL, 0, NULL))
			return false;
	tcp_pump(u);
	return true;
}

static void udp_try(struct dns_uq *q);

/* A try of q ended without an answer (err: -ETIMEDOUT or a transport error): the next try
 * (UDP: started; TCP: queued first in line), or q goes to done. The caller settles. */
static void try_end(struct dns_uq *q, int err)
{
	struct dns_upstream *u = q->u;

	evtimer_del(q->timer);
	q->start_err = 0;
	if (err == -ETIMEDOUT) {
		u->st.timeouts++;
	} else {
		u->st.errors++;
		q->transport_err = err;
	}
	if (!q->tcp)
		udp_close(q);
	if (q->tcp && ts_now_ns() >= q->deadline_ns)
		q->tries_left = 0; /* its time is up, whatever tries a voided connection gave back */
	if (q->tries_left > 0) {
		if (q->tcp)
			list_push(&u->wait, q, true);
		else
			udp_try(q);
		return;
	}
	q->final_err = q->transport_err ? q->transport_err : q->bad_seen ? -EPROTO : -ETIMEDOUT;
	list_push(&u->done, q, false);
}

/* ---- udp ---- */

static void on_udp_read(evutil_socket_t fd, short what, void *arg)
{
	struct dns_uq *q = arg;
	struct dns_upstream *u = q->u;
	struct dns_answer a;

	for (int i = 0; i < UDP_READS_PER_EVENT; i++) {
		ssize_t n = recv(fd, u->ubuf, sizeof(u->ubuf), MSG_TRUNC);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n < 0) {
			try_end(q, -errno);
			settle(u);
			return;
		}
		if ((size_t)n > sizeof(u->ubuf) ||
		    dns_parse_answer(u->ubuf, (size_t)n, q->id, &q->q, &a) != 0) {
			u->st.bad_answers++;
			q->bad_seen = true;
			continue;
		}
		if (a.flags & DNS_F_TC) {
			/* RFC 7766 section 5: the whole answer by TCP, the same server. */
			u->st.truncated_retried_tcp++;
			evtimer_del(q->timer);
			udp_close(q);
			q->tcp = true;
			if (q->tries_left == 0)
				q->tries_left = 1;
			q->deadline_ns = ts_now_ns() + (int64_t)q->tries_left * u->timeout_ms * 1000000;
			list_push(&u->wait, q, false);
			tcp_pump(u);
			return;
		}
		deliver(q, 0, u->ubuf, (size_t)n, &a);
		return;
	}
}

/* A fresh connected socket (a new random source port) and the query with a new id. */
static int udp_open(struct dns_uq *q)
{
	struct dns_upstream *u = q->u;
	uint8_t msg[QUERY_MAX];
	int ret, len;

	if ((ret = rand_id(&q->id)) != 0)
		return ret;
	if ((len = dns_build_query(msg, sizeof(msg), q->id, &q->q)) < 0)
		return len;
	if ((ret = outbound_socket(&u->ob, u->key.family, SOCK_DGRAM, &q->fd)) != 0) {
		q->fd = -1;
		return ret;
	}
	if (connect(q->fd, (const struct sockaddr *)&u->sa, u->salen) != 0 ||
	    send(q->fd, msg, (size_t)len, MSG_NOSIGNAL) != len)
		return errno ? -errno : -EIO;
	if (!(q->rev = event_new(u->base, q->fd, EV_READ | EV_PERSIST, on_udp_read, q)) ||
	    event_add(q->rev, NULL) != 0)
		return -ENOMEM;
	return 0;
}

static void udp_try(struct dns_uq *q)
{
	struct dns_upstream *u = q->u;
	struct timeval tv = ms_tv(u->timeout_ms);
	int err;

	assert(q->tries_left > 0);
	q->tries_left--;
	u->st.tries++;
	list_push(&u->udp, q, false);
	/* A try its timeout cannot bound (no memory for the timer) would wait for good if the
	 * server stays silent: it fails as one that could not start. */
	if ((err = udp_open(q)) == 0 && evtimer_add(q->timer, &tv) != 0)
		err = -ENOMEM;
	if (err != 0) {
		udp_close(q);
		/* Reported from the loop: never a callback inside dns_upstream_ask. */
		q->start_err = err;
		event_active(q->timer, EV_TIMEOUT, 1);
	}
}

/* ---- tcp: the connection ---- */

static void link_close(struct dns_upstream *u)
{
	struct link *l = &u->l;

	if (l->oc)
		outbound_conn_cancel(l->oc);
	if (l->rev)
		event_free(l->rev);
	if (l->wev)
		event_free(l->wev);
	if (l->ssl) {
		if (l->state == LINK_UP)
			SSL_shutdown(l->ssl);  /* close_notify, best effort: nothing waits for it */
		SSL_free(l->ssl);
		ERR_clear_error();
	}
	if (l->fd >= 0)
		close(l->fd);
	free(l->rbuf);
	l->oc = NULL;
	l->rev = l->wev = NULL;
	l->ssl = NULL;
	l->fd = -1;
	l->rbuf = NULL;
	l->rlen = l->wlen = 0;
	l->state = LINK_CLOSED;
	if (u->idle)
		evtimer_del(u->idle);
	if (u->kick)
		event_del(u->kick);
}

/* The connection is gone (err): each query it had not answered has its try ended by err. */
static void link_lost(struct dns_upstream *u, int err)
{
	struct link *l = &u->l;

	link_close(u);
	/* From the tail, each pushed first in line: the queue keeps their order. */
	while (l->sent.tail)
		try_end(l->sent.tail, err);
	settle(u);
}

/* The connection is taken as dead: its queries go again on a new one, their tries kept, but
 * none past its deadline: one query's timeout voids the connection, and without the deadline
 * N queries in flight on a silent server would each take up to N x tries timeouts. */
static void link_void(struct dns_upstream *u)
{
	struct link *l = &u->l;

	link_close(u);
	while (l->sent.tail) {
		struct dns_uq *q = l->sent.tail;

		if (ts_now_ns() >= q->deadline_ns) {
			try_end(q, -ETIMEDOUT); /* done: its time is up */
			continue;
		}
		evtimer_del(q->timer);
		q->tries_left++;
		list_push(&u->wait, q, true);
	}
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct dns_upstream *u = arg;

	link_lost(u, u->l.err);
}

/* One framed answer m (len bytes): to the query in flight with its id, if any. false: the
 * upstream was freed by a callback. */
static bool link_answer(struct dns_upstream *u, const uint8_t *m, size_t len)
{
	uint16_t id = (uint16_t)(m[0] << 8 | m[1]);
	struct dns_answer a;
	struct dns_uq *q;

	for (q = u->l.sent.head; q && q->id != id; q = q->next)
		;
	if (!q) {
		u->st.late_answers++;
		return true;
	}
	if (dns_parse_answer(m, len, id, &q->q, &a) != 0) {
		u->st.bad_answers++;
		q->bad_seen = true;
		return true;
	}
	return deliver(q, 0, m, len, &a);
}

/* Every complete frame in rbuf. false: the upstream was freed or the connection closed. */
static bool link_process(struct dns_upstream *u)
{
	struct link *l = &u->l;
	size_t off = 0;

	while (l->rlen - off >= 2) {
		size_t mlen = (size_t)l->rbuf[off] << 8 | l->rbuf[off + 1];

		/* Shorter than a header is no DNS message: the stream cannot be trusted on. */
		if (mlen < DNS_HDR_LEN) {
			link_lost(u, -EPROTO);
			return false;
		}
		if (l->rlen - off < 2 + mlen)
			break;
		off += 2 + mlen;
		l->rx++;
		if (!link_answer(u, l->rbuf + off - mlen, mlen))
			return false;
	}
	memmove(l->rbuf, l->rbuf + off, l->rlen - off);
	l->rlen -= off;
	return true;
}

static void on_link_read(evutil_socket_t fd, short what, void *arg)
{
	struct dns_upstream *u = arg;
	struct link *l = &u->l;
	/* rlen < RBUF_LEN: a full buffer always holds a whole frame, and frames are consumed. */
	ssize_t n = recv(fd, l->rbuf + l->rlen, RBUF_LEN - l->rlen, 0);

	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0) {
		if (n == 0 && l->sent.n == 0) {
			link_close(u);  /* the server closed an idle connection (RFC 7766 6.2.3) */
			tcp_pump(u);
			return;
		}
		link_lost(u, n == 0 ? -ECONNRESET : -errno);
		return;
	}
	l->rlen += (size_t)n;
	if (link_process(u))
		tcp_pump(u);
}

static void on_link_write(evutil_socket_t fd, short what, void *arg)
{
	struct dns_upstream *u = arg;
	struct link *l = &u->l;
	ssize_t n = send(fd, l->wbuf, l->wlen, MSG_NOSIGNAL);

	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n < 0) {
		link_lost(u, -errno);
		return;
	}
	memmove(l->wbuf, l->wbuf + n, l->wlen - (size_t)n);
	l->wlen -= (size_t)n;
	if (l->wlen == 0)
		event_del(l->wev);
	tcp_pump(u);
}

/* ---- tls: the layer under the framing ---- */

static int bio_fd(BIO *b)
{
	return (int)(intptr_t)BIO_get_data(b);
}

static int on_bio_write(BIO *b, const char *buf, int len)
{
	ssize_t n = send(bio_fd(b), buf, (size_t)len, MSG_NOSIGNAL);

	BIO_clear_retry_flags(b);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		BIO_set_retry_write(b);
	return (int)n;
}

static int on_bio_read(BIO *b, char *buf, int len)
{
	ssize_t n = recv(bio_fd(b), buf, (size_t)len, 0);

	BIO_clear_retry_flags(b);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		BIO_set_retry_read(b);
	return (int)n;
}

static long on_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	return cmd == BIO_CTRL_FLUSH;  /* nothing buffered here; no other control applies */
}

/* Whether a failed OpenSSL call ran out of memory: an allocation of OpenSSL's was refused
 * since refusals was read (core/libmem.h), or OpenSSL reports one. Its error queue is left as
 * it is. */
static bool tls_nomem(uint64_t refusals)
{
	return libmem_refusals() != refusals ||
	       ERR_GET_REASON(ERR_peek_error()) == ERR_R_MALLOC_FAILURE;
}

/* The upstream's SSL_CTX (peer verified, TLS 1.2 at least, trust anchors from ca or the
 * system's store): 0, -ENOMEM, or -EINVAL (ca is not a PEM file with a certificate). */
static int tls_ctx(struct dns_upstream *u)
{
	uint64_t refusals = libmem_refusals();

	if (!(u->tls = SSL_CTX_new(TLS_client_method())) ||
	    SSL_CTX_set_min_proto_version(u->tls, TLS1_2_VERSION) != 1)
		goto nomem;
	SSL_CTX_set_verify(u->tls, SSL_VERIFY_PEER, NULL);
	/* wbuf moves (memmove) and grows between a WANT_WRITE and the retry. */
	SSL_CTX_set_mode(u->tls, SSL_MODE_ENABLE_PARTIAL_WRITE |
			 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
	/* A close without close_notify is a close: the framing shows a cut answer anyway. */
	SSL_CTX_set_options(u->tls, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
	if (u->ca ? SSL_CTX_load_verify_locations(u->tls, u->ca, NULL) != 1 :
		    SSL_CTX_set_default_verify_paths(u->tls) != 1) {
		if (tls_nomem(refusals))
			goto nomem;
		ERR_clear_error();
		return -EINVAL;
	}
	/* A refusal OpenSSL got over is a failure all the same: it keeps a certificate whose key
	 * it had no memory to decode (as one of a key type it does not know), and every
	 * handshake would then fail verification for the context's life. */
	if (libmem_refusals() != refusals)
		goto nomem;
	return 0;
nomem:
	ERR_clear_error();
	if (u->tls)
		SSL_CTX_free(u->tls);
	u->tls = NULL;
	return -ENOMEM;
}

/* The upstream's SSL_CTX and BIO method. */
static int tls_setup(struct dns_upstream *u, const struct dns_upstream_config *cfg)
{
	size_t n = cfg->sni ? strlen(cfg->sni) : 0;
	int ret;

	if (n == 0 || n >= sizeof(u->sni))
		return -EINVAL;
	if ((ret = tlslib_load(TLSLIB_TLS, NULL, 0)) != 0)
		return ret;
	memcpy(u->sni, cfg->sni, n + 1);
	if (cfg->ca && access(cfg->ca, R_OK) != 0)
		return -errno;
	if ((cfg->ca && !(u->ca = strdup(cfg->ca))) ||
	    !(u->bio = BIO_meth_new(BIO_TYPE_SOURCE_SINK, "twinstack dns")) ||
	    BIO_meth_set_write(u->bio, on_bio_write) != 1 ||
	    BIO_meth_set_read(u->bio, on_bio_read) != 1 ||
	    BIO_meth_set_ctrl(u->bio, on_bio_ctrl) != 1) {
		ERR_clear_error();
		return -ENOMEM;
	}
	return tls_ctx(u);
}

/* The connection's SSL, a client with SNI and the certificate's name to check. */
static int tls_start(struct dns_upstream *u)
{
	struct link *l = &u->l;
	BIO *b;
	int ret;

	/* A handshake OpenSSL had no memory for may have left a certificate of the context's
	 * store marked invalid for good (OpenSSL caches the outcome of a certificate's first
	 * check, a failed allocation included): the next connection gets a fresh context. */
	if (u->tls_stale) {
		SSL_CTX_free(u->tls);
		u->tls = NULL;
		if ((ret = tls_ctx(u)) != 0)
			return ret == -ENOMEM ? ret : -EKEYREJECTED;
		u->tls_stale = false;
	}
	if (!(l->ssl = SSL_new(u->tls)))
		goto nomem;
	if (!(b = BIO_new(u->bio)))
		goto nomem;
	BIO_set_data(b, (void *)(intptr_t)l->fd);
	BIO_set_init(b, 1);
	SSL_set_bio(l->ssl, b, b);
	if (SSL_set_tlsext_host_name(l->ssl, u->sni) != 1 || SSL_set1_host(l->ssl, u->sni) != 1)
		goto nomem;
	SSL_set_connect_state(l->ssl);
	l->state = LINK_HANDSHAKE;
	return 0;
nomem:
	ERR_clear_error();
	return -ENOMEM;
}

/* What a failed SSL call (its return r) means: 0 and *want_write for a WANT_*, else -errno;
 * -ENOMEM when OpenSSL ran out of memory during this event's work (a certificate it had no
 * memory to check, say), which is no fault of the server's. */
static int tls_err(struct link *l, int r, bool *want_write)
{
	int e = SSL_get_error(l->ssl, r);
	bool nomem = tls_nomem(l->refusals);

	ERR_clear_error();
	if (e == SSL_ERROR_WANT_READ)
		return 0;
	if (e == SSL_ERROR_WANT_WRITE) {
		*want_write = true;
		return 0;
	}
	if (nomem)
		return -ENOMEM;
	if (l->state == LINK_HANDSHAKE && SSL_get_verify_result(l->ssl) != X509_V_OK)
		return -EKEYREJECTED;
	return e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN ? -ECONNRESET : -EPROTO;
}

/* Frames from wbuf into TLS records while it takes them. */
static int tls_write(struct link *l, bool *want_write)
{
	while (l->wlen) {
		int n = SSL_write(l->ssl, l->wbuf, (int)l->wlen);

		if (n <= 0)
			return tls_err(l, n, want_write);
		memmove(l->wbuf, l->wbuf + n, l->wlen - (size_t)n);
		l->wlen -= (size_t)n;
	}
	return 0;
}

/* Everything readable, its frames answered. false: the upstream was freed or the connection
 * closed. */
static bool tls_read(struct dns_upstream *u, bool *want_write)
{
	struct link *l = &u->l;
	int n, err;

	for (;;) {
		/* rlen < RBUF_LEN: as in on_link_read. */
		n = SSL_read(l->ssl, l->rbuf + l->rlen, (int)(RBUF_LEN - l->rlen));
		if (n <= 0)
			break;
		l->rlen += (size_t)n;
		if (!link_process(u))
			return false;
	}
	if ((err = tls_err(l, n, want_write)) == 0)
		return true;
	if (l->sent.n == 0) {
		link_close(u);  /* closed by the server while idle (RFC 7858 section 3.4) */
		tcp_pump(u);
		return false;
	}
	link_lost(u, err);
	return false;
}

/* Both events of a tls connection: the handshake, then writes and reads. */
static void on_tls_io(evutil_socket_t fd, short what, void *arg)
{
	struct dns_upstream *u = arg;
	struct link *l = &u->l;
	bool want_write = false;
	int err;

	l->refusals = libmem_refusals();
	if (l->state == LINK_HANDSHAKE) {
		int r = SSL_do_handshake(l->ssl);

		if (r == 1) {
			l->state = LINK_UP;
		} else if ((err = tls_err(l, r, &want_write)) != 0) {
			if (err == -ENOMEM)
				u->tls_stale = true;
			else
				u->st.tls_failures++;
			link_lost(u, err);
			return;
		} else if (want_write && event_add(l->wev, NULL) != 0) {
			link_lost(u, -ENOMEM);  /* the handshake could not go on */
			return;
		} else {
			if (!want_write)
				event_del(l->wev);
			return;
		}
	}
	if ((err = tls_write(l, &want_write)) != 0) {
		link_lost(u, err);
		return;
	}
	if (!tls_read(u, &want_write))
		return;
	if (!want_write && !l->wlen) {
		event_del(l->wev);
	} else if (event_add(l->wev, NULL) != 0) {
		link_lost(u, -ENOMEM);  /* what waits to be written never would be */
		return;
	}
	tcp_pump(u);
}

static void on_connected(void *arg, int err, int fd, const uint8_t *early, size_t early_len)
{
	struct dns_upstream *u = arg;
	struct link *l = &u->l;
	bool tls = u->kind == DNS_UP_TLS;

	l->oc = NULL;
	if (err != 0) {
		link_lost(u, err);
		return;
	}
	l->fd = fd;
	l->state = tls ? LINK_HANDSHAKE : LINK_UP;
	if (!(l->rev = event_new(u->base, fd, EV_READ | EV_PERSIST, tls ? on_tls_io : on_link_read,
				 u)) ||
	    !(l->wev = event_new(u->base, fd, EV_WRITE | EV_PERSIST,
				 tls ? on_tls_io : on_link_write, u)) ||
	    event_add(l->rev, NULL) != 0) {
		link_lost(u, -ENOMEM);
		return;
	}
	if (tls) {
		/* Nothing the server sends can come before our ClientHello. */
		if (early_len) {
			u->st.tls_failures++;
			link_lost(u, -EPROTO);
		} else if ((err = tls_start(u)) != 0) {
			link_lost(u, err);
		} else if (event_add(l->wev, NULL) != 0) {  /* the ClientHello goes when writable */
			link_lost(u, -ENOMEM);
		}
		return;
	}
	/* Bytes a proxy sent past its handshake answer nothing we sent: framed like the rest. */
	if (early_len > RBUF_LEN) {
		link_lost(u, -EPROTO);
		return;
	}
	if (early_len)
		memcpy(l->rbuf, early, early_len);
	l->rlen = early_len;
	if (link_process(u))
		tcp_pump(u);
}

static void link_open(struct dns_upstream *u)
{
	struct link *l = &u->l;
	int err = -ENOMEM;

	l->state = LINK_CONNECTING;
	l->rx = 0;
	if ((l->rbuf = malloc(RBUF_LEN)) &&
	    (err = outbound_connect(u->base, &u->ob, &u->key, u->timeout_ms, on_connected, u,
				    &l->oc)) == 0) {
		u->st.tcp_connects++;
		return;
	}
	l->state = LINK_FAILED;
	l->err = err;
	event_active(u->kick, EV_TIMEOUT, 1);
}

/* ---- tcp: queries on the connection ---- */

/* Put q on the connection: a new id (unique among those in flight), its frame, its timer. */
static void tcp_assign(struct dns_upstream *u, struct dns_uq *q)
{
	struct link *l = &u->l;
	int64_t left_ms = (q->deadline_ns - ts_now_ns() + 999999) / 1000000;
	struct timeval tv = ms_tv(left_ms < 1 ? 1 : left_ms < u->timeout_ms ? (uint32_t)left_ms
								       : u->timeout_ms);
	struct dns_uq *o;
	int len;

	assert(q->tries_left > 0);
	q->tries_left--;
	u->st.tries++;
	list_push(&l->sent, q, false);
	q->rx_mark = l->rx;
	q->full_try = left_ms >= u->timeout_ms;
	/* A try its timeout cannot bound would wait for good on a silent connection: it fails
	 * from the loop, unsent, as one that could not start. */
	if (evtimer_add(q->timer, &tv) != 0) {
		q->start_err = -ENOMEM;
		event_active(q->timer, EV_TIMEOUT, 1);
		return;
	}
	do {
		if (rand_id(&q->id) != 0)
			return;  /* nothing sent: the try times out */
		for (o = l->sent.head; o && (o == q || o->id != q->id); o = o->next)
			;
	} while (o);
	len = dns_build_query(l->wbuf + l->wlen + 2, QUERY_MAX, q->id, &q->q);
	if (len < 0)
		return;  /* cannot happen for a question dns_upstream_ask accepted */
	l->wbuf[l->wlen] = (uint8_t)(len >> 8);
	l->wbuf[l->wlen + 1] = (uint8_t)len;
	l->wlen += 2 + (size_t)len;
}

/* Waiting queries onto the connection (opened if needed) while it has room; the idle timer
 * runs only while nothing is in flight or waiting. */
static void tcp_pump(struct dns_upstream *u)
{
	struct link *l = &u->l;
	struct timeval tv = ms_tv(u->idle_ms);

	if (u->dying)
		return;
	if (u->wait.head && l->state == LINK_CLOSED)
		link_open(u);
	while (u->wait.head && l->sent.n < DNS_UP_TCP_INFLIGHT && l->wlen + FRAME_MAX <= WBUF_LEN)
		tcp_assign(u, u->wait.head);
	/* Frames libevent cannot wait to write would never go: the connection is lost, from the
	 * loop (this may run inside dns_upstream_ask). */
	if (l->state == LINK_UP && l->wlen && event_add(l->wev, NULL) != 0) {
		l->err = -ENOMEM;
		event_active(u->kick, EV_TIMEOUT, 1);
	}
	if (l->state != LINK_UP || l->sent.n || u->wait.head)
		evtimer_del(u->idle);
	else if (!evtimer_pending(u->idle, NULL) && evtimer_add(u->idle, &tv) != 0)
		link_close(u);  /* idle, and no timer to close it later: now */
}

static void on_idle(evutil_socket_t fd, short what, void *arg)
{
	struct dns_upstream *u = arg;

	if (u->l.sent.n == 0 && !u->wait.head)
		link_close(u);
}

/* ---- timers ---- */

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct dns_uq *q = arg;
	struct dns_upstream *u = q->u;
	bool dead;

	if (q->start_err) {
		int err = q->start_err;

		q->start_err = 0;
		try_end(q, err);
	} else if (!q->tcp) {
		try_end(q, -ETIMEDOUT);
	} else {
		/* Nothing at all came back for a whole timeout since this query went out: the
		 * connection is dead. A try cut short by its ask's deadline proves nothing; voiding
		 * the connection on it would make asks spread over time on a silent server open one
		 * connection per deadline. */
		dead = q->full_try && u->l.rx == q->rx_mark && u->l.state != LINK_CLOSED;
		try_end(q, -ETIMEDOUT);
		if (dead)
			link_void(u);
	}
	settle(u);
}

/* ---- the API ---- */

static int set_server(struct dns_upstream *u, const struct netaddr_ep *ep)
{
	struct sockaddr_in *s4 = (struct sockaddr_in *)&u->sa;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&u->sa;

	if ((ep->addr.family != 4 && ep->addr.family != 6) || ep->port == 0)
		return -EINVAL;
	memset(&u->sa, 0, sizeof(u->sa));
	if (ep->addr.family == 4) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(ep->port);
		memcpy(&s4->sin_addr, ep->addr.a, 4);
		u->salen = sizeof(*s4);
	} else {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(ep->port);
		memcpy(&s6->sin6_addr, ep->addr.a, 16);
		u->salen = sizeof(*s6);
	}
	memset(&u->key, 0, sizeof(u->key));
	u->key.family = ep->addr.family;
	u->key.proto = IPPROTO_TCP;
	u->key.dport_be = htons(ep->port);
	memcpy(u->key.dst, ep->addr.a, 16);
	return 0;
}

int dns_upstream_new(struct event_base *base, const struct dns_upstream_config *cfg,
		     struct dns_upstream **out)
{
	struct dns_upstream *u;
	int ret;

	if (!base || !cfg || !out ||
	    (cfg->kind != DNS_UP_UDP && cfg->kind != DNS_UP_TCP && cfg->kind != DNS_UP_TLS))
		return -EINVAL;
	if (cfg->kind == DNS_UP_UDP && cfg->detour && cfg->detour->type != TS_OUT_DIRECT)
		return -EINVAL;
	if (!(u = calloc(1, sizeof(*u))))
		return -ENOMEM;
	u->base = base;
	u->kind = cfg->kind;
	u->l.fd = -1;
	if (cfg->detour)
		u->ob = *cfg->detour;
	else
		u->ob.type = TS_OUT_DIRECT;  /* zeroed: no mark, interface, hook or guard */
	u->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : DNS_UP_TIMEOUT_MS;
	u->tries = cfg->tries ? cfg->tries : DNS_UP_TRIES;
	u->idle_ms = cfg->idle_ms ? cfg->idle_ms : DNS_UP_IDLE_MS;
	if ((ret = set_server(u, &cfg->server)) != 0)
		goto fail;
	if (u->kind == DNS_UP_TLS && (ret = tls_setup(u, cfg)) != 0)
		goto fail;
	ret = -ENOMEM;
	if (!(u->idle = evtimer_new(base, on_idle, u)) ||
	    !(u->kick = event_new(base, -1, 0, on_kick, u)))
		goto fail;
	*out = u;
	return 0;
fail:
	destroy(u);
	return ret;
}

static void drop_all(struct uq_list *l)
{
	while (l->head)
		uq_release(l->head);
}

void dns_upstream_free(struct dns_upstream *u)
{
	if (!u)
		return;
	drop_all(&u->udp);
	drop_all(&u->wait);
	drop_all(&u->l.sent);
	drop_all(&u->done);
	if (u->busy) {
		/* Inside a callback: the answer it got may live in our buffers until it returns. */
		u->dying = true;
		return;
	}
	destroy(u);
}

int dns_upstream_ask(struct dns_upstream *u, const struct dns_question *q, dns_upstream_cb cb,
		     void *arg, struct dns_uq **h)
{
	uint8_t probe[QUERY_MAX];
	struct dns_uq *x;

	if (!u || !q || !cb || !h || u->dying || !q->nameable ||
	    dns_build_query(probe, sizeof(probe), 0, q) < 0)
		return -EINVAL;
	if (u->asks >= DNS_UP_MAX_ASKS)
		return -ENOBUFS;
	if (!(x = calloc(1, sizeof(*x))))
		return -ENOMEM;
	if (!(x->timer = evtimer_new(u->base, on_timer, x))) {
		free(x);
		return -ENOMEM;
	}
	x->u = u;
	x->fd = -1;
	x->q = *q;
	x->cb = cb;
	x->arg = arg;
	x->tries_left = u->tries;
	x->tcp = u->kind != DNS_UP_UDP;
	x->deadline_ns = ts_now_ns() + (int64_t)u->tries * u->timeout_ms * 1000000;
	u->asks++;
	u->st.queries++;
	if (x->tcp) {
		list_push(&u->wait, x, false);
		tcp_pump(u);
	} else {
		udp_try(x);
	}
	*h = x;
	return 0;
}

int dns_upstream_set_detour(struct dns_upstream *u, const struct ts_outbound *detour)
{
	struct link *l = &u->l;

	if (u->kind == DNS_UP_UDP && detour->type != TS_OUT_DIRECT)
		return -EINVAL;
	if (outbound_same(&u->ob, detour))
		return 0;
	u->ob = *detour;
	u->ob.resolver = NULL; /* a server is an address: never resolved (and the proxy's
				* resolver goes before the DNS server) */
	if (l->state == LINK_CLOSED)
		return 1;
	/* The open connection went through the old one: its queries are sent again through the
	 * new one, first in line, their tries given back (never a callback here: a try past its
	 * deadline gets its last moment on the new connection, as tcp_assign bounds it). */
	link_close(u);
	while (l->sent.tail) {
		struct dns_uq *q = l->sent.tail;

		evtimer_del(q->timer);
		q->tries_left++;
		list_push(&u->wait, q, true);
	}
	tcp_pump(u);
	return 1;
}

void dns_upstream_cancel(struct dns_upstream *u, struct dns_uq *h)
{
	if (!u || !h)
		return;
	uq_release(h);
	tcp_pump(u);
}

void dns_upstream_get_stats(const struct dns_upstream *u, struct dns_upstream_stats *out)
{
	*out = u->st;
	out->inflight = u->asks;
}
