/* driver.c — the TUN driver on a libevent loop: per-packet or offload (virtio_net_hdr) I/O.
 * Reads up to DRIVER_BATCH packets per readiness edge, reads the clock once per batch, and acts
 * on each verdict in the same pass: no queue between read and write-back. */
#include "core/driver.h"

#include <assert.h>
#include <endian.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/csum.h"
#include "core/pkt.h"
#include "core/rss.h"
#include "core/tun.h"
#include "core/lsan.h"
#include "core/uring.h"

/* struct virtio_net_hdr (linux/virtio_net.h). tun_open sets TUNSETVNETLE, so its fields are
 * little-endian on every host (virtio 1.0). Defined here so the layout is explicit and
 * bookworm's missing VIRTIO_NET_HDR_GSO_UDP_L4 (5) does not matter. */
struct vnet_hdr {
	uint8_t flags;
	uint8_t gso_type;
	uint16_t hdr_len;
	uint16_t gso_size;
	uint16_t csum_start;
	uint16_t csum_offset;
} __attribute__((packed));
_Static_assert(sizeof(struct vnet_hdr) == TUN_VNET_HDR_LEN, "virtio_net_hdr is 10 bytes");

#define VNET_GSO_ECN 0x80 /* VIRTIO_NET_HDR_GSO_ECN: CWR seen on the super-packet */
#define UDP_MAX_SEGMENTS 128 /* the kernel's limit for one UDP GSO packet */

/* A write waiting for the next round of the ring: a write-back (slot's frame, header
 * included) or a frame the stack lent (driver_tx_lend: its header here, copied into the
 * driver's round_hdr for the round that writes it; its packet in the stack's memory until
 * release). */
struct wback {
	const uint8_t *pkt; /* lent: the packet; NULL: a write-back of slot */
	void (*release)(void *arg, bool lost);
	void *arg;
	struct vnet_hdr h; /* lent: the header */
	int fd;           /* where it goes: -1 the driver's queue, else another queue of the same
			   * TUN (driver_write_to) */
	uint8_t slot;
	bool gso;         /* a super-packet (counted in tx_gso) */
	bool rewrite;     /* rewritten in place, not built by the stack (counted in rewrites) */
	uint32_t len;     /* packet bytes, header excluded */
};

/* A round carries at most one write-back per slot, DRIVER_LEND_MAX lent frames and one read
 * per slot; a lent frame is up to three buffers (header, padding of a longer header, packet). */
#define WQ_MAX (DRIVER_URING_SLOTS + DRIVER_LEND_MAX)
_Static_assert(WQ_MAX + DRIVER_URING_SLOTS <= URING_MAX_OPS, "a round fits the ring");

struct driver {
	struct event_base *base;
	struct event *ev;
	int fd;
	int write_to;     /* driver_write_to during ops->input: the packet's write-back fd, or -1 */
	size_t hdr;       /* virtio header bytes per frame with offload (>= 10), else 0 */
	const struct driver_ops *ops;
	void *arg;
	size_t buf_size;  /* one slot's frame: [hdr][packet] */
	/* The read buffers: DRIVER_URING_SLOTS (DRIVER_URING_SLOTS_OFFLOAD with offload) with the
	 * ring, else one. Each is the driver's own or one a stack gave for a frame it took
	 * (driver_rx_take); each says how it is freed. */
	struct driver_rxbuf *slot[DRIVER_URING_SLOTS];
	struct rxpool *pool;         /* where they come from */
	struct driver_rxbuf *in_buf; /* the buffer whose packet input has now, if it may go */
	unsigned in_slot;
	int64_t now_ns;              /* the clock of the batch under way */
	bool gone;        /* the device went away: no more reads */
	/* batched I/O (core/uring.h); NULL: read() and writev() */
	struct uring *ring;
	bool ring_stuck;  /* the ring lost track of an operation: slots never reused nor freed */
	int uring_err;    /* why the ring asked for could not be set up, or 0 */
	bool uring_on;    /* ring != NULL, for other threads (atomic) */
	unsigned ring_misses; /* edges in a row where read() found what the ring did not */
	unsigned nslots;  /* read buffers with the ring */
	unsigned reads;   /* reads per round (adaptive) */
	struct wback wq[WQ_MAX];
	unsigned nwq;
	unsigned nlent;   /* lent frames among them */
	/* With the ring: the headers of a round's lent frames (WQ_MAX, by write), where the
	 * kernel reads them. A block of its own: a lost round leaves it allocated (the kernel may
	 * still read it) after the driver is freed. */
	struct vnet_hdr *round_hdr;
	struct driver_counters ctr;
};

/* All zero: GSO none, full checksums; as long as the longest header a device may carry. */
static const uint8_t plain_hdr[TUN_VNET_HDR_MAX];

/* Count a frame of len packet bytes written (ok), or dropped. */
static void tx_counted(struct driver *d, bool ok, size_t len, bool gso)
{
	if (!ok) {
		ctr_inc(&d->ctr.tx_dropped);
		return;
	}
	ctr_inc(&d->ctr.tx_packets);
	ctr_add(&d->ctr.tx_bytes, len);
	if (gso)
		ctr_inc(&d->ctr.tx_gso);
}

/* The one write path: iov (header, if any, and packet; len packet bytes) as one frame. A
 * failure is a counted drop — EAGAIN means the device queue is full, and dropping is what a
 * router does: TCP above retransmits, and blocking here would stall every flow. */
