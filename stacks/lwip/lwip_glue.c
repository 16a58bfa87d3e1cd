/* lwip_glue.c — what lwIP asks of its platform: memory (routed to the twinstack budget), time,
 * the timer hooks of LWIP_TIMERS_CUSTOM, and the claim that makes one lwIP stack the owner of
 * lwIP in this process.
 *
 * This file holds all of twinstack's process-global lwIP state, and only what lwIP forces.
 * lwIP's core is process-global: its pcb lists, its one netif (LWIP_SINGLE_NETIF) and its tick
 * counters are statics inside lwIP, and the platform functions it calls here (mem_clib_malloc/
 * free, sys_now) take no context argument. Everything that does get a context
 * (netif output and input hooks: netif->state; pcb callbacks: tcp_arg) finds its stack through
 * it, in stacks/lwip/lwip_stack.c. Each block records the budget it was charged to, so a block
 * freed after the claim moved on is released to the right one. */
#include "stacks/lwip/lwip_glue.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lwip/init.h"
#include "lwip/opt.h"
#include "lwip/sys.h"
#include "lwip/timeouts.h"

#include "core/budget.h"
#include "core/clock.h"

struct blk {
	uint64_t size;
	struct budget *budget;
};

/* Set while an lwIP stack owns lwIP (lwip_glue_claim .. lwip_glue_release): lwIP's pcb lists and
 * netif cannot serve two stacks. Atomic, so two proxies starting on two threads cannot both
 * win. */
static atomic_bool lwip_claimed;
/* lwip_init ran. lwIP has no de-init, and lwip_init is not idempotent in general (with a
 * loopback netif configured it would add that netif twice): it runs at the first claim only;
 * each owner leaves lwIP with no pcb and no netif at release, so the next one starts clean. */
static bool lwip_initialised;
/* The owner's budget: mem_clib_malloc (ts_lwip_malloc) gets no context to find it through. */
static struct budget *lwip_budget;
/* Bytes lwIP holds now, for the same reason: counted in the context-free allocator. */
static _Atomic uint64_t lwip_bytes;

int lwip_glue_claim(struct budget *b)
{
	if (atomic_exchange_explicit(&lwip_claimed, true, memory_order_acquire))
		return -EBUSY;
	lwip_budget = b;
	if (!lwip_initialised) {
		lwip_init();
		lwip_initialised = true;
	}
	return 0;
}

void lwip_glue_release(void)
{
	lwip_budget = NULL;
	atomic_store_explicit(&lwip_claimed, false, memory_order_release);
}

bool lwip_glue_claimed(void)
{
	return atomic_load_explicit(&lwip_claimed, memory_order_acquire);
}

uint64_t lwip_glue_mem_bytes(void)
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
