/* proxy_stats.c — a proxy's stats document, served as /stats and /metrics and returned by
 * ts_proxy_stats_json: the same keys for every stack and TUN mode (a key that does not apply
 * reads 0), built fresh on each request from the live counters (nothing is batched or cached,
 * so nothing needs flushing). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/driver.h"
#include "core/rss.h"
#include "core/stats_doc.h"
#include "core/stats_http.h"
#include "core/tun.h"
#include "dispatch/dispatcher.h"
#include "dispatch/udp.h"
#include "dns/server.h"
#include "runtime/proxy.h"
#include "runtime/reload.h"
#include "runtime/routing.h"
#include "runtime/workers.h"

/* Quiet trims of every queue's loop. */
static uint64_t quiet_trims(const struct ts_proxy *p)
{
	uint64_t n = 0;

	for (uint32_t q = 0; q < p->nworkers; q++)
		n += ctr_get(&p->workers[q].memback.trims);
	return n;
}

static uint64_t count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	uint64_t n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n > 0 ? n - 1 : 0; /* minus the directory's own fd */
}

struct visit {
	struct stats_doc *doc;
	const char *prefix;
	enum stats_kind kind; /* of every figure visited */
};

static void add_visited(void *arg, const char *name, uint64_t v)
{
	struct visit *vs = arg;
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", vs->prefix, name);
	stats_doc_add_u64(vs->doc, key, vs->kind, v);
}

static void add_process(struct ts_proxy *p, struct stats_doc *d)
{
	struct rss_info ri = { 0 };

	if (rss_sample(&ri) != 0)
		memset(&ri, 0, sizeof(ri));
	stats_doc_add_str(d, "stack", config_stack_name(p->cfg.stack));
	stats_doc_add_u64(d, "uptime_s", STATS_GAUGE,
			  p->started_ns ? (uint64_t)((ts_now_ns() - p->started_ns) / TS_NS_PER_SEC)
					: 0);
	stats_doc_add_u64(d, "rss_kb", STATS_GAUGE, ri.rss_bytes / 1024);
	stats_doc_add_u64(d, "peak_rss_kb", STATS_GAUGE, ri.hwm_bytes / 1024);
	stats_doc_add_u64(d, "fds", STATS_GAUGE, count_fds());
}

/* The drivers of every queue, summed. */
static void drivers_sum(const struct ts_proxy *p, struct driver_counters *sum)
{
	memset(sum, 0, sizeof(*sum));
	for (uint32_t q = 0; q < p->nworkers; q++)
		if (p->workers[q].driver)
			driver_counters_accumulate(sum, driver_get_counters(p->workers[q].driver));
}

/* Queues whose reads and writes go through an io_uring. */
static uint64_t uring_queues(const struct ts_proxy *p)
{
	uint64_t n = 0;

	for (uint32_t q = 0; q < p->nworkers; q++)
		n += p->workers[q].driver && driver_uring(p->workers[q].driver);
	return n;
}

