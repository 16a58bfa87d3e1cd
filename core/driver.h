/* driver.h — the TUN I/O driver: the only code that reads or writes the TUN fd.
 *
 * It reads packets in bounded batches on each readiness edge of a libevent loop, hands each to
 * the stack's input function and acts on the verdict: write the rewritten packet back, give it
 * to the shared UDP path, or nothing. Packets a stack or the UDP path produce on their own
 * (RSTs, UDP replies, lwIP output, ICMP echo replies) go out through driver_tx(). Offload
 * headers (virtio_net_hdr) and multi-queue arrive later behind this same interface.
 */
#ifndef TS_CORE_DRIVER_H
#define TS_CORE_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "core/flow.h"

struct event_base;
struct driver;

/* Send one complete IP packet (plain: no GSO, full checksums) to the TUN. 0, or -errno when it
 * was dropped (counted by the driver; a full device queue never blocks the caller). */
typedef int (*tun_tx_fn)(void *arg, const uint8_t *pkt, size_t len);

enum driver_verdict {
	DRIVER_DONE,  /* consumed or dropped by the stack */
	DRIVER_WRITE, /* rewritten in place: write *out_len bytes back */
	DRIVER_UDP,   /* hand the packet to the UDP path untouched */
};

struct driver_ops {
	/* Process one packet read from the TUN. For DRIVER_WRITE set *out_len and *plain (true:
	 * a packet the stack built itself, written with a plain offload header). */
	enum driver_verdict (*input)(void *arg, uint8_t *buf, size_t len,
				     const struct pkt_meta *meta, int64_t now_ns, size_t *out_len,
				     bool *plain);
	/* After each batch (e.g. re-arm the stack's timer, commit stats). May be NULL. */
	void (*batch_end)(void *arg, int64_t now_ns);
	/* A packet for the UDP path. May be NULL (then UDP verdicts are dropped and counted). */
	void (*udp)(void *arg, const uint8_t *pkt, size_t len, int64_t now_ns);
};

#define DRIVER_COUNTERS(X)                                                                     \
	X(rx_packets)                                                                          \
	X(rx_bytes)                                                                            \
	X(tx_packets)                                                                          \
	X(tx_bytes)                                                                            \
	X(rewrites)       /* packets written back after an in-place rewrite */                 \
	X(rx_errors)      /* read errors other than EAGAIN */                                  \
	X(tx_dropped)     /* writes that failed (EAGAIN: device queue full, or an error) */     \
	X(udp_no_path)    /* UDP verdicts with no UDP path */

struct driver_counters {
#define DRIVER_CTR_FIELD(name) ctr_t name;
	DRIVER_COUNTERS(DRIVER_CTR_FIELD)
#undef DRIVER_CTR_FIELD
};

/* Packets drained per readiness edge before yielding to the loop (bounded work per wakeup). */
#define DRIVER_BATCH 64

/* Drive fd (a non-blocking TUN queue) on base. mtu bounds the packets read. The read buffer is
 * allocated once, here, from the budget when one is given (NULL: plain malloc, tests). */
struct budget;
int driver_new(struct event_base *base, int fd, uint32_t mtu, const struct driver_ops *ops,
	       void *arg, struct budget *b, struct driver **out) __attribute__((warn_unused_result));
void driver_free(struct driver *d);

/* tun_tx_fn for this driver (arg = the driver). */
int driver_tx(void *driver, const uint8_t *pkt, size_t len);

const struct driver_counters *driver_get_counters(const struct driver *d);

/* Visit every counter with its name. */
void driver_counters_foreach(const struct driver_counters *c,
			     void (*fn)(void *arg, const char *name, uint64_t value), void *arg);

#endif
