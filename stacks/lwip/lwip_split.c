/* lwip_split.c — a segment lwIP cuts in two keeps its FIN on the second part only (see
 * lwip_split.h). */
#include "stacks/lwip/lwip_split.h"

#include <stddef.h>

#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"

bool lwip_split_fin_repair(struct tcp_pcb *pcb, const struct tcp_hdr *hdr)
{
	struct tcp_seg *head;

	if (!pcb)
		return false;
	head = pcb->unsent;
	/* Only the head is ever cut (lwIP's split takes the unsent queue's head), and tcp_output
	 * sends from the head: a header that is not the head's is a control segment's. */
	if (!head || !head->next || (hdr && head->tcphdr != hdr) ||
	    !(TCPH_FLAGS(head->tcphdr) & TCP_FIN))
		return false;
	TCPH_UNSET_FLAG(head->tcphdr, TCP_FIN);
	return true;
}
