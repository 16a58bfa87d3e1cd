/* test_nat_mt.c — the NAT table under concurrent use (run under TSan in the thread tree).
 *
 * Four workers create, translate (uplink and downlink), accept and close flows drawn from one
 * shared key set, so they collide on shards, keys and tuples; a fifth thread advances the
 * virtual clock, purges (both nat_purge and the explicit two phases) and trims (nat_trim gives
 * spare slab chunks, buckets and ring back under the same locks). Each worker does a
 * bounded number of operations and checks what it can see locally (a downlink never returns a
 * wrong flow); at the end, with the threads joined, the table must be consistent: entries by
 * state match the counters and a walk of every key and every tuple, each live mapping's uplink
 * and downlink agree, no tuple is mapped twice.
 * Under TSan it runs from tests/unit/mt.h's own main() (see there why).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mt.h"

#include "stacks/system/nat.h"
#include "testutil.h"

#define WORKERS 4
#define OPS_PER_WORKER 200000
#define KEYS 3000 /* 2000 IPv4, 1000 IPv6 */
#define N_ADDRS 2
#define N_LISTENERS 2
#define N_PORTS 2048
#define SPACE (N_ADDRS * N_LISTENERS * N_PORTS)
#define MAX_ENTRIES 2500
#define RECENT 64

static struct nat_table *T;
static struct nat_config C;
static struct flow_key keys[KEYS];
static _Atomic int64_t vclock;
static _Atomic int running;

struct worker {
	pthread_t thread;
	uint64_t rng;
	struct nat_tuple recent[RECENT]; /* tuples this worker saw, for downlink/accept */
	unsigned n_recent;
	struct nat_tuple accepted[RECENT]; /* tuples this worker accepted, for its guards */
	uint64_t gens[RECENT];
	unsigned n_accepted;
	unsigned long failures;
	char first_failure[160];
	unsigned long ok_ops;
};

static struct worker W[WORKERS];

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

static void make_keys(void)
{
	for (uint32_t i = 0; i < KEYS; i++) {
		struct flow_key *k = &keys[i];

		memset(k, 0, sizeof(*k));
		k->proto = IPPROTO_TCP;
		k->sport_be = htons((uint16_t)(10000 + i)); /* identifies the key */
		k->dport_be = htons(443);
		if (i < 2000) {
			uint32_t src = htonl(0x0a010000 + i % 300), dst = htonl(0x01010101 + i % 7);

			k->family = 4;
			memcpy(k->src, &src, 4);
			memcpy(k->dst, &dst, 4);
		} else {
			k->family = 6;
			k->src[0] = 0xfd;
			k->src[15] = (uint8_t)(i % 200);
			k->dst[0] = 0x20;
			k->dst[15] = (uint8_t)(i % 5);
		}
	}
}

/* The index of a key the table handed back, or -1 if it is none of ours (corrupt). */
static int key_index(const struct flow_key *k)
{
	int i = ntohs(k->sport_be) - 10000;

	if (i < 0 || i >= KEYS || memcmp(k, &keys[i], sizeof(*k)) != 0)
		return -1;
	return i;
}

static void fail(struct worker *w, const char *what, int ret)
{
	if (w->failures++ == 0)
		snprintf(w->first_failure, sizeof(w->first_failure), "%s: ret %d", what, ret);
}

static void remember(struct worker *w, const struct nat_tuple *tp)
{
	w->recent[w->n_recent++ % RECENT] = *tp;
}

/* After uplink(key) gave tp at t0: the downlink must give key back, or nothing (expired or
 * replaced meanwhile); another flow only if a whole quarantine could have passed since. */
static void check_pair(struct worker *w, int key, const struct nat_tuple *tp, int64_t t0)
{
	struct flow_key back;
	int ret = nat_downlink(T, tp, atomic_load(&vclock), &back);

	int got;

	if (ret == -ENOENT)
		return;
	if (ret != 0) {
		fail(w, "downlink after uplink", ret);
		return;
	}
	got = key_index(&back);
	if (got < 0)
		fail(w, "downlink returned a key that is not ours", 0);
	else if (got != key && atomic_load(&vclock) - t0 < C.quarantine_ns)
		fail(w, "tuple reused inside the quarantine", got);
}

