/* dns_msg.h — the DNS messages a proxy that answers hijacked queries needs, sans-IO: a
 * client's query parsed, an upstream's answer parsed and checked against the question asked,
 * and the replies built for the asking client (from an upstream answer, or made up here:
 * addresses, empty, an error), plus the query sent upstream.
 *
 * Why a codec of our own: hijacked queries arrive as packets from the TUN, not on a socket a
 * library's server could own; the answer to a client must be rebuilt for that client (its id,
 * its question's bytes and case, an EDNS OPT only if it sent one, RFC 6891) within a size
 * bound (its UDP limit); and c-ares 1.18 (Debian bookworm) has no message builder. Everything
 * here reads only inside the given buffer and writes only inside the given capacity.
 *
 * Names: a name is followed through compression pointers that point strictly backwards and
 * past the header, at most DNS_MAX_JUMPS times (the question's name, the first, may have none), and must fit 255 wire bytes; labels of 64 bytes or more, or of the
 * reserved types (0x40, 0x80), make the message malformed. A question name is "nameable" when
 * every label is non-empty, at most 63 bytes of letters, digits, '-' and '_', and the text is
 * at most DNS_NAME_MAX bytes: only such names may become rule keys or fake-IP mappings (a wire
 * label holding a '.' or a NUL would otherwise read as another name).
 */
#ifndef TS_CORE_DNS_MSG_H
#define TS_CORE_DNS_MSG_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DNS_HDR_LEN 12
#define DNS_NAME_MAX 253          /* presentation form, no trailing dot */
#define DNS_WIRE_NAME_MAX 255
#define DNS_MAX_JUMPS 64          /* compression pointers followed per name */
#define DNS_MAX_RRS 64            /* RRs whose TTL offsets an answer keeps (for caching) */
#define DNS_UDP_MIN 512           /* RFC 1035 4.2.1: the UDP size without EDNS */
#define DNS_EDNS_SIZE 1232        /* our OPT's payload size, and the cap of a client's */
#define DNS_OPT_LEN 11            /* an OPT RR without options */

enum dns_type { DNS_T_A = 1, DNS_T_NS = 2, DNS_T_CNAME = 5, DNS_T_SOA = 6, DNS_T_PTR = 12,
		DNS_T_AAAA = 28, DNS_T_OPT = 41, DNS_T_SVCB = 64, DNS_T_HTTPS = 65,
		DNS_T_ANY = 255 };
enum dns_rcode { DNS_R_NOERROR = 0, DNS_R_FORMERR = 1, DNS_R_SERVFAIL = 2, DNS_R_NXDOMAIN = 3,
		 DNS_R_NOTIMP = 4, DNS_R_REFUSED = 5 };

/* Header flag bits (host order of the 16-bit flags word). */
#define DNS_F_QR 0x8000
#define DNS_F_AA 0x0400
#define DNS_F_TC 0x0200
#define DNS_F_RD 0x0100
#define DNS_F_RA 0x0080
#define DNS_F_AD 0x0020
#define DNS_F_CD 0x0010
#define DNS_OPCODE(f) (((f) >> 11) & 0xf)
#define DNS_RCODE(f) ((f) & 0xf)

/* Why a message was refused: each a distinct -errno, so callers keep one counter per reason. */
#define DNS_E_SHORT (-EMSGSIZE)      /* shorter than its header or than a part it announces */
#define DNS_E_NAME (-EILSEQ)         /* a bad name: label type, length, pointer, loop */
#define DNS_E_QR (-EPROTO)           /* a query with QR set, or an answer without it */
#define DNS_E_OPCODE (-ENOTSUP)      /* opcode not QUERY: a client gets NOTIMP */
#define DNS_E_QDCOUNT (-EINVAL)      /* not exactly one question: a client gets FORMERR */
#define DNS_E_MISMATCH (-ESRCH)      /* an answer to another id or question */

struct dns_question {
	char name[DNS_NAME_MAX + 2];  /* presentation form as received (case kept), no trailing
				       * dot; "" for the root; valid when nameable */
	size_t name_len;
	bool nameable;
	uint16_t qtype, qclass;
	size_t wire_off, wire_len;    /* the question's bytes (name, type, class) in the message */
};

/* A client's query. */
struct dns_query {
	uint16_t id, flags;
	struct dns_question q;
	bool has_opt;                 /* an OPT RR in the additional section (RFC 6891) */
	uint16_t udp_size;            /* the OPT's payload size (at least 512), else 512 */
};

