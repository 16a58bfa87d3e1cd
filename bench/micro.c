/* micro.c — twinstack-micro: micro-benchmarks of the production packet path.
 *
 *   twinstack-micro                          every case, a table and a JSON line (ns/op)
 *   twinstack-micro --case NAME --iterations N   one case N times (for callgrind: the
 *        difference of instruction totals between two N, divided by the difference of N,
 *        is the cost of one iteration; bench/callgrind.sh does exactly that)
 *
 * Cases call the production functions (pkt_parse, sysproc_classify, rewrite_l4, nat_*,
 * gso_train_*, each stack's per-packet input: sysproc_process, lwip_stack_ops.input, and the
 * UDP path's entries behind the system stack: udp_path_input_view, udp_path_input): no second
 * algorithm lives here. Seeds are fixed so instruction counts are deterministic.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/csum.h"
#include "core/domain_set.h"
#include "core/gso.h"
#include "core/log.h"
#include "core/loopguard.h"
#include "core/pkt.h"
#include "dispatch/stream.h"
#include "dispatch/udp.h"
#include "stacks/lwip/lwip_stack.h"
#include "stacks/netstack.h"
#include "stacks/system/nat.h"
#include "stacks/common/rewrite.h"
#include "stacks/system/sysproc.h"

#define SEC_NS 1000000000LL

struct bench {
	struct nat_table *nat;
	struct sysproc *proc;
	uint8_t pkt[DRIVER_INPUT_ROOM]; /* the room a stack's input may build an answer in */
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
	/* Stack input cases: the packet as built (restored before each iteration when the
	 * stack rewrites it in place) and the verdict every iteration must give. */
	uint8_t orig[256];
	bool restore;
	int expect;
	struct sys_counters sctr;
	struct ts_config *cfg; /* lwIP */
	struct budget *bud;
	struct event_base *base;
	struct log lg;
	struct netstack *ns;
	struct udp_path *up;   /* sys_udp*_path cases */
	uint64_t sent;         /* datagrams the UDP path's sendto stand-in took */
	struct loopguard *guard; /* the stacks' loop check, as a running proxy has it */
	struct domain_set *ds;   /* domain_suffix_100k */
	char (*names)[64];
	size_t *name_len;
	bool *name_hit;
	struct stream **streams; /* lw_synflood: the established connections' */
	size_t n_streams;
	uint8_t last[256];       /* ... and the last packet the stack sent (a SYN-ACK) */
	uint32_t flood_src;      /* ... the next spoofed source */
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

/* An IPv4 or IPv6 packet src:sport -> dst:dport with valid checksums: TCP (a 20-byte header
 * with the given flags, seq 1, ack 1 when ACK is set, window 0xff00) or UDP, followed by
 * payload bytes 0, 1, 2, ... */
static size_t build_pkt(uint8_t *b, int family, uint8_t proto, const uint8_t *src,
			const uint8_t *dst, uint16_t sport, uint16_t dport, uint8_t tcp_flags,
			size_t payload)
{
	size_t hl = family == 4 ? 20 : 40, th = proto == IPPROTO_TCP ? 20 : 8, l4 = th + payload;
	memset(b, 0, hl + l4);
	if (family == 4) {
		b[0] = 0x45;
		b[2] = (uint8_t)((hl + l4) >> 8);
		b[3] = (uint8_t)(hl + l4);
		b[8] = 64;
		b[9] = proto;
		memcpy(b + 12, src, 4);
		memcpy(b + 16, dst, 4);
		csum_store16(b + 10, csum_buf(b, 20));
	} else {
		b[0] = 0x60;
		b[4] = (uint8_t)(l4 >> 8);
		b[5] = (uint8_t)l4;
		b[6] = proto;
		b[7] = 64;
		memcpy(b + 8, src, 16);
		memcpy(b + 24, dst, 16);
	}
	uint8_t *t = b + hl;
	t[0] = (uint8_t)(sport >> 8);
	t[1] = (uint8_t)sport;
	t[2] = (uint8_t)(dport >> 8);
	t[3] = (uint8_t)dport;
	if (proto == IPPROTO_TCP) {
		t[7] = 1;
		t[11] = tcp_flags & TCP_ACK ? 1 : 0;
		t[12] = 5 << 4;
		t[13] = tcp_flags;
		t[14] = 0xff;
	} else {
		pkt_put16(t + UDP_OFF_LEN, (uint16_t)l4);
	}
	for (size_t i = 0; i < payload; i++)
		t[th + i] = (uint8_t)i;
	uint64_t ps = family == 4 ? csum_pseudo4(src, dst, proto, (uint32_t)l4)
				  : csum_pseudo6(src, dst, proto, (uint32_t)l4);
	uint16_t sum = (uint16_t)~csum_fold(csum_partial(t, l4, ps));
	if (proto == IPPROTO_UDP && sum == 0)
		sum = 0xffff; /* RFC 768: a computed 0 is sent as all ones */
	csum_store16(t + (proto == IPPROTO_TCP ? TCP_OFF_CSUM : UDP_OFF_CSUM), sum);
	return hl + l4;
}

