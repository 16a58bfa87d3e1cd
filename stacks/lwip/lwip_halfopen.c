/* lwip_halfopen.c — the index of the handshakes lwIP holds half-open (see lwip_halfopen.h).
 *
 * A chained hash table over a fixed array of entries: a power of two of buckets, at least two
 * per entry, each the index (plus one) of its first entry; free entries on a list of their own;
 * the entries in use also on a doubly linked list in the order they were entered (newest first).
 * Entries never move, so a handshake's pcb carries a pointer to its entry in its extension
 * argument, and lwIP's destroy callback, which gets only that pointer, finds the index through
 * the entry. A pcb whose handshake left the index (accepted) has its pointer cleared first. */
#include "stacks/lwip/lwip_halfopen.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"
#include "stacks/lwip/lwip_isn.h"

struct lwip_halfopen_entry {
	struct flow_key key;
	struct lwip_halfopen *h;
	struct tcp_pcb *pcb; /* the handshake's (NULL: entered by lwip_halfopen_add alone) */
	uint32_t next;   /* the next entry of its bucket or of the free list, plus one; 0: none */
	uint32_t bucket; /* its bucket, while entered */
	uint32_t newer, older; /* its neighbours in the order entered, plus one; 0: none */
};

struct lwip_halfopen {
	uint64_t k0, k1;
	unsigned cap, count;
	uint32_t mask;     /* buckets - 1 */
	uint32_t free;     /* the first free entry, plus one; 0: none */
	uint32_t newest;   /* the entry entered last, plus one; 0: none */
	uint32_t *buckets; /* the first entry of each, plus one; 0: empty */
	/* The handshake the segment now inside lwIP opened, until lwip_halfopen_input_end; set
	 * to NULL, and abandoned to true, when its pcb is freed before then. */
	struct lwip_halfopen_entry *opening;
	bool abandoned;
	struct lwip_halfopen_entry e[];
};

/* One slot for the process: lwIP's ids are never given back (as lwip_ackq.c's). */
static uint8_t ext_id = LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID;

void lwip_halfopen_init(void)
{
	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		ext_id = tcp_ext_arg_alloc_id();
}

int lwip_halfopen_new(unsigned cap, uint64_t k0, uint64_t k1, struct lwip_halfopen **out)
{
	struct lwip_halfopen *h;
	uint32_t n = 2;

	*out = NULL;
	if (cap == 0 || cap > UINT32_MAX / 4)
		return -EINVAL;
	while (n < 2 * cap)
		n *= 2;
	h = calloc(1, sizeof(*h) + (size_t)cap * sizeof(h->e[0]));
	if (!h || !(h->buckets = calloc(n, sizeof(*h->buckets)))) {
		free(h);
		return -ENOMEM;
	}
	h->k0 = k0;
	h->k1 = k1;
	h->cap = cap;
	h->mask = n - 1;
	for (unsigned i = 0; i < cap; i++) {
		h->e[i].h = h;
		h->e[i].next = i + 1 < cap ? i + 2 : 0;
	}
	h->free = 1;
	*out = h;
	return 0;
}

void lwip_halfopen_free(struct lwip_halfopen *h)
{
	if (!h)
		return;
	free(h->buckets);
	free(h);
}

static uint32_t bucket_of(const struct lwip_halfopen *h, const struct flow_key *k)
{
	return (uint32_t)lwip_siphash24(h->k0, h->k1, (const uint8_t *)k, sizeof(*k)) & h->mask;
}

static struct lwip_halfopen_entry *find(const struct lwip_halfopen *h, const struct flow_key *k,
					uint32_t b)
{
	for (uint32_t i = h->buckets[b]; i; i = h->e[i - 1].next)
		if (flow_key_eq(&h->e[i - 1].key, k))
			return (struct lwip_halfopen_entry *)&h->e[i - 1];
	return NULL;
}

bool lwip_halfopen_holds(const struct lwip_halfopen *h, const struct flow_key *k)
{
	return h->count && find(h, k, bucket_of(h, k));
}

struct lwip_halfopen_entry *lwip_halfopen_add(struct lwip_halfopen *h, const struct flow_key *k)
{
	uint32_t b = bucket_of(h, k), i = h->free;
	struct lwip_halfopen_entry *e;

	if (!i || find(h, k, b))
		return NULL;
	e = &h->e[i - 1];
	h->free = e->next;
	e->key = *k;
	e->pcb = NULL;
	e->bucket = b;
	e->next = h->buckets[b];
	h->buckets[b] = i;
	e->newer = 0;
	e->older = h->newest;
	if (h->newest)
		h->e[h->newest - 1].newer = i;
	h->newest = i;
	h->count++;
	return e;
}

