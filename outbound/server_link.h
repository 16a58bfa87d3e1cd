/* server_link.h — the connection to a proxy server that both proxy outbounds (SOCKS5, HTTP
 * CONNECT) make before their handshakes: a literal or pinned server address is connected at
 * once; a name not pinned is resolved without blocking (ob->resolver, or a resolver of the
 * attempt's own) and connected with Happy Eyeballs (happy.h). Either way the attempt then has
 * c->fd (connected, or connecting) and c->io, a one-shot EV_WRITE event; link->io_flags says
 * what c->io waits for. The I/O loop is this file's: on readiness it finishes the connect,
 * reads into `in`, calls the protocol's advance step, and re-arms for writing while `out` has
 * bytes left, else for reading. One deadline (conn.c) covers it all.
 */
#ifndef TS_OUTBOUND_SERVER_LINK_H
#define TS_OUTBOUND_SERVER_LINK_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>

#include "core/config.h"

struct outbound_conn;
struct resolver;
struct resolver_query;
struct happy;

struct server_link {
	bool connected;                /* the TCP connect to the server finished */
	short io_flags;                /* what c->io currently waits for; 0 = not armed */
	/* The protocol's step: send what is pending (server_link_flush) and consume what arrived;
	 * 1 when the handshake is complete (*early: where in `in` the stream's own bytes start),
	 * 0 to wait for the socket, -errno to fail the attempt. */
	int (*advance)(struct outbound_conn *c, size_t *early);
	/* A server given by name, not pinned: */
	struct ts_outbound *ob;        /* a copy (happy connects with it after the lookup) */
	struct resolver *own_res;      /* without ob->resolver: this attempt's own */
	struct resolver_query *rq;     /* the lookup in progress */
	struct happy *he;              /* the connect attempts in progress */
	/* The handshake's buffers (in the protocol state): out[out_off..out_len) still to send,
	 * in[0..in_len) received and not yet consumed, in_cap its size. */
	uint8_t *out;
	size_t out_off, out_len;
	uint8_t *in;
	size_t in_len, in_cap;
};

/* Start connecting c (its timer set to timeout_ms) to ob's server for the handshake whose step
 * is advance; l lives in the attempt's protocol state and c->link points to it. 0, or -errno
 * (then nothing was started; a connect that failed at once is a deferred result, conn_defer).
 * A complete handshake finishes c with the bytes after it as early bytes. */
int server_link_start(struct outbound_conn *c, struct server_link *l,
		      const struct ts_outbound *ob,
		      int (*advance)(struct outbound_conn *c, size_t *early), uint32_t timeout_ms)
	__attribute__((warn_unused_result));

/* The handshake's I/O on c->link: wait for flags on the fd (c->io re-assigned, only legal
 * while it is not pending); send what is pending (0, maybe partially: EV_WRITE resumes, or
 * -errno); one recv into the free part of in (0 or -errno; the server closing before the
 * handshake ends, or a full buffer, is the server breaking the protocol: -EPROTO). */
int server_link_arm(struct outbound_conn *c, short flags);
int server_link_flush(struct outbound_conn *c);
int server_link_fill(struct outbound_conn *c);

/* Cancel what is in progress and free what l holds (not l itself). */
void server_link_fini(struct server_link *l);

#endif
