/* test_lwip_halfopen.c — the index of half-open handshakes (stacks/lwip/lwip_halfopen.c) as a
 * set, without lwIP:
 *   - a key is entered once; cap keys fit, the next is refused; a removed entry's place is
 *     free again and its key gone, the others kept (also when they share a bucket);
 *   - randomized against a dumb reference (an array searched linearly): every add, remove and
 *     lookup agrees, with keys of both families drawn from a small space so they repeat.
 * How lwIP's callbacks keep it (a repeated SYN answered with a full backlog, handshakes that
 * went away, a SYN-ACK lwIP had no memory for) is in test_lwip_stack.c. */
#include <criterion/criterion.h>

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "stacks/lwip/lwip_halfopen.h"

static struct flow_key key(int family, uint32_t addr, uint16_t port)
{
	struct flow_key k;

	memset(&k, 0, sizeof(k));
	k.family = (uint8_t)family;
	k.proto = IPPROTO_TCP;
	k.sport_be = htons(port);
	k.dport_be = htons(80);
	memcpy(k.src + (family == 6 ? 12 : 0), &addr, 4);
	if (family == 6)
		k.src[0] = 0xfd;
	k.dst[0] = 1;
	return k;
}

Test(lwip_halfopen, bounded_and_removable)
{
	struct lwip_halfopen *h;
	struct lwip_halfopen_entry *e[8];
	struct flow_key k;

	cr_assert_eq(lwip_halfopen_new(0, 1, 2, &h), -EINVAL);
	cr_assert_eq(lwip_halfopen_new(8, 1, 2, &h), 0);
	for (uint16_t i = 0; i < 8; i++) {
		k = key(4, 0x0a000001, (uint16_t)(1000 + i));
		cr_assert_not(lwip_halfopen_holds(h, &k));
		cr_assert_not_null(e[i] = lwip_halfopen_add(h, &k), "key %u", i);
		cr_assert_null(lwip_halfopen_add(h, &k), "entered once");
		cr_assert(lwip_halfopen_holds(h, &k));
	}
	cr_assert_eq(lwip_halfopen_count(h), 8);
	k = key(4, 0x0a000001, 2000);
	cr_assert_null(lwip_halfopen_add(h, &k), "full");
	lwip_halfopen_remove(h, e[3]);
	k = key(4, 0x0a000001, 1003);
	cr_assert_not(lwip_halfopen_holds(h, &k), "removed");
	for (uint16_t i = 0; i < 8; i++) {
		k = key(4, 0x0a000001, (uint16_t)(1000 + i));
		cr_assert_eq(lwip_halfopen_holds(h, &k), i != 3, "key %u", i);
	}
	k = key(6, 0x0a000001, 1003);
	cr_assert_not(lwip_halfopen_holds(h, &k), "the other family's tuple is another key");
	cr_assert_not_null(lwip_halfopen_add(h, &k), "the freed place is taken again");
	cr_assert_eq(lwip_halfopen_count(h), 8);
	lwip_halfopen_free(h);
}

/* Two buckets per entry: with 200 entries in 512 buckets some share one, and removing the
 * first, middle or last of a chain keeps the rest. */
Test(lwip_halfopen, agrees_with_a_linear_reference)
{
	enum { CAP = 200, SPACE = 600, STEPS = 200000 };
	static struct flow_key ref[CAP];
	static struct lwip_halfopen_entry *ent[CAP];
	struct lwip_halfopen *h;
	unsigned n = 0;

	srand(7);
	cr_assert_eq(lwip_halfopen_new(CAP, 0x0123456789abcdefULL, 0xfedcba9876543210ULL, &h), 0);
	for (int step = 0; step < STEPS; step++) {
		unsigned r = (unsigned)rand() % SPACE;
		struct flow_key k = key(r & 1 ? 6 : 4, 0x0a000000u + r / 16, (uint16_t)(r % 16));
		unsigned at = n;

		for (unsigned i = 0; i < n; i++)
			if (flow_key_eq(&ref[i], &k))
				at = i;
		cr_assert_eq(lwip_halfopen_holds(h, &k), at < n, "step %d", step);
		if (rand() % 2 == 0) {
			struct lwip_halfopen_entry *e = lwip_halfopen_add(h, &k);

			cr_assert_eq(e != NULL, at == n && n < CAP, "step %d: add", step);
			if (e) {
				ref[n] = k;
				ent[n++] = e;
			}
		} else if (at < n) {
			lwip_halfopen_remove(h, ent[at]);
			ref[at] = ref[--n];
			ent[at] = ent[n];
		}
		cr_assert_eq(lwip_halfopen_count(h), n, "step %d", step);
	}
	for (unsigned i = 0; i < n; i++)
		cr_assert(lwip_halfopen_holds(h, &ref[i]));
	lwip_halfopen_free(h);
}
