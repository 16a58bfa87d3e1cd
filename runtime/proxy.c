/* proxy.c — assemble a proxy and take it apart again.
 *
 * Start-up order: loop guard → budget (its descriptors drawn from the process pool) → event
 * loop → TUN (created from the config with its addresses verified, or a caller's fd taken as
 * it is) → rp_filter checked → routing (runtime/routing.h: names resolved, auto_route, the
 * route check, the watch) → queue drivers → dispatcher and UDP path → stack (its listeners
 * bound) → stats endpoint → least privilege → worker threads. Teardown runs in the reverse
 * order and copes with any prefix of it having been built, so a failed start and a normal
 * stop share it. */
#include <errno.h>
#include <event2/event.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/driver.h"
#include "core/loopguard.h"
#include "core/stats_http.h"
#define TLSLIB_LOAD_ONLY
#include "core/tlslib.h"
#include "core/tun.h"
#include "dispatch/dispatcher.h"
#include "dispatch/udp.h"
#include "dns/fakeip.h"
#include "dns/local.h"
#include "dns/server.h"
#include "outbound/resolver.h"
#include "runtime/privdrop.h"
#include "runtime/proxy.h"
#include "runtime/reload.h"
#include "runtime/routing.h"
#include "runtime/workers.h"
#include "stacks/system/fastpath.h"

/* ---- stopping ------------------------------------------------------------------------------ */

void proxy_stop_loop(struct ts_proxy *p, int err)
{
	if (p->stopping)
		return;
	p->stopping = true;
	p->exit_err = err;
	if (p->ns)
		p->ops->stop(p->ns);
	event_base_loopbreak(p->base);
}

static void on_fatal(void *arg, int err, const char *msg)
{
	struct ts_proxy *p = arg;

	log_error(&p->log, "proxy: %s (%s); stopping", msg, strerror(-err));
	proxy_stop_loop(p, err < 0 ? err : -EIO);
}

void proxy_close(struct ts_proxy *p)
{
	/* The queue threads call into the stack: they go first. */
	workers_stop(p);
	routing_stop(p);
	proxy_stats_stop(p);
	if (p->ns)
		p->ops->stop(p->ns);
	dispatcher_free(p->disp); /* ends every live session: guards run before the stack goes */
	p->disp = NULL;
	if (p->ns)
		p->ops->free(p->ns);
	p->ns = NULL;
	udp_path_free(p->udp);
	p->udp = NULL;
	resolver_free(p->dns_resolver);
	p->dns_resolver = NULL;
	dns_local_free(p->dns_local);
	p->dns_local = NULL;
	dns_server_free(p->dns); /* after its users: each cancelled what it waited for */
	p->dns = NULL;
	reload_fini(p); /* the dispatcher and the UDP path have released what they held */
	resolver_free(p->resolver); /* no connection attempt is left to ask it */
	p->resolver = NULL;
	workers_free(p);
	rps_auto_stop(&p->rps);
	tun_close(p->tun);
	p->tun = NULL;
	if (p->stop_ev)
		event_free(p->stop_ev);
	p->stop_ev = NULL;
	if (p->stats_ev)
		event_free(p->stats_ev);
	p->stats_ev = NULL;
	if (p->reload_ev)
		event_free(p->reload_ev);
	p->reload_ev = NULL;
	if (p->base)
		event_base_free(p->base);
	p->base = NULL;
	budget_free(p->budget);
	p->budget = NULL;
	for (size_t i = 0; i < p->cfg.n_outbounds; i++)
		p->cfg.outbounds[i].loopguard = NULL;
	loopguard_free(p->loopguard);
	p->loopguard = NULL;
}

/* ---- starting ------------------------------------------------------------------------------ */

/* The session fd budget fits under the soft RLIMIT_NOFILE as it is (raising it is the
 * program's choice: ts_process_prepare); the process pool shares it between proxies. */
