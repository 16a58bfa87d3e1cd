/* dispatcher.c — the dispatcher: route, connect through an outbound, relay, end exactly once.
 *
 * Every session is on d->sessions from dispatcher_start_tcp until session_end, so
 * dispatcher_free can end them all. Failures decided inside dispatcher_start_tcp are not acted
 * on there (on_end must never run inside it): the session is parked on d->failing and one
 * shared event finishes them on the next loop iteration.
 *
 * Every session holds the configuration generation it was created under (dispatch/cfg_gen.h)
 * over the same span: a reload never changes a live session's outbound or timeouts.
 *
 * A session's name (the namer's answer, or the name it announced: route.sniff) lives in the
 * session's own allocation, after the struct, so a session without one costs nothing more.
 *
 * Sniffing (route.sniff) happens before the route is chosen, only for flows whose route a name
 * could change (route_name_matters) or with override_destination: the app's first bytes are
 * looked at with the stream's peek (MSG_PEEK on the accepted socket, the queued pbufs with
 * lwIP), never taken, so the relay later moves them untouched; between looks the stream's
 * low-water mark is raised past what was seen, so the loop is woken for more bytes only. A
 * timer bounds the wait: a client that speaks only after the server (SMTP, SSH servers' banners)
 * is routed by address after route.sniff.timeout_ms. One look buffer serves every session. A
 * session whose look finds no memory (that buffer, or its timer) is routed by address too, as
 * one whose look found no name, and counted (sniff.skipped_no_memory).
 */
#include "dispatch/dispatcher.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/bufpool.h"
#include "core/log.h"
#include "core/netaddr.h"
#include "core/rss.h"
#include "dispatch/cfg_gen.h"
#include "dispatch/dns_tcp.h"
#include "dispatch/pipepool.h"
#include "dispatch/route.h"
#include "outbound/outbound.h"
#include "sniff/sniff.h"

enum session_state {
	S_CONNECTING, /* conn != NULL */
	S_RELAYING,   /* relay != NULL */
	S_FAILING,    /* on d->failing, waiting for fail_ev */
	S_DNS,        /* dns != NULL: answered by the proxy's resolver (dns_tcp.h) */
	S_SNIFFING,   /* sniff_ev != NULL: waiting for the app's first bytes (route.sniff) */
};

struct session {
	struct dispatcher *d;
	LIST_ENTRY(session) link;     /* d->sessions */
	TAILQ_ENTRY(session) fail_link; /* d->failing, in S_FAILING only */
	enum session_state state;
	enum dispatcher_fail fail;
	struct flow_key orig;
	struct cfg_gen *gen;          /* the configuration it was created under (held) */
	const struct ts_outbound *ob; /* into gen->cfg->outbounds */
	struct stream *client;
	struct outbound_conn *conn;
	struct relay *relay;
	struct dns_tcp *dns;
	struct event *sniff_ev;       /* S_SNIFFING: the time limit */
	size_t sniff_seen;            /* S_SNIFFING: bytes the last look saw */
	bool fd_reserved;             /* one budget fd for the outbound socket */
	bool pinned;                  /* holds the namer's pin on orig.dst (fake-IP) */
	void (*on_end)(void *arg);
	void *end_arg;
	const char *name;             /* the destination's name for the outbound, or NULL */
	const char *route_name;       /* the name the route is chosen by, or NULL */
	char name_buf[];              /* the name's copy, sized at allocation */
};

struct dispatcher {
	struct event_base *base;
	struct cfg_gens gens;         /* new sessions hold gens.cur */
	struct budget *budget;
	struct bufpool *bufs;
	struct pipepool *pipes;       /* NULL in copy mode */
	struct event *fail_ev;
	dispatcher_namer_fn namer;    /* NULL: sessions go by address */
	void *namer_arg;
	dispatcher_pin_fn pin, unpin; /* a named session holds its name (fake-IP), or NULL */
	struct log *log;              /* refusals at debug level; NULL: none */
	bool dns_on;                  /* new TCP/53 sessions go to dns_res (with dns.hijack) */
	struct dns_tcp_resolver dns_res; /* kept while DNS sessions live, even after off */
	uint64_t dns_live;            /* sessions in S_DNS */
	struct dns_tcp_counters dns_ctr;
	uint8_t *sniff_buf;           /* TS_SNIFF_MAX_BYTES, allocated at the first sniff */
	struct dispatcher_sniff_stats sniff;
	LIST_HEAD(, session) sessions;
	TAILQ_HEAD(, session) failing;
	bool closing;
	struct relay_counters relay_ctr;
	uint64_t active, connecting, total;
	uint64_t fail[DISPATCHER_FAIL_MAX];
	struct event *trim_ev;        /* one-shot: memory back after a load has gone (trim_maybe) */
	uint64_t trim_peak;           /* most sessions at once since the last trim */
	uint64_t heap_trims;
};

