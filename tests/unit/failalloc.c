/* failalloc.c — the allocation wrappers of failalloc.h (linked with -Wl,--wrap=...). */
#include <stddef.h>
#include <stdlib.h>

#include "failalloc.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
char *__real_strdup(const char *s);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
char *__wrap_strdup(const char *s);

static _Thread_local long fail_at; /* 0: disarmed */
static _Thread_local long seen;
static _Thread_local bool fired;

void failalloc_arm(long n)
{
	if (n <= 0) {
		fail_at = 0;
		return;
	}
	fail_at = n;
	seen = 0;
	fired = false;
}

long failalloc_seen(void)
{
	return seen;
}

bool failalloc_fired(void)
{
	return fired;
}

/* True when this allocation is the one to refuse. */
static bool refuse(void)
{
	if (!fail_at)
		return false;
	if (++seen != fail_at)
		return false;
	fired = true;
	return true;
}

void *__wrap_malloc(size_t n)
{
	return refuse() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return refuse() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	return refuse() ? NULL : __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
	return refuse() ? NULL : __real_aligned_alloc(align, n);
}

char *__wrap_strdup(const char *s)
{
	return refuse() ? NULL : __real_strdup(s);
}
