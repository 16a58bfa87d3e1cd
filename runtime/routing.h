/* routing.h — the proxy's part in the namespace's routing (internal to runtime/): the route
 * check of every outbound (runtime/routecheck.h), tun.auto_route's rules and table
 * (runtime/autoroute.h) and the watch that keeps both current (runtime/routewatch.h).
 *
 * routing_start runs in proxy_open once the TUN exists: proxy servers' names are resolved
 * before any rule is installed (the lookups must not be captured), auto_route installs its
 * rules (without auto_route, what a killed proxy's left is swept away), then the route check
 * refuses a start whose outbounds would loop (-ELOOP). From then on every routing change in
 * the namespace, on the main loop, re-installs what auto_route lost, follows the uplink's
 * gateway and checks the outbounds' routes again. routing_stop removes everything auto_route
 * installed; it runs on every exit path (proxy_close). */
#ifndef TS_RUNTIME_ROUTING_H
#define TS_RUNTIME_ROUTING_H

#include <stddef.h>

struct routecheck;
struct ts_config;
struct ts_proxy;
struct stats_doc;

int routing_start(struct ts_proxy *p, char *err, size_t errlen)
	__attribute__((warn_unused_result));
void routing_stop(struct ts_proxy *p);
/* A reload from old to n: the route check's targets from n (nrc, made by routecheck_init for
 * n: taken over, left empty), auto_route's rules rebuilt if anything they depend on changed,
 * make-before-break (autoroute_replace), so traffic both configurations capture never leaves
 * by the uplink; nothing is touched when nothing they depend on changed. n's rules failing
 * refuse it with the old ones untouched; n's outbounds looping refuse it with the old rules
 * put back, make-before-break again. When n turns auto_route off, the old rules stay while n
 * is checked (the lookups look past them: autoroute_bypass_begin) and go only once n is
 * accepted; a refusal leaves them untouched. 0 or -errno with one line in err. */
int routing_reload(struct ts_proxy *p, const struct ts_config *old, const struct ts_config *n,
		   struct routecheck *nrc, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* routes.* figures for /stats. */
void routing_stats(struct ts_proxy *p, struct stats_doc *d);

#endif
