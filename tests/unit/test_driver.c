/* test_driver.c — the TUN driver's loop (core/driver.c): read, hand each packet to the input
 * function, act on its verdict in the same pass, count.
 *
 *   socketpair(AF_UNIX, SOCK_SEQPACKET) as a stand-in TUN fd (one packet per read and write,
 *   non-blocking, no root): the three verdicts (write back N bytes with the header it came
 *   with or a zeroed one, UDP hand-off, done), batches bounded at DRIVER_BATCH with one clock
 *   read and one batch_end per batch, the readiness edge on a real event loop, EAGAIN on an
 *   empty queue not counted, read errors and empty reads counted, failed writes (a full
 *   socket buffer) counted in tx_dropped; with the 10-byte virtio_net_hdr: the header turned
 *   into pkt_meta, bad headers dropped before the stack sees them, a TCP GSO super-packet
 *   written back whole with its header, a DATA_VALID super-packet made partial; read buffers a
 *   stack takes with their packet (driver_rx_take): the packet intact while the driver reads
 *   on into new buffers, charged to the budget, kept for reuse when given back, refused when
 *   the budget has no room, valid after the driver is freed; a round the ring loses (a
 *   seccomp listener answers io_uring_enter for the kernel): its read buffers left allocated,
 *   their charge abandoned so the budget still closes, none given to a stack.
 *
 *   A real TUN in a fresh network namespace (tests/unit/netns_child.h): a local UDP socket's
 *   datagrams to a peer behind the TUN are reflected by the input function and come back to
 *   it; a packet the kernel refuses is a tx_dropped; with offload, a UDP GSO super-datagram
 *   read from the TUN is written back whole and the kernel segments it.
 *
 * Offload rewriting and the UDP split are covered by test_offload.c and test_tun_vnet.c; here
 * every counter is checked against what the callbacks saw, by exact amounts.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/driver.h"
#include "core/pkt.h"
#include "core/tun.h"
#include "netns_child.h"
#include "testutil.h"
#include "uring_lose.h"

#define MAX_SEEN 128
#define VH TUN_VNET_HDR_LEN

/* What the input function does with the next packet. */
struct step {
	enum driver_verdict v;
	size_t out_len;   /* DRIVER_WRITE: 0 = the packet's own length */
	bool plain;
	bool reflect;     /* swap IPv4 addresses and ports in place (checksums stay valid) */
	bool corrupt;     /* DRIVER_WRITE: make the version nibble invalid (a TUN refuses it) */
	bool tx_first;    /* send tx_pkt with driver_tx before returning (a stack's own packet) */
	bool break_ring;  /* from now on io_uring_enter fails (a seccomp filter: EAGAIN) */
	int write_to;     /* DRIVER_WRITE: > 0, driver_write_to this fd (another queue) */
};

/* What the driver handed to the callbacks. */
struct seen {
	struct driver *d;          /* for steps that write with driver_tx */
	const uint8_t *tx_pkt;
	size_t tx_len;
	const struct step *script; /* per input, in order; NULL: script_default for every one */
	int n_script;
	struct step script_default;
	int inputs;
	size_t in_len[MAX_SEEN];
	uint8_t in_first[MAX_SEEN];   /* the first payload byte of a built packet: its index */
	int64_t in_now[MAX_SEEN];
	struct pkt_meta meta[MAX_SEEN];
	uint64_t in_bytes;
	int batches;
	int64_t batch_now;
	int udp;
	size_t udp_len[MAX_SEEN];
	uint64_t udp_bytes;
	int udp_view_bad;  /* UDP hand-offs whose view is not the datagram's own parse */
	uint8_t udp_first[MAX_SEEN]; /* the first payload byte of each datagram handed on */
};

static void reflect4(uint8_t *p)
{
	uint8_t t[4];
	size_t l3 = (size_t)(p[0] & 0x0f) * 4;

	memcpy(t, p + 12, 4);
	memcpy(p + 12, p + 16, 4);
	memcpy(p + 16, t, 4);
	memcpy(t, p + l3, 2);
	memcpy(p + l3, p + l3 + 2, 2);
	memcpy(p + l3 + 2, t, 2);
}

/* A seccomp filter: io_uring_enter fails with EAGAIN from now on (its ring can no longer take
 * a batch); everything else is allowed. Criterion runs each test in a process of its own. */
static void break_io_uring_enter(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_enter, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAGAIN),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };

	cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
	cr_assert_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0);
}

static enum driver_verdict in_fn(void *arg, uint8_t *buf, size_t len, const struct pkt_meta *m,
				 int64_t now, size_t *out_len, bool *plain, struct pkt_view *view)
{
	struct seen *s = arg;
	int i = s->inputs++;
	const struct step *st = s->script && i < s->n_script ? &s->script[i] : &s->script_default;

	if (i < MAX_SEEN) {
		s->in_len[i] = len;
		s->in_first[i] = len > 28 ? buf[28] : 0;
		s->in_now[i] = now;
		s->meta[i] = *m;
	}
	s->in_bytes += len;
	/* A stack hands its parse on with a UDP verdict; these tests send only parsable UDP. */
	if (st->v == DRIVER_UDP && pkt_parse(view, buf, len) != PKT_OK)
		return DRIVER_DONE;
	if (st->break_ring)
		break_io_uring_enter();
	if (st->tx_first)
		driver_tx(s->d, s->tx_pkt, s->tx_len);
	if (st->v != DRIVER_WRITE)
		return st->v;
	if (st->reflect)
		reflect4(buf);
	if (st->corrupt)
		buf[0] = 0x05;
	*out_len = st->out_len ? st->out_len : len;
	*plain = st->plain;
	if (st->write_to > 0)
		driver_write_to(s->d, st->write_to);
	return DRIVER_WRITE;
}

static void batch_fn(void *arg, int64_t now)
{
	struct seen *s = arg;
	s->batches++;
	s->batch_now = now;
}

/* The view that comes with a datagram must be what parsing that datagram gives. */
static bool view_is_parse(const uint8_t *pkt, size_t len, const struct pkt_view *v)
{
	struct pkt_view p;

	/* pkt_parse only reads (it takes a mutable buffer for the stacks' in-place rewrites). */
	if (pkt_parse(&p, (uint8_t *)pkt, len) != PKT_OK)
		return false;
	return v->ip == pkt && v->l4 == p.l4 && v->len == p.len &&
	       v->l4_len == p.l4_len && v->l3_len == p.l3_len && v->family == p.family &&
	       v->proto == p.proto && v->sport_be == p.sport_be && v->dport_be == p.dport_be;
}

static void udp_fn(void *arg, const uint8_t *pkt, size_t len, const struct pkt_view *view,
		   int64_t now)
{
	struct seen *s = arg;
	(void)now;
	if (s->udp < MAX_SEEN) {
		s->udp_len[s->udp] = len;
		s->udp_first[s->udp] = len > view->l3_len + 8u ? pkt[view->l3_len + 8] : 0;
	}
	if (!view_is_parse(pkt, len, view))
		s->udp_view_bad++;
	s->udp++;
	s->udp_bytes += len;
}

static const struct driver_ops ops = { .input = in_fn, .batch_end = batch_fn, .udp = udp_fn };
static const struct driver_ops ops_no_udp = { .input = in_fn, .batch_end = batch_fn };

static uint64_t ctr_at(const struct driver *d, size_t off)
{
	return ctr_get((const ctr_t *)((const char *)driver_get_counters(d) + off));
}
#define CTR(d, name) ctr_at(d, offsetof(struct driver_counters, name))

/* ---- the socketpair stand-in (parent side, Criterion assertions) ---- */

/* The tests of suite driver_ring run the same bodies with batched I/O (core/uring.h). */
static bool ring;

struct rig {
	struct event_base *base;
	struct driver *d;
	int dfd, pfd; /* the driver's end, the peer's end */
	size_t hlen;  /* header bytes per frame: 0, or the device's vnet header size */
	struct seen s;
};

/* hlen: 0 (per-packet) or the vnet header size of the stand-in device (10, 12, ...). */
static void rig_open_hdr(struct rig *r, size_t hlen, const struct driver_ops *o)
{
	int sv[2];
	struct driver_params p = { .mtu = 1500, .vnet_hdr = hlen != 0,
				   .vnet_hdr_len = (uint32_t)hlen, .uring = ring };

	memset(r, 0, sizeof(*r));
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	r->dfd = p.fd = sv[0];
	r->pfd = sv[1];
	r->base = event_base_new();
	cr_assert(r->base);
	cr_assert_eq(driver_new(r->base, &p, o, &r->s, NULL, &r->d), 0);
	cr_assert_eq(driver_offload(r->d), hlen != 0);
	cr_assert_eq(driver_uring(r->d), ring, "batched I/O: %s", strerror(-driver_uring_err(r->d)));
	r->hlen = hlen;
	r->s.d = r->d;
}

static void rig_open(struct rig *r, bool vnet, const struct driver_ops *o)
{
	rig_open_hdr(r, vnet ? VH : 0, o);
}

static void rig_close(struct rig *r)
{
	driver_free(r->d);
	event_base_free(r->base);
	close(r->dfd);
	if (r->pfd >= 0)
		close(r->pfd);
}

/* A UDP packet 10.0.0.2:4000 -> 10.0.0.1:53 whose first payload byte is idx. */
static size_t udp_pkt(uint8_t *buf, size_t cap, size_t payload, uint8_t idx)
{
	uint8_t pl[2048];
	struct tu_spec s;

	cr_assert_leq(payload, sizeof(pl));
	tu_fill_pattern(pl, payload, idx);
	pl[0] = idx;
	tu_spec_udp(&s, "10.0.0.2", 4000, "10.0.0.1", 53);
	s.payload = pl;
	s.payload_len = payload;
	return tu_build(&s, buf, cap);
}

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void peer_send(struct rig *r, const struct pkt_meta *m, const uint8_t *pkt, size_t len)
{
	uint8_t frame[TUN_VNET_HDR_MAX + TU_PKT_MAX];
	size_t h = r->hlen;

	memset(frame, 0, h);
	if (m) { /* the virtio_net_hdr layout, little-endian fields (TUNSETVNETLE) */
		frame[0] = m->flags;
		frame[1] = m->gso_type;
		put_le16(frame + 2, m->hdr_len);
		put_le16(frame + 4, m->gso_size);
		put_le16(frame + 6, m->csum_start);
		put_le16(frame + 8, m->csum_offset);
	}
	cr_assert_leq(len, TU_PKT_MAX);
	memcpy(frame + h, pkt, len);
	cr_assert_eq(send(r->pfd, frame, h + len, 0), (ssize_t)(h + len), "send: %s",
		     strerror(errno));
}

/* The next frame the driver wrote, or -1 when there is none. */
static ssize_t peer_recv(struct rig *r, uint8_t *buf, size_t cap)
{
	ssize_t n = recv(r->pfd, buf, cap, MSG_DONTWAIT);

	cr_assert(n >= 0 || errno == EAGAIN, "recv: %s", strerror(errno));
	return n;
}

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

TestSuite(driver, .timeout = 10);
TestSuite(driver_ring, .timeout = 10);

/* One batch of four packets, one verdict each: write back N bytes of the rewritten packet
 * (with a rewrite counted), write back a packet the stack built (plain: no rewrite counted),
 * hand to the UDP path, done. Then UDP verdicts without a UDP path: counted drops. */
