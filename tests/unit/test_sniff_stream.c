/* test_sniff_stream.c — sniff/stream.c, tls_hello.c, http_host.c and name.c: the SNI of real
 * and built ClientHellos at every prefix and across records, refusals by their cause (not TLS,
 * bad lengths, no SNI, address literals), names normalised, the Host of HTTP/1.x requests
 * (port dropped, v6 and address literals refused, limits) and the bound on work.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sniff/name.h"
#include "sniff/sniff.h"
#include "sniff/tls_hello.h"

/* Two ClientHellos captured from `openssl s_client` (OpenSSL 3.0) on loopback: one with
 * -servername name.test, one with -noservername. Each is one record. */
static const uint8_t hello_sni[] = {
	0x16, 0x03, 0x01, 0x01, 0x36, 0x01, 0x00, 0x01, 0x32, 0x03, 0x03, 0x8a,
	0x60, 0x08, 0x35, 0x06, 0x2e, 0xa1, 0x7c, 0x6a, 0x6f, 0xd3, 0x31, 0xd2,
	0x33, 0x7d, 0x1a, 0xd1, 0xb7, 0xf7, 0x1a, 0xb3, 0xfc, 0x45, 0x3f, 0x75,
	0x37, 0x0e, 0x4c, 0xac, 0xc4, 0x71, 0x51, 0x20, 0x6c, 0x01, 0x59, 0xb6,
	0xdc, 0x35, 0xfc, 0xc3, 0x64, 0xee, 0xab, 0xc0, 0x30, 0x0d, 0x4f, 0x53,
	0x47, 0x7a, 0x82, 0x4e, 0xb8, 0x22, 0xd4, 0x8d, 0x19, 0x95, 0x17, 0x4f,
	0xa1, 0xea, 0x2e, 0x29, 0x00, 0x3e, 0x13, 0x02, 0x13, 0x03, 0x13, 0x01,
	0xc0, 0x2c, 0xc0, 0x30, 0x00, 0x9f, 0xcc, 0xa9, 0xcc, 0xa8, 0xcc, 0xaa,
	0xc0, 0x2b, 0xc0, 0x2f, 0x00, 0x9e, 0xc0, 0x24, 0xc0, 0x28, 0x00, 0x6b,
	0xc0, 0x23, 0xc0, 0x27, 0x00, 0x67, 0xc0, 0x0a, 0xc0, 0x14, 0x00, 0x39,
	0xc0, 0x09, 0xc0, 0x13, 0x00, 0x33, 0x00, 0x9d, 0x00, 0x9c, 0x00, 0x3d,
	0x00, 0x3c, 0x00, 0x35, 0x00, 0x2f, 0x00, 0xff, 0x01, 0x00, 0x00, 0xab,
	0x00, 0x00, 0x00, 0x0e, 0x00, 0x0c, 0x00, 0x00, 0x09, 0x6e, 0x61, 0x6d,
	0x65, 0x2e, 0x74, 0x65, 0x73, 0x74, 0x00, 0x0b, 0x00, 0x04, 0x03, 0x00,
	0x01, 0x02, 0x00, 0x0a, 0x00, 0x16, 0x00, 0x14, 0x00, 0x1d, 0x00, 0x17,
	0x00, 0x1e, 0x00, 0x19, 0x00, 0x18, 0x01, 0x00, 0x01, 0x01, 0x01, 0x02,
	0x01, 0x03, 0x01, 0x04, 0x00, 0x23, 0x00, 0x00, 0x00, 0x16, 0x00, 0x00,
	0x00, 0x17, 0x00, 0x00, 0x00, 0x0d, 0x00, 0x2a, 0x00, 0x28, 0x04, 0x03,
	0x05, 0x03, 0x06, 0x03, 0x08, 0x07, 0x08, 0x08, 0x08, 0x09, 0x08, 0x0a,
	0x08, 0x0b, 0x08, 0x04, 0x08, 0x05, 0x08, 0x06, 0x04, 0x01, 0x05, 0x01,
	0x06, 0x01, 0x03, 0x03, 0x03, 0x01, 0x03, 0x02, 0x04, 0x02, 0x05, 0x02,
	0x06, 0x02, 0x00, 0x2b, 0x00, 0x09, 0x08, 0x03, 0x04, 0x03, 0x03, 0x03,
	0x02, 0x03, 0x01, 0x00, 0x2d, 0x00, 0x02, 0x01, 0x01, 0x00, 0x33, 0x00,
	0x26, 0x00, 0x24, 0x00, 0x1d, 0x00, 0x20, 0xf6, 0xf3, 0xaa, 0xb8, 0xa9,
	0x72, 0x03, 0x13, 0xad, 0x81, 0x32, 0x4e, 0xdd, 0xac, 0x3b, 0xd1, 0x88,
	0x6f, 0xf4, 0x5f, 0x4b, 0x9f, 0x1a, 0x3e, 0xd5, 0xa7, 0x17, 0x42, 0xd2,
	0x83, 0xc1, 0x0e,
};
static const uint8_t hello_nosni[] = {
	0x16, 0x03, 0x01, 0x01, 0x24, 0x01, 0x00, 0x01, 0x20, 0x03, 0x03, 0xde,
	0x2d, 0xb0, 0xdd, 0xee, 0x83, 0x5b, 0x5e, 0x06, 0xe4, 0xfe, 0x61, 0xfc,
	0x9b, 0x7e, 0xf8, 0x44, 0xd5, 0xc9, 0x58, 0x51, 0x7d, 0x87, 0xa3, 0x03,
	0x02, 0x18, 0x45, 0x7f, 0x86, 0x21, 0x6f, 0x20, 0x69, 0xbf, 0x38, 0xad,
	0x2a, 0x4c, 0x30, 0x67, 0xea, 0xe3, 0xc9, 0xec, 0x05, 0x1a, 0xc3, 0xdb,
	0x8f, 0x16, 0xf6, 0xf5, 0xe1, 0x7f, 0xfe, 0x96, 0x2c, 0xeb, 0x81, 0xc7,
	0x1f, 0xcf, 0x0e, 0x12, 0x00, 0x3e, 0x13, 0x02, 0x13, 0x03, 0x13, 0x01,
	0xc0, 0x2c, 0xc0, 0x30, 0x00, 0x9f, 0xcc, 0xa9, 0xcc, 0xa8, 0xcc, 0xaa,
	0xc0, 0x2b, 0xc0, 0x2f, 0x00, 0x9e, 0xc0, 0x24, 0xc0, 0x28, 0x00, 0x6b,
	0xc0, 0x23, 0xc0, 0x27, 0x00, 0x67, 0xc0, 0x0a, 0xc0, 0x14, 0x00, 0x39,
	0xc0, 0x09, 0xc0, 0x13, 0x00, 0x33, 0x00, 0x9d, 0x00, 0x9c, 0x00, 0x3d,
	0x00, 0x3c, 0x00, 0x35, 0x00, 0x2f, 0x00, 0xff, 0x01, 0x00, 0x00, 0x99,
	0x00, 0x0b, 0x00, 0x04, 0x03, 0x00, 0x01, 0x02, 0x00, 0x0a, 0x00, 0x16,
	0x00, 0x14, 0x00, 0x1d, 0x00, 0x17, 0x00, 0x1e, 0x00, 0x19, 0x00, 0x18,
	0x01, 0x00, 0x01, 0x01, 0x01, 0x02, 0x01, 0x03, 0x01, 0x04, 0x00, 0x23,
	0x00, 0x00, 0x00, 0x16, 0x00, 0x00, 0x00, 0x17, 0x00, 0x00, 0x00, 0x0d,
	0x00, 0x2a, 0x00, 0x28, 0x04, 0x03, 0x05, 0x03, 0x06, 0x03, 0x08, 0x07,
	0x08, 0x08, 0x08, 0x09, 0x08, 0x0a, 0x08, 0x0b, 0x08, 0x04, 0x08, 0x05,
	0x08, 0x06, 0x04, 0x01, 0x05, 0x01, 0x06, 0x01, 0x03, 0x03, 0x03, 0x01,
	0x03, 0x02, 0x04, 0x02, 0x05, 0x02, 0x06, 0x02, 0x00, 0x2b, 0x00, 0x09,
	0x08, 0x03, 0x04, 0x03, 0x03, 0x03, 0x02, 0x03, 0x01, 0x00, 0x2d, 0x00,
	0x02, 0x01, 0x01, 0x00, 0x33, 0x00, 0x26, 0x00, 0x24, 0x00, 0x1d, 0x00,
	0x20, 0x60, 0x13, 0x57, 0xc5, 0xd7, 0x04, 0xf4, 0x35, 0x8e, 0xff, 0x1a,
	0x7f, 0x33, 0x6e, 0xe5, 0xda, 0x27, 0x8c, 0x87, 0x59, 0x60, 0x2c, 0xb4,
	0xe5, 0x66, 0x1a, 0x70, 0x65, 0x14, 0x3e, 0x53, 0x3e,
};

