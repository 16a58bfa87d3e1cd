/* test_fakeip.c — dns/fakeip: addresses handed out in order, skipping the network, broadcast
 * and anycast addresses; a name asked again gets its address back; an address gives its name
 * back, an unmapped one inside the range is told apart from one outside; reuse of the least
 * recently used mapping once the range or max_mappings is used up, never of a pinned one nor
 * within the cooldown; persistence round trip with bad lines counted.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dns/fakeip.h"
#include "failalloc.h"
#include "testutil.h"

static struct fakeip *pool(const char *r4, const char *r6, uint32_t max, uint32_t cooldown)
{
	struct fakeip_config c = { .max_mappings = max, .cooldown_s = cooldown };
	struct fakeip *f;

	if (r4)
		cr_assert_eq(netaddr_parse_cidr(r4, &c.range4), 0);
	if (r6)
		cr_assert_eq(netaddr_parse_cidr(r6, &c.range6), 0);
	cr_assert_eq(fakeip_new(&c, &f), 0);
	return f;
}

/* The address of name as text ("" when refused: ret in *err). */
static const char *addr_of(struct fakeip *f, const char *name, int family, int64_t now, int *err)
{
	static char text[NETADDR_STRLEN];
	struct netaddr a = { .family = (uint8_t)family };
	int ret = fakeip_address(f, name, strlen(name), family, now, a.a);

	if (err)
		*err = ret;
	if (ret != 0)
		return "";
	return netaddr_format(&a, text, sizeof(text));
}

static int name_of(struct fakeip *f, const char *addr, char *buf)
{
	uint8_t a[16];
	int family = tu_addr(a, addr);

	return fakeip_name(f, family, a, 0, buf, 254);
}

Test(fakeip, in_order_stable_and_reversible)
{
	struct fakeip *f = pool("198.19.0.0/16", "fd00:7f:8000::/65", 1000, 0);
	char buf[254];

	cr_assert_str_eq(addr_of(f, "one.test", 4, 0, NULL), "198.19.0.1", "not the network address");
	cr_assert_str_eq(addr_of(f, "two.test", 4, 0, NULL), "198.19.0.2");
	cr_assert_str_eq(addr_of(f, "ONE.test.", 4, 5, NULL), "198.19.0.1", "case, trailing dot");
	cr_assert_str_eq(addr_of(f, "one.test", 6, 0, NULL), "fd00:7f:8000::1", "not ::0 of the range");
	cr_assert_eq(name_of(f, "198.19.0.2", buf), 8);
	cr_assert_str_eq(buf, "two.test");
	cr_assert_eq(name_of(f, "198.19.0.99", buf), 0, "in the range, unmapped: refuse");
	cr_assert_eq(name_of(f, "198.18.0.9", buf), -ENOENT, "not a fake address");
	cr_assert_eq(name_of(f, "fd00:7f:8000::1", buf), 8);
	struct fakeip_stats st;
	fakeip_get_stats(f, &st);
	cr_assert_eq(st.mappings, 3);
	cr_assert_eq(st.created, 3);
	cr_assert_eq(st.hits, 1);
	cr_assert_eq(st.unmapped, 1);
	fakeip_free(f);
}

Test(fakeip, bad_names_and_families)
{
	struct fakeip *f = pool("198.19.0.0/16", NULL, 10, 0);
	int err;

	addr_of(f, "bad name", 4, 0, &err);
	cr_assert_eq(err, -EINVAL);
	addr_of(f, "", 4, 0, &err);
	cr_assert_eq(err, -EINVAL);
	addr_of(f, "v6.test", 6, 0, &err);
	cr_assert_eq(err, -EAFNOSUPPORT, "no IPv6 range");
	fakeip_free(f);
}

Test(fakeip, a_full_range_reuses_the_least_recently_used)
{
	/* A /30: .1 and .2 usable. */
	struct fakeip *f = pool("198.19.0.0/30", NULL, 100, 0);
	char buf[254];

	cr_assert_str_eq(addr_of(f, "a.test", 4, 1, NULL), "198.19.0.1");
	cr_assert_str_eq(addr_of(f, "b.test", 4, 2, NULL), "198.19.0.2");
	cr_assert_str_eq(addr_of(f, "a.test", 4, 3, NULL), "198.19.0.1", "a used again: b is older");
	cr_assert_str_eq(addr_of(f, "c.test", 4, 4, NULL), "198.19.0.2", "b's address reused");
	cr_assert_eq(name_of(f, "198.19.0.2", buf), 6);
	cr_assert_str_eq(buf, "c.test");
	cr_assert_str_eq(addr_of(f, "b.test", 4, 5, NULL), "198.19.0.1", "b anew, on a's");
	struct fakeip_stats st;
	fakeip_get_stats(f, &st);
	cr_assert_eq(st.reused, 2);
	cr_assert_eq(st.mappings, 2);
	fakeip_free(f);
}

