/* test_udp_train.c — replies in trains (udp_path_set_trains, udp_codec_encode_train): a burst
 * of replies of one flow leaves as one UDP GSO super-datagram, and what the kernel cuts it into
 * (tests/unit/testutil.c segments it as Linux's __udp_gso_segment does, checksums completed
 * from the partial sum in the field) is, byte for byte, what one-by-one encoding gives. Over
 * loopback (127.0.0.1 and ::1): a server socket outside the loop sends bursts, all queued
 * before the path reads, so one read pass sees them together; fake tx functions capture what
 * would reach the TUN.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/flow.h"
#include "core/pkt.h"
#include "core/udp_codec.h"
#include "dispatch/udp.h"
#include "testutil.h"
#include "udptest.h"

#define MAX_DGRAMS 512
#define SUPER_MAX (48 + 65535)

/* One datagram as it reached the client: the packet the TUN would carry, whether it came in
 * a train (and which). */
struct got {
	uint8_t pkt[4096];
	size_t len;
	int train;              /* -1: written one by one */
};

struct env {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *b;
	struct udp_path *up;
	struct got got[MAX_DGRAMS];
	int ngot;
	int tx_calls, meta_calls, trains;
	int tx_ret, meta_ret;   /* what the fake tx functions return (0: captured) */
	uint16_t last_gso;
};

static int fake_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct env *e = arg;

	e->tx_calls++;
	if (e->tx_ret != 0)
		return e->tx_ret;
	cr_assert_lt(e->ngot, MAX_DGRAMS);
	cr_assert_leq(len, sizeof(e->got[0].pkt));
	memcpy(e->got[e->ngot].pkt, pkt, len);
	e->got[e->ngot].len = len;
	e->got[e->ngot].train = -1;
	e->ngot++;
	return 0;
}

/* A super-datagram: its metadata checked, its field the partial pseudo-header sum, then cut
 * as the kernel would and every datagram kept. */
static int fake_tx_meta(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	static uint8_t out[2 * SUPER_MAX];
	struct tu_seg segs[UDP_CODEC_TRAIN_MAX + 1];
	struct env *e = arg;
	size_t n;

	e->meta_calls++;
	if (e->meta_ret != 0)
		return e->meta_ret;
	cr_assert_eq(m->flags, PKT_META_NEEDS_CSUM);
	cr_assert_eq(m->gso_type, PKT_GSO_UDP_L4);
	cr_assert_gt(m->gso_size, 0);
	cr_assert(tu_verify_partial(pkt, len), "the field holds the partial pseudo-header sum");
	n = tu_gso_segment(pkt, len, m, out, sizeof(out), segs, UDP_CODEC_TRAIN_MAX + 1);
	cr_assert_geq(n, 2, "a train of one");
	cr_assert_leq(n, UDP_CODEC_TRAIN_MAX);
	for (size_t i = 0; i < n; i++) {
		cr_assert_lt(e->ngot, MAX_DGRAMS);
		cr_assert_leq(segs[i].len, sizeof(e->got[0].pkt));
		memcpy(e->got[e->ngot].pkt, out + segs[i].off, segs[i].len);
		e->got[e->ngot].len = segs[i].len;
		e->got[e->ngot].train = e->trains;
		e->ngot++;
	}
	e->last_gso = m->gso_size;
	e->trains++;
	return 0;
}

static void env_start_cfg(struct env *e, bool trains, const char *json)
{
	char err[TS_ERRLEN];

	memset(e, 0, sizeof(*e));
	e->base = event_base_new();
	cr_assert_not_null(e->base);
	cr_assert_eq(config_load_string(json, &e->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&e->cfg.budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, &e->cfg, e->b, fake_tx, e, &e->up), 0);
	if (trains)
		cr_assert_eq(udp_path_set_trains(e->up, fake_tx_meta, true, true), 0);
}

static void env_start(struct env *e, bool trains)
{
	env_start_cfg(e, trains, "{}");
}

static void env_fini(struct env *e)
{
	ut_env_free(e->up, e->b, &e->cfg, e->base);
}

static struct udp_path_stats stats(struct env *e)
{
	return ut_stats(e->up);
}

/* A server outside the loop: bound to addr, it learns the path's outbound socket from the
 * first datagram and then sends bursts to it. */