/* ---- building ClientHellos (independent of the code under test) -------------------------- */

struct buf {
	uint8_t *b;
	size_t n, cap;
};

static void put(struct buf *m, const void *p, size_t n)
{
	if (m->n + n > m->cap) {
		m->cap = (m->n + n) * 2;
		m->b = realloc(m->b, m->cap);
		cr_assert_not_null(m->b);
	}
	memcpy(m->b + m->n, p, n);
	m->n += n;
}

static void u8(struct buf *m, unsigned v) { uint8_t b = (uint8_t)v; put(m, &b, 1); }
static void u16(struct buf *m, unsigned v) { u8(m, v >> 8); u8(m, v); }
static void u24(struct buf *m, unsigned v) { u8(m, v >> 16); u16(m, v); }

static void zeros(struct buf *m, size_t n)
{
	for (size_t i = 0; i < n; i++)
		u8(m, 0);
}

/* A ClientHello handshake message: padding extensions (type 21) of pad_before and pad_after
 * bytes around a server_name extension naming sni (none if sni is NULL). */
static struct buf hello(const char *sni, size_t pad_before, size_t pad_after)
{
	struct buf ext = { 0 }, body = { 0 }, msg = { 0 };

	if (pad_before)
		u16(&ext, 21), u16(&ext, (unsigned)pad_before), zeros(&ext, pad_before);
	if (sni) {
		size_t l = strlen(sni);
		u16(&ext, 0), u16(&ext, (unsigned)(l + 5)), u16(&ext, (unsigned)(l + 3));
		u8(&ext, 0), u16(&ext, (unsigned)l), put(&ext, sni, l);
	}
	u16(&ext, 43), u16(&ext, 3), u8(&ext, 2), u16(&ext, 0x0304); /* supported_versions */
	if (pad_after)
		u16(&ext, 21), u16(&ext, (unsigned)pad_after), zeros(&ext, pad_after);
	u16(&body, 0x0303), zeros(&body, 32);           /* version, random */
	u8(&body, 32), zeros(&body, 32);                /* session id */
	u16(&body, 4), u16(&body, 0x1301), u16(&body, 0x1302);
	u8(&body, 1), u8(&body, 0);                     /* compression */
	u16(&body, (unsigned)ext.n), put(&body, ext.b, ext.n);
	u8(&msg, 1), u24(&msg, (unsigned)body.n), put(&msg, body.b, body.n);
	free(ext.b), free(body.b);
	return msg;
}

