/* domain_set.h — sets of domain names to match a destination's name against: exact names,
 * suffixes (on a label boundary), keywords (substrings) and regular expressions (PCRE2), and
 * loaders for rule-set files in three text formats.
 *
 * Exact names and suffixes share one open-addressing hash table keyed by a seeded 64-bit hash
 * of the lowercased name; a lookup hashes the name once, right to left, and probes the table at
 * each label boundary, so its cost grows with the name's length and label count, not with the
 * size of the set (100,000 suffixes cost what 10 do). Keywords are searched one by one and
 * regular expressions run one by one (with a match limit): both grow with their number, so
 * large rule sets should be suffix sets.
 *
 * Names are compared case-insensitively, without a trailing dot. A set is built on one thread
 * (add, load) and then only read: domain_set_match may run on any number of threads at once.
 *
 * Rule-set formats (domain_set_load), one entry a line, '#' starts a comment, blank lines and
 * surrounding spaces ignored:
 *   plain  a name: it and every name under it (a suffix);
 *   hosts  "ADDRESS name [name...]" as in /etc/hosts: each name exactly;
 *   v2fly  v2fly's domain-list-community text: "full:NAME" exact, "domain:NAME" or a bare NAME
 *          a suffix, "keyword:TEXT", "regexp:PATTERN"; a trailing " @attr" is ignored;
 *          "include:" lines are refused (counted: a rule set never reads other files).
 * A line that is not valid is skipped and counted (domain_load_stats), never fatal; the loaded
 * set is whatever was valid.
 */
#ifndef TS_CORE_DOMAIN_SET_H
#define TS_CORE_DOMAIN_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DOMAIN_NAME_MAX 253   /* a name's text without the trailing dot (RFC 1035 2.3.4) */

enum domain_kind {
	DOMAIN_EXACT,    /* the name itself */
	DOMAIN_SUFFIX,   /* the name and every name ending in "." + it */
	DOMAIN_KEYWORD,  /* every name containing it */
	DOMAIN_REGEX,    /* every name the PCRE2 pattern matches (unanchored unless it says so) */
};

enum domain_format { DOMAIN_FMT_PLAIN, DOMAIN_FMT_HOSTS, DOMAIN_FMT_V2FLY };

struct domain_load_stats {
	uint64_t lines;          /* lines read */
	uint64_t added;          /* entries added */
	uint64_t duplicates;     /* entries already in the set */
	uint64_t bad;            /* lines skipped: not a valid name, pattern or line */
	uint64_t includes;       /* v2fly "include:" lines refused */
};

struct domain_set;

/* An empty set with a hash key from getrandom. 0, or -ENOMEM. */
int domain_set_new(struct domain_set **out) __attribute__((warn_unused_result));
void domain_set_free(struct domain_set *ds);

/* Replace the hash key of a set that holds nothing yet: for reproducible measurements (the
 * instruction-count benchmarks), where a random key would move the probe lengths from run to
 * run. Never for sets built from untrusted lists. 0, or -EBUSY if the set is not empty. */
int domain_set_set_key(struct domain_set *ds, uint64_t key) __attribute__((warn_unused_result));

/* Add one entry (len bytes of s, no NUL needed). Names: letters, digits, '-', '_' and '.',
 * no empty label, at most DOMAIN_NAME_MAX bytes, a trailing dot allowed and a suffix's leading
 * dot too ("." + name means the same suffix). 0 (also for a duplicate: *dup true if dup is not
 * NULL), -EINVAL for a bad name or a pattern PCRE2 refuses (err says why), -ENOMEM. */
int domain_set_add(struct domain_set *ds, enum domain_kind kind, const char *s, size_t len,
		   bool *dup, char *err, size_t errlen) __attribute__((warn_unused_result));

/* Add every valid line of buf (len bytes) in format fmt; st (may be NULL) receives the counts
 * (added to what it holds). 0, or -ENOMEM (the set then holds what was added before). */
int domain_set_load(struct domain_set *ds, enum domain_format fmt, const char *buf, size_t len,
		    struct domain_load_stats *st) __attribute__((warn_unused_result));

/* The name s (len bytes) in the form the set keeps: lower case, no trailing dot, letters,
 * digits, '-', '_' and '.' only, no empty label, labels of at most 63 bytes. Its length, or -1
 * if it is not such a name. out holds DOMAIN_NAME_MAX + 1 bytes. */
int domain_name_normalize(const char *s, size_t len, char *out);

/* Does the name (len bytes, any case, a trailing dot allowed) match an entry? A name that is
 * empty or longer than DOMAIN_NAME_MAX + 1 bytes matches nothing. */
bool domain_set_match(const struct domain_set *ds, const char *name, size_t len);

/* Entries by kind (exact and suffix counted apart), for reports. */
size_t domain_set_count(const struct domain_set *ds, enum domain_kind kind);

#endif
