/* sysproc.c — classify, translate and answer packets for the system stack. */
#include "stacks/system/sysproc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hashmix.h"
#include "stacks/common/rewrite.h"

/* The listener indexes the policy hands back must fit our listener table. */
_Static_assert(NAT_MAX_LISTENERS <= L3POLICY_MAX_LISTENERS, "listener ports");

/* What the rewrites write, per family: the gateway, the NAT addresses G+1+i and the listener
 * ports. Which packets get here is the policy's business (struct l3policy). */
struct fam {
	bool enabled;
	uint8_t gateway[16];
	uint8_t nat[NAT_MAX_ADDRS][16];        /* G+1+i */
	uint16_t lport_be[NAT_MAX_LISTENERS];
	uint32_t n_lports;
};

struct sysproc {
	struct l3policy pol; /* first: the inline classifier reads it (sysproc.h) */
	struct nat_table *nat;
	uint32_t n_addrs;
	uint32_t n_listeners;
	bool conn_numbers;
	struct fam f4, f6;
};

/* Called after l3policy_init accepted the same gateway and n_addrs (the run does not wrap). */
static void fam_init(struct fam *f, const struct sys_family *c, uint8_t alen, uint32_t n_addrs)
{
	uint32_t gw_low;

	memset(f, 0, sizeof(*f));
	f->enabled = c->enabled;
	if (!c->enabled)
		return;
	memcpy(f->gateway, c->gateway, alen);
	memcpy(&gw_low, c->gateway + alen - 4, 4);
	gw_low = ntohl(gw_low);
	for (uint32_t i = 0; i < n_addrs; i++) {
		uint32_t lo = htonl(gw_low + 1 + i);
		memcpy(f->nat[i], c->gateway, alen);
		memcpy(f->nat[i] + alen - 4, &lo, 4);
	}
}

static int policy_init(struct l3policy *pol, const struct sysproc_config *cfg)
{
	struct l3policy_config pc = {
		.has4 = cfg->v4.enabled,
		.has6 = cfg->v6.enabled,
		.n_addrs = cfg->n_addrs,
		.dns_hijack = cfg->dns_hijack,
		.dns_tcp = cfg->dns_tcp,
		.loopguard = cfg->loopguard,
	};

	memcpy(pc.gateway4, cfg->v4.gateway, 4);
	memcpy(pc.gateway6, cfg->v6.gateway, 16);
	return l3policy_init(pol, &pc);
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
	p->conn_numbers = cfg->conn_numbers;
	if ((ret = policy_init(&p->pol, cfg)) != 0)
		goto fail;
	fam_init(&p->f4, &cfg->v4, 4, cfg->n_addrs);
	fam_init(&p->f6, &cfg->v6, 16, cfg->n_addrs);
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
	int ret;

	if (!f || !f->enabled || n != p->n_listeners)
		return -EINVAL;
	if ((ret = l3policy_set_listeners(&p->pol, family, ports_be, n)) != 0)
		return ret;
	memcpy(f->lport_be, ports_be, n * sizeof(*ports_be));
	f->n_lports = n;
	return 0;
}

bool sysproc_is_own(const struct sysproc *p, int family, const uint8_t *addr)
{
	return l3policy_is_own(&p->pol, family, addr);
}

int sysproc_tuple_rewrite(const struct sysproc *p, const struct nat_tuple *t,
			  const uint8_t **nat_addr, const uint8_t **gateway, uint16_t *lport_be)
{
	const struct fam *f = t->family == 4 ? &p->f4 : &p->f6;

	if ((t->family != 4 && t->family != 6) || !f->enabled || t->addr >= p->n_addrs ||
	    t->listener >= f->n_lports)
		return -EINVAL;
	*nat_addr = f->nat[t->addr];
	*gateway = f->gateway;
	*lport_be = f->lport_be[t->listener];
	return 0;
}

