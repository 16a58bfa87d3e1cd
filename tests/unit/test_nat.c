/* test_nat.c — the NAT table's contracts (stacks/system/nat.h), one behaviour per test, on a
 * virtual clock. Every test checks the counters it should move, and that the others stay put.
 * The table is built into this file (nat.c included, not linked) so that one test can break an
 * invariant on purpose and see the counter that watches it move. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>

#include "stacks/system/nat.c"
#include "testutil.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* The counters as plain numbers, so deltas can be written as designated initializers. */
struct snap {
#define SNAP_FIELD(name) uint64_t name;
	NAT_COUNTERS(SNAP_FIELD)
#undef SNAP_FIELD
};

static struct snap snap(const struct nat_table *t)
{
	const struct nat_counters *c = nat_get_counters(t);
	struct snap s;

#define SNAP_GET(name) s.name = ctr_get(&c->name);
	NAT_COUNTERS(SNAP_GET)
#undef SNAP_GET
	return s;
}

/* Every counter moved by exactly want since before (unnamed fields: by zero). */
static void expect_delta(const struct snap *before, const struct nat_table *t, struct snap want)
{
	struct snap now = snap(t);

#define SNAP_CHECK(name)                                                                       \
	cr_expect_eq(now.name - before->name, want.name, "counter %s: moved %llu, want %llu",   \
		     #name, (unsigned long long)(now.name - before->name),                      \
		     (unsigned long long)want.name);
	NAT_COUNTERS(SNAP_CHECK)
#undef SNAP_CHECK
}

#define DELTA(before, t, ...) expect_delta(&(before), (t), (struct snap){ __VA_ARGS__ })

static struct flow_key key4(uint32_t client, uint16_t cport, uint32_t server, uint16_t sport)
{
	struct flow_key k;
	uint32_t c = htonl(client), s = htonl(server);

	memset(&k, 0, sizeof(k));
	k.family = 4;
	k.proto = IPPROTO_TCP;
	k.sport_be = htons(cport);
	k.dport_be = htons(sport);
	memcpy(k.src, &c, 4);
	memcpy(k.dst, &s, 4);
	return k;
}

static struct flow_key key6(uint16_t client, uint16_t cport, uint16_t server, uint16_t sport)
{
	struct flow_key k;

	memset(&k, 0, sizeof(k));
	k.family = 6;
	k.proto = IPPROTO_TCP;
	k.sport_be = htons(cport);
	k.dport_be = htons(sport);
	k.src[0] = 0xfd;
	k.src[14] = (uint8_t)(client >> 8);
	k.src[15] = (uint8_t)client;
	k.dst[0] = 0x20;
	k.dst[1] = 0x01;
	k.dst[14] = (uint8_t)(server >> 8);
	k.dst[15] = (uint8_t)server;
	return k;
}

/* Flow n: distinct client port per n, same client and server. */
static struct flow_key flow(uint32_t n)
{
	return key4(0xc6120009, (uint16_t)(20000 + n), 0x01010101, 443);
}

static struct nat_config cfg_small(void)
{
	struct nat_config c;

	nat_config_default(&c);
	c.max_entries = 1000;
	c.n_addrs = 2;
	c.n_listeners = 2;
	c.port_min = 10000;
	c.port_max = 10099;
	c.half_open_ns = SEC(30);
	c.linger_ns = SEC(10);
	c.quarantine_ns = SEC(60);
	c.seed = 42;
	return c;
}

static struct nat_table *table(const struct nat_config *c)
{
	struct nat_table *t = NULL;

	cr_assert_eq(nat_table_new(c, &t), 0);
	cr_assert_not_null(t);
	return t;
}

static bool tuple_eq(const struct nat_tuple *a, const struct nat_tuple *b)
{
	return a->family == b->family && a->addr == b->addr && a->listener == b->listener &&
	       a->port == b->port;
}

/* Position of a tuple in the allocation order: listener fastest, then address, then port. */
static uint32_t tuple_index(const struct nat_config *c, const struct nat_tuple *tp)
{
	return ((uint32_t)(tp->port - c->port_min) * c->n_addrs + tp->addr) * c->n_listeners +
	       tp->listener;
}

static enum nat_state state_of(struct nat_table *t, const struct nat_tuple *tp, uint64_t *gen)
{
	enum nat_state s = NAT_STATE_MAX;
	uint64_t g = 0;

	cr_assert_eq(nat_peek(t, tp, &s, &g), 0, "tuple port %u has no mapping", tp->port);
	if (gen)
		*gen = g;
	return s;
}

static void expect_entries(struct nat_table *t, uint64_t half_open, uint64_t active,
			   uint64_t closing, uint64_t quarantine)
{
	struct nat_stats st;

	nat_get_stats(t, &st);
	cr_expect_eq(st.entries[NAT_HALF_OPEN], half_open, "half_open %llu",
		     (unsigned long long)st.entries[NAT_HALF_OPEN]);
	cr_expect_eq(st.entries[NAT_ACTIVE], active, "active %llu",
		     (unsigned long long)st.entries[NAT_ACTIVE]);
	cr_expect_eq(st.entries[NAT_CLOSING], closing, "closing %llu",
		     (unsigned long long)st.entries[NAT_CLOSING]);
	cr_expect_eq(st.quarantine, quarantine, "quarantine %llu",
		     (unsigned long long)st.quarantine);
}

/* Accepted and marked CLOSING at now; returns the accept generation. */
static uint64_t open_and_close(struct nat_table *t, const struct flow_key *k, int64_t now,
			       struct nat_tuple *tp)
{
	struct flow_key back;
	uint64_t gen;

	cr_assert_eq(nat_uplink(t, k, true, now, tp), 0);
	cr_assert_eq(nat_accept(t, tp, now, &back, &gen), 0);
	cr_assert_eq(nat_mark_closing(t, tp, gen, now), 0);
	return gen;
}

/* What nat_next_deadline asks for a quarantine whose oldest tuple was freed at freed. */
static int64_t q_wake(const struct nat_config *c, int64_t freed)
{
	return (freed + c->quarantine_ns + NAT_QUARANTINE_TICK_NS - 1) / NAT_QUARANTINE_TICK_NS *
		       NAT_QUARANTINE_TICK_NS +
	       NAT_QUARANTINE_WAKE_NS;
}

/* ---- configuration ------------------------------------------------------------------------ */

Test(nat, config_defaults)
{
	struct nat_config c;

	nat_config_default(&c);
	cr_expect_eq(c.max_entries, 65536);
	cr_expect_eq(c.n_addrs, 4);
	cr_expect_eq(c.n_listeners, 2);
	cr_expect_eq(c.port_min, 1024);
	cr_expect_eq(c.port_max, 65535);
	cr_expect_eq(c.half_open_ns, SEC(30));
	cr_expect_eq(c.linger_ns, SEC(10));
	cr_expect_eq(c.quarantine_ns, SEC(60));
	cr_expect_str_eq(nat_state_name(NAT_HALF_OPEN), "half_open");
	cr_expect_str_eq(nat_state_name(NAT_ACTIVE), "active");
	cr_expect_str_eq(nat_state_name(NAT_CLOSING), "closing");
	cr_expect_str_eq(nat_state_name(NAT_STATE_MAX), "invalid");
}

Test(nat, bad_configs_are_einval)
{
	struct nat_config good = cfg_small(), c;
	struct nat_table *t = (struct nat_table *)&good; /* must be reset to NULL */

#define BAD(stmt)                                                                              \
	do {                                                                                   \
		c = good;                                                                      \
		stmt;                                                                          \
		t = (struct nat_table *)&good;                                                 \
		cr_expect_eq(nat_table_new(&c, &t), -EINVAL, "accepted: " #stmt);               \
		cr_expect_null(t, "out not cleared: " #stmt);                                   \
	} while (0)
	BAD(c.max_entries = 0);
	BAD(c.n_addrs = 0);
	BAD(c.n_addrs = NAT_MAX_ADDRS + 1);
	BAD(c.n_listeners = 0);
	BAD(c.n_listeners = NAT_MAX_LISTENERS + 1);
	BAD(c.port_min = 0);
	BAD((c.port_min = 2000, c.port_max = 1999));
	BAD(c.half_open_ns = 0);
	BAD(c.half_open_ns = -1);
	BAD(c.linger_ns = -1);
	BAD(c.quarantine_ns = -1);
	BAD(c.quarantine_ns = NAT_TIMEOUT_MAX_NS + 1);
	BAD(c.linger_ns = NAT_TIMEOUT_MAX_NS + 1);
#undef BAD
	cr_expect_eq(nat_table_new(NULL, &t), -EINVAL);

	/* The edges are fine. */
	c = good;
	c.n_addrs = NAT_MAX_ADDRS;
	c.n_listeners = NAT_MAX_LISTENERS;
	c.port_min = c.port_max = 1;
	c.linger_ns = 0;
	c.quarantine_ns = NAT_TIMEOUT_MAX_NS;
	cr_assert_eq(nat_table_new(&c, &t), 0);
	nat_table_free(t);
	nat_table_free(NULL);
}

/* ---- translation -------------------------------------------------------------------------- */

static void create_and_restore(const struct flow_key *k)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct nat_tuple tp, again;
	struct flow_key back;
	struct snap s0 = snap(t);

	cr_assert_eq(nat_uplink(t, k, true, SEC(1), &tp), 0);
	cr_expect_eq(tp.family, k->family);
	cr_expect_lt(tp.addr, c.n_addrs);
	cr_expect_lt(tp.listener, c.n_listeners);
	cr_expect(tp.port >= c.port_min && tp.port <= c.port_max, "port %u", tp.port);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_HALF_OPEN);
	DELTA(s0, t, .created = 1);
	expect_entries(t, 1, 0, 0, 0);

	/* Later segments of the flow (no SYN) find the same tuple. */
	cr_assert_eq(nat_uplink(t, k, false, SEC(2), &again), 0);
	cr_expect(tuple_eq(&tp, &again));
	/* The downlink restores the original pair, byte for byte. */
	memset(&back, 0xa5, sizeof(back));
	cr_assert_eq(nat_downlink(t, &tp, SEC(2), &back), 0);
	cr_expect_eq(memcmp(&back, k, sizeof(back)), 0);
	cr_expect_eq(nat_tuple_status(t, &tp), NAT_TUPLE_MAPPED);
	DELTA(s0, t, .created = 1);
	nat_table_free(t);
}

