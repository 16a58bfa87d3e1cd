/* autoroute.c — tun.auto_route / strict_route: plan, install, reconcile, look past (a reload's
 * checks) and remove the policy rules and routes (see autoroute.h for the rule set). The plan is pure data; everything that
 * talks to the kernel goes through core/netlink.h, never through ip(8).
 */
#include "runtime/autoroute.h"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/sysfile.h"

#define LOCK_NAME "twinstack-autoroute" /* abstract unix socket: one per namespace */
#define DUMP_TRIES 4           /* a dump interrupted by a concurrent change is asked again */
#define LOCK_TRIES 10          /* binds of the lock name at start: a sweep holds it a moment */
#define LOCK_RETRY_US 10000
#define TABLE_MAIN 254
#define IPPROTO_TCP_NUM 6
#define IPPROTO_UDP_NUM 17
#define RPF_ALL "/proc/sys/net/ipv4/conf/all/rp_filter"

struct autoroute {
	struct log *log;
	struct autoroute_opts o; /* a deep copy: the arrays below are ours */
	char tun_name[NETLINK_IFNAMSIZ];
	char (*ifnames)[NETLINK_IFNAMSIZ];
	const char **ifname_ptrs;
	struct netlink nl;
	int lock_fd;
	struct autoroute_step *steps; /* installed, in install order */
	size_t n_steps;
	struct netaddr gw[AUTOROUTE_GW_MAX]; /* the gateways the plan excludes */
	size_t n_gw;
	int rpf_old; /* the TUN's rp_filter before we changed it; -1: untouched */
	struct autoroute_step *temp; /* a bypass's temporary exemptions, installed */
	size_t n_temp;
	bool owner; /* installed, holding the namespace: every tagged item in it is ours */
};

/* ---- options ---- */

static uint32_t eff_table(const struct autoroute_opts *o)
{
	return o->table ? o->table : AUTOROUTE_DEFAULT_TABLE;
}

static uint32_t eff_prio(const struct autoroute_opts *o)
{
	return o->priority ? o->priority : AUTOROUTE_DEFAULT_PRIORITY;
}

static const struct netaddr_cidr default_routes[2] = {
	{ .addr = { .family = 4 }, .prefix = 0 },
	{ .addr = { .family = 6 }, .prefix = 0 },
};

static const struct netaddr_cidr *route_cidrs(const struct autoroute_opts *o, size_t *n)
{
	*n = o->n_route_address ? o->n_route_address : 2;
	return o->n_route_address ? o->route_address : default_routes;
}

static bool cidr_valid(const struct netaddr_cidr *c)
{
	return (c->addr.family == 4 && c->prefix <= 32) ||
	       (c->addr.family == 6 && c->prefix <= 128);
}

/* A family gets rules when route_address has CIDRs of it and the TUN has an address of it (or
 * strict: then the CIDRs are unreachable). */
static bool family_planned(const struct autoroute_opts *o, uint8_t fam)
{
	size_t n, i;
	const struct netaddr_cidr *c = route_cidrs(o, &n);
	bool has = fam == 4 ? o->has_addr4 : o->has_addr6;

	if (!has && !o->strict)
		return false;
	for (i = 0; i < n; i++)
		if (c[i].addr.family == fam)
			return true;
	return false;
}

static bool name_valid(const char *s)
{
	size_t n = s ? strnlen(s, NETLINK_IFNAMSIZ) : 0;

	return n > 0 && n < NETLINK_IFNAMSIZ && !strchr(s, '/') && strcmp(s, ".") != 0 &&
	       strcmp(s, "..") != 0;
}

static bool cidrs_valid(const struct netaddr_cidr *c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!cidr_valid(&c[i]))
			return false;
	return true;
}

static bool uids_valid(const struct autoroute_uid_range *u, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (u[i].start > u[i].end)
			return false;
	return true;
}

int autoroute_opts_check(const struct autoroute_opts *o, char *err, size_t errlen)
{
	uint32_t t = eff_table(o), p = eff_prio(o);
	const char *why = NULL;
	size_t i;

	if (o->tun_ifindex <= 0 || !name_valid(o->tun_name))
		why = "no TUN interface (name and index)";
	else if (t > 0xfffffff0u || t == 253 || t == 254 || t == 255)
		why = "route_table must be 1..4294967280 and not 253, 254 or 255";
	else if (p > AUTOROUTE_PRIORITY_MAX)
		why = "route_rule_priority must be 1..32000";
	else if (!cidrs_valid(o->route_address, o->n_route_address) ||
		 !cidrs_valid(o->exclude, o->n_exclude))
		why = "an address prefix is not IPv4/0-32 or IPv6/0-128";
	else if (!uids_valid(o->include_uid, o->n_include_uid) ||
		 !uids_valid(o->exclude_uid, o->n_exclude_uid))
		why = "a uid range ends before it starts";
	else if (!family_planned(o, 4) && !family_planned(o, 6))
		why = "nothing to route: the TUN has no address of route_address's families";
	for (i = 0; !why && i < o->n_exclude_interface; i++)
		if (!name_valid(o->exclude_interface[i]))
			why = "exclude_interface: not an interface name";
	for (i = 0; !why && i < o->n_servers; i++)
		if (o->servers[i].family != 4 && o->servers[i].family != 6)
			why = "a server address is not IPv4 or IPv6";
	if (!why)
		return 0;
	snprintf(err, errlen, "auto_route: %s", why);
	return -EINVAL;
}

/* ---- the plan (pure) ---- */

static bool addr_prefix_eq(uint8_t fam, const struct netaddr *a, const struct netaddr *b,
			   uint8_t len)
{
	struct netaddr_cidr x = { *a, len }, y = { *b, len };

	x.addr.family = y.addr.family = fam;
	netaddr_cidr_normalize(&x);
	netaddr_cidr_normalize(&y);
	return memcmp(x.addr.a, y.addr.a, 16) == 0;
}

static bool rule_same(const struct netlink_rule *a, const struct netlink_rule *b)
{
	if (a->family != b->family || a->action != b->action || a->priority != b->priority ||
	    a->protocol != b->protocol || a->invert != b->invert)
		return false;
	if ((a->action == NETLINK_RULE_LOOKUP && a->table != b->table) ||
	    (a->action == NETLINK_RULE_GOTO && a->target != b->target))
		return false;
	if (a->has_fwmark != b->has_fwmark ||
	    (a->has_fwmark && (a->fwmark != b->fwmark || a->fwmask != b->fwmask)))
		return false;
	if (a->has_uid != b->has_uid ||
	    (a->has_uid && (a->uid_start != b->uid_start || a->uid_end != b->uid_end)))
		return false;
	if (strncmp(a->iifname, b->iifname, NETLINK_IFNAMSIZ) != 0 || a->ip_proto != b->ip_proto ||
	    a->dport_start != b->dport_start || a->dport_end != b->dport_end ||
	    a->suppress_prefixlen != b->suppress_prefixlen)
		return false;
	return a->dst_len == b->dst_len &&
	       (a->dst_len == 0 || addr_prefix_eq(a->family, &a->dst, &b->dst, a->dst_len));
}