static const char *const fail_names[DISPATCHER_FAIL_MAX] = {
	[DISPATCHER_FAIL_REFUSED] = "connect_refused",
	[DISPATCHER_FAIL_TIMEOUT] = "connect_timeout",
	[DISPATCHER_FAIL_UNREACHABLE] = "unreachable",
	[DISPATCHER_FAIL_RESET] = "connect_reset",
	[DISPATCHER_FAIL_PROTO] = "proto",
	[DISPATCHER_FAIL_DENIED] = "denied",
	[DISPATCHER_FAIL_REJECT] = "reject",
	[DISPATCHER_FAIL_FD_BUDGET] = "fd_budget",
	[DISPATCHER_FAIL_OWN_ADDRESS] = "own_address",
	[DISPATCHER_FAIL_CLIENT] = "client",
	[DISPATCHER_FAIL_RESOURCE] = "resource",
	[DISPATCHER_FAIL_RESOLVE] = "resolve",
	[DISPATCHER_FAIL_BAD_NAME] = "bad_name",
	[DISPATCHER_FAIL_FAKE_UNMAPPED] = "fake_unmapped",
	[DISPATCHER_FAIL_OTHER] = "other",
};

const char *dispatcher_fail_name(enum dispatcher_fail f)
{
	return (unsigned)f < DISPATCHER_FAIL_MAX ? fail_names[f] : "?";
}

static enum dispatcher_fail classify(int err)
{
	switch (err) {
	case -ECONNREFUSED:
		return DISPATCHER_FAIL_REFUSED;
	case -ETIMEDOUT:
		return DISPATCHER_FAIL_TIMEOUT;
	case -EHOSTUNREACH:
	case -ENETUNREACH:
	case -ENETDOWN:
	case -EHOSTDOWN:
		return DISPATCHER_FAIL_UNREACHABLE;
	case -ECONNRESET:
	case -EPIPE:
		return DISPATCHER_FAIL_RESET;
	case -EPROTO:
		return DISPATCHER_FAIL_PROTO;
	case -EACCES:
		return DISPATCHER_FAIL_DENIED;
	case -EMFILE:
	case -ENFILE:
		return DISPATCHER_FAIL_FD_BUDGET;
	case -ENOMEM:
	case -ENOBUFS:
		return DISPATCHER_FAIL_RESOURCE;
	case -ENXIO:
	case -EAGAIN:
		return DISPATCHER_FAIL_RESOLVE;
	default:
		return DISPATCHER_FAIL_OTHER;
	}
}

/* ---- ending -------------------------------------------------------------------------------- */

static void release_fd(struct session *s)
{
	if (s->fd_reserved) {
		budget_fd_release(s->d->budget, 1);
		s->fd_reserved = false;
	}
}

/* Memory back after a load. Freed sessions, relay buffers kept for reuse and the heap's free
 * chunks stay with the process otherwise: glibc returns a thread's arena only from its top, and
 * the relay pool keeps up to its cache cap, so an idle proxy would sit near its busiest RSS.
 * Once the sessions have fallen to a quarter of their peak since the last trim (a peak of at
 * least TRIM_MIN_PEAK: a few sessions hold little), a one-shot timer TRIM_DELAY_MS later gives
 * the relay pool's cached buffers and the heap's free pages back (malloc_trim releases free
 * pages inside every arena, not only at the top). One timer per fall, none while idle; a load
 * that comes back within the delay only loses the cached buffers it would have reused. */
