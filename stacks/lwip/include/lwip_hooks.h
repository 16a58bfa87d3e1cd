/* lwip_hooks.h — the input hooks that let lwIP accept TCP to any destination (no patch), and
 * quick-ACK offload super-packets. */
#ifndef TS_LWIP_HOOKS_H
#define TS_LWIP_HOOKS_H

#include <stdint.h>

struct pbuf;
struct netif;

int ts_lwip_ip4_hook(struct pbuf *p, struct netif *inp);
int ts_lwip_ip6_hook(struct pbuf *p, struct netif *inp);

#define LWIP_HOOK_IP4_INPUT(pbuf, input_netif) ts_lwip_ip4_hook((pbuf), (input_netif))
#define LWIP_HOOK_IP6_INPUT(pbuf, input_netif) ts_lwip_ip6_hook((pbuf), (input_netif))

/* After tcp_input matched a pcb, before it processes the segment: a TUN offload super-packet
 * (one "segment" of up to ~44 MSS) asks for an immediate ACK, as Linux quick-acks GRO'd
 * input; lwIP would otherwise ACK every second segment, i.e. every ~128 KiB. Returns ERR_OK. */
struct tcp_pcb;
int ts_lwip_tcp_inpacket(struct tcp_pcb *pcb);
#define LWIP_HOOK_TCP_INPACKET_PCB(pcb, hdr, optlen, opt1len, opt2, p)                         \
	((void)(hdr), (void)(optlen), (void)(opt1len), (void)(opt2), (void)(p),                  \
	 ts_lwip_tcp_inpacket(pcb))

/* RFC 6528 initial sequence numbers (stacks/lwip/lwip_isn.h), keyed per stack: lwIP's own
 * generator is a counter plus its tick count, which anyone can predict. */
struct ip_addr;
uint32_t ts_lwip_tcp_isn(const struct ip_addr *local_ip, uint16_t local_port,
			 const struct ip_addr *remote_ip, uint16_t remote_port);
#define LWIP_HOOK_TCP_ISN(local_ip, local_port, remote_ip, remote_port)                        \
	ts_lwip_tcp_isn((local_ip), (local_port), (remote_ip), (remote_port))

#endif
