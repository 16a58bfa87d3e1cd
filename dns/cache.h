/* cache.h — the DNS resolver's answer cache, sans-IO: upstream answers kept per (server, name,
 * type, class) for their TTL, so that the same question asked again is answered without a
 * round trip.
 *
 * Keys: the name compares case-insensitively (the stored answer's question keeps the
 * upstream's case; the reply is rebuilt with the asking client's question bytes by
 * dns_build_from_answer), and each upstream server has its own entries (servers answer
 * differently: a rule that sends a name to another server must not get the first one's
 * answer). Only questions with a nameable name (core/dns_msg.h) are cached: another name's text
 * stands for more than one wire name.
 *
 * What is stored: NOERROR and NXDOMAIN answers, not truncated (RFC 2181 9: a TC answer is
 * incomplete), whose TTLs can all be aged (no more than DNS_MAX_RRS kept RRs). The entry lives
 * for the answer's smallest answer-section TTL, at most max_ttl_s; a negative answer (NXDOMAIN,
 * or NOERROR without answer RRs, RFC 2308) lives for its SOA's negative TTL, at most
 * neg_ttl_max_s, and is not stored without an SOA (RFC 2308 5: no negative TTL, no caching).
 * A TTL with the top bit set counts as 0 (RFC 2181 8) and a TTL of 0 is not stored. In the
 * stored copy every kept RR's TTL above the cap (max_ttl_s, or neg_ttl_max_s for a negative
 * answer) is lowered to it, so that the cap holds for the clients too; the others are left as
 * the upstream sent them, and a reply ages each by the entry's age. So an answer one of whose
 * names reads bytes of a TTL (a compression pointer into it: only a forged answer has one)
 * is not stored: with those bytes rewritten the name would read as another one. An entry is
 * live while now < stored + TTL: at exactly TTL seconds it is gone.
 *
 * Bounds: at most max_entries entries; storing one more evicts the least recently used (a hit
 * makes an entry the most recently used). Expired entries leave when a lookup finds them or
 * when they reach the least recently used end: no sweep. Each entry is one allocation (the
 * parsed answer and the message bytes); get and put are O(1) (a hash table with a random key,
 * so that names chosen by a client cannot pile into one bucket).
 *
 * Single-threaded: every call on one thread (the proxy's loop). The clock is the caller's, in
 * nanoseconds (monotonic).
 */
#ifndef TS_DNS_CACHE_H
#define TS_DNS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dns_msg.h"

struct dns_cache_config {
	uint32_t max_entries;   /* >= 1; LRU eviction past it */
	uint32_t max_ttl_s;     /* TTLs above are capped (default the caller's: 3600); 0: no
				 * positive answer is stored */
	uint32_t neg_ttl_max_s; /* negative answers (NXDOMAIN, or NOERROR without answer RRs):
				 * cap, 300; 0: none is stored */
};

struct dns_cache_stats {
	uint64_t hits, misses;  /* lookups (an expired or unusable entry found is a miss) */
	uint64_t entries;       /* gauge */
	uint64_t evictions;     /* live entries pushed out past max_entries */
	uint64_t expired;       /* entries removed past their TTL (found by a lookup, or at the
				 * least recently used end when room was needed) */
	uint64_t unusable;      /* live entries dns_cache_use's caller refused (removed) */
	uint64_t stored;        /* puts that stored (a replacement included) */
	uint64_t not_stored;    /* puts refused by the rules above */
	uint64_t not_stored_name_in_ttl; /* puts refused because a name of the answer reads bytes
				 * of a TTL the cache rewrites (dns_answer_names_read_ttls) */
	uint64_t bytes;         /* gauge: message bytes held */
};

struct dns_cache;

/* 0 and *out, or -EINVAL (max_entries 0), -ENOMEM. */
int dns_cache_new(const struct dns_cache_config *cfg, struct dns_cache **out)
	__attribute__((warn_unused_result));
void dns_cache_free(struct dns_cache *c);

/* Store the upstream answer msg (len bytes) that dns_parse_answer accepted as *a, for server
 * (the index of the upstream it came from: caches are per server, since servers answer
 * differently) at now_ns. Only rcode NOERROR and NXDOMAIN are stored; TTL: a->min_ttl capped at
 * max_ttl_s; for a negative answer (NXDOMAIN, or no answer-section RRs) min_ttl capped at
 * neg_ttl_max_s, and when a->min_ttl is UINT32_MAX (no SOA) not stored; TTL 0: not stored;
 * a->n_ttl_overflow: not stored (its TTLs could not be aged); a name that reads a TTL's bytes
 * (dns_answer_names_read_ttls): not stored, counted apart. An existing entry for the same key
 * is replaced. 0 stored, 1 not stored (counted), -ENOMEM (nothing changed), -EINVAL (len over
 * 65535 or shorter than *a says: not an answer dns_parse_answer accepted). msg is copied. */
int dns_cache_put(struct dns_cache *c, uint32_t server, const uint8_t *msg, size_t len,
		  const struct dns_answer *a, int64_t now_ns);

/* A live entry for (server, q: name case-insensitively, type, class) at now_ns: true with the
 * stored message, its parsed answer and its age in whole seconds (so the caller builds the
 * client's reply with dns_build_from_answer(..., msg, a, age_s)); an expired entry is removed
 * (counted) and is a miss. A hit moves the entry to the most recently used end. *msg and *a
 * are borrowed: valid until the next call on c. */
bool dns_cache_get(struct dns_cache *c, uint32_t server, const struct dns_question *q,
		   int64_t now_ns, const uint8_t **msg, size_t *len, const struct dns_answer **a,
		   uint32_t *age_s);

/* The live entry's message, its parsed answer and its age in whole seconds (borrowed for the
 * call; fn must not call the cache). true: the caller could use it (built its reply). */
typedef bool (*dns_cache_use_fn)(void *arg, const uint8_t *msg, size_t len,
				 const struct dns_answer *a, uint32_t age_s);

/* dns_cache_get with the use decided inside the lookup: a live entry is handed to fn, and only
 * if fn takes it is the lookup a hit (true). An entry fn refuses (a reply that cannot be
 * rebuilt from it) goes, counted as unusable, and the lookup is a miss (false), as it is
 * when no live entry is found. */
bool dns_cache_use(struct dns_cache *c, uint32_t server, const struct dns_question *q,
		   int64_t now_ns, dns_cache_use_fn fn, void *arg);

/* Reload: every entry goes (the counters stay). */
void dns_cache_clear(struct dns_cache *c);

void dns_cache_get_stats(const struct dns_cache *c, struct dns_cache_stats *out);

#endif
