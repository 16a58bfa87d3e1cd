/* dns_tcp.h — hijacked DNS over TCP: a TCP/53 session from the TUN answered by the proxy's own
 * resolver instead of being connected out.
 *
 * Framing (RFC 1035 4.2.2, RFC 7766 6.2.1): every message is preceded by its length, two bytes
 * in network order. A client may pipeline queries (send the next before the previous answer)
 * and the answers go back in whatever order the resolver finishes them (RFC 7766 6.2.1.1: the
 * client matches them by id). The framer is sans-IO: bytes in, whole messages out.
 *
 * One connection (struct dns_tcp) reads queries from the app's side of the session (a stream:
 * a kernel socket for the system stack, an lwIP pcb for the lwIP stack), hands each to the
 * resolver and writes each reply framed:
 *   - a length below a DNS header (12 bytes) or above DNS_TCP_QUERY_MAX: the connection is
 *     reset (closed_bad_length);
 *   - at most DNS_TCP_MAX_INFLIGHT queries wait for the resolver; at the bound, and while
 *     DNS_TCP_OUT_MAX or more reply bytes wait to be written, nothing more is read (the app's
 *     TCP window pushes back). A reply to a query already in flight is always queued, so the
 *     output holds at most DNS_TCP_OUT_MAX bytes plus what the queries then in flight answer
 *     (one reply when the client does not pipeline);
 *   - the app's FIN: the replies still due are written, then our FIN (a graceful close);
 *   - no query in flight, nothing to write and nothing read for idle_ms since the last reply
 *     (or query): closed gracefully (closed_idle; RFC 7766 6.2.3: the server closes idle
 *     connections);
 *   - replies waiting while the app takes none of their bytes for idle_ms (it stopped
 *     reading): the connection is aborted (closed_stalled), so a client cannot hold its
 *     session and the replies' memory by never reading;
 *   - the app's reset, a failed read or write, or the budget refusing a reply's copy: the
 *     connection is aborted and every outstanding ticket cancelled (the resolver never calls
 *     back for it).
 * Memory: the connection and every queued reply come from the budget (budget_malloc).
 *
 * Single-threaded: a connection, its stream and the resolver live on one event loop.
 */
#ifndef TS_DISPATCH_DNS_TCP_H
#define TS_DISPATCH_DNS_TCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "dispatch/stream.h"
#include "dns/server.h"

struct event_base;
struct budget;
struct dns_tcp;

#define DNS_TCP_HEADER_MIN 12          /* a DNS header: anything shorter is no message */
#define DNS_TCP_QUERY_MAX 4096         /* the longest query accepted (a question and an OPT
					* fit many times over; longer ones reset) */
#define DNS_TCP_FRAME_MAX (2 + DNS_TCP_QUERY_MAX)
#define DNS_TCP_MAX_INFLIGHT 64        /* queries waiting for the resolver, per connection */
#define DNS_TCP_OUT_MAX 65536          /* queued reply bytes at which reading stops */
#define DNS_TCP_IDLE_MS 10000          /* idle time after the last reply that closes */

/* ---- the framer (sans-IO) -------------------------------------------------------------- */

/* Bytes of the stream not yet taken as messages: [head, tail) of buf. Embedded; no _fini. */
struct dns_tcp_framer {
	uint32_t head, tail;
	uint8_t buf[DNS_TCP_FRAME_MAX];
};

void dns_tcp_framer_init(struct dns_tcp_framer *f);

/* Where the next bytes of the stream go: *room (> 0 unless whole messages fill the buffer:
 * take them with dns_tcp_framer_next first) bytes at the returned pointer. Moves what is held
 * to the front, so messages returned before are no longer valid. Then dns_tcp_framer_commit
 * the bytes written there (n <= *room). */
uint8_t *dns_tcp_framer_space(struct dns_tcp_framer *f, size_t *room);
void dns_tcp_framer_commit(struct dns_tcp_framer *f, size_t n);

/* Copy up to n bytes of in (space + commit); returns how many were taken. */
size_t dns_tcp_framer_push(struct dns_tcp_framer *f, const void *in, size_t n);