static bool route_same(const struct netlink_rt *a, const struct netlink_rt *b)
{
	if (a->family != b->family || a->type != b->type || a->table != b->table ||
	    a->protocol != b->protocol || a->dst_len != b->dst_len)
		return false;
	if (a->type == NETLINK_RT_UNICAST && a->oif != b->oif)
		return false;
	return a->dst_len == 0 || addr_prefix_eq(a->family, &a->dst, &b->dst, a->dst_len);
}

static bool step_same(const struct autoroute_step *a, const struct autoroute_step *b)
{
	if (a->kind != b->kind)
		return false;
	return a->kind == AUTOROUTE_RULE ? rule_same(&a->rule, &b->rule)
					 : route_same(&a->route, &b->route);
}

static bool steps_contain(const struct autoroute_step *v, size_t n, const struct autoroute_step *s)
{
	for (size_t i = 0; i < n; i++)
		if (step_same(&v[i], s))
			return true;
	return false;
}

struct plan {
	const struct autoroute_opts *o;
	struct autoroute_step *out;
	size_t cap, n;
	uint32_t prio, table;
};

static void push(struct plan *p, const struct autoroute_step *s)
{
	if (steps_contain(p->out, p->n < p->cap ? p->n : p->cap, s))
		return;
	if (p->n < p->cap)
		p->out[p->n] = *s;
	p->n++;
}

static struct autoroute_step rule_step(const struct plan *p, uint8_t fam, uint32_t off,
				       uint8_t action)
{
	struct autoroute_step s = { .kind = AUTOROUTE_RULE };

	netlink_rule_init(&s.rule, fam);
	s.rule.priority = p->prio + off;
	s.rule.action = action;
	s.rule.protocol = AUTOROUTE_PROTO;
	if (action == NETLINK_RULE_GOTO)
		s.rule.target = p->prio + AUTOROUTE_PRIO_SPAN - 1;
	if (action == NETLINK_RULE_LOOKUP)
		s.rule.table = p->table;
	return s;
}

static void set_dst(struct netaddr *dst, uint8_t *len, const struct netaddr_cidr *c)
{
	struct netaddr_cidr n = *c;

	netaddr_cidr_normalize(&n);
	*dst = n.addr;
	*len = n.prefix;
}

static void plan_routes(struct plan *p, uint8_t fam)
{
	const struct autoroute_opts *o = p->o;
	bool has = fam == 4 ? o->has_addr4 : o->has_addr6;
	size_t n, i;
	const struct netaddr_cidr *c = route_cidrs(o, &n);

	for (i = 0; i < n; i++) {
		struct autoroute_step s = { .kind = AUTOROUTE_ROUTE };
		if (c[i].addr.family != fam)
			continue;
		s.route.family = fam;
		s.route.type = has ? NETLINK_RT_UNICAST : NETLINK_RT_UNREACHABLE;
		s.route.protocol = AUTOROUTE_PROTO;
		s.route.table = p->table;
		s.route.oif = has ? o->tun_ifindex : 0;
		set_dst(&s.route.dst, &s.route.dst_len, &c[i]);
		push(p, &s);
	}
}

static void plan_exclude_to(struct plan *p, uint8_t fam, const struct netaddr_cidr *c)
{
	struct autoroute_step s;

	if (c->addr.family != fam)
		return;
	s = rule_step(p, fam, 4, NETLINK_RULE_GOTO);
	set_dst(&s.rule.dst, &s.rule.dst_len, c);
	if (s.rule.dst_len == 0)
		s.rule.dst.family = 0; /* "to all": no selector, as the kernel reports it */
	push(p, &s);
}

static void plan_host_exclusions(struct plan *p, uint8_t fam, const struct netaddr *gw,
				 size_t n_gw)
{
	const struct autoroute_opts *o = p->o;
	size_t i;

	for (i = 0; i < o->n_exclude; i++)
		plan_exclude_to(p, fam, &o->exclude[i]);
	for (i = 0; i < o->n_servers; i++) {
		struct netaddr_cidr c = { o->servers[i], o->servers[i].family == 4 ? 32 : 128 };
		plan_exclude_to(p, fam, &c);
	}
	for (i = 0; i < n_gw; i++) {
		struct netaddr_cidr c = { gw[i], gw[i].family == 4 ? 32 : 128 };
		plan_exclude_to(p, fam, &c);
	}
}

/* P+0 .. P+3: marks, uids, interfaces, DNS. */
static void plan_selectors(struct plan *p, uint8_t fam)
{
	const struct autoroute_opts *o = p->o;
	struct autoroute_step s;
	size_t i;

	for (i = 0; i < o->n_marks; i++) {
		if (o->marks[i].mark == 0)
			continue;
		s = rule_step(p, fam, 0, NETLINK_RULE_GOTO);
		s.rule.has_fwmark = true;
		s.rule.fwmark = o->marks[i].mark;
		s.rule.fwmask = o->marks[i].mask ? o->marks[i].mask : 0xffffffffu;
		push(p, &s);
	}
	for (i = 0; i < o->n_exclude_uid; i++) {
		s = rule_step(p, fam, 1, NETLINK_RULE_GOTO);
		s.rule.has_uid = true;
		s.rule.uid_start = o->exclude_uid[i].start;
		s.rule.uid_end = o->exclude_uid[i].end;
		push(p, &s);
	}
	for (i = 0; i < o->n_exclude_interface; i++) {
		s = rule_step(p, fam, 2, NETLINK_RULE_GOTO);
		snprintf(s.rule.iifname, sizeof(s.rule.iifname), "%s", o->exclude_interface[i]);
		push(p, &s);
	}
	if ((o->strict || o->dns_capture) && o->dns_hijack) {
		static const uint8_t protos[2] = { IPPROTO_UDP_NUM, IPPROTO_TCP_NUM };
		for (i = 0; i < 2; i++) {
			s = rule_step(p, fam, 3, NETLINK_RULE_LOOKUP);
			s.rule.ip_proto = protos[i];
			s.rule.dport_start = s.rule.dport_end = 53;
			push(p, &s);
		}
	}
}

