/* test_nat_ref.c — randomized differential test of the NAT table against a deliberately dumb
 * reference model (arrays and linear scans; WireGuard's horrible_allowedips idea).
 *
 * A fixed-seed random sequence of operations (uplink with and without SYN, downlink, accept,
 * mark_closing with right and stale generations, purge, the two cleanup phases with packets in
 * between, clock advances) runs against both on one virtual clock. After every operation the
 * return value, the returned key or tuple, every counter, the stats, the state and generation of
 * every mapping and the status (free / mapped / resting) of every tuple of the space must agree.
 *
 * What the model leaves to the table: the cursor's start (learned from the first allocation of
 * each family), generation numbers (checked to be fresh and increasing), and the order in which
 * one nat_purge quarantines the entries it removes (heap order): when an allocation releases only
 * part of such a group, the model asks nat_tuple_status which members came free.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stacks/system/nat.h"
#include "testutil.h"

#define N_ADDRS 2
#define N_LISTENERS 2
#define PORT_MIN 1000
#define N_PORTS 8
#define SPACE (N_ADDRS * N_LISTENERS * N_PORTS) /* tuples per family */
#define MAX_ENTRIES 40
#define POOL 96 /* flow keys: 64 IPv4, 32 IPv6; more than the budget and the space */
#define QMAX 200000
#define HIST 4 /* old generations remembered per key, for stale marks */
#define OPS 300000
#define NO_GROUP UINT32_MAX

struct snap {
#define SNAP_FIELD(name) uint64_t name;
	NAT_COUNTERS(SNAP_FIELD)
#undef SNAP_FIELD
};

struct ref_entry {
	bool live;
	int key;     /* index into pool */
	int fam;     /* 0 v4, 1 v6 */
	uint32_t idx; /* tuple index in the family's space */
	enum nat_state state;
	uint64_t gen;
	int64_t last; /* last packet (or closing mark) */
};

struct ref_q {
	int fam;
	uint32_t idx;
	int64_t due; /* release tick */
	uint32_t grp; /* one group per nat_purge (order inside unknown), else unique */
	bool released;
};

struct ref {
	struct nat_config cfg;
	struct ref_entry e[MAX_ENTRIES];
	bool claimed[2][SPACE]; /* mapped or resting */
	bool cursor_known[2];
	uint32_t cursor[2];
	struct ref_q *q; /* append-only; [q_head, q_len) may hold unreleased records */
	size_t q_head, q_len;
	uint32_t next_grp;
	struct snap ctr;
	uint64_t max_gen;
	uint64_t hist[POOL][HIST];
};

struct pending {
	uint32_t grp; /* NO_GROUP: nothing ambiguous */
	size_t k;     /* how many members of grp the table released */
};

static struct flow_key pool[POOL];
static struct ref R;
static struct nat_table *T;
static int64_t now;
static uint64_t rng = 0x243f6a8885a308d3ULL;
static uint64_t op_no;
static uint64_t partial_groups; /* allocations that released part of a purge group */

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dULL;
}

static uint32_t below(uint32_t n)
{
	return (uint32_t)(rnd() % n);
}

static void make_pool(void)
{
	int n = 0;

	/* Shared sources and destinations: only the full pair tells flows apart. */
	for (int c = 0; c < 4; c++)
		for (int p = 0; p < 4; p++)
			for (int s = 0; s < 4; s++) {
				struct flow_key *k = &pool[n++];
				uint32_t src = htonl(0x0a000010 + (uint32_t)c);
				uint32_t dst = htonl(0x01010100 + (uint32_t)s);

				memset(k, 0, sizeof(*k));
				k->family = 4;
				k->proto = IPPROTO_TCP;
				k->sport_be = htons((uint16_t)(40000 + p));
				k->dport_be = htons(443);
				memcpy(k->src, &src, 4);
				memcpy(k->dst, &dst, 4);
			}
	for (int c = 0; c < 2; c++)
		for (int p = 0; p < 4; p++)
			for (int s = 0; s < 4; s++) {
				struct flow_key *k = &pool[n++];

				memset(k, 0, sizeof(*k));
				k->family = 6;
				k->proto = IPPROTO_TCP;
				k->sport_be = htons((uint16_t)(40000 + p));
				k->dport_be = htons(443);
				k->src[0] = 0xfd;
				k->src[15] = (uint8_t)(c + 1);
				k->dst[0] = 0x20;
				k->dst[1] = 0x01;
				k->dst[15] = (uint8_t)(s + 1);
			}
	cr_assert_eq(n, POOL);
}

