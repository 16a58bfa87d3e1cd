/* resolver.c — host names resolved by c-ares on a libevent base (resolver.h): c-ares's sockets
 * made by outbound_socket and watched by libevent events, its timeouts on one timer; the cache
 * (hash chains plus an LRU list, one entry per name); resolutions shared by concurrent lookups;
 * results delivered from per-query events so that no callback runs inside c-ares or inside
 * resolver_lookup.
 */
#include "outbound/resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/loopguard.h"
#include "outbound/outbound.h"

#define NAME_MAX_LEN 253
#define PER_FAMILY (RESOLVER_MAX_ADDRS / 2)

/* One cached name: its addresses (already interleaved) or a negative answer. */
struct rentry {
	struct rentry *hnext;          /* hash chain */
	struct rentry *prev, *next;    /* LRU list, most recent first */
	int64_t expires_ms;
	int err;                       /* 0 or -ENXIO */
	uint8_t n;
	struct netaddr addrs[RESOLVER_MAX_ADDRS];
	char name[NAME_MAX_LEN + 1];
};

struct rpend;

/* One family's query of a resolution. */
struct rfam {
	struct rpend *p;
	int family;
	bool done;
	int status;                    /* ARES_* */
	int ttl;                       /* smallest TTL of the answers */
	uint8_t n;
	struct netaddr addrs[PER_FAMILY];
};

/* A resolution in progress: A and AAAA queries, the lookups waiting for it. */
struct rpend {
	struct resolver *r;
	struct rpend *prev, *next;
	struct resolver_query *waiters;
	struct rfam fam[2];            /* [0] AAAA, [1] A */
	char name[NAME_MAX_LEN + 1];
};

struct resolver_query {
	struct resolver *r;
	struct rpend *pend;            /* waiting for it; NULL once the result is in */
	struct resolver_query *prev, *next;  /* in pend->waiters or r->ready */
	struct event *ev;              /* delivers the result from the loop */
	int family_pref;
	resolver_fn done;
	void *arg;
	int err;
	uint8_t n;
	struct netaddr addrs[RESOLVER_MAX_ADDRS];
};

/* One socket c-ares asked us to watch. */
struct rsock {
	struct rsock *next;
	struct resolver *r;
	int fd;
	struct event *ev;
};

struct resolver {
	struct event_base *base;
	ares_channel ch;
	struct ts_outbound sock_ob;
	bool use_hosts;
	bool freeing;
	bool untimed;                  /* cancelling every query: its timer could not be armed */
	struct event *timer;
	struct rsock *socks;
	struct rpend *pending;
	struct resolver_query *ready;  /* results waiting for their event */
	struct rentry **buckets;
	size_t nbuckets, nentries, max_names;
	struct rentry *lru_head, *lru_tail;
	int64_t max_ttl_ms, neg_ttl_ms;
	int64_t (*now_ms)(void *arg);
	void *now_arg;
	struct resolver_stats st;
};

static int64_t mono_ms(void *arg)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the cache ---- */

static size_t name_hash(const struct resolver *r, const char *name)
{
	uint64_t h = 1469598103934665603ULL;  /* FNV-1a */

	for (; *name; name++)
		h = (h ^ (uint8_t)*name) * 1099511628211ULL;
	return (size_t)(h & (r->nbuckets - 1));
}

static void lru_unlink(struct resolver *r, struct rentry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		r->lru_head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		r->lru_tail = e->prev;
	e->prev = e->next = NULL;
}

static void lru_push(struct resolver *r, struct rentry *e)
{
	e->prev = NULL;
	e->next = r->lru_head;
	if (r->lru_head)
		r->lru_head->prev = e;
	r->lru_head = e;
	if (!r->lru_tail)
		r->lru_tail = e;
}

static void cache_remove(struct resolver *r, struct rentry *e)
{
	struct rentry **pp = &r->buckets[name_hash(r, e->name)];

	while (*pp != e)
		pp = &(*pp)->hnext;
	*pp = e->hnext;
	lru_unlink(r, e);
	r->nentries--;
	free(e);
}

