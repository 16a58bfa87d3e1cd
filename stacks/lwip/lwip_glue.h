/* lwip_glue.h — the claim that makes one lwIP stack lwIP's owner in this process, and the bytes
 * lwIP holds (stacks/lwip/lwip_glue.c). The platform functions lwIP itself calls there
 * (ts_lwip_malloc, ts_lwip_free, ...) are declared by include/arch/cc.h, for lwIP. */
#ifndef TS_STACKS_LWIP_GLUE_H
#define TS_STACKS_LWIP_GLUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct budget;

/* Make the caller lwIP's one owner in this process: -EBUSY if another owner holds it (nothing
 * changed then); else lwIP is initialised (the first time) and its allocations are charged to
 * b until lwip_glue_release. The owner must leave lwIP with no pcb and no netif before it
 * releases. */
int lwip_glue_claim(struct budget *b) __attribute__((warn_unused_result));
void lwip_glue_release(void);
/* Is lwIP owned now? A snapshot (any thread): a start may still race; the claim decides. */
bool lwip_glue_claimed(void);

/* The bytes lwIP holds now (any thread); a block kept for reuse is not held. */
uint64_t lwip_glue_mem_bytes(void);
/* The bytes of freed blocks kept for reuse (any thread): at most an eighth of the owner's
 * buffer bytes, and 8 MiB. */
uint64_t lwip_glue_cached_bytes(void);
/* Packet bytes lwIP holds in the driver's read buffers (taken super-packets, not lwIP's
 * allocator's): add delta (negative when one is given back). */
void lwip_glue_rx_held(int64_t delta);
uint64_t lwip_glue_rx_held_bytes(void);
/* lwIP's allocator, as lwIP calls it through include/arch/cc.h (declared here too for tests):
 * charged to the owner's budget; NULL when over budget or out of memory. */
void *ts_lwip_malloc(size_t size);
void ts_lwip_free(void *p);
/* p, a block of ts_lwip_malloc, will never be freed: the kernel may still read it (a frame lent
 * to the driver whose write the ring lost, core/driver.h). It stays allocated for as long as
 * the process lives (no leak for LeakSanitizer), its charge stays with its budget as abandoned
 * (budget_bytes_abandon), and it leaves lwip_glue_mem_bytes. The caller never frees it. */
void lwip_glue_abandon(void *p);
/* Give the blocks kept for reuse back to the system (the owner's thread; release does it). */
void lwip_glue_trim(void);
/* The owner's thread, once per TCP timer tick while pcbs exist: counts the calls in a row in
 * which no kept block was handed out again; at the calls-th it gives the kept blocks back
 * (lwip_glue_trim) and returns true, so the caller can trim the heap too. False otherwise, and
 * always when nothing is kept. */
bool lwip_glue_trim_unused(unsigned calls);

#endif
