/* stats_doc.c — the ordered key/value document and its JSON and Prometheus renderers.
 *
 * Storage: one array of nodes (index links, so growing it never invalidates anything) forming
 * the tree the dots describe, node 0 the root object, plus one text arena holding segment names,
 * full keys and string values. Nodes are appended in creation order and leaves are created in
 * insertion order, so the Prometheus renderer walks the array and the JSON renderer walks the
 * tree. Documents hold tens to a few hundred keys: the collision check scans the leaves.
 */
#include "core/stats_doc.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

enum vtype { V_OBJ, V_U64, V_I64, V_DBL, V_STR };

union value {
	uint64_t u;
	int64_t i;
	double f;
	uint32_t s;  /* V_STR: offset of the NUL-terminated value in text */
};

struct node {
	uint32_t name, name_len;      /* this segment, in text */
	uint32_t key;                 /* leaves: the full key, NUL-terminated, in text */
	uint32_t first, last, next;   /* objects: children; every node: next sibling */
	uint8_t type;                 /* enum vtype */
	uint8_t kind;                 /* enum stats_kind */
	union value v;
};

struct stats_doc {
	struct node *nodes;
	uint32_t n, cap;
	char *text;
	size_t tlen, tcap;
	size_t count;                 /* leaves */
	int error;
	char why[2 * STATS_KEY_MAX + 96];
};

/* ---- building ---- */

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t ncap = *cap ? *cap : 16;
	void *np;

	if (need <= *cap)
		return 0;
	while (ncap < need)
		ncap *= 2;
	if (!(np = realloc(*p, ncap * elem)))
		return -ENOMEM;
	*p = np;
	*cap = ncap;
	return 0;
}

/* Append n bytes and a NUL to the arena; *off receives where. */
static int push_text(struct stats_doc *d, const char *s, size_t n, uint32_t *off)
{
	if (d->tlen + n + 1 > UINT32_MAX || grow((void **)&d->text, &d->tcap, d->tlen + n + 1, 1))
		return -ENOMEM;
	memcpy(d->text + d->tlen, s, n);
	d->text[d->tlen + n] = '\0';
	*off = (uint32_t)d->tlen;
	d->tlen += n + 1;
	return 0;
}

/* A new node named s[0..n) as the last child of parent (NONE: the root itself). */
static int push_node(struct stats_doc *d, uint32_t parent, const char *s, size_t n,
		     uint32_t *idx)
{
	size_t cap = d->cap;
	struct node *nd;
	uint32_t name;

	if (d->n == NONE - 1 || push_text(d, s, n, &name) != 0)
		return -ENOMEM;
	if (grow((void **)&d->nodes, &cap, (size_t)d->n + 1, sizeof(*d->nodes)) != 0)
		return -ENOMEM;
	d->cap = (uint32_t)cap;
	nd = &d->nodes[d->n];
	*nd = (struct node){ .name = name, .name_len = (uint32_t)n, .key = NONE, .first = NONE,
			     .last = NONE, .next = NONE, .type = V_OBJ };
	*idx = d->n++;
	if (parent != NONE) {
		struct node *p = &d->nodes[parent];
		if (p->last == NONE)
			p->first = *idx;
		else
			d->nodes[p->last].next = *idx;
		p->last = *idx;
	}
	return 0;
}

struct stats_doc *stats_doc_new(void)
{
	struct stats_doc *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	stats_doc_reset(d);
	if (d->n != 1) {
		stats_doc_free(d);
		return NULL;
	}
	return d;
}

void stats_doc_free(struct stats_doc *d)
{
	if (!d)
		return;
	free(d->nodes);
	free(d->text);
	free(d);
}

void stats_doc_reset(struct stats_doc *d)
{
	uint32_t root;

	d->n = 0;
	d->tlen = 0;
	d->count = 0;
	d->error = 0;
	d->why[0] = '\0';
	(void)push_node(d, NONE, "", 0, &root); /* fails only with ENOMEM: new() checks */
}