/* The message msg in handshake records of at most frag bytes each. */
static struct buf records(const struct buf *msg, size_t frag)
{
	struct buf s = { 0 };

	for (size_t off = 0; off < msg->n; off += frag) {
		size_t l = msg->n - off < frag ? msg->n - off : frag;
		u8(&s, 22), u16(&s, 0x0301), u16(&s, (unsigned)l), put(&s, msg->b + off, l);
	}
	return s;
}

static enum sniff_result sniff(const void *p, size_t n, char name[SNIFF_NAME_MAX + 1],
			       enum sniff_proto *proto)
{
	/* an exactly-sized heap copy, so that ASan sees any read past n */
	uint8_t *c = calloc(1, n ? n : 1);
	enum sniff_result r;

	memcpy(c, p, n);
	r = sniff_stream(c, n, name, proto);
	free(c);
	return r;
}

/* Every prefix of s: NEED_MORE below k, then want (with name on FOUND) up to the end. */
static void prefixes(const uint8_t *s, size_t n, size_t k, enum sniff_result want,
		     const char *name, enum sniff_proto wproto)
{
	for (size_t i = 0; i <= n; i++) {
		char got[SNIFF_NAME_MAX + 1] = "";
		enum sniff_proto proto;
		enum sniff_result r = sniff(s, i, got, &proto);

		if (i < k) {
			cr_assert_eq(r, SNIFF_NEED_MORE, "prefix %zu of %zu (decides at %zu): %d", i, n, k, r);
			continue;
		}
		cr_assert_eq(r, want, "prefix %zu of %zu (decides at %zu): %d", i, n, k, r);
		cr_assert_eq(proto, wproto, "prefix %zu", i);
		if (want == SNIFF_FOUND)
			cr_assert_str_eq(got, name, "prefix %zu", i);
	}
}

