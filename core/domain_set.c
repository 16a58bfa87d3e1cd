/* domain_set.c — exact/suffix names in one hash table probed at each label boundary, keywords
 * and PCRE2 patterns in lists, and the rule-set loaders. Contracts: domain_set.h. */
#include "core/domain_set.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/hashmix.h"

#define DS_MIN_SLOTS 64u
#define DS_MATCH_LIMIT 100000u   /* PCRE2 backtracking bound per name */
#define F_EXACT 1u
#define F_SUFFIX 2u

/* A name in the table: its hash, where its text is in the arena, which kinds it is. */
struct slot {
	uint64_t h;      /* 0: empty (a real hash of 0 is stored as 1) */
	uint32_t off;
	uint8_t len;
	uint8_t flags;
};

struct text {
	uint32_t off;
	uint8_t len;
};

struct domain_set {
	uint64_t key;
	struct slot *slots;
	size_t nslots, used;     /* nslots a power of two, used <= nslots / 2 */
	char *arena;             /* the names' and keywords' text, lowercased */
	size_t arena_len, arena_cap;
	struct text *keywords;
	size_t nkeywords, keywords_cap;
	pcre2_code **regex;
	size_t nregex, regex_cap;
	size_t n_exact, n_suffix;
};

/* ---- hashing: right to left, so every suffix's hash is a prefix of the work ---------------- */

static inline uint64_t step(uint64_t h, unsigned char c)
{
	return (h ^ c) * 0x100000001b3ULL; /* FNV-1a's prime */
}

/* The hash of the len bytes hashed so far (state h). */
static inline uint64_t finish(uint64_t h, size_t len)
{
	h = hashmix64(h ^ len);
	return h ? h : 1;
}

static uint64_t hash_name(uint64_t key, const char *s, size_t len)
{
	uint64_t h = key;

	for (size_t i = len; i-- > 0;)
		h = step(h, (unsigned char)s[i]);
	return finish(h, len);
}

/* ---- names -------------------------------------------------------------------------------- */

static inline char lower(char c)
{
	return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
}

static bool name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* s lowercased into out without a trailing dot (and, when lead_dot_ok, without one leading
 * dot); its length, or -1 if it is not a valid name. */
static int normalize(const char *s, size_t len, bool lead_dot_ok, char out[DOMAIN_NAME_MAX + 1])
{
	size_t n = 0, label = 0;

	if (len && s[len - 1] == '.')
		len--;
	if (lead_dot_ok && len && s[0] == '.')
		s++, len--;
	if (len == 0 || len > DOMAIN_NAME_MAX)
		return -1;
	for (size_t i = 0; i < len; i++) {
		char c = lower(s[i]);
		if (c == '.') {
			if (label == 0)
				return -1;
			label = 0;
		} else if (!name_char(c) || ++label > 63) {
			return -1;
		}
		out[n++] = c;
	}
	if (label == 0)
		return -1;
	out[n] = 0;
	return (int)n;
}

int domain_name_normalize(const char *s, size_t len, char *out)
{
	return normalize(s, len, false, out);
}

/* ---- the table ---------------------------------------------------------------------------- */

static struct slot *probe(const struct domain_set *ds, uint64_t h, const char *s, size_t len)
{
	size_t mask = ds->nslots - 1;

	for (size_t i = h & mask;; i = (i + 1) & mask) {
		struct slot *sl = &ds->slots[i];
		if (sl->h == 0 ||
		    (sl->h == h && sl->len == len && memcmp(ds->arena + sl->off, s, len) == 0))
			return sl;
	}
}

static int grow(struct domain_set *ds)
{
	size_t n = ds->nslots ? ds->nslots * 2 : DS_MIN_SLOTS;
	struct slot *old = ds->slots, *nw = calloc(n, sizeof(*nw));
	size_t on = ds->nslots;

	if (!nw)
		return -ENOMEM;
	ds->slots = nw;
	ds->nslots = n;
	for (size_t i = 0; i < on; i++) {
		if (!old[i].h)
			continue;
		for (size_t j = old[i].h & (n - 1);; j = (j + 1) & (n - 1)) {
			if (!nw[j].h) {
				nw[j] = old[i];
				break;
			}
		}
	}
	free(old);
	return 0;
}

