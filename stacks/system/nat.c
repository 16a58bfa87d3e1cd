/* nat.c — the system stack's NAT table (docs/architecture.md "NAT table"; contracts in nat.h).
 *
 * Layout: 64 forward shards (flow_key -> entry; each also owns the deadline heap and the entry
 * slab of its entries) and 64 reverse shards (tuple -> entry). A per-family owner map (one byte
 * per tuple) and an atomic cursor hand out tuples; freed tuples rest in a FIFO quarantine before
 * their byte clears. The cursor walks a window of the space that grows with demand (see
 * tuple_alloc), so the pages of the owner map a light load touches stay few.
 *
 * Lock order: forward shard -> reverse shard -> quarantine lock. Never two shards of one kind.
 * Invariants (checked with assert in debug builds):
 *  - an entry's state, gen, tkey and map membership change only with its forward shard lock AND
 *    (while it is in a reverse map) its reverse shard lock held; last_seen is a relaxed atomic
 *    refreshed under either lock;
 *  - the heap, the slab, the per-state counts and e->heap_idx belong to the forward shard lock;
 *  - a HALF_OPEN or CLOSING entry is in its shard's heap, or exactly one outstanding candidate
 *    of nat_collect_expired carries its current generation (phase 2 re-arms or removes it);
 *  - a heap node's deadline is <= the entry's real deadline (packets only move last_seen on);
 *  - a tuple's owner byte is OWNED|fshard while it is mapped, OWNED|RESTING|fshard while it
 *    is quarantined (the claim is an atomic test-and-set of that byte; fshard is the forward
 *    shard of the entry that claimed it, a lock-free hint for operations that start from a
 *    tuple); only the quarantine release clears it, and only a RESTING one: a release that
 *    finds its tuple claimed anew counts quarantine_reuse and leaves the new claim alone.
 */
#include "stacks/system/nat.h"
#include "stacks/system/nat_impl.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------------------ */

static const char *const state_names[NAT_STATE_MAX] = {
	[NAT_HALF_OPEN] = "half_open",
	[NAT_ACTIVE] = "active",
	[NAT_CLOSING] = "closing",
};

const char *nat_state_name(enum nat_state s)
{
	return (unsigned)s < NAT_STATE_MAX ? state_names[s] : "invalid";
}

void nat_config_default(struct nat_config *c)
{
	*c = (struct nat_config){
		.max_entries = 65536,
		.n_addrs = 4,
		.n_listeners = 2,
		.port_min = 1024,
		.port_max = 65535,
		.half_open_ns = 30LL * 1000000000LL,
		.linger_ns = 10LL * 1000000000LL,
		.quarantine_ns = 60LL * 1000000000LL,
		.seed = 0x7477696e73746b31ULL,
	};
	nat_config_half_open_limits(c);
}

static uint32_t at_least_1(uint32_t v)
{
	return v ? v : 1;
}

void nat_config_half_open_limits(struct nat_config *c)
{
	c->half_open_max = at_least_1(c->max_entries / 2);
	c->half_open_per_net = at_least_1(c->max_entries / 64);
	c->half_open_per_host = at_least_1(c->max_entries / 256);
	c->half_open_quiet = c->half_open_per_net;
}

static inline int64_t sat_add(int64_t a, int64_t b)
{
	int64_t r;

	return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

/* 64x64 -> 128 multiply folded to 64 bits (the wyhash "mum"): one mul on x86-64 and arm64. */
static inline uint64_t mum(uint64_t a, uint64_t b)
{
	__uint128_t r = (__uint128_t)a * b;

	return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/* Word i of a key (flow.h: 40 bytes, no holes), loaded in place. */
static inline uint64_t kw(const struct flow_key *k, int i)
{
	uint64_t w;

	memcpy(&w, (const unsigned char *)k + 8 * i, sizeof(w));
	return w;
}

/* Words 2 and 4 are zero in IPv4 keys (flow.h): word 2 costs one xor, word 4 is skipped. */
static inline uint64_t key_hash(const struct nat_table *t, const struct flow_key *k)
{
	uint64_t h = mum(kw(k, 0) ^ t->hk[0], kw(k, 1) ^ t->hk[1]) ^
		     mum(kw(k, 3) ^ t->hk[2], kw(k, 2) ^ t->hk[3]);

	if (k->family == 6)
		h ^= mum(kw(k, 4) ^ t->hk[4], t->hk[5]);
	return h;
}

static inline uint64_t tuple_hash(const struct nat_table *t, uint64_t tkey)
{
	return mum(tkey ^ t->hk[6], t->hk[7]);
}

/* The tuple as one word: family | addr << 8 | listener << 16 | port << 32 (struct nat_tuple has
 * a padding byte, so it is never compared raw). On little-endian hosts the first three bytes
 * load as one word. */
_Static_assert(offsetof(struct nat_tuple, listener) == 2 && offsetof(struct nat_tuple, port) == 4,
	       "tuple layout");
static inline uint64_t tuple_pack(const struct nat_tuple *tp)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	uint32_t lo;

	memcpy(&lo, tp, sizeof(lo));
	return (lo & 0xffffffu) | (uint64_t)tp->port << 32;
#else
	return (uint64_t)tp->family | (uint64_t)tp->addr << 8 | (uint64_t)tp->listener << 16 |
	       (uint64_t)tp->port << 32;
#endif
}

static inline void tuple_unpack(uint64_t k, struct nat_tuple *tp)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	uint32_t lo = (uint32_t)k & 0xffffffu;

	memcpy(tp, &lo, sizeof(lo));
	tp->port = (uint16_t)(k >> 32);
#else
	*tp = (struct nat_tuple){ .family = (uint8_t)k, .addr = (uint8_t)(k >> 8),
				  .listener = (uint8_t)(k >> 16), .port = (uint16_t)(k >> 32) };
#endif
}

static inline bool key_eq(const uint64_t a[5], const struct flow_key *k)
{
	return ((a[0] ^ kw(k, 0)) | (a[1] ^ kw(k, 1)) | (a[2] ^ kw(k, 2)) | (a[3] ^ kw(k, 3)) |
		(a[4] ^ kw(k, 4))) == 0;
}

static inline uint64_t now_tick(int64_t now_ns)
{
	return (uint64_t)now_ns >> Q_TICK_SHIFT; /* monotonic time: never negative */
}

/* Q_EMPTY (UINT64_MAX) is never due: ticks stay below 2^43. */
static inline bool tick_due(uint64_t now, uint64_t due)
{
	return now >= due;
}

static inline void touch(struct nat_entry *e, int64_t now_ns)
{
	/* Only forward: a late batch from another worker must not pull the deadline back. Two
	 * racing writers (one under each lock) can still leave the smaller of their two clocks,
	 * so last_seen, and an expiry, may lag by the skew between workers' batch clocks: the
	 * mapping lives that much longer, never shorter. No locked instruction per packet. */
	if (now_ns > atomic_load_explicit(&e->last_seen, memory_order_relaxed))
		atomic_store_explicit(&e->last_seen, now_ns, memory_order_relaxed);
}

static inline int64_t expires(const struct nat_table *t, const struct nat_entry *e)
{
	if (e->state == NAT_ACTIVE)
		return INT64_MAX;
	return sat_add(atomic_load_explicit(&e->last_seen, memory_order_relaxed),
		       t->timeout[e->state]);
}

