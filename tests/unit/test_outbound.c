/* test_outbound.c — outbound/: direct, socks5, http and reject on real sockets, loopback only
 * (127.0.0.1 and ::1, never another address).
 *
 *   test (libevent loop) ──outbound_connect──► listener / echo server      (direct)
 *   test (libevent loop) ──► fake SOCKS5 server thread (scripted bytes)   (socks5, codes, faults)
 *   test (libevent loop) ──► microsocks (real, child process) ──► echo server thread
 *   test (libevent loop) ──► fake HTTP CONNECT proxy thread (scripted response, then echo)
 *
 * outbound_same (what a reload compares) needs none of them.
 *
 * Every wait is bounded: the loop runs under a guard timer, server threads poll with timeouts,
 * microsocks dies with the test process (PR_SET_PDEATHSIG) and is killed at the end.
 * Runs as root: SO_MARK needs CAP_NET_ADMIN.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "failalloc.h"
#include "fakedns.h"
#include "netns_child.h"
#include "outbound/http_codec.h"
#include "outbound/outbound.h"
#include "outbound/resolver.h"
#include "outbound/socks5_codec.h"
#include "testutil.h"

#define WAIT_MS 3000  /* upper bound of any single wait in this file */

/* ---- small helpers ---- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static socklen_t loop_sa(int family, uint16_t port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (family == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		return sizeof(*s);
	}
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	s6->sin6_family = AF_INET6;
	s6->sin6_port = htons(port);
	s6->sin6_addr = in6addr_loopback;
	return sizeof(*s6);
}

/* A blocking listener on the loopback address of family, kernel-chosen port. */
static int listen_loopback(int family, int backlog, uint16_t *port)
{
	struct sockaddr_storage ss;
	socklen_t len = loop_sa(family, 0, &ss);
	int fd = socket(family == 4 ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;

	cr_assert_geq(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	cr_assert_eq(bind(fd, (struct sockaddr *)&ss, len), 0, "bind: %s", strerror(errno));
	cr_assert_eq(listen(fd, backlog), 0);
	len = sizeof(ss);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	*port = ntohs(family == 4 ? ((struct sockaddr_in *)&ss)->sin_port
				  : ((struct sockaddr_in6 *)&ss)->sin6_port);
	return fd;
}

/* A loopback port with nothing listening (bound then released). */
static uint16_t free_port(int family)
{
	uint16_t port;
	int fd = listen_loopback(family, 1, &port);

	close(fd);
	return port;
}

static int accept_within(int lfd, int ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	if (poll(&p, 1, ms) != 1)
		return -1;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* Read exactly len bytes within ms (fd may be non-blocking). */
static bool read_exact(int fd, uint8_t *buf, size_t len, int ms)
{
	int64_t end = now_ms() + ms;
	size_t got = 0;

	while (got < len) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int64_t left = end - now_ms();
		ssize_t n;

		if (left <= 0 || poll(&p, 1, (int)left) != 1)
			return false;
		n = recv(fd, buf + got, len - got, 0);
		if (n <= 0) {
			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			return false;
		}
		got += (size_t)n;
	}
	return true;
}

static bool write_all(int fd, const uint8_t *buf, size_t len, int ms)
{
	int64_t end = now_ms() + ms;
	size_t off = 0;

	while (off < len) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int64_t left = end - now_ms();
		ssize_t n;

		if (left <= 0 || poll(&p, 1, (int)left) != 1)
			return false;
		n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			return false;
		}
		off += (size_t)n;
	}
	return true;
}

static void key_loopback(struct flow_key *k, int family, uint16_t dport)
{
	memset(k, 0, sizeof(*k));
	k->family = (uint8_t)family;
	k->proto = IPPROTO_TCP;
	k->sport_be = htons(40000);
	k->dport_be = htons(dport);
	tu_addr(k->dst, family == 4 ? "127.0.0.1" : "::1");
	tu_addr(k->src, family == 4 ? "198.18.0.9" : "fd00::9");  /* never dialled */
}

static void ob_direct(struct ts_outbound *ob)
{
	memset(ob, 0, sizeof(*ob));
	strcpy(ob->tag, "direct");
	ob->type = TS_OUT_DIRECT;
}

static void ob_socks5(struct ts_outbound *ob, int family, uint16_t port, const char *user,
		      const char *pass)
{
	memset(ob, 0, sizeof(*ob));
	strcpy(ob->tag, "proxy");
	ob->type = TS_OUT_SOCKS5;
	ob->has_server = true;
	ob->server.is_addr = true;
	strcpy(ob->server.host, family == 4 ? "127.0.0.1" : "::1");
	ob->server.addr.family = (uint8_t)family;
	tu_addr(ob->server.addr.a, ob->server.host);
	ob->server.port = port;
	if (user) {
		ob->has_auth = true;
		strcpy(ob->username, user);
		strcpy(ob->password, pass);
	}
}

/* ---- running an attempt on a loop ---- */

struct result {
	int calls;
	int err;
	int fd;
	uint8_t early[2048];
	size_t early_len;
	int64_t at_ms;
};

static void on_done(void *arg, int err, int fd, const uint8_t *early, size_t early_len)
{
	struct result *r = arg;

	r->calls++;
	r->err = err;
	r->fd = fd;
	r->at_ms = now_ms();
	cr_assert_leq(early_len, sizeof(r->early));
	cr_assert(early_len == 0 || early != NULL);
	if (early_len)
		memcpy(r->early, early, early_len);  /* valid only during the call */
	r->early_len = early_len;
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

/* Run base until r got its result or ms passed; false on the bound. */
static bool run_until_done(struct event_base *base, struct result *r, int ms)
{
	bool expired = false;
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	struct event *guard = evtimer_new(base, on_guard, &expired);

	evtimer_add(guard, &tv);
	while (r->calls == 0 && !expired)
		event_base_loop(base, EVLOOP_ONCE);
	event_free(guard);
	return r->calls > 0;
}

/* Let the loop run for ms whatever happens (for "done is never called" checks). */
static void run_for(struct event_base *base, int ms)
{
	bool expired = false;
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	struct event *guard = evtimer_new(base, on_guard, &expired);

	evtimer_add(guard, &tv);
	while (!expired)
		event_base_loop(base, EVLOOP_ONCE);
	event_free(guard);
}

/* Start an attempt, check it did not complete re-entrantly, run it to the end. */
static void connect_and_wait(struct event_base *base, const struct ts_outbound *ob,
			     const struct flow_key *k, uint32_t timeout_ms, struct result *r)
{
	struct outbound_conn *c = NULL;
	int ret;

	memset(r, 0, sizeof(*r));
	r->fd = -2;
	ret = outbound_connect(base, ob, k, timeout_ms, on_done, r, &c);
	cr_assert_eq(ret, 0, "outbound_connect: %s", strerror(-ret));
	cr_assert_not_null(c);
	cr_assert_eq(r->calls, 0, "done ran inside outbound_connect");
	cr_assert(run_until_done(base, r, (int)timeout_ms + WAIT_MS), "no result in time");
	cr_assert_eq(r->calls, 1);
	if (r->err)
		cr_assert_eq(r->fd, -1);
	else
		cr_assert_geq(r->fd, 0);
	/* Exactly once: nothing more may arrive. */
	event_base_loop(base, EVLOOP_NONBLOCK);
	cr_assert_eq(r->calls, 1);
}

static void check_socket_flags(int fd)
{
	int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD), nodelay = -1;
	socklen_t len = sizeof(nodelay);

	cr_assert(fl & O_NONBLOCK, "outbound socket must be non-blocking");
	cr_assert(fdfl & FD_CLOEXEC, "outbound socket must be close-on-exec");
	cr_assert_eq(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
	cr_assert_eq(nodelay, 0, "TCP_NODELAY stays off for bulk relays");
}

/* Bytes both ways between the outbound fd and the peer the test holds. */
static void check_bytes_flow(int out_fd, int peer_fd)
{
	uint8_t buf[64];

	cr_assert(write_all(out_fd, (const uint8_t *)"ping", 4, WAIT_MS));
	cr_assert(read_exact(peer_fd, buf, 4, WAIT_MS));
	cr_assert_arr_eq(buf, "ping", 4);
	cr_assert(write_all(peer_fd, (const uint8_t *)"pong!", 5, WAIT_MS));
	cr_assert(read_exact(out_fd, buf, 5, WAIT_MS));
	cr_assert_arr_eq(buf, "pong!", 5);
}

/* ---- outbound_socket ---- */

Test(outbound_socket, flags_mark_and_device)
{
	struct ts_outbound ob;
	uint32_t mark = 0;
	char dev[16] = "";
	socklen_t len = sizeof(mark);
	int fd = -1;

	ob_direct(&ob);
	ob.has_routing_mark = true;
	ob.routing_mark = 0x5a17;
	strcpy(ob.bind_interface, "lo");
	cr_assert_eq(outbound_socket(&ob, 4, SOCK_STREAM, &fd), 0);
	cr_assert(fcntl(fd, F_GETFL) & O_NONBLOCK);
	cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	cr_assert_eq(getsockopt(fd, SOL_SOCKET, SO_MARK, &mark, &len), 0);
	cr_assert_eq(mark, 0x5a17);
	len = sizeof(dev);
	cr_assert_eq(getsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, dev, &len), 0);
	cr_assert_str_eq(dev, "lo");
	close(fd);
	cr_assert_eq(outbound_socket(&ob, 6, SOCK_DGRAM, &fd), 0);
	len = sizeof(mark);
	cr_assert_eq(getsockopt(fd, SOL_SOCKET, SO_MARK, &mark, &len), 0);
	cr_assert_eq(mark, 0x5a17);
	close(fd);
}