Test(nat, create_lookup_downlink_v4)
{
	struct flow_key k = key4(0x0a000002, 51000, 0x5db8d822, 443);

	create_and_restore(&k);
}

Test(nat, create_lookup_downlink_v6)
{
	struct flow_key k = key6(0x1234, 51000, 0x0042, 8443);

	create_and_restore(&k);
}

Test(nat, full_pair_is_the_key)
{
	/* Same source, two destinations (sing-box #4224): two mappings, each restores its own. */
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key a = key4(0x0a000002, 51000, 0x01010101, 443);
	struct flow_key b = key4(0x0a000002, 51000, 0x08080808, 443);
	struct flow_key v6 = key6(2, 51000, 0x0101, 443);
	struct nat_tuple ta, tb, t6;
	struct flow_key back;

	cr_assert_eq(nat_uplink(t, &a, true, SEC(1), &ta), 0);
	cr_assert_eq(nat_uplink(t, &b, true, SEC(1), &tb), 0);
	cr_assert_eq(nat_uplink(t, &v6, true, SEC(1), &t6), 0);
	cr_expect_not(tuple_eq(&ta, &tb));
	cr_expect_eq(t6.family, 6);
	cr_assert_eq(nat_downlink(t, &ta, SEC(1), &back), 0);
	cr_expect_eq(memcmp(&back, &a, sizeof(back)), 0);
	cr_assert_eq(nat_downlink(t, &tb, SEC(1), &back), 0);
	cr_expect_eq(memcmp(&back, &b, sizeof(back)), 0);
	cr_assert_eq(nat_downlink(t, &t6, SEC(1), &back), 0);
	cr_expect_eq(memcmp(&back, &v6, sizeof(back)), 0);
	expect_entries(t, 3, 0, 0, 0);
	nat_table_free(t);
}

Test(nat, non_syn_without_mapping_never_allocates)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1);
	struct nat_tuple tp;
	struct snap s0 = snap(t);

	cr_expect_eq(nat_uplink(t, &k, false, SEC(1), &tp), -ENOENT);
	cr_expect_eq(nat_uplink(t, &k, false, SEC(2), &tp), -ENOENT);
	DELTA(s0, t, .uplink_miss = 2);
	expect_entries(t, 0, 0, 0, 0);
	cr_expect_eq(nat_next_deadline(t), INT64_MAX);
	nat_table_free(t);
}

Test(nat, downlink_miss_and_bad_input)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct nat_tuple tp = { .family = 4, .addr = 0, .listener = 0, .port = 10000 };
	struct nat_tuple out_of_space = { .family = 4, .addr = 7, .listener = 0, .port = 10000 };
	struct flow_key back, k = flow(1);
	uint64_t gen;
	struct snap s0 = snap(t);

	cr_expect_eq(nat_downlink(t, &tp, SEC(1), &back), -ENOENT);
	cr_expect_eq(nat_downlink(t, &out_of_space, SEC(1), &back), -ENOENT);
	cr_expect_eq(nat_accept(t, &out_of_space, SEC(1), &back, &gen), -ENOENT);
	cr_expect_eq(nat_mark_closing(t, &out_of_space, 1, SEC(1)), -ENOENT);
	DELTA(s0, t, .downlink_miss = 2, .accept_miss = 1);
	cr_expect_eq(nat_tuple_status(t, &out_of_space), -EINVAL);
	cr_expect_eq(nat_tuple_status(t, &tp), NAT_TUPLE_FREE);
	k.family = 5;
	cr_expect_eq(nat_uplink(t, &k, true, SEC(1), &tp), -EINVAL);
	expect_entries(t, 0, 0, 0, 0);
	nat_table_free(t);
}

/* ---- states and generations ---------------------------------------------------------------- */

Test(nat, states_and_transitions)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), back;
	struct nat_tuple tp, again;
	uint64_t g0, g1, g2, gen;
	struct snap s0 = snap(t);

	cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp), 0);
	cr_expect_eq(state_of(t, &tp, &g0), NAT_HALF_OPEN);
	/* Not accepted yet: nobody holds a generation for it, closing it is refused. */
	cr_expect_eq(nat_mark_closing(t, &tp, g0, SEC(1)), -ESTALE);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_HALF_OPEN);

	cr_assert_eq(nat_accept(t, &tp, SEC(2), &back, &g1), 0);
	cr_expect_eq(memcmp(&back, &k, sizeof(back)), 0);
	cr_expect_neq(g1, g0, "accept stamps a new generation");
	cr_expect_eq(state_of(t, &tp, &gen), NAT_ACTIVE);
	cr_expect_eq(gen, g1);
	expect_entries(t, 0, 1, 0, 0);
	/* A second accept of the same tuple: not HALF_OPEN any more. */
	cr_expect_eq(nat_accept(t, &tp, SEC(2), &back, &gen), -ENOENT);
	/* A pure SYN on ACTIVE (a retransmit racing the accept) keeps the mapping. */
	cr_assert_eq(nat_uplink(t, &k, true, SEC(2), &again), 0);
	cr_expect(tuple_eq(&tp, &again));
	cr_expect_eq(state_of(t, &tp, &gen), NAT_ACTIVE);
	cr_expect_eq(gen, g1);

	/* A stale generation (an older session's guard) is ignored. */
	cr_expect_eq(nat_mark_closing(t, &tp, g0, SEC(3)), -ESTALE);
	cr_expect_eq(nat_mark_closing(t, &tp, g1 + 1000, SEC(3)), -ESTALE);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_ACTIVE);

	cr_expect_eq(nat_mark_closing(t, &tp, g1, SEC(3)), 0);
	cr_expect_eq(state_of(t, &tp, &g2), NAT_CLOSING);
	cr_expect_eq(g2, g1, "closing keeps the generation");
	expect_entries(t, 0, 0, 1, 0);
	/* Idempotent; still a stale generation is refused. */
	cr_expect_eq(nat_mark_closing(t, &tp, g1, SEC(4)), 0);
	cr_expect_eq(nat_mark_closing(t, &tp, g0, SEC(4)), -ESTALE);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_CLOSING);
	/* CLOSING still translates (the kernel's FIN/ACK). */
	cr_assert_eq(nat_downlink(t, &tp, SEC(4), &back), 0);
	cr_expect_eq(memcmp(&back, &k, sizeof(back)), 0);
	cr_assert_eq(nat_uplink(t, &k, false, SEC(4), &again), 0);
	cr_expect(tuple_eq(&tp, &again));
	DELTA(s0, t, .created = 1, .accepted = 1, .accept_miss = 1, .closed = 1,
	      .gen_mismatch = 4);

	/* Unknown tuple. */
	again.port = (uint16_t)(tp.port == c.port_max ? c.port_min : tp.port + 1);
	again.listener = tp.listener;
	cr_expect_eq(nat_mark_closing(t, &again, g1, SEC(4)), -ENOENT);
	nat_table_free(t);
}

Test(nat, syn_retransmit_reuses_half_open)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1);
	struct nat_tuple a, b;
	uint64_t ga, gb;
	struct snap s0 = snap(t);

	cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &a), 0);
	state_of(t, &a, &ga);
	cr_assert_eq(nat_uplink(t, &k, true, SEC(2), &b), 0);
	cr_expect(tuple_eq(&a, &b));
	state_of(t, &b, &gb);
	cr_expect_eq(ga, gb);
	DELTA(s0, t, .created = 1);
	/* The retransmit did not refresh it: the half-open lifetime counts from the first SYN. */
	cr_expect_eq(nat_purge(t, SEC(1) + c.half_open_ns - 1, 100), 0);
	cr_expect_eq(nat_purge(t, SEC(1) + c.half_open_ns, 100), 1);
	nat_table_free(t);
}

