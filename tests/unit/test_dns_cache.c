/* test_dns_cache.c — dns/cache: real upstream answers (built by hand after dns_build_query's
 * question, parsed by dns_parse_answer) stored and found again; the client's reply rebuilt from
 * a hit carries TTLs aged by the entry's age; expiry at exactly the TTL; TTL caps (positive
 * and negative, the stored TTLs lowered to the cap); what is never stored; LRU eviction order;
 * per-server entries; case-insensitive names; replacement; clear; an entry its user refuses
 * (dns_cache_use: gone, a miss); an answer one of whose names reads a TTL's bytes (not stored,
 * counted) while ordinary compression is stored and reads the same capped and aged; exact
 * counters; and a randomized run against a dumb reference model.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dns/cache.h"
#include "testutil.h"

#define T0 SEC(1000)
#define UP_ID 0x4242
#define CLIENT_ID 0x0777

/* ---- building upstream answers (independent of the code under test) ---------------------- */

struct up {
	uint8_t b[2048];
	size_t n;
	struct dns_question q;  /* the question we asked */
	struct dns_answer a;    /* the answer parsed */
};

struct spec {
	const char *name;
	uint16_t type;          /* 0: A */
	unsigned rcode;
	uint16_t flags;         /* more header flags (TC) */
	size_t n_a;             /* A records in the answer section */
	uint32_t ttl[4];        /* their TTLs; past the fourth, ttl[0] */
	uint8_t tag;            /* the first address is 192.0.2.tag (then tag + 1, ...) */
	bool soa;               /* an SOA in the authority section */
	uint32_t soa_ttl, soa_min;
};

static void u8(struct up *u, uint8_t v) { u->b[u->n++] = v; }
static void u16(struct up *u, uint16_t v) { u8(u, (uint8_t)(v >> 8)); u8(u, (uint8_t)v); }
static void u32(struct up *u, uint32_t v) { u16(u, (uint16_t)(v >> 16)); u16(u, (uint16_t)v); }

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)rd16(p) << 16 | rd16(p + 2); }

static struct dns_question question(const char *name, uint16_t type)
{
	struct dns_question q;

	memset(&q, 0, sizeof(q));
	snprintf(q.name, sizeof(q.name), "%s", name);
	q.name_len = strlen(name);
	q.nameable = true;
	q.qtype = type;
	q.qclass = 1;
	return q;
}

static void labels(struct up *u, const char *a, const char *b)
{
	u8(u, (uint8_t)strlen(a));
	for (const char *p = a; *p; p++)
		u8(u, (uint8_t)*p);
	u8(u, (uint8_t)strlen(b));
	for (const char *p = b; *p; p++)
		u8(u, (uint8_t)*p);
	u8(u, 0);
}

/* What an upstream answers to our query for s.name: the header and question echoed, its RRs,
 * an OPT; parsed against the question as dns_parse_answer would be. */
static void upstream(struct up *u, struct spec s)
{
	uint8_t qb[512];
	int qn;

	u->q = question(s.name, s.type ? s.type : DNS_T_A);
	qn = dns_build_query(qb, sizeof(qb), UP_ID, &u->q);
	cr_assert_gt(qn, 0);
	u->n = DNS_HDR_LEN + u->q.name_len + 2 + 4; /* our query's header and question */
	memcpy(u->b, qb, u->n);
	u->b[2] = (uint8_t)((DNS_F_QR | DNS_F_RD | DNS_F_RA | s.flags | s.rcode) >> 8);
	u->b[3] = (uint8_t)(DNS_F_QR | DNS_F_RD | DNS_F_RA | s.flags | s.rcode);
	u->b[6] = (uint8_t)(s.n_a >> 8), u->b[7] = (uint8_t)s.n_a;
	u->b[8] = 0, u->b[9] = s.soa ? 1 : 0;
	u->b[10] = 0, u->b[11] = 1;
	for (size_t i = 0; i < s.n_a; i++) {
		u16(u, 0xc00c), u16(u, DNS_T_A), u16(u, 1), u32(u, s.ttl[i < 4 ? i : 0]), u16(u, 4);
		u8(u, 192), u8(u, 0), u8(u, 2), u8(u, (uint8_t)(s.tag + i));
	}
	if (s.soa) {
		u16(u, 0xc00c), u16(u, DNS_T_SOA), u16(u, 1), u32(u, s.soa_ttl), u16(u, 9 + 11 + 20);
		labels(u, "ns", "test");
		labels(u, "host", "test");
		u32(u, 1), u32(u, 7200), u32(u, 900), u32(u, 86400), u32(u, s.soa_min);
	}
	u8(u, 0), u16(u, DNS_T_OPT), u16(u, 1232), u32(u, 0), u16(u, 0);
	cr_assert_leq(u->n, sizeof(u->b));
	cr_assert_eq(dns_parse_answer(u->b, u->n, UP_ID, &u->q, &u->a), 0);
}

/* ---- the client's reply, read back independently ----------------------------------------- */

struct reply {
	uint8_t b[2048];
	int n;
	unsigned rcode;
	uint16_t an, ns;
	uint32_t ttl[80];       /* the TTLs of the answer and authority RRs, in order */
	size_t n_ttl;
	uint8_t addr_last[80];  /* the last byte of each A record's address */
};

static size_t skip_name(const uint8_t *b, size_t p)
{
	for (;;) {
		uint8_t l = b[p];
		if ((l & 0xc0) == 0xc0)
			return p + 2;
		if (l == 0)
			return p + 1;
		p += 1u + l;
	}
}

