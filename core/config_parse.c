/* config_parse.c — the table-driven JSON walker: typed fields, paths, one-line errors. */
#include "core/config_parse.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void cfgp_init(struct cfgp *p, char *err, size_t errlen, void *user)
{
	memset(p, 0, sizeof(*p));
	p->err = err;
	p->errlen = errlen;
	p->user = user;
	cfgp_set_path(p, "");
	if (err && errlen > 0)
		err[0] = '\0';
}

/* Append text to the path; a path that no longer fits ends in "..." (messages stay one line). */
static void path_append(struct cfgp *p, const char *text)
{
	size_t room = sizeof(p->path) - p->plen;
	int n = snprintf(p->path + p->plen, room, "%s", text);

	if (n < 0 || (size_t)n >= room) {
		memcpy(p->path + sizeof(p->path) - 4, "...", 4);
		p->plen = sizeof(p->path) - 1;
		return;
	}
	p->plen += (size_t)n;
}

size_t cfgp_push_key(struct cfgp *p, const char *key)
{
	size_t mark = p->plen;
	char buf[64];

	path_append(p, ".");
	path_append(p, cfgp_quote(key, buf, sizeof(buf)));
	return mark;
}

size_t cfgp_push_index(struct cfgp *p, size_t i)
{
	size_t mark = p->plen;
	char buf[32];

	snprintf(buf, sizeof(buf), "[%zu]", i);
	path_append(p, buf);
	return mark;
}

void cfgp_pop(struct cfgp *p, size_t mark)
{
	p->plen = mark;
	p->path[mark] = '\0';
}

void cfgp_set_path(struct cfgp *p, const char *suffix)
{
	p->plen = 0;
	path_append(p, "$");
	path_append(p, suffix);
}

static int vfail(struct cfgp *p, const char *fmt, va_list ap)
{
	int n;

	if (!p->err || p->errlen == 0)
		return -EINVAL;
	n = snprintf(p->err, p->errlen, "config: %s: ", p->path);
	if (n >= 0 && (size_t)n < p->errlen)
		vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
	/* One line, whatever went into the message. */
	for (char *c = p->err; *c; c++)
		if (*c == '\n' || *c == '\r')
			*c = ' ';
	return -EINVAL;
}

int cfgp_fail(struct cfgp *p, const char *fmt, ...)
{
	va_list ap;
	int ret;

	va_start(ap, fmt);
	ret = vfail(p, fmt, ap);
	va_end(ap);
	return ret;
}

int cfgp_fail_key(struct cfgp *p, const char *key, const char *fmt, ...)
{
	va_list ap;
	int ret;
	size_t mark = cfgp_push_key(p, key);

	va_start(ap, fmt);
	ret = vfail(p, fmt, ap);
	va_end(ap);
	cfgp_pop(p, mark);
	return ret;
}

int cfgp_fail_at(struct cfgp *p, const char *path, const char *fmt, ...)
{
	va_list ap;
	int ret;

	p->plen = 0;
	path_append(p, path);
	va_start(ap, fmt);
	ret = vfail(p, fmt, ap);
	va_end(ap);
	return ret;
}

int cfgp_nomem(struct cfgp *p)
{
	if (p->err && p->errlen > 0)
		snprintf(p->err, p->errlen, "config: out of memory");
	return -ENOMEM;
}

