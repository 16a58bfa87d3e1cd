/* pkt.c — packet parsing. Every read is preceded by a length check. */
#include "core/pkt.h"

#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>

static const char *const reason_names[PKT_REASON_MAX] = {
#define PKT_REASON_STR(name, str) str,
	PKT_REASONS(PKT_REASON_STR)
#undef PKT_REASON_STR
};

const char *pkt_reason_name(enum pkt_reason r)
{
	return (unsigned)r < PKT_REASON_MAX ? reason_names[r] : "unknown";
}

/* IPv6 extension headers we walk; a chain longer than this is rejected (bounded work). */
#define PKT_V6_MAX_EXT 8

static enum pkt_reason parse_l4(struct pkt_view *v)
{
	uint8_t *l4 = v->l4;
	uint32_t n = v->l4_len;

	switch (v->proto) {
	case IPPROTO_TCP: {
		if (n < 20)
			return PKT_TCP_TRUNCATED;
		uint8_t hlen = (uint8_t)((l4[12] >> 4) * 4);
		if (hlen < 20 || hlen > n)
			return PKT_TCP_BAD_DOFF;
		memcpy(&v->sport_be, l4, 2);
		memcpy(&v->dport_be, l4 + 2, 2);
		v->tcp_hlen = hlen;
		v->tcp_flags = l4[TCP_OFF_FLAGS];
		return PKT_OK;
	}
	case IPPROTO_UDP: {
		if (n < 8)
			return PKT_UDP_TRUNCATED;
		uint32_t ulen = (uint32_t)l4[4] << 8 | l4[5];
		if (ulen < 8 || ulen > n)
			return PKT_UDP_BAD_LEN;
		memcpy(&v->sport_be, l4, 2);
		memcpy(&v->dport_be, l4 + 2, 2);
		return PKT_OK;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		if (n < 8)
			return PKT_ICMP_TRUNCATED;
		return PKT_OK;
	default:
		return PKT_OK;
	}
}

/* IPv4 options (RFC 791): PKT_OK, PKT_V4_SOURCE_ROUTE for a loose or strict source route
 * (types 131, 137), or PKT_V4_BAD_OPTIONS for a list that does not add up: an option other
 * than End and NOP (the only one-byte kinds) without room for its length byte, or whose length
 * is below 2 or runs past the header's end. */
static enum pkt_reason scan_options(const uint8_t *o, uint32_t n)
{
	uint32_t i = 0;

