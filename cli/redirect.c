/* redirect.c — `twinstack redirect`: the rig's "redirect" baseline, the cheapest terminating
 * TCP proxy this kernel allows: no TUN, no stack. nftables' redirect (in the namespace of the
 * applications, set up by whoever runs this) sends their connections to a kernel listener
 * here; each accepted connection's original destination comes from conntrack
 * (SO_ORIGINAL_DST, IP6T_SO_ORIGINAL_DST) and is handed to the product's dispatcher exactly as
 * the system stack hands it an accepted socket: the direct outbound connects to it from a
 * socket marked with --mark (which the rule set must exempt from the redirect), and the relay
 * (splice by default) carries the bytes with the product's budget, buffer and pipe pools,
 * timeouts and counters. So this and `run` differ only in how a connection reaches the
 * dispatcher: a TUN and a TCP/IP stack there, nftables and conntrack here. With --socks5 the
 * one outbound is the product's SOCKS5 outbound instead (CONNECT through that server, from
 * the same marked sockets): the cheapest terminating proxy in front of a SOCKS5 server, the
 * bound a TUN proxy through that server is measured against.
 *
 *   app --connect(S:p)--> nft output hook: redirect to :PORT --> listener 127.0.0.1:PORT
 *   accept -> SO_ORIGINAL_DST = S:p -> dispatcher -> direct outbound, SO_MARK N -> S:p
 *   (the marked SYN passes the rule set's "meta mark N return")
 *
 * Refused with a RST and counted, before any outbound socket: a connection whose original
 * destination cannot be read (not redirected and not tracked), one whose original destination
 * is the listener itself (a client connected to it directly: relaying would connect to
 * ourselves), one over the budget's TCP admission or descriptor limit. One thread, one
 * libevent loop. SIGINT/SIGTERM stop it (exit 0): the counters as they stood are printed as
 * one JSON object on stdout, then the live sessions are reset.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "cli/cli.h"
#include "cli/redirect_lib.h"
#include "cli/redirect_udp.h"
#include "core/budget.h"
#include "core/log.h"
#include "core/stats_doc.h"
#include "core/stats_http.h"
#include "dispatch/dispatcher.h"
#include "outbound/outbound.h"
#include "stacks/system/sys_stack.h"
#include "twinstack.h"

/* linux/netfilter_ipv4.h and linux/netfilter_ipv6/ip6_tables.h define these (both 80) but
 * drag in kernel headers that clash with the C library's; the values are kernel ABI. */
#ifndef SO_ORIGINAL_DST
#define SO_ORIGINAL_DST 80
#endif
#ifndef IP6T_SO_ORIGINAL_DST
#define IP6T_SO_ORIGINAL_DST 80
#endif

#define REDIRECT_ACCEPT_BATCH 64  /* accepts per wakeup, then back to the loop */
#define REDIRECT_BACKOFF_MS 50    /* out of descriptors or memory: stop accepting this long */
#define REDIRECT_RETRY_MS 1       /* an error of the pending connection itself */

/* Refusals before the dispatcher, and the accept loop's troubles: one counter each. */
struct redirect_counters {
	uint64_t accepted;            /* accept() returned a connection */
	uint64_t original_dst_failed; /* no original destination (not redirected, not tracked) */
	uint64_t loop_refused;        /* the original destination is the listener itself */
	uint64_t bad_address;         /* an address family the session key cannot hold */
	uint64_t admission_refused;   /* the budget's TCP admission said no */
	uint64_t fd_refused;          /* no descriptor in the budget for the accepted socket */
	uint64_t setup_failed;        /* out of memory wrapping the socket */
	uint64_t accept_backoff;      /* accept() out of descriptors or memory: paused */
	uint64_t accept_retry;        /* accept() failed for the pending connection: paused */
};

struct redirector;

struct rd_listener {
	struct redirector *r;
	int fd;                       /* -1: not asked for */
	int family;
	struct event *ev;
};

struct redirector {
	struct redirect_opts o;
	struct ts_config cfg;         /* defaults, one outbound (direct or socks5) marked o.mark */
	struct log log;
	struct event_base *base;
	struct budget *budget;
	struct dispatcher *disp;
	struct stats_http *stats;
	struct rd_listener lis[2];    /* IPv4, IPv6 */
	struct rd_udp *udp;           /* --udp-listen(6): the forwarder, else NULL */
	struct event *sig_int, *sig_term, *resume_ev;
	struct redirect_counters c;
	int exit_code;
};

