/* test_udp_sniff.c — route.sniff on the UDP path: the SNI in a client's QUIC Initial chooses the
 * route of its flow. Initials are built and protected here (RFC 9001 §5, quic_initial_seal)
 * around a ClientHello; a UDP server on 127.0.0.N:443 (N of each test's own, so that tests run
 * in parallel never share it) records what the path sends, in order.
 * Cases: a name a reject rule names drops the flow; a ClientHello split over two Initials
 * holds the first until the second decides, then both go out in order, and later packets of
 * the flow follow without a look; an Initial that never completes goes by address after the
 * timeout; other datagrams to port 443 are never looked at; a path freed while datagrams wait
 * gives every buffer back; a look that could not start (no memory, too many at once, the
 * session busy with another flow) is counted, and its flow is not looked at later in the
 * middle of its hello.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/config.h"
#include "dispatch/udp.h"
#include "failalloc.h"
#include "testutil.h"
#include "udptest.h"

#define MAX_GOT 16

struct env {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *b;
	struct udp_path *up;
	int srv;
	struct event *srv_ev;
	char server[16];
	int got;
	size_t got_len[MAX_GOT];
	uint8_t got_first[MAX_GOT][16];
};

static int no_tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	(void)pkt;
	(void)len;
	return 0;
}

static void srv_cb(evutil_socket_t fd, short what, void *arg)
{
	struct env *e = arg;
	uint8_t buf[2048];
	ssize_t n;

	(void)what;
	while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
		cr_assert_lt(e->got, MAX_GOT);
		e->got_len[e->got] = (size_t)n;
		memcpy(e->got_first[e->got], buf, 16);
		e->got++;
	}
}

static void env_start(struct env *e, uint32_t timeout_ms, int n)
{
	char json[1024], err[TS_ERRLEN];
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(443) };

	memset(e, 0, sizeof(*e));
	snprintf(e->server, sizeof(e->server), "127.0.0.%d", n);
	snprintf(json, sizeof(json),
		 "{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"},"
		 "{\"tag\":\"block\",\"type\":\"reject\"}],"
		 "\"route\":{\"sniff\":{\"timeout_ms\":%u},"
		 "\"rules\":[{\"domain_suffix\":[\"blocked.test\"],\"outbound\":\"block\"}],"
		 "\"final\":\"direct\"}}",
		 timeout_ms);
	cr_assert_eq(config_load_string(json, &e->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_not_null(e->base = event_base_new());
	cr_assert_eq(budget_new(&e->cfg.budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, &e->cfg, e->b, no_tx, e, &e->up), 0);
	cr_assert_eq(udp_path_set_uptrains(e->up, true), 0); /* as the proxy runs it */
	e->srv = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(e->srv, 0);
	inet_pton(AF_INET, e->server, &sin.sin_addr);
	cr_assert_eq(bind(e->srv, (struct sockaddr *)&sin, sizeof(sin)), 0, "bind %s:443: %s",
		     e->server, strerror(errno));
	e->srv_ev = event_new(e->base, e->srv, EV_READ | EV_PERSIST, srv_cb, e);
	cr_assert_eq(event_add(e->srv_ev, NULL), 0);
}

static void env_fini(struct env *e)
{
	ut_path_free_checked(e->up, e->b);
	event_free(e->srv_ev);
	close(e->srv);
	budget_free(e->b);
	config_fini(&e->cfg);
	event_base_free(e->base);
}

static struct udp_path_stats stats(struct env *e)
{
	return ut_stats(e->up);
}

static void send_to_443(struct env *e, uint16_t sport, const uint8_t *p, size_t len)
{
	ut_tun_send(e->up, "10.0.0.9", sport, e->server, 443, p, len);
}

Test(udp_sniff, a_named_flow_takes_the_names_route)
{
	struct env e;
	uint8_t msg[256], pkt[1500];
	size_t n;

	env_start(&e, 300, 72);
	n = ut_quic_initial(pkt, sizeof(pkt), 0, 0, msg,
		    tu_client_hello(msg, "video.blocked.test", false));
	send_to_443(&e, 5000, pkt, n);
	ut_pump_for(e.base, 30);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sniff_started, 1);
	cr_assert_eq(st.sniff_quic, 1);
	cr_assert_eq(st.sniff_route_changed, 1);
	cr_assert_eq(st.drops[UDP_DROP_rejected], 1, "the reject rule named it");
	cr_assert_eq(e.got, 0, "nothing reached the server");
	cr_assert_eq(st.sessions, 0, "a dropped flow holds no session");
	/* The client's retransmission is looked at again, and dropped again. */
	send_to_443(&e, 5000, pkt, n);
	ut_pump_for(e.base, 30);
	st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_rejected], 2);
	cr_assert_eq(st.sniff_started, 2);
	cr_assert_eq(e.got, 0);
	env_fini(&e);
}

