/* test_nat_flood.c — the NAT table under a SYN flood (stacks/system/nat.h), on a virtual clock:
 * a HALF_OPEN entry lives half_open_timeout from its SYN whatever the kernel retransmits, the
 * HALF_OPEN share is capped in all, per source host and per source network, every refusal is
 * counted by its reason, and established mappings and other sources' new flows get through. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>

#include "stacks/system/nat.h"
#include "testutil.h"

static struct flow_key key4(uint32_t client, uint16_t cport)
{
	struct flow_key k;
	uint32_t c = htonl(client), s = htonl(0x01010101);

	memset(&k, 0, sizeof(k));
	k.family = 4;
	k.proto = IPPROTO_TCP;
	k.sport_be = htons(cport);
	k.dport_be = htons(443);
	memcpy(k.src, &c, 4);
	memcpy(k.dst, &s, 4);
	return k;
}

/* fd00:1:2:<subnet>::<host> -> 2001:db8::1 */
static struct flow_key key6(uint16_t subnet, uint16_t host, uint16_t cport)
{
	struct flow_key k;

	memset(&k, 0, sizeof(k));
	k.family = 6;
	k.proto = IPPROTO_TCP;
	k.sport_be = htons(cport);
	k.dport_be = htons(443);
	k.src[0] = 0xfd;
	k.src[3] = 1;
	k.src[5] = 2;
	k.src[6] = (uint8_t)(subnet >> 8);
	k.src[7] = (uint8_t)subnet;
	k.src[14] = (uint8_t)(host >> 8);
	k.src[15] = (uint8_t)host;
	k.dst[0] = 0x20;
	k.dst[1] = 0x01;
	k.dst[2] = 0x0d;
	k.dst[3] = 0xb8;
	k.dst[15] = 1;
	return k;
}

/* max_entries 4096 with the derived limits: 2048 in all, 64 per /24 (or /48), 16 per host,
 * per-source counting from 64 HALF_OPEN entries on. Ports: plenty for every test here. */
static struct nat_config cfg_flood(void)
{
	struct nat_config c;

	nat_config_default(&c);
	c.max_entries = 4096;
	nat_config_half_open_limits(&c);
	c.n_addrs = 4;
	c.n_listeners = 2;
	c.port_min = 10000;
	c.port_max = 20000;
	c.seed = 42;
	return c;
}

static struct nat_table *table(const struct nat_config *c)
{
	struct nat_table *t = NULL;

	cr_assert_eq(nat_table_new(c, &t), 0);
	return t;
}

static uint64_t ctr(struct nat_table *t, size_t off)
{
	return ctr_get((const ctr_t *)((const char *)nat_get_counters(t) + off));
}

#define CTR(t, name) ctr((t), offsetof(struct nat_counters, name))

static uint64_t half_open(struct nat_table *t)
{
	struct nat_stats st;

	nat_get_stats(t, &st);
	return st.entries[NAT_HALF_OPEN];
}

Test(nat_flood, derived_limits)
{
	struct nat_config c;

	nat_config_default(&c);
	cr_expect_eq(c.half_open_max, 32768);
	cr_expect_eq(c.half_open_per_net, 1024);
	cr_expect_eq(c.half_open_per_host, 256);
	cr_expect_eq(c.half_open_quiet, 1024);
	c.max_entries = 100;
	nat_config_half_open_limits(&c);
	cr_expect_eq(c.half_open_max, 50);
	cr_expect_eq(c.half_open_per_net, 1);
	cr_expect_eq(c.half_open_per_host, 1);
	c.max_entries = 1;
	nat_config_half_open_limits(&c);
	cr_expect_eq(c.half_open_max, 1, "never 0");
}

/* The kernel retransmits its SYN-ACK (1, 3, 7, 15 and 31 s after the SYN, Linux's
 * tcp_synack_retries 5) and the client its SYN: neither moves the HALF_OPEN deadline, which
 * stays half_open_timeout after the first SYN. */