Test(nat, syn_on_closing_gets_a_different_tuple)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), back;
	struct nat_tuple old, neu;
	struct nat_candidate cand;
	uint64_t gold, gnew;
	struct snap s0;

	gold = open_and_close(t, &k, SEC(1), &old);
	/* The old linger is due at SEC(11): collect it now, as a slow cleanup would. */
	cr_assert_eq(nat_collect_expired(t, SEC(11), &cand, 1), 1);
	cr_expect(tuple_eq(&cand.tuple, &old));
	s0 = snap(t);
	/* The client reconnects from the same port (pure SYN). */
	cr_assert_eq(nat_uplink(t, &k, true, SEC(12), &neu), 0);
	cr_expect_not(tuple_eq(&old, &neu), "reconnect reused the lingering tuple");
	cr_expect_eq(state_of(t, &neu, &gnew), NAT_HALF_OPEN);
	cr_expect_neq(gnew, gold);
	DELTA(s0, t, .created = 1, .replaced = 1, .quarantined = 1);
	expect_entries(t, 1, 0, 0, 1);
	/* The old tuple is gone and resting. */
	cr_expect_eq(nat_downlink(t, &old, SEC(12), &back), -ENOENT);
	cr_expect_eq(nat_tuple_status(t, &old), NAT_TUPLE_RESTING);

	/* The old session's guard and the old cleanup cannot touch the new mapping. */
	cr_expect_eq(nat_mark_closing(t, &old, gold, SEC(13)), -ENOENT);
	cr_expect_eq(nat_mark_closing(t, &neu, gold, SEC(13)), -ESTALE);
	cr_expect_eq(nat_remove_if_expired(t, &cand, SEC(13)), -ENOENT);
	cr_expect_eq(nat_purge(t, SEC(30), 100), 0);
	cr_expect_eq(state_of(t, &neu, NULL), NAT_HALF_OPEN);
	cr_assert_eq(nat_downlink(t, &neu, SEC(30), &back), 0);
	cr_expect_eq(memcmp(&back, &k, sizeof(back)), 0);
	/* The new mapping lives its own life: accepted, then expires only when closed. */
	cr_assert_eq(nat_accept(t, &neu, SEC(31), &back, &gnew), 0);
	cr_expect_eq(nat_purge(t, SEC(1000), 100), 0);
	cr_expect_eq(state_of(t, &neu, NULL), NAT_ACTIVE);
	nat_table_free(t);
}

Test(nat, replacement_needs_no_budget_and_keeps_old_when_no_tuple)
{
	/* Budget for two entries, three tuples. */
	struct nat_config c = cfg_small();
	struct nat_table *t;
	struct flow_key k = flow(1), other = flow(2), back;
	struct nat_tuple a, b, o, x;
	uint64_t gen;
	struct snap s0;

	c.n_addrs = 1;
	c.n_listeners = 1;
	c.port_min = 5000;
	c.port_max = 5002;
	c.max_entries = 2;
	t = table(&c);
	open_and_close(t, &k, SEC(1), &a);
	cr_assert_eq(nat_uplink(t, &other, true, SEC(1), &o), 0);
	/* The budget is full, yet a reconnect replaces its CLOSING mapping. */
	s0 = snap(t);
	cr_assert_eq(nat_uplink(t, &k, true, SEC(2), &b), 0);
	DELTA(s0, t, .created = 1, .replaced = 1, .quarantined = 1);
	cr_expect_not(tuple_eq(&a, &b));
	cr_expect_not(tuple_eq(&o, &b));
	/* Closed again; now the only other tuple rests: the next reconnect is refused and
	 * the CLOSING mapping is left exactly as it was. */
	cr_assert_eq(nat_accept(t, &b, SEC(3), &back, &gen), 0);
	cr_assert_eq(nat_mark_closing(t, &b, gen, SEC(3)), 0);
	s0 = snap(t);
	cr_expect_eq(nat_uplink(t, &k, true, SEC(4), &x), -EADDRNOTAVAIL);
	DELTA(s0, t, .ports_exhausted = 1);
	cr_expect_eq(state_of(t, &b, NULL), NAT_CLOSING);
	cr_assert_eq(nat_downlink(t, &b, SEC(4), &back), 0);
	cr_expect_eq(memcmp(&back, &k, sizeof(back)), 0);
	cr_expect_eq(nat_tuple_status(t, &a), NAT_TUPLE_RESTING);
	expect_entries(t, 1, 0, 1, 1);
	nat_table_free(t);
}

/* ---- expiry -------------------------------------------------------------------------------- */

Test(nat, half_open_expires_without_accept)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), back;
	struct nat_tuple tp;
	struct snap s0;

	cr_assert_eq(nat_uplink(t, &k, true, SEC(5), &tp), 0);
	s0 = snap(t);
	cr_expect_eq(nat_purge(t, SEC(5) + c.half_open_ns - 1, 100), 0);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_HALF_OPEN);
	DELTA(s0, t, .created = 0);
	cr_expect_eq(nat_purge(t, SEC(5) + c.half_open_ns, 100), 1);
	DELTA(s0, t, .expired = 1, .quarantined = 1);
	expect_entries(t, 0, 0, 0, 1);
	cr_expect_eq(nat_downlink(t, &tp, SEC(36), &back), -ENOENT);
	cr_expect_eq(nat_uplink(t, &k, false, SEC(36), &tp), -ENOENT);
	cr_expect_eq(nat_tuple_status(t, &tp), NAT_TUPLE_RESTING);
	nat_table_free(t);
}

/* A RST on a HALF_OPEN entry (the app gave up the handshake: a SYN scan's RST after the
 * SYN-ACK) ends it NAT_RST_LINGER_NS later instead of at half_open_timeout: the HALF_OPEN share
 * is not held by connections that no longer exist. Nothing else moves: not an ACTIVE or a
 * CLOSING entry, not a later deadline than the one it has. */
Test(nat, rst_on_half_open_ends_it_soon)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), k2 = flow(2);
	struct nat_tuple tp, tp2, again;
	struct snap s0;
	uint64_t gen;

	cr_assert_eq(nat_uplink(t, &k, true, SEC(5), &tp), 0);
	cr_assert_eq(nat_uplink(t, &k2, true, SEC(5), &tp2), 0);
	s0 = snap(t);
	cr_assert_eq(nat_uplink_rst(t, &k, SEC(6)), 1, "shortened");
	cr_assert_eq(nat_uplink_rst(t, &k, SEC(6) + 1), 0, "never pushed later again");
	DELTA(s0, t, .half_open_reset = 1);
	cr_assert_eq(nat_uplink(t, &k, false, SEC(6), &again), 0, "mapped until then");
	cr_assert_eq(memcmp(&again, &tp, sizeof(tp)), 0);
	cr_assert_leq(nat_next_deadline(t), SEC(6) + NAT_RST_LINGER_NS);
	cr_expect_eq(nat_purge(t, SEC(6) + NAT_RST_LINGER_NS - 1, 100), 0);
	cr_expect_eq(nat_purge(t, SEC(6) + NAT_RST_LINGER_NS, 100), 1);
	DELTA(s0, t, .half_open_reset = 1, .expired = 1, .quarantined = 1);
	cr_expect_eq(state_of(t, &tp2, NULL), NAT_HALF_OPEN, "the other keeps its timeout");
	expect_entries(t, 1, 0, 0, 1);
	/* ACTIVE: a RST is the kernel's to act on; the session closes as any other. */
	cr_assert_eq(nat_accept(t, &tp2, SEC(7), &k2, &gen), 0);
	cr_assert_eq(nat_uplink_rst(t, &k2, SEC(8)), 0);
	cr_assert_eq(state_of(t, &tp2, NULL), NAT_ACTIVE);
	cr_assert_eq(nat_uplink_rst(t, &k, SEC(8)), 0, "no mapping");
	nat_table_free(t);
}

Test(nat, active_never_expires)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), back;
	struct nat_tuple tp;
	uint64_t gen;

	cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp), 0);
	cr_assert_eq(nat_accept(t, &tp, SEC(1), &back, &gen), 0);
	cr_expect_eq(nat_next_deadline(t), INT64_MAX);
	cr_expect_eq(nat_purge(t, SEC(86400), 1000), 0);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_ACTIVE);
	nat_table_free(t);
}