static inline uint64_t gen_next(struct nat_table *t)
{
	return atomic_fetch_add_explicit(&t->gen, 1, memory_order_relaxed) + 1;
}

static inline void state_add(struct fwd_shard *sh, int state, int64_t d)
{
	_Atomic uint64_t *c = &sh->n_state[state];

	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d,
			      memory_order_relaxed);
}

/* ---- chained hash maps ------------------------------------------------------------------- */

static inline struct nat_entry **next_of(struct nat_entry *e, bool rev)
{
	return rev ? &e->rnext : &e->fnext;
}

static inline uint32_t bucket_hash(const struct nat_table *t, const struct nat_entry *e, bool rev)
{
	return rev ? (uint32_t)(tuple_hash(t, e->tkey) >> SHARD_BITS) : e->fhash;
}

/* Rehash m into n buckets (a power of two). Returns the change of the table's bytes. A failed
 * allocation leaves m as it was (0): longer chains after a failed grow, more buckets than
 * needed after a failed shrink. */
int64_t nat_map_resize(struct nat_table *t, struct map *m, bool rev, uint32_t n)
{
	struct nat_entry **nb, *e, *next;
	int64_t d;

	if (n == BUCKETS_MIN && m->b != m->mini) {
		nb = m->mini;
		memset(nb, 0, sizeof(m->mini));
	} else if ((nb = calloc(n, sizeof(*nb))) == NULL) {
		return 0;
	}
	for (uint32_t i = 0; i <= m->mask; i++) {
		for (e = m->b[i]; e; e = next) {
			struct nat_entry **slot = &nb[bucket_hash(t, e, rev) & (n - 1)];

			next = *next_of(e, rev);
			*next_of(e, rev) = *slot;
			*slot = e;
		}
	}
	d = ((int64_t)n - (int64_t)m->mask - 1) * (int64_t)sizeof(*nb);
	bytes_add(t, d);
	map_free_buckets(m);
	m->b = nb;
	m->mask = n - 1;
	return d;
}

/* Amortized O(1) per insert; a failed allocation only leaves longer chains. */
static void map_grow(struct nat_table *t, struct map *m, bool rev)
{
	uint32_t n = (m->mask + 1) * 2;

	if (n <= BUCKETS_MAX)
		(void)nat_map_resize(t, m, rev, n);
}

static void map_insert(struct nat_table *t, struct map *m, struct nat_entry *e, uint32_t h,
		       bool rev)
{
	struct nat_entry **slot = &m->b[h & m->mask];

	*next_of(e, rev) = *slot;
	*slot = e;
	if (++m->count > m->mask + 1)
		map_grow(t, m, rev);
}

static void map_unlink(struct map *m, struct nat_entry *e, uint32_t h, bool rev)
{
	struct nat_entry **p = &m->b[h & m->mask];

	while (*p != e) {
		assert(*p);
		p = next_of(*p, rev);
	}
	*p = *next_of(e, rev);
	m->count--;
}

static inline struct nat_entry *fwd_find(const struct map *m, const struct flow_key *k,
					 uint32_t h)
{
	struct nat_entry *e;

	for (e = m->b[h & m->mask]; e; e = e->fnext)
		if (e->fhash == h && key_eq(e->kw, k))
			break;
	return e;
}

static inline struct nat_entry *rev_find(const struct map *m, uint64_t tkey, uint32_t h)
{
	struct nat_entry *e;

	for (e = m->b[h & m->mask]; e; e = e->rnext)
		if (e->tkey == tkey)
			break;
	return e;
}

/* ---- deadline heap (per forward shard; caller holds the shard lock) ---------------------- */

static inline void heap_put(struct fwd_shard *sh, uint32_t i, struct heap_node n)
{
	sh->heap[i] = n;
	n.e->heap_idx = i;
}

/* sift_up and sift_down return where n landed: slot 0 means a new minimum to publish. */
static uint32_t sift_up(struct fwd_shard *sh, uint32_t i, struct heap_node n)
{
	while (i > 0) {
		uint32_t parent = (i - 1) / 2;

		if (sh->heap[parent].deadline <= n.deadline)
			break;
		heap_put(sh, i, sh->heap[parent]);
		i = parent;
	}
	heap_put(sh, i, n);
	return i;
}

static uint32_t sift_down(struct fwd_shard *sh, uint32_t i, struct heap_node n)
{
	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= sh->heap_len)
			break;
		if (c + 1 < sh->heap_len && sh->heap[c + 1].deadline < sh->heap[c].deadline)
			c++;
		if (n.deadline <= sh->heap[c].deadline)
			break;
		heap_put(sh, i, sh->heap[c]);
		i = c;
	}
	heap_put(sh, i, n);
	return i;
}

static inline void heap_publish(struct fwd_shard *sh)
{
	atomic_store_explicit(&sh->next_deadline, sh->heap_len ? sh->heap[0].deadline : INT64_MAX,
			      memory_order_relaxed);
}

/* Never fails: heap capacity equals slab capacity and an entry is in the heap at most once.
 * Publishes the minimum when it changed. */
HOT void heap_push(struct fwd_shard *sh, struct nat_entry *e, int64_t deadline)
{
	assert(e->heap_idx == NO_HEAP && sh->heap_len < sh->capacity);
	if (sift_up(sh, sh->heap_len++, (struct heap_node){ deadline, e }) == 0)
		heap_publish(sh);
}

/* Take e out of the heap; returns true when the minimum changed (not yet published). */
static bool heap_delete(struct fwd_shard *sh, struct nat_entry *e)
{
	uint32_t i = e->heap_idx;
	struct heap_node last;

	assert(i < sh->heap_len && sh->heap[i].e == e);
	e->heap_idx = NO_HEAP;
	last = sh->heap[--sh->heap_len];
	if (i < sh->heap_len) {
		if (i > 0 && last.deadline < sh->heap[(i - 1) / 2].deadline)
			i = sift_up(sh, i, last);
		else
			sift_down(sh, i, last);
	}
	return i == 0;
}

static void heap_remove(struct fwd_shard *sh, struct nat_entry *e)
{
	if (heap_delete(sh, e))
		heap_publish(sh);
}

/* Arm e at deadline: push, or move it if it is already in the heap. */
static void heap_arm(struct fwd_shard *sh, struct nat_entry *e, int64_t deadline)
{
	if (e->heap_idx != NO_HEAP)
		heap_remove(sh, e);
	heap_push(sh, e, deadline);
}

/* ---- entry slab (per forward shard; caller holds the shard lock) ------------------------- */

/* Chunks double (CHUNK_MIN..CHUNK_MAX entries) so memory follows use; the heap grows with the
 * slab so that heap_push can never fail. */
