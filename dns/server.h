/* server.h — the proxy's own DNS resolver front: a hijacked query (from the UDP path, or from a
 * TCP/53 connection through the TUN) is answered here, never forwarded as it is.
 *
 * The pipeline, in order (first that answers wins):
 *   1. parse (core/dns_msg.h): malformed dropped and counted; QR set dropped; another opcode
 *      NOTIMP; not one question FORMERR;
 *   2. dns.hosts: static addresses (A/AAAA of a listed name; other types of it: empty);
 *   3. dns.rules: the first rule whose name matchers hit gives the action: "refuse" (REFUSED),
 *      "empty" (NOERROR, no records), or a server tag; no rule: dns.final;
 *   4. dns.ipv6 "empty": AAAA answered empty;
 *   5. fake-IP (dns.fakeip), for names no rule matched and not excluded (dns.fakeip.exclude
 *      and a built-in list of local names, time servers and captive-portal probes): A and
 *      AAAA answered with an address of the range (TTL 1 s; AAAA empty without an IPv6
 *      range), HTTPS and SVCB answered empty (their address hints would bypass it);
 *   6. the cache (dns/cache.h), keyed by (name, type, class) per server;
 *   7. an identical question to the same server already in flight: wait for its answer;
 *   8. the upstream server (dns/upstream.h: udp, tcp, tls; dns/doh.h: https): a fresh query
 *      of our own (our id, the question, our OPT), the answer checked against it, cached,
 *      and rebuilt for each asking client.
 * Failures answer SERVFAIL (counted by reason); a reply is never larger than the client's
 * limit (dns_reply_limit: its EDNS size or 512 over UDP): longer answers are truncated (TC) so
 * that the client retries over TCP.
 *
 * Memory: pending queries (a copy of each client query) and in-flight questions come from the
 * budget; at most DNS_SERVER_MAX_PENDING queries wait at a time (more: refused and counted; a UDP
 * query is dropped, a TCP one answered REFUSED by its connection).
 * Single-threaded: every call on the loop that runs base.
 */
#ifndef TS_DNS_SERVER_H
#define TS_DNS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct budget;
struct ts_config;

#define DNS_SERVER_MAX_PENDING 1024  /* client queries waiting for upstreams */

struct dns_server;
struct dns_ticket;

/* The reply to one query: msg (len bytes, borrowed for the call) to be sent to the client as
 * it is; len 0: send nothing (the query was dropped). Called exactly once per accepted query,
 * possibly from inside dns_server_query, unless the ticket was cancelled first. The ticket is
 * gone once fn starts: never cancel it after (or from inside) its own reply. */
typedef void (*dns_reply_fn)(void *arg, const uint8_t *msg, size_t len);

/* A server for cfg->dns (dns.servers, rules, final, hosts, ipv6, cache) and the rule sets its
 * rules name; cfg must outlive the server. b: tickets and flights are drawn from it (required).
 * 0 and *out, or -EINVAL (no servers, no budget), -ENOMEM, an upstream's -errno. */
int dns_server_new(struct event_base *base, const struct ts_config *cfg, struct budget *b,
		   struct dns_server **out) __attribute__((warn_unused_result));
/* Reload: the resolver reads its rules, final, hosts, ipv6 and fake-IP exclusions (and the
 * rule sets they name) from cfg from now on, if cfg's servers, cache and fake-IP pool are the
 * ones it runs (resolver_sig equal): 0. A server whose outbound in cfg (its detour, or
 * route.final's) differs from the one it goes through takes the new one: its open connection
 * is closed and the queries in flight on it asked again through the new outbound (logged).
 * Else -EBUSY and nothing changes (a restart applies them). cfg must outlive its use: until
 * the next successful call or dns_server_free. */
int dns_server_reconfigure(struct dns_server *s, const struct ts_config *cfg);
/* The configuration the resolver reads now. */
const struct ts_config *dns_server_config(const struct dns_server *s);

/* Every query still waiting gets its fn with len 0 (nothing to send), so that its owner lets
 * go of it (counted as drops_client_gone). */
void dns_server_free(struct dns_server *s);

