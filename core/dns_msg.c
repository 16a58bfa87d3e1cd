/* dns_msg.c — DNS queries and answers parsed with bounded names, and replies built for the
 * asking client. Contracts: dns_msg.h. */
#include "core/dns_msg.h"

#include <string.h>
#include <strings.h>

static inline uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static bool ldh(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_';
}

/* The name at off: *end is where the name's bytes end at off (after its first pointer, or its
 * root label). With text (cap DNS_NAME_MAX + 2) the presentation form and *nameable. 0 or
 * DNS_E_SHORT / DNS_E_NAME. */
static int read_name(const uint8_t *m, size_t len, size_t off, size_t *end, char *text,
		     size_t *text_len, bool *nameable, bool allow_ptr)
{
	size_t pos = off, wire = 0, t = 0;
	int jumps = 0;
	bool ok = true;

	*end = 0;
	for (;;) {
		uint8_t l;
		if (pos >= len)
			return DNS_E_SHORT;
		l = m[pos];
		if ((l & 0xc0) == 0xc0) {
			size_t target;
			if (pos + 1 >= len)
				return DNS_E_SHORT;
			target = (size_t)(l & 0x3f) << 8 | m[pos + 1];
			/* Strictly backwards, bounded, never into the header (so a question name,
			 * the first name, has no pointer): no loop, no forward reference. */
			if (!allow_ptr || target >= pos || target < DNS_HDR_LEN ||
			    ++jumps > DNS_MAX_JUMPS)
				return DNS_E_NAME;
			if (!*end)
				*end = pos + 2;
			pos = target;
			continue;
		}
		if (l & 0xc0)
			return DNS_E_NAME; /* 0x40 / 0x80: reserved label types */
		if (l == 0) {
			if (!*end)
				*end = pos + 1;
			break;
		}
		if (pos + 1 + l > len)
			return DNS_E_SHORT;
		if ((wire += 1u + l) + 1 > DNS_WIRE_NAME_MAX)
			return DNS_E_NAME;
		if (text) {
			if (t)
				text[t++] = '.';
			for (size_t i = 0; i < l; i++) {
				uint8_t c = m[pos + 1 + i];
				ok = ok && ldh(c);
				text[t++] = ldh(c) ? (char)c : '?';
			}
		}
		pos += 1u + l;
	}
	if (text) {
		text[t] = 0;
		*text_len = t;
		*nameable = ok && t > 0 && t <= DNS_NAME_MAX;
	}
	return 0;
}

/* The question at DNS_HDR_LEN into *q; *next after it. */
static int read_question(const uint8_t *m, size_t len, struct dns_question *q, size_t *next)
{
	size_t end;
	/* The first name has nothing before it to point to but itself: no pointer at all (a
	 * reply that echoes the question would read other bytes there). */
	int ret = read_name(m, len, DNS_HDR_LEN, &end, q->name, &q->name_len, &q->nameable,
			    false);

	if (ret != 0)
		return ret;
	if (end + 4 > len)
		return DNS_E_SHORT;
	q->qtype = get16(m + end);
	q->qclass = get16(m + end + 2);
	q->wire_off = DNS_HDR_LEN;
	q->wire_len = end + 4 - DNS_HDR_LEN;
	*next = end + 4;
	return 0;
}

/* One RR at off: its type, class, TTL, rdata span; *next after it. */
struct rr {
	uint16_t type, rclass;
	uint32_t ttl;
	size_t ttl_off, rdata_off, rdlen;
};

static int read_rr(const uint8_t *m, size_t len, size_t off, struct rr *r, size_t *next)
{
	size_t end;
	int ret = read_name(m, len, off, &end, NULL, NULL, NULL, true);

	if (ret != 0)
		return ret;
	if (end + 10 > len)
		return DNS_E_SHORT;
	r->type = get16(m + end);
	r->rclass = get16(m + end + 2);
	r->ttl_off = end + 4;
	r->ttl = get32(m + end + 4);
	r->rdlen = get16(m + end + 8);
	r->rdata_off = end + 10;
	if (r->rdata_off + r->rdlen > len)
		return DNS_E_SHORT;
	*next = r->rdata_off + r->rdlen;
	return 0;
}

