/* gso.h — coalesce consecutive TCP segments of one flow into a GSO super-packet (a "train").
 *
 * A userspace stack (lwIP) emits MSS-sized segments; written one by one, each costs a write and
 * a trip through the kernel's input path. With TUN offload, consecutive segments of one flow
 * can instead go out as one super-packet the kernel segments itself (virtio_net_hdr gso_type
 * TCPV4/TCPV6, NEEDS_CSUM): one write per up to ~64 KiB.
 *
 * Sans-IO: the train owns one staging buffer; gso_train_add() copies a segment in (or flushes
 * what it holds first), and emit() is called with each finished packet and its offload
 * metadata. A train of one segment is emitted exactly as it was given (plain meta, its full
 * checksums untouched; see gso_train_fill_csum). A longer train gets the first segment's headers with the total
 * length, the IPv4 header checksum recomputed, the TCP checksum field set to the un-inverted
 * pseudo-header sum over the whole L4 length (what NEEDS_CSUM means), and PSH if any segment
 * had it (the kernel keeps FIN/PSH on the last segment only: a PSH inside a train moves to
 * its end, which only delays a push hint by the rest of the train).
 *
 * Coalesced: TCP over IPv4 without options or IPv6 without extension headers, carrying data,
 * flags ACK or ACK|PSH only, and — relative to the train — the same addresses, ports, ack
 * number, window, TCP header (options included), the next sequence number, a payload equal
 * to the train's segment size (a shorter one ends the train), 64 KiB at most in all. Anything
 * else is emitted on its own, after the train (order is kept).
 */
#ifndef TS_CORE_GSO_H
#define TS_CORE_GSO_H

#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "core/flow.h"

struct gso_train;

/* Called with each packet to write: plain (meta all zero) or a super-packet. */
typedef void (*gso_emit_fn)(void *arg, const uint8_t *pkt, size_t len,
			    const struct pkt_meta *meta);

#define GSO_TRAIN_MAX 65535u /* an IP packet's length field; the staging buffer's size */

struct gso_stats {
	ctr_t segments;     /* segments offered */
	ctr_t trains;       /* super-packets emitted (2 segments or more) */
	ctr_t train_segments; /* segments that went out inside them */
	ctr_t singles;      /* packets emitted alone */
	ctr_t csum_filled;  /* plain TCP packets whose checksum the train computed */
	ctr_t big_packets;  /* gso_train_add_big: segments longer than their MSS, sent whole */
	ctr_t big_segments; /* the MSS-sized segments the kernel cuts them into */
};

/* One train; its staging buffer (GSO_TRAIN_MAX bytes, pre-faulted) comes from the budget b
 * (NULL: malloc). 0 or -ENOMEM. */
struct budget;
int gso_train_new(struct budget *b, gso_emit_fn emit, void *arg, struct gso_train **out)
	__attribute__((warn_unused_result));
void gso_train_free(struct gso_train *t);

/* Offer one complete IP packet, fully checksummed — or, under gso_train_fill_csum, with its TCP
 * checksum left for the train to fill in (then pkt may be written: its TCP checksum field).
 * Never fails: what cannot join a train is emitted alone (after flushing the train, so packet
 * order is kept). */
void gso_train_add(struct gso_train *t, uint8_t *pkt, size_t len);
/* Offer one complete TCP packet that may carry more than mss payload bytes: a segment the
 * stack built large for the kernel to cut (stacks/lwip/lwip_bigseg.h). Longer than mss: the
 * train is flushed and the packet goes out on its own as a super-packet of mss-sized segments
 * (pkt is written: IP length and checksum, the partial TCP checksum; the kernel moves FIN and
 * PSH to the last segment). Otherwise, or with mss 0, exactly gso_train_add. */
void gso_train_add_big(struct gso_train *t, uint8_t *pkt, size_t len, uint16_t mss);
/* on: the stack leaves TCP checksums to the train (lwIP with NETIF_CHECKSUM_GEN_TCP off): a
 * super-packet gets its partial sum as always, and every TCP packet emitted plain gets its full
 * checksum computed here (a segment that joins a train is never summed on its own). Off (the
 * default): plain packets go out exactly as given. */
void gso_train_fill_csum(struct gso_train *t, int on);
/* Emit what the train holds (nothing: no-op). */
void gso_train_flush(struct gso_train *t);
/* True when a flush would emit something. */
int gso_train_pending(const struct gso_train *t);

const struct gso_stats *gso_train_stats(const struct gso_train *t);

#endif
