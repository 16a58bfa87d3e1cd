/* sys_config.c — the system stack's views of the parsed config (see sys_config.h). */
#include "stacks/system/sys_config.h"

#include <sys/random.h>
#include <sys/types.h>

/* The schema's bounds (core/config.h) must fit the table's fixed arrays. */
_Static_assert(TS_NAT_MAX_ADDRS <= NAT_MAX_ADDRS, "nat.addresses bound exceeds the NAT table");
_Static_assert(TS_NAT_MAX_LISTENERS <= NAT_MAX_LISTENERS,
	       "nat.listeners bound exceeds the NAT table");

uint32_t sys_config_accepted_sndbuf(const struct ts_config *cfg, bool offload)
{
	if (cfg->nat.accepted_sndbuf != TS_ACCEPTED_SNDBUF_AUTO)
		return cfg->nat.accepted_sndbuf;
	/* Per packet the loop is slow and the TUN hop's round trip long: a bound costs more
	 * than the queue it saves. With more queues a download's packets and its ACKs may be
	 * served by different threads, and one stream needs more in flight to keep up. */
	if (!offload)
		return 0;
	return cfg->tun.queues > 1 ? 1024u << 10 : 384u << 10;
}

void sys_config_to_nat(const struct ts_config *cfg, struct nat_config *out)
{
	nat_config_default(out);
	out->max_entries = cfg->budget.nat_entries;
	out->n_addrs = cfg->nat.addresses;
	out->n_listeners = cfg->nat.listeners;
	out->half_open_ns = (int64_t)cfg->nat.half_open_timeout_ms * 1000000;
	out->linger_ns = (int64_t)cfg->nat.linger_ms * 1000000;
	out->quarantine_ns = (int64_t)cfg->nat.port_quarantine_ms * 1000000;
	/* No config keys of their own: the HALF_OPEN share follows the entry budget. */
	nat_config_half_open_limits(out);
}

uint64_t sys_config_nat_seed(int64_t now_ns, uintptr_t salt)
{
	uint64_t seed, z;

	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t)sizeof(seed))
		return seed;
	/* The kernel's pool is not ready yet (early boot): the clock and an address (ASLR), mixed
	 * (splitmix64's finalizer) so that no input bit shows through. */
	z = (uint64_t)now_ns ^ ((uint64_t)salt * 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}
