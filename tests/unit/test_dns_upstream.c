/* test_dns_upstream.c — dns/upstream.c against scripted mock servers on 127.0.0.1 served by
 * the test's own libevent loop, and once against a real dnsmasq.
 *
 *   test ──dns_upstream_ask──► upstream ──UDP──► mock UDP responder ┐ same port, same loop
 *                                       └─TCP──► mock TCP responder ┘
 *
 * The mocks answer a question "q<k>.test" with one A record: 192.0.2.k over UDP, 198.51.100.k
 * over TCP, so a result tells which transport answered. Scripts: answer; a wrong id first; never
 * answer; TC set (UDP); two pipelined queries in reverse order, hold everything, close the
 * first connection after one answer, a too-short length prefix, a first connection that never
 * answers (TCP). A socket hook on the detour shows which sockets the upstream opens, before
 * and after a new detour is set. Every
 * wait is bounded by a guard timer; counters are checked by exact amounts.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/dns_msg.h"
#include "core/evmem.h"
#include "dns/upstream.h"
#include "failalloc.h"
#include "testutil.h"

#define WAIT_MS 3000
#define MAX_CONNS 8
#define MAX_HELD 64
#define FRAME_CAP 600

/* ---- the mock servers ---- */

enum udp_mode { U_ANSWER, U_WRONG_ID_FIRST, U_SILENT, U_TC, U_BAD_ONLY };
enum tcp_mode { T_ANSWER, T_REVERSE, T_SILENT, T_CLOSE_AFTER_ONE, T_HOLD, T_SHORT_PREFIX,
		T_SILENT_FIRST };

struct mock;

struct mconn {
	struct mock *m;
	int fd, index;
	struct event *ev;
	uint8_t buf[70000];
	size_t len;
	uint8_t held[MAX_HELD][FRAME_CAP];   /* framed replies not sent yet */
	size_t held_len[MAX_HELD];
	int n_held;
};

struct mock {
	struct event_base *base;
	uint16_t port;
	int ufd, lfd;
	struct event *uev, *lev;
	enum udp_mode umode;
	enum tcp_mode tmode;
	int udp_queries;
	uint16_t udp_ids[16], udp_ports[16];
	int tcp_conns, tcp_queries, tcp_closed, held_now;
	struct mconn *conns[MAX_CONNS];
};

/* The reply to query qm: one A record, 192.0.2.k (udp) or 198.51.100.k (tcp) for "q<k>.test";
 * n_rr 0: none. Returns its length. */
static size_t mk_reply(uint8_t *out, size_t cap, const uint8_t *qm, size_t qlen, bool tcp,
		       size_t n_rr)
{
	uint8_t addr[1][16] = { { 0 } };
	struct dns_query dq;
	int len;

	cr_assert_eq(dns_parse_query(qm, qlen, &dq), 0, "the mock got a bad query");
	cr_assert_eq(dq.q.name[0], 'q');
	addr[0][0] = tcp ? 198 : 192;
	addr[0][1] = tcp ? 51 : 0;
	addr[0][2] = tcp ? 100 : 2;
	addr[0][3] = (uint8_t)atoi(dq.q.name + 1);
	len = dns_build_synth(out, cap, cap, &dq, qm, DNS_R_NOERROR, 4,
			      (const uint8_t(*)[16])addr, n_rr, 60);
	cr_assert_gt(len, 0);
	return (size_t)len;
}

static void on_mock_udp(evutil_socket_t fd, short what, void *arg)
{
	struct mock *m = arg;
	uint8_t q[1500], r[1500];
	struct sockaddr_in from;
	socklen_t fl = sizeof(from);
	ssize_t n = recvfrom(fd, q, sizeof(q), 0, (struct sockaddr *)&from, &fl);
	size_t rl;

	if (n < DNS_HDR_LEN)
		return;
	if (m->udp_queries < 16) {
		m->udp_ids[m->udp_queries] = tu_get16(q);
		m->udp_ports[m->udp_queries] = ntohs(from.sin_port);
	}
	m->udp_queries++;
	if (m->umode == U_SILENT)
		return;
	rl = mk_reply(r, sizeof(r), q, (size_t)n, false, m->umode == U_TC ? 0 : 1);
	if (m->umode == U_TC)
		r[2] |= DNS_F_TC >> 8;
	if (m->umode == U_WRONG_ID_FIRST || m->umode == U_BAD_ONLY) {
		tu_put16(r, (uint16_t)(tu_get16(q) + 1));
		sendto(fd, r, rl, 0, (struct sockaddr *)&from, fl);
		tu_put16(r, tu_get16(q));
	}
	if (m->umode != U_BAD_ONLY)
		sendto(fd, r, rl, 0, (struct sockaddr *)&from, fl);
}

static void conn_close(struct mconn *c)
{
	struct mock *m = c->m;

	event_free(c->ev);
	close(c->fd);
	m->conns[c->index] = NULL;
	m->held_now -= c->n_held;
	free(c);
}

static void conn_send(struct mconn *c, const uint8_t *p, size_t len)
{
	cr_assert_eq(send(c->fd, p, len, MSG_NOSIGNAL), (ssize_t)len);
}

static void conn_flush_held(struct mconn *c, bool reverse)
{
	for (int i = 0; i < c->n_held; i++) {
		int k = reverse ? c->n_held - 1 - i : i;

		conn_send(c, c->held[k], c->held_len[k]);
	}
	c->m->held_now -= c->n_held;
	c->n_held = 0;
}

/* One query from connection c (qm, qlen): the script decides. false: c was closed. */
static bool mock_tcp_query(struct mconn *c, const uint8_t *qm, size_t qlen)
{
	struct mock *m = c->m;
	uint8_t *slot;
	size_t rl;

	m->tcp_queries++;
	if (m->tmode == T_SILENT || (m->tmode == T_SILENT_FIRST && c->index == 0))
		return true;
	if (m->tmode == T_SHORT_PREFIX && c->index == 0) {
		static const uint8_t bad[] = { 0, 5, 1, 2, 3, 4, 5 };

		conn_send(c, bad, sizeof(bad));
		return true;
	}
	cr_assert_lt(c->n_held, MAX_HELD);
	slot = c->held[c->n_held];
	rl = mk_reply(slot + 2, FRAME_CAP - 2, qm, qlen, true, 1);
	tu_put16(slot, (uint16_t)rl);
	c->held_len[c->n_held++] = rl + 2;
	m->held_now++;
	if (m->tmode == T_HOLD)
		return true;
	if (m->tmode == T_REVERSE) {
		if (c->n_held == 2)
			conn_flush_held(c, true);
		return true;
	}
	if (m->tmode == T_CLOSE_AFTER_ONE && c->index == 0) {
		if (c->n_held == 2) {
			conn_send(c, c->held[0], c->held_len[0]);
			conn_close(c);
			return false;
		}
		return true;
	}
	conn_flush_held(c, false);
	return true;
}