static size_t find(const uint8_t *s, size_t n, const char *needle)
{
	size_t l = strlen(needle);

	for (size_t i = 0; i + l <= n; i++)
		if (!memcmp(s + i, needle, l))
			return i;
	cr_assert_fail("\"%s\" not in the bytes", needle);
	return 0;
}

/* ---- TLS ---------------------------------------------------------------------------------- */

Test(sniff_tls, captured_hello_every_prefix)
{
	/* FOUND as soon as the server_name extension (one entry, the name last) is complete. */
	size_t k = find(hello_sni, sizeof(hello_sni), "name.test") + 9;

	prefixes(hello_sni, sizeof(hello_sni), k, SNIFF_FOUND, "name.test", SNIFF_PROTO_TLS);
}

Test(sniff_tls, captured_hello_without_sni)
{
	prefixes(hello_nosni, sizeof(hello_nosni), sizeof(hello_nosni), SNIFF_NONE, NULL,
		 SNIFF_PROTO_TLS);
}

Test(sniff_tls, captured_hello_split_over_records_at_every_point)
{
	const uint8_t *msg = hello_sni + 5;
	size_t ml = sizeof(hello_sni) - 5;

	for (size_t cut = 1; cut < ml; cut++) {
		struct buf s = { 0 };
		char got[SNIFF_NAME_MAX + 1];
		enum sniff_proto proto;

		u8(&s, 22), u16(&s, 0x0301), u16(&s, (unsigned)cut), put(&s, msg, cut);
		u8(&s, 22), u16(&s, 0x0303), u16(&s, (unsigned)(ml - cut)), put(&s, msg + cut, ml - cut);
		cr_assert_eq(sniff(s.b, s.n, got, &proto), SNIFF_FOUND, "cut %zu", cut);
		cr_assert_str_eq(got, "name.test");
		/* the first record alone, when the name is in the second */
		if (cut < find(msg, ml, "name.test") + 9)
			cr_assert_eq(sniff(s.b, 5 + cut, got, &proto), SNIFF_NEED_MORE, "cut %zu", cut);
		free(s.b);
	}
}

Test(sniff_tls, large_hello_over_two_records)
{
	/* 12 KiB of padding before the name: records of 10000 bytes, the name in the second. */
	struct buf m = hello("big.example", 12000, 0), s = records(&m, 10000);
	size_t k = find(s.b, s.n, "big.example") + strlen("big.example");

	cr_assert_gt(s.n, 10000 + 5 + 5);
	prefixes(s.b, s.n, k, SNIFF_FOUND, "big.example", SNIFF_PROTO_TLS);
	free(m.b), free(s.b);
}

Test(sniff_tls, hello_longer_than_the_limit_with_sni_early)
{
	/* 20 KiB after the name: two records of 16 KiB; the name is known in the first. */
	struct buf m = hello("early.example", 0, 20000), s = records(&m, 16384);
	char got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;

	cr_assert_eq(sniff(s.b, s.n, got, &proto), SNIFF_FOUND);
	cr_assert_str_eq(got, "early.example");
	free(m.b), free(s.b);
}

