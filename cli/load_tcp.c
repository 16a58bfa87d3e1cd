/* load_tcp.c — the TCP clients of `twinstack load`: connrate, latency and hold.
 *
 * Each is one epoll loop over non-blocking sockets; a connection is a small state machine
 * indexed by epoll's data.u64. The clock is read once per loop turn. Requests are at most
 * 65000 bytes, so one read buffer per loop serves every connection. connrate and hold send
 * each connection its own byte pattern (load_pattern_fill) and check every echoed byte. */
#include "cli/load.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "cli/cli.h"

#define TCP_BUF 65536
#define HOLD_INFLIGHT 256 /* connects in flight at once: a SYN burst must not overflow backlogs */
#define HOLD_DRAIN_US 10000000 /* after the last round: how long owed echoes may take */

enum tc_state { TC_IDLE, TC_CONNECT, TC_WRITE, TC_READ, TC_HELD };

struct tconn {
	int fd; /* -1 when idle */
	enum tc_state st;
	bool bad;           /* hold: an echoed byte differed from what was sent */
	size_t done;        /* bytes of the current request written, then read back */
	uint64_t expect;    /* hold: echo bytes owed by the server */
	int64_t t0;         /* when the current connect or request started (us) */
	uint64_t idx;       /* the connection's number in the run: which pattern it carries */
	uint64_t sent, got; /* hold: pattern bytes written, and echoed back, so far */
};

/* Start a non-blocking connect to o->addr:port (from o->source if set, port chosen by the
 * kernel at connect time so binding does not pin a port per address). Returns fd or -errno. */
static int connect_start(const struct load_opts *o, uint16_t port)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int one = 1, fd, ret;

	if ((fd = load_socket(&o->addr, SOCK_STREAM)) < 0)
		return fd;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (o->has_source) {
		setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
		load_sockaddr(&o->source, 0, &ss, &len);
		if (bind(fd, (struct sockaddr *)&ss, len) != 0)
			goto fail;
	}
	load_sockaddr(&o->addr, port, &ss, &len);
	if (connect(fd, (struct sockaddr *)&ss, len) != 0 && errno != EINPROGRESS)
		goto fail;
	return fd;
fail:
	ret = -errno;
	close(fd);
	return ret;
}

static int ep_set(int ep, int op, int fd, uint32_t events, uint64_t id)
{
	struct epoll_event ev = { .events = events, .data.u64 = id };
	return epoll_ctl(ep, op, fd, &ev) != 0 ? -errno : 0;
}

static int sock_error(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		return -errno;
	return -err;
}

/* Write what the socket takes of buf[c->done..len); 1 when all is written, 0 for more later,
 * -errno on failure. */
static int tc_write(struct tconn *c, const char *buf, size_t len)
{
	ssize_t n = write(c->fd, buf + c->done, len - c->done);

	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	c->done += (size_t)n;
	return c->done == len;
}

/* Read the echo of a len-byte request; 1 when complete, 0 for more later, -errno on failure
 * (-EPIPE for an early EOF). */
static int tc_read(struct tconn *c, char *buf, size_t len)
{
	ssize_t n = read(c->fd, buf, len - c->done);

	if (n == 0)
		return -EPIPE;
	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	c->done += (size_t)n;
	return c->done == len;
}

static void tc_close(struct tconn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->st = TC_IDLE;
}

static int64_t end_of(const struct load_opts *o, int64_t start)
{
	return start + (int64_t)(o->duration_s * 1e6);
}

/* ---- connrate ------------------------------------------------------------------------------ */

/* Why an attempt failed, as the JSON's error_causes reports it. */
enum cr_cause { CR_ADDRNOTAVAIL, CR_RESET, CR_REFUSED, CR_TIMEOUT, CR_MISMATCH, CR_OTHER, CR_MAX };

static const char *const cr_cause_names[CR_MAX] = {
	[CR_ADDRNOTAVAIL] = "addrnotavail", [CR_RESET] = "reset",       [CR_REFUSED] = "refused",
	[CR_TIMEOUT] = "timeout",           [CR_MISMATCH] = "mismatch", [CR_OTHER] = "other",
};

/* err is -errno; -EBADMSG is an echo that differs from the request, -EPIPE an EOF before the
 * whole echo (the peer closed early: counted with the resets). */
