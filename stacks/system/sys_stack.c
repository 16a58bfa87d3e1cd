/* sys_stack.c — the system stack at run time: kernel listeners on the gateway, the accept loop
 * that turns an accepted socket back into the original 5-tuple, the session guard, and the NAT
 * purge timer. The per-packet work is sysproc.c; this file owns the fds. */
#include "stacks/system/sys_stack.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/log.h"
#include "core/rss.h"
#include "core/sysfile.h"
#include "dispatch/dispatcher.h"
#include "dispatch/stream.h"
#include "stacks/netstack.h"
#include "stacks/system/fastpath.h"
#include "stacks/system/nat.h"
#include "stacks/system/sys_config.h"
#include "stacks/system/sysproc.h"
#include "stacks/system/udpfast.h"

#define ACCEPT_BATCH 64                    /* accepts per wakeup: bounded work */
#define PURGE_BUDGET 1024                  /* NAT entries removed per purge run */
#define TRIM_MIN_ENTRIES 256               /* a NAT peak below this is not worth a trim */
#define TRIM_MIN_QUARANTINE 4096           /* the same for the quarantine ring (16 B each) */
#define TRIM_DELAY_MS 1000
/* A connection joins the in-kernel fast path once it has lived this long: the map's four
 * system calls are not spent on the many that end sooner (a request and its answer). */
#define FAST_PATH_AGE_NS (10 * TS_NS_PER_MS)
#define BACKOFF_RESOURCE_NS (50 * TS_NS_PER_MS) /* EMFILE, ENFILE, ENOBUFS, ENOMEM */
#define BACKOFF_TRANSIENT_NS (1 * TS_NS_PER_MS) /* EINTR, EPROTO, ECONNABORTED, ... */

#define STACK_COUNTERS(X)                                                                      \
	X(accepted)          /* sessions handed to the dispatcher */                           \
	X(accept_foreign)    /* a peer that is not one of our NAT addresses: closed */         \
	X(accept_miss)       /* no HALF_OPEN mapping for the peer's tuple: reset */            \
	X(admission_refused) /* no TCP permit (budget / pressure tier): reset, mark closing */ \
	X(fd_exhausted)      /* no fd budget left: reset, mark closing */                      \
	X(accept_backoff)    /* accept paused 50 ms on resource exhaustion */                  \
	X(accept_retry)      /* accept paused 1 ms on a transient error */                     \
	X(session_setup_failed) /* out of memory wrapping the socket or dispatching */          \
	X(nat_trims)         /* the NAT table's spare memory given back after a load fell */   \
	X(nat_trimmed_bytes) /* bytes those trims gave back */

struct stack_counters {
#define STACK_CTR_FIELD(name) ctr_t name;
	STACK_COUNTERS(STACK_CTR_FIELD)
#undef STACK_CTR_FIELD
};

struct sys_stack;

struct sys_listener {
	struct sys_stack *st;
	struct event *ev;
	int fd;
	uint8_t family;
	uint8_t idx;
};

struct sys_stack {
	struct netstack_env env;
	struct nat_table *nat;
	struct sysproc *proc;
	struct sys_counters *pctr;         /* the packet path's: one block per TUN queue */
	struct sys_qto *qto;               /* per queue: its last write's connection (write_queue) */
	uint32_t nq;
	struct stack_counters ctr;
	struct sys_listener lis[2][NAT_MAX_LISTENERS]; /* [0] IPv4, [1] IPv6 */
	uint32_t n_lis;
	bool has6;
	bool paused;
	bool sndbuf_warned;                /* nat.accepted_sndbuf capped: said once */
	bool stopped;
	struct event *purge_ev;
	_Atomic int64_t purge_at;          /* deadline the purge timer is armed for */
	int kick_fd;                       /* queues > 1: workers ask the main loop to re-arm */
	struct event *kick_ev;
	struct event *resume_ev;
	struct event *trim_ev;             /* one-shot: the NAT's memory back (maybe_trim) */
	uint64_t trim_peak, trim_qpeak;    /* most entries / resting tuples since the last trim */
	struct log_ratelimit rl_accept;
	struct fastpath *fp;               /* the in-kernel fast path, or NULL */
	bool fp_unavailable;               /* nat.fast_path "auto" and it could not start */
	ctr_t fp_added, fp_full, fp_failed; /* connections: put in its map, no room, refused */
	struct sys_guard *fp_oldest, *fp_newest; /* waiting to join it, oldest first */
	struct event *fp_ev;               /* one-shot: the oldest waiting one is old enough */
	struct udpfast uf;                 /* UDP flows into it (the UDP path's offload) */
	bool uf_on;                        /* the UDP path has the offload */
	bool uf_asked;                     /* there is a UDP path to give it flows */
	bool uf_refused;                   /* the fast path started without them (refused) */
};

/* One per session: marks the NAT entry closing and returns the permit and fd however the
 * session ends, so no entry stays ACTIVE after its session. */
struct sys_guard {
	struct sys_stack *st;
	struct nat_tuple tuple;
	uint64_t gen;
	bool fast;               /* in the fast path's map: out again before the linger */
	bool waiting;            /* in the list of those to join it (fast_wait) */
	struct flow_key key;     /* the app's side, as fastpath_add gets it */
	int64_t since;           /* accepted at (monotonic ns) */
	struct sys_guard *prev, *next; /* the waiting list, oldest first */
};

/* The connection number of a queue's last write (0: none), for write_queue, on a cache line of
 * its own (each queue's thread writes its own at every packet). */
struct sys_qto {
	alignas(64) uint32_t conn;
};

/* Bytes between two queues' counter blocks: whole cache lines. */
static size_t pctr_stride(void)
{
	return (sizeof(struct sys_counters) + 63) & ~(size_t)63;
}

static struct sys_stack *as_sys(struct netstack *ns)
{
	return (struct sys_stack *)ns;
}

