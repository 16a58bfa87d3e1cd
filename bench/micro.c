/* micro.c — twinstack-micro: micro-benchmarks of the production packet path.
 *
 *   twinstack-micro                          every case, a table and a JSON line (ns/op)
 *   twinstack-micro --case NAME --iterations N   one case N times (for callgrind: the
 *        difference of instruction totals between two N, divided by the difference of N,
 *        is the cost of one iteration; bench/callgrind.sh does exactly that)
 *
 * Cases call the production functions (pkt_parse, sysproc_classify, rewrite_l4, nat_*,
 * gso_train_*): no second algorithm lives here. Seeds are fixed so instruction counts are deterministic.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/csum.h"
#include "core/gso.h"
#include "core/pkt.h"
#include "stacks/system/nat.h"
#include "stacks/system/rewrite.h"
#include "stacks/system/sysproc.h"

#define SEC_NS 1000000000LL

struct bench {
	struct nat_table *nat;
	struct sysproc *proc;
	uint8_t pkt[256];
	size_t len;
	int family;
	uint8_t gw[16], client[16], server[16];
	uint16_t lports_be[2];
	struct flow_key *keys; /* nat_new1024 */
	int64_t now;
	uint8_t *big;          /* rewrite4_gso: a 64 KiB super-packet; gso_train: 44 segments */
	size_t big_len;
	struct gso_train *train;
	uint64_t emitted;
};

struct micro_case {
	const char *name;
	const char *unit;     /* what one iteration is */
	uint64_t per_iter;    /* units per iteration (nat_new1024: 1024 flows) */
	uint64_t default_iters;
	int (*setup)(struct bench *b);
	void (*run)(struct bench *b, uint64_t iters);
};