static enum cr_cause cr_cause_of(int err)
{
	switch (-err) {
	case EADDRNOTAVAIL:
		return CR_ADDRNOTAVAIL;
	case ECONNRESET:
	case EPIPE:
		return CR_RESET;
	case ECONNREFUSED:
		return CR_REFUSED;
	case ETIMEDOUT:
		return CR_TIMEOUT;
	case EBADMSG:
		return CR_MISMATCH;
	default:
		return CR_OTHER;
	}
}

struct connrate {
	const struct load_opts *o;
	int ep;
	struct tconn *w;
	char *req, *buf;
	unsigned next_port;
	int64_t start, now;
	uint64_t attempts, completed, inflight;
	uint64_t causes[CR_MAX];
	uint64_t *per_sec; /* completions in second k after start */
	size_t n_sec;
	struct load_samples connect_us;
};

static void cr_fail(struct connrate *cr, int err)
{
	cr->causes[cr_cause_of(err)]++;
}

static void cr_start(struct connrate *cr, size_t i)
{
	struct tconn *c = &cr->w[i];
	uint16_t port = cr->o->ports[cr->next_port++ % cr->o->n_ports];
	int fd = connect_start(cr->o, port), ret;

	c->idx = cr->attempts++;
	if (fd < 0 || (ret = ep_set(cr->ep, EPOLL_CTL_ADD, fd, EPOLLOUT, i)) != 0) {
		if (fd >= 0)
			close(fd);
		cr_fail(cr, fd < 0 ? fd : ret);
		return; /* stays idle; cr_refill retries it next turn */
	}
	c->fd = fd;
	c->st = TC_CONNECT;
	c->done = 0;
	c->t0 = cr->now;
	cr->inflight++;
}

static void cr_close(struct connrate *cr, struct tconn *c)
{
	tc_close(c);
	cr->inflight--;
}

static void cr_complete(struct connrate *cr, struct tconn *c)
{
	size_t sec = (size_t)((cr->now - cr->start) / 1000000);

	cr->completed++;
	if (sec < cr->n_sec)
		cr->per_sec[sec]++;
	cr_close(cr, c);
}

/* Write what the socket takes of c's request (its pattern from c->done on); 1 when all is
 * written, 0 for more later, -errno on failure. */
static int cr_write(struct connrate *cr, struct tconn *c)
{
	size_t left = cr->o->req - c->done;
	ssize_t n;

	load_pattern_fill(c->idx, c->done, (uint8_t *)cr->req, left);
	if ((n = write(c->fd, cr->req, left)) < 0)
		return errno == EAGAIN ? 0 : -errno;
	c->done += (size_t)n;
	return c->done == cr->o->req;
}

/* Read and check the echo of c's request; 1 when all of it came back right, 0 for more later,
 * -EBADMSG for a byte that differs, -EPIPE for an early EOF, -errno on failure. */
static int cr_read(struct connrate *cr, struct tconn *c)
{
	ssize_t n = read(c->fd, cr->buf, cr->o->req - c->done);

	if (n == 0)
		return -EPIPE;
	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	if (!load_pattern_ok(c->idx, c->done, (const uint8_t *)cr->buf, (size_t)n))
		return -EBADMSG;
	c->done += (size_t)n;
	return c->done == cr->o->req;
}

/* One event on worker i; returns -errno when the attempt failed. */
static int cr_step(struct connrate *cr, size_t i)
{
	struct tconn *c = &cr->w[i];
	int ret;

	switch (c->st) {
	case TC_CONNECT:
		if ((ret = sock_error(c->fd)) != 0)
			return ret;
		if (load_samples_add(&cr->connect_us, cr->now - c->t0) != 0)
			return -ENOMEM;
		c->st = TC_WRITE;
		/* The socket is writable now: send the request without another epoll turn. */
		/* fall through */
	case TC_WRITE:
		if ((ret = cr_write(cr, c)) <= 0)
			return ret;
		c->st = TC_READ;
		c->done = 0;
		return ep_set(cr->ep, EPOLL_CTL_MOD, c->fd, EPOLLIN, i);
	case TC_READ:
		if ((ret = cr_read(cr, c)) <= 0)
			return ret;
		cr_complete(cr, c);
		return 0;
	default:
		return 0;
	}
}

/* With --count: every connection still wanted has an attempt under way. */
static bool cr_enough(const struct connrate *cr)
{
	return cr->o->count && cr->completed + cr->inflight >= cr->o->count;
}

