/* test_driver_lost.c — a round the driver's io_uring loses (core/driver.c, ring_lost) while a
 * stack has frames lent to it (driver_tx_lend): an operation neither completed nor could be
 * cancelled, so the kernel may still read the round's buffers at any time.
 *
 *   socketpair(AF_UNIX, SOCK_SEQPACKET) as a stand-in TUN fd with the 10-byte virtio_net_hdr,
 *   and a seccomp listener answering io_uring_enter for the kernel (tests/unit/uring_lose.h),
 *   which also notes where the lost round's writes read from. Checked: every lent frame of the
 *   round goes back once, as lost, in order, and is counted (tx_dropped, uring_lost_lent);
 *   the owner's charge, abandoned, lets the budget close; frames lent afterwards are written
 *   at once; the headers the round gave the kernel are not on the stack and still hold
 *   what was lent once the driver is freed (AddressSanitizer would see a freed block read).
 *
 *   The lwIP stack lending, wired to the driver as the proxy wires them (runtime/proxy.c): a
 *   lost round with a short segment in a small frame and a large one from its pbuf leaves
 *   both to the kernel, and the stack, the driver and the budget still close (budget_free
 *   asserts every byte released or abandoned); freed before the driver, as proxy_close
 *   does, the stack first has the driver write what it lent. Nothing is reported by
 *   LeakSanitizer.
 *
 * The read buffers a lost round leaves, and one lost while a stack handles a packet, are in
 * test_driver.c; the lwIP stack's side of a lost frame in test_lwip_bigseg.c.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/driver.h"
#include "core/log.h"
#include "core/pkt.h"
#include "core/tun.h"
#include "dispatch/stream.h"
#include "stacks/lwip/lwip_stack.h"
#include "testutil.h"
#include "uring_lose.h"

#define VH TUN_VNET_HDR_LEN
#define FRAMES 3

static uint64_t ctr_at(const struct driver *d, size_t off)
{
	return ctr_get((const ctr_t *)((const char *)driver_get_counters(d) + off));
}
#define CTR(d, name) ctr_at(d, offsetof(struct driver_counters, name))

static enum driver_verdict in_done(void *arg, uint8_t *buf, size_t len, const struct pkt_meta *m,
				   int64_t now, size_t *out_len, bool *plain, struct pkt_view *view)
{
	(void)arg, (void)buf, (void)len, (void)m, (void)now, (void)out_len, (void)plain, (void)view;
	return DRIVER_DONE;
}

static const struct driver_ops ops = { .input = in_done };

/* The lender: frames of its own memory, each charged to the budget as a stack's would be,
 * the charge released when a frame comes back written and abandoned when it comes back lost. */
struct owner {
	struct budget *b;
	uint8_t pkt[FRAMES + 1][256];
	size_t len[FRAMES + 1];
	struct pkt_meta m[FRAMES + 1];
	int back;               /* releases, in all */
	int order[8];           /* the frames given back, in order */
	bool lost[8];
	uint64_t abandoned;     /* bytes of the frames given back lost */
};

struct frame_arg {
	struct owner *o;
	int id;
};
static struct frame_arg fa[FRAMES + 1];

static void release(void *arg, bool lost)
{
	struct frame_arg *a = arg;
	struct owner *o = a->o;

	if (o->back < 8) {
		o->order[o->back] = a->id;
		o->lost[o->back] = lost;
	}
	o->back++;
	if (!o->b)
		return;
	if (lost) {
		budget_bytes_abandon(o->b, o->len[a->id]);
		o->abandoned += o->len[a->id];
	} else {
		budget_bytes_release(o->b, o->len[a->id]);
	}
}

/* A UDP packet with first payload byte idx, lent with a GSO header of its own sizes. */
static void owner_fill(struct owner *o, struct budget *b)
{
	memset(o, 0, sizeof(*o));
	o->b = b;
	for (int i = 0; i <= FRAMES; i++) {
		uint8_t pl[200];
		struct tu_spec s;

		tu_fill_pattern(pl, 100u + (size_t)i, (uint8_t)i);
		tu_spec_udp(&s, "10.0.0.1", 53, "10.0.0.2", 4000);
		s.payload = pl;
		s.payload_len = 100u + (size_t)i;
		o->len[i] = tu_build(&s, o->pkt[i], sizeof(o->pkt[i]));
		tu_meta_partial(o->pkt[i], o->len[i], 0, &o->m[i]);
		o->m[i].gso_type = PKT_GSO_UDP_L4;
		o->m[i].gso_size = (uint16_t)(40 + i);
		fa[i] = (struct frame_arg){ o, i };
	}
}

