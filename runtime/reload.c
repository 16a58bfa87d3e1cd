/* reload.c — swap in a new configuration under a running proxy (see reload.h). */
#include "runtime/reload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/stats_doc.h"
#include "core/tun.h"
#include "dispatch/dispatcher.h"
#include "dispatch/udp.h"
#include "runtime/privdrop.h"
#include "dns/server.h"
#include "runtime/proxy.h"
#include "runtime/routing.h"

/* A configuration a reload brought in: alive while the dispatcher, the UDP path or the proxy
 * (as its current one) still use it. */
struct cfg_gen {
	struct ts_config cfg;  /* first: a struct ts_config * converts back */
	int users;             /* dispatcher + UDP path (+ the resolver) that have not released it */
	struct cfg_gen *next;
};

static void gen_unlink_free(struct ts_proxy *p, struct cfg_gen *g)
{
	for (struct cfg_gen **pp = &p->gens; *pp; pp = &(*pp)->next) {
		if (*pp == g) {
			*pp = g->next;
			break;
		}
	}
	config_fini(&g->cfg);
	free(g);
}

/* The dispatcher or the UDP path no longer needs old (its last session of it ended). */
static void on_release(void *arg, const struct ts_config *old)
{
	struct ts_proxy *p = arg;

	if (old == &p->cfg)
		return; /* the first one lives in the proxy itself */
	for (struct cfg_gen *g = p->gens; g; g = g->next) {
		if (&g->cfg == old) {
			if (--g->users == 0 && &g->cfg != p->live)
				gen_unlink_free(p, g);
			return;
		}
	}
}

/* ---- what a running proxy cannot change -------------------------------------------------- */

struct kept {
	char *buf;
	size_t len, used;
};

static void note_kept(struct kept *k, bool differs, const char *name)
{
	int n;

	if (!differs || k->used >= k->len)
		return;
	for (const char *at = strstr(k->buf, name); at; at = strstr(at + 1, name)) {
		size_t l = strlen(name);
		if ((at == k->buf || at[-1] == ',') && (at[l] == ',' || at[l] == '\0'))
			return; /* listed already (two fields of one key) */
	}
	n = snprintf(k->buf + k->used, k->len - k->used, "%s%s", k->used ? "," : "", name);
	if (n > 0)
		k->used += (size_t)n;
}

#define KEEP(k, old, n, field, name)                                                   \
	do {                                                                          \
		bool d_ = memcmp(&(old)->field, &(n)->field, sizeof((old)->field)) != 0;  \
		note_kept((k), d_, (name));                                               \
		memcpy(&(n)->field, &(old)->field, sizeof((old)->field));                 \
	} while (0)