static int slab_grow(struct nat_table *t, struct fwd_shard *sh)
{
	uint32_t n = sh->capacity < CHUNK_MIN ? CHUNK_MIN :
		     sh->capacity > CHUNK_MAX ? CHUNK_MAX : sh->capacity;
	struct chunk *c = malloc(sizeof(*c) + (size_t)n * sizeof(struct nat_entry));
	struct heap_node *h;

	if (!c)
		return -ENOMEM;
	h = realloc(sh->heap, (size_t)(sh->capacity + n) * sizeof(*h));
	if (!h) {
		free(c);
		return -ENOMEM;
	}
	sh->heap = h;
	c->next = sh->chunks;
	c->n = n;
	sh->chunks = c;
	for (uint32_t i = 0; i < n; i++) {
		c->e[i].fnext = sh->free;
		sh->free = &c->e[i];
	}
	sh->capacity += n;
	bytes_add(t, (int64_t)(sizeof(*c) + n * (sizeof(struct nat_entry) + sizeof(*h))));
	return 0;
}

static struct nat_entry *entry_get(struct nat_table *t, struct fwd_shard *sh)
{
	struct nat_entry *e;

	if (!sh->free && slab_grow(t, sh) != 0)
		return NULL;
	e = sh->free;
	sh->free = e->fnext;
	return e;
}

static inline void entry_put(struct fwd_shard *sh, struct nat_entry *e)
{
	e->fnext = sh->free;
	sh->free = e;
}

/* ---- entry budget and the HALF_OPEN share ------------------------------------------------ */

/* Take add (OCC_LIVE + OCC_HO for a new entry, OCC_HO for a replacement) if both limits allow;
 * *ho_out: the HALF_OPEN entries there were before. 0, or -ENOSPC / -EBUSY (counted). */
static int occ_take(struct nat_table *t, uint64_t add, uint32_t *ho_out)
{
	uint64_t n = atomic_load_explicit(&t->occ, memory_order_relaxed);

	do {
		if ((add & OCC_LIVE) && (uint32_t)n >= t->cfg.max_entries) {
			ctr_add_shared(&t->ctr.budget_exhausted, 1);
			return -ENOSPC;
		}
		if ((uint32_t)(n >> 32) >= t->cfg.half_open_max) {
			ctr_add_shared(&t->ctr.half_open_full, 1);
			return -EBUSY;
		}
	} while (!atomic_compare_exchange_weak_explicit(&t->occ, &n, n + add, memory_order_relaxed,
							memory_order_relaxed));
	*ho_out = (uint32_t)(n >> 32);
	return 0;
}

static inline void occ_put(struct nat_table *t, uint64_t sub)
{
	atomic_fetch_sub_explicit(&t->occ, sub, memory_order_relaxed);
}

/* The source prefix of a key at a level (host: IPv4 /32, IPv6 /64; network: /24, /48): the
 * first 8 bytes of the source, masked (t->pmask). */
static uint64_t src_prefix(const struct nat_table *t, const uint8_t *key, int level)
{
	uint64_t w;

	memcpy(&w, key + offsetof(struct flow_key, src), sizeof(w));
	return w & t->pmask[key[offsetof(struct flow_key, family)] == 6][level];
}

/* The counters of key's prefix at level, one per row. */
static void src_slots(const struct nat_table *t, const uint8_t *key, int level,
		      _Atomic uint32_t *out[SRC_ROWS])
{
	const struct sketch *sk = &t->src[level];
	uint64_t p = src_prefix(t, key, level), fam = key[offsetof(struct flow_key, family)];

	for (int r = 0; r < SRC_ROWS; r++) {
		uint64_t h = mum(p ^ t->sk[level * SRC_ROWS + r], fam ^ t->sk[SRC_LEVELS * SRC_ROWS]);

		out[r] = &sk->c[(size_t)r * (sk->mask + 1) + ((uint32_t)h & sk->mask)];
	}
}

static void src_add(struct nat_table *t, const uint8_t *key, int levels, int32_t d)
{
	for (int l = 0; l < levels; l++) {
		_Atomic uint32_t *c[SRC_ROWS];

		src_slots(t, key, l, c);
		for (int r = 0; r < SRC_ROWS; r++)
			atomic_fetch_add_explicit(c[r], (uint32_t)d, memory_order_relaxed);
	}
}

/* Count a new HALF_OPEN entry of key's source host and network, if both are under their
 * limits: 0, or -EBUSY (counted by the level that refused; nothing taken). */
__attribute__((noinline, cold)) static int src_take(struct nat_table *t,
						     const struct flow_key *key)
{
	static const size_t reason[SRC_LEVELS] = { offsetof(struct nat_counters, half_open_host),
						   offsetof(struct nat_counters, half_open_net) };
	const uint8_t *kb = (const uint8_t *)key;

	for (int l = 0; l < SRC_LEVELS; l++) {
		_Atomic uint32_t *c[SRC_ROWS];
		uint32_t least = UINT32_MAX;

		src_slots(t, kb, l, c);
		for (int r = 0; r < SRC_ROWS; r++) {
			uint32_t old = atomic_fetch_add_explicit(c[r], 1, memory_order_relaxed);

			least = old < least ? old : least;
		}
		if (least >= t->src[l].limit) {
			src_add(t, kb, l + 1, -1);
			ctr_add_shared((ctr_t *)((char *)&t->ctr + reason[l]), 1);
			return -EBUSY;
		}
	}
	return 0;
}

/* An entry leaves HALF_OPEN (accepted, replaced or removed): uncount its source. */
__attribute__((noinline, cold)) static void src_put(struct nat_table *t, const void *key)
{
	src_add(t, key, SRC_LEVELS, -1);
}

__attribute__((noinline)) static int share_take_slow(struct nat_table *t,
						      const struct flow_key *key, uint64_t add)
{
	uint32_t ho;
	int ret = occ_take(t, add, &ho);

	if (ret != 0 || ho < t->cfg.half_open_quiet)
		return ret;
	if ((ret = src_take(t, key)) != 0) {
		occ_put(t, add);
		return ret;
	}
	return 1;
}

/* Take the HALF_OPEN share (and with OCC_LIVE in add, the entry budget) for key: 0, 1 (taken,
 * and key's source counted: the entry's acct), or -ENOSPC / -EBUSY (counted, nothing taken).
 * Per-source counting starts at half_open_quiet entries: below that no source can hold many,
 * and the common case costs no shared counter per source. That case is inline: room in the
 * budget and fewer than ho_fast HALF_OPEN entries, one comparison more than the budget alone. */
HOT int share_take(struct nat_table *t, const struct flow_key *key, uint64_t add)
{
	uint64_t n = atomic_load_explicit(&t->occ, memory_order_relaxed);

	do {
		if (((add & OCC_LIVE) && (uint32_t)n >= t->cfg.max_entries) ||
		    (uint32_t)(n >> 32) >= t->ho_fast)
			return share_take_slow(t, key, add);
	} while (!atomic_compare_exchange_weak_explicit(&t->occ, &n, n + add, memory_order_relaxed,
							memory_order_relaxed));
	return 0;
}

HOT void share_put(struct nat_table *t, const void *key, uint64_t sub, uint8_t acct)
{
	occ_put(t, sub);
	if (__builtin_expect(acct, 0))
		src_put(t, key);
}

/* ---- tuple space ------------------------------------------------------------------------- */

/* Index order: listener fastest, then address, then port (accept queues stay balanced). */
HOT uint64_t tuple_from_index(const struct nat_table *t, int fam, uint32_t i)
{
	uint32_t j = fastdiv(&t->div_l, i);
	uint32_t k = fastdiv(&t->div_a, j);
	struct nat_tuple tp = {
		.family = fam ? 6 : 4,
		.listener = (uint8_t)(i - j * t->div_l.d),
		.addr = (uint8_t)(j - k * t->div_a.d),
		.port = (uint16_t)(t->cfg.port_min + k),
	};

	return tuple_pack(&tp);
}

