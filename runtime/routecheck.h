/* routecheck.h — would an outbound's own traffic be routed into our TUN? A routing mark only
 * keeps the proxy's sockets out of the TUN if some rule sends marked traffic elsewhere, so the
 * route is checked, not the config: the kernel is asked (RTM_GETROUTE with the outbound's mark
 * and bound interface) which way a socket of that outbound would go to its server — for a
 * direct outbound, to a probe destination per family served (192.0.2.1, 2001:db8::1: the
 * documentation ranges, so the answer is the one an arbitrary destination gets unless the
 * user routes those ranges; a lookup sends nothing).
 *
 * At start a loop refuses the start (-ELOOP, the message names the outbound's JSON path); at
 * run time (after a routing change) each outbound that starts to loop is logged once and
 * counted, and logged again when it stops. The run-time last line remains the loop guard
 * (core/loopguard.h), which drops whatever loops anyway.
 *
 * Main loop only. Socks5 servers given by host name are resolved once, at routecheck_init.
 */
#ifndef TS_RUNTIME_ROUTECHECK_H
#define TS_RUNTIME_ROUTECHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/log.h"
#include "core/netaddr.h"
#include "core/netlink.h"

#define ROUTECHECK_DST_MAX 2

struct routecheck_target {
	bool active;                     /* the outbound opens sockets */
	bool is_probe;                   /* direct: probe destinations */
	bool looping;                    /* the last scan found its route in the TUN */
	uint32_t mark;                   /* 0: none */
	char oif_name[TS_IFNAME_MAX + 1]; /* bind_interface, "" none */
	uint8_t n_dst;
	struct netaddr dst[ROUTECHECK_DST_MAX];
};

struct routecheck {
	struct routecheck_target *t;     /* one per outbound */
	size_t n;
	int tun_ifindex;
	uint32_t unmarked_mark;          /* the mark lookups of targets without one carry (0:
					  * none): a stand-in while auto_route's rules are
					  * looked past (autoroute_bypass_begin) */
	uint64_t episodes;               /* an outbound started to loop (routes.loop_risk) */
	uint64_t looping_now;            /* outbounds looping after the last scan */
};

/* The targets of cfg's outbounds (a socks5 server's host name is resolved now: its first
 * address). tun_ifindex: our TUN. 0, or -errno with one line in err (-ENXIO, -EAGAIN: a server
 * name that does not resolve; -ENOMEM). */
int routecheck_init(struct routecheck *rc, const struct ts_config *cfg, int tun_ifindex,
		    char *err, size_t errlen) __attribute__((warn_unused_result));
void routecheck_fini(struct routecheck *rc);

/* Look every target up through nl. start: the first loop returns -ELOOP with
 * "config: $.outbounds[i]: ..." in err. Otherwise changes are logged to lg and counted;
 * returns the number of outbounds looping now. A failed lookup other than "no route" returns
 * its -errno (start) or is skipped (run time). */
int routecheck_scan(struct routecheck *rc, struct netlink *nl, struct log *lg, bool start,
		    char *err, size_t errlen);

/* Give cfg's socks5 outbounds named by host name the address resolved for them (pinned): their
 * connections then use it instead of resolving on the loop, where, with auto_route, the
 * resolver's own queries would wait for the loop they block. cfg must be the configuration
 * rc was made from. */
void routecheck_pin(const struct routecheck *rc, struct ts_config *cfg);

/* The proxy servers' addresses (socks5 outbounds), at most cap: what auto_route must leave on
 * the original routes. Returns how many were written. */
size_t routecheck_servers(const struct routecheck *rc, struct netaddr *out, size_t cap);

#endif
