/* lwip_hooks.h — the input hooks that let lwIP accept TCP to any destination (no patch). */
#ifndef TS_LWIP_HOOKS_H
#define TS_LWIP_HOOKS_H

struct pbuf;
struct netif;

int ts_lwip_ip4_hook(struct pbuf *p, struct netif *inp);
int ts_lwip_ip6_hook(struct pbuf *p, struct netif *inp);

#define LWIP_HOOK_IP4_INPUT(pbuf, input_netif) ts_lwip_ip4_hook((pbuf), (input_netif))
#define LWIP_HOOK_IP6_INPUT(pbuf, input_netif) ts_lwip_ip6_hook((pbuf), (input_netif))

#endif