static void verdicts_in_one_pass(void)
{
	static const struct step script[] = {
		{ .v = DRIVER_WRITE, .out_len = 60, .reflect = true },
		{ .v = DRIVER_WRITE, .plain = true },
		{ .v = DRIVER_UDP },
		{ .v = DRIVER_DONE },
	};
	uint8_t pkt[4][2048], got[2048];
	size_t len[4], sum = 0;
	struct rig r;

	rig_open(&r, false, &ops);
	r.s.script = script;
	r.s.n_script = 4;
	for (int i = 0; i < 4; i++) {
		len[i] = udp_pkt(pkt[i], sizeof(pkt[i]), 100 + 200 * (size_t)i, (uint8_t)i);
		peer_send(&r, NULL, pkt[i], len[i]);
		sum += len[i];
	}
	cr_assert_eq(driver_poll(r.d), 4);
	cr_assert_eq(r.s.inputs, 4);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(r.s.in_len[i], len[i], "packet %d length", i);
		cr_assert_eq(r.s.in_first[i], i, "packet %d in order", i);
		cr_assert_eq(r.s.in_now[i], r.s.batch_now, "one clock read per batch");
		cr_assert_eq(r.s.meta[i].flags | r.s.meta[i].gso_type, 0, "no metadata");
	}
	cr_assert_eq(r.s.batches, 1);
	/* The first: exactly 60 bytes of the packet as the input function left it. */
	reflect4(pkt[0]);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), 60);
	cr_assert_eq(memcmp(got, pkt[0], 60), 0);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)len[1]);
	cr_assert_eq(memcmp(got, pkt[1], len[1]), 0);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1, "UDP and DONE write nothing");
	cr_assert_eq(r.s.udp, 1);
	cr_assert_eq(r.s.udp_len[0], len[2]);
	cr_assert_eq(r.s.udp_view_bad, 0, "the input's view came with the datagram");
	cr_assert_eq(CTR(r.d, rx_packets), 4);
	cr_assert_eq(CTR(r.d, rx_bytes), sum);
	cr_assert_eq(CTR(r.d, tx_packets), 2);
	cr_assert_eq(CTR(r.d, tx_bytes), 60 + len[1]);
	cr_assert_eq(CTR(r.d, rewrites), 1, "a plain write is not a rewrite");
	cr_assert_eq(CTR(r.d, tx_dropped) + CTR(r.d, rx_errors) + CTR(r.d, udp_no_path), 0);
	rig_close(&r);

	/* Without a UDP path a UDP verdict is a counted drop. */
	rig_open(&r, false, &ops_no_udp);
	r.s.script_default.v = DRIVER_UDP;
	for (int i = 0; i < 3; i++)
		peer_send(&r, NULL, pkt[i], len[i]);
	cr_assert_eq(driver_poll(r.d), 3);
	cr_assert_eq(CTR(r.d, udp_no_path), 3);
	cr_assert_eq(CTR(r.d, tx_packets), 0);
	rig_close(&r);
}

Test(driver, verdicts_in_one_pass)
{
	verdicts_in_one_pass();
}

Test(driver_ring, verdicts_in_one_pass)
{
	ring = true;
	verdicts_in_one_pass();
}

/* driver_write_to: a write-back goes to the other queue's fd, whole and in its place; the next
 * packet's goes to the driver's own again; what goes where is counted as always. */
static void write_to_another_queue(void)
{
	struct step script[4] = {
		{ .v = DRIVER_WRITE },
		{ .v = DRIVER_WRITE }, /* .write_to set below */
		{ .v = DRIVER_WRITE },
		{ .v = DRIVER_WRITE },
	};
	uint8_t pkt[4][256], got[512];
	size_t len[4];
	int other[2];
	struct rig r;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, other), 0);
	script[1].write_to = other[0];
	script[3].write_to = other[0];
	rig_open(&r, true, &ops);
	r.s.script = script;
	r.s.n_script = 4;
	for (int i = 0; i < 4; i++) {
		len[i] = udp_pkt(pkt[i], sizeof(pkt[i]), 40 + (size_t)i, (uint8_t)i);
		peer_send(&r, NULL, pkt[i], len[i]);
	}
	cr_assert_eq(driver_poll(r.d), 4);
	driver_tx_flush(r.d);
	for (int i = 0; i < 4; i += 2) { /* the driver's own queue: 0 and 2, in order */
		cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(r.hlen + len[i]));
		cr_assert_eq(memcmp(got + r.hlen, pkt[i], len[i]), 0, "packet %d", i);
	}
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1, "nothing else on the own queue");
	for (int i = 1; i < 4; i += 2) { /* the other queue: 1 and 3, in order, with the header */
		cr_assert_eq(recv(other[1], got, sizeof(got), MSG_DONTWAIT), (ssize_t)(r.hlen + len[i]));
		cr_assert_eq(memcmp(got + r.hlen, pkt[i], len[i]), 0, "packet %d", i);
	}
	cr_assert_eq(recv(other[1], got, sizeof(got), MSG_DONTWAIT), -1);
	cr_assert_eq(CTR(r.d, tx_packets), 4);
	cr_assert_eq(CTR(r.d, rewrites), 4);
	cr_assert_eq(CTR(r.d, tx_dropped), 0);
	rig_close(&r);
	close(other[0]);
	close(other[1]);
}

Test(driver, write_to_another_queue)
{
	write_to_another_queue();
}

Test(driver_ring, write_to_another_queue)
{
	ring = true;
	write_to_another_queue();
}

/* DRIVER_BATCH packets per poll at most; batch_end once per poll; EAGAIN ends a batch and is
 * not an error. */
static void batches_bounded_with_one_batch_end_each(void)
{
	const int n = DRIVER_BATCH + 7;
	uint8_t pkt[256];
	struct rig r;

	rig_open(&r, false, &ops);
	r.s.script_default.v = DRIVER_DONE;
	for (int i = 0; i < n; i++)
		peer_send(&r, NULL, pkt, udp_pkt(pkt, sizeof(pkt), 20, (uint8_t)i));
	cr_assert_eq(driver_poll(r.d), DRIVER_BATCH);
	cr_assert_eq(r.s.inputs, DRIVER_BATCH);
	cr_assert_eq(r.s.batches, 1);
	cr_assert_eq(driver_poll(r.d), 7);
	cr_assert_eq(r.s.inputs, n);
	cr_assert_eq(r.s.batches, 2);
	for (int i = 0; i < n; i++)
		cr_assert_eq(r.s.in_first[i], i, "packet %d in order", i);
	cr_assert_eq(r.s.in_now[DRIVER_BATCH], r.s.batch_now, "the second batch's clock");
	cr_assert_eq(driver_poll(r.d), 0, "empty queue");
	cr_assert_eq(r.s.batches, 3);
	cr_assert_eq(CTR(r.d, rx_packets), (uint64_t)n);
	cr_assert_eq(CTR(r.d, rx_bytes), r.s.in_bytes);
	cr_assert_eq(CTR(r.d, rx_errors), 0, "EAGAIN is not an error");
	rig_close(&r);
}

Test(driver, batches_bounded_with_one_batch_end_each)
{
	batches_bounded_with_one_batch_end_each();
}

Test(driver_ring, batches_bounded_with_one_batch_end_each)
{
	ring = true;
	batches_bounded_with_one_batch_end_each();
}

/* On the loop: each readiness callback drains one bounded batch, then yields (one pass of
 * the loop, EVLOOP_ONCE, runs the callback once). */
static void readiness_edge_reads_one_batch(void)
{
	const int n = DRIVER_BATCH + 5;
	uint8_t pkt[256];
	struct rig r;

	rig_open(&r, false, &ops);
	r.s.script_default.v = DRIVER_DONE;
	cr_assert_eq(event_base_loop(r.base, EVLOOP_ONCE | EVLOOP_NONBLOCK), 0);
	cr_assert_eq(r.s.batches, 0, "nothing readable, no callback");
	for (int i = 0; i < n; i++)
		peer_send(&r, NULL, pkt, udp_pkt(pkt, sizeof(pkt), 20, (uint8_t)i));
	cr_assert_eq(event_base_loop(r.base, EVLOOP_ONCE | EVLOOP_NONBLOCK), 0);
	cr_assert_eq(r.s.inputs, DRIVER_BATCH);
	cr_assert_eq(r.s.batches, 1);
	cr_assert_eq(event_base_loop(r.base, EVLOOP_ONCE | EVLOOP_NONBLOCK), 0);
	cr_assert_eq(r.s.inputs, n);
	cr_assert_eq(r.s.batches, 2);
	rig_close(&r);
}

Test(driver, readiness_edge_reads_one_batch)
{
	readiness_edge_reads_one_batch();
}

Test(driver_ring, readiness_edge_reads_one_batch)
{
	ring = true;
	readiness_edge_reads_one_batch();
}

/* A full device queue (here: a full socket buffer) makes writes fail with EAGAIN: each failure
 * is one tx_dropped, the caller never blocks, a failed write-back is no rewrite, and writes
 * succeed again once the queue drains. A closed peer: an error, dropped as well. */
static void failed_writes_counted_in_tx_dropped(void)
{
	int small = 1, ok = 0, failed = 0, ret = 0;
	uint8_t pkt[256], got[256];
	size_t len = udp_pkt(pkt, sizeof(pkt), 100, 1);
	struct rig r;

	signal(SIGPIPE, SIG_IGN);
	rig_open(&r, false, &ops);
	cr_assert_eq(setsockopt(r.dfd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	while (ok < 10000 && (ret = driver_tx(r.d, pkt, len)) == 0)
		ok++;
	cr_assert_eq(ret, -EAGAIN, "driver_tx = %d after %d", ret, ok);
	failed++;
	cr_assert_eq(driver_tx(r.d, pkt, len), -EAGAIN);
	failed++;
	cr_assert_gt(ok, 0);
	cr_assert_eq(CTR(r.d, tx_packets), (uint64_t)ok);
	cr_assert_eq(CTR(r.d, tx_bytes), (uint64_t)ok * len);
	cr_assert_eq(CTR(r.d, tx_dropped), (uint64_t)failed);
	/* A write-back into the full queue. */
	r.s.script_default = (struct step){ .v = DRIVER_WRITE };
	peer_send(&r, NULL, pkt, len);
	cr_assert_eq(driver_poll(r.d), 1);
	cr_assert_eq(CTR(r.d, tx_dropped), (uint64_t)failed + 1);
	cr_assert_eq(CTR(r.d, rewrites), 0, "a dropped write-back is no rewrite");
	for (int i = 0; i < ok; i++)
		cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)len, "queued %d", i);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1, "only the written ones");
	cr_assert_eq(driver_tx(r.d, pkt, len), 0, "drained: writes go again");
	cr_assert_eq(CTR(r.d, tx_packets), (uint64_t)ok + 1);
	close(r.pfd);
	r.pfd = -1;
	ret = driver_tx(r.d, pkt, len);
	cr_assert(ret < 0 && ret != -EAGAIN, "closed peer: driver_tx = %d", ret);
	cr_assert_eq(CTR(r.d, tx_dropped), (uint64_t)failed + 2);
	rig_close(&r);
}

Test(driver, failed_writes_counted_in_tx_dropped)
{
	failed_writes_counted_in_tx_dropped();
}