#define TRIM_MIN_PEAK 16u
#define TRIM_DELAY_MS 1000

static void on_trim(evutil_socket_t fd, short what, void *arg)
{
	struct dispatcher *d = arg;

	(void)fd;
	(void)what;
	if (d->active * 4 <= d->trim_peak) {
		bufpool_trim(d->bufs);
		rss_heap_trim();
		d->heap_trims++;
	}
	d->trim_peak = d->active;
}

static void trim_maybe(struct dispatcher *d)
{
	static const struct timeval delay = { TRIM_DELAY_MS / 1000, (TRIM_DELAY_MS % 1000) * 1000 };

	if (d->closing || !d->trim_ev || d->trim_peak < TRIM_MIN_PEAK ||
	    d->active * 4 > d->trim_peak || evtimer_pending(d->trim_ev, NULL))
		return;
	/* A trim that cannot be timed (no memory for the timer) is done now: no later session
	 * end may come to try again, and memory back is the right answer to a shortage. */
	if (evtimer_add(d->trim_ev, &delay) != 0)
		on_trim(-1, 0, d);
}

/* The one exit of every session. The client stream is already closed or aborted. */
static void session_end(struct session *s)
{
	struct dispatcher *d = s->d;
	void (*on_end)(void *) = s->on_end;
	void *arg = s->end_arg;

	assert(!s->conn && !s->relay && !s->dns && !s->fd_reserved && !s->sniff_ev);
	if (s->pinned)
		d->unpin(d->namer_arg, s->orig.family, s->orig.dst);
	LIST_REMOVE(s, link);
	d->active--;
	cfg_gen_put(&d->gens, s->gen);
	free(s);
	trim_maybe(d);
	on_end(arg);
}

/* Refuse now: RST to the app (prompt, never a hang), count, end. */
static void session_fail_now(struct session *s, enum dispatcher_fail why)
{
	s->d->fail[why]++;
	release_fd(s);
	stream_abort(s->client);
	s->client = NULL;
	session_end(s);
}

/* Refuse from the loop: used where on_end must not run yet (inside dispatcher_start_tcp). */
static void session_fail_later(struct session *s, enum dispatcher_fail why)
{
	struct dispatcher *d = s->d;

	s->state = S_FAILING;
	s->fail = why;
	TAILQ_INSERT_TAIL(&d->failing, s, fail_link);
	event_active(d->fail_ev, EV_TIMEOUT, 0);
}

static void on_fail_ev(evutil_socket_t fd, short what, void *arg)
{
	struct dispatcher *d = arg;
	struct session *s;

	while ((s = TAILQ_FIRST(&d->failing)) != NULL) {
		TAILQ_REMOVE(&d->failing, s, fail_link);
		session_fail_now(s, s->fail);
	}
}

static void on_relay_done(void *arg, enum relay_end reason, const struct relay_stats *st)
{
	struct session *s = arg;

	/* The relay closed/aborted both streams: the outbound socket's fd is gone. */
	s->relay = NULL;
	s->client = NULL;
	release_fd(s);
	session_end(s);
}

static void on_dns_done(void *arg)
{
	struct session *s = arg;

	/* dns_tcp closed or aborted the client and cancelled its tickets. */
	s->dns = NULL;
	s->client = NULL;
	s->d->dns_live--;
	session_end(s);
}

/* A TCP/53 session while hijacking: answered here, never connected out. The address may be
 * our own (the gateway as the apps' resolver is the common setup). */
static bool is_dns(struct dispatcher *d, const struct flow_key *k)
{
	return d->dns_on && k->dport_be == htons(53) && cfg_gens_current(&d->gens)->dns.hijack;
}

static int session_start_dns(struct session *s, enum dispatcher_fail *why)
{
	struct dispatcher *d = s->d;
	struct dns_tcp_params p = {
		.resolver = &d->dns_res,
		.budget = d->budget,
		.idle_ms = DNS_TCP_IDLE_MS,
		.counters = &d->dns_ctr,
	};
	int ret;

	if ((ret = dns_tcp_new(d->base, s->client, &p, on_dns_done, s, &s->dns)) != 0) {
		s->dns = NULL;
		*why = classify(ret);
		return ret;
	}
	s->state = S_DNS;
	d->dns_live++;
	return 0;
}

