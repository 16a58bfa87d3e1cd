/* test_dispatcher.c — the dispatcher end to end through the real outbound code, on loopback:
 *
 *   app ══TCP══ client stream ── dispatcher ── outbound (direct | reject) ══TCP══ echo server
 *                                     └─ namer ─► name ─► resolver ─► fake DNS (same loop)
 *
 * The app socket stands in for the app behind the TUN; the other end of its connection is
 * what a stack would hand to dispatcher_start_tcp. Every wait is bounded; 127.0.0.1 and ::1 only.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "core/budget.h"
#include "core/config.h"
#include "dispatch/dispatcher.h"
#include "dispatch/stream.h"
#include "failalloc.h"
#include "fakedns.h"
#include "outbound/resolver.h"
#include "testutil.h"

#define REJECT_PORT 9

static struct event_base *base;
static struct ts_config cfg;
static struct budget *budget;
static struct dispatcher *disp;
static struct event *tick;
/* route.sniff for the next start(), with its trailing comma; "" for none. */
static const char *sniff_json = "";

/* ---- helpers ------------------------------------------------------------------------------- */

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
}

static void start(const char *mode, uint32_t connect_ms, uint32_t fds)
{
	char json[1536], err[TS_ERRLEN];
	struct timeval tv = { 0, 5000 };

	signal(SIGPIPE, SIG_IGN);
	snprintf(json, sizeof(json),
		 "{ \"timeouts\": { \"connect_ms\": %u, \"relay_idle_ms\": 10000 },"
		 "  \"outbounds\": [ { \"tag\": \"direct\", \"type\": \"direct\" },"
		 "                   { \"tag\": \"block\", \"type\": \"reject\" } ],"
		 "  \"relay\": { \"mode\": \"%s\" },"
		 "  \"route\": { %s \"rules\": [ { \"port\": [%d], \"outbound\": \"block\" },"
		 "                          { \"domain_suffix\": [\"blocked.test\"],"
		 "                            \"outbound\": \"block\" } ],"
		 "               \"final\": \"direct\" } }",
		 connect_ms, mode, sniff_json, REJECT_PORT);
	cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), 0, "%s", err);
	cfg.budget.fds = fds;
	base = event_base_new();
	cr_assert(base);
	cr_assert_eq(budget_new(&cfg.budget, &budget), 0);
	cr_assert_eq(dispatcher_new(base, &cfg, budget, &disp), 0);
	tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
	event_add(tick, &tv);
}

static void teardown(void)
{
	if (!base)
		return;
	dispatcher_free(disp);
	event_free(tick);
	budget_free(budget);
	event_base_free(base);
	config_fini(&cfg);
	base = NULL;
	CHECK_LEAKS();
}

static bool run_until(bool (*pred)(void *), void *arg, int timeout_ms)
{
	int64_t end = mono_ms() + timeout_ms;

	while (!pred(arg) && mono_ms() < end)
		event_base_loop(base, EVLOOP_ONCE);
	return pred(arg);
}

static struct dispatcher_stats dstats(void)
{
	struct dispatcher_stats s;

	dispatcher_get_stats(disp, &s);
	return s;
}

static uint32_t fds_in_use(void)
{
	struct budget_stats s;

	budget_get_stats(budget, &s);
	return s.fds_in_use;
}

static socklen_t loop_addr(int family, uint16_t port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (family == 4) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
		s4->sin_family = AF_INET;
		s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		s4->sin_port = htons(port);
		return sizeof(*s4);
	}
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	s6->sin6_family = AF_INET6;
	s6->sin6_addr = in6addr_loopback;
	s6->sin6_port = htons(port);
	return sizeof(*s6);
}

static uint16_t local_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	return ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
					     : ((struct sockaddr_in6 *)&ss)->sin6_port);
}

/* A listening socket on loopback (port 0) with the given backlog. */
static int listener(int family, int backlog)
{
	struct sockaddr_storage ss;
	socklen_t len = loop_addr(family, 0, &ss);
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&ss, len), 0);
	cr_assert_eq(listen(fd, backlog), 0);
	return fd;
}

/* The app's socket and the "accepted" socket a stack would wrap, connected over loopback. */
static void app_pair(int family, int *app, int *accepted)
{
	struct sockaddr_storage ss;
	int l = listener(family, 4);
	socklen_t len = loop_addr(family, local_port(l), &ss);

	*app = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(*app >= 0);
	cr_assert_eq(connect(*app, (struct sockaddr *)&ss, len), 0);
	*accepted = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	cr_assert(*accepted >= 0);
	close(l);
	cr_assert_eq(fcntl(*app, F_SETFL, O_NONBLOCK), 0);
}

static void flow(struct flow_key *k, int family, const char *dst, uint16_t dport, int app)
{
	memset(k, 0, sizeof(*k));
	k->family = (uint8_t)family;
	k->proto = IPPROTO_TCP;
	tu_addr(k->src, family == 4 ? "127.0.0.1" : "::1");
	tu_addr(k->dst, dst);
	k->sport_be = htons(local_port(app));
	k->dport_be = htons(dport);
}

/* ---- the echo server (libevent bufferevents) ---------------------------------------------- */

struct echo {
	struct evconnlistener *l;
	uint16_t port;
	int conns, live;
};

static void echo_close(struct bufferevent *bev, struct echo *e)
{
	e->live--;
	bufferevent_free(bev);
}

static void echo_read(struct bufferevent *bev, void *arg)
{
	evbuffer_add_buffer(bufferevent_get_output(bev), bufferevent_get_input(bev));
}

/* After the client's EOF: close once everything was echoed (so the FIN follows the data). */
static void echo_drained(struct bufferevent *bev, void *arg)
{
	echo_close(bev, arg);
}

static void echo_event(struct bufferevent *bev, short what, void *arg)
{
	struct echo *e = arg;

	if ((what & BEV_EVENT_EOF) &&
	    evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
		bufferevent_setcb(bev, NULL, echo_drained, NULL, e);
		return;
	}
	echo_close(bev, e);
}

