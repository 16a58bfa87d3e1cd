/* test_lwip_isn.c — the lwIP stack's TCP initial sequence numbers (RFC 6528): ISN = M + F(local
 * address and port, remote address and port, secret key), M a 4 µs clock (the driver's now_ns),
 * F a keyed hash whose 128-bit key each stack draws at start. A SYN is fed to the stack and the
 * ISN read from lwIP's SYN-ACK. Different keys (fresh stacks) give different ISNs for one
 * 4-tuple; one stack's ISN for one tuple moves exactly with M; different tuples differ. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <event2/event.h>
#include <string.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/log.h"
#include "core/pkt.h"
#include "stacks/lwip/lwip_isn.h"
#include "stacks/lwip/lwip_stack.h"
#include "testutil.h"

#define APP_ISN 1000u
#define NS_PER_TICK 4000 /* RFC 6528's M: a 4 microsecond timer */

static struct ts_config cfg;
static struct budget *bud;
static struct event_base *base;
static struct netstack *ns;
static struct log lg;
static uint8_t last[2048];
static size_t last_len;
static int n_out;

static int tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	cr_assert_leq(len, sizeof(last));
	memcpy(last, pkt, len);
	last_len = len;
	n_out++;
	return 0;
}

static void start(void)
{
	char err[TS_ERRLEN];

	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"stack\":\"lwip\",\"tun\":{\"address\":\"198.18.0.1/15\","
					"\"address6\":\"fd00:7f::1/64\"}}",
					&cfg, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(budget_new(&cfg.budget, &bud), 0);
	base = event_base_new();
	cr_assert(base);
	log_init(&lg, LOG_LEVEL_ERROR, 2);
	struct netstack_env env = { .base = base, .cfg = &cfg, .budget = bud, .log = &lg,
				    .tx = tx };
	cr_assert_eq(lwip_stack_ops.start(&env, &ns, err, sizeof(err)), 0, "%s", err);
}

static void stop(void)
{
	if (ns)
		lwip_stack_ops.free(ns);
	ns = NULL;
	if (base)
		event_base_free(base);
	base = NULL;
	budget_free(bud);
	bud = NULL;
	config_fini(&cfg);
}

TestSuite(lwip_isn, .init = start, .fini = stop);

static void feed(const struct tu_spec *s, int64_t now_ns)
{
	uint8_t buf[DRIVER_INPUT_ROOM]; /* the room a stack's input may build an answer in */
	size_t len = tu_build(s, buf, sizeof(buf)), ol = 0;
	struct pkt_view v;
	bool plain = false;

	cr_assert_eq(lwip_stack_ops.input(ns, 0, buf, len, NULL, now_ns, &ol, &plain, &v),
		     DRIVER_DONE);
}

/* A SYN cli:cport -> srv:sport at now_ns; returns the ISN of lwIP's SYN-ACK. */
static uint32_t syn_isn(const char *cli, uint16_t cport, const char *srv, uint16_t sport,
			int64_t now_ns)
{
	struct tu_spec s;
	struct pkt_view v;
	int before = n_out;

	tu_spec_tcp(&s, cli, cport, srv, sport);
	s.tcp_flags = TCP_SYN;
	s.seq = APP_ISN;
	s.mss = 1400;
	feed(&s, now_ns);
	cr_assert_eq(n_out, before + 1, "lwIP answered the SYN");
	cr_assert_eq(pkt_parse(&v, last, last_len), PKT_OK);
	cr_assert_eq(v.tcp_flags, TCP_SYN | TCP_ACK);
	cr_assert_eq(tu_get32(v.l4 + 8), APP_ISN + 1);
	return tu_get32(v.l4 + 4);
}

/* Reset the half-open connection, so the same tuple's next SYN makes a new pcb (new ISN). */
static void rst(const char *cli, uint16_t cport, const char *srv, uint16_t sport)
{
	struct tu_spec s;

	tu_spec_tcp(&s, cli, cport, srv, sport);
	s.tcp_flags = TCP_RST;
	s.seq = APP_ISN + 1;
	feed(&s, 0);
}

/* Two fresh stacks (two keys), the same tuple at the same instant: different ISNs. The default
 * lwIP generator gives both the same number (a counter plus the tick count, both zero here). */
Test(lwip_isn, fresh_stacks_differ_for_one_tuple)
{
	const int64_t t = 5 * 1000000000LL;
	uint32_t a4 = syn_isn("10.0.0.9", 40001, "93.184.216.34", 443, t);
	uint32_t a6 = syn_isn("fd00:7f::9", 40001, "2001:db8::80", 443, t);

	stop();
	start();
	uint32_t b4 = syn_isn("10.0.0.9", 40001, "93.184.216.34", 443, t);
	uint32_t b6 = syn_isn("fd00:7f::9", 40001, "2001:db8::80", 443, t);
	cr_assert_neq(a4, b4, "IPv4: the same ISN from two stacks: %u", a4);
	cr_assert_neq(a6, b6, "IPv6: the same ISN from two stacks: %u", a6);
}

