/* udp_sniff.c — route.sniff for QUIC: the server name in a client's Initial chooses the route
 * of its flow (udp.c hands over datagrams to port 443 while route.sniff covers QUIC).
 *
 * A session looks at one QUIC flow (destination address and port) at a time. Its datagrams to
 * that destination wait, in order, in pool buffers counted in the session's up queue, while
 * the Initial is decrypted (sniff/sniff.h) — until the name is found, until no name can come
 * (not an Initial after all, a decryption failure, SNIFF_QUIC_MAX_DGRAMS datagrams without
 * the whole ClientHello), or until route.sniff.timeout_ms has passed. Then they go out, in
 * order, along the route the name (or the address alone) chooses, and every later datagram to
 * that destination goes by the same name without another look. A session keeps one flow's
 * name: datagrams to another destination go by address while a look runs or once a name was
 * found (a second look would take the first flow's name away in mid-connection). A datagram
 * that does not look like a client Initial never starts a look, and a flow whose route no
 * name could change is never looked at.
 *
 * A look holds about 24 KiB (the decryption state and the reassembled CRYPTO stream): each is
 * charged to the budget's buffer bytes while it runs, and at most UDP_SNIFF_LOOKS run at once
 * (beyond that, flows go by address), so Initials from many source ports cannot pin memory
 * the budget does not see.
 *
 * A look must see the flow's first Initial: the ClientHello's start may be in no other (a
 * client sends it once, unless it is lost), so a look started later could only hold the
 * flow's datagrams until the timeout. So once an Initial worth a look goes out without one —
 * no memory for the look, UDP_SNIFF_LOOKS already running, or the session busy with another
 * flow — it is counted by why and its session (one client source port) is not looked at
 * again: its flows go by address, as a flow without a name does.
 */
#include <errno.h>
#include <string.h>

#include <arpa/inet.h>
#include <event2/event.h>

#include "core/bufpool.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/netaddr.h"
#include "dispatch/route.h"
#include "dispatch/udp_int.h"
#include "sniff/sniff.h"

#define UDP_SNIFF_LOOKS 256
#define LOOK_BYTES (24u << 10)

struct usniff {
	struct udp_path *up;
	struct udp_session *s;
	struct event *ev;              /* the time limit, while looking */
	struct sniff_quic *q;          /* while looking; NULL once decided */
	uint8_t dst[16];
	uint16_t dport_be;
	struct qdgram_list held;       /* waiting for the decision, counted in s->up_queued */
	uint32_t nheld;
	char name[SNIFF_NAME_MAX + 1]; /* decided: the name, "" for none */
};

/* A datagram of the flow x looks at (no payload): what replays and routes are built from. */
static void flow_view(const struct usniff *x, struct udp_view *v)
{
	const struct udp_session *s = x->s;

	memset(v, 0, sizeof(*v));
	v->family = s->key.family;
	memcpy(v->src, s->key.addr, 16);
	v->sport_be = s->key.port_be;
	memcpy(v->dst, x->dst, 16);
	v->dport_be = x->dport_be;
}

bool udp_sniff_wanted(const struct ts_config *cfg, const struct udp_view *v)
{
	const struct ts_sniff *sn = &cfg->route.sniff;
	struct flow_key fk;

	if (!ts_sniff_on(sn, TS_SNIFF_QUIC) || !sniff_quic_is_initial(v->payload, v->payload_len))
		return false;
	if (sn->override_destination)
		return true;
	udp_flow_key(v, &fk);
	return route_name_matters(&cfg->route, &fk);
}

static bool same_flow(const struct usniff *x, const struct udp_view *v)
{
	return x->dport_be == v->dport_be && memcmp(x->dst, v->dst, 16) == 0;
}

/* The oldest datagram held, taken off the list and out of the queue counts (the caller puts
 * its buffer back), or NULL. */
static struct qdgram *unhold(struct udp_path *up, struct usniff *x)
{
	struct qdgram *q = STAILQ_FIRST(&x->held);

	if (!q)
		return NULL;
	STAILQ_REMOVE_HEAD(&x->held, link);
	x->nheld--;
	x->s->up_queued--;
	udp_gauge_dec(&up->ctr.up_queued);
	return q;
}