/* The reply to a client asking client_name (its own case) built from a cache hit. */
static struct reply client_reply(const char *client_name, uint16_t type, const uint8_t *msg,
				 const struct dns_answer *a, uint32_t age)
{
	struct dns_question cq = question(client_name, type);
	struct dns_query q;
	struct reply r;
	uint8_t qb[512];
	int qn = dns_build_query(qb, sizeof(qb), CLIENT_ID, &cq);
	size_t p;

	memset(&r, 0, sizeof(r));
	cr_assert_gt(qn, 0);
	cr_assert_eq(dns_parse_query(qb, (size_t)qn, &q), 0);
	r.n = dns_build_from_answer(r.b, sizeof(r.b), 65535, &q, qb, msg, a, age);
	cr_assert_gt(r.n, 0);
	cr_assert_eq(rd16(r.b), CLIENT_ID);
	cr_assert_eq(memcmp(r.b + DNS_HDR_LEN, qb + DNS_HDR_LEN, q.q.wire_len), 0,
		     "the client's question bytes, its case");
	r.rcode = DNS_RCODE(rd16(r.b + 2));
	r.an = rd16(r.b + 6);
	r.ns = rd16(r.b + 8);
	p = DNS_HDR_LEN + q.q.wire_len;
	for (size_t i = 0; i < (size_t)r.an + r.ns; i++) {
		p = skip_name(r.b, p);
		r.ttl[r.n_ttl] = rd32(r.b + p + 4);
		if (rd16(r.b + p) == DNS_T_A)
			r.addr_last[r.n_ttl] = r.b[p + 10 + 3];
		r.n_ttl++;
		p += 10u + rd16(r.b + p + 8);
	}
	return r;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static struct dns_cache *cache(uint32_t max_entries, uint32_t max_ttl, uint32_t neg_max)
{
	struct dns_cache_config cfg = { .max_entries = max_entries, .max_ttl_s = max_ttl,
					.neg_ttl_max_s = neg_max };
	struct dns_cache *c = NULL;

	cr_assert_eq(dns_cache_new(&cfg, &c), 0);
	return c;
}

static struct dns_cache_stats stats(const struct dns_cache *c)
{
	struct dns_cache_stats st;

	dns_cache_get_stats(c, &st);
	return st;
}

struct hit {
	const uint8_t *msg;
	size_t len;
	const struct dns_answer *a;
	uint32_t age;
};

static bool get(struct dns_cache *c, uint32_t server, const char *name, uint16_t type,
		int64_t now, struct hit *h)
{
	struct dns_question q = question(name, type);

	return dns_cache_get(c, server, &q, now, &h->msg, &h->len, &h->a, &h->age);
}

static void put_ok(struct dns_cache *c, uint32_t server, const struct up *u, int64_t now)
{
	cr_assert_eq(dns_cache_put(c, server, u->b, u->n, &u->a, now), 0);
}

/* ---- positive answers --------------------------------------------------------------------- */

Test(dns_cache, hit_replies_with_ttls_aged)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct up u;
	struct hit h;
	struct reply r;
	struct dns_cache_stats st;

	upstream(&u, (struct spec){ .name = "www.example.com", .n_a = 2, .ttl = { 300, 120 },
				    .tag = 10 });
	put_ok(c, 0, &u, T0);
	cr_assert(get(c, 0, "www.example.com", DNS_T_A, T0 + MS(45700), &h));
	cr_assert_eq(h.age, 45, "whole seconds");
	cr_assert_eq(h.len, u.n);
	cr_assert_eq(h.a->an, 2);
	r = client_reply("www.example.com", DNS_T_A, h.msg, h.a, h.age);
	cr_assert_eq(r.rcode, DNS_R_NOERROR);
	cr_assert_eq(r.an, 2);
	cr_assert_eq(r.ttl[0], 300 - 45);
	cr_assert_eq(r.ttl[1], 120 - 45);
	cr_assert_eq(r.addr_last[0], 10);
	cr_assert_eq(r.addr_last[1], 11);
	st = stats(c);
	cr_assert_eq(st.stored, 1);
	cr_assert_eq(st.hits, 1);
	cr_assert_eq(st.misses, 0);
	cr_assert_eq(st.entries, 1);
	cr_assert_eq(st.bytes, u.n);
	cr_assert_not(get(c, 0, "other.example.com", DNS_T_A, T0, &h));
	cr_assert_eq(stats(c).misses, 1);
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, expires_at_exactly_the_ttl)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct up u;
	struct hit h;
	struct dns_cache_stats st;

	upstream(&u, (struct spec){ .name = "a.test", .n_a = 2, .ttl = { 90, 60 } });
	put_ok(c, 0, &u, T0);
	cr_assert(get(c, 0, "a.test", DNS_T_A, T0 + SEC(60) - 1, &h), "live 1 ns before");
	cr_assert_eq(h.age, 59);
	cr_assert_eq(client_reply("a.test", DNS_T_A, h.msg, h.a, h.age).ttl[1], 1);
	cr_assert_not(get(c, 0, "a.test", DNS_T_A, T0 + SEC(60), &h), "gone at the smallest TTL");
	st = stats(c);
	cr_assert_eq(st.expired, 1);
	cr_assert_eq(st.misses, 1);
	cr_assert_eq(st.hits, 1);
	cr_assert_eq(st.entries, 0);
	cr_assert_eq(st.bytes, 0);
	cr_assert_not(get(c, 0, "a.test", DNS_T_A, T0 + SEC(61), &h));
	st = stats(c);
	cr_assert_eq(st.expired, 1, "removed once");
	cr_assert_eq(st.misses, 2);
	dns_cache_free(c);
	CHECK_LEAKS();
}

