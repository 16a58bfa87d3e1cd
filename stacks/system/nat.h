/* nat.h — the system stack's NAT table (docs/architecture.md, "NAT table").
 *
 * Maps a flow's full (source, destination) pair to a tuple (NAT address, listener port, port P):
 * uplink packets are rewritten to nat_addr:P -> gateway:listener, the kernel accepts the
 * connection, and the accepted peer (nat_addr, P) on that listener finds the original pair again.
 *
 * Sans-IO and thread-safe: every call takes now_ns (monotonic nanoseconds) from the caller and
 * never reads the clock; several worker threads may call anything concurrently.
 *
 * Structure: forward map (flow_key -> entry) and reverse map (tuple -> entry), 64 shards each,
 * each shard a mutex + chained hash. Lock order: forward shard, then reverse shard, then the
 * quarantine lock. An entry's state, generation and map membership change only with both its
 * forward and reverse shard locks held, so a holder of either lock sees them consistent.
 *
 * States: HALF_OPEN (tuple allocated, not yet accepted), ACTIVE (accepted, a session owns it),
 * CLOSING (session ended, lingering so the kernel's FIN/ACK still gets translated).
 * HALF_OPEN expires half_open_timeout after the SYN that created it: no packet extends it (the
 * local kernel completes a handshake in microseconds, so the timeout bounds SYN to accept; were
 * packets to refresh it, the kernel's SYN-ACK retransmits, up to 31 s after a spoofed SYN, would
 * hold the entry about twice as long). CLOSING expires linger after its LAST TRANSLATED PACKET
 * (or after the closing mark, if later: see nat_mark_closing); ACTIVE never expires (the
 * session's guard marks it CLOSING).
 * The HALF_OPEN entries are a bounded share of the table (nat_config.half_open_*): in all, per
 * source host and per source network, so a SYN flood neither takes the budget from established
 * connections nor the share from other sources.
 * A freed tuple is quarantined (FIFO) for quarantine_ns before it can be allocated again: the
 * kernel's accepted socket for that tuple may still be in TIME_WAIT.
 */
#ifndef TS_STACKS_SYSTEM_NAT_H
#define TS_STACKS_SYSTEM_NAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "core/flow.h"

#define NAT_SHARDS 64
#define NAT_PROBE_LIMIT 4096
#define NAT_WINDOW_MIN 16384  /* tuples the cursor walks at first (a power of two) */
#define NAT_WINDOW_RUN 1024   /* busy tuples in a row that double the window */
#define NAT_WHOLE_RUN 64      /* busy tuples in a row that move the whole space's cursor */
#define NAT_WINDOW_CHECK 64   /* cursor steps between two looks at the window's occupancy */
#define NAT_MAX_ADDRS 64
#define NAT_MAX_LISTENERS 16
#define NAT_RELEASE_PER_ALLOC 2 /* due quarantined tuples released before each allocation */
#define NAT_QUARANTINE_TICK_NS (1 << 20) /* a tuple's rest is rounded UP to this (~1 ms) */
/* nat_next_deadline asks for the quarantine this long after its oldest tuple is due, so that
 * releases are batched (a tuple resting longer costs nothing: allocations release too). */
#define NAT_QUARANTINE_WAKE_NS (1LL << 30) /* ~1.07 s */
#define NAT_TIMEOUT_MAX_NS (86400LL * 1000000000LL) /* bound of every configured duration */
/* A HALF_OPEN entry's life after the app's RST (nat_uplink_rst): long enough for the handshake
 * to go on should the kernel have found the RST out of its window. */
#define NAT_RST_LINGER_NS (2LL * 1000000000LL)

enum nat_state {
	NAT_HALF_OPEN,
	NAT_ACTIVE,
	NAT_CLOSING,
	NAT_STATE_MAX
};

const char *nat_state_name(enum nat_state s);