Test(driver_ring, failed_writes_counted_in_tx_dropped)
{
	ring = true;
	failed_writes_counted_in_tx_dropped();
}

/* An empty read is counted and the batch goes on; a read error other than EAGAIN is counted
 * and ends the batch. */
static void read_errors_counted(void)
{
	uint8_t pkt[256];
	struct rig r;
	int pp[2];

	rig_open(&r, false, &ops);
	r.s.script_default.v = DRIVER_DONE;
	cr_assert_eq(send(r.pfd, pkt, 0, 0), 0);
	peer_send(&r, NULL, pkt, udp_pkt(pkt, sizeof(pkt), 10, 7));
	cr_assert_eq(driver_poll(r.d), 2);
	cr_assert_eq(CTR(r.d, rx_errors), 1);
	cr_assert_eq(CTR(r.d, rx_packets), 1);
	cr_assert_eq(r.s.inputs, 1);
	cr_assert_eq(r.s.in_first[0], 7);
	rig_close(&r);

	/* The write end of a pipe: read() fails with EBADF. */
	struct driver *d;
	struct seen s = { 0 };
	struct event_base *base = event_base_new();
	cr_assert_eq(pipe2(pp, O_NONBLOCK | O_CLOEXEC), 0);
	struct driver_params p = { .fd = pp[1], .mtu = 1500, .uring = ring };
	cr_assert_eq(driver_new(base, &p, &ops, &s, NULL, &d), 0);
	cr_assert_eq(driver_poll(d), 0);
	/* With the ring: each read of the first round, then the read() that checks the ring. */
	cr_assert_eq(CTR(d, rx_errors), ring ? DRIVER_URING_FIRST_READS + 1u : 1u);
	cr_assert_eq(CTR(d, uring_read_refused), 0, "EBADF: the fd's failure, not the ring's");
	cr_assert_eq(s.inputs, 0);
	cr_assert_eq(s.batches, 1);
	driver_free(d);
	event_base_free(base);
	close(pp[0]);
	close(pp[1]);
}

Test(driver, read_errors_counted)
{
	read_errors_counted();
}

Test(driver_ring, read_errors_counted)
{
	ring = true;
	read_errors_counted();
}

Test(driver, bad_params_refused)
{
	struct event_base *base = event_base_new();
	struct driver_ops no_input = { .udp = udp_fn };
	struct driver_params p = { .fd = 0, .mtu = 1500 };
	struct driver *d = NULL;

	cr_assert_eq(driver_new(base, NULL, &ops, NULL, NULL, &d), -EINVAL);
	p.fd = -1;
	cr_assert_eq(driver_new(base, &p, &ops, NULL, NULL, &d), -EINVAL);
	p.fd = 0;
	p.mtu = 575;
	cr_assert_eq(driver_new(base, &p, &ops, NULL, NULL, &d), -EINVAL);
	p.mtu = 1500;
	cr_assert_eq(driver_new(base, &p, NULL, NULL, NULL, &d), -EINVAL);
	cr_assert_eq(driver_new(base, &p, &no_input, NULL, NULL, &d), -EINVAL);
	p.vnet_hdr = true;
	p.vnet_hdr_len = VH - 1;
	cr_assert_eq(driver_new(base, &p, &ops, NULL, NULL, &d), -EINVAL);
	p.vnet_hdr_len = TUN_VNET_HDR_MAX + 1;
	cr_assert_eq(driver_new(base, &p, &ops, NULL, NULL, &d), -EINVAL);
	cr_assert_null(d);
	event_base_free(base);
}

/* With the ring, write-backs wait for the next round; a packet the stack writes itself in the
 * middle of a batch (driver_tx) must not overtake the write-backs queued before it: they are
 * flushed first. The peer sees p0, the stack's packet, p2 — the order they were produced. */
Test(driver_ring, driver_tx_does_not_overtake_queued_write_backs)
{
	static const struct step script[] = {
		{ .v = DRIVER_WRITE },
		{ .v = DRIVER_DONE, .tx_first = true },
		{ .v = DRIVER_WRITE },
	};
	uint8_t pkt[3][256], own[256], got[256];
	size_t len[3], own_len = udp_pkt(own, sizeof(own), 50, 0xee);
	struct rig r;

	ring = true;
	rig_open(&r, false, &ops);
	r.s.script = script;
	r.s.n_script = 3;
	r.s.tx_pkt = own;
	r.s.tx_len = own_len;
	for (int i = 0; i < 3; i++) {
		len[i] = udp_pkt(pkt[i], sizeof(pkt[i]), 60 + (size_t)i, (uint8_t)i);
		peer_send(&r, NULL, pkt[i], len[i]);
	}
	cr_assert_eq(driver_poll(r.d), 3);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)len[0]);
	cr_assert_eq(memcmp(got, pkt[0], len[0]), 0, "the write-back queued first");
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)own_len);
	cr_assert_eq(memcmp(got, own, own_len), 0, "then the stack's own packet");
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)len[2]);
	cr_assert_eq(memcmp(got, pkt[2], len[2]), 0);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1);
	cr_assert_eq(CTR(r.d, uring_flushes), 1);
	cr_assert_eq(CTR(r.d, tx_packets), 3);
	cr_assert_eq(CTR(r.d, rewrites), 2);
	rig_close(&r);
}

/* A burst of small packets: read and written back in rounds of several, every packet intact
 * and in order; far fewer io_uring_enter calls than the read() and write() calls they stand
 * for; reads that found nothing counted. */
Test(driver_ring, rounds_carry_several_packets_each)
{
	const int n = 40;
	uint8_t pkt[256], got[256];
	struct rig r;

	ring = true;
	rig_open(&r, false, &ops);
	r.s.script_default = (struct step){ .v = DRIVER_WRITE, .reflect = true };
	for (int i = 0; i < n; i++)
		peer_send(&r, NULL, pkt, udp_pkt(pkt, sizeof(pkt), 30 + (size_t)i, (uint8_t)i));
	cr_assert_eq(driver_poll(r.d), n);
	for (int i = 0; i < n; i++) {
		size_t len = udp_pkt(pkt, sizeof(pkt), 30 + (size_t)i, (uint8_t)i);
		reflect4(pkt);
		cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)len, "packet %d", i);
		cr_assert_eq(memcmp(got, pkt, len), 0, "packet %d intact", i);
	}
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1);
	cr_assert_leq(CTR(r.d, uring_enters), 8, "%llu rounds for %d reads and %d writes",
		      (unsigned long long)CTR(r.d, uring_enters), n, n);
	cr_assert_gt(CTR(r.d, uring_reads_empty), 0, "the last round found the device empty");
	cr_assert_eq(CTR(r.d, tx_packets), (uint64_t)n);
	cr_assert_eq(CTR(r.d, uring_flushes), 0);
	cr_assert(driver_uring(r.d));
	rig_close(&r);
}

/* io_uring_enter fails in the middle of a batch (at packet k of a burst; with a stack's own
 * packet written at that point, or not): the write-backs the ring never made go out with
 * writev(), the reads it never made are left for read(), and the driver reads and writes with
 * system calls from then on. Every packet comes back once, intact, in order; the counters add
 * up; the reason is counted. */