/* dns_cache_use: a live entry is a hit only if its user takes it; one it refuses goes, and
 * that lookup is a miss. */
struct use_log {
	int calls;
	bool take;
	uint32_t age;
	size_t len;
};

static bool use(void *arg, const uint8_t *msg, size_t len, const struct dns_answer *a,
		uint32_t age_s)
{
	struct use_log *l = arg;

	(void)msg;
	(void)a;
	l->calls++;
	l->age = age_s;
	l->len = len;
	return l->take;
}

Test(dns_cache, an_entry_its_user_refuses_is_a_miss_and_goes)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct dns_question q = question("a.test", DNS_T_A);
	struct use_log l = { .take = true };
	struct dns_cache_stats st;
	struct up u;

	upstream(&u, (struct spec){ .name = "a.test", .n_a = 1, .ttl = { 300 } });
	put_ok(c, 0, &u, T0);
	cr_assert(dns_cache_use(c, 0, &q, T0 + SEC(3), use, &l));
	cr_assert_eq(l.calls, 1);
	cr_assert_eq(l.age, 3);
	cr_assert_eq(l.len, u.n);
	l.take = false;
	cr_assert_not(dns_cache_use(c, 0, &q, T0 + SEC(4), use, &l));
	cr_assert_eq(l.calls, 2);
	st = stats(c);
	cr_assert_eq(st.hits, 1, "only the use that took it");
	cr_assert_eq(st.misses, 1);
	cr_assert_eq(st.unusable, 1);
	cr_assert_eq(st.entries, 0, "refused: gone");
	cr_assert_eq(st.bytes, 0);
	cr_assert_eq(st.expired + st.evictions, 0);
	cr_assert_not(dns_cache_use(c, 0, &q, T0 + SEC(5), use, &l));
	cr_assert_eq(l.calls, 2, "nothing left to hand out");
	cr_assert_eq(stats(c).misses, 2);
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, ttl_capped_at_max_ttl_in_the_reply_too)
{
	struct dns_cache *c = cache(16, 100, 300);
	struct up u;
	struct hit h;
	struct reply r;

	upstream(&u, (struct spec){ .name = "long.test", .n_a = 2, .ttl = { 86400, 7200 } });
	put_ok(c, 0, &u, T0);
	cr_assert(get(c, 0, "long.test", DNS_T_A, T0, &h));
	r = client_reply("long.test", DNS_T_A, h.msg, h.a, h.age);
	cr_assert_eq(r.ttl[0], 100, "never told to keep it longer than the cache does");
	cr_assert_eq(r.ttl[1], 100);
	cr_assert_eq(rd32(u.b + u.a.ttl_off[0]), 86400, "the caller's message is not written");
	cr_assert(get(c, 0, "long.test", DNS_T_A, T0 + SEC(30), &h));
	r = client_reply("long.test", DNS_T_A, h.msg, h.a, h.age);
	cr_assert_eq(r.ttl[0], 70);
	cr_assert(get(c, 0, "long.test", DNS_T_A, T0 + SEC(100) - 1, &h));
	cr_assert_not(get(c, 0, "long.test", DNS_T_A, T0 + SEC(100), &h));
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, sixty_four_rrs_stored_sixty_five_not)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct up u;
	struct hit h;
	struct reply r;

	upstream(&u, (struct spec){ .name = "many.test", .n_a = 64, .ttl = { 50, 50, 50, 50 } });
	cr_assert_not(u.a.n_ttl_overflow);
	put_ok(c, 0, &u, T0);
	cr_assert(get(c, 0, "many.test", DNS_T_A, T0 + SEC(20), &h));
	r = client_reply("many.test", DNS_T_A, h.msg, h.a, h.age);
	cr_assert_eq(r.an, 64);
	cr_assert_eq(r.ttl[63], 30, "the last RR aged too");
	upstream(&u, (struct spec){ .name = "more.test", .n_a = 65, .ttl = { 50, 50, 50, 50 } });
	cr_assert(u.a.n_ttl_overflow);
	cr_assert_eq(dns_cache_put(c, 0, u.b, u.n, &u.a, T0), 1, "its TTLs could not all be aged");
	cr_assert_not(get(c, 0, "more.test", DNS_T_A, T0, &h));
	dns_cache_free(c);
	CHECK_LEAKS();
}

/* ---- negative answers --------------------------------------------------------------------- */

