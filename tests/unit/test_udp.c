/* test_udp.c — dispatch/udp: the shared UDP path end to end over loopback (127.0.0.1 and ::1
 * only). Real UDP servers (an echo server, a fake DNS responder) run as sockets on the test's
 * libevent base; a fake tx captures the reply packets the path would write to the TUN, and each
 * is checked with testutil's independent verifiers. EAGAIN is made deterministic through the
 * path's sendto seam (loopback orphans every skb at once, so a tiny SO_SNDBUF never fills) and
 * through the fake tx's return value.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/evmem.h"
#include "core/loopguard.h"
#include "core/pkt.h"
#include "dispatch/udp.h"
#include "dispatch/udp_int.h"
#include "failalloc.h"
#include "testutil.h"
#include "udptest.h"

#define MAX_CAPS 64

struct cap {
	uint8_t buf[2048];
	size_t len;
};

struct env {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *b;
	struct udp_path *up;
	struct cap caps[MAX_CAPS];
	int ncap;
	int tx_ret;          /* what the fake tx returns (0 captures the packet) */
	int tx_calls;
	bool sendto_eagain;  /* the seam answers -EAGAIN without sending */
	int sendto_calls;
	uint32_t last_mark;  /* SO_MARK of the socket the seam last sent on */
};

enum srv_kind { SRV_ECHO, SRV_DNS, SRV_SILENT };

struct server {
	struct env *e;
	enum srv_kind kind;
	int fd;
	uint16_t port;
	struct event *ev;
	int received;
	struct sockaddr_storage peer; /* the last sender: the path's outbound socket */
};

/* ---- fixtures ----------------------------------------------------------------------------- */

static int fake_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct env *e = arg;
	e->tx_calls++;
	if (e->tx_ret != 0)
		return e->tx_ret;
	cr_assert_lt(e->ncap, MAX_CAPS);
	cr_assert_leq(len, sizeof(e->caps[0].buf));
	memcpy(e->caps[e->ncap].buf, pkt, len);
	e->caps[e->ncap].len = len;
	e->ncap++;
	return 0;
}

static ssize_t seam_sendto(void *arg, int fd, const void *buf, size_t len,
			   const struct sockaddr *to, socklen_t tolen)
{
	struct env *e = arg;
	socklen_t ml = sizeof(e->last_mark);
	e->sendto_calls++;
	if (getsockopt(fd, SOL_SOCKET, SO_MARK, &e->last_mark, &ml) != 0)
		e->last_mark = 0;
	if (e->sendto_eagain)
		return -EAGAIN;
	ssize_t n = sendto(fd, buf, len, 0, to, tolen);
	return n < 0 ? -errno : n;
}

/* Echo: send back what came. DNS: the query with QR set and "ANS" appended; a query
 * containing "TWICE" is also answered a second time with a DNS id nobody asked for. */
static void server_cb(evutil_socket_t fd, short what, void *arg)
{
	struct server *s = arg;
	uint8_t buf[2048];
	socklen_t plen = sizeof(s->peer);
	ssize_t n = recvfrom(fd, buf, sizeof(buf) - 8, 0, (struct sockaddr *)&s->peer, &plen);

	if (n < 0)
		return;
	s->received++;
	if (s->kind == SRV_SILENT)
		return;
	if (s->kind == SRV_DNS) {
		bool twice = memmem(buf, (size_t)n, "TWICE", 5) != NULL;
		buf[2] |= 0x80;
		memcpy(buf + n, "ANS", 3);
		n += 3;
		cr_assert_eq(sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&s->peer, plen), n);
		if (!twice)
			return;
		buf[0] ^= 0xff;
	}
	cr_assert_eq(sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&s->peer, plen), n);
}

static void server_open(struct env *e, struct server *s, const char *addr, enum srv_kind kind)
{
	struct sockaddr_storage ss;
	socklen_t len = tu_sockaddr(&ss, addr, 0);

	memset(s, 0, sizeof(*s));
	s->e = e;
	s->kind = kind;
	s->fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->fd, 0);
	cr_assert_eq(bind(s->fd, (struct sockaddr *)&ss, len), 0, "bind %s: %s", addr,
		     strerror(errno));
	cr_assert_eq(getsockname(s->fd, (struct sockaddr *)&ss, &len), 0);
	s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
						: ((struct sockaddr_in6 *)&ss)->sin6_port);
	s->ev = event_new(e->base, s->fd, EV_READ | EV_PERSIST, server_cb, s);
	cr_assert_not_null(s->ev);
	cr_assert_eq(event_add(s->ev, NULL), 0);
}

static void server_close(struct server *s)
{
	event_free(s->ev);
	close(s->fd);
}

static uint16_t peer_port(const struct server *s)
{
	return ntohs(s->peer.ss_family == AF_INET
			     ? ((const struct sockaddr_in *)&s->peer)->sin_port
			     : ((const struct sockaddr_in6 *)&s->peer)->sin6_port);
}

static void env_base(struct env *e)
{
	memset(e, 0, sizeof(*e));
	e->base = event_base_new();
	cr_assert_not_null(e->base);
}

/* Load the config (printf-style JSON), create the budget and the path. */
static void env_start(struct env *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void env_start(struct env *e, const char *fmt, ...)
{
	char json[2048], err[TS_ERRLEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(json, sizeof(json), fmt, ap);
	va_end(ap);
	cr_assert_eq(config_load_string(json, &e->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&e->cfg.budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, &e->cfg, e->b, fake_tx, e, &e->up), 0);
	cr_assert_eq(udp_path_set_uptrains(e->up, true), 0); /* as the proxy runs it */
	udp_path_set_sendto(e->up, seam_sendto, e);
}

/* Free the path and prove it gave every session, fd and buffer byte back. */
static void env_fini(struct env *e)
{
	ut_env_free(e->up, e->b, &e->cfg, e->base);
}

static struct udp_path_stats stats(struct env *e)
{
	return ut_stats(e->up);
}

static const char *DEFAULT_CFG = "{}";

#define PUMP_UNTIL(e, cond, timeout_ms) UT_PUMP_UNTIL((e)->base, cond, timeout_ms)

static void pump_for(struct env *e, int ms)
{
	ut_pump_for(e->base, ms);
}

static void tun_send(struct env *e, const char *src, uint16_t sport, const char *dst,
		     uint16_t dport, const void *payload, size_t len)
{
	ut_tun_send(e->up, src, sport, dst, dport, payload, len);
}

static void check_reply(const struct cap *c, const char *src, uint16_t sport, const char *dst,
			uint16_t dport, const void *payload, size_t plen)
{
	ut_check_reply(c->buf, c->len, src, sport, dst, dport, payload, plen);
}

/* ---- tests -------------------------------------------------------------------------------- */

Test(udp, echo_v4)
{
	struct env e;
	struct server echo;
	const char msg[] = "ping over the UDP path";

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "%s", DEFAULT_CFG);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, msg, sizeof(msg));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000), "no reply");
	check_reply(&e.caps[0], "127.0.0.1", echo.port, "10.0.0.9", 5353, msg, sizeof(msg));

	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sessions, 1);
	cr_assert_eq(st.sockets, 1);
	cr_assert_eq(st.up_datagrams, 1);
	cr_assert_eq(st.up_bytes, sizeof(msg));
	cr_assert_eq(st.down_datagrams, 1);
	cr_assert_eq(st.down_bytes, sizeof(msg));
	for (int i = 0; i < UDP_DROP_MAX; i++)
		cr_assert_eq(st.drops[i], 0, "drop %s", udp_drop_name((enum udp_drop)i));
	server_close(&echo);
	env_fini(&e);
}

