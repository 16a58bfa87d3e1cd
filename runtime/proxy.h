/* proxy.h — the running proxy inside the library (internal to runtime/): every long-lived
 * object of one proxy — config, log, budget, TUN, per-queue drivers and worker threads, the
 * stack, dispatcher, UDP path, stats endpoint and the receive-steering policy — owned by one
 * struct ts_proxy. include/twinstack.h is the public face (runtime/api.c); this header is
 * what the runtime's files share.
 *
 * Threads: the caller's thread assembles the proxy (proxy_open) and hands it to the loop
 * thread, which runs the main event loop (queue 0, the UDP path, the dispatcher, the stack's
 * accept loop, the stats endpoint) and takes the proxy apart when the loop ends
 * (proxy_close). With tun.queues > 1 (system stack) queues 1.. each have a worker thread. */
#ifndef TS_RUNTIME_PROXY_H
#define TS_RUNTIME_PROXY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/config.h"
#include "core/counter.h"
#include "core/log.h"
#include "core/netlink.h"
#include "core/ratemeter.h"
#include "dispatch/dns_tcp.h"
#include "runtime/routecheck.h"
#include "runtime/rps_auto.h"
#include "stacks/netstack.h"

struct ts_proxy;
struct dns_server;
struct dns_local;
struct stats_doc;
struct worker;

enum proxy_state {
	PROXY_NEW,       /* created: config only */
	PROXY_STARTING,  /* ts_proxy_start is assembling it on the caller's thread */
	PROXY_RUNNING,   /* started: the loop thread runs */
	PROXY_STOPPED,   /* the loop thread took everything apart */
	PROXY_FAILED,    /* a start failed: config only, cannot start again */
};

/* The byte counters throughput.* rates (runtime/proxy_stats.c). */
#define PROXY_RATES 7

struct ts_proxy {
	struct ts_config cfg;
	struct log log;

	/* Set by the embedding program before start. */
	void (*log_fn)(void *arg, int level, const char *line, size_t len);
	void *log_arg;
	struct ts_sock_hook sock_hook;
	/* destination names (ts_proxy_set_namer), or NULL */
	const char *(*namer)(void *arg, int family, const uint8_t *dst, uint16_t port);
	void *namer_arg;
	char fake_name[256];         /* the fake-IP namer's answer (main loop) */
	int caller_fd;               /* a caller's TUN fd, or -1: open the config's TUN */
	bool least_privilege;        /* drop to the kept capabilities (and "user") at start */
	char *config_path;           /* the file the config came from (reload), or NULL */

	/* Lifecycle. state is written under lock; stop_requested and stop_fd serve
	 * ts_proxy_stop, which must be async-signal-safe. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	enum proxy_state state;
	atomic_bool stop_requested;
	int stop_fd;                 /* eventfd, made at creation: wakes the loop to stop */
	struct event *stop_ev;
	pthread_t loop_thread;
	pthread_t start_thread;          /* under lock: the thread in ts_proxy_start (STARTING) */
	bool joined;
	int exit_err;                /* 0 (stop on request) or the -errno that stopped it */
	bool stopping;               /* main loop only */

	/* The running parts (main loop thread once started). */
	struct event_base *base;
	struct budget *budget;
	struct budget_limits budget_loaded; /* cfg.budget as the config gave it (fds not fitted) */
	char tun_name_loaded[TS_IFNAME_MAX + 1]; /* cfg.tun.name and .mtu as the config gave them */
	uint32_t tun_mtu_loaded;                 /* (a caller's TUN puts the device's in cfg) */
	struct loopguard *loopguard; /* the ports of our own outbound sockets */
	struct resolver *resolver;   /* proxy server names not pinned (outbound/resolver.h) */
	uint32_t resolver_mark;      /* its sockets' mark: the start's route.default_mark */
	struct dns_server *dns;      /* the own resolver (dns.servers with hijack), or NULL */
	struct dns_local *dns_local; /* it on 127.0.0.1, for dns_resolver */
	struct dns_tcp_resolver dns_tcp; /* it for the dispatcher's TCP/53 sessions */
	struct resolver *dns_resolver; /* direct outbounds' names, through dns_local, or NULL */
	/* Routing (runtime/routing.h; main loop once started). */
	struct netlink nl;
	bool nl_open;
	struct routecheck rc;
	struct autoroute *ar;        /* tun.auto_route's rules, or NULL */
	int lock_keep;               /* during a reload: the namespace's ownership, or -1 */
	struct routewatch *rw;
	uint64_t route_repairs;      /* rules/routes auto_route put back */

