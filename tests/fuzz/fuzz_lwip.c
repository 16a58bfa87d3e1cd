/* fuzz_lwip.c — libFuzzer target for the lwIP stack's packet path (stacks/lwip/lwip_stack.c and
 * its glue: lwip_glue.c, lwip_stream.c, lwip_bigseg.c, lwip_ackq.c, lwip_halfopen.c).
 *
 * Random bytes never hit a valid sequence number, so the input is structured: a 2-byte mode,
 * then records. Each input starts a fresh stack (lwIP is one per process) on a virtual clock
 * (this file provides clock_gettime for the monotonic clocks, as fuzz_relay.c does: libevent's
 * timers, lwIP's sys_now and the stack's tcp_tmr all run on time only the input moves), feeds
 * it, ends every accepted stream and frees the stack. The fuzzer plays the driver (inputs, then
 * batch_end before the loop runs; lent frames written at the flush or when DRIVER_LEND_MAX are
 * lent) and the accepted streams' owner (the accept hook; lwip_stack_session_end for each).
 *
 * Mode byte 0: bit 0 offload output (tx_meta), 1 GSO trains (tun.gso_output), 2 large segments
 * (tun.large_segments), 3 frames lent (tx_lend/tx_flush), 4 read buffers taken (rx_take),
 * 5 an IPv6 address, 6 a small buffer budget, 7 lent frames queued as the ring does (else
 * written at once). Byte 1: bits 0-1 the MTU (1500, 1280, 576 without IPv6, 9000), 2-3 the
 * TCP permits (64, 1, 2, 4), 4-5 the listen backlog (profile, 1, 2, 4), 6-7 the small budget's
 * size.
 *
 * Eight client 4-tuples ("slots": four IPv4, four IPv6, one from the TUN's own address each)
 * carry structured segments; what the stack sends on a slot (its ISN, the highest sequence it
 * sent, its last ACK) is read back from the captured output, so a record names sequence and
 * acknowledgement numbers relative to them. Records, [op] then op's fields (missing bytes
 * read as 0), op % 16:
 *   0, 14, 15 segment: [sel][flags][dseq][dack][ctl][win:2][len:2][gso][opts] + option fields.
 *     sel: bits 0-2 the slot, 3 seq from the stack's last ACK (else the client's next seq),
 *     4-5 metadata (none, NEEDS_CSUM, DATA_VALID, none), 6 a GSO super-packet (with
 *     metadata), 7 a wrong TCP checksum. flags: the TCP flags byte. dseq/dack: signed deltas
 *     (ctl bit 2: times 1024). ctl: bits 0-1 the ack's base (the stack's highest sequence
 *     sent, its ISN + 1, 0, 32 KiB before the highest), 3 end the batch and run the loop
 *     after, 4 a SYN's seq from 4 more bytes, 5 IPv4 options / an IPv6 Hop-by-Hop header.
 *     len: payload bytes (capped at the MTU, or 64 KiB for a super-packet). opts: bit 0 MSS
 *     [2], 1 window scale [1], 2 SACK permitted, 3 timestamps [4][4], 4 SACK blocks [n]
 *     ([2][2] each, from the stack's highest sequence), 5 garbage [n][n bytes], 6 no
 *     padding to a word, 7 EOL first.
 *   1 raw packet [flags][len:2][bytes]: flags bit 0 NEEDS_CSUM, 1 GSO, 2 fix the checksums,
 *     3 DATA_VALID.
 *   2 clock [step][n]: n % 64 + 1 steps of 1 ms, 50 ms, 250 ms or 2 s (step & 3), a loop
 *     pass after each (the stack's timers fire on the virtual clock).
 *   3 loop [n]: end the driver batch, run n % 4 + 1 loop passes (one iteration each).
 *   4 batch_end.
 *   5 write [idx][n:2][x]: x bit 0: n * 4.    6 read [idx][n:2][how]: read, peekv + skip,
 *     peek, set_lowat.
 *   7 shutdown_write [idx].    8 close / abort [idx][how] (and lwip_stack_session_end).
 *   9 interest [idx][bits]: read, write, react to readable (read all), writable (write
 *     16 KiB), end the stream at EOF or an error (close / abort; else the interest that has
 *     nothing left to give is dropped, as the relay does).
 *  10 SYN burst [n][slot]: new tuples from the slot's addresses (the backlog and its
 *     eviction).    11 budget tier [t] (forced, or computed).    12 stats and counters.
 *  13 stop (the listener closes).
 * Streams are named by idx among the live ones; those still open at the end are closed (aborted
 * when the input's length is odd).
 *
 * Invariants (abort on violation): every packet written parses (core/pkt.h) as TCP, with a
 * valid IPv4 header checksum and TCP checksum, no longer than the MTU, unless it is a GSO
 * super-packet, whose shape is checked instead (NEEDS_CSUM at the TCP checksum with the
 * pseudo-header sum in it, segments within the MTU, more than one); no segment larger than
 * the largest MSS lwIP may have taken from the slot's SYNs; a frame lent is unchanged until it is written;
 * the payload sent on a slot is the bytes its stream wrote, at their sequence numbers, and
 * a stream reads exactly the bytes the client sent, in order; the stack never acknowledges
 * what the client did not send; an answer the stack writes in place (RST, ICMP error) has
 * valid checksums; drop_too_big stays 0; every read buffer taken is given back; after free
 * the budget's buffer bytes, TCP permits and lwIP's held bytes are 0, with no release
 * underflow; with owners that make what progress they can, readiness comes to rest (no busy
 * loop) once packets stop; the event base holds no event after free. Raw packets on a slot's
 * tuple, and SYNs with other flags (lwIP may or may not
 * count them in the sequence), turn that slot's content checks off.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/csum.h"
#include "core/driver.h"
#include "core/log.h"
#include "core/pkt.h"
#include "dispatch/stream.h"
#include "stacks/common/rewrite.h"
#include "stacks/lwip/lwip_glue.h"
#include "stacks/lwip/lwip_stack.h"

#include "fake_clock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NSLOTS 8
#define MAX_STREAMS 24
#define LWIP_TCP_MSS 1440 /* lwipopts.h TCP_MSS: lwIP's cap on any MSS */
#define PKT_MAX (65535 + 64)

