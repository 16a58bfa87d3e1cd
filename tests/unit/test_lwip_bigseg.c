/* test_lwip_bigseg.c — lwIP builds large segments with TUN offload, the kernel cuts them
 * (stacks/lwip/lwip_bigseg.c through stacks/lwip/lwip_stack.c).
 *
 * The lwIP stack runs in-process with offload output (tx_meta): every frame it emits is cut the
 * way the kernel's GSO would (tu_gso_segment), and the pieces are what the app's TCP receives.
 * Checked: no piece carries more than the MSS the app announced, every piece's checksum
 * verifies, the bytes the app receives are the bytes written (in order, retransmissions
 * included), and the counters say how it went out. The loss path is driven with duplicate
 * ACKs: lwIP's fast retransmission sends a large segment again, the connection then stops
 * cutting large segments, writes wait while a large one is the last queued, and once no large
 * segment is left everything goes out in MSS-sized segments.
 *
 * The other way, the app's upload arrives as super-packets (stacks/lwip/lwip_ackq.h): each is
 * acknowledged once at the end of its loop pass, the window the reader opened in that pass
 * rides on the same segment, and a pcb reset before the pass ends is skipped. A super-packet
 * of 32 KiB or more is fed in the driver's read buffer (env.rx_take), uncopied, waits there in
 * the out-of-order queue when it comes early, and the buffer goes back once the reader has its
 * bytes or the connection is reset; over IPv6 only one without extension headers is taken. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/driver.h"
#include "core/log.h"
#include "core/pkt.h"
#include "core/tun.h"
#include "dispatch/stream.h"
#include "stacks/lwip/include/lwipopts.h" /* TCP_WND, TCP_RCV_SCALE */
#include "stacks/lwip/lwip_stack.h"
#include "testutil.h"

/* TCP_WND_UPDATE_THRESHOLD of a connection with window scaling (lwipopts.h). */
#define UPDATE_THRESHOLD_SCALED (TCP_WND / 4)

#define CLI "10.0.0.2"
#define SRV "198.18.0.9"
#define CLI6 "fd00:7f::9"
#define SRV6 "2001:db8::80"
#define CPORT 40001
#define SPORT 443
#define MSS 1400
#define DATA_MAX (512 * 1024)

static struct ts_config cfg;
static struct budget *bud;
static struct event_base *base;
static struct netstack *ns;
static struct log lg;
static struct stream *acc;
static bool offload_on;
/* The addresses of the connection (IPv6 with v6_on, set before start). */
static bool v6_on;
static const char *cli = CLI, *srv = SRV;

/* What the app's TCP has been sent: the stream's bytes by offset from lwIP's ISN + 1. */
static uint8_t *got;
static uint8_t *seen; /* 1 per byte received at least once */
static uint32_t iss;  /* lwIP's initial sequence number (from the SYN-ACK) */
static size_t pieces, max_piece, frames_big;
static bool fin_seen;
static size_t fin_at; /* the stream offset a FIN stands at (after the data it came with) */
static uint8_t synack[256];
static size_t synack_len;
static size_t acks;           /* pure ACKs sent to the app */
static uint32_t last_ack;     /* the last one's acknowledgement, relative to the app's ISN + 1 */
static uint32_t last_wnd;     /* and its window in bytes (lwIP's field, scaled by its shift) */
static uint32_t last_data_wnd; /* the window of the last piece with data */
static uint32_t last_data_ack; /* and its acknowledgement, relative to the app's ISN + 1 */
static size_t push_end;        /* where the last piece with data and PSH ended */

static void piece(const uint8_t *p, size_t len)
{
	struct pkt_view v;
	uint8_t *cp = malloc(len);
	size_t hl, pl;
	uint32_t off;

	memcpy(cp, p, len);
	cr_assert_eq(pkt_parse(&v, cp, len), PKT_OK);
	cr_assert_eq(v.proto, IPPROTO_TCP);
	cr_assert(v.family == 6 || tu_verify_ip4_header(cp), "IPv4 header checksum");
	cr_assert(tu_verify_l4(cp, len), "TCP checksum of a piece");
	pieces++;
	if (v.tcp_flags & TCP_SYN) {
		cr_assert_leq(len, sizeof(synack));
		memcpy(synack, cp, len);
		synack_len = len;
		free(cp);
		return;
	}
	hl = v.l3_len + v.tcp_hlen;
	pl = v.len - hl;
	if (pl > max_piece)
		max_piece = pl;
	off = tu_get32(v.l4 + 4) - (iss + 1);
	if (v.tcp_flags & TCP_FIN) {
		/* The app's TCP ends the stream at the first FIN it takes: every FIN, first sent or
		 * again, must stand at the one end. */
		if (fin_seen)
			cr_assert_eq(off + pl, fin_at, "a FIN at offset %zu, another at %zu",
				     fin_at, (size_t)(off + pl));
		fin_seen = true;
		fin_at = off + pl;
	}
	if (!pl && !(v.tcp_flags & (TCP_FIN | TCP_RST))) {
		acks++;
		last_ack = tu_get32(v.l4 + 8) - 1001;
		last_wnd = (uint32_t)tu_get16(v.l4 + 14) << TCP_RCV_SCALE;
	}
	if (pl) {
		last_data_wnd = (uint32_t)tu_get16(v.l4 + 14) << TCP_RCV_SCALE;
		last_data_ack = tu_get32(v.l4 + 8) - 1001;
		if (v.tcp_flags & TCP_PSH)
			push_end = off + pl;
		cr_assert_leq(off + pl, DATA_MAX, "data beyond what was written");
		for (size_t i = 0; i < pl; i++) {
			if (seen[off + i])
				cr_assert_eq(got[off + i], cp[hl + i], "a retransmission differs");
			got[off + i] = cp[hl + i];
			seen[off + i] = 1;
		}
	}
	free(cp);
}

static int tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	piece(pkt, len);
	return 0;
}