/* The live entry for name, NULL if none (an expired one is removed on the way). */
static struct rentry *cache_get(struct resolver *r, const char *name)
{
	struct rentry *e = r->buckets[name_hash(r, name)];

	while (e && strcmp(e->name, name) != 0)
		e = e->hnext;
	if (!e)
		return NULL;
	if (r->now_ms(r->now_arg) >= e->expires_ms) {
		cache_remove(r, e);
		return NULL;
	}
	lru_unlink(r, e);
	lru_push(r, e);
	return e;
}

/* Store a result for ttl_ms (replacing any entry of the name); out of memory only skips it. */
static void cache_put(struct resolver *r, const char *name, int err, const struct netaddr *addrs,
		      uint8_t n, int64_t ttl_ms)
{
	struct rentry *e = r->buckets[name_hash(r, name)];
	size_t h;

	while (e && strcmp(e->name, name) != 0)
		e = e->hnext;
	if (e)
		cache_remove(r, e);
	if (ttl_ms <= 0)
		return;
	if (r->nentries >= r->max_names && r->lru_tail) {
		cache_remove(r, r->lru_tail);
		r->st.evictions++;
	}
	if (!(e = calloc(1, sizeof(*e))))
		return;
	strcpy(e->name, name);
	e->err = err;
	e->n = n;
	if (n)
		memcpy(e->addrs, addrs, n * sizeof(*addrs));
	e->expires_ms = r->now_ms(r->now_arg) + ttl_ms;
	h = name_hash(r, name);
	e->hnext = r->buckets[h];
	r->buckets[h] = e;
	lru_push(r, e);
	r->nentries++;
}

/* ---- delivering results ---- */

/* Copy the addresses of the preferred families into q and schedule its done. */
static void query_ready(struct resolver_query *q, int err, const struct netaddr *addrs, size_t n)
{
	struct resolver *r = q->r;

	q->n = 0;
	for (size_t i = 0; i < n && err == 0; i++)
		if (q->family_pref == 0 || addrs[i].family == q->family_pref)
			q->addrs[q->n++] = addrs[i];
	q->err = err != 0 ? err : q->n ? 0 : -ENXIO;
	q->pend = NULL;
	q->prev = NULL;
	q->next = r->ready;
	if (r->ready)
		r->ready->prev = q;
	r->ready = q;
	/* Active, not pending: it runs in the loop's next pass. */
	event_active(q->ev, EV_TIMEOUT, 1);
}

/* Take q out of the list it is in (a resolution's waiters or the ready list). */
static void query_unlink(struct resolver_query *q)
{
	struct resolver_query **head = q->pend ? &q->pend->waiters : &q->r->ready;

	if (q->prev)
		q->prev->next = q->next;
	else
		*head = q->next;
	if (q->next)
		q->next->prev = q->prev;
	q->prev = q->next = NULL;
}

static void query_free(struct resolver_query *q)
{
	query_unlink(q);
	event_free(q->ev);
	free(q);
}

static void on_deliver(evutil_socket_t fd, short what, void *arg)
{
	struct resolver_query *q = arg;
	struct netaddr addrs[RESOLVER_MAX_ADDRS];
	resolver_fn done = q->done;
	void *darg = q->arg;
	int err = q->err;
	size_t n = q->n;

	/* Free first: done may free the resolver itself. */
	memcpy(addrs, q->addrs, n * sizeof(addrs[0]));
	query_free(q);
	done(darg, err, err == 0 ? addrs : NULL, n);
}

/* ---- resolutions ---- */

/* RFC 8305 section 4: IPv6 first, then alternate families (First Address Family Count 1). */
static size_t interleave(const struct netaddr *v6, size_t n6, const struct netaddr *v4, size_t n4,
			 struct netaddr out[RESOLVER_MAX_ADDRS])
{
	size_t n = 0;

	for (size_t i = 0; i < PER_FAMILY; i++) {
		if (i < n6)
			out[n++] = v6[i];
		if (i < n4)
			out[n++] = v4[i];
	}
	return n;
}

