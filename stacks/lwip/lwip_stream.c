/* lwip_stream.c — a struct stream over an lwIP tcp_pcb (contracts in lwip_stream.h).
 *
 * lwIP's callbacks record state and activate one libevent event; the owner's callbacks run from
 * that event. The receive queue is a list of the pbufs lwIP handed over, linked through ->next
 * like one pbuf chain, but without maintaining tot_len (a u16: the queue holds up to TCP_WND =
 * 256 KiB); consumed pbufs are unlinked and freed one by one, the way lwIP's own
 * pbuf_free_header() does. Every length handed to lwIP is chunked to u16 (tcp_write, tcp_recved
 * and pbuf lengths are u16_t).
 */
#include "stacks/lwip/lwip_stream.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/gso.h"
#include "dispatch/stream.h"
#include "stacks/lwip/lwip_bigseg.h"

#include "lwip/def.h"
#include "lwip/pbuf.h"
#include "lwip/prot/tcp.h"
#include "lwip/tcp.h"
#include "lwip_hooks.h"

/* Writable fires once this much send buffer is free (send_lowat). */
#define SEND_LOWAT (16u << 10)

struct lwip_stream {
	struct stream s;            /* first: struct stream * converts to struct lwip_stream * */
	struct tcp_pcb *pcb;        /* NULL once lwIP freed it (err callback) or we released it */
	struct event *ev;           /* deferred notifications, one per stream */
	struct lwip_stream_hooks hooks;
	struct pbuf *head, *tail;   /* received, not yet read; tail is the last pbuf */
	size_t off;                 /* bytes of head already copied out */
	size_t queued;              /* unread bytes in the queue */
	size_t lowat;               /* readable needs this many queued bytes (or EOF/error) */
	int err;                    /* -errno lwIP reported; read/write return it */
	bool err_told;              /* the error callback ran */
	bool eof;                   /* the peer's FIN arrived (it follows the queued bytes) */
	bool wr_shut;               /* shutdown_write done */
	bool wr_blocked;            /* write() found no room: wait for tcp_sent */
	bool renotify;              /* the next iteration's notification could not be timed */
	bool sending;               /* counted in hooks.share->senders: bytes queued in lwIP */
	size_t in_share;            /* bytes of this stream counted in hooks.share->queued */
	bool want_rd, want_wr;
	bool *gone;                 /* while on_notify runs: set when the stream is freed */
};

static struct lwip_stream *ls_of(struct stream *s)
{
	return (struct lwip_stream *)s;
}

static void pcbs_changed(const struct lwip_stream *ls)
{
	if (ls->hooks.pcbs_changed)
		ls->hooks.pcbs_changed(ls->hooks.arg);
}

/* ---- the receive queue --------------------------------------------------------------------- */

/* Take ownership of the chain p (its tot_len, <= 64 KiB, is valid on arrival). */
static void queue_append(struct lwip_stream *ls, struct pbuf *p)
{
	struct pbuf *last = p;

	while (last->next)
		last = last->next;
	if (ls->tail)
		ls->tail->next = p; /* the link owns p's reference, as in pbuf_cat */
	else
		ls->head = p;
	ls->tail = last;
	ls->queued += p->tot_len;
}

/* Unlink and free the head pbuf: its ->next link's reference passes to ls->head. */
static void queue_pop(struct lwip_stream *ls)
{
	struct pbuf *q = ls->head;

	ls->head = q->next;
	if (!ls->head)
		ls->tail = NULL;
	ls->off = 0;
	q->next = NULL;
	pbuf_free(q);
}

static void queue_drop(struct lwip_stream *ls)
{
	while (ls->head)
		queue_pop(ls);
	ls->queued = 0;
}

/* Copy up to n queued bytes into buf (NULL: only take them), freeing what is consumed.
 * Returns the bytes taken. */
static size_t queue_take(struct lwip_stream *ls, uint8_t *buf, size_t n)
{
	size_t done = 0;

	while (done < n && ls->head) {
		struct pbuf *q = ls->head;
		size_t c = q->len - ls->off; /* zero-length pbufs in a chain are just popped */

		if (c > n - done)
			c = n - done;
		if (buf)
			memcpy(buf + done, (const uint8_t *)q->payload + ls->off, c);
		done += c;
		ls->off += c;
		if (ls->off == q->len)
			queue_pop(ls);
	}
	ls->queued -= done;
	return done;
}