static int tx_meta(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	static uint8_t out[70000];
	struct tu_seg segs[64];
	size_t n;

	(void)arg;
	if (m->gso_type == PKT_GSO_NONE)
		return tx(arg, pkt, len);
	cr_assert_eq(m->gso_type, PKT_GSO_TCPV4);
	cr_assert_eq(m->gso_size, MSS, "cut at the app's MSS");
	n = tu_gso_segment(pkt, len, m, out, sizeof(out), segs, 64);
	for (size_t i = 0; i < n; i++)
		piece(out + segs[i].off, segs[i].len);
	frames_big++;
	return 0;
}

/* Frames lent (env.tx_lend, as the driver's ring takes them): kept until tx_flush, which
 * delivers them as tx_meta would and gives them back; with lend_hold, tx_flush keeps them (a
 * round not made yet) and deliver_lent() does it later. */
struct lent_frame {
	const uint8_t *pkt;
	size_t len;
	struct pkt_meta m;
	void (*release)(void *arg, bool lost);
	void *arg;
};
static struct lent_frame lentq[64];
static size_t nlent, lent_total, lent_small, lent_flushes; /* lent_total: super-packets */
static bool lend_hold;

static int tx_lend(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m,
		   void (*release)(void *rel_arg, bool lost), void *rel_arg)
{
	(void)arg;
	cr_assert_lt(nlent, 64);
	cr_assert(m->gso_type == PKT_GSO_TCPV4 || m->gso_type == PKT_GSO_NONE);
	lentq[nlent++] = (struct lent_frame){ pkt, len, *m, release, rel_arg };
	if (m->gso_type == PKT_GSO_NONE)
		lent_small++;
	else
		lent_total++;
	return 0;
}

static void deliver_lent(void)
{
	size_t n = nlent;

	nlent = 0;
	for (size_t i = 0; i < n; i++) {
		tx_meta(NULL, lentq[i].pkt, lentq[i].len, &lentq[i].m);
		lentq[i].release(lentq[i].arg, false);
	}
}

static void tx_flush(void *arg)
{
	(void)arg;
	lent_flushes++;
	if (!lend_hold)
		deliver_lent();
}

/* With rx_on, the super-packet is read into a buffer as the driver's (struct driver_rxbuf)
 * and the stack may take it (env.rx_take) instead of copying the packet: counted here, and
 * freed through its own free function. */
static bool rx_on;
static struct driver_rxbuf *rx_cur; /* the buffer of the input under way, until taken */
static size_t rx_taken, rx_freed;

static struct driver_rxbuf *rx_take(void *arg, const uint8_t *pkt)
{
	struct driver_rxbuf *b = rx_cur;

	(void)arg;
	if (!b || pkt != b->frame + TUN_VNET_HDR_LEN)
		return NULL;
	rx_cur = NULL;
	rx_taken++;
	return b;
}

static void rxbuf_free(struct driver_rxbuf *b)
{
	rx_freed++;
	free(b);
}

static void on_acc(void *arg, const struct flow_key *k, struct stream *s)
{
	(void)arg;
	(void)k;
	acc = s;
}

static void start_lend(bool offload, bool large, bool lend)
{
	char err[TS_ERRLEN];

	const char *json = v6_on ? "{\"stack\":\"lwip\",\"tun\":{\"large_segments\":false,"
				   "\"address6\":\"fd00:7f::1/64\"}}"
			   : large ? "{\"stack\":\"lwip\",\"tun\":{\"large_segments\":true}}"
				   : "{\"stack\":\"lwip\",\"tun\":{\"large_segments\":false}}";

	config_init(&cfg);
	cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&cfg.budget, &bud), 0);
	base = event_base_new();
	log_init(&lg, LOG_LEVEL_ERROR, 2);
	struct netstack_env env = { .base = base, .cfg = &cfg, .budget = bud, .log = &lg,
				    .tx = tx, .tx_meta = offload ? tx_meta : NULL,
				    .tx_lend = offload && lend ? tx_lend : NULL,
				    .tx_flush = offload && lend ? tx_flush : NULL,
				    .rx_take = offload && rx_on ? rx_take : NULL };
	cr_assert_eq(lwip_stack_ops.start(&env, &ns, err, sizeof(err)), 0, "%s", err);
	lwip_stack_set_accept_hook(ns, on_acc, NULL);
	offload_on = offload;
	got = calloc(1, DATA_MAX);
	seen = calloc(1, DATA_MAX);
	acc = NULL;
	pieces = max_piece = frames_big = fin_at = acks = push_end = 0;
	nlent = lent_total = lent_small = lent_flushes = 0;
	lend_hold = false;
	fin_seen = false;
	rx_taken = rx_freed = 0;
}

static void start(bool offload, bool large)
{
	start_lend(offload, large, false);
}

static void teardown(void)
{
	if (acc)
		acc->ops->abort(acc);
	acc = NULL;
	lwip_stack_ops.free(ns);
	cr_assert_eq(rx_freed, rx_taken, "every taken read buffer given back");
	rx_on = v6_on = false;
	cli = CLI;
	srv = SRV;
	event_base_free(base);
	budget_free(bud);
	config_fini(&cfg);
	free(got);
	free(seen);
}

static void run(void)
{
	event_base_loop(base, EVLOOP_NONBLOCK); /* accepts, stream events, the train's flush */
}

static void feed(struct tu_spec *s)
{
	static uint8_t buf[2048];
	bool plain = false;
	size_t ol = 0;
	struct pkt_view view;
	size_t len = tu_build(s, buf, sizeof(buf));

	lwip_stack_ops.input(ns, 0, buf, len, NULL, 0, &ol, &plain, &view);
	run();
}

static uint64_t counter(const char *name)
{
	bool found;
	uint64_t v = tu_stack_counter(&lwip_stack_ops, ns, name, &found);

	cr_assert(found, "counter %s", name);
	return v;
}

/* An ACK from the app: ack = lwIP's ISN + 1 + acked, window field wnd (scaled by 2^7). */
static void ack(uint32_t acked, uint16_t wnd)
{
	struct tu_spec s;

	tu_spec_tcp(&s, cli, CPORT, srv, SPORT);
	s.tcp_flags = TCP_ACK;
	s.seq = 1001;
	s.ack = iss + 1 + acked;
	s.window = wnd;
	feed(&s);
}

