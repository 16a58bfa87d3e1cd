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
