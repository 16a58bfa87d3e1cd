/* test_socks5_codec.c — outbound/socks5_codec: every message byte-exact against RFC 1928 /
 * RFC 1929, every reply parsed whole and byte by byte, malformed and odd replies, early bytes,
 * the client sequence, and a randomized comparison of the reply parser with a dumb reference.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "outbound/socks5_codec.h"
#include "testutil.h"

#define BYTES(...) ((const uint8_t[]){ __VA_ARGS__ }), sizeof((const uint8_t[]){ __VA_ARGS__ })

static void expect_bytes(const uint8_t *got, int got_len, const uint8_t *want, size_t want_len)
{
	cr_assert_eq(got_len, (int)want_len, "length %d, want %zu", got_len, want_len);
	if (memcmp(got, want, want_len) != 0) {
		tu_dump("got", got, want_len);
		tu_dump("want", want, want_len);
		cr_assert_fail("bytes differ");
	}
}

/* ---- builders ---- */

Test(socks5_build, greeting)
{
	uint8_t b[8];

	expect_bytes(b, socks5_build_greeting(b, sizeof(b), false), BYTES(0x05, 0x01, 0x00));
	expect_bytes(b, socks5_build_greeting(b, sizeof(b), true), BYTES(0x05, 0x02, 0x00, 0x02));
	cr_assert_eq(socks5_build_greeting(b, 2, false), -ENOSPC);
	cr_assert_eq(socks5_build_greeting(b, 3, true), -ENOSPC);
	cr_assert_eq(socks5_build_greeting(b, 3, false), 3);
}

Test(socks5_build, auth_exact)
{
	uint8_t b[SOCKS5_AUTH_MAX];

	expect_bytes(b, socks5_build_auth(b, sizeof(b), "user", 4, "secret", 6),
		     BYTES(0x01, 0x04, 'u', 's', 'e', 'r', 0x06, 's', 'e', 'c', 'r', 'e', 't'));
	expect_bytes(b, socks5_build_auth(b, sizeof(b), "a", 1, "b", 1),
		     BYTES(0x01, 0x01, 'a', 0x01, 'b'));
	cr_assert_eq(socks5_build_auth(b, 4, "a", 1, "b", 1), -ENOSPC);
}

Test(socks5_build, auth_limits)
{
	uint8_t b[SOCKS5_AUTH_MAX + 8];
	char u[256], p[256];

	memset(u, 'u', sizeof(u));
	memset(p, 'p', sizeof(p));
	cr_assert_eq(socks5_build_auth(b, sizeof(b), u, 255, p, 255), SOCKS5_AUTH_MAX);
	cr_assert_eq(b[0], 0x01);
	cr_assert_eq(b[1], 255);
	cr_assert_eq(b[2 + 255], 255);
	cr_assert_eq(b[3 + 255 + 254], 'p');
	cr_assert_eq(socks5_build_auth(b, sizeof(b), u, 256, p, 1), -EINVAL);
	cr_assert_eq(socks5_build_auth(b, sizeof(b), u, 1, p, 256), -EINVAL);
	cr_assert_eq(socks5_build_auth(b, sizeof(b), u, 0, p, 1), -EINVAL);
	cr_assert_eq(socks5_build_auth(b, sizeof(b), u, 1, p, 0), -EINVAL);
	cr_assert_eq(socks5_build_auth(b, SOCKS5_AUTH_MAX - 1, u, 255, p, 255), -ENOSPC);
}

Test(socks5_build, connect_ipv4)
{
	struct socks5_addr a;
	uint8_t ip[16] = { 10, 200, 1, 2 }, b[SOCKS5_REQUEST_MAX];

	cr_assert_eq(socks5_addr_ip(&a, 4, ip, 8080), 0);
	expect_bytes(b, socks5_build_connect(b, sizeof(b), &a),
		     BYTES(0x05, 0x01, 0x00, 0x01, 10, 200, 1, 2, 0x1f, 0x90));
	cr_assert_eq(socks5_build_connect(b, 9, &a), -ENOSPC);
	cr_assert_eq(socks5_build_connect(b, 10, &a), 10);
}

Test(socks5_build, connect_ipv6)
{
	struct socks5_addr a;
	uint8_t ip[16], b[SOCKS5_REQUEST_MAX];

	tu_addr(ip, "fd00:200::2");
	cr_assert_eq(socks5_addr_ip(&a, 6, ip, 443), 0);
	expect_bytes(b, socks5_build_connect(b, sizeof(b), &a),
		     BYTES(0x05, 0x01, 0x00, 0x04, 0xfd, 0x00, 0x02, 0x00, 0, 0, 0, 0, 0, 0, 0, 0,
			   0, 0, 0, 0x02, 0x01, 0xbb));
	cr_assert_eq(socks5_build_connect(b, 21, &a), -ENOSPC);
}

Test(socks5_build, connect_domain)
{
	struct socks5_addr a;
	uint8_t b[SOCKS5_REQUEST_MAX + 1];
	char name[256];

	cr_assert_eq(socks5_addr_domain(&a, "example.com", 11, 80), 0);
	expect_bytes(b, socks5_build_connect(b, sizeof(b), &a),
		     BYTES(0x05, 0x01, 0x00, 0x03, 11, 'e', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c',
			   'o', 'm', 0x00, 0x50));
	memset(name, 'x', sizeof(name));
	cr_assert_eq(socks5_addr_domain(&a, name, 255, 65535), 0);
	cr_assert_eq(socks5_build_connect(b, sizeof(b), &a), SOCKS5_REQUEST_MAX);
	cr_assert_eq(b[4], 255);
	cr_assert_eq(b[SOCKS5_REQUEST_MAX - 2], 0xff);
	cr_assert_eq(b[SOCKS5_REQUEST_MAX - 1], 0xff);
	cr_assert_eq(socks5_build_connect(b, SOCKS5_REQUEST_MAX - 1, &a), -ENOSPC);
	cr_assert_eq(socks5_addr_domain(&a, name, 256, 1), -EINVAL);
	cr_assert_eq(socks5_addr_domain(&a, name, 0, 1), -EINVAL);
	cr_assert_eq(socks5_addr_domain(&a, "a\0b", 3, 1), -EINVAL);
}

