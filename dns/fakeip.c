/* fakeip.c — the fake-IP pool: entries indexed by name and by address, per-family LRU lists
 * of the mappings no session holds, an allocation cursor per range. Contracts: fakeip.h. */
#include "dns/fakeip.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "core/hashmix.h"

#define NIL UINT32_MAX
#define DNS_NAME_CAP 254         /* a name's text (at most 253 bytes) and its NUL */

struct fentry {
	uint8_t family;          /* 0: free slot */
	uint8_t addr[16];
	char *name;              /* lower case, NUL-terminated */
	uint8_t name_len;
	uint32_t pins;
	int64_t used;
	uint32_t prev, next;     /* on its family's LRU list while unpinned */
	uint32_t by_name, by_addr; /* hash chains */
};

struct lru {
	uint32_t head, tail;     /* head: least recently used */
};

struct range {
	struct netaddr_cidr c;   /* family 0: none */
	uint64_t size;           /* usable offsets: [first, first + size) */
	uint64_t first;
	uint64_t cursor;         /* offsets handed out so far */
};

struct fakeip {
	struct fakeip_config cfg;
	struct range r[2];       /* [0] IPv4, [1] IPv6 */
	struct fentry *e;
	uint32_t n_e, cap_e;     /* slots used / allocated */
	uint32_t free_head;      /* a chain of free slots through by_name */
	uint32_t *h_name, *h_addr;
	uint32_t nbuckets;       /* power of two, >= 2 * max_mappings */
	uint64_t key;
	struct lru lru[2];
	struct fakeip_stats st;
};

static int fam_index(int family)
{
	return family == 6 ? 1 : 0;
}

/* ---- hashing ------------------------------------------------------------------------------ */

static uint32_t hash_name(const struct fakeip *f, int family, const char *s, size_t len)
{
	uint64_t h = f->key ^ (uint64_t)family;

	for (size_t i = 0; i < len; i++)
		h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
	return (uint32_t)hashmix64(h) & (f->nbuckets - 1);
}

static uint32_t hash_addr(const struct fakeip *f, int family, const uint8_t a[16])
{
	uint64_t lo, hi;

	memcpy(&lo, a, 8);
	memcpy(&hi, a + 8, 8);
	return (uint32_t)hashmix64(f->key ^ lo ^ hashmix64(hi + (uint64_t)family)) & (f->nbuckets - 1);
}

/* ---- ranges ------------------------------------------------------------------------------- */

static int range_init(struct range *r, const struct netaddr_cidr *c)
{
	unsigned bits = (c->addr.family == 4 ? 32u : 128u) - c->prefix;

	r->c = *c;
	netaddr_cidr_normalize(&r->c);
	r->size = bits >= 63 ? (1ULL << 62) : (1ULL << bits);
	r->first = 0;
	if (c->addr.family == 4 && bits >= 2) { /* not the network nor the broadcast address */
		r->first = 1;
		r->size -= 2;
	} else if (c->addr.family == 6 && bits >= 1) { /* not the subnet-router anycast address */
		r->first = 1;
		r->size -= 1;
	}
	return r->size ? 0 : -EINVAL;
}

/* The address at offset off of the range: the network address plus off. */
static void range_addr(const struct range *r, uint64_t off, uint8_t out[16])
{
	int last = r->c.addr.family == 4 ? 3 : 15;
	unsigned carry = 0;

	memcpy(out, r->c.addr.a, 16);
	for (int i = last; i >= 0 && (off || carry); i--) {
		unsigned v = out[i] + (unsigned)(off & 0xff) + carry;
		out[i] = (uint8_t)v;
		carry = v >> 8;
		off >>= 8;
	}
}

/* ---- entries ------------------------------------------------------------------------------ */

static void lru_unlink(struct fakeip *f, uint32_t i)
{
	struct fentry *e = &f->e[i];
	struct lru *l = &f->lru[fam_index(e->family)];

	if (e->prev != NIL)
		f->e[e->prev].next = e->next;
	else
		l->head = e->next;
	if (e->next != NIL)
		f->e[e->next].prev = e->prev;
	else
		l->tail = e->prev;
	e->prev = e->next = NIL;
}

static void lru_append(struct fakeip *f, uint32_t i)
{
	struct fentry *e = &f->e[i];
	struct lru *l = &f->lru[fam_index(e->family)];

	e->prev = l->tail;
	e->next = NIL;
	if (l->tail != NIL)
		f->e[l->tail].next = i;
	else
		l->head = i;
	l->tail = i;
}

