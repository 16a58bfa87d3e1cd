/* lwip_split.c — a segment lwIP cuts in two keeps its FIN on the second part only (see
 * lwip_split.h). */
#include "stacks/lwip/lwip_split.h"

#include <stddef.h>

#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"

bool lwip_split_fin_repair(struct tcp_pcb *pcb, const struct tcp_hdr *hdr)
{
	struct tcp_seg *head;

	/* Most segments carry no FIN: decided from the header alone. Only the head is ever cut
	 * (lwIP's split takes the unsent queue's head), and tcp_output sends from the head: a
	 * header that is not the head's is a control segment's. */
	if (!(TCPH_FLAGS(hdr) & TCP_FIN) || !pcb)
		return false;
	head = pcb->unsent;
	if (!head || !head->next || head->tcphdr != hdr)
		return false;
	TCPH_UNSET_FLAG(head->tcphdr, TCP_FIN);
	return true;
}
