/* config.h — the parsed twinstack configuration (schema and defaults: docs/config.md).
 *
 * The JSON file is parsed (cJSON) and validated once, into a plain struct in binary form:
 * addresses as struct netaddr, ports as numbers, choices as enums, outbound tags resolved to
 * indices, the address roles derived and proven, the budget limits computed from the profile
 * plus overrides. Nothing later re-parses a string.
 *
 * Errors are one line naming the JSON path and the reason, e.g.
 *   config: $.outbounds[1].server: expected "host:port"
 * and the loaders return -EINVAL. Only the first error is reported.
 */
#ifndef TS_CORE_CONFIG_H
#define TS_CORE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"
#include "core/domain_set.h"
#include "core/log.h"
#include "core/netaddr.h"

struct loopguard;

#define TS_IFNAME_MAX 15      /* IFNAMSIZ - 1 */
#define TS_TAG_MAX 64         /* outbound tag bytes */
#define TS_CC_NAME_MAX 15     /* a TCP congestion control's name (the kernel's TCP_CA_NAME_MAX - 1) */
#define TS_HOST_MAX 253       /* DNS name bytes */
#define TS_CRED_MAX 255       /* SOCKS5 username/password bytes (RFC 1929) */
#define TS_MAX_OUTBOUNDS 256
#define TS_HTTP_HEADERS_MAX 4096  /* http outbound: bytes of extra header lines */
#define TS_HTTP_HEADERS_N 16       /* http outbound: extra header fields */
#define TS_NAT_MAX_ADDRS 64      /* nat.addresses: NAT addresses per family */
#define TS_NAT_MAX_LISTENERS 16  /* nat.listeners: listener ports per family */
#define TS_MAX_RULES 65536
#define TS_MAX_RULE_ITEMS 1048576 /* entries of one rule's cidr or port list */
#define TS_CONFIG_FILE_MAX (16u << 20)
#define TS_TUN_NAME_DEFAULT "tun0"
#define TS_TUN_MTU_DEFAULT 1500
#define TS_TUN_TXQUEUELEN_DEFAULT 10000 /* the kernel's 500 drops bursts */
#define TS_TUN_QUEUES_AUTO 0     /* tun.queues "auto": config_auto_queues() at start */
#define TS_TUN_QUEUES_AUTO_MAX 2 /* the most "auto" picks (the count measured to pay) */
#define TS_ERRLEN 512         /* a good size for the caller's error buffer */
#define TS_USER_MAX 64        /* "user": a user name or a numeric uid */
#define TS_ROUTE_LIST_MAX 4096 /* entries of a tun route/uid/interface list */
#define TS_MAX_RULE_SETS 64    /* rule_sets */
#define TS_RULE_SET_FILE_MAX (64u << 20) /* bytes of one rule-set file */
#define TS_PATH_MAX 4095       /* a rule-set file's path, bytes */
/* route.default_mark when the key is absent: bit pattern 0x74 in the top byte, clear of
 * wg-quick's 51820 (0xca6c) and Tailscale's 0xff0000 bits. auto_route's rule matches it under
 * TS_DEFAULT_MARK_MASK, so other software may use the lower 24 bits of a marked packet. */
#define TS_DEFAULT_MARK 0x74000000u
#define TS_DEFAULT_MARK_MASK 0xff000000u
#define TS_ROUTE_TABLE_DEFAULT 29811u   /* tun.route_table */
#define TS_ROUTE_PRIORITY_DEFAULT 8700u /* tun.route_rule_priority: rules use base .. base+19 */
#define TS_ROUTE_PRIORITY_SPAN 20u

enum ts_stack { TS_STACK_SYSTEM, TS_STACK_LWIP };
enum ts_offload { TS_OFFLOAD_AUTO, TS_OFFLOAD_ON, TS_OFFLOAD_OFF };
/* nat.fast_path: the system stack's in-kernel NAT for accepted connections (auto: where the
 * kernel and the privileges allow it; on: or the start fails; off: userspace only). */
