/* http_host.c — the Host header of an HTTP/1.x request head (RFC 9112 §3.2): the request line
 * is checked for a known method and an HTTP/1.x version, each header line for a field name
 * (RFC 9110 §5.1) and a colon; the first Host line decides.
 */
#include <string.h>
#include <strings.h>

#include "sniff/http_host.h"
#include "sniff/name.h"

static const char *const methods[] = {
	"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "CONNECT ", "OPTIONS ", "TRACE ", "PATCH ",
};

int http_host_method(const uint8_t *buf, size_t len)
{
	int maybe = 0;

	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
		size_t m = strlen(methods[i]);

		if (memcmp(buf, methods[i], len < m ? len : m) != 0)
			continue;
		if (len >= m)
			return 1;
		maybe = 1;
	}
	return maybe ? 0 : -1;
}

/* RFC 9110 §5.6.2 tchar. */
static int tchar(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* The end of the line starting at pos (the index of its LF), or -1 if no LF within len. The
 * line's content excludes a CR before that LF. */
static long line_end(const uint8_t *buf, size_t len, size_t pos)
{
	const uint8_t *lf = memchr(buf + pos, '\n', len - pos);

	return lf ? (long)(lf - buf) : -1;
}

/* "METHOD SP request-target SP HTTP/1.x": the method was checked by the caller. */
static int request_line(const uint8_t *s, size_t n)
{
	static const char ver[] = " HTTP/1.";
	size_t vl = sizeof(ver) - 1;

	if (n < vl + 1 || memcmp(s + n - vl - 1, ver, vl) != 0)
		return -1;
	if (s[n - 1] < '0' || s[n - 1] > '9')
		return -1;
	return 0;
}

/* The Host field value (OWS already trimmed): drop ":port", refuse "[v6]". */
static enum sniff_result host_value(const uint8_t *v, size_t n, char name[SNIFF_NAME_MAX + 1])
{
	size_t i;

	if (n == 0 || v[0] == '[')
		return SNIFF_NONE;
	for (i = 0; i < n && v[i] != ':'; i++)
		;
	if (i < n) {
		size_t p = i + 1;

		if (p == n || n - p > 5)
			return SNIFF_NONE;
		for (; p < n; p++)
			if (v[p] < '0' || v[p] > '9')
				return SNIFF_NONE;
	}
	return sniff_name_check(v, i, name);
}

/* One header line s[0..n) (no line end). 1: it is Host (verdict in *res), 0: another field,
 * -1: malformed. */
static int header_line(const uint8_t *s, size_t n, enum sniff_result *res,
		       char name[SNIFF_NAME_MAX + 1])
{
	size_t c = 0, a, b;

	while (c < n && tchar(s[c]))
		c++;
	if (c == 0 || c == n || s[c] != ':')
		return -1; /* no name, or whitespace before the colon (RFC 9112 §5.1) */
	if (c != 4 || strncasecmp((const char *)s, "host", 4) != 0)
		return 0;
	for (a = c + 1; a < n && (s[a] == ' ' || s[a] == '\t'); a++)
		;
	for (b = n; b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'); b--)
		;
	*res = host_value(s + a, b - a, name);
	return 1;
}

enum sniff_result http_host_parse(const uint8_t *buf, size_t len, char name[SNIFF_NAME_MAX + 1])
{
	size_t pos = 0;
	int first = 1;

	if (len == 0)
		return SNIFF_NEED_MORE;
	if (http_host_method(buf, len) != 1)
		return http_host_method(buf, len) == 0 ? SNIFF_NEED_MORE : SNIFF_NONE;
	for (;;) {
		long e = line_end(buf, len, pos);
		size_t n;
		enum sniff_result res;
		int h;

		if (e < 0)
			/* the line so far, less a CR that may precede its LF */
			return len - pos > HTTP_HOST_LINE_MAX + 1 ? SNIFF_NONE : SNIFF_NEED_MORE;
		n = (size_t)e - pos;
		if (n > 0 && buf[pos + n - 1] == '\r')
			n--;
		if (n > HTTP_HOST_LINE_MAX)
			return SNIFF_NONE;
		if (first) {
			if (request_line(buf + pos, n) != 0)
				return SNIFF_NONE;
			first = 0;
		} else if (n == 0) {
			return SNIFF_NONE; /* the end of the head, and no Host */
		} else if (buf[pos] == ' ' || buf[pos] == '\t') {
			return SNIFF_NONE; /* obs-fold (RFC 9112 §5.2) */
		} else if ((h = header_line(buf + pos, n, &res, name)) != 0) {
			return h < 0 ? SNIFF_NONE : res;
		}
		pos = (size_t)e + 1;
	}
}
