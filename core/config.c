/* config.c — the twinstack config schema (docs/config.md): tables, field parsers, cross-field
 * validation, the loaders, and the views later code needs (outbound index, summary).
 *
 * Sections are parsed in schema-table order by config_parse.c; everything that relates two
 * sections (address roles, outbound tags, loops to our own addresses, budget vs relay) is
 * checked afterwards in validate(), with the path of the field to fix.
 */
#include "core/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config_dns.h"
#include "core/config_names.h"
#include "core/config_parse.h"
#include "core/domain_set.h"

_Static_assert(sizeof(enum ts_stack) == sizeof(int), "CFGP_ENUM stores an int");
_Static_assert(sizeof(enum ts_offload) == sizeof(int), "CFGP_ENUM stores an int");
_Static_assert(sizeof(enum ts_fast_path) == sizeof(int), "CFGP_ENUM stores an int");
_Static_assert(sizeof(enum ts_outbound_type) == sizeof(int), "CFGP_ENUM stores an int");
_Static_assert(sizeof(enum ts_relay_mode) == sizeof(int), "CFGP_ENUM stores an int");
_Static_assert(sizeof(enum ts_network) == sizeof(int), "CFGP_ENUM stores an int");
_Static_assert(sizeof(enum log_level) == sizeof(int), "CFGP_ENUM stores an int");

#define MS_HOUR 3600000u
#define MS_DAY 86400000u
#define MAX_COUNT 16777216u /* sessions, entries, fds: 16 Mi */

/* The loader's state, reachable from field parsers through cfgp.user. */
struct load {
	struct ts_config *cfg;
	bool outbounds_given;
	uint32_t budgets_present;
};

static const char *const stack_names[] = { "system", "lwip", NULL };
static const char *const offload_names[] = { "auto", "on", "off", NULL };
static const char *const fast_path_names[] = { "auto", "on", "off", NULL };
static const char *const rps_names[] = { "auto", "on", "off", NULL };
static const char *const io_uring_names[] = { "auto", "on", "off", NULL };
_Static_assert(sizeof(enum ts_io_uring) == sizeof(int), "CFGP_ENUM stores an int");
_Static_assert(sizeof(enum ts_rps) == sizeof(int), "CFGP_ENUM stores an int");
static const char *const outbound_names[] = { "direct", "socks5", "reject", "http", NULL };
/* In enum ts_domain_strategy order. */
static const char *const strategy_names[] = { "prefer_ipv6", "prefer_ipv4", "ipv4_only",
					       "ipv6_only", NULL };
_Static_assert(sizeof(enum ts_domain_strategy) == sizeof(int), "CFGP_ENUM stores an int");
static const char *const relay_names[] = { "splice", "copy", NULL };
static const char *const network_names[] = { "tcp", "udp", NULL }; /* base 1: 0 is "any" */
/* In enum log_level order (core/log.h). */
static const char *const level_names[] = { "error", "warn", "info", "debug", NULL };
_Static_assert(LOG_LEVEL_DEBUG == 3 && LOG_LEVEL_MAX == 4, "level_names matches enum log_level");
static const char *const profile_names[] = { "desktop", "mobile", NULL };

/* ---- field parsers ---------------------------------------------------------------------- */

/* Linux dev_valid_name(): 1..15 bytes, not "." or "..", no '/', ':' or whitespace. */
static int parse_ifname(struct cfgp *p, const cJSON *item, char *dst)
{
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, TS_IFNAME_MAX, &s)) != 0)
		return ret;
	if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || strpbrk(s, "/: \t"))
		return cfgp_fail(p, "\"%s\" is not a valid interface name (no '/', ':' or spaces)",
				 cfgp_quote(s, q, sizeof(q)));
	memcpy(dst, s, strlen(s) + 1);
	return 0;
}

static int parse_cidr_family(struct cfgp *p, const cJSON *item, uint8_t family,
			     struct netaddr_cidr *out)
{
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, NETADDR_CIDR_STRLEN, &s)) != 0)
		return ret;
	if (netaddr_parse_cidr(s, out) != 0 || (family && out->addr.family != family)) {
		const char *what = family == 4   ? "an IPv4 CIDR like 198.18.0.1/15"
				   : family == 6 ? "an IPv6 CIDR like fd00:7f::1/64"
						 : "an IPv4 or IPv6 CIDR like 10.0.0.0/8";
		return cfgp_fail(p, "expected %s, got \"%s\"", what, cfgp_quote(s, q, sizeof(q)));
	}
	return 0;
}

static int f_tun_name(struct cfgp *p, const cJSON *item, void *target)
{
	return parse_ifname(p, item, ((struct ts_tun *)target)->name);
}

/* 1-16, or "auto" (TS_TUN_QUEUES_AUTO). */
static int f_tun_queues(struct cfgp *p, const cJSON *item, void *target)
{
	uint64_t v;
	int ret;

	if (cJSON_IsString(item)) {
		if (!item->valuestring || strcmp(item->valuestring, "auto") != 0)
			return cfgp_fail(p, "expected \"auto\" or an integer 1-16");
		((struct ts_tun *)target)->queues = TS_TUN_QUEUES_AUTO;
		return 0;
	}
	if ((ret = cfgp_uint(p, item, 1, 16, &v)) != 0)
		return ret;
	((struct ts_tun *)target)->queues = (uint32_t)v;
	return 0;
}

static int f_tun_address(struct cfgp *p, const cJSON *item, void *target)
{
	return parse_cidr_family(p, item, 4, &((struct ts_tun *)target)->addr4);
}

static int f_tun_address6(struct cfgp *p, const cJSON *item, void *target)
{
	return parse_cidr_family(p, item, 6, &((struct ts_tun *)target)->addr6);
}

/* A list of 1..TS_ROUTE_LIST_MAX entries of size bytes each, parsed one by one by fn into a
 * calloc'd array (*out, *n_out: how many are in it, so config_fini frees a partial list). */
typedef int (*list_item_fn)(struct cfgp *p, const cJSON *e, void *dst);

static int parse_list(struct cfgp *p, const cJSON *item, size_t size, list_item_fn fn,
		      void **out, size_t *n_out)
{
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, TS_ROUTE_LIST_MAX, false, &n)) != 0)
		return ret;
	if (!(*out = calloc(n, size)))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		ret = fn(p, e, (char *)*out + i * size);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		*n_out = ++i;
	}
	return 0;
}

/* A CIDR of either family, host bits cleared. */
static int cidr_item(struct cfgp *p, const cJSON *e, void *dst)
{
	int ret = parse_cidr_family(p, e, 0, dst);

	if (ret == 0)
		netaddr_cidr_normalize(dst);
	return ret;
}

static int parse_cidr_list(struct cfgp *p, const cJSON *item, struct netaddr_cidr **out,
			   size_t *n_out)
{
	return parse_list(p, item, sizeof(**out), cidr_item, (void **)out, n_out);
}

static int f_route_address(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_tun *t = target;
	return parse_cidr_list(p, item, &t->route_address, &t->n_route_address);
}

static int f_route_exclude_address(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_tun *t = target;
	return parse_cidr_list(p, item, &t->route_exclude_address, &t->n_route_exclude_address);
}

/* A uid (integer or "n") or a range "lo-hi"; 4294967295 is (uid_t)-1, never a user. */
static int parse_uid_item(struct cfgp *p, const cJSON *e, struct ts_uid_range *out)
{
	unsigned long long lo, hi;
	const char *s;
	char q[64], *end;
	uint64_t v;
	int ret;

	if (cJSON_IsNumber(e)) {
		if ((ret = cfgp_uint(p, e, 0, UINT32_MAX - 1, &v)) != 0)
			return ret;
		out->lo = out->hi = (uint32_t)v;
		return 0;
	}
	if (!cJSON_IsString(e))
		return cfgp_fail(p, "expected a uid or a \"lo-hi\" range, got %s",
				 cfgp_type_name(e));
	if ((ret = cfgp_string(p, e, 1, 32, &s)) != 0)
		return ret;
	errno = 0;
	lo = strtoull(s, &end, 10);
	hi = lo;
	if (end != s && *end == '-') {
		const char *h = end + 1;
		hi = strtoull(h, &end, 10);
		if (end == h || h[0] < '0' || h[0] > '9')
			end = (char *)s; /* no digits right after '-' (strtoull skips " " and "+") */
	}
	if (errno || end == s || *end || s[0] < '0' || s[0] > '9' || lo >= UINT32_MAX ||
	    hi >= UINT32_MAX)
		return cfgp_fail(p, "expected a uid or a \"lo-hi\" range of uids 0-4294967294, "
				    "got \"%s\"", cfgp_quote(s, q, sizeof(q)));
	if (lo > hi)
		return cfgp_fail(p, "range \"%s\" is reversed (lo must not exceed hi)",
				 cfgp_quote(s, q, sizeof(q)));
	out->lo = (uint32_t)lo;
	out->hi = (uint32_t)hi;
	return 0;
}