/* An invariant: the line of a failed one is printed before the abort. */
static void fail(int line)
{
	fprintf(stderr, "fuzz_lwip: invariant at line %d failed\n", line);
	abort();
}
#define check(cond)                                                                            \
	do {                                                                                   \
		if (!(cond))                                                                   \
			fail(__LINE__);                                                        \
	} while (0)

/* FUZZ_LWIP_TRACE=1 in the environment: every record and packet on stderr (to read a finding). */
static int tracing = -1;

static bool trace_on(void)
{
	if (tracing < 0)
		tracing = getenv("FUZZ_LWIP_TRACE") != NULL;
	return tracing;
}

#define trace(...)                                                                             \
	do {                                                                                   \
		if (trace_on())                                                                \
			fprintf(stderr, __VA_ARGS__);                                          \
	} while (0)

/* ---- the input ---------------------------------------------------------------------------- */

struct rd {
	const uint8_t *p;
	size_t n;
};

static uint8_t u8(struct rd *r)
{
	if (!r->n)
		return 0;
	r->n--;
	return *r->p++;
}

static uint16_t u16(struct rd *r)
{
	uint16_t hi = u8(r);
	return (uint16_t)(hi << 8 | u8(r));
}

static uint32_t u32(struct rd *r)
{
	uint32_t hi = u16(r);
	return hi << 16 | u16(r);
}

/* ---- the slots: client 4-tuples and what each side sent on them --------------------------- */

struct tuple {
	int family;
	uint8_t src[16], dst[16];
	uint16_t sport, dport;
};

/* The last SYNs the client sent on a slot, each with the highest sequence the client sent
 * after it (relative to it): what a connection opened by that SYN may acknowledge. */
#define SYN_HIST 4
struct synrec {
	bool used;
	bool fin; /* a FIN came after it: lwIP moves a FIN that data passed to the data's end */
	uint32_t isn, hi;
};

struct slot {
	struct tuple t;
	/* the client */
	uint32_t cli_nxt;     /* its next sequence number */
	struct synrec syns[SYN_HIST];
	unsigned syn_next;
	uint32_t mss_bound;   /* the largest MSS lwIP may have taken from its SYNs */
	bool tainted;         /* content checks off: a raw packet used the tuple, or a SYN came */
	                      /* with other flags (lwIP may count it in the sequence or not) */
	/* the stack, from its output */
	bool iss_known;       /* a SYN-ACK since the client's last SYN */
	uint32_t srv_iss, srv_irs1, srv_nxt, srv_ack;
	bool down_ok;         /* every stream on the slot writes at known sequence numbers */
};

static struct slot slots[NSLOTS];

static void addr(uint8_t a[16], int family, const uint8_t *b)
{
	memset(a, 0, 16);
	memcpy(a, b, family == 4 ? 4 : 16);
}

static void slots_init(void)
{
	static const uint8_t cli4[3][4] = { { 10, 0, 0, 9 }, { 198, 18, 0, 1 }, { 10, 0, 0, 10 } };
	static const uint8_t srv4[2][4] = { { 93, 184, 216, 34 }, { 1, 2, 3, 4 } };
	static const uint8_t cli6[3][16] = { { 0xfd, 0, 0, 0x7f, [15] = 9 },
					     { 0xfd, 0, 0, 0x7f, [15] = 1 },
					     { 0xfd, 0, 0, 0x7f, [15] = 0x10 } };
	static const uint8_t srv6[2][16] = { { 0x20, 0x01, 0x0d, 0xb8, [15] = 0x80 },
					     { 0x20, 0x01, 0x0d, 0xb8, 0, 1, [14] = 4, [15] = 3 } };
	static const struct {
		int c, s;
		uint16_t sport, dport;
	} map[4] = { { 0, 0, 40001, 443 }, { 0, 0, 40002, 443 }, { 1, 1, 40003, 80 },
		     { 2, 1, 40004, 22 } };

	memset(slots, 0, sizeof(slots));
	for (int i = 0; i < NSLOTS; i++) {
		struct slot *s = &slots[i];
		int k = i % 4;

		s->t.family = i < 4 ? 4 : 6;
		addr(s->t.src, s->t.family, s->t.family == 4 ? cli4[map[k].c] : cli6[map[k].c]);
		addr(s->t.dst, s->t.family, s->t.family == 4 ? srv4[map[k].s] : srv6[map[k].s]);
		s->t.sport = map[k].sport;
		s->t.dport = map[k].dport;
		s->cli_nxt = 1000u * (uint32_t)(i + 1);
		s->down_ok = true;
	}
}

static bool seq_lt(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) < 0;
}

/* The byte at sequence number seq of a slot's stream: dir 0 the client's, 1 the stack's. */
static uint8_t pat(int dir, int slot, uint32_t seq)
{
	return (uint8_t)(seq * 167u ^ (seq >> 8) ^ (seq >> 16) * 13u ^ (uint32_t)slot * 29u ^
			 (uint32_t)dir * 101u);
}

/* The slot a packet from the stack (src, dst, sport, dport as in the packet) answers, or -1. */
static int slot_of_reply(const struct pkt_view *v)
{
	size_t al = v->family == 4 ? 4 : 16;

	for (int i = 0; i < NSLOTS; i++) {
		const struct tuple *t = &slots[i].t;

		if (t->family == v->family && ntohs(v->sport_be) == t->dport &&
		    ntohs(v->dport_be) == t->sport && memcmp(pkt_src(v), t->dst, al) == 0 &&
		    memcmp(pkt_dst(v), t->src, al) == 0)
			return i;
	}
	return -1;
}

/* The slot a packet from the client (src, dst, sport, dport as in the packet) is on, or -1. */
static int slot_of_client(const struct pkt_view *v)
{
	size_t al = v->family == 4 ? 4 : 16;

	for (int i = 0; i < NSLOTS; i++) {
		const struct tuple *t = &slots[i].t;

		if (t->family == v->family && ntohs(v->sport_be) == t->sport &&
		    ntohs(v->dport_be) == t->dport && memcmp(pkt_src(v), t->src, al) == 0 &&
		    memcmp(pkt_dst(v), t->dst, al) == 0)
			return i;
	}
	return -1;
}