static void echo_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
			int len, void *arg)
{
	struct echo *e = arg;
	struct bufferevent *bev;

	failalloc_hold(true); /* the test's server, not the code under test */
	bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
	cr_assert(bev);
	e->conns++;
	e->live++;
	bufferevent_setcb(bev, echo_read, NULL, echo_event, e);
	bufferevent_enable(bev, EV_READ | EV_WRITE);
	failalloc_hold(false);
}

static void echo_start(struct echo *e, int family)
{
	int fd = listener(family, 64);

	memset(e, 0, sizeof(*e));
	e->port = local_port(fd);
	evutil_make_socket_nonblocking(fd);
	e->l = evconnlistener_new(base, echo_accept, e, LEV_OPT_CLOSE_ON_FREE, -1, fd);
	cr_assert(e->l);
}

/* ---- sessions as the test sees them ----------------------------------------------------- */

struct sess {
	int app;
	int ends;        /* on_end calls */
	bool fd_held;    /* the test reserved the client's fd, as a stack does */
};

static void on_end(void *arg)
{
	struct sess *s = arg;

	s->ends++;
	if (s->fd_held) {
		budget_fd_release(budget, 1);
		s->fd_held = false;
	}
}

/* Accept-side work of a stack: reserve the client's fd, wrap it, dispatch. */
static int dispatch(struct sess *s, int family, const char *dst, uint16_t dport)
{
	struct flow_key k;
	struct stream *client;
	int accepted;

	memset(s, 0, sizeof(*s));
	app_pair(family, &s->app, &accepted);
	cr_assert_eq(budget_fd_reserve(budget, 1), 0);
	s->fd_held = true;
	cr_assert_eq(stream_sock_new(base, accepted, &client), 0);
	flow(&k, family, dst, dport, s->app);
	return dispatcher_start_tcp(disp, &k, client, on_end, s);
}

/* Send n bytes from the app and read the echo back; true if identical. */
static bool roundtrip(struct sess *s, size_t n)
{
	uint8_t *tx, *rx;
	size_t sent = 0, got = 0;
	int64_t end = mono_ms() + 10000;
	struct tu_rng r;
	bool ok;

	failalloc_hold(true); /* the test's own buffers */
	tx = malloc(n);
	rx = malloc(n);
	failalloc_hold(false);
	cr_assert(tx && rx);
	tu_rng_seed(&r, n);
	tu_rand_bytes(&r, tx, n);
	while (got < n && mono_ms() < end) {
		ssize_t k;
		if (sent < n && (k = send(s->app, tx + sent, n - sent, MSG_NOSIGNAL)) > 0)
			sent += (size_t)k;
		k = recv(s->app, rx + got, n - got, 0);
		if (k > 0)
			got += (size_t)k;
		else if (k == 0 || errno != EAGAIN)
			break;
		event_base_loop(base, EVLOOP_NONBLOCK);
	}
	ok = got == n && memcmp(tx, rx, n) == 0;
	free(tx);
	free(rx);
	return ok;
}

struct app_wait {
	int fd;
	int err;  /* errno of the failed recv, or 0 */
	bool eof;
};

/* Drain the app socket until it fails or reads EOF. */
static bool app_closed(void *arg)
{
	struct app_wait *w = arg;
	char buf[4096];
	ssize_t k;

	while (!w->err && !w->eof) {
		k = recv(w->fd, buf, sizeof(buf), 0);
		if (k > 0)
			continue;
		if (k == 0)
			w->eof = true;
		else if (errno != EAGAIN)
			w->err = errno;
		else
			return false;
	}
	return true;
}

static bool ended(void *arg)
{
	return ((struct sess *)arg)->ends > 0;
}

TestSuite(session, .fini = teardown, .timeout = 60);

/* ---- round trips -------------------------------------------------------------------------- */

static void roundtrip_test(const char *mode, int family)
{
	struct echo e;
	struct sess s;
	struct app_wait w;
	struct dispatcher_stats st;

	start(mode, 2000, 1000);
	echo_start(&e, family);
	cr_assert_eq(dispatch(&s, family, family == 4 ? "127.0.0.1" : "::1", e.port), 0);
	cr_assert(roundtrip(&s, 256 << 10), "echo differs");
	st = dstats();
	cr_assert_eq(st.sessions_active, 1);
	cr_assert_eq(st.sessions_connecting, 0);
	cr_assert(fds_in_use() >= 2, "client + outbound socket");
	/* The app closes its side; the echo server closes after the echo; the session ends. */
	shutdown(s.app, SHUT_WR);
	w = (struct app_wait){ .fd = s.app };
	cr_assert(run_until(app_closed, &w, 5000));
	cr_assert(w.eof && !w.err, "clean EOF expected, got %s", strerror(w.err));
	cr_assert(run_until(ended, &s, 5000));
	cr_assert_eq(s.ends, 1);
	st = dstats();
	cr_assert_eq(st.sessions_total, 1);
	cr_assert_eq(st.sessions_active, 0);
	cr_assert_eq(st.sessions_refused, 0);
	cr_assert_eq(st.bytes_up, 256 << 10);
	cr_assert_eq(st.bytes_down, 256 << 10);
	cr_assert_eq(st.relay_ends[RELAY_DONE], 1);
	if (strcmp(mode, "splice") == 0)
		cr_assert_eq(st.splice_bytes, 512 << 10);
	else
		cr_assert_eq(st.copy_bytes, 512 << 10);
	cr_assert_eq(st.pipes_in_use, 0);
	cr_assert_eq(st.buffer_bytes_in_use, 0);
	cr_assert_eq(fds_in_use(), 2 * st.pipes_idle, "only idle pool pipes hold fds");
	close(s.app);
	evconnlistener_free(e.l);
}

Test(session, roundtrip_direct_v4_splice)
{
	roundtrip_test("splice", 4);
}

Test(session, roundtrip_direct_v4_copy)
{
	roundtrip_test("copy", 4);
}

Test(session, roundtrip_direct_v6_splice)
{
	roundtrip_test("splice", 6);
}

/* ---- refusals: a prompt RST and on_end exactly once -------------------------------------- */

