/* test_dns_tcp.c — hijacked DNS over TCP (dispatch/dns_tcp.c): the length-prefix framer, one
 * connection driven over a loopback TCP pair with a fake resolver (answers in any order, the
 * exact framed bytes the app receives, the app's FIN and reset, the in-flight and idle
 * bounds, bad lengths), the dispatcher's hook (dispatcher_set_dns), the policy's exception
 * for TCP to gateway:53, and, per stack, a real client in a fresh namespace:
 *
 *   client socket ─► TUN tsd0 198.18.0.1/15 ─► stack (system: NAT + kernel listener;
 *   (connects to 198.18.0.53:53)                lwIP: its pcb) ─► dispatcher ─► dns_tcp
 *                                                                       │
 *                                           fake resolver (in the test) ◄┘
 *
 * The fake resolver answers a query with the query itself, QR set, and two bytes (0xAA, the
 * id's low byte) appended, so every reply's bytes are known in advance. Every wait is bounded.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/log.h"
#include "core/netlink.h"
#include "core/pkt.h"
#include "core/tun.h"
#include "dispatch/dispatcher.h"
#include "dispatch/dns_tcp.h"
#include "core/evmem.h"
#include "failalloc.h"
#include "netns_child.h"
#include "stacks/common/l3policy.h"
#include "stacks/netstack.h"
#include "testutil.h"

#define QLEN 27        /* make_query's message */
#define RLEN (QLEN + 2) /* the fake's reply to it */
#define FAKE_MAX 160

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A query for a.example. A with id: the length prefix and QLEN bytes. Returns 2 + QLEN. */
static size_t make_query(uint8_t *out, uint8_t id)
{
	static const uint8_t qname[11] = { 1, 'a', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0 };
	uint8_t *m = out + 2;

	memset(m, 0, QLEN);
	m[1] = id;
	m[2] = 0x01; /* RD */
	m[5] = 1;    /* QDCOUNT */
	memcpy(m + 12, qname, sizeof(qname));
	m[24] = 1;   /* type A */
	m[26] = 1;   /* class IN */
	out[0] = 0;
	out[1] = QLEN;
	return 2 + QLEN;
}

/* The fake resolver's reply to a query m (len bytes) into out, pad bytes 0x55 longer than
 * RLEN for a query of QLEN; returns its length. */
static size_t make_reply(const uint8_t *m, size_t len, size_t pad, uint8_t *out)
{
	memcpy(out, m, len);
	out[2] |= 0x80;
	out[len] = 0xAA;
	out[len + 1] = m[1];
	memset(out + len + 2, 0x55, pad);
	return len + 2 + pad;
}

/* What the app must receive for the query with id: the framed reply. Returns 2 + RLEN. */
static size_t expect_reply(uint8_t *out, uint8_t id)
{
	uint8_t q[2 + QLEN];

	make_query(q, id);
	out[0] = 0;
	out[1] = RLEN;
	return 2 + make_reply(q + 2, QLEN, 0, out + 2);
}

/* ---- the framer ---------------------------------------------------------------------------- */

Test(dns_tcp_framer, split_prefix_byte_by_byte)
{
	static struct dns_tcp_framer f;
	uint8_t in[2 * (2 + QLEN)];
	const uint8_t *msg;
	size_t len, n = make_query(in, 1);

	n += make_query(in + n, 2);
	dns_tcp_framer_init(&f);
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(dns_tcp_framer_push(&f, in + i, 1), 1);
		int want = (i == 2 + QLEN - 1 || i == n - 1) ? 1 : 0;
		cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), want, "after byte %zu", i);
		if (want) {
			cr_assert_eq(len, QLEN);
			cr_assert_eq(memcmp(msg, i < 2 + QLEN ? in + 2 : in + 4 + QLEN, QLEN), 0);
			cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 0);
		}
	}
	cr_assert_eq(dns_tcp_framer_held(&f), 0);
}

Test(dns_tcp_framer, two_queries_in_one_read)
{
	static struct dns_tcp_framer f;
	uint8_t in[2 * (2 + QLEN) + 1];
	const uint8_t *msg;
	size_t len, n = make_query(in, 7);

	n += make_query(in + n, 8);
	in[n++] = 0; /* the first byte of a third prefix */
	dns_tcp_framer_init(&f);
	cr_assert_eq(dns_tcp_framer_push(&f, in, n), n);
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 1);
	cr_assert(len == QLEN && msg[1] == 7);
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 1);
	cr_assert(len == QLEN && msg[1] == 8);
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 0);
	cr_assert_eq(dns_tcp_framer_held(&f), 1);
}

Test(dns_tcp_framer, length_below_a_header_is_refused)
{
	static struct dns_tcp_framer f;
	static const uint8_t bad[][2] = { { 0, 0 }, { 0, 1 }, { 0, DNS_TCP_HEADER_MIN - 1 } };
	uint8_t ok[2 + DNS_TCP_HEADER_MIN] = { 0, DNS_TCP_HEADER_MIN };
	const uint8_t *msg;
	size_t len;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		dns_tcp_framer_init(&f);
		dns_tcp_framer_push(&f, bad[i], 2);
		cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), -EBADMSG, "length %u", bad[i][1]);
	}
	dns_tcp_framer_init(&f);
	dns_tcp_framer_push(&f, ok, sizeof(ok));
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 1, "a bare header is a message");
	cr_assert_eq(len, DNS_TCP_HEADER_MIN);
}

Test(dns_tcp_framer, oversize_is_refused_at_the_prefix)
{
	static struct dns_tcp_framer f;
	static uint8_t big[2 + DNS_TCP_QUERY_MAX];
	uint8_t over[2] = { (DNS_TCP_QUERY_MAX + 1) >> 8, (uint8_t)(DNS_TCP_QUERY_MAX + 1) };
	uint8_t max16[2] = { 0xff, 0xff };
	const uint8_t *msg;
	size_t len, room;

	dns_tcp_framer_init(&f);
	dns_tcp_framer_push(&f, over, 2);
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), -EBADMSG, "no body needed to refuse");
	dns_tcp_framer_init(&f);
	dns_tcp_framer_push(&f, max16, 2);
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), -EBADMSG);
	/* The largest query fills the buffer exactly; taken, the whole room is back. */
	big[0] = DNS_TCP_QUERY_MAX >> 8;
	big[1] = (uint8_t)DNS_TCP_QUERY_MAX;
	dns_tcp_framer_init(&f);
	cr_assert_eq(dns_tcp_framer_push(&f, big, sizeof(big)), sizeof(big));
	dns_tcp_framer_space(&f, &room);
	cr_assert_eq(room, 0);
	cr_assert_eq(dns_tcp_framer_push(&f, big, 1), 0, "nothing fits");
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 1);
	cr_assert_eq(len, DNS_TCP_QUERY_MAX);
	dns_tcp_framer_space(&f, &room);
	cr_assert_eq(room, DNS_TCP_FRAME_MAX);
}

