/* sysproc.c — classify, translate and answer packets for the system stack. */
#include "stacks/system/sysproc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stacks/system/rewrite.h"

/* Per family, the gateway and the NAT addresses form one contiguous run G, G+1 .. G+n, so one
 * subtraction on the low 32 bits (the high bits compared for equality) tells "ours" and which. */
struct fam {
	bool enabled;
	uint8_t alen;
	uint8_t gateway[16];
	uint32_t gw_low;                       /* low 32 bits of the gateway, host order */
	uint8_t nat[NAT_MAX_ADDRS][16];        /* G+1+i */
	uint16_t lport_be[NAT_MAX_LISTENERS];
	uint32_t n_lports;
};

struct sysproc {
	struct sys_roles4 r4; /* first: the inline classifier reads it (sysproc.h) */
	struct nat_table *nat;
	uint32_t n_addrs;
	uint32_t n_listeners;
	bool dns_hijack;
	struct fam f4, f6;
};

static inline uint32_t low32(const uint8_t *a, uint8_t alen)
{
	uint32_t v;
	memcpy(&v, a + alen - 4, 4);
	return ntohl(v);
}

/* Offset of addr in the run G..G+n: 0 = gateway, 1+i = NAT address i; > n when not ours. */
static inline uint32_t own_offset6(const struct fam *f, const uint8_t *addr)
{
	uint64_t a, g;
	uint32_t b, h;

	memcpy(&a, addr, 8);
	memcpy(&g, f->gateway, 8);
	memcpy(&b, addr + 8, 4);
	memcpy(&h, f->gateway + 8, 4);
	if ((a ^ g) | (b ^ h))
		return UINT32_MAX;
	return low32(addr, 16) - f->gw_low;
}

static inline uint32_t own_offset(const struct fam *f, const uint8_t *addr)
{
	return f->alen == 16 ? own_offset6(f, addr) : low32(addr, 4) - f->gw_low;
}

static int fam_init(struct fam *f, const struct sys_family *c, uint8_t alen, uint32_t n_addrs)
{
	memset(f, 0, sizeof(*f));
	f->enabled = c->enabled;
	f->alen = alen;
	if (!c->enabled)
		return 0;
	memcpy(f->gateway, c->gateway, alen);
	f->gw_low = low32(c->gateway, alen);
	/* The run must not wrap the low 32 bits (config validation keeps it inside the prefix). */
	if (f->gw_low > UINT32_MAX - n_addrs)
		return -EINVAL;
	for (uint32_t i = 0; i < n_addrs; i++) {
		uint32_t lo = htonl(f->gw_low + 1 + i);
		memcpy(f->nat[i], c->gateway, alen);
		memcpy(f->nat[i] + alen - 4, &lo, 4);
	}
	return 0;
}

int sysproc_new(const struct sysproc_config *cfg, struct nat_table *nat, struct sysproc **out)
{
	int ret;
	struct sysproc *p;

	if (!nat || cfg->n_addrs < 1 || cfg->n_addrs > NAT_MAX_ADDRS || cfg->n_listeners < 1 ||
	    cfg->n_listeners > NAT_MAX_LISTENERS || (!cfg->v4.enabled && !cfg->v6.enabled))
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->nat = nat;
	p->n_addrs = cfg->n_addrs;
	p->n_listeners = cfg->n_listeners;
	p->dns_hijack = cfg->dns_hijack;
	p->r4.gw_low = cfg->v4.enabled ? low32(cfg->v4.gateway, 4) : 0;
	p->r4.n_addrs = cfg->v4.enabled ? cfg->n_addrs : 0; /* v4 off: nothing is ours */
	if ((ret = fam_init(&p->f4, &cfg->v4, 4, cfg->n_addrs)) != 0 ||
	    (ret = fam_init(&p->f6, &cfg->v6, 16, cfg->n_addrs)) != 0)
		goto fail;
	if (cfg->v4.enabled && (ret = sysproc_set_listeners(p, 4, cfg->v4.listener_ports_be,
							    cfg->n_listeners)) != 0)
		goto fail;
	if (cfg->v6.enabled && (ret = sysproc_set_listeners(p, 6, cfg->v6.listener_ports_be,
							    cfg->n_listeners)) != 0)
		goto fail;
	*out = p;
	return 0;
fail:
	free(p);
	return ret;
}

void sysproc_free(struct sysproc *p)
{
	free(p);
}

