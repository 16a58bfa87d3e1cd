/* test_udp_offload.c — dispatch/udp: flows handed to a stack's offload (udp_path_set_offload).
 * A fake offload records what the path offers, takes out and asks; the path runs over
 * loopback against a real echo server, as in test_udp.c. Time for the join is passed in with
 * each datagram (the path's input takes it); the idle timer runs on the real clock.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/pkt.h"
#include "dispatch/udp.h"
#include "testutil.h"
#include "udptest.h"

#define ONE_MS 1000000LL

struct fake {
	int adds, dels, seens;
	int add_ret;                 /* what add answers (0: takes the flow) */
	int64_t seen_ns;             /* what seen answers (0: the time of the add) */
	struct udp_fast_flow last;   /* the last flow offered */
	int64_t added_at;
	int cookies;                 /* cookies handed out and not yet taken back */
	bool fd_open_at_del;         /* every del came while its socket was still open */
};

static int fake_add(void *arg, const struct udp_fast_flow *f, void **cookie)
{
	struct fake *x = arg;

	x->adds++;
	x->last = *f;
	if (x->add_ret)
		return x->add_ret;
	x->added_at = ts_now_ns();
	int *fd = malloc(sizeof(*fd));

	cr_assert_not_null(fd);
	*fd = f->fd;
	x->cookies++;
	*cookie = fd;
	return 0;
}

static void fake_del(void *arg, void *cookie)
{
	struct fake *x = arg;

	x->dels++;
	x->cookies--;
	if (fcntl(*(int *)cookie, F_GETFD) < 0)
		x->fd_open_at_del = false;
	free(cookie);
}

static int64_t fake_seen(void *arg, void *cookie)
{
	struct fake *x = arg;

	(void)cookie;
	x->seens++;
	return x->seen_ns ? x->seen_ns : x->added_at;
}

static const struct udp_offload fake_ops = { fake_add, fake_del, fake_seen };

struct env {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *b;
	struct udp_path *up;
	struct fake fk;
	int replies;
	int echo_fd;
	uint16_t echo_port;
	struct event *echo_ev;
};

static int count_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct env *e = arg;

	(void)pkt;
	(void)len;
	e->replies++;
	return 0;
}

static void echo_cb(evutil_socket_t fd, short what, void *arg)
{
	uint8_t buf[2048];
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&peer, &plen);

	(void)what;
	(void)arg;
	if (n >= 0)
		cr_assert_eq(sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&peer, plen), n);
}

static void env_start(struct env *e, const char *json)
{
	char err[TS_ERRLEN];
	struct sockaddr_storage ss;
	socklen_t len = tu_sockaddr(&ss, "127.0.0.1", 0);

	memset(e, 0, sizeof(*e));
	e->fk.fd_open_at_del = true;
	e->base = event_base_new();
	cr_assert_not_null(e->base);
	e->echo_fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(e->echo_fd, 0);
	cr_assert_eq(bind(e->echo_fd, (struct sockaddr *)&ss, len), 0);
	cr_assert_eq(getsockname(e->echo_fd, (struct sockaddr *)&ss, &len), 0);
	e->echo_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	e->echo_ev = event_new(e->base, e->echo_fd, EV_READ | EV_PERSIST, echo_cb, e);
	cr_assert_eq(event_add(e->echo_ev, NULL), 0);
	cr_assert_eq(config_load_string(json, &e->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&e->cfg.budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, &e->cfg, e->b, count_tx, e, &e->up), 0);
	udp_path_set_offload(e->up, &fake_ops, &e->fk);
}

static void env_fini(struct env *e)
{
	ut_path_free_checked(e->up, e->b);
	cr_assert_eq(e->fk.cookies, 0, "%d flows never taken out", e->fk.cookies);
	cr_assert(e->fk.fd_open_at_del, "a flow was taken out after its socket closed");
	budget_free(e->b);
	config_fini(&e->cfg);
	event_free(e->echo_ev);
	close(e->echo_fd);
	event_base_free(e->base);
}