void usage_redirect(FILE *out)
{
	fputs("usage: twinstack redirect (--listen [ADDR]:PORT | --listen6 [ADDR]:PORT |\n"
	      "                           --udp-listen [ADDR]:PORT --udp-to ADDR:PORT)...\n"
	      "                          --mark N [--relay splice|copy] [--stats ADDR:PORT]\n"
	      "                          [--socks5 ADDR:PORT]\n"
	      "                          [--udp-listen6 [ADDR]:PORT] [--udp-idle-ms MS]\n"
	      "\n"
	      "The redirect baseline (docs/architecture.md \"Redirect baseline\"): no TUN.\n"
	      "nftables redirects the applications' connections to a listener here; each one's\n"
	      "original destination (SO_ORIGINAL_DST) goes to the same dispatcher, direct\n"
	      "outbound (or with --socks5 the SOCKS5 outbound) and relay as 'run' uses, from\n"
	      "sockets marked N. The rule set is not created here; it must exempt mark N, or\n"
	      "every outbound connection is redirected again. For example:\n"
	      "\n"
	      "  table inet tsredir {\n"
	      "    chain out {\n"
	      "      type nat hook output priority -100; policy accept;\n"
	      "      meta mark N return\n"
	      "      ip daddr 10.0.0.0/24 tcp dport { 80, 443, 5201 } redirect to :PORT\n"
	      "      ip6 daddr fd00::/64 tcp dport { 80, 443, 5201 } redirect to :PORT6\n"
	      "    }\n"
	      "  }\n"
	      "\n"
	      "In the output hook (local applications) redirect goes to 127.0.0.1 / ::1; a\n"
	      "prerouting chain (forwarded traffic) goes to the incoming interface's address:\n"
	      "listen there or on the wildcard. Refused with a RST and counted: a connection\n"
	      "with no original destination, one whose original destination is the listener\n"
	      "itself, one whose server refuses or cannot be reached. SIGINT/SIGTERM print the\n"
	      "counters as JSON on stdout and exit 0. Needs CAP_NET_ADMIN (SO_MARK). Exit 1 on\n"
	      "a runtime failure (a port in use), 2 on bad usage.\n"
	      "\n"
	      "options:\n"
	      "      --listen [ADDR]:PORT    IPv4 listener (ADDR defaults to 127.0.0.1)\n"
	      "      --listen6 [ADDR]:PORT   IPv6 listener, \"[ADDR]:PORT\" (ADDR: ::1)\n"
	      "                              (at least one of the two, or --udp-listen)\n"
	      "      --mark N                SO_MARK of the outbound sockets (required):\n"
	      "                              1-4294967295, decimal or 0x hex\n"
	      "      --relay splice|copy     relay mode (default splice, as 'run')\n"
	      "      --stats ADDR:PORT       GET /stats and /metrics on this loopback address\n"
	      "      --socks5 ADDR:PORT      relay through this SOCKS5 server (CONNECT, no\n"
	      "                              authentication; IPv6 as [ADDR]:PORT) instead of\n"
	      "                              connecting directly; its sockets are marked N too.\n"
	      "                              A server in this namespace makes connections of\n"
	      "                              its own, unmarked: the rule set must exempt them\n"
	      "                              (meta skuid), or run it in another namespace\n"
	      "      --udp-listen [ADDR]:PORT  IPv4 UDP socket (ADDR: 127.0.0.1) whose datagrams\n"
	      "                              go to --udp-to, one marked socket per client\n"
	      "                              source, replies back: the cheapest userspace UDP\n"
	      "                              hop (a forwarder to one server: a socket cannot\n"
	      "                              read a redirected datagram's destination). Redirect\n"
	      "                              to it with e.g. 'udp dport 7007 redirect to :PORT'.\n"
	      "                              Not with --socks5\n"
	      "      --udp-listen6 [ADDR]:PORT  the same on IPv6 (ADDR: ::1), beside or instead\n"
	      "                              of --udp-listen\n"
	      "      --udp-to ADDR:PORT      the server --udp-listen forwards to (IPv6 as\n"
	      "                              [ADDR]:PORT)\n"
	      "      --udp-idle-ms MS        a UDP flow ends after MS without a datagram\n"
	      "                              (1-86400000; default 60000, as 'run')\n"
	      "  -h, --help                  this text\n",
	      out);
}