static int slot_of_key(const struct flow_key *k)
{
	size_t al = k->family == 4 ? 4 : 16;

	for (int i = 0; i < NSLOTS; i++) {
		const struct tuple *t = &slots[i].t;

		if (t->family == k->family && ntohs(k->sport_be) == t->sport &&
		    ntohs(k->dport_be) == t->dport && memcmp(k->src, t->src, al) == 0 &&
		    memcmp(k->dst, t->dst, al) == 0)
			return i;
	}
	return -1;
}

/* The client sent [seq, end) on slot s (SYN and FIN counted). */
static void client_sent(struct slot *s, uint32_t seq, uint32_t end, bool syn_only, bool fin)
{
	if (syn_only) {
		bool known = false;

		for (int i = 0; i < SYN_HIST; i++)
			known |= s->syns[i].used && s->syns[i].isn == seq;
		if (!known) {
			s->syns[s->syn_next] = (struct synrec){ true, false, seq, seq };
			s->syn_next = (s->syn_next + 1) % SYN_HIST;
		}
	}
	for (int i = 0; i < SYN_HIST; i++) {
		struct synrec *r = &s->syns[i];

		if (r->used && (int32_t)(end - r->isn) >= 0 && seq_lt(r->hi, end))
			r->hi = end;
		if (r->used && fin)
			r->fin = true;
	}
}

/* ---- the stack and its environment -------------------------------------------------------- */

static struct ts_config cfg4, cfg6; /* loaded once: v4 only, v4 + v6 */
static struct ts_config cfg;
static struct budget *bud;
static struct event_base *base;
static struct netstack *ns;
static struct log lg;
static bool ring_mode;
static uint32_t mtu;

/* Streams the hook received. */
struct fstream {
	struct stream *s;
	int slot;              /* -1: not a slot's tuple */
	bool up_ok;            /* the bases below are known */
	uint32_t rd_base, wr_base;
	uint64_t rd_off, wr_off;
	bool want_rd, want_wr; /* its interest */
	bool react_end;        /* the callbacks end it at EOF or an error */
	int err;               /* what the error callback reported */
};
static struct fstream streams[MAX_STREAMS];
static int n_streams; /* entries used (live or not) */
static int n_live;

/* Frames lent and not yet written. */
struct lent {
	const uint8_t *pkt;
	size_t len;
	struct pkt_meta m;
	uint64_t sum;
	void (*release)(void *arg, bool lost);
	void *arg;
};
static struct lent lentq[DRIVER_LEND_MAX];
static int n_lent;

/* A read buffer the input under way was read into, until the stack takes it. */
static struct driver_rxbuf *rx_cur;
static uint64_t rx_taken, rx_freed;

static uint64_t n_inputs;
static bool batch_open;
static uint32_t burst_port;

static uint8_t pbuf_copy[PKT_MAX];

static uint64_t sum64(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h;
}

static bool v4_header_ok(const uint8_t *ip, uint16_t l3_len)
{
	return csum_fold(csum_partial(ip, l3_len, 0)) == 0xffff;
}

static uint64_t pseudo(const struct pkt_view *v, uint8_t proto, uint32_t l4_len)
{
	return v->family == 4 ? csum_pseudo4(pkt_src(v), pkt_dst(v), proto, l4_len)
			      : csum_pseudo6(pkt_src(v), pkt_dst(v), proto, l4_len);
}

/* What a packet from the stack says about its slot, and its payload checked. */
static void track_reply(const struct pkt_view *v, uint32_t payload, uint16_t mss)
{
	int k = slot_of_reply(v);
	struct slot *s;
	uint32_t seq, ack, end;
	const uint8_t *pl;

	if (k < 0)
		return;
	s = &slots[k];
	seq = pkt_get32(v->l4 + TCP_OFF_SEQ);
	ack = pkt_get32(v->l4 + TCP_OFF_ACK);
	if (!s->tainted)
		check(mss <= s->mss_bound);
	if ((v->tcp_flags & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK)) {
		s->srv_iss = seq;
		s->srv_irs1 = ack;
		s->srv_nxt = seq + 1;
		s->iss_known = true;
	}
	end = seq + payload + ((v->tcp_flags & TCP_FIN) ? 1 : 0);
	if (seq_lt(s->srv_nxt, end))
		s->srv_nxt = end;
	if (v->tcp_flags & TCP_RST)
		return;
	if (v->tcp_flags & TCP_ACK) {
		s->srv_ack = ack;
		/* Nothing beyond what the client sent since the SYN the connection came from. */
		if (!s->tainted && s->iss_known)
			for (int i = 0; i < SYN_HIST; i++)
				if (s->syns[i].used && s->syns[i].isn + 1 == s->srv_irs1)
					check(!seq_lt(s->syns[i].hi + s->syns[i].fin, ack));
	}
	if (!payload || !s->down_ok)
		return;
	pl = v->l4 + v->tcp_hlen;
	for (uint32_t i = 0; i < payload; i++)
		check(pl[i] == pat(1, k, seq + i));
}

/* Every packet the stack writes to the TUN. */
static void check_tx(const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	struct pkt_view v;
	uint32_t payload;
	uint8_t *b = pbuf_copy;

	check(len > 0 && len <= sizeof(pbuf_copy));
	memcpy(b, pkt, len);
	check(pkt_parse(&v, b, len) == PKT_OK);
	check(v.len == len && v.proto == 6);
	check(v.l3_len == (v.family == 4 ? 20 : 40));
	payload = v.l4_len - v.tcp_hlen;
	trace("  tx v%d %u>%u fl=%02x seq=%u ack=%u win=%u len=%u gso=%u\n", v.family,
	      ntohs(v.sport_be), ntohs(v.dport_be), v.tcp_flags, pkt_get32(v.l4 + TCP_OFF_SEQ),
	      pkt_get32(v.l4 + TCP_OFF_ACK), (v.l4[14] << 8) | v.l4[15], payload,
	      m ? m->gso_size : 0);
	if (v.family == 4)
		check(v4_header_ok(b, 20));
	if (m && m->gso_type != PKT_GSO_NONE) {
		/* A super-packet the kernel cuts into gso_size segments and completes. */
		check(m->gso_type == (v.family == 4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6));
		check(m->flags == PKT_META_NEEDS_CSUM);
		check(m->csum_start == v.l3_len && m->csum_offset == TCP_OFF_CSUM);
		check(m->hdr_len == v.l3_len + v.tcp_hlen);
		check(m->gso_size > 0 && payload > m->gso_size);
		check(m->hdr_len + m->gso_size <= mtu);
		check(!(v.tcp_flags & (TCP_SYN | TCP_RST)));
		check(csum_load16(v.l4 + TCP_OFF_CSUM) ==
		      csum_fold(pseudo(&v, 6, v.l4_len)));
		track_reply(&v, payload, m->gso_size);
		return;
	}
	check(!m || m->flags == 0);
	check(len <= mtu);
	check(csum_fold(csum_partial(v.l4, v.l4_len, pseudo(&v, 6, v.l4_len))) == 0xffff);
	track_reply(&v, payload, (uint16_t)payload);
}