/* ---- readiness and notification ----------------------------------------------------------- */

/* read() would return something other than -EAGAIN. */
static bool can_read(const struct lwip_stream *ls)
{
	return ls->queued >= ls->lowat || ls->eof || ls->err;
}

/* ---- the shared send buffers (struct lwip_sendshare) ----------------------------------------- */

size_t lwip_sendshare_room(const struct lwip_sendshare *sh, size_t own, bool sending)
{
	size_t cap = sh->pool / (sh->senders + (sending ? 0 : 1));
	size_t room, free_bytes, floor;

	if (cap < sh->min)
		cap = sh->min;
	room = own < cap ? cap - own : 0;
	free_bytes = sh->pool > sh->queued ? sh->pool - sh->queued : 0;
	floor = own < sh->min ? sh->min - own : 0;
	if (room > free_bytes)
		room = free_bytes > floor ? free_bytes : floor;
	return room;
}

/* Bytes write() may still queue: the free send buffer, capped by this stream's share. snd_buf
 * is read directly: tcp_sndbuf() caps at 0xFFFF. */
static size_t send_room(const struct lwip_stream *ls)
{
	size_t room = ls->pcb->snd_buf, share;

	if (!ls->hooks.share)
		return room;
	share = lwip_sendshare_room(ls->hooks.share, (size_t)TCP_SND_BUF - room, ls->sending);
	return room < share ? room : share;
}

/* Keep ls->in_share (and the share's queued bytes) equal to what lwIP holds of this stream,
 * and ls->sending (and the senders count) true to whether that is anything. */
static void share_update(struct lwip_stream *ls)
{
	struct lwip_sendshare *sh = ls->hooks.share;
	size_t now = ls->pcb ? (size_t)TCP_SND_BUF - ls->pcb->snd_buf : 0;

	if (!sh)
		return;
	sh->queued = sh->queued - ls->in_share + now;
	ls->in_share = now;
	if ((now > 0) == ls->sending)
		return;
	ls->sending = now > 0;
	if (ls->sending)
		sh->senders++;
	else
		sh->senders--;
}

/* The stream stops counting (its pcb is gone or handed to lwIP). */
static void share_leave(struct lwip_stream *ls)
{
	struct lwip_sendshare *sh = ls->hooks.share;

	if (!sh)
		return;
	sh->queued -= ls->in_share;
	ls->in_share = 0;
	if (ls->sending) {
		ls->sending = false;
		sh->senders--;
	}
}

/* The room writable waits for: SEND_LOWAT, or the stream's floor in the shared send buffers
 * if that is less (with nothing queued the room is at least min(TCP_SND_BUF, that floor), so
 * writable always comes once the queue drains). */
static size_t send_lowat(const struct lwip_stream *ls)
{
	const struct lwip_sendshare *sh = ls->hooks.share;

	return sh && sh->min < SEND_LOWAT ? sh->min : SEND_LOWAT;
}

/* write() would accept at least the low-water room, or fail. Not one byte: a writer woken
 * for every acknowledged segment would queue (and a relay read) a segment at a time. */
static bool can_write(const struct lwip_stream *ls)
{
	if (ls->err || !ls->pcb || ls->wr_shut)
		return true;
	return !ls->wr_blocked && send_room(ls) >= send_lowat(ls) &&
	       ls->pcb->snd_queuelen < TCP_SND_QUEUELEN && lwip_bigseg_can_write(ls->pcb);
}

static bool due(const struct lwip_stream *ls)
{
	const struct stream *s = &ls->s;

	return (ls->err && !ls->err_told && s->cb.error) ||
	       (ls->want_rd && s->cb.readable && can_read(ls)) ||
	       (ls->want_wr && s->cb.writable && can_write(ls));
}

/* From lwIP callbacks and ops: run on_notify from the loop, in this iteration's active pass
 * (never inside the caller). While on_notify itself runs, it re-checks when the owner returns. */