static void add_tun(struct ts_proxy *p, struct stats_doc *d, const struct netstack_stats *ns,
		    const struct driver_counters *c)
{
	struct tun_dev_stats ds = { 0 };
	uint64_t handoff = 0, handoff_drops = 0;
	char key[64];

	stats_doc_add_str(d, "tun.io_mode", !p->tun ? "none" : tun_vnet_hdr(p->tun) ? "offload"
								       : "per-packet");
	stats_doc_add_str(d, "tun.owner", !p->tun ? "none" : tun_borrowed(p->tun) ? "caller"
										: "proxy");
	stats_doc_add_str(d, "tun.unavailable", p->unavailable);
	stats_doc_add_u64(d, "tun.queues", STATS_GAUGE, p->nworkers);
	stats_doc_add_u64(d, "tun.io_uring", STATS_GAUGE, uring_queues(p));
	stats_doc_add_u64(d, "tun.rps", STATS_GAUGE, p->tun ? tun_rps(p->tun) : 0);
	stats_doc_add_u64(d, "tun.rps_auto", STATS_GAUGE, rps_auto_active(&p->rps));
	stats_doc_add_u64(d, "tun.rps_switches", STATS_COUNTER, rps_auto_switches(&p->rps));
	stats_doc_add_u64(d, "tun.loop_busy_pct", STATS_GAUGE, rps_auto_busy_pct(&p->rps));
	stats_doc_add_u64(d, "tun.rps_trials_failed", STATS_COUNTER,
			  rps_auto_trials_failed(&p->rps));
	stats_doc_add_i64(d, "tun.rps_last_trial_pct", STATS_GAUGE,
			  rps_auto_last_trial_pct(&p->rps));
	stats_doc_add_u64(d, "tun.rx_packets", STATS_COUNTER, ctr_get(&c->rx_packets));
	stats_doc_add_u64(d, "tun.rx_bytes", STATS_COUNTER, ctr_get(&c->rx_bytes));
	stats_doc_add_u64(d, "tun.tx_packets", STATS_COUNTER, ctr_get(&c->tx_packets));
	stats_doc_add_u64(d, "tun.tx_bytes", STATS_COUNTER, ctr_get(&c->tx_bytes));
	stats_doc_add_u64(d, "tun.rx_gso", STATS_COUNTER, ctr_get(&c->rx_gso));
	stats_doc_add_u64(d, "tun.tx_gso", STATS_COUNTER, ctr_get(&c->tx_gso));
	stats_doc_add_u64(d, "tun.rewrites", STATS_COUNTER, ns->rewrites);
	static const char *const fp_state[] = { "none", "off", "unavailable", "on" };
	stats_doc_add_str(d, "fast_path.state", fp_state[ns->fast_path]);
	stats_doc_add_u64(d, "fast_path.conns", STATS_GAUGE, ns->fast_path_conns);
	stats_doc_add_u64(d, "fast_path.conns_added", STATS_COUNTER, ns->fast_path_added);
	stats_doc_add_u64(d, "fast_path.map_full", STATS_COUNTER, ns->fast_path_full);
	stats_doc_add_u64(d, "fast_path.add_failed", STATS_COUNTER, ns->fast_path_failed);
	stats_doc_add_u64(d, "fast_path.packets", STATS_COUNTER, ns->fast_path_packets);
	stats_doc_add_u64(d, "fast_path.segments", STATS_COUNTER, ns->fast_path_segments);
	stats_doc_add_u64(d, "fast_path.bytes", STATS_COUNTER, ns->fast_path_bytes);
	stats_doc_add_u64(d, "fast_path.dropped", STATS_COUNTER, ns->fast_path_dropped);
	stats_doc_add_str(d, "fast_path.udp_state", fp_state[ns->fast_path_udp]);
	stats_doc_add_u64(d, "fast_path.udp_flows", STATS_GAUGE, ns->fast_path_udp_flows);
	stats_doc_add_u64(d, "fast_path.uplinks", STATS_GAUGE, ns->fast_path_uplinks);
	stats_doc_add_u64(d, "fast_path.udp_no_uplink", STATS_COUNTER, ns->fast_path_udp_no_uplink);
	stats_doc_add_u64(d, "fast_path.udp_map_failed", STATS_COUNTER,
			  ns->fast_path_udp_map_failed);
	stats_doc_add_u64(d, "fast_path.udp_datagrams_out", STATS_COUNTER, ns->fast_path_udp_out);
	stats_doc_add_u64(d, "fast_path.udp_bytes_out", STATS_COUNTER, ns->fast_path_udp_out_bytes);
	stats_doc_add_u64(d, "fast_path.udp_datagrams_in", STATS_COUNTER, ns->fast_path_udp_in);
	stats_doc_add_u64(d, "fast_path.udp_bytes_in", STATS_COUNTER, ns->fast_path_udp_in_bytes);
	stats_doc_add_u64(d, "fast_path.udp_dropped", STATS_COUNTER, ns->fast_path_udp_dropped);
	stats_doc_add_u64(d, "tun.tx_dropped", STATS_COUNTER, ctr_get(&c->tx_dropped));
	for (uint32_t q = 0; q < p->nworkers; q++) {
		const struct worker *w = &p->workers[q];
		if (!w->driver)
			continue;
		snprintf(key, sizeof(key), "tun.q%u.rx_packets", q);
		stats_doc_add_u64(d, key, STATS_COUNTER,
				  ctr_get(&driver_get_counters(w->driver)->rx_packets));
		snprintf(key, sizeof(key), "tun.q%u.rx_bytes", q);
		stats_doc_add_u64(d, key, STATS_COUNTER,
				  ctr_get(&driver_get_counters(w->driver)->rx_bytes));
		snprintf(key, sizeof(key), "tun.q%u.quiet_trims", q);
		stats_doc_add_u64(d, key, STATS_COUNTER,
				  ctr_get(&w->memback.trims));
		handoff += ctr_get(&w->udp_handoff);
		handoff_drops += ctr_get(&w->udp_handoff_drops);
	}
	/* Always present (0 with one queue): the same keys in every mode. */
	stats_doc_add_u64(d, "tun.udp_handoff", STATS_COUNTER, handoff);
	stats_doc_add_u64(d, "drops.udp_handoff", STATS_COUNTER, handoff_drops);
	if (!p->tun || tun_dev_stats(tun_name(p->tun), &ds) != 0)
		memset(&ds, 0, sizeof(ds));
	stats_doc_add_u64(d, "tun_device.rx_dropped", STATS_COUNTER, ds.rx_dropped);
	stats_doc_add_u64(d, "tun_device.tx_dropped", STATS_COUNTER, ds.tx_dropped);
}