static void on_mock_conn(evutil_socket_t fd, short what, void *arg)
{
	struct mconn *c = arg;
	ssize_t n = recv(fd, c->buf + c->len, sizeof(c->buf) - c->len, MSG_DONTWAIT);
	size_t off = 0;

	if (n < 0 && errno == EAGAIN)
		return;
	if (n <= 0) {
		c->m->tcp_closed++;
		conn_close(c);
		return;
	}
	c->len += (size_t)n;
	while (c->len - off >= 2 && c->len - off >= 2 + (size_t)tu_get16(c->buf + off)) {
		size_t ql = tu_get16(c->buf + off);

		if (!mock_tcp_query(c, c->buf + off + 2, ql))
			return;
		off += 2 + ql;
	}
	memmove(c->buf, c->buf + off, c->len - off);
	c->len -= off;
}

static void on_mock_accept(evutil_socket_t fd, short what, void *arg)
{
	struct mock *m = arg;
	int cfd = accept(fd, NULL, NULL);
	struct mconn *c;

	if (cfd < 0)
		return;
	cr_assert_lt(m->tcp_conns, MAX_CONNS);
	failalloc_hold(true); /* the mock's, not the upstream's (libevent's too, with evmem) */
	c = calloc(1, sizeof(*c));
	cr_assert_not_null(c);
	c->m = m;
	c->fd = cfd;
	c->index = m->tcp_conns++;
	c->ev = event_new(m->base, cfd, EV_READ | EV_PERSIST, on_mock_conn, c);
	cr_assert_not_null(c->ev);
	cr_assert_eq(event_add(c->ev, NULL), 0);
	failalloc_hold(false);
	m->conns[c->index] = c;
}

static int bind_lo(int type, uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;

	cr_assert_geq(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static uint16_t local_port(int fd)
{
	struct sockaddr_in sa;
	socklen_t l = sizeof(sa);

	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &l), 0);
	return ntohs(sa.sin_port);
}

/* A UDP responder and a TCP listener on one loopback port. */
static void mock_start(struct mock *m, struct event_base *base, enum udp_mode um,
		       enum tcp_mode tm)
{
	memset(m, 0, sizeof(*m));
	m->base = base;
	m->umode = um;
	m->tmode = tm;
	for (int i = 0; i < 50; i++) {
		m->ufd = bind_lo(SOCK_DGRAM, 0);
		m->port = local_port(m->ufd);
		if ((m->lfd = bind_lo(SOCK_STREAM, m->port)) >= 0)
			break;
		close(m->ufd);
	}
	cr_assert_geq(m->lfd, 0, "no port free for both UDP and TCP");
	cr_assert_eq(listen(m->lfd, 16), 0);
	m->uev = event_new(base, m->ufd, EV_READ | EV_PERSIST, on_mock_udp, m);
	m->lev = event_new(base, m->lfd, EV_READ | EV_PERSIST, on_mock_accept, m);
	event_add(m->uev, NULL);
	event_add(m->lev, NULL);
}

static void mock_release(struct mock *m)
{
	m->tmode = T_ANSWER;
	for (int i = 0; i < MAX_CONNS; i++)
		if (m->conns[i])
			conn_flush_held(m->conns[i], false);
}

static void mock_stop(struct mock *m)
{
	for (int i = 0; i < MAX_CONNS; i++)
		if (m->conns[i])
			conn_close(m->conns[i]);
	event_free(m->uev);
	event_free(m->lev);
	close(m->ufd);
	close(m->lfd);
}

/* ---- results, the loop ---- */

struct res {
	int calls;
	int err;
	uint8_t addr[4];          /* the first A record's address */
	uint16_t flags;
	struct dns_upstream **free_me;  /* free the upstream from inside the callback */
	int *counter;             /* shared count of calls, for many asks */
};

/* The first answer RR's type and data (walking its owner name). */
static bool first_a(const uint8_t *m, size_t len, const struct dns_answer *a, uint8_t out[4])
{
	size_t off = a->rr_off;

	if (a->an == 0)
		return false;
	while (off < len && m[off] != 0 && (m[off] & 0xc0) != 0xc0)
		off += 1 + m[off];
	off += off < len && m[off] == 0 ? 1 : 2;
	if (off + 10 + 4 > len || tu_get16(m + off) != DNS_T_A || tu_get16(m + off + 8) != 4)
		return false;
	memcpy(out, m + off + 10, 4);
	return true;
}

static void on_res(void *arg, int err, const uint8_t *msg, size_t len,
		   const struct dns_answer *a)
{
	struct res *r = arg;

	r->calls++;
	r->err = err;
	if (r->counter)
		(*r->counter)++;
	cr_assert(err != 0 || (msg && a && len >= DNS_HDR_LEN));
	cr_assert(err == 0 || (!msg && !a));
	if (err == 0) {
		r->flags = a->flags;
		cr_assert(first_a(msg, len, a, r->addr), "no A record in the answer");
	}
	if (r->free_me) {
		dns_upstream_free(*r->free_me);
		*r->free_me = NULL;
	}
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

/* Run base until *calls reaches want or ms passed (want < 0: run exactly ms). */
static bool run_until(struct event_base *base, const int *calls, int want, int ms)
{
	bool expired = false;
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	struct event *guard;

	failalloc_hold(true); /* the test's guard, not the code under test */
	guard = evtimer_new(base, on_guard, &expired);
	cr_assert_not_null(guard);
	cr_assert_eq(evtimer_add(guard, &tv), 0);
	failalloc_hold(false);
	while (!expired && (want < 0 || *calls < want))
		event_base_loop(base, EVLOOP_ONCE);
	event_free(guard);
	return want < 0 || *calls >= want;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct dns_question question(const char *name, uint16_t type)
{
	struct dns_question q;

	memset(&q, 0, sizeof(q));
	snprintf(q.name, sizeof(q.name), "%s", name);
	q.name_len = strlen(q.name);
	q.nameable = true;
	q.qtype = type;
	q.qclass = 1;
	return q;
}

struct fx {
	int fds0;                 /* descriptors open before: all closed again at the end */
	struct event_base *base;
	struct mock m;
	struct dns_upstream_config cfg;
	struct dns_upstream *u;
};

static void fx_start(struct fx *f, enum dns_up_kind kind, enum udp_mode um, enum tcp_mode tm)
{
	memset(f, 0, sizeof(*f));
	f->fds0 = tu_dir_entries("/proc/self/fd");
	f->base = event_base_new();
	cr_assert_not_null(f->base);
	mock_start(&f->m, f->base, um, tm);
	f->cfg.kind = kind;
	cr_assert_eq(netaddr_parse("127.0.0.1", &f->cfg.server.addr), 0);
	f->cfg.server.port = f->m.port;
	f->cfg.timeout_ms = 1000;
	f->cfg.tries = 2;
}

static void fx_new(struct fx *f)
{
	cr_assert_eq(dns_upstream_new(f->base, &f->cfg, &f->u), 0);
}

static void fx_stop(struct fx *f)
{
	dns_upstream_free(f->u);
	mock_stop(&f->m);
	event_base_free(f->base);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), f->fds0, "a descriptor left open");
	CHECK_LEAKS();
}