/* Both families answered: combine, cache, wake the waiters, free p. */
static void pend_finish(struct rpend *p)
{
	struct resolver *r = p->r;
	struct netaddr addrs[RESOLVER_MAX_ADDRS];
	int64_t ttl_ms = r->max_ttl_ms;
	bool temp = false, timeout = false, nomem = false;
	size_t n = 0, i;
	int err = 0;

	for (i = 0; i < 2; i++) {
		struct rfam *f = &p->fam[i];

		if (f->n && (int64_t)f->ttl * 1000 < ttl_ms)
			ttl_ms = (int64_t)f->ttl * 1000;
		if (f->status == ARES_ETIMEOUT)
			timeout = true;
		else if ((f->status == ARES_ECANCELLED && r->untimed) || f->status == ARES_ENOMEM)
			nomem = true;  /* no fault of the server's */
		else if (f->status != ARES_SUCCESS && f->status != ARES_ENODATA &&
			 f->status != ARES_ENOTFOUND)
			temp = true;
	}
	n = interleave(p->fam[0].addrs, p->fam[0].n, p->fam[1].addrs, p->fam[1].n, addrs);
	if (n) {
		/* One family failed temporarily: keep the half answer only briefly. */
		if ((temp || timeout || nomem) && ttl_ms > r->neg_ttl_ms)
			ttl_ms = r->neg_ttl_ms;
		cache_put(r, p->name, 0, addrs, (uint8_t)n, ttl_ms);
	} else if (nomem) {
		err = -ENOMEM;
		r->st.failures++;
	} else if (timeout) {
		err = -ETIMEDOUT;
		r->st.timeouts++;
	} else if (temp) {
		err = -EAGAIN;
		r->st.failures++;
	} else {
		err = -ENXIO;
		r->st.nxdomain++;
		cache_put(r, p->name, err, NULL, 0, r->neg_ttl_ms);
	}
	while (p->waiters) {
		struct resolver_query *q = p->waiters;

		query_unlink(q);
		query_ready(q, err, addrs, n);
	}
	if (p->prev)
		p->prev->next = p->next;
	else
		r->pending = p->next;
	if (p->next)
		p->next->prev = p->prev;
	free(p);
}

static void parse_answer(struct rfam *f, const unsigned char *abuf, int alen)
{
	int i, n = PER_FAMILY;

	f->ttl = INT32_MAX;
	if (f->family == 4) {
		struct ares_addrttl t[PER_FAMILY];

		if ((f->status = ares_parse_a_reply(abuf, alen, NULL, t, &n)) != ARES_SUCCESS)
			return;
		for (i = 0; i < n; i++) {
			f->addrs[f->n].family = 4;
			memcpy(f->addrs[f->n++].a, &t[i].ipaddr, 4);
			if (t[i].ttl < f->ttl)
				f->ttl = t[i].ttl < 0 ? 0 : t[i].ttl;
		}
	} else {
		struct ares_addr6ttl t[PER_FAMILY];

		if ((f->status = ares_parse_aaaa_reply(abuf, alen, NULL, t, &n)) != ARES_SUCCESS)
			return;
		for (i = 0; i < n; i++) {
			f->addrs[f->n].family = 6;
			memcpy(f->addrs[f->n++].a, &t[i].ip6addr, 16);
			if (t[i].ttl < f->ttl)
				f->ttl = t[i].ttl < 0 ? 0 : t[i].ttl;
		}
	}
	if (f->n == 0)
		f->status = ARES_ENODATA;
}

/* c-ares's callback for one family's query (runs inside ares_process_fd or ares_destroy). */
static void on_answer(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
	struct rfam *f = arg, *other;
	struct rpend *p = f->p;

	f->done = true;
	f->status = status;
	if (status == ARES_SUCCESS)
		parse_answer(f, abuf, alen);
	other = &p->fam[f == &p->fam[0] ? 1 : 0];
	if (!other->done)
		return;
	if (p->r->freeing) {
		free(p);  /* resolver_free already dropped its waiters and the list */
		return;
	}
	pend_finish(p);
}

