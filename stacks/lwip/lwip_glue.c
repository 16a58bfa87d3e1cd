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
 * freed after the claim moved on is released to the right one.
 *
 * Large blocks are kept for reuse. lwIP allocates every input segment it is given a copy of (an
 * offloaded receive under 32 KiB, or any without offload; a larger one stays in the driver's read
 * buffer, whose pool keeps its buffers the same way: core/driver.c), and the segments the relay
 * writes, with mem_malloc and frees them when the bytes are taken or acknowledged. Given
 * straight to glibc, that churn keeps pushing the heap's free top past glibc's trim threshold
 * (128 KiB unless tuned), and every such free hands the pages back (madvise(MADV_DONTNEED) in a
 * thread's arena, with a TLB shootdown across CPUs; brk in the main one) only for the next
 * receive to fault them in again. So blocks of more than 4 KiB are rounded up to a size class
 * (8 to 128 KiB in four steps per doubling, each plus LW_CLASS_SLACK bytes) and, when freed,
 * kept on a per-class free list, up to an eighth of the budget's buffer bytes and never more than
 * LW_CACHE_MAX_BYTES in all (16 uploads with full 256 KiB windows free 4 MiB in a burst when
 * the relay drains them), and only while the budget's pressure tier is normal. Four classes per
 * doubling keep what rounding adds above 8 KiB under a quarter (a download's segments come in
 * every size from 16 to 64 KiB); the slack lets a block of a power of two's worth of data, with
 * its struct pbuf, header room and our header, fit that power's class rather than the next: a
 * 16 KiB write from the relay, a 64 KiB offloaded receive. A block is charged to the budget at
 * its class size (what it occupies); a kept block is not in use and is charged to nothing.
 *
 * The kept blocks follow the sizes in demand now. A block asked for in a class with nothing kept
 * first gives back kept blocks of the other classes, the class holding the most kept bytes
 * first, until as many bytes as the new block's are gone, so glibc can serve it (or the next
 * one) from them instead of growing the heap. Without that, every class would keep its own
 * past peak: a 64-stream download starts with segments of 16 to 32 KiB (its first windows are
 * small) and within a tenth of a second sends 64 KiB ones, and the first ones' blocks stayed
 * kept, unused, beside the blocks in use (docs/benchmarks.md has the peak RSS either way).
 * lwip_glue_trim empties the lists, as the stack does when its last pcb is gone, and
 * lwip_glue_trim_unused does the same while pcbs remain once the lists have gone unused for a
 * while: a download that follows an upload sends segments (small blocks) and receives only ACKs,
 * so the upload's kept receive blocks would otherwise sit idle for as long as any connection
 * stays open.
 *
 * Blocks of 4 KiB and less (an output segment of MSS + headers, its struct tcp_seg, a pure
 * ACK) are left to glibc on purpose. Downloads churn them without trimming: glibc reuses a
 * drained window's chunks for the next one before its top grows, so a free hands pages back
 * rarely, not per window. Keeping them on free lists of fine size classes (16-byte steps, then
 * 16 per doubling) was tried and measured: there was no trimming to remove, and it cost more
 * CPU per byte, the extra time in lwIP's walks of its segment lists, which touch one block per
 * segment (tcp_output walks the unacked queue to its tail on every call,
 * tcp_free_acked_segments walks what an ACK frees). docs/benchmarks.md has the figures. */
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
#include "core/lsan.h"
#include "stacks/lwip/lwip_ackq.h"
#include "stacks/lwip/lwip_bigseg.h"
#include "stacks/lwip/lwip_halfopen.h"

/* 16 bytes, so the block's payload keeps malloc's alignment. */
struct blk {
	uint32_t size; /* bytes charged to budget and to lwip_bytes */
	uint32_t cls;  /* 1 + the size class, 0: not rounded, given back to glibc when freed */
	struct budget *budget;
};

/* Size classes: 8 to 128 KiB in four steps per doubling (8, 10, 12, 14, 16, 20, 24, ... KiB),
 * each plus LW_CLASS_SLACK. */