/* ---- purge timer ---------------------------------------------------------------------------- */

/* Arm the one purge timer at the table's next deadline (none: disarmed, an idle table never
 * wakes the loop). after_purge: work was left over, so never sooner than 1 ms (no busy loop).
 *
 * With several queues a worker may insert an entry while this runs. The worker inserts, then
 * reads purge_at and kicks if its deadline is earlier; here purge_at is stored, then the
 * deadlines are read again. The fences on both sides (store-buffer pattern) guarantee that at
 * least one of the two sees the other, so no entry is left without a timer. */
static void arm_purge(struct sys_stack *st, int64_t now, bool after_purge)
{
	int64_t next = nat_next_deadline(st->nat);

	for (int pass = 0; pass < 2; pass++) {
		if (next == INT64_MAX) {
			if (st->purge_at != INT64_MAX)
				evtimer_del(st->purge_ev);
			st->purge_at = INT64_MAX;
		} else if (after_purge || st->purge_at > next) {
			int64_t delay = next - now;
			if (delay < (after_purge ? TS_NS_PER_MS : 0))
				delay = after_purge ? TS_NS_PER_MS : 0;
			struct timeval tv = { .tv_sec = delay / TS_NS_PER_SEC,
					      .tv_usec = (delay % TS_NS_PER_SEC) / 1000 };
			/* Not armed (no memory for the timer): purge_at stays, so the next
			 * call tries again. */
			if (evtimer_add(st->purge_ev, &tv) == 0)
				st->purge_at = next;
		}
		if (st->nq == 1)
			return;
		atomic_thread_fence(memory_order_seq_cst);
		next = nat_next_deadline(st->nat);
		if (next >= st->purge_at)
			return;
		after_purge = false; /* an earlier entry arrived meanwhile: arm for it */
	}
}

/* A worker created an entry whose deadline is earlier than the armed one. */
static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct sys_stack *st = arg;
	uint64_t v;

	(void)what;
	if (read(fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: another kick's read got it; nothing is lost either way */
	}
	arm_purge(st, ts_now_ns(), false);
}

/* ---- memory back after a load -------------------------------------------------------------- */

/* The NAT table keeps the slab, hash buckets, quarantine ring and owner-map pages a burst
 * grew: a connection-rate burst leaves tens of thousands of entries' worth behind for good
 * otherwise. Each purge notes the most entries (and resting tuples) seen since the last trim;
 * once they have fallen to a quarter of that peak, or the table has emptied (no entry, no
 * resting tuple) after any use, a one-shot timer TRIM_DELAY_MS later gives the spare back
 * (nat_trim) and the heap's free pages with it. Purges run only while entries expire or
 * tuples rest, so an idle table never wakes for this. */
static uint64_t nat_live(const struct nat_stats *n)
{
	return n->entries[NAT_HALF_OPEN] + n->entries[NAT_ACTIVE] + n->entries[NAT_CLOSING];
}

static bool trim_due(const struct sys_stack *st, const struct nat_stats *n)
{
	uint64_t live = nat_live(n);

	if (live == 0 && n->quarantine == 0)
		return st->trim_peak > 0 || st->trim_qpeak > 0;
	return (st->trim_peak >= TRIM_MIN_ENTRIES && live * 4 <= st->trim_peak) ||
	       (st->trim_qpeak >= TRIM_MIN_QUARANTINE && n->quarantine * 4 <= st->trim_qpeak);
}

static void on_trim(evutil_socket_t fd, short what, void *arg)
{
	struct sys_stack *st = arg;
	struct nat_stats n;

	(void)fd;
	(void)what;
	nat_get_stats(st->nat, &n);
	if (trim_due(st, &n)) {
		size_t freed = nat_trim(st->nat, st->nq == 1);

		ctr_inc(&st->ctr.nat_trims);
		ctr_add(&st->ctr.nat_trimmed_bytes, freed);
		rss_heap_trim();
	}
	st->trim_peak = nat_live(&n);
	st->trim_qpeak = n.quarantine;
}

static void maybe_trim(struct sys_stack *st)
{
	static const struct timeval delay = { TRIM_DELAY_MS / 1000, (TRIM_DELAY_MS % 1000) * 1000 };
	struct nat_stats n;

	nat_get_stats(st->nat, &n);
	if (nat_live(&n) > st->trim_peak)
		st->trim_peak = nat_live(&n);
	if (n.quarantine > st->trim_qpeak)
		st->trim_qpeak = n.quarantine;
	/* A trim that cannot be timed (no memory for the timer) is done now: memory back is the
	 * right answer to a shortage. */
	if (!st->stopped && trim_due(st, &n) && !evtimer_pending(st->trim_ev, NULL) &&
	    evtimer_add(st->trim_ev, &delay) != 0)
		on_trim(-1, 0, st);
}

static void on_purge(evutil_socket_t fd, short what, void *arg)
{
	struct sys_stack *st = arg;
	int64_t now = ts_now_ns();

	(void)fd;
	(void)what;
	st->purge_at = INT64_MAX;
	maybe_trim(st); /* before: the peak includes what this purge removes */
	nat_purge(st->nat, now, PURGE_BUDGET);
	maybe_trim(st);
	arm_purge(st, now, nat_next_deadline(st->nat) <= now);
}

/* ---- sessions ------------------------------------------------------------------------------- */