Test(socks5_build, connect_rejects_bad_addr)
{
	struct socks5_addr a;
	uint8_t ip[16] = { 0 }, b[SOCKS5_REQUEST_MAX];

	cr_assert_eq(socks5_addr_ip(&a, 5, ip, 1), -EAFNOSUPPORT);
	cr_assert_eq(socks5_addr_ip(&a, 4, ip, 1), 0);
	a.atyp = 2;
	cr_assert_eq(socks5_build_connect(b, sizeof(b), &a), -EINVAL);
	a.atyp = SOCKS5_ATYP_IPV6; /* length 4 does not fit ATYP 4 */
	cr_assert_eq(socks5_build_connect(b, sizeof(b), &a), -EINVAL);
	a.atyp = SOCKS5_ATYP_DOMAIN;
	a.len = 0;
	cr_assert_eq(socks5_build_connect(b, sizeof(b), &a), -EINVAL);
}

/* ---- parsers: a helper that checks whole delivery and byte-by-byte delivery ---- */

typedef int (*parse_fn)(const uint8_t *buf, size_t len, void *ctx);

static int pm_noauth(const uint8_t *b, size_t n, void *ctx)
{
	return socks5_parse_method(b, n, false, ctx);
}

static int pm_auth(const uint8_t *b, size_t n, void *ctx)
{
	return socks5_parse_method(b, n, true, ctx);
}

static int pa(const uint8_t *b, size_t n, void *ctx)
{
	return socks5_parse_auth_reply(b, n);
}

static int pr(const uint8_t *b, size_t n, void *ctx)
{
	return socks5_parse_reply(b, n, ctx);
}

/* Each prefix is copied into an exactly-sized heap buffer so ASan catches any over-read.
 * Every prefix shorter than `complete` must be NEED_MORE; from `complete` on the result is
 * `want` (a consumed length > 0 or an error). */
static void check_incremental(parse_fn f, void *ctx, const uint8_t *msg, size_t len,
			      size_t complete, int want)
{
	for (size_t i = 0; i <= len; i++) {
		uint8_t *copy = malloc(i ? i : 1);
		int r;

		memcpy(copy, msg, i);
		r = f(copy, i, ctx);
		free(copy);
		if (i < complete)
			cr_assert_eq(r, SOCKS5_NEED_MORE, "prefix %zu: %d, want NEED_MORE", i, r);
		else
			cr_assert_eq(r, want, "prefix %zu of %zu: %d, want %d", i, len, r, want);
	}
}

Test(socks5_parse, method_noauth)
{
	uint8_t m = 0xaa;

	check_incremental(pm_noauth, &m, BYTES(0x05, 0x00), 2, 2);
	cr_assert_eq(m, SOCKS5_METHOD_NOAUTH);
	check_incremental(pm_auth, &m, BYTES(0x05, 0x00), 2, 2);
	cr_assert_eq(m, SOCKS5_METHOD_NOAUTH);
}

Test(socks5_parse, method_userpass)
{
	uint8_t m = 0;

	check_incremental(pm_auth, &m, BYTES(0x05, 0x02), 2, 2);
	cr_assert_eq(m, SOCKS5_METHOD_USERPASS);
	/* Not offered without credentials. */
	check_incremental(pm_noauth, &m, BYTES(0x05, 0x02), 2, -EPROTO);
}

Test(socks5_parse, method_refused_and_malformed)
{
	uint8_t m;

	check_incremental(pm_auth, &m, BYTES(0x05, 0xff), 2, -EACCES);
	check_incremental(pm_noauth, &m, BYTES(0x05, 0xff), 2, -EACCES);
	check_incremental(pm_auth, &m, BYTES(0x05, 0x01), 2, -EPROTO);  /* GSSAPI: not offered */
	check_incremental(pm_auth, &m, BYTES(0x05, 0x80), 2, -EPROTO);  /* private method */
	/* A bad version is judged at the first byte. */
	check_incremental(pm_auth, &m, BYTES(0x04, 0x00), 1, -EPROTO);
	check_incremental(pm_auth, &m, BYTES('H', 'T', 'T', 'P'), 1, -EPROTO);
	/* Extra bytes are not consumed. */
	cr_assert_eq(socks5_parse_method((const uint8_t[]){ 5, 0, 5, 0, 0 }, 5, false, &m), 2);
}

Test(socks5_parse, auth_reply)
{
	check_incremental(pa, NULL, BYTES(0x01, 0x00), 2, 2);
	check_incremental(pa, NULL, BYTES(0x01, 0x01), 2, -EACCES);
	check_incremental(pa, NULL, BYTES(0x01, 0xff), 2, -EACCES);
	check_incremental(pa, NULL, BYTES(0x05, 0x00), 2, 2);       /* tolerated server bug */
	check_incremental(pa, NULL, BYTES(0x05, 0x01), 2, -EACCES);
	check_incremental(pa, NULL, BYTES(0x02, 0x00), 1, -EPROTO);
	check_incremental(pa, NULL, BYTES(0x00, 0x00), 1, -EPROTO);
}

Test(socks5_parse, reply_ipv4)
{
	static const uint8_t r[] = { 5, 0, 0, 1, 10, 0, 0, 1, 0x04, 0x38 };
	struct socks5_addr bnd;

	check_incremental(pr, &bnd, r, sizeof(r), sizeof(r), (int)sizeof(r));
	cr_assert_eq(bnd.atyp, SOCKS5_ATYP_IPV4);
	cr_assert_eq(bnd.len, 4);
	cr_assert_arr_eq(bnd.a, ((uint8_t[]){ 10, 0, 0, 1 }), 4);
	cr_assert_eq(bnd.port, 1080);
	cr_assert_eq(socks5_parse_reply(r, sizeof(r), NULL), (int)sizeof(r));
}

Test(socks5_parse, reply_ipv6)
{
	uint8_t r[22] = { 5, 0, 0, 4 };
	struct socks5_addr bnd;

	tu_addr(r + 4, "2001:db8::7");
	r[20] = 0xc3;
	r[21] = 0x50;
	check_incremental(pr, &bnd, r, sizeof(r), sizeof(r), (int)sizeof(r));
	cr_assert_eq(bnd.atyp, SOCKS5_ATYP_IPV6);
	cr_assert_eq(bnd.len, 16);
	cr_assert_arr_eq(bnd.a, r + 4, 16);
	cr_assert_eq(bnd.port, 50000);
}

Test(socks5_parse, reply_domain)
{
	static const uint8_t r[] = { 5, 0, 0, 3, 11, 'p', 'r', 'o', 'x', 'y', '.', 'l', 'o', 'c',
				     'a', 'l', 0, 80 };
	struct socks5_addr bnd;

	check_incremental(pr, &bnd, r, sizeof(r), sizeof(r), (int)sizeof(r));
	cr_assert_eq(bnd.atyp, SOCKS5_ATYP_DOMAIN);
	cr_assert_eq(bnd.len, 11);
	cr_assert_arr_eq(bnd.a, "proxy.local", 11);
	cr_assert_eq(bnd.port, 80);
}