static void add_drops(struct stats_doc *d, const struct netstack_stats *ns,
		      const struct udp_path_stats *us)
{
	stats_doc_counter(d, "drops.malformed", ns->drops_malformed);
	stats_doc_counter(d, "drops.fragment", ns->drops_fragment);
	stats_doc_counter(d, "drops.esp", ns->drops_esp);
	stats_doc_counter(d, "drops.icmp", ns->drops_icmp);
	stats_doc_counter(d, "drops.unmapped_downlink", ns->drops_unmapped_downlink);
	stats_doc_counter(d, "drops.unmapped_uplink_rst", ns->unmapped_uplink_rst);
	stats_doc_counter(d, "drops.own_address", ns->drops_own_address);
	stats_doc_counter(d, "drops.loop", ns->drops_loop + us->drops[UDP_DROP_loop]);
	stats_doc_counter(d, "drops.special_destination", ns->drops_special_destination);
	stats_doc_counter(d, "drops.nat_exhausted", ns->drops_nat_exhausted);
	stats_doc_counter(d, "drops.half_open", ns->drops_half_open);
	stats_doc_counter(d, "drops.admission_refused", ns->admission_refused);
	stats_doc_counter(d, "drops.fd_exhausted", ns->fd_exhausted);
	stats_doc_counter(d, "drops.udp_queue_full", us->queue_drops);
	stats_doc_counter(d, "drops.protocol", ns->drops_protocol);
	stats_doc_counter(d, "drops.unmapped_rst", ns->drops_unmapped_rst);
	stats_doc_counter(d, "drops.no_memory", ns->drops_no_memory);
}

