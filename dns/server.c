/* server.c — the proxy's own DNS resolver front (dns/server.h): hosts, rules, the AAAA
 * policy, the cache, coalescing of identical questions, and the upstreams.
 *
 * A client query that must wait is a ticket (its bytes copied, so the reply can be rebuilt for
 * it); tickets asking the same question of the same server wait on one flight, which holds the
 * one upstream ask. When the ask ends, every ticket of the flight gets its reply built from the
 * one answer (its own id, question bytes and size limit), then the flight goes.
 */
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/config_dns.h"
#include "core/counter.h"
#include "core/dns_msg.h"
#include "core/domain_set.h"
#include "core/log.h"
#include "dns/cache.h"
#include "dns/doh.h"
#include "dns/fakeip.h"
#include "dns/server.h"
#include "dns/upstream.h"

#define HOSTS_TTL 10           /* seconds: static answers are cheap to ask again */
#define SYNTH_TTL 10           /* empty and refused answers made here */
#define NEG_TTL_MAX 300         /* RFC 2308 section 5's advice for negative answers */
#define CACHE_ANSWER_MAX 4096  /* bytes of an answer the cache keeps */
#define UPSTREAM_TRY_MS 2000   /* per try; two tries */
#define OUT_CAP 65535
#define FAKE_LINE_MAX 300     /* "ADDRESS NAME\n" in dns.fakeip.persist */
#define FAKE_TTL 1             /* seconds: apps ask again soon, and the mapping stays fresh */
#define FAKE_SAVE_S 60         /* the mappings written to dns.fakeip.persist this often when
				* they changed */

/* Names that always get real answers under fake-IP: local names, time servers, captive-portal
 * probes (an OS that sees a fake address there thinks it is behind a portal). */
static const char *const fake_exclude_builtin[] = {
	"local", "lan", "localhost", "home.arpa", "internal",
	"ntp.org", "time.windows.com", "time.apple.com", "time.google.com", "time.cloudflare.com",
	"time.nist.gov", "captive.apple.com", "connectivitycheck.gstatic.com",
	"connectivitycheck.android.com", "clients3.google.com", "detectportal.firefox.com",
	"msftconnecttest.com", "msftncsi.com", "nmcheck.gnome.org", "network-test.debian.org",
	NULL,
};

struct flight;

struct dns_ticket {
	struct dns_server *s;
	struct flight *f;
	struct dns_ticket *next, *prev;   /* the flight's waiters */
	dns_reply_fn fn;
	void *arg;
	size_t limit;
	struct dns_query q;
	size_t len;
	uint8_t msg[];
};

struct flight {
	struct dns_server *s;
	uint32_t server;
	struct dns_question q;
	struct dns_uq *uq;                /* the ask (udp, tcp, tls): NULL once it ended */
	struct dns_doh_q *dq;             /* the ask (https): NULL once it ended */
	struct dns_ticket *waiters;
	struct flight *next, *prev;
};

struct dns_server {
	struct event_base *base;
	const struct ts_config *cfg;
	struct budget *b;                 /* tickets and flights are drawn from it */
	struct dns_upstream **ups;        /* one per dns.servers entry (NULL for https) */
	struct dns_doh **dohs;            /* one per https:// entry, else NULL */
	size_t n_ups;
	struct dns_cache *cache;          /* NULL: dns.cache.size 0 */
	struct fakeip *fake;              /* NULL: no dns.fakeip */
	struct domain_set *fake_builtin;  /* fake_exclude_builtin */
	struct event *save_ev;            /* dns.fakeip.persist */
	uint64_t saved_changes;           /* created + reused at the last save */
	/* The periodic save's writer: a thread that writes a snapshot of the mappings, so that
	 * a slow disk's fsync never stalls the loop. At most one at a time. */
	struct fake_writer {
		pthread_t th;
		bool started;             /* a thread to join */
		atomic_bool busy;         /* it is still writing */
		int result;               /* 0 or -errno: read after busy went false */
		uint64_t changes;         /* created + reused in its snapshot */
		char *path;               /* its copy of dns.fakeip.persist */
		struct save_buf {
			char *p;
			size_t len, cap;
		} buf;                    /* its snapshot */
	} writer;
	struct log *log;
	struct flight *flights;
	size_t pending;
	struct {
		ctr_t queries, queries_tcp;
		ctr_t hosts, fake, cache, upstream, refused, empty, servfail;
		ctr_t malformed, busy, nomem, gone, coalesced;
	} ctr;
	uint8_t out[OUT_CAP];
};

/* ---- replies made here -------------------------------------------------------------------- */