Test(driver_ring, io_uring_enter_failing_mid_batch_loses_nothing)
{
	static const int ks[] = { 1, 5, 12 };
	const int n = 24;

	for (size_t c = 0; c < 2 * sizeof(ks) / sizeof(ks[0]); c++) {
		pid_t pid = fork();

		cr_assert_geq(pid, 0);
		if (pid == 0) {
			/* A child per case: the filter cannot be taken back. Exit 0: all well. */
			struct step script[24];
			uint8_t pkt[256], got[256], own[256];
			size_t own_len = udp_pkt(own, sizeof(own), 20, 0xee);
			bool tx = c % 2;
			int k = ks[c / 2], want_tx;
			struct rig r;

			ring = true;
			rig_open(&r, false, &ops);
			for (int i = 0; i < n; i++)
				script[i] = (struct step){ .v = DRIVER_WRITE, .reflect = true,
							   .break_ring = i == k,
							   .tx_first = tx && i == k };
			r.s.script = script;
			r.s.n_script = n;
			r.s.tx_pkt = own;
			r.s.tx_len = own_len;
			for (int i = 0; i < n; i++)
				peer_send(&r, NULL, pkt, udp_pkt(pkt, sizeof(pkt), 30, (uint8_t)i));
			while (r.s.inputs < n && driver_poll(r.d) > 0)
				;
			if (r.s.inputs != n || driver_uring(r.d) ||
			    CTR(r.d, uring_enter_failed) != 1)
				_exit(10);
			for (int i = 0; i < n; i++) {
				size_t len = udp_pkt(pkt, sizeof(pkt), 30, (uint8_t)i);
				if (tx && i == k) {
					if (peer_recv(&r, got, sizeof(got)) != (ssize_t)own_len ||
					    memcmp(got, own, own_len) != 0)
						_exit(11);
				}
				reflect4(pkt);
				if (peer_recv(&r, got, sizeof(got)) != (ssize_t)len ||
				    memcmp(got, pkt, len) != 0)
					_exit(20 + i);
			}
			want_tx = n + (tx ? 1 : 0);
			if (peer_recv(&r, got, sizeof(got)) != -1 ||
			    CTR(r.d, tx_packets) != (uint64_t)want_tx ||
			    CTR(r.d, rewrites) != (uint64_t)n || CTR(r.d, tx_dropped) != 0 ||
			    CTR(r.d, rx_packets) != (uint64_t)n)
				_exit(12);
			rig_close(&r);
			_exit(0);
		}
		int st = -1;
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
			  "case k=%d%s: child status %d (10: counts, 11: the stack's packet, 12: "
			  "totals, 20+i: packet i)", ks[c / 2], c % 2 ? " with driver_tx" : "",
			  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
}

/* A device the ring cannot read without blocking (a pseudo-terminal: EOPNOTSUPP) while
 * read() can: the driver gives the ring up for good, counts why, and reads with read() from
 * then on, in the same batch, without losing what was waiting. */
Test(driver_ring, a_device_the_ring_cannot_read_falls_back_to_read)
{
	struct event_base *base = event_base_new();
	struct seen s = { 0 };
	struct driver *d;
	int m, sl;

	cr_assert_eq(openpty(&m, &sl, NULL, NULL, NULL), 0);
	cr_assert_eq(fcntl(m, F_SETFL, O_NONBLOCK), 0);
	cr_assert_eq(write(sl, "twinstack\n", 10), 10);
	struct driver_params p = { .fd = m, .mtu = 1500, .uring = true };
	s.script_default.v = DRIVER_DONE;
	cr_assert_eq(driver_new(base, &p, &ops, &s, NULL, &d), 0);
	cr_assert(driver_uring(d));
	cr_assert_eq(driver_poll(d), 1);
	cr_assert_eq(CTR(d, uring_read_refused), 1);
	cr_assert_not(driver_uring(d), "read() from now on");
	cr_assert_eq(s.inputs, 1, "read() got what the ring could not");
	cr_assert_geq(s.in_len[0], 10);
	cr_assert_eq(CTR(d, rx_packets), 1);
	cr_assert_eq(driver_poll(d), 0, "then EAGAIN, with read()");
	cr_assert_eq(CTR(d, uring_enters), 1);
	driver_free(d);
	event_base_free(base);
	close(sl);
	close(m);
}

/* ---- frames a stack lends (driver_tx_lend) ---- */

/* What the release callbacks saw: the order frames were given back in. */
struct lends {
	int n;
	int order[64];
};

struct lend_arg {
	struct lends *l;
	int id;
};

static void lend_release(void *arg, bool lost)
{
	struct lend_arg *a = arg;

	cr_assert_not(lost, "frame %d given back as lost", a->id);
	if (a->l->n < 64)
		a->l->order[a->l->n] = a->id;
	a->l->n++;
}

/* A UDP packet (first payload byte idx) lent with a GSO header: sizes, header fields and
 * bytes are what the peer must see. */
static size_t lend_pkt(uint8_t *buf, size_t cap, uint8_t idx, struct pkt_meta *m)
{
	size_t len = udp_pkt(buf, cap, 100 + idx, idx);

	tu_meta_partial(buf, len, 0, m);
	m->gso_type = PKT_GSO_UDP_L4;
	m->gso_size = 40;
	return len;
}

/* The peer's next frame is lent packet idx, header included (hlen bytes: ours, then zeros). */
static void expect_lent(struct rig *r, const uint8_t *pkt, size_t len, const struct pkt_meta *m,
			int idx)
{
	uint8_t got[TUN_VNET_HDR_MAX + 512];

	cr_assert_eq(peer_recv(r, got, sizeof(got)), (ssize_t)(r->hlen + len), "frame %d", idx);
	cr_assert_eq(got[0], m->flags, "frame %d: flags", idx);
	cr_assert_eq(got[1], m->gso_type, "frame %d: gso_type", idx);
	cr_assert_eq(le16(got + 2), m->hdr_len, "frame %d: hdr_len", idx);
	cr_assert_eq(le16(got + 4), m->gso_size, "frame %d: gso_size", idx);
	cr_assert_eq(le16(got + 6), m->csum_start, "frame %d: csum_start", idx);
	cr_assert_eq(le16(got + 8), m->csum_offset, "frame %d: csum_offset", idx);
	for (size_t i = VH; i < r->hlen; i++)
		cr_assert_eq(got[i], 0, "frame %d: a longer header's byte %zu is zero", idx, i);
	cr_assert_eq(memcmp(got + r->hlen, pkt, len), 0, "frame %d intact", idx);
}

/* n frames to lend (lend_pkt i, released into l as id i). */
#define LENDSET_MAX (DRIVER_LEND_MAX + 3)
struct lendset {
	int n;
	uint8_t pkt[LENDSET_MAX][512];
	struct pkt_meta m[LENDSET_MAX];
	size_t len[LENDSET_MAX];
	struct lend_arg a[LENDSET_MAX];
	struct lends l;
};

static void lendset_fill(struct lendset *ls, int n)
{
	cr_assert_leq(n, LENDSET_MAX);
	memset(ls, 0, sizeof(*ls));
	ls->n = n;
	for (int i = 0; i < n; i++) {
		ls->len[i] = lend_pkt(ls->pkt[i], sizeof(ls->pkt[i]), (uint8_t)i, &ls->m[i]);
		ls->a[i] = (struct lend_arg){ &ls->l, i };
	}
}

/* Lend frame i of ls to d. */
static int lend(struct driver *d, struct lendset *ls, int i)
{
	return driver_tx_lend(d, ls->pkt[i], ls->len[i], &ls->m[i], lend_release, &ls->a[i]);
}

/* Lent frames wait (nothing written, nothing given back) until a packet the stack writes
 * itself; they go first, in the order lent, in one io_uring_enter, each given back once
 * after its write; then the stack's packet. driver_tx_flush with nothing queued is no round. */
static void lent_frames_wait_then_go_in_order(size_t hlen)
{
	static struct lendset ls;
	uint8_t own[256], got[512];
	size_t own_len = udp_pkt(own, sizeof(own), 50, 0xee);
	struct rig r;

	ring = true;
	rig_open_hdr(&r, hlen, &ops);
	lendset_fill(&ls, 3);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(lend(r.d, &ls, i), 0);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1, "nothing written yet");
	cr_assert_eq(ls.l.n, 0, "nothing given back yet");
	cr_assert_eq(CTR(r.d, uring_enters), 0);
	cr_assert_eq(driver_tx(r.d, own, own_len), 0);
	cr_assert_eq(CTR(r.d, uring_enters), 1, "the three in one round");
	cr_assert_eq(CTR(r.d, uring_flushes), 1);
	cr_assert_eq(CTR(r.d, uring_flush_writes), 3);
	cr_assert_eq(ls.l.n, 3);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(ls.l.order[i], i, "given back in order");
		expect_lent(&r, ls.pkt[i], ls.len[i], &ls.m[i], i);
	}
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(hlen + own_len));
	cr_assert_eq(memcmp(got + hlen, own, own_len), 0, "then the stack's own packet");
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1);
	driver_tx_flush(r.d);
	cr_assert_eq(CTR(r.d, uring_enters), 1, "an empty flush is no round");
	cr_assert_eq(CTR(r.d, tx_lent), 3);
	cr_assert_eq(CTR(r.d, tx_packets), 4);
	cr_assert_eq(CTR(r.d, tx_gso), 3);
	cr_assert_eq(CTR(r.d, tx_bytes), ls.len[0] + ls.len[1] + ls.len[2] + own_len);
	cr_assert_eq(CTR(r.d, tx_dropped), 0);
	rig_close(&r);
}

Test(driver_ring, lent_frames_wait_then_go_in_order)
{
	lent_frames_wait_then_go_in_order(VH);
}

Test(driver_ring, lent_frames_with_a_longer_device_header)
{
	lent_frames_wait_then_go_in_order(VH + 2);
}

/* More frames lent than a round takes: the one that finds DRIVER_LEND_MAX queued writes them
 * first (one round), and driver_tx_flush the rest; all arrive in order, all given back. */
Test(driver_ring, lending_past_the_limit_flushes)
{
	const int n = DRIVER_LEND_MAX + 3;
	static struct lendset ls;
	struct rig r;

	ring = true;
	rig_open(&r, true, &ops);
	lendset_fill(&ls, n);
	for (int i = 0; i < n; i++) {
		cr_assert_eq(lend(r.d, &ls, i), 0);
		cr_assert_eq(ls.l.n, i < DRIVER_LEND_MAX ? 0 : DRIVER_LEND_MAX, "after lend %d", i);
	}
	cr_assert_eq(CTR(r.d, uring_enters), 1);
	driver_tx_flush(r.d);
	cr_assert_eq(CTR(r.d, uring_enters), 2);
	cr_assert_eq(CTR(r.d, uring_flush_writes), (uint64_t)n);
	cr_assert_eq(ls.l.n, n);
	for (int i = 0; i < n; i++) {
		cr_assert_eq(ls.l.order[i], i);
		expect_lent(&r, ls.pkt[i], ls.len[i], &ls.m[i], i);
	}
	cr_assert_eq(CTR(r.d, tx_packets), (uint64_t)n);
	rig_close(&r);
}

/* Frames lent while a batch is read (a stack's output as it takes in ACKs) go at the head of
 * the next round, with its reads: no round of their own. The peer sees them before the
 * write-back of the packet read after them. */
static enum driver_verdict lend_in_fn(void *arg, uint8_t *buf, size_t len,
				      const struct pkt_meta *m, int64_t now, size_t *out_len,
				      bool *plain, struct pkt_view *view);

struct lend_script {
	struct seen s;       /* first: in_fn's state */
	const uint8_t *pkt;  /* lent by the first input */
	size_t len;
	struct pkt_meta m;
	struct lend_arg a;
};

static enum driver_verdict lend_in_fn(void *arg, uint8_t *buf, size_t len,
				      const struct pkt_meta *m, int64_t now, size_t *out_len,
				      bool *plain, struct pkt_view *view)
{
	struct lend_script *ls = arg;

	if (ls->s.inputs == 0)
		cr_assert_eq(driver_tx_lend(ls->s.d, ls->pkt, ls->len, &ls->m, lend_release,
					    &ls->a), 0);
	return in_fn(&ls->s, buf, len, m, now, out_len, plain, view);
}

Test(driver_ring, lent_frames_go_with_the_next_round)
{
	static const struct driver_ops lend_ops = { .input = lend_in_fn, .batch_end = batch_fn };
	uint8_t pkt[512], in[2][256], got[512];
	struct lends l = { 0 };
	struct lend_script ls;
	struct rig r;
	size_t in_len[2];

	ring = true;
	memset(&ls, 0, sizeof(ls));
	rig_open(&r, true, &lend_ops);
	/* rig_open pointed the callbacks at r.s; this test's state is ls (r.s unused). */
	driver_free(r.d);
	{
		struct driver_params p = { .fd = r.dfd, .mtu = 1500, .vnet_hdr = true,
					   .uring = true };
		cr_assert_eq(driver_new(r.base, &p, &lend_ops, &ls, NULL, &r.d), 0);
	}
	ls.s.d = r.d;
	ls.s.script_default = (struct step){ .v = DRIVER_DONE };
	ls.len = lend_pkt(pkt, sizeof(pkt), 7, &ls.m);
	ls.pkt = pkt;
	ls.a = (struct lend_arg){ &l, 7 };
	for (int i = 0; i < 2; i++) {
		in_len[i] = udp_pkt(in[i], sizeof(in[i]), 20, (uint8_t)(0x40 + i));
		peer_send(&r, NULL, in[i], in_len[i]);
	}
	cr_assert_eq(driver_poll(r.d), 2);
	cr_assert_eq(ls.s.inputs, 2);
	cr_assert_eq(l.n, 1, "written and given back within the poll");
	cr_assert_eq(CTR(r.d, uring_flushes), 0, "no round of its own");
	cr_assert_eq(CTR(r.d, tx_lent), 1);
	expect_lent(&r, pkt, ls.len, &ls.m, 7);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), -1);
	rig_close(&r);
}

/* Without the ring a lent frame is written at once and given back before driver_tx_lend
 * returns; nothing is counted as lent. */
Test(driver, lent_frame_without_the_ring_written_at_once)
{
	uint8_t pkt[512];
	struct pkt_meta m;
	struct lends l = { 0 };
	struct lend_arg a = { &l, 1 };
	size_t len = lend_pkt(pkt, sizeof(pkt), 1, &m);
	struct rig r;

	ring = false;
	rig_open(&r, true, &ops);
	cr_assert_eq(driver_tx_lend(r.d, pkt, len, &m, lend_release, &a), 0);
	cr_assert_eq(l.n, 1);
	expect_lent(&r, pkt, len, &m, 1);
	cr_assert_eq(CTR(r.d, tx_lent), 0);
	cr_assert_eq(CTR(r.d, tx_packets), 1);
	rig_close(&r);
}

/* The ring fails when lent frames are due (io_uring_enter refused from then on): they go with
 * writev() instead, intact and in order, each given back once; the reason is counted; later
 * lends are written at once. */