static int uid_item(struct cfgp *p, const cJSON *e, void *dst)
{
	return parse_uid_item(p, e, dst);
}

static int parse_uid_list(struct cfgp *p, const cJSON *item, struct ts_uid_range **out,
			  size_t *n_out)
{
	return parse_list(p, item, sizeof(**out), uid_item, (void **)out, n_out);
}

static int f_include_uid(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_tun *t = target;
	return parse_uid_list(p, item, &t->include_uid, &t->n_include_uid);
}

static int f_exclude_uid(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_tun *t = target;
	return parse_uid_list(p, item, &t->exclude_uid, &t->n_exclude_uid);
}

static int ifname_item(struct cfgp *p, const cJSON *e, void *dst)
{
	return parse_ifname(p, e, dst);
}

static int f_exclude_interface(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_tun *t = target;

	return parse_list(p, item, sizeof(*t->exclude_interface), ifname_item,
			  (void **)&t->exclude_interface, &t->n_exclude_interface);
}

/* A user name (what getpwnam accepts: no '/', ':' or whitespace) or a numeric uid. Whether it
 * exists is checked at start, on the machine that runs the proxy. */
static int f_user(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_config *cfg = target;
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, TS_USER_MAX, &s)) != 0)
		return ret;
	if (strpbrk(s, "/: \t\n") || s[0] == '-')
		return cfgp_fail(p, "\"%s\" is not a user name or uid", cfgp_quote(s, q, sizeof(q)));
	memcpy(cfg->user, s, strlen(s) + 1);
	return 0;
}

static int f_bind_interface(struct cfgp *p, const cJSON *item, void *target)
{
	return parse_ifname(p, item, ((struct ts_outbound *)target)->bind_interface);
}

/* A DNS name: labels of 1..63 letters, digits, '-' or '_' (no '-' at either end), 253 bytes at
 * most, and a last label that is not all digits (that would be a malformed IPv4 address). */
static bool valid_hostname(const char *s, size_t n)
{
	size_t label = 0;
	bool digits = true;

	if (n == 0 || n > TS_HOST_MAX)
		return false;
	for (size_t i = 0; i <= n; i++) {
		char c = i < n ? s[i] : '.';
		if (c == '.') {
			if (label == 0 || label > 63 || s[i - 1] == '-')
				return false;
			if (i == n && digits)
				return false;
			label = 0;
			digits = true;
			continue;
		}
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && c != '-' && c != '_')
			return false;
		if (label == 0 && c == '-')
			return false;
		digits = digits && c >= '0' && c <= '9';
		label++;
	}
	return true;
}

static int parse_hostport(const char *s, struct ts_hostport *hp)
{
	struct netaddr_ep ep;
	const char *colon;
	size_t hlen;

	memset(hp, 0, sizeof(*hp));
	if (s[0] == '[') {
		if (netaddr_parse_ep(s, &ep) != 0)
			return -EINVAL;
		netaddr_unmap(&ep.addr);
		hp->is_addr = true;
		hp->addr = ep.addr;
		hp->port = ep.port;
		netaddr_format(&ep.addr, hp->host, sizeof(hp->host));
		return 0;
	}
	colon = strrchr(s, ':');
	if (!colon || netaddr_parse_port(colon + 1, &hp->port) != 0)
		return -EINVAL;
	hlen = (size_t)(colon - s);
	if (hlen == 0 || hlen > TS_HOST_MAX || memchr(s, ':', hlen))
		return -EINVAL; /* an IPv6 address needs its brackets */
	memcpy(hp->host, s, hlen);
	hp->host[hlen] = '\0';
	if (netaddr_parse(hp->host, &hp->addr) == 0) {
		hp->is_addr = true;
		return 0;
	}
	return valid_hostname(hp->host, hlen) ? 0 : -EINVAL;
}

static int f_server(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_outbound *ob = target;
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, TS_HOST_MAX + 8, &s)) != 0)
		return ret;
	if (parse_hostport(s, &ob->server) != 0)
		return cfgp_fail(p,
				 "expected \"host:port\" (IPv4, [IPv6] or a host name; port 1-65535), "
				 "got \"%s\"",
				 cfgp_quote(s, q, sizeof(q)));
	return 0;
}

static int parse_ep(struct cfgp *p, const cJSON *item, struct netaddr_ep *out)
{
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, NETADDR_EP_STRLEN, &s)) != 0)
		return ret;
	if (netaddr_parse_ep(s, out) != 0)
		return cfgp_fail(p, "expected \"ip:port\" (IPv4 or [IPv6]; port 1-65535), got \"%s\"",
				 cfgp_quote(s, q, sizeof(q)));
	netaddr_unmap(&out->addr);
	return 0;
}

static int f_stats_listen(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_stats *st = target;
	char buf[NETADDR_EP_STRLEN];
	int ret;

	if ((ret = parse_ep(p, item, &st->listen)) != 0)
		return ret;
	if (!netaddr_is_loopback(&st->listen.addr))
		return cfgp_fail(p,
				 "%s is not a loopback address: the stats endpoint listens on "
				 "a 127.0.0.0/8 address or [::1] only",
				 netaddr_ep_format(&st->listen, buf, sizeof(buf)));
	return 0;
}

static int f_profile(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_config *cfg = target;
	int idx, ret;

	if ((ret = cfgp_enum(p, item, profile_names, &idx)) != 0)
		return ret;
	/* The profile is the base; overrides are parsed after it (table order). */
	cfg->budget_profile = (enum budget_profile)idx;
	budget_limits_profile(&cfg->budget, cfg->budget_profile);
	return 0;
}

/* ---- route rules -------------------------------------------------------------------------- */

static int f_rule_cidr(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_rule *r = target;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, TS_MAX_RULE_ITEMS, false, &n)) != 0)
		return ret;
	if (!(r->cidrs = calloc(n, sizeof(*r->cidrs))))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		ret = parse_cidr_family(p, e, 0, &r->cidrs[i]);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		netaddr_cidr_normalize(&r->cidrs[i]);
		r->n_cidrs = ++i;
	}
	return 0;
}

/* "a-b" or "a" with 1 <= a <= b <= 65535. */
static int parse_port_range(const char *s, struct ts_port_range *out)
{
	char buf[16];
	const char *dash = strchr(s, '-');
	size_t n = strlen(s);

	if (n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, n + 1);
	if (!dash)
		return netaddr_parse_port(buf, &out->lo) == 0 ? (out->hi = out->lo, 0) : -EINVAL;
	buf[dash - s] = '\0';
	if (netaddr_parse_port(buf, &out->lo) != 0 ||
	    netaddr_parse_port(buf + (dash - s) + 1, &out->hi) != 0)
		return -EINVAL;
	return 0;
}

static int parse_port_item(struct cfgp *p, const cJSON *e, struct ts_port_range *out)
{
	const char *s;
	char q[64];
	uint64_t v;
	int ret;

	if (cJSON_IsNumber(e)) {
		if ((ret = cfgp_uint(p, e, 1, 65535, &v)) != 0)
			return ret;
		out->lo = out->hi = (uint16_t)v;
		return 0;
	}
	if (!cJSON_IsString(e))
		return cfgp_fail(p, "expected a port number or a \"a-b\" range, got %s",
				 cfgp_type_name(e));
	if ((ret = cfgp_string(p, e, 1, 16, &s)) != 0)
		return ret;
	if (parse_port_range(s, out) != 0)
		return cfgp_fail(p, "expected a port number or a \"a-b\" range of ports 1-65535, "
				    "got \"%s\"", cfgp_quote(s, q, sizeof(q)));
	if (out->lo > out->hi)
		return cfgp_fail(p, "range \"%s\" is reversed (a must not exceed b)",
				 cfgp_quote(s, q, sizeof(q)));
	return 0;
}

static int f_rule_port(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_rule *r = target;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, TS_MAX_RULE_ITEMS, false, &n)) != 0)
		return ret;
	if (!(r->ports = calloc(n, sizeof(*r->ports))))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		ret = parse_port_item(p, e, &r->ports[i]);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		r->n_ports = ++i;
	}
	return 0;
}