Test(udp, echo_v6)
{
	struct env e;
	struct server echo;
	uint8_t msg[1200];

	memset(msg, 0x6b, sizeof(msg));
	msg[0] = 0; /* odd bytes and zeros in the checksum */
	env_base(&e);
	server_open(&e, &echo, "::1", SRV_ECHO);
	env_start(&e, "%s", DEFAULT_CFG);
	tun_send(&e, "fd00::9", 5353, "::1", echo.port, msg, 1001);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000), "no reply");
	check_reply(&e.caps[0], "::1", echo.port, "fd00::9", 5353, msg, 1001);
	cr_assert_eq(stats(&e).sessions, 1);
	server_close(&echo);
	env_fini(&e);
}

/* Loop safety: the sockets come from outbound_socket, so they carry the outbound's SO_MARK
 * (setting a mark needs CAP_NET_ADMIN: root only). Loopback still answers. */
Test(udp, outbound_sockets_carry_the_routing_mark)
{
	struct env e;
	struct server echo;

	if (geteuid() != 0)
		cr_skip_test("SO_MARK needs CAP_NET_ADMIN");
	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\","
		      "\"routing_mark\":4242}]}");
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "mark", 4);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	cr_assert_eq(e.last_mark, 4242);
	check_reply(&e.caps[0], "127.0.0.1", echo.port, "10.0.0.9", 5353, "mark", 4);
	server_close(&echo);
	env_fini(&e);
}

/* Endpoint-independent mapping and filtering: one client source, two destinations, one
 * session and one outbound socket (both servers see the same source port); a third party that
 * learnt that port reaches the client too. */
/* The proxy's own socket's datagram come back through the TUN (from the gateway and one of
 * its ports): dropped as a loop and never a session; the same port once that socket is gone,
 * or another source, is an ordinary session. */
Test(udp, the_proxys_own_datagrams_are_a_loop)
{
	struct env e;
	struct server echo;
	struct loopguard *g;
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	const char msg[] = "looped";

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "%s", DEFAULT_CFG);
	const uint8_t g4[4] = { 198, 18, 0, 1 };
	cr_assert_eq(loopguard_new(g4, NULL, &g), 0);
	udp_path_set_loopguard(e.up, g);
	int own = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_eq(loopguard_bind(g, own, 4, SOCK_DGRAM), 0);
	cr_assert_eq(getsockname(own, (struct sockaddr *)&sa, &sl), 0);
	uint16_t port = ntohs(sa.sin_port);

	for (int i = 0; i < 3; i++)
		tun_send(&e, "198.18.0.1", port, "127.0.0.1", echo.port, msg, sizeof(msg));
	tun_send(&e, "198.18.0.1", port, "127.0.0.1", 53, msg, sizeof(msg));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_loop], 4, "every datagram of it: %llu",
		     (unsigned long long)st.drops[UDP_DROP_loop]);
	cr_assert_eq(st.sessions_total, 0, "never a session");
	cr_assert_eq(st.up_datagrams, 0);

	/* Another source port, another source address: ordinary traffic. */
	tun_send(&e, "198.18.0.1", (uint16_t)(port ^ 1), "127.0.0.1", echo.port, msg, sizeof(msg));
	tun_send(&e, "198.18.0.9", port, "127.0.0.1", echo.port, msg, sizeof(msg));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000), "replies");
	/* The socket is gone: its port is anyone's. */
	close(own);
	tun_send(&e, "198.18.0.1", port, "127.0.0.1", echo.port, msg, sizeof(msg));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 2000), "a reply for the port's new owner");
	st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_loop], 4);
	cr_assert_eq(st.sessions_total, 3);
	server_close(&echo);
	env_fini(&e);
	loopguard_free(g);
}

Test(udp, eim_one_session_for_one_source)
{
	struct env e;
	struct server a, b;

	env_base(&e);
	server_open(&e, &a, "127.0.0.1", SRV_ECHO);
	server_open(&e, &b, "127.0.0.1", SRV_ECHO);
	env_start(&e, "%s", DEFAULT_CFG);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", a.port, "to-a", 4);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", b.port, "to-b", 4);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000), "replies: %d", e.ncap);
	for (int i = 0; i < 2; i++) {
		bool from_a = tu_get16(e.caps[i].buf + 20) == a.port;
		check_reply(&e.caps[i], "127.0.0.1", from_a ? a.port : b.port, "10.0.0.9", 5353,
			    from_a ? "to-a" : "to-b", 4);
	}
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sessions, 1);
	cr_assert_eq(st.sessions_total, 1);
	cr_assert_eq(st.sockets, 1);
	cr_assert_eq(peer_port(&a), peer_port(&b), "mapping depends on the destination");

	/* Filtering: a remote never contacted sends to the mapped port. */
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(sendto(fd, "third", 5, 0, (struct sockaddr *)&a.peer, sizeof(struct sockaddr_in)),
		     5);
	struct sockaddr_in me;
	socklen_t mlen = sizeof(me);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&me, &mlen), 0);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 2000), "third-party datagram not delivered");
	check_reply(&e.caps[2], "127.0.0.1", ntohs(me.sin_port), "10.0.0.9", 5353, "third", 5);
	close(fd);

	/* Another client source is another session. */
	tun_send(&e, "10.0.0.9", 5354, "127.0.0.1", a.port, "x", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 4, 2000));
	cr_assert_eq(stats(&e).sessions, 2);
	server_close(&a);
	server_close(&b);
	env_fini(&e);
}

Test(udp, dns_hijack_answers_from_the_asked_address)
{
	struct env e;
	struct server dns, echo;
	uint8_t q[32] = { 0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 'q', 'u', 'e', 'r', 'y' };
	uint8_t ans[40];

	env_base(&e);
	server_open(&e, &dns, "127.0.0.1", SRV_DNS);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}", dns.port);

	/* To the gateway (one of our own addresses): hijack wins over the own-address drop. */
	tun_send(&e, "10.0.0.9", 5353, "198.18.0.1", 53, q, 17);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000), "no answer");
	memcpy(ans, q, 17);
	ans[2] |= 0x80;
	memcpy(ans + 17, "ANS", 3);
	check_reply(&e.caps[0], "198.18.0.1", 53, "10.0.0.9", 5353, ans, 20);
	cr_assert_eq(dns.received, 1);

	/* An IPv6 client asking some resolver: the IPv4 upstream answers, from the v6 asked. */
	q[0] = 0x12;
	tun_send(&e, "fd00::9", 4444, "2001:db8::53", 53, q, 17);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000), "no v6 answer");
	memcpy(ans, q, 17);
	ans[2] |= 0x80;
	check_reply(&e.caps[1], "2001:db8::53", 53, "fd00::9", 4444, ans, 20);

	/* Each of those sessions carried only DNS: closed by its answer. */
	cr_assert_eq(stats(&e).sessions, 0);
	cr_assert_eq(stats(&e).dns_done, 2);

	/* An answer with an id nobody asked for is dropped (a second query keeps the session
	 * waiting, so the stray answer reaches it). */
	memcpy(q + 12, "TWICE", 5);
	q[0] = 0x34;
	tun_send(&e, "10.0.0.9", 5353, "198.18.0.1", 53, q, 17);
	q[0] = 0x35;
	memcpy(q + 12, "query", 5);
	tun_send(&e, "10.0.0.9", 5353, "198.18.0.1", 53, q, 17);
	cr_assert(PUMP_UNTIL(&e, stats(&e).drops[UDP_DROP_dns_unmatched] == 1 && e.ncap == 4,
			     2000));
	cr_assert(PUMP_UNTIL(&e, stats(&e).dns_done == 3, 2000));

	/* Non-DNS traffic to our own address is never relayed; a query too short is refused;
	 * ordinary traffic from the same client still flows through its own socket. */
	tun_send(&e, "10.0.0.9", 5353, "198.18.0.1", 9999, "x", 1);
	tun_send(&e, "10.0.0.9", 5353, "198.18.0.2", 53, q, 11);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "plain", 5);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 5, 2000));
	check_reply(&e.caps[4], "127.0.0.1", echo.port, "10.0.0.9", 5353, "plain", 5);

	/* A session that also carries other traffic is an ordinary one: it keeps its DNS
	 * socket after the answer, for the idle timeout. */
	q[0] = 0x36;
	tun_send(&e, "10.0.0.9", 5353, "198.18.0.1", 53, q, 17);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 6, 2000));
	pump_for(&e, 20);

	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_own_address], 1);
	cr_assert_eq(st.drops[UDP_DROP_malformed], 1);
	cr_assert_eq(st.dns_queries, 5);
	cr_assert_eq(st.dns_answers, 5);
	cr_assert_eq(st.dns_done, 3);
	cr_assert_eq(st.sessions, 1);
	cr_assert_eq(st.sockets, 2, "plain + dns of the ordinary session");
	cr_assert_eq(dns.received, 5);
	server_close(&dns);
	server_close(&echo);
	env_fini(&e);
}

