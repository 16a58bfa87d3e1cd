/* workers.c — the proxy's TUN queues: one driver per queue, queue 0 on the main loop, every
 * other queue on a worker thread of its own; the glue the drivers call (the stack's per-packet
 * function, its batch end, the UDP path), the UDP hand-off from workers to the main loop, and
 * the pressure tier, tun.rps "auto" and memory-back ticks that ride on queue batches. */
#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/driver.h"
#include "core/rss.h"
#include "core/tun.h"
#include "dispatch/udp.h"
#include "runtime/memback.h"
#include "runtime/proxy.h"
#include "runtime/workers.h"

#define RSS_SAMPLE_NS TS_NS_PER_SEC /* pressure tier refresh, only while traffic flows */

#define UDP_HANDOFF_BATCH 64       /* datagrams the main loop takes from a worker per wakeup */
#define UDP_HANDOFF_MAX DRIVER_GSO_MAX /* largest datagram handed over */
#define UDP_HANDOFF_SNDBUF (4 << 20)   /* bytes a worker may queue for the main loop */

static enum driver_verdict drv_input(void *arg, uint8_t *buf, size_t len,
				     const struct pkt_meta *meta, int64_t now_ns, size_t *out_len,
				     bool *plain, struct pkt_view *view)
{
	struct worker *w = arg;
	struct ts_proxy *p = w->p;
	enum driver_verdict v =
		p->ops->input(p->ns, w->q, buf, len, meta, now_ns, out_len, plain, view);
	unsigned to;

	/* With one queue every write is this queue's: no call per packet to ask. */
	if (v == DRIVER_WRITE && p->nworkers > 1 && p->ops->write_queue &&
	    (to = p->ops->write_queue(p->ns, w->q)) != w->q && to < p->nworkers)
		driver_write_to(w->driver, tun_fd(p->tun, to));
	return v;
}

static void drv_batch_end(void *arg, int64_t now_ns)
{
	struct worker *w = arg;
	struct ts_proxy *p = w->p;
	const struct driver_counters *c;
	struct rss_info ri;
	uint64_t bytes;
	int64_t last;

	/* Queue 0 hands its datagrams to the UDP path (drv_udp): what the batch gathered in an
	 * uplink train leaves now, never later (udp.h). */
	if (w->q == 0)
		udp_path_batch_end(p->udp);
	p->ops->batch_end(p->ns, w->q, now_ns);
	/* tun.rps "auto" follows the main loop's thread and queue 0's bytes: "auto" is "off"
	 * with more than one queue (tun_rps_auto), so queue 0 carries all the traffic. Each
	 * queue's loop trims after its own load. */
	c = driver_get_counters(w->driver);
	bytes = ctr_get(&c->rx_bytes) + ctr_get(&c->tx_bytes);
	if (w->q == 0)
		rps_auto_tick(&p->rps, now_ns, bytes);
	memback_note(&w->memback, now_ns, bytes);
	/* The pressure tier follows RSS; sampled only while traffic flows, so an idle proxy
	 * never wakes up for it. Whichever queue sees traffic first in a second claims the
	 * sample (flows may all hash to one queue). */
	last = atomic_load_explicit(&p->rss_sampled_ns, memory_order_relaxed);
	if (now_ns - last >= RSS_SAMPLE_NS &&
	    atomic_compare_exchange_strong(&p->rss_sampled_ns, &last, now_ns) &&
	    rss_sample(&ri) == 0)
		budget_update_tier(p->budget, ri.rss_bytes);
}

/* view points into the driver's read buffer: queue 0 gives it to the UDP path right here,
 * before the driver reads again. */
