/* l3policy.c — set-up, the cold verdicts (ICMP, other protocols, unserved families), the
 * IPv6 TCP rules and the exact special-destination test of the policy both stacks apply
 * (l3policy.h). */
#include "stacks/common/l3policy.h"

#include <errno.h>
#include <stdio.h>

static const char *const verdict_names[L3POLICY_VERDICT_MAX] = {
	[L3POLICY_TCP] = "tcp",
	[L3POLICY_TCP_REPLY] = "tcp_reply",
	[L3POLICY_UDP] = "udp",
	[L3POLICY_DNS] = "dns",
	[L3POLICY_ECHO] = "echo",
#define L3POLICY_DROP_NAME(name) [L3POLICY_DROP_##name] = #name,
	L3POLICY_DROPS(L3POLICY_DROP_NAME)
#undef L3POLICY_DROP_NAME
};

const char *l3policy_verdict_name(enum l3policy_verdict v)
{
	return (unsigned)v < L3POLICY_VERDICT_MAX ? verdict_names[v] : "?";
}

void l3policy_counters_foreach(const struct l3policy_counters *c,
			       void (*fn)(void *arg, const char *name, uint64_t value), void *arg)
{
	char name[32];

	for (int i = 0; i < L3POLICY_N_DROPS; i++) {
		snprintf(name, sizeof(name), "drop_%s",
			 verdict_names[L3POLICY_DROP_FIRST + i]);
		fn(arg, name, ctr_get(&c->drop[i]));
	}
}

static int family_init(struct l3policy_family *f, bool enabled, const uint8_t *gateway,
		       size_t alen, uint32_t n_addrs)
{
	uint32_t lo;

	memset(f, 0, sizeof(*f));
	if (!enabled)
		return 0;
	memcpy(f->gateway, gateway, alen);
	memcpy(&lo, gateway + alen - 4, 4);
	f->gw_low = ntohl(lo);
	/* The run must not wrap the low 32 bits (config validation keeps it inside the prefix). */
	if (f->gw_low > UINT32_MAX - n_addrs)
		return -EINVAL;
	memcpy(f->answer_src, gateway, alen);
	lo = htonl(f->gw_low + 1);
	memcpy(f->answer_src + alen - 4, &lo, 4);
	f->enabled = true;
	return 0;
}

bool l3policy_special_exact(int family, const uint8_t *a)
{
	static const uint8_t zero[12];

	if (family == 4)
		return a[0] == 0 || a[0] == 127 || (a[0] & 0xf0) == 0xe0 ||
		       (a[0] == 255 && a[1] == 255 && a[2] == 255 && a[3] == 255);
	if (a[0] == 0xff) /* ff00::/8 */
		return true;
	/* ::/96 (:: and ::1 included) and ::ffff:0:0/96 */
	return memcmp(a, zero, 10) == 0 &&
	       ((a[10] == 0 && a[11] == 0) || (a[10] == 0xff && a[11] == 0xff));
}

/* A multicast or the limited broadcast address (4 or 16 bytes of family). */
static bool group_addr(int family, const uint8_t *a)
{
	if (family == 6)
		return a[0] == 0xff;
	return (a[0] & 0xf0) == 0xe0 || (a[0] == 255 && a[1] == 255 && a[2] == 255 && a[3] == 255);
}

enum l3policy_answer l3policy_answer(const struct l3policy *p, const struct pkt_view *v,
				     enum l3policy_verdict vd)
{
	uint32_t s;

	if (v->proto != IPPROTO_TCP || (v->tcp_flags & TCP_RST))
		return L3POLICY_ANSWER_NONE; /* a RST is never answered (RFC 9293 section 3.10.7) */
	if (v->family == 4 && !pkt_v4_csum_ok(v))
		return L3POLICY_ANSWER_NONE; /* nor a header that may not say where it came from */
	if (vd == L3POLICY_DROP_loop)
		return L3POLICY_ANSWER_RST;
	if (vd != L3POLICY_DROP_special_destination || group_addr(v->family, pkt_dst(v)) ||
	    l3policy_special_exact(v->family, pkt_src(v)))
		return L3POLICY_ANSWER_NONE;
	s = l3policy_src_offset(p, v);
	if (s >= 1 && s <= p->n_addrs)
		return L3POLICY_ANSWER_NONE; /* from a NAT address: forged, the answer is ours */
	return L3POLICY_ANSWER_UNREACH;
}

/* The first bytes an address of each family may be special with: exactly those for which
 * l3policy_special_exact can be true. */