/* A DNS-only session whose answer waits for the TUN (the write would block) while a stray
 * second answer sits on its socket: the stray is read and counted, not left there to wake the
 * loop on every pass until the session's timeout. */
Test(udp, dns_answer_waiting_for_the_tun_with_a_stray_behind_it)
{
	struct env e;
	struct server dns;
	uint8_t q[32] = { 0x56, 0x78, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 'T', 'W', 'I', 'C', 'E' };
	int64_t t0;

	env_base(&e);
	server_open(&e, &dns, "127.0.0.1", SRV_DNS);
	env_start(&e, "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}", dns.port);
	e.tx_ret = -EAGAIN;
	tun_send(&e, "10.0.0.9", 5353, "198.18.0.1", 53, q, 17);
	cr_assert(PUMP_UNTIL(&e, stats(&e).drops[UDP_DROP_dns_unmatched] == 1, 2000),
		  "the stray answer was not read: %llu queued, %llu answers",
		  (unsigned long long)stats(&e).down_queued,
		  (unsigned long long)stats(&e).dns_answers);
	cr_assert_eq(stats(&e).down_queued, 1, "the answer waits for the TUN");
	cr_assert_eq(stats(&e).sessions, 1);
	t0 = ts_now_ns();
	for (int i = 0; i < 20; i++)
		event_base_loop(e.base, EVLOOP_NONBLOCK);
	cr_assert_lt(ts_now_ns() - t0, MS(200), "the loop spins: %lld ms",
		     (long long)((ts_now_ns() - t0) / 1000000));
	e.tx_ret = 0;
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	cr_assert(PUMP_UNTIL(&e, stats(&e).dns_done == 1, 2000));
	cr_assert_eq(stats(&e).sessions, 0);
	cr_assert_eq(stats(&e).dns_expired, 0);
	server_close(&dns);
	env_fini(&e);
}

/* A new session gets its slot but no memory is left for its socket: counted as memory, not as
 * a socket error, the descriptor closed and given back, and the session not kept. */
Test(udp, no_memory_for_the_socket_is_counted_as_memory)
{
	struct budget_buffer_stats bs;
	struct budget_stats st0, st1;
	struct server echo;
	struct env e;
	uint64_t held;

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{}");
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "a", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	budget_get_stats(e.b, &st0);
	budget_buffer_stats(e.b, 0, &bs);
	/* Room for a session object (its slab is warm), not for a socket's. */
	held = bs.bytes_limit - bs.bytes_in_use - ((sizeof(struct udp_session) + 15) / 16) * 16;
	cr_assert_eq(budget_bytes_reserve(e.b, held), 0);
	tun_send(&e, "10.0.0.9", 5354, "127.0.0.1", echo.port, "b", 1);
	budget_bytes_release(e.b, held);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_no_memory], 1);
	cr_assert_eq(st.drops[UDP_DROP_socket_error], 0);
	cr_assert_eq(st.sessions, 1, "the new session holds nothing: freed");
	budget_get_stats(e.b, &st1);
	cr_assert_eq(st1.fds_in_use, st0.fds_in_use, "the descriptor given back");
	tun_send(&e, "10.0.0.9", 5354, "127.0.0.1", echo.port, "c", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000));
	server_close(&echo);
	env_fini(&e);
}

/* A session pays for the slots that match DNS answers to queries only once it sends a query:
 * the thousand flows of a busy desktop carry none. A plain session with its socket (and the
 * socket's read event) is at most 600 bytes of budget. */
Test(udp, dns_slots_are_made_by_the_first_query)
{
	struct env e;
	struct server dns, echo;
	uint8_t q[17] = { 0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 'q', 'u', 'e', 'r', 'y' };

	env_base(&e);
	server_open(&e, &dns, "127.0.0.1", SRV_DNS);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}", dns.port);
	uint64_t m0 = ut_buffer_bytes(e.b);

	tun_send(&e, "10.0.0.9", 5000, "127.0.0.1", echo.port, "a", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	uint64_t m1 = ut_buffer_bytes(e.b);

	tun_send(&e, "10.0.0.10", 5000, "127.0.0.1", echo.port, "b", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000));
	uint64_t m2 = ut_buffer_bytes(e.b);

	cr_expect_gt(m1, m0);
	cr_expect_eq(m2 - m1, m1 - m0, "two plain sessions cost the same: %llu, %llu",
		     (unsigned long long)(m2 - m1), (unsigned long long)(m1 - m0));
	cr_expect_leq(m1 - m0, 600,
		     "a plain session holds %llu bytes", (unsigned long long)(m1 - m0));
	/* The first session asks a query (through the hijack: a second socket and the slots). */
	tun_send(&e, "10.0.0.9", 5000, "198.18.0.1", 53, q, sizeof(q));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 2000));
	uint64_t m3 = ut_buffer_bytes(e.b);

	cr_expect_geq(m3 - m2, UDP_DNS_PENDING * sizeof(struct dns_pending));
	cr_expect_eq(stats(&e).dns_answers, 1);
	server_close(&dns);
	server_close(&echo);
	env_fini(&e);
}