/* A SYN from the app at CPORT + i, with MSS 1400 and window scale 7. */
static void syn_from(uint16_t i)
{
	struct tu_spec s;

	tu_spec_tcp(&s, cli, CPORT + i, srv, SPORT);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	s.ack = 0;
	s.mss = MSS;
	s.tcp_opts[0] = 1; /* NOP */
	s.tcp_opts[1] = 3; /* window scale */
	s.tcp_opts[2] = 3;
	s.tcp_opts[3] = 7;
	s.tcp_opts_len = 4;
	feed(&s);
}

/* The SYN, then the third ACK with window field wnd. */
static void connect_app(uint16_t wnd)
{
	struct pkt_view v;

	syn_from(0);
	cr_assert_gt(synack_len, 0, "lwIP answered the SYN");
	cr_assert_eq(pkt_parse(&v, synack, synack_len), PKT_OK);
	iss = tu_get32(v.l4 + 4);
	ack(0, wnd);
	cr_assert_not_null(acc, "accepted");
}

static void pattern(uint8_t *d, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		d[i] = (uint8_t)(seed >> 16);
	}
}

/* Write all n bytes of d (ACKing what arrived whenever lwIP's buffer is full); then ACK until
 * everything written has arrived. */
static void send_all(const uint8_t *d, size_t at, size_t n, uint16_t wnd)
{
	size_t done = 0;

	for (int round = 0; round < 200 && done < n; round++) {
		ssize_t w = acc->ops->write(acc, d + done, n - done);
		if (w > 0)
			done += (size_t)w;
		else
			cr_assert_eq(w, -EAGAIN);
		run();
		size_t edge = 0;
		while (edge < at + done && seen[edge])
			edge++;
		ack((uint32_t)edge, wnd);
	}
	cr_assert_eq(done, n, "everything was written");
	for (int round = 0; round < 200; round++) {
		size_t edge = 0;
		while (edge < at + n && seen[edge])
			edge++;
		if (edge == at + n)
			break;
		ack((uint32_t)edge, wnd);
	}
	cr_assert_arr_eq(got + at, d, n, "the app received exactly what was written");
}

Test(lwip_bigseg, large_segments_reach_the_app_cut_at_its_mss, .fini = teardown)
{
	static uint8_t data[300000];

	start(true, true);
	connect_app(65535);
	cr_assert_eq(counter("big_conns"), 1);
	pattern(data, sizeof(data), 1);
	send_all(data, 0, sizeof(data), 65535);
	cr_assert_leq(max_piece, MSS, "no piece beyond the app's MSS");
	cr_assert_geq(counter("gso_big_packets"), 4, "large segments went out");
	/* 300000 bytes in segments of 46 * 1400 = 64400: about 44 pieces each. */
	cr_assert_geq(counter("gso_big_segments"), 4 * 40);
	cr_assert_eq(counter("big_to_wire"), 0);
	cr_assert_eq(counter("drop_too_big"), 0);
}

/* With a driver that takes frames lent (the ring), lwIP's large segments that are one pbuf
 * of their own (a write that started the segment; one that filled a partly sent one is a
 * chain, copied out as before) go from that memory: each is written at the end of the loop
 * pass that made it (nothing is left lent after a pass), and the app receives exactly what
 * was written. Writes of whole large segments make every one of them lent. */
Test(lwip_bigseg, large_segments_lent_and_written_by_the_pass_end, .fini = teardown)
{
	static uint8_t data[8 * 46 * MSS]; /* within DATA_MAX */
	const size_t big = 46 * MSS;

	start_lend(true, true, true);
	connect_app(65535);
	pattern(data, sizeof(data), 11);
	for (size_t done = 0; done < sizeof(data); done += big) {
		cr_assert_eq(acc->ops->write(acc, data + done, big), (ssize_t)big);
		run();
		cr_assert_eq(nlent, 0, "nothing left lent after a pass");
		size_t edge = 0;
		while (edge < done + big && seen[edge])
			edge++;
		ack((uint32_t)edge, 65535);
		cr_assert_eq(nlent, 0);
	}
	send_all(data, sizeof(data), 0, 65535); /* the rest acknowledged */
	cr_assert_arr_eq(got, data, sizeof(data));
	cr_assert_eq(lent_total, 8, "every large segment lent");
	cr_assert_eq(counter("big_lent"), 8);
	cr_assert_eq(frames_big, 8);
	cr_assert_eq(counter("gso_big_packets"), 8);
	cr_assert_geq(lent_flushes, 1);
}

/* Writes shorter than a large segment that cannot go yet (the window is shut) fill one
 * segment of one pbuf, not a chain: the first of them is given the room of a whole segment,
 * and the next ones are copied into it. When the window opens, that segment is lent like one
 * written whole, the app receives every byte in order, and the last byte comes with PSH
 * (the writes were made with "more to come", which leaves it off). */
Test(lwip_bigseg, short_writes_held_back_fill_one_lent_segment, .fini = teardown)
{
	static uint8_t data[1000 + 2 * 46 * MSS];
	const size_t parts[] = { 20000, 20000, 24400, 7000, 30000, 27400 }; /* 2 x 46 MSS */
	size_t at = 1000;

	start_lend(true, true, true);
	connect_app(65535);
	pattern(data, sizeof(data), 12);
	cr_assert_eq(acc->ops->write(acc, data, 1000), 1000);
	run();
	ack(1000, 0); /* everything acknowledged, the window shut */
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		cr_assert_eq(acc->ops->write(acc, data + at, parts[i]), (ssize_t)parts[i]);
		at += parts[i];
		run();
	}
	cr_assert_eq(at, sizeof(data));
	cr_assert_eq(counter("gso_big_packets"), 0, "nothing went into a shut window");
	ack(1000, 65535);
	size_t edge = 0;
	while (edge < sizeof(data) && seen[edge])
		edge++;
	cr_assert_eq(edge, sizeof(data), "both segments went once the window opened");
	ack((uint32_t)edge, 65535);
	cr_assert_arr_eq(got, data, sizeof(data));
	cr_assert_eq(counter("gso_big_packets"), 2);
	cr_assert_eq(lent_total, 2, "each segment made of short writes was one pbuf, lent");
	cr_assert_eq(counter("big_lent"), 2);
	cr_assert_eq(frames_big, 2);
	cr_assert_eq(push_end, sizeof(data), "PSH with the last byte written");
}

