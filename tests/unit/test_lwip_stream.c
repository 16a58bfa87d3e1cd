/* test_lwip_stream.c — the lwIP stream (stacks/lwip/lwip_stream.c) over a real lwIP TCP
 * connection, driven by hand-built packets.
 *
 *   test "app" ──packets──► lwip_stack_ops.input ──► lwIP ──accept hook──► struct stream
 *        ▲                                                                     │
 *        └────────── captured by env.tx (the fake TUN) ◄── lwIP output ◄───────┘
 *
 * The test plays the application behind the TUN: it sends SYN/ACK/data/FIN/RST segments to an
 * arbitrary destination, parses what lwIP emits (sequence numbers, flags, advertised window)
 * and acknowledges it. The stream's owner callbacks record what they see. lwIP is process-
 * global; Criterion runs every test in its own process, so each starts with a fresh lwIP.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/evmem.h"
#include "core/pkt.h"
#include "dispatch/stream.h"
#include "stacks/lwip/include/lwipopts.h" /* TCP_WND, TCP_MSS, TCP_SND_BUF, TCP_RCV_SCALE */
#include "stacks/lwip/lwip_glue.h"
#include "stacks/lwip/lwip_stack.h"
#include "stacks/lwip/lwip_stream.h"
#include "failalloc.h"
#include "testutil.h"

/* TCP_WND_UPDATE_THRESHOLD of a connection with window scaling (lwipopts.h). */
#define UPDATE_THRESHOLD_SCALED (TCP_WND / 4)

#define APP "198.18.0.1" /* apps send from the TUN's own address */
#define APP_PORT 40000
#define SRV "93.184.216.34" /* an arbitrary destination: lwIP accepts any */
#define SRV_PORT 8443
#define APP_ISN 1000u
#define APP_WND 65535 /* the app's window (it scales by 0) */

/* lwipopts.h's figures, typed (they are int constants there). */
#define WND ((uint32_t)TCP_WND)
#define SNDBUF ((size_t)TCP_SND_BUF)
#define MSS ((size_t)TCP_MSS)
#define TRAIN_SEGS ((65535 - 40 - 20) / MSS) /* whole segments in one GSO train */

/* ---- the fake TUN: every packet lwIP emits --------------------------------------------------- */

struct cap {
	uint8_t *pkt;
	size_t len;
};

/* A parsed TCP segment from lwIP. */
struct seg {
	uint8_t flags;
	uint32_t seq, ack;
	uint32_t wnd; /* raw field */
	const uint8_t *data;
	size_t len;
};

/* The app's side of the one connection. */
struct conn {
	uint32_t snd_nxt; /* next sequence number the app sends */
	uint32_t rcv_nxt; /* next sequence number expected from lwIP */
	uint32_t snd_una; /* the highest acknowledgement lwIP sent */
	size_t seen;      /* captured packets already consumed by app_receive */
};

/* What the stream's owner callbacks saw. */
struct owner {
	int readable, writable, errors, last_err;
	int inside_lwip;  /* callbacks that ran while lwIP was processing our input: must be 0 */
	size_t read_per_cb; /* readable reads this many bytes (0: read nothing) */
	uint8_t *sink;
	size_t sunk, sink_cap;
};

static struct {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *budget;
	struct netstack *ns;
	struct cap *caps;
	size_t ncaps, capcap;
	struct stream *s;
	struct flow_key key;
	int accepted;
	bool in_lwip;
	struct owner o;
	struct conn c;
	uint64_t mem_base; /* lwIP bytes before the connection */
	void *allocs[8];   /* test buffers, freed by teardown (a failed assert skips the test) */
	size_t nallocs;
	uint64_t held;     /* budget bytes the test holds, released by teardown */
} E;

static void *test_alloc(size_t n)
{
	void *p = malloc(n);

	cr_assert(p && E.nallocs < sizeof(E.allocs) / sizeof(E.allocs[0]));
	E.allocs[E.nallocs++] = p;
	return p;
}

static int tx_capture(void *arg, const uint8_t *pkt, size_t len)
{
	if (E.ncaps == E.capcap) {
		E.capcap = E.capcap ? 2 * E.capcap : 256;
		E.caps = realloc(E.caps, E.capcap * sizeof(*E.caps));
		cr_assert(E.caps);
	}
	E.caps[E.ncaps].pkt = malloc(len);
	cr_assert(E.caps[E.ncaps].pkt);
	memcpy(E.caps[E.ncaps].pkt, pkt, len);
	E.caps[E.ncaps].len = len;
	E.ncaps++;
	return 0;
}

static void seg_parse(size_t i, struct seg *sg)
{
	const uint8_t *p = E.caps[i].pkt;
	struct tu_layout lo;

	cr_assert(tu_layout(p, E.caps[i].len, &lo), "lwIP emitted a malformed packet");
	cr_assert_eq(lo.proto, IPPROTO_TCP);
	cr_assert(tu_verify_l4(p, lo.len), "lwIP's TCP checksum is wrong");
	const uint8_t *t = p + lo.l3_len;
	size_t doff = (size_t)(t[12] >> 4) * 4;
	sg->seq = tu_get32(t + 4);
	sg->ack = tu_get32(t + 8);
	sg->flags = t[13];
	sg->wnd = tu_get16(t + 14);
	sg->data = t + doff;
	sg->len = lo.l4_len - doff;
}

static struct seg last_seg(void)
{
	struct seg sg;

	cr_assert(E.ncaps > 0, "lwIP emitted nothing");
	seg_parse(E.ncaps - 1, &sg);
	return sg;
}

/* ---- the app: inject segments ------------------------------------------------------------------ */

static void inject_spec(const struct tu_spec *sp)
{
	static uint8_t buf[TU_PKT_MAX];
	struct pkt_meta meta = { 0 };
	size_t out_len = 0, len = tu_build(sp, buf, sizeof(buf));
	struct pkt_view v;
	bool plain = false;

	E.in_lwip = true; /* lwIP's callbacks run in here; the owner's must not */
	cr_assert_eq(lwip_stack_ops.input(E.ns, 0, buf, len, &meta, 0, &out_len, &plain, &v),
		     DRIVER_DONE);
	E.in_lwip = false;
}

static void inject(uint8_t flags, uint32_t seq, const void *data, size_t len)
{
	struct tu_spec sp;

	tu_spec_tcp(&sp, APP, APP_PORT, SRV, SRV_PORT);
	sp.tcp_flags = flags;
	sp.seq = seq;
	sp.ack = (flags & TCP_ACK) ? E.c.rcv_nxt : 0;
	sp.window = APP_WND;
	sp.payload = data;
	sp.payload_len = len;
	inject_spec(&sp);
}

/* Data in MSS-sized segments with PSH on the last; advances snd_nxt. */
static void app_send(const uint8_t *data, size_t len)
{
	for (size_t off = 0; off < len; off += MSS) {
		size_t c = len - off < MSS ? len - off : MSS;
		inject(TCP_ACK | (off + c == len ? TCP_PSH : 0), E.c.snd_nxt, data + off, c);
		E.c.snd_nxt += (uint32_t)c;
	}
}

static void app_ack(void)
{
	inject(TCP_ACK, E.c.snd_nxt, NULL, 0);
}

/* One loop iteration, without blocking (NONBLOCK alone keeps iterating while callbacks
 * keep activating, which a level-triggered stream with unread data does). */
