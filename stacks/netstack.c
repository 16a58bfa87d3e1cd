/* netstack.c — the table of stacks this build has. */
#include "stacks/netstack.h"

#include <string.h>

#include "stacks/lwip/lwip_stack.h"

extern const struct netstack_ops sys_stack_ops;

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