Test(nat, expired_then_refreshed_survives)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), k2 = flow(2), k3 = flow(3), back;
	struct nat_tuple tp, tp2, tp3, again;
	struct nat_candidate cand[4];
	int64_t due = SEC(1) + c.linger_ns;
	struct snap s0;

	/* Two CLOSING entries (packets refresh them), and a HALF_OPEN one (nothing does). */
	open_and_close(t, &k, SEC(1), &tp);
	open_and_close(t, &k2, SEC(1), &tp2);
	cr_assert_eq(nat_uplink(t, &k3, true, due - c.half_open_ns, &tp3), 0);
	cr_assert_eq(nat_collect_expired(t, due, cand, 4), 3);
	/* Out of the heap while they are candidates... */
	cr_expect_eq(nat_next_deadline(t), INT64_MAX);
	s0 = snap(t);
	/* ... and a packet arrives for each between the phases: one uplink, one downlink. */
	cr_assert_eq(nat_uplink(t, &k, false, due, &again), 0);
	cr_assert_eq(nat_downlink(t, &tp2, due, &back), 0);
	cr_assert_eq(nat_uplink(t, &k3, true, due, &again), 0);
	cr_assert_eq(nat_downlink(t, &tp3, due, &back), 0);
	for (int i = 0; i < 3; i++)
		cr_expect_eq(nat_remove_if_expired(t, &cand[i], due),
			     tuple_eq(&cand[i].tuple, &tp3) ? 0 : -EAGAIN);
	DELTA(s0, t, .expiry_saved = 2, .expired = 1, .quarantined = 1);
	/* Both still work and were re-armed with their real deadlines. */
	cr_assert_eq(nat_downlink(t, &tp, due, &back), 0);
	cr_expect_eq(memcmp(&back, &k, sizeof(back)), 0);
	cr_assert_eq(nat_uplink(t, &k2, false, due, &again), 0);
	cr_expect(tuple_eq(&again, &tp2));
	expect_entries(t, 0, 0, 2, 1);
	cr_expect_eq(nat_next_deadline(t), due + c.linger_ns);
	cr_expect_eq(nat_purge(t, due + c.linger_ns, 10), 2);
	nat_table_free(t);
}

Test(nat, candidate_accepted_between_phases_is_kept)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), back;
	struct nat_tuple tp;
	struct nat_candidate cand;
	int64_t due = SEC(1) + c.half_open_ns;
	uint64_t gen;

	cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp), 0);
	cr_assert_eq(nat_collect_expired(t, due, &cand, 1), 1);
	cr_assert_eq(nat_accept(t, &tp, due, &back, &gen), 0);
	cr_expect_eq(nat_remove_if_expired(t, &cand, due), -ENOENT);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_ACTIVE);
	cr_expect_eq(nat_next_deadline(t), INT64_MAX);
	/* Closing it later arms it normally. */
	cr_assert_eq(nat_mark_closing(t, &tp, gen, due + SEC(1)), 0);
	cr_expect_eq(nat_next_deadline(t), due + SEC(1) + c.linger_ns);
	cr_expect_eq(nat_purge(t, due + SEC(1) + c.linger_ns, 10), 1);
	nat_table_free(t);
}

Test(nat, closing_with_traffic_is_not_expired)
{
	/* A closed socket may still drain a large send queue: the linger counts from the last
	 * translated packet. */
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), back;
	struct nat_tuple tp, again;
	int64_t now = SEC(100), last = 0;

	open_and_close(t, &k, now, &tp);
	for (int i = 0; i < 12; i++) {
		now += SEC(5); /* half the linger, for a minute */
		if (i % 2)
			cr_assert_eq(nat_downlink(t, &tp, now, &back), 0);
		else
			cr_assert_eq(nat_uplink(t, &k, false, now, &again), 0);
		last = now;
		cr_expect_eq(nat_purge(t, now, 100), 0);
		cr_expect_eq(state_of(t, &tp, NULL), NAT_CLOSING);
	}
	cr_expect_eq(nat_purge(t, last + c.linger_ns - 1, 100), 0);
	cr_expect_eq(state_of(t, &tp, NULL), NAT_CLOSING);
	cr_expect_eq(nat_purge(t, last + c.linger_ns, 100), 1);
	cr_expect_eq(nat_downlink(t, &tp, last + c.linger_ns, &back), -ENOENT);
	nat_table_free(t);
}

Test(nat, linger_starts_no_earlier_than_the_mark)
{
	/* An ACTIVE flow idle for an hour, then closed: its FIN still gets a full linger. */
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), back;
	struct nat_tuple tp;
	uint64_t gen;
	int64_t mark = SEC(3601);

	cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp), 0);
	cr_assert_eq(nat_accept(t, &tp, SEC(1), &back, &gen), 0);
	cr_assert_eq(nat_mark_closing(t, &tp, gen, mark), 0);
	cr_expect_eq(nat_next_deadline(t), mark + c.linger_ns);
	cr_expect_eq(nat_purge(t, mark + c.linger_ns - 1, 10), 0);
	cr_assert_eq(nat_downlink(t, &tp, mark + SEC(1), &back), 0);
	cr_expect_eq(nat_purge(t, mark + SEC(1) + c.linger_ns, 10), 1);
	nat_table_free(t);
}

Test(nat, next_deadline_values)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = flow(1), k2 = flow(2), back;
	struct nat_tuple tp, tp2;
	uint64_t gen;

	cr_expect_eq(nat_next_deadline(t), INT64_MAX);
	cr_assert_eq(nat_uplink(t, &k, true, SEC(7), &tp), 0);
	cr_expect_eq(nat_next_deadline(t), SEC(7) + c.half_open_ns);
	cr_assert_eq(nat_uplink(t, &k2, true, SEC(8), &tp2), 0);
	cr_expect_eq(nat_next_deadline(t), SEC(7) + c.half_open_ns);
	cr_assert_eq(nat_accept(t, &tp, SEC(9), &back, &gen), 0);
	cr_expect_eq(nat_next_deadline(t), SEC(8) + c.half_open_ns);
	cr_assert_eq(nat_mark_closing(t, &tp, gen, SEC(10)), 0);
	cr_expect_eq(nat_next_deadline(t), SEC(10) + c.linger_ns);
	/* A packet moves the real deadline; the published one may stay early... */
	cr_assert_eq(nat_downlink(t, &tp, SEC(15), &back), 0);
	cr_expect_eq(nat_next_deadline(t), SEC(10) + c.linger_ns);
	/* ... until a purge re-arms it with the real one (nothing removed). */
	cr_expect_eq(nat_purge(t, SEC(10) + c.linger_ns, 10), 0);
	cr_expect_eq(nat_next_deadline(t), SEC(15) + c.linger_ns);
	cr_expect_eq(nat_purge(t, SEC(15) + c.linger_ns, 10), 1);
	cr_expect_eq(nat_next_deadline(t), SEC(8) + c.half_open_ns);
	cr_expect_eq(nat_purge(t, SEC(8) + c.half_open_ns, 10), 1);
	/* Two tuples rest in quarantine: it asks to be woken for the older, then the other. */
	expect_entries(t, 0, 0, 0, 2);
	cr_expect_eq(nat_next_deadline(t), q_wake(&c, SEC(15) + c.linger_ns));
	cr_expect_eq(nat_purge(t, q_wake(&c, SEC(15) + c.linger_ns), 10), 0);
	expect_entries(t, 0, 0, 0, 1);
	cr_expect_eq(nat_next_deadline(t), q_wake(&c, SEC(8) + c.half_open_ns));
	cr_expect_eq(nat_purge(t, q_wake(&c, SEC(8) + c.half_open_ns), 10), 0);
	expect_entries(t, 0, 0, 0, 0);
	cr_expect_eq(nat_next_deadline(t), INT64_MAX, "idle means idle");
	nat_table_free(t);
}

Test(nat, collect_and_purge_are_bounded)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct nat_candidate cand[8];
	struct nat_tuple tp;
	int64_t due = SEC(1) + c.half_open_ns;

	for (uint32_t i = 0; i < 10; i++) {
		struct flow_key k = flow(i);

		cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp), 0);
	}
	cr_expect_eq(nat_collect_expired(t, due - 1, cand, 8), 0);
	cr_assert_eq(nat_collect_expired(t, due, cand, 3), 3);
	for (int i = 0; i < 3; i++)
		cr_expect_eq(nat_remove_if_expired(t, &cand[i], due), 0);
	expect_entries(t, 7, 0, 0, 3);
	cr_expect_eq(nat_purge(t, due, 4), 4);
	expect_entries(t, 3, 0, 0, 7);
	cr_expect_leq(nat_next_deadline(t), due, "work is left");
	cr_expect_eq(nat_purge(t, due, 100), 3);
	cr_expect_eq(nat_next_deadline(t), q_wake(&c, due), "only the quarantine is left");
	cr_expect_eq(nat_purge(t, due, 0), 0);
	nat_table_free(t);
}

/* ---- tuples, quarantine, budget ----------------------------------------------------------- */