/* Ask "q<k>.test" A; the callback must not run inside dns_upstream_ask. */
static struct dns_uq *ask(struct fx *f, int k, struct res *r)
{
	struct dns_question q;
	struct dns_uq *h = NULL;
	char name[32];

	snprintf(name, sizeof(name), "q%d.test", k);
	q = question(name, DNS_T_A);
	cr_assert_eq(dns_upstream_ask(f->u, &q, on_res, r, &h), 0);
	cr_assert_not_null(h);
	cr_assert_eq(r->calls, 0, "callback ran inside dns_upstream_ask");
	return h;
}

static void assert_addr(const struct res *r, int a, int b, int c, int d)
{
	uint8_t want[4] = { (uint8_t)a, (uint8_t)b, (uint8_t)c, (uint8_t)d };

	cr_assert_eq(r->err, 0, "err %d (%s)", r->err, strerror(-r->err));
	cr_assert_arr_eq(r->addr, want, 4, "got %u.%u.%u.%u", r->addr[0], r->addr[1], r->addr[2],
			 r->addr[3]);
}

static struct dns_upstream_stats stats(const struct fx *f)
{
	struct dns_upstream_stats st;

	dns_upstream_get_stats(f->u, &st);
	return st;
}

/* ---- udp ---- */

Test(dns_upstream, udp_answer)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;
	int fds;

	fx_start(&f, DNS_UP_UDP, U_ANSWER, T_SILENT);
	fx_new(&f);
	fds = tu_dir_entries("/proc/self/fd");
	ask(&f, 7, &r);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds + 1, "one socket for the try");
	cr_assert_eq(stats(&f).inflight, 1);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.calls, 1);
	assert_addr(&r, 192, 0, 2, 7);
	cr_assert(r.flags & DNS_F_QR);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds, "the socket closed once answered");
	st = stats(&f);
	cr_assert_eq(st.queries, 1);
	cr_assert_eq(st.tries, 1);
	cr_assert_eq(st.timeouts + st.errors + st.bad_answers + st.tcp_connects, 0);
	cr_assert_eq(st.inflight, 0);
	cr_assert_eq(f.m.udp_queries, 1);
	cr_assert_eq(f.m.tcp_conns, 0);
	fx_stop(&f);
}

Test(dns_upstream, udp_wrong_id_is_ignored_until_the_right_one)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_UDP, U_WRONG_ID_FIRST, T_SILENT);
	fx_new(&f);
	ask(&f, 9, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	assert_addr(&r, 192, 0, 2, 9);
	st = stats(&f);
	cr_assert_eq(st.bad_answers, 1);
	cr_assert_eq(st.tries, 1);
	cr_assert_eq(st.timeouts, 0);
	cr_assert_eq(f.m.udp_queries, 1);
	fx_stop(&f);
}

Test(dns_upstream, udp_silent_server_times_out_each_try_on_a_new_socket)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;
	int64_t t0;
	int fds;

	fx_start(&f, DNS_UP_UDP, U_SILENT, T_SILENT);
	f.cfg.timeout_ms = 150;
	f.cfg.tries = 3;
	fx_new(&f);
	fds = tu_dir_entries("/proc/self/fd");
	t0 = mono_ms();
	ask(&f, 1, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -ETIMEDOUT);
	cr_assert_geq(mono_ms() - t0, 3 * 150 - 10);
	st = stats(&f);
	cr_assert_eq(st.tries, 3);
	cr_assert_eq(st.timeouts, 3);
	cr_assert_eq(st.errors, 0);
	cr_assert_eq(st.inflight, 0);
	cr_assert_eq(f.m.udp_queries, 3);
	/* A new socket (source port) and id per try: three equal ones would be a reused socket. */
	cr_assert(!(f.m.udp_ports[0] == f.m.udp_ports[1] && f.m.udp_ports[1] == f.m.udp_ports[2]));
	cr_assert(!(f.m.udp_ids[0] == f.m.udp_ids[1] && f.m.udp_ids[1] == f.m.udp_ids[2]));
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds);
	fx_stop(&f);
}

Test(dns_upstream, udp_only_bad_answers_is_eproto)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_UDP, U_BAD_ONLY, T_SILENT);
	f.cfg.timeout_ms = 150;
	fx_new(&f);
	ask(&f, 3, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -EPROTO);
	st = stats(&f);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(st.bad_answers, 2);
	cr_assert_eq(st.timeouts, 2);
	fx_stop(&f);
}

Test(dns_upstream, udp_truncated_answer_is_asked_again_over_tcp)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_UDP, U_TC, T_ANSWER);
	fx_new(&f);
	ask(&f, 42, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	assert_addr(&r, 198, 51, 100, 42);  /* the TCP responder's answer */
	cr_assert_eq(r.flags & DNS_F_TC, 0);
	st = stats(&f);
	cr_assert_eq(st.truncated_retried_tcp, 1);
	cr_assert_eq(st.tcp_connects, 1);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(f.m.udp_queries, 1);
	cr_assert_eq(f.m.tcp_queries, 1);
	fx_stop(&f);
}

