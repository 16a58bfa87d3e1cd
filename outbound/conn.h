/* conn.h — the connection attempt shared by the outbound connectors (internal to outbound/).
 *
 * Life of an attempt: outbound_connect() allocates one struct outbound_conn and hands it to the
 * type's start function. Every result — success, error, timeout, and results known at once such
 * as reject or an immediate connect() failure — reaches done() from a libevent callback, never
 * from inside outbound_connect() (conn_defer). conn_finish() runs done() once and frees the
 * attempt; outbound_conn_cancel() frees it without running done(). Single-threaded: everything
 * here runs on the thread that runs the caller's event base.
 */
#ifndef TS_OUTBOUND_CONN_H
#define TS_OUTBOUND_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "outbound/outbound.h"

struct event;
struct socks5_conn;
struct http_conn;
struct direct_conn;
struct server_link;

struct outbound_conn {
	struct event_base *base;
	outbound_done_fn done;
	void *arg;
	int fd;                  /* -1 when none; owned until handed to done */
	struct event *io;        /* readiness of fd; direct: also carries the timeout */
	struct event *timer;     /* the deadline (proxies, direct by name); a deferred result */
	bool deferred;           /* timer is active for deferred_err, not for a deadline */
	int deferred_err;
	struct socks5_conn *s5;  /* socks5 handshake state, NULL for other types */
	struct http_conn *http;  /* http handshake state, NULL for other types */
	struct direct_conn *direct; /* direct by name: lookup and connects, else NULL */
	struct server_link *link; /* socks5/http: the connection to the server (in s5/http) */
};

/* A zeroed attempt with fd -1 and its timer event; NULL when out of memory. */
struct outbound_conn *conn_new(struct event_base *base, outbound_done_fn done, void *arg);
/* Free everything: events, fd (closed unless already handed over), socks5/http/direct state. */
void conn_free(struct outbound_conn *c);

/* Report err (0 included) from the loop as soon as it runs: stops io and the deadline. 0 or
 * -errno if the timer could not be activated. */
int conn_defer(struct outbound_conn *c, int err) __attribute__((warn_unused_result));

/* Called from a libevent callback of c: hand the fd over (err == 0) or close it, run done once,
 * free c. early/early_len may point into c's memory: they stay valid during done. */
void conn_finish(struct outbound_conn *c, int err, const uint8_t *early, size_t early_len);

/* Open c->fd with outbound_socket and start a non-blocking connect() to sa. Returns -errno when
 * no socket could be made (nothing started), else 0 with *connect_err = 0 (in progress or
 * connected: wait for EV_WRITE) or the -errno connect() failed with at once (conn_defer it). */
int conn_connect(struct outbound_conn *c, const struct ts_outbound *ob, const struct sockaddr *sa,
		 socklen_t salen, int *connect_err) __attribute__((warn_unused_result));

/* The same for a socket of the caller's own: 0 and *fd_out (the caller closes it), or -errno
 * when no socket could be made. */
int conn_open(const struct ts_outbound *ob, const struct sockaddr *sa, socklen_t salen,
	      int *fd_out, int *connect_err) __attribute__((warn_unused_result));

/* The pending error of a socket (getsockopt SO_ERROR) as -errno, 0 if none. */
int conn_sock_error(int fd);

/* A timeout in milliseconds as a struct timeval (for event_add). */
static inline struct timeval conn_timeval(uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

#endif