static void loop_once(void)
{
	event_base_loop(E.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

static void pump(void)
{
	for (int i = 0; i < 4; i++)
		loop_once();
}

/* Collect in-order payload lwIP sent since the last call (into out), note a FIN; acknowledge
 * nothing yet. Returns the payload bytes taken. */
static size_t app_take(uint8_t *out, size_t cap, bool *fin)
{
	size_t got = 0;

	for (; E.c.seen < E.ncaps; E.c.seen++) {
		struct seg sg;
		seg_parse(E.c.seen, &sg);
		cr_assert_eq(sg.flags & TCP_RST, 0, "unexpected RST from lwIP");
		if ((sg.flags & TCP_ACK) && (int32_t)(sg.ack - E.c.snd_una) > 0)
			E.c.snd_una = sg.ack;
		if (sg.len > 0 && sg.seq == E.c.rcv_nxt) {
			cr_assert_leq(got + sg.len, cap);
			memcpy(out + got, sg.data, sg.len);
			got += sg.len;
			E.c.rcv_nxt += (uint32_t)sg.len;
		}
		if ((sg.flags & TCP_FIN) && sg.seq + sg.len == E.c.rcv_nxt) {
			E.c.rcv_nxt++;
			if (fin)
				*fin = true;
		}
	}
	return got;
}

/* app_take, then acknowledge it all. */
static size_t app_receive(uint8_t *out, size_t cap, bool *fin)
{
	size_t got = app_take(out, cap, fin);

	app_ack();
	return got;
}

/* Write len bytes of in (all accepted), then the app receives and acknowledges them into out,
 * the loop pumped between reads, at most rounds times: they arrive whole and intact. */
static void expect_delivered(const uint8_t *in, uint8_t *out, size_t len, int rounds)
{
	size_t got = 0;

	cr_assert_eq(stream_write(E.s, in, len), (ssize_t)len);
	for (int round = 0; round < rounds && got < len; round++) {
		got += app_receive(out + got, len - got, NULL);
		pump();
	}
	cr_assert_eq(got, len);
	cr_assert_arr_eq(out, in, len);
}

/* ---- the stream's owner -------------------------------------------------------------------------- */

static void on_readable(void *arg)
{
	struct owner *o = arg;

	o->inside_lwip += E.in_lwip;
	o->readable++;
	if (o->read_per_cb) {
		uint8_t tmp[4096];
		size_t n = o->read_per_cb < sizeof(tmp) ? o->read_per_cb : sizeof(tmp);
		ssize_t r = stream_read(E.s, tmp, n);
		if (r > 0 && o->sink) {
			cr_assert_leq(o->sunk + (size_t)r, o->sink_cap);
			memcpy(o->sink + o->sunk, tmp, (size_t)r);
			o->sunk += (size_t)r;
		}
	}
}

static void on_writable(void *arg)
{
	struct owner *o = arg;

	o->inside_lwip += E.in_lwip;
	o->writable++;
}

static void on_error(void *arg, int err)
{
	struct owner *o = arg;

	o->inside_lwip += E.in_lwip;
	o->errors++;
	o->last_err = err;
}

static void on_accept(void *arg, const struct flow_key *key, struct stream *s)
{
	static const struct stream_cbs cbs = { on_readable, on_writable, on_error };

	cr_assert_null(E.s, "one connection per test");
	E.s = s;
	E.key = *key;
	E.accepted++;
	stream_set_callbacks(s, &cbs, &E.o);
}

/* ---- fixture -------------------------------------------------------------------------------------- */

static void setup_json(const char *json)
{
	char err[TS_ERRLEN];
	struct netstack_env env = { 0 };

	memset(&E, 0, sizeof(E));
	cr_assert_eq(config_load_string(json, &E.cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&E.cfg.budget, &E.budget), 0);
	E.base = event_base_new();
	cr_assert(E.base);
	env.base = E.base;
	env.cfg = &E.cfg;
	env.budget = E.budget;
	env.tx = tx_capture;
	env.tun_name = "lwstest0";
	cr_assert_eq(lwip_stack_ops.start(&env, &E.ns, err, sizeof(err)), 0, "%s", err);
	lwip_stack_set_accept_hook(E.ns, on_accept, NULL);
}

static void setup(void)
{
	setup_json("{ \"stack\": \"lwip\" }");
}

static void teardown(void);

/* 2 MiB of buffer bytes: the streams' shared send pool is a sixteenth of it, 128 KiB. The
 * suite's fixture has run first (one lwIP stack per process): replace it. */
#define SMALL_POOL ((size_t)(128u << 10))
static void setup_small_pool(void)
{
	teardown();
	setup_json("{ \"stack\": \"lwip\", \"budgets\": { \"buffer_bytes\": 2097152 } }");
}

static void teardown(void)
{
	if (E.s) {
		stream_abort(E.s);
		lwip_stack_session_end(E.ns);
	}
	if (E.ns)
		lwip_stack_ops.free(E.ns);
	for (size_t i = 0; i < E.ncaps; i++)
		free(E.caps[i].pkt);
	free(E.caps);
	for (size_t i = 0; i < E.nallocs; i++)
		free(E.allocs[i]);
	if (E.base)
		event_base_free(E.base);
	if (E.budget) {
		budget_bytes_release(E.budget, E.held);
		budget_free(E.budget);
	}
	config_fini(&E.cfg);
	CHECK_LEAKS();
}

/* The owner is done with the stream (closed/aborted by the test): release the session. */
static void stream_gone(void)
{
	E.s = NULL;
	lwip_stack_session_end(E.ns);
}

/* SYN (MSS 1440, window scale 0) -> SYN-ACK -> ACK -> the accept hook has the stream. */
/* The app's SYN, with a window scale option (shift 0) or, !wscale, without one (RFC 7323 not
 * negotiated: windows of at most 65535 bytes, unscaled). */
static void handshake_ws(bool wscale)
{
	static const uint8_t ws[4] = { 1, 3, 3, 0 }; /* NOP, window scale shift 0 */
	struct tu_spec sp;
	struct seg sa;

	E.mem_base = lwip_glue_mem_bytes();
	tu_spec_tcp(&sp, APP, APP_PORT, SRV, SRV_PORT);
	sp.tcp_flags = TCP_SYN;
	sp.seq = APP_ISN;
	sp.ack = 0;
	sp.window = APP_WND;
	sp.mss = MSS;
	if (wscale) {
		memcpy(sp.tcp_opts, ws, sizeof(ws));
		sp.tcp_opts_len = sizeof(ws);
	}
	inject_spec(&sp);
	sa = last_seg();
	cr_assert_eq(sa.flags & (TCP_SYN | TCP_ACK | TCP_RST), TCP_SYN | TCP_ACK);
	cr_assert_eq(sa.ack, APP_ISN + 1);
	E.c.snd_nxt = E.c.snd_una = APP_ISN + 1;
	E.c.rcv_nxt = sa.seq + 1;
	E.c.seen = E.ncaps;
	app_ack();
	pump();
	cr_assert_eq(E.accepted, 1, "the accept hook did not get the stream");
	cr_assert_eq(stream_fd(E.s), -1, "an lwIP stream has no fd: copy relay");
	cr_assert_eq(E.key.dport_be, htons(SRV_PORT), "original destination port");
}

static void handshake(void)
{
	handshake_ws(true);
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
	struct tu_rng r;

	tu_rng_seed(&r, seed);
	tu_rand_bytes(&r, buf, len);
}

/* Window (in bytes) advertised by segment sg: scaled after the handshake (RFC 7323). */
static uint32_t wnd_bytes(const struct seg *sg)
{
	return sg->wnd << TCP_RCV_SCALE;
}

TestSuite(lwip_stream, .init = setup, .fini = teardown, .timeout = 60);

/* ---- tests ------------------------------------------------------------------------------------------ */

Test(lwip_stream, reads_exactly_the_payload_and_notifies_outside_lwip)
{
	uint8_t in[5000], out[8000];
	ssize_t n;
	size_t got = 0;

	handshake();
	fill(in, sizeof(in), 1);
	stream_set_interest(E.s, true, false);
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), -EAGAIN, "nothing queued yet");
	app_send(in, sizeof(in));
	cr_assert_eq(E.o.readable, 0, "readable must be deferred to the loop");
	pump();
	cr_assert_geq(E.o.readable, 1);
	cr_assert_eq(E.o.inside_lwip, 0, "an owner callback ran inside lwIP's input");
	/* Odd sizes: reads cross pbuf boundaries and leave partial pbufs. */
	while ((n = stream_read(E.s, out + got, 777)) > 0)
		got += (size_t)n;
	cr_assert_eq(n, -EAGAIN);
	cr_assert_eq(got, sizeof(in));
	cr_assert_arr_eq(out, in, sizeof(in));
	cr_assert_eq(E.o.errors, 0);
}

Test(lwip_stream, readable_is_level_triggered_once_per_iteration)
{
	uint8_t in[3000];
	int before;

	handshake();
	fill(in, sizeof(in), 2);
	app_send(in, sizeof(in));
	pump();
	cr_assert_eq(E.o.readable, 0, "no read interest: no callback");

	E.o.read_per_cb = 1000; /* each callback leaves data behind */
	E.o.sink = test_alloc(sizeof(in));
	E.o.sink_cap = sizeof(in);
	stream_set_interest(E.s, true, false);
	loop_once();
	cr_assert_eq(E.o.readable, 1, "one callback per loop iteration");
	loop_once();
	cr_assert_eq(E.o.readable, 2, "data left: fires again on the next iteration");
	loop_once();
	cr_assert_eq(E.o.readable, 3);
	cr_assert_eq(E.o.sunk, sizeof(in));
	cr_assert_arr_eq(E.o.sink, in, sizeof(in));
	before = E.o.readable;
	pump();
	cr_assert_eq(E.o.readable, before, "drained: no more callbacks");
	stream_set_interest(E.s, false, false);
	app_send(in, 100);
	pump();
	cr_assert_eq(E.o.readable, before, "interest off: no callbacks");
}