/* One stack, one tuple: the ISN moves by exactly the 4 µs ticks elapsed (F is fixed per tuple
 * and key), so a reincarnation of the connection starts beyond the old sequence space. */
Test(lwip_isn, advances_with_time_for_one_tuple)
{
	const int64_t t0 = 7 * 1000000000LL, dt = 1000000000LL; /* one second */
	const char *cli[2] = { "10.0.0.9", "fd00:7f::9" }, *srv[2] = { "1.1.1.1", "2001:db8::1" };

	for (int f = 0; f < 2; f++) {
		uint32_t i0 = syn_isn(cli[f], 40002, srv[f], 80, t0);
		rst(cli[f], 40002, srv[f], 80);
		uint32_t i1 = syn_isn(cli[f], 40002, srv[f], 80, t0 + dt);
		rst(cli[f], 40002, srv[f], 80);
		uint32_t i2 = syn_isn(cli[f], 40002, srv[f], 80, t0 + 2 * dt);
		cr_assert_eq(i1 - i0, (uint32_t)(dt / NS_PER_TICK), "family %d: %u -> %u", f, i0, i1);
		cr_assert_eq(i2 - i1, (uint32_t)(dt / NS_PER_TICK), "family %d: %u -> %u", f, i1, i2);
	}
}

/* One stack, one instant, tuples that differ in one field each: all ISNs differ, and not by a
 * small step (a counter would give neighbours). */
Test(lwip_isn, different_tuples_differ)
{
	const int64_t t = 9 * 1000000000LL;
	uint32_t isn[6];

	isn[0] = syn_isn("10.0.0.9", 40003, "1.1.1.1", 80, t);
	isn[1] = syn_isn("10.0.0.9", 40004, "1.1.1.1", 80, t);   /* source port */
	isn[2] = syn_isn("10.0.0.10", 40003, "1.1.1.1", 80, t);  /* source address */
	isn[3] = syn_isn("10.0.0.9", 40003, "1.1.1.2", 80, t);   /* destination address */
	isn[4] = syn_isn("10.0.0.9", 40003, "1.1.1.1", 81, t);   /* destination port */
	isn[5] = syn_isn("fd00:7f::9", 40003, "2001:db8::1", 80, t);
	for (int i = 0; i < 6; i++)
		for (int j = i + 1; j < 6; j++) {
			uint32_t d = isn[i] - isn[j];
			cr_assert(d > 4096 && d < 0u - 4096, "tuples %d and %d: %u and %u", i,
				  j, isn[i], isn[j]);
		}
}

/* F is SipHash-2-4: the reference vectors of "SipHash: a fast short-input PRF" (Aumasson and
 * Bernstein; key 00..0f, message 00..len-1): empty, one 8-byte block, a block and a 7-byte tail. */
Test(lwip_isn, siphash_reference_vectors)
{
	const uint64_t k0 = 0x0706050403020100ULL, k1 = 0x0f0e0d0c0b0a0908ULL;
	uint8_t m[15];

	for (unsigned i = 0; i < sizeof(m); i++)
		m[i] = (uint8_t)i;
	cr_assert_eq(lwip_siphash24(k0, k1, m, 0), 0x726fdb47dd0e0e31ULL);
	cr_assert_eq(lwip_siphash24(k0, k1, m, 8), 0x93f5f5799a932462ULL);
	cr_assert_eq(lwip_siphash24(k0, k1, m, 15), 0xa129ca6149be45e5ULL);
}

/* The age of an ISN is the timer's advance since it was handed out: exact in 4 µs steps, for
 * either family, and the same key and tuple are all it needs (no stack). */
Test(lwip_isn_age, the_timer_since_the_isn)
{
	struct lwip_isn k = { .k0 = 0x0706050403020100ULL, .k1 = 0x0f0e0d0c0b0a0908ULL };
	uint8_t l4[4] = { 1, 1, 1, 1 }, r4[4] = { 10, 0, 0, 9 }, l6[16] = { 0x20, 0x01 },
		r6[16] = { 0xfd, 0x00, [15] = 9 };
	const int64_t t0 = 5000000000LL; /* a multiple of the 4 µs tick */
	uint32_t iss4 = lwip_isn_get(&k, 4, l4, 80, r4, 40000, t0);
	uint32_t iss6 = lwip_isn_get(&k, 6, l6, 443, r6, 40001, t0);

	cr_assert_eq(lwip_isn_age_ns(&k, 4, l4, 80, r4, 40000, iss4, t0), 0);
	cr_assert_eq(lwip_isn_age_ns(&k, 4, l4, 80, r4, 40000, iss4, t0 + 3999), 0,
		     "within a tick");
	cr_assert_eq(lwip_isn_age_ns(&k, 4, l4, 80, r4, 40000, iss4, t0 + 1000000), 1000000);
	cr_assert_eq(lwip_isn_age_ns(&k, 6, l6, 443, r6, 40001, iss6, t0 + 20000000000LL),
		     20000000000LL, "20 s, IPv6");
	/* Another tuple's ISN says nothing about this one: its F differs. */
	cr_assert_gt(lwip_isn_age_ns(&k, 4, l4, 80, r4, 40001, iss4, t0), 1000000000LL);
}
