/* http_codec.h — the client side of an HTTP/1.1 CONNECT tunnel (RFC 9110 section 9.3.6,
 * message syntax RFC 9112), sans-IO: the request is built into a caller buffer, the proxy's
 * response is parsed from a caller buffer. Nothing here touches a socket or the clock.
 *
 * Response parsing is incremental with the convention of socks5_codec.h:
 *   > 0             the response head is complete; that many bytes belong to it (status line,
 *                   header fields, the empty line); the bytes after it are the tunnel's first
 *                   bytes ("early" bytes) when the status is 2xx;
 *   HTTP_NEED_MORE  (0) the bytes so far are a valid prefix: call again with more;
 *   < 0             -EPROTO (malformed) or -EMSGSIZE (no complete head in HTTP_RESP_MAX bytes).
 * A verdict never changes as more bytes arrive, and nothing past len is read.
 *
 * Tolerance, decided here once: a bare LF ends a line as CRLF does (RFC 9112 section 2.2 allows
 * a recipient to accept it); a CR not followed by LF is malformed. The status line must be
 * "HTTP/1.<digit> <3 digits>" then a space and any reason, or the end of the line. Interim 1xx
 * responses are skipped (their bytes count toward the consumed length and the size bound).
 * A 2xx response's Content-Length or Transfer-Encoding is ignored, as RFC 9110 section 9.3.6
 * requires for CONNECT. Header field lines need a token name followed directly by ':'.
 */
#ifndef TS_OUTBOUND_HTTP_CODEC_H
#define TS_OUTBOUND_HTTP_CODEC_H

#include <stddef.h>
#include <stdint.h>

#define HTTP_NEED_MORE 0
#define HTTP_RESP_MAX 8192      /* bound on the whole response head (1xx included) */
#define HTTP_HOST_MAX 255       /* bytes of the target host (without brackets) */
#define HTTP_CRED_MAX 255       /* bytes of user and of password */
#define HTTP_EXTRA_MAX 4096     /* bytes of extra header lines ("Name: value\r\n"...) */
/* The longest request: request line, Host, Proxy-Authorization (base64 of user:pass),
 * the extra lines and the final empty line. */
#define HTTP_REQ_MAX (2 * (HTTP_HOST_MAX + 2 + 6) + 64 + \
		      4 * ((2 * HTTP_CRED_MAX + 1 + 2) / 3) + HTTP_EXTRA_MAX)

/* RFC 9110 section 5.6.2 tchar. */
int http_is_tchar(unsigned char c);

/* Base64 (RFC 4648 section 4, padded) of n bytes into out (4 * ((n + 2) / 3) + 1 with NUL).
 * Returns the length without the NUL, or -ENOSPC. */
int http_base64(const uint8_t *in, size_t n, char *out, size_t cap);

/* "CONNECT host:port HTTP/1.1", "Host: host:port", Proxy-Authorization: Basic when user is not
 * NULL (user and pass 1..HTTP_CRED_MAX bytes; user without ':'), then extra (NULL or "":
 * none; otherwise complete "Name: value\r\n" lines, checked by the caller), then the empty
 * line. host is a name or an IP literal; one containing ':' (IPv6) is written in brackets.
 * Returns the request length, -ENOSPC if cap is too small, -EINVAL on bad input. */
int http_build_connect(char *buf, size_t cap, const char *host, uint16_t port, const char *user,
		       const char *pass, const char *extra);

/* Parse the response head (convention above); *status receives the final status code
 * (100..599) when the head is complete. */
int http_parse_response(const uint8_t *buf, size_t len, int *status);

/* A final status -> the attempt's result: 2xx 0, 407 and 401 -EACCES (credentials refused; some
 * proxies answer a wrong password with 401), anything else -ECONNREFUSED. */
int http_status_errno(int status);

#endif