enum { RULE_CIDR, RULE_PORT, RULE_NETWORK, RULE_OUTBOUND, RULE_DOMAIN, RULE_SUFFIX, RULE_KEYWORD,
       RULE_REGEX, RULE_RULE_SET };

static int check_rule(struct cfgp *p, void *target, uint32_t present)
{
	(void)target;
	if (!(present & ((1u << RULE_CIDR) | (1u << RULE_PORT) | (1u << RULE_NETWORK) |
			 (1u << RULE_DOMAIN) | (1u << RULE_SUFFIX) | (1u << RULE_KEYWORD) |
			 (1u << RULE_REGEX) | (1u << RULE_RULE_SET))))
		return cfgp_fail(p, "a rule needs at least one matcher (cidr, port, network, "
				    CONFIG_NAMES_KEYS ")");
	if (!CFGP_PRESENT(present, RULE_OUTBOUND))
		return cfgp_fail_key(p, "outbound", "required: the tag of the outbound to use");
	return 0;
}

static const struct cfgp_field rule_fields[] = {
	[RULE_CIDR] = { .key = "cidr", .kind = CFGP_FN, .fn = f_rule_cidr },
	[RULE_PORT] = { .key = "port", .kind = CFGP_FN, .fn = f_rule_port },
	[RULE_NETWORK] = { .key = "network", .kind = CFGP_ENUM, .names = network_names, .base = 1,
			   .off = offsetof(struct ts_rule, network) },
	[RULE_OUTBOUND] = { .key = "outbound", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
			    .off = offsetof(struct ts_rule, outbound_tag) },
	[RULE_DOMAIN] = { .key = "domain", .kind = CFGP_FN, .fn = config_names_f_domain },
	[RULE_SUFFIX] = { .key = "domain_suffix", .kind = CFGP_FN, .fn = config_names_f_suffix },
	[RULE_KEYWORD] = { .key = "domain_keyword", .kind = CFGP_FN, .fn = config_names_f_keyword },
	[RULE_REGEX] = { .key = "domain_regex", .kind = CFGP_FN, .fn = config_names_f_regex },
	[RULE_RULE_SET] = { .key = "rule_set", .kind = CFGP_FN, .fn = config_names_f_rule_set },
};
static const struct cfgp_table rule_table = CFGP_TABLE(rule_fields, check_rule);

static int f_rules(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_route *rt = target;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, TS_MAX_RULES, true, &n)) != 0)
		return ret;
	if (n == 0)
		return 0;
	if (!(rt->rules = calloc(n, sizeof(*rt->rules))))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		rt->n_rules = i + 1; /* owned by cfg from here on, even if it fails */
		ret = cfgp_object(p, e, &rule_table, &rt->rules[i], NULL);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		if (!config_names_empty(&rt->rules[i].names))
			rt->has_names = true;
		i++;
	}
	return 0;
}

/* ---- outbounds ---------------------------------------------------------------------------- */

enum { OB_TAG, OB_TYPE, OB_MARK, OB_BIND, OB_SERVER, OB_USER, OB_PASS, OB_HEADERS, OB_UDP,
       OB_DOMAIN_STRATEGY };

/* Header fields the request itself writes or whose presence would change its framing (a body
 * on a CONNECT request), so they cannot be configured. */
static const char *const reserved_headers[] = { "Host", "Content-Length", "Transfer-Encoding",
						NULL };

static bool is_tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* One header field: a token name (RFC 9110 section 5.1) not reserved, a value without control
 * characters (cfgp_string) and without leading or trailing whitespace; appended to out. */
static int header_field(struct cfgp *p, const cJSON *e, char *out, size_t *off)
{
	const char *v, *name = e->string;
	char q[64];
	size_t nl = strlen(name), vl;
	int ret, w;

	if (nl == 0 || nl > 64)
		return cfgp_fail(p, "a header name must be 1 to 64 bytes long");
	for (size_t i = 0; i < nl; i++)
		if (!is_tchar((unsigned char)name[i]))
			return cfgp_fail(p, "\"%s\" is not a header name (token characters only)",
					 cfgp_quote(name, q, sizeof(q)));
	for (size_t i = 0; reserved_headers[i]; i++)
		if (strcasecmp(name, reserved_headers[i]) == 0)
			return cfgp_fail(p, "header \"%s\" is set by the proxy itself", name);
	if ((ret = cfgp_string(p, e, 0, TS_HTTP_HEADERS_MAX, &v)) != 0)
		return ret;
	vl = strlen(v);
	if (vl && (v[0] == ' ' || v[vl - 1] == ' '))
		return cfgp_fail(p, "leading or trailing space in the value");
	w = snprintf(out + *off, TS_HTTP_HEADERS_MAX + 1 - *off, "%s: %s\r\n", name, v);
	if (w < 0 || (size_t)w > TS_HTTP_HEADERS_MAX - *off)
		return cfgp_fail(p, "headers too long (at most %d bytes as sent)",
				 TS_HTTP_HEADERS_MAX);
	*off += (size_t)w;
	return 0;
}

/* Is e's name (case-insensitive, RFC 9110 section 5.1) one of the fields before it? */
static bool header_seen(const cJSON *obj, const cJSON *e)
{
	for (const cJSON *f = obj->child; f && f != e; f = f->next)
		if (f->string && e->string && strcasecmp(f->string, e->string) == 0)
			return true;
	return false;
}

/* "headers": an object of string values, at most TS_HTTP_HEADERS_N fields. */
static int f_headers(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_outbound *ob = target;
	const cJSON *e;
	size_t n = 0, off = 0;
	int ret;

	if (!cJSON_IsObject(item))
		return cfgp_fail(p, "expected an object, got %s", cfgp_type_name(item));
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_key(p, e->string ? e->string : "");
		if (++n > TS_HTTP_HEADERS_N)
			ret = cfgp_fail(p, "too many headers (at most %d)", TS_HTTP_HEADERS_N);
		else if (header_seen(item, e))
			ret = cfgp_fail(p, "header given twice (header names are case-insensitive)");
		else
			ret = header_field(p, e, ob->http_headers, &off);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
	}
	return 0;
}

/* Does the "Name: value\r\n" block have a field named name (case-insensitive)? */
static bool has_header(const char *block, const char *name)
{
	size_t nl = strlen(name);

	for (const char *l = block; *l; l = strchr(l, '\n') + 1)
		if (strncasecmp(l, name, nl) == 0 && l[nl] == ':')
			return true;
	return false;
}

static int check_outbound(struct cfgp *p, void *target, uint32_t present)
{
	struct ts_outbound *ob = target;
	const char *tname = config_outbound_type_name(ob->type);
	bool user = CFGP_PRESENT(present, OB_USER), pass = CFGP_PRESENT(present, OB_PASS);

	if (!CFGP_PRESENT(present, OB_TAG))
		return cfgp_fail_key(p, "tag", "required");
	if (!CFGP_PRESENT(present, OB_TYPE))
		return cfgp_fail_key(p, "type",
				     "required: \"direct\", \"socks5\", \"http\" or \"reject\"");
	if ((ob->type == TS_OUT_SOCKS5 || ob->type == TS_OUT_HTTP) && !ob->has_server)
		return cfgp_fail_key(p, "server", "required for type %s", tname);
	if (ob->type != TS_OUT_SOCKS5 && ob->type != TS_OUT_HTTP) {
		if (ob->has_server)
			return cfgp_fail_key(p, "server", "not allowed for type %s", tname);
		if (user || pass)
			return cfgp_fail_key(p, user ? "username" : "password",
					     "only for types socks5 and http");
	}
	if (ob->type != TS_OUT_HTTP && CFGP_PRESENT(present, OB_HEADERS))
		return cfgp_fail_key(p, "headers", "only for type http");
	if (ob->type == TS_OUT_HTTP && user && strchr(ob->username, ':'))
		return cfgp_fail_key(p, "username", "must not contain ':' (HTTP Basic, RFC 7617)");
	if (user && has_header(ob->http_headers, "Proxy-Authorization"))
		return cfgp_fail_key(p, "headers",
				     "Proxy-Authorization given with username/password");
	if (ob->type == TS_OUT_REJECT) {
		if (ob->has_routing_mark || CFGP_PRESENT(present, OB_BIND))
			return cfgp_fail_key(p, ob->has_routing_mark ? "routing_mark" : "bind_interface",
					     "not allowed for type reject (it opens no sockets)");
	}
	if (user != pass)
		return cfgp_fail_key(p, user ? "password" : "username", "required with %s",
				     user ? "username" : "password");
	ob->has_auth = user && pass;
	/* SOCKS5 carries UDP (UDP ASSOCIATE) unless told not to; direct always does, http and
	 * reject never: the key is for socks5 only. */
	if (!CFGP_PRESENT(present, OB_UDP))
		ob->udp = ob->type == TS_OUT_SOCKS5;
	else if (ob->type != TS_OUT_SOCKS5)
		return cfgp_fail_key(p, "udp", "only for type socks5 (%s)",
				     ob->type == TS_OUT_DIRECT ? "direct always carries UDP"
							       : "this type never carries UDP");
	/* Only direct resolves a destination name itself; a proxy server resolves it there. */
	if (ob->type != TS_OUT_DIRECT && CFGP_PRESENT(present, OB_DOMAIN_STRATEGY))
		return cfgp_fail_key(p, "domain_strategy", "only for type direct");
	return 0;
}