int dns_parse_query(const uint8_t *m, size_t len, struct dns_query *q)
{
	size_t off;
	uint16_t qd, an, ns, ar;
	int ret;

	memset(q, 0, sizeof(*q));
	if (len < DNS_HDR_LEN)
		return DNS_E_SHORT;
	q->id = get16(m);
	q->flags = get16(m + 2);
	qd = get16(m + 4), an = get16(m + 6), ns = get16(m + 8), ar = get16(m + 10);
	if (q->flags & DNS_F_QR)
		return DNS_E_QR;
	if (DNS_OPCODE(q->flags) != 0)
		return DNS_E_OPCODE;
	if (qd != 1)
		return DNS_E_QDCOUNT;
	if ((ret = read_question(m, len, &q->q, &off)) != 0)
		return ret;
	q->udp_size = DNS_UDP_MIN;
	/* An OPT may follow anything a client puts in the other sections: walk them all. */
	for (uint32_t i = 0; i < (uint32_t)an + ns + ar; i++) {
		struct rr r;
		if ((ret = read_rr(m, len, off, &r, &off)) != 0)
			return ret;
		if (i >= (uint32_t)an + ns && r.type == DNS_T_OPT && !q->has_opt) {
			q->has_opt = true;
			if (r.rclass > DNS_UDP_MIN)
				q->udp_size = r.rclass;
		}
	}
	return 0;
}

bool dns_question_equal(const struct dns_question *x, const struct dns_question *y)
{
	return x->qtype == y->qtype && x->qclass == y->qclass && x->name_len == y->name_len &&
	       strncasecmp(x->name, y->name, x->name_len) == 0;
}

/* The negative TTL from an SOA in the authority section: min(its TTL, its MINIMUM). */
static uint32_t soa_negative_ttl(const uint8_t *m, size_t len, const struct rr *r)
{
	size_t end, off = r->rdata_off;

	/* MNAME, RNAME, then SERIAL REFRESH RETRY EXPIRE MINIMUM. */
	for (int i = 0; i < 2; i++) {
		if (read_name(m, len, off, &end, NULL, NULL, NULL, true) != 0)
			return UINT32_MAX;
		off = end;
	}
	if (off + 20 > r->rdata_off + r->rdlen)
		return UINT32_MAX;
	uint32_t minimum = get32(m + off + 16);
	return minimum < r->ttl ? minimum : r->ttl;
}

int dns_parse_answer(const uint8_t *m, size_t len, uint16_t id, const struct dns_question *asked,
		     struct dns_answer *a)
{
	size_t off;
	uint32_t total, neg = UINT32_MAX;
	bool opt_seen = false;
	int ret;