Test(outbound_socket, unmarked_by_default)
{
	struct ts_outbound ob;
	uint32_t mark = 1;
	socklen_t len = sizeof(mark);
	int fd = -1;

	ob_direct(&ob);
	cr_assert_eq(outbound_socket(&ob, 6, SOCK_STREAM, &fd), 0);
	cr_assert_eq(getsockopt(fd, SOL_SOCKET, SO_MARK, &mark, &len), 0);
	cr_assert_eq(mark, 0);
	close(fd);
}

/* An IPv6 outbound socket is IPv6 only: an IPv4-mapped destination can never reach IPv4 (the
 * proxy host's loopback, or past rules written for IPv4) through it. */
Test(outbound_socket, ipv6_only)
{
	static const int types[] = { SOCK_STREAM, SOCK_DGRAM };
	struct ts_outbound ob;

	ob_direct(&ob);
	for (int i = 0; i < 2; i++) {
		struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = htons(9) };
		int on = 0, fd = -1;
		socklen_t len = sizeof(on);

		cr_assert_eq(outbound_socket(&ob, 6, types[i], &fd), 0);
		cr_assert_eq(getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, &len), 0);
		cr_assert_eq(on, 1, "type %d: IPV6_V6ONLY", types[i]);
		/* What it means: a mapped address is refused before any packet leaves. */
		inet_pton(AF_INET6, "::ffff:127.0.0.1", &sa.sin6_addr);
		int ret = types[i] == SOCK_STREAM
				  ? connect(fd, (struct sockaddr *)&sa, sizeof(sa))
				  : (int)sendto(fd, "x", 1, 0, (struct sockaddr *)&sa, sizeof(sa));
		cr_assert_eq(ret, -1, "type %d: a mapped destination was accepted", types[i]);
		cr_assert_eq(errno, ENETUNREACH, "type %d: %s", types[i], strerror(errno));
		close(fd);
	}
}

Test(outbound_socket, errors_close_the_fd)
{
	struct ts_outbound ob;
	int fd = -7, before = tu_dir_entries("/proc/self/fd");

	ob_direct(&ob);
	cr_assert_eq(outbound_socket(&ob, 5, SOCK_STREAM, &fd), -EAFNOSUPPORT);
	strcpy(ob.bind_interface, "nosuchdev0");
	cr_assert_eq(outbound_socket(&ob, 4, SOCK_STREAM, &fd), -ENODEV);
	cr_assert_eq(fd, -7, "fd_out untouched on failure");
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), before, "no fd leaked");
}

/* ---- direct ---- */

static void direct_roundtrip(int family)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	uint16_t port;
	int lfd = listen_loopback(family, 16, &port), peer;

	ob_direct(&ob);
	key_loopback(&k, family, port);
	connect_and_wait(base, &ob, &k, 2000, &r);
	cr_assert_eq(r.err, 0, "direct connect: %s", strerror(-r.err));
	cr_assert_eq(r.early_len, 0);
	check_socket_flags(r.fd);
	peer = accept_within(lfd, WAIT_MS);
	cr_assert_geq(peer, 0);
	check_bytes_flow(r.fd, peer);
	close(peer);
	close(r.fd);
	close(lfd);
	event_base_free(base);
}

Test(direct, ipv4_connects_and_bytes_flow)
{
	direct_roundtrip(4);
}

Test(direct, ipv6_connects_and_bytes_flow)
{
	direct_roundtrip(6);
}

Test(direct, refused_promptly)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	int64_t t0;

	ob_direct(&ob);
	for (int family = 4; family <= 6; family += 2) {
		key_loopback(&k, family, free_port(family));
		t0 = now_ms();
		connect_and_wait(base, &ob, &k, 5000, &r);
		cr_assert_eq(r.err, -ECONNREFUSED, "v%d: %s", family, strerror(-r.err));
		cr_assert_lt(r.at_ms - t0, 1000, "refusal must be prompt, took %lld ms",
			     (long long)(r.at_ms - t0));
	}
	event_base_free(base);
}

/* A listener that never accepts, with backlog 0: once its accept queue holds one connection
 * the kernel drops further SYNs, so a connect stays in SYN_SENT — a deterministic timeout
 * without leaving loopback. Returns the listener; the fillers go into fill[]. */
static int full_listener(uint16_t *port, int *fill, int nfill)
{
	int lfd = listen_loopback(4, 0, port), n = 0;
	struct sockaddr_storage ss;
	socklen_t len = loop_sa(4, *port, &ss);

	for (; n < nfill; n++) {
		struct pollfd p;

		fill[n] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		connect(fill[n], (struct sockaddr *)&ss, len);
		p = (struct pollfd){ .fd = fill[n], .events = POLLOUT };
		if (poll(&p, 1, 200) == 0) {
			n++;
			return lfd;  /* this one hangs: the queue is full */
		}
	}
	cr_skip_test("could not fill a loopback accept queue (kernel behaviour differs)");
	return lfd;
}

Test(direct, timeout_on_full_backlog)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	uint16_t port;
	int fill[8], lfd;
	int64_t t0;

	for (size_t i = 0; i < 8; i++)
		fill[i] = -1;
	lfd = full_listener(&port, fill, 8);
	ob_direct(&ob);
	key_loopback(&k, 4, port);
	t0 = now_ms();
	connect_and_wait(base, &ob, &k, 300, &r);
	cr_assert_eq(r.err, -ETIMEDOUT, "%s", strerror(-r.err));
	cr_assert_geq(r.at_ms - t0, 290);
	cr_assert_lt(r.at_ms - t0, 1500);
	for (size_t i = 0; i < 8; i++)
		if (fill[i] >= 0)
			close(fill[i]);
	close(lfd);
	event_base_free(base);
}

Test(direct, routing_mark_and_device_applied)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	uint32_t mark = 0;
	socklen_t len = sizeof(mark);
	uint16_t port;
	int lfd = listen_loopback(4, 16, &port), peer;

	ob_direct(&ob);
	ob.has_routing_mark = true;
	ob.routing_mark = 0xC0FFEE;
	strcpy(ob.bind_interface, "lo");
	key_loopback(&k, 4, port);
	connect_and_wait(base, &ob, &k, 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	cr_assert_eq(getsockopt(r.fd, SOL_SOCKET, SO_MARK, &mark, &len), 0);
	cr_assert_eq(mark, 0xC0FFEE);
	peer = accept_within(lfd, WAIT_MS);
	check_bytes_flow(r.fd, peer);
	close(peer);
	close(r.fd);
	close(lfd);
	event_base_free(base);
}

Test(direct, socket_failure_reported_synchronously)
{
	struct event_base *base = event_base_new();
	struct outbound_conn *c = NULL;
	struct ts_outbound ob;
	struct flow_key k;
	struct result r = { 0 };
	int before = tu_dir_entries("/proc/self/fd");

	ob_direct(&ob);
	strcpy(ob.bind_interface, "nosuchdev0");
	key_loopback(&k, 4, 9);
	cr_assert_eq(outbound_connect(base, &ob, &k, 1000, on_done, &r, &c), -ENODEV);
	run_for(base, 50);
	cr_assert_eq(r.calls, 0, "nothing started: done never runs");
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), before);
	event_base_free(base);
}

