/* test_http_codec.c — the HTTP CONNECT codec (outbound/http_codec.c): request bytes, response
 * heads split at every byte, statuses, malformed and oversize heads. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "outbound/http_codec.h"

/* Parse s whole and at every split point (every prefix in an exact-size heap copy): every
 * prefix shorter than the head is NEED_MORE or the same error; the verdict never changes. */
static int parse_all(const char *s, size_t n, int *status)
{
	int whole = http_parse_response((const uint8_t *)s, n, status), st = 0;

	for (size_t i = 0; i < n; i++) {
		uint8_t *copy = malloc(i ? i : 1);
		memcpy(copy, s, i);
		int r = http_parse_response(copy, i, &st);
		free(copy);
		if (whole > 0)
			cr_assert(r == HTTP_NEED_MORE || r == whole, "prefix %zu: %d vs %d", i, r, whole);
		else if (r != HTTP_NEED_MORE)
			cr_assert_eq(r, whole, "prefix %zu: %d vs %d", i, r, whole);
	}
	return whole;
}

Test(http_codec, request_plain_v4_v6_auth_extra)
{
	char b[HTTP_REQ_MAX];
	int n;

	n = http_build_connect(b, sizeof(b), "192.0.2.7", 443, NULL, NULL, NULL);
	cr_assert_str_eq(b, "CONNECT 192.0.2.7:443 HTTP/1.1\r\nHost: 192.0.2.7:443\r\n\r\n");
	cr_assert_eq(n, (int)strlen(b));
	n = http_build_connect(b, sizeof(b), "2001:db8::1", 80, "Aladdin", "open sesame",
			       "X-A: 1\r\n");
	cr_assert_str_eq(b, "CONNECT [2001:db8::1]:80 HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n"
			    "Proxy-Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==\r\n"
			    "X-A: 1\r\n\r\n");
	cr_assert_eq(n, (int)strlen(b));
	/* exact fit, one byte short */
	cr_assert_eq(http_build_connect(b, (size_t)n + 1, "2001:db8::1", 80, "Aladdin",
					"open sesame", "X-A: 1\r\n"), n);
	cr_assert_eq(http_build_connect(b, (size_t)n, "2001:db8::1", 80, "Aladdin", "open sesame",
					"X-A: 1\r\n"), -ENOSPC);
	cr_assert_eq(http_build_connect(b, sizeof(b), "a b", 80, NULL, NULL, NULL), -EINVAL);
	cr_assert_eq(http_build_connect(b, sizeof(b), "h", 0, NULL, NULL, NULL), -EINVAL);
	cr_assert_eq(http_build_connect(b, sizeof(b), "h", 1, "a:b", "p", NULL), -EINVAL);
	cr_assert_eq(http_build_connect(b, sizeof(b), "h", 1, "a", "", NULL), -EINVAL);
}

Test(http_codec, base64_vectors)
{
	/* RFC 4648 section 10 */
	static const char *in[] = { "", "f", "fo", "foo", "foob", "fooba", "foobar" };
	static const char *out[] = { "", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=",
				     "Zm9vYmFy" };
	char b[16];

	for (size_t i = 0; i < 7; i++) {
		cr_assert_eq(http_base64((const uint8_t *)in[i], strlen(in[i]), b, sizeof(b)),
			     (int)strlen(out[i]));
		cr_assert_str_eq(b, out[i]);
	}
	cr_assert_eq(http_base64((const uint8_t *)"foo", 3, b, 4), -ENOSPC);
}

Test(http_codec, ok_with_early_bytes_every_split)
{
	static const char r[] = "HTTP/1.1 200 Connection established\r\nVia: x\r\n\r\nEARLY";
	int st = 0, n = parse_all(r, sizeof(r) - 1, &st);

	cr_assert_eq(n, (int)(sizeof(r) - 1 - 5));
	cr_assert_eq(st, 200);
	cr_assert_eq(http_status_errno(st), 0);
	cr_assert_eq(memcmp(r + n, "EARLY", 5), 0);
}