void lwip_halfopen_remove(struct lwip_halfopen *h, struct lwip_halfopen_entry *e)
{
	uint32_t i = (uint32_t)(e - h->e) + 1, *link = &h->buckets[e->bucket];

	assert(e->h == h && i <= h->cap);
	while (*link != i) {
		assert(*link);
		link = &h->e[*link - 1].next;
	}
	*link = e->next;
	if (e->newer)
		h->e[e->newer - 1].older = e->older;
	else
		h->newest = e->older;
	if (e->older)
		h->e[e->older - 1].newer = e->newer;
	e->next = h->free;
	h->free = i;
	h->count--;
}

unsigned lwip_halfopen_pcbs(const struct lwip_halfopen *h, struct tcp_pcb **pcbs, unsigned max)
{
	unsigned n = 0;

	for (uint32_t i = h->newest; i && n < max; i = h->e[i - 1].older)
		if (h->e[i - 1].pcb)
			pcbs[n++] = h->e[i - 1].pcb;
	return n;
}

unsigned lwip_halfopen_count(const struct lwip_halfopen *h)
{
	return h->count;
}

void lwip_halfopen_key(const struct tcp_pcb *pcb, struct flow_key *k)
{
	memset(k, 0, sizeof(*k));
	k->proto = IPPROTO_TCP;
	if (IP_IS_V6(&pcb->local_ip)) {
		k->family = 6;
		memcpy(k->src, ip_2_ip6(&pcb->remote_ip)->addr, 16);
		memcpy(k->dst, ip_2_ip6(&pcb->local_ip)->addr, 16);
	} else {
		k->family = 4;
		memcpy(k->src, &ip_2_ip4(&pcb->remote_ip)->addr, 4);
		memcpy(k->dst, &ip_2_ip4(&pcb->local_ip)->addr, 4);
	}
	k->sport_be = htons(pcb->remote_port);
	k->dport_be = htons(pcb->local_port);
}

/* ---- lwIP's callbacks ------------------------------------------------------------------------ */

/* A handshake's pcb is freed: its entry goes (data: the entry, NULL once it left). */
static void on_destroyed(u8_t id, void *data)
{
	struct lwip_halfopen_entry *e = data;
	struct lwip_halfopen *h;

	(void)id;
	if (!e)
		return;
	h = e->h;
	if (h->opening == e) {
		h->opening = NULL;
		h->abandoned = true;
	}
	lwip_halfopen_remove(h, e);
}

static const struct tcp_ext_arg_callbacks pcb_callbacks = { .destroy = on_destroyed };

/* Inside tcp_listen_input, the new pcb set up and counted in the backlog, its SYN-ACK not yet
 * queued. Never refuses: an error would make lwIP abandon the handshake. */
static err_t on_passive_open(u8_t id, struct tcp_pcb_listen *lpcb, struct tcp_pcb *cpcb)
{
	struct lwip_halfopen *h = lpcb->ext_args[id].data;
	struct lwip_halfopen_entry *e;
	struct flow_key k;

	if (!h)
		return ERR_OK;
	lwip_halfopen_key(cpcb, &k);
	/* The backlog bounds the handshakes, and a SYN of a held tuple reaches its pcb, never
	 * the listener: an entry is always free, the key never entered. */
	e = lwip_halfopen_add(h, &k);
	assert(e);
	if (!e)
		return ERR_OK;
	e->pcb = cpcb;
	h->opening = e;
	tcp_ext_arg_set_callbacks(cpcb, id, &pcb_callbacks);
	tcp_ext_arg_set(cpcb, id, e);
	return ERR_OK;
}

static const struct tcp_ext_arg_callbacks listener_callbacks = { .passive_open = on_passive_open };

void lwip_halfopen_watch(struct lwip_halfopen *h, struct tcp_pcb *listener)
{
	assert(listener->state == LISTEN &&
	       ((struct tcp_pcb_listen *)listener)->backlog <= h->cap);
	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID)
		return;
	tcp_ext_arg_set_callbacks(listener, ext_id, &listener_callbacks);
	tcp_ext_arg_set(listener, ext_id, h);
}

bool lwip_halfopen_abandon(struct lwip_halfopen *h, const struct flow_key *k)
{
	struct lwip_halfopen_entry *e;

	assert(!h->opening);
	if (!h->count || !(e = find(h, k, bucket_of(h, k))) || !e->pcb)
		return false;
	/* on_destroyed removes e before tcp_abandon returns. */
	tcp_abandon(e->pcb, 0);
	return true;
}

void lwip_halfopen_accepted(struct lwip_halfopen *h, struct tcp_pcb *pcb)
{
	struct lwip_halfopen_entry *e;

	if (ext_id == LWIP_TCP_PCB_NUM_EXT_ARG_ID_INVALID ||
	    !(e = pcb->ext_args[ext_id].data) || e->h != h)
		return;
	tcp_ext_arg_set(pcb, ext_id, NULL);
	if (h->opening == e)
		h->opening = NULL;
	lwip_halfopen_remove(h, e);
}

bool lwip_halfopen_input_end(struct lwip_halfopen *h)
{
	bool abandoned = h->abandoned;

	h->opening = NULL;
	h->abandoned = false;
	return abandoned;
}