Test(driver_ring, lent_frames_survive_the_ring_failing)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		static struct lendset ls;
		uint8_t got[512];
		struct rig r;

		ring = true;
		rig_open(&r, true, &ops);
		lendset_fill(&ls, 4);
		for (int i = 0; i < 3; i++)
			lend(r.d, &ls, i);
		break_io_uring_enter();
		driver_tx_flush(r.d);
		if (ls.l.n != 3 || driver_uring(r.d) || CTR(r.d, uring_enter_failed) != 1)
			_exit(10);
		if (lend(r.d, &ls, 3) != 0 || ls.l.n != 4)
			_exit(11);
		for (int i = 0; i < 4; i++) {
			if (ls.l.order[i] != i)
				_exit(12);
			if (peer_recv(&r, got, sizeof(got)) != (ssize_t)(VH + ls.len[i]) ||
			    memcmp(got + VH, ls.pkt[i], ls.len[i]) != 0 || got[1] != PKT_GSO_UDP_L4)
				_exit(20 + i);
		}
		if (peer_recv(&r, got, sizeof(got)) != -1 || CTR(r.d, tx_packets) != 4 ||
		    CTR(r.d, tx_dropped) != 0)
			_exit(13);
		rig_close(&r);
		_exit(0);
	}
	int st = -1;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		  "child status %d (10: fallback, 11: after, 12: order, 13: totals, 20+i: frame i)",
		  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* The ring loses a round (its operations neither completed nor cancelled): the driver stops
 * reading, and its read buffers, which the kernel may still write, are never reused nor freed.
 * Their charge stays with the budget as given up for good, so the budget still closes. */
Test(driver_ring, a_lost_round_leaves_the_read_buffers_and_the_budget_closes)
{
	struct event_base *base = event_base_new();
	struct driver_params p = { .mtu = 1500, .vnet_hdr = true, .uring = true };
	uint8_t pkt[256], frame[VH + 256] = { 0 };
	struct budget_limits l;
	struct budget_stats st;
	struct seen s = { 0 };
	struct budget *b;
	struct driver *d;
	uint64_t charged;
	size_t len;
	int sv[2];

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&l, &b), 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	p.fd = sv[0];
	s.script_default.v = DRIVER_DONE;
	cr_assert_eq(driver_new(base, &p, &ops, &s, b, &d), 0);
	cr_assert(driver_uring(d));
	budget_get_stats(b, &st);
	charged = st.buffer_bytes_in_use;
	cr_assert_gt(charged, 0, "the read buffers are charged");
	len = udp_pkt(pkt, sizeof(pkt), 30, 1);
	memcpy(frame + VH, pkt, len);
	cr_assert_eq(send(sv[1], frame, VH + len, 0), (ssize_t)(VH + len));
	lose_io_uring_rounds(NULL);
	cr_assert_eq(driver_poll(d), 0);
	cr_assert_eq(s.inputs, 0, "nothing read by a lost round is handled");
	cr_assert_not(driver_uring(d));
	cr_assert_eq(CTR(d, uring_enter_failed), 1);
	cr_assert_eq(CTR(d, rx_gone), 1, "reading stopped");
	cr_assert_eq(CTR(d, uring_lost_bytes), charged, "every read buffer left to the kernel");
	budget_get_stats(b, &st);
	cr_assert_eq(st.buffer_bytes_abandoned, charged);
	driver_free(d);
	budget_get_stats(b, &st);
	cr_assert_eq(st.buffer_bytes_in_use, charged, "the memory is still in use");
	cr_assert_eq(st.buffer_bytes_abandoned, charged);
	budget_free(b);
	event_base_free(base);
	close(sv[0]);
	close(sv[1]);
	CHECK_LEAKS();
}

/* What the input does when a round is lost under it: the first packet is written back (queued
 * for the next round), the second loses that round (a stack's own packet flushes it) and then
 * tries to take its read buffer. */
struct loser {
	struct driver *d;
	int inputs;
	int tx;                  /* driver_tx's result */
	struct driver_rxbuf *took;
};

static enum driver_verdict lose_fn(void *arg, uint8_t *buf, size_t len, const struct pkt_meta *m,
				   int64_t now, size_t *out_len, bool *plain, struct pkt_view *view)
{
	struct loser *t = arg;

	(void)m, (void)now, (void)view;
	if (t->inputs++ == 0) {
		*out_len = len;
		*plain = false;
		return DRIVER_WRITE;
	}
	lose_io_uring_rounds(NULL);
	t->tx = driver_tx(t->d, buf, len);
	t->took = driver_rx_take(t->d, buf);
	return DRIVER_DONE;
}

static const struct driver_ops lose_ops = { .input = lose_fn };

/* A round lost while a stack handles a packet (its own write flushes the queued write-back):
 * the write-back is a counted drop, the stack's packet goes with writev(), and the buffer
 * under the stack's packet can no longer be taken: every slot is the kernel's now, and a
 * taken one would be freed, or reused, under a write the kernel may still make. */
Test(driver_ring, a_round_lost_during_input_gives_no_buffer_away)
{
	struct event_base *base = event_base_new();
	struct driver_params p = { .mtu = 1500, .vnet_hdr = true, .uring = true };
	uint8_t pkt[2][256], frame[VH + 256] = { 0 }, got[VH + 256];
	struct budget_limits l;
	struct budget_stats st;
	struct loser t = { 0 };
	struct budget *b;
	struct driver *d;
	uint64_t charged;
	size_t len[2];
	int sv[2];

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&l, &b), 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	p.fd = sv[0];
	cr_assert_eq(driver_new(base, &p, &lose_ops, &t, b, &d), 0);
	t.d = d;
	budget_get_stats(b, &st);
	charged = st.buffer_bytes_in_use;
	for (int i = 0; i < 2; i++) {
		len[i] = udp_pkt(pkt[i], sizeof(pkt[i]), 30, (uint8_t)i);
		memcpy(frame + VH, pkt[i], len[i]);
		cr_assert_eq(send(sv[1], frame, VH + len[i], 0), (ssize_t)(VH + len[i]));
	}
	cr_assert_eq(driver_poll(d), 2);
	cr_assert_eq(t.inputs, 2);
	cr_assert_not(driver_uring(d));
	cr_assert_eq(t.tx, 0);
	cr_assert_null(t.took, "a slot given away after the round was lost");
	cr_assert_eq(CTR(d, rx_taken), 0);
	cr_assert_eq(CTR(d, tx_dropped), 1, "the lost write-back");
	cr_assert_eq(CTR(d, tx_packets), 1);
	cr_assert_eq(recv(sv[1], got, sizeof(got), MSG_DONTWAIT), (ssize_t)(VH + len[1]));
	cr_assert_eq(memcmp(got + VH, pkt[1], len[1]), 0, "the stack's packet, alone");
	cr_assert_eq(recv(sv[1], got, sizeof(got), MSG_DONTWAIT), -1);
	cr_assert_eq(CTR(d, uring_lost_bytes), charged);
	driver_free(d);
	budget_get_stats(b, &st);
	cr_assert_eq(st.buffer_bytes_in_use, charged);
	cr_assert_eq(st.buffer_bytes_abandoned, charged);
	budget_free(b);
	event_base_free(base);
	close(sv[0]);
	close(sv[1]);
	CHECK_LEAKS();
}

/* Frames still lent when the driver is freed are written and given back first. */
Test(driver_ring, lent_frames_written_when_the_driver_goes)
{
	static struct lendset ls;
	struct rig r;

	ring = true;
	rig_open(&r, true, &ops);
	lendset_fill(&ls, 2);
	for (int i = 0; i < 2; i++)
		cr_assert_eq(lend(r.d, &ls, i), 0);
	driver_free(r.d);
	r.d = NULL;
	cr_assert_eq(ls.l.n, 2);
	for (int i = 0; i < 2; i++)
		expect_lent(&r, ls.pkt[i], ls.len[i], &ls.m[i], i);
	rig_close(&r);
}

/* ---- read buffers a stack takes with their packet (driver_rx_take) ---- */

/* What the taking input does: packets whose first payload byte is even are taken (and checked:
 * a take of another pointer and a second take are refused), the rest left. */
struct taker {
	struct driver *d;
	struct driver_rxbuf *held[MAX_SEEN];
	const uint8_t *pkt[MAX_SEEN];
	size_t len[MAX_SEEN];
	int n, inputs, refused_other, refused_again, refused_budget;
};

static enum driver_verdict take_fn(void *arg, uint8_t *buf, size_t len, const struct pkt_meta *m,
				   int64_t now, size_t *out_len, bool *plain, struct pkt_view *view)
{
	struct taker *t = arg;
	struct driver_rxbuf *b;

	(void)m, (void)now, (void)out_len, (void)plain, (void)view;
	t->inputs++;
	if (len <= 28 || buf[28] % 2)
		return DRIVER_DONE;
	t->refused_other += driver_rx_take(t->d, buf + 1) == NULL;
	if (!(b = driver_rx_take(t->d, buf))) {
		t->refused_budget++;
		return DRIVER_DONE;
	}
	t->refused_again += driver_rx_take(t->d, buf) == NULL;
	cr_assert_lt(t->n, MAX_SEEN);
	t->held[t->n] = b;
	t->pkt[t->n] = buf;
	t->len[t->n++] = len;
	return DRIVER_DONE;
}

static const struct driver_ops take_ops = { .input = take_fn };

static uint64_t budget_in_use(const struct budget *b)
{
	struct budget_stats st;

	budget_get_stats(b, &st);
	return st.buffer_bytes_in_use;
}

/* Taken packets stay intact where they were read while the driver reads on into new buffers
 * (charged to the budget as the ones taken were), exactly the taken ones are counted, a take
 * of anything but the packet under way is refused, and the buffers outlive the driver. Given
 * back, a buffer is kept for the next take, charged to nothing. */