static const struct cfgp_field outbound_fields[] = {
	[OB_TAG] = { .key = "tag", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
		     .off = offsetof(struct ts_outbound, tag) },
	[OB_TYPE] = { .key = "type", .kind = CFGP_ENUM, .names = outbound_names,
		      .off = offsetof(struct ts_outbound, type) },
	[OB_MARK] = { .key = "routing_mark", .kind = CFGP_U32, .min = 1, .max = UINT32_MAX,
		      .off = offsetof(struct ts_outbound, routing_mark),
		      .has_off = offsetof(struct ts_outbound, has_routing_mark) + 1 },
	[OB_BIND] = { .key = "bind_interface", .kind = CFGP_FN, .fn = f_bind_interface },
	[OB_SERVER] = { .key = "server", .kind = CFGP_FN, .fn = f_server,
			.has_off = offsetof(struct ts_outbound, has_server) + 1 },
	[OB_USER] = { .key = "username", .kind = CFGP_STR, .min = 1, .max = TS_CRED_MAX,
		      .off = offsetof(struct ts_outbound, username) },
	[OB_PASS] = { .key = "password", .kind = CFGP_STR, .min = 1, .max = TS_CRED_MAX,
		      .off = offsetof(struct ts_outbound, password) },
	[OB_HEADERS] = { .key = "headers", .kind = CFGP_FN, .fn = f_headers },
	[OB_UDP] = { .key = "udp", .kind = CFGP_BOOL, .off = offsetof(struct ts_outbound, udp) },
	[OB_DOMAIN_STRATEGY] = { .key = "domain_strategy", .kind = CFGP_ENUM,
				 .names = strategy_names,
				 .off = offsetof(struct ts_outbound, domain_strategy) },
};
static const struct cfgp_table outbound_table = CFGP_TABLE(outbound_fields, check_outbound);

static int f_outbounds(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_config *cfg = target;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	((struct load *)p->user)->outbounds_given = true;
	if ((ret = cfgp_array(p, item, TS_MAX_OUTBOUNDS, false, &n)) != 0)
		return ret;
	if (!(cfg->outbounds = calloc(n, sizeof(*cfg->outbounds))))
		return cfgp_nomem(p);
	cfg->n_outbounds = n;
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		ret = cfgp_object(p, e, &outbound_table, &cfg->outbounds[i], NULL);
		for (size_t j = 0; ret == 0 && j < i; j++) {
			if (strcmp(cfg->outbounds[j].tag, cfg->outbounds[i].tag) == 0)
				ret = cfgp_fail_key(p, "tag",
						    "duplicate tag \"%s\" (also $.outbounds[%zu])",
						    cfg->outbounds[i].tag, j);
		}
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		i++;
	}
	return 0;
}

/* ---- sections ----------------------------------------------------------------------------- */

enum {
	TUN_NAME, TUN_ADDR, TUN_ADDR6, TUN_MTU, TUN_TXQLEN, TUN_QUEUES, TUN_OFFLOAD, TUN_GSO, TUN_LARGE,
	TUN_RPS, TUN_IO_URING, TUN_AUTO_ROUTE, TUN_STRICT, TUN_ROUTE_ADDR, TUN_ROUTE_EXCL, TUN_INC_UID,
	TUN_EXC_UID, TUN_EXC_IF, TUN_TABLE, TUN_PRIO, TUN_N_FIELDS
};

static const char *const tun_route_keys[] = {
	[TUN_STRICT] = "strict_route", [TUN_ROUTE_ADDR] = "route_address",
	[TUN_ROUTE_EXCL] = "route_exclude_address", [TUN_INC_UID] = "include_uid",
	[TUN_EXC_UID] = "exclude_uid", [TUN_EXC_IF] = "exclude_interface",
	[TUN_TABLE] = "route_table", [TUN_PRIO] = "route_rule_priority",
};

static int check_tun(struct cfgp *p, void *target, uint32_t present)
{
	struct ts_tun *t = target;

	if (t->has_addr6 && t->mtu < 1280)
		return cfgp_fail_key(p, "mtu", "must be at least 1280 with tun.address6 (the IPv6 "
					       "minimum link MTU), got %u", t->mtu);
	for (int i = TUN_STRICT; !t->auto_route && i < TUN_N_FIELDS; i++) {
		if (CFGP_PRESENT(present, i) && (i != TUN_STRICT || t->strict_route))
			return cfgp_fail_key(p, tun_route_keys[i],
					     "only with \"auto_route\": true (the routes it "
					     "describes are installed by auto_route)");
	}
	if (t->route_table >= 253 && t->route_table <= 255)
		return cfgp_fail_key(p, "route_table", "%u is a system table (default, main, "
						       "local); pick another", t->route_table);
	return 0;
}

static const struct cfgp_field tun_fields[] = {
	{ .key = "name", .kind = CFGP_FN, .fn = f_tun_name },
	{ .key = "address", .kind = CFGP_FN, .fn = f_tun_address },
	{ .key = "address6", .kind = CFGP_FN, .fn = f_tun_address6,
	  .has_off = offsetof(struct ts_tun, has_addr6) + 1 },
	{ .key = "mtu", .kind = CFGP_U32, .min = 576, .max = 65535,
	  .off = offsetof(struct ts_tun, mtu) },
	{ .key = "txqueuelen", .kind = CFGP_U32, .min = 1, .max = 1000000,
	  .off = offsetof(struct ts_tun, txqueuelen) },
	{ .key = "queues", .kind = CFGP_FN, .fn = f_tun_queues },
	{ .key = "offload", .kind = CFGP_ENUM, .names = offload_names,
	  .off = offsetof(struct ts_tun, offload) },
	{ .key = "gso_output", .kind = CFGP_BOOL, .off = offsetof(struct ts_tun, gso_output) },
	{ .key = "large_segments", .kind = CFGP_BOOL,
	  .off = offsetof(struct ts_tun, large_segments) },
	{ .key = "rps", .kind = CFGP_ENUM, .names = rps_names, .off = offsetof(struct ts_tun, rps) },
	{ .key = "io_uring", .kind = CFGP_ENUM, .names = io_uring_names,
	  .off = offsetof(struct ts_tun, io_uring) },
	{ .key = "auto_route", .kind = CFGP_BOOL, .off = offsetof(struct ts_tun, auto_route) },
	{ .key = "strict_route", .kind = CFGP_BOOL, .off = offsetof(struct ts_tun, strict_route) },
	{ .key = "route_address", .kind = CFGP_FN, .fn = f_route_address },
	{ .key = "route_exclude_address", .kind = CFGP_FN, .fn = f_route_exclude_address },
	{ .key = "include_uid", .kind = CFGP_FN, .fn = f_include_uid },
	{ .key = "exclude_uid", .kind = CFGP_FN, .fn = f_exclude_uid },
	{ .key = "exclude_interface", .kind = CFGP_FN, .fn = f_exclude_interface },
	{ .key = "route_table", .kind = CFGP_U32, .min = 1, .max = 0xfffffff0u,
	  .off = offsetof(struct ts_tun, route_table) },
	{ .key = "route_rule_priority", .kind = CFGP_U32, .min = 1,
	  .max = 32765 - TS_ROUTE_PRIORITY_SPAN, .off = offsetof(struct ts_tun, route_rule_priority) },
};
_Static_assert(sizeof(tun_fields) / sizeof(tun_fields[0]) == TUN_N_FIELDS, "tun field order");
static const struct cfgp_table tun_table = CFGP_TABLE(tun_fields, check_tun);