static int arena_put(struct domain_set *ds, const char *s, size_t len, uint32_t *off)
{
	if (ds->arena_len + len > UINT32_MAX)
		return -ENOMEM;
	if (ds->arena_len + len > ds->arena_cap) {
		size_t cap = ds->arena_cap ? ds->arena_cap * 2 : 4096;
		char *a;
		while (cap < ds->arena_len + len)
			cap *= 2;
		if (!(a = realloc(ds->arena, cap)))
			return -ENOMEM;
		ds->arena = a;
		ds->arena_cap = cap;
	}
	memcpy(ds->arena + ds->arena_len, s, len);
	*off = (uint32_t)ds->arena_len;
	ds->arena_len += len;
	return 0;
}

static int add_name(struct domain_set *ds, uint8_t flag, const char *s, size_t len, bool *dup)
{
	uint64_t h = hash_name(ds->key, s, len);
	struct slot *sl;
	int ret;

	if ((ds->used + 1) * 2 > ds->nslots && (ret = grow(ds)) != 0)
		return ret;
	sl = probe(ds, h, s, len);
	if (sl->h) {
		*dup = (sl->flags & flag) != 0;
		sl->flags |= flag;
	} else {
		if ((ret = arena_put(ds, s, len, &sl->off)) != 0)
			return ret;
		sl->h = h;
		sl->len = (uint8_t)len;
		sl->flags = flag;
		ds->used++;
		*dup = false;
	}
	if (!*dup) {
		if (flag == F_EXACT)
			ds->n_exact++;
		else
			ds->n_suffix++;
	}
	return 0;
}

/* ---- keywords and patterns ---------------------------------------------------------------- */

static int add_keyword(struct domain_set *ds, const char *s, size_t len, bool *dup)
{
	char low[DOMAIN_NAME_MAX + 1];
	int ret;

	if (len == 0 || len > DOMAIN_NAME_MAX)
		return -EINVAL;
	for (size_t i = 0; i < len; i++)
		if (!name_char(low[i] = lower(s[i])) && low[i] != '.')
			return -EINVAL;
	for (size_t i = 0; i < ds->nkeywords; i++)
		if (ds->keywords[i].len == len && !memcmp(ds->arena + ds->keywords[i].off, low, len)) {
			*dup = true;
			return 0;
		}
	if (ds->nkeywords == ds->keywords_cap) {
		size_t cap = ds->keywords_cap ? ds->keywords_cap * 2 : 8;
		struct text *k = realloc(ds->keywords, cap * sizeof(*k));
		if (!k)
			return -ENOMEM;
		ds->keywords = k;
		ds->keywords_cap = cap;
	}
	if ((ret = arena_put(ds, low, len, &ds->keywords[ds->nkeywords].off)) != 0)
		return ret;
	ds->keywords[ds->nkeywords++].len = (uint8_t)len;
	*dup = false;
	return 0;
}

