/* nat_mem.c — the NAT table's memory: creation (nat_table_new), freeing, and the trims that
 * give back what a load left behind (nat_trim). The layout is in nat_impl.h, the per-packet
 * operations in nat.c. */
#include "stacks/system/nat.h"
#include "stacks/system/nat_impl.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int map_init(struct nat_table *t, struct map *m)
{
	memset(m->mini, 0, sizeof(m->mini));
	m->b = m->mini;
	m->mask = BUCKETS_MIN - 1;
	m->count = 0;
	bytes_add(t, BUCKETS_MIN * sizeof(*m->b));
	return 0;
}


/* ---- giving memory back ------------------------------------------------------------------ */

/* The smallest power of two >= v and >= floor. */
static uint32_t pow2_at_least(uint32_t v, uint32_t floor)
{
	uint32_t n = floor;

	while (n < v)
		n *= 2;
	return n;
}

/* A map at most an eighth full shrinks to twice its count (at least BUCKETS_MIN), so a table
 * that grows again doubles a few times before it rehashes as often as it did. Returns the
 * bytes given back. */
static size_t map_shrink(struct nat_table *t, struct map *m, bool rev)
{
	uint32_t n = pow2_at_least(m->count * 2, BUCKETS_MIN);

	if ((uint64_t)m->count * 8 > (uint64_t)m->mask + 1 || n >= m->mask + 1)
		return 0;
	return (size_t)-nat_map_resize(t, m, rev, n);
}

static bool in_chunk(const struct chunk *c, const struct nat_entry *e)
{
	return e >= c->e && e < c->e + c->n;
}

/* Free the chunks of sh (lock held) whose every entry is on the free list, and shrink the heap
 * array to the capacity left. Live entries never move: their chunks stay, whole. Returns the
 * bytes given back. */
static size_t slab_trim(struct nat_table *t, struct fwd_shard *sh)
{
	struct chunk **pc, *c;
	struct nat_entry *e, **pe;
	uint32_t freed = 0;
	int64_t bytes = 0;

	if (!sh->free)
		return 0;
	/* One walk of the free list per chunk: a shard has few chunks (sizes double up to
	 * CHUNK_MAX), and this runs once after a load, not per packet. */
	for (c = sh->chunks; c; c = c->next) {
		uint32_t n_free = 0;

		for (e = sh->free; e; e = e->fnext)
			n_free += in_chunk(c, e);
		if (n_free != c->n)
			continue;
		/* Unlink this chunk's entries from the free list, then mark it for freeing. */
		for (pe = &sh->free; *pe;) {
			if (in_chunk(c, *pe))
				*pe = (*pe)->fnext;
			else
				pe = &(*pe)->fnext;
		}
		freed += c->n;
		bytes -= (int64_t)sizeof(*c);
		c->n = 0; /* empty: freed below */
	}
	for (pc = &sh->chunks; (c = *pc);) {
		if (c->n == 0) {
			*pc = c->next;
			free(c);
		} else {
			pc = &c->next;
		}
	}
	if (freed == 0)
		return 0;
	bytes -= (int64_t)freed * (int64_t)(sizeof(struct nat_entry) + sizeof(struct heap_node));
	sh->capacity -= freed;
	assert(sh->heap_len <= sh->capacity);
	if (sh->capacity == 0) {
		free(sh->heap);
		sh->heap = NULL;
	} else {
		struct heap_node *h = realloc(sh->heap, (size_t)sh->capacity * sizeof(*h));

		if (h)
			sh->heap = h; /* else the larger array stays: never less than capacity */
	}
	bytes_add(t, bytes);
	return (size_t)-bytes;
}

/* Under qlock: a ring at most a quarter full shrinks to twice what it holds (at least
 * RING_MIN). Returns the bytes given back. */
static size_t ring_shrink(struct nat_table *t)
{
	uint32_t cap = pow2_at_least(t->q_len * 2, RING_MIN);
	int64_t d;

	if ((uint64_t)t->q_len * 4 > (uint64_t)t->q_mask + 1 || cap >= t->q_mask + 1)
		return 0;
	d = nat_ring_resize(t, cap);
	q_publish(t);
	return (size_t)-d;
}

/* The owner map's resident pages that are all zero, discarded: no claim, mapped or resting,
 * is on them. Pages never touched are skipped (mincore), not read. Only with no other thread
 * on the table (see nat_trim). */
