/* lwip_split.h — a segment lwIP cuts in two keeps its FIN on the second part only.
 *
 * lwIP 2.1 cuts an unsent segment in two (tcp_split_unsent_seg) when the peer's window cannot
 * take it whole and nothing is in flight: from its persist timer, and from large-segment
 * fitting (lwip_bigseg_fit). It gives the second part the FIN, but only ORs the remaining
 * flags into the first part's header, so the first part keeps the FIN too. The peer then ends
 * the stream after the first part: the rest of the data is never read, the download arrives
 * short and looks complete to TCP. (The same defect was fixed in Mellanox's lwIP fork, "Set
 * proper FIN/RST flags for split segments", https://github.com/Mellanox/libvma/pull/908.)
 *
 * lwip_split_fin_repair clears a FIN on the head of the unsent queue when a segment follows
 * it: in a well-formed queue only the last segment may carry the FIN. It is called from the
 * output hook, which runs for every data segment tcp_output sends (always the unsent queue's
 * head) before its checksum is computed and before lwIP counts the segment's sequence space (a
 * FIN counts one), so no wrong FIN ever leaves; every split is followed by a tcp_output (lwIP's
 * persist timer and lwip_bigseg_fit both send the first part at once). Until then the stray
 * flag is harmless: the first part is unsent, and nothing else reads the head's FIN while a
 * segment follows it. Everything runs on the thread that owns lwIP (lwip_glue_claim).
 */
#ifndef TS_LWIP_SPLIT_H
#define TS_LWIP_SPLIT_H

#include <stdbool.h>

struct tcp_pcb;
struct tcp_hdr;

/* hdr: the header of the segment about to be sent (pcb NULL: a RST sent without one). Returns
 * true if a misplaced FIN was cleared (count it). */
bool lwip_split_fin_repair(struct tcp_pcb *pcb, const struct tcp_hdr *hdr);

#endif
