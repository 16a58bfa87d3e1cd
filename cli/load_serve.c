/* load_serve.c — `twinstack load serve`: the rig's TCP and UDP echo servers in one epoll loop.
 *
 * TCP: echo whatever arrives, close on EOF. A short write parks the rest in a per-fd buffer and
 * stops reading that connection until the buffer drains, so a slow reader costs one buffer,
 * never unbounded memory. UDP: recvfrom, sendto back. Ends on SIGTERM/SIGINT or --duration. */
#include "cli/load.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "cli/cli.h"

#define SERVE_BUF 65536
#define SERVE_BACKLOG 4096
#define SERVE_UDP_SOCKBUF (8 << 20)

enum { TAG_LISTEN = 1, TAG_UDP = 2, TAG_CONN = 3 };

struct pending {
	char *buf; /* NULL when nothing is parked */
	size_t off, len;
};

struct server {
	int ep;
	struct pending *pend; /* indexed by fd, n_pend entries (the fd limit) */
	size_t n_pend;
	char buf[SERVE_BUF];
	uint64_t served_conns, udp_datagrams;
};

static uint64_t tag(int kind, int fd)
{
	return (uint64_t)kind << 32 | (uint32_t)fd;
}

static int listen_on(struct server *s, const struct netaddr *a, uint16_t port, int type)
{
	struct sockaddr_storage ss;
	struct epoll_event ev = { .events = EPOLLIN };
	socklen_t len;
	int one = 1, fd, ret;

	if ((fd = load_socket(a, type)) < 0)
		return fd;
	load_sockaddr(a, port, &ss, &len);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (a->family == 6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, len) != 0 ||
	    (type == SOCK_STREAM && listen(fd, SERVE_BACKLOG) != 0))
		goto fail;
	if (type == SOCK_DGRAM) /* bursts of many flows or 1400-byte datagrams: room for them */
		load_sockbuf(fd, SERVE_UDP_SOCKBUF);
	ev.data.u64 = tag(type == SOCK_STREAM ? TAG_LISTEN : TAG_UDP, fd);
	if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) != 0)
		goto fail;
	return 0;
fail:
	ret = -errno;
	close(fd);
	return ret;
}

static void conn_close(struct server *s, int fd)
{
	if ((size_t)fd < s->n_pend) {
		free(s->pend[fd].buf);
		s->pend[fd].buf = NULL;
	}
	close(fd); /* also removes it from the epoll set */
}

static void on_accept(struct server *s, int lfd)
{
	for (;;) {
		struct epoll_event ev = { .events = EPOLLIN };
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				fprintf(stderr, "load serve: accept: %s\n", strerror(errno));
			return;
		}
		if ((size_t)fd >= s->n_pend) { /* cannot happen below the fd limit; stay safe */
			close(fd);
			continue;
		}
		ev.data.u64 = tag(TAG_CONN, fd);
		if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
			close(fd);
			continue;
		}
		s->served_conns++;
	}
}

/* Writes buf[0..len); parks what the socket did not take. Returns 0, or -errno to close. */
static int echo_out(struct server *s, int fd, const char *buf, size_t len)
{
	struct epoll_event ev = { .events = EPOLLOUT, .data.u64 = tag(TAG_CONN, fd) };
	struct pending *p = &s->pend[fd];
	ssize_t n = write(fd, buf, len);

	if (n < 0 && errno != EAGAIN)
		return -errno;
	if (n < 0)
		n = 0;
	if ((size_t)n == len)
		return 0;
	if (!(p->buf = malloc(len - (size_t)n)))
		return -ENOMEM;
	memcpy(p->buf, buf + n, len - (size_t)n);
	p->off = 0;
	p->len = len - (size_t)n;
	/* Stop reading until the parked bytes are out: the peer's own window is the brake. */
	return epoll_ctl(s->ep, EPOLL_CTL_MOD, fd, &ev) != 0 ? -errno : 0;
}