Test(dns_cache, negative_answers_capped_at_neg_ttl_max)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct up u;
	struct hit h;
	struct reply r;

	/* NXDOMAIN, SOA TTL 3600, MINIMUM 900: negative TTL 900 (RFC 2308 5), capped at 300. */
	upstream(&u, (struct spec){ .name = "nx.test", .rcode = DNS_R_NXDOMAIN, .soa = true,
				    .soa_ttl = 3600, .soa_min = 900 });
	cr_assert_eq(u.a.min_ttl, 900);
	put_ok(c, 0, &u, T0);
	cr_assert(get(c, 0, "nx.test", DNS_T_A, T0 + SEC(10), &h));
	r = client_reply("nx.test", DNS_T_A, h.msg, h.a, h.age);
	cr_assert_eq(r.rcode, DNS_R_NXDOMAIN);
	cr_assert_eq(r.an, 0);
	cr_assert_eq(r.ns, 1);
	cr_assert_eq(r.ttl[0], 290, "the SOA's TTL capped, then aged");
	cr_assert(get(c, 0, "nx.test", DNS_T_A, T0 + SEC(300) - 1, &h));
	cr_assert_not(get(c, 0, "nx.test", DNS_T_A, T0 + SEC(300), &h));
	/* NOERROR without answer RRs (no data), negative TTL 60: under the cap. */
	upstream(&u, (struct spec){ .name = "nodata.test", .type = DNS_T_AAAA, .soa = true,
				    .soa_ttl = 60, .soa_min = 3600 });
	put_ok(c, 0, &u, T0);
	cr_assert(get(c, 0, "nodata.test", DNS_T_AAAA, T0 + SEC(60) - 1, &h));
	r = client_reply("nodata.test", DNS_T_AAAA, h.msg, h.a, h.age);
	cr_assert_eq(r.rcode, DNS_R_NOERROR);
	cr_assert_eq(r.an, 0);
	cr_assert_eq(r.ttl[0], 1);
	cr_assert_not(get(c, 0, "nodata.test", DNS_T_AAAA, T0 + SEC(60), &h));
	cr_assert_eq(stats(c).expired, 2);
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, what_is_never_stored)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct up u;
	struct hit h;
	struct dns_cache_stats st;
	struct spec refused[] = {
		{ .name = "nx.test", .rcode = DNS_R_NXDOMAIN },          /* no SOA: no TTL */
		{ .name = "nodata.test", .n_a = 0 },                     /* no SOA either */
		{ .name = "fail.test", .rcode = DNS_R_SERVFAIL, .soa = true, .soa_ttl = 60,
		  .soa_min = 60 },
		{ .name = "refused.test", .rcode = DNS_R_REFUSED, .soa = true, .soa_ttl = 60,
		  .soa_min = 60 },
		{ .name = "zero.test", .n_a = 2, .ttl = { 300, 0 } },  /* TTL 0 */
		{ .name = "top.test", .n_a = 1, .ttl = { 0x80000000u } }, /* RFC 2181 8: 0 */
		{ .name = "neg0.test", .rcode = DNS_R_NXDOMAIN, .soa = true, .soa_ttl = 60,
		  .soa_min = 0 },
		{ .name = "tc.test", .flags = DNS_F_TC, .n_a = 1, .ttl = { 300 } },
	};
	size_t n = sizeof(refused) / sizeof(refused[0]);

	for (size_t i = 0; i < n; i++) {
		upstream(&u, refused[i]);
		cr_assert_eq(dns_cache_put(c, 0, u.b, u.n, &u.a, T0), 1, "%s", refused[i].name);
		cr_assert_not(get(c, 0, refused[i].name, DNS_T_A, T0, &h), "%s", refused[i].name);
	}
	upstream(&u, (struct spec){ .name = "ok.test", .n_a = 1, .ttl = { 300 } });
	cr_assert_eq(dns_cache_put(c, 0, u.b, u.a.keep_end - 1, &u.a, T0), -EINVAL,
		     "shorter than its parsed answer");
	u.a.q.nameable = false;
	cr_assert_eq(dns_cache_put(c, 0, u.b, u.n, &u.a, T0), 1, "a name that is not nameable");
	st = stats(c);
	cr_assert_eq(st.not_stored, n + 1);
	cr_assert_eq(st.stored, 0);
	cr_assert_eq(st.entries, 0);
	cr_assert_eq(st.bytes, 0);
	cr_assert_eq(st.misses, n);
	dns_cache_free(c);
	CHECK_LEAKS();
}

/* ---- names that read a TTL's bytes ------------------------------------------------------- */

/* The name at off as text in lower case (a reply carries the client's case of the question),
 * every byte that is not a letter, digit or '-' as \xHH, labels joined by '.', "." for the
 * root; pointers followed only backwards (as a strict reader would). false: it does not read
 * as a name. */
static bool name_text(const uint8_t *b, size_t len, size_t off, char *out, size_t cap)
{
	size_t o = 0;
	int jumps = 0;

	out[0] = 0;
	for (;;) {
		if (off >= len)
			return false;
		uint8_t l = b[off];
		if ((l & 0xc0) == 0xc0) {
			size_t to;
			if (off + 1 >= len)
				return false;
			to = (size_t)(l & 0x3f) << 8 | b[off + 1];
			if (to >= off || to < DNS_HDR_LEN || ++jumps > 64)
				return false;
			off = to;
			continue;
		}
		if (l & 0xc0 || off + 1 + l > len)
			return false;
		if (l == 0)
			break;
		for (size_t i = 0; i < l; i++) {
			uint8_t c = b[off + 1 + i];
			if (c >= 'A' && c <= 'Z')
				c = (uint8_t)(c + 32);
			if (o + 6 >= cap)
				return false;
			if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')
				out[o++] = (char)c;
			else
				o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
		}
		out[o++] = '.';
		out[o] = 0;
		off += 1u + l;
	}
	if (o == 0)
		snprintf(out, cap, ".");
	return true;
}

/* Each kept RR's owner name, and a CNAME's or an NS's target, reads the same in x (the
 * upstream's answer) and y (a reply to a client whose question is as long): the RRs sit at
 * the same offsets in both. */
static void names_read_the_same(const uint8_t *x, size_t xn, const uint8_t *y, size_t yn,
				const struct dns_answer *a)
{
	size_t p = a->rr_off;
	char tx[1200], ty[1200];

	for (size_t i = 0; i < (size_t)a->keep_an + a->keep_ns + a->keep_ar; i++) {
		bool okx = name_text(x, xn, p, tx, sizeof(tx));
		bool oky = name_text(y, yn, p, ty, sizeof(ty));
		uint16_t type;
		cr_assert(okx && oky && strcmp(tx, ty) == 0,
			  "RR %zu's owner: \"%s\" in the answer, \"%s\" in the reply", i, tx, ty);
		p = skip_name(x, p);
		type = rd16(x + p);
		if (type == DNS_T_CNAME || type == DNS_T_NS) {
			okx = name_text(x, xn, p + 10, tx, sizeof(tx));
			oky = name_text(y, yn, p + 10, ty, sizeof(ty));
			cr_assert(okx == oky && strcmp(tx, ty) == 0,
				  "RR %zu's target: \"%s\" in the answer, \"%s\" in the reply", i, tx,
				  ty);
		}
		p += 10u + rd16(x + p + 8);
	}
}

