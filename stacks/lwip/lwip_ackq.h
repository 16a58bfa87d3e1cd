/* lwip_ackq.h — the acknowledgement an offloaded super-packet is owed, sent at the end of the
 * loop pass that read it, with the window the reader opened in between.
 *
 * With TUN offload the application's upload arrives as super-packets of up to 64 KiB, each
 * one segment for lwIP. Acknowledged at once (at the end of tcp_input), each costs a TUN
 * write, and the window update that follows when the relay has taken a quarter of the
 * window costs another. Each such write is also the client kernel's ACK processing, done in
 * the proxy's thread as the TUN write's softirq work: freeing what the ACK covers, waking the
 * writer and sending on. Noted instead, the ACK waits for the end of the loop pass: by then
 * the relay has taken what it could, and one segment per connection and pass carries the
 * acknowledgement of everything read and the window opened since. So the pass holds back
 * what lwIP would send at once in between:
 * - the ACK lwIP sends for every second segment (lwip_ackq_hold, before the segment's input:
 *   the flag that would make tcp_input send it is moved into the queue);
 * - the window update tcp_recved sends when the reader has opened a quarter of the window
 *   (ts_lwip_wnd_update_threshold: the update is due at the flush instead, by the same test).
 * A pcb that sends any segment meanwhile (data, or an ACK lwIP does not leave to us: out of
 * order input, a FIN) has acknowledged everything and announced its window already
 * (lwip_ackq_sent); the flush then skips it unless more is owed since. The end of the pass is
 * microseconds away, never a timer: the sender's ACK clock barely moves.
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
/* pcb was sent a super-packet, or its reader opened enough window for an update: note it for
 * the end of the pass. False when the queue is full (then the caller acknowledges or updates
 * at once); true when it is noted or already was. */
bool lwip_ackq_note(struct tcp_pcb *pcb);
/* A noted pcb is about to take a segment: an ACK lwIP owes it for an earlier one (its
 * TF_ACK_DELAY, which would make this segment's input send one at once) moves into the queue,
 * for the flush. No effect on a pcb not noted. */
void lwip_ackq_hold(struct tcp_pcb *pcb);
/* pcb sent a segment: it carried the acknowledgement and the window, nothing is owed. */
void lwip_ackq_sent(const struct tcp_pcb *pcb);
/* pcb is in a state whose window updates the queue may hold (synchronized, still receiving
 * or acknowledging: ESTABLISHED, CLOSE_WAIT, FIN_WAIT_1, FIN_WAIT_2). */
bool lwip_ackq_announces(const struct tcp_pcb *pcb);
/* Any pcb noted? */
bool lwip_ackq_pending(void);
/* Send the ACKs still owed (a noted pcb that held one, still has TF_ACK_DELAY or TF_ACK_NOW
 * set, or is in a state that announces and whose window has grown by TS_LWIP_WND_UPDATE since
 * it was last announced) and empty the queue. Returns how many were sent. */
unsigned lwip_ackq_flush(void);
/* Empty the queue without sending (the stack stops). */
void lwip_ackq_clear(void);

#endif
