/* config_names.h — the configuration's name matchers (internal to the config module): the root
 * key "rule_sets" (files of names loaded into domain sets) and the name keys a rule object may
 * carry (domain, domain_suffix, domain_keyword, domain_regex, rule_set), for every section with
 * rules (route.rules; dns.rules uses the same keys).
 *
 * A rule's table gives each name key a CFGP_FN wrapper that calls config_names_parse with the
 * rule's struct ts_names; validation then calls config_names_resolve with the path set to the
 * rule, which turns rule_set tags into indices into ts_config.rule_sets.
 */
#ifndef TS_CORE_CONFIG_NAMES_H
#define TS_CORE_CONFIG_NAMES_H

#include <cjson/cJSON.h>

#include "core/config.h"
#include "core/config_parse.h"

enum config_names_key {
	CONFIG_NAMES_DOMAIN,   /* "domain": exact names */
	CONFIG_NAMES_SUFFIX,   /* "domain_suffix" */
	CONFIG_NAMES_KEYWORD,  /* "domain_keyword" */
	CONFIG_NAMES_REGEX,    /* "domain_regex" */
	CONFIG_NAMES_RULE_SET, /* "rule_set": tags of rule_sets */
};

/* The keys in enum order, for a rule's "needs at least one matcher" message. */
#define CONFIG_NAMES_KEYS "domain, domain_suffix, domain_keyword, domain_regex, rule_set"

/* Root "rule_sets" (a CFGP_FN for the root table; target is the struct ts_config): parses,
 * reads and loads every set. Errors name the field: "$.rule_sets[0].path: cannot read ...". */
int config_rule_sets_parse(struct cfgp *p, const cJSON *item, void *target);
void config_rule_sets_fini(struct ts_config *cfg);
/* For config_summary: " rule_sets=N [TAG: E entries, B bad lines, M ms; ...]" into buf (cut
 * to len); "" without rule sets. */
void config_rule_sets_summary(const struct ts_config *cfg, char *buf, size_t len);

/* One name key's value (a non-empty array of strings) into m. */
int config_names_parse(struct cfgp *p, const cJSON *item, enum config_names_key key,
		       struct ts_names *m);
/* The name keys as CFGP_FN fields: target is a struct ts_names, or a rule whose first member
 * is its struct ts_names (struct ts_rule, struct ts_dns_rule). */
int config_names_f_domain(struct cfgp *p, const cJSON *item, void *target);
int config_names_f_suffix(struct cfgp *p, const cJSON *item, void *target);
int config_names_f_keyword(struct cfgp *p, const cJSON *item, void *target);
int config_names_f_regex(struct cfgp *p, const cJSON *item, void *target);
int config_names_f_rule_set(struct cfgp *p, const cJSON *item, void *target);

/* Resolve m's rule_set tags; p's path is the rule object ("$.route.rules[3]"). */
int config_names_resolve(struct cfgp *p, const struct ts_config *cfg, struct ts_names *m);
void config_names_fini(struct ts_names *m);

#endif
