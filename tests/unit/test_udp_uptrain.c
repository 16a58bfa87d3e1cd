/* test_udp_uptrain.c — datagrams out in trains (udp_path_set_uptrains, udp_path_batch_end):
 * the datagrams one batch from the TUN carries to one destination through one socket leave in
 * one UDP GSO send, and what a real server socket on loopback receives is every datagram,
 * intact and in order, as one sendto each would have delivered it. The path's send seams
 * record each send (its size and GSO segment size) and pass it on to the real one
 * (udp_sendto_os), or answer with an error to drive the fallbacks.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "dispatch/udp.h"
#include "testutil.h"
#include "udptest.h"

#define MAX_SENDS 512
#define MAX_RECV 512

/* One send the path made through the seam. */
struct send_rec {
	size_t len;
	uint16_t seg;           /* 0: one datagram */
};

struct env {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *b;
	struct udp_path *up;
	struct send_rec sends[MAX_SENDS];
	int nsends;
	int gso_err;            /* the next GSO send's answer (-errno), 0: the real send */
	bool gso_err_sticky;    /* every GSO send answers gso_err */
	int eagain;             /* the next so many sends answer -EAGAIN */
};

static ssize_t seam_gso(void *arg, int fd, const void *buf, size_t len,
			const struct sockaddr *to, socklen_t tolen, uint16_t seg)
{
	struct env *e = arg;

	cr_assert_lt(e->nsends, MAX_SENDS);
	e->sends[e->nsends++] = (struct send_rec){ .len = len, .seg = seg };
	if (seg && e->gso_err) {
		int r = e->gso_err;
		if (!e->gso_err_sticky)
			e->gso_err = 0;
		return r;
	}
	if (e->eagain > 0) {
		e->eagain--;
		return -EAGAIN;
	}
	return udp_sendto_os(fd, buf, len, to, tolen, seg);
}

static ssize_t seam(void *arg, int fd, const void *buf, size_t len, const struct sockaddr *to,
		    socklen_t tolen)
{
	return seam_gso(arg, fd, buf, len, to, tolen, 0);
}

static int no_tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	(void)pkt;
	(void)len;
	return 0;
}

static void env_start_cfg(struct env *e, const char *json, bool uptrains)
{
	char err[TS_ERRLEN];

	memset(e, 0, sizeof(*e));
	e->base = event_base_new();
	cr_assert_not_null(e->base);
	cr_assert_eq(config_load_string(json, &e->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&e->cfg.budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, &e->cfg, e->b, no_tx, e, &e->up), 0);
	udp_path_set_sendto(e->up, seam, e);
	udp_path_set_sendgso(e->up, seam_gso, e);
	if (uptrains)
		cr_assert_eq(udp_path_set_uptrains(e->up, true), 0);
}

static void env_start(struct env *e)
{
	env_start_cfg(e, "{}", true);
}

static void env_fini(struct env *e)
{
	ut_env_free(e->up, e->b, &e->cfg, e->base);
}

static struct udp_path_stats stats(struct env *e)
{
	return ut_stats(e->up);
}

/* The uplink counters after a test's batches: trains sent, the datagrams in them, and every
 * datagram sent (in trains or not). */
static void expect_up(struct env *e, uint64_t trains, uint64_t train_datagrams,
		      uint64_t datagrams)
{
	struct udp_path_stats st = stats(e);

	cr_assert_eq(st.up_trains, trains);
	cr_assert_eq(st.up_train_datagrams, train_datagrams);
	cr_assert_eq(st.up_datagrams, datagrams);
}

/* A server on 127.0.0.1 that keeps every datagram it receives. */
struct rdgram {
	uint8_t p[2048];
	size_t len;
};

struct server {
	int fd;
	uint16_t port;
	struct rdgram got[MAX_RECV];
	int ngot;
};

static void server_open(struct server *s)
{
	struct sockaddr_storage ss;
	socklen_t len = tu_sockaddr(&ss, "127.0.0.1", 0);

	memset(s, 0, sizeof(*s));
	s->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->fd, 0);
	cr_assert_eq(bind(s->fd, (struct sockaddr *)&ss, len), 0);
	cr_assert_eq(getsockname(s->fd, (struct sockaddr *)&ss, &len), 0);
	s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* Take what has arrived; true when the server holds want datagrams. */
