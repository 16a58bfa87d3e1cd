/* http_codec.c — HTTP CONNECT request builder and response head parser (http_codec.h). */
#include "outbound/http_codec.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

int http_is_tchar(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
		return 1;
	return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

int http_base64(const uint8_t *in, size_t n, char *out, size_t cap)
{
	static const char al[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t o = 0;

	if (cap < 4 * ((n + 2) / 3) + 1)
		return -ENOSPC;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16;
		if (i + 1 < n)
			v |= (uint32_t)in[i + 1] << 8;
		if (i + 2 < n)
			v |= in[i + 2];
		out[o++] = al[(v >> 18) & 63];
		out[o++] = al[(v >> 12) & 63];
		out[o++] = i + 1 < n ? al[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < n ? al[v & 63] : '=';
	}
	out[o] = '\0';
	return (int)o;
}

/* Append s; false when it did not fit (room is kept for a NUL). */
static bool put(char *buf, size_t cap, size_t *off, const char *s)
{
	size_t n = strlen(s);

	if (n >= cap - *off)
		return false;
	memcpy(buf + *off, s, n + 1);
	*off += n;
	return true;
}

/* host:port, an IPv6 literal in brackets (RFC 9110 section 7.2, RFC 3986 section 3.2.2). */
static bool put_target(char *buf, size_t cap, size_t *off, const char *host, uint16_t port)
{
	char pb[8];

	snprintf(pb, sizeof(pb), ":%u", (unsigned)port);
	if (strchr(host, ':'))
		return put(buf, cap, off, "[") && put(buf, cap, off, host) &&
		       put(buf, cap, off, "]") && put(buf, cap, off, pb);
	return put(buf, cap, off, host) && put(buf, cap, off, pb);
}

static int auth_line(char *buf, size_t cap, size_t *off, const char *user, const char *pass)
{
	uint8_t cred[2 * HTTP_CRED_MAX + 1];
	char b64[4 * ((sizeof(cred) + 2) / 3) + 1];
	size_t ul = strlen(user), pl = pass ? strlen(pass) : 0;

	if (!pass || ul == 0 || pl == 0 || ul > HTTP_CRED_MAX || pl > HTTP_CRED_MAX ||
	    strchr(user, ':') || strpbrk(user, "\r\n") || strpbrk(pass, "\r\n"))
		return -EINVAL;  /* RFC 7617 section 2: the user-id cannot contain ':' */
	memcpy(cred, user, ul);
	cred[ul] = ':';
	memcpy(cred + ul + 1, pass, pl);
	if (http_base64(cred, ul + 1 + pl, b64, sizeof(b64)) < 0)
		return -EINVAL;
	return put(buf, cap, off, "Proxy-Authorization: Basic ") && put(buf, cap, off, b64) &&
			       put(buf, cap, off, "\r\n")
		       ? 0
		       : -ENOSPC;
}

int http_build_connect(char *buf, size_t cap, const char *host, uint16_t port, const char *user,
		       const char *pass, const char *extra)
{
	size_t off = 0, hl;
	int ret;

	if (!buf || !host || port == 0)
		return -EINVAL;
	hl = strlen(host);
	if (hl == 0 || hl > HTTP_HOST_MAX || strpbrk(host, " \t\r\n/[]@"))
		return -EINVAL;
	if (cap == 0)
		return -ENOSPC;
	if (!put(buf, cap, &off, "CONNECT ") || !put_target(buf, cap, &off, host, port) ||
	    !put(buf, cap, &off, " HTTP/1.1\r\nHost: ") || !put_target(buf, cap, &off, host, port) ||
	    !put(buf, cap, &off, "\r\n"))
		return -ENOSPC;
	if (user && (ret = auth_line(buf, cap, &off, user, pass)) != 0)
		return ret;
	if (extra && !put(buf, cap, &off, extra))
		return -ENOSPC;
	if (!put(buf, cap, &off, "\r\n"))
		return -ENOSPC;
	return (int)off;
}

/* The status line of one response, without its terminator: "HTTP/1.<d> <ddd>[ <reason>]".
 * complete: the whole line is here (else only a prefix, checked as far as it goes). */
static int status_line(const uint8_t *l, size_t n, bool complete, int *status)
{
	static const char ver[] = "HTTP/1.";
	size_t i;

	for (i = 0; i < n && i < 7; i++)
		if (l[i] != (uint8_t)ver[i])
			return -EPROTO;
	if (n > 7 && (l[7] < '0' || l[7] > '9'))
		return -EPROTO;
	if (n > 8 && l[8] != ' ')
		return -EPROTO;
	for (i = 9; i < n && i < 12; i++)
		if (l[i] < '0' || l[i] > '9' || (i == 9 && (l[i] < '1' || l[i] > '5')))
			return -EPROTO;
	if (n > 12 && l[12] != ' ')
		return -EPROTO;
	for (i = 13; i < n; i++)
		if (l[i] < 0x20 && l[i] != '\t')
			return -EPROTO;  /* control characters (NUL, a bare CR) in the reason */
	if (!complete)
		return 0;
	if (n < 12)
		return -EPROTO;
	*status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
	return 0;
}

/* A header field line: a token, ':' directly after it, then no control character but HTAB. */
static int field_line(const uint8_t *l, size_t n, bool complete)
{
	size_t i = 0;

	size_t j;

	while (i < n && http_is_tchar(l[i]))
		i++;
	if (i < n && (i == 0 || l[i] != ':'))
		return -EPROTO;  /* also a line starting with whitespace: obs-fold is refused */
	for (j = i; j < n; j++)
		if ((l[j] < 0x20 && l[j] != '\t') || l[j] == 0x7f)
			return -EPROTO;
	return complete && (n == 0 || i == n) ? -EPROTO : 0;
}

int http_parse_response(const uint8_t *buf, size_t len, int *status)
{
	size_t lim = len < HTTP_RESP_MAX ? len : HTTP_RESP_MAX;
	size_t start = 0, line = 0;  /* start of this response, of this line */
	int st = 0, ret;

	for (size_t i = 0; i <= lim; i++) {
		bool eol = i < lim && buf[i] == '\n';
		bool at_end = i == lim;
		size_t n;

		if (!eol && !at_end)
			continue;
		n = i - line;
		if (n > 0 && buf[line + n - 1] == '\r' && eol)
			n--;  /* CRLF; a bare LF is accepted too */
		else if (at_end && n > 0 && buf[line + n - 1] == '\r')
			n--;  /* the CR of a CRLF not yet complete */
		if (line == start)
			ret = status_line(buf + line, n, eol, &st);
		else if (eol && n == 0) {
			if (st >= 200) {
				*status = st;
				return (int)(i + 1);
			}
			start = line = i + 1;  /* an interim 1xx response: the final one follows */
			continue;
		} else
			ret = field_line(buf + line, n, eol);
		if (ret < 0)
			return ret;
		line = i + 1;
	}
	return len >= HTTP_RESP_MAX ? -EMSGSIZE : HTTP_NEED_MORE;
}

int http_status_errno(int status)
{
	if (status >= 200 && status <= 299)
		return 0;
	/* 407, and 401 from proxies that answer a wrong password so (tinyproxy): our
	 * credentials were refused. */
	return status == 407 || status == 401 ? -EACCES : -ECONNREFUSED;
}