/* BND.ADDR is whatever the server likes (tun2socks #232): never a reason to fail. */
Test(socks5_parse, reply_odd_bnd)
{
	static const uint8_t zero4[] = { 5, 0, 0, 1, 0, 0, 0, 0, 0, 0 };
	static const uint8_t lo4[] = { 5, 0, 0, 1, 127, 0, 0, 1, 0x1f, 0x90 };
	static const uint8_t bcast[] = { 5, 0, 0, 1, 255, 255, 255, 255, 255, 255 };
	static const uint8_t empty_domain[] = { 5, 0, 0, 3, 0, 0, 0 };
	static const uint8_t rsv_garbage[] = { 5, 0, 0x7e, 1, 1, 2, 3, 4, 0, 1 };
	uint8_t zero6[22] = { 5, 0, 0, 4 }, dom255[4 + 1 + 255 + 2] = { 5, 0, 0, 3, 255 };
	struct socks5_addr bnd;

	check_incremental(pr, &bnd, zero4, sizeof(zero4), sizeof(zero4), (int)sizeof(zero4));
	cr_assert_eq(bnd.port, 0);
	check_incremental(pr, &bnd, lo4, sizeof(lo4), sizeof(lo4), (int)sizeof(lo4));
	check_incremental(pr, &bnd, bcast, sizeof(bcast), sizeof(bcast), (int)sizeof(bcast));
	check_incremental(pr, &bnd, zero6, sizeof(zero6), sizeof(zero6), (int)sizeof(zero6));
	check_incremental(pr, &bnd, empty_domain, sizeof(empty_domain), sizeof(empty_domain),
			  (int)sizeof(empty_domain));
	cr_assert_eq(bnd.len, 0);
	memset(dom255 + 5, 0xC3, 255);  /* not even text */
	check_incremental(pr, &bnd, dom255, sizeof(dom255), sizeof(dom255), (int)sizeof(dom255));
	cr_assert_eq(bnd.len, 255);
	check_incremental(pr, &bnd, rsv_garbage, sizeof(rsv_garbage), sizeof(rsv_garbage),
			  (int)sizeof(rsv_garbage));
}

Test(socks5_parse, reply_codes)
{
	static const struct {
		uint8_t rep;
		int err;
	} map[] = {
		{ 0x01, -EPROTO }, { 0x02, -EACCES }, { 0x03, -ENETUNREACH },
		{ 0x04, -EHOSTUNREACH }, { 0x05, -ECONNREFUSED }, { 0x06, -ETIMEDOUT },
		{ 0x07, -EPROTO }, { 0x08, -EPROTO }, { 0x09, -EPROTO }, { 0xff, -EPROTO },
	};

	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
		uint8_t r[10] = { 5, map[i].rep, 0, 1, 0, 0, 0, 0, 0, 0 };

		cr_assert_eq(socks5_reply_errno(map[i].rep), map[i].err);
		/* Reported from the second byte on: the rest of a failure reply is irrelevant. */
		check_incremental(pr, NULL, r, sizeof(r), 2, map[i].err);
	}
	cr_assert_eq(socks5_reply_errno(0), 0);
}

Test(socks5_parse, reply_malformed)
{
	static const uint8_t badver[] = { 4, 0, 0, 1, 0, 0, 0, 0, 0, 0 };
	static const uint8_t http[] = { 'H', 'T', 'T', 'P', '/', '1', '.', '1' };

	check_incremental(pr, NULL, badver, sizeof(badver), 1, -EPROTO);
	check_incremental(pr, NULL, http, sizeof(http), 1, -EPROTO);
	for (unsigned atyp = 0; atyp < 256; atyp++) {
		uint8_t r[30] = { 5, 0, 0, (uint8_t)atyp, 4 };

		if (atyp == 1 || atyp == 3 || atyp == 4)
			continue;
		check_incremental(pr, NULL, r, sizeof(r), 4, -EPROTO);
	}
}

/* A domain length pointing past the bytes delivered is NEED_MORE, never a read beyond them
 * (check_incremental's exact-size heap copies make ASan watch every prefix). */
Test(socks5_parse, reply_domain_length_overrun)
{
	uint8_t r[40] = { 5, 0, 0, 3, 255 };

	check_incremental(pr, NULL, r, sizeof(r), sizeof(r) + 1, 0);
	r[4] = 36;  /* needs 4 + 1 + 36 + 2 = 43 bytes: still short by 3 */
	check_incremental(pr, NULL, r, sizeof(r), sizeof(r) + 1, 0);
	r[4] = 33;  /* exactly 40 */
	check_incremental(pr, NULL, r, sizeof(r), sizeof(r), 40);
}

Test(socks5_parse, early_bytes_not_consumed)
{
	uint8_t r[10 + 5] = { 5, 0, 0, 1, 127, 0, 0, 1, 0, 80, 'H', 'E', 'L', 'L', 'O' };
	uint8_t d[7 + 3 + 4] = { 5, 0, 0, 3, 3, 'a', 'b', 'c', 1, 0, 0xde, 0xad, 0xbe, 0xef };

	for (size_t extra = 0; extra <= 5; extra++)
		cr_assert_eq(socks5_parse_reply(r, 10 + extra, NULL), 10);
	for (size_t extra = 0; extra <= 4; extra++)
		cr_assert_eq(socks5_parse_reply(d, 10 + extra, NULL), 10);
	/* Early bytes that look like another reply are still not touched. */
	memcpy(r + 10, (uint8_t[]){ 5, 1, 0, 1, 0 }, 5);
	cr_assert_eq(socks5_parse_reply(r, sizeof(r), NULL), 10);
}

/* ---- the client sequence ---- */

/* Feed `in` to c one byte at a time, the way a trickling server would deliver it, collecting
 * requests into out. Returns the last non-NEED_MORE result; *used is the bytes consumed. */
static int feed_bytewise(struct socks5_client *c, const uint8_t *in, size_t len, uint8_t *out,
			 size_t *out_total, size_t *used)
{
	uint8_t buf[1024], req[SOCKS5_AUTH_MAX];
	size_t have = 0, pos = 0, req_len;
	int r = SOCKS5_NEED_MORE;

	*used = 0;
	*out_total = 0;
	while (pos < len && c->state != SOCKS5_CL_DONE) {
		buf[have++] = in[pos++];
		r = socks5_client_input(c, buf, have, req, sizeof(req), &req_len);
		if (r < 0)
			return r;
		if (r == SOCKS5_NEED_MORE)
			continue;
		cr_assert_eq((size_t)r, have, "a message ends exactly where its last byte arrived");
		memcpy(out + *out_total, req, req_len);
		*out_total += req_len;
		*used += have;
		have = 0;
	}
	return r;
}