/* A TCP segment client:12345 -> server:443 with ACK and 64 bytes of payload. */
static size_t build_tcp(uint8_t *b, int family, const uint8_t *src, const uint8_t *dst,
			uint16_t sport, uint16_t dport)
{
	return build_pkt(b, family, IPPROTO_TCP, src, dst, sport, dport, TCP_ACK, 64);
}

/* Gateway 198.18.0.1 / fd00::1, client 198.18.0.9 / fd00::9, server 1.1.1.1 / 2001::101:101. */
static void set_addrs(struct bench *b, int family)
{
	b->family = family;
	set_addr(b->gw, family, family == 4 ? 0xc6120001 : 1);
	set_addr(b->client, family, family == 4 ? 0xc6120009 : 9);
	set_addr(b->server, family, 0x01010101);
	if (family == 6)
		b->server[0] = 0x20, b->server[1] = 0x01;
}

static int setup_common(struct bench *b, int family, uint32_t max_entries)
{
	struct nat_config nc;
	struct sysproc_config pc;
	int ret;

	set_addrs(b, family);
	b->lports_be[0] = htons(40000);
	b->lports_be[1] = htons(40001);

	nat_config_default(&nc);
	nc.max_entries = max_entries;
	nc.seed = 0x5eed;
	if ((ret = nat_table_new(&nc, &b->nat)) != 0)
		return ret;
	memset(&pc, 0, sizeof(pc));
	if ((ret = loopguard_new(b->gw, b->gw, &b->guard)) != 0)
		return ret;
	pc.loopguard = b->guard;
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

/* ---- each stack's per-packet input -------------------------------------------------------- */

/* The packet of a stack input case: a UDP datagram client:5353 -> server:443 with 64 bytes of
 * payload (to the UDP path), or a pure SYN client:12345 -> server:443 (a retransmitted one
 * after the first iteration: the system stack finds its half-open NAT entry, lwIP its SYN_RCVD
 * pcb and answers with a SYN-ACK again). */
static void build_input(struct bench *b, uint8_t proto)
{
	if (proto == IPPROTO_UDP)
		b->len = build_pkt(b->pkt, b->family, IPPROTO_UDP, b->client, b->server, 5353, 443,
				   0, 64);
	else
		b->len = build_pkt(b->pkt, b->family, IPPROTO_TCP, b->client, b->server, 12345,
				   443, TCP_SYN, 0);
	memcpy(b->orig, b->pkt, b->len);
}

static int setup_sys(struct bench *b, int family, uint8_t proto)
{
	int ret = setup_common(b, family, 16);

	if (ret)
		return ret;
	build_input(b, proto);
	b->restore = proto == IPPROTO_TCP; /* the uplink rewrite changes the buffer */
	b->expect = proto == IPPROTO_UDP ? SYS_UDP : SYS_WRITE;
	return 0;
}

static int setup_sys_udp4(struct bench *b) { return setup_sys(b, 4, IPPROTO_UDP); }
static int setup_sys_udp6(struct bench *b) { return setup_sys(b, 6, IPPROTO_UDP); }
static int setup_sys_syn4(struct bench *b) { return setup_sys(b, 4, IPPROTO_TCP); }
static int setup_sys_syn6(struct bench *b) { return setup_sys(b, 6, IPPROTO_TCP); }

/* One iteration: the system stack's whole per-packet processing (parse, policy, and for the
 * SYN the NAT lookup and the uplink rewrite), as the driver calls it. */
static void run_sys_input(struct bench *b, uint64_t iters)
{
	struct pkt_view v;

	for (uint64_t i = 0; i < iters; i++) {
		if (b->restore)
			memcpy(b->pkt, b->orig, b->len);
		struct sys_disp d =
			sysproc_process(b->proc, b->pkt, b->len, NULL, b->now, &b->sctr, &v);
		if ((int)d.action != b->expect)
			die("sysproc_process", EINVAL);
	}
}

/* The system stack's input and then the UDP path, as the driver and queue 0 run them for one
 * datagram: the stack's view handed on (sys_udp*_path) or the raw bytes parsed again
 * (sys_udp4_path_raw: the entry a queue > 0 hand-off uses). Uplink trains are on and each
 * datagram is a batch of its own (the batch ended after it): the case where no train forms,
 * the datagram copied into the train's buffer and sent alone at the batch end. The path's
 * outbound send is a stand-in that takes the datagram without a syscall, so the case measures
 * our code only; the first iteration opens the session and its outbound socket. */
static ssize_t null_sendto(void *arg, int fd, const void *buf, size_t len,
			   const struct sockaddr *to, socklen_t tolen)
{
	struct bench *b = arg;
	(void)fd;
	(void)buf;
	(void)to;
	(void)tolen;
	b->sent++;
	return (ssize_t)len;
}

/* A train's stand-in: its datagrams counted. */
static ssize_t null_sendgso(void *arg, int fd, const void *buf, size_t len,
			    const struct sockaddr *to, socklen_t tolen, uint16_t seg)
{
	struct bench *b = arg;
	(void)fd;
	(void)buf;
	(void)to;
	(void)tolen;
	b->sent += (len + seg - 1) / seg;
	return (ssize_t)len;
}

static int null_tx(void *arg, const uint8_t *pkt, size_t len)
{
	(void)arg;
	(void)pkt;
	(void)len;
	return 0;
}

static int setup_sys_path(struct bench *b, int family)
{
	char err[TS_ERRLEN];
	int ret = setup_sys(b, family, IPPROTO_UDP);

	if (ret)
		return ret;
	if (!(b->cfg = calloc(1, sizeof(*b->cfg))))
		return -ENOMEM;
	config_init(b->cfg);
	if ((ret = config_load_string("{}", b->cfg, err, sizeof(err))) != 0) {
		fprintf(stderr, "twinstack-micro: config: %s\n", err);
		return ret;
	}
	if ((ret = budget_new(&b->cfg->budget, &b->bud)) != 0)
		return ret;
	if (!(b->base = event_base_new()))
		return -ENOMEM;
	if ((ret = udp_path_new(b->base, b->cfg, b->bud, null_tx, b, &b->up)) != 0)
		return ret;
	udp_path_set_sendto(b->up, null_sendto, b);
	udp_path_set_sendgso(b->up, null_sendgso, b);
	/* As the proxy runs it: datagrams out in trains, each batch ended. */
	if ((ret = udp_path_set_uptrains(b->up, true)) != 0)
		return ret;
	return 0;
}

static int setup_sys_path4(struct bench *b) { return setup_sys_path(b, 4); }
static int setup_sys_path6(struct bench *b) { return setup_sys_path(b, 6); }

/* iters batches of batch datagrams each (inlined: each case's loop is its own). */
static inline __attribute__((always_inline)) void run_sys_path(struct bench *b, uint64_t iters,
							       bool view, int batch)
{
	uint64_t before = b->sent;
	struct pkt_view v;

	for (uint64_t i = 0; i < iters; i++) {
		for (int j = 0; j < batch; j++) {
			struct sys_disp d = sysproc_process(b->proc, b->pkt, b->len, NULL, b->now,
							    &b->sctr, &v);
			if (d.action != SYS_UDP)
				die("sysproc_process", EINVAL);
			if (view)
				udp_path_input_view(b->up, &v, b->now);
			else
				udp_path_input(b->up, b->pkt, b->len, b->now);
		}
		udp_path_batch_end(b->up);
	}
	if (b->sent - before != iters * (uint64_t)batch)
		die("udp path: one datagram out per datagram in", EIO);
}

static void run_sys_path_view(struct bench *b, uint64_t iters) { run_sys_path(b, iters, true, 1); }
static void run_sys_path_raw(struct bench *b, uint64_t iters) { run_sys_path(b, iters, false, 1); }
/* A batch of 16 datagrams of one flow: one train, one send. */
static void run_sys_path_train16(struct bench *b, uint64_t iters)
{
	run_sys_path(b, iters, true, 16);
}

static int count_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct bench *b = arg;
	(void)pkt;
	(void)len;
	b->emitted++;
	return 0;
}