Test(udp, idle_timeout_closes_the_session)
{
	struct env e;
	struct server echo;
	struct budget_stats bs;

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"timeouts\":{\"udp_idle_ms\":300}}");
	/* Activity in either direction keeps it: a datagram every 30 ms for 600 ms. */
	for (int i = 0; i < 20; i++) {
		tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "k", 1);
		pump_for(&e, 30);
	}
	cr_assert(PUMP_UNTIL(&e, e.ncap == 20, 2000));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sessions, 1);
	cr_assert_eq(st.sessions_total, 1);
	cr_assert_eq(st.sessions_expired, 0);
	budget_get_stats(e.b, &bs);
	cr_assert_eq(bs.udp_in_use, 1);
	cr_assert_eq(bs.fds_in_use, 1);

	cr_assert(PUMP_UNTIL(&e, stats(&e).sessions == 0, 2000), "session never expired");
	st = stats(&e);
	cr_assert_eq(st.sessions_expired, 1);
	cr_assert_eq(st.sockets, 0);
	budget_get_stats(e.b, &bs);
	cr_assert_eq(bs.udp_in_use, 0);
	cr_assert_eq(bs.fds_in_use, 0);

	/* The client comes back: a new session. */
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "again", 5);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 21, 2000));
	cr_assert_eq(stats(&e).sessions_total, 2);
	server_close(&echo);
	env_fini(&e);
}

Test(udp, session_budget_exhaustion_is_counted)
{
	struct env e;
	struct server echo;
	struct budget_stats bs;

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"budgets\":{\"udp_sessions\":2}}");
	for (uint16_t p = 1000; p < 1004; p++)
		tun_send(&e, "10.0.0.9", p, "127.0.0.1", echo.port, "s", 1);
	/* An existing session still works at the limit. */
	tun_send(&e, "10.0.0.9", 1000, "127.0.0.1", echo.port, "t", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 2000));
	pump_for(&e, 20);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sessions, 2);
	cr_assert_eq(st.drops[UDP_DROP_no_session_budget], 2);
	cr_assert_eq(echo.received, 3);
	budget_get_stats(e.b, &bs);
	cr_assert_eq(bs.udp_refused, 2);
	server_close(&echo);
	env_fini(&e);
}

Test(udp, fd_budget_exhaustion_is_counted)
{
	struct env e;
	struct server echo;

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"budgets\":{\"fds\":1}}");
	tun_send(&e, "10.0.0.9", 1000, "127.0.0.1", echo.port, "a", 1);
	tun_send(&e, "10.0.0.9", 1001, "127.0.0.1", echo.port, "b", 1);
	/* The session that got the one fd keeps using it. */
	tun_send(&e, "10.0.0.9", 1000, "127.0.0.1", echo.port, "c", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_fd_budget], 1);
	cr_assert_eq(st.sessions, 1, "a session that never got a socket is not kept");
	cr_assert_eq(st.sockets, 1);
	server_close(&echo);
	env_fini(&e);
}

Test(udp, up_queue_overflow_is_counted_then_flushed)
{
	struct env e;
	struct server echo;
	char msg[16];

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"budgets\":{\"udp_up_queue\":4}}");
	e.sendto_eagain = true;
	for (int i = 0; i < 6; i++) {
		snprintf(msg, sizeof(msg), "d%d", i);
		tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, msg, 2);
	}
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.up_queued, 4);
	cr_assert_eq(st.queue_drops, 2);
	cr_assert_eq(st.drops[UDP_DROP_queue_full], 2);
	cr_assert_eq(st.up_datagrams, 0);
	cr_assert_eq(e.sendto_calls, 1, "behind a queue, datagrams wait their turn");

	/* The socket becomes writable: the queue drains in order. */
	e.sendto_eagain = false;
	cr_assert(PUMP_UNTIL(&e, e.ncap == 4, 2000), "replies: %d", e.ncap);
	for (int i = 0; i < 4; i++) {
		snprintf(msg, sizeof(msg), "d%d", i);
		check_reply(&e.caps[i], "127.0.0.1", echo.port, "10.0.0.9", 5353, msg, 2);
	}
	st = stats(&e);
	cr_assert_eq(st.up_queued, 0);
	cr_assert_eq(st.up_datagrams, 4);
	server_close(&echo);
	env_fini(&e);
}

/* A datagram that must wait behind a queue but is larger than a queue slot (TUN MTU + 48) is
 * dropped as oversize, not as a want of buffers; the queued one still goes. */
Test(udp, a_datagram_too_big_to_wait_is_counted_oversize)
{
	struct env e;
	struct server echo;
	static char big[1400];

	memset(big, 'b', sizeof(big));
	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"tun\":{\"mtu\":1280}}");
	e.sendto_eagain = true;
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "d0", 2);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, big, sizeof(big));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.up_queued, 1);
	cr_assert_eq(st.drops[UDP_DROP_oversize], 1);
	cr_assert_eq(st.drops[UDP_DROP_no_buffer], 0);
	e.sendto_eagain = false;
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000), "replies: %d", e.ncap);
	check_reply(&e.caps[0], "127.0.0.1", echo.port, "10.0.0.9", 5353, "d0", 2);
	server_close(&echo);
	env_fini(&e);
}

Test(udp, down_queue_overflow_is_counted_then_flushed)
{
	struct env e;
	struct server echo;
	char msg[16];

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "{\"budgets\":{\"udp_down_queue\":2}}");
	e.tx_ret = -EAGAIN;
	for (int i = 0; i < 5; i++) {
		snprintf(msg, sizeof(msg), "r%d", i);
		tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, msg, 2);
	}
	cr_assert(PUMP_UNTIL(&e, stats(&e).queue_drops == 3, 2000));
	/* Retries keep failing: nothing is lost or duplicated. Wait for the retry
	 * timer by what it does, not by a fixed time (a loaded machine may run the
	 * loop only once in 10 ms). */
	int calls = e.tx_calls;
	cr_assert(PUMP_UNTIL(&e, e.tx_calls >= calls + 3, 2000), "the retry timer runs: %d",
		  e.tx_calls);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.down_queued, 2);
	cr_assert_eq(st.down_datagrams, 0);
	cr_assert_eq(e.ncap, 0, "a failed write delivered nothing");

	e.tx_ret = 0;
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000));
	check_reply(&e.caps[0], "127.0.0.1", echo.port, "10.0.0.9", 5353, "r0", 2);
	check_reply(&e.caps[1], "127.0.0.1", echo.port, "10.0.0.9", 5353, "r1", 2);
	st = stats(&e);
	cr_assert_eq(st.down_queued, 0);
	cr_assert_eq(st.down_datagrams, 2);

	/* A driver error that is not EAGAIN drops at once. */
	e.tx_ret = -EIO;
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "z", 1);
	cr_assert(PUMP_UNTIL(&e, stats(&e).drops[UDP_DROP_tx_error] == 1, 2000));
	cr_assert_eq(stats(&e).down_queued, 0);
	server_close(&echo);
	env_fini(&e);
}

Test(udp, reject_and_udpless_outbounds_drop_and_count)
{
	struct env e;
	struct server echo, silent;

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	server_open(&e, &silent, "127.0.0.1", SRV_SILENT);
	env_start(&e,
		  "{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"},"
		  "{\"tag\":\"block\",\"type\":\"reject\"},"
		  "{\"tag\":\"proxy\",\"type\":\"socks5\",\"server\":\"127.0.0.1:1\","
		  "\"udp\":false},"
		  "{\"tag\":\"web\",\"type\":\"http\",\"server\":\"127.0.0.1:1\"}],"
		  "\"route\":{\"rules\":[{\"port\":[%u],\"network\":\"udp\",\"outbound\":\"block\"},"
		  "{\"cidr\":[\"::1/128\"],\"port\":[9],\"outbound\":\"proxy\"},"
		  "{\"cidr\":[\"::1/128\"],\"outbound\":\"web\"}],\"final\":\"direct\"}}",
		  silent.port);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", silent.port, "no", 2);
	tun_send(&e, "fd00::9", 5353, "::1", 9, "no", 2);
	tun_send(&e, "fd00::9", 5353, "::1", 8, "no", 2);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo.port, "yes", 3);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", silent.port, "no", 2);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	pump_for(&e, 20);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_rejected], 2);
	cr_assert_eq(st.drops[UDP_DROP_unsupported_outbound], 2, "socks5 without udp, and http");
	cr_assert_eq(st.sessions, 1, "drops before any session exists create none");
	cr_assert_eq(silent.received, 0, "a rejected datagram went out");
	server_close(&echo);
	server_close(&silent);
	env_fini(&e);
}

