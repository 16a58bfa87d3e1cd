/* tls_hello.c — walk a ClientHello handshake message to its server_name extension
 * (RFC 8446 §4.1.2, RFC 6066 §3). The walk stops at the first fact that decides: a malformed
 * length (NONE), the end of the bytes given (NEED_MORE) or the server_name list (FOUND/NONE).
 */
#include "sniff/tls_hello.h"
#include "sniff/name.h"

#define HS_CLIENT_HELLO 1
#define EXT_SERVER_NAME 0
#define SNI_HOST_NAME 0

/* A cursor over the message: end is where the message (or the current block) says it stops,
 * have is how many of its bytes were given. have <= the message end at all times. */
struct rd {
	const uint8_t *b;
	size_t pos, have, end;
};

/* Take n bytes: 1 done, 0 not all given yet, -1 past the declared end (malformed). */
static int take(struct rd *r, size_t n, const uint8_t **p)
{
	if (n > r->end - r->pos)
		return -1;
	if (n > (r->have > r->pos ? r->have - r->pos : 0))
		return 0;
	if (p)
		*p = r->b + r->pos;
	r->pos += n;
	return 1;
}

static int take_u8(struct rd *r, size_t *v)
{
	const uint8_t *p;
	int t = take(r, 1, &p);

	if (t == 1)
		*v = p[0];
	return t;
}

static int take_u16(struct rd *r, size_t *v)
{
	const uint8_t *p;
	int t = take(r, 2, &p);

	if (t == 1)
		*v = (size_t)p[0] << 8 | p[1];
	return t;
}

static enum sniff_result verdict(int t)
{
	return t < 0 ? SNIFF_NONE : SNIFF_NEED_MORE;
}

/* The server_name extension's body, all of it given. */
static enum sniff_result server_name(const uint8_t *p, size_t n, char name[SNIFF_NAME_MAX + 1])
{
	size_t list, i;

	if (n < 2)
		return SNIFF_NONE;
	list = (size_t)p[0] << 8 | p[1];
	if (list != n - 2)
		return SNIFF_NONE; /* the list fills the extension exactly */
	for (i = 2; i < n;) {
		size_t l;

		if (n - i < 3)
			return SNIFF_NONE;
		l = (size_t)p[i + 1] << 8 | p[i + 2];
		if (l > n - i - 3)
			return SNIFF_NONE;
		if (p[i] == SNI_HOST_NAME)
			return sniff_name_check(p + i + 3, l, name); /* one host_name per RFC 6066 §3 */
		i += 3 + l;
	}
	return SNIFF_NONE;
}

/* The extensions block, r positioned at its first extension and r->end at its end. */
static enum sniff_result extensions(struct rd *r, char name[SNIFF_NAME_MAX + 1])
{
	while (r->pos < r->end) {
		const uint8_t *p;
		size_t type, n;
		int t;

		if ((t = take_u16(r, &type)) != 1 || (t = take_u16(r, &n)) != 1)
			return verdict(t);
		if ((t = take(r, n, type == EXT_SERVER_NAME ? &p : NULL)) != 1)
			return verdict(t);
		if (type == EXT_SERVER_NAME)
			return server_name(p, n, name);
	}
	return SNIFF_NONE; /* no server_name */
}

enum sniff_result tls_hello_parse(const uint8_t *msg, size_t len, char name[SNIFF_NAME_MAX + 1])
{
	struct rd r = { .b = msg };
	size_t n;
	int t;

	if (len >= 1 && msg[0] != HS_CLIENT_HELLO)
		return SNIFF_NONE;
	if (len < 4)
		return SNIFF_NEED_MORE;
	r.pos = 4;
	r.end = 4 + ((size_t)msg[1] << 16 | (size_t)msg[2] << 8 | msg[3]);
	r.have = len < r.end ? len : r.end;
	/* legacy_version and random */
	if ((t = take(&r, 2 + 32, NULL)) != 1)
		return verdict(t);
	/* legacy_session_id<0..32> */
	if ((t = take_u8(&r, &n)) != 1)
		return verdict(t);
	if (n > 32)
		return SNIFF_NONE;
	if ((t = take(&r, n, NULL)) != 1)
		return verdict(t);
	/* cipher_suites<2..2^16-2>: pairs */
	if ((t = take_u16(&r, &n)) != 1)
		return verdict(t);
	if (n < 2 || n % 2)
		return SNIFF_NONE;
	if ((t = take(&r, n, NULL)) != 1)
		return verdict(t);
	/* legacy_compression_methods<1..2^8-1> */
	if ((t = take_u8(&r, &n)) != 1)
		return verdict(t);
	if (n < 1)
		return SNIFF_NONE;
	if ((t = take(&r, n, NULL)) != 1)
		return verdict(t);
	if (r.pos == r.end)
		return SNIFF_NONE; /* a hello without extensions has no server_name */
	/* extensions<8..2^16-1>: must end where the message ends */
	if ((t = take_u16(&r, &n)) != 1)
		return verdict(t);
	if (n != r.end - r.pos)
		return SNIFF_NONE;
	return extensions(&r, name);
}