static int refuse(struct stats_doc *d, int ret, const char *key, const char *reason)
{
	if (d->error == 0) {
		d->error = ret;
		snprintf(d->why, sizeof(d->why), "stats: key \"%.*s\": %s", STATS_KEY_MAX, key,
			 reason);
	}
	return ret;
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_word(char c)
{
	return is_alpha(c) || (c >= '0' && c <= '9') || c == '_';
}

/* NULL if key is well formed, else the reason. */
static const char *key_problem(const char *key)
{
	size_t len = strnlen(key, STATS_KEY_MAX + 1);

	if (len == 0)
		return "empty";
	if (len > STATS_KEY_MAX)
		return "too long";
	if (!is_alpha(key[0]))
		return "must start with a letter";
	for (size_t i = 0; i < len; i++) {
		if (key[i] == '.') {
			if (key[i + 1] == '.' || key[i + 1] == '\0')
				return "empty segment";
		} else if (!is_word(key[i])) {
			return "only letters, digits, '_' and '.' are allowed";
		}
	}
	return NULL;
}

/* a and b name the same metric once dots become underscores. */
static bool same_metric(const char *a, const char *b)
{
	for (; *a && *b; a++, b++)
		if (*a != *b && !((*a == '.' || *a == '_') && (*b == '.' || *b == '_')))
			return false;
	return *a == *b;
}

/* The earlier key that maps to the same metric name as key, or NULL. */
static const char *metric_taken(const struct stats_doc *d, const char *key)
{
	for (uint32_t i = 1; i < d->n; i++)
		if (d->nodes[i].type != V_OBJ && same_metric(d->text + d->nodes[i].key, key))
			return d->text + d->nodes[i].key;
	return NULL;
}

static uint32_t find_child(const struct stats_doc *d, uint32_t obj, const char *s, size_t n)
{
	for (uint32_t c = d->nodes[obj].first; c != NONE; c = d->nodes[c].next)
		if (d->nodes[c].name_len == n && memcmp(d->text + d->nodes[c].name, s, n) == 0)
			return c;
	return NONE;
}

/* Walk/create the objects along key and create its leaf. Nothing is created before every
 * conflict is ruled out: a conflict is always met on an existing node, and once a node is new
 * everything below it is new too. */
static int insert(struct stats_doc *d, const char *key, uint32_t *leaf)
{
	uint32_t cur = 0, c;
	const char *seg = key;

	for (;;) {
		const char *dot = strchr(seg, '.');
		size_t n = dot ? (size_t)(dot - seg) : strlen(seg);

		c = find_child(d, cur, seg, n);
		if (c != NONE && !dot)
			return refuse(d, -EEXIST, key, d->nodes[c].type == V_OBJ ?
				      "already an object (longer keys start with it)" :
				      "already present");
		if (c != NONE && d->nodes[c].type != V_OBJ)
			return refuse(d, -EEXIST, key, "a prefix of it is already a value");
		if (c == NONE && push_node(d, cur, seg, n, &c) != 0)
			return refuse(d, -ENOMEM, key, "out of memory");
		if (!dot)
			break;
		cur = c;
		seg = dot + 1;
	}
	*leaf = c;
	return 0;
}

/* Append key = v; for V_STR, str is the value (copied). */
static int add(struct stats_doc *d, const char *key, enum vtype type, enum stats_kind kind,
	       union value v, const char *str)
{
	const char *why = key_problem(key), *other;
	char reason[STATS_KEY_MAX + 48];
	uint32_t leaf = 0, koff = 0;
	int ret;

	if (why)
		return refuse(d, -EINVAL, key, why);
	if (type != V_STR && same_metric(key, "info"))
		return refuse(d, -EINVAL, key, "reserved for the info metric");
	if ((other = metric_taken(d, key)) != NULL) {
		if (strcmp(other, key) == 0)
			return refuse(d, -EEXIST, key, "already present");
		snprintf(reason, sizeof(reason), "same metric name as \"%s\"", other);
		return refuse(d, -EEXIST, key, reason);
	}
	/* Text first: once the leaf exists nothing may fail, so no half-made value is left. */
	if ((type == V_STR && push_text(d, str, strlen(str), &v.s) != 0) ||
	    push_text(d, key, strlen(key), &koff) != 0)
		return refuse(d, -ENOMEM, key, "out of memory");
	if ((ret = insert(d, key, &leaf)) != 0)
		return ret;
	d->nodes[leaf].key = koff;
	d->nodes[leaf].type = (uint8_t)type;
	d->nodes[leaf].kind = (uint8_t)kind;
	d->nodes[leaf].v = v;
	d->count++;
	return 0;
}

int stats_doc_add_u64(struct stats_doc *d, const char *key, enum stats_kind kind, uint64_t v)
{
	return add(d, key, V_U64, kind, (union value){ .u = v }, NULL);
}

int stats_doc_add_i64(struct stats_doc *d, const char *key, enum stats_kind kind, int64_t v)
{
	return add(d, key, V_I64, kind, (union value){ .i = v }, NULL);
}

int stats_doc_add_double(struct stats_doc *d, const char *key, enum stats_kind kind, double v)
{
	return add(d, key, V_DBL, kind, (union value){ .f = v }, NULL);
}

int stats_doc_add_str(struct stats_doc *d, const char *key, const char *v)
{
	return add(d, key, V_STR, STATS_GAUGE, (union value){ .s = 0 }, v ? v : "");
}

int stats_doc_error(const struct stats_doc *d, const char **why)
{
	if (why)
		*why = d->why;
	return d->error;
}

size_t stats_doc_count(const struct stats_doc *d)
{
	return d->count;
}

/* ---- rendering ---- */

/* A growable output string; after an allocation failure every put is a no-op. */
struct sb {
	char *p;
	size_t len, cap;
	bool oom;
};

static void sb_put(struct sb *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (grow((void **)&b->p, &b->cap, b->len + n + 1, 1) != 0) {
		b->oom = true;
		return;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_puts(struct sb *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

static int sb_finish(struct sb *b, char **out, size_t *len)
{
	if (!b->oom && !b->p)
		sb_put(b, "", 0);
	if (b->oom) {
		free(b->p);
		*out = NULL;
		*len = 0;
		return -ENOMEM;
	}
	*out = b->p;
	*len = b->len;
	return 0;
}

/* Length of the well-formed UTF-8 sequence at s (n bytes available), 0 if ill-formed
 * (RFC 3629 section 4: no overlongs, no surrogates, nothing above U+10FFFF). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0], lo = 0x80, hi = 0xBF;
	size_t len;

	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		lo = c == 0xE0 ? 0xA0 : 0x80;
		hi = c == 0xED ? 0x9F : 0xBF;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		lo = c == 0xF0 ? 0x90 : 0x80;
		hi = c == 0xF4 ? 0x8F : 0xBF;
	} else {
		return 0;
	}
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if ((s[i] & 0xC0) != 0x80)
			return 0;
	return len;
}

#define REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD in UTF-8 */

/* A JSON string (RFC 8259 section 7) from n bytes at s. */
static void json_string(struct sb *b, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	char esc[8];

	sb_put(b, "\"", 1);
	for (size_t i = 0; i < n;) {
		size_t k = utf8_len(p + i, n - i);
		if (k == 0) {
			sb_puts(b, REPLACEMENT);
			i++;
			continue;
		}
		if (p[i] == '"' || p[i] == '\\') {
			esc[0] = '\\';
			esc[1] = (char)p[i];
			sb_put(b, esc, 2);
		} else if (p[i] < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", p[i]);
			sb_puts(b, esc);
		} else {
			sb_put(b, s + i, k);
		}
		i += k;
	}
	sb_put(b, "\"", 1);
}

/* Shortest of %.15g..%.17g that reads back as the same double. */
static void fmt_double(char *buf, size_t len, double v)
{
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, len, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
}

/* A number as text. For JSON, NaN and infinities have no spelling: null. */
static void put_number(struct sb *b, const struct node *nd, bool json)
{
	char buf[40];

	if (nd->type == V_U64) {
		snprintf(buf, sizeof(buf), "%llu", (unsigned long long)nd->v.u);
	} else if (nd->type == V_I64) {
		snprintf(buf, sizeof(buf), "%lld", (long long)nd->v.i);
	} else if (isnan(nd->v.f)) {
		snprintf(buf, sizeof(buf), "%s", json ? "null" : "NaN");
	} else if (isinf(nd->v.f)) {
		snprintf(buf, sizeof(buf), "%s", json ? "null" : nd->v.f > 0 ? "+Inf" : "-Inf");
	} else {
		fmt_double(buf, sizeof(buf), nd->v.f);
	}
	sb_puts(b, buf);
}

/* Depth is bounded by the key length (at most STATS_KEY_MAX / 2 levels). */
static void json_object(const struct stats_doc *d, uint32_t obj, struct sb *b)
{
	sb_put(b, "{", 1);
	for (uint32_t c = d->nodes[obj].first; c != NONE; c = d->nodes[c].next) {
		const struct node *nd = &d->nodes[c];
		if (c != d->nodes[obj].first)
			sb_put(b, ",", 1);
		json_string(b, d->text + nd->name, nd->name_len);
		sb_put(b, ":", 1);
		if (nd->type == V_OBJ)
			json_object(d, c, b);
		else if (nd->type == V_STR)
			json_string(b, d->text + nd->v.s, strlen(d->text + nd->v.s));
		else
			put_number(b, nd, true);
	}
	sb_put(b, "}", 1);
}

int stats_doc_json(const struct stats_doc *d, char **out, size_t *len)
{
	struct sb b = { 0 };

	json_object(d, 0, &b);
	sb_put(&b, "\n", 1);
	return sb_finish(&b, out, len);
}

/* STATS_PROM_PREFIX + key with dots as underscores (also a valid label name without the
 * prefix when prefix is false). */
static void prom_name(struct sb *b, const char *key, bool prefix)
{
	if (prefix)
		sb_puts(b, STATS_PROM_PREFIX);
	for (const char *p = key; *p; p++)
		sb_put(b, *p == '.' ? "_" : p, 1);
}

/* A label value: backslash, double quote and newline escaped (exposition format 0.0.4);
 * ill-formed UTF-8 replaced. */
static void prom_label_value(struct sb *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n = strlen(s);

	for (size_t i = 0; i < n;) {
		size_t k = utf8_len(p + i, n - i);
		if (k == 0) {
			sb_puts(b, REPLACEMENT);
			i++;
			continue;
		}
		if (p[i] == '\\')
			sb_puts(b, "\\\\");
		else if (p[i] == '"')
			sb_puts(b, "\\\"");
		else if (p[i] == '\n')
			sb_puts(b, "\\n");
		else
			sb_put(b, s + i, k);
		i += k;
	}
}

/* All string values as the labels of one info sample. */
static void prom_info(const struct stats_doc *d, struct sb *b)
{
	bool first = true;

	for (uint32_t i = 1; i < d->n; i++) {
		const struct node *nd = &d->nodes[i];
		if (nd->type != V_STR)
			continue;
		if (first) {
			sb_puts(b, "# TYPE " STATS_PROM_PREFIX "info gauge\n");
			sb_puts(b, STATS_PROM_PREFIX "info{");
		} else {
			sb_put(b, ",", 1);
		}
		first = false;
		prom_name(b, d->text + nd->key, false);
		sb_puts(b, "=\"");
		prom_label_value(b, d->text + nd->v.s);
		sb_put(b, "\"", 1);
	}
	if (!first)
		sb_puts(b, "} 1\n");
}

int stats_doc_prometheus(const struct stats_doc *d, char **out, size_t *len)
{
	struct sb b = { 0 };

	prom_info(d, &b);
	for (uint32_t i = 1; i < d->n; i++) {
		const struct node *nd = &d->nodes[i];
		if (nd->type == V_OBJ || nd->type == V_STR)
			continue;
		sb_puts(&b, "# TYPE ");
		prom_name(&b, d->text + nd->key, true);
		sb_puts(&b, nd->kind == STATS_COUNTER ? " counter\n" : " gauge\n");
		prom_name(&b, d->text + nd->key, true);
		sb_put(&b, " ", 1);
		put_number(&b, nd, false);
		sb_put(&b, "\n", 1);
	}
	return sb_finish(&b, out, len);
}