/* A slow reader: the window lwIP advertises shrinks by what is queued, lwIP memory stays within
 * the window even when the app overruns it, and reading reopens the window. */
Test(lwip_stream, window_shrinks_until_read_and_memory_stays_bounded)
{
	const size_t total = 2 * WND;
	uint8_t *in = test_alloc(total), *out = test_alloc(total);
	uint64_t mem_full, mem_over;
	size_t got = 0;
	ssize_t n;
	struct seg sg;

	handshake();
	fill(in, total, 3);

	app_send(in, WND / 2);
	lwip_stack_tick(E.ns); /* flush a delayed ACK */
	sg = last_seg();
	cr_assert_eq(sg.ack, APP_ISN + 1 + WND / 2);
	cr_assert_leq(wnd_bytes(&sg), WND - WND / 2, "window did not shrink");
	cr_assert_gt(wnd_bytes(&sg) + (1u << TCP_RCV_SCALE), WND - WND / 2);

	app_send(in + WND / 2, WND / 2);
	lwip_stack_tick(E.ns);
	sg = last_seg();
	cr_assert_eq(sg.ack, APP_ISN + 1 + WND, "lwIP took the whole window");
	cr_assert_eq(sg.wnd, 0, "an unread full window is advertised as zero");
	mem_full = lwip_glue_mem_bytes();
	cr_log_info("lwIP holds %llu bytes for a full %u-byte window",
		    (unsigned long long)(mem_full - E.mem_base), WND);
	/* Packets are held whole (headers + pbuf): allow 15 % over the payload. */
	cr_assert_leq(mem_full - E.mem_base, WND + WND / 100 * 15,
		      "lwIP holds %llu bytes for a %u-byte window",
		      (unsigned long long)(mem_full - E.mem_base), WND);

	/* The app ignores the zero window: nothing more is queued anywhere. */
	app_send(in + WND, WND);
	E.c.snd_nxt = APP_ISN + 1 + WND; /* lwIP dropped it: the app will resend */
	mem_over = lwip_glue_mem_bytes();
	cr_assert_leq(mem_over, mem_full + 4096, "lwIP memory grew past the window");
	sg = last_seg();
	cr_assert_eq(sg.ack, APP_ISN + 1 + WND);
	cr_assert_eq(sg.wnd, 0);

	/* Read in chunks larger than 64 KiB: tcp_recved must be chunked to u16. */
	size_t before = E.ncaps;
	while ((n = stream_read(E.s, out + got, 100000)) > 0)
		got += (size_t)n;
	cr_assert_eq(n, -EAGAIN);
	cr_assert_eq(got, WND, "the stream queued exactly the window");
	cr_assert_arr_eq(out, in, WND);
	cr_assert_gt(E.ncaps, before, "reading must send a window update");
	sg = last_seg();
	/* Updates go out per quarter of the window taken: what is left unannounced is less. */
	cr_assert_gt(wnd_bytes(&sg), WND - UPDATE_THRESHOLD_SCALED,
		     "the window reopens after the read (%u of %u)", wnd_bytes(&sg), WND);
	cr_assert_leq(lwip_glue_mem_bytes(), E.mem_base + 4096, "read pbufs were freed");

	/* The app resends what was dropped; it arrives intact. */
	app_send(in + WND, WND);
	while ((n = stream_read(E.s, out + got, 100000)) > 0)
		got += (size_t)n;
	cr_assert_eq(got, total);
	cr_assert_arr_eq(out, in, total);
}

/* Gather (peekv, skip): views of the queued pbufs give exactly the payload, cut at n and at the
 * iovec count, take nothing; skip takes what a read of that size would, without a copy, and
 * opens the window as a read does; at the app's FIN peekv says 0. */
/* A shut window reopens by explicit updates, one per quarter of the window the reader takes:
 * not one per few KiB (each is a TUN write and the application's ACK processing), and never
 * none (a shut window always has the whole window queued, so the quarter always comes). */
/* Without window scaling the window is at most 65535 bytes: a quarter of TCP_WND (64 KiB) can
 * never be taken from it, so the update threshold is a quarter of the window the connection
 * has. A shut window drained whole is announced at once, not when the app's zero-window probe
 * (backing off up to 120 s) happens to come. */
Test(lwip_stream, window_update_without_window_scaling)
{
	const size_t w = 65535;
	uint8_t *in = test_alloc(w), *out = test_alloc(w);
	size_t got = 0, before;
	struct seg sg;
	ssize_t n;

	handshake_ws(false);
	fill(in, w, 5);
	app_send(in, w);
	lwip_stack_tick(E.ns);
	sg = last_seg();
	cr_assert_eq(sg.wnd, 0, "the window is shut");
	before = E.ncaps;
	while (got < w / 4 - 4096 && (n = stream_read(E.s, out + got, w / 4 - 4096 - got)) > 0)
		got += (size_t)n;
	cr_assert_eq(E.ncaps, before, "no update before a quarter of the window is taken");
	while ((n = stream_read(E.s, out + got, w - got)) > 0)
		got += (size_t)n;
	cr_assert_eq(got, w);
	cr_assert_gt(E.ncaps, before, "no window update after the reader took the whole window");
	sg = last_seg();
	cr_assert_gt(sg.wnd, 0, "the update opens the window (%u)", sg.wnd);
	cr_assert_arr_eq(out, in, w);
}

Test(lwip_stream, window_updates_come_per_quarter_of_the_window)
{
	uint8_t *in = test_alloc(WND), *out = test_alloc(WND);
	size_t before, got = 0, want;
	struct seg sg;
	ssize_t n;

	handshake();
	fill(in, WND, 9);
	app_send(in, WND);
	lwip_stack_tick(E.ns);
	sg = last_seg();
	cr_assert_eq(sg.wnd, 0, "the window is shut");

	/* Just under a quarter taken: no segment at all. */
	before = E.ncaps;
	want = WND / 4 - 4096;
	while (got < want && (n = stream_read(E.s, out + got, want - got)) > 0)
		got += (size_t)n;
	cr_assert_eq(got, want);
	lwip_stack_tick(E.ns);
	cr_assert_eq(E.ncaps, before, "no update before a quarter of the window is taken");

	/* The rest of the quarter: one update, announcing all of it. */
	want = WND / 4;
	while (got < want && (n = stream_read(E.s, out + got, want - got)) > 0)
		got += (size_t)n;
	cr_assert_eq(got, want);
	cr_assert_eq(E.ncaps, before + 1, "one update for the quarter");
	sg = last_seg();
	cr_assert_geq(wnd_bytes(&sg), WND / 4, "it announces what was taken (%u)", wnd_bytes(&sg));
	cr_assert_leq(wnd_bytes(&sg), WND / 4 + (1u << TCP_RCV_SCALE));

	/* All of it taken: the window whole again, the bytes intact, at most one update per
	 * quarter (lwIP takes at most 64 KiB - 1 a call, so a quarter may go out with the next
	 * call: 3 or 4 updates in all). */
	while ((n = stream_read(E.s, out + got, WND - got)) > 0)
		got += (size_t)n;
	cr_assert_eq(got, WND);
	cr_assert_arr_eq(out, in, WND);
	cr_assert(E.ncaps >= before + 3 && E.ncaps <= before + 4, "updates: %zu",
		  E.ncaps - before);
	sg = last_seg();
	cr_assert_eq(wnd_bytes(&sg), WND);
}

