/* socks5.h — the SOCKS5 outbound (RFC 1928 CONNECT, RFC 1929 authentication) over outbound/socks5_codec.h. Internal to outbound/: outbound.c starts it by type. */
#ifndef TS_OUTBOUND_SOCKS5_H
#define TS_OUTBOUND_SOCKS5_H

#include <stdint.h>

#include "core/flow.h"
#include "outbound/conn.h"

/* Start the attempt c (already allocated by outbound_connect) toward key's destination, or
 * toward name (ATYP 3; NULL: by address) at key's port, within timeout_ms. 0, or -errno when
 * nothing could be started (the caller frees c). */
int socks5_start(struct outbound_conn *c, const struct ts_outbound *ob, const struct flow_key *key,
		 const char *name, uint32_t timeout_ms) __attribute__((warn_unused_result));

/* Free an attempt's SOCKS5 state (conn_free): its lookup, connect attempts and resolver of its
 * own. NULL is ignored. */
void socks5_state_free(struct socks5_conn *s);

#endif