/* Close with RST (SO_LINGER 0): the app sees the refusal at once, not a FIN it may misread. */
static void close_reset(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

/* The UDP path's flows out of the fast path, and no more offered (before it goes). */
static void fast_udp_off(struct sys_stack *st)
{
	if (!st->uf_on)
		return;
	udp_path_set_offload(st->env.udp, NULL, NULL);
	udpfast_fini(&st->uf);
	st->uf_on = false;
}

/* Hand an accepted connection's segments to the in-kernel fast path. Failing that, the
 * userspace path goes on translating them: nothing is lost. A map the process may no longer
 * write (kernels before 6.0 check the capability at every map update, and least privilege
 * has dropped it) ends the fast path for good: no connection is in it then, since no update
 * ever succeeded, or it would have kept succeeding. */
static void fast_add(struct sys_stack *st, struct sys_guard *g)
{
	const uint8_t *nat, *gw;
	uint16_t lport;
	int ret;

	if (sysproc_tuple_rewrite(st->proc, &g->tuple, &nat, &gw, &lport) != 0)
		return;
	ret = fastpath_add(st->fp, &g->key, nat, htons(g->tuple.port), gw, lport);
	if (ret == 0) {
		g->fast = true;
		ctr_inc(&st->fp_added);
		return;
	}
	if (ret == -E2BIG) {
		ctr_inc(&st->fp_full);
		return;
	}
	ctr_inc(&st->fp_failed);
	if ((ret == -EPERM || ret == -EACCES) && ctr_get(&st->fp_added) == 0) {
		log_warn(st->env.log, "system stack: in-kernel fast path unavailable: its map "
			 "refuses updates (%s); every connection takes the userspace path",
			 strerror(-ret));
		fast_udp_off(st);
		fastpath_free(st->fp);
		st->fp = NULL;
		st->fp_unavailable = true;
	}
}

static void fast_del(struct sys_stack *st, struct sys_guard *g)
{
	const uint8_t *nat, *gw;
	uint16_t lport;

	if (sysproc_tuple_rewrite(st->proc, &g->tuple, &nat, &gw, &lport) == 0)
		fastpath_del(st->fp, &g->key, nat, htons(g->tuple.port), gw, lport);
	g->fast = false;
}

/* The waiting list: accepted connections, oldest first, that join the fast path when
 * FAST_PATH_AGE_NS old; one timer for the oldest. All on the main loop (accepts, session
 * ends and the timer). */
static void fast_unwait(struct sys_stack *st, struct sys_guard *g)
{
	*(g->prev ? &g->prev->next : &st->fp_oldest) = g->next;
	*(g->next ? &g->next->prev : &st->fp_newest) = g->prev;
	g->prev = g->next = NULL;
	g->waiting = false;
}

/* Not armed for want of memory: the waiting connections go on in userspace, as every
 * connection does before its age, and the next accepted one (fast_wait) tries again. */
static void fast_arm(struct sys_stack *st, int64_t now)
{
	int64_t left = st->fp_oldest ? st->fp_oldest->since + FAST_PATH_AGE_NS - now : 0;
	struct timeval tv = { 0, left > 0 ? (suseconds_t)(left / 1000) + 1 : 0 };

	if (st->fp_oldest)
		(void)evtimer_add(st->fp_ev, &tv);
}

static void fast_wait(struct sys_stack *st, struct sys_guard *g, int64_t now)
{
	g->since = now;
	g->waiting = true;
	g->next = NULL;
	g->prev = st->fp_newest;
	*(st->fp_newest ? &st->fp_newest->next : &st->fp_oldest) = g;
	st->fp_newest = g;
	if (!evtimer_pending(st->fp_ev, NULL))
		fast_arm(st, now);
}

static void on_fast_due(evutil_socket_t fd, short what, void *arg)
{
	struct sys_stack *st = arg;
	int64_t now = ts_now_ns();
	struct sys_guard *g;

	while ((g = st->fp_oldest) && (!st->fp || now - g->since >= FAST_PATH_AGE_NS)) {
		fast_unwait(st, g);
		if (st->fp)
			fast_add(st, g);
	}
	fast_arm(st, now);
}

static void session_end(void *arg)
{
	struct sys_guard *g = arg;
	struct sys_stack *st = g->st;
	int64_t now;

	if (g->waiting)
		fast_unwait(st, g);
	if (g->fast && st->fp)
		fast_del(st, g);
	now = ts_now_ns();
	nat_mark_closing(st->nat, &g->tuple, g->gen, now);
	budget_tcp_release(st->env.budget);
	budget_fd_release(st->env.budget, 1);
	free(g);
	arm_purge(st, now, false);
}

/* The NAT address index of peer (one of gateway+1 .. gateway+n), or -1. */
static int nat_index(const struct sys_stack *st, const struct sockaddr_storage *ss, uint8_t *fam,
		     uint16_t *port)
{
	const struct ts_config *cfg = st->env.cfg;
	const struct netaddr_roles *r;
	const uint8_t *a;

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
		r = &cfg->roles4;
		a = (const uint8_t *)&s4->sin_addr;
		*fam = 4;
		*port = ntohs(s4->sin_port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
		r = &cfg->roles6;
		a = (const uint8_t *)&s6->sin6_addr;
		*fam = 6;
		*port = ntohs(s6->sin6_port);
	} else {
		return -1;
	}
	if (r->family != *fam || !sysproc_is_own(st->proc, *fam, a))
		return -1;
	size_t alen = *fam == 4 ? 4 : 16;
	uint32_t lo, gw;
	memcpy(&lo, a + alen - 4, 4);
	memcpy(&gw, r->gateway.a + alen - 4, 4);
	uint32_t off = ntohl(lo) - ntohl(gw);
	return off >= 1 && off <= r->n_nat ? (int)(off - 1) : -1;
}

/* Refuse an accepted connection whose mapping exists: RST, and the mapping lingers so the
 * kernel's RST reaches the app through the downlink rewrite (without the mapping the app
 * would retransmit into nothing until it timed out). */
static void refuse(struct sys_stack *st, int fd, const struct nat_tuple *t, uint64_t gen,
		   ctr_t *reason)
{
	int64_t now = ts_now_ns();
	close_reset(fd);
	nat_mark_closing(st->nat, t, gen, now);
	ctr_inc(reason);
	arm_purge(st, now, false);
}

/* Was the connection (key: its application side) opened by one of the proxy's own outbound
 * sockets come back through the TUN: from the gateway and a port on record? The packet path
 * drops such a SYN already; with several queues a worker can read it before the connect that
 * sent it has put the socket on record. Outbound connects run on this loop and record their
 * socket before it returns to accept anything, so here the record is always older. */
static bool from_self(const struct sys_stack *st, const struct flow_key *key)
{
	return l3policy_addr_from_self(sysproc_policy(st->proc), key->family, key->src,
				       key->sport_be);
}

static void session_start(struct sys_listener *l, int fd, const struct sockaddr_storage *ss)
{
	struct sys_stack *st = l->st;
	struct nat_tuple t = { .listener = l->idx };
	struct flow_key key;
	struct stream *s;
	struct sys_guard *g;
	uint64_t gen;
	uint16_t port;
	int idx = nat_index(st, ss, &t.family, &port);

	if (idx < 0 || t.family != l->family) {
		close(fd); /* not a connection we rewrote: the listener is reachable locally too */
		ctr_inc(&st->ctr.accept_foreign);
		return;
	}
	t.addr = (uint8_t)idx;
	t.port = port;
	/* Look up + mark ACTIVE + stamp the generation: one critical section in the table. */
	if (nat_accept(st->nat, &t, ts_now_ns(), &key, &gen) != 0) {
		close_reset(fd);
		ctr_inc(&st->ctr.accept_miss);
		return;
	}
	/* A loop: RST, so our socket's connection fails at once (drops.loop; queue 0's counter
	 * block is this thread's). */
	if (from_self(st, &key)) {
		refuse(st, fd, &t, gen, &st->pctr->policy.drop_loop);
		return;
	}
	if (budget_tcp_acquire(st->env.budget) != 0) {
		refuse(st, fd, &t, gen, &st->ctr.admission_refused);
		return;
	}
	if (budget_fd_reserve(st->env.budget, 1) != 0) {
		budget_tcp_release(st->env.budget);
		refuse(st, fd, &t, gen, &st->ctr.fd_exhausted);
		return;
	}
	g = malloc(sizeof(*g));
	if (!g || stream_sock_new(st->env.base, fd, &s) != 0) {
		free(g);
		budget_tcp_release(st->env.budget);
		budget_fd_release(st->env.budget, 1);
		refuse(st, fd, &t, gen, &st->ctr.session_setup_failed);
		return;
	}
	*g = (struct sys_guard){ .st = st, .tuple = t, .gen = gen, .key = key };
	if (st->fp)
		fast_wait(st, g, ts_now_ns());
	ctr_inc(&st->ctr.accepted);
	/* From here the dispatcher owns the stream and calls session_end exactly once. */
	dispatcher_start_tcp(st->env.dispatcher, &key, s, session_end, g);
}

/* ---- accept loop ------------------------------------------------------------------------------ */

/* Watch (on) or stop watching every listener. 0, or -ENOMEM: libevent had no memory to watch
 * one (those before it are watched; the caller decides). */
static int listeners_enable(struct sys_stack *st, bool on)
{
	int ret = 0;

	for (int f = 0; f < 2; f++)
		for (uint32_t i = 0; i < st->n_lis; i++) {
			struct event *ev = st->lis[f][i].ev;

			if (!ev)
				continue;
			if (!on)
				event_del(ev);
			else if (event_add(ev, NULL) != 0)
				ret = -ENOMEM;
		}
	st->paused = !on;
	return ret;
}

#define RESUME_RETRY_NS (50 * TS_NS_PER_MS)

static void pause_accept(struct sys_stack *st, int64_t delay_ns);

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
	struct sys_stack *st = arg;
	(void)fd;
	(void)what;
	/* A listener libevent could not watch again would never accept: try again shortly. */
	if (!st->stopped && listeners_enable(st, true) != 0)
		pause_accept(st, RESUME_RETRY_NS);
}