#define LW_CLASS_MIN_SHIFT 13 /* 8 KiB: smaller blocks are malloc's own business */
#define LW_CLASS_MAX_SHIFT 17 /* 128 KiB: the largest class */
#define LW_CLASS_STEPS 4u     /* classes per doubling */
#define LW_CLASSES (LW_CLASS_STEPS * (LW_CLASS_MAX_SHIFT - LW_CLASS_MIN_SHIFT) + 1)
#define LW_CACHE_MAX_BYTES (8u << 20)
/* Room above each class's size: struct pbuf, lwIP's header room (link, IPv6, TCP) and struct
 * blk come to under 150 bytes, so a power of two's worth of data fits that power's class. */
#define LW_CLASS_SLACK 256u

/* The bytes of a block of size class cls (1-based). */
static uint32_t class_bytes(uint32_t cls)
{
	uint32_t i = cls - 1;
	uint32_t step = (1u << (LW_CLASS_MIN_SHIFT + i / LW_CLASS_STEPS)) / LW_CLASS_STEPS;

	return step * (LW_CLASS_STEPS + i % LW_CLASS_STEPS) + LW_CLASS_SLACK;
}

/* A cached block's payload holds the link. Touched by the owner's thread only (lwIP is called
 * from one thread; see lwip_glue_claim); lwip_cached is also read by stats. */
struct cached {
	struct cached *next;
};
static struct cached *lw_cache[LW_CLASSES];
static uint32_t lw_kept[LW_CLASSES]; /* blocks on each list */
static uint64_t lw_cache_cap; /* set at claim from the owner's budget */
static _Atomic uint64_t lwip_cached;
/* A kept block was handed out since the last lwip_glue_trim_unused call; the calls since one
 * was. */
static bool lw_cache_used;
static unsigned lw_unused_calls;

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
/* Packet bytes in the driver's read buffers lwIP holds: freed through pbuf_free, which gives
 * no context either. */
static _Atomic uint64_t lwip_rx_held;

int lwip_glue_claim(struct budget *b)
{
	if (atomic_exchange_explicit(&lwip_claimed, true, memory_order_acquire))
		return -EBUSY;
	lwip_budget = b;
	lw_cache_cap = b ? budget_get_limits(b)->buffer_bytes / 8 : 0;
	if (lw_cache_cap > LW_CACHE_MAX_BYTES)
		lw_cache_cap = LW_CACHE_MAX_BYTES;
	if (!lwip_initialised) {
		lwip_init();
		lwip_bigseg_init();
		lwip_ackq_init();
		lwip_halfopen_init();
		lwip_initialised = true;
	}
	return 0;
}