static bool server_has(struct server *s, int want)
{
	for (;;) {
		cr_assert_lt(s->ngot, MAX_RECV);
		ssize_t n = recv(s->fd, s->got[s->ngot].p, sizeof(s->got[0].p), 0);
		if (n < 0)
			break;
		s->got[s->ngot++].len = (size_t)n;
	}
	return s->ngot >= want;
}

/* Datagram i: len bytes of a pattern that depends on i. */
static void pattern(uint8_t *p, size_t len, int i)
{
	tu_fill_pattern(p, len, 7000u + (uint32_t)i);
}

/* Datagram i of len bytes from the client sport to the server, one of a batch. */
static void tun_dgram(struct env *e, uint16_t sport, struct server *s, int i, size_t len)
{
	uint8_t p[2048];

	pattern(p, len, i);
	ut_tun_input(e->up, "10.0.0.9", sport, "127.0.0.1", s->port, p, len);
}

/* Wait (turning the loop: queued datagrams go out on write events) until the server holds
 * want datagrams, then check the k-th is datagram ids[k] of sizes[k] bytes, and that no more
 * come. */
static void expect_recv(struct env *e, struct server *s, int want, const int *ids,
			const size_t *sizes)
{
	uint8_t p[2048];

	cr_assert(UT_PUMP_UNTIL(e->base, server_has(s, want), 2000), "%d of %d arrived", s->ngot,
		  want);
	ut_pump_for(e->base, 20);
	server_has(s, want);
	cr_assert_eq(s->ngot, want, "%d arrived, want %d", s->ngot, want);
	for (int k = 0; k < want; k++) {
		pattern(p, sizes[k], ids[k]);
		cr_assert_eq(s->got[k].len, sizes[k], "datagram %d: %zu bytes, want %zu", k,
			     s->got[k].len, sizes[k]);
		cr_assert_arr_eq(s->got[k].p, p, sizes[k], "datagram %d is not datagram %d", k,
				 ids[k]);
	}
}

/* ids 0 .. n-1, all of one size. */
static void expect_seq(struct env *e, struct server *s, int n, size_t len)
{
	int ids[MAX_RECV];
	size_t sizes[MAX_RECV];

	for (int i = 0; i < n; i++) {
		ids[i] = i;
		sizes[i] = len;
	}
	expect_recv(e, s, n, ids, sizes);
}

static void expect_send(struct env *e, int k, size_t len, uint16_t seg)
{
	cr_assert_lt(k, e->nsends, "only %d sends", e->nsends);
	cr_assert_eq(e->sends[k].len, len, "send %d: %zu bytes, want %zu", k, e->sends[k].len,
		     len);
	cr_assert_eq(e->sends[k].seg, seg, "send %d: segment size %u, want %u", k,
		     e->sends[k].seg, seg);
}

/* (1) A batch of 20 equal datagrams to one destination: held until the batch ends, then one
 * UDP GSO send; the real kernel cuts it and the server receives the 20, intact and in
 * order. */
Test(udp_uptrain, a_batch_to_one_destination_goes_in_one_send)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	env_start(&e);
	server_open(&s);
	for (int i = 0; i < 20; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	cr_assert_eq(e.nsends, 0, "sent before the batch ended");
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 1);
	expect_send(&e, 0, 2000, 100);
	expect_seq(&e, &s, 20, 100);
	st = stats(&e);
	expect_up(&e, 1, 20, 20);
	cr_assert_eq(st.up_bytes, 2000);
	cr_assert_eq(st.up_train_errors, 0);
	close(s.fd);
	env_fini(&e);
}

/* A quiet proxy gives back the train buffer's pages with the other I/O buffers; the next
 * batch faults them in again and its train arrives intact, after the first. */
Test(udp_uptrain, a_quiet_path_gives_back_the_train_buffer)
{
	struct env e;
	struct server s;
	size_t with, without;

	env_start(&e);
	server_open(&s);
	for (int i = 0; i < 20; i++)
		tun_dgram(&e, 5353, &s, i, 1000);
	udp_path_batch_end(e.up);
	with = udp_path_release_idle(e.up);
	for (int i = 20; i < 40; i++)
		tun_dgram(&e, 5353, &s, i, 1000);
	udp_path_batch_end(e.up);
	expect_seq(&e, &s, 40, 1000);
	cr_assert_eq(stats(&e).up_trains, 2);
	cr_assert_eq(stats(&e).up_train_datagrams, 40);
	/* The same without trains: the difference is the train buffer, at least 48 KiB of
	 * whole pages (a train of 1472-byte segments up to a datagram's 64 KiB). */
	cr_assert_eq(udp_path_set_uptrains(e.up, false), 0);
	without = udp_path_release_idle(e.up);
	cr_assert_geq(with, without + 48 * 1024, "released %zu with trains, %zu without", with,
		      without);
	close(s.fd);
	env_fini(&e);
}