/* Give n the running values of every key that cannot change, listing those that differed. */
static void keep_fixed(const struct ts_proxy *p, struct ts_config *n, char *list, size_t len)
{
	const struct ts_config *old = &p->cfg;
	const struct budget_limits *loaded_budget = &p->budget_loaded;
	struct kept k = { list, len, 0 };

	list[0] = '\0';
	KEEP(&k, old, n, stack, "stack");
	/* Compared with what the config said: a caller's TUN puts the device's name and MTU in
	 * the running values. */
	note_kept(&k, strcmp(p->tun_name_loaded, n->tun.name) != 0, "tun.name");
	memcpy(n->tun.name, old->tun.name, sizeof(n->tun.name));
	KEEP(&k, old, n, tun.addr4, "tun.address");
	KEEP(&k, old, n, tun.has_addr6, "tun.address6");
	KEEP(&k, old, n, tun.addr6, "tun.address6");
	note_kept(&k, p->tun_mtu_loaded != n->tun.mtu, "tun.mtu");
	n->tun.mtu = old->tun.mtu;
	KEEP(&k, old, n, tun.txqueuelen, "tun.txqueuelen");
	/* A count the start picked for "auto" is what "auto" still says. */
	note_kept(&k, n->tun.queues != (old->tun.queues_auto ? TS_TUN_QUEUES_AUTO : old->tun.queues),
		  "tun.queues");
	n->tun.queues = old->tun.queues;
	n->tun.queues_auto = old->tun.queues_auto;
	KEEP(&k, old, n, tun.offload, "tun.offload");
	KEEP(&k, old, n, tun.gso_output, "tun.gso_output");
	KEEP(&k, old, n, tun.large_segments, "tun.large_segments");
	KEEP(&k, old, n, tun.rps, "tun.rps");
	KEEP(&k, old, n, tun.io_uring, "tun.io_uring");
	KEEP(&k, old, n, nat, "nat");
	KEEP(&k, old, n, relay_mode, "relay.mode");
	KEEP(&k, old, n, relay_buffer_bytes, "relay.buffer_bytes");
	KEEP(&k, old, n, relay_pipe_bytes, "relay.pipe_bytes");
	KEEP(&k, old, n, budget_profile, "budgets");
	note_kept(&k, memcmp(loaded_budget, &n->budget, sizeof(n->budget)) != 0, "budgets");
	n->budget = old->budget;
	KEEP(&k, old, n, stats, "stats.listen");
	KEEP(&k, old, n, dns.hijack, "dns.hijack");
	/* The resolver's servers, cache and fake-IP pool live as long as the proxy: when they
	 * differ it keeps running as it is, rules and hosts included (proxy_reload). */
	note_kept(&k, old->dns.resolver_sig != n->dns.resolver_sig, "dns.resolver");
	KEEP(&k, old, n, user, "user");
	/* Derived from the TUN and nat sections, which are now the running ones. */
	n->roles4 = old->roles4;
	n->roles6 = old->roles6;
}

/* ---- the reload ---------------------------------------------------------------------------- */

struct reload_prep {
	struct cfg_gen *g;
	struct routecheck rc;    /* the new configuration's route check targets (names resolved) */
	char kept[256];
};

static int load(struct ts_proxy *p, const char *json, size_t len, struct cfg_gen **out,
		char *err, size_t errlen)
{
	struct cfg_gen *g = calloc(1, sizeof(*g));
	uid_t uid;
	gid_t gid;
	char why[256];
	int ret;

	if (!g) {
		snprintf(err, errlen, "reload: out of memory");
		return -ENOMEM;
	}
	if (json)
		ret = config_load_buffer(json, len, &g->cfg, err, errlen);
	else if (p->config_path)
		ret = config_load_file(p->config_path, &g->cfg, err, errlen);
	else {
		snprintf(err, errlen, "reload: the proxy was not made from a file: pass a config");
		ret = -ENOENT;
	}
	if (ret == 0 && g->cfg.user[0] &&
	    privdrop_resolve(g->cfg.user, &uid, &gid, why, sizeof(why)) != 0) {
		snprintf(err, errlen, "config: $.user: %s", why);
		ret = -EINVAL;
	}
	if (ret != 0) {
		config_fini(&g->cfg);
		free(g);
		return ret;
	}
	*out = g;
	return 0;
}

int reload_prepare(struct ts_proxy *p, const char *json, size_t len, struct reload_prep **out,
		   char *err, size_t errlen)
{
	struct reload_prep *r = calloc(1, sizeof(*r));
	int ret;

	if (!r) {
		snprintf(err, errlen, "reload: out of memory");
		return -ENOMEM;
	}
	if ((ret = load(p, json, len, &r->g, err, errlen)) != 0) {
		free(r);
		return ret;
	}
	/* p->cfg keeps the running values of the fixed keys: it never changes after start. */
	keep_fixed(p, &r->g->cfg, r->kept, sizeof(r->kept));
	for (size_t i = 0; i < r->g->cfg.n_outbounds; i++) {
		r->g->cfg.outbounds[i].sock_hook = p->sock_hook;
		r->g->cfg.outbounds[i].loopguard = p->loopguard;
		r->g->cfg.outbounds[i].log = &p->log;
	}
	proxy_assign_resolvers(p, &r->g->cfg);
	if ((ret = routecheck_init(&r->rc, &r->g->cfg, tun_ifindex(p->tun), err, errlen)) != 0) {
		config_fini(&r->g->cfg);
		free(r->g);
		free(r);
		return ret;
	}
	/* The new route.sniff may sniff QUIC; the DNS servers stay the running ones. */
	if ((ret = proxy_open_tls_libs(&r->g->cfg, false, err, errlen)) != 0) {
		routecheck_fini(&r->rc);
		config_fini(&r->g->cfg);
		free(r->g);
		free(r);
		return ret;
	}
	routecheck_pin(&r->rc, &r->g->cfg);
	*out = r;
	return 0;
}