	while (i < n) {
		uint8_t type = o[i];
		if (type == 0) /* end of option list */
			return PKT_OK;
		if (type == 1) { /* NOP */
			i++;
			continue;
		}
		if (i + 1 >= n || o[i + 1] < 2 || o[i + 1] > n - i)
			return PKT_V4_BAD_OPTIONS;
		if (type == 131 || type == 137)
			return PKT_V4_SOURCE_ROUTE;
		i += o[i + 1];
	}
	return PKT_OK;
}

static enum pkt_reason parse_v4(struct pkt_view *v, uint8_t *b, size_t buflen)
{
	if (buflen < 20)
		return PKT_V4_TRUNCATED;
	uint32_t ihl = (uint32_t)(b[0] & 0x0f) * 4;
	uint32_t tot = (uint32_t)b[2] << 8 | b[3];
	if (ihl < 20 || ihl > buflen)
		return PKT_V4_BAD_IHL;
	if (tot < ihl || tot > buflen)
		return PKT_V4_BAD_TOTLEN;
	/* MF set or a non-zero fragment offset: a fragment. */
	if ((b[6] & 0x3f) | b[7])
		return PKT_V4_FRAGMENT;
	if (ihl > 20) {
		enum pkt_reason r = scan_options(b + 20, ihl - 20);
		if (r != PKT_OK)
			return r;
	}
	v->family = 4;
	v->proto = b[9];
	v->len = tot;
	v->l3_len = (uint16_t)ihl;
	v->l4 = b + ihl;
	v->l4_len = tot - ihl;
	return parse_l4(v);
}

static enum pkt_reason parse_v6(struct pkt_view *v, uint8_t *b, size_t buflen)
{
	if (buflen < 40)
		return PKT_V6_TRUNCATED;
	uint32_t tot = 40 + ((uint32_t)b[4] << 8 | b[5]);
	if (tot > buflen)
		return PKT_V6_BAD_PAYLEN;
	uint8_t nh = b[6];
	uint32_t off = 40;
	for (int i = 0;; i++) {
		uint32_t elen;
		switch (nh) {
		case 43: /* Routing: segments left > 0 changes the pseudo-header's destination */
			if (off + 8 <= tot && b[off + 3] != 0)
				return PKT_V6_ROUTING;
			/* fall through */
		case 0:  /* Hop-by-Hop */
		case 60: /* Destination Options */
			if (off + 8 > tot)
				return PKT_V6_EXT_TRUNCATED;
			elen = ((uint32_t)b[off + 1] + 1) * 8;
			break;
		case 51: /* AH: length in 4-byte units, minus 2 */
			if (off + 8 > tot)
				return PKT_V6_EXT_TRUNCATED;
			elen = ((uint32_t)b[off + 1] + 2) * 4;
			break;
		case 44:
			return PKT_V6_FRAGMENT;
		case 50:
			return PKT_V6_ESP;
		default:
			goto done;
		}
		if (i >= PKT_V6_MAX_EXT)
			return PKT_V6_EXT_TOO_MANY;
		if (off + elen > tot)
			return PKT_V6_EXT_TRUNCATED;
		nh = b[off];
		off += elen;
	}
done:
	v->family = 6;
	v->proto = nh;
	v->len = tot;
	v->l3_len = (uint16_t)off;
	v->l4 = b + off;
	v->l4_len = tot - off;
	return parse_l4(v);
}

/* TCP over IPv6 without extension headers, in one pass; false = let the general path decide. */
static inline bool parse_v6_tcp_fast(struct pkt_view *v, uint8_t *buf, size_t buflen)
{
	uint32_t tot = 40 + ((uint32_t)buf[4] << 8 | buf[5]);
	uint8_t *tcp = buf + 40;
	uint32_t hlen = (uint32_t)(tcp[12] >> 4) * 4;

	if (tot - 60 > buflen - 60 || tcp[12] < 0x50 || hlen > tot - 40)
		return false;
	v->ip = buf;
	v->l4 = tcp;
	v->len = tot;
	v->l4_len = tot - 40;
	v->l3_len = 40;
	v->family = 6;
	v->proto = IPPROTO_TCP;
	memcpy(&v->sport_be, tcp, 2);
	memcpy(&v->dport_be, tcp + 2, 2);
	v->tcp_flags = tcp[TCP_OFF_FLAGS];
	v->tcp_hlen = (uint8_t)hlen;
	return true;
}

enum pkt_reason pkt_parse_slow(struct pkt_view *v, uint8_t *buf, size_t buflen)
{
	if (buflen >= 60 && (buf[0] >> 4) == 6 && buf[6] == IPPROTO_TCP &&
	    parse_v6_tcp_fast(v, buf, buflen))
		return PKT_OK;
	if (buflen == 0)
		return PKT_EMPTY;
	v->ip = buf;
	switch (buf[0] >> 4) {
	case 4:
		return parse_v4(v, buf, buflen);
	case 6:
		return parse_v6(v, buf, buflen);
	default:
		return PKT_BAD_VERSION;
	}
}

uint16_t pkt_tcp_mss(const struct pkt_view *v)
{
	const uint8_t *o = v->l4 + 20, *end = v->l4 + v->tcp_hlen;

	while (o < end) {
		if (o[0] == 0) /* end of option list */
			return 0;
		if (o[0] == 1) { /* NOP */
			o++;
			continue;
		}
		if (end - o < 2 || o[1] < 2 || o[1] > end - o)
			return 0;
		if (o[0] == 2 && o[1] == 4)
			return (uint16_t)(o[2] << 8 | o[3]);
		o += o[1];
	}
	return 0;
}

uint32_t pkt_tcp_seglen(const struct pkt_view *v)
{
	uint32_t n = v->l4_len - v->tcp_hlen;
	if (v->tcp_flags & TCP_SYN)
		n++;
	if (v->tcp_flags & TCP_FIN)
		n++;
	return n;
}

void pkt_flow_key(const struct pkt_view *v, struct flow_key *k)
{
	memset(k, 0, sizeof(*k));
	k->family = v->family;
	k->proto = v->proto;
	k->sport_be = v->sport_be;
	k->dport_be = v->dport_be;
	size_t alen = v->family == 4 ? 4 : 16;
	memcpy(k->src, pkt_src(v), alen);
	memcpy(k->dst, pkt_dst(v), alen);
}
