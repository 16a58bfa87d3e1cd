/* config_names.c — the configuration's name matchers: "rule_sets" (files of names read and
 * loaded into domain sets while the configuration loads, so a reload reads them again), the
 * name keys of a rule and their rule_set tags resolved at validation, and the match itself.
 */
#include "core/config_names.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/domain_set.h"

/* In enum domain_format order. */
static const char *const format_names[] = { "plain", "hosts", "v2fly", NULL };
_Static_assert(DOMAIN_FMT_PLAIN == 0 && DOMAIN_FMT_HOSTS == 1 && DOMAIN_FMT_V2FLY == 2,
	       "format_names matches enum domain_format");
_Static_assert(sizeof(enum domain_format) == sizeof(int), "CFGP_ENUM stores an int");

/* ---- reading a rule-set file -------------------------------------------------------------- */

/* Read a regular file of at most TS_RULE_SET_FILE_MAX bytes into *out (malloc'd). 0, or
 * -errno with why filled. O_NONBLOCK: a FIFO given as a path must not hang the load. */
static int read_set_file(const char *path, char **out, size_t *out_len, char *why, size_t wlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	size_t len = 0, cap;
	char *buf = NULL, *nb;
	struct stat st;
	ssize_t n;
	int ret = 0;

	if (fd < 0 || fstat(fd, &st) != 0) {
		ret = -errno;
		goto fail_errno;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, wlen, "not a regular file");
		ret = -EINVAL;
		goto out;
	}
	if ((uint64_t)st.st_size > TS_RULE_SET_FILE_MAX)
		goto too_big;
	/* One byte more than its size: a file that grew is still read to its end (bounded). */
	cap = (size_t)st.st_size + 1;
	if (!(buf = malloc(cap))) {
		ret = -ENOMEM;
		goto out;
	}
	for (;;) {
		if (len == cap) {
			if (cap > TS_RULE_SET_FILE_MAX)
				goto too_big;
			cap = cap > (TS_RULE_SET_FILE_MAX + 1) / 2 ? TS_RULE_SET_FILE_MAX + 1 : cap * 2;
			if (!(nb = realloc(buf, cap))) {
				ret = -ENOMEM;
				goto out;
			}
			buf = nb;
		}
		if ((n = read(fd, buf + len, cap - len)) < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			goto fail_errno;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	if (len > TS_RULE_SET_FILE_MAX)
		goto too_big;
	close(fd);
	*out = buf;
	*out_len = len;
	return 0;
too_big:
	snprintf(why, wlen, "larger than %u MiB", TS_RULE_SET_FILE_MAX >> 20);
	ret = -EFBIG;
	goto out;
fail_errno: {
	char ebuf[128];
	snprintf(why, wlen, "%s", strerror_r(-ret, ebuf, sizeof(ebuf)));
}
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return ret;
}

static uint32_t elapsed_ms(const struct timespec *a, const struct timespec *b)
{
	int64_t ns = (int64_t)(b->tv_sec - a->tv_sec) * 1000000000 + (b->tv_nsec - a->tv_nsec);

	return ns > 0 ? (uint32_t)(ns / 1000000) : 0;
}

/* Read rs->path and load it in rs->format. A file that cannot be read, or whose lines were all
 * bad (most likely the wrong format), is an error on "path"; bad lines next to good ones are
 * counted, not fatal. */
static int rule_set_load(struct cfgp *p, struct ts_rule_set *rs)
{
	struct timespec t0, t1;
	char why[160];
	char *buf = NULL;
	size_t len = 0;
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if ((ret = read_set_file(rs->path, &buf, &len, why, sizeof(why))) != 0)
		return ret == -ENOMEM ? cfgp_nomem(p)
				      : cfgp_fail_key(p, "path", "cannot read %s: %s", rs->path, why);
	if (domain_set_new(&rs->set) != 0 ||
	    domain_set_load(rs->set, rs->format, buf, len, &rs->stats) != 0) {
		free(buf);
		return cfgp_nomem(p);
	}
	free(buf);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	rs->load_ms = elapsed_ms(&t0, &t1);
	if (rs->stats.added == 0 && rs->stats.bad + rs->stats.includes > 0)
		return cfgp_fail_key(p, "path",
				     "%s: no valid entry (%llu bad lines): is \"format\": \"%s\" "
				     "right?",
				     rs->path,
				     (unsigned long long)(rs->stats.bad + rs->stats.includes),
				     format_names[rs->format]);
	return 0;
}

/* ---- "rule_sets" -------------------------------------------------------------------------- */

enum { RS_TAG, RS_FORMAT, RS_PATH };

static int f_path(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_rule_set *rs = target;
	const char *s;
	int ret;

	if ((ret = cfgp_string(p, item, 1, TS_PATH_MAX, &s)) != 0)
		return ret;
	if (!(rs->path = strdup(s)))
		return cfgp_nomem(p);
	return 0;
}

static int check_rule_set(struct cfgp *p, void *target, uint32_t present)
{
	if (!CFGP_PRESENT(present, RS_TAG))
		return cfgp_fail_key(p, "tag", "required: the name rules give this set");
	if (!CFGP_PRESENT(present, RS_FORMAT))
		return cfgp_fail_key(p, "format", "required: \"plain\", \"hosts\" or \"v2fly\"");
	if (!CFGP_PRESENT(present, RS_PATH))
		return cfgp_fail_key(p, "path", "required: the file to load");
	return rule_set_load(p, target);
}

static const struct cfgp_field rule_set_fields[] = {
	[RS_TAG] = { .key = "tag", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
		     .off = offsetof(struct ts_rule_set, tag) },
	[RS_FORMAT] = { .key = "format", .kind = CFGP_ENUM, .names = format_names,
			.off = offsetof(struct ts_rule_set, format) },
	[RS_PATH] = { .key = "path", .kind = CFGP_FN, .fn = f_path },
};
static const struct cfgp_table rule_set_table = CFGP_TABLE(rule_set_fields, check_rule_set);

int config_rule_sets_parse(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_config *cfg = target;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, TS_MAX_RULE_SETS, true, &n)) != 0)
		return ret;
	if (n == 0)
		return 0;
	if (!(cfg->rule_sets = calloc(n, sizeof(*cfg->rule_sets))))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		cfg->n_rule_sets = i + 1; /* owned by cfg from here on, even if it fails */
		ret = cfgp_object(p, e, &rule_set_table, &cfg->rule_sets[i], NULL);
		for (size_t j = 0; ret == 0 && j < i; j++)
			if (strcmp(cfg->rule_sets[j].tag, cfg->rule_sets[i].tag) == 0)
				ret = cfgp_fail_key(p, "tag", "\"%s\" is the tag of rule_sets[%zu] too",
						    cfg->rule_sets[i].tag, j);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		i++;
	}
	return 0;
}