static inline uint32_t index_of(const struct nat_table *t, uint64_t tkey)
{
	struct nat_tuple tp;

	tuple_unpack(tkey, &tp);
	return ((uint32_t)(tp.port - t->cfg.port_min) * t->div_a.d + tp.addr) * t->div_l.d +
	       tp.listener;
}

static inline int fam_of(uint64_t tkey)
{
	return (uint8_t)tkey == 6;
}

/* Claim tuple i for an entry of forward shard fs. acq_rel pairs with the release's clear, so
 * the previous owner's unlink from the reverse map happens before our insert. The plain load
 * skips busy tuples without a locked instruction. */
static inline bool tuple_claim(_Atomic uint8_t *owner, uint32_t i, uint32_t fs)
{
	uint8_t free_ = 0;

	if (atomic_load_explicit(&owner[i], memory_order_relaxed))
		return false;
	return atomic_compare_exchange_strong_explicit(&owner[i], &free_, (uint8_t)(OWNED | fs),
						       memory_order_acq_rel, memory_order_relaxed);
}

/* Tuples claimed now, of both families: entries reserved against the budget plus tuples at
 * rest. An over-estimate for one family, which only grows its window sooner. */
static inline uint64_t tuples_busy(const struct nat_table *t)
{
	return (uint32_t)atomic_load_explicit(&t->occ, memory_order_relaxed) +
	       atomic_load_explicit(&t->q_count, memory_order_relaxed);
}

/* Double fam's window (the whole space once that is no smaller); returns the mask in force.
 * Racing growers: one CAS wins, the others see its value. The window never shrinks.
 *
 * The whole space is walked as cursor mod space, a mapping unrelated to the window's: the
 * cursor's count, which has lapped the window many times, could name any tuple, the middle
 * of a block busier than the probe limit is long included. So the winner of the last
 * doubling puts the cursor on the first tuple past the window, which no window ever held. */
__attribute__((noinline)) static uint32_t window_grow(struct nat_table *t, int fam, uint32_t mask)
{
	uint32_t next = mask << 1 | 1;

	if (next >= t->space - 1)
		next = 0;
	if (atomic_compare_exchange_strong_explicit(&t->wmask[fam], &mask, next,
						    memory_order_relaxed, memory_order_relaxed)) {
		ctr_add_shared(&t->ctr.window_grown, 1);
		if (!next) {
			uint32_t past = t->wbase[fam] + mask + 1; /* < 2 * space */

			past -= past >= t->space ? t->space : 0;
			atomic_store_explicit(&t->cursor[fam], past, memory_order_relaxed);
		}
	} else {
		next = mask; /* another thread moved it first */
	}
	return next;
}

/* Grow fam's window while more than half of it could be busy. */
__attribute__((noinline)) static uint32_t window_fit(struct nat_table *t, int fam, uint32_t mask)
{
	while (mask && tuples_busy(t) * 2 > (uint64_t)mask + 1)
		mask = window_grow(t, fam, mask);
	return mask;
}

/* A run of NAT_WINDOW_RUN busy tuples (a block of long-held connections, claimed one after
 * the other): double the window and move the cursor to the start of the half just added,
 * which no claim has touched: the next probe finds a free tuple, and so does every one until
 * the cursor has walked that half. A racing fetch_add lost by the store costs nothing (the
 * cursor's value is a place to look, not a count). */
__attribute__((noinline)) static uint32_t window_escape(struct nat_table *t, int fam,
							 uint32_t mask)
{
	uint32_t next = window_grow(t, fam, mask);

	if (next) {
		uint32_t c = atomic_load_explicit(&t->cursor[fam], memory_order_relaxed);

		atomic_store_explicit(&t->cursor[fam], ((c | next) + 1) | (mask + 1),
				      memory_order_relaxed);
	}
	return next;
}

/* A run of NAT_WHOLE_RUN busy tuples once the window is the whole space: the cursor jumps
 * ahead by about 0.618 of the space (the golden ratio: the places of successive jumps spread
 * evenly over the space, however many there were), so that an attempt looks at up to
 * probe_max / NAT_WHOLE_RUN places across the space. Walking on in order would spend the whole
 * probe limit inside a block of held tuples longer than it (one claimed in order, such as the
 * last window, full past half when it grew into the whole space) and refuse connections with
 * much of the space free, once a lap for as long as the block is held. */
__attribute__((noinline)) static void whole_escape(struct nat_table *t, int fam)
{
	atomic_fetch_add_explicit(&t->cursor[fam], t->stride, memory_order_relaxed);
}

/* At most probe_max probes from the shared cursor; every probe advances it.
 *
 * The cursor walks a window of NAT_WINDOW_MIN tuples from a random start in the space, and the
 * window doubles when more than half of it could be busy (tuples_busy, looked at every
 * NAT_WINDOW_CHECK steps of the cursor) or when NAT_WINDOW_RUN probes in a row find busy
 * tuples, until it is the whole space (where a run of NAT_WHOLE_RUN makes the cursor jump
 * instead: whole_escape); it never shrinks. A shorter block of held tuples costs
 * its length in probes once a lap, less than a doubling would cost in memory. Walking the
 * window in order still gives every tuple the longest rest the window allows before its reuse;
 * but the owner map is touched only as far as the demand has ever reached, where a walk over
 * the whole space would fault in all of it (a byte per tuple, 504 KiB per family with the
 * defaults) page by page over hours of light use. */
HOT int tuple_alloc(struct nat_table *t, int fam, uint32_t fs, uint64_t *tkey_out)
{
	uint32_t mask = atomic_load_explicit(&t->wmask[fam], memory_order_relaxed);

	for (uint32_t n = 0; n < t->probe_max; n++) {
		uint32_t c = atomic_fetch_add_explicit(&t->cursor[fam], 1, memory_order_relaxed);
		uint32_t i;

		if (mask && __builtin_expect(c % NAT_WINDOW_CHECK == 0, 0))
			mask = window_fit(t, fam, mask);
		if (mask) {
			i = t->wbase[fam] + (c & mask);
			i -= i >= t->space ? t->space : 0;
		} else {
			i = fastmod(&t->div_n, c);
		}
		if (tuple_claim(t->owner[fam], i, fs)) {
			*tkey_out = tuple_from_index(t, fam, i);
			return 0;
		}
		if (mask && (n + 1) % NAT_WINDOW_RUN == 0)
			mask = window_escape(t, fam, mask);
		else if (!mask && (n + 1) % NAT_WHOLE_RUN == 0)
			whole_escape(t, fam);
	}
	ctr_add_shared(&t->ctr.ports_exhausted, 1);
	return -EADDRNOTAVAIL;
}

/* ---- quarantine (FIFO ring under qlock) -------------------------------------------------- */

/* Copy the ring into cap records (a power of two >= q_len), oldest first at index 0. Returns
 * the change of the table's bytes, or 0 with the ring as it was (no memory). */
