/* lwip_bigseg.h — lwIP builds large TCP segments and the kernel cuts them (segmentation
 * offload through the TUN).
 *
 * With TUN offload, a packet written with a virtio_net_hdr (gso_type TCPV4/TCPV6, gso_size =
 * the connection's MSS) is cut into MSS-sized segments by the kernel. lwIP can then build one
 * segment of up to ~64 KB where it would build 45: one pbuf, one tcp_seg, one header, one pass
 * of tcp_output, one write, instead of 45 of each. The client still receives segments of the
 * MSS it announced.
 *
 * How: after the handshake, a connection's pcb->mss is raised to a multiple of its wire MSS
 * (the MSS both ends agreed on); the wire MSS is kept in the pcb's extension argument, since
 * lwIP may still send after our stream let go of the pcb. pcb->mss must stay at least as large
 * as every queued segment: lwIP sends a segment only whole within min(cwnd, snd_wnd), and
 * derives cwnd from pcb->mss (2 * mss at first, mss after a timeout), so a smaller pcb->mss
 * with a larger segment queued would stall the connection for good.
 *
 * Loss: lwIP has no SACK, so one lost packet inside a large segment makes lwIP send the whole
 * segment again. The first retransmission on a connection returns it to wire-size segments:
 * BIG -> DRAIN (new writes are cut at the wire MSS; pcb->mss stays large while a large segment
 * is queued) -> WIRE (pcb->mss = wire MSS, as if the feature had never been on) once no queued
 * segment is longer than the wire MSS.
 *
 * Everything runs on the thread that owns lwIP (lwip_glue_claim).
 */
#ifndef TS_LWIP_BIGSEG_H
#define TS_LWIP_BIGSEG_H

#include <stdbool.h>
#include <stdint.h>

struct tcp_pcb;

/* The largest segment payload: its pbuf block (allocator header, struct pbuf, header room,
 * data) stays within one 64 KiB size class of the lwIP allocator, and the IP packet's length
 * within 65535. */
#define LWIP_BIGSEG_DATA_MAX 65000u
/* Below this wire MSS (RFC 9293's default, 536) a connection keeps wire-size segments: a
 * super-packet of over a hundred tiny segments is not worth the kernel's work or a peer's
 * trust. */
#define LWIP_BIGSEG_MIN_WIRE 536u

/* Reserve lwIP's extension-argument slot. Once per process, after lwip_init. */
void lwip_bigseg_init(void);

/* A connection just established (lwIP's accept callback; lwIP sets the initial cwnd from
 * pcb->mss right after it). wire_cap: the largest MSS the TUN's MTU allows for the pcb's family.
 * Returns true if the connection now builds large segments. */
bool lwip_bigseg_start(struct tcp_pcb *pcb, uint16_t wire_cap);

/* The connection's wire MSS if it ever built large segments (its queue may hold some), else 0.
 * pcb may be NULL (a RST sent without a pcb). */
uint16_t lwip_bigseg_wire(const struct tcp_pcb *pcb);

/* A segment for pcb arrived, before lwIP processes it. lwIP counts retransmissions in
 * pcb->nrtx until data sent after them is acknowledged, i.e. until an arriving segment is
 * processed: seen set here, a retransmission (timeout or fast retransmit) has happened, and the
 * connection starts its return to wire-size segments. Returns true on that transition. */
bool lwip_bigseg_input(struct tcp_pcb *pcb);

/* False while lwip_bigseg_write_begin would refuse (writable must not fire then). */
bool lwip_bigseg_can_write(const struct tcp_pcb *pcb);

/* Around tcp_write: may the owner queue data now, and at what segment size. write_begin returns
 * false while the last unsent segment is longer than the wire MSS during DRAIN (lwIP's
 * tcp_write cannot append to a segment longer than the size it cuts at); the caller then waits
 * for tcp_sent, as when the send buffer is full. Every true write_begin is followed by
 * write_end. */
bool lwip_bigseg_write_begin(struct tcp_pcb *pcb);
void lwip_bigseg_write_end(struct tcp_pcb *pcb);

/* Acknowledged data may have removed the last large segment: DRAIN -> WIRE. Call from the
 * sent callback and before writes. */
void lwip_bigseg_progress(struct tcp_pcb *pcb);

/* The window stall. lwIP sends a segment only whole within min(snd_wnd, cwnd); with nothing in
 * flight and a window smaller than the head segment it waits for its persist timer (1.5 s at
 * first, up to a minute after a long zero window) to split it. A receiver that opens a window
 * of a few MSS would wait that long where MSS-sized segments go at once. lwip_bigseg_fit cuts
 * the head segment down to the window (a multiple of the wire MSS, at least one) and sends it;
 * true when it did. The owner calls it after its writes; for input, watch notes the pcb a
 * segment arrived for (from the input hook), and after_input, once tcp_input is done, fits
 * that pcb unless lwIP freed it meanwhile. */
bool lwip_bigseg_fit(struct tcp_pcb *pcb);
void lwip_bigseg_watch(struct tcp_pcb *pcb);
bool lwip_bigseg_after_input(void);

/* The receive window's lag. lwIP moves the right edge of the window it announces only when
 * the edge can move by min(TCP_WND / 2, pcb->mss) (tcp_update_rcv_ann_wnd, on every read and
 * every arriving segment): with a large pcb->mss, the app would see up to that much less window
 * than the reader has opened. Called with every segment lwIP sends for pcb (its output hook:
 * the header built, the checksum not yet), after lwIP wrote the window field: while pcb->mss is
 * larger than the wire MSS, the edge moves as soon as it can move by one wire MSS, as lwIP's
 * own rule does for a connection with wire-size segments. The edge only ever moves right, and
 * pcb's announced edge stays the one sent, so lwIP's explicit window updates (a quarter of the
 * window opened since the last segment) come as before. wire: lwip_bigseg_wire(pcb), which
 * the hook has read already. True when it rewrote the field. */
struct tcp_hdr;
bool lwip_bigseg_announce(struct tcp_pcb *pcb, struct tcp_hdr *hdr, uint16_t wire);

#endif