static void reply_synth(struct dns_server *s, const struct dns_query *q, const uint8_t *m,
			size_t limit, enum dns_rcode rcode, int family, const uint8_t (*addrs)[16],
			size_t n, uint32_t ttl, dns_reply_fn fn, void *arg)
{
	int len = dns_build_synth(s->out, sizeof(s->out), limit, q, m, rcode, family, addrs, n,
				  ttl);

	fn(arg, s->out, len > 0 ? (size_t)len : 0);
}

static void reply_hosts(struct dns_server *s, const struct ts_dns_host *h,
			const struct dns_query *q, const uint8_t *m, size_t limit,
			dns_reply_fn fn, void *arg)
{
	uint8_t addrs[TS_DNS_HOST_ADDRS][16];
	size_t n = 0;
	int family = 0;

	if (q->q.qtype == DNS_T_A) {
		family = 4;
		for (n = 0; n < h->n4; n++)
			memcpy(addrs[n], h->a4[n], 4);
	} else if (q->q.qtype == DNS_T_AAAA) {
		family = 6;
		for (n = 0; n < h->n6; n++)
			memcpy(addrs[n], h->a6[n], 16);
	}
	ctr_inc(&s->ctr.hosts);
	reply_synth(s, q, m, limit, DNS_R_NOERROR, family, (const uint8_t (*)[16])addrs, n,
		    HOSTS_TTL, fn, arg);
}

/* A query that cannot be answered normally: dropped (fn gets nothing) or a header error. */
static void reply_bad(struct dns_server *s, int err, const uint8_t *m, size_t len,
		      dns_reply_fn fn, void *arg)
{
	int n = -1;

	if (err == DNS_E_OPCODE)
		n = dns_build_header_error(s->out, sizeof(s->out), m, len, DNS_R_NOTIMP);
	else if (err == DNS_E_QDCOUNT)
		n = dns_build_header_error(s->out, sizeof(s->out), m, len, DNS_R_FORMERR);
	if (n > 0) {
		ctr_inc(&s->ctr.refused);
		fn(arg, s->out, (size_t)n);
		return;
	}
	ctr_inc(&s->ctr.malformed);
	fn(arg, NULL, 0);
}

/* ---- flights ------------------------------------------------------------------------------ */

/* The flight's ask, if still running, abandoned (its callback will not come). */
static void ask_cancel(struct dns_server *s, struct flight *f)
{
	if (f->uq)
		dns_upstream_cancel(s->ups[f->server], f->uq);
	if (f->dq)
		dns_doh_cancel(s->dohs[f->server], f->dq);
	f->uq = NULL;
	f->dq = NULL;
}

static void waiter_unlink(struct flight *f, struct dns_ticket *t)
{
	if (t->prev)
		t->prev->next = t->next;
	else
		f->waiters = t->next;
	if (t->next)
		t->next->prev = t->prev;
	t->next = t->prev = NULL;
	t->f = NULL;
}

static void flight_unlink(struct dns_server *s, struct flight *f)
{
	if (f->prev)
		f->prev->next = f->next;
	else
		s->flights = f->next;
	if (f->next)
		f->next->prev = f->prev;
	f->next = f->prev = NULL;
}

static void ticket_done(struct dns_server *s, struct dns_ticket *t)
{
	s->pending--;
	budget_mfree(s->b, t);
}

/* The ask ended: err 0 with the answer, else SERVFAIL for everyone waiting. */
static void up_done(void *arg, int err, const uint8_t *msg, size_t len,
		    const struct dns_answer *a)
{
	struct flight *f = arg;
	struct dns_server *s = f->s;
	struct dns_ticket *t;

	f->uq = NULL;
	f->dq = NULL;
	flight_unlink(s, f);
	/* Larger answers (rare: over TCP) are not kept: the cache's bytes stay bounded by its
	 * entries times CACHE_ANSWER_MAX. */
	if (err == 0 && s->cache && len <= CACHE_ANSWER_MAX)
		(void)dns_cache_put(s->cache, f->server, msg, len, a, ts_now_ns());
	/* One at a time from the head: a reply callback may cancel another waiter. */
	while ((t = f->waiters)) {
		int n = -1;
		waiter_unlink(f, t);
		if (err == 0)
			n = dns_build_from_answer(s->out, sizeof(s->out), t->limit, &t->q, t->msg, msg,
						  a, 0);
		if (n > 0) {
			ctr_inc(&s->ctr.upstream);
			t->fn(t->arg, s->out, (size_t)n);
		} else {
			ctr_inc(&s->ctr.servfail);
			reply_synth(s, &t->q, t->msg, t->limit, DNS_R_SERVFAIL, 0, NULL, 0, 0, t->fn,
				    t->arg);
		}
		ticket_done(s, t);
	}
	budget_mfree(s->b, f);
}