static int add_regex(struct domain_set *ds, const char *s, size_t len, char *err, size_t errlen)
{
	int code;
	PCRE2_SIZE at;
	pcre2_code *re;

	if (ds->nregex == ds->regex_cap) {
		size_t cap = ds->regex_cap ? ds->regex_cap * 2 : 4;
		pcre2_code **r = realloc(ds->regex, cap * sizeof(*r));
		if (!r)
			return -ENOMEM;
		ds->regex = r;
		ds->regex_cap = cap;
	}
	re = pcre2_compile((PCRE2_SPTR)s, len, PCRE2_CASELESS | PCRE2_NO_UTF_CHECK, &code, &at,
			   NULL);
	if (!re) {
		PCRE2_UCHAR msg[120];
		pcre2_get_error_message(code, msg, sizeof(msg));
		if (err)
			snprintf(err, errlen, "regex at offset %zu: %s", (size_t)at, (char *)msg);
		return -EINVAL;
	}
	(void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT it still matches */
	ds->regex[ds->nregex++] = re;
	return 0;
}

/* ---- the API ------------------------------------------------------------------------------ */

int domain_set_new(struct domain_set **out)
{
	struct domain_set *ds = calloc(1, sizeof(*ds));

	if (!ds)
		return -ENOMEM;
	if (getrandom(&ds->key, sizeof(ds->key), GRND_NONBLOCK) != (ssize_t)sizeof(ds->key))
		ds->key = (uint64_t)(uintptr_t)ds * 0x9e3779b97f4a7c15ULL;
	ds->key ^= 0xcbf29ce484222325ULL; /* FNV-1a's offset basis, keyed */
	if (grow(ds) != 0) {
		free(ds);
		return -ENOMEM;
	}
	*out = ds;
	return 0;
}

int domain_set_set_key(struct domain_set *ds, uint64_t key)
{
	if (ds->used || ds->nkeywords || ds->nregex)
		return -EBUSY;
	ds->key = key ^ 0xcbf29ce484222325ULL;
	return 0;
}

void domain_set_free(struct domain_set *ds)
{
	if (!ds)
		return;
	for (size_t i = 0; i < ds->nregex; i++)
		pcre2_code_free(ds->regex[i]);
	free(ds->regex);
	free(ds->keywords);
	free(ds->arena);
	free(ds->slots);
	free(ds);
}

int domain_set_add(struct domain_set *ds, enum domain_kind kind, const char *s, size_t len,
		   bool *dup, char *err, size_t errlen)
{
	char name[DOMAIN_NAME_MAX + 1];
	bool d = false;
	int n, ret;

	switch (kind) {
	case DOMAIN_EXACT:
	case DOMAIN_SUFFIX:
		if ((n = normalize(s, len, kind == DOMAIN_SUFFIX, name)) < 0) {
			if (err)
				snprintf(err, errlen, "not a domain name: \"%.*s\"",
					 (int)(len > 64 ? 64 : len), s);
			return -EINVAL;
		}
		ret = add_name(ds, kind == DOMAIN_EXACT ? F_EXACT : F_SUFFIX, name, (size_t)n, &d);
		break;
	case DOMAIN_KEYWORD:
		if ((ret = add_keyword(ds, s, len, &d)) == -EINVAL && err)
			snprintf(err, errlen, "not a keyword of a name: \"%.*s\"",
				 (int)(len > 64 ? 64 : len), s);
		break;
	case DOMAIN_REGEX:
		ret = add_regex(ds, s, len, err, errlen);
		break;
	default:
		return -EINVAL;
	}
	if (dup)
		*dup = d;
	return ret;
}

bool domain_set_match(const struct domain_set *ds, const char *name, size_t len)
{
	char low[DOMAIN_NAME_MAX + 2];
	uint64_t h;

	if (len && name[len - 1] == '.')
		len--;
	if (len == 0 || len > DOMAIN_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		low[i] = lower(name[i]);
	low[len] = 0;
	/* Right to left: at each dot the state holds the hash of the suffix after it. */
	h = ds->key;
	for (size_t i = len; i-- > 0;) {
		if (low[i] == '.' && ds->n_suffix) {
			size_t n = len - i - 1;
			struct slot *sl = probe(ds, finish(h, n), low + i + 1, n);
			if (sl->h && (sl->flags & F_SUFFIX))
				return true;
		}
		h = step(h, (unsigned char)low[i]);
	}
	if (ds->n_exact || ds->n_suffix) {
		struct slot *sl = probe(ds, finish(h, len), low, len);
		if (sl->h)
			return true;
	}
	for (size_t i = 0; i < ds->nkeywords; i++)
		if (memmem(low, len, ds->arena + ds->keywords[i].off, ds->keywords[i].len))
			return true;
	for (size_t i = 0; i < ds->nregex; i++) {
		pcre2_match_data *md = pcre2_match_data_create_from_pattern(ds->regex[i], NULL);
		pcre2_match_context *mc = pcre2_match_context_create(NULL);
		int rc = -1;
		if (md && mc && pcre2_set_match_limit(mc, DS_MATCH_LIMIT) == 0)
			rc = pcre2_match(ds->regex[i], (PCRE2_SPTR)low, len, 0, 0, md, mc);
		pcre2_match_context_free(mc);
		pcre2_match_data_free(md);
		if (rc >= 0)
			return true;
	}
	return false;
}

size_t domain_set_count(const struct domain_set *ds, enum domain_kind kind)
{
	switch (kind) {
	case DOMAIN_EXACT: return ds->n_exact;
	case DOMAIN_SUFFIX: return ds->n_suffix;
	case DOMAIN_KEYWORD: return ds->nkeywords;
	case DOMAIN_REGEX: return ds->nregex;
	default: return 0;
	}
}

/* ---- loaders ------------------------------------------------------------------------------ */

static bool space(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* One entry; counts it. -ENOMEM only. */
static int load_one(struct domain_set *ds, enum domain_kind kind, const char *s, size_t len,
		    struct domain_load_stats *st)
{
	bool dup;
	int ret = domain_set_add(ds, kind, s, len, &dup, NULL, 0);

	if (ret == -ENOMEM)
		return ret;
	if (ret != 0)
		st->bad++;
	else if (dup)
		st->duplicates++;
	else
		st->added++;
	return 0;
}

static int load_v2fly(struct domain_set *ds, const char *s, size_t len,
		      struct domain_load_stats *st)
{
	static const struct {
		const char *prefix;
		enum domain_kind kind;
	} kinds[] = {
		{ "full:", DOMAIN_EXACT },       { "domain:", DOMAIN_SUFFIX },
		{ "keyword:", DOMAIN_KEYWORD }, { "regexp:", DOMAIN_REGEX },
	};
	const char *sp;

	if (len >= 8 && !memcmp(s, "include:", 8)) {
		st->includes++;
		return 0;
	}
	/* "name @attr @attr2": the attributes are ignored. */
	if ((sp = memchr(s, ' ', len)) || (sp = memchr(s, '\t', len))) {
		const char *a = sp;
		while (a < s + len && space(*a))
			a++;
		if (a < s + len && *a != '@') {
			st->bad++;
			return 0;
		}
		len = (size_t)(sp - s);
	}
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		size_t pl = strlen(kinds[i].prefix);
		if (len >= pl && !memcmp(s, kinds[i].prefix, pl))
			return load_one(ds, kinds[i].kind, s + pl, len - pl, st);
	}
	if (memchr(s, ':', len)) {
		st->bad++; /* an unknown type */
		return 0;
	}
	return load_one(ds, DOMAIN_SUFFIX, s, len, st);
}

/* "ADDRESS name [name...]": each name exactly. */
static int load_hosts(struct domain_set *ds, const char *s, size_t len,
		      struct domain_load_stats *st)
{
	const char *end = s + len, *p = s;
	int names = 0, ret;

	while (p < end && !space(*p))
		p++; /* the address */
	for (;;) {
		const char *t;
		while (p < end && space(*p))
			p++;
		if (p == end)
			break;
		t = p;
		while (p < end && !space(*p))
			p++;
		if ((ret = load_one(ds, DOMAIN_EXACT, t, (size_t)(p - t), st)) != 0)
			return ret;
		names++;
	}
	if (names == 0)
		st->bad++;
	return 0;
}

int domain_set_load(struct domain_set *ds, enum domain_format fmt, const char *buf, size_t len,
		    struct domain_load_stats *st)
{
	struct domain_load_stats local = { 0 };
	const char *p = buf, *end = buf + len;
	int ret = 0;

	if (!st)
		st = &local;
	while (p < end && ret == 0) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl ? nl : end, *hash = memchr(p, '#', (size_t)(e - p));
		const char *a = p, *b = hash ? hash : e;

		st->lines++;
		while (a < b && space(*a))
			a++;
		while (b > a && space(b[-1]))
			b--;
		if (a < b) {
			if (fmt == DOMAIN_FMT_PLAIN)
				ret = load_one(ds, DOMAIN_SUFFIX, a, (size_t)(b - a), st);
			else if (fmt == DOMAIN_FMT_HOSTS)
				ret = load_hosts(ds, a, (size_t)(b - a), st);
			else
				ret = load_v2fly(ds, a, (size_t)(b - a), st);
		}
		p = nl ? nl + 1 : end;
	}
	return ret;
}