Test(nat, quarantine_blocks_reuse_inside_the_window)
{
	/* A tiny space: 1 address x 1 listener x 4 ports. */
	struct nat_config c = cfg_small();
	struct nat_table *t;
	struct nat_tuple tp[4], x;
	bool seen[4] = { false };
	int64_t freed = SEC(1) + SEC(30); /* half-open timeout */
	struct snap s0;

	c.n_addrs = 1;
	c.n_listeners = 1;
	c.port_min = 7000;
	c.port_max = 7003;
	t = table(&c);
	for (uint32_t i = 0; i < 4; i++) {
		struct flow_key k = flow(i);

		cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp[i]), 0);
		cr_assert(tp[i].port >= 7000 && tp[i].port <= 7003);
		cr_expect_not(seen[tp[i].port - 7000], "port %u handed out twice", tp[i].port);
		seen[tp[i].port - 7000] = true;
	}
	struct flow_key k5 = flow(5);
	cr_expect_eq(nat_uplink(t, &k5, true, SEC(2), &x), -EADDRNOTAVAIL);
	cr_assert_eq(nat_purge(t, freed, 100), 4);
	expect_entries(t, 0, 0, 0, 4);

	/* Under pressure to allocate, the whole window long: refused, and purges do not help. */
	s0 = snap(t);
	for (int64_t now = freed; now < freed + c.quarantine_ns; now += SEC(3)) {
		cr_expect_eq(nat_uplink(t, &k5, true, now, &x), -EADDRNOTAVAIL, "reused at %lld",
			     (long long)(now - freed));
		cr_expect_eq(nat_purge(t, now, 100), 0);
	}
	cr_expect_eq(nat_uplink(t, &k5, true, freed + c.quarantine_ns - 1, &x), -EADDRNOTAVAIL);
	DELTA(s0, t, .ports_exhausted = 21);
	expect_entries(t, 0, 0, 0, 4);
	for (int i = 0; i < 4; i++)
		cr_expect_eq(nat_tuple_status(t, &tp[i]), NAT_TUPLE_RESTING);

	/* After the window (rounded up to a tick), the allocation itself releases a few. */
	s0 = snap(t);
	cr_assert_eq(nat_uplink(t, &k5, true, freed + c.quarantine_ns + NAT_QUARANTINE_TICK_NS,
				&x), 0);
	DELTA(s0, t, .created = 1, .released = NAT_RELEASE_PER_ALLOC);
	expect_entries(t, 1, 0, 0, 4 - NAT_RELEASE_PER_ALLOC);
	cr_expect_eq(nat_purge(t, freed + c.quarantine_ns + NAT_QUARANTINE_TICK_NS, 100), 0);
	expect_entries(t, 1, 0, 0, 0);
	nat_table_free(t);
}

/* Quarantined tuples ask for a purge (a table idle since cannot keep them), and a table idle
 * for more than 2^31 ticks (about 26 days) after they were due still releases them. */
Test(nat, quarantine_release_after_a_long_idle)
{
	struct nat_config c = cfg_small();
	struct nat_table *t;
	struct nat_tuple tp[4], x;
	int64_t freed = SEC(1) + SEC(30), q_due, idle;
	struct snap s0;

	c.n_addrs = 1;
	c.n_listeners = 1;
	c.port_min = 7000;
	c.port_max = 7003;
	t = table(&c);
	for (uint32_t i = 0; i < 4; i++) {
		struct flow_key k = flow(i);

		cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp[i]), 0);
	}
	cr_assert_eq(nat_purge(t, freed, 100), 4);
	expect_entries(t, 0, 0, 0, 4);
	q_due = (freed + c.quarantine_ns + NAT_QUARANTINE_TICK_NS - 1) / NAT_QUARANTINE_TICK_NS *
		NAT_QUARANTINE_TICK_NS;
	cr_expect_eq(nat_next_deadline(t), q_due + NAT_QUARANTINE_WAKE_NS,
		     "next deadline %lld, quarantine due %lld", (long long)nat_next_deadline(t),
		     (long long)q_due);

	/* No traffic, no purge, for 2^31 ticks and a second after the tuples were due. */
	idle = q_due + ((int64_t)1 << 31) * NAT_QUARANTINE_TICK_NS + SEC(1);
	s0 = snap(t);
	struct flow_key k5 = flow(5);
	cr_expect_eq(nat_uplink(t, &k5, true, idle, &x), 0, "the quarantine is jammed");
	DELTA(s0, t, .created = 1, .released = NAT_RELEASE_PER_ALLOC);
	nat_purge(t, idle, 100);
	expect_entries(t, 1, 0, 0, 0);
	cr_expect_eq(nat_next_deadline(t), idle + c.half_open_ns);
	nat_table_free(t);
}

/* quarantine_reuse watches the claim invariant: a tuple leaves the quarantine only through its
 * release. Here its rest mark is lost on purpose (as an early release would), it is picked
 * again, and its own release comes later: counted once, and the new mapping keeps its claim. */
Test(nat, quarantine_reuse_counts_a_tuple_picked_while_resting)
{
	struct nat_config c = cfg_small();
	struct nat_table *t;
	struct nat_tuple ta, tb, tc, x;
	struct flow_key a = flow(1), b = flow(2), cc = flow(3), d = flow(4), back;
	int64_t freed = SEC(1) + SEC(30), due;
	uint64_t gen;
	_Atomic uint8_t *own;
	struct snap s0;

	c.n_addrs = 1;
	c.n_listeners = 1;
	c.port_min = 7000;
	c.port_max = 7001;
	t = table(&c);
	cr_assert_eq(nat_uplink(t, &a, true, SEC(1), &ta), 0);
	cr_assert_eq(nat_purge(t, freed, 100), 1);
	cr_assert_eq(nat_tuple_status(t, &ta), NAT_TUPLE_RESTING);
	own = &t->owner[0][index_of(t, tuple_pack(&ta))];
	cr_expect_eq(atomic_load(own) & (OWNED | RESTING), OWNED | RESTING, "marked resting");

	/* The fault: the tuple looks free while its quarantine record is still in the ring. */
	atomic_store(own, 0);
	s0 = snap(t);
	cr_assert_eq(nat_uplink(t, &b, true, freed + SEC(1), &tb), 0);
	cr_assert_eq(nat_uplink(t, &cc, true, freed + SEC(1), &tc), 0);
	cr_assert(tuple_eq(&tb, &ta) || tuple_eq(&tc, &ta), "the space has two tuples: one is ta");
	cr_assert_eq(nat_accept(t, &tb, freed + SEC(1), &back, &gen), 0);
	cr_assert_eq(nat_accept(t, &tc, freed + SEC(1), &back, &gen), 0);
	DELTA(s0, t, .created = 2, .accepted = 2);

	/* Its record comes due: counted, not released, and the new mapping still owns it. */
	due = freed + c.quarantine_ns + NAT_QUARANTINE_TICK_NS;
	s0 = snap(t);
	nat_purge(t, due, 1);
	DELTA(s0, t, .quarantine_reuse = 1);
	cr_expect_eq(nat_tuple_status(t, &ta), NAT_TUPLE_MAPPED);
	cr_expect_eq(atomic_load(own) & (OWNED | RESTING), OWNED, "the new claim is left alone");
	expect_entries(t, 0, 2, 0, 0);
	cr_expect_eq(nat_uplink(t, &d, true, due, &x), -EADDRNOTAVAIL, "both tuples are mapped");
	nat_table_free(t);
}

/* Without the fault, every record's release finds its tuple resting: a whole cycle of the space
 * (every tuple used, freed, rested and used again) counts no reuse. */
Test(nat, quarantine_reuse_stays_zero_over_cycles_of_the_space)
{
	struct nat_config c = cfg_small();
	struct nat_table *t;
	struct nat_tuple x;
	int64_t now = SEC(1);
	struct snap s0;

	c.n_addrs = 1;
	c.n_listeners = 2;
	c.port_min = 7000;
	c.port_max = 7003;
	c.half_open_ns = SEC(1);
	c.quarantine_ns = SEC(2);
	t = table(&c);
	s0 = snap(t);
	for (uint32_t round = 0; round < 5; round++) {
		for (uint32_t i = 0; i < 8; i++) {
			struct flow_key k = flow(round * 8 + i);

			cr_assert_eq(nat_uplink(t, &k, true, now, &x), 0, "round %u flow %u", round, i);
		}
		now += c.half_open_ns;
		cr_assert_eq(nat_purge(t, now, 100), 8);
		now += c.quarantine_ns + NAT_QUARANTINE_TICK_NS;
		nat_purge(t, now, 100);
		expect_entries(t, 0, 0, 0, 0);
	}
	DELTA(s0, t, .created = 40, .expired = 40, .quarantined = 40, .released = 40);
	nat_table_free(t);
}

Test(nat, budget_refuses_and_recovers)
{
	struct nat_config c = cfg_small();
	struct nat_table *t;
	struct flow_key a = flow(1), b = flow(2), back;
	struct nat_tuple ta, tb;
	uint64_t gen;
	struct snap s0;

	c.max_entries = 1;
	t = table(&c);
	cr_assert_eq(nat_uplink(t, &a, true, SEC(1), &ta), 0);
	s0 = snap(t);
	cr_expect_eq(nat_uplink(t, &b, true, SEC(2), &tb), -ENOSPC);
	DELTA(s0, t, .budget_exhausted = 1);
	/* The refused flow's packets find nothing, and nothing existing was disturbed. */
	cr_expect_eq(nat_uplink(t, &b, false, SEC(2), &tb), -ENOENT);
	cr_assert_eq(nat_downlink(t, &ta, SEC(2), &back), 0);
	cr_expect_eq(memcmp(&back, &a, sizeof(back)), 0);
	/* The budget comes back only when the entry is removed (not on accept or close). */
	cr_assert_eq(nat_accept(t, &ta, SEC(3), &back, &gen), 0);
	cr_assert_eq(nat_mark_closing(t, &ta, gen, SEC(3)), 0);
	cr_expect_eq(nat_uplink(t, &b, true, SEC(4), &tb), -ENOSPC);
	cr_assert_eq(nat_purge(t, SEC(4) + c.linger_ns, 10), 1);
	s0 = snap(t);
	cr_assert_eq(nat_uplink(t, &b, true, SEC(20), &tb), 0);
	DELTA(s0, t, .created = 1);
	cr_assert_eq(nat_downlink(t, &tb, SEC(20), &back), 0);
	cr_expect_eq(memcmp(&back, &b, sizeof(back)), 0);
	nat_table_free(t);
}