/* ---- c-ares's sockets and timer on libevent ---- */

/* c-ares's next timeout on the timer. One that cannot be armed (libevent out of memory) would
 * leave every query on a silent server waiting for good: c-ares gives up each query under way
 * instead, and their waiters get -ENOMEM (from the loop: results are delivered by events). */
static void reschedule(struct resolver *r)
{
	struct timeval tv, *tvp;

	if (r->freeing)
		return;
	tvp = ares_timeout(r->ch, NULL, &tv);
	if (!tvp) {
		evtimer_del(r->timer);
	} else if (evtimer_add(r->timer, tvp) != 0) {
		r->untimed = true;
		ares_cancel(r->ch);
		r->untimed = false;
	}
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct resolver *r = arg;

	ares_process_fd(r->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
	reschedule(r);
}

static void on_sock(evutil_socket_t fd, short what, void *arg)
{
	struct rsock *s = arg;
	struct resolver *r = s->r;  /* s may be freed inside ares_process_fd */

	ares_process_fd(r->ch, (what & EV_READ) ? fd : ARES_SOCKET_BAD,
			(what & EV_WRITE) ? fd : ARES_SOCKET_BAD);
	reschedule(r);
}

/* c-ares says which sockets to watch for what; none: the socket is about to be closed. */
static void on_sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
	struct resolver *r = data;
	struct rsock **pp = &r->socks, *s;
	short flags = (short)((readable ? EV_READ : 0) | (writable ? EV_WRITE : 0));

	while (*pp && (*pp)->fd != fd)
		pp = &(*pp)->next;
	s = *pp;
	if (!flags) {
		if (s) {
			*pp = s->next;
			event_free(s->ev);
			free(s);
		}
		return;
	}
	if (!s) {
		if (!(s = calloc(1, sizeof(*s))))
			return;  /* c-ares times the query out */
		s->r = r;
		s->fd = fd;
		if (!(s->ev = event_new(r->base, fd, flags | EV_PERSIST, on_sock, s))) {
			free(s);
			return;
		}
		s->next = r->socks;
		r->socks = s;
	} else {
		event_del(s->ev);
		event_assign(s->ev, r->base, fd, flags | EV_PERSIST, on_sock, s);
	}
	/* Not watched (no memory): c-ares times the query out, on its timer or, if that cannot be
	 * armed either, by giving it up (reschedule). */
	(void)event_add(s->ev, NULL);
}

static ares_socket_t sk_socket(int domain, int type, int protocol, void *u)
{
	struct resolver *r = u;
	int fd = -1, ret;

	ret = outbound_socket(&r->sock_ob, domain == AF_INET6 ? 6 : 4, type, &fd);
	if (ret != 0) {
		r->st.socket_errors++;
		errno = -ret;
		return ARES_SOCKET_BAD;
	}
	r->st.sockets++;
	return fd;
}

static int sk_connect(ares_socket_t fd, const struct sockaddr *sa, ares_socklen_t len, void *u)
{
	struct resolver *r = u;
	int ret, type = 0, saved;
	socklen_t tl = sizeof(type);

	ret = connect(fd, sa, len);
	saved = errno;
	/* A stream socket goes on record once connect() gave it its addresses (outbound.h). */
	if ((ret == 0 || errno == EINPROGRESS) && r->sock_ob.loopguard &&
	    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM &&
	    loopguard_connected(r->sock_ob.loopguard, fd, sa->sa_family == AF_INET6 ? 6 : 4) < 0) {
		/* the socket still works, only unguarded */
	}
	errno = saved;
	return ret;
}

static int sk_close(ares_socket_t fd, void *u)
{
	return close(fd);
}

static ares_ssize_t sk_recvfrom(ares_socket_t fd, void *buf, size_t len, int flags,
				struct sockaddr *from, ares_socklen_t *fromlen, void *u)
{
	return recvfrom(fd, buf, len, flags, from, fromlen);
}

static ares_ssize_t sk_sendv(ares_socket_t fd, const struct iovec *iov, int n, void *u)
{
	struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };

	return sendmsg(fd, &m, MSG_NOSIGNAL);
}