static int make_budget(struct ts_proxy *p, char *err, size_t errlen)
{
	/* What the proxy holds outside sessions, from the configuration (a caller's TUN ends up
	 * with one queue: counting the configured ones only reserves more). */
	uint32_t families = p->cfg.tun.has_addr6 ? 2 : 1;
	uint32_t reserve = budget_fd_reserve_for(
		p->cfg.tun.queues ? p->cfg.tun.queues : 1,
		p->cfg.stack == TS_STACK_SYSTEM ? p->cfg.nat.listeners * families : 0,
		p->cfg.stats.enabled ? STATS_HTTP_FDS : 0);
	struct rlimit rl;
	int ret;

	p->budget_loaded = p->cfg.budget; /* before the fit: what a reload compares with */
	memcpy(p->tun_name_loaded, p->cfg.tun.name, sizeof(p->tun_name_loaded));
	p->tun_mtu_loaded = p->cfg.tun.mtu; /* before a caller's TUN puts the device's there */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		p->cfg.budget.fds = budget_fds_fit(p->cfg.budget.fds, rl.rlim_cur, reserve);
	if (p->cfg.budget.fds == 0) {
		snprintf(err, errlen, "proxy: RLIMIT_NOFILE %llu leaves no descriptors for sessions "
			 "(at least %u are needed)", (unsigned long long)rl.rlim_cur, reserve + 1);
		return -EMFILE;
	}
	if ((ret = budget_new(&p->cfg.budget, &p->budget)) != 0) {
		snprintf(err, errlen, "proxy: budget: %s", strerror(-ret));
		return ret;
	}
	budget_join_fd_pool(p->budget);
	return 0;
}

/* tun.queues "auto" becomes a count before anything is sized by it (the fd reserve, the
 * workers, the accepted sockets' send buffer). */
static void resolve_queues(struct ts_proxy *p)
{
	struct ts_tun *c = &p->cfg.tun;
	cpu_set_t set;
	unsigned cpus = 1;

	if (c->queues != TS_TUN_QUEUES_AUTO)
		return;
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		cpus = (unsigned)CPU_COUNT(&set);
	c->queues = config_auto_queues(&p->cfg, p->caller_fd >= 0, cpus);
	c->queues_auto = true;
}

static void note_unavailable(struct ts_proxy *p, bool set, const char *what)
{
	size_t n = strlen(p->unavailable);

	if (set)
		snprintf(p->unavailable + n, sizeof(p->unavailable) - n, "%s%s", n ? "," : "", what);
}

/* A caller's TUN: take it as it is; say which settings of the config cannot be honoured. */
static int adopt_tun(struct ts_proxy *p, char *err, size_t errlen)
{
	struct ts_tun *c = &p->cfg.tun;
	uint32_t dev_mtu = 0;
	int ret;

	if ((ret = tun_adopt_fd(p->caller_fd, &p->tun, err, errlen)) != 0)
		return ret;
	/* Reads are bounded by the MTU: use the device's own. */
	if (tun_get_mtu(p->tun, &dev_mtu) != 0 || dev_mtu < 576)
		dev_mtu = c->mtu;
	if (c->offload == TS_OFFLOAD_ON && !tun_vnet_hdr(p->tun)) {
		snprintf(err, errlen, "proxy: tun.offload is \"on\" but the caller's TUN fd (%s) "
			 "was opened without IFF_VNET_HDR", tun_name(p->tun));
		return -EINVAL;
	}
	note_unavailable(p, strcmp(c->name, TS_TUN_NAME_DEFAULT) != 0 &&
				 strcmp(c->name, tun_name(p->tun)) != 0, "tun.name");
	note_unavailable(p, c->mtu != TS_TUN_MTU_DEFAULT && c->mtu != dev_mtu, "tun.mtu");
	note_unavailable(p, c->txqueuelen != TS_TUN_TXQUEUELEN_DEFAULT, "tun.txqueuelen");
	note_unavailable(p, c->queues > 1, "tun.queues");
	note_unavailable(p, c->offload == TS_OFFLOAD_OFF && tun_vnet_hdr(p->tun), "tun.offload");
	note_unavailable(p, c->rps == TS_RPS_ON, "tun.rps");
	if (p->unavailable[0])
		log_warn(&p->log, "proxy: %s is the caller's: not honoured: %s", tun_name(p->tun),
			 p->unavailable);
	c->mtu = dev_mtu;
	c->queues = 1;
	snprintf(c->name, sizeof(c->name), "%s", tun_name(p->tun)); /* what the logs name */
	/* Addresses are the caller's to set; the system stack binds its listeners on them, so
	 * they must be there (read, never written). */
	if (p->cfg.stack == TS_STACK_SYSTEM &&
	    (ret = tun_verify_addrs(tun_ifindex(p->tun), tun_name(p->tun), &c->addr4,
				    c->has_addr6 ? &c->addr6 : NULL, TUN_VERIFY_TRIES,
				    TUN_VERIFY_INTERVAL_MS, err, errlen)) != 0)
		return ret;
	return 0;
}

