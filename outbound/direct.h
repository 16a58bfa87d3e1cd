/* direct.h — the direct outbound: a marked socket connected straight to the destination (its
 * address, or its name resolved here). Internal to outbound/: outbound.c starts it by type. */
#ifndef TS_OUTBOUND_DIRECT_H
#define TS_OUTBOUND_DIRECT_H

#include <stdint.h>

#include "core/flow.h"
#include "outbound/conn.h"

/* Start the attempt c (already allocated by outbound_connect) toward key's destination, or
 * toward name (NULL: by address; else a valid name, outbound_name_valid) at key's port, within
 * timeout_ms. 0, or -errno when nothing could be started (the caller frees c). */
int direct_start(struct outbound_conn *c, const struct ts_outbound *ob, const struct flow_key *key,
		 const char *name, uint32_t timeout_ms) __attribute__((warn_unused_result));

/* Free an attempt's by-name state (conn_free): its lookup, connect attempts and resolver of its
 * own. NULL is ignored. */
void direct_state_free(struct direct_conn *s);

#endif
