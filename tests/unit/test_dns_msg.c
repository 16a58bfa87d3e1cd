/* test_dns_msg.c — core/dns_msg: queries parsed (every refusal by its own code), names bounded
 * (pointers only backwards, a bounded number of them, 255 wire bytes, label types), nameable
 * names, answers checked against the question asked, negative TTLs from the SOA, replies
 * rebuilt for the asking client (its id, question bytes and OPT; TTLs aged; truncation to its
 * limit), replies made up here, header-only errors and the upstream query; names that read a
 * TTL's bytes (owners, RDATA names, pointers either way, names read on past their RDATA) found,
 * ordinary compression not.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "core/dns_msg.h"

/* ---- message building helpers (independent of the code under test) ----------------------- */

struct msg {
	uint8_t b[1024];
	size_t n;
};

static void u8(struct msg *m, uint8_t v) { m->b[m->n++] = v; }
static void u16(struct msg *m, uint16_t v) { u8(m, (uint8_t)(v >> 8)); u8(m, (uint8_t)v); }
static void u32(struct msg *m, uint32_t v) { u16(m, (uint16_t)(v >> 16)); u16(m, (uint16_t)v); }

static void hdr(struct msg *m, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns,
		uint16_t ar)
{
	m->n = 0;
	u16(m, id), u16(m, flags), u16(m, qd), u16(m, an), u16(m, ns), u16(m, ar);
}

/* "www.example.com" as labels. */
static void name(struct msg *m, const char *dotted)
{
	const char *p = dotted;

	while (*p) {
		const char *dot = strchr(p, '.');
		size_t l = dot ? (size_t)(dot - p) : strlen(p);
		u8(m, (uint8_t)l);
		memcpy(m->b + m->n, p, l);
		m->n += l;
		p += l + (dot ? 1 : 0);
	}
	u8(m, 0);
}

static void question(struct msg *m, const char *dotted, uint16_t type)
{
	name(m, dotted);
	u16(m, type);
	u16(m, 1);
}

static void opt(struct msg *m, uint16_t size)
{
	u8(m, 0), u16(m, DNS_T_OPT), u16(m, size), u32(m, 0), u16(m, 0);
}

static void a_rr(struct msg *m, uint32_t ttl, uint8_t last)
{
	u16(m, 0xc00c), u16(m, DNS_T_A), u16(m, 1), u32(m, ttl), u16(m, 4);
	u8(m, 192), u8(m, 0), u8(m, 2), u8(m, last);
}

static struct dns_query parse_q(const struct msg *m)
{
	struct dns_query q;

	cr_assert_eq(dns_parse_query(m->b, m->n, &q), 0);
	return q;
}

/* ---- queries ------------------------------------------------------------------------------ */

Test(dns_msg, a_query_with_opt)
{
	struct msg m;
	struct dns_query q;

	hdr(&m, 0x1234, DNS_F_RD | DNS_F_CD, 1, 0, 0, 1);
	question(&m, "Www.Example.COM", DNS_T_AAAA);
	opt(&m, 4096);
	q = parse_q(&m);
	cr_assert_eq(q.id, 0x1234);
	cr_assert_str_eq(q.q.name, "Www.Example.COM", "the case is kept");
	cr_assert(q.q.nameable);
	cr_assert_eq(q.q.qtype, DNS_T_AAAA);
	cr_assert(q.has_opt);
	cr_assert_eq(q.udp_size, 4096);
	cr_assert_eq(q.q.wire_len, 17 + 4);
	cr_assert_eq(dns_reply_limit(&q, false, 1472), DNS_EDNS_SIZE, "a client's size is capped");
	cr_assert_eq(dns_reply_limit(&q, false, 548), 548, "and by the TUN's MTU");
	cr_assert_eq(dns_reply_limit(&q, true, 548), 65535);
	hdr(&m, 1, 0, 1, 0, 0, 0);
	question(&m, "a.test", DNS_T_A);
	q = parse_q(&m);
	cr_assert_not(q.has_opt);
	cr_assert_eq(dns_reply_limit(&q, false, 1472), DNS_UDP_MIN);
}