static int send_frame(struct driver *d, int fd, const struct iovec *iov, int cnt, size_t len,
		      bool gso)
{
	ssize_t n;

	do
		n = writev(fd, iov, cnt);
	while (n < 0 && errno == EINTR);
	tx_counted(d, n >= 0, len, gso);
	return n < 0 ? -errno : 0;
}

static void flush_writes(struct driver *d);

int driver_tx(void *driver, const uint8_t *pkt, size_t len)
{
	struct driver *d = driver;
	struct iovec iov[2] = {
		{ .iov_base = (void *)plain_hdr, .iov_len = d->hdr },
		{ .iov_base = (void *)pkt, .iov_len = len },
	};

	flush_writes(d); /* nothing the stack writes overtakes a write-back queued before it */
	return d->hdr ? send_frame(d, d->fd, iov, 2, len, false)
		      : send_frame(d, d->fd, iov + 1, 1, len, false);
}

/* The virtio_net_hdr that carries m. */
static struct vnet_hdr vnet_of(const struct pkt_meta *m)
{
	return (struct vnet_hdr){
		.flags = m->flags,
		.gso_type = m->gso_type,
		.hdr_len = htole16(m->hdr_len),
		.gso_size = htole16(m->gso_size),
		.csum_start = htole16(m->csum_start),
		.csum_offset = htole16(m->csum_offset),
	};
}

int driver_tx_meta(void *driver, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	struct driver *d = driver;
	struct vnet_hdr h = vnet_of(m);
	struct iovec iov[3] = { { .iov_base = &h, .iov_len = sizeof(h) } };
	int cnt = 1;

	if (!d->hdr) /* no header to carry the metadata: only plain packets can go */
		return m->flags || m->gso_type ? -EOPNOTSUPP : driver_tx(d, pkt, len);
	/* A device with a longer header (e.g. 12 bytes with num_buffers): zeros after ours. */
	if (d->hdr > sizeof(h))
		iov[cnt++] = (struct iovec){ .iov_base = (void *)plain_hdr,
					     .iov_len = d->hdr - sizeof(h) };
	iov[cnt++] = (struct iovec){ .iov_base = (void *)pkt, .iov_len = len };
	flush_writes(d);
	return send_frame(d, d->fd, iov, cnt, len, m->gso_type != PKT_GSO_NONE);
}

bool driver_offload(const struct driver *d)
{
	return d->hdr != 0;
}

static uint8_t *slot_frame(const struct driver *d, unsigned slot)
{
	return d->slot[slot]->frame;
}

/* The buffers of queued write w, in iov (room for 3), a lent frame's header from h; returns
 * how many. */
static int frame_iov(const struct driver *d, const struct wback *w, const struct vnet_hdr *h,
		     struct iovec *iov)
{
	int cnt = 0;

	if (!w->pkt) {
		iov[0] = (struct iovec){ .iov_base = slot_frame(d, w->slot),
					 .iov_len = d->hdr + w->len };
		return 1;
	}
	iov[cnt++] = (struct iovec){ .iov_base = (void *)h, .iov_len = sizeof(*h) };
	if (d->hdr > sizeof(*h)) /* a longer header (num_buffers): zeros after ours */
		iov[cnt++] = (struct iovec){ .iov_base = (void *)plain_hdr,
					     .iov_len = d->hdr - sizeof(*h) };
	iov[cnt++] = (struct iovec){ .iov_base = (void *)w->pkt, .iov_len = w->len };
	return cnt;
}

/* A queued write is done with (written or dropped): a lent frame goes back to the stack. */
static void write_done(const struct wback *w)
{
	if (w->pkt)
		w->release(w->arg, false);
}

/* Write w with writev() (without the ring, or a write the ring did not make). */
static void write_plain(struct driver *d, const struct wback *w)
{
	struct iovec iov[3];
	int cnt = frame_iov(d, w, &w->h, iov); /* writev() is done with it when it returns */

	if (send_frame(d, w->fd >= 0 ? w->fd : d->fd, iov, cnt, w->len, w->gso) == 0 && w->rewrite)
		ctr_inc(&d->ctr.rewrites);
	write_done(w);
}

/* Write back the frame in slot: [header as read, or zeroed when plain][len bytes of packet];
 * now, or with the ring at the head of its next round. */
static void write_back(struct driver *d, unsigned slot, size_t len, bool plain, bool gso)
{
	struct wback w = { .fd = d->write_to, .slot = (uint8_t)slot, .gso = gso && !plain,
			   .rewrite = !plain, .len = (uint32_t)len };

	if (plain && d->hdr)
		memset(slot_frame(d, slot), 0, d->hdr);
	if (!d->ring) {
		write_plain(d, &w);
		return;
	}
	assert(d->nwq < WQ_MAX);
	d->wq[d->nwq++] = w;
}

/* ---- the header ----------------------------------------------------------------------------- */

/* A GSO read the kernel flagged DATA_VALID instead of NEEDS_CSUM (a forwarded LRO packet whose
 * checksum the NIC verified): make it partial — the field becomes the pseudo-header sum over
 * the whole L4 length — so the one in-place rewrite path applies and the kernel completes
 * every segment's checksum on the way out. The header in frame is updated to match. */