Test(nat, probe_limit_is_4096)
{
	/* 8192 tuples, walked in order while free, then all taken: an attempt gives up after its
	 * probes (NAT_PROBE_LIMIT, jumps past busy runs included), counted, and so does the next;
	 * one tuple freed is then found within a few attempts. */
	struct nat_config c = cfg_small();
	struct nat_table *t;
	static struct nat_tuple tp[8192];
	struct flow_key k, back;
	struct nat_tuple x;
	uint64_t gen;
	int64_t now = SEC(1);
	struct snap s0;
	int ret = -1;

	c.n_addrs = 1;
	c.n_listeners = 1;
	c.port_min = 1;
	c.port_max = 8192;
	c.max_entries = 10000;
	c.quarantine_ns = 0;
	t = table(&c);
	for (uint32_t i = 0; i < 8192; i++) {
		k = key4(0x0a000000 + i, 40000, 0x01010101, 80);
		cr_assert_eq(nat_uplink(t, &k, true, now, &tp[i]), 0);
		if (i > 0)
			cr_assert_eq(tuple_index(&c, &tp[i]),
				     (tuple_index(&c, &tp[i - 1]) + 1) % 8192,
				     "the cursor walks the space in order");
		if (i != 5000)
			cr_assert_eq(nat_accept(t, &tp[i], now, &back, &gen), 0);
	}
	s0 = snap(t);
	k = key4(0x0b000000, 40000, 0x01010101, 80);
	cr_expect_eq(nat_uplink(t, &k, true, now, &x), -EADDRNOTAVAIL);
	cr_expect_eq(nat_uplink(t, &k, true, now, &x), -EADDRNOTAVAIL);
	DELTA(s0, t, .ports_exhausted = 2);
	/* Flow 5000 expires; its tuple rests for zero time. */
	cr_assert_eq(nat_purge(t, now + c.half_open_ns, 10), 1);
	now += c.half_open_ns + SEC(1);
	nat_purge(t, now, 10);
	cr_expect_eq(nat_tuple_status(t, &tp[5000]), NAT_TUPLE_FREE);
	for (int i = 0; i < 16 && ret != 0; i++)
		ret = nat_uplink(t, &k, true, now, &x);
	cr_assert_eq(ret, 0);
	cr_expect(tuple_eq(&x, &tp[5000]));
	nat_table_free(t);
}

Test(nat, allocation_order_and_determinism)
{
	/* Listener varies fastest, then address, then port; a fixed seed gives the same run. */
	struct nat_config c = cfg_small();
	struct nat_table *t1, *t2;
	struct nat_tuple a, b, prev = { 0 };

	c.n_addrs = 3;
	c.n_listeners = 2;
	c.port_min = 100;
	c.port_max = 109;
	t1 = table(&c);
	t2 = table(&c);
	for (uint32_t i = 0; i < 60; i++) {
		struct flow_key k = flow(i);

		cr_assert_eq(nat_uplink(t1, &k, true, SEC(1), &a), 0);
		cr_assert_eq(nat_uplink(t2, &k, true, SEC(1), &b), 0);
		cr_expect(tuple_eq(&a, &b), "same seed, different tuple at %u", i);
		if (i > 0) {
			uint32_t want = (tuple_index(&c, &prev) + 1) % 60;

			cr_expect_eq(tuple_index(&c, &a), want);
			if (prev.listener + 1 < 2) {
				cr_expect_eq(a.listener, prev.listener + 1);
				cr_expect_eq(a.addr, prev.addr);
				cr_expect_eq(a.port, prev.port);
			}
		}
		prev = a;
	}
	nat_table_free(t1);
	nat_table_free(t2);
}

/* ---- the allocation window ------------------------------------------------------------------ */

/* The default space (4 x 2 x 64512 tuples); time in 1 ms steps, a 1 s quarantine and no linger,
 * so that a churn keeps about a thousand tuples busy. */
static uint64_t nat_quarantine_count(const struct nat_table *t)
{
	struct nat_stats st;

	nat_get_stats(t, &st);
	return st.quarantine;
}

static uint64_t window_grown(const struct nat_table *t)
{
	return ctr_get(&nat_get_counters(t)->window_grown);
}

static struct nat_config cfg_window(void)
{
	struct nat_config c;

	nat_config_default(&c);
	c.max_entries = 65536;
	c.half_open_max = 65536;
	c.half_open_quiet = 65536;
	c.half_open_per_host = 65536;
	c.half_open_per_net = 65536;
	c.linger_ns = 0;
	c.quarantine_ns = SEC(1);
	c.seed = 7;
	return c;
}

/* n connections opened, accepted, closed and purged one after another from *now on, 1 ms
 * apart; every tuple's index is set in seen (if not NULL). Returns the distinct indices. */
static uint32_t churn(struct nat_table *t, const struct nat_config *c, uint32_t n, uint32_t salt,
		      int64_t *now, uint8_t *seen)
{
	uint32_t distinct = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct flow_key k = key4(0x0a000000 + salt + i / 60000, (uint16_t)(1024 + i % 60000),
					 0x01010101, 443);
		struct nat_tuple tp;
		uint32_t idx;

		open_and_close(t, &k, *now, &tp);
		idx = tuple_index(c, &tp);
		if (seen && !seen[idx]) {
			seen[idx] = 1;
			distinct++;
		}
		*now += MS(1);
		nat_purge(t, *now, 64);
	}
	return distinct;
}

Test(nat, window_keeps_a_light_load_in_few_pages)
{
	/* 60,000 connections at about a thousand busy: every tuple from one window of 16,384, so
	 * the byte map behind the rest of the 516,096 is never touched. */
	struct nat_config c = cfg_window();
	struct nat_table *t = table(&c);
	uint32_t space = 4 * 2 * 64512;
	uint8_t *seen = calloc(space, 1);
	int64_t now = SEC(1);
	struct snap s0 = snap(t);
	uint32_t distinct, lo = space, hi = 0;

	cr_assert_not_null(seen);
	distinct = churn(t, &c, 60000, 0, &now, seen);
	cr_expect_eq(distinct, NAT_WINDOW_MIN, "every tuple of the window, none beyond: %u",
		     distinct);
	for (uint32_t i = 0; i < space; i++)
		if (seen[i]) {
			lo = i < lo ? i : lo;
			hi = i;
		}
	/* One run of indices, or two when the window wraps past the end of the space. */
	cr_expect(hi - lo + 1 == NAT_WINDOW_MIN || (lo == 0 && hi == space - 1),
		  "window [%u, %u]", lo, hi);
	DELTA(s0, t, .created = 60000, .accepted = 60000, .closed = 60000, .expired = 60000,
	      .quarantined = 60000, .released = 60000 - nat_quarantine_count(t));
	free(seen);
	nat_table_free(t);
}

Test(nat, window_doubles_when_half_of_it_is_busy)
{
	/* 10,000 held: more than half of the first window, so it grows, and no connection fails. */
	struct nat_config c = cfg_window();
	struct nat_table *t = table(&c);
	uint32_t space = 4 * 2 * 64512;
	uint8_t *seen = calloc(space, 1);
	int64_t now = SEC(1);
	struct snap s0 = snap(t);
	uint32_t distinct;
	uint64_t grown;

	cr_assert_not_null(seen);
	for (uint32_t i = 0; i < 10000; i++) {
		struct flow_key k = key4(0x0b000000 + i, 5000, 0x01010101, 443);
		struct nat_tuple tp;

		struct flow_key back;
		uint64_t gen;

		cr_assert_eq(nat_uplink(t, &k, true, now, &tp), 0, "held %u", i);
		cr_assert_eq(nat_accept(t, &tp, now, &back, &gen), 0);
		seen[tuple_index(&c, &tp)] = 1;
	}
	DELTA(s0, t, .created = 10000, .accepted = 10000, .window_grown = 1);
	distinct = churn(t, &c, 40000, 0, &now, seen);
	/* The churn laps the held block, and each time the cursor meets it the window doubles
	 * (once or twice: a doubling leaves the cursor in the block half of the time); either
	 * way the tuples ever used stay a fraction of the space. */
	grown = window_grown(t) - s0.window_grown;
	cr_expect(grown >= 1 && grown <= 4, "grown %llu", (unsigned long long)grown);
	cr_expect_gt(distinct, NAT_WINDOW_MIN, "the churn used the grown window: %u", distinct);
	cr_expect_leq(distinct, (NAT_WINDOW_MIN << grown) - 10000, "%u", distinct);
	DELTA(s0, t, .created = 50000, .accepted = 50000, .closed = 40000, .expired = 40000,
	      .quarantined = 40000, .released = 40000 - nat_quarantine_count(t),
	      .window_grown = grown);
	free(seen);
	nat_table_free(t);
}