/* A partial message left after whole ones is moved to the front and completed there. */
Test(dns_tcp_framer, partial_tail_survives_compaction)
{
	static struct dns_tcp_framer f;
	uint8_t in[2 * (2 + QLEN)];
	const uint8_t *msg;
	size_t len, n = make_query(in, 3);

	n += make_query(in + n, 4);
	dns_tcp_framer_init(&f);
	dns_tcp_framer_push(&f, in, 2 + QLEN + 5);
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 1);
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 0);
	dns_tcp_framer_push(&f, in + 2 + QLEN + 5, n - (2 + QLEN + 5));
	cr_assert_eq(dns_tcp_framer_next(&f, &msg, &len), 1);
	cr_assert(len == QLEN && memcmp(msg, in + 4 + QLEN, QLEN) == 0);
}

/* ---- the fake resolver --------------------------------------------------------------------- */

enum fq_state { FQ_PENDING, FQ_ANSWERED, FQ_CANCELLED };

struct fq {
	uint8_t m[DNS_TCP_QUERY_MAX];
	size_t len;
	dns_reply_fn fn;
	void *arg;
	enum fq_state st;
	uint64_t replies_before; /* replies written when this query was handed over */
};

struct fake {
	struct fq q[FAKE_MAX];
	int n;
	bool immediate[256]; /* by the id's low byte: answered inside the query call */
	bool refuse;         /* every query: -ENOBUFS */
	size_t pad;          /* replies this much longer */
	int cancels;
	int bad;             /* contract violations seen (checked by the tests) */
	const struct dns_tcp_counters *ctr;
};

static int fake_query(void *ctx, const uint8_t *m, size_t len, bool tcp, size_t mtu_payload,
		      dns_reply_fn fn, void *arg, struct dns_ticket **t)
{
	struct fake *f = ctx;
	static uint8_t r[65535];
	struct fq *q;

	(void)mtu_payload;
	if (!tcp || len < DNS_TCP_HEADER_MIN || len > DNS_TCP_QUERY_MAX || f->n >= FAKE_MAX) {
		f->bad++;
		return -EINVAL;
	}
	if (f->refuse)
		return -ENOBUFS;
	q = &f->q[f->n++];
	memcpy(q->m, m, len);
	q->len = len;
	q->fn = fn;
	q->arg = arg;
	q->replies_before = f->ctr ? ctr_get(&f->ctr->replies) : 0;
	if (f->immediate[m[1]]) {
		q->st = FQ_ANSWERED;
		*t = NULL;
		fn(arg, r, make_reply(m, len, f->pad, r));
		return 0;
	}
	q->st = FQ_PENDING;
	*t = (struct dns_ticket *)q;
	return 0;
}

static void fake_cancel(void *ctx, struct dns_ticket *t)
{
	struct fake *f = ctx;
	struct fq *q = (struct fq *)t;

	if (q < f->q || q >= f->q + f->n || q->st != FQ_PENDING) {
		f->bad++;
		return;
	}
	q->st = FQ_CANCELLED;
	f->cancels++;
}

/* Answer the i-th query handed over (it must be pending). */
static void fake_answer(struct fake *f, int i)
{
	static uint8_t r[65535];
	struct fq *q = &f->q[i];

	if (i >= f->n || q->st != FQ_PENDING) {
		f->bad++;
		return;
	}
	q->st = FQ_ANSWERED;
	q->fn(q->arg, r, make_reply(q->m, q->len, f->pad, r));
}

static int fake_index(const struct fake *f, uint8_t id)
{
	for (int i = 0; i < f->n; i++)
		if (f->q[i].m[1] == id)
			return i;
	return -1;
}

/* ---- the app's side ----------------------------------------------------------------------- */

struct app {
	int fd;
	uint8_t rx[1 << 20];
	size_t rx_len;
	bool eof;
	int err; /* the read error that ended it (ECONNRESET ...) */
};

static void app_drain(struct app *a)
{
	ssize_t n;

	while (a->fd >= 0 && !a->eof && !a->err && a->rx_len < sizeof(a->rx)) {
		n = read(a->fd, a->rx + a->rx_len, sizeof(a->rx) - a->rx_len);
		if (n > 0)
			a->rx_len += (size_t)n;
		else if (n == 0)
			a->eof = true;
		else if (errno != EAGAIN)
			a->err = errno;
		if (n <= 0)
			break;
	}
}