static bool data_valid_to_partial(uint8_t *frame, uint8_t *pkt, size_t len, struct pkt_meta *m)
{
	struct vnet_hdr h;
	struct pkt_view v;
	uint64_t sum;
	uint16_t off;

	if (pkt_parse(&v, pkt, len) != PKT_OK ||
	    (v.proto != IPPROTO_TCP && v.proto != IPPROTO_UDP))
		return false;
	off = v.proto == IPPROTO_TCP ? TCP_OFF_CSUM : UDP_OFF_CSUM;
	sum = v.family == 4 ? csum_pseudo4(pkt_src(&v), pkt_dst(&v), v.proto, v.l4_len)
			    : csum_pseudo6(pkt_src(&v), pkt_dst(&v), v.proto, v.l4_len);
	csum_store16(v.l4 + off, csum_fold(sum));
	m->flags = PKT_META_NEEDS_CSUM;
	m->csum_start = v.l3_len;
	m->csum_offset = off;
	memcpy(&h, frame, sizeof(h));
	h.flags = PKT_META_NEEDS_CSUM;
	h.csum_start = htole16(m->csum_start);
	h.csum_offset = htole16(m->csum_offset);
	memcpy(frame, &h, sizeof(h));
	return true;
}

/* Validate the header read in front of a packet and fill meta. false: drop it. */
static bool read_hdr(const uint8_t *raw, struct pkt_meta *m)
{
	struct vnet_hdr h;
	uint8_t type;

	memcpy(&h, raw, sizeof(h));
	m->flags = h.flags;
	m->gso_type = h.gso_type;
	m->hdr_len = le16toh(h.hdr_len);
	m->gso_size = le16toh(h.gso_size);
	m->csum_start = le16toh(h.csum_start);
	m->csum_offset = le16toh(h.csum_offset);
	if (h.flags & ~(PKT_META_NEEDS_CSUM | PKT_META_DATA_VALID))
		return false;
	type = h.gso_type & (uint8_t)~VNET_GSO_ECN;
	switch (type) {
	case PKT_GSO_NONE:
		return !(h.gso_type & VNET_GSO_ECN);
	case PKT_GSO_TCPV4:
	case PKT_GSO_TCPV6:
	case PKT_GSO_UDP_L4:
		/* GSO comes with a partial checksum, or (forwarded LRO) a verified one: see
		 * data_valid_to_partial. */
		return m->gso_size != 0 && h.flags != 0;
	default:
		return false;
	}
}

/* ---- UDP super-datagrams -------------------------------------------------------------------- */

int driver_udp_split(uint8_t *pkt, size_t len, uint16_t l3_len, uint16_t gso_size,
		     void (*fn)(void *arg, const uint8_t *dgram, size_t dlen), void *arg)
{
	uint8_t hdr[DRIVER_SPLIT_HDR_MAX];
	size_t hl = (size_t)l3_len + 8, payload, off;
	int n = 0;

	if (hl > sizeof(hdr) || len < hl || gso_size == 0 || len < 1 ||
	    l3_len < ((pkt[0] >> 4) == 4 ? 20 : 40))
		return -EINVAL;
	payload = len - hl;
	/* Bounded work per read: the kernel never makes more than UDP_MAX_SEGMENTS. */
	if (payload == 0 || (payload + gso_size - 1) / gso_size > UDP_MAX_SEGMENTS)
		return -EINVAL;
	memcpy(hdr, pkt, hl); /* the original headers: the copies below overwrite them */
	for (off = 0; off < payload; off += gso_size) {
		size_t seg = payload - off < gso_size ? payload - off : gso_size;
		uint8_t *d = pkt + hl + off - hl; /* headers go right in front of the payload */
		uint8_t *udp = d + l3_len;

		/* The previous datagram (already handed over) is overwritten; the payload of this
		 * one starts at d + hl and is untouched. */
		memmove(d, hdr, hl);
		if ((d[0] >> 4) == 4) {
			pkt_put16(d + 2, (uint16_t)(hl + seg));
			csum_store16(d + 10, 0);
			csum_store16(d + 10, csum_buf(d, l3_len));
			csum_store16(udp + UDP_OFF_CSUM, 0); /* RFC 768: no checksum */
		} else {
			pkt_put16(d + 4, (uint16_t)(hl - 40 + seg));
		}
		pkt_put16(udp + UDP_OFF_LEN, (uint16_t)(8 + seg));
		fn(arg, d, hl + seg);
		n++;
	}
	return n;
}

struct split_ctx {
	struct driver *d;
	int64_t now;
	uint8_t *pkt;       /* the super-datagram: its datagrams are carved in place */
	struct pkt_view v;  /* the stack's view of it; moved onto each datagram */
};

/* A split datagram keeps the super-datagram's headers (same addresses, ports, IPv6 extension
 * headers, so the same l3_len): its view is the stack's, moved to where the headers now are
 * and with the lengths split wrote. */
static void split_one(void *arg, const uint8_t *dgram, size_t dlen)
{
	struct split_ctx *c = arg;
	struct pkt_view v = c->v;

	v.ip = c->pkt + (dgram - c->pkt); /* dgram lies inside c->pkt, which is ours to write */
	v.l4 = v.ip + v.l3_len;
	v.len = (uint32_t)dlen;
	v.l4_len = (uint32_t)dlen - v.l3_len;
	c->d->ops->udp(c->d->arg, dgram, dlen, &v, c->now);
}

