/* load_udp.c — the UDP clients of `twinstack load`: udp (echo packet rate and loss) and
 * udpflows (many concurrent flows, one datagram each).
 *
 * Each datagram carries a 64-bit sequence number (udp) or a 32-bit flow id and a magic
 * (udpflows) in its first bytes, so an echo is matched to what was sent, not merely counted.
 * udp --socks5 sends the same payloads through a SOCKS5 UDP relay (load_socks5.c): each
 * datagram then starts with the RFC 1928 header, built once, and each echo must come back
 * with the header naming the target. */
#include "cli/load.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define UDP_WINDOW 64            /* rate 0: datagrams outstanding at most */
#define UDP_STALL_US 20000       /* rate 0: a window with no echo for this long is lost */
#define UDP_DRAIN_US 200000      /* after the send phase: wait this long for late echoes */
#define UDP_SOCKBUF (4 << 20)    /* the client's own buffers must not be what drops */
#define FLOW_WINDOW 128          /* udpflows: first datagrams unanswered at most, ... */
#define FLOW_WINDOW_US 50000     /* ... or for at most this long before opening more */
#define FLOW_MAGIC 0x74736c66u   /* "tslf" */

/* A connected non-blocking UDP socket to o->addr:o->port, or -errno. */
static int udp_connect(const struct load_opts *o, bool big_buffers)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd = load_socket(&o->addr, SOCK_DGRAM), ret;

	if (fd < 0)
		return fd;
	if (big_buffers)
		load_sockbuf(fd, UDP_SOCKBUF);
	load_sockaddr(&o->addr, o->port, &ss, &len);
	if (connect(fd, (struct sockaddr *)&ss, len) != 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	return fd;
}

/* ---- udp ----------------------------------------------------------------------------------- */

struct udprun {
	const struct load_opts *o;
	int fd;
	size_t hdr;        /* --socks5: the relay header in front of each payload, else 0 */
	char *msg, *buf;   /* msg: header + payload */
	uint64_t sent, received, bad, inflight, send_errors;
};

static int udp_send_one(struct udprun *u)
{
	memcpy(u->msg + u->hdr, &u->sent, sizeof(u->sent));
	if (send(u->fd, u->msg, u->hdr + u->o->size, 0) < 0) {
		if (errno == EAGAIN || errno == ENOBUFS)
			return 0;
		/* An ICMP error from an earlier datagram surfaces here; through a proxy it can be
		 * transient, so it is counted and the run goes on. */
		if (errno == ECONNREFUSED || errno == EHOSTUNREACH || errno == ENETUNREACH) {
			u->send_errors++;
			return 0;
		}
		return -errno;
	}
	u->sent++;
	u->inflight++;
	return 1;
}

/* Take every echo that is there; returns how many. */
static unsigned udp_recv_all(struct udprun *u)
{
	const char *payload;
	unsigned got = 0;
	uint64_t seq;
	ssize_t n;

	while ((n = recv(u->fd, u->buf, 65536, MSG_DONTWAIT)) >= 0) {
		if (u->hdr)
			payload = (const char *)load_s5udp_payload(u->o, (const uint8_t *)u->buf,
								   (size_t)n, u->o->size);
		else if ((size_t)n != u->o->size)
			payload = NULL;
		else
			payload = u->buf;
		if (payload)
			memcpy(&seq, payload, sizeof(seq));
		if (!payload || seq >= u->sent) {
			u->bad++; /* not an echo of ours: counted apart, never as received */
			continue;
		}
		u->received++;
		if (u->inflight)
			u->inflight--;
		got++;
	}
	return got;
}

/* Wait up to us microseconds for the socket to become readable (ppoll: sub-ms pacing). */
static void udp_wait(struct udprun *u, int64_t us)
{
	struct pollfd p = { .fd = u->fd, .events = POLLIN };
	struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000 };

	if (us > 0)
		ppoll(&p, 1, &ts, NULL);
}

/* Rate 0: keep UDP_WINDOW datagrams outstanding; a window without any echo for UDP_STALL_US
 * is written off so one lost burst does not stall the run. */
