/* config_dns.c — the "dns" section of the configuration: hijack, the forwarder's single
 * upstream, and the proxy's own resolver (servers, rules, final, hosts, ipv6, cache), with the
 * cross-checks that need the outbounds (a server's detour) done at validation.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/config.h"
#include "core/config_dns.h"
#include "core/config_names.h"
#include "core/domain_set.h"

#define DNS_PORT 53
#define DOT_PORT 853                 /* RFC 7858 section 3.1 */
#define DOH_PORT 443
#define CACHE_SIZE_DEFAULT 4096
#define CACHE_MAX_TTL_DEFAULT 3600

static const char *const ipv6_names[] = { "answer", "empty", NULL };
static const char *const action_names[] = { "refuse", "empty", NULL };

/* ---- servers ------------------------------------------------------------------------------ */

/* A label of s (n bytes) longer than a DNS label can be: 63 bytes (RFC 1035 section
 * 2.3.4). */
static bool label_too_long(const char *s, size_t n)
{
	size_t run = 0;

	for (size_t i = 0; i < n; i++) {
		run = s[i] == '.' ? 0 : run + 1;
		if (run > 63)
			return true;
	}
	return false;
}

/* A host name a certificate is checked against: letters, digits, '-' and '.', no empty
 * label, no label that begins or ends with '-' (RFC 1123 section 2.1) or is longer than 63
 * bytes, no trailing dot. */
static bool host_name_ok(const char *s, size_t n)
{
	if (n == 0 || n > 253 || s[n - 1] == '.' || s[0] == '-' || s[n - 1] == '-' ||
	    label_too_long(s, n))
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (!(isalnum(c) || c == '-' || (c == '.' && i > 0 && s[i - 1] != '.')))
			return false;
		if (c == '.' && (s[i - 1] == '-' || s[i + 1] == '-'))
			return false;
	}
	return true;
}

/* "https://HOST[:PORT][/PATH]": HOST a name or an address ([IPv6]); port 443, path
 * "/dns-query" by default. A host that is an address is also where to connect. Each part is
 * bounded by what is kept of it: -ENAMETOOLONG a path longer than sv->path holds, -EMSGSIZE a
 * host longer than sv->sni holds, -ERANGE a host name with a label longer than a DNS label. */
static int parse_https(const char *s, struct ts_dns_server *sv)
{
	const char *slash = strchr(s, '/'), *end = slash ? slash : s + strlen(s), *hend, *colon;
	bool bracketed = s[0] == '[';
	char host[256];
	size_t hl;

	sv->transport = TS_DNS_HTTPS;
	sv->addr.port = DOH_PORT;
	if (slash && strlen(slash) >= sizeof(sv->path))
		return -ENAMETOOLONG;
	if (bracketed) {
		if (!(hend = memchr(s, ']', (size_t)(end - s))))
			return -EINVAL;
		s++;
		colon = hend + 1 < end && hend[1] == ':' ? hend + 1 : NULL;
		if (hend + 1 < end && !colon)
			return -EINVAL;
	} else {
		colon = memchr(s, ':', (size_t)(end - s));
		hend = colon ? colon : end;
	}
	if ((hl = (size_t)(hend - s)) >= sizeof(sv->sni))
		return -EMSGSIZE;
	if (hl == 0)
		return -EINVAL;
	memcpy(host, s, hl);
	host[hl] = 0;
	if (colon) {
		char port[8];
		size_t pl = (size_t)(end - colon - 1);
		if (pl == 0 || pl >= sizeof(port))
			return -EINVAL;
		memcpy(port, colon + 1, pl);
		port[pl] = 0;
		if (netaddr_parse_port(port, &sv->addr.port) != 0)
			return -EINVAL;
	}
	if (netaddr_parse(host, &sv->addr.addr) == 0) {
		if (bracketed != (sv->addr.addr.family == 6))
			return -EINVAL; /* brackets hold an IPv6 address, and one needs them */
		netaddr_unmap(&sv->addr.addr);
		sv->host_is_addr = true;
	} else if (!bracketed && label_too_long(host, hl)) {
		return -ERANGE;
	} else if (bracketed || !host_name_ok(host, hl)) {
		return -EINVAL;
	}
	memcpy(sv->sni, host, hl + 1);
	snprintf(sv->path, sizeof(sv->path), "%s", slash ? slash : "/dns-query");
	for (const char *c = sv->path; *c; c++)
		if ((unsigned char)*c <= ' ' || *c == 0x7f)
			return -EINVAL;
	return 0;
}

/* "udp://ADDR[:PORT]", "tcp://ADDR[:PORT]", "tls://ADDR[:PORT]", "https://HOST[:PORT][/PATH]"
 * or "ADDR[:PORT]" (udp); IPv6 in brackets with a port; the port defaults to 53 (tls: 853,
 * https: 443). */