void config_rule_sets_fini(struct ts_config *cfg)
{
	for (size_t i = 0; i < cfg->n_rule_sets; i++) {
		free(cfg->rule_sets[i].path);
		domain_set_free(cfg->rule_sets[i].set);
	}
	free(cfg->rule_sets);
	cfg->rule_sets = NULL;
	cfg->n_rule_sets = 0;
}

int config_rule_set_index(const struct ts_config *cfg, const char *tag)
{
	for (size_t i = 0; i < cfg->n_rule_sets; i++)
		if (strcmp(cfg->rule_sets[i].tag, tag) == 0)
			return (int)i;
	return -1;
}

/* ---- a rule's name keys ------------------------------------------------------------------- */

static int parse_one_name(struct cfgp *p, const cJSON *e, enum domain_kind kind,
			  struct ts_names *m)
{
	char err[160] = "";
	int ret;

	if (!cJSON_IsString(e))
		return cfgp_fail(p, "expected a string, got %s", cfgp_type_name(e));
	ret = domain_set_add(m->own, kind, e->valuestring, strlen(e->valuestring), NULL, err,
			     sizeof(err));
	if (ret == -ENOMEM)
		return cfgp_nomem(p);
	return ret != 0 ? cfgp_fail(p, "%s", err) : 0;
}

static int parse_one_tag(struct cfgp *p, const cJSON *e, struct ts_names *m)
{
	const char *s;
	int ret;

	if ((ret = cfgp_string(p, e, 1, TS_TAG_MAX, &s)) != 0)
		return ret;
	for (size_t j = 0; j < m->n_sets; j++)
		if (strcmp(m->set_tags[j], s) == 0)
			return cfgp_fail(p, "\"%s\" is listed twice", s);
	memcpy(m->set_tags[m->n_sets], s, strlen(s) + 1);
	m->n_sets++;
	return 0;
}

static const enum domain_kind key_kind[] = {
	[CONFIG_NAMES_DOMAIN] = DOMAIN_EXACT,
	[CONFIG_NAMES_SUFFIX] = DOMAIN_SUFFIX,
	[CONFIG_NAMES_KEYWORD] = DOMAIN_KEYWORD,
	[CONFIG_NAMES_REGEX] = DOMAIN_REGEX,
};