struct server {
	int fd;
	uint16_t port;
	struct sockaddr_storage peer;
	socklen_t peerlen;
};

static void server_open(struct server *s, const char *addr)
{
	struct sockaddr_storage ss;
	socklen_t len = tu_sockaddr(&ss, addr, 0);

	memset(s, 0, sizeof(*s));
	s->fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->fd, 0);
	cr_assert_eq(bind(s->fd, (struct sockaddr *)&ss, len), 0, "bind %s: %s", addr,
		     strerror(errno));
	cr_assert_eq(getsockname(s->fd, (struct sockaddr *)&ss, &len), 0);
	s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
						: ((struct sockaddr_in6 *)&ss)->sin6_port);
}

static bool server_learn(struct server *s)
{
	uint8_t buf[2048];

	s->peerlen = sizeof(s->peer);
	return recvfrom(s->fd, buf, sizeof(buf), 0, (struct sockaddr *)&s->peer, &s->peerlen) >= 0;
}

/* The client's first datagram reaches the server: the session and its socket exist. */
static void hello(struct env *e, struct server *s, const char *client, uint16_t cport,
		  const char *saddr)
{
	ut_tun_send(e->up, client, cport, saddr, s->port, "hello", 5);
	cr_assert(UT_PUMP_UNTIL(e->base, server_learn(s), 2000), "the first datagram never came");
}

/* The usual start: a path (trains on or off), a server on 127.0.0.1 and a session of
 * 10.0.0.9:5353 that has reached it. */
static void start(struct env *e, struct server *s, bool trains)
{
	env_start(e, trains);
	server_open(s, "127.0.0.1");
	hello(e, s, "10.0.0.9", 5353, "127.0.0.1");
}

/* Datagram i of a burst: len bytes of a pattern that depends on i. */
static void pattern(uint8_t *p, size_t len, int i)
{
	tu_fill_pattern(p, len, 1000u + (uint32_t)i);
}

static void server_send(struct server *s, int i, size_t len)
{
	uint8_t p[4096];

	pattern(p, len, i);
	cr_assert_eq(sendto(s->fd, p, len, 0, (struct sockaddr *)&s->peer, s->peerlen),
		     (ssize_t)len, "sendto: %s", strerror(errno));
}

/* Datagram k that reached the client is burst datagram i of len bytes from saddr:sport. */
static void check_got(struct env *e, int k, const char *saddr, uint16_t sport, const char *client,
		      uint16_t cport, int i, size_t len)
{
	uint8_t p[4096];

	cr_assert_lt(k, e->ngot, "only %d datagrams reached the client", e->ngot);
	pattern(p, len, i);
	ut_check_reply(e->got[k].pkt, e->got[k].len, saddr, sport, client, cport, p, len);
}

/* The IPv4 IDs of datagrams first .. last that reached the client count up by one, as
 * one-by-one encoding numbers them (IPv6 has none). */
static void check_ids(struct env *e, int first, int last)
{
	for (int k = first; k < last; k++) {
		if ((e->got[k].pkt[0] >> 4) != 4)
			return;
		cr_assert_eq((uint16_t)(tu_get16(e->got[k].pkt + 4) + 1),
			     tu_get16(e->got[k + 1].pkt + 4), "IPv4 IDs of datagrams %d and %d", k,
			     k + 1);
	}
}

/* ---- the codec ---------------------------------------------------------------------------- */

/* Every datagram the kernel cuts a train into is exactly the one udp_codec_encode makes for
 * that payload with the train's IPv4 ID + its index. */
