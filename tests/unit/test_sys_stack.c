/* test_sys_stack.c — the system stack at run time (stacks/system/sys_stack.c): the accept loop's
 * error classes, admission refusal, the fd budget and the session guard, on a real TUN.
 *
 * Each scenario runs in a forked child inside a fresh network namespace
 * (tests/unit/netns_child.h) with the whole runtime path except the driver:
 *
 *   test "app" 10.0.0.9:cport ─┐ packets built here
 *                              │ sys_stack_ops.input (uplink rewrite: NAT addr:P -> G:listener)
 *                              ▼
 *          TUN tss0 198.18.0.1/15 ── kernel TCP ── listener on G ── accept loop
 *                              ▲                                      │ dispatcher (direct)
 *                              │ downlink rewrite back to the app     ▼
 *   packets read from the TUN ─┘                         server on 10.77.9.9:SRV_PORT (lo)
 *
 * The app's original destination is a server on an address of lo (not 127.0.0.1: the policy
 * refuses loopback destinations from the TUN), so the direct outbound reaches it without
 * routing tricks; the kernel sees only the NAT and gateway addresses. Every wait is
 * bounded. Counters are checked by exact amounts: admission_refused, fd_exhausted, accepted,
 * the NAT table's CLOSING and ACTIVE entries, the budget's permits.
 *
 * The error table (sys_stack_accept_error_class) runs without namespaces. For real: EMFILE
 * from a lowered RLIMIT_NOFILE (back-off, one rate-limited warning, accepting again afterwards)
 * and a listener broken under the loop (accept fails with EINVAL: fatal, reported once).
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/evmem.h"
#include "core/log.h"
#include "core/loopguard.h"
#include "core/netlink.h"
#include "core/pkt.h"
#include "core/tun.h"
#include "dispatch/dispatcher.h"
#include "failalloc.h"
#include "netns_child.h"
#include "stacks/system/sys_stack.h"
#include "testutil.h"

#define APP "10.0.0.9"      /* the app behind the TUN (outside its prefix: never local) */
#define GW "198.18.0.1"     /* the TUN's address: the source of our own sockets come back */
#define SRV "10.77.9.9"     /* every original destination: a server on an address of lo */
#define SRV_PORT 8080
#define DEAD_PORT 8081      /* nothing listens: the outbound is refused */
#define APP_Q 64
#define MAX_CONNS 16
/* Eight TCP permits in every pressure tier (tiers must not increase with pressure). */
#define TCP8 "\"tcp_sessions\": 8, \"tcp_sessions_elevated\": 8, \"tcp_sessions_critical\": 8"

/* ---- the error table (no namespace) ---- */

Test(sys_stack, accept_error_classes)
{
	static const int backoff[] = { EMFILE, ENFILE, ENOBUFS, ENOMEM };
	static const int retry[] = { EINTR, EPROTO, ECONNABORTED, ENETDOWN, ENOPROTOOPT,
				     EHOSTDOWN, ENONET, EHOSTUNREACH, EOPNOTSUPP, ENETUNREACH };
	static const int fatal[] = { EBADF, EINVAL, ENOTSOCK, EFAULT, EPERM, ECONNRESET,
				     ETIMEDOUT, EIO, 0 };

	cr_assert_eq(sys_stack_accept_error_class(EAGAIN), SYS_ACCEPT_AGAIN);
	cr_assert_eq(sys_stack_accept_error_class(EWOULDBLOCK), SYS_ACCEPT_AGAIN);
	for (size_t i = 0; i < sizeof(backoff) / sizeof(backoff[0]); i++)
		cr_assert_eq(sys_stack_accept_error_class(backoff[i]), SYS_ACCEPT_BACKOFF,
			     "%s", strerror(backoff[i]));
	for (size_t i = 0; i < sizeof(retry) / sizeof(retry[0]); i++)
		cr_assert_eq(sys_stack_accept_error_class(retry[i]), SYS_ACCEPT_RETRY,
			     "%s", strerror(retry[i]));
	for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
		cr_assert_eq(sys_stack_accept_error_class(fatal[i]), SYS_ACCEPT_FATAL,
			     "%s", strerror(fatal[i]));
}

/* ---- the rig (child side: CHECK) ---- */

struct app_pkt {
	uint8_t b[2048];
	size_t len;
	bool taken;
};

struct rig {
	struct ts_config cfg;
	struct tun *tun;
	int tfd;
	struct event_base *base;
	struct budget *bud;
	struct dispatcher *disp;
	struct netstack *ns;
	struct log lg;
	int warn_lines;
	int srv;                     /* the loopback server's listener */
	int conns[MAX_CONNS];        /* its accepted connections */
	int n_conns;
	struct app_pkt app[APP_Q];   /* packets the stack sent to the app, in order */
	int n_app;
	int fatal_calls, fatal_err;
	char fatal_msg[256];
	struct loopguard *guard;     /* the proxy's own ports (NULL: no loop check) */
	uint16_t gw_app_port;        /* packets to GW at this port go to the app queue (0: none) */
};

