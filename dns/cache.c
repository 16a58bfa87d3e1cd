/* cache.c — the DNS answer cache: a chained hash table keyed by (server, lowercased name,
 * type, class) and an intrusive LRU list through the same entries, each entry one allocation
 * holding the parsed answer and the message bytes. Contracts: cache.h. */
#include "dns/cache.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/hashmix.h"

#define NS_PER_S 1000000000LL
#define MSG_MAX 65535            /* a DNS message over TCP: its 16-bit length prefix */
#define BUCKETS_MAX (1u << 24)

struct centry {
	struct centry *prev, *next; /* the LRU list: c->head is the least recently used */
	struct centry *chain;       /* the next entry in its bucket */
	uint64_t h;
	uint32_t server;
	int64_t stored_ns, expires_ns;
	struct dns_answer a;        /* a.q keeps the upstream's case */
	size_t len;
	uint8_t msg[];              /* len bytes, kept RRs' TTLs lowered to the entry's */
};

struct dns_cache {
	struct dns_cache_config cfg;
	struct centry **buckets;
	uint32_t mask;              /* buckets - 1, a power of two less one */
	uint32_t n;                 /* entries */
	struct centry *head, *tail;
	uint64_t key;
	struct dns_cache_stats st;
};

static inline uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* ---- hashing ------------------------------------------------------------------------------ */

static uint64_t hash_key(const struct dns_cache *c, uint32_t server, const struct dns_question *q)
{
	uint64_t h = c->key;

	for (size_t i = 0; i < q->name_len; i++) {
		uint8_t ch = (uint8_t)q->name[i];
		if (ch >= 'A' && ch <= 'Z')
			ch = (uint8_t)(ch + 32);
		h = (h ^ ch) * 0x100000001b3ULL;
	}
	return hashmix64(h ^ ((uint64_t)q->qtype << 48 | (uint64_t)q->qclass << 32 | server));
}

/* The link (bucket head or a chain field) that points at the entry for the key, or NULL. */
static struct centry **find(struct dns_cache *c, uint64_t h, uint32_t server,
			    const struct dns_question *q)
{
	for (struct centry **p = &c->buckets[h & c->mask]; *p; p = &(*p)->chain) {
		const struct centry *e = *p;
		if (e->h == h && e->server == server && dns_question_equal(&e->a.q, q))
			return p;
	}
	return NULL;
}

/* The link that points at e (which is in the table). */
static struct centry **link_of(struct dns_cache *c, const struct centry *e)
{
	struct centry **p = &c->buckets[e->h & c->mask];

	while (*p != e)
		p = &(*p)->chain;
	return p;
}

/* ---- entries ------------------------------------------------------------------------------ */

static void lru_unlink(struct dns_cache *c, struct centry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		c->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		c->tail = e->prev;
	e->prev = e->next = NULL;
}

static void lru_append(struct dns_cache *c, struct centry *e)
{
	e->prev = c->tail;
	e->next = NULL;
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
}

/* Take the entry *link points at out of the table and the list, and free it. */
static void entry_remove(struct dns_cache *c, struct centry **link)
{
	struct centry *e = *link;

	*link = e->chain;
	lru_unlink(c, e);
	assert(c->n > 0 && c->st.bytes >= e->len);
	c->n--;
	c->st.bytes -= e->len;
	free(e);
}

/* Make room for one more: the least recently used entry goes (counted as expired if it was). */
static void evict_lru(struct dns_cache *c, int64_t now_ns)
{
	struct centry *e = c->head;

	if (now_ns >= e->expires_ns)
		c->st.expired++;
	else
		c->st.evictions++;
	entry_remove(c, link_of(c, e));
}

/* The cap on the answer's TTLs: max_ttl_s, or neg_ttl_max_s for a negative answer. */
static uint32_t ttl_cap(const struct dns_cache *c, const struct dns_answer *a)
{
	bool negative = DNS_RCODE(a->flags) == DNS_R_NXDOMAIN || a->an == 0;
	uint32_t cap = negative ? c->cfg.neg_ttl_max_s : c->cfg.max_ttl_s;

	return cap < INT32_MAX ? cap : INT32_MAX;
}

/* How long the answer may be kept, in seconds; 0: not at all. */
static uint32_t entry_ttl(const struct dns_cache *c, const struct dns_answer *a)
{
	unsigned rcode = DNS_RCODE(a->flags);
	uint32_t cap = ttl_cap(c, a);

	if (rcode != DNS_R_NOERROR && rcode != DNS_R_NXDOMAIN)
		return 0;
	if ((a->flags & DNS_F_TC) || a->n_ttl_overflow || !a->q.nameable)
		return 0;
	/* The top bit set counts as 0 (RFC 2181 8); UINT32_MAX is also "no TTL": a negative
	 * answer without an SOA (RFC 2308 5: not cached). */
	if (a->min_ttl > INT32_MAX)
		return 0;
	return a->min_ttl < cap ? a->min_ttl : cap;
}

/* A new entry living ttl seconds, holding a copy of the answer with its kept RRs' TTLs at
 * most cap; NULL: no memory. */