Test(nat_flood, retransmits_do_not_extend_half_open)
{
	struct nat_config c = cfg_flood();
	struct nat_table *t = table(&c);
	struct flow_key k = key4(0xc6336401, 40000), back;
	struct nat_tuple tp, again;
	int64_t syn = SEC(100), due = syn + c.half_open_ns;
	const int synack[] = { 1, 3, 7, 15 };

	cr_assert_eq(nat_uplink(t, &k, true, syn, &tp), 0);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(nat_downlink(t, &tp, syn + SEC(synack[i]), &back), 0);
		cr_assert_eq(memcmp(&back, &k, sizeof(k)), 0);
	}
	cr_assert_eq(nat_uplink(t, &k, true, syn + SEC(3), &again), 0, "SYN retransmit");
	cr_expect_eq(again.port, tp.port, "a retransmit reuses the mapping");
	cr_expect_eq(nat_next_deadline(t), due);
	cr_expect_eq(nat_purge(t, due - 1, 100), 0);
	cr_expect_eq(nat_purge(t, due, 100), 1, "removed half_open_timeout after the SYN");
	cr_expect_eq(CTR(t, expired), 1);
	cr_expect_eq(CTR(t, expiry_saved), 0, "no packet refreshed it");
	cr_expect_eq(nat_downlink(t, &tp, syn + SEC(31), &back), -ENOENT);
	nat_table_free(t);
}

/* Established entries, then a flood from one /24 (200 hosts, 10 SYNs each): the /24 gets the
 * quiet entries plus its per-net share, the rest is refused and counted; another source still
 * gets in, a flooding host hits its own limit, the established mappings are untouched, and
 * once the flood's entries expire the /24 may open connections again. */
Test(nat_flood, per_net_and_per_host_limits)
{
	struct nat_config c = cfg_flood();
	struct nat_table *t = table(&c);
	struct nat_tuple est[10], tp;
	struct flow_key back;
	uint64_t gen, created0;
	uint32_t ok = 0, refused = 0;
	const uint32_t flood_net = 0xc6336400; /* 198.51.100.0/24 */

	for (uint16_t i = 0; i < 10; i++) {
		struct flow_key k = key4(0xc0000207, (uint16_t)(30000 + i));

		cr_assert_eq(nat_uplink(t, &k, true, SEC(1), &est[i]), 0);
		cr_assert_eq(nat_accept(t, &est[i], SEC(1), &back, &gen), 0);
	}
	created0 = CTR(t, created);
	for (uint16_t n = 0; n < 10; n++)
		for (uint32_t h = 1; h <= 200; h++) {
			struct flow_key k = key4(flood_net | h, (uint16_t)(1000 + n));
			int ret = nat_uplink(t, &k, true, SEC(2), &tp);

			cr_assert(ret == 0 || ret == -EBUSY, "ret %d", ret);
			ok += ret == 0;
			refused += ret == -EBUSY;
		}
	cr_expect_eq(ok, c.half_open_quiet + c.half_open_per_net, "created %u", ok);
	cr_expect_eq(refused, 2000 - ok);
	cr_expect_eq(CTR(t, half_open_net), refused);
	cr_expect_eq(CTR(t, half_open_host), 0);
	cr_expect_eq(CTR(t, half_open_full), 0);
	cr_expect_eq(CTR(t, budget_exhausted), 0);
	cr_expect_eq(CTR(t, created) - created0, ok);
	cr_expect_eq(half_open(t), ok);

	/* Another network: in. One of its hosts flooding: its per-host limit. */
	struct flow_key other = key4(0xcb007105, 5555);
	cr_assert_eq(nat_uplink(t, &other, true, SEC(3), &tp), 0);
	ok = refused = 0;
	for (uint16_t n = 0; n < 40; n++) {
		struct flow_key k = key4(0xcb007109, (uint16_t)(2000 + n));
		int ret = nat_uplink(t, &k, true, SEC(3), &tp);

		ok += ret == 0;
		refused += ret == -EBUSY;
	}
	cr_expect_eq(ok, c.half_open_per_host);
	cr_expect_eq(refused, 40 - c.half_open_per_host);
	cr_expect_eq(CTR(t, half_open_host), refused);

	/* The established flows: untouched and translating. */
	for (int i = 0; i < 10; i++) {
		enum nat_state st;

		cr_assert_eq(nat_peek(t, &est[i], &st, &gen), 0);
		cr_expect_eq(st, NAT_ACTIVE);
		cr_expect_eq(nat_downlink(t, &est[i], SEC(4), &back), 0);
	}

	/* The flood expires; its network's share is free again. */
	cr_expect_gt(nat_purge(t, SEC(3) + c.half_open_ns, 100000), 0);
	cr_expect_eq(half_open(t), 0);
	ok = 0;
	for (uint32_t h = 1; h <= 200; h++) {
		struct flow_key k = key4(flood_net | h, 7000);

		ok += nat_uplink(t, &k, true, SEC(40), &tp) == 0;
	}
	cr_expect_eq(ok, c.half_open_quiet + c.half_open_per_net);
	nat_table_free(t);
}