/* ---- the model ---------------------------------------------------------------------------- */

static struct nat_tuple tuple_of(int fam, uint32_t idx)
{
	struct nat_tuple tp = {
		.family = fam ? 6 : 4,
		.listener = (uint8_t)(idx % N_LISTENERS),
		.addr = (uint8_t)(idx / N_LISTENERS % N_ADDRS),
		.port = (uint16_t)(PORT_MIN + idx / (N_LISTENERS * N_ADDRS)),
	};

	return tp;
}

static uint32_t index_of(const struct nat_tuple *tp)
{
	return ((uint32_t)(tp->port - PORT_MIN) * N_ADDRS + tp->addr) * N_LISTENERS + tp->listener;
}

static bool tuple_eq(const struct nat_tuple *a, const struct nat_tuple *b)
{
	return a->family == b->family && a->addr == b->addr && a->listener == b->listener &&
	       a->port == b->port;
}

static int64_t tick(int64_t ns)
{
	return ns / NAT_QUARANTINE_TICK_NS; /* ns >= 0 throughout */
}

static int64_t timeout_of(enum nat_state s)
{
	return s == NAT_HALF_OPEN ? R.cfg.half_open_ns : R.cfg.linger_ns;
}

static bool expired(const struct ref_entry *e)
{
	return e->live && e->state != NAT_ACTIVE && e->last + timeout_of(e->state) <= now;
}

static struct ref_entry *by_key(int key)
{
	for (int i = 0; i < MAX_ENTRIES; i++)
		if (R.e[i].live && R.e[i].key == key)
			return &R.e[i];
	return NULL;
}

static struct ref_entry *by_tuple(int fam, uint32_t idx)
{
	for (int i = 0; i < MAX_ENTRIES; i++)
		if (R.e[i].live && R.e[i].fam == fam && R.e[i].idx == idx)
			return &R.e[i];
	return NULL;
}

static int live_count(void)
{
	int n = 0;

	for (int i = 0; i < MAX_ENTRIES; i++)
		n += R.e[i].live;
	return n;
}

static void quarantine(int fam, uint32_t idx, uint32_t grp)
{
	cr_assert_lt(R.q_len, QMAX);
	R.q[R.q_len++] = (struct ref_q){
		.fam = fam,
		.idx = idx,
		.due = tick(now + R.cfg.quarantine_ns + NAT_QUARANTINE_TICK_NS - 1),
		.grp = grp,
	};
	R.ctr.quarantined++;
}

static void release(struct ref_q *r)
{
	r->released = true;
	R.claimed[r->fam][r->idx] = false;
	R.ctr.released++;
}

static size_t group_left(size_t from, uint32_t grp)
{
	size_t n = 0;

	for (size_t i = from; i < R.q_len && R.q[i].grp == grp; i++)
		n += !R.q[i].released;
	return n;
}

/* The table releases up to k due tuples, oldest first. Whole groups are predictable; a group
 * of which only some are released is reported in p and resolved after the call. */
static void ref_release(size_t k, struct pending *p)
{
	p->grp = NO_GROUP;
	while (k > 0 && R.q_head < R.q_len) {
		struct ref_q *h = &R.q[R.q_head];
		size_t n;

		if (h->released) {
			R.q_head++;
			continue;
		}
		if (tick(now) < h->due)
			return;
		n = group_left(R.q_head, h->grp);
		if (n > k) {
			p->grp = h->grp;
			p->k = k;
			return;
		}
		for (size_t i = R.q_head; i < R.q_len && R.q[i].grp == h->grp; i++)
			if (!R.q[i].released)
				release(&R.q[i]);
		k -= n;
	}
}

static void resolve(const struct pending *p)
{
	size_t n = 0;

	if (p->grp == NO_GROUP)
		return;
	partial_groups++;
	for (size_t i = R.q_head; i < R.q_len; i++) {
		struct nat_tuple tp;

		if (R.q[i].grp != p->grp || R.q[i].released)
			continue;
		tp = tuple_of(R.q[i].fam, R.q[i].idx);
		if (nat_tuple_status(T, &tp) != NAT_TUPLE_RESTING) {
			release(&R.q[i]);
			n++;
		}
	}
	cr_assert_eq(n, p->k, "op %llu: table released %zu of a purge group, want %zu",
		     (unsigned long long)op_no, n, p->k);
}