static int parse_server_address(const char *s, struct ts_dns_server *sv)
{
	char buf[NETADDR_EP_STRLEN + 8];

	if (strncmp(s, "https://", 8) == 0)
		return parse_https(s + 8, sv);
	sv->transport = TS_DNS_UDP;
	if (strncmp(s, "udp://", 6) == 0) {
		s += 6;
	} else if (strncmp(s, "tcp://", 6) == 0) {
		sv->transport = TS_DNS_TCP;
		s += 6;
	} else if (strncmp(s, "tls://", 6) == 0) {
		sv->transport = TS_DNS_TLS;
		s += 6;
	} else if (strstr(s, "://")) {
		return -EPROTONOSUPPORT;
	}
	if (netaddr_parse_ep(s, &sv->addr) == 0) {
		netaddr_unmap(&sv->addr.addr);
		return 0;
	}
	if (netaddr_parse(s, &sv->addr.addr) != 0) {
		/* "[v6]" without a port */
		size_t n = strlen(s);
		if (n < 3 || s[0] != '[' || s[n - 1] != ']' || n - 2 >= sizeof(buf))
			return -EINVAL;
		memcpy(buf, s + 1, n - 2);
		buf[n - 2] = 0;
		if (netaddr_parse(buf, &sv->addr.addr) != 0 || sv->addr.addr.family != 6)
			return -EINVAL;
	} else if (sv->addr.addr.family == 6) {
		return -EINVAL; /* IPv6 needs its brackets: "fd00::1:5353" is not port 5353 */
	}
	netaddr_unmap(&sv->addr.addr);
	sv->addr.port = sv->transport == TS_DNS_TLS ? DOT_PORT : DNS_PORT;
	return 0;
}

static int f_server_address(struct cfgp *p, const cJSON *item, void *target)
{
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, 600, &s)) != 0)
		return ret;
	ret = parse_server_address(s, target);
	if (ret == -EPROTONOSUPPORT)
		return cfgp_fail(p, "\"%s\": the transports are udp://, tcp://, tls:// and https://",
				 cfgp_quote(s, q, sizeof(q)));
	if (ret == -ENAMETOOLONG)
		return cfgp_fail(p, "the URL's path is longer than %zu bytes",
				 sizeof(((struct ts_dns_server *)target)->path) - 1);
	if (ret == -EMSGSIZE)
		return cfgp_fail(p, "the URL's host is longer than %zu bytes",
				 sizeof(((struct ts_dns_server *)target)->sni) - 1);
	if (ret == -ERANGE)
		return cfgp_fail(p, "a label of the URL's host is longer than 63 bytes");
	if (ret != 0)
		return cfgp_fail(p, "expected \"udp://ip[:port]\", \"tcp://ip[:port]\", "
				    "\"tls://ip[:port]\", \"https://host[:port][/path]\" or \"ip[:port]\" "
				    "(IPv6 in brackets), got \"%s\"",
				 cfgp_quote(s, q, sizeof(q)));
	return 0;
}

/* A host name the certificate is checked against: letters, digits, '-' and '.', no empty
 * label (an IP address is no SNI: RFC 6066 section 3). */
static int f_sni(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns_server *sv = target;
	const char *s;
	size_t n;
	int ret;

	if ((ret = cfgp_string(p, item, 1, sizeof(sv->sni) - 1, &s)) != 0)
		return ret;
	n = strlen(s);
	if (!host_name_ok(s, n))
		return cfgp_fail(p, "a host name (letters, digits, '-', '.'; labels of at most 63 "
				    "bytes; no trailing dot), got \"%s\"", s);
	if (netaddr_parse(s, &(struct netaddr){ 0 }) == 0)
		return cfgp_fail(p, "a host name, not an address (a TLS server name cannot be one), "
				    "got \"%s\"", s);
	memcpy(sv->sni, s, n + 1);
	return 0;
}

/* path is a readable regular file of at most CA_FILE_MAX bytes with a PEM certificate in it
 * (what OpenSSL's CA file loading takes): a directory, a device, an empty file or a key alone
 * would pass a readability check and fail only at start, without naming the field. */
#define CA_FILE_MAX (16u << 20)

static int ca_file_check(struct cfgp *p, const char *path)
{
	static const char *const marks[] = { "-----BEGIN CERTIFICATE-----",
					     "-----BEGIN TRUSTED CERTIFICATE-----",
					     "-----BEGIN X509 CERTIFICATE-----" };
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	bool found = false;
	int fd, ret = 0;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return cfgp_fail(p, "cannot read %s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		ret = cfgp_fail(p, "cannot read %s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = cfgp_fail(p, "%s is not a regular file (a PEM file of CA certificates)", path);
		goto out;
	}
	if ((uint64_t)st.st_size > CA_FILE_MAX) {
		ret = cfgp_fail(p, "%s is larger than 16 MiB", path);
		goto out;
	}
	if (!(buf = malloc((size_t)st.st_size + 1))) {
		ret = cfgp_nomem(p);
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = cfgp_fail(p, "cannot read %s: %s", path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]) && !found; i++)
		found = memmem(buf, got, marks[i], strlen(marks[i])) != NULL;
	if (!found)
		ret = cfgp_fail(p, "%s holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")",
				path);
out:
	free(buf);
	close(fd);
	return ret;
}

static int f_ca(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns_server *sv = target;
	const char *s;
	int ret;

	if ((ret = cfgp_string(p, item, 1, 4096, &s)) != 0)
		return ret;
	/* Its certificates are loaded at start (dns/upstream.c); a path that cannot be read, or
	 * holds no PEM certificate, is refused here, where the message can name the field. */
	if ((ret = ca_file_check(p, s)) != 0)
		return ret;
	free(sv->ca);
	if (!(sv->ca = strdup(s)))
		return cfgp_nomem(p);
	return 0;
}

/* https with a host name: the address to connect to (names are not resolved at start, and a
 * resolver's name must not need the resolver). */