Test(udp, malformed_input_is_counted)
{
	struct env e;
	uint8_t junk[64];
	struct tu_spec s;
	size_t n;

	env_base(&e);
	env_start(&e, "%s", DEFAULT_CFG);
	memset(junk, 0x45, sizeof(junk));
	udp_path_input(e.up, junk, sizeof(junk), ts_now_ns());
	udp_path_input(e.up, junk, 0, ts_now_ns());
	tu_spec_tcp(&s, "10.0.0.9", 1, "127.0.0.1", 2);
	n = tu_build(&s, junk, sizeof(junk));
	udp_path_input(e.up, junk, n, ts_now_ns());
	udp_path_batch_end(e.up);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_malformed], 3);
	cr_assert_eq(st.sessions_total, 0);
	cr_assert_str_eq(udp_drop_name(UDP_DROP_queue_full), "queue_full");
	cr_assert_str_eq(udp_drop_name(UDP_DROP_MAX), "unknown");
	env_fini(&e);
}

/* udp_path_input_view (the stack's parse handed on) and udp_path_input (the raw bytes) are one
 * path: two paths with the same config are fed the same table of datagrams, one through each
 * entry, and agree on every counter after every datagram. The table covers what each check
 * of the path decides on: IPv4, IPv6, IPv6 extension headers, a second datagram of a session,
 * an empty payload, our own address, hijacked DNS (a query, and one too short for a DNS
 * header), zero ports, and a packet that is not UDP at all. */
Test(udp, view_entry_agrees_with_raw_entry)
{
	static const struct {
		const char *src, *dst;
		uint16_t sport, dport; /* dport 1: the silent server of dst's family */
		size_t plen;
		int n_ext;
		bool tcp;
	} table[] = {
		{ "10.0.0.9", "127.0.0.1", 5353, 1, 20, 0, false },
		{ "fd00::9", "::1", 5353, 1, 30, 0, false },
		{ "fd00::9", "::1", 6000, 1, 40, 2, false },
		{ "10.0.0.9", "127.0.0.1", 5353, 1, 50, 0, false },
		{ "fd00::9", "::1", 7000, 1, 0, 0, false },
		{ "10.0.0.9", "198.18.0.1", 5000, 9, 10, 0, false },
		{ "10.0.0.9", "8.8.8.8", 5001, 53, 17, 0, false },
		{ "10.0.0.9", "8.8.8.8", 5002, 53, 4, 0, false },
		{ "10.0.0.9", "127.0.0.1", 0, 1, 10, 0, false },
		{ "fd00::9", "::1", 5353, 0, 10, 0, false },
		{ "10.0.0.9", "127.0.0.1", 5003, 1, 10, 0, true },
	};
	const size_t n = sizeof(table) / sizeof(table[0]);
	struct env raw, view;
	struct server s4, s6, dns;
	struct udp_path_stats a, b;

	env_base(&raw);
	env_base(&view);
	server_open(&raw, &s4, "127.0.0.1", SRV_SILENT);
	server_open(&raw, &s6, "::1", SRV_SILENT);
	server_open(&raw, &dns, "127.0.0.1", SRV_SILENT);
	env_start(&raw, "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}", dns.port);
	env_start(&view, "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}", dns.port);
	for (size_t i = 0; i < n; i++) {
		uint8_t pkt[2048];
		struct pkt_view pv;
		struct tu_spec s;
		size_t len;
		uint16_t dport = table[i].dport != 1 ? table[i].dport
						     : strchr(table[i].dst, ':') ? s6.port : s4.port;

		if (table[i].tcp)
			tu_spec_tcp(&s, table[i].src, table[i].sport, table[i].dst, dport);
		else
			tu_spec_udp(&s, table[i].src, table[i].sport, table[i].dst, dport);
		s.payload_len = table[i].plen;
		for (int e = 0; e < table[i].n_ext; e++)
			s.ext[s.ext_n++] = (struct tu_ext){ e % 2 ? 60 : 0, 0 };
		len = tu_build(&s, pkt, sizeof(pkt));
		udp_path_input(raw.up, pkt, len, ts_now_ns());
		udp_path_batch_end(raw.up);
		cr_assert_eq(pkt_parse(&pv, pkt, len), PKT_OK, "datagram %zu", i);
		udp_path_input_view(view.up, &pv, ts_now_ns());
		udp_path_batch_end(view.up);
		a = stats(&raw);
		b = stats(&view);
		cr_assert_eq(memcmp(&a, &b, sizeof(a)), 0, "datagram %zu: the entries disagree", i);
		cr_assert_eq(raw.sendto_calls, view.sendto_calls, "datagram %zu", i);
	}
	/* What the table must have done (so agreement is not two paths doing nothing alike). */
	cr_assert_eq(a.sessions_total, 5, "v4 5353, v6 5353, v6 6000, v6 7000, the DNS client");
	cr_assert_eq(a.up_datagrams, 6);
	cr_assert_eq(a.up_bytes, 20 + 30 + 40 + 50 + 0 + 17);
	cr_assert_eq(a.dns_queries, 1);
	cr_assert_eq(a.drops[UDP_DROP_own_address], 1);
	cr_assert_eq(a.drops[UDP_DROP_malformed], 4, "short DNS, sport 0, dport 0, TCP");
	cr_assert_eq(raw.sendto_calls, 6);
	server_close(&s4);
	server_close(&s6);
	server_close(&dns);
	env_fini(&raw);
	env_fini(&view);
}

/* Freeing with live sessions, queued datagrams both ways and a pending DNS query gives every
 * budget unit back (env_fini checks) and counts what was still queued. */
Test(udp, free_with_live_state_releases_everything)
{
	struct env e;
	struct server echo;

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	env_start(&e, "%s", DEFAULT_CFG);
	e.tx_ret = -EAGAIN;
	tun_send(&e, "10.0.0.9", 1, "127.0.0.1", echo.port, "down", 4);
	cr_assert(PUMP_UNTIL(&e, stats(&e).down_queued == 1, 2000));
	e.sendto_eagain = true;
	tun_send(&e, "10.0.0.9", 2, "127.0.0.1", echo.port, "up", 2);
	tun_send(&e, "10.0.0.9", 2, "127.0.0.1", echo.port, "up", 2);
	cr_assert_eq(stats(&e).up_queued, 2);
	cr_assert_eq(stats(&e).sessions, 2);
	server_close(&echo);
	env_fini(&e);
}

/* ---- reload: udp_path_set_config ---------------------------------------------------------- */

/* Configurations a reload test hands over: heap-allocated, freed by the release callback, so
 * a configuration released while a session still used it shows up under ASan. */
struct rel {
	const struct ts_config *expect; /* the configuration this release is for */
	int calls;
};

static struct ts_config *heap_cfg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static struct ts_config *heap_cfg(const char *fmt, ...)
{
	char json[2048], err[TS_ERRLEN];
	struct ts_config *c = malloc(sizeof(*c));
	va_list ap;