Test(udp_sniff, a_hello_over_two_initials_holds_the_first_then_sends_both_in_order)
{
	struct env e;
	uint8_t msg[256], p1[1500], p2[1500];
	size_t len = tu_client_hello(msg, "www.example.test", false), half = len / 2, n1, n2;

	env_start(&e, 2000, 73);
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg, half);
	n2 = ut_quic_initial(p2, sizeof(p2), 1, half, msg + half, len - half);
	send_to_443(&e, 5001, p1, n1);
	ut_pump_for(e.base, 30);
	cr_assert_eq(e.got, 0, "the first Initial waits");
	cr_assert_eq(stats(&e).up_queued, 1);
	cr_assert_eq(stats(&e).sessions, 1);
	send_to_443(&e, 5001, p2, n2);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 2, 2000), "got %d", e.got);
	cr_assert_eq(e.got_len[0], n1);
	cr_assert_eq(memcmp(e.got_first[0], p1, 16), 0, "the first went first");
	cr_assert_eq(e.got_len[1], n2);
	cr_assert_eq(memcmp(e.got_first[1], p2, 16), 0);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sniff_quic, 1);
	cr_assert_eq(st.sniff_route_changed, 0, "no rule names it: the address's route");
	cr_assert_eq(st.up_queued, 0);
	cr_assert_eq(st.up_datagrams, 2);
	send_to_443(&e, 5001, (const uint8_t *)"\x40short-header", 13);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 3, 2000));
	cr_assert_eq(stats(&e).sniff_started, 1);
	env_fini(&e);
}

Test(udp_sniff, a_blocked_name_over_two_initials_drops_both)
{
	struct env e;
	uint8_t msg[256], p1[1500], p2[1500];
	size_t len = tu_client_hello(msg, "ads.blocked.test", false), half = len / 2, n1, n2;

	env_start(&e, 2000, 74);
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg, half);
	n2 = ut_quic_initial(p2, sizeof(p2), 1, half, msg + half, len - half);
	send_to_443(&e, 5002, p1, n1);
	send_to_443(&e, 5002, p2, n2);
	ut_pump_for(e.base, 30);
	cr_assert_eq(stats(&e).drops[UDP_DROP_rejected], 2);
	cr_assert_eq(e.got, 0);
	cr_assert_eq(stats(&e).sessions, 0, "a refused flow keeps no session slot");
	env_fini(&e);
}

Test(udp_sniff, an_unfinished_hello_goes_by_address_after_the_timeout)
{
	struct env e;
	uint8_t msg[256], p1[1500];
	size_t len = tu_client_hello(msg, "ads.blocked.test", false), n1;
	int64_t t0;

	env_start(&e, 150, 75);
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg, len / 2);
	t0 = ts_now_ns();
	send_to_443(&e, 5003, p1, n1);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 1, 2000), "never sent");
	struct udp_path_stats st = stats(&e);
	cr_assert_geq(ts_now_ns() - t0, MS(140), "sent before the timeout (%lld ms, %lu timeouts, %lu no name)",
		      (long long)((ts_now_ns() - t0) / 1000000), (unsigned long)st.sniff_timeouts,
		      (unsigned long)st.sniff_no_name);
	cr_assert_eq(st.sniff_timeouts, 1);
	cr_assert_eq(st.sniff_quic, 0);
	cr_assert_eq(st.up_queued, 0);
	env_fini(&e);
}

Test(udp_sniff, other_datagrams_to_443_are_not_looked_at)
{
	struct env e;

	env_start(&e, 300, 76);
	send_to_443(&e, 5004, (const uint8_t *)"plain udp", 9);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 1, 2000));
	cr_assert_eq(stats(&e).sniff_started, 0);
	env_fini(&e);
}

