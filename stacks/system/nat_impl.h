/* nat_impl.h — the NAT table's private layout and the helpers its files share: nat.c (the
 * per-packet operations, purge and stats) and nat_mem.c (the table's creation, freeing and
 * trims). Nothing outside stacks/system/nat*.c includes it; the contracts are in nat.h. */
#ifndef TS_STACKS_SYSTEM_NAT_IMPL_H
#define TS_STACKS_SYSTEM_NAT_IMPL_H

#include "stacks/system/nat.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SHARD_BITS 6
#define SHARD_MASK (NAT_SHARDS - 1)
_Static_assert(NAT_SHARDS == 1 << SHARD_BITS, "shard index is the low hash bits");
_Static_assert(sizeof(struct flow_key) == 40, "flow_key is hashed as five 64-bit words");

#define CACHELINE 64
#define HOT __attribute__((always_inline)) static inline /* small, on every flow's path */
#define NO_HEAP UINT32_MAX
#define BUCKETS_MIN 8          /* initial buckets per shard map */
#define BUCKETS_MAX (1u << 30) /* stop doubling: chains just get longer */
#define CHUNK_MIN 8            /* slab chunk sizes double from here ... */
#define CHUNK_MAX 256          /* ... up to here (entries per chunk) */
#define RING_MIN 64            /* initial quarantine ring capacity */
#define RELEASE_BATCH 256      /* quarantine releases per lock hold in nat_purge */
#define PURGE_BATCH 64         /* candidates per collect/remove round in nat_purge */
#define Q_EMPTY UINT64_MAX     /* q_head when the quarantine is empty */
#define OWNED 0x80             /* owner byte: claimed (mapped or quarantined); low bits fshard */
#define RESTING 0x40           /* owner byte: with OWNED, the tuple is in the quarantine ring */
#define Q_TICK_SHIFT 20
_Static_assert(NAT_QUARANTINE_TICK_NS == 1 << Q_TICK_SHIFT, "tick and shift agree");
_Static_assert((SHARD_MASK & (OWNED | RESTING)) == 0, "the owner byte's flags and fshard");

struct nat_entry {
	uint64_t kw[5];              /* the flow_key as words: hashed and compared */
	struct nat_entry *fnext;     /* forward chain; free-list link while in the slab */
	struct nat_entry *rnext;     /* reverse chain */
	uint64_t gen;
	_Atomic int64_t last_seen;   /* last translated packet (or the closing mark) */
	uint64_t tkey;               /* the tuple, packed (tuple_pack) */
	uint32_t fhash;              /* forward hash >> SHARD_BITS: bucket index source */
	uint32_t heap_idx;           /* slot in the shard heap, NO_HEAP when not in it */
	uint8_t state;               /* enum nat_state */
	uint8_t fshard;              /* forward shard index (hash & SHARD_MASK) */
	uint8_t acct;                /* HALF_OPEN and counted in the per-source sketches */
};

struct heap_node {
	int64_t deadline; /* <= the entry's real deadline */
	struct nat_entry *e;
};

struct chunk {
	struct chunk *next;
	uint32_t n;                  /* entries in e[] */
	struct nat_entry e[];
};

/* A chained hash table; buckets a power of two, doubled when count exceeds them (load > 1).
 * At its smallest (BUCKETS_MIN) it uses the buckets inside it: a trim shrinks most maps of an
 * emptied table to that size, and their bucket arrays, made while the heap is full of a
 * load's holes, would each pin a page of it. */
struct map {
	struct nat_entry **b;        /* mini, or a heap array of mask + 1 */
	uint32_t mask;
	uint32_t count;
	struct nat_entry *mini[BUCKETS_MIN];
};

struct fwd_shard {
	alignas(CACHELINE) pthread_mutex_t lock;
	struct map map;
	struct heap_node *heap;         /* min-heap by deadline; capacity == slab capacity */
	uint32_t heap_len;
	uint32_t capacity;              /* entries in this shard's slab chunks */
	struct nat_entry *free;         /* slab free list */
	struct chunk *chunks;
	_Atomic int64_t next_deadline;  /* heap minimum, INT64_MAX when empty: lock-free reads */
	_Atomic uint64_t n_state[NAT_STATE_MAX]; /* single writer (the lock holder) */
};

struct rev_shard {
	alignas(CACHELINE) pthread_mutex_t lock;
	struct map map;
};

/* Division by a runtime constant without a divide (Lemire, "Faster Remainder by Direct
 * Computation", 2019): exact for every 32-bit numerator. */
struct fastdiv {
	uint64_t m; /* ceil(2^64 / d); 0 when d == 1 */
	uint32_t d;
};

#define OCC_LIVE 1ULL
#define OCC_HO (1ULL << 32)
#define SRC_LEVELS 2 /* 0: host (IPv4 /32, IPv6 /64), 1: network (IPv4 /24, IPv6 /48) */
#define SRC_ROWS 2   /* a count-min sketch: a source's count is the least of its rows' */
#define SKETCH_SPREAD 64   /* buckets per source that can reach the limit: collisions rare */
#define SKETCH_MIN 64
#define SKETCH_MAX 65536