/* ---- connecting ---------------------------------------------------------------------------- */

static void connecting_done(struct session *s)
{
	assert(s->state == S_CONNECTING);
	s->conn = NULL;
	s->d->connecting--;
}

/* The app's side died while we were connecting (an lwIP pcb can; a socket reports nothing). */
static void sniff_stop(struct session *s);

static void on_client_error(void *arg, int err)
{
	struct session *s = arg;

	if (s->state == S_SNIFFING) {
		sniff_stop(s);
		session_fail_now(s, DISPATCHER_FAIL_CLIENT);
		return;
	}
	if (s->state != S_CONNECTING)
		return;
	outbound_conn_cancel(s->conn);
	connecting_done(s);
	session_fail_now(s, DISPATCHER_FAIL_CLIENT);
}

static void start_relay(struct session *s, int fd, const uint8_t *early, size_t early_len)
{
	struct dispatcher *d = s->d;
	const struct ts_config *cfg = s->gen->cfg;
	struct relay_params p = {
		.mode = cfg->relay_mode,
		.bufs = d->bufs,
		.pipes = d->pipes,
		.budget = d->budget,
		.idle_ms = cfg->timeouts.relay_idle_ms,
		.early = early,
		.early_len = early_len,
		.counters = &d->relay_ctr,
	};
	struct stream *out;
	int ret;

	if ((ret = stream_sock_new(d->base, fd, &out)) != 0) {
		close(fd);
		session_fail_now(s, classify(ret));
		return;
	}
	if ((ret = relay_new(d->base, s->client, out, &p, on_relay_done, s, &s->relay)) != 0) {
		stream_abort(out);
		session_fail_now(s, classify(ret));
		return;
	}
	s->state = S_RELAYING;
}

/* One debug line per outbound failure: where to, through what, why. */
static void log_fail(const struct session *s, int err)
{
	struct netaddr a = { .family = s->orig.family };
	char addr[NETADDR_STRLEN];

	if (!s->d->log || s->d->log->level < LOG_LEVEL_DEBUG)
		return;
	memcpy(a.a, s->orig.dst, 16);
	log_debug(s->d->log, "tcp to %s%s%s port %u%s%s via %s: %s", s->orig.family == 6 ? "[" : "",
		  netaddr_format(&a, addr, sizeof(addr)), s->orig.family == 6 ? "]" : "",
		  ntohs(s->orig.dport_be), s->name ? " name " : "", s->name ? s->name : "",
		  s->ob->tag, strerror(-err));
}

static void on_connected(void *arg, int err, int fd, const uint8_t *early, size_t early_len)
{
	struct session *s = arg;

	connecting_done(s);
	if (err != 0) {
		log_fail(s, err);
		session_fail_now(s, s->ob->type == TS_OUT_REJECT ? DISPATCHER_FAIL_REJECT
								 : classify(err));
		return;
	}
	start_relay(s, fd, early, early_len);
}

static bool is_own_address(const struct ts_config *cfg, const struct flow_key *k)
{
	const struct netaddr_roles *r = k->family == 4 ? &cfg->roles4 : &cfg->roles6;

	return netaddr_roles_is_ours(r, k->dst);
}

/* Route and start connecting; or the reason to refuse (parked for the loop). */
static int session_start(struct session *s, enum dispatcher_fail *why)
{
	struct dispatcher *d = s->d;
	const struct ts_config *cfg = s->gen->cfg;
	int ret;

	/* The stacks drop traffic to our own addresses before it gets here; relaying it out would
	 * be a routing loop (sing-box #4367), so refuse even if a stack ever let it through. */
	assert(!is_own_address(cfg, &s->orig));
	if (is_own_address(cfg, &s->orig)) {
		*why = DISPATCHER_FAIL_OWN_ADDRESS;
		return -EINVAL;
	}
	s->ob = &cfg->outbounds[route_select(&cfg->route, &s->orig, s->route_name)];
	if (s->ob->type == TS_OUT_REJECT) {
		*why = DISPATCHER_FAIL_REJECT;
		return -ECONNREFUSED;
	}
	if ((ret = budget_fd_reserve(d->budget, 1)) != 0) {
		*why = DISPATCHER_FAIL_FD_BUDGET;
		return ret;
	}
	s->fd_reserved = true;
	ret = outbound_connect_name(d->base, s->ob, &s->orig, s->name, cfg->timeouts.connect_ms,
				    on_connected, s, &s->conn);
	if (ret != 0) {
		s->conn = NULL;
		*why = classify(ret);
		return ret;
	}
	s->state = S_CONNECTING;
	d->connecting++;
	return 0;
}