Test(dns_upstream, udp_closed_port_is_econnrefused)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;
	int64_t t0;

	fx_start(&f, DNS_UP_UDP, U_SILENT, T_SILENT);
	event_del(f.m.uev);
	close(f.m.ufd);  /* nobody on the port: ICMP port unreachable */
	f.m.ufd = bind_lo(SOCK_STREAM, 0);  /* keeps mock_stop's close harmless */
	fx_new(&f);
	t0 = mono_ms();
	ask(&f, 1, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -ECONNREFUSED);
	cr_assert_lt(mono_ms() - t0, 500, "a refused try ends at once");
	st = stats(&f);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(st.errors, 2);
	cr_assert_eq(st.timeouts, 0);
	fx_stop(&f);
}

Test(dns_upstream, cancelled_ask_is_never_called_and_its_socket_closed)
{
	struct res r = { 0 };
	struct dns_uq *h;
	struct fx f;
	int fds;

	fx_start(&f, DNS_UP_UDP, U_SILENT, T_SILENT);
	f.cfg.timeout_ms = 100;
	fx_new(&f);
	fds = tu_dir_entries("/proc/self/fd");
	h = ask(&f, 1, &r);
	dns_upstream_cancel(f.u, h);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds);
	cr_assert_eq(stats(&f).inflight, 0);
	run_until(f.base, &r.calls, -1, 400);
	cr_assert_eq(r.calls, 0);
	cr_assert_eq(stats(&f).tries, 1);
	fx_stop(&f);
}

Test(dns_upstream, bad_arguments)
{
	struct dns_upstream_config cfg = { .kind = DNS_UP_UDP };
	struct ts_outbound socks = { .type = TS_OUT_SOCKS5 };
	struct event_base *base = event_base_new();
	struct dns_question q = question("x.test", DNS_T_A);
	struct dns_upstream_stats st;
	struct dns_upstream *u = NULL;
	struct dns_uq *h = NULL;
	struct res r = { 0 };

	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cr_assert_eq(dns_upstream_new(base, &cfg, &u), -EINVAL, "port 0");
	cfg.server.port = 53;
	cfg.detour = &socks;
	cr_assert_eq(dns_upstream_new(base, &cfg, &u), -EINVAL, "udp through socks5");
	cfg.kind = DNS_UP_TCP;
	cr_assert_eq(dns_upstream_new(base, &cfg, &u), 0, "tcp through socks5 is fine");
	q.nameable = false;
	cr_assert_eq(dns_upstream_ask(u, &q, on_res, &r, &h), -EINVAL);
	dns_upstream_get_stats(u, &st);
	cr_assert_eq(st.queries, 0);
	dns_upstream_free(u);
	event_base_free(base);
	CHECK_LEAKS();
}

/* ---- tcp ---- */

Test(dns_upstream, tcp_answers_and_reuses_the_connection)
{
	struct dns_upstream_stats st;
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_ANSWER);
	fx_new(&f);
	ask(&f, 1, &r1);
	cr_assert(run_until(f.base, &r1.calls, 1, WAIT_MS));
	assert_addr(&r1, 198, 51, 100, 1);
	ask(&f, 2, &r2);
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	assert_addr(&r2, 198, 51, 100, 2);
	st = stats(&f);
	cr_assert_eq(st.tcp_connects, 1);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(st.errors + st.timeouts + st.bad_answers + st.late_answers, 0);
	cr_assert_eq(f.m.tcp_conns, 1);
	cr_assert_eq(f.m.udp_queries, 0);
	fx_stop(&f);
}

Test(dns_upstream, tcp_pipelined_answers_in_reverse_order)
{
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;
	int n = 0;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_REVERSE);
	fx_new(&f);
	r1.counter = r2.counter = &n;
	ask(&f, 11, &r1);
	ask(&f, 22, &r2);
	cr_assert(run_until(f.base, &n, 2, WAIT_MS));
	assert_addr(&r1, 198, 51, 100, 11);
	assert_addr(&r2, 198, 51, 100, 22);
	cr_assert_eq(r1.calls + r2.calls, 2);
	cr_assert_eq(stats(&f).tcp_connects, 1);
	cr_assert_eq(stats(&f).tries, 2);
	cr_assert_eq(f.m.tcp_conns, 1);
	fx_stop(&f);
}

Test(dns_upstream, tcp_connection_lost_midway_retries_on_a_new_one)
{
	struct dns_upstream_stats st;
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;
	int n = 0;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_CLOSE_AFTER_ONE);
	fx_new(&f);
	r1.counter = r2.counter = &n;
	ask(&f, 1, &r1);
	ask(&f, 2, &r2);
	cr_assert(run_until(f.base, &n, 2, WAIT_MS));
	assert_addr(&r1, 198, 51, 100, 1);
	assert_addr(&r2, 198, 51, 100, 2);
	st = stats(&f);
	cr_assert_eq(st.tcp_connects, 2);
	cr_assert_eq(st.errors, 1);
	cr_assert_eq(st.tries, 3);
	cr_assert_eq(st.timeouts, 0);
	cr_assert_eq(f.m.tcp_conns, 2);
	cr_assert_eq(f.m.tcp_queries, 3);
	fx_stop(&f);
}

Test(dns_upstream, tcp_short_length_prefix_closes_the_connection)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SHORT_PREFIX);
	fx_new(&f);
	ask(&f, 5, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	assert_addr(&r, 198, 51, 100, 5);
	st = stats(&f);
	cr_assert_eq(st.tcp_connects, 2);
	cr_assert_eq(st.errors, 1);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(f.m.tcp_conns, 2);
	fx_stop(&f);
}

Test(dns_upstream, tcp_short_length_prefix_on_the_last_try_is_eproto)
{
	struct res r = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SHORT_PREFIX);
	f.cfg.tries = 1;
	fx_new(&f);
	ask(&f, 5, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -EPROTO);
	cr_assert_eq(stats(&f).errors, 1);
	fx_stop(&f);
}

Test(dns_upstream, tcp_silent_server_times_out_and_drops_the_dead_connection)
{
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SILENT);
	f.cfg.timeout_ms = 150;
	fx_new(&f);
	ask(&f, 1, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -ETIMEDOUT);
	st = stats(&f);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(st.timeouts, 2);
	/* Nothing came back on the first connection: the second try went on a new one. */
	cr_assert_eq(st.tcp_connects, 2);
	cr_assert_eq(f.m.tcp_queries, 2);
	cr_assert_eq(st.inflight, 0);
	fx_stop(&f);
}

/* Many asks in flight on a connection that never answers: each fails by tries x timeout from
 * when it was asked, however often the dead connection is replaced and they are sent again
 * (the first timeout voids the connection and gives the others their try back). */