static int udp_windowed(struct udprun *u, int64_t end)
{
	int64_t last_rx = load_now_us(), now;
	int ret;

	while ((now = load_now_us()) < end && !load_stopping()) {
		while (u->inflight < UDP_WINDOW)
			if ((ret = udp_send_one(u)) <= 0) {
				if (ret < 0)
					return ret;
				break;
			}
		udp_wait(u, 5000);
		if (udp_recv_all(u))
			last_rx = load_now_us();
		else if (load_now_us() - last_rx > UDP_STALL_US) {
			u->inflight = 0;
			last_rx = load_now_us();
		}
	}
	return 0;
}

/* Rate R: datagram k leaves at start + k/R; sends that fell behind go out at once, in bursts
 * of at most UDP_WINDOW so receiving keeps up. */
static int udp_paced(struct udprun *u, int64_t start, int64_t end)
{
	int64_t now;
	int ret;

	while ((now = load_now_us()) < end && !load_stopping()) {
		uint64_t due = (uint64_t)((double)(now - start) * (double)u->o->rate / 1e6) + 1;

		for (unsigned k = 0; u->sent < due && k < UDP_WINDOW; k++)
			if ((ret = udp_send_one(u)) <= 0) {
				if (ret < 0)
					return ret;
				break;
			}
		udp_recv_all(u);
		if (u->sent >= due)
			udp_wait(u, start + (int64_t)((double)u->sent * 1e6 / (double)u->o->rate) -
					    load_now_us());
	}
	return 0;
}

/* The socket and the message: straight to the target, or through a SOCKS5 relay (the header
 * written once in front of the payload). 0 or -errno. */
static int udp_open(struct udprun *u, struct load_s5udp *s5)
{
	const struct load_opts *o = u->o;
	int ret;

	if (o->has_socks5) {
		if ((ret = load_s5udp_open(o, o->timeout_ms, s5)) != 0)
			return ret;
		u->fd = s5->fd;
		u->hdr = s5->hdr_len;
		load_sockbuf(u->fd, UDP_SOCKBUF);
	} else if ((u->fd = udp_connect(o, true)) < 0) {
		return u->fd;
	}
	if (!(u->msg = calloc(1, u->hdr + o->size)))
		return -ENOMEM;
	if (u->hdr && (ret = load_s5udp_header(o, (uint8_t *)u->msg, u->hdr)) < 0)
		return ret;
	return 0;
}

static void udp_print(const struct udprun *u, const struct load_s5udp *s5, int64_t secs_us)
{
	char relay[NETADDR_EP_STRLEN];

	printf("{\"pps\":%.1f,\"sent\":%" PRIu64 ",\"received\":%" PRIu64 ",\"loss_pct\":%.3f,"
	       "\"bad\":%" PRIu64 ",\"send_errors\":%" PRIu64 ",\"size\":%u",
	       (double)u->received * 1e6 / (double)secs_us, u->sent, u->received,
	       u->sent ? 100.0 * (double)(u->sent - (u->received < u->sent ? u->received : u->sent)) /
				 (double)u->sent : 0.0,
	       u->bad, u->send_errors, u->o->size);
	if (u->hdr)
		printf(",\"socks5_relay\":\"%s\"", netaddr_ep_format(&s5->relay, relay, sizeof(relay)));
	printf("}\n");
}

int load_udp(const struct load_opts *o)
{
	struct udprun u = { .o = o, .fd = -1 };
	struct load_s5udp s5 = { .ctl = -1, .fd = -1 };
	int64_t start, end, sent_end;
	int ret, rc = EXIT_RUNTIME;

	if (o->size < 8) {
		fprintf(stderr, "load udp: --size must be at least 8 (the sequence number)\n");
		return EXIT_USAGE;
	}
	if (!(u.buf = malloc(65536)) || (ret = udp_open(&u, &s5)) != 0) {
		load_json_error("udp", u.buf ? ret : -ENOMEM);
		goto out;
	}
	start = load_now_us();
	end = start + (int64_t)(o->duration_s * 1e6);
	ret = o->rate ? udp_paced(&u, start, end) : udp_windowed(&u, end);
	if (ret < 0)
		fprintf(stderr, "load udp: send: %s\n", strerror(-ret));
	sent_end = load_now_us();
	for (int64_t now = sent_end; now < sent_end + UDP_DRAIN_US; now = load_now_us()) {
		udp_wait(&u, sent_end + UDP_DRAIN_US - now);
		udp_recv_all(&u);
	}
	if (u.hdr && load_s5udp_ctl_closed(&s5))
		fprintf(stderr, "load udp: the SOCKS5 server closed the control connection (the "
				"association ended)\n");
	udp_print(&u, &s5, sent_end - start);
	rc = ret == 0 && u.received ? EXIT_OK : EXIT_RUNTIME;
out:
	if (u.hdr)
		load_s5udp_close(&s5); /* its fd is u.fd */
	else if (u.fd >= 0)
		close(u.fd);
	free(u.msg);
	free(u.buf);
	return rc;
}

