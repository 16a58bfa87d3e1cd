/* resolver.h — asynchronous host name resolution on the caller's libevent base (c-ares), with
 * a bounded, TTL-honouring cache; shared by the proxies' outbounds (a SOCKS5 server given by
 * name) and by anything else that needs names resolved without blocking the loop.
 *
 * Every socket the resolver opens (UDP, and TCP for truncated answers) is made by
 * outbound_socket() with the settings of the outbound given in the configuration: its routing
 * mark, interface binding, the library's socket hook and the loop guard, so the resolver's own
 * queries leave like any other outbound traffic and never enter the TUN.
 *
 * A lookup asks for A and AAAA at once and answers with both families interleaved, IPv6 first
 * (RFC 8305 section 4, First Address Family Count 1). Answers are cached for their TTL (capped
 * at max_ttl_s), "no such name" and "no address" for neg_ttl_s; temporary failures are not
 * cached. The cache holds at most max_names names: the least recently used is evicted first.
 * Concurrent lookups of one name share one pair of queries.
 *
 * Single-threaded: resolver_lookup, resolver_cancel, resolver_free and the callbacks all run on
 * the thread that runs base. A result is always delivered from the loop, never from inside
 * resolver_lookup (even a cache hit or an IP literal).
 */
#ifndef TS_OUTBOUND_RESOLVER_H
#define TS_OUTBOUND_RESOLVER_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/netaddr.h"

struct event_base;
struct resolver;
struct resolver_query;

/* At most this many addresses per name (both families together) are kept and delivered. */
#define RESOLVER_MAX_ADDRS 16

struct resolver_config {
	/* NULL: nameservers, search domains and options from /etc/resolv.conf, and names in
	 * /etc/hosts answered from there first. Otherwise a comma-separated list of servers
	 * ("127.0.0.1:5353,[::1]:53"), used alone: no search domains, no /etc/hosts. */
	const char *servers;
	/* The socket settings for the resolver's sockets (mark, interface, hook, loop guard),
	 * copied; NULL: plain sockets. */
	const struct ts_outbound *sock;
	uint32_t timeout_ms;   /* per try and server; 0: 2000 */
	uint32_t tries;        /* 0: 2 */
	uint32_t max_names;    /* cache size in names; 0: 1024 */
	uint32_t max_ttl_s;    /* positive answers cached at most this long; 0: 3600 */
	uint32_t neg_ttl_s;    /* negative answers cached this long; 0: 10 */
	/* The cache's clock in milliseconds (monotonic); NULL: CLOCK_MONOTONIC. For tests. */
	int64_t (*now_ms)(void *arg);
	void *now_arg;
};

/* Counters, one per event or drop reason; plain integers (one thread). */
struct resolver_stats {
	uint64_t lookups;        /* resolver_lookup calls that started */
	uint64_t cache_hits;     /* answered from a cached positive answer */
	uint64_t cache_neg_hits; /* answered from a cached negative answer */
	uint64_t hosts_hits;     /* answered from /etc/hosts */
	uint64_t coalesced;      /* joined a resolution already in progress */
	uint64_t queries;        /* DNS queries started (two per resolution: A and AAAA) */
	uint64_t nxdomain;       /* resolutions that found no address (cached negative) */
	uint64_t timeouts;       /* resolutions that failed with -ETIMEDOUT */
	uint64_t failures;       /* resolutions that failed otherwise (-EAGAIN, -ENOMEM) */
	uint64_t evictions;      /* cached names evicted to make room */
	uint64_t sockets;        /* sockets opened */
	uint64_t socket_errors;  /* sockets that could not be opened (mark, hook...) */
};

/* The result: err == 0 and n >= 1 addresses (family 4 or 6, interleaved as above), or err < 0
 * and n == 0: -ENXIO no such name or no address of the families asked for, -ETIMEDOUT no answer
 * in time, -EAGAIN a temporary failure (SERVFAIL, REFUSED, an unreachable server), -ENOMEM.
 * addrs is borrowed: valid only during the call. The query's handle is invalid once done
 * starts; done may call resolver_lookup, resolver_cancel on other queries, or resolver_free. */
typedef void (*resolver_fn)(void *arg, int err, const struct netaddr *addrs, size_t n);

/* 0 and *out, or -ENOMEM, -EINVAL (a bad servers list or argument). */
int resolver_new(struct event_base *base, const struct resolver_config *cfg,
		 struct resolver **out) __attribute__((warn_unused_result));

/* Resolve name (an IP literal is answered as itself). family_pref: 0 both families, 4 or 6 only
 * that one. 0 and *out (valid until done starts or resolver_cancel), or -EINVAL (empty or
 * too long a name, a bad family), -ENOMEM; then done is never called. */
int resolver_lookup(struct resolver *r, const char *name, int family_pref, resolver_fn done,
		    void *arg, struct resolver_query **out) __attribute__((warn_unused_result));

/* Abandon a lookup before done ran: done is never called. A resolution already sent goes on
 * and fills the cache. NULL is ignored. */
void resolver_cancel(struct resolver_query *q);

/* Stop everything: queries not yet answered are dropped without their done (their handles
 * become invalid), sockets closed. NULL is ignored. */
void resolver_free(struct resolver *r);

void resolver_get_stats(const struct resolver *r, struct resolver_stats *out);

#endif
