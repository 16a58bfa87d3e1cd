/* driver.h — the TUN I/O driver: the only code that reads or writes a TUN queue fd.
 *
 * It reads packets in bounded batches on each readiness edge of a libevent loop, hands each to
 * the stack's input function and acts on the verdict in the same pass: write the rewritten
 * packet back, give it to the shared UDP path, or nothing. Packets a stack or the UDP path
 * produce on their own (RSTs, UDP replies, lwIP output, ICMP echo replies) go out through
 * driver_tx().
 *
 * Offload (vnet_hdr): every read and every write carries a 10-byte struct virtio_net_hdr in
 * front of the IP packet. The driver validates it on read (an unknown flag or GSO type is
 * dropped and counted) and turns it into struct pkt_meta for the stack. A packet rewritten in
 * place — possibly a ~64 KiB TCP super-packet — is written back whole with the header it came
 * with, so the kernel segments it (no split, no payload copy). A packet the stack built itself
 * (plain verdict) and everything sent through driver_tx() gets a zero header: no GSO, full
 * checksums. The header must match the packet: a TCP super-packet written without NEEDS_CSUM
 * while its field holds the partial sum is accepted by write() and then dropped whole as one
 * checksum error (Linux 6.18; a UDP GSO write without NEEDS_CSUM fails with EINVAL instead),
 * see tests/unit/test_tun_vnet.c. UDP super-datagrams (USO/GRO, gso_type UDP_L4) are split into datagrams for the UDP
 * path in place: only the headers are copied, never the payload.
 *
 * Multi-queue: one driver per queue fd, each on its own loop and thread; a driver is used by
 * one thread only.
 */
#ifndef TS_CORE_DRIVER_H
#define TS_CORE_DRIVER_H

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "core/flow.h"

struct event_base;
struct driver;
struct pkt_view;

/* Send one complete IP packet (plain: no GSO, full checksums) to the TUN. 0, or -errno when it
 * was dropped (counted by the driver; a full device queue never blocks the caller). */
typedef int (*tun_tx_fn)(void *arg, const uint8_t *pkt, size_t len);
/* The same with offload metadata (driver_tx_meta): a GSO super-packet with NEEDS_CSUM, or
 * plain. */
typedef int (*tun_tx_meta_fn)(void *arg, const uint8_t *pkt, size_t len,
			      const struct pkt_meta *m);

enum driver_verdict {
	DRIVER_DONE,  /* consumed or dropped by the stack */
	DRIVER_WRITE, /* rewritten in place: write *out_len bytes back */
	DRIVER_UDP,   /* hand the packet to the UDP path untouched */
};

struct driver_ops {
	/* Process one packet read from the TUN. buf has room for DRIVER_INPUT_ROOM bytes, or for
	 * len if that is more: a packet the stack builds in its place may be longer than the one
	 * it read, up to that room. For DRIVER_WRITE set *out_len and *plain (true:
	 * a packet the stack built itself, written with a plain offload header). For DRIVER_UDP
	 * fill *view (never NULL) with the packet's PKT_OK pkt_parse view of buf, a UDP one: the
	 * driver splits a super-datagram by it and hands it on to udp, so nothing parses the
	 * packet twice. Otherwise *view is scratch space the input may use or leave. */
	enum driver_verdict (*input)(void *arg, uint8_t *buf, size_t len,
				     const struct pkt_meta *meta, int64_t now_ns, size_t *out_len,
				     bool *plain, struct pkt_view *view);
	/* After each batch of reads, with the batch's now_ns: the owner's per-batch work (the proxy:
	 * the stack re-arms its timer and flushes queued output, then tun.rps "auto" and the
	 * pressure tier's RSS sample). May be NULL. */
	void (*batch_end)(void *arg, int64_t now_ns);
	/* A packet for the UDP path: one datagram, plain (a super-datagram has been split; its
	 * checksum is not verified by the UDP path). view (never NULL) is its parsed view, with
	 * view->ip == pkt: the one input gave, or for a split datagram the same view moved onto
	 * that datagram. pkt and view borrow the driver's read buffer, which the next read
	 * overwrites: use them before returning (copy to keep). May be NULL (then UDP verdicts
	 * are dropped and counted). */
	void (*udp)(void *arg, const uint8_t *pkt, size_t len, const struct pkt_view *view,
		    int64_t now_ns);
	/* The device is gone (deleted under us: a read failed with EBADFD, ENODEV, ENXIO or
	 * EIO), or -ENOTRECOVERABLE: an io_uring operation on it never completed (its buffer may
	 * still be written: nothing can be read safely any more). Called once, from the driver's
	 * loop, with -errno; the driver has stopped reading (a dead fd stays readable and would
	 * spin the loop). May be NULL. */
	void (*gone)(void *arg, int err);
	/* Batched I/O was given up while running (why: a phrase); the driver reads and writes
	 * with system calls from now on. From the driver's loop. May be NULL. */
	void (*uring_off)(void *arg, const char *why);
};