/* A zeroed session with room for the namer's name, copied in if it is valid (else *bad: the
 * failure, DISPATCHER_FAIL_MAX when none), or, when *sniff asks for it and the namer gave no
 * name, room for a sniffed one (*sniff false otherwise). NULL when out of memory. */
static struct session *session_alloc(struct dispatcher *d, const struct flow_key *orig,
				     bool dns, bool *sniff, enum dispatcher_fail *bad)
{
	const char *name = NULL;
	size_t room = 0;
	struct session *s;

	*bad = DISPATCHER_FAIL_MAX;
	if (d->namer && !dns) {
		name = d->namer(d->namer_arg, orig->family, orig->dst, ntohs(orig->dport_be));
		if (name && !outbound_name_valid(name)) {
			*bad = *name ? DISPATCHER_FAIL_BAD_NAME : DISPATCHER_FAIL_FAKE_UNMAPPED;
			name = NULL;
		}
		room = name ? strlen(name) + 1 : 0; /* at most OUTBOUND_NAME_MAX + 1: valid */
	}
	*sniff = *sniff && !dns && !name && *bad == DISPATCHER_FAIL_MAX;
	if (*sniff)
		room = SNIFF_NAME_MAX + 1;
	if (!(s = calloc(1, sizeof(*s) + room)))
		return NULL;
	if (name) {
		memcpy(s->name_buf, name, room);
		s->name = s->route_name = s->name_buf;
		if (d->pin) {
			d->pin(d->namer_arg, orig->family, orig->dst);
			s->pinned = true;
		}
	}
	return s;
}

/* ---- sniffing ------------------------------------------------------------------------------ */

static const struct stream_cbs client_cbs = { NULL, NULL, on_client_error };

/* Is a look at k's first bytes worth its wait? Only when a name could change the route, or
 * the name is to replace the address. */
static bool want_sniff(const struct ts_config *cfg, const struct flow_key *k,
		       const struct stream *client)
{
	const struct ts_sniff *sn = &cfg->route.sniff;

	return ts_sniff_on(sn, TS_SNIFF_TLS | TS_SNIFF_HTTP) && stream_can_peek(client) &&
	       (sn->override_destination || route_name_matters(&cfg->route, k));
}

static uint32_t proto_flag(enum sniff_proto p)
{
	return p == SNIFF_PROTO_TLS ? TS_SNIFF_TLS : p == SNIFF_PROTO_HTTP ? TS_SNIFF_HTTP : 0;
}

/* Leave S_SNIFFING: the timer goes, the stream is back to its normal level, no interest. */
static void sniff_stop(struct session *s)
{
	event_free(s->sniff_ev);
	s->sniff_ev = NULL;
	s->d->sniff.active--;
	stream_set_interest(s->client, false, false);
	stream_set_lowat(s->client, 1);
	stream_set_callbacks(s->client, &client_cbs, s);
}

/* The look is over: take the name (NULL: none) and go on as any session. */
static void sniff_done(struct session *s, const char *name, enum sniff_proto proto)
{
	struct dispatcher *d = s->d;
	const struct ts_route *rt = &s->gen->cfg->route;
	enum dispatcher_fail why;

	sniff_stop(s);
	if (name && outbound_name_valid(name)) {
		d->sniff.found[proto == SNIFF_PROTO_TLS ? 0 : 1]++;
		memcpy(s->name_buf, name, strlen(name) + 1); /* room: SNIFF_NAME_MAX + 1 */
		s->route_name = s->name_buf;
		if (route_select(rt, &s->orig, NULL) != route_select(rt, &s->orig, s->route_name))
			d->sniff.route_changed++;
		if (rt->sniff.override_destination) {
			s->name = s->name_buf;
			d->sniff.overridden++;
		}
	} else {
		d->sniff.no_name++;
	}
	if (session_start(s, &why) != 0)
		session_fail_now(s, why);
}