static void dst_v4(struct socks5_addr *a)
{
	uint8_t ip[16] = { 198, 51, 100, 7 };

	cr_assert_eq(socks5_addr_ip(a, 4, ip, 443), 0);
}

Test(socks5_client, noauth_sequence)
{
	struct socks5_client c;
	struct socks5_addr dst;
	uint8_t out[SOCKS5_AUTH_MAX];
	static const uint8_t server[] = { 5, 0, /* method */ 5, 0, 0, 1, 0, 0, 0, 0, 0, 0,
					  'e', 'a', 'r', 'l', 'y' };
	size_t out_len;

	dst_v4(&dst);
	expect_bytes(out, socks5_client_start(&c, &dst, NULL, NULL, out, sizeof(out)),
		     BYTES(5, 1, 0));
	cr_assert_eq(c.state, SOCKS5_CL_METHOD);
	cr_assert_eq(socks5_client_input(&c, server, 1, out, sizeof(out), &out_len), 0);
	cr_assert_eq(out_len, 0);
	cr_assert_eq(socks5_client_input(&c, server, sizeof(server), out, sizeof(out), &out_len), 2);
	expect_bytes(out, (int)out_len, BYTES(5, 1, 0, 1, 198, 51, 100, 7, 0x01, 0xbb));
	cr_assert_eq(c.state, SOCKS5_CL_REPLY);
	cr_assert_eq(socks5_client_input(&c, server + 2, sizeof(server) - 2, out, sizeof(out),
					 &out_len), 10);
	cr_assert_eq(out_len, 0);
	cr_assert_eq(c.state, SOCKS5_CL_DONE);
	/* Early bytes: everything after the consumed 2 + 10. */
	cr_assert_eq(sizeof(server) - 12, 5);
	cr_assert_eq(socks5_client_input(&c, server, 2, out, sizeof(out), &out_len), -EALREADY);
}

Test(socks5_client, auth_sequence_bytewise)
{
	struct socks5_client c;
	struct socks5_addr dst;
	uint8_t out[2048];
	static const uint8_t server[] = { 5, 2, /* method */ 1, 0, /* auth ok */
					  5, 0, 0, 3, 4, 'h', 'o', 's', 't', 0x12, 0x34 };
	size_t out_total, used;

	dst_v4(&dst);
	expect_bytes(out, socks5_client_start(&c, &dst, "alice", "pw", out, sizeof(out)),
		     BYTES(5, 2, 0, 2));
	cr_assert_eq(feed_bytewise(&c, server, sizeof(server), out, &out_total, &used),
		     (int)sizeof(server) - 4);
	cr_assert_eq(c.state, SOCKS5_CL_DONE);
	cr_assert_eq(used, sizeof(server));
	expect_bytes(out, (int)out_total,
		     BYTES(1, 5, 'a', 'l', 'i', 'c', 'e', 2, 'p', 'w',
			   5, 1, 0, 1, 198, 51, 100, 7, 0x01, 0xbb));
	cr_assert_eq(c.bnd.atyp, SOCKS5_ATYP_DOMAIN);
	cr_assert_eq(c.bnd.port, 0x1234);
}

Test(socks5_client, credentials_offered_but_not_needed)
{
	struct socks5_client c;
	struct socks5_addr dst;
	uint8_t out[SOCKS5_AUTH_MAX];
	size_t out_len;

	dst_v4(&dst);
	cr_assert_eq(socks5_client_start(&c, &dst, "u", "p", out, sizeof(out)), 4);
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 5, 0 }, 2, out, sizeof(out), &out_len), 2);
	cr_assert_eq(c.state, SOCKS5_CL_REPLY);  /* straight to CONNECT */
	cr_assert_eq(out[0], 5);
	cr_assert_eq(out[1], SOCKS5_CMD_CONNECT);
}

Test(socks5_client, auth_failure_is_sticky)
{
	struct socks5_client c;
	struct socks5_addr dst;
	uint8_t out[SOCKS5_AUTH_MAX];
	size_t out_len;

	dst_v4(&dst);
	cr_assert_eq(socks5_client_start(&c, &dst, "u", "bad", out, sizeof(out)), 4);
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 5, 2 }, 2, out, sizeof(out), &out_len), 2);
	cr_assert_eq(c.state, SOCKS5_CL_AUTH);
	expect_bytes(out, (int)out_len, BYTES(1, 1, 'u', 3, 'b', 'a', 'd'));
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 1, 1 }, 2, out, sizeof(out), &out_len),
		     -EACCES);
	cr_assert_eq(c.state, SOCKS5_CL_FAILED);
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 1, 0 }, 2, out, sizeof(out), &out_len),
		     -EACCES);
}

Test(socks5_client, stage_errors)
{
	struct socks5_client c;
	struct socks5_addr dst;
	uint8_t out[SOCKS5_AUTH_MAX];
	size_t out_len;

	dst_v4(&dst);
	cr_assert_eq(socks5_client_start(&c, &dst, NULL, NULL, out, sizeof(out)), 3);
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 5, 0xff }, 2, out, sizeof(out), &out_len),
		     -EACCES);
	cr_assert_eq(socks5_client_start(&c, &dst, NULL, NULL, out, sizeof(out)), 3);
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 5, 0 }, 2, out, sizeof(out), &out_len), 2);
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 5, 5 }, 2, out, sizeof(out), &out_len),
		     -ECONNREFUSED);
	cr_assert_eq(c.err, -ECONNREFUSED);
	/* Too small an output buffer for the next request fails cleanly. */
	cr_assert_eq(socks5_client_start(&c, &dst, NULL, NULL, out, sizeof(out)), 3);
	cr_assert_eq(socks5_client_input(&c, (uint8_t[]){ 5, 0 }, 2, out, 5, &out_len), -ENOSPC);
}