static void expect_prompt_reset(struct sess *s, enum dispatcher_fail why)
{
	struct app_wait w = { .fd = s->app };
	int64_t t0 = mono_ms();

	cr_assert_eq(s->ends, 0, "on_end must not run inside dispatcher_start_tcp");
	cr_assert(run_until(app_closed, &w, 3000));
	cr_assert_eq(w.err, ECONNRESET, "app saw %s", w.eof ? "EOF" : strerror(w.err));
	cr_assert(mono_ms() - t0 < 1000, "reset took %lld ms", (long long)(mono_ms() - t0));
	cr_assert(run_until(ended, s, 1000));
	/* Keep turning the loop: a second on_end would show up here. */
	event_base_loop(base, EVLOOP_NONBLOCK);
	cr_assert_eq(s->ends, 1);
	cr_assert_eq(dstats().fail[why], 1, "counted as %s", dispatcher_fail_name(why));
	cr_assert_eq(dstats().sessions_refused, 1);
	cr_assert_eq(dstats().sessions_active, 0);
	cr_assert_eq(fds_in_use(), 0);
	close(s->app);
}

Test(session, closed_port_resets_promptly)
{
	struct sockaddr_storage ss;
	socklen_t len = loop_addr(4, 0, &ss);
	int closed = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sess s;

	start("splice", 2000, 1000);
	/* Bound, never listening: the port is ours and refuses connections. */
	cr_assert_eq(bind(closed, (struct sockaddr *)&ss, len), 0);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", local_port(closed)), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_REFUSED);
	close(closed);
}

Test(session, reject_outbound_resets_promptly)
{
	struct sess s;

	start("splice", 2000, 1000);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", REJECT_PORT), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_REJECT);
}

/* A listener with backlog 0 and one unaccepted connection drops further SYNs, so a connect to
 * it stays pending: the attempt must end at connect_ms with a RST, not hang. */
static int full_listener(int *filler)
{
	struct sockaddr_storage ss;
	int l = listener(4, 0);
	socklen_t len = loop_addr(4, local_port(l), &ss);

	*filler = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(*filler, (struct sockaddr *)&ss, len), 0);
	return l;
}

Test(session, connect_timeout_resets)
{
	struct sess s;
	struct app_wait w;
	int filler, l;
	int64_t t0;

	start("splice", 300, 1000);
	l = full_listener(&filler);
	t0 = mono_ms();
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", local_port(l)), 0);
	cr_assert_eq(dstats().sessions_connecting, 1);
	w = (struct app_wait){ .fd = s.app };
	cr_assert(run_until(app_closed, &w, 3000));
	cr_assert_eq(w.err, ECONNRESET);
	cr_assert(mono_ms() - t0 >= 290 && mono_ms() - t0 < 1500, "after %lld ms",
		  (long long)(mono_ms() - t0));
	cr_assert(run_until(ended, &s, 1000));
	cr_assert_eq(s.ends, 1);
	cr_assert_eq(dstats().fail[DISPATCHER_FAIL_TIMEOUT], 1);
	cr_assert_eq(fds_in_use(), 0);
	close(s.app);
	close(filler);
	close(l);
}

Test(session, fd_budget_refusal_resets)
{
	struct sess s;

	start("splice", 2000, 1); /* the client's own fd takes the whole budget */
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", 7), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_FD_BUDGET);
}

#ifdef NDEBUG
/* Release builds refuse (debug builds assert): traffic to our gateway is never relayed. The
 * address is only a flow key here; nothing is sent to it. */
Test(session, own_address_refused)
{
	struct sess s;

	start("splice", 2000, 1000);
	cr_assert_eq(dispatch(&s, 4, "198.18.0.1", 80), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_OWN_ADDRESS);
}
#endif

/* ---- memory back after a load ------------------------------------------------------------- */

struct trims_wait {
	uint64_t want;
};

static bool trims_reached(void *arg)
{
	return dstats().heap_trims >= ((struct trims_wait *)arg)->want;
}

/* n copy-relay sessions at once, each an echo round trip, then all closed by the app. */
static void load_and_close(struct sess *ss, int n, uint16_t port)
{
	struct app_wait w;

	for (int i = 0; i < n; i++) {
		cr_assert_eq(dispatch(&ss[i], 4, "127.0.0.1", port), 0);
		cr_assert(roundtrip(&ss[i], 64 << 10), "echo %d differs", i);
	}
	cr_assert_eq(dstats().sessions_active, (uint64_t)n);
	for (int i = 0; i < n; i++) {
		shutdown(ss[i].app, SHUT_WR);
		w = (struct app_wait){ .fd = ss[i].app };
		cr_assert(run_until(app_closed, &w, 5000));
		cr_assert(run_until(ended, &ss[i], 5000));
		close(ss[i].app);
	}
	cr_assert_eq(dstats().sessions_active, 0);
}

/* After a load of at least 16 sessions falls to a quarter, one timer a second later gives the
 * relay pool's cached buffers back (and the heap's free pages): exactly one trim, none before the
 * delay, none for a load under 16 sessions. */
Test(session, load_gone_gives_memory_back_once)
{
	struct echo e;
	struct sess ss[20];
	struct trims_wait tw = { 1 };
	struct dispatcher_stats st;
	int64_t t0;

	start("copy", 2000, 1000);
	echo_start(&e, 4);
	load_and_close(ss, 8, e.port);
	cr_assert_not(run_until(trims_reached, &tw, 1500), "8 sessions must not trim");
	cr_assert_gt(dstats().buffer_bytes_cached, 0, "the pool keeps buffers for reuse");

	load_and_close(ss, 20, e.port);
	t0 = mono_ms();
	st = dstats();
	cr_assert_eq(st.heap_trims, 0, "not before the delay");
	cr_assert_gt(st.buffer_bytes_cached, 0);
	cr_assert(run_until(trims_reached, &tw, 3000), "no trim 3 s after the load fell");
	cr_assert_geq(mono_ms() - t0, 900, "trimmed before the delay");
	st = dstats();
	cr_assert_eq(st.heap_trims, 1);
	cr_assert_eq(st.buffer_bytes_cached, 0, "cached relay buffers given back");
	cr_assert_eq(st.buffer_bytes_in_use, 0);
	tw.want = 2;
	cr_assert_not(run_until(trims_reached, &tw, 1500), "idle: no second trim");

	/* The next load that falls trims again. */
	load_and_close(ss, 20, e.port);
	cr_assert(run_until(trims_reached, &tw, 3000), "no second trim after the second load");
	cr_assert_eq(dstats().heap_trims, 2);
	evconnlistener_free(e.l);
}