static struct rig rig; /* one per child process */

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int tun_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct rig *r = arg;
	return write(r->tfd, pkt, len) == (ssize_t)len ? 0 : -errno;
}

static void on_fatal(void *arg, int err, const char *msg)
{
	struct rig *r = arg;
	r->fatal_calls++;
	r->fatal_err = err;
	snprintf(r->fatal_msg, sizeof(r->fatal_msg), "%s", msg);
}

static void log_sink(void *arg, enum log_level level, const char *line, size_t len)
{
	struct rig *r = arg;
	(void)len;
	if (level == LOG_LEVEL_WARN && strstr(line, "accept"))
		r->warn_lines++;
}

static void lo_up(void)
{
	struct netlink nl;
	struct netlink_link_req req = { .up = 1 };
	struct netaddr_cidr srv;
	int ret;

	CHECK(netlink_open(&nl) == 0, "netlink");
	CHECK(netlink_link_set(&nl, 1, &req) == 0, "lo up"); /* lo is ifindex 1 in a new netns */
	CHECK(netaddr_parse_cidr(SRV "/32", &srv) == 0, "parse");
	ret = netlink_addr_add(&nl, 1, &srv, 0);
	CHECK(ret == 0 || ret == -EEXIST, "the server's address on lo: %d", ret); /* a rig again */
	netlink_close(&nl);
}

static int server_listen(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(SRV_PORT) };
	int one = 1, s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	CHECK(s >= 0 && inet_pton(AF_INET, SRV, &a.sin_addr) == 1, "socket");
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	CHECK(bind(s, (struct sockaddr *)&a, sizeof(a)) == 0, "bind: %s", strerror(errno));
	CHECK(listen(s, 16) == 0, "listen");
	return s;
}

/* Start everything; budgets is the JSON of "budgets" (tiny limits). With sweep, a step may
 * fail for want of memory (failalloc.h): false then, with what was started undone. */