uint32_t sysproc_conn_hash(const struct flow_key *k)
{
	size_t last = k->family == 4 ? 0 : 12;
	uint32_t a, b, h;

	memcpy(&a, k->src + last, 4);
	memcpy(&b, k->dst + last, 4);
	h = ((uint32_t)k->sport_be << 16 | k->dport_be) ^ a ^ (b * 0x9e3779b1u);
	h = hashmix32(h); /* every input bit reaches the low ones (a queue is h % N) */
	return h ? h : 1;
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
	return (struct sys_disp){ .action = SYS_WRITE, .len = v->len,
				  .conn = p->conn_numbers ? sysproc_conn_hash(&k) : 0 };
}

static struct sys_disp tcp_uplink(struct sysproc *p, const struct pkt_view *v, bool partial,
				  int64_t now, struct sys_counters *c)
{
	const struct fam *f = v->family == 4 ? &p->f4 : &p->f6;
	struct flow_key k;
	struct nat_tuple t;
	bool pure_syn = (v->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_SYN;

	/* A mapped segment's header goes on to the kernel, which checks its checksum (the
	 * rewrite keeps a wrong one wrong); a SYN would make a NAT entry first. */
	if (pure_syn && v->family == 4 && !pkt_v4_csum_ok(v))
		return drop(&c->drop_parse[PKT_V4_BAD_CSUM]);
	pkt_flow_key(v, &k);
	int ret = nat_uplink(p->nat, &k, pure_syn, now, &t);
	if (ret == -ENOENT) {
		/* No mapping and not a new connection: never allocate; answer with a RST
		 * so the app gives up at once — unless it is a RST itself (RFC 793), or its
		 * header is damaged (nothing to answer). */
		if (v->family == 4 && !pkt_v4_csum_ok(v))
			return drop(&c->drop_parse[PKT_V4_BAD_CSUM]);
		if (v->tcp_flags & TCP_RST)
			return drop(&c->drop_rst_no_mapping);
		ctr_inc(&c->rst_sent);
		return (struct sys_disp){ .action = SYS_WRITE, .len = (uint32_t)rewrite_tcp_rst(v),
					  .plain = true };
	}
	if (ret == -ENOSPC || ret == -EADDRNOTAVAIL) {
		/* The table is full: new work is refused with a RST, so the app fails now and not
		 * after its SYN retransmissions, as every other exhausted budget does. Under a SYN
		 * flood's pressure (the HALF_OPEN entries many), silence, as for the share below:
		 * the SYN may be the flood's, from a spoofed source. */
		ctr_inc(ret == -ENOSPC ? &c->drop_nat_budget : &c->drop_nat_ports);
		if (nat_half_open_pressure(p->nat))
			return done();
		return (struct sys_disp){ .action = SYS_WRITE, .len = (uint32_t)rewrite_tcp_rst(v),
					  .plain = true };
	}
	if (ret == -EBUSY) /* a SYN flood's share: silence, as for the other refusals */
		return drop(&c->drop_nat_half_open);
	if (ret != 0) /* -ENOMEM: the only other refusal for a well-formed key */
		return drop(&c->drop_nat_nomem);
	/* The app gave the handshake up (a SYN scan's RST after the SYN-ACK): its HALF_OPEN entry
	 * need not hold the half-open share for the whole timeout. The RST goes on as usual. */
	if (__builtin_expect(v->tcp_flags & TCP_RST, 0))
		(void)nat_uplink_rst(p->nat, &k, now);
	rewrite_l4(v, f->nat[t.addr], htons(t.port), f->gateway, f->lport_be[t.listener], partial);
	ctr_inc(&c->uplink);
	return (struct sys_disp){ .action = SYS_WRITE, .len = v->len,
				  .conn = p->conn_numbers ? sysproc_conn_hash(&k) : 0 };
}

/* The policy let it in: uplink (TCP) or a listener's reply (TCP_REPLY, r filled). */
static struct sys_disp tcp(struct sysproc *p, const struct pkt_view *v, enum l3policy_verdict vd,
			   const struct l3policy_reply *r, const struct pkt_meta *meta,
			   int64_t now, struct sys_counters *c)
{
	struct nat_tuple t;
	bool partial = meta && (meta->flags & PKT_META_NEEDS_CSUM);

	/* A partial checksum is only updatable where the kernel said it is. */
	if (partial && (meta->csum_start != v->l3_len || meta->csum_offset != TCP_OFF_CSUM))
		return drop(&c->drop_bad_offload);
	if (vd == L3POLICY_TCP)
		return tcp_uplink(p, v, partial, now, c);
	t.family = v->family;
	t.addr = r->nat_index;
	t.listener = r->listener;
	t.port = ntohs(v->dport_be);
	return tcp_downlink(p, v, &t, partial, now, c);
}

/* A refused first SYN answered in place (l3policy_answer), or nothing. */
static struct sys_disp answer(const struct sysproc *p, const struct pkt_view *v,
			      enum l3policy_verdict vd, struct sys_counters *c)
{
	size_t len;

	switch (l3policy_answer(&p->pol, v, vd)) {
	case L3POLICY_ANSWER_RST:
		len = rewrite_tcp_rst(v);
		break;
	case L3POLICY_ANSWER_UNREACH:
		if (!(len = rewrite_icmp_unreach(v, l3policy_answer_src(&p->pol, v->family))))
			return done();
		ctr_inc(&c->icmp_unreach);
		break;
	default:
		return done();
	}
	return (struct sys_disp){ .action = SYS_WRITE, .len = (uint32_t)len, .plain = true };
}

struct sys_disp sysproc_process(struct sysproc *p, uint8_t *buf, size_t len,
				const struct pkt_meta *meta, int64_t now_ns,
				struct sys_counters *c, struct pkt_view *v)
{
	struct l3policy_reply reply;
	enum pkt_reason r;
	enum l3policy_verdict vd;

	ctr_inc(&c->rx_packets);
	ctr_add(&c->rx_bytes, len);
	if ((r = pkt_parse(v, buf, len)) != PKT_OK)
		return drop(&c->drop_parse[r]);
	switch ((vd = l3policy_classify(&p->pol, v, &reply, &c->policy))) {
	case L3POLICY_TCP:
	case L3POLICY_TCP_REPLY:
		return tcp(p, v, vd, &reply, meta, now_ns, c);
	case L3POLICY_UDP:
	case L3POLICY_DNS:
		/* The UDP path sends the payload on: no kernel sees this header. */
		if (v->family == 4 && !pkt_v4_csum_ok(v))
			return drop(&c->drop_parse[PKT_V4_BAD_CSUM]);
		ctr_inc(&c->udp);
		return (struct sys_disp){ .action = SYS_UDP, .len = v->len };
	case L3POLICY_ECHO:
		ctr_inc(&c->icmp_echo_reply);
		return (struct sys_disp){ .action = SYS_WRITE,
					  .len = (uint32_t)rewrite_icmp_echo_reply(v),
					  .plain = true };
	case L3POLICY_DROP_loop:
	case L3POLICY_DROP_special_destination:
		/* Our own socket's SYN came back, or a SYN to a special destination: the answer
		 * makes its connect fail now, not after the connect timeout (counted as the drop
		 * already; l3policy_answer says which get one, and what). */
		return answer(p, v, vd, c);
	default:
		return done(); /* dropped: the policy counted it */
	}
}

static const char *const sys_counter_names[] = {
#define SYS_CTR_NAME(name) #name,
	SYS_COUNTERS(SYS_CTR_NAME)
#undef SYS_CTR_NAME
};

void sysproc_counters_foreach(const struct sys_counters *c,
			      void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
	const ctr_t *base = (const ctr_t *)c;
	size_t n = sizeof(sys_counter_names) / sizeof(sys_counter_names[0]);
	char name[64];

	for (size_t i = 0; i < n; i++)
		fn(arg, sys_counter_names[i], ctr_get(&base[i]));
	l3policy_counters_foreach(&c->policy, fn, arg);
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

uint64_t sysproc_counters_drops(const struct sys_counters *c)
{
	uint64_t total = 0;
	sysproc_counters_foreach(c, add_drop, &total);
	return total;
}