/* ---- shutdown with live sessions ----------------------------------------------------------- */

Test(session, dispatcher_free_ends_every_session)
{
	struct echo e;
	struct sess relaying[3], connecting, failing;
	int filler, l;

	start("splice", 5000, 1000);
	echo_start(&e, 4);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(dispatch(&relaying[i], 4, "127.0.0.1", e.port), 0);
		cr_assert(roundtrip(&relaying[i], 4096));
	}
	l = full_listener(&filler);
	cr_assert_eq(dispatch(&connecting, 4, "127.0.0.1", local_port(l)), 0);
	cr_assert_eq(dispatch(&failing, 4, "127.0.0.1", REJECT_PORT), 0); /* refusal pending */
	cr_assert_eq(dstats().sessions_active, 5);
	cr_assert_eq(dstats().sessions_connecting, 1);

	dispatcher_free(disp);
	disp = NULL;
	for (int i = 0; i < 3; i++)
		cr_assert_eq(relaying[i].ends, 1);
	cr_assert_eq(connecting.ends, 1);
	cr_assert_eq(failing.ends, 1);
	cr_assert_eq(fds_in_use(), 0, "outbound sockets and pipes released");
	/* Every app sees a RST, not a clean EOF. */
	struct sess *all[] = { &relaying[0], &relaying[1], &relaying[2], &connecting, &failing };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		struct app_wait w = { .fd = all[i]->app };
		cr_assert(run_until(app_closed, &w, 2000));
		cr_assert_eq(w.err, ECONNRESET, "session %zu: %s", i,
			     w.eof ? "EOF" : strerror(w.err));
		close(all[i]->app);
	}
	/* The echo server sees its connections go away too. */
	for (int i = 0; i < 100 && e.live > 0; i++)
		event_base_loop(base, EVLOOP_ONCE);
	cr_assert_eq(e.live, 0);
	close(filler);
	close(l);
	evconnlistener_free(e.l);
}

/* ---- reload: dispatcher_set_config -------------------------------------------------------- */

/* Configurations a reload test hands over: heap-allocated, freed by the release callback, so
 * a configuration released while a session (or its connect) still used it shows up under
 * ASan. */
struct rel {
	const struct ts_config *expect; /* the configuration this release is for */
	int calls;
};

static struct ts_config *heap_cfg(uint32_t connect_ms, const char *route)
{
	char json[1024], err[TS_ERRLEN];
	struct ts_config *c = malloc(sizeof(*c));

	cr_assert(c);
	snprintf(json, sizeof(json),
		 "{ \"timeouts\": { \"connect_ms\": %u, \"relay_idle_ms\": 10000 },"
		 "  \"outbounds\": [ { \"tag\": \"direct\", \"type\": \"direct\" },"
		 "                   { \"tag\": \"block\", \"type\": \"reject\" } ],"
		 "  \"route\": { %s } }",
		 connect_ms, route);
	cr_assert_eq(config_load_string(json, c, err, sizeof(err)), 0, "%s", err);
	return c;
}

/* A route sending one port to the reject outbound, everything else direct. */
static const char *block_port(char *buf, size_t len, uint16_t port)
{
	snprintf(buf, len, "\"rules\": [ { \"port\": [%u], \"outbound\": \"block\" } ]", port);
	return buf;
}

static void heap_cfg_free(const struct ts_config *c)
{
	config_fini((struct ts_config *)c);
	free((void *)c);
}

static void on_release(void *arg, const struct ts_config *old)
{
	struct rel *r = arg;

	r->calls++;
	cr_assert_eq(old, r->expect, "released the wrong configuration");
	heap_cfg_free(old);
}

/* The fixture's base and budget, and a dispatcher on the heap configuration c. */
static void start_on(const struct ts_config *c)
{
	start("splice", 2000, 1000);
	dispatcher_free(disp);
	cr_assert_eq(dispatcher_new(base, c, budget, &disp), 0);
}

/* The app closes its side; wait until the echo server's close has ended the session. */
static void finish(struct sess *s)
{
	struct app_wait w = { .fd = s->app };

	shutdown(s->app, SHUT_WR);
	cr_assert(run_until(app_closed, &w, 5000));
	cr_assert(w.eof && !w.err, "clean EOF expected, got %s", strerror(w.err));
	cr_assert(run_until(ended, s, 5000));
	cr_assert_eq(s->ends, 1);
	close(s->app);
}

/* A new session is refused as reject (a prompt RST); it ends before this returns. */
static void expect_rejected(uint16_t port)
{
	struct sess s;
	struct app_wait w;
	uint64_t before = dstats().fail[DISPATCHER_FAIL_REJECT];

	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", port), 0);
	w = (struct app_wait){ .fd = s.app };
	cr_assert(run_until(app_closed, &w, 3000));
	cr_assert_eq(w.err, ECONNRESET, "app saw %s", w.eof ? "EOF" : strerror(w.err));
	cr_assert(run_until(ended, &s, 1000));
	cr_assert_eq(dstats().fail[DISPATCHER_FAIL_REJECT], before + 1);
	close(s.app);
}

/* A relaying session keeps its configuration's outbound across a reload that rejects its
 * destination; new sessions get the new configuration; the old configuration is released
 * once, right when the old session ends. */
Test(session, reload_keeps_live_session_new_ones_use_the_new_config)
{
	struct echo e;
	struct sess old;
	struct ts_config *a, *b;
	struct rel ra = { 0 };
	char route[128];

	a = heap_cfg(2000, "");
	start_on(a);
	echo_start(&e, 4);
	b = heap_cfg(2000, block_port(route, sizeof(route), e.port));
	cr_assert_eq(dispatch(&old, 4, "127.0.0.1", e.port), 0);
	cr_assert(roundtrip(&old, 64 << 10));

	ra.expect = a;
	dispatcher_set_config(disp, b, on_release, &ra);
	cr_assert_eq(ra.calls, 0, "released while a session holds it");
	expect_rejected(e.port);
	cr_assert(roundtrip(&old, 256 << 10), "the old session broke after the reload");
	cr_assert_eq(ra.calls, 0);
	finish(&old);
	cr_assert_eq(ra.calls, 1, "released when its last session ended");
	expect_rejected(e.port);
	event_base_loop(base, EVLOOP_NONBLOCK);
	cr_assert_eq(ra.calls, 1, "released twice");
	cr_assert_eq(dstats().sessions_active, 0);

	dispatcher_free(disp);
	disp = NULL;
	cr_assert_eq(ra.calls, 1);
	heap_cfg_free(b); /* current at dispatcher_free: never released by the dispatcher */
	evconnlistener_free(e.l);
}

