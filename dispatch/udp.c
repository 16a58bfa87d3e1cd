/* udp.c — the shared UDP path: sessions by client source, one outbound socket per (outbound,
 * family) and session, DNS hijack, bounded queues, idle expiry, replies, gathering datagrams
 * into uplink trains. SOCKS5 associations are in udp_assoc.c, destinations by name in
 * udp_names.c, the uplink trains' sends in udp_uptrain.c. Design and contracts: udp.h. */
#include "dispatch/udp.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/bufpool.h"
#include "core/slab.h"
#include "core/clock.h"
#include "core/counter.h"
#include "core/loopguard.h"
#include "core/rss.h"
#include "core/udp_codec.h"
#include "dispatch/cfg_gen.h"
#include "dispatch/route.h"
#include "dispatch/udp_int.h"
#include "outbound/outbound.h"
#include "outbound/resolver.h"
#include "outbound/socks5_codec.h"

#define UDP_RX_BATCH 32          /* datagrams read per readiness edge: fairness among sockets */
#define UDP_EXPIRE_BATCH 1024    /* sessions closed per idle-timer run; the rest 1 ms later */
#define UDP_RETRY_NS 1000000LL   /* down-queue retry after tx said EAGAIN (no busy loop) */
#define UDP_BUCKETS_MIN 64u
#define UDP_QUEUE_BUFS_MAX (1u << 24) /* pool cap; buffer_bytes is the real bound */
#define DNS_HDR_LEN 12           /* RFC 1035 section 4.1.1: anything shorter has no header */
#define DNS_PORT 53

static const char *const drop_names[UDP_DROP_MAX] = {
#define UDP_DROP_STR(name) #name,
	UDP_DROPS(UDP_DROP_STR)
#undef UDP_DROP_STR
};

const char *udp_drop_name(enum udp_drop d)
{
	return (unsigned)d < UDP_DROP_MAX ? drop_names[d] : "unknown";
}

void udp_count_drop(struct udp_path *up, enum udp_drop d)
{
	ctr_inc(&up->ctr.drops[d]);
}

void udp_gauge_dec(ctr_t *c)
{
	ctr_add(c, (uint64_t)-1);
}

#define QUIC_PORT 443

/* ---- addresses ---------------------------------------------------------------------------- */

/* Family (4/6, 0 if neither), address (flow_key layout) and port of a recvfrom peer. */
/* ---- session table ------------------------------------------------------------------------ */

static uint64_t skey_hash(uint64_t seed, const struct skey *k)
{
	uint64_t w[3] = { 0, 0, 0 }, h = seed;

	memcpy(w, k, sizeof(*k));
	for (int i = 0; i < 3; i++) {
		h ^= w[i];
		h *= 0x9e3779b97f4a7c15ULL;
		h ^= h >> 29;
	}
	return h;
}

static struct udp_session **bucket_of(struct udp_path *up, const struct skey *k)
{
	return &up->buckets[skey_hash(up->seed, k) & (up->nbuckets - 1)];
}

static struct udp_session *session_lookup(struct udp_path *up, const struct skey *k)
{
	for (struct udp_session *s = *bucket_of(up, k); s; s = s->hnext)
		if (memcmp(&s->key, k, sizeof(*k)) == 0)
			return s;
	return NULL;
}

/* Double the buckets when the load passes 1. Out of budget: keep going with longer chains. */
static void table_grow(struct udp_path *up)
{
	size_t n = up->nbuckets * 2;
	struct udp_session **nb = budget_calloc(up->b, n, sizeof(*nb));

	if (!nb)
		return;
	for (size_t i = 0; i < up->nbuckets; i++) {
		struct udp_session *s, *next;
		for (s = up->buckets[i]; s; s = next) {
			next = s->hnext;
			size_t j = skey_hash(up->seed, &s->key) & (n - 1);
			s->hnext = nb[j];
			nb[j] = s;
		}
	}
	budget_mfree(up->b, up->buckets);
	up->buckets = nb;
	up->nbuckets = n;
}

static void table_remove(struct udp_path *up, struct udp_session *s)
{
	struct udp_session **pp = bucket_of(up, &s->key);

	while (*pp != s)
		pp = &(*pp)->hnext;
	*pp = s->hnext;
	up->nsessions--;
}

/* ---- idle timer --------------------------------------------------------------------------- */

/* d ns from now (at least min_ns), rounded up to the microsecond: never early. */
static struct timeval idle_tv(int64_t d, int64_t min_ns)
{
	if (d < min_ns)
		d = min_ns;
	d = (d + 999) / 1000;
	return (struct timeval){ .tv_sec = (time_t)(d / 1000000),
				 .tv_usec = (suseconds_t)(d % 1000000) };
}

/* Arm x's timer d ns from now for a session about to join x, which can do without it (it is
 * refused, or stays DNS only): the spare is kept for the sessions already there. 0, or
 * -ENOMEM: libevent had no memory for it (a timer already pending never needs any). */
static int idle_arm_in(struct expiry *x, int64_t d, int64_t min_ns)
{
	struct timeval tv = idle_tv(d, min_ns);

	x->unarmed = evtimer_add(x->ev, &tv) != 0;
	return x->unarmed ? -ENOMEM : 0;
}

/* Arm x's timer for the head of its list (nothing to wait for: not armed, so an idle path
 * never wakes). The sessions on the list have nothing else to end them: when libevent has no
 * memory for the timer, it takes the spare's place (core/evspare.h). Without a spare it is
 * not armed: x->unarmed, and the next datagram of a session of x (session_touch) or a new
 * session tries again. */
static void idle_arm(struct udp_path *up, struct expiry *x, int64_t now, int64_t min_ns)
{
	struct udp_session *s = TAILQ_FIRST(&x->list);
	struct timeval tv;
	int ret;

	x->unarmed = false;
	if (!s)
		return;
	tv = idle_tv(s->last_ns + x->ns - now, min_ns);
	ret = evspare_add(&up->spare, x->ev, &tv);
	x->unarmed = ret < 0;
	if (ret == EVSPARE_SPENT)
		ctr_inc(&up->ctr.expiry_spare_used);
	else if (ret < 0)
		ctr_inc(&up->ctr.expiry_unarmed);
}

static struct expiry *expiry_of(struct udp_path *up, const struct udp_session *s)
{
	return &up->exp[s->dns_only];
}

static void session_touch(struct udp_path *up, struct udp_session *s, int64_t now)
{
	struct expiry *x = expiry_of(up, s);

	/* Clocks of the driver batch and of callbacks may differ by a batch: an expiry can be
	 * that much late, never early. */
	if (now > s->last_ns)
		s->last_ns = now;
	if (TAILQ_NEXT(s, idle)) {
		TAILQ_REMOVE(&x->list, s, idle);
		TAILQ_INSERT_TAIL(&x->list, s, idle);
	}
	if (__builtin_expect(x->unarmed, 0))
		idle_arm(up, x, now, 0);
}

/* Not (or no longer) DNS only: onto the idle list for good, at its tail (now is at least as
 * late as any last_ns there, so the order holds). Not while the idle list's timer cannot be
 * armed (no memory): the session stays DNS only, bounded by the DNS timeout, and its next
 * datagram tries again. */
static void session_demote(struct udp_path *up, struct udp_session *s, int64_t now)
{
	struct expiry *x = &up->exp[0];
	struct udp_session *h = TAILQ_FIRST(&x->list);

	if (!s->dns_only)
		return;
	if (!evtimer_pending(x->ev, NULL) &&
	    idle_arm_in(x, h ? h->last_ns + x->ns - now : x->ns, 0) != 0)
		return;
	TAILQ_REMOVE(&up->exp[1].list, s, idle);
	s->dns_only = false;
	if (now > s->last_ns)
		s->last_ns = now;
	TAILQ_INSERT_TAIL(&x->list, s, idle);
}

/* ---- sockets ------------------------------------------------------------------------------ */

static void sock_read_cb(evutil_socket_t fd, short what, void *arg);
static void sock_write_cb(evutil_socket_t fd, short what, void *arg);
static void uptrain_flush(struct udp_path *up);

static void qlist_drain(struct udp_path *up, struct qdgram_list *l, ctr_t *gauge)
{
	struct qdgram *q;

	while ((q = STAILQ_FIRST(l))) {
		STAILQ_REMOVE_HEAD(l, link);
		udp_gauge_dec(gauge);
		udp_count_drop(up, UDP_DROP_session_closed);
		bufpool_put(up->pool, q);
	}
}

static void sock_close(struct udp_path *up, struct usock *k)
{
	/* A train of k still gathered goes now, as its datagrams would have without trains. */
	if (up->ut.n && up->ut.k == k)
		uptrain_flush(up);
	qlist_drain(up, &k->q, &up->ctr.up_queued);
	if (k->rev)
		event_del(k->rev);
	if (k->wev)
		event_free(k->wev);
	if (k->fd >= 0)
		close(k->fd);
	if (k->s5) {
		struct s5sock *a = s5of(k);

		if (a->pending)
			outbound_conn_cancel(a->pending);
		if (a->ctl_ev)
			event_free(a->ctl_ev);
		if (a->ctl_fd >= 0) {
			close(a->ctl_fd);
			udp_gauge_dec(&up->ctr.assocs);
		}
		if (a->names)
			budget_mfree(up->b, a->names);
	}
	budget_fd_release(up->b, k->s5 ? 2 : 1);
	if (k->s5)
		budget_mfree(up->b, k);
	else
		slab_put(up->sock_slab, k);
	udp_gauge_dec(&up->ctr.sockets);
}

/* The write event is made the first time the socket's queue needs one (sock_want_write): most
 * sockets never see EAGAIN, and an event is a heap block per socket. */
int udp_sock_setup(struct udp_path *up, struct usock *k, int fd)
{
	struct event *ev = (struct event *)((uint8_t *)k + (k->s5 ? up->s5_ev_off : up->ev_off));

	if (event_assign(ev, up->base, fd, EV_READ | EV_PERSIST, sock_read_cb, k) != 0 ||
	    event_add(ev, NULL) != 0)
		return -ENOMEM;
	k->fd = fd;
	k->rev = ev;
	return 0;
}

