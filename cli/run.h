/* run.h — the running proxy: every long-lived object of `twinstack run`, owned in one struct. */
#ifndef TS_CLI_RUN_H
#define TS_CLI_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/config.h"
#include "core/log.h"
#include "stacks/netstack.h"

struct proxy {
	struct ts_config cfg;
	struct log log;
	struct event_base *base;
	struct budget *budget;
	struct tun *tun;
	struct driver *driver;
	struct dispatcher *disp;
	struct udp_path *udp;
	const struct netstack_ops *ops;
	struct netstack *ns;
	struct stats_http *stats;
	struct event *sig_int, *sig_term, *sig_pipe;
	int64_t started_ns;
	int64_t rss_sampled_ns;
	int exit_code;
	bool stopping;
};

/* Start the stats endpoint (when configured). 0 or -errno with a message in err. */
int run_stats_start(struct proxy *p, char *err, size_t errlen);
void run_stats_stop(struct proxy *p);

#endif
