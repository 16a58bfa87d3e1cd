/* test_lwip_ackq.c — the queue of ACKs owed at the end of a loop pass
 * (stacks/lwip/lwip_ackq.c), on pcbs of a claimed lwIP that never see a packet:
 *   - a pcb is noted once however often it is noted; LWIP_ACKQ_MAX pcbs fit, the next is
 *     refused (its caller acknowledges at once);
 *   - a noted pcb that lwIP frees leaves the queue (its slot is emptied by the destroy
 *     callback), and the flush skips it;
 *   - the flush sends only for pcbs that still owe an ACK (TF_ACK_DELAY, or one held from
 *     lwIP), empties the queue, and a pcb may be noted again afterwards;
 *   - holding moves lwIP's owed ACK into the queue (the flag cleared, the flush sends it), a
 *     segment the pcb sends meanwhile settles it, and a pcb not noted is left alone.
 * The end-to-end behaviour (one ACK per pass, the window riding on it) is in
 * test_lwip_bigseg.c. */
#include <criterion/criterion.h>

#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"

#include "stacks/lwip/lwip_ackq.h"
#include "stacks/lwip/lwip_glue.h"

static struct tcp_pcb *pcbs[LWIP_ACKQ_MAX + 1];

static void setup(void)
{
	cr_assert_eq(lwip_glue_claim(NULL), 0);
	for (int i = 0; i <= LWIP_ACKQ_MAX; i++)
		cr_assert_not_null(pcbs[i] = tcp_new());
}

static void teardown(void)
{
	lwip_ackq_clear();
	for (int i = 0; i <= LWIP_ACKQ_MAX; i++)
		if (pcbs[i])
			tcp_abort(pcbs[i]);
	lwip_glue_release();
}

TestSuite(lwip_ackq, .init = setup, .fini = teardown);

Test(lwip_ackq, noted_once_and_bounded)
{
	cr_assert_not(lwip_ackq_pending());
	cr_assert(lwip_ackq_note(pcbs[0]));
	cr_assert(lwip_ackq_note(pcbs[0]), "noting again is fine");
	for (int i = 1; i < LWIP_ACKQ_MAX; i++)
		cr_assert(lwip_ackq_note(pcbs[i]), "pcb %d", i);
	cr_assert(lwip_ackq_pending());
	cr_assert_not(lwip_ackq_note(pcbs[LWIP_ACKQ_MAX]), "the queue is full");
	cr_assert(lwip_ackq_note(pcbs[3]), "one already noted still is");
	cr_assert_eq(lwip_ackq_flush(), 0, "nobody owes an ACK: none sent");
	cr_assert_not(lwip_ackq_pending());
	cr_assert(lwip_ackq_note(pcbs[LWIP_ACKQ_MAX]), "room again after the flush");
}

/* A freed pcb leaves the queue: lwIP frees it between its packet and the end of the pass. The
 * flush would otherwise call tcp_output on freed memory (the ASan tree runs this). */
Test(lwip_ackq, a_freed_pcb_leaves_the_queue)
{
	cr_assert(lwip_ackq_note(pcbs[0]));
	cr_assert(lwip_ackq_note(pcbs[1]));
	pcbs[0]->flags |= TF_ACK_DELAY;
	tcp_abort(pcbs[0]);
	pcbs[0] = NULL;
	cr_assert(lwip_ackq_pending(), "the other one is still noted");
	cr_assert_eq(lwip_ackq_flush(), 0);
}

/* Only a pcb that still owes its ACK gets one from the flush (the flag is lwIP's, cleared by
 * any segment the pcb sends; with no route here the ACK goes nowhere), and every pcb's slot
 * in its extension arguments is empty again. */
Test(lwip_ackq, the_flush_sends_for_those_that_still_owe)
{
	cr_assert(lwip_ackq_note(pcbs[0]));
	cr_assert(lwip_ackq_note(pcbs[1]));
	pcbs[1]->flags |= TF_ACK_DELAY;
	cr_assert_eq(lwip_ackq_flush(), 1);
	cr_assert_eq(pcbs[0]->ext_args[0].data == NULL && pcbs[0]->ext_args[1].data == NULL, 1,
		     "no slot left in the pcb's extension arguments");
}

/* lwIP's TF_ACK_DELAY, which would make the next segment's input send an ACK at once, moves
 * into the queue: cleared on the pcb, sent by the flush. A segment the pcb sends before the
 * flush (lwip_ackq_sent) carried it: nothing is sent then. */
Test(lwip_ackq, a_held_ack_is_sent_by_the_flush_unless_a_segment_carried_it)
{
	cr_assert(lwip_ackq_note(pcbs[0]));
	cr_assert(lwip_ackq_note(pcbs[1]));
	pcbs[0]->flags |= TF_ACK_DELAY;
	pcbs[1]->flags |= TF_ACK_DELAY;
	lwip_ackq_hold(pcbs[0]);
	lwip_ackq_hold(pcbs[1]);
	cr_assert_eq(pcbs[0]->flags & TF_ACK_DELAY, 0, "the flag moved into the queue");
	cr_assert_eq(pcbs[1]->flags & TF_ACK_DELAY, 0);
	lwip_ackq_sent(pcbs[1]);
	cr_assert_eq(lwip_ackq_flush(), 1, "only the one no segment carried");
}

/* Holding touches only a noted pcb: one the queue has no room for keeps its flag, and lwIP
 * sends its ACK as it always would; the flush, which serves only noted pcbs, sends nothing
 * for it. */
Test(lwip_ackq, a_pcb_not_noted_keeps_its_flag)
{
	cr_assert(lwip_ackq_note(pcbs[0]));
	pcbs[2]->flags |= TF_ACK_DELAY;
	lwip_ackq_hold(pcbs[2]);
	cr_assert_neq(pcbs[2]->flags & TF_ACK_DELAY, 0, "not noted: its flag stays");
	lwip_ackq_sent(pcbs[2]);
	cr_assert_eq(lwip_ackq_flush(), 0, "the noted one owes nothing, the other is lwIP's");
	cr_assert_neq(pcbs[2]->flags & TF_ACK_DELAY, 0);
}

/* An ACK lwIP wanted sent at once (TF_ACK_NOW: a send that failed for memory left it) is
 * owed too: the flush sends it. */
Test(lwip_ackq, an_ack_now_left_by_lwip_is_sent_by_the_flush)
{
	cr_assert(lwip_ackq_note(pcbs[0]));
	pcbs[0]->flags |= TF_ACK_NOW;
	cr_assert_eq(lwip_ackq_flush(), 1);
}