static void plan_rules(struct plan *p, uint8_t fam, const struct netaddr *gw, size_t n_gw)
{
	const struct autoroute_opts *o = p->o;
	struct autoroute_step s;
	size_t i;

	s = rule_step(p, fam, AUTOROUTE_PRIO_SPAN - 1, NETLINK_RULE_NOP);
	push(p, &s); /* first: a goto whose target is missing is skipped, not followed */
	plan_selectors(p, fam);
	plan_host_exclusions(p, fam, gw, n_gw);
	if (!o->strict) {
		s = rule_step(p, fam, 5, NETLINK_RULE_LOOKUP);
		s.rule.table = TABLE_MAIN;
		s.rule.suppress_prefixlen = 0;
		push(p, &s);
	}
	for (i = 0; i < o->n_include_uid; i++) {
		s = rule_step(p, fam, 6, NETLINK_RULE_LOOKUP);
		s.rule.has_uid = true;
		s.rule.uid_start = o->include_uid[i].start;
		s.rule.uid_end = o->include_uid[i].end;
		push(p, &s);
	}
	if (o->n_include_uid == 0) {
		s = rule_step(p, fam, 6, NETLINK_RULE_LOOKUP);
		push(p, &s);
	}
}

size_t autoroute_plan(const struct autoroute_opts *o, const struct netaddr *gw, size_t n_gw,
		      struct autoroute_step *out, size_t cap)
{
	struct plan p = { o, out, cap, 0, eff_prio(o), eff_table(o) };
	static const uint8_t fams[2] = { 4, 6 };
	size_t i;

	for (i = 0; i < 2; i++)
		if (family_planned(o, fams[i]))
			plan_routes(&p, fams[i]);
	for (i = 0; i < 2; i++)
		if (family_planned(o, fams[i]))
			plan_rules(&p, fams[i], gw, n_gw);
	return p.n;
}

/* ---- formatting ---- */

struct sbuf {
	char *buf;
	size_t len, off;
};

static void sb_add(struct sbuf *b, const char *fmt, ...) LOG_PRINTF(2, 3);

static void sb_add(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->off >= b->len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->buf + b->off, b->len - b->off, fmt, ap);
	va_end(ap);
	if (n > 0)
		b->off += (size_t)n;
}

static void format_rule(struct sbuf *b, const struct netlink_rule *r)
{
	char a[NETADDR_STRLEN];
	struct netaddr dst = r->dst;

	sb_add(b, "ipv%u rule %u:", r->family, r->priority);
	if (r->invert)
		sb_add(b, " not");
	dst.family = r->family;
	if (r->dst_len)
		sb_add(b, " to %s/%u", netaddr_format(&dst, a, sizeof(a)), r->dst_len);
	if (r->has_fwmark)
		sb_add(b, " fwmark 0x%x/0x%x", r->fwmark, r->fwmask);
	if (r->has_uid)
		sb_add(b, " uidrange %u-%u", r->uid_start, r->uid_end);
	if (r->iifname[0])
		sb_add(b, " iif %.*s", NETLINK_IFNAMSIZ, r->iifname);
	if (r->ip_proto)
		sb_add(b, " ipproto %u", r->ip_proto);
	if (r->dport_start || r->dport_end)
		sb_add(b, r->dport_start == r->dport_end ? " dport %u" : " dport %u-%u",
		       r->dport_start, r->dport_end);
	if (r->action == NETLINK_RULE_LOOKUP)
		sb_add(b, " lookup %u", r->table);
	else if (r->action == NETLINK_RULE_GOTO)
		sb_add(b, " goto %u", r->target);
	else if (r->action == NETLINK_RULE_NOP)
		sb_add(b, " nop");
	else
		sb_add(b, " action %u", r->action);
	if (r->suppress_prefixlen >= 0)
		sb_add(b, " suppress_prefixlength %d", r->suppress_prefixlen);
}

char *autoroute_step_format(const struct autoroute_step *s, char *buf, size_t len)
{
	struct sbuf b = { buf, len, 0 };
	char a[NETADDR_STRLEN];

	if (len)
		buf[0] = '\0';
	if (s->kind == AUTOROUTE_RULE) {
		format_rule(&b, &s->rule);
		return buf;
	}
	struct netaddr dst = s->route.dst;
	dst.family = s->route.family;
	sb_add(&b, "ipv%u route %s%s/%u", s->route.family,
	       s->route.type == NETLINK_RT_UNREACHABLE ? "unreachable " : "",
	       netaddr_format(&dst, a, sizeof(a)), s->route.dst_len);
	if (s->route.oif)
		sb_add(&b, " oif %d", s->route.oif);
	sb_add(&b, " table %u", s->route.table);
	return buf;
}

/* ---- kernel state ---- */

/* What a scan of the kernel found: our tagged rules and routes, the uplink gateways. */
struct scan {
	struct autoroute_step *v;
	size_t n, cap;
	int err;
	int tun_ifindex;
	struct netaddr gw[AUTOROUTE_GW_MAX];
	size_t n_gw;
	int uplink4[AUTOROUTE_GW_MAX]; /* IPv4 default routes' interfaces */
	size_t n_uplink4;
};

/* v (n items of size bytes, capacity *cap) with room for one more: v itself, or v moved to
 * twice the capacity (first at first); NULL without memory, v left as it was. */
static void *grow(void *v, size_t *cap, size_t n, size_t size, size_t first)
{
	size_t c;

	if (n < *cap)
		return v;
	c = *cap ? *cap * 2 : first;
	if (!(v = realloc(v, c * size)))
		return NULL;
	*cap = c;
	return v;
}

static void scan_push(struct scan *sc, const struct autoroute_step *s)
{
	struct autoroute_step *v = grow(sc->v, &sc->cap, sc->n, sizeof(*v), 32);

	if (!v) {
		sc->err = -ENOMEM;
		return;
	}
	sc->v = v;
	sc->v[sc->n++] = *s;
}

static void on_rule(void *arg, const struct netlink_rule *r)
{
	struct autoroute_step s = { .kind = AUTOROUTE_RULE };

	if (r->protocol != AUTOROUTE_PROTO)
		return;
	s.rule = *r;
	scan_push(arg, &s);
}