static void codec_round_trip(int family, size_t payload_len, size_t seg)
{
	static uint8_t train[SUPER_MAX], cut[2 * SUPER_MAX], one[SUPER_MAX];
	struct tu_seg segs[UDP_CODEC_TRAIN_MAX + 1];
	struct udp_codec_hdr h = { .family = (uint8_t)family, .ip_id = 0xfffe };
	size_t hl = udp_codec_hdr_len((uint8_t)family), len, n, olen;
	struct pkt_meta m;

	tu_addr(h.src, family == 4 ? "192.0.2.1" : "2001:db8::1");
	tu_addr(h.dst, family == 4 ? "10.0.0.9" : "fd00::9");
	h.sport_be = htons(443);
	h.dport_be = htons(50000);
	tu_fill_pattern(train + hl, payload_len, 7);
	cr_assert_eq(udp_codec_encode_train(&h, payload_len, seg, train, sizeof(train), &len, &m),
		     0);
	cr_assert_eq(len, hl + payload_len);
	cr_assert_eq(m.flags, PKT_META_NEEDS_CSUM);
	cr_assert_eq(m.gso_type, PKT_GSO_UDP_L4);
	cr_assert_eq(m.gso_size, seg);
	cr_assert_eq(m.hdr_len, hl);
	cr_assert_eq(m.csum_start, hl - 8);
	cr_assert_eq(m.csum_offset, 6);
	cr_assert(tu_verify_partial(train, len));
	if (family == 4)
		cr_assert(tu_verify_ip4_header(train));
	n = tu_gso_segment(train, len, &m, cut, sizeof(cut), segs, UDP_CODEC_TRAIN_MAX + 1);
	cr_assert_eq(n, (payload_len + seg - 1) / seg);
	for (size_t i = 0; i < n; i++) {
		size_t plen = i + 1 < n ? seg : payload_len - i * seg;
		struct udp_codec_hdr hi = h;

		hi.ip_id = (uint16_t)(h.ip_id + i);
		cr_assert_eq(udp_codec_encode(&hi, train + hl + i * seg, plen, one, sizeof(one),
					      &olen), 0);
		cr_assert_eq(segs[i].len, olen, "datagram %zu: %zu bytes, want %zu", i,
			     segs[i].len, olen);
		cr_assert_arr_eq(cut + segs[i].off, one, olen, "datagram %zu differs", i);
		cr_assert(tu_verify_l4(cut + segs[i].off, olen), "datagram %zu: checksum", i);
	}
}

Test(udp_train, codec_cuts_into_what_one_by_one_encoding_gives)
{
	codec_round_trip(4, 2 * 100, 100);
	codec_round_trip(4, 5 * 100 + 37, 100);     /* the last one short */
	codec_round_trip(4, 64 * 1000, 1000);      /* the most datagrams */
	codec_round_trip(4, 65507, 1400);          /* the largest IPv4 payload */
	codec_round_trip(6, 3 * 1232 + 1, 1232);
	codec_round_trip(6, 65527, 1232);          /* the largest IPv6 payload */
}

Test(udp_train, codec_refuses_what_is_no_train)
{
	static uint8_t buf[SUPER_MAX];
	struct udp_codec_hdr h = { .family = 4 };
	struct pkt_meta m;
	size_t len = 7;

	memset(buf, 0xab, sizeof(buf));
	cr_assert_eq(udp_codec_encode_train(&h, 100, 100, buf, sizeof(buf), &len, &m), -EINVAL,
		     "one datagram");
	cr_assert_eq(udp_codec_encode_train(&h, 100, 0, buf, sizeof(buf), &len, &m), -EINVAL,
		     "size 0");
	cr_assert_eq(udp_codec_encode_train(&h, 65 * 10, 10, buf, sizeof(buf), &len, &m), -EINVAL,
		     "65 datagrams");
	cr_assert_eq(udp_codec_encode_train(&h, 65508, 1400, buf, sizeof(buf), &len, &m),
		     -EMSGSIZE);
	cr_assert_eq(udp_codec_encode_train(&h, 300, 100, buf, 28 + 299, &len, &m), -ENOBUFS);
	h.family = 5;
	cr_assert_eq(udp_codec_encode_train(&h, 300, 100, buf, sizeof(buf), &len, &m), -EINVAL);
	cr_assert_eq(len, 7, "untouched on error");
	for (size_t i = 0; i < sizeof(buf); i++)
		cr_assert_eq(buf[i], 0xab, "byte %zu written on error", i);
}

/* ---- the path ----------------------------------------------------------------------------- */

/* A burst of one size ending in a shorter datagram is one train; a larger one after it starts
 * the next. Every datagram arrives, in order, with its own checksum right. */