/* n connections opened and accepted from *now on, held (never closed). */
static void hold(struct nat_table *t, uint32_t n, uint32_t salt, int64_t now)
{
	for (uint32_t i = 0; i < n; i++) {
		struct flow_key k = key4(0x0b000000 + salt + i, 5000, 0x01010101, 443), back;
		struct nat_tuple tp;
		uint64_t gen;

		cr_assert_eq(nat_uplink(t, &k, true, now, &tp), 0, "held %u", i);
		cr_assert_eq(nat_accept(t, &tp, now, &back, &gen), 0);
	}
}

Test(nat, window_keeps_its_size_past_a_short_block_of_held_tuples)
{
	/* 500 held in a row and a churn that laps them five times: each lap skips the block
	 * (500 probes once a lap) and the window stays as it is. */
	struct nat_config c = cfg_window();
	struct nat_table *t = table(&c);
	uint32_t space = 4 * 2 * 64512;
	uint8_t *seen = calloc(space, 1);
	int64_t now = SEC(1);
	struct snap s0 = snap(t);
	uint32_t distinct;

	cr_assert_not_null(seen);
	hold(t, 500, 0, now);
	distinct = churn(t, &c, 5 * NAT_WINDOW_MIN, 0, &now, seen);
	cr_expect_eq(distinct, NAT_WINDOW_MIN - 500, "%u", distinct);
	DELTA(s0, t, .created = 500 + 5 * NAT_WINDOW_MIN, .accepted = 500 + 5 * NAT_WINDOW_MIN,
	      .closed = 5 * NAT_WINDOW_MIN, .expired = 5 * NAT_WINDOW_MIN,
	      .quarantined = 5 * NAT_WINDOW_MIN,
	      .released = 5 * NAT_WINDOW_MIN - nat_quarantine_count(t));
	free(seen);
	nat_table_free(t);
}

Test(nat, window_grows_past_a_long_block_of_held_tuples)
{
	/* 6,000 held in a row (under half the window, but longer than NAT_WINDOW_RUN and than the
	 * probe limit): when the churn reaches them the window doubles and the cursor moves into
	 * the new half, so no connection is refused; the next lap of the doubled window meets
	 * them once more. */
	struct nat_config c = cfg_window();
	struct nat_table *t = table(&c);
	int64_t now = SEC(1);
	struct snap s0 = snap(t);

	hold(t, 6000, 0, now);
	DELTA(s0, t, .created = 6000, .accepted = 6000);
	churn(t, &c, 10000 + NAT_WINDOW_MIN, 0, &now, NULL);
	DELTA(s0, t, .created = 16000 + NAT_WINDOW_MIN, .accepted = 16000 + NAT_WINDOW_MIN,
	      .closed = 10000 + NAT_WINDOW_MIN, .expired = 10000 + NAT_WINDOW_MIN,
	      .quarantined = 10000 + NAT_WINDOW_MIN,
	      .released = 10000 + NAT_WINDOW_MIN - nat_quarantine_count(t), .window_grown = 1);
	nat_table_free(t);
}

Test(nat, window_that_becomes_the_whole_space_keeps_its_place)
{
	/* A churn laps the first window a few times, then a block of held connections fills it,
	 * doubles it and makes it the whole space. The walk goes on from where the windows ended,
	 * into tuples never used, not from a place the cursor's count happens to name, which can
	 * be the middle of the held block: more busy tuples in a row than the probe limit, and a
	 * connection refused with more than a third of the space free. Several seeds: each puts
	 * the window elsewhere in the space. */
	for (uint64_t seed = 1; seed <= 8; seed++) {
		struct nat_config c = cfg_window();
		struct nat_table *t;
		int64_t now = SEC(1);
		struct snap s0;

		c.n_addrs = 1;
		c.n_listeners = 1; /* 64,512 tuples: windows of 16,384 and 32,768, then the whole */
		c.seed = seed;
		t = table(&c);
		s0 = snap(t);
		churn(t, &c, 3 * NAT_WINDOW_MIN + 5000, 0, &now, NULL);
		hold(t, 40000, 0, now);
		cr_expect_eq(ctr_get(&nat_get_counters(t)->ports_exhausted), 0, "seed %llu",
			     (unsigned long long)seed);
		DELTA(s0, t, .created = 3 * NAT_WINDOW_MIN + 45000,
		      .accepted = 3 * NAT_WINDOW_MIN + 45000, .closed = 3 * NAT_WINDOW_MIN + 5000,
		      .expired = 3 * NAT_WINDOW_MIN + 5000, .quarantined = 3 * NAT_WINDOW_MIN + 5000,
		      .released = 3 * NAT_WINDOW_MIN + 5000 - nat_quarantine_count(t),
		      .window_grown = 2);
		nat_table_free(t);
	}
}

Test(nat, whole_space_walk_gets_past_a_block_longer_than_the_probe_limit)
{
	/* 50,000 held one after another in a space of 64,512: the first windows fill in order and
	 * the last growth makes the window the whole space, the cursor past the old window; when
	 * it comes round to the held block (longer than the probe limit) it jumps ahead instead of
	 * refusing connections with a fifth of the space free. Then a churn beside them laps the
	 * space's free rest without a refusal. Several seeds: each puts the window elsewhere. */
	for (uint64_t seed = 1; seed <= 4; seed++) {
		struct nat_config c = cfg_window();
		struct nat_table *t;
		int64_t now = SEC(1);
		struct snap s0;

		c.n_addrs = 1;
		c.n_listeners = 1;
		c.seed = seed;
		t = table(&c);
		s0 = snap(t);
		hold(t, 50000, 0, now);
		churn(t, &c, 20000, 0, &now, NULL);
		DELTA(s0, t, .created = 70000, .accepted = 70000, .closed = 20000, .expired = 20000,
		      .quarantined = 20000, .released = 20000 - nat_quarantine_count(t),
		      .window_grown = 2);
		cr_expect_eq(ctr_get(&nat_get_counters(t)->ports_exhausted), 0, "seed %llu",
			     (unsigned long long)seed);
		nat_table_free(t);
	}
}

Test(nat, small_space_has_no_window)
{
	/* A space of NAT_WINDOW_MIN tuples or fewer is walked whole, in order, from the start. */
	struct nat_config c = cfg_window();
	struct nat_table *t;
	int64_t now = SEC(1);
	struct nat_tuple tp, prev;
	struct snap s0;

	c.n_addrs = 1;
	c.n_listeners = 1;
	c.port_min = 1;
	c.port_max = 10000;
	t = table(&c);
	s0 = snap(t);
	for (uint32_t i = 0; i < 30000; i++) {
		struct flow_key k = key4(0x0a000000 + i / 60000, (uint16_t)(1024 + i % 60000),
					 0x01010101, 443);

		open_and_close(t, &k, now, &tp);
		if (i > 0)
			cr_assert_eq(tuple_index(&c, &tp), (tuple_index(&c, &prev) + 1) % 10000,
				     "in order at %u", i);
		prev = tp;
		now += MS(1);
		nat_purge(t, now, 64);
	}
	DELTA(s0, t, .created = 30000, .accepted = 30000, .closed = 30000, .expired = 30000,
	      .quarantined = 30000, .released = 30000 - nat_quarantine_count(t));
	nat_table_free(t);
}

Test(nat, families_have_separate_spaces)
{
	struct nat_config c = cfg_small();
	struct nat_table *t;
	struct nat_tuple a, b, x;
	struct flow_key v4 = flow(1), v4b = flow(2), v6 = key6(1, 1000, 2, 443), back;

	c.n_addrs = 1;
	c.n_listeners = 1;
	c.port_min = c.port_max = 3000;
	t = table(&c);
	cr_assert_eq(nat_uplink(t, &v4, true, SEC(1), &a), 0);
	cr_expect_eq(nat_uplink(t, &v4b, true, SEC(1), &x), -EADDRNOTAVAIL);
	cr_assert_eq(nat_uplink(t, &v6, true, SEC(1), &b), 0);
	cr_expect_eq(a.port, 3000);
	cr_expect_eq(b.port, 3000);
	cr_expect_eq(a.family, 4);
	cr_expect_eq(b.family, 6);
	cr_assert_eq(nat_downlink(t, &b, SEC(1), &back), 0);
	cr_expect_eq(memcmp(&back, &v6, sizeof(back)), 0);
	cr_assert_eq(nat_downlink(t, &a, SEC(1), &back), 0);
	cr_expect_eq(memcmp(&back, &v4, sizeof(back)), 0);
	nat_table_free(t);
}