static int tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	check_tx(pkt, len, NULL);
	return 0;
}

static int tx_meta(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	(void)arg;
	check_tx(pkt, len, m);
	return 0;
}

/* The driver's ring writes every lent frame at a flush, or when DRIVER_LEND_MAX are lent. */
static void lent_write_all(void)
{
	int n = n_lent;

	n_lent = 0;
	for (int i = 0; i < n; i++) {
		check(sum64(lentq[i].pkt, lentq[i].len) == lentq[i].sum); /* unchanged since lent */
		check_tx(lentq[i].pkt, lentq[i].len, &lentq[i].m);
		lentq[i].release(lentq[i].arg, false);
	}
}

static int tx_lend(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m,
		   void (*release)(void *rel_arg, bool lost), void *rel_arg)
{
	(void)arg;
	if (!ring_mode) { /* no ring: written and released now */
		check_tx(pkt, len, m);
		release(rel_arg, false);
		return 0;
	}
	if (n_lent == DRIVER_LEND_MAX)
		lent_write_all();
	lentq[n_lent++] = (struct lent){ pkt, len, *m, sum64(pkt, len), release, rel_arg };
	return 0;
}

static void tx_flush(void *arg)
{
	(void)arg;
	lent_write_all();
}

static struct driver_rxbuf *rx_take(void *arg, const uint8_t *pkt)
{
	struct driver_rxbuf *b = rx_cur;

	(void)arg;
	if (!b || pkt != b->frame)
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

/* ---- streams ------------------------------------------------------------------------------ */

static struct fstream *fs_of(int idx)
{
	int want;

