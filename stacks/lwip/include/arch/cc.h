/* arch/cc.h — lwIP's compiler/platform glue for twinstack (Linux, gcc/clang, 64-bit). */
#ifndef TS_LWIP_ARCH_CC_H
#define TS_LWIP_ARCH_CC_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define LWIP_PLATFORM_DIAG(x) do { printf x; } while (0)
/* An lwIP assertion is a bug in lwIP or in our use of it: say where, then stop. */
#define LWIP_PLATFORM_ASSERT(x)                                                                 \
	do {                                                                                    \
		fprintf(stderr, "lwIP assertion \"%s\" failed at %s:%d\n", x, __FILE__,         \
			__LINE__);                                                              \
		abort();                                                                        \
	} while (0)

/* lwIP draws its first local port from this (the only use with our options): the kernel's
 * random source (stacks/lwip/lwip_isn.c), not libc's unseeded random(). */
uint32_t lwip_isn_rand32(void);
#define LWIP_RAND() ((u32_t)lwip_isn_rand32())
#define LWIP_NO_CTYPE_H 0

/* lwIP's memory functions, routed to the twinstack budget (stacks/lwip/lwip_glue.c). */
#include <stddef.h>
void *ts_lwip_malloc(size_t size);
void ts_lwip_free(void *p);
void *ts_lwip_calloc(size_t n, size_t size);

#endif
