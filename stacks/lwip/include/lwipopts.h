/* lwipopts.h — twinstack's lwIP configuration (docs/architecture.md, "The lwIP stack").
 *
 * NO_SYS, one libevent loop, TCP only (UDP, ICMP and everything else are handled by our code
 * before lwIP sees a packet), IPv4 + IPv6 on one netif that accepts any destination through the
 * input hooks, no ARP/Ethernet/DHCP/MLD/ND timers, no reassembly, every allocation through the
 * twinstack budget, windows sized for multi-Gbit/s with window scaling.
 */
#ifndef TS_LWIPOPTS_H
#define TS_LWIPOPTS_H

/* ---- system ---- */
#define NO_SYS 1
#define SYS_LIGHTWEIGHT_PROT 0
#define LWIP_TIMERS 1
#define LWIP_TIMERS_CUSTOM 1 /* we run tcp_tmr only while pcbs exist (stacks/lwip/lwip_stack.c) */
#define LWIP_NETCONN 0
#define LWIP_SOCKET 0
#define LWIP_NETIF_API 0
#define LWIP_SINGLE_NETIF 1
#define LWIP_HOOK_FILENAME "lwip_hooks.h"
#define LWIP_DONT_PROVIDE_BYTEORDER_FUNCTIONS 1 /* our code uses the libc ones */

/* ---- memory: everything charged to the twinstack budget (stacks/lwip/lwip_glue.c) ---- */
#define MEM_LIBC_MALLOC 1
#define MEMP_MEM_MALLOC 1
#define MEM_ALIGNMENT 8
#define mem_clib_malloc ts_lwip_malloc
#define mem_clib_free ts_lwip_free
#define mem_clib_calloc ts_lwip_calloc
#define LWIP_STATS 0
/* When the budget refuses an input segment, its acknowledgement still reaches lwIP from a buffer
 * the stack owns (stacks/lwip/lwip_stack.c, input_refused). */
#define LWIP_SUPPORT_CUSTOM_PBUF 1

/* ---- protocols ---- */
#define LWIP_IPV4 1
#define LWIP_IPV6 1
#define LWIP_ARP 0
#define LWIP_ETHERNET 0
#define LWIP_DHCP 0
#define LWIP_AUTOIP 0
#define LWIP_IGMP 0
#define LWIP_DNS 0
#define LWIP_UDP 0
#define LWIP_RAW 0
#define LWIP_ICMP 0          /* echo to the gateway is answered by our code; nothing else */
#define LWIP_IPV6_MLD 0
#define LWIP_IPV6_AUTOCONFIG 0
#define LWIP_IPV6_SEND_ROUTER_SOLICIT 0
#define LWIP_IPV6_DUP_DETECT_ATTEMPTS 0
#define LWIP_ND6_QUEUEING 0
#define LWIP_IPV6_DHCP6 0
#define IP_REASSEMBLY 0       /* fragments are rejected before lwIP, as the system stack does */
#define IP_FRAG 0             /* our MSS keeps every segment within the MTU */
#define LWIP_IPV6_REASS 0
#define LWIP_IPV6_FRAG 0
#define IPV6_FRAG_COPYHEADER 1 /* 64-bit: the helper overlaying the header does not fit */
#define IP_FORWARD 0
#define LWIP_IPV6_FORWARD 0

/* ---- checksums: lwIP verifies input and generates output; per-netif control for offload ---- */
#define LWIP_CHECKSUM_CTRL_PER_NETIF 1

/* ---- TCP ---- */
#define LWIP_TCP 1
#define TCP_MSS 1440              /* 1500 - 40 (IPv6) - 20 (TCP): valid for both families */
#define LWIP_WND_SCALE 1
#define TCP_RCV_SCALE 3           /* window up to 64 KiB << 3 */
#define TCP_WND (256 * 1024)
/* An explicit window update once the application has taken a quarter of the window. lwIP's
 * default, min(TCP_WND / 4, 4 * TCP_MSS), was made for small windows: with this one it sends an
 * update for every 5.6 KiB the relay drains, a TUN write and the client's ACK processing each.
 * A shut window always has the whole window queued in lwIP, so draining a quarter of it
 * always comes, and the update with it. The quarter is of the connection's own window: one
 * that did not negotiate window scaling has at most 65535 bytes, of which TCP_WND / 4 could
 * never be taken. Its only use is in tcp_recved, with the pcb in scope: there the stack may
 * instead hold the update for the end of the loop pass, sent with the ACK the pass owes
 * anyway (ts_lwip_wnd_update_threshold, stacks/lwip/lwip_ackq.h). */
#define TS_LWIP_WND_UPDATE(pcb) (TCP_WND_MAX(pcb) / 4)
#define TCP_WND_UPDATE_THRESHOLD ts_lwip_wnd_update_threshold(pcb)
#define TCP_SND_BUF (256 * 1024)
#define TCP_SND_QUEUELEN ((4 * TCP_SND_BUF) / TCP_MSS)
#define TCP_SNDLOWAT (0xFFFF - 4 * TCP_MSS - 1) /* init.c: 4*MSS below u16 */
#define TCP_SNDQUEUELOWAT (TCP_SND_QUEUELEN / 2)
#define MEMP_NUM_TCP_SEG (TCP_SND_QUEUELEN * 4)
#define MEMP_NUM_TCP_PCB 65535    /* not a pool with MEMP_MEM_MALLOC: admission bounds pcbs */
#define MEMP_NUM_TCP_PCB_LISTEN 2
#define MEMP_NUM_PBUF 1024
#define PBUF_POOL_SIZE 256
#define TCP_QUEUE_OOSEQ 1
#define TCP_OOSEQ_MAX_BYTES TCP_WND
#define LWIP_TCP_SACK_OUT 0
#define TCP_LISTEN_BACKLOG 1
#define TCP_DEFAULT_LISTEN_BACKLOG 0xff
#define LWIP_TCP_KEEPALIVE 0
#define TCP_MSL 1000UL            /* TIME_WAIT 2 s: behind a TUN it protects nobody */
#define LWIP_CALLBACK_API 1
#define LWIP_EVENT_API 0
#define TCP_OVERSIZE TCP_MSS
/* The room a segment written with TCP_WRITE_FLAG_MORE gets (lwIP caps it at the segment size it
 * cuts at): that of a whole segment where it will wait, so the writes after it are copied into
 * the same pbuf instead of chained (stacks/lwip/lwip_stream.c, ts_lwip_oversize). The macro
 * is expanded in tcp_pbuf_prealloc, where pcb is the connection written to. */
#define TCP_OVERSIZE_CALC_LENGTH(length) ts_lwip_oversize(pcb, (length))
#define LWIP_TCP_TIMESTAMPS 0
/* Three extension arguments per pcb: the large-segment state (stacks/lwip/lwip_bigseg.c),
 * the place of an ACK owed at the end of the loop pass (stacks/lwip/lwip_ackq.c) and a
 * handshake's entry in the index of half-open ones (stacks/lwip/lwip_halfopen.c). */
#define LWIP_TCP_PCB_NUM_EXT_ARGS 3

/* ---- debugging ---- */
#define LWIP_DEBUG 0
#define LWIP_NOASSERT_ON_ERROR 1

#endif
