/* gso.c — TCP segment trains for GSO output (see gso.h). */
#include "core/gso.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "core/budget.h"
#include "core/csum.h"
#include "core/pkt.h"

struct gso_train {
	gso_emit_fn emit;
	void *arg;
	struct budget *budget;
	uint8_t *buf;        /* [headers of the first segment][payload of every segment] */
	size_t len;          /* bytes in buf; 0: no train */
	uint16_t hlen;       /* IP + TCP header bytes */
	uint16_t l3_len;     /* 20 or 40 */
	uint16_t seg;        /* payload bytes of each segment (the first one's) */
	uint16_t nseg;
	uint8_t family;
	uint8_t psh;         /* a segment had PSH: the super-packet's last segment gets it */
	uint8_t fill_csum;   /* gso_train_fill_csum */
	uint32_t next_seq;   /* host order */
	struct gso_stats st;
};

int gso_train_new(struct budget *b, gso_emit_fn emit, void *arg, struct gso_train **out)
{
	struct gso_train *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->emit = emit;
	t->arg = arg;
	t->budget = b;
	t->buf = b ? budget_malloc(b, GSO_TRAIN_MAX) : malloc(GSO_TRAIN_MAX);
	if (!t->buf) {
		free(t);
		return -ENOMEM;
	}
	memset(t->buf, 0, GSO_TRAIN_MAX); /* pre-fault */
	*out = t;
	return 0;
}

void gso_train_free(struct gso_train *t)
{
	if (!t)
		return;
	if (t->budget)
		budget_mfree(t->budget, t->buf);
	else
		free(t->buf);
	free(t);
}

const struct gso_stats *gso_train_stats(const struct gso_train *t)
{
	return &t->st;
}

void gso_train_fill_csum(struct gso_train *t, int on)
{
	t->fill_csum = on != 0;
}

/* The full TCP checksum of a plain packet (IP header of l3_len bytes, TCP after it). */
static void fill_tcp_csum(struct gso_train *t, uint8_t *ip, size_t len, uint16_t l3_len,
			  int family)
{
	uint8_t *tcp = ip + l3_len;
	uint32_t l4_len = (uint32_t)(len - l3_len);
	uint64_t sum = family == 4
		? csum_pseudo4(ip + PKT_V4_SRC, ip + PKT_V4_DST, IPPROTO_TCP, l4_len)
		: csum_pseudo6(ip + PKT_V6_SRC, ip + PKT_V6_DST, IPPROTO_TCP, l4_len);

	csum_store16(tcp + TCP_OFF_CSUM, 0);
	csum_store16(tcp + TCP_OFF_CSUM, (uint16_t)~csum_fold(csum_partial(tcp, l4_len, sum)));
	ctr_inc(&t->st.csum_filled);
}

int gso_train_pending(const struct gso_train *t)
{
	return t->len != 0;
}

/* Emit the TCP packet at ip (len bytes, headers of hlen, IP header of l3_len) as one GSO
 * super-packet the kernel cuts into segments of seg payload bytes: the IP length (and IPv4
 * header checksum) set for the whole, the TCP checksum field holding the un-inverted
 * pseudo-header sum over the whole L4 length (what NEEDS_CSUM means). */
static void emit_super(struct gso_train *t, uint8_t *ip, size_t len, uint16_t l3_len,
		       uint16_t hlen, int family, uint16_t seg)
{
	uint8_t *tcp = ip + l3_len;
	uint32_t l4_len = (uint32_t)(len - l3_len);
	uint64_t sum;
	struct pkt_meta m;

	if (family == 4) {
		pkt_put16(ip + 2, (uint16_t)len);
		csum_store16(ip + 10, 0);
		csum_store16(ip + 10, csum_buf(ip, 20));
		sum = csum_pseudo4(ip + PKT_V4_SRC, ip + PKT_V4_DST, IPPROTO_TCP, l4_len);
	} else {
		pkt_put16(ip + 4, (uint16_t)l4_len);
		sum = csum_pseudo6(ip + PKT_V6_SRC, ip + PKT_V6_DST, IPPROTO_TCP, l4_len);
	}
	csum_store16(tcp + TCP_OFF_CSUM, csum_fold(sum));
	m = (struct pkt_meta){
		.flags = PKT_META_NEEDS_CSUM,
		.gso_type = family == 4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6,
		.hdr_len = hlen,
		.gso_size = seg,
		.csum_start = l3_len,
		.csum_offset = TCP_OFF_CSUM,
	};
	t->emit(t->arg, ip, len, &m);
}