static int f_address_ip(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns_server *sv = target;
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, NETADDR_STRLEN, &s)) != 0)
		return ret;
	if (netaddr_parse(s, &sv->addr.addr) != 0)
		return cfgp_fail(p, "expected an IPv4 or IPv6 address, got \"%s\"",
				 cfgp_quote(s, q, sizeof(q)));
	netaddr_unmap(&sv->addr.addr);
	return 0;
}

enum { SV_TAG, SV_ADDRESS, SV_DETOUR, SV_SNI, SV_CA, SV_ADDRESS_IP };

static int check_server(struct cfgp *p, void *target, uint32_t present)
{
	const struct ts_dns_server *sv = target;
	bool tls, https;

	if (!CFGP_PRESENT(present, SV_TAG))
		return cfgp_fail_key(p, "tag", "required: the name rules and final use");
	if (!CFGP_PRESENT(present, SV_ADDRESS))
		return cfgp_fail_key(p, "address", "required, e.g. \"udp://192.0.2.53\"");
	tls = sv->transport == TS_DNS_TLS;
	https = sv->transport == TS_DNS_HTTPS;
	if (tls && !CFGP_PRESENT(present, SV_SNI))
		return cfgp_fail_key(p, "sni", "required for tls://: the name the server's "
				     "certificate must carry, e.g. \"dns.example\"");
	if (!tls && CFGP_PRESENT(present, SV_SNI))
		return cfgp_fail_key(p, "sni", https ? "not for https://: the URL's host is the name"
				     : "only for a tls:// address");
	if (!tls && !https && CFGP_PRESENT(present, SV_CA))
		return cfgp_fail_key(p, "ca", "only for a tls:// or https:// address");
	if (https && !sv->host_is_addr && !CFGP_PRESENT(present, SV_ADDRESS_IP))
		return cfgp_fail_key(p, "address_ip", "required for https:// with a host name: the "
				     "address to connect to (names are not resolved at start)");
	if ((!https || sv->host_is_addr) && CFGP_PRESENT(present, SV_ADDRESS_IP))
		return cfgp_fail_key(p, "address_ip", "only for https:// with a host name");
	return 0;
}

static const struct cfgp_field server_fields[] = {
	[SV_TAG] = { .key = "tag", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
		     .off = offsetof(struct ts_dns_server, tag) },
	[SV_ADDRESS] = { .key = "address", .kind = CFGP_FN, .fn = f_server_address },
	[SV_DETOUR] = { .key = "detour", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
			.off = offsetof(struct ts_dns_server, detour_tag) },
	[SV_SNI] = { .key = "sni", .kind = CFGP_FN, .fn = f_sni },
	[SV_CA] = { .key = "ca", .kind = CFGP_FN, .fn = f_ca },
	[SV_ADDRESS_IP] = { .key = "address_ip", .kind = CFGP_FN, .fn = f_address_ip },
};
static const struct cfgp_table server_table = CFGP_TABLE(server_fields, check_server);

static int f_servers(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns *d = target;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, TS_DNS_MAX_SERVERS, false, &n)) != 0)
		return ret;
	if (!(d->servers = calloc(n, sizeof(*d->servers))))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		d->n_servers = i + 1;
		ret = cfgp_object(p, e, &server_table, &d->servers[i], NULL);
		for (size_t j = 0; ret == 0 && j < i; j++)
			if (strcmp(d->servers[j].tag, d->servers[i].tag) == 0)
				ret = cfgp_fail_key(p, "tag", "\"%s\" is already the tag of servers[%zu]",
						    d->servers[i].tag, j);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		i++;
	}
	return 0;
}

/* ---- rules -------------------------------------------------------------------------------- */

static int f_action(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns_rule *r = target;
	int idx, ret;

	if ((ret = cfgp_enum(p, item, action_names, &idx)) != 0)
		return ret;
	r->action = idx == 0 ? TS_DNS_ACT_REFUSE : TS_DNS_ACT_EMPTY;
	return 0;
}

enum { DR_DOMAIN, DR_SUFFIX, DR_KEYWORD, DR_REGEX, DR_RULE_SET, DR_SERVER, DR_ACTION };

static int check_dns_rule(struct cfgp *p, void *target, uint32_t present)
{
	(void)target;
	if (!(present & ((1u << DR_DOMAIN) | (1u << DR_SUFFIX) | (1u << DR_KEYWORD) |
			 (1u << DR_REGEX) | (1u << DR_RULE_SET))))
		return cfgp_fail(p, "a rule needs a name matcher (" CONFIG_NAMES_KEYS ")");
	if (CFGP_PRESENT(present, DR_SERVER) == CFGP_PRESENT(present, DR_ACTION))
		return cfgp_fail(p, "a rule needs one of \"server\" (a server's tag) or "
				    "\"action\" (\"refuse\" or \"empty\")");
	return 0;
}

static const struct cfgp_field dns_rule_fields[] = {
	[DR_DOMAIN] = { .key = "domain", .kind = CFGP_FN, .fn = config_names_f_domain },
	[DR_SUFFIX] = { .key = "domain_suffix", .kind = CFGP_FN, .fn = config_names_f_suffix },
	[DR_KEYWORD] = { .key = "domain_keyword", .kind = CFGP_FN, .fn = config_names_f_keyword },
	[DR_REGEX] = { .key = "domain_regex", .kind = CFGP_FN, .fn = config_names_f_regex },
	[DR_RULE_SET] = { .key = "rule_set", .kind = CFGP_FN, .fn = config_names_f_rule_set },
	[DR_SERVER] = { .key = "server", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
			.off = offsetof(struct ts_dns_rule, server_tag) },
	[DR_ACTION] = { .key = "action", .kind = CFGP_FN, .fn = f_action },
};
static const struct cfgp_table dns_rule_table = CFGP_TABLE(dns_rule_fields, check_dns_rule);