static void burst_in_trains(const char *client, const char *saddr)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;
	int k = 0;

	env_start(&e, true);
	server_open(&s, saddr);
	hello(&e, &s, client, 5353, saddr);
	for (int i = 0; i < 20; i++)
		server_send(&s, i, 100);
	server_send(&s, 20, 30);
	for (int i = 21; i < 24; i++)
		server_send(&s, i, 200);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 24, 2000), "%d of 24 arrived", e.ngot);
	for (int i = 0; i < 24; i++, k++)
		check_got(&e, k, saddr, s.port, client, 5353, i, i < 20 ? 100 : i == 20 ? 30 : 200);
	cr_assert_eq(e.trains, 2);
	cr_assert_eq(e.tx_calls, 0, "nothing one by one");
	for (int i = 0; i < 24; i++)
		cr_assert_eq(e.got[i].train, i < 21 ? 0 : 1, "datagram %d in train %d", i,
			     e.got[i].train);
	check_ids(&e, 0, 23);
	st = stats(&e);
	cr_assert_eq(st.trains, 2);
	cr_assert_eq(st.train_datagrams, 24);
	cr_assert_eq(st.down_datagrams, 24);
	cr_assert_eq(st.down_bytes, 20 * 100 + 30 + 3 * 200);
	cr_assert_eq(st.train_errors, 0);
	close(s.fd);
	env_fini(&e);
}

Test(udp_train, a_burst_goes_in_trains_v4)
{
	burst_in_trains("10.0.0.9", "127.0.0.1");
}

Test(udp_train, a_burst_goes_in_trains_v6)
{
	burst_in_trains("fd00::9", "::1");
}

/* A sender's UDP GSO send arrives whole on the path's socket (UDP GRO): one read holds the
 * run, cut back into its datagrams, each checked and in a train as if read alone. */
static void server_send_gso(struct server *s, int first, int count, size_t seg, size_t last)
{
	uint8_t buf[65536];
	size_t len = 0;
	union {
		char b[CMSG_SPACE(sizeof(uint16_t))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr mh = { .msg_name = &s->peer, .msg_namelen = s->peerlen, .msg_iov = &iov,
			     .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	uint16_t gso = (uint16_t)seg;

	for (int i = 0; i < count; i++) {
		size_t n = i + 1 < count ? seg : last;
		pattern(buf + len, n, first + i);
		len += n;
	}
	iov = (struct iovec){ buf, len };
	c->cmsg_level = SOL_UDP;
	c->cmsg_type = UDP_SEGMENT;
	c->cmsg_len = CMSG_LEN(sizeof(gso));
	memcpy(CMSG_DATA(c), &gso, sizeof(gso));
	cr_assert_eq(sendmsg(s->fd, &mh, 0), (ssize_t)len, "sendmsg: %s", strerror(errno));
}

Test(udp_train, a_gso_send_is_read_whole_and_cut_into_trains)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	start(&e, &s, true);
	server_send_gso(&s, 0, 10, 200, 200);
	server_send_gso(&s, 10, 6, 300, 50);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 16, 2000), "%d of 16 arrived", e.ngot);
	for (int i = 0; i < 16; i++) {
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i,
			  i < 10 ? 200 : i < 15 ? 300 : 50);
		cr_assert_eq(e.got[i].train, i < 10 ? 0 : 1);
	}
	check_ids(&e, 0, 15);
	st = stats(&e);
	cr_assert_eq(st.gro_datagrams, 16, "read in runs: %llu",
		     (unsigned long long)st.gro_datagrams);
	cr_assert_eq(st.trains, 2);
	cr_assert_eq(st.down_datagrams, 16);
	close(s.fd);
	env_fini(&e);
}

/* A shorter datagram ends its train even when one of the first size follows: a GSO packet's
 * datagrams are all gso_size long but the last, so 100, 100, 30, 100 in one train would be cut
 * as 100, 100, 100, 30. */
Test(udp_train, a_shorter_datagram_ends_its_train)
{
	struct env e;
	struct server s;
	size_t sizes[] = { 100, 100, 30, 100, 100, 5, 5, 5 };
	int trains[] = { 0, 0, 0, 1, 1, 1, 2, 2 };
	int n = (int)(sizeof(sizes) / sizeof(sizes[0]));

	start(&e, &s, true);
	for (int i = 0; i < n; i++)
		server_send(&s, i, sizes[i]);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == n, 2000), "%d of %d arrived", e.ngot, n);
	for (int i = 0; i < n; i++) {
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i, sizes[i]);
		cr_assert_eq(e.got[i].train, trains[i], "datagram %d in train %d, want %d", i,
			     e.got[i].train, trains[i]);
	}
	cr_assert_eq(e.tx_calls, 0);
	close(s.fd);
	env_fini(&e);
}