static void on_sniff_readable(void *arg)
{
	struct session *s = arg;
	const struct ts_sniff *sn = &s->gen->cfg->route.sniff;
	enum sniff_proto proto = SNIFF_PROTO_NONE;
	char name[SNIFF_NAME_MAX + 1];
	enum sniff_result r;
	ssize_t n;

	n = stream_peek(s->client, s->d->sniff_buf, sn->max_bytes);
	if (n == -EAGAIN)
		return;
	if (n < 0) {
		sniff_stop(s);
		session_fail_now(s, DISPATCHER_FAIL_CLIENT);
		return;
	}
	/* No byte more than last time: the app finished sending (its FIN wakes us with the same
	 * bytes queued) and will send no more before an answer. */
	r = n == 0 || (size_t)n <= s->sniff_seen ? SNIFF_NONE
						: sniff_stream(s->d->sniff_buf, (size_t)n, name, &proto);
	if (r == SNIFF_NEED_MORE && (size_t)n < sn->max_bytes) {
		s->sniff_seen = (size_t)n;
		stream_set_lowat(s->client, (size_t)n + 1);
		return;
	}
	if (r == SNIFF_FOUND && !(sn->protocols & proto_flag(proto)))
		r = SNIFF_NONE;
	sniff_done(s, r == SNIFF_FOUND ? name : NULL, proto);
}

static void on_sniff_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct session *s = arg;

	(void)fd;
	(void)what;
	s->d->sniff.timeouts++;
	sniff_done(s, NULL, SNIFF_PROTO_NONE);
}

/* A look that could not start: counted, and one debug line, since the session now goes by
 * address and a name rule that would have matched it does not apply. */
static void sniff_skipped(struct session *s)
{
	struct netaddr a = { .family = s->orig.family };
	char addr[NETADDR_STRLEN];

	s->d->sniff.skipped_no_memory++;
	if (!s->d->log || s->d->log->level < LOG_LEVEL_DEBUG)
		return;
	memcpy(a.a, s->orig.dst, 16);
	log_debug(s->d->log, "tcp to %s%s%s port %u: not looked at (route.sniff): no memory; "
		  "routed by address", s->orig.family == 6 ? "[" : "",
		  netaddr_format(&a, addr, sizeof(addr)), s->orig.family == 6 ? "]" : "",
		  ntohs(s->orig.dport_be));
}

/* Wait for the app's first bytes; -ENOMEM (counted): the caller routes by address instead. */
static int session_start_sniff(struct session *s)
{
	static const struct stream_cbs sniff_cbs = { on_sniff_readable, NULL, on_client_error };
	struct dispatcher *d = s->d;
	uint32_t ms = s->gen->cfg->route.sniff.timeout_ms;
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	if (!d->sniff_buf && !(d->sniff_buf = malloc(TS_SNIFF_MAX_BYTES))) {
		sniff_skipped(s);
		return -ENOMEM;
	}
	if (!(s->sniff_ev = evtimer_new(d->base, on_sniff_timeout, s)) ||
	    evtimer_add(s->sniff_ev, &tv) != 0) {
		if (s->sniff_ev)
			event_free(s->sniff_ev);
		s->sniff_ev = NULL;
		sniff_skipped(s);
		return -ENOMEM;
	}
	s->state = S_SNIFFING;
	d->sniff.active++;
	d->sniff.started++;
	stream_set_callbacks(s->client, &sniff_cbs, s);
	stream_set_interest(s->client, true, false);
	return 0;
}