static const struct cfgp_field nat_fields[] = {
	{ .key = "addresses", .kind = CFGP_U32, .min = 1, .max = TS_NAT_MAX_ADDRS,
	  .off = offsetof(struct ts_nat, addresses) },
	{ .key = "listeners", .kind = CFGP_U32, .min = 1, .max = TS_NAT_MAX_LISTENERS,
	  .off = offsetof(struct ts_nat, listeners) },
	{ .key = "linger_ms", .kind = CFGP_U32, .min = 1, .max = MS_HOUR,
	  .off = offsetof(struct ts_nat, linger_ms) },
	{ .key = "half_open_timeout_ms", .kind = CFGP_U32, .min = 1, .max = MS_HOUR,
	  .off = offsetof(struct ts_nat, half_open_timeout_ms) },
	{ .key = "port_quarantine_ms", .kind = CFGP_U32, .min = 0, .max = MS_HOUR,
	  .off = offsetof(struct ts_nat, port_quarantine_ms) },
	{ .key = "accepted_sndbuf", .kind = CFGP_U32, .min = 0, .max = 64u << 20,
	  .off = offsetof(struct ts_nat, accepted_sndbuf) },
	{ .key = "accepted_congestion", .kind = CFGP_STR, .min = 1, .max = TS_CC_NAME_MAX,
	  .off = offsetof(struct ts_nat, accepted_congestion) },
	{ .key = "fast_path", .kind = CFGP_ENUM, .names = fast_path_names,
	  .off = offsetof(struct ts_nat, fast_path) },
};

/* A congestion control's name as the kernel spells them (reno, cubic, bbr, dctcp, ...): the
 * kernel is asked at start-up whether it has it; here only the shape is checked. */