/* One datagram with payload p from src:sport to dst:dport at time now (a batch of its own). */
static void send_payload_at(struct env *e, const char *src, uint16_t sport, const char *dst,
			    uint16_t dport, const void *p, size_t len, int64_t now)
{
	struct tu_spec s;
	uint8_t pkt[2048];
	size_t n;

	tu_spec_udp(&s, src, sport, dst, dport);
	s.payload = p;
	s.payload_len = len;
	n = tu_build(&s, pkt, sizeof(pkt));
	udp_path_input(e->up, pkt, n, now);
	udp_path_batch_end(e->up);
}

/* The same with the payload "offload". */
static void send_at(struct env *e, const char *src, uint16_t sport, const char *dst,
		    uint16_t dport, int64_t now)
{
	send_payload_at(e, src, sport, dst, dport, "offload", 7, now);
}

/* The flow 10.0.0.9:5353 -> the echo server offered once its datagrams have gone on for
 * 10 ms, not before, and once only; then in the kernel (fast_flows 1). */
static void join(struct env *e)
{
	int64_t t0 = ts_now_ns();

	send_at(e, "10.0.0.9", 5353, "127.0.0.1", e->echo_port, t0);
	send_at(e, "10.0.0.9", 5353, "127.0.0.1", e->echo_port, t0 + UDP_FAST_AGE_NS - 1);
	cr_assert_eq(e->fk.adds, 0, "offered before %d ns", UDP_FAST_AGE_NS);
	send_at(e, "10.0.0.9", 5353, "127.0.0.1", e->echo_port, t0 + UDP_FAST_AGE_NS);
	cr_assert_eq(e->fk.adds, 1);
	send_at(e, "10.0.0.9", 5353, "127.0.0.1", e->echo_port, t0 + 2 * UDP_FAST_AGE_NS);
	cr_assert_eq(e->fk.adds, 1, "offered again while in the kernel");
	cr_assert(UT_PUMP_UNTIL(e->base, e->replies == 4, 2000));
	cr_assert_eq(ut_stats(e->up).fast_flows, 1);
	cr_assert_eq(ut_stats(e->up).fast_added, 1);
}

Test(udp_offload, a_flow_is_offered_after_10_ms_with_its_socket_and_timeout)
{
	struct env e;
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);

	env_start(&e, "{\"timeouts\":{\"udp_idle_ms\":700}}");
	join(&e);
	const struct udp_fast_flow *f = &e.fk.last;
	cr_assert_eq(f->app.family, 4);
	cr_assert_eq(ntohs(f->app.sport_be), 5353);
	cr_assert_eq(ntohs(f->app.dport_be), e.echo_port);
	cr_assert_eq(memcmp(f->app.src, "\x0a\x00\x00\x09", 4), 0);
	cr_assert_eq(memcmp(f->app.dst, "\x7f\x00\x00\x01", 4), 0);
	cr_assert_eq(f->idle_ns, 700 * (uint64_t)ONE_MS);
	cr_assert_not_null(f->ob);
	/* The socket offered is the one the echoes went through. */
	cr_assert_eq(getsockname(f->fd, (struct sockaddr *)&sa, &len), 0);
	cr_assert_neq(sa.sin_port, 0);
	env_fini(&e);
	cr_assert_eq(e.fk.dels, 1, "the flow was not taken out when its session ended");
}

Test(udp_offload, a_refused_flow_stays_and_is_not_offered_again)
{
	struct env e;
	int64_t t0;

	env_start(&e, "{}");
	e.fk.add_ret = -ENETUNREACH;
	t0 = ts_now_ns();
	for (int i = 0; i < 5; i++)
		send_at(&e, "10.0.0.9", 5353, "127.0.0.1", e.echo_port, t0 + i * UDP_FAST_AGE_NS);
	cr_assert_eq(e.fk.adds, 1);
	cr_assert(UT_PUMP_UNTIL(e.base, e.replies == 5, 2000), "the refused flow lost datagrams");
	cr_assert_eq(ut_stats(e.up).fast_refused, 1);
	cr_assert_eq(ut_stats(e.up).fast_flows, 0);
	env_fini(&e);
	cr_assert_eq(e.fk.dels, 0);
}