static struct centry *entry_new(uint32_t server, const uint8_t *msg, size_t len,
				const struct dns_answer *a, uint32_t ttl, uint32_t cap,
				int64_t now_ns)
{
	struct centry *e = malloc(sizeof(*e) + len);

	if (!e)
		return NULL;
	memset(e, 0, sizeof(*e));
	e->server = server;
	e->a = *a;
	e->len = len;
	memcpy(e->msg, msg, len);
	for (size_t i = 0; i < a->n_ttl; i++) {
		uint8_t *t = e->msg + a->ttl_off[i];
		assert(a->ttl_off[i] + 4u <= len);
		if (get32(t) > cap)
			put32(t, cap);
	}
	e->stored_ns = now_ns;
	/* ttl <= INT32_MAX seconds: the product fits; saturate the sum. */
	e->expires_ns = now_ns > INT64_MAX - (int64_t)ttl * NS_PER_S ? INT64_MAX
								 : now_ns + (int64_t)ttl * NS_PER_S;
	return e;
}

/* ---- the API ------------------------------------------------------------------------------ */

int dns_cache_new(const struct dns_cache_config *cfg, struct dns_cache **out)
{
	struct dns_cache *c;
	uint32_t nb = 16;

	if (cfg->max_entries == 0)
		return -EINVAL;
	if (!(c = calloc(1, sizeof(*c))))
		return -ENOMEM;
	c->cfg = *cfg;
	while (nb < cfg->max_entries && nb < BUCKETS_MAX)
		nb *= 2;
	if (!(c->buckets = calloc(nb, sizeof(*c->buckets)))) {
		free(c);
		return -ENOMEM;
	}
	c->mask = nb - 1;
	if (getrandom(&c->key, sizeof(c->key), GRND_NONBLOCK) != (ssize_t)sizeof(c->key))
		c->key = (uint64_t)(uintptr_t)c * 0x9e3779b97f4a7c15ULL;
	*out = c;
	return 0;
}

void dns_cache_free(struct dns_cache *c)
{
	if (!c)
		return;
	dns_cache_clear(c);
	free(c->buckets);
	free(c);
}

int dns_cache_put(struct dns_cache *c, uint32_t server, const uint8_t *msg, size_t len,
		  const struct dns_answer *a, int64_t now_ns)
{
	struct centry *e, **old;
	uint32_t ttl;

	if (len > MSG_MAX || len < a->keep_end)
		return -EINVAL;
	if ((ttl = entry_ttl(c, a)) == 0) {
		c->st.not_stored++;
		return 1;
	}
	/* The copy's TTLs are lowered to the cap and every reply ages them: a name that reads
	 * a TTL's bytes (a forged answer) would read as another name. The answer is sent as it
	 * came, but never kept. */
	if (dns_answer_names_read_ttls(msg, len, a)) {
		c->st.not_stored_name_in_ttl++;
		return 1;
	}
	if (!(e = entry_new(server, msg, len, a, ttl, ttl_cap(c, a), now_ns)))
		return -ENOMEM;
	e->h = hash_key(c, server, &a->q);
	if ((old = find(c, e->h, server, &a->q)) != NULL)
		entry_remove(c, old); /* replaced: neither evicted nor expired */
	else if (c->n >= c->cfg.max_entries)
		evict_lru(c, now_ns);
	e->chain = c->buckets[e->h & c->mask];
	c->buckets[e->h & c->mask] = e;
	lru_append(c, e);
	c->n++;
	c->st.bytes += len;
	c->st.stored++;
	return 0;
}

bool dns_cache_use(struct dns_cache *c, uint32_t server, const struct dns_question *q,
		   int64_t now_ns, dns_cache_use_fn fn, void *arg)
{
	struct centry **link = q->nameable ? find(c, hash_key(c, server, q), server, q) : NULL;
	struct centry *e;
	uint32_t age_s;

	if (!link) {
		c->st.misses++;
		return false;
	}
	e = *link;
	if (now_ns >= e->expires_ns) {
		entry_remove(c, link);
		c->st.expired++;
		c->st.misses++;
		return false;
	}
	/* Live: now - stored < TTL <= INT32_MAX seconds. */
	age_s = now_ns > e->stored_ns ? (uint32_t)((now_ns - e->stored_ns) / NS_PER_S) : 0;
	if (!fn(arg, e->msg, e->len, &e->a, age_s)) {
		/* Later lookups would refuse it too: the upstream's next answer takes its place. */
		entry_remove(c, link);
		c->st.unusable++;
		c->st.misses++;
		return false;
	}
	lru_unlink(c, e);
	lru_append(c, e);
	c->st.hits++;
	return true;
}

struct borrow {
	const uint8_t **msg;
	size_t *len;
	const struct dns_answer **a;
	uint32_t *age_s;
};

/* dns_cache_get's use: the entry lent to the caller as it is. */
static bool lend(void *arg, const uint8_t *msg, size_t len, const struct dns_answer *a,
		 uint32_t age_s)
{
	struct borrow *b = arg;

	*b->msg = msg;
	*b->len = len;
	*b->a = a;
	*b->age_s = age_s;
	return true;
}

bool dns_cache_get(struct dns_cache *c, uint32_t server, const struct dns_question *q,
		   int64_t now_ns, const uint8_t **msg, size_t *len, const struct dns_answer **a,
		   uint32_t *age_s)
{
	struct borrow b = { msg, len, a, age_s };

	return dns_cache_use(c, server, q, now_ns, lend, &b);
}

void dns_cache_clear(struct dns_cache *c)
{
	struct centry *e = c->head, *next;

	for (; e; e = next) {
		next = e->next;
		free(e);
	}
	memset(c->buckets, 0, ((size_t)c->mask + 1) * sizeof(*c->buckets));
	c->head = c->tail = NULL;
	c->n = 0;
	c->st.bytes = 0;
}

void dns_cache_get_stats(const struct dns_cache *c, struct dns_cache_stats *out)
{
	*out = c->st;
	out->entries = c->n;
}
