/* lwip_stream.h — the stream interface (dispatch/stream.h) over an lwIP raw-API tcp_pcb.
 *
 * The lwIP stack wraps every accepted pcb in one of these and hands it to the dispatcher; the
 * relay then drives it like a non-blocking socket that has no fd (fd() is -1: copy relay).
 *
 * Contracts, beyond those of dispatch/stream.h:
 *  - Loop thread only, like lwIP itself (NO_SYS=1: lwIP runs inside the stack's input and
 *    timer callbacks on the same event loop).
 *  - Deferred notification: lwIP's recv/sent/err callbacks run inside tcp_input()/tcp_tmr();
 *    they only record state and activate the stream's one libevent event. The owner's
 *    readable/writable/error callbacks run from that event, outside lwIP's call stack, so an
 *    owner may close or abort from them without the ERR_ABRT dance (and never does it inside
 *    tcp_input). The stream's lwIP callbacks always return ERR_OK.
 *  - Level-triggered: after an owner callback returns, a condition that still holds fires again
 *    on the next loop iteration (a zero timeout), never within the same one.
 *  - error fires at most once, whenever lwIP reports a failure (independent of interest, as
 *    soon as callbacks are set): RST from the peer -> -ECONNRESET; lwIP gave up on the pcb
 *    (retransmission timeout, memory) -> -ECONNABORTED; anything else -> -EIO. lwIP has freed
 *    the pcb by then: the stream never touches it again; queued bytes are dropped and
 *    read()/write() return the error. The owner still calls close() or abort(), which then
 *    only frees.
 *  - Once both FINs are exchanged (the peer's FIN arrived and shutdown_write succeeded), the
 *    stream hands the pcb back to lwIP at once (callbacks cleared, tcp_close: no RST in these
 *    states) and lwIP finishes the close on its own: lwIP frees TIME_WAIT pcbs without any
 *    callback, so a stream must never hold one. read() still returns the queued bytes, then 0;
 *    write() returns -EPIPE; no error fires (a clean end is not an error).
 *  - Receive flow control: received pbufs are queued as lwIP hands them over (never refused,
 *    so lwIP never retains refused_data); tcp_recved() is called only in read() and skip(),
 *    for exactly the bytes copied out or taken. lwIP's receive window therefore opens only as the owner takes data,
 *    and the queue (lwIP memory, counted by the budget) never exceeds the window.
 *  - Send flow control: write() accepts at most the pcb's free send buffer (pcb->snd_buf, up to
 *    TCP_SND_BUF) and what the segment queue (TCP_SND_QUEUELEN) takes, copied into lwIP
 *    (TCP_WRITE_FLAG_COPY), in u16 chunks. -EAGAIN when nothing fits; writable fires when lwIP
 *    reports acknowledged data (tcp_sent). When lwIP has no memory (the budget refused it),
 *    write() is -EAGAIN too, never an error: the owner stops reading the other side
 *    (back-pressure) and writable fires on the next acknowledgement or, with nothing in
 *    flight to be acknowledged, on lwIP's poll (tcp_poll, every 500 ms), to try again.
 *  - shutdown_write() sends FIN after the accepted bytes (tcp_shutdown(pcb, 0, 1)); receiving
 *    goes on (half-close).
 *  - close(): tcp_close (FIN after every accepted byte; lwIP keeps sending what is unacked after
 *    the stream is gone). Bytes still queued unread mean the peer's data was not consumed:
 *    lwIP then answers with RST, as a kernel socket closed with unread data does. abort():
 *    RST (tcp_abort). Both clear the pcb's arg and callbacks first, so lwIP never calls into a
 *    freed stream, and both free the stream (and its queued pbufs).
 *  - Nagle is off (TF_NODELAY): lwIP implements classic RFC 896 Nagle (hold any sub-MSS segment
 *    while anything is unacknowledged), so the sub-MSS tail of every relay write (a response's
 *    last bytes) would wait for the app's possibly delayed ACK; the system stack's kernel
 *    sockets use Linux's Minshall variant, which sends that tail at once. Bulk transfers still
 *    go out in full segments: the relay writes whole buffers.
 */
#ifndef TS_STACKS_LWIP_LWIP_STREAM_H
#define TS_STACKS_LWIP_LWIP_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"

struct event_base;
struct stream;
struct tcp_pcb;

/* The send buffers all streams of one stack share. lwIP gives every pcb TCP_SND_BUF of send
 * buffer, which one stream needs to fill a fast path; many streams at once would hold that
 * many times over (64 downloads: 16 MiB of copies waiting in lwIP) for no more throughput, as
 * the TUN path's round trip is short. So a stream with unsent or unacknowledged bytes is a
 * sender, and write() caps a sender's queued bytes at pool / senders (nor over TCP_SND_BUF),
 * and all streams' queued bytes together at pool: a stream that came first with few senders
 * keeps its larger share only while the others leave the pool room. A stream may always
 * queue up to min whatever the others hold, so that none waits for room that only its own
 * acknowledgements could free (it may have nothing in flight): the streams hold at most
 * pool + streams * min together. Loop thread only, like lwIP. */
struct lwip_sendshare {
	size_t pool;      /* bytes all senders may queue in lwIP together */
	size_t min;       /* each stream may queue at least this much */
	size_t queued;    /* bytes the streams have queued in lwIP now */
	uint32_t senders; /* streams with bytes queued in lwIP */
};

/* The bytes a stream with own bytes queued in lwIP may add now, by the shares of sh alone
 * (the pcb's free send buffer is the caller's to apply). sending: the stream is counted in
 * sh->senders. Pure. */
size_t lwip_sendshare_room(const struct lwip_sendshare *sh, size_t own, bool sending);

/* What the stream tells its stack. pcbs_changed runs after every op that may need lwIP's
 * timers or change pcb lists (read or skip that opened the window, write, shutdown_write,
 * close, abort), never from inside an lwIP callback, so the stack can (re)arm tcp_tmr. */
struct lwip_stream_hooks {
	void (*pcbs_changed)(void *arg); /* may be NULL */
	void *arg;
	ctr_t *write_nomem; /* counts writes lwIP refused for lack of memory; may be NULL */
	ctr_t *window_splits; /* counts large segments cut to a small window (lwip_bigseg_fit) */
	struct lwip_sendshare *share; /* the stack's shared send buffers; NULL: TCP_SND_BUF each */
};

/* Wrap pcb (an established, accepted pcb; may be called from inside lwIP's accept callback).
 * Sets tcp_arg/tcp_recv/tcp_sent/tcp_err and TF_NODELAY. h is copied (may be NULL). On success
 * the stream owns pcb: close()/abort() release it. On failure (-EINVAL, -ENOMEM) nothing was
 * registered with the pcb and the caller still owns it. No callback fires before
 * stream_set_callbacks (and, for readable/writable, set_interest). */
int lwip_stream_new(struct event_base *base, struct tcp_pcb *pcb,
		    const struct lwip_stream_hooks *h, struct stream **out)
	__attribute__((warn_unused_result));

/* A data segment about to go out (lwIP's output hook; p starts at the TCP header hdr and holds
 * the payload): if it carries the last byte written to pcb so far, PSH is set on it, as lwIP
 * sets it on a write's last segment. A write made with "more to come" (its bytes had to wait)
 * has none, and some receivers deliver to the application only on PSH or a full buffer. pcb
 * and p may be NULL (nothing is done). */
struct pbuf;
struct tcp_hdr;
void lwip_stream_push(const struct tcp_pcb *pcb, struct tcp_hdr *hdr, const struct pbuf *p);

#endif