Test(sniff_tls, hello_longer_than_the_limit_with_sni_late)
{
	struct buf m = hello("late.example", 20000, 0), s = records(&m, 16384);
	char got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;

	cr_assert_eq(sniff(s.b, SNIFF_STREAM_MAX - 1, got, &proto), SNIFF_NEED_MORE);
	cr_assert_eq(sniff(s.b, SNIFF_STREAM_MAX, got, &proto), SNIFF_NONE, "bounded");
	cr_assert_eq(sniff(s.b, s.n, got, &proto), SNIFF_NONE, "bounded, whatever follows");
	free(m.b), free(s.b);
}

static enum sniff_result sni_of(const char *sni, char got[SNIFF_NAME_MAX + 1])
{
	struct buf m = hello(sni, 0, 0), s = records(&m, 16384);
	enum sniff_proto proto;
	enum sniff_result r = sniff(s.b, s.n, got, &proto);

	cr_assert_eq(proto, SNIFF_PROTO_TLS);
	free(m.b), free(s.b);
	return r;
}

Test(sniff_tls, names)
{
	char got[SNIFF_NAME_MAX + 1], l63[64], l64[65], long254[255];

	cr_assert_eq(sni_of("WWW.Example.COM", got), SNIFF_FOUND);
	cr_assert_str_eq(got, "www.example.com", "lowercased");
	cr_assert_eq(sni_of("example.com.", got), SNIFF_FOUND);
	cr_assert_str_eq(got, "example.com", "one trailing dot dropped");
	cr_assert_eq(sni_of("_srv.my-host.example", got), SNIFF_FOUND);
	cr_assert_str_eq(got, "_srv.my-host.example");
	cr_assert_eq(sni_of("localhost", got), SNIFF_FOUND);
	cr_assert_eq(sni_of("1password.com", got), SNIFF_FOUND, "digits lead a label");
	memset(l63, 'a', 63), l63[63] = 0;
	memset(l64, 'a', 64), l64[64] = 0;
	cr_assert_eq(sni_of(l63, got), SNIFF_FOUND);
	cr_assert_eq(sni_of(l64, got), SNIFF_NONE, "a label over 63");
	for (size_t i = 0; i < 254; i++)
		long254[i] = i % 2 ? '.' : 'a';
	long254[253] = 0; /* "a.a. ... .a": 253 bytes */
	cr_assert_eq(sni_of(long254, got), SNIFF_FOUND);
	long254[253] = 'a', long254[254] = 0; /* ends "aa": 254 bytes */
	cr_assert_eq(sni_of(long254, got), SNIFF_NONE, "over 253");
	cr_assert_eq(sni_of("192.168.1.1", got), SNIFF_NONE, "an IPv4 literal");
	cr_assert_eq(sni_of("127.1", got), SNIFF_NONE, "a short IPv4 form");
	cr_assert_eq(sni_of("::1", got), SNIFF_NONE, "an IPv6 literal");
	cr_assert_eq(sni_of("a..b", got), SNIFF_NONE, "an empty label");
	cr_assert_eq(sni_of(".", got), SNIFF_NONE);
	cr_assert_eq(sni_of("a b.example", got), SNIFF_NONE);
	cr_assert_eq(sni_of("caf\xc3\xa9.example", got), SNIFF_NONE, "not an A-label");
	cr_assert_eq(sni_of("", got), SNIFF_NONE);
}

/* The captured hello with one byte at off replaced by v. */
static enum sniff_result patched(size_t off, uint8_t v)
{
	uint8_t s[sizeof(hello_sni)];
	char got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;

	memcpy(s, hello_sni, sizeof(s));
	s[off] = v;
	return sniff(s, sizeof(s), got, &proto);
}

