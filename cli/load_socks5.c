/* load_socks5.c — `twinstack load udp --socks5 SERVER`: the plain SOCKS5 client the benchmark
 * compares a TUN proxy's SOCKS5 outbound against (docs/benchmarks.md).
 *
 * The handshake is RFC 1928 without authentication: greeting, method selection, UDP ASSOCIATE
 * with DST 0.0.0.0:0 (the client does not name its source, as most clients and the proxy's own
 * outbound do), and the reply whose BND is the relay (socks5_udp_relay_endpoint's rules). The
 * bytes are built and parsed by outbound/socks5_codec.h; this file only moves them, with one
 * deadline over the whole handshake. Blocking waits are fine here: nothing else runs until the
 * association exists. */
#include "cli/load.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "outbound/socks5_codec.h"

/* Wait until fd is ready for events or the deadline (monotonic µs) passes. */
static int wait_fd(int fd, short events, int64_t deadline)
{
	struct pollfd p = { .fd = fd, .events = events };
	int64_t left;
	int n;

	while ((left = deadline - load_now_us()) > 0) {
		n = poll(&p, 1, (int)((left + 999) / 1000));
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
		if (load_stopping())
			return -EINTR;
	}
	return -ETIMEDOUT;
}

static int connect_ctl(const struct netaddr_ep *server, int64_t deadline)
{
	struct sockaddr_storage ss;
	socklen_t len, elen = sizeof(int);
	int fd = load_socket(&server->addr, SOCK_STREAM), ret, err = 0;

	if (fd < 0)
		return fd;
	load_sockaddr(&server->addr, server->port, &ss, &len);
	if (connect(fd, (struct sockaddr *)&ss, len) != 0 && errno != EINPROGRESS) {
		ret = -errno;
		goto fail;
	}
	if ((ret = wait_fd(fd, POLLOUT, deadline)) != 0)
		goto fail;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err) {
		ret = err ? -err : -errno;
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return ret;
}

static int send_all(int fd, const uint8_t *buf, size_t len, int64_t deadline)
{
	size_t off = 0;
	ssize_t n;
	int ret;

	while (off < len) {
		n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		if ((ret = wait_fd(fd, POLLOUT, deadline)) != 0)
			return ret;
	}
	return 0;
}

/* Read into buf[*have..cap) once fd is readable: 0, or -ECONNRESET on EOF, -errno. */
static int recv_more(int fd, uint8_t *buf, size_t cap, size_t *have, int64_t deadline)
{
	ssize_t n;
	int ret;

	if (*have == cap)
		return -EPROTO; /* a message longer than the largest one the protocol has */
	if ((ret = wait_fd(fd, POLLIN, deadline)) != 0)
		return ret;
	n = recv(fd, buf + *have, cap - *have, 0);
	if (n == 0)
		return -ECONNRESET;
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	*have += (size_t)n;
	return 0;
}

/* Greeting and method selection; the server must pick "no authentication". */
static int negotiate(int fd, int64_t deadline)
{
	uint8_t buf[SOCKS5_REPLY_MAX], method = 0;
	size_t have = 0;
	int ret;

	if ((ret = socks5_build_greeting(buf, sizeof(buf), false)) < 0 ||
	    (ret = send_all(fd, buf, (size_t)ret, deadline)) != 0)
		return ret;
	while ((ret = socks5_parse_method(buf, have, false, &method)) == SOCKS5_NEED_MORE)
		if ((ret = recv_more(fd, buf, sizeof(buf), &have, deadline)) != 0)
			return ret;
	return ret < 0 ? ret : 0;
}

/* UDP ASSOCIATE and its reply; *relay from BND and the server's address. */
static int associate(int fd, const struct netaddr_ep *server, int64_t deadline,
		     struct netaddr_ep *relay)
{
	uint8_t buf[SOCKS5_REPLY_MAX];
	struct socks5_addr bnd, srv, rel;
	size_t have = 0;
	int ret;