/* ---- udpflows ------------------------------------------------------------------------------ */

struct flows {
	const struct load_opts *o;
	int ep;
	int *fd;          /* one socket (one source port) per flow; -1 if it could not open */
	bool *answered;
	unsigned opened, sent, answered_n;
};

static int flow_open(struct flows *f, uint32_t id)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = id };
	uint32_t msg[4] = { id, FLOW_MAGIC, 0, 0 };
	int fd = udp_connect(f->o, false);

	if (fd < 0)
		return fd;
	f->fd[id] = fd;
	f->opened++;
	if (epoll_ctl(f->ep, EPOLL_CTL_ADD, fd, &ev) != 0)
		return -errno;
	if (send(fd, msg, sizeof(msg), 0) != (ssize_t)sizeof(msg))
		return -errno;
	f->sent++;
	return 0;
}

static void flow_read(struct flows *f, uint32_t id)
{
	uint32_t msg[4];
	ssize_t n;

	while ((n = recv(f->fd[id], msg, sizeof(msg), MSG_DONTWAIT)) >= 0)
		if (n == (ssize_t)sizeof(msg) && msg[0] == id && msg[1] == FLOW_MAGIC &&
		    !f->answered[id]) {
			f->answered[id] = true;
			f->answered_n++;
		}
}

/* Read echoes until at most outstanding flows are unanswered or timeout_us passed. */
static void flows_wait(struct flows *f, unsigned outstanding, int64_t timeout_us)
{
	struct epoll_event evs[256];
	int64_t end = load_now_us() + timeout_us, now;

	while (f->answered_n + outstanding < f->sent && (now = load_now_us()) < end &&
	       !load_stopping()) {
		int n = epoll_wait(f->ep, evs, 256, (int)((end - now) / 1000) + 1);

		for (int k = 0; k < n; k++)
			flow_read(f, evs[k].data.u32);
	}
}

int load_udpflows(const struct load_opts *o)
{
	struct flows f = { .o = o, .ep = -1 };
	uint64_t lim = load_raise_nofile();
	int ret, first_err = 0;

	if ((uint64_t)o->flows + 16 > lim)
		fprintf(stderr, "load udpflows: %u flows but the fd limit is %" PRIu64 "\n",
			o->flows, lim);
	f.fd = malloc(o->flows * sizeof(*f.fd));
	f.answered = calloc(o->flows, sizeof(*f.answered));
	if (!f.fd || !f.answered || (f.ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
		fprintf(stderr, "load udpflows: %s\n", strerror(errno));
		goto out;
	}
	for (unsigned i = 0; i < o->flows; i++)
		f.fd[i] = -1;
	for (uint32_t id = 0; id < o->flows && !load_stopping(); id++) {
		if ((ret = flow_open(&f, id)) != 0 && !first_err)
			first_err = ret;
		/* New flows go out in windows: a burst of a thousand first datagrams would measure
		 * the receiver's socket buffer, not how many flows the path can carry. */
		if (f.sent >= f.answered_n + FLOW_WINDOW)
			flows_wait(&f, FLOW_WINDOW / 2, FLOW_WINDOW_US);
	}
	if (first_err)
		fprintf(stderr, "load udpflows: %u of %u flows not sent: %s\n", o->flows - f.sent,
			o->flows, strerror(-first_err));
	flows_wait(&f, 0, (int64_t)o->timeout_ms * 1000);
out:
	printf("{\"flows\":%u,\"answered\":%u,\"sent\":%u}\n", o->flows, f.answered_n, f.sent);
	for (unsigned i = 0; f.fd && i < o->flows; i++)
		if (f.fd[i] >= 0)
			close(f.fd[i]);
	if (f.ep >= 0)
		close(f.ep);
	free(f.fd);
	free(f.answered);
	return f.answered_n ? EXIT_OK : EXIT_RUNTIME;
}