/* A lent frame keeps its memory after lwIP is done with the segment: the connection is reset
 * while two large segments are still lent (the driver's round not made yet), lwIP frees
 * them, and the frames written afterwards are still the bytes that were sent. */
Test(lwip_bigseg, a_lent_frame_outlives_its_connection, .fini = teardown)
{
	static uint8_t data[2 * 46 * MSS];
	const size_t big = 46 * MSS;

	start_lend(true, true, true);
	connect_app(65535);
	pattern(data, sizeof(data), 12);
	lend_hold = true;
	cr_assert_eq(acc->ops->write(acc, data, big), (ssize_t)big);
	run();
	cr_assert_eq(acc->ops->write(acc, data + big, big), (ssize_t)big);
	run();
	cr_assert_eq(lent_total, 2, "two large segments, lent");
	cr_assert_eq(frames_big, 0, "none written yet");
	acc->ops->abort(acc);
	acc = NULL;
	run();
	deliver_lent();
	cr_assert_eq(frames_big, 2);
	cr_assert_arr_eq(got, data, sizeof(data), "written after the reset, still intact");
}

/* The small packets lwIP emits as they are (its SYN-ACKs here; pure ACKs and window updates
 * in a transfer) are copied into frames of the stack's own and lent, to go with the pass's
 * other writes in one round: held until the driver writes them, then arriving intact
 * (piece() checks the checksums). More of them at once than the stack has frames (16) are
 * written at once instead, none lost; frames come back when the driver is done with them. */
Test(lwip_bigseg, small_packets_lent_in_frames_of_the_stack, .fini = teardown)
{
	start_lend(true, true, true);
	lend_hold = true;
	syn_from(0);
	cr_assert_eq(synack_len, 0, "the SYN-ACK is lent, not written yet");
	cr_assert_eq(nlent, 1);
	cr_assert_eq(counter("small_lent"), 1);
	deliver_lent();
	cr_assert_gt(synack_len, 0, "written with the driver's round");
	cr_assert_eq(pieces, 1);

	for (uint16_t i = 1; i <= 20; i++)
		syn_from(i);
	cr_assert_eq(nlent, 16, "as many lent as the stack has frames");
	cr_assert_eq(counter("small_lent"), 17);
	cr_assert_eq(pieces, 1 + 4, "the other four written at once");
	deliver_lent();
	cr_assert_eq(pieces, 1 + 20, "every SYN-ACK written once");
	syn_from(21);
	cr_assert_eq(nlent, 1, "the frames came back: lent again");
	cr_assert_eq(counter("small_lent"), 18);
	deliver_lent();
	cr_assert_eq(pieces, 22);
	cr_assert_eq(lent_total, 0, "no super-packet in a handshake");
}

/* The driver's ring loses the round the lent frames were in (core/driver.h): each comes back
 * lost, and the kernel may still read it. The large segment's pbuf and the small frame stay
 * allocated after the connection, the stack and the budget are gone — still holding what was
 * lent (AddressSanitizer would see a freed block read) — the segment's charge abandoned, so
 * the budget closes; nothing is reported leaked. */
Test(lwip_bigseg, frames_lost_with_the_drivers_round_outlive_the_stack, .fini = teardown)
{
	static uint8_t data[46 * MSS], copy[2][46 * MSS + 256];
	const uint8_t *at[2];
	size_t len[2], n;
	struct budget_stats st;

	start_lend(true, true, true);
	connect_app(65535);
	pattern(data, sizeof(data), 14);
	lend_hold = true;
	cr_assert_eq(acc->ops->write(acc, data, sizeof(data)), (ssize_t)sizeof(data));
	run();
	syn_from(1); /* its SYN-ACK: a small frame */
	cr_assert_eq(nlent, 2);
	cr_assert_eq(lent_total, 1);
	cr_assert_eq(lent_small, 2, "the first SYN-ACK's and this one");
	budget_get_stats(bud, &st);
	cr_assert_eq(st.buffer_bytes_abandoned, 0);
	n = nlent;
	nlent = 0;
	for (size_t i = 0; i < n; i++) {
		at[i] = lentq[i].pkt;
		len[i] = lentq[i].len;
		cr_assert_leq(len[i], sizeof(copy[i]));
		memcpy(copy[i], at[i], len[i]);
		lentq[i].release(lentq[i].arg, true);
	}
	budget_get_stats(bud, &st);
	cr_assert_gt(st.buffer_bytes_abandoned, sizeof(data), "the large segment's block");
	lend_hold = false; /* the ring is gone: what is lent from now on is written */
	acc->ops->abort(acc);
	acc = NULL;
	run();
	lwip_stack_ops.free(ns);
	ns = NULL;
	budget_get_stats(bud, &st);
	cr_assert_eq(st.buffer_bytes_in_use, st.buffer_bytes_abandoned);
	budget_free(bud);
	bud = NULL;
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(memcmp(at[i], copy[i], len[i]), 0, "lost frame %zu untouched", i);
	CHECK_LEAKS();
}