int sysproc_set_listeners(struct sysproc *p, int family, const uint16_t *ports_be, uint32_t n)
{
	struct fam *f = family == 4 ? &p->f4 : family == 6 ? &p->f6 : NULL;

	if (!f || !f->enabled || n != p->n_listeners)
		return -EINVAL;
	memcpy(f->lport_be, ports_be, n * sizeof(*ports_be));
	f->n_lports = n;
	if (family == 4) {
		memcpy(p->r4.lport_be, ports_be, n * sizeof(*ports_be));
		p->r4.n_lports = n;
	}
	return 0;
}

bool sysproc_is_own(const struct sysproc *p, int family, const uint8_t *addr)
{
	const struct fam *f = family == 4 ? &p->f4 : &p->f6;
	return f->enabled && own_offset(f, addr) <= p->n_addrs;
}

/* gateway:listener -> NAT address d-1 : P  is downlink (seed 000 §三.2); d is dst's offset. */
static inline enum sys_class downlink_tuple(const struct fam *f, const struct pkt_view *v,
					    uint32_t d, struct nat_tuple *tuple)
{
	for (uint32_t i = 0; i < f->n_lports; i++) {
		if (v->sport_be == f->lport_be[i]) {
			tuple->family = v->family;
			tuple->addr = (uint8_t)(d - 1);
			tuple->listener = (uint8_t)i;
			tuple->port = ntohs(v->dport_be);
			return SYS_DOWNLINK;
		}
	}
	return SYS_OWN;
}

/* Kept out of line so that the IPv4 path needs no stack frame. */
static __attribute__((noinline)) enum sys_class classify6(const struct sysproc *p,
							  const struct pkt_view *v,
							  struct nat_tuple *tuple)
{
	const struct fam *f = &p->f6;
	uint32_t d = own_offset6(f, v->ip + PKT_V6_DST);

	if (d > p->n_addrs)
		return SYS_UPLINK;
	if (d == 0 || own_offset6(f, v->ip + PKT_V6_SRC) != 0)
		return SYS_OWN;
	return downlink_tuple(f, v, d, tuple);
}

enum sys_class sysproc_classify_slow(const struct sysproc *p, const struct pkt_view *v,
				     struct nat_tuple *tuple)
{
	if (v->family != 4)
		return classify6(p, v, tuple);
	const struct fam *f = &p->f4;
	uint32_t d = low32(v->ip + PKT_V4_DST, 4) - f->gw_low;
	if (d > p->n_addrs)
		return SYS_UPLINK;
	if (d == 0 || memcmp(v->ip + PKT_V4_SRC, f->gateway, 4) != 0)
		return SYS_OWN;
	return downlink_tuple(f, v, d, tuple);
}

static struct sys_disp done(void)
{
	return (struct sys_disp){ .action = SYS_DONE };
}

static struct sys_disp drop(ctr_t *reason)
{
	ctr_inc(reason);
	return done();
}

static struct sys_disp tcp_downlink(struct sysproc *p, const struct pkt_view *v,
				    const struct nat_tuple *t, bool partial, int64_t now,
				    struct sys_counters *c)
{
	struct flow_key k;

	if (nat_downlink(p->nat, t, now, &k) != 0)
		return drop(&c->drop_downlink_no_mapping);
	/* Back to the original pair, reversed: server:sport -> client:cport. */
	rewrite_l4(v, k.dst, k.dport_be, k.src, k.sport_be, partial);
	ctr_inc(&c->downlink);
	return (struct sys_disp){ .action = SYS_WRITE, .len = v->len };
}