static void special_first_init(uint8_t *t)
{
	for (int b = 0; b < 256; b++) {
		uint8_t a[16] = { (uint8_t)b, 255, 255, 255 };
		bool maybe4 = l3policy_special_exact(4, a);

		memset(a + 1, 0, sizeof(a) - 1);
		bool maybe6 = l3policy_special_exact(6, a);
		a[10] = a[11] = 0xff;
		maybe6 = maybe6 || l3policy_special_exact(6, a);
		t[b] = (uint8_t)((maybe4 ? L3POLICY_SPECIAL4 : 0) |
				 (maybe6 ? L3POLICY_SPECIAL6 : 0));
	}
}

int l3policy_init(struct l3policy *p, const struct l3policy_config *cfg)
{
	int ret;

	memset(p, 0, sizeof(*p));
	special_first_init(p->special_first);
	if ((!cfg->has4 && !cfg->has6) || cfg->n_addrs < 1)
		return -EINVAL;
	p->n_addrs = cfg->n_addrs;
	p->dns_hijack = cfg->dns_hijack;
	p->dns_tcp = cfg->dns_hijack && cfg->dns_tcp;
	p->loopguard = cfg->loopguard;
	if ((ret = family_init(&p->f4, cfg->has4, cfg->gateway4, 4, cfg->n_addrs)) != 0 ||
	    (ret = family_init(&p->f6, cfg->has6, cfg->gateway6, 16, cfg->n_addrs)) != 0) {
		memset(p, 0, sizeof(*p));
		return ret;
	}
	return 0;
}

int l3policy_set_listeners(struct l3policy *p, int family, const uint16_t *ports_be, uint32_t n)
{
	struct l3policy_family *f = family == 4 ? &p->f4 : family == 6 ? &p->f6 : NULL;

	if (!f || !f->enabled || n > L3POLICY_MAX_LISTENERS)
		return -EINVAL;
	memcpy(f->lport_be, ports_be, n * sizeof(*ports_be));
	f->n_lports = n;
	return 0;
}

bool l3policy_is_own(const struct l3policy *p, int family, const uint8_t *addr)
{
	const struct l3policy_family *f = family == 4 ? &p->f4 : &p->f6;

	if (!f->enabled)
		return false;
	return (family == 4 ? l3policy_offset4(f, addr) : l3policy_offset6(f, addr)) <= p->n_addrs;
}

enum l3policy_verdict l3policy_tcp_dst6(const struct l3policy *p, const struct pkt_view *v,
				    struct l3policy_reply *reply)
{
	const struct l3policy_family *f = &p->f6;
	uint32_t d = l3policy_offset6(f, v->ip + PKT_V6_DST);

	if (d > p->n_addrs)
		return L3POLICY_TCP;
	if (d == 0)
		return l3policy_gateway_tcp(p, v);
	if (l3policy_offset6(f, v->ip + PKT_V6_SRC) != 0)
		return L3POLICY_DROP_nat_address;
	return l3policy_listener_reply(f, d, v->sport_be, reply);
}

/* An echo request (ICMP 8 / ICMPv6 128, code 0) to the gateway; any other ICMP is dropped.
 * pkt_parse guarantees the 8-byte ICMP header. */
static enum l3policy_verdict icmp(const struct l3policy *p, const struct pkt_view *v)
{
	const struct l3policy_family *f = v->family == 4 ? &p->f4 : &p->f6;
	uint8_t echo_req = v->family == 4 ? 8 : 128;
	uint32_t d = v->family == 4 ? l3policy_offset4(f, v->ip + PKT_V4_DST)
				    : l3policy_offset6(f, v->ip + PKT_V6_DST);

	if (v->l4[0] != echo_req || v->l4[1] != 0 || d != 0)
		return L3POLICY_DROP_icmp;
	return L3POLICY_ECHO;
}

static enum l3policy_verdict cold(const struct l3policy *p, const struct pkt_view *v,
				  struct l3policy_reply *reply)
{
	const struct l3policy_family *f = v->family == 4 ? &p->f4 : &p->f6;

	if (!f->enabled)
		return L3POLICY_DROP_family;
	switch (v->proto) {
	case IPPROTO_TCP: /* TCP and UDP are not reached from l3policy_classify */
		return l3policy_tcp(p, v, reply);
	case IPPROTO_UDP:
		return l3policy_udp(p, v);
	case IPPROTO_ICMP:
		return v->family == 4 ? icmp(p, v) : L3POLICY_DROP_proto;
	case IPPROTO_ICMPV6:
		return v->family == 6 ? icmp(p, v) : L3POLICY_DROP_proto;
	default:
		return L3POLICY_DROP_proto;
	}
}

enum l3policy_verdict l3policy_classify_slow(const struct l3policy *p, const struct pkt_view *v,
					     struct l3policy_reply *reply,
					     struct l3policy_counters *c)
{
	return l3policy_count(c, cold(p, v, reply));
}