Test(lwip_bigseg, a_retransmission_returns_the_connection_to_mss_sized_segments,
     .fini = teardown)
{
	static uint8_t data[200000], more[100000];
	const uint16_t wnd = 1016; /* 130048 bytes: two large segments */
	const uint32_t big = 46 * MSS;
	uint64_t bigs;
	uint8_t one[1000];

	start(true, true);
	connect_app(wnd);
	pattern(data, sizeof(data), 2);
	pattern(one, sizeof(one), 3);
	pattern(more, sizeof(more), 4);
	/* A, B, C of 64400 bytes and D of 6800; the first cwnd (2 segments) sends A and B. */
	cr_assert_eq(acc->ops->write(acc, data, sizeof(data)), (ssize_t)sizeof(data));
	run();
	cr_assert_eq(counter("gso_big_packets"), 2);
	for (int i = 0; i < 3; i++)
		ack(0, wnd); /* A is lost: the third duplicate ACK sends it again */
	cr_assert_eq(counter("gso_big_packets"), 3, "A retransmitted whole");
	cr_assert_eq(counter("big_to_wire"), 0);
	ack(0, wnd);
	cr_assert_eq(counter("big_to_wire"), 1, "the next segment in sees the retransmission");
	cr_assert_eq(acc->ops->write(acc, one, sizeof(one)), -EAGAIN,
		     "D (6800 bytes) is the last unsent segment: nothing is appended to it");
	ack(big, wnd); /* A arrived: C goes (B + C fill the window), D waits */
	cr_assert_eq(counter("gso_big_packets"), 4);
	cr_assert_eq(acc->ops->write(acc, one, sizeof(one)), -EAGAIN);
	ack(3 * big, wnd); /* B and C: D goes, cut at the MSS too */
	cr_assert_eq(counter("gso_big_packets"), 5);
	cr_assert_eq(acc->ops->write(acc, one, sizeof(one)), (ssize_t)sizeof(one),
		     "nothing unsent: writes go on, in MSS-sized segments");
	run();
	ack((uint32_t)sizeof(data) + sizeof(one), wnd);
	cr_assert_arr_eq(got, data, sizeof(data));
	cr_assert_arr_eq(got + sizeof(data), one, sizeof(one));
	bigs = counter("gso_big_packets");
	cr_assert_eq(bigs, 5);
	send_all(more, sizeof(data) + sizeof(one), sizeof(more), wnd);
	cr_assert_eq(counter("gso_big_packets"), bigs, "no large segment after the return");
	cr_assert_gt(counter("gso_train_segments"), 0, "MSS-sized segments still go in trains");
	cr_assert_leq(max_piece, MSS);
	cr_assert_eq(counter("big_to_wire"), 1);
}

Test(lwip_bigseg, off_without_offload_or_when_configured_off, .fini = teardown)
{
	static uint8_t data[100000];

	start(false, true);
	connect_app(65535);
	cr_assert_eq(counter("big_conns"), 0, "no offload: nobody to cut them");
	pattern(data, sizeof(data), 5);
	send_all(data, 0, sizeof(data), 65535);
	cr_assert_leq(max_piece, MSS);
	cr_assert_eq(frames_big, 0);
	teardown();

	start(true, false);
	connect_app(65535);
	cr_assert_eq(counter("big_conns"), 0, "tun.large_segments false");
	send_all(data, 0, sizeof(data), 65535);
	cr_assert_leq(max_piece, MSS);
	cr_assert_eq(counter("gso_big_packets"), 0);
	cr_assert_gt(counter("gso_train_segments"), 0);
}

/* An app announcing a tiny MSS keeps lwIP's own segments: no super-packet of a hundred tiny
 * pieces. */
Test(lwip_bigseg, a_tiny_mss_keeps_mss_sized_segments, .fini = teardown)
{
	struct tu_spec s;
	struct pkt_view v;

	start(true, true);
	tu_spec_tcp(&s, cli, CPORT, srv, SPORT);
	s.tcp_flags = TCP_SYN;
	s.seq = 1000;
	s.ack = 0;
	s.mss = 500;
	feed(&s);
	cr_assert_eq(pkt_parse(&v, synack, synack_len), PKT_OK);
	iss = tu_get32(v.l4 + 4);
	ack(0, 65535);
	cr_assert_not_null(acc);
	cr_assert_eq(counter("big_conns"), 0);
}

/* Nothing in flight and a window of ten MSS: a 30000-byte write is one large segment that does
 * not fit. It is cut to the window and sent at once (lwIP alone would wait for its persist
 * timer); the window the app opens next takes the next cut, also at once. */
Test(lwip_bigseg, a_small_window_gets_what_fits_at_once, .fini = teardown)
{
	static uint8_t data[30000];
	const uint16_t small = 109; /* 109 << 7 = 13952 bytes: 9 segments of 1400 */

	start(true, true);
	connect_app(65535);
	pattern(data, sizeof(data), 6);
	/* 1000 bytes first: their ACK shrinks the window (lwIP takes a smaller window only from
	 * an ACK that moves). The app has seen a window of 8 MB, so lwIP cuts 64400-byte
	 * segments. */
	cr_assert_eq(acc->ops->write(acc, data, 1000), 1000);
	run();
	ack(1000, small);
	cr_assert_eq(acc->ops->write(acc, data + 1000, sizeof(data) - 1000),
		     (ssize_t)(sizeof(data) - 1000));
	run();
	cr_assert_eq(counter("big_window_splits"), 1);
	size_t edge = 0;
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, 1000 + 9 * MSS, "what fits the window went at once");
	ack((uint32_t)edge, small); /* the app took it all and opens the same window again */
	cr_assert_eq(counter("big_window_splits"), 2, "the input that opens the window cuts");
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, 1000 + 18 * MSS);
	ack((uint32_t)edge, 65535);
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, sizeof(data));
	cr_assert_arr_eq(got, data, sizeof(data));
	cr_assert_leq(max_piece, MSS);
}

/* A short segment of the large-segment era still unsent when the connection goes back to the
 * wire MSS keeps the room its pbuf was given for more (TCP_OVERSIZE, up to one MSS beyond the
 * wire size): the next write must not count on it (lwIP's tcp_write asserts otherwise). */
Test(lwip_bigseg, a_short_segment_left_from_the_large_era_takes_the_next_write,
     .fini = teardown)
{
	static uint8_t data[70000];
	uint8_t one[1000];

	start(true, true);
	connect_app(1016);
	pattern(data, sizeof(data), 7);
	pattern(one, sizeof(one), 8);
	cr_assert_eq(acc->ops->write(acc, data, 1000), 1000);
	run();
	ack(1000, 508); /* a window of 65024: one large segment */
	/* 64400 + 1235 bytes: the second segment, written with "more to come", gets spare
	 * room; it cannot go (the window is full). */
	cr_assert_eq(acc->ops->write(acc, data + 1000, 65635), 65635);
	run();
	for (int i = 0; i < 4; i++)
		ack(1000, 508); /* three duplicates: the large one again; the fourth sees it */
	cr_assert_eq(counter("big_to_wire"), 1);
	ack(1000 + 64400, 0); /* acknowledged, window closed: the short one stays unsent */
	cr_assert_eq(acc->ops->write(acc, one, sizeof(one)), (ssize_t)sizeof(one),
		     "appended to the short segment, within the wire MSS");
	ack(1000 + 64400, 508);
	size_t edge = 0;
	for (int i = 0; i < 10 && edge < 66635 + sizeof(one); i++) {
		while (seen[edge])
			edge++;
		ack((uint32_t)edge, 508);
	}
	cr_assert_eq(edge, 66635 + sizeof(one));
	cr_assert_arr_eq(got, data, 66635);
	cr_assert_arr_eq(got + 66635, one, sizeof(one));
	cr_assert_leq(max_piece, MSS);
}

