/* lwip_hooks.h — the input hooks that let lwIP accept TCP to any destination (no patch),
 * quick-ACK offload super-packets, and the output hook that tells the stack which connection a
 * segment belongs to (large segments, stacks/lwip/lwip_bigseg.h). */
#ifndef TS_LWIP_HOOKS_H
#define TS_LWIP_HOOKS_H

#include <stdint.h>

struct pbuf;
struct netif;

int ts_lwip_ip4_hook(struct pbuf *p, struct netif *inp);
int ts_lwip_ip6_hook(struct pbuf *p, struct netif *inp);

#define LWIP_HOOK_IP4_INPUT(pbuf, input_netif) ts_lwip_ip4_hook((pbuf), (input_netif))
#define LWIP_HOOK_IP6_INPUT(pbuf, input_netif) ts_lwip_ip6_hook((pbuf), (input_netif))

/* After tcp_input matched a pcb, before it processes the segment (options pointers as
 * tcp_input split them: opt1len bytes after the header, the rest at opt2):
 * - an MSS option outside the SYN a listener takes is made NOPs (lwIP would take it from any
 *   segment, a repeated SYN's without the cap to the MTU);
 * - an option kind that is the options' last byte becomes EOL (lwIP would read its length from
 *   past the options);
 * - a TUN offload super-packet (one "segment" of up to ~44 MSS) asks for an immediate ACK, as
 *   Linux quick-acks GRO'd input; lwIP would otherwise ACK every second segment, i.e. every
 *   ~128 KiB;
 * - a connection with large segments notes a retransmission (lwip_bigseg_input) and is checked
 *   again after the segment (lwip_stack.c);
 * - an out-of-order segment (len payload bytes) that reaches past the receive window's right
 *   edge is dropped (lwIP would queue it untrimmed and later abort on its own assertion).
 * Returns ERR_OK, or ERR_VAL for a segment to drop (tcp_input frees it). */
struct tcp_pcb;
struct tcp_hdr;
int ts_lwip_tcp_inpacket(struct tcp_pcb *pcb, struct tcp_hdr *hdr, uint16_t optlen,
			 uint16_t opt1len, uint8_t *opt2, uint16_t len);
#define LWIP_HOOK_TCP_INPACKET_PCB(pcb, hdr, optlen, opt1len, opt2, p)                         \
	ts_lwip_tcp_inpacket((pcb), (hdr), (optlen), (opt1len), (opt2), (p)->tot_len)

/* Where a segment's options are written: in tcp_output_segment right before ip_output_if (every
 * segment with data, retransmissions included; p starts at the TCP header and holds the
 * payload), and where the header of a control segment (an ACK, a RST, a window probe) is
 * built, before its output. The pcb (NULL for a RST sent without one) tells the stack the wire
 * MSS of what its output is about to get; a data segment lwIP cut in two loses the FIN it
 * wrongly kept (stacks/lwip/lwip_split.h); a connection with large segments announces its
 * window edge by the wire MSS (lwip_bigseg_announce); a segment that carries the last byte
 * written so far gets PSH (lwip_stream_push). The checksum is computed after the hook. Returns
 * opts unchanged: no option is added. */
void ts_lwip_tcp_out(struct tcp_pcb *pcb, struct tcp_hdr *hdr, const struct pbuf *p);
#define LWIP_HOOK_TCP_OUT_ADD_TCPOPTS(p, hdr, pcb, opts)                                        \
	(ts_lwip_tcp_out((pcb), (hdr), (p)), (opts))

/* The pbuf room lwIP's tcp_write gives a segment of length bytes written with "more to come"
 * (TCP_OVERSIZE_CALC_LENGTH in lwipopts.h; stacks/lwip/lwip_stream.c). */
unsigned ts_lwip_oversize(const struct tcp_pcb *pcb, unsigned length);

/* The window update threshold tcp_recved compares the window's growth with
 * (TCP_WND_UPDATE_THRESHOLD in lwipopts.h): TS_LWIP_WND_UPDATE(pcb), or, when the stack holds
 * the update for the end of the loop pass (stacks/lwip/lwip_ackq.h), more than any growth. */
unsigned ts_lwip_wnd_update_threshold(struct tcp_pcb *pcb);

/* RFC 6528 initial sequence numbers (stacks/lwip/lwip_isn.h), keyed per stack: lwIP's own
 * generator is a counter plus its tick count, which anyone can predict. */
struct ip_addr;
uint32_t ts_lwip_tcp_isn(const struct ip_addr *local_ip, uint16_t local_port,
			 const struct ip_addr *remote_ip, uint16_t remote_port);
#define LWIP_HOOK_TCP_ISN(local_ip, local_port, remote_ip, remote_port)                        \
	ts_lwip_tcp_isn((local_ip), (local_port), (remote_ip), (remote_port))

#endif
