/* udp_codec.c — parse UDP packets from the TUN, encode reply datagrams (RFC 768, RFC 791,
 * RFC 8200). Pure functions over caller buffers. */
#include "core/udp_codec.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "core/csum.h"
#include "core/flow.h"
#include "core/pkt.h"

static const char *const reason_names[UDP_CODEC_REASON_MAX] = {
#define UDP_CODEC_REASON_STR(name, str) str,
	UDP_CODEC_REASONS(UDP_CODEC_REASON_STR)
#undef UDP_CODEC_REASON_STR
};

const char *udp_codec_reason_name(enum udp_codec_reason r)
{
	return (unsigned)r < UDP_CODEC_REASON_MAX ? reason_names[r] : "unknown";
}

enum udp_codec_reason udp_codec_from_view(struct udp_view *v, const struct pkt_view *pv)
{
	size_t alen;
	uint32_t ulen;

	v->pkt_reason = PKT_OK;
	if (pv->proto != IPPROTO_UDP)
		return UDP_CODEC_NOT_UDP;
	if (pv->sport_be == 0 || pv->dport_be == 0)
		return UDP_CODEC_ZERO_PORT;
	/* pkt_parse proved 8 <= UDP length <= l4_len. */
	ulen = (uint32_t)pv->l4[UDP_OFF_LEN] << 8 | pv->l4[UDP_OFF_LEN + 1];
	alen = pv->family == 4 ? 4 : 16;
	memset(v->src, 0, sizeof(v->src));
	memset(v->dst, 0, sizeof(v->dst));
	memcpy(v->src, pkt_src(pv), alen);
	memcpy(v->dst, pkt_dst(pv), alen);
	v->family = pv->family;
	v->sport_be = pv->sport_be;
	v->dport_be = pv->dport_be;
	v->payload = pv->l4 + 8;
	v->payload_len = ulen - 8;
	return UDP_CODEC_OK;
}

enum udp_codec_reason udp_codec_parse(struct udp_view *v, const uint8_t *pkt, size_t len)
{
	struct pkt_view pv;

	/* pkt_parse takes a mutable buffer because the stacks rewrite in place; it only reads. */
	v->pkt_reason = pkt_parse(&pv, (uint8_t *)pkt, len);
	if (v->pkt_reason != PKT_OK)
		return UDP_CODEC_PKT;
	return udp_codec_from_view(v, &pv);
}

size_t udp_codec_hdr_len(uint8_t family)
{
	return family == 4 ? 28 : family == 6 ? 48 : 0;
}

size_t udp_codec_max_payload(uint8_t family)
{
	return family == 4 ? 65535 - 28 : family == 6 ? 65535 - 8 : 0;
}

static void write_ip4(const struct udp_codec_hdr *h, uint8_t *ip, size_t udp_len)
{
	ip[0] = 0x45;
	ip[1] = 0;
	pkt_put16(ip + 2, (uint16_t)(20 + udp_len));
	pkt_put16(ip + 4, h->ip_id);
	ip[6] = ip[7] = 0; /* no DF: see udp_codec_encode */
	ip[8] = 64;
	ip[9] = IPPROTO_UDP;
	ip[10] = ip[11] = 0;
	memcpy(ip + PKT_V4_SRC, h->src, 4);
	memcpy(ip + PKT_V4_DST, h->dst, 4);
	csum_store16(ip + 10, csum_buf(ip, 20));
}

static void write_ip6(const struct udp_codec_hdr *h, uint8_t *ip, size_t udp_len)
{
	ip[0] = 0x60;
	ip[1] = ip[2] = ip[3] = 0;
	pkt_put16(ip + 4, (uint16_t)udp_len);
	ip[6] = IPPROTO_UDP;
	ip[7] = 64;
	memcpy(ip + PKT_V6_SRC, h->src, 16);
	memcpy(ip + PKT_V6_DST, h->dst, 16);
}

/* The IP header at buf and the UDP header at udp (checksum field 0) for udp_len bytes of UDP;
 * returns the pseudo-header sum. */
static uint64_t write_headers(const struct udp_codec_hdr *h, uint8_t *buf, uint8_t *udp,
			      size_t udp_len)
{
	memcpy(udp, &h->sport_be, 2);
	memcpy(udp + 2, &h->dport_be, 2);
	pkt_put16(udp + UDP_OFF_LEN, (uint16_t)udp_len);
	udp[UDP_OFF_CSUM] = udp[UDP_OFF_CSUM + 1] = 0;
	if (h->family == 4) {
		write_ip4(h, buf, udp_len);
		return csum_pseudo4(h->src, h->dst, IPPROTO_UDP, (uint32_t)udp_len);
	}
	write_ip6(h, buf, udp_len);
	return csum_pseudo6(h->src, h->dst, IPPROTO_UDP, (uint32_t)udp_len);
}

int udp_codec_encode(const struct udp_codec_hdr *h, const uint8_t *payload, size_t payload_len,
		     uint8_t *buf, size_t cap, size_t *out_len)
{
	size_t hl = udp_codec_hdr_len(h->family);
	size_t udp_len = 8 + payload_len;
	uint8_t *udp;
	uint64_t sum;
	uint16_t c;

	if (hl == 0)
		return -EINVAL;
	if (payload_len > udp_codec_max_payload(h->family))
		return -EMSGSIZE;
	if (cap < hl + payload_len)
		return -ENOBUFS;
	/* The payload first: it may overlap where the headers go. */
	if (payload != buf + hl && payload_len)
		memmove(buf + hl, payload, payload_len);
	udp = buf + hl - 8;
	sum = write_headers(h, buf, udp, udp_len);
	c = (uint16_t)~csum_fold(csum_partial(udp, udp_len, sum));
	/* RFC 768: a computed 0 is sent as all ones (0 means "no checksum"; IPv6 forbids it). */
	csum_store16(udp + UDP_OFF_CSUM, c ? c : 0xffff);
	*out_len = hl + payload_len;
	return 0;
}

int udp_codec_encode_train(const struct udp_codec_hdr *h, size_t payload_len, size_t seg,
			   uint8_t *buf, size_t cap, size_t *out_len, struct pkt_meta *m)
{
	size_t hl = udp_codec_hdr_len(h->family);
	size_t udp_len = 8 + payload_len, n;
	uint8_t *udp;
	uint64_t sum;

	if (hl == 0 || seg == 0 || seg > 0xffff)
		return -EINVAL;
	n = (payload_len + seg - 1) / seg;
	if (n < 2 || n > UDP_CODEC_TRAIN_MAX)
		return -EINVAL;
	if (payload_len > udp_codec_max_payload(h->family))
		return -EMSGSIZE;
	if (cap < hl + payload_len)
		return -ENOBUFS;
	udp = buf + hl - 8;
	sum = write_headers(h, buf, udp, udp_len);
	csum_store16(udp + UDP_OFF_CSUM, csum_fold(sum));
	*m = (struct pkt_meta){
		.flags = PKT_META_NEEDS_CSUM,
		.gso_type = PKT_GSO_UDP_L4,
		.hdr_len = (uint16_t)hl,
		.gso_size = (uint16_t)seg,
		.csum_start = (uint16_t)(hl - 8),
		.csum_offset = UDP_OFF_CSUM,
	};
	*out_len = hl + payload_len;
	return 0;
}