static int owner_lend(struct driver *d, struct owner *o, int i)
{
	if (o->b)
		cr_assert_eq(budget_bytes_reserve(o->b, o->len[i]), 0);
	return driver_tx_lend(d, o->pkt[i], o->len[i], &o->m[i], release, &fa[i]);
}

struct rig {
	struct event_base *base;
	struct driver *d;
	int sv[2];
};

static void rig_open_ops(struct rig *r, struct budget *b, const struct driver_ops *o, void *arg)
{
	struct driver_params p = { .mtu = 1500, .vnet_hdr = true, .uring = true };

	r->base = event_base_new();
	cr_assert(r->base);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, r->sv),
		     0);
	p.fd = r->sv[0];
	cr_assert_eq(driver_new(r->base, &p, o, arg, b, &r->d), 0);
	cr_assert(driver_uring(r->d), "batched I/O: %s", strerror(-driver_uring_err(r->d)));
}

static void rig_open(struct rig *r, struct budget *b)
{
	rig_open_ops(r, b, &ops, NULL);
}

static void rig_close(struct rig *r)
{
	driver_free(r->d);
	event_base_free(r->base);
	close(r->sv[0]);
	close(r->sv[1]);
}

TestSuite(driver_lost, .timeout = 10);

/* The frames lent for a round the ring loses go back once each, as lost (their memory must
 * stay allocated), in the order lent; the writes are drops; reading stops. The owner
 * abandons their charge, and the budget closes with it and the read buffers' as abandoned. A
 * frame lent afterwards goes out at once, with writev(), and comes back written. */
Test(driver_lost, lent_frames_of_a_lost_round_go_back_as_lost)
{
	static struct owner o;
	struct budget_limits l;
	struct budget_stats st;
	struct budget *b;
	struct rig r;
	uint64_t slots, frames = 0;
	uint8_t got[VH + 512];

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&l, &b), 0);
	rig_open(&r, b);
	budget_get_stats(b, &st);
	slots = st.buffer_bytes_in_use;
	owner_fill(&o, b);
	for (int i = 0; i < FRAMES; i++) {
		cr_assert_eq(owner_lend(r.d, &o, i), 0);
		frames += o.len[i];
	}
	cr_assert_eq(o.back, 0, "queued for the next round");
	lose_io_uring_rounds(NULL);
	driver_tx_flush(r.d);
	cr_assert_not(driver_uring(r.d));
	cr_assert_eq(o.back, FRAMES, "each lent frame given back once");
	for (int i = 0; i < FRAMES; i++) {
		cr_assert_eq(o.order[i], i, "in the order lent");
		cr_assert(o.lost[i], "frame %d given back as lost", i);
	}
	cr_assert_eq(recv(r.sv[1], got, sizeof(got), MSG_DONTWAIT), -1, "nothing written");
	cr_assert_eq(CTR(r.d, uring_enter_failed), 1);
	cr_assert_eq(CTR(r.d, rx_gone), 1, "reading stopped");
	cr_assert_eq(CTR(r.d, tx_lent), FRAMES);
	cr_assert_eq(CTR(r.d, uring_lost_lent), FRAMES);
	cr_assert_eq(CTR(r.d, tx_dropped), FRAMES);
	cr_assert_eq(CTR(r.d, tx_packets), 0);
	cr_assert_eq(CTR(r.d, uring_lost_bytes), slots);

	cr_assert_eq(owner_lend(r.d, &o, FRAMES), 0);
	cr_assert_eq(o.back, FRAMES + 1, "lent after the loss: written at once");
	cr_assert_not(o.lost[FRAMES]);
	cr_assert_eq(recv(r.sv[1], got, sizeof(got), MSG_DONTWAIT), (ssize_t)(VH + o.len[FRAMES]));
	cr_assert_eq(memcmp(got + VH, o.pkt[FRAMES], o.len[FRAMES]), 0);
	cr_assert_eq(CTR(r.d, tx_packets), 1);
	cr_assert_eq(CTR(r.d, tx_lent), FRAMES, "not counted as lent: no round");
	cr_assert_eq(CTR(r.d, uring_lost_lent), FRAMES);

	rig_close(&r);
	budget_get_stats(b, &st);
	cr_assert_eq(o.abandoned, frames);
	cr_assert_eq(st.buffer_bytes_abandoned, slots + frames);
	cr_assert_eq(st.buffer_bytes_in_use, slots + frames, "all of it still allocated");
	budget_free(b);
	CHECK_LEAKS();
}

