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

struct driver {
	struct event_base *base;
	struct event *ev;
	int fd;
	size_t hdr;       /* virtio header bytes per frame with offload (>= 10), else 0 */
	const struct driver_ops *ops;
	void *arg;
	struct budget *budget;
	uint8_t *buf;     /* [hdr][packet] */
	size_t buf_size;
	bool gone;        /* the device went away: no more reads */
	struct driver_counters ctr;
};

/* All zero: GSO none, full checksums; as long as the longest header a device may carry. */
static const uint8_t plain_hdr[TUN_VNET_HDR_MAX];

/* The one write path: iov (header, if any, and packet; len packet bytes) as one frame. A
 * failure is a counted drop — EAGAIN means the device queue is full, and dropping is what a
 * router does: TCP above retransmits, and blocking here would stall every flow. */
static int send_frame(struct driver *d, const struct iovec *iov, int cnt, size_t len, bool gso)
{
	ssize_t n;

	do
		n = writev(d->fd, iov, cnt);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		ctr_inc(&d->ctr.tx_dropped);
		return -errno;
	}
	ctr_inc(&d->ctr.tx_packets);
	ctr_add(&d->ctr.tx_bytes, len);
	if (gso)
		ctr_inc(&d->ctr.tx_gso);
	return 0;
}

int driver_tx(void *driver, const uint8_t *pkt, size_t len)
{
	struct driver *d = driver;
	struct iovec iov[2] = {
		{ .iov_base = (void *)plain_hdr, .iov_len = d->hdr },
		{ .iov_base = (void *)pkt, .iov_len = len },
	};

	return d->hdr ? send_frame(d, iov, 2, len, false) : send_frame(d, iov + 1, 1, len, false);
}

int driver_tx_meta(void *driver, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	struct driver *d = driver;
	struct vnet_hdr h = {
		.flags = m->flags,
		.gso_type = m->gso_type,
		.hdr_len = htole16(m->hdr_len),
		.gso_size = htole16(m->gso_size),
		.csum_start = htole16(m->csum_start),
		.csum_offset = htole16(m->csum_offset),
	};
	struct iovec iov[3] = { { .iov_base = &h, .iov_len = sizeof(h) } };
	int cnt = 1;

	if (!d->hdr) /* no header to carry the metadata: only plain packets can go */
		return m->flags || m->gso_type ? -EOPNOTSUPP : driver_tx(d, pkt, len);
	/* A device with a longer header (e.g. 12 bytes with num_buffers): zeros after ours. */
	if (d->hdr > sizeof(h))
		iov[cnt++] = (struct iovec){ .iov_base = (void *)plain_hdr,
					     .iov_len = d->hdr - sizeof(h) };
	iov[cnt++] = (struct iovec){ .iov_base = (void *)pkt, .iov_len = len };
	return send_frame(d, iov, cnt, len, m->gso_type != PKT_GSO_NONE);
}

bool driver_offload(const struct driver *d)
{
	return d->hdr != 0;
}

/* Write back d->buf: [header as read, or zeroed when plain][len bytes of packet]. */
static int write_back(struct driver *d, size_t len, bool plain, bool gso)
{
	struct iovec iov = { .iov_base = d->buf, .iov_len = d->hdr + len };

	if (plain && d->hdr)
		memset(d->buf, 0, d->hdr);
	return send_frame(d, &iov, 1, len, gso && !plain);
}

/* ---- the header ----------------------------------------------------------------------------- */

/* A GSO read the kernel flagged DATA_VALID instead of NEEDS_CSUM (a forwarded LRO packet whose
 * checksum the NIC verified): make it partial — the field becomes the pseudo-header sum over
 * the whole L4 length — so the one in-place rewrite path applies and the kernel completes
 * every segment's checksum on the way out. The header in d->buf is updated to match. */
