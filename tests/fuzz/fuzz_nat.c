/* fuzz_nat.c — libFuzzer target for the system stack's NAT table, against a shadow model.
 *
 * Input: a 10-byte configuration, then 2-byte operations [op][arg] (seed corpus:
 * tests/fuzz/make_corpus_nat.py). The configuration picks a small space (1-2 addresses, 1-2
 * listeners, 1-16 ports per family), a budget of 1-48 entries, the HALF_OPEN limits, the three
 * timeouts (from 0 and one tick up to the 24 h maximum), the hash seed and the start of the
 * clock, so that collisions, exhaustion and quarantine are the common case. op % 12:
 *   0 uplink pure SYN of key arg      1 uplink without SYN           2 downlink of tuple(arg)
 *   3 accept tuple(arg)               4 mark_closing tuple(arg) with the right, a stale, zero or
 *                                       a future generation (op bits 4-5)
 *   5 advance the clock by dur(arg)   6 purge with budget arg (255: unbounded)
 *   7 collect up to arg & 15 expired candidates (held, and removed later: the contract)
 *   8 remove a held candidate (op bit 4: a made-up one instead)
 *   9 set the clock skew: later calls pass now minus 0, 1 ns, half a tick or 2 ms, as a
 *     worker whose batch clock lags another's does
 *  10 calls with a bad family or a tuple outside the space
 *  11 two uplinks of key arg in a row (SYN retransmit, then data)
 * Every input ends with a drain: held candidates removed, every ACTIVE entry closed, the clock
 * past every timeout and the quarantine, a purge, then as many connections as the budget
 * holds and one more, which must be refused for the budget and nothing else.
 *
 * The model is a flat array indexed by key plus per-tuple status and the quarantine as a FIFO of
 * groups (one group per call that quarantines; the order inside a purge's group is the heap's,
 * so when an allocation releases part of it, nat_tuple_status says which members came free).
 * After every operation: the return value and returned tuple or key; fresh, increasing
 * generations; every counter (the per-source refusals as a sum: the count-min sketch may refuse
 * a source that shares full buckets, and must refuse one at its limit); the stats; the state and
 * generation of every mapping (nat_peek); the status of every tuple of both families; and
 * nat_next_deadline no later than the earliest model deadline (INT64_MAX with nothing to wait
 * for). A tuple is handed out only when the model holds it free: never while mapped, never
 * before its quarantine is over. Budget and HALF_OPEN share are checked through refusals: a
 * create is refused for the budget exactly when the model's live entries fill it, for the share
 * exactly when its HALF_OPEN entries do, for ports exactly when no tuple is free.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "stacks/system/nat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define POOL 56          /* flow keys; more than the largest budget */
#define PORT_MIN 1000
#define MAX_PORTS 16
#define MAX_SPACE (2 * 2 * MAX_PORTS)
#define MAX_Q (4 * MAX_SPACE) /* quarantine records; at most 2 * MAX_SPACE are unreleased */
#define MAX_HELD 64
#define TICK NAT_QUARANTINE_TICK_NS
#define MS 1000000LL
#define SEC 1000000000LL

enum { T_FREE, T_MAPPED, T_RESTING };

struct m_entry {
	bool live;
	bool in_heap; /* false while a collected candidate is held */
	bool acct;    /* counted against its source's HALF_OPEN limits */
	enum nat_state state;
	struct nat_tuple tp;
	uint64_t gen;
	int64_t last;
};

struct m_q {
	uint8_t fam;
	uint16_t idx;
	uint64_t due;
	uint32_t grp;
	bool released;
};

struct snap {
#define SNAP_FIELD(name) uint64_t name;
	NAT_COUNTERS(SNAP_FIELD)
#undef SNAP_FIELD
	uint64_t src_refused; /* half_open_host + half_open_net */
};