Test(sniff_tls, not_tls_and_bad_records)
{
	char got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;
	static const uint8_t alert[] = { 21, 3, 3, 0, 2, 2, 40 };

	cr_assert_eq(sniff(alert, 1, got, &proto), SNIFF_NONE, "known at the first byte");
	cr_assert_eq(proto, SNIFF_PROTO_NONE);
	cr_assert_eq(sniff("\x16\x02", 2, got, &proto), SNIFF_NONE, "SSL 2 framing");
	cr_assert_eq(sniff("\x16\x03\x04", 3, got, &proto), SNIFF_NONE, "record version 3.4");
	cr_assert_eq(sniff("\x16\x03\x01\x00\x00", 5, got, &proto), SNIFF_NONE, "empty record");
	cr_assert_eq(sniff("\x16\x03\x01\x40\x01", 5, got, &proto), SNIFF_NONE, "record > 2^14");
	cr_assert_eq(sniff("\x16\x03\x01\x00\x10", 5, got, &proto), SNIFF_NEED_MORE);
	cr_assert_eq(patched(5, 2), SNIFF_NONE, "a ServerHello");
}

Test(sniff_tls, what_follows_the_hello)
{
	uint8_t s[sizeof(hello_sni) + 7];
	char got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;
	struct buf m = hello(NULL, 0, 0), r = records(&m, 40);

	/* an alert record after a complete hello: the hello's verdict stands */
	memcpy(s, hello_sni, sizeof(hello_sni));
	memcpy(s + sizeof(hello_sni), "\x15\x03\x03\x00\x02\x02\x28", 7);
	cr_assert_eq(sniff(s, sizeof(s), got, &proto), SNIFF_FOUND);
	cr_assert_str_eq(got, "name.test");
	/* a second record that is not a handshake one, the hello unfinished: no name will come */
	r.b[45] = 23;
	cr_assert_eq(sniff(r.b, 45, got, &proto), SNIFF_NEED_MORE);
	cr_assert_eq(sniff(r.b, 49, got, &proto), SNIFF_NEED_MORE, "its header incomplete");
	cr_assert_eq(sniff(r.b, 50, got, &proto), SNIFF_NONE);
	cr_assert_eq(sniff(r.b, r.n, got, &proto), SNIFF_NONE);
	free(m.b), free(r.b);
}

Test(sniff_tls, bad_lengths)
{
	/* Offsets in the captured hello: 5 msg type, 6..8 msg length, 43 session id length,
	 * 76..77 cipher suites length, 140 compression methods length, 142..143 extensions
	 * length, then server_name: 144..145 type, 146..147 length, 148..149 list length,
	 * 150 name type, 151..152 name length. */
	cr_assert_eq(hello_sni[43], 32);
	cr_assert_eq(hello_sni[140], 1);
	cr_assert_eq(hello_sni[150], 0);
	cr_assert_eq(hello_sni[152], 9);
	cr_assert_eq(patched(43, 33), SNIFF_NONE, "session id > 32");
	cr_assert_eq(patched(77, 0x3f), SNIFF_NONE, "odd cipher suites length");
	cr_assert_eq(patched(76, 0xff), SNIFF_NONE, "cipher suites past the message");
	cr_assert_eq(patched(140, 0), SNIFF_NONE, "no compression method");
	cr_assert_eq(patched(143, 0xac), SNIFF_NONE, "extensions past the message");
	cr_assert_eq(patched(143, 0xaa), SNIFF_NONE, "extensions short of the message");
	cr_assert_eq(patched(147, 0xff), SNIFF_NONE, "server_name past the extensions");
	cr_assert_eq(patched(149, 0x0d), SNIFF_NONE, "server_name list length mismatch");
	cr_assert_eq(patched(152, 0x0a), SNIFF_NONE, "host_name past the list");
	cr_assert_eq(patched(150, 1), SNIFF_NONE, "no host_name entry");
	cr_assert_eq(patched(8, 0x33), SNIFF_NONE, "message one byte longer than its blocks");
	cr_assert_eq(patched(6, 0x01), SNIFF_NONE, "message 64 KiB longer than its blocks");
	cr_assert_eq(patched(4, 0x35), SNIFF_FOUND, "record one byte short: the name came before");
}