static void add_sessions(struct ts_proxy *p, struct stats_doc *d, const struct netstack_stats *ns,
			 const struct udp_path_stats *us, const struct dispatcher_stats *ds)
{
	struct budget_buffer_stats bs;

	stats_doc_add_u64(d, "nat.half_open", STATS_GAUGE, ns->nat_half_open);
	stats_doc_add_u64(d, "nat.active", STATS_GAUGE, ns->nat_active);
	stats_doc_add_u64(d, "nat.closing", STATS_GAUGE, ns->nat_closing);
	stats_doc_add_u64(d, "nat.quarantined", STATS_GAUGE, ns->nat_quarantined);
	stats_doc_add_u64(d, "sessions.active", STATS_GAUGE, ds->sessions_active);
	stats_doc_counter(d, "sessions.total", ds->sessions_total);
	stats_doc_counter(d, "sessions.refused",
			  ds->sessions_refused + ns->admission_refused + ns->fd_exhausted);
	for (int i = 0; i < DISPATCHER_FAIL_MAX; i++) {
		char key[64];
		snprintf(key, sizeof(key), "sessions.failed.%s",
			 dispatcher_fail_name((enum dispatcher_fail)i));
		stats_doc_counter(d, key, ds->fail[i]);
	}
	stats_doc_add_u64(d, "udp.sessions", STATS_GAUGE, us->sessions);
	stats_doc_counter(d, "udp.datagrams_up", us->up_datagrams);
	stats_doc_counter(d, "udp.bytes_up", us->up_bytes);
	stats_doc_counter(d, "udp.datagrams_down", us->down_datagrams);
	stats_doc_counter(d, "udp.bytes_down", us->down_bytes);
	stats_doc_counter(d, "udp.queue_drops", us->queue_drops);
	stats_doc_counter(d, "udp.dns_done", us->dns_done);
	stats_doc_counter(d, "udp.dns_expired", us->dns_expired);
	stats_doc_add_u64(d, "udp.assocs", STATS_GAUGE, us->assocs);
	stats_doc_counter(d, "udp.assocs_total", us->assocs_total);
	stats_doc_counter(d, "udp.assoc_failures", us->assoc_failures);
	stats_doc_counter(d, "udp.assoc_control_closed", us->assoc_control_closed);
	stats_doc_counter(d, "udp.resolve_failures", us->resolve_failures);
	stats_doc_counter(d, "udp.trains", us->trains);
	stats_doc_counter(d, "udp.train_datagrams", us->train_datagrams);
	stats_doc_counter(d, "udp.train_errors", us->train_errors);
	stats_doc_counter(d, "udp.gro_datagrams", us->gro_datagrams);
	stats_doc_counter(d, "udp.up_trains", us->up_trains);
	stats_doc_counter(d, "udp.up_train_datagrams", us->up_train_datagrams);
	stats_doc_counter(d, "udp.up_train_errors", us->up_train_errors);
	stats_doc_add_u64(d, "udp.fast_flows", STATS_GAUGE, us->fast_flows);
	stats_doc_counter(d, "udp.fast_added", us->fast_added);
	stats_doc_counter(d, "udp.fast_refused", us->fast_refused);
	stats_doc_counter(d, "udp.fast_kept", us->fast_kept);
	stats_doc_counter(d, "udp.expiry_spare_used", us->expiry_spare_used);
	stats_doc_counter(d, "udp.expiry_unarmed", us->expiry_unarmed);
	for (int i = 0; i < UDP_DROP_MAX; i++) {
		char key[64];
		snprintf(key, sizeof(key), "udp.drops.%s", udp_drop_name((enum udp_drop)i));
		stats_doc_counter(d, key, us->drops[i]);
	}
	if (p->budget)
		budget_buffer_stats(p->budget, ds->sessions_active + us->sessions, &bs);
	else
		memset(&bs, 0, sizeof(bs));
	stats_doc_add_u64(d, "buffers.in_use_bytes", STATS_GAUGE, bs.bytes_in_use);
	stats_doc_add_u64(d, "buffers.peak_bytes", STATS_GAUGE, bs.bytes_peak);
	stats_doc_add_u64(d, "buffers.per_session_bytes", STATS_GAUGE, bs.bytes_per_session);
	stats_doc_add_u64(d, "buffers.stack_bytes", STATS_GAUGE, ns->stack_bytes);
	stats_doc_counter(d, "buffers.heap_trims", ds->heap_trims);
	stats_doc_counter(d, "buffers.quiet_trims", quiet_trims(p));
	stats_doc_add_u64(d, "splice.pipes", STATS_GAUGE, ds->pipes_in_use + ds->pipes_idle);
	stats_doc_add_u64(d, "splice.pipe_bytes", STATS_GAUGE, ds->pipe_bytes);
	stats_doc_counter(d, "splice.pipes_reclaimed", ds->pipes_reclaimed);
	stats_doc_counter(d, "splice.pipes_refused", ds->pipes_refused);
	stats_doc_counter(d, "relay.bytes_up", ds->bytes_up);
	stats_doc_counter(d, "relay.bytes_down", ds->bytes_down);
	stats_doc_counter(d, "relay.splice_bytes", ds->splice_bytes);
	stats_doc_counter(d, "relay.copy_bytes", ds->copy_bytes);
	stats_doc_counter(d, "relay.gather_bytes", ds->gather_bytes);
	stats_doc_counter(d, "relay.pipe_fallbacks", ds->pipe_fallbacks);
	/* route.sniff: TCP sessions (the dispatcher) and QUIC flows (the UDP path) together. */
	stats_doc_add_u64(d, "sniff.active", STATS_GAUGE, ds->sniff.active + us->sniff_active);
	stats_doc_counter(d, "sniff.started", ds->sniff.started + us->sniff_started);
	stats_doc_counter(d, "sniff.tls", ds->sniff.found[0]);
	stats_doc_counter(d, "sniff.http", ds->sniff.found[1]);
	stats_doc_counter(d, "sniff.quic", us->sniff_quic);
	stats_doc_counter(d, "sniff.no_name", ds->sniff.no_name + us->sniff_no_name);
	stats_doc_counter(d, "sniff.timeouts", ds->sniff.timeouts + us->sniff_timeouts);
	stats_doc_counter(d, "sniff.route_changed",
			  ds->sniff.route_changed + us->sniff_route_changed);
	stats_doc_counter(d, "sniff.overridden", ds->sniff.overridden + us->sniff_overridden);
	stats_doc_counter(d, "sniff.skipped.no_memory",
			  ds->sniff.skipped_no_memory + us->sniff_skipped_no_memory);
	stats_doc_counter(d, "sniff.skipped.busy", us->sniff_skipped_busy);
	stats_doc_counter(d, "sniff.skipped.other_flow", us->sniff_skipped_other_flow);
}