/* Wake when k (with its socket) is writable: 0, or -ENOMEM (no event could be made, or
 * libevent could not watch it: the caller drops what would wait for it). */
static int sock_want_write(struct udp_path *up, struct usock *k)
{
	if (!k->wev && !(k->wev = event_new(up->base, k->fd, EV_WRITE, sock_write_cb, k)))
		return -ENOMEM;
	if (!event_pending(k->wev, EV_WRITE, NULL) && event_add(k->wev, NULL) != 0)
		return -ENOMEM;
	return 0;
}

/* Connected: the kernel lets only the upstream answer on the DNS socket. The upstream is the
 * session's configuration's (a reload does not move a live session's DNS). */
static int dns_connect(int fd, const struct ts_config *cfg)
{
	const struct netaddr_ep *u = &cfg->dns.upstream;
	struct sockaddr_storage sa;
	socklen_t len = (socklen_t)netaddr_sockaddr(u->addr.family, u->addr.a, htons(u->port),
						    &sa);

	return connect(fd, (const struct sockaddr *)&sa, len);
}

/* Open the session's socket for t: fd budget first (refused before anything is opened), then
 * outbound_socket (marked/bound: never a plain socket, so nothing loops into the TUN). */
static struct usock *sock_open(struct udp_path *up, struct udp_session *s, const struct target *t)
{
	const struct ts_config *cfg = s->gen->cfg;
	struct usock *k;
	int fd;

	if (budget_fd_reserve(up->b, 1) != 0) {
		udp_count_drop(up, UDP_DROP_fd_budget);
		return NULL;
	}
	if (outbound_socket(&cfg->outbounds[t->ob], t->family, SOCK_DGRAM, &fd) != 0)
		goto fail_fd;
	if (t->dns && dns_connect(fd, cfg) != 0)
		goto fail_close;
	k = slab_zalloc(up->sock_slab);
	if (!k)
		goto fail_memory;
	k->s = s;
	k->ob = t->ob;
	k->family = t->family;
	k->dns = t->dns;
	k->ut_max = t->dns || !up->ut_on ? 0 : up->ut_segmax;
	STAILQ_INIT(&k->q);
	/* Replies in trains: let the kernel hand over a run of one source's datagrams of one
	 * size as one (UDP GRO: a NIC's coalescing, or a sender's UDP GSO, kept whole); the read
	 * cuts it back into datagrams. Without it (a kernel before 5.0), one at a time. */
	if (!t->dns && (s->key.family == 4 ? up->train4 : up->train6)) {
		int on = 1;
		k->gro = setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof(on)) == 0;
	}
	if (udp_sock_setup(up, k, fd) != 0) {
		slab_put(up->sock_slab, k);
		goto fail_memory;
	}
	SLIST_INSERT_HEAD(&s->socks, k, link);
	ctr_inc(&up->ctr.sockets);
	return k;
fail_memory:
	close(fd);
	budget_fd_release(up->b, 1);
	udp_count_drop(up, UDP_DROP_no_memory);
	return NULL;
fail_close:
	close(fd);
fail_fd:
	budget_fd_release(up->b, 1);
	udp_count_drop(up, UDP_DROP_socket_error);
	return NULL;
}

static inline __attribute__((always_inline)) struct usock *
sock_get(struct udp_path *up, struct udp_session *s, const struct target *t,
			      int64_t now)
{
	struct usock *k;

	SLIST_FOREACH(k, &s->socks, link) {
		/* An association's family, and its target's, are 0: one per outbound. */
		if (k->ob != t->ob || k->family != t->family || k->dns != t->dns)
			continue;
		if (k->s5 && s5of(k)->failed &&
		    (now < s5of(k)->retry_ns || udp_assoc_start(up, k) != 0)) {
			udp_count_drop(up, UDP_DROP_assoc_failed);
			return NULL;
		}
		return k;
	}
	return t->s5 ? udp_assoc_open(up, s, t) : sock_open(up, s, t);
}

static inline __attribute__((always_inline)) ssize_t
raw_sendto_inline(struct udp_path *up, int fd, const void *buf, size_t len,
		  const struct sockaddr *sa, socklen_t salen)
{
	ssize_t n;

	if (up->sendto_fn)
		return up->sendto_fn(up->sendto_arg, fd, buf, len, sa, salen);
	n = sendto(fd, buf, len, 0, sa, salen);
	return n < 0 ? -errno : n;
}

static ssize_t raw_sendto(struct udp_path *up, int fd, const void *buf, size_t len,
			  const struct sockaddr *sa, socklen_t salen)
{
	return raw_sendto_inline(up, fd, buf, len, sa, salen);
}

/* Through an association: wrapped for the relay (kept out of the direct path's code). */
static __attribute__((noinline)) ssize_t s5_sendto(struct udp_path *up, struct usock *k,
						   const void *buf, size_t len,
						   const struct sockaddr_storage *to,
						   const char *name)
{
	int w = udp_s5_wrap(up, k, buf, len, to, name, name ? strlen(name) : 0);

	if (w < 0)
		return w;
	return raw_sendto(up, k->fd, up->s5buf, (size_t)w,
			  (const struct sockaddr *)&s5of(k)->relay, s5of(k)->relay_len);
}

/* name: NUL-terminated, or NULL (used through an association only). */
static ssize_t do_sendto(struct udp_path *up, struct usock *k, const void *buf, size_t len,
			 const struct sockaddr_storage *to, socklen_t tolen, const char *name)
{
	if (__builtin_expect(k->s5, 0))
		return s5_sendto(up, k, buf, len, to, name);
	if (k->dns)
		return raw_sendto(up, k->fd, buf, len, NULL, 0);
	return raw_sendto(up, k->fd, buf, len, (const struct sockaddr *)to, tolen);
}

static void count_up(struct udp_path *up, const struct usock *k, size_t len)
{
	ctr_inc(&up->ctr.up_datagrams);
	ctr_add(&up->ctr.up_bytes, len);
	if (k->dns)
		ctr_inc(&up->ctr.dns_queries);
}

/* name: NUL-terminated, or NULL (through an association only). */
void udp_up_enqueue(struct udp_path *up, struct usock *k, const struct sockaddr_storage *to,
		    socklen_t tolen, const char *name, const uint8_t *payload, size_t len)
{
	struct udp_session *s = k->s;
	struct qdgram *q;

	if (s->up_queued >= up->up_limit) {
		udp_count_drop(up, UDP_DROP_queue_full);
		return;
	}
	if (len > up->qcap) {
		udp_count_drop(up, UDP_DROP_oversize);
		return;
	}
	if (k->fd >= 0 && sock_want_write(up, k) != 0) {
		udp_count_drop(up, UDP_DROP_watch_failed);
		return;
	}
	if (!(q = bufpool_get(up->pool))) {
		udp_count_drop(up, UDP_DROP_no_buffer);
		return;
	}
	q->len = (uint32_t)len;
	q->tolen = tolen;
	memcpy(&q->to, to, tolen);
	memcpy(qdata(q), payload, len);
	q->namelen = name ? (uint16_t)strlen(name) : 0;
	memcpy(qdata(q) + len, name ? name : "", q->namelen + 1u);
	STAILQ_INSERT_TAIL(&k->q, q, link);
	k->qlen++;
	s->up_queued++;
	ctr_inc(&up->ctr.up_queued);
}

/* Send now, or queue behind earlier datagrams of this socket (order kept), on EAGAIN, or
 * while its association is being set up. */
static inline __attribute__((always_inline)) void
sock_send_now(struct udp_path *up, struct usock *k, const struct sockaddr_storage *to,
	      socklen_t tolen, const char *name, const uint8_t *payload, size_t len)
{
	if (k->qlen == 0 && k->fd >= 0) {
		ssize_t r = do_sendto(up, k, payload, len, to, tolen, name);
		if (r >= 0) {
			count_up(up, k, len);
			return;
		}
		if (r != -EAGAIN) {
			udp_count_drop(up, UDP_DROP_send_error);
			return;
		}
	}
	udp_up_enqueue(up, k, to, tolen, name, payload, len);
}

void udp_sock_send_now(struct udp_path *up, struct usock *k, const struct sockaddr_storage *to,
		       socklen_t tolen, const char *name, const uint8_t *payload, size_t len)
{
	sock_send_now(up, k, to, tolen, name, payload, len);
}

/* ---- up: datagrams in trains (the send of two or more and turning them on: udp_uptrain.c) - */

/* Send the gathered train (not empty) and empty it. A train of one, the common case when the
 * datagrams of a batch go to different places, is a plain send, kept short: its socket is a
 * direct one with nothing queued (a train never forms behind a queue). */
static inline __attribute__((always_inline)) void uptrain_flush_inline(struct udp_path *up)
{
	struct udp_uptrain *u = &up->ut;
	ssize_t r;

	if (u->n != 1) {
		udp_uptrain_send(up);
		return;
	}
	assert(u->k->qlen == 0 && !u->k->s5 && !u->k->dns);
	u->n = 0;
	r = raw_sendto_inline(up, u->k->fd, u->buf, u->bytes, (const struct sockaddr *)&u->to,
			      u->tolen);
	if (r >= 0) {
		ctr_inc(&up->ctr.up_datagrams);
		ctr_add(&up->ctr.up_bytes, u->bytes);
	} else if (r == -EAGAIN) {
		udp_up_enqueue(up, u->k, &u->to, u->tolen, NULL, u->buf, u->bytes);
	} else {
		udp_count_drop(up, UDP_DROP_send_error);
	}
}

static __attribute__((noinline)) void uptrain_flush(struct udp_path *up)
{
	uptrain_flush_inline(up);
}

/* Anything sent on k outside a train goes after the train k may have waiting. */
static inline __attribute__((always_inline)) void uptrain_before(struct udp_path *up,
								 const struct usock *k)
{
	if (__builtin_expect(up->ut.n != 0, 0) && up->ut.k == k)
		uptrain_flush(up);
}

