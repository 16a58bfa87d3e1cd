/* cfg_gen.c — configuration generations: live-session counts per configuration and the one
 * release of each replaced configuration. Contracts: cfg_gen.h. */
#include "dispatch/cfg_gen.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

static void release_cfg(struct cfg_gens *gs, cfg_release_fn release, void *arg,
			const struct ts_config *old)
{
	gs->releases++;
	if (release)
		release(arg, old);
}

int cfg_gens_init(struct cfg_gens *gs, const struct ts_config *cfg)
{
	*gs = (struct cfg_gens){ 0 };
	LIST_INIT(&gs->retired);
	gs->cur = calloc(1, sizeof(*gs->cur));
	if (!gs->cur)
		return -ENOMEM;
	gs->cur->cfg = cfg;
	return 0;
}

/* Install the waiting configuration. Without a holder the current record is reused (no
 * allocation, so this cannot fail then); else the current record retires. */
static void apply_want(struct cfg_gens *gs)
{
	struct cfg_gen *cur = gs->cur, *g;
	const struct ts_config *old = cur->cfg;

	if (cur->refs == 0) {
		cur->cfg = gs->want;
		gs->want = NULL;
		release_cfg(gs, gs->want_release, gs->want_arg, old);
		return;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return; /* retried by the next hold; new sessions keep the current one meanwhile */
	g->cfg = gs->want;
	gs->want = NULL;
	cur->retired = true;
	cur->release = gs->want_release;
	cur->release_arg = gs->want_arg;
	LIST_INSERT_HEAD(&gs->retired, cur, link);
	gs->cur = g;
}

void cfg_gens_set(struct cfg_gens *gs, const struct ts_config *cfg, cfg_release_fn release,
		  void *arg)
{
	assert(cfg && gs->cur && cfg != gs->cur->cfg && cfg != gs->want);
	if (gs->want) {
		/* The waiting one never served a session: this call replaces it, at once. The
		 * current one keeps the release of the call that replaced it. */
		const struct ts_config *never = gs->want;
		gs->want = cfg;
		release_cfg(gs, release, arg, never);
	} else {
		gs->want = cfg;
		gs->want_release = release;
		gs->want_arg = arg;
	}
	apply_want(gs);
}

struct cfg_gen *cfg_gens_hold(struct cfg_gens *gs)
{
	if (gs->want)
		apply_want(gs);
	gs->cur->refs++;
	return gs->cur;
}

const struct ts_config *cfg_gens_current(struct cfg_gens *gs)
{
	if (gs->want)
		apply_want(gs);
	return gs->cur->cfg;
}

void cfg_gen_put(struct cfg_gens *gs, struct cfg_gen *g)
{
	assert(g->refs > 0);
	if (--g->refs > 0 || !g->retired)
		return;
	LIST_REMOVE(g, link);
	release_cfg(gs, g->release, g->release_arg, g->cfg);
	free(g);
}

void cfg_gens_fini(struct cfg_gens *gs)
{
	struct cfg_gen *g;

	while ((g = LIST_FIRST(&gs->retired)) != NULL) {
		LIST_REMOVE(g, link);
		release_cfg(gs, g->release, g->release_arg, g->cfg);
		free(g);
	}
	if (gs->cur) {
		gs->cur->refs = 0;
		if (gs->want)
			apply_want(gs); /* reuses the record: cannot fail without holders */
		free(gs->cur);
		gs->cur = NULL;
	}
}
