/* test_delayq.c — the delay line's queue (bench/delayq.c): due times, order, the byte and
 * packet bounds with their drop counters, late pops, and a randomized run against a dumb
 * reference (a list of separately allocated packets) that forces the arena to wrap. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/delayq.h"

#define MS 1000000LL

static struct delayq *mk(int64_t delay_ns, uint64_t max_bytes, uint32_t max_packets,
			 uint32_t max_packet)
{
	struct delayq_params p = { .delay_ns = delay_ns, .max_bytes = max_bytes,
				   .max_packets = max_packets, .max_packet = max_packet,
				   .late_ns = MS };
	struct delayq *q = NULL;

	cr_assert_eq(delayq_new(&p, &q), 0);
	cr_assert_not_null(q);
	return q;
}

static struct delayq_stats stats(const struct delayq *q)
{
	struct delayq_stats s;

	delayq_get_stats(q, &s);
	return s;
}

static void fill(uint8_t *b, size_t len, uint32_t tag)
{
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)(tag * 131u + i * 7u);
}

Test(delayq, rejects_bad_parameters)
{
	struct delayq_params ok = { 10 * MS, 4096, 16, 1500, MS }, p;
	struct delayq *q = (struct delayq *)1;

	p = ok, p.delay_ns = -1;
	cr_assert_eq(delayq_new(&p, &q), -EINVAL);
	cr_assert_null(q);
	p = ok, p.max_bytes = 1499; /* smaller than one packet */
	cr_assert_eq(delayq_new(&p, &q), -EINVAL);
	p = ok, p.max_packets = 0;
	cr_assert_eq(delayq_new(&p, &q), -EINVAL);
	p = ok, p.max_packet = 0;
	cr_assert_eq(delayq_new(&p, &q), -EINVAL);
	p = ok, p.max_bytes = DELAYQ_BYTES_MAX + 1;
	cr_assert_eq(delayq_new(&p, &q), -EINVAL);
	p = ok, p.late_ns = -1;
	cr_assert_eq(delayq_new(&p, &q), -EINVAL);
	cr_assert_eq(delayq_new(&ok, &q), 0);
	delayq_free(q);
	delayq_free(NULL);
}

Test(delayq, leaves_no_earlier_than_arrival_plus_delay)
{
	struct delayq *q = mk(10 * MS, 1 << 16, 64, 1500);
	uint8_t pkt[100];
	size_t len = 0;
	const uint8_t *out;

	cr_assert_eq(delayq_next_due(q), INT64_MAX);
	cr_assert_null(delayq_peek(q, INT64_MAX, &len));
	fill(pkt, sizeof(pkt), 1);
	cr_assert_eq(delayq_push(q, pkt, sizeof(pkt), 5 * MS), 0);
	cr_assert_eq(delayq_next_due(q), 15 * MS);
	cr_assert_null(delayq_peek(q, 15 * MS - 1, &len));
	out = delayq_peek(q, 15 * MS, &len);
	cr_assert_not_null(out);
	cr_assert_eq(len, sizeof(pkt));
	cr_assert_arr_eq(out, pkt, sizeof(pkt));
	delayq_pop(q, 15 * MS);
	cr_assert_eq(delayq_next_due(q), INT64_MAX);
	struct delayq_stats s = stats(q);
	cr_assert_eq(s.packets_in, 1);
	cr_assert_eq(s.packets_out, 1);
	cr_assert_eq(s.bytes_in, 100);
	cr_assert_eq(s.bytes_out, 100);
	cr_assert_eq(s.queued_bytes, 0);
	cr_assert_eq(s.late, 0);
	cr_assert_eq(s.max_late_ns, 0);
	delayq_free(q);
}

Test(delayq, zero_delay_is_due_at_once)
{
	struct delayq *q = mk(0, 4096, 4, 1500);
	uint8_t pkt[10] = { 1, 2, 3 };
	size_t len;

	cr_assert_eq(delayq_push(q, pkt, sizeof(pkt), 77), 0);
	cr_assert_null(delayq_peek(q, 76, &len));
	cr_assert_not_null(delayq_peek(q, 77, &len));
	delayq_free(q);
}

/* Packets of different sizes at different times leave in arrival order, each exactly when
 * due and not before, with their own bytes. */
Test(delayq, keeps_arrival_order)
{
	struct delayq *q = mk(50 * MS, 1 << 20, 1024, 9000);
	static uint8_t pkt[9000];
	int64_t t = 1000;
	size_t len;

	for (uint32_t i = 0; i < 200; i++) {
		fill(pkt, 1 + i * 37 % 9000, i);
		cr_assert_eq(delayq_push(q, pkt, 1 + i * 37 % 9000, t + i * 100000LL), 0);
	}
	for (uint32_t i = 0; i < 200; i++) {
		int64_t due = t + i * 100000LL + 50 * MS;
		const uint8_t *out;

		cr_assert_eq(delayq_next_due(q), due);
		cr_assert_null(delayq_peek(q, due - 1, &len));
		out = delayq_peek(q, due, &len);
		cr_assert_not_null(out);
		cr_assert_eq(len, 1 + i * 37 % 9000);
		fill(pkt, len, i);
		cr_assert_arr_eq(out, pkt, len, "packet %u", i);
		delayq_pop(q, due);
	}
	cr_assert_eq(stats(q).packets_out, 200);
	delayq_free(q);
}