/* The own resolver (dns/server.h); zeros without one, so the keys never change. */
static void add_dns(struct ts_proxy *p, struct stats_doc *d, const struct dns_tcp_stats *t)
{
	struct dns_server_stats st = { 0 };
	uint64_t looked;

	if (p->dns)
		dns_server_get_stats(p->dns, &st);
	stats_doc_add_u64(d, "dns.tcp.connections", STATS_GAUGE, t->live);
	stats_doc_counter(d, "dns.tcp.connections_total", t->connections);
	stats_doc_counter(d, "dns.tcp.replies", t->replies);
	stats_doc_counter(d, "dns.tcp.refused", t->queries_refused);
	stats_doc_counter(d, "dns.tcp.closed_idle", t->closed_idle);
	stats_doc_counter(d, "dns.tcp.closed_bad_length", t->closed_bad_length);
	stats_doc_counter(d, "dns.tcp.closed_reset", t->closed_reset);
	stats_doc_counter(d, "dns.tcp.closed_nomem", t->closed_nomem);
	stats_doc_counter(d, "dns.tcp.closed_stalled", t->closed_stalled);
	looked = st.cache_hits + st.cache_misses;
	stats_doc_counter(d, "dns.queries", st.queries);
	stats_doc_counter(d, "dns.queries_tcp", st.queries_tcp);
	stats_doc_counter(d, "dns.answered.hosts", st.answered_hosts);
	stats_doc_counter(d, "dns.answered.fake", st.answered_fake);
	stats_doc_counter(d, "dns.answered.cache", st.answered_cache);
	stats_doc_counter(d, "dns.answered.upstream", st.answered_upstream);
	stats_doc_counter(d, "dns.answered.refused", st.answered_refused);
	stats_doc_counter(d, "dns.answered.empty", st.answered_empty);
	stats_doc_counter(d, "dns.answered.servfail", st.answered_servfail);
	stats_doc_counter(d, "dns.drops.malformed", st.drops_malformed);
	stats_doc_counter(d, "dns.drops.busy", st.drops_busy);
	stats_doc_counter(d, "dns.drops.no_memory", st.drops_no_memory);
	stats_doc_counter(d, "dns.drops.client_gone", st.drops_client_gone);
	stats_doc_counter(d, "dns.coalesced", st.coalesced);
	stats_doc_add_u64(d, "dns.pending", STATS_GAUGE, st.pending);
	stats_doc_counter(d, "dns.cache.hits", st.cache_hits);
	stats_doc_counter(d, "dns.cache.misses", st.cache_misses);
	stats_doc_add_u64(d, "dns.cache.entries", STATS_GAUGE, st.cache_entries);
	stats_doc_counter(d, "dns.cache.evictions", st.cache_evictions);
	stats_doc_counter(d, "dns.cache.not_stored_name_in_ttl", st.cache_not_stored_name_in_ttl);
	stats_doc_add_u64(d, "dns.cache.hit_rate_pct", STATS_GAUGE,
			  looked ? st.cache_hits * 100 / looked : 0);
	stats_doc_counter(d, "dns.upstream.queries", st.upstream_queries);
	stats_doc_counter(d, "dns.upstream.timeouts", st.upstream_timeouts);
	stats_doc_counter(d, "dns.upstream.errors", st.upstream_errors);
	stats_doc_counter(d, "dns.upstream.bad_answers", st.upstream_bad_answers);
	stats_doc_counter(d, "dns.upstream.tls_failures", st.upstream_tls_failures);
	stats_doc_counter(d, "dns.upstream.http_errors", st.upstream_http_errors);
	stats_doc_add_u64(d, "dns.fakeip.mappings", STATS_GAUGE, st.fake_mappings);
	stats_doc_add_u64(d, "dns.fakeip.pinned", STATS_GAUGE, st.fake_pinned);
	stats_doc_counter(d, "dns.fakeip.exhausted", st.fake_exhausted);
	stats_doc_counter(d, "dns.fakeip.unmapped", st.fake_unmapped);
}