static int check_nat(struct cfgp *p, void *target, uint32_t present)
{
	const struct ts_nat *n = target;

	(void)present;
	for (const char *c = n->accepted_congestion; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_'))
			return cfgp_fail_key(p, "accepted_congestion",
					     "expected a congestion control's name (a-z, 0-9, _) "
					     "or \"host\", got \"%s\"", n->accepted_congestion);
	return 0;
}
static const struct cfgp_table nat_table = CFGP_TABLE(nat_fields, check_nat);

static const struct cfgp_field timeouts_fields[] = {
	{ .key = "connect_ms", .kind = CFGP_U32, .min = 1, .max = 600000,
	  .off = offsetof(struct ts_timeouts, connect_ms) },
	{ .key = "relay_idle_ms", .kind = CFGP_U32, .min = 1, .max = MS_DAY,
	  .off = offsetof(struct ts_timeouts, relay_idle_ms) },
	{ .key = "udp_idle_ms", .kind = CFGP_U32, .min = 1, .max = MS_DAY,
	  .off = offsetof(struct ts_timeouts, udp_idle_ms) },
};
static const struct cfgp_table timeouts_table = CFGP_TABLE(timeouts_fields, NULL);

static const struct cfgp_field relay_fields[] = {
	{ .key = "mode", .kind = CFGP_ENUM, .names = relay_names,
	  .off = offsetof(struct ts_config, relay_mode) },
	{ .key = "buffer_bytes", .kind = CFGP_U32, .min = 4096, .max = 16u << 20,
	  .off = offsetof(struct ts_config, relay_buffer_bytes) },
	{ .key = "pipe_bytes", .kind = CFGP_U32, .min = 4096, .max = 16u << 20,
	  .off = offsetof(struct ts_config, relay_pipe_bytes) },
};
static const struct cfgp_table relay_table = CFGP_TABLE(relay_fields, NULL);

static const char *const sniff_proto_names[] = { "tls", "http", "quic", NULL };

static int f_sniff_protocols(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_sniff *sn = target;
	const cJSON *e;
	size_t n, i = 0;
	int idx, ret;

	if ((ret = cfgp_array(p, item, 3, true, &n)) != 0)
		return ret;
	sn->protocols = 0;
	cJSON_ArrayForEach(e, item) {
		size_t mark = cfgp_push_index(p, i++);

		if ((ret = cfgp_enum(p, e, sniff_proto_names, &idx)) != 0)
			return ret;
		if (sn->protocols & (1u << idx))
			return cfgp_fail(p, "\"%s\" is listed twice", sniff_proto_names[idx]);
		sn->protocols |= 1u << idx;
		cfgp_pop(p, mark);
	}
	return 0;
}

static const struct cfgp_field sniff_fields[] = {
	{ .key = "enabled", .kind = CFGP_BOOL, .off = offsetof(struct ts_sniff, enabled) },
	{ .key = "override_destination", .kind = CFGP_BOOL,
	  .off = offsetof(struct ts_sniff, override_destination) },
	{ .key = "protocols", .kind = CFGP_FN, .fn = f_sniff_protocols },
	{ .key = "timeout_ms", .kind = CFGP_U32, .min = 1, .max = 10000,
	  .off = offsetof(struct ts_sniff, timeout_ms) },
	{ .key = "max_bytes", .kind = CFGP_U32, .min = 64, .max = TS_SNIFF_MAX_BYTES,
	  .off = offsetof(struct ts_sniff, max_bytes) },
};
static const struct cfgp_table sniff_table = CFGP_TABLE(sniff_fields, NULL);

static const struct cfgp_field route_fields[] = {
	{ .key = "sniff", .kind = CFGP_OBJ, .sub = &sniff_table,
	  .off = offsetof(struct ts_route, sniff),
	  .has_off = offsetof(struct ts_route, sniff) + offsetof(struct ts_sniff, present) + 1 },
	{ .key = "rules", .kind = CFGP_FN, .fn = f_rules },
	{ .key = "final", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
	  .off = offsetof(struct ts_route, final_tag) },
	{ .key = "default_mark", .kind = CFGP_U32, .min = 0, .max = UINT32_MAX,
	  .off = offsetof(struct ts_route, default_mark) },
};
static const struct cfgp_table route_table = CFGP_TABLE(route_fields, NULL);


static const struct cfgp_field stats_fields[] = {
	{ .key = "listen", .kind = CFGP_FN, .fn = f_stats_listen,
	  .has_off = offsetof(struct ts_stats, enabled) + 1 },
};
static const struct cfgp_table stats_table = CFGP_TABLE(stats_fields, NULL);

static const struct cfgp_field log_fields[] = {
	{ .key = "level", .kind = CFGP_ENUM, .names = level_names,
	  .off = offsetof(struct ts_config, log_level) },
};
static const struct cfgp_table log_table = CFGP_TABLE(log_fields, NULL);

/* ---- budgets ------------------------------------------------------------------------------ */

enum { BU_PROFILE, BU_MEM, BU_NAT, BU_TCP, BU_TCP_ELEV, BU_TCP_CRIT, BU_UDP, BU_UPQ, BU_DOWNQ,
       BU_BACKLOG, BU_BUFFER, BU_FDS };

#define BUDGET_U32(k, field, lo, hi)                                                            \
	{ .key = k, .kind = CFGP_U32, .min = lo, .max = hi,                                     \
	  .off = offsetof(struct ts_config, budget) + offsetof(struct budget_limits, field) }

/* Tiers must not increase: normal >= elevated >= critical. Blame the field the user wrote. */
static int check_tier_pair(struct cfgp *p, uint32_t present, int lo_idx,
			   const char *hi_key, const char *lo_key, uint32_t hi, uint32_t lo)
{
	if (hi >= lo)
		return 0;
	if (CFGP_PRESENT(present, lo_idx))
		return cfgp_fail_key(p, lo_key,
				     "%u exceeds %s (%u): tiers must not increase "
				     "(tcp_sessions >= tcp_sessions_elevated >= tcp_sessions_critical)",
				     lo, hi_key, hi);
	return cfgp_fail_key(p, hi_key,
			     "%u is below %s (%u, from the profile): tiers must not increase "
			     "(tcp_sessions >= tcp_sessions_elevated >= tcp_sessions_critical)",
			     hi, lo_key, lo);
}

static int check_budgets(struct cfgp *p, void *target, uint32_t present)
{
	struct ts_config *cfg = target;
	const uint32_t *t = cfg->budget.tcp_sessions;
	int ret;

	((struct load *)p->user)->budgets_present = present;
	if ((ret = check_tier_pair(p, present, BU_TCP_ELEV, "tcp_sessions",
				   "tcp_sessions_elevated", t[BUDGET_NORMAL], t[BUDGET_ELEVATED])) != 0)
		return ret;
	return check_tier_pair(p, present, BU_TCP_CRIT, "tcp_sessions_elevated",
			       "tcp_sessions_critical", t[BUDGET_ELEVATED], t[BUDGET_CRITICAL]);
}

static const struct cfgp_field budgets_fields[] = {
	[BU_PROFILE] = { .key = "profile", .kind = CFGP_FN, .fn = f_profile },
	[BU_MEM] = BUDGET_U32("memory_limit_mb", memory_limit_mb, 0, UINT32_MAX),
	[BU_NAT] = BUDGET_U32("nat_entries", nat_entries, 1, MAX_COUNT),
	[BU_TCP] = BUDGET_U32("tcp_sessions", tcp_sessions[BUDGET_NORMAL], 1, MAX_COUNT),
	[BU_TCP_ELEV] = BUDGET_U32("tcp_sessions_elevated", tcp_sessions[BUDGET_ELEVATED], 1,
				   MAX_COUNT),
	[BU_TCP_CRIT] = BUDGET_U32("tcp_sessions_critical", tcp_sessions[BUDGET_CRITICAL], 1,
				   MAX_COUNT),
	[BU_UDP] = BUDGET_U32("udp_sessions", udp_sessions, 1, MAX_COUNT),
	[BU_UPQ] = BUDGET_U32("udp_up_queue", udp_up_queue, 1, 65536),
	[BU_DOWNQ] = BUDGET_U32("udp_down_queue", udp_down_queue, 1, 65536),
	[BU_BACKLOG] = BUDGET_U32("listen_backlog", listen_backlog, 1, 65535),
	[BU_BUFFER] = { .key = "buffer_bytes", .kind = CFGP_U64, .min = 4096, .max = 1ULL << 50,
			.off = offsetof(struct ts_config, budget) +
			       offsetof(struct budget_limits, buffer_bytes) },
	[BU_FDS] = BUDGET_U32("fds", fds, 1, MAX_COUNT),
};
static const struct cfgp_table budgets_table = CFGP_TABLE(budgets_fields, check_budgets);

/* ---- the root ----------------------------------------------------------------------------- */

/* Table order is parse order: outbounds before route (rules name outbound tags, resolved in
 * validate() anyway), profile before overrides inside budgets. rule_sets are read and loaded
 * as they are parsed; the rules' rule_set tags are resolved in validate(). */
static const struct cfgp_field root_fields[] = {
	{ .key = "stack", .kind = CFGP_ENUM, .names = stack_names,
	  .off = offsetof(struct ts_config, stack) },
	{ .key = "tun", .kind = CFGP_OBJ, .sub = &tun_table, .off = offsetof(struct ts_config, tun) },
	{ .key = "nat", .kind = CFGP_OBJ, .sub = &nat_table, .off = offsetof(struct ts_config, nat) },
	{ .key = "timeouts", .kind = CFGP_OBJ, .sub = &timeouts_table,
	  .off = offsetof(struct ts_config, timeouts) },
	{ .key = "outbounds", .kind = CFGP_FN, .fn = f_outbounds },
	{ .key = "relay", .kind = CFGP_OBJ, .sub = &relay_table, .off = 0 },
	{ .key = "rule_sets", .kind = CFGP_FN, .fn = config_rule_sets_parse },
	{ .key = "route", .kind = CFGP_OBJ, .sub = &route_table,
	  .off = offsetof(struct ts_config, route) },
	{ .key = "dns", .kind = CFGP_FN, .fn = config_dns_parse },
	{ .key = "budgets", .kind = CFGP_OBJ, .sub = &budgets_table, .off = 0 },
	{ .key = "stats", .kind = CFGP_OBJ, .sub = &stats_table,
	  .off = offsetof(struct ts_config, stats) },
	{ .key = "log", .kind = CFGP_OBJ, .sub = &log_table, .off = 0 },
	{ .key = "user", .kind = CFGP_FN, .fn = f_user },
};
static const struct cfgp_table root_table = CFGP_TABLE(root_fields, NULL);

_Static_assert(sizeof(budgets_fields) / sizeof(budgets_fields[0]) <= CFGP_MAX_FIELDS,
	       "present mask");
_Static_assert(sizeof(root_fields) / sizeof(root_fields[0]) <= CFGP_MAX_FIELDS, "present mask");

/* ---- cross-field validation --------------------------------------------------------------- */

static int install_default_outbound(struct cfgp *p, struct ts_config *cfg)
{
	if (!(cfg->outbounds = calloc(1, sizeof(*cfg->outbounds))))
		return cfgp_nomem(p);
	cfg->n_outbounds = 1;
	snprintf(cfg->outbounds[0].tag, sizeof(cfg->outbounds[0].tag), "direct");
	cfg->outbounds[0].type = TS_OUT_DIRECT;
	return 0;
}

static int validate_roles(struct cfgp *p, struct ts_config *cfg)
{
	char why[256];

	if (netaddr_roles_init(&cfg->roles4, &cfg->tun.addr4, cfg->nat.addresses, why,
			       sizeof(why)) != 0)
		return cfgp_fail_at(p, "$.tun.address", "%s", why);
	if (cfg->tun.has_addr6 && netaddr_roles_init(&cfg->roles6, &cfg->tun.addr6,
						     cfg->nat.addresses, why, sizeof(why)) != 0)
		return cfgp_fail_at(p, "$.tun.address6", "%s", why);
	return 0;
}

static int resolve_tags(struct cfgp *p, struct ts_config *cfg)
{
	struct ts_route *rt = &cfg->route;
	int idx, ret;

	for (size_t i = 0; i < rt->n_rules; i++) {
		struct ts_rule *r = &rt->rules[i];
		cfgp_set_path(p, ".route.rules");
		cfgp_push_index(p, i);
		if ((idx = config_outbound_index(cfg, r->outbound_tag)) < 0)
			return cfgp_fail_key(p, "outbound", "no outbound is tagged \"%s\"",
					     r->outbound_tag);
		r->outbound = (uint32_t)idx;
		if ((ret = config_names_resolve(p, cfg, &r->names)) != 0)
			return ret;
	}
	cfgp_set_path(p, "");
	rt->rule_sets = cfg->rule_sets;
	if (rt->final_tag[0] == '\0') {
		memcpy(rt->final_tag, cfg->outbounds[0].tag, sizeof(rt->final_tag));
		rt->final = 0;
		return 0;
	}
	if ((idx = config_outbound_index(cfg, rt->final_tag)) < 0)
		return cfgp_fail_at(p, "$.route.final", "no outbound is tagged \"%s\"",
				    rt->final_tag);
	rt->final = (uint32_t)idx;
	return 0;
}

static bool is_ours(const struct ts_config *cfg, const struct netaddr *a)
{
	/* An IPv4-mapped IPv6 address reaches the IPv4 address from a dual-stack socket. */
	if (a->family == 6 && netaddr_v6_is_v4mapped(a->a))
		return netaddr_roles_is_ours(&cfg->roles4, a->a + 12);
	if (a->family == 4)
		return netaddr_roles_is_ours(&cfg->roles4, a->a);
	return netaddr_roles_is_ours(&cfg->roles6, a->a);
}

/* Is a (an IPv4-mapped address as its IPv4 one) inside one of the TUN's prefixes? */
static bool in_tun_prefix(const struct ts_config *cfg, const struct netaddr *a)
{
	struct netaddr_cidr net = cfg->tun.addr4;
	struct netaddr x = *a;

	netaddr_unmap(&x);
	if (x.family == 6) {
		if (!cfg->tun.has_addr6)
			return false;
		net = cfg->tun.addr6;
	}
	netaddr_cidr_normalize(&net);
	return netaddr_in_cidr(&x, &net);
}

/* Sending to our own gateway or NAT addresses, or anywhere else in the TUN's prefix (routed
 * into the TUN), can never reach a real peer: a loop. */
static int validate_loops(struct cfgp *p, struct ts_config *cfg)
{
	char buf[NETADDR_STRLEN];

	if (cfg->dns.has_upstream && is_ours(cfg, &cfg->dns.upstream.addr))
		return cfgp_fail_at(p, "$.dns.upstream",
				    "%s is one of the TUN's own addresses (gateway or NAT): "
				    "queries would loop",
				    netaddr_format(&cfg->dns.upstream.addr, buf, sizeof(buf)));
	if (cfg->dns.has_upstream && in_tun_prefix(cfg, &cfg->dns.upstream.addr))
		return cfgp_fail_at(p, "$.dns.upstream",
				    "%s is inside the TUN's prefix: queries would be sent into the TUN",
				    netaddr_format(&cfg->dns.upstream.addr, buf, sizeof(buf)));
	for (size_t i = 0; i < cfg->dns.n_servers; i++) {
		if (!is_ours(cfg, &cfg->dns.servers[i].addr.addr))
			continue;
		cfgp_set_path(p, ".dns.servers");
		cfgp_push_index(p, i);
		return cfgp_fail_key(p, config_dns_addr_key(&cfg->dns.servers[i]),
				     "%s is one of the TUN's own addresses (gateway or NAT): "
				     "queries would loop",
				     netaddr_format(&cfg->dns.servers[i].addr.addr, buf, sizeof(buf)));
	}
	/* A server given by name is judged at start, once resolved (the route check). */
	for (size_t i = 0; i < cfg->n_outbounds; i++) {
		const struct ts_outbound *ob = &cfg->outbounds[i];
		const char *why;

		if (!ob->has_server || !ob->server.is_addr)
			continue;
		if (is_ours(cfg, &ob->server.addr))
			why = "is one of the TUN's own addresses (gateway or NAT): connections would "
			      "loop";
		else if (!ob->bind_interface[0] && in_tun_prefix(cfg, &ob->server.addr))
			/* Bound to an interface, the prefix may be another network's there: the
			 * start's route check asks the kernel with the interface. */
			why = "is inside the TUN's prefix: connections would be sent into the TUN";
		else
			continue;
		cfgp_set_path(p, ".outbounds");
		cfgp_push_index(p, i);
		return cfgp_fail_key(p, "server", "%s %s", ob->server.host, why);
	}
	return 0;
}

/* Every outbound that opens sockets and names no routing_mark gets route.default_mark, so the
 * proxy's own traffic is marked whether or not the user thought of it. */
static void apply_default_mark(struct ts_config *cfg)
{
	for (size_t i = 0; cfg->route.default_mark && i < cfg->n_outbounds; i++) {
		struct ts_outbound *ob = &cfg->outbounds[i];
		if (ob->type == TS_OUT_REJECT || ob->has_routing_mark)
			continue;
		ob->has_routing_mark = true;
		ob->routing_mark = cfg->route.default_mark;
		ob->mark_is_default = true;
	}
}

static int validate_budget(struct cfgp *p, const struct load *ld)
{
	const struct ts_config *cfg = ld->cfg;
	const char *field = NULL;

	/* The ranges above already imply core/budget.c's own rules; this keeps the two in step. */
	if (budget_limits_check(&cfg->budget, &field) != 0)
		return cfgp_fail_at(p, "$.budgets", "limit %s is not accepted by the budget system",
				    field ? field : "?");
	if (cfg->budget.buffer_bytes >= cfg->relay_buffer_bytes)
		return 0;
	if (CFGP_PRESENT(ld->budgets_present, BU_BUFFER))
		return cfgp_fail_at(p, "$.budgets.buffer_bytes",
				    "%llu is smaller than one relay buffer (relay.buffer_bytes = %u)",
				    (unsigned long long)cfg->budget.buffer_bytes,
				    cfg->relay_buffer_bytes);
	return cfgp_fail_at(p, "$.relay.buffer_bytes",
			    "%u exceeds the whole buffer budget (budgets.buffer_bytes = %llu)",
			    cfg->relay_buffer_bytes, (unsigned long long)cfg->budget.buffer_bytes);
}

static int validate(struct cfgp *p, struct load *ld)
{
	struct ts_config *cfg = ld->cfg;
	int ret;

	if (!ld->outbounds_given && (ret = install_default_outbound(p, cfg)) != 0)
		return ret;
	if ((ret = validate_roles(p, cfg)) != 0)
		return ret;
	if ((ret = resolve_tags(p, cfg)) != 0)
		return ret;
	if ((ret = validate_loops(p, cfg)) != 0)
		return ret;
	if ((ret = config_dns_validate(p, cfg)) != 0)
		return ret;
	apply_default_mark(cfg);
	/* lwIP keeps process-global state (pcb lists, timers, memory pools) and is not
	 * thread-safe: one loop, so one TUN queue. */
	if (cfg->stack == TS_STACK_LWIP && cfg->tun.queues > 1)
		return cfgp_fail_at(p, "$.tun.queues",
				    "%u: the lwip stack runs on one queue (lwIP is single-threaded); "
				    "use 1, or \"stack\": \"system\"", cfg->tun.queues);
	return validate_budget(p, ld);
}

/* ---- loading ------------------------------------------------------------------------------ */

void config_init(struct ts_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->stack = TS_STACK_SYSTEM;
	snprintf(cfg->tun.name, sizeof(cfg->tun.name), "%s", TS_TUN_NAME_DEFAULT);
	(void)netaddr_parse_cidr("198.18.0.1/15", &cfg->tun.addr4);
	cfg->tun.mtu = TS_TUN_MTU_DEFAULT;
	cfg->tun.txqueuelen = TS_TUN_TXQUEUELEN_DEFAULT;
	cfg->tun.queues = TS_TUN_QUEUES_AUTO;
	cfg->tun.offload = TS_OFFLOAD_AUTO;
	cfg->nat.fast_path = TS_FAST_PATH_AUTO;
	cfg->tun.gso_output = true;
	cfg->tun.large_segments = true;
	cfg->tun.rps = TS_RPS_AUTO;
	cfg->tun.io_uring = TS_IO_URING_AUTO;
	cfg->tun.route_table = TS_ROUTE_TABLE_DEFAULT;
	cfg->tun.route_rule_priority = TS_ROUTE_PRIORITY_DEFAULT;
	cfg->route.default_mark = TS_DEFAULT_MARK;
	cfg->route.sniff.enabled = true; /* once route.sniff is given */
	cfg->route.sniff.protocols = TS_SNIFF_TLS | TS_SNIFF_HTTP | TS_SNIFF_QUIC;
	cfg->route.sniff.timeout_ms = 300;
	cfg->route.sniff.max_bytes = 4096;
	cfg->nat.addresses = 4;
	cfg->nat.listeners = 2;
	cfg->nat.linger_ms = 10000;
	cfg->nat.half_open_timeout_ms = 30000;
	cfg->nat.port_quarantine_ms = 60000;
	cfg->nat.accepted_sndbuf = TS_ACCEPTED_SNDBUF_AUTO;
	snprintf(cfg->nat.accepted_congestion, sizeof(cfg->nat.accepted_congestion), "reno");
	cfg->timeouts.connect_ms = 5000;
	cfg->timeouts.relay_idle_ms = 300000;
	cfg->timeouts.udp_idle_ms = 60000;
	cfg->relay_mode = TS_RELAY_SPLICE;
	cfg->relay_buffer_bytes = 65536;
	cfg->relay_pipe_bytes = 256u << 10;
	cfg->budget_profile = BUDGET_PROFILE_DESKTOP;
	budget_limits_profile(&cfg->budget, BUDGET_PROFILE_DESKTOP);
	cfg->log_level = LOG_LEVEL_INFO;
}

void config_fini(struct ts_config *cfg)
{
	for (size_t i = 0; i < cfg->route.n_rules; i++) {
		free(cfg->route.rules[i].cidrs);
		free(cfg->route.rules[i].ports);
		config_names_fini(&cfg->route.rules[i].names);
	}
	free(cfg->route.rules);
	config_rule_sets_fini(cfg);
	config_dns_fini(&cfg->dns);
	free(cfg->outbounds);
	free(cfg->tun.route_address);
	free(cfg->tun.route_exclude_address);
	free(cfg->tun.include_uid);
	free(cfg->tun.exclude_uid);
	free(cfg->tun.exclude_interface);
	config_init(cfg);
}

/* Line and column (1-based, bytes) of offset off in buf. */
static void line_col(const char *buf, size_t off, size_t *line, size_t *col)
{
	size_t l = 1, start = 0;

	for (size_t i = 0; i < off; i++) {
		if (buf[i] == '\n') {
			l++;
			start = i + 1;
		}
	}
	*line = l;
	*col = off - start + 1;
}

static size_t skip_ws(const char *s, size_t i, size_t len)
{
	while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
		i++;
	return i;
}

static int json_error(struct cfgp *p, const char *text, size_t len, size_t off, const char *what)
{
	size_t line, col, n = 0;
	char near[20], q[64];

	if (off > len)
		off = len;
	line_col(text, off, &line, &col);
	while (off + n < len && n + 1 < sizeof(near) && text[off + n] != '\n' &&
	       text[off + n] != '\r') {
		near[n] = text[off + n];
		n++;
	}
	near[n] = '\0';
	if (off >= len)
		return cfgp_fail(p, "%s at line %zu, column %zu (unexpected end of input)", what, line,
				 col);
	if (n == 0)
		return cfgp_fail(p, "%s at line %zu, column %zu (end of line)", what, line, col);
	return cfgp_fail(p, "%s at line %zu, column %zu, near \"%s\"", what, line, col,
			 cfgp_quote(near, q, sizeof(q)));
}

/* text is NUL-terminated at len and holds no other NUL. */
static int parse_text(struct cfgp *p, struct load *ld, const char *text, size_t len)
{
	const char *end = NULL;
	cJSON *root;
	int ret;

	if (skip_ws(text, 0, len) == len)
		return cfgp_fail(p, "empty input (expected a JSON object)");
	root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 0);
	if (!root)
		return json_error(p, text, len, end ? (size_t)(end - text) : 0, "invalid JSON");
	size_t tail = skip_ws(text, (size_t)(end - text), len);
	if (tail < len)
		ret = json_error(p, text, len, tail, "unexpected text after the JSON value");
	else
		ret = cfgp_object(p, root, &root_table, ld->cfg, NULL);
	cJSON_Delete(root);
	if (ret == 0)
		ret = validate(p, ld);
	return ret;
}