/* Stop accepting for delay_ns. If the resume cannot be timed (no memory for the timer), the
 * listeners stay watched: accepting too early beats never accepting again. */
static void pause_accept(struct sys_stack *st, int64_t delay_ns)
{
	struct timeval tv = { .tv_sec = delay_ns / TS_NS_PER_SEC,
			      .tv_usec = (delay_ns % TS_NS_PER_SEC) / 1000 };

	if (evtimer_add(st->resume_ev, &tv) != 0)
		return;
	listeners_enable(st, false);
}

enum sys_accept_class sys_stack_accept_error_class(int err)
{
	switch (err) {
	case EAGAIN:
		return SYS_ACCEPT_AGAIN;
	case EMFILE:
	case ENFILE:
	case ENOBUFS:
	case ENOMEM:
		return SYS_ACCEPT_BACKOFF;
	case EINTR:
	case EPROTO:
	case ECONNABORTED:
	/* accept(2): errors of the pending connection itself, to be treated like EAGAIN. */
	case ENETDOWN:
	case ENOPROTOOPT:
	case EHOSTDOWN:
	case ENONET:
	case EHOSTUNREACH:
	case EOPNOTSUPP:
	case ENETUNREACH:
		return SYS_ACCEPT_RETRY;
	default:
		return SYS_ACCEPT_FATAL;
	}
}

/* Act on an accept() error by its class: resource exhaustion backs off, transient errors retry
 * soon, anything else is fatal. Returns false when the loop must stop. */