	memset(a, 0, sizeof(*a));
	a->min_ttl = UINT32_MAX;
	if (len < DNS_HDR_LEN)
		return DNS_E_SHORT;
	a->id = get16(m);
	a->flags = get16(m + 2);
	a->an = get16(m + 6), a->ns = get16(m + 8), a->ar = get16(m + 10);
	if (!(a->flags & DNS_F_QR))
		return DNS_E_QR;
	if (a->id != id || get16(m + 4) != 1 || DNS_OPCODE(a->flags) != 0)
		return DNS_E_MISMATCH;
	if ((ret = read_question(m, len, &a->q, &off)) != 0)
		return ret;
	if (!dns_question_equal(&a->q, asked))
		return DNS_E_MISMATCH;
	a->rr_off = a->keep_end = off;
	total = (uint32_t)a->an + a->ns + a->ar;
	for (uint32_t i = 0; i < total; i++) {
		struct rr r;
		if ((ret = read_rr(m, len, off, &r, &off)) != 0)
			return ret;
		if (i < a->an && r.type != DNS_T_OPT && r.ttl < a->min_ttl)
			a->min_ttl = r.ttl;
		if (i >= a->an && i < (uint32_t)a->an + a->ns && r.type == DNS_T_SOA && neg == UINT32_MAX)
			neg = soa_negative_ttl(m, len, &r);
		/* Keep every RR before the OPT; the OPT and what follows it are not copied (a
		 * later RR's names could point into what is left out). */
		if (opt_seen || r.type == DNS_T_OPT) {
			opt_seen = true;
			continue;
		}
		a->keep_end = off;
		if (i < a->an)
			a->keep_an++;
		else if (i < (uint32_t)a->an + a->ns)
			a->keep_ns++;
		else
			a->keep_ar++;
		if (a->n_ttl < DNS_MAX_RRS)
			a->ttl_off[a->n_ttl++] = (uint16_t)r.ttl_off;
		else
			a->n_ttl_overflow = true;
	}
	/* A negative answer lives for the SOA's negative TTL, an NXDOMAIN after a CNAME chain
	 * too (RFC 2308 sections 2.1 and 5), and no longer than the chain's own RRs; without an
	 * SOA it has none (UINT32_MAX: not cached). */
	if (a->an == 0 || DNS_RCODE(a->flags) == DNS_R_NXDOMAIN)
		a->min_ttl = neg == UINT32_MAX ? UINT32_MAX : neg < a->min_ttl ? neg : a->min_ttl;
	return 0;
}

/* ---- names that read TTL bytes ------------------------------------------------------------ */