static int ref_probe(int fam, uint32_t *idx)
{
	uint32_t limit = SPACE < NAT_PROBE_LIMIT ? SPACE : NAT_PROBE_LIMIT;

	for (uint32_t n = 0; n < limit; n++) {
		uint32_t i = R.cursor[fam]++ % SPACE;

		if (!R.claimed[fam][i]) {
			R.claimed[fam][i] = true;
			*idx = i;
			return 0;
		}
	}
	return -EADDRNOTAVAIL;
}

/* A generation handed out by the table now: never seen before, larger than all before. */
static uint64_t fresh_gen(uint64_t gen)
{
	cr_assert_gt(gen, R.max_gen, "op %llu: generation %llu not fresh",
		     (unsigned long long)op_no, (unsigned long long)gen);
	R.max_gen = gen;
	return gen;
}

static void remember_gen(int key, uint64_t gen)
{
	memmove(&R.hist[key][1], &R.hist[key][0], (HIST - 1) * sizeof(uint64_t));
	R.hist[key][0] = gen;
}

static uint64_t peek_gen(const struct nat_tuple *tp)
{
	enum nat_state s;
	uint64_t gen;

	cr_assert_eq(nat_peek(T, tp, &s, &gen), 0);
	return gen;
}

/* ---- operations, each run on both ---------------------------------------------------------- */

/* The allocation part of a SYN without a usable mapping: budget already checked. */
static void allocate(int key, struct ref_entry *e, int got, const struct nat_tuple *tp)
{
	int fam = pool[key].family == 6;
	struct pending p;
	uint32_t idx;
	int want;

	ref_release(NAT_RELEASE_PER_ALLOC, &p);
	resolve(&p);
	if (!R.cursor_known[fam]) {
		/* The first allocation of a family always succeeds: it shows the start. */
		cr_assert_eq(got, 0);
		R.cursor[fam] = index_of(tp);
		R.cursor_known[fam] = true;
	}
	want = ref_probe(fam, &idx);
	cr_assert_eq(got, want, "op %llu: allocation returned %d, want %d",
		     (unsigned long long)op_no, got, want);
	if (want != 0) {
		R.ctr.ports_exhausted++;
		return;
	}
	struct nat_tuple exp = tuple_of(fam, idx);
	cr_assert(tuple_eq(tp, &exp), "op %llu: got port %u/%u/%u, want %u/%u/%u",
		  (unsigned long long)op_no, tp->addr, tp->listener, tp->port, exp.addr,
		  exp.listener, exp.port);
	if (e) {
		/* Replacement of a CLOSING mapping: the old tuple rests. */
		quarantine(e->fam, e->idx, R.next_grp++);
		R.ctr.replaced++;
	} else {
		for (e = R.e; e->live; e++)
			;
		e->live = true;
		e->key = key;
		e->fam = fam;
	}
	e->idx = idx;
	e->state = NAT_HALF_OPEN;
	e->gen = fresh_gen(peek_gen(tp));
	e->last = now;
	remember_gen(key, e->gen);
	R.ctr.created++;
}

static void op_uplink(int key, bool syn)
{
	struct ref_entry *e = by_key(key);
	struct nat_tuple tp;
	int got = nat_uplink(T, &pool[key], syn, now, &tp);

	if (e && !(syn && e->state == NAT_CLOSING)) {
		struct nat_tuple exp = tuple_of(e->fam, e->idx);

		cr_assert_eq(got, 0, "op %llu", (unsigned long long)op_no);
		cr_assert(tuple_eq(&tp, &exp), "op %llu: uplink tuple differs",
			  (unsigned long long)op_no);
		if (now > e->last && e->state != NAT_HALF_OPEN) /* fixed by its SYN */
			e->last = now;
	} else if (!e && !syn) {
		cr_assert_eq(got, -ENOENT, "op %llu", (unsigned long long)op_no);
		R.ctr.uplink_miss++;
	} else if (!e && live_count() >= MAX_ENTRIES) {
		cr_assert_eq(got, -ENOSPC, "op %llu", (unsigned long long)op_no);
		R.ctr.budget_exhausted++;
	} else {
		allocate(key, e, got, &tp);
	}
}