static void note_gateways(struct scan *sc, const struct netlink_rt *rt)
{
	size_t i, j;

	if (rt->table != TABLE_MAIN || rt->dst_len != 0 || rt->type != NETLINK_RT_UNICAST ||
	    rt->oif == sc->tun_ifindex)
		return;
	if (rt->family == 4 && rt->oif > 0 && sc->n_uplink4 < AUTOROUTE_GW_MAX)
		sc->uplink4[sc->n_uplink4++] = rt->oif;
	for (i = 0; i < rt->n_gw; i++) {
		for (j = 0; j < sc->n_gw && !netaddr_eq(&sc->gw[j], &rt->gw[i]); j++)
			;
		if (j == sc->n_gw && sc->n_gw < AUTOROUTE_GW_MAX)
			sc->gw[sc->n_gw++] = rt->gw[i];
	}
}

static void on_rt(void *arg, const struct netlink_rt *rt)
{
	struct scan *sc = arg;
	struct autoroute_step s = { .kind = AUTOROUTE_ROUTE };

	if (rt->protocol != AUTOROUTE_PROTO) {
		note_gateways(sc, rt);
		return;
	}
	s.route = *rt;
	s.route.n_gw = 0; /* ours have none; a delete must not carry them */
	scan_push(sc, &s);
}

static int scan_once(struct netlink *nl, struct scan *sc)
{
	static const uint8_t fams[2] = { 4, 6 };
	int ret;

	for (size_t i = 0; i < 2; i++) {
		if ((ret = netlink_rule_dump(nl, fams[i], on_rule, sc)) != 0 ||
		    (ret = netlink_rt_dump(nl, fams[i], on_rt, sc)) != 0)
			return ret;
	}
	return sc->err;
}

/* Dump rules and routes of both families; asked again when a change interrupted a dump. */
static int scan_kernel(struct netlink *nl, int tun_ifindex, struct scan *sc)
{
	int ret = -EAGAIN;

	for (int tries = 0; tries < DUMP_TRIES && ret == -EAGAIN; tries++) {
		sc->n = sc->n_gw = sc->n_uplink4 = 0;
		sc->err = 0;
		sc->tun_ifindex = tun_ifindex;
		ret = scan_once(nl, sc);
	}
	return ret;
}

static int apply(struct autoroute *ar, const struct autoroute_step *s, bool add)
{
	if (s->kind == AUTOROUTE_RULE)
		return add ? netlink_rule_add(&ar->nl, &s->rule)
			   : netlink_rule_del(&ar->nl, &s->rule);
	return add ? netlink_rt_add(&ar->nl, &s->route) : netlink_rt_del(&ar->nl, &s->route);
}

static bool gone(int ret)
{
	return ret == -ENOENT || ret == -ESRCH || ret == -ENODEV;
}

/* Removal order: capture rules, then gotos, then nops (so a goto never loses its target while
 * it can still match), then routes. */
static int removal_rank(const struct autoroute_step *s)
{
	if (s->kind == AUTOROUTE_ROUTE)
		return 3;
	return s->rule.action == NETLINK_RULE_GOTO ? 1 : s->rule.action == NETLINK_RULE_NOP ? 2 : 0;
}

/* Delete every tagged item of sc that the plan keep[0..n_keep) does not contain. Returns the
 * number deleted; *first_err gets the first failure. */
static int remove_extra(struct autoroute *ar, const struct scan *sc,
			const struct autoroute_step *keep, size_t n_keep, int *first_err)
{
	char what[160];
	int done = 0, ret;

	for (int rank = 0; rank <= 3; rank++) {
		for (size_t i = 0; i < sc->n; i++) {
			const struct autoroute_step *s = &sc->v[i];
			if (removal_rank(s) != rank || steps_contain(keep, n_keep, s))
				continue;
			ret = apply(ar, s, false);
			autoroute_step_format(s, what, sizeof(what));
			if (ret != 0 && !gone(ret)) {
				log_warn(ar->log, "auto_route: cannot remove %s: %s", what,
					 strerror(-ret));
				if (*first_err == 0)
					*first_err = ret;
				continue;
			}
			log_debug(ar->log, "auto_route: removed %s", what);
			done++;
		}
	}
	return done;
}

static void remove_installed(struct autoroute *ar)
{
	char what[160];

	while (ar->n_steps > 0) {
		const struct autoroute_step *s = &ar->steps[--ar->n_steps];
		int ret = apply(ar, s, false);
		if (ret != 0 && !gone(ret))
			log_warn(ar->log, "auto_route: cannot remove %s: %s",
				 autoroute_step_format(s, what, sizeof(what)), strerror(-ret));
	}
}

/* ---- lock, sysctls ---- */

/* The namespace's ownership: an abstract unix socket name, which exists per network namespace,
 * leaves no file behind and is released by the kernel when its holder dies (however). */
int autoroute_lock_dup(const struct autoroute *ar)
{
	int fd = fcntl(ar->lock_fd, F_DUPFD_CLOEXEC, 0);

	return fd >= 0 ? fd : -errno;
}

/* tries: binds of the name before another owner is assumed (a sweep holds it a moment). */
static int lock_take(struct autoroute *ar, int tries, char *err, size_t errlen)
{
	if (ar->o.has_lock) {
		if ((ar->lock_fd = fcntl(ar->o.lock_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
			int e = errno;
			snprintf(err, errlen, "auto_route: lock: %s", strerror(e));
			return -e;
		}
		return 0;
	}
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int fd, e;

	memcpy(sa.sun_path + 1, LOCK_NAME, sizeof(LOCK_NAME) - 1);
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + sizeof(LOCK_NAME) - 1);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		e = errno;
		snprintf(err, errlen, "auto_route: lock socket: %s", strerror(e));
		return -e;
	}
	for (int i = 1; bind(fd, (struct sockaddr *)&sa, len) != 0; i++) {
		e = errno;
		if (e == EADDRINUSE && i < tries) {
			usleep(LOCK_RETRY_US);
			continue;
		}
		close(fd);
		if (e == EADDRINUSE) {
			snprintf(err, errlen, "auto_route: another twinstack proxy manages routing "
				 "in this network namespace (it holds @%s)", LOCK_NAME);
			return -EBUSY;
		}
		snprintf(err, errlen, "auto_route: lock socket @%s: %s", LOCK_NAME, strerror(e));
		return -e;
	}
	ar->lock_fd = fd;
	return 0;
}

static int read_int(const char *path, int *v)
{
	char buf[32];
	int ret = sysfile_read_text(path, buf, sizeof(buf));

	if (ret != 0)
		return ret;
	return sscanf(buf, "%d", v) == 1 ? 0 : -EINVAL;
}

static int write_int(const char *path, int v)
{
	char buf[16];
	int n = snprintf(buf, sizeof(buf), "%d\n", v), fd, ret = 0;

	if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0)
		return -errno;
	if (write(fd, buf, (size_t)n) != n)
		ret = errno ? -errno : -EIO;
	close(fd);
	return ret;
}