static void app_send(struct app *a, const void *b, size_t n)
{
	cr_assert_eq(send(a->fd, b, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Send framed queries for ids[0..n). */
static void app_send_queries(struct app *a, const uint8_t *ids, size_t n)
{
	static uint8_t buf[FAKE_MAX * (2 + QLEN)];
	size_t len = 0;

	for (size_t i = 0; i < n; i++)
		len += make_query(buf + len, ids[i]);
	app_send(a, buf, len);
}

/* Does the app hold exactly the framed replies to ids[0..n), in that order? */
static bool app_got(const struct app *a, const uint8_t *ids, size_t n)
{
	uint8_t want[2 + RLEN];
	size_t off = 0;

	for (size_t i = 0; i < n; i++) {
		size_t l = expect_reply(want, ids[i]);
		if (a->rx_len < off + l || memcmp(a->rx + off, want, l) != 0)
			return false;
		off += l;
	}
	return a->rx_len == off;
}

/* ---- one connection over a loopback TCP pair ----------------------------------------------- */

static struct {
	struct event_base *base;
	struct budget *bud;
	struct dns_tcp_counters ctr;
	struct fake fk;
	struct dns_tcp_resolver res;
	struct app app;
	struct dns_tcp *conn;
	int done_calls;
} E;

static void on_done(void *arg)
{
	(void)arg;
	E.done_calls++;
	E.conn = NULL;
}

static void conn_setup(void)
{
	struct budget_limits lim;

	signal(SIGPIPE, SIG_IGN);
	memset(&E, 0, sizeof(E));
	E.app.fd = -1;
	E.base = event_base_new();
	cr_assert(E.base);
	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&lim, &E.bud), 0);
	E.fk.ctr = &E.ctr;
	E.res = (struct dns_tcp_resolver){ fake_query, fake_cancel, &E.fk };
}

static void conn_teardown(void)
{
	if (E.conn)
		dns_tcp_cancel(E.conn);
	if (E.app.fd >= 0)
		close(E.app.fd);
	event_base_free(E.base);
	budget_free(E.bud);
	CHECK_LEAKS();
}

/* The app's socket and the accepted one (wrapped as the stream), over 127.0.0.1; the app's
 * receive and the stream's send buffer at their minimum with small_bufs. */
static void conn_open_bufs(uint32_t idle_ms, bool small_bufs)
{
	int small = 8192;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	struct dns_tcp_params p = { .resolver = &E.res, .budget = E.bud, .idle_ms = idle_ms,
				    .counters = &E.ctr };
	struct stream *s;
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), acc;

	cr_assert(l >= 0);
	/* Set before the handshake (inherited by the accepted socket; the window scale is
	 * chosen from them): shrinking a buffer later makes the kernel drop what the window
	 * still allows, and retransmission backoff stalls the test. */
	if (small_bufs)
		cr_assert_eq(setsockopt(l, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 4), 0);
	cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	E.app.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (small_bufs)
		cr_assert_eq(setsockopt(E.app.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)),
			     0);
	cr_assert_eq(connect(E.app.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	acc = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	cr_assert(acc >= 0);
	close(l);
	cr_assert_eq(fcntl(E.app.fd, F_SETFL, O_NONBLOCK), 0);
	cr_assert_eq(stream_sock_new(E.base, acc, &s), 0);
	cr_assert_eq(dns_tcp_new(E.base, s, &p, on_done, NULL, &E.conn), 0);
}

static void conn_open(uint32_t idle_ms)
{
	conn_open_bufs(idle_ms, false);
}

static void step(void)
{
	struct pollfd pf = { E.app.fd, POLLIN, 0 };

	event_base_loop(E.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	poll(&pf, 1, 1);
	app_drain(&E.app);
}

/* Run the loop for ms, whatever happens. */
static void run_for(int ms)
{
	int64_t end = mono_ms() + ms;

	while (mono_ms() < end)
		step();
}

/* Run the loop for ms without the app reading. */
static void loop_only(int ms)
{
	for (int64_t end = mono_ms() + ms; mono_ms() < end;) {
		event_base_loop(E.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
		usleep(1000);
	}
}

#define WAIT_FOR(cond, ms)                                                                     \
	do {                                                                                   \
		int64_t end_ = mono_ms() + (ms);                                               \
		while (!(cond) && mono_ms() < end_)                                            \
			step();                                                                \
		cr_assert(cond, "waited %d ms for %s", (int)(ms), #cond);                      \
	} while (0)

TestSuite(dns_tcp, .init = conn_setup, .fini = conn_teardown, .timeout = 30);

/* Pipelined queries; some answered inside the query call, the others later and in reverse:
 * the app gets each reply framed, in the order they were answered; then its FIN, our FIN. */
Test(dns_tcp, replies_in_any_order_exact_bytes)
{
	static const uint8_t ids[] = { 1, 2, 3, 4, 5, 6 };
	static const uint8_t order[] = { 1, 3, 5, 6, 4, 2 };

	E.fk.immediate[1] = E.fk.immediate[3] = E.fk.immediate[5] = true;
	conn_open(5000);
	app_send_queries(&E.app, ids, 6);
	WAIT_FOR(E.fk.n == 6 && app_got(&E.app, order, 3), 2000);
	fake_answer(&E.fk, fake_index(&E.fk, 6));
	WAIT_FOR(app_got(&E.app, order, 4), 2000);
	fake_answer(&E.fk, fake_index(&E.fk, 4));
	fake_answer(&E.fk, fake_index(&E.fk, 2));
	WAIT_FOR(app_got(&E.app, order, 6), 2000);
	cr_assert_eq(E.done_calls, 0);
	cr_assert_eq(shutdown(E.app.fd, SHUT_WR), 0);
	WAIT_FOR(E.app.eof, 2000);
	cr_assert(app_got(&E.app, order, 6), "nothing after the replies");
	cr_assert_eq(E.done_calls, 1);
	cr_assert_eq(ctr_get(&E.ctr.connections), 1);
	cr_assert_eq(ctr_get(&E.ctr.queries), 6);
	cr_assert_eq(ctr_get(&E.ctr.replies), 6);
	cr_assert_eq(ctr_get(&E.ctr.closed_done), 1);
	cr_assert_eq(ctr_get(&E.ctr.live), 0);
	cr_assert_eq(E.fk.cancels, 0);
	cr_assert_eq(E.fk.bad, 0);
}

/* A query split across writes, its length prefix byte by byte. */
Test(dns_tcp, query_split_across_writes)
{
	uint8_t q[2 + QLEN];
	static const uint8_t id9[] = { 9 };
	size_t n = make_query(q, 9);

	E.fk.immediate[9] = true;
	conn_open(5000);
	for (size_t i = 0; i < n; i++) {
		app_send(&E.app, q + i, 1);
		run_for(2);
		cr_assert_eq(E.fk.n, i == n - 1 ? 1 : 0, "after byte %zu", i);
	}
	WAIT_FOR(app_got(&E.app, id9, 1), 2000);
}

/* The app's FIN with replies still due: they are written first, then our FIN. */
Test(dns_tcp, fin_after_the_last_reply)
{
	static const uint8_t ids[] = { 1, 2 };
	static const uint8_t order[] = { 2, 1 };

	conn_open(5000);
	app_send_queries(&E.app, ids, 2);
	cr_assert_eq(shutdown(E.app.fd, SHUT_WR), 0);
	WAIT_FOR(E.fk.n == 2, 2000);
	run_for(50);
	cr_assert(!E.app.eof && E.done_calls == 0, "replies still due");
	fake_answer(&E.fk, 1);
	WAIT_FOR(app_got(&E.app, order, 1), 2000);
	cr_assert(!E.app.eof);
	fake_answer(&E.fk, 0);
	WAIT_FOR(E.app.eof, 2000);
	cr_assert(app_got(&E.app, order, 2));
	cr_assert_eq(ctr_get(&E.ctr.closed_done), 1);
	cr_assert_eq(E.done_calls, 1);
	cr_assert_eq(E.fk.cancels, 0);
}

/* The app resets: every outstanding ticket is cancelled, none of the answered ones. */
Test(dns_tcp, app_reset_cancels_outstanding)
{
	static const uint8_t ids[] = { 1, 2, 3, 4 };
	struct linger lg = { 1, 0 };

	E.fk.immediate[2] = true;
	conn_open(5000);
	app_send_queries(&E.app, ids, 4);
	WAIT_FOR(E.fk.n == 4 && E.app.rx_len == 2 + RLEN, 2000);
	cr_assert_eq(setsockopt(E.app.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(E.app.fd);
	E.app.fd = -1;
	WAIT_FOR(E.done_calls == 1, 2000);
	cr_assert_eq(E.fk.cancels, 3);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(E.fk.q[i].st, E.fk.q[i].m[1] == 2 ? FQ_ANSWERED : FQ_CANCELLED);
	cr_assert_eq(ctr_get(&E.ctr.closed_reset), 1);
	cr_assert_eq(ctr_get(&E.ctr.live), 0);
	cr_assert_eq(E.fk.bad, 0);
}

/* dns_tcp_cancel (the dispatcher's shutdown) cancels the outstanding tickets too. */
Test(dns_tcp, cancel_cancels_outstanding)
{
	static const uint8_t ids[] = { 1, 2 };

	conn_open(5000);
	app_send_queries(&E.app, ids, 2);
	WAIT_FOR(E.fk.n == 2, 2000);
	dns_tcp_cancel(E.conn);
	cr_assert_eq(E.done_calls, 1, "done runs inside dns_tcp_cancel");
	cr_assert_eq(E.fk.cancels, 2);
	cr_assert_eq(ctr_get(&E.ctr.closed_cancelled), 1);
	WAIT_FOR(E.app.err == ECONNRESET, 2000);
}

/* 64 queries in flight: the 65th is not handed over until a reply went out. */
Test(dns_tcp, inflight_bound)
{
	uint8_t ids[DNS_TCP_MAX_INFLIGHT + 1];
	static const uint8_t first[] = { 0 };

	for (size_t i = 0; i < sizeof(ids); i++)
		ids[i] = (uint8_t)i;
	conn_open(5000);
	app_send_queries(&E.app, ids, sizeof(ids));
	WAIT_FOR(E.fk.n == DNS_TCP_MAX_INFLIGHT, 2000);
	run_for(100);
	cr_assert_eq(E.fk.n, DNS_TCP_MAX_INFLIGHT, "the 65th waits");
	fake_answer(&E.fk, 0);
	WAIT_FOR(E.fk.n == DNS_TCP_MAX_INFLIGHT + 1, 2000);
	cr_assert_eq(E.fk.q[DNS_TCP_MAX_INFLIGHT].m[1], DNS_TCP_MAX_INFLIGHT);
	cr_assert_eq(E.fk.q[DNS_TCP_MAX_INFLIGHT].replies_before, 1,
		     "handed over only after the reply was written");
	WAIT_FOR(app_got(&E.app, first, 1), 2000);
	dns_tcp_cancel(E.conn);
	cr_assert_eq(E.fk.cancels, DNS_TCP_MAX_INFLIGHT);
	cr_assert_eq(E.fk.bad, 0);
}

/* Replies the app does not read pile up to DNS_TCP_OUT_MAX: then no query is taken; as the
 * app reads, the rest are answered. */
Test(dns_tcp, output_bound_stops_reading)
{
	enum { N = 40, PAD = 20000 };
	uint8_t ids[N];
	int held;

	for (size_t i = 0; i < N; i++) {
		ids[i] = (uint8_t)i;
		E.fk.immediate[i] = true;
	}
	E.fk.pad = PAD;
	conn_open_bufs(5000, true);
	app_send_queries(&E.app, ids, N);
	/* The loop without the app reading: the kernel's small buffers fill, then ours. */
	loop_only(300);
	held = E.fk.n;
	/* Taking stops once DNS_TCP_OUT_MAX bytes wait: each reply is 20031 bytes, so at least
	 * 4 were taken (3 are below the bound) and, the kernel's two small buffers (8 KiB each,
	 * doubled by the kernel) holding what was written, a few more at most; without the
	 * bound all N would be. */
	cr_assert(held >= 4 && held <= 8, "%d queries taken, want 4..8", held);
	loop_only(100);
	cr_assert_eq(E.fk.n, held, "nothing more taken while the app does not read");
	WAIT_FOR(E.app.rx_len == (size_t)N * (2 + RLEN + PAD), 5000);
	cr_assert_eq(E.fk.n, N);
	cr_assert_eq(ctr_get(&E.ctr.replies), N);
}

/* Idle: closed idle_ms after the last reply, never while a query is in flight. */
Test(dns_tcp, idle_close)
{
	static const uint8_t one[] = { 1 }, two[] = { 2 };
	int64_t t0, t1;

	E.fk.immediate[1] = true;
	conn_open(200);
	app_send_queries(&E.app, one, 1);
	WAIT_FOR(app_got(&E.app, one, 1), 2000);
	t0 = mono_ms();
	WAIT_FOR(E.app.eof, 2000);
	cr_assert_geq(mono_ms() - t0, 150, "closed after %lld ms", (long long)(mono_ms() - t0));
	cr_assert_eq(ctr_get(&E.ctr.closed_idle), 1);
	cr_assert_eq(E.done_calls, 1);

	/* A second connection whose query the resolver holds for longer than idle_ms. */
	close(E.app.fd);
	E.app = (struct app){ .fd = -1 };
	conn_open(200);
	app_send_queries(&E.app, two, 1);
	WAIT_FOR(E.fk.n == 2, 2000);
	run_for(500);
	cr_assert(!E.app.eof && E.done_calls == 1, "not idle while a query is in flight");
	fake_answer(&E.fk, 1);
	WAIT_FOR(app_got(&E.app, two, 1), 2000);
	t1 = mono_ms();
	WAIT_FOR(E.app.eof, 2000);
	cr_assert_geq(mono_ms() - t1, 150);
	cr_assert_eq(ctr_get(&E.ctr.closed_idle), 2);
}

/* Stalled: an app that stops reading leaves replies waiting; once none of their bytes has been
 * taken for idle_ms the connection is reset, its session and memory freed. */
Test(dns_tcp, a_client_that_stops_reading_is_reset)
{
	enum { N = 10, PAD = 20000 };
	uint8_t ids[N];
	int64_t t0;

	for (size_t i = 0; i < N; i++) {
		ids[i] = (uint8_t)i;
		E.fk.immediate[i] = true;
	}
	E.fk.pad = PAD;
	conn_open_bufs(1000, true);
	t0 = mono_ms();
	app_send_queries(&E.app, ids, N);
	loop_only(300);
	cr_assert_eq(E.done_calls, 0, "replies wait; not stalled yet");
	for (int64_t end = mono_ms() + 4000; E.done_calls == 0 && mono_ms() < end;)
		loop_only(10);
	cr_assert_eq(E.done_calls, 1, "reset once the replies stalled for idle_ms");
	/* At the stall deadline, not a whole idle_ms after it. */
	cr_assert_lt(mono_ms() - t0, 1700, "reset after %lld ms", (long long)(mono_ms() - t0));
	cr_assert_eq(ctr_get(&E.ctr.closed_stalled), 1);
	cr_assert_eq(ctr_get(&E.ctr.closed_idle), 0);
	cr_assert_lt(ctr_get(&E.ctr.replies), N, "not every reply was written");
	WAIT_FOR(E.app.err == ECONNRESET, 2000);
}

/* A slow reader is not stalled: every read moves the replies on, and all arrive. */
Test(dns_tcp, a_slow_reader_is_not_reset)
{
	enum { N = 10, PAD = 20000 };
	uint8_t ids[N];

	for (size_t i = 0; i < N; i++) {
		ids[i] = (uint8_t)i;
		E.fk.immediate[i] = true;
	}
	E.fk.pad = PAD;
	conn_open_bufs(300, true);
	app_send_queries(&E.app, ids, N);
	for (int64_t end = mono_ms() + 5000;
	     E.app.rx_len < (size_t)N * (2 + RLEN + PAD) && mono_ms() < end;) {
		loop_only(150); /* half of idle_ms between reads */
		app_drain(&E.app);
	}
	cr_assert_eq(E.app.rx_len, (size_t)N * (2 + RLEN + PAD), "every reply arrived");
	cr_assert_eq(ctr_get(&E.ctr.closed_stalled), 0);
	cr_assert_eq(E.done_calls, 0);
}

static void bad_length(const uint8_t prefix[2])
{
	conn_open(5000);
	app_send(&E.app, prefix, 2);
	WAIT_FOR(E.done_calls == 1, 2000);
	WAIT_FOR(E.app.err == ECONNRESET, 2000);
	cr_assert_eq(ctr_get(&E.ctr.closed_bad_length), 1);
	cr_assert_eq(E.fk.n, 0);
}

Test(dns_tcp, short_length_resets)
{
	static const uint8_t p[2] = { 0, 11 };
	bad_length(p);
}

Test(dns_tcp, oversize_length_resets)
{
	static const uint8_t p[2] = { (DNS_TCP_QUERY_MAX + 1) >> 8, (DNS_TCP_QUERY_MAX + 1) & 0xff };
	bad_length(p);
}

/* The resolver refuses at once (-ENOBUFS): the client gets REFUSED, header only. */
Test(dns_tcp, resolver_refusal_answers_refused)
{
	static const uint8_t id7[] = { 7 };
	static const uint8_t want[2 + 12] = { 0, 12, 0, 7, 0x81, 0x05 };

	E.fk.refuse = true;
	conn_open(5000);
	app_send_queries(&E.app, id7, 1);
	WAIT_FOR(E.app.rx_len == sizeof(want), 2000);
	cr_assert_eq(memcmp(E.app.rx, want, sizeof(want)), 0);
	cr_assert_eq(ctr_get(&E.ctr.queries_refused), 1);
	cr_assert_eq(ctr_get(&E.ctr.queries), 0);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* conn_open's pair and connection: 0, or -ENOMEM with nothing left open. */
static int nomem_open(uint32_t idle_ms)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	struct dns_tcp_params p = { .resolver = &E.res, .budget = E.bud, .idle_ms = idle_ms,
				    .counters = &E.ctr };
	struct stream *s;
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), acc, rc;

	cr_assert(l >= 0);
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 4), 0);
	cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	E.app.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(E.app.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	acc = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	cr_assert(acc >= 0);
	close(l);
	cr_assert_eq(fcntl(E.app.fd, F_SETFL, O_NONBLOCK), 0);
	if ((rc = stream_sock_new(E.base, acc, &s)) != 0) {
		close(acc);
		return rc;
	}
	if ((rc = dns_tcp_new(E.base, s, &p, on_done, NULL, &E.conn)) != 0)
		stream_abort(s);
	return rc;
}

/* One connection's life: four queries, two answered inside the call, one later, one pending
 * at the cancel. The app gets every reply, in the order answered, or the connection is reset
 * and counted in closed_nomem; done runs once; every ticket is answered or cancelled; every
 * budget byte comes back. */
static void nomem_scenario(void *arg, bool sweep)
{
	static const uint8_t ids[] = { 1, 2, 3, 4 }, order[] = { 1, 3, 2 };
	struct budget_stats bs;
	uint64_t nomem0 = ctr_get(&E.ctr.closed_nomem);
	int rc, i;

	(void)arg;
	memset(&E.fk, 0, sizeof(E.fk));
	E.fk.ctr = &E.ctr;
	E.fk.immediate[1] = E.fk.immediate[3] = true;
	E.app.rx_len = 0;
	E.app.eof = false;
	E.app.err = 0;
	E.conn = NULL;
	E.done_calls = 0;
	if ((rc = nomem_open(5000)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "open: %d", rc);
		cr_assert_null(E.conn);
		goto out;
	}
	app_send_queries(&E.app, ids, 4);
	WAIT_FOR(E.fk.n == 4 || E.done_calls, 2000);
	if ((i = fake_index(&E.fk, 2)) >= 0 && E.fk.q[i].st == FQ_PENDING)
		fake_answer(&E.fk, i);
	WAIT_FOR(app_got(&E.app, order, 3) || E.app.err || E.app.eof, 2000);
	if (!app_got(&E.app, order, 3)) {
		cr_assert(sweep, "the replies did not come");
		WAIT_FOR(E.done_calls == 1, 2000);
		cr_assert_eq(ctr_get(&E.ctr.closed_nomem), nomem0 + 1, "a reset not counted");
		cr_assert_eq(E.app.err, ECONNRESET);
	}
	if (E.conn)
		dns_tcp_cancel(E.conn);
	cr_assert_eq(E.done_calls, 1);
	cr_assert_eq(ctr_get(&E.ctr.live), 0);
	for (i = 0; i < E.fk.n; i++)
		cr_assert_neq(E.fk.q[i].st, FQ_PENDING, "query %d neither answered nor cancelled", i);
	cr_assert_eq(E.fk.bad, 0);
out:
	budget_get_stats(E.bud, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 0, "budget bytes kept");
	close(E.app.fd);
	E.app.fd = -1;
}

Test(dns_tcp, each_allocation_refused_in_turn)
{
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, NULL, 3,
								      200));
}

/* ---- libevent's allocations refused in turn, a silent app (failalloc.h, evmem.h) ---- */

/* With evmem installed libevent allocates through the project's allocator; on a fresh loop the
 * connection's idle timer is the one that makes libevent's timer heap, and its socket's watch
 * the one that makes libevent's table of descriptors. The app connects and never sends: the
 * connection must end by its 100 ms idle timeout (closed, an EOF to the app), or be refused
 * (-ENOMEM) or reset at once; never stay open. */
static void silent_scenario(void *arg, bool sweep)
{
	struct event_base *own = E.base;
	int64_t t0;
	int rc;

	(void)arg;
	memset(&E.fk, 0, sizeof(E.fk));
	E.fk.ctr = &E.ctr;
	E.app.rx_len = 0;
	E.app.eof = false;
	E.app.err = 0;
	E.conn = NULL;
	E.done_calls = 0;
	failalloc_hold(true); /* the loop */
	cr_assert_not_null(E.base = event_base_new());
	failalloc_hold(false);
	t0 = mono_ms();
	if ((rc = nomem_open(100)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "open: %d", rc);
		cr_assert_null(E.conn);
		goto out;
	}
	WAIT_FOR(E.done_calls == 1, 2000);
	WAIT_FOR(E.app.eof || E.app.err, 2000);
	cr_assert(E.app.err == 0 || sweep, "reset: %d", E.app.err);
	cr_assert(E.app.err != 0 || mono_ms() - t0 >= 90, "closed before its idle timeout");
out:
	close(E.app.fd);
	E.app.fd = -1;
	failalloc_hold(true);
	event_base_free(E.base);
	E.base = own;
	failalloc_hold(false);
	cr_assert_eq(ctr_get(&E.ctr.live), 0);
}

Test(dns_tcp, silent_app_with_libevent_allocations_refused_in_turn)
{
	cr_assert_eq(evmem_install(), 0);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(silent_scenario, NULL, 3,
								      200));
}

/* ---- the dispatcher's hook ----------------------------------------------------------------- */

static struct {
	struct ts_config cfg;
	struct dispatcher *disp;
	int ends;
} D;

static void disp_on_end(void *arg)
{
	(void)arg;
	D.ends++;
}

/* Everything routes to a reject outbound: a session that is not answered here is refused. */
static void disp_setup(void)
{
	char err[TS_ERRLEN];

	conn_setup();
	memset(&D, 0, sizeof(D));
	cr_assert_eq(config_load_string("{ \"outbounds\": [ { \"tag\": \"block\","
					" \"type\": \"reject\" } ], \"route\": { \"final\": \"block\" } }",
					&D.cfg, err, sizeof(err)),
		     0, "%s", err);
	D.cfg.dns.hijack = true;
	cr_assert_eq(dispatcher_new(E.base, &D.cfg, E.bud, &D.disp), 0);
	dispatcher_set_dns(D.disp, &E.res);
}

static void disp_teardown(void)
{
	dispatcher_free(D.disp);
	config_fini(&D.cfg);
	conn_teardown();
}

/* Hand the app's pair to the dispatcher as a stack would, destined to dst:dport. */
static void disp_start(const uint8_t *dst4, uint16_t dport)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct flow_key k = { .family = 4, .dport_be = htons(dport), .sport_be = htons(40000) };
	socklen_t sl = sizeof(sa);
	struct stream *s;
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), acc, ends = D.ends;

	memcpy(k.dst, dst4, 4);
	tu_addr(k.src, "10.0.0.9");
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 4), 0);
	cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	E.app.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(E.app.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	acc = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	close(l);
	cr_assert_eq(fcntl(E.app.fd, F_SETFL, O_NONBLOCK), 0);
	cr_assert_eq(stream_sock_new(E.base, acc, &s), 0);
	cr_assert_eq(dispatcher_start_tcp(D.disp, &k, s, disp_on_end, NULL), 0);
	cr_assert_eq(D.ends, ends, "on_end never runs inside dispatcher_start_tcp");
}