void lwip_glue_release(void)
{
	lwip_glue_trim();
	lw_cache_used = false;
	lw_unused_calls = 0;
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

/* The size class of a block of total bytes (header included): 1 + index, or 0 for none. */
static uint32_t size_class(size_t total)
{
	uint32_t t, shift, step, j;

	if (total <= (1u << (LW_CLASS_MIN_SHIFT - 1)) ||
	    total > (1u << LW_CLASS_MAX_SHIFT) + LW_CLASS_SLACK)
		return 0;
	t = (uint32_t)total - LW_CLASS_SLACK;
	if (t <= (1u << LW_CLASS_MIN_SHIFT))
		return 1;
	/* 2^shift < t <= 2^(shift + 1): the class j steps above 2^shift, j in 1..LW_CLASS_STEPS. */
	shift = 31u - (uint32_t)__builtin_clz(t - 1);
	step = (1u << shift) / LW_CLASS_STEPS;
	j = (t - (1u << shift) + step - 1) / step;
	return LW_CLASS_STEPS * (shift - LW_CLASS_MIN_SHIFT) + j + 1;
}

/* Take a kept block of class cls off its list, or NULL. */
static struct blk *cache_take(uint32_t cls)
{
	struct cached *c = lw_cache[cls - 1];

	if (!c)
		return NULL;
	lw_cache[cls - 1] = c->next;
	lw_kept[cls - 1]--;
	atomic_fetch_sub_explicit(&lwip_cached, class_bytes(cls), memory_order_relaxed);
	return (struct blk *)c;
}

/* A kept block of class cls for reuse, or NULL. */
static struct blk *cache_pop(uint32_t cls)
{
	struct blk *h = cache_take(cls);

	if (h)
		lw_cache_used = true;
	return h;
}

/* Class cls has nothing kept and a block of it is about to come from glibc: give glibc kept
 * blocks of the other classes, the class with the most kept bytes first, until at least a
 * block of cls's size has gone back, so glibc can serve the new block from them. */
static void cache_make_room(uint32_t cls)
{
	uint32_t need = class_bytes(cls), freed = 0;

	while (freed < need) {
		uint32_t most = 0;
		uint64_t most_bytes = 0;

		for (uint32_t c = 1; c <= LW_CLASSES; c++) {
			uint64_t bytes = (uint64_t)lw_kept[c - 1] * class_bytes(c);

			if (c != cls && bytes > most_bytes) {
				most = c;
				most_bytes = bytes;
			}
		}
		if (!most)
			return;
		free(cache_take(most));
		freed += class_bytes(most);
	}
}

/* Keep h for reuse if lwIP is owned, the cache has room and the budget is not under pressure;
 * false: the caller frees it. */
static bool cache_push(struct blk *h)
{
	uint32_t idx = h->cls - 1, bytes = class_bytes(h->cls);
	struct cached *c;

	if (!lwip_budget || h->budget != lwip_budget ||
	    atomic_load_explicit(&lwip_cached, memory_order_relaxed) + bytes > lw_cache_cap ||
	    budget_get_tier(lwip_budget) != BUDGET_NORMAL)
		return false;
	/* The link overwrites the header: everything needed from it is read above. */
	c = (struct cached *)h;
	c->next = lw_cache[idx];
	lw_cache[idx] = c;
	lw_kept[idx]++;
	atomic_fetch_add_explicit(&lwip_cached, bytes, memory_order_relaxed);
	return true;
}

void lwip_glue_trim(void)
{
	for (uint32_t cls = 1; cls <= LW_CLASSES; cls++) {
		struct blk *h;

		while ((h = cache_take(cls)))
			free(h);
	}
}

bool lwip_glue_trim_unused(unsigned calls)
{
	if (lw_cache_used || !atomic_load_explicit(&lwip_cached, memory_order_relaxed)) {
		lw_cache_used = false;
		lw_unused_calls = 0;
		return false;
	}
	if (++lw_unused_calls < calls)
		return false;
	lwip_glue_trim();
	lw_unused_calls = 0;
	return true;
}

void lwip_glue_rx_held(int64_t delta)
{
	atomic_fetch_add_explicit(&lwip_rx_held, (uint64_t)delta, memory_order_relaxed);
}

uint64_t lwip_glue_rx_held_bytes(void)
{
	return atomic_load_explicit(&lwip_rx_held, memory_order_relaxed);
}

uint64_t lwip_glue_cached_bytes(void)
{
	return atomic_load_explicit(&lwip_cached, memory_order_relaxed);
}

void *ts_lwip_malloc(size_t size)
{
	struct blk *h = NULL;
	uint32_t cls, charged;

	if (size > UINT32_MAX - sizeof(*h))
		return NULL;
	cls = size_class(sizeof(*h) + size);
	charged = cls ? class_bytes(cls) : (uint32_t)size;
	if (lwip_budget && budget_bytes_reserve(lwip_budget, charged) != 0)
		return NULL; /* lwIP handles a failed allocation: drops, smaller windows, ERR_MEM */
	if (cls && !(h = cache_pop(cls)))
		cache_make_room(cls);
	if (!h)
		h = malloc(cls ? charged : sizeof(*h) + size);
	if (!h) {
		if (lwip_budget)
			budget_bytes_release(lwip_budget, charged);
		return NULL;
	}
	h->size = charged;
	h->cls = cls;
	h->budget = lwip_budget;
	atomic_fetch_add_explicit(&lwip_bytes, charged, memory_order_relaxed);
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
	if (!h->cls || !cache_push(h))
		free(h);
}

void lwip_glue_abandon(void *p)
{
	struct blk *h = (struct blk *)p - 1;

	atomic_fetch_sub_explicit(&lwip_bytes, h->size, memory_order_relaxed);
	if (h->budget)
		budget_bytes_abandon(h->budget, h->size);
	lsan_leave_allocated(h);
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