static void rpf_path(char *buf, size_t len, const char *ifname)
{
	snprintf(buf, len, "/proc/sys/net/ipv4/conf/%s/rp_filter", ifname);
}

/* Strict: replies the proxy writes into the TUN come from addresses whose reverse lookup may
 * not lead back to the TUN (an excluded uid 0, say); strict reverse-path filtering (1) would
 * drop them, loose (2) does not. */
static void rpf_setup(struct autoroute *ar)
{
	char path[96];
	int all = 0, dev = 0, ret;

	if (!ar->o.strict || !ar->o.has_addr4)
		return;
	rpf_path(path, sizeof(path), ar->tun_name);
	if (read_int(RPF_ALL, &all) != 0 || read_int(path, &dev) != 0)
		return;
	if ((all > dev ? all : dev) != 1)
		return;
	if ((ret = write_int(path, 2)) != 0) {
		log_warn(ar->log, "auto_route: cannot set %s to 2: %s", path, strerror(-ret));
		return;
	}
	ar->rpf_old = dev;
	log_info(ar->log, "auto_route: %s: rp_filter 2 (loose) while running, was %d",
		 ar->tun_name, dev);
}

static void rpf_restore(struct autoroute *ar)
{
	char path[96];

	if (ar->rpf_old < 0)
		return;
	rpf_path(path, sizeof(path), ar->tun_name);
	if (access(path, F_OK) == 0 && write_int(path, ar->rpf_old) != 0)
		log_warn(ar->log, "auto_route: cannot restore %s", path);
	ar->rpf_old = -1;
}

/* The reverse-path check of a reply to direct traffic looks up its source without our mark,
 * which leads into the TUN: with strict filtering on the uplink the reply is dropped. */
static void rpf_warn_uplinks(struct autoroute *ar, const struct scan *sc)
{
	char name[IF_NAMESIZE], path[96];
	int all = 0, dev = 0;

	if (!family_planned(&ar->o, 4))
		return;
	(void)read_int(RPF_ALL, &all);
	for (size_t i = 0; i < sc->n_uplink4; i++) {
		if (!if_indextoname((unsigned)sc->uplink4[i], name))
			continue;
		rpf_path(path, sizeof(path), name);
		if (read_int(path, &dev) != 0 || (all > dev ? all : dev) != 1)
			continue;
		log_warn(ar->log, "auto_route: %s has strict reverse-path filtering (rp_filter 1): "
			 "replies to direct traffic may be dropped; set "
			 "net.ipv4.conf.%s.rp_filter=2", name, name);
	}
}

/* ---- the object ---- */

static void *memdup(const void *p, size_t n, size_t size, int *err)
{
	void *q;

	if (n == 0)
		return NULL;
	if (!(q = malloc(n * size))) {
		*err = -ENOMEM;
		return NULL;
	}
	memcpy(q, p, n * size);
	return q;
}

static int copy_opts(struct autoroute *ar, const struct autoroute_opts *o)
{
	struct autoroute_opts *c = &ar->o;
	int err = 0;
	size_t i;

	*c = *o;
	snprintf(ar->tun_name, sizeof(ar->tun_name), "%s", o->tun_name);
	c->tun_name = ar->tun_name;
	c->route_address = memdup(o->route_address, o->n_route_address, sizeof(*o->route_address),
				  &err);
	c->exclude = memdup(o->exclude, o->n_exclude, sizeof(*o->exclude), &err);
	c->include_uid = memdup(o->include_uid, o->n_include_uid, sizeof(*o->include_uid), &err);
	c->exclude_uid = memdup(o->exclude_uid, o->n_exclude_uid, sizeof(*o->exclude_uid), &err);
	c->marks = memdup(o->marks, o->n_marks, sizeof(*o->marks), &err);
	c->servers = memdup(o->servers, o->n_servers, sizeof(*o->servers), &err);
	c->exclude_interface = NULL;
	if (o->n_exclude_interface) {
		ar->ifnames = calloc(o->n_exclude_interface, sizeof(*ar->ifnames));
		ar->ifname_ptrs = calloc(o->n_exclude_interface, sizeof(*ar->ifname_ptrs));
		if (!ar->ifnames || !ar->ifname_ptrs)
			return -ENOMEM;
		for (i = 0; i < o->n_exclude_interface; i++) {
			snprintf(ar->ifnames[i], sizeof(ar->ifnames[i]), "%s",
				 o->exclude_interface[i]);
			ar->ifname_ptrs[i] = ar->ifnames[i];
		}
		c->exclude_interface = ar->ifname_ptrs;
	}
	return err;
}

static void free_opts(struct autoroute *ar)
{
	free((void *)ar->o.route_address);
	free((void *)ar->o.exclude);
	free((void *)ar->o.include_uid);
	free((void *)ar->o.exclude_uid);
	free((void *)ar->o.marks);
	free((void *)ar->o.servers);
	free(ar->ifnames);
	free(ar->ifname_ptrs);
}

/* The plan for gw[0..n_gw) in a new array. */
static int make_plan(const struct autoroute *ar, const struct netaddr *gw, size_t n_gw,
		     struct autoroute_step **out, size_t *n)
{
	size_t want = autoroute_plan(&ar->o, gw, n_gw, NULL, 0);
	struct autoroute_step *v = calloc(want ? want : 1, sizeof(*v));

	if (!v)
		return -ENOMEM;
	*n = autoroute_plan(&ar->o, gw, n_gw, v, want);
	*out = v;
	return 0;
}

/* Install steps in order; on a failure remove what this call added and explain in err. */
static int install(struct autoroute *ar, struct autoroute_step *steps, size_t n, char *err,
		   size_t errlen)
{
	char what[160];
	int ret;

	ar->steps = steps;
	for (ar->n_steps = 0; ar->n_steps < n; ar->n_steps++) {
		const struct autoroute_step *s = &steps[ar->n_steps];
		if ((ret = apply(ar, s, true)) == 0)
			continue;
		snprintf(err, errlen, "auto_route: cannot add %s: %s%s%s",
			 autoroute_step_format(s, what, sizeof(what)), strerror(-ret),
			 ar->nl.ext_msg[0] ? ": " : "", ar->nl.ext_msg);
		remove_installed(ar);
		return ret;
	}
	return 0;
}

/* Holding the lock: every tagged rule or route is a dead process's. Returns how many went. */
static int remove_stale(struct autoroute *ar, const struct scan *sc, int *first_err)
{
	int n = remove_extra(ar, sc, NULL, 0, first_err);

	if (n > 0)
		log_info(ar->log, "auto_route: removed %d stale rules and routes left by an "
			 "earlier run", n);
	return n;
}

