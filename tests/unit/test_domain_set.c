/* test_domain_set.c — core/domain_set: exact names, suffixes on label boundaries, keywords,
 * PCRE2 patterns, case and trailing dots, duplicates, the three rule-set formats with their bad
 * lines counted, and a 100,000-suffix set checked against a reference lookup.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/domain_set.h"
#include "failalloc.h"

static struct domain_set *set_new(void)
{
	struct domain_set *ds;

	cr_assert_eq(domain_set_new(&ds), 0);
	return ds;
}

static void add(struct domain_set *ds, enum domain_kind k, const char *s)
{
	char err[128] = "";

	cr_assert_eq(domain_set_add(ds, k, s, strlen(s), NULL, err, sizeof(err)), 0, "%s: %s", s,
		     err);
}

static bool match(const struct domain_set *ds, const char *name)
{
	return domain_set_match(ds, name, strlen(name));
}

Test(domain_set, exact_and_suffix_on_label_boundaries)
{
	struct domain_set *ds = set_new();

	add(ds, DOMAIN_EXACT, "www.example.org");
	add(ds, DOMAIN_SUFFIX, "example.com");
	add(ds, DOMAIN_SUFFIX, ".corp.test.");
	cr_assert(match(ds, "www.example.org"));
	cr_assert_not(match(ds, "a.www.example.org"), "exact is exact");
	cr_assert_not(match(ds, "example.org"));
	cr_assert(match(ds, "example.com"), "a suffix matches the name itself");
	cr_assert(match(ds, "a.b.example.com"));
	cr_assert_not(match(ds, "badexample.com"), "only on a label boundary");
	cr_assert_not(match(ds, "example.com.evil"));
	cr_assert(match(ds, "corp.test"), "leading and trailing dots are the same suffix");
	cr_assert(match(ds, "HOST.Corp.Test."), "case and a trailing dot do not matter");
	cr_assert_not(match(ds, ""));
	cr_assert_not(match(ds, "."));
	cr_assert_eq(domain_set_count(ds, DOMAIN_EXACT), 1);
	cr_assert_eq(domain_set_count(ds, DOMAIN_SUFFIX), 2);
	domain_set_free(ds);
}

Test(domain_set, a_name_both_exact_and_suffix_and_duplicates)
{
	struct domain_set *ds = set_new();
	bool dup;

	cr_assert_eq(domain_set_add(ds, DOMAIN_EXACT, "a.test", 6, &dup, NULL, 0), 0);
	cr_assert_not(dup);
	cr_assert_not(match(ds, "x.a.test"));
	cr_assert_eq(domain_set_add(ds, DOMAIN_SUFFIX, "A.TEST", 6, &dup, NULL, 0), 0);
	cr_assert_not(dup, "the same name as another kind is new");
	cr_assert(match(ds, "x.a.test"));
	cr_assert_eq(domain_set_add(ds, DOMAIN_SUFFIX, "a.test.", 7, &dup, NULL, 0), 0);
	cr_assert(dup);
	cr_assert_eq(domain_set_count(ds, DOMAIN_SUFFIX), 1);
	domain_set_free(ds);
}

Test(domain_set, bad_names_are_refused_with_a_reason)
{
	static const char *const bad[] = { "", ".", "a..b", "a b", "a/b", "exa mple.com",
					   "with\\r\\n", "under:score", "-ok-but-@", ".." };
	struct domain_set *ds = set_new();
	char err[128];
	char label64[80];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		cr_assert_eq(domain_set_add(ds, DOMAIN_SUFFIX, bad[i], strlen(bad[i]), NULL, err,
					    sizeof(err)), -EINVAL, "\"%s\"", bad[i]);
		cr_assert(err[0], "a reason for \"%s\"", bad[i]);
	}
	memset(label64, 'a', 64);
	cr_assert_eq(domain_set_add(ds, DOMAIN_EXACT, label64, 64, NULL, NULL, 0), -EINVAL,
		     "a label over 63 bytes");
	cr_assert_eq(domain_set_add(ds, DOMAIN_EXACT, label64, 63, NULL, NULL, 0), 0);
	domain_set_free(ds);
}

Test(domain_set, keywords_and_patterns)
{
	struct domain_set *ds = set_new();
	char err[128] = "";

	add(ds, DOMAIN_KEYWORD, "tracker");
	add(ds, DOMAIN_REGEX, "^ad[0-9]+\\.");
	cr_assert(match(ds, "cdn.TRACKER-eu.test"));
	cr_assert(match(ds, "ad42.example.net"));
	cr_assert_not(match(ds, "bad42.example.net"), "anchored by the pattern");
	cr_assert_not(match(ds, "ads.example.net"));
	cr_assert_eq(domain_set_add(ds, DOMAIN_REGEX, "(unclosed", 9, NULL, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "regex"), "%s", err);
	cr_assert_eq(domain_set_count(ds, DOMAIN_KEYWORD), 1);
	cr_assert_eq(domain_set_count(ds, DOMAIN_REGEX), 1);
	domain_set_free(ds);
}

Test(domain_set, a_name_longer_than_a_name_matches_nothing)
{
	struct domain_set *ds = set_new();
	char name[400];

	add(ds, DOMAIN_SUFFIX, "test");
	add(ds, DOMAIN_KEYWORD, "a");
	memset(name, 'a', sizeof(name));
	memcpy(name + sizeof(name) - 5, ".test", 5);
	cr_assert_not(domain_set_match(ds, name, sizeof(name)));
	domain_set_free(ds);
}

Test(domain_set, plain_format)
{
	static const char text[] = "# a comment\n"
				   "example.com\n"
				   "  spaced.test   # trailing comment\r\n"
				   "\n"
				   "not a name\n"
				   "example.com\n"
				   "last.test";
	struct domain_set *ds = set_new();
	struct domain_load_stats st = { 0 };

	cr_assert_eq(domain_set_load(ds, DOMAIN_FMT_PLAIN, text, sizeof(text) - 1, &st), 0);
	cr_assert_eq(st.lines, 7);
	cr_assert_eq(st.added, 3);
	cr_assert_eq(st.duplicates, 1);
	cr_assert_eq(st.bad, 1);
	cr_assert(match(ds, "www.example.com"), "plain lines are suffixes");
	cr_assert(match(ds, "a.spaced.test"));
	cr_assert(match(ds, "last.test"), "a last line without a newline");
	domain_set_free(ds);
}

Test(domain_set, hosts_format)
{
	static const char text[] = "127.0.0.1 localhost\n"
				   "0.0.0.0 ads.example.com tracker.example.com # two names\n"
				   ":: ip6-nothing\n"
				   "10.0.0.1\n";
	struct domain_set *ds = set_new();
	struct domain_load_stats st = { 0 };

	cr_assert_eq(domain_set_load(ds, DOMAIN_FMT_HOSTS, text, sizeof(text) - 1, &st), 0);
	cr_assert_eq(st.added, 4);
	cr_assert_eq(st.bad, 1, "an address without a name");
	cr_assert(match(ds, "tracker.example.com"));
	cr_assert_not(match(ds, "x.ads.example.com"), "hosts entries are exact");
	cr_assert_not(match(ds, "example.com"));
	domain_set_free(ds);
}

Test(domain_set, v2fly_format)
{
	static const char text[] = "# v2fly domain-list-community\n"
				   "full:exact.example.com\n"
				   "domain:suffix.example.com\n"
				   "bare.example.net @ads @cn\n"
				   "keyword:doubleclick\n"
				   "regexp:^metrics[0-9]*\\.example\\.org$\n"
				   "include:other-list\n"
				   "unknown:thing.test\n"
				   "two words.test\n";
	struct domain_set *ds = set_new();
	struct domain_load_stats st = { 0 };

	cr_assert_eq(domain_set_load(ds, DOMAIN_FMT_V2FLY, text, sizeof(text) - 1, &st), 0);
	cr_assert_eq(st.added, 5);
	cr_assert_eq(st.includes, 1);
	cr_assert_eq(st.bad, 2, "an unknown type and a line with a second word");
	cr_assert(match(ds, "exact.example.com"));
	cr_assert_not(match(ds, "a.exact.example.com"));
	cr_assert(match(ds, "a.suffix.example.com"));
	cr_assert(match(ds, "x.bare.example.net"), "attributes ignored, bare is a suffix");
	cr_assert(match(ds, "stats.g.doubleclick.net"));
	cr_assert(match(ds, "metrics12.example.org"));
	cr_assert_not(match(ds, "metrics12.example.org.evil"));
	domain_set_free(ds);
}

/* 100,000 suffixes "sNNNNN.zone" against names under them and beside them. */
Test(domain_set, a_large_suffix_set_agrees_with_a_reference)
{
	struct domain_set *ds = set_new();
	size_t cap = 100000 * 16, len = 0;
	char *text = malloc(cap), name[96];
	struct domain_load_stats st = { 0 };

	cr_assert_not_null(text);
	for (int i = 0; i < 100000; i++)
		len += (size_t)snprintf(text + len, cap - len, "s%05d.zone\n", i * 2);
	cr_assert_eq(domain_set_load(ds, DOMAIN_FMT_PLAIN, text, len, &st), 0);
	cr_assert_eq(st.added, 100000);
	cr_assert_eq(domain_set_count(ds, DOMAIN_SUFFIX), 100000);
	for (int i = 0; i < 20000; i++) {
		int n = (i * 7919) % 200000;
		snprintf(name, sizeof(name), "host%d.cdn.s%05d.zone", i, n);
		cr_assert_eq(match(ds, name), n % 2 == 0, "%s", name);
		snprintf(name, sizeof(name), "s%05d.zone.other", n);
		cr_assert_not(match(ds, name), "%s", name);
	}
	free(text);
	domain_set_free(ds);
}

