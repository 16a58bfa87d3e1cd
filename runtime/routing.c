/* routing.c — route check, auto_route and the routing watch of one proxy (see routing.h). */
#include "runtime/routing.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/rtnetlink.h>

#include "core/stats_doc.h"
#include "core/tun.h"
#include "dispatch/udp.h"
#include "runtime/autoroute.h"
#include "runtime/proxy.h"
#include "runtime/routecheck.h"
#include "runtime/routewatch.h"

#define SERVERS_MAX 64

/* A change in the namespace's routing (main loop, after the watch's short delay). */
static void on_routes_changed(void *arg)
{
	struct ts_proxy *p = arg;
	int ret;

	if (p->ar) {
		ret = autoroute_reconcile(p->ar);
		if (ret > 0)
			p->route_repairs += (uint64_t)ret;
		else if (ret < 0)
			log_warn(&p->log, "auto_route: repair failed: %s", strerror(-ret));
	}
	(void)routecheck_scan(&p->rc, &p->nl, &p->log, false, NULL, 0);
	/* UDP flows in the kernel keep the uplink they joined with; the proxy's sockets follow
	 * the routes: back to the sockets, to join again on the new routes. */
	if (p->udp)
		udp_path_offload_reset(p->udp);
}

static void add_mark(struct autoroute_mark *m, size_t *n, size_t cap, uint32_t mark)
{
	struct autoroute_mark k = { mark, mark == TS_DEFAULT_MARK ? TS_DEFAULT_MARK_MASK : 0 };
	bool dup = false;

	for (size_t j = 0; j < *n; j++)
		dup |= m[j].mark == k.mark && m[j].mask == k.mask;
	if (!dup && *n < cap)
		m[(*n)++] = k;
}

/* The distinct marks of the proxy's own resolver (own, 0 none: it runs with the start's
 * default mark, whichever outbounds carry it) and of the outbounds; the default mark under
 * its mask, so that other software may use the low bits of a marked packet. cap: at least
 * TS_MAX_OUTBOUNDS + 1. */
static size_t collect_marks(const struct ts_config *cfg, uint32_t own, struct autoroute_mark *m,
			    size_t cap)
{
	size_t n = 0;

	if (own)
		add_mark(m, &n, cap, own);
	for (size_t i = 0; i < cfg->n_outbounds; i++)
		if (cfg->outbounds[i].has_routing_mark)
			add_mark(m, &n, cap, cfg->outbounds[i].routing_mark);
	return n;
}

/* Is the fake-IP range r outside the TUN's own prefix (so routed into the TUN by nothing but
 * routes of ours or the user's)? */
static bool fake_outside(const struct ts_proxy *p, const struct netaddr_cidr *r)
{
	const struct ts_tun *t = &p->cfg.tun;
	struct netaddr_cidr net = r->addr.family == 4 ? t->addr4 : t->addr6;

	if (!p->dns || !p->cfg.dns.fakeip.enabled || !r->addr.family ||
	    (r->addr.family == 6 && !t->has_addr6))
		return false;
	netaddr_cidr_normalize(&net);
	return !(r->prefix >= net.prefix && netaddr_in_cidr(&r->addr, &net));
}

/* auto_route's captured prefixes: tun.route_address, and with it the fake-IP ranges outside
 * the TUN's prefix (without route_address everything is captured already). *out: t's own
 * list, or an allocated one (*owned). */
static int route_list(const struct ts_proxy *p, const struct ts_tun *t,
		      const struct netaddr_cidr **out, size_t *n, struct netaddr_cidr **owned)
{
	const struct netaddr_cidr *fr[2] = { &p->cfg.dns.fakeip.range4, &p->cfg.dns.fakeip.range6 };
	struct netaddr_cidr *l;

	*out = t->route_address;
	*n = t->n_route_address;
	*owned = NULL;
	if (!t->n_route_address || (!fake_outside(p, fr[0]) && !fake_outside(p, fr[1])))
		return 0;
	if (!(l = calloc(t->n_route_address + 2, sizeof(*l))))
		return -ENOMEM;
	memcpy(l, t->route_address, t->n_route_address * sizeof(*l));
	for (int i = 0; i < 2; i++)
		if (fake_outside(p, fr[i]))
			l[(*n)++] = *fr[i];
	*out = *owned = l;
	return 0;
}