static void die(const char *what, int err)
{
	fprintf(stderr, "twinstack-micro: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(1);
}

static void set_addr(uint8_t *a, int family, uint32_t low)
{
	memset(a, 0, 16);
	if (family == 6) {
		a[0] = 0xfd;
		a[1] = 0x00;
		a[15] = (uint8_t)low;
		a[14] = (uint8_t)(low >> 8);
		a[13] = (uint8_t)(low >> 16);
		a[12] = (uint8_t)(low >> 24);
	} else {
		uint32_t be = htonl(low);
		memcpy(a, &be, 4);
	}
}

/* A TCP segment client:12345 -> server:443 with ACK and 64 bytes of payload. */
static size_t build_tcp(uint8_t *b, int family, const uint8_t *src, const uint8_t *dst,
			uint16_t sport, uint16_t dport)
{
	size_t hl = family == 4 ? 20 : 40, l4 = 20 + 64;
	memset(b, 0, hl + l4);
	if (family == 4) {
		b[0] = 0x45;
		b[2] = (uint8_t)((hl + l4) >> 8);
		b[3] = (uint8_t)(hl + l4);
		b[8] = 64;
		b[9] = IPPROTO_TCP;
		memcpy(b + 12, src, 4);
		memcpy(b + 16, dst, 4);
		csum_store16(b + 10, csum_buf(b, 20));
	} else {
		b[0] = 0x60;
		b[4] = (uint8_t)(l4 >> 8);
		b[5] = (uint8_t)l4;
		b[6] = IPPROTO_TCP;
		b[7] = 64;
		memcpy(b + 8, src, 16);
		memcpy(b + 24, dst, 16);
	}
	uint8_t *t = b + hl;
	t[0] = (uint8_t)(sport >> 8);
	t[1] = (uint8_t)sport;
	t[2] = (uint8_t)(dport >> 8);
	t[3] = (uint8_t)dport;
	t[7] = 1;
	t[11] = 1;
	t[12] = 5 << 4;
	t[13] = TCP_ACK;
	t[14] = 0xff;
	for (int i = 0; i < 64; i++)
		t[20 + i] = (uint8_t)i;
	uint64_t ps = family == 4 ? csum_pseudo4(src, dst, IPPROTO_TCP, (uint32_t)l4)
				  : csum_pseudo6(src, dst, IPPROTO_TCP, (uint32_t)l4);
	csum_store16(t + 16, (uint16_t)~csum_fold(csum_partial(t, l4, ps)));
	return hl + l4;
}

static int setup_common(struct bench *b, int family, uint32_t max_entries)
{
	struct nat_config nc;
	struct sysproc_config pc;
	int ret;

	b->family = family;
	set_addr(b->gw, family, family == 4 ? 0xc6120001 : 1); /* 198.18.0.1 / fd00::1 */
	set_addr(b->client, family, family == 4 ? 0xc6120009 : 9);
	set_addr(b->server, family, family == 4 ? 0x01010101 : 0x01010101);
	if (family == 6)
		b->server[0] = 0x20, b->server[1] = 0x01;
	b->lports_be[0] = htons(40000);
	b->lports_be[1] = htons(40001);

	nat_config_default(&nc);
	nc.max_entries = max_entries;
	nc.seed = 0x5eed;
	if ((ret = nat_table_new(&nc, &b->nat)) != 0)
		return ret;
	memset(&pc, 0, sizeof(pc));
	pc.n_addrs = nc.n_addrs;
	pc.n_listeners = 2;
	struct sys_family *f = family == 4 ? &pc.v4 : &pc.v6;
	f->enabled = true;
	memcpy(f->gateway, b->gw, 16);
	memcpy(f->listener_ports_be, b->lports_be, sizeof(b->lports_be));
	if ((ret = sysproc_new(&pc, b->nat, &b->proc)) != 0)
		return ret;
	b->len = build_tcp(b->pkt, family, b->client, b->server, 12345, 443);
	b->now = SEC_NS;
	return 0;
}

static int setup_rewrite4(struct bench *b) { return setup_common(b, 4, 16); }
static int setup_rewrite6(struct bench *b) { return setup_common(b, 6, 16); }

/* One iteration: parse + classify + rewrite, alternating uplink and downlink on one buffer.
 * The fixed mapping sends uplink client:12345 -> server:443 to the downlink form
 * gateway:40000 -> nat0:1024 (same words replaced as a real uplink rewrite), and downlink
 * back to server:443 -> ... the original, so the buffer never needs a reset copy. */
static void run_rewrite(struct bench *b, uint64_t iters)
{
	uint8_t nat0[16];
	struct pkt_view v;
	struct nat_tuple t;

	memcpy(nat0, b->gw, 16);
	nat0[b->family == 4 ? 3 : 15]++;
	for (uint64_t i = 0; i < iters; i++) {
		if (pkt_parse(&v, b->pkt, b->len) != PKT_OK)
			die("parse", EINVAL);
		if (sysproc_classify(b->proc, &v, &t) == SYS_UPLINK)
			rewrite_l4(&v, b->gw, b->lports_be[0], nat0, htons(1024), false);
		else
			rewrite_l4(&v, b->client, htons(12345), b->server, htons(443), false);
	}
}

/* ---- offload ------------------------------------------------------------------------------- */

#define GSO_SEG 1448
#define GSO_NSEG 44

/* A TSO super-packet as the kernel hands it over: 44 x 1448 bytes, NEEDS_CSUM (the field
 * holds the pseudo-header sum over the whole L4 length). */
static int setup_rewrite4_gso(struct bench *b)
{
	int ret = setup_common(b, 4, 16);
	size_t l4 = 20 + (size_t)GSO_NSEG * GSO_SEG;

	if (ret)
		return ret;
	b->big_len = 20 + l4;
	if (!(b->big = calloc(1, b->big_len)))
		return -ENOMEM;
	memcpy(b->big, b->pkt, 40); /* the headers of the small packet ... */
	b->big[2] = (uint8_t)(b->big_len >> 8);
	b->big[3] = (uint8_t)b->big_len;
	csum_store16(b->big + 10, 0);
	csum_store16(b->big + 10, csum_buf(b->big, 20));
	for (size_t i = 40; i < b->big_len; i++)
		b->big[i] = (uint8_t)i;
	csum_store16(b->big + 36, csum_fold(csum_pseudo4(b->client, b->server, IPPROTO_TCP,
							(uint32_t)l4)));
	return 0;
}

/* One iteration: the whole in-place rewrite of one 64 KiB super-packet (parse, classify,
 * partial-checksum rewrite), alternating directions as run_rewrite does. The cost does not
 * depend on the payload: per 1448-byte segment it is this figure / 44. */
static void run_rewrite_gso(struct bench *b, uint64_t iters)
{
	uint8_t nat0[16];
	struct pkt_view v;
	struct nat_tuple t;

	memcpy(nat0, b->gw, 16);
	nat0[3]++;
	for (uint64_t i = 0; i < iters; i++) {
		if (pkt_parse(&v, b->big, b->big_len) != PKT_OK)
			die("parse", EINVAL);
		if (sysproc_classify(b->proc, &v, &t) == SYS_UPLINK)
			rewrite_l4(&v, b->gw, b->lports_be[0], nat0, htons(1024), true);
		else
			rewrite_l4(&v, b->client, htons(12345), b->server, htons(443), true);
	}
}

static void count_emit(void *arg, const uint8_t *pkt, size_t len, const struct pkt_meta *m)
{
	struct bench *b = arg;
	(void)pkt;
	(void)len;
	b->emitted += m->gso_type != PKT_GSO_NONE;
}

/* lwIP-style output: 44 consecutive 1448-byte segments of one flow. */
static int setup_gso_train(struct bench *b)
{
	size_t one = 40 + GSO_SEG;
	int ret = gso_train_new(NULL, count_emit, b, &b->train);

	if (ret)
		return ret;
	b->big_len = one;
	if (!(b->big = calloc(GSO_NSEG, one)))
		return -ENOMEM;
	set_addr(b->client, 4, 0xc6120009);
	set_addr(b->server, 4, 0x01010101);
	for (int i = 0; i < GSO_NSEG; i++) {
		uint8_t *p = b->big + (size_t)i * one, *t = p + 20;
		p[0] = 0x45;
		p[2] = (uint8_t)(one >> 8);
		p[3] = (uint8_t)one;
		p[5] = (uint8_t)i;
		p[8] = 64;
		p[9] = IPPROTO_TCP;
		memcpy(p + 12, b->server, 4);
		memcpy(p + 16, b->client, 4);
		csum_store16(p + 10, csum_buf(p, 20));
		t[0] = 0x01, t[1] = 0xbb, t[2] = 0x30, t[3] = 0x39;
		uint32_t seq = 1000 + (uint32_t)i * GSO_SEG;
		t[4] = (uint8_t)(seq >> 24), t[5] = (uint8_t)(seq >> 16);
		t[6] = (uint8_t)(seq >> 8), t[7] = (uint8_t)seq;
		t[11] = 1;
		t[12] = 5 << 4;
		t[13] = TCP_ACK;
		t[14] = 0xff;
		for (int k = 0; k < GSO_SEG; k++)
			t[20 + k] = (uint8_t)(i + k);
		uint64_t ps = csum_pseudo4(b->server, b->client, IPPROTO_TCP, 20 + GSO_SEG);
		csum_store16(t + 16, (uint16_t)~csum_fold(csum_partial(t, 20 + GSO_SEG, ps)));
	}
	return 0;
}

/* One iteration: 44 segments offered and the train flushed (one super-packet emitted). */
static void run_gso_train(struct bench *b, uint64_t iters)
{
	for (uint64_t i = 0; i < iters; i++) {
		for (int k = 0; k < GSO_NSEG; k++)
			gso_train_add(b->train, b->big + (size_t)k * b->big_len, b->big_len);
		gso_train_flush(b->train);
	}
	if (b->emitted == 0 && iters)
		die("gso_train", EINVAL);
}

static int setup_nat_steady(struct bench *b)
{
	int ret = setup_common(b, 4, 65536);
	struct flow_key k;
	struct nat_tuple t;
	uint64_t gen;

	if (ret)
		return ret;
	/* 10,000 established flows; ours is the last one. */
	for (uint32_t i = 0; i < 10000; i++) {
		memset(&k, 0, sizeof(k));
		k.family = 4;
		k.proto = IPPROTO_TCP;
		memcpy(k.src, b->client, 4);
		memcpy(k.dst, b->server, 4);
		k.sport_be = htons((uint16_t)(i == 9999 ? 12345 : 20000 + i));
		k.dport_be = htons(443);
		if (i != 9999)
			k.src[3] = (uint8_t)(i % 200 + 20);
		if ((ret = nat_uplink(b->nat, &k, true, b->now, &t)) != 0)
			return ret;
		if ((ret = nat_accept(b->nat, &t, b->now, &k, &gen)) != 0)
			return ret;
	}
	return 0;
}

/* One iteration: parse + classify + NAT lookup + rewrite; uplink and downlink alternate as in
 * run_rewrite, but the mapping comes from the table (uplink: forward map, downlink: reverse). */
static void run_nat_steady(struct bench *b, uint64_t iters)
{
	struct pkt_view v;
	struct nat_tuple t;
	struct flow_key k;
	uint8_t nat[16];

	for (uint64_t i = 0; i < iters; i++) {
		if (pkt_parse(&v, b->pkt, b->len) != PKT_OK)
			die("parse", EINVAL);
		if (sysproc_classify(b->proc, &v, &t) == SYS_UPLINK) {
			pkt_flow_key(&v, &k);
			if (nat_uplink(b->nat, &k, false, b->now, &t) != 0)
				die("nat_uplink", ENOENT);
			uint32_t gw;
			memcpy(&gw, b->gw, 4);
			uint32_t lo = htonl(ntohl(gw) + 1 + t.addr);
			memcpy(nat, &lo, 4);
			rewrite_l4(&v, b->gw, b->lports_be[t.listener], nat, htons(t.port), false);
		} else {
			if (nat_downlink(b->nat, &t, b->now, &k) != 0)
				die("nat_downlink", ENOENT);
			/* Production writes server -> client; writing the key as it was keeps the
			 * buffer an uplink packet for the next iteration (same words replaced). */
			rewrite_l4(&v, k.src, k.sport_be, k.dst, k.dport_be, false);
		}
	}
}

static int setup_nat_new(struct bench *b)
{
	int ret = setup_common(b, 4, 65536);
	if (ret)
		return ret;
	b->keys = calloc(1024, sizeof(*b->keys));
	if (!b->keys)
		return -ENOMEM;
	for (uint32_t i = 0; i < 1024; i++) {
		struct flow_key *k = &b->keys[i];
		k->family = 4;
		k->proto = IPPROTO_TCP;
		memcpy(k->src, b->client, 4);
		memcpy(k->dst, b->server, 4);
		k->src[3] = (uint8_t)(i & 0xff);
		k->sport_be = htons((uint16_t)(30000 + i));
		k->dport_be = htons(443);
	}
	return 0;
}

/* One iteration: 1,024 new flows into an empty table (pure SYN -> HALF_OPEN), then the clock
 * passes their half-open timeout and purge removes them (tuples to quarantine), then it passes
 * the quarantine and purge releases the tuples. */
static void run_nat_new(struct bench *b, uint64_t iters)
{
	struct nat_tuple t;

	for (uint64_t i = 0; i < iters; i++) {
		for (uint32_t j = 0; j < 1024; j++)
			if (nat_uplink(b->nat, &b->keys[j], true, b->now, &t) != 0)
				die("nat_uplink", ENOSPC);
		b->now += 31 * SEC_NS;
		if (nat_purge(b->nat, b->now, 1024) != 1024)
			die("nat_purge", EAGAIN);
		b->now += 61 * SEC_NS;
		nat_purge(b->nat, b->now, 1024);
	}
}

static const struct micro_case cases[] = {
	{ "rewrite4", "packet", 1, 2000000, setup_rewrite4, run_rewrite },
	{ "rewrite6", "packet", 1, 2000000, setup_rewrite6, run_rewrite },
	{ "nat_steady", "packet", 1, 2000000, setup_nat_steady, run_nat_steady },
	{ "nat_new1024", "flow", 1024, 200, setup_nat_new, run_nat_new },
	{ "rewrite4_gso", "super-packet", 1, 2000000, setup_rewrite4_gso, run_rewrite_gso },
	{ "gso_train", "segment", GSO_NSEG, 20000, setup_gso_train, run_gso_train },
};
#define N_CASES (sizeof(cases) / sizeof(cases[0]))

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * SEC_NS + ts.tv_nsec;
}