Test(socks5_client, start_validates)
{
	struct socks5_client c;
	struct socks5_addr dst;
	uint8_t out[SOCKS5_AUTH_MAX];
	char long_cred[300];

	dst_v4(&dst);
	memset(long_cred, 'x', sizeof(long_cred) - 1);
	long_cred[sizeof(long_cred) - 1] = '\0';
	cr_assert_eq(socks5_client_start(&c, &dst, "u", NULL, out, sizeof(out)), -EINVAL);
	cr_assert_eq(socks5_client_start(&c, &dst, "", "p", out, sizeof(out)), -EINVAL);
	cr_assert_eq(socks5_client_start(&c, &dst, long_cred, "p", out, sizeof(out)), -EINVAL);
	cr_assert_eq(socks5_client_start(&c, &dst, NULL, NULL, out, 2), -ENOSPC);
	dst.atyp = 9;
	cr_assert_eq(socks5_client_start(&c, &dst, NULL, NULL, out, sizeof(out)), -EINVAL);
	cr_assert_eq(c.state, SOCKS5_CL_FAILED);
}

/* ---- randomized: the reply parser against a dumb reference ---- */

/* The reference states the rules as plainly as possible, without sharing code. */
static int ref_reply(const uint8_t *b, size_t n)
{
	static const int errs[256] = {
		[1] = -EPROTO, [2] = -EACCES, [3] = -ENETUNREACH, [4] = -EHOSTUNREACH,
		[5] = -ECONNREFUSED, [6] = -ETIMEDOUT,
	};
	size_t need;

	if (n == 0)
		return 0;
	if (b[0] != 5)
		return -EPROTO;
	if (n == 1)
		return 0;
	if (b[1] != 0)
		return errs[b[1]] ? errs[b[1]] : -EPROTO;
	if (n < 4)
		return 0;
	if (b[3] == 1)
		need = 10;
	else if (b[3] == 4)
		need = 22;
	else if (b[3] == 3)
		need = n < 5 ? 5 : 7 + (size_t)b[4];
	else
		return -EPROTO;
	return n < need ? 0 : (int)need;
}

Test(socks5_parse, random_vs_reference)
{
	struct tu_rng rng;
	uint8_t buf[300];

	tu_rng_seed(&rng, 0x5a5a);
	for (int iter = 0; iter < 200000; iter++) {
		size_t n = tu_rand_below(&rng, sizeof(buf) + 1);

		tu_rand_bytes(&rng, buf, n);
		/* Bias toward plausible replies so the deep paths get exercised. */
		if (n > 0 && !tu_rand_chance(&rng, 8))
			buf[0] = 5;
		if (n > 1 && !tu_rand_chance(&rng, 4))
			buf[1] = 0;
		if (n > 3 && !tu_rand_chance(&rng, 8))
			buf[3] = (uint8_t[]){ 1, 3, 4 }[tu_rand_below(&rng, 3)];
		if (n > 4 && buf[3] == 3 && tu_rand_chance(&rng, 2))
			buf[4] = (uint8_t)tu_rand_below(&rng, 40);
		cr_assert_eq(socks5_parse_reply(buf, n, NULL), ref_reply(buf, n), "iteration %d", iter);
	}
}

/* ---- UDP ASSOCIATE ---- */

static struct socks5_addr ip4(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint16_t port)
{
	struct socks5_addr r;
	uint8_t ip[4] = { a, b, c, d };

	cr_assert_eq(socks5_addr_ip(&r, 4, ip, port), 0);
	return r;
}

/* 2001:db8::last, or ::ffff:mapped4.0.0.last when mapped4 != 0. */
static struct socks5_addr ip6(uint8_t mapped4, uint8_t last, uint16_t port)
{
	struct socks5_addr r;
	uint8_t ip[16] = { 0x20, 0x01, 0x0d, 0xb8 };

	if (mapped4) {
		memset(ip, 0, 10);
		ip[10] = ip[11] = 0xff;
		ip[12] = mapped4;
	}
	ip[15] = last;
	cr_assert_eq(socks5_addr_ip(&r, 6, ip, port), 0);
	return r;
}

static struct socks5_addr ip6_raw(const uint8_t ip[16], uint16_t port)
{
	struct socks5_addr r;

	cr_assert_eq(socks5_addr_ip(&r, 6, ip, port), 0);
	return r;
}

static void expect_addr(const struct socks5_addr *got, const struct socks5_addr *want)
{
	cr_assert_eq(got->atyp, want->atyp);
	cr_assert_eq(got->len, want->len);
	cr_assert_eq(got->port, want->port, "port %u, want %u", got->port, want->port);
	cr_assert_eq(memcmp(got->a, want->a, want->len), 0, "address differs");
}

Test(socks5_udp, associate_request)
{
	uint8_t b[SOCKS5_REQUEST_MAX], zero6[16] = { 0 };
	struct socks5_addr a;

	expect_bytes(b, socks5_build_udp_associate(b, sizeof(b), NULL),
		     BYTES(0x05, 0x03, 0x00, 0x01, 0, 0, 0, 0, 0, 0));
	a = ip6_raw(zero6, 0);
	expect_bytes(b, socks5_build_udp_associate(b, sizeof(b), &a),
		     BYTES(0x05, 0x03, 0x00, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			   0, 0, 0));
	a = ip4(192, 0, 2, 7, 5353);
	expect_bytes(b, socks5_build_udp_associate(b, sizeof(b), &a),
		     BYTES(0x05, 0x03, 0x00, 0x01, 192, 0, 2, 7, 0x14, 0xe9));
	cr_assert_eq(socks5_addr_domain(&a, "h.example", 9, 53), 0);
	expect_bytes(b, socks5_build_udp_associate(b, sizeof(b), &a),
		     BYTES(0x05, 0x03, 0x00, 0x03, 9, 'h', '.', 'e', 'x', 'a', 'm', 'p', 'l', 'e',
			   0x00, 0x35));
	cr_assert_eq(socks5_build_udp_associate(b, 9, NULL), -ENOSPC);
	a.len = 0;
	cr_assert_eq(socks5_build_udp_associate(b, sizeof(b), &a), -EINVAL);
	/* The shared builder: CONNECT is unchanged, BIND (0x02) and others refused. */
	a = ip4(10, 0, 0, 1, 80);
	expect_bytes(b, socks5_build_request(b, sizeof(b), SOCKS5_CMD_CONNECT, &a),
		     BYTES(0x05, 0x01, 0x00, 0x01, 10, 0, 0, 1, 0x00, 0x50));
	cr_assert_eq(socks5_build_request(b, sizeof(b), 0x02, &a), -EINVAL);
	cr_assert_eq(socks5_build_request(b, sizeof(b), 0x00, &a), -EINVAL);
}

