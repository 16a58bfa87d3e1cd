/* sys_config.h — the system stack's views of the parsed config: the NAT table's config and the
 * send buffer of the sockets the stack accepts.
 *
 * They live here, not in core/config.c, because they speak the system stack's types and
 * policies (struct nat_config, the per-queue send-buffer default); core/ depends on no stack.
 */
#ifndef TS_STACKS_SYSTEM_SYS_CONFIG_H
#define TS_STACKS_SYSTEM_SYS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "core/config.h"
#include "stacks/system/nat.h"

/* The NAT table's config: nat_config_default() overridden by nat.* and budgets.nat_entries. */
void sys_config_to_nat(const struct ts_config *cfg, struct nat_config *out);

/* The SO_SNDBUF the system stack gives its listeners: nat.accepted_sndbuf, or when absent,
 * with offload I/O 384 KiB for one TUN queue and 1 MiB for more, and with per-packet I/O 0
 * (measured, docs/config.md). 0: the kernel's autotuning. */
uint32_t sys_config_accepted_sndbuf(const struct ts_config *cfg, bool offload);

/* The NAT table's hash key (nat_config.seed): 64 bits from getrandom(GRND_NONBLOCK), so that
 * clients, who choose the keyed values (addresses, ports), cannot aim at one hash chain. When
 * the kernel's pool is not initialized yet, a mix of now_ns and salt (an address: ASLR). */
uint64_t sys_config_nat_seed(int64_t now_ns, uintptr_t salt);

#endif