static void owner_trim(struct nat_table *t)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), npages = (t->space + page - 1) / page;
	size_t dropped = 0;
	unsigned char *vec = malloc(npages);

	if (!vec)
		return;
	for (int f = 0; f < 2; f++) {
		uint8_t *m = (uint8_t *)t->owner[f];

		if (mincore(m, t->space, vec) != 0)
			continue;
		for (size_t p = 0; p < npages; p++) {
			size_t off = p * page, len = off + page <= t->space ? page : t->space - off;
			const uint8_t *b = m + off;
			uint8_t any = 0;

			if (!(vec[p] & 1))
				continue;
			for (size_t i = 0; i < len; i++)
				any |= b[i];
			if (any == 0 && madvise(m + off, len, MADV_DONTNEED) == 0)
				dropped++;
		}
	}
	free(vec);
	if (dropped)
		ctr_add_shared(&t->ctr.owner_pages_dropped, dropped);
}

size_t nat_trim(struct nat_table *t, bool exclusive)
{
	size_t freed = 0;

	for (int i = 0; i < NAT_SHARDS; i++) {
		struct fwd_shard *sh = &t->fwd[i];
		struct rev_shard *rs = &t->rev[i];

		pthread_mutex_lock(&sh->lock);
		freed += slab_trim(t, sh);
		freed += map_shrink(t, &sh->map, false);
		pthread_mutex_unlock(&sh->lock);
		pthread_mutex_lock(&rs->lock);
		freed += map_shrink(t, &rs->map, true);
		pthread_mutex_unlock(&rs->lock);
	}
	pthread_mutex_lock(&t->qlock);
	freed += ring_shrink(t);
	pthread_mutex_unlock(&t->qlock);
	if (exclusive)
		owner_trim(t);
	return freed;
}

/* ---- table lifecycle --------------------------------------------------------------------- */

static int config_check(const struct nat_config *c)
{
	if (c->max_entries < 1 || c->n_addrs < 1 || c->n_addrs > NAT_MAX_ADDRS ||
	    c->n_listeners < 1 || c->n_listeners > NAT_MAX_LISTENERS || c->port_min < 1 ||
	    c->port_min > c->port_max || c->half_open_max < 1 || c->half_open_per_host < 1 ||
	    c->half_open_per_net < 1)
		return -EINVAL;
	/* Bounded timeouts keep every deadline and quarantine tick far from wrapping. */
	if (c->half_open_ns <= 0 || c->half_open_ns > NAT_TIMEOUT_MAX_NS || c->linger_ns < 0 ||
	    c->linger_ns > NAT_TIMEOUT_MAX_NS || c->quarantine_ns < 0 ||
	    c->quarantine_ns > NAT_TIMEOUT_MAX_NS)
		return -EINVAL;
	return 0;
}

/* Mutex k of the table: the quarantine lock, then forward/reverse shard locks interleaved. */
static pthread_mutex_t *lock_at(struct nat_table *t, int k)
{
	if (k == 0)
		return &t->qlock;
	k--;
	return k % 2 ? &t->rev[k / 2].lock : &t->fwd[k / 2].lock;
}

/* SKETCH_SPREAD buckets per row for every prefix that can reach the limit within the share
 * (half_open_max / limit of them), so an innocent prefix rarely shares a full bucket. */
static int sketch_init(struct nat_table *t, struct sketch *sk, uint32_t limit)
{
	uint64_t want = (uint64_t)SKETCH_SPREAD * t->cfg.half_open_max / limit;
	uint32_t n = SKETCH_MIN;

	while (n < want && n < SKETCH_MAX)
		n *= 2;
	sk->limit = limit;
	sk->mask = n - 1;
	if ((sk->c = calloc((size_t)n * SRC_ROWS, sizeof(*sk->c))) == NULL)
		return -ENOMEM;
	bytes_add(t, (int64_t)n * SRC_ROWS * (int64_t)sizeof(*sk->c));
	return 0;
}