static struct flight *flight_find(struct dns_server *s, uint32_t server,
				  const struct dns_question *q)
{
	for (struct flight *f = s->flights; f; f = f->next)
		if (f->server == server && f->q.qtype == q->qtype &&
		    f->q.name_len == q->name_len && dns_question_equal(&f->q, q))
			return f;
	return NULL;
}

static int flight_new(struct dns_server *s, uint32_t server, const struct dns_question *q,
		      struct flight **out)
{
	struct flight *f = budget_calloc(s->b, 1, sizeof(*f));
	int ret;

	if (!f)
		return -ENOBUFS;
	f->s = s;
	f->server = server;
	f->q = *q;
	ret = s->dohs[server] ? dns_doh_ask(s->dohs[server], q, up_done, f, &f->dq)
			      : dns_upstream_ask(s->ups[server], q, up_done, f, &f->uq);
	if (ret != 0) {
		budget_mfree(s->b, f);
		return ret;
	}
	f->next = s->flights;
	if (s->flights)
		s->flights->prev = f;
	s->flights = f;
	*out = f;
	return 0;
}

/* Wait for server's answer to q: join a flight or start one. */
static int wait_upstream(struct dns_server *s, uint32_t server, const struct dns_query *q,
			 const uint8_t *m, size_t len, size_t limit, dns_reply_fn fn, void *arg,
			 struct dns_ticket **ticket)
{
	struct flight *f = flight_find(s, server, &q->q);
	struct dns_ticket *t;
	int ret;

	if (s->pending >= DNS_SERVER_MAX_PENDING) {
		ctr_inc(&s->ctr.busy);
		return -ENOBUFS;
	}
	if (!(t = budget_malloc(s->b, sizeof(*t) + len))) {
		ctr_inc(&s->ctr.busy);
		return -ENOBUFS;
	}
	if (f) {
		ctr_inc(&s->ctr.coalesced);
	} else if ((ret = flight_new(s, server, &q->q, &f)) != 0) {
		/* -ENOBUFS: the budget or the upstream's bound of asks; -ENOMEM: the heap (the
		 * question is nameable and the upstream alive, so nothing else can fail). */
		assert(ret == -ENOBUFS || ret == -ENOMEM);
		budget_mfree(s->b, t);
		ctr_inc(ret == -ENOBUFS ? &s->ctr.busy : &s->ctr.nomem);
		return ret;
	}
	*t = (struct dns_ticket){ .s = s, .f = f, .fn = fn, .arg = arg, .limit = limit, .q = *q,
				  .len = len };
	memcpy(t->msg, m, len);
	t->next = f->waiters;
	if (f->waiters)
		f->waiters->prev = t;
	f->waiters = t;
	s->pending++;
	*ticket = t;
	return 0;
}

void dns_server_cancel(struct dns_server *s, struct dns_ticket *t)
{
	struct flight *f;

	if (!t)
		return;
	f = t->f;
	if (f) {
		waiter_unlink(f, t);
		/* Nobody waits any more: the ask goes too (not while its answer is delivered). */
		if (!f->waiters && (f->uq || f->dq)) {
			ask_cancel(s, f);
			flight_unlink(s, f);
			budget_mfree(s->b, f);
		}
	}
	/* Its client went away before the answer: the query's outcome (it was pending). */
	ctr_inc(&s->ctr.gone);
	ticket_done(s, t);
}

/* ---- the pipeline ------------------------------------------------------------------------- */

/* dns.rules: the first rule whose names hold the question's name. NULL: none. */
static const struct ts_dns_rule *rule_for(const struct ts_config *cfg,
					  const struct dns_question *q)
{
	const struct ts_dns *d = &cfg->dns;

	if (!q->nameable)
		return NULL;
	for (size_t i = 0; i < d->n_rules; i++)
		if (config_names_match(cfg->rule_sets, &d->rules[i].names, q->name, q->name_len))
			return &d->rules[i];
	return NULL;
}

/* ---- fake-IP ------------------------------------------------------------------------------ */

static bool fake_excluded(const struct dns_server *s, const struct dns_question *q)
{
	return domain_set_match(s->fake_builtin, q->name, q->name_len) ||
	       config_names_match(s->cfg->rule_sets, &s->cfg->dns.fakeip.exclude, q->name,
				  q->name_len);
}