/* A connect in flight borrows its configuration's outbound and timeout: it still times out at
 * A's connect_ms after a reload to a longer one, and A goes right after. A refusal parked for
 * the loop holds its configuration too. */
Test(session, reload_waits_for_connecting_and_refused_sessions)
{
	struct sess connecting, refused;
	struct ts_config *a, *b;
	struct rel ra = { 0 };
	struct app_wait w;
	char route[128];
	int filler, l;
	int64_t t0;

	a = heap_cfg(300, block_port(route, sizeof(route), REJECT_PORT));
	b = heap_cfg(10000, "");
	start_on(a);
	l = full_listener(&filler);
	t0 = mono_ms();
	cr_assert_eq(dispatch(&connecting, 4, "127.0.0.1", local_port(l)), 0);
	cr_assert_eq(dispatch(&refused, 4, "127.0.0.1", REJECT_PORT), 0); /* parked */
	ra.expect = a;
	dispatcher_set_config(disp, b, on_release, &ra);
	cr_assert_eq(ra.calls, 0);
	cr_assert(run_until(ended, &refused, 1000));
	cr_assert_eq(dstats().fail[DISPATCHER_FAIL_REJECT], 1, "refused under A's rule");
	cr_assert_eq(ra.calls, 0, "the connecting session still holds A");
	w = (struct app_wait){ .fd = connecting.app };
	cr_assert(run_until(app_closed, &w, 3000));
	cr_assert_eq(w.err, ECONNRESET);
	cr_assert(mono_ms() - t0 < 1500, "A's 300 ms connect timeout, not B's: %lld ms",
		  (long long)(mono_ms() - t0));
	cr_assert(run_until(ended, &connecting, 1000));
	cr_assert_eq(dstats().fail[DISPATCHER_FAIL_TIMEOUT], 1);
	cr_assert_eq(ra.calls, 1);
	close(connecting.app);
	close(refused.app);
	close(filler);
	close(l);
	dispatcher_free(disp);
	disp = NULL;
	heap_cfg_free(b);
}

/* A -> B with no session: released inside the call. B -> C -> D with sessions on B and C:
 * each goes with its own last session, in whatever order they end, and dispatcher_free
 * releases what is still held (never the current one). */
Test(session, reload_chain_and_free_release_each_once)
{
	struct echo e1, e2;
	struct sess sb, sc, sd;
	struct ts_config *a, *b, *c, *d;
	struct rel ra = { 0 }, rb = { 0 }, rc = { 0 };
	char route[128];

	a = heap_cfg(2000, "");
	start_on(a);
	echo_start(&e1, 4);
	echo_start(&e2, 4);
	b = heap_cfg(2000, block_port(route, sizeof(route), e2.port));
	c = heap_cfg(2000, block_port(route, sizeof(route), e1.port));
	d = heap_cfg(2000, "");

	ra.expect = a;
	dispatcher_set_config(disp, b, on_release, &ra);
	cr_assert_eq(ra.calls, 1, "no session: released inside set_config");

	cr_assert_eq(dispatch(&sb, 4, "127.0.0.1", e1.port), 0); /* B sends e1 direct */
	cr_assert(roundtrip(&sb, 4096));
	expect_rejected(e2.port);
	rb.expect = b;
	dispatcher_set_config(disp, c, on_release, &rb);
	cr_assert_eq(dispatch(&sc, 4, "127.0.0.1", e2.port), 0); /* C sends e2 direct */
	cr_assert(roundtrip(&sc, 4096));
	expect_rejected(e1.port);
	rc.expect = c;
	dispatcher_set_config(disp, d, on_release, &rc);
	cr_assert_eq(dispatch(&sd, 4, "127.0.0.1", e2.port), 0); /* under D */
	cr_assert(roundtrip(&sd, 4096));
	/* Every session still relays through its own configuration's outbound. */
	cr_assert(roundtrip(&sb, 65536));
	cr_assert(roundtrip(&sc, 65536));
	cr_assert_eq(rb.calls + rc.calls, 0);

	finish(&sc); /* the newer retired one first */
	cr_assert_eq(rc.calls, 1);
	cr_assert_eq(rb.calls, 0);
	cr_assert(roundtrip(&sb, 4096));

	dispatcher_free(disp); /* sb (B) and sd (D, current) still live */
	disp = NULL;
	cr_assert_eq(sb.ends, 1);
	cr_assert_eq(sd.ends, 1);
	cr_assert_eq(rb.calls, 1, "dispatcher_free releases the held configuration");
	cr_assert_eq(ra.calls + rc.calls, 2);
	close(sb.app);
	close(sd.app);
	for (int i = 0; i < 100 && e1.live + e2.live > 0; i++)
		event_base_loop(base, EVLOOP_ONCE);
	cr_assert_eq(e1.live + e2.live, 0);
	heap_cfg_free(d);
	evconnlistener_free(e1.l);
	evconnlistener_free(e2.l);
}

/* ---- destinations by name ----------------------------------------------------------------- */

struct namer_rec {
	const char *name;  /* the answer */
	int calls, family;
	uint8_t dst[16];
	uint16_t dport;
};

static const char *test_namer(void *arg, int family, const uint8_t *dst, uint16_t dport)
{
	struct namer_rec *n = arg;

	n->calls++;
	n->family = family;
	memcpy(n->dst, dst, family == 4 ? 4 : 16);
	n->dport = dport;
	return n->name;
}

static const struct rr NAMES[] = {
	{ .name = "echo.test", .ttl = 60, .a = { "127.0.0.1" } },
	{ .name = NULL },
};