/* A tuple the kernel sees: (family, NAT address index, listener index, port P host order). */
struct nat_tuple {
	uint8_t family;   /* 4 or 6 */
	uint8_t addr;     /* index into the NAT addresses of that family: gateway + 1 + addr */
	uint8_t listener; /* index into the listener ports of that family */
	uint16_t port;    /* P, host byte order */
};

struct nat_config {
	uint32_t max_entries;     /* entry budget, separate from TCP admission; >= 1 */
	uint32_t n_addrs;         /* NAT addresses per family, 1..NAT_MAX_ADDRS */
	uint32_t n_listeners;     /* listener ports per family, 1..NAT_MAX_LISTENERS */
	uint16_t port_min, port_max; /* range of P, inclusive; 1 <= min <= max */
	int64_t half_open_ns;     /* HALF_OPEN lifetime after its last packet; > 0 */
	int64_t linger_ns;        /* CLOSING lifetime after its last packet; >= 0 */
	int64_t quarantine_ns;    /* a freed tuple's rest before reuse; >= 0 */
	/* (all three at most NAT_TIMEOUT_MAX_NS) */
	uint64_t seed;            /* hash key and allocation cursor start; fixed => deterministic */
	/* The HALF_OPEN share (a SYN flood must not take the table): new HALF_OPEN entries are
	 * refused (counted per reason) beyond half_open_max in all, and, for entries created
	 * while at least half_open_quiet exist, beyond half_open_per_host per source host
	 * (IPv4 /32, IPv6 /64) or half_open_per_net per source network (IPv4 /24, IPv6 /48).
	 * The limits >= 1, half_open_quiet >= 0 (0: every entry counted); see
	 * nat_config_half_open_limits for the defaults. */
	uint32_t half_open_max;
	uint32_t half_open_per_host;
	uint32_t half_open_per_net;
	uint32_t half_open_quiet;
};

/* Defaults: 65536 entries, 4 addresses, 2 listeners, ports 1024-65535, 30 s / 10 s / 60 s,
 * and the HALF_OPEN limits nat_config_half_open_limits derives from 65536 entries. */
void nat_config_default(struct nat_config *c);

/* Set the HALF_OPEN limits from c->max_entries (each at least 1): half_open_max = 1/2 of it,
 * half_open_per_net = 1/64, half_open_per_host = 1/256, half_open_quiet = half_open_per_net
 * (65536 entries: 32768 / 1024 / 256 / 1024). */
void nat_config_half_open_limits(struct nat_config *c);

/* Counters of table operations and refusals (all monotonic). `created` includes replacements,
 * so live entries = created - replaced - expired and quarantine = quarantined - released -
 * quarantine_reuse. */
#define NAT_COUNTERS(X)                                                                        \
	X(created)           /* new HALF_OPEN entries */                                       \
	X(replaced)          /* pure SYN on a CLOSING mapping: replaced by a new tuple */       \
	X(accepted)          /* HALF_OPEN -> ACTIVE */                                          \
	X(closed)            /* ACTIVE -> CLOSING */                                            \
	X(expired)           /* removed by cleanup */                                           \
	X(expiry_saved)      /* collected as expired, found refreshed on re-check: kept */      \
	X(quarantined)       /* tuples put into quarantine */                                   \
	X(released)          /* tuples out of quarantine, free again */                         \
	X(quarantine_reuse)  /* a tuple picked again while still in quarantine (its release     \
	                        found it claimed anew; never by design: a broken invariant) */  \
	X(uplink_miss)       /* uplink lookup without mapping, not allowed to create */         \
	X(downlink_miss)     /* downlink tuple without mapping */                               \
	X(accept_miss)       /* accept for a tuple without a HALF_OPEN mapping */               \
	X(gen_mismatch)      /* mark_closing with a stale generation: ignored */                \
	X(budget_exhausted)  /* entry budget full: new flow refused */                         \
	X(ports_exhausted)   /* no free tuple within NAT_PROBE_LIMIT probes */                 \
	X(window_grown)      /* the allocation window of a family doubled (see tuple_alloc) */  \
	X(owner_pages_dropped) /* owner-map pages with no claimed tuple given back (nat_trim) */ \
	X(half_open_full)    /* half_open_max HALF_OPEN entries: new flow refused */            \
	X(half_open_host)    /* the source host's half_open_per_host reached: refused */        \
	X(half_open_net)     /* the source network's half_open_per_net reached: refused */     \
	X(half_open_reset)   /* HALF_OPEN entries ended early by the app's RST */