static int f_dns_rules(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns *d = target;
	const cJSON *e;
	size_t n, i = 0;
	int ret;

	if ((ret = cfgp_array(p, item, TS_MAX_RULES, true, &n)) != 0)
		return ret;
	if (n == 0)
		return 0;
	if (!(d->rules = calloc(n, sizeof(*d->rules))))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_index(p, i);
		d->n_rules = i + 1;
		ret = cfgp_object(p, e, &dns_rule_table, &d->rules[i], NULL);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		i++;
	}
	return 0;
}

/* ---- hosts -------------------------------------------------------------------------------- */

static int host_addr(struct cfgp *p, const cJSON *e, struct ts_dns_host *h)
{
	struct netaddr a;
	char q[64];

	if (!cJSON_IsString(e))
		return cfgp_fail(p, "expected an IP address string, got %s", cfgp_type_name(e));
	if (netaddr_parse(e->valuestring, &a) != 0)
		return cfgp_fail(p, "\"%s\" is not an IPv4 or IPv6 address",
				 cfgp_quote(e->valuestring, q, sizeof(q)));
	if (a.family == 4) {
		if (h->n4 == TS_DNS_HOST_ADDRS)
			return cfgp_fail(p, "at most %d IPv4 addresses a name", TS_DNS_HOST_ADDRS);
		memcpy(h->a4[h->n4++], a.a, 4);
	} else {
		if (h->n6 == TS_DNS_HOST_ADDRS)
			return cfgp_fail(p, "at most %d IPv6 addresses a name", TS_DNS_HOST_ADDRS);
		memcpy(h->a6[h->n6++], a.a, 16);
	}
	return 0;
}

/* One "name": "addr" or "name": ["addr", ...] entry into h. */
static int host_entry(struct cfgp *p, const cJSON *e, struct ts_dns_host *h)
{
	char q[64];
	size_t i = 0;
	const cJSON *a;
	int ret = 0;

	_Static_assert(sizeof(h->name) == DOMAIN_NAME_MAX + 1, "a host name is a set's name");
	if (domain_name_normalize(e->string, strlen(e->string), h->name) < 0)
		return cfgp_fail(p, "\"%s\" is not a host name (letters, digits, '-', '_' and "
				    "dots; labels of 1 to 63 bytes)", cfgp_quote(e->string, q, sizeof(q)));
	if (cJSON_IsString(e))
		return host_addr(p, e, h);
	if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) == 0)
		return cfgp_fail(p, "expected an address or a non-empty array of addresses, got %s",
				 cfgp_type_name(e));
	cJSON_ArrayForEach(a, e)
	{
		size_t mark = cfgp_push_index(p, i++);
		ret = host_addr(p, a, h);
		cfgp_pop(p, mark);
		if (ret != 0)
			break;
	}
	return ret;
}

static int host_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ts_dns_host *)a)->name, ((const struct ts_dns_host *)b)->name);
}

static int f_hosts(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns *d = target;
	const cJSON *e;
	size_t n;
	int ret = 0;

	if (!cJSON_IsObject(item))
		return cfgp_fail(p, "expected an object of name: address(es), got %s",
				 cfgp_type_name(item));
	n = (size_t)cJSON_GetArraySize(item);
	if (n > TS_DNS_MAX_HOSTS)
		return cfgp_fail(p, "%zu names: at most %d", n, TS_DNS_MAX_HOSTS);
	if (n == 0)
		return 0;
	if (!(d->hosts = calloc(n, sizeof(*d->hosts))))
		return cfgp_nomem(p);
	cJSON_ArrayForEach(e, item)
	{
		size_t mark = cfgp_push_key(p, e->string);
		ret = host_entry(p, e, &d->hosts[d->n_hosts]);
		cfgp_pop(p, mark);
		if (ret != 0)
			return ret;
		d->n_hosts++;
	}
	qsort(d->hosts, d->n_hosts, sizeof(*d->hosts), host_cmp);
	for (size_t i = 1; i < d->n_hosts; i++)
		if (strcmp(d->hosts[i - 1].name, d->hosts[i].name) == 0)
			return cfgp_fail(p, "\"%s\" is listed twice (names are not case-sensitive)",
					 d->hosts[i].name);
	return 0;
}

/* ---- the section -------------------------------------------------------------------------- */

static int f_upstream(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns *d = target;
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, NETADDR_EP_STRLEN, &s)) != 0)
		return ret;
	if (netaddr_parse_ep(s, &d->upstream) != 0)
		return cfgp_fail(p, "expected \"ip:port\" (IPv4 or [IPv6]; port 1-65535), got \"%s\"",
				 cfgp_quote(s, q, sizeof(q)));
	netaddr_unmap(&d->upstream.addr);
	return 0;
}

enum { CACHE_SIZE, CACHE_MAX_TTL };