Test(outbound, bad_arguments)
{
	struct event_base *base = event_base_new();
	struct outbound_conn *c = NULL;
	struct ts_outbound ob;
	struct flow_key k;
	struct result r = { 0 };

	ob_direct(&ob);
	key_loopback(&k, 4, 9);
	cr_assert_eq(outbound_connect(base, &ob, &k, 0, on_done, &r, &c), -EINVAL);
	cr_assert_eq(outbound_connect(base, &ob, &k, 100, NULL, &r, &c), -EINVAL);
	ob.type = (enum ts_outbound_type)77;
	cr_assert_eq(outbound_connect(base, &ob, &k, 100, on_done, &r, &c), -EINVAL);
	ob_direct(&ob);
	k.family = 5;
	cr_assert_eq(outbound_connect(base, &ob, &k, 100, on_done, &r, &c), -EAFNOSUPPORT);
	ob_socks5(&ob, 4, 1080, NULL, NULL);
	ob.has_server = false;
	key_loopback(&k, 4, 9);
	cr_assert_eq(outbound_connect(base, &ob, &k, 100, on_done, &r, &c), -EINVAL);
	run_for(base, 20);
	cr_assert_eq(r.calls, 0);
	event_base_free(base);
}

/* ---- reject ---- */

Test(reject, refused_from_the_loop)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	int before = tu_dir_entries("/proc/self/fd");

	memset(&ob, 0, sizeof(ob));
	ob.type = TS_OUT_REJECT;
	key_loopback(&k, 6, 443);
	connect_and_wait(base, &ob, &k, 1000, &r);  /* asserts "not re-entrant" */
	cr_assert_eq(r.err, -ECONNREFUSED);
	cr_assert_eq(r.fd, -1);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), before, "reject opens no socket");
	event_base_free(base);
}

/* ---- cancel ---- */

Test(cancel, at_every_stage_done_never_runs)
{
	struct event_base *base = event_base_new();
	struct outbound_conn *c;
	struct ts_outbound ob;
	struct flow_key k;
	struct result r = { 0 };
	uint16_t port, sport;
	int fill[8], lfd, slfd, before;

	for (size_t i = 0; i < 8; i++)
		fill[i] = -1;
	lfd = full_listener(&port, fill, 8);
	slfd = listen_loopback(4, 16, &sport);  /* a "SOCKS5 server" that never answers */
	before = tu_dir_entries("/proc/self/fd");

	/* reject: cancelled before the loop runs its deferred result */
	memset(&ob, 0, sizeof(ob));
	ob.type = TS_OUT_REJECT;
	key_loopback(&k, 4, port);
	cr_assert_eq(outbound_connect(base, &ob, &k, 1000, on_done, &r, &c), 0);
	outbound_conn_cancel(c);
	/* direct: connect hanging in SYN_SENT */
	ob_direct(&ob);
	cr_assert_eq(outbound_connect(base, &ob, &k, 200, on_done, &r, &c), 0);
	run_for(base, 50);
	outbound_conn_cancel(c);
	/* direct: immediate refusal deferred, cancelled before delivery */
	key_loopback(&k, 4, free_port(4));
	cr_assert_eq(outbound_connect(base, &ob, &k, 200, on_done, &r, &c), 0);
	outbound_conn_cancel(c);
	/* socks5: connected, greeting sent, waiting for the method reply */
	ob_socks5(&ob, 4, sport, "u", "p");
	key_loopback(&k, 4, port);
	cr_assert_eq(outbound_connect(base, &ob, &k, 200, on_done, &r, &c), 0);
	run_for(base, 50);
	outbound_conn_cancel(c);

	run_for(base, 400);  /* past every deadline */
	cr_assert_eq(r.calls, 0, "done ran after cancel");
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), before, "cancel closes every socket");
	for (size_t i = 0; i < 8; i++)
		if (fill[i] >= 0)
			close(fill[i]);
	close(slfd);
	close(lfd);
	event_base_free(base);
}

/* ---- a scripted fake SOCKS5 server (a thread on 127.0.0.1 or ::1) ---- */

enum step_kind { ST_END, ST_EXPECT, ST_SEND, ST_TRICKLE, ST_CLOSE, ST_HOLD, ST_ECHO };

struct step {
	enum step_kind kind;
	const uint8_t *data;
	size_t len;
};

struct fake {
	int lfd;
	uint16_t port;
	struct step steps[8];
	pthread_t th;
	bool ok;
	char why[160];
};

#define STEP(k, arr) ((struct step){ (k), (arr), sizeof(arr) })

/* Echo until the peer closes (true) or WAIT_MS of silence (false). NODELAY and a large
 * buffer: Nagle plus delayed ACKs would otherwise stall the echo for 40 ms per chunk. */
static bool echo_until_eof(int fd)
{
	static _Thread_local uint8_t buf[65536];
	int one = 1;
	ssize_t n;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, WAIT_MS) != 1)
			return false;
		n = recv(fd, buf, sizeof(buf), 0);
		if (n <= 0)
			return n == 0;
		if (!write_all(fd, buf, (size_t)n, WAIT_MS))
			return false;
	}
}

static bool fake_step(struct fake *f, int fd, const struct step *s)
{
	uint8_t buf[1024];

	switch (s->kind) {
	case ST_EXPECT:
		if (!read_exact(fd, buf, s->len, WAIT_MS)) {
			snprintf(f->why, sizeof(f->why), "expected %zu bytes, got fewer", s->len);
			return false;
		}
		if (memcmp(buf, s->data, s->len) != 0) {
			tu_dump("fake got", buf, s->len);
			tu_dump("fake want", s->data, s->len);
			snprintf(f->why, sizeof(f->why), "unexpected request bytes");
			return false;
		}
		return true;
	case ST_SEND:
		return write_all(fd, s->data, s->len, WAIT_MS);
	case ST_TRICKLE:  /* one byte per segment: the client must reassemble */
		for (size_t i = 0; i < s->len; i++) {
			if (!write_all(fd, s->data + i, 1, WAIT_MS))
				return false;
			usleep(5000);
		}
		return true;
	case ST_HOLD:  /* say nothing until the client gives up (bounded) */
		return read_exact(fd, buf, 1, 2 * WAIT_MS) == false;
	case ST_ECHO:
		return echo_until_eof(fd);
	default:
		return true;
	}
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	int fd = accept_within(f->lfd, WAIT_MS);

	f->ok = false;
	if (fd < 0) {
		snprintf(f->why, sizeof(f->why), "no client connected");
		return NULL;
	}
	for (size_t i = 0; i < 8 && f->steps[i].kind != ST_END; i++) {
		if (f->steps[i].kind == ST_CLOSE)
			break;
		if (!fake_step(f, fd, &f->steps[i])) {
			if (!f->why[0])
				snprintf(f->why, sizeof(f->why), "step %zu failed", i);
			close(fd);
			return NULL;
		}
	}
	close(fd);
	f->ok = true;
	return NULL;
}

static void fake_start(struct fake *f, int family)
{
	f->lfd = listen_loopback(family, 4, &f->port);
	f->why[0] = '\0';
	cr_assert_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_join(struct fake *f)
{
	pthread_join(f->th, NULL);
	close(f->lfd);
	cr_assert(f->ok, "fake server: %s", f->why);
}

/* The CONNECT request the client must send for the loopback destination of family:port. */
static size_t connect_req(uint8_t *buf, int family, uint16_t port)
{
	struct socks5_addr a;
	uint8_t ip[16];

	tu_addr(ip, family == 4 ? "127.0.0.1" : "::1");
	cr_assert_eq(socks5_addr_ip(&a, family, ip, port), 0);
	return (size_t)socks5_build_connect(buf, SOCKS5_REQUEST_MAX, &a);
}

static const uint8_t GREET_NOAUTH[] = { 5, 1, 0 };
static const uint8_t GREET_AUTH[] = { 5, 2, 0, 2 };
static const uint8_t PICK_NOAUTH[] = { 5, 0 };
static const uint8_t PICK_USERPASS[] = { 5, 2 };
static const uint8_t AUTH_REQ[] = { 1, 5, 'a', 'l', 'i', 'c', 'e', 6, 's', 'e', 'c', 'r', 'e', 't' };
static const uint8_t AUTH_OK[] = { 1, 0 };
static const uint8_t AUTH_FAIL[] = { 1, 1 };
/* Success with an odd BND.ADDR (0.0.0.0:0) and five early bytes in the same segment. */
static const uint8_t REPLY_OK_EARLY[] = { 5, 0, 0, 1, 0, 0, 0, 0, 0, 0, 'E', 'A', 'R', 'L', 'Y' };
static const uint8_t REPLY_OK_DOMAIN[] = { 5, 0, 0, 3, 9, 'l', 'o', 'c', 'a', 'l', 'h', 'o', 's',
					   't', 0x04, 0x38 };
static const uint8_t REPLY_OK_LO6[] = { 5, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
					1, 0x1f, 0x90 };

/* Run one socks5 attempt against the fake server with the given script. */
static void socks5_run(struct fake *f, int srv_family, int dst_family, const char *user,
		       const char *pass, uint32_t timeout_ms, struct result *r)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;

	ob_socks5(&ob, srv_family, f->port, user, pass);
	key_loopback(&k, dst_family, 8080);
	connect_and_wait(base, &ob, &k, timeout_ms, r);
	event_base_free(base);
}