	cr_assert_not_null(c);
	va_start(ap, fmt);
	vsnprintf(json, sizeof(json), fmt, ap);
	va_end(ap);
	cr_assert_eq(config_load_string(json, c, err, sizeof(err)), 0, "%s", err);
	return c;
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

/* The path on a heap configuration (env_fini then finalizes the untouched e->cfg: a no-op). */
static void env_start_heap(struct env *e, const struct ts_config *c)
{
	cr_assert_eq(budget_new(&c->budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, c, e->b, fake_tx, e, &e->up), 0);
	cr_assert_eq(udp_path_set_uptrains(e->up, true), 0); /* as the proxy runs it */
	udp_path_set_sendto(e->up, seam_sendto, e);
}

/* Send one datagram and wait for its echo; the mark of the socket it left on. */
static uint32_t echo_mark(struct env *e, const char *src, uint16_t sport, uint16_t dport)
{
	int before = e->ncap;

	tun_send(e, src, sport, "127.0.0.1", dport, "reload", 6);
	cr_assert(PUMP_UNTIL(e, e->ncap == before + 1, 2000), "no echo for %s:%u", src, sport);
	check_reply(&e->caps[before], "127.0.0.1", dport, src, sport, "reload", 6);
	return e->last_mark;
}

/* A live session keeps the configuration it was created with: its outbound (seen as the
 * socket's SO_MARK), and its routing for new destinations too; new sessions use the new one.
 * The replaced configuration is released once, when its last session has expired (under the
 * new configuration's idle timeout, which applies to every session). */
Test(udp, reload_keeps_live_sessions_and_releases_after_the_last)
{
	struct env e;
	struct server echo, echo2;
	struct ts_config *a, *b;
	struct rel ra = { 0 };
	struct udp_path_stats st;

	if (geteuid() != 0)
		cr_skip_test("SO_MARK needs CAP_NET_ADMIN");
	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	server_open(&e, &echo2, "127.0.0.1", SRV_ECHO);
	a = heap_cfg("{\"outbounds\":[{\"tag\":\"d1\",\"type\":\"direct\",\"routing_mark\":273}]}");
	b = heap_cfg("{\"timeouts\":{\"udp_idle_ms\":300},"
		     " \"outbounds\":[{\"tag\":\"d2\",\"type\":\"direct\",\"routing_mark\":546},"
		     "                {\"tag\":\"block\",\"type\":\"reject\"}],"
		     " \"route\":{\"rules\":[{\"port\":[%u],\"outbound\":\"block\"}],"
		     "            \"final\":\"d2\"}}", echo2.port);
	env_start_heap(&e, a);
	cr_assert_eq(echo_mark(&e, "10.0.0.9", 5353, echo.port), 273);

	ra.expect = a;
	udp_path_set_config(e.up, b, on_release, &ra);
	cr_assert_eq(ra.calls, 0, "released while a session holds it");
	/* The old session: still A's outbound, and A's routing for a destination B rejects. */
	cr_assert_eq(echo_mark(&e, "10.0.0.9", 5353, echo.port), 273);
	cr_assert_eq(echo_mark(&e, "10.0.0.9", 5353, echo2.port), 273);
	/* A new session: B's outbound, B's reject rule. */
	cr_assert_eq(echo_mark(&e, "10.0.0.10", 5354, echo.port), 546);
	tun_send(&e, "10.0.0.11", 5355, "127.0.0.1", echo2.port, "no", 2);
	st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_rejected], 1);
	cr_assert_eq(st.sessions, 2);
	cr_assert_eq(ra.calls, 0);

	/* B's 300 ms idle timeout closes both sessions; A goes with its last one. */
	cr_assert(PUMP_UNTIL(&e, stats(&e).sessions == 0, 3000), "sessions never expired");
	cr_assert_eq(stats(&e).sessions_expired, 2);
	cr_assert_eq(ra.calls, 1);
	/* The old client again: a new session, under B. */
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", echo2.port, "no", 2);
	cr_assert_eq(stats(&e).drops[UDP_DROP_rejected], 2);
	cr_assert_eq(echo_mark(&e, "10.0.0.9", 5353, echo.port), 546);
	pump_for(&e, 20);
	cr_assert_eq(ra.calls, 1, "released twice");
	server_close(&echo);
	server_close(&echo2);
	env_fini(&e);
	heap_cfg_free(b); /* current at udp_path_free: never released by the path */
	cr_assert_eq(ra.calls, 1);
}

/* Without live sessions the replaced configuration goes at once; A -> B -> C with sessions on
 * B and C; udp_path_free releases what is still held and never the current one. */
Test(udp, reload_twice_and_free_releases_what_is_held)
{
	struct env e;
	struct server echo;
	struct ts_config *a, *b, *c;
	struct rel ra = { 0 }, rb = { 0 };

	env_base(&e);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	a = heap_cfg("%s", DEFAULT_CFG);
	b = heap_cfg("%s", DEFAULT_CFG);
	c = heap_cfg("{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},"
		     "               {\"tag\":\"block\",\"type\":\"reject\"}],"
		     " \"route\":{\"rules\":[{\"port\":[%u],\"outbound\":\"block\"}],"
		     "            \"final\":\"d\"}}", echo.port);
	env_start_heap(&e, a);
	ra.expect = a;
	udp_path_set_config(e.up, b, on_release, &ra);
	cr_assert_eq(ra.calls, 1, "no session: released inside set_config");

	echo_mark(&e, "10.0.0.9", 1000, echo.port); /* a session under B */
	rb.expect = b;
	udp_path_set_config(e.up, c, on_release, &rb);
	cr_assert_eq(rb.calls, 0);
	echo_mark(&e, "10.0.0.9", 1000, echo.port); /* still B's: not rejected */
	tun_send(&e, "10.0.0.10", 1000, "127.0.0.1", echo.port, "no", 2); /* C's: rejected */
	cr_assert_eq(stats(&e).drops[UDP_DROP_rejected], 1);
	cr_assert_eq(stats(&e).sessions, 1);

	udp_path_free(e.up);
	e.up = NULL;
	cr_assert_eq(rb.calls, 1, "udp_path_free releases the held configuration");
	cr_assert_eq(ra.calls, 1);
	server_close(&echo);
	env_fini(&e);
	heap_cfg_free(c);
}

/* A DNS query: id, RD, one question (its bytes do not matter to the fake responder). */
#define DNS_Q_LEN 17
static void dns_query(uint8_t q[DNS_Q_LEN], uint16_t id)
{
	static const uint8_t rest[DNS_Q_LEN - 2] = { 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0,
						     'q', 'u', 'e', 'r', 'y' };
	q[0] = (uint8_t)(id >> 8);
	q[1] = (uint8_t)id;
	memcpy(q + 2, rest, sizeof(rest));
}