/* Hijacked DNS answers never go in trains (their path reads each at the start of the buffer
 * and answers from the address asked): three answers of one size in one read pass go one by
 * one, each from the asked address. */
Test(udp_train, hijacked_dns_answers_go_alone)
{
	struct env e;
	struct server dns;
	char json[256];
	uint8_t q[17] = { 0xbe, 0x00, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 'q', 'u', 'e', 'r', 'y' };
	uint8_t buf[64];

	server_open(&dns, "127.0.0.1");
	snprintf(json, sizeof(json), "{\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.1:%u\"}}",
		 dns.port);
	env_start_cfg(&e, true, json);
	for (int i = 0; i < 3; i++) {
		q[1] = (uint8_t)i;
		ut_tun_send(e.up, "10.0.0.9", 5353, "198.18.0.1", 53, q, sizeof(q));
		cr_assert(UT_PUMP_UNTIL(e.base, server_learn(&dns), 2000), "query %d", i);
	}
	for (int i = 0; i < 3; i++) {
		memcpy(buf, q, sizeof(q));
		buf[1] = (uint8_t)i;
		buf[2] |= 0x80;
		cr_assert_eq(sendto(dns.fd, buf, sizeof(q), 0, (struct sockaddr *)&dns.peer,
				    dns.peerlen), (ssize_t)sizeof(q));
	}
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 3, 2000), "%d of 3 answers", e.ngot);
	for (int i = 0; i < 3; i++) {
		memcpy(buf, q, sizeof(q));
		buf[1] = (uint8_t)i;
		buf[2] |= 0x80;
		ut_check_reply(e.got[i].pkt, e.got[i].len, "198.18.0.1", 53, "10.0.0.9", 5353, buf,
			       sizeof(q));
	}
	cr_assert_eq(e.meta_calls, 0, "a train of DNS answers");
	cr_assert_eq(e.tx_calls, 3);
	close(dns.fd);
	env_fini(&e);
}

/* Two sources interleaved: a train never mixes them, and a lone datagram goes one by one. */
Test(udp_train, sources_never_mix_and_a_lone_datagram_goes_alone)
{
	struct env e;
	struct server a, b;
	int order[] = { 0, 0, 1, 1, 1, 0 };

	env_start(&e, true);
	server_open(&a, "127.0.0.1");
	server_open(&b, "127.0.0.1");
	hello(&e, &a, "10.0.0.9", 5353, "127.0.0.1");
	ut_tun_send(e.up, "10.0.0.9", 5353, "127.0.0.1", b.port, "hello", 5);
	cr_assert(UT_PUMP_UNTIL(e.base, server_learn(&b), 2000));
	for (int i = 0; i < 6; i++)
		server_send(order[i] ? &b : &a, i, 64);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 6, 2000), "%d of 6 arrived", e.ngot);
	for (int i = 0; i < 6; i++)
		check_got(&e, i, "127.0.0.1", order[i] ? b.port : a.port, "10.0.0.9", 5353, i, 64);
	cr_assert_eq(e.trains, 2);
	cr_assert_eq(e.tx_calls, 1, "the last one alone");
	cr_assert_eq(e.got[5].train, -1);
	close(a.fd);
	close(b.fd);
	env_fini(&e);
}

/* Empty datagrams are never in a train (a GSO size of 0 means nothing); they go one by one in
 * their place. */
Test(udp_train, empty_datagrams_go_alone_in_order)
{
	struct env e;
	struct server s;
	size_t sizes[] = { 0, 0, 80, 80, 0, 80, 80, 80 };
	int n = (int)(sizeof(sizes) / sizeof(sizes[0]));

	start(&e, &s, true);
	for (int i = 0; i < n; i++)
		server_send(&s, i, sizes[i]);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == n, 2000), "%d of %d arrived", e.ngot, n);
	for (int i = 0; i < n; i++)
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i, sizes[i]);
	cr_assert_eq(e.trains, 2);
	cr_assert_eq(e.tx_calls, 3);
	close(s.fd);
	env_fini(&e);
}