static bool accept_error(struct sys_stack *st, int err)
{
	switch (sys_stack_accept_error_class(err)) {
	case SYS_ACCEPT_AGAIN:
		return true;
	case SYS_ACCEPT_BACKOFF:
		ctr_inc(&st->ctr.accept_backoff);
		log_warn_rl(st->env.log, &st->rl_accept, ts_now_ns(),
			    "system stack: accept: %s; backing off 50 ms", strerror(err));
		pause_accept(st, BACKOFF_RESOURCE_NS);
		return true;
	case SYS_ACCEPT_RETRY:
		ctr_inc(&st->ctr.accept_retry);
		pause_accept(st, BACKOFF_TRANSIENT_NS);
		return true;
	case SYS_ACCEPT_FATAL:
		break;
	}
	return false;
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct sys_listener *l = arg;
	struct sys_stack *st = l->st;

	(void)what;
	for (int i = 0; i < ACCEPT_BATCH && !st->paused; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			session_start(l, fd, &ss);
			continue;
		}
		int err = errno;
		if (err == EAGAIN || err == EWOULDBLOCK)
			break;
		if (!accept_error(st, err)) {
			char msg[128];
			snprintf(msg, sizeof(msg), "system stack: accept: %s", strerror(err));
			listeners_enable(st, false);
			st->env.fatal(st->env.fatal_arg, -err, msg);
			return;
		}
		break;
	}
}

/* ---- start / stop ----------------------------------------------------------------------------- */

/* The first line of a /proc file, without its newline ("" when it cannot be read). */
static void read_line(const char *path, char *buf, size_t len)
{
	if (sysfile_read_text(path, buf, len) != 0)
		buf[0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

/* nat.accepted_sndbuf on a listener: the sockets it accepts inherit the size and its lock, so the
 * kernel does not autotune them. These sockets send the downloads into the TUN, and the TUN
 * orphans every packet it queues, so TCP Small Queues cannot limit them: with autotuning each
 * grows to tcp_wmem[2] and all of it waits in the TUN's queue (tens of MiB with many downloads, a
 * round trip far longer than the hop's own, and the loop reads cold memory: docs/benchmarks.md).
 * SO_SNDBUFFORCE (CAP_NET_ADMIN) is not capped by net.core.wmem_max; without it SO_SNDBUF is, and
 * we say so once. 0, or -1 with errno set. */
static int listener_sndbuf(struct sys_stack *st, int fd)
{
	int want = (int)sys_config_accepted_sndbuf(st->env.cfg, st->env.tx_meta != NULL), got = 0;
	socklen_t gl = sizeof(got);

	if (want == 0)
		return 0;
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof(want)) != 0 &&
	    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want)) != 0)
		return -1;
	if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &gl) != 0)
		return -1;
	/* The kernel doubles the value for its bookkeeping and reports the doubled one. */
	if (got / 2 < want && !st->sndbuf_warned) {
		st->sndbuf_warned = true;
		log_warn(st->env.log,
			 "system stack: nat.accepted_sndbuf %d capped by the kernel at %d "
			 "(net.core.wmem_max; SO_SNDBUFFORCE needs CAP_NET_ADMIN)",
			 want, got / 2);
	}
	return 0;
}

/* nat.accepted_congestion on a listener (accepted sockets inherit a congestion control set on
 * their listener). The TUN hop is local and lossless, with a round trip of microseconds: a paced
 * algorithm such as bbr without an fq qdisc paces with TCP's own timer there and caps a download
 * well below what reno reaches (docs/benchmarks.md). "host" keeps the namespace's default. A name
 * the kernel does not have or does not allow stops the start, naming the field and the kernel's
 * lists. 0 or -errno. */
static int listener_congestion(struct sys_stack *st, int fd, char *err, size_t errlen)
{
	const char *cc = st->env.cfg->nat.accepted_congestion;
	char avail[256] = "", allowed[256] = "";
	int e;

	if (strcmp(cc, "host") == 0)
		return 0;
	if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) == 0)
		return 0;
	e = errno;
	read_line("/proc/sys/net/ipv4/tcp_available_congestion_control", avail, sizeof(avail));
	read_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control", allowed, sizeof(allowed));
	snprintf(err, errlen,
		 "system stack: nat.accepted_congestion \"%s\": %s (available: %s; allowed "
		 "without CAP_NET_ADMIN: %s; \"host\" keeps the default)",
		 cc, strerror(e), avail[0] ? avail : "?", allowed[0] ? allowed : "?");
	return -e;
}

/* Bind one listener to the gateway, port 0 (kernel-chosen). IPv6: a tentative (DAD) address
 * refuses bind with EADDRNOTAVAIL; IPV6_FREEBIND is the fallback. */
static int listener_open(struct sys_stack *st, uint8_t family, uint8_t idx, uint16_t *port_be,
			 char *err, size_t errlen)
{
	const struct ts_config *cfg = st->env.cfg;
	struct sys_listener *l = &st->lis[family == 6][idx];
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1, fd, ret;

	memset(&ss, 0, sizeof(ss));
	if (family == 4) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		s4->sin_family = AF_INET;
		memcpy(&s4->sin_addr, cfg->roles4.gateway.a, 4);
		sl = sizeof(*s4);
	} else {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		s6->sin6_family = AF_INET6;
		memcpy(&s6->sin6_addr, cfg->roles6.gateway.a, 16);
		sl = sizeof(*s6);
	}
	fd = socket(family == 4 ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		goto fail;
	if (family == 6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sl) != 0) {
		if (family != 6 || errno != EADDRNOTAVAIL ||
		    setsockopt(fd, IPPROTO_IPV6, IPV6_FREEBIND, &one, sizeof(one)) != 0 ||
		    bind(fd, (struct sockaddr *)&ss, sl) != 0)
			goto fail;
	}
	if (listener_sndbuf(st, fd) != 0)
		goto fail;
	if ((ret = listener_congestion(st, fd, err, errlen)) != 0) {
		close(fd);
		l->fd = -1;
		return ret;
	}
	if (listen(fd, (int)budget_get_limits(st->env.budget)->listen_backlog) != 0)
		goto fail;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
		goto fail;
	*port_be = family == 4 ? ((struct sockaddr_in *)&ss)->sin_port
			       : ((struct sockaddr_in6 *)&ss)->sin6_port;
	*l = (struct sys_listener){ .st = st, .fd = fd, .family = family, .idx = idx };
	l->ev = event_new(st->env.base, fd, EV_READ | EV_PERSIST, on_accept, l);
	if (!l->ev) {
		errno = ENOMEM;
		goto fail;
	}
	return 0;