/* A/AAAA of a name no rule sent elsewhere: a fake address (AAAA without an IPv6 range:
 * empty); HTTPS and SVCB of it: empty, since their address hints would bypass the fake
 * answer. false: not a fake-IP question (answered the usual way). */
static bool fake_answer(struct dns_server *s, const struct dns_query *q, const uint8_t *m,
			size_t limit, dns_reply_fn fn, void *arg)
{
	const struct ts_fakeip *fc = &s->cfg->dns.fakeip;
	uint16_t t = q->q.qtype;
	uint8_t addr[1][16];
	int family, ret;

	if (t != DNS_T_A && t != DNS_T_AAAA && t != DNS_T_HTTPS && t != DNS_T_SVCB)
		return false;
	if (fake_excluded(s, &q->q))
		return false;
	family = t == DNS_T_A ? 4 : 6;
	if (t == DNS_T_HTTPS || t == DNS_T_SVCB || (family == 6 && !fc->range6.addr.family)) {
		ctr_inc(&s->ctr.empty);
		reply_synth(s, q, m, limit, DNS_R_NOERROR, 0, NULL, 0, FAKE_TTL, fn, arg);
		return true;
	}
	memset(addr, 0, sizeof(addr));
	ret = fakeip_address(s->fake, q->q.name, q->q.name_len, family, ts_now_ns() / TS_NS_PER_SEC,
			     addr[0]);
	if (ret != 0) {
		/* Every mapping held or cooling down (-ENOSPC), no memory for a new one, or a
		 * name fake-IP refuses. */
		ctr_inc(&s->ctr.servfail);
		reply_synth(s, q, m, limit, DNS_R_SERVFAIL, 0, NULL, 0, 0, fn, arg);
		return true;
	}
	ctr_inc(&s->ctr.fake);
	reply_synth(s, q, m, limit, DNS_R_NOERROR, family, (const uint8_t (*)[16])addr, 1, FAKE_TTL,
		    fn, arg);
	return true;
}

int dns_server_fake_name(struct dns_server *s, int family, const uint8_t *addr, char *buf,
			 size_t cap)
{
	uint8_t a[16] = { 0 };

	if (!s->fake)
		return -ENOENT;
	memcpy(a, addr, family == 4 ? 4 : 16);
	return fakeip_name(s->fake, family, a, ts_now_ns() / TS_NS_PER_SEC, buf, cap);
}

void dns_server_fake_pin(struct dns_server *s, int family, const uint8_t *addr, bool pin)
{
	uint8_t a[16] = { 0 };

	if (!s->fake)
		return;
	memcpy(a, addr, family == 4 ? 4 : 16);
	if (pin)
		fakeip_pin(s->fake, family, a);
	else
		fakeip_unpin(s->fake, family, a, ts_now_ns() / TS_NS_PER_SEC);
}

static int save_line(void *arg, const char *line, size_t len)
{
	struct save_buf *b = arg;

	if (b->len + len > b->cap) {
		size_t cap = b->cap ? b->cap : 64 << 10;
		char *p;

		while (cap < b->len + len)
			cap *= 2;
		if (!(p = realloc(b->p, cap)))
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, line, len);
	b->len += len;
	return 0;
}

/* The snapshot in b written to a temporary file, flushed to the disk, then renamed over path:
 * a crash leaves the old file or the new one, never half of one. Any thread. */
static int write_snapshot(const char *path, const struct save_buf *b)
{
	char tmp[4200];
	size_t off = 0;
	int fd, ret = 0;

	/* A fresh name of our own (never a file someone put there, a symlink included). */
	snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path);
	if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0)
		return -errno;
	while (off < b->len) {
		ssize_t n = write(fd, b->p + off, b->len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = -errno;
			break;
		}
		off += (size_t)n;
	}
	if (ret == 0 && fsync(fd) != 0)
		ret = -errno;
	if (close(fd) != 0 && ret == 0)
		ret = -errno;
	if (ret == 0 && rename(tmp, path) != 0)
		ret = -errno;
	if (ret != 0)
		unlink(tmp);
	return ret;
}

/* The mappings now, into b (emptied first). */
static int snapshot(struct dns_server *s, struct save_buf *b, uint64_t *changes)
{
	struct fakeip_stats st;

	b->len = 0;
	fakeip_get_stats(s->fake, &st);
	*changes = st.created + st.reused;
	return fakeip_dump(s->fake, save_line, b);
}