int config_names_parse(struct cfgp *p, const cJSON *item, enum config_names_key key,
		       struct ts_names *m)
{
	bool tags = key == CONFIG_NAMES_RULE_SET;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, tags ? TS_MAX_RULE_SETS : TS_MAX_RULE_ITEMS, false, &n)) != 0)
		return ret;
	if (tags && (!(m->set_tags = calloc(n, sizeof(*m->set_tags))) ||
		     !(m->sets = calloc(n, sizeof(*m->sets)))))
		return cfgp_nomem(p);
	if (!tags && !m->own && domain_set_new(&m->own) != 0)
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i++);
		ret = tags ? parse_one_tag(p, e, m) : parse_one_name(p, e, key_kind[key], m);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
	}
	return 0;
}

int config_names_resolve(struct cfgp *p, const struct ts_config *cfg, struct ts_names *m)
{
	for (size_t i = 0; i < m->n_sets; i++) {
		int idx = config_rule_set_index(cfg, m->set_tags[i]);
		if (idx < 0) {
			cfgp_push_key(p, "rule_set");
			cfgp_push_index(p, i);
			return cfgp_fail(p, "no rule set is tagged \"%s\" (rule_sets defines %zu)",
					 m->set_tags[i], cfg->n_rule_sets);
		}
		m->sets[i] = (uint32_t)idx;
	}
	return 0;
}

void config_names_fini(struct ts_names *m)
{
	domain_set_free(m->own);
	free(m->set_tags);
	free(m->sets);
	memset(m, 0, sizeof(*m));
}

/* ---- matching and reports ----------------------------------------------------------------- */

bool config_names_match(const struct ts_rule_set *sets, const struct ts_names *m,
			const char *name, size_t len)
{
	if (!name)
		return false;
	if (m->own && domain_set_match(m->own, name, len))
		return true;
	for (size_t i = 0; i < m->n_sets; i++)
		if (domain_set_match(sets[m->sets[i]].set, name, len))
			return true;
	return false;
}

void config_log_rule_sets(const struct ts_config *cfg, struct log *log)
{
	for (size_t i = 0; i < cfg->n_rule_sets; i++) {
		const struct ts_rule_set *rs = &cfg->rule_sets[i];
		log_info(log, "rule set \"%s\": %llu entries, %llu bad lines, %u ms (%s %s)", rs->tag,
			 (unsigned long long)rs->stats.added, (unsigned long long)rs->stats.bad,
			 rs->load_ms, format_names[rs->format], rs->path);
	}
}

void config_rule_sets_summary(const struct ts_config *cfg, char *buf, size_t len)
{
	size_t used = 0;
	int n;

	buf[0] = '\0';
	if (cfg->n_rule_sets == 0)
		return;
	n = snprintf(buf, len, " rule_sets=%zu [", cfg->n_rule_sets);
	for (size_t i = 0; n > 0 && (used += (size_t)n) < len && i < cfg->n_rule_sets; i++) {
		const struct ts_rule_set *rs = &cfg->rule_sets[i];
		n = snprintf(buf + used, len - used, "%s%s: %llu entries, %llu bad lines, %u ms",
			     i ? "; " : "", rs->tag, (unsigned long long)rs->stats.added,
			     (unsigned long long)rs->stats.bad, rs->load_ms);
	}
	if (used < len)
		snprintf(buf + used, len - used, "]");
}

_Static_assert(offsetof(struct ts_rule, names) == 0, "the name parsers take a rule as its names");
_Static_assert(offsetof(struct ts_dns_rule, names) == 0, "the name parsers take a rule as its names");

int config_names_f_domain(struct cfgp *p, const cJSON *item, void *target)
{
	return config_names_parse(p, item, CONFIG_NAMES_DOMAIN, target);
}

int config_names_f_suffix(struct cfgp *p, const cJSON *item, void *target)
{
	return config_names_parse(p, item, CONFIG_NAMES_SUFFIX, target);
}

int config_names_f_keyword(struct cfgp *p, const cJSON *item, void *target)
{
	return config_names_parse(p, item, CONFIG_NAMES_KEYWORD, target);
}

int config_names_f_regex(struct cfgp *p, const cJSON *item, void *target)
{
	return config_names_parse(p, item, CONFIG_NAMES_REGEX, target);
}

int config_names_f_rule_set(struct cfgp *p, const cJSON *item, void *target)
{
	return config_names_parse(p, item, CONFIG_NAMES_RULE_SET, target);
}