	if (!n_live)
		return NULL;
	want = idx % n_live;
	for (int i = 0; i < n_streams; i++)
		if (streams[i].s && want-- == 0)
			return &streams[i];
	return NULL;
}

/* The owner is done with the stream: it is freed, its permit goes back. */
static void fs_end(struct fstream *f, bool abort_it)
{
	struct stream *s = f->s;

	f->s = NULL;
	n_live--;
	if (abort_it)
		s->ops->abort(s);
	else
		s->ops->close(s);
	lwip_stack_session_end(ns);
}

static void fs_check_read(struct fstream *f, const uint8_t *b, size_t n)
{
	trace("  read %zu at %llu\n", n, (unsigned long long)f->rd_off);
	if (f->up_ok && !slots[f->slot].tainted)
		for (size_t i = 0; i < n; i++)
			check(b[i] == pat(0, f->slot, f->rd_base + (uint32_t)(f->rd_off + i)));
	f->rd_off += n;
}

static uint8_t iobuf[262144];

static void fs_read(struct fstream *f, size_t n, int how)
{
	struct stream *s = f->s;
	ssize_t r;

	if (n == 0 || n > sizeof(iobuf))
		n = sizeof(iobuf);
	switch (how & 3) {
	case 0:
		r = s->ops->read(s, iobuf, n);
		if (r > 0)
			fs_check_read(f, iobuf, (size_t)r);
		break;
	case 1: {
		struct iovec iov[8];
		int cnt = 8;

		r = s->ops->peekv(s, iov, &cnt, n);
		if (r > 0) {
			size_t got = 0;

			for (int i = 0; i < cnt; i++) {
				memcpy(iobuf + got, iov[i].iov_base, iov[i].iov_len);
				got += iov[i].iov_len;
			}
			check(got == (size_t)r);
			s->ops->skip(s, (size_t)r);
			fs_check_read(f, iobuf, (size_t)r);
		}
		break;
	}
	case 2:
		r = s->ops->peek(s, iobuf, n);
		if (r > 0) {
			ssize_t r2 = s->ops->read(s, iobuf + r, (size_t)r);

			check(r2 == r && memcmp(iobuf, iobuf + r, (size_t)r) == 0);
			fs_check_read(f, iobuf, (size_t)r);
		}
		break;
	default:
		s->ops->set_lowat(s, n % 70000);
		r = -EAGAIN;
		break;
	}
	trace("  read how %d: %zd (err %d)\n", how & 3, r, f->err);
	check(!f->err || r == f->err || (how & 3) == 3); /* after the error callback, the error */
}

static ssize_t fs_write(struct fstream *f, size_t n)
{
	struct stream *s = f->s;
	ssize_t w;

	if (n == 0)
		return 0;
	if (n > sizeof(iobuf))
		n = sizeof(iobuf);
	for (size_t i = 0; i < n; i++)
		iobuf[i] = pat(1, f->slot < 0 ? 0 : f->slot, f->wr_base + (uint32_t)(f->wr_off + i));
	(void)s->ops->write_room(s);
	w = s->ops->write(s, iobuf, n);
	trace("  write %zu: %zd\n", n, w);
	check(w <= (ssize_t)n && w != 0);
	check(!f->err || w == f->err);
	if (w > 0)
		f->wr_off += (uint64_t)w;
	return w;
}

/* The owner's callbacks behave as the relay does: each makes what progress it can, or ends
 * the stream, or drops the interest that has nothing left to give (level-triggered readiness
 * fires again otherwise). So the loop comes to rest (settle). */
static unsigned callbacks; /* owner callbacks run */

static void on_readable(void *arg)
{
	struct fstream *f = arg;
	ssize_t r = f->s->ops->read(f->s, iobuf, sizeof(iobuf));

	callbacks++;
	check(r != -EAGAIN); /* readable: data, EOF or an error to report */
	if (r > 0) {
		fs_check_read(f, iobuf, (size_t)r);
	} else if (f->react_end) {
		fs_end(f, r < 0);
	} else {
		f->want_rd = false;
		f->s->ops->set_interest(f->s, false, f->want_wr);
	}
}

static void on_writable(void *arg)
{
	struct fstream *f = arg;
	ssize_t w = fs_write(f, 16384);

	callbacks++;
	if (w >= 0 || w == -EAGAIN)
		return;
	if (f->react_end) {
		fs_end(f, true);
	} else {
		f->want_wr = false;
		f->s->ops->set_interest(f->s, f->want_rd, false);
	}
}

static void on_error(void *arg, int err)
{
	struct fstream *f = arg;

	callbacks++;
	check(err < 0);
	check(f->err == 0); /* at most once */
	f->err = err;
	if (f->react_end)
		fs_end(f, true);
}

static void fs_interest(struct fstream *f, uint8_t bits)
{
	struct stream_cbs cbs = { (bits & 4) ? on_readable : NULL, (bits & 8) ? on_writable : NULL,
				  on_error };

	f->react_end = bits & 16;
	f->want_rd = bits & 1;
	f->want_wr = bits & 2;
	stream_set_callbacks(f->s, &cbs, f);
	f->s->ops->set_interest(f->s, f->want_rd, f->want_wr);
}

static void on_acc(void *arg, const struct flow_key *k, struct stream *s)
{
	struct fstream *f;
	int slot = slot_of_key(k);

	(void)arg;
	if (n_streams == MAX_STREAMS) { /* no room to track it: the owner refuses it */
		s->ops->abort(s);
		lwip_stack_session_end(ns);
		return;
	}
	f = &streams[n_streams++];
	memset(f, 0, sizeof(*f));
	f->s = s;
	f->slot = slot;
	n_live++;
	if (slot >= 0) {
		struct slot *sl = &slots[slot];

		f->up_ok = sl->iss_known;
		f->rd_base = sl->srv_irs1;
		f->wr_base = sl->srv_iss + 1;
		if (!sl->iss_known)
			sl->down_ok = false; /* its bytes' sequence numbers are unknown */
	}
	fs_interest(f, 0);
}

/* ---- feeding ------------------------------------------------------------------------------ */

static uint8_t inbuf[PKT_MAX + REWRITE_ANSWER_ROOM];

static void check_answer(uint8_t *b, size_t len)
{
	struct pkt_view v;

	check(len > 0 && len <= PKT_MAX);
	check(pkt_parse(&v, b, len) == PKT_OK);
	if (v.family == 4 && (v.proto == 6 || (v.proto == 1 && v.l4[0] == 3)))
		check(v4_header_ok(b, v.l3_len));
	if (v.proto == 6) {
		check(v.tcp_flags & TCP_RST);
		check(csum_fold(csum_partial(v.l4, v.l4_len, pseudo(&v, 6, v.l4_len))) == 0xffff);
	}
	if (v.family == 4 && v.proto == 1 && v.l4[0] == 3)
		check(csum_fold(csum_partial(v.l4, v.l4_len, 0)) == 0xffff);
	if (v.family == 6 && v.proto == 58 && v.l4[0] == 1)
		check(csum_fold(csum_partial(v.l4, v.l4_len, pseudo(&v, 58, v.l4_len))) == 0xffff);
}

/* One packet read from the TUN (len bytes at pkt), as the driver hands it over. */
static void feed(const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	struct pkt_view view;
	size_t out_len = 0;
	bool plain = false, took;
	uint8_t *b = inbuf;
	enum driver_verdict vd;

	if (len > PKT_MAX)
		return;
	if (cfg.tun.gso_output && len >= (32u << 10) && rx_cur == NULL &&
	    (rx_cur = malloc(sizeof(*rx_cur) + len + REWRITE_ANSWER_ROOM))) {
		rx_cur->free = rxbuf_free;
		b = rx_cur->frame;
	}
	memmove(b, pkt, len);
	if (trace_on() && pkt_parse(&view, b, len) == PKT_OK && view.proto == 6)
		trace("  in v%d %u>%u fl=%02x seq=%u ack=%u win=%u len=%u meta=%d/%d\n",
		      view.family, ntohs(view.sport_be), ntohs(view.dport_be), view.tcp_flags,
		      pkt_get32(view.l4 + TCP_OFF_SEQ), pkt_get32(view.l4 + TCP_OFF_ACK),
		      (view.l4[14] << 8) | view.l4[15], view.l4_len - view.tcp_hlen,
		      m ? m->flags : 0, m ? m->gso_type : 0);
	else
		trace("  in %zu bytes\n", len);
	n_inputs++;
	batch_open = true;
	vd = lwip_stack_ops.input(ns, 0, b, len, m, fake_now, &out_len, &plain, &view);
	took = b != inbuf && rx_cur == NULL;
	if (took)
		check(vd == DRIVER_DONE);
	if (vd == DRIVER_WRITE) { /* written back from the buffer it was read into */
		check(plain);
		check_answer(b, out_len);
	}
	if (rx_cur) { /* not taken: the driver reads into it again */
		free(rx_cur);
		rx_cur = NULL;
	}
}

static void batch_end(void)
{
	if (batch_open) {
		batch_open = false;
		lwip_stack_ops.batch_end(ns, 0, fake_now);
	}
}

/* n passes of the loop (each one iteration: what is active runs; a level-triggered stream
 * that is still due runs again in the next pass). */
static void run_loop(int n)
{
	batch_end();
	for (int i = 0; i < n; i++)
		event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

/* Passes until one runs no owner callback: with owners that make what progress they can and
 * no packet arriving, readiness must come to rest (no busy loop). */
static void settle(void)
{
	int i;

	for (i = 0; i < 1000; i++) {
		unsigned before = callbacks;

		run_loop(1);
		if (callbacks == before)
			break;
	}
	check(i < 1000);
}

/* ---- building segments -------------------------------------------------------------------- */

static uint8_t segbuf[PKT_MAX];

/* A TCP segment on t into segbuf; returns its length (0: it does not fit). The checksum is
 * full, or the pseudo-header sum (partial), or wrong. */
static size_t build(const struct tuple *t, uint32_t seq, uint32_t ack, uint8_t flags,
		    uint16_t win, const uint8_t *opt, size_t optlen, uint32_t payload, int slot,
		    bool ext, bool partial, bool bad)
{
	uint8_t *b = segbuf, *tcp;
	size_t l3 = t->family == 4 ? 20 + (ext ? 4 : 0) : 40 + (ext ? 8 : 0);
	size_t hl = 20 + optlen, len = l3 + hl + payload;
	uint64_t s;

	if (len > 65535 || (t->family == 6 && len - 40 > 65535))
		return 0;
	memset(b, 0, l3 + hl);
	if (t->family == 4) {
		b[0] = (uint8_t)(0x40 | l3 / 4);
		pkt_put16(b + 2, (uint16_t)len);
		b[6] = 0x40; /* DF */
		b[8] = 64;
		b[9] = 6;
		memcpy(b + 12, t->src, 4);
		memcpy(b + 16, t->dst, 4);
		if (ext)
			memset(b + 20, 1, 4); /* NOPs */
		csum_store16(b + 10, csum_buf(b, l3));
		s = csum_pseudo4(t->src, t->dst, 6, (uint32_t)(hl + payload));
	} else {
		b[0] = 0x60;
		pkt_put16(b + 4, (uint16_t)(len - 40));
		b[6] = ext ? 0 : 6;
		b[7] = 64;
		memcpy(b + 8, t->src, 16);
		memcpy(b + 24, t->dst, 16);
		if (ext) {
			b[40] = 6; /* Hop-by-Hop: next TCP, 8 bytes, PadN */
			b[42] = 1;
			b[43] = 4;
		}
		s = csum_pseudo6(t->src, t->dst, 6, (uint32_t)(hl + payload));
	}
	tcp = b + l3;
	pkt_put16(tcp, t->sport);
	pkt_put16(tcp + 2, t->dport);
	tcp[4] = (uint8_t)(seq >> 24);
	tcp[5] = (uint8_t)(seq >> 16);
	tcp[6] = (uint8_t)(seq >> 8);
	tcp[7] = (uint8_t)seq;
	tcp[8] = (uint8_t)(ack >> 24);
	tcp[9] = (uint8_t)(ack >> 16);
	tcp[10] = (uint8_t)(ack >> 8);
	tcp[11] = (uint8_t)ack;
	tcp[12] = (uint8_t)(hl / 4 << 4);
	tcp[13] = flags;
	pkt_put16(tcp + 14, win);
	memcpy(tcp + 20, opt, optlen);
	for (uint32_t i = 0; i < payload; i++)
		tcp[hl + i] = pat(0, slot, seq + ((flags & TCP_SYN) ? 1 : 0) + i);
	if (partial)
		csum_store16(tcp + 16, csum_fold(s));
	else
		csum_store16(tcp + 16, (uint16_t)~csum_fold(csum_partial(tcp, hl + payload, s)));
	if (bad)
		tcp[17] ^= 0x5a;
	return len;
}

/* The options of a segment record into o (at most 40 bytes); returns their length. *mss: the
 * largest MSS lwIP may take from them in a SYN (536 without the option, TCP_MSS for 0 or
 * more than TCP_MSS; garbage may hold an option of its own). */
static size_t options(struct rd *r, uint8_t sel, const struct slot *s, uint8_t o[40],
		      uint32_t *mss)
{
	uint8_t tmp[80];
	size_t n = 0;

	*mss = 536;
	if (sel & 128)
		tmp[n++] = 0; /* EOL first: lwIP stops there */
	if (sel & 1) {
		uint16_t v = u16(r);

		tmp[n++] = 2;
		tmp[n++] = 4;
		tmp[n++] = (uint8_t)(v >> 8);
		tmp[n++] = (uint8_t)v;
		if (!(sel & 128)) /* after an EOL lwIP sees nothing */
			*mss = v == 0 || v > LWIP_TCP_MSS ? LWIP_TCP_MSS : v;
	}
	if (sel & 2) {
		tmp[n++] = 1;
		tmp[n++] = 3;
		tmp[n++] = 3;
		tmp[n++] = u8(r);
	}
	if (sel & 4) {
		tmp[n++] = 4;
		tmp[n++] = 2;
	}
	if (sel & 8) {
		uint32_t a = u32(r), b = u32(r);

		tmp[n++] = 8;
		tmp[n++] = 10;
		for (int i = 3; i >= 0; i--)
			tmp[n++] = (uint8_t)(a >> (8 * i));
		for (int i = 3; i >= 0; i--)
			tmp[n++] = (uint8_t)(b >> (8 * i));
	}
	if (sel & 16) {
		int k = u8(r) % 4 + 1;

		tmp[n++] = 5;
		tmp[n++] = (uint8_t)(2 + 8 * k);
		for (int i = 0; i < k; i++) {
			uint32_t l = s->srv_nxt - u16(r), e = l + u16(r);

			for (int j = 3; j >= 0; j--)
				tmp[n++] = (uint8_t)(l >> (8 * j));
			for (int j = 3; j >= 0; j--)
				tmp[n++] = (uint8_t)(e >> (8 * j));
		}
	}
	if (sel & 32) {
		int k = u8(r) % 16;

		for (int i = 0; i < k; i++)
			tmp[n++] = u8(r);
		*mss = LWIP_TCP_MSS;
	}
	if (n > 40)
		n = 40;
	if (!(sel & 64))
		while (n % 4)
			tmp[n++] = 1; /* NOP */
	while (n % 4) /* the data offset counts words: whatever is left over is EOL */
		tmp[n++] = 0;
	if (n > 40)
		n = 40;
	memcpy(o, tmp, n);
	return n;
}

/* The acknowledgement a segment record names (ctl bits 0-1), before its delta. */
static uint32_t ack_base(const struct slot *s, uint8_t ctl)
{
	switch (ctl & 3) {
	case 0:
		return s->srv_nxt;
	case 1:
		return s->srv_iss + 1;
	case 2:
		return 0;
	default:
		return s->srv_nxt - 32768;
	}
}

/* The driver's metadata for the segment in segbuf (n bytes): NEEDS_CSUM (mk 1) or DATA_VALID
 * (2), a super-packet of gso_size segments when big. */
static void seg_meta(struct pkt_meta *m, size_t n, int mk, bool big, int family, uint8_t gso)
{
	struct pkt_view v;

	check(pkt_parse(&v, segbuf, n) == PKT_OK);
	m->flags = mk == 1 ? PKT_META_NEEDS_CSUM : PKT_META_DATA_VALID;
	if (mk == 1) {
		m->csum_start = v.l3_len;
		m->csum_offset = TCP_OFF_CSUM;
	}
	m->hdr_len = (uint16_t)(v.l3_len + v.tcp_hlen);
	if (big) {
		m->gso_type = family == 4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6;
		m->gso_size = (uint16_t)(gso ? 64u + gso * 5u : 1400u);
	}
}

static void op_segment(struct rd *r)
{
	uint8_t sel = u8(r), flags = u8(r);
	int8_t dseq = (int8_t)u8(r), dack = (int8_t)u8(r);
	uint8_t ctl = u8(r);
	uint16_t win = u16(r), len = u16(r);
	uint8_t gso = u8(r), osel = u8(r);
	int k = sel & 7;
	struct slot *s = &slots[k];
	uint8_t opt[40];
	uint32_t mss;
	size_t optlen = options(r, osel, s, opt, &mss);
	int mk = (sel >> 4) & 3;
	bool big = (sel & 64) && (mk == 1 || mk == 2), ext = ctl & 32;
	int32_t scale = (ctl & 4) ? 1024 : 1;
	uint32_t seq, ack, cap, l3 = s->t.family == 4 ? 20 : 40, end;
	struct pkt_meta m = { 0 };
	size_t n;
	bool syn_only = (flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_SYN;

	seq = ((sel & 8) ? s->srv_ack : s->cli_nxt) + (uint32_t)(dseq * scale);
	if (syn_only && (ctl & 16))
		seq = u32(r);
	ack = ack_base(s, ctl) + (uint32_t)(dack * scale);
	cap = big ? 65535 - l3 - 8 - (uint32_t)optlen - 20 : mtu - l3 - 8 - (uint32_t)optlen - 20;
	if (len > cap)
		len = (uint16_t)(len % (cap + 1));
	n = build(&s->t, seq, ack, flags, win, opt, optlen, len, k, ext, mk == 1,
		  (sel & 128) != 0);
	if (!n)
		return;
	if (mk == 1 || mk == 2)
		seg_meta(&m, n, mk, big, s->t.family, gso);
	/* What the client has sent now: a SYN opens a new history entry. */
	if ((flags & TCP_SYN) && !syn_only)
		s->tainted = true;
	if (syn_only) {
		s->iss_known = false;
		if (mss > s->mss_bound)
			s->mss_bound = mss;
	}
	end = seq + len + ((flags & TCP_SYN) ? 1 : 0) + ((flags & TCP_FIN) ? 1 : 0);
	client_sent(s, seq, end, syn_only, flags & TCP_FIN);
	if (seq == s->cli_nxt || syn_only)
		s->cli_nxt = end;
	feed(segbuf, n, (mk == 1 || mk == 2) ? &m : NULL);
	if (ctl & 8)
		run_loop(1);
}

static void op_raw(struct rd *r)
{
	uint8_t fl = u8(r);
	size_t len = u16(r);
	struct pkt_view v;
	struct pkt_meta m = { 0 };
	int k;

	if (len > r->n)
		len = r->n;
	memcpy(segbuf, r->p, len);
	r->p += len;
	r->n -= len;
	if (pkt_parse(&v, segbuf, len) == PKT_OK) {
		if ((fl & 4) && (v.proto == 6 || v.proto == 17)) {
			uint8_t *c = v.l4 + (v.proto == 6 ? TCP_OFF_CSUM : UDP_OFF_CSUM);

			if (v.family == 4) {
				csum_store16(v.ip + 10, 0);
				csum_store16(v.ip + 10, csum_buf(v.ip, v.l3_len));
			}
			csum_store16(c, 0);
			csum_store16(c, (uint16_t)~csum_fold(csum_partial(v.l4, v.l4_len,
							pseudo(&v, v.proto, v.l4_len))));
		}
		/* The tuple of a slot, either way: the slot's content checks stop here. */
		if (v.proto == 6 && ((k = slot_of_reply(&v)) >= 0 || (k = slot_of_client(&v)) >= 0))
			slots[k].tainted = true;
		if (fl & 9) {
			m.flags = (fl & 1) ? PKT_META_NEEDS_CSUM : PKT_META_DATA_VALID;
			m.csum_start = v.l3_len;
			m.csum_offset = v.proto == 6 ? TCP_OFF_CSUM : UDP_OFF_CSUM;
			if ((fl & 2) && (v.proto == 6 || v.proto == 17)) {
				m.gso_type = v.proto == 17 ? PKT_GSO_UDP_L4
					     : v.family == 4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6;
				m.gso_size = (uint16_t)(1 + fl * 5);
			}
		}
	}
	feed(segbuf, len, m.flags ? &m : NULL);
}

static void op_burst(struct rd *r)
{
	int n = u8(r) % 64 + 1;
	const struct slot *s = &slots[u8(r) % NSLOTS];
	static const uint8_t mss[4] = { 2, 4, 0x05, 0x78 };

	for (int i = 0; i < n; i++) {
		struct tuple t = s->t;
		size_t len;

		t.sport = (uint16_t)(50000 + burst_port++ % 10000);
		t.src[t.family == 4 ? 3 : 15] = (uint8_t)(t.src[t.family == 4 ? 3 : 15] + i % 3 * 16);
		len = build(&t, 77u * (uint32_t)i, 0, TCP_SYN, 65535, mss, sizeof(mss), 0, 0, false,
			    false, false);
		feed(segbuf, len, NULL);
	}
}

/* ---- one input ---------------------------------------------------------------------------- */

static void load(struct ts_config *c, const char *json)
{
	char err[TS_ERRLEN];

	config_init(c);
	if (config_load_string(json, c, err, sizeof(err)) != 0)
		abort();
}

static void start(uint8_t m0, uint8_t m1)
{
	static const uint32_t mtus[4] = { 1500, 1280, 576, 9000 };
	static const uint32_t permits[4] = { 64, 1, 2, 4 };
	static const uint32_t backlogs[4] = { 0, 1, 2, 4 };
	char err[TS_ERRLEN];
	bool offload = m0 & 1, lend = offload && (m0 & 8);

	if (!cfg4.tun.mtu) {
		load(&cfg4, "{\"stack\":\"lwip\",\"tun\":{\"address\":\"198.18.0.1/15\"}}");
		load(&cfg6, "{\"stack\":\"lwip\",\"tun\":{\"address\":\"198.18.0.1/15\","
			    "\"address6\":\"fd00:7f::1/64\"}}");
	}
	cfg = (m0 & 32) ? cfg6 : cfg4;
	mtu = mtus[m1 & 3];
	if (mtu < 1280 && cfg.tun.has_addr6)
		mtu = 1280;
	cfg.tun.mtu = mtu;
	cfg.tun.gso_output = m0 & 2;
	cfg.tun.large_segments = m0 & 4;
	for (int i = 0; i < BUDGET_TIER_MAX; i++)
		cfg.budget.tcp_sessions[i] = permits[(m1 >> 2) & 3];
	if (backlogs[(m1 >> 4) & 3])
		cfg.budget.listen_backlog = backlogs[(m1 >> 4) & 3];
	if (m0 & 64) /* room for the stack's own buffers and a little more */
		cfg.budget.buffer_bytes = (192u << 10) + ((uint64_t)(m1 >> 6) << 16);
	if (budget_new(&cfg.budget, &bud) != 0)
		abort();
	if (!base) /* one for the process: every event is freed by the end of each input */
		base = event_base_new();
	check(base != NULL);
	log_init(&lg, LOG_LEVEL_ERROR, 2);
	ring_mode = lend && (m0 & 128);
	struct netstack_env env = { .base = base, .cfg = &cfg, .budget = bud, .log = &lg,
				    .tx = tx, .tx_meta = offload ? tx_meta : NULL,
				    .tx_lend = lend ? tx_lend : NULL,
				    .tx_flush = lend ? tx_flush : NULL,
				    .rx_take = offload && (m0 & 16) ? rx_take : NULL };
	if (lwip_stack_ops.start(&env, &ns, err, sizeof(err)) != 0)
		abort();
	lwip_stack_set_accept_hook(ns, on_acc, NULL);
}

struct ctr_query {
	const char *name;
	uint64_t value;
	bool found;
};

static void ctr_visit(void *arg, const char *name, uint64_t value)
{
	struct ctr_query *q = arg;

	if (strcmp(name, q->name) == 0) {
		q->value = value;
		q->found = true;
	}
}

static uint64_t counter(const char *name)
{
	struct ctr_query q = { name, 0, false };

	lwip_stack_ops.counters(ns, ctr_visit, &q);
	check(q.found);
	return q.value;
}

static void levels_visit(void *arg, const char *name, uint64_t value)
{
	(void)arg;
	(void)name;
	(void)value;
}

static void finish(bool abort_all)
{
	struct budget_stats bs;

	settle();
	for (int i = 0; i < n_streams; i++)
		if (streams[i].s)
			fs_end(&streams[i], abort_all);
	run_loop(2);
	check(counter("drop_too_big") == 0);
	check(counter("rx_packets") == n_inputs);
	lwip_stack_ops.free(ns);
	ns = NULL;
	check(n_lent == 0);
	check(rx_taken == rx_freed);
	check(lwip_glue_mem_bytes() == 0 && lwip_glue_rx_held_bytes() == 0);
	check(lwip_glue_cached_bytes() == 0);
	budget_get_stats(bud, &bs);
	check(bs.tcp_in_use == 0);
	check(bs.buffer_bytes_in_use == 0);
	check(bs.release_underflow == 0);
	check(event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED | EVENT_BASE_COUNT_ACTIVE) ==
	      0);
	budget_free(bud);
	bud = NULL;
}

/* Ops 5-9 on the stream idx names among the live ones (none live: nothing). */
static void op_stream(uint8_t op, struct rd *r)
{
	uint8_t idx = u8(r);
	struct fstream *f;

	batch_end(); /* the owner runs from the loop, after the driver's batch */
	switch (op) {
	case 5: {
		size_t n = u16(r);

		if (u8(r) & 1)
			n *= 4;
		if ((f = fs_of(idx)))
			fs_write(f, n);
		break;
	}
	case 6: {
		size_t n = u16(r);
		uint8_t how = u8(r);

		if ((f = fs_of(idx)))
			fs_read(f, n, how);
		break;
	}
	case 7:
		if ((f = fs_of(idx))) {
			int e = f->s->ops->shutdown_write(f->s);

			check(!f->err || e == f->err);
		}
		break;
	case 8: {
		uint8_t how = u8(r);

		if ((f = fs_of(idx))) {
			(void)f->s->ops->unacked(f->s);
			fs_end(f, how & 1);
		}
		break;
	}
	default: {
		uint8_t bits = u8(r);

		if ((f = fs_of(idx)))
			fs_interest(f, bits);
		break;
	}
	}
}

static void op_clock(struct rd *r)
{
	static const int64_t steps[4] = { 1 * MS, 50 * MS, 250 * MS, 2 * SEC };
	int64_t step = steps[u8(r) & 3];
	int n = u8(r) % 64 + 1;

	for (int i = 0; i < n; i++) {
		fake_now += step;
		run_loop(1);
	}
}

static void op_stats(void)
{
	struct netstack_stats st;

	lwip_stack_ops.stats(ns, &st);
	lwip_stack_ops.levels(ns, levels_visit, NULL);
	check(counter("rx_packets") == n_inputs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rd r = { data, size };
	uint8_t m0, m1;

	if (size < 2)
		return 0;
	m0 = u8(&r);
	m1 = u8(&r);
	slots_init();
	memset(streams, 0, sizeof(streams));
	n_streams = n_live = n_lent = 0;
	rx_taken = rx_freed = n_inputs = 0;
	batch_open = false;
	burst_port = 0;
	fake_now += 1000 * SEC;
	start(m0, m1);
	while (r.n > 0) {
		uint8_t op = u8(&r) % 16;

		trace("op %u (now %lld ms, %d streams)\n", op, (long long)(fake_now / MS), n_live);
		switch (op) {
		case 1:
			op_raw(&r);
			break;
		case 2:
			op_clock(&r);
			break;
		case 3:
			run_loop(u8(&r) % 4 + 1);
			break;
		case 4:
			batch_end();
			break;
		case 5: case 6: case 7: case 8: case 9:
			op_stream(op, &r);
			break;
		case 10:
			op_burst(&r);
			break;
		case 11: {
			uint8_t t = u8(&r) % 4;

			budget_force_tier(bud, t == 3 ? -1 : t);
			break;
		}
		case 12:
			op_stats();
			break;
		case 13:
			lwip_stack_ops.stop(ns);
			break;
		default:
			op_segment(&r);
			break;
		}
	}
	finish(size & 1);
	return 0;
}