/* An accepted connection leaves the HALF_OPEN share (its per-source count too), and IPv6
 * sources are counted per /64 (host) and /48 (network). */
Test(nat_flood, accept_frees_the_share_v6)
{
	struct nat_config c = cfg_flood();
	struct nat_table *t;
	struct nat_tuple tp[32];
	struct flow_key back;
	uint64_t gen;
	uint32_t ok = 0;

	c.half_open_quiet = 0; /* count from the first entry */
	t = table(&c);
	/* 32 SYNs from different addresses of one /64: the host limit (16). */
	for (uint16_t i = 0; i < 32; i++) {
		struct flow_key k = key6(7, (uint16_t)(i + 1), 4000);

		if (nat_uplink(t, &k, true, SEC(1), &tp[ok]) == 0)
			ok++;
	}
	cr_expect_eq(ok, c.half_open_per_host);
	cr_expect_eq(CTR(t, half_open_host), 32 - c.half_open_per_host);
	/* Accepting 4 of them makes room for 4 more from that /64. */
	for (int i = 0; i < 4; i++)
		cr_assert_eq(nat_accept(t, &tp[i], SEC(2), &back, &gen), 0);
	ok = 0;
	for (uint16_t i = 0; i < 8; i++) {
		struct flow_key k = key6(7, (uint16_t)(100 + i), 4001);

		ok += nat_uplink(t, &k, true, SEC(2), &tp[31]) == 0;
	}
	cr_expect_eq(ok, 4);
	/* Other /64s of the same /48 fill the network's limit (64): 20 in all so far. */
	ok = 0;
	for (uint16_t s = 8; s < 20; s++)
		for (uint16_t i = 0; i < 10; i++) {
			struct flow_key k = key6(s, (uint16_t)(i + 1), 4002);

			ok += nat_uplink(t, &k, true, SEC(3), &tp[31]) == 0;
		}
	cr_expect_eq(ok, c.half_open_per_net - c.half_open_per_host);
	cr_expect_gt(CTR(t, half_open_net), 0);
	nat_table_free(t);
}

/* The limit in all: sources spread over many networks stop at half_open_max, the entry budget
 * keeps the rest for established connections; a SYN replacing a CLOSING mapping counts too,
 * and an accept makes room. */
Test(nat_flood, global_limit)
{
	struct nat_config c = cfg_flood();
	struct nat_table *t;
	struct nat_tuple tp[64], cl, x;
	struct flow_key back, kc = key4(0x0a000001, 999);
	uint64_t gen;
	uint32_t ok = 0;

	c.max_entries = 100;
	c.half_open_max = 50;
	t = table(&c);
	/* One CLOSING mapping first. */
	cr_assert_eq(nat_uplink(t, &kc, true, SEC(1), &cl), 0);
	cr_assert_eq(nat_accept(t, &cl, SEC(1), &back, &gen), 0);
	cr_assert_eq(nat_mark_closing(t, &cl, gen, SEC(1)), 0);
	for (uint32_t i = 0; i < 60; i++) {
		struct flow_key k = key4(0x0b000001 + (i << 8), 1234);

		if (nat_uplink(t, &k, true, SEC(2), &tp[ok]) == 0)
			ok++;
	}
	cr_expect_eq(ok, 50);
	cr_expect_eq(CTR(t, half_open_full), 10);
	cr_expect_eq(CTR(t, budget_exhausted), 0);
	cr_expect_eq(half_open(t), 50);
	/* A new SYN on the CLOSING mapping would make a 51st: refused, the mapping kept. */
	cr_expect_eq(nat_uplink(t, &kc, true, SEC(2), &x), -EBUSY);
	cr_expect_eq(CTR(t, half_open_full), 11);
	cr_expect_eq(nat_downlink(t, &cl, SEC(2), &back), 0, "CLOSING mapping kept");
	/* An accept makes room for exactly one. */
	cr_assert_eq(nat_accept(t, &tp[0], SEC(3), &back, &gen), 0);
	cr_expect_eq(nat_uplink(t, &kc, true, SEC(3), &x), 0);
	cr_expect_eq(CTR(t, replaced), 1);
	struct flow_key k2 = key4(0x0c000001, 1);
	cr_expect_eq(nat_uplink(t, &k2, true, SEC(3), &x), -EBUSY);
	cr_expect_eq(CTR(t, half_open_full), 12);
	nat_table_free(t);
}