static void pick_tuple(int *fam, uint32_t *idx)
{
	if (below(10) < 7) {
		for (int tries = 0; tries < 8; tries++) {
			struct ref_entry *e = &R.e[below(MAX_ENTRIES)];

			if (e->live) {
				*fam = e->fam;
				*idx = e->idx;
				return;
			}
		}
	}
	*fam = (int)below(2);
	*idx = below(SPACE);
}

static void op_downlink(int fam, uint32_t idx)
{
	struct ref_entry *e = by_tuple(fam, idx);
	struct nat_tuple tp = tuple_of(fam, idx);
	struct flow_key k;
	int got = nat_downlink(T, &tp, now, &k);

	if (!e) {
		cr_assert_eq(got, -ENOENT, "op %llu", (unsigned long long)op_no);
		R.ctr.downlink_miss++;
		return;
	}
	cr_assert_eq(got, 0, "op %llu", (unsigned long long)op_no);
	cr_assert_eq(memcmp(&k, &pool[e->key], sizeof(k)), 0, "op %llu: wrong key",
		     (unsigned long long)op_no);
	if (now > e->last && e->state != NAT_HALF_OPEN)
		e->last = now;
}

static void op_accept(int fam, uint32_t idx)
{
	struct ref_entry *e = by_tuple(fam, idx);
	struct nat_tuple tp = tuple_of(fam, idx);
	struct flow_key k;
	uint64_t gen = 0;
	int got = nat_accept(T, &tp, now, &k, &gen);

	if (!e || e->state != NAT_HALF_OPEN) {
		cr_assert_eq(got, -ENOENT, "op %llu", (unsigned long long)op_no);
		R.ctr.accept_miss++;
		return;
	}
	cr_assert_eq(got, 0, "op %llu", (unsigned long long)op_no);
	cr_assert_eq(memcmp(&k, &pool[e->key], sizeof(k)), 0);
	e->state = NAT_ACTIVE;
	e->gen = fresh_gen(gen);
	remember_gen(e->key, gen);
	R.ctr.accepted++;
}

static void op_mark_closing(int fam, uint32_t idx)
{
	struct ref_entry *e = by_tuple(fam, idx);
	struct nat_tuple tp = tuple_of(fam, idx);
	uint64_t gen;
	int got, want;

	/* The right generation most of the time; else an older one of the same key, or noise. */
	if (e && below(10) < 6)
		gen = e->gen;
	else if (e && below(2))
		gen = R.hist[e->key][below(HIST)];
	else
		gen = rnd() % (R.max_gen + 2);
	got = nat_mark_closing(T, &tp, gen, now);
	if (!e) {
		want = -ENOENT;
	} else if (e->gen != gen || e->state == NAT_HALF_OPEN) {
		want = -ESTALE;
		R.ctr.gen_mismatch++;
	} else {
		want = 0;
		if (e->state == NAT_ACTIVE) {
			e->state = NAT_CLOSING;
			if (now > e->last)
				e->last = now;
			R.ctr.closed++;
		}
	}
	cr_assert_eq(got, want, "op %llu", (unsigned long long)op_no);
}

static void op_purge(void)
{
	uint32_t grp = R.next_grp++;
	size_t want = 0, got;
	struct pending p;

	for (int i = 0; i < MAX_ENTRIES; i++) {
		struct ref_entry *e = &R.e[i];

		if (!expired(e))
			continue;
		e->live = false;
		quarantine(e->fam, e->idx, grp);
		R.ctr.expired++;
		want++;
	}
	got = nat_purge(T, now, 1000000);
	cr_assert_eq(got, want, "op %llu: purge removed %zu, want %zu", (unsigned long long)op_no,
		     got, want);
	ref_release(SIZE_MAX, &p);
	cr_assert_eq(p.grp, NO_GROUP);
}

