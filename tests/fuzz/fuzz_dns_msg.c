/* fuzz_dns_msg.c — libFuzzer target for the DNS codec (core/dns_msg.c).
 *
 * Input: a message. Parsed as a client's query, in an exactly-sized heap copy (ASan sees any
 * over-read). When it parses: a nameable name is a name the outbounds accept (letters, digits,
 * '-', '_', '.'), and the query built upstream from it parses back to the same question; a
 * reply made here parses as an answer to it and respects the client's limit; and the same
 * bytes with QR set, parsed as an upstream answer to that question, rebuild into a reply that
 * again parses and respects the limit. That answer is also put into a cache (dns/cache.h)
 * whose TTL cap lowers most TTLs: it is kept only if none of its names reads a TTL's bytes
 * (dns_answer_names_read_ttls), and a reply built from the kept copy, aged, always rebuilds and
 * reads every name as the answer did (each kept RR's owner and the names in a CNAME, NS, PTR,
 * MX, SRV or SOA, read as core/dns_msg.c reads names; a name read in place past the kept RRs,
 * whose bytes no reply copies, is not compared). Nothing may crash, read or write out of
 * bounds.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dns_msg.h"
#include "dns/cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT 4096

static bool name_ok(const struct dns_question *q)
{
	for (size_t i = 0; i < q->name_len; i++) {
		char c = q->name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.'))
			return false;
	}
	return q->name_len > 0 && q->name_len <= DNS_NAME_MAX && strlen(q->name) == q->name_len;
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

/* The name at off read as core/dns_msg.c reads names (pointers strictly backwards and past the
 * header, at most 64, 255 wire bytes, no reserved label types): its labels into out (*n
 * bytes), the furthest byte looked at in *far. 0, or -1 when it does not read as a name. */
static int strict_name(const uint8_t *m, size_t len, size_t off, uint8_t *out, size_t *n,
		       size_t *far)
{
	size_t pos = off, wire = 0;
	int jumps = 0;

	*n = 0;
	*far = off;
	for (;;) {
		if (pos >= len)
			return -1;
		uint8_t l = m[pos];
		if ((l & 0xc0) == 0xc0) {
			size_t to;
			if (pos + 1 >= len)
				return -1;
			if (pos + 1 > *far)
				*far = pos + 1;
			to = (size_t)(l & 0x3f) << 8 | m[pos + 1];
			if (to >= pos || to < DNS_HDR_LEN || ++jumps > DNS_MAX_JUMPS)
				return -1;
			pos = to;
			continue;
		}
		if (l & 0xc0 || pos + 1 + l > len)
			return -1;
		if (pos + l > *far)
			*far = pos + l;
		if ((wire += 1u + l) + 1 > DNS_WIRE_NAME_MAX)
			return -1;
		memcpy(out + *n, m + pos, 1u + l);
		*n += 1u + l;
		if (l == 0)
			return 0;
		pos += 1u + l;
	}
}

/* The name at off reads the same in x and y (keep: the bytes both hold alike but for TTLs). */
static void same_name(const uint8_t *x, size_t xn, const uint8_t *y, size_t yn, size_t off,
		      size_t keep)
{
	uint8_t tx[DNS_WIRE_NAME_MAX + 64], ty[DNS_WIRE_NAME_MAX + 64];
	size_t nx, ny, fx, fy;
	int rx = strict_name(x, xn, off, tx, &nx, &fx);
	int ry = strict_name(y, yn, off, ty, &ny, &fy);

	if (fx >= keep || fy >= keep)
		return; /* read on past the kept RRs: bytes no reply copies */
	if (rx != ry || (rx == 0 && (nx != ny || memcmp(tx, ty, nx) != 0)))
		abort();
}

/* Where the name at off ends in place (after its first pointer, or its root label); len when
 * it runs off the message or meets a reserved label type. */
static size_t name_end(const uint8_t *m, size_t len, size_t off)
{
	while (off < len && (m[off] & 0xc0) == 0 && m[off])
		off += 1u + m[off];
	if (off >= len || (m[off] & 0xc0) == 0x40 || (m[off] & 0xc0) == 0x80)
		return len;
	return off + ((m[off] & 0xc0) ? 2 : 1);
}

/* Every name of a's kept RRs reads the same in x (the answer) and y (a reply rebuilt from it:
 * the RRs at the same offsets). */