/* cJSON decodes the escape \u0000 into a NUL byte, which ends the C string it is in: "ab\u0000cd"
 * would be read as "ab", a key "stack\u0000x" as "stack". Each such escape becomes \u0001
 * (same length), a control character that every string and key check refuses, so the
 * message names the field. A backslash escapes the byte after it, so "\\u0000" (an escaped
 * backslash, then text) is left alone; outside strings a backslash is not JSON anyway. */
static void nul_escapes_to_control(char *t, size_t len)
{
	for (size_t i = 0; i + 1 < len; i++) {
		if (t[i] != '\\')
			continue;
		if (t[i + 1] == 'u' && i + 5 < len && memcmp(t + i + 2, "0000", 4) == 0)
			t[i + 5] = '1';
		i++; /* the escaped byte */
	}
}

int config_load_buffer(const char *buf, size_t len, struct ts_config *cfg, char *err,
		       size_t errlen)
{
	struct load ld = { .cfg = cfg };
	struct cfgp p;
	const char *nul;
	char *text;
	int ret;

	config_init(cfg);
	cfgp_init(&p, err, errlen, &ld);
	if ((nul = memchr(buf, '\0', len)))
		return cfgp_fail(&p, "NUL byte at offset %zu", (size_t)(nul - buf));
	if (!(text = malloc(len + 1)))
		return cfgp_nomem(&p);
	memcpy(text, buf, len);
	text[len] = '\0';
	nul_escapes_to_control(text, len);
	ret = parse_text(&p, &ld, text, len);
	free(text);
	if (ret != 0)
		config_fini(cfg);
	return ret;
}