/* count_tx, keeping the last packet too (lw_synflood reads lwIP's ISN from a SYN-ACK). */
static int keep_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct bench *b = arg;

	b->emitted++;
	memcpy(b->last, pkt, len < sizeof(b->last) ? len : sizeof(b->last));
	return 0;
}

/* tcp_sessions 0: the profile's. */
static int setup_lw_sessions(struct bench *b, int family, uint8_t proto, uint32_t tcp_sessions,
			     int (*tx)(void *arg, const uint8_t *pkt, size_t len))
{
	char err[TS_ERRLEN];
	int ret;

	set_addrs(b, family);
	if (!(b->cfg = calloc(1, sizeof(*b->cfg))))
		return -ENOMEM;
	config_init(b->cfg);
	if ((ret = config_load_string("{\"stack\":\"lwip\",\"tun\":{\"address\":\"198.18.0.1/15\","
				      "\"address6\":\"fd00::1/64\"}}",
				      b->cfg, err, sizeof(err))) != 0) {
		fprintf(stderr, "twinstack-micro: config: %s\n", err);
		return ret;
	}
	for (int t = 0; t < 3 && tcp_sessions; t++)
		b->cfg->budget.tcp_sessions[t] = tcp_sessions;
	for (int t = 0; t < 3 && tcp_sessions; t++)
		b->cfg->budget.tcp_sessions[t] = tcp_sessions;
	if ((ret = budget_new(&b->cfg->budget, &b->bud)) != 0)
		return ret;
	if (!(b->base = event_base_new()))
		return -ENOMEM;
	log_init(&b->lg, LOG_LEVEL_ERROR, 2);
	if ((ret = loopguard_new(b->gw, b->gw, &b->guard)) != 0)
		return ret;
	struct netstack_env env = { .base = b->base, .cfg = b->cfg, .budget = b->bud,
				    .log = &b->lg, .loopguard = b->guard, .tx = tx,
				    .tx_arg = b };
	if ((ret = lwip_stack_ops.start(&env, &b->ns, err, sizeof(err))) != 0) {
		fprintf(stderr, "twinstack-micro: %s\n", err);
		return ret;
	}
	build_input(b, proto);
	b->expect = proto == IPPROTO_UDP ? DRIVER_UDP : DRIVER_DONE;
	return 0;
}