Test(lwip_stream, peekv_lends_the_queue_and_skip_takes_it)
{
	const size_t total = 3 * 5000;
	uint8_t *in = test_alloc(total), *out = test_alloc(total);
	struct iovec iov[64];
	size_t got = 0, before;
	int cnt = 64;
	ssize_t n;
	struct seg sg;

	handshake();
	fill(in, total, 11);
	cnt = 64;
	cr_assert_eq(stream_peekv(E.s, iov, &cnt, 100000), -EAGAIN, "nothing queued yet");
	for (size_t at = 0; at < total; at += 5000)
		app_send(in + at, 5000); /* three arrivals: three or more pbufs */
	pump();
	lwip_stack_tick(E.ns);
	sg = last_seg();
	cr_assert_lt(wnd_bytes(&sg), WND, "the queued bytes hold the window");

	cnt = 64;
	n = stream_peekv(E.s, iov, &cnt, 100000);
	cr_assert_eq(n, (ssize_t)total, "all queued bytes lent");
	cr_assert_geq(cnt, 3);
	for (int i = 0; i < cnt; i++) {
		memcpy(out + got, iov[i].iov_base, iov[i].iov_len);
		got += iov[i].iov_len;
	}
	cr_assert_eq(got, total);
	cr_assert_arr_eq(out, in, total);

	cnt = 1;
	n = stream_peekv(E.s, iov, &cnt, 100000);
	cr_assert_eq(cnt, 1);
	cr_assert_eq((size_t)n, iov[0].iov_len);
	cr_assert_eq((size_t)n, MSS, "one view asked for: the first segment's pbuf");
	cnt = 64;
	n = stream_peekv(E.s, iov, &cnt, 1234);
	cr_assert_eq(n, 1234, "cut at n");

	before = E.ncaps;
	stream_skip(E.s, 7777); /* across a pbuf boundary, into the middle of one */
	cnt = 64;
	n = stream_peekv(E.s, iov, &cnt, 100000);
	cr_assert_eq(n, (ssize_t)(total - 7777), "peekv takes nothing; skip took exactly 7777");
	got = 0;
	for (int i = 0; i < cnt; i++) {
		memcpy(out + got, iov[i].iov_base, iov[i].iov_len);
		got += iov[i].iov_len;
	}
	cr_assert_arr_eq(out, in + 7777, total - 7777);
	stream_skip(E.s, total - 7777);
	lwip_stack_tick(E.ns);
	/* Less than a quarter of the window was queued: taking it is not worth an update. */
	cr_assert_lt(total, UPDATE_THRESHOLD_SCALED);
	cr_assert_eq(E.ncaps, before, "no update for less than a quarter of the window");
	cr_assert_leq(lwip_glue_mem_bytes(), E.mem_base + 4096, "skipped pbufs were freed");
	cnt = 64;
	cr_assert_eq(stream_peekv(E.s, iov, &cnt, 100000), -EAGAIN, "drained");
	cr_assert_eq(stream_read(E.s, out, 10), -EAGAIN);

	inject(TCP_ACK | TCP_FIN, E.c.snd_nxt, NULL, 0);
	E.c.snd_nxt++;
	pump();
	cnt = 64;
	cr_assert_eq(stream_peekv(E.s, iov, &cnt, 100000), 0, "EOF after the FIN");
}

/* A 64 KiB write (one more than a u16 holds) is accepted whole and delivered intact. */
Test(lwip_stream, write_64k_is_accepted_and_delivered)
{
	const size_t len = 65536;
	uint8_t *in = test_alloc(len), *out = test_alloc(len);

	handshake();
	fill(in, len, 4);
	expect_delivered(in, out, len, 200);
}

/* write() takes at most the send buffer; then -EAGAIN until the app acknowledges, when
 * writable fires (deferred). */
Test(lwip_stream, write_stops_at_the_send_buffer_and_resumes_on_ack)
{
	const size_t len = 2 * SNDBUF;
	uint8_t *in = test_alloc(len), *out = test_alloc(len);
	size_t got = 0, put;
	ssize_t n;

	handshake();
	fill(in, len, 5);
	n = stream_write(E.s, in, len);
	cr_assert_eq(n, (ssize_t)SNDBUF, "accepted %zd", n);
	put = (size_t)n;
	cr_assert_eq(stream_write(E.s, in + put, len - put), -EAGAIN);
	stream_set_interest(E.s, false, true);
	pump();
	cr_assert_eq(E.o.writable, 0, "no room: writable must not fire");

	for (int round = 0; round < 2000 && got < len; round++) {
		int w = E.o.writable;
		got += app_receive(out + got, len - got, NULL);
		cr_assert_eq(E.o.writable, w, "writable must be deferred to the loop");
		pump();
		if (put < len && E.o.writable > w) {
			n = stream_write(E.s, in + put, len - put);
			cr_assert(n > 0 || n == -EAGAIN, "write: %zd", n);
			if (n > 0)
				put += (size_t)n;
		}
	}
	cr_assert_eq(put, len);
	cr_assert_eq(got, len);
	cr_assert_arr_eq(out, in, len);
	cr_assert_eq(E.o.inside_lwip, 0);
}

/* The streams share one send pool (a sixteenth of the budget's buffer bytes): a lone sender may
 * queue the whole pool when that is less than lwIP's send buffer, then -EAGAIN until the app
 * acknowledges; every byte still arrives in order. */
Test(lwip_stream, write_stops_at_the_shared_send_pool, .init = setup_small_pool)
{
	const size_t len = 4 * SMALL_POOL;
	uint8_t *in = test_alloc(len), *out = test_alloc(len);
	size_t got = 0, put;
	ssize_t n;

	cr_assert_lt(SMALL_POOL, SNDBUF, "the pool must be the tighter bound here");
	handshake();
	fill(in, len, 6);
	n = stream_write(E.s, in, len);
	cr_assert_eq(n, (ssize_t)SMALL_POOL, "accepted %zd", n);
	put = (size_t)n;
	cr_assert_eq(stream_write(E.s, in + put, len - put), -EAGAIN);
	stream_set_interest(E.s, false, true);
	for (int round = 0; round < 4000 && got < len; round++) {
		int w = E.o.writable;
		got += app_receive(out + got, len - got, NULL);
		pump();
		if (put < len && E.o.writable > w) {
			n = stream_write(E.s, in + put, len - put);
			cr_assert(n > 0 || n == -EAGAIN, "write: %zd", n);
			cr_assert_leq(n, (ssize_t)SMALL_POOL, "a write over the pool: %zd", n);
			if (n > 0)
				put += (size_t)n;
		}
	}
	cr_assert_eq(put, len);
	cr_assert_eq(got, len);
	cr_assert_arr_eq(out, in, len);
}

/* write_room is what write() takes, and 0 until the acknowledged bytes free the low-water
 * room (16 KiB): writable does not fire for a few freed segments, and the relay, which reads
 * no more than write_room, never reads a segment at a time. */
Test(lwip_stream, writable_waits_for_the_low_water_room)
{
	const size_t len = SNDBUF + (64u << 10);
	uint8_t *in = test_alloc(len), *out = test_alloc(len);
	uint32_t base, all;
	ssize_t n;

	handshake();
	fill(in, len, 7);
	/* A first send buffer, acknowledged as it comes: lwIP's congestion window opens to the
	 * app's whole window. */
	expect_delivered(in, out, SNDBUF, 2000);
	cr_assert_eq(stream_write_room(E.s), TRAIN_SEGS * MSS,
		     "a lone stream: the whole send buffer, as one train's whole segments");
	n = stream_write(E.s, in, len);
	cr_assert_eq(n, (ssize_t)SNDBUF, "accepted %zd", n);
	cr_assert_eq(stream_write_room(E.s), 0);
	stream_set_interest(E.s, false, true);
	pump();
	cr_assert_eq(E.o.writable, 0);

	base = E.c.rcv_nxt;
	cr_assert_geq(app_take(out, len, NULL), 12 * MSS, "lwIP sent a window's worth");
	all = E.c.rcv_nxt;
	E.c.rcv_nxt = base + 5 * MSS; /* acknowledge 7,200 bytes: below the low water */
	app_ack();
	pump();
	cr_assert_eq(E.o.writable, 0, "writable for %zu free bytes", 5 * MSS);
	cr_assert_eq(stream_write_room(E.s), 0);
	E.c.rcv_nxt = base + 12 * MSS; /* 17,280 bytes: above it */
	app_ack();
	E.c.rcv_nxt = all;
	pump();
	cr_assert_gt(E.o.writable, 0, "no writable with %zu bytes free", 12 * MSS);
	cr_assert_eq(stream_write_room(E.s), 12 * MSS);
	n = stream_write(E.s, in + SNDBUF, len - SNDBUF);
	cr_assert_eq(n, (ssize_t)(12 * MSS), "write took %zd, write_room said %zu", n, 12 * MSS);
	cr_assert_eq(stream_write_room(E.s), 0);
}

/* write_room counts whole segments, at most one GSO train's (45 of 1,440 bytes: 64,800):
 * a write of it goes out as full segments only, none short, so a train never ends early;
 * room left under a segment is not rounded away. */