Test(dns_msg, refusals_each_by_its_code)
{
	struct msg m;
	struct dns_query q;

	cr_assert_eq(dns_parse_query((const uint8_t *)"\1\2\3", 3, &q), DNS_E_SHORT);
	hdr(&m, 1, DNS_F_QR, 1, 0, 0, 0);
	question(&m, "a.test", DNS_T_A);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_QR, "never answer an answer");
	hdr(&m, 1, 2u << 11, 1, 0, 0, 0);
	question(&m, "a.test", DNS_T_A);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_OPCODE);
	hdr(&m, 1, 0, 2, 0, 0, 0);
	question(&m, "a.test", DNS_T_A);
	question(&m, "b.test", DNS_T_A);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_QDCOUNT);
	hdr(&m, 1, 0, 1, 0, 0, 0);
	question(&m, "a.test", DNS_T_A);
	cr_assert_eq(dns_parse_query(m.b, m.n - 1, &q), DNS_E_SHORT, "cut in the class");
	hdr(&m, 1, 0, 1, 0, 0, 1);
	question(&m, "a.test", DNS_T_A);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_SHORT, "an announced RR missing");
}

Test(dns_msg, names_are_bounded)
{
	struct msg m;
	struct dns_query q;

	/* A pointer to itself, a forward pointer, a reserved label type. */
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u16(&m, 0xc00c), u16(&m, 1), u16(&m, 1);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_NAME);
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u16(&m, 0xc020), u16(&m, 1), u16(&m, 1);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_NAME);
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u8(&m, 0x41), u8(&m, 'a'), u8(&m, 0), u16(&m, 1), u16(&m, 1);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_NAME);
	/* A label, then a pointer into the header (found by fuzzing: a reply echoing such a
	 * question would read our header as a name). */
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u8(&m, 1), u8(&m, 'a'), u16(&m, 0xc002), u16(&m, 1), u16(&m, 1);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_NAME);
	/* Two labels, then a pointer back into the second one (found by fuzzing: a reply has
	 * other bytes after the question, so the echoed name would read differently). */
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u8(&m, 1), u8(&m, 'a'), u8(&m, 3), u8(&m, 'b'), u8(&m, 0), u8(&m, 'c'), u16(&m, 0xc00f);
	u16(&m, 1), u16(&m, 1);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_NAME);
	/* 5 labels of 63: 320 wire bytes. */
	hdr(&m, 1, 0, 1, 0, 0, 0);
	for (int i = 0; i < 5; i++) {
		u8(&m, 63);
		memset(m.b + m.n, 'a', 63);
		m.n += 63;
	}
	u8(&m, 0), u16(&m, 1), u16(&m, 1);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), DNS_E_NAME);
	/* 4 labels of 63: 256 wire bytes with the root: still too long; 3 + one of 61 fits. */
	hdr(&m, 1, 0, 1, 0, 0, 0);
	for (int i = 0; i < 4; i++) {
		u8(&m, i == 3 ? 61 : 63);
		memset(m.b + m.n, 'a', i == 3 ? 61 : 63);
		m.n += i == 3 ? 61 : 63;
	}
	u8(&m, 0), u16(&m, 1), u16(&m, 1);
	cr_assert_eq(dns_parse_query(m.b, m.n, &q), 0);
	cr_assert_eq(q.q.name_len, 253);
	cr_assert(q.q.nameable);
}