static void notify(struct lwip_stream *ls, short what)
{
	if (!ls->gone && due(ls))
		event_active(ls->ev, what, 0);
}

/* Each owner callback may free the stream: `gone` (on this stack frame) says so. */
static void on_notify(evutil_socket_t fd, short what, void *arg)
{
	static const struct timeval next_iteration = { 0, 0 };
	struct lwip_stream *ls = arg;
	struct stream *s = &ls->s;
	bool gone = false;

	ls->gone = &gone;
	if (ls->err && !ls->err_told && s->cb.error) {
		ls->err_told = true;
		s->cb.error(s->cb_arg, ls->err);
		if (gone)
			return;
	}
	if (ls->want_rd && s->cb.readable && can_read(ls)) {
		s->cb.readable(s->cb_arg);
		if (gone)
			return;
	}
	if (ls->want_wr && s->cb.writable && can_write(ls)) {
		s->cb.writable(s->cb_arg);
		if (gone)
			return;
	}
	ls->gone = NULL;
	/* Level-triggered, but at most once per loop iteration: a zero timeout runs after the
	 * next poll, so TUN input and other streams get their turn first. Without memory for it
	 * (libevent's timer heap), a stream with a pcb hears again from lwIP's poll (on_poll);
	 * without a pcb, what is due is finite (the error once, the queue to its end, writes
	 * that fail at once), and it runs again in this pass. */
	if (due(ls) && event_add(ls->ev, &next_iteration) != 0) {
		if (ls->pcb)
			ls->renotify = true;
		else
			event_active(ls->ev, what, 0);
	}
}

/* ---- the pcb -------------------------------------------------------------------------------- */

/* After this lwIP never calls into the stream again. */
static void detach(struct tcp_pcb *pcb)
{
	tcp_arg(pcb, NULL);
	tcp_recv(pcb, NULL);
	tcp_sent(pcb, NULL);
	tcp_err(pcb, NULL);
	tcp_poll(pcb, NULL, 0);
}

/* Tell lwIP that n more bytes were taken. tcp_recved takes a u16. */
static void recved(struct tcp_pcb *pcb, size_t n)
{
	while (n > 0) {
		u16_t c = n > 0xFFFF ? 0xFFFF : (u16_t)n;

		tcp_recved(pcb, c);
		n -= c;
	}
}

/* Both FINs are exchanged (eof and wr_shut): hand the pcb to lwIP for the rest of the close
 * handshake. Needed because lwIP frees a TIME_WAIT pcb silently, with no callback (tcp_slowtmr
 * after 2 * TCP_MSL, tcp_kill_timewait), so no stream may hold one. The peer sends nothing
 * more: the unread queue stays ours to read, and counting it as taken makes tcp_close see a
 * full window (no RST) even in CLOSE_WAIT (a FIN that tcp_shutdown could only mark pending).
 * In CLOSING, LAST_ACK and TIME_WAIT tcp_close only marks the pcb closed, never frees it nor
 * fails: safe inside lwIP's callbacks too. */
static void release(struct lwip_stream *ls)
{
	struct tcp_pcb *pcb = ls->pcb;

	detach(pcb);
	recved(pcb, ls->queued);
	(void)tcp_close(pcb); /* always ERR_OK in these states (a FIN it cannot send is pended) */
	ls->pcb = NULL;
	share_leave(ls);
}

/* ---- lwIP callbacks (inside tcp_input / tcp_tmr: record and defer only) --------------------- */

static int errno_of(err_t e)
{
	switch (e) {
	case ERR_RST:
		return -ECONNRESET;
	case ERR_ABRT:
		return -ECONNABORTED;
	case ERR_MEM:
	case ERR_BUF:
		return -ENOBUFS;
	case ERR_CONN:
	case ERR_CLSD:
		return -ENOTCONN;
	default:
		return -EIO;
	}
}