static void socks5_success_early(int srv_family, int dst_family)
{
	uint8_t req[SOCKS5_REQUEST_MAX], buf[16];
	size_t req_len = connect_req(req, dst_family, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_EARLY), { ST_ECHO, NULL, 0 } } };
	struct result r;

	fake_start(&f, srv_family);
	socks5_run(&f, srv_family, dst_family, NULL, NULL, 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	cr_assert_eq(r.early_len, 5);
	cr_assert_arr_eq(r.early, "EARLY", 5);
	check_socket_flags(r.fd);
	/* The stream continues past the handshake: the fake server now echoes. */
	cr_assert(write_all(r.fd, (const uint8_t *)"relay", 5, WAIT_MS));
	cr_assert(read_exact(r.fd, buf, 5, WAIT_MS));
	cr_assert_arr_eq(buf, "relay", 5);
	close(r.fd);
	fake_join(&f);
}

Test(socks5_fake, success_with_early_bytes_v4)
{
	socks5_success_early(4, 4);
}

Test(socks5_fake, success_ipv6_server_and_destination)
{
	socks5_success_early(6, 6);
}

Test(socks5_fake, success_v4_server_v6_destination)
{
	socks5_success_early(4, 6);
}

Test(socks5_fake, auth_success_trickled_replies)
{
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_AUTH), STEP(ST_TRICKLE, PICK_USERPASS),
		STEP(ST_EXPECT, AUTH_REQ), STEP(ST_TRICKLE, AUTH_OK),
		{ ST_EXPECT, req, req_len }, STEP(ST_TRICKLE, REPLY_OK_DOMAIN) } };
	struct result r;

	fake_start(&f, 4);
	socks5_run(&f, 4, 4, "alice", "secret", 3000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	cr_assert_eq(r.early_len, 0);
	close(r.fd);
	fake_join(&f);
}

Test(socks5_fake, auth_offered_server_needs_none)
{
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_AUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_LO6) } };
	struct result r;

	fake_start(&f, 4);
	socks5_run(&f, 4, 4, "alice", "secret", 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	close(r.fd);
	fake_join(&f);
}

Test(socks5_fake, auth_failure)
{
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_AUTH), STEP(ST_SEND, PICK_USERPASS),
		STEP(ST_EXPECT, AUTH_REQ), STEP(ST_SEND, AUTH_FAIL) } };
	struct result r;

	fake_start(&f, 4);
	socks5_run(&f, 4, 4, "alice", "secret", 2000, &r);
	cr_assert_eq(r.err, -EACCES, "%s", strerror(-r.err));
	fake_join(&f);
}

Test(socks5_fake, no_acceptable_method)
{
	static const uint8_t none[] = { 5, 0xff };
	struct fake f = { .steps = { STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, none) } };
	struct result r;

	fake_start(&f, 4);
	socks5_run(&f, 4, 4, NULL, NULL, 2000, &r);
	cr_assert_eq(r.err, -EACCES, "%s", strerror(-r.err));
	fake_join(&f);
}

Test(socks5_fake, reply_codes_mapped)
{
	static const struct {
		uint8_t rep;
		int err;
	} map[] = {
		{ 1, -EPROTO }, { 2, -EACCES }, { 3, -ENETUNREACH }, { 4, -EHOSTUNREACH },
		{ 5, -ECONNREFUSED }, { 6, -ETIMEDOUT }, { 7, -EPROTO }, { 8, -EPROTO },
		{ 0x42, -EPROTO },
	};
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);

	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
		uint8_t rep[10] = { 5, map[i].rep, 0, 1, 0, 0, 0, 0, 0, 0 };
		struct fake f = { .steps = {
			STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
			{ ST_EXPECT, req, req_len }, STEP(ST_SEND, rep) } };
		struct result r;

		fake_start(&f, 4);
		socks5_run(&f, 4, 4, NULL, NULL, 2000, &r);
		cr_assert_eq(r.err, map[i].err, "REP 0x%02x: %s", map[i].rep, strerror(-r.err));
		fake_join(&f);
	}
}

Test(socks5_fake, server_closes_mid_handshake)
{
	static const uint8_t half_reply[] = { 5, 0, 0, 1, 127 };
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct step scripts[4][8] = {
		{ { ST_CLOSE, NULL, 0 } },  /* accepts and closes at once */
		{ STEP(ST_EXPECT, GREET_NOAUTH), { ST_CLOSE, NULL, 0 } },
		{ STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		  { ST_EXPECT, req, req_len }, { ST_CLOSE, NULL, 0 } },
		{ STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		  { ST_EXPECT, req, req_len }, STEP(ST_SEND, half_reply), { ST_CLOSE, NULL, 0 } },
	};

	for (size_t i = 0; i < 4; i++) {
		struct fake f = { 0 };
		struct result r;

		memcpy(f.steps, scripts[i], sizeof(f.steps));
		fake_start(&f, 4);
		socks5_run(&f, 4, 4, NULL, NULL, 2000, &r);
		/* A FIN is -EPROTO; a RST (data unread at close) may surface as -ECONNRESET. */
		cr_assert(r.err == -EPROTO || r.err == -ECONNRESET, "script %zu: %s", i,
			  strerror(-r.err));
		fake_join(&f);
	}
}

Test(socks5_fake, garbage_is_protocol_error)
{
	static const uint8_t http[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
	struct fake f = { .steps = { STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, http) } };
	struct result r;

	fake_start(&f, 4);
	socks5_run(&f, 4, 4, NULL, NULL, 2000, &r);
	cr_assert_eq(r.err, -EPROTO, "%s", strerror(-r.err));
	fake_join(&f);
}

Test(socks5_fake, silent_server_times_out)
{
	struct fake f = { .steps = { STEP(ST_EXPECT, GREET_NOAUTH), { ST_HOLD, NULL, 0 } } };
	struct result r;
	int64_t t0 = now_ms();

	fake_start(&f, 4);
	socks5_run(&f, 4, 4, NULL, NULL, 300, &r);
	cr_assert_eq(r.err, -ETIMEDOUT, "%s", strerror(-r.err));
	cr_assert_geq(r.at_ms - t0, 290);
	cr_assert_lt(r.at_ms - t0, 1500);
	fake_join(&f);  /* HOLD ends when the client's close arrives */
}

Test(socks5_fake, server_port_closed)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;

	ob_socks5(&ob, 4, free_port(4), NULL, NULL);
	key_loopback(&k, 4, 80);
	connect_and_wait(base, &ob, &k, 2000, &r);
	cr_assert_eq(r.err, -ECONNREFUSED, "%s", strerror(-r.err));
	event_base_free(base);
}

Test(socks5_fake, socket_marked)
{
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_LO6) } };
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	uint32_t mark = 0;
	socklen_t len = sizeof(mark);

	fake_start(&f, 4);
	ob_socks5(&ob, 4, f.port, NULL, NULL);
	ob.has_routing_mark = true;
	ob.routing_mark = 77;
	strcpy(ob.bind_interface, "lo");
	key_loopback(&k, 4, 8080);
	connect_and_wait(base, &ob, &k, 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	cr_assert_eq(getsockopt(r.fd, SOL_SOCKET, SO_MARK, &mark, &len), 0);
	cr_assert_eq(mark, 77);
	close(r.fd);
	fake_join(&f);
	event_base_free(base);
}

/* A server given by name is resolved at connect time; "localhost" comes from /etc/hosts. */
Test(socks5_fake, server_by_host_name)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res;
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_EARLY) } };
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	int family;

	if (getaddrinfo("localhost", NULL, &hints, &res) != 0)
		cr_skip_test("localhost does not resolve here");
	family = res->ai_family == AF_INET6 ? 6 : 4;  /* the first answer is the one dialled */
	freeaddrinfo(res);
	fake_start(&f, family);
	ob_socks5(&ob, 4, f.port, NULL, NULL);
	ob.server.is_addr = false;
	memset(&ob.server.addr, 0, sizeof(ob.server.addr));
	strcpy(ob.server.host, "localhost");
	key_loopback(&k, 4, 8080);
	connect_and_wait(base, &ob, &k, 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	cr_assert_eq(r.early_len, 5);
	close(r.fd);
	fake_join(&f);
	event_base_free(base);
}