static void touch(struct fakeip *f, uint32_t i, int64_t now)
{
	f->e[i].used = now;
	if (f->e[i].pins == 0) {
		lru_unlink(f, i);
		lru_append(f, i);
	}
}

static uint32_t find_name(const struct fakeip *f, int family, const char *low, size_t len)
{
	for (uint32_t i = f->h_name[hash_name(f, family, low, len)]; i != NIL; i = f->e[i].by_name)
		if (f->e[i].family == family && f->e[i].name_len == len &&
		    !memcmp(f->e[i].name, low, len))
			return i;
	return NIL;
}

static uint32_t find_addr(const struct fakeip *f, int family, const uint8_t a[16])
{
	for (uint32_t i = f->h_addr[hash_addr(f, family, a)]; i != NIL; i = f->e[i].by_addr)
		if (f->e[i].family == family && !memcmp(f->e[i].addr, a, 16))
			return i;
	return NIL;
}

static void chain_remove(struct fakeip *f, uint32_t *head, uint32_t i, bool by_name)
{
	uint32_t *p = head;

	while (*p != i)
		p = by_name ? &f->e[*p].by_name : &f->e[*p].by_addr;
	*p = by_name ? f->e[i].by_name : f->e[i].by_addr;
}

/* Take entry i out of both indexes (it keeps its slot and LRU place). */
static void unindex(struct fakeip *f, uint32_t i)
{
	struct fentry *e = &f->e[i];

	chain_remove(f, &f->h_name[hash_name(f, e->family, e->name, e->name_len)], i, true);
	chain_remove(f, &f->h_addr[hash_addr(f, e->family, e->addr)], i, false);
}

static void index_entry(struct fakeip *f, uint32_t i)
{
	struct fentry *e = &f->e[i];
	uint32_t hn = hash_name(f, e->family, e->name, e->name_len);
	uint32_t ha = hash_addr(f, e->family, e->addr);

	e->by_name = f->h_name[hn];
	f->h_name[hn] = i;
	e->by_addr = f->h_addr[ha];
	f->h_addr[ha] = i;
}

/* A slot for a new mapping: 0 and *i, -ENOSPC when max_mappings are live, or -ENOMEM when
 * the table could not grow (not a full pool: nothing may be recycled for it). */
static int slot_new(struct fakeip *f, uint32_t *i)
{
	if (f->n_e >= f->cfg.max_mappings)
		return -ENOSPC;
	if (f->n_e == f->cap_e) {
		uint32_t cap = f->cap_e ? f->cap_e * 2 : 256;
		struct fentry *e;
		if (cap > f->cfg.max_mappings)
			cap = f->cfg.max_mappings;
		if (!(e = realloc(f->e, (size_t)cap * sizeof(*e))))
			return -ENOMEM;
		f->e = e;
		f->cap_e = cap;
	}
	memset(&f->e[f->n_e], 0, sizeof(f->e[0]));
	*i = f->n_e++;
	return 0;
}

/* Lower case copy of a valid name; its length or -EINVAL. */
static int lower_name(const char *s, size_t len, char out[DNS_NAME_CAP])
{
	if (len && s[len - 1] == '.')
		len--;
	if (len == 0 || len >= DNS_NAME_CAP)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (c >= 'A' && c <= 'Z')
			c = (char)(c + 32);
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
		      c == '.'))
			return -EINVAL;
		out[i] = c;
	}
	out[len] = 0;
	return (int)len;
}

static char *dup_name(const char *low, size_t len)
{
	char *n = malloc(len + 1);

	if (n)
		memcpy(n, low, len + 1);
	return n;
}

/* Map the name n (len, allocated by dup_name, now the entry's) to addr in slot i (new, or
 * recycled: already out of the indexes and the LRU list). */
static void set_entry(struct fakeip *f, uint32_t i, int family, char *n, size_t len,
		      const uint8_t addr[16], int64_t now)
{
	struct fentry *e = &f->e[i];

	free(e->name);
	e->name = n;
	e->name_len = (uint8_t)len;
	e->family = (uint8_t)family;
	memcpy(e->addr, addr, 16);
	e->pins = 0;
	e->used = now;
	index_entry(f, i);
	lru_append(f, i);
}

/* ---- the API ------------------------------------------------------------------------------ */