static void to_udp(struct driver *d, uint8_t *pkt, size_t len, const struct pkt_view *v,
		   const struct pkt_meta *m, int64_t now)
{
	struct split_ctx c;
	int n;

	if (!d->ops->udp) {
		ctr_inc(&d->ctr.udp_no_path);
		return;
	}
	assert(v->ip == pkt && v->proto == IPPROTO_UDP);
	if ((m->gso_type & (uint8_t)~VNET_GSO_ECN) != PKT_GSO_UDP_L4) {
		d->ops->udp(d->arg, pkt, len, v, now);
		return;
	}
	/* The header length comes from the stack's view: no second parse. A view that is not
	 * this packet's (a stack breaking the input contract) is refused, not followed. */
	c = (struct split_ctx){ .d = d, .now = now, .pkt = pkt, .v = *v };
	if (v->ip != pkt || v->proto != IPPROTO_UDP ||
	    (n = driver_udp_split(pkt, v->len, v->l3_len, m->gso_size, split_one, &c)) < 0) {
		ctr_inc(&d->ctr.udp_split_bad);
		return;
	}
	ctr_inc(&d->ctr.udp_split);
	ctr_add(&d->ctr.udp_split_datagrams, (uint64_t)n);
}

/* ---- the read path -------------------------------------------------------------------------- */

/* The packet of len bytes read into slot. */
static void handle(struct driver *d, unsigned slot, size_t len, int64_t now)
{
	struct pkt_meta meta = { 0 };
	uint8_t *frame = slot_frame(d, slot);
	uint8_t *pkt = frame + d->hdr;
	struct pkt_view view;
	enum driver_verdict verdict;
	size_t out_len = 0;
	bool plain = false;

	if (d->hdr) {
		if (!read_hdr(frame, &meta)) {
			ctr_inc(&d->ctr.rx_bad_vnet_hdr);
			return;
		}
		if (meta.gso_type != PKT_GSO_NONE && !(meta.flags & PKT_META_NEEDS_CSUM)) {
			if (!data_valid_to_partial(frame, pkt, len, &meta)) {
				ctr_inc(&d->ctr.rx_bad_vnet_hdr);
				return;
			}
			ctr_inc(&d->ctr.rx_gso_data_valid);
		}
		if (meta.flags & PKT_META_NEEDS_CSUM)
			ctr_inc(&d->ctr.rx_needs_csum);
		if (meta.gso_type != PKT_GSO_NONE) {
			ctr_inc(&d->ctr.rx_gso);
			ctr_add(&d->ctr.rx_gso_bytes, len);
		}
	}
	d->in_buf = d->slot[slot];
	d->in_slot = slot;
	d->write_to = -1;
	verdict = d->ops->input(d->arg, pkt, len, &meta, now, &out_len, &plain, &view);
	if (!d->in_buf && verdict != DRIVER_DONE) {
		/* Taken (driver_rx_take): the packet is the stack's now; nothing else may use it. */
		assert(!"a taken packet cannot be written back or passed on");
		verdict = DRIVER_DONE;
	}
	d->in_buf = NULL;
	switch (verdict) {
	case DRIVER_WRITE:
		write_back(d, slot, out_len, plain, meta.gso_type != PKT_GSO_NONE);
		d->write_to = -1;
		break;
	case DRIVER_UDP:
		to_udp(d, pkt, len, &view, &meta, now);
		break;
	case DRIVER_DONE:
		break;
	}
}

/* Read errors that mean the TUN device no longer exists (the kernel detached the queue). */
static bool device_gone(int err)
{
	return err == EBADFD || err == ENODEV || err == ENXIO || err == EIO;
}

static void stop_reading(struct driver *d, int err)
{
	if (d->gone)
		return;
	d->gone = true;
	ctr_inc(&d->ctr.rx_gone);
	if (d->ev)
		event_del(d->ev);
	if (d->ops->gone)
		d->ops->gone(d->arg, err);
}

/* ---- read buffers ---------------------------------------------------------------------------- */

/* The read buffers' allocator, shared by the driver and the holders of the buffers it gave away
 * (driver_rx_take), and freed by whichever lets go last. A buffer given back is kept for the
 * next take, while the driver lives, its budget is at its normal tier and fewer than
 * RXPOOL_KEEP (and an eighth of the budget's buffer bytes) are kept: given straight back to
 * glibc, a 64 KiB block per frame hands its pages back (the heap's free top passes the trim
 * threshold) only for the next read to fault them in again. A kept buffer is not in use and is
 * charged to nothing. The kept ones are freed when no buffer was taken for RXPOOL_UNUSED_NS
 * (traffic that takes none, a download after an upload, would otherwise leave them idle for as
 * long as it lasts) and by driver_release_idle. */
#define RXPOOL_KEEP 64u
#define RXPOOL_UNUSED_NS (1000 * 1000000LL)

struct rxpool {
	struct budget *budget;       /* NULL: plain malloc (tests) */
	size_t size;                 /* one buffer, struct driver_rxbuf included */
	struct driver_rxbuf *kept;   /* linked through their holder room */
	unsigned nkept;
	unsigned keep;               /* at most this many kept */
	unsigned refs;               /* the driver, and each buffer not kept */
	bool driver_gone;
	int64_t taken_ns;            /* the driver's clock at the last take */
};

static struct driver_rxbuf **kept_next(struct driver_rxbuf *b)
{
	return (struct driver_rxbuf **)(void *)b->user.bytes;
}

static void rxpool_unref(struct rxpool *pool)
{
	if (--pool->refs == 0)
		free(pool);
}

static void rxpool_trim(struct rxpool *pool)
{
	while (pool->kept) {
		struct driver_rxbuf *b = pool->kept;

		pool->kept = *kept_next(b);
		free(b);
	}
	pool->nkept = 0;
}