static void taken_buffers_keep_their_packets(void)
{
	uint8_t pkt[8][2048];
	size_t len[8];
	struct budget_limits l;
	struct budget *b;
	struct taker t = { 0 };
	struct driver_params p = { .mtu = 1500, .vnet_hdr = true, .uring = ring };
	struct event_base *base = event_base_new();
	struct driver *d;
	uint64_t idle;
	int sv[2], n = 0;

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&l, &b), 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	p.fd = sv[0];
	cr_assert_eq(driver_new(base, &p, &take_ops, &t, b, &d), 0);
	t.d = d;
	idle = budget_in_use(b);
	cr_assert_gt(idle, 0, "the read buffers are charged");
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 4; i++, n++) {
			uint8_t frame[VH + 2048] = { 0 };

			len[n] = udp_pkt(pkt[n], sizeof(pkt[n]), 900 + 37 * (size_t)n, (uint8_t)n);
			memcpy(frame + VH, pkt[n], len[n]);
			cr_assert_eq(send(sv[1], frame, VH + len[n], 0), (ssize_t)(VH + len[n]));
		}
		cr_assert_eq(driver_poll(d), 4);
	}
	cr_assert_eq(t.inputs, 8);
	cr_assert_eq(t.n, 4, "packets 0, 2, 4, 6 taken");
	cr_assert_eq(t.refused_other + t.refused_again, 8, "other pointers and second takes refused");
	cr_assert_eq(t.refused_budget, 0);
	cr_assert_eq(CTR(d, rx_taken), 4);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(t.len[i], len[2 * i]);
		cr_assert_eq(t.pkt[i], t.held[i]->frame + VH, "the packet is in its buffer");
		cr_assert_eq(memcmp(t.pkt[i], pkt[2 * i], len[2 * i]), 0,
			     "taken packet %d intact after the reads that followed", i);
	}
	/* Each take put a new buffer in the driver: four more charged. */
	uint64_t one = (budget_in_use(b) - idle) / 4;
	cr_assert_gt(one, VH + DRIVER_GSO_MAX);
	cr_assert_eq(budget_in_use(b), idle + 4 * one);
	/* Two given back: kept, charged to nothing; the next takes use them (no new charge). */
	struct driver_rxbuf *back[2] = { t.held[0], t.held[1] };
	back[0]->free(back[0]);
	back[1]->free(back[1]);
	cr_assert_eq(budget_in_use(b), idle + 2 * one);
	cr_assert_eq(driver_rx_kept(d), 2);
	for (int i = 0; i < 2; i++) {
		uint8_t frame[VH + 2048] = { 0 };

		len[0] = udp_pkt(pkt[0], sizeof(pkt[0]), 700, 10);
		memcpy(frame + VH, pkt[0], len[0]);
		cr_assert_eq(send(sv[1], frame, VH + len[0], 0), (ssize_t)(VH + len[0]));
		cr_assert_eq(driver_poll(d), 1);
	}
	cr_assert_eq(t.n, 6);
	cr_assert_eq(budget_in_use(b), idle + 4 * one, "kept buffers charged again when used");
	cr_assert_eq(driver_rx_kept(d), 0);
	/* Reads start at slot 0: the first take put the last one given back there (the kept
	 * ones are a stack), and the second took it again. */
	cr_assert_eq(t.held[5], back[1], "a kept buffer reused");
	/* Kept ones are freed on a quiet proxy's call, and after a second without a take. */
	t.held[2]->free(t.held[2]);
	t.held[3]->free(t.held[3]);
	cr_assert_eq(driver_rx_kept(d), 2);
	(void)driver_release_idle(d);
	cr_assert_eq(driver_rx_kept(d), 0);
	cr_assert_eq(budget_in_use(b), idle + 2 * one);
	t.held[4]->free(t.held[4]);
	cr_assert_eq(driver_rx_kept(d), 1);
	cr_assert_eq(driver_poll(d), 0);
	cr_assert_eq(driver_rx_kept(d), 1, "kept while a take was less than a second ago");
	usleep(1100 * 1000);
	cr_assert_eq(driver_poll(d), 0);
	cr_assert_eq(driver_rx_kept(d), 0, "freed a second after the last take");
	/* The driver goes first; the buffers still held stay valid and go back to the budget. */
	driver_free(d);
	cr_assert_eq(memcmp(t.pkt[5], pkt[0], len[0]), 0);
	t.held[5]->free(t.held[5]);
	cr_assert_eq(budget_in_use(b), 0, "every buffer given back");
	budget_free(b);
	event_base_free(base);
	close(sv[0]);
	close(sv[1]);
}

Test(driver, taken_buffers_keep_their_packets)
{
	taken_buffers_keep_their_packets();
}

Test(driver_ring, taken_buffers_keep_their_packets)
{
	ring = true;
	taken_buffers_keep_their_packets();
}

/* A budget without room for a new read buffer refuses the take: the packet stays the
 * driver's, nothing is counted as taken, and the driver reads on into the same buffer. */
Test(driver, take_refused_without_budget_room)
{
	uint8_t pkt[2048], frame[VH + 2048] = { 0 };
	struct budget_limits l;
	struct budget *b;
	struct taker t = { 0 };
	struct driver_params p = { .mtu = 1500, .vnet_hdr = true };
	struct event_base *base = event_base_new();
	struct driver *d;
	size_t len;
	int sv[2];

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	l.buffer_bytes = 100 * 1024; /* the driver's one buffer fits, a second does not */
	cr_assert_eq(budget_new(&l, &b), 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	p.fd = sv[0];
	cr_assert_eq(driver_new(base, &p, &take_ops, &t, b, &d), 0);
	t.d = d;
	len = udp_pkt(pkt, sizeof(pkt), 500, 2);
	memcpy(frame + VH, pkt, len);
	for (int i = 0; i < 2; i++)
		cr_assert_eq(send(sv[1], frame, VH + len, 0), (ssize_t)(VH + len));
	cr_assert_eq(driver_poll(d), 2);
	cr_assert_eq(t.refused_budget, 2);
	cr_assert_eq(t.n, 0);
	cr_assert_eq(CTR(d, rx_taken), 0);
	driver_free(d);
	cr_assert_eq(budget_in_use(b), 0);
	budget_free(b);
	event_base_free(base);
	close(sv[0]);
	close(sv[1]);
}

/* A process whose seccomp filter refuses io_uring_setup (as container runtimes do): the driver
 * still starts, says the ring was refused and why, and moves packets with read() and
 * write(). */
Test(driver_ring, io_uring_refused_means_system_calls)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };
	uint8_t pkt[256], got[256];
	size_t len = udp_pkt(pkt, sizeof(pkt), 40, 9);
	struct rig r;

	/* Criterion runs each test in a process of its own: the filter dies with it. */
	cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
	cr_assert_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0);
	ring = false; /* the rig expects the driver without a ring */
	memset(&r, 0, sizeof(r));
	{
		int sv[2];
		struct driver_params p = { .mtu = 1500, .uring = true };

		cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
					sv), 0);
		r.dfd = p.fd = sv[0];
		r.pfd = sv[1];
		r.base = event_base_new();
		cr_assert_eq(driver_new(r.base, &p, &ops, &r.s, NULL, &r.d), 0);
	}
	cr_assert_not(driver_uring(r.d));
	cr_assert_eq(driver_uring_err(r.d), -EPERM);
	r.s.script_default = (struct step){ .v = DRIVER_WRITE };
	peer_send(&r, NULL, pkt, len);
	cr_assert_eq(driver_poll(r.d), 1);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)len);
	cr_assert_eq(CTR(r.d, uring_enters), 0);
	rig_close(&r);
}

/* ---- with the virtio_net_hdr (offload I/O) ---- */

/* The header becomes pkt_meta; a rewrite goes back with the header it came with, a plain
 * packet with a zeroed one; the header's bytes are in neither rx_bytes nor tx_bytes. */
static void vnet_header_to_meta_and_back(void)
{
	static const struct step script[] = {
		{ .v = DRIVER_WRITE, .reflect = true },
		{ .v = DRIVER_WRITE, .plain = true },
	};
	uint8_t pkt[2048], got[VH + 2048], sent_hdr[VH];
	struct pkt_meta m;
	struct rig r;
	size_t len;

	rig_open(&r, true, &ops);
	r.s.script = script;
	r.s.n_script = 2;
	len = udp_pkt(pkt, sizeof(pkt), 300, 0);
	tu_meta_partial(pkt, len, 0, &m); /* NEEDS_CSUM, csum_start 20, csum_offset 6 */
	peer_send(&r, &m, pkt, len);
	peer_send(&r, &m, pkt, len);
	cr_assert_eq(driver_poll(r.d), 2);
	cr_assert_eq(r.s.meta[0].flags, PKT_META_NEEDS_CSUM);
	cr_assert_eq(r.s.meta[0].gso_type, PKT_GSO_NONE);
	cr_assert_eq(r.s.meta[0].csum_start, 20);
	cr_assert_eq(r.s.meta[0].csum_offset, 6);
	cr_assert_eq(r.s.meta[0].hdr_len, m.hdr_len);
	cr_assert_eq(r.s.in_len[0], len, "the header is not part of the packet");
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(VH + len));
	cr_assert_eq(got[0], PKT_META_NEEDS_CSUM, "rewrite: header as read");
	cr_assert_eq(le16(got + 6), 20);
	cr_assert_eq(le16(got + 8), 6);
	memcpy(sent_hdr, got, VH);
	reflect4(pkt);
	cr_assert_eq(memcmp(got + VH, pkt, len), 0);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(VH + len));
	for (int i = 0; i < VH; i++)
		cr_assert_eq(got[i], 0, "plain: zero header (byte %d)", i);
	cr_assert_eq(CTR(r.d, rx_bytes), 2 * len);
	cr_assert_eq(CTR(r.d, tx_bytes), 2 * len);
	cr_assert_eq(CTR(r.d, rx_needs_csum), 2);
	cr_assert_eq(CTR(r.d, rewrites), 1);
	cr_assert_eq(CTR(r.d, rx_gso) + CTR(r.d, tx_gso), 0);
	rig_close(&r);
}

Test(driver, vnet_header_to_meta_and_back)
{
	vnet_header_to_meta_and_back();
}

Test(driver_ring, vnet_header_to_meta_and_back)
{
	ring = true;
	vnet_header_to_meta_and_back();
}

/* Headers the driver cannot honour never reach the stack: each is one rx_bad_vnet_hdr. A UDP
 * super-datagram that does not split within the kernel's limit never reaches the UDP path. */
static void vnet_unusable_reads_dropped(void)
{
	struct pkt_meta bad[] = {
		{ .flags = 0x04 },                                            /* unknown flag */
		{ .gso_type = 2, .flags = PKT_META_NEEDS_CSUM, .gso_size = 1000 }, /* unknown type */
		{ .gso_type = PKT_GSO_TCPV4, .flags = PKT_META_NEEDS_CSUM },  /* GSO, size 0 */
		{ .gso_type = PKT_GSO_TCPV4, .gso_size = 1000 },              /* GSO, no csum state */
		{ .gso_type = 0x80 },                                         /* ECN without GSO */
	};
	const int nbad = (int)(sizeof(bad) / sizeof(bad[0]));
	uint8_t pkt[2048], frame[VH] = { 0 };
	size_t len = udp_pkt(pkt, sizeof(pkt), 50, 0);
	struct pkt_meta okm = { 0 };
	struct rig r;

	rig_open(&r, true, &ops);
	r.s.script_default.v = DRIVER_DONE;
	for (int i = 0; i < nbad; i++)
		peer_send(&r, &bad[i], pkt, len);
	cr_assert_eq(send(r.pfd, frame, VH, 0), VH);  /* a header and no packet */
	cr_assert_eq(send(r.pfd, frame, 4, 0), 4);    /* not even a header */
	peer_send(&r, &okm, pkt, len);                /* then a good one: still processed */
	cr_assert_eq(driver_poll(r.d), nbad + 3);
	cr_assert_eq(r.s.inputs, 1);
	cr_assert_eq(CTR(r.d, rx_bad_vnet_hdr), (uint64_t)nbad + 2);
	cr_assert_eq(CTR(r.d, rx_packets), (uint64_t)nbad + 1, "bad headers on packets");
	cr_assert_eq(CTR(r.d, rx_errors), 0);

	/* A UDP super-datagram that would make more than 128 datagrams: dropped, not split. */
	struct tu_spec s;
	tu_spec_udp(&s, "10.0.0.2", 4000, "10.0.0.1", 53);
	s.payload_len = 129 * 8;
	s.partial_csum = true;
	len = tu_build(&s, pkt, sizeof(pkt));
	tu_meta_partial(pkt, len, 8, &okm);
	r.s.script_default.v = DRIVER_UDP;
	peer_send(&r, &okm, pkt, len);
	cr_assert_eq(driver_poll(r.d), 1);
	cr_assert_eq(r.s.udp, 0);
	cr_assert_eq(CTR(r.d, udp_split_bad), 1);
	cr_assert_eq(CTR(r.d, udp_split), 0);
	rig_close(&r);
}

Test(driver, vnet_unusable_reads_dropped)
{
	vnet_unusable_reads_dropped();
}