static struct dispatcher_stats dstats(void)
{
	struct dispatcher_stats st;

	dispatcher_get_stats(D.disp, &st);
	return st;
}

TestSuite(dns_tcp_dispatch, .init = disp_setup, .fini = disp_teardown, .timeout = 30);

/* TCP to the gateway's port 53: answered, never routed (the route would reject it). */
Test(dns_tcp_dispatch, gateway_53_is_answered)
{
	static const uint8_t ids[] = { 1, 2 };
	static const uint8_t order[] = { 1, 2 };

	E.fk.immediate[1] = true;
	disp_start(D.cfg.roles4.gateway.a, 53);
	app_send_queries(&E.app, ids, 2);
	WAIT_FOR(E.fk.n == 2 && app_got(&E.app, order, 1), 2000);
	cr_assert_eq(dstats().dns_tcp.live, 1);
	cr_assert_eq(dstats().sessions_active, 1);
	fake_answer(&E.fk, 1);
	WAIT_FOR(app_got(&E.app, order, 2), 2000);
	cr_assert_eq(shutdown(E.app.fd, SHUT_WR), 0);
	WAIT_FOR(E.app.eof && D.ends == 1, 2000);
	cr_assert_eq(dstats().dns_tcp.closed_done, 1);
	cr_assert_eq(dstats().dns_tcp.replies, 2);
	cr_assert_eq(dstats().dns_tcp.live, 0);
	cr_assert_eq(dstats().sessions_active, 0);
	cr_assert_eq(dstats().sessions_refused, 0);
}

