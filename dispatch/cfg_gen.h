/* cfg_gen.h — configuration generations: which configuration each live session was created
 * under, and when a replaced configuration may be released.
 *
 * A reload hands a module (the dispatcher, the UDP path) a whole new struct ts_config. New
 * sessions take the newest one; a live session keeps the one it was created with (its outbound
 * pointers and indices point into that configuration), so a replaced configuration must stay
 * alive until the last session created under it has ended. Each configuration gets a small
 * record with a count of its live sessions:
 *
 *   cfg_gens_hold ──> refs++ of the current record (the session stores the pointer)
 *   cfg_gen_put   ──> refs--; a replaced record reaching 0 releases its configuration
 *   cfg_gens_set  ──> the current record is replaced: released at once if no session holds it,
 *                     else kept on the retired list until its last cfg_gen_put
 *
 * Release rule: every configuration replaced by cfg_gens_set is passed to that call's release
 * exactly once, when no session holds it any more (possibly inside cfg_gens_set, or inside
 * cfg_gens_fini). The configuration current at cfg_gens_fini is never released: its owner
 * frees it, as it would without any reload.
 *
 * Out of memory for a new record (only needed while sessions hold the current one): the new
 * configuration waits, new sessions keep the previous one, and every cfg_gens_hold retries;
 * a later cfg_gens_set replaces the waiting configuration (released at once, no session ever
 * held it). cfg_gens_fini applies a waiting configuration (no record needed once no session
 * is left), so the release rule holds in every case.
 *
 * Single-threaded: one owner's loop thread; no locking. release must not call back into the
 * owner (it typically frees the configuration).
 */
#ifndef TS_DISPATCH_CFG_GEN_H
#define TS_DISPATCH_CFG_GEN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "core/config.h"

typedef void (*cfg_release_fn)(void *arg, const struct ts_config *old);

/* One configuration and the sessions created under it. Sessions read cfg; the rest is the
 * owner's bookkeeping. */
struct cfg_gen {
	const struct ts_config *cfg;
	uint64_t refs;               /* live sessions holding this record */
	bool retired;                /* replaced: on the retired list, released at refs 0 */
	cfg_release_fn release;      /* retired only: the replacing call's release and arg */
	void *release_arg;
	LIST_ENTRY(cfg_gen) link;    /* retired list */
};

/* Embedded in its owner (cfg_gens_init / cfg_gens_fini). */
struct cfg_gens {
	struct cfg_gen *cur;         /* new sessions hold this one */
	LIST_HEAD(, cfg_gen) retired;
	/* A configuration waiting for a record (out of memory at cfg_gens_set); NULL: none. */
	const struct ts_config *want;
	cfg_release_fn want_release; /* for cur's configuration once want replaces it */
	void *want_arg;
	uint64_t releases;           /* configurations released so far */
};

/* The first generation, for cfg (borrowed; never released unless replaced). 0 or -ENOMEM. */
int cfg_gens_init(struct cfg_gens *gs, const struct ts_config *cfg)
	__attribute__((warn_unused_result));

/* After every session has put its record: release what was replaced (still held ones too, so
 * the release rule holds even if a session leaked) and free the records. Idempotent. */
void cfg_gens_fini(struct cfg_gens *gs);

/* New sessions use cfg from now on (cfg must not be the current configuration). The replaced
 * one is passed to release(arg, old) once no session holds it (release NULL: nothing to call). */
void cfg_gens_set(struct cfg_gens *gs, const struct ts_config *cfg, cfg_release_fn release,
		  void *arg);

/* The record a new session holds (refs + 1); pair with cfg_gen_put. Never fails. */
struct cfg_gen *cfg_gens_hold(struct cfg_gens *gs);

/* The configuration a new session would get now (no hold). */
const struct ts_config *cfg_gens_current(struct cfg_gens *gs);

/* A session holding g has ended: refs - 1; a retired record at 0 releases its configuration. */
void cfg_gen_put(struct cfg_gens *gs, struct cfg_gen *g);

#endif
