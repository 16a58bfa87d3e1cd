/* doh.h — DNS over HTTPS (RFC 8484) as a transport of the proxy's own resolver: one upstream
 * server asked over HTTP/2 (RFC 9113) inside TLS, the counterpart of dns/upstream.h's UDP and
 * TCP transports, with the same callback type.
 *
 * One TLS connection per upstream, opened on demand through outbound_connect(detour) to the
 * configured address (the URL's host is not resolved: it names the server in the TLS and HTTP
 * layers only), closed when idle (idle_ms). The TLS layer is strict: TLS 1.2 at least, the
 * certificate verified against ca (or the system store) and the URL's host (SSL_set1_host, or
 * the IP address when the host is an address literal), SNI set for a name, ALPN "h2" offered
 * and required: a server that picks nothing or another protocol fails the connection. Nothing
 * is ever sent in plaintext.
 *
 * Each try of an ask is one stream: a POST to path with content-type and accept
 * application/dns-message and the query (dns_build_query) with id 0 as the body (RFC 8484
 * section 4.1: id 0 keeps HTTP caches effective). Answers are matched by stream, and checked
 * with dns_parse_answer against id 0 and the question. A response whose status is not 200 or
 * whose content-type is not application/dns-message ends the try (http_errors), as does a body
 * that fails the check or is longer than 65535 bytes (bad_answers), a stream reset by the
 * server, or a body there was no memory to keep (errors). A stream the server refused unprocessed (REFUSED_STREAM, or above a GOAWAY's
 * last stream id: RFC 9113 section 8.7) is asked again without losing a try.
 *
 * At most min(DNS_DOH_MAX_STREAMS, the server's SETTINGS_MAX_CONCURRENT_STREAMS) streams are
 * open on the connection; more asks wait in the upstream's queue. When the connection is lost
 * (reset, closed, a TLS or HTTP/2 protocol error) the asks it had not answered take their next
 * try on a new connection; after a GOAWAY the connection takes no new stream and is replaced
 * once its streams are done. A try that times out on a connection that received nothing since
 * the query was assigned to it takes the connection as dead (as dns/upstream.h's TCP link).
 *
 * Memory is bounded: at most DNS_DOH_MAX_ASKS asks, each holding its query and at most one
 * 65535-byte answer body; one 16 KiB read buffer; nghttp2's own state for at most
 * DNS_DOH_MAX_STREAMS streams.
 *
 * Single-threaded: every call and callback on the thread running base. A callback never runs
 * inside dns_doh_ask; it may call dns_doh_ask, dns_doh_cancel (other asks) and dns_doh_free.
 */
#ifndef TS_DNS_DOH_H
#define TS_DNS_DOH_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/dns_msg.h"
#include "core/netaddr.h"
#include "dns/upstream.h"

struct event_base;

#define DNS_DOH_MAX_STREAMS 64       /* concurrent streams on the connection (at most) */
#define DNS_DOH_MAX_ASKS 256         /* asks outstanding per upstream (more: -ENOBUFS) */
#define DNS_DOH_TIMEOUT_MS 5000      /* per try, when the config says 0 */
#define DNS_DOH_TRIES 2              /* when the config says 0 */
#define DNS_DOH_IDLE_MS 30000        /* an idle connection closed, when the config says 0 */
#define DNS_DOH_HOST_MAX 253
#define DNS_DOH_PATH_MAX 255

struct dns_doh_config {
	struct netaddr_ep server;            /* the address connected to, and its port */
	/* The URL's host: :authority, SNI and the name the certificate must carry. A DNS name
	 * (outbound_name_valid) or an IPv4/IPv6 address literal (no brackets: the certificate
	 * must then carry that address, and no SNI is sent, RFC 6066 section 3). */
	char host[DNS_DOH_HOST_MAX + 1];
	/* The URL's path, e.g. "/dns-query": starts with '/', visible ASCII only. */
	char path[DNS_DOH_PATH_MAX + 1];
	/* A PEM file of trust anchors (one or more certificates), read by dns_doh_new, as
	 * dns/upstream.h's tls ca. NULL: the system's default store. */
	const char *ca;
	/* The outbound its connections leave through, copied (what it points to must outlive the
	 * upstream). Any type (direct, socks5, http). NULL: plain sockets, no mark (tests). */
	const struct ts_outbound *detour;
	uint32_t timeout_ms;                 /* per try (connect and handshake included); 0: 5000 */
	uint32_t tries;                      /* 0: 2 */
	uint32_t idle_ms;                    /* connection idle close; 0: 30000 */
};

