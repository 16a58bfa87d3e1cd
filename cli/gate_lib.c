/* gate_lib.c — parsing, comparison and the table of the regression gate (see gate_lib.h). */
#include "cli/gate_lib.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define METRIC_INSTR "instructions_per_op"
#define METRIC_REDIRECT "redirect_fraction"
#define METRIC_OLD_CEILING "ceiling_fraction" /* counted, not gated (gate_check_baseline) */
#define REGENERATE "make bench BENCH_ARGS=--ablation, then copy its results.json " \
	"(bench-results/results.json) to bench/baseline/ablation.json"

void gate_opts_init(struct gate_opts *o)
{
	o->instr_tol_pct = GATE_DEFAULT_INSTR_TOL_PCT;
	o->ratio_tol_pct = -1.0;
	o->strict = false;
}

void gate_set_fini(struct gate_set *s)
{
	free(s->e);
	memset(s, 0, sizeof(*s));
}

void gate_report_fini(struct gate_report *r)
{
	free(r->l);
	memset(r, 0, sizeof(*r));
}

const char *gate_metric_name(enum gate_metric m)
{
	return m == GATE_INSTR ? METRIC_INSTR : METRIC_REDIRECT;
}

const char *gate_verdict_name(enum gate_verdict v)
{
	static const char *const names[] = {
		[GATE_OK] = "ok",
		[GATE_BETTER] = "better",
		[GATE_REGRESSION] = "REGRESSION",
		[GATE_MISSING] = "missing",
		[GATE_NEW] = "new",
	};
	return names[v];
}

/* ---- parsing ----------------------------------------------------------------------------- */

/* Grow an array of elements of size sz to hold one more; 0 or -ENOMEM. */
static int grow(void **arr, size_t *cap, size_t n, size_t sz)
{
	if (n < *cap)
		return 0;
	size_t ncap = *cap ? *cap * 2 : 16;
	void *p = realloc(*arr, ncap * sz);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

static const struct gate_entry *find(const struct gate_set *s, enum gate_metric m,
				     const char *key)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->e[i].metric == m && strcmp(s->e[i].key, key) == 0)
			return &s->e[i];
	return NULL;
}

static int bad(char *err, size_t errlen, const char *name, const char *path, const char *what)
{
	snprintf(err, errlen, "gate: %s: %s: %s", name, path, what);
	return -EINVAL;
}

/* Append e, refusing a second row with the same metric and key (the comparison would be
 * ambiguous). */
static int add(struct gate_set *s, const struct gate_entry *e, const char *name,
	       const char *path, char *err, size_t errlen)
{
	char what[GATE_KEY_MAX + 64];

	if (find(s, e->metric, e->key)) {
		snprintf(what, sizeof(what), "duplicate %s row for \"%s\"",
			 gate_metric_name(e->metric), e->key);
		return bad(err, errlen, name, path, what);
	}
	if (grow((void **)&s->e, &s->cap, s->n, sizeof(*s->e)) != 0)
		return -ENOMEM;
	s->e[s->n++] = *e;
	return 0;
}

/* A finite number field, or (optional) absent/null -> dflt. */
static int get_num(const cJSON *row, const char *field, bool optional, double dflt, double *out,
		   const char *name, const char *path, char *err, size_t errlen)
{
	char p[GATE_KEY_MAX + 64];
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, field);

	snprintf(p, sizeof(p), "%s.%s", path, field);
	if ((!v || cJSON_IsNull(v)) && optional) {
		*out = dflt;
		return 0;
	}
	if (!v)
		return bad(err, errlen, name, p, "missing");
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
		return bad(err, errlen, name, p, "expected a number");
	*out = v->valuedouble;
	return 0;
}

/* A string field (required), or (optional) absent/null -> "". */
static int get_str(const cJSON *row, const char *field, bool optional, const char **out,
		   const char *name, const char *path, char *err, size_t errlen)
{
	char p[GATE_KEY_MAX + 64];
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, field);

	snprintf(p, sizeof(p), "%s.%s", path, field);
	if ((!v || cJSON_IsNull(v)) && optional) {
		*out = "";
		return 0;
	}
	if (!v)
		return bad(err, errlen, name, p, "missing");
	if (!cJSON_IsString(v))
		return bad(err, errlen, name, p, "expected a string");
	*out = v->valuestring;
	return 0;
}