fail:;
	int e = errno;
	snprintf(err, errlen, "system stack: listener on the IPv%u gateway: %s", family,
		 strerror(e));
	if (fd >= 0)
		close(fd);
	l->fd = -1;
	return -e;
}

static int build_proc(struct sys_stack *st, const uint16_t ports[2][NAT_MAX_LISTENERS])
{
	const struct ts_config *cfg = st->env.cfg;
	struct sysproc_config pc;

	memset(&pc, 0, sizeof(pc));
	pc.n_addrs = cfg->nat.addresses;
	pc.n_listeners = cfg->nat.listeners;
	pc.dns_hijack = cfg->dns.hijack;
	pc.dns_tcp = st->env.dns_tcp;
	pc.loopguard = st->env.loopguard;
	pc.conn_numbers = st->nq > 1;
	pc.v4.enabled = true;
	memcpy(pc.v4.gateway, cfg->roles4.gateway.a, 4);
	memcpy(pc.v4.listener_ports_be, ports[0], sizeof(pc.v4.listener_ports_be));
	if (st->has6) {
		pc.v6.enabled = true;
		memcpy(pc.v6.gateway, cfg->roles6.gateway.a, 16);
		memcpy(pc.v6.listener_ports_be, ports[1], sizeof(pc.v6.listener_ports_be));
	}
	return sysproc_new(&pc, st->nat, &st->proc);
}

static void sys_free(struct netstack *ns);

/* nat.fast_path: load the in-kernel fast path and attach it to the TUN. "auto" goes on without
 * it when it cannot (the log says why, /stats shows it unavailable); "on" makes that a start
 * failure; "off" (and a failed "auto") removes a filter an earlier process may have left. */
static int fast_start(struct sys_stack *st, char *err, size_t errlen)
{
	const struct ts_config *cfg = st->env.cfg;
	uint32_t conns = cfg->budget.nat_entries < FASTPATH_MAX_CONNS ? cfg->budget.nat_entries
								   : FASTPATH_MAX_CONNS;
	/* UDP flows: as many as the sessions could offer (none without a UDP path). */
	uint64_t uflows = st->env.udp ? (uint64_t)cfg->budget.udp_sessions * UDP_FAST_MAX : 0;
	uint32_t udp = uflows < FASTPATH_MAX_UDP_FLOWS ? (uint32_t)uflows : FASTPATH_MAX_UDP_FLOWS;
	int idx = st->env.tun_ifindex;
	char why[200] = "";
	int ret;

	if (cfg->nat.fast_path == TS_FAST_PATH_OFF) {
		if (idx > 0)
			fastpath_clear(idx);
		return 0;
	}
	if (idx <= 0) {
		ret = -ENODEV;
		snprintf(why, sizeof(why), "the TUN device %s is not in this network namespace",
			 st->env.tun_name ? st->env.tun_name : "");
	} else if ((ret = fastpath_open(conns, udp, &st->fp, why, sizeof(why))) == 0 &&
		   (ret = fastpath_attach(st->fp, idx, why, sizeof(why))) != 0) {
		fastpath_free(st->fp);
		st->fp = NULL;
	}
	st->uf_asked = udp > 0;
	if (ret == 0) {
		const char *uoff = udp ? fastpath_udp_off(st->fp) : NULL;
		const char *tun = st->env.tun_name ? st->env.tun_name : "the TUN";

		if (udp && !uoff && (ret = udpfast_init(&st->uf, &st->fp, idx, st->env.log)) != 0) {
			snprintf(why, sizeof(why), "netlink: %s", strerror(-ret));
			uoff = why;
		} else if (udp && !uoff) {
			udp_path_set_offload(st->env.udp, &udpfast_ops, &st->uf);
			st->uf_on = true;
		}
		st->uf_refused = uoff != NULL;
		if (uoff)
			log_info(st->env.log, "system stack: in-kernel fast path on %s (room for %u "
				 "connections; UDP flows stay in userspace: %s)", tun, conns, uoff);
		else
			log_info(st->env.log, "system stack: in-kernel fast path on %s (room for %u "
				 "connections, %u UDP flows)", tun, conns, udp);
		return 0;
	}
	if (idx > 0)
		fastpath_clear(idx);
	if (cfg->nat.fast_path == TS_FAST_PATH_ON) {
		snprintf(err, errlen, "system stack: nat.fast_path \"on\": %s", why);
		return ret;
	}
	log_info(st->env.log, "system stack: in-kernel fast path unavailable: %s", why);
	st->fp_unavailable = true;
	return 0;
}