static void rxbuf_free(struct driver_rxbuf *b)
{
	struct rxpool *pool = b->ctx;

	if (pool->budget)
		budget_bytes_release(pool->budget, pool->size);
	if (!pool->driver_gone && pool->nkept < pool->keep &&
	    (!pool->budget || budget_get_tier(pool->budget) == BUDGET_NORMAL)) {
		*kept_next(b) = pool->kept;
		pool->kept = b;
		pool->nkept++;
	} else {
		free(b);
	}
	rxpool_unref(pool);
}

/* A read buffer, charged to the budget. NULL: refused (counted by the budget) or no memory. */
static struct driver_rxbuf *rxbuf_new(struct rxpool *pool)
{
	struct driver_rxbuf *b;

	if (pool->budget && budget_bytes_reserve(pool->budget, pool->size) != 0)
		return NULL;
	if ((b = pool->kept)) {
		pool->kept = *kept_next(b);
		pool->nkept--;
	} else if (!(b = malloc(pool->size))) {
		if (pool->budget)
			budget_bytes_release(pool->budget, pool->size);
		return NULL;
	}
	b->free = rxbuf_free;
	b->ctx = pool;
	pool->refs++;
	return b;
}

size_t driver_release_idle(struct driver *d)
{
	size_t n = 0;

	rxpool_trim(d->pool); /* kept buffers are under no read */
	if (d->ring_stuck)
		return 0;
	for (unsigned i = 0; i < d->nslots; i++)
		n += rss_pages_release(slot_frame(d, i), d->buf_size);
	return n;
}

unsigned driver_rx_kept(const struct driver *d)
{
	return d->pool->nkept;
}

struct driver_rxbuf *driver_rx_take(void *driver, const uint8_t *pkt)
{
	struct driver *d = driver;
	struct driver_rxbuf *old = d->in_buf, *fresh;

	/* After a lost round the slots are the kernel's for good (ring_lost): none is given. */
	if (!old || pkt != old->frame + d->hdr || d->ring_stuck || !(fresh = rxbuf_new(d->pool)))
		return NULL;
	d->slot[d->in_slot] = fresh;
	d->in_buf = NULL;
	d->pool->taken_ns = d->now_ns;
	ctr_inc(&d->ctr.rx_taken);
	return old;
}

enum read_result { READ_PACKET, READ_EMPTY, READ_SKIPPED, READ_ERROR };

/* One read() into slot 0, its packet handled. READ_EMPTY: EAGAIN; READ_SKIPPED: an empty or
 * bad read (counted); READ_ERROR: any other error (counted; the device may be gone). */
static enum read_result read_one(struct driver *d, int64_t now)
{
	ssize_t n;

	do
		n = read(d->fd, slot_frame(d, 0), d->buf_size);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN)
			return READ_EMPTY;
		ctr_inc(&d->ctr.rx_errors);
		if (device_gone(errno))
			stop_reading(d, -errno);
		return READ_ERROR;
	}
	if ((size_t)n <= d->hdr) { /* nothing, or a header and nothing else */
		ctr_inc(d->hdr ? &d->ctr.rx_bad_vnet_hdr : &d->ctr.rx_errors);
		return READ_SKIPPED;
	}
	ctr_inc(&d->ctr.rx_packets);
	ctr_add(&d->ctr.rx_bytes, (uint64_t)n - d->hdr);
	handle(d, 0, (size_t)n - d->hdr, now);
	return READ_PACKET;
}

/* read() and write() per packet: up to max reads, until the device is empty or fails. Returns
 * the reads made that were not EAGAIN or an error. */
static int poll_plain(struct driver *d, int64_t now, int max)
{
	int i;

	for (i = 0; i < max; i++) {
		enum read_result r = read_one(d, now);

		if (r == READ_EMPTY || r == READ_ERROR)
			break;
	}
	return i;
}

/* ---- batched I/O: the ring ------------------------------------------------------------------ */

/* The driver stops using its ring (counted in why); returns it. */
static struct uring *ring_detach(struct driver *d, ctr_t *why)
{
	struct uring *u = d->ring;

	d->ring = NULL;
	__atomic_store_n(&d->uring_on, false, __ATOMIC_RELAXED);
	ctr_inc(why);
	return u;
}

/* The ring is given up for good (why: the counter of the reason, named to the owner): what is
 * queued is written with writev(), and the queue reads and writes with system calls from now
 * on. */
static void ring_off(struct driver *d, ctr_t *why, const char *name)
{
	struct uring *u;
	unsigned nw;

	if (!d->ring)
		return;
	u = ring_detach(d, why);
	nw = d->nwq;
	d->nwq = 0;
	d->nlent = 0;
	for (unsigned i = 0; i < nw; i++)
		write_plain(d, &d->wq[i]);
	uring_free(u);
	if (d->ops->uring_off)
		d->ops->uring_off(d->arg, name);
}

/* An operation of the ring never completed, nor could it be cancelled: the kernel may still
 * write into its buffer, or read from it. The slots, the ring and the round's headers are
 * never reused nor freed, and the driver stops reading, as for a device that went away
 * (-ENOTRECOVERABLE to the owner). The slots' charge stays with the budget as abandoned
 * (counted in uring_lost_bytes), so the budget can still be freed. The round's writes wq[0..nw)
 * are lost (counted as drops); each frame lent for them goes back as lost (counted in
 * uring_lost_lent): its owner keeps the memory allocated for good, and abandons its charge,
 * rather than reuse it under a write the kernel may still be reading. */