int64_t nat_ring_resize(struct nat_table *t, uint32_t cap)
{
	struct qrec *r = malloc((size_t)cap * sizeof(*r));
	int64_t d;

	if (!r)
		return 0;
	for (uint32_t i = 0; i < t->q_len; i++)
		r[i] = t->ring[(t->q_head + i) & t->q_mask];
	d = ((int64_t)cap - (int64_t)t->q_mask - 1) * (int64_t)sizeof(*r);
	bytes_add(t, d);
	free(t->ring);
	t->ring = r;
	t->q_head = 0;
	t->q_mask = cap - 1;
	return d;
}

static int ring_grow(struct nat_table *t)
{
	uint32_t cap = (t->q_mask + 1) * 2;

	return cap != 0 && nat_ring_resize(t, cap) != 0 ? 0 : -ENOMEM;
}

/* The n tuples rest until now + quarantine_ns (rounded up to a tick), in one lock hold, their
 * owner bytes marked RESTING. If the ring cannot grow, a tuple stays claimed for good: lost to
 * the space, never reused too early. */
static void quarantine_push(struct nat_table *t, const uint64_t *tkeys, size_t n, int64_t now_ns)
{
	uint64_t due = now_tick(sat_add(sat_add(now_ns, t->cfg.quarantine_ns),
					NAT_QUARANTINE_TICK_NS - 1));

	size_t i;

	pthread_mutex_lock(&t->qlock);
	for (i = 0; i < n; i++) {
		if (t->q_len > t->q_mask && ring_grow(t) != 0)
			break;
		uint32_t idx = index_of(t, tkeys[i]);
		int fam = fam_of(tkeys[i]);

		t->ring[(t->q_head + t->q_len++) & t->q_mask] = (struct qrec){
			.due = due,
			.slot = idx | (uint32_t)fam << 31,
		};
		/* A claimed byte is written only under qlock (a claim writes a zero one). */
		atomic_store_explicit(&t->owner[fam][idx],
				      atomic_load_explicit(&t->owner[fam][idx], memory_order_relaxed) |
					      RESTING,
				      memory_order_relaxed);
	}
	q_publish(t);
	pthread_mutex_unlock(&t->qlock);
	/* Only what went in: quarantine = quarantined - released - quarantine_reuse holds. */
	ctr_add_shared(&t->ctr.quarantined, i);
}

static size_t release_locked(struct nat_table *t, uint64_t tick, size_t max);

/* Release up to max tuples whose rest is over, oldest first. The lock-free pre-check keeps the
 * common "nothing due" case off the lock. */
HOT size_t quarantine_release(struct nat_table *t, int64_t now_ns, size_t max)
{
	uint64_t tick = now_tick(now_ns);
	uint64_t head = atomic_load_explicit(&t->q_head_due, memory_order_relaxed);

	if (max == 0 || !tick_due(tick, head))
		return 0;
	return release_locked(t, tick, max);
}

/* The RESTING mark is set and cleared only under qlock, and a claim needs a zero byte. So a
 * record whose tuple is not RESTING means the tuple was freed and picked again while this
 * record still held it in quarantine; its byte belongs to that new claim and is left alone. */
__attribute__((noinline)) static size_t release_locked(struct nat_table *t, uint64_t tick,
						       size_t max)
{
	size_t n = 0, reused = 0;

	pthread_mutex_lock(&t->qlock);
	while (n < max && t->q_len && tick_due(tick, t->ring[t->q_head].due)) {
		struct qrec r = t->ring[t->q_head];
		_Atomic uint8_t *own = &t->owner[r.slot >> 31][r.slot & 0x7fffffffu];

		if (atomic_load_explicit(own, memory_order_relaxed) & RESTING)
			atomic_store_explicit(own, 0, memory_order_release);
		else
			reused++;
		t->q_head = (t->q_head + 1) & t->q_mask;
		t->q_len--;
		n++;
	}
	q_publish(t);
	pthread_mutex_unlock(&t->qlock);
	ctr_add_shared(&t->ctr.released, n - reused);
	if (__builtin_expect(reused != 0, 0))
		ctr_add_shared(&t->ctr.quarantine_reuse, reused);
	return n;
}

/* ---- uplink ------------------------------------------------------------------------------ */

static inline struct rev_shard *rev_shard_of(struct nat_table *t, uint64_t tkey, uint32_t *h)
{
	uint64_t rh = tuple_hash(t, tkey);

	*h = (uint32_t)(rh >> SHARD_BITS);
	return &t->rev[rh & SHARD_MASK];
}

/* Put e (forward shard lock held) into the reverse map of its tuple; with first, also into the
 * forward map, so both memberships start inside one two-lock critical section. */
HOT void link_entry(struct nat_table *t, struct fwd_shard *sh, struct nat_entry *e, bool first)
{
	uint32_t rh;
	struct rev_shard *rs = rev_shard_of(t, e->tkey, &rh);

	pthread_mutex_lock(&rs->lock);
	if (first)
		map_insert(t, &sh->map, e, e->fhash, false);
	map_insert(t, &rs->map, e, rh, true);
	pthread_mutex_unlock(&rs->lock);
}

/* A new HALF_OPEN mapping for key (forward shard lock held, key absent). */
static int entry_create(struct nat_table *t, struct fwd_shard *sh, const struct flow_key *key,
			uint64_t h, int64_t now_ns, struct nat_tuple *out)
{
	struct nat_entry *e;
	uint64_t tkey;
	uint8_t acct;
	int ret;

	if ((ret = share_take(t, key, OCC_LIVE | OCC_HO)) < 0)
		return ret;
	acct = (uint8_t)ret;
	if ((e = entry_get(t, sh)) == NULL) {
		ret = -ENOMEM;
		goto undo_budget;
	}
	quarantine_release(t, now_ns, NAT_RELEASE_PER_ALLOC);
	if ((ret = tuple_alloc(t, key->family == 6, (uint32_t)(h & SHARD_MASK), &tkey)) != 0)
		goto undo_entry;
	memcpy(e->kw, key, sizeof(e->kw));
	e->fhash = (uint32_t)(h >> SHARD_BITS);
	e->fshard = (uint8_t)(h & SHARD_MASK);
	e->tkey = tkey;
	e->gen = gen_next(t);
	e->state = NAT_HALF_OPEN;
	e->acct = acct;
	e->heap_idx = NO_HEAP;
	atomic_store_explicit(&e->last_seen, now_ns, memory_order_relaxed);
	link_entry(t, sh, e, true);
	state_add(sh, NAT_HALF_OPEN, 1);
	heap_push(sh, e, expires(t, e));
	ctr_add_shared(&t->ctr.created, 1);
	tuple_unpack(tkey, out);
	return 0;

undo_entry:
	entry_put(sh, e);
undo_budget:
	share_put(t, key, OCC_LIVE | OCC_HO, acct);
	return ret;
}

/* Pure SYN on a CLOSING mapping (forward shard lock held): the entry moves to a new tuple as a
 * new HALF_OPEN mapping; the old tuple is quarantined. The new tuple is claimed while the old
 * bit is still set, so it is necessarily DIFFERENT; if none is free, nothing changes. */