	/* Reload (runtime/reload.h; main loop). live is the configuration new sessions get:
	 * cfg itself until the first reload, then one of gens. cfg keeps the running values of
	 * the keys a reload cannot change. */
	struct ts_config *live;
	struct cfg_gen *gens;
	uint64_t generation, reloads_ok, reloads_refused;
	char reload_result[16];
	char reload_error[TS_ERRLEN];
	char reload_kept[256];
	/* Reloads asked for from other threads: ts_proxy_reload (one at a time, reload_req_lock;
	 * answered under lock through cond) and ts_proxy_request_reload (a signal handler: a flag
	 * and the eventfd). */
	pthread_mutex_t reload_req_lock;
	int reload_fd;
	struct event *reload_ev;
	atomic_bool reload_file_pending;
	atomic_bool reload_thread_busy;  /* a thread prepares the signal's reload */
	atomic_bool reload_again;        /* another request came meanwhile */
	pthread_t reload_thread;
	bool reload_thread_made;         /* reload_thread to be joined (loop; then ts_proxy_wait) */
	bool loop_ended;                 /* under lock: no reload is answered any more */
	struct reload_prep *rl_prep;     /* under lock: the prepared request, or NULL */
	int rl_prep_ret;
	uint64_t rl_asked, rl_answered;
	unsigned rl_preparing;           /* under lock: reloads being prepared on callers' threads
					  * (they read p's TUN, resolver, configuration): the
					  * loop's thread waits for none before closing those */
	int rl_ret;
	char rl_err[TS_ERRLEN];          /* the preparation's error, then the answer's */
	struct tun *tun;
	char unavailable[160];       /* config settings a caller's TUN cannot honour, "," list */
	struct rps_auto rps;         /* tun.rps "auto" (main thread only) */
	struct driver *driver;       /* queue 0's: driver_tx for the UDP path and the stacks */
	struct worker *workers;      /* [tun_queues(tun)] */
	uint32_t nworkers;
	int worker_died_fd;          /* eventfd: a worker's loop ended without a stop request */
	struct event *worker_died_ev;
	uint8_t *handoff_buf;        /* main loop only: datagrams from workers */
	struct dispatcher *disp;
	struct udp_path *udp;
	const struct netstack_ops *ops;
	struct netstack *ns;
	struct stats_http *stats;
	int64_t started_ns;
	_Atomic int64_t rss_sampled_ns;
	/* throughput.* of /stats: rates of the byte counters, sampled as the document is built
	 * (on the loop, or under lock when nothing runs); n 0 until the start. */
	struct ratemeter rates;

	/* Stats documents asked for from other threads (ts_proxy_stats_json): one request at
	 * a time (stats_req_lock); the loop answers under lock and signals cond. */
	pthread_mutex_t stats_req_lock;
	int stats_fd;                /* eventfd: a request is waiting */
	struct event *stats_ev;
	uint64_t stats_asked, stats_answered;
	char *stats_json;            /* the answer, or the final document once stopped */
	size_t stats_len;
	int stats_ret;
};

/* Assemble everything after the config, on the caller's thread: budget, loop, TUN (own or the
 * caller's), workers, dispatcher, UDP path, stack (listeners bound), stats endpoint; the
 * worker threads run once this returns 0. -errno with one line in err; then proxy_close. */
int proxy_open(struct ts_proxy *p, char *err, size_t errlen);
/* Take apart whatever proxy_open built (idempotent, any subset). */
void proxy_close(struct ts_proxy *p);
/* Main loop: stop accepting, end every session, leave the loop; err 0 or -errno. */
void proxy_stop_loop(struct ts_proxy *p, int err);

/* proxy_stats.c: the /stats document (the same keys for every stack) and the endpoint. */
void proxy_stats_fill(struct ts_proxy *p, struct stats_doc *d);
int proxy_stats_start(struct ts_proxy *p, char *err, size_t errlen);
void proxy_stats_stop(struct ts_proxy *p);
/* The document as JSON (malloc'd, NUL-terminated): 0 or -ENOMEM. Any thread that may read
 * p's running parts (the loop thread, or any thread before start / after stop). */
int proxy_stats_json(struct ts_proxy *p, char **out, size_t *len);

/* DNS over TLS or HTTPS servers and QUIC sniffing use OpenSSL (and nghttp2), which the program
 * opens only when a configuration needs them (core/tlslib.h). Opens what cfg needs — its DNS
 * servers' only with servers (a reload keeps the running ones) — so that a system without
 * them stops the start (or refuses the reload) with the reason instead of failing a query or
 * a flow later. 0, or -errno with one line in err. Any thread. */
int proxy_open_tls_libs(const struct ts_config *cfg, bool servers, char *err, size_t errlen);

/* Each outbound's resolver: direct ones the own resolver's (dns_resolver) when there is one,
 * the others (proxy servers given by name) the system's; and the proxy's budget for the
 * descriptors of Happy Eyeballs' extra attempts. */
void proxy_assign_resolvers(struct ts_proxy *p, struct ts_config *cfg);

#endif
