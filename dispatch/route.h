/* route.h — choose an outbound for a flow from the configured rules (first match wins). */
#ifndef TS_DISPATCH_ROUTE_H
#define TS_DISPATCH_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/config.h"
#include "core/flow.h"

/* Does rule r (one of route's) match the flow's destination (address, port), protocol and
 * name? A rule matches when every matcher it has matches: any of its CIDRs, any of its port
 * ranges, its network, its name matcher (its own names or any of its rule sets; name NULL: a
 * rule with a name matcher does not match). */
bool route_rule_match(const struct ts_route *route, const struct ts_rule *r,
		      const struct flow_key *k, const char *name);

/* The outbound index (into cfg->outbounds) for k and the destination's name (NULL: none): the
 * first matching rule's, else final. */
uint32_t route_select(const struct ts_route *route, const struct flow_key *k, const char *name);

/* Could a name change route_select's answer for k? True when, in rule order, a rule with a
 * name matcher whose other matchers (network, ports, CIDRs) match k, and whose outbound is not
 * the one k gets without a name, comes before the first rule without a name matcher that
 * matches k. False decides the route from the address alone: such a flow has nothing to gain
 * from sniffing (a port no domain rule covers, name rules that lead where the address does,
 * rules without any name matcher). */
bool route_name_matters(const struct ts_route *route, const struct flow_key *k);

#endif