Test(dns_msg, only_ldh_names_are_nameable)
{
	struct msg m;
	struct dns_query q;

	/* One label "corp.example" (a dot inside a label), then "evil". */
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u8(&m, 12), memcpy(m.b + m.n, "corp.example", 12), m.n += 12;
	u8(&m, 4), memcpy(m.b + m.n, "evil", 4), m.n += 4;
	u8(&m, 0), u16(&m, 1), u16(&m, 1);
	q = parse_q(&m);
	cr_assert_not(q.q.nameable, "a '.' inside a label");
	cr_assert_str_eq(q.q.name, "corp?example.evil");
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u8(&m, 3), u8(&m, 'a'), u8(&m, 0), u8(&m, 'b'), u8(&m, 0), u16(&m, 1), u16(&m, 1);
	q = parse_q(&m);
	cr_assert_not(q.q.nameable, "a NUL inside a label");
	hdr(&m, 1, 0, 1, 0, 0, 0);
	u8(&m, 0), u16(&m, DNS_T_NS), u16(&m, 1);
	q = parse_q(&m);
	cr_assert_not(q.q.nameable, "the root");
	cr_assert_eq(q.q.name_len, 0);
}

/* ---- answers ------------------------------------------------------------------------------ */

/* An answer to "www.example.com A": CNAME via pointer, two A records, an OPT and one RR after it. */
static void answer(struct msg *m, uint16_t id, const char *qname, uint32_t ttl1, uint32_t ttl2)
{
	hdr(m, id, DNS_F_QR | DNS_F_RD | DNS_F_RA | DNS_F_AD, 1, 3, 0, 2);
	question(m, qname, DNS_T_A);
	u16(m, 0xc00c), u16(m, DNS_T_CNAME), u16(m, 1), u32(m, 900), u16(m, 6);
	u8(m, 3), memcpy(m->b + m->n, "cdn", 3), m->n += 3, u16(m, 0xc00c);
	a_rr(m, ttl1, 1);
	a_rr(m, ttl2, 2);
	opt(m, 1232);
	a_rr(m, 77, 9); /* after the OPT: not copied */
}

Test(dns_msg, answers_are_checked_against_the_question)
{
	struct msg q, ans;
	struct dns_query cq;
	struct dns_answer a;

	hdr(&q, 7, DNS_F_RD, 1, 0, 0, 0);
	question(&q, "www.example.com", DNS_T_A);
	cq = parse_q(&q);
	answer(&ans, 7, "WWW.example.com", 300, 60);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 7, &cq.q, &a), 0, "case does not matter");
	cr_assert_eq(a.keep_an, 3);
	cr_assert_eq(a.keep_ar, 0, "the OPT and what follows it are left out");
	cr_assert_eq(a.min_ttl, 60);
	cr_assert_eq(a.n_ttl, 3);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 8, &cq.q, &a), DNS_E_MISMATCH, "another id");
	answer(&ans, 7, "www.example.net", 300, 60);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 7, &cq.q, &a), DNS_E_MISMATCH, "another name");
	answer(&ans, 7, "www.example.com", 300, 60);
	ans.b[2] &= 0x7f;
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 7, &cq.q, &a), DNS_E_QR);
	answer(&ans, 7, "www.example.com", 300, 60);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n - 3, 7, &cq.q, &a), DNS_E_SHORT);
}

Test(dns_msg, the_negative_ttl_comes_from_the_soa)
{
	struct msg q, ans;
	struct dns_query cq;
	struct dns_answer a;

	hdr(&q, 9, DNS_F_RD, 1, 0, 0, 0);
	question(&q, "nx.example.com", DNS_T_A);
	cq = parse_q(&q);
	hdr(&ans, 9, DNS_F_QR | DNS_R_NXDOMAIN, 1, 0, 1, 0);
	question(&ans, "nx.example.com", DNS_T_A);
	u16(&ans, 0xc00f), u16(&ans, DNS_T_SOA), u16(&ans, 1), u32(&ans, 600);
	u16(&ans, 2 + 2 + 20);
	u16(&ans, 0xc00f), u16(&ans, 0xc00f);                     /* MNAME, RNAME */
	u32(&ans, 1), u32(&ans, 2), u32(&ans, 3), u32(&ans, 4), u32(&ans, 300); /* ... MINIMUM */
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 9, &cq.q, &a), 0);
	cr_assert_eq(DNS_RCODE(a.flags), DNS_R_NXDOMAIN);
	cr_assert_eq(a.min_ttl, 300, "min(SOA TTL, MINIMUM)");
}