static int sys_start(const struct netstack_env *env, struct netstack **out, char *err,
		     size_t errlen)
{
	struct sys_stack *st = calloc(1, sizeof(*st));
	uint16_t ports[2][NAT_MAX_LISTENERS] = { { 0 } };
	struct nat_config nc;
	int ret;

	if (!st)
		goto nomem;
	st->env = *env;
	st->purge_at = INT64_MAX;
	st->kick_fd = -1;
	st->nq = env->cfg->tun.queues ? env->cfg->tun.queues : 1;
	/* One counter block per queue, each on its own cache lines (no false sharing). */
	size_t csz = pctr_stride();
	st->pctr = aligned_alloc(64, csz * st->nq);
	if (!st->pctr)
		goto nomem;
	memset(st->pctr, 0, csz * st->nq);
	st->qto = aligned_alloc(64, sizeof(*st->qto) * st->nq);
	if (!st->qto)
		goto nomem;
	for (uint32_t q = 0; q < st->nq; q++)
		st->qto[q].conn = 0;
	st->n_lis = env->cfg->nat.listeners;
	st->has6 = env->cfg->tun.has_addr6;
	for (int f = 0; f < 2; f++)
		for (uint32_t i = 0; i < NAT_MAX_LISTENERS; i++)
			st->lis[f][i].fd = -1;
	sys_config_to_nat(env->cfg, &nc);
	nc.seed = sys_config_nat_seed(ts_now_ns(), (uintptr_t)st);
	if ((ret = nat_table_new(&nc, &st->nat)) != 0) {
		snprintf(err, errlen, "system stack: NAT table: %s", strerror(-ret));
		goto fail;
	}
	for (uint32_t i = 0; i < st->n_lis; i++) {
		if ((ret = listener_open(st, 4, (uint8_t)i, &ports[0][i], err, errlen)) != 0)
			goto fail;
		if (st->has6 &&
		    (ret = listener_open(st, 6, (uint8_t)i, &ports[1][i], err, errlen)) != 0)
			goto fail;
	}
	if ((ret = build_proc(st, ports)) != 0) {
		snprintf(err, errlen, "system stack: packet processor: %s", strerror(-ret));
		goto fail;
	}
	st->purge_ev = evtimer_new(env->base, on_purge, st);
	st->resume_ev = evtimer_new(env->base, on_resume, st);
	st->trim_ev = evtimer_new(env->base, on_trim, st);
	st->fp_ev = evtimer_new(env->base, on_fast_due, st);
	if (!st->purge_ev || !st->resume_ev || !st->trim_ev || !st->fp_ev) {
		ret = -ENOMEM;
		snprintf(err, errlen, "system stack: out of memory");
		goto fail;
	}
	if (st->nq > 1) {
		st->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (st->kick_fd < 0 ||
		    !(st->kick_ev = event_new(env->base, st->kick_fd, EV_READ | EV_PERSIST,
					      on_kick, st)) ||
		    event_add(st->kick_ev, NULL) != 0) {
			ret = st->kick_fd < 0 ? -errno : -ENOMEM;
			snprintf(err, errlen, "system stack: eventfd: %s", strerror(-ret));
			goto fail;
		}
	}
	if ((ret = fast_start(st, err, errlen)) != 0)
		goto fail;
	/* Only now, with every listener bound, may the caller report "ready" (before, no TCP could
	 * get in). A listener not watched would take connections the kernel completes and never
	 * accept them. */
	if ((ret = listeners_enable(st, true)) != 0) {
		snprintf(err, errlen, "system stack: out of memory");
		goto fail;
	}
	*out = (struct netstack *)st;
	return 0;
fail:
	sys_free((struct netstack *)st);
	return ret;
nomem: /* before the listeners are marked closed: sys_free cannot take it yet */
	snprintf(err, errlen, "system stack: out of memory");
	if (st)
		free(st->pctr);
	free(st);
	return -ENOMEM;
}

static void sys_stop(struct netstack *ns)
{
	struct sys_stack *st = as_sys(ns);

	st->stopped = true;
	for (int f = 0; f < 2; f++)
		for (uint32_t i = 0; i < NAT_MAX_LISTENERS; i++) {
			struct sys_listener *l = &st->lis[f][i];
			if (l->ev)
				event_free(l->ev);
			l->ev = NULL;
			if (l->fd >= 0)
				close(l->fd);
			l->fd = -1;
		}
	if (st->resume_ev)
		evtimer_del(st->resume_ev);
	if (st->trim_ev)
		evtimer_del(st->trim_ev);
}

static void sys_free(struct netstack *ns)
{
	struct sys_stack *st = as_sys(ns);

	if (!st)
		return;
	sys_stop(ns);
	if (st->purge_ev)
		event_free(st->purge_ev);
	if (st->resume_ev)
		event_free(st->resume_ev);
	if (st->trim_ev)
		event_free(st->trim_ev);
	if (st->fp_ev)
		event_free(st->fp_ev);
	if (st->kick_ev)
		event_free(st->kick_ev);
	if (st->kick_fd >= 0)
		close(st->kick_fd);
	/* Its UDP flows out of the kernel first: the UDP path outlives the stack. */
	fast_udp_off(st);
	fastpath_free(st->fp);
	sysproc_free(st->proc);
	nat_table_free(st->nat);
	free(st->qto);
	free(st->pctr);
	free(st);
}

/* ---- packet path and stats ---------------------------------------------------------------- */

static struct sys_counters *pctr_of(struct sys_stack *st, unsigned q)
{
	return (struct sys_counters *)((char *)st->pctr + pctr_stride() * q);
}

static enum driver_verdict sys_input(struct netstack *ns, unsigned q, uint8_t *buf, size_t len,
				     const struct pkt_meta *meta, int64_t now_ns, size_t *out_len,
				     bool *plain, struct pkt_view *view)
{
	struct sys_stack *st = as_sys(ns);
	struct sys_disp d =
		sysproc_process(st->proc, buf, len, meta, now_ns, pctr_of(st, q), view);

	switch (d.action) {
	case SYS_WRITE:
		*out_len = d.len;
		*plain = d.plain;
		st->qto[q].conn = d.conn; /* for write_queue (0 with one queue) */
		return DRIVER_WRITE;
	case SYS_UDP:
		return DRIVER_UDP;
	default:
		return DRIVER_DONE;
	}
}

/* Every translated segment of a connection, both ways, to the queue its number picks; the
 * packets the stack builds back to the queue they came from. */
static unsigned sys_write_queue(struct netstack *ns, unsigned q)
{
	struct sys_stack *st = as_sys(ns);
	uint32_t conn = st->qto[q].conn;

	return conn ? conn % st->nq : q;
}