/* The dispatcher with n as its namer; its direct outbound resolves with a resolver on the
 * test's fake DNS (the dispatcher borrows cfg, so the outbound is the one it uses). */
static struct resolver *names_start(struct dns *dns, struct namer_rec *n)
{
	struct resolver_config rc = { .timeout_ms = 1000, .tries = 1 };
	struct resolver *res = NULL;

	start("copy", 2000, 1000);
	dns_start(dns, base, NAMES);
	rc.servers = dns->servers;
	cr_assert_eq(resolver_new(base, &rc, &res), 0);
	cfg.outbounds[0].resolver = res;
	dispatcher_set_namer(disp, test_namer, n);
	return res;
}

static void names_stop(struct dns *dns, struct resolver *res)
{
	cfg.outbounds[0].resolver = NULL;
	resolver_free(res);
	dns_stop(dns);
}

/* The app connected to 127.0.0.2, where nothing listens; the namer names it echo.test, which
 * resolves to the echo server on 127.0.0.1: the echo comes back only if the name was used.
 * The same flow without a name is refused. */
Test(session, namer_name_reaches_the_outbound)
{
	struct namer_rec n = { .name = "echo.test" };
	uint8_t want[16];
	struct app_wait w;
	struct resolver *res;
	struct echo e;
	struct sess s;
	struct dns dns;

	res = names_start(&dns, &n);
	echo_start(&e, 4);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.2", e.port), 0);
	cr_assert_eq(n.calls, 1, "the namer runs once, inside dispatcher_start_tcp");
	cr_assert_eq(n.family, 4);
	tu_addr(want, "127.0.0.2");
	cr_assert_arr_eq(n.dst, want, 4);
	cr_assert_eq(n.dport, e.port);
	cr_assert(roundtrip(&s, 65536), "no echo: the name was not used");
	cr_assert_eq(dns.q_a, 1, "echo.test looked up");
	shutdown(s.app, SHUT_WR);
	w = (struct app_wait){ .fd = s.app };
	cr_assert(run_until(app_closed, &w, 5000));
	cr_assert(run_until(ended, &s, 5000));
	close(s.app);
	cr_assert_eq(dstats().sessions_refused, 0);

	n.name = NULL;
	cr_assert_eq(dispatch(&s, 4, "127.0.0.2", e.port), 0);
	cr_assert_eq(n.calls, 2);
	expect_prompt_reset(&s, DISPATCHER_FAIL_REFUSED);
	names_stop(&dns, res);
	evconnlistener_free(e.l);
}

/* A name that does not resolve: a prompt RST, counted as resolve. */
Test(session, namer_unknown_name_resets_promptly)
{
	struct namer_rec n = { .name = "nosuch.test" };
	struct resolver *res;
	struct sess s;
	struct dns dns;

	res = names_start(&dns, &n);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.2", 443), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_RESOLVE);
	cr_assert_eq(dns.queries, 2, "A and AAAA asked");
	names_stop(&dns, res);
}

/* A name that could change a proxy request's meaning never reaches an outbound. */
Test(session, namer_bad_name_is_refused)
{
	struct namer_rec n = { .name = "evil.test\r\nX: 1" };
	struct resolver *res;
	struct sess s;
	struct dns dns;

	res = names_start(&dns, &n);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.2", 443), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_BAD_NAME);
	cr_assert_eq(dns.queries, 0, "nothing looked up");
	names_stop(&dns, res);
}

/* Route rules see the name: a name under a blocked suffix goes to the reject outbound. */
Test(session, namer_name_is_routed_by_name)
{
	struct namer_rec n = { .name = "www.Blocked.Test" };
	struct resolver *res;
	struct sess s;
	struct dns dns;

	res = names_start(&dns, &n);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.2", 443), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_REJECT);
	cr_assert_eq(dns.queries, 0, "never looked up: rejected by its name");
	names_stop(&dns, res);
}

/* ---- route.sniff: the name the app announces, looked at without taking a byte -------------- */

/* Send buf from the app in parts of part bytes, turning the loop for gap_ms between them;
 * then read the echo back: true if it is buf, byte for byte. */
static bool send_parts_echoed(struct sess *s, const uint8_t *buf, size_t len, size_t part,
			      int gap_ms)
{
	uint8_t rx[1024];
	size_t got = 0;
	int64_t end;

	cr_assert_leq(len, sizeof(rx));
	for (size_t off = 0; off < len; off += part) {
		size_t c = len - off < part ? len - off : part;

		cr_assert_eq(send(s->app, buf + off, c, MSG_NOSIGNAL), (ssize_t)c);
		end = mono_ms() + gap_ms;
		while (off + c < len && mono_ms() < end)
			event_base_loop(base, EVLOOP_NONBLOCK);
	}
	end = mono_ms() + 5000;
	while (got < len && mono_ms() < end) {
		ssize_t k = recv(s->app, rx + got, len - got, 0);

		if (k > 0)
			got += (size_t)k;
		else if (k == 0 || errno != EAGAIN)
			break;
		event_base_loop(base, EVLOOP_NONBLOCK);
	}
	return got == len && memcmp(rx, buf, len) == 0;
}

static bool connected(void *arg)
{
	(void)arg;
	return dstats().sessions_connecting == 0 && dstats().sniff.active == 0;
}

#define SNIFF_ON "\"sniff\": { \"timeout_ms\": 200 },"

Test(session, sniff_tls_name_changes_the_route)
{
	uint8_t hello[512];
	size_t n = tu_client_hello(hello, "www.blocked.test", true);
	struct dispatcher_stats st;
	struct sess s;

	sniff_json = SNIFF_ON;
	start("splice", 2000, 1000);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", 4433), 0);
	cr_assert_eq(dstats().sniff.active, 1, "waits for the first bytes");
	cr_assert_eq(send(s.app, hello, n, MSG_NOSIGNAL), (ssize_t)n);
	expect_prompt_reset(&s, DISPATCHER_FAIL_REJECT);
	st = dstats();
	cr_assert_eq(st.sniff.started, 1);
	cr_assert_eq(st.sniff.found[0], 1, "one TLS name");
	cr_assert_eq(st.sniff.route_changed, 1);
	cr_assert_eq(st.sniff.timeouts, 0);
	cr_assert_eq(st.sniff.active, 0);
}

