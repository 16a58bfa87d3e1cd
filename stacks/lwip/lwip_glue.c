/* lwip_glue.c — what lwIP asks of its platform: memory (routed to the twinstack budget), time,
 * and the timer hooks of LWIP_TIMERS_CUSTOM.
 *
 * lwIP keeps process-global state, so the budget it charges is process-global too: set once by
 * the lwIP stack at start (ts_lwip_set_budget) and cleared at free. Each block records the
 * budget it was charged to, so a block freed after a restart is released to the right one. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lwip/opt.h"
#include "lwip/sys.h"
#include "lwip/timeouts.h"

#include "core/budget.h"
#include "core/clock.h"
#include "stacks/lwip/lwip_stack.h"

struct blk {
	uint64_t size;
	struct budget *budget;
};

static struct budget *lwip_budget;         /* lwIP is global: so is its budget */
static _Atomic uint64_t lwip_bytes;        /* bytes lwIP holds now */

void ts_lwip_set_budget(struct budget *b)
{
	lwip_budget = b;
}

uint64_t ts_lwip_mem_bytes(void)
{
	return atomic_load_explicit(&lwip_bytes, memory_order_relaxed);
}

void *ts_lwip_malloc(size_t size)
{
	struct blk *h;

	if (lwip_budget && budget_bytes_reserve(lwip_budget, size) != 0)
		return NULL; /* lwIP handles a failed allocation: drops, smaller windows, ERR_MEM */
	h = malloc(sizeof(*h) + size);
	if (!h) {
		if (lwip_budget)
			budget_bytes_release(lwip_budget, size);
		return NULL;
	}
	h->size = size;
	h->budget = lwip_budget;
	atomic_fetch_add_explicit(&lwip_bytes, size, memory_order_relaxed);
	return h + 1;
}

void *ts_lwip_calloc(size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size)
		return NULL;
	void *p = ts_lwip_malloc(n * size);
	if (p)
		memset(p, 0, n * size);
	return p;
}

void ts_lwip_free(void *p)
{
	struct blk *h;

	if (!p)
		return;
	h = (struct blk *)p - 1;
	atomic_fetch_sub_explicit(&lwip_bytes, h->size, memory_order_relaxed);
	if (h->budget)
		budget_bytes_release(h->budget, h->size);
	free(h);
}

u32_t sys_now(void)
{
	return (u32_t)(ts_now_ns() / TS_NS_PER_MS);
}

/* LWIP_TIMERS_CUSTOM: lwIP's own timer list does not exist; the stack runs tcp_tmr itself,
 * only while pcbs exist (stacks/lwip/lwip_stack.c). */
void sys_timeouts_init(void)
{
}