/* An upstream's answer. */
struct dns_answer {
	uint16_t id, flags;
	struct dns_question q;
	uint16_t an, ns, ar;          /* RR counts as on the wire (OPT included in ar) */
	size_t rr_off;                /* the first RR, right after the question */
	size_t keep_end;              /* RRs to copy to a client: [rr_off, keep_end) */
	uint16_t keep_an, keep_ns, keep_ar;  /* their counts (the OPT and what follows it left out) */
	uint32_t min_ttl;             /* the smallest TTL of the answer section's RRs, or for an
				       * answer without RRs the negative TTL: min(SOA TTL, SOA
				       * MINIMUM) from the authority section; for an NXDOMAIN
				       * (after a CNAME chain too) the smaller of the two, and
				       * UINT32_MAX without an SOA; UINT32_MAX when neither exists */
	uint16_t ttl_off[DNS_MAX_RRS];/* offsets of the kept RRs' TTL fields (for a cache) */
	size_t n_ttl;                 /* how many of them (more RRs: n_ttl_overflow) */
	bool n_ttl_overflow;
};

/* Parse a client's query (len bytes). 0 with *q, or DNS_E_*: SHORT or NAME (drop it), QR (drop
 * it: never answer an answer), OPCODE (answer NOTIMP), QDCOUNT (answer FORMERR). */
int dns_parse_query(const uint8_t *m, size_t len, struct dns_query *q);

/* Parse an upstream's answer and check it against the query we sent (id and question: name
 * case-insensitively, type, class). 0 with *a, or DNS_E_SHORT / NAME / QR / MISMATCH. Every RR
 * is walked: names, lengths. */
int dns_parse_answer(const uint8_t *m, size_t len, uint16_t id, const struct dns_question *asked,
		     struct dns_answer *a);

/* The same question (name case-insensitively, type, class)? */
bool dns_question_equal(const struct dns_question *x, const struct dns_question *y);

/* The most a reply to q may hold over UDP: max(512, min(its EDNS size, DNS_EDNS_SIZE)), and at
 * most mtu_payload (the TUN's MTU less the IP and UDP headers). Over TCP: 65535. */
size_t dns_reply_limit(const struct dns_query *q, bool tcp, size_t mtu_payload);

/* The reply to the client's query (q, parsed from qmsg) built from an upstream answer (ans, a):
 * the client's id, opcode, RD and CD, QR and RA set, the answer's rcode, AA and AD; the
 * client's question bytes; the answer's kept RRs, TTLs less age_s (not below 0); an OPT of
 * ours if the client sent one. Longer than limit: TC set, the question (and OPT) only. Returns
 * the length, or -ENOSPC (cap), -EINVAL (the answer's question is not as long as the
 * client's: only the case may differ), -EBADMSG (with its TTLs changed the reply no longer
 * parses: a name of the answer pointed into a TTL's bytes; answer SERVFAIL instead, or, for
 * a cached answer, ask upstream again). */
int dns_build_from_answer(uint8_t *out, size_t cap, size_t limit, const struct dns_query *q,
			  const uint8_t *qmsg, const uint8_t *ans, const struct dns_answer *a,
			  uint32_t age_s);

/* Would a name of the answer's kept RRs read as another name once their TTLs changed (lowered
 * to a cap, aged)? Each kept RR's owner name and the names in its RDATA (for the types whose
 * RDATA holds names a reader decompresses: NS, CNAME, SOA, PTR, MX, SRV, ... RFC 3597 section
 * 4) are read as the most lenient reader would: pointers in any direction, in place past the
 * RDATA's end. true when any of them reads a byte of a kept RR's TTL field (only a forged
 * answer makes one do so; a->n_ttl_overflow: true too, those TTLs are not all known): a cache
 * that rewrites TTLs must not keep it. m and len: the message *a was parsed from. */
bool dns_answer_names_read_ttls(const uint8_t *m, size_t len, const struct dns_answer *a);

/* A reply made here: rcode, and for NOERROR n addresses (family 4: A records, 16 bytes each
 * with IPv4 in the first 4; family 6: AAAA) with ttl, n 0 for an empty answer. Same header,
 * question and OPT rules and the same limit as dns_build_from_answer. Returns the length or
 * -ENOSPC. */
int dns_build_synth(uint8_t *out, size_t cap, size_t limit, const struct dns_query *q,
		    const uint8_t *qmsg, enum dns_rcode rcode, int family, const uint8_t (*addrs)[16],
		    size_t n, uint32_t ttl);

/* A header-only error (FORMERR for a query without exactly one question, NOTIMP for another
 * opcode) to a message whose header could be read (at least 12 bytes): never longer than the
 * query. Returns DNS_HDR_LEN or -ENOSPC / DNS_E_SHORT. */
int dns_build_header_error(uint8_t *out, size_t cap, const uint8_t *m, size_t len,
			   enum dns_rcode rcode);

/* The query sent upstream: id, RD, the question (a nameable name, its case kept as
 * given), our OPT (payload DNS_EDNS_SIZE, no options, DO clear). Returns the length or
 * -ENOSPC / -EINVAL (a name that is not nameable). */
int dns_build_query(uint8_t *out, size_t cap, uint16_t id, const struct dns_question *q);

#endif