/* ---- sessions ------------------------------------------------------------------------------ */

/* Linger 0: close() sends RST, so the client learns at once that nothing is behind it. */
static void close_reset(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

static void refuse(int fd, uint64_t *reason)
{
	close_reset(fd);
	(*reason)++;
}

/* The dispatcher's end of a session (exactly once, the client stream already closed): what
 * session_start took for it goes back. */
static void session_end(void *arg)
{
	struct redirector *r = arg;

	budget_tcp_release(r->budget);
	budget_fd_release(r->budget, 1);
}

static int original_dst(int fd, int family, struct sockaddr_storage *ss)
{
	socklen_t len = sizeof(*ss);
	int ret = family == 6 ? getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, ss, &len)
			      : getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, ss, &len);

	return ret == 0 ? 0 : -errno;
}

static void session_start(struct redirector *r, int family, int fd,
			  const struct sockaddr_storage *peer)
{
	struct sockaddr_storage orig, local;
	socklen_t len = sizeof(local);
	struct flow_key key;
	struct stream *s;
	int ret;

	r->c.accepted++;
	if (original_dst(fd, family, &orig) != 0 ||
	    getsockname(fd, (struct sockaddr *)&local, &len) != 0) {
		refuse(fd, &r->c.original_dst_failed);
		return;
	}
	if ((ret = redirect_session_key(peer, &local, &orig, &key)) != 0) {
		refuse(fd, ret == -ELOOP ? &r->c.loop_refused : &r->c.bad_address);
		return;
	}
	if (budget_tcp_acquire(r->budget) != 0) {
		refuse(fd, &r->c.admission_refused);
		return;
	}
	if (budget_fd_reserve(r->budget, 1) != 0) {
		budget_tcp_release(r->budget);
		refuse(fd, &r->c.fd_refused);
		return;
	}
	if (stream_sock_new(r->base, fd, &s) != 0) {
		session_end(r);
		refuse(fd, &r->c.setup_failed);
		return;
	}
	/* From here the dispatcher owns the stream and calls session_end exactly once. */
	(void)dispatcher_start_tcp(r->disp, &key, s, session_end, r);
}

/* ---- accepting ----------------------------------------------------------------------------- */

/* Watch (on) or stop watching the listeners. 0, or -ENOMEM: libevent could not watch one. */
static int listeners_enable(struct redirector *r, bool on)
{
	int ret = 0;

	for (int i = 0; i < 2; i++) {
		if (!r->lis[i].ev)
			continue;
		if (!on)
			event_del(r->lis[i].ev);
		else if (event_add(r->lis[i].ev, NULL) != 0)
			ret = -ENOMEM;
	}
	return ret;
}

#define RESUME_RETRY_MS 50

static void pause_accept(struct redirector *r, uint32_t ms);

/* A listener libevent could not watch again would never accept: try again shortly. */
static void on_resume(evutil_socket_t fd, short what, void *arg)
{
	if (listeners_enable(arg, true) != 0)
		pause_accept(arg, RESUME_RETRY_MS);
}

/* Stop accepting for ms. If the resume cannot be timed (no memory for the timer), the
 * listeners stay watched: accepting too early beats never accepting again. */
static void pause_accept(struct redirector *r, uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };

	if (evtimer_add(r->resume_ev, &tv) != 0)
		return;
	listeners_enable(r, false);
}

/* Resource exhaustion backs off, an error of the pending connection retries soon, anything
 * else stops the program (exit 1). */
static void accept_error(struct redirector *r, int err)
{
	switch (sys_stack_accept_error_class(err)) {
	case SYS_ACCEPT_AGAIN:
		return;
	case SYS_ACCEPT_BACKOFF:
		r->c.accept_backoff++;
		pause_accept(r, REDIRECT_BACKOFF_MS);
		return;
	case SYS_ACCEPT_RETRY:
		r->c.accept_retry++;
		pause_accept(r, REDIRECT_RETRY_MS);
		return;
	case SYS_ACCEPT_FATAL:
		break;
	}
	log_error(&r->log, "redirect: accept: %s", strerror(err));
	r->exit_code = EXIT_RUNTIME;
	event_base_loopbreak(r->base);
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct rd_listener *l = arg;

	for (int i = 0; i < REDIRECT_ACCEPT_BATCH; i++) {
		struct sockaddr_storage peer;
		socklen_t len = sizeof(peer);
		int fd = accept4(lfd, (struct sockaddr *)&peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			accept_error(l->r, errno == EWOULDBLOCK ? EAGAIN : errno);
			return;
		}
		session_start(l->r, l->family, fd, &peer);
	}
}

