/* flow.h — the 5-tuple that names a flow, and packet metadata carried from the TUN driver.
 *
 * Plain value types shared by the parser, the NAT table, the packet processor and the UDP path.
 */
#ifndef TS_CORE_FLOW_H
#define TS_CORE_FLOW_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* A flow's full (source, destination) pair. Ports are in NETWORK byte order (they are copied
 * straight from and into packets). IPv4 addresses occupy src[0..3]/dst[0..3]; the remaining
 * bytes are zero so that keys compare and hash as plain memory. 40 bytes, no padding holes. */
struct flow_key {
	uint8_t family;   /* 4 or 6 */
	uint8_t proto;    /* IPPROTO_TCP or IPPROTO_UDP */
	uint16_t sport_be;
	uint16_t dport_be;
	uint16_t zero;    /* always 0: keeps the key hole-free for memcmp/hash */
	uint8_t src[16];
	uint8_t dst[16];
};

static inline bool flow_key_eq(const struct flow_key *a, const struct flow_key *b)
{
	return memcmp(a, b, sizeof(*a)) == 0;
}

/* Offload state of one packet, mirroring struct virtio_net_hdr (offsets from the IP header).
 * A zeroed struct means "plain packet, full checksums". */
enum {
	PKT_META_NEEDS_CSUM = 1, /* L4 checksum field holds the un-inverted pseudo-header sum */
	PKT_META_DATA_VALID = 2, /* the kernel already validated the checksum */
};
enum {
	PKT_GSO_NONE = 0,
	PKT_GSO_TCPV4 = 1,
	PKT_GSO_UDP = 3,
	PKT_GSO_TCPV6 = 4,
	PKT_GSO_UDP_L4 = 5,
};
struct pkt_meta {
	uint8_t flags;
	uint8_t gso_type;
	uint16_t hdr_len;
	uint16_t gso_size;
	uint16_t csum_start;
	uint16_t csum_offset;
};

#endif