/* ---- a server given by a name that is not pinned: the resolver, Happy Eyeballs ---- */

static const struct rr NAMES[] = {
	{ .name = "socks.test", .ttl = 60, .a = { "127.0.0.1" } },
	/* AAAA first (RFC 8305 order) to an address whose SYNs go nowhere, A to the server. */
	{ .name = "he.test", .ttl = 60, .a = { "127.0.0.1" }, .aaaa = { "fd00:dead::1" } },
	{ .name = NULL },
};

static void sh(const char *cmd)
{
	CHECK(system(cmd) == 0, "%s", cmd);
}

static void ob_socks5_name(struct ts_outbound *ob, uint16_t port, const char *name)
{
	ob_socks5(ob, 4, port, NULL, NULL);
	ob->server.is_addr = false;
	memset(&ob->server.addr, 0, sizeof(ob->server.addr));
	strcpy(ob->server.host, name);
}

/* The fake server's verdict, from a forked child (no Criterion assertion there). */
static void fake_join_child(struct fake *f)
{
	pthread_join(f->th, NULL);
	close(f->lfd);
	CHECK(f->ok, "fake server: %s", f->why);
}

/* With the system's configuration (/etc/resolv.conf, here a copy of our own naming a DNS server
 * that answers 300 ms late), outbound_connect returns at once: the lookup runs on the loop. */
static void name_without_blocking_scenario(void)
{
	char conf[] = "/tmp/ts-resolv-XXXXXX";
	static const char text[] = "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n";
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_EARLY) } };
	struct event_base *base = event_base_new();
	struct outbound_conn *c = NULL;
	struct ts_outbound ob;
	struct flow_key k;
	struct result r = { .fd = -2 };
	struct dns d;
	int64_t t0, dt;
	int fd, ret;

	sh("ip link set lo up");
	fd = mkstemp(conf);
	CHECK(fd >= 0 && write(fd, text, sizeof(text) - 1) == (ssize_t)sizeof(text) - 1, "%s",
	      strerror(errno));
	close(fd);
	CHECK(mount(conf, "/etc/resolv.conf", NULL, MS_BIND, NULL) == 0, "bind mount: %s",
	      strerror(errno));
	dns_thread_start(&d, NAMES, 53, 300);
	fake_start(&f, 4);
	ob_socks5_name(&ob, f.port, "socks.test");
	ob.has_routing_mark = true;
	ob.routing_mark = 0x55;
	key_loopback(&k, 4, 8080);
	t0 = now_ms();
	ret = outbound_connect(base, &ob, &k, 3000, on_done, &r, &c);
	dt = now_ms() - t0;
	CHECK(ret == 0, "outbound_connect: %s", strerror(-ret));
	CHECK(dt < 150, "outbound_connect blocked the loop for %lld ms", (long long)dt);
	CHECK(run_until_done(base, &r, 5000), "no result");
	CHECK(r.err == 0, "%s", strerror(-r.err));
	CHECK(r.early_len == 5, "%zu early bytes", r.early_len);
	CHECK(r.at_ms - t0 >= 250, "connected before the DNS answer (%lld ms)",
	      (long long)(r.at_ms - t0));
	close(r.fd);
	fake_join_child(&f);
	dns_thread_stop(&d);
	CHECK(d.queries >= 1, "the system's DNS server was never asked");
	umount(conf);
	unlink(conf);
	event_base_free(base);
}

Test(socks5_name, resolved_without_blocking_the_loop, .timeout = 30)
{
	run_in_netns(name_without_blocking_scenario);
}

/* fd00:dead::/64 routed by way of a neighbour that never answers: SYNs to it never leave. */
static void unreachable_v6_setup(void)
{
	sh("ip link set lo up && ip link add he0 type veth peer name he1 && "
	   "ip link set he0 up && ip link set he1 up && "
	   "ip -6 addr add fd00:beef::1/64 dev he0 nodad && "
	   "ip -6 route add fd00:dead::/64 via fd00:beef::2 dev he0");
}

/* AAAA leads to fd00:dead::1, routed by way of a neighbour that never answers (its SYNs never
 * leave), A to the server on 127.0.0.1: connected by IPv4 once the Connection Attempt Delay of
 * 250 ms passed, long before the IPv6 attempt could time out. With the proxy's budget, the
 * IPv4 socket, open beside the hanging IPv6 one, holds a descriptor of its own (fds_peak 1
 * here, where the caller reserved none), given back at the end; with no descriptor left, no
 * second socket opens (nothing reaches the IPv4 listener) and the attempt times out. */
static void happy_eyeballs_scenario(void)
{
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_EARLY) } };
	struct event_base *base = event_base_new();
	struct outbound_conn *c = NULL;
	struct resolver_config cfg = { .timeout_ms = 1000, .tries = 1 };
	struct resolver *res = NULL;
	struct budget_limits lim;
	struct budget_stats bs;
	struct budget *b = NULL;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t slen = sizeof(sin);
	struct ts_outbound ob;
	struct flow_key k;
	struct result r = { .fd = -2 };
	struct dns d;
	int64_t t0, took;
	int lfd, ret;

	unreachable_v6_setup();
	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	lim.fds = 4;
	CHECK(budget_new(&lim, &b) == 0, "budget_new");
	dns_start(&d, base, NAMES);
	cfg.servers = d.servers;
	CHECK(resolver_new(base, &cfg, &res) == 0, "resolver_new");
	fake_start(&f, 4);
	ob_socks5_name(&ob, f.port, "he.test");
	ob.resolver = res;
	ob.fd_budget = b;
	key_loopback(&k, 4, 8080);
	t0 = now_ms();
	ret = outbound_connect(base, &ob, &k, 5000, on_done, &r, &c);
	CHECK(ret == 0, "outbound_connect: %s", strerror(-ret));
	CHECK(run_until_done(base, &r, 6000), "no result");
	took = r.at_ms - t0;
	CHECK(r.err == 0, "%s after %lld ms", strerror(-r.err), (long long)took);
	CHECK(took >= 240, "IPv4 tried before the delay (%lld ms): was IPv6 not first?",
	      (long long)took);
	CHECK(took < 1500, "took %lld ms: IPv4 waited for the IPv6 attempt", (long long)took);
	CHECK(d.q_a == 1 && d.q_aaaa == 1, "%d A, %d AAAA queries", d.q_a, d.q_aaaa);
	budget_get_stats(b, &bs);
	CHECK(bs.fds_peak == 1, "fds_peak %u: the IPv4 socket beside the IPv6 one", bs.fds_peak);
	CHECK(bs.fds_in_use == 0, "%u descriptors still held", bs.fds_in_use);
	close(r.fd);
	fake_join_child(&f);

	/* No descriptor left: the IPv4 attempt never opens; the connection times out. */
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
	      listen(lfd, 8) == 0 && getsockname(lfd, (struct sockaddr *)&sin, &slen) == 0,
	      "listener: %s", strerror(errno));
	CHECK(budget_fd_reserve(b, 4) == 0, "the whole budget");
	ob_socks5_name(&ob, ntohs(sin.sin_port), "he.test");
	ob.resolver = res;
	ob.fd_budget = b;
	r = (struct result){ .fd = -2 };
	ret = outbound_connect(base, &ob, &k, 1000, on_done, &r, &c);
	CHECK(ret == 0, "outbound_connect: %s", strerror(-ret));
	CHECK(run_until_done(base, &r, 3000), "no result");
	CHECK(r.err == -ETIMEDOUT, "%s, want a timeout", strerror(-r.err));
	CHECK(accept(lfd, NULL, NULL) < 0 && errno == EAGAIN,
	      "an IPv4 connection was made with no descriptor for it");
	budget_get_stats(b, &bs);
	CHECK(bs.fds_in_use == 4 && bs.fds_peak == 4, "in use %u, peak %u", bs.fds_in_use,
	      bs.fds_peak);
	budget_fd_release(b, 4);
	close(lfd);
	resolver_free(res);
	dns_stop(&d);
	budget_free(b);
	event_base_free(base);
}

Test(socks5_name, happy_eyeballs_falls_back_to_ipv4_after_the_delay_within_the_budget,
     .timeout = 30)
{
	run_in_netns(happy_eyeballs_scenario);
}

/* A shared resolver: the first attempt asks, the second is answered from its cache; an unknown
 * name fails the attempt (from the loop) with -ENXIO. */