/* A full device (-EAGAIN) for the train: its datagrams are queued one by one behind it in
 * order, each encoded in place, and go out once the device takes them. */
Test(udp_train, a_full_device_queues_the_train_one_by_one)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	start(&e, &s, true);
	e.tx_ret = e.meta_ret = -EAGAIN;
	for (int i = 0; i < 10; i++)
		server_send(&s, i, i < 9 ? 700 : 123);
	cr_assert(UT_PUMP_UNTIL(e.base, stats(&e).down_queued == 10, 2000), "queued %llu",
		  (unsigned long long)stats(&e).down_queued);
	cr_assert_eq(e.ngot, 0);
	/* A burst behind a queue waits its turn: no train jumps ahead of it, though the device
	 * would take a train now. */
	e.meta_ret = 0;
	int meta_calls = e.meta_calls;
	for (int i = 10; i < 13; i++)
		server_send(&s, i, 700);
	cr_assert(UT_PUMP_UNTIL(e.base, stats(&e).down_queued == 13, 2000));
	cr_assert_eq(e.meta_calls, meta_calls, "a train tried ahead of the queue");
	cr_assert_eq(e.ngot, 0);
	e.tx_ret = 0;
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 13, 2000), "%d of 13 arrived", e.ngot);
	for (int i = 0; i < 13; i++) {
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i, i == 9 ? 123 : 700);
		cr_assert_eq(e.got[i].train, -1, "datagram %d queued and written alone", i);
	}
	check_ids(&e, 0, 12);
	st = stats(&e);
	cr_assert_eq(st.down_queued, 0);
	cr_assert_eq(st.trains, 0);
	cr_assert_eq(st.train_errors, 0);
	cr_assert_eq(st.down_datagrams, 13);
	close(s.fd);
	env_fini(&e);
}

/* A train the device refuses with err: its datagrams go one by one (nothing lost), counted;
 * the next burst goes in a train again unless trains went off. */
static void refused_train(int err, bool off)
{
	struct env e;
	struct server s;
	struct udp_path_stats st;

	start(&e, &s, true);
	e.meta_ret = err;
	for (int i = 0; i < 5; i++)
		server_send(&s, i, 300);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 5, 2000), "%d of 5 arrived", e.ngot);
	e.meta_ret = 0;
	for (int i = 5; i < 10; i++)
		server_send(&s, i, 300);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 10, 2000), "%d of 10 arrived", e.ngot);
	for (int i = 0; i < 10; i++) {
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i, 300);
		cr_assert_eq(e.got[i].train, i < 5 || off ? -1 : 0, "datagram %d", i);
	}
	check_ids(&e, 0, 9);
	cr_assert_eq(e.meta_calls, off ? 1 : 2);
	st = stats(&e);
	cr_assert_eq(st.train_errors, 1);
	cr_assert_eq(st.trains, off ? 0 : 1);
	cr_assert_eq(st.down_datagrams, 10);
	close(s.fd);
	env_fini(&e);
}

/* The kernel refuses UDP GSO as such (-EINVAL): trains off for the family. */
Test(udp_train, a_refused_train_turns_trains_off)
{
	refused_train(-EINVAL, true);
}

/* Any other write error (the device gone a moment, memory short): trains stay on. */
Test(udp_train, a_failed_train_goes_one_by_one_and_trains_stay_on)
{
	refused_train(-ENOBUFS, false);
}

/* No train over the largest payload: 32 datagrams of 2,100 bytes (67,200) come in a train
 * of 31 and one alone; no train over UDP_CODEC_TRAIN_MAX datagrams. Every datagram in order.
 * Bursts are sent less than a socket buffer's worth at a time. */