static void sys_batch_end(struct netstack *ns, unsigned q, int64_t now_ns)
{
	struct sys_stack *st = as_sys(ns);
	uint64_t one = 1;

	/* A batch may have created HALF_OPEN entries with deadlines earlier than the armed one.
	 * The timer belongs to the main loop (queue 0); another queue's worker only asks. */
	if (q == 0) {
		arm_purge(st, now_ns, false);
		return;
	}
	atomic_thread_fence(memory_order_seq_cst); /* pairs with arm_purge's (see there) */
	if (nat_next_deadline(st->nat) < st->purge_at && write(st->kick_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is saturated, a kick is pending anyway */
	}
}

/* The packet-path counters of every queue, summed. */
static void pctr_sum(struct sys_stack *st, struct sys_counters *sum)
{
	ctr_t *o = (ctr_t *)sum;
	size_t n = sizeof(*sum) / sizeof(ctr_t);

	memset(sum, 0, sizeof(*sum));
	for (unsigned q = 0; q < st->nq; q++) {
		const ctr_t *c = (const ctr_t *)pctr_of(st, q);
		for (size_t i = 0; i < n; i++)
			ctr_set(&o[i], ctr_get(&o[i]) + ctr_get(&c[i]));
	}
}

static void sys_stats(struct netstack *ns, struct netstack_stats *o)
{
	struct sys_stack *st = as_sys(ns);
	struct sys_counters sum;
	const struct sys_counters *c = &sum;
	struct nat_stats n;

	pctr_sum(st, &sum);
	memset(o, 0, sizeof(*o));
	netstack_parse_drops(c->drop_parse, o);
	netstack_policy_drops(&c->policy, o);
	o->drops_malformed += ctr_get(&c->drop_bad_offload);
	o->drops_unmapped_downlink = ctr_get(&c->drop_downlink_no_mapping);
	o->drops_nat_exhausted = ctr_get(&c->drop_nat_budget) + ctr_get(&c->drop_nat_ports) +
				 ctr_get(&c->drop_nat_nomem);
	o->unmapped_uplink_rst = ctr_get(&c->rst_sent);
	o->drops_unmapped_rst = ctr_get(&c->drop_rst_no_mapping);
	o->drops_half_open = ctr_get(&c->drop_nat_half_open);
	o->rewrites = ctr_get(&c->uplink) + ctr_get(&c->downlink);
	o->fast_path = st->fp ? NETSTACK_FAST_PATH_ON
		     : st->fp_unavailable ? NETSTACK_FAST_PATH_UNAVAILABLE : NETSTACK_FAST_PATH_OFF;
	/* Its UDP flows: unavailable where they were asked for and the kernel refused them, or
	 * the fast path as a whole. */
	o->fast_path_udp = st->uf_on ? NETSTACK_FAST_PATH_ON
			 : st->uf_asked && (st->uf_refused || st->fp_unavailable)
				 ? NETSTACK_FAST_PATH_UNAVAILABLE
				 : NETSTACK_FAST_PATH_OFF;
	o->fast_path_added = ctr_get(&st->fp_added);
	o->fast_path_full = ctr_get(&st->fp_full);
	o->fast_path_failed = ctr_get(&st->fp_failed);
	o->fast_path_udp_no_uplink = ctr_get(&st->uf.no_uplink);
	o->fast_path_udp_map_failed = ctr_get(&st->uf.map_failed);
	if (st->fp) {
		struct fastpath_totals ft;
		fastpath_totals(st->fp, &ft);
		o->fast_path_conns = fastpath_conns(st->fp);
		o->fast_path_packets = ft.packets;
		o->fast_path_segments = ft.segments;
		o->fast_path_bytes = ft.bytes;
		o->fast_path_dropped = ft.failed;
		struct fastpath_totals uo, ui;
		fastpath_udp_totals(st->fp, &uo, &ui);
		o->fast_path_udp_flows = fastpath_udp_flows(st->fp);
		o->fast_path_uplinks = (uint64_t)fastpath_udp_uplinks(st->fp);
		o->fast_path_udp_out = uo.segments;
		o->fast_path_udp_out_bytes = uo.bytes;
		o->fast_path_udp_in = ui.segments;
		o->fast_path_udp_in_bytes = ui.bytes;
		o->fast_path_udp_dropped = uo.failed + ui.failed;
		o->rewrites += ft.packets;
	}
	o->admission_refused = ctr_get(&st->ctr.admission_refused);
	o->fd_exhausted = ctr_get(&st->ctr.fd_exhausted);
	o->accepted = ctr_get(&st->ctr.accepted);
	nat_get_stats(st->nat, &n);
	o->nat_half_open = n.entries[NAT_HALF_OPEN];
	o->nat_active = n.entries[NAT_ACTIVE];
	o->nat_closing = n.entries[NAT_CLOSING];
	o->nat_quarantined = n.quarantine;
	o->stack_bytes = n.bytes;
}

static void sys_counters(struct netstack *ns,
			 void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
	struct sys_stack *st = as_sys(ns);
	struct sys_counters sum;
	const struct nat_counters *nc = nat_get_counters(st->nat);

	pctr_sum(st, &sum);
	sysproc_counters_foreach(&sum, fn, arg);
#define STACK_CTR_VISIT(name) fn(arg, #name, ctr_get(&st->ctr.name));
	STACK_COUNTERS(STACK_CTR_VISIT)
#undef STACK_CTR_VISIT
	/* The NAT table's own operations and refusals, as nat_<name>. */
#define NAT_CTR_VISIT(name) fn(arg, "nat_" #name, ctr_get(&nc->name));
	NAT_COUNTERS(NAT_CTR_VISIT)
#undef NAT_CTR_VISIT
}

const struct netstack_ops sys_stack_ops = {
	.name = "system",
	.start = sys_start,
	.stop = sys_stop,
	.free = sys_free,
	.input = sys_input,
	.write_queue = sys_write_queue,
	.batch_end = sys_batch_end,
	.stats = sys_stats,
	.counters = sys_counters,
};
