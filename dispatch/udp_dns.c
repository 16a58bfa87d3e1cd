/* udp_dns.c — hijacked UDP queries answered by the proxy's own resolver (dns/server.h): no
 * session, no socket, no fd per query. A query waiting for an upstream is a small record of
 * where its reply goes (client address and port, the address and port it asked); the reply is
 * encoded as a datagram from there and written to the TUN. A reply the driver cannot take now
 * (its queue full) is dropped and counted: the client asks again.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/budget.h"
#include "core/udp_codec.h"
#include "dispatch/udp_int.h"
#include "dns/server.h"

struct udp_dnsq {
	struct udp_path *up;
	struct dns_ticket *t;
	struct udp_dnsq *next, *prev;
	bool listed;
	struct udp_codec_hdr h;          /* the reply's addresses */
};

static void dnsq_unlink(struct udp_path *up, struct udp_dnsq *q)
{
	if (!q->listed)
		return;
	if (q->prev)
		q->prev->next = q->next;
	else
		up->dnsq = q->next;
	if (q->next)
		q->next->prev = q->prev;
	q->listed = false;
}

static void on_reply(void *arg, const uint8_t *msg, size_t len)
{
	struct udp_dnsq *q = arg;
	struct udp_path *up = q->up;
	size_t hl = udp_codec_hdr_len(q->h.family), pkt_len;
	int r;

	dnsq_unlink(up, q);
	if (len == 0 || len > up->rxcap - hl)
		goto out;
	memcpy(up->rxbuf + hl, msg, len);
	q->h.ip_id = up->ip_id++;
	if (udp_codec_encode(&q->h, up->rxbuf + hl, len, up->rxbuf, up->rxcap, &pkt_len) != 0) {
		udp_count_drop(up, UDP_DROP_too_big);
		goto out;
	}
	r = up->tx(up->tx_arg, up->rxbuf, pkt_len);
	if (r == 0) {
		ctr_inc(&up->ctr.dns_answers);
		ctr_inc(&up->ctr.down_datagrams);
		ctr_add(&up->ctr.down_bytes, len);
	} else {
		udp_count_drop(up, UDP_DROP_tx_error);
	}
out:
	budget_mfree(up->b, q);
}

void udp_dns_input(struct udp_path *up, const struct udp_view *v)
{
	struct udp_dnsq *q = budget_malloc(up->b, sizeof(*q));
	size_t hl = udp_codec_hdr_len(v->family);
	size_t mtu_payload = up->mtu > hl ? up->mtu - hl : 0;
	struct dns_ticket *t;
	int ret;

	if (!q) {
		udp_count_drop(up, UDP_DROP_dns_busy);
		return;
	}
	*q = (struct udp_dnsq){ .up = up };
	q->h.family = v->family;
	memcpy(q->h.src, v->dst, 16);
	memcpy(q->h.dst, v->src, 16);
	q->h.sport_be = v->dport_be;
	q->h.dport_be = v->sport_be;
	ret = dns_server_query(up->dns, v->payload, v->payload_len, false, mtu_payload, on_reply, q,
			       &t);
	if (ret != 0) {
		udp_count_drop(up, UDP_DROP_dns_busy);
		budget_mfree(up->b, q);
		return;
	}
	/* Taken by the resolver (answered already, or waiting): sent on, not dropped. */
	ctr_inc(&up->ctr.dns_queries);
	ctr_inc(&up->ctr.up_datagrams);
	ctr_add(&up->ctr.up_bytes, v->payload_len);
	if (!t)
		return; /* answered already (q is gone) */
	q->t = t;
	q->listed = true;
	q->next = up->dnsq;
	if (up->dnsq)
		up->dnsq->prev = q;
	up->dnsq = q;
}

void udp_dns_cancel_all(struct udp_path *up)
{
	struct udp_dnsq *q;

	while ((q = up->dnsq)) {
		dnsq_unlink(up, q);
		dns_server_cancel(up->dns, q->t);
		budget_mfree(up->b, q);
	}
}

void udp_path_set_dns(struct udp_path *up, struct dns_server *dns)
{
	if (up->dns && up->dns != dns)
		udp_dns_cancel_all(up);
	up->dns = dns;
}