Test(dns_upstream, tcp_silent_server_fails_every_ask_within_its_tries)
{
	enum { N = 8 };
	struct res r[N];
	struct fx f;
	int n = 0;
	int64_t t0, took;

	memset(r, 0, sizeof(r));
	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SILENT);
	f.cfg.timeout_ms = 150;
	f.cfg.tries = 2;
	fx_new(&f);
	t0 = mono_ms();
	for (int i = 0; i < N; i++) {
		r[i].counter = &n;
		ask(&f, i + 1, &r[i]);
	}
	cr_assert(run_until(f.base, &n, N, WAIT_MS), "%d of %d failed in time", n, N);
	took = mono_ms() - t0;
	/* Before: up to 16 tries of 150 ms one after another (2.4 s). */
	cr_assert_lt(took, 2 * 150 + 300, "the last took %lld ms, want 300 (+ slack)",
		     (long long)took);
	for (int i = 0; i < N; i++)
		cr_assert_eq(r[i].err, -ETIMEDOUT, "ask %d: %d", i + 1, r[i].err);
	cr_assert_leq(stats(&f).tcp_connects, 3, "%llu connections",
		      (unsigned long long)stats(&f).tcp_connects);
	cr_assert_eq(stats(&f).inflight, 0);
	fx_stop(&f);
}

/* Asks that arrive spread out over a silent server: a try cut short by its ask's deadline is no
 * proof that the connection is dead, so the stragglers finish on the connection that is open
 * instead of each voiding it and opening the next (one connection per deadline before). */
Test(dns_upstream, tcp_silent_server_spread_asks_do_not_storm)
{
	enum { N = 5 };
	struct res r[N];
	struct fx f;
	int n = 0;

	memset(r, 0, sizeof(r));
	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SILENT);
	f.cfg.timeout_ms = 150;
	f.cfg.tries = 2;
	fx_new(&f);
	for (int i = 0; i < N; i++) {
		r[i].counter = &n;
		ask(&f, i + 1, &r[i]);
		run_until(f.base, NULL, -1, 12);
	}
	cr_assert(run_until(f.base, &n, N, WAIT_MS), "%d of %d failed in time", n, N);
	for (int i = 0; i < N; i++)
		cr_assert_eq(r[i].err, -ETIMEDOUT, "ask %d: %d", i + 1, r[i].err);
	/* The first ask's two full tries void two connections; the rest end on the third. */
	cr_assert_eq(stats(&f).tcp_connects, 3, "%llu connections",
		     (unsigned long long)stats(&f).tcp_connects);
	cr_assert_eq(stats(&f).inflight, 0);
	fx_stop(&f);
}

Test(dns_upstream, tcp_at_most_32_in_flight_the_rest_queued)
{
	struct res r[40];
	struct fx f;
	int n = 0;

	memset(r, 0, sizeof(r));
	fx_start(&f, DNS_UP_TCP, U_SILENT, T_HOLD);
	fx_new(&f);
	for (int i = 0; i < 40; i++) {
		r[i].counter = &n;
		ask(&f, i + 1, &r[i]);
	}
	run_until(f.base, &f.m.tcp_queries, 40, 400);
	cr_assert_eq(f.m.tcp_queries, DNS_UP_TCP_INFLIGHT, "%d queries sent", f.m.tcp_queries);
	cr_assert_eq(stats(&f).inflight, 40);
	cr_assert_eq(stats(&f).tries, DNS_UP_TCP_INFLIGHT);
	mock_release(&f.m);
	cr_assert(run_until(f.base, &n, 40, WAIT_MS), "%d answered", n);
	for (int i = 0; i < 40; i++)
		assert_addr(&r[i], 198, 51, 100, i + 1);
	cr_assert_eq(stats(&f).tcp_connects, 1);
	cr_assert_eq(stats(&f).tries, 40);
	cr_assert_eq(f.m.tcp_queries, 40);
	cr_assert_eq(stats(&f).inflight, 0);
	fx_stop(&f);
}

Test(dns_upstream, at_most_256_asks_then_free_drops_them_silently)
{
	static struct res r[DNS_UP_MAX_ASKS + 1];
	struct dns_question q = question("q1.test", DNS_T_A);
	struct dns_uq *h;
	struct fx f;
	int n = 0;

	memset(r, 0, sizeof(r));
	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SILENT);
	fx_new(&f);
	for (int i = 0; i < DNS_UP_MAX_ASKS; i++) {
		r[i].counter = &n;
		ask(&f, 1, &r[i]);
	}
	cr_assert_eq(dns_upstream_ask(f.u, &q, on_res, &r[DNS_UP_MAX_ASKS], &h), -ENOBUFS);
	cr_assert_eq(stats(&f).inflight, DNS_UP_MAX_ASKS);
	cr_assert_eq(stats(&f).queries, DNS_UP_MAX_ASKS);
	run_until(f.base, &n, -1, 100);
	dns_upstream_free(f.u);
	f.u = NULL;
	run_until(f.base, &n, -1, 100);
	cr_assert_eq(n, 0, "a dropped ask was called");
	fx_stop(&f);
}

Test(dns_upstream, tcp_idle_connection_closed)
{
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_ANSWER);
	f.cfg.idle_ms = 150;
	fx_new(&f);
	ask(&f, 1, &r1);
	cr_assert(run_until(f.base, &r1.calls, 1, WAIT_MS));
	run_until(f.base, &f.m.tcp_closed, 1, 1000);
	cr_assert_eq(f.m.tcp_closed, 1, "the idle connection was not closed");
	ask(&f, 2, &r2);
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	assert_addr(&r2, 198, 51, 100, 2);
	cr_assert_eq(stats(&f).tcp_connects, 2);
	cr_assert_eq(stats(&f).errors, 0);
	fx_stop(&f);
}

Test(dns_upstream, free_from_a_callback_stops_everything)
{
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;
	int n = 0;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_REVERSE);
	fx_new(&f);
	r1.counter = r2.counter = &n;
	r1.free_me = r2.free_me = &f.u;
	ask(&f, 1, &r1);
	ask(&f, 2, &r2);
	cr_assert(run_until(f.base, &n, 1, WAIT_MS));
	run_until(f.base, &n, -1, 200);
	cr_assert_eq(n, 1, "the second answer reached a freed upstream's ask");
	cr_assert_eq(r2.calls, 1, "the reversed answer comes first");
	cr_assert_null(f.u);
	fx_stop(&f);
}