static int setup_lw(struct bench *b, int family, uint8_t proto)
{
	return setup_lw_sessions(b, family, proto, 0, count_tx);
}

static int setup_lw_udp4(struct bench *b) { return setup_lw(b, 4, IPPROTO_UDP); }
static int setup_lw_udp6(struct bench *b) { return setup_lw(b, 6, IPPROTO_UDP); }
static int setup_lw_syn4(struct bench *b) { return setup_lw(b, 4, IPPROTO_TCP); }
static int setup_lw_syn6(struct bench *b) { return setup_lw(b, 6, IPPROTO_TCP); }

/* One iteration: the lwIP stack's input as the driver calls it (parse, policy; for the SYN the
 * copy into a pbuf, lwIP's input hook and tcp_input, which sends the SYN-ACK again). */
static void run_lw_input(struct bench *b, uint64_t iters)
{
	uint64_t before = b->emitted;
	struct pkt_view v;
	size_t out_len;
	bool plain;

	for (uint64_t i = 0; i < iters; i++) {
		if ((int)lwip_stack_ops.input(b->ns, 0, b->pkt, b->len, NULL, b->now, &out_len,
					      &plain, &v) != b->expect)
			die("lwip input", EINVAL);
	}
	if (b->expect == DRIVER_DONE && b->emitted - before != iters)
		die("lwip input: one SYN-ACK per SYN", EINVAL);
}

/* ---- lwIP: a SYN flood beside many established connections ----------------------------- */

#define FLOOD_CONNS 10000
#define FLOOD_STEP_NS 1000 /* one spoofed SYN a microsecond */
#define FLOOD_WARMUP 4000  /* SYNs that fill the backlog and reach the eviction's rhythm */

static void keep_stream(void *arg, const struct flow_key *k, struct stream *s)
{
	struct bench *b = arg;

	(void)k;
	if (b->n_streams == FLOOD_CONNS)
		die("lw_synflood: more connections than made", EINVAL);
	b->streams[b->n_streams++] = s;
}