/* The next whole message: 1 with *msg (borrowed: valid until the next space or push) and
 * *len set; 0 when more bytes are needed; -EBADMSG when its length prefix is below
 * DNS_TCP_HEADER_MIN or above DNS_TCP_QUERY_MAX (the stream cannot be resynchronised: close
 * it). */
int dns_tcp_framer_next(struct dns_tcp_framer *f, const uint8_t **msg, size_t *len);

/* Bytes held that are not yet returned as messages. */
static inline size_t dns_tcp_framer_held(const struct dns_tcp_framer *f)
{
	return f->tail - f->head;
}

/* ---- the resolver, as a connection sees it --------------------------------------------- */

/* query and cancel have dns_server_query's and dns_server_cancel's contracts (dns/server.h):
 * query returns 0 and calls fn(arg, ...) exactly once (possibly from inside the call, then
 * *t is NULL), unless cancel(ctx, *t) comes first; or -errno and never calls fn. */
struct dns_tcp_resolver {
	int (*query)(void *ctx, const uint8_t *m, size_t len, bool tcp, size_t mtu_payload,
		     dns_reply_fn fn, void *arg, struct dns_ticket **t);
	void (*cancel)(void *ctx, struct dns_ticket *t);
	void *ctx;
};

/* The production resolver: query and cancel are dns_server_query and dns_server_cancel on s
 * (borrowed: it must outlive every connection). In dns_tcp_server.c, the only file here that
 * links against dns/server.c. */
void dns_tcp_resolver_server(struct dns_tcp_resolver *r, struct dns_server *s);

/* ---- connections ----------------------------------------------------------------------- */

/* Aggregate counters of the connections of one loop (single writer). */
struct dns_tcp_counters {
	ctr_t connections;       /* started */
	ctr_t queries;           /* handed to the resolver (accepted by it) */
	ctr_t queries_refused;   /* the resolver refused at once (-ENOBUFS ...): a REFUSED reply */
	ctr_t replies;           /* written in full to the app */
	ctr_t closed_done;       /* the app's FIN, every reply written, our FIN */
	ctr_t closed_idle;
	ctr_t closed_bad_length;
	ctr_t closed_reset;      /* the app reset, or a read or write failed */
	ctr_t closed_nomem;      /* the budget refused a reply's copy, or the idle timer could
				  * not be armed again (no memory) */
	ctr_t closed_cancelled;  /* dns_tcp_cancel (dispatcher shutdown) */
	ctr_t closed_stalled;    /* replies waited idle_ms with none of their bytes taken */
	ctr_t live;              /* gauge: connections now */
};

/* The counters as plain numbers (for /stats). */
struct dns_tcp_stats {
	uint64_t connections, queries, queries_refused, replies;
	uint64_t closed_done, closed_idle, closed_bad_length, closed_reset, closed_nomem;
	uint64_t closed_cancelled, closed_stalled;
	uint64_t live; /* gauge */
};
void dns_tcp_counters_read(const struct dns_tcp_counters *c, struct dns_tcp_stats *out);

struct dns_tcp_params {
	const struct dns_tcp_resolver *resolver; /* borrowed; outlives the connection */
	struct budget *budget;                   /* the connection and its queued replies */
	uint32_t idle_ms;                        /* DNS_TCP_IDLE_MS in production; > 0 */
	struct dns_tcp_counters *counters;       /* required */
};

/* Called exactly once, from the loop (or from inside dns_tcp_cancel), after the stream was
 * closed or aborted, every ticket answered or cancelled and everything freed. */
typedef void (*dns_tcp_done_fn)(void *arg);

/* Answer the queries of the app on s. Takes s on success (replaces its callbacks); on failure
 * (-EINVAL, -ENOMEM: the budget refused, or no memory for the idle timer) owns nothing and
 * calls nothing. *out (may be NULL)
 * is valid until done runs. */
int dns_tcp_new(struct event_base *base, struct stream *s, const struct dns_tcp_params *p,
		dns_tcp_done_fn done, void *arg, struct dns_tcp **out)
	__attribute__((warn_unused_result));

/* End now: cancel every outstanding ticket, abort the stream (RST), free, call done before
 * returning. Must not be called from inside done. */
void dns_tcp_cancel(struct dns_tcp *c);

#endif