void gso_train_flush(struct gso_train *t)
{
	static const struct pkt_meta plain;
	uint8_t *ip = t->buf, *tcp = t->buf + t->l3_len;

	if (!t->len)
		return;
	if (t->nseg == 1) {
		/* Untouched: the segment exactly as the stack built it (its checksum filled in
		 * when the stack left that to us). */
		if (t->fill_csum)
			fill_tcp_csum(t, t->buf, t->len, t->l3_len, t->family);
		ctr_inc(&t->st.singles);
		t->emit(t->arg, t->buf, t->len, &plain);
		t->len = 0;
		return;
	}
	if (t->psh)
		tcp[TCP_OFF_FLAGS] |= TCP_PSH;
	ctr_inc(&t->st.trains);
	ctr_add(&t->st.train_segments, t->nseg);
	emit_super(t, ip, t->len, t->l3_len, t->hlen, t->family, t->seg);
	t->len = 0;
}

/* Does the segment (parsed in v, headers of hlen bytes) continue the train? */
static int continues(const struct gso_train *t, const struct pkt_view *v, uint16_t hlen,
		     uint32_t payload)
{
	const uint8_t *a = t->buf, *b = v->ip;

	if (!t->len || v->family != t->family || hlen != t->hlen || payload > t->seg ||
	    t->len + payload > GSO_TRAIN_MAX ||
	    pkt_get32(v->l4 + TCP_OFF_SEQ) != t->next_seq)
		return 0;
	/* The last segment of a train may be short; after it nothing may join. */
	if ((t->len - t->hlen) % t->seg != 0)
		return 0;
	if (v->family == 4) {
		/* Addresses, then the whole TCP header but the sequence number and checksum
		 * (ports, ack, offset, flags, window, urgent pointer, options). */
		if (memcmp(a + 12, b + 12, 8) != 0)
			return 0;
	} else if (memcmp(a + 8, b + 8, 32) != 0) {
		return 0;
	}
	a += t->l3_len;
	b = v->l4;
	return memcmp(a, b, 4) == 0 && memcmp(a + 8, b + 8, 5) == 0 &&
	       (a[13] | TCP_PSH) == (b[13] | TCP_PSH) && memcmp(a + 14, b + 14, 2) == 0 &&
	       memcmp(a + 18, b + 18, hlen - v->l3_len - 18) == 0;
}

void gso_train_add(struct gso_train *t, uint8_t *pkt, size_t len)
{
	static const struct pkt_meta plain;
	struct pkt_view v;
	uint32_t payload;
	uint16_t hlen;
	uint8_t flags;
	int tcp = 0; /* a whole TCP packet: its checksum can be filled in */

	ctr_inc(&t->st.segments);
	if (len > GSO_TRAIN_MAX || pkt_parse(&v, pkt, len) != PKT_OK || v.proto != IPPROTO_TCP ||
	    v.len != len)
		goto alone;
	tcp = 1;
	if (v.l3_len != (v.family == 4 ? 20 : 40))
		goto alone;
	hlen = (uint16_t)(v.l3_len + v.tcp_hlen);
	payload = v.len - hlen;
	flags = v.tcp_flags & (uint8_t)~TCP_PSH;
	if (payload == 0 || flags != TCP_ACK || (v.l4[13] & 0xe0) /* URG, ECE, CWR */)
		goto alone;
	if (continues(t, &v, hlen, payload)) {
		memcpy(t->buf + t->len, pkt + hlen, payload);
		t->len += payload;
		t->nseg++;
		t->next_seq += payload;
		t->psh |= (v.tcp_flags & TCP_PSH) != 0;
		return;
	}
	gso_train_flush(t);
	memcpy(t->buf, pkt, len);
	t->len = len;
	t->hlen = hlen;
	t->l3_len = v.l3_len;
	t->seg = (uint16_t)payload;
	t->nseg = 1;
	t->family = v.family;
	t->psh = (v.tcp_flags & TCP_PSH) != 0;
	t->next_seq = pkt_get32(v.l4 + TCP_OFF_SEQ) + payload;
	return;
alone:
	gso_train_flush(t);
	if (t->fill_csum && tcp)
		fill_tcp_csum(t, pkt, len, v.l3_len, v.family);
	ctr_inc(&t->st.singles);
	t->emit(t->arg, pkt, len, &plain);
}

void gso_train_add_big(struct gso_train *t, uint8_t *pkt, size_t len, uint16_t mss)
{
	struct pkt_view v;
	uint16_t hlen;

	if (!mss || len > GSO_TRAIN_MAX || pkt_parse(&v, pkt, len) != PKT_OK ||
	    v.proto != IPPROTO_TCP || v.len != len || v.l3_len != (v.family == 4 ? 20 : 40)) {
		gso_train_add(t, pkt, len);
		return;
	}
	hlen = (uint16_t)(v.l3_len + v.tcp_hlen);
	if (v.len - hlen <= mss || (v.l4[TCP_OFF_FLAGS] & (TCP_SYN | TCP_RST | 0x20 /* URG */))) {
		gso_train_add(t, pkt, len);
		return;
	}
	ctr_inc(&t->st.segments);
	gso_train_flush(t); /* what the train holds went first */
	ctr_inc(&t->st.big_packets);
	ctr_add(&t->st.big_segments, (v.len - hlen + mss - 1) / mss);
	emit_super(t, pkt, len, v.l3_len, hlen, v.family, mss);
}