/* Restart idle workers, and abandon attempts older than --timeout-ms: a dropped SYN or a lost
 * echo must cost one error, not a worker for the rest of the run. */
static void cr_refill(struct connrate *cr)
{
	int64_t timeout_us = (int64_t)cr->o->timeout_ms * 1000;

	for (size_t i = 0; i < cr->o->concurrency; i++) {
		struct tconn *c = &cr->w[i];

		if (c->fd >= 0 && timeout_us && cr->now - c->t0 > timeout_us) {
			cr_fail(cr, -ETIMEDOUT);
			cr_close(cr, c);
		}
		if (c->fd < 0 && !load_stopping() && !cr_enough(cr))
			cr_start(cr, i);
	}
}

static bool cr_done(const struct connrate *cr)
{
	return cr->o->count && cr->completed >= cr->o->count;
}

static void cr_run(struct connrate *cr)
{
	struct epoll_event evs[256];
	int64_t end = end_of(cr->o, cr->start);

	for (cr->now = load_now_us(); cr->now < end && !load_stopping() && !cr_done(cr);
	     cr->now = load_now_us()) {
		int n, ret;

		cr_refill(cr);
		n = epoll_wait(cr->ep, evs, 256, 50);
		cr->now = load_now_us();
		for (int k = 0; k < n; k++) {
			size_t i = (size_t)evs[k].data.u64;
			if ((ret = cr_step(cr, i)) != 0) {
				cr_fail(cr, ret);
				cr_close(cr, &cr->w[i]);
			}
		}
	}
}

/* Median of the complete seconds after a 1 s warm-up; the overall mean if there are none. */
static double cr_rate(const struct connrate *cr, int64_t elapsed_us)
{
	size_t full = (size_t)(elapsed_us / 1000000), n = 0;
	uint32_t *v = malloc(cr->n_sec * sizeof(*v));
	double med;

	for (size_t s = 1; v && s < full && s < cr->n_sec; s++)
		v[n++] = (uint32_t)cr->per_sec[s];
	if (n == 0) {
		free(v);
		return elapsed_us > 0 ? (double)cr->completed * 1e6 / (double)elapsed_us : 0;
	}
	load_sort_u32(v, n);
	med = n % 2 ? v[n / 2] : ((double)v[n / 2 - 1] + v[n / 2]) / 2;
	free(v);
	return med;
}

static void cr_report(struct connrate *cr)
{
	int64_t elapsed = cr->now - cr->start;
	struct load_samples *s = &cr->connect_us;
	uint64_t errors = 0;

	for (int k = 0; k < CR_MAX; k++)
		errors += cr->causes[k];
	load_sort_u32(s->v, s->n);
	printf("{\"conn_per_s\":%.1f,\"completed\":%" PRIu64 ",\"errors\":%" PRIu64
	       ",\"timeouts\":%" PRIu64 ",\"p50_connect_us\":%u,\"p99_connect_us\":%u,"
	       "\"duration_s\":%.3f,\"attempts\":%" PRIu64 ",\"error_causes\":{",
	       cr_rate(cr, elapsed), cr->completed, errors, cr->causes[CR_TIMEOUT],
	       load_percentile_sorted(s->v, s->n, 0.50), load_percentile_sorted(s->v, s->n, 0.99),
	       (double)elapsed / 1e6, cr->attempts);
	for (int k = 0; k < CR_MAX; k++)
		printf("%s\"%s\":%" PRIu64, k ? "," : "", cr_cause_names[k], cr->causes[k]);
	printf("}}\n");
}