Test(lwip_stream, write_room_is_whole_segments_of_one_train)
{
	const size_t len = SNDBUF + (64u << 10);
	uint8_t *in = test_alloc(len), *out = test_alloc(len);
	size_t room, from, got = 0, segs = 0;
	ssize_t n;

	handshake();
	fill(in, len, 9);
	expect_delivered(in, out, SNDBUF, 2000); /* the congestion window opens */
	room = stream_write_room(E.s);
	cr_assert_eq(room, TRAIN_SEGS * MSS, "room %zu", room);
	cr_assert_leq(40 + 20 + room, 65535, "one train's payload");
	from = E.ncaps;
	n = stream_write(E.s, in, room);
	cr_assert_eq(n, (ssize_t)room);
	pump();
	for (int round = 0; round < 200 && got < room; round++) {
		got += app_receive(out + got, len - got, NULL);
		pump();
	}
	cr_assert_eq(got, room);
	cr_assert_arr_eq(out, in, room);
	for (size_t i = from; i < E.ncaps; i++) {
		struct seg sg;

		seg_parse(i, &sg);
		if (sg.len) {
			segs++;
			cr_assert_eq(sg.len, MSS, "packet %zu after the write: %zu bytes", i - from,
				     sg.len);
		}
	}
	cr_assert_eq(segs, TRAIN_SEGS, "%zu segments for %zu bytes", segs, room);
}

/* The app half-closes first: read returns the data, then 0 (repeatedly); our side still writes,
 * then shuts down: lwIP sends the data and FIN; once the app acknowledges the FIN lwIP frees the
 * pcb (a clean end, not an error). */
Test(lwip_stream, app_fin_then_shutdown_write)
{
	static const char hello[] = "hello", world[] = "world";
	uint8_t out[64];
	bool fin = false;

	handshake();
	inject(TCP_ACK | TCP_PSH | TCP_FIN, E.c.snd_nxt, hello, 5);
	E.c.snd_nxt += 5 + 1;
	stream_set_interest(E.s, true, false);
	pump();
	cr_assert_geq(E.o.readable, 1);
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), 5);
	cr_assert_arr_eq(out, hello, 5);
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), 0, "EOF after the data");
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), 0, "EOF repeats");

	cr_assert_eq(stream_write(E.s, world, 5), 5, "half-closed by the app: we still send");
	cr_assert_eq(stream_shutdown_write(E.s), 0);
	cr_assert_eq(stream_write(E.s, world, 5), -EPIPE);
	cr_assert_eq(app_receive(out, sizeof(out), &fin), 5);
	cr_assert_arr_eq(out, world, 5);
	cr_assert(fin, "shutdown_write must emit FIN");
	/* app_receive acknowledged the FIN: LAST_ACK -> CLOSED, lwIP freed the pcb. */
	pump();
	cr_assert_eq(E.o.errors, 0, "a clean close is not an error");
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), 0);
	cr_assert_eq(stream_write(E.s, world, 5), -EPIPE);
	size_t before = E.ncaps;
	stream_close(E.s);
	stream_gone();
	cr_assert_eq(E.ncaps, before, "nothing left to send: the pcb is gone");
	cr_assert_leq(lwip_glue_mem_bytes(), E.mem_base, "the pcb was freed");
}

/* We half-close first: lwIP emits FIN, and the stream keeps receiving until the app's FIN. */
Test(lwip_stream, shutdown_write_then_keep_reading)
{
	static const char abc[] = "abc", more[] = "more data";
	uint8_t out[64];
	bool fin = false;
	size_t before;

	handshake();
	cr_assert_eq(stream_write(E.s, abc, 3), 3);
	cr_assert_eq(stream_shutdown_write(E.s), 0);
	cr_assert_eq(app_receive(out, sizeof(out), &fin), 3);
	cr_assert(fin, "FIN after the data");
	cr_assert_arr_eq(out, abc, 3);

	app_send((const uint8_t *)more, 9);
	stream_set_interest(E.s, true, false);
	pump();
	cr_assert_geq(E.o.readable, 1);
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), 9, "half-closed: we still receive");
	cr_assert_arr_eq(out, more, 9);
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), -EAGAIN);
	inject(TCP_ACK | TCP_FIN, E.c.snd_nxt, NULL, 0);
	E.c.snd_nxt++;
	pump();
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), 0);
	cr_assert_eq(E.o.errors, 0);
	before = E.ncaps;
	stream_close(E.s); /* TIME_WAIT: lwIP keeps the pcb, without our callbacks */
	stream_gone();
	for (size_t i = before; i < E.ncaps; i++) {
		struct seg sg;
		seg_parse(i, &sg);
		cr_assert_eq(sg.flags & TCP_RST, 0, "a graceful close must not reset");
	}
}

Test(lwip_stream, close_sends_fin_after_pending_data)
{
	static const char bye[] = "bye";
	uint8_t out[16];
	bool fin = false;

	handshake();
	cr_assert_eq(stream_write(E.s, bye, 3), 3);
	stream_close(E.s); /* lwIP keeps the unacknowledged data and sends FIN after it */
	stream_gone();
	cr_assert_eq(app_receive(out, sizeof(out), &fin), 3);
	cr_assert_arr_eq(out, bye, 3);
	cr_assert(fin);
}

/* Closing with unread data tells the app its data was not consumed (RST), like a socket. */
Test(lwip_stream, close_with_unread_data_resets)
{
	uint8_t in[100];
	struct seg sg;

	handshake();
	fill(in, sizeof(in), 6);
	app_send(in, sizeof(in));
	stream_close(E.s);
	stream_gone();
	sg = last_seg();
	cr_assert(sg.flags & TCP_RST, "unread data: RST expected");
}

Test(lwip_stream, abort_sends_rst_and_frees_everything)
{
	uint8_t in[3000];
	struct seg sg;

	handshake();
	fill(in, sizeof(in), 7);
	app_send(in, sizeof(in)); /* queued, unread: abort frees it too */
	cr_assert_gt(lwip_glue_mem_bytes(), E.mem_base);
	stream_abort(E.s);
	stream_gone();
	sg = last_seg();
	cr_assert(sg.flags & TCP_RST, "abort must emit RST");
	cr_assert_eq(sg.seq, E.c.rcv_nxt, "RST at lwIP's snd_nxt");
	cr_assert_eq(lwip_glue_mem_bytes(), E.mem_base, "pcb and queued pbufs freed");
	pump(); /* nothing may fire for a freed stream (ASan would see it) */
}

/* An RST from the app: the error callback runs from the loop with -ECONNRESET, read/write
 * return it, lwIP's memory is back, and abort() only frees (no packet: the pcb is gone). */
Test(lwip_stream, app_rst_reports_econnreset)
{
	uint8_t in[2000], out[64];
	size_t before;

	handshake();
	fill(in, sizeof(in), 8);
	app_send(in, sizeof(in));
	stream_set_interest(E.s, false, false); /* error fires regardless of interest */
	inject(TCP_RST, E.c.snd_nxt, NULL, 0);
	cr_assert_eq(E.o.errors, 0, "error must be deferred to the loop");
	pump();
	cr_assert_eq(E.o.errors, 1);
	cr_assert_eq(E.o.last_err, -ECONNRESET);
	cr_assert_eq(E.o.inside_lwip, 0);
	cr_assert_eq(stream_read(E.s, out, sizeof(out)), -ECONNRESET);
	cr_assert_eq(stream_write(E.s, out, sizeof(out)), -ECONNRESET);
	cr_assert_eq(stream_shutdown_write(E.s), -ECONNRESET);
	cr_assert_eq(lwip_glue_mem_bytes(), E.mem_base, "lwIP freed the pcb; we freed the queue");
	stream_set_interest(E.s, true, true);
	pump();
	cr_assert_eq(E.o.errors, 1, "error fires once");
	cr_assert_geq(E.o.readable, 1, "a pending error makes the stream readable");
	before = E.ncaps;
	stream_abort(E.s);
	stream_gone();
	cr_assert_eq(E.ncaps, before, "abort after the pcb died sends nothing");
	pump();
}

/* The owner may free the stream from inside its own callback. */
static void close_in_readable(void *arg)
{
	struct owner *o = arg;

	o->readable++;
	stream_close(E.s);
	stream_gone();
}

Test(lwip_stream, owner_may_close_inside_a_callback)
{
	static const struct stream_cbs cbs = { close_in_readable, on_writable, on_error };
	static const char x[] = "x";

	handshake();
	stream_set_callbacks(E.s, &cbs, &E.o);
	stream_set_interest(E.s, true, true); /* both due: only the first may run */
	app_send((const uint8_t *)x, 1);
	pump();
	cr_assert_eq(E.o.readable, 1);
	cr_assert_eq(E.o.writable, 0, "nothing may run after the stream was freed");
	cr_assert_null(E.s);
}