Test(udp_sniff, freeing_the_path_while_datagrams_wait_gives_everything_back)
{
	struct env e;
	uint8_t msg[256], p1[1500];
	size_t n1;

	env_start(&e, 5000, 77);
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg,
			     tu_client_hello(msg, "www.example.test", false) / 2);
	send_to_443(&e, 5005, p1, n1);
	send_to_443(&e, 5006, p1, n1);
	ut_pump_for(e.base, 20);
	cr_assert_eq(stats(&e).up_queued, 2);
	env_fini(&e); /* asserts no session, fd or buffer byte left */
}

Test(udp_sniff, a_second_flow_leaves_the_first_flows_name_alone)
{
	struct env e;
	uint8_t msg[256], pkt[1500];
	size_t n;

	env_start(&e, 300, 78);
	n = ut_quic_initial(pkt, sizeof(pkt), 0, 0, msg, tu_client_hello(msg, "www.example.test", false));
	send_to_443(&e, 5007, pkt, n);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 1, 2000));
	/* Another destination from the same source: by address, no second look. */
	ut_tun_send(e.up, "10.0.0.9", 5007, "127.0.0.79", 443, pkt, n);
	send_to_443(&e, 5007, (const uint8_t *)"\x40short-header", 13);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 2, 2000));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sniff_started, 1, "one look per session");
	cr_assert_eq(st.sniff_quic, 1);
	cr_assert_eq(st.sniff_active, 0);
	env_fini(&e);
}

static void no_release(void *arg, const struct ts_config *old)
{
	(void)arg;
	(void)old;
}

/* A reload that turns sniffing off leaves a running look alone: the flow's next datagram
 * still goes after the one held, and the session keeps its configuration. */
Test(udp_sniff, a_reload_keeps_a_running_look_and_the_order)
{
	struct env e;
	struct ts_config off;
	char err[TS_ERRLEN];
	uint8_t msg[256], p1[1500];
	size_t n1;

	env_start(&e, 2000, 80);
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg,
			     tu_client_hello(msg, "www.example.test", false) / 2);
	send_to_443(&e, 5008, p1, n1);
	ut_pump_for(e.base, 20);
	cr_assert_eq(stats(&e).up_queued, 1);
	cr_assert_eq(config_load_string("{}", &off, err, sizeof(err)), 0, "%s", err);
	udp_path_set_config(e.up, &off, no_release, NULL);
	send_to_443(&e, 5008, (const uint8_t *)"\x40short-header", 13);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 2, 3000), "got %d", e.got);
	cr_assert_eq(e.got_len[0], n1, "the held Initial went first");
	cr_assert_eq(e.got_len[1], 13);
	env_fini(&e);
	config_fini(&off);
}

/* ---- looks that could not start ---- */

/* Each allocation the first half of a hello makes, refused in turn. Where the look could not
 * start, the half goes by address and the skip is counted; the flow's second half then goes
 * at once: a look that started there could never see the hello's start, and would only hold
 * datagrams until the timeout. */
Test(udp_sniff, a_look_without_memory_is_counted_and_its_flow_not_looked_at_again)
{
	struct env e;
	uint8_t msg[256], p1[1500], p2[1500];
	size_t len = tu_client_hello(msg, "www.example.test", false), half = len / 2, n1, n2;
	int skipped = 0;
	bool fired = true;

	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg, half);
	n2 = ut_quic_initial(p2, sizeof(p2), 1, half, msg + half, len - half);
	for (long n = 1; fired; n++) {
		struct udp_path_stats st;
		uint64_t drops;
		bool looked;
		int got;

		env_start(&e, 2000, 82);
		failalloc_arm(n);
		send_to_443(&e, 5009, p1, n1);
		fired = failalloc_fired();
		failalloc_arm(0);
		ut_pump_for(e.base, 5);
		st = stats(&e);
		looked = st.sniff_started == 1;
		if (!looked && UT_PUMP_UNTIL(e.base, e.got == 1, 500)) {
			skipped++;
			cr_assert_eq(stats(&e).sniff_skipped_no_memory, 1,
				     "allocation %ld refused: by address, not counted", n);
		}
		drops = ut_drops_total(e.up);
		got = e.got;
		send_to_443(&e, 5009, p2, n2);
		cr_assert(UT_PUMP_UNTIL(e.base, e.got > got || ut_drops_total(e.up) > drops, 500),
			  "allocation %ld refused: the second half was held (%d sent, %lu looks)", n,
			  e.got, (unsigned long)stats(&e).sniff_started);
		st = stats(&e);
		cr_assert_eq(st.sniff_started, looked ? 1 : 0, "allocation %ld refused", n);
		cr_assert_eq(st.sniff_timeouts, 0, "allocation %ld refused", n);
		cr_assert_eq(st.up_queued, 0, "allocation %ld refused", n);
		env_fini(&e);
	}
	cr_assert_gt(skipped, 0, "no allocation of the look was refused");
}