/* Set a built segment's sequence and acknowledgement numbers, and its checksum again. */
static void set_seq(uint8_t *p, size_t len, uint32_t seq, uint32_t ack)
{
	uint8_t *t = p + 20;

	pkt_put16(t + 4, (uint16_t)(seq >> 16));
	pkt_put16(t + 6, (uint16_t)seq);
	pkt_put16(t + 8, (uint16_t)(ack >> 16));
	pkt_put16(t + 10, (uint16_t)ack);
	csum_store16(t + TCP_OFF_CSUM, 0);
	csum_store16(t + TCP_OFF_CSUM,
		     (uint16_t)~csum_fold(csum_partial(t, len - 20,
						       csum_pseudo4(p + 12, p + 16, IPPROTO_TCP,
								    (uint32_t)(len - 20)))));
}

static void flood_input(struct bench *b)
{
	struct pkt_view v;
	size_t out_len;
	bool plain;

	if ((int)lwip_stack_ops.input(b->ns, 0, b->pkt, b->len, NULL, b->now, &out_len, &plain,
				      &v) != DRIVER_DONE)
		die("lwip input", EINVAL);
}

/* One spoofed SYN from a source of its own, a microsecond after the last. */
static void flood_syn(struct bench *b)
{
	uint8_t src[16];

	set_addr(src, 4, 0x0b000001 + b->flood_src++);
	b->len = build_pkt(b->pkt, 4, IPPROTO_TCP, src, b->server, 20000, 443, TCP_SYN, 0);
	b->now += FLOOD_STEP_NS;
	flood_input(b);
}

/* FLOOD_CONNS connections established (10.0.0.0/16 to 1.1.1.1:443, each handshake completed),
 * then a spread flood that fills the listener's backlog and reaches its eviction's rhythm. */
static int setup_lw_synflood(struct bench *b)
{
	uint8_t src[16];
	int ret;

	if ((ret = setup_lw_sessions(b, 4, IPPROTO_TCP, 2 * FLOOD_CONNS, keep_tx)) != 0)
		return ret;
	if (!(b->streams = calloc(FLOOD_CONNS, sizeof(*b->streams))))
		return -ENOMEM;
	lwip_stack_set_accept_hook(b->ns, keep_stream, b);
	for (uint32_t i = 0; i < FLOOD_CONNS; i++) {
		set_addr(src, 4, 0x0a000001 + i);
		b->len = build_pkt(b->pkt, 4, IPPROTO_TCP, src, b->server, 40000, 443, TCP_SYN, 0);
		b->now += FLOOD_STEP_NS;
		flood_input(b);
		uint32_t isn = pkt_get32(b->last + 20 + 4);
		b->len = build_pkt(b->pkt, 4, IPPROTO_TCP, src, b->server, 40000, 443, TCP_ACK, 0);
		set_seq(b->pkt, b->len, 2, isn + 1);
		flood_input(b);
	}
	event_base_loop(b->base, EVLOOP_NONBLOCK); /* the accepted connections to keep_stream */
	if (b->n_streams != FLOOD_CONNS)
		die("lw_synflood: connections not established", EINVAL);
	for (int i = 0; i < FLOOD_WARMUP; i++)
		flood_syn(b);
	return 0;
}

/* One iteration: one spoofed SYN (most find the backlog full and are dropped; some make the
 * eviction scan the half-open connections and get in). */
static void run_lw_synflood(struct bench *b, uint64_t iters)
{
	for (uint64_t i = 0; i < iters; i++)
		flood_syn(b);
}

/* ---- domain rules ------------------------------------------------------------------------- */

#define DS_SUFFIXES 100000
#define DS_NAMES 1024

/* 100,000 suffixes (a rule set of that size, loaded as the plain format) and 1,024 names of 3
 * to 6 labels to look up: every other one under a suffix of the set, the rest beside it. */