/* Phase 1, then packets / accepts / reconnects on some candidates, then phase 2 for all. */
static void op_two_phase(void)
{
	struct nat_candidate c[64];
	size_t n = nat_collect_expired(T, now, c, 64), want = 0;

	for (int i = 0; i < MAX_ENTRIES; i++)
		want += expired(&R.e[i]);
	cr_assert_eq(n, want, "op %llu: collected %zu, want %zu", (unsigned long long)op_no, n,
		     want);
	for (size_t i = 0; i < n; i++) {
		int fam = c[i].tuple.family == 6;
		struct ref_entry *e = by_tuple(fam, index_of(&c[i].tuple));

		cr_assert(e && expired(e) && e->gen == c[i].gen, "op %llu: bad candidate",
			  (unsigned long long)op_no);
		switch (below(6)) {
		case 0:
			op_uplink(e->key, false);
			break;
		case 1:
			op_downlink(fam, e->idx);
			break;
		case 2:
			op_accept(fam, e->idx);
			break;
		case 3:
			op_uplink(e->key, true);
			break;
		default:
			break;
		}
	}
	for (size_t i = 0; i < n; i++) {
		int fam = c[i].tuple.family == 6;
		struct ref_entry *e = by_tuple(fam, index_of(&c[i].tuple));
		int got = nat_remove_if_expired(T, &c[i], now), exp;

		if (!e || e->gen != c[i].gen) {
			exp = -ENOENT;
		} else if (!expired(e)) {
			exp = -EAGAIN;
			R.ctr.expiry_saved++;
		} else {
			exp = 0;
			e->live = false;
			quarantine(e->fam, e->idx, R.next_grp++);
			R.ctr.expired++;
		}
		cr_assert_eq(got, exp, "op %llu: remove_if_expired %d, want %d",
			     (unsigned long long)op_no, got, exp);
	}
}

static void op_advance(void)
{
	switch (below(8)) {
	case 0:
	case 1:
	case 2:
		now += below(3 * NAT_QUARANTINE_TICK_NS); /* within a few ticks */
		break;
	case 3:
	case 4:
		now += below(2000) * MS(1);
		break;
	case 5:
	case 6:
		now += below(15000) * MS(1);
		break;
	default:
		now += SEC(25) + below(45000) * MS(1);
		break;
	}
}

/* ---- comparison ---------------------------------------------------------------------------- */

static void check_all(void)
{
	struct snap s;
	struct nat_stats st;
	uint64_t per_state[NAT_STATE_MAX] = { 0 }, resting = 0;
	int64_t min_deadline = INT64_MAX;
	const struct nat_counters *c = nat_get_counters(T);

#define SNAP_CMP(name)                                                                         \
	s.name = ctr_get(&c->name);                                                            \
	cr_assert_eq(s.name, R.ctr.name, "op %llu: counter " #name " %llu, want %llu",          \
		     (unsigned long long)op_no, (unsigned long long)s.name,                     \
		     (unsigned long long)R.ctr.name);
	NAT_COUNTERS(SNAP_CMP)
#undef SNAP_CMP
	for (int fam = 0; fam < 2; fam++) {
		for (uint32_t i = 0; i < SPACE; i++) {
			struct ref_entry *e = by_tuple(fam, i);
			struct nat_tuple tp = tuple_of(fam, i);
			int want = e ? NAT_TUPLE_MAPPED :
				   R.claimed[fam][i] ? NAT_TUPLE_RESTING : NAT_TUPLE_FREE;

			cr_assert_eq(nat_tuple_status(T, &tp), want,
				     "op %llu: tuple %d/%u status", (unsigned long long)op_no,
				     fam, i);
			resting += want == NAT_TUPLE_RESTING;
			if (!e)
				continue;
			enum nat_state st_got;
			uint64_t gen;

			cr_assert_eq(nat_peek(T, &tp, &st_got, &gen), 0);
			cr_assert_eq(st_got, e->state, "op %llu: state of %d/%u",
				     (unsigned long long)op_no, fam, i);
			cr_assert_eq(gen, e->gen, "op %llu: gen of %d/%u",
				     (unsigned long long)op_no, fam, i);
			per_state[e->state]++;
			if (e->state != NAT_ACTIVE && e->last + timeout_of(e->state) < min_deadline)
				min_deadline = e->last + timeout_of(e->state);
		}
	}
	nat_get_stats(T, &st);
	for (int i = 0; i < NAT_STATE_MAX; i++)
		cr_assert_eq(st.entries[i], per_state[i], "op %llu: entries[%d]",
			     (unsigned long long)op_no, i);
	cr_assert_eq(st.quarantine, resting, "op %llu: quarantine", (unsigned long long)op_no);
	/* The quarantine asks to be woken a little after its oldest tuple is due. */
	for (size_t i = R.q_head; i < R.q_len; i++)
		if (!R.q[i].released &&
		    R.q[i].due * NAT_QUARANTINE_TICK_NS + NAT_QUARANTINE_WAKE_NS < min_deadline)
			min_deadline = R.q[i].due * NAT_QUARANTINE_TICK_NS + NAT_QUARANTINE_WAKE_NS;
	/* The published deadline may be early, never late, and idle means idle. */
	if (min_deadline == INT64_MAX)
		cr_assert_eq(nat_next_deadline(T), INT64_MAX, "op %llu", (unsigned long long)op_no);
	else
		cr_assert_leq(nat_next_deadline(T), min_deadline, "op %llu",
			      (unsigned long long)op_no);
}

