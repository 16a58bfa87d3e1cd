/* pkt.h — bounds-checked views of IPv4/IPv6 packets and their TCP/UDP/ICMP headers.
 *
 * Pure functions over caller buffers: no I/O, no allocation, no shared state. Every rejection has
 * a reason code (one drop counter per reason upstream). Parsing checks only what the rewrite needs
 * and rejects what it cannot handle: IPv4 header length, total length and fragments; the IPv6
 * extension chain walked (Hop-by-Hop, Routing, Destination Options in 8-byte units, AH in 4-byte
 * units), Fragment (44) and ESP (50) rejected (a fragment needs reassembly, ESP hides the ports).
 * Source routing is rejected too (IPv4 LSRR/SSRR options, an IPv6 Routing header with Segments
 * Left > 0): there the TCP/UDP pseudo-header uses the final destination, not the header's, so an
 * in-place rewrite could not keep the checksum right. So is an IPv4 option list that does not
 * add up (an option whose length is below 2 or passes the header's end): the kernel would drop
 * it after the rewrite, and lwIP would take it.
 *
 * The IPv4 header checksum is not the parser's: pkt_v4_csum_ok (below) checks it where the
 * stacks need it (PKT_V4_BAD_CSUM).
 */
#ifndef TS_CORE_PKT_H
#define TS_CORE_PKT_H

#include <stdbool.h>
#include <stddef.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>

#include "core/csum.h"
#include "core/flow.h"

#define PKT_REASONS(X)                                                                         \
	X(OK, "ok")                                                                            \
	X(EMPTY, "empty")                                                                      \
	X(BAD_VERSION, "bad_version")                                                          \
	X(V4_TRUNCATED, "v4_truncated")                                                        \
	X(V4_BAD_IHL, "v4_bad_ihl")                                                            \
	X(V4_BAD_TOTLEN, "v4_bad_total_length")                                                \
	X(V4_FRAGMENT, "v4_fragment")                                                          \
	X(V4_SOURCE_ROUTE, "v4_source_route")                                                  \
	X(V4_BAD_OPTIONS, "v4_bad_options")                                                    \
	X(V4_BAD_CSUM, "v4_bad_checksum")     /* pkt_v4_csum_ok, not pkt_parse */              \
	X(V6_TRUNCATED, "v6_truncated")                                                        \
	X(V6_BAD_PAYLEN, "v6_bad_payload_length")                                              \
	X(V6_EXT_TRUNCATED, "v6_ext_truncated")                                                \
	X(V6_EXT_TOO_MANY, "v6_ext_too_many")                                                  \
	X(V6_FRAGMENT, "v6_fragment")                                                          \
	X(V6_ESP, "v6_esp")                                                                    \
	X(V6_ROUTING, "v6_routing_segments_left")                                              \
	X(TCP_TRUNCATED, "tcp_truncated")                                                      \
	X(TCP_BAD_DOFF, "tcp_bad_data_offset")                                                 \
	X(UDP_TRUNCATED, "udp_truncated")                                                      \
	X(UDP_BAD_LEN, "udp_bad_length")                                                       \
	X(ICMP_TRUNCATED, "icmp_truncated")

enum pkt_reason {
#define PKT_REASON_ENUM(name, str) PKT_##name,
	PKT_REASONS(PKT_REASON_ENUM)
#undef PKT_REASON_ENUM
	PKT_REASON_MAX
};

const char *pkt_reason_name(enum pkt_reason r);

/* Offsets of the address fields from the start of the IP header. */
enum {
	PKT_V4_SRC = 12,
	PKT_V4_DST = 16,
	PKT_V6_SRC = 8,
	PKT_V6_DST = 24,
};

/* A parsed packet. Pointers borrow the caller's buffer; valid while it is. */
struct pkt_view {
	uint8_t *ip;       /* start of the IP header */
	uint8_t *l4;       /* start of the L4 header (after any IPv6 extension headers) */
	uint32_t len;      /* IP datagram length from the header (may be < buffer length) */
	uint32_t l4_len;   /* len - l3_len */
	uint16_t l3_len;   /* bytes from ip to l4 */
	uint8_t family;    /* 4 or 6 */
	uint8_t proto;     /* final upper-layer protocol */
	/* TCP/UDP only (adjacent, as in the header, so they copy as one word): */
	uint16_t sport_be, dport_be;
	/* TCP only: */
	uint8_t tcp_flags;
	uint8_t tcp_hlen;  /* TCP header length in bytes (data offset * 4) */
};

enum { TCP_FIN = 0x01, TCP_SYN = 0x02, TCP_RST = 0x04, TCP_PSH = 0x08, TCP_ACK = 0x10 };

/* TCP/UDP header field offsets from l4. */
enum { TCP_OFF_SEQ = 4, TCP_OFF_ACK = 8, TCP_OFF_FLAGS = 13, TCP_OFF_WIN = 14, TCP_OFF_CSUM = 16 };
enum { UDP_OFF_LEN = 4, UDP_OFF_CSUM = 6 };