static int setup_domain_suffix(struct bench *b)
{
	size_t cap = (size_t)DS_SUFFIXES * 24, len = 0;
	char *text = malloc(cap);
	struct domain_load_stats st = { 0 };
	int ret;

	b->names = calloc(DS_NAMES, sizeof(*b->names));
	b->name_len = calloc(DS_NAMES, sizeof(*b->name_len));
	b->name_hit = calloc(DS_NAMES, sizeof(*b->name_hit));
	if (!text || !b->names || !b->name_len || !b->name_hit) {
		free(text);
		return -ENOMEM;
	}
	for (int i = 0; i < DS_SUFFIXES; i++)
		len += (size_t)snprintf(text + len, cap - len, "site%d.example%d.com\n", i, i % 97);
	/* A fixed hash key: with a random one the probe lengths, and so the counts, move. */
	if ((ret = domain_set_new(&b->ds)) == 0 && (ret = domain_set_set_key(b->ds, 1)) == 0)
		ret = domain_set_load(b->ds, DOMAIN_FMT_PLAIN, text, len, &st);
	free(text);
	if (ret != 0 || st.added != DS_SUFFIXES)
		return ret ? ret : -EINVAL;
	for (int i = 0; i < DS_NAMES; i++) {
		int site = (i * 7919) % DS_SUFFIXES, depth = i % 4;
		bool hit = i % 2 == 0;
		b->name_len[i] = (size_t)snprintf(b->names[i], sizeof(b->names[i]), "%s%ssite%d.example%d.%s",
						  depth >= 2 ? "img.": "", depth >= 1 ? "cdn." : "",
						  site, site % 97, hit ? "com" : "net");
		b->name_hit[i] = hit;
	}
	return 0;
}

/* One iteration: one lookup. */
static void run_domain_suffix(struct bench *b, uint64_t iters)
{
	for (uint64_t i = 0; i < iters; i++) {
		size_t k = i % DS_NAMES;
		if (domain_set_match(b->ds, b->names[k], b->name_len[k]) != b->name_hit[k])
			die("domain_set_match: a wrong answer", EINVAL);
	}
}

static const struct micro_case cases[] = {
	{ "rewrite4", "packet", 1, 2000000, setup_rewrite4, run_rewrite },
	{ "rewrite6", "packet", 1, 2000000, setup_rewrite6, run_rewrite },
	{ "nat_steady", "packet", 1, 2000000, setup_nat_steady, run_nat_steady },
	{ "nat_new1024", "flow", 1024, 200, setup_nat_new, run_nat_new },
	{ "rewrite4_gso", "super-packet", 1, 2000000, setup_rewrite4_gso, run_rewrite_gso },
	{ "gso_train", "segment", GSO_NSEG, 20000, setup_gso_train, run_gso_train },
	{ "sys_udp4", "packet", 1, 2000000, setup_sys_udp4, run_sys_input },
	{ "sys_udp6", "packet", 1, 2000000, setup_sys_udp6, run_sys_input },
	{ "sys_syn4", "packet", 1, 2000000, setup_sys_syn4, run_sys_input },
	{ "sys_syn6", "packet", 1, 2000000, setup_sys_syn6, run_sys_input },
	{ "sys_udp4_path", "datagram", 1, 2000000, setup_sys_path4, run_sys_path_view },
	{ "sys_udp6_path", "datagram", 1, 2000000, setup_sys_path6, run_sys_path_view },
	{ "sys_udp4_path_raw", "datagram", 1, 2000000, setup_sys_path4, run_sys_path_raw },
	{ "sys_udp4_path_train16", "datagram", 16, 125000, setup_sys_path4, run_sys_path_train16 },
	{ "lw_udp4", "packet", 1, 2000000, setup_lw_udp4, run_lw_input },
	{ "lw_udp6", "packet", 1, 2000000, setup_lw_udp6, run_lw_input },
	{ "lw_syn4", "packet", 1, 200000, setup_lw_syn4, run_lw_input },
	{ "lw_syn6", "packet", 1, 200000, setup_lw_syn6, run_lw_input },
	{ "lw_synflood", "packet", 1, 20000, setup_lw_synflood, run_lw_synflood },
	{ "domain_suffix_100k", "lookup", 1, 2000000, setup_domain_suffix, run_domain_suffix },
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
	udp_path_free(b->up);
	for (size_t i = 0; i < b->n_streams; i++)
		b->streams[i]->ops->abort(b->streams[i]);
	free(b->streams);
	if (b->ns)
		lwip_stack_ops.free(b->ns);
	if (b->base)
		event_base_free(b->base);
	budget_free(b->bud);
	if (b->cfg) {
		config_fini(b->cfg);
		free(b->cfg);
	}
	sysproc_free(b->proc);
	nat_table_free(b->nat);
	gso_train_free(b->train);
	free(b->big);
	free(b->keys);
	loopguard_free(b->guard);
	domain_set_free(b->ds);
	free(b->names);
	free(b->name_len);
	free(b->name_hit);
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