/* The budget's permits and descriptors in use next to their limits (the TCP one of the tier
 * in force; the descriptors as fitted under RLIMIT_NOFILE at start) and every refusal. */
static void add_budget(struct ts_proxy *p, struct stats_doc *d)
{
	const struct budget_limits *l = p->budget ? budget_get_limits(p->budget) : NULL;
	struct budget_stats bs;
	uint64_t tcp_refused = 0;

	memset(&bs, 0, sizeof(bs));
	if (p->budget)
		budget_get_stats(p->budget, &bs);
	for (int i = 0; i < BUDGET_TIER_MAX; i++)
		tcp_refused += bs.tcp_refused[i];
	stats_doc_add_u64(d, "budget.tcp_in_use", STATS_GAUGE, bs.tcp_in_use);
	stats_doc_add_u64(d, "budget.tcp_peak", STATS_GAUGE, bs.tcp_peak);
	stats_doc_add_u64(d, "budget.tcp_limit", STATS_GAUGE, l ? l->tcp_sessions[bs.tier] : 0);
	stats_doc_counter(d, "budget.tcp_refused", tcp_refused);
	stats_doc_add_u64(d, "budget.udp_in_use", STATS_GAUGE, bs.udp_in_use);
	stats_doc_counter(d, "budget.udp_refused", bs.udp_refused);
	stats_doc_add_u64(d, "budget.fds_in_use", STATS_GAUGE, bs.fds_in_use);
	stats_doc_add_u64(d, "budget.fds_peak", STATS_GAUGE, bs.fds_peak);
	stats_doc_add_u64(d, "budget.fds_limit", STATS_GAUGE, l ? l->fds : 0);
	stats_doc_counter(d, "budget.fd_refused", bs.fd_refused);
	stats_doc_counter(d, "budget.buffer_refused", bs.buffer_refused);
}

/* The endpoint's own bounds (core/stats_http.h); 0 without an endpoint. */
static void add_stats_http(struct ts_proxy *p, struct stats_doc *d)
{
	struct stats_http_stats hs = { 0 };

	if (p->stats)
		stats_http_stats(p->stats, &hs);
	stats_doc_add_u64(d, "stats_http.connections", STATS_GAUGE, hs.connections);
	stats_doc_counter(d, "stats_http.refused", hs.refused);
	stats_doc_counter(d, "stats_http.timeouts", hs.timeouts);
	stats_doc_counter(d, "stats_http.no_memory", hs.no_memory);
}

/* throughput.*: bits per second over the window since the newest sample at least a second old
 * (core/ratemeter.h): TUN bytes both ways (IP), TCP and UDP payload both ways, the system
 * stack's fast path (IP, both ways together). */
