/* reload.h — a new configuration for a running proxy (internal to runtime/), without dropping
 * a session.
 *
 * What changes: outbounds (the ones the resolver's servers go through included), route rules,
 * DNS upstream, the resolver's rules and hosts, timeouts, log level and every auto_route
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

struct reload_prep;

/* The part of a reload that may block — reading the file, resolving proxy servers' names — on
 * any thread but the loop's (with auto_route on, the resolver's own queries go through the
 * proxy, so the loop must be free to carry them). Reads only what does not change while the
 * proxy runs. json NULL: the file the proxy was created from again. 0 and *out, or -errno with
 * one line in err (-EINVAL a bad config, -ENOENT no file to re-read, -ENXIO/-EAGAIN a proxy
 * server name that does not resolve). */
int reload_prepare(struct ts_proxy *p, const char *json, size_t len, struct reload_prep **out,
		   char *err, size_t errlen) __attribute__((warn_unused_result));
void reload_prep_free(struct reload_prep *r);

/* On the loop: apply r (taken over, freed) or, r NULL, record the failure prep_ret/prep_err of
 * reload_prepare. 0, or -errno with one line in err (-ELOOP: its traffic would loop). */
int proxy_reload(struct ts_proxy *p, struct reload_prep *r, int prep_ret, const char *prep_err,
		 char *err, size_t errlen);

/* config.generation and reload.* for /stats. */
void reload_stats(struct ts_proxy *p, struct stats_doc *d);

/* Free the configurations reloads left (at proxy teardown, after the dispatcher and the UDP
 * path are gone). */
void reload_fini(struct ts_proxy *p);

#endif