Test(http_codec, statuses_and_versions)
{
	int st = 0;

	cr_assert_gt(parse_all("HTTP/1.0 200\r\n\r\n", 16, &st), 0);
	cr_assert_eq(st, 200);
	static const char r407[] = "HTTP/1.1 407 Proxy Authentication Required\r\n"
				   "Proxy-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0\r\n\r\n";
	cr_assert_eq(parse_all(r407, sizeof(r407) - 1, &st), (int)(sizeof(r407) - 1));
	cr_assert_eq(st, 407);
	cr_assert_eq(http_status_errno(407), -EACCES);
	cr_assert_eq(http_status_errno(401), -EACCES, "a wrong password, as tinyproxy answers it");
	cr_assert_eq(http_status_errno(403), -ECONNREFUSED);
	cr_assert_eq(http_status_errno(502), -ECONNREFUSED);
	cr_assert_eq(http_status_errno(299), 0);
	/* 2xx with a Content-Length: ignored, the head ends at the empty line */
	cr_assert_eq(parse_all("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", 38, &st), 38);
	/* bare LF line ends are accepted */
	cr_assert_eq(parse_all("HTTP/1.1 200 OK\nA: b\n\nX", 23, &st), 22);
	cr_assert_eq(st, 200);
	/* interim 1xx responses are skipped */
	static const char i1[] = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 OK\r\n\r\n";
	cr_assert_eq(parse_all(i1, sizeof(i1) - 1, &st), (int)(sizeof(i1) - 1));
	cr_assert_eq(st, 204);
}

Test(http_codec, malformed)
{
	static const char *bad[] = {
		"HTTP/2 200 OK\r\n\r\n",     "HTTP/1.1 20 OK\r\n\r\n",    "HTTP/1.1 2000\r\n\r\n",
		"HTTP/1.1 600 X\r\n\r\n",    "HTTP/1.1  200\r\n\r\n",     "http/1.1 200\r\n\r\n",
		"SSH-2.0-OpenSSH\r\n\r\n",   "\r\nHTTP/1.1 200\r\n\r\n",  "HTTP/1.1 200 O\rK\r\n\r\n",
		"HTTP/1.1 200\r\nNo colon\r\n\r\n", "HTTP/1.1 200\r\n folded: x\r\n\r\n",
		"HTTP/1.1 200\r\nA : b\r\n\r\n",    "HTTP/1.1 200\r\n: b\r\n\r\n",
		"HTTP/1.1 200\r\nA: b\x01\r\n\r\n", "HTTP/1.1 200\r\nA: b\rc\r\n\r\n",
		"HTTP/1.1 200 OK\x00\r\n\r\n", "HTTP/1.1 200\r\nNocolon\r\n\r\n",
	};
	static const size_t len[] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 19, 0 };
	int st;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t n = len[i] ? len[i] : strlen(bad[i]);
		cr_assert_eq(parse_all(bad[i], n, &st), -EPROTO, "case %zu", i);
	}
	/* an early verdict: a wrong first byte is an error at once */
	cr_assert_eq(http_parse_response((const uint8_t *)"X", 1, &st), -EPROTO);
}

Test(http_codec, oversize)
{
	size_t n = HTTP_RESP_MAX + 100;
	char *b = malloc(n);
	int st;

	memcpy(b, "HTTP/1.1 200 OK\r\n", 17);
	for (size_t i = 17; i < n; i += 10)
		memcpy(b + i, "X-Pad: aa\n", i + 10 <= n ? 10 : n - i);
	cr_assert_eq(http_parse_response((uint8_t *)b, HTTP_RESP_MAX - 1, &st), HTTP_NEED_MORE);
	cr_assert_eq(http_parse_response((uint8_t *)b, HTTP_RESP_MAX, &st), -EMSGSIZE);
	cr_assert_eq(http_parse_response((uint8_t *)b, n, &st), -EMSGSIZE);
	/* a head that ends within the bound is fine: an empty line after the last whole field
	 * line (the pad lines start at 17 + 10k) */
	memcpy(b + 17 + 10 * ((HTTP_RESP_MAX - 17) / 10 - 1), "\r\n", 2);
	int r = http_parse_response((uint8_t *)b, n, &st);
	cr_assert(r > HTTP_RESP_MAX - 20 && r <= HTTP_RESP_MAX, "r=%d", r);
	cr_assert_eq(st, 200);
	free(b);
}