/* (2) Only a train's last datagram may be shorter: 100, 100, 100, 40, 100 is a train of four
 * (the 40 ends it) and one alone, in that order. */
Test(udp_uptrain, a_shorter_datagram_ends_its_train)
{
	struct env e;
	struct server s;
	int ids[] = { 0, 1, 2, 3, 4 };
	size_t sizes[] = { 100, 100, 100, 40, 100 };
	struct udp_path_stats st;

	env_start(&e);
	server_open(&s);
	for (int i = 0; i < 5; i++)
		tun_dgram(&e, 5353, &s, i, sizes[i]);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 2);
	expect_send(&e, 0, 340, 100);
	expect_send(&e, 1, 100, 0);
	expect_recv(&e, &s, 5, ids, sizes);
	st = stats(&e);
	expect_up(&e, 1, 4, 5);
	cr_assert_eq(st.up_bytes, 440);
	close(s.fd);
	env_fini(&e);
}

/* (3) Two sessions (two sockets) to two servers: interleaved, each datagram ends the other's
 * train (one at a time), every server gets its own in order; in runs, a train per run. */
Test(udp_uptrain, interleaved_sessions_keep_each_sockets_order)
{
	struct env e;
	struct server a, b;
	int ids[40];
	size_t sizes[40];
	struct udp_path_stats st;

	env_start(&e);
	server_open(&a);
	server_open(&b);
	for (int i = 0; i < 10; i++) {
		tun_dgram(&e, 5353, &a, i, 100);
		tun_dgram(&e, 5354, &b, 100 + i, 100);
	}
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 20);
	for (int k = 0; k < 20; k++)
		expect_send(&e, k, 100, 0);
	st = stats(&e);
	cr_assert_eq(st.up_trains, 0);
	/* Runs: 5 to a, 5 to b, 5 to a (after the first 10 of each): three trains. */
	for (int i = 10; i < 15; i++)
		tun_dgram(&e, 5353, &a, i, 100);
	for (int i = 10; i < 15; i++)
		tun_dgram(&e, 5354, &b, 100 + i, 100);
	for (int i = 15; i < 20; i++)
		tun_dgram(&e, 5353, &a, i, 100);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 23);
	for (int k = 20; k < 23; k++)
		expect_send(&e, k, 500, 100);
	expect_seq(&e, &a, 20, 100);
	for (int i = 0; i < 15; i++) {
		ids[i] = 100 + i;
		sizes[i] = 100;
	}
	expect_recv(&e, &b, 15, ids, sizes);
	expect_up(&e, 3, 15, 35);
	close(a.fd);
	close(b.fd);
	env_fini(&e);
}

/* (3b) One session, one socket, two destinations in turn: each datagram ends the train to the
 * other; each destination gets its own in order. */
Test(udp_uptrain, one_socket_two_destinations_in_turn)
{
	struct env e;
	struct server a, b;
	int ids[10];
	size_t sizes[10];

	env_start(&e);
	server_open(&a);
	server_open(&b);
	for (int i = 0; i < 10; i++) {
		tun_dgram(&e, 5353, &a, i, 100);
		tun_dgram(&e, 5353, &b, 100 + i, 100);
	}
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 20);
	cr_assert_eq(stats(&e).sockets, 1);
	expect_seq(&e, &a, 10, 100);
	for (int i = 0; i < 10; i++) {
		ids[i] = 100 + i;
		sizes[i] = 100;
	}
	expect_recv(&e, &b, 10, ids, sizes);
	close(a.fd);
	close(b.fd);
	env_fini(&e);
}

/* A hijacked DNS query in the middle of a batch goes alone, through its own socket, and cuts
 * the train around it in two. */