Test(udp_offload, dns_and_named_and_rejected_flows_are_never_offered)
{
	struct env e;
	int64_t t0;
	uint8_t q[12] = { 0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0 };
	struct tu_spec s;
	uint8_t pkt[256];
	size_t n;
	char json[512];

	snprintf(json, sizeof(json),
		 "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"},"
		 "\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"},"
		 "{\"tag\":\"block\",\"type\":\"reject\"}],"
		 "\"route\":{\"rules\":[{\"cidr\":[\"127.0.0.2/32\"],\"outbound\":\"block\"}],"
		 "\"final\":\"direct\"}}", 9); /* the upstream never answers: nothing to wait for */
	env_start(&e, json);
	t0 = ts_now_ns();
	for (int i = 0; i < 4; i++) {
		/* Hijacked DNS (port 53 goes to the upstream, whatever the address). */
		tu_spec_udp(&s, "10.0.0.9", 5000, "127.0.0.1", 53);
		s.payload = q;
		s.payload_len = sizeof(q);
		n = tu_build(&s, pkt, sizeof(pkt));
		udp_path_input(e.up, pkt, n, t0 + i * UDP_FAST_AGE_NS);
		udp_path_batch_end(e.up);
		/* Rejected by the route. */
		send_at(&e, "10.0.0.9", 5001, "127.0.0.2", 7, t0 + i * UDP_FAST_AGE_NS);
	}
	cr_assert_eq(e.fk.adds, 0, "offered %d flows", e.fk.adds);
	env_fini(&e);
}

Test(udp_offload, the_kernels_activity_keeps_the_session_then_it_expires_and_leaves)
{
	struct env e;

	env_start(&e, "{\"timeouts\":{\"udp_idle_ms\":1000}}");
	join(&e);
	/* The kernel keeps sending: the session outlives two and a half idle timeouts (each
	 * look at the kernel's time finds it at most 100 ms old, however late the timer). */
	for (int i = 0; i < 25; i++) {
		e.fk.seen_ns = ts_now_ns();
		ut_pump_for(e.base, 100);
	}
	cr_assert_eq(ut_stats(e.up).sessions, 1, "expired while the kernel carried its flow");
	cr_assert_geq(ut_stats(e.up).fast_kept, 2);
	cr_assert_eq(e.fk.dels, 0);
	/* It stops: the session expires within a timeout or two, and its flow leaves with it. */
	cr_assert(UT_PUMP_UNTIL(e.base, ut_stats(e.up).sessions == 0, 2000));
	cr_assert_eq(ut_stats(e.up).sessions_expired, 1);
	cr_assert_eq(e.fk.dels, 1);
	cr_assert_eq(ut_stats(e.up).fast_flows, 0);
	env_fini(&e);
}

Test(udp_offload, taking_the_offload_away_takes_every_flow_out_and_they_go_on)
{
	struct env e;
	int64_t t0;

	env_start(&e, "{}");
	join(&e);
	t0 = ts_now_ns();
	send_at(&e, "10.0.0.8", 4000, "127.0.0.1", e.echo_port, t0);
	send_at(&e, "10.0.0.8", 4000, "127.0.0.1", e.echo_port, t0 + UDP_FAST_AGE_NS);
	cr_assert_eq(e.fk.adds, 2);
	udp_path_set_offload(e.up, NULL, NULL);
	cr_assert_eq(e.fk.dels, 2);
	cr_assert_eq(ut_stats(e.up).fast_flows, 0);
	/* The sessions live on in userspace: their datagrams are still echoed. */
	send_at(&e, "10.0.0.9", 5353, "127.0.0.1", e.echo_port, ts_now_ns());
	cr_assert(UT_PUMP_UNTIL(e.base, e.replies == 7, 2000));
	cr_assert_eq(ut_stats(e.up).sessions, 2);
	env_fini(&e);
	cr_assert_eq(e.fk.dels, 2);
}

Test(udp_offload, a_reset_takes_every_flow_out_and_they_join_again)
{
	struct env e;
	int64_t t0;

	env_start(&e, "{}");
	join(&e);
	udp_path_offload_reset(e.up);
	cr_assert_eq(e.fk.dels, 1);
	cr_assert_eq(ut_stats(e.up).fast_flows, 0);
	/* The flow goes on through its socket, a candidate again: in after another 10 ms. */
	t0 = ts_now_ns();
	send_at(&e, "10.0.0.9", 5353, "127.0.0.1", e.echo_port, t0);
	cr_assert_eq(e.fk.adds, 1);
	send_at(&e, "10.0.0.9", 5353, "127.0.0.1", e.echo_port, t0 + UDP_FAST_AGE_NS);
	cr_assert_eq(e.fk.adds, 2);
	cr_assert_eq(ut_stats(e.up).fast_flows, 1);
	cr_assert(UT_PUMP_UNTIL(e.base, e.replies == 6, 2000));
	env_fini(&e);
	cr_assert_eq(e.fk.dels, 2);
}