Test(socks5_name, shared_resolver_caches_and_unknown_name_fails)
{
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct step script[] = {
		STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_EARLY) };
	struct event_base *base = event_base_new();
	struct resolver_config cfg = { .timeout_ms = 1000, .tries = 1 };
	struct resolver *res = NULL;
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	struct dns d;

	dns_start(&d, base, NAMES);
	cfg.servers = d.servers;
	cr_assert_eq(resolver_new(base, &cfg, &res), 0);
	key_loopback(&k, 4, 8080);
	for (int i = 0; i < 2; i++) {
		struct fake f = { 0 };

		memcpy(f.steps, script, sizeof(script));
		fake_start(&f, 4);
		ob_socks5_name(&ob, f.port, "socks.test");
		ob.resolver = res;
		connect_and_wait(base, &ob, &k, 2000, &r);
		cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
		cr_assert_eq(r.early_len, 5);
		close(r.fd);
		fake_join(&f);
		cr_assert_eq(d.queries, 2, "attempt %d: the name is asked once", i);
	}
	ob_socks5_name(&ob, 9, "nosuch.test");
	ob.resolver = res;
	connect_and_wait(base, &ob, &k, 2000, &r);
	cr_assert_eq(r.err, -ENXIO, "%d", r.err);
	resolver_free(res);
	dns_stop(&d);
	event_base_free(base);
}

/* ---- the real microsocks ---- */

struct echo {
	int lfd;
	uint16_t port;
	pthread_t th;
};

static void *echo_main(void *arg)
{
	struct echo *e = arg;
	int fd = accept_within(e->lfd, 2 * WAIT_MS);

	if (fd >= 0) {
		echo_until_eof(fd);
		close(fd);
	}
	return NULL;
}

static void echo_start(struct echo *e, int family)
{
	e->lfd = listen_loopback(family, 4, &e->port);
	cr_assert_eq(pthread_create(&e->th, NULL, echo_main, e), 0);
}

static void echo_stop(struct echo *e)
{
	shutdown(e->lfd, SHUT_RDWR);  /* wakes an accept that never got a client */
	pthread_join(e->th, NULL);
	close(e->lfd);
}

static const char *const MICROSOCKS = "/usr/bin/microsocks";

/* Start microsocks on 127.0.0.1:port; returns its pid once it accepts connections. */
static pid_t microsocks_start(uint16_t *port, const char *user, const char *pass)
{
	char portstr[8];
	pid_t pid;

	if (access(MICROSOCKS, X_OK) != 0)
		cr_skip_test("microsocks not installed (Debian package microsocks): skipping the "
			     "real-server tests");
	*port = free_port(4);
	snprintf(portstr, sizeof(portstr), "%u", *port);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		prctl(PR_SET_PDEATHSIG, SIGKILL);  /* never outlive a crashed test */
		if (null >= 0) {  /* microsocks logs every client to stdout */
			dup2(null, STDOUT_FILENO);
			dup2(null, STDERR_FILENO);
		}
		if (user)
			execl(MICROSOCKS, "microsocks", "-i", "127.0.0.1", "-p", portstr, "-u",
			      user, "-P", pass, (char *)NULL);
		else
			execl(MICROSOCKS, "microsocks", "-i", "127.0.0.1", "-p", portstr,
			      (char *)NULL);
		_exit(127);
	}
	for (int64_t end = now_ms() + WAIT_MS; now_ms() < end; usleep(20000)) {
		struct sockaddr_storage ss;
		socklen_t len = loop_sa(4, *port, &ss);
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int ok = connect(fd, (struct sockaddr *)&ss, len) == 0;

		close(fd);
		if (ok)
			return pid;
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	cr_assert_fail("microsocks did not start listening on 127.0.0.1:%u", *port);
	return -1;
}

static void microsocks_stop(pid_t pid)
{
	int status;

	kill(pid, SIGTERM);
	for (int i = 0; i < 100; i++) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
}

/* Through microsocks to the echo server, 256 KiB each way, checked byte for byte. */
static void microsocks_echo(int dst_family, const char *user, const char *pass)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	struct echo e;
	struct tu_rng rng;
	size_t total = 256 * 1024;
	uint8_t *out = malloc(total), *in = malloc(total);
	uint16_t sport;
	pid_t pid = microsocks_start(&sport, user, pass);

	echo_start(&e, dst_family);
	ob_socks5(&ob, 4, sport, user, pass);
	key_loopback(&k, dst_family, e.port);
	connect_and_wait(base, &ob, &k, 3000, &r);
	cr_assert_eq(r.err, 0, "via microsocks: %s", strerror(-r.err));
	cr_assert_eq(r.early_len, 0);
	tu_rng_seed(&rng, 42);
	tu_rand_bytes(&rng, out, total);
	/* Write and read in chunks so neither direction's buffers fill up. */
	for (size_t off = 0; off < total; off += 16384) {
		cr_assert(write_all(r.fd, out + off, 16384, WAIT_MS));
		cr_assert(read_exact(r.fd, in + off, 16384, WAIT_MS), "echo stalled at %zu", off);
	}
	cr_assert_arr_eq(in, out, total);
	close(r.fd);
	echo_stop(&e);
	microsocks_stop(pid);
	free(out);
	free(in);
	event_base_free(base);
}

Test(socks5_microsocks, noauth_echo_v4)
{
	microsocks_echo(4, NULL, NULL);
}

Test(socks5_microsocks, noauth_echo_v6_destination)
{
	microsocks_echo(6, NULL, NULL);
}

Test(socks5_microsocks, userpass_echo)
{
	microsocks_echo(4, "tsuser", "tspass");
}

Test(socks5_microsocks, wrong_password_refused)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	uint16_t sport;
	pid_t pid = microsocks_start(&sport, "tsuser", "tspass");

	ob_socks5(&ob, 4, sport, "tsuser", "wrong");
	key_loopback(&k, 4, free_port(4));
	connect_and_wait(base, &ob, &k, 3000, &r);
	cr_assert_eq(r.err, -EACCES, "%s", strerror(-r.err));
	/* Without credentials microsocks offers no method we could use. */
	ob_socks5(&ob, 4, sport, NULL, NULL);
	connect_and_wait(base, &ob, &k, 3000, &r);
	cr_assert_eq(r.err, -EACCES, "%s", strerror(-r.err));
	microsocks_stop(pid);
	event_base_free(base);
}

Test(socks5_microsocks, destination_refused)
{
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	uint16_t sport;
	pid_t pid = microsocks_start(&sport, NULL, NULL);

	ob_socks5(&ob, 4, sport, NULL, NULL);
	key_loopback(&k, 4, free_port(4));
	connect_and_wait(base, &ob, &k, 3000, &r);
	/* microsocks maps ECONNREFUSED to REP 5. */
	cr_assert_eq(r.err, -ECONNREFUSED, "%s", strerror(-r.err));
	microsocks_stop(pid);
	event_base_free(base);
}

/* ---- http: a fake HTTP CONNECT proxy thread (reads the request head, answers a scripted
 * response, then echoes the tunnel until EOF) ---- */

struct hfake {
	int lfd;
	uint16_t port;
	pthread_t th;
	const char *reply;     /* the response bytes, sent in one write */
	size_t reply_len;      /* 0: strlen(reply) */
	bool echo;             /* after the reply, echo until EOF */
	char req[4096];        /* the request head received */
	size_t req_len;
	bool ok;
};

static void *hfake_main(void *arg)
{
	struct hfake *f = arg;
	int fd = accept_within(f->lfd, WAIT_MS);

	if (fd < 0)
		return NULL;
	while (!strstr(f->req, "\r\n\r\n") && f->req_len < sizeof(f->req) - 1) {
		if (!read_exact(fd, (uint8_t *)f->req + f->req_len, 1, WAIT_MS))
			goto out;
		f->req_len++;
	}
	if (!write_all(fd, (const uint8_t *)f->reply,
		       f->reply_len ? f->reply_len : strlen(f->reply), WAIT_MS))
		goto out;
	f->ok = f->echo ? echo_until_eof(fd) : true;
out:
	close(fd);
	return NULL;
}

static void hfake_start(struct hfake *f, int family)
{
	f->lfd = listen_loopback(family, 4, &f->port);
	cr_assert_eq(pthread_create(&f->th, NULL, hfake_main, f), 0);
}

static void hfake_join(struct hfake *f)
{
	pthread_join(f->th, NULL);
	close(f->lfd);
}

static void ob_http(struct ts_outbound *ob, int family, uint16_t port, const char *user,
		    const char *pass)
{
	ob_socks5(ob, family, port, user, pass);
	ob->type = TS_OUT_HTTP;
}