Test(nat, counters_over_a_whole_life)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct flow_key k = key6(9, 5555, 1, 443), back;
	struct nat_tuple a, b;
	uint64_t gen;
	struct nat_stats st;
	struct snap s0 = snap(t);

	nat_get_stats(t, &st);
	uint64_t bytes0 = st.bytes;
	cr_expect_gt(bytes0, 0);
	cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &a), 0);         /* created */
	cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &a), 0);         /* retransmit */
	cr_assert_eq(nat_accept(t, &a, SEC(2), &back, &gen), 0);      /* accepted */
	cr_expect_eq(nat_accept(t, &a, SEC(2), &back, &gen), -ENOENT); /* accept_miss */
	cr_assert_eq(nat_mark_closing(t, &a, gen, SEC(3)), 0);        /* closed */
	cr_expect_eq(nat_mark_closing(t, &a, gen - 1, SEC(3)), -ESTALE); /* gen_mismatch */
	cr_assert_eq(nat_uplink(t, &k, true, SEC(4), &b), 0);         /* replaced+created+q */
	cr_expect_eq(nat_purge(t, SEC(4) + c.half_open_ns, 10), 1);   /* expired+quarantined */
	cr_expect_eq(nat_purge(t, SEC(4) + c.half_open_ns + c.quarantine_ns +
				  NAT_QUARANTINE_TICK_NS, 10), 0); /* released */
	cr_expect_eq(nat_downlink(t, &b, SEC(100), &back), -ENOENT);  /* downlink_miss */
	cr_expect_eq(nat_uplink(t, &k, false, SEC(100), &b), -ENOENT); /* uplink_miss */
	DELTA(s0, t, .created = 2, .replaced = 1, .accepted = 1, .closed = 1, .expired = 1,
	      .quarantined = 2, .released = 2, .uplink_miss = 1, .downlink_miss = 1,
	      .accept_miss = 1, .gen_mismatch = 1);
	expect_entries(t, 0, 0, 0, 0);
	/* Memory is counted as it grows (entries come in slab chunks). */
	for (uint32_t i = 0; i < 300; i++) {
		struct flow_key f = flow(i);

		cr_assert_eq(nat_uplink(t, &f, true, SEC(200), &a), 0);
	}
	nat_get_stats(t, &st);
	cr_expect_gt(st.bytes, bytes0 + 300 * 64, "bytes %llu", (unsigned long long)st.bytes);
	nat_table_free(t);
}

/* ---- giving memory back ------------------------------------------------------------------- */

static uint64_t table_bytes(struct nat_table *t)
{
	struct nat_stats st;

	nat_get_stats(t, &st);
	return st.bytes;
}

/* A burst of entries, most of them gone, a few kept: the trim gives back the slab, buckets and
 * ring the burst grew, the survivors stay where they are (found, in their state, forwarding),
 * and once they and the quarantine are gone too a trim brings the table back to the very size
 * it had when new. */
Test(nat, trim_gives_back_a_burst_and_keeps_the_survivors)
{
	struct nat_config c = cfg_small();
	struct nat_table *t;
	enum { N = 5000, KEEP = 7 };
	static struct nat_tuple tp[N];
	uint64_t gen[KEEP], bytes0, peak, g;
	struct flow_key back;

	c.max_entries = 20000;
	c.port_max = 19999; /* 2 x 2 x 10,000 tuples */
	nat_config_half_open_limits(&c);
	c.half_open_per_host = c.half_open_per_net = c.half_open_quiet = c.half_open_max;
	t = table(&c);
	bytes0 = table_bytes(t);
	cr_expect_eq(nat_trim(t, true), 0, "a new table has nothing to give back");
	for (uint32_t i = 0; i < N; i++) {
		struct flow_key k = key4(0xc6120009 + i / 50000, (uint16_t)(1024 + i), 0x01010101,
					 443);

		cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp[i]), 0, "flow %u", i);
	}
	/* Survivors spread over the shards: every 700th flow, accepted (ACTIVE never expires). */
	for (uint32_t j = 0; j < KEEP; j++)
		cr_assert_eq(nat_accept(t, &tp[j * 700], SEC(2), &back, &gen[j]), 0);
	peak = table_bytes(t);
	cr_expect_gt(peak, bytes0 + (uint64_t)N * sizeof(struct nat_entry));
	cr_expect_eq(nat_trim(t, true), 0, "nothing is spare while every entry lives");
	/* The rest expire (HALF_OPEN, never accepted) and rest in the quarantine. */
	while (nat_purge(t, SEC(1) + c.half_open_ns, 100000) > 0)
		;
	expect_entries(t, 0, KEEP, 0, N - KEEP);
	uint64_t before = table_bytes(t);
	size_t freed = nat_trim(t, true);
	uint64_t after = table_bytes(t);

	cr_expect_eq(before - after, freed, "the bytes counted are the bytes returned");
	cr_expect_gt(freed, (uint64_t)(N / 2) * sizeof(struct nat_entry));
	/* Left: the chunks that hold a survivor (at most KEEP of CHUNK_MAX entries each), the
	 * full quarantine ring, the owner maps and the fixed parts. */
	cr_expect_leq(after, bytes0 + KEEP * (sizeof(struct chunk) + CHUNK_MAX *
					      (sizeof(struct nat_entry) + sizeof(struct heap_node))) +
				     8192 * sizeof(struct qrec),
		      "after %llu, new %llu, peak %llu", (unsigned long long)after,
		      (unsigned long long)bytes0, (unsigned long long)peak);
	/* The resting tuples kept their claims (their owner pages are not all zero). */
	for (uint32_t i = 1; i < N; i += 97)
		if (i % 700)
			cr_expect_eq(nat_tuple_status(t, &tp[i]), NAT_TUPLE_RESTING, "tuple %u", i);
	for (uint32_t j = 0; j < KEEP; j++) {
		enum nat_state s = state_of(t, &tp[j * 700], &g);

		cr_expect_eq(s, NAT_ACTIVE);
		cr_expect_eq(g, gen[j]);
		cr_expect_eq(nat_downlink(t, &tp[j * 700], SEC(3), &back), 0);
	}
	/* The table grows again after a trim. */
	struct nat_tuple more[64];

	for (uint32_t i = 0; i < 64; i++) {
		struct flow_key k = key4(0xc6130009, (uint16_t)(2000 + i), 0x01010101, 443);

		cr_assert_eq(nat_uplink(t, &k, true, SEC(4), &more[i]), 0);
		cr_expect_eq(state_of(t, &more[i], NULL), NAT_HALF_OPEN);
	}
	/* Everything gone, the quarantine released: the table's size when new. */
	for (uint32_t j = 0; j < KEEP; j++)
		cr_assert_eq(nat_mark_closing(t, &tp[j * 700], gen[j], SEC(5)), 0);
	int64_t end = SEC(5) + c.half_open_ns + c.quarantine_ns + 2 * NAT_QUARANTINE_TICK_NS;

	while (nat_purge(t, SEC(5) + c.half_open_ns, 100000) > 0)
		;
	while (nat_next_deadline(t) != INT64_MAX)
		nat_purge(t, end, 100000);
	expect_entries(t, 0, 0, 0, 0);
	uint64_t pages0 = snap(t).owner_pages_dropped;

	nat_trim(t, true);
	/* 5,064 claims, a byte each, touched at least two pages of the v4 owner map. */
	cr_expect_geq(snap(t).owner_pages_dropped - pages0, 2,
		      "pages %llu", (unsigned long long)(snap(t).owner_pages_dropped - pages0));
	cr_expect_eq(nat_tuple_status(t, &tp[1]), NAT_TUPLE_FREE);
	cr_expect_eq(table_bytes(t), bytes0, "bytes %llu, new %llu",
		     (unsigned long long)table_bytes(t), (unsigned long long)bytes0);
	/* and it works as new: a fresh flow gets a tuple. */
	struct flow_key k = key4(0xc6140009, 3000, 0x01010101, 443);

	cr_expect_eq(nat_uplink(t, &k, true, end + SEC(1), &more[0]), 0);
	nat_table_free(t);
}

/* A trim with no spare (a table filled and still full) moves nothing: the ring, maps and
 * slab are only as large as their use calls for. */
Test(nat, trim_keeps_what_is_in_use)
{
	struct nat_config c = cfg_small();
	struct nat_table *t = table(&c);
	struct nat_tuple tp;

	for (uint32_t i = 0; i < 300; i++) {
		struct flow_key k = flow(i);

		cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &tp), 0);
	}
	uint64_t b = table_bytes(t);

	cr_expect_eq(nat_trim(t, true), 0);
	cr_expect_eq(table_bytes(t), b);
	for (uint32_t i = 0; i < 300; i++) {
		struct flow_key k = flow(i);

		cr_expect_eq(nat_uplink(t, &k, true, SEC(2), &tp), 0, "flow %u still mapped", i);
	}
	expect_entries(t, 300, 0, 0, 0);
	nat_table_free(t);
}