/* auto_route's options for cfg and its route check targets rc: installed anew (p->ar NULL) or
 * replacing p->ar's set make-before-break. */
static int apply_auto_route(struct ts_proxy *p, const struct ts_config *cfg,
			    const struct routecheck *rc, char *err, size_t errlen)
{
	const struct ts_tun *t = &cfg->tun;
	struct autoroute_mark marks[TS_MAX_OUTBOUNDS + 1];
	struct netaddr servers[SERVERS_MAX];
	struct autoroute_uid_range *inc = NULL, *exc = NULL;
	const char **ifs = NULL;
	const struct netaddr_cidr *ra;
	struct netaddr_cidr *ra_owned = NULL;
	size_t n_ra;
	int ret = -ENOMEM;

	if (route_list(p, t, &ra, &n_ra, &ra_owned) != 0 ||
	    (t->n_include_uid && !(inc = calloc(t->n_include_uid, sizeof(*inc)))) ||
	    (t->n_exclude_uid && !(exc = calloc(t->n_exclude_uid, sizeof(*exc)))) ||
	    (t->n_exclude_interface && !(ifs = calloc(t->n_exclude_interface, sizeof(*ifs))))) {
		snprintf(err, errlen, "auto_route: out of memory");
		goto out;
	}
	for (size_t i = 0; i < t->n_include_uid; i++)
		inc[i] = (struct autoroute_uid_range){ t->include_uid[i].lo, t->include_uid[i].hi };
	for (size_t i = 0; i < t->n_exclude_uid; i++)
		exc[i] = (struct autoroute_uid_range){ t->exclude_uid[i].lo, t->exclude_uid[i].hi };
	for (size_t i = 0; i < t->n_exclude_interface; i++)
		ifs[i] = t->exclude_interface[i];
	struct autoroute_opts o = {
		.tun_ifindex = tun_ifindex(p->tun),
		.tun_name = tun_name(p->tun),
		.has_addr4 = cfg->roles4.family == 4,
		.has_addr6 = t->has_addr6,
		.strict = t->strict_route,
		.dns_hijack = cfg->dns.hijack,
		.dns_capture = p->dns != NULL, /* the resolver runs from the start configuration */
		.table = t->route_table,
		.priority = t->route_rule_priority,
		.route_address = ra,
		.n_route_address = n_ra,
		.exclude = t->route_exclude_address,
		.n_exclude = t->n_route_exclude_address,
		.include_uid = inc,
		.n_include_uid = t->n_include_uid,
		.exclude_uid = exc,
		.n_exclude_uid = t->n_exclude_uid,
		.exclude_interface = ifs,
		.n_exclude_interface = t->n_exclude_interface,
		.marks = marks,
		.n_marks = collect_marks(cfg, p->resolver_mark, marks, TS_MAX_OUTBOUNDS + 1),
		.servers = servers,
		.n_servers = routecheck_servers(rc, servers, SERVERS_MAX),
		.has_lock = p->lock_keep >= 0,
		.lock_fd = p->lock_keep,
	};
	if (p->ar)
		ret = autoroute_replace(p->ar, &o, err, errlen);
	else
		ret = autoroute_new(&o, &p->log, &p->ar, err, errlen);
out:
	free(ra_owned);
	free(inc);
	free(exc);
	free(ifs);
	return ret;
}