struct dns_doh;
struct dns_doh_q;

/* Asks are answered through dns_upstream_cb (dns/upstream.h): err 0 with the answer (any
 * rcode), or err < 0, the error of the last try:
 *   -ETIMEDOUT     the try timed out;
 *   -EKEYREJECTED  the server's certificate failed verification (chain, dates, name);
 *   -EPROTO        a TLS failure other than verification, no "h2" by ALPN, an HTTP/2
 *                  protocol error, or an answer that failed the check;
 *   -EBADMSG       an HTTP status other than 200, or another content-type;
 *   -ECONNRESET    the connection was lost, or the server reset the stream;
 *   -ENOMEM        no memory to keep the answer's body;
 *   another -errno of the transport (of the outbound: outbound/outbound.h). */

/* 0 and *out, or -EINVAL (address, port, host, path, a ca file without a certificate),
 * -errno of opening the ca file, -ENOMEM, or tlslib_load's error if OpenSSL or nghttp2 cannot
 * be opened (core/tlslib.h). */
int dns_doh_new(struct event_base *base, const struct dns_doh_config *cfg, struct dns_doh **out)
	__attribute__((warn_unused_result));
/* Outstanding asks are dropped silently (callbacks not called); the connection closed. NULL:
 * nothing. From inside a callback: the rest happens when the callback returns. */
void dns_doh_free(struct dns_doh *d);

/* Ask question q (its name nameable; copied). 0 and *h (valid until the callback starts or
 * dns_doh_cancel), or -errno and nothing will be called: -EINVAL (not nameable), -ENOBUFS
 * (DNS_DOH_MAX_ASKS outstanding), -ENOMEM. */
int dns_doh_ask(struct dns_doh *d, const struct dns_question *q, dns_upstream_cb cb, void *arg,
		struct dns_doh_q **h) __attribute__((warn_unused_result));
/* The callback will not be called; the ask's stream, if open, is reset (CANCEL). */
void dns_doh_cancel(struct dns_doh *d, struct dns_doh_q *h);

/* From now on the connections leave through detour (copied; a reload that changed the outbound
 * the server goes through), as dns_upstream_set_detour: 0 the same outbound (nothing happens),
 * 1 another: an open connection is closed and its tries are asked again on a new one through
 * detour, given back. No callback runs inside. */
int dns_doh_set_detour(struct dns_doh *d, const struct ts_outbound *detour)
	__attribute__((warn_unused_result));

/* Counters (cumulative) and one gauge. */
struct dns_doh_stats {
	uint64_t queries;               /* asks accepted */
	uint64_t tries;                 /* tries started (assigned to a connection), refused
					 * ones included */
	uint64_t timeouts;              /* tries that ended by their timeout */
	uint64_t errors;                /* tries that ended by a connection loss, a stream reset,
					 * a second refusal, no memory for the answer or for the
					 * try's timer */
	uint64_t bad_answers;           /* 200 answers that failed the check, or were too long */
	uint64_t refused;               /* streams the server refused unprocessed (REFUSED_STREAM,
					 * above a GOAWAY's last id): asked again, the try given
					 * back the first time in a try; refused again, the try
					 * ends (counted in errors too). A server whose SETTINGS
					 * allow fewer streams than we open before they arrive
					 * refuses the excess once. */
	uint64_t http_errors;           /* answers with another status or content-type */
	uint64_t tls_failures;          /* handshakes that failed (verification included), or
					 * that did not select "h2" */
	uint64_t connects;              /* connections started */
	uint64_t inflight;              /* gauge: asks whose callback is still to come */
};
void dns_doh_get_stats(const struct dns_doh *d, struct dns_doh_stats *out);

#endif