/* "<prefix><n>", or "-" for a null or absent number (NAN). */
static void num_part(char *buf, size_t len, char prefix, double v)
{
	if (isnan(v))
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%c%.0f", prefix, v);
}

/* The key of a redirect row: every field that names the cell. A connrate row has no direction
 * and no stream count: system/offload/q1/connrate/-/-. */
static int cell_key(const cJSON *row, const char *stack, const char *workload, char *key,
		    const char *name, const char *path, char *err, size_t errlen)
{
	const char *io_mode, *dir;
	double queues, streams;
	char q[32], n[32];
	int ret;

	if ((ret = get_str(row, "io_mode", true, &io_mode, name, path, err, errlen)) != 0 ||
	    (ret = get_str(row, "direction", true, &dir, name, path, err, errlen)) != 0 ||
	    (ret = get_num(row, "queues", true, NAN, &queues, name, path, err, errlen)) != 0 ||
	    (ret = get_num(row, "streams", true, NAN, &streams, name, path, err, errlen)) != 0)
		return ret;
	num_part(q, sizeof(q), 'q', queues);
	num_part(n, sizeof(n), 's', streams);
	snprintf(key, GATE_KEY_MAX, "%s/%s/%s/%s/%s/%s", stack, io_mode[0] ? io_mode : "-", q,
		 workload, dir[0] ? dir : "-", n);
	return 0;
}

static int parse_row(const cJSON *row, const char *path, struct gate_set *out, const char *name,
		     char *err, size_t errlen)
{
	struct gate_entry e = { 0 };
	const char *metric, *stack, *workload;
	int ret;

	if (!cJSON_IsObject(row))
		return bad(err, errlen, name, path, "expected an object");
	if ((ret = get_str(row, "metric", false, &metric, name, path, err, errlen)) != 0)
		return ret;
	if (strcmp(metric, METRIC_INSTR) == 0)
		e.metric = GATE_INSTR;
	else if (strcmp(metric, METRIC_REDIRECT) == 0)
		e.metric = GATE_REDIRECT;
	else {
		out->old_ceiling += strcmp(metric, METRIC_OLD_CEILING) == 0;
		return 0; /* not gated */
	}
	if ((ret = get_str(row, "stack", false, &stack, name, path, err, errlen)) != 0 ||
	    (ret = get_str(row, "workload", false, &workload, name, path, err, errlen)) != 0 ||
	    (ret = get_num(row, "median", false, 0, &e.median, name, path, err, errlen)) != 0 ||
	    (ret = get_num(row, "min", true, e.median, &e.min, name, path, err, errlen)) != 0 ||
	    (ret = get_num(row, "max", true, e.median, &e.max, name, path, err, errlen)) != 0)
		return ret;
	if (e.metric == GATE_INSTR)
		snprintf(e.key, sizeof(e.key), "%s", workload);
	else if ((ret = cell_key(row, stack, workload, e.key, name, path, err, errlen)) != 0)
		return ret;
	return add(out, &e, name, path, err, errlen);
}

static int parse_rows(const cJSON *rows, const char *prefix, struct gate_set *out,
		      const char *name, char *err, size_t errlen)
{
	char path[64];
	int i = 0, ret;
	const cJSON *row;

	cJSON_ArrayForEach(row, rows) {
		snprintf(path, sizeof(path), "%s[%d]", prefix, i++);
		if ((ret = parse_row(row, path, out, name, err, errlen)) != 0)
			return ret;
	}
	return 0;
}