static void ring_lost(struct driver *d, const struct wback *wq, unsigned nw)
{
	assert(d->nwq == 0); /* the round took every queued write */
	lsan_leave_allocated(ring_detach(d, &d->ctr.uring_enter_failed));
	d->ring_stuck = true;
	lsan_leave_allocated(d->round_hdr);
	d->round_hdr = NULL; /* driver_free leaves it */
	for (unsigned i = 0; i < d->nslots; i++) {
		lsan_leave_allocated(d->slot[i]);
		if (d->pool->budget)
			budget_bytes_abandon(d->pool->budget, d->pool->size);
	}
	ctr_add(&d->ctr.uring_lost_bytes, (uint64_t)d->nslots * d->pool->size);
	ctr_add(&d->ctr.tx_dropped, nw);
	for (unsigned i = 0; i < nw; i++) {
		if (!wq[i].pkt)
			continue;
		ctr_inc(&d->ctr.uring_lost_lent);
		wq[i].release(wq[i].arg, true);
	}
	stop_reading(d, -ENOTRECOVERABLE);
}

/* The result r of queued write w. EAGAIN (no room) is a drop, as for writev(). */
static void wrote(struct driver *d, const struct wback *w, int32_t r)
{
	bool ok = r >= 0 && (size_t)r == d->hdr + w->len;

	tx_counted(d, ok, w->len, w->gso);
	if (ok && w->rewrite)
		ctr_inc(&d->ctr.rewrites);
	write_done(w);
}

/* One round: the queued writes, then reads into slots 0..reads-1, in one io_uring_enter.
 * Each operation completes before the next is issued (RWF_NOWAIT, core/uring.h), so the read
 * into a slot follows the write out of it. res gets the reads' results (res[i] for slot i),
 * also when the ring failed: a read that ran took a packet out of the device. Returns 0, or
 * -1 when the ring is off now (then the caller goes on with system calls). */
static int ring_round(struct driver *d, unsigned reads, int32_t *res)
{
	int32_t all[URING_MAX_OPS];
	struct iovec iov[3 * WQ_MAX];
	struct wback wq[WQ_MAX];
	unsigned nw = d->nwq, k = 0;
	bool refused = false;
	int r;

	memcpy(wq, d->wq, nw * sizeof(wq[0]));
	d->nwq = 0;
	d->nlent = 0;
	/* The headers the kernel reads live in round_hdr, not in wq on this stack: after a lost
	 * round it may read them at any time (the iovecs themselves it has copied when it took
	 * the round: IORING_FEAT_SUBMIT_STABLE, which every kernel since 5.5 has). */
	for (unsigned i = 0; i < nw; i++) {
		int cnt;

		d->round_hdr[i] = wq[i].h;
		cnt = frame_iov(d, &wq[i], &d->round_hdr[i], &iov[k]);

		(void)uring_writev(d->ring, wq[i].fd >= 0 ? wq[i].fd : d->fd, &iov[k], cnt);
		k += (unsigned)cnt;
	}
	for (unsigned i = 0; i < reads; i++)
		(void)uring_read(d->ring, d->fd, slot_frame(d, i), d->buf_size);
	ctr_inc(&d->ctr.uring_enters);
	r = uring_run(d->ring, all);
	if (r == -ETIMEDOUT) {
		ring_lost(d, wq, nw);
		return -1;
	}
	for (unsigned i = 0; i < nw; i++) {
		const struct wback *w = &wq[i];

		/* Not written by the ring: EOPNOTSUPP (a device without non-blocking writes from
		 * it) or ECANCELED (never taken, or cancelled). It goes again with writev(), unless
		 * the read of this round into its slot already replaced its bytes: then it is a
		 * drop (TCP resends it), once, as the ring is given up. A lent frame is the
		 * stack's memory, never read into. */
		if (all[i] == -EOPNOTSUPP || all[i] == -ECANCELED) {
			refused |= all[i] == -EOPNOTSUPP;
			if (!w->pkt && w->slot < reads && all[nw + w->slot] > 0)
				ctr_inc(&d->ctr.tx_dropped);
			else
				write_plain(d, w);
			continue;
		}
		wrote(d, w, all[i]);
	}
	if (reads)
		memcpy(res, all + nw, reads * sizeof(res[0]));
	if (refused)
		ring_off(d, &d->ctr.uring_write_refused, "the device refused its writes");
	else if (r < 0)
		ring_off(d, &d->ctr.uring_enter_failed, "io_uring_enter failed");
	return d->ring ? 0 : -1;
}

/* Write what is queued now (a packet the stack writes itself must not overtake them). */
static void flush_writes(struct driver *d)
{
	if (d->ring && d->nwq) {
		ctr_inc(&d->ctr.uring_flushes);
		ctr_add(&d->ctr.uring_flush_writes, d->nwq);
		(void)ring_round(d, 0, NULL);
	}
}

void driver_write_to(struct driver *d, int fd)
{
	assert(d->in_buf);
	d->write_to = fd == d->fd ? -1 : fd;
}

void driver_tx_flush(void *driver)
{
	flush_writes(driver);
}

int driver_tx_lend(void *driver, const uint8_t *pkt, size_t len, const struct pkt_meta *m,
		   void (*release)(void *arg, bool lost), void *arg)
{
	struct driver *d = driver;
	struct wback *w;
	int r;

	if (d->ring && d->hdr && d->nlent == DRIVER_LEND_MAX)
		flush_writes(d);
	if (!d->ring || !d->hdr) { /* no ring (or that round gave it up), or no header */
		r = driver_tx_meta(d, pkt, len, m);
		release(arg, false);
		return r;
	}
	ctr_inc(&d->ctr.tx_lent);
	w = &d->wq[d->nwq++];
	d->nlent++;
	*w = (struct wback){
		.fd = -1,
		.pkt = pkt,
		.release = release,
		.arg = arg,
		.h = vnet_of(m),
		.gso = m->gso_type != PKT_GSO_NONE,
		.len = (uint32_t)len,
	};
	return 0;
}