/* ---- statistics ---------------------------------------------------------------------------- */

static void add_redirect(const struct redirector *r, struct stats_doc *d,
			 const struct dispatcher_stats *ds)
{
	const struct redirect_counters *c = &r->c;

	stats_doc_add_str(d, "redirect.relay_mode",
			  r->o.relay == TS_RELAY_SPLICE ? "splice" : "copy");
	stats_doc_gauge(d, "redirect.mark", r->o.mark);
	stats_doc_add_str(d, "redirect.outbound", r->o.has_socks5 ? "socks5" : "direct");
	stats_doc_counter(d, "redirect.accepted", c->accepted);
	stats_doc_gauge(d, "redirect.active", ds->sessions_active);
	stats_doc_counter(d, "redirect.connect_failed", ds->sessions_refused);
	stats_doc_counter(d, "redirect.original_dst_failed", c->original_dst_failed);
	stats_doc_counter(d, "redirect.loop_refused", c->loop_refused);
	stats_doc_counter(d, "redirect.bad_address", c->bad_address);
	stats_doc_counter(d, "redirect.admission_refused", c->admission_refused);
	stats_doc_counter(d, "redirect.fd_refused", c->fd_refused);
	stats_doc_counter(d, "redirect.setup_failed", c->setup_failed);
	stats_doc_counter(d, "redirect.accept_backoff", c->accept_backoff);
	stats_doc_counter(d, "redirect.accept_retry", c->accept_retry);
}

/* The dispatcher's share, under the keys `run` uses for the same numbers. */
static void add_sessions(const struct redirector *r, struct stats_doc *d,
			 const struct dispatcher_stats *ds)
{
	struct budget_stats bs;
	char key[64];

	stats_doc_gauge(d, "sessions.active", ds->sessions_active);
	stats_doc_gauge(d, "sessions.connecting", ds->sessions_connecting);
	stats_doc_counter(d, "sessions.total", ds->sessions_total);
	for (int i = 0; i < DISPATCHER_FAIL_MAX; i++) {
		snprintf(key, sizeof(key), "sessions.failed.%s",
			 dispatcher_fail_name((enum dispatcher_fail)i));
		stats_doc_counter(d, key, ds->fail[i]);
	}
	stats_doc_counter(d, "relay.bytes_up", ds->bytes_up);
	stats_doc_counter(d, "relay.bytes_down", ds->bytes_down);
	stats_doc_counter(d, "relay.splice_bytes", ds->splice_bytes);
	stats_doc_counter(d, "relay.copy_bytes", ds->copy_bytes);
	stats_doc_counter(d, "relay.pipe_fallbacks", ds->pipe_fallbacks);
	for (int i = 0; i < RELAY_END_MAX; i++) {
		snprintf(key, sizeof(key), "relay.ends.%s", relay_end_name((enum relay_end)i));
		stats_doc_counter(d, key, ds->relay_ends[i]);
	}
	stats_doc_gauge(d, "splice.pipes", ds->pipes_in_use + ds->pipes_idle);
	stats_doc_gauge(d, "splice.pipe_bytes", ds->pipe_bytes);
	stats_doc_counter(d, "splice.pipes_reclaimed", ds->pipes_reclaimed);
	stats_doc_counter(d, "splice.pipes_refused", ds->pipes_refused);
	stats_doc_gauge(d, "buffers.in_use_bytes", ds->buffer_bytes_in_use);
	budget_get_stats(r->budget, &bs);
	stats_doc_gauge(d, "budget.tcp_in_use", bs.tcp_in_use);
	stats_doc_gauge(d, "budget.fds_in_use", bs.fds_in_use);
	stats_doc_counter(d, "budget.fd_refused", bs.fd_refused);
}