/* Any destination address, port 53. Another port, or hijack off, goes the usual way. */
Test(dns_tcp_dispatch, only_port_53_with_hijack)
{
	static const uint8_t ids[] = { 5 };
	uint8_t other[16];

	tu_addr(other, "192.0.2.7");
	E.fk.immediate[5] = true;
	disp_start(other, 53);
	app_send_queries(&E.app, ids, 1);
	WAIT_FOR(app_got(&E.app, ids, 1), 2000);
	close(E.app.fd);
	E.app = (struct app){ .fd = -1 };
	WAIT_FOR(D.ends == 1, 2000);

	disp_start(other, 54);
	WAIT_FOR(D.ends == 2, 2000);
	cr_assert_eq(dstats().fail[DISPATCHER_FAIL_REJECT], 1);
	close(E.app.fd);
	E.app = (struct app){ .fd = -1 };

	D.cfg.dns.hijack = false;
	disp_start(other, 53);
	WAIT_FOR(D.ends == 3, 2000);
	cr_assert_eq(dstats().fail[DISPATCHER_FAIL_REJECT], 2);
	close(E.app.fd);
	E.app = (struct app){ .fd = -1 };

	D.cfg.dns.hijack = true;
	dispatcher_set_dns(D.disp, NULL);
	disp_start(other, 53);
	WAIT_FOR(D.ends == 4, 2000);
	cr_assert_eq(dstats().fail[DISPATCHER_FAIL_REJECT], 3);
	cr_assert_eq(E.fk.n, 1);
	cr_assert_eq(dstats().dns_tcp.connections, 1);
}

