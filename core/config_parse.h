/* config_parse.h — the table-driven JSON walker behind config.c (internal to the config module).
 *
 * A schema object is a table of fields (key, kind, offset into the target struct, range). The
 * walker rejects non-objects, unknown and duplicate keys, parses the present fields in TABLE
 * order (so a table lists what others depend on first), then runs the table's check hook.
 * It tracks the JSON path ("$.outbounds[1].server") so every error names where it is.
 * Only the first error is kept: every function returns 0 or -EINVAL/-ENOMEM at once.
 */
#ifndef TS_CORE_CONFIG_PARSE_H
#define TS_CORE_CONFIG_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define CFGP_PATH_MAX 160
#define CFGP_MAX_FIELDS 32 /* fields per table: the present mask is a uint32_t */

struct cfgp {
	char *err;
	size_t errlen;
	char path[CFGP_PATH_MAX];
	size_t plen;
	void *user; /* the loader's state, for cross-references */
};

enum cfgp_kind {
	CFGP_U32,  /* uint32_t, integral JSON number in [min, max] */
	CFGP_U64,  /* uint64_t, integral JSON number in [min, max] (max <= 2^53) */
	CFGP_BOOL, /* bool */
	CFGP_ENUM, /* an enum (int-sized): one of names[], stored as base + index */
	CFGP_STR,  /* char[max + 1]: a string of min..max bytes, no control characters */
	CFGP_OBJ,  /* a nested object: sub table, target = the member at off */
	CFGP_FN,   /* fn(p, item, target) parses it */
};

struct cfgp;
struct cfgp_table;
typedef int (*cfgp_fn)(struct cfgp *p, const cJSON *item, void *target);
typedef int (*cfgp_check_fn)(struct cfgp *p, void *target, uint32_t present);

struct cfgp_field {
	const char *key;
	enum cfgp_kind kind;
	size_t off;
	uint64_t min, max;
	const char *const *names; /* CFGP_ENUM: NULL-terminated */
	int base;                 /* CFGP_ENUM */
	const struct cfgp_table *sub;
	cfgp_fn fn;
	size_t has_off;           /* offset + 1 of a bool set when the key is present; 0 = none */
};

struct cfgp_table {
	const struct cfgp_field *fields;
	size_t n;
	cfgp_check_fn check;      /* optional: after the fields, with the mask of present fields */
};

#define CFGP_TABLE(f, chk) { (f), sizeof(f) / sizeof((f)[0]), (chk) }
#define CFGP_PRESENT(mask, idx) (((mask) >> (idx)) & 1u)

void cfgp_init(struct cfgp *p, char *err, size_t errlen, void *user);

/* Path handling: push returns the previous length, pop restores it. */
size_t cfgp_push_key(struct cfgp *p, const char *key);
size_t cfgp_push_index(struct cfgp *p, size_t i);
void cfgp_pop(struct cfgp *p, size_t mark);
/* Set the path to "$" followed by the given suffix (e.g. ".tun.address"). */
void cfgp_set_path(struct cfgp *p, const char *suffix);

/* Write "config: <path>: <message>" into the error buffer; return -EINVAL. */
int cfgp_fail(struct cfgp *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same with key appended to the current path. */
int cfgp_fail_key(struct cfgp *p, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The same with a whole path ("$..."), ignoring the current one. */
int cfgp_fail_at(struct cfgp *p, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Out of memory: "config: out of memory"; returns -ENOMEM. */
int cfgp_nomem(struct cfgp *p);

/* Copy s for a message: at most 48 bytes, control characters as '?', "..." if cut. */
const char *cfgp_quote(const char *s, char *buf, size_t len);
/* "a string", "an object", ... for "expected X, got Y" messages. */
const char *cfgp_type_name(const cJSON *item);

/* Typed readers for custom fields; each fails naming the current path. */
int cfgp_uint(struct cfgp *p, const cJSON *item, uint64_t min, uint64_t max, uint64_t *out);
int cfgp_string(struct cfgp *p, const cJSON *item, size_t min, size_t max, const char **out);
/* One of names[] (NULL-terminated): *out = its index. */
int cfgp_enum(struct cfgp *p, const cJSON *item, const char *const *names, int *out);
/* An array of at most max elements (min 1 unless allow_empty); *n = its size. */
int cfgp_array(struct cfgp *p, const cJSON *item, size_t max, bool allow_empty, size_t *n);

/* Walk an object against a table, into target. present (may be NULL) gets the field mask. */
int cfgp_object(struct cfgp *p, const cJSON *item, const struct cfgp_table *t, void *target,
		uint32_t *present);

#endif