#define DRIVER_COUNTERS(X)                                                                     \
	X(rx_packets)                                                                          \
	X(rx_bytes)                                                                            \
	X(tx_packets)                                                                          \
	X(tx_bytes)                                                                            \
	X(rewrites)       /* packets written back after an in-place rewrite */                 \
	X(rx_errors)      /* read errors other than EAGAIN */                                  \
	X(rx_gone)        /* reads that found the device gone (the driver stopped reading) */  \
	X(tx_dropped)     /* writes that failed (EAGAIN: device queue full, or an error) */     \
	X(udp_no_path)    /* UDP verdicts with no UDP path */                                  \
	X(rx_gso)         /* super-packets read (virtio_net_hdr gso_type != NONE) */           \
	X(rx_gso_bytes)   /* their IP bytes */                                                 \
	X(rx_needs_csum)  /* packets read with a partial checksum (NEEDS_CSUM) */              \
	X(tx_gso)         /* super-packets written (rewritten ones, lwIP trains) */     \
	X(rx_bad_vnet_hdr) /* unknown flags/GSO type, GSO without a checksum state: dropped */ \
	X(rx_gso_data_valid) /* GSO reads flagged DATA_VALID, made partial for the rewrite */  \
	X(udp_split)      /* UDP super-datagrams split for the UDP path */                     \
	X(udp_split_datagrams) /* datagrams they became */                                     \
	X(udp_split_bad)  /* UDP super-datagrams that do not add up, or > 128 segments: dropped */ \
	X(uring_enters)   /* batched I/O: rounds, one io_uring_enter each */                   \
	X(uring_flushes)  /* rounds of writes only: ahead of a packet the stack wrote, at the \
			   * end of its loop pass (driver_tx_flush), or DRIVER_LEND_MAX lent */   \
	X(uring_flush_writes) /* the writes those rounds carried */                          \
	X(tx_lent)        /* frames the stack lent, written with a later round */             \
	X(uring_reads_empty) /* batched I/O: reads that found the device empty */             \
	X(rx_taken)       /* read buffers a stack took with their packet (driver_rx_take) */  \
	X(uring_lost_bytes) /* read buffers' bytes left allocated for good: the ring lost a    \
			     * round, and the kernel may still write into them */             \
	X(uring_lost_lent)  /* lent frames of a lost round, given back as lost: their owner    \
			     * keeps them allocated for good (the kernel may still read them) */ \
	/* batched I/O given up (read() and write() from then on), by reason: */              \
	X(uring_read_refused)  /* the ring could not read the device, read() could */          \
	X(uring_write_refused) /* the ring could not write to it (EOPNOTSUPP), writev() could */ \
	X(uring_enter_failed)  /* io_uring_enter failed, or an operation did not complete */

struct driver_counters {
#define DRIVER_CTR_FIELD(name) ctr_t name;
	DRIVER_COUNTERS(DRIVER_CTR_FIELD)
#undef DRIVER_CTR_FIELD
};

/* Packets drained per readiness edge before yielding to the loop (bounded work per wakeup).
 * With offload one read is a super-packet of up to ~64 KiB, whatever the MSS: an adversarial
 * MSS of 48 bytes makes more segments per read, never a bigger read, so the single read buffer
 * can never overflow. */
#define DRIVER_BATCH 64
/* Batched I/O (io_uring, core/uring.h): read buffers ("slots") per packet and with offload
 * (whose buffers are ~64 KiB each), the reads one round makes at first and at least, a read
 * that counts as a super-packet and the reads per round after one. */