static const struct ares_socket_functions sock_funcs = {
	.asocket = sk_socket,
	.aclose = sk_close,
	.aconnect = sk_connect,
	.arecvfrom = sk_recvfrom,
	.asendv = sk_sendv,
};

/* ---- the API ---- */

static int init_channel(struct resolver *r, const struct resolver_config *cfg)
{
	struct ares_options o;
	int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES, rc;

	memset(&o, 0, sizeof(o));
	o.sock_state_cb = on_sock_state;
	o.sock_state_cb_data = r;
	o.timeout = (int)(cfg->timeout_ms ? cfg->timeout_ms : 2000);
	o.tries = (int)(cfg->tries ? cfg->tries : 2);
	if (cfg->servers) {
		mask |= ARES_OPT_DOMAINS;  /* none: the name is asked as given */
		o.ndomains = 0;
	}
	rc = ares_init_options(&r->ch, &o, mask);
	if (rc != ARES_SUCCESS)
		return rc == ARES_ENOMEM ? -ENOMEM : -EIO;
	ares_set_socket_functions(r->ch, &sock_funcs, r);
	if (cfg->servers && (rc = ares_set_servers_ports_csv(r->ch, cfg->servers)) != ARES_SUCCESS)
		return rc == ARES_ENOMEM ? -ENOMEM : -EINVAL;
	return 0;
}

int resolver_new(struct event_base *base, const struct resolver_config *cfg,
		 struct resolver **out)
{
	struct resolver *r;
	size_t nb = 16;
	int ret = -ENOMEM;

	if (!base || !cfg || !out)
		return -EINVAL;
	if (!(r = calloc(1, sizeof(*r))))
		return -ENOMEM;
	r->base = base;
	if (cfg->sock)
		r->sock_ob = *cfg->sock;
	r->use_hosts = !cfg->servers;
	r->max_names = cfg->max_names ? cfg->max_names : 1024;
	r->max_ttl_ms = (int64_t)(cfg->max_ttl_s ? cfg->max_ttl_s : 3600) * 1000;
	r->neg_ttl_ms = (int64_t)(cfg->neg_ttl_s ? cfg->neg_ttl_s : 10) * 1000;
	r->now_ms = cfg->now_ms ? cfg->now_ms : mono_ms;
	r->now_arg = cfg->now_arg;
	while (nb < r->max_names && nb < ((size_t)1 << 20))
		nb <<= 1;
	r->nbuckets = nb;
	if (!(r->buckets = calloc(nb, sizeof(*r->buckets))) ||
	    !(r->timer = evtimer_new(base, on_timer, r)))
		goto fail;
	if ((ret = init_channel(r, cfg)) != 0)
		goto fail;
	*out = r;
	return 0;
fail:
	resolver_free(r);
	return ret;
}

/* name lowercased, without a final dot, into key; false if empty or too long. */
static bool name_key(const char *name, char key[NAME_MAX_LEN + 1])
{
	size_t len = strlen(name);

	if (len && name[len - 1] == '.')
		len--;
	if (len == 0 || len > NAME_MAX_LEN)
		return false;
	for (size_t i = 0; i < len; i++)
		key[i] = (char)tolower((unsigned char)name[i]);
	key[len] = '\0';
	return true;
}

/* /etc/hosts (system configuration only): true and the result delivered if it knows name. */
static bool try_hosts(struct resolver_query *q, const char *name)
{
	struct netaddr fam[2][PER_FAMILY], addrs[RESOLVER_MAX_ADDRS];
	static const int afs[2] = { AF_INET6, AF_INET };
	size_t n[2] = { 0, 0 }, total;

	for (int i = 0; i < 2; i++) {
		struct hostent *h = NULL;

		if (ares_gethostbyname_file(q->r->ch, name, afs[i], &h) != ARES_SUCCESS)
			continue;
		for (char **a = h->h_addr_list; *a && n[i] < PER_FAMILY; a++) {
			fam[i][n[i]].family = afs[i] == AF_INET6 ? 6 : 4;
			memcpy(fam[i][n[i]++].a, *a, afs[i] == AF_INET6 ? 16 : 4);
		}
		ares_free_hostent(h);
	}
	total = interleave(fam[0], n[0], fam[1], n[1], addrs);
	if (total == 0)
		return false;
	q->r->st.hosts_hits++;
	query_ready(q, 0, addrs, total);
	return true;
}