/* An NXDOMAIN at the end of a CNAME chain (RFC 2308 section 2.1): the CNAME is in the answer
 * section, yet the answer is negative; it lives no longer than the SOA's negative TTL, and
 * without an SOA it has none (not cached, RFC 2308 section 5). */
static void nx_after_cname(struct msg *ans, uint32_t cname_ttl, bool soa, uint32_t soa_min)
{
	hdr(ans, 9, DNS_F_QR | DNS_R_NXDOMAIN, 1, 1, soa ? 1 : 0, 0);
	question(ans, "nx.example.com", DNS_T_A);
	u16(ans, 0xc00c), u16(ans, DNS_T_CNAME), u16(ans, 1), u32(ans, cname_ttl);
	u16(ans, 2), u16(ans, 0xc00f);                            /* -> example.com */
	if (!soa)
		return;
	u16(ans, 0xc00f), u16(ans, DNS_T_SOA), u16(ans, 1), u32(ans, 600);
	u16(ans, 2 + 2 + 20);
	u16(ans, 0xc00f), u16(ans, 0xc00f);
	u32(ans, 1), u32(ans, 2), u32(ans, 3), u32(ans, 4), u32(ans, soa_min);
}

Test(dns_msg, an_nxdomain_after_a_cname_keeps_the_negative_ttl)
{
	struct msg q, ans;
	struct dns_query cq;
	struct dns_answer a;

	hdr(&q, 9, DNS_F_RD, 1, 0, 0, 0);
	question(&q, "nx.example.com", DNS_T_A);
	cq = parse_q(&q);
	nx_after_cname(&ans, 3600, true, 5);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 9, &cq.q, &a), 0);
	cr_assert_eq(a.an, 1);
	cr_assert_eq(a.min_ttl, 5, "the SOA's, not the CNAME's 3600");
	nx_after_cname(&ans, 2, true, 300);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 9, &cq.q, &a), 0);
	cr_assert_eq(a.min_ttl, 2, "nor longer than the CNAME");
	nx_after_cname(&ans, 3600, false, 0);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 9, &cq.q, &a), 0);
	cr_assert_eq(a.min_ttl, UINT32_MAX, "no SOA: no negative TTL");
}

/* ---- replies ------------------------------------------------------------------------------ */