#define DRIVER_URING_SLOTS 16
#define DRIVER_URING_SLOTS_OFFLOAD 4
#define DRIVER_URING_FIRST_READS 4
#define DRIVER_URING_MIN_READS 2
#define DRIVER_URING_BIG 16384
#define DRIVER_URING_BIG_READS 4
/* Frames a stack may lend before they are written (driver_tx_lend): a pass's large segments
 * go in one io_uring_enter. */
#define DRIVER_LEND_MAX 16
/* The read buffer with offload: the header and the largest packet the kernel hands a TUN
 * (skb->len stays under 64 KiB without BIG TCP; an IPv6 datagram can still claim 40 + 65535). */
#define DRIVER_GSO_MAX (65535u + 40u)

/* The smallest MTU the driver takes (the least every IPv4 host must accept, RFC 791), and so
 * the room every read buffer has for a packet, whatever was read into it. */
#define DRIVER_INPUT_ROOM 576u

struct driver_params {
	int fd;          /* a non-blocking TUN queue fd */
	uint32_t mtu;    /* bounds the packets read without offload */
	bool vnet_hdr;   /* the queue was opened with IFF_VNET_HDR (offload I/O) */
	uint32_t vnet_hdr_len; /* its header size (TUNGETVNETHDRSZ); 0: TUN_VNET_HDR_LEN */
	bool uring;      /* batch reads and writes through an io_uring when the kernel allows */
};

/* Drive p->fd on base. The read buffer is allocated here, from the budget when one is given
 * (NULL: plain malloc, tests), and pre-faulted so memory figures do not jump under load (a
 * stack that takes a buffer, driver_rx_take, has it replaced).
 * With p->uring the driver sets up an io_uring and DRIVER_URING_SLOTS read buffers
 * (DRIVER_URING_SLOTS_OFFLOAD with vnet_hdr), all counted against the budget, only the first
 * pre-faulted: the others take memory as packets land in them. When the kernel refuses the
 * ring (no io_uring, a seccomp filter, kernel.io_uring_disabled) or the budget the buffers, it
 * reads and writes with system calls, as without p->uring: driver_uring() says which,
 * driver_uring_err() why. 0, or -EINVAL / -ENOMEM. */
struct budget;
int driver_new(struct event_base *base, const struct driver_params *p,
	       const struct driver_ops *ops, void *arg, struct budget *b, struct driver **out)
	__attribute__((warn_unused_result));
/* The io_uring the driver asked for could not be set up: -errno (0: it was, or not asked). */
int driver_uring_err(const struct driver *d);
/* Reads and writes go through the io_uring now (false: system calls per packet). Any thread. */
bool driver_uring(const struct driver *d);
void driver_free(struct driver *d);

/* Give back the pages of the read buffers (nothing waits in them between batches), and free
 * the buffers kept for takes: for a quiet proxy; the next batch faults them in again. Call on
 * the driver's own loop. Bytes given (of the read buffers). */
size_t driver_release_idle(struct driver *d);

/* Read and process up to DRIVER_BATCH packets now, as a readiness edge does (tests; the loop
 * calls it itself), and write what they leave to write. Returns the number of reads that
 * returned a frame (bad ones included). */
int driver_poll(struct driver *d);

/* tun_tx_fn for this driver (arg = the driver). */
int driver_tx(void *driver, const uint8_t *pkt, size_t len);

/* Send one packet with its offload metadata (a GSO super-packet with NEEDS_CSUM, or plain).
 * Without offload only plain metadata is accepted (-EOPNOTSUPP otherwise). */
int driver_tx_meta(void *driver, const uint8_t *pkt, size_t len, const struct pkt_meta *m);

/* The same, from memory the caller lends until release(arg, lost) is called. With batched
 * I/O the frame joins the queued writes and goes, in order with them, with the driver's next
 * round, a packet written through driver_tx or driver_tx_meta, or driver_tx_flush, whichever
 * comes first: one io_uring_enter for several frames instead of a writev each. release is
 * called once, from this thread: with lost false once the frame is written or dropped
 * (counted as for driver_tx_meta), the memory the caller's again; with lost true when the
 * ring lost track of its write (a dropped write, counted in uring_lost_lent too): the kernel
 * may still read the memory at any time, so the caller must leave it allocated for as long
 * as the process lives (lsan_leave_allocated) and abandon what it is charged to the budget
 * (budget_bytes_abandon). Without the ring or without offload the frame is written now and
 * released before this returns. The caller flushes before its loop sleeps (a pass's end), and
 * before it frees what it lends from. 0 (queued or written), or the failure of a write made
 * now (-errno, counted). */
