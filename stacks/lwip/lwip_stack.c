/* lwip_stack.c — the lwIP stack at run time: one netif that accepts TCP to any destination
 * (input hooks, no patch), a catch-all listener, the accept path into the shared dispatcher,
 * output through the driver, and tcp_tmr driven only while pcbs exist.
 * Design: docs/architecture.md, "The lwIP stack". */
#include "stacks/lwip/lwip_stack.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <limits.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ours first: lwIP's prot/tcp.h defines TCP_FIN/TCP_SYN/... as macros (same values as our
 * enum in core/pkt.h), which must not be defined before our enum is declared. */
#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/csum.h"
#include "core/driver.h"
#include "core/evspare.h"
#include "core/gso.h"
#include "core/log.h"
#include "core/lsan.h"
#include "core/pkt.h"
#include "core/rss.h"
#include "dispatch/dispatcher.h"
#include "dispatch/stream.h"
#include "stacks/lwip/lwip_glue.h"
#include "stacks/lwip/lwip_halfopen.h"
#include "stacks/lwip/lwip_isn.h"
#include "stacks/lwip/lwip_stream.h"
#include "stacks/common/l3policy.h"
#include "stacks/common/rewrite.h"

#include "lwip/ip.h"
#include "lwip/ip4.h"
#include "lwip/ip6.h"
#include "lwip/netif.h"
#include "lwip/pbuf.h"
#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"
#include "lwip_hooks.h"
#include "stacks/lwip/lwip_ackq.h"
#include "stacks/lwip/lwip_bigseg.h"
#include "stacks/lwip/lwip_split.h"

/* Frames of the stack's own for small packets lent to the driver (struct lwip_stack small):
 * as many as the driver holds lent before it writes them, each room for the largest pure
 * ACK (an IPv6 header and a TCP header with 40 bytes of options: 100 bytes). */
#define SMALL_FRAMES DRIVER_LEND_MAX
#define SMALL_FRAME_BYTES 128
_Static_assert(SMALL_FRAMES <= 32, "small_free is a 32-bit map");
struct small_frame {
	struct lwip_stack *st;
	uint8_t bytes[SMALL_FRAME_BYTES];
};

#define LWIP_COUNTERS(X)                                                                       \
	X(rx_packets)                                                                          \
	X(to_lwip)            /* TCP segments handed to lwIP */                                \
	X(udp)                /* handed to the UDP path */                                     \
	X(icmp_echo_reply)                                                                     \
	X(icmp_unreach)       /* SYN to a special destination answered: port unreachable */    \
	X(tx_packets)         /* packets lwIP emitted */                                       \
	X(accepted)                                                                            \
	X(drop_nomem)         /* an input segment without memory: a SYN (the app retransmits */ \
	                      /* it) that got no buffer, pcb or SYN-ACK, a bare ACK or RST */  \
	                      /* with the stack's own buffer out too, a header that got no */   \
	                      /* buffer, or a checksum that then failed */                      \
	X(rx_payload_nomem)   /* no memory for a segment's payload: dropped (retransmitted), */ \
	                      /* its acknowledgement and window still given to lwIP */          \
	X(ooseq_freed)        /* out-of-order queues let go when a payload found no memory */   \
	X(write_nomem)        /* stream writes lwIP refused (memory): the writer waits */       \
	X(drop_too_big)       /* an lwIP output larger than the MTU (never expected) */         \
	X(drop_input_too_big) /* a super-packet over pbuf's u16 length (BIG TCP): dropped */     \
	X(csum_trusted)       /* NEEDS_CSUM/DATA_VALID segments fed without lwIP's check */      \
	X(gso_quick_acks)     /* super-packets acknowledged in their loop pass (lwip_ackq.h) */    \
	X(gso_acks_pass_end)  /* segments the end of a pass sent (the ACK and window owed; the \
			       * rest rode on a segment the connection sent anyway) */            \
	X(gso_acks_at_once)   /* super-packets acknowledged at once: more pcbs than a pass notes */ \
	X(wnd_updates_held)   /* tcp_recved calls that would have sent an update: held instead */ \
	X(admission_refused)                                                                   \
	X(session_setup_failed)                                                                \
	X(syn_rcvd_evicted)   /* half-open connections dropped to let new SYNs in (flood) */ \
	X(syn_rcvd_yielded)   /* ... from elsewhere, dropped for a local application's SYN */  \
	X(syn_rcvd_refused)   /* half-open connections let go at once: a repeated SYN of */    \
	                      /* theirs was refused by the session budget (its RST ended */     \
	                      /* the client's connection) */                                    \
	X(drop_backlog_full)  /* a SYN the full backlog refuses (nothing old enough to evict) */ \
	X(drop_past_window)   /* an out-of-order segment past the receive window's right */   \
	                      /* edge (lwIP would queue it untrimmed, then abort) */            \
	X(big_conns)          /* connections that build large segments (lwip_bigseg.h) */     \
	X(big_to_wire)        /* ... of them sent back toward MSS-sized ones by a retransmission */ \
	X(big_window_splits)  /* large segments cut down to a small window at once */          \
	X(big_window_edges)   /* segments whose window edge moved by the wire MSS, where */     \
	                      /* lwIP's rule for the large pcb->mss held it (lwip_bigseg.h) */  \
	X(rx_taken)           /* large segments fed to lwIP in the driver's read buffer, */     \
	                      /* uncopied (env.rx_take) */                                      \
	X(big_lent)           /* large segments lent to the driver from their own pbuf, */      \
	                      /* written with the pass's others in one batch */                 \
	X(small_lent)         /* small packets (pure ACKs, window updates) copied into a */      \
	                      /* frame of the stack's and lent: written in the same batch */    \
	X(mss_option_ignored) /* MSS options outside a listener's SYN, made NOPs (RFC 9293 */ \
	                      /* 3.7.1) */                                                     \
	X(split_fin_moved)    /* a cut segment's first part sent without the FIN lwIP left on */ \
	                      /* it (lwip_split.h) */                                          \
	X(timer_spare_used)   /* lwIP's timer armed in its spare's place: libevent had no */    \
	                      /* memory for it (core/evspare.h) */                             \
	X(timer_unarmed)      /* ... and no spare was held: not armed until the next batch, */  \
	                      /* accept, session end or stream operation */

struct lwip_counters {
#define LWIP_CTR_FIELD(name) ctr_t name;
	LWIP_COUNTERS(LWIP_CTR_FIELD)
#undef LWIP_CTR_FIELD
	struct l3policy_counters policy; /* own_address, icmp, proto, family */
	ctr_t drop_parse[PKT_REASON_MAX];
};

/* An accepted connection waiting for the loop (dispatch never runs inside lwIP's callbacks). */
struct pending {
	struct pending *next;
	struct flow_key key;
	struct stream *s;
};

struct lwip_stack {
	struct netstack_env env;
	struct l3policy pol; /* what gets in: the same rules as the system stack's */
	struct netif netif;
	struct tcp_pcb *listener;
	struct lwip_sendshare share;  /* the streams' send buffers (lwip_stream.h) */
	struct event *tmr_ev;
	struct evspare tmr_spare; /* held while tmr_ev is needed (pcbs exist) */
	struct event *accept_ev;
	struct pending *pending, **pending_tail;
	bool tmr_armed;
	bool has6;
	uint8_t *txbuf;    /* an output chain made linear: mtu bytes, GSO_TRAIN_MAX with bigseg */
	size_t txbuf_size;
	size_t mtu;        /* tun.mtu: the largest packet lwIP may emit but a large segment */
	/* Accepted connections build large segments for the kernel to cut (lwip_bigseg.h): with a
	 * train and tun.large_segments. */
	bool bigseg;
	/* The wire MSS of the connection whose segment output() is about to get, from the output
	 * hook (0: not a large-segment connection). */
	uint16_t out_wire;
	/* The segment output() is handing to the train when it is one pbuf of its own: its
	 * super-packet is lent to the driver with a reference (env.tx_lend) instead of written
	 * at once, and the pass's super-packets go in one batch. NULL otherwise. */
	struct pbuf *out_p;
	bool lent;         /* frames lent since the last tx_flush */
	/* Small packets the train emits as they are (pure ACKs, window updates) are copied into
	 * one of these (SMALL_FRAMES, with env.tx_lend) and lent, so a pass's ACKs go to the TUN
	 * in one batch with its large segments instead of a write each. The driver writes every
	 * lent frame by the time DRIVER_LEND_MAX are lent, so they never run out while it runs;
	 * when they do (a ring that lost a round keeps its frames), the packet is written at
	 * once. A block of their own, not in this struct: a frame the ring lost may still be read
	 * by the kernel after the stack is freed, so then the block is never freed (small_lost). */
	struct small_frame *small;
	uint32_t small_free; /* bit i: small[i] is not lent */
	bool small_lost;     /* a frame was lost with the driver's ring: small stays allocated */
	/* With offload (and tun.gso_output): output segments of one flow leave as GSO trains,
	 * flushed at the end of each driver batch and once per loop pass (flush_ev). */
	struct gso_train *train;
	struct event *flush_ev;
	bool flush_armed;
	/* With offload input: the ACKs super-packets are owed, sent at the end of the loop pass
	 * (lwip_ackq.h); ack_ev runs after the callbacks the batch made active (the relay's). */
	struct event *ack_ev;
	bool ack_armed;
	/* The netif's checksum control: everything but the input IPv4 header check (ours, counted,
	 * in tcp_in); with a train lwIP also leaves the TCP checksum to it (a segment that joins a
	 * train needs only the partial sum the train writes; the train fills in the full one for
	 * what goes out alone). */
	u16_t csum_ctrl;
	/* The packet now inside netif->input, as our parser saw it (read by the hooks). */
	const struct pkt_view *cur;
	bool cur_gso;                 /* ... and it is an offload super-packet */
	int64_t now_ns;               /* the driver's clock for this packet: RFC 6528's M */
	int64_t ooseq_freed_ns;       /* when free_ooseq last walked the connections */
	struct lwip_isn isn;          /* the ISN key, drawn at start */
	int64_t evict_after_ns;       /* no half-open connection is old enough to evict before */
	struct lwip_halfopen *halfopen; /* the listener's handshakes under way, by 4-tuple */
	/* The TUN's own addresses: the source of every local application's connections. */
	uint8_t own4[4], own6[16];
	/* When the budget refuses an input segment's memory, a segment that occupies no
	 * sequence space (a pure ACK or RST, or the header of one whose payload is dropped) goes
	 * to lwIP in this buffer: lwIP frees such a segment before tcp_input returns (it keeps
	 * only segments with data, SYN or FIN). */
	struct pbuf_custom ctl;
	bool ctl_busy;
	uint8_t ctl_buf[128] __attribute__((aligned(8))); /* IPv4 60 + TCP 60, or IPv6 40 + 60 */
	lwip_accept_fn accept_hook;
	void *accept_arg;
	struct lwip_counters ctr;
};