static struct flow_key keys[POOL];
static struct nat_config cfg;
static struct nat_table *T;
static struct m_entry M[POOL];
static uint8_t tstat[2][MAX_SPACE];
static uint8_t towner[2][MAX_SPACE];
static struct m_q Q[MAX_Q];
static size_t q_head, q_len; /* Q[q_head, q_len) may hold unreleased records */
static uint32_t next_grp;
static struct snap C;
static uint64_t max_gen;
static uint32_t space;
static int64_t now, skew;
static struct nat_candidate held[MAX_HELD];
static size_t n_held;
/* A partial release waiting for nat_tuple_status: group and how many of it were released. */
static uint32_t partial_grp;
static size_t partial_k;
static bool partial_pending;

static void check(int cond)
{
	if (!cond)
		abort();
}

static void make_keys(void)
{
	/* IPv4: hosts 0-2 in 10.0.0.0/24, 3-4 in 10.0.1.0/24; IPv6: hosts 0-1 share a /48, 2-3
	 * another; few ports and destinations, so keys differ only in one field. */
	for (int i = 0; i < POOL; i++) {
		struct flow_key *k = &keys[i];

		memset(k, 0, sizeof(*k));
		k->proto = IPPROTO_TCP;
		k->dport_be = htons(443);
		if (i < 36) {
			int h = i % 5;
			uint32_t src = htonl(0x0a000000u | (uint32_t)(h / 3) << 8 |
					     (uint32_t)(h + 1));
			uint32_t dst = htonl(0x01010101u + (uint32_t)(i / 20));

			k->family = 4;
			k->sport_be = htons((uint16_t)(40000 + (i / 5) % 4));
			memcpy(k->src, &src, 4);
			memcpy(k->dst, &dst, 4);
		} else {
			int j = i - 36, h = j % 4;

			k->family = 6;
			k->sport_be = htons((uint16_t)(40000 + j / 4));
			k->src[0] = 0xfd;
			k->src[5] = (uint8_t)(h / 2);
			k->src[7] = (uint8_t)h;
			k->src[15] = 1;
			k->dst[0] = 0x20;
			k->dst[1] = 0x01;
			k->dst[15] = (uint8_t)(1 + j % 3);
		}
	}
}

/* ---- the model --------------------------------------------------------------------------- */

static int fam_of(const struct nat_tuple *tp)
{
	return tp->family == 6;
}

static uint32_t index_of(const struct nat_tuple *tp)
{
	return ((uint32_t)(tp->port - cfg.port_min) * cfg.n_addrs + tp->addr) * cfg.n_listeners +
	       tp->listener;
}

static struct nat_tuple tuple_at(int fam, uint32_t idx)
{
	struct nat_tuple tp;

	memset(&tp, 0, sizeof(tp));
	tp.family = fam ? 6 : 4;
	tp.listener = (uint8_t)(idx % cfg.n_listeners);
	tp.addr = (uint8_t)(idx / cfg.n_listeners % cfg.n_addrs);
	tp.port = (uint16_t)(cfg.port_min + idx / (cfg.n_listeners * cfg.n_addrs));
	return tp;
}

static bool tuple_valid(const struct nat_tuple *tp)
{
	return (tp->family == 4 || tp->family == 6) && tp->addr < cfg.n_addrs &&
	       tp->listener < cfg.n_listeners && tp->port >= cfg.port_min &&
	       tp->port <= cfg.port_max;
}

static bool tuple_eq(const struct nat_tuple *a, const struct nat_tuple *b)
{
	return a->family == b->family && a->addr == b->addr && a->listener == b->listener &&
	       a->port == b->port;
}

/* The key mapped to tp in the model, or -1. */
static int owner_of(const struct nat_tuple *tp)
{
	if (!tuple_valid(tp))
		return -1;
	int f = fam_of(tp);
	uint32_t i = index_of(tp);

	return tstat[f][i] == T_MAPPED ? towner[f][i] : -1;
}