/* Does [p, p + n) hold a byte of one of the k TTL fields at ttl[] (ascending, 4 bytes each)? */
static bool in_ttls(const uint16_t *ttl, size_t k, size_t p, size_t n)
{
	size_t lo = 0, hi = k;

	/* The first TTL that starts at or past p + n: only the one before it can overlap. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (ttl[mid] < p + n)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo > 0 && ttl[lo - 1] + 4u > p;
}

/* The most bytes read_name looks at for one name: DNS_WIRE_NAME_MAX of labels and the
 * pointers it follows, and the one it refuses. */
#define READ_NAME_MAX_SEEN (DNS_WIRE_NAME_MAX + 2 * (DNS_MAX_JUMPS + 1))

/* Does the name at off read a byte of a TTL at ttl[]? Read as the most lenient reader would:
 * pointers followed in any direction, in place past its RR's end, until it has looked at more
 * bytes than the message holds (where a reader that detects loops by counting, as glibc's
 * does, gives up) or than read_name would, past the message's end or at a reserved label
 * type. Every byte looked at on the way counts: bytes no TTL covers read the same however the
 * TTLs change, and so does every decision taken on them. *end: where the name ends at off, 0
 * when it does not read as a name. */
static bool name_reads_ttl(const uint8_t *m, size_t len, size_t off, const uint16_t *ttl,
			   size_t k, size_t *end)
{
	size_t pos = off, seen = 0, most = len > READ_NAME_MAX_SEEN ? len : READ_NAME_MAX_SEEN;

	*end = 0;
	for (;;) {
		uint8_t l;
		if (pos >= len)
			break;
		l = m[pos];
		if ((l & 0xc0) == 0xc0) {
			if (in_ttls(ttl, k, pos, pos + 1 < len ? 2 : 1))
				return true;
			if (pos + 1 >= len || (seen += 2) > most)
				break;
			if (!*end)
				*end = pos + 2;
			pos = (size_t)(l & 0x3f) << 8 | m[pos + 1];
			continue;
		}
		if (l & 0xc0) {
			*end = 0;
			return in_ttls(ttl, k, pos, 1);
		}
		if (in_ttls(ttl, k, pos, pos + 1u + l <= len ? 1u + l : len - pos))
			return true;
		if (l == 0) {
			if (!*end)
				*end = pos + 1;
			return false;
		}
		if (pos + 1 + l > len || (seen += 1u + l) > most)
			break;
		pos += 1u + l;
	}
	*end = 0;
	return false;
}

/* Where the names of a type's RDATA are (RFC 3597 section 4: the types a reader decompresses,
 * the well-known ones of RFC 1035 and those it should also decompress, plus DNAME and RRSIG,
 * which older writers compressed): count names one after another from off. */
struct rdata_names {
	uint16_t type;
	uint8_t off, count;
};

static const struct rdata_names rdata_names[] = {
	{ DNS_T_NS, 0, 1 },
	{ 3, 0, 1 },            /* MD */
	{ 4, 0, 1 },            /* MF */
	{ DNS_T_CNAME, 0, 1 },
	{ DNS_T_SOA, 0, 2 },    /* MNAME, RNAME */
	{ 7, 0, 1 },            /* MB */
	{ 8, 0, 1 },            /* MG */
	{ 9, 0, 1 },            /* MR */
	{ DNS_T_PTR, 0, 1 },
	{ 14, 0, 2 },           /* MINFO */
	{ 15, 2, 1 },           /* MX: after PREFERENCE */
	{ 17, 0, 2 },           /* RP */
	{ 18, 2, 1 },           /* AFSDB */
	{ 21, 2, 1 },           /* RT */
	{ 24, 18, 1 },          /* SIG: the signer's name */
	{ 26, 2, 2 },           /* PX */
	{ 30, 0, 1 },           /* NXT */
	{ 33, 6, 1 },           /* SRV: after PRIORITY, WEIGHT, PORT */
	{ 36, 2, 1 },           /* KX */
	{ 39, 0, 1 },           /* DNAME */
	{ 46, 18, 1 },          /* RRSIG: the signer's name */
};

/* Does a name in r's RDATA read a byte of a TTL at ttl[]? */
static bool rdata_reads_ttl(const uint8_t *m, size_t len, const struct rr *r, const uint16_t *ttl,
			    size_t k)
{
	size_t off = r->rdata_off, stop = r->rdata_off + r->rdlen, end;
	int count = 0;

	if (r->type == 35) {
		/* NAPTR: ORDER, PREFERENCE, then FLAGS, SERVICES and REGEXP (character strings),
		 * then REPLACEMENT. */
		off += 4;
		for (int i = 0; i < 3 && off < stop; i++)
			off += 1u + m[off];
		count = 1;
	}
	for (size_t i = 0; !count && i < sizeof(rdata_names) / sizeof(rdata_names[0]); i++) {
		if (rdata_names[i].type == r->type) {
			off += rdata_names[i].off;
			count = rdata_names[i].count;
		}
	}
	for (int i = 0; i < count && off < stop; i++) {
		if (name_reads_ttl(m, len, off, ttl, k, &end))
			return true;
		if (!end)
			break; /* not a name: nothing after it is read as one */
		off = end;
	}
	return false;
}

bool dns_answer_names_read_ttls(const uint8_t *m, size_t len, const struct dns_answer *a)
{
	size_t off = a->rr_off, end, kept = (size_t)a->keep_an + a->keep_ns + a->keep_ar;

	if (a->n_ttl_overflow)
		return true; /* some kept TTLs are not known */
	/* The question's name has no pointer and ends before the first RR: it reads no TTL. */
	for (size_t i = 0; i < kept; i++) {
		size_t start = off;
		struct rr r;
		if (read_rr(m, len, off, &r, &off) != 0)
			return true; /* not the message a was parsed from */
		if (name_reads_ttl(m, len, start, a->ttl_off, a->n_ttl, &end))
			return true;
		if (rdata_reads_ttl(m, len, &r, a->ttl_off, a->n_ttl))
			return true;
	}
	return false;
}

size_t dns_reply_limit(const struct dns_query *q, bool tcp, size_t mtu_payload)
{
	size_t lim;

	if (tcp)
		return 65535;
	lim = q->has_opt ? (q->udp_size < DNS_EDNS_SIZE ? q->udp_size : DNS_EDNS_SIZE) : DNS_UDP_MIN;
	if (lim < DNS_UDP_MIN)
		lim = DNS_UDP_MIN;
	return mtu_payload && lim > mtu_payload ? mtu_payload : lim;
}

static void put_opt(uint8_t *p)
{
	p[0] = 0;                     /* the root name */
	put16(p + 1, DNS_T_OPT);
	put16(p + 3, DNS_EDNS_SIZE);  /* our payload size */
	put32(p + 5, 0);              /* extended rcode, version 0, DO clear */
	put16(p + 9, 0);              /* no options */
}

/* Header and the client's question; the counts and rcode are the caller's. Returns the
 * offset after the question, or -ENOSPC. */
static int start_reply(uint8_t *out, size_t cap, const struct dns_query *q, const uint8_t *qmsg,
		       uint16_t extra_flags, enum dns_rcode rcode)
{
	size_t n = DNS_HDR_LEN + q->q.wire_len;
	uint16_t flags = (uint16_t)((q->flags & (0x7800 | DNS_F_RD | DNS_F_CD)) | DNS_F_QR |
				    DNS_F_RA | extra_flags | (rcode & 0xf));

	if (n > cap)
		return -ENOSPC;
	put16(out, q->id);
	put16(out + 2, flags);
	put16(out + 4, 1);
	memset(out + 6, 0, 6);
	memcpy(out + DNS_HDR_LEN, qmsg + q->q.wire_off, q->q.wire_len);
	return (int)n;
}

/* TC set, the question and OPT only. */
static int truncated(uint8_t *out, size_t cap, const struct dns_query *q, const uint8_t *qmsg,
		     uint16_t flags_keep, enum dns_rcode rcode)
{
	int n = start_reply(out, cap, q, qmsg, (uint16_t)(flags_keep | DNS_F_TC), rcode);

	if (n < 0)
		return n;
	if (q->has_opt) {
		if ((size_t)n + DNS_OPT_LEN > cap)
			return -ENOSPC;
		put_opt(out + n);
		put16(out + 10, 1);
		n += DNS_OPT_LEN;
	}
	return n;
}

int dns_build_from_answer(uint8_t *out, size_t cap, size_t limit, const struct dns_query *q,
			  const uint8_t *qmsg, const uint8_t *ans, const struct dns_answer *a,
			  uint32_t age_s)
{
	uint16_t keep = a->flags & (DNS_F_AA | DNS_F_AD);
	size_t rr_len = a->keep_end - a->rr_off, total;
	int n;

	/* The answer's RRs point into its own header and question: they stay valid only if the
	 * client's question has the same length (the same name, maybe in another case). */
	if (a->q.wire_len != q->q.wire_len || a->rr_off != DNS_HDR_LEN + q->q.wire_len)
		return -EINVAL;
	total = DNS_HDR_LEN + q->q.wire_len + rr_len + (q->has_opt ? DNS_OPT_LEN : 0);
	if (total > limit)
		return truncated(out, cap, q, qmsg, keep, (enum dns_rcode)DNS_RCODE(a->flags));
	if (total > cap)
		return -ENOSPC;
	n = start_reply(out, cap, q, qmsg, keep, (enum dns_rcode)DNS_RCODE(a->flags));
	if (n < 0)
		return n;
	memcpy(out + n, ans + a->rr_off, rr_len);
	put16(out + 6, a->keep_an);
	put16(out + 8, a->keep_ns);
	put16(out + 10, (uint16_t)(a->keep_ar + (q->has_opt ? 1 : 0)));
	for (size_t i = 0; i < a->n_ttl; i++) {
		uint8_t *t = out + a->ttl_off[i];
		uint32_t ttl = get32(t);
		put32(t, ttl > age_s ? ttl - age_s : 0);
	}
	n += (int)rr_len;
	if (q->has_opt) {
		put_opt(out + n);
		n += DNS_OPT_LEN;
	}
	/* A name may point into bytes of another RR's TTL (a forged answer can make one do so):
	 * aged, they would read as another name or length. The reply must parse as it was. */
	struct dns_answer chk;
	if (a->n_ttl && dns_parse_answer(out, (size_t)n, q->id, &q->q, &chk) != 0)
		return -EBADMSG;
	return n;
}

int dns_build_synth(uint8_t *out, size_t cap, size_t limit, const struct dns_query *q,
		    const uint8_t *qmsg, enum dns_rcode rcode, int family, const uint8_t (*addrs)[16],
		    size_t n_addrs, uint32_t ttl)
{
	size_t alen = family == 4 ? 4 : 16, rr = 12 + alen, total;
	int n;

	if (rcode != DNS_R_NOERROR)
		n_addrs = 0;
	total = DNS_HDR_LEN + q->q.wire_len + n_addrs * rr + (q->has_opt ? DNS_OPT_LEN : 0);
	if (total > limit)
		return truncated(out, cap, q, qmsg, 0, rcode);
	if (total > cap)
		return -ENOSPC;
	n = start_reply(out, cap, q, qmsg, 0, rcode);
	if (n < 0)
		return n;
	for (size_t i = 0; i < n_addrs; i++) {
		uint8_t *p = out + n;
		put16(p, 0xc000 | DNS_HDR_LEN); /* the question's name */
		put16(p + 2, family == 4 ? DNS_T_A : DNS_T_AAAA);
		put16(p + 4, 1);                /* IN */
		put32(p + 6, ttl);
		put16(p + 10, (uint16_t)alen);
		memcpy(p + 12, addrs[i], alen);
		n += (int)rr;
	}
	put16(out + 6, (uint16_t)n_addrs);
	if (q->has_opt) {
		put_opt(out + n);
		put16(out + 10, 1);
		n += DNS_OPT_LEN;
	}
	return n;
}

int dns_build_header_error(uint8_t *out, size_t cap, const uint8_t *m, size_t len,
			   enum dns_rcode rcode)
{
	uint16_t flags;

	if (len < DNS_HDR_LEN)
		return DNS_E_SHORT;
	if (cap < DNS_HDR_LEN)
		return -ENOSPC;
	flags = get16(m + 2);
	put16(out, get16(m));
	put16(out + 2, (uint16_t)((flags & (0x7800 | DNS_F_RD)) | DNS_F_QR | (rcode & 0xf)));
	memset(out + 4, 0, 8);
	return DNS_HDR_LEN;
}

int dns_build_query(uint8_t *out, size_t cap, uint16_t id, const struct dns_question *q)
{
	size_t n = DNS_HDR_LEN, start = 0;

	if (!q->nameable)
		return -EINVAL;
	if (DNS_HDR_LEN + q->name_len + 2 + 4 + DNS_OPT_LEN > cap)
		return -ENOSPC;
	put16(out, id);
	put16(out + 2, DNS_F_RD);
	put16(out + 4, 1);
	put16(out + 6, 0);
	put16(out + 8, 0);
	put16(out + 10, 1); /* our OPT */
	for (size_t i = 0; i <= q->name_len; i++) {
		if (i == q->name_len || q->name[i] == '.') {
			size_t l = i - start;
			if (l == 0 || l > 63)
				return -EINVAL;
			out[n++] = (uint8_t)l;
			memcpy(out + n, q->name + start, l);
			n += l;
			start = i + 1;
		}
	}
	out[n++] = 0;
	put16(out + n, q->qtype);
	put16(out + n + 2, q->qclass);
	n += 4;
	put_opt(out + n);
	return (int)(n + DNS_OPT_LEN);
}