/* A fake-IP range outside the TUN's prefix must be routed into the TUN (auto_route adds it;
 * without auto_route, the user's routes must): else connections to fake addresses would leave
 * by another interface. One route lookup per range, of its first address, carrying mark (0:
 * none; else the stand-in for none of autoroute_bypass_begin). */
static int check_fake_routes(struct ts_proxy *p, uint32_t mark, char *err, size_t errlen)
{
	const struct netaddr_cidr *fr[2] = { &p->cfg.dns.fakeip.range4, &p->cfg.dns.fakeip.range6 };
	char a[NETADDR_CIDR_STRLEN];

	for (int i = 0; i < 2; i++) {
		struct netlink_route r;
		struct netaddr first;
		int ret;
		if (!fake_outside(p, fr[i]))
			continue;
		if (netaddr_add(&fr[i]->addr, 1, &first) != 0)
			continue;
		ret = netlink_route_get_ex(&p->nl, &first, mark, 0, &r);
		if (ret == 0 && r.type == RTN_UNICAST && r.oif == tun_ifindex(p->tun))
			continue;
		snprintf(err, errlen, "config: $.dns.fakeip.inet%d_range: %s is not routed into the TUN "
			 "(%s): route it there, or use tun.auto_route", i ? 6 : 4,
			 netaddr_cidr_format(fr[i], a, sizeof(a)),
			 ret ? strerror(-ret) : "a route lookup leaves by another interface");
		return -EINVAL;
	}
	return 0;
}

/* Without auto_route: what a killed proxy's auto_route left (a strict one's "unreachable"
 * routes cut a family off) goes too, unless a running proxy owns it. Never fails the start. */
static void sweep_auto_route(struct ts_proxy *p)
{
	char why[TS_ERRLEN];
	int ret = autoroute_sweep(&p->log, why, sizeof(why));

	if (ret == -EBUSY)
		log_debug(&p->log, "auto_route: another proxy owns this namespace's rules");
	else if (ret < 0)
		log_warn(&p->log, "%s", why);
}

int routing_start(struct ts_proxy *p, char *err, size_t errlen)
{
	int ret;

	/* Names first: with auto_route installed, the resolver's own packets would be
	 * captured. */
	if ((ret = routecheck_init(&p->rc, &p->cfg, tun_ifindex(p->tun), err, errlen)) != 0)
		return ret;
	routecheck_pin(&p->rc, &p->cfg);
	if ((ret = netlink_open(&p->nl)) != 0) {
		snprintf(err, errlen, "proxy: netlink: %s", strerror(-ret));
		return ret;
	}
	p->nl_open = true;
	if (p->cfg.tun.auto_route && (ret = apply_auto_route(p, &p->cfg, &p->rc, err, errlen)) != 0)
		return ret;
	if (!p->cfg.tun.auto_route)
		sweep_auto_route(p);
	if ((ret = routecheck_scan(&p->rc, &p->nl, &p->log, true, err, errlen)) < 0)
		return ret;
	if ((ret = check_fake_routes(p, 0, err, errlen)) != 0)
		return ret;
	if ((ret = routewatch_new(p->base, on_routes_changed, p, &p->rw)) != 0) {
		snprintf(err, errlen, "proxy: routing watch: %s", strerror(-ret));
		return ret;
	}
	return 0;
}