/* Is p on this thread's stack? */
static bool on_stack(const void *p)
{
	pthread_attr_t a;
	void *lo;
	size_t size;

	cr_assert_eq(pthread_getattr_np(pthread_self(), &a), 0);
	cr_assert_eq(pthread_attr_getstack(&a, &lo, &size), 0);
	pthread_attr_destroy(&a);
	return (const uint8_t *)p >= (const uint8_t *)lo &&
	       (const uint8_t *)p < (const uint8_t *)lo + size;
}

/* Calls made after the round write over the stack it ran on. */
static __attribute__((noinline)) void overwrite_stack(void)
{
	volatile uint8_t junk[64 * 1024];

	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = 0xa5;
}

/* The headers of a lost round's lent frames are where the kernel may still read them: not on
 * the stack (gone with the call that made the round), and still holding the header of their
 * frame after the driver is freed and other calls have used the stack; the packets are the
 * lender's memory. */
Test(driver_lost, the_headers_of_a_lost_round_stay_for_the_kernel)
{
	static struct owner o;
	static struct uring_lost_seen seen;
	struct rig r;

	rig_open(&r, NULL);
	owner_fill(&o, NULL);
	for (int i = 0; i < FRAMES; i++)
		cr_assert_eq(owner_lend(r.d, &o, i), 0);
	lose_io_uring_rounds(&seen);
	driver_tx_flush(r.d);
	cr_assert_eq(o.back, FRAMES);
	cr_assert_eq(seen.writes, FRAMES, "the kernel was given the round's writes");
	cr_assert_eq(atomic_load(&seen.n), 2 * FRAMES, "a header and a packet each");
	for (int i = 0; i < FRAMES; i++) {
		cr_assert_eq(seen.buf[2 * i].iov_len, VH);
		cr_assert_not(on_stack(seen.buf[2 * i].iov_base), "frame %d: its header on the stack",
			      i);
		cr_assert_eq(seen.buf[2 * i + 1].iov_base, o.pkt[i]);
		cr_assert_eq(seen.buf[2 * i + 1].iov_len, o.len[i]);
	}
	rig_close(&r);
	overwrite_stack();
	for (int i = 0; i < FRAMES; i++) {
		const uint8_t *h = seen.buf[2 * i].iov_base;
		const struct pkt_meta *m = &o.m[i];

		cr_assert_eq(h[0], m->flags, "frame %d: flags", i);
		cr_assert_eq(h[1], m->gso_type, "frame %d: gso_type", i);
		cr_assert_eq(h[2] | h[3] << 8, m->hdr_len, "frame %d: hdr_len", i);
		cr_assert_eq(h[4] | h[5] << 8, m->gso_size, "frame %d: gso_size", i);
		cr_assert_eq(h[6] | h[7] << 8, m->csum_start, "frame %d: csum_start", i);
		cr_assert_eq(h[8] | h[9] << 8, m->csum_offset, "frame %d: csum_offset", i);
	}
	CHECK_LEAKS();
}

/* ---- the lwIP stack as the lender ---- */

#define MSS 1400

struct lw {
	struct netstack *ns;
	struct stream *acc;
};

static enum driver_verdict lw_input(void *arg, uint8_t *buf, size_t len, const struct pkt_meta *m,
				    int64_t now, size_t *out_len, bool *plain, struct pkt_view *view)
{
	struct lw *w = arg;

	return lwip_stack_ops.input(w->ns, 0, buf, len, m, now, out_len, plain, view);
}

static void lw_batch_end(void *arg, int64_t now)
{
	struct lw *w = arg;

	lwip_stack_ops.batch_end(w->ns, 0, now);
}

static const struct driver_ops lw_ops = { .input = lw_input, .batch_end = lw_batch_end };

static void on_acc(void *arg, const struct flow_key *k, struct stream *s)
{
	struct lw *w = arg;

	(void)k;
	w->acc = s;
}