static void stats_fill(void *arg, struct stats_doc *d)
{
	const struct redirector *r = arg;
	struct dispatcher_stats ds;

	dispatcher_get_stats(r->disp, &ds);
	add_redirect(r, d, &ds);
	add_sessions(r, d, &ds);
	if (r->udp)
		rd_udp_stats(r->udp, d);
}

/* The counters as one JSON object on stdout. 0 or -ENOMEM / -EIO. */
static int print_stats(struct redirector *r)
{
	struct stats_doc *d = stats_doc_new();
	char *json = NULL;
	size_t len;
	int ret = -ENOMEM;

	if (!d)
		return ret;
	stats_fill(r, d);
	if (stats_doc_error(d, NULL) == 0 && stats_doc_json(d, &json, &len) == 0)
		ret = fwrite(json, 1, len, stdout) == len ? 0 : -EIO;
	free(json);
	stats_doc_free(d);
	return ret;
}

/* ---- starting and stopping ----------------------------------------------------------------- */

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct redirector *r = arg;

	log_info(&r->log, "redirect: signal %d: stopping", (int)sig);
	event_base_loopbreak(r->base);
}

/* The configuration `run` would have with defaults and one outbound, marked: direct, or with
 * --socks5 a SOCKS5 outbound to that server (TCP only: nothing here receives UDP). Not
 * validated as a file is: it has no TUN, so no address of ours to refuse. */
static int make_config(struct redirector *r)
{
	struct ts_outbound *ob;

	config_init(&r->cfg);
	if (!(ob = calloc(1, sizeof(*ob))))
		return -ENOMEM;
	if (r->o.has_socks5) {
		snprintf(ob->tag, sizeof(ob->tag), "socks5");
		ob->type = TS_OUT_SOCKS5;
		ob->has_server = true;
		ob->server.is_addr = true;
		ob->server.addr = r->o.socks5.addr;
		ob->server.port = r->o.socks5.port;
		netaddr_format(&r->o.socks5.addr, ob->server.host, sizeof(ob->server.host));
	} else {
		snprintf(ob->tag, sizeof(ob->tag), "direct");
		ob->type = TS_OUT_DIRECT;
	}
	ob->has_routing_mark = true;
	ob->routing_mark = r->o.mark;
	r->cfg.outbounds = ob;
	r->cfg.n_outbounds = 1;
	r->cfg.relay_mode = r->o.relay;
	if (r->o.udp_idle_ms)
		r->cfg.timeouts.udp_idle_ms = r->o.udp_idle_ms;
	return 0;
}

/* The session budget as `run` makes it: descriptors fit under RLIMIT_NOFILE, less what the
 * program holds outside sessions (its listeners, the stats endpoint, the fixed reserve). */
static int make_budget(struct redirector *r, char *err, size_t errlen)
{
	uint32_t listeners = (uint32_t)r->o.has_listen4 + (uint32_t)r->o.has_listen6 +
			     (uint32_t)r->o.has_udp + (uint32_t)r->o.has_udp6;
	uint32_t reserve = budget_fd_reserve_for(0, listeners, r->o.has_stats ? STATS_HTTP_FDS : 0);
	struct rlimit rl;
	int ret;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		r->cfg.budget.fds = budget_fds_fit(r->cfg.budget.fds, rl.rlim_cur, reserve);
	if (r->cfg.budget.fds == 0) {
		snprintf(err, errlen, "redirect: RLIMIT_NOFILE leaves no descriptors for sessions");
		return -EMFILE;
	}
	if ((ret = budget_new(&r->cfg.budget, &r->budget)) != 0) {
		snprintf(err, errlen, "redirect: budget: %s", strerror(-ret));
		return ret;
	}
	budget_join_fd_pool(r->budget);
	return 0;
}

/* An outbound socket now, so that a missing CAP_NET_ADMIN (SO_MARK) fails the start instead
 * of every connection. */
static int probe_mark(struct redirector *r, char *err, size_t errlen)
{
	int fd, ret;

	if ((ret = outbound_socket(&r->cfg.outbounds[0], r->o.has_socks5 ? r->o.socks5.addr.family : 4,
				   SOCK_STREAM, &fd)) != 0) {
		snprintf(err, errlen, "redirect: an outbound socket with SO_MARK %u: %s", r->o.mark,
			 strerror(-ret));
		return ret;
	}
	close(fd);
	return 0;
}