Test(fakeip, pinned_and_cooling_mappings_are_never_reused)
{
	struct fakeip *f = pool("198.19.0.0/30", NULL, 100, 60);
	uint8_t a1[16], a2[16];
	int err;

	tu_addr(a1, "198.19.0.1");
	tu_addr(a2, "198.19.0.2");
	addr_of(f, "a.test", 4, 0, NULL);
	addr_of(f, "b.test", 4, 0, NULL);
	addr_of(f, "c.test", 4, 30, &err);
	cr_assert_eq(err, -ENOSPC, "both cooling down");
	fakeip_pin(f, 4, a1);
	cr_assert_str_eq(addr_of(f, "c.test", 4, 61, NULL), "198.19.0.2", "a is pinned: b goes");
	addr_of(f, "d.test", 4, 100, &err);
	cr_assert_eq(err, -ENOSPC, "a pinned, c used 39 s ago");
	fakeip_unpin(f, 4, a1, 100);
	cr_assert_str_eq(addr_of(f, "d.test", 4, 125, NULL), "198.19.0.2", "c has cooled");
	addr_of(f, "e.test", 4, 140, &err);
	cr_assert_eq(err, -ENOSPC, "a's cooldown counts from its unpin");
	cr_assert_str_eq(addr_of(f, "e.test", 4, 160, NULL), "198.19.0.1");
	struct fakeip_stats st;
	fakeip_get_stats(f, &st);
	cr_assert_eq(st.exhausted, 3);
	cr_assert_eq(st.pinned, 0);
	fakeip_free(f);
}

Test(fakeip, max_mappings_bounds_a_large_range)
{
	struct fakeip *f = pool(NULL, "fd00:7f:8000::/65", 3, 0);
	char names[5][32];

	for (int i = 0; i < 5; i++) {
		snprintf(names[i], sizeof(names[i]), "n%d.test", i);
		cr_assert_neq(addr_of(f, names[i], 6, i, NULL)[0], 0);
	}
	struct fakeip_stats st;
	fakeip_get_stats(f, &st);
	cr_assert_eq(st.mappings, 3, "never more than max_mappings");
	cr_assert_eq(st.reused, 2);
	fakeip_free(f);
}

/* max_mappings bounds both families together, so a full pool reuses the least recently used
 * free mapping of either: AAAA for a new name is answered while IPv4 holds every mapping. */
Test(fakeip, a_full_pool_reuses_a_mapping_of_the_other_family)
{
	struct fakeip *f = pool("198.18.0.0/16", "fd00:7f::/64", 4, 10);
	char names[4][32], buf[256];
	int err;

	for (int i = 0; i < 4; i++) {
		snprintf(names[i], sizeof(names[i]), "v4-%d.test", i);
		cr_assert_neq(addr_of(f, names[i], 4, i, NULL)[0], 0);
	}
	/* Within the cooldown nothing may go. */
	cr_assert_str_eq(addr_of(f, "six.test", 6, 5, &err), "");
	cr_assert_eq(err, -ENOSPC);
	/* Cooled: the oldest IPv4 mapping gives its slot; the name gets a fresh IPv6 address. */
	const char *a6 = addr_of(f, "six.test", 6, 20, &err);
	cr_assert_eq(err, 0);
	cr_assert_str_eq(a6, "fd00:7f::1");
	/* The family's own cooled mapping goes first: v4-1 (used at 1), keeping its address. */
	cr_assert_str_eq(addr_of(f, "v4-new.test", 4, 40, &err), "198.18.0.2");
	struct fakeip_stats st;
	fakeip_get_stats(f, &st);
	cr_assert_eq(st.mappings, 4);
	cr_assert_eq(st.reused, 2);
	cr_assert_eq(st.exhausted, 1);
	cr_assert_gt(name_of(f, "fd00:7f::1", buf), 0);
	cr_assert_str_eq(buf, "six.test");
	cr_assert_eq(name_of(f, "198.18.0.1", buf), 0, "v4-0's mapping is gone");
	cr_assert_gt(name_of(f, "198.18.0.2", buf), 0);
	cr_assert_str_eq(buf, "v4-new.test");
	cr_assert_gt(name_of(f, "198.18.0.3", buf), 0);
	cr_assert_str_eq(buf, "v4-2.test");
	fakeip_free(f);
}

static int to_buf(void *arg, const char *line, size_t len)
{
	char *buf = arg;
	strncat(buf, line, len);
	return 0;
}