/* One attempt through a fake proxy answering reply; r gets the result. */
static void http_run(struct hfake *f, struct ts_outbound *ob, int dst_family, struct result *r)
{
	struct event_base *base = event_base_new();
	struct flow_key k;

	key_loopback(&k, dst_family, 8443);
	connect_and_wait(base, ob, &k, 2000, r);
	event_base_free(base);
}

static void http_success(int srv_family, int dst_family)
{
	struct hfake f = { .reply = "HTTP/1.1 200 Connection established\r\n"
				   "Proxy-Agent: fake\r\n\r\nEARLY",
			   .echo = true };
	struct ts_outbound ob;
	struct result r;
	uint8_t buf[5];
	int before = tu_dir_entries("/proc/self/fd");

	hfake_start(&f, srv_family);
	ob_http(&ob, srv_family, f.port, NULL, NULL);
	http_run(&f, &ob, dst_family, &r);
	cr_assert_eq(r.err, 0, "err %s", strerror(-r.err));
	check_socket_flags(r.fd);
	cr_assert_eq(r.early_len, 5);
	cr_assert_arr_eq(r.early, "EARLY", 5);
	cr_assert(write_all(r.fd, (const uint8_t *)"hello", 5, WAIT_MS));
	cr_assert(read_exact(r.fd, buf, 5, WAIT_MS));
	cr_assert_arr_eq(buf, "hello", 5, "bytes flow through the tunnel");
	shutdown(r.fd, SHUT_WR);
	hfake_join(&f);
	cr_assert(f.ok);
	if (dst_family == 4)
		cr_assert_str_eq(f.req, "CONNECT 127.0.0.1:8443 HTTP/1.1\r\nHost: 127.0.0.1:8443\r\n\r\n");
	else
		cr_assert_str_eq(f.req, "CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n");
	close(r.fd);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), before);
}

Test(http_fake, success_with_early_bytes_v4)
{
	http_success(4, 4);
}

Test(http_fake, success_ipv6_server_and_destination)
{
	http_success(6, 6);
}

Test(http_fake, basic_auth_and_extra_headers_sent)
{
	struct hfake f = { .reply = "HTTP/1.0 200 OK\r\n\r\n" };
	struct ts_outbound ob;
	struct result r;

	hfake_start(&f, 4);
	ob_http(&ob, 4, f.port, "Aladdin", "open sesame");
	strcpy(ob.http_headers, "X-Tenant: a\r\nUser-Agent: ts\r\n");
	http_run(&f, &ob, 4, &r);
	hfake_join(&f);
	cr_assert_eq(r.err, 0);
	cr_assert_eq(r.early_len, 0);
	cr_assert_str_eq(f.req, "CONNECT 127.0.0.1:8443 HTTP/1.1\r\nHost: 127.0.0.1:8443\r\n"
				"Proxy-Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==\r\n"
				"X-Tenant: a\r\nUser-Agent: ts\r\n\r\n");
	close(r.fd);
}

static void http_refused(const char *reply, size_t reply_len, int want)
{
	struct hfake f = { .reply = reply, .reply_len = reply_len };
	struct ts_outbound ob;
	struct result r;
	int before = tu_dir_entries("/proc/self/fd");

	hfake_start(&f, 4);
	ob_http(&ob, 4, f.port, NULL, NULL);
	http_run(&f, &ob, 4, &r);
	hfake_join(&f);
	cr_assert_eq(r.err, want, "%s: got %d (%s), want %d", reply, r.err, strerror(-r.err),
		     want);
	cr_assert_eq(r.fd, -1);
	cr_assert_eq(r.early_len, 0);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), before);
}

Test(http_fake, statuses_map_to_errors)
{
	http_refused("HTTP/1.1 407 Proxy Authentication Required\r\n"
		     "Proxy-Authenticate: Basic realm=\"p\"\r\nContent-Length: 0\r\n\r\n", 0, -EACCES);
	http_refused("HTTP/1.1 403 Forbidden\r\n\r\n", 0, -ECONNREFUSED);
	http_refused("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n\r\nbad", 0, -ECONNREFUSED);
	http_refused("SSH-2.0-OpenSSH_9.2\r\n", 0, -EPROTO);
	http_refused("HTTP/1.1 200 OK\r\n", 0, -EPROTO);  /* closed before the head ended */
}

Test(http_fake, oversize_head_fails)
{
	size_t n = HTTP_RESP_MAX + 512;
	char *b = malloc(n);

	memcpy(b, "HTTP/1.1 200 OK\r\n", 17);
	for (size_t i = 17; i < n; i++)
		b[i] = (i - 17) % 32 == 31 ? '\n' : (i - 17) % 32 == 0 ? 'X' : (i - 17) % 32 == 1 ? ':' : 'a';
	http_refused(b, n, -EMSGSIZE);
	free(b);
}

Test(http_fake, timeout_when_the_proxy_never_answers)
{
	struct ts_outbound ob;
	struct result r;
	struct event_base *base = event_base_new();
	struct flow_key k;
	uint16_t port;
	int lfd = listen_loopback(4, 4, &port);  /* accepts (backlog) but never answers */
	int64_t t0 = now_ms();

	ob_http(&ob, 4, port, NULL, NULL);
	key_loopback(&k, 4, 8443);
	connect_and_wait(base, &ob, &k, 300, &r);
	cr_assert_eq(r.err, -ETIMEDOUT);
	cr_assert_geq(r.at_ms - t0, 250);
	close(lfd);
	event_base_free(base);
}

Test(http_fake, refused_when_nothing_listens)
{
	struct ts_outbound ob;
	struct result r;
	struct event_base *base = event_base_new();
	struct flow_key k;

	ob_http(&ob, 4, free_port(4), NULL, NULL);
	key_loopback(&k, 4, 8443);
	connect_and_wait(base, &ob, &k, 2000, &r);
	cr_assert_eq(r.err, -ECONNREFUSED);
	event_base_free(base);
}

/* ---- outbound_same ---- */

/* Two outbounds are configured alike when every field from the config but the tag is equal;
 * any field a socket or a proxy server sees makes them differ, the running proxy's wiring does
 * not, nor does a server name pinned in one of them only. */