static const struct cfgp_field cache_fields[] = {
	[CACHE_SIZE] = { .key = "size", .kind = CFGP_U32, .min = 0, .max = 1u << 20,
	  .off = offsetof(struct ts_dns, cache_size) },
	[CACHE_MAX_TTL] = { .key = "max_ttl_s", .kind = CFGP_U32, .min = 1, .max = 7 * 86400,
	  .off = offsetof(struct ts_dns, cache_max_ttl_s) },
};
/* A member left out keeps its default (size 0, given, turns the cache off). */
static int check_cache(struct cfgp *p, void *target, uint32_t present)
{
	struct ts_dns *d = target;

	(void)p;
	if (!CFGP_PRESENT(present, CACHE_SIZE))
		d->cache_size = CACHE_SIZE_DEFAULT;
	if (!CFGP_PRESENT(present, CACHE_MAX_TTL))
		d->cache_max_ttl_s = CACHE_MAX_TTL_DEFAULT;
	return 0;
}

static const struct cfgp_table cache_table = CFGP_TABLE(cache_fields, check_cache);

/* ---- fakeip ------------------------------------------------------------------------------- */

static int fake_range(struct cfgp *p, const cJSON *item, struct netaddr_cidr *c, int family)
{
	const char *s;
	char q[64];
	int ret;

	if ((ret = cfgp_string(p, item, 1, NETADDR_CIDR_STRLEN, &s)) != 0)
		return ret;
	if (netaddr_parse_cidr(s, c) != 0 || c->addr.family != family)
		return cfgp_fail(p, "expected an IPv%d prefix (\"%s\"), got \"%s\"", family,
				 family == 4 ? "198.19.0.0/16" : "fd00:7f::8000:0:0:0/65",
				 cfgp_quote(s, q, sizeof(q)));
	netaddr_cidr_normalize(c);
	if ((family == 4 && c->prefix > 30) || (family == 6 && c->prefix > 126))
		return cfgp_fail(p, "/%u holds too few addresses (at most /%d)", c->prefix,
				 family == 4 ? 30 : 126);
	return 0;
}

static int f_range4(struct cfgp *p, const cJSON *item, void *target)
{
	return fake_range(p, item, &((struct ts_fakeip *)target)->range4, 4);
}

static int f_range6(struct cfgp *p, const cJSON *item, void *target)
{
	return fake_range(p, item, &((struct ts_fakeip *)target)->range6, 6);
}

static int f_persist(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_fakeip *f = target;
	const char *s;
	int ret;

	if ((ret = cfgp_string(p, item, 1, 4096, &s)) != 0)
		return ret;
	if (s[0] != '/')
		return cfgp_fail(p, "an absolute path, got \"%s\"", s);
	free(f->persist);
	if (!(f->persist = strdup(s)))
		return cfgp_nomem(p);
	return 0;
}

static const struct cfgp_field exclude_fields[] = {
	{ .key = "domain", .kind = CFGP_FN, .fn = config_names_f_domain },
	{ .key = "domain_suffix", .kind = CFGP_FN, .fn = config_names_f_suffix },
	{ .key = "domain_keyword", .kind = CFGP_FN, .fn = config_names_f_keyword },
	{ .key = "domain_regex", .kind = CFGP_FN, .fn = config_names_f_regex },
	{ .key = "rule_set", .kind = CFGP_FN, .fn = config_names_f_rule_set },
};
static const struct cfgp_table exclude_table = CFGP_TABLE(exclude_fields, NULL);

static int f_exclude(struct cfgp *p, const cJSON *item, void *target)
{
	return cfgp_object(p, item, &exclude_table, &((struct ts_fakeip *)target)->exclude, NULL);
}

enum { FK_ENABLED, FK_R4, FK_R6, FK_MAX, FK_REUSE, FK_EXCLUDE, FK_PERSIST };

static int check_fakeip(struct cfgp *p, void *target, uint32_t present)
{
	struct ts_fakeip *f = target;

	if (!CFGP_PRESENT(present, FK_ENABLED))
		f->enabled = true; /* writing the object is asking for it */
	if (!CFGP_PRESENT(present, FK_MAX))
		f->max_mappings = 65536;
	if (!CFGP_PRESENT(present, FK_REUSE))
		f->reuse_after_s = 600;
	return 0;
}

static const struct cfgp_field fakeip_fields[] = {
	[FK_ENABLED] = { .key = "enabled", .kind = CFGP_BOOL, .off = offsetof(struct ts_fakeip, enabled) },
	[FK_R4] = { .key = "inet4_range", .kind = CFGP_FN, .fn = f_range4 },
	[FK_R6] = { .key = "inet6_range", .kind = CFGP_FN, .fn = f_range6 },
	[FK_MAX] = { .key = "max_mappings", .kind = CFGP_U32, .min = 1, .max = 1u << 22,
		     .off = offsetof(struct ts_fakeip, max_mappings) },
	[FK_REUSE] = { .key = "reuse_after_s", .kind = CFGP_U32, .min = 0, .max = 7 * 86400,
		       .off = offsetof(struct ts_fakeip, reuse_after_s) },
	[FK_EXCLUDE] = { .key = "exclude", .kind = CFGP_FN, .fn = f_exclude },
	[FK_PERSIST] = { .key = "persist", .kind = CFGP_FN, .fn = f_persist },
};
static const struct cfgp_table fakeip_table = CFGP_TABLE(fakeip_fields, check_fakeip);