static int listen_on(struct redirector *r, struct rd_listener *l, const struct netaddr_ep *ep,
		     char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	char name[NETADDR_EP_STRLEN];
	uint16_t port_be = htons(ep->port);
	unsigned len = netaddr_sockaddr(ep->addr.family, ep->addr.a, port_be, &ss);
	int one = 1, ret;

	l->r = r;
	l->family = ep->addr.family;
	l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0)
		goto fail;
	if (setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    (l->family == 6 &&
	     setsockopt(l->fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
	    bind(l->fd, (struct sockaddr *)&ss, len) != 0 ||
	    listen(l->fd, (int)budget_get_limits(r->budget)->listen_backlog) != 0)
		goto fail;
	l->ev = event_new(r->base, l->fd, EV_READ | EV_PERSIST, on_accept, l);
	if (!l->ev || event_add(l->ev, NULL) != 0) {
		snprintf(err, errlen, "redirect: event loop: out of memory");
		return -ENOMEM;
	}
	return 0;
fail:
	ret = -errno;
	snprintf(err, errlen, "redirect: listen on %s: %s",
		 netaddr_ep_format(ep, name, sizeof(name)), strerror(-ret));
	return ret;
}

static int add_signal(struct redirector *r, int sig, struct event **ev)
{
	*ev = evsignal_new(r->base, sig, on_signal, r);
	return *ev && evsignal_add(*ev, NULL) == 0 ? 0 : -ENOMEM;
}

static int redirector_start(struct redirector *r, char *err, size_t errlen)
{
	int ret;

	if (ts_process_prepare(err, errlen) != 0)
		log_warn(&r->log, "redirect: %s (going on with the limits as they are)", err);
	if ((ret = make_config(r)) != 0 || !(r->base = event_base_new()) ||
	    add_signal(r, SIGINT, &r->sig_int) != 0 || add_signal(r, SIGTERM, &r->sig_term) != 0 ||
	    !(r->resume_ev = evtimer_new(r->base, on_resume, r))) {
		snprintf(err, errlen, "redirect: out of memory");
		return -ENOMEM;
	}
	if ((ret = probe_mark(r, err, errlen)) != 0 || (ret = make_budget(r, err, errlen)) != 0)
		return ret;
	if ((ret = dispatcher_new(r->base, &r->cfg, r->budget, &r->disp)) != 0) {
		snprintf(err, errlen, "redirect: dispatcher: %s", strerror(-ret));
		return ret;
	}
	dispatcher_set_log(r->disp, &r->log);
	if (r->o.has_listen4 && (ret = listen_on(r, &r->lis[0], &r->o.listen4, err, errlen)) != 0)
		return ret;
	if (r->o.has_listen6 && (ret = listen_on(r, &r->lis[1], &r->o.listen6, err, errlen)) != 0)
		return ret;
	if ((r->o.has_udp || r->o.has_udp6) &&
	    (ret = rd_udp_new(r->base, r->o.has_udp ? &r->o.udp_listen : NULL,
			      r->o.has_udp6 ? &r->o.udp_listen6 : NULL, &r->o.udp_to,
			      &r->cfg.outbounds[0], r->budget, r->cfg.timeouts.udp_idle_ms, &r->udp,
			      err, errlen)) != 0)
		return ret;
	if (r->o.has_stats)
		return stats_http_new(r->base, &r->o.stats, stats_fill, r, &r->stats, err, errlen);
	return 0;
}

/* Idempotent: a failed start ends here too. Live sessions are reset (dispatcher_free). */
static void redirector_free(struct redirector *r)
{
	stats_http_free(r->stats);
	rd_udp_free(r->udp);
	for (int i = 0; i < 2; i++) {
		if (r->lis[i].ev)
			event_free(r->lis[i].ev);
		if (r->lis[i].fd >= 0)
			close(r->lis[i].fd);
	}
	dispatcher_free(r->disp);
	budget_free(r->budget);
	if (r->resume_ev)
		event_free(r->resume_ev);
	if (r->sig_int)
		event_free(r->sig_int);
	if (r->sig_term)
		event_free(r->sig_term);
	if (r->base)
		event_base_free(r->base);
	config_fini(&r->cfg);
	memset(r, 0, sizeof(*r));
	r->lis[0].fd = r->lis[1].fd = -1;
}

/* ---- the command line ---------------------------------------------------------------------- */

typedef int (*value_parser)(const char *s, struct redirect_opts *o);

static int take_listen4(const char *s, struct redirect_opts *o)
{
	o->has_listen4 = true;
	return redirect_parse_listen(s, 4, &o->listen4);
}

static int take_listen6(const char *s, struct redirect_opts *o)
{
	o->has_listen6 = true;
	return redirect_parse_listen(s, 6, &o->listen6);
}

static int take_mark(const char *s, struct redirect_opts *o)
{
	return redirect_parse_mark(s, &o->mark);
}

static int take_relay(const char *s, struct redirect_opts *o)
{
	return redirect_parse_relay(s, &o->relay);
}

static int take_stats(const char *s, struct redirect_opts *o)
{
	o->has_stats = true;
	return redirect_parse_stats(s, &o->stats);
}

static int take_socks5(const char *s, struct redirect_opts *o)
{
	o->has_socks5 = true;
	return redirect_parse_socks5(s, &o->socks5);
}

static int take_udp_listen(const char *s, struct redirect_opts *o)
{
	o->has_udp = true;
	return redirect_parse_listen(s, 4, &o->udp_listen);
}

static int take_udp_listen6(const char *s, struct redirect_opts *o)
{
	o->has_udp6 = true;
	return redirect_parse_listen(s, 6, &o->udp_listen6);
}

static int take_udp_to(const char *s, struct redirect_opts *o)
{
	o->has_udp_to = true;
	return redirect_parse_socks5(s, &o->udp_to);
}

static int take_udp_idle(const char *s, struct redirect_opts *o)
{
	uint64_t v;

	if (cli_parse_u64(s, &v) != 0 || v < 1 || v > 86400000u)
		return -EINVAL;
	o->udp_idle_ms = (uint32_t)v;
	return 0;
}

static const struct {
	const char *flag;
	value_parser parse;
	const char *want; /* what the value must be, for the message */
} options[] = {
	{ "--listen", take_listen4, "an IPv4 ADDR:PORT or :PORT" },
	{ "--listen6", take_listen6, "an IPv6 [ADDR]:PORT or :PORT" },
	{ "--mark", take_mark, "1-4294967295 (decimal or 0x hex)" },
	{ "--relay", take_relay, "splice or copy" },
	{ "--stats", take_stats, "a loopback ADDR:PORT" },
	{ "--socks5", take_socks5, "a server's ADDR:PORT or [ADDR]:PORT (an address, not a name)" },
	{ "--udp-listen", take_udp_listen, "an IPv4 ADDR:PORT or :PORT" },
	{ "--udp-listen6", take_udp_listen6, "an IPv6 [ADDR]:PORT or :PORT" },
	{ "--udp-to", take_udp_to, "a server's ADDR:PORT or [ADDR]:PORT (an address, not a name)" },
	{ "--udp-idle-ms", take_udp_idle, "1-86400000 milliseconds" },
};

/* 0 parsed, 1 --help shown, -1 bad usage (message printed). */
static int parse_args(int argc, char **argv, struct redirect_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->relay = TS_RELAY_SPLICE;
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		size_t k;
		int r = 0;

		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_redirect(stdout);
			return 1;
		}
		for (k = 0; k < sizeof(options) / sizeof(options[0]); k++)
			if ((r = cli_take_option(argc, argv, &i, options[k].flag, options[k].flag,
						 &v)) != 0)
				break;
		if (r < 0) {
			fprintf(stderr, "twinstack redirect: %s needs a value\n", argv[i]);
			return -1;
		}
		if (r == 0) {
			fprintf(stderr, "twinstack redirect: unexpected argument '%s'\n", argv[i]);
			usage_redirect(stderr);
			return -1;
		}
		if (options[k].parse(v, o) != 0) {
			fprintf(stderr, "twinstack redirect: %s '%s': want %s\n",
				options[k].flag, v, options[k].want);
			return -1;
		}
	}
	bool udp = o->has_udp || o->has_udp6;

	if (udp != o->has_udp_to) {
		fprintf(stderr, "twinstack redirect: --udp-listen (or --udp-listen6) and --udp-to "
				"go together\n");
		usage_redirect(stderr);
		return -1;
	}
	if (o->udp_idle_ms && !udp) {
		fprintf(stderr, "twinstack redirect: --udp-idle-ms needs --udp-listen\n");
		usage_redirect(stderr);
		return -1;
	}
	for (int k = 0; k < 2; k++) {
		const struct netaddr_ep *l = k ? &o->udp_listen6 : &o->udp_listen;
		const char *flag = k ? "--udp-listen6" : "--udp-listen";
		int c;

		if (!(k ? o->has_udp6 : o->has_udp))
			continue;
		c = redirect_udp_check(l, &o->udp_to);
		if (c == -EINVAL) {
			fprintf(stderr, "twinstack redirect: %s: want an address, not the unspecified "
					"one (replies leave from the address the datagrams reached)\n",
				flag);
			return -1;
		}
		if (c == -ELOOP) {
			fprintf(stderr, "twinstack redirect: --udp-to: that is %s itself (every "
					"datagram would come back as a new flow)\n", flag);
			return -1;
		}
	}
	if (udp && o->has_socks5) {
		fprintf(stderr, "twinstack redirect: --udp-listen: not with --socks5 (the forwarder "
				"sends to --udp-to directly)\n");
		usage_redirect(stderr);
		return -1;
	}
	if (!o->has_listen4 && !o->has_listen6 && !udp) {
		fprintf(stderr, "twinstack redirect: --listen, --listen6 or --udp-listen is required\n");
		usage_redirect(stderr);
		return -1;
	}
	if (o->mark == 0) {
		fprintf(stderr, "twinstack redirect: --mark N is required (the rule set exempts "
				"it from the redirect)\n");
		usage_redirect(stderr);
		return -1;
	}
	return 0;
}