static inline __attribute__((always_inline)) void
sock_send(struct udp_path *up, struct usock *k, const struct target *t,
	  const uint8_t *payload, size_t len)
{
	uptrain_before(up, k);
	sock_send_now(up, k, &t->to, t->tolen, t->name, payload, len);
}

/* The bytes of a destination a train compares: a sockaddr_in6 and the padding after it. Every
 * target's address comes from netaddr_sockaddr, which zeroes the whole sockaddr_storage, so
 * equal destinations are equal over these bytes (whatever the family). */
#define UT_TO_CMP 32

static inline __attribute__((always_inline)) bool same_to(const struct sockaddr_storage *a,
							  const struct sockaddr_storage *b)
{
	uint64_t x[UT_TO_CMP / 8], y[UT_TO_CMP / 8], d = 0;

	memcpy(x, a, sizeof(x));
	memcpy(y, b, sizeof(y));
	for (int i = 0; i < UT_TO_CMP / 8; i++)
		d |= x[i] ^ y[i];
	return d == 0;
}

/* A datagram from the TUN (within a batch, udp_path_batch_end to come): with trains on, it
 * joins the train when it goes through the same socket to the same destination, is no larger
 * than the first (and not empty), follows no shorter one, and fits; otherwise the train is
 * sent first, and the datagram starts the next one if its socket takes trains and has
 * nothing queued, else it goes as before. */
static inline __attribute__((always_inline)) void
sock_send_tun(struct udp_path *up, struct usock *k, const struct target *t,
	      const uint8_t *payload, size_t len)
{
	struct udp_uptrain *u = &up->ut;

	if (!up->ut_on) {
		sock_send_now(up, k, &t->to, t->tolen, t->name, payload, len);
		return;
	}
	_Static_assert(sizeof(struct sockaddr_in6) <= UT_TO_CMP, "a destination is compared whole");
	if (u->n) {
		if (k == u->k && len - 1 < u->seg && !u->closed && u->n < UDP_CODEC_TRAIN_MAX &&
		    u->bytes + len <= up->ut_limit[k->family == 6] && same_to(&t->to, &u->to)) {
			memcpy(u->buf + u->bytes, payload, len);
			u->bytes += len;
			u->n++;
			u->closed = len < u->seg;
			return;
		}
		uptrain_flush(up);
	}
	/* ut_max is 0 for a socket that takes no trains, so an empty datagram never starts
	 * one (len - 1 wraps). */
	if (len - 1 < k->ut_max && k->qlen == 0) {
		u->k = k;
		u->n = 1;
		u->seg = len;
		u->bytes = len;
		u->closed = false;
		u->tolen = t->tolen;
		memcpy(&u->to, &t->to, UT_TO_CMP);
		memcpy(u->buf, payload, len);
		return;
	}
	sock_send_now(up, k, &t->to, t->tolen, t->name, payload, len);
}

void udp_path_batch_end(struct udp_path *up)
{
	if (up->ut.n)
		uptrain_flush_inline(up);
}

/* Send what waits in k's queue until the kernel says EAGAIN (bounded by the queue depth). */
void udp_sock_flush(struct udp_path *up, struct usock *k)
{
	struct qdgram *q;

	/* A train never forms behind a queue, nor a queue behind a train. */
	assert(!(up->ut.n && up->ut.k == k && k->qlen));

	while ((q = STAILQ_FIRST(&k->q))) {
		ssize_t r = do_sendto(up, k, qdata(q), q->len, &q->to, q->tolen,
				      q->namelen ? (const char *)qdata(q) + q->len : NULL);
		if (r == -EAGAIN && sock_want_write(up, k) == 0)
			return;
		STAILQ_REMOVE_HEAD(&k->q, link);
		k->qlen--;
		k->s->up_queued--;
		udp_gauge_dec(&up->ctr.up_queued);
		if (r < 0)
			udp_count_drop(up, r == -EAGAIN ? UDP_DROP_watch_failed
							 : UDP_DROP_send_error);
		else
			count_up(up, k, q->len);
		bufpool_put(up->pool, q);
	}
}

/* For the other files of the path; input() calls the static ones, which the compiler inlines. */
struct usock *udp_sock_get(struct udp_path *up, struct udp_session *s, const struct target *t,
			   int64_t now)
{
	return sock_get(up, s, t, now);
}

void udp_sock_send(struct udp_path *up, struct usock *k, const struct target *t,
		   const uint8_t *payload, size_t len)
{
	sock_send(up, k, t, payload, len);
}

/* The socket is writable again. */
static void sock_write_cb(evutil_socket_t fd, short what, void *arg)
{
	struct usock *k = arg;

	udp_sock_flush(k->s->up, k);
}

static bool dns_finish(struct udp_path *up, struct udp_session *s);

/* ---- down: replies to the TUN ------------------------------------------------------------- */

static void count_down(struct udp_path *up, const struct udp_session *s, size_t pkt_len)
{
	ctr_inc(&up->ctr.down_datagrams);
	ctr_add(&up->ctr.down_bytes, pkt_len - udp_codec_hdr_len(s->key.family));
}

/* 0, or -ENOMEM: libevent had no memory for the retry timer. */
static int down_arm(struct udp_path *up)
{
	struct timeval tv = { 0, UDP_RETRY_NS / 1000 };

	if (evtimer_pending(up->down_ev, NULL) || evtimer_add(up->down_ev, &tv) == 0)
		return 0;
	return -ENOMEM;
}

static void down_enqueue(struct udp_path *up, struct udp_session *s, const uint8_t *pkt,
			 size_t len)
{
	struct qdgram *q;

	if (s->dq_len >= up->down_limit) {
		udp_count_drop(up, UDP_DROP_queue_full);
		return;
	}
	/* Nothing would flush a queue whose retry timer cannot be armed (no memory). */
	if (down_arm(up) != 0) {
		udp_count_drop(up, UDP_DROP_no_memory);
		return;
	}
	if (len > up->qcap || !(q = bufpool_get(up->pool))) {
		udp_count_drop(up, len > up->qcap ? UDP_DROP_oversize : UDP_DROP_no_buffer);
		return;
	}
	q->len = (uint32_t)len;
	memcpy(qdata(q), pkt, len);
	STAILQ_INSERT_TAIL(&s->dq, q, link);
	s->dq_len++;
	ctr_inc(&up->ctr.down_queued);
	if (!s->in_down) {
		TAILQ_INSERT_TAIL(&up->down_list, s, down);
		s->in_down = true;
	}
}

/* Hand a reply to the driver, or queue it behind earlier ones (order kept) or on EAGAIN. */
static void deliver_down(struct udp_path *up, struct udp_session *s, const uint8_t *pkt,
			 size_t len)
{
	if (s->dq_len == 0) {
		int r = up->tx(up->tx_arg, pkt, len);
		if (r == 0) {
			count_down(up, s, len);
			return;
		}
		if (r != -EAGAIN) {
			udp_count_drop(up, UDP_DROP_tx_error);
			return;
		}
	}
	down_enqueue(up, s, pkt, len);
}

/* Flush one session's down queue: 0 when empty, -EAGAIN when the driver is still full. */
static int down_flush(struct udp_path *up, struct udp_session *s)
{
	struct qdgram *q;

	while ((q = STAILQ_FIRST(&s->dq))) {
		int r = up->tx(up->tx_arg, qdata(q), q->len);
		if (r == -EAGAIN)
			return -EAGAIN;
		STAILQ_REMOVE_HEAD(&s->dq, link);
		s->dq_len--;
		udp_gauge_dec(&up->ctr.down_queued);
		if (r < 0)
			udp_count_drop(up, UDP_DROP_tx_error);
		else
			count_down(up, s, q->len);
		bufpool_put(up->pool, q);
	}
	return 0;
}

/* Work is bounded by what is queued, itself bounded by sessions x udp_down_queue. The driver
 * still full and no memory to time the next try: what waits is dropped (no_memory) rather
 * than left with nothing to flush it. */
static void down_cb(evutil_socket_t fd, short what, void *arg)
{
	struct udp_path *up = arg;
	struct udp_session *s;
	struct qdgram *q;
	bool drop = false;

	while ((s = TAILQ_FIRST(&up->down_list))) {
		if (!drop && down_flush(up, s) == -EAGAIN) {
			if (down_arm(up) == 0)
				return;
			drop = true;
		}
		while (drop && (q = STAILQ_FIRST(&s->dq))) {
			STAILQ_REMOVE_HEAD(&s->dq, link);
			s->dq_len--;
			udp_gauge_dec(&up->ctr.down_queued);
			udp_count_drop(up, UDP_DROP_no_memory);
			bufpool_put(up->pool, q);
		}
		TAILQ_REMOVE(&up->down_list, s, down);
		s->in_down = false;
		dns_finish(up, s);
	}
}

/* ---- flows in the kernel (udp_path_set_offload) ------------------------------------------- */

static void fast_out(struct udp_path *up, struct udp_session *s, struct ufast *f);

/* Take s's flows out of the kernel: those sent through k, or all (k NULL). */
static void fast_leave(struct udp_path *up, struct udp_session *s, const struct usock *k)
{
	for (int i = 0; s->n_fast_in && i < UDP_FAST_MAX; i++) {
		struct ufast *f = &s->fast[i];

		if (f->state == UF_IN && (!k || f->k == k))
			fast_out(up, s, f);
	}
}

/* Offer f (datagrams to it sent through k for UDP_FAST_AGE_NS now) to the offload. */
static void fast_join(struct udp_path *up, struct udp_session *s, struct usock *k,
		      struct ufast *f, const struct target *t, const struct udp_view *v)
{
	const struct ts_config *cfg = s->gen->cfg;
	struct udp_fast_flow ff = { .fd = k->fd, .ob = &cfg->outbounds[t->ob],
				    .idle_ns = (uint64_t)up->exp[0].ns };

