/* reload.h — a new configuration for a running proxy (internal to runtime/), without dropping
 * a session.
 *
 * What changes: outbounds, route rules, DNS upstream, timeouts, log level and every auto_route
 * option. New sessions use the new configuration; live ones keep the configuration (and the
 * outbound) they were routed with, which stays allocated until the last of them ends (the
 * dispatcher and the UDP path release it).
 *
 * What does not (it is fixed when the TUN, the stack, the pools or the privileges are set up):
 * stack, the TUN's name, addresses, MTU, queue length, queues, offload, GSO output and receive
 * steering, the nat section, relay mode and sizes, budgets, stats.listen, dns.hijack, user.
 * A changed one is reported (log, /stats reload.kept) and keeps its running value.
 *
 * A new configuration that does not parse, names an unknown user, or whose outbounds would be
 * routed into the TUN is refused with the same one-line message `twinstack check` gives; the
 * running one goes on. Main loop only.
 */
#ifndef TS_RUNTIME_RELOAD_H
#define TS_RUNTIME_RELOAD_H

#include <stddef.h>

struct ts_proxy;
struct stats_doc;

/* json NULL: read the file the proxy was created from again. 0, or -errno with one line in
 * err (-EINVAL a bad config, -ELOOP its traffic would loop, -ENOENT no file to re-read, ...). */
int proxy_reload(struct ts_proxy *p, const char *json, size_t len, char *err, size_t errlen);

/* config.generation and reload.* for /stats. */
void reload_stats(struct ts_proxy *p, struct stats_doc *d);

/* Free the configurations reloads left (at proxy teardown, after the dispatcher and the UDP
 * path are gone). */
void reload_fini(struct ts_proxy *p);

#endif