Test(socks5_udp, associate_reply_gives_bnd)
{
	static const uint8_t r4[] = { 0x05, 0x00, 0x00, 0x01, 198, 51, 100, 9, 0x9c, 0x40, 0xaa };
	static const uint8_t rd[] = { 0x05, 0x00, 0x00, 0x03, 5, 'r', 'e', 'l', 'a', 'y', 0x04, 0x38 };
	struct socks5_addr bnd, want = ip4(198, 51, 100, 9, 40000);

	/* The reply parser is shared with CONNECT: BND is the relay, trailing bytes not eaten. */
	cr_assert_eq(socks5_parse_reply(r4, sizeof(r4), &bnd), 10);
	expect_addr(&bnd, &want);
	cr_assert_eq(socks5_parse_reply(rd, sizeof(rd), &bnd), (int)sizeof(rd));
	cr_assert_eq(socks5_addr_domain(&want, "relay", 5, 1080), 0);
	expect_addr(&bnd, &want);
	/* 0x07 command not supported: a server without UDP ASSOCIATE. */
	cr_assert_eq(socks5_parse_reply(BYTES(0x05, 0x07), NULL), -EPROTO);
}

/* The quirks table of socks5_udp_relay_endpoint. */
Test(socks5_udp, relay_endpoint_rules)
{
	static const uint8_t any6[16] = { 0 }, lo6[16] = { [15] = 1 };
	static const uint8_t mapped0[16] = { [10] = 0xff, [11] = 0xff };
	struct socks5_addr s4 = ip4(203, 0, 113, 5, 1080), s6 = ip6(0, 5, 1080);
	struct socks5_addr lo4srv = ip4(127, 0, 0, 1, 1080), lo6srv = ip6_raw(lo6, 1080);
	struct socks5_addr relay, bnd, want, dom;
	const struct {
		const char *what;
		struct socks5_addr bnd, server, want;
	} rows[] = {
		{ "plain v4", ip4(203, 0, 113, 6, 4000), s4, ip4(203, 0, 113, 6, 4000) },
		{ "plain v6", ip6(0, 6, 4000), s6, ip6(0, 6, 4000) },
		{ "0.0.0.0 -> server", ip4(0, 0, 0, 0, 4000), s4, ip4(203, 0, 113, 5, 4000) },
		{ ":: -> server", ip6_raw(any6, 4000), s6, ip6(0, 5, 4000) },
		{ "0.0.0.0 from v6 server", ip4(0, 0, 0, 0, 4000), s6, ip6(0, 5, 4000) },
		{ ":: from v4 server", ip6_raw(any6, 4000), s4, ip4(203, 0, 113, 5, 4000) },
		{ "127.0.0.1 remote", ip4(127, 0, 0, 1, 4000), s4, ip4(203, 0, 113, 5, 4000) },
		{ "127.9.9.9 remote", ip4(127, 9, 9, 9, 4000), s4, ip4(203, 0, 113, 5, 4000) },
		{ "::1 remote", ip6_raw(lo6, 4000), s6, ip6(0, 5, 4000) },
		{ "::1 from v4 server", ip6_raw(lo6, 4000), s4, ip4(203, 0, 113, 5, 4000) },
		{ "mapped 127 remote", ip6(127, 1, 4000), s6, ip6(0, 5, 4000) },
		{ "127.0.0.1 local", ip4(127, 0, 0, 1, 4000), lo4srv, ip4(127, 0, 0, 1, 4000) },
		{ "127.0.0.2 local", ip4(127, 0, 0, 2, 4000), lo4srv, ip4(127, 0, 0, 2, 4000) },
		{ "::1 local", ip6_raw(lo6, 4000), lo6srv, ip6_raw(lo6, 4000) },
		{ "127.0.0.1 via ::1", ip4(127, 0, 0, 1, 4000), lo6srv, ip4(127, 0, 0, 1, 4000) },
		{ "v4 BND, v6 server", ip4(198, 51, 100, 1, 4000), s6, ip4(198, 51, 100, 1, 4000) },
		{ "v6 BND, v4 server", ip6(0, 9, 4000), s4, ip6(0, 9, 4000) },
		{ "0.0.0.0 local", ip4(0, 0, 0, 0, 4000), lo4srv, ip4(127, 0, 0, 1, 4000) },
		/* IPv4-mapped: the IPv4 address it carries, then the rules above. */
		{ "mapped plain", ip6(198, 7, 4000), s6, ip4(198, 0, 0, 7, 4000) },
		{ "mapped 127 local", ip6(127, 1, 4000), lo4srv, ip4(127, 0, 0, 1, 4000) },
		{ "mapped 127 via ::1", ip6(127, 1, 4000), lo6srv, ip4(127, 0, 0, 1, 4000) },
		{ "mapped zero", ip6_raw(mapped0, 4000), s4, ip4(203, 0, 113, 5, 4000) },
		{ "mapped zero, v6 server", ip6_raw(mapped0, 4000), s6, ip6(0, 5, 4000) },
		{ "mapped 127 from a mapped server", ip6(127, 1, 4000), ip6(198, 7, 1080),
		  ip4(198, 0, 0, 7, 4000) },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		memset(&relay, 0xee, sizeof(relay));
		cr_assert_eq(socks5_udp_relay_endpoint(&rows[i].bnd, &rows[i].server, &relay), 0,
			     "%s", rows[i].what);
		cr_assert_eq(relay.atyp, rows[i].want.atyp, "%s", rows[i].what);
		cr_assert_eq(relay.port, rows[i].want.port, "%s", rows[i].what);
		cr_assert_eq(memcmp(relay.a, rows[i].want.a, rows[i].want.len), 0, "%s",
			     rows[i].what);
	}
	/* A domain BND is kept for the caller to resolve. */
	cr_assert_eq(socks5_addr_domain(&dom, "relay.example", 13, 7000), 0);
	cr_assert_eq(socks5_udp_relay_endpoint(&dom, &s4, &relay), 0);
	expect_addr(&relay, &dom);
	/* Port 0, an empty domain, a bad length: -EPROTO; a server that is not an IP: -EINVAL. */
	bnd = ip4(203, 0, 113, 6, 0);
	cr_assert_eq(socks5_udp_relay_endpoint(&bnd, &s4, &relay), -EPROTO);
	bnd = ip4(0, 0, 0, 0, 0);
	cr_assert_eq(socks5_udp_relay_endpoint(&bnd, &s4, &relay), -EPROTO);
	want = dom;
	want.len = 0;
	cr_assert_eq(socks5_udp_relay_endpoint(&want, &s4, &relay), -EPROTO);
	want = ip4(1, 2, 3, 4, 5);
	want.len = 16;
	cr_assert_eq(socks5_udp_relay_endpoint(&want, &s4, &relay), -EPROTO);
	bnd = ip4(203, 0, 113, 6, 4000);
	cr_assert_eq(socks5_udp_relay_endpoint(&bnd, &dom, &relay), -EINVAL);
}

