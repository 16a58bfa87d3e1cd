/* fakeip.h — the fake-IP pool, sans-IO: a name asked for gets an address from a configured
 * range (one per family), and a connection to that address later carries the name.
 *
 * Mappings are bounded (max_mappings, both families together) and kept in least-recently-used
 * order. A mapping is never handed to another name while a session holds it (pins), nor within
 * cooldown_s of its last use: an app that cached the fake address (DNS TTLs are ignored by
 * many) would otherwise reach another name. A name asked again gets its address back (and
 * refreshes it). Addresses are handed out in order through the range, skipping an IPv4
 * range's network and broadcast addresses and an IPv6 range's first (subnet-router anycast,
 * RFC 4291 2.6.1) address; when the range or max_mappings is used up, the least recently
 * used free mapping is reused (the family's own, keeping its address; when it is
 * max_mappings that are used up and the family has none, the other family's); when none is
 * free, the lookup fails (-ENOSPC, the DNS answer is SERVFAIL) and nothing held is disturbed.
 *
 * Persistence is text, one "ADDRESS NAME" a line, written by fakeip_dump and read by
 * fakeip_load (bad lines, addresses outside the ranges, names already mapped, lines past
 * max_mappings and lines no memory was found for are counted and skipped): the caller does the file I/O, off the loop.
 *
 * Single-threaded: every call on one thread (the proxy's loop). The clock is the caller's, in
 * seconds (monotonic).
 */
#ifndef TS_DNS_FAKEIP_H
#define TS_DNS_FAKEIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/netaddr.h"

struct fakeip_config {
	struct netaddr_cidr range4;   /* family 0: no IPv4 range */
	struct netaddr_cidr range6;   /* family 0: no IPv6 range */
	uint32_t max_mappings;        /* 1..; live mappings of both families together */
	uint32_t cooldown_s;          /* a mapping is reused at the earliest this long after use */
};

struct fakeip_stats {
	uint64_t mappings;            /* gauge */
	uint64_t pinned;              /* gauge: mappings a session holds */
	uint64_t created, reused;     /* new mappings: on a fresh address, on a recycled one */
	uint64_t hits;                /* a name asked again */
	uint64_t exhausted;           /* lookups refused: nothing free */
	uint64_t unmapped;            /* fakeip_name asked for an address in a range, unmapped */
};

struct fakeip_load_stats {
	uint64_t loaded;       /* mappings added */
	uint64_t bad;          /* lines that are not "ADDRESS NAME" with a valid name */
	uint64_t outside;      /* addresses outside the ranges (the ranges changed) */
	uint64_t duplicates;   /* an address or name already mapped */
	uint64_t full;         /* past max_mappings */
	uint64_t no_memory;    /* not added: an allocation failed */
};

struct fakeip;

/* 0 and *out, or -EINVAL (no range, a range too small to hold an address, max_mappings 0),
 * -ENOMEM. */
int fakeip_new(const struct fakeip_config *cfg, struct fakeip **out)
	__attribute__((warn_unused_result));
void fakeip_free(struct fakeip *f);

/* The fake address of name (len bytes, a name outbound_name_valid accepts, compared
 * case-insensitively, stored in lower case) for family 4 or 6 into addr (16 bytes, IPv4 in
 * the first 4). 0, -EAFNOSUPPORT (no range of that family), -EINVAL (not a valid name),
 * -ENOSPC (every mapping is pinned or cooling down), -ENOMEM (nothing changed). */
int fakeip_address(struct fakeip *f, const char *name, size_t len, int family, int64_t now_s,
		   uint8_t addr[16]);

/* Is addr inside one of the ranges? */
bool fakeip_contains(const struct fakeip *f, int family, const uint8_t addr[16]);

/* The name mapped to addr: its length (name NUL-terminated in buf, cap at least 254), 0 when
 * addr is inside a range but not mapped (the connection must be refused, not made to the fake
 * address), -ENOENT when addr is not a fake address at all. A hit refreshes the mapping. */
int fakeip_name(struct fakeip *f, int family, const uint8_t addr[16], int64_t now_s, char *buf,
		size_t cap);

/* A session holds the mapping of addr (pin) or lets it go (unpin); unknown addresses are
 * ignored. While pinned a mapping is never reused. */
void fakeip_pin(struct fakeip *f, int family, const uint8_t addr[16]);
void fakeip_unpin(struct fakeip *f, int family, const uint8_t addr[16], int64_t now_s);

/* Write every mapping as "ADDRESS NAME\n" lines through out (its return: 0 or -errno, which
 * stops the dump and is returned). Least recently used first. */
int fakeip_dump(const struct fakeip *f, int (*out)(void *arg, const char *line, size_t len),
		void *arg);

/* Add the mappings of text (fakeip_dump's format) as used at now_s, up to max_mappings. */
void fakeip_load(struct fakeip *f, const char *text, size_t len, int64_t now_s,
		 struct fakeip_load_stats *st);

void fakeip_get_stats(const struct fakeip *f, struct fakeip_stats *out);

#endif
