/* libmem.c — c-ares', OpenSSL's and nghttp2's allocators, counted (see libmem.h). */
#include "core/libmem.h"

#include <ares.h>
#include <errno.h>
#include <malloc.h>
#include <nghttp2/nghttp2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static struct lib {
	atomic_bool routed;
	atomic_uint_fast64_t blocks, bytes, refused;
} L[LIBMEM_MAX];

static _Thread_local uint64_t refusals_here;
static atomic_bool installed;
static int install_ret;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* ---- the counting allocator ---- */

static void *refused(struct lib *l)
{
	refusals_here++;
	atomic_fetch_add_explicit(&l->refused, 1, memory_order_relaxed);
	return NULL;
}

static void *took(struct lib *l, void *p)
{
	if (!p)
		return refused(l);
	atomic_fetch_add_explicit(&l->blocks, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&l->bytes, malloc_usable_size(p), memory_order_relaxed);
	return p;
}

static void give(struct lib *l, void *p)
{
	if (!p)
		return;
	atomic_fetch_sub_explicit(&l->blocks, 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&l->bytes, malloc_usable_size(p), memory_order_relaxed);
	free(p);
}

/* realloc's contract: a NULL block is a malloc; a size of 0 frees the block and returns NULL
 * (what OpenSSL's own CRYPTO_realloc does); a refusal leaves the block as it was. */
static void *regrow(struct lib *l, void *p, size_t n)
{
	size_t old;
	void *q;

	if (!p)
		return took(l, malloc(n));
	if (n == 0) {
		give(l, p);
		return NULL;
	}
	old = malloc_usable_size(p);
	if (!(q = realloc(p, n)))
		return refused(l);
	atomic_fetch_add_explicit(&l->bytes, malloc_usable_size(q) - old, memory_order_relaxed);
	return q;
}

/* ---- c-ares ---- */

static void *cares_malloc(size_t n)
{
	return took(&L[LIBMEM_CARES], malloc(n));
}

static void *cares_realloc(void *p, size_t n)
{
	return regrow(&L[LIBMEM_CARES], p, n);
}

static void cares_free(void *p)
{
	give(&L[LIBMEM_CARES], p);
}

/* ---- OpenSSL (file and line are OpenSSL's debugging aid, unused) ---- */

void *libmem_crypto_malloc(size_t n, const char *file, int line)
{
	return took(&L[LIBMEM_OPENSSL], malloc(n));
}

void *libmem_crypto_realloc(void *p, size_t n, const char *file, int line)
{
	return regrow(&L[LIBMEM_OPENSSL], p, n);
}

void libmem_crypto_free(void *p, const char *file, int line)
{
	give(&L[LIBMEM_OPENSSL], p);
}

/* ---- nghttp2 ---- */

static void *h2_malloc(size_t n, void *ud)
{
	return took(&L[LIBMEM_NGHTTP2], malloc(n));
}

static void h2_free(void *p, void *ud)
{
	give(&L[LIBMEM_NGHTTP2], p);
}

static void *h2_calloc(size_t nmemb, size_t size, void *ud)
{
	return took(&L[LIBMEM_NGHTTP2], calloc(nmemb, size));
}

static void *h2_realloc(void *p, size_t n, void *ud)
{
	return regrow(&L[LIBMEM_NGHTTP2], p, n);
}

static nghttp2_mem h2_mem = { NULL, h2_malloc, h2_free, h2_calloc, h2_realloc };

/* ---- install ---- */

static void install_once(void)
{
	int rc = ares_library_init_mem(ARES_LIB_INIT_ALL, cares_malloc, cares_free,
				       cares_realloc);

	if (rc != ARES_SUCCESS) {
		install_ret = rc == ARES_ENOMEM ? -ENOMEM : -EIO;
		return;
	}
	atomic_store(&L[LIBMEM_CARES].routed, true);
	atomic_store(&L[LIBMEM_NGHTTP2].routed, true);
	atomic_store(&installed, true);
}

int libmem_install(void)
{
	pthread_once(&once, install_once);
	return install_ret;
}

void libmem_crypto_opened(libmem_crypto_set_fn set)
{
	/* 0 from OpenSSL: it has allocated already and keeps its own allocator. */
	if (atomic_load(&installed) && set &&
	    set(libmem_crypto_malloc, libmem_crypto_realloc, libmem_crypto_free) == 1)
		atomic_store(&L[LIBMEM_OPENSSL].routed, true);
}

bool libmem_installed(void)
{
	return atomic_load(&installed);
}

void *libmem_nghttp2(void)
{
	return atomic_load(&installed) ? &h2_mem : NULL;
}

uint64_t libmem_refusals(void)
{
	return refusals_here;
}

void libmem_get_stats(enum libmem_lib lib, struct libmem_stats *out)
{
	struct lib *l = &L[lib];

	out->routed = atomic_load(&l->routed);
	out->blocks = atomic_load_explicit(&l->blocks, memory_order_relaxed);
	out->bytes = atomic_load_explicit(&l->bytes, memory_order_relaxed);
	out->refused = atomic_load_explicit(&l->refused, memory_order_relaxed);
}