static struct lwip_stack *as_lw(struct netstack *ns)
{
	return (struct lwip_stack *)ns;
}

/* ---- timers ---------------------------------------------------------------------------------- */

/* The TCP timer ticks in a row without a kept block reused after which the kept blocks are
 * given back: one second. */
#define LWIP_CACHE_IDLE_TICKS (1000 / TCP_TMR_INTERVAL)

/* tcp_tmr runs every TCP_TMR_INTERVAL while any pcb is active or in TIME_WAIT; with none, no
 * timer exists at all (an idle tunnel never wakes up), nor its spare. lwIP's retransmissions,
 * delayed ACKs and TIME_WAIT's end all wait on this one timer: one libevent has no memory to
 * arm takes the spare's place (core/evspare.h), so the pcbs keep their timer whenever a spare
 * was held. Without one it is not taken as armed: every later call tries again, and one comes
 * with the next batch from the TUN, accept, session end or stream operation (a connection
 * that waits on lwIP's retransmission meanwhile is bounded by its relay's idle timeout). */
static void check_timer(struct lwip_stack *st)
{
	int ret;

	if (!tcp_active_pcbs && !tcp_tw_pcbs) {
		evspare_release(&st->tmr_spare);
		return;
	}
	if (st->tmr_armed)
		return;
	struct timeval tv = { .tv_sec = 0, .tv_usec = TCP_TMR_INTERVAL * 1000 };
	ret = evspare_add(&st->tmr_spare, st->tmr_ev, &tv);
	st->tmr_armed = ret >= 0;
	if (ret == EVSPARE_SPENT)
		ctr_inc(&st->ctr.timer_spare_used);
	else if (ret < 0)
		ctr_inc(&st->ctr.timer_unarmed);
}

/* lwIP's slow timer asserts that a connection whose persist timer runs has nothing in flight
 * and something unsent: the persist timer probes a shut window for the next segment. lwIP 2.1
 * stops it only where tcp_output sends, and an ACK can empty the queues without a send: a
 * retransmission timeout moves the segments in flight back to unsent, the shut window keeps
 * them there and starts the persist timer, and an ACK of those segments (they had arrived, only
 * their ACK was late) frees them from unsent. The next tcp_slowtmr aborted the process. Before
 * each tick, a persist timer that has nothing to probe for, or a retransmission timer that
 * covers the data in flight, stops. One walk over the active pcbs, as tcp_fasttmr makes one
 * every tick itself. */
static void stop_stale_persist(void)
{
	for (struct tcp_pcb *pcb = tcp_active_pcbs; pcb; pcb = pcb->next)
		if (pcb->persist_backoff && (!pcb->unsent || pcb->unacked))
			pcb->persist_backoff = 0;
}

static void on_tmr(evutil_socket_t fd, short what, void *arg)
{
	struct lwip_stack *st = arg;
	(void)fd;
	(void)what;
	st->tmr_armed = false;
	stop_stale_persist();
	tcp_tmr();
	check_timer(st);
	/* The last pcb is gone: give lwIP's freed windows and segments back to the system (glibc
	 * keeps freed heap otherwise, and an idle proxy would sit at its peak RSS). Once per
	 * busy-to-idle transition, never on a timer of its own. (Also when the timer could not be
	 * armed again: memory back is the right answer to that too.) */
	if (!st->tmr_armed) {
		lwip_glue_trim();
		rss_heap_trim();
	} else if (lwip_glue_trim_unused(LWIP_CACHE_IDLE_TICKS)) {
		/* Pcbs remain, but the kept receive blocks went unused for a second (a download after
		 * an upload receives only ACKs): give them, and the heap they leave free, back. */
		rss_heap_trim();
	}
}

static void pcbs_changed(void *arg)
{
	check_timer(arg);
}

void lwip_stack_tick(struct netstack *ns)
{
	stop_stale_persist();
	tcp_tmr();
	check_timer(as_lw(ns));
}

/* ---- hooks: any destination ----------------------------------------------------------------- */

/* Called by ip4_input/ip6_input for the packet we are feeding (st->cur); the stack is the
 * input netif's state (netif_add). Make the netif own the destination (written directly:
 * netif_set_ipaddr would abort pcbs bound to the old address), and for a pure SYN point the
 * catch-all listener at the destination port. Returns 0: lwIP goes on (tcp_listen_input copies
 * port and ip_current_dest_addr() into the new pcb). */