/* A fixed key is only taken by an empty set; a set built with it answers as any other. */
Test(domain_set, a_fixed_key_only_on_an_empty_set)
{
	struct domain_set *ds = set_new();

	cr_assert_eq(domain_set_set_key(ds, 1), 0);
	add(ds, DOMAIN_SUFFIX, "example.com");
	cr_assert_eq(domain_set_set_key(ds, 2), -EBUSY, "the entries were placed with key 1");
	cr_assert(match(ds, "a.example.com"));
	cr_assert_not(match(ds, "example.net"));
	domain_set_free(ds);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

#define NOMEM_SUFFIXES 220 /* past the table's and the arena's first sizes */
#define NOMEM_EXACT 12
#define NOMEM_KEYWORDS 10  /* past the first keyword array */
#define NOMEM_REGEX 6      /* past the first pattern array */
#define NOMEM_ENTRIES (NOMEM_SUFFIXES + NOMEM_EXACT + NOMEM_KEYWORDS + NOMEM_REGEX)

/* The v2fly text: entries of every kind in turn, a bad line, an include and a duplicate among
 * them. Entry i's name to match: *probe. */
static size_t nomem_text(char *t, size_t cap)
{
	size_t len = 0;

	for (int i = 0; i < NOMEM_ENTRIES; i++) {
		if (i == 5)
			len += (size_t)snprintf(t + len, cap - len, "include:other\nbad name\n");
		if (i == 9)
			len += (size_t)snprintf(t + len, cap - len, "domain:s0.some-zone.example\n");
		if (i < NOMEM_SUFFIXES)
			len += (size_t)snprintf(t + len, cap - len, "s%d.some-zone.example @ads\n", i);
		else if (i < NOMEM_SUFFIXES + NOMEM_EXACT)
			len += (size_t)snprintf(t + len, cap - len, "full:f%d.test\n", i);
		else if (i < NOMEM_SUFFIXES + NOMEM_EXACT + NOMEM_KEYWORDS)
			len += (size_t)snprintf(t + len, cap - len, "keyword:zq%dzq\n", i);
		else
			len += (size_t)snprintf(t + len, cap - len, "regexp:^re%d\\.test$\n", i);
	}
	cr_assert_lt(len, cap);
	return len;
}

static void nomem_probe(int i, char *name, size_t cap)
{
	if (i < NOMEM_SUFFIXES)
		snprintf(name, cap, "www.s%d.some-zone.example", i);
	else if (i < NOMEM_SUFFIXES + NOMEM_EXACT)
		snprintf(name, cap, "F%d.test.", i);
	else if (i < NOMEM_SUFFIXES + NOMEM_EXACT + NOMEM_KEYWORDS)
		snprintf(name, cap, "azq%dzqb.test", i);
	else
		snprintf(name, cap, "RE%d.test", i);
}

/* A set loaded from a v2fly text with every kind of entry: loaded whole, or -ENOMEM with the
 * entries before the refused one in the set and none after (every line counted until
 * there); a plain and a hosts text added to it. Whatever was added matches, nothing else. */
static void nomem_scenario(void *arg, bool sweep)
{
	static char text[NOMEM_ENTRIES * 48];
	struct domain_load_stats st = { 0 };
	struct domain_set *ds = NULL;
	size_t len = nomem_text(text, sizeof(text));
	char name[96];
	int rc, matched = 0;
	bool more = true;

	if ((rc = domain_set_new(&ds)) != 0) {
		cr_assert(sweep && rc == -ENOMEM);
		return;
	}
	rc = domain_set_load(ds, DOMAIN_FMT_V2FLY, text, len, &st);
	cr_assert(rc == 0 || (sweep && rc == -ENOMEM), "load: %d", rc);
	for (int i = 0; i < NOMEM_ENTRIES; i++) {
		nomem_probe(i, name, sizeof(name));
		if (match(ds, name)) {
			cr_assert(more, "%s matches after an entry that did not", name);
			matched++;
		} else {
			more = false;
		}
	}
	cr_assert_eq(st.added, (uint64_t)matched, "entries counted added and those that match");
	cr_assert(rc != 0 || (st.added == NOMEM_ENTRIES && st.bad == 1 && st.includes == 1 &&
			      st.duplicates == 1));
	cr_assert_not(match(ds, "s0.some-zone.example.org"));
	cr_assert_not(match(ds, "a.f240.test"), "full: is exact");
	if (rc == 0) {
		static const char plain[] = "# plain\nplain-a.test\n\nplain-b.test  # b\n";
		static const char hosts[] = "127.0.0.1 host-a.test host-b.test\n::1 host-c.test\n";

		memset(&st, 0, sizeof(st));
		rc = domain_set_load(ds, DOMAIN_FMT_PLAIN, plain, sizeof(plain) - 1, &st);
		cr_assert(rc == 0 || (sweep && rc == -ENOMEM));
		cr_assert_eq(match(ds, "x.plain-b.test"), rc == 0);
		rc = domain_set_load(ds, DOMAIN_FMT_HOSTS, hosts, sizeof(hosts) - 1, &st);
		cr_assert(rc == 0 || (sweep && rc == -ENOMEM));
		cr_assert_eq(match(ds, "host-c.test"), rc == 0);
		cr_assert_not(match(ds, "x.host-a.test"));
	}
	domain_set_free(ds);
}

Test(domain_set, each_allocation_refused_in_turn)
{
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, NULL, 10,
								      500));
}