/* Network-order (big-endian) field access, for lengths and sequence numbers (checksums are
 * loaded and stored in host order with csum_load16/csum_store16: see csum.h). */
static inline void pkt_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline uint32_t pkt_get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The general parser; use pkt_parse. */
enum pkt_reason pkt_parse_slow(struct pkt_view *v, uint8_t *buf, size_t buflen);

/* Parse buf[0..buflen) as an IPv4 or IPv6 packet. For TCP, UDP, ICMP and ICMPv6 the L4 header
 * is validated too (TCP data offset, UDP length, ICMP minimum). Other protocols parse as
 * PKT_OK with only the IP fields set. Returns PKT_OK or the reason for the rejection.
 *
 * The common case — TCP over IPv4 without options — is checked inline in one pass (TCP over
 * IPv6 without extension headers first thing out of line); any doubt falls through to the
 * general path, which finds the exact reason. */
static inline enum pkt_reason pkt_parse(struct pkt_view *v, uint8_t *buf, size_t buflen)
{
	if (buflen >= 40 && buf[0] == 0x45 && buf[9] == 6 /* TCP */) {
		uint32_t tot = (uint32_t)buf[2] << 8 | buf[3];
		uint8_t *tcp = buf + 20;
		uint32_t hlen = (uint32_t)(tcp[12] >> 4) * 4;
		uint16_t frag; /* flags + fragment offset: MF or an offset means a fragment */

		memcpy(&frag, buf + 6, 2);
		if (tot - 40 <= buflen - 40 && !(frag & htons(0x3fff)) && tcp[12] >= 0x50 &&
		    hlen <= tot - 20) {
			v->ip = buf;
			v->l4 = tcp;
			v->len = tot;
			v->l4_len = tot - 20;
			v->l3_len = 20;
			v->family = 4;
			v->proto = 6;
			memcpy(&v->sport_be, tcp, 2);
			memcpy(&v->dport_be, tcp + 2, 2);
			v->tcp_flags = tcp[TCP_OFF_FLAGS];
			v->tcp_hlen = (uint8_t)hlen;
			return PKT_OK;
		}
	}
	return pkt_parse_slow(v, buf, buflen);
}

/* Is the header checksum of a parsed IPv4 packet right (RFC 791; RFC 1122 3.2.1.2 has a host
 * discard a datagram whose checksum is not)? pkt_parse does not look at it: the system stack
 * rewrites a mapped segment's checksum incrementally (RFC 1624), which keeps a wrong sum wrong,
 * and the kernel then drops the segment. The stacks check it where no kernel will: a datagram
 * for the UDP path (its header is not sent on), a segment for lwIP (in place of lwIP's own
 * check, which counted nothing), and a system-stack segment that would make a NAT entry or be
 * answered with a RST. About a dozen instructions for a 20-byte header. */
static inline bool pkt_v4_csum_ok(const struct pkt_view *v)
{
	const uint8_t *h = v->ip;
	uint32_t w0, w1, w2, w3, w4;
	uint64_t s;

	/* Five 32-bit words (with options, up to 15) sum to less than 2^36: no carry is lost. A
	 * word is hi * 65536 + lo, and 65536 = 1 (mod 65535), so s is congruent to the 16-bit
	 * words' sum modulo 65535, whose one's complement fold is 0xffff, the only folded value
	 * congruent to 0, exactly when the checksum is right (s is never 0: the version nibble). */
	memcpy(&w0, h, 4);
	memcpy(&w1, h + 4, 4);
	memcpy(&w2, h + 8, 4);
	memcpy(&w3, h + 12, 4);
	memcpy(&w4, h + 16, 4);
	s = (uint64_t)w0 + w1 + w2 + w3 + w4;
	if (__builtin_expect(v->l3_len > 20, 0)) /* options */
		s = csum_partial(h + 20, v->l3_len - 20u, s);
	return s % 0xffff == 0;
}

/* The TCP MSS option of a parsed TCP packet, or 0 when absent or malformed. */
uint16_t pkt_tcp_mss(const struct pkt_view *v);

/* TCP segment length for sequence-space accounting: payload + SYN + FIN. */
uint32_t pkt_tcp_seglen(const struct pkt_view *v);

/* Fill a flow key from a parsed TCP or UDP packet. */
void pkt_flow_key(const struct pkt_view *v, struct flow_key *k);

/* Address pointers of a parsed packet. */
static inline uint8_t *pkt_src(const struct pkt_view *v)
{
	return v->ip + (v->family == 4 ? PKT_V4_SRC : PKT_V6_SRC);
}

static inline uint8_t *pkt_dst(const struct pkt_view *v)
{
	return v->ip + (v->family == 4 ? PKT_V4_DST : PKT_V6_DST);
}

#endif