/* {"callgrind": {case: {"instructions": N, "target": T}}} */
static int parse_callgrind(const cJSON *cg, struct gate_set *out, const char *name, char *err,
			   size_t errlen)
{
	char path[GATE_KEY_MAX + 32];
	const cJSON *c;
	int ret;

	if (!cJSON_IsObject(cg))
		return bad(err, errlen, name, "$.callgrind", "expected an object");
	cJSON_ArrayForEach(c, cg) {
		struct gate_entry e = { .metric = GATE_INSTR };
		snprintf(path, sizeof(path), "$.callgrind.%s", c->string);
		if (!cJSON_IsObject(c))
			return bad(err, errlen, name, path, "expected an object");
		if ((ret = get_num(c, "instructions", false, 0, &e.median, name, path, err,
				   errlen)) != 0)
			return ret;
		e.min = e.max = e.median;
		snprintf(e.key, sizeof(e.key), "%s", c->string);
		if ((ret = add(out, &e, name, path, err, errlen)) != 0)
			return ret;
	}
	return 0;
}

/* $.meta.tcp_congestion.testbed into out->cc, when the file records it. */
static int parse_cc(const cJSON *root, struct gate_set *out, const char *name, char *err,
		    size_t errlen)
{
	const char *path = "$.meta.tcp_congestion.testbed";
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "meta"), *cc, *tb;

	if (!meta || cJSON_IsNull(meta))
		return 0;
	if (!cJSON_IsObject(meta))
		return bad(err, errlen, name, "$.meta", "expected an object");
	cc = cJSON_GetObjectItemCaseSensitive(meta, "tcp_congestion");
	if (!cc || cJSON_IsNull(cc))
		return 0;
	if (!cJSON_IsObject(cc))
		return bad(err, errlen, name, "$.meta.tcp_congestion", "expected an object");
	tb = cJSON_GetObjectItemCaseSensitive(cc, "testbed");
	if (!tb || cJSON_IsNull(tb))
		return 0;
	if (!cJSON_IsString(tb))
		return bad(err, errlen, name, path, "expected a string");
	if (strlen(tb->valuestring) >= sizeof(out->cc))
		return bad(err, errlen, name, path, "longer than a congestion control name");
	strcpy(out->cc, tb->valuestring);
	return 0;
}

int gate_parse(const char *name, const char *text, size_t len, struct gate_set *out, char *err,
	       size_t errlen)
{
	cJSON *root = cJSON_ParseWithLength(text, len);
	const cJSON *v;
	int ret;

	out->cc[0] = '\0';
	out->rig = false;
	out->old_ceiling = 0;
	if (!root) {
		const char *at = cJSON_GetErrorPtr();
		char what[64];
		size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
		snprintf(what, sizeof(what), "not valid JSON (near byte %zu)", off);
		return bad(err, errlen, name, "$", what);
	}
	if (cJSON_IsArray(root)) {
		out->rig = true;
		ret = parse_rows(root, "$", out, name, err, errlen);
	} else if (!cJSON_IsObject(root)) {
		ret = bad(err, errlen, name, "$", "expected an object or an array of rows");
	} else if ((v = cJSON_GetObjectItemCaseSensitive(root, "callgrind")) != NULL) {
		ret = parse_callgrind(v, out, name, err, errlen);
	} else if (!(v = cJSON_GetObjectItemCaseSensitive(root, "rows"))) {
		ret = bad(err, errlen, name, "$", "neither \"rows\" nor \"callgrind\" present");
	} else if (!cJSON_IsArray(v)) {
		ret = bad(err, errlen, name, "$.rows", "expected an array");
	} else {
		out->rig = true;
		if ((ret = parse_cc(root, out, name, err, errlen)) == 0)
			ret = parse_rows(v, "$.rows", out, name, err, errlen);
	}
	cJSON_Delete(root);
	if (ret != 0)
		gate_set_fini(out);
	return ret;
}

/* Read the whole file into a NUL-terminated heap buffer. */
static int slurp(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
	struct stat st;
	size_t got = 0;
	int ret = 0, fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st) != 0) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (size_t)st.st_size > GATE_FILE_MAX) {
		ret = S_ISDIR(st.st_mode) ? -EISDIR : -EFBIG;
		goto out;
	}
	if (!(*buf = malloc((size_t)st.st_size + 1))) {
		ret = -ENOMEM;
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, *buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			break;
		}
		got += (size_t)n;
	}
	(*buf)[got] = '\0';
	*len = got;
out:
	if (ret != 0) {
		snprintf(err, errlen, "gate: %s: cannot read: %s", path, strerror(-ret));
		free(*buf);
		*buf = NULL;
	}
	if (fd >= 0)
		close(fd);
	return ret;
}