static int table_alloc(struct nat_table *t)
{
	/* Mapped zeroed, without huge pages: a page of a family's map costs memory only once the
	 * cursor's window reaches it (a family nobody uses, never). */
	for (int f = 0; f < 2; f++) {
		void *m = mmap(NULL, t->space, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			       -1, 0);

		if (m == MAP_FAILED)
			return -ENOMEM;
		(void)madvise(m, t->space, MADV_NOHUGEPAGE);
		t->owner[f] = m;
		bytes_add(t, t->space);
	}
	if ((t->ring = malloc(RING_MIN * sizeof(*t->ring))) == NULL)
		return -ENOMEM;
	t->q_mask = RING_MIN - 1;
	bytes_add(t, RING_MIN * sizeof(*t->ring));
	if (sketch_init(t, &t->src[0], t->cfg.half_open_per_host) != 0 ||
	    sketch_init(t, &t->src[1], t->cfg.half_open_per_net) != 0)
		return -ENOMEM;
	for (int i = 0; i < NAT_SHARDS; i++) {
		atomic_init(&t->fwd[i].next_deadline, INT64_MAX);
		if (map_init(t, &t->fwd[i].map) != 0 || map_init(t, &t->rev[i].map) != 0)
			return -ENOMEM;
	}
	for (; t->n_locks < 1 + 2 * NAT_SHARDS; t->n_locks++)
		if (pthread_mutex_init(lock_at(t, t->n_locks), NULL) != 0)
			return -ENOMEM;
	return 0;
}

int nat_table_new(const struct nat_config *cfg, struct nat_table **out)
{
	size_t size = (sizeof(struct nat_table) + CACHELINE - 1) / CACHELINE * CACHELINE;
	struct nat_table *t;
	uint64_t s;
	int ret;

	*out = NULL;
	if (!cfg || config_check(cfg) != 0)
		return -EINVAL;
	if ((t = aligned_alloc(CACHELINE, size)) == NULL)
		return -ENOMEM;
	memset(t, 0, size);
	t->cfg = *cfg;
	t->timeout[NAT_HALF_OPEN] = cfg->half_open_ns;
	t->timeout[NAT_ACTIVE] = INT64_MAX;
	t->timeout[NAT_CLOSING] = cfg->linger_ns;
	t->ho_fast = cfg->half_open_quiet < cfg->half_open_max ? cfg->half_open_quiet :
								   cfg->half_open_max;
	s = cfg->seed;
	for (int i = 0; i < 8; i++)
		t->hk[i] = splitmix64(&s);
	/* <= 64 * 16 * 65535 < 2^27: fits the qrec slot beside the family bit. */
	t->space = cfg->n_addrs * cfg->n_listeners * (uint32_t)(cfg->port_max - cfg->port_min + 1);
	t->probe_max = t->space < NAT_PROBE_LIMIT ? t->space : NAT_PROBE_LIMIT;
	t->stride = (uint32_t)(((uint64_t)t->space * 40503u) >> 16) | 1u;
	fastdiv_init(&t->div_l, cfg->n_listeners);
	fastdiv_init(&t->div_a, cfg->n_addrs);
	fastdiv_init(&t->div_n, t->space);
	for (int f = 0; f < 2; f++) {
		atomic_init(&t->cursor[f], (uint32_t)splitmix64(&s));
		t->wbase[f] = fastmod(&t->div_n, (uint32_t)splitmix64(&s));
		atomic_init(&t->wmask[f], t->space > NAT_WINDOW_MIN ? NAT_WINDOW_MIN - 1 : 0);
	}
	for (int i = 0; i < SRC_LEVELS * SRC_ROWS + 1; i++)
		t->sk[i] = splitmix64(&s);
	for (int f = 0; f < 2; f++) {
		static const uint8_t len[2][SRC_LEVELS] = { { 4, 3 }, { 8, 6 } };

		for (int l = 0; l < SRC_LEVELS; l++) {
			uint8_t b[8] = { 0 };

			memset(b, 0xff, len[f][l]);
			memcpy(&t->pmask[f][l], b, sizeof(b));
		}
	}
	atomic_init(&t->q_head_due, Q_EMPTY);
	atomic_init(&t->bytes, size);
	if ((ret = table_alloc(t)) != 0) {
		nat_table_free(t);
		return ret;
	}
	*out = t;
	return 0;
}

/* Safe on a partly built table (nat_table_new's failure path): every pointer starts NULL. */
void nat_table_free(struct nat_table *t)
{
	if (!t)
		return;
	for (int k = 0; k < t->n_locks; k++)
		pthread_mutex_destroy(lock_at(t, k));
	for (int i = 0; i < NAT_SHARDS; i++) {
		struct fwd_shard *sh = &t->fwd[i];
		struct chunk *c, *next;

		for (c = sh->chunks; c; c = next) {
			next = c->next;
			free(c);
		}
		free(sh->heap);
		map_free_buckets(&sh->map);
		map_free_buckets(&t->rev[i].map);
	}
	for (int f = 0; f < 2; f++)
		if (t->owner[f])
			munmap((void *)t->owner[f], t->space);
	free(t->src[0].c);
	free(t->src[1].c);
	free(t->ring);
	free(t);
}