Test(session, sniff_hello_in_three_parts_arrives_intact)
{
	uint8_t hello[512];
	size_t n = tu_client_hello(hello, "Mixed.Case.Example", true);
	struct dispatcher_stats st;
	struct echo e;
	struct sess s;

	sniff_json = SNIFF_ON;
	start("splice", 2000, 1000);
	echo_start(&e, 4);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", e.port), 0);
	/* Three segments 30 ms apart: two looks find a prefix, the third the name. */
	cr_assert(send_parts_echoed(&s, hello, n, n / 3 + 1, 30), "the echo differs");
	cr_assert(roundtrip(&s, 64 << 10), "the relay after the look differs");
	st = dstats();
	cr_assert_eq(st.sniff.found[0], 1);
	cr_assert_eq(st.sniff.route_changed, 0, "a name no rule names keeps the route");
	cr_assert_eq(st.sniff.timeouts, 0);
	cr_assert_eq(st.bytes_up, n + (64 << 10));
	finish(&s);
	evconnlistener_free(e.l);
}

Test(session, sniff_http_host_and_no_name)
{
	static const char req[] = "GET /x HTTP/1.1\r\nHost: site.test:8080\r\nAccept: */*\r\n\r\n";
	static const char ssh[] = "SSH-2.0-OpenSSH_9.2\r\n";
	struct dispatcher_stats st;
	struct echo e;
	struct sess a, b;

	sniff_json = SNIFF_ON;
	start("copy", 2000, 1000);
	echo_start(&e, 4);
	cr_assert_eq(dispatch(&a, 4, "127.0.0.1", e.port), 0);
	cr_assert(send_parts_echoed(&a, (const uint8_t *)req, strlen(req), strlen(req), 0));
	cr_assert_eq(dispatch(&b, 4, "127.0.0.1", e.port), 0);
	cr_assert(send_parts_echoed(&b, (const uint8_t *)ssh, strlen(ssh), strlen(ssh), 0));
	st = dstats();
	cr_assert_eq(st.sniff.started, 2);
	cr_assert_eq(st.sniff.found[1], 1, "one HTTP name");
	cr_assert_eq(st.sniff.no_name, 1, "SSH names nothing");
	cr_assert_eq(st.sniff.timeouts, 0, "decided on the first bytes, no wait");
	finish(&a);
	finish(&b);
	evconnlistener_free(e.l);
}

Test(session, sniff_silent_client_waits_only_the_timeout)
{
	struct dispatcher_stats st;
	struct echo e;
	struct sess s;
	int64_t t0 = mono_ms(), took;

	sniff_json = SNIFF_ON;
	start("splice", 2000, 1000);
	echo_start(&e, 4);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", e.port), 0);
	cr_assert(run_until(connected, NULL, 3000));
	took = mono_ms() - t0;
	cr_assert(took >= 190 && took < 1200, "connected after %lld ms (timeout 200)",
		  (long long)took);
	st = dstats();
	cr_assert_eq(st.sniff.timeouts, 1);
	cr_assert(roundtrip(&s, 4096));
	finish(&s);
	evconnlistener_free(e.l);
}

Test(session, sniff_skips_flows_no_name_can_route)
{
	struct sess s;

	/* Port 9 goes to "block" by a rule without names before any name rule: nothing to learn. */
	sniff_json = SNIFF_ON;
	start("splice", 2000, 1000);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", REJECT_PORT), 0);
	expect_prompt_reset(&s, DISPATCHER_FAIL_REJECT);
	cr_assert_eq(dstats().sniff.started, 0);
}

Test(session, sniff_app_closing_early_is_routed_by_address)
{
	uint8_t hello[512];
	size_t n = tu_client_hello(hello, "www.blocked.test", true);
	struct sess s;
	struct app_wait w;

	/* Half a ClientHello, then FIN: the look ends without a name and without waiting out
	 * the timeout (the FIN wakes it with no new byte). */
	sniff_json = "\"sniff\": { \"timeout_ms\": 5000 },";
	start("splice", 2000, 1000);
	cr_assert_eq(dispatch(&s, 4, "127.0.0.1", 1), 0); /* port 1: refused by the kernel */
	cr_assert_eq(send(s.app, hello, n / 2, MSG_NOSIGNAL), (ssize_t)(n / 2));
	shutdown(s.app, SHUT_WR);
	w = (struct app_wait){ .fd = s.app };
	cr_assert(run_until(app_closed, &w, 2000), "ended long before the 5 s timeout");
	cr_assert_eq(dstats().sniff.no_name, 1);
	cr_assert_eq(dstats().sniff.timeouts, 0);
	cr_assert(run_until(ended, &s, 1000));
	close(s.app);
}

/* The look's buffer refused (the first look allocates it): the session goes by address, as
 * a look without a name would, and the skip is counted. A name rule (here, reject) cannot
 * apply then; the next session gets its look. */