static void log_ready(struct redirector *r)
{
	char a[NETADDR_EP_STRLEN], b[NETADDR_EP_STRLEN], s5[NETADDR_EP_STRLEN];
	char u4[NETADDR_EP_STRLEN], u6[NETADDR_EP_STRLEN], ut[NETADDR_EP_STRLEN], udp[160] = "";

	if (r->o.has_udp || r->o.has_udp6)
		snprintf(udp, sizeof(udp), ", udp %s%s%s -> %s",
			 r->o.has_udp ? netaddr_ep_format(&r->o.udp_listen, u4, sizeof(u4)) : "",
			 r->o.has_udp && r->o.has_udp6 ? " and " : "",
			 r->o.has_udp6 ? netaddr_ep_format(&r->o.udp_listen6, u6, sizeof(u6)) : "",
			 netaddr_ep_format(&r->o.udp_to, ut, sizeof(ut)));
	log_info(&r->log, "redirect: ready: listening on %s%s%s, mark %u, relay %s, outbound %s%s%s",
		 !r->o.has_listen4 && !r->o.has_listen6 ? "(no TCP listener)" :
		 r->o.has_listen4 ? netaddr_ep_format(&r->o.listen4, a, sizeof(a)) : "",
		 r->o.has_listen4 && r->o.has_listen6 ? " and " : "",
		 r->o.has_listen6 ? netaddr_ep_format(&r->o.listen6, b, sizeof(b)) : "", r->o.mark,
		 r->o.relay == TS_RELAY_SPLICE ? "splice" : "copy",
		 r->o.has_socks5 ? "socks5 " : "direct",
		 r->o.has_socks5 ? netaddr_ep_format(&r->o.socks5, s5, sizeof(s5)) : "", udp);
}

int cmd_redirect(int argc, char **argv)
{
	struct redirector r;
	char err[TS_ERRLEN];
	int ret;

	memset(&r, 0, sizeof(r));
	r.lis[0].fd = r.lis[1].fd = -1;
	if ((ret = parse_args(argc, argv, &r.o)) != 0)
		return ret > 0 ? EXIT_OK : EXIT_USAGE;
	log_init(&r.log, LOG_LEVEL_INFO, STDERR_FILENO);
	if ((ret = redirector_start(&r, err, sizeof(err))) != 0) {
		log_error(&r.log, "%s", err);
		redirector_free(&r);
		return EXIT_RUNTIME;
	}
	log_ready(&r);
	event_base_dispatch(r.base);
	ret = r.exit_code;
	if (print_stats(&r) != 0 && ret == EXIT_OK)
		ret = EXIT_RUNTIME;
	redirector_free(&r);
	return ret;
}