int gate_load(const char *path, struct gate_set *out, char *err, size_t errlen)
{
	char *buf = NULL;
	size_t len = 0;
	int ret = slurp(path, &buf, &len, err, errlen);

	if (ret != 0)
		return ret;
	ret = gate_parse(path, buf, len, out, err, errlen);
	free(buf);
	return ret;
}

/* ---- comparison -------------------------------------------------------------------------- */

static double dmax(double a, double b)
{
	return a > b ? a : b;
}

/* e's spread (max - min) as a percentage of ref, the baseline's median: measured against its
 * own median, a current row whose median fell would widen its own tolerance as it fell. */
static double spread_pct(const struct gate_entry *e, double ref)
{
	if (ref <= 0)
		return 0;
	return (e->max - e->min) / ref * 100.0;
}

/* The tolerance for one baseline/current pair: from the rows' spreads, at most
 * GATE_MAX_RATIO_TOL_PCT (a median that fell by more than that is never noise: with three
 * rounds, two bad ones and a good one make a spread that would excuse anything). */
static double tolerance(const struct gate_entry *b, const struct gate_entry *c,
			const struct gate_opts *o)
{
	double t;

	if (b->metric == GATE_INSTR)
		return o->instr_tol_pct;
	if (o->ratio_tol_pct >= 0)
		return o->ratio_tol_pct;
	t = dmax(GATE_DEFAULT_RATIO_TOL_PCT, dmax(spread_pct(b, b->median),
						 spread_pct(c, b->median)));
	return t < GATE_MAX_RATIO_TOL_PCT ? t : GATE_MAX_RATIO_TOL_PCT;
}

/* Instructions: higher is worse. Redirect fractions: lower is worse. */
static enum gate_verdict judge(enum gate_metric m, double base, double cur, double tol_pct)
{
	double f = tol_pct / 100.0;

	if (m == GATE_INSTR) {
		if (cur > base * (1 + f))
			return GATE_REGRESSION;
		return cur < base * (1 - f) ? GATE_BETTER : GATE_OK;
	}
	if (cur < base * (1 - f))
		return GATE_REGRESSION;
	return cur > base * (1 + f) ? GATE_BETTER : GATE_OK;
}

static struct gate_line *line_add(struct gate_report *r, const struct gate_entry *e)
{
	struct gate_line *l;

	if (grow((void **)&r->l, &r->cap, r->n, sizeof(*r->l)) != 0)
		return NULL;
	l = &r->l[r->n++];
	memset(l, 0, sizeof(*l));
	l->metric = e->metric;
	memcpy(l->key, e->key, sizeof(l->key));
	return l;
}

int gate_compare(const struct gate_set *base, const struct gate_set *cur,
		 const struct gate_opts *o, struct gate_report *out)
{
	struct gate_line *l;

	for (size_t i = 0; i < base->n; i++) {
		const struct gate_entry *b = &base->e[i];
		const struct gate_entry *c = find(cur, b->metric, b->key);
		if (!(l = line_add(out, b)))
			return -ENOMEM;
		l->base = b->median;
		if (!c) {
			l->verdict = GATE_MISSING;
			out->missing++;
			continue;
		}
		l->cur = c->median;
		l->change_pct = b->median != 0 ? (c->median - b->median) / b->median * 100.0 : 0;
		l->tol_pct = tolerance(b, c, o);
		l->verdict = judge(b->metric, b->median, c->median, l->tol_pct);
		out->compared++;
		out->regressions += l->verdict == GATE_REGRESSION;
	}
	for (size_t i = 0; i < cur->n; i++) {
		if (find(base, cur->e[i].metric, cur->e[i].key))
			continue;
		if (!(l = line_add(out, &cur->e[i])))
			return -ENOMEM;
		l->cur = cur->e[i].median;
		l->verdict = GATE_NEW;
		out->added++;
	}
	return 0;
}

int gate_exit_code(const struct gate_report *r, const struct gate_opts *o)
{
	if (r->regressions > 0 || (o->strict && r->missing > 0))
		return 1;
	return 0;
}