/* Our side closed (FIN queued behind the data, FIN_WAIT_1): a small window still gets what
 * fits at once, and the FIN goes with the last byte. */
Test(lwip_bigseg, a_small_window_after_our_fin, .fini = teardown)
{
	static uint8_t data[30000];
	const uint16_t small = 109;
	size_t edge = 0;

	start(true, true);
	connect_app(65535);
	pattern(data, sizeof(data), 9);
	cr_assert_eq(acc->ops->write(acc, data, 1000), 1000);
	run();
	ack(1000, small);
	cr_assert_eq(acc->ops->write(acc, data + 1000, sizeof(data) - 1000),
		     (ssize_t)(sizeof(data) - 1000));
	cr_assert_eq(acc->ops->shutdown_write(acc), 0);
	run();
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, 1000 + 9 * MSS);
	ack((uint32_t)edge, small);
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, 1000 + 18 * MSS, "the window the app opened was used at once");
	cr_assert_geq(counter("big_window_splits"), 2);
	ack((uint32_t)edge, 65535);
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, sizeof(data));
	cr_assert(fin_seen, "the FIN came with the last byte");
	cr_assert_eq(fin_at, sizeof(data), "the FIN stands after the last byte");
	cr_assert_eq(counter("split_fin_moved"), 1, "the cut after our FIN: sent without it");
	cr_assert_arr_eq(got, data, sizeof(data));
}

/* The app resets its connection while lwIP has large segments queued: lwIP frees the pcb inside
 * the input the hook noted it for; nothing touches it afterwards (AddressSanitizer builds
 * check the memory), and the stack goes on with the next connection. */
Test(lwip_bigseg, a_reset_frees_the_pcb_the_input_noted, .fini = teardown)
{
	static uint8_t data[200000];
	struct tu_spec s;

	start(true, true);
	connect_app(1016);
	pattern(data, sizeof(data), 10);
	cr_assert_eq(acc->ops->write(acc, data, sizeof(data)), (ssize_t)sizeof(data));
	run();
	tu_spec_tcp(&s, cli, CPORT, srv, SPORT);
	s.tcp_flags = TCP_RST | TCP_ACK;
	s.seq = 1001;
	s.ack = iss + 1;
	feed(&s);
	acc->ops->abort(acc);
	acc = NULL;
	synack_len = 0;
	connect_app(65535);
	cr_assert_eq(counter("big_conns"), 2);
	cr_assert_eq(acc->ops->write(acc, data, 100000), 100000);
	run();
	cr_assert_geq(counter("gso_big_packets"), 3);
}

/* Without large segments too: lwIP's persist timer cuts a queued segment that the window
 * cannot take (nothing in flight) to the window's size. When that segment carries our FIN, the
 * FIN belongs to the second part only; the app's TCP would end the stream at the first. */
Test(lwip_bigseg, a_segment_cut_by_the_persist_timer_keeps_its_fin_at_the_end, .fini = teardown)
{
	static uint8_t data[1000 + MSS];
	size_t edge = 0;

	start(true, false);
	connect_app(65535);
	pattern(data, sizeof(data), 11);
	cr_assert_eq(acc->ops->write(acc, data, 1000), 1000);
	run();
	ack(1000, 5); /* a window of 640 bytes: less than the next segment */
	cr_assert_eq(acc->ops->write(acc, data + 1000, MSS), MSS);
	cr_assert_eq(acc->ops->shutdown_write(acc), 0); /* the FIN rides on that segment */
	run();
	cr_assert_not(seen[1000], "the segment does not fit: it waits");
	for (int i = 0; i < 8; i++)
		lwip_stack_tick(ns); /* three slow ticks: the persist timer cuts and sends */
	run();
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, 1000 + 640, "the window's worth went");
	ack((uint32_t)edge, 65535);
	while (seen[edge])
		edge++;
	cr_assert_eq(edge, sizeof(data));
	cr_assert(fin_seen);
	cr_assert_eq(fin_at, sizeof(data), "the FIN stands after the last byte");
	cr_assert_arr_eq(got, data, sizeof(data));
	cr_assert_eq(counter("split_fin_moved"), 1);
}

/* ---- the ACKs the app's super-packets are owed (stacks/lwip/lwip_ackq.h) ---- */

/* n bytes of the app's upload from offset at (after its ISN 1000), as one super-packet the
 * kernel handed the TUN (GSO at the app's MSS, checksum verified), read in the current pass:
 * the driver's batch is not over until batch_end. */
static uint8_t uploaded[256 * 1024]; /* the upload's bytes by offset */

static int upload_ext; /* IPv6 extension headers on the next uploads (HBH, DestOpts, ...) */

static void upload(uint32_t at, size_t n)
{
	static uint8_t sbuf[TU_PKT_MAX];
	uint8_t *buf = sbuf, *pl = uploaded + at;
	struct pkt_meta m = { .flags = PKT_META_DATA_VALID,
			      .gso_type = v6_on ? PKT_GSO_TCPV6 : PKT_GSO_TCPV4, .gso_size = MSS };
	struct pkt_view view;
	struct tu_spec s;
	bool plain = false;
	size_t ol = 0, len;

	cr_assert_leq(at + n, sizeof(uploaded));
	pattern(pl, n, at);
	tu_spec_tcp(&s, cli, CPORT, srv, SPORT);
	s.tcp_flags = TCP_ACK | TCP_PSH;
	s.seq = 1001 + at;
	s.ack = iss + 1;
	s.window = 2000;
	s.payload = pl;
	s.payload_len = n;
	for (int i = 0; i < upload_ext; i++)
		s.ext[s.ext_n++] = (struct tu_ext){ i % 2 ? 60 : 0, 0 };
	if (rx_on) {
		rx_cur = malloc(sizeof(*rx_cur) + TUN_VNET_HDR_LEN + TU_PKT_MAX);
		cr_assert_not_null(rx_cur);
		rx_cur->free = rxbuf_free;
		buf = rx_cur->frame + TUN_VNET_HDR_LEN;
	}
	len = tu_build(&s, buf, TU_PKT_MAX);
	lwip_stack_ops.input(ns, 0, buf, len, &m, 0, &ol, &plain, &view);
	if (rx_cur) { /* not taken: the driver reads into it again */
		free(rx_cur);
		rx_cur = NULL;
	}
}