/* Hijacked DNS: a live session keeps its upstream; new sessions ask the new one. */
Test(udp, reload_moves_the_dns_upstream_for_new_sessions)
{
	struct env e;
	struct server dns1, dns2;
	struct ts_config *a, *b;
	struct rel ra = { 0 };
	uint8_t q[DNS_Q_LEN];

	env_base(&e);
	server_open(&e, &dns1, "127.0.0.1", SRV_DNS);
	server_open(&e, &dns2, "127.0.0.1", SRV_DNS);
	a = heap_cfg("{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}", dns1.port);
	b = heap_cfg("{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}", dns2.port);
	env_start_heap(&e, a);
	/* Not answered yet when the reload comes (the loop has not run): the session is live. */
	dns_query(q, 0x1111);
	tun_send(&e, "10.0.0.9", 4000, "198.18.0.1", 53, q, sizeof(q));

	ra.expect = a;
	udp_path_set_config(e.up, b, on_release, &ra);
	dns_query(q, 0x2222);
	tun_send(&e, "10.0.0.9", 4000, "198.18.0.1", 53, q, sizeof(q));   /* old session */
	dns_query(q, 0x3333);
	tun_send(&e, "10.0.0.10", 4000, "198.18.0.1", 53, q, sizeof(q));  /* new session */
	cr_assert_eq(ra.calls, 0);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 2000), "answers missing");
	cr_assert_eq(dns1.received, 2, "the old session keeps A's upstream");
	cr_assert_eq(dns2.received, 1, "a new session asks B's upstream");
	cr_assert_eq(stats(&e).dns_answers, 3);
	/* Answered, the DNS-only sessions closed: A was released with its last one. */
	cr_assert(PUMP_UNTIL(&e, ra.calls == 1, 2000));
	server_close(&dns1);
	server_close(&dns2);
	udp_path_free(e.up);
	e.up = NULL;
	cr_assert_eq(ra.calls, 1);
	env_fini(&e);
	heap_cfg_free(b);
}

/* ---- DNS sessions: closed when answered, or after the DNS timeout ------------------------- */

/* Resolvers ask each query from a fresh source port. 5,000 of them, answered by the upstream,
 * must not pile up 60 s sessions: a session that only carried DNS closes with its last answer,
 * so sessions and fds stay at what is in flight and the budget is never exhausted. */
Test(udp, dns_queries_from_fresh_ports_do_not_hold_sessions)
{
	enum { QUERIES = 5000, WAVE = 16, LIMIT = 64 };
	struct env e;
	struct server dns;
	struct budget_stats bs;
	uint8_t q[DNS_Q_LEN];
	int sent = 0;

	env_base(&e);
	server_open(&e, &dns, "127.0.0.1", SRV_DNS);
	env_start(&e, "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"},"
		      "\"budgets\":{\"udp_sessions\":%d,\"fds\":%d}}", dns.port, LIMIT, LIMIT);
	while (sent < QUERIES) {
		for (int i = 0; i < WAVE && sent < QUERIES; i++, sent++) {
			dns_query(q, (uint16_t)(0x4000 + sent));
			tun_send(&e, "10.0.0.9", (uint16_t)(10000 + sent), "198.18.0.1", 53, q,
				 sizeof(q));
		}
		cr_assert(PUMP_UNTIL(&e, stats(&e).dns_answers == (uint64_t)sent, 2000),
			  "answers %llu of %d (sessions %llu, refused %llu)",
			  (unsigned long long)stats(&e).dns_answers, sent,
			  (unsigned long long)stats(&e).sessions,
			  (unsigned long long)stats(&e).drops[UDP_DROP_no_session_budget]);
		cr_assert_eq(stats(&e).sessions, 0, "an answered DNS session is kept");
		e.ncap = 0;
	}
	struct udp_path_stats st = stats(&e);
	budget_get_stats(e.b, &bs);
	cr_assert_eq(st.dns_answers, QUERIES);
	cr_assert_eq(st.down_datagrams, QUERIES);
	cr_assert_eq(st.dns_done, QUERIES, "each closed by its answer");
	cr_assert_eq(st.sessions_total, QUERIES);
	cr_assert_eq(st.sockets, 0);
	cr_assert_eq(st.drops[UDP_DROP_no_session_budget], 0);
	cr_assert_eq(st.drops[UDP_DROP_fd_budget], 0);
	cr_assert_eq(bs.udp_refused, 0);
	cr_assert_eq(bs.fd_refused, 0);
	cr_assert_leq(bs.udp_peak, WAVE, "sessions peaked at %u", bs.udp_peak);
	cr_assert_leq(bs.fds_peak, WAVE, "fds peaked at %u", bs.fds_peak);
	cr_assert_eq(bs.fds_in_use, 0);
	cr_assert_eq(dns.received, QUERIES);
	server_close(&dns);
	env_fini(&e);
}

/* An upstream that never answers: the DNS-only sessions go after the DNS timeout, not after
 * timeouts.udp_idle_ms (60 s here). */
Test(udp, unanswered_dns_queries_expire_after_the_dns_timeout)
{
	struct env e;
	struct server dns;
	struct budget_stats bs;
	uint8_t q[DNS_Q_LEN];
	int64_t t0;

	env_base(&e);
	server_open(&e, &dns, "127.0.0.1", SRV_SILENT);
	env_start(&e, "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"},"
		      "\"timeouts\":{\"udp_idle_ms\":60000}}", dns.port);
	cr_assert_eq(UDP_DNS_TIMEOUT_MS, 5000);
	udp_path_set_dns_timeout(e.up, 300);
	t0 = ts_now_ns();
	for (int i = 0; i < 10; i++) {
		dns_query(q, (uint16_t)i);
		tun_send(&e, "10.0.0.9", (uint16_t)(20000 + i), "198.18.0.1", 53, q, sizeof(q));
	}
	cr_assert(PUMP_UNTIL(&e, dns.received == 10, 2000));
	cr_assert_eq(stats(&e).sessions, 10);
	cr_assert(PUMP_UNTIL(&e, stats(&e).sessions == 0, 3000), "DNS sessions never expired");
	cr_assert_geq(ts_now_ns() - t0, MS(300), "expired before the DNS timeout");
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.dns_expired, 10);
	cr_assert_eq(st.sessions_expired, 0, "not the idle timeout");
	cr_assert_eq(st.sockets, 0);
	budget_get_stats(e.b, &bs);
	cr_assert_eq(bs.udp_in_use, 0);
	cr_assert_eq(bs.fds_in_use, 0);
	server_close(&dns);
	env_fini(&e);
}

/* Without hijack, DNS to port 53 is handled alike: a session closes with its last answer (an
 * answer: QR set, an asked id, from the asked server). A session whose replies are not DNS
 * answers (another protocol on port 53, here an echo) is an ordinary one and stays. */