static void hold(struct udp_path *up, struct usniff *x, const struct udp_view *v)
{
	struct qdgram *q;

	if (x->s->up_queued >= up->up_limit) {
		udp_count_drop(up, UDP_DROP_queue_full);
		return;
	}
	if (v->payload_len > up->qcap || !(q = bufpool_get(up->pool))) {
		udp_count_drop(up, v->payload_len > up->qcap ? UDP_DROP_oversize
							     : UDP_DROP_no_buffer);
		return;
	}
	memset(q, 0, sizeof(*q));
	q->len = (uint32_t)v->payload_len;
	memcpy(qdata(q), v->payload, v->payload_len);
	STAILQ_INSERT_TAIL(&x->held, q, link);
	x->nheld++;
	x->s->up_queued++;
	ctr_inc(&up->ctr.up_queued);
}

/* A look's state goes: its memory back to the budget, its timer stopped. */
static void look_end(struct udp_path *up, struct usniff *x)
{
	sniff_quic_free(x->q);
	x->q = NULL;
	event_del(x->ev);
	budget_bytes_release(up->b, LOOK_BYTES);
	udp_gauge_dec(&up->ctr.sniff_active);
}

/* The look is over: name (NULL: none) is the flow's from now on; counted by why. */
static void decide(struct udp_path *up, struct usniff *x, const char *name, bool timeout)
{
	const struct ts_route *rt = &x->s->gen->cfg->route;

	look_end(up, x);
	if (name && outbound_name_valid(name)) {
		struct flow_key fk;
		struct udp_view v;

		snprintf(x->name, sizeof(x->name), "%s", name);
		ctr_inc(&up->ctr.sniff_quic);
		flow_view(x, &v);
		udp_flow_key(&v, &fk);
		if (route_select(rt, &fk, NULL) != route_select(rt, &fk, x->name))
			ctr_inc(&up->ctr.sniff_route_changed);
		if (rt->sniff.override_destination)
			ctr_inc(&up->ctr.sniff_overridden);
	} else {
		x->name[0] = '\0';
		ctr_inc(timeout ? &up->ctr.sniff_timeouts : &up->ctr.sniff_no_name);
	}
	/* The session is routed again from scratch: its last route was cached without the name. */
	x->s->rc_valid = false;
}

/* Send what waited, oldest first, through the path's input: each is routed by the decision. */
static void replay(struct udp_path *up, struct usniff *x, int64_t now)
{
	struct udp_view v;
	struct qdgram *q;

	flow_view(x, &v);
	while ((q = unhold(up, x))) {
		v.payload = qdata(q);
		v.payload_len = q->len;
		udp_input(up, &v, now);
		bufpool_put(up->pool, q);
	}
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct usniff *x = arg;

	(void)fd;
	(void)what;
	if (!x->q)
		return;
	decide(x->up, x, NULL, true);
	replay(x->up, x, ts_now_ns());
}

/* Feed v to the look: 1 when v waits (or was dropped), 0 when the look decided with v and the
 * datagrams before it went out (v goes next, *name its name). */
static int look(struct udp_path *up, struct usniff *x, const struct udp_view *v, int64_t now,
		const char **name)
{
	char found[SNIFF_NAME_MAX + 1];
	enum sniff_result r = sniff_quic_feed(x->q, v->payload, v->payload_len, found);

	if (r == SNIFF_NEED_MORE) {
		hold(up, x, v);
		return 1;
	}
	decide(up, x, r == SNIFF_FOUND ? found : NULL, false);
	replay(up, x, now);
	*name = x->name[0] ? x->name : NULL;
	return 0;
}

/* v, an Initial worth a look, goes by address without one: counted in c, one debug line, and
 * s is never looked at again (the file's header says why). 0, as udp_sniff_input. */