static int entry_replace(struct nat_table *t, struct fwd_shard *sh, struct nat_entry *e,
			 const struct flow_key *key, int64_t now_ns, struct nat_tuple *out)
{
	uint64_t old = e->tkey, tkey;
	struct rev_shard *rs;
	uint32_t rh;
	uint8_t acct;
	int ret;

	/* A new HALF_OPEN mapping: it takes the share (not the budget, the entry exists). */
	if ((ret = share_take(t, key, OCC_HO)) < 0)
		return ret;
	acct = (uint8_t)ret;
	quarantine_release(t, now_ns, NAT_RELEASE_PER_ALLOC);
	if ((ret = tuple_alloc(t, fam_of(old), e->fshard, &tkey)) != 0) {
		share_put(t, key, OCC_HO, acct);
		return ret;
	}
	rs = rev_shard_of(t, old, &rh);
	pthread_mutex_lock(&rs->lock);
	map_unlink(&rs->map, e, rh, true);
	/* Unreachable by tuple from here until link_entry: no reverse holder can see it. */
	e->tkey = tkey;
	e->gen = gen_next(t);
	e->state = NAT_HALF_OPEN;
	e->acct = acct;
	pthread_mutex_unlock(&rs->lock);
	atomic_store_explicit(&e->last_seen, now_ns, memory_order_relaxed);
	link_entry(t, sh, e, false);
	state_add(sh, NAT_CLOSING, -1);
	state_add(sh, NAT_HALF_OPEN, 1);
	heap_arm(sh, e, expires(t, e));
	quarantine_push(t, &old, 1, now_ns);
	ctr_add_shared(&t->ctr.replaced, 1);
	ctr_add_shared(&t->ctr.created, 1);
	tuple_unpack(tkey, out);
	return 0;
}

/* The uplink cases other than a hit (forward shard lock held): replace, create or refuse.
 * Out of line, so the per-packet lookup in nat_uplink stays small. */
__attribute__((noinline)) static int uplink_slow(struct nat_table *t, struct fwd_shard *sh,
						 struct nat_entry *e, const struct flow_key *key,
						 uint64_t h, bool pure_syn, int64_t now_ns,
						 struct nat_tuple *out)
{
	if (e)
		return entry_replace(t, sh, e, key, now_ns, out);
	if (pure_syn)
		return entry_create(t, sh, key, h, now_ns, out);
	ctr_add_shared(&t->ctr.uplink_miss, 1);
	return -ENOENT;
}

int nat_uplink(struct nat_table *t, const struct flow_key *key, bool pure_syn, int64_t now_ns,
	       struct nat_tuple *tuple_out)
{
	struct fwd_shard *sh;
	struct nat_entry *e;
	uint64_t h;
	int ret = 0;

	if (key->family != 4 && key->family != 6)
		return -EINVAL;
	h = key_hash(t, key);
	sh = &t->fwd[h & SHARD_MASK];
	pthread_mutex_lock(&sh->lock);
	e = fwd_find(&sh->map, key, (uint32_t)(h >> SHARD_BITS));
	/* The per-packet case: a mapping that is not being replaced by a new SYN. */
	if (__builtin_expect(e && !(pure_syn && e->state == NAT_CLOSING), 1)) {
		if (e->state != NAT_HALF_OPEN) /* its deadline is fixed by its SYN */
			touch(e, now_ns);
		tuple_unpack(e->tkey, tuple_out);
	} else {
		ret = uplink_slow(t, sh, e, key, h, pure_syn, now_ns, tuple_out);
	}
	pthread_mutex_unlock(&sh->lock);
	return ret;
}

int nat_uplink_rst(struct nat_table *t, const struct flow_key *key, int64_t now_ns)
{
	struct fwd_shard *sh;
	struct nat_entry *e;
	uint64_t h;
	int64_t due;
	int ret = 0;

	if (key->family != 4 && key->family != 6)
		return 0;
	h = key_hash(t, key);
	sh = &t->fwd[h & SHARD_MASK];
	due = sat_add(now_ns, NAT_RST_LINGER_NS);
	pthread_mutex_lock(&sh->lock);
	e = fwd_find(&sh->map, key, (uint32_t)(h >> SHARD_BITS));
	/* The state is HALF_OPEN under the forward lock: an accept needs it too. No packet
	 * moves a HALF_OPEN entry's last_seen (touch is skipped for it), so it is set back here
	 * to make its real deadline due, and its heap node follows (at most its deadline). */
	if (e && e->state == NAT_HALF_OPEN && due < expires(t, e)) {
		atomic_store_explicit(&e->last_seen, due - t->timeout[NAT_HALF_OPEN],
				      memory_order_relaxed);
		heap_arm(sh, e, due);
		heap_publish(sh);
		ctr_add_shared(&t->ctr.half_open_reset, 1);
		ret = 1;
	}
	pthread_mutex_unlock(&sh->lock);
	return ret;
}

/* ---- operations starting from a tuple ----------------------------------------------------- */

int nat_downlink(struct nat_table *t, const struct nat_tuple *tuple, int64_t now_ns,
		 struct flow_key *key_out)
{
	uint64_t tkey = tuple_pack(tuple);
	uint32_t rh;
	struct rev_shard *rs = rev_shard_of(t, tkey, &rh);
	struct nat_entry *e;

	pthread_mutex_lock(&rs->lock);
	e = rev_find(&rs->map, tkey, rh);
	if (e) {
		/* Not a HALF_OPEN entry: the kernel's SYN-ACK retransmits would keep a spoofed SYN's
		 * entry for twice half_open_timeout. (The state is read under the reverse lock.) */
		if (e->state != NAT_HALF_OPEN)
			touch(e, now_ns);
		memcpy(key_out, e->kw, sizeof(*key_out));
	}
	pthread_mutex_unlock(&rs->lock);
	if (!e) {
		ctr_add_shared(&t->ctr.downlink_miss, 1);
		return -ENOENT;
	}
	return 0;
}

static inline bool tuple_valid(const struct nat_table *t, const struct nat_tuple *tp)
{
	uint32_t span = (uint32_t)(t->cfg.port_max - t->cfg.port_min);

	return (tp->family == 4 || tp->family == 6) && tp->addr < t->cfg.n_addrs &&
	       tp->listener < t->cfg.n_listeners && (uint32_t)(tp->port - t->cfg.port_min) <= span;
}

/* Find tuple's entry and lock its forward, then its reverse shard. The first guess of the
 * forward shard is the tuple's owner byte (lock-free); if the entry found under the reverse lock
 * belongs to another forward shard (the tuple changed hands since), its fshard, read under the
 * reverse lock, is the next guess: the documented two-step, never taking locks out of order.
 * Returns the entry with both locks held, or NULL with none held (unmapped; or, after several
 * hand-overs in a row, which needs that many quarantine windows, treated as gone). */
__attribute__((always_inline)) static inline struct nat_entry *
lock_tuple(struct nat_table *t, const struct nat_tuple *tuple, struct fwd_shard **sh_out,
	   struct rev_shard **rs_out)
{
	uint64_t tkey = tuple_pack(tuple);
	uint32_t rh, fs;
	struct rev_shard *rs;
	uint8_t own;