static void add_throughput(struct ts_proxy *p, struct stats_doc *d,
			   const struct driver_counters *c, const struct dispatcher_stats *ds,
			   const struct udp_path_stats *us, const struct netstack_stats *ns)
{
	static const char *const keys[PROXY_RATES] = {
		"throughput.tun_rx_bps", "throughput.tun_tx_bps", "throughput.tcp_up_bps",
		"throughput.tcp_down_bps", "throughput.udp_up_bps", "throughput.udp_down_bps",
		"throughput.fast_path_bps",
	};
	const uint64_t v[PROXY_RATES] = { ctr_get(&c->rx_bytes), ctr_get(&c->tx_bytes),
					  ds->bytes_up, ds->bytes_down, us->up_bytes,
					  us->down_bytes, ns->fast_path_bytes };
	uint64_t rate[PROXY_RATES] = { 0 };
	int64_t win = 0;

	_Static_assert(PROXY_RATES <= RATEMETER_MAX, "the ratemeter holds PROXY_RATES counters");
	if (p->rates.n == PROXY_RATES)
		win = ratemeter_sample(&p->rates, ts_now_ns(), v, rate);
	stats_doc_add_u64(d, "throughput.window_ms", STATS_GAUGE, (uint64_t)(win / 1000000));
	for (int i = 0; i < PROXY_RATES; i++)
		stats_doc_add_u64(d, keys[i], STATS_GAUGE,
				  rate[i] > UINT64_MAX / 8 ? UINT64_MAX : rate[i] * 8);
}

void proxy_stats_fill(struct ts_proxy *p, struct stats_doc *d)
{
	struct netstack_stats ns = { 0 };
	struct udp_path_stats us = { 0 };
	struct dispatcher_stats ds = { 0 };

	if (p->ns)
		p->ops->stats(p->ns, &ns);
	if (p->udp)
		udp_path_stats(p->udp, &us);
	if (p->disp)
		dispatcher_get_stats(p->disp, &ds);
	struct driver_counters dc;

	drivers_sum(p, &dc);
	/* Offload headers that make no sense are malformed input too. */
	ns.drops_malformed += ctr_get(&dc.rx_bad_vnet_hdr) + ctr_get(&dc.udp_split_bad);
	add_process(p, d);
	add_tun(p, d, &ns, &dc);
	add_throughput(p, d, &dc, &ds, &us, &ns);
	add_drops(d, &ns, &us);
	add_sessions(p, d, &ns, &us, &ds);
	add_budget(p, d);
	add_dns(p, d, &ds.dns_tcp);
	add_stats_http(p, d);
	routing_stats(p, d);
	reload_stats(p, d);
	/* Every detailed counter of the stack and the driver, for diagnosis. */
	struct visit vs = { d, "stack_counters", STATS_COUNTER };
	if (p->ns) {
		p->ops->counters(p->ns, add_visited, &vs);
		vs.kind = STATS_GAUGE;
		if (p->ops->levels)
			p->ops->levels(p->ns, add_visited, &vs);
	}
	vs = (struct visit){ d, "driver", STATS_COUNTER };
	driver_counters_foreach(&dc, add_visited, &vs);
}

static void provide(void *arg, struct stats_doc *d)
{
	proxy_stats_fill(arg, d);
}

int proxy_stats_start(struct ts_proxy *p, char *err, size_t errlen)
{
	if (!p->cfg.stats.enabled)
		return 0;
	return stats_http_new(p->base, &p->cfg.stats.listen, provide, p, &p->stats, err, errlen);
}

void proxy_stats_stop(struct ts_proxy *p)
{
	stats_http_free(p->stats);
	p->stats = NULL;
}

int proxy_stats_json(struct ts_proxy *p, char **out, size_t *len)
{
	struct stats_doc *d = stats_doc_new();
	int ret;

	if (!d)
		return -ENOMEM;
	proxy_stats_fill(p, d);
	/* A key that could not be added (out of memory) fails the document, as /stats does. */
	if ((ret = stats_doc_error(d, NULL)) == 0)
		ret = stats_doc_json(d, out, len);
	stats_doc_free(d);
	return ret;
}