	/* A new QUIC connection on this flow must still meet route.sniff: its handshake
	 * datagrams (long header) come to us. */
	ff.quic_handshakes = v->dport_be == htons(QUIC_PORT) &&
			     ts_sniff_on(&cfg->route.sniff, TS_SNIFF_QUIC);

	/* What k still gathers goes first: the kernel's datagrams must not overtake it. */
	if (up->ut.n && up->ut.k == k)
		uptrain_flush(up);
	udp_flow_key(v, &ff.app);
	if (up->off->add(up->off_arg, &ff, &f->cookie) != 0) {
		f->state = UF_REFUSED;
		ctr_inc(&up->ctr.fast_refused);
		return;
	}
	f->state = UF_IN;
	f->k = k;
	s->n_fast_in++;
	ctr_inc(&up->ctr.fast_flows);
	ctr_inc(&up->ctr.fast_added);
}

/* t sends v to the very address and port the client sent it to (not to a name's answer). */
static bool sent_as_addressed(const struct target *t, const struct udp_view *v)
{
	uint8_t a[16] = { 0 };
	uint16_t port_be;

	return netaddr_from_sockaddr(&t->to, a, &port_be) == v->family &&
	       port_be == v->dport_be && memcmp(a, v->dst, v->family == 4 ? 4 : 16) == 0;
}

/* Take one flow of s out of the kernel. */
static void fast_out(struct udp_path *up, struct udp_session *s, struct ufast *f)
{
	up->off->del(up->off_arg, f->cookie);
	f->state = UF_FREE;
	f->k = NULL;
	f->cookie = NULL;
	s->n_fast_in--;
	udp_gauge_dec(&up->ctr.fast_flows);
}

/* A datagram of s to v's destination, about to go through k. eligible: by address, through a
 * direct socket of the client's family, nothing about the session asking for userspace. Such
 * a flow becomes a candidate, or joins once it has gone on long enough (and nothing of k's
 * waits to be sent, which its datagrams would overtake). A flow in the kernel meets this only
 * with a datagram the kernel left to us (larger than the uplink's MTU, a QUIC handshake
 * datagram under route.sniff, one that raced the add): if it is no longer eligible, or now
 * goes through another socket (a look at QUIC chose another outbound), it leaves. Slots taken
 * by candidates or refused flows are reused, oldest first; ones in the kernel only when they
 * leave. */
static __attribute__((noinline)) void fast_consider(struct udp_path *up, struct udp_session *s,
						     struct usock *k, const struct target *t,
						     const struct udp_view *v, bool eligible,
						     int64_t now)
{
	struct ufast *f, *reuse = NULL;

	if (!s->fast) {
		if (!eligible)
			return;
		if (!(s->fast = budget_malloc(up->b, UDP_FAST_MAX * sizeof(*s->fast))))
			return;
		memset(s->fast, 0, UDP_FAST_MAX * sizeof(*s->fast));
	}
	for (int i = 0; i < UDP_FAST_MAX; i++) {
		f = &s->fast[i];
		if (f->state != UF_FREE && f->dport_be == v->dport_be &&
		    memcmp(f->dst, v->dst, 16) == 0) {
			if (f->state == UF_IN && (!eligible || f->k != k))
				fast_out(up, s, f);
			else if (!eligible)
				f->state = UF_FREE;
			else if (f->state == UF_CANDIDATE && now - f->since_ns >= UDP_FAST_AGE_NS &&
				 STAILQ_EMPTY(&k->q))
				fast_join(up, s, k, f, t, v);
			return;
		}
		if (f->state == UF_IN)
			continue;
		if (!reuse || (reuse->state != UF_FREE &&
			       (f->state == UF_FREE || f->since_ns < reuse->since_ns)))
			reuse = f;
	}
	if (!reuse || !eligible)
		return;
	reuse->state = UF_CANDIDATE;
	reuse->dport_be = v->dport_be;
	memcpy(reuse->dst, v->dst, 16);
	reuse->since_ns = now;
}

/* s is due to expire: has the kernel sent any of its flows' datagrams since its last
 * activity here? Then that is its last activity (true: not due after all). */
static bool fast_active(struct udp_path *up, struct udp_session *s, int64_t timeout,
			int64_t now)
{
	int64_t last = s->last_ns;

	for (int i = 0; i < UDP_FAST_MAX; i++) {
		int64_t seen;

		if (s->fast[i].state == UF_IN &&
		    (seen = up->off->seen(up->off_arg, s->fast[i].cookie)) > last)
			last = seen;
	}
	if (last + timeout <= now)
		return false;
	s->last_ns = last;
	return true;
}

/* ---- sessions ----------------------------------------------------------------------------- */

/* gen: held by the caller; the session takes that hold (not on failure). */
static struct udp_session *session_new(struct udp_path *up, const struct skey *k,
				       struct cfg_gen *gen, bool dns_only, int64_t now)
{
	struct expiry *x = &up->exp[dns_only];
	struct udp_session *s = TAILQ_FIRST(&x->list);

	/* A session no timer would expire is not made (no memory for the timer). */
	if (!evtimer_pending(x->ev, NULL) &&
	    idle_arm_in(x, s ? s->last_ns + x->ns - now : x->ns, 0) != 0) {
		udp_count_drop(up, UDP_DROP_no_memory);
		return NULL;
	}
	if (budget_udp_acquire(up->b) != 0) {
		udp_count_drop(up, UDP_DROP_no_session_budget);
		return NULL;
	}
	s = slab_zalloc(up->sess_slab);
	if (!s) {
		budget_udp_release(up->b);
		udp_count_drop(up, UDP_DROP_no_memory);
		return NULL;
	}
	s->up = up;
	s->gen = gen;
	s->key = *k;
	s->last_ns = now;
	s->dns_only = dns_only;
	SLIST_INIT(&s->socks);
	TAILQ_INIT(&s->dnames);
	STAILQ_INIT(&s->dq);
	if (up->nsessions >= up->nbuckets)
		table_grow(up);
	struct udp_session **b = bucket_of(up, k);
	s->hnext = *b;
	*b = s;
	up->nsessions++;
	TAILQ_INSERT_TAIL(&x->list, s, idle);
	ctr_inc(&up->ctr.sessions);
	ctr_inc(&up->ctr.sessions_total);
	(void)evspare_hold(&up->spare); /* for the expiry's re-arms (idle_arm) */
	return s;
}

/* Unlink from every list first, then close and free: nothing can reach s afterwards. */
void udp_session_free(struct udp_path *up, struct udp_session *s)
{
	struct usock *k;

	table_remove(up, s);
	TAILQ_REMOVE(&expiry_of(up, s)->list, s, idle);
	if (s->in_down)
		TAILQ_REMOVE(&up->down_list, s, down);
	while (!TAILQ_EMPTY(&s->dnames))
		udp_dname_free(up, TAILQ_FIRST(&s->dnames), UDP_DROP_session_closed);
	if (s->fast) {
		fast_leave(up, s, NULL); /* before the sockets whose ports they use close */
		budget_mfree(up->b, s->fast);
	}
	while ((k = SLIST_FIRST(&s->socks))) {
		SLIST_REMOVE_HEAD(&s->socks, link);
		sock_close(up, k);
	}
	qlist_drain(up, &s->dq, &up->ctr.down_queued);
	udp_sniff_free(up, s);
	cfg_gen_put(&up->gens, s->gen);
	udp_name_forget(up, s);
	if (s->dns)
		budget_mfree(up->b, s->dns);
	slab_put(up->sess_slab, s);
	budget_udp_release(up->b);
	udp_gauge_dec(&up->ctr.sessions);
	if (up->nsessions == 0)
		evspare_release(&up->spare); /* nothing to expire: an idle path never wakes */
}

static void expire(struct udp_path *up, struct expiry *x, ctr_t *expired)
{
	int64_t now = ts_now_ns();
	struct udp_session *s;
	int n = 0;

	while ((s = TAILQ_FIRST(&x->list)) && s->last_ns + x->ns <= now) {
		if (n++ == UDP_EXPIRE_BATCH) {
			idle_arm(up, x, now, UDP_RETRY_NS);
			return;
		}
		if (s->n_fast_in && fast_active(up, s, x->ns, now)) {
			/* Active in the kernel: to the tail, by the time it was (later ones may
			 * stand before it now: their expiry comes late, never early). */
			TAILQ_REMOVE(&x->list, s, idle);
			TAILQ_INSERT_TAIL(&x->list, s, idle);
			ctr_inc(&up->ctr.fast_kept);
			continue;
		}
		udp_session_free(up, s);
		ctr_inc(expired);
	}
	idle_arm(up, x, now, 0);
}

static void idle_cb(evutil_socket_t fd, short what, void *arg)
{
	struct udp_path *up = arg;

	expire(up, &up->exp[0], &up->ctr.sessions_expired);
}

static void dns_cb(evutil_socket_t fd, short what, void *arg)
{
	struct udp_path *up = arg;

	expire(up, &up->exp[1], &up->ctr.dns_expired);
}

/* A DNS-only session with nothing left to wait for (no query unanswered, no answer queued
 * for the TUN) is done: closed now rather than held for a timeout. */
static bool dns_finish(struct udp_path *up, struct udp_session *s)
{
	if (!s->dns_only || s->dns_waiting || s->dq_len)
		return false;
	udp_session_free(up, s);
	ctr_inc(&up->ctr.dns_done);
	return true;
}

/* ---- DNS hijack --------------------------------------------------------------------------- */

/* 0, or -ENOBUFS: no memory for the session's first pending query (the caller drops it). */
static int dns_remember(struct udp_path *up, struct udp_session *s, const struct udp_view *v)
{
	struct dns_pending *p;
	uint16_t txid;

	if (!s->dns && !(s->dns = budget_calloc(up->b, UDP_DNS_PENDING, sizeof(*s->dns))))
		return -ENOBUFS;
	memcpy(&txid, v->payload, 2);
	for (int i = 0; i < UDP_DNS_PENDING; i++) {
		p = &s->dns[i];
		if (p->used && p->txid == txid && p->port_be == v->dport_be &&
		    memcmp(p->addr, v->dst, 16) == 0)
			return 0; /* a retransmission: already waiting */
	}
	p = &s->dns[s->dns_next];
	s->dns_next = (s->dns_next + 1) % UDP_DNS_PENDING;
	if (!p->used)
		s->dns_waiting++;
	p->used = true;
	p->txid = txid;
	p->port_be = v->dport_be;
	memcpy(p->addr, v->dst, 16);
	return 0;
}

