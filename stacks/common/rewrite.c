/* rewrite.c — in-place rewriting for both stacks (RFC 1624 incremental checksums). */
#include "stacks/common/rewrite.h"

#include <netinet/in.h>
#include <string.h>

#include "core/csum.h"

/* Out of line with the caller's exact signature (gcc: no interprocedural argument rewriting),
 * so rewrite_l4_slow's dispatch stays a compare and a tail jump. */
#if defined(__clang__)
#define TS_NOIPA __attribute__((noinline))
#else
#define TS_NOIPA __attribute__((noipa))
#endif

static inline uint32_t load32(const void *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* The (sport, dport) pair as the 32-bit word it forms in the packet. */
static inline uint32_t ports_word(uint16_t sport_be, uint16_t dport_be)
{
	uint16_t w[2] = { sport_be, dport_be };
	uint32_t v;
	memcpy(&v, w, 4);
	return v;
}

/* One's complement addition of 64-bit words: the carry out wraps around (2^64 = 1 mod 0xffff). */
static inline uint64_t add_wrap(uint64_t a, uint64_t b)
{
	a += b;
	return a + (a < b);
}

/* IPv6 TCP: the 32 address bytes as 4 64-bit words and the port pair into one sum, one fold. */
static TS_NOIPA void rewrite_tcp6(const struct pkt_view *v, const uint8_t *src, uint16_t sport_be,
				  const uint8_t *dst, uint16_t dport_be)
{
	uint8_t *ip = v->ip, *tcp = v->l4;
	uint16_t ports[2] = { sport_be, dport_be };
	uint64_t o0, o1, o2, o3, n0, n1, n2, n3, acc;
	uint32_t op, np;
	uint16_t sum;

	memcpy(&o0, ip + PKT_V6_SRC, 8);
	memcpy(&o1, ip + PKT_V6_SRC + 8, 8);
	memcpy(&o2, ip + PKT_V6_DST, 8);
	memcpy(&o3, ip + PKT_V6_DST + 8, 8);
	memcpy(&n0, src, 8);
	memcpy(&n1, src + 8, 8);
	memcpy(&n2, dst, 8);
	memcpy(&n3, dst + 8, 8);
	memcpy(&op, tcp, 4);
	memcpy(&np, ports, 4);
	/* One's complement negation distributes over the sum: ~a + ~b = ~(a + b). */
	acc = add_wrap(add_wrap(o0, o1), add_wrap(o2, o3));
	acc = add_wrap(~acc, (uint64_t)(uint32_t)~op + np);
	acc = add_wrap(acc, n0);
	acc = add_wrap(acc, n1);
	acc = add_wrap(acc, n2);
	acc = add_wrap(acc, n3);
	/* The old field joins with the carry wrapped too (RFC 1624 eqn. 3): acc may be anything
	 * up to 2^64 - 1 (the app picks its destination), where csum_apply's plain addition
	 * would lose the carry. A result of 0 is sent as 0xFFFF, as csum_apply_l4 does. */
	acc = add_wrap(acc, (uint16_t)~csum_load16(tcp + TCP_OFF_CSUM));
	sum = (uint16_t)~csum_fold(acc);
	csum_store16(tcp + TCP_OFF_CSUM, sum ? sum : 0xffff);
	memcpy(ip + PKT_V6_SRC, &n0, 8);
	memcpy(ip + PKT_V6_SRC + 8, &n1, 8);
	memcpy(ip + PKT_V6_DST, &n2, 8);
	memcpy(ip + PKT_V6_DST + 8, &n3, 8);
	memcpy(tcp, &np, 4);
}

/* Every other case: IPv4 UDP, partial checksums, IPv6 UDP. */
static TS_NOIPA void rewrite_any(const struct pkt_view *v, const uint8_t *src, uint16_t sport_be,
				 const uint8_t *dst, uint16_t dport_be, bool partial)
{
	uint8_t *ip = v->ip, *l4 = v->l4;
	uint8_t *csum = l4 + (v->proto == IPPROTO_TCP ? TCP_OFF_CSUM : UDP_OFF_CSUM);
	uint64_t acc;

	if (v->family == 4) {
		uint32_t ns = load32(src), nd = load32(dst);
		acc = (uint64_t)(uint32_t)~load32(ip + PKT_V4_SRC) + (uint32_t)~load32(ip + PKT_V4_DST) +
		      ns + nd;
		/* The IPv4 header checksum covers the addresses, not the ports. */
		csum_store16(ip + 10, csum_apply(csum_load16(ip + 10), acc));
		memcpy(ip + PKT_V4_SRC, &ns, 4);
		memcpy(ip + PKT_V4_DST, &nd, 4);
		if (v->proto == IPPROTO_UDP && csum_load16(csum) == 0)
			goto ports; /* UDP over IPv4 without checksum stays without */
	} else {
		acc = 0;
		csum_acc_bytes(&acc, ip + PKT_V6_SRC, src, 16);
		csum_acc_bytes(&acc, ip + PKT_V6_DST, dst, 16);
		memcpy(ip + PKT_V6_SRC, src, 16);
		memcpy(ip + PKT_V6_DST, dst, 16);
	}
	if (partial) {
		/* Un-inverted pseudo-header sum: addresses only, no inversion. */
		csum_store16(csum, csum_apply_partial(csum_load16(csum), acc));
	} else {
		csum_acc32(&acc, load32(l4), ports_word(sport_be, dport_be));
		csum_store16(csum, csum_apply_l4(csum_load16(csum), acc));
	}
ports:
	memcpy(l4, &sport_be, 2);
	memcpy(l4 + 2, &dport_be, 2);
}

void rewrite_l4_slow(const struct pkt_view *v, const uint8_t *src, uint16_t sport_be,
		     const uint8_t *dst, uint16_t dport_be, bool partial)
{
	/* Both out of line with this signature: the dispatch is a compare and a jump. */
	if (v->family == 6 && v->proto == IPPROTO_TCP && !partial)
		rewrite_tcp6(v, src, sport_be, dst, dport_be);
	else
		rewrite_any(v, src, sport_be, dst, dport_be, partial);
}

static void put32be(uint8_t *p, uint32_t x)
{
	p[0] = (uint8_t)(x >> 24);
	p[1] = (uint8_t)(x >> 16);
	p[2] = (uint8_t)(x >> 8);
	p[3] = (uint8_t)x;
}

static uint32_t get32be(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A fresh IP header of family at ip (DF, TTL / hop limit 64, no options) for l4_len bytes of
 * proto from src to dst. Returns its length. */
static size_t put_ip(uint8_t *ip, int family, uint8_t proto, size_t l4_len, const uint8_t *src,
		     const uint8_t *dst)
{
	if (family == 4) {
		memset(ip, 0, 20);
		ip[0] = 0x45;
		pkt_put16(ip + 2, (uint16_t)(20 + l4_len));
		ip[6] = 0x40; /* DF */
		ip[8] = 64;
		ip[9] = proto;
		memcpy(ip + PKT_V4_SRC, src, 4);
		memcpy(ip + PKT_V4_DST, dst, 4);
		csum_store16(ip + 10, csum_buf(ip, 20));
		return 20;
	}
	memset(ip, 0, 40);
	ip[0] = 0x60;
	pkt_put16(ip + 4, (uint16_t)l4_len);
	ip[6] = proto;
	ip[7] = 64;
	memcpy(ip + PKT_V6_SRC, src, 16);
	memcpy(ip + PKT_V6_DST, dst, 16);
	return 40;
}

size_t rewrite_tcp_rst(const struct pkt_view *v)
{
	uint8_t saddr[16], daddr[16], tcp[20];
	size_t alen = v->family == 4 ? 4 : 16;
	const uint8_t *in = v->l4;
	uint8_t *ip = v->ip;

	memcpy(saddr, pkt_dst(v), alen); /* the reply comes from the segment's destination */
	memcpy(daddr, pkt_src(v), alen);

	memset(tcp, 0, sizeof(tcp));
	memcpy(tcp, in + 2, 2); /* sport = segment's dport */
	memcpy(tcp + 2, in, 2);
	if (v->tcp_flags & TCP_ACK) {
		memcpy(tcp + TCP_OFF_SEQ, in + TCP_OFF_ACK, 4);
		tcp[TCP_OFF_FLAGS] = TCP_RST;
	} else {
		put32be(tcp + TCP_OFF_ACK, get32be(in + TCP_OFF_SEQ) + pkt_tcp_seglen(v));
		tcp[TCP_OFF_FLAGS] = TCP_RST | TCP_ACK;
	}
	tcp[12] = 5 << 4;

	size_t hl = put_ip(ip, v->family, IPPROTO_TCP, 20, saddr, daddr);
	uint64_t pseudo = v->family == 4 ? csum_pseudo4(saddr, daddr, IPPROTO_TCP, 20)
					 : csum_pseudo6(saddr, daddr, IPPROTO_TCP, 20);
	uint16_t c = (uint16_t)~csum_fold(csum_partial(tcp, 20, pseudo));
	csum_store16(tcp + TCP_OFF_CSUM, c ? c : 0xffff);
	memcpy(ip + hl, tcp, 20);
	return hl + 20;
}

size_t rewrite_icmp_unreach(const struct pkt_view *v, const uint8_t *src)
{
	size_t alen = v->family == 4 ? 4 : 16, hl = v->family == 4 ? 20 : 40;
	size_t room = REWRITE_ANSWER_ROOM; /* RFC 1812 4.3.2.3 (and within IPv6's 1280) */
	size_t quote = (size_t)v->l3_len + v->tcp_hlen;
	uint8_t daddr[16], *ip = v->ip, *icmp = v->ip + hl;
	uint64_t sum;

	if (quote > room - hl - 8)
		quote = room - hl - 8;
	if (quote < (size_t)v->l3_len + 8)
		return 0;
	memcpy(daddr, pkt_src(v), alen); /* the answer goes to the segment's source */
	memmove(icmp + 8, ip, quote);
	memset(icmp, 0, 8); /* type, code, checksum, 4 unused bytes */
	put_ip(ip, v->family, v->family == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6, 8 + quote, src,
	       daddr);
	if (v->family == 4) {
		icmp[0] = 3; /* destination unreachable */
		icmp[1] = 3; /* port unreachable */
		sum = 0;     /* ICMP's checksum covers the message only */
	} else {
		icmp[0] = 1; /* destination unreachable */
		icmp[1] = 4; /* port unreachable */
		sum = csum_pseudo6(src, daddr, IPPROTO_ICMPV6, (uint32_t)(8 + quote));
	}
	csum_store16(icmp + 2, (uint16_t)~csum_fold(csum_partial(icmp, 8 + quote, sum)));
	return hl + 8 + quote;
}

size_t rewrite_icmp_echo_reply(const struct pkt_view *v)
{
	uint8_t *ip = v->ip, *icmp = v->l4;
	uint8_t tmp[16];
	uint64_t acc = 0;

	/* Swapping source and destination leaves every sum over them unchanged. */
	if (v->family == 4) {
		memcpy(tmp, ip + PKT_V4_SRC, 4);
		memcpy(ip + PKT_V4_SRC, ip + PKT_V4_DST, 4);
		memcpy(ip + PKT_V4_DST, tmp, 4);
		/* TTL shares a 16-bit word with the protocol: replace the whole word. */
		uint8_t oldw[2] = { ip[8], ip[9] }, neww[2] = { 64, ip[9] };
		uint64_t hacc = 0;
		csum_acc16(&hacc, csum_load16(oldw), csum_load16(neww));
		ip[8] = 64;
		csum_store16(ip + 10, csum_apply(csum_load16(ip + 10), hacc));
		uint8_t ot[2] = { icmp[0], icmp[1] }, nt[2] = { 0, icmp[1] };
		csum_acc16(&acc, csum_load16(ot), csum_load16(nt));
		icmp[0] = 0;
		csum_store16(icmp + 2, csum_apply(csum_load16(icmp + 2), acc));
	} else {
		memcpy(tmp, ip + PKT_V6_SRC, 16);
		memcpy(ip + PKT_V6_SRC, ip + PKT_V6_DST, 16);
		memcpy(ip + PKT_V6_DST, tmp, 16);
		ip[7] = 64;
		uint8_t ot[2] = { icmp[0], icmp[1] }, nt[2] = { 129, icmp[1] };
		csum_acc16(&acc, csum_load16(ot), csum_load16(nt));
		icmp[0] = 129;
		csum_store16(icmp + 2, csum_apply(csum_load16(icmp + 2), acc));
	}
	return v->len;
}