/* Answer the query m (len bytes, copied if it must wait). tcp: it came over TCP (the limit is
 * 65535); else the UDP limit, at most mtu_payload. Returns 0 (fn will be called, or already
 * was) with *ticket set while the reply is still to come (NULL once it came), or -errno
 * (nothing will be called): -ENOBUFS when too many queries wait or the budget refuses
 * (drops_busy), -ENOMEM when the heap has no memory for the upstream ask (drops_no_memory). */
int dns_server_query(struct dns_server *s, const uint8_t *m, size_t len, bool tcp,
		     size_t mtu_payload, dns_reply_fn fn, void *arg, struct dns_ticket **ticket)
	__attribute__((warn_unused_result));

/* The same for the proxy's own lookups (a direct outbound resolving a name, through
 * dns/local.h): real answers only (never fake-IP), and no size limit short of 65535. */
int dns_server_query_real(struct dns_server *s, const uint8_t *m, size_t len, dns_reply_fn fn,
			  void *arg, struct dns_ticket **ticket) __attribute__((warn_unused_result));

/* The client went away: its reply is never delivered (fn not called). The query's outcome is
 * drops_client_gone. */
void dns_server_cancel(struct dns_server *s, struct dns_ticket *ticket);

/* Fake-IP: the name addr (family 4 or 6, its 4 or 16 bytes) stands for: its length (name
 * NUL-terminated in buf, cap at least 254); 0 when addr is in a fake range but mapped to no
 * name (a restart without persistence, or reused): the connection must be refused;
 * -ENOENT when it is not a fake address (or fake-IP is off). */
int dns_server_fake_name(struct dns_server *s, int family, const uint8_t *addr, char *buf,
			 size_t cap);
/* A session holds (pin) or lets go of (unpin) the fake address addr: while held, its mapping
 * is never handed to another name. Other addresses are ignored. */
void dns_server_fake_pin(struct dns_server *s, int family, const uint8_t *addr, bool pin);
/* dns.fakeip.persist: the mappings read back (at start; a missing file is no error) and
 * written (atomically: a temporary file renamed over it; also every minute while they change,
 * and at dns_server_free). 0 or -errno; nothing to do without persist. dns_server_fake_save
 * writes on the calling thread (after any save under way has finished). */
struct fakeip_load_stats;
int dns_server_fake_restore(struct dns_server *s, struct fakeip_load_stats *st);
int dns_server_fake_save(struct dns_server *s);
/* The minute's save: a snapshot of the mappings taken on the loop, written, flushed and renamed
 * by a thread of its own, so that a slow disk's fsync never stalls the loop. 0: started, or
 * nothing changed since the last save; -EBUSY: the last one is still writing (the next tick
 * tries again); else -errno. dns_server_fake_save_wait joins it: its outcome, 0 when none
 * ran (a failure is also logged, and the next start saves again). */
int dns_server_fake_save_start(struct dns_server *s);
int dns_server_fake_save_wait(struct dns_server *s);
/* Where failures to save are logged (warn), or NULL. */
struct log;
void dns_server_set_log(struct dns_server *s, struct log *lg);

/* Counters (cumulative) and gauges for /stats. */
struct dns_server_stats {
	uint64_t queries, queries_tcp;
	uint64_t answered_hosts, answered_fake, answered_cache, answered_upstream;
	uint64_t answered_refused, answered_empty, answered_servfail;
	uint64_t drops_malformed, drops_busy;
	uint64_t drops_no_memory;               /* an upstream ask the heap had no memory for */
	uint64_t drops_client_gone;             /* pending, then cancelled: the client left
						 * (or its owner let go at dns_server_free) */
	uint64_t cache_hits, cache_misses, cache_entries, cache_evictions;
	uint64_t cache_not_stored_name_in_ttl;  /* answers not kept: a name read a TTL's bytes */
	uint64_t upstream_queries, upstream_timeouts, upstream_errors, upstream_bad_answers;
	uint64_t upstream_tls_failures;         /* tls:// servers' failed handshakes */
	uint64_t upstream_http_errors;          /* https:// servers' answers not 200 dns-message */
	uint64_t coalesced;
	uint64_t pending;                       /* gauge */
	uint64_t fake_mappings, fake_pinned;    /* gauges */
	uint64_t fake_exhausted, fake_unmapped;
};
void dns_server_get_stats(const struct dns_server *s, struct dns_server_stats *out);

#endif