/* What the reads of a round found. */
struct round_seen {
	int got;          /* reads that returned a frame (a bad one too, as poll_plain counts) */
	unsigned empty;   /* reads that found the device empty (EAGAIN, or never run) */
	unsigned refused; /* reads the ring could not make at all (EOPNOTSUPP) */
	size_t largest;   /* the longest read */
};

/* The reads' results of a round, in slot order (the device's order). */
static void ring_results(struct driver *d, const int32_t *res, unsigned reads, int64_t now,
			 struct round_seen *rs)
{
	for (unsigned i = 0; i < reads; i++) {
		int32_t n = res[i];

		if (n == -EAGAIN || n == -ECANCELED) {
			rs->empty++;
			continue;
		}
		if (n == -EOPNOTSUPP) {
			rs->refused++;
			continue;
		}
		if (n < 0) {
			if (d->gone) /* counted once, by the read that found it gone */
				continue;
			ctr_inc(&d->ctr.rx_errors);
			if (device_gone(-n))
				stop_reading(d, n);
			continue;
		}
		rs->got++;
		if ((size_t)n <= d->hdr) {
			ctr_inc(d->hdr ? &d->ctr.rx_bad_vnet_hdr : &d->ctr.rx_errors);
			continue;
		}
		ctr_inc(&d->ctr.rx_packets);
		ctr_add(&d->ctr.rx_bytes, (uint64_t)n - d->hdr);
		if ((size_t)n > rs->largest)
			rs->largest = (size_t)n;
		handle(d, i, (size_t)n - d->hdr, now);
	}
}

/* The reads of the next round: twice as many after a round that filled them all, one more
 * than it found otherwise, and at most DRIVER_URING_BIG_READS after a super-packet (a 64 KiB
 * read amortises its own system call, and fewer slots get touched). */
static void adapt_reads(struct driver *d, unsigned reads, const struct round_seen *rs)
{
	if (reads == 0)
		return;
	if (rs->got == (int)reads && reads == d->reads)
		d->reads = reads * 2;
	else
		d->reads = (unsigned)rs->got + 1;
	if (d->reads < DRIVER_URING_MIN_READS)
		d->reads = DRIVER_URING_MIN_READS;
	if (rs->largest > DRIVER_URING_BIG && d->reads > DRIVER_URING_BIG_READS)
		d->reads = DRIVER_URING_BIG_READS;
	if (d->reads > d->nslots)
		d->reads = d->nslots;
}

/* Rounds until the device is empty and nothing waits to be written, or DRIVER_BATCH packets.
 * The first round of a readiness edge that reads nothing is checked with one read(): a ring
 * that cannot read this device (a kernel whose TUN lacks non-blocking reads from the ring)
 * would otherwise leave the fd readable and the loop spinning. */
static int poll_ring(struct driver *d, int64_t now)
{
	int32_t res[DRIVER_URING_SLOTS];
	int total = 0;
	bool first = true;

	while (d->ring) {
		unsigned reads = d->gone ? 0 : (unsigned)(DRIVER_BATCH - total);
		struct round_seen rs = { 0 };
		bool failed;

		if (reads > d->reads)
			reads = d->reads;
		if (reads == 0 && d->nwq == 0)
			break;
		failed = ring_round(d, reads, res) != 0;
		if (d->ring_stuck)
			break;
		/* A failed round may still have read: those packets are kept. */
		ring_results(d, res, reads, now, &rs);
		total += rs.got;
		if (failed)
			break;
		ctr_add(&d->ctr.uring_reads_empty, rs.empty);
		adapt_reads(d, reads, &rs);
		if (rs.got > 0)
			d->ring_misses = 0;
		if (rs.refused && rs.got == 0) {
			ring_off(d, &d->ctr.uring_read_refused, "the device refused its reads");
			break;
		}
		if (first && rs.got == 0 && reads > 0 && !d->gone) {
			/* Woken, yet the ring found nothing: does read()? Twice in a row, and the
			 * ring cannot read this device (a kernel whose TUN lacks non-blocking reads
			 * from it): without the check the fd would stay readable and the loop spin.
			 * Once may be a packet that came between the two looks. */
			if (read_one(d, now) == READ_PACKET) {
				total++;
				if (++d->ring_misses >= 2)
					ring_off(d, &d->ctr.uring_read_refused,
						 "the device's packets reach read() only");
			}
			break;
		}
		first = false;
		/* A read found the device empty: another round only for what waits to be
		 * written (its reads may catch packets that came meanwhile). */
		if ((rs.got == 0 || rs.empty > 0) && d->nwq == 0)
			break;
	}
	/* A write-back left by the read() that checked the ring goes now, not with the next
	 * edge, which may never come. */
	if (d->ring && d->nwq)
		(void)ring_round(d, 0, NULL);
	/* Without the ring now (given up above): the rest of the batch the plain way. */
	if (!d->ring && !d->ring_stuck && !d->gone && total < DRIVER_BATCH)
		total += poll_plain(d, now, DRIVER_BATCH - total);
	return total;
}

int driver_poll(struct driver *d)
{
	int64_t now = ts_now_ns();
	int i;

	d->now_ns = now;
	i = d->ring ? poll_ring(d, now) : poll_plain(d, now, DRIVER_BATCH);
	if (d->pool->nkept && now - d->pool->taken_ns > RXPOOL_UNUSED_NS)
		rxpool_trim(d->pool);

	if (d->ops->batch_end)
		d->ops->batch_end(d->arg, now);
	return i;
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	driver_poll(arg);
}