/* A TCP segment from the app at 10.0.0.2:port to 198.18.0.9:443, through the peer's end. */
static void app_send(struct rig *r, uint16_t port, uint8_t flags, uint32_t ack)
{
	uint8_t frame[VH + 256] = { 0 };
	struct tu_spec s;
	size_t len;

	tu_spec_tcp(&s, "10.0.0.2", port, "198.18.0.9", 443);
	s.tcp_flags = flags;
	s.seq = flags & TCP_SYN ? 1000 : 1001;
	s.ack = ack;
	if (flags & TCP_SYN) {
		s.mss = MSS;
		s.tcp_opts[0] = 1; /* NOP */
		s.tcp_opts[1] = 3; /* window scale 7 */
		s.tcp_opts[2] = 3;
		s.tcp_opts[3] = 7;
		s.tcp_opts_len = 4;
	}
	len = tu_build(&s, frame + VH, sizeof(frame) - VH);
	cr_assert_eq(send(r->sv[1], frame, VH + len, 0), (ssize_t)(VH + len));
}

/* The loop's pass: what the driver reads, then the stack's deferred work (its flush). */
static void pass(struct rig *r)
{
	driver_poll(r->d);
	event_base_loop(r->base, EVLOOP_NONBLOCK);
}

static uint64_t lw_counter(struct lw *w, const char *name)
{
	bool found;
	uint64_t v = tu_stack_counter(&lwip_stack_ops, w->ns, name, &found);

	cr_assert(found, "counter %s", name);
	return v;
}

/* The lwIP stack on a driver, wired as the proxy wires them (runtime/proxy.c): the budget from
 * the configuration, the driver's reads into the stack, the stack's output through the
 * driver, lending with the ring. */
struct lwrig {
	struct ts_config cfg;
	struct budget *b;
	struct log lg;
	struct rig r;
	struct lw w;
	uint64_t slots; /* the driver's read buffers, charged */
};

static void lwrig_open(struct lwrig *t)
{
	char err[TS_ERRLEN];
	struct budget_stats st;

	memset(t, 0, sizeof(*t));
	config_init(&t->cfg);
	cr_assert_eq(config_load_string("{\"stack\":\"lwip\",\"tun\":{\"large_segments\":true}}",
					&t->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&t->cfg.budget, &t->b), 0);
	log_init(&t->lg, LOG_LEVEL_ERROR, 2);
	rig_open_ops(&t->r, t->b, &lw_ops, &t->w);
	budget_get_stats(t->b, &st);
	t->slots = st.buffer_bytes_in_use;
	struct netstack_env env = { .base = t->r.base, .cfg = &t->cfg, .budget = t->b,
				    .log = &t->lg, .tx = driver_tx, .tx_arg = t->r.d,
				    .tx_meta = driver_tx_meta, .tx_lend = driver_tx_lend,
				    .tx_flush = driver_tx_flush };
	cr_assert_eq(lwip_stack_ops.start(&env, &t->w.ns, err, sizeof(err)), 0, "%s", err);
	lwip_stack_set_accept_hook(t->w.ns, on_acc, &t->w);
}

/* The app's connection from port 40001, accepted. */
static void lwrig_connect(struct lwrig *t)
{
	uint8_t got[VH + 256];
	struct pkt_view v;
	ssize_t n;

	app_send(&t->r, 40001, TCP_SYN, 0);
	pass(&t->r);
	n = recv(t->r.sv[1], got, sizeof(got), MSG_DONTWAIT);
	cr_assert_gt(n, VH, "the SYN-ACK");
	cr_assert_eq(pkt_parse(&v, got + VH, (size_t)n - VH), PKT_OK);
	app_send(&t->r, 40001, TCP_ACK, tu_get32(v.l4 + 4) + 1);
	pass(&t->r);
	cr_assert_not_null(t->w.acc, "accepted");
	cr_assert_eq(lw_counter(&t->w, "small_lent"), 1, "the SYN-ACK went from a small frame");
}

/* In the proxy's order (proxy_close): the connection, the stack, the driver, the budget —
 * every byte released but what the kernel may still read — and nothing leaked. */