static int f_fakeip(struct cfgp *p, const cJSON *item, void *target)
{
	return cfgp_object(p, item, &fakeip_table, &((struct ts_dns *)target)->fakeip, NULL);
}

enum { DNS_HIJACK, DNS_UPSTREAM, DNS_SERVERS, DNS_RULES, DNS_FINAL, DNS_HOSTS, DNS_IPV6,
       DNS_CACHE, DNS_FAKEIP };

static const char *const dns_fields_keys[] = { "hijack", "upstream", "servers", "rules", "final",
					       "hosts", "ipv6", "cache", "fakeip" };

static int check_dns(struct cfgp *p, void *target, uint32_t present)
{
	struct ts_dns *d = target;

	if (d->has_upstream && d->n_servers)
		return cfgp_fail_key(p, "upstream", "give either upstream (queries forwarded as "
				     "they are) or servers (the proxy answers itself), not both");
	if (d->hijack && !d->has_upstream && !d->n_servers)
		return cfgp_fail_key(p, "servers", "required when hijack is true (or upstream)");
	if (d->n_servers && !d->hijack)
		return cfgp_fail_key(p, "hijack", "must be true with servers: the resolver answers the "
				     "queries the TUN hijacks");
	if (d->has_upstream && !d->hijack)
		return cfgp_fail_key(p, "upstream", "needs hijack: true (upstream receives the queries "
				     "the TUN hijacks; without it, it would never be used)");
	for (int k = DNS_RULES; k <= DNS_FAKEIP; k++)
		if (CFGP_PRESENT(present, k) && !d->n_servers)
			return cfgp_fail_key(p, dns_fields_keys[k], "needs servers (the proxy's own "
					     "resolver)");
	if (!CFGP_PRESENT(present, DNS_CACHE)) {
		d->cache_size = CACHE_SIZE_DEFAULT;
		d->cache_max_ttl_s = CACHE_MAX_TTL_DEFAULT;
	}
	return 0;
}

static const struct cfgp_field dns_fields[] = {
	[DNS_HIJACK] = { .key = "hijack", .kind = CFGP_BOOL, .off = offsetof(struct ts_dns, hijack) },
	[DNS_UPSTREAM] = { .key = "upstream", .kind = CFGP_FN, .fn = f_upstream,
			   .has_off = offsetof(struct ts_dns, has_upstream) + 1 },
	[DNS_SERVERS] = { .key = "servers", .kind = CFGP_FN, .fn = f_servers },
	[DNS_RULES] = { .key = "rules", .kind = CFGP_FN, .fn = f_dns_rules },
	[DNS_FINAL] = { .key = "final", .kind = CFGP_STR, .min = 1, .max = TS_TAG_MAX,
			.off = offsetof(struct ts_dns, final_tag) },
	[DNS_HOSTS] = { .key = "hosts", .kind = CFGP_FN, .fn = f_hosts },
	[DNS_IPV6] = { .key = "ipv6", .kind = CFGP_ENUM, .names = ipv6_names,
		       .off = offsetof(struct ts_dns, ipv6) },
	[DNS_CACHE] = { .key = "cache", .kind = CFGP_OBJ, .sub = &cache_table, .off = 0 },
	[DNS_FAKEIP] = { .key = "fakeip", .kind = CFGP_FN, .fn = f_fakeip },
};
static const struct cfgp_table dns_table = CFGP_TABLE(dns_fields, check_dns);

static uint64_t fnv_text(uint64_t h, const cJSON *e)
{
	char *text = e ? cJSON_PrintUnformatted(e) : NULL;

	for (const char *c = text ? text : "-"; *c; c++)
		h = (h ^ (unsigned char)*c) * 0x100000001b3ULL;
	cJSON_free(text);
	return (h ^ '|') * 0x100000001b3ULL;
}

/* FNV-1a over what the running resolver is built from and cannot change (its servers, its
 * cache, the fake-IP pool: everything but fakeip.exclude), as cJSON prints it. */
static uint64_t resolver_sig(const cJSON *item)
{
	const cJSON *fake = cJSON_GetObjectItemCaseSensitive(item, "fakeip"), *e;
	uint64_t h = 0xcbf29ce484222325ULL;

	h = fnv_text(h, cJSON_GetObjectItemCaseSensitive(item, "servers"));
	h = fnv_text(h, cJSON_GetObjectItemCaseSensitive(item, "cache"));
	h = fnv_text(h, cJSON_GetObjectItemCaseSensitive(item, "hijack"));
	if (!fake)
		return h;
	h = (h ^ 'F') * 0x100000001b3ULL; /* an empty fakeip object is not an absent one */
	cJSON_ArrayForEach(e, fake)
		if (strcmp(e->string, "exclude") != 0) {
			for (const char *c = e->string; *c; c++)
				h = (h ^ (unsigned char)*c) * 0x100000001b3ULL;
			h = fnv_text(h, e);
		}
	return h;
}

int config_dns_parse(struct cfgp *p, const cJSON *item, void *target)
{
	struct ts_dns *d = &((struct ts_config *)target)->dns;
	int ret = cfgp_object(p, item, &dns_table, d, NULL);

	if (ret == 0)
		d->resolver_sig = resolver_sig(item);
	return ret;
}

static int server_index(const struct ts_dns *d, const char *tag)
{
	for (size_t i = 0; i < d->n_servers; i++)
		if (strcmp(d->servers[i].tag, tag) == 0)
			return (int)i;
	return -1;
}

