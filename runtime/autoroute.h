/* autoroute.h — tun.auto_route / tun.strict_route: the policy rules and the routing table that
 * send the host's traffic into the TUN while the proxy's own traffic (and whatever the user
 * excludes) keeps using the system's routes.
 *
 * Per family, with P the base priority and T the table (every rule and route carries protocol
 * AUTOROUTE_PROTO, the tag that tells ours apart):
 *   P+0  fwmark M/mask goto P+19      one per distinct outbound mark (the proxy's own sockets)
 *   P+1  uidrange a-b goto P+19       excluded uids
 *   P+2  iif NAME goto P+19           excluded interfaces
 *   P+3  ipproto udp|tcp dport 53 lookup T   strict + DNS hijack: DNS captured before the
 *                                     address exclusions (a LAN resolver included)
 *   P+4  to CIDR goto P+19            excluded addresses, the proxy servers' addresses and the
 *                                     uplink gateways (main table's default routes)
 *   P+5  lookup main suppress_prefixlength 0   non-strict only: LAN/connected routes win
 *   P+6  [uidrange a-b] lookup T      capture: included uid ranges, or everything
 *   P+19 nop                          the goto target: after it the system rules (main,
 *                                     default) decide, as if our rules were not there
 * While a reload that turns auto_route off is checked, P+0 may hold temporary
 * "fwmark M goto P+19" rules too (autoroute_bypass_begin).
 * Table T: each route_address CIDR dev TUN; when the TUN has no address of a family but strict
 * is on, the family's CIDRs are "unreachable" instead (fails fast instead of leaking).
 *
 * The rule set is computed by a pure function (autoroute_plan) from the options and the current
 * uplink gateways; autoroute_new applies it through core/netlink.h, autoroute_reconcile brings
 * the kernel back to it, autoroute_replace moves it to new options make-before-break (a reload),
 * autoroute_free removes it. One owner per network namespace: the abstract unix socket name
 * @twinstack-autoroute (abstract names are per network namespace and vanish with their holder,
 * however it dies) is held for the object's lifetime, so every tagged rule or route found while
 * nobody else holds it belongs to a dead process: autoroute_new removes it, and so does
 * autoroute_sweep (a start without auto_route, `twinstack cleanup`).
 *
 * Not thread-safe: one thread calls reconcile and free (the main loop).
 */
#ifndef TS_RUNTIME_AUTOROUTE_H
#define TS_RUNTIME_AUTOROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/log.h"
#include "core/netaddr.h"
#include "core/netlink.h"

#define AUTOROUTE_PROTO 116             /* rtm_protocol / FRA_PROTOCOL of everything we add */
#define AUTOROUTE_DEFAULT_TABLE 29811
#define AUTOROUTE_DEFAULT_PRIORITY 8700
#define AUTOROUTE_PRIO_SPAN 20          /* priorities used: P .. P+19 */
#define AUTOROUTE_PRIORITY_MAX 32000    /* P+19 stays below main's 32766 */
#define AUTOROUTE_GW_MAX 8              /* uplink gateways followed per namespace */

struct autoroute_uid_range {
	uint32_t start, end; /* inclusive */
};

struct autoroute_mark {
	uint32_t mark, mask; /* mask 0 = exact (0xffffffff); mark 0 is ignored (unmarked) */
};

/* Borrowed by autoroute_new (copied; the caller's arrays may go away afterwards). */
struct autoroute_opts {
	int tun_ifindex;
	const char *tun_name;
	bool has_addr4, has_addr6;   /* the TUN's addresses */
	bool strict;                 /* strict_route */
	bool dns_hijack;             /* with strict or dns_capture: the P+3 DNS rules */
	bool dns_capture;            /* the own resolver answers DNS: P+3 without strict too */
	uint32_t table;              /* 0 = AUTOROUTE_DEFAULT_TABLE */
	uint32_t priority;           /* 0 = AUTOROUTE_DEFAULT_PRIORITY */
	const struct netaddr_cidr *route_address; /* n = 0: 0.0.0.0/0 and ::/0 */
	size_t n_route_address;
	const struct netaddr_cidr *exclude;
	size_t n_exclude;
	const struct autoroute_uid_range *include_uid;
	size_t n_include_uid;
	const struct autoroute_uid_range *exclude_uid;
	size_t n_exclude_uid;
	const char *const *exclude_interface;
	size_t n_exclude_interface;
	const struct autoroute_mark *marks;    /* the outbounds' effective marks */
	size_t n_marks;
	const struct netaddr *servers;         /* proxy servers' addresses: always excluded */
	size_t n_servers;
	/* The namespace's ownership already held (autoroute_lock_dup of the set this one
	 * replaces): used instead of taking it, so no other proxy can step in between. */
	bool has_lock;
	int lock_fd;
};

/* One element of the plan: a rule or a route, in install order. */
enum autoroute_step_kind { AUTOROUTE_RULE, AUTOROUTE_ROUTE };