/* The asked address of the query this answer belongs to (the entry is consumed). Two pending
 * queries with one id to different servers: the first remembered slot wins. */
static bool dns_match(struct udp_session *s, const uint8_t *answer, size_t len,
		      struct udp_codec_hdr *h)
{
	uint16_t txid;

	if (len < DNS_HDR_LEN || !(answer[2] & 0x80) || !s->dns)
		return false; /* not an answer (QR clear: a query echoed back, say) */
	memcpy(&txid, answer, 2);
	for (int i = 0; i < UDP_DNS_PENDING; i++) {
		struct dns_pending *p = &s->dns[i];
		if (p->used && p->txid == txid) {
			memcpy(h->src, p->addr, 16);
			h->sport_be = p->port_be;
			p->used = false;
			s->dns_waiting--;
			return true;
		}
	}
	return false;
}

/* Not hijacked: is this reply, from addr:port_be, the answer to a pending query (QR set, an
 * asked id, from the server asked)? The entry is consumed. */
static bool dns_match_plain(struct udp_session *s, const uint8_t *answer, size_t len,
			    const uint8_t addr[16], uint16_t port_be)
{
	uint16_t txid;

	if (len < DNS_HDR_LEN || !(answer[2] & 0x80) || !s->dns)
		return false;
	memcpy(&txid, answer, 2);
	for (int i = 0; i < UDP_DNS_PENDING; i++) {
		struct dns_pending *p = &s->dns[i];
		if (p->used && p->txid == txid && p->port_be == port_be &&
		    memcmp(p->addr, addr, 16) == 0) {
			p->used = false;
			s->dns_waiting--;
			return true;
		}
	}
	return false;
}

/* A query the session may carry and stay DNS only: hijacked, or to port 53 with a DNS header
 * that is a query (QR clear). */
static bool dns_like(const struct udp_view *v, const struct target *t)
{
	return t->dns || (v->dport_be == htons(DNS_PORT) && v->payload_len >= DNS_HDR_LEN &&
			  !(v->payload[2] & 0x80));
}

/* ---- replies ------------------------------------------------------------------------------ */

/* One datagram received on k, its n bytes at payload: who it is from, as the client must see
 * it, into *h (false: dropped and counted, or a DNS reply the session no longer waits for).
 * Through an association payload is rxbuf + header room, and *n may shrink (the SOCKS5
 * header taken off). */
static bool reply_hdr(struct udp_path *up, struct usock *k, const struct sockaddr_storage *from,
		      const uint8_t *payload, size_t *n, struct udp_codec_hdr *h)
{
	struct udp_session *s = k->s;

	h->family = s->key.family;
	memcpy(h->dst, s->key.addr, 16);
	h->dport_be = s->key.port_be;
	if (k->s5 && !udp_s5_unwrap(up, k, from, n, h))
		return false;
	if (k->dns) {
		if (!dns_match(s, payload, *n, h)) {
			udp_count_drop(up, UDP_DROP_dns_unmatched);
			return false;
		}
		ctr_inc(&up->ctr.dns_answers);
	} else {
		if (!k->s5) {
			int family = netaddr_from_sockaddr(from, h->src, &h->sport_be);
			/* A named destination's answer may be of the other family than the
			 * client's; any other reply is of the client's (the socket's family is the
			 * destination's). */
			if (!(s->n_dnames && udp_dname_unmap(s, family, h)) && family != s->key.family) {
				udp_count_drop(up, UDP_DROP_malformed);
				return false;
			}
		}
		if (s->dns_only && !dns_match_plain(s, payload, *n, h->src, h->sport_be))
			session_demote(up, s, ts_now_ns()); /* not DNS after all: an ordinary one */
	}
	h->ip_id = up->ip_id++;
	return true;
}

/* One datagram received on k (payload at rxbuf + header room): encode remote -> client. */
static void reply(struct udp_path *up, struct usock *k, const struct sockaddr_storage *from,
		  size_t n)
{
	struct udp_session *s = k->s;
	size_t hl = udp_codec_hdr_len(s->key.family), pkt_len;
	struct udp_codec_hdr h;

	if (!reply_hdr(up, k, from, up->rxbuf + hl, &n, &h))
		return;
	if (udp_codec_encode(&h, up->rxbuf + hl, n, up->rxbuf, up->rxcap, &pkt_len) != 0) {
		udp_count_drop(up, UDP_DROP_too_big);
		return;
	}
	deliver_down(up, s, up->rxbuf, pkt_len);
}

/* ---- trains: replies of one flow in one TUN write ----------------------------------------- */

/* Replies k may gather into trains: ordinary ones (not DNS, not through an association) to a
 * client of a family the TUN takes UDP GSO writes for. The others must not: the SOCKS5 unwrap
 * and the DNS answer paths read their datagram at rxbuf + header room, where only a train's
 * first datagram lands. */
static bool train_ok(const struct udp_path *up, const struct usock *k)
{
	return !k->s5 && !k->dns && (k->gro || (k->s->key.family == 4 ? up->train4 : up->train6));
}

static bool same_flow(const struct udp_codec_hdr *a, const struct udp_codec_hdr *b)
{
	return a->sport_be == b->sport_be && a->family == b->family &&
	       memcmp(a->src, b->src, 16) == 0;
}

/* Write the gathered train (its payloads back to back at rxbuf + header room) and empty it. Two
 * or more datagrams with nothing queued before them go as one UDP GSO write; otherwise, or
 * when that write fails, one by one, each encoded in place over the tail of the one before
 * (already written or copied to the queue). A write the kernel refuses as such (-EINVAL,
 * -EOPNOTSUPP: no UDP GSO after all) turns trains off for that family; after any other error
 * the train goes one by one and the next one is tried again. */
static void train_flush(struct udp_path *up, struct udp_session *s)
{
	struct udp_train *t = &up->tr;
	size_t hl = udp_codec_hdr_len(t->h.family), len;
	uint32_t n = t->n;

	if (n == 0)
		return;
	t->n = 0;
	if (n >= 2 && s->dq_len == 0 && (t->h.family == 4 ? up->train4 : up->train6)) {
		struct pkt_meta m;
		if (udp_codec_encode_train(&t->h, t->bytes, t->seg, up->rxbuf, up->rxcap, &len,
					   &m) == 0) {
			int r = up->tx_meta(up->tx_arg, up->rxbuf, len, &m);
			if (r == 0) {
				ctr_add(&up->ctr.down_datagrams, n);
				ctr_add(&up->ctr.down_bytes, t->bytes);
				ctr_inc(&up->ctr.trains);
				ctr_add(&up->ctr.train_datagrams, n);
				return;
			}
			if (r != -EAGAIN)
				ctr_inc(&up->ctr.train_errors);
			if (r == -EINVAL || r == -EOPNOTSUPP) {
				if (t->h.family == 4)
					up->train4 = false;
				else
					up->train6 = false;
			}
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		size_t off = (size_t)i * t->seg, plen = i + 1 < n ? t->seg : t->bytes - off;
		struct udp_codec_hdr h = t->h;
		uint8_t *out = up->rxbuf + off;

		h.ip_id = (uint16_t)(t->h.ip_id + i);
		if (udp_codec_encode(&h, out + hl, plen, out, up->rxcap - off, &len) != 0) {
			udp_count_drop(up, UDP_DROP_too_big);
			continue;
		}
		deliver_down(up, s, out, len);
	}
}

/* Add a reply (h, n bytes at p, at or after rxbuf + header room + the train's bytes) to the train: it
 * continues it when it comes from the same source with no more bytes than the first (a
 * shorter one ends it: a GSO packet's last datagram alone may be short) and the train has
 * room; otherwise the train is written first and this one starts the next. */
static void train_add(struct udp_path *up, struct udp_session *s, const struct udp_codec_hdr *h,
		      const uint8_t *p, size_t n)
{
	struct udp_train *t = &up->tr;
	size_t hl = udp_codec_hdr_len(h->family);

	if (t->n && (t->closed || n == 0 || n > t->seg || t->n == UDP_CODEC_TRAIN_MAX ||
		     t->bytes + n > udp_codec_max_payload(h->family) || !same_flow(&t->h, h)))
		train_flush(up, s);
	if (t->n == 0) {
		if (n && p != up->rxbuf + hl)
			memmove(up->rxbuf + hl, p, n);
		t->h = *h;
		t->seg = n;
		t->bytes = n;
		t->n = 1;
		t->closed = n == 0;
		return;
	}
	/* Right behind the train, where a read put it, or moved there: only ever backwards,
	 * over bytes already taken, never over a datagram still to come. */
	if (p != up->rxbuf + hl + t->bytes)
		memmove(up->rxbuf + hl + t->bytes, p, n);
	t->bytes += n;
	t->n++;
	t->closed = n < t->seg;
}

/* One read: the bytes, and with gro in *seg the size of the datagrams they hold (the GRO
 * control message; 0: one datagram). -1 with errno as recvmsg. */
static ssize_t recv_one(int fd, uint8_t *buf, size_t cap, struct sockaddr_storage *from,
			bool gro, size_t *seg)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr mh = { .msg_name = from, .msg_namelen = sizeof(*from), .msg_iov = &iov,
			     .msg_iovlen = 1, .msg_control = gro ? ctl.buf : NULL,
			     .msg_controllen = gro ? sizeof(ctl.buf) : 0 };
	ssize_t n = recvmsg(fd, &mh, 0);

	*seg = 0;
	if (n <= 0 || !gro)
		return n;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		int v;
		if (c->cmsg_level != SOL_UDP || c->cmsg_type != UDP_GRO)
			continue;
		memcpy(&v, CMSG_DATA(c), sizeof(v));
		if (v > 0 && (size_t)v < (size_t)n)
			*seg = (size_t)v;
	}
	return n;
}