/* Lock, clean, install. */
static int start(struct autoroute *ar, char *err, size_t errlen)
{
	struct scan sc = { 0 };
	struct autoroute_step *steps = NULL;
	size_t n = 0;
	int ret, stale_err = 0;

	if ((ret = netlink_open(&ar->nl)) != 0) {
		snprintf(err, errlen, "auto_route: netlink: %s", strerror(-ret));
		return ret;
	}
	if ((ret = lock_take(ar, LOCK_TRIES, err, errlen)) != 0)
		return ret;
	if ((ret = scan_kernel(&ar->nl, ar->o.tun_ifindex, &sc)) != 0) {
		snprintf(err, errlen, "auto_route: reading rules and routes: %s", strerror(-ret));
		goto out;
	}
	(void)remove_stale(ar, &sc, &stale_err);
	ar->n_gw = sc.n_gw;
	memcpy(ar->gw, sc.gw, sizeof(ar->gw));
	if ((ret = make_plan(ar, ar->gw, ar->n_gw, &steps, &n)) != 0) {
		snprintf(err, errlen, "auto_route: %s", strerror(-ret));
		goto out;
	}
	if ((ret = install(ar, steps, n, err, errlen)) != 0)
		goto out;
	rpf_setup(ar);
	rpf_warn_uplinks(ar, &sc);
	log_info(ar->log, "auto_route: %zu rules and routes installed (table %u, priorities %u-%u, "
		 "%s)", n, eff_table(&ar->o), eff_prio(&ar->o),
		 eff_prio(&ar->o) + AUTOROUTE_PRIO_SPAN - 1,
		 ar->o.strict ? "strict" : "not strict");
out:
	free(sc.v);
	return ret;
}

int autoroute_new(const struct autoroute_opts *o, struct log *lg, struct autoroute **out,
		  char *err, size_t errlen)
{
	struct autoroute *ar;
	int ret;

	*out = NULL;
	if (errlen)
		err[0] = '\0';
	if ((ret = autoroute_opts_check(o, err, errlen)) != 0)
		return ret;
	if (!(ar = calloc(1, sizeof(*ar)))) {
		snprintf(err, errlen, "auto_route: out of memory");
		return -ENOMEM;
	}
	ar->log = lg;
	ar->nl.fd = -1;
	ar->lock_fd = -1;
	ar->rpf_old = -1;
	if ((ret = copy_opts(ar, o)) != 0) {
		snprintf(err, errlen, "auto_route: out of memory");
		goto fail;
	}
	if ((ret = start(ar, err, errlen)) != 0)
		goto fail;
	ar->owner = true;
	*out = ar;
	return 0;
fail:
	autoroute_free(ar);
	return ret;
}

static bool gateways_equal(const struct netaddr *a, size_t na, const struct netaddr *b, size_t nb)
{
	size_t i, j;

	if (na != nb)
		return false;
	for (i = 0; i < na; i++) {
		for (j = 0; j < nb && !netaddr_eq(&a[i], &b[j]); j++)
			;
		if (j == nb)
			return false;
	}
	return true;
}

/* Add the steps of the plan the scan did not find. */
static int add_missing(struct autoroute *ar, const struct scan *sc, const struct autoroute_step *v,
		       size_t n, int *first_err)
{
	char what[160];
	int done = 0, ret;

	for (size_t i = 0; i < n; i++) {
		if (steps_contain(sc->v, sc->n, &v[i]))
			continue;
		autoroute_step_format(&v[i], what, sizeof(what));
		if ((ret = apply(ar, &v[i], true)) != 0) {
			log_warn(ar->log, "auto_route: cannot add %s: %s", what, strerror(-ret));
			if (*first_err == 0)
				*first_err = ret;
			continue;
		}
		if (steps_contain(ar->steps, ar->n_steps, &v[i]))
			log_info(ar->log, "auto_route: re-installed %s", what);
		else
			log_info(ar->log, "auto_route: installed %s", what);
		done++;
	}
	return done;
}

int autoroute_reconcile(struct autoroute *ar)
{
	struct scan sc = { 0 };
	struct autoroute_step *plan = NULL;
	size_t n = 0;
	int ret, first_err = 0, done;

	if ((ret = scan_kernel(&ar->nl, ar->o.tun_ifindex, &sc)) != 0)
		goto out;
	if (gateways_equal(sc.gw, sc.n_gw, ar->gw, ar->n_gw)) {
		plan = ar->steps;
		n = ar->n_steps;
	} else {
		char a[NETADDR_STRLEN] = "none";
		if (sc.n_gw)
			netaddr_format(&sc.gw[0], a, sizeof(a));
		log_info(ar->log, "auto_route: uplink gateways changed (now %zu: %s%s): "
			 "exclusions follow", sc.n_gw, a, sc.n_gw > 1 ? ", ..." : "");
		if ((ret = make_plan(ar, sc.gw, sc.n_gw, &plan, &n)) != 0)
			goto out;
	}
	done = add_missing(ar, &sc, plan, n, &first_err);
	done += remove_extra(ar, &sc, plan, n, &first_err);
	if (plan != ar->steps) {
		free(ar->steps);
		ar->steps = plan;
		ar->n_steps = n;
		ar->n_gw = sc.n_gw;
		memcpy(ar->gw, sc.gw, sizeof(ar->gw));
	}
	ret = first_err ? first_err : done;
out:
	free(sc.v);
	return ret;
}

/* ---- lookups beside the set ---- */

/* The fwmark selectors of the namespace's rules that are not ours. */
struct mark_rules {
	struct autoroute_mark *v; /* mask as the kernel holds it (0: any mark) */
	size_t n, cap;
	int err;
};

static void on_other_rule(void *arg, const struct netlink_rule *r)
{
	struct mark_rules *m = arg;
	struct autoroute_mark *v;

	if (r->protocol == AUTOROUTE_PROTO || !r->has_fwmark)
		return;
	if (!(v = grow(m->v, &m->cap, m->n, sizeof(*v), 16))) {
		m->err = -ENOMEM;
		return;
	}
	m->v = v;
	m->v[m->n++] = (struct autoroute_mark){ r->fwmark, r->fwmask };
}

static int read_mark_rules(struct autoroute *ar, struct mark_rules *m)
{
	static const uint8_t fams[2] = { 4, 6 };
	int ret = -EAGAIN;

	for (int tries = 0; tries < DUMP_TRIES && ret == -EAGAIN; tries++) {
		m->n = 0;
		m->err = 0;
		ret = 0;
		for (size_t i = 0; i < 2 && ret == 0; i++)
			if (family_planned(&ar->o, fams[i]))
				ret = netlink_rule_dump(&ar->nl, fams[i], on_other_rule, m);
		if (ret == 0)
			ret = m->err;
	}
	return ret;
}

