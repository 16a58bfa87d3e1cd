/* lwip_bigseg.c — large lwIP segments for the kernel to cut (see lwip_bigseg.h).
 *
 * A connection's state lives in its pcb's extension argument, packed into the pointer (no
 * allocation, nothing to free with the pcb): the wire MSS in the low 16 bits, the mode above. A
 * pcb lwIP created zeroes it: mode NONE, never large. */
#include "stacks/lwip/lwip_bigseg.h"

#include <stddef.h>

#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"

enum mode {
	MODE_NONE = 0,  /* never large: wire-size segments only */
	MODE_BIG = 1,   /* pcb->mss is big(wire); writes are cut at it */
	MODE_DRAIN = 2, /* a retransmission happened: writes are cut at the wire MSS, pcb->mss
			 * stays big while a large segment is queued */
	MODE_WIRE = 3,  /* back to pcb->mss = wire */
};

/* One slot for the process: lwIP's ids are never given back, and every lwIP owner of this
 * process uses the same one. */
static uint8_t ext_id = LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID;

/* The large-segment pcb the segment now inside tcp_input is for (lwip_bigseg_watch), or NULL.
 * lwIP is one per process (lwip_glue_claim), like ext_id; a pcb lwIP frees meanwhile clears
 * it (ext-arg destroy callback), so lwip_bigseg_after_input never touches a freed pcb. */
static struct tcp_pcb *watched;

static void on_destroyed(u8_t id, void *data)
{
	(void)id;
	(void)data;
	watched = NULL; /* conservative: whichever large-segment pcb went, it may be this one */
}

static const struct tcp_ext_arg_callbacks callbacks = { .destroy = on_destroyed };

void lwip_bigseg_init(void)
{
	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		ext_id = tcp_ext_arg_alloc_id();
}