/* A forged answer to x.test A: RR 1 an A record with TTL 65536 (00 01 00 00); RR 2 (an A
 * record, or with cname a CNAME) whose owner name (or CNAME target) is a pointer to RR 1's
 * TTL's third byte: 00, the root. With RR 1's TTL lowered to a cap of 3600 (00 00 0e 10) the
 * same pointer reads a label of 14 bytes (0x10, RR 1's RDLENGTH and RDATA, RR 2's first 7
 * bytes), then RR 2's TTL's second byte 00: a name, another one, that still parses. */
static void forged_upstream(struct up *u, bool cname)
{
	uint8_t qb[512];
	size_t ttl_at;
	int qn;

	u->q = question("x.test", DNS_T_A);
	qn = dns_build_query(qb, sizeof(qb), UP_ID, &u->q);
	cr_assert_gt(qn, 0);
	u->n = DNS_HDR_LEN + u->q.name_len + 2 + 4;
	memcpy(u->b, qb, u->n);
	u->b[2] = (uint8_t)((DNS_F_QR | DNS_F_RD | DNS_F_RA) >> 8);
	u->b[3] = (uint8_t)(DNS_F_QR | DNS_F_RD | DNS_F_RA);
	u->b[6] = 0, u->b[7] = 2;
	u->b[8] = 0, u->b[9] = 0;
	u->b[10] = 0, u->b[11] = 1;
	u16(u, 0xc00c), u16(u, DNS_T_A), u16(u, 1);
	ttl_at = u->n;
	u32(u, 65536), u16(u, 4), u8(u, 192), u8(u, 0), u8(u, 2), u8(u, 1);
	if (cname) {
		u16(u, 0xc00c), u16(u, DNS_T_CNAME), u16(u, 1), u32(u, 60), u16(u, 2);
		u16(u, (uint16_t)(0xc000 | (ttl_at + 2)));
	} else {
		u16(u, (uint16_t)(0xc000 | (ttl_at + 2))), u16(u, DNS_T_A), u16(u, 1), u32(u, 60);
		u16(u, 4), u8(u, 192), u8(u, 0), u8(u, 2), u8(u, 2);
	}
	u8(u, 0), u16(u, DNS_T_OPT), u16(u, 1232), u32(u, 0), u16(u, 0);
	cr_assert_eq(dns_parse_answer(u->b, u->n, UP_ID, &u->q, &u->a), 0, "it parses as sent");
}

/* The cache lowers TTLs in its copy and ages them when it serves: a name that reads a TTL's
 * bytes would read as another name. Such an answer is not stored (counted); the reply built
 * from the upstream's own bytes is unaffected. */
Test(dns_cache, an_answer_whose_name_reads_a_ttl_is_not_stored)
{
	for (int cname = 0; cname < 2; cname++) {
		struct dns_cache *c = cache(16, 3600, 300);
		struct dns_cache_stats st;
		struct hit h;
		struct up u;
		int ret;

		forged_upstream(&u, cname);
		ret = dns_cache_put(c, 0, u.b, u.n, &u.a, T0);
		if (get(c, 0, "x.test", DNS_T_A, T0, &h)) {
			struct reply r = client_reply("x.test", DNS_T_A, h.msg, h.a, h.age);
			names_read_the_same(u.b, u.n, r.b, (size_t)r.n, &u.a);
		}
		cr_assert_eq(ret, 1, "not stored");
		st = stats(c);
		cr_assert_eq(st.not_stored_name_in_ttl, 1, "counted");
		cr_assert_eq(st.not_stored, 0, "not one of the other rules");
		cr_assert_eq(st.stored + st.entries + st.bytes, 0);
		/* Unaged and uncapped, the reply reads as the answer did. */
		struct reply r = client_reply("x.test", DNS_T_A, u.b, &u.a, 0);
		names_read_the_same(u.b, u.n, r.b, (size_t)r.n, &u.a);
		dns_cache_free(c);
	}
	CHECK_LEAKS();
}

/* What compression normally does, pointers to the question's name and into names in RDATA
 * (a CNAME's target, an NS's), is stored and reads the same when served capped and aged. */