Test(driver_ring, vnet_unusable_reads_dropped)
{
	ring = true;
	vnet_unusable_reads_dropped();
}

/* A UDP super-datagram is split by the input's view (no parse of its own): every datagram
 * reaches the UDP path in order with a view that is exactly that datagram's own parse, over
 * IPv4 and over IPv6 with extension headers in front of the UDP header. */
static void vnet_udp_split_hands_on_each_datagrams_view(void)
{
	static const struct {
		const char *src, *dst;
		int n_ext;
	} cases[] = {
		{ "10.0.0.2", "10.0.0.1", 0 },
		{ "fd00::2", "fd00::1", 0 },
		{ "fd00::2", "fd00::1", 2 },
	};
	static uint8_t pkt[TU_PKT_MAX];

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct tu_spec s;
		struct pkt_meta m;
		struct rig r;
		size_t len;

		tu_spec_udp(&s, cases[c].src, 4000, cases[c].dst, 5000);
		for (int e = 0; e < cases[c].n_ext; e++)
			s.ext[s.ext_n++] = (struct tu_ext){ e % 2 ? 60 : 0, 0 };
		s.payload_len = 3 * 400 + 77;
		s.partial_csum = true;
		len = tu_build(&s, pkt, sizeof(pkt));
		tu_meta_partial(pkt, len, 400, &m);
		rig_open(&r, true, &ops);
		r.s.script_default.v = DRIVER_UDP;
		peer_send(&r, &m, pkt, len);
		cr_assert_eq(driver_poll(r.d), 1);
		cr_assert_eq(r.s.udp, 4, "case %zu: four datagrams", c);
		cr_assert_eq(r.s.udp_view_bad, 0, "case %zu: each view is its datagram's parse", c);
		for (int i = 0; i < 4; i++) {
			size_t hl = len - s.payload_len;
			cr_assert_eq(r.s.udp_len[i], hl + (i < 3 ? 400 : 77), "case %zu: %d", c, i);
			cr_assert_eq(r.s.udp_first[i], pkt[hl + 400 * (size_t)i], "case %zu: %d", c, i);
		}
		cr_assert_eq(CTR(r.d, udp_split), 1);
		cr_assert_eq(CTR(r.d, udp_split_datagrams), 4);
		cr_assert_eq(CTR(r.d, udp_split_bad), 0);
		rig_close(&r);
	}
}

Test(driver, vnet_udp_split_hands_on_each_datagrams_view)
{
	vnet_udp_split_hands_on_each_datagrams_view();
}

Test(driver_ring, vnet_udp_split_hands_on_each_datagrams_view)
{
	ring = true;
	vnet_udp_split_hands_on_each_datagrams_view();
}

/* A TCP super-packet (tens of KiB, NEEDS_CSUM, gso_size 1448), rewritten in place, goes back in
 * ONE write with its header: the kernel segments it. With the ECN bit the type is kept. */
static void vnet_tcp_super_packet_written_back_whole(void)
{
	static uint8_t pkt[TU_PKT_MAX], got[VH + TU_PKT_MAX];
	struct tu_spec s;
	struct pkt_meta m;
	struct rig r;
	size_t len;

	rig_open(&r, true, &ops);
	r.s.script_default = (struct step){ .v = DRIVER_WRITE, .reflect = true };
	tu_spec_tcp(&s, "10.0.0.2", 4000, "93.184.216.34", 443);
	s.payload_len = 40 * 1448 + 100;
	s.payload_seed = 5;
	s.partial_csum = true;
	len = tu_build(&s, pkt, sizeof(pkt));
	tu_meta_partial(pkt, len, 1448, &m);
	peer_send(&r, &m, pkt, len);
	m.gso_type |= 0x80;
	peer_send(&r, &m, pkt, len);
	cr_assert_eq(driver_poll(r.d), 2);
	cr_assert_eq(r.s.meta[0].gso_type, PKT_GSO_TCPV4);
	cr_assert_eq(r.s.meta[0].gso_size, 1448);
	cr_assert_eq(r.s.meta[0].csum_offset, 16);
	cr_assert_eq(r.s.meta[1].gso_type, PKT_GSO_TCPV4 | 0x80);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(VH + len), "one frame");
		cr_assert_eq(got[0], PKT_META_NEEDS_CSUM);
		cr_assert_eq(got[1], i ? (PKT_GSO_TCPV4 | 0x80) : PKT_GSO_TCPV4);
		cr_assert_eq(le16(got + 2), m.hdr_len);
		cr_assert_eq(le16(got + 4), 1448);
		cr_assert_eq(le16(got + 6), 20);
		cr_assert_eq(le16(got + 8), 16);
	}
	reflect4(pkt);
	cr_assert_eq(memcmp(got + VH, pkt, len), 0);
	cr_assert_eq(CTR(r.d, rx_gso), 2);
	cr_assert_eq(CTR(r.d, rx_gso_bytes), 2 * len);
	cr_assert_eq(CTR(r.d, rx_needs_csum), 2);
	cr_assert_eq(CTR(r.d, tx_gso), 2);
	cr_assert_eq(CTR(r.d, tx_packets), 2);
	cr_assert_eq(CTR(r.d, tx_bytes), 2 * len);
	cr_assert_eq(CTR(r.d, rewrites), 2);
	rig_close(&r);
}

Test(driver, vnet_tcp_super_packet_written_back_whole)
{
	vnet_tcp_super_packet_written_back_whole();
}

Test(driver_ring, vnet_tcp_super_packet_written_back_whole)
{
	ring = true;
	vnet_tcp_super_packet_written_back_whole();
}

/* A GSO read flagged DATA_VALID (a forwarded LRO packet) is made partial before the stack sees
 * it, and written back with the NEEDS_CSUM header that matches; one that is not TCP/UDP is
 * dropped. */
static void vnet_data_valid_super_packet_made_partial(void)
{
	static uint8_t pkt[TU_PKT_MAX], got[VH + TU_PKT_MAX];
	struct pkt_meta m = { .flags = PKT_META_DATA_VALID, .gso_type = PKT_GSO_TCPV4,
			      .gso_size = 1448 };
	struct tu_spec s;
	struct rig r;
	size_t len;

	rig_open(&r, true, &ops);
	r.s.script_default = (struct step){ .v = DRIVER_WRITE };
	tu_spec_tcp(&s, "10.0.0.2", 4000, "93.184.216.34", 443);
	s.payload_len = 10 * 1448;
	len = tu_build(&s, pkt, sizeof(pkt)); /* a full, valid checksum */
	peer_send(&r, &m, pkt, len);
	cr_assert_eq(driver_poll(r.d), 1);
	cr_assert_eq(r.s.meta[0].flags, PKT_META_NEEDS_CSUM);
	cr_assert_eq(r.s.meta[0].csum_start, 20);
	cr_assert_eq(r.s.meta[0].csum_offset, 16);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(VH + len));
	cr_assert(tu_verify_partial(got + VH, len), "the field holds the pseudo-header sum");
	cr_assert_eq(got[0], PKT_META_NEEDS_CSUM);
	cr_assert_eq(le16(got + 6), 20);
	cr_assert_eq(le16(got + 8), 16);
	cr_assert_eq(CTR(r.d, rx_gso_data_valid), 1);

	tu_spec_raw(&s, "10.0.0.2", "93.184.216.34", 47);
	s.payload_len = 3000;
	len = tu_build(&s, pkt, sizeof(pkt));
	peer_send(&r, &m, pkt, len);
	cr_assert_eq(driver_poll(r.d), 1);
	cr_assert_eq(r.s.inputs, 1, "not handed to the stack");
	cr_assert_eq(CTR(r.d, rx_bad_vnet_hdr), 1);
	cr_assert_eq(CTR(r.d, rx_gso_data_valid), 1);
	rig_close(&r);
}

Test(driver, vnet_data_valid_super_packet_made_partial)
{
	vnet_data_valid_super_packet_made_partial();
}

Test(driver_ring, vnet_data_valid_super_packet_made_partial)
{
	ring = true;
	vnet_data_valid_super_packet_made_partial();
}

/* A device whose header is longer than virtio_net_hdr (12 bytes: with num_buffers, as
 * TUNSETVNETHDRSZ may set): read past, a rewrite goes back with all 12 bytes as read, a plain
 * packet and driver_tx_meta with zeros after the 10 they fill. */
static void vnet_longer_device_header(void)
{
	uint8_t pkt[512], got[512];
	struct pkt_meta m, plain = { 0 };
	struct rig r;
	size_t len;

	rig_open_hdr(&r, 12, &ops);
	r.s.script_default = (struct step){ .v = DRIVER_WRITE };
	len = udp_pkt(pkt, sizeof(pkt), 100, 3);
	tu_meta_partial(pkt, len, 0, &m);
	peer_send(&r, &m, pkt, len);
	cr_assert_eq(driver_poll(r.d), 1);
	cr_assert_eq(r.s.in_len[0], len);
	cr_assert_eq(r.s.in_first[0], 3, "the packet starts after 12 header bytes");
	cr_assert_eq(r.s.meta[0].csum_start, 20);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(12 + len));
	cr_assert_eq(got[0], PKT_META_NEEDS_CSUM);
	cr_assert_eq(memcmp(got + 12, pkt, len), 0);
	cr_assert_eq(driver_tx(r.d, pkt, len), 0);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(12 + len));
	for (int i = 0; i < 12; i++)
		cr_assert_eq(got[i], 0, "driver_tx: zero header (byte %d)", i);
	cr_assert_eq(driver_tx_meta(r.d, pkt, len, &m), 0);
	cr_assert_eq(peer_recv(&r, got, sizeof(got)), (ssize_t)(12 + len));
	cr_assert_eq(got[0], PKT_META_NEEDS_CSUM);
	cr_assert_eq(le16(got + 6), 20);
	cr_assert_eq(le16(got + 8), 6);
	cr_assert_eq(got[10] | got[11], 0, "zeros after the virtio_net_hdr");
	cr_assert_eq(memcmp(got + 12, pkt, len), 0);
	cr_assert_eq(driver_tx_meta(r.d, pkt, len, &plain), 0);
	cr_assert_eq(CTR(r.d, tx_packets), 4);
	cr_assert_eq(CTR(r.d, tx_bytes), 4 * len, "header bytes are not counted");
	rig_close(&r);
}

Test(driver, vnet_longer_device_header)
{
	vnet_longer_device_header();
}

Test(driver_ring, vnet_longer_device_header)
{
	ring = true;
	vnet_longer_device_header();
}

/* ---- a real TUN (child side: CHECK) ---- */

#define TUN_ADDR "10.202.0.1"
#define PEER_ADDR "10.202.0.2" /* on the TUN's subnet: routed into it */

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct tun *tun_up(bool vnet)
{
	struct tun_params p;
	struct tun *t = NULL;
	char err[TS_ERRLEN];

	/* No IPv6 on the device: nothing but our datagrams enters it (no MLD, no RS). */
	write_text("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
	tun_params_init(&p);
	snprintf(p.name, sizeof(p.name), "tdrv0");
	p.has_addr4 = true;
	CHECK(netaddr_parse_cidr(TUN_ADDR "/24", &p.addr4) == 0, "cidr");
	p.vnet_hdr = vnet;
	p.offload = vnet ? TUN_OFFLOAD_ALL : 0;
	int ret = tun_open(&p, &t, err, sizeof(err));
	CHECK(ret == 0, "tun_open = %d: %s", ret, err);
	return t;
}

static int udp_sock(uint16_t port, struct sockaddr_in *peer)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	CHECK(s >= 0 && inet_pton(AF_INET, TUN_ADDR, &a.sin_addr) == 1, "socket");
	CHECK(bind(s, (struct sockaddr *)&a, sizeof(a)) == 0, "bind: %s", strerror(errno));
	*peer = (struct sockaddr_in){ .sin_family = AF_INET };
	CHECK(inet_pton(AF_INET, PEER_ADDR, &peer->sin_addr) == 1, "peer");
	return s;
}