int config_load_string(const char *json, struct ts_config *cfg, char *err, size_t errlen)
{
	return config_load_buffer(json, strlen(json), cfg, err, errlen);
}

/* Read at most TS_CONFIG_FILE_MAX bytes; 0 or -errno with a message. */
static int read_file(const char *path, char **out, size_t *out_len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	size_t len = 0, cap = 0;
	char *buf = NULL, ebuf[128];
	int ret = 0;

	if (!f) {
		ret = -errno;
		goto fail;
	}
	for (;;) {
		if (len == cap) {
			/* One byte past the limit tells "too large" from "exactly at it". */
			size_t ncap = cap ? cap * 2 : 4096;
			char *nb;
			if (cap == TS_CONFIG_FILE_MAX + 1) {
				ret = -EFBIG;
				goto fail;
			}
			if (ncap > TS_CONFIG_FILE_MAX + 1)
				ncap = TS_CONFIG_FILE_MAX + 1;
			if (!(nb = realloc(buf, ncap))) {
				ret = -ENOMEM;
				goto fail;
			}
			buf = nb;
			cap = ncap;
		}
		size_t n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (n == 0) {
			if (ferror(f))
				ret = -(errno ? errno : EIO);
			break;
		}
	}
	if (ret == 0 && len > TS_CONFIG_FILE_MAX)
		ret = -EFBIG;
	if (ret != 0)
		goto fail;
	fclose(f);
	*out = buf;
	*out_len = len;
	return 0;
fail:
	if (f)
		fclose(f);
	free(buf);
	if (err && errlen > 0)
		snprintf(err, errlen, "config: %s: %s", path,
			 ret == -EFBIG ? "larger than 16 MiB" : strerror_r(-ret, ebuf, sizeof(ebuf)));
	return ret;
}

int config_load_file(const char *path, struct ts_config *cfg, char *err, size_t errlen)
{
	char *buf = NULL;
	size_t len = 0;
	int ret;

	config_init(cfg);
	if ((ret = read_file(path, &buf, &len, err, errlen)) != 0)
		return ret;
	ret = config_load_buffer(buf, len, cfg, err, errlen);
	free(buf);
	return ret;
}

/* ---- views -------------------------------------------------------------------------------- */

int config_outbound_index(const struct ts_config *cfg, const char *tag)
{
	for (size_t i = 0; i < cfg->n_outbounds; i++)
		if (strcmp(cfg->outbounds[i].tag, tag) == 0)
			return (int)i;
	return -1;
}

static void roles_summary(const struct netaddr_roles *r, char *buf, size_t len)
{
	char first[NETADDR_STRLEN], last[NETADDR_STRLEN];
	struct netaddr a;

	netaddr_roles_nat(r, 0, &a);
	netaddr_format(&a, first, sizeof(first));
	if (r->n_nat == 1) {
		snprintf(buf, len, "%s", first);
		return;
	}
	netaddr_roles_nat(r, r->n_nat - 1, &a);
	snprintf(buf, len, "%s-%s", first, netaddr_format(&a, last, sizeof(last)));
}

size_t config_summary_size(const struct ts_config *cfg)
{
	return 512 + cfg->n_rule_sets * (TS_TAG_MAX + 80);
}

char *config_summary(const struct ts_config *cfg, char *buf, size_t len)
{
	char tun[NETADDR_CIDR_STRLEN], nat[2 * NETADDR_STRLEN + 2];
	char tun6[NETADDR_CIDR_STRLEN], nat6[2 * NETADDR_STRLEN + 2], v6[160] = "";

	netaddr_cidr_format(&cfg->tun.addr4, tun, sizeof(tun));
	roles_summary(&cfg->roles4, nat, sizeof(nat));
	if (cfg->tun.has_addr6 && cfg->roles6.family == 6) {
		netaddr_cidr_format(&cfg->tun.addr6, tun6, sizeof(tun6));
		roles_summary(&cfg->roles6, nat6, sizeof(nat6));
		snprintf(v6, sizeof(v6), " tun6=%s nat6=%s", tun6, nat6);
	}
	int n = snprintf(buf, len, "stack=%s tun=%s %s nat=%s%s outbounds=%zu rules=%zu",
			 config_stack_name(cfg->stack), cfg->tun.name, tun, nat, v6,
			 cfg->n_outbounds, cfg->route.n_rules);
	if (n > 0 && (size_t)n < len)
		config_rule_sets_summary(cfg, buf + n, len - (size_t)n);
	return buf;
}

const char *config_stack_name(enum ts_stack s)
{
	return (unsigned)s < 2 ? stack_names[s] : "?";
}

uint32_t config_auto_queues(const struct ts_config *cfg, bool caller_tun, unsigned cpus)
{
	/* A second queue gives the system stack a second thread for its TUN I/O and the kernel's
	 * receive work inside it; lwIP is single-threaded, a caller's TUN has the queues it was
	 * opened with, and the per-packet mode was not measured to gain from it. */
	if (cfg->stack != TS_STACK_SYSTEM || caller_tun || cfg->tun.offload == TS_OFFLOAD_OFF ||
	    cpus < 2)
		return 1;
	return cpus < TS_TUN_QUEUES_AUTO_MAX ? cpus : TS_TUN_QUEUES_AUTO_MAX;
}

const char *config_outbound_type_name(enum ts_outbound_type t)
{
	return (unsigned)t < 4 ? outbound_names[t] : "?";
}