Test(udp_train, long_bursts_are_cut_at_the_limits)
{
	struct env e;
	struct server s;
	int n = 0;

	start(&e, &s, true);
	for (int burst = 0; burst < 3; burst++) {
		for (int i = 0; i < 32; i++)
			server_send(&s, n + i, 2100);
		n += 32;
		cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == n, 3000), "%d of %d arrived", e.ngot, n);
	}
	for (int i = 0; i < n; i++)
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i, 2100);
	cr_assert_geq(e.trains, 3, "%d trains", e.trains);
	for (int t = 0; t < e.trains; t++) {
		int c = 0;
		for (int i = 0; i < n; i++)
			c += e.got[i].train == t;
		cr_assert_leq(c * 2100, 65507, "train %d: %d datagrams", t, c);
	}
	/* 100 datagrams of 100 bytes: a read pass takes 64, a whole train, then the rest. */
	e.ngot = 0;
	e.trains = 0;
	for (int i = 0; i < 100; i++)
		server_send(&s, i, 100);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 100, 3000), "%d of 100 arrived", e.ngot);
	for (int i = 0; i < 100; i++)
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i, 100);
	for (int t = 0; t < e.trains; t++) {
		int c = 0;
		for (int i = 0; i < 100; i++)
			c += e.got[i].train == t;
		cr_assert_eq(c, t == 0 ? UDP_CODEC_TRAIN_MAX : 100 - UDP_CODEC_TRAIN_MAX,
			     "train %d: %d datagrams", t, c);
	}
	cr_assert_eq(e.trains, 2);
	check_ids(&e, 0, 99);
	close(s.fd);
	env_fini(&e);
}

/* Without trains (a TUN without UDP GSO) every reply is one write, as always, and the socket
 * gets no UDP GRO: a GSO send arrives as single datagrams too. */
Test(udp_train, off_every_reply_alone_and_no_gro)
{
	struct env e;
	struct server s;

	start(&e, &s, false);
	for (int i = 0; i < 8; i++)
		server_send(&s, i, 100);
	server_send_gso(&s, 8, 10, 200, 120);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 18, 2000), "%d of 18 arrived", e.ngot);
	for (int i = 0; i < 18; i++)
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i,
			  i < 8 ? 100 : i < 17 ? 200 : 120);
	cr_assert_eq(e.tx_calls, 18);
	cr_assert_eq(e.meta_calls, 0);
	cr_assert_eq(stats(&e).trains, 0);
	cr_assert_eq(stats(&e).gro_datagrams, 0);
	close(s.fd);
	env_fini(&e);
}

/* A budget sized for an idle path with trains holds one: the larger receive buffer replaces
 * the first, it is not taken next to it. One byte less: trains stay off, the path works on
 * with its first buffer, and every byte is accounted. */
Test(udp_train, set_trains_fits_a_budget_sized_for_it)
{
	struct env e;
	struct server s;
	char json[128];
	uint64_t need;
	int ret;

	env_start(&e, true);
	need = ut_buffer_bytes(e.b);
	env_fini(&e);

	snprintf(json, sizeof(json), "{\"budgets\":{\"buffer_bytes\":%llu}}",
		 (unsigned long long)need);
	env_start_cfg(&e, true, json);
	cr_assert_eq(ut_buffer_bytes(e.b), need);
	env_fini(&e);

	snprintf(json, sizeof(json), "{\"budgets\":{\"buffer_bytes\":%llu}}",
		 (unsigned long long)need - 1);
	env_start_cfg(&e, false, json);
	uint64_t before = ut_buffer_bytes(e.b);
	ret = udp_path_set_trains(e.up, fake_tx_meta, true, true);
	cr_assert_eq(ret, -ENOBUFS);
	cr_assert_eq(ut_buffer_bytes(e.b), before, "the first buffer back, nothing else held");
	server_open(&s, "127.0.0.1");
	hello(&e, &s, "10.0.0.9", 5353, "127.0.0.1");
	for (int i = 0; i < 4; i++)
		server_send(&s, i, 100);
	cr_assert(UT_PUMP_UNTIL(e.base, e.ngot == 4, 2000), "%d of 4 arrived", e.ngot);
	for (int i = 0; i < 4; i++)
		check_got(&e, i, "127.0.0.1", s.port, "10.0.0.9", 5353, i, 100);
	cr_assert_eq(e.meta_calls, 0);
	close(s.fd);
	env_fini(&e);
}

Test(udp_train, set_trains_checks_its_arguments)
{
	struct env e;

	env_start(&e, false);
	cr_assert_eq(udp_path_set_trains(e.up, NULL, true, false), -EINVAL);
	cr_assert_eq(udp_path_set_trains(e.up, NULL, false, false), 0, "off needs no function");
	env_fini(&e);
}