Test(fakeip, persistence_round_trip)
{
	struct fakeip *f = pool("198.19.0.0/16", "fd00:7f:8000::/65", 100, 0), *g;
	char text[4096] = "", buf[254];
	struct fakeip_load_stats st = { 0 };

	addr_of(f, "a.test", 4, 0, NULL);
	addr_of(f, "b.test", 4, 0, NULL);
	addr_of(f, "a.test", 6, 0, NULL);
	cr_assert_eq(fakeip_dump(f, to_buf, text), 0);
	strcat(text, "garbage\n198.18.0.7 outside.test\n198.19.9.9 bad name\n198.19.0.1 dup.test\n");
	g = pool("198.19.0.0/16", "fd00:7f:8000::/65", 100, 0);
	fakeip_load(g, text, strlen(text), 10, &st);
	cr_assert_eq(st.loaded, 3);
	cr_assert_eq(st.outside, 1);
	cr_assert_eq(st.bad, 2);
	cr_assert_eq(st.duplicates, 1);
	cr_assert_eq(name_of(g, "198.19.0.2", buf), 6);
	cr_assert_str_eq(buf, "b.test");
	cr_assert_eq(name_of(g, "fd00:7f:8000::1", buf), 6);
	/* New names after a load skip the loaded addresses. */
	cr_assert_str_eq(addr_of(g, "c.test", 4, 11, NULL), "198.19.0.3");
	cr_assert_str_eq(addr_of(g, "a.test", 4, 11, NULL), "198.19.0.1", "the loaded mapping");
	fakeip_free(f);
	fakeip_free(g);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

#define NOMEM_NAMES 280 /* past the first 256 slots: the table grows once */

struct text {
	char p[NOMEM_NAMES * 64];
	size_t len;
	int lines;
};

static int to_text(void *arg, const char *line, size_t len)
{
	struct text *t = arg;

	cr_assert_lt(t->len + len, sizeof(t->p));
	memcpy(t->p + t->len, line, len);
	t->len += len;
	t->lines++;
	return 0;
}

/* A pool's life and its persistence: names of both families mapped (each mapped, stable and
 * reversible, or refused with -ENOMEM and nothing counted as exhausted), one pinned, the
 * mappings dumped and loaded into a new pool (each line loaded or counted as refused for
 * memory: none past max_mappings, none lost uncounted), and each loaded one gives its name
 * back. */
static void nomem_scenario(void *arg, bool sweep)
{
	static struct text t;
	struct fakeip_config c = { .max_mappings = 300 };
	struct fakeip_load_stats ls = { 0 };
	struct fakeip_stats st;
	struct fakeip *f = NULL, *g = NULL;
	char name[32], buf[254];
	int rc, mapped = 0;

	cr_assert_eq(netaddr_parse_cidr("198.19.0.0/16", &c.range4), 0);
	cr_assert_eq(netaddr_parse_cidr("fd00:7f:8000::/65", &c.range6), 0);
	if ((rc = fakeip_new(&c, &f)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "fakeip_new: %d", rc);
		return;
	}
	for (int i = 0; i < NOMEM_NAMES; i++) {
		struct netaddr a = { .family = (uint8_t)(i % 3 ? 4 : 6) };

		snprintf(name, sizeof(name), "n%d.test", i);
		rc = fakeip_address(f, name, strlen(name), a.family, i, a.a);
		if (rc != 0) {
			cr_assert(sweep && rc == -ENOMEM, "%s: %d", name, rc);
			continue;
		}
		mapped++;
		cr_assert_eq(fakeip_name(f, a.family, a.a, i, buf, sizeof(buf)),
			     (int)strlen(name), "%s", name);
		cr_assert_str_eq(buf, name);
		if (i == 7)
			fakeip_pin(f, a.family, a.a);
	}
	fakeip_get_stats(f, &st);
	cr_assert_eq(st.mappings, (uint64_t)mapped);
	cr_assert_eq(st.created, (uint64_t)mapped);
	cr_assert_eq(st.exhausted, 0, "a refused allocation is not an exhausted pool");
	cr_assert_eq(st.reused, 0, "nothing recycled below max_mappings");
	cr_assert(sweep || mapped == NOMEM_NAMES);
	t.len = 0;
	t.lines = 0;
	cr_assert_eq(fakeip_dump(f, to_text, &t), 0);
	cr_assert_eq(t.lines, mapped);
	fakeip_free(f);
	if ((rc = fakeip_new(&c, &g)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "fakeip_new: %d", rc);
		return;
	}
	fakeip_load(g, t.p, t.len, 1000, &ls);
	cr_assert_eq(ls.bad + ls.outside + ls.duplicates + ls.full, 0);
	cr_assert_eq(ls.loaded + ls.no_memory, (uint64_t)mapped, "a line neither loaded nor counted");
	cr_assert(sweep || ls.no_memory == 0);
	for (const char *p = t.p, *nl; p < t.p + t.len; p = nl + 1) {
		char atext[NETADDR_STRLEN + 1];
		const char *sp = memchr(p, ' ', (size_t)(t.p + t.len - p));
		uint8_t a[16];
		int family, n;

		nl = memchr(p, '\n', (size_t)(t.p + t.len - p));
		cr_assert(sp && nl && sp < nl);
		snprintf(atext, sizeof(atext), "%.*s", (int)(sp - p), p);
		family = tu_addr(a, atext);
		n = fakeip_name(g, family, a, 1000, buf, sizeof(buf));
		if (n == 0) {
			cr_assert(ls.no_memory > 0, "%.*s lost", (int)(nl - p), p);
			continue;
		}
		cr_assert_eq(n, (int)(nl - sp - 1));
		cr_assert_eq(memcmp(buf, sp + 1, (size_t)n), 0);
	}
	fakeip_get_stats(g, &st);
	cr_assert_eq(st.mappings, ls.loaded);
	fakeip_free(g);
}

Test(fakeip, each_allocation_refused_in_turn)
{
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, NULL, 5,
								      2000));
}
