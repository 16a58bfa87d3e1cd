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
 */
#include <errno.h>
#include <string.h>

#include <arpa/inet.h>
#include <event2/event.h>

#include "core/bufpool.h"
#include "core/clock.h"
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

int udp_sniff_input(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
		    int64_t now, bool wanted, const char **name)
{
	const struct ts_sniff *sn = &s->gen->cfg->route.sniff;
	struct usniff *x = s->sniff;
	struct timeval tv = { .tv_sec = sn->timeout_ms / 1000,
			      .tv_usec = (sn->timeout_ms % 1000) * 1000 };

	*name = NULL;
	if (x && same_flow(x, v)) {
		if (x->q)
			return look(up, x, v, now, name);
		*name = x->name[0] ? x->name : NULL;
		return 0;
	}
	/* Not worth a look; or the session looks at, or knows the name of, another flow. */
	if (!wanted || (x && (x->q || x->name[0])) ||
	    ctr_get(&up->ctr.sniff_active) >= UDP_SNIFF_LOOKS)
		return 0;
	if (!x) {
		if (!(x = budget_calloc(up->b, 1, sizeof(*x))))
			return 0;
		if (!(x->ev = evtimer_new(up->base, on_timeout, x))) {
			budget_mfree(up->b, x);
			return 0;
		}
		x->up = up;
		x->s = s;
		STAILQ_INIT(&x->held);
		s->sniff = x;
		up->sniff_live++;
		udp_name_work_update(up);
	}
	if (budget_bytes_reserve(up->b, LOOK_BYTES) != 0)
		return 0;
	if (sniff_quic_new(&x->q) != 0) {
		budget_bytes_release(up->b, LOOK_BYTES);
		return 0;
	}
	ctr_inc(&up->ctr.sniff_active);
	memcpy(x->dst, v->dst, 16);
	x->dport_be = v->dport_be;
	x->name[0] = '\0';
	evtimer_add(x->ev, &tv);
	ctr_inc(&up->ctr.sniff_started);
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