Test(socks5_udp, build_each_atyp)
{
	uint8_t b[SOCKS5_UDP_HDR_MAX + 16];
	struct socks5_addr a = ip4(192, 0, 2, 1, 53);
	static const uint8_t v6[16] = { 0x20, 0x01, 0x0d, 0xb8, [15] = 0x42 };

	cr_assert_eq(socks5_udp_header_len(&a), SOCKS5_UDP_HDR_MIN);
	expect_bytes(b, socks5_udp_build(b, sizeof(b), &a, (const uint8_t *)"hi", 2),
		     BYTES(0, 0, 0, 0x01, 192, 0, 2, 1, 0x00, 0x35, 'h', 'i'));
	a = ip6_raw(v6, 443);
	cr_assert_eq(socks5_udp_header_len(&a), 22);
	expect_bytes(b, socks5_udp_build(b, sizeof(b), &a, NULL, 0),
		     BYTES(0, 0, 0, 0x04, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			   0x42, 0x01, 0xbb));
	cr_assert_eq(socks5_addr_domain(&a, "a.io", 4, 123), 0);
	expect_bytes(b, socks5_udp_build(b, sizeof(b), &a, (const uint8_t *)"x", 1),
		     BYTES(0, 0, 0, 0x03, 4, 'a', '.', 'i', 'o', 0x00, 0x7b, 'x'));
}

Test(socks5_udp, build_limits)
{
	static uint8_t big[SOCKS5_UDP_DGRAM_MAX + 8];
	uint8_t b[SOCKS5_UDP_HDR_MAX + 4];
	char name[256];
	struct socks5_addr a;

	memset(name, 'n', sizeof(name));
	cr_assert_eq(socks5_addr_domain(&a, name, 255, 65535), 0);
	cr_assert_eq(socks5_udp_header_len(&a), SOCKS5_UDP_HDR_MAX);
	cr_assert_eq(socks5_udp_build(b, SOCKS5_UDP_HDR_MAX, &a, NULL, 0), SOCKS5_UDP_HDR_MAX);
	cr_assert_eq(b[4], 255);
	cr_assert_eq(b[4 + 255], 'n');
	cr_assert_eq(b[SOCKS5_UDP_HDR_MAX - 2], 0xff);
	cr_assert_eq(b[SOCKS5_UDP_HDR_MAX - 1], 0xff);
	cr_assert_eq(socks5_udp_build(b, SOCKS5_UDP_HDR_MAX - 1, &a, NULL, 0), -ENOSPC);
	cr_assert_eq(socks5_udp_build(b, SOCKS5_UDP_HDR_MAX, &a, (const uint8_t *)"p", 1),
		     -ENOSPC);
	/* The whole datagram fits one UDP payload, not one byte more. */
	a = ip4(192, 0, 2, 1, 53);
	cr_assert_eq(socks5_udp_build(big, sizeof(big), &a, big + 10,
				      SOCKS5_UDP_DGRAM_MAX - 10), SOCKS5_UDP_DGRAM_MAX);
	cr_assert_eq(socks5_udp_build(big, sizeof(big), &a, big + 10,
				      SOCKS5_UDP_DGRAM_MAX - 9), -EMSGSIZE);
	/* Invalid destinations. */
	a.atyp = 0x02;
	cr_assert_eq(socks5_udp_header_len(&a), -EINVAL);
	cr_assert_eq(socks5_udp_build(b, sizeof(b), &a, NULL, 0), -EINVAL);
	a = ip4(1, 2, 3, 4, 5);
	a.len = 3;
	cr_assert_eq(socks5_udp_build(b, sizeof(b), &a, NULL, 0), -EINVAL);
	cr_assert_eq(socks5_addr_domain(&a, "x", 1, 1), 0);
	a.len = 0;
	cr_assert_eq(socks5_udp_build(b, sizeof(b), &a, NULL, 0), -EINVAL);
}

/* The payload may already be in the buffer: right after the header's room, or at its start. */
Test(socks5_udp, build_payload_in_place)
{
	uint8_t b[64];
	struct socks5_addr a = ip4(10, 1, 2, 3, 9);

	memcpy(b + SOCKS5_UDP_HDR_MIN, "payload", 7);
	cr_assert_eq(socks5_udp_build(b, sizeof(b), &a, b + SOCKS5_UDP_HDR_MIN, 7),
		     SOCKS5_UDP_HDR_MIN + 7);
	cr_assert_eq(memcmp(b + SOCKS5_UDP_HDR_MIN, "payload", 7), 0);
	cr_assert_eq(b[3], 0x01);
	memcpy(b, "overlapping", 11);
	cr_assert_eq(socks5_udp_build(b, sizeof(b), &a, b, 11), SOCKS5_UDP_HDR_MIN + 11);
	cr_assert_eq(memcmp(b + SOCKS5_UDP_HDR_MIN, "overlapping", 11), 0);
	cr_assert_eq(b[4], 10);
	cr_assert_eq(b[9], 9);
}

/* Parse dg in an exactly-sized heap copy (ASan sees any over-read). */
static int parse_copy(const uint8_t *dg, size_t len, struct socks5_udp_dgram *d)
{
	uint8_t *copy = malloc(len ? len : 1);
	int r;

	memcpy(copy, dg, len);
	r = socks5_udp_parse(copy, len, d);
	if (r == 0)
		d->payload = dg + (d->payload - copy);  /* rebase before the copy goes */
	free(copy);
	return r;
}

/* Parse a well-formed datagram; every prefix shorter than its header is ETRUNC. */
static void check_parse(const uint8_t *dg, size_t len, size_t hdr_len,
			const struct socks5_addr *want)
{
	struct socks5_udp_dgram d;

	for (size_t i = 0; i < hdr_len; i++)
		cr_assert_eq(parse_copy(dg, i, &d), SOCKS5_UDP_ETRUNC, "prefix %zu", i);
	for (size_t i = hdr_len; i <= len; i++) {
		memset(&d, 0xee, sizeof(d));
		cr_assert_eq(parse_copy(dg, i, &d), 0, "prefix %zu", i);
		cr_assert_eq(d.hdr_len, hdr_len);
		cr_assert_eq(d.payload, dg + hdr_len);
		cr_assert_eq(d.payload_len, i - hdr_len);
		expect_addr(&d.src, want);
	}
}

