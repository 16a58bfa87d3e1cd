/* route.c — first-match rule evaluation. Runs once per session (TCP) or per UDP destination
 * change, never per packet, so a linear scan over the rules is fine; a rule's name matcher is
 * one domain_set lookup for its own names plus one per rule set it names. */
#include "dispatch/route.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

static bool cidr_match(const struct netaddr_cidr *c, const struct flow_key *k)
{
	struct netaddr a;

	if (c->addr.family != k->family)
		return false;
	a.family = k->family;
	memcpy(a.a, k->dst, 16);
	return netaddr_in_cidr(&a, c);
}

/* Every matcher of r but the name matcher. */
static bool match_addr(const struct ts_rule *r, const struct flow_key *k)
{
	if (r->network == TS_NET_TCP && k->proto != IPPROTO_TCP)
		return false;
	if (r->network == TS_NET_UDP && k->proto != IPPROTO_UDP)
		return false;
	if (r->n_ports) {
		uint16_t port = ntohs(k->dport_be);
		size_t i;
		for (i = 0; i < r->n_ports; i++)
			if (port >= r->ports[i].lo && port <= r->ports[i].hi)
				break;
		if (i == r->n_ports)
			return false;
	}
	if (r->n_cidrs) {
		size_t i;
		for (i = 0; i < r->n_cidrs; i++)
			if (cidr_match(&r->cidrs[i], k))
				break;
		if (i == r->n_cidrs)
			return false;
	}
	return true;
}

bool route_rule_match(const struct ts_route *route, const struct ts_rule *r,
		      const struct flow_key *k, const char *name)
{
	if (!match_addr(r, k))
		return false;
	if (!config_names_empty(&r->names) &&
	    (!name || !config_names_match(route->rule_sets, &r->names, name, strlen(name))))
		return false;
	return true;
}

uint32_t route_select(const struct ts_route *route, const struct flow_key *k, const char *name)
{
	for (size_t i = 0; i < route->n_rules; i++)
		if (route_rule_match(route, &route->rules[i], k, name))
			return route->rules[i].outbound;
	return route->final;
}

bool route_name_matters(const struct ts_route *route, const struct flow_key *k)
{
	uint32_t by_addr;

	if (!route->has_names)
		return false;
	by_addr = route_select(route, k, NULL);
	for (size_t i = 0; i < route->n_rules; i++) {
		const struct ts_rule *r = &route->rules[i];

		if (!match_addr(r, k))
			continue;
		if (config_names_empty(&r->names))
			return false; /* matches whatever the name: the route is decided */
		if (r->outbound != by_addr)
			return true;  /* a name it matches would go elsewhere */
	}
	return false;
}