Test(udp_uptrain, a_dns_query_goes_alone_between_trains)
{
	struct env e;
	struct server s, dns;
	char json[128];
	uint8_t q[40], got[64];
	struct udp_path_stats st;

	server_open(&dns);
	snprintf(json, sizeof(json), "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}",
		 dns.port);
	env_start_cfg(&e, json, true);
	server_open(&s);
	memset(q, 0, sizeof(q));
	q[0] = 0x12;
	q[1] = 0x34;
	for (int i = 0; i < 3; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	ut_tun_input(e.up, "10.0.0.9", 5353, "192.0.2.53", 53, q, sizeof(q));
	for (int i = 3; i < 6; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 3);
	expect_send(&e, 0, 300, 100);
	expect_send(&e, 1, sizeof(q), 0);
	expect_send(&e, 2, 300, 100);
	expect_seq(&e, &s, 6, 100);
	cr_assert_eq(recv(dns.fd, got, sizeof(got), 0), (ssize_t)sizeof(q), "the query");
	cr_assert_eq(got[0], 0x12);
	st = stats(&e);
	cr_assert_eq(st.dns_queries, 1);
	cr_assert_eq(st.up_trains, 2);
	cr_assert_eq(st.up_datagrams, 7);
	close(s.fd);
	close(dns.fd);
	env_fini(&e);
}

/* (4) A datagram larger than the train's segment size starts the next train. */
Test(udp_uptrain, a_larger_datagram_starts_a_new_train)
{
	struct env e;
	struct server s;
	int ids[] = { 0, 1, 2, 3, 4 };
	size_t sizes[] = { 100, 100, 200, 200, 200 };

	env_start(&e);
	server_open(&s);
	for (int i = 0; i < 5; i++)
		tun_dgram(&e, 5353, &s, i, sizes[i]);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 2);
	expect_send(&e, 0, 200, 100);
	expect_send(&e, 1, 600, 200);
	expect_recv(&e, &s, 5, ids, sizes);
	cr_assert_eq(stats(&e).up_trains, 2);
	cr_assert_eq(stats(&e).up_train_datagrams, 5);
	close(s.fd);
	env_fini(&e);
}

/* (5) Nothing is held past the batch end: a lone datagram is one plain send then, and a
 * batch end with nothing held sends nothing. A path freed with a train held sends it first. */
Test(udp_uptrain, nothing_is_held_past_the_batch_end)
{
	struct env e;
	struct server s;

	env_start(&e);
	server_open(&s);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 0);
	tun_dgram(&e, 5353, &s, 0, 100);
	cr_assert_eq(e.nsends, 0);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 1);
	expect_send(&e, 0, 100, 0);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 1, "sent twice");
	expect_seq(&e, &s, 1, 100);
	cr_assert_eq(stats(&e).up_trains, 0, "a train of one is a plain send");
	cr_assert_eq(stats(&e).up_datagrams, 1);

	for (int i = 1; i < 4; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	env_fini(&e);
	cr_assert(server_has(&s, 4), "the held train was lost with the path: %d of 4", s.ngot);
	close(s.fd);
}

/* At most UDP_CODEC_TRAIN_MAX (64) datagrams, and no more payload than one UDP datagram can
 * carry (65,507 bytes over IPv4), in one train. */
Test(udp_uptrain, trains_are_cut_at_the_limits)
{
	struct env e;
	struct server s;
	int ids[100];
	size_t sizes[100];

	env_start(&e);
	server_open(&s);
	for (int i = 0; i < 70; i++)
		tun_dgram(&e, 5353, &s, i, 10);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 2);
	expect_send(&e, 0, 640, 10);
	expect_send(&e, 1, 60, 10);
	expect_seq(&e, &s, 70, 10);

	/* 50 of 1,400 bytes: 46 fit (64,400), the 47th would pass 65,507. */
	s.ngot = 0;
	e.nsends = 0;
	for (int i = 0; i < 50; i++)
		tun_dgram(&e, 5353, &s, i, 1400);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 2);
	expect_send(&e, 0, 46 * 1400, 1400);
	expect_send(&e, 1, 4 * 1400, 1400);
	for (int i = 0; i < 50; i++) {
		ids[i] = i;
		sizes[i] = 1400;
	}
	expect_recv(&e, &s, 50, ids, sizes);
	cr_assert_eq(stats(&e).up_trains, 4);
	cr_assert_eq(stats(&e).up_train_datagrams, 120);
	close(s.fd);
	env_fini(&e);
}

/* (6) EAGAIN on a train: its datagrams wait in the socket's queue in order, a later batch's
 * wait behind them (no train past a queue), and the write event sends them all, in order,
 * none lost. */
