/* run.h — the running proxy: every long-lived object of `twinstack run`, owned in one struct. */
#ifndef TS_CLI_RUN_H
#define TS_CLI_RUN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cli/rps_auto.h"
#include "core/counter.h"
#include "core/config.h"
#include "core/log.h"
#include "stacks/netstack.h"

struct proxy;

/* One per TUN queue: its driver on its own loop. Queue 0 runs on the main loop's thread; with
 * tun.queues > 1 (system stack) every other queue has a worker thread of its own. */
struct worker {
	struct proxy *p;
	uint32_t q;
	struct event_base *base;   /* queue 0: the proxy's base */
	struct driver *driver;
	pthread_t thread;
	bool started;
	atomic_bool stopping;      /* set by the main thread before it asks the worker to stop */
	int stop_fd;               /* eventfd: the main thread asks the worker to leave its loop */
	struct event *stop_ev;
	/* UDP datagrams this worker reads go to the main loop's UDP path through a
	 * SOCK_SEQPACKET socketpair: [0] written by the worker, [1] read by the main loop. */
	int udp_fds[2];
	struct event *udp_ev;      /* on the main base, reading udp_fds[1] */
	ctr_t udp_handoff;         /* datagrams handed to the main loop */
	ctr_t udp_handoff_drops;   /* the socketpair was full: dropped */
};

struct proxy {
	struct ts_config cfg;
	struct log log;
	struct event_base *base;
	struct budget *budget;
	struct tun *tun;
	struct rps_auto rps;         /* tun.rps "auto" (main thread only) */
	struct driver *driver;       /* queue 0's: driver_tx for the UDP path and the stacks */
	struct worker *workers;      /* [tun_queues(tun)] */
	uint32_t nworkers;
	int worker_died_fd;          /* eventfd: a worker's loop ended without a stop request */
	struct event *worker_died_ev;
	struct dispatcher *disp;
	struct udp_path *udp;
	const struct netstack_ops *ops;
	struct netstack *ns;
	struct stats_http *stats;
	struct event *sig_int, *sig_term, *sig_pipe;
	int64_t started_ns;
	_Atomic int64_t rss_sampled_ns;
	int exit_code;
	bool stopping;
};

/* Start the stats endpoint (when configured). 0 or -errno with a message in err. */
int run_stats_start(struct proxy *p, char *err, size_t errlen);
void run_stats_stop(struct proxy *p);

#endif