enum ts_fast_path { TS_FAST_PATH_AUTO, TS_FAST_PATH_ON, TS_FAST_PATH_OFF };
enum ts_rps { TS_RPS_AUTO, TS_RPS_ON, TS_RPS_OFF };
enum ts_io_uring { TS_IO_URING_AUTO, TS_IO_URING_ON, TS_IO_URING_OFF };
enum ts_outbound_type { TS_OUT_DIRECT, TS_OUT_SOCKS5, TS_OUT_REJECT, TS_OUT_HTTP };
enum ts_relay_mode { TS_RELAY_SPLICE, TS_RELAY_COPY };
enum ts_network { TS_NET_ANY, TS_NET_TCP, TS_NET_UDP }; /* ANY: the rule has no network matcher */
/* direct: which addresses of a destination given by name are tried, in what order. */
enum ts_domain_strategy {
	TS_DS_PREFER_IPV6, /* both families, IPv6 first (RFC 8305 section 4); the default */
	TS_DS_PREFER_IPV4, /* both families, IPv4 first */
	TS_DS_IPV4_ONLY,
	TS_DS_IPV6_ONLY,
};

struct ts_uid_range {
	uint32_t lo, hi;             /* inclusive */
};

struct ts_tun {
	char name[TS_IFNAME_MAX + 1];
	struct netaddr_cidr addr4;   /* the gateway and the prefix */
	bool has_addr6;
	struct netaddr_cidr addr6;   /* valid if has_addr6 */
	uint32_t mtu;
	uint32_t txqueuelen;
	uint32_t queues;             /* TS_TUN_QUEUES_AUTO until the proxy starts */
	bool queues_auto;            /* queues was "auto" and the start picked the count */
	enum ts_offload offload;
	bool gso_output;             /* lwip stack with offload: coalesce output into GSO trains */
	bool large_segments;         /* ... and lwIP builds large segments the kernel cuts */
	enum ts_rps rps;             /* receive packet steering for the packets we write */
	enum ts_io_uring io_uring;   /* TUN reads and writes in batches through an io_uring */

	/* Routing the proxy installs itself (runtime/autoroute.h); the lists need auto_route. */
	bool auto_route;
	bool strict_route;
	struct netaddr_cidr *route_address;         /* captured; NULL: 0.0.0.0/0 and ::/0 */
	size_t n_route_address;
	struct netaddr_cidr *route_exclude_address; /* left to the original routes */
	size_t n_route_exclude_address;
	struct ts_uid_range *include_uid;           /* only these users are captured */
	size_t n_include_uid;
	struct ts_uid_range *exclude_uid;           /* these users are not */
	size_t n_exclude_uid;
	char (*exclude_interface)[TS_IFNAME_MAX + 1]; /* traffic arriving from these is not */
	size_t n_exclude_interface;
	uint32_t route_table;
	uint32_t route_rule_priority;
};

struct ts_nat {
	uint32_t addresses;          /* NAT addresses per family: gateway+1 .. gateway+addresses */
	uint32_t listeners;          /* listener ports per family */
	uint32_t linger_ms;
	uint32_t half_open_timeout_ms;
	uint32_t port_quarantine_ms;
	uint32_t accepted_sndbuf;    /* SO_SNDBUF of the accepted (TUN-side) sockets; 0: autotuned;
				      * TS_ACCEPTED_SNDBUF_AUTO: the system stack decides */
	/* TCP congestion control of the accepted sockets ("host": the namespace's default) */
	char accepted_congestion[TS_CC_NAME_MAX + 1];
	enum ts_fast_path fast_path;
};

struct ts_timeouts {
	uint32_t connect_ms;
	uint32_t relay_idle_ms;
	uint32_t udp_idle_ms;
};

/* A "host:port" where host is an IP literal or a DNS name. */
struct ts_hostport {
	char host[TS_HOST_MAX + 1];  /* as written, without IPv6 brackets */
	bool is_addr;                /* host is an IP literal: addr is valid */
	bool pinned;                 /* not from JSON: host was resolved by the running proxy
				      * (at start, at a reload) into addr, which is used */
	struct netaddr addr;
	uint16_t port;               /* host byte order */
};