/* A session looks at one flow at a time: an Initial of another flow from the same port goes
 * by address meanwhile, and that flow is not looked at once the first look has ended (its
 * next Initial carries the rest of a hello whose start already went). */
Test(udp_sniff, a_flow_passed_by_during_a_look_is_not_looked_at_after_it)
{
	struct env e;
	uint8_t msg[256], p1[1500], p2[1500];
	size_t len = tu_client_hello(msg, "www.example.test", false), half = len / 2, n1, n2;

	env_start(&e, 100, 83);
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg, half);
	n2 = ut_quic_initial(p2, sizeof(p2), 1, half, msg + half, len - half);
	/* Flow A (no server there) is looked at; flow B, to the test's server, passes by. */
	ut_tun_send(e.up, "10.0.0.9", 5010, "127.0.0.85", 443, p1, n1);
	cr_assert_eq(stats(&e).up_queued, 1, "A's first half waits");
	send_to_443(&e, 5010, p1, n1);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 1, 2000), "B's first half goes by address");
	cr_assert_eq(stats(&e).sniff_skipped_other_flow, 1);
	cr_assert(UT_PUMP_UNTIL(e.base, stats(&e).sniff_timeouts == 1, 2000), "A's look ends");
	send_to_443(&e, 5010, p2, n2);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 2, 2000));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sniff_started, 1, "B was looked at in the middle of its hello");
	cr_assert_eq(st.sniff_timeouts, 1);
	cr_assert_eq(st.up_queued, 0);
	env_fini(&e);
}

/* UDP_SNIFF_LOOKS looks at once (256): the next flow goes by address, counted, and is not
 * looked at later either, when a look has ended. */
Test(udp_sniff, a_flow_beyond_the_looks_at_once_is_counted_and_not_looked_at_later)
{
	struct env e;
	uint8_t msg[256], p1[1500], p2[1500];
	size_t len = tu_client_hello(msg, "www.example.test", false), half = len / 2, n1, n2;

	env_start(&e, 5000, 84); /* no look ends by itself within the test */
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg, half);
	n2 = ut_quic_initial(p2, sizeof(p2), 1, half, msg + half, len - half);
	for (uint16_t i = 0; i < 256; i++)
		send_to_443(&e, (uint16_t)(6000 + i), p1, n1);
	cr_assert_eq(stats(&e).sniff_active, 256);
	send_to_443(&e, 6256, p1, n1);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 1, 2000), "the 257th goes by address");
	cr_assert_eq(stats(&e).sniff_skipped_busy, 1);
	/* One look ends (its hello completes): room for a look again. */
	send_to_443(&e, 6000, p2, n2);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 3, 2000));
	cr_assert_eq(stats(&e).sniff_active, 255);
	send_to_443(&e, 6256, p2, n2);
	cr_assert(UT_PUMP_UNTIL(e.base, e.got == 4, 1000), "the 257th flow's second half was held");
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sniff_started, 256);
	cr_assert_eq(st.sniff_active, 255);
	cr_assert_eq(st.sniff_skipped_busy, 1, "counted once, when the flow went by");
	env_fini(&e);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* Send p into the path and pump until the server got a datagram more or a drop more was
 * counted, or (held: a look holds it) until it waits in the session's queue. */
static void nomem_send(struct env *e, uint16_t sport, const uint8_t *p, size_t n, bool held,
		       const char *what)
{
	uint64_t drops = ut_drops_total(e->up), queued = stats(e).up_queued;
	int got = e->got;

	send_to_443(e, sport, p, n);
	cr_assert(UT_PUMP_UNTIL(e->base, e->got > got || ut_drops_total(e->up) > drops ||
				(held && stats(e).up_queued > queued), 2000),
		  "%s: neither sent, held nor counted as a drop", what);
}