static int pass(struct udp_path *up, struct udp_session *s, const struct udp_view *v, ctr_t *c,
		const char *why)
{
	struct netaddr a = { .family = v->family };
	char addr[NETADDR_STRLEN];

	s->sniff_passed = true;
	ctr_inc(c);
	if (!up->log || !log_enabled(up->log, LOG_LEVEL_DEBUG))
		return 0;
	memcpy(a.a, v->dst, 16);
	log_debug(up->log, "udp from port %u to %s%s%s port %u: QUIC Initial not looked at "
		  "(route.sniff): %s; the session's flows go by address", ntohs(v->sport_be),
		  v->family == 6 ? "[" : "", netaddr_format(&a, addr, sizeof(addr)),
		  v->family == 6 ? "]" : "", ntohs(v->dport_be), why);
	return 0;
}

/* s's look state, made at its first look; NULL without memory. */
static struct usniff *usniff_new(struct udp_path *up, struct udp_session *s)
{
	struct usniff *x = budget_calloc(up->b, 1, sizeof(*x));

	if (!x)
		return NULL;
	if (!(x->ev = evtimer_new(up->base, on_timeout, x))) {
		budget_mfree(up->b, x);
		return NULL;
	}
	x->up = up;
	x->s = s;
	STAILQ_INIT(&x->held);
	s->sniff = x;
	up->sniff_live++;
	udp_name_work_update(up);
	return x;
}

/* A look at v's flow begins: its memory charged to the budget, its timer armed. -ENOMEM, with
 * nothing changed, when the budget, the heap or the timer refuses (sniff_quic_new's library
 * is loaded before a configuration that sniffs QUIC is taken: runtime/proxy.c). */
static int look_start(struct udp_path *up, struct usniff *x, const struct udp_view *v)
{
	uint32_t ms = x->s->gen->cfg->route.sniff.timeout_ms;
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	if (budget_bytes_reserve(up->b, LOOK_BYTES) != 0)
		return -ENOMEM;
	if (sniff_quic_new(&x->q) != 0 || evtimer_add(x->ev, &tv) != 0) {
		sniff_quic_free(x->q);
		x->q = NULL;
		budget_bytes_release(up->b, LOOK_BYTES);
		return -ENOMEM;
	}
	ctr_inc(&up->ctr.sniff_active);
	memcpy(x->dst, v->dst, 16);
	x->dport_be = v->dport_be;
	x->name[0] = '\0';
	ctr_inc(&up->ctr.sniff_started);
	return 0;
}

int udp_sniff_input(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
		    int64_t now, bool wanted, const char **name)
{
	struct usniff *x = s->sniff;

	*name = NULL;
	if (x && same_flow(x, v)) {
		if (x->q)
			return look(up, x, v, now, name);
		*name = x->name[0] ? x->name : NULL;
		return 0;
	}
	if (!wanted || s->sniff_passed)
		return 0;
	/* The session looks at, or knows the name of, another flow (it keeps one flow's). */
	if (x && (x->q || x->name[0]))
		return pass(up, s, v, &up->ctr.sniff_skipped_other_flow, "busy with another flow");
	if (ctr_get(&up->ctr.sniff_active) >= UDP_SNIFF_LOOKS)
		return pass(up, s, v, &up->ctr.sniff_skipped_busy, "too many looks at once");
	if ((!x && !(x = usniff_new(up, s))) || look_start(up, x, v) != 0)
		return pass(up, s, v, &up->ctr.sniff_skipped_no_memory, "no memory");
	return look(up, x, v, now, name);
}

bool udp_sniff_looking(const struct udp_session *s)
{
	return s->sniff && s->sniff->q;
}

const char *udp_sniff_name(const struct udp_session *s, const struct udp_view *v)
{
	const struct usniff *x = s->sniff;

	return x && !x->q && x->name[0] && same_flow(x, v) ? x->name : NULL;
}

bool udp_sniff_override(const struct udp_session *s)
{
	return s->gen->cfg->route.sniff.override_destination;
}

void udp_sniff_free(struct udp_path *up, struct udp_session *s)
{
	struct usniff *x = s->sniff;
	struct qdgram *q;

	if (!x)
		return;
	while ((q = unhold(up, x))) {
		bufpool_put(up->pool, q);
		udp_count_drop(up, UDP_DROP_session_closed);
	}
	if (x->q)
		look_end(up, x);
	event_free(x->ev);
	budget_mfree(up->b, x);
	s->sniff = NULL;
	up->sniff_live--;
	udp_name_work_update(up);
}