static err_t on_recv(void *arg, struct tcp_pcb *pcb, struct pbuf *p, err_t err)
{
	struct lwip_stream *ls = arg;

	/* close/abort clear the callbacks before releasing the pcb: never called after. */
	assert(ls && ls->pcb == pcb);
	if (err != ERR_OK || ls->err) {
		/* lwIP 2.1.3 always passes ERR_OK; anything else is a failure of the pcb. */
		if (p)
			pbuf_free(p);
		if (!ls->err)
			ls->err = errno_of(err);
		queue_drop(ls);
		notify(ls, EV_READ | EV_WRITE);
		return ERR_OK;
	}
	if (p) {
		queue_append(ls, p); /* no tcp_recved here: the window opens in read() */
	} else {
		ls->eof = true;
		if (ls->wr_shut)
			release(ls); /* CLOSING or TIME_WAIT now */
	}
	notify(ls, EV_READ);
	return ERR_OK; /* never refused: lwIP keeps no refused_data for us */
}

/* lwIP's poll (every TCP_SLOW_INTERVAL): a write refused for memory is retried from here when no
 * acknowledgement (on_sent) came first, e.g. with nothing in flight to be acknowledged; and a
 * notification the loop could not time (on_notify) is given again. */
static err_t on_poll(void *arg, struct tcp_pcb *pcb)
{
	struct lwip_stream *ls = arg;

	assert(ls && ls->pcb == pcb);
	if (ls->wr_blocked) {
		ls->wr_blocked = false;
		notify(ls, EV_WRITE);
	}
	if (ls->renotify) {
		ls->renotify = false;
		notify(ls, EV_READ | EV_WRITE);
	}
	return ERR_OK;
}

static err_t on_sent(void *arg, struct tcp_pcb *pcb, u16_t len)
{
	struct lwip_stream *ls = arg;

	assert(ls && ls->pcb == pcb);
	ls->wr_blocked = false;
	lwip_bigseg_progress(pcb);
	share_update(ls);
	notify(ls, EV_WRITE);
	return ERR_OK;
}

/* lwIP has already freed the pcb. */
static void on_err(void *arg, err_t err)
{
	struct lwip_stream *ls = arg;

	assert(ls && ls->pcb);
	ls->pcb = NULL;
	share_leave(ls);
	if (err == ERR_CLSD) {
		/* LAST_ACK completed on a pcb we still held: a clean end, not an error. release()
		 * hands the pcb over before that, so this is only a safety net. */
		ls->eof = true;
		notify(ls, EV_READ | EV_WRITE);
		return;
	}
	ls->err = errno_of(err);
	queue_drop(ls);
	notify(ls, EV_READ | EV_WRITE);
}

/* ---- ops ------------------------------------------------------------------------------------ */

/* The owner takes up to n queued bytes (copied into buf; NULL: not copied): they leave the
 * queue and lwIP's window opens by as many. Returns the bytes taken. */
static size_t take(struct lwip_stream *ls, uint8_t *buf, size_t n)
{
	size_t got = queue_take(ls, buf, n);

	if (got && ls->pcb) {
		recved(ls->pcb, got); /* the window opens only as the owner takes bytes */
		pcbs_changed(ls);     /* a delayed window update needs lwIP's timer */
	}
	return got;
}

static ssize_t ls_read(struct stream *s, void *buf, size_t n)
{
	struct lwip_stream *ls = ls_of(s);

	if (ls->err)
		return ls->err;
	if (ls->queued == 0)
		return ls->eof ? 0 : -EAGAIN;
	return (ssize_t)take(ls, buf, n);
}

/* One tcp_write of up to c bytes, halving on ERR_MEM while that may help: the segment queue
 * (TCP_SND_QUEUELEN) can refuse a 64 KiB chunk yet take an MSS. Returns bytes queued or err. */
static err_t write_chunk(struct tcp_pcb *pcb, const uint8_t *buf, u16_t c, u8_t more,
			 u16_t *queued)
{
	err_t e;

	for (;;) {
		e = tcp_write(pcb, buf, c, TCP_WRITE_FLAG_COPY | more);
		if (e != ERR_MEM || c <= TCP_MSS)
			break;
		c /= 2;
		more = 0; /* memory is short: no room beyond the bytes (ts_lwip_oversize) */
	}
	*queued = e == ERR_OK ? c : 0;
	return e;
}

