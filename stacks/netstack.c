/* netstack.c — the table of stacks this build has. */
#include "stacks/netstack.h"

#include <string.h>

#include "stacks/common/rewrite.h"
#include "stacks/lwip/lwip_stack.h"
#include "stacks/system/sys_stack.h"

/* An answer a stack builds in the place of the packet it answers (rewrite_icmp_unreach) fits
 * every buffer the driver hands a stack's input. */
_Static_assert(REWRITE_ANSWER_ROOM <= DRIVER_INPUT_ROOM, "answers fit the driver's buffers");

static const struct netstack_ops *const stacks[] = {
	&sys_stack_ops,
	&lwip_stack_ops,
};

const struct netstack_ops *netstack_lookup(const char *name)
{
	for (size_t i = 0; i < sizeof(stacks) / sizeof(stacks[0]); i++)
		if (strcmp(stacks[i]->name, name) == 0)
			return stacks[i];
	return NULL;
}

/* The same names as a constant table, for callers that want them without a lookup (the
 * library's ts_stack_names); test_api checks it against stacks[]. */
static const char *const names[] = { "system", "lwip", NULL };

const char *const *netstack_names(void)
{
	return names;
}

const struct netstack_ops *netstack_at(size_t i)
{
	return i < sizeof(stacks) / sizeof(stacks[0]) ? stacks[i] : NULL;
}

void netstack_parse_drops(const ctr_t drops[PKT_REASON_MAX], struct netstack_stats *o)
{
	uint64_t all = 0;

	for (int r = 1; r < PKT_REASON_MAX; r++)
		all += ctr_get(&drops[r]);
	o->drops_fragment = ctr_get(&drops[PKT_V4_FRAGMENT]) + ctr_get(&drops[PKT_V6_FRAGMENT]);
	o->drops_esp = ctr_get(&drops[PKT_V6_ESP]);
	o->drops_malformed = all - o->drops_fragment - o->drops_esp;
}

void netstack_policy_drops(const struct l3policy_counters *c, struct netstack_stats *o)
{
	o->drops_malformed += ctr_get(&c->drop_family) + ctr_get(&c->drop_special_source);
	o->drops_icmp += ctr_get(&c->drop_icmp);
	o->drops_own_address += ctr_get(&c->drop_own_address) + ctr_get(&c->drop_nat_address) +
				ctr_get(&c->drop_from_nat_address);
	o->drops_loop += ctr_get(&c->drop_loop);
	o->drops_special_destination += ctr_get(&c->drop_special_destination);
	o->drops_protocol += ctr_get(&c->drop_proto);
}
