/* lwip_ackq.h — the acknowledgement an offloaded super-packet is owed, sent at the end of the
 * loop pass that read it, with the window the reader opened in between.
 *
 * With TUN offload the application's upload arrives as super-packets of up to 64 KiB, each
 * one segment for lwIP. Acknowledged at once (at the end of tcp_input), each costs a TUN
 * write, and the window update that follows when the relay has taken a quarter of the
 * window costs another: 1.3 writes per packet read. Noted instead, the ACK waits for the end
 * of the loop pass: by then the relay has taken what it could, and the one ACK carries both
 * the acknowledgement and the window opened since. A pcb that sends any segment meanwhile
 * (lwIP's own ACK for every second segment, a window update, data) has acknowledged
 * everything already; lwip_ackq_flush then skips it (lwIP clears TF_ACK_DELAY whenever it
 * sends). The end of the pass is microseconds away, never a timer: the sender's ACK clock
 * barely moves.
 *
 * A noted pcb that lwIP frees before the flush leaves the queue through an extension
 * argument's destroy callback, so the flush never touches a freed pcb. Everything runs on the
 * thread that owns lwIP (lwip_glue_claim); the queue is one per process, like lwIP itself.
 */
#ifndef TS_LWIP_ACKQ_H
#define TS_LWIP_ACKQ_H

#include <stdbool.h>

struct tcp_pcb;

/* pcbs one pass may note; a pcb beyond them is acknowledged at once, as before. */
#define LWIP_ACKQ_MAX 64

/* Allocate the extension argument slot (once per process, at the first claim of lwIP). */
void lwip_ackq_init(void);
/* pcb was sent a super-packet: note it for the end of the pass. False when the queue is
 * full (then the caller acknowledges it at once); true when it is noted or already was. */
bool lwip_ackq_note(struct tcp_pcb *pcb);
/* Any pcb noted? */
bool lwip_ackq_pending(void);
/* Send the ACKs still owed (a noted pcb with TF_ACK_DELAY still set) and empty the queue.
 * Returns how many were sent. */
unsigned lwip_ackq_flush(void);
/* Empty the queue without sending (the stack stops). */
void lwip_ackq_clear(void);

#endif