/* Does every rule of m treat a packet with mark x as it treats an unmarked one? A fwmark
 * selector matches mark x when (x ^ mark) & mask is 0, as the kernel decides it. */
static bool like_unmarked(const struct mark_rules *m, uint32_t x)
{
	for (size_t i = 0; i < m->n; i++) {
		const struct autoroute_mark *r = &m->v[i];
		if ((((x ^ r->mark) & r->mask) == 0) != ((r->mark & r->mask) == 0))
			return false;
	}
	return true;
}

/* Does ar's set send mark x to P+19 at P+0? */
static bool exempts(const struct autoroute *ar, uint32_t x)
{
	for (size_t i = 0; i < ar->o.n_marks; i++) {
		const struct autoroute_mark *k = &ar->o.marks[i];
		if (k->mark && ((x ^ k->mark) & (k->mask ? k->mask : 0xffffffffu)) == 0)
			return true;
	}
	return false;
}

/* A non-zero mark that m cannot tell from none: one ar's set exempts already (nothing to
 * add), else one bit, else two, the high ones first. */
static bool pick_unmarked(const struct autoroute *ar, const struct mark_rules *m, uint32_t *out)
{
	for (size_t i = 0; i < ar->o.n_marks; i++) {
		if (ar->o.marks[i].mark && like_unmarked(m, ar->o.marks[i].mark)) {
			*out = ar->o.marks[i].mark;
			return true;
		}
	}
	for (int b = 31; b >= 0; b--) {
		if (like_unmarked(m, 1u << b)) {
			*out = 1u << b;
			return true;
		}
	}
	for (int b = 31; b > 0; b--) {
		for (int c = b - 1; c >= 0; c--) {
			if (like_unmarked(m, (1u << b) | (1u << c))) {
				*out = (1u << b) | (1u << c);
				return true;
			}
		}
	}
	return false;
}

/* A temporary "fwmark x goto P+19" at P+0 in each family of the set. One already there is
 * a stray of ours: taken over, so that the bypass's end removes it too. */
static int exempt_temp(struct autoroute *ar, uint32_t x, char *err, size_t errlen)
{
	static const uint8_t fams[2] = { 4, 6 };
	struct plan pl = { &ar->o, NULL, 0, 0, eff_prio(&ar->o), eff_table(&ar->o) };
	char what[160];
	int ret;

	for (size_t i = 0; i < 2; i++) {
		struct autoroute_step s;
		if (!family_planned(&ar->o, fams[i]))
			continue;
		s = rule_step(&pl, fams[i], 0, NETLINK_RULE_GOTO);
		s.rule.has_fwmark = true;
		s.rule.fwmark = x;
		s.rule.fwmask = 0xffffffffu;
		if (steps_contain(ar->temp, ar->n_temp, &s))
			continue;
		if ((ret = apply(ar, &s, true)) != 0 && ret != -EEXIST) {
			snprintf(err, errlen, "auto_route: cannot add %s: %s%s%s",
				 autoroute_step_format(&s, what, sizeof(what)), strerror(-ret),
				 ar->nl.ext_msg[0] ? ": " : "", ar->nl.ext_msg);
			return ret;
		}
		ar->temp[ar->n_temp++] = s;
	}
	return 0;
}

int autoroute_bypass_begin(struct autoroute *ar, const uint32_t *marks, size_t n_marks,
			   uint32_t *unmarked, char *err, size_t errlen)
{
	struct mark_rules mr = { 0 };
	struct autoroute_step *v;
	int ret = 0;

	*unmarked = 0;
	if (errlen)
		err[0] = '\0';
	autoroute_bypass_end(ar);
	/* Per family: the stand-in and each mark at most once, after what an earlier end could
	 * not remove. */
	if (!(v = realloc(ar->temp, (ar->n_temp + 2 * (n_marks + 1)) * sizeof(*v)))) {
		snprintf(err, errlen, "auto_route: out of memory");
		return -ENOMEM;
	}
	ar->temp = v;
	if ((ret = read_mark_rules(ar, &mr)) != 0) {
		snprintf(err, errlen, "auto_route: reading rules: %s", strerror(-ret));
		goto out;
	}
	if (!pick_unmarked(ar, &mr, unmarked)) {
		snprintf(err, errlen, "auto_route: every mark is told from none by a rule of another "
			 "owner (%zu rules with fwmark)", mr.n);
		ret = -ENOENT;
		goto out;
	}
	if (!exempts(ar, *unmarked) && (ret = exempt_temp(ar, *unmarked, err, errlen)) != 0)
		goto out;
	for (size_t i = 0; i < n_marks; i++)
		if (marks[i] && !exempts(ar, marks[i]) &&
		    (ret = exempt_temp(ar, marks[i], err, errlen)) != 0)
			goto out;
	log_debug(ar->log, "auto_route: lookups beside the rules: mark %#x for unmarked ones, "
		  "%zu temporary exemptions", *unmarked, ar->n_temp);
out:
	free(mr.v);
	if (ret != 0) {
		autoroute_bypass_end(ar);
		*unmarked = 0;
	}
	return ret;
}

void autoroute_bypass_end(struct autoroute *ar)
{
	char what[160];
	size_t top = ar->n_temp;

	/* Newest first; one that cannot be removed stays listed for autoroute_free (and is
	 * not in the plan, so a reconcile removes it as well), packed at the end in its order:
	 * every slot above i has been seen, so nothing unseen is overwritten. */
	for (size_t i = ar->n_temp; i-- > 0;) {
		const struct autoroute_step *s = &ar->temp[i];
		int ret = apply(ar, s, false);
		if (ret == 0 || gone(ret))
			continue;
		log_warn(ar->log, "auto_route: cannot remove %s: %s",
			 autoroute_step_format(s, what, sizeof(what)), strerror(-ret));
		ar->temp[--top] = *s;
	}
	if (top > 0 && top < ar->n_temp)
		memmove(ar->temp, ar->temp + top, (ar->n_temp - top) * sizeof(*ar->temp));
	ar->n_temp -= top;
}

/* ---- replacing the set, sweeping a dead one ---- */

/* Add the steps of plan[0..n) that sc does not hold, in install order. On a failure, take back
 * what this call added (newest first) and explain in err; the kernel is then as sc found it. */