int fakeip_new(const struct fakeip_config *cfg, struct fakeip **out)
{
	struct fakeip *f;
	uint32_t nb = 64;

	if (cfg->max_mappings == 0 || (cfg->range4.addr.family != 4 && cfg->range6.addr.family != 6))
		return -EINVAL;
	if (!(f = calloc(1, sizeof(*f))))
		return -ENOMEM;
	f->cfg = *cfg;
	if ((cfg->range4.addr.family == 4 && range_init(&f->r[0], &cfg->range4) != 0) ||
	    (cfg->range6.addr.family == 6 && range_init(&f->r[1], &cfg->range6) != 0)) {
		free(f);
		return -EINVAL;
	}
	while (nb < 2ULL * cfg->max_mappings && nb < (1u << 30))
		nb *= 2;
	f->nbuckets = nb;
	f->h_name = malloc(nb * sizeof(*f->h_name));
	f->h_addr = malloc(nb * sizeof(*f->h_addr));
	if (!f->h_name || !f->h_addr) {
		fakeip_free(f);
		return -ENOMEM;
	}
	memset(f->h_name, 0xff, nb * sizeof(*f->h_name));
	memset(f->h_addr, 0xff, nb * sizeof(*f->h_addr));
	f->lru[0].head = f->lru[0].tail = f->lru[1].head = f->lru[1].tail = NIL;
	if (getrandom(&f->key, sizeof(f->key), GRND_NONBLOCK) != (ssize_t)sizeof(f->key))
		f->key = (uint64_t)(uintptr_t)f * 0x9e3779b97f4a7c15ULL;
	*out = f;
	return 0;
}

void fakeip_free(struct fakeip *f)
{
	if (!f)
		return;
	for (uint32_t i = 0; i < f->n_e; i++)
		free(f->e[i].name);
	free(f->e);
	free(f->h_name);
	free(f->h_addr);
	free(f);
}

bool fakeip_contains(const struct fakeip *f, int family, const uint8_t addr[16])
{
	const struct range *r = &f->r[fam_index(family)];
	struct netaddr a = { .family = (uint8_t)family };

	if (r->c.addr.family != family)
		return false;
	memcpy(a.a, addr, 16);
	return netaddr_in_cidr(&a, &r->c);
}

/* A free mapping (the LRU lists hold no pinned one) idle for at least the cooldown. */
static bool cooled(const struct fakeip *f, uint32_t i, int64_t now_s)
{
	return now_s - f->e[i].used >= (int64_t)f->cfg.cooldown_s;
}

int fakeip_address(struct fakeip *f, const char *name, size_t len, int family, int64_t now_s,
		   uint8_t addr[16])
{
	struct range *r = &f->r[fam_index(family)];
	char low[DNS_NAME_CAP], *copy;
	int n = lower_name(name, len, low);
	uint32_t i;
	int ret;

	if (r->c.addr.family != family || (family != 4 && family != 6))
		return -EAFNOSUPPORT;
	if (n < 0)
		return -EINVAL;
	if ((i = find_name(f, family, low, (size_t)n)) != NIL) {
		touch(f, i, now_s);
		memcpy(addr, f->e[i].addr, 16);
		f->st.hits++;
		return 0;
	}
	/* A fresh address: the cursor's next one not already mapped (a loaded file may hold
	 * addresses ahead of the cursor). */
	bool fresh = false;
	uint8_t a[16];
	while (r->cursor < r->size) {
		range_addr(r, r->first + r->cursor, a);
		if (find_addr(f, family, a) != NIL) {
			r->cursor++;
			continue;
		}
		if (!(copy = dup_name(low, (size_t)n)))
			return -ENOMEM;
		if ((ret = slot_new(f, &i)) != 0) {
			free(copy);
			if (ret == -ENOMEM)
				return ret;
			fresh = true; /* an address, but max_mappings are live */
			break;
		}
		r->cursor++;
		set_entry(f, i, family, copy, (size_t)n, a, now_s);
		memcpy(addr, a, 16);
		f->st.created++;
		return 0;
	}
	/* Recycle the least recently used free mapping that has cooled: this family's, which
	 * keeps its address; else, when it is max_mappings that are used up (they bound both
	 * families together), the other family's, whose slot takes the fresh address. */
	i = f->lru[fam_index(family)].head;
	if (i != NIL && cooled(f, i, now_s)) {
		memcpy(a, f->e[i].addr, 16);
	} else if (fresh && (i = f->lru[fam_index(family == 4 ? 6 : 4)].head) != NIL &&
		   cooled(f, i, now_s)) {
		r->cursor++;
	} else {
		f->st.exhausted++;
		return -ENOSPC;
	}
	if (!(copy = dup_name(low, (size_t)n)))
		return -ENOMEM;
	unindex(f, i);
	lru_unlink(f, i);
	set_entry(f, i, family, copy, (size_t)n, a, now_s);
	memcpy(addr, a, 16);
	f->st.reused++;
	return 0;
}

