/* lwip_ackq.c — the acknowledgement an offloaded super-packet is owed and the window update a
 * read is owed, sent at the end of the loop pass (see lwip_ackq.h).
 *
 * A noted pcb's extension argument holds its index in the queue plus one (0: not noted), so
 * noting twice is one look, and lwIP's destroy callback, which gets only that value, can
 * empty the pcb's entry. */
#include "stacks/lwip/lwip_ackq.h"

#include <stddef.h>
#include <stdint.h>

#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"

static uint8_t ext_id = LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID;
static struct tcp_pcb *noted[LWIP_ACKQ_MAX]; /* NULL: the pcb was freed since */
static bool owed[LWIP_ACKQ_MAX];             /* an ACK lwIP would have sent at once was held */
static unsigned n_noted;

static void on_destroyed(u8_t id, void *data)
{
	uintptr_t slot = (uintptr_t)data;

	(void)id;
	if (slot && slot <= n_noted)
		noted[slot - 1] = NULL;
}

static const struct tcp_ext_arg_callbacks callbacks = { .destroy = on_destroyed };

void lwip_ackq_init(void)
{
	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		ext_id = tcp_ext_arg_alloc_id();
}

bool lwip_ackq_note(struct tcp_pcb *pcb)
{
	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		return false;
	if (pcb->ext_args[ext_id].data)
		return true;
	if (n_noted == LWIP_ACKQ_MAX)
		return false;
	owed[n_noted] = false;
	noted[n_noted++] = pcb;
	tcp_ext_arg_set_callbacks(pcb, ext_id, &callbacks);
	tcp_ext_arg_set(pcb, ext_id, (void *)(uintptr_t)n_noted);
	return true;
}

bool lwip_ackq_announces(const struct tcp_pcb *pcb)
{
	return pcb->state == ESTABLISHED || pcb->state == CLOSE_WAIT ||
	       pcb->state == FIN_WAIT_1 || pcb->state == FIN_WAIT_2;
}

/* The slot of a noted pcb, or -1. */
static int slot_of(const struct tcp_pcb *pcb)
{
	uintptr_t slot;

	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		return -1;
	slot = (uintptr_t)pcb->ext_args[ext_id].data;
	return slot && slot <= n_noted && noted[slot - 1] == pcb ? (int)slot - 1 : -1;
}

void lwip_ackq_hold(struct tcp_pcb *pcb)
{
	int i = slot_of(pcb);

	if (i >= 0 && (pcb->flags & TF_ACK_DELAY)) {
		tcp_clear_flags(pcb, TF_ACK_DELAY);
		owed[i] = true;
	}
}

void lwip_ackq_sent(const struct tcp_pcb *pcb)
{
	int i = slot_of(pcb);

	if (i >= 0)
		owed[i] = false;
}

bool lwip_ackq_pending(void)
{
	return n_noted != 0;
}

unsigned lwip_ackq_flush(void)
{
	unsigned sent = 0;

	/* Each entry is emptied before its pcb is served, so the queue is consistent for the
	 * destroy callback whatever lwIP does inside tcp_output. */
	for (unsigned i = 0; i < n_noted; i++) {
		struct tcp_pcb *pcb = noted[i];

		if (!pcb)
			continue;
		noted[i] = NULL;
		tcp_ext_arg_set(pcb, ext_id, NULL);
		/* The window the reader opened since the last segment: announced now when it is
		 * what tcp_recved would have sent an update for (lwIP's own test). */
		if (owed[i] || (pcb->flags & (TF_ACK_DELAY | TF_ACK_NOW)) ||
		    (lwip_ackq_announces(pcb) &&
		     tcp_update_rcv_ann_wnd(pcb) >= TS_LWIP_WND_UPDATE(pcb))) {
			tcp_ack_now(pcb);
			tcp_output(pcb);
			sent++;
		}
	}
	n_noted = 0;
	return sent;
}

void lwip_ackq_clear(void)
{
	for (unsigned i = 0; i < n_noted; i++)
		if (noted[i])
			tcp_ext_arg_set(noted[i], ext_id, NULL);
	n_noted = 0;
}