/* dispatcher_free ends a DNS session: its ticket cancelled, on_end once, the app reset. */
Test(dns_tcp_dispatch, free_cancels_dns_session)
{
	static const uint8_t ids[] = { 3 };

	disp_start(D.cfg.roles4.gateway.a, 53);
	app_send_queries(&E.app, ids, 1);
	WAIT_FOR(E.fk.n == 1, 2000);
	dispatcher_free(D.disp);
	D.disp = NULL;
	cr_assert_eq(D.ends, 1);
	cr_assert_eq(E.fk.cancels, 1);
	cr_assert_eq(E.fk.bad, 0);
	WAIT_FOR(E.app.err == ECONNRESET, 2000);
}

/* ---- the policy: TCP to gateway:53 ---------------------------------------------------------- */

static enum l3policy_verdict classify(bool hijack, bool dns_tcp, const char *src, const char *dst,
				      uint16_t dport, bool syn)
{
	static uint8_t buf[256];
	struct l3policy_config c = { .has4 = true, .has6 = true, .n_addrs = 4,
				     .dns_hijack = hijack, .dns_tcp = dns_tcp };
	struct l3policy_counters ctr;
	struct l3policy_reply reply;
	struct l3policy p;
	struct pkt_view v;
	struct tu_spec s;
	uint8_t a[16];
	size_t len;

	memset(&ctr, 0, sizeof(ctr));
	tu_addr(a, "198.18.0.1");
	memcpy(c.gateway4, a, 4);
	tu_addr(c.gateway6, "fd00:7f::1");
	cr_assert_eq(l3policy_init(&p, &c), 0);
	tu_spec_tcp(&s, src, 40000, dst, dport);
	if (syn)
		s.tcp_flags = TCP_SYN;
	len = tu_build(&s, buf, sizeof(buf));
	cr_assert_eq(pkt_parse(&v, buf, len), PKT_OK);
	return l3policy_classify(&p, &v, &reply, &ctr);
}