/* Poll the TUN and run the driver until the input function has seen n packets (2 s). */
static void pump(struct tun *t, struct driver *d, struct seen *s, int n)
{
	for (int64_t end = mono_ms() + 2000; s->inputs < n && mono_ms() < end;) {
		struct pollfd pfd = { tun_fd(t, 0), POLLIN, 0 };
		if (poll(&pfd, 1, 50) == 1)
			driver_poll(d);
	}
	CHECK(s->inputs == n, "%d packets read, want %d", s->inputs, n);
}

static ssize_t recv_ms(int s, uint8_t *buf, size_t cap, int ms)
{
	struct pollfd pfd = { s, POLLIN, 0 };
	return poll(&pfd, 1, ms) == 1 ? recv(s, buf, cap, MSG_DONTWAIT) : -1;
}

/* Five datagrams to PEER:7000 reflected back to the socket, one to PEER:7001 handed to the
 * UDP path, one to PEER:7002 made invalid and refused by the kernel (tx_dropped). */
static void scenario_per_packet_reflect(void)
{
	struct sockaddr_in to;
	struct event_base *base = event_base_new();
	struct tun *t = tun_up(false);
	struct driver_params p = { .fd = tun_fd(t, 0), .mtu = 1500, .uring = ring };
	struct step script[7];
	struct driver *d;
	struct seen s;
	uint8_t buf[2048];
	uint64_t tx = 0;
	int sock = udp_sock(5000, &to);

	memset(&s, 0, sizeof(s));
	for (int i = 0; i < 5; i++)
		script[i] = (struct step){ .v = DRIVER_WRITE, .reflect = true };
	script[5] = (struct step){ .v = DRIVER_UDP };
	script[6] = (struct step){ .v = DRIVER_WRITE, .corrupt = true };
	s.script = script;
	s.n_script = 7;
	CHECK(driver_new(base, &p, &ops, &s, NULL, &d) == 0, "driver_new");
	CHECK(driver_uring(d) == ring, "batched I/O %d", driver_uring(d));
	CHECK(driver_poll(d) == 0 && CTR(d, rx_errors) == 0, "an empty TUN: EAGAIN, no error");
	for (int i = 0; i < 7; i++) {
		size_t n = 100 + 50 * (size_t)i;
		tu_fill_pattern(buf, n, (uint32_t)i);
		to.sin_port = htons(i < 5 ? 7000 : 7001 + (i - 5));
		CHECK(sendto(sock, buf, n, 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)n,
		      "sendto: %s", strerror(errno));
		if (i < 5)
			tx += 28 + n;
	}
	pump(t, d, &s, 7);
	for (int i = 0; i < 5; i++) {
		ssize_t n = recv_ms(sock, buf, sizeof(buf), 1000);
		CHECK(n == 100 + 50 * i, "reflected datagram %d: %zd bytes", i, n);
		for (ssize_t k = 0; k < n; k++)
			CHECK(buf[k] == tu_pattern_byte((uint32_t)i, (size_t)k), "datagram %d", i);
	}
	CHECK(recv_ms(sock, buf, sizeof(buf), 100) < 0, "only five came back");
	CHECK(s.udp == 1 && s.udp_len[0] == 28 + 100 + 50 * 5, "UDP path: %d", s.udp);
	CHECK(CTR(d, rx_packets) == 7 && CTR(d, rx_bytes) == s.in_bytes, "rx %llu/%llu",
	      (unsigned long long)CTR(d, rx_packets), (unsigned long long)CTR(d, rx_bytes));
	CHECK(CTR(d, tx_packets) == 5 && CTR(d, tx_bytes) == tx, "tx %llu/%llu",
	      (unsigned long long)CTR(d, tx_packets), (unsigned long long)CTR(d, tx_bytes));
	CHECK(CTR(d, rewrites) == 5, "rewrites %llu", (unsigned long long)CTR(d, rewrites));
	CHECK(CTR(d, tx_dropped) == 1, "the refused write: %llu",
	      (unsigned long long)CTR(d, tx_dropped));
	close(sock);
	driver_free(d);
	event_base_free(base);
	tun_close(t);
}

/* With offload: a UDP GSO send (UDP_SEGMENT) is read as ONE super-datagram, reflected in
 * place (the partial sum covers the addresses as a sum, so swapping keeps it right) and
 * written back whole; the kernel segments it into the datagrams the socket receives. */
static void scenario_vnet_super_datagram_reflected(void)
{
	static uint8_t payload[5 * 500 + 77];
	struct sockaddr_in to;
	struct event_base *base = event_base_new();
	struct tun *t = tun_up(true);
	struct driver_params p = { .fd = tun_fd(t, 0), .mtu = 1500, .vnet_hdr = true,
				   .uring = ring };
	struct driver *d;
	struct seen s;
	uint8_t buf[2048];
	int sock = udp_sock(5001, &to), gso = 500;

	memset(&s, 0, sizeof(s));
	s.script_default = (struct step){ .v = DRIVER_WRITE, .reflect = true };
	CHECK(driver_new(base, &p, &ops, &s, NULL, &d) == 0, "driver_new");
	CHECK(setsockopt(sock, SOL_UDP, UDP_SEGMENT, &gso, sizeof(gso)) == 0, "UDP_SEGMENT: %s",
	      strerror(errno));
	tu_fill_pattern(payload, sizeof(payload), 9);
	to.sin_port = htons(7000);
	CHECK(sendto(sock, payload, sizeof(payload), 0, (struct sockaddr *)&to, sizeof(to)) ==
		      (ssize_t)sizeof(payload), "sendto: %s", strerror(errno));
	pump(t, d, &s, 1);
	CHECK(s.meta[0].gso_type == PKT_GSO_UDP_L4 && s.meta[0].gso_size == 500 &&
	      s.in_len[0] == 28 + sizeof(payload), "read one super-datagram: type %u, %zu bytes",
	      s.meta[0].gso_type, s.in_len[0]);
	for (int i = 0; i < 6; i++) {
		ssize_t n = recv_ms(sock, buf, sizeof(buf), 1000);
		size_t want = i < 5 ? 500 : 77;
		CHECK(n == (ssize_t)want, "datagram %d: %zd bytes", i, n);
		CHECK(memcmp(buf, payload + 500 * i, want) == 0, "datagram %d payload", i);
	}
	CHECK(recv_ms(sock, buf, sizeof(buf), 100) < 0, "six datagrams, no more");
	CHECK(CTR(d, rx_packets) == 1 && CTR(d, rx_gso) == 1 && CTR(d, tx_packets) == 1 &&
	      CTR(d, tx_gso) == 1 && CTR(d, rewrites) == 1 && CTR(d, tx_dropped) == 0 &&
	      CTR(d, tx_bytes) == 28 + sizeof(payload), "one read, one whole write");
	close(sock);
	driver_free(d);
	event_base_free(base);
	tun_close(t);
}

/* Batched I/O on a real TUN, per packet and with offload: 48 datagrams sent at once are all
 * read and reflected, intact and in order, in far fewer rounds than packets (a round writes
 * the previous round's packets back and reads the next ones into the same buffers). */
static void scenario_ring_rounds(bool vnet)
{
	struct sockaddr_in to;
	struct event_base *base = event_base_new();
	struct tun *t = tun_up(vnet);
	struct driver_params p = { .fd = tun_fd(t, 0), .mtu = 1500, .vnet_hdr = vnet,
				   .uring = true };
	struct driver *d;
	struct seen s;
	uint8_t buf[2048];
	int sock = udp_sock(5002, &to);
	const int n = 48;

	memset(&s, 0, sizeof(s));
	s.script_default = (struct step){ .v = DRIVER_WRITE, .reflect = true };
	CHECK(driver_new(base, &p, &ops, &s, NULL, &d) == 0, "driver_new");
	CHECK(driver_uring(d), "batched I/O: %s", strerror(-driver_uring_err(d)));
	to.sin_port = htons(7000);
	for (int i = 0; i < n; i++) {
		size_t len = 16 + (size_t)i * 13;
		tu_fill_pattern(buf, len, (uint32_t)i + 100);
		CHECK(sendto(sock, buf, len, 0, (struct sockaddr *)&to, sizeof(to)) ==
			      (ssize_t)len, "sendto: %s", strerror(errno));
	}
	pump(t, d, &s, n);
	for (int i = 0; i < n; i++) {
		ssize_t got = recv_ms(sock, buf, sizeof(buf), 1000);
		CHECK(got == 16 + i * 13, "reflected datagram %d: %zd bytes", i, got);
		for (ssize_t k = 0; k < got; k++)
			CHECK(buf[k] == tu_pattern_byte((uint32_t)i + 100, (size_t)k),
			      "datagram %d byte %zd", i, k);
	}
	CHECK(recv_ms(sock, buf, sizeof(buf), 100) < 0, "all of them, once");
	CHECK(CTR(d, tx_packets) == (uint64_t)n && CTR(d, rewrites) == (uint64_t)n &&
	      CTR(d, tx_dropped) == 0, "tx %llu", (unsigned long long)CTR(d, tx_packets));
	CHECK(CTR(d, uring_enters) > 0 && CTR(d, uring_enters) <= (uint64_t)n / 2,
	      "%llu rounds for %d packets read and written", 
	      (unsigned long long)CTR(d, uring_enters), n);
	CHECK(CTR(d, uring_read_refused) + CTR(d, uring_write_refused) +
		      CTR(d, uring_enter_failed) == 0 && driver_uring(d), "the ring stayed");
	close(sock);
	driver_free(d);
	event_base_free(base);
	tun_close(t);
}

static void scenario_ring_rounds_per_packet(void)
{
	scenario_ring_rounds(false);
}

static void scenario_ring_rounds_vnet(void)
{
	scenario_ring_rounds(true);
}

TestSuite(driver_tun, .timeout = 20);

Test(driver_tun, per_packet_verdicts_on_a_real_tun)
{
	run_in_netns(scenario_per_packet_reflect);
}

Test(driver_tun, vnet_super_datagram_written_back_whole)
{
	run_in_netns(scenario_vnet_super_datagram_reflected);
}

Test(driver_tun, ring_per_packet_verdicts_on_a_real_tun)
{
	ring = true;
	run_in_netns(scenario_per_packet_reflect);
}

Test(driver_tun, ring_vnet_super_datagram_written_back_whole)
{
	ring = true;
	run_in_netns(scenario_vnet_super_datagram_reflected);
}

Test(driver_tun, ring_rounds_per_packet)
{
	run_in_netns(scenario_ring_rounds_per_packet);
}

Test(driver_tun, ring_rounds_vnet)
{
	run_in_netns(scenario_ring_rounds_vnet);
}