	if ((ret = socks5_build_udp_associate(buf, sizeof(buf), NULL)) < 0 ||
	    (ret = send_all(fd, buf, (size_t)ret, deadline)) != 0)
		return ret;
	while ((ret = socks5_parse_reply(buf, have, &bnd)) == SOCKS5_NEED_MORE)
		if ((ret = recv_more(fd, buf, sizeof(buf), &have, deadline)) != 0)
			return ret;
	if (ret < 0)
		return ret;
	if ((ret = socks5_addr_ip(&srv, server->addr.family, server->addr.a, server->port)) != 0 ||
	    (ret = socks5_udp_relay_endpoint(&bnd, &srv, &rel)) != 0)
		return ret;
	if (rel.atyp == SOCKS5_ATYP_DOMAIN)
		return -EPROTO; /* a relay by name: this client does not resolve */
	memset(relay, 0, sizeof(*relay));
	relay->addr.family = rel.atyp == SOCKS5_ATYP_IPV4 ? 4 : 6;
	memcpy(relay->addr.a, rel.a, rel.len);
	relay->port = rel.port;
	return 0;
}

static int target_addr(const struct load_opts *o, struct socks5_addr *dst)
{
	return socks5_addr_ip(dst, o->addr.family, o->addr.a, o->port);
}

int load_s5udp_header(const struct load_opts *o, uint8_t *buf, size_t cap)
{
	struct socks5_addr dst;
	int ret;

	if ((ret = target_addr(o, &dst)) != 0)
		return ret;
	return socks5_udp_build(buf, cap, &dst, NULL, 0);
}

int load_s5udp_open(const struct load_opts *o, unsigned timeout_ms, struct load_s5udp *s)
{
	int64_t deadline = load_now_us() + (int64_t)timeout_ms * 1000;
	struct sockaddr_storage ss;
	uint8_t hdr[SOCKS5_UDP_HDR_MAX];
	socklen_t len;
	int ret;

	s->ctl = s->fd = -1;
	if ((ret = load_s5udp_header(o, hdr, sizeof(hdr))) < 0)
		return ret;
	s->hdr_len = (size_t)ret;
	if ((s->ctl = connect_ctl(&o->socks5, deadline)) < 0) {
		ret = s->ctl;
		goto fail;
	}
	if ((ret = negotiate(s->ctl, deadline)) != 0 ||
	    (ret = associate(s->ctl, &o->socks5, deadline, &s->relay)) != 0)
		goto fail;
	if ((s->fd = load_socket(&s->relay.addr, SOCK_DGRAM)) < 0) {
		ret = s->fd;
		goto fail;
	}
	load_sockaddr(&s->relay.addr, s->relay.port, &ss, &len);
	if (connect(s->fd, (struct sockaddr *)&ss, len) != 0) {
		ret = -errno;
		goto fail;
	}
	return 0;
fail:
	load_s5udp_close(s);
	return ret;
}

const uint8_t *load_s5udp_payload(const struct load_opts *o, const uint8_t *dgram, size_t n,
				  size_t size)
{
	struct socks5_udp_dgram d;
	struct socks5_addr want;

	if (socks5_udp_parse(dgram, n, &d) != 0 || d.payload_len != size ||
	    target_addr(o, &want) != 0)
		return NULL;
	if (d.src.atyp != want.atyp || d.src.port != want.port ||
	    memcmp(d.src.a, want.a, want.len) != 0)
		return NULL;
	return d.payload;
}

bool load_s5udp_ctl_closed(const struct load_s5udp *s)
{
	struct pollfd p = { .fd = s->ctl, .events = POLLIN };
	uint8_t b;
	ssize_t n;

	if (s->ctl < 0)
		return true;
	if (poll(&p, 1, 0) <= 0)
		return false;
	/* Readable: EOF or an error ends the association; stray bytes do not. */
	n = recv(s->ctl, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

void load_s5udp_close(struct load_s5udp *s)
{
	if (s->fd >= 0)
		close(s->fd);
	if (s->ctl >= 0)
		close(s->ctl);
	s->fd = s->ctl = -1;
}
