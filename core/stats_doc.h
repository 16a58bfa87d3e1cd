/* stats_doc.h — a tiny ordered key/value document: the one shape of the statistics, rendered
 * as JSON for /stats and as Prometheus text for /metrics.
 *
 * A provider appends (dotted key, value) pairs; the document is append-only and remembers the
 * order. Renderers:
 *   JSON: nesting by the dots ("tun.rx_packets" -> {"tun":{"rx_packets":N}}); an object
 *     appears where its first key was added and holds its keys in insertion order; strings
 *     are escaped (invalid UTF-8 becomes U+FFFD, so the output is always valid JSON); a
 *     non-finite double is null.
 *   Prometheus text exposition 0.0.4: each numeric key becomes the metric
 *     STATS_PROM_PREFIX + key with dots as underscores, preceded by "# TYPE name counter|gauge"
 *     (the provider says which); all string values together become one info metric,
 *     STATS_PROM_PREFIX "info" {key="value",...} 1, written first.
 *
 * Keys: ASCII letters, digits, '_' and '.'; start with a letter; no empty segment; at most
 * STATS_KEY_MAX bytes. So every key is a valid metric or label name once the prefix is added.
 * Refused (the add returns the error, nothing is added, and the document remembers the first
 * error for stats_doc_error): a bad key (-EINVAL), a key already present or one that would make
 * a value into an object or back ("tun" and "tun.x") (-EEXIST), two keys that map to the same
 * metric name ("a.b_c" and "a_b.c") (-EEXIST), the numeric key "info" (-EINVAL, it is the info
 * metric), out of memory (-ENOMEM). So a provider can add without checking each call and look
 * at stats_doc_error() once.
 *
 * Pure: no I/O, no clock, no shared state; single-threaded per document.
 */
#ifndef TS_CORE_STATS_DOC_H
#define TS_CORE_STATS_DOC_H

#include <stddef.h>
#include <stdint.h>

#define STATS_DOC_WUR __attribute__((warn_unused_result))

#define STATS_KEY_MAX 128
#define STATS_PROM_PREFIX "twinstack_"

enum stats_kind {
	STATS_GAUGE,   /* a level that goes up and down (sessions now, RSS) */
	STATS_COUNTER, /* only ever grows while the process lives (packets, drops) */
};

struct stats_doc;

struct stats_doc *stats_doc_new(void);
void stats_doc_free(struct stats_doc *d);
/* Empty the document (and its error), keeping its memory for the next request. */
void stats_doc_reset(struct stats_doc *d);

/* Append key = value. 0 or -errno (see above). */
int stats_doc_add_u64(struct stats_doc *d, const char *key, enum stats_kind kind, uint64_t v);
int stats_doc_add_i64(struct stats_doc *d, const char *key, enum stats_kind kind, int64_t v);
int stats_doc_add_double(struct stats_doc *d, const char *key, enum stats_kind kind, double v);
/* A string (copied). Not a metric: an info label in Prometheus. */
int stats_doc_add_str(struct stats_doc *d, const char *key, const char *v);

static inline int stats_doc_counter(struct stats_doc *d, const char *key, uint64_t v)
{
	return stats_doc_add_u64(d, key, STATS_COUNTER, v);
}

static inline int stats_doc_gauge(struct stats_doc *d, const char *key, uint64_t v)
{
	return stats_doc_add_u64(d, key, STATS_GAUGE, v);
}

/* The first error since new/reset (0 if none); *why (if not NULL) gets a one-line reason
 * naming the key, valid until the next reset. */
int stats_doc_error(const struct stats_doc *d, const char **why);
/* Number of values (not counting objects). */
size_t stats_doc_count(const struct stats_doc *d);

/* Render into a new malloc'd NUL-terminated string (*out, length *len without the NUL; the
 * caller frees it). Both end with a newline. 0 or -ENOMEM. */
int stats_doc_json(const struct stats_doc *d, char **out, size_t *len) STATS_DOC_WUR;
int stats_doc_prometheus(const struct stats_doc *d, char **out, size_t *len) STATS_DOC_WUR;

#endif
