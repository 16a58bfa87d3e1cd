/* udp_names.c — the UDP path's destinations by name (udp_path_set_namer): the namer's answers
 * cached per session, and names reached through a direct outbound resolved without blocking,
 * with replies mapped back to the address the client used. Design and contracts: udp.h. */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "core/budget.h"
#include "core/bufpool.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/netaddr.h"
#include "dispatch/udp_int.h"
#include "outbound/resolver.h"

/* ---- direct destinations by name ---------------------------------------------------------- */

/* Take q off d's queue (the session's queued count with it). */
static struct qdgram *dname_pop(struct udp_path *up, struct dname *d)
{
	struct qdgram *q = STAILQ_FIRST(&d->q);

	if (q) {
		STAILQ_REMOVE_HEAD(&d->q, link);
		d->qlen--;
		d->s->up_queued--;
		udp_gauge_dec(&up->ctr.up_queued);
	}
	return q;
}

static void dname_drain(struct udp_path *up, struct dname *d, enum udp_drop why)
{
	struct qdgram *q;

	while ((q = dname_pop(up, d))) {
		udp_count_drop(up, why);
		bufpool_put(up->pool, q);
	}
}

void udp_dname_free(struct udp_path *up, struct dname *d, enum udp_drop why)
{
	resolver_cancel(d->rq);
	dname_drain(up, d, why);
	TAILQ_REMOVE(&d->s->dnames, d, link);
	d->s->n_dnames--;
	budget_mfree(up->b, d);
}

/* Where d's datagrams go: its answer, at the port the client asked. */
static void dname_target(const struct dname *d, struct target *t)
{
	t->ob = d->ob;
	t->family = d->rfamily;
	t->dns = t->s5 = false;
	t->name = NULL;
	t->tolen = (socklen_t)netaddr_sockaddr(d->rfamily, d->raddr, d->port_be, &t->to);
}

/* The address to use among the answers (interleaved, IPv6 first), by the outbound's
 * domain_strategy: the first of the preferred family, else the first. */
static const struct netaddr *dname_pick(enum ts_domain_strategy ds, const struct netaddr *a,
					size_t n)
{
	int want = ds == TS_DS_PREFER_IPV4 || ds == TS_DS_IPV4_ONLY ? 4 : 6;

	for (size_t i = 0; i < n; i++)
		if (a[i].family == want)
			return &a[i];
	return n ? &a[0] : NULL;
}

static void dname_resolved(void *arg, int err, const struct netaddr *addrs, size_t n)
{
	struct dname *d = arg;
	struct udp_session *s = d->s;
	struct udp_path *up = s->up;
	const struct ts_outbound *ob = &s->gen->cfg->outbounds[d->ob];
	const struct netaddr *a = err ? NULL : dname_pick(ob->domain_strategy, addrs, n);
	struct qdgram *q;
	struct target t;

	d->rq = NULL;
	if (!a) {
		d->state = DN_FAILED;
		d->retry_ns = ts_now_ns() + (int64_t)UDP_ASSOC_RETRY_MS * TS_NS_PER_MS;
		ctr_inc(&up->ctr.resolve_failures);
		if (up->log)
			log_debug(up->log, "udp: %s did not resolve: %s", d->name,
				  err ? strerror(-err) : "no address of the allowed families");
		dname_drain(up, d, UDP_DROP_resolve_failed);
		return;
	}
	d->state = DN_READY;
	d->rfamily = (uint8_t)a->family;
	memset(d->raddr, 0, 16);
	memcpy(d->raddr, a->a, a->family == 4 ? 4 : 16);
	dname_target(d, &t);
	while ((q = dname_pop(up, d))) {
		struct usock *k = udp_sock_get(up, s, &t, ts_now_ns());
		if (k)
			udp_sock_send(up, k, &t, qdata(q), q->len);
		bufpool_put(up->pool, q);
	}
}

static int dname_lookup(struct udp_path *up, struct dname *d)
{
	const struct ts_outbound *ob = &d->s->gen->cfg->outbounds[d->ob];
	struct resolver *r = ob->resolver;
	int fam = ob->domain_strategy == TS_DS_IPV4_ONLY ? 4
		: ob->domain_strategy == TS_DS_IPV6_ONLY ? 6 : 0;
	int ret;

	if (!r) {
		struct resolver_config rc = { .sock = ob };
		if (!up->own_resolver && (ret = resolver_new(up->base, &rc, &up->own_resolver)) != 0)
			return ret;
		r = up->own_resolver;
	}
	d->state = DN_RESOLVING;
	if ((ret = resolver_lookup(r, d->name, fam, dname_resolved, d, &d->rq)) != 0)
		d->state = DN_FAILED; /* no lookup behind it: the next datagram tries again */
	return ret;
}

/* A new named destination of s, its lookup started; the oldest one makes room. NULL: dropped
 * and counted. */