static bool data_valid_to_partial(struct driver *d, uint8_t *pkt, size_t len,
				  struct pkt_meta *m)
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
	memcpy(&h, d->buf, sizeof(h));
	h.flags = PKT_META_NEEDS_CSUM;
	h.csum_start = htole16(m->csum_start);
	h.csum_offset = htole16(m->csum_offset);
	memcpy(d->buf, &h, sizeof(h));
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

static void handle(struct driver *d, size_t len, int64_t now)
{
	struct pkt_meta meta = { 0 };
	uint8_t *pkt = d->buf + d->hdr;
	struct pkt_view view;
	size_t out_len = 0;
	bool plain = false;

	if (d->hdr) {
		if (!read_hdr(d->buf, &meta)) {
			ctr_inc(&d->ctr.rx_bad_vnet_hdr);
			return;
		}
		if (meta.gso_type != PKT_GSO_NONE && !(meta.flags & PKT_META_NEEDS_CSUM)) {
			if (!data_valid_to_partial(d, pkt, len, &meta)) {
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
	switch (d->ops->input(d->arg, pkt, len, &meta, now, &out_len, &plain, &view)) {
	case DRIVER_WRITE:
		if (write_back(d, out_len, plain, meta.gso_type != PKT_GSO_NONE) == 0 && !plain)
			ctr_inc(&d->ctr.rewrites);
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

size_t driver_release_idle(struct driver *d)
{
	return rss_pages_release(d->buf, d->buf_size);
}

int driver_poll(struct driver *d)
{
	int64_t now = ts_now_ns();
	int i;

	for (i = 0; i < DRIVER_BATCH; i++) {
		ssize_t n = read(d->fd, d->buf, d->buf_size);
		if (n < 0) {
			if (errno == EINTR) {
				i--;
				continue;
			}
			if (errno != EAGAIN)
				ctr_inc(&d->ctr.rx_errors);
			if (device_gone(errno))
				stop_reading(d, -errno);
			break;
		}
		if ((size_t)n <= d->hdr) { /* nothing, or a header and nothing else */
			ctr_inc(d->hdr ? &d->ctr.rx_bad_vnet_hdr : &d->ctr.rx_errors);
			continue;
		}
		ctr_inc(&d->ctr.rx_packets);
		ctr_add(&d->ctr.rx_bytes, (uint64_t)n - d->hdr);
		handle(d, (size_t)n - d->hdr, now);
	}
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

int driver_new(struct event_base *base, const struct driver_params *p,
	       const struct driver_ops *ops, void *arg, struct budget *b, struct driver **out)
{
	size_t hdr = p && p->vnet_hdr ? (p->vnet_hdr_len ? p->vnet_hdr_len : TUN_VNET_HDR_LEN) : 0;
	struct driver *d;

	if (!p || p->fd < 0 || p->mtu < 576 || !ops || !ops->input ||
	    (hdr && (hdr < TUN_VNET_HDR_LEN || hdr > TUN_VNET_HDR_MAX)))
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base = base;
	d->fd = p->fd;
	d->ops = ops;
	d->arg = arg;
	d->budget = b;
	d->hdr = hdr;
	d->buf_size = p->vnet_hdr ? hdr + DRIVER_GSO_MAX : p->mtu;
	d->buf = b ? budget_malloc(b, d->buf_size) : malloc(d->buf_size);
	if (!d->buf)
		goto fail;
	memset(d->buf, 0, d->buf_size); /* pre-fault: memory figures do not jump under load */
	d->ev = event_new(base, p->fd, EV_READ | EV_PERSIST, on_readable, d);
	if (!d->ev || event_add(d->ev, NULL) != 0)
		goto fail;
	*out = d;
	return 0;
fail:
	driver_free(d);
	return -ENOMEM;
}

void driver_free(struct driver *d)
{
	if (!d)
		return;
	if (d->ev)
		event_free(d->ev);
	if (d->budget)
		budget_mfree(d->budget, d->buf);
	else
		free(d->buf);
	free(d);
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