static void drv_udp(void *arg, const uint8_t *pkt, size_t len, const struct pkt_view *view,
		    int64_t now_ns)
{
	struct worker *w = arg;
	ssize_t n;

	if (w->q == 0) {
		udp_path_input_view(w->p->udp, view, now_ns);
		return;
	}
	/* The UDP path lives on the main loop: hand the datagram over (the kernel copies it;
	 * a full socketpair drops it, counted, as a full device queue would). The view stays
	 * behind (its pointers are into this thread's buffer): the main loop parses the copy. */
	do
		n = send(w->udp_fds[0], pkt, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		ctr_inc(&w->udp_handoff_drops);
	else
		ctr_inc(&w->udp_handoff);
}

/* The TUN was deleted under us: stop with the reason (exit 1 for `twinstack run`). Queue 0
 * is the main loop; another queue leaves its own loop, and the main loop hears of it through
 * worker_died_fd. */
static void drv_gone(void *arg, int err)
{
	struct worker *w = arg;

	atomic_store(&w->gone_err, err);
	if (err == -ENOTRECOVERABLE)
		log_error(&w->p->log, "proxy: TUN queue %u: an io_uring operation never completed: "
			  "its reads are no longer safe; stopping", w->q);
	if (w->q == 0) {
		if (err != -ENOTRECOVERABLE)
			log_error(&w->p->log, "proxy: the TUN device is gone (read: %s); stopping",
				  strerror(-err));
		proxy_stop_loop(w->p, err);
	} else {
		event_base_loopbreak(w->base);
	}
}

static void drv_uring_off(void *arg, const char *why)
{
	struct worker *w = arg;

	log_warn(&w->p->log, "proxy: TUN queue %u: io_uring given up (%s): a system call per "
		 "packet from now on", w->q, why);
}

static const struct driver_ops drv_ops = {
	.input = drv_input,
	.batch_end = drv_batch_end,
	.udp = drv_udp,
	.gone = drv_gone,
	.uring_off = drv_uring_off,
};

/* Main loop: datagrams a worker handed over. */
static void on_udp_handoff(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	int64_t now = ts_now_ns();

	(void)what;
	for (int i = 0; i < UDP_HANDOFF_BATCH; i++) {
		ssize_t n = recv(fd, w->p->handoff_buf, UDP_HANDOFF_MAX, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		udp_path_input(w->p->udp, w->p->handoff_buf, (size_t)n, now);
	}
	udp_path_batch_end(w->p->udp);
}

/* ---- queue workers ------------------------------------------------------------------------- */

/* A queue's loop went quiet: the pages of its read buffers go back. */
static void quiet_driver(void *arg)
{
	(void)driver_release_idle(arg);
}

static void on_worker_stop(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	(void)fd;
	(void)what;
	event_base_loopbreak(w->base);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t one = 1;

	event_base_dispatch(w->base);
	/* Only a stop request ends the loop; anything else would leave the queue unread. */
	if (!atomic_load(&w->stopping) && write(w->p->worker_died_fd, &one, sizeof(one)) < 0) {
		/* the main loop's eventfd cannot be full */
	}
	return NULL;
}

/* Main loop: a worker left its loop without being asked. */
static void on_worker_died(evutil_socket_t fd, short what, void *arg)
{
	struct ts_proxy *p = arg;
	uint64_t v;

	(void)what;
	if (read(fd, &v, sizeof(v)) < 0) {
		/* spurious wakeup */
	}
	for (uint32_t q = 1; q < p->nworkers; q++) {
		int gone = atomic_load(&p->workers[q].gone_err);
		if (gone != 0) {
			log_error(&p->log, "proxy: the TUN device is gone (queue %u read: %s); "
				  "stopping", q, strerror(-gone));
			proxy_stop_loop(p, gone);
			return;
		}
	}
	log_error(&p->log, "proxy: a TUN queue worker stopped unexpectedly; stopping");
	proxy_stop_loop(p, -EIO);
}

static void worker_stop(struct worker *w)
{
	uint64_t one = 1;

	if (!w->started)
		return;
	atomic_store(&w->stopping, true);
	if (write(w->stop_fd, &one, sizeof(one)) < 0) {
		/* cannot fail for an eventfd we own short of a saturated counter */
	}
	pthread_join(w->thread, NULL);
	w->started = false;
}

static void worker_free(struct worker *w)
{
	worker_stop(w);
	if (w->udp_ev)
		event_free(w->udp_ev);
	memback_fini(&w->memback); /* after the join: the thread used it */
	driver_free(w->driver);
	if (w->stop_ev)
		event_free(w->stop_ev);
	if (w->q != 0 && w->base)
		event_base_free(w->base);
	if (w->stop_fd >= 0)
		close(w->stop_fd);
	for (int i = 0; i < 2; i++)
		if (w->udp_fds[i] >= 0)
			close(w->udp_fds[i]);
}

/* Queue q's driver (and for q > 0 its loop, stop event and UDP handoff; the thread starts
 * later, once the stack is up). */
static int worker_init(struct ts_proxy *p, uint32_t q, char *err, size_t errlen)
{
	struct worker *w = &p->workers[q];
	struct driver_params dp = {
		.fd = tun_fd(p->tun, q),
		.mtu = p->cfg.tun.mtu,
		.vnet_hdr = tun_vnet_hdr(p->tun),
		.vnet_hdr_len = tun_vnet_hdr_len(p->tun),
		.uring = p->cfg.tun.io_uring != TS_IO_URING_OFF,
	};
	int ret = -ENOMEM;

	w->p = p;
	w->q = q;
	w->stop_fd = w->udp_fds[0] = w->udp_fds[1] = -1;
	w->base = q == 0 ? p->base : event_base_new();
	if (!w->base)
		goto fail;
	if (q > 0) {
		int sndbuf = UDP_HANDOFF_SNDBUF;
		if ((w->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
		    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
			       w->udp_fds) != 0) {
			ret = -errno;
			goto fail;
		}
		/* SO_SNDBUFFORCE (we hold CAP_NET_ADMIN) is not capped by net.core.wmem_max. */
		if (setsockopt(w->udp_fds[0], SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf,
			       sizeof(sndbuf)) != 0)
			setsockopt(w->udp_fds[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		w->stop_ev = event_new(w->base, w->stop_fd, EV_READ, on_worker_stop, w);
		w->udp_ev = event_new(p->base, w->udp_fds[1], EV_READ | EV_PERSIST,
				      on_udp_handoff, w);
		if (!w->stop_ev || !w->udp_ev || event_add(w->stop_ev, NULL) != 0 ||
		    event_add(w->udp_ev, NULL) != 0)
			goto fail;
	}
	if ((ret = driver_new(w->base, &dp, &drv_ops, w, p->budget, &w->driver)) != 0)
		goto fail;
	if (memback_init(&w->memback, w->base) != 0 ||
	    memback_on_quiet(&w->memback, quiet_driver, w->driver) != 0) {
		ret = -ENOMEM;
		goto fail;
	}
	if (dp.uring && !driver_uring(w->driver)) {
		ret = driver_uring_err(w->driver);
		if (p->cfg.tun.io_uring == TS_IO_URING_ON) {
			snprintf(err, errlen, "proxy: tun.io_uring is \"on\" but no io_uring could be "
				 "set up: %s", strerror(-ret));
			return ret;
		}
		if (q == 0)
			log_info(&p->log, "proxy: TUN reads and writes one system call each: no "
				 "io_uring (%s)", strerror(-ret));
	}
	return 0;
fail:
	snprintf(err, errlen, "proxy: TUN queue %u: %s", q, strerror(-ret));
	return ret;
}

int workers_init(struct ts_proxy *p, char *err, size_t errlen)
{
	int ret;

	uint32_t n = tun_queues(p->tun);

	p->workers = calloc(n, sizeof(*p->workers));
	if (!p->workers) {
		snprintf(err, errlen, "proxy: out of memory");
		return -ENOMEM;
	}
	p->nworkers = n;
	for (uint32_t q = 0; q < n; q++)
		p->workers[q].stop_fd = p->workers[q].udp_fds[0] = p->workers[q].udp_fds[1] = -1;
	if (n > 1) {
		if (!(p->handoff_buf = calloc(1, UDP_HANDOFF_MAX))) {
			snprintf(err, errlen, "proxy: out of memory");
			return -ENOMEM;
		}
		memset(p->handoff_buf, 0, UDP_HANDOFF_MAX); /* pre-fault: memory figures do not jump under load */
		p->worker_died_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (p->worker_died_fd < 0 ||
		    !(p->worker_died_ev = event_new(p->base, p->worker_died_fd, EV_READ,
						    on_worker_died, p)) ||
		    event_add(p->worker_died_ev, NULL) != 0) {
			snprintf(err, errlen, "proxy: eventfd: out of resources");
			return -ENOMEM;
		}
	}
	for (uint32_t q = 0; q < p->nworkers; q++)
		if ((ret = worker_init(p, q, err, errlen)) != 0)
			return ret;
	p->driver = p->workers[0].driver;
	return 0;
}

/* Start the threads of queues 1.. (after the stack: they call into it at once). Signals stay
 * with the main thread: the workers are created with every signal blocked. */
int workers_start(struct ts_proxy *p, char *err, size_t errlen)
{
	sigset_t all, old;
	int ret = 0;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (uint32_t q = 1; q < p->nworkers; q++) {
		struct worker *w = &p->workers[q];
		ret = pthread_create(&w->thread, NULL, worker_main, w);
		if (ret != 0) {
			snprintf(err, errlen, "proxy: TUN queue %u thread: %s", q, strerror(ret));
			ret = -ret;
			break;
		}
		w->started = true;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return ret;
}

void workers_stop(struct ts_proxy *p)
{
	for (uint32_t q = 1; q < p->nworkers; q++)
		worker_stop(&p->workers[q]);
	if (p->worker_died_ev) {
		event_free(p->worker_died_ev);
		p->worker_died_ev = NULL;
	}
	if (p->nworkers)
		memback_fini(&p->workers[0].memback); /* its quiet hooks' objects go next */
}

void workers_free(struct ts_proxy *p)
{
	if (!p->workers)
		return;
	workers_stop(p);
	for (uint32_t q = 0; q < p->nworkers; q++)
		worker_free(&p->workers[q]);
	free(p->workers);
	p->workers = NULL;
	p->nworkers = 0;
	p->driver = NULL;
	if (p->worker_died_fd >= 0)
		close(p->worker_died_fd);
	p->worker_died_fd = -1;
	free(p->handoff_buf);
	p->handoff_buf = NULL;
}