	if (!tuple_valid(t, tuple))
		return NULL;
	own = atomic_load_explicit(&t->owner[fam_of(tkey)][index_of(t, tkey)],
				   memory_order_acquire);
	if (!(own & OWNED))
		return NULL; /* free: claimed before it is mapped, cleared after it is unmapped */
	fs = own & SHARD_MASK;
	rs = rev_shard_of(t, tkey, &rh);
	for (int tries = 0; tries < 4; tries++) {
		struct fwd_shard *sh = &t->fwd[fs];
		struct nat_entry *e;

		uint32_t next;

		pthread_mutex_lock(&sh->lock);
		pthread_mutex_lock(&rs->lock);
		e = rev_find(&rs->map, tkey, rh);
		if (e && e->fshard == fs) {
			*sh_out = sh;
			*rs_out = rs;
			return e;
		}
		/* Read under the reverse lock (after it, the entry may be purged and its memory
		 * trimmed): valid as a guess after it. */
		next = e ? e->fshard : 0;
		pthread_mutex_unlock(&rs->lock);
		pthread_mutex_unlock(&sh->lock);
		if (!e)
			return NULL;
		fs = next;
	}
	return NULL;
}

int nat_accept(struct nat_table *t, const struct nat_tuple *tuple, int64_t now_ns,
	       struct flow_key *key_out, uint64_t *gen_out)
{
	struct fwd_shard *sh;
	struct rev_shard *rs;
	struct nat_entry *e = lock_tuple(t, tuple, &sh, &rs);
	bool ok = e && e->state == NAT_HALF_OPEN;
	uint8_t acct = 0;

	if (ok) {
		e->state = NAT_ACTIVE;
		e->gen = gen_next(t);
		*gen_out = e->gen;
		memcpy(key_out, e->kw, sizeof(*key_out));
		acct = e->acct;
		e->acct = 0;
	}
	if (e)
		pthread_mutex_unlock(&rs->lock);
	/* A collected candidate is out of the heap already; its phase 2 will see the new gen. */
	if (ok && e->heap_idx != NO_HEAP)
		heap_remove(sh, e);
	if (ok) {
		state_add(sh, NAT_HALF_OPEN, -1);
		state_add(sh, NAT_ACTIVE, 1);
	}
	if (e)
		pthread_mutex_unlock(&sh->lock);
	if (ok)
		share_put(t, key_out, OCC_HO, acct);
	ctr_add_shared(ok ? &t->ctr.accepted : &t->ctr.accept_miss, 1);
	return ok ? 0 : -ENOENT;
}

/* Judge a mark_closing request (both locks held): 0 already CLOSING (idempotent), 1 must
 * transition, -ESTALE generation mismatch (or not accepted yet). */
static int closing_verdict(const struct nat_entry *e, uint64_t gen)
{
	if (e->gen != gen || e->state == NAT_HALF_OPEN)
		return -ESTALE;
	return e->state == NAT_ACTIVE;
}

int nat_mark_closing(struct nat_table *t, const struct nat_tuple *tuple, uint64_t gen,
		     int64_t now_ns)
{
	struct fwd_shard *sh;
	struct rev_shard *rs;
	struct nat_entry *e = lock_tuple(t, tuple, &sh, &rs);
	int v;

	if (!e)
		return -ENOENT;
	if ((v = closing_verdict(e, gen)) == 1)
		e->state = NAT_CLOSING;
	pthread_mutex_unlock(&rs->lock);
	if (v == 1) {
		/* The mark counts as activity: the kernel sends its FIN right after the session
		 * closes the socket, however long the flow was idle before. */
		touch(e, now_ns);
		assert(e->heap_idx == NO_HEAP); /* ACTIVE entries are never in the heap */
		heap_push(sh, e, expires(t, e));
		state_add(sh, NAT_ACTIVE, -1);
		state_add(sh, NAT_CLOSING, 1);
	}
	pthread_mutex_unlock(&sh->lock);
	if (v == 1)
		ctr_add_shared(&t->ctr.closed, 1);
	else if (v == -ESTALE)
		ctr_add_shared(&t->ctr.gen_mismatch, 1);
	return v == 1 ? 0 : v;
}

/* ---- cleanup: two phases, bounded by the caller's budget ---------------------------------- */

/* Phase 1 over the shards, from a rotating start so one busy shard cannot starve the others.
 * Examines at most max heap heads: a head whose real deadline moved on (packets since it was
 * armed) is re-armed in place; an expired one leaves the heap as a candidate. */
static size_t collect(struct nat_table *t, int64_t now_ns, struct nat_candidate *out,
		      size_t max, size_t *examined)
{
	uint32_t start = atomic_fetch_add_explicit(&t->purge_cursor, 1, memory_order_relaxed);
	size_t n = 0, work = 0;

	for (uint32_t i = 0; i < NAT_SHARDS && work < max; i++) {
		uint32_t s = (start + i) & SHARD_MASK;
		struct fwd_shard *sh = &t->fwd[s];

		if (atomic_load_explicit(&sh->next_deadline, memory_order_relaxed) > now_ns)
			continue;
		pthread_mutex_lock(&sh->lock);
		while (work < max && sh->heap_len && sh->heap[0].deadline <= now_ns) {
			struct nat_entry *e = sh->heap[0].e;
			int64_t real = expires(t, e);

			work++;
			if (real > now_ns) {
				sift_down(sh, 0, (struct heap_node){ real, e });
				continue;
			}
			heap_delete(sh, e); /* published once, below */
			out[n].gen = e->gen;
			out[n].fwd_shard = s;
			tuple_unpack(e->tkey, &out[n].tuple);
			n++;
		}
		heap_publish(sh);
		pthread_mutex_unlock(&sh->lock);
	}
	*examined = work;
	return n;
}

size_t nat_collect_expired(struct nat_table *t, int64_t now_ns, struct nat_candidate *out,
			   size_t max)
{
	size_t examined;

	return collect(t, now_ns, out, max, &examined);
}

/* What an entry of each state holds of t->occ. */
static const uint64_t occ_of_state[NAT_STATE_MAX] = {
	[NAT_HALF_OPEN] = OCC_LIVE | OCC_HO,
	[NAT_ACTIVE] = OCC_LIVE,
	[NAT_CLOSING] = OCC_LIVE,
};

/* Phase 2 for one candidate, forward shard lock held. Returns 0 (unlinked and back in the
 * slab: the caller quarantines the tuple and returns *occ_sub, to which the entry's budget and
 * share were added), -EAGAIN (refreshed: re-armed) or -ENOENT (gone, accepted or replaced since
 * phase 1). */
HOT int remove_locked(struct nat_table *t, struct fwd_shard *sh, const struct nat_candidate *c,
		      int64_t now_ns, uint64_t *occ_sub)
{
	uint64_t tkey = tuple_pack(&c->tuple);
	uint32_t rh;
	struct rev_shard *rs = rev_shard_of(t, tkey, &rh);
	struct nat_entry *e;
	int64_t deadline;
	int ret = -ENOENT;

	pthread_mutex_lock(&rs->lock);
	e = rev_find(&rs->map, tkey, rh);
	/* Same gen => same entry => this forward shard, unless the candidate was made up. */
	if (!e || e->gen != c->gen || e->fshard != c->fwd_shard)
		goto unlock;
	if ((deadline = expires(t, e)) > now_ns) {
		/* Refreshed since phase 1: keep it and put it back in the heap. */
		if (e->heap_idx == NO_HEAP && deadline != INT64_MAX)
			heap_push(sh, e, deadline);
		ret = -EAGAIN;
		goto unlock;
	}
	map_unlink(&rs->map, e, rh, true);
	map_unlink(&sh->map, e, e->fhash, false);
	if (e->heap_idx != NO_HEAP)
		heap_remove(sh, e);
	state_add(sh, e->state, -1);
	*occ_sub += occ_of_state[e->state];
	ret = 0;
unlock:
	pthread_mutex_unlock(&rs->lock);
	if (ret == 0) {
		if (__builtin_expect(e->acct, 0))
			src_put(t, e->kw);
		entry_put(sh, e);
	}
	return ret;
}