struct autoroute_step {
	enum autoroute_step_kind kind;
	union {
		struct netlink_rule rule;
		struct netlink_rt route;
	};
};

/* Check the options (table, priority range, names, families). 0, or -EINVAL with a one-line
 * reason starting "auto_route: " in err. */
int autoroute_opts_check(const struct autoroute_opts *o, char *err, size_t errlen) NETLINK_WUR;

/* The rules and routes for o with the uplink gateways gw[0..n_gw), in install order (routes,
 * then per family the nop, the exclusions, the capture rules last); removal is the reverse.
 * Duplicates are dropped. Writes at most cap steps and returns how many the plan has; when
 * that is more than cap, call again with that many (the second answer is <= the first). Pure:
 * o must have passed autoroute_opts_check. */
size_t autoroute_plan(const struct autoroute_opts *o, const struct netaddr *gw, size_t n_gw,
		      struct autoroute_step *out, size_t cap);

/* One line like "ipv4 rule 8704: to 10.0.0.0/8 goto 8719" or "ipv6 route unreachable ::/0
 * table 29811". Returns buf. */
char *autoroute_step_format(const struct autoroute_step *s, char *buf, size_t len);

struct autoroute;

/* Take the namespace's lock, remove stale tagged rules/routes, install the plan, adjust the
 * TUN's rp_filter (strict). On failure nothing of ours stays installed and err holds one line
 * starting "auto_route: "; -EBUSY when another process holds the lock. 0 or -errno. */
int autoroute_new(const struct autoroute_opts *o, struct log *lg, struct autoroute **out,
		  char *err, size_t errlen) NETLINK_WUR;

/* Compare the kernel with the plan (re-reading the uplink gateways): re-add what is missing,
 * remove tagged leftovers (a gateway that is no longer one). Returns the number of changes made
 * (0 = all was in place), or -errno of the first failure (the others are still attempted). */
int autoroute_reconcile(struct autoroute *ar) NETLINK_WUR;

/* Move ar to the rule set of o (the same TUN; ar keeps the namespace throughout), make before
 * break: the steps of o's plan that the kernel lacks are added first, in install order, then
 * the tagged steps the plan does not hold are removed, capture rules first. While both sets
 * are in, traffic that both capture is captured (an exclusion of either may apply meanwhile).
 * When an add fails, what this call added is taken back: the kernel and ar are as before and
 * err holds one line starting "auto_route: ". A removal that fails is logged and left to the
 * next reconcile. 0 or -errno. */
int autoroute_replace(struct autoroute *ar, const struct autoroute_opts *o, char *err,
		      size_t errlen) NETLINK_WUR;

/* Remove every tagged rule and route of the namespace if no process owns it (they are a dead
 * proxy's), holding the ownership meanwhile. Returns how many were removed (0: none left),
 * -EBUSY when a running proxy owns the namespace (nothing touched), or -errno of the first
 * failure; err then holds one line starting "auto_route: ". */
int autoroute_sweep(struct log *lg, char *err, size_t errlen) NETLINK_WUR;

/* Let route lookups see the namespace as if ar's rules were not there while they stay in
 * place (a reload that turns auto_route off is checked before they go). A lookup whose mark ar's
 * set exempts (P+0, goto P+19) meets no rule of ours that decides anything; so each of
 * marks[0..n_marks) that the set does not exempt gets a temporary exemption, a tagged rule
 * "fwmark M goto P+19" at P+0, and a lookup meant to be unmarked is to carry *unmarked
 * instead: a non-zero mark that no rule of another owner tells from none (rules dumped now;
 * one the set exempts already when one qualifies, so that usually nothing is added), exempted
 * the same way. Meanwhile packets that carry one of these marks are not captured either.
 * 0; -ENOENT when every mark is told from none (nothing added, *unmarked 0); another -errno when
 * the rules could not be read or an exemption not added (what was added is taken back); err
 * then holds one line starting "auto_route: ". Undone by autoroute_bypass_end (and by
 * autoroute_free). */
int autoroute_bypass_begin(struct autoroute *ar, const uint32_t *marks, size_t n_marks,
			   uint32_t *unmarked, char *err, size_t errlen) NETLINK_WUR;

/* Remove the temporary exemptions of autoroute_bypass_begin. One that cannot be removed is
 * logged, and removed by autoroute_free or the next reconcile. No-op without a bypass. */
void autoroute_bypass_end(struct autoroute *ar);

/* A second descriptor of ar's ownership of the namespace (close-on-exec), for the set that
 * replaces it (autoroute_opts.has_lock): the ownership lasts while either is open. -errno on
 * failure. */
int autoroute_lock_dup(const struct autoroute *ar);

/* Remove everything installed (capture rules first), restore rp_filter if the TUN still
 * exists, release the lock. NULL is a no-op. */
void autoroute_free(struct autoroute *ar);

#endif
