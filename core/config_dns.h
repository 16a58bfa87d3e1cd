/* config_dns.h — the "dns" section's parser (internal to the config module) and the lookups
 * the resolver needs from it.
 */
#ifndef TS_CORE_CONFIG_DNS_H
#define TS_CORE_CONFIG_DNS_H

#include <stddef.h>

#include "core/config.h"
#include "core/config_parse.h"

/* The "dns" object into target's dns (target: the struct ts_config). */
int config_dns_parse(struct cfgp *p, const cJSON *item, void *target);

/* After outbounds and route are resolved: tags to indices, detours checked. 0 or -EINVAL. */
int config_dns_validate(struct cfgp *p, struct ts_config *cfg);
void config_dns_fini(struct ts_dns *d);

/* The key a server's address came from, for messages: "address_ip" for https:// with a host
 * name, else "address". */
const char *config_dns_addr_key(const struct ts_dns_server *sv);

/* The dns.hosts entry for name (len bytes, any case, no trailing dot), or NULL. */
const struct ts_dns_host *config_dns_host(const struct ts_dns *d, const char *name, size_t len);

#endif