/* Bookkeeping after n entries were removed: their tuples rest, their budget and share
 * (occ_sub) return. */
static void removed(struct nat_table *t, const uint64_t *tkeys, size_t n, uint64_t occ_sub,
		    int64_t now_ns)
{
	if (n == 0)
		return;
	quarantine_push(t, tkeys, n, now_ns);
	occ_put(t, occ_sub);
	ctr_add_shared(&t->ctr.expired, n);
}

int nat_remove_if_expired(struct nat_table *t, const struct nat_candidate *c, int64_t now_ns)
{
	struct fwd_shard *sh;
	uint64_t tkey = tuple_pack(&c->tuple), occ_sub = 0;
	int ret;

	if (c->fwd_shard >= NAT_SHARDS)
		return -EINVAL;
	sh = &t->fwd[c->fwd_shard];
	pthread_mutex_lock(&sh->lock);
	ret = remove_locked(t, sh, c, now_ns, &occ_sub);
	pthread_mutex_unlock(&sh->lock);
	if (ret == -EAGAIN)
		ctr_add_shared(&t->ctr.expiry_saved, 1);
	removed(t, &tkey, ret == 0, occ_sub, now_ns);
	return ret;
}

/* Phase 2 for a batch from collect, which returns candidates grouped by forward shard: each
 * group is handled under one hold of its shard lock, and the freed tuples enter the quarantine
 * in one hold of its lock. Same per-candidate semantics as nat_remove_if_expired. */
static size_t remove_batch(struct nat_table *t, const struct nat_candidate *c, size_t n,
			   int64_t now_ns)
{
	uint64_t freed[PURGE_BATCH], occ_sub = 0;
	size_t nf = 0, saved = 0;

	assert(n <= PURGE_BATCH);
	for (size_t i = 0; i < n;) {
		uint32_t s = c[i].fwd_shard;
		struct fwd_shard *sh = &t->fwd[s];

		pthread_mutex_lock(&sh->lock);
		for (; i < n && c[i].fwd_shard == s; i++) {
			int ret = remove_locked(t, sh, &c[i], now_ns, &occ_sub);

			if (ret == 0)
				freed[nf++] = tuple_pack(&c[i].tuple);
			saved += ret == -EAGAIN;
		}
		pthread_mutex_unlock(&sh->lock);
	}
	if (saved)
		ctr_add_shared(&t->ctr.expiry_saved, saved);
	removed(t, freed, nf, occ_sub, now_ns);
	return nf;
}

size_t nat_purge(struct nat_table *t, int64_t now_ns, size_t budget)
{
	struct nat_candidate c[PURGE_BATCH];
	size_t n_removed = 0, left = budget, released = 0;

	while (left > 0) {
		size_t examined, n;

		n = collect(t, now_ns, c, left < PURGE_BATCH ? left : PURGE_BATCH, &examined);
		if (examined == 0)
			break;
		left -= examined;
		n_removed += remove_batch(t, c, n, now_ns);
	}
	/* After phase 2, so that with a zero quarantine the tuples just freed are free again. */
	while (released < budget) {
		size_t want = budget - released < RELEASE_BATCH ? budget - released : RELEASE_BATCH;
		size_t got = quarantine_release(t, now_ns, want);

		released += got;
		if (got < want)
			break;
	}
	return n_removed;
}

int64_t nat_next_deadline(const struct nat_table *t)
{
	uint64_t q = atomic_load_explicit(&((struct nat_table *)t)->q_head_due,
					  memory_order_relaxed);
	/* The quarantine's oldest tuple too: without a purge, a table that sees no new SYN would
	 * keep its resting tuples (and report them) for good. A due tick is < 2^43. */
	int64_t min = q == Q_EMPTY ? INT64_MAX :
		      sat_add((int64_t)(q << Q_TICK_SHIFT), NAT_QUARANTINE_WAKE_NS);

	for (int i = 0; i < NAT_SHARDS; i++) {
		int64_t d = atomic_load_explicit(&((struct nat_table *)t)->fwd[i].next_deadline,
						 memory_order_relaxed);

		if (d < min)
			min = d;
	}
	return min;
}

/* ---- stats and introspection -------------------------------------------------------------- */

void nat_get_stats(const struct nat_table *t, struct nat_stats *out)
{
	struct nat_table *m = (struct nat_table *)t; /* atomics are read, never written */

	memset(out, 0, sizeof(*out));
	for (int i = 0; i < NAT_SHARDS; i++)
		for (int s = 0; s < NAT_STATE_MAX; s++)
			out->entries[s] += atomic_load_explicit(&m->fwd[i].n_state[s],
								memory_order_relaxed);
	out->quarantine = atomic_load_explicit(&m->q_count, memory_order_relaxed);
	out->bytes = atomic_load_explicit(&m->bytes, memory_order_relaxed);
}

const struct nat_counters *nat_get_counters(const struct nat_table *t)
{
	return &t->ctr;
}

int nat_peek(struct nat_table *t, const struct nat_tuple *tuple, enum nat_state *state_out,
	     uint64_t *gen_out)
{
	uint64_t tkey = tuple_pack(tuple);
	uint32_t rh;
	struct rev_shard *rs = rev_shard_of(t, tkey, &rh);
	struct nat_entry *e;

	pthread_mutex_lock(&rs->lock);
	e = rev_find(&rs->map, tkey, rh);
	if (e) {
		*state_out = (enum nat_state)e->state;
		*gen_out = e->gen;
	}
	pthread_mutex_unlock(&rs->lock);
	return e ? 0 : -ENOENT;
}

int nat_tuple_status(struct nat_table *t, const struct nat_tuple *tuple)
{
	uint64_t tkey = tuple_pack(tuple);
	uint32_t rh;
	struct rev_shard *rs;
	struct nat_entry *e;
	uint8_t own;

	if (!tuple_valid(t, tuple))
		return -EINVAL;
	rs = rev_shard_of(t, tkey, &rh);
	pthread_mutex_lock(&rs->lock);
	e = rev_find(&rs->map, tkey, rh);
	own = atomic_load_explicit(&t->owner[fam_of(tkey)][index_of(t, tkey)],
				   memory_order_acquire);
	pthread_mutex_unlock(&rs->lock);
	if (e)
		return NAT_TUPLE_MAPPED;
	return own ? NAT_TUPLE_RESTING : NAT_TUPLE_FREE;
}

bool nat_half_open_pressure(const struct nat_table *t)
{
	uint32_t ho = (uint32_t)(atomic_load_explicit(&t->occ, memory_order_relaxed) >> 32);

	return ho > 0 && ho >= t->cfg.half_open_quiet;
}