/* Does auto_route need its rules built again for n (options, marks or servers changed)? */
static bool auto_route_changed(const struct ts_config *o, const struct ts_config *n,
			       const struct routecheck *orc, const struct routecheck *nrc)
{
	const struct ts_tun *a = &o->tun, *b = &n->tun;
	struct autoroute_mark ma[TS_MAX_OUTBOUNDS + 1], mb[TS_MAX_OUTBOUNDS + 1];
	struct netaddr sa[SERVERS_MAX], sb[SERVERS_MAX];
	size_t nma, nmb, nsa, nsb;

#define LIST_DIFF(f, nf) \
	(a->nf != b->nf || (a->nf && memcmp(a->f, b->f, a->nf * sizeof(*a->f)) != 0))
	if (a->auto_route != b->auto_route || a->strict_route != b->strict_route ||
	    a->route_table != b->route_table || a->route_rule_priority != b->route_rule_priority ||
	    LIST_DIFF(route_address, n_route_address) ||
	    LIST_DIFF(route_exclude_address, n_route_exclude_address) ||
	    LIST_DIFF(include_uid, n_include_uid) || LIST_DIFF(exclude_uid, n_exclude_uid) ||
	    LIST_DIFF(exclude_interface, n_exclude_interface))
		return true;
#undef LIST_DIFF
	nma = collect_marks(o, 0, ma, TS_MAX_OUTBOUNDS + 1);
	nmb = collect_marks(n, 0, mb, TS_MAX_OUTBOUNDS + 1);
	nsa = routecheck_servers(orc, sa, SERVERS_MAX);
	nsb = routecheck_servers(nrc, sb, SERVERS_MAX);
	return nma != nmb || memcmp(ma, mb, nma * sizeof(*ma)) != 0 || nsa != nsb ||
	       memcmp(sa, sb, nsa * sizeof(*sa)) != 0;
}

static void drop_lock_keep(struct ts_proxy *p)
{
	if (p->lock_keep >= 0)
		close(p->lock_keep);
	p->lock_keep = -1;
}

/* The counts and the looping state of targets that did not change go on across a reload. */
static void carry_history(struct routecheck *n, const struct routecheck *o)
{
	n->episodes = o->episodes;
	for (size_t i = 0; i < n->n && i < o->n; i++) {
		const struct routecheck_target *a = &o->t[i];
		struct routecheck_target *b = &n->t[i];
		if (a->active == b->active && a->mark == b->mark && a->n_dst == b->n_dst &&
		    strcmp(a->oif_name, b->oif_name) == 0 &&
		    memcmp(a->dst, b->dst, sizeof(a->dst)) == 0)
			b->looping = a->looping;
	}
}

/* auto_route from the rules of from to those of to (its route check targets to_rc): replaced
 * make-before-break when both have it; installed when only to has it (with the namespace kept
 * in p->lock_keep, if any); removed when only from has it (a reload whose checks could not
 * look past the rules, or its undo), the namespace kept in p->lock_keep so that no other proxy
 * steps in before the reload is done. On a failure p->ar is as before. */
static int switch_auto_route(struct ts_proxy *p, const struct ts_config *from,
			     const struct ts_config *to, const struct routecheck *to_rc, char *err,
			     size_t errlen)
{
	if (to->tun.auto_route)
		return apply_auto_route(p, to, to_rc, err, errlen);
	if (from->tun.auto_route && p->ar) {
		if ((p->lock_keep = autoroute_lock_dup(p->ar)) < 0)
			p->lock_keep = -1;
		autoroute_free(p->ar);
		p->ar = NULL;
	}
	return 0;
}

/* The checks of a reload that turns auto_route off (rc: the route check of its outbounds; the
 * fake-IP ranges), made while p->ar's rules stay in place and see the namespace as if they
 * were gone (autoroute_bypass_begin): what they capture never leaves by the uplink while the
 * reload is checked, nor when it is refused. *beside false: that could not be arranged (the
 * reason logged), nothing was checked and the rules are as they were. 0 or -errno with one line
 * in err. */