static struct sys_disp tcp_uplink(struct sysproc *p, const struct pkt_view *v, bool partial,
				  int64_t now, struct sys_counters *c)
{
	const struct fam *f = v->family == 4 ? &p->f4 : &p->f6;
	struct flow_key k;
	struct nat_tuple t;
	bool pure_syn = (v->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_SYN;

	/* Nothing legitimate comes from one of our NAT addresses (offsets 1..n; the gateway,
	 * offset 0, is where local applications send from and wraps to UINT32_MAX here). */
	if (own_offset(f, pkt_src(v)) - 1 < p->n_addrs)
		return drop(&c->drop_own_address);
	pkt_flow_key(v, &k);
	int ret = nat_uplink(p->nat, &k, pure_syn, now, &t);
	if (ret == -ENOENT) {
		/* No mapping and not a new connection: never allocate; answer with a RST
		 * so the app gives up at once — unless it is a RST itself (RFC 793). */
		if (v->tcp_flags & TCP_RST)
			return drop(&c->drop_rst_no_mapping);
		ctr_inc(&c->rst_sent);
		return (struct sys_disp){ .action = SYS_WRITE, .len = (uint32_t)rewrite_tcp_rst(v),
					  .plain = true };
	}
	if (ret == -ENOSPC)
		return drop(&c->drop_nat_budget);
	if (ret == -EADDRNOTAVAIL)
		return drop(&c->drop_nat_ports);
	if (ret != 0) /* -ENOMEM: the only other refusal for a well-formed key */
		return drop(&c->drop_nat_nomem);
	rewrite_l4(v, f->nat[t.addr], htons(t.port), f->gateway, f->lport_be[t.listener], partial);
	ctr_inc(&c->uplink);
	return (struct sys_disp){ .action = SYS_WRITE, .len = v->len };
}

static struct sys_disp tcp(struct sysproc *p, const struct pkt_view *v,
			   const struct pkt_meta *meta, int64_t now, struct sys_counters *c)
{
	struct nat_tuple t;
	bool partial = meta && (meta->flags & PKT_META_NEEDS_CSUM);

	/* A partial checksum is only updatable where the kernel said it is. */
	if (partial && (meta->csum_start != v->l3_len || meta->csum_offset != TCP_OFF_CSUM))
		return drop(&c->drop_bad_offload);
	switch (sysproc_classify(p, v, &t)) {
	case SYS_UPLINK:
		return tcp_uplink(p, v, partial, now, c);
	case SYS_DOWNLINK:
		return tcp_downlink(p, v, &t, partial, now, c);
	default:
		return drop(&c->drop_own_address);
	}
}

static struct sys_disp udp(struct sysproc *p, const struct pkt_view *v, struct sys_counters *c)
{
	if (sysproc_is_own(p, v->family, pkt_dst(v)) &&
	    !(p->dns_hijack && v->dport_be == htons(53)))
		return drop(&c->drop_own_address);
	ctr_inc(&c->udp);
	return (struct sys_disp){ .action = SYS_UDP, .len = v->len };
}

static struct sys_disp icmp(struct sysproc *p, const struct pkt_view *v, struct sys_counters *c)
{
	const struct fam *f = v->family == 4 ? &p->f4 : &p->f6;
	uint8_t echo_req = v->family == 4 ? 8 : 128;

	if (v->l4[0] != echo_req || v->l4[1] != 0 || own_offset(f, pkt_dst(v)) != 0)
		return drop(&c->drop_icmp);
	ctr_inc(&c->icmp_echo_reply);
	return (struct sys_disp){ .action = SYS_WRITE,
				  .len = (uint32_t)rewrite_icmp_echo_reply(v), .plain = true };
}

struct sys_disp sysproc_process(struct sysproc *p, uint8_t *buf, size_t len,
				const struct pkt_meta *meta, int64_t now_ns,
				struct sys_counters *c)
{
	struct pkt_view v;
	enum pkt_reason r;

	ctr_inc(&c->rx_packets);
	ctr_add(&c->rx_bytes, len);
	if ((r = pkt_parse(&v, buf, len)) != PKT_OK)
		return drop(&c->drop_parse[r]);
	if (!(v.family == 4 ? p->f4.enabled : p->f6.enabled))
		return drop(&c->drop_family);
	switch (v.proto) {
	case IPPROTO_TCP:
		return tcp(p, &v, meta, now_ns, c);
	case IPPROTO_UDP:
		return udp(p, &v, c);
	case IPPROTO_ICMP:
		if (v.family == 4)
			return icmp(p, &v, c);
		return drop(&c->drop_proto);
	case IPPROTO_ICMPV6:
		if (v.family == 6)
			return icmp(p, &v, c);
		return drop(&c->drop_proto);
	default:
		return drop(&c->drop_proto);
	}
}

static const char *const sys_counter_names[] = {
#define SYS_CTR_NAME(name) #name,
	SYS_COUNTERS(SYS_CTR_NAME)
#undef SYS_CTR_NAME
};

void sys_counters_foreach(const struct sys_counters *c,
			  void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
	const ctr_t *base = (const ctr_t *)c;
	size_t n = sizeof(sys_counter_names) / sizeof(sys_counter_names[0]);
	char name[64];

	for (size_t i = 0; i < n; i++)
		fn(arg, sys_counter_names[i], ctr_get(&base[i]));
	for (int r = 1; r < PKT_REASON_MAX; r++) {
		snprintf(name, sizeof(name), "drop_parse_%s", pkt_reason_name((enum pkt_reason)r));
		fn(arg, name, ctr_get(&c->drop_parse[r]));
	}
}

static void add_drop(void *arg, const char *name, uint64_t value)
{
	if (strncmp(name, "drop_", 5) == 0)
		*(uint64_t *)arg += value;
}

uint64_t sys_counters_drops(const struct sys_counters *c)
{
	uint64_t total = 0;
	sys_counters_foreach(c, add_drop, &total);
	return total;
}