Test(dns_tcp_policy, gateway_53_passes_only_with_dns_tcp)
{
	static const struct {
		const char *src, *dst;
		uint16_t dport;
		bool hijack, dns_tcp;
		enum l3policy_verdict want;
	} rows[] = {
		{ "10.0.0.9", "198.18.0.1", 53, true, true, L3POLICY_TCP },
		{ "10.0.0.9", "198.18.0.1", 53, true, false, L3POLICY_DROP_own_address },
		{ "10.0.0.9", "198.18.0.1", 53, false, true, L3POLICY_DROP_own_address },
		{ "10.0.0.9", "198.18.0.1", 54, true, true, L3POLICY_DROP_own_address },
		{ "10.0.0.9", "198.18.0.2", 53, true, true, L3POLICY_DROP_nat_address },
		{ "10.0.0.9", "192.0.2.7", 53, true, true, L3POLICY_TCP },
		{ "198.18.0.3", "198.18.0.1", 53, true, true, L3POLICY_DROP_from_nat_address },
		{ "fd00::9", "fd00:7f::1", 53, true, true, L3POLICY_TCP },
		{ "fd00::9", "fd00:7f::1", 53, true, false, L3POLICY_DROP_own_address },
		{ "fd00::9", "fd00:7f::1", 80, true, true, L3POLICY_DROP_own_address },
		{ "fd00::9", "fd00:7f::2", 53, true, true, L3POLICY_DROP_nat_address },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		for (int syn = 0; syn < 2; syn++) {
			enum l3policy_verdict v = classify(rows[i].hijack, rows[i].dns_tcp,
							   rows[i].src, rows[i].dst,
							   rows[i].dport, syn);
			cr_assert_eq(v, rows[i].want, "row %zu syn %d: %s", i, syn,
				     l3policy_verdict_name(v));
		}
	}
}

/* ---- a real client through the TUN, per stack (in a fresh namespace) ------------------------ */

static struct {
	struct ts_config cfg;
	struct tun *tun;
	int tfd;
	struct event_base *base;
	struct budget *bud;
	struct dispatcher *disp;
	const struct netstack_ops *ops;
	struct netstack *ns;
	struct log lg;
	struct fake fk;
	struct dns_tcp_resolver res;
	struct app app;
	struct { uint8_t b[2048]; size_t len; } cap[64]; /* packets to the built app HAND */
	int n_cap;
} R;

#define HAND "10.0.0.9" /* an app whose packets the test builds (never a local address) */

/* A packet to HAND is captured (the kernel has no route to it); any other goes to the TUN. */
static int rig_out(const uint8_t *pkt, size_t len)
{
	uint8_t a[16];

	tu_addr(a, HAND);
	if ((pkt[0] >> 4) == 4 && memcmp(pkt + 16, a, 4) == 0) {
		CHECK(R.n_cap < 64 && len <= sizeof(R.cap[0].b), "capture full");
		memcpy(R.cap[R.n_cap].b, pkt, len);
		R.cap[R.n_cap++].len = len;
		return 0;
	}
	return write(R.tfd, pkt, len) == (ssize_t)len ? 0 : -errno;
}

static int rig_tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	return rig_out(pkt, len);
}

static void rig_fatal(void *arg, int err, const char *msg)
{
	(void)arg;
	child_report(1, "stack fatal %d: %s", err, msg);
}