static bool rig_try_start(struct rig *r, const char *budgets, bool sweep)
{
	char json[1024], err[TS_ERRLEN] = "", note[TS_ERRLEN];
	struct netstack_env env;
	const char *step;
	int rc;

	struct loopguard *guard = r->guard;

	memset(r, 0, sizeof(*r));
	r->guard = guard;
	r->srv = -1;
	signal(SIGPIPE, SIG_IGN);
	/* The in-kernel fast path off: it would hand the kernel's segments for the app straight
	 * back to the TUN's ingress, and the app here is this rig, which reads what the stack
	 * writes to the TUN. */
	snprintf(json, sizeof(json),
		 "{ \"stack\": \"system\","
		 "  \"tun\": { \"name\": \"tss0\", \"address\": \"198.18.0.1/15\","
		 "           \"offload\": \"off\", \"rps\": \"off\" },"
		 "  \"nat\": { \"listeners\": 1, \"fast_path\": \"off\" },"
		 "  \"relay\": { \"mode\": \"copy\" },"
		 "  \"budgets\": %s }", budgets);
	step = "config";
	if ((rc = config_load_string(json, &r->cfg, err, sizeof(err))) != 0)
		goto undo;
	lo_up();
	/* No IPv6 on the TUN: only the test's traffic enters it (no MLD, no RS). */
	write_text("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
	step = "TUN";
	if ((rc = tun_open_config(&r->cfg.tun, &r->tun, note, sizeof(note), err, sizeof(err))) != 0)
		goto undo;
	r->tfd = tun_fd(r->tun, 0);
	failalloc_hold(true); /* the rig's loop */
	r->base = event_base_new();
	failalloc_hold(false);
	CHECK(r->base != NULL, "event_base_new");
	step = "budget";
	if ((rc = budget_new(&r->cfg.budget, &r->bud)) != 0)
		goto undo;
	step = "dispatcher";
	if ((rc = dispatcher_new(r->base, &r->cfg, r->bud, &r->disp)) != 0)
		goto undo;
	log_init(&r->lg, LOG_LEVEL_WARN, -1);
	r->lg.sink = log_sink;
	r->lg.sink_arg = r;
	env = (struct netstack_env){ .base = r->base, .cfg = &r->cfg, .budget = r->bud,
				     .dispatcher = r->disp, .log = &r->lg, .tx = tun_tx,
				     .tx_arg = r, .tun_name = tun_name(r->tun),
				     .fatal = on_fatal, .fatal_arg = r, .loopguard = r->guard };
	step = "start";
	if ((rc = sys_stack_ops.start(&env, &r->ns, err, sizeof(err))) != 0) {
		r->ns = NULL;
		goto undo;
	}
	r->srv = server_listen();
	return true;
undo:
	CHECK(sweep && (rc == -ENOMEM || rc == -ENOBUFS), "%s: %d: %s", step, rc, err);
	dispatcher_free(r->disp);
	budget_free(r->bud);
	if (r->base)
		event_base_free(r->base);
	tun_close(r->tun);
	config_fini(&r->cfg);
	return false;
}

static void rig_start(struct rig *r, const char *budgets)
{
	rig_try_start(r, budgets, false);
}

static void rig_stop(struct rig *r)
{
	sys_stack_ops.stop(r->ns);
	dispatcher_free(r->disp); /* ends live sessions: their guards still need the stack */
	sys_stack_ops.free(r->ns);
	for (int i = 0; i < r->n_conns; i++)
		if (r->conns[i] >= 0)
			close(r->conns[i]);
	close(r->srv);
	budget_free(r->bud);
	event_base_free(r->base);
	tun_close(r->tun);
	config_fini(&r->cfg);
}

/* IPv4 to APP, or to GW at gw_app_port (the rewrite's way back to our own socket: not to the
 * kernel, whose listeners are on GW too). */
static bool to_app(const struct rig *r, const uint8_t *pkt)
{
	uint8_t a[16], g[16];
	size_t l3 = (size_t)(pkt[0] & 0x0f) * 4;

	tu_addr(a, APP);
	tu_addr(g, GW);
	return (pkt[0] >> 4) == 4 &&
	       (memcmp(pkt + 16, a, 4) == 0 ||
		(r->gw_app_port && memcmp(pkt + 16, g, 4) == 0 && pkt[9] == IPPROTO_TCP &&
		 tu_get16(pkt + l3 + 2) == r->gw_app_port));
}

/* A packet the stack wrote: to the app (a downlink rewrite or a RST it built) or the kernel. */
static void route_out(struct rig *r, const uint8_t *pkt, size_t len)
{
	if (!to_app(r, pkt)) {
		CHECK(write(r->tfd, pkt, len) == (ssize_t)len, "TUN write: %s", strerror(errno));
		return;
	}
	CHECK(r->n_app < APP_Q && len <= sizeof(r->app[0].b), "app queue full");
	memcpy(r->app[r->n_app].b, pkt, len);
	r->app[r->n_app++].len = len;
}

/* Through the stack's per-packet function, as the driver would. */
static void input(struct rig *r, uint8_t *pkt, size_t len)
{
	struct pkt_view v;
	size_t out = 0;
	bool plain = false;

	if (sys_stack_ops.input(r->ns, 0, pkt, len, NULL, ts_now_ns(), &out, &plain, &v) ==
	    DRIVER_WRITE)
		route_out(r, pkt, out);
}

/* One round: the TUN's packets through the stack, the server's accepts, the loop. */
static void pump_once(struct rig *r, int timeout_ms)
{
	struct pollfd p[2] = { { r->tfd, POLLIN, 0 }, { r->srv, POLLIN, 0 } };
	uint8_t buf[2048];
	ssize_t n;
	int c;

	poll(p, 2, timeout_ms);
	while ((n = read(r->tfd, buf, sizeof(buf))) > 0)
		input(r, buf, (size_t)n);
	while ((c = accept4(r->srv, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		CHECK(r->n_conns < MAX_CONNS, "too many server connections");
		r->conns[r->n_conns++] = c;
	}
	/* One pass of the loop: an event that stays ready (a broken accept loop) cannot hang it. */
	event_base_loop(r->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	sys_stack_ops.batch_end(r->ns, 0, ts_now_ns());
}

/* Pump until cond holds (at most ms; cond is evaluated once per round), or fail. */
#define WAIT(r, cond, ms, ...)                                                                 \
	do {                                                                                   \
		int64_t end_ = mono_ms() + (ms);                                               \
		bool ok_;                                                                      \
		while (!(ok_ = (cond)) && mono_ms() < end_)                                    \
			pump_once((r), 5);                                                     \
		if (!ok_) {                                                                    \
			char m_[512];                                                          \
			snprintf(m_, sizeof(m_), __VA_ARGS__);                                 \
			child_report(1, "line %d: waited %d ms for %s: %s", __LINE__,          \
				     (int)(ms), #cond, m_);                                    \
		}                                                                              \
	} while (0)

static struct netstack_stats stats(struct rig *r)
{
	struct netstack_stats s;
	sys_stack_ops.stats(r->ns, &s);
	return s;
}

struct ctr_q {
	const char *name;
	uint64_t v;
};

static void ctr_visit(void *arg, const char *name, uint64_t v)
{
	struct ctr_q *q = arg;
	if (strcmp(name, q->name) == 0)
		q->v = v;
}

static uint64_t counter(struct rig *r, const char *name)
{
	struct ctr_q q = { name, UINT64_MAX };
	sys_stack_ops.counters(r->ns, ctr_visit, &q);
	CHECK(q.v != UINT64_MAX, "no counter %s", name);
	return q.v;
}

static struct budget_stats bstats(struct rig *r)
{
	struct budget_stats s;
	budget_get_stats(r->bud, &s);
	return s;
}

/* The first packet not yet taken that went to the app's cport with all of flags set. */
static struct app_pkt *app_find(struct rig *r, uint16_t cport, uint8_t flags)
{
	for (int i = 0; i < r->n_app; i++) {
		struct app_pkt *p = &r->app[i];
		size_t l3 = (size_t)(p->b[0] & 0x0f) * 4;
		if (!p->taken && p->b[9] == IPPROTO_TCP && tu_get16(p->b + l3 + 2) == cport &&
		    (p->b[l3 + 13] & flags) == flags) {
			p->taken = true;
			return p;
		}
	}
	return NULL;
}

static struct app_pkt *app_wait(struct rig *r, uint16_t cport, uint8_t flags, int ms)
{
	struct app_pkt *p = NULL;
	WAIT(r, (p = app_find(r, cport, flags)) != NULL, ms, "no packet with flags 0x%02x to %u",
	     flags, cport);
	return p;
}

/* An app connection APP:cport -> SRV:dport (the app's next sequence number is 1001). */
struct app_conn {
	uint16_t cport, dport;
	uint32_t their;  /* the next sequence number the app expects */
	const char *src; /* the app's address (APP, or GW for the proxy's own socket) */
};

static void app_segment(struct rig *r, const struct app_conn *a, uint8_t flags, uint32_t seq,
			const char *data)
{
	uint8_t pkt[2048];
	struct tu_spec s;

	tu_spec_tcp(&s, a->src, a->cport, SRV, a->dport);
	s.tcp_flags = flags;
	s.seq = seq;
	s.ack = a->their;
	if (data) {
		s.payload = (const uint8_t *)data;
		s.payload_len = strlen(data);
	}
	input(r, pkt, tu_build(&s, pkt, sizeof(pkt)));
}

/* SYN, the SYN-ACK rewritten back from the original destination, ACK: the kernel's handshake
 * with the listener completes (what the accept loop then does is the caller's to check). */
static void app_connect_from(struct rig *r, struct app_conn *a, const char *src, uint16_t cport,
			     uint16_t dport)
{
	uint8_t pkt[256];
	struct tu_spec s;
	uint8_t srv[16];

	*a = (struct app_conn){ .cport = cport, .dport = dport, .src = src };
	tu_spec_tcp(&s, src, cport, SRV, dport);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	s.ack = 0;
	s.mss = 1400;
	input(r, pkt, tu_build(&s, pkt, sizeof(pkt)));
	struct app_pkt *sa = app_wait(r, cport, TCP_SYN | TCP_ACK, 2000);
	tu_addr(srv, SRV);
	CHECK(memcmp(sa->b + 12, srv, 4) == 0 && tu_get16(sa->b + 20) == dport,
	      "SYN-ACK from the original destination");
	CHECK(tu_verify_ip4_header(sa->b) && tu_verify_l4(sa->b, sa->len), "checksums");
	a->their = tu_get32(sa->b + 24) + 1;
	app_segment(r, a, TCP_ACK, 1001, NULL);
}

static void app_connect(struct rig *r, struct app_conn *a, uint16_t cport, uint16_t dport)
{
	app_connect_from(r, a, APP, cport, dport);
}

/* ---- admission ---- */

/* One TCP permit: the first session holds it; the second is accepted by the kernel, then
 * refused: RST to the app at once, its entry CLOSING, nothing dispatched. When the first ends,
 * its permit comes back and the next connection is admitted. */
static void scenario_admission_refused(void)
{
	struct rig *r = &rig;
	struct app_conn a, b, c;

	rig_start(r, "{ \"tcp_sessions\": 1, \"tcp_sessions_elevated\": 1,"
		     "  \"tcp_sessions_critical\": 1 }");
	app_connect(r, &a, 40001, SRV_PORT);
	WAIT(r, r->n_conns == 1, 2000, "first session reached the server");
	struct netstack_stats s0 = stats(r);
	CHECK(s0.accepted == 1 && s0.nat_active == 1 && s0.admission_refused == 0 &&
	      s0.nat_closing == 0, "first: accepted %llu active %llu",
	      (unsigned long long)s0.accepted, (unsigned long long)s0.nat_active);

	int64_t t0 = mono_ms();
	app_connect(r, &b, 40002, SRV_PORT);
	app_wait(r, b.cport, TCP_RST, 1000);
	int64_t rst_ms = mono_ms() - t0;
	struct netstack_stats s1 = stats(r);
	CHECK(s1.admission_refused == s0.admission_refused + 1, "admission_refused %llu",
	      (unsigned long long)s1.admission_refused);
	CHECK(s1.nat_closing == s0.nat_closing + 1 && s1.nat_active == s0.nat_active,
	      "closing %llu active %llu", (unsigned long long)s1.nat_closing,
	      (unsigned long long)s1.nat_active);
	CHECK(s1.accepted == s0.accepted && s1.fd_exhausted == 0, "not dispatched");
	CHECK(rst_ms < 1000, "RST after %lld ms", (long long)rst_ms);
	CHECK(bstats(r).tcp_in_use == 1, "the first still holds the one permit");

	/* The first ends (the server resets it): its permit returns, the next is admitted. */
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	setsockopt(r->conns[0], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(r->conns[0]);
	r->conns[0] = -1;
	WAIT(r, stats(r).nat_closing == s1.nat_closing + 1, 2000, "guard marked it closing");
	CHECK(stats(r).nat_active == 0 && bstats(r).tcp_in_use == 0, "permit returned");
	app_connect(r, &c, 40003, SRV_PORT);
	WAIT(r, r->n_conns == 2, 2000, "admitted again");
	CHECK(stats(r).accepted == 2 && stats(r).admission_refused == 1, "counters");
	rig_stop(r);
}

/* Two fds for sessions: the first session takes both (its socket and the outbound's); the
 * second is refused for the fd budget: RST, CLOSING, its permit returned. */
static void scenario_fd_exhausted(void)
{
	struct rig *r = &rig;
	struct app_conn a, b;

	rig_start(r, "{ " TCP8 ", \"fds\": 2 }");
	app_connect(r, &a, 40001, SRV_PORT);
	WAIT(r, r->n_conns == 1, 2000, "first session reached the server");
	CHECK(bstats(r).fds_in_use == 2 && bstats(r).tcp_in_use == 1, "fds %u",
	      bstats(r).fds_in_use);
	struct netstack_stats s0 = stats(r);
	app_connect(r, &b, 40002, SRV_PORT);
	app_wait(r, b.cport, TCP_RST, 1000);
	struct netstack_stats s1 = stats(r);
	CHECK(s1.fd_exhausted == s0.fd_exhausted + 1, "fd_exhausted %llu",
	      (unsigned long long)s1.fd_exhausted);
	CHECK(s1.admission_refused == 0 && s1.accepted == 1, "only the fd budget refused it");
	CHECK(s1.nat_closing == s0.nat_closing + 1 && s1.nat_active == 1, "closing %llu",
	      (unsigned long long)s1.nat_closing);
	CHECK(bstats(r).tcp_in_use == 1 && bstats(r).fds_in_use == 2, "nothing kept for it");
	rig_stop(r);
}

/* ---- the proxy's own connection come back ---- */

/* With several TUN queues a worker can read our own outbound socket's SYN (a route sends it
 * into the TUN) before the connect that sent it, on the main loop, has put the socket on
 * record: the SYN passes the packet path. The accept runs on that same loop after the record,
 * sees it and refuses the connection: RST to our socket, drops.loop, never a session. */
static void scenario_loop_caught_at_accept(void)
{
	struct rig *r = &rig;
	struct sockaddr_in own = { .sin_family = AF_INET, .sin_port = htons(40100) };
	struct app_conn a;
	uint8_t gw[16];
	uint64_t loop0;
	int s;

	tu_addr(gw, GW);
	CHECK(loopguard_new(gw, NULL, &r->guard) == 0, "loopguard");
	rig_start(r, "{ " TCP8 " }");
	r->gw_app_port = 40100;
	loop0 = counter(r, "drop_loop");
	/* The SYN from GW:40100 passes the packet path: no socket is on record yet. */
	app_connect_from(r, &a, GW, 40100, SRV_PORT);
	CHECK(counter(r, "drop_loop") == loop0, "not caught on the packet path");
	/* The handshake is done; before the loop accepts, the socket that sent it is recorded
	 * (what the connect does when it returns). */
	s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(s >= 0 && inet_pton(AF_INET, GW, &own.sin_addr) == 1, "socket");
	CHECK(bind(s, (struct sockaddr *)&own, sizeof(own)) == 0, "bind %s:40100: %s", GW,
	      strerror(errno));
	CHECK(loopguard_connected(r->guard, s, 4) == 1, "recorded");
	app_wait(r, a.cport, TCP_RST, 2000);
	CHECK(counter(r, "drop_loop") == loop0 + 1, "drop_loop %llu",
	      (unsigned long long)counter(r, "drop_loop"));
	CHECK(stats(r).accepted == 0 && r->n_conns == 0, "never a session (accepted %llu)",
	      (unsigned long long)stats(r).accepted);
	CHECK(stats(r).nat_closing == 1 && stats(r).nat_active == 0, "its entry closing");
	CHECK(bstats(r).tcp_in_use == 0 && bstats(r).fds_in_use == 0, "nothing held");
	/* An app's connection right after it is a session as usual. */
	r->gw_app_port = 0;
	app_connect(r, &a, 40001, SRV_PORT);
	WAIT(r, r->n_conns == 1, 2000, "the app's session reached the server");
	close(s);
	rig_stop(r);
	loopguard_free(r->guard);
	r->guard = NULL;
}

/* ---- the session guard ---- */

/* Wait for the session on a to end and its entry to turn CLOSING: exactly one more. */
static void expect_guard(struct rig *r, uint64_t closing_before, const char *how)
{
	WAIT(r, stats(r).nat_closing == closing_before + 1, 2000, "%s: not marked closing", how);
	WAIT(r, bstats(r).tcp_in_use == 0 && bstats(r).fds_in_use == 0, 1000,
	     "%s: permit/fds held", how);
	CHECK(stats(r).nat_active == 0, "%s: still active", how);
}

/* The server's connection accepted after the first n (the session's outbound). */
static int server_conn_after(struct rig *r, int n)
{
	WAIT(r, r->n_conns > n, 2000, "no new server connection");
	return r->conns[n];
}

/* However a session ends — the outbound refused, the app resets, the server resets, both
 * close in order — its NAT entry is marked CLOSING once, and its permit and fds return. */
static void scenario_session_guard(void)
{
	struct rig *r = &rig;
	struct app_conn a;
	char buf[16];
	uint64_t closing = 0;

	rig_start(r, "{ " TCP8 " }");

	app_connect(r, &a, 40001, DEAD_PORT);              /* outbound refused */
	app_wait(r, a.cport, TCP_RST, 2000);
	expect_guard(r, closing++, "outbound refused");

	int n = r->n_conns;
	app_connect(r, &a, 40002, SRV_PORT);               /* the app resets */
	server_conn_after(r, n);
	app_segment(r, &a, TCP_RST, 1001, NULL);
	expect_guard(r, closing++, "app reset");

	n = r->n_conns;
	app_connect(r, &a, 40003, SRV_PORT);               /* the server resets */
	int c = server_conn_after(r, n);
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(c);
	r->conns[n] = -1;
	app_wait(r, a.cport, TCP_RST, 2000);
	expect_guard(r, closing++, "server reset");

	n = r->n_conns;
	app_connect(r, &a, 40004, SRV_PORT);               /* data, then both close in order */
	c = server_conn_after(r, n);
	app_segment(r, &a, TCP_ACK | TCP_PSH, 1001, "hello");
	ssize_t got = -1;
	WAIT(r, (got = recv(c, buf, sizeof(buf), MSG_DONTWAIT)) == 5, 2000, "relayed: %zd", got);
	CHECK(memcmp(buf, "hello", 5) == 0, "payload");
	app_segment(r, &a, TCP_ACK | TCP_FIN, 1006, NULL);
	WAIT(r, recv(c, buf, sizeof(buf), MSG_DONTWAIT) == 0, 2000, "server saw the app's FIN");
	close(c);
	r->conns[n] = -1;
	app_wait(r, a.cport, TCP_FIN, 2000);
	expect_guard(r, closing++, "orderly close");
	CHECK(stats(r).accepted == 4, "accepted %llu", (unsigned long long)stats(r).accepted);
	rig_stop(r);
}

/* ---- accept errors for real ---- */

/* EMFILE (RLIMIT_NOFILE lowered to the lowest free descriptor): accept backs off 50 ms with
 * one warning; still EMFILE after the pause: a second back-off, the warning rate-limited. With
 * the limit restored the same pending connection is accepted. */
static void scenario_emfile_backoff(void)
{
	struct rig *r = &rig;
	struct rlimit old, low;
	struct app_conn a;

	rig_start(r, "{ " TCP8 " }");
	CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0, "getrlimit");
	int lowest = fcntl(r->tfd, F_DUPFD_CLOEXEC, 0);
	CHECK(lowest >= 0, "dup");
	close(lowest);
	low = (struct rlimit){ .rlim_cur = (rlim_t)lowest, .rlim_max = old.rlim_max };
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "setrlimit: %s", strerror(errno));

	app_connect(r, &a, 40001, SRV_PORT);
	WAIT(r, counter(r, "accept_backoff") == 1, 2000, "no back-off");
	int64_t t0 = mono_ms();
	CHECK(r->warn_lines == 1, "warned %d times", r->warn_lines);
	WAIT(r, counter(r, "accept_backoff") == 2, 2000, "accepting did not resume");
	int64_t t1 = mono_ms();
	/* 50 ms, measured from a moment just after the pause began: not the 1 ms retry. */
	CHECK(t1 - t0 >= 30, "resumed after %lld ms, not 50", (long long)(t1 - t0));
	CHECK(r->warn_lines == 1 && ctr_get(&r->lg.suppressed) == 1, "rate-limited: %d lines",
	      r->warn_lines);
	CHECK(stats(r).accepted == 0 && counter(r, "accept_retry") == 0, "nothing accepted yet");

	CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "restore");
	WAIT(r, stats(r).accepted == 1, 2000, "the stack continues");
	WAIT(r, r->n_conns == 1, 2000, "dispatched to the server");
	CHECK(counter(r, "accept_backoff") <= 3 && r->fatal_calls == 0, "no fatal");
	rig_stop(r);
}

/* The listening socket fd of the stack (SO_ACCEPTCONN, bound to the gateway). */
static int find_listener(void)
{
	for (int fd = 3; fd < 1024; fd++) {
		struct sockaddr_in a;
		socklen_t al = sizeof(a);
		int on = 0;
		socklen_t ol = sizeof(on);
		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &ol) != 0 || !on)
			continue;
		if (getsockname(fd, (struct sockaddr *)&a, &al) == 0 && a.sin_family == AF_INET &&
		    ntohl(a.sin_addr.s_addr) == 0xc6120001u) /* 198.18.0.1 */
			return fd;
	}
	CHECK(0, "no listener on the gateway");
	return -1;
}

/* Anything else stops the stack: a listener shut down under the loop is readable and accept
 * fails with EINVAL; env->fatal gets -EINVAL and a message, once, and accepting stops. */
static void scenario_fatal_error(void)
{
	struct rig *r = &rig;

	rig_start(r, "{ " TCP8 " }");
	pump_once(r, 0);
	CHECK(r->fatal_calls == 0, "fatal before anything happened");
	CHECK(shutdown(find_listener(), SHUT_RDWR) == 0, "shutdown: %s", strerror(errno));
	WAIT(r, r->fatal_calls > 0, 1000, "fatal not reported");
	for (int i = 0; i < 10; i++)
		pump_once(r, 2);
	CHECK(r->fatal_calls == 1, "reported %d times", r->fatal_calls);
	CHECK(r->fatal_err == -EINVAL, "err %d", r->fatal_err);
	CHECK(strstr(r->fatal_msg, "accept") != NULL, "message \"%s\"", r->fatal_msg);
	CHECK(counter(r, "accept_backoff") == 0 && counter(r, "accept_retry") == 0,
	      "classified as fatal, not retried");
	rig_stop(r);
}

TestSuite(sys_stack_netns, .timeout = 30);

Test(sys_stack_netns, admission_refused_resets_and_marks_closing)
{
	run_in_netns(scenario_admission_refused);
}

Test(sys_stack_netns, fd_budget_exhausted_resets_and_marks_closing)
{
	run_in_netns(scenario_fd_exhausted);
}

Test(sys_stack_netns, session_guard_marks_closing_however_it_ends)
{
	run_in_netns(scenario_session_guard);
}

Test(sys_stack_netns, own_socket_come_back_is_refused_at_accept)
{
	run_in_netns(scenario_loop_caught_at_accept);
}

Test(sys_stack_netns, emfile_backs_off_then_accepts)
{
	run_in_netns(scenario_emfile_backoff);
}

Test(sys_stack_netns, other_accept_error_is_fatal)
{
	run_in_netns(scenario_fatal_error);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

static long nomem_at; /* the allocation refused now (0: none) */

/* Pump until cond holds or ms pass: whether it held. */
#define PUMP_UNTIL(r, cond, ms)                                                                \
	({                                                                                     \
		int64_t end_ = mono_ms() + (ms);                                               \
		bool ok_;                                                                      \
		while (!(ok_ = (cond)) && mono_ms() < end_)                                    \
			pump_once((r), 5);                                                     \
		ok_;                                                                           \
	})

/* A connection from the app: answered (SYN-ACK), refused (RST), or its SYN dropped and
 * counted (no memory for its NAT entry: the app's retransmission then gets in); once
 * answered, its bytes reach the server or the app is reset; the app's reset ends it, its
 * entry closing and its permit and fds back. Unless sweeping, it must get through. */
static void nomem_session(struct rig *r, uint16_t cport, bool sweep)
{
	struct app_pkt *sa = NULL, *rst = NULL;
	struct app_conn a = { .cport = cport, .dport = SRV_PORT, .src = APP };
	uint64_t dropped = stats(r).drops_nat_exhausted;
	uint8_t pkt[256];
	struct tu_spec sp;
	char buf[8];
	int n = r->n_conns;
	ssize_t got = -1;

	tu_spec_tcp(&sp, APP, cport, SRV, SRV_PORT);
	sp.tcp_flags = TCP_SYN;
	sp.seq = 1000;
	sp.mss = 1400;
	for (int syn = 0; syn < 2 && !sa && !rst; syn++) {
		input(r, pkt, tu_build(&sp, pkt, sizeof(pkt)));
		CHECK(PUMP_UNTIL(r, (sa = app_find(r, cport, TCP_SYN | TCP_ACK)) ||
				    (rst = app_find(r, cport, TCP_RST)) ||
				    (syn == 0 && stats(r).drops_nat_exhausted > dropped), 2000),
		      "port %u: SYN %d neither answered nor counted (allocation %ld refused)",
		      cport, syn, nomem_at);
	}
	if (!sa) {
		CHECK(sweep, "port %u refused", cport);
		return;
	}
	a.their = tu_get32(sa->b + 24) + 1;
	app_segment(r, &a, TCP_ACK, 1001, NULL);
	app_segment(r, &a, TCP_ACK | TCP_PSH, 1001, "hello");
	CHECK(PUMP_UNTIL(r, (r->n_conns > n &&
			     (got = recv(r->conns[n], buf, sizeof(buf), MSG_DONTWAIT)) == 5) ||
			    (rst = app_find(r, cport, TCP_RST)), 2000),
	      "port %u: neither relayed nor reset (allocation %ld refused)", cport,
	      nomem_at);
	CHECK(rst || memcmp(buf, "hello", 5) == 0, "payload");
	CHECK(sweep || !rst, "port %u reset", cport);
	if (!rst)
		app_segment(r, &a, TCP_RST, 1006, NULL);
	CHECK(PUMP_UNTIL(r, bstats(r).tcp_in_use == 0 && bstats(r).fds_in_use == 0, 2000),
	      "port %u: permit/fds held (%u, %u; allocation %ld refused)", cport,
	      bstats(r).tcp_in_use, bstats(r).fds_in_use, nomem_at);
}

/* The rig's life: started, two sessions in turn, a third live at the stop; then nothing kept:
 * no thread, and (ASan tree) no memory. */
static void nomem_run(bool sweep)
{
	struct rig *r = &rig;
	struct app_pkt *sa = NULL;
	struct app_conn live;

	r->guard = NULL;
	if (!rig_try_start(r, "{ " TCP8 " }", sweep))
		return;
	nomem_session(r, 40001, sweep);
	nomem_session(r, 40002, sweep);
	live = (struct app_conn){ .cport = 40003, .dport = SRV_PORT, .src = APP };
	app_segment(r, &live, TCP_SYN, 1000, NULL);
	(void)PUMP_UNTIL(r, (sa = app_find(r, 40003, TCP_SYN | TCP_ACK)) != NULL, 500);
	if (sa) {
		live.their = tu_get32(sa->b + 24) + 1;
		app_segment(r, &live, TCP_ACK, 1001, NULL);
		(void)PUMP_UNTIL(r, stats(r).accepted >= 3, 500);
	}
	rig_stop(r);
}

static void scenario_each_allocation_refused(void)
{
	int before = tu_dir_entries("/proc/self/task");
	long n;

	/* libevent's allocations through the project's allocator, as twinstack runs it: they
	 * are refused in turn too. */
	CHECK(evmem_install() == 0, "evmem");

	nomem_run(false);
	CHECK(tu_dir_entries("/proc/self/task") == before, "a thread outlived the stack");
	for (n = 1; n <= 2000; n++) {
		nomem_at = n;
		failalloc_arm(n);
		nomem_run(true);
		failalloc_arm(0);
		CHECK(tu_dir_entries("/proc/self/task") == before, "a thread outlived the stack (allocation %ld refused)", n);
#ifdef TS_LSAN
		CHECK(__lsan_do_recoverable_leak_check() == 0, "leaked with allocation %ld refused",
		      n);
#endif
		if (!failalloc_fired())
			break;
	}
	CHECK(n > 10 && n <= 2000, "%ld allocations", n - 1);
}

TestSuite(sys_stack_nomem, .timeout = 300);

Test(sys_stack_nomem, each_allocation_refused_in_turn)
{
	run_in_netns(scenario_each_allocation_refused);
}
