/* driver.c — per-packet TUN driver on a libevent loop (offload batching arrives later behind
 * the same interface). Reads up to DRIVER_BATCH packets per readiness edge, reads the clock once
 * per batch, and acts on each verdict in the same pass: no queue between read and write-back. */
#include "core/driver.h"

#include <errno.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"

struct driver {
	struct event_base *base;
	struct event *ev;
	int fd;
	const struct driver_ops *ops;
	void *arg;
	struct budget *budget;
	uint8_t *buf;
	size_t buf_size;
	struct driver_counters ctr;
};

int driver_tx(void *driver, const uint8_t *pkt, size_t len)
{
	struct driver *d = driver;
	ssize_t n;

	do
		n = write(d->fd, pkt, len);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		/* EAGAIN: the device queue is full. Dropping is what a router does; TCP above
		 * retransmits, and blocking here would stall every flow. */
		ctr_inc(&d->ctr.tx_dropped);
		return -errno;
	}
	ctr_inc(&d->ctr.tx_packets);
	ctr_add(&d->ctr.tx_bytes, len);
	return 0;
}

static void handle(struct driver *d, size_t len, int64_t now)
{
	static const struct pkt_meta plain_meta; /* per-packet I/O: no offload state */
	size_t out_len = 0;
	bool plain = false;

	switch (d->ops->input(d->arg, d->buf, len, &plain_meta, now, &out_len, &plain)) {
	case DRIVER_WRITE:
		if (driver_tx(d, d->buf, out_len) == 0 && !plain)
			ctr_inc(&d->ctr.rewrites);
		break;
	case DRIVER_UDP:
		if (d->ops->udp)
			d->ops->udp(d->arg, d->buf, len, now);
		else
			ctr_inc(&d->ctr.udp_no_path);
		break;
	case DRIVER_DONE:
		break;
	}
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct driver *d = arg;
	int64_t now = ts_now_ns();

	(void)what;
	for (int i = 0; i < DRIVER_BATCH; i++) {
		ssize_t n = read(fd, d->buf, d->buf_size);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				ctr_inc(&d->ctr.rx_errors);
			break;
		}
		ctr_inc(&d->ctr.rx_packets);
		ctr_add(&d->ctr.rx_bytes, (uint64_t)n);
		handle(d, (size_t)n, now);
	}
	if (d->ops->batch_end)
		d->ops->batch_end(d->arg, now);
}

int driver_new(struct event_base *base, int fd, uint32_t mtu, const struct driver_ops *ops,
	       void *arg, struct budget *b, struct driver **out)
{
	struct driver *d;

	if (fd < 0 || mtu < 576 || !ops || !ops->input)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base = base;
	d->fd = fd;
	d->ops = ops;
	d->arg = arg;
	d->budget = b;
	d->buf_size = mtu;
	d->buf = b ? budget_malloc(b, d->buf_size) : malloc(d->buf_size);
	if (!d->buf)
		goto fail;
	memset(d->buf, 0, d->buf_size); /* pre-fault: memory figures do not jump under load */
	d->ev = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, d);
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

void driver_counters_foreach(const struct driver_counters *c,
			     void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
#define DRIVER_CTR_VISIT(name) fn(arg, #name, ctr_get(&c->name));
	DRIVER_COUNTERS(DRIVER_CTR_VISIT)
#undef DRIVER_CTR_VISIT
}