static int add_new(struct autoroute *ar, const struct scan *sc, const struct autoroute_step *plan,
		   size_t n, int *added, char *err, size_t errlen)
{
	char what[160];
	size_t i;
	int ret;

	*added = 0;
	for (i = 0; i < n; i++) {
		if (steps_contain(sc->v, sc->n, &plan[i]))
			continue;
		if ((ret = apply(ar, &plan[i], true)) != 0)
			break;
		(*added)++;
	}
	if (i == n)
		return 0;
	snprintf(err, errlen, "auto_route: cannot add %s: %s%s%s",
		 autoroute_step_format(&plan[i], what, sizeof(what)), strerror(-ret),
		 ar->nl.ext_msg[0] ? ": " : "", ar->nl.ext_msg);
	while (i-- > 0) {
		int r;
		if (steps_contain(sc->v, sc->n, &plan[i]))
			continue;
		if ((r = apply(ar, &plan[i], false)) != 0 && !gone(r))
			log_warn(ar->log, "auto_route: cannot take back %s: %s",
				 autoroute_step_format(&plan[i], what, sizeof(what)), strerror(-r));
	}
	*added = 0;
	return ret;
}

/* Give ar the options of next (a fresh copy) and next the old ones, to be freed with it. The
 * TUN is the same, so each keeps its own name buffer. */
static void swap_opts(struct autoroute *ar, struct autoroute *next)
{
	struct autoroute_opts o = ar->o;
	char (*ifnames)[NETLINK_IFNAMSIZ] = ar->ifnames;
	const char **ptrs = ar->ifname_ptrs;

	ar->o = next->o;
	ar->ifnames = next->ifnames;
	ar->ifname_ptrs = next->ifname_ptrs;
	next->o = o;
	next->ifnames = ifnames;
	next->ifname_ptrs = ptrs;
	ar->o.tun_name = ar->tun_name;
	next->o.tun_name = next->tun_name;
	ar->o.has_lock = false;
}

int autoroute_replace(struct autoroute *ar, const struct autoroute_opts *o, char *err,
		      size_t errlen)
{
	struct autoroute *next;
	struct scan sc = { 0 };
	struct autoroute_step *plan = NULL;
	size_t n = 0;
	int ret, added = 0, removed, rm_err = 0;
	bool strict_was = ar->o.strict;

	if (errlen)
		err[0] = '\0';
	if ((ret = autoroute_opts_check(o, err, errlen)) != 0)
		return ret;
	if (o->tun_ifindex != ar->o.tun_ifindex) {
		snprintf(err, errlen, "auto_route: a replacement routes into another TUN");
		return -EINVAL;
	}
	if (!(next = calloc(1, sizeof(*next)))) {
		snprintf(err, errlen, "auto_route: out of memory");
		return -ENOMEM;
	}
	if ((ret = copy_opts(next, o)) != 0) {
		snprintf(err, errlen, "auto_route: out of memory");
		goto out;
	}
	if ((ret = scan_kernel(&ar->nl, ar->o.tun_ifindex, &sc)) != 0) {
		snprintf(err, errlen, "auto_route: reading rules and routes: %s", strerror(-ret));
		goto out;
	}
	if ((ret = make_plan(next, sc.gw, sc.n_gw, &plan, &n)) != 0) {
		snprintf(err, errlen, "auto_route: %s", strerror(-ret));
		goto out;
	}
	/* Make before break: while both sets are in, what both capture is captured. */
	if ((ret = add_new(ar, &sc, plan, n, &added, err, errlen)) != 0)
		goto out;
	removed = remove_extra(ar, &sc, plan, n, &rm_err);
	if (rm_err)
		log_warn(ar->log, "auto_route: some of the replaced rules stay until the next "
			 "repair: %s", strerror(-rm_err));
	swap_opts(ar, next);
	free(ar->steps);
	ar->steps = plan;
	ar->n_steps = n;
	plan = NULL;
	ar->n_gw = sc.n_gw;
	memcpy(ar->gw, sc.gw, sizeof(ar->gw));
	if (ar->o.strict != strict_was) {
		rpf_restore(ar);
		rpf_setup(ar);
	}
	log_info(ar->log, "auto_route: rules replaced, %d added before %d removed (table %u, "
		 "priorities %u-%u, %s)", added, removed, eff_table(&ar->o), eff_prio(&ar->o),
		 eff_prio(&ar->o) + AUTOROUTE_PRIO_SPAN - 1,
		 ar->o.strict ? "strict" : "not strict");
out:
	free(plan);
	free(sc.v);
	free_opts(next);
	free(next);
	return ret;
}

int autoroute_sweep(struct log *lg, char *err, size_t errlen)
{
	struct autoroute ar = { .log = lg, .lock_fd = -1, .rpf_old = -1 };
	struct scan sc = { 0 };
	int ret, rm_err = 0, n;

	ar.nl.fd = -1;
	if (errlen)
		err[0] = '\0';
	if ((ret = netlink_open(&ar.nl)) != 0) {
		snprintf(err, errlen, "auto_route: netlink: %s", strerror(-ret));
		return ret;
	}
	/* One try: another sweep that holds the name removes the same things. */
	if ((ret = lock_take(&ar, 1, err, errlen)) != 0)
		goto out;
	if ((ret = scan_kernel(&ar.nl, 0, &sc)) != 0) {
		snprintf(err, errlen, "auto_route: reading rules and routes: %s", strerror(-ret));
		goto out;
	}
	n = remove_stale(&ar, &sc, &rm_err);
	ret = n;
	if (rm_err) {
		snprintf(err, errlen, "auto_route: cannot remove a stale rule or route: %s",
			 strerror(-rm_err));
		ret = rm_err;
	}
out:
	free(sc.v);
	netlink_close(&ar.nl);
	if (ar.lock_fd >= 0)
		close(ar.lock_fd);
	return ret;
}

void autoroute_free(struct autoroute *ar)
{
	if (!ar)
		return;
	if (ar->nl.fd >= 0) {
		struct scan sc = { 0 };
		int first_err = 0;

		autoroute_bypass_end(ar);
		remove_installed(ar);
		/* What a replacement or a repair could not remove and no repair removed since:
		 * tagged, in no plan any more. Only by the namespace's owner: a set that failed
		 * to start (another proxy owns it) must not touch the owner's. */
		if (ar->owner && scan_kernel(&ar->nl, ar->o.tun_ifindex, &sc) == 0)
			remove_extra(ar, &sc, NULL, 0, &first_err);
		free(sc.v);
	}
	rpf_restore(ar);
	netlink_close(&ar->nl);
	if (ar->lock_fd >= 0)
		close(ar->lock_fd); /* releases the name */
	free(ar->steps);
	free(ar->temp);
	free_opts(ar);
	free(ar);
}