Test(dns_cache, compressed_names_are_stored)
{
	struct dns_cache *c = cache(16, 3600, 300);
	uint8_t qb[512];
	struct hit h;
	struct up u;
	size_t at_edge, at_ns1;
	int qn;

	u.q = question("www.x.test", DNS_T_A);
	qn = dns_build_query(qb, sizeof(qb), UP_ID, &u.q);
	cr_assert_gt(qn, 0);
	u.n = DNS_HDR_LEN + u.q.name_len + 2 + 4;
	memcpy(u.b, qb, u.n);
	u.b[2] = (uint8_t)((DNS_F_QR | DNS_F_RD | DNS_F_RA) >> 8);
	u.b[3] = (uint8_t)(DNS_F_QR | DNS_F_RD | DNS_F_RA);
	u.b[6] = 0, u.b[7] = 2;  /* www.x.test CNAME edge.x.test; edge.x.test A */
	u.b[8] = 0, u.b[9] = 1;  /* x.test NS ns1.x.test */
	u.b[10] = 0, u.b[11] = 2; /* ns1.x.test A; OPT */
	u16(&u, 0xc00c), u16(&u, DNS_T_CNAME), u16(&u, 1), u32(&u, 86400), u16(&u, 7);
	at_edge = u.n;
	u8(&u, 4), u8(&u, 'e'), u8(&u, 'd'), u8(&u, 'g'), u8(&u, 'e'), u16(&u, 0xc010);
	u16(&u, (uint16_t)(0xc000 | at_edge)), u16(&u, DNS_T_A), u16(&u, 1), u32(&u, 300);
	u16(&u, 4), u8(&u, 192), u8(&u, 0), u8(&u, 2), u8(&u, 7);
	u16(&u, 0xc010), u16(&u, DNS_T_NS), u16(&u, 1), u32(&u, 172800), u16(&u, 6);
	at_ns1 = u.n;
	u8(&u, 3), u8(&u, 'n'), u8(&u, 's'), u8(&u, '1'), u16(&u, 0xc010);
	u16(&u, (uint16_t)(0xc000 | at_ns1)), u16(&u, DNS_T_A), u16(&u, 1), u32(&u, 172800);
	u16(&u, 4), u8(&u, 192), u8(&u, 0), u8(&u, 2), u8(&u, 53);
	u8(&u, 0), u16(&u, DNS_T_OPT), u16(&u, 1232), u32(&u, 0), u16(&u, 0);
	cr_assert_eq(dns_parse_answer(u.b, u.n, UP_ID, &u.q, &u.a), 0);
	put_ok(c, 0, &u, T0);
	for (int64_t age = 0; age < 300; age += 37) {
		cr_assert(get(c, 0, "WWW.x.test", DNS_T_A, T0 + SEC(age), &h));
		struct reply r = client_reply("WWW.x.test", DNS_T_A, h.msg, h.a, h.age);
		cr_assert_eq(r.an, 2);
		cr_assert_eq(r.ttl[0], 3600 - age, "capped and aged");
		names_read_the_same(u.b, u.n, r.b, (size_t)r.n, &u.a);
	}
	cr_assert_eq(stats(c).not_stored_name_in_ttl, 0);
	dns_cache_free(c);
	CHECK_LEAKS();
}

/* ---- keys --------------------------------------------------------------------------------- */

