/* fuzz_config.c — libFuzzer target for the config parser (core/config.c, core/config_parse.c).
 *
 * The input is a config file's bytes. Whatever they are, loading must not crash, leak or read
 * out of bounds; it returns 0 (then the views must work on the result) or -EINVAL with a
 * one-line "config: " message.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "stacks/system/sys_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ts_config cfg;
	struct nat_config nc;
	char err[TS_ERRLEN], summary[512];
	int ret;

	if (size > 64 * 1024)
		return 0;
	ret = config_load_buffer((const char *)data, size, &cfg, err, sizeof(err));
	if (ret == 0) {
		config_summary(&cfg, summary, sizeof(summary));
		sys_config_to_nat(&cfg, &nc);
		/* Invariants of a loaded config. */
		if (cfg.n_outbounds == 0 || cfg.route.final >= cfg.n_outbounds ||
		    cfg.roles4.family != 4 || cfg.nat.addresses != cfg.roles4.n_nat)
			abort();
		for (size_t i = 0; i < cfg.route.n_rules; i++)
			if (cfg.route.rules[i].outbound >= cfg.n_outbounds)
				abort();
	} else {
		if (ret != -EINVAL && ret != -ENOMEM)
			abort();
		if (strncmp(err, "config: ", 8) != 0 || strchr(err, '\n'))
			abort();
	}
	config_fini(&cfg);
	return 0;
}