int load_connrate(const struct load_opts *o)
{
	struct connrate cr = { .o = o, .ep = -1 };
	int rc = EXIT_RUNTIME;

	load_raise_nofile();
	cr.n_sec = (size_t)o->duration_s + 2;
	cr.w = calloc(o->concurrency, sizeof(*cr.w));
	cr.req = malloc(o->req);
	cr.buf = malloc(TCP_BUF);
	cr.per_sec = calloc(cr.n_sec, sizeof(*cr.per_sec));
	if (!cr.w || !cr.req || !cr.buf || !cr.per_sec ||
	    (cr.ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
		load_json_error("connrate", -errno);
		goto out;
	}
	for (unsigned i = 0; i < o->concurrency; i++)
		cr.w[i].fd = -1;
	cr.start = load_now_us();
	cr_run(&cr);
	cr_report(&cr);
	rc = cr.completed ? EXIT_OK : EXIT_RUNTIME;
	for (unsigned i = 0; i < o->concurrency; i++)
		tc_close(&cr.w[i]);
out:
	if (cr.ep >= 0)
		close(cr.ep);
	load_samples_fini(&cr.connect_us);
	free(cr.w);
	free(cr.req);
	free(cr.buf);
	free(cr.per_sec);
	return rc;
}

/* ---- latency ------------------------------------------------------------------------------- */

/* A connected socket within timeout_ms, or -errno. Used where connects are few (latency). */
static int connect_wait(const struct load_opts *o, int timeout_ms)
{
	int fd = connect_start(o, o->port), ret;
	struct pollfd p;

	if (fd < 0)
		return fd;
	p = (struct pollfd){ .fd = fd, .events = POLLOUT };
	ret = poll(&p, 1, timeout_ms);
	ret = ret < 0 ? -errno : ret == 0 ? -ETIMEDOUT : sock_error(fd);
	if (ret != 0) {
		close(fd);
		return ret;
	}
	return fd;
}

/* Send one request on c, starting its clock. A short write waits for room on this socket
 * alone: with requests of at most 65000 bytes that is rare and short. */
static int lat_send(struct tconn *c, const char *msg, size_t len)
{
	struct pollfd p = { .fd = c->fd, .events = POLLOUT };
	int ret;

	c->t0 = load_now_us();
	c->done = 0;
	while ((ret = tc_write(c, msg, len)) == 0)
		if (poll(&p, 1, 1000) <= 0)
			return -ETIMEDOUT;
	c->st = TC_READ;
	c->done = 0;
	return ret < 0 ? ret : 0;
}

struct latency {
	const struct load_opts *o;
	int ep;
	struct tconn *c;
	char *msg, *buf;
	uint64_t errors;
	struct load_samples rtt;
};

static int lat_open(struct latency *l)
{
	for (unsigned i = 0; i < l->o->conns; i++) {
		int fd = connect_wait(l->o, 5000), ret;

		if (fd < 0) {
			fprintf(stderr, "load latency: connect: %s\n", strerror(-fd));
			return fd;
		}
		l->c[i].fd = fd;
		if ((ret = ep_set(l->ep, EPOLL_CTL_ADD, fd, EPOLLIN, i)) != 0 ||
		    (ret = lat_send(&l->c[i], l->msg, l->o->size)) != 0)
			return ret;
	}
	return 0;
}

static void lat_run(struct latency *l)
{
	struct epoll_event evs[64];
	int64_t end = end_of(l->o, load_now_us());

	while (load_now_us() < end && !load_stopping()) {
		int n = epoll_wait(l->ep, evs, 64, 100), ret;

		for (int k = 0; k < n; k++) {
			struct tconn *c = &l->c[evs[k].data.u64];

			if (c->fd < 0 || (ret = tc_read(c, l->buf, l->o->size)) == 0)
				continue;
			if (ret > 0 && load_samples_add(&l->rtt, load_now_us() - c->t0) == 0 &&
			    lat_send(c, l->msg, l->o->size) == 0)
				continue;
			l->errors++;
			tc_close(c); /* a broken connection is not replaced: latency wants steady ones */
		}
	}
}

int load_latency(const struct load_opts *o)
{
	struct latency l = { .o = o, .ep = -1 };
	struct load_samples *s = &l.rtt;
	int rc = EXIT_RUNTIME;

	l.c = calloc(o->conns, sizeof(*l.c));
	l.msg = malloc(o->size ? o->size : 1);
	l.buf = malloc(TCP_BUF);
	if (!l.c || !l.msg || !l.buf || (l.ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
		load_json_error("latency", -errno);
		goto out;
	}
	memset(l.msg, 'l', o->size);
	for (unsigned i = 0; i < o->conns; i++)
		l.c[i].fd = -1;
	if (o->size == 0 || lat_open(&l) == 0)
		lat_run(&l);
	load_sort_u32(s->v, s->n);
	printf("{\"latency_p50_us\":%u,\"latency_p99_us\":%u,\"latency_p999_us\":%u,"
	       "\"samples\":%zu,\"errors\":%" PRIu64 "}\n",
	       load_percentile_sorted(s->v, s->n, 0.50), load_percentile_sorted(s->v, s->n, 0.99),
	       load_percentile_sorted(s->v, s->n, 0.999), s->n, l.errors);
	rc = s->n ? EXIT_OK : EXIT_RUNTIME;
out:
	for (unsigned i = 0; l.c && i < o->conns; i++)
		tc_close(&l.c[i]);
	if (l.ep >= 0)
		close(l.ep);
	load_samples_fini(&l.rtt);
	free(l.c);
	free(l.msg);
	free(l.buf);
	return rc;
}

/* ---- hold ---------------------------------------------------------------------------------- */

struct hold {
	const struct load_opts *o;
	int ep;
	struct tconn *c;
	char *msg, *buf;
	unsigned started, inflight, held, alive;
	uint64_t failed, echo_errors, late, mismatch, unanswered, bytes_verified;
	unsigned owed; /* held connections with echo bytes still owed */
	int first_err; /* -errno of the first failed connect, for the stderr line */
	int64_t end;
};

static void hold_connected(struct hold *h, size_t i)
{
	struct tconn *c = &h->c[i];

	int ret;

	h->inflight--;
	if ((ret = sock_error(c->fd)) != 0 ||
	    (ret = ep_set(h->ep, EPOLL_CTL_MOD, c->fd, EPOLLIN, i)) != 0) {
		h->first_err = h->first_err ? h->first_err : ret;
		h->failed++;
		tc_close(c);
		return;
	}
	c->st = TC_HELD;
	h->held++;
	h->alive++;
}

/* Phase 1: open every connection, at most HOLD_INFLIGHT connects at a time. */
static void hold_open(struct hold *h)
{
	struct epoll_event evs[256];

	while ((h->started < h->o->conns || h->inflight) && load_now_us() < h->end &&
	       !load_stopping()) {
		while (h->inflight < HOLD_INFLIGHT && h->started < h->o->conns) {
			size_t i = h->started++;
			int fd = connect_start(h->o, h->o->port);

			if (fd < 0 || ep_set(h->ep, EPOLL_CTL_ADD, fd, EPOLLOUT, i) != 0) {
				if (fd >= 0)
					close(fd);
				h->first_err = h->first_err ? h->first_err : fd < 0 ? fd : -EIO;
				h->failed++;
				continue;
			}
			h->c[i].fd = fd;
			h->c[i].st = TC_CONNECT;
			h->c[i].idx = i;
			h->inflight++;
		}
		int n = epoll_wait(h->ep, evs, 256, 100);
		for (int k = 0; k < n; k++)
			if (h->c[evs[k].data.u64].st == TC_CONNECT)
				hold_connected(h, (size_t)evs[k].data.u64);
	}
}

/* One round of light traffic: size bytes of each live connection's pattern, continuing its
 * stream. An echo still owed from the previous round is an error (the proxy stalled that
 * connection for a whole interval). */
static void hold_tick(struct hold *h)
{
	for (unsigned i = 0; i < h->o->conns; i++) {
		struct tconn *c = &h->c[i];
		ssize_t n;

		if (c->st != TC_HELD)
			continue;
		if (c->expect) {
			h->echo_errors++;
			h->late++;
		}
		load_pattern_fill(c->idx, c->sent, (uint8_t *)h->msg, h->o->size);
		n = write(c->fd, h->msg, h->o->size);
		if (n != (ssize_t)h->o->size)
			h->echo_errors++;
		if (n > 0) {
			h->owed += !c->expect;
			c->expect += (uint64_t)n;
			c->sent += (uint64_t)n;
		}
	}
}

/* The echo must be the connection's own pattern from where its echo stands. */
static void hold_read(struct hold *h, struct tconn *c)
{
	ssize_t n = read(c->fd, h->buf, TCP_BUF);

	if (n < 0 && errno == EAGAIN)
		return;
	if (n <= 0) { /* the proxy or server dropped a connection we hold */
		h->echo_errors++;
		h->alive--;
		h->owed -= c->expect != 0;
		tc_close(c);
		return;
	}
	if ((uint64_t)n > c->expect) { /* bytes nobody sent: count, then resynchronise */
		h->echo_errors++;
		h->owed -= c->expect != 0;
		c->bad = true;
		c->expect = 0;
		c->got = c->sent;
		return;
	}
	if (load_pattern_ok(c->idx, c->got, (const uint8_t *)h->buf, (size_t)n)) {
		h->bytes_verified += (uint64_t)n;
	} else {
		h->mismatch++;
		h->echo_errors++;
		c->bad = true;
	}
	c->expect -= (uint64_t)n;
	c->got += (uint64_t)n;
	h->owed -= c->expect == 0;
}

/* Connections that got at least one whole round back, every byte as sent. */
static unsigned hold_echoed(const struct hold *h)
{
	unsigned n = 0;

	for (unsigned i = 0; i < h->o->conns; i++)
		n += !h->c[i].bad && h->o->size && h->c[i].got >= h->o->size;
	return n;
}

/* Phase 2: light traffic every interval until the end or a signal. */
static void hold_traffic(struct hold *h)
{
	struct epoll_event evs[256];
	int64_t now = load_now_us(), next = now;

	while ((now = load_now_us()) < h->end && !load_stopping()) {
		int64_t wait_us;
		int n;

		if (now >= next) {
			if (h->o->size)
				hold_tick(h);
			next += (int64_t)h->o->interval_ms * 1000;
			if (next <= now) /* never queue ticks up after a stall */
				next = now + (int64_t)h->o->interval_ms * 1000;
		}
		wait_us = (next < h->end ? next : h->end) - now;
		n = epoll_wait(h->ep, evs, 256, (int)(wait_us / 1000) + 1);
		for (int k = 0; k < n; k++)
			if (h->c[evs[k].data.u64].st == TC_HELD)
				hold_read(h, &h->c[evs[k].data.u64]);
	}
}

/* After the last round the echoes still owed come back before the connections close (a close
 * with unread bytes would reset them), within HOLD_DRAIN_US; one still owed then is an error. */
static void hold_drain(struct hold *h)
{
	struct epoll_event evs[256];
	int64_t end = load_now_us() + HOLD_DRAIN_US, now;

	while (h->owed && (now = load_now_us()) < end) {
		int n = epoll_wait(h->ep, evs, 256, (int)((end - now) / 1000) + 1);

		for (int k = 0; k < n; k++)
			if (h->c[evs[k].data.u64].st == TC_HELD)
				hold_read(h, &h->c[evs[k].data.u64]);
	}
	h->unanswered = h->owed;
	h->echo_errors += h->owed;
}

int load_hold(const struct load_opts *o)
{
	struct hold h = { .o = o, .ep = -1 };
	uint64_t lim = load_raise_nofile();
	int rc = EXIT_RUNTIME;

	if (o->conns + 16 > lim)
		fprintf(stderr, "load hold: %u connections but the fd limit is %" PRIu64 "\n",
			o->conns, lim);
	h.c = calloc(o->conns, sizeof(*h.c));
	h.msg = malloc(o->size ? o->size : 1);
	h.buf = malloc(TCP_BUF);
	if (!h.c || !h.msg || !h.buf || (h.ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
		load_json_error("hold", -errno);
		goto out;
	}
	for (unsigned i = 0; i < o->conns; i++)
		h.c[i].fd = -1;
	h.end = end_of(o, load_now_us());
	hold_open(&h);
	/* The rig waits for this line, then samples the proxy's memory. */
	printf("HELD %u\n", h.held);
	fflush(stdout);
	fprintf(stderr, "load hold: %u held, %u failed%s%s\n", h.held, o->conns - h.held,
		h.first_err ? ", first: " : "", h.first_err ? strerror(-h.first_err) : "");
	hold_traffic(&h);
	hold_drain(&h);
	printf("{\"held\":%u,\"failed\":%" PRIu64 ",\"echo_errors\":%" PRIu64 ",\"alive\":%u,"
	       "\"echoed\":%u,\"mismatch\":%" PRIu64 ",\"late\":%" PRIu64
	       ",\"unanswered\":%" PRIu64 ",\"bytes_verified\":%" PRIu64 "}\n",
	       h.held, (uint64_t)(o->conns - h.held), h.echo_errors, h.alive, hold_echoed(&h),
	       h.mismatch, h.late, h.unanswered, h.bytes_verified);
	rc = h.held ? EXIT_OK : EXIT_RUNTIME;
out:
	for (unsigned i = 0; h.c && i < o->conns; i++)
		tc_close(&h.c[i]);
	if (h.ep >= 0)
		close(h.ep);
	free(h.c);
	free(h.msg);
	free(h.buf);
	return rc;
}