struct ts_outbound {
	char tag[TS_TAG_MAX + 1];
	enum ts_outbound_type type;
	bool has_routing_mark;
	uint32_t routing_mark;                    /* SO_MARK for its sockets (direct, socks5) */
	bool mark_is_default;                     /* routing_mark is route.default_mark */
	char bind_interface[TS_IFNAME_MAX + 1];   /* "" = none (direct, socks5) */
	bool has_server;
	struct ts_hostport server;                /* socks5, http */
	bool has_auth;
	char username[TS_CRED_MAX + 1];           /* socks5, http (Basic), with has_auth */
	char password[TS_CRED_MAX + 1];
	/* socks5: UDP by UDP ASSOCIATE ("udp", default true). Not used by the other types: direct
	 * always carries UDP, http and reject never (their UDP is dropped and counted). */
	bool udp;
	/* http: extra request header fields, as sent: "Name: value\r\n" lines; "" = none. */
	char http_headers[TS_HTTP_HEADERS_MAX + 1];
	/* direct: the families and order tried for a destination given by name
	 * ("domain_strategy"). Not used by the other types: a proxy server resolves the name. */
	enum ts_domain_strategy domain_strategy;
	/* Not from JSON: set by the embedding program (the library's socket hook). Called on
	 * every socket opened for this outbound, after the mark and interface binding and before
	 * connect/sendto; a negative -errno fails the socket. fn NULL: none. */
	struct ts_sock_hook {
		int (*fn)(void *arg, int fd, int family, int type);
		void *arg;
	} sock_hook;
	/* Not from JSON: the running proxy's record of its own sockets' ports (runtime/
	 * loopguard.h); NULL: none. outbound_socket binds and records every socket in it. */
	struct loopguard *loopguard;
	/* Not from JSON: where a proxy server's refusal (an HTTP status) is logged at debug level;
	 * NULL: nowhere. */
	struct log *log;
	/* Not from JSON: the resolver (outbound/resolver.h) for a server name that is not pinned,
	 * on the base the outbound connects on; NULL: an attempt makes a resolver of its own. */
	struct resolver *resolver;
	/* Not from JSON: the running proxy's budget. A connection holds one descriptor; Happy
	 * Eyeballs takes one more from here for each socket it has open beside the first (a
	 * connection to a name with several addresses); NULL: those are not counted. */
	struct budget *fd_budget;
};

struct ts_port_range {
	uint16_t lo, hi;                          /* inclusive, 1 <= lo <= hi */
};

/* A rule set ("rule_sets"): a file of names in one of core/domain_set.h's formats, read and
 * loaded into a domain set when the configuration is loaded (so again at every reload). */
struct ts_rule_set {
	char tag[TS_TAG_MAX + 1];
	enum domain_format format;
	char *path;                               /* as written (owned) */
	struct domain_set *set;                   /* owned; only read once loaded */
	struct domain_load_stats stats;           /* stats.added: its entries; stats.bad: lines
						   * skipped */
	uint32_t load_ms;                         /* reading and loading the file */
};

/* A name matcher: the keys domain, domain_suffix, domain_keyword and domain_regex (own) and
 * rule_set (sets). A name matches when it is in own or in any of the sets. Empty (the rule
 * has no name key): own NULL and n_sets 0 (config_names_empty). */
struct ts_names {
	struct domain_set *own;
	char (*set_tags)[TS_TAG_MAX + 1];         /* rule_set, as written */
	uint32_t *sets;                           /* the same, indices into ts_config.rule_sets
						   * (resolved by validation) */
	size_t n_sets;
};

/* A route rule matches when every matcher it has matches (a list matches if any entry does). */
struct ts_rule {
	/* domain, domain_suffix, domain_keyword, domain_regex, rule_set: the destination's name
	 * must match (config_names_match); empty = no name matcher. A session without a name
	 * never matches a rule that has one. First: the name keys' parsers take the rule as
	 * its names (config_names.h). */
	struct ts_names names;
	struct netaddr_cidr *cidrs;               /* destination networks (host bits cleared) */
	size_t n_cidrs;                           /* 0 = no cidr matcher */
	struct ts_port_range *ports;              /* destination ports */
	size_t n_ports;                           /* 0 = no port matcher */
	enum ts_network network;
	char outbound_tag[TS_TAG_MAX + 1];
	uint32_t outbound;                        /* index into ts_config.outbounds */
};

/* route.sniff: read the name a connection announces (TLS SNI, HTTP Host, QUIC Initial SNI)
 * before the route is chosen. Only flows whose route a name could change are looked at,
 * unless override_destination asks for every flow's name. */
#define TS_SNIFF_TLS (1u << 0)
#define TS_SNIFF_HTTP (1u << 1)
#define TS_SNIFF_QUIC (1u << 2)
#define TS_SNIFF_MAX_BYTES (16384 + 5) /* one whole TLS record */
struct ts_sniff {
	bool present;                 /* route.sniff given */
	bool enabled;                 /* default true once given */
	bool override_destination;    /* a sniffed name replaces the address for the outbound */
	uint32_t protocols;           /* TS_SNIFF_* (default all) */
	uint32_t timeout_ms;          /* the longest a flow waits for its first bytes */
	uint32_t max_bytes;           /* the most bytes of a TCP stream looked at */
};