Test(udp, plain_dns_to_port_53_closes_with_its_answer)
{
	struct env e;
	struct server dns, echo;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(53) };
	uint8_t q[DNS_Q_LEN];

	env_base(&e);
	/* Port 53 on two addresses of 127.0.0.0/8 nobody else uses. */
	server_open(&e, &dns, "127.0.0.1", SRV_DNS);
	server_open(&e, &echo, "127.0.0.1", SRV_ECHO);
	cr_assert_eq(inet_pton(AF_INET, "127.77.0.53", &sin.sin_addr), 1);
	close(dns.fd);
	dns.fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_eq(bind(dns.fd, (struct sockaddr *)&sin, sizeof(sin)), 0, "%s", strerror(errno));
	event_free(dns.ev);
	dns.ev = event_new(e.base, dns.fd, EV_READ | EV_PERSIST, server_cb, &dns);
	event_add(dns.ev, NULL);
	cr_assert_eq(inet_pton(AF_INET, "127.77.0.54", &sin.sin_addr), 1);
	close(echo.fd);
	echo.fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_eq(bind(echo.fd, (struct sockaddr *)&sin, sizeof(sin)), 0, "%s", strerror(errno));
	event_free(echo.ev);
	echo.ev = event_new(e.base, echo.fd, EV_READ | EV_PERSIST, server_cb, &echo);
	event_add(echo.ev, NULL);
	env_start(&e, "%s", DEFAULT_CFG);

	for (int i = 0; i < 3; i++) {
		dns_query(q, (uint16_t)(0x100 + i));
		tun_send(&e, "10.0.0.9", (uint16_t)(30000 + i), "127.77.0.53", 53, q, sizeof(q));
	}
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 2000), "answers missing");
	uint8_t ans[DNS_Q_LEN + 3];
	dns_query(ans, 0x100);
	ans[2] |= 0x80;
	memcpy(ans + DNS_Q_LEN, "ANS", 3);
	check_reply(&e.caps[0], "127.77.0.53", 53, "10.0.0.9", 30000, ans, sizeof(ans));
	cr_assert_eq(stats(&e).sessions, 0);
	cr_assert_eq(stats(&e).dns_done, 3);
	cr_assert_eq(stats(&e).dns_answers, 0, "dns_answers counts hijacked answers only");

	dns_query(q, 0x200);
	tun_send(&e, "10.0.0.9", 31000, "127.77.0.54", 53, q, sizeof(q));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 4, 2000), "echo missing");
	check_reply(&e.caps[3], "127.77.0.54", 53, "10.0.0.9", 31000, q, sizeof(q));
	pump_for(&e, 20);
	cr_assert_eq(stats(&e).sessions, 1, "not a DNS answer: an ordinary session");
	tun_send(&e, "10.0.0.9", 31000, "127.77.0.54", 53, "again", 5);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 5, 2000));
	cr_assert_eq(stats(&e).sessions_total, 4);
	server_close(&dns);
	server_close(&echo);
	env_fini(&e);
}

/* ---- libevent's allocations refused in turn (failalloc.h, evmem.h) ---- */

static void on_far(evutil_socket_t fd, short what, void *arg)
{
}

/* The sessions' idle timer may find no room in libevent's timer heap, which grows when its
 * count reaches 8, 16, ... pending timers: each run has a fresh loop with `pad` far timers of
 * the test's already pending, so that the first session's timer meets the heap's growth. A
 * datagram to a server that never answers: its session must expire by the 150 ms idle
 * timeout, or the datagram be dropped and counted (no_memory); never a session that stays. */
static void expiry_scenario(void *arg, bool sweep)
{
	const int *pad = arg;
	char err[TS_ERRLEN];
	struct timeval far = { 3600, 0 };
	struct event *pads[16];
	struct server quiet;
	struct env e;
	int rc;

	failalloc_hold(true); /* the loop, the server, the configuration, the padding */
	env_base(&e);
	server_open(&e, &quiet, "127.0.0.1", SRV_SILENT);
	cr_assert_eq(config_load_string("{\"timeouts\":{\"udp_idle_ms\":150}}", &e.cfg, err,
					sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&e.cfg.budget, &e.b), 0);
	for (int i = 0; i < *pad; i++) {
		cr_assert_not_null(pads[i] = evtimer_new(e.base, on_far, NULL));
		cr_assert_eq(evtimer_add(pads[i], &far), 0);
	}
	failalloc_hold(false);
	if ((rc = udp_path_new(e.base, &e.cfg, e.b, fake_tx, &e, &e.up)) != 0) {
		cr_assert(sweep && (rc == -ENOMEM || rc == -ENOBUFS), "udp_path_new: %d", rc);
		failalloc_hold(true);
		budget_free(e.b);
		config_fini(&e.cfg);
		goto out;
	}
	udp_path_set_sendto(e.up, seam_sendto, &e);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.1", quiet.port, "k", 1);
	if (stats(&e).sessions_total == 0) {
		cr_assert(sweep, "no session");
		cr_assert_geq(stats(&e).drops[UDP_DROP_no_memory], 1, "a drop not counted");
	} else {
		cr_assert(PUMP_UNTIL(&e, stats(&e).sessions == 0, 2000), "the session never expired "
			  "(pad %d)", *pad);
	}
	failalloc_hold(true);
	ut_path_free_checked(e.up, e.b);
	budget_free(e.b);
	config_fini(&e.cfg);
out:
	for (int i = 0; i < *pad; i++)
		event_free(pads[i]);
	server_close(&quiet);
	event_base_free(e.base);
	failalloc_hold(false);
}

/* A timer of the test's, due just before the idle expiry in the same loop pass: it takes the
 * places in libevent's timer heap the two gave back, then refuses the next allocation. */
struct heap_taker {
	struct event_base *base;
	struct event *pads[64];
	int n;
};

static void on_take_heap(evutil_socket_t fd, short what, void *arg)
{
	struct heap_taker *h = arg;

	h->n = failalloc_fill_timers(h->base, h->pads, 64);
	failalloc_arm(1);
}

/* The idle expiry fires, closes the first session and is re-armed for the second one, which
 * still waits; a callback that ran first in the same loop pass took the place the expiry gave
 * back, and the heap cannot grow. The second session has nothing else to end it (its app and
 * its server stay silent): it must still expire by its timeout, the re-arm counted. */
Test(udp, a_waiting_session_expires_when_its_expiry_re_arm_finds_no_memory)
{
	struct heap_taker h = { 0 };
	struct timeval tv = { 0, 200000 };
	struct server quiet;
	struct event *t;
	struct env e;

	cr_assert_eq(evmem_install(), 0);
	env_base(&e);
	server_open(&e, &quiet, "127.0.0.1", SRV_SILENT);
	env_start(&e, "{\"timeouts\":{\"udp_idle_ms\":200}}");
	h.base = e.base;
	cr_assert_not_null(t = evtimer_new(e.base, on_take_heap, &h));
	cr_assert_eq(evtimer_add(t, &tv), 0); /* due just before the first session's expiry */
	tun_send(&e, "10.0.0.9", 5001, "127.0.0.1", quiet.port, "a", 1);
	usleep(100000);
	tun_send(&e, "10.0.0.9", 5002, "127.0.0.1", quiet.port, "b", 1);
	cr_assert_eq(stats(&e).sessions, 2);
	usleep(150000); /* the test's timer and the expiry due, the second session not yet */
	event_base_loop(e.base, EVLOOP_NONBLOCK);
	failalloc_arm(0);
	cr_assert_geq(h.n, 0);
	cr_assert(failalloc_fired(), "the re-arm needed no memory: nothing tested");
	cr_assert_eq(stats(&e).sessions, 1, "the first session expired");
	cr_assert(PUMP_UNTIL(&e, stats(&e).sessions == 0, 2000),
		  "the second session never expired");
	cr_assert_eq(stats(&e).sessions_expired, 2);
	cr_assert_eq(stats(&e).expiry_spare_used, 1);
	cr_assert_eq(stats(&e).expiry_unarmed, 0);
	failalloc_unpad(h.pads, h.n);
	event_free(t);
	server_close(&quiet);
	env_fini(&e);
}

Test(udp, sessions_expire_when_libevent_refused_their_timer)
{
	static const int pads[] = { 0, 8 };

	cr_assert_eq(evmem_install(), 0);
	for (size_t i = 0; i < sizeof(pads) / sizeof(pads[0]); i++)
		cr_log_info("pad %d: %ld allocations refused in turn", pads[i],
			    failalloc_sweep(expiry_scenario, (void *)&pads[i], 3, 500));
}