int dns_server_fake_save(struct dns_server *s)
{
	struct save_buf b = { 0 };
	uint64_t changes;
	int ret;

	if (!s->fake || !s->cfg->dns.fakeip.persist)
		return 0;
	dns_server_fake_save_wait(s); /* the thread's file must not land after this one */
	if ((ret = snapshot(s, &b, &changes)) == 0 &&
	    (ret = write_snapshot(s->cfg->dns.fakeip.persist, &b)) == 0)
		s->saved_changes = changes;
	free(b.p);
	return ret;
}

static void *writer_main(void *arg)
{
	struct fake_writer *w = arg;

	w->result = write_snapshot(w->path, &w->buf);
	atomic_store_explicit(&w->busy, false, memory_order_release);
	return NULL;
}

/* The writer's thread joined, if there is one, and its outcome taken: a failure is logged and
 * makes the next tick save again. With wait false, a thread still writing is left alone
 * (returns -EBUSY). */
static int writer_reap(struct dns_server *s, bool wait)
{
	struct fake_writer *w = &s->writer;

	if (!w->started)
		return 0;
	if (!wait && atomic_load_explicit(&w->busy, memory_order_acquire))
		return -EBUSY;
	pthread_join(w->th, NULL);
	w->started = false;
	if (w->result != 0) {
		if (s->log)
			log_warn(s->log, "dns: fakeip: cannot write %s: %s", w->path,
				 strerror(-w->result));
		return w->result;
	}
	s->saved_changes = w->changes;
	return 0;
}

int dns_server_fake_save_start(struct dns_server *s)
{
	struct fake_writer *w = &s->writer;
	struct fakeip_stats st;
	int ret;

	if (!s->fake || !s->cfg->dns.fakeip.persist)
		return 0;
	if ((ret = writer_reap(s, false)) == -EBUSY)
		return ret; /* the last one is still writing: the next tick */
	fakeip_get_stats(s->fake, &st);
	if (st.created + st.reused == s->saved_changes)
		return 0; /* nothing changed since the last save */
	free(w->path);
	if (!(w->path = strdup(s->cfg->dns.fakeip.persist)))
		return -ENOMEM;
	if ((ret = snapshot(s, &w->buf, &w->changes)) != 0)
		return ret;
	atomic_store_explicit(&w->busy, true, memory_order_relaxed);
	if ((ret = -pthread_create(&w->th, NULL, writer_main, w)) != 0) {
		atomic_store_explicit(&w->busy, false, memory_order_relaxed);
		return ret;
	}
	w->started = true;
	return 0;
}

int dns_server_fake_save_wait(struct dns_server *s)
{
	return writer_reap(s, true);
}

int dns_server_fake_restore(struct dns_server *s, struct fakeip_load_stats *st)
{
	const char *path = s->cfg->dns.fakeip.persist;
	char *text = NULL;
	size_t len = 0, cap = 0;
	/* A line is an address and a name: at most FAKE_LINE_MAX bytes each. */
	size_t limit = (size_t)s->cfg->dns.fakeip.max_mappings * FAKE_LINE_MAX + 65536;
	FILE *f;
	int ret = 0;

	memset(st, 0, sizeof(*st));
	if (!s->fake || !path)
		return 0;
	if (!(f = fopen(path, "re")))
		return errno == ENOENT ? 0 : -errno; /* the first start: nothing saved yet */
	for (;;) {
		if (len == cap) {
			char *n = cap < limit ? realloc(text, cap ? cap * 2 : 65536) : NULL;
			if (!n) {
				ret = -ENOMEM;
				break;
			}
			text = n;
			cap = cap ? cap * 2 : 65536;
		}
		size_t got = fread(text + len, 1, cap - len, f);
		len += got;
		if (got == 0) {
			if (ferror(f))
				ret = -EIO;
			break;
		}
	}
	fclose(f);
	if (ret == 0)
		fakeip_load(s->fake, text, len, ts_now_ns() / TS_NS_PER_SEC, st);
	free(text);
	return ret;
}

static void save_cb(evutil_socket_t fd, short what, void *arg)
{
	struct dns_server *s = arg;
	int ret;

	(void)fd;
	(void)what;
	if ((ret = dns_server_fake_save_start(s)) != 0 && ret != -EBUSY && s->log)
		log_warn(s->log, "dns: fakeip: cannot save to %s: %s", s->cfg->dns.fakeip.persist,
			 strerror(-ret));
}

void dns_server_set_log(struct dns_server *s, struct log *lg)
{
	s->log = lg;
}