static int open_tun(struct ts_proxy *p, char *err, size_t errlen)
{
	char msg[512], note[TS_ERRLEN + 64] = "";
	int ret;

	if (p->caller_fd >= 0)
		ret = adopt_tun(p, err, errlen);
	else
		ret = tun_open_config(&p->cfg.tun, &p->tun, note, sizeof(note), err, errlen);
	if (ret != 0)
		return ret;
	if (note[0])
		log_warn(&p->log, "proxy: %s", note);
	log_info(&p->log, "proxy: %s%s: %s I/O, %u queue%s, receive packet steering %s, io_uring %s",
		 tun_name(p->tun), tun_borrowed(p->tun) ? " (caller's fd)" : "",
		 tun_vnet_hdr(p->tun) ? "offload" : "per-packet", tun_queues(p->tun),
		 tun_queues(p->tun) == 1 ? "" : "s",
		 tun_rps_auto(p->tun) ? "auto" : tun_rps(p->tun) ? "on" : "off",
		 p->cfg.tun.io_uring == TS_IO_URING_OFF ? "off" :
		 p->cfg.tun.io_uring == TS_IO_URING_ON ? "on" : "auto");
	/* strict_route sets the TUN's rp_filter itself (runtime/autoroute.c). */
	if (!p->cfg.tun.strict_route && tun_rp_filter_check(tun_name(p->tun), msg, sizeof(msg)) > 0)
		log_warn(&p->log, "proxy: %s", msg);
	return 0; /* tun.rps "auto" starts on the loop's thread (runtime/api.c) */
}

static int start_stack(struct ts_proxy *p, char *err, size_t errlen)
{
	struct netstack_env env = {
		.base = p->base,
		.cfg = &p->cfg,
		.budget = p->budget,
		.dispatcher = p->disp,
		.log = &p->log,
		.loopguard = p->loopguard,
		.tx = driver_tx,
		.tx_arg = p->driver,
		.tx_meta = driver_offload(p->driver) ? driver_tx_meta : NULL,
		.tx_lend = driver_offload(p->driver) ? driver_tx_lend : NULL,
		.tx_flush = driver_offload(p->driver) ? driver_tx_flush : NULL,
		.rx_take = driver_offload(p->driver) ? driver_rx_take : NULL,
		.udp = p->udp,
		.tun_name = tun_name(p->tun),
		.tun_ifindex = tun_ifindex(p->tun),
		.fatal = on_fatal,
		.fatal_arg = p,
		.dns_tcp = p->dns != NULL, /* TCP to gateway:53 is the dispatcher's to answer */
	};
	/* A device we did not create may carry the system stack's fast-path filter from an
	 * earlier process; a stack that does not use it must not have it rewrite its flows (the
	 * system stack clears or replaces it itself). */
	if (p->cfg.stack != TS_STACK_SYSTEM && !tun_created(p->tun) && tun_ifindex(p->tun) > 0)
		fastpath_clear(tun_ifindex(p->tun));
	if (p->cfg.stack != TS_STACK_SYSTEM && p->cfg.nat.fast_path == TS_FAST_PATH_ON)
		log_info(&p->log, "proxy: nat.fast_path is the system stack's: the %s stack "
			 "goes without it", config_stack_name(p->cfg.stack));
	return p->ops->start(&env, &p->ns, err, errlen);
}