Test(sniff_tls, message_parser_directly)
{
	char got[SNIFF_NAME_MAX + 1];

	cr_assert_eq(tls_hello_parse(hello_sni + 5, 0, got), SNIFF_NEED_MORE);
	cr_assert_eq(tls_hello_parse(hello_sni + 5, 3, got), SNIFF_NEED_MORE);
	cr_assert_eq(tls_hello_parse(hello_sni + 5, sizeof(hello_sni) - 5, got), SNIFF_FOUND);
	cr_assert_str_eq(got, "name.test");
	cr_assert_eq(tls_hello_parse((const uint8_t *)"\x02", 1, got), SNIFF_NONE);
	cr_assert_eq(tls_hello_parse((const uint8_t *)"\x01\x00\x00\x00", 4, got), SNIFF_NONE);
}

/* ---- HTTP --------------------------------------------------------------------------------- */

static void http_every_prefix(const char *req, const char *host_line_end, enum sniff_result want,
			      const char *name)
{
	size_t n = strlen(req), k = host_line_end ? (size_t)(strstr(req, host_line_end) - req) +
							    strlen(host_line_end) : n;

	prefixes((const uint8_t *)req, n, k, want, name, SNIFF_PROTO_HTTP);
}

Test(sniff_http, host_with_port)
{
	http_every_prefix("GET /index.html HTTP/1.1\r\nUser-Agent: t\r\nHost: example.com:8080\r\n"
			  "Accept: */*\r\n\r\n", "8080\r\n", SNIFF_FOUND, "example.com");
}

Test(sniff_http, host_variants)
{
	static const struct {
		const char *req, *name;
	} ok[] = {
		{ "POST / HTTP/1.0\r\nhOsT:Example.ORG\r\n\r\n", "example.org" },
		{ "PUT /x HTTP/1.1\nHost: \t a.example \t\n\n", "a.example" },
		{ "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", "a.example" },
		{ "OPTIONS * HTTP/1.1\r\nHost: a.example.\r\n\r\n", "a.example" },
		{ "DELETE / HTTP/1.1\r\nX-Host: evil.example\r\nHost: b.example\r\n\r\n", "b.example" },
		{ "HEAD / HTTP/1.1\r\nHost: c.example\r\nHost: d.example\r\n\r\n", "c.example" },
		{ "TRACE / HTTP/1.1\r\nHost: c.example\r\n", "c.example" },
		{ "PATCH / HTTP/1.1\r\nHost: c.example\r\n", "c.example" },
		{ "GET http://other.example/ HTTP/1.1\r\nHost: c.example\r\n", "c.example" },
	};
	static const char *const none[] = {
		"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: 10.0.0.1:80\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: \r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.example:\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.example:http\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.example:123456\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: user@a.example\r\n\r\n",
		"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n",
		"GET / HTTP/1.1\r\n folded\r\nHost: a.example\r\n\r\n",
		"GET / HTTP/1.1\r\nbad line\r\nHost: a.example\r\n\r\n",
		"GET / HTTP/1.0\r\nAccept: */*\r\n\r\nHost: a.example\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/2.0\r\nHost: a.example\r\n\r\n",
		"GET /\r\nHost: a.example\r\n\r\n",
		"GET / FOO\r\nHost: a.example\r\n\r\n",
	};
	char got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		cr_assert_eq(sniff(ok[i].req, strlen(ok[i].req), got, &proto), SNIFF_FOUND, "%s",
			     ok[i].req);
		cr_assert_str_eq(got, ok[i].name);
		cr_assert_eq(proto, SNIFF_PROTO_HTTP);
	}
	for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
		cr_assert_eq(sniff(none[i], strlen(none[i]), got, &proto), SNIFF_NONE, "%s", none[i]);
		cr_assert_eq(proto, SNIFF_PROTO_HTTP);
	}
}

Test(sniff_http, no_host_every_prefix)
{
	http_every_prefix("GET / HTTP/1.0\r\nAccept: */*\r\n\r\n", NULL, SNIFF_NONE, NULL);
}