/* lwIP frees TIME_WAIT pcbs from its timer without any callback: a stream whose data is still
 * unread when the close handshake completes must not hold the pcb (ASan: no use after free). */
Test(lwip_stream, timewait_pcb_freed_by_lwip_while_data_unread)
{
	uint8_t in[3000], out[4000];
	bool fin = false;
	size_t got = 0, before;
	ssize_t n;

	handshake();
	fill(in, sizeof(in), 9);
	cr_assert_eq(stream_shutdown_write(E.s), 0);
	app_receive(out, sizeof(out), &fin); /* acknowledges our FIN: FIN_WAIT_2 */
	cr_assert(fin);
	app_send(in, sizeof(in));
	inject(TCP_ACK | TCP_FIN, E.c.snd_nxt, NULL, 0); /* -> TIME_WAIT */
	E.c.snd_nxt++;
	for (unsigned long i = 0; i < 4 * (2 * TCP_MSL / 500 + 2); i++)
		lwip_stack_tick(E.ns); /* well past 2 * TCP_MSL: lwIP frees the pcb */
	cr_assert_leq(lwip_glue_mem_bytes(), E.mem_base + sizeof(in) + 3 * 2048,
		      "only the unread segments are left");
	while ((n = stream_read(E.s, out + got, 1000)) > 0)
		got += (size_t)n;
	cr_assert_eq(n, 0, "EOF after the data");
	cr_assert_eq(got, sizeof(in));
	cr_assert_arr_eq(out, in, sizeof(in));
	cr_assert_eq(stream_write(E.s, out, 1), -EPIPE);
	before = E.ncaps;
	stream_close(E.s);
	stream_gone();
	cr_assert_eq(E.ncaps, before);
	cr_assert_eq(lwip_glue_mem_bytes(), E.mem_base, "everything freed");
}

/* The app sent data and FIN; we shut down before reading it (LAST_ACK): the close completes
 * without a RST, and the data is still readable afterwards. */
Test(lwip_stream, shutdown_with_unread_data_after_app_fin)
{
	uint8_t in[2500], out[4000];
	bool fin = false;
	size_t got = 0;
	ssize_t n;

	handshake();
	fill(in, sizeof(in), 10);
	app_send(in, sizeof(in));
	inject(TCP_ACK | TCP_FIN, E.c.snd_nxt, NULL, 0); /* -> CLOSE_WAIT */
	E.c.snd_nxt++;
	cr_assert_eq(stream_shutdown_write(E.s), 0);      /* -> LAST_ACK */
	app_receive(out, sizeof(out), &fin);               /* app ACKs our FIN: lwIP frees it */
	cr_assert(fin);
	pump();
	cr_assert_eq(E.o.errors, 0);
	while ((n = stream_read(E.s, out + got, 1000)) > 0)
		got += (size_t)n;
	cr_assert_eq(n, 0);
	cr_assert_eq(got, sizeof(in));
	cr_assert_arr_eq(out, in, sizeof(in));
	stream_close(E.s);
	stream_gone();
	for (size_t i = 0; i < E.ncaps; i++) {
		struct seg sg;
		seg_parse(i, &sg);
		cr_assert_eq(sg.flags & TCP_RST, 0, "a clean close must not reset");
	}
	cr_assert_eq(lwip_glue_mem_bytes(), E.mem_base, "the pcb was freed");
}

static uint64_t stack_counter(const char *name)
{
	bool found;
	uint64_t v = tu_stack_counter(&lwip_stack_ops, E.ns, name, &found);

	cr_assert(found, "no stack counter %s", name);
	return v;
}

/* Take every byte the budget has left, so lwIP's next allocation fails. Returns the bytes. */
static uint64_t exhaust_budget(void)
{
	struct budget_buffer_stats st;
	uint64_t left;

	budget_buffer_stats(E.budget, 0, &st);
	left = st.bytes_limit - st.bytes_in_use;
	cr_assert_eq(budget_bytes_reserve(E.budget, left), 0);
	return left;
}

/* lwIP cannot allocate and nothing of ours is in flight: write() is -EAGAIN (back-pressure,
 * never an error the relay would end the connection for), writable stays quiet while lwIP's
 * poll finds no memory... and fires on the poll after memory is back, when the write goes
 * through. */
Test(lwip_stream, write_without_memory_and_nothing_in_flight_waits_for_the_poll)
{
	static const char x[] = "x";
	uint8_t out[16];
	uint64_t held;

	handshake();
	held = E.held = exhaust_budget();
	cr_assert_eq(stream_write(E.s, x, 1), -EAGAIN);
	cr_assert_eq(stack_counter("write_nomem"), 1);
	stream_set_interest(E.s, false, true);
	pump();
	cr_assert_eq(E.o.writable, 0, "no memory: writable must wait");
	for (int i = 0; i < 4; i++)
		lwip_stack_tick(E.ns); /* two polls: each retries once, and fails again */
	pump();
	cr_assert_geq(E.o.writable, 1, "lwIP's poll retries the write");
	cr_assert_eq(stream_write(E.s, x, 1), -EAGAIN, "still no memory");
	cr_assert_eq(stack_counter("write_nomem"), 2);
	int w = E.o.writable;
	pump();
	cr_assert_eq(E.o.writable, w, "refused again: quiet until the next poll");
	budget_bytes_release(E.budget, held);
	E.held = 0;
	for (int i = 0; i < 4; i++)
		lwip_stack_tick(E.ns);
	pump();
	cr_assert_gt(E.o.writable, w, "the poll after memory came back");
	cr_assert_eq(stream_write(E.s, x, 1), 1, "works again with memory");
	cr_assert_eq(app_receive(out, sizeof(out), NULL), 1);
	cr_assert_eq(out[0], 'x');
	cr_assert_eq(E.o.errors, 0);
}

/* With data in flight, a failed allocation is -EAGAIN, and writable waits for an ACK (it does
 * not spin while lwIP keeps refusing). */
Test(lwip_stream, write_without_memory_waits_for_an_ack)
{
	static const char a[100] = { 1 };
	uint8_t out[256];
	uint64_t held;

	handshake();
	cr_assert_eq(stream_write(E.s, a, sizeof(a)), (ssize_t)sizeof(a));
	held = exhaust_budget();
	cr_assert_eq(stream_write(E.s, a, sizeof(a)), -EAGAIN);
	stream_set_interest(E.s, false, true);
	pump();
	cr_assert_eq(E.o.writable, 0, "lwIP refused memory: writable must wait for an ACK");
	budget_bytes_release(E.budget, held);
	cr_assert_eq(app_receive(out, sizeof(out), NULL), sizeof(a));
	pump();
	cr_assert_geq(E.o.writable, 1, "the ACK makes the stream writable again");
	cr_assert_eq(stream_write(E.s, a, sizeof(a)), (ssize_t)sizeof(a));
}

/* shutdown_write in CLOSE_WAIT while lwIP has no memory for the FIN (it marks it pending) and
 * the app's data is unread: handing the pcb back must not reset the connection, and the FIN
 * goes out once memory is back. */
Test(lwip_stream, shutdown_without_memory_for_the_fin)
{
	uint8_t in[2000], out[4000];
	bool fin = false;
	size_t got = 0;
	uint64_t held;
	ssize_t n;

	handshake();
	fill(in, sizeof(in), 11);
	app_send(in, sizeof(in));
	inject(TCP_ACK | TCP_FIN, E.c.snd_nxt, NULL, 0); /* -> CLOSE_WAIT */
	E.c.snd_nxt++;
	held = exhaust_budget();
	cr_assert_eq(stream_shutdown_write(E.s), 0, "the FIN is pending, not failed");
	budget_bytes_release(E.budget, held);
	for (int i = 0; i < 2; i++)
		lwip_stack_tick(E.ns); /* lwIP retries the pending FIN */
	app_receive(out, sizeof(out), &fin);
	cr_assert(fin, "the pending FIN was sent");
	for (size_t i = 0; i < E.ncaps; i++) {
		struct seg sg;
		seg_parse(i, &sg);
		cr_assert_eq(sg.flags & TCP_RST, 0, "unread data at hand-over must not reset");
	}
	while ((n = stream_read(E.s, out + got, 1000)) > 0)
		got += (size_t)n;
	cr_assert_eq(n, 0);
	cr_assert_eq(got, sizeof(in));
	cr_assert_arr_eq(out, in, sizeof(in));
	stream_close(E.s);
	stream_gone();
	cr_assert_eq(lwip_glue_mem_bytes(), E.mem_base, "the pcb was freed");
}