int proxy_open_tls_libs(const struct ts_config *cfg, bool servers, char *err, size_t errlen)
{
	unsigned need = ts_sniff_on(&cfg->route.sniff, TS_SNIFF_QUIC) ? TLSLIB_CRYPTO : 0;
	char why[200];
	int ret;

	for (size_t i = 0; servers && i < cfg->dns.n_servers; i++)
		if (cfg->dns.servers[i].transport == TS_DNS_TLS ||
		    cfg->dns.servers[i].transport == TS_DNS_HTTPS)
			need |= TLSLIB_TLS;
	if (!need || (ret = tlslib_load(need, why, sizeof(why))) == 0)
		return 0;
	snprintf(err, errlen, "proxy: %s: %s", need & TLSLIB_TLS ?
		 "DNS over TLS or HTTPS needs OpenSSL and nghttp2" : "QUIC sniffing needs OpenSSL",
		 why);
	return ret;
}

/* The proxy's one resolver (proxy server names not pinned at start), on the loop, its sockets
 * made like an outbound's with the default mark, so its queries never enter the TUN. */
static int make_resolver(struct ts_proxy *p, char *err, size_t errlen)
{
	struct ts_outbound sock = { .sock_hook = p->sock_hook, .loopguard = p->loopguard };
	struct resolver_config rc = { .sock = &sock };
	int ret;

	sock.has_routing_mark = p->cfg.route.default_mark != 0;
	sock.routing_mark = p->cfg.route.default_mark;
	p->resolver_mark = sock.routing_mark;
	if ((ret = resolver_new(p->base, &rc, &p->resolver)) != 0) {
		snprintf(err, errlen, "proxy: resolver: %s", strerror(-ret));
		return ret;
	}
	for (size_t i = 0; i < p->cfg.n_outbounds; i++)
		p->cfg.outbounds[i].log = &p->log;
	proxy_assign_resolvers(p, &p->cfg);
	return 0;
}

void proxy_assign_resolvers(struct ts_proxy *p, struct ts_config *cfg)
{
	for (size_t i = 0; i < cfg->n_outbounds; i++) {
		struct ts_outbound *ob = &cfg->outbounds[i];
		ob->resolver = ob->type == TS_OUT_DIRECT && p->dns_resolver ? p->dns_resolver
									    : p->resolver;
		ob->fd_budget = p->budget;
	}
}

/* Names with fake-IP on: a fake address stands for its name ("" when it stands for none any
 * more: the session is refused, never connected to the fake address); any other address is
 * the embedder's namer's to name. Main loop only (the dispatcher and the UDP path). */
static const char *fake_namer(void *arg, int family, const uint8_t *dst, uint16_t port)
{
	struct ts_proxy *p = arg;
	int n = dns_server_fake_name(p->dns, family, dst, p->fake_name, sizeof(p->fake_name));

	if (n > 0)
		return p->fake_name;
	if (n == 0)
		return "";
	return p->namer ? p->namer(p->namer_arg, family, dst, port) : NULL;
}

/* The direct outbounds resolve names through the own resolver (its rules, hosts, cache and
 * upstreams), offered on 127.0.0.1: never through /etc/resolv.conf, whose server may be the
 * TUN itself. */
static int start_dns_local(struct ts_proxy *p, char *err, size_t errlen)
{
	struct resolver_config rc = { 0 };
	char servers[32];
	uint16_t port;
	int ret;

	if ((ret = dns_local_new(p->base, p->dns, &p->dns_local, &port)) != 0) {
		snprintf(err, errlen, "proxy: DNS resolver on 127.0.0.1: %s", strerror(-ret));
		return ret;
	}
	snprintf(servers, sizeof(servers), "127.0.0.1:%u", port);
	rc.servers = servers;
	rc.max_ttl_s = 1; /* the resolver's cache already holds the answers */
	rc.neg_ttl_s = 1;
	if ((ret = resolver_new(p->base, &rc, &p->dns_resolver)) != 0) {
		snprintf(err, errlen, "proxy: resolver: %s", strerror(-ret));
		return ret;
	}
	proxy_assign_resolvers(p, &p->cfg);
	return 0;
}

/* A live session holds its fake address: it is never handed to another name meanwhile. */
static void fake_pin(void *arg, int family, const uint8_t *dst)
{
	dns_server_fake_pin(((struct ts_proxy *)arg)->dns, family, dst, true);
}