/* ---- fakeip validation --------------------------------------------------------------------- */

static bool cidr_overlap(const struct netaddr_cidr *a, const struct netaddr_cidr *b)
{
	return a->addr.family == b->addr.family &&
	       (netaddr_in_cidr(&a->addr, b) || netaddr_in_cidr(&b->addr, a));
}

/* The upper half of the TUN's prefix (198.18.0.1/15: 198.19.0.0/16), clear of the gateway and
 * the NAT addresses at the bottom. */
static int upper_half(const struct netaddr_cidr *tun, struct netaddr_cidr *out)
{
	int bits = tun->addr.family == 4 ? 32 : 128;
	size_t byte = tun->prefix / 8;

	if (tun->prefix + 3 > bits)
		return -EINVAL;
	*out = *tun;
	netaddr_cidr_normalize(out);
	out->addr.a[byte] |= (uint8_t)(0x80 >> (tun->prefix % 8));
	out->prefix = (uint8_t)(tun->prefix + 1);
	return 0;
}

/* The range's network and last address are never handed out (dns/fakeip.h). */
static bool range_hands_out(const struct netaddr_cidr *r, const struct netaddr *a)
{
	struct netaddr_cidr c = *r;
	int bits = r->addr.family == 4 ? 32 : 128;
	bool last = true;

	if (!netaddr_in_cidr(a, r))
		return false;
	netaddr_cidr_normalize(&c);
	if (netaddr_eq(a, &c.addr))
		return false;
	for (int i = r->prefix; i < bits; i++)
		if (!(a->a[i / 8] & (0x80 >> (i % 8))))
			last = false;
	return !last || r->addr.family == 6;
}

static int check_range(struct cfgp *p, const struct ts_config *cfg, const struct netaddr_cidr *r,
		       const char *path)
{
	const struct netaddr_roles *roles = r->addr.family == 4 ? &cfg->roles4 : &cfg->roles6;
	const struct netaddr_cidr *tun = r->addr.family == 4 ? &cfg->tun.addr4 : &cfg->tun.addr6;
	const struct ts_tun *t = &cfg->tun;
	struct netaddr_cidr net = *tun;
	struct netaddr a;
	char buf[NETADDR_CIDR_STRLEN];

	netaddr_cidr_normalize(&net);
	if (roles->family == r->addr.family) {
		/* The gateway (k 0), then the NAT addresses, gateway + 1 + (k - 1). */
		for (uint32_t k = 0; k <= roles->n_nat; k++) {
			if (k == 0)
				a = roles->gateway;
			else
				netaddr_roles_nat(roles, k - 1, &a);
			if (netaddr_in_cidr(&a, r))
				return cfgp_fail_at(p, path, "holds %s, the TUN's %s address",
						    netaddr_format(&a, buf, sizeof(buf)),
						    k ? "NAT" : "gateway");
		}
		if (range_hands_out(r, &net.addr))
			return cfgp_fail_at(p, path, "would hand out the TUN prefix's network address");
	}
	for (size_t i = 0; i < t->n_route_exclude_address; i++)
		if (cidr_overlap(r, &t->route_exclude_address[i]))
			return cfgp_fail_at(p, path, "overlaps tun.route_exclude_address %s: fake "
					    "addresses would not reach the TUN", netaddr_cidr_format(
					    &t->route_exclude_address[i], buf, sizeof(buf)));
	/* Outside the TUN's prefix: auto_route adds it to its routes; without auto_route the
	 * start checks that a route lookup leads into the TUN (runtime/routing.c). */
	return 0;
}

const char *config_dns_addr_key(const struct ts_dns_server *sv)
{
	return sv->transport == TS_DNS_HTTPS && !sv->host_is_addr ? "address_ip" : "address";
}

/* A server inside the TUN's prefix or a fake range would be asked through the TUN itself (a
 * loop, or a fake address); a hosts address in a fake range would stand for two names. */
static int check_addresses(struct cfgp *p, const struct ts_config *cfg)
{
	const struct ts_dns *d = &cfg->dns;
	struct netaddr_cidr tun4 = cfg->tun.addr4, tun6 = cfg->tun.addr6;
	const struct netaddr_cidr *in[4] = { &tun4, cfg->tun.has_addr6 ? &tun6 : NULL,
					     &d->fakeip.range4, &d->fakeip.range6 };
	char path[320];

	netaddr_cidr_normalize(&tun4);
	netaddr_cidr_normalize(&tun6);
	for (size_t i = 0; i < d->n_servers; i++)
		for (int k = 0; k < 4; k++) {
			if (!in[k] || !in[k]->addr.family || (k >= 2 && !d->fakeip.enabled) ||
			    !netaddr_in_cidr(&d->servers[i].addr.addr, in[k]))
				continue;
			snprintf(path, sizeof(path), "$.dns.servers[%zu].%s", i,
				 config_dns_addr_key(&d->servers[i]));
			return cfgp_fail_at(p, path, "inside %s: queries would be sent into the TUN",
					    k < 2 ? "the TUN's prefix" : "the fake-IP range");
		}
	for (size_t i = 0; d->fakeip.enabled && i < d->n_hosts; i++) {
		const struct ts_dns_host *h = &d->hosts[i];
		for (unsigned j = 0; j < h->n4 + h->n6; j++) {
			struct netaddr a = { .family = j < h->n4 ? 4 : 6 };
			memcpy(a.a, j < h->n4 ? h->a4[j] : h->a6[j - h->n4], j < h->n4 ? 4 : 16);
			if (!netaddr_in_cidr(&a, &d->fakeip.range4) &&
			    !netaddr_in_cidr(&a, &d->fakeip.range6))
				continue;
			snprintf(path, sizeof(path), "$.dns.hosts.%s", h->name);
			return cfgp_fail_at(p, path, "an address inside the fake-IP range");
		}
	}
	return 0;
}