static int on_writable(struct server *s, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = tag(TAG_CONN, fd) };
	struct pending *p = &s->pend[fd];
	ssize_t n = write(fd, p->buf + p->off, p->len - p->off);

	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	p->off += (size_t)n;
	if (p->off < p->len)
		return 0;
	free(p->buf);
	p->buf = NULL;
	return epoll_ctl(s->ep, EPOLL_CTL_MOD, fd, &ev) != 0 ? -errno : 0;
}

static void on_conn(struct server *s, int fd, uint32_t events)
{
	ssize_t n;

	if (s->pend[fd].buf) {
		if (on_writable(s, fd) != 0)
			conn_close(s, fd);
		return;
	}
	/* Bounded: at most 16 reads per wakeup so one fast connection cannot starve the rest. */
	for (int i = 0; i < 16; i++) {
		n = read(fd, s->buf, sizeof(s->buf));
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			conn_close(s, fd);
			return;
		}
		if (n < 0)
			return;
		if (echo_out(s, fd, s->buf, (size_t)n) != 0) {
			conn_close(s, fd);
			return;
		}
		if (s->pend[fd].buf)
			return;
	}
	(void)events;
}

static void on_udp(struct server *s, int fd)
{
	for (int i = 0; i < 64; i++) {
		struct sockaddr_storage from;
		socklen_t flen = sizeof(from);
		ssize_t n = recvfrom(fd, s->buf, sizeof(s->buf), 0, (struct sockaddr *)&from, &flen);

		if (n < 0)
			return;
		s->udp_datagrams++;
		/* A full socket buffer drops the echo: that is UDP, and the client counts it. */
		sendto(fd, s->buf, (size_t)n, 0, (struct sockaddr *)&from, flen);
	}
}

static void serve_loop(struct server *s, const struct load_opts *o)
{
	int64_t end = o->duration_s > 0 ? load_now_us() + (int64_t)(o->duration_s * 1e6) : 0;
	struct epoll_event evs[256];

	while (!load_stopping() && (!end || load_now_us() < end)) {
		int n = epoll_wait(s->ep, evs, 256, 200);

		for (int i = 0; i < n; i++) {
			int kind = (int)(evs[i].data.u64 >> 32), fd = (int)(uint32_t)evs[i].data.u64;

			if (kind == TAG_LISTEN)
				on_accept(s, fd);
			else if (kind == TAG_UDP)
				on_udp(s, fd);
			else
				on_conn(s, fd, evs[i].events);
		}
	}
}

int load_serve(const struct load_opts *o)
{
	struct server *s = calloc(1, sizeof(*s));
	int ret, rc = EXIT_RUNTIME;

	if (!s)
		return EXIT_RUNTIME;
	s->n_pend = load_raise_nofile();
	s->ep = epoll_create1(EPOLL_CLOEXEC);
	if (s->ep < 0 || !(s->pend = calloc(s->n_pend, sizeof(*s->pend))))
		goto out;
	for (unsigned i = 0; i < o->n_ports; i++)
		if ((ret = listen_on(s, &o->addr, o->ports[i], SOCK_STREAM)) != 0) {
			fprintf(stderr, "load serve: tcp port %u: %s\n", o->ports[i], strerror(-ret));
			goto out;
		}
	if (o->udp_port && (ret = listen_on(s, &o->addr, o->udp_port, SOCK_DGRAM)) != 0) {
		fprintf(stderr, "load serve: udp port %u: %s\n", o->udp_port, strerror(-ret));
		goto out;
	}
	fprintf(stderr, "load serve: listening\n");
	serve_loop(s, o);
	rc = EXIT_OK;
out:
	printf("{\"served_conns\":%" PRIu64 ",\"udp_datagrams\":%" PRIu64 "}\n", s->served_conns,
	       s->udp_datagrams);
	/* Exiting closes every fd; only the heap needs returning for leak checkers. */
	for (size_t i = 0; s->pend && i < s->n_pend; i++)
		free(s->pend[i].buf);
	free(s->pend);
	free(s);
	return rc;
}