/* Will some of n more bytes wait in lwIP's unsent queue after tcp_output? Bytes already wait
 * there, or those in flight and the n would pass the window lwIP may fill (the smaller of the
 * peer's window and the congestion window). Then the next write extends the last segment:
 * lwIP copies into the room that segment's pbuf was given (TCP_OVERSIZE), and past that room
 * chains a new pbuf onto it, and a chain goes to the TUN copied into one buffer instead of
 * lent from its own memory. Such writes are made with TCP_WRITE_FLAG_MORE, for which lwIP
 * asks ts_lwip_oversize how much room to give a new segment. The flag also leaves PSH off the
 * segment; lwip_stream_push puts it back on the one that goes out with the last byte. */
static bool held_back(const struct tcp_pcb *pcb, size_t n)
{
	tcpwnd_size_t wnd = pcb->snd_wnd < pcb->cwnd ? pcb->snd_wnd : pcb->cwnd;
	u32_t in_flight = pcb->snd_nxt - pcb->lastack;

	return pcb->unsent != NULL || (uint64_t)in_flight + n > wnd;
}

/* The room of a whole segment (lwIP caps what this returns at the size it cuts at) where the
 * new segment will surely wait behind others: the window is shut, or a whole segment's bytes
 * already wait unsent before it (they go first, and only whole). The writes after it then
 * fill it in place. Elsewhere lwIP's own rule, TCP_OVERSIZE bytes beyond the data: a segment
 * given a whole segment's room and then sent short (the window opened before the next write)
 * would hold that memory for a few bytes until acknowledged. */
unsigned ts_lwip_oversize(const struct tcp_pcb *pcb, unsigned length)
{
	if (pcb->snd_wnd == 0 || (u32_t)(pcb->snd_lbb - pcb->snd_nxt) >= pcb->mss)
		return 0xFFFFu;
	return length + TCP_OVERSIZE;
}

void lwip_stream_push(const struct tcp_pcb *pcb, struct tcp_hdr *hdr, const struct pbuf *p)
{
	u16_t hl = TCPH_HDRLEN_BYTES(hdr);

	if (!pcb || !p || p->tot_len <= hl || (TCPH_FLAGS(hdr) & TCP_PSH))
		return;
	if (lwip_ntohl(hdr->seqno) + (u32_t)(p->tot_len - hl) == pcb->snd_lbb)
		TCPH_SET_FLAG(hdr, TCP_PSH);
}

/* Queue up to n bytes, never more than the free send buffer; u16 chunks (tcp_write's len). */
static ssize_t ls_write(struct stream *s, const void *buf, size_t n)
{
	struct lwip_stream *ls = ls_of(s);
	struct tcp_pcb *pcb = ls->pcb;
	size_t room, done = 0;
	err_t e = ERR_OK;
	u8_t more;

	if (ls->err)
		return ls->err;
	if (ls->wr_shut || !pcb)
		return -EPIPE;
	room = send_room(ls);
	if (n > room)
		n = room;
	lwip_bigseg_progress(pcb);
	if (n > 0 && !lwip_bigseg_write_begin(pcb)) {
		ls->wr_blocked = true; /* tcp_sent: the last large segment went */
		return -EAGAIN;
	}
	more = held_back(pcb, n) ? TCP_WRITE_FLAG_MORE : 0;
	while (done < n) {
		size_t left = n - done;
		u16_t c = left > 0xFFFF ? 0xFFFF : (u16_t)left, got;

		e = write_chunk(pcb, (const uint8_t *)buf + done, c,
				left > c ? TCP_WRITE_FLAG_MORE : more, &got);
		done += got;
		if (e != ERR_OK || got < c)
			break;
	}
	if (n > 0)
		lwip_bigseg_write_end(pcb);
	if (done > 0) {
		share_update(ls);
		tcp_output(pcb); /* a failure here is retried by lwIP's timer */
		if (lwip_bigseg_fit(pcb) && ls->hooks.window_splits)
			ctr_inc(ls->hooks.window_splits);
		pcbs_changed(ls);
		return (ssize_t)done;
	}
	if (e != ERR_OK && e != ERR_MEM)
		return errno_of(e);
	/* Nothing fit: tcp_sent makes us writable again, or on_poll with nothing in flight. */
	if (e == ERR_MEM && ls->hooks.write_nomem)
		ctr_inc(ls->hooks.write_nomem);
	ls->wr_blocked = true;
	return -EAGAIN;
}