Test(session, sniff_without_memory_goes_by_address_and_is_counted)
{
	uint8_t hello[512];
	size_t n = tu_client_hello(hello, "www.blocked.test", true);
	struct dispatcher_stats st;
	struct flow_key k;
	struct stream *client;
	struct echo e;
	struct sess s, t;
	int accepted;

	sniff_json = SNIFF_ON;
	start("copy", 2000, 1000); /* no pool pipe holds fds at the reset's check */
	echo_start(&e, 4);
	memset(&s, 0, sizeof(s));
	app_pair(4, &s.app, &accepted);
	cr_assert_eq(budget_fd_reserve(budget, 1), 0);
	s.fd_held = true;
	cr_assert_eq(stream_sock_new(base, accepted, &client), 0);
	flow(&k, 4, "127.0.0.1", e.port, s.app);
	failalloc_arm(2); /* the session, then the look's buffer */
	cr_assert_eq(dispatcher_start_tcp(disp, &k, client, on_end, &s), 0);
	cr_assert(failalloc_fired());
	failalloc_arm(0);
	st = dstats();
	cr_assert_eq(st.sessions_active, 1, "the session itself got its memory");
	cr_assert_eq(st.sniff.started, 0);
	cr_assert_eq(st.sniff.active, 0, "no look waits");
	cr_assert(send_parts_echoed(&s, hello, n, n, 0), "not relayed by address");
	st = dstats();
	cr_assert_eq(st.sniff.skipped_no_memory, 1);
	cr_assert_eq(st.sniff.found[0], 0);
	cr_assert_eq(st.fail[DISPATCHER_FAIL_REJECT], 0);
	finish(&s);
	/* Memory again: the next session's name is read, and its rule applies. */
	cr_assert_eq(dispatch(&t, 4, "127.0.0.1", e.port), 0);
	cr_assert_eq(send(t.app, hello, n, MSG_NOSIGNAL), (ssize_t)n);
	expect_prompt_reset(&t, DISPATCHER_FAIL_REJECT);
	st = dstats();
	cr_assert_eq(st.sniff.started, 1);
	cr_assert_eq(st.sniff.skipped_no_memory, 1);
	evconnlistener_free(e.l);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* One accepted connection to dst:port, as a stack hands it over: its one on_end always runs
 * (at once when the dispatcher could not even take it); with echo, the bytes come back whole
 * unless an allocation was refused (then the app is reset). The session is ended unless kept
 * (live at the dispatcher's free). */
static void nomem_session(struct sess *s, const char *dst, uint16_t port, bool echo, bool keep,
			  bool sweep)
{
	struct flow_key k;
	struct stream *client;
	struct app_wait w;
	int accepted, rc;

	memset(s, 0, sizeof(*s));
	app_pair(4, &s->app, &accepted);
	cr_assert_eq(budget_fd_reserve(budget, 1), 0);
	s->fd_held = true;
	if ((rc = stream_sock_new(base, accepted, &client)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "stream_sock_new: %d", rc);
		close(accepted);
		on_end(s);
		close(s->app);
		s->app = -1;
		return;
	}
	flow(&k, 4, dst, port, s->app);
	rc = dispatcher_start_tcp(disp, &k, client, on_end, s);
	if (rc) {
		cr_assert(sweep && rc == -ENOMEM, "dispatcher_start_tcp: %d", rc);
		cr_assert_eq(s->ends, 1, "on_end ran before the refusal's return");
	} else {
		cr_assert_eq(s->ends, 0, "on_end never runs inside dispatcher_start_tcp");
	}
	if (echo && rc == 0)
		cr_assert(roundtrip(s, 64 << 10) || sweep, "echo differs");
	if (keep)
		return;
	shutdown(s->app, SHUT_WR);
	w = (struct app_wait){ .fd = s->app };
	cr_assert(run_until(app_closed, &w, 5000), "the app's connection never ended");
	cr_assert(run_until(ended, s, 5000), "on_end never ran");
	cr_assert_eq(s->ends, 1);
	close(s->app);
	s->app = -1;
}

static bool echo_idle(void *arg)
{
	return ((struct echo *)arg)->live == 0;
}

/* A dispatcher's life in relay mode arg: a session relayed to the echo server, one routed to
 * reject, one live at the free. Every on_end runs once; every fd and byte comes back. */
static void nomem_scenario(void *arg, bool sweep)
{
	const char *mode = arg;
	char json[512], err[TS_ERRLEN];
	struct budget_stats bs;
	struct sess a, r, live;
	struct echo e;
	int rc;

	signal(SIGPIPE, SIG_IGN);
	budget = NULL;
	disp = NULL;
	failalloc_hold(true); /* the loop and the test's server */
	cr_assert_not_null(base = event_base_new());
	echo_start(&e, 4);
	failalloc_hold(false);
	snprintf(json, sizeof(json),
		 "{ \"timeouts\": { \"connect_ms\": 2000 },"
		 "  \"outbounds\": [ { \"tag\": \"direct\", \"type\": \"direct\" },"
		 "                   { \"tag\": \"block\", \"type\": \"reject\" } ],"
		 "  \"relay\": { \"mode\": \"%s\" },"
		 "  \"route\": { \"rules\": [ { \"port\": [%d], \"outbound\": \"block\" } ],"
		 "               \"final\": \"direct\" } }", mode, REJECT_PORT);
	if ((rc = config_load_string(json, &cfg, err, sizeof(err))) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "%s", err);
		goto out;
	}
	if ((rc = budget_new(&cfg.budget, &budget)) != 0) {
		cr_assert(sweep && rc == -ENOMEM);
		goto out;
	}
	if ((rc = dispatcher_new(base, &cfg, budget, &disp)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dispatcher_new: %d", rc);
		goto out;
	}
	nomem_session(&a, "127.0.0.1", e.port, true, false, sweep);
	nomem_session(&r, "127.0.0.1", REJECT_PORT, false, false, sweep);
	nomem_session(&live, "127.0.0.1", e.port, true, true, sweep);
	dispatcher_free(disp);
	disp = NULL;
	cr_assert_eq(live.ends, 1, "the live session's on_end at the free");
	if (live.app >= 0)
		close(live.app);
	budget_get_stats(budget, &bs);
	cr_assert_eq(bs.fds_in_use, 0, "fds kept");
	cr_assert_eq(bs.buffer_bytes_in_use, 0, "buffer bytes kept");
out:
	/* The echo server's own connections end once it reads their end (its bufferevents). */
	cr_assert(run_until(echo_idle, &e, 5000), "the echo server kept %d connections", e.live);
	evconnlistener_free(e.l);
	budget_free(budget);
	budget = NULL;
	config_fini(&cfg);
	event_base_free(base);
	base = NULL;
}

#include "core/evmem.h"
Test(dispatcher_nomem, each_allocation_refused_in_turn_splice)
{
	cr_assert_eq(evmem_install(), 0);
	cr_log_info("splice: %ld allocations refused in turn",
		    failalloc_sweep(nomem_scenario, "splice", 10, 2000));
}

Test(dispatcher_nomem, each_allocation_refused_in_turn_copy)
{
	cr_assert_eq(evmem_install(), 0);
	cr_log_info("copy: %ld allocations refused in turn",
		    failalloc_sweep(nomem_scenario, "copy", 10, 2000));
}
