/* redirect_udp.h — the UDP half of `twinstack redirect`: the cheapest userspace UDP hop, the
 * bound a UDP path through any proxy is measured against.
 *
 * A datagram that nftables redirected (or sent straight) to the listening socket is forwarded
 * to one fixed upstream (--udp-to), from a connected socket of its own per client source
 * (marked like the TCP outbound), and the upstream's replies go back to that client from the
 * listening socket, where conntrack turns their source back into the address the client sent
 * to. A socket cannot learn where a redirected datagram was going (SO_ORIGINAL_DST is TCP's
 * alone), so this is a forwarder to one server, not a UDP proxy: it does, per datagram, the
 * least a UDP proxy must (one receive and one send each way, in batches of up to
 * RD_UDP_BATCH: recvmmsg, sendmmsg) and nothing else.
 *
 * Flows are admitted by the budget (a UDP session and a descriptor each; refused datagrams
 * are counted) and end after the idle time without a datagram either way.
 */
#ifndef TS_CLI_REDIRECT_UDP_H
#define TS_CLI_REDIRECT_UDP_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/netaddr.h"
#include "core/stats_doc.h"

#define RD_UDP_BATCH 32

struct rd_udp;

/* A forwarder listening on listen4 and/or listen6 (NULL: none of that family; at least one),
 * sending to `to` (either family) from sockets made for outbound `ob` (its routing mark),
 * flows ending after idle_ms without traffic; a flow's replies leave from the socket its
 * datagrams came to. 0, or -errno with a message in err (a port in use, no CAP_NET_ADMIN for
 * the mark, out of memory). */
int rd_udp_new(struct event_base *base, const struct netaddr_ep *listen4,
	       const struct netaddr_ep *listen6, const struct netaddr_ep *to,
	       const struct ts_outbound *ob, struct budget *b, uint32_t idle_ms,
	       struct rd_udp **out, char *err, size_t errlen);

/* Closes every flow and the listening socket; NULL is fine. */
void rd_udp_free(struct rd_udp *u);

/* Its counters under "redirect.udp.". */
void rd_udp_stats(const struct rd_udp *u, struct stats_doc *d);

#endif