Test(sniff_http, methods)
{
	char got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;

	cr_assert_eq(sniff("", 0, got, &proto), SNIFF_NEED_MORE, "empty prefix");
	cr_assert_eq(proto, SNIFF_PROTO_NONE);
	cr_assert_eq(sniff("G", 1, got, &proto), SNIFF_NEED_MORE);
	cr_assert_eq(proto, SNIFF_PROTO_HTTP);
	cr_assert_eq(sniff("CONNEC", 6, got, &proto), SNIFF_NEED_MORE);
	cr_assert_eq(sniff("GETX", 4, got, &proto), SNIFF_NONE);
	cr_assert_eq(sniff("get / HTTP/1.1\r\n", 16, got, &proto), SNIFF_NONE, "methods are case-sensitive");
	cr_assert_eq(sniff("PRI * HTTP/2.0\r\n", 16, got, &proto), SNIFF_NONE, "h2 preface");
	cr_assert_eq(proto, SNIFF_PROTO_NONE);
	cr_assert_eq(sniff("SSH-2.0-OpenSSH_9.2\r\n", 21, got, &proto), SNIFF_NONE);
	cr_assert_eq(sniff("SSH-2.0-OpenSSH_9.2\r\n", 1, got, &proto), SNIFF_NONE, "at the first byte");
	cr_assert_eq(proto, SNIFF_PROTO_NONE);
}

Test(sniff_http, limits)
{
	size_t big = 20 * 1024;
	char *req = malloc(big + 64), got[SNIFF_NAME_MAX + 1];
	enum sniff_proto proto;
	size_t n = 0;

	/* a 20 KiB header block of short lines, its Host at the end */
	n += (size_t)sprintf(req, "GET / HTTP/1.1\r\n");
	while (n < big)
		n += (size_t)sprintf(req + n, "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaa\r\n");
	n += (size_t)sprintf(req + n, "Host: late.example\r\n\r\n");
	cr_assert_eq(sniff(req, 16000, got, &proto), SNIFF_NEED_MORE);
	cr_assert_eq(sniff(req, SNIFF_STREAM_MAX, got, &proto), SNIFF_NONE);
	cr_assert_eq(sniff(req, n, got, &proto), SNIFF_NONE, "bounded, whatever follows");

	/* one 10 KiB header line */
	n = (size_t)sprintf(req, "GET / HTTP/1.1\r\nX-Long: ");
	memset(req + n, 'a', 10000);
	n += 10000;
	n += (size_t)sprintf(req + n, "\r\nHost: a.example\r\n\r\n");
	cr_assert_eq(sniff(req, 8000, got, &proto), SNIFF_NEED_MORE);
	cr_assert_eq(sniff(req, 9000, got, &proto), SNIFF_NONE, "a line over the limit");
	cr_assert_eq(sniff(req, n, got, &proto), SNIFF_NONE);
	free(req);
}

/* ---- names directly ----------------------------------------------------------------------- */

Test(sniff_name, check)
{
	char out[SNIFF_NAME_MAX + 1] = "untouched";

	cr_assert_eq(sniff_name_check((const uint8_t *)"A-B.c_D", 7, out), SNIFF_FOUND);
	cr_assert_str_eq(out, "a-b.c_d");
	strcpy(out, "untouched");
	cr_assert_eq(sniff_name_check((const uint8_t *)"1.2.3.4", 7, out), SNIFF_NONE);
	cr_assert_eq(sniff_name_check((const uint8_t *)"a.", 1, out), SNIFF_FOUND, "n bounds it");
	cr_assert_str_eq(out, "a");
	cr_assert_eq(sniff_name_check((const uint8_t *)"a\0b", 3, out), SNIFF_NONE, "a NUL");
	cr_assert_eq(sniff_name_check((const uint8_t *)"..", 2, out), SNIFF_NONE);
	cr_assert_eq(sniff_name_check((const uint8_t *)"x.123", 5, out), SNIFF_NONE);
	cr_assert_eq(sniff_name_check((const uint8_t *)"x.123a", 6, out), SNIFF_FOUND);
}