/* ---- memory pressure ---------------------------------------------------------------------------- */

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ULL;
	return h;
}

/* The app (go-back-N, as lwIP drops what it has no memory for) sends up to nseg segments from
 * the first byte lwIP has not acknowledged; each carries the app's acknowledgement too. */
static void app_resend(const uint8_t *data, size_t len, size_t nseg)
{
	size_t off = E.c.snd_una - (APP_ISN + 1);

	E.c.snd_nxt = E.c.snd_una;
	for (size_t i = 0; i < nseg && off < len; i++) {
		size_t c = len - off < MSS ? len - off : MSS;
		inject(TCP_ACK, E.c.snd_nxt, data + off, c);
		E.c.snd_nxt += (uint32_t)c;
		off += c;
	}
}

/* Both directions at once through a budget far smaller than the transfer (and than lwIP's
 * windows): lwIP's allocations are refused again and again, yet every byte arrives intact and
 * nothing is reset or aborted. The owner behaves like the relay: after -EAGAIN it writes again
 * only once writable fired. Refused writes wait (for an acknowledgement, or lwIP's poll when
 * nothing is in flight); refused input still delivers its acknowledgement to lwIP (without it
 * the memory held by unacknowledged data could never be freed). */
Test(lwip_stream, transfer_larger_than_the_budget_completes_intact)
{
	const size_t total = 1 << 20, left = 16 * 1024;
	uint8_t *up = test_alloc(total), *down = test_alloc(total);
	uint8_t *sunk = test_alloc(total), *got = test_alloc(total);
	size_t put = 0, nsunk = 0, ngot = 0;
	struct budget_stats b0, b1;
	struct budget_buffer_stats bs;
	int waits = 0, writable_seen = 0, round;
	bool wait_writable = false;
	uint64_t held;
	ssize_t n;

	handshake();
	fill(down, total, 12); /* stream -> app */
	fill(up, total, 13);   /* app -> stream */
	budget_buffer_stats(E.budget, 0, &bs);
	held = bs.bytes_limit - bs.bytes_in_use - left;
	cr_assert_eq(budget_bytes_reserve(E.budget, held), 0);
	E.held = held;
	budget_get_stats(E.budget, &b0);
	stream_set_interest(E.s, false, true);
	for (round = 0; round < 50000 && (put < total || ngot < total || nsunk < total); round++) {
		if (put < total && (!wait_writable || E.o.writable > writable_seen)) {
			n = stream_write(E.s, down + put, total - put);
			cr_assert(n > 0 || n == -EAGAIN, "write: %zd (round %d)", n, round);
			wait_writable = n == -EAGAIN;
			waits += wait_writable;
			writable_seen = E.o.writable;
			if (n > 0)
				put += (size_t)n;
		}
		while ((n = stream_read(E.s, sunk + nsunk, total - nsunk)) > 0)
			nsunk += (size_t)n;
		cr_assert(n == -EAGAIN || nsunk == total, "read: %zd (round %d)", n, round);
		ngot += app_receive(got + ngot, total - ngot, NULL);
		app_resend(up, total, 16);
		lwip_stack_tick(E.ns);
		pump();
		cr_assert_eq(E.o.errors, 0, "error %d (round %d)", E.o.last_err, round);
	}
	budget_get_stats(E.budget, &b1);
	cr_log_info("%d rounds, %d write waits; write_nomem %llu, rx_payload_nomem %llu, "
		    "drop_nomem %llu, budget refusals %llu", round, waits,
		    (unsigned long long)stack_counter("write_nomem"),
		    (unsigned long long)stack_counter("rx_payload_nomem"),
		    (unsigned long long)stack_counter("drop_nomem"),
		    (unsigned long long)(b1.buffer_refused - b0.buffer_refused));
	cr_assert_eq(put, total, "the stream took %zu of %zu bytes", put, total);
	cr_assert_eq(ngot, total, "the app got %zu of %zu bytes", ngot, total);
	cr_assert_eq(nsunk, total, "the stream delivered %zu of %zu bytes", nsunk, total);
	cr_assert_eq(fnv1a(got, total), fnv1a(down, total), "stream -> app corrupted");
	cr_assert_eq(fnv1a(sunk, total), fnv1a(up, total), "app -> stream corrupted");
	cr_assert_gt(b1.buffer_refused, b0.buffer_refused, "the budget never refused: no pressure");
	cr_assert_gt(waits, 0, "writes never waited");
	cr_assert_gt(stack_counter("write_nomem"), 0, "no write was refused for memory");
	cr_assert_gt(stack_counter("rx_payload_nomem"), 0, "no input was refused for memory");
	cr_assert_eq(E.o.inside_lwip, 0);
}

/* The budget refuses every allocation. A pure ACK from the app needs none (it is fed from the
 * stack's own buffer); a data segment that also acknowledges our data loses its payload
 * (counted; the app resends it) but not its acknowledgement. Both free our acknowledged
 * segments and make the stream writable: without that, memory held by unacknowledged data
 * would wait for an acknowledgement that could never get in. */
Test(lwip_stream, input_without_memory_still_delivers_the_ack)
{
	uint8_t data[3 * MSS], in[1000], out[sizeof(data)], rd[sizeof(in)];
	uint64_t mem0, mem1, mem2;
	uint32_t end;

	handshake();
	fill(data, sizeof(data), 14);
	fill(in, sizeof(in), 15);
	cr_assert_eq(stream_write(E.s, data, sizeof(data)), (ssize_t)sizeof(data));
	cr_assert_eq(app_take(out, sizeof(out), NULL), sizeof(data));
	cr_assert_arr_eq(out, data, sizeof(data));
	E.held = exhaust_budget();
	cr_assert_eq(stream_write(E.s, data, 1), -EAGAIN, "no memory for more");
	stream_set_interest(E.s, false, true);
	mem0 = lwip_glue_mem_bytes();

	end = E.c.rcv_nxt;
	E.c.rcv_nxt = end - 2 * MSS; /* a pure ACK of the first segment */
	app_ack();
	E.c.rcv_nxt = end;
	cr_assert_eq(stream_unacked(E.s), (ssize_t)(2 * MSS), "the pure ACK was lost");
	mem1 = lwip_glue_mem_bytes();
	cr_assert_lt(mem1, mem0, "the acknowledged segment was not freed");
	pump();
	cr_assert_geq(E.o.writable, 1, "acknowledged data makes the stream writable");

	E.held += exhaust_budget(); /* what the ACK freed */
	inject(TCP_ACK | TCP_PSH, E.c.snd_nxt, in, sizeof(in)); /* acknowledges the rest */
	cr_assert_eq(stream_unacked(E.s), 0, "the data segment's acknowledgement was lost");
	mem2 = lwip_glue_mem_bytes();
	cr_assert_lt(mem2, mem1, "the acknowledged segments were not freed");
	lwip_stack_tick(E.ns);
	cr_assert_eq(last_seg().ack, E.c.snd_nxt, "lwIP must not take a payload it had no memory for");
	cr_assert_eq(stream_read(E.s, rd, sizeof(rd)), -EAGAIN);

	budget_bytes_release(E.budget, E.held);
	E.held = 0;
	app_send(in, sizeof(in)); /* the app's retransmission */
	cr_assert_eq(stream_read(E.s, rd, sizeof(rd)), (ssize_t)sizeof(in));
	cr_assert_arr_eq(rd, in, sizeof(in));
	cr_assert_eq(stack_counter("rx_payload_nomem"), 1);
	cr_assert_eq(stack_counter("drop_nomem"), 0);
	cr_assert_eq(E.o.errors, 0);
}

/* A SYN that finds the budget spent is refused whole (the app retransmits it): no SYN-ACK, no
 * connection, one drop_nomem, and the same one in the stack's public figure (drops.no_memory).
 * With the memory back, the app's retransmitted SYN gets its connection. */