static int fake_new(struct dns_server *s)
{
	const struct ts_fakeip *fc = &s->cfg->dns.fakeip;
	struct fakeip_config c = { .range4 = fc->range4, .range6 = fc->range6,
				   .max_mappings = fc->max_mappings,
				   .cooldown_s = fc->reuse_after_s };
	struct timeval tv = { FAKE_SAVE_S, 0 };
	int ret;

	if ((ret = fakeip_new(&c, &s->fake)) != 0 || (ret = domain_set_new(&s->fake_builtin)) != 0)
		return ret;
	for (size_t i = 0; fake_exclude_builtin[i]; i++)
		if ((ret = domain_set_add(s->fake_builtin, DOMAIN_SUFFIX, fake_exclude_builtin[i],
					  strlen(fake_exclude_builtin[i]), NULL, NULL, 0)) != 0)
			return ret;
	if (!fc->persist)
		return 0;
	if (!(s->save_ev = event_new(s->base, -1, EV_PERSIST, save_cb, s)))
		return -ENOMEM;
	return event_add(s->save_ev, &tv) == 0 ? 0 : -ENOMEM;
}

static int query(struct dns_server *s, const uint8_t *m, size_t len, bool tcp, size_t mtu_payload,
		 bool real, dns_reply_fn fn, void *arg, struct dns_ticket **ticket);

struct cached_reply {
	struct dns_server *s;
	const struct dns_query *q;
	const uint8_t *m;
	size_t limit;
	int n;                            /* the reply's length in s->out */
};

/* The client's reply built from a cached answer, into s->out. false: it cannot be (an aged
 * TTL would change how the answer reads: core/dns_msg.h; the cache keeps no answer whose names
 * read a TTL, so this is a guard); the cache drops the entry and the query goes upstream as a
 * miss. */
static bool reply_cached(void *arg, const uint8_t *msg, size_t len, const struct dns_answer *a,
			 uint32_t age_s)
{
	struct cached_reply *r = arg;

	(void)len;
	r->n = dns_build_from_answer(r->s->out, sizeof(r->s->out), r->limit, r->q, r->m, msg, a,
				     age_s);
	return r->n > 0;
}

int dns_server_query(struct dns_server *s, const uint8_t *m, size_t len, bool tcp,
		     size_t mtu_payload, dns_reply_fn fn, void *arg, struct dns_ticket **ticket)
{
	return query(s, m, len, tcp, mtu_payload, false, fn, arg, ticket);
}

int dns_server_query_real(struct dns_server *s, const uint8_t *m, size_t len, dns_reply_fn fn,
			  void *arg, struct dns_ticket **ticket)
{
	return query(s, m, len, true, 0, true, fn, arg, ticket);
}

static int query(struct dns_server *s, const uint8_t *m, size_t len, bool tcp, size_t mtu_payload,
		 bool real, dns_reply_fn fn, void *arg, struct dns_ticket **ticket)
{
	const struct ts_dns *d = &s->cfg->dns;
	const struct ts_dns_host *h;
	const struct ts_dns_rule *r;
	struct dns_query q;
	uint32_t server = d->final;
	struct cached_reply cr;
	size_t limit;
	int ret;

	*ticket = NULL;
	ctr_inc(&s->ctr.queries);
	if (tcp)
		ctr_inc(&s->ctr.queries_tcp);
	if ((ret = dns_parse_query(m, len, &q)) != 0) {
		reply_bad(s, ret, m, len, fn, arg);
		return 0;
	}
	limit = dns_reply_limit(&q, tcp, mtu_payload);
	if (!q.q.nameable) {
		/* A name with bytes a name cannot hold: no server is asked for it. */
		ctr_inc(&s->ctr.refused);
		reply_synth(s, &q, m, limit, DNS_R_REFUSED, 0, NULL, 0, 0, fn, arg);
		return 0;
	}
	if (q.q.qclass == 1 && (h = config_dns_host(d, q.q.name, q.q.name_len))) {
		reply_hosts(s, h, &q, m, limit, fn, arg);
		return 0;
	}
	if ((r = rule_for(s->cfg, &q.q))) {
		if (r->action == TS_DNS_ACT_REFUSE || r->action == TS_DNS_ACT_EMPTY) {
			bool refuse = r->action == TS_DNS_ACT_REFUSE;
			ctr_inc(refuse ? &s->ctr.refused : &s->ctr.empty);
			reply_synth(s, &q, m, limit, refuse ? DNS_R_REFUSED : DNS_R_NOERROR, 0, NULL,
				    0, SYNTH_TTL, fn, arg);
			return 0;
		}
		server = r->server;
	}
	/* "No IPv6" wins over fake-IP: a fake IPv6 address is still IPv6. */
	if (q.q.qtype == DNS_T_AAAA && d->ipv6 == TS_DNS_IPV6_EMPTY) {
		ctr_inc(&s->ctr.empty);
		reply_synth(s, &q, m, limit, DNS_R_NOERROR, 0, NULL, 0, SYNTH_TTL, fn, arg);
		return 0;
	}
	if (!r && !real && s->fake && q.q.qclass == 1 && fake_answer(s, &q, m, limit, fn, arg))
		return 0;
	cr = (struct cached_reply){ .s = s, .q = &q, .m = m, .limit = limit };
	if (s->cache && dns_cache_use(s->cache, server, &q.q, ts_now_ns(), reply_cached, &cr)) {
		ctr_inc(&s->ctr.cache);
		fn(arg, s->out, (size_t)cr.n);
		return 0;
	}
	return wait_upstream(s, server, &q, m, len, limit, fn, arg, ticket);
}

