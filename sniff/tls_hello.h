/* tls_hello.h — the TLS ClientHello handshake-message parser (RFC 8446 §4.1.2) shared by the
 * TLS stream sniffer (after the record layer is removed) and the QUIC Initial sniffer (the
 * CRYPTO stream carries handshake messages without records, RFC 9001 §4). Internal to sniff/.
 */
#ifndef TS_SNIFF_TLS_HELLO_H
#define TS_SNIFF_TLS_HELLO_H

#include <stddef.h>
#include <stdint.h>

#include "sniff/sniff.h"

/* msg[0..len) is a prefix of a handshake message (msg[0] is its type, then a 24-bit length).
 * FOUND once the first server_name extension (RFC 6066 §3) holds a host_name entry that is a
 * valid host name (name filled, see sniff_name_check); NONE when the message is not a
 * ClientHello, is malformed, carries no server_name, or names no valid host; NEED_MORE while
 * the prefix is too short to tell. Every length is checked against both the message's own
 * length and len; nothing past msg[len - 1] is read. The verdict for a prefix holds for every
 * longer prefix of the same message. */
enum sniff_result tls_hello_parse(const uint8_t *msg, size_t len, char name[SNIFF_NAME_MAX + 1]);

#endif