static inline bool ts_sniff_on(const struct ts_sniff *sn, uint32_t proto)
{
	return sn->present && sn->enabled && (sn->protocols & proto);
}

struct ts_route {
	struct ts_sniff sniff;
	struct ts_rule *rules;
	size_t n_rules;
	char final_tag[TS_TAG_MAX + 1];
	uint32_t final;                           /* index into ts_config.outbounds */
	uint32_t default_mark;                    /* 0: none; else every outbound without its
						   * own routing_mark gets it */
	bool has_names;                           /* some rule has a name matcher */
	/* Borrowed: ts_config.rule_sets (set by validation; the array never moves), which the
	 * rules' rule_set matchers index. */
	const struct ts_rule_set *rule_sets;
};

/* The proxy's own DNS resolver (dns.servers given): hijacked queries are answered here. */
#define TS_DNS_MAX_SERVERS 32
#define TS_DNS_MAX_HOSTS 4096
#define TS_DNS_HOST_ADDRS 8

enum ts_dns_transport { TS_DNS_UDP, TS_DNS_TCP, TS_DNS_TLS, TS_DNS_HTTPS };
enum ts_dns_action { TS_DNS_ACT_SERVER, TS_DNS_ACT_REFUSE, TS_DNS_ACT_EMPTY };
enum ts_dns_ipv6 { TS_DNS_IPV6_ANSWER, TS_DNS_IPV6_EMPTY };

struct ts_dns_server {
	char tag[TS_TAG_MAX + 1];
	enum ts_dns_transport transport;
	struct netaddr_ep addr;
	char detour_tag[TS_TAG_MAX + 1];          /* "": route.final's outbound */
	uint32_t detour;                          /* index into ts_config.outbounds */
	char sni[254];                            /* tls: the name its certificate must carry;
						   * https: the URL's host (a name or an address) */
	char path[256];                           /* https: the URL's path */
	bool host_is_addr;                        /* https: the URL's host is addr itself */
	char *ca;                                 /* tls, https: a PEM file of trust anchors,
						   * NULL: the system store (owned) */
};

struct ts_dns_rule {
	struct ts_names names;                    /* the question's name must match (first: as
						   * in ts_rule) */
	enum ts_dns_action action;
	char server_tag[TS_TAG_MAX + 1];          /* TS_DNS_ACT_SERVER */
	uint32_t server;                          /* index into ts_dns.servers */
};

struct ts_dns_host {
	char name[254];                           /* lower case, no trailing dot */
	uint8_t n4, n6;
	uint8_t a4[TS_DNS_HOST_ADDRS][4];
	uint8_t a6[TS_DNS_HOST_ADDRS][16];
};

/* dns.fakeip: A/AAAA answers from a range of addresses that stand for names. */
struct ts_fakeip {
	bool enabled;
	struct netaddr_cidr range4;               /* family 0: none */
	struct netaddr_cidr range6;               /* family 0: none (AAAA answered empty) */
	uint32_t max_mappings;
	uint32_t reuse_after_s;                   /* a mapping idle this long may be reused */
	struct ts_names exclude;                  /* names that get real answers (with the
						   * built-in list, dns/server.c) */
	char *persist;                            /* a file the mappings survive a restart in,
						   * or NULL (owned) */
};

struct ts_dns {
	bool hijack;
	bool has_upstream;
	struct netaddr_ep upstream;               /* forwarder mode: queries relayed as they are */
	struct ts_dns_server *servers;            /* resolver mode when n_servers > 0 */
	size_t n_servers;
	struct ts_dns_rule *rules;
	size_t n_rules;
	char final_tag[TS_TAG_MAX + 1];           /* "": the first server */
	uint32_t final;                           /* index into servers */
	struct ts_dns_host *hosts;                /* sorted by name */
	size_t n_hosts;
	enum ts_dns_ipv6 ipv6;
	uint32_t cache_size;                      /* entries; 0: no cache */
	uint32_t cache_max_ttl_s;
	struct ts_fakeip fakeip;
	uint64_t resolver_sig;                    /* a hash of what the running resolver is
						   * built from (servers, cache, fakeip but its
						   * exclude): equal, a reload may hand it the
						   * new rules, final, hosts, ipv6, exclude */
};

struct ts_stats {
	bool enabled;                             /* stats.listen given */
	struct netaddr_ep listen;                 /* loopback only */
};