/* The slots go back to the pool (kept or freed, as any buffer given back). */
static void free_slots(struct driver *d)
{
	for (unsigned i = 0; i < d->nslots; i++)
		d->slot[i]->free(d->slot[i]);
	d->nslots = 0;
}

/* n read buffers, from the budget when there is one; all or none. */
static bool alloc_slots(struct driver *d, unsigned n)
{
	for (d->nslots = 0; d->nslots < n; d->nslots++) {
		if (!(d->slot[d->nslots] = rxbuf_new(d->pool))) {
			free_slots(d);
			rxpool_trim(d->pool); /* none kept: the caller may ask for fewer */
			return false;
		}
	}
	return true;
}

int driver_new(struct event_base *base, const struct driver_params *p,
	       const struct driver_ops *ops, void *arg, struct budget *b, struct driver **out)
{
	size_t hdr = p && p->vnet_hdr ? (p->vnet_hdr_len ? p->vnet_hdr_len : TUN_VNET_HDR_LEN) : 0;
	struct driver *d;

	if (!p || p->fd < 0 || p->mtu < DRIVER_INPUT_ROOM || !ops || !ops->input ||
	    (hdr && (hdr < TUN_VNET_HDR_LEN || hdr > TUN_VNET_HDR_MAX)))
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base = base;
	d->fd = p->fd;
	d->write_to = -1;
	d->ops = ops;
	d->arg = arg;
	d->hdr = hdr;
	d->buf_size = p->vnet_hdr ? hdr + DRIVER_GSO_MAX : p->mtu;
	if (!(d->pool = calloc(1, sizeof(*d->pool))))
		goto fail;
	*d->pool = (struct rxpool){ .budget = b, .size = sizeof(struct driver_rxbuf) + d->buf_size,
				    .keep = RXPOOL_KEEP, .refs = 1 };
	if (b) {
		uint64_t fit = budget_get_limits(b)->buffer_bytes / 8 / d->pool->size;

		if (fit < RXPOOL_KEEP)
			d->pool->keep = (unsigned)fit;
	}
	if (p->uring && (d->uring_err = uring_new(&d->ring)) != 0)
		d->ring = NULL;
	if (d->ring && !(d->round_hdr = calloc(WQ_MAX, sizeof(*d->round_hdr))))
		goto fail;
	if (!alloc_slots(d, d->ring ? hdr ? DRIVER_URING_SLOTS_OFFLOAD : DRIVER_URING_SLOTS : 1) &&
	    d->ring) {
		/* No room for the ring's buffers: one buffer, system calls. */
		uring_free(d->ring);
		d->ring = NULL;
		free(d->round_hdr);
		d->round_hdr = NULL;
		d->uring_err = -ENOBUFS;
		(void)alloc_slots(d, 1);
	}
	if (!d->nslots)
		goto fail;
	d->reads = DRIVER_URING_FIRST_READS < d->nslots ? DRIVER_URING_FIRST_READS : d->nslots;
	d->uring_on = d->ring != NULL;
	memset(slot_frame(d, 0), 0, d->buf_size); /* pre-fault: memory figures do not jump under load */
	d->ev = event_new(base, p->fd, EV_READ | EV_PERSIST, on_readable, d);
	if (!d->ev || event_add(d->ev, NULL) != 0)
		goto fail;
	*out = d;
	return 0;
fail:
	driver_free(d);
	return -ENOMEM;
}

/* The driver lets go of its pool: what comes back from now on is freed, and the pool goes with
 * the last buffer. */
static void pool_leave(struct driver *d)
{
	if (!d->pool)
		return;
	d->pool->driver_gone = true;
	rxpool_trim(d->pool);
	rxpool_unref(d->pool);
}

void driver_free(struct driver *d)
{
	if (!d)
		return;
	if (d->ev)
		event_free(d->ev);
	d->ev = NULL;
	if (!d->ring_stuck)
		flush_writes(d);
	if (d->ring_stuck) {
		/* The kernel may still write into the slots and read the round's headers: they
		 * and the ring stay (each slot holds the pool, which outlives the driver), the
		 * slots' charge abandoned (ring_lost). */
		pool_leave(d);
		free(d);
		return;
	}
	uring_free(d->ring);
	free(d->round_hdr);
	free_slots(d); /* kept, then freed with the rest as the driver leaves */
	pool_leave(d);
	free(d);
}

int driver_uring_err(const struct driver *d)
{
	return d->uring_err;
}

bool driver_uring(const struct driver *d)
{
	return __atomic_load_n(&d->uring_on, __ATOMIC_RELAXED);
}

const struct driver_counters *driver_get_counters(const struct driver *d)
{
	return &d->ctr;
}

void driver_counters_accumulate(struct driver_counters *acc, const struct driver_counters *c)
{
#define DRIVER_CTR_ACC(name) ctr_set(&acc->name, ctr_get(&acc->name) + ctr_get(&c->name));
	DRIVER_COUNTERS(DRIVER_CTR_ACC)
#undef DRIVER_CTR_ACC
}

void driver_counters_foreach(const struct driver_counters *c,
			     void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
#define DRIVER_CTR_VISIT(name) fn(arg, #name, ctr_get(&c->name));
	DRIVER_COUNTERS(DRIVER_CTR_VISIT)
#undef DRIVER_CTR_VISIT
}