struct nat_counters {
#define NAT_CTR_FIELD(name) ctr_t name;
	NAT_COUNTERS(NAT_CTR_FIELD)
#undef NAT_CTR_FIELD
};

struct nat_stats {
	uint64_t entries[NAT_STATE_MAX]; /* current entries by state */
	uint64_t quarantine;             /* tuples resting in quarantine */
	uint64_t bytes;                  /* memory held by the table */
};

/* A candidate returned by nat_collect_expired, for nat_remove_if_expired. */
struct nat_candidate {
	struct nat_tuple tuple;
	uint64_t gen;
	uint32_t fwd_shard;
};

struct nat_table;

/* 0 or -EINVAL (bad config) / -ENOMEM. */
int nat_table_new(const struct nat_config *cfg, struct nat_table **out)
	__attribute__((warn_unused_result));
void nat_table_free(struct nat_table *t);

/* Uplink: the tuple for key, refreshing the entry's last-packet time (not a HALF_OPEN one's).
 * A missing mapping is created (HALF_OPEN) only when pure_syn (SYN set, ACK and RST clear).
 * A pure SYN on a CLOSING mapping removes it (its tuple goes to quarantine) and creates a new
 * mapping on a DIFFERENT tuple. A SYN on HALF_OPEN (retransmit) reuses it.
 * Returns 0; -ENOENT no mapping and !pure_syn; -ENOSPC entry budget exhausted; -EBUSY the
 * HALF_OPEN share is full, in all or for key's source host or network (a replacement too);
 * -EADDRNOTAVAIL no free tuple within NAT_PROBE_LIMIT probes (a replacement that finds none
 * leaves the CLOSING mapping as it was). Refusals are counted. -EINVAL key->family not 4 or 6;
 * -ENOMEM (the entry slab could not grow). Before allocating, up to NAT_RELEASE_PER_ALLOC
 * quarantined tuples whose rest is over are released. */
int nat_uplink(struct nat_table *t, const struct flow_key *key, bool pure_syn, int64_t now_ns,
	       struct nat_tuple *tuple_out);

/* The app sent a RST on key's connection (uplink, after nat_uplink found the mapping). A
 * HALF_OPEN mapping then ends NAT_RST_LINGER_NS from now, if that is sooner than its timeout:
 * the handshake was given up (a SYN scan's RST after the SYN-ACK), and the HALF_OPEN share
 * must not be held for half_open_timeout by connections that no longer exist. Any other
 * mapping is left alone (an accepted one closes with its session). Returns 1 if shortened
 * (counted in half_open_reset), else 0. Rare: the per-packet path does not pay for it. */
int nat_uplink_rst(struct nat_table *t, const struct flow_key *key, int64_t now_ns);

/* Downlink: the original key of tuple's mapping, refreshing its last-packet time (not a
 * HALF_OPEN one's: the kernel's SYN-ACK retransmits do not keep a spoofed SYN's entry).
 * Returns 0 or -ENOENT (counted). */
int nat_downlink(struct nat_table *t, const struct nat_tuple *tuple, int64_t now_ns,
		 struct flow_key *key_out);

/* Accept: in one critical section, look up tuple, require HALF_OPEN, mark ACTIVE and stamp a
 * new generation. Returns 0 with the original key and generation, or -ENOENT (no HALF_OPEN
 * mapping; counted). */
int nat_accept(struct nat_table *t, const struct nat_tuple *tuple, int64_t now_ns,
	       struct flow_key *key_out, uint64_t *gen_out);