int fakeip_name(struct fakeip *f, int family, const uint8_t addr[16], int64_t now_s, char *buf,
		size_t cap)
{
	uint32_t i;

	if (!fakeip_contains(f, family, addr))
		return -ENOENT;
	if ((i = find_addr(f, family, addr)) == NIL) {
		f->st.unmapped++;
		return 0;
	}
	touch(f, i, now_s);
	snprintf(buf, cap, "%s", f->e[i].name);
	return f->e[i].name_len;
}

void fakeip_pin(struct fakeip *f, int family, const uint8_t addr[16])
{
	uint32_t i = find_addr(f, family, addr);

	if (i == NIL)
		return;
	if (f->e[i].pins++ == 0)
		lru_unlink(f, i);
}

void fakeip_unpin(struct fakeip *f, int family, const uint8_t addr[16], int64_t now_s)
{
	uint32_t i = find_addr(f, family, addr);

	if (i == NIL || f->e[i].pins == 0)
		return;
	if (--f->e[i].pins == 0) {
		f->e[i].used = now_s; /* the cooldown counts from the last session's end */
		lru_append(f, i);
	}
}

static int dump_one(const struct fakeip *f, uint32_t i,
		    int (*out)(void *arg, const char *line, size_t len), void *arg)
{
	struct netaddr a = { .family = f->e[i].family };
	char line[NETADDR_STRLEN + DNS_NAME_CAP + 2];
	char text[NETADDR_STRLEN];
	int n;

	memcpy(a.a, f->e[i].addr, 16);
	n = snprintf(line, sizeof(line), "%s %s\n", netaddr_format(&a, text, sizeof(text)),
		     f->e[i].name);
	return out(arg, line, (size_t)n);
}

int fakeip_dump(const struct fakeip *f, int (*out)(void *arg, const char *line, size_t len),
		void *arg)
{
	int ret;

	/* Pinned mappings first (they are in use), then each family's LRU list in order. */
	for (uint32_t i = 0; i < f->n_e; i++)
		if (f->e[i].pins && (ret = dump_one(f, i, out, arg)) != 0)
			return ret;
	for (int fam = 0; fam < 2; fam++)
		for (uint32_t i = f->lru[fam].head; i != NIL; i = f->e[i].next)
			if ((ret = dump_one(f, i, out, arg)) != 0)
				return ret;
	return 0;
}

void fakeip_load(struct fakeip *f, const char *text, size_t len, int64_t now_s,
		 struct fakeip_load_stats *st)
{
	const char *p = text, *end = text + len;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end;
		const char *sp = memchr(p, ' ', (size_t)(e - p));
		char atext[NETADDR_STRLEN + 1], low[DNS_NAME_CAP];
		struct netaddr a;
		uint32_t i;
		int n;

		if (e == p) {
			p = e + 1;
			continue;
		}
		if (!sp || (size_t)(sp - p) > NETADDR_STRLEN ||
		    (n = lower_name(sp + 1, (size_t)(e - sp - 1), low)) < 0) {
			st->bad++;
			goto next;
		}
		memcpy(atext, p, (size_t)(sp - p));
		atext[sp - p] = 0;
		if (netaddr_parse(atext, &a) != 0) {
			st->bad++;
		} else if (!fakeip_contains(f, a.family, a.a)) {
			st->outside++;
		} else if (find_addr(f, a.family, a.a) != NIL ||
			   find_name(f, a.family, low, (size_t)n) != NIL) {
			st->duplicates++;
		} else {
			char *copy = dup_name(low, (size_t)n);
			int ret = copy ? slot_new(f, &i) : -ENOMEM;
			if (ret == 0) {
				set_entry(f, i, a.family, copy, (size_t)n, a.a, now_s);
				st->loaded++;
			} else {
				free(copy);
				if (ret == -ENOSPC)
					st->full++;
				else
					st->no_memory++;
			}
		}
next:
		p = nl ? nl + 1 : end;
	}
}

void fakeip_get_stats(const struct fakeip *f, struct fakeip_stats *out)
{
	*out = f->st;
	out->mappings = f->n_e;
	out->pinned = 0;
	for (uint32_t i = 0; i < f->n_e; i++)
		if (f->e[i].pins)
			out->pinned++;
}