static int ls_shutdown_write(struct stream *s)
{
	struct lwip_stream *ls = ls_of(s);
	err_t e;

	if (ls->err)
		return ls->err;
	if (ls->wr_shut)
		return 0;
	if (!ls->pcb)
		return -ENOTCONN;
	e = tcp_shutdown(ls->pcb, 0, 1);
	if (e != ERR_OK)
		return errno_of(e);
	ls->wr_shut = true;
	if (ls->eof)
		release(ls); /* LAST_ACK (or CLOSE_WAIT with the FIN pending) */
	pcbs_changed(ls); /* the FIN is retransmitted by lwIP's timer */
	return 0;
}

static void ls_set_interest(struct stream *s, bool read, bool write)
{
	struct lwip_stream *ls = ls_of(s);

	ls->want_rd = read;
	ls->want_wr = write;
	notify(ls, (read ? EV_READ : 0) | (write ? EV_WRITE : 0));
}

static int ls_fd(const struct stream *s)
{
	return -1;
}

static void destroy(struct lwip_stream *ls)
{
	share_leave(ls);
	queue_drop(ls);
	event_free(ls->ev); /* also when pending or running: libevent allows it */
	if (ls->gone)
		*ls->gone = true;
	free(ls);
}

static void ls_abort(struct stream *s)
{
	struct lwip_stream *ls = ls_of(s);

	if (ls->pcb) {
		detach(ls->pcb);
		tcp_abort(ls->pcb); /* RST; frees the pcb */
		ls->pcb = NULL;
		pcbs_changed(ls);
	}
	destroy(ls);
}

static void ls_close(struct stream *s)
{
	struct lwip_stream *ls = ls_of(s);

	if (ls->pcb) {
		detach(ls->pcb);
		/* FIN after the accepted bytes; lwIP owns the pcb from here. lwIP 2.1.3 pends a FIN
		 * it cannot allocate and returns ERR_OK; should it ever fail, the peer gets a RST
		 * rather than a pcb nobody will ever close. */
		if (tcp_close(ls->pcb) != ERR_OK)
			tcp_abort(ls->pcb);
		ls->pcb = NULL;
		pcbs_changed(ls);
	}
	destroy(ls);
}

/* Our bytes or FIN still in the pcb's queues (lwIP keeps a segment until it is acknowledged;
 * a FIN set on the last data segment adds nothing to snd_lbb, hence the floor of 1). A pcb
 * handed back after both FINs is lwIP's to finish: 0. */
static ssize_t ls_unacked(const struct stream *s)
{
	const struct lwip_stream *ls = (const struct lwip_stream *)s;
	const struct tcp_pcb *pcb = ls->pcb;
	u32_t n;

	if (ls->err)
		return ls->err;
	if (!pcb || (!pcb->unsent && !pcb->unacked))
		return 0;
	n = pcb->snd_lbb - pcb->lastack;
	return n > 0 ? (ssize_t)n : 1;
}

/* Room for whole segments only, at most the payload of one GSO train (an IPv6 packet with a
 * plain TCP header, GSO_TRAIN_MAX bytes in all): the relay reads no more than write_room, so
 * each write ends on a segment boundary. A write that ends inside a segment sends that
 * segment short, and a short segment ends its train: 64 KiB from a relay buffer made a train
 * of 45 full segments and a packet of its own for the 736 bytes left, one more TUN write (and
 * one more wake-up of the receiving application) per 64 KiB. Room under one segment is
 * returned as it is. */
static size_t whole_segments(const struct tcp_pcb *pcb, size_t room)
{
	size_t mss = pcb->mss, max;

	if (mss == 0 || room < mss)
		return room;
	/* an IPv6 header (40 bytes) and a TCP header without options (20) */
	max = (GSO_TRAIN_MAX - 40 - 20) / mss * mss;
	if (max == 0)
		return room; /* a segment larger than a train: nothing to align to */
	if (room > max)
		room = max;
	return room - room % mss;
}