void gate_print(FILE *f, const struct gate_report *r)
{
	fprintf(f, "%-20s %-46s %12s %12s %9s %7s  %s\n", "metric", "key", "baseline", "current",
		"change", "tol", "verdict");
	for (size_t i = 0; i < r->n; i++) {
		const struct gate_line *l = &r->l[i];
		char b[32] = "-", c[32] = "-", ch[16] = "-", t[16] = "-";
		if (l->verdict != GATE_NEW)
			snprintf(b, sizeof(b), "%.4g", l->base);
		if (l->verdict != GATE_MISSING)
			snprintf(c, sizeof(c), "%.4g", l->cur);
		if (l->verdict != GATE_NEW && l->verdict != GATE_MISSING) {
			snprintf(ch, sizeof(ch), "%+.1f%%", l->change_pct);
			snprintf(t, sizeof(t), "%.1f%%", l->tol_pct);
		}
		fprintf(f, "%-20s %-46s %12s %12s %9s %7s  %s\n", gate_metric_name(l->metric),
			l->key, b, c, ch, t, gate_verdict_name(l->verdict));
	}
	fprintf(f, "gate: %zu compared, %zu regression%s, %zu missing in current, %zu new\n",
		r->compared, r->regressions, r->regressions == 1 ? "" : "s", r->missing, r->added);
}

size_t gate_count(const struct gate_set *s, enum gate_metric m)
{
	size_t n = 0;

	for (size_t i = 0; i < s->n; i++)
		n += s->e[i].metric == m;
	return n;
}

int gate_check_baseline(const char *name, const struct gate_set *b, char *err, size_t errlen)
{
	if (b->rig && b->old_ceiling > 0 && gate_count(b, GATE_REDIRECT) == 0) {
		snprintf(err, errlen,
			 "gate: %s: only has the old %s metric (%zu row%s), no %s row: a results "
			 "file from before the redirect baseline, which cannot gate throughput; "
			 "regenerate it: " REGENERATE,
			 name, METRIC_OLD_CEILING, b->old_ceiling, b->old_ceiling == 1 ? "" : "s",
			 METRIC_REDIRECT);
		return -EINVAL;
	}
	if (b->n == 0) {
		snprintf(err, errlen,
			 "gate: %s: $: no %s or %s rows: nothing to compare against (it would pass "
			 "anything)",
			 name, METRIC_INSTR, METRIC_REDIRECT);
		return -EINVAL;
	}
	return 0;
}

int gate_run(const char *baseline, const char *current, const struct gate_opts *o, FILE *f,
	     char *err, size_t errlen)
{
	struct gate_set b = { 0 }, c = { 0 };
	struct gate_report r = { 0 };
	int code = 2;

	if (gate_load(baseline, &b, err, errlen) != 0 || gate_load(current, &c, err, errlen) != 0)
		goto out;
	if (gate_check_baseline(baseline, &b, err, errlen) != 0)
		goto out;
	if (b.cc[0] && c.cc[0] && strcmp(b.cc, c.cc) != 0) {
		snprintf(err, errlen,
			 "gate: %s was measured with TCP congestion control %s, %s with %s: the "
			 "files do not compare (rerun the bench with --cc %s)",
			 baseline, b.cc, current, c.cc, b.cc);
		goto out;
	}
	if (gate_compare(&b, &c, o, &r) != 0) {
		snprintf(err, errlen, "gate: out of memory");
		code = 1;
		goto out;
	}
	gate_print(f, &r);
	if (c.rig && c.old_ceiling > 0 && gate_count(&c, GATE_REDIRECT) == 0 &&
	    gate_count(&b, GATE_REDIRECT) > 0)
		fprintf(f,
			"gate: note: %s has only the old %s metric, no %s row (a run without the "
			"redirect baseline): the baseline's %zu %s rows are missing, a failure only "
			"with --strict\n",
			current, METRIC_OLD_CEILING, METRIC_REDIRECT, gate_count(&b, GATE_REDIRECT),
			METRIC_REDIRECT);
	code = gate_exit_code(&r, o);
out:
	gate_report_fini(&r);
	gate_set_fini(&c);
	gate_set_fini(&b);
	return code;
}