static void sock_read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct usock *k = arg;
	struct udp_session *s = k->s;
	struct udp_path *up = s->up;
	size_t hl = udp_codec_hdr_len(s->key.family);
	bool got = false, train = train_ok(up, k);
	/* A pass may gather a whole train: its datagrams cost one write together. */
	int batch = train ? UDP_CODEC_TRAIN_MAX : UDP_RX_BATCH;

	for (int i = 0; i < batch; i++) {
		struct sockaddr_storage from;
		/* A train's next datagram lands right after its payloads: the buffer has room
		 * for a whole train and the largest read after it, so nothing truncates. */
		size_t off = train && up->tr.n ? up->tr.bytes : 0, seg, at = 0;
		uint8_t *p = up->rxbuf + hl + off;
		ssize_t n = recv_one(fd, p, up->rxcap - hl - off, &from, k->gro, &seg);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			/* E.g. ECONNREFUSED from an ICMP error on the connected DNS socket: the
			 * error is consumed by this call, so keep reading. */
			ctr_inc(&up->ctr.recv_errors);
			continue;
		}
		/* A DNS-only session waiting for no answer (its last one still queued for the
		 * TUN): whatever else comes matches nothing. Read and counted, not left on the
		 * socket, whose read event would wake the loop on every pass meanwhile. */
		if (s->dns_only && !s->dns_waiting) {
			udp_count_drop(up, UDP_DROP_dns_unmatched);
			continue;
		}
		got = true;
		if (!train) {
			reply(up, k, &from, (size_t)n);
			continue;
		}
		/* One datagram, or (GRO) a run of them seg bytes each but the last: each is
		 * checked and joins the train as if read alone. */
		if (seg == 0)
			seg = (size_t)n;
		else
			ctr_add(&up->ctr.gro_datagrams, ((size_t)n + seg - 1) / seg);
		do {
			struct udp_codec_hdr h;
			size_t len = (size_t)n - at < seg ? (size_t)n - at : seg;
			if (reply_hdr(up, k, &from, p + at, &len, &h))
				train_add(up, s, &h, p + at, len);
			at += seg;
		} while (at < (size_t)n);
	}
	if (train)
		train_flush(up, s);
	if (got && !dns_finish(up, s))
		session_touch(up, s, ts_now_ns());
}

/* ---- datagrams from the TUN --------------------------------------------------------------- */

/* The route for v (and the name of its destination, NULL: none), cached for consecutive
 * datagrams to one place (the name is the namer's answer for that place: cached with it). */
void udp_flow_key(const struct udp_view *v, struct flow_key *fk)
{
	memset(fk, 0, sizeof(*fk));
	fk->family = v->family;
	fk->proto = IPPROTO_UDP;
	fk->sport_be = v->sport_be;
	fk->dport_be = v->dport_be;
	memcpy(fk->src, v->src, 16);
	memcpy(fk->dst, v->dst, 16);
}

static uint32_t route_for(const struct ts_config *cfg, struct udp_session *s,
			  const struct udp_view *v, const char *name)
{
	struct flow_key fk;
	uint32_t ob;

	if (s && s->rc_valid && s->rc_port_be == v->dport_be && !memcmp(s->rc_dst, v->dst, 16))
		return s->rc_ob;
	udp_flow_key(v, &fk);
	ob = route_select(&cfg->route, &fk, name);
	if (s) {
		s->rc_valid = true;
		s->rc_port_be = v->dport_be;
		s->rc_ob = ob;
		memcpy(s->rc_dst, v->dst, 16);
	}
	return ob;
}

static bool is_ours(const struct ts_config *cfg, const struct udp_view *v)
{
	const struct netaddr_roles *r = v->family == 4 ? &cfg->roles4 : &cfg->roles6;
	return netaddr_roles_is_ours(r, v->dst);
}

/* Decide where v goes under cfg (s's configuration, or the one a new session will hold). 0,
 * or -1 when dropped (counted). */
static int pick_target(struct udp_path *up, const struct ts_config *cfg, struct udp_session *s,
		       const struct udp_view *v, const char *name, struct target *t)
{
	/* Hijack first: it takes precedence over the own-address drop (a resolver on the
	 * gateway is the common setup). */
	if (cfg->dns.hijack && cfg->dns.has_upstream && v->dport_be == htons(DNS_PORT)) {
		if (v->payload_len < DNS_HDR_LEN) {
			udp_count_drop(up, UDP_DROP_malformed);
			return -1;
		}
		t->dns = true;
		t->ob = cfg->route.final;
		t->family = cfg->dns.upstream.addr.family;
		/* Used through an association only (the plain DNS socket is connected). */
		t->tolen = (socklen_t)netaddr_sockaddr(t->family, cfg->dns.upstream.addr.a,
						       htons(cfg->dns.upstream.port), &t->to);
	} else {
		if (is_ours(cfg, v)) {
			udp_count_drop(up, UDP_DROP_own_address);
			return -1;
		}
		t->dns = false;
		t->ob = route_for(cfg, s, v, name);
		t->family = v->family;
		t->tolen = (socklen_t)netaddr_sockaddr(v->family, v->dst, v->dport_be, &t->to);
	}
	t->s5 = false;
	t->name = NULL;
	switch (cfg->outbounds[t->ob].type) {
	case TS_OUT_DIRECT:
		return 0;
	case TS_OUT_REJECT:
		udp_count_drop(up, UDP_DROP_rejected);
		return -1;
	case TS_OUT_SOCKS5:
		if (cfg->outbounds[t->ob].udp) {
			t->s5 = true;
			t->family = 0; /* one association for every family */
			return 0;
		}
		udp_count_drop(up, UDP_DROP_unsupported_outbound); /* "udp": false */
		return -1;
	default:
		/* HTTP CONNECT carries no UDP: dropped, never sent direct. */
		udp_count_drop(up, UDP_DROP_unsupported_outbound);
		return -1;
	}
}

/* From the TUN's own address and a port of one of the proxy's own live sockets? (The
 * roles are the same in every configuration: they cannot change on reload.) */
static bool from_self(struct udp_path *up, const struct udp_view *v)
{
	const struct ts_config *cfg = cfg_gens_current(&up->gens);
	const struct netaddr *gw = v->family == 4 ? &cfg->roles4.gateway : &cfg->roles6.gateway;

	return gw->family == v->family && memcmp(gw->a, v->src, v->family == 4 ? 4 : 16) == 0 &&
	       loopguard_hit(up->loopguard, 1, v->family, v->sport_be);
}

/* v waits for its destination's answer, or was dropped and counted (udp_dname_route false): s
 * kept for what it holds; a fresh one that holds nothing (no named destination, no socket) is
 * freed rather than kept for the idle timeout with its budget slot and its name. */
static void held_or_freed(struct udp_path *up, struct udp_session *s, bool fresh, int64_t now)
{
	if (fresh && s->n_dnames == 0 && SLIST_EMPTY(&s->socks) && s->up_queued == 0)
		udp_session_free(up, s);
	else
		session_touch(up, s, now);
}

/* With a namer: t aimed at v's destination's name, if it has one (socks5: the name goes in
 * the header; direct: the name's answer). false when v is done with (it waits for the answer,
 * or was dropped and counted; a fresh session then freed if it holds nothing). */
static __attribute__((noinline)) bool name_target(struct udp_path *up, struct udp_session *s,
						  struct target *t, const struct udp_view *v,
						  bool fresh, int64_t now)
{
	const char *name;
	int bad;

	if (!t->s5 && s->gen->cfg->outbounds[t->ob].type != TS_OUT_DIRECT)
		return true;
	name = udp_name_for(up, s, v, &bad);
	if (bad) {
		udp_count_drop(up, (enum udp_drop)bad);
		if (fresh)
			udp_session_free(up, s);
		return false;
	}
	if (t->s5) {
		t->name = name;
	} else if (name && !udp_dname_route(up, s, t, v, name, now)) {
		held_or_freed(up, s, fresh, now);
		return false;
	}
	return true;
}

/* For rules that match names: v's destination's name into *name (NULL: none), from s's cache
 * or, before a session exists, from the namer (copied into buf). 0, or the drop reason of a name
 * outbound_name_valid refuses (udp_name_for). */
static __attribute__((noinline)) int route_name(struct udp_path *up, struct udp_session *s,
						const struct udp_view *v,
						char buf[OUTBOUND_NAME_MAX + 1], const char **name)
{
	const char *n;
	int bad;

	if (s) {
		*name = udp_name_for(up, s, v, &bad);
		return bad;
	}
	n = up->namer(up->namer_arg, v->family, v->dst, ntohs(v->dport_be));
	if (n && !outbound_name_valid(n))
		return *n ? UDP_DROP_bad_name : UDP_DROP_fake_unmapped;
	if (n) {
		snprintf(buf, OUTBOUND_NAME_MAX + 1, "%s", n);
		*name = buf;
	}
	return 0;
}

/* The name of a datagram's destination before its route, and what became of it. */
struct name_res {
	int rc;                  /* 0: go on; 1: v waits for a look at its QUIC flow, or was
				  * dropped; -1: dropped (counted) before a session took gen */
	struct udp_session *s;   /* the session (made here when a look starts: it holds what
				  * waits), or NULL */
	const char *name;        /* the namer's name, or the one the QUIC flow announced */
	bool fresh;              /* s was made here and holds no socket yet */
};

/* The namer's name for v's destination (when rules match names), else, for a QUIC client
 * Initial to port 443 under route.sniff, the name its flow announces. Returned by value, so
 * that none of input's variables has its address taken. */
