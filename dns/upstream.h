/* upstream.h — the transports the proxy's own DNS resolver (dns/server.h) uses to ask one
 * upstream server a question: UDP, TCP and TLS.
 *
 * Every ask sends a query built here (dns_build_query: a random id from getrandom per try, RD,
 * the question, our OPT) and accepts only an answer that passes dns_parse_answer against that
 * id and question; anything else is counted and ignored.
 *
 * udp: one fresh connected socket per try, so the kernel picks a new random source port each
 *      time (with the random id, the defence against off-path answer forgery described in
 *      RFC 5452). Datagrams that fail the check are counted (bad_answers) and the try keeps
 *      waiting for the real answer until its timeout; the next try has a new socket and id. A
 *      valid answer with TC set is asked again over TCP to the same server (RFC 7766 section
 *      5), with the tries left (at least one). An ICMP error (ECONNREFUSED) ends a try at once.
 * tcp: RFC 1035 section 4.2.2 / RFC 7766 section 6.2: a 2-byte length before each message; one
 *      connection per upstream, opened on demand, reused for pipelined queries and closed when
 *      idle (idle_ms). Answers are matched by id (unique among the connection's queries) and
 *      question and may come in any order. At most DNS_UP_TCP_INFLIGHT queries are in flight
 *      on it; more wait in the upstream's queue. When the connection is lost (reset, closed by
 *      the server, connect failed, a length prefix below the DNS header), the queries it had
 *      not answered take their next try on a new connection. A try that times out on a
 *      connection that received nothing since the query was sent takes the connection as dead:
 *      it is closed and its other queries are sent again on a new one without losing a try
 *      (else a silently dead connection would be kept by steady traffic forever). Answers to no
 *      query in flight (a try that timed out, a cancelled ask) are counted as late_answers.
 *      The same connection serves a udp upstream's truncated answers.
 *
 * tls: DNS over TLS (RFC 7858): the tcp link with a TLS layer under the framing. Once the
 *      connection is made, a TLS client handshake (TLS 1.2 at least; SNI and the certificate's
 *      name checked against sni; the chain against ca, or the system's trust store), then the
 *      same pipelined framing inside TLS. The handshake counts inside the try's timeout. A
 *      handshake that fails ends the tries in flight on it with -EKEYREJECTED (the certificate
 *      did not verify: untrusted chain, wrong name, expired), -ECONNRESET (closed by the
 *      server) or -EPROTO (anything else: not a TLS server, no common version) and is counted
 *      in tls_failures (a handshake cut short by the try's timeout counts as a timeout; one
 *      OpenSSL had no memory for fails with -ENOMEM and is no TLS failure); there
 *      is never a fallback to plain DNS. Bytes a proxy outbound passed on before our ClientHello cannot be
 *      the server's TLS records: such a connection fails with -EPROTO (counted the same).
 *      DNS over HTTPS (RFC 8484) would be a link of its own: dns_up_kind leaves room for it.
 *
 * The sockets: udp through outbound_socket(detour) (mark, interface, socket hook, loop guard;
 * only a direct outbound can carry it); tcp through outbound_connect(detour) to the server's
 * address (direct, socks5, http: DNS over a proxy's TCP). Memory is bounded: at most
 * DNS_UP_MAX_ASKS asks per upstream, a 64 KiB read buffer while a TCP connection is open.
 *
 * Single-threaded: every call and callback on the thread running base. A callback never runs
 * inside dns_upstream_ask; it may call dns_upstream_ask, dns_upstream_cancel (other asks) and
 * dns_upstream_free.
 */
#ifndef TS_DNS_UPSTREAM_H
#define TS_DNS_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/dns_msg.h"
#include "core/netaddr.h"

struct event_base;

#define DNS_UP_TCP_INFLIGHT 32       /* queries in flight on the TCP connection */
#define DNS_UP_MAX_ASKS 256          /* asks outstanding per upstream (more: -ENOBUFS) */
#define DNS_UP_TIMEOUT_MS 5000       /* per try, when the config says 0 */
#define DNS_UP_TRIES 2               /* when the config says 0 */
#define DNS_UP_IDLE_MS 10000         /* an idle TCP connection closed, when the config says 0 */

enum dns_up_kind { DNS_UP_UDP, DNS_UP_TCP, DNS_UP_TLS };