/* The path's life with QUIC sniffing: a blocked name in one Initial (dropped as the reject
 * rule says), a name over two Initials (the first held until the second decides, then both
 * sent in order), and a first half held when the path is freed. Each datagram reaches the
 * server, waits, or is counted as a drop; every session, descriptor and buffer byte comes
 * back at the free. A look that found no memory lets its datagram go by address, counted, and
 * the flow's next Initial goes at once: no look in this scenario waits out its timeout. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct env *e = arg;
	uint8_t msg[256], blk[1500], p1[1500], p2[1500];
	size_t len = tu_client_hello(msg, "www.example.test", false), half = len / 2;
	size_t nb, n1, n2;
	char json[512], err[TS_ERRLEN];
	int ret;

	e->got = 0;
	e->b = NULL;
	e->up = NULL;
	config_init(&e->cfg);
	snprintf(json, sizeof(json),
		 "{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"},"
		 "{\"tag\":\"block\",\"type\":\"reject\"}],"
		 "\"route\":{\"sniff\":{\"timeout_ms\":300},"
		 "\"rules\":[{\"domain_suffix\":[\"blocked.test\"],\"outbound\":\"block\"}],"
		 "\"final\":\"direct\"}}");
	if ((ret = config_load_string(json, &e->cfg, err, sizeof(err))) != 0) {
		cr_assert(sweep && ret == -ENOMEM, "%s", err);
		goto out;
	}
	if ((ret = budget_new(&e->cfg.budget, &e->b)) != 0) {
		cr_assert(sweep && ret == -ENOMEM);
		goto out;
	}
	if ((ret = udp_path_new(e->base, &e->cfg, e->b, no_tx, e, &e->up)) != 0) {
		cr_assert(sweep && (ret == -ENOMEM || ret == -ENOBUFS), "udp_path_new: %d", ret);
		goto out;
	}
	ret = udp_path_set_uptrains(e->up, true);
	cr_assert(ret == 0 || (sweep && (ret == -ENOMEM || ret == -ENOBUFS)), "uptrains %d", ret);
	nb = ut_quic_initial(blk, sizeof(blk), 0, 0, msg,
			     tu_client_hello(msg, "video.blocked.test", false));
	nomem_send(e, 5000, blk, nb, false, "the blocked Initial");
	if (!sweep)
		cr_assert(e->got == 0 && stats(e).drops[UDP_DROP_rejected] == 1);
	len = tu_client_hello(msg, "www.example.test", false);
	n1 = ut_quic_initial(p1, sizeof(p1), 0, 0, msg, half);
	n2 = ut_quic_initial(p2, sizeof(p2), 1, half, msg + half, len - half);
	nomem_send(e, 5001, p1, n1, true, "the first half");
	nomem_send(e, 5001, p2, n2, false, "the second half");
	if (!sweep) {
		cr_assert(UT_PUMP_UNTIL(e->base, e->got == 2, 2000));
		cr_assert_eq(e->got_len[0], n1, "the held half went first");
		cr_assert_eq(stats(e).sniff_quic, 2, "both names found");
	}
	cr_assert_eq(stats(e).sniff_timeouts, 0, "a look held datagrams until its timeout");
	nomem_send(e, 5002, p1, n1, true, "a half held at the free");
	ut_path_free_checked(e->up, e->b);
out:
	budget_free(e->b);
	config_fini(&e->cfg);
}

Test(udp_sniff, each_allocation_refused_in_turn)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(443) };
	struct env e;

	memset(&e, 0, sizeof(e));
	snprintf(e.server, sizeof(e.server), "127.0.0.81");
	cr_assert_not_null(e.base = event_base_new());
	e.srv = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(e.srv, 0);
	inet_pton(AF_INET, e.server, &sin.sin_addr);
	cr_assert_eq(bind(e.srv, (struct sockaddr *)&sin, sizeof(sin)), 0, "bind: %s",
		     strerror(errno));
	e.srv_ev = event_new(e.base, e.srv, EV_READ | EV_PERSIST, srv_cb, &e);
	cr_assert_eq(event_add(e.srv_ev, NULL), 0);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &e, 10,
								      2000));
	event_free(e.srv_ev);
	close(e.srv);
	event_base_free(e.base);
}