/* The reader (the relay) takes n bytes of the upload from offset at: the app's bytes. */
static void take(uint32_t at, size_t n)
{
	static uint8_t b[65536];
	size_t done = 0;

	while (done < n) {
		size_t chunk = n - done < sizeof(b) ? n - done : sizeof(b);
		ssize_t r = acc->ops->read(acc, b, chunk);

		cr_assert_gt(r, 0, "read: %zd", r);
		cr_assert_arr_eq(b, uploaded + at + done, (size_t)r, "the app's bytes");
		done += (size_t)r;
	}
}

/* A super-packet is acknowledged once, at the end of the loop pass that read it: not inside
 * the input (no ACK before the batch ends, none at batch_end) but when the loop runs the
 * callbacks the batch made active, the relay's first. */
Test(lwip_bigseg, a_super_packet_is_acknowledged_at_the_end_of_its_pass, .fini = teardown)
{
	size_t before;

	start(true, false);
	connect_app(2000);
	before = acks;
	upload(0, 30000);
	cr_assert_eq(acks, before, "no ACK inside the input");
	lwip_stack_ops.batch_end(ns, 0, 0);
	cr_assert_eq(acks, before, "none at the batch's end either");
	run();
	cr_assert_eq(acks, before + 1, "one ACK at the end of the pass");
	cr_assert_eq(last_ack, 30000);
	cr_assert_eq(counter("gso_acks_pass_end"), 1);
	cr_assert_eq(counter("gso_quick_acks"), 1);
	cr_assert_eq(counter("gso_acks_at_once"), 0);
	run();
	cr_assert_eq(acks, before + 1, "and only one");
	take(0, 30000);
}

/* The window the relay opens in the pass rides on the same ACK: the second super-packet's
 * pass sends one segment, the acknowledgement with the window update, where acknowledging at
 * once sent two (the ACK, then the update), and where the update would otherwise go out
 * inside the read, before the reader has taken all it will. */
