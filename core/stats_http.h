/* stats_http.h — the loopback-only statistics endpoint (libevent evhttp).
 *
 *   GET /stats    application/json             (stats_doc_json)
 *   GET /metrics  text/plain; version=0.0.4    (stats_doc_prometheus)
 *   HEAD on both: the same headers without a body (RFC 9110 section 9.3.2)
 *   any other path: 404; another method on those paths: 405 with "Allow: GET, HEAD"
 *   a provider that added a bad key: 500 with the stats_doc_error reason (a bug, made loud)
 *
 * The provider is called on every request, in the event loop's thread, with an empty document
 * to fill: whatever it adds (flushing first any counters it batches) is what
 * that request sees. Nothing is polled or cached, so an idle process never wakes for stats.
 *
 * The listener is bound only to the loopback address given (127.0.0.0/8 or ::1): the counters
 * describe the user's traffic and must not be served to the network.
 */
#ifndef TS_CORE_STATS_HTTP_H
#define TS_CORE_STATS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "core/netaddr.h"
#include "core/stats_doc.h"

struct event_base;
struct stats_http;

#define STATS_HTTP_TIMEOUT_S 10   /* a client that stalls mid-request is dropped after this */
/* Bounds: a scraper needs one connection; a few more for people with curl. Over the cap a new
 * connection is closed at once (counted in refused). A request must arrive whole and be
 * answered within STATS_HTTP_REQUEST_MS of its connection's accept (or of the previous answer
 * on a kept-alive connection), however slowly its bytes trickle in (counted in timeouts):
 * each connection holds one fd and about 13 KiB of buffered input at most, give or take one
 * read (the headers' STATS_HTTP_MAX_HEADERS, a 1 KiB body, a margin; reading stops above it)
 * for at most that long. */
#define STATS_HTTP_MAX_CONNS 8
#define STATS_HTTP_REQUEST_MS 5000
#define STATS_HTTP_MAX_HEADERS 8192
#define STATS_HTTP_BACKLOG 16
/* The most descriptors the endpoint holds at once: its listener, the admitted connections and
 * those accepted over the cap in one loop iteration (at most the backlog) before they close. */
#define STATS_HTTP_FDS (1 + STATS_HTTP_MAX_CONNS + STATS_HTTP_BACKLOG)
#define STATS_HTTP_PATH_JSON "/stats"
#define STATS_HTTP_PATH_PROM "/metrics"
#define STATS_HTTP_CT_JSON "application/json"
#define STATS_HTTP_CT_PROM "text/plain; version=0.0.4"

/* Fill doc (empty on entry) with the current statistics. */
typedef void (*stats_provider_fn)(void *arg, struct stats_doc *doc);

/* Listen on listen (a loopback address; port 0 = kernel's choice) and serve on base. fn and
 * arg are borrowed and must outlive the server. Returns 0 or -errno with one line in err:
 *   -EINVAL      the address is not loopback
 *   -EADDRINUSE  port taken; other -errno from socket/bind/listen; -ENOMEM */
int stats_http_new(struct event_base *base, const struct netaddr_ep *listen,
		   stats_provider_fn fn, void *arg, struct stats_http **out, char *err,
		   size_t errlen) __attribute__((warn_unused_result));

/* The bound port (the kernel's choice when listen->port was 0). */
uint16_t stats_http_port(const struct stats_http *s);

struct stats_http_stats {
	uint64_t connections; /* gauge: open connections (<= STATS_HTTP_MAX_CONNS) */
	uint64_t accepted;    /* connections admitted */
	uint64_t refused;     /* closed at accept: the cap was reached, or no memory for the timer */
	uint64_t timeouts;    /* closed: no complete request within STATS_HTTP_REQUEST_MS */
	uint64_t no_memory;   /* requests answered 500 for want of memory: for the document, or
			       * for the reply's body or headers (then evhttp's own page) */
};

/* A snapshot; any thread (relaxed counters). */
void stats_http_stats(const struct stats_http *s, struct stats_http_stats *out);

/* Close the listener and every open connection; in the loop's thread, before event_base_free.
 * NULL is a no-op. */
void stats_http_free(struct stats_http *s);

#endif
