/* run.c — `twinstack run`: assemble the proxy (budget, TUN, driver, dispatcher, UDP path,
 * stack, stats), report ready, run the loop, and take it apart again on SIGINT/SIGTERM.
 *
 * Start-up order (issue 3, seed 000 §六): config → budget → TUN up with its addresses verified
 * → rp_filter checked → RLIMIT_NOFILE raised → driver → dispatcher and UDP path → stack (its
 * listeners bound) → stats endpoint → "ready" (log line; one byte on --ready-fd). Exit 2 for a
 * bad config, 1 for a runtime failure; the ready fd is then closed without a byte. */
#include "cli/run.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/rps_auto.h"
#include "core/budget.h"
#include "core/clock.h"
#include "core/driver.h"
#include "core/rss.h"
#include "core/tun.h"
#include "dispatch/session.h"
#include "dispatch/udp.h"

#define RSS_SAMPLE_NS TS_NS_PER_SEC /* pressure tier refresh, only while traffic flows */

void usage_run(FILE *out)
{
	fputs("usage: twinstack run --config FILE [--ready-fd N]\n"
	      "\n"
	      "Create the TUN device from FILE, start the configured stack and carry traffic until\n"
	      "SIGINT or SIGTERM. 'ready' is logged once every listener is bound; with --ready-fd N\n"
	      "one byte is also written to fd N then (N is closed without a byte if start fails).\n"
	      "Needs CAP_NET_ADMIN (root). Exit 0 after a signal, 1 on a runtime failure, 2 on bad\n"
	      "usage or a bad config.\n"
	      "\n"
	      "options:\n"
	      "  -c, --config FILE   the config file (required)\n"
	      "      --ready-fd N    write one byte to fd N when ready\n"
	      "  -h, --help          this text\n",
	      out);
}

/* ---- driver glue: the driver calls the selected stack and the UDP path ------------------- */

#define UDP_HANDOFF_BATCH 64       /* datagrams the main loop takes from a worker per wakeup */
#define UDP_HANDOFF_MAX DRIVER_GSO_MAX /* largest datagram handed over */
#define UDP_HANDOFF_SNDBUF (4 << 20)   /* bytes a worker may queue for the main loop */

static void proxy_stop(struct proxy *p, int code);
static uint8_t handoff_buf[UDP_HANDOFF_MAX]; /* main thread only: datagrams from workers */

static enum driver_verdict drv_input(void *arg, uint8_t *buf, size_t len,
				     const struct pkt_meta *meta, int64_t now_ns, size_t *out_len,
				     bool *plain)
{
	struct worker *w = arg;
	struct proxy *p = w->p;
	return p->ops->input(p->ns, w->q, buf, len, meta, now_ns, out_len, plain);
}

static void drv_batch_end(void *arg, int64_t now_ns)
{
	struct worker *w = arg;
	struct proxy *p = w->p;
	struct rss_info ri;

	int64_t last;

	p->ops->batch_end(p->ns, w->q, now_ns);
	/* tun.rps "auto" follows the main loop's thread and queue 0's bytes: "auto" is "off"
	 * with more than one queue (tun_rps_auto), so queue 0 carries all the traffic. */
	if (w->q == 0) {
		const struct driver_counters *c = driver_get_counters(w->driver);
		rps_auto_tick(&p->rps, now_ns, ctr_get(&c->rx_bytes) + ctr_get(&c->tx_bytes));
	}
	/* The pressure tier follows RSS; sampled only while traffic flows, so an idle proxy
	 * never wakes up for it. Whichever queue sees traffic first in a second claims the
	 * sample (flows may all hash to one queue). */
	last = atomic_load_explicit(&p->rss_sampled_ns, memory_order_relaxed);
	if (now_ns - last >= RSS_SAMPLE_NS &&
	    atomic_compare_exchange_strong(&p->rss_sampled_ns, &last, now_ns) &&
	    rss_sample(&ri) == 0)
		budget_update_tier(p->budget, ri.rss_bytes);
}