Test(dns_upstream, tcp_cancelled_ask_answer_counted_late)
{
	struct res r1 = { 0 }, r2 = { 0 };
	struct dns_uq *h;
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_HOLD);
	fx_new(&f);
	h = ask(&f, 1, &r1);
	ask(&f, 2, &r2);
	run_until(f.base, &f.m.tcp_queries, 2, WAIT_MS);
	cr_assert_eq(f.m.tcp_queries, 2);
	dns_upstream_cancel(f.u, h);
	cr_assert_eq(stats(&f).inflight, 1);
	mock_release(&f.m);
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	assert_addr(&r2, 198, 51, 100, 2);
	run_until(f.base, &r1.calls, -1, 100);
	cr_assert_eq(r1.calls, 0);
	cr_assert_eq(stats(&f).late_answers, 1);
	cr_assert_eq(stats(&f).bad_answers, 0);
	fx_stop(&f);
}

/* A dead connection (nothing ever came back) is dropped when its oldest query times out; the
 * other queries on it go again on a new connection without losing their only try. */
Test(dns_upstream, tcp_dead_connection_requeues_the_others_with_their_tries)
{
	struct dns_upstream_stats st;
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;
	int n = 0;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SILENT_FIRST);
	f.cfg.timeout_ms = 300;
	f.cfg.tries = 1;
	fx_new(&f);
	r1.counter = r2.counter = &n;
	ask(&f, 1, &r1);
	run_until(f.base, &n, -1, 150);
	ask(&f, 2, &r2);
	cr_assert(run_until(f.base, &n, 2, WAIT_MS));
	cr_assert_eq(r1.err, -ETIMEDOUT);
	assert_addr(&r2, 198, 51, 100, 2);
	st = stats(&f);
	cr_assert_eq(st.timeouts, 1);
	cr_assert_eq(st.tcp_connects, 2);
	cr_assert_eq(st.tries, 3);
	cr_assert_eq(f.m.tcp_conns, 2);
	fx_stop(&f);
}

/* ---- through a detour ---- */

struct hook_log {
	int calls, dgram, stream;
	int ret;
};

static int hook(void *arg, int fd, int family, int type)
{
	struct hook_log *h = arg;

	h->calls++;
	h->dgram += type == SOCK_DGRAM;
	h->stream += type == SOCK_STREAM;
	return h->ret;
}

static void detour_case(enum dns_up_kind kind, int hook_ret, int want_err)
{
	struct ts_outbound ob = { .type = TS_OUT_DIRECT };
	struct hook_log hl = { .ret = hook_ret };
	struct dns_upstream_stats st;
	struct res r = { 0 };
	struct fx f;

	ob.sock_hook.fn = hook;
	ob.sock_hook.arg = &hl;
	fx_start(&f, kind, U_ANSWER, T_ANSWER);
	f.cfg.detour = &ob;
	fx_new(&f);
	ask(&f, 4, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	st = stats(&f);
	if (want_err == 0) {
		assert_addr(&r, kind == DNS_UP_TCP ? 198 : 192, kind == DNS_UP_TCP ? 51 : 0,
			    kind == DNS_UP_TCP ? 100 : 2, 4);
		cr_assert_eq(hl.calls, 1);
	} else {
		cr_assert_eq(r.err, want_err, "err %d", r.err);
		cr_assert_eq(hl.calls, 2, "one socket per try");
		cr_assert_eq(st.errors, 2);
		cr_assert_eq(st.tcp_connects, 0);
		cr_assert_eq(f.m.udp_queries + f.m.tcp_queries, 0);
	}
	cr_assert_eq(hl.dgram, kind == DNS_UP_UDP ? hl.calls : 0);
	cr_assert_eq(hl.stream, kind == DNS_UP_TCP ? hl.calls : 0);
	fx_stop(&f);
}

Test(dns_upstream, detour_sockets_udp)
{
	detour_case(DNS_UP_UDP, 0, 0);
}

Test(dns_upstream, detour_sockets_tcp)
{
	detour_case(DNS_UP_TCP, 0, 0);
}

Test(dns_upstream, detour_refusing_socket_fails_each_try_udp)
{
	detour_case(DNS_UP_UDP, -EPERM, -EPERM);
}

Test(dns_upstream, detour_refusing_socket_fails_each_try_tcp)
{
	detour_case(DNS_UP_TCP, -EPERM, -EPERM);
}

Test(dns_upstream, tcp_through_a_reject_outbound_is_refused)
{
	struct ts_outbound ob = { .type = TS_OUT_REJECT };
	struct res r = { 0 };
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_ANSWER, T_ANSWER);
	f.cfg.detour = &ob;
	fx_new(&f);
	ask(&f, 4, &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -ECONNREFUSED);
	cr_assert_eq(stats(&f).errors, 2);
	cr_assert_eq(f.m.tcp_conns, 0);
	fx_stop(&f);
}

/* A new detour (a reload): the open connection, made through the old one, is closed and the
 * query in flight on it is sent again through the new one with its try given back, well
 * before that try would have timed out; the same outbound again changes nothing. */
Test(dns_upstream, new_detour_takes_the_queries_off_the_old_connection)
{
	struct ts_outbound a = { .type = TS_OUT_DIRECT }, b, socks = { .type = TS_OUT_SOCKS5 };
	struct hook_log ha = { 0 }, hb = { 0 };
	struct dns_upstream_stats st;
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;

	a.sock_hook.fn = hook;
	a.sock_hook.arg = &ha;
	b = a;
	b.sock_hook.arg = &hb;  /* which one opened a socket */
	b.domain_strategy = TS_DS_IPV4_ONLY;  /* configured otherwise (any field would do) */
	fx_start(&f, DNS_UP_TCP, U_SILENT, T_SILENT_FIRST);
	f.cfg.detour = &a;
	fx_new(&f);
	cr_assert_eq(dns_upstream_set_detour(f.u, &a), 0, "the same outbound");
	ask(&f, 1, &r1);
	cr_assert(run_until(f.base, &f.m.tcp_queries, 1, WAIT_MS));
	cr_assert_eq(dns_upstream_set_detour(f.u, &b), 1);
	cr_assert_eq(r1.calls, 0, "no callback inside");
	cr_assert(run_until(f.base, &r1.calls, 1, 500), "asked again at once, not after 1 s");
	assert_addr(&r1, 198, 51, 100, 1);
	cr_assert_eq(ha.stream, 1, "the first connection through the old detour");
	cr_assert_eq(hb.stream, 1, "the second through the new one");
	cr_assert_eq(dns_upstream_set_detour(f.u, &b), 0, "the same outbound");
	ask(&f, 2, &r2);
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	assert_addr(&r2, 198, 51, 100, 2);
	st = stats(&f);
	cr_assert_eq(st.tcp_connects, 2, "the connection stays when nothing changed");
	cr_assert_eq(st.tries, 3);
	cr_assert_eq(st.timeouts + st.errors, 0);
	cr_assert_eq(f.m.tcp_conns, 2);
	cr_assert_eq(hb.calls, 1);
	dns_upstream_free(f.u);
	/* A udp server goes direct only: refused, nothing changes. */
	f.cfg.kind = DNS_UP_UDP;
	f.cfg.detour = &a;
	fx_new(&f);
	cr_assert_eq(dns_upstream_set_detour(f.u, &socks), -EINVAL);
	fx_stop(&f);
}