void reload_prep_free(struct reload_prep *r)
{
	if (!r)
		return;
	routecheck_fini(&r->rc);
	if (r->g) {
		config_fini(&r->g->cfg);
		free(r->g);
	}
	free(r);
}

static void finish(struct ts_proxy *p, int ret, const char *err)
{
	if (ret == 0) {
		p->reloads_ok++;
		snprintf(p->reload_result, sizeof(p->reload_result), "ok");
		p->reload_error[0] = '\0';
		return;
	}
	p->reloads_refused++;
	snprintf(p->reload_result, sizeof(p->reload_result), "refused");
	snprintf(p->reload_error, sizeof(p->reload_error), "%s", err);
	log_error(&p->log, "reload: refused, the running configuration stays: %s", err);
}

int proxy_reload(struct ts_proxy *p, struct reload_prep *r, int prep_ret, const char *prep_err,
		 char *err, size_t errlen)
{
	struct ts_config *old = p->live;
	struct cfg_gen *g;
	int ret;

	if (!r) {
		snprintf(err, errlen, "%s", prep_err);
		finish(p, prep_ret, prep_err);
		return prep_ret;
	}
	g = r->g;
	/* Routing first: a new config whose traffic would loop is refused before anything
	 * uses it (and auto_route is back to the old rules). routing_reload takes r->rc. */
	if ((ret = routing_reload(p, old, &g->cfg, &r->rc, err, errlen)) != 0)
		goto out;
	r->g = NULL;
	g->users = 2;
	g->next = p->gens;
	p->gens = g;
	p->live = &g->cfg;
	__atomic_store_n(&p->log.level, g->cfg.log_level, __ATOMIC_RELAXED);
	p->generation++;
	dispatcher_set_config(p->disp, &g->cfg, on_release, p);
	udp_path_set_config(p->udp, &g->cfg, on_release, p);
	/* The resolver takes the new rules and hosts, and its servers the outbounds they now go
	 * through, when it can; it holds the configuration it reads like the other users. */
	if (p->dns) {
		const struct ts_config *was = dns_server_config(p->dns);
		if (dns_server_reconfigure(p->dns, &g->cfg) == 0) {
			g->users++;
			on_release(p, was);
		}
	}
	snprintf(p->reload_kept, sizeof(p->reload_kept), "%s", r->kept);
	if (r->kept[0])
		log_warn(&p->log, "reload: kept as they run (they change only with a restart): %s",
			 r->kept);
	log_info(&p->log, "reload: configuration %llu in use (live sessions keep theirs)",
		 (unsigned long long)p->generation);
	config_log_rule_sets(p->live, &p->log);
out:
	reload_prep_free(r);
	finish(p, ret, err);
	return ret;
}

void reload_stats(struct ts_proxy *p, struct stats_doc *d)
{
	stats_doc_gauge(d, "config.generation", p->generation);
	stats_doc_counter(d, "reload.ok", p->reloads_ok);
	stats_doc_counter(d, "reload.refused", p->reloads_refused);
	stats_doc_add_str(d, "reload.last_result", p->reload_result[0] ? p->reload_result : "none");
	stats_doc_add_str(d, "reload.last_error", p->reload_error);
	stats_doc_add_str(d, "reload.kept", p->reload_kept);
}

void reload_fini(struct ts_proxy *p)
{
	while (p->gens)
		gen_unlink_free(p, p->gens);
	p->live = &p->cfg;
}