static __attribute__((noinline)) struct name_res names_before_route(struct udp_path *up,
								    struct udp_session *s,
								    struct cfg_gen *gen,
								    const struct skey *key,
								    const struct udp_view *v,
								    int64_t now,
								    char nbuf[OUTBOUND_NAME_MAX + 1])
{
	struct name_res r = { .s = s };
	bool wanted, looking;
	int bad;

	if (up->namer && gen->cfg->route.has_names &&
	    (bad = route_name(up, s, v, nbuf, &r.name)) != 0) {
		udp_count_drop(up, (enum udp_drop)bad);
		r.rc = -1;
		return r;
	}
	/* The session's own configuration decides (a reload leaves its looks and names alone). */
	if (r.name || v->dport_be != htons(QUIC_PORT) ||
	    (!(s && s->sniff) && !ts_sniff_on(&gen->cfg->route.sniff, TS_SNIFF_QUIC)))
		return r;
	wanted = udp_sniff_wanted(gen->cfg, v);
	if (!s && !wanted)
		return r;
	if (!s) {
		if (!(r.s = session_new(up, key, gen, false, now))) {
			r.rc = -1;
			return r;
		}
		r.fresh = true;
	}
	looking = udp_sniff_looking(r.s);
	r.rc = udp_sniff_input(up, r.s, v, now, wanted, &r.name);
	if (r.rc != 0)
		return r;
	/* A session that holds nothing after the look decided (its held datagrams refused, or
	 * none) is as good as new: freed if this datagram is refused too. */
	r.fresh = (r.fresh || looking) && SLIST_EMPTY(&r.s->socks) &&
		  TAILQ_EMPTY(&r.s->dnames) && r.s->up_queued == 0 && STAILQ_EMPTY(&r.s->dq);
	return r;
}

/* t aimed at the name of v's destination where the name replaces the address: the namer's
 * (name_target), or a sniffed one under override_destination. false when v is done with. */
static __attribute__((noinline)) bool names_after_route(struct udp_path *up,
							struct udp_session *s, struct target *t,
							const struct udp_view *v, bool fresh,
							int64_t now)
{
	const char *name = udp_sniff_name(s, v);

	if (!name)
		return !up->namer || name_target(up, s, t, v, fresh, now);
	if (!udp_sniff_override(s))
		return true;
	if (t->s5) {
		t->name = name;
	} else if (s->gen->cfg->outbounds[t->ob].type == TS_OUT_DIRECT &&
		   !udp_dname_route(up, s, t, v, name, now)) {
		held_or_freed(up, s, fresh, now);
		return false;
	}
	return true;
}

/* A datagram the codec accepted: its session, its target, out. tun: from the TUN within a
 * batch (it may wait in an uplink train until the batch ends); otherwise one that waited. */
static void input(struct udp_path *up, const struct udp_view *v, int64_t now_ns, bool tun)
{
	struct skey key;
	struct target t;
	struct udp_session *s;
	struct cfg_gen *gen;
	struct usock *k;
	bool fresh = false;
	char nbuf[OUTBOUND_NAME_MAX + 1];
	const char *rname = NULL;

	memset(&key, 0, sizeof(key));
	key.family = v->family;
	key.port_be = v->sport_be;
	memcpy(key.addr, v->src, 16);
	/* The proxy's own resolver answers hijacked queries: no session. */
	if (__builtin_expect(up->dns != NULL, 0) && v->dport_be == htons(DNS_PORT)) {
		if (up->loopguard && from_self(up, v))
			udp_count_drop(up, UDP_DROP_loop);
		else
			udp_dns_input(up, v);
		return;
	}
	s = session_lookup(up, &key);
	if (!s && up->loopguard && from_self(up, v)) {
		udp_count_drop(up, UDP_DROP_loop);
		return;
	}
	/* A new session's target and the session itself must come from one configuration. */
	gen = s ? s->gen : cfg_gens_hold(&up->gens);
	/* Rules that match names need the name before the route (the namer's, or the one a QUIC
	 * flow announced): one test when neither is configured. */
	if (__builtin_expect(up->name_work, 0)) {
		struct name_res r = names_before_route(up, s, gen, &key, v, now_ns, nbuf);

		if (r.rc < 0)
			goto unhold;
		s = r.s;
		if (r.rc > 0) {
			session_touch(up, s, now_ns);
			return;
		}
		rname = r.name;
		fresh = r.fresh;
	}
	if (pick_target(up, gen->cfg, s, v, rname, &t) != 0) {
		if (fresh)
			udp_session_free(up, s); /* made for a look that decided at once */
		goto unhold;
	}
	if (!s) {
		if (!(s = session_new(up, &key, gen, dns_like(v, &t), now_ns)))
			goto unhold;
		fresh = true;
		if (rname)
			udp_name_seed(up, s, v, rname);
	} else if (__builtin_expect(s->dns_only, 0) && !dns_like(v, &t)) {
		session_demote(up, s, now_ns); /* an ordinary session costs this flag test only */
	}
	if (__builtin_expect(up->name_work, 0) && !t.dns &&
	    !names_after_route(up, s, &t, v, fresh, now_ns))
		return;
	k = sock_get(up, s, &t, now_ns);
	if (!k) {
		/* A session that never got a socket holds nothing worth a budget slot. One whose
		 * association was refused on the spot keeps it, failed, so that its retry time
		 * holds (udp_assoc_open). */
		if (fresh && SLIST_EMPTY(&s->socks))
			udp_session_free(up, s);
		return;
	}
	session_touch(up, s, now_ns);
	/* To the remote's address through a direct socket of the client's family, and nothing
	 * about the session asks for userspace (DNS, names, a look at QUIC under way): a flow
	 * the kernel may carry. */
	if (__builtin_expect(up->off != NULL, 0))
		fast_consider(up, s, k, &t, v,
			      !t.dns && !t.s5 && !s->dns_only && !s->n_dnames &&
				      !udp_sniff_looking(s) && k->family == s->key.family &&
				      sent_as_addressed(&t, v),
			      now_ns);
	if ((t.dns || s->dns_only) && dns_remember(up, s, v) != 0) {
		udp_count_drop(up, UDP_DROP_no_buffer); /* its answer could not be matched */
		return;
	}
	if (tun)
		sock_send_tun(up, k, &t, v->payload, v->payload_len);
	else
		sock_send(up, k, &t, v->payload, v->payload_len);
	return;
unhold:
	if (!s)
		cfg_gen_put(&up->gens, gen);
}

void udp_name_work_update(struct udp_path *up)
{
	up->name_work = up->namer || up->sniff_quic || up->sniff_live > 0;
}

/* Out of line for the datagrams a look held (udp_sniff.c); input stays inlined in the entries. */
void udp_input(struct udp_path *up, const struct udp_view *v, int64_t now_ns)
{
	input(up, v, now_ns, false);
}

void udp_path_input_view(struct udp_path *up, const struct pkt_view *pv, int64_t now_ns)
{
	struct udp_view v;

	if (udp_codec_from_view(&v, pv) != UDP_CODEC_OK) {
		udp_count_drop(up, UDP_DROP_malformed);
		return;
	}
	input(up, &v, now_ns, true);
}