Test(dns_msg, a_reply_is_rebuilt_for_the_asking_client)
{
	struct msg q, ans;
	struct dns_query cq;
	struct dns_answer a, back;
	uint8_t out[1024];
	int n;

	hdr(&q, 0xbeef, DNS_F_RD | DNS_F_CD, 1, 0, 0, 1);
	question(&q, "WwW.ExAmPlE.CoM", DNS_T_A); /* 0x20 case from the client */
	opt(&q, 1400);
	cq = parse_q(&q);
	answer(&ans, 0x4242, "www.example.com", 300, 60);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 0x4242, &cq.q, &a), 0);
	n = dns_build_from_answer(out, sizeof(out), 1232, &cq, q.b, ans.b, &a, 50);
	cr_assert_gt(n, 0);
	cr_assert_eq(out[0] << 8 | out[1], 0xbeef, "the client's id");
	cr_assert(out[2] & 0x80, "QR");
	cr_assert(out[2] & 0x01, "RD copied");
	cr_assert(out[3] & DNS_F_CD, "CD copied");
	cr_assert(out[3] & DNS_F_AD, "AD from the answer");
	cr_assert_arr_eq(out + 12, q.b + 12, cq.q.wire_len, "the client's question bytes");
	cr_assert_eq(out[7], 3);
	cr_assert_eq(out[11], 1, "our OPT for a client that sent one");
	cr_assert_eq(dns_parse_answer(out, (size_t)n, 0xbeef, &cq.q, &back), 0, "well formed");
	cr_assert_eq(back.min_ttl, 10, "aged by 50 s");
	cr_assert_eq(back.keep_an, 3);
	/* Without an OPT from the client: none back; aged past a TTL: 0. */
	hdr(&q, 0xbeef, DNS_F_RD, 1, 0, 0, 0);
	question(&q, "www.example.com", DNS_T_A);
	cq = parse_q(&q);
	n = dns_build_from_answer(out, sizeof(out), 512, &cq, q.b, ans.b, &a, 100);
	cr_assert_gt(n, 0);
	cr_assert_eq(out[11], 0);
	cr_assert_eq(dns_parse_answer(out, (size_t)n, 0xbeef, &cq.q, &back), 0);
	cr_assert_eq(back.min_ttl, 0);
	/* Over the limit: TC, the question only. */
	n = dns_build_from_answer(out, sizeof(out), 40, &cq, q.b, ans.b, &a, 0);
	cr_assert_eq(n, 12 + (int)cq.q.wire_len);
	cr_assert(out[2] & 0x02, "TC");
	cr_assert_eq(out[7], 0);
	/* An answer whose question is another length cannot be rebuilt for this client. */
	hdr(&q, 1, 0, 1, 0, 0, 0);
	question(&q, "www.example.co", DNS_T_A);
	cq = parse_q(&q);
	cq.q = a.q; /* pretend it matched */
	cq.q.wire_len -= 1;
	cr_assert_eq(dns_build_from_answer(out, sizeof(out), 512, &cq, q.b, ans.b, &a, 0), -EINVAL);
}

Test(dns_msg, replies_made_here)
{
	static const uint8_t v4[2][16] = { { 198, 19, 0, 5 }, { 198, 19, 0, 6 } };
	static const uint8_t v6[1][16] = { { 0xfd, 0, 0, 0x7f, [15] = 9 } };
	struct msg q;
	struct dns_query cq;
	struct dns_answer back;
	uint8_t out[600];
	int n;

	hdr(&q, 5, DNS_F_RD, 1, 0, 0, 1);
	question(&q, "name.test", DNS_T_A);
	opt(&q, 1232);
	cq = parse_q(&q);
	n = dns_build_synth(out, sizeof(out), 512, &cq, q.b, DNS_R_NOERROR, 4, v4, 2, 1);
	cr_assert_gt(n, 0);
	cr_assert_eq(dns_parse_answer(out, (size_t)n, 5, &cq.q, &back), 0);
	cr_assert_eq(back.keep_an, 2);
	cr_assert_eq(back.min_ttl, 1);
	cr_assert_arr_eq(out + back.rr_off + 12, v4[0], 4);
	cr_assert_eq(out[11], 1, "OPT");
	n = dns_build_synth(out, sizeof(out), 512, &cq, q.b, DNS_R_NOERROR, 6, v6, 1, 1);
	cr_assert_gt(n, 0);
	cr_assert_eq(dns_parse_answer(out, (size_t)n, 5, &cq.q, &back), 0);
	cr_assert_eq(out[back.rr_off + 3], DNS_T_AAAA);
	n = dns_build_synth(out, sizeof(out), 512, &cq, q.b, DNS_R_NOERROR, 6, NULL, 0, 1);
	cr_assert_eq(dns_parse_answer(out, (size_t)n, 5, &cq.q, &back), 0);
	cr_assert_eq(back.keep_an, 0, "empty NOERROR");
	cr_assert_eq(DNS_RCODE(back.flags), DNS_R_NOERROR);
	n = dns_build_synth(out, sizeof(out), 512, &cq, q.b, DNS_R_NXDOMAIN, 4, v4, 2, 1);
	cr_assert_eq(dns_parse_answer(out, (size_t)n, 5, &cq.q, &back), 0);
	cr_assert_eq(back.keep_an, 0, "no addresses with an error");
	cr_assert_eq(DNS_RCODE(back.flags), DNS_R_NXDOMAIN);
	n = dns_build_synth(out, sizeof(out), 30, &cq, q.b, DNS_R_NOERROR, 4, v4, 2, 1);
	cr_assert(out[2] & 0x02, "TC past the limit");
	cr_assert_leq(n, 12 + (int)cq.q.wire_len + DNS_OPT_LEN);
}