static void lwrig_close(struct lwrig *t)
{
	struct budget_stats st;

	if (t->w.acc)
		t->w.acc->ops->abort(t->w.acc);
	t->w.acc = NULL;
	lwip_stack_ops.free(t->w.ns);
	t->w.ns = NULL;
	driver_free(t->r.d);
	budget_get_stats(t->b, &st);
	cr_assert_eq(st.buffer_bytes_in_use, st.buffer_bytes_abandoned,
		     "every byte released but what the kernel may still read");
	budget_free(t->b);
	event_base_free(t->r.base);
	close(t->r.sv[0]);
	close(t->r.sv[1]);
	config_fini(&t->cfg);
	CHECK_LEAKS();
}

/* A round lost with lwIP's frames lent in it — a short segment in one of the stack's small
 * frames and a large one from its own pbuf — gives both back as lost. The stack keeps them
 * (the pbuf's reference for good, its block's charge abandoned; the small frames' block
 * outlives the stack), and everything still closes. */
Test(driver_lost, the_lwip_stacks_frames_of_a_lost_round_stay_and_the_budget_closes)
{
	static uint8_t data[46 * MSS];
	static struct lwrig t;
	struct budget_stats st;
	uint8_t got[VH + 256];

	lwrig_open(&t);
	lwrig_connect(&t);
	/* Both are lent as the pass's train is flushed, and the pass's flush makes the round,
	 * which is lost. */
	lose_io_uring_rounds(NULL);
	cr_assert_eq(t.w.acc->ops->write(t.w.acc, data, 20), 20);
	cr_assert_eq(t.w.acc->ops->write(t.w.acc, data, sizeof(data)), (ssize_t)sizeof(data));
	event_base_loop(t.r.base, EVLOOP_NONBLOCK);
	cr_assert_not(driver_uring(t.r.d));
	cr_assert_eq(lw_counter(&t.w, "small_lent"), 2);
	cr_assert_eq(lw_counter(&t.w, "big_lent"), 1);
	cr_assert_eq(CTR(t.r.d, uring_lost_lent), 2, "both lent frames went back lost");
	cr_assert_eq(recv(t.r.sv[1], got, sizeof(got), MSG_DONTWAIT), -1);
	budget_get_stats(t.b, &st);
	cr_assert_gt(st.buffer_bytes_abandoned, t.slots + sizeof(data), "the segment's block too");
	lwrig_close(&t);
}

/* The proxy frees the stack before the driver (proxy_close). Frames the stack has lent then
 * (a short segment lent at a batch's end, the pass's flush not made yet) are written before
 * its memory goes: the driver holds none of a freed stack (AddressSanitizer would see it
 * read). */
Test(driver_lost, the_lwip_stack_freed_first_writes_what_it_lent)
{
	static struct lwrig t;
	uint8_t got[VH + 256];
	struct pkt_view v;
	ssize_t n;

	lwrig_open(&t);
	lwrig_connect(&t);
	cr_assert_eq(t.w.acc->ops->write(t.w.acc, "twenty bytes of data", 20), 20);
	driver_poll(t.r.d); /* nothing to read; the batch's end flushes the train */
	cr_assert_eq(lw_counter(&t.w, "small_lent"), 2, "the segment, lent");
	cr_assert_eq(recv(t.r.sv[1], got, sizeof(got), MSG_DONTWAIT), -1, "and not written yet");
	cr_assert_eq(CTR(t.r.d, tx_lent), 2);
	cr_assert_eq(CTR(t.r.d, tx_packets), 1, "one lent frame waits");
	t.w.acc->ops->abort(t.w.acc); /* as the dispatcher ends its sessions first */
	t.w.acc = NULL;
	lwip_stack_ops.free(t.w.ns);
	t.w.ns = NULL;
	n = recv(t.r.sv[1], got, sizeof(got), MSG_DONTWAIT);
	cr_assert_gt(n, VH, "the lent segment, written as the stack went");
	cr_assert_eq(pkt_parse(&v, got + VH, (size_t)n - VH), PKT_OK);
	cr_assert_eq(v.l4_len, 20 + 20, "its 20 bytes of data");
	cr_assert_eq(memcmp(got + n - 20, "twenty bytes of data", 20), 0);
	cr_assert_eq(ntohs(v.dport_be), 40001);
	cr_assert_eq(CTR(t.r.d, tx_packets), CTR(t.r.d, tx_lent), "every lent frame written");
	cr_assert_eq(CTR(t.r.d, tx_dropped), 0);
	cr_assert_eq(CTR(t.r.d, uring_lost_lent), 0);
	lwrig_close(&t);
}