void udp_path_input(struct udp_path *up, const uint8_t *pkt, size_t len, int64_t now_ns)
{
	struct pkt_view pv;

	/* pkt_parse takes a mutable buffer because the stacks rewrite in place; it only reads. */
	if (pkt_parse(&pv, (uint8_t *)pkt, len) != PKT_OK) {
		udp_count_drop(up, UDP_DROP_malformed);
		return;
	}
	udp_path_input_view(up, &pv, now_ns);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void path_seed(struct udp_path *up)
{
	/* A keyed hash: client source ports are chosen by apps, so chains must not be. */
	if (getrandom(&up->seed, sizeof(up->seed), GRND_NONBLOCK) != (ssize_t)sizeof(up->seed))
		up->seed = (uint64_t)(uintptr_t)up ^ (uint64_t)ts_now_ns();
}

static int path_alloc(struct udp_path *up, const struct ts_config *cfg)
{
	const struct budget_limits *l = budget_get_limits(up->b);
	uint64_t bufs = (uint64_t)l->udp_sessions * ((uint64_t)l->udp_up_queue + l->udp_down_queue);
	int ret;

	/* A queued datagram is at most one TUN packet (up) or one reply of that size (down);
	 * anything larger is not worth pinning a buffer for (oversize). */
	up->qcap = (size_t)cfg->tun.mtu + 48;
	up->mtu = cfg->tun.mtu;
	ret = bufpool_new(up->b, "udp", sizeof(struct qdgram) + up->qcap + OUTBOUND_NAME_MAX + 1,
			  (uint32_t)(bufs < UDP_QUEUE_BUFS_MAX ? bufs : UDP_QUEUE_BUFS_MAX),
			  &up->pool);
	if (ret != 0)
		return ret;
	/* Room for the largest datagram plus the largest header: recvfrom never truncates. */
	up->rxcap = 48 + 65535;
	up->rxbuf = budget_malloc(up->b, up->rxcap);
	if (!up->rxbuf)
		return -ENOBUFS;
	up->evsize = event_get_struct_event_size();
	up->ev_off = (sizeof(struct usock) + 15) / 16 * 16;
	up->s5_ev_off = (sizeof(struct s5sock) + 15) / 16 * 16;
	if ((ret = slab_new(up->b, sizeof(struct udp_session), &up->sess_slab)) != 0 ||
	    (ret = slab_new(up->b, up->ev_off + up->evsize, &up->sock_slab)) != 0)
		return ret;
	up->nbuckets = UDP_BUCKETS_MIN;
	up->buckets = budget_calloc(up->b, up->nbuckets, sizeof(*up->buckets));
	if (!up->buckets)
		return -ENOBUFS;
	up->exp[0].ev = evtimer_new(up->base, idle_cb, up);
	up->exp[1].ev = evtimer_new(up->base, dns_cb, up);
	up->down_ev = evtimer_new(up->base, down_cb, up);
	if (!up->exp[0].ev || !up->exp[1].ev || !up->down_ev)
		return -ENOMEM;
	return evspare_init(&up->spare, up->base);
}

static void set_timeouts(struct udp_path *up, const struct ts_config *cfg)
{
	up->exp[0].ns = (int64_t)cfg->timeouts.udp_idle_ms * TS_NS_PER_MS;
	up->exp[1].ns = up->dns_timeout_ns < up->exp[0].ns ? up->dns_timeout_ns : up->exp[0].ns;
}

/* Re-arm both timers after a timeout changed: a shorter one takes effect now (a longer one:
 * the timer fires early and re-arms). Re-armed in place: a pending timer needs no memory. */
static void rearm(struct udp_path *up)
{
	int64_t now = ts_now_ns();

	for (int i = 0; i < 2; i++) {
		if (TAILQ_EMPTY(&up->exp[i].list))
			evtimer_del(up->exp[i].ev);
		else
			idle_arm(up, &up->exp[i], now, 0);
	}
}

int udp_path_new(struct event_base *base, const struct ts_config *cfg, struct budget *b,
		 tun_tx_fn tx, void *tx_arg, struct udp_path **out)
{
	const struct budget_limits *l = budget_get_limits(b);
	struct udp_path *up;
	int ret;

	if (!base || !cfg || !b || !tx || cfg->n_outbounds == 0 || !out)
		return -EINVAL;
	up = calloc(1, sizeof(*up));
	if (!up)
		return -ENOMEM;
	up->base = base;
	up->b = b;
	up->tx = tx;
	up->tx_arg = tx_arg;
	up->dns_timeout_ns = (int64_t)UDP_DNS_TIMEOUT_MS * TS_NS_PER_MS;
	set_timeouts(up, cfg);
	up->sniff_quic = ts_sniff_on(&cfg->route.sniff, TS_SNIFF_QUIC);
	udp_name_work_update(up);
	up->up_limit = l->udp_up_queue;
	up->down_limit = l->udp_down_queue;
	TAILQ_INIT(&up->exp[0].list);
	TAILQ_INIT(&up->exp[1].list);
	TAILQ_INIT(&up->down_list);
	path_seed(up);
	ret = cfg_gens_init(&up->gens, cfg);
	if (ret == 0)
		ret = path_alloc(up, cfg);
	if (ret != 0) {
		udp_path_free(up);
		return ret;
	}
	*out = up;
	return 0;
}

size_t udp_path_release_idle(struct udp_path *up)
{
	size_t n = rss_pages_release(up->rxbuf, up->rxcap);

	if (up->s5buf)
		n += rss_pages_release(up->s5buf, up->s5cap);
	/* The uplink train's buffer: empty between batches, so nothing in it is lost. */
	if (up->ut.buf && up->ut.n == 0)
		n += rss_pages_release(up->ut.buf, up->ut.cap);
	return n;
}

void udp_path_free(struct udp_path *up)
{
	struct udp_session *s;

	if (!up)
		return;
	udp_dns_cancel_all(up);
	for (int i = 0; i < 2; i++) {
		while ((s = TAILQ_FIRST(&up->exp[i].list)))
			udp_session_free(up, s);
		if (up->exp[i].ev)
			event_free(up->exp[i].ev);
	}
	if (up->down_ev)
		event_free(up->down_ev);
	evspare_fini(&up->spare);
	budget_mfree(up->b, up->buckets);
	budget_mfree(up->b, up->rxbuf);
	if (up->ut.buf)
		budget_mfree(up->b, up->ut.buf);
	if (up->s5buf)
		budget_mfree(up->b, up->s5buf);
	resolver_free(up->own_resolver);
	bufpool_free(up->pool);
	slab_free(up->sess_slab);
	slab_free(up->sock_slab);
	cfg_gens_fini(&up->gens); /* after the last session: releases what was replaced */
	free(up);
}

void udp_path_set_config(struct udp_path *up, const struct ts_config *cfg,
			 void (*release)(void *arg, const struct ts_config *old), void *arg)
{
	assert(cfg && cfg->n_outbounds > 0);
	cfg_gens_set(&up->gens, cfg, release, arg);
	up->sniff_quic = ts_sniff_on(&cfg->route.sniff, TS_SNIFF_QUIC);
	udp_name_work_update(up);
	/* One timeout per list for all its sessions: each list stays ordered by expiry. */
	set_timeouts(up, cfg);
	rearm(up);
}

int udp_path_set_trains(struct udp_path *up, tun_tx_meta_fn tx_meta, bool v4, bool v6)
{
	size_t cap = 48 + 2 * 65535u;
	uint8_t *buf;

	if ((v4 || v6) && !tx_meta)
		return -EINVAL;
	up->train4 = up->train6 = false;
	if ((v4 || v6) && up->rxcap < cap) {
		/* The old buffer goes first, so a budget sized for the path with trains holds the
		 * new one. Refused, the old size fits again: it was just given back. */
		budget_mfree(up->b, up->rxbuf);
		if (!(buf = budget_malloc(up->b, cap))) {
			up->rxbuf = budget_malloc(up->b, up->rxcap);
			return up->rxbuf ? -ENOBUFS : -ENOMEM;
		}
		up->rxbuf = buf;
		up->rxcap = cap;
	}
	up->tx_meta = tx_meta;
	up->train4 = v4;
	up->train6 = v6;
	return 0;
}

void udp_path_stats(const struct udp_path *up, struct udp_path_stats *out)
{
	const struct udp_counters *c = &up->ctr;

	memset(out, 0, sizeof(*out));
	out->sessions = ctr_get(&c->sessions);
	out->sessions_total = ctr_get(&c->sessions_total);
	out->sessions_expired = ctr_get(&c->sessions_expired);
	out->sockets = ctr_get(&c->sockets);
	out->up_queued = ctr_get(&c->up_queued);
	out->down_queued = ctr_get(&c->down_queued);
	out->up_datagrams = ctr_get(&c->up_datagrams);
	out->up_bytes = ctr_get(&c->up_bytes);
	out->down_datagrams = ctr_get(&c->down_datagrams);
	out->down_bytes = ctr_get(&c->down_bytes);
	out->dns_queries = ctr_get(&c->dns_queries);
	out->dns_answers = ctr_get(&c->dns_answers);
	out->dns_done = ctr_get(&c->dns_done);
	out->dns_expired = ctr_get(&c->dns_expired);
	out->recv_errors = ctr_get(&c->recv_errors);
	out->trains = ctr_get(&c->trains);
	out->train_datagrams = ctr_get(&c->train_datagrams);
	out->train_errors = ctr_get(&c->train_errors);
	out->gro_datagrams = ctr_get(&c->gro_datagrams);
	out->up_trains = ctr_get(&c->up_trains);
	out->up_train_datagrams = ctr_get(&c->up_train_datagrams);
	out->up_train_errors = ctr_get(&c->up_train_errors);
	out->assocs = ctr_get(&c->assocs);
	out->assocs_total = ctr_get(&c->assocs_total);
	out->assoc_failures = ctr_get(&c->assoc_failures);
	out->assoc_control_closed = ctr_get(&c->assoc_control_closed);
	out->resolve_failures = ctr_get(&c->resolve_failures);
	out->sniff_started = ctr_get(&c->sniff_started);
	out->sniff_quic = ctr_get(&c->sniff_quic);
	out->sniff_no_name = ctr_get(&c->sniff_no_name);
	out->sniff_timeouts = ctr_get(&c->sniff_timeouts);
	out->sniff_route_changed = ctr_get(&c->sniff_route_changed);
	out->sniff_overridden = ctr_get(&c->sniff_overridden);
	out->sniff_active = ctr_get(&c->sniff_active);
	out->sniff_skipped_no_memory = ctr_get(&c->sniff_skipped_no_memory);
	out->sniff_skipped_busy = ctr_get(&c->sniff_skipped_busy);
	out->sniff_skipped_other_flow = ctr_get(&c->sniff_skipped_other_flow);
	out->fast_flows = ctr_get(&c->fast_flows);
	out->fast_added = ctr_get(&c->fast_added);
	out->fast_refused = ctr_get(&c->fast_refused);
	out->fast_kept = ctr_get(&c->fast_kept);
	out->expiry_spare_used = ctr_get(&c->expiry_spare_used);
	out->expiry_unarmed = ctr_get(&c->expiry_unarmed);
	for (int i = 0; i < UDP_DROP_MAX; i++)
		out->drops[i] = ctr_get(&c->drops[i]);
	out->queue_drops = out->drops[UDP_DROP_queue_full];
}

void udp_path_set_sendto(struct udp_path *up, udp_sendto_fn fn, void *arg)
{
	up->sendto_fn = fn;
	up->sendto_arg = arg;
}

void udp_path_set_sendgso(struct udp_path *up, udp_sendgso_fn fn, void *arg)
{
	up->sendgso_fn = fn;
	up->sendgso_arg = arg;
}

void udp_path_offload_reset(struct udp_path *up)
{
	for (size_t i = 0; up->off && i < up->nbuckets; i++)
		for (struct udp_session *s = up->buckets[i]; s; s = s->hnext)
			if (s->fast) {
				fast_leave(up, s, NULL);
				memset(s->fast, 0, UDP_FAST_MAX * sizeof(*s->fast));
			}
}

void udp_path_set_offload(struct udp_path *up, const struct udp_offload *ops, void *arg)
{
	/* The offload going (or another coming) takes every flow out of it first: they go on
	 * here, and may join the new one. */
	udp_path_offload_reset(up);
	up->off = ops;
	up->off_arg = arg;
}

void udp_path_set_loopguard(struct udp_path *up, struct loopguard *lg)
{
	up->loopguard = lg;
}

void udp_path_set_log(struct udp_path *up, struct log *lg)
{
	up->log = lg;
}

void udp_path_set_name_pins(struct udp_path *up, udp_pin_fn pin, udp_pin_fn unpin)
{
	up->pin = pin;
	up->unpin = unpin;
}

void udp_path_set_namer(struct udp_path *up, udp_namer_fn fn, void *arg)
{
	up->namer = fn;
	up->namer_arg = arg;
	udp_name_work_update(up);
}

void udp_path_set_dns_timeout(struct udp_path *up, uint32_t ms)
{
	up->dns_timeout_ns = (int64_t)ms * TS_NS_PER_MS;
	set_timeouts(up, cfg_gens_current(&up->gens));
	rearm(up);
}