struct dns_upstream_config {
	enum dns_up_kind kind;
	struct netaddr_ep server;            /* address and port */
	/* The outbound its traffic leaves through, copied (what it points to, such as the loop
	 * guard, must outlive the upstream). NULL: plain sockets without a mark (tests only).
	 * udp: a direct outbound only (-EINVAL otherwise); tcp: any outbound. */
	const struct ts_outbound *detour;
	uint32_t timeout_ms;                 /* per try (TCP: the connect included); 0: 5000 */
	uint32_t tries;                      /* 0: 2 */
	uint32_t idle_ms;                    /* TCP connection idle close; 0: 10000 */
	/* tls only (copied): the name the server's certificate must carry, also sent as SNI
	 * (required); a PEM file of trust anchors, read by dns_upstream_new (NULL: the system's
	 * default store). */
	const char *sni;
	const char *ca;
};

struct dns_upstream;
struct dns_uq;

/* Called exactly once per dns_upstream_ask unless cancelled: err 0 with the answer msg (len
 * bytes, borrowed for the call; any rcode: a SERVFAIL is an answer too) and *a its parse
 * (dns_parse_answer against the question asked), or err < 0 with msg and a NULL:
 *   -ETIMEDOUT     every try timed out;
 *   -ECONNREFUSED, -ECONNRESET, -EPROTO (a TCP framing violation) or another -errno of the
 *                  transport (of the outbound: outbound.h): the last transport error of any try;
 *   -EKEYREJECTED  tls: the server's certificate did not verify (the last try's error);
 *   -EPROTO        no transport error, and answers came but none passed the check.
 * The ask's handle is invalid once the callback starts. */
typedef void (*dns_upstream_cb)(void *arg, int err, const uint8_t *msg, size_t len,
				const struct dns_answer *a);

/* 0 and *out, or -EINVAL (bad kind, address, detour, sni; a ca file without a certificate),
 * -errno of opening the ca file, -ENOMEM; tls: tlslib_load's error if OpenSSL cannot be
 * opened (core/tlslib.h). */
int dns_upstream_new(struct event_base *base, const struct dns_upstream_config *cfg,
		     struct dns_upstream **out) __attribute__((warn_unused_result));
/* Outstanding asks are dropped silently (callbacks not called); sockets closed. NULL: nothing. */
void dns_upstream_free(struct dns_upstream *u);

/* Ask question q (its name nameable; copied). 0 and *h (valid until the callback starts or
 * dns_upstream_cancel), or -errno and nothing will be called: -EINVAL (not nameable),
 * -ENOBUFS (DNS_UP_MAX_ASKS outstanding), -ENOMEM. */
int dns_upstream_ask(struct dns_upstream *u, const struct dns_question *q, dns_upstream_cb cb,
		     void *arg, struct dns_uq **h) __attribute__((warn_unused_result));
/* The callback will not be called; the ask's socket (udp) is closed. */
void dns_upstream_cancel(struct dns_upstream *u, struct dns_uq *h);

/* From now on the upstream's traffic leaves through detour (copied; a reload that changed the
 * outbound a server goes through). The same outbound (outbound_same): nothing happens, 0.
 * Another: 1; UDP tries from the next one on use it, and an open TCP connection (made through
 * the old one) is closed: the queries in flight on it are sent again on a new connection
 * through detour, their tries given back. No callback runs inside. -EINVAL: udp through
 * anything but a direct outbound (nothing changes). */
int dns_upstream_set_detour(struct dns_upstream *u, const struct ts_outbound *detour)
	__attribute__((warn_unused_result));

/* Counters (cumulative) and one gauge. */
struct dns_upstream_stats {
	uint64_t queries;               /* asks accepted */
	uint64_t tries;                 /* tries started, UDP or TCP (sent or failed to) */
	uint64_t timeouts;              /* tries that ended by their timeout */
	uint64_t errors;                /* tries that ended by a transport error or connection loss,
					 * or that could not start (no memory: their timer too) */
	uint64_t bad_answers;           /* messages that failed the check against the question */
	uint64_t late_answers;          /* TCP answers to no query in flight on the connection */
	uint64_t truncated_retried_tcp; /* UDP answers with TC set, asked again over TCP */
	uint64_t tcp_connects;          /* TCP connections started (tls: each with a handshake) */
	uint64_t tls_failures;          /* TLS handshakes that failed (verification included) */
	uint64_t inflight;              /* gauge: asks whose callback is still to come */
};
void dns_upstream_get_stats(const struct dns_upstream *u, struct dns_upstream_stats *out);

#endif