/* What write() would take now, in whole segments (whole_segments); 0 exactly when writable
 * would not fire. A write that would fail is not limited (SIZE_MAX): it reports its error
 * itself. */
static size_t ls_write_room(const struct stream *s)
{
	const struct lwip_stream *ls = (const struct lwip_stream *)s;

	if (ls->err || !ls->pcb || ls->wr_shut)
		return SIZE_MAX;
	return can_write(ls) ? whole_segments(ls->pcb, send_room(ls)) : 0;
}

/* Copy up to n queued bytes without taking them (no window update: nothing was read). */
static ssize_t ls_peek(struct stream *s, void *buf, size_t n)
{
	struct lwip_stream *ls = ls_of(s);
	size_t done = 0, off = ls->off;

	if (ls->err)
		return ls->err;
	if (ls->queued == 0)
		return ls->eof ? 0 : -EAGAIN;
	for (const struct pbuf *q = ls->head; q && done < n; q = q->next, off = 0) {
		size_t c = q->len - off;

		if (c > n - done)
			c = n - done;
		memcpy((uint8_t *)buf + done, (const uint8_t *)q->payload + off, c);
		done += c;
	}
	return (ssize_t)done;
}

/* Views of the queued pbufs' payloads (no window update: nothing was taken). */
static ssize_t ls_peekv(struct stream *s, struct iovec *iov, int *cnt, size_t n)
{
	struct lwip_stream *ls = ls_of(s);
	size_t done = 0, off = ls->off;
	int k = 0;

	assert(n > 0 && *cnt > 0);
	if (ls->err)
		return ls->err;
	if (ls->queued == 0)
		return ls->eof ? 0 : -EAGAIN;
	for (const struct pbuf *q = ls->head; q && done < n && k < *cnt; q = q->next, off = 0) {
		size_t c = q->len - off;

		if (c == 0)
			continue; /* a zero-length pbuf of a chain */
		if (c > n - done)
			c = n - done;
		iov[k].iov_base = (uint8_t *)q->payload + off;
		iov[k].iov_len = c;
		k++;
		done += c;
	}
	*cnt = k;
	return (ssize_t)done;
}

/* Take n peeked bytes: as ls_read, without the copy. */
static void ls_skip(struct stream *s, size_t n)
{
	size_t got = take(ls_of(s), NULL, n);

	assert(got == n); /* no more than peekv lent */
	(void)got;
}

static void ls_set_lowat(struct stream *s, size_t lowat)
{
	struct lwip_stream *ls = ls_of(s);

	ls->lowat = lowat ? lowat : 1;
	notify(ls, EV_READ); /* a lower level may make queued bytes readable now */
}

static const struct stream_ops lwip_ops = {
	.read = ls_read,
	.write = ls_write,
	.shutdown_write = ls_shutdown_write,
	.set_interest = ls_set_interest,
	.fd = ls_fd,
	.abort = ls_abort,
	.close = ls_close,
	.unacked = ls_unacked,
	.peek = ls_peek,
	.set_lowat = ls_set_lowat,
	.write_room = ls_write_room,
	.peekv = ls_peekv,
	.skip = ls_skip,
};

int lwip_stream_new(struct event_base *base, struct tcp_pcb *pcb,
		    const struct lwip_stream_hooks *h, struct stream **out)
{
	struct lwip_stream *ls;

	if (out)
		*out = NULL;
	if (!base || !pcb || !out)
		return -EINVAL;
	ls = calloc(1, sizeof(*ls));
	if (!ls)
		return -ENOMEM;
	ls->ev = event_new(base, -1, 0, on_notify, ls);
	if (!ls->ev) {
		free(ls);
		return -ENOMEM;
	}
	ls->s.ops = &lwip_ops;
	ls->lowat = 1;
	ls->pcb = pcb;
	if (h)
		ls->hooks = *h;
	tcp_arg(pcb, ls);
	tcp_recv(pcb, on_recv);
	tcp_sent(pcb, on_sent);
	tcp_err(pcb, on_err);
	tcp_poll(pcb, on_poll, 1);
	tcp_nagle_disable(pcb);
	*out = &ls->s;
	return 0;
}