/* A flow in the kernel whose datagram the kernel left to us (a QUIC Initial of a new
 * connection on the same ports, under route.sniff) now goes through another socket: the look
 * at its name chose another outbound. The flow leaves, its datagrams go on through the new
 * socket, and it joins again with that socket after another 10 ms. */
Test(udp_offload, a_flow_that_a_look_sends_through_another_socket_leaves_and_joins_again)
{
	static const char short_hdr[] = "\x40short-header";
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(443) };
	struct env e;
	struct event *ev;
	uint8_t msg[256], pkt[1500];
	int srv, first_fd;
	size_t n;
	int64_t t0;

	env_start(&e, "{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"},"
		      "{\"tag\":\"other\",\"type\":\"direct\"}],"
		      "\"route\":{\"sniff\":{\"timeout_ms\":300},"
		      "\"rules\":[{\"domain_suffix\":[\"other.test\"],\"outbound\":\"other\"}],"
		      "\"final\":\"direct\"}}");
	srv = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(srv, 0);
	inet_pton(AF_INET, "127.0.0.90", &sin.sin_addr);
	cr_assert_eq(bind(srv, (struct sockaddr *)&sin, sizeof(sin)), 0, "bind 127.0.0.90:443: %s",
		     strerror(errno));
	ev = event_new(e.base, srv, EV_READ | EV_PERSIST, echo_cb, NULL);
	cr_assert_eq(event_add(ev, NULL), 0);

	/* Short-header datagrams are never looked at: by address, through "direct". */
	t0 = ts_now_ns();
	send_payload_at(&e, "10.0.0.9", 5600, "127.0.0.90", 443, short_hdr, sizeof(short_hdr) - 1,
			t0);
	send_payload_at(&e, "10.0.0.9", 5600, "127.0.0.90", 443, short_hdr, sizeof(short_hdr) - 1,
			t0 + UDP_FAST_AGE_NS);
	cr_assert_eq(e.fk.adds, 1);
	cr_assert(e.fk.last.quic_handshakes, "its QUIC handshakes are not left to the look");
	first_fd = e.fk.last.fd;

	/* A new connection's Initial naming www.other.test: the look sends it through "other". */
	n = ut_quic_initial(pkt, sizeof(pkt), 0, 0, msg,
			    tu_client_hello(msg, "www.other.test", false));
	send_payload_at(&e, "10.0.0.9", 5600, "127.0.0.90", 443, pkt, n,
			t0 + UDP_FAST_AGE_NS + 1);
	cr_assert_eq(ut_stats(e.up).sniff_route_changed, 1);
	cr_assert_eq(e.fk.dels, 1, "the flow stayed in the kernel on its old socket");
	cr_assert_eq(ut_stats(e.up).fast_flows, 0);

	/* The flow goes on through "other": a candidate again, in after 10 ms with that socket. */
	send_payload_at(&e, "10.0.0.9", 5600, "127.0.0.90", 443, short_hdr, sizeof(short_hdr) - 1,
			t0 + UDP_FAST_AGE_NS + 2);
	cr_assert_eq(e.fk.adds, 1);
	send_payload_at(&e, "10.0.0.9", 5600, "127.0.0.90", 443, short_hdr, sizeof(short_hdr) - 1,
			t0 + 2 * UDP_FAST_AGE_NS + 2);
	cr_assert_eq(e.fk.adds, 2);
	cr_assert_neq(e.fk.last.fd, first_fd, "joined again with the old socket");
	cr_assert_eq(ut_stats(e.up).fast_flows, 1);
	/* Every datagram reached the server and came back: nothing lost across the moves. */
	cr_assert(UT_PUMP_UNTIL(e.base, e.replies == 5, 2000), "%d replies", e.replies);
	env_fini(&e);
	cr_assert_eq(e.fk.dels, 2);
	event_free(ev);
	close(srv);
}
