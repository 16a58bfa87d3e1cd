/* stream_sock.c — the stream interface over a connected, non-blocking kernel socket.
 *
 * Two separate libevent events (read, write), both persistent and level-triggered, so each
 * libevent callback calls exactly one user callback and then returns without touching the
 * stream: the user callback may have closed it (stream.h).
 *
 * An interest libevent has no memory to watch (event_add: its table of descriptors, or
 * epoll_ctl, refused) would leave the owner waiting for good. The stream fails instead: every
 * later read, write, peek and shutdown returns -ENOMEM, and the callback the owner asked for
 * runs once from the loop, where its call meets that error.
 */
#include "dispatch/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sockios.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

struct stream_sock {
	struct stream s; /* first: struct stream * converts to struct stream_sock * */
	int fd;
	struct event *rd, *wr;
	bool want_rd, want_wr;
	int err;         /* -ENOMEM once an interest could not be watched; 0 */
};

static struct stream_sock *ss_of(struct stream *s)
{
	return (struct stream_sock *)s;
}

static ssize_t ss_read(struct stream *s, void *buf, size_t n)
{
	ssize_t r;

	if (ss_of(s)->err)
		return ss_of(s)->err;
	do
		r = recv(ss_of(s)->fd, buf, n, 0);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return r;
}

static ssize_t ss_write(struct stream *s, const void *buf, size_t n)
{
	ssize_t r;

	if (ss_of(s)->err)
		return ss_of(s)->err;
	/* MSG_NOSIGNAL: a reset peer must come back as -EPIPE, not kill the process. */
	do
		r = send(ss_of(s)->fd, buf, n, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return r;
}

static ssize_t ss_writev(struct stream *s, const struct iovec *iov, int cnt)
{
	struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt };
	ssize_t r;

	if (ss_of(s)->err)
		return ss_of(s)->err;
	do
		r = sendmsg(ss_of(s)->fd, &mh, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return r;
}

static int ss_shutdown_write(struct stream *s)
{
	if (ss_of(s)->err)
		return ss_of(s)->err;
	return shutdown(ss_of(s)->fd, SHUT_WR) == 0 ? 0 : -errno;
}

/* Watch ev or stop. Not watched for want of memory: the stream fails (see the top). */
static void toggle(struct stream_sock *ss, struct event *ev, bool *cur, bool want, short what)
{
	if (*cur == want)
		return;
	*cur = want;
	if (!want) {
		event_del(ev);
	} else if (ss->err || event_add(ev, NULL) != 0) {
		ss->err = -ENOMEM;
		event_active(ev, what, 1);
	}
}

static void ss_set_interest(struct stream *s, bool read, bool write)
{
	struct stream_sock *ss = ss_of(s);

	toggle(ss, ss->rd, &ss->want_rd, read, EV_READ);
	toggle(ss, ss->wr, &ss->want_wr, write, EV_WRITE);
}

static int ss_fd(const struct stream *s)
{
	return ((const struct stream_sock *)s)->fd;
}

static void ss_destroy(struct stream_sock *ss)
{
	/* event_free deletes a pending event, also from inside that event's own callback. */
	event_free(ss->rd);
	event_free(ss->wr);
	close(ss->fd);
	free(ss);
}

static void ss_abort(struct stream *s)
{
	struct stream_sock *ss = ss_of(s);
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	/* Linger 0: close() discards unsent data and sends RST, so the peer sees the failure at
	 * once instead of a clean EOF or a hang. Failure here only costs the RST (not on TCP). */
	(void)setsockopt(ss->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	ss_destroy(ss);
}

static void ss_close(struct stream *s)
{
	ss_destroy(ss_of(s));
}

/* A pending error first: the socket was reset, what it still holds will never arrive (and
 * SIOCOUTQ would go on counting it). SIOCOUTQ is, for TCP, the sent bytes and FIN not yet
 * acknowledged (write_seq - snd_una); for AF_UNIX, the bytes the peer has not read yet. */
static ssize_t ss_unacked(const struct stream *s)
{
	int fd = ((const struct stream_sock *)s)->fd;
	int err = 0, n = 0;
	socklen_t len = sizeof(err);

	if (((const struct stream_sock *)s)->err)
		return ((const struct stream_sock *)s)->err;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0)
		return -err;
	if (ioctl(fd, SIOCOUTQ, &n) < 0)
		return 0; /* a socket type that cannot tell */
	return n;
}

static ssize_t ss_peek(struct stream *s, void *buf, size_t n)
{
	ssize_t r;

	if (ss_of(s)->err)
		return ss_of(s)->err;
	do
		r = recv(ss_of(s)->fd, buf, n, MSG_PEEK | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return r;
}

/* TCP's poll reports the socket readable only with SO_RCVLOWAT bytes queued (or at FIN, an
 * error, or under TCP memory pressure): tcp_poll, net/ipv4/tcp.c. A failure leaves the level
 * at 1, and the owner is woken for bytes it has seen: the dispatcher takes such a wake as the
 * app's last word (as after a FIN) and routes by what it saw. */
static void ss_set_lowat(struct stream *s, size_t lowat)
{
	int v = lowat > INT_MAX ? INT_MAX : (int)lowat;

	(void)setsockopt(ss_of(s)->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v));
}

static const struct stream_ops sock_ops = {
	.read = ss_read,
	.write = ss_write,
	.shutdown_write = ss_shutdown_write,
	.set_interest = ss_set_interest,
	.fd = ss_fd,
	.abort = ss_abort,
	.close = ss_close,
	.unacked = ss_unacked,
	.peek = ss_peek,
	.set_lowat = ss_set_lowat,
	.writev = ss_writev,
};

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	struct stream *s = arg;

	if (s->cb.readable)
		s->cb.readable(s->cb_arg);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
	struct stream *s = arg;

	if (s->cb.writable)
		s->cb.writable(s->cb_arg);
}

int stream_sock_new(struct event_base *base, int fd, struct stream **out)
{
	struct stream_sock *ss;
	int fl;

	*out = NULL;
	if (fd < 0)
		return -EBADF;
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0))
		return -errno;
	ss = calloc(1, sizeof(*ss));
	if (!ss)
		return -ENOMEM;
	ss->s.ops = &sock_ops;
	ss->fd = fd;
	ss->rd = event_new(base, fd, EV_READ | EV_PERSIST, on_read, &ss->s);
	ss->wr = event_new(base, fd, EV_WRITE | EV_PERSIST, on_write, &ss->s);
	if (!ss->rd || !ss->wr) {
		if (ss->rd)
			event_free(ss->rd);
		if (ss->wr)
			event_free(ss->wr);
		free(ss);
		return -ENOMEM;
	}
	*out = &ss->s;
	return 0;
}
