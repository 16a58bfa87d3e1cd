/* lwip_ackq.c — the acknowledgement an offloaded super-packet is owed, sent at the end of the
 * loop pass (see lwip_ackq.h).
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
	noted[n_noted++] = pcb;
	tcp_ext_arg_set_callbacks(pcb, ext_id, &callbacks);
	tcp_ext_arg_set(pcb, ext_id, (void *)(uintptr_t)n_noted);
	return true;
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
		if (pcb->flags & TF_ACK_DELAY) {
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