Test(lwip_stream, syn_without_memory_is_dropped_and_counted)
{
	struct netstack_stats o;
	size_t before;

	E.held = exhaust_budget();
	before = E.ncaps;
	inject(TCP_SYN, APP_ISN, NULL, 0);
	pump();
	cr_assert_eq(E.ncaps, before, "the refused SYN was answered");
	cr_assert_eq(E.accepted, 0);
	cr_assert_eq(stack_counter("drop_nomem"), 1);
	lwip_stack_ops.stats(E.ns, &o);
	cr_assert_eq(o.drops_no_memory, 1, "drops.no_memory");

	budget_bytes_release(E.budget, E.held);
	E.held = 0;
	handshake();
	cr_assert_eq(stack_counter("drop_nomem"), 1);
}

/* A segment that arrives after a lost one waits in lwIP's out-of-order queue, charged to the
 * budget. With the budget spent, the lost segment's retransmission finds no memory for its
 * payload: the queue behind it lets go (counted), so the next retransmission gets in with the
 * memory the queue held. Before, the queue kept that memory while every retransmission of the
 * segment it waited for was refused: the connection, and every other one waiting for the
 * budget, stalled for good. */
Test(lwip_stream, input_without_memory_frees_the_out_of_order_queue)
{
	uint8_t a[MSS], b[MSS], rd[2 * MSS];
	uint32_t seq0;
	uint64_t mem0;

	handshake();
	fill(a, sizeof(a), 21);
	fill(b, sizeof(b), 22);
	seq0 = E.c.snd_nxt;
	inject(TCP_ACK | TCP_PSH, seq0 + (uint32_t)MSS, b, sizeof(b)); /* a was lost */
	cr_assert_eq(stream_read(E.s, rd, sizeof(rd)), -EAGAIN);
	mem0 = lwip_glue_mem_bytes();
	E.held = exhaust_budget();

	inject(TCP_ACK, seq0, a, sizeof(a)); /* a's retransmission: no memory for it */
	cr_assert_eq(stack_counter("rx_payload_nomem"), 1);
	cr_assert_eq(stack_counter("ooseq_freed"), 1);
	cr_assert_lt(lwip_glue_mem_bytes(), mem0, "the out-of-order segment still holds memory");
	cr_assert_eq(stream_read(E.s, rd, sizeof(rd)), -EAGAIN);

	inject(TCP_ACK, seq0, a, sizeof(a)); /* the next one gets the memory b held */
	cr_assert_eq(stream_read(E.s, rd, sizeof(rd)), (ssize_t)MSS, "a's retransmission was refused");
	cr_assert_arr_eq(rd, a, MSS);
	inject(TCP_ACK | TCP_PSH, seq0 + (uint32_t)MSS, b, sizeof(b)); /* and b's, after it */
	cr_assert_eq(stream_read(E.s, rd, sizeof(rd)), (ssize_t)MSS);
	cr_assert_arr_eq(rd, b, MSS);
	cr_assert_eq(E.o.errors, 0);
}

/* ---- the shared send buffers' arithmetic (lwip_sendshare_room; no lwIP) ------------------- */

#define KIB ((size_t)1 << 10)
#define POOL (4096 * KIB)
#define FLOOR (16 * KIB)

TestSuite(lwip_sendshare, .timeout = 30);

Test(lwip_sendshare, room_by_case)
{
	static const struct {
		size_t queued;    /* all streams' bytes */
		uint32_t senders; /* streams with bytes queued */
		size_t own;
		bool sending;
		size_t room;
		const char *why;
	} cases[] = {
		{ 0, 0, 0, false, POOL, "alone: the whole pool" },
		{ 0, 1, 0, false, POOL / 2, "one other sender: half" },
		{ 64 * KIB * 63, 63, 0, false, 64 * KIB, "the 64th: a 64th" },
		{ 64 * KIB * 64, 64, 48 * KIB, true, 0, "pool full: nothing beyond the floor" },
		{ 64 * KIB * 64, 64, 10 * KIB, true, 6 * KIB, "pool full: up to the floor" },
		{ POOL + 64 * KIB, 64, 0, false, FLOOR, "over the pool, nothing queued: the floor" },
		{ POOL - 10 * KIB, 64, 32 * KIB, true, 10 * KIB, "what the pool has left" },
		{ POOL - 10 * KIB, 64, 4 * KIB, true, 12 * KIB, "the floor, more than the pool has" },
		{ 2048 * KIB, 4, 1024 * KIB, true, 0, "an early sender at its share" },
		{ 2048 * KIB, 8, 256 * KIB, true, 256 * KIB, "a share of 512 KiB, 256 queued" },
		{ POOL * 2, 1024, 0, false, FLOOR, "1,024 senders: the floor" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct lwip_sendshare sh = { .pool = POOL, .min = FLOOR,
					     .queued = cases[i].queued,
					     .senders = cases[i].senders };
		size_t room = lwip_sendshare_room(&sh, cases[i].own, cases[i].sending);

		cr_assert_eq(room, cases[i].room, "case %zu (%s): room %zu, want %zu", i,
			     cases[i].why, room, cases[i].room);
	}
}

/* 64 streams write what the share allows and are acknowledged at random, the way streams
 * arriving and draining at different times do: all of them together never hold more than
 * the pool plus each one's floor, only a stream under its floor ever takes the total past
 * the pool, and a stream with nothing queued always has at least its floor (it never waits
 * for an acknowledgement that cannot come). */
Test(lwip_sendshare, bound_and_floor_hold_under_random_traffic)
{
	enum { N = 64, STEPS = 200000 };
	const size_t sndbuf = 256 * KIB;
	struct lwip_sendshare sh = { .pool = POOL, .min = FLOOR };
	size_t own[N] = { 0 }, peak = 0;
	struct tu_rng r;

	tu_rng_seed(&r, 0x5ead);
	for (int step = 0; step < STEPS; step++) {
		int i = (int)tu_rand_below(&r, N);
		size_t total = 0;
		uint32_t senders = 0;

		if (tu_rand_chance(&r, 2)) {
			size_t room = lwip_sendshare_room(&sh, own[i], own[i] > 0), take;

			if (own[i] == 0)
				cr_assert_geq(room, FLOOR, "step %d: an empty stream got %zu", step,
					      room);
			if (room > sndbuf - own[i])
				room = sndbuf - own[i];
			if (room == 0)
				continue;
			take = tu_rand_chance(&r, 2) ? room : 1 + tu_rand_below(&r, (uint32_t)room);
			own[i] += take;
			sh.queued += take;
			if (sh.queued > sh.pool)
				cr_assert_leq(own[i], FLOOR, "step %d: past the pool at %zu queued",
					      step, own[i]);
		} else if (own[i] > 0) {
			size_t acked = 1 + tu_rand_below(&r, (uint32_t)own[i]);

			own[i] -= acked;
			sh.queued -= acked;
		}
		for (int k = 0; k < N; k++) {
			total += own[k];
			senders += own[k] > 0;
		}
		sh.senders = senders;
		cr_assert_eq(total, sh.queued);
		cr_assert_leq(total, POOL + N * FLOOR, "step %d: %zu queued", step, total);
		if (total > peak)
			peak = total;
	}
	cr_assert_geq(peak, POOL - 64 * KIB, "the streams never filled the pool: peak %zu", peak);
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The next loop iteration's notification needs a zero timeout, a place in libevent's timer
 * heap; with libevent out of memory for it (the heap full here, it must grow) the owner that
 * left data behind must still hear of it again, here from lwIP's poll. */
Test(lwip_stream, readable_again_when_libevent_cannot_time_the_next_iteration)
{
	struct event *pads[64];
	uint8_t in[3000];
	int64_t end;
	int n = 0;

	cr_assert_eq(evmem_install(), 0);
	handshake();
	fill(in, sizeof(in), 3);
	app_send(in, sizeof(in));
	pump();
	n = failalloc_fill_timers(E.base, pads, 64);
	E.o.read_per_cb = 1000;
	E.o.sink = test_alloc(sizeof(in));
	E.o.sink_cap = sizeof(in);
	stream_set_interest(E.s, true, false);
	failalloc_arm(1); /* the heap's growth for the next iteration's zero timeout */
	loop_once();
	failalloc_arm(0);
	cr_assert(failalloc_fired(), "the zero timeout needed no memory: nothing tested");
	cr_assert_geq(E.o.readable, 1);
	end = mono_ms() + 3000;
	while (E.o.sunk < sizeof(in) && mono_ms() < end)
		event_base_loop(E.base, EVLOOP_ONCE);
	cr_assert_eq(E.o.sunk, sizeof(in), "the owner heard of %zu bytes of %zu", E.o.sunk,
		     sizeof(in));
	cr_assert_arr_eq(E.o.sink, in, sizeof(in));
	failalloc_unpad(pads, n);
}