int dispatcher_start_tcp(struct dispatcher *d, const struct flow_key *orig, struct stream *client,
		 void (*on_end)(void *arg), void *end_arg)
{
	enum dispatcher_fail why, bad = DISPATCHER_FAIL_MAX;
	struct session *s;
	bool dns = !d->closing && is_dns(d, orig);
	bool sniff = !d->closing && want_sniff(cfg_gens_current(&d->gens), orig, client);

	s = d->closing ? NULL : session_alloc(d, orig, dns, &sniff, &bad);
	if (!s) {
		/* Nothing to defer with: end it here, as the contract allows for this case. */
		stream_abort(client);
		d->fail[d->closing ? DISPATCHER_FAIL_OTHER : DISPATCHER_FAIL_RESOURCE]++;
		on_end(end_arg);
		return d->closing ? -ESHUTDOWN : -ENOMEM;
	}
	s->d = d;
	s->gen = cfg_gens_hold(&d->gens);
	s->orig = *orig;
	s->client = client;
	s->on_end = on_end;
	s->end_arg = end_arg;
	/* No interest until the relay starts: the app's first bytes wait in its stream. */
	stream_set_callbacks(client, &client_cbs, s);
	stream_set_interest(client, false, false);
	LIST_INSERT_HEAD(&d->sessions, s, link);
	d->active++;
	d->total++;
	if (d->active > d->trim_peak)
		d->trim_peak = d->active;
	if (bad != DISPATCHER_FAIL_MAX)
		session_fail_later(s, bad);
	else if (sniff && session_start_sniff(s) == 0)
		return 0;
	else if (dns ? session_start_dns(s, &why) != 0 : session_start(s, &why) != 0)
		session_fail_later(s, why);
	return 0;
}

void dispatcher_set_log(struct dispatcher *d, struct log *lg)
{
	d->log = lg;
}

void dispatcher_set_name_pins(struct dispatcher *d, dispatcher_pin_fn pin, dispatcher_pin_fn unpin)
{
	d->pin = pin;
	d->unpin = unpin;
}

void dispatcher_set_namer(struct dispatcher *d, dispatcher_namer_fn fn, void *arg)
{
	d->namer = fn;
	d->namer_arg = arg;
}

void dispatcher_set_dns(struct dispatcher *d, const struct dns_tcp_resolver *r)
{
	if (!r) {
		d->dns_on = false;
		return;
	}
	/* Live sessions borrow d->dns_res: only the same resolver may be set again under them. */
	assert(d->dns_live == 0 || (d->dns_res.query == r->query &&
				    d->dns_res.cancel == r->cancel && d->dns_res.ctx == r->ctx));
	d->dns_res = *r;
	d->dns_on = true;
}

/* ---- the dispatcher ------------------------------------------------------------------------ */

static int make_pools(struct dispatcher *d, const struct ts_config *cfg)
{
	const struct budget_limits *lim = budget_get_limits(d->budget);
	uint64_t max_bufs = lim->buffer_bytes / cfg->relay_buffer_bytes;
	struct pipepool_params pp;
	int ret;

	/* The pool's own cap only guards against nonsense; the budget's bytes are the real bound. */
	if (max_bufs < 2)
		max_bufs = 2;
	if (max_bufs > UINT32_MAX)
		max_bufs = UINT32_MAX;
	ret = bufpool_new(d->budget, "relay", cfg->relay_buffer_bytes, (uint32_t)max_bufs,
			  &d->bufs);
	if (ret != 0 || cfg->relay_mode != TS_RELAY_SPLICE)
		return ret;
	pipepool_params_default(&pp);
	pp.pipe_size = cfg->relay_pipe_bytes;
	return pipepool_new(d->base, d->budget, &pp, &d->pipes);
}

int dispatcher_new(struct event_base *base, const struct ts_config *cfg, struct budget *b,
		   struct dispatcher **out)
{
	struct dispatcher *d;
	int ret;

	*out = NULL;
	if (!base || !cfg || !b || cfg->n_outbounds == 0 || cfg->relay_buffer_bytes == 0)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base = base;
	d->budget = b;
	LIST_INIT(&d->sessions);
	TAILQ_INIT(&d->failing);
	if ((ret = cfg_gens_init(&d->gens, cfg)) != 0)
		goto fail;
	d->fail_ev = event_new(base, -1, 0, on_fail_ev, d);
	d->trim_ev = evtimer_new(base, on_trim, d);
	if (!d->fail_ev || !d->trim_ev) {
		ret = -ENOMEM;
		goto fail;
	}
	if ((ret = make_pools(d, cfg)) != 0)
		goto fail;
	*out = d;
	return 0;
fail:
	d->closing = true;
	dispatcher_free(d);
	return ret;
}