/* ---- real servers ---- */

static uint16_t free_port(void)
{
	for (int i = 0; i < 50; i++) {
		int u = bind_lo(SOCK_DGRAM, 0), t;
		uint16_t p = local_port(u);

		t = bind_lo(SOCK_STREAM, p);
		close(u);
		if (t >= 0) {
			close(t);
			return p;
		}
	}
	cr_assert_fail("no free port");
	return 0;
}

/* A child running argv (output to /dev/null), killed if the test process dies. */
static pid_t spawn(char *const argv[])
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		prctl(PR_SET_PDEATHSIG, SIGKILL);  /* a failed test leaves no server behind */
		dup2(null, 1);
		dup2(null, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	return pid;
}

static void reap(pid_t pid)
{
	int status;

	kill(pid, SIGTERM);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
}

/* DNS over TCP through a SOCKS5 proxy (microsocks): pipelined on one proxied connection. */
Test(dns_upstream, tcp_through_a_socks5_outbound)
{
	struct ts_outbound ob = { .type = TS_OUT_SOCKS5, .has_server = true };
	struct res r1 = { 0 }, r2 = { 0 };
	char portarg[8];
	char *argv[] = { "microsocks", "-i", "127.0.0.1", "-p", portarg, NULL };
	int64_t until;
	struct fx f;
	pid_t pid;
	int n = 0;

	if (access("/usr/bin/microsocks", X_OK) != 0)
		cr_skip_test("microsocks not installed");
	ob.server.is_addr = true;
	strcpy(ob.server.host, "127.0.0.1");
	cr_assert_eq(netaddr_parse("127.0.0.1", &ob.server.addr), 0);
	ob.server.port = free_port();
	snprintf(portarg, sizeof(portarg), "%u", ob.server.port);
	pid = spawn(argv);
	for (until = mono_ms() + WAIT_MS; mono_ms() < until; usleep(20000)) {
		int fd = bind_lo(SOCK_STREAM, ob.server.port);  /* bound by microsocks once up */

		if (fd < 0)
			break;
		close(fd);
	}
	fx_start(&f, DNS_UP_TCP, U_SILENT, T_REVERSE);
	f.cfg.detour = &ob;
	fx_new(&f);
	r1.counter = r2.counter = &n;
	ask(&f, 8, &r1);
	ask(&f, 9, &r2);
	cr_assert(run_until(f.base, &n, 2, WAIT_MS));
	assert_addr(&r1, 198, 51, 100, 8);
	assert_addr(&r2, 198, 51, 100, 9);
	cr_assert_eq(stats(&f).tcp_connects, 1);
	cr_assert_eq(f.m.tcp_conns, 1, "one connection, from the proxy");
	fx_stop(&f);
	reap(pid);
}

static pid_t dnsmasq_start(uint16_t port)
{
	char portarg[32];
	char *argv[] = { "dnsmasq", "--no-daemon", portarg, "--listen-address=127.0.0.1",
			 "--bind-interfaces", "--no-resolv", "--no-hosts",
			 "--address=/example.test/192.0.2.7", "-C", "/dev/null", NULL };

	snprintf(portarg, sizeof(portarg), "--port=%u", port);
	return spawn(argv);
}

static void ask_dnsmasq(struct event_base *base, enum dns_up_kind kind, uint16_t port)
{
	struct dns_upstream_config cfg = { .kind = kind, .timeout_ms = 500, .tries = 1 };
	struct dns_question q = question("example.test", DNS_T_A);
	struct dns_upstream_stats st;
	struct dns_upstream *u;
	int64_t until = mono_ms() + 5000;
	struct res r;
	struct dns_uq *h;

	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cfg.server.port = port;
	cr_assert_eq(dns_upstream_new(base, &cfg, &u), 0);
	do {  /* until dnsmasq listens */
		memset(&r, 0, sizeof(r));
		cr_assert_eq(dns_upstream_ask(u, &q, on_res, &r, &h), 0);
		cr_assert(run_until(base, &r.calls, 1, WAIT_MS));
		if (r.err != 0)
			run_until(base, &r.calls, -1, 100);
	} while (r.err != 0 && mono_ms() < until);
	assert_addr(&r, 192, 0, 2, 7);
	cr_assert_eq(r.flags & 0xf, DNS_R_NOERROR);
	dns_upstream_get_stats(u, &st);
	cr_assert_eq(st.tcp_connects > 0, kind == DNS_UP_TCP);
	cr_assert_eq(st.bad_answers, 0);
	dns_upstream_free(u);
}