/* HALF_OPEN entries per source prefix, counted in SRC_ROWS rows of keyed buckets. Every row
 * over-counts (other prefixes share buckets), never under-counts, so the least row bounds a
 * prefix from above: a prefix never gets more than limit counted entries, and another prefix
 * is wrongly refused only if it shares a full bucket in EVERY row. Relaxed atomics: racing
 * workers may each pass with the last free unit, so a prefix may exceed the limit by the
 * number of workers at most. */
struct sketch {
	_Atomic uint32_t *c; /* SRC_ROWS rows of mask + 1 counters */
	uint32_t mask;
	uint32_t limit;
};

/* A quarantined tuple: released once the tick clock reaches due. 64-bit ticks never wrap
 * (2^43 of them span the whole int64 clock), so a table idle for any time still releases. */
struct qrec {
	uint64_t due;  /* ceil((freed_at + quarantine_ns) / NAT_QUARANTINE_TICK_NS) */
	uint32_t slot; /* tuple index | family bit 31 */
};

struct nat_table {
	struct nat_config cfg;
	int64_t timeout[NAT_STATE_MAX]; /* pf style: the state indexes its lifetime */
	uint64_t hk[8];                 /* hash keys derived from the seed */
	uint32_t space;                 /* tuples per family: addrs * listeners * ports */
	uint32_t probe_max;             /* min(space, NAT_PROBE_LIMIT) */
	uint32_t stride;                /* the whole space's escape: about 0.618 x space */
	struct fastdiv div_l, div_a, div_n; /* by listeners, by addresses, by space */
	struct sketch src[SRC_LEVELS];  /* HALF_OPEN entries per source host, per source network */
	uint64_t sk[SRC_LEVELS * SRC_ROWS + 1]; /* their hash keys */
	uint64_t pmask[2][SRC_LEVELS]; /* [v4, v6][level]: the prefix's bytes of a source word */
	_Atomic uint8_t *owner[2];      /* per family [v4, v6], per tuple: OWNED|fshard or 0 */

	alignas(CACHELINE) _Atomic uint32_t cursor[2];
	_Atomic uint32_t wmask[2]; /* the cursor's window: size - 1 (a power of two), 0 = space */
	uint32_t wbase[2];         /* where the window starts in the space */
	_Atomic uint32_t purge_cursor;
	alignas(CACHELINE) _Atomic uint64_t gen;
	/* Entries reserved against max_entries (OCC_LIVE units, low half) and HALF_OPEN entries
	 * against half_open_max (OCC_HO units, high half): one CAS checks and takes both. */
	_Atomic uint64_t occ;
	uint32_t ho_fast; /* min(half_open_max, half_open_quiet): below, share_take's fast path */
	_Atomic uint64_t bytes;

	alignas(CACHELINE) pthread_mutex_t qlock;
	struct qrec *ring; /* FIFO; capacity a power of two */
	uint32_t q_head, q_len, q_mask;
	_Atomic uint64_t q_head_due; /* head's due tick, Q_EMPTY when empty: lock-free pre-check */
	_Atomic uint64_t q_count;

	alignas(CACHELINE) struct nat_counters ctr;
	struct fwd_shard fwd[NAT_SHARDS];
	struct rev_shard rev[NAT_SHARDS];
	int n_locks; /* mutexes initialized so far (for a failed nat_table_new) */
};

/* ---- helpers both files use --------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline void fastdiv_init(struct fastdiv *f, uint32_t d)
{
	f->d = d;
	f->m = d > 1 ? UINT64_MAX / d + 1 : 0;
}

static inline uint32_t fastdiv(const struct fastdiv *f, uint32_t n)
{
	return f->d == 1 ? n : (uint32_t)(((__uint128_t)f->m * n) >> 64);
}

static inline uint32_t fastmod(const struct fastdiv *f, uint32_t n)
{
	return (uint32_t)(((__uint128_t)(f->m * n) * f->d) >> 64);
}

static inline void bytes_add(struct nat_table *t, int64_t d)
{
	atomic_fetch_add_explicit(&t->bytes, (uint64_t)d, memory_order_relaxed);
}

static inline void map_free_buckets(struct map *m)
{
	if (m->b != m->mini)
		free(m->b);
}

static inline void q_publish(struct nat_table *t)
{
	atomic_store_explicit(&t->q_head_due, t->q_len ? t->ring[t->q_head].due : Q_EMPTY,
			      memory_order_relaxed);
	atomic_store_explicit(&t->q_count, t->q_len, memory_order_relaxed);
}

/* Rehash m into n buckets (a power of two); the change of the table's bytes (nat.c). */
int64_t nat_map_resize(struct nat_table *t, struct map *m, bool rev, uint32_t n);
/* The quarantine ring copied into cap records, under qlock; the change of bytes (nat.c). */
int64_t nat_ring_resize(struct nat_table *t, uint32_t cap);

#endif