static int hook(struct pbuf *p, struct netif *inp)
{
	struct lwip_stack *st = inp ? inp->state : NULL;
	const struct pkt_view *v;

	if (!st || !(v = st->cur)) {
		pbuf_free(p);
		return 1; /* not a packet we parsed: consume it */
	}
	if (v->family == 4) {
		memcpy(ip_2_ip4(&inp->ip_addr), pkt_dst(v), 4);
	} else {
		ip6_addr_t *a = ip_2_ip6(&inp->ip6_addr[0]);
		memcpy(a->addr, pkt_dst(v), 16);
		ip6_addr_assign_zone(a, IP6_UNICAST, inp);
	}
	if ((v->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_SYN && st->listener)
		st->listener->local_port = ntohs(v->dport_be);
	return 0;
}

/* The options of a segment lwIP is about to parse (tcp_parseopt), with strip_mss:
 * - RFC 9293, 3.7.1: an MSS option is sent only in a SYN. lwIP's tcp_parseopt takes one from
 *   any segment and would shrink the connection's MSS below segments it has already queued,
 *   which its next tcp_write asserts against: one ACK from the app would abort the process. A
 *   SYN repeated while the handshake is open is parsed the same way, without the cap to the
 *   MTU lwIP's listener gives the first SYN's (tcp_eff_send_mss): one announcing more than the
 *   MTU allows made every segment too big to send. Only the SYN a listener takes sets the MSS:
 *   elsewhere (strip_mss) the option's bytes become NOPs.
 * - Always: an option kind (not EOL or NOP) that is the last byte of the options has no length
 *   byte. tcp_parseopt reads the byte after the options as its length, past the end of a
 *   segment without payload. It becomes EOL: lwIP stops there, as at a malformed length.
 * The segment's checksum was verified before; nothing checks it again. Returns whether an MSS
 * option was made NOPs. */
static bool tidy_options(struct tcp_hdr *hdr, uint16_t optlen, uint16_t opt1len, uint8_t *opt2,
			 bool strip_mss)
{
	uint8_t *o1 = (uint8_t *)(hdr + 1);
	bool found = false;

#define OPT(i) ((i) < opt1len ? &o1[(i)] : &opt2[(i) - opt1len])
	for (uint16_t i = 0; i < optlen;) {
		uint8_t kind = *OPT(i), l;

		if (kind == LWIP_TCP_OPT_EOL)
			break;
		if (kind == LWIP_TCP_OPT_NOP) {
			i++;
			continue;
		}
		if (i + 1 >= optlen) {
			*OPT(i) = LWIP_TCP_OPT_EOL; /* no room for its length */
			break;
		}
		if ((l = *OPT(i + 1)) < 2 || i + l > optlen)
			break; /* malformed: lwIP stops parsing there too */
		if (kind == LWIP_TCP_OPT_MSS && strip_mss) {
			for (uint16_t k = 0; k < l; k++)
				*OPT(i + k) = LWIP_TCP_OPT_NOP;
			found = true;
		}
		i = (uint16_t)(i + l);
	}
#undef OPT
	return found;
}

/* The hook gets no netif, and the pcb's callback arg is its stream, not the stack: the stack is
 * the state of the netif tcp_input is serving, which ip4_input/ip6_input record for it. */
/* Whether a segment (len payload bytes after hdr) is out of order and reaches past the right
 * edge of pcb's receive window. lwIP queues such a segment untrimmed (the first one queued out
 * of order, or a longer one with the sequence number of one queued), and once the gap before it
 * fills, its receive path asserts that the window holds the segment: the process aborts. A
 * sender that keeps to the window never sends one (the window announced is never larger than
 * rcv_wnd, whose right edge never moves back); lwIP trims an in-order segment itself. */
static bool past_window(const struct tcp_pcb *pcb, const struct tcp_hdr *hdr, uint16_t len)
{
	uint32_t seq = hdr->seqno; /* host order here: tcp_input converted it */
	uint32_t end = seq + len + ((TCPH_FLAGS(hdr) & (TCP_FIN | TCP_SYN)) ? 1 : 0);

	return TCP_SEQ_GT(seq, pcb->rcv_nxt) && TCP_SEQ_GT(end, pcb->rcv_nxt + pcb->rcv_wnd);
}

int ts_lwip_tcp_inpacket(struct tcp_pcb *pcb, struct tcp_hdr *hdr, uint16_t optlen,
			 uint16_t opt1len, uint8_t *opt2, uint16_t len)
{
	struct netif *inp = ip_current_input_netif();
	struct lwip_stack *st = inp ? inp->state : NULL;

	if (optlen &&
	    tidy_options(hdr, optlen, opt1len, opt2,
			 !(TCPH_FLAGS(hdr) & TCP_SYN) || pcb->state != LISTEN) &&
	    st)
		ctr_inc(&st->ctr.mss_option_ignored);
	/* Listening and TIME_WAIT pcbs get here too: only a pcb that takes data is touched (a
	 * listen pcb has no flags, nrtx or mss field). */
	if (!st || pcb->state == LISTEN || pcb->state == TIME_WAIT)
		return ERR_OK;
	if (past_window(pcb, hdr, len)) {
		ctr_inc(&st->ctr.drop_past_window);
		return ERR_VAL; /* lwIP frees it */
	}
	if (st->bigseg) {
		if (lwip_bigseg_input(pcb))
			ctr_inc(&st->ctr.big_to_wire);
		lwip_bigseg_watch(pcb);
	}
	if (st->cur_gso &&
	    (pcb->state == ESTABLISHED || pcb->state == FIN_WAIT_1 || pcb->state == FIN_WAIT_2)) {
		if (!st->ack_ev || !lwip_ackq_note(pcb)) {
			tcp_ack_now(pcb);
			ctr_inc(&st->ctr.gso_acks_at_once);
		} else {
			lwip_ackq_hold(pcb);
		}
		ctr_inc(&st->ctr.gso_quick_acks);
	}
	return ERR_OK;
}

/* The one lwIP stack is the default netif's state (netif_start); none between stacks. */
void ts_lwip_tcp_out(struct tcp_pcb *pcb, struct tcp_hdr *hdr, const struct pbuf *p)
{
	struct lwip_stack *st = netif_default ? netif_default->state : NULL;

	lwip_stream_push(pcb, hdr, p);
	if (pcb && st && st->ack_ev && lwip_ackq_pending())
		lwip_ackq_sent(pcb);

	if (lwip_split_fin_repair(pcb, hdr) && st)
		ctr_inc(&st->ctr.split_fin_moved);
	if (st && st->bigseg) {
		st->out_wire = lwip_bigseg_wire(pcb);
		if (st->out_wire && lwip_bigseg_announce(pcb, hdr, st->out_wire))
			ctr_inc(&st->ctr.big_window_edges);
	}
}

/* The pass's flush (on_ack_flush) runs once the callbacks active now have run. */
static void ack_flush_due(struct lwip_stack *st)
{
	if (!st->ack_armed) {
		event_active(st->ack_ev, EV_TIMEOUT, 1);
		st->ack_armed = true;
	}
}

/* tcp_recved's test for an explicit window update (it has just moved rcv_ann_wnd with
 * tcp_update_rcv_ann_wnd). Growth under TS_LWIP_WND_UPDATE sends nothing either way. An update
 * that would go is held for the end of the loop pass when the stack has one (lwip_ackq.h): the
 * pcb is noted, the pass's flush made due, and tcp_recved told to send nothing now. Without
 * the flush (no offload, the queue full, no stack) it goes at once, as lwIP would send it. */
unsigned ts_lwip_wnd_update_threshold(struct tcp_pcb *pcb)
{
	struct lwip_stack *st = netif_default ? netif_default->state : NULL;
	u32_t edge = pcb->rcv_nxt + pcb->rcv_wnd;

	if (!TCP_SEQ_GEQ(edge, pcb->rcv_ann_right_edge + TS_LWIP_WND_UPDATE(pcb)) || !st ||
	    !st->ack_ev || !lwip_ackq_announces(pcb) || !lwip_ackq_note(pcb))
		return TS_LWIP_WND_UPDATE(pcb);
	ack_flush_due(st);
	ctr_inc(&st->ctr.wnd_updates_held);
	return UINT_MAX;
}

/* lwIP picks an ISN in tcp_listen_input, inside our input: the stack is the input netif's
 * state. Outside input (tcp_connect, which this stack never calls) there is no key to use: a
 * random ISN is just as unpredictable. */
uint32_t ts_lwip_tcp_isn(const ip_addr_t *local_ip, uint16_t local_port,
			 const ip_addr_t *remote_ip, uint16_t remote_port)
{
	struct netif *inp = ip_current_input_netif();
	const struct lwip_stack *st = inp ? inp->state : NULL;

	if (!st)
		return lwip_isn_rand32();
	if (IP_IS_V6(local_ip))
		return lwip_isn_get(&st->isn, 6, (const uint8_t *)ip_2_ip6(local_ip)->addr,
				    local_port, (const uint8_t *)ip_2_ip6(remote_ip)->addr,
				    remote_port, st->now_ns);
	return lwip_isn_get(&st->isn, 4, (const uint8_t *)&ip_2_ip4(local_ip)->addr, local_port,
			    (const uint8_t *)&ip_2_ip4(remote_ip)->addr, remote_port, st->now_ns);
}

int ts_lwip_ip4_hook(struct pbuf *p, struct netif *inp)
{
	return hook(p, inp);
}

int ts_lwip_ip6_hook(struct pbuf *p, struct netif *inp)
{
	return hook(p, inp);
}

/* ---- output --------------------------------------------------------------------------------- */

static err_t output(struct netif *n, struct pbuf *p)
{
	struct lwip_stack *st = n->state;
	uint8_t *data = p->payload; /* the train may fill in its TCP checksum */
	uint16_t wire = st->out_wire;

	st->out_wire = 0;
	if (p->tot_len > (wire ? st->txbuf_size : st->mtu)) {
		ctr_inc(&st->ctr.drop_too_big);
		return ERR_IF;
	}
	if (p->next) { /* a chain (headers + referenced data): one linear packet for the TUN */
		pbuf_copy_partial(p, st->txbuf, p->tot_len, 0);
		data = st->txbuf;
	}
	ctr_inc(&st->ctr.tx_packets);
	if (st->train) {
		if (!p->next && st->env.tx_lend) /* the frame is the pbuf's own memory */
			st->out_p = p;
		gso_train_add_big(st->train, data, p->tot_len, wire);
		st->out_p = NULL;
		if ((gso_train_pending(st->train) || st->lent) && !st->flush_armed) {
			/* Runs after the callbacks already active in this loop pass. */
			event_active(st->flush_ev, EV_TIMEOUT, 1);
			st->flush_armed = true;
		}
		return ERR_OK;
	}
	st->env.tx(st->env.tx_arg, data, p->tot_len);
	return ERR_OK; /* a dropped write is counted by the driver; TCP retransmits */
}

/* A lent pbuf is PBUF_RAM (train_emit): its struct and data are one block of lwIP's allocator,
 * starting at the struct (mem_malloc adds no header without MEM_STATS). */
_Static_assert(!(LWIP_STATS && MEM_STATS), "a PBUF_RAM pbuf starts its allocator block");

/* The driver is done with a lent pbuf: the reference goes back. Lost (core/driver.h): the
 * kernel may still read it, so the reference is kept for good — lwIP never frees the pbuf,
 * nor retransmits from it (it skips a segment whose pbuf is referenced elsewhere) — and its
 * block stays allocated, its charge abandoned. */
static void lent_release(void *arg, bool lost)
{
	struct pbuf *p = arg;

	if (lost) {
		assert(pbuf_match_allocsrc(p, PBUF_TYPE_ALLOC_SRC_MASK_STD_HEAP));
		lwip_glue_abandon(p);
		return;
	}
	pbuf_free(p);
}

/* A small frame comes back; lost, it stays lent for good and its block is never freed. */
static void small_release(void *arg, bool lost)
{
	struct small_frame *f = arg;

	if (lost) {
		f->st->small_lost = true;
		return;
	}
	f->st->small_free |= 1u << (f - f->st->small);
}

/* A super-packet cut from the segment's own pbuf is lent: the reference keeps its memory (and
 * lwIP, seeing the pbuf in use, does not retransmit from it) until the driver has written it.
 * Only a PBUF_RAM one, a single block of lwIP's allocator that a lost write can abandon whole.
 * Everything else — the train's own buffer, linearised chains — is written now. */
static void train_emit(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	struct lwip_stack *st = arg;
	struct pbuf *p = st->out_p;

	if (p && pkt == p->payload && m->gso_type != PKT_GSO_NONE &&
	    pbuf_match_allocsrc(p, PBUF_TYPE_ALLOC_SRC_MASK_STD_HEAP)) {
		pbuf_ref(p);
		st->lent = true;
		ctr_inc(&st->ctr.big_lent);
		st->env.tx_lend(st->env.tx_arg, pkt, len, m, lent_release, p);
		return;
	}
	if (st->env.tx_lend && m->gso_type == PKT_GSO_NONE && len <= SMALL_FRAME_BYTES &&
	    st->small_free) {
		struct small_frame *f = &st->small[__builtin_ctz(st->small_free)];

		st->small_free &= ~(1u << (f - st->small));
		memcpy(f->bytes, pkt, len);
		st->lent = true;
		ctr_inc(&st->ctr.small_lent);
		st->env.tx_lend(st->env.tx_arg, f->bytes, len, m, small_release, f);
		return;
	}
	st->env.tx_meta(st->env.tx_arg, pkt, len, m);
}

/* Lent frames out now: before the loop sleeps. */
static void lent_flush(struct lwip_stack *st)
{
	if (st->lent) {
		st->lent = false;
		st->env.tx_flush(st->env.tx_arg);
	}
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
	struct lwip_stack *st = arg;
	(void)fd;
	(void)what;
	st->flush_armed = false;
	gso_train_flush(st->train);
	lent_flush(st);
}

static err_t output4(struct netif *n, struct pbuf *p, const ip4_addr_t *dst)
{
	(void)dst;
	return output(n, p);
}

static err_t output6(struct netif *n, struct pbuf *p, const ip6_addr_t *dst)
{
	(void)dst;
	return output(n, p);
}

/* netif_add's init: n->state is already the stack. */
static err_t netif_setup(struct netif *n)
{
	const struct lwip_stack *st = n->state;

	n->name[0] = 't';
	n->name[1] = 's';
	n->output = output4;
	n->output_ip6 = output6;
	n->mtu = (u16_t)st->mtu;
	n->flags = NETIF_FLAG_LINK_UP | NETIF_FLAG_UP;
	return ERR_OK;
}

/* ---- sessions ------------------------------------------------------------------------------- */

static void session_end(void *arg)
{
	struct lwip_stack *st = arg;
	budget_tcp_release(st->env.budget);
	check_timer(st);
}

void lwip_stack_session_end(struct netstack *ns)
{
	session_end(as_lw(ns));
}

/* On the loop, outside lwIP's call stack: hand queued accepted connections to the dispatcher
 * (which may abort the stream at once, e.g. a reject route: never inside an lwIP callback). */
static void on_accepted(evutil_socket_t fd, short what, void *arg)
{
	struct lwip_stack *st = arg;
	struct pending *q = st->pending;

	(void)fd;
	(void)what;
	st->pending = NULL;
	st->pending_tail = &st->pending;
	while (q) {
		struct pending *next = q->next;
		ctr_inc(&st->ctr.accepted);
		if (st->accept_hook)
			st->accept_hook(st->accept_arg, &q->key, q->s);
		else
			dispatcher_start_tcp(st->env.dispatcher, &q->key, q->s, session_end, st);
		free(q);
		q = next;
	}
	check_timer(st);
}

/* Inside tcp_input. Refusals abort the new pcb (a RST to the app) and return ERR_ABRT, as lwIP
 * requires after tcp_abort in a callback. */
static err_t on_accept(void *arg, struct tcp_pcb *pcb, err_t err)
{
	struct lwip_stack *st = arg;
	struct lwip_stream_hooks h = { .pcbs_changed = pcbs_changed, .arg = st,
				       .write_nomem = &st->ctr.write_nomem, .share = &st->share,
				       .window_splits = &st->ctr.big_window_splits };
	struct pending *q;

	if (err != ERR_OK || !pcb) {
		/* lwIP found no memory for the SYN's new pcb and drops it: the app retransmits. */
		ctr_inc(&st->ctr.drop_nomem);
		return ERR_VAL;
	}
	tcp_backlog_accepted(pcb);
	lwip_halfopen_accepted(st->halfopen, pcb);
	if (budget_tcp_acquire(st->env.budget) != 0) {
		ctr_inc(&st->ctr.admission_refused);
		tcp_abort(pcb);
		return ERR_ABRT;
	}
	q = calloc(1, sizeof(*q));
	if (!q || lwip_stream_new(st->env.base, pcb, &h, &q->s) != 0) {
		free(q);
		budget_tcp_release(st->env.budget);
		ctr_inc(&st->ctr.session_setup_failed);
		tcp_abort(pcb);
		return ERR_ABRT;
	}
	/* The accepted pcb's local address and port are the original destination. */
	lwip_halfopen_key(pcb, &q->key);
	/* lwIP sets the first cwnd from pcb->mss right after this callback returns. */
	if (st->bigseg && lwip_bigseg_start(pcb, (uint16_t)(st->mtu - (IP_IS_V6(&pcb->remote_ip)
									 ? 60 : 40))))
		ctr_inc(&st->ctr.big_conns);
	*st->pending_tail = q;
	st->pending_tail = &q->next;
	event_active(st->accept_ev, EV_TIMEOUT, 0);
	return ERR_OK;
}

/* ---- input ------------------------------------------------------------------------------------ */

static enum driver_verdict drop(ctr_t *c)
{
	ctr_inc(c);
	return DRIVER_DONE;
}

/* Copy the segment into p. IPv6 extension headers (already walked and accepted by our parser)
 * are left out, so lwIP never re-parses them and never answers one with an ICMPv6 error. */
static void copy_segment(const struct pkt_view *v, struct pbuf *p)
{
	uint8_t *d = p->payload;

	if (v->family == 6 && v->l3_len != 40) {
		memcpy(d, v->ip, 40);
		d[4] = (uint8_t)(v->l4_len >> 8);
		d[5] = (uint8_t)v->l4_len;
		d[6] = IPPROTO_TCP;
		memcpy(d + 40, v->l4, v->l4_len);
		return;
	}
	memcpy(d, v->ip, v->len);
}

static void ctl_free(struct pbuf *p)
{
	struct lwip_stack *st =
		(struct lwip_stack *)((char *)p - offsetof(struct lwip_stack, ctl.pbuf));

	st->ctl_busy = false;
}

/* The stack's own buffer as a pbuf of len bytes; NULL while lwIP still holds it. */
static struct pbuf *ctl_pbuf(struct lwip_stack *st, uint32_t len)
{
	struct pbuf *p;

	if (st->ctl_busy || len > sizeof(st->ctl_buf))
		return NULL;
	st->ctl.custom_free_function = ctl_free;
	p = pbuf_alloced_custom(PBUF_RAW, (u16_t)len, PBUF_REF, &st->ctl, st->ctl_buf,
				sizeof(st->ctl_buf));
	st->ctl_busy = p != NULL;
	return p;
}

/* The checksums lwIP would have verified (IPv4 header, TCP), for a segment we are about to
 * rewrite (the rewrite gets fresh ones). */
static bool sums_ok(const struct pkt_view *v)
{
	uint64_t s;

	if (v->family == 4 && csum_fold(csum_partial(v->ip, v->l3_len, 0)) != 0xffff)
		return false;
	s = v->family == 4 ? csum_pseudo4(pkt_src(v), pkt_dst(v), IPPROTO_TCP, v->l4_len)
			   : csum_pseudo6(pkt_src(v), pkt_dst(v), IPPROTO_TCP, v->l4_len);
	return csum_fold(csum_partial(v->l4, v->l4_len, s)) == 0xffff;
}

/* Write v's headers without its payload and FIN (they come back with the app's retransmission)
 * into p, with valid lengths and checksums: what lwIP learns from it is the acknowledgement,
 * the window and RST. IPv6 extension headers are left out, as copy_segment does. */
static void strip_segment(const struct pkt_view *v, struct pbuf *p)
{
	uint8_t *d = p->payload;
	uint16_t l3 = v->family == 6 ? 40 : v->l3_len, hl = v->tcp_hlen;
	uint8_t *t = d + l3;
	uint64_t s;

	memcpy(d, v->ip, l3);
	memcpy(t, v->l4, hl);
	t[TCP_OFF_FLAGS] &= (uint8_t) ~(TCP_FIN | TCP_PSH);
	memset(t + TCP_OFF_CSUM, 0, 2);
	if (v->family == 4) {
		pkt_put16(d + 2, (uint16_t)(l3 + hl));
		memset(d + 10, 0, 2);
		csum_store16(d + 10, csum_buf(d, l3));
		s = csum_pseudo4(d + 12, d + 16, IPPROTO_TCP, hl);
	} else {
		pkt_put16(d + 4, hl);
		d[6] = IPPROTO_TCP;
		s = csum_pseudo6(d + 8, d + 24, IPPROTO_TCP, hl);
	}
	csum_store16(t + TCP_OFF_CSUM, (uint16_t)~csum_fold(csum_partial(t, hl, s)));
}

/* The streams' shared send buffers (struct lwip_sendshare): a sixteenth of the budget's buffer
 * bytes, at most 4 MiB (16 senders get the full TCP_SND_BUF each, 64 get 64 KiB each; half
 * of that cost the 64-stream download CPU per byte: shares of 32 KiB refill 16 KiB at a
 * time), and never under one sender's minimum. The minimum each stream may queue beyond the
 * pool is small: it only keeps a stream with nothing in flight from waiting for room (64
 * streams at the minimum hold 1 MiB beside the pool). */
#define SEND_POOL_MAX (4u << 20)
#define SEND_POOL_DIV 16u
#define SEND_MIN_BYTES (16u << 10)

static size_t send_pool(const struct budget *b)
{
	uint64_t pool = b ? budget_get_limits(b)->buffer_bytes / SEND_POOL_DIV : SEND_POOL_MAX;

	if (pool > SEND_POOL_MAX)
		pool = SEND_POOL_MAX;
	return pool < SEND_MIN_BYTES ? SEND_MIN_BYTES : (size_t)pool;
}

/* Out-of-order segments hold budget while they wait for the one before them. When a payload
 * finds no memory, that one may be the missing segment, and its every retransmission would be
 * refused for the memory the queue behind it holds: the connection (and every other one
 * waiting for the budget) would stall for good. Nothing queued out of order was acknowledged,
 * so letting it go costs its retransmission (one segment a round trip: lwIP sends no SACK).
 * At most once every OOSEQ_FREE_EVERY_NS: a walk over every connection for each refused
 * payload would cost most at the moment of pressure, and a retransmission comes a round trip
 * later anyway. */
#define OOSEQ_FREE_EVERY_NS (10 * 1000000LL)
static void free_ooseq(struct lwip_stack *st)
{
	if (st->ooseq_freed_ns && st->now_ns - st->ooseq_freed_ns < OOSEQ_FREE_EVERY_NS)
		return;
	st->ooseq_freed_ns = st->now_ns ? st->now_ns : 1;
	for (struct tcp_pcb *pcb = tcp_active_pcbs; pcb; pcb = pcb->next)
		if (pcb->ooseq) {
			tcp_free_ooseq(pcb);
			ctr_inc(&st->ctr.ooseq_freed);
		}
}

/* The budget refused the memory for v (len bytes without IPv6 extension headers). A segment
 * that occupies no sequence space (a pure ACK or RST) goes in whole from the stack's own
 * buffer; of any other but a SYN the header goes in, without payload and FIN (the app
 * retransmits them), and the out-of-order queues go (free_ooseq). A connection whose
 * unacknowledged data holds the memory would otherwise never see the acknowledgement that
 * frees it, and lwIP would abort it after its retransmissions. A SYN is refused whole. NULL:
 * dropped, counted. Out of line: rare. */
__attribute__((noinline, cold)) static struct pbuf *
input_refused(struct lwip_stack *st, const struct pkt_view *v, uint32_t len,
	      const struct pkt_meta *meta)
{
	bool bare = v->l4_len == v->tcp_hlen && !(v->tcp_flags & (TCP_SYN | TCP_FIN));
	bool trusted = meta && (meta->flags & (PKT_META_NEEDS_CSUM | PKT_META_DATA_VALID));
	struct pbuf *p;

	if (bare && (p = ctl_pbuf(st, len))) {
		copy_segment(v, p);
		return p;
	}
	if ((v->tcp_flags & TCP_SYN) || bare || !(trusted || sums_ok(v)) ||
	    !(p = ctl_pbuf(st, (uint32_t)(v->family == 6 ? 40 : v->l3_len) + v->tcp_hlen))) {
		ctr_inc(&st->ctr.drop_nomem);
		return NULL;
	}
	strip_segment(v, p);
	ctr_inc(&st->ctr.rx_payload_nomem);
	free_ooseq(st);
	return p;
}

/* A super-packet stays in the driver's read buffer rather than being copied out (env.rx_take):
 * lwIP gets a pbuf over it, kept in the buffer's holder room, whose free gives the buffer back
 * to its allocator, and the driver reads on into a new one. Smaller packets are copied: a read
 * buffer holds up to 64 KiB, and would hold a small segment's few bytes while it waits in a
 * queue. At RX_TAKE_MIN a buffer holds about half its size in packet. */
#define RX_TAKE_MIN (32u << 10)

/* What the stack keeps in a taken buffer's holder room. */
struct rx_held {
	struct pbuf_custom pc; /* first: lwIP's pbuf is its address */
	uint32_t bytes;        /* counted in lwip_glue_rx_held */
};
_Static_assert(sizeof(struct rx_held) <= DRIVER_RXBUF_USER, "it fits the holder room");

static void rxbuf_pbuf_free(struct pbuf *p)
{
	struct driver_rxbuf *b =
		(struct driver_rxbuf *)((char *)p - offsetof(struct driver_rxbuf, user));

	lwip_glue_rx_held(-(int64_t)((struct rx_held *)(void *)b->user.bytes)->bytes);
	b->free(b);
}

/* v's packet (len bytes, all of it) in its read buffer, or NULL: copy it. */
static struct pbuf *input_taken(struct lwip_stack *st, const struct pkt_view *v, uint32_t len)
{
	struct driver_rxbuf *b = st->env.rx_take(st->env.tx_arg, v->ip);
	struct rx_held *h;
	struct pbuf *p;

	if (!b)
		return NULL; /* the copy asks the budget again and takes the refusal's path */
	h = (struct rx_held *)(void *)b->user.bytes;
	h->pc.custom_free_function = rxbuf_pbuf_free;
	h->bytes = len;
	/* Cannot fail: the memory given is exactly the packet's length (and the buffer, the
	 * stack's now, must not be left unfreed). */
	p = pbuf_alloced_custom(PBUF_RAW, (u16_t)len, PBUF_REF, &h->pc, (void *)v->ip, (u16_t)len);
	assert(p);
	lwip_glue_rx_held(len);
	ctr_inc(&st->ctr.rx_taken);
	return p;
}

/* The pbuf lwIP gets for v (len bytes without IPv6 extension headers); NULL: dropped, counted. */
static struct pbuf *input_pbuf(struct lwip_stack *st, const struct pkt_view *v, uint32_t len,
			       const struct pkt_meta *meta)
{
	struct pbuf *p;

	if (len >= RX_TAKE_MIN && st->env.rx_take && len == v->len &&
	    (p = input_taken(st, v, len)))
		return p;
	if (!(p = pbuf_alloc(PBUF_RAW, (u16_t)len, PBUF_RAM)))
		return input_refused(st, v, len, meta);
	copy_segment(v, p);
	return p;
}

/* Only TCP the policy let in reaches lwIP: in a pbuf (input_pbuf: a copy, or the read buffer
 * itself; lwIP may keep it: out-of-order queue) fed to ip_input, which calls our hook, then
 * tcp_input. */
/* lwIP counts half-open connections (SYN_RCVD) against the listener's backlog (255 by default)
 * and drops every SYN while it is full: 255 spoofed SYNs, which never complete, would lock
 * every application out until they time out (lwIP's TCP_SYN_RCVD_TIMEOUT, 20 s). When a SYN
 * finds the backlog full, the older half of the evictable half-open connections goes, without
 * a RST (their sources may be spoofed). Older is opened earlier: the index of the held
 * handshakes (lwip_halfopen.h) lists them in the order lwIP opened them, so a scan costs the
 * backlog, not a walk of lwIP's active pcbs (every established connection; lwIP also moves a
 * pcb to that list's front at each segment, so its order is not the handshakes' age). A real
 * handshake completes within a round trip on this hop; even at 20,000 spoofed SYNs a second
 * from many sources a new connection keeps its place for about 255 SYNs (about 12 ms), and one
 * scan serves 128 SYNs.
 * Evictable: a handshake open SYN_RCVD_STALE_NS, or one open SYN_RCVD_YOUNG_NS whose source
 * address has fewer than SYN_RCVD_HOST_MAX of the backlog. Everything behind a TUN comes from a
 * handful of addresses, and one application may open hundreds of connections together: their
 * SYNs arrive in a few reads of the TUN and their ACKs only after all of them, and every client
 * already holds its SYN-ACK, so an evicted one would take the RST to its ACK for a broken
 * connection. Such a burst is left alone and the SYN that finds no room is dropped (counted;
 * its client retransmits it). A flood from spread sources is evicted as before; one from a
 * single source fills the backlog for at most SYN_RCVD_STALE_NS at a time. No SYN scans again
 * before the next half-open connection becomes evictable. A connection's age comes from its
 * ISN (lwip_isn_age_ns).
 * A handshake from the TUN's own address (a local application's: every connection made on
 * this host leaves through the TUN from that address) goes only once stale, like a burst's: a
 * flood from spread sources must not take the local applications' handshakes. Their third ACK
 * can trail the flood's SYNs by far more than a round trip: it waits in the TUN's queue behind
 * them, and on a loaded machine the proxy drains that queue late. A local application's SYN
 * that finds nothing evictable (the flood's SYNs read in one burst are all young) takes the
 * place of the oldest handshake from any other address rather than wait a second for its
 * retransmission. A flood from the own address itself needs a local process that can send raw
 * packets, and fills the backlog for at most SYN_RCVD_STALE_NS, as any single source can.
 * A SYN that repeats a handshake lwIP holds (its client lost the SYN-ACK) needs no room: it
 * evicts nothing and goes to lwIP, which sends the SYN-ACK again. The index of the held
 * handshakes (lwip_halfopen.h) tells one in O(1): asking adds no walk of lwIP's pcbs to a
 * flood's SYNs. */
#define SYN_RCVD_SCAN_MAX 256
#define SYN_RCVD_YOUNG_NS 2000000LL     /* 2 ms: a few of the loop's turns */
#define SYN_RCVD_STALE_NS 3000000000LL  /* 3 s: the client's second SYN retransmission */
#define SYN_RCVD_HOST_MAX 16

static bool backlog_full(const struct lwip_stack *st)
{
	const struct tcp_pcb_listen *l = (const struct tcp_pcb_listen *)st->listener;

	return l->accepts_pending >= l->backlog;
}

/* How long ago pcb's handshake began: lwIP sets lastack to the ISN when it answers the SYN and
 * moves it only once the SYN-ACK is acknowledged. */
static int64_t handshake_age(const struct lwip_stack *st, const struct tcp_pcb *pcb)
{
	if (IP_IS_V6(&pcb->local_ip))
		return lwip_isn_age_ns(&st->isn, 6, (const uint8_t *)ip_2_ip6(&pcb->local_ip)->addr,
				       pcb->local_port,
				       (const uint8_t *)ip_2_ip6(&pcb->remote_ip)->addr,
				       pcb->remote_port, pcb->lastack, st->now_ns);
	return lwip_isn_age_ns(&st->isn, 4, (const uint8_t *)&ip_2_ip4(&pcb->local_ip)->addr,
			       pcb->local_port, (const uint8_t *)&ip_2_ip4(&pcb->remote_ip)->addr,
			       pcb->remote_port, pcb->lastack, st->now_ns);
}

/* A hash of pcb's remote address: the key that counts its source's half-open connections. */
static uint64_t source_key(const struct tcp_pcb *pcb)
{
	uint64_t k = 0, w;

	if (!IP_IS_V6(&pcb->remote_ip))
		return ip_2_ip4(&pcb->remote_ip)->addr;
	for (int i = 0; i < 4; i++) {
		w = ip_2_ip6(&pcb->remote_ip)->addr[i];
		k = (k ^ w) * 0x9e3779b97f4a7c15ULL;
	}
	return k | 1ULL << 63; /* never an IPv4 key */
}

struct syn_rcvd {
	struct tcp_pcb *pcb;
	int64_t age;
	uint64_t src;
	uint32_t order; /* position in the order lwIP opened them: 0 is the newest */
	bool own;       /* from the TUN's own address */
};

/* Whether addr (4 or 16 bytes, network order) is the TUN's own address (a local
 * application's). */
static bool own_address(const struct lwip_stack *st, bool v6, const void *addr)
{
	if (v6)
		return st->has6 && memcmp(addr, st->own6, 16) == 0;
	return memcmp(addr, st->own4, 4) == 0;
}

static bool from_own_address(const struct lwip_stack *st, const struct tcp_pcb *pcb)
{
	if (IP_IS_V6(&pcb->remote_ip))
		return own_address(st, true, ip_2_ip6(&pcb->remote_ip)->addr);
	return own_address(st, false, &ip_2_ip4(&pcb->remote_ip)->addr);
}

static int by_source(const void *a, const void *b)
{
	const struct syn_rcvd *x = a, *y = b;

	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

static int by_order(const void *a, const void *b)
{
	const struct syn_rcvd *x = a, *y = b;

	return (x->order > y->order) - (x->order < y->order);
}

/* Keep in c[0..n) the evictable half-open connections, newest first; returns how many. Sets
 * *wait to how long until the next one of the others becomes evictable. */
static size_t evictable(struct syn_rcvd *c, size_t n, int64_t *wait)
{
	size_t kept = 0;

	qsort(c, n, sizeof(*c), by_source);
	*wait = SYN_RCVD_STALE_NS;
	for (size_t i = 0, run; i < n; i += run) {
		for (run = 1; i + run < n && c[i + run].src == c[i].src; run++)
			;
		for (size_t j = i; j < i + run; j++) {
			int64_t need = run < SYN_RCVD_HOST_MAX && !c[j].own ? SYN_RCVD_YOUNG_NS
									 : SYN_RCVD_STALE_NS;

			if (c[j].age >= need)
				c[kept++] = c[j];
			else if (need - c[j].age < *wait)
				*wait = need - c[j].age;
		}
	}
	qsort(c, kept, sizeof(*c), by_order);
	return kept;
}

static void evict_syn_rcvd(struct lwip_stack *st, bool for_own)
{
	struct syn_rcvd c[SYN_RCVD_SCAN_MAX];
	struct tcp_pcb *held[SYN_RCVD_SCAN_MAX];
	size_t n, k, oldest = SIZE_MAX;
	int64_t wait;

	if (st->now_ns < st->evict_after_ns && !for_own)
		return;
	n = lwip_halfopen_pcbs(st->halfopen, held, SYN_RCVD_SCAN_MAX);
	for (size_t i = 0; i < n; i++) {
		assert(held[i]->state == SYN_RCVD);
		c[i] = (struct syn_rcvd){ held[i], handshake_age(st, held[i]), source_key(held[i]),
					  (uint32_t)i, from_own_address(st, held[i]) };
	}
	if ((k = evictable(c, n, &wait)) > 0) {
		for (size_t i = k / 2; i < k; i++) {
			tcp_abandon(c[i].pcb, 0);
			ctr_inc(&st->ctr.syn_rcvd_evicted);
		}
		return;
	}
	st->evict_after_ns = st->now_ns + wait;
	if (!for_own)
		return;
	/* Nothing is old enough, and the SYN is a local application's: the oldest handshake from
	 * any other address makes room (with nothing evictable, evictable() left all n in c). */
	for (size_t i = 0; i < n; i++)
		if (!c[i].own && (oldest == SIZE_MAX || c[i].order > c[oldest].order))
			oldest = i;
	if (oldest != SIZE_MAX) {
		tcp_abandon(c[oldest].pcb, 0);
		ctr_inc(&st->ctr.syn_rcvd_yielded);
	}
}

/* Is v, a SYN, a repetition of a handshake lwIP holds (its SYN-ACK lost on the way)? */
static bool syn_held(const struct lwip_stack *st, const struct pkt_view *v)
{
	struct flow_key k;

	pkt_flow_key(v, &k);
	return lwip_halfopen_holds(st->halfopen, &k);
}

/* Let go of the handshake lwIP holds that v, a SYN, repeats, if any (lwip_halfopen_abandon). */
static bool syn_abandon(struct lwip_stack *st, const struct pkt_view *v)
{
	struct flow_key k;

	pkt_flow_key(v, &k);
	return lwip_halfopen_abandon(st->halfopen, &k);
}

static enum driver_verdict tcp_in(struct lwip_stack *st, struct pkt_view *v,
				  const struct pkt_meta *meta, size_t *out_len, bool *plain)
{
	struct pbuf *p;
	uint32_t len = v->family == 6 ? 40 + v->l4_len : v->len;
	bool syn = (v->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_SYN;

	/* lwIP's own IPv4 header check is off (csum_ctrl): it dropped without a count. */
	if (v->family == 4 && !pkt_v4_csum_ok(v))
		return drop(&st->ctr.drop_parse[PKT_V4_BAD_CSUM]);
	/* Admission is decided at the SYN, as the system stack's app sees it: lwIP would
	 * complete the handshake before its accept callback could refuse. The permit itself is
	 * taken at accept (a handshake that never completes holds none). A refused SYN that
	 * repeats a handshake lwIP holds ends that handshake for its client (the RST acknowledges
	 * the SYN): lwIP lets go of it too, sending nothing, and its backlog place is free. */
	if (syn && !budget_tcp_would_admit(st->env.budget)) {
		ctr_inc(&st->ctr.admission_refused);
		budget_tcp_count_refusal(st->env.budget);
		if (st->halfopen && syn_abandon(st, v))
			ctr_inc(&st->ctr.syn_rcvd_refused);
		*out_len = rewrite_tcp_rst(v);
		*plain = true;
		return DRIVER_WRITE;
	}
	/* The eviction deadline is of the handshakes a full backlog held: with room, it is of
	 * none of the next ones. A repeated SYN of a handshake lwIP holds needs no room: lwIP
	 * sends that handshake's SYN-ACK again. */
	if (syn && st->listener) {
		if (!backlog_full(st)) {
			st->evict_after_ns = 0;
		} else if (!syn_held(st, v)) {
			evict_syn_rcvd(st, own_address(st, v->family == 6,
							v->ip + (v->family == 6 ? 8 : 12)));
			if (backlog_full(st)) /* lwIP would drop it silently: count it here */
				return drop(&st->ctr.drop_backlog_full);
		}
	}
	/* A super-packet (TUN offload) goes in as one large segment: lwIP accepts it on receive.
	 * pbuf lengths are u16; the kernel's GSO limit keeps a TUN read under 64 KiB unless BIG
	 * TCP was configured on the device. */
	if (len > 0xffff)
		return drop(&st->ctr.drop_input_too_big);
	if (!(p = input_pbuf(st, v, len, meta)))
		return DRIVER_DONE;
	ctr_inc(&st->ctr.to_lwip);
	/* With TUN_F_CSUM the kernel hands over packets whose TCP checksum field holds only
	 * the pseudo-header sum (NEEDS_CSUM), or that it already checked (DATA_VALID): lwIP's
	 * check would reject the first kind. Those skip it; everything else is verified. */
	bool trusted = meta && (meta->flags & (PKT_META_NEEDS_CSUM | PKT_META_DATA_VALID));
	if (trusted) {
		NETIF_SET_CHECKSUM_CTRL(&st->netif, st->csum_ctrl & ~NETIF_CHECKSUM_CHECK_TCP);
		ctr_inc(&st->ctr.csum_trusted);
	}
	st->cur = v;
	st->cur_gso = meta && meta->gso_type != PKT_GSO_NONE;
	if (st->netif.input(p, &st->netif) != ERR_OK)
		pbuf_free(p);
	if (st->bigseg && lwip_bigseg_after_input())
		ctr_inc(&st->ctr.big_window_splits);
	/* A SYN whose SYN-ACK lwIP had no memory to queue: it abandoned the new pcb. Dropped
	 * for want of memory, as a SYN without a pcb is (on_accept); the client retransmits. */
	if (syn && st->halfopen && lwip_halfopen_input_end(st->halfopen))
		ctr_inc(&st->ctr.drop_nomem);
	st->cur = NULL;
	st->cur_gso = false;
	/* Segments without sequence space are never kept (should one ever be, ctl_pbuf
	 * declines the buffer until lwIP frees it). */
	assert(!st->ctl_busy);
	if (trusted)
		NETIF_SET_CHECKSUM_CTRL(&st->netif, st->csum_ctrl);
	return DRIVER_DONE;
}

/* A refused first SYN answered in place (l3policy_answer), or nothing. */
static enum driver_verdict answer(struct lwip_stack *st, const struct pkt_view *v,
				  enum l3policy_verdict vd, size_t *out_len, bool *plain)
{
	switch (l3policy_answer(&st->pol, v, vd)) {
	case L3POLICY_ANSWER_RST:
		*out_len = rewrite_tcp_rst(v);
		break;
	case L3POLICY_ANSWER_UNREACH:
		if (!(*out_len = rewrite_icmp_unreach(v, l3policy_answer_src(&st->pol, v->family))))
			return DRIVER_DONE;
		ctr_inc(&st->ctr.icmp_unreach);
		break;
	default:
		return DRIVER_DONE;
	}
	*plain = true;
	return DRIVER_WRITE;
}

static enum driver_verdict lw_input(struct netstack *ns, unsigned q, uint8_t *buf, size_t len,
				    const struct pkt_meta *meta, int64_t now_ns, size_t *out_len,
				    bool *plain, struct pkt_view *v)
{
	struct lwip_stack *st = as_lw(ns);
	struct l3policy_reply reply;
	enum l3policy_verdict vd;
	enum pkt_reason r;

	(void)q;
	ctr_inc(&st->ctr.rx_packets);
	if ((r = pkt_parse(v, buf, len)) != PKT_OK)
		return drop(&st->ctr.drop_parse[r]);
	switch ((vd = l3policy_classify(&st->pol, v, &reply, &st->ctr.policy))) {
	case L3POLICY_TCP:
		st->now_ns = now_ns;
		return tcp_in(st, v, meta, out_len, plain);
	case L3POLICY_UDP:
	case L3POLICY_DNS:
		/* The UDP path sends the payload on: no stack sees this header. */
		if (v->family == 4 && !pkt_v4_csum_ok(v))
			return drop(&st->ctr.drop_parse[PKT_V4_BAD_CSUM]);
		ctr_inc(&st->ctr.udp);
		return DRIVER_UDP; /* with *v: the UDP path takes the packet as parsed here */
	case L3POLICY_ECHO:
		/* lwIP never answers pings (LWIP_ICMP=0, and it never sees ICMP): the policy's
		 * echo to the gateway is answered here, as the system stack does. */
		ctr_inc(&st->ctr.icmp_echo_reply);
		*out_len = rewrite_icmp_echo_reply(v);
		*plain = true;
		return DRIVER_WRITE;
	case L3POLICY_DROP_loop:
	case L3POLICY_DROP_special_destination:
		/* Our own socket's SYN came back, or a SYN to a special destination: the answer
		 * fails its connect now (counted; l3policy_answer says which get one, and what). */
		return answer(st, v, vd, out_len, plain);
	default:
		/* Dropped and counted by the policy. TCP_REPLY never comes: this stack declares
		 * no listener ports (its listener lives inside lwIP, not behind the TUN). */
		return DRIVER_DONE;
	}
}

/* The end of the loop pass: the ACKs still owed for this pass's super-packets. */
static void on_ack_flush(evutil_socket_t fd, short what, void *arg)
{
	struct lwip_stack *st = arg;

	(void)fd;
	(void)what;
	st->ack_armed = false;
	ctr_add(&st->ctr.gso_acks_pass_end, lwip_ackq_flush());
	if (st->train)
		gso_train_flush(st->train);
	lent_flush(st);
	check_timer(st);
}

static void lw_batch_end(struct netstack *ns, unsigned q, int64_t now_ns)
{
	struct lwip_stack *st = as_lw(ns);

	(void)q; /* one queue: lwIP keeps process-global state */
	(void)now_ns;
	if (st->train)
		gso_train_flush(st->train);
	/* Activated now, after the callbacks this batch's data made active: the relay takes
	 * what it can first, and the ACK carries the window it opened. */
	if (st->ack_ev && lwip_ackq_pending())
		ack_flush_due(st);
	check_timer(st);
}

/* ---- start / stop ----------------------------------------------------------------------------- */

static int netif_start(struct lwip_stack *st)
{
	const struct ts_config *cfg = st->env.cfg;
	ip4_addr_t addr, mask, gw;

	/* Any non-zero address with mask 0: the hook rewrites it per packet anyway. */
	memcpy(&addr.addr, cfg->roles4.gateway.a, 4);
	ip4_addr_set_zero(&mask);
	ip4_addr_set_zero(&gw);
	if (!netif_add(&st->netif, &addr, &mask, &gw, st, netif_setup, ip_input))
		return -ENOMEM;
	NETIF_SET_CHECKSUM_CTRL(&st->netif, st->csum_ctrl);
	netif_set_default(&st->netif);
	netif_set_link_up(&st->netif);
	netif_set_up(&st->netif);
	if (st->has6) {
		ip6_addr_t a;
		memcpy(a.addr, cfg->roles6.gateway.a, 16);
		ip6_addr_assign_zone(&a, IP6_UNICAST, &st->netif);
		netif_ip6_addr_set(&st->netif, 0, &a);
		netif_ip6_addr_set_state(&st->netif, 0, IP6_ADDR_PREFERRED);
	}
	return 0;
}

/* budgets.listen_backlog bounds the connections between the SYN and the accept, as a kernel
 * listener's backlog bounds those the kernel holds for accept(); lwIP counts them in a u8_t. */
static u8_t listen_backlog(const struct budget *b)
{
	uint32_t n = b ? budget_get_limits(b)->listen_backlog : 0xff;

	return (u8_t)(n < 0xff ? n : 0xff);
}

/* The catch-all listener: any address (v4 and v6), its port set per SYN by the hook. */
static int listener_start(struct lwip_stack *st)
{
	struct tcp_pcb *pcb = tcp_new_ip_type(IPADDR_TYPE_ANY);
	uint64_t k0, k1;
	err_t e;

	if (!pcb)
		return -ENOMEM;
	if (tcp_bind(pcb, IP_ANY_TYPE, 0) != ERR_OK) {
		tcp_abort(pcb);
		return -EADDRINUSE;
	}
	st->listener = tcp_listen_with_backlog_and_err(pcb, listen_backlog(st->env.budget), &e);
	if (!st->listener) {
		tcp_abort(pcb);
		return -ENOMEM;
	}
	tcp_arg(st->listener, st);
	tcp_accept(st->listener, on_accept);
	/* Its handshakes under way, as many as its backlog admits (lwIP takes 0 for 1). */
	k0 = (uint64_t)lwip_isn_rand32() << 32 | lwip_isn_rand32();
	k1 = (uint64_t)lwip_isn_rand32() << 32 | lwip_isn_rand32();
	if (lwip_halfopen_new(((struct tcp_pcb_listen *)st->listener)->backlog, k0, k1,
			      &st->halfopen) != 0)
		return -ENOMEM;
	lwip_halfopen_watch(st->halfopen, st->listener);
	return 0;
}

static void lw_free(struct netstack *ns);

/* The policy's roles from the config, as the system stack gets them (sys_stack.c). */
static int policy_init(struct l3policy *pol, const struct netstack_env *env)
{
	const struct ts_config *cfg = env->cfg;
	struct l3policy_config pc = {
		.has4 = cfg->roles4.family == 4,
		.has6 = cfg->tun.has_addr6,
		.n_addrs = cfg->nat.addresses,
		.dns_hijack = cfg->dns.hijack,
		.dns_tcp = env->dns_tcp,
		.loopguard = env->loopguard,
	};

	memcpy(pc.gateway4, cfg->roles4.gateway.a, 4);
	memcpy(pc.gateway6, cfg->roles6.gateway.a, 16);
	return l3policy_init(pol, &pc);
}

static int lw_refused(char *err, size_t errlen)
{
	snprintf(err, errlen, "lwip stack: a second lwIP stack in one process is not possible: lwIP "
		 "keeps its state in globals; use the system stack for more than one proxy per "
		 "process");
	return -EBUSY;
}

static int lw_start(const struct netstack_env *env, struct netstack **out, char *err,
		    size_t errlen)
{
	struct lwip_stack *st;
	int ret = -ENOMEM;

	if (env->cfg->tun.queues > 1) {
		snprintf(err, errlen, "lwip stack: tun.queues must be 1 (lwIP is single-threaded)");
		return -EINVAL;
	}
	/* Before anything else: a refused start touches neither lwIP nor the running stack. */
	if (lwip_glue_claim(env->budget) != 0)
		return lw_refused(err, errlen);
	st = calloc(1, sizeof(*st));
	if (!st) {
		lwip_glue_release();
		snprintf(err, errlen, "lwip stack: start: %s", strerror(ENOMEM));
		return -ENOMEM;
	}
	st->env = *env;
	st->share = (struct lwip_sendshare){ .pool = send_pool(env->budget), .min = SEND_MIN_BYTES };
	st->has6 = env->cfg->tun.has_addr6;
	memcpy(st->own4, env->cfg->tun.addr4.addr.a, sizeof(st->own4));
	if (st->has6)
		memcpy(st->own6, env->cfg->tun.addr6.addr.a, sizeof(st->own6));
	st->pending_tail = &st->pending;
	st->mtu = env->cfg->tun.mtu;
	st->bigseg = env->tx_meta && env->cfg->tun.gso_output && env->cfg->tun.large_segments;
	st->txbuf_size = st->bigseg ? GSO_TRAIN_MAX : st->mtu;
	if ((ret = policy_init(&st->pol, env)) != 0 || (ret = lwip_isn_init(&st->isn)) != 0)
		goto fail;
	ret = -ENOMEM; /* what each failure below is */
	st->txbuf = budget_malloc(env->budget, st->txbuf_size);
	st->tmr_ev = evtimer_new(env->base, on_tmr, st);
	st->accept_ev = event_new(env->base, -1, 0, on_accepted, st);
	if (!st->txbuf || !st->tmr_ev || !st->accept_ev ||
	    evspare_init(&st->tmr_spare, env->base) != 0)
		goto fail;
	if (env->tx_lend) {
		if (!(st->small = calloc(SMALL_FRAMES, sizeof(*st->small))))
			goto fail;
		for (unsigned i = 0; i < SMALL_FRAMES; i++)
			st->small[i].st = st;
		st->small_free = (uint32_t)((1ull << SMALL_FRAMES) - 1);
	}
	/* The IPv4 header checksum is checked before lwIP, where the drop is counted (tcp_in). */
	st->csum_ctrl = NETIF_CHECKSUM_ENABLE_ALL & ~NETIF_CHECKSUM_CHECK_IP;
	if (env->tx_meta && env->cfg->tun.gso_output) {
		if (gso_train_new(env->budget, train_emit, st, &st->train) != 0 ||
		    !(st->flush_ev = event_new(env->base, -1, 0, on_flush, st)))
			goto fail;
		gso_train_fill_csum(st->train, 1);
		st->csum_ctrl &= (u16_t)~NETIF_CHECKSUM_GEN_TCP;
	}
	if (env->tx_meta && !(st->ack_ev = event_new(env->base, -1, 0, on_ack_flush, st)))
		goto fail;
	if ((ret = netif_start(st)) != 0 || (ret = listener_start(st)) != 0)
		goto fail;
	*out = (struct netstack *)st;
	return 0;
fail:
	snprintf(err, errlen, "lwip stack: start: %s", strerror(-ret));
	lw_free((struct netstack *)st);
	return ret;
}

static void lw_stop(struct netstack *ns)
{
	struct lwip_stack *st = as_lw(ns);

	if (st->listener) {
		tcp_arg(st->listener, NULL);
		tcp_accept(st->listener, NULL);
		tcp_close(st->listener);
		st->listener = NULL;
	}
}

/* lwIP has no de-init: abort every remaining pcb (their streams are gone: the dispatcher ended
 * every session before this, and each stream cleared its callbacks) and remove the netif, so a
 * later start in the same process begins clean; then give up the claim on lwIP. */
static void lw_free(struct netstack *ns)
{
	struct lwip_stack *st = as_lw(ns);

	if (!st)
		return;
	lw_stop(ns);
	while (st->pending) {
		struct pending *q = st->pending;
		st->pending = q->next;
		q->s->ops->abort(q->s);
		budget_tcp_release(st->env.budget);
		free(q);
	}
	lwip_ackq_clear();
	while (tcp_active_pcbs)
		tcp_abort(tcp_active_pcbs);
	while (tcp_tw_pcbs)
		tcp_abort(tcp_tw_pcbs);
	lwip_halfopen_free(st->halfopen); /* after its pcbs: their destroy callbacks use it */
	if (st->netif.input)
		netif_remove(&st->netif);
	if (st->tmr_ev)
		event_free(st->tmr_ev);
	evspare_fini(&st->tmr_spare);
	if (st->accept_ev)
		event_free(st->accept_ev);
	if (st->flush_ev)
		event_free(st->flush_ev);
	if (st->ack_ev)
		event_free(st->ack_ev);
	if (st->train) {
		gso_train_flush(st->train); /* the last segments of aborted pcbs: RSTs */
		lent_flush(st); /* the references go back while lwIP is still there */
		gso_train_free(st->train);
	}
	budget_mfree(st->env.budget, st->txbuf);
	if (st->small_lost) /* the kernel may still read a lost frame */
		lsan_leave_allocated(st->small);
	else
		free(st->small);
	free(st);
	lwip_glue_release();
}

void lwip_stack_set_accept_hook(struct netstack *ns, lwip_accept_fn fn, void *arg)
{
	as_lw(ns)->accept_hook = fn;
	as_lw(ns)->accept_arg = arg;
}

/* ---- stats ------------------------------------------------------------------------------------ */

static void lw_stats(struct netstack *ns, struct netstack_stats *o)
{
	struct lwip_stack *st = as_lw(ns);
	const struct lwip_counters *c = &st->ctr;

	memset(o, 0, sizeof(*o));
	netstack_parse_drops(c->drop_parse, o);
	netstack_policy_drops(&c->policy, o);
	o->drops_malformed += ctr_get(&c->drop_input_too_big) + ctr_get(&c->drop_past_window);
	o->drops_half_open = ctr_get(&c->drop_backlog_full);
	o->drops_no_memory = ctr_get(&c->drop_nomem);
	o->admission_refused = ctr_get(&c->admission_refused);
	o->accepted = ctr_get(&c->accepted);
	o->stack_bytes = lwip_glue_mem_bytes() + lwip_glue_rx_held_bytes();
}

static void lw_counters(struct netstack *ns,
			void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
	struct lwip_stack *st = as_lw(ns);
	char name[64];
#define LWIP_CTR_VISIT(n) fn(arg, #n, ctr_get(&st->ctr.n));
	LWIP_COUNTERS(LWIP_CTR_VISIT)
#undef LWIP_CTR_VISIT
	l3policy_counters_foreach(&st->ctr.policy, fn, arg);
	for (int r = 1; r < PKT_REASON_MAX; r++) {
		snprintf(name, sizeof(name), "drop_parse_%s", pkt_reason_name((enum pkt_reason)r));
		fn(arg, name, ctr_get(&st->ctr.drop_parse[r]));
	}
	if (st->train) {
		const struct gso_stats *g = gso_train_stats(st->train);
		fn(arg, "gso_trains", ctr_get(&g->trains));
		fn(arg, "gso_train_segments", ctr_get(&g->train_segments));
		fn(arg, "gso_singles", ctr_get(&g->singles));
		fn(arg, "gso_csum_filled", ctr_get(&g->csum_filled));
		fn(arg, "gso_big_packets", ctr_get(&g->big_packets));
		fn(arg, "gso_big_segments", ctr_get(&g->big_segments));
	}
}

static void lw_levels(struct netstack *ns,
		      void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
	(void)ns;
	fn(arg, "lwip_mem_bytes", lwip_glue_mem_bytes());
	fn(arg, "lwip_mem_cached_bytes", lwip_glue_cached_bytes());
	fn(arg, "lwip_rx_held_bytes", lwip_glue_rx_held_bytes());
}

/* Checked before the proxy opens its TUN, so a refused second proxy changes nothing (the start
 * itself claims lwIP atomically: two proxies starting at once still get one refusal). */
static int lw_precheck(char *err, size_t errlen)
{
	return lwip_glue_claimed() ? lw_refused(err, errlen) : 0;
}

const struct netstack_ops lwip_stack_ops = {
	.name = "lwip",
	.precheck = lw_precheck,
	.start = lw_start,
	.stop = lw_stop,
	.free = lw_free,
	.input = lw_input,
	.batch_end = lw_batch_end,
	.stats = lw_stats,
	.counters = lw_counters,
	.levels = lw_levels,
};