static struct dname *dname_new(struct udp_path *up, struct udp_session *s, uint32_t ob,
			       const struct udp_view *v, const char *name)
{
	size_t len = strlen(name);
	struct dname *d;

	if (s->n_dnames >= UDP_DNAMES_MAX)
		udp_dname_free(up, TAILQ_LAST(&s->dnames, dname_list_head), UDP_DROP_session_closed);
	if (!(d = budget_calloc(up->b, 1, sizeof(*d) + len + 1))) {
		udp_count_drop(up, UDP_DROP_no_buffer);
		return NULL;
	}
	d->s = s;
	d->ob = ob;
	d->port_be = v->dport_be;
	memcpy(d->vaddr, v->dst, 16);
	memcpy(d->name, name, len + 1);
	STAILQ_INIT(&d->q);
	TAILQ_INSERT_HEAD(&s->dnames, d, link);
	s->n_dnames++;
	if (dname_lookup(up, d) != 0) {
		udp_dname_free(up, d, UDP_DROP_resolve_failed);
		udp_count_drop(up, UDP_DROP_resolve_failed);
		return NULL;
	}
	return d;
}

void udp_name_forget(struct udp_path *up, struct udp_session *s)
{
	if (s->rc_name) {
		if (up->unpin)
			up->unpin(up->namer_arg, s->key.family, s->nc_dst);
		budget_mfree(up->b, s->rc_name);
		s->rc_name = NULL;
	}
	s->nc_valid = false;
}

/* name (a valid one, or NULL) as s's cached name for v's destination, held while cached.
 * -ENOMEM: nothing cached (the namer is asked again for the next datagram). */
static int name_keep(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
		     const char *name)
{
	size_t len;

	udp_name_forget(up, s);
	if (name) {
		len = strlen(name);
		if (!(s->rc_name = budget_malloc(up->b, len + 1)))
			return -ENOMEM;
		memcpy(s->rc_name, name, len + 1);
	}
	s->nc_valid = true;
	s->nc_port_be = v->dport_be;
	memcpy(s->nc_dst, v->dst, 16);
	if (name && up->pin)
		up->pin(up->namer_arg, s->key.family, s->nc_dst);
	return 0;
}

void udp_name_seed(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
		   const char *name)
{
	(void)name_keep(up, s, v, name);
}

/* v goes direct to `name`: true with t pointed at the answer when it is known; false when v
 * waits for it (queued) or was dropped (counted). */
bool udp_dname_route(struct udp_path *up, struct udp_session *s, struct target *t,
			const struct udp_view *v, const char *name, int64_t now)
{
	struct dname *d;
	struct qdgram *q;

	TAILQ_FOREACH(d, &s->dnames, link)
		if (d->port_be == v->dport_be && !memcmp(d->vaddr, v->dst, 16))
			break;
	if (d && (d->ob != t->ob || strcmp(d->name, name) != 0)) {
		udp_dname_free(up, d, UDP_DROP_session_closed); /* the address means another name now */
		d = NULL;
	}
	if (!d && !(d = dname_new(up, s, t->ob, v, name)))
		return false;
	if (d->state == DN_FAILED) {
		if (now < d->retry_ns || dname_lookup(up, d) != 0) {
			udp_count_drop(up, UDP_DROP_resolve_failed);
			return false;
		}
	}
	if (d->state == DN_READY) {
		dname_target(d, t);
		return true;
	}
	if (s->up_queued >= up->up_limit) {
		udp_count_drop(up, UDP_DROP_queue_full);
		return false;
	}
	if (v->payload_len > up->qcap || !(q = bufpool_get(up->pool))) {
		udp_count_drop(up, v->payload_len > up->qcap ? UDP_DROP_oversize
							     : UDP_DROP_no_buffer);
		return false;
	}
	q->len = (uint32_t)v->payload_len;
	q->namelen = 0;
	q->tolen = 0;
	memcpy(qdata(q), v->payload, v->payload_len);
	STAILQ_INSERT_TAIL(&d->q, q, link);
	d->qlen++;
	s->up_queued++;
	ctr_inc(&up->ctr.up_queued);
	return false;
}

/* A reply from the answer of one of s's named destinations: from the address the client sent
 * to. true when h->src / h->sport_be were rewritten. */
bool udp_dname_unmap(const struct udp_session *s, int family, struct udp_codec_hdr *h)
{
	const struct dname *d;

	TAILQ_FOREACH(d, &s->dnames, link)
		if (d->state == DN_READY && d->rfamily == family && d->port_be == h->sport_be &&
		    !memcmp(d->raddr, h->src, 16)) {
			memcpy(h->src, d->vaddr, 16);
			return true;
		}
	return false;
}

/* The namer's name for v's destination, cached per session for consecutive datagrams to one
 * place (and held: udp_path_set_name_pins). NULL: no name. *bad (a drop reason, else 0): the
 * namer gave a name outbound_name_valid refuses (bad_name, or fake_unmapped for ""), or no
 * memory to keep it (no_buffer: the datagram must not go by address instead). */
const char *udp_name_for(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
			 int *bad)
{
	const char *n;

	*bad = 0;
	if (s->nc_valid && s->nc_port_be == v->dport_be && !memcmp(s->nc_dst, v->dst, 16))
		return s->rc_name;
	n = up->namer(up->namer_arg, v->family, v->dst, ntohs(v->dport_be));
	if (n && !outbound_name_valid(n)) {
		*bad = *n ? UDP_DROP_bad_name : UDP_DROP_fake_unmapped;
		return NULL;
	}
	/* Without its name a datagram would go to the address: never to a fake one. */
	if (name_keep(up, s, v, n) != 0) {
		*bad = UDP_DROP_no_buffer;
		return NULL;
	}
	return s->rc_name;
}