static int validate_fakeip(struct cfgp *p, struct ts_config *cfg)
{
	struct ts_fakeip *f = &cfg->dns.fakeip;
	int ret;

	if (!f->enabled)
		return 0;
	if (!f->range4.addr.family && upper_half(&cfg->tun.addr4, &f->range4) != 0)
		return cfgp_fail_at(p, "$.dns.fakeip.inet4_range", "required: the TUN's prefix is too "
				    "small to give half of it");
	if (!f->range6.addr.family && cfg->tun.has_addr6 &&
	    upper_half(&cfg->tun.addr6, &f->range6) != 0)
		return cfgp_fail_at(p, "$.dns.fakeip.inet6_range", "required: the TUN's IPv6 prefix is "
				    "too small to give half of it");
	if ((ret = check_range(p, cfg, &f->range4, "$.dns.fakeip.inet4_range")) != 0)
		return ret;
	if (f->range6.addr.family && !cfg->tun.has_addr6)
		return cfgp_fail_at(p, "$.dns.fakeip.inet6_range", "needs tun.address6 (IPv6 to "
				    "reach the TUN)");
	if (f->range6.addr.family &&
	    (ret = check_range(p, cfg, &f->range6, "$.dns.fakeip.inet6_range")) != 0)
		return ret;
	cfgp_set_path(p, ".dns.fakeip.exclude");
	return config_names_resolve(p, cfg, &f->exclude);
}

/* Tags to indices; a UDP server's detour must be a direct outbound (a datagram socket of
 * its own; TCP goes through any outbound). */
int config_dns_validate(struct cfgp *p, struct ts_config *cfg)
{
	struct ts_dns *d = &cfg->dns;
	char path[96];
	int idx, ret;

	for (size_t i = 0; i < d->n_servers; i++) {
		struct ts_dns_server *sv = &d->servers[i];
		snprintf(path, sizeof(path), "$.dns.servers[%zu].detour", i);
		if (!sv->detour_tag[0])
			sv->detour = cfg->route.final;
		else if ((idx = config_outbound_index(cfg, sv->detour_tag)) < 0)
			return cfgp_fail_at(p, path, "no outbound is tagged \"%s\"", sv->detour_tag);
		else
			sv->detour = (uint32_t)idx;
		const struct ts_outbound *ob = &cfg->outbounds[sv->detour];
		if (ob->type == TS_OUT_REJECT)
			return cfgp_fail_at(p, path, "outbound \"%s\" rejects everything", ob->tag);
		if (sv->transport == TS_DNS_UDP && ob->type != TS_OUT_DIRECT)
			return cfgp_fail_at(p, path, "outbound \"%s\" (%s) carries TCP only here: use "
					    "\"tcp://\" for this server, or a direct detour%s", ob->tag,
					    ob->type == TS_OUT_SOCKS5 ? "socks5" : "http",
					    sv->detour_tag[0] ? "" : " (the default is route.final)");
	}
	for (size_t i = 0; i < d->n_rules; i++) {
		struct ts_dns_rule *r = &d->rules[i];
		cfgp_set_path(p, ".dns.rules");
		cfgp_push_index(p, i);
		if ((ret = config_names_resolve(p, cfg, &r->names)) != 0)
			return ret;
		if (r->action != TS_DNS_ACT_SERVER)
			continue;
		if ((idx = server_index(d, r->server_tag)) < 0) {
			snprintf(path, sizeof(path), "$.dns.rules[%zu].server", i);
			return cfgp_fail_at(p, path, "no server is tagged \"%s\"", r->server_tag);
		}
		r->server = (uint32_t)idx;
	}
	if (d->final_tag[0]) {
		if ((idx = server_index(d, d->final_tag)) < 0)
			return cfgp_fail_at(p, "$.dns.final", "no server is tagged \"%s\"", d->final_tag);
		d->final = (uint32_t)idx;
	}
	if ((ret = validate_fakeip(p, cfg)) != 0)
		return ret;
	return check_addresses(p, cfg);
}

void config_dns_fini(struct ts_dns *d)
{
	for (size_t i = 0; i < d->n_rules; i++)
		config_names_fini(&d->rules[i].names);
	free(d->rules);
	config_names_fini(&d->fakeip.exclude);
	free(d->fakeip.persist);
	for (size_t i = 0; i < d->n_servers; i++)
		free(d->servers[i].ca);
	free(d->servers);
	free(d->hosts);
}

const struct ts_dns_host *config_dns_host(const struct ts_dns *d, const char *name, size_t len)
{
	size_t lo = 0, hi = d->n_hosts;
	char key[254];

	if (len == 0 || len > 253)
		return NULL;
	for (size_t i = 0; i < len; i++)
		key[i] = (char)tolower((unsigned char)name[i]);
	key[len] = 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(key, d->hosts[mid].name);
		if (c == 0)
			return &d->hosts[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}