static void fake_unpin(void *arg, int family, const uint8_t *dst)
{
	dns_server_fake_pin(((struct ts_proxy *)arg)->dns, family, dst, false);
}

/* The own resolver, when dns.hijack has dns.servers: hijacked queries go to it, fake-IP's
 * mappings are read back from dns.fakeip.persist. */
static int start_dns(struct ts_proxy *p, char *err, size_t errlen)
{
	struct fakeip_load_stats ls;
	int ret;

	if (!p->cfg.dns.hijack || !p->cfg.dns.n_servers)
		return 0;
	if ((ret = dns_server_new(p->base, &p->cfg, p->budget, &p->dns)) != 0) {
		snprintf(err, errlen, "proxy: DNS resolver: %s", strerror(-ret));
		return ret;
	}
	dns_server_set_log(p->dns, &p->log);
	if ((ret = dns_server_fake_restore(p->dns, &ls)) != 0) {
		snprintf(err, errlen, "config: $.dns.fakeip.persist: cannot read %s: %s",
			 p->cfg.dns.fakeip.persist, strerror(-ret));
		return ret;
	}
	if (p->cfg.dns.fakeip.persist)
		log_info(&p->log, "dns: fakeip: %llu mappings read back from %s (%llu bad lines, "
			 "%llu outside the ranges, %llu duplicates, %llu past max_mappings, %llu "
			 "without memory)",
			 (unsigned long long)ls.loaded, p->cfg.dns.fakeip.persist,
			 (unsigned long long)ls.bad, (unsigned long long)ls.outside,
			 (unsigned long long)ls.duplicates, (unsigned long long)ls.full,
			 (unsigned long long)ls.no_memory);
	return start_dns_local(p, err, errlen);
}

/* Least privilege: only the capabilities a running proxy uses, as "user" if given. */
static int drop_privileges(struct ts_proxy *p, char *err, size_t errlen)
{
	const char *sets[TS_MAX_RULE_SETS];
	struct privdrop_opts o = {
		.user = p->cfg.user,
		.keep_bind_service = p->cfg.stats.enabled && p->cfg.stats.listen.port < 1024,
		.config_path = p->config_path,
		.more_paths = sets,
		.n_more_paths = p->cfg.n_rule_sets,
	};
	int ret;

	for (size_t i = 0; i < p->cfg.n_rule_sets; i++)
		sets[i] = p->cfg.rule_sets[i].path;

	if (!p->least_privilege && !p->cfg.user[0])
		return 0;
	if ((ret = privdrop_apply(&o, err, errlen)) != 0) {
		privdrop_raise_effective(); /* the teardown must still remove what we installed */
		return ret;
	}
	log_info(&p->log, "proxy: running with least privilege%s%s", p->cfg.user[0] ? " as " : "",
		 p->cfg.user);
	return 0;
}