Test(dns_cache, lru_eviction_keeps_what_was_touched)
{
	struct dns_cache *c = cache(3, 3600, 300);
	const char *names[] = { "a.test", "b.test", "c.test", "d.test", "e.test" };
	struct up u;
	struct hit h;

	for (int i = 0; i < 3; i++) {
		upstream(&u, (struct spec){ .name = names[i], .n_a = 1, .ttl = { 600 } });
		put_ok(c, 0, &u, T0 + SEC(i));
	}
	cr_assert(get(c, 0, "a.test", DNS_T_A, T0 + SEC(5), &h), "a: now the most recent");
	upstream(&u, (struct spec){ .name = "d.test", .n_a = 1, .ttl = { 600 } });
	put_ok(c, 0, &u, T0 + SEC(6));
	cr_assert_eq(stats(c).evictions, 1);
	cr_assert_eq(stats(c).entries, 3);
	/* Order now (least recent first): c, a, d. Touch c, then a fifth evicts a. */
	cr_assert_not(get(c, 0, "b.test", DNS_T_A, T0 + SEC(7), &h), "b was the least recent");
	cr_assert(get(c, 0, "c.test", DNS_T_A, T0 + SEC(7), &h));
	upstream(&u, (struct spec){ .name = "e.test", .n_a = 1, .ttl = { 600 } });
	put_ok(c, 0, &u, T0 + SEC(8));
	cr_assert_eq(stats(c).evictions, 2);
	cr_assert_not(get(c, 0, "a.test", DNS_T_A, T0 + SEC(9), &h));
	cr_assert(get(c, 0, "c.test", DNS_T_A, T0 + SEC(9), &h));
	cr_assert(get(c, 0, "d.test", DNS_T_A, T0 + SEC(9), &h));
	cr_assert(get(c, 0, "e.test", DNS_T_A, T0 + SEC(9), &h));
	cr_assert_eq(stats(c).entries, 3);
	cr_assert_eq(stats(c).expired, 0);
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, an_expired_lru_entry_counts_as_expired)
{
	struct dns_cache *c = cache(1, 3600, 300);
	struct up u;
	struct dns_cache_stats st;

	upstream(&u, (struct spec){ .name = "a.test", .n_a = 1, .ttl = { 5 } });
	put_ok(c, 0, &u, T0);
	upstream(&u, (struct spec){ .name = "b.test", .n_a = 1, .ttl = { 5 } });
	put_ok(c, 0, &u, T0 + SEC(5));
	st = stats(c);
	cr_assert_eq(st.expired, 1);
	cr_assert_eq(st.evictions, 0);
	upstream(&u, (struct spec){ .name = "c.test", .n_a = 1, .ttl = { 5 } });
	put_ok(c, 0, &u, T0 + SEC(6));
	st = stats(c);
	cr_assert_eq(st.expired, 1);
	cr_assert_eq(st.evictions, 1);
	cr_assert_eq(st.entries, 1);
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, per_server_entries)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct up u;
	struct hit h;

	upstream(&u, (struct spec){ .name = "split.test", .n_a = 1, .ttl = { 300 }, .tag = 1 });
	put_ok(c, 0, &u, T0);
	upstream(&u, (struct spec){ .name = "split.test", .n_a = 1, .ttl = { 200 }, .tag = 2 });
	put_ok(c, 1, &u, T0);
	cr_assert_eq(stats(c).entries, 2);
	cr_assert(get(c, 0, "split.test", DNS_T_A, T0 + SEC(1), &h));
	cr_assert_eq(client_reply("split.test", DNS_T_A, h.msg, h.a, h.age).addr_last[0], 1);
	cr_assert(get(c, 1, "split.test", DNS_T_A, T0 + SEC(1), &h));
	cr_assert_eq(client_reply("split.test", DNS_T_A, h.msg, h.a, h.age).addr_last[0], 2);
	cr_assert_not(get(c, 2, "split.test", DNS_T_A, T0 + SEC(1), &h));
	cr_assert(get(c, 0, "split.test", DNS_T_A, T0 + SEC(250), &h), "server 0's own TTL");
	cr_assert_not(get(c, 1, "split.test", DNS_T_A, T0 + SEC(250), &h));
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, names_compare_case_insensitively_type_and_class_do_not)
{
	struct dns_cache *c = cache(16, 3600, 300);
	struct up u;
	struct hit h;
	struct dns_question q;
	struct reply r;

	upstream(&u, (struct spec){ .name = "WWW.Example.com", .n_a = 1, .ttl = { 300 } });
	put_ok(c, 0, &u, T0);
	cr_assert(get(c, 0, "www.EXAMPLE.COM", DNS_T_A, T0 + SEC(3), &h));
	cr_assert_str_eq(h.a->q.name, "WWW.Example.com", "the upstream's case kept");
	r = client_reply("www.EXAMPLE.COM", DNS_T_A, h.msg, h.a, h.age);
	cr_assert_eq(r.ttl[0], 297);
	cr_assert_eq(memcmp(r.b + DNS_HDR_LEN, "\3www\7EXAMPLE\3COM", 17), 0);
	cr_assert_not(get(c, 0, "www.example.com", DNS_T_AAAA, T0, &h));
	cr_assert_not(get(c, 0, "www.example.co", DNS_T_A, T0, &h));
	q = question("www.example.com", DNS_T_A);
	q.qclass = 3; /* CH */
	cr_assert_not(dns_cache_get(c, 0, &q, T0, &h.msg, &h.len, &h.a, &h.age));
	q = question("www.example.com", DNS_T_A);
	q.nameable = false;
	cr_assert_not(dns_cache_get(c, 0, &q, T0, &h.msg, &h.len, &h.a, &h.age),
		      "a name that is not nameable never hits");
	cr_assert_eq(stats(c).misses, 4);
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, same_key_replaced)
{
	struct dns_cache *c = cache(2, 3600, 300);
	struct up u, v;
	struct hit h;
	struct dns_cache_stats st;

	upstream(&u, (struct spec){ .name = "r.test", .n_a = 1, .ttl = { 300 }, .tag = 1 });
	put_ok(c, 0, &u, T0);
	upstream(&v, (struct spec){ .name = "other.test", .n_a = 1, .ttl = { 300 } });
	put_ok(c, 0, &v, T0);
	upstream(&u, (struct spec){ .name = "R.test", .n_a = 3, .ttl = { 50, 50, 50 }, .tag = 7 });
	put_ok(c, 0, &u, T0 + SEC(10));
	st = stats(c);
	cr_assert_eq(st.entries, 2, "replaced, not added: nothing evicted");
	cr_assert_eq(st.evictions, 0);
	cr_assert_eq(st.stored, 3);
	cr_assert_eq(st.bytes, u.n + v.n);
	cr_assert(get(c, 0, "r.test", DNS_T_A, T0 + SEC(20), &h));
	cr_assert_eq(h.age, 10, "aged from the replacement");
	cr_assert_eq(h.a->an, 3);
	cr_assert_eq(client_reply("r.test", DNS_T_A, h.msg, h.a, h.age).ttl[2], 40);
	cr_assert_eq(client_reply("r.test", DNS_T_A, h.msg, h.a, h.age).addr_last[0], 7);
	cr_assert_not(get(c, 0, "r.test", DNS_T_A, T0 + SEC(60), &h), "the new TTL");
	cr_assert(get(c, 0, "other.test", DNS_T_A, T0 + SEC(60), &h));
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, clear_drops_everything_counters_stay)
{
	struct dns_cache *c = cache(16, 3600, 300);
	const char *names[] = { "a.test", "b.test", "c.test" };
	struct up u;
	struct hit h;
	struct dns_cache_stats st;

	for (int i = 0; i < 3; i++) {
		upstream(&u, (struct spec){ .name = names[i], .n_a = 1, .ttl = { 300 } });
		put_ok(c, (uint32_t)i, &u, T0);
	}
	cr_assert_eq(stats(c).entries, 3);
	dns_cache_clear(c);
	st = stats(c);
	cr_assert_eq(st.entries, 0);
	cr_assert_eq(st.bytes, 0);
	cr_assert_eq(st.stored, 3);
	for (int i = 0; i < 3; i++)
		cr_assert_not(get(c, (uint32_t)i, names[i], DNS_T_A, T0, &h));
	put_ok(c, 2, &u, T0);
	cr_assert(get(c, 2, "c.test", DNS_T_A, T0, &h), "usable after a clear");
	dns_cache_free(c);
	CHECK_LEAKS();
}

Test(dns_cache, config_checked)
{
	struct dns_cache_config cfg = { .max_entries = 0, .max_ttl_s = 3600, .neg_ttl_max_s = 300 };
	struct dns_cache *c = NULL;

	cr_assert_eq(dns_cache_new(&cfg, &c), -EINVAL);
	cr_assert_null(c);
	dns_cache_free(NULL);
}

/* ---- randomized, against a dumb reference -------------------------------------------------- */