Test(dns_msg, header_errors_are_never_longer_than_the_query)
{
	struct msg q;
	uint8_t out[64];

	hdr(&q, 0x77, DNS_F_RD | (2u << 11), 2, 0, 0, 0);
	question(&q, "a.test", DNS_T_A);
	cr_assert_eq(dns_build_header_error(out, sizeof(out), q.b, q.n, DNS_R_NOTIMP), 12);
	cr_assert_eq(out[0] << 8 | out[1], 0x77);
	cr_assert_eq(out[3] & 0xf, DNS_R_NOTIMP);
	cr_assert(out[2] & 0x80);
	cr_assert_eq((out[2] >> 3) & 0xf, 2, "the opcode echoed");
	cr_assert_eq(out[4] | out[5] | out[6] | out[7] | out[8] | out[9] | out[10] | out[11], 0);
	cr_assert_eq(dns_build_header_error(out, sizeof(out), q.b, 11, DNS_R_FORMERR), DNS_E_SHORT);
}

Test(dns_msg, the_upstream_query_round_trips)
{
	struct msg q;
	struct dns_query cq, back;
	uint8_t out[300];
	int n;

	hdr(&q, 1, 0, 1, 0, 0, 0);
	question(&q, "Mixed.Case.test", DNS_T_HTTPS);
	cq = parse_q(&q);
	n = dns_build_query(out, sizeof(out), 0x9999, &cq.q);
	cr_assert_gt(n, 0);
	cr_assert_eq(dns_parse_query(out, (size_t)n, &back), 0);
	cr_assert_eq(back.id, 0x9999);
	cr_assert_str_eq(back.q.name, "Mixed.Case.test");
	cr_assert_eq(back.q.qtype, DNS_T_HTTPS);
	cr_assert(back.has_opt);
	cr_assert_eq(back.udp_size, DNS_EDNS_SIZE);
	cr_assert(back.flags & DNS_F_RD);
	cq.q.nameable = false;
	cr_assert_eq(dns_build_query(out, sizeof(out), 1, &cq.q), -EINVAL);
	cq.q.nameable = true;
	cr_assert_eq(dns_build_query(out, 20, 1, &cq.q), -ENOSPC);
}

/* An answer whose second RR's name points into the first RR's TTL bytes: with the TTL aged,
 * that name would read as another one. The rebuilt reply is refused (the caller answers
 * SERVFAIL); unaged, it is the answer as it parsed. */