const char *cfgp_quote(const char *s, char *buf, size_t len)
{
	const size_t limit = 48;
	size_t i = 0, n = 0;

	if (len == 0)
		return buf;
	for (; s[i] != '\0' && n + 1 < len && i < limit; i++, n++) {
		unsigned char c = (unsigned char)s[i];
		buf[n] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	buf[n] = '\0';
	if (s[i] != '\0' && len >= 4) {
		size_t at = n + 3 < len ? n : len - 4;
		memcpy(buf + at, "...", 4);
	}
	return buf;
}

const char *cfgp_type_name(const cJSON *item)
{
	if (cJSON_IsObject(item))
		return "an object";
	if (cJSON_IsArray(item))
		return "an array";
	if (cJSON_IsString(item))
		return "a string";
	if (cJSON_IsNumber(item))
		return "a number";
	if (cJSON_IsBool(item))
		return "a boolean";
	if (cJSON_IsNull(item))
		return "null";
	return "something else";
}

int cfgp_uint(struct cfgp *p, const cJSON *item, uint64_t min, uint64_t max, uint64_t *out)
{
	double d;

	if (!cJSON_IsNumber(item))
		return cfgp_fail(p, "expected an integer, got %s", cfgp_type_name(item));
	d = item->valuedouble;
	if (!isfinite(d) || d != floor(d))
		return cfgp_fail(p, "expected an integer, got %.17g", d);
	/* Compare as doubles first: a huge value must not be converted to uint64_t. */
	if (d < (double)min || d > (double)max)
		return cfgp_fail(p, "must be between %llu and %llu, got %.17g",
				 (unsigned long long)min, (unsigned long long)max, d);
	*out = (uint64_t)d;
	if (*out < min || *out > max) /* max near 2^64 rounds as a double */
		return cfgp_fail(p, "must be between %llu and %llu, got %.17g",
				 (unsigned long long)min, (unsigned long long)max, d);
	return 0;
}

int cfgp_string(struct cfgp *p, const cJSON *item, size_t min, size_t max, const char **out)
{
	const char *s;
	size_t n;

	if (!cJSON_IsString(item) || !item->valuestring)
		return cfgp_fail(p, "expected a string, got %s", cfgp_type_name(item));
	s = item->valuestring;
	n = strlen(s);
	if (n < min || n > max) {
		if (min == max)
			return cfgp_fail(p, "must be %zu bytes long, got %zu", min, n);
		return cfgp_fail(p, "must be %zu to %zu bytes long, got %zu", min, max, n);
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			return cfgp_fail(p, "contains a control character");
	}
	*out = s;
	return 0;
}

int cfgp_array(struct cfgp *p, const cJSON *item, size_t max, bool allow_empty, size_t *n)
{
	size_t count = 0;
	const cJSON *e;

	if (!cJSON_IsArray(item))
		return cfgp_fail(p, "expected an array, got %s", cfgp_type_name(item));
	cJSON_ArrayForEach(e, item)
	{
		if (++count > max)
			return cfgp_fail(p, "too many entries (at most %zu)", max);
	}
	if (count == 0 && !allow_empty)
		return cfgp_fail(p, "must not be empty");
	*n = count;
	return 0;
}

int cfgp_enum(struct cfgp *p, const cJSON *item, const char *const *names, int *out)
{
	char list[160], q[64];
	size_t used = 0;
	const char *s;

	if (!cJSON_IsString(item) || !item->valuestring)
		return cfgp_fail(p, "expected a string, got %s", cfgp_type_name(item));
	s = item->valuestring;
	for (int i = 0; names[i]; i++) {
		if (strcmp(s, names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	list[0] = '\0';
	for (int i = 0; names[i] && used < sizeof(list); i++) {
		int n = snprintf(list + used, sizeof(list) - used, "%s\"%s\"", i ? ", " : "",
				 names[i]);
		if (n < 0)
			break;
		used += (size_t)n;
	}
	return cfgp_fail(p, "expected one of %s, got \"%s\"", list, cfgp_quote(s, q, sizeof(q)));
}

static int parse_field(struct cfgp *p, const cJSON *item, const struct cfgp_field *f,
		       void *target)
{
	char *at = (char *)target + f->off;
	uint64_t v;
	const char *s;
	int ret, e;

	switch (f->kind) {
	case CFGP_U32:
	case CFGP_U64:
		if ((ret = cfgp_uint(p, item, f->min, f->max, &v)) != 0)
			return ret;
		if (f->kind == CFGP_U32) {
			uint32_t v32 = (uint32_t)v;
			memcpy(at, &v32, sizeof(v32));
		} else {
			memcpy(at, &v, sizeof(v));
		}
		return 0;
	case CFGP_BOOL:
		if (!cJSON_IsBool(item))
			return cfgp_fail(p, "expected true or false, got %s", cfgp_type_name(item));
		*(bool *)at = cJSON_IsTrue(item);
		return 0;
	case CFGP_ENUM:
		if ((ret = cfgp_enum(p, item, f->names, &e)) != 0)
			return ret;
		e += f->base;
		memcpy(at, &e, sizeof(e));
		return 0;
	case CFGP_STR:
		if ((ret = cfgp_string(p, item, (size_t)f->min, (size_t)f->max, &s)) != 0)
			return ret;
		memcpy(at, s, strlen(s) + 1);
		return 0;
	case CFGP_OBJ:
		return cfgp_object(p, item, f->sub, at, NULL);
	case CFGP_FN:
		return f->fn(p, item, target);
	}
	return cfgp_fail(p, "internal error: bad field kind");
}

static int find_field(const struct cfgp_table *t, const char *key)
{
	for (size_t i = 0; i < t->n; i++)
		if (strcmp(t->fields[i].key, key) == 0)
			return (int)i;
	return -1;
}

/* Every key known and given once. */
static int check_keys(struct cfgp *p, const cJSON *item, const struct cfgp_table *t)
{
	uint32_t seen = 0;
	const cJSON *c;

	cJSON_ArrayForEach(c, item)
	{
		int idx = find_field(t, c->string ? c->string : "");
		if (idx < 0)
			return cfgp_fail_key(p, c->string ? c->string : "", "unknown key");
		if (CFGP_PRESENT(seen, idx))
			return cfgp_fail_key(p, c->string, "duplicate key");
		seen |= 1u << idx;
	}
	return 0;
}

int cfgp_object(struct cfgp *p, const cJSON *item, const struct cfgp_table *t, void *target,
		uint32_t *present)
{
	uint32_t mask = 0;
	int ret;

	if (!cJSON_IsObject(item))
		return cfgp_fail(p, "expected an object, got %s", cfgp_type_name(item));
	if ((ret = check_keys(p, item, t)) != 0)
		return ret;
	for (size_t i = 0; i < t->n; i++) {
		const struct cfgp_field *f = &t->fields[i];
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, f->key);
		if (!v)
			continue;
		size_t mark = cfgp_push_key(p, f->key);
		ret = parse_field(p, v, f, target);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		if (f->has_off)
			*(bool *)((char *)target + f->has_off - 1) = true;
		mask |= 1u << i;
	}
	if (present)
		*present = mask;
	return t->check ? t->check(p, target, mask) : 0;
}
