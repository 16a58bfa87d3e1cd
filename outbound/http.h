/* http.h — the HTTP CONNECT outbound (RFC 9110 section 9.3.6) over outbound/http_codec.h.
 * Internal to outbound/: outbound.c starts it by type. */
#ifndef TS_OUTBOUND_HTTP_H
#define TS_OUTBOUND_HTTP_H

#include <stdint.h>

#include "core/flow.h"
#include "outbound/conn.h"

/* Start the attempt c (already allocated by outbound_connect) toward key's destination, or
 * toward name ("CONNECT name:port"; NULL: by address) at key's port, within timeout_ms. 0, or
 * -errno when nothing could be started (the caller frees c). */
int http_start(struct outbound_conn *c, const struct ts_outbound *ob, const struct flow_key *key,
	       const char *name, uint32_t timeout_ms) __attribute__((warn_unused_result));

/* Free an attempt's HTTP state (conn_free): its lookup, connect attempts and resolver of its
 * own. NULL is ignored. */
void http_state_free(struct http_conn *s);

#endif