Test(dns_msg, a_name_pointing_into_a_ttl_is_not_rebuilt_aged)
{
	struct msg q, ans;
	struct dns_query cq;
	struct dns_answer a, back;
	uint8_t out[1024];
	size_t ttl_at;
	int n;

	hdr(&q, 0x0101, DNS_F_RD, 1, 0, 0, 0);
	question(&q, "x.test", DNS_T_A);
	cq = parse_q(&q);
	hdr(&ans, 0x0202, DNS_F_QR | DNS_F_RD | DNS_F_RA, 1, 2, 0, 0);
	question(&ans, "x.test", DNS_T_A);
	/* RR 1: x.test A, TTL 0x00010100: its bytes 01 01 00 read as the name "\x01" then root. */
	u16(&ans, 0xc00c), u16(&ans, DNS_T_A), u16(&ans, 1);
	ttl_at = ans.n;
	u32(&ans, 0x00010100), u16(&ans, 4), u8(&ans, 192), u8(&ans, 0), u8(&ans, 2), u8(&ans, 1);
	/* RR 2: its name is a pointer to the TTL's second byte: the label "\x01" "\x00"... */
	u16(&ans, (uint16_t)(0xc000 | (ttl_at + 1))), u16(&ans, DNS_T_A), u16(&ans, 1);
	u32(&ans, 60), u16(&ans, 4), u8(&ans, 192), u8(&ans, 0), u8(&ans, 2), u8(&ans, 2);
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 0x0202, &cq.q, &a), 0, "it parses as sent");
	n = dns_build_from_answer(out, sizeof(out), 512, &cq, q.b, ans.b, &a, 0);
	cr_assert_gt(n, 0, "unaged: the same bytes");
	cr_assert_eq(dns_parse_answer(out, (size_t)n, 0x0101, &cq.q, &back), 0);
	/* Aged by 2 s: the TTL becomes 0x000100fe, its byte 01 00 fe: a label of length 0xfe. */
	n = dns_build_from_answer(out, sizeof(out), 512, &cq, q.b, ans.b, &a, 2);
	cr_assert_eq(n, -EBADMSG);
}

/* ---- names that read a TTL's bytes -------------------------------------------------------- */

/* An answer to x.test A with one A record (TTL 300): the header and question done, the A
 * record's TTL offset in *ttl_at; the caller appends the RRs under test (counted by an). */
static void ttl_answer(struct msg *m, struct dns_query *cq, uint16_t an, size_t *ttl_at)
{
	struct msg q;

	hdr(&q, 0x0303, DNS_F_RD, 1, 0, 0, 0);
	question(&q, "x.test", DNS_T_A);
	*cq = parse_q(&q);
	hdr(m, 0x0303, DNS_F_QR | DNS_F_RD | DNS_F_RA, 1, (uint16_t)(1 + an), 0, 0);
	question(m, "x.test", DNS_T_A);
	*ttl_at = m->n + 6;
	a_rr(m, 300, 1);
}

static bool reads_ttl(const struct msg *m, const struct dns_query *cq)
{
	struct dns_answer a;

	cr_assert_eq(dns_parse_answer(m->b, m->n, 0x0303, &cq->q, &a), 0, "it parses as sent");
	return dns_answer_names_read_ttls(m->b, m->n, &a);
}

/* Every way a name can reach a TTL's bytes is found: an owner's pointer into it, a pointer
 * to the bytes before it that reads on into it, a CNAME's or an MX's target (names the parser
 * itself does not read) pointing into it backwards or forwards, and a target read in place
 * past its RDATA's end into the next RR's TTL. */