/* Start the A and AAAA queries for name with q as the first waiter. */
static int start_resolution(struct resolver *r, struct resolver_query *q, const char *key)
{
	struct rpend *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->r = r;
	strcpy(p->name, key);
	p->fam[0] = (struct rfam){ .p = p, .family = 6 };
	p->fam[1] = (struct rfam){ .p = p, .family = 4 };
	q->pend = p;
	p->waiters = q;
	p->next = r->pending;
	if (r->pending)
		r->pending->prev = p;
	r->pending = p;
	r->st.queries += 2;
	/* Either may answer at once (an unusable server list): p lives until both did. */
	ares_search(r->ch, key, C_IN, T_AAAA, on_answer, &p->fam[0]);
	ares_search(r->ch, key, C_IN, T_A, on_answer, &p->fam[1]);
	reschedule(r);
	return 0;
}

int resolver_lookup(struct resolver *r, const char *name, int family_pref, resolver_fn done,
		    void *arg, struct resolver_query **out)
{
	char key[NAME_MAX_LEN + 1];
	struct resolver_query *q;
	struct netaddr lit;
	struct rentry *e;
	struct rpend *p;
	int ret;

	if (!r || !name || !done || !out || (family_pref != 0 && family_pref != 4 &&
					     family_pref != 6) || !name_key(name, key))
		return -EINVAL;
	if (!(q = calloc(1, sizeof(*q))))
		return -ENOMEM;
	q->r = r;
	q->family_pref = family_pref;
	q->done = done;
	q->arg = arg;
	if (!(q->ev = event_new(r->base, -1, 0, on_deliver, q))) {
		free(q);
		return -ENOMEM;
	}
	r->st.lookups++;
	*out = q;  /* taken back below if the lookup cannot start */
	if (netaddr_parse(key, &lit) == 0) {
		query_ready(q, 0, &lit, 1);
		return 0;
	}
	if ((e = cache_get(r, key))) {
		if (e->err)
			r->st.cache_neg_hits++;
		else
			r->st.cache_hits++;
		query_ready(q, e->err, e->addrs, e->n);
		return 0;
	}
	if (r->use_hosts && try_hosts(q, key))
		return 0;
	for (p = r->pending; p && strcmp(p->name, key) != 0; p = p->next)
		;
	if (p) {
		r->st.coalesced++;
		q->pend = p;
		q->next = p->waiters;
		if (p->waiters) /* none when every waiter was cancelled: it goes on for the cache */
			p->waiters->prev = q;
		p->waiters = q;
		return 0;
	}
	if ((ret = start_resolution(r, q, key)) != 0) {
		*out = NULL;
		event_free(q->ev);
		free(q);
		return ret;
	}
	return 0;
}

void resolver_cancel(struct resolver_query *q)
{
	if (q)
		query_free(q);
}

void resolver_free(struct resolver *r)
{
	struct rpend *p;

	if (!r)
		return;
	r->freeing = true;
	while (r->ready)
		query_free(r->ready);
	for (p = r->pending; p; p = p->next)
		while (p->waiters)
			query_free(p->waiters);
	r->pending = NULL;  /* each freed by its last on_answer, from ares_destroy */
	if (r->ch)
		ares_destroy(r->ch);
	while (r->socks) {
		struct rsock *s = r->socks;

		r->socks = s->next;
		event_free(s->ev);
		free(s);
	}
	while (r->lru_head)
		cache_remove(r, r->lru_head);
	if (r->timer)
		event_free(r->timer);
	free(r->buckets);
	free(r);
}

void resolver_get_stats(const struct resolver *r, struct resolver_stats *out)
{
	*out = r->st;
}