Test(outbound, same_unless_a_field_a_connection_sees_differs)
{
	struct ts_outbound a, b;
	int hook_arg;

	memset(&a, 0, sizeof(a));
	strcpy(a.tag, "proxy");
	a.type = TS_OUT_SOCKS5;
	a.has_server = true;
	strcpy(a.server.host, "127.0.0.1");
	a.server.is_addr = true;
	cr_assert_eq(netaddr_parse("127.0.0.1", &a.server.addr), 0);
	a.server.port = 1080;
	a.has_auth = true;
	strcpy(a.username, "u");
	strcpy(a.password, "p");
	a.udp = true;
	b = a;
	cr_assert(outbound_same(&a, &b));
	strcpy(b.tag, "other");
	cr_assert(outbound_same(&a, &b), "the tag reaches no socket");
	b.username[5] = 'x'; /* past the terminator: not part of the name */
	cr_assert(outbound_same(&a, &b));
#define DIFFERS(stmt)                                                       \
	do {                                                                \
		b = a;                                                      \
		stmt;                                                       \
		cr_assert_not(outbound_same(&a, &b), "%s", #stmt);          \
	} while (0)
	DIFFERS(b.type = TS_OUT_HTTP);
	DIFFERS(b.server.port = 1081);
	DIFFERS(b.server.addr.a[3] = 2);
	DIFFERS(strcpy(b.server.host, "127.0.0.2"));
	DIFFERS(strcpy(b.username, "v"));
	DIFFERS(strcpy(b.password, "q"));
	DIFFERS(b.has_auth = false);
	DIFFERS((b.has_routing_mark = true, b.routing_mark = 1));
	DIFFERS(strcpy(b.bind_interface, "lo"));
	DIFFERS(b.udp = false);
	DIFFERS(strcpy(b.http_headers, "X-A: 1\r\n"));
#undef DIFFERS
	b = a;
	b.sock_hook.arg = &hook_arg;
	b.resolver = (struct resolver *)&hook_arg;
	b.log = (struct log *)&hook_arg;
	cr_assert(outbound_same(&a, &b), "the wiring is not the configuration");
	/* A server by name: pinned in one only, the same; pinned in both, to one address. */
	a.server.is_addr = false;
	strcpy(a.server.host, "proxy.example");
	memset(&a.server.addr, 0, sizeof(a.server.addr));
	b = a;
	b.server.pinned = true;
	cr_assert_eq(netaddr_parse("192.0.2.1", &b.server.addr), 0);
	cr_assert(outbound_same(&a, &b), "not pinned yet: the same name");
	a.server.pinned = true;
	a.server.addr = b.server.addr;
	cr_assert(outbound_same(&a, &b));
	cr_assert_eq(netaddr_parse("192.0.2.2", &b.server.addr), 0);
	cr_assert_not(outbound_same(&a, &b), "the name now stands for another address");
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* A scripted server thread for many attempts in turn, one listener per script: SOCKS5 without
 * authentication, SOCKS5 with RFC 1929, HTTP CONNECT with Basic authentication and extra
 * header fields. Each connection: the handshake checked byte for byte, a success reply with
 * five early bytes, then an echo until the client closes. */
enum { NM_S5, NM_S5_AUTH, NM_HTTP, NM_KINDS };

struct nm_server {
	int lfd[NM_KINDS];
	uint16_t port[NM_KINDS];
	pthread_t th;
	atomic_bool stop;
	atomic_int served;        /* connections whose script ran to the end */
	char why[160];            /* the first failure, "" none */
};

static const char NM_HTTP_HEAD[] = "CONNECT 127.0.0.1:8080 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
				   "Proxy-Authorization: Basic YWxpY2U6c2VjcmV0\r\n"
				   "X-Tenant: a\r\n\r\n";

static bool nm_serve(struct nm_server *s, int kind, int fd)
{
	static const uint8_t http_ok[] = "HTTP/1.1 200 Connection established\r\n\r\nEARLY";
	uint8_t req[SOCKS5_REQUEST_MAX];
	size_t req_len = connect_req(req, 4, 8080);
	struct fake f = { .steps = {
		STEP(ST_EXPECT, GREET_NOAUTH), STEP(ST_SEND, PICK_NOAUTH),
		{ ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_EARLY), { ST_ECHO, NULL, 0 } } };
	struct fake fa = { .steps = {
		STEP(ST_EXPECT, GREET_AUTH), STEP(ST_SEND, PICK_USERPASS), STEP(ST_EXPECT, AUTH_REQ),
		STEP(ST_SEND, AUTH_OK), { ST_EXPECT, req, req_len }, STEP(ST_SEND, REPLY_OK_EARLY),
		{ ST_ECHO, NULL, 0 } } };
	struct fake fh = { .steps = {
		{ ST_EXPECT, (const uint8_t *)NM_HTTP_HEAD, sizeof(NM_HTTP_HEAD) - 1 },
		{ ST_SEND, http_ok, sizeof(http_ok) - 1 }, { ST_ECHO, NULL, 0 } } };
	struct fake *sc = kind == NM_S5 ? &f : kind == NM_S5_AUTH ? &fa : &fh;

	for (size_t i = 0; i < 8 && sc->steps[i].kind != ST_END; i++) {
		if (!fake_step(sc, fd, &sc->steps[i])) {
			snprintf(s->why, sizeof(s->why), "script %d, step %zu: %.100s", kind, i,
				 sc->why[0] ? sc->why : "failed");
			return false;
		}
	}
	return true;
}

static void *nm_main(void *arg)
{
	struct nm_server *s = arg;

	while (!atomic_load(&s->stop) && !s->why[0]) {
		struct pollfd p[NM_KINDS];

		for (int i = 0; i < NM_KINDS; i++)
			p[i] = (struct pollfd){ .fd = s->lfd[i], .events = POLLIN };
		if (poll(p, NM_KINDS, 20) <= 0)
			continue;
		for (int i = 0; i < NM_KINDS; i++) {
			int fd;

			if (!(p[i].revents & POLLIN) || (fd = accept4(s->lfd[i], NULL, NULL,
								      SOCK_CLOEXEC)) < 0)
				continue;
			if (nm_serve(s, i, fd))
				atomic_fetch_add(&s->served, 1);
			close(fd);
		}
	}
	return NULL;
}

struct nm {
	struct event_base *base;
	struct dns dns;
	struct nm_server srv;
};

/* One attempt through ob (tag: which one): refused at once (-ENOMEM, nothing called), or done
 * called once, promptly: a connected stream whose early bytes and echo come through, or
 * -ENOMEM. By name, also -ETIMEDOUT at the lookup's timeout: the resolver leaves a query whose
 * socket it had no memory to watch to c-ares's timeout (outbound/resolver.c). Returns whether
 * a stream was made. */
static bool nm_attempt(struct nm *nm, struct ts_outbound *ob, const char *tag, bool sweep)
{
	struct outbound_conn *c = NULL;
	struct result r = { .fd = -2 };
	struct flow_key k;
	uint8_t buf[4];
	int rc;

	strcpy(ob->tag, tag);
	key_loopback(&k, 4, 8080);
	if ((rc = outbound_connect(nm->base, ob, &k, 2000, on_done, &r, &c)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "%s: outbound_connect: %d", ob->tag, rc);
		return false;
	}
	cr_assert_eq(r.calls, 0, "done ran inside outbound_connect");
	cr_assert(run_until_done(nm->base, &r, WAIT_MS), "%s: no result in time", ob->tag);
	event_base_loop(nm->base, EVLOOP_NONBLOCK);
	cr_assert_eq(r.calls, 1, "%s: done ran twice", ob->tag);
	if (r.err != 0) {
		cr_assert(sweep && (r.err == -ENOMEM || (ob->resolver && r.err == -ETIMEDOUT)),
			  "%s: %d", ob->tag, r.err);
		cr_assert_eq(r.fd, -1);
		return false;
	}
	cr_assert_eq(r.early_len, 5, "%s", ob->tag);
	cr_assert_arr_eq(r.early, "EARLY", 5);
	cr_assert(write_all(r.fd, (const uint8_t *)"ping", 4, WAIT_MS));
	cr_assert(read_exact(r.fd, buf, 4, WAIT_MS), "%s: no echo", ob->tag);
	cr_assert_arr_eq(buf, "ping", 4);
	close(r.fd);
	return true;
}

/* Four attempts: SOCKS5 without and with authentication, HTTP CONNECT with Basic
 * authentication and an extra header, SOCKS5 to a server given by a name looked up with a
 * resolver of the scenario's own; each ends in a stream or a prompt -ENOMEM; every stream
 * reached the server's script, and every descriptor comes back. */
static void nm_scenario(void *arg, bool sweep)
{
	struct nm *nm = arg;
	struct resolver_config rc = { .servers = nm->dns.servers, .timeout_ms = 300,
				      .tries = 1 };
	struct resolver *res = NULL;
	struct ts_outbound ob;
	int fds = tu_dir_entries("/proc/self/fd"), served = atomic_load(&nm->srv.served), made = 0, ret;

	ob_socks5(&ob, 4, nm->srv.port[NM_S5], NULL, NULL);
	made += nm_attempt(nm, &ob, "socks5", sweep);
	ob_socks5(&ob, 4, nm->srv.port[NM_S5_AUTH], "alice", "secret");
	made += nm_attempt(nm, &ob, "socks5-auth", sweep);
	ob_http(&ob, 4, nm->srv.port[NM_HTTP], "alice", "secret");
	strcpy(ob.http_headers, "X-Tenant: a\r\n");
	made += nm_attempt(nm, &ob, "http", sweep);
	if ((ret = resolver_new(nm->base, &rc, &res)) != 0) {
		cr_assert(sweep && ret == -ENOMEM, "resolver_new: %d", ret);
	} else {
		ob_socks5_name(&ob, nm->srv.port[NM_S5], "socks.test");
		ob.resolver = res;
		made += nm_attempt(nm, &ob, "socks5-by-name", sweep);
		resolver_free(res);
	}
	cr_assert(sweep || made == 4);
	for (int i = 0; i < 100 && atomic_load(&nm->srv.served) - served < made; i++)
		usleep(10000); /* the server's echo sees the close */
	cr_assert_eq(nm->srv.why[0], '\0', "server: %s", nm->srv.why);
	cr_assert_eq(atomic_load(&nm->srv.served) - served, made, "a stream the server never saw");
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds, "a descriptor left open");
}

Test(outbound, each_allocation_refused_in_turn)
{
	struct nm nm;

	memset(&nm, 0, sizeof(nm));
	cr_assert_not_null(nm.base = event_base_new());
	dns_start(&nm.dns, nm.base, NAMES);
	for (int i = 0; i < NM_KINDS; i++)
		nm.srv.lfd[i] = listen_loopback(4, 8, &nm.srv.port[i]);
	cr_assert_eq(pthread_create(&nm.srv.th, NULL, nm_main, &nm.srv), 0);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nm_scenario, &nm, 5, 500));
	atomic_store(&nm.srv.stop, true);
	pthread_join(nm.srv.th, NULL);
	for (int i = 0; i < NM_KINDS; i++)
		close(nm.srv.lfd[i]);
	dns_stop(&nm.dns);
	event_base_free(nm.base);
}