Test(dns_msg, names_that_read_a_ttl_are_found)
{
	struct dns_query cq;
	struct msg m;
	size_t ttl_at, fwd;

	/* An owner's pointer to the TTL's third byte (00 00 01 2c: the label "\x2c"). */
	ttl_answer(&m, &cq, 1, &ttl_at);
	u16(&m, (uint16_t)(0xc000 | (ttl_at + 2))), u16(&m, DNS_T_A), u16(&m, 1), u32(&m, 60);
	u16(&m, 4), u32(&m, 0xc0000202);
	cr_assert(reads_ttl(&m, &cq), "owner into a TTL");
	/* An owner's pointer to the class's low byte (01): a label of one byte, the TTL's first. */
	ttl_answer(&m, &cq, 1, &ttl_at);
	u16(&m, (uint16_t)(0xc000 | (ttl_at - 1))), u16(&m, DNS_T_A), u16(&m, 1), u32(&m, 60);
	u16(&m, 4), u32(&m, 0xc0000202);
	cr_assert(reads_ttl(&m, &cq), "a name read on into a TTL");
	/* A CNAME's target pointing back into the TTL. */
	ttl_answer(&m, &cq, 1, &ttl_at);
	u16(&m, 0xc00c), u16(&m, DNS_T_CNAME), u16(&m, 1), u32(&m, 60), u16(&m, 2);
	u16(&m, (uint16_t)(0xc000 | (ttl_at + 2)));
	cr_assert(reads_ttl(&m, &cq), "a CNAME's target");
	/* An MX's exchange (after its preference) pointing into the TTL. */
	ttl_answer(&m, &cq, 1, &ttl_at);
	u16(&m, 0xc00c), u16(&m, 15), u16(&m, 1), u32(&m, 60), u16(&m, 4), u16(&m, 10);
	u16(&m, (uint16_t)(0xc000 | (ttl_at + 2)));
	cr_assert(reads_ttl(&m, &cq), "an MX's exchange");
	/* A CNAME's target pointing forwards, into the next RR's TTL. */
	ttl_answer(&m, &cq, 2, &ttl_at);
	u16(&m, 0xc00c), u16(&m, DNS_T_CNAME), u16(&m, 1), u32(&m, 60), u16(&m, 2);
	fwd = m.n + 2 + 8;
	u16(&m, (uint16_t)(0xc000 | fwd));
	a_rr(&m, 60, 3);
	cr_assert(reads_ttl(&m, &cq), "a forward pointer");
	/* A CNAME whose RDLENGTH ends inside its target: the target is read on, in place, past
	 * it into the next RR's owner, type, class and TTL. */
	ttl_answer(&m, &cq, 2, &ttl_at);
	u16(&m, 0xc00c), u16(&m, DNS_T_CNAME), u16(&m, 1), u32(&m, 60), u16(&m, 1);
	u8(&m, 9); /* a label of 9 bytes: the next RR's owner, type, class and its TTL's first 3 */
	a_rr(&m, 60, 3);
	cr_assert(reads_ttl(&m, &cq), "a target read past its RDATA");
}

/* What compression normally does is not refused, nor are pointers to bytes no TTL covers,
 * even odd ones (into an A record's address): those bytes never change. */
Test(dns_msg, names_clear_of_ttls_are_not_refused)
{
	struct msg q, ans, m;
	struct dns_query cq;
	size_t ttl_at;

	hdr(&q, 7, DNS_F_RD, 1, 0, 0, 0);
	question(&q, "www.example.com", DNS_T_A);
	cq = parse_q(&q);
	answer(&ans, 7, "www.example.com", 300, 60);
	struct dns_answer a;
	cr_assert_eq(dns_parse_answer(ans.b, ans.n, 7, &cq.q, &a), 0);
	cr_assert_not(dns_answer_names_read_ttls(ans.b, ans.n, &a));
	/* A CNAME's target pointing at the A record's address 192.0.2.1: c0 00 is a pointer into
	 * the header (a strict reader refuses it), nothing of a TTL. */
	ttl_answer(&m, &cq, 1, &ttl_at);
	u16(&m, 0xc00c), u16(&m, DNS_T_CNAME), u16(&m, 1), u32(&m, 60), u16(&m, 2);
	u16(&m, (uint16_t)(0xc000 | (ttl_at + 6)));
	cr_assert_not(reads_ttl(&m, &cq));
	/* An SOA whose names point to the question's name. */
	ttl_answer(&m, &cq, 0, &ttl_at);
	m.b[9] = 1; /* NSCOUNT */
	u16(&m, 0xc00c), u16(&m, DNS_T_SOA), u16(&m, 1), u32(&m, 60), u16(&m, 4 + 20);
	u16(&m, 0xc00c), u16(&m, 0xc00c), u32(&m, 1), u32(&m, 2), u32(&m, 3), u32(&m, 4);
	u32(&m, 5);
	cr_assert_not(reads_ttl(&m, &cq));
}
