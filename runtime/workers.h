/* workers.h — a proxy's TUN queues (internal to runtime/): one driver per queue, queue 0 on
 * the main loop's thread, every other queue on a worker thread of its own. */
#ifndef TS_RUNTIME_WORKERS_H
#define TS_RUNTIME_WORKERS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "runtime/memback.h"

struct ts_proxy;

/* One per TUN queue: its driver on its own loop. Queue 0 runs on the main loop's thread; with
 * tun.queues > 1 (system stack) every other queue has a worker thread of its own. */
struct worker {
	struct ts_proxy *p;
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
	_Atomic int gone_err;      /* -errno: this queue found the device gone (0: not) */
	struct memback memback;    /* this loop's quiet trim (queue 0's also runs the UDP path's) */
};

/* Queue drivers (and for queues 1.. their loops, stop events and UDP hand-off) on p's TUN;
 * the threads start later (workers_start, once the stack is up). Main thread. 0 or -errno
 * with err. */
int workers_init(struct ts_proxy *p, char *err, size_t errlen);
/* Start the threads of queues 1.., every signal blocked in them. 0 or -errno with err. */
int workers_start(struct ts_proxy *p, char *err, size_t errlen);
/* Stop and join the worker threads (before the stack goes: they call into it). Idempotent. */
void workers_stop(struct ts_proxy *p);
/* workers_stop, then free every queue's driver, loop and hand-off. Idempotent. */
void workers_free(struct ts_proxy *p);

#endif