Test(socks5_udp, parse_each_atyp)
{
	static const uint8_t d4[] = { 0, 0, 0, 1, 8, 8, 4, 4, 0, 53, 'a', 'n', 's' };
	static const uint8_t d6[] = { 0, 0, 0, 4, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0,
				      0, 0, 0, 7, 0x01, 0xbb, 'z' };
	static const uint8_t dd[] = { 0, 0, 0, 3, 3, 'a', '.', 'b', 0x1f, 0x90, 1, 2 };
	static const uint8_t v6[16] = { 0x20, 0x01, 0x0d, 0xb8, [15] = 7 };
	struct socks5_addr want = ip4(8, 8, 4, 4, 53);

	check_parse(d4, sizeof(d4), 10, &want);
	want = ip6_raw(v6, 443);
	check_parse(d6, sizeof(d6), 22, &want);
	cr_assert_eq(socks5_addr_domain(&want, "a.b", 3, 8080), 0);
	check_parse(dd, sizeof(dd), 10, &want);
}

Test(socks5_udp, parse_max_name)
{
	uint8_t dg[SOCKS5_UDP_HDR_MAX + 3];
	char name[255];
	struct socks5_addr want;

	memset(name, 'q', sizeof(name));
	cr_assert_eq(socks5_addr_domain(&want, name, 255, 1), 0);
	cr_assert_eq(socks5_udp_build(dg, sizeof(dg), &want, (const uint8_t *)"abc", 3),
		     (int)sizeof(dg));
	check_parse(dg, sizeof(dg), SOCKS5_UDP_HDR_MAX, &want);
	/* A length octet of 255 with only part of the name present. */
	cr_assert_eq(parse_copy(dg, 4 + 1 + 100, &(struct socks5_udp_dgram){ 0 }),
		     SOCKS5_UDP_ETRUNC);
}

Test(socks5_udp, parse_refusals)
{
	struct socks5_udp_dgram d;
	uint8_t dg[] = { 0, 0, 0, 1, 1, 2, 3, 4, 0, 80 };

	for (int v = 1; v < 256; v++) {
		dg[2] = (uint8_t)v;
		cr_assert_eq(parse_copy(dg, sizeof(dg), &d), SOCKS5_UDP_EFRAG, "FRAG %d", v);
		/* FRAG is judged before the address: a fragment with a short address too. */
		cr_assert_eq(parse_copy(dg, 4, &d), SOCKS5_UDP_EFRAG);
	}
	dg[2] = 0;
	dg[0] = 1;
	cr_assert_eq(parse_copy(dg, sizeof(dg), &d), SOCKS5_UDP_ERSV);
	dg[0] = 0;
	dg[1] = 0x80;
	cr_assert_eq(parse_copy(dg, sizeof(dg), &d), SOCKS5_UDP_ERSV);
	dg[1] = 0;
	for (int v = 0; v < 256; v++) {
		if (v == 1 || v == 3 || v == 4)
			continue;
		dg[3] = (uint8_t)v;
		cr_assert_eq(parse_copy(dg, sizeof(dg), &d), SOCKS5_UDP_EATYP, "ATYP %d", v);
	}
	/* Names that could not be sent back: empty, or with a NUL. */
	cr_assert_eq(parse_copy(BYTES(0, 0, 0, 3, 0, 0, 53), &d), SOCKS5_UDP_ENAME);
	cr_assert_eq(parse_copy(BYTES(0, 0, 0, 3, 2, 'a', 0, 0, 53, 'x'), &d), SOCKS5_UDP_ENAME);
	/* Shorter than the fixed part. */
	cr_assert_eq(parse_copy(BYTES(1, 1, 1), &d), SOCKS5_UDP_ETRUNC);
}

Test(socks5_udp, drop_reasons_distinct)
{
	const int errs[] = { SOCKS5_UDP_ETRUNC, SOCKS5_UDP_ERSV, SOCKS5_UDP_EFRAG,
			     SOCKS5_UDP_EATYP, SOCKS5_UDP_ENAME };
	bool seen[SOCKS5_UDP_DROP_MAX] = { false };

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		enum socks5_udp_drop r = socks5_udp_drop_reason(errs[i]);

		cr_assert(errs[i] < 0);
		cr_assert_lt(r, SOCKS5_UDP_DROP_MAX);
		cr_assert_not(seen[r], "reason %d twice", r);
		seen[r] = true;
	}
	cr_assert_eq(socks5_udp_drop_reason(0), SOCKS5_UDP_DROP_MAX);
	cr_assert_eq(socks5_udp_drop_reason(-ENOMEM), SOCKS5_UDP_DROP_MAX);
}

/* Random destinations and payloads: parse(build(x)) gives x back. */
Test(socks5_udp, random_round_trip)
{
	static uint8_t dg[SOCKS5_UDP_HDR_MAX + 600];
	uint8_t payload[600], raw[255];
	struct tu_rng rng;
	struct socks5_addr a;
	struct socks5_udp_dgram d;

	tu_rng_seed(&rng, 0x0dd5);
	for (int iter = 0; iter < 20000; iter++) {
		uint32_t kind = tu_rand_below(&rng, 3);
		size_t plen = tu_rand_below(&rng, sizeof(payload) + 1);
		uint16_t port = (uint16_t)tu_rand32(&rng);
		int n;

		tu_rand_bytes(&rng, raw, sizeof(raw));
		tu_rand_bytes(&rng, payload, plen);
		if (kind == 2) {
			size_t len = tu_rand_range(&rng, 1, 255);

			for (size_t i = 0; i < len; i++)
				raw[i] = raw[i] ? raw[i] : 'z';
			cr_assert_eq(socks5_addr_domain(&a, (const char *)raw, len, port), 0);
		} else {
			cr_assert_eq(socks5_addr_ip(&a, kind ? 6 : 4, raw, port), 0);
		}
		n = socks5_udp_build(dg, sizeof(dg), &a, payload, plen);
		cr_assert_eq(n, socks5_udp_header_len(&a) + (int)plen);
		cr_assert_eq(socks5_udp_parse(dg, (size_t)n, &d), 0, "iteration %d", iter);
		expect_addr(&d.src, &a);
		cr_assert_eq(d.hdr_len, (size_t)socks5_udp_header_len(&a));
		cr_assert_eq(d.payload_len, plen);
		cr_assert_eq(memcmp(d.payload, payload, plen), 0);
	}
}