/* An arrival stamped before the previous one is taken as the previous one: order holds. */
Test(delayq, clock_step_back_keeps_order)
{
	struct delayq *q = mk(10 * MS, 4096, 8, 100);
	uint8_t a[1] = { 'a' }, b[1] = { 'b' };
	size_t len;

	cr_assert_eq(delayq_push(q, a, 1, 100 * MS), 0);
	cr_assert_eq(delayq_push(q, b, 1, 90 * MS), 0);
	cr_assert_eq(*delayq_peek(q, 110 * MS, &len), 'a');
	delayq_pop(q, 110 * MS);
	cr_assert_eq(delayq_next_due(q), 110 * MS);
	cr_assert_eq(*delayq_peek(q, 110 * MS, &len), 'b');
	delayq_free(q);
}

Test(delayq, byte_bound_drops_and_counts)
{
	struct delayq *q = mk(MS, 1000, 100, 400);
	uint8_t pkt[400] = { 0 };
	struct delayq_stats s;
	size_t len;

	cr_assert_eq(delayq_push(q, pkt, 400, 0), 0);
	cr_assert_eq(delayq_push(q, pkt, 400, 0), 0);
	cr_assert_eq(delayq_push(q, pkt, 201, 0), -ENOBUFS); /* 1001 > 1000 */
	cr_assert_eq(delayq_push(q, pkt, 200, 0), 0);        /* exactly 1000 fits */
	cr_assert_eq(delayq_push(q, pkt, 1, 0), -ENOBUFS);
	s = stats(q);
	cr_assert_eq(s.drops_bytes, 2);
	cr_assert_eq(s.drops_packets, 0);
	cr_assert_eq(s.packets_in, 3);
	cr_assert_eq(s.queued_bytes, 1000);
	cr_assert_eq(s.max_queued_bytes, 1000);
	cr_assert_not_null(delayq_peek(q, MS, &len));
	delayq_pop(q, MS);
	cr_assert_eq(delayq_push(q, pkt, 400, MS), 0); /* room again after a pop */
	s = stats(q);
	cr_assert_eq(s.queued_bytes, 1000);
	cr_assert_eq(s.max_queued_bytes, 1000);
	cr_assert_eq(s.drops_bytes, 2);
	delayq_free(q);
}

Test(delayq, packet_bound_drops_and_counts)
{
	struct delayq *q = mk(MS, 1 << 16, 2, 100);
	uint8_t pkt[10] = { 0 };
	struct delayq_stats s;

	cr_assert_eq(delayq_push(q, pkt, 10, 0), 0);
	cr_assert_eq(delayq_push(q, pkt, 10, 0), 0);
	cr_assert_eq(delayq_push(q, pkt, 10, 0), -ENOBUFS);
	cr_assert_eq(delayq_push(q, pkt, 10, 0), -ENOBUFS);
	s = stats(q);
	cr_assert_eq(s.drops_packets, 2);
	cr_assert_eq(s.drops_bytes, 0);
	cr_assert_eq(s.queued_packets, 2);
	cr_assert_eq(s.max_queued_packets, 2);
	cr_assert_eq(s.queued_bytes, 20);
	delayq_free(q);
}

Test(delayq, oversize_and_empty_are_refused)
{
	struct delayq *q = mk(MS, 4096, 8, 100);
	uint8_t pkt[101] = { 0 };

	cr_assert_eq(delayq_push(q, pkt, 101, 0), -EMSGSIZE);
	cr_assert_eq(delayq_push(q, pkt, 0, 0), -EMSGSIZE);
	cr_assert_eq(stats(q).drops_oversize, 2);
	cr_assert_eq(stats(q).packets_in, 0);
	cr_assert_eq(delayq_next_due(q), INT64_MAX);
	delayq_free(q);
}

/* A reservation that is not committed queues nothing and is lent again. */
Test(delayq, uncommitted_reservation_is_reused)
{
	struct delayq *q = mk(MS, 4096, 8, 100);
	uint8_t *a = delayq_reserve(q), *b;
	size_t len;

	memset(a, 'x', 100);
	b = delayq_reserve(q);
	cr_assert_eq(a, b);
	cr_assert_eq(delayq_next_due(q), INT64_MAX);
	memcpy(b, "hello", 5);
	cr_assert_eq(delayq_commit(q, 5, 0), 0);
	cr_assert_arr_eq(delayq_peek(q, MS, &len), "hello", 5);
	cr_assert_eq(len, 5);
	delayq_free(q);
}