struct ref_entry {
	bool used;
	uint32_t server;
	unsigned name, type;
	int64_t stored, expires;
	uint32_t ttl;
	uint8_t tag;
	uint64_t last_use;
};

#define REF_MAX 4
#define NAMES 6

static const char *ref_names[NAMES] = { "n0.test", "n1.test", "n2.test", "n3.test",
					"n4.example", "n5.example" };

struct ref {
	struct ref_entry e[REF_MAX];
	uint64_t clock;
	struct dns_cache_stats st;
};

static struct ref_entry *ref_find(struct ref *r, uint32_t server, unsigned name, unsigned type)
{
	for (int i = 0; i < REF_MAX; i++)
		if (r->e[i].used && r->e[i].server == server && r->e[i].name == name &&
		    r->e[i].type == type)
			return &r->e[i];
	return NULL;
}

static void ref_put(struct ref *r, uint32_t server, unsigned name, unsigned type, uint32_t ttl,
		    uint8_t tag, int64_t now)
{
	struct ref_entry *e = ref_find(r, server, name, type);

	if (ttl == 0) {
		r->st.not_stored++;
		return;
	}
	for (int i = 0; !e && i < REF_MAX; i++)
		if (!r->e[i].used)
			e = &r->e[i];
	if (!e) { /* full: the least recently used goes */
		e = &r->e[0];
		for (int i = 1; i < REF_MAX; i++)
			if (r->e[i].last_use < e->last_use)
				e = &r->e[i];
		if (now >= e->expires)
			r->st.expired++;
		else
			r->st.evictions++;
	}
	*e = (struct ref_entry){ .used = true, .server = server, .name = name, .type = type,
				 .stored = now, .expires = now + SEC(ttl), .ttl = ttl, .tag = tag,
				 .last_use = ++r->clock };
	r->st.stored++;
}

/* A hit's entry, or NULL. */
static struct ref_entry *ref_get(struct ref *r, uint32_t server, unsigned name, unsigned type,
				 int64_t now)
{
	struct ref_entry *e = ref_find(r, server, name, type);

	if (e && now >= e->expires) {
		e->used = false;
		r->st.expired++;
		e = NULL;
	}
	if (!e) {
		r->st.misses++;
		return NULL;
	}
	e->last_use = ++r->clock;
	r->st.hits++;
	return e;
}

static void compare_stats(const struct dns_cache *c, const struct ref *r, int step)
{
	struct dns_cache_stats st = stats(c);
	uint64_t n = 0;

	for (int i = 0; i < REF_MAX; i++)
		n += r->e[i].used;
	cr_assert_eq(st.hits, r->st.hits, "step %d", step);
	cr_assert_eq(st.misses, r->st.misses, "step %d", step);
	cr_assert_eq(st.evictions, r->st.evictions, "step %d", step);
	cr_assert_eq(st.expired, r->st.expired, "step %d", step);
	cr_assert_eq(st.stored, r->st.stored, "step %d", step);
	cr_assert_eq(st.not_stored, r->st.not_stored, "step %d", step);
	cr_assert_eq(st.entries, n, "step %d", step);
}

/* The name in a random case. */
static void random_case(struct tu_rng *rng, const char *name, char *out)
{
	size_t i = 0;

	for (; name[i]; i++)
		out[i] = (char)(name[i] >= 'a' && name[i] <= 'z' && tu_rand_below(rng, 2) ?
				name[i] - 32 : name[i]);
	out[i] = 0;
}

Test(dns_cache, randomized_against_reference)
{
	struct dns_cache *c = cache(REF_MAX, 3600, 300);
	struct ref r = { 0 };
	struct tu_rng rng;
	int64_t now = T0;
	struct up u;

	tu_rng_seed(&rng, 0x5eed);
	for (int step = 0; step < 20000; step++) {
		uint32_t server = tu_rand_below(&rng, 2);
		unsigned name = tu_rand_below(&rng, NAMES);
		unsigned type = tu_rand_below(&rng, 2) ? DNS_T_A : DNS_T_AAAA;
		char cased[32];
		struct hit h;
		bool hit;

		now += MS(tu_rand_below(&rng, 3000));
		random_case(&rng, ref_names[name], cased);
		if (tu_rand_below(&rng, 2)) {
			uint32_t ttl = tu_rand_below(&rng, 16);
			uint8_t tag = (uint8_t)tu_rand_below(&rng, 200);
			upstream(&u, (struct spec){ .name = cased, .type = (uint16_t)type,
						    .n_a = 1, .ttl = { ttl }, .tag = tag });
			cr_assert_eq(dns_cache_put(c, server, u.b, u.n, &u.a, now), ttl ? 0 : 1);
			ref_put(&r, server, name, type, ttl, tag, now);
		} else {
			struct ref_entry *e = ref_get(&r, server, name, type, now);
			hit = dns_cache_get(c, server, &(struct dns_question){ 0 }, now, &h.msg,
					    &h.len, &h.a, &h.age);
			cr_assert_not(hit, "an empty, unnameable question never hits");
			r.st.misses++;
			hit = get(c, server, cased, (uint16_t)type, now, &h);
			cr_assert_eq(hit, e != NULL, "step %d", step);
			if (e) {
				struct reply rep = client_reply(cased, (uint16_t)type, h.msg, h.a,
								h.age);
				cr_assert_eq(h.age, (uint32_t)((now - e->stored) / SEC(1)));
				cr_assert_eq(rep.ttl[0], e->ttl - h.age, "step %d", step);
				cr_assert_eq(rep.addr_last[0], e->tag, "step %d", step);
			}
		}
		compare_stats(c, &r, step);
	}
	dns_cache_free(c);
	CHECK_LEAKS();
}