static void drv_udp(void *arg, const uint8_t *pkt, size_t len, int64_t now_ns)
{
	struct worker *w = arg;
	ssize_t n;

	if (w->q == 0) {
		udp_path_input(w->p->udp, pkt, len, now_ns);
		return;
	}
	/* The UDP path lives on the main loop: hand the datagram over (the kernel copies it;
	 * a full socketpair drops it, counted, as a full device queue would). */
	do
		n = send(w->udp_fds[0], pkt, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		ctr_inc(&w->udp_handoff_drops);
	else
		ctr_inc(&w->udp_handoff);
}

static const struct driver_ops drv_ops = {
	.input = drv_input,
	.batch_end = drv_batch_end,
	.udp = drv_udp,
};

/* Main loop: datagrams a worker handed over. */
static void on_udp_handoff(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	int64_t now = ts_now_ns();

	(void)what;
	for (int i = 0; i < UDP_HANDOFF_BATCH; i++) {
		ssize_t n = recv(fd, handoff_buf, sizeof(handoff_buf), MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		udp_path_input(w->p->udp, handoff_buf, (size_t)n, now);
	}
}

/* ---- queue workers ------------------------------------------------------------------------- */

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
	struct proxy *p = arg;
	uint64_t v;

	(void)what;
	if (read(fd, &v, sizeof(v)) < 0) {
		/* spurious wakeup */
	}
	log_error(&p->log, "run: a TUN queue worker stopped unexpectedly; stopping");
	proxy_stop(p, EXIT_RUNTIME);
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
static int worker_init(struct proxy *p, uint32_t q, char *err, size_t errlen)
{
	struct worker *w = &p->workers[q];
	struct driver_params dp = {
		.fd = tun_fd(p->tun, q),
		.mtu = p->cfg.tun.mtu,
		.vnet_hdr = tun_vnet_hdr(p->tun),
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
	return 0;
fail:
	snprintf(err, errlen, "run: TUN queue %u: %s", q, strerror(-ret));
	return ret;
}

static int workers_init(struct proxy *p, char *err, size_t errlen)
{
	int ret;

	uint32_t n = tun_queues(p->tun);

	p->workers = calloc(n, sizeof(*p->workers));
	if (!p->workers) {
		snprintf(err, errlen, "run: out of memory");
		return -ENOMEM;
	}
	p->nworkers = n;
	for (uint32_t q = 0; q < n; q++)
		p->workers[q].stop_fd = p->workers[q].udp_fds[0] = p->workers[q].udp_fds[1] = -1;
	if (n > 1) {
		memset(handoff_buf, 0, sizeof(handoff_buf)); /* pre-fault */
		p->worker_died_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (p->worker_died_fd < 0 ||
		    !(p->worker_died_ev = event_new(p->base, p->worker_died_fd, EV_READ,
						    on_worker_died, p)) ||
		    event_add(p->worker_died_ev, NULL) != 0) {
			snprintf(err, errlen, "run: eventfd: out of resources");
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
static int workers_start(struct proxy *p, char *err, size_t errlen)
{
	sigset_t all, old;
	int ret = 0;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (uint32_t q = 1; q < p->nworkers; q++) {
		struct worker *w = &p->workers[q];
		ret = pthread_create(&w->thread, NULL, worker_main, w);
		if (ret != 0) {
			snprintf(err, errlen, "run: TUN queue %u thread: %s", q, strerror(ret));
			ret = -ret;
			break;
		}
		w->started = true;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return ret;
}

static void workers_stop(struct proxy *p)
{
	for (uint32_t q = 1; q < p->nworkers; q++)
		worker_stop(&p->workers[q]);
	if (p->worker_died_ev) {
		event_free(p->worker_died_ev);
		p->worker_died_ev = NULL;
	}
}

static void workers_free(struct proxy *p)
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
}

/* ---- stopping ------------------------------------------------------------------------------ */

/* Stop accepting, end every session (their guards mark NAT entries closing), leave the loop. */
static void proxy_stop(struct proxy *p, int code)
{
	if (p->stopping)
		return;
	p->stopping = true;
	p->exit_code = code;
	if (p->ns)
		p->ops->stop(p->ns);
	event_base_loopbreak(p->base);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct proxy *p = arg;
	(void)what;
	log_info(&p->log, "run: signal %d: stopping", (int)sig);
	proxy_stop(p, EXIT_OK);
}

static void on_fatal(void *arg, int err, const char *msg)
{
	struct proxy *p = arg;
	log_error(&p->log, "run: %s (%s); stopping", msg, strerror(-err));
	proxy_stop(p, EXIT_RUNTIME);
}

static void proxy_free(struct proxy *p)
{
	/* The queue threads call into the stack: they go first. */
	workers_stop(p);
	run_stats_stop(p);
	if (p->ns)
		p->ops->stop(p->ns);
	dispatcher_free(p->disp); /* ends every live session: guards run before the stack goes */
	p->disp = NULL;
	if (p->ns)
		p->ops->free(p->ns);
	udp_path_free(p->udp);
	workers_free(p);
	rps_auto_stop(&p->rps);
	tun_close(p->tun);
	if (p->sig_int)
		event_free(p->sig_int);
	if (p->sig_term)
		event_free(p->sig_term);
	if (p->base)
		event_base_free(p->base);
	budget_free(p->budget);
	config_fini(&p->cfg);
}

/* ---- starting ------------------------------------------------------------------------------ */

/* Raise the soft RLIMIT_NOFILE to the hard limit and fit the fd budget under it. */
static void fit_fds(struct proxy *p)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	p->cfg.budget.fds = budget_fds_fit(p->cfg.budget.fds, rl.rlim_cur);
}

static int open_tun(struct proxy *p, char *err, size_t errlen)
{
	char msg[512], note[TS_ERRLEN + 64];
	int ret = tun_open_config(&p->cfg.tun, &p->tun, note, sizeof(note), err, errlen);

	if (ret != 0)
		return ret;
	if (note[0])
		log_warn(&p->log, "run: %s", note);
	log_info(&p->log, "run: %s: %s I/O, %u queue%s, receive packet steering %s",
		 tun_name(p->tun), tun_vnet_hdr(p->tun) ? "offload" : "per-packet",
		 tun_queues(p->tun), tun_queues(p->tun) == 1 ? "" : "s",
		 tun_rps_auto(p->tun) ? "auto" : tun_rps(p->tun) ? "on" : "off");
	if (tun_rp_filter_check(tun_name(p->tun), msg, sizeof(msg)) > 0)
		log_warn(&p->log, "run: %s", msg);
	return rps_auto_start(&p->rps, p->tun, &p->log, "run", 0 /* no bytes moved yet */, err,
			      errlen);
}

static int start_stack(struct proxy *p, char *err, size_t errlen)
{
	struct netstack_env env = {
		.base = p->base,
		.cfg = &p->cfg,
		.budget = p->budget,
		.dispatcher = p->disp,
		.log = &p->log,
		.tx = driver_tx,
		.tx_arg = p->driver,
		.tx_meta = driver_offload(p->driver) ? driver_tx_meta : NULL,
		.tun_name = tun_name(p->tun),
		.fatal = on_fatal,
		.fatal_arg = p,
	};
	p->ops = netstack_lookup(config_stack_name(p->cfg.stack));
	if (!p->ops) {
		snprintf(err, errlen, "run: stack \"%s\" is not available in this build",
			 config_stack_name(p->cfg.stack));
		return -ENOTSUP;
	}
	return p->ops->start(&env, &p->ns, err, errlen);
}

static int add_signals(struct proxy *p)
{
	signal(SIGPIPE, SIG_IGN); /* a peer that went away is an EPIPE, not a process exit */
	p->sig_int = evsignal_new(p->base, SIGINT, on_signal, p);
	p->sig_term = evsignal_new(p->base, SIGTERM, on_signal, p);
	if (!p->sig_int || !p->sig_term || evsignal_add(p->sig_int, NULL) != 0 ||
	    evsignal_add(p->sig_term, NULL) != 0)
		return -ENOMEM;
	return 0;
}

/* Everything after the config: returns 0, or -errno with err filled. */
static int proxy_start(struct proxy *p, char *err, size_t errlen)
{
	int ret;

	fit_fds(p);
	if ((ret = budget_new(&p->cfg.budget, &p->budget)) != 0) {
		snprintf(err, errlen, "run: budget: %s", strerror(-ret));
		return ret;
	}
	p->base = event_base_new();
	if (!p->base || (ret = add_signals(p)) != 0) {
		snprintf(err, errlen, "run: event loop: out of memory");
		return -ENOMEM;
	}
	if ((ret = open_tun(p, err, errlen)) != 0)
		return ret;
	if ((ret = workers_init(p, err, errlen)) != 0)
		return ret;
	if ((ret = dispatcher_new(p->base, &p->cfg, p->budget, &p->disp)) != 0) {
		snprintf(err, errlen, "run: dispatcher: %s", strerror(-ret));
		return ret;
	}
	if ((ret = udp_path_new(p->base, &p->cfg, p->budget, driver_tx, p->driver, &p->udp)) != 0) {
		snprintf(err, errlen, "run: UDP path: %s", strerror(-ret));
		return ret;
	}
	if ((ret = start_stack(p, err, errlen)) != 0)
		return ret;
	if ((ret = workers_start(p, err, errlen)) != 0)
		return ret;
	return run_stats_start(p, err, errlen);
}

static void ready(struct proxy *p, int ready_fd)
{
	char summary[512];

	log_info(&p->log, "run: ready: %s", config_summary(&p->cfg, summary, sizeof(summary)));
	if (ready_fd >= 0) {
		ssize_t n;
		do
			n = write(ready_fd, "R", 1);
		while (n < 0 && errno == EINTR);
		close(ready_fd);
	}
}

static int parse_args(int argc, char **argv, const char **path, int *ready_fd)
{
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		int r;
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_run(stdout);
			return 1;
		}
		if ((r = cli_take_option(argc, argv, &i, "--config", "-c", path)) != 0) {
			if (r < 0)
				goto missing;
			continue;
		}
		if ((r = cli_take_option(argc, argv, &i, "--ready-fd", "--ready-fd", &v)) != 0) {
			char *end;
			if (r < 0)
				goto missing;
			long fd = strtol(v, &end, 10);
			if (*end || fd < 0 || fd > 65535 || fcntl((int)fd, F_GETFD) < 0) {
				fprintf(stderr, "twinstack run: --ready-fd '%s' is not an open fd\n", v);
				return -1;
			}
			*ready_fd = (int)fd;
			continue;
		}
		fprintf(stderr, "twinstack run: unexpected argument '%s'\n", argv[i]);
		usage_run(stderr);
		return -1;
missing:
		fprintf(stderr, "twinstack run: %s needs a value\n", argv[i]);
		return -1;
	}
	if (!*path) {
		fprintf(stderr, "twinstack run: --config FILE is required\n");
		usage_run(stderr);
		return -1;
	}
	return 0;
}

int cmd_run(int argc, char **argv)
{
	static struct proxy proxy; /* one per process; static only to keep it off the stack */
	struct proxy *p = &proxy;
	const char *path = NULL;
	char err[TS_ERRLEN];
	int ready_fd = -1, ret;

	if ((ret = parse_args(argc, argv, &path, &ready_fd)) != 0)
		return ret > 0 ? EXIT_OK : EXIT_USAGE;
	memset(p, 0, sizeof(*p));
	p->worker_died_fd = -1;
	p->started_ns = ts_now_ns();
	config_init(&p->cfg);
	log_init(&p->log, LOG_LEVEL_INFO, STDERR_FILENO);
	ret = config_load_file(path, &p->cfg, err, sizeof(err));
	if (ret != 0) {
		fprintf(stderr, "%s\n", err);
		if (ready_fd >= 0)
			close(ready_fd);
		config_fini(&p->cfg);
		return ret == -ENOMEM ? EXIT_RUNTIME : EXIT_USAGE;
	}
	p->log.level = p->cfg.log_level;
	if ((ret = proxy_start(p, err, sizeof(err))) != 0) {
		log_error(&p->log, "%s", err);
		if (ready_fd >= 0)
			close(ready_fd);
		proxy_free(p);
		return EXIT_RUNTIME;
	}
	ready(p, ready_fd);
	event_base_dispatch(p->base);
	ret = p->exit_code;
	proxy_free(p);
	log_info(&p->log, "run: stopped");
	return ret;
}