Test(delayq, late_pops_are_counted)
{
	struct delayq *q = mk(10 * MS, 4096, 8, 100);
	uint8_t pkt[1] = { 0 };

	for (int i = 0; i < 3; i++)
		cr_assert_eq(delayq_push(q, pkt, 1, 0), 0);
	delayq_pop(q, 10 * MS + MS);     /* exactly late_ns late: on time */
	delayq_pop(q, 10 * MS + MS + 1); /* one nanosecond more: late */
	delayq_pop(q, 10 * MS + 5 * MS);
	struct delayq_stats s = stats(q);
	cr_assert_eq(s.late, 2);
	cr_assert_eq(s.max_late_ns, 5 * MS);
	delayq_free(q);
}

/* The reference: every queued packet in its own allocation, in a plain array. */
struct ref_pkt {
	uint8_t *data;
	size_t len;
	int64_t due;
};

/* Random sizes (many near max_packet) and random interleaving of arrivals and departures
 * through a small arena: it wraps thousands of times, and whatever the bounds accept must come
 * out bit-exact, in order, when due; the counters must match the reference's. */
Test(delayq, randomized_against_reference)
{
	enum { MAXP = 1500, MAXN = 64, STEPS = 200000 };
	const uint64_t max_bytes = 16 * MAXP;
	struct delayq *q = mk(3 * MS, max_bytes, MAXN, MAXP);
	struct ref_pkt *ref = calloc(STEPS, sizeof(*ref));
	size_t rhead = 0, rtail = 0, len;
	uint64_t rbytes = 0, drops_b = 0, drops_p = 0, in = 0, out = 0;
	uint32_t seed = 12345, wraps = 0;
	uint8_t *last_room = NULL;
	int64_t now = 0;

	cr_assert_not_null(ref);
	for (int step = 0; step < STEPS; step++) {
		seed = seed * 1103515245u + 12345u;
		uint32_t r = seed >> 8;
		/* Phases of bursts of small packets (the packet bound is reached first) and
		 * of large packets further apart (the byte bound is). */
		bool small = (step / 5000) % 2;
		now += (int64_t)(r % (small ? 20 : 200)) * 1000;
		if (r % 3 != 0) {
			size_t plen = small ? 1 + r % 64 : r % 4 == 0 ? MAXP - r % 16 : 1 + r % MAXP;
			uint8_t *room = delayq_reserve(q);
			if (room < last_room && rtail > rhead)
				wraps++; /* back to the front with packets still queued */
			last_room = room;
			fill(room, plen, (uint32_t)step);
			int ret = delayq_commit(q, plen, now);
			if (rtail - rhead == MAXN) {
				cr_assert_eq(ret, -ENOBUFS);
				drops_p++;
			} else if (rbytes + plen > max_bytes) {
				cr_assert_eq(ret, -ENOBUFS);
				drops_b++;
			} else {
				cr_assert_eq(ret, 0, "step %d", step);
				ref[rtail].data = malloc(plen);
				fill(ref[rtail].data, plen, (uint32_t)step);
				ref[rtail].len = plen;
				ref[rtail].due = now + 3 * MS;
				rtail++;
				rbytes += plen;
				in++;
			}
		}
		const uint8_t *p;
		while ((p = delayq_peek(q, now, &len))) {
			cr_assert_lt(rhead, rtail);
			cr_assert_geq(now, ref[rhead].due);
			cr_assert_eq(len, ref[rhead].len);
			cr_assert_arr_eq(p, ref[rhead].data, len, "step %d", step);
			delayq_pop(q, now);
			rbytes -= len;
			free(ref[rhead].data);
			rhead++;
			out++;
		}
		/* Nothing due is held back. */
		cr_assert(rhead == rtail || ref[rhead].due > now);
		cr_assert_eq(delayq_next_due(q), rhead == rtail ? INT64_MAX : ref[rhead].due);
	}
	struct delayq_stats s = stats(q);
	cr_assert_eq(s.packets_in, in);
	cr_assert_eq(s.packets_out, out);
	cr_assert_eq(s.drops_bytes, drops_b);
	cr_assert_eq(s.drops_packets, drops_p);
	cr_assert_eq(s.queued_bytes, rbytes);
	cr_assert_gt(drops_b, 0);  /* both bounds were reached ... */
	cr_assert_gt(drops_p, 0);
	cr_assert_gt(out, 50000); /* ... a lot went through ... */
	cr_assert_gt(wraps, 1000); /* ... and the arena wrapped under queued packets */
	cr_assert_leq(s.max_queued_bytes, max_bytes);
	cr_assert_leq(s.max_queued_packets, MAXN);
	for (size_t i = rhead; i < rtail; i++)
		free(ref[i].data);
	free(ref);
	delayq_free(q);
}