/* End one session during shutdown; on_end runs before this returns. */
static void session_kill(struct session *s)
{
	struct dispatcher *d = s->d;

	switch (s->state) {
	case S_CONNECTING:
		outbound_conn_cancel(s->conn);
		connecting_done(s);
		release_fd(s);
		stream_abort(s->client);
		s->client = NULL;
		session_end(s);
		break;
	case S_RELAYING:
		relay_cancel(s->relay); /* -> on_relay_done -> session_end */
		break;
	case S_FAILING:
		TAILQ_REMOVE(&d->failing, s, fail_link);
		session_fail_now(s, s->fail);
		break;
	case S_DNS:
		dns_tcp_cancel(s->dns); /* -> on_dns_done -> session_end */
		break;
	case S_SNIFFING:
		sniff_stop(s);
		stream_abort(s->client);
		s->client = NULL;
		session_end(s);
		break;
	}
}

void dispatcher_free(struct dispatcher *d)
{
	struct session *s;

	if (!d)
		return;
	d->closing = true;
	while ((s = LIST_FIRST(&d->sessions)) != NULL)
		session_kill(s);
	if (d->fail_ev)
		event_free(d->fail_ev);
	if (d->trim_ev)
		event_free(d->trim_ev);
	pipepool_free(d->pipes);
	bufpool_free(d->bufs);
	free(d->sniff_buf);
	cfg_gens_fini(&d->gens); /* after the last session: releases what was replaced */
	free(d);
}

void dispatcher_set_config(struct dispatcher *d, const struct ts_config *cfg,
			   void (*release)(void *arg, const struct ts_config *old), void *arg)
{
	assert(!d->closing && cfg && cfg->n_outbounds > 0);
	cfg_gens_set(&d->gens, cfg, release, arg);
}

void dispatcher_get_stats(const struct dispatcher *d, struct dispatcher_stats *out)
{
	const struct relay_counters *c = &d->relay_ctr;
	struct bufpool_stats bs;

	*out = (struct dispatcher_stats){ 0 };
	out->sessions_active = d->active;
	out->sessions_connecting = d->connecting;
	out->sessions_total = d->total;
	for (int i = 0; i < DISPATCHER_FAIL_MAX; i++) {
		out->fail[i] = d->fail[i];
		out->sessions_refused += d->fail[i];
	}
	for (int i = 0; i < RELAY_END_MAX; i++)
		out->relay_ends[i] = ctr_get(&c->ends[i]);
	out->bytes_up = ctr_get(&c->bytes[RELAY_UP]);
	out->bytes_down = ctr_get(&c->bytes[RELAY_DOWN]);
	out->splice_bytes = ctr_get(&c->splice_bytes);
	out->copy_bytes = ctr_get(&c->copy_bytes);
	out->gather_bytes = ctr_get(&c->gather_bytes);
	out->pipe_fallbacks = ctr_get(&c->pipe_fallbacks);
	out->buf_waits = ctr_get(&c->buf_waits);
	out->pipe_bytes_inflight = ctr_get(&c->pipe_bytes_inflight);
	out->buffer_bytes_inflight = ctr_get(&c->buf_bytes_inflight);
	if (d->pipes) {
		struct pipepool_stats ps;
		pipepool_get_stats(d->pipes, &ps);
		out->pipes_in_use = ps.lent;
		out->pipes_idle = ps.idle;
		out->pipes_reclaimed = ps.reclaimed;
		out->pipes_refused = ps.refused_budget;
		out->pipe_bytes = ps.pipe_bytes;
	}
	dns_tcp_counters_read(&d->dns_ctr, &out->dns_tcp);
	out->sniff = d->sniff;
	bufpool_get_stats(d->bufs, &bs);
	out->buffer_bytes_in_use = bs.bytes_in_use;
	out->buffer_bytes_peak = bs.bytes_peak;
	out->buffer_bytes_cached = bs.bytes_cached;
	out->heap_trims = d->heap_trims;
}
