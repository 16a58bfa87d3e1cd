/* test_sys_config.c — the system stack's views of a parsed config (stacks/system/sys_config.c):
 * the NAT table's config and the send buffer of the accepted sockets, from real configs
 * loaded through the schema.
 *
 * JSON in this file is written with single quotes ('key') and converted, to stay readable.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "stacks/system/nat.h"
#include "stacks/system/sys_config.h"
#include "testutil.h"

/* Loads sq (single-quoted JSON), which must be valid; the caller fini's cfg. */
static void load_ok(const char *sq, struct ts_config *cfg)
{
	char err[TS_ERRLEN];
	char *json = strdup(sq);
	int ret;

	cr_assert_not_null(json);
	for (char *c = json; *c; c++)
		if (*c == '\'')
			*c = '"';
	ret = config_load_string(json, cfg, err, sizeof(err));
	free(json);
	cr_assert_eq(ret, 0, "%s\n -> %s", sq, err);
}

/* ---- accepted send buffer ------------------------------------------------------------------ */

/* Absent nat.accepted_sndbuf: bounded with offload I/O (larger with more TUN queues), left to
 * the kernel's autotuning per packet. */
Test(sys_config, accepted_sndbuf_default)
{
	struct ts_config cfg;

	load_ok("{}", &cfg);
	cr_assert_eq(cfg.nat.accepted_sndbuf, TS_ACCEPTED_SNDBUF_AUTO);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, true), 393216); /* offload, one queue */
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, false), 0);     /* per-packet: autotuned */
	config_fini(&cfg);
	load_ok("{'tun':{'queues':2}}", &cfg);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, true), 1048576);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, false), 0);
	config_fini(&cfg);
	load_ok("{'tun':{'queues':4}}", &cfg);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, true), 1048576);
	config_fini(&cfg);
}

/* An explicit nat.accepted_sndbuf wins over the per-queue default, at the range's edges too. */
Test(sys_config, accepted_sndbuf_explicit)
{
	struct ts_config cfg;

	load_ok("{'tun':{'queues':2},'nat':{'accepted_sndbuf':65536}}", &cfg);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, true), 65536);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, false), 65536);
	config_fini(&cfg);
	load_ok("{'nat':{'accepted_sndbuf':67108864}}", &cfg);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, true), 67108864);
	config_fini(&cfg);
	load_ok("{'nat':{'accepted_sndbuf':0}}", &cfg);
	cr_assert_eq(sys_config_accepted_sndbuf(&cfg, true), 0, "0: the kernel autotunes");
	config_fini(&cfg);
}

/* ---- the NAT table's config ---------------------------------------------------------------- */

Test(sys_config, to_nat)
{
	struct ts_config cfg;
	struct nat_config nc, def;

	load_ok("{'nat':{'addresses':8,'listeners':3,'linger_ms':1500,'half_open_timeout_ms':2500,"
		"'port_quarantine_ms':0},'budgets':{'nat_entries':1234}}",
		&cfg);
	sys_config_to_nat(&cfg, &nc);
	nat_config_default(&def);
	cr_assert_eq(nc.max_entries, 1234);
	cr_assert_eq(nc.n_addrs, 8);
	cr_assert_eq(nc.n_listeners, 3);
	cr_assert_eq(nc.linger_ns, MS(1500));
	cr_assert_eq(nc.half_open_ns, MS(2500));
	cr_assert_eq(nc.quarantine_ns, 0);
	cr_assert_eq(nc.port_min, def.port_min, "untouched fields keep the NAT defaults");
	cr_assert_eq(nc.port_max, def.port_max);
	cr_assert_eq(nc.seed, def.seed);
	config_fini(&cfg);

	load_ok("{}", &cfg);
	sys_config_to_nat(&cfg, &nc);
	cr_assert_eq(nc.n_addrs, 4);
	cr_assert_eq(nc.n_listeners, 2);
	cr_assert_eq(nc.linger_ns, SEC(10));
	cr_assert_eq(nc.half_open_ns, SEC(30));
	cr_assert_eq(nc.quarantine_ns, SEC(60));
	cr_assert_eq(nc.max_entries, cfg.budget.nat_entries);
	config_fini(&cfg);
}

/* The schema's largest nat.addresses / nat.listeners make a config the NAT table accepts. */
Test(sys_config, schema_bounds_fit_the_table)
{
	struct ts_config cfg;
	struct nat_config nc;
	struct nat_table *t = NULL;

	load_ok("{'nat':{'addresses':64,'listeners':16},'budgets':{'nat_entries':1024}}", &cfg);
	cr_assert_eq(cfg.nat.addresses, TS_NAT_MAX_ADDRS);
	cr_assert_eq(cfg.nat.listeners, TS_NAT_MAX_LISTENERS);
	sys_config_to_nat(&cfg, &nc);
	cr_assert_eq(nat_table_new(&nc, &t), 0);
	nat_table_free(t);
	config_fini(&cfg);
}
