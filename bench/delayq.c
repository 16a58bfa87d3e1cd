/* delayq.c — the delay line's queue: a byte ring of packets plus a ring of their descriptors
 * (offset, length, due time), both in arrival order. See delayq.h for the contract.
 */
#include "bench/delayq.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct slot {
	int64_t due_ns;
	uint32_t off; /* into the arena; the arena is under 4 GiB (DELAYQ_BYTES_MAX) */
	uint32_t len;
};

struct delayq {
	struct delayq_params p;
	uint8_t *arena;
	uint64_t arena_len;  /* max_bytes + 2 * max_packet */
	struct slot *slots;  /* max_packets of them, a ring: head .. head + count */
	uint32_t head, count;
	uint64_t tail;       /* where the next packet goes when the arena's data does not wrap */
	uint64_t resv;       /* offset lent by the last delayq_reserve */
	int64_t last_arrival;
	struct delayq_stats st;
};

static bool params_ok(const struct delayq_params *p)
{
	return p->delay_ns >= 0 && p->delay_ns <= DELAYQ_DELAY_MAX_NS && p->late_ns >= 0 &&
	       p->max_packet >= 1 && p->max_packet <= DELAYQ_PACKET_MAX &&
	       p->max_packets >= 1 && p->max_packets <= DELAYQ_PACKETS_MAX &&
	       p->max_bytes >= p->max_packet && p->max_bytes <= DELAYQ_BYTES_MAX;
}

int delayq_new(const struct delayq_params *p, struct delayq **out)
{
	struct delayq *q;

	*out = NULL;
	if (!params_ok(p))
		return -EINVAL;
	if (!(q = calloc(1, sizeof(*q))))
		return -ENOMEM;
	q->p = *p;
	q->arena_len = p->max_bytes + 2ULL * p->max_packet;
	/* malloc, not calloc: pages the queue never reaches are never touched. */
	q->arena = malloc(q->arena_len);
	q->slots = malloc((size_t)p->max_packets * sizeof(*q->slots));
	if (!q->arena || !q->slots) {
		delayq_free(q);
		return -ENOMEM;
	}
	q->last_arrival = INT64_MIN;
	*out = q;
	return 0;
}

void delayq_free(struct delayq *q)
{
	if (!q)
		return;
	free(q->arena);
	free(q->slots);
	free(q);
}

static struct slot *slot_at(const struct delayq *q, uint32_t i)
{
	uint32_t k = q->head + i;

	return &q->slots[k >= q->p.max_packets ? k - q->p.max_packets : k];
}

/* Where max_packet contiguous free bytes start. The queued data is one run [h, tail) or,
 * after a wrap, [h, wrap end) + [0, tail). Unwrapped, either the end of the arena has room or
 * the start has: tail > arena - max_packet with at most max_bytes queued puts h past
 * max_packet. Wrapped, h - tail exceeds max_packet for the same reason (delayq.h). */
uint8_t *delayq_reserve(struct delayq *q)
{
	uint64_t h, m = q->p.max_packet;

	if (q->count == 0) {
		q->tail = 0; /* empty: start over at the front, whose pages are warm */
		q->resv = 0;
	} else {
		h = slot_at(q, 0)->off;
		if (q->tail >= h)
			q->resv = q->arena_len - q->tail >= m ? q->tail : 0;
		else
			q->resv = q->tail;
		assert(q->resv + m <= q->arena_len);
		assert(q->resv >= h || q->resv + m <= h);
	}
	return q->arena + q->resv;
}

int delayq_commit(struct delayq *q, size_t len, int64_t now_ns)
{
	struct slot *s;

	if (len == 0 || len > q->p.max_packet) {
		q->st.drops_oversize++;
		return -EMSGSIZE;
	}
	if (q->count == q->p.max_packets) {
		q->st.drops_packets++;
		return -ENOBUFS;
	}
	if (q->st.queued_bytes + len > q->p.max_bytes) {
		q->st.drops_bytes++;
		return -ENOBUFS;
	}
	/* A clock step back (or two callers' clocks) must not reorder: due times stay monotonic. */
	if (now_ns < q->last_arrival)
		now_ns = q->last_arrival;
	q->last_arrival = now_ns;
	q->count++;
	s = slot_at(q, q->count - 1);
	s->off = (uint32_t)q->resv;
	s->len = (uint32_t)len;
	s->due_ns = now_ns > INT64_MAX - q->p.delay_ns ? INT64_MAX : now_ns + q->p.delay_ns;
	q->tail = q->resv + len;
	q->st.packets_in++;
	q->st.bytes_in += len;
	q->st.queued_packets = q->count;
	q->st.queued_bytes += len;
	if (q->st.queued_bytes > q->st.max_queued_bytes)
		q->st.max_queued_bytes = q->st.queued_bytes;
	if (q->count > q->st.max_queued_packets)
		q->st.max_queued_packets = q->count;
	return 0;
}

int delayq_push(struct delayq *q, const void *data, size_t len, int64_t now_ns)
{
	uint8_t *room = delayq_reserve(q);

	if (len > 0 && len <= q->p.max_packet)
		memcpy(room, data, len);
	return delayq_commit(q, len, now_ns);
}

const uint8_t *delayq_peek(const struct delayq *q, int64_t now_ns, size_t *len)
{
	const struct slot *s;

	if (q->count == 0)
		return NULL;
	s = slot_at(q, 0);
	if (now_ns < s->due_ns)
		return NULL;
	*len = s->len;
	return q->arena + s->off;
}

void delayq_pop(struct delayq *q, int64_t now_ns)
{
	const struct slot *s;
	int64_t late;

	assert(q->count > 0);
	if (q->count == 0)
		return;
	s = slot_at(q, 0);
	late = now_ns - s->due_ns;
	if (late > q->p.late_ns)
		q->st.late++;
	if (late > q->st.max_late_ns)
		q->st.max_late_ns = late;
	q->st.packets_out++;
	q->st.bytes_out += s->len;
	q->st.queued_bytes -= s->len;
	q->head = q->head + 1 == q->p.max_packets ? 0 : q->head + 1;
	q->count--;
	q->st.queued_packets = q->count;
}

int64_t delayq_next_due(const struct delayq *q)
{
	return q->count ? slot_at(q, 0)->due_ns : INT64_MAX;
}

void delayq_get_stats(const struct delayq *q, struct delayq_stats *out)
{
	*out = q->st;
}
