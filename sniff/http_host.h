/* http_host.h — the Host header of an HTTP/1.x request head (RFC 9112 §3, RFC 9110 §7.2).
 * Internal to sniff/.
 */
#ifndef TS_SNIFF_HTTP_HOST_H
#define TS_SNIFF_HTTP_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "sniff/sniff.h"

#define HTTP_HOST_LINE_MAX 8192 /* a request line or header line longer than this: NONE */

/* Is buf[0..len) (len >= 1) the start of a request with a known method (RFC 9110 §9 plus
 * PATCH, RFC 5789) and its space? 1 yes, 0 it may still be (a prefix of "METHOD "), -1 no. */
int http_host_method(const uint8_t *buf, size_t len);

/* buf[0..len) is a prefix of a request head. FOUND when the first Host line is complete and
 * names a host (port dropped; "[...]" or an address literal is NONE); NONE when the head is
 * not a request, is malformed, has a line over HTTP_HOST_LINE_MAX, or ends without Host;
 * NEED_MORE while the prefix is too short to tell. Line ends are CRLF or a bare LF
 * (RFC 9112 §2.2). name is written only on FOUND. */
enum sniff_result http_host_parse(const uint8_t *buf, size_t len, char name[SNIFF_NAME_MAX + 1]);

#endif