static void teardown(struct bench *b)
{
	sysproc_free(b->proc);
	nat_table_free(b->nat);
	gso_train_free(b->train);
	free(b->big);
	free(b->keys);
	memset(b, 0, sizeof(*b));
}

static double time_case(const struct micro_case *c, uint64_t iters)
{
	struct bench b = { 0 };
	int ret = c->setup(&b);
	if (ret)
		die(c->name, ret);
	c->run(&b, iters / 10 + 1); /* warm caches and the table's free lists */
	int64_t t0 = mono_ns();
	c->run(&b, iters);
	int64_t t1 = mono_ns();
	teardown(&b);
	return (double)(t1 - t0) / (double)(iters * c->per_iter);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: twinstack-micro [--json] | --case NAME --iterations N\ncases:");
	for (size_t i = 0; i < N_CASES; i++)
		fprintf(f, " %s", cases[i].name);
	fprintf(f, "\n");
}

int main(int argc, char **argv)
{
	const char *only = NULL;
	uint64_t iters = 0;
	int json_only = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--case") && i + 1 < argc)
			only = argv[++i];
		else if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
			iters = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--json"))
			json_only = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (only) {
		for (size_t i = 0; i < N_CASES; i++) {
			if (strcmp(cases[i].name, only) != 0)
				continue;
			struct bench b = { 0 };
			int ret = cases[i].setup(&b);
			if (ret)
				die(cases[i].name, ret);
			cases[i].run(&b, iters);
			teardown(&b);
			return 0;
		}
		fprintf(stderr, "twinstack-micro: unknown case '%s'\n", only);
		usage(stderr);
		return 2;
	}
	double ns[N_CASES];
	for (size_t i = 0; i < N_CASES; i++)
		ns[i] = time_case(&cases[i], iters ? iters : cases[i].default_iters);
	if (!json_only) {
		printf("%-12s %10s  %s\n", "case", "ns/op", "op");
		for (size_t i = 0; i < N_CASES; i++)
			printf("%-12s %10.1f  %s\n", cases[i].name, ns[i], cases[i].unit);
	}
	printf("{\"micro\":{");
	for (size_t i = 0; i < N_CASES; i++)
		printf("%s\"%s\":{\"ns_per_op\":%.2f,\"op\":\"%s\"}", i ? "," : "", cases[i].name,
		       ns[i], cases[i].unit);
	printf("}}\n");
	return 0;
}