Test(udp_uptrain, eagain_queues_the_train_in_order)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	env_start(&e);
	server_open(&s);
	e.eagain = 1;
	for (int i = 0; i < 10; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	expect_send(&e, 0, 1000, 100);
	cr_assert_eq(stats(&e).up_queued, 10);
	for (int i = 10; i < 15; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 1, "a train went past the queue");
	cr_assert_eq(stats(&e).up_queued, 15);
	expect_seq(&e, &s, 15, 100);
	for (int k = 1; k < e.nsends; k++)
		expect_send(&e, k, 100, 0);
	st = stats(&e);
	cr_assert_eq(st.up_queued, 0);
	cr_assert_eq(st.up_datagrams, 15);
	cr_assert_eq(st.up_trains, 0);
	cr_assert_eq(st.up_train_errors, 0);
	cr_assert_eq(st.drops[UDP_DROP_queue_full] + st.drops[UDP_DROP_send_error], 0);
	/* The queue emptied: trains again. */
	e.nsends = 0;
	s.ngot = 0;
	for (int i = 0; i < 3; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	expect_send(&e, 0, 300, 100);
	expect_seq(&e, &s, 3, 100);
	close(s.fd);
	env_fini(&e);
}

/* EAGAIN with the session's queue nearly full: what does not fit is dropped and counted
 * (queue_full), as the same datagrams sent one by one would be. */
Test(udp_uptrain, eagain_respects_the_queue_limit)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	env_start_cfg(&e, "{\"budgets\":{\"udp_up_queue\":4}}", true);
	server_open(&s);
	e.eagain = 1;
	for (int i = 0; i < 10; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	st = stats(&e);
	cr_assert_eq(st.up_queued, 4);
	cr_assert_eq(st.drops[UDP_DROP_queue_full], 6);
	expect_seq(&e, &s, 4, 100);
	close(s.fd);
	env_fini(&e);
}

/* (7) The kernel refuses UDP GSO (-EINVAL: no support on this route or device): trains off
 * for the path, counted once, and the train's datagrams and every later one go one by one,
 * all delivered in order. -EOPNOTSUPP and -EIO the same. */
static void refused(int err)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	env_start(&e);
	server_open(&s);
	e.gso_err = err;
	e.gso_err_sticky = true;
	for (int i = 0; i < 10; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 11);
	expect_send(&e, 0, 1000, 100);
	for (int k = 1; k < 11; k++)
		expect_send(&e, k, 100, 0);
	for (int i = 10; i < 20; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 21, "trains still tried");
	for (int k = 11; k < 21; k++)
		expect_send(&e, k, 100, 0);
	expect_seq(&e, &s, 20, 100);
	st = stats(&e);
	cr_assert_eq(st.up_train_errors, 1);
	cr_assert_eq(st.up_trains, 0);
	cr_assert_eq(st.up_datagrams, 20);
	cr_assert_eq(st.drops[UDP_DROP_send_error], 0);
	close(s.fd);
	env_fini(&e);
}

Test(udp_uptrain, einval_turns_trains_off)
{
	refused(-EINVAL);
}

Test(udp_uptrain, eopnotsupp_turns_trains_off)
{
	refused(-EOPNOTSUPP);
}

Test(udp_uptrain, eio_turns_trains_off)
{
	refused(-EIO);
}

/* EMSGSIZE: the segment is larger than the route's MTU allows a GSO segment to be. That
 * train goes one by one (the kernel fragments each, as a plain send would) and the socket no
 * longer trains datagrams that large; smaller ones still go in trains. */
Test(udp_uptrain, emsgsize_stops_trains_of_that_size_on_the_socket)
{
	struct env e;
	struct server s;
	int ids[30];
	size_t sizes[30];

	env_start(&e);
	server_open(&s);
	e.gso_err = -EMSGSIZE;
	for (int i = 0; i < 10; i++)
		tun_dgram(&e, 5353, &s, i, 1000);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 11);
	for (int i = 10; i < 20; i++)
		tun_dgram(&e, 5353, &s, i, 1000);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 21, "a train of 1000 tried again");
	for (int i = 20; i < 30; i++)
		tun_dgram(&e, 5353, &s, i, 999);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 22);
	expect_send(&e, 21, 9990, 999);
	for (int i = 0; i < 30; i++) {
		ids[i] = i;
		sizes[i] = i < 20 ? 1000 : 999;
	}
	expect_recv(&e, &s, 30, ids, sizes);
	cr_assert_eq(stats(&e).up_train_errors, 1);
	cr_assert_eq(stats(&e).up_trains, 1);
	close(s.fd);
	env_fini(&e);
}

/* Any other error (here the route is gone): the train's datagrams are dropped as as many
 * plain sends would be (send_error, one each), and trains stay on. */