static void rig_start(const char *stack)
{
	char json[1024], err[TS_ERRLEN], note[TS_ERRLEN];
	struct netlink nl;
	struct netlink_link_req up = { .up = 1 };
	struct netstack_env env;

	signal(SIGPIPE, SIG_IGN);
	R.app.fd = -1;
	/* The system stack's in-kernel fast path off: it would hand the kernel's segments for
	 * HAND straight back to the TUN's ingress, where no one but this rig's capture (which
	 * reads what the stack writes) stands for the app. */
	snprintf(json, sizeof(json),
		 "{ \"stack\": \"%s\","
		 "  \"tun\": { \"name\": \"tsd0\", \"address\": \"198.18.0.1/15\","
		 "           \"offload\": \"off\", \"rps\": \"off\" },"
		 "  \"nat\": { \"listeners\": 1, \"fast_path\": \"off\" },"
		 "  \"outbounds\": [ { \"tag\": \"block\", \"type\": \"reject\" } ],"
		 "  \"route\": { \"final\": \"block\" },"
		 "  \"relay\": { \"mode\": \"copy\" } }", stack);
	CHECK(config_load_string(json, &R.cfg, err, sizeof(err)) == 0, "%s", err);
	R.cfg.dns.hijack = true;
	CHECK(netlink_open(&nl) == 0, "netlink");
	CHECK(netlink_link_set(&nl, 1, &up) == 0, "lo up");
	netlink_close(&nl);
	/* No IPv6 on the TUN: only the test's traffic enters it (no MLD, no RS). */
	write_text("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
	CHECK(tun_open_config(&R.cfg.tun, &R.tun, note, sizeof(note), err, sizeof(err)) == 0,
	      "%s", err);
	R.tfd = tun_fd(R.tun, 0);
	CHECK(fcntl(R.tfd, F_SETFL, fcntl(R.tfd, F_GETFL) | O_NONBLOCK) == 0, "nonblock");
	R.base = event_base_new();
	CHECK(budget_new(&R.cfg.budget, &R.bud) == 0, "budget");
	CHECK(dispatcher_new(R.base, &R.cfg, R.bud, &R.disp) == 0, "dispatcher");
	R.res = (struct dns_tcp_resolver){ fake_query, fake_cancel, &R.fk };
	dispatcher_set_dns(R.disp, &R.res);
	log_init(&R.lg, LOG_LEVEL_ERROR, 2);
	R.ops = netstack_lookup(stack);
	CHECK(R.ops != NULL, "no stack %s", stack);
	env = (struct netstack_env){ .base = R.base, .cfg = &R.cfg, .budget = R.bud,
				     .dispatcher = R.disp, .log = &R.lg, .tx = rig_tx,
				     .tun_name = tun_name(R.tun), .fatal = rig_fatal,
				     .dns_tcp = true };
	CHECK(R.ops->start(&env, &R.ns, err, sizeof(err)) == 0, "start: %s", err);
}

static void rig_stop(void)
{
	R.ops->stop(R.ns);
	dispatcher_free(R.disp);
	R.ops->free(R.ns);
	budget_free(R.bud);
	event_base_free(R.base);
	tun_close(R.tun);
	config_fini(&R.cfg);
}

/* One round: the TUN's packets through the stack (a rewrite goes back in), the loop. */
static void rig_step(void)
{
	struct pollfd p[2] = { { R.tfd, POLLIN, 0 }, { R.app.fd, POLLIN, 0 } };
	uint8_t buf[2048];
	struct pkt_view v;
	ssize_t n;

	poll(p, 2, 2);
	while ((n = read(R.tfd, buf, sizeof(buf))) > 0) {
		size_t out = 0;
		bool plain = false;
		if (R.ops->input(R.ns, 0, buf, (size_t)n, NULL, ts_now_ns(), &out, &plain, &v) ==
		    DRIVER_WRITE)
			CHECK(rig_out(buf, out) == 0, "%s", strerror(errno));
	}
	event_base_loop(R.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	R.ops->batch_end(R.ns, 0, ts_now_ns());
	app_drain(&R.app);
}

#define RIG_WAIT(cond, ms)                                                                     \
	do {                                                                                   \
		int64_t end_ = mono_ms() + (ms);                                               \
		while (!(cond) && mono_ms() < end_)                                            \
			rig_step();                                                            \
		CHECK(cond, "waited %d ms (rx %zu eof %d err %d fake %d)", (int)(ms),          \
		      R.app.rx_len, R.app.eof, R.app.err, R.fk.n);                            \
	} while (0)

static bool writable(int fd)
{
	struct pollfd pf = { fd, POLLOUT, 0 };

	return poll(&pf, 1, 0) == 1;
}

/* A client connects to 198.18.0.53:53 (routed into the TUN); three pipelined queries, one
 * answered at once, two later in reverse; its FIN, our FIN; the dispatcher counted it. */
static void through_stack(const char *stack)
{
	static const uint8_t ids[] = { 1, 2, 3 };
	static const uint8_t order[] = { 1, 3, 2 };
	static uint8_t q[3 * (2 + QLEN)];
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(53) };
	struct dispatcher_stats st;
	size_t len = 0;
	int err = 0;
	socklen_t el = sizeof(err);

	rig_start(stack);
	R.fk.immediate[1] = true;
	R.app.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	CHECK(R.app.fd >= 0, "socket");
	inet_pton(AF_INET, "198.18.0.53", &sa.sin_addr);
	CHECK(connect(R.app.fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno == EINPROGRESS,
	      "connect: %s", strerror(errno));
	RIG_WAIT(writable(R.app.fd), 3000);
	CHECK(getsockopt(R.app.fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0,
	      "connect: %s", strerror(err));
	for (size_t i = 0; i < 3; i++)
		len += make_query(q + len, ids[i]);
	CHECK(send(R.app.fd, q, len, MSG_NOSIGNAL) == (ssize_t)len, "send");
	RIG_WAIT(R.fk.n == 3 && app_got(&R.app, order, 1), 3000);
	fake_answer(&R.fk, fake_index(&R.fk, 3));
	RIG_WAIT(app_got(&R.app, order, 2), 3000);
	fake_answer(&R.fk, fake_index(&R.fk, 2));
	RIG_WAIT(app_got(&R.app, order, 3), 3000);
	CHECK(shutdown(R.app.fd, SHUT_WR) == 0, "shutdown");
	RIG_WAIT(R.app.eof, 3000);
	CHECK(app_got(&R.app, order, 3), "exactly the three replies");
	dispatcher_get_stats(R.disp, &st);
	RIG_WAIT((dispatcher_get_stats(R.disp, &st), st.sessions_active == 0), 3000);
	CHECK(st.dns_tcp.connections == 1 && st.dns_tcp.queries == 3 &&
		      st.dns_tcp.replies == 3 && st.dns_tcp.closed_done == 1,
	      "connections %llu queries %llu replies %llu done %llu",
	      (unsigned long long)st.dns_tcp.connections, (unsigned long long)st.dns_tcp.queries,
	      (unsigned long long)st.dns_tcp.replies, (unsigned long long)st.dns_tcp.closed_done);
	CHECK(st.sessions_refused == 0, "no refusal (the route would reject)");
	CHECK(R.fk.bad == 0 && R.fk.cancels == 0, "bad %d cancels %d", R.fk.bad, R.fk.cancels);
	close(R.app.fd);
	rig_stop();
}

/* A built packet from HAND, as if read from the TUN. */
static void rig_inject(const struct tu_spec *sp)
{
	uint8_t buf[2048];
	struct pkt_view v;
	size_t len = tu_build(sp, buf, sizeof(buf)), out = 0;
	bool plain = false;

	if (R.ops->input(R.ns, 0, buf, len, NULL, ts_now_ns(), &out, &plain, &v) == DRIVER_WRITE)
		CHECK(rig_out(buf, out) == 0, "%s", strerror(errno));
}

/* The first captured TCP segment from port 53 with all of flags and (with_data) a payload:
 * its index, or -1. *seq and the payload's place are filled. */
static int cap_find(uint8_t flags, bool with_data, uint32_t *seq, const uint8_t **data,
		    size_t *dlen)
{
	for (int i = 0; i < R.n_cap; i++) {
		const uint8_t *b = R.cap[i].b;
		size_t l3 = (size_t)(b[0] & 0x0f) * 4, tot = tu_get16(b + 2);
		size_t l4 = (size_t)(b[l3 + 12] >> 4) * 4;

		if (b[9] != IPPROTO_TCP || tu_get16(b + l3) != 53 || (b[l3 + 13] & flags) != flags ||
		    (with_data && tot <= l3 + l4))
			continue;
		*seq = tu_get32(b + l3 + 4);
		*data = b + l3 + l4;
		*dlen = tot - l3 - l4;
		return i;
	}
	return -1;
}

/* The app's resolver is the gateway itself: a hand-built connection from HAND to
 * 198.18.0.1:53 (a kernel client in this namespace would reach its own address over lo, not
 * the TUN) is let in by the policy (env.dns_tcp) and answered. */
static void gateway_through_stack(const char *stack)
{
	uint8_t q[2 + QLEN], want[2 + RLEN];
	const uint8_t *data;
	struct dispatcher_stats st;
	struct tu_spec sp;
	uint32_t srv_seq;
	size_t dlen;

	rig_start(stack);
	R.fk.immediate[4] = true;
	tu_spec_tcp(&sp, HAND, 40001, "198.18.0.1", 53);
	sp.tcp_flags = TCP_SYN;
	sp.seq = 1000;
	sp.ack = 0;
	sp.mss = 1400;
	rig_inject(&sp);
	RIG_WAIT(cap_find(TCP_SYN | TCP_ACK, false, &srv_seq, &data, &dlen) >= 0, 3000);
	tu_spec_tcp(&sp, HAND, 40001, "198.18.0.1", 53);
	sp.tcp_flags = TCP_ACK | TCP_PSH;
	sp.seq = 1001;
	sp.ack = srv_seq + 1;
	sp.payload = q;
	sp.payload_len = make_query(q, 4);
	rig_inject(&sp);
	RIG_WAIT(cap_find(TCP_ACK, true, &srv_seq, &data, &dlen) >= 0, 3000);
	CHECK(dlen == expect_reply(want, 4) && memcmp(data, want, dlen) == 0,
	      "the framed reply (%zu bytes)", dlen);
	dispatcher_get_stats(R.disp, &st);
	CHECK(st.dns_tcp.queries == 1 && st.dns_tcp.replies == 1 && st.dns_tcp.live == 1,
	      "queries %llu replies %llu live %llu", (unsigned long long)st.dns_tcp.queries,
	      (unsigned long long)st.dns_tcp.replies, (unsigned long long)st.dns_tcp.live);
	CHECK(st.sessions_refused == 0, "not refused");
	rig_stop(); /* dispatcher_free ends the live session */
}

static void through_system(void)
{
	through_stack("system");
}

static void through_lwip(void)
{
	through_stack("lwip");
}

static void gateway_system(void)
{
	gateway_through_stack("system");
}

static void gateway_lwip(void)
{
	gateway_through_stack("lwip");
}

Test(dns_tcp_stack, system_client_through_tun, .timeout = 60)
{
	run_in_netns(through_system);
}

Test(dns_tcp_stack, lwip_client_through_tun, .timeout = 60)
{
	run_in_netns(through_lwip);
}

Test(dns_tcp_stack, system_gateway_53, .timeout = 60)
{
	run_in_netns(gateway_system);
}

Test(dns_tcp_stack, lwip_gateway_53, .timeout = 60)
{
	run_in_netns(gateway_lwip);
}
