/* delayq.h — the delay line's queue (sans-IO): packets held for one fixed delay and released
 * in arrival order, stored in one preallocated byte ring bounded in bytes and in packets.
 *
 * A packet committed at now_ns is due at now_ns + delay_ns and delayq_peek() shows it only
 * once its caller's now_ns has reached that. The delay is one constant and an arrival time
 * earlier than the previous one is taken as the previous one, so due times never decrease:
 * arrival order is due order, and a ring is the whole schedule (no heap, O(1) per packet).
 *
 * Bounds: at most max_bytes of packet bytes and max_packets packets are queued; a commit that
 * would exceed either is refused and counted (drops_bytes, drops_packets): tail drop, like a
 * router's full buffer. The arena is max_bytes + 2 * max_packet bytes, so a reservation of
 * max_packet contiguous bytes always fits while the queued bytes stay within max_bytes (a
 * packet never wraps; the end of the arena left unused at a wrap is under max_packet).
 *
 * Zero copy: delayq_reserve() lends room for one packet of up to max_packet bytes; the caller
 * reads the packet straight into it and commits its length, or simply does not commit (the
 * room is lent again by the next reserve). delayq_push() is reserve + copy + commit.
 *
 * Time is passed in (now_ns, any monotonic clock in nanoseconds); nothing here reads a clock
 * or touches an fd. Not thread-safe: one owner.
 */
#ifndef TS_BENCH_DELAYQ_H
#define TS_BENCH_DELAYQ_H

#include <stddef.h>
#include <stdint.h>

#define DELAYQ_WUR __attribute__((warn_unused_result))

struct delayq;

struct delayq_params {
	int64_t delay_ns;     /* 0 .. DELAYQ_DELAY_MAX_NS */
	uint64_t max_bytes;   /* max_packet .. DELAYQ_BYTES_MAX */
	uint32_t max_packets; /* 1 .. DELAYQ_PACKETS_MAX */
	uint32_t max_packet;  /* the longest packet, 1 .. DELAYQ_PACKET_MAX bytes */
	int64_t late_ns;      /* a pop more than this after its due time counts as late, >= 0 */
};

#define DELAYQ_DELAY_MAX_NS (3600LL * 1000000000LL)
#define DELAYQ_BYTES_MAX (1ULL << 31)
#define DELAYQ_PACKETS_MAX (1u << 26)
#define DELAYQ_PACKET_MAX (1u << 20)

struct delayq_stats {
	uint64_t packets_in, bytes_in;       /* committed */
	uint64_t packets_out, bytes_out;     /* popped */
	uint64_t drops_bytes;                /* refused: max_bytes would be exceeded */
	uint64_t drops_packets;              /* refused: max_packets already queued */
	uint64_t drops_oversize;             /* refused: longer than max_packet */
	uint64_t queued_bytes, queued_packets;         /* now */
	uint64_t max_queued_bytes, max_queued_packets; /* the peaks */
	uint64_t late;                       /* popped more than late_ns after due */
	int64_t max_late_ns;                 /* the largest (pop time - due time) seen; 0 at start */
};

/* A queue for p (copied). 0, -EINVAL (a parameter out of its range) or -ENOMEM. */
int delayq_new(const struct delayq_params *p, struct delayq **out) DELAYQ_WUR;
/* Frees q and every packet still queued. NULL is a no-op. */
void delayq_free(struct delayq *q);

/* Room for one packet of up to max_packet bytes. Never NULL. Borrowed: valid until the next
 * call on q (commit it before anything else, or leave it). */
uint8_t *delayq_reserve(struct delayq *q);
/* Queue the len bytes the caller put at the last delayq_reserve() pointer, arrived at now_ns.
 * 0, or -ENOBUFS (full, counted in drops_bytes or drops_packets) or -EMSGSIZE (len 0 or over
 * max_packet, counted in drops_oversize); a refused packet is simply not queued. */
int delayq_commit(struct delayq *q, size_t len, int64_t now_ns);
/* delayq_reserve + memcpy + delayq_commit. */
int delayq_push(struct delayq *q, const void *data, size_t len, int64_t now_ns);

/* The oldest packet if it is due at now_ns (its length in *len), else NULL (empty, or not
 * due yet). Borrowed: valid until the next delayq_pop/reserve/commit/free. */
const uint8_t *delayq_peek(const struct delayq *q, int64_t now_ns, size_t *len);
/* Remove the oldest packet (the queue must not be empty; asserted) as sent at now_ns: counted
 * out, and late when now_ns is more than late_ns past its due time. */
void delayq_pop(struct delayq *q, int64_t now_ns);
/* When the oldest packet is due; INT64_MAX when the queue is empty. */
int64_t delayq_next_due(const struct delayq *q);

void delayq_get_stats(const struct delayq *q, struct delayq_stats *out);

#endif