static void quiet_udp(void *arg)
{
	(void)udp_path_release_idle(arg);
}
int proxy_open(struct ts_proxy *p, char *err, size_t errlen)
{
	int ret;

	p->started_ns = ts_now_ns();
	ratemeter_init(&p->rates, PROXY_RATES, TS_NS_PER_SEC, p->started_ns,
		       (const uint64_t[PROXY_RATES]){ 0 });
	/* The stack first: one that cannot start here must fail before the TUN changes. */
	p->ops = netstack_lookup(config_stack_name(p->cfg.stack));
	if (!p->ops) {
		snprintf(err, errlen, "proxy: stack \"%s\" is not available in this build",
			 config_stack_name(p->cfg.stack));
		return -ENOTSUP;
	}
	if (p->ops->precheck && (ret = p->ops->precheck(err, errlen)) != 0)
		return ret;
	if ((ret = loopguard_new(p->cfg.roles4.gateway.a,
				 p->cfg.tun.has_addr6 ? p->cfg.roles6.gateway.a : NULL,
				 &p->loopguard)) != 0) {
		snprintf(err, errlen, "proxy: loop guard: out of memory");
		return ret;
	}
	for (size_t i = 0; i < p->cfg.n_outbounds; i++) {
		p->cfg.outbounds[i].sock_hook = p->sock_hook;
		p->cfg.outbounds[i].loopguard = p->loopguard;
	}
	resolve_queues(p);
	if ((ret = make_budget(p, err, errlen)) != 0)
		return ret;
	if (!(p->base = event_base_new())) {
		snprintf(err, errlen, "proxy: event loop: out of memory");
		return -ENOMEM;
	}
	if ((ret = proxy_open_tls_libs(&p->cfg, true, err, errlen)) != 0 ||
	    (ret = make_resolver(p, err, errlen)) != 0)
		return ret;
	if ((ret = start_dns(p, err, errlen)) != 0)
		return ret;
	if ((ret = open_tun(p, err, errlen)) != 0)
		return ret;
	if ((ret = routing_start(p, err, errlen)) != 0)
		return ret;
	if ((ret = workers_init(p, err, errlen)) != 0)
		return ret;
	if ((ret = dispatcher_new(p->base, &p->cfg, p->budget, &p->disp)) != 0) {
		snprintf(err, errlen, "proxy: dispatcher: %s", strerror(-ret));
		return ret;
	}
	if ((ret = udp_path_new(p->base, &p->cfg, p->budget, driver_tx, p->driver, &p->udp)) != 0) {
		snprintf(err, errlen, "proxy: UDP path: %s", strerror(-ret));
		return ret;
	}
	udp_path_set_loopguard(p->udp, p->loopguard);
	/* A quiet main loop gives back the pages of the UDP path's large buffers too (each queue's
	 * loop gives back its read buffers': runtime/workers.c): a load touched them end to end. */
	if (memback_on_quiet(&p->workers[0].memback, quiet_udp, p->udp) != 0) {
		snprintf(err, errlen, "proxy: memory back: too many hooks");
		return -ENOSPC;
	}
	/* Replies in trains where the TUN takes UDP GSO writes; without the budget for the
	 * larger receive buffer they go one by one, as on any other TUN. */
	if (driver_offload(p->driver)) {
		uint32_t off = tun_offload(p->tun);
		ret = udp_path_set_trains(p->udp, driver_tx_meta, off & TUN_OFFLOAD_USO4,
					  off & TUN_OFFLOAD_USO6);
		if (ret == -ENOMEM) {
			snprintf(err, errlen, "proxy: UDP path: %s", strerror(-ret));
			return ret;
		}
		if (ret != 0)
			log_warn(&p->log, "proxy: UDP replies one by one: no budget for trains");
	}
	/* Datagrams out in trains (UDP GSO sends) on the direct outbounds; the drivers' batch
	 * ends send them (runtime/workers.c). Without kernel support or budget, one by one. */
	ret = udp_path_set_uptrains(p->udp, true);
	if (ret == -ENOBUFS)
		log_warn(&p->log, "proxy: UDP datagrams out one by one: no budget for trains");
	else if (ret != 0)
		log_info(&p->log, "proxy: UDP datagrams out one by one: the kernel has no UDP GSO");
	if (p->dns) {
		udp_path_set_dns(p->udp, p->dns);
		dns_tcp_resolver_server(&p->dns_tcp, p->dns);
		dispatcher_set_dns(p->disp, &p->dns_tcp);
	}
	dispatcher_set_log(p->disp, &p->log);
	udp_path_set_log(p->udp, &p->log);
	if (p->dns && p->cfg.dns.fakeip.enabled) {
		dispatcher_set_namer(p->disp, fake_namer, p);
		dispatcher_set_name_pins(p->disp, fake_pin, fake_unpin);
		udp_path_set_namer(p->udp, fake_namer, p);
		udp_path_set_name_pins(p->udp, fake_pin, fake_unpin);
	} else if (p->namer) {
		dispatcher_set_namer(p->disp, p->namer, p->namer_arg);
		udp_path_set_namer(p->udp, p->namer, p->namer_arg);
	}
	if ((ret = start_stack(p, err, errlen)) != 0)
		return ret;
	if ((ret = proxy_stats_start(p, err, errlen)) != 0)
		return ret;
	/* Everything that needs more than the kept capabilities is done; no thread of ours
	 * exists yet, so every one inherits the reduced set. */
	if ((ret = drop_privileges(p, err, errlen)) != 0)
		return ret;
	return workers_start(p, err, errlen);
}