struct ts_config {
	enum ts_stack stack;
	struct ts_tun tun;
	struct ts_nat nat;
	struct ts_timeouts timeouts;
	struct ts_outbound *outbounds;            /* at least one after a successful load */
	size_t n_outbounds;
	enum ts_relay_mode relay_mode;
	uint32_t relay_buffer_bytes;              /* a copy relay's buffer per direction */
	uint32_t relay_pipe_bytes;                /* a splice relay's pipe size */
	struct ts_rule_set *rule_sets;            /* rule_sets, loaded */
	size_t n_rule_sets;
	struct ts_route route;
	struct ts_dns dns;
	enum budget_profile budget_profile;
	struct budget_limits budget;              /* profile + overrides; memory_limit_mb inside */
	struct ts_stats stats;
	enum log_level log_level;
	char user[TS_USER_MAX + 1];               /* "": stay the user that started it */

	/* Derived by validation: the address roles per family (roles6.family == 0 without
	 * tun.address6). */
	struct netaddr_roles roles4;
	struct netaddr_roles roles6;
};

/* Defaults for every scalar field; empty lists (the default outbound list is installed by the
 * loaders when "outbounds" is absent). No allocation. */
void config_init(struct ts_config *cfg);
/* Free the lists and return to config_init's state. Idempotent. */
void config_fini(struct ts_config *cfg);

/* Parse and validate. cfg need not be initialized. On success (0) cfg holds the configuration
 * and must be config_fini'd. On failure cfg is left in config_init's state (fini is harmless)
 * and err (if errlen > 0) receives one line starting with "config: ":
 *   -EINVAL   bad JSON or a bad value (the line names the JSON path)
 *   -ENOMEM   out of memory
 *   -errno    config_load_file: the file could not be read (ENOENT, EACCES, EISDIR, EFBIG...) */
int config_load_file(const char *path, struct ts_config *cfg, char *err, size_t errlen)
	__attribute__((warn_unused_result));
int config_load_string(const char *json, struct ts_config *cfg, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* The same for a buffer that need not be NUL-terminated (a NUL byte inside is an error). */
int config_load_buffer(const char *buf, size_t len, struct ts_config *cfg, char *err,
		       size_t errlen) __attribute__((warn_unused_result));

/* nat.accepted_sndbuf when the key is absent (outside the accepted range, so never parsed);
 * sys_config_accepted_sndbuf() (stacks/system/sys_config.h) then picks the size. */
#define TS_ACCEPTED_SNDBUF_AUTO UINT32_MAX

/* One line without newline, e.g. "stack=system tun=tun0 198.18.0.1/15 nat=198.18.0.2-198.18.0.5
 * outbounds=1 rules=0" (plus " tun6=... nat6=..." with tun.address6). Returns buf. */
char *config_summary(const struct ts_config *cfg, char *buf, size_t len);
/* A buffer size with room for cfg's whole summary, every rule set included. */
size_t config_summary_size(const struct ts_config *cfg);

/* Index of the outbound tagged tag, or -1. */
int config_outbound_index(const struct ts_config *cfg, const char *tag);

/* Index of the rule set tagged tag, or -1. */
int config_rule_set_index(const struct ts_config *cfg, const char *tag);

static inline bool config_names_empty(const struct ts_names *m)
{
	return !m->own && m->n_sets == 0;
}

/* Does the name (len bytes, any case, a trailing dot allowed) match m: is it in m->own or in
 * one of m's rule sets? sets is the configuration's rule_sets array (ts_config.rule_sets,
 * ts_route.rule_sets) that m's indices point into. An empty m matches nothing. Only reads:
 * any number of threads at once. */
bool config_names_match(const struct ts_rule_set *sets, const struct ts_names *m,
			const char *name, size_t len);

/* One info line per rule set: tag, format, entries, bad lines, load time, path. */
void config_log_rule_sets(const struct ts_config *cfg, struct log *log);

const char *config_stack_name(enum ts_stack s);

/* The queue count tun.queues "auto" stands for: one for the lwip stack, for a TUN the caller
 * opened, with offload "off" or on one CPU; otherwise one per CPU the process may run on, at
 * most TS_TUN_QUEUES_AUTO_MAX. */
uint32_t config_auto_queues(const struct ts_config *cfg, bool caller_tun, unsigned cpus);
const char *config_outbound_type_name(enum ts_outbound_type t);

#endif