static int64_t sat_add(int64_t a, int64_t b)
{
	int64_t r;

	return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

static int64_t deadline_of(const struct m_entry *e)
{
	if (e->state == NAT_ACTIVE)
		return INT64_MAX;
	return sat_add(e->last, e->state == NAT_HALF_OPEN ? cfg.half_open_ns : cfg.linger_ns);
}

static bool expired(const struct m_entry *e, int64_t at)
{
	return e->live && e->state != NAT_ACTIVE && deadline_of(e) <= at;
}

static int64_t op_now(void)
{
	return now > skew ? now - skew : 0;
}

static uint64_t tick_of(int64_t ns)
{
	return (uint64_t)ns >> 20;
}

static int count_state(int state)
{
	int n = 0;

	for (int k = 0; k < POOL; k++)
		n += M[k].live && (state < 0 || (int)M[k].state == state);
	return n;
}

static int free_tuples(int fam)
{
	int n = 0;

	for (uint32_t i = 0; i < space; i++)
		n += tstat[fam][i] == T_FREE;
	return n;
}

/* Counted HALF_OPEN entries of key's source host (level 0) or network (level 1). */
static uint32_t src_count(int key, int level)
{
	static const int len[2][2] = { { 4, 3 }, { 8, 6 } };
	const struct flow_key *k = &keys[key];
	int n = len[k->family == 6][level];
	uint32_t c = 0;

	for (int j = 0; j < POOL; j++)
		c += M[j].live && M[j].acct && keys[j].family == k->family &&
		     memcmp(keys[j].src, k->src, (size_t)n) == 0;
	return c;
}

static void fresh_gen(uint64_t gen)
{
	check(gen > max_gen);
	max_gen = gen;
}

static void q_push(const struct nat_tuple *tps, size_t n, int64_t at)
{
	uint64_t due = tick_of(sat_add(sat_add(at, cfg.quarantine_ns), TICK - 1));

	if (n == 0)
		return;
	if (q_len + n > MAX_Q) { /* compact: drop released records */
		size_t w = 0;

		for (size_t i = q_head; i < q_len; i++)
			if (!Q[i].released)
				Q[w++] = Q[i];
		q_head = 0;
		q_len = w;
	}
	check(q_len + n <= MAX_Q);
	for (size_t i = 0; i < n; i++) {
		int f = fam_of(&tps[i]);
		uint32_t x = index_of(&tps[i]);

		check(tstat[f][x] == T_MAPPED);
		tstat[f][x] = T_RESTING;
		Q[q_len++] = (struct m_q){ .fam = (uint8_t)f, .idx = (uint16_t)x, .due = due,
					   .grp = next_grp, .released = false };
	}
	next_grp++;
	C.quarantined += n;
}

static void q_free(struct m_q *r)
{
	r->released = true;
	tstat[r->fam][r->idx] = T_FREE;
}

static size_t q_resting(void)
{
	size_t n = 0;

	for (size_t i = q_head; i < q_len; i++)
		n += !Q[i].released;
	return n;
}

/* Release up to k due records from the head, as the table does; a group only partly released
 * is resolved later by resolve_partial. Returns how many. */
static size_t q_release(int64_t at, size_t k)
{
	uint64_t tk = tick_of(at);
	size_t n = 0;

	check(!partial_pending);
	while (n < k) {
		while (q_head < q_len && Q[q_head].released)
			q_head++;
		if (q_head == q_len || Q[q_head].due > tk)
			break;
		uint32_t g = Q[q_head].grp;
		size_t members = 0;

		for (size_t i = q_head; i < q_len && Q[i].grp == g; i++)
			members += !Q[i].released;
		if (members <= k - n) {
			for (size_t i = q_head; i < q_len && Q[i].grp == g; i++)
				if (!Q[i].released)
					q_free(&Q[i]);
			n += members;
			continue;
		}
		partial_grp = g;
		partial_k = k - n;
		partial_pending = true;
		n = k;
	}
	C.released += n;
	return n;
}

/* Which members of the partly released group came free: the table's answer, checked in count. */
static void resolve_partial(void)
{
	size_t got = 0;

	if (!partial_pending)
		return;
	partial_pending = false;
	for (size_t i = q_head; i < q_len; i++) {
		struct m_q *r = &Q[i];

		if (r->released || r->grp != partial_grp)
			continue;
		struct nat_tuple tp = tuple_at(r->fam, r->idx);

		if (nat_tuple_status(T, &tp) != NAT_TUPLE_RESTING) {
			q_free(r);
			got++;
		}
	}
	check(got == partial_k);
}

static void map_new(int key, const struct nat_tuple *tp, uint64_t gen, int64_t at, bool acct)
{
	int f = fam_of(tp);
	uint32_t x = index_of(tp);

	check(tuple_valid(tp) && tp->family == keys[key].family);
	check(tstat[f][x] == T_FREE); /* never mapped twice, never out of quarantine early */
	tstat[f][x] = T_MAPPED;
	towner[f][x] = (uint8_t)key;
	fresh_gen(gen);
	M[key] = (struct m_entry){ .live = true, .in_heap = true, .acct = acct,
				   .state = NAT_HALF_OPEN, .tp = *tp, .gen = gen, .last = at };
}

static void touch(struct m_entry *e, int64_t at)
{
	if (at > e->last)
		e->last = at;
}

/* ---- checks after every operation ------------------------------------------------------- */

static void check_counters(void)
{
	const struct nat_counters *c = nat_get_counters(T);

#define CHECK_CTR(name) check(ctr_get(&c->name) == C.name);
	CHECK_CTR(created)
	CHECK_CTR(replaced)
	CHECK_CTR(accepted)
	CHECK_CTR(closed)
	CHECK_CTR(expired)
	CHECK_CTR(expiry_saved)
	CHECK_CTR(quarantined)
	CHECK_CTR(released)
	CHECK_CTR(uplink_miss)
	CHECK_CTR(downlink_miss)
	CHECK_CTR(accept_miss)
	CHECK_CTR(gen_mismatch)
	CHECK_CTR(budget_exhausted)
	CHECK_CTR(ports_exhausted)
	CHECK_CTR(half_open_full)
#undef CHECK_CTR
	check(ctr_get(&c->half_open_host) + ctr_get(&c->half_open_net) == C.src_refused);
	check(ctr_get(&c->quarantine_reuse) == 0); /* a tuple handed out while resting */
	/* The header's identities: live = created - replaced - expired, resting = quarantined -
	 * released. */
	check(C.created - C.replaced - C.expired == (uint64_t)count_state(-1));
	check(C.quarantined - C.released == q_resting());
}

static void check_all(void)
{
	struct nat_stats st;
	int64_t min_deadline = INT64_MAX;
	check(!partial_pending);
	check_counters();
	nat_get_stats(T, &st);
	for (int s = 0; s < NAT_STATE_MAX; s++)
		check(st.entries[s] == (uint64_t)count_state(s));
	check(st.quarantine == q_resting());
	for (int k = 0; k < POOL; k++) {
		const struct m_entry *e = &M[k];
		enum nat_state state;
		uint64_t gen;

		if (!e->live)
			continue;
		check(nat_peek(T, &e->tp, &state, &gen) == 0);
		check(state == e->state && gen == e->gen);
		check(owner_of(&e->tp) == k);
		if (e->in_heap) {
			check(e->state != NAT_ACTIVE);
			if (deadline_of(e) < min_deadline)
				min_deadline = deadline_of(e);
		}
	}
	for (int f = 0; f < 2; f++) {
		for (uint32_t i = 0; i < space; i++) {
			struct nat_tuple tp = tuple_at(f, i);
			int want = tstat[f][i] == T_FREE ? NAT_TUPLE_FREE :
				   tstat[f][i] == T_MAPPED ? NAT_TUPLE_MAPPED : NAT_TUPLE_RESTING;

			check(nat_tuple_status(T, &tp) == want);
		}
	}
	for (size_t i = q_head; i < q_len; i++) {
		if (Q[i].released)
			continue;
		int64_t wake = sat_add((int64_t)(Q[i].due << 20), NAT_QUARANTINE_WAKE_NS);

		if (wake < min_deadline)
			min_deadline = wake;
		break; /* the head */
	}
	/* May be early, never late; nothing to wait for: never woken. */
	if (min_deadline == INT64_MAX)
		check(nat_next_deadline(T) == INT64_MAX);
	else
		check(nat_next_deadline(T) <= min_deadline);
}

/* ---- operations ------------------------------------------------------------------------- */

/* Share and budget for a new HALF_OPEN mapping (with_budget: a new entry, not a replacement).
 * Returns the refusal the table must give (-ENOSPC, -EBUSY), 1 if a per-source refusal is
 * required, 0 if allowed (a per-source refusal may still come from sketch collisions), and
 * sets *counted when the entry would be counted per source. */
static int share_verdict(int key, bool with_budget, bool *counted)
{
	int ho = count_state(NAT_HALF_OPEN);

	*counted = false;
	if (with_budget && count_state(-1) >= (int)cfg.max_entries)
		return -ENOSPC;
	if (ho >= (int)cfg.half_open_max)
		return -EBUSY;
	if ((uint32_t)ho < cfg.half_open_quiet)
		return 0;
	*counted = true;
	return src_count(key, 0) >= cfg.half_open_per_host ||
	       src_count(key, 1) >= cfg.half_open_per_net;
}

/* The allocation step shared by create and replace: ret is the table's answer once the share
 * was taken. Returns true if a tuple was allocated (then *tp is it, checked free). */
static bool alloc_step(int key, int ret, int64_t at, const struct nat_tuple *tp)
{
	int fam = keys[key].family == 6;

	q_release(at, NAT_RELEASE_PER_ALLOC);
	resolve_partial();
	if (free_tuples(fam) == 0) {
		check(ret == -EADDRNOTAVAIL);
		C.ports_exhausted++;
		return false;
	}
	check(ret == 0);
	return true;
}

static void op_uplink(int key, bool syn)
{
	struct m_entry *e = &M[key];
	struct nat_tuple tp;
	int64_t at = op_now();
	bool counted;
	int v, ret;

	memset(&tp, 0, sizeof(tp));
	ret = nat_uplink(T, &keys[key], syn, at, &tp);
	if (e->live && !(syn && e->state == NAT_CLOSING)) {
		check(ret == 0 && tuple_eq(&tp, &e->tp));
		if (e->state != NAT_HALF_OPEN)
			touch(e, at);
		return;
	}
	if (!e->live && !syn) {
		check(ret == -ENOENT);
		C.uplink_miss++;
		return;
	}
	v = share_verdict(key, !e->live, &counted);
	if (v < 0) {
		check(ret == v);
		if (v == -ENOSPC)
			C.budget_exhausted++;
		else
			C.half_open_full++;
		return;
	}
	if (ret == -EBUSY) { /* per source: required at the limit, else a sketch collision */
		check(counted);
		C.src_refused++;
		return;
	}
	check(v == 0);
	if (!alloc_step(key, ret, at, &tp))
		return;
	{
		enum nat_state state;
		uint64_t gen = 0;

		check(nat_peek(T, &tp, &state, &gen) == 0 && state == NAT_HALF_OPEN);
		if (e->live) {
			struct nat_tuple old = e->tp;

			/* A replacement moves to a DIFFERENT tuple; the old one rests. */
			check(!tuple_eq(&tp, &old));
			q_push(&old, 1, at);
			C.replaced++;
		}
		map_new(key, &tp, gen, at, counted);
	}
	C.created++;
}

static struct nat_tuple pick_tuple(uint8_t arg)
{
	struct nat_tuple tp;

	if ((arg & 0xc0) == 0) {
		int live = count_state(-1);

		if (live) {
			int n = arg % live;

			for (int k = 0; k < POOL; k++)
				if (M[k].live && n-- == 0)
					return M[k].tp;
		}
	}
	if ((arg & 0xc0) == 0x40) {
		size_t resting = q_resting();

		if (resting) {
			size_t n = arg % resting;

			for (size_t i = q_head; i < q_len; i++)
				if (!Q[i].released && n-- == 0)
					return tuple_at(Q[i].fam, Q[i].idx);
		}
	}
	uint32_t idx = (uint32_t)(arg >> 1) % (space + 3);

	if (idx < space)
		return tuple_at(arg & 1, idx);
	/* Outside the space: a port below the range, an address or listener past the last. */
	tp = tuple_at(arg & 1, 0);
	if (idx == space)
		tp.port = (uint16_t)(cfg.port_min - 1);
	else if (idx == space + 1)
		tp.addr = (uint8_t)cfg.n_addrs;
	else
		tp.listener = (uint8_t)cfg.n_listeners;
	return tp;
}

static void op_downlink(uint8_t arg)
{
	struct nat_tuple tp = pick_tuple(arg);
	struct flow_key k;
	int key = owner_of(&tp);
	int ret = nat_downlink(T, &tp, op_now(), &k);

	if (key < 0) {
		check(ret == -ENOENT);
		C.downlink_miss++;
		return;
	}
	check(ret == 0 && flow_key_eq(&k, &keys[key]));
	if (M[key].state != NAT_HALF_OPEN)
		touch(&M[key], op_now());
}

static void accept_tuple(const struct nat_tuple *tp)
{
	struct flow_key k;
	uint64_t gen = 0;
	int key = owner_of(tp);
	int ret = nat_accept(T, tp, op_now(), &k, &gen);

	if (key < 0 || M[key].state != NAT_HALF_OPEN) {
		check(ret == -ENOENT);
		C.accept_miss++;
		return;
	}
	check(ret == 0 && flow_key_eq(&k, &keys[key]));
	fresh_gen(gen);
	M[key].gen = gen;
	M[key].state = NAT_ACTIVE;
	M[key].in_heap = false;
	M[key].acct = false;
	C.accepted++;
}

static void op_accept(uint8_t arg)
{
	struct nat_tuple tp = pick_tuple(arg);

	accept_tuple(&tp);
}

static void op_mark_closing(uint8_t arg, int which)
{
	struct nat_tuple tp = pick_tuple(arg);
	int key = owner_of(&tp);
	uint64_t gen = 0;
	int ret;

	if (key >= 0)
		gen = M[key].gen;
	gen = which == 0 ? gen : which == 1 ? gen - 1 : which == 2 ? 0 : max_gen + 1;
	ret = nat_mark_closing(T, &tp, gen, op_now());
	if (key < 0) {
		check(ret == -ENOENT);
		return;
	}
	struct m_entry *e = &M[key];

	if (gen != e->gen || e->state == NAT_HALF_OPEN) {
		check(ret == -ESTALE);
		C.gen_mismatch++;
		return;
	}
	check(ret == 0);
	if (e->state == NAT_ACTIVE) {
		e->state = NAT_CLOSING;
		touch(e, op_now());
		e->in_heap = true;
		C.closed++;
	}
}

/* Remove entry key (expired), quarantine its tuple in the current group. */
static void model_remove(int key, struct nat_tuple *group, size_t *n)
{
	group[(*n)++] = M[key].tp;
	M[key].live = false;
	C.expired++;
}

static void op_purge(size_t budget)
{
	struct nat_tuple group[POOL];
	int64_t at = op_now();
	size_t in_heap = 0, n = 0;
	size_t removed = nat_purge(T, at, budget);

	for (int k = 0; k < POOL; k++)
		in_heap += M[k].live && M[k].in_heap;
	for (int k = 0; k < POOL; k++) {
		if (!M[k].live || !M[k].in_heap || !expired(&M[k], at))
			continue;
		if (budget >= in_heap) {
			model_remove(k, group, &n); /* enough budget: every due entry goes */
		} else {
			enum nat_state s;
			uint64_t g;

			if (nat_peek(T, &M[k].tp, &s, &g) == -ENOENT)
				model_remove(k, group, &n);
		}
	}
	check(removed == n && n <= budget);
	q_push(group, n, at);
	q_release(at, budget);
	resolve_partial();
}

static void op_collect(size_t max)
{
	struct nat_candidate c[16];
	int64_t at = op_now();
	size_t in_heap = 0, due = 0, n;

	if (max > MAX_HELD - n_held)
		max = MAX_HELD - n_held;
	n = nat_collect_expired(T, at, c, max);
	check(n <= max);
	for (int k = 0; k < POOL; k++) {
		in_heap += M[k].live && M[k].in_heap;
		due += M[k].live && M[k].in_heap && expired(&M[k], at);
	}
	if (max >= in_heap)
		check(n == due);
	for (size_t i = 0; i < n; i++) {
		int key = owner_of(&c[i].tuple);

		check(key >= 0 && M[key].gen == c[i].gen && M[key].in_heap && expired(&M[key], at));
		M[key].in_heap = false; /* no duplicates: a second one would fail here */
		held[n_held++] = c[i];
	}
}

static void remove_held(size_t i)
{
	struct nat_candidate c = held[i];
	int64_t at = op_now();
	int key = owner_of(&c.tuple);
	int ret = nat_remove_if_expired(T, &c, at);

	held[i] = held[--n_held];
	if (key < 0 || M[key].gen != c.gen) {
		check(ret == -ENOENT);
		return;
	}
	struct m_entry *e = &M[key];

	check(!e->in_heap);
	if (expired(e, at)) {
		check(ret == 0);
		e->live = false;
		C.expired++;
		q_push(&e->tp, 1, at);
		return;
	}
	check(ret == -EAGAIN);
	C.expiry_saved++;
	if (e->state != NAT_ACTIVE)
		e->in_heap = true;
}

static void op_remove(uint8_t op, uint8_t arg)
{
	if (op & 0x10) {
		/* Made up: an unknown shard index is refused; generation 0 was never handed out. */
		struct nat_candidate c = {
			.tuple = pick_tuple(arg),
			.gen = 0,
			.fwd_shard = arg & 1 ? NAT_SHARDS + arg : arg % NAT_SHARDS,
		};

		check(nat_remove_if_expired(T, &c, op_now()) == (arg & 1 ? -EINVAL : -ENOENT));
		return;
	}
	if (n_held)
		remove_held(arg % n_held);
}

static void op_bad(uint8_t arg)
{
	struct flow_key k = keys[arg % POOL];
	struct nat_tuple tp;
	struct flow_key ko;
	uint64_t gen;

	k.family = (uint8_t)(arg & 0x80 ? 0 : 5);
	check(nat_uplink(T, &k, true, op_now(), &tp) == -EINVAL);
	tp = pick_tuple((uint8_t)(0x80 | arg));
	if (!tuple_valid(&tp)) {
		check(nat_tuple_status(T, &tp) == -EINVAL);
		check(nat_accept(T, &tp, op_now(), &ko, &gen) == -ENOENT);
		C.accept_miss++;
		check(nat_mark_closing(T, &tp, max_gen, op_now()) == -ENOENT);
	}
}

static int64_t dur(uint8_t arg)
{
	const int64_t d[16] = {
		0, 1, TICK - 1, TICK, TICK + 1, MS, 10 * MS, cfg.half_open_ns, cfg.half_open_ns - 1,
		cfg.linger_ns, cfg.linger_ns + 1, cfg.quarantine_ns, cfg.quarantine_ns + TICK,
		SEC, 60 * SEC, NAT_QUARANTINE_WAKE_NS,
	};

	return d[arg & 15] * (1 + (arg >> 6)) + ((arg >> 4) & 3);
}

static int64_t timeout_pick(uint8_t b, bool zero_ok)
{
	const int64_t d[8] = { 0, 1, TICK - 1, TICK, 5 * MS, SEC, 30 * SEC, NAT_TIMEOUT_MAX_NS };
	int64_t v = d[b & 7];

	return v == 0 && !zero_ok ? 2 : v;
}

static void setup(const uint8_t *h)
{
	static const int64_t starts[4] = { 0, 1, 5 * SEC, 1LL << 40 };

	make_keys();
	nat_config_default(&cfg);
	cfg.n_addrs = 1 + (h[0] & 1);
	cfg.n_listeners = 1 + ((h[0] >> 1) & 1);
	cfg.port_min = PORT_MIN;
	cfg.port_max = (uint16_t)(PORT_MIN + ((h[0] >> 2) & 15));
	cfg.max_entries = 1 + h[1] % 48;
	cfg.half_open_max = 1 + h[2] % 48;
	cfg.half_open_per_host = 1 + (h[3] & 7);
	cfg.half_open_per_net = 1 + ((h[3] >> 3) & 15);
	cfg.half_open_quiet = h[4] % 50;
	cfg.half_open_ns = timeout_pick(h[5], false);
	cfg.linger_ns = timeout_pick(h[6], true);
	cfg.quarantine_ns = timeout_pick(h[7], true);
	cfg.seed = (uint64_t)h[8] << 8 | h[9];
	now = starts[h[0] >> 6];
	if (nat_table_new(&cfg, &T) != 0)
		abort();
	space = cfg.n_addrs * cfg.n_listeners * (uint32_t)(cfg.port_max - cfg.port_min + 1);
	memset(M, 0, sizeof(M));
	memset(tstat, 0, sizeof(tstat));
	memset(&C, 0, sizeof(C));
	q_head = q_len = 0;
	next_grp = 0;
	max_gen = 0;
	skew = 0;
	n_held = 0;
	partial_pending = false;
}

/* Close everything, let it all expire and rest, then fill the budget from scratch. */
static void drain(void)
{
	int64_t longest = cfg.half_open_ns > cfg.linger_ns ? cfg.half_open_ns : cfg.linger_ns;

	skew = 0;
	while (n_held) {
		remove_held(0);
		check_all();
	}
	for (int k = 0; k < POOL; k++) {
		if (M[k].live && M[k].state == NAT_ACTIVE) {
			struct nat_tuple tp = M[k].tp;

			check(nat_mark_closing(T, &tp, M[k].gen, now) == 0);
			M[k].state = NAT_CLOSING;
			touch(&M[k], now);
			M[k].in_heap = true;
			C.closed++;
		}
	}
	now += longest + 1;
	op_purge(1u << 20);
	check_all();
	check(count_state(-1) == 0);
	now += cfg.quarantine_ns + 2 * TICK;
	op_purge(1u << 20);
	check_all();
	check(q_resting() == 0 && nat_next_deadline(T) == INT64_MAX);
	/* The budget came back whole: it holds max_entries connections again (accepted at once,
	 * so the HALF_OPEN share never refuses), unless the space is smaller; then one more is
	 * refused, for the budget. */
	for (int k = 0; k < POOL && count_state(-1) < (int)cfg.max_entries; k++) {
		op_uplink(k, true);
		check_all();
		check(M[k].live || (int)space < (int)cfg.max_entries);
		if (!M[k].live)
			return;
		accept_tuple(&M[k].tp);
		check_all();
		check(M[k].state == NAT_ACTIVE);
	}
	op_uplink(POOL - 1, true);
	check_all();
	check(!M[POOL - 1].live && ctr_get(&nat_get_counters(T)->budget_exhausted) > 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 10)
		return 0;
	setup(data);
	check_all();
	for (size_t i = 10; i + 1 < size; i += 2) {
		uint8_t op = data[i], arg = data[i + 1];

		switch (op % 12) {
		case 0:
			op_uplink(arg % POOL, true);
			break;
		case 1:
			op_uplink(arg % POOL, false);
			break;
		case 2:
			op_downlink(arg);
			break;
		case 3:
			op_accept(arg);
			break;
		case 4:
			op_mark_closing(arg, (op >> 4) & 3);
			break;
		case 5:
			now = sat_add(now, dur(arg));
			break;
		case 6:
			op_purge(arg == 255 ? 1u << 20 : arg);
			break;
		case 7:
			op_collect(arg & 15);
			break;
		case 8:
			op_remove(op, arg);
			break;
		case 9: {
			const int64_t s[4] = { 0, 1, TICK / 2, 2 * MS };

			skew = s[arg & 3];
			break;
		}
		case 10:
			op_bad(arg);
			break;
		case 11:
			op_uplink(arg % POOL, true);
			check_all();
			op_uplink(arg % POOL, false);
			break;
		}
		check_all();
	}
	drain();
	nat_table_free(T);
	T = NULL;
	return 0;
}