Test(lwip_bigseg, the_ack_carries_the_window_the_reader_opened, .fini = teardown)
{
	size_t before;

	start(true, false);
	connect_app(2000);
	upload(0, 40000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(last_ack, 40000);
	cr_assert_lt(last_wnd, TCP_WND - 30000, "40,000 bytes wait for the reader: %u", last_wnd);
	before = acks;
	upload(40000, 40000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	take(0, 80000); /* the relay, first in the pass */
	cr_assert_eq(acks, before, "the read sends nothing: its update waits for the pass's end");
	cr_assert_gt(counter("wnd_updates_held"), 0);
	run();
	cr_assert_eq(acks, before + 1, "one segment for the pass, %zu", acks - before);
	cr_assert_eq(last_ack, 80000);
	cr_assert_geq(last_wnd + (1u << TCP_RCV_SCALE), TCP_WND - 80000 + UPDATE_THRESHOLD_SCALED,
		      "it announces the quarter of the window the reader opened: %u", last_wnd);
	cr_assert_eq(counter("gso_acks_pass_end"), 2, "each pass's flush sent its one segment");
}

/* Two super-packets of one connection in one pass: lwIP acknowledges every second segment at
 * once, inside the input; the queue holds that ACK too, and the pass sends one segment for
 * both. */
Test(lwip_bigseg, two_super_packets_in_a_pass_get_one_ack, .fini = teardown)
{
	size_t before;

	start(true, false);
	connect_app(2000);
	before = acks;
	upload(0, 30000);
	upload(30000, 30000);
	upload(60000, 30000);
	cr_assert_eq(acks, before, "no ACK inside the input");
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(acks, before + 1, "one ACK for the pass, %zu", acks - before);
	cr_assert_eq(last_ack, 90000);
	cr_assert_eq(counter("gso_quick_acks"), 3);
	cr_assert_eq(counter("gso_acks_pass_end"), 1);
	take(0, 90000);
}

/* The relay writes download data in the pass (the other direction of the same connection):
 * that segment carries the acknowledgement of both super-packets, the one lwIP owed for the
 * first (held in the queue) included, and the end of the pass has nothing left to send. */
Test(lwip_bigseg, a_data_segment_in_the_pass_carries_the_held_ack, .fini = teardown)
{
	static uint8_t d[1000];
	size_t before, data_before;

	start(true, false);
	connect_app(2000);
	before = acks;
	upload(0, 30000);
	upload(30000, 30000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	data_before = pieces;
	pattern(d, sizeof(d), 5);
	cr_assert_eq(acc->ops->write(acc, d, sizeof(d)), (ssize_t)sizeof(d));
	run();
	cr_assert_gt(pieces, data_before, "the write went out");
	cr_assert_eq(last_data_ack, 60000, "it acknowledges both super-packets");
	cr_assert_eq(acks, before, "no pure ACK besides");
	cr_assert_eq(counter("gso_acks_pass_end"), 0, "the flush had nothing left to send");
	take(0, 60000);
}

/* The reader takes bytes outside a batch (its outbound socket became writable): the window
 * update waits for the end of that loop pass, then goes as one segment; a read that opens less
 * than a quarter of the window sends nothing, as lwIP's own test would. */
Test(lwip_bigseg, a_read_outside_a_batch_updates_the_window_at_the_end_of_its_pass,
     .fini = teardown)
{
	size_t before;

	start(true, false);
	connect_app(2000);
	upload(0, 40000);
	upload(40000, 40000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(last_ack, 80000);
	before = acks;
	take(0, 20000);
	run();
	cr_assert_eq(acks, before, "20,000 bytes: under a quarter of the window, no update");
	take(20000, 60000);
	cr_assert_eq(acks, before, "none inside the read");
	run();
	cr_assert_eq(acks, before + 1, "one update at the end of the pass");
	cr_assert_eq(last_ack, 80000);
	cr_assert_geq(last_wnd + (1u << TCP_RCV_SCALE), TCP_WND, "the whole window: %u", last_wnd);
}

/* A connection that builds large segments has a pcb->mss of ~46 wire MSS, and lwIP moves the
 * window's right edge only by at least pcb->mss: the app would see up to that much less window
 * than the reader has opened. The edge moves by the wire MSS instead, on every segment sent:
 * the reader takes 20,000 bytes (under the explicit update's quarter, nothing is sent), and the
 * next ACK announces them. */
Test(lwip_bigseg, the_window_edge_moves_by_the_wire_mss_with_large_segments, .fini = teardown)
{
	start(true, true);
	connect_app(2000);
	cr_assert_eq(counter("big_conns"), 1);
	upload(0, 40000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(last_ack, 40000);
	cr_assert_leq(last_wnd, TCP_WND - 40000, "%u", last_wnd);
	take(0, 20000);
	run();
	upload(40000, 10000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(last_ack, 50000);
	cr_assert_geq(last_wnd + (1u << TCP_RCV_SCALE), TCP_WND - 30000,
		      "30,000 bytes wait for the reader, the rest is announced: %u", last_wnd);
	cr_assert_leq(last_wnd, TCP_WND - 30000);
	cr_assert_eq(counter("big_window_edges"), 1, "that ACK's edge moved by the wire MSS");
	/* The same on a data segment the stack sends (the window rides on every segment): the
	 * reader takes 10,000 more, the stream writes. */
	take(20000, 10000);
	run();
	{
		static uint8_t d[1000];
		size_t before = pieces;

		pattern(d, sizeof(d), 3);
		cr_assert_eq(acc->ops->write(acc, d, sizeof(d)), (ssize_t)sizeof(d));
		run();
		cr_assert_gt(pieces, before, "the write went out");
	}
	cr_assert_geq(last_data_wnd + (1u << TCP_RCV_SCALE), TCP_WND - 20000, "%u", last_data_wnd);
	take(30000, 20000);
}

/* A pcb freed between its super-packet and the end of the pass (the app reset it) leaves the
 * queue: the flush sends nothing and touches nothing freed (the ASan tree runs this). */
Test(lwip_bigseg, a_pcb_reset_before_the_end_of_the_pass_is_skipped, .fini = teardown)
{
	struct tu_spec s;

	start(true, false);
	connect_app(2000);
	upload(0, 20000);
	tu_spec_tcp(&s, cli, CPORT, srv, SPORT);
	s.tcp_flags = TCP_RST;
	s.seq = 1001 + 20000;
	s.ack = 0;
	feed(&s); /* runs the loop too: the pass ends */
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(counter("gso_acks_pass_end"), 0);
	acc->ops->abort(acc);
	acc = NULL;
}

/* ---- super-packets fed in the driver's read buffer (env.rx_take) ---- */

/* A super-packet of 32 KiB or more goes to lwIP where it was read, uncopied; a smaller one is
 * copied and its buffer left to the driver. The app's bytes reach the reader intact either
 * way, and the taken buffer is given back once the reader has them all. */
Test(lwip_bigseg, a_large_super_packet_is_fed_uncopied, .fini = teardown)
{
	rx_on = true;
	start(true, false);
	connect_app(2000);
	upload(0, 40000);
	upload(40000, 20000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(last_ack, 60000, "both acknowledged");
	cr_assert_eq(rx_taken, 1, "only the one of 32 KiB or more");
	cr_assert_eq(counter("rx_taken"), 1);
	cr_assert_eq(rx_freed, 0, "held while its bytes wait for the reader");
	take(0, 30000);
	cr_assert_eq(rx_freed, 0, "held while some of its bytes wait");
	take(30000, 30000);
	cr_assert_eq(rx_freed, 1, "given back once read");
}

/* A taken buffer whose bytes were never read goes back when the connection is reset and the
 * session aborted (the ASan tree runs this: nothing freed is touched, nothing leaks). */
Test(lwip_bigseg, a_taken_buffer_goes_back_when_its_connection_resets, .fini = teardown)
{
	struct tu_spec s;

	rx_on = true;
	start(true, false);
	connect_app(2000);
	upload(0, 50000);
	upload(50000, 50000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(rx_taken, 2);
	tu_spec_tcp(&s, cli, CPORT, srv, SPORT);
	s.tcp_flags = TCP_RST;
	s.seq = 1001 + 100000;
	s.ack = 0;
	feed(&s);
	acc->ops->abort(acc);
	acc = NULL;
	run();
	cr_assert_eq(rx_freed, 2, "both given back");
}

/* A taken super-packet that arrives ahead of its predecessor waits in lwIP's out-of-order queue
 * in its read buffer; when the missing one arrives both reach the reader intact, in order, and
 * both buffers go back once read. */
Test(lwip_bigseg, a_taken_super_packet_waits_out_of_order, .fini = teardown)
{
	rx_on = true;
	start(true, false);
	connect_app(2000);
	upload(40000, 40000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(rx_taken, 1);
	cr_assert_eq(last_ack, 0, "nothing in order yet");
	upload(0, 40000);
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(rx_taken, 2);
	cr_assert_eq(last_ack, 80000, "the queued one joined");
	take(0, 80000);
	cr_assert_eq(rx_freed, 2, "both given back once read");
}

/* The same over IPv6: a super-packet without extension headers is taken as it is; one with
 * them is copied (lwIP gets it without them), and both reach the reader intact. */
Test(lwip_bigseg, an_ipv6_super_packet_is_taken_unless_it_has_extension_headers,
     .fini = teardown)
{
	rx_on = v6_on = true;
	cli = CLI6;
	srv = SRV6;
	start(true, false);
	connect_app(2000);
	upload(0, 40000);
	upload_ext = 1;
	upload(40000, 40000);
	upload_ext = 0;
	lwip_stack_ops.batch_end(ns, 0, 0);
	run();
	cr_assert_eq(last_ack, 80000, "both acknowledged");
	cr_assert_eq(rx_taken, 1, "the one without extension headers");
	take(0, 80000);
	cr_assert_eq(rx_freed, 1);
}