Test(dns_upstream, real_dnsmasq_over_udp_and_tcp)
{
	struct event_base *base = event_base_new();
	uint16_t port = free_port();
	pid_t pid = dnsmasq_start(port);

	ask_dnsmasq(base, DNS_UP_UDP, port);
	ask_dnsmasq(base, DNS_UP_TCP, port);
	reap(pid);
	event_base_free(base);
	CHECK_LEAKS();
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* Run the loop until the descriptors open are n again (the mock closes its side when it
 * reads the upstream's close), at most 1 s. */
static bool fds_back(struct event_base *base, int n)
{
	int never = 0;

	for (int i = 0; i < 100 && tu_dir_entries("/proc/self/fd") != n; i++)
		run_until(base, &never, -1, 10);
	return tu_dir_entries("/proc/self/fd") == n;
}

/* One upstream's life: three asks answered in turn (over TCP: on one reused connection; over
 * UDP: each truncated, then asked again over TCP), each called back once with its answer, or
 * refused at once (-ENOMEM: nothing called), or failed for memory on its last try; one ask
 * pending at the free is never called; every descriptor comes back. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct fx *f = arg;
	struct dns_upstream_stats st;
	struct res pend = { 0 };
	struct dns_question q;
	struct dns_uq *h;
	int fds = tu_dir_entries("/proc/self/fd"), rc, answered = 0, never = 0;

	for (int i = 0; i < MAX_CONNS; i++)
		cr_assert_null(f->m.conns[i]);
	f->m.tcp_conns = 0;
	f->u = NULL;
	if ((rc = dns_upstream_new(f->base, &f->cfg, &f->u)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_upstream_new: %d", rc);
		cr_assert_null(f->u);
		return;
	}
	for (int k = 1; k <= 3; k++) {
		struct res r = { 0 };
		char name[32];

		snprintf(name, sizeof(name), "q%d.test", k);
		q = question(name, DNS_T_A);
		if ((rc = dns_upstream_ask(f->u, &q, on_res, &r, &h)) != 0) {
			cr_assert(sweep && rc == -ENOMEM, "ask %d: %d", k, rc);
			continue;
		}
		cr_assert(run_until(f->base, &r.calls, 1, WAIT_MS), "ask %d: no callback", k);
		run_until(f->base, &never, -1, 1); /* a second callback would show here */
		cr_assert_eq(r.calls, 1);
		if (r.err != 0) {
			cr_assert(sweep && r.err == -ENOMEM, "ask %d: %d", k, r.err);
			continue;
		}
		assert_addr(&r, 198, 51, 100, k);
		answered++;
	}
	st = stats(f);
	cr_assert(sweep || answered == 3);
	cr_assert_eq(st.inflight, 0);
	cr_assert_eq(st.timeouts + st.bad_answers + st.late_answers, 0);
	cr_assert(sweep || (st.tcp_connects == 1 && st.errors == 0), "one connection, reused");
	q = question("q9.test", DNS_T_A);
	rc = dns_upstream_ask(f->u, &q, on_res, &pend, &h);
	cr_assert(rc == 0 || (sweep && rc == -ENOMEM), "the pending ask: %d", rc);
	dns_upstream_free(f->u);
	f->u = NULL;
	run_until(f->base, &never, -1, 20);
	cr_assert_eq(pend.calls, 0, "an ask pending at the free was called");
	cr_assert(fds_back(f->base, fds), "a descriptor left open");
}

Test(dns_upstream, tcp_each_allocation_refused_in_turn)
{
	struct fx f;

	fx_start(&f, DNS_UP_TCP, U_SILENT, T_ANSWER);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &f, 4, 200));
	fx_stop(&f);
}

Test(dns_upstream, udp_truncated_each_allocation_refused_in_turn)
{
	struct fx f;

	fx_start(&f, DNS_UP_UDP, U_TC, T_ANSWER);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &f, 4, 200));
	fx_stop(&f);
}

/* ---- libevent's allocations refused in turn, a silent server (failalloc.h, evmem.h) ---- */

/* With evmem installed libevent allocates through the project's allocator: a try's timer
 * may find no room in the timer heap, which grows when its count reaches 8, 16, ... pending
 * timers. Each run has a fresh loop with `pad` far timers of the test's already pending, so
 * that the upstream's first timers (a connect's, then each try's) meet the heap's growth in
 * turn. The server never answers: each of two asks, one after the other, must end with
 * -ETIMEDOUT within its tries (or, a refusal, -ENOMEM), never wait for good; every descriptor
 * comes back. */
struct silent_fx {
	enum dns_up_kind kind;
	int pad;
};

static void silent_scenario(void *arg, bool sweep)
{
	const struct silent_fx *o = arg;
	struct event *pads[16];
	struct dns_upstream_config cfg;
	struct dns_upstream *u = NULL;
	struct event_base *base;
	struct res r[2] = { { 0 }, { 0 } };
	struct dns_question q;
	struct dns_uq *h;
	struct mock m;
	int fds = tu_dir_entries("/proc/self/fd"), rc, calls = 0;

	failalloc_hold(true); /* the loop, the mock server, the padding */
	cr_assert_not_null(base = event_base_new());
	mock_start(&m, base, U_SILENT, T_SILENT);
	failalloc_hold(false);
	failalloc_pad_timers(base, pads, o->pad);
	memset(&cfg, 0, sizeof(cfg));
	cfg.kind = o->kind;
	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cfg.server.port = m.port;
	cfg.timeout_ms = 30;
	cfg.tries = 2;
	if ((rc = dns_upstream_new(base, &cfg, &u)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_upstream_new: %d", rc);
		goto out;
	}
	/* One after the other: a second ask's timer would rescue a first one without (its
	 * timeout voids the connection, and the first goes again on a new one). */
	for (int k = 0; k < 2; k++) {
		r[k].counter = &calls;
		q = question(k ? "q2.test" : "q1.test", DNS_T_A);
		if ((rc = dns_upstream_ask(u, &q, on_res, &r[k], &h)) != 0) {
			cr_assert(sweep && rc == -ENOMEM, "ask %d: %d", k, rc);
			r[k].calls = 1;
			r[k].err = -ENOMEM;
			calls++;
		}
		cr_assert(run_until(base, &calls, k + 1, 2000), "ask %d never ended (pad %d)", k,
			  o->pad);
	}
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(r[k].calls, 1);
		cr_assert(r[k].err == -ETIMEDOUT || (sweep && r[k].err == -ENOMEM),
			  "ask %d: %d", k, r[k].err);
	}
	dns_upstream_free(u);
out:
	failalloc_unpad(pads, o->pad);
	failalloc_hold(true);
	mock_stop(&m);
	event_base_free(base);
	failalloc_hold(false);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds, "a descriptor left open");
}

static void silent_sweeps(enum dns_up_kind kind)
{
	static const int pads[] = { 0, 7, 8 };

	cr_assert_eq(evmem_install(), 0);
	for (size_t i = 0; i < sizeof(pads) / sizeof(pads[0]); i++) {
		struct silent_fx o = { kind, pads[i] };

		cr_log_info("pad %d: %ld allocations refused in turn", pads[i],
			    failalloc_sweep(silent_scenario, &o, 3, 300));
	}
}

Test(dns_upstream, udp_silent_with_libevent_allocations_refused_in_turn)
{
	silent_sweeps(DNS_UP_UDP);
}

Test(dns_upstream, tcp_silent_with_libevent_allocations_refused_in_turn)
{
	silent_sweeps(DNS_UP_TCP);
}