static void op_uplink(struct worker *w, int key, bool syn)
{
	int64_t t0 = atomic_load(&vclock);
	struct nat_tuple tp;
	int ret = nat_uplink(T, &keys[key], syn, t0, &tp);

	if (ret == 0) {
		remember(w, &tp);
		check_pair(w, key, &tp, t0);
		w->ok_ops++;
	} else if (syn ? ret != -ENOSPC && ret != -EADDRNOTAVAIL && ret != -EBUSY :
			 ret != -ENOENT) {
		fail(w, syn ? "uplink syn" : "uplink", ret);
	}
}

static void op_tuple(struct worker *w, unsigned kind)
{
	unsigned i = (unsigned)(rnd(&w->rng) % RECENT);
	struct nat_tuple *tp = kind == 2 ? &w->accepted[i] : &w->recent[i];
	int64_t now = atomic_load(&vclock);
	struct flow_key back;
	enum nat_state st;
	uint64_t gen;
	int ret;

	if (i >= (kind == 2 ? w->n_accepted : w->n_recent))
		return;
	switch (kind) {
	case 0:
		ret = nat_downlink(T, tp, now, &back);
		if (ret == 0 && key_index(&back) < 0)
			fail(w, "downlink key", 0);
		else if (ret != 0 && ret != -ENOENT)
			fail(w, "downlink", ret);
		break;
	case 1:
		ret = nat_accept(T, tp, now, &back, &gen);
		if (ret == 0) {
			if (key_index(&back) < 0)
				fail(w, "accept key", 0);
			w->accepted[w->n_accepted % RECENT] = *tp;
			w->gens[w->n_accepted++ % RECENT] = gen;
		} else if (ret != -ENOENT) {
			fail(w, "accept", ret);
		}
		break;
	case 2:
		/* The session guard: usually the generation from our accept, sometimes stale. */
		gen = rnd(&w->rng) % 8 ? w->gens[i] : w->gens[i] - 1;
		ret = nat_mark_closing(T, tp, gen, now);
		if (ret != 0 && ret != -ENOENT && ret != -ESTALE)
			fail(w, "mark_closing", ret);
		break;
	default:
		ret = nat_peek(T, tp, &st, &gen);
		if (ret == 0 && (unsigned)st >= NAT_STATE_MAX)
			fail(w, "peek state", (int)st);
		else if (ret != 0 && ret != -ENOENT)
			fail(w, "peek", ret);
		break;
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	for (int n = 0; n < OPS_PER_WORKER; n++) {
		unsigned r = (unsigned)(rnd(&w->rng) % 100);
		int key = (int)(rnd(&w->rng) % KEYS);

		if (r < 25)
			op_uplink(w, key, true);
		else if (r < 50)
			op_uplink(w, key, false);
		else if (r < 65)
			op_tuple(w, 0);
		else if (r < 80)
			op_tuple(w, 1);
		else if (r < 95)
			op_tuple(w, 2);
		else
			op_tuple(w, 3);
	}
	return NULL;
}

/* Advances the virtual clock 1 ms per round and cleans up, until the workers are done. */
static void *purger_main(void *arg)
{
	unsigned long *rounds = arg;
	struct nat_candidate c[16];

	while (atomic_load(&running)) {
		int64_t now = atomic_fetch_add(&vclock, MS(1)) + MS(1);

		if (++*rounds % 8 == 0) {
			size_t n = nat_collect_expired(T, now, c, 16);

			sched_yield(); /* let packets race phase 2 */
			for (size_t i = 0; i < n; i++) {
				int ret = nat_remove_if_expired(T, &c[i], atomic_load(&vclock));

				if (ret != 0 && ret != -EAGAIN && ret != -ENOENT)
					atomic_store(&running, -1);
			}
		} else {
			nat_purge(T, now, 128);
		}
		if (*rounds % 64 == 0)
			nat_trim(T, false); /* memory back while the workers run: nothing live moves */
		sched_yield();
	}
	return NULL;
}

/* Every key's mapping (uplink) and its tuple's mapping (downlink) agree; no tuple is shared;
 * the per-state counts of the walk equal the stats. Returns the number of mappings. */
static uint64_t walk_keys(const struct nat_stats *st)
{
	static bool used[2][SPACE];
	uint64_t by_state[NAT_STATE_MAX] = { 0 }, n = 0;
	int64_t now = atomic_load(&vclock);

	memset(used, 0, sizeof(used));
	for (int i = 0; i < KEYS; i++) {
		struct nat_tuple tp;
		struct flow_key back;
		enum nat_state s;
		uint64_t gen;
		int ret = nat_uplink(T, &keys[i], false, now, &tp);

		if (ret == -ENOENT)
			continue;
		CHECK_EQ(ret, 0);
		uint32_t idx = ((uint32_t)(tp.port - C.port_min) * N_ADDRS + tp.addr) *
				       N_LISTENERS + tp.listener;

		CHECK_EQ(tp.family, keys[i].family);
		CHECK_LT(idx, SPACE);
		CHECK(!(used[tp.family == 6][idx]));
		used[tp.family == 6][idx] = true;
		CHECK_EQ(nat_downlink(T, &tp, now, &back), 0);
		CHECK_EQ(memcmp(&back, &keys[i], sizeof(back)), 0);
		CHECK_EQ(nat_peek(T, &tp, &s, &gen), 0);
		by_state[s]++;
		n++;
	}
	for (int s = 0; s < NAT_STATE_MAX; s++)
		CHECK_EQ(by_state[s], st->entries[s]);
	return n;
}

/* Every tuple's status agrees with the counts: mapped == live entries, resting == quarantine. */
static void walk_tuples(uint64_t live, uint64_t quarantine)
{
	uint64_t mapped = 0, resting = 0;

	for (int f = 0; f < 2; f++)
		for (uint32_t i = 0; i < SPACE; i++) {
			struct nat_tuple tp = {
				.family = f ? 6 : 4,
				.listener = (uint8_t)(i % N_LISTENERS),
				.addr = (uint8_t)(i / N_LISTENERS % N_ADDRS),
				.port = (uint16_t)(C.port_min + i / (N_LISTENERS * N_ADDRS)),
			};
			int s = nat_tuple_status(T, &tp);

			mapped += s == NAT_TUPLE_MAPPED;
			resting += s == NAT_TUPLE_RESTING;
		}
	CHECK_EQ(mapped, live);
	CHECK_EQ(resting, quarantine);
}

static void check_consistent(void)
{
	const struct nat_counters *c = nat_get_counters(T);
	struct nat_stats st;
	uint64_t live, sum = 0;

	nat_get_stats(T, &st);
	for (int s = 0; s < NAT_STATE_MAX; s++)
		sum += st.entries[s];
	live = ctr_get(&c->created) - ctr_get(&c->replaced) - ctr_get(&c->expired);
	CHECK_EQ(sum, live);
	CHECK_LEQ(sum, MAX_ENTRIES);
	CHECK_EQ(st.quarantine, ctr_get(&c->quarantined) - ctr_get(&c->released));
	CHECK_EQ(ctr_get(&c->quarantined), ctr_get(&c->replaced) + ctr_get(&c->expired));
	CHECK_EQ(walk_keys(&st), sum);
	walk_tuples(sum, st.quarantine);
}

static void report(unsigned long rounds)
{
	const struct nat_counters *c = nat_get_counters(T);

#define C_(name) (unsigned long long)ctr_get(&c->name)
	fprintf(stderr, "nat_mt: %lu purger rounds; created %llu accepted %llu closed %llu "
		"replaced %llu expired %llu saved %llu released %llu budget %llu ports %llu\n",
		rounds, C_(created), C_(accepted), C_(closed), C_(replaced), C_(expired),
		C_(expiry_saved), C_(released), C_(budget_exhausted), C_(ports_exhausted));
#undef C_
	/* The run did what it claims to. */
	CHECK_GT(ctr_get(&c->created), 1000);
	CHECK_GT(ctr_get(&c->accepted), 1000);
	CHECK_GT(ctr_get(&c->closed), 100);
	CHECK_GT(ctr_get(&c->expired), 100);
	CHECK_GT(ctr_get(&c->replaced), 0);
}

/* Every HALF_OPEN entry gave its per-source count back, whichever way it left: the IPv6 keys'
 * one /64, emptied, takes exactly half_open_per_host new SYNs again. */
static void check_share_returned(int64_t now)
{
	const struct nat_counters *c = nat_get_counters(T);
	uint64_t refused = ctr_get(&c->half_open_host);
	struct nat_tuple tp;

	CHECK_GT(refused, 0); /* the run did reach the limit */
	for (uint32_t i = 0; i < C.half_open_per_host; i++)
		CHECK_EQ(nat_uplink(T, &keys[2000 + i], true, now, &tp), 0);
	CHECK_EQ(nat_uplink(T, &keys[2000 + C.half_open_per_host], true, now, &tp), -EBUSY);
	CHECK_EQ(ctr_get(&c->half_open_host), refused + 1);
}

/* Close every ACTIVE mapping and let everything run out: the table must end empty. */
static void drain(void)
{
	int64_t now = atomic_load(&vclock);
	struct nat_stats st;

	for (int i = 0; i < KEYS; i++) {
		struct nat_tuple tp;
		enum nat_state s;
		uint64_t gen;

		if (nat_uplink(T, &keys[i], false, now, &tp) != 0)
			continue;
		CHECK_EQ(nat_peek(T, &tp, &s, &gen), 0);
		if (s == NAT_ACTIVE)
			CHECK_EQ(nat_mark_closing(T, &tp, gen, now), 0);
	}
	now += C.half_open_ns + C.linger_ns;
	while (nat_next_deadline(T) <= now)
		nat_purge(T, now, 256);
	now += C.quarantine_ns + NAT_QUARANTINE_TICK_NS;
	nat_purge(T, now, SPACE * 2);
	check_consistent();
	nat_get_stats(T, &st);
	CHECK_EQ(st.entries[NAT_HALF_OPEN] + st.entries[NAT_ACTIVE] + st.entries[NAT_CLOSING], 0);
	CHECK_EQ(st.quarantine, 0);
	CHECK_EQ(nat_next_deadline(T), INT64_MAX);
	check_share_returned(now);
}

MT_TEST(nat_mt, concurrent_workers_and_purger)
{
	pthread_t purger;
	unsigned long rounds = 0;
	int was;

	make_keys();
	nat_config_default(&C);
	C.max_entries = MAX_ENTRIES;
	C.n_addrs = N_ADDRS;
	C.n_listeners = N_LISTENERS;
	C.port_min = 20000;
	C.port_max = 20000 + N_PORTS - 1;
	C.half_open_ns = MS(20);
	C.linger_ns = MS(10);
	C.quarantine_ns = MS(500);
	C.seed = 7;
	/* Count every HALF_OPEN entry per source; the IPv6 keys share one /64 and reach its limit. */
	C.half_open_quiet = 0;
	C.half_open_per_host = 64;
	C.half_open_per_net = 600;
	CHECK_EQ(nat_table_new(&C, &T), 0);
	atomic_store(&vclock, SEC(1));
	atomic_store(&running, 1);

	CHECK_EQ(pthread_create(&purger, NULL, purger_main, &rounds), 0);
	for (int i = 0; i < WORKERS; i++) {
		W[i].rng = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1);
		CHECK_EQ(pthread_create(&W[i].thread, NULL, worker_main, &W[i]), 0);
	}
	for (int i = 0; i < WORKERS; i++)
		CHECK_EQ(pthread_join(W[i].thread, NULL), 0);
	was = atomic_exchange(&running, 0);
	CHECK_EQ(pthread_join(purger, NULL), 0);
	CHECK_EQ(was, 1); /* else phase 2 returned an unexpected error */
	for (int i = 0; i < WORKERS; i++) {
		if (W[i].failures)
			fprintf(stderr, "worker %d: %lu failures, first: %s\n", i, W[i].failures,
				W[i].first_failure);
		CHECK_EQ(W[i].failures, 0);
	}
	report(rounds);
	check_consistent();
	drain();
	nat_table_free(T);
}
