/* local.h — the proxy's own resolver offered to the proxy itself: a UDP socket on 127.0.0.1
 * (a port the kernel picks) answered by dns_server_query_real. The c-ares resolver of the direct
 * outbounds is pointed at it, so that a name a direct outbound connects to (a fake-IP name, a
 * sniffed name) is resolved by the same rules, hosts, cache and upstreams as the apps' queries
 * — not by /etc/resolv.conf, whose server may be the TUN itself (a loop) or a leak.
 *
 * Only loopback sources are served (the socket is bound to 127.0.0.1; anything else would not
 * reach it). At most DNS_LOCAL_MAX_PENDING queries wait at a time; more are dropped (c-ares
 * asks again). Single-threaded: the loop that runs base.
 */
#ifndef TS_DNS_LOCAL_H
#define TS_DNS_LOCAL_H

#include <stdint.h>

struct event_base;
struct dns_server;
struct dns_local;

#define DNS_LOCAL_MAX_PENDING 256

/* 0 and *out with the socket bound (its port in *port), or -errno. */
int dns_local_new(struct event_base *base, struct dns_server *s, struct dns_local **out,
		  uint16_t *port) __attribute__((warn_unused_result));
/* Waiting queries are cancelled; the socket closed. NULL: nothing. */
void dns_local_free(struct dns_local *l);

#endif