static int check_beside_rules(struct ts_proxy *p, struct routecheck *rc, bool *beside, char *err,
			      size_t errlen)
{
	uint32_t marks[TS_MAX_OUTBOUNDS], unmarked;
	char why[TS_ERRLEN];
	size_t n = 0;
	int ret;

	*beside = false;
	for (size_t i = 0; i < rc->n && i < TS_MAX_OUTBOUNDS; i++)
		if (rc->t[i].active && rc->t[i].mark)
			marks[n++] = rc->t[i].mark;
	if ((ret = autoroute_bypass_begin(p->ar, marks, n, &unmarked, why, sizeof(why))) != 0) {
		if (ret == -ENOENT)
			log_debug(&p->log, "%s: the rules go before the checks", why);
		else
			log_warn(&p->log, "%s: the rules go before the checks", why);
		return 0;
	}
	*beside = true;
	rc->unmarked_mark = unmarked;
	ret = routecheck_scan(rc, &p->nl, &p->log, true, err, errlen);
	rc->unmarked_mark = 0;
	if (ret >= 0)
		ret = check_fake_routes(p, unmarked, err, errlen);
	autoroute_bypass_end(p->ar);
	return ret < 0 ? ret : 0;
}

int routing_reload(struct ts_proxy *p, const struct ts_config *old, const struct ts_config *n,
		   struct routecheck *nrc, char *err, size_t errlen)
{
	struct routecheck rc = *nrc;
	char why[TS_ERRLEN];
	bool redo, beside = false;
	int ret;

	memset(nrc, 0, sizeof(*nrc)); /* ours now */
	redo = auto_route_changed(old, n, &p->rc, &rc);
	/* auto_route off now: its rules stay while the reload is checked and go once it is
	 * accepted. */
	if (redo && !n->tun.auto_route && p->ar &&
	    (ret = check_beside_rules(p, &rc, &beside, err, errlen)) != 0)
		goto refuse;
	if (beside) {
		autoroute_free(p->ar);
		p->ar = NULL;
		goto accept;
	}
	/* A failure here leaves the running rules as they were. */
	if (redo && (ret = switch_auto_route(p, old, n, &rc, err, errlen)) != 0)
		goto refuse;
	if ((ret = routecheck_scan(&rc, &p->nl, &p->log, true, err, errlen)) < 0)
		goto undo;
	/* auto_route off now (its rules already gone, when they could not be looked past): the
	 * fake-IP ranges its routes led into the TUN must still get there, as a start without it
	 * requires (the running resolver keeps its ranges). */
	if (redo && !n->tun.auto_route && (ret = check_fake_routes(p, 0, err, errlen)) != 0)
		goto undo;
accept:
	carry_history(&rc, &p->rc);
	routecheck_fini(&p->rc);
	p->rc = rc;
	drop_lock_keep(p);
	if (redo && n->tun.auto_route)
		log_info(&p->log, "auto_route: rules rebuilt for the new configuration");
	else if (redo && old->tun.auto_route)
		log_info(&p->log, "auto_route: rules removed (off in the new configuration)");
	return 0;
undo:
	/* Back to the old rules, make-before-break again where both configurations have them. */
	if (redo && switch_auto_route(p, n, old, &p->rc, why, sizeof(why)) != 0) {
		/* Running on without the rules the running configuration asks for would leak
		 * what it promised to capture: stop, saying why. */
		log_error(&p->log, "auto_route: the old rules could not be put back: %s; stopping",
			  why);
		proxy_stop_loop(p, -EIO);
	}
refuse:
	drop_lock_keep(p);
	routecheck_fini(&rc);
	return ret;
}

void routing_stop(struct ts_proxy *p)
{
	routewatch_free(p->rw);
	p->rw = NULL;
	autoroute_free(p->ar);
	p->ar = NULL;
	if (p->nl_open)
		netlink_close(&p->nl);
	p->nl_open = false;
	routecheck_fini(&p->rc);
}

void routing_stats(struct ts_proxy *p, struct stats_doc *d)
{
	stats_doc_counter(d, "routes.loop_risk", p->rc.episodes);
	stats_doc_gauge(d, "routes.looping_outbounds", p->rc.looping_now);
	stats_doc_counter(d, "routes.auto_route_repairs", p->route_repairs);
	stats_doc_counter(d, "routes.changes_seen", p->rw ? routewatch_events(p->rw) : 0);
}