int driver_tx_lend(void *driver, const uint8_t *pkt, size_t len, const struct pkt_meta *m,
		   void (*release)(void *arg, bool lost), void *arg);
/* Write what is queued now (lent frames and write-backs), in one io_uring_enter. */
void driver_tx_flush(void *driver);

/* Only inside ops->input, for a DRIVER_WRITE: write the packet back to fd, another queue of
 * the same TUN, instead of this driver's queue (in order with this driver's other writes of
 * the round). A multi-queue TUN sends each flow to the queue its packets were last written to,
 * so writing every packet of a connection to one queue keeps both of its directions there. */
void driver_write_to(struct driver *d, int fd);
/* A read buffer: how it is freed, room for whoever holds it, then the frame the driver reads
 * into ([virtio header][packet]). A stack may take the buffer with the packet it was given
 * instead of copying the packet out (driver_rx_take). */
#define DRIVER_RXBUF_USER 64
struct driver_rxbuf {
	void (*free)(struct driver_rxbuf *b); /* frees b, whoever holds it */
	void *ctx;                            /* the free function's */
	union {
		max_align_t align;
		unsigned char bytes[DRIVER_RXBUF_USER];
	} user; /* the holder's (a stack: its pbuf wrapper) */
	alignas(max_align_t) uint8_t frame[];
};

/* From the stack's input only, for the packet it was given (pkt): the stack keeps the read
 * buffer holding it instead of copying the packet out, and the driver reads into a new one
 * (from the budget) from now on. The packet stays where it is, untouched by later reads, until
 * the holder frees the buffer with b->free(b): on the driver's own thread (the buffers share an
 * unlocked pool with it), or on any one thread once the driver's loop has stopped, before or
 * after driver_free. The input must then return DRIVER_DONE. Returns the buffer (the holder's
 * now), or NULL: pkt is not the packet of the input under way, it was taken already, the ring
 * lost a round (its buffers are left to the kernel, uring_lost_bytes), or the budget refused
 * the new buffer (counted there as a refused reserve). */
struct driver_rxbuf *driver_rx_take(void *driver, const uint8_t *pkt);
/* Buffers given back and kept for the next takes (not charged to the budget). */
unsigned driver_rx_kept(const struct driver *d);

/* True when the driver reads and writes virtio_net_hdr (offload I/O). */
bool driver_offload(const struct driver *d);

const struct driver_counters *driver_get_counters(const struct driver *d);
/* acc += c, field by field (aggregating the drivers of several queues). */
void driver_counters_accumulate(struct driver_counters *acc, const struct driver_counters *c);

/* Split a UDP super-datagram pkt[0..len) (IPv4 or IPv6 with its view parsed by the caller:
 * l3_len bytes of IP header, 8 of UDP) into datagrams of gso_size payload bytes, in place:
 * each datagram's headers are copied in front of its payload, lengths and the IPv4 header
 * checksum fixed, the UDP checksum cleared (IPv4) or left (IPv6; the UDP path does not
 * verify it). fn is called once per datagram, in order. Returns the number of datagrams, or
 * -EINVAL when the headers are longer than DRIVER_SPLIT_HDR_MAX, the sizes do not add up or
 * it would make more than 128 datagrams (the kernel's UDP_MAX_SEGMENTS); then fn was not
 * called. */
#define DRIVER_SPLIT_HDR_MAX 256
int driver_udp_split(uint8_t *pkt, size_t len, uint16_t l3_len, uint16_t gso_size,
		     void (*fn)(void *arg, const uint8_t *dgram, size_t dlen), void *arg);

/* Visit every counter with its name. */
void driver_counters_foreach(const struct driver_counters *c,
			     void (*fn)(void *arg, const char *name, uint64_t value), void *arg);

#endif