Test(udp_uptrain, another_error_drops_the_train_as_send_errors)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	env_start(&e);
	server_open(&s);
	e.gso_err = -ENETUNREACH;
	for (int i = 0; i < 10; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	cr_assert_eq(e.nsends, 1);
	st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_send_error], 10);
	cr_assert_eq(st.up_datagrams, 0);
	cr_assert_eq(st.up_train_errors, 0);
	for (int i = 0; i < 5; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	udp_path_batch_end(e.up);
	expect_send(&e, 1, 500, 100);
	expect_seq(&e, &s, 5, 100);
	cr_assert_eq(stats(&e).up_trains, 1);
	close(s.fd);
	env_fini(&e);
}

/* Off (the default, and after udp_path_set_uptrains(false)): every datagram is its own send
 * at once, as before; the buffer is given back to the budget. */
Test(udp_uptrain, off_every_datagram_at_once)
{
	struct env e;
	struct server s;
	uint64_t idle;

	env_start_cfg(&e, "{}", false);
	server_open(&s);
	tun_dgram(&e, 5353, &s, 0, 100);
	cr_assert_eq(e.nsends, 1, "held without trains");
	idle = ut_buffer_bytes(e.b);
	cr_assert_eq(udp_path_set_uptrains(e.up, true), 0);
	cr_assert_gt(ut_buffer_bytes(e.b), idle, "the train's buffer is not charged");
	cr_assert_eq(udp_path_set_uptrains(e.up, false), 0);
	cr_assert_eq(ut_buffer_bytes(e.b), idle, "the train's buffer was kept");
	for (int i = 1; i < 5; i++) {
		tun_dgram(&e, 5353, &s, i, 100);
		cr_assert_eq(e.nsends, i + 1);
	}
	expect_seq(&e, &s, 5, 100);
	cr_assert_eq(stats(&e).up_trains, 0);
	close(s.fd);
	env_fini(&e);
}

/* No budget for the train's buffer: -ENOBUFS, trains stay off and the path works as before. */
Test(udp_uptrain, no_budget_no_trains)
{
	struct env e;
	struct server s;
	char json[128];
	uint64_t idle;

	env_start_cfg(&e, "{}", false);
	idle = ut_buffer_bytes(e.b);
	env_fini(&e);
	snprintf(json, sizeof(json), "{\"budgets\":{\"buffer_bytes\":%llu}}",
		 (unsigned long long)idle + 1000);
	env_start_cfg(&e, json, false);
	cr_assert_eq(udp_path_set_uptrains(e.up, true), -ENOBUFS);
	cr_assert_eq(ut_buffer_bytes(e.b), idle);
	server_open(&s);
	for (int i = 0; i < 3; i++)
		tun_dgram(&e, 5353, &s, i, 100);
	cr_assert_eq(e.nsends, 3);
	udp_path_batch_end(e.up);
	expect_seq(&e, &s, 3, 100);
	close(s.fd);
	env_fini(&e);
}

/* The real kernel, no seam: a UDP GSO send over IPv6 loopback too. */
Test(udp_uptrain, real_gso_send_v6)
{
	struct env e;
	struct sockaddr_storage ss;
	socklen_t len = tu_sockaddr(&ss, "::1", 0);
	int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	uint8_t p[2048], got[2048];
	uint16_t port;
	int n = 0;

	cr_assert_geq(fd, 0);
	if (bind(fd, (struct sockaddr *)&ss, len) != 0)
		cr_skip_test("no IPv6 loopback");
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	env_start(&e);
	udp_path_set_sendto(e.up, NULL, NULL);
	udp_path_set_sendgso(e.up, NULL, NULL);
	for (int i = 0; i < 12; i++) {
		pattern(p, i < 11 ? 700 : 33, i);
		ut_tun_input(e.up, "fd00::9", 4000, "::1", port, p, i < 11 ? 700 : 33);
	}
	udp_path_batch_end(e.up);
	cr_assert_eq(stats(&e).up_trains, 1);
	cr_assert_eq(stats(&e).up_train_datagrams, 12);
	for (int i = 0; i < 12; i++) {
		ssize_t r;
		cr_assert(UT_PUMP_UNTIL(e.base, (r = recv(fd, got, sizeof(got), 0)) >= 0, 2000),
			  "%d of 12 arrived", n);
		pattern(p, i < 11 ? 700 : 33, i);
		cr_assert_eq(r, i < 11 ? 700 : 33, "datagram %d: %zd bytes", i, r);
		cr_assert_arr_eq(got, p, (size_t)r, "datagram %d", i);
		n++;
	}
	close(fd);
	env_fini(&e);
}