Test(nat_ref, random_against_reference, .timeout = 120)
{
	uint64_t ops_by_kind[9] = { 0 };

	make_pool();
	memset(&R, 0, sizeof(R));
	nat_config_default(&R.cfg);
	R.cfg.max_entries = MAX_ENTRIES;
	R.cfg.n_addrs = N_ADDRS;
	R.cfg.n_listeners = N_LISTENERS;
	R.cfg.port_min = PORT_MIN;
	R.cfg.port_max = PORT_MIN + N_PORTS - 1;
	R.cfg.half_open_ns = SEC(30);
	R.cfg.linger_ns = SEC(10);
	R.cfg.quarantine_ns = SEC(20);
	R.cfg.seed = 0x1234;
	R.q = calloc(QMAX, sizeof(*R.q));
	cr_assert_not_null(R.q);
	cr_assert_eq(nat_table_new(&R.cfg, &T), 0);
	now = SEC(1000);

	for (op_no = 0; op_no < OPS; op_no++) {
		uint32_t r = below(100), kind;
		int fam;
		uint32_t idx;

		if (r < 25)
			kind = 0, op_uplink((int)below(POOL), true);
		else if (r < 42)
			kind = 1, op_uplink((int)below(POOL), false);
		else if (r < 55)
			kind = 2, pick_tuple(&fam, &idx), op_downlink(fam, idx);
		else if (r < 66)
			kind = 3, pick_tuple(&fam, &idx), op_accept(fam, idx);
		else if (r < 77)
			kind = 4, pick_tuple(&fam, &idx), op_mark_closing(fam, idx);
		else if (r < 82)
			kind = 5, op_purge();
		else if (r < 85)
			kind = 6, op_two_phase();
		else
			kind = 7, op_advance();
		ops_by_kind[kind]++;
		check_all();
	}
	/* The run must have exercised what it claims to: every outcome several times. */
	cr_expect_gt(R.ctr.replaced, 100);
	cr_expect_gt(R.ctr.expired, 1000);
	cr_expect_gt(R.ctr.expiry_saved, 100);
	cr_expect_gt(R.ctr.released, 1000);
	cr_expect_gt(R.ctr.gen_mismatch, 1000);
	cr_expect_gt(R.ctr.budget_exhausted, 100);
	cr_expect_gt(R.ctr.ports_exhausted, 100);
	cr_expect_gt(R.ctr.closed, 1000);
	cr_expect_gt(R.ctr.accept_miss, 1000);
	cr_expect_gt(R.ctr.uplink_miss, 1000);
	cr_expect_gt(partial_groups, 100);
	cr_expect_gt(R.ctr.downlink_miss, 1000);
	for (int i = 0; i < 8; i++)
		cr_expect_gt(ops_by_kind[i], 1000);
	cr_log_info("nat_ref: %llu ops, created %llu replaced %llu expired %llu saved %llu "
		    "released %llu ports_exhausted %llu budget_exhausted %llu partial %llu",
		    (unsigned long long)OPS, (unsigned long long)R.ctr.created,
		    (unsigned long long)R.ctr.replaced, (unsigned long long)R.ctr.expired,
		    (unsigned long long)R.ctr.expiry_saved, (unsigned long long)R.ctr.released,
		    (unsigned long long)R.ctr.ports_exhausted,
		    (unsigned long long)R.ctr.budget_exhausted, (unsigned long long)partial_groups);
	nat_table_free(T);
	free(R.q);
}
