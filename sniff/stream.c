/* stream.c — sniff_stream: the first bytes of a TCP stream as a TLS ClientHello (the record
 * layer of RFC 8446 §5.1 peeled off, the handshake message reassembled from consecutive
 * handshake records) or else as an HTTP/1.x request head.
 */
#include <string.h>

#include "sniff/http_host.h"
#include "sniff/sniff.h"
#include "sniff/tls_hello.h"

#define REC_HANDSHAKE 22
#define REC_HDR 5
#define REC_MAX 16384 /* RFC 8446 §5.1: a plaintext fragment is at most 2^14 bytes */

/* The handshake bytes of the records in buf[0..len), copied into msg (cap bytes), *n of
 * them. Stops at the first incomplete record header, when msg is full, once the handshake
 * message is complete, or at a header that is not a handshake record of TLS 1.0-1.2 framing
 * (returns -1 then, after the bytes before it: whatever they decided stands, so the verdict
 * of a prefix holds for the longer ones). 0 otherwise. */
static int records(const uint8_t *buf, size_t len, uint8_t *msg, size_t cap, size_t *n)
{
	size_t pos = 0;

	*n = 0;
	while (len - pos >= REC_HDR && *n < cap) {
		const uint8_t *h = buf + pos;
		size_t rl = (size_t)h[3] << 8 | h[4], take;

		if (h[0] != REC_HANDSHAKE || h[1] != 3 || h[2] < 1 || h[2] > 3)
			return -1;
		if (rl == 0 || rl > REC_MAX)
			return -1; /* RFC 8446 §5.1: no empty handshake fragments */
		pos += REC_HDR;
		take = len - pos < rl ? len - pos : rl;
		if (take > cap - *n)
			take = cap - *n;
		memcpy(msg + *n, buf + pos, take);
		*n += take;
		pos += take;
		if (*n >= 4 && *n - 4 >= ((size_t)msg[1] << 16 | (size_t)msg[2] << 8 | msg[3]))
			break; /* the message is complete: what follows is not ours to judge */
	}
	return 0;
}

/* Early checks on a short prefix of the first record header, so that "not TLS" is known at
 * the first byte and a bad version at the third. */
static enum sniff_result tls_header_prefix(const uint8_t *buf, size_t len)
{
	if (len >= 2 && buf[1] != 3)
		return SNIFF_NONE;
	if (len >= 3 && (buf[2] < 1 || buf[2] > 3))
		return SNIFF_NONE;
	return SNIFF_NEED_MORE;
}

static enum sniff_result tls(const uint8_t *buf, size_t len, char name[SNIFF_NAME_MAX + 1])
{
	uint8_t msg[SNIFF_STREAM_MAX];
	size_t n;
	enum sniff_result res;
	int broken;

	if (len < REC_HDR)
		return tls_header_prefix(buf, len);
	broken = records(buf, len, msg, sizeof(msg), &n) < 0;
	res = tls_hello_parse(msg, n, name);
	return res == SNIFF_NEED_MORE && broken ? SNIFF_NONE : res;
}

enum sniff_result sniff_stream(const uint8_t *buf, size_t len, char name[SNIFF_NAME_MAX + 1],
			       enum sniff_proto *proto)
{
	size_t seen = len < SNIFF_STREAM_MAX ? len : SNIFF_STREAM_MAX;
	enum sniff_result res;

	*proto = SNIFF_PROTO_NONE;
	if (len == 0)
		return SNIFF_NEED_MORE;
	if (buf[0] == REC_HANDSHAKE) {
		*proto = SNIFF_PROTO_TLS;
		res = tls(buf, seen, name);
	} else if (http_host_method(buf, seen) >= 0) {
		*proto = SNIFF_PROTO_HTTP;
		res = http_host_parse(buf, seen, name);
	} else {
		return SNIFF_NONE;
	}
	if (res == SNIFF_NEED_MORE && len >= SNIFF_STREAM_MAX)
		return SNIFF_NONE;
	return res;
}