/* ACTIVE -> CLOSING, only if the mapping still carries generation gen (else nothing; counted).
 * Idempotent. Returns 0, -ENOENT (gone) or -ESTALE (generation mismatch; also a mapping not
 * accepted yet, which no caller holds a generation for). The mark counts as the last packet:
 * the linger runs from max(last packet, mark), because the kernel's FIN follows the close even
 * when the flow was idle for long before it. */
int nat_mark_closing(struct nat_table *t, const struct nat_tuple *tuple, uint64_t gen,
		     int64_t now_ns);

/* Cleanup, phase 1: collect up to max entries whose deadline has passed at now_ns.
 * Bounded work: only entries at the head of the per-shard deadline heaps are examined, at most
 * max of them (a head refreshed by packets is re-armed, and that counts), so fewer than max may
 * come back while more are due: nat_next_deadline() <= now_ns says so.
 * Contract: every returned candidate MUST be passed to nat_remove_if_expired (it is out of the
 * deadline heap until then). */
size_t nat_collect_expired(struct nat_table *t, int64_t now_ns, struct nat_candidate *out,
			   size_t max);

/* Cleanup, phase 2: remove c's mapping if it still exists with c's generation and is STILL
 * expired at now_ns (a packet or an accept since phase 1 keeps it). The tuple is quarantined.
 * Returns 0 removed, -EAGAIN kept (re-armed), -ENOENT gone or generation changed. */
int nat_remove_if_expired(struct nat_table *t, const struct nat_candidate *c, int64_t now_ns);

/* Both phases for up to budget entries (heap heads examined), then release up to budget
 * quarantined tuples whose rest is over. Returns the number of entries removed.
 * Call when nat_next_deadline() has passed. */
size_t nat_purge(struct nat_table *t, int64_t now_ns, size_t budget);

/* Earliest time at which nat_purge has work, or INT64_MAX if none (an empty table with an
 * empty quarantine never asks to be woken). The quarantine's oldest tuple counts
 * NAT_QUARANTINE_WAKE_NS after it is due. Lock-free. May be early (then nat_purge finds nothing
 * and it moves on). */
int64_t nat_next_deadline(const struct nat_table *t);

/* Give back memory the table holds beyond its use: slab chunks none of whose entries is
 * live (the heap array shrinks with them), hash maps at most an eighth full (to twice their
 * count) and a quarantine ring at most a quarter full. Nothing live moves or changes; takes
 * each shard lock and the quarantine lock in turn, so workers may run meanwhile. A failed
 * allocation keeps the larger array. With exclusive (the caller guarantees that no other
 * thread uses the table during the call: one queue), the owner maps' pages that hold no
 * claimed tuple go back too (counted in owner_pages_dropped; they read as zero again, and a
 * claim is a lock-free write that could race the discard otherwise). Returns the bytes given
 * back, as `bytes` counts them (the owner maps count whole from the start). */
size_t nat_trim(struct nat_table *t, bool exclusive);

void nat_get_stats(const struct nat_table *t, struct nat_stats *out);
const struct nat_counters *nat_get_counters(const struct nat_table *t);

/* The state and generation of tuple's mapping (tests and stats). 0 or -ENOENT. */
int nat_peek(struct nat_table *t, const struct nat_tuple *tuple, enum nat_state *state_out,
	     uint64_t *gen_out);

enum nat_tuple_status {
	NAT_TUPLE_FREE,    /* can be allocated */
	NAT_TUPLE_MAPPED,  /* a mapping holds it */
	NAT_TUPLE_RESTING, /* claimed without a mapping: quarantined (or being allocated) */
};

/* What tuple is now (tests and diagnostics): an enum nat_tuple_status, or -EINVAL when the
 * tuple is outside the configured space. */
int nat_tuple_status(struct nat_table *t, const struct nat_tuple *tuple);

/* Is a SYN flood's pressure on: at least half_open_quiet HALF_OPEN entries (and at least one),
 * the point from which their sources are counted? A refused SYN is then answered with silence
 * (its source may be spoofed), else with a RST. Lock-free (one relaxed load). */
bool nat_half_open_pressure(const struct nat_table *t);

#endif