static void names_same(const uint8_t *x, size_t xn, const uint8_t *y, size_t yn,
		       const struct dns_answer *a)
{
	size_t off = a->rr_off, kept = (size_t)a->keep_an + a->keep_ns + a->keep_ar;

	for (size_t i = 0; i < kept; i++) {
		/* The parser walked these RRs: each owner name and fixed part is there. */
		size_t p = name_end(x, xn, off), rd = p + 10, rdlen = get16(x + p + 8);
		uint16_t type = get16(x + p);

		same_name(x, xn, y, yn, off, a->keep_end);
		if (type == DNS_T_CNAME || type == DNS_T_NS || type == DNS_T_PTR)
			same_name(x, xn, y, yn, rd, a->keep_end);
		else if (type == 15 && rdlen > 2) /* MX */
			same_name(x, xn, y, yn, rd + 2, a->keep_end);
		else if (type == 33 && rdlen > 6) /* SRV */
			same_name(x, xn, y, yn, rd + 6, a->keep_end);
		else if (type == DNS_T_SOA && rdlen > 0) {
			uint8_t t[DNS_WIRE_NAME_MAX + 64];
			size_t second = name_end(x, xn, rd), n, far;
			same_name(x, xn, y, yn, rd, a->keep_end);
			/* RNAME, after an MNAME that reads as a name. */
			if (second < rd + rdlen && strict_name(x, xn, rd, t, &n, &far) == 0)
				same_name(x, xn, y, yn, second, a->keep_end);
		}
		off = rd + rdlen;
	}
}

/* The answer (msg, a) put into a cache that caps TTLs at 60 s, and a reply rebuilt from the
 * kept copy at several ages: see the top of this file. */
static void through_cache(const uint8_t *msg, size_t len, const struct dns_answer *a,
			  const struct dns_query *q, const uint8_t *qmsg)
{
	static struct dns_cache *c;
	static uint8_t out[70000];
	struct dns_cache_config cfg = { .max_entries = 4, .max_ttl_s = 60, .neg_ttl_max_s = 30 };
	struct dns_cache_stats before, after;
	const int64_t t0 = 1000000000000LL;
	const struct dns_answer *ca;
	const uint8_t *cm;
	size_t cl;
	uint32_t age;
	bool reads = dns_answer_names_read_ttls(msg, len, a);
	int ret;

	if (!c && dns_cache_new(&cfg, &c) != 0)
		abort();
	dns_cache_clear(c);
	dns_cache_get_stats(c, &before);
	ret = dns_cache_put(c, 0, msg, len, a, t0);
	dns_cache_get_stats(c, &after);
	if (ret < 0 || (reads && ret == 0))
		abort();
	/* Refused for reading a TTL only when it does (another rule may refuse it first). */
	if (after.not_stored_name_in_ttl != before.not_stored_name_in_ttl + (ret == 1 && reads &&
	    after.not_stored == before.not_stored))
		abort();
	if (ret != 0)
		return;
	if (!dns_cache_get(c, 0, &a->q, t0 + 3000000000LL, &cm, &cl, &ca, &age))
		return; /* an entry of less than 3 s */
	for (uint32_t extra = 0; extra <= 60; extra += 20) {
		int n = dns_build_from_answer(out, sizeof(out), 65535, q, qmsg, cm, ca, age + extra);
		if (n == -EBADMSG || n <= 0)
			abort();
		names_same(msg, len, out, (size_t)n, a);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t addrs[2][16] = { { 198, 19, 0, 1 }, { 198, 19, 0, 2 } };
	struct dns_query q, back;
	struct dns_answer a;
	uint8_t out[2048], *copy;
	size_t limit;
	int n;

	if (size > MAX_INPUT)
		size = MAX_INPUT;
	copy = malloc(size ? size : 1);
	memcpy(copy, data, size);
	if (dns_parse_query(copy, size, &q) != 0) {
		if (size >= DNS_HDR_LEN &&
		    dns_build_header_error(out, sizeof(out), copy, size, DNS_R_FORMERR) != DNS_HDR_LEN)
			abort();
		goto out;
	}
	if (q.q.nameable) {
		if (!name_ok(&q.q))
			abort();
		n = dns_build_query(out, sizeof(out), 7, &q.q);
		if (n < 0 || dns_parse_query(out, (size_t)n, &back) != 0 ||
		    !dns_question_equal(&q.q, &back.q) || strcmp(q.q.name, back.q.name) != 0)
			abort();
	}
	limit = dns_reply_limit(&q, false, 1472);
	n = dns_build_synth(out, sizeof(out), limit, &q, copy, DNS_R_NOERROR, 4, addrs, 2, 1);
	if (n < 0 || (size_t)n > sizeof(out) ||
	    ((size_t)n > limit && (size_t)n > DNS_HDR_LEN + q.q.wire_len + DNS_OPT_LEN))
		abort();
	if (dns_parse_answer(out, (size_t)n, q.id, &q.q, &a) != 0)
		abort();
	/* The same bytes as an upstream's answer to that question. */
	copy[2] |= 0x80;
	if (dns_parse_answer(copy, size, q.id, &q.q, &a) == 0) {
		through_cache(copy, size, &a, &q, copy);
		copy[2] &= 0x7f;
		n = dns_build_from_answer(out, sizeof(out), limit, &q, copy, copy, &a, 3);
		if (n == -ENOSPC || n == -EBADMSG)
			goto out; /* no room, or a name pointing into a TTL: the caller answers SERVFAIL */
		if (n < 0 || ((size_t)n > limit && (size_t)n > DNS_HDR_LEN + q.q.wire_len + DNS_OPT_LEN))
			abort();
		if (dns_parse_answer(out, (size_t)n, q.id, &q.q, &a) != 0)
			abort();
	}
out:
	free(copy);
	return 0;
}