/* ---- life --------------------------------------------------------------------------------- */

/* An https:// server: DNS over HTTPS (dns/doh.h). */
static int doh_new(struct dns_server *s, const struct ts_dns_server *sv, struct dns_doh **out)
{
	struct dns_doh_config dc = {
		.server = sv->addr,
		.ca = sv->ca,
		.detour = &s->cfg->outbounds[sv->detour],
		.timeout_ms = UPSTREAM_TRY_MS,
	};

	snprintf(dc.host, sizeof(dc.host), "%s", sv->sni);
	snprintf(dc.path, sizeof(dc.path), "%s", sv->path);
	return dns_doh_new(s->base, &dc, out);
}

int dns_server_new(struct event_base *base, const struct ts_config *cfg, struct budget *b,
		   struct dns_server **out)
{
	const struct ts_dns *d = &cfg->dns;
	struct dns_server *s;
	int ret = -ENOMEM;

	if (d->n_servers == 0 || !b)
		return -EINVAL;
	if (!(s = calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->base = base;
	s->cfg = cfg;
	s->b = b;
	if (!(s->ups = calloc(d->n_servers, sizeof(*s->ups))) ||
	    !(s->dohs = calloc(d->n_servers, sizeof(*s->dohs))))
		goto fail;
	for (size_t i = 0; i < d->n_servers; i++) {
		const struct ts_dns_server *sv = &d->servers[i];
		s->n_ups = i + 1;
		if (sv->transport == TS_DNS_HTTPS) {
			if ((ret = doh_new(s, sv, &s->dohs[i])) != 0)
				goto fail;
			continue;
		}
		struct dns_upstream_config uc = {
			.kind = sv->transport == TS_DNS_TCP   ? DNS_UP_TCP :
				sv->transport == TS_DNS_TLS ? DNS_UP_TLS : DNS_UP_UDP,
			.server = sv->addr,
			.detour = &cfg->outbounds[sv->detour],
			.sni = sv->sni,
			.ca = sv->ca,
			/* Two tries within a stub resolver's usual 5 s: SERVFAIL before it gives up. */
			.timeout_ms = UPSTREAM_TRY_MS,
		};
		if ((ret = dns_upstream_new(base, &uc, &s->ups[i])) != 0)
			goto fail;
	}
	if (d->fakeip.enabled && (ret = fake_new(s)) != 0)
		goto fail;
	if (d->cache_size) {
		struct dns_cache_config cc = { .max_entries = d->cache_size,
					       .max_ttl_s = d->cache_max_ttl_s,
					       .neg_ttl_max_s = NEG_TTL_MAX };
		if ((ret = dns_cache_new(&cc, &s->cache)) != 0)
			goto fail;
	}
	*out = s;
	return 0;
fail:
	dns_server_free(s);
	return ret;
}

/* Each server's connections from now on through the outbound cfg names for it (its detour,
 * or route.final's), when that outbound changed (a udp server's is direct: the config's
 * validation sees to it). */
static void detours_set(struct dns_server *s, const struct ts_config *cfg)
{
	for (size_t i = 0; i < s->n_ups; i++) {
		const struct ts_dns_server *sv = &cfg->dns.servers[i];
		const struct ts_outbound *ob = &cfg->outbounds[sv->detour];
		int ret = s->dohs[i] ? dns_doh_set_detour(s->dohs[i], ob)
				     : dns_upstream_set_detour(s->ups[i], ob);

		if (ret > 0 && s->log)
			log_info(s->log, "dns: server %s now goes through outbound %s", sv->tag,
				 ob->tag);
		else if (ret < 0 && s->log)
			log_warn(s->log, "dns: server %s keeps its outbound: %s", sv->tag,
				 strerror(-ret));
	}
}

int dns_server_reconfigure(struct dns_server *s, const struct ts_config *cfg)
{
	if (cfg->dns.resolver_sig != s->cfg->dns.resolver_sig ||
	    cfg->dns.n_servers != s->cfg->dns.n_servers)
		return -EBUSY;
	detours_set(s, cfg);
	s->cfg = cfg;
	return 0;
}

const struct ts_config *dns_server_config(const struct dns_server *s)
{
	return s->cfg;
}

/* Every query still waiting gets fn(arg, NULL, 0), so its owner can let go of it. */
void dns_server_free(struct dns_server *s)
{
	struct flight *f;
	struct dns_ticket *t;

	if (!s)
		return;
	if (s->fake && s->cfg->dns.fakeip.persist) {
		int ret = dns_server_fake_save(s);
		if (ret != 0 && s->log)
			log_warn(s->log, "dns: fakeip: cannot write %s: %s",
				 s->cfg->dns.fakeip.persist, strerror(-ret));
	}
	while ((f = s->flights)) {
		flight_unlink(s, f);
		ask_cancel(s, f);
		while ((t = f->waiters)) {
			waiter_unlink(f, t);
			t->fn(t->arg, NULL, 0);
			/* Its owner lets go of it, as if its client had left. */
			ctr_inc(&s->ctr.gone);
			ticket_done(s, t);
		}
		budget_mfree(s->b, f);
	}
	for (size_t i = 0; i < s->n_ups; i++) {
		dns_upstream_free(s->ups[i]);
		if (s->dohs)
			dns_doh_free(s->dohs[i]);
	}
	free(s->ups);
	free(s->dohs);
	dns_cache_free(s->cache);
	if (s->save_ev)
		event_free(s->save_ev);
	/* A writer was only ever started with persist, and the save above joined it. */
	free(s->writer.path);
	free(s->writer.buf.p);
	fakeip_free(s->fake);
	domain_set_free(s->fake_builtin);
	free(s);
}

void dns_server_get_stats(const struct dns_server *s, struct dns_server_stats *o)
{
	struct dns_cache_stats cs = { 0 };

	memset(o, 0, sizeof(*o));
	o->queries = ctr_get(&s->ctr.queries);
	o->queries_tcp = ctr_get(&s->ctr.queries_tcp);
	o->answered_hosts = ctr_get(&s->ctr.hosts);
	o->answered_fake = ctr_get(&s->ctr.fake);
	o->answered_cache = ctr_get(&s->ctr.cache);
	o->answered_upstream = ctr_get(&s->ctr.upstream);
	o->answered_refused = ctr_get(&s->ctr.refused);
	o->answered_empty = ctr_get(&s->ctr.empty);
	o->answered_servfail = ctr_get(&s->ctr.servfail);
	o->drops_malformed = ctr_get(&s->ctr.malformed);
	o->drops_busy = ctr_get(&s->ctr.busy);
	o->drops_no_memory = ctr_get(&s->ctr.nomem);
	o->drops_client_gone = ctr_get(&s->ctr.gone);
	o->coalesced = ctr_get(&s->ctr.coalesced);
	o->pending = s->pending;
	if (s->cache) {
		dns_cache_get_stats(s->cache, &cs);
		o->cache_hits = cs.hits;
		o->cache_misses = cs.misses;
		o->cache_entries = cs.entries;
		o->cache_evictions = cs.evictions;
		o->cache_not_stored_name_in_ttl = cs.not_stored_name_in_ttl;
	}
	if (s->fake) {
		struct fakeip_stats fs;
		fakeip_get_stats(s->fake, &fs);
		o->fake_mappings = fs.mappings;
		o->fake_pinned = fs.pinned;
		o->fake_exhausted = fs.exhausted;
		o->fake_unmapped = fs.unmapped;
	}
	for (size_t i = 0; i < s->n_ups; i++) {
		struct dns_upstream_stats us;
		struct dns_doh_stats ds;
		if (s->dohs[i]) {
			dns_doh_get_stats(s->dohs[i], &ds);
			o->upstream_queries += ds.queries;
			o->upstream_timeouts += ds.timeouts;
			o->upstream_errors += ds.errors;
			o->upstream_bad_answers += ds.bad_answers;
			o->upstream_tls_failures += ds.tls_failures;
			o->upstream_http_errors += ds.http_errors;
			continue;
		}
		dns_upstream_get_stats(s->ups[i], &us);
		o->upstream_queries += us.queries;
		o->upstream_timeouts += us.timeouts;
		o->upstream_errors += us.errors;
		o->upstream_bad_answers += us.bad_answers;
		o->upstream_tls_failures += us.tls_failures;
	}
}
