/* test_cfg_gen.c — dispatch/cfg_gen: live-session counts per configuration and the one release
 * of each replaced configuration, against the release rule in cfg_gen.h. The configurations
 * are never read here, so empty ones stand in. The dispatcher and UDP tests cover the same
 * rule end to end with real sessions. */
#include <criterion/criterion.h>

#include "dispatch/cfg_gen.h"

struct rlog {
	const struct ts_config *released[8];
	void *args[8];
	int n;
};

static void rel(void *arg, const struct ts_config *old)
{
	struct rlog *l = *(struct rlog **)arg;

	cr_assert_lt(l->n, 8);
	l->released[l->n] = old;
	l->args[l->n] = arg;
	l->n++;
}

Test(cfg_gen, unheld_config_goes_inside_set)
{
	static struct ts_config a, b, c;
	struct cfg_gens gs;
	struct rlog l = { 0 };
	struct rlog *arg1 = &l, *arg2 = &l;

	cr_assert_eq(cfg_gens_init(&gs, &a), 0);
	cr_assert_eq(cfg_gens_current(&gs), &a);
	cfg_gens_set(&gs, &b, rel, &arg1);
	cr_assert_eq(l.n, 1);
	cr_assert_eq(l.released[0], &a);
	cr_assert_eq(l.args[0], &arg1, "the replacing call's arg");
	cfg_gens_set(&gs, &c, rel, &arg2);
	cr_assert_eq(l.n, 2);
	cr_assert_eq(l.released[1], &b);
	cr_assert_eq(l.args[1], &arg2);
	cr_assert_eq(cfg_gens_current(&gs), &c);
	cfg_gens_fini(&gs);
	cr_assert_eq(l.n, 2, "the current configuration is never released");
	cfg_gens_fini(&gs); /* idempotent */
	cr_assert_eq(gs.releases, 2);
}

Test(cfg_gen, held_configs_go_with_their_last_holder_in_any_order)
{
	static struct ts_config a, b, c;
	struct cfg_gens gs;
	struct rlog l = { 0 };
	struct rlog *arg1 = &l, *arg2 = &l;
	struct cfg_gen *a1, *a2, *b1, *c1;

	cr_assert_eq(cfg_gens_init(&gs, &a), 0);
	a1 = cfg_gens_hold(&gs);
	a2 = cfg_gens_hold(&gs);
	cr_assert_eq(a1, a2);
	cr_assert_eq(a1->cfg, &a);
	cfg_gens_set(&gs, &b, rel, &arg1);
	b1 = cfg_gens_hold(&gs);
	cr_assert_eq(b1->cfg, &b);
	cfg_gens_set(&gs, &c, rel, &arg2);
	c1 = cfg_gens_hold(&gs);
	cr_assert_eq(c1->cfg, &c);
	cr_assert_eq(l.n, 0, "everything is held");
	cr_assert_eq(a1->cfg, &a, "a holder's configuration never changes");

	cfg_gen_put(&gs, b1); /* the newer retired one first */
	cr_assert_eq(l.n, 1);
	cr_assert_eq(l.released[0], &b);
	cr_assert_eq(l.args[0], &arg2, "B was replaced by the second call");
	cfg_gen_put(&gs, a1);
	cr_assert_eq(l.n, 1, "A still has a holder");
	cfg_gen_put(&gs, a2);
	cr_assert_eq(l.n, 2);
	cr_assert_eq(l.released[1], &a);
	cr_assert_eq(l.args[1], &arg1);
	cfg_gen_put(&gs, c1);
	cr_assert_eq(l.n, 2, "the current one stays");
	cfg_gens_fini(&gs);
	cr_assert_eq(l.n, 2);
}

Test(cfg_gen, fini_releases_what_is_still_held)
{
	static struct ts_config a, b;
	struct cfg_gens gs;
	struct rlog l = { 0 };
	struct rlog *arg = &l;

	cr_assert_eq(cfg_gens_init(&gs, &a), 0);
	(void)cfg_gens_hold(&gs); /* a holder that never puts (its owner ended it without) */
	cfg_gens_set(&gs, &b, rel, &arg);
	cr_assert_eq(l.n, 0);
	cfg_gens_fini(&gs);
	cr_assert_eq(l.n, 1);
	cr_assert_eq(l.released[0], &a);
}