/* The slot read directly: tcp_ext_arg_get's checks cost more than the rest of a hook call. */
static uintptr_t get(const struct tcp_pcb *pcb)
{
	if (!pcb || ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		return 0;
	return (uintptr_t)pcb->ext_args[ext_id].data;
}

static void set(struct tcp_pcb *pcb, uint16_t wire, enum mode m)
{
	tcp_ext_arg_set(pcb, ext_id, (void *)((uintptr_t)wire | (uintptr_t)m << 16));
}

static enum mode mode_of(uintptr_t v)
{
	return (enum mode)((v >> 16) & 3u);
}

static uint16_t wire_of(uintptr_t v)
{
	return (uint16_t)(v & 0xffffu);
}

/* The largest multiple of the wire MSS within LWIP_BIGSEG_DATA_MAX: every segment of a
 * super-packet but its last is then a full one. */
static uint16_t big_of(uint16_t wire)
{
	return (uint16_t)(wire * (LWIP_BIGSEG_DATA_MAX / wire));
}

bool lwip_bigseg_start(struct tcp_pcb *pcb, uint16_t wire_cap)
{
	uint16_t wire = pcb->mss;

	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		return false;
	if (wire > wire_cap)
		wire = wire_cap;
	if (wire < LWIP_BIGSEG_MIN_WIRE)
		return false;
	set(pcb, wire, MODE_BIG);
	tcp_ext_arg_set_callbacks(pcb, ext_id, &callbacks);
	pcb->mss = big_of(wire);
	return true;
}

uint16_t lwip_bigseg_wire(const struct tcp_pcb *pcb)
{
	uintptr_t v = get(pcb);

	return mode_of(v) == MODE_NONE ? 0 : wire_of(v);
}

bool lwip_bigseg_input(struct tcp_pcb *pcb)
{
	uintptr_t v = get(pcb);

	if (mode_of(v) != MODE_BIG || pcb->nrtx == 0)
		return false;
	set(pcb, wire_of(v), MODE_DRAIN);
	return true;
}

static bool any_longer(const struct tcp_seg *s, uint16_t wire)
{
	for (; s; s = s->next)
		if (s->len > wire)
			return true;
	return false;
}

static const struct tcp_seg *last_unsent(const struct tcp_pcb *pcb)
{
	const struct tcp_seg *last = pcb->unsent;

	while (last && last->next)
		last = last->next;
	return last;
}

/* The last segment's pbuf may have room left beyond what a cut at size allows (TCP_OVERSIZE,
 * sized when segments were cut large): tcp_write asserts the room it is told of fits within
 * the cut. Unused room is only a missed shortcut for lwIP. The last unsent segment is at most
 * size long here. */
static void clamp_oversize(struct tcp_pcb *pcb, uint16_t size)
{
	struct tcp_seg *last = pcb->unsent;

	while (last && last->next)
		last = last->next;
	if (!last || pcb->unsent_oversize <= size - last->len)
		return;
	pcb->unsent_oversize = (u16_t)(size - last->len);
#if TCP_OVERSIZE_DBGCHECK
	last->oversize_left = pcb->unsent_oversize; /* lwIP checks the two agree */
#endif
}

void lwip_bigseg_progress(struct tcp_pcb *pcb)
{
	uintptr_t v = get(pcb);
	uint16_t wire = wire_of(v);

	if (mode_of(v) != MODE_DRAIN || any_longer(pcb->unacked, wire) ||
	    any_longer(pcb->unsent, wire))
		return;
	set(pcb, wire, MODE_WIRE);
	clamp_oversize(pcb, wire);
	pcb->mss = wire;
}

bool lwip_bigseg_can_write(const struct tcp_pcb *pcb)
{
	uintptr_t v = get(pcb);
	const struct tcp_seg *last;

	if (mode_of(v) != MODE_DRAIN)
		return true;
	/* tcp_write appends to the last unsent segment up to the size it cuts at: a longer one
	 * would break its arithmetic (its "mss_local is too small" assertion). */
	last = last_unsent(pcb);
	return !last || last->len <= wire_of(v);
}

bool lwip_bigseg_write_begin(struct tcp_pcb *pcb)
{
	uintptr_t v = get(pcb);
	uint16_t wire = wire_of(v);

	if (mode_of(v) != MODE_DRAIN)
		return true;
	if (!lwip_bigseg_can_write(pcb))
		return false;
	clamp_oversize(pcb, wire);
	pcb->mss = wire;
	return true;
}

void lwip_bigseg_write_end(struct tcp_pcb *pcb)
{
	uintptr_t v = get(pcb);

	if (mode_of(v) == MODE_DRAIN)
		pcb->mss = big_of(wire_of(v));
}

void lwip_bigseg_watch(struct tcp_pcb *pcb)
{
	enum mode m = mode_of(get(pcb));

	watched = m == MODE_BIG || m == MODE_DRAIN ? pcb : NULL;
}

bool lwip_bigseg_fit(struct tcp_pcb *pcb)
{
	uintptr_t v = get(pcb);
	uint16_t wire = wire_of(v);
	tcpwnd_size_t wnd;

	/* Our FIN may be queued (FIN_WAIT_1, CLOSING, LAST_ACK): a split moves it to the rest. */
	if ((mode_of(v) != MODE_BIG && mode_of(v) != MODE_DRAIN) || pcb->unacked ||
	    !pcb->unsent ||
	    (pcb->state != ESTABLISHED && pcb->state != CLOSE_WAIT && pcb->state != FIN_WAIT_1 &&
	     pcb->state != CLOSING && pcb->state != LAST_ACK))
		return false;
	wnd = pcb->snd_wnd < pcb->cwnd ? pcb->snd_wnd : pcb->cwnd;
	/* Nothing in flight, so the head segment starts at lastack. */
	if (pcb->unsent->len <= wnd || wnd < wire)
		return false;
	if (tcp_split_unsent_seg(pcb, (u16_t)(wnd - wnd % wire)) != ERR_OK)
		return false; /* no memory: lwIP's persist timer splits it later */
	tcp_output(pcb);
	return true;
}

bool lwip_bigseg_after_input(void)
{
	struct tcp_pcb *pcb = watched;

	watched = NULL;
	return pcb && lwip_bigseg_fit(pcb);
}

bool lwip_bigseg_announce(struct tcp_pcb *pcb, struct tcp_hdr *hdr, uint16_t wire)
{
	u32_t edge;

	if (!wire || pcb->mss <= wire || (TCPH_FLAGS(hdr) & (TCP_SYN | TCP_RST)))
		return false;
	edge = pcb->rcv_nxt + pcb->rcv_wnd;
	if (!TCP_SEQ_GEQ(edge, pcb->rcv_nxt + pcb->rcv_ann_wnd + wire))
		return false;
	pcb->rcv_ann_wnd = pcb->rcv_wnd;
	pcb->rcv_ann_right_edge = edge;
	hdr->wnd = lwip_htons(TCPWND_MIN16(RCV_WND_SCALE(pcb, pcb->rcv_wnd)));
	return true;
}
