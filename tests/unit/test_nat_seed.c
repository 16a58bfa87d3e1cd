/* test_nat_seed.c — the NAT table's hash key is not predictable from the start time: the table
 * is keyed on client-chosen values (addresses and ports), so a guessable key would let a client
 * aim its flows at one hash chain. */
#include <criterion/criterion.h>

#include <stdint.h>

#include "stacks/system/nat.h"
#include "stacks/system/sys_config.h"
#include "testutil.h"

/* Two tables started at the same instant (same clock reading, same salt) get different keys. */
Test(nat_seed, same_instant_different_seeds)
{
	int64_t now = SEC(12345);
	uint64_t a = sys_config_nat_seed(now, 0x1000), b = sys_config_nat_seed(now, 0x1000);
	struct nat_config c;
	struct nat_table *t1 = NULL, *t2 = NULL;

	cr_expect_neq(a, b, "seed %#llx twice", (unsigned long long)a);
	cr_expect_neq(a, (uint64_t)now, "the seed is not the clock");
	cr_expect_neq(b, (uint64_t)now);
	nat_config_default(&c);
	c.seed = a;
	cr_assert_eq(nat_table_new(&c, &t1), 0);
	c.seed = b;
	cr_assert_eq(nat_table_new(&c, &t2), 0);
	nat_table_free(t1);
	nat_table_free(t2);
}
