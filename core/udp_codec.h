/* udp_codec.h — the one IPv4/IPv6 UDP codec both stacks share (sans-IO).
 *
 * Parsing turns a packet read from the TUN into a view of its addresses, ports and payload, or
 * a reason for refusing it; it reuses pkt_parse, so fragments, ESP, source routes and every
 * length problem are refused exactly as for TCP. Encoding builds a reply datagram (IP header +
 * UDP header + payload, RFC 768 checksum) into a caller buffer. Neither touches an fd, the clock
 * or any shared state.
 *
 * The parser does not verify the incoming UDP checksum: packets reach the UDP path without
 * their offload metadata, and under IFF_VNET_HDR the kernel hands us NEEDS_CSUM packets whose
 * checksum field holds only a partial sum. The outbound socket's kernel computes a fresh
 * checksum for the datagram we send on, so nothing corrupt is ever vouched for by us.
 */
#ifndef TS_CORE_UDP_CODEC_H
#define TS_CORE_UDP_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "core/pkt.h"

struct pkt_meta;

#define UDP_CODEC_REASONS(X)                                                                   \
	X(OK, "ok")                                                                            \
	X(PKT, "pkt")             /* pkt_parse refused it: view.pkt_reason says why */         \
	X(NOT_UDP, "not_udp")     /* a valid packet of another protocol */                     \
	X(ZERO_PORT, "zero_port") /* source port 0 cannot be answered, dest port 0 not sent */

enum udp_codec_reason {
#define UDP_CODEC_REASON_ENUM(name, str) UDP_CODEC_##name,
	UDP_CODEC_REASONS(UDP_CODEC_REASON_ENUM)
#undef UDP_CODEC_REASON_ENUM
	UDP_CODEC_REASON_MAX
};

const char *udp_codec_reason_name(enum udp_codec_reason r);

/* A parsed datagram. Addresses follow the flow_key convention: IPv4 in [0..3], the rest zero,
 * so they compare as plain memory. payload borrows the caller's buffer. */
struct udp_view {
	uint8_t family;               /* 4 or 6 */
	uint8_t src[16], dst[16];
	uint16_t sport_be, dport_be;  /* network byte order */
	const uint8_t *payload;       /* UDP length - 8 bytes; bytes past the UDP length ignored */
	size_t payload_len;
	enum pkt_reason pkt_reason;   /* PKT_OK unless parse returned UDP_CODEC_PKT */
};

/* Parse pkt[0..len): pkt_parse, then udp_codec_from_view. Returns UDP_CODEC_OK with *v
 * filled, or the reason; on rejection only v->pkt_reason is meaningful. pkt is only read. */
enum udp_codec_reason udp_codec_parse(struct udp_view *v, const uint8_t *pkt, size_t len);

/* The same for a packet pkt_parse has already accepted (pv is its PKT_OK view, e.g. the one a
 * stack parsed before handing the packet to the UDP path): no second parse. v->payload borrows
 * pv's buffer. */
enum udp_codec_reason udp_codec_from_view(struct udp_view *v, const struct pkt_view *pv);

/* What a reply carries besides its payload. */
struct udp_codec_hdr {
	uint8_t family;               /* 4 or 6 */
	uint8_t src[16], dst[16];     /* IPv4 in [0..3] */
	uint16_t sport_be, dport_be;
	uint16_t ip_id;               /* IPv4 identification (host order); ignored for IPv6 */
};

/* Bytes of IP + UDP header in front of the payload: 28 (IPv4) or 48 (IPv6); 0 otherwise. */
size_t udp_codec_hdr_len(uint8_t family);

/* Largest payload a reply can carry: 65507 (IPv4 total length) or 65527 (UDP length). */
size_t udp_codec_max_payload(uint8_t family);

/* Build a reply into buf[0..cap): IPv4 (no options, TTL 64, DF clear so a forwarding host may
 * still fragment it, header checksum) or IPv6 (hop limit 64, no extension headers), then the
 * UDP header with the RFC 768 checksum over the pseudo-header (a computed 0 is sent as 0xFFFF).
 * payload may overlap buf; placing it at buf + udp_codec_hdr_len(family) avoids any copy.
 * Returns 0 with *out_len set, or -EINVAL (family), -EMSGSIZE (payload over the maximum),
 * -ENOBUFS (cap too small). buf is untouched on error. */
int udp_codec_encode(const struct udp_codec_hdr *h, const uint8_t *payload, size_t payload_len,
		     uint8_t *buf, size_t cap, size_t *out_len)
	__attribute__((warn_unused_result));

/* Datagrams a train may carry at most: the kernel segments a UDP GSO packet of up to 64
 * (UDP_MAX_SEGMENTS before Linux 6.11; 128 since). */
#define UDP_CODEC_TRAIN_MAX 64

/* Build a train: the headers of one UDP GSO super-datagram in front of payload_len bytes
 * already at buf + udp_codec_hdr_len(family), which the TUN's kernel cuts every seg bytes into
 * datagrams (the last may be shorter), each with h's addresses and ports, its own length and
 * checksum and, IPv4, the ID h->ip_id + its index. The headers are those udp_codec_encode
 * writes for a datagram of payload_len bytes, except the UDP checksum field: it holds the
 * un-inverted pseudo-header sum over the whole UDP length, as a NEEDS_CSUM packet must (the
 * kernel adjusts it per datagram and completes it). *m gets the offload metadata for the
 * write: NEEDS_CSUM, UDP_L4, gso_size seg. Returns 0 with *out_len set, -EINVAL (family, seg
 * 0, or fewer than 2 or more than UDP_CODEC_TRAIN_MAX datagrams), -EMSGSIZE (over the maximum
 * payload), -ENOBUFS (cap too small). buf is untouched on error. */
int udp_codec_encode_train(const struct udp_codec_hdr *h, size_t payload_len, size_t seg,
			   uint8_t *buf, size_t cap, size_t *out_len, struct pkt_meta *m)
	__attribute__((warn_unused_result));

#endif
