/* libmem.h — c-ares', OpenSSL's and nghttp2's allocations through the project's allocator.
 *
 * Why: those libraries take memory on the proxy's behalf (a lookup's query, a TLS connection's
 * buffers and certificates, an HTTP/2 session's streams and header tables), and left to
 * themselves they call the C library's malloc directly: the proxy could neither say how much
 * they hold nor have its tests refuse one of their allocations, so the code that meets their
 * failures went unexercised. libmem_install() hands each library functions of this module,
 * which count what is live per library (blocks, bytes) and what was refused, and pass every
 * call on to malloc, realloc and free: the same heap, the same blocks, nothing cached.
 *
 *   c-ares   ares_library_init_mem, process-wide, at the install (before the first channel)
 *   OpenSSL  CRYPTO_set_mem_functions, process-wide, which OpenSSL takes only before its first
 *            allocation: core/tlslib.c calls libmem_crypto_opened right after it opens
 *            libcrypto, before any other call into it. If libcrypto was already in use (a
 *            program that embeds the library and uses OpenSSL itself), OpenSSL keeps its own
 *            allocator; libmem_get_stats says whether it was routed.
 *   nghttp2  per session (nghttp2_session_client_new3 with libmem_nghttp2()); its callbacks
 *            and options objects, freed within the call that made them, keep nghttp2's own.
 *
 * Only for a program that owns those libraries, as evmem is for libevent: the c-ares and
 * OpenSSL settings are process-wide and would override an embedding program's own. twinstack
 * installs it at start; the library never does.
 *
 * The counts are process-wide (relaxed atomics, any thread). libmem_refusals() is the calling
 * thread's count of refused allocations: a module that sees an OpenSSL or nghttp2 call fail can
 * tell a failure for want of memory from one of the peer (a certificate, the protocol) by
 * whether that count moved during the call.
 */
#ifndef TS_CORE_LIBMEM_H
#define TS_CORE_LIBMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum libmem_lib { LIBMEM_CARES, LIBMEM_OPENSSL, LIBMEM_NGHTTP2, LIBMEM_MAX };

/* Install (once per process; later calls return the first call's result): c-ares at once,
 * OpenSSL when core/tlslib.c opens libcrypto, nghttp2 by libmem_nghttp2(). Call it before
 * the first c-ares channel and the first tlslib_load. 0, or -ENOMEM / -EIO from c-ares'
 * library init (nothing is routed then). */
int libmem_install(void) __attribute__((warn_unused_result));

struct libmem_stats {
	bool routed;      /* the library allocates through this module */
	uint64_t blocks;  /* live blocks */
	uint64_t bytes;   /* their usable size (malloc_usable_size) */
	uint64_t refused; /* allocations malloc, calloc or realloc refused */
};
void libmem_get_stats(enum libmem_lib lib, struct libmem_stats *out);

/* The calling thread's count of refused library allocations (any library routed here). */
uint64_t libmem_refusals(void);

/* OpenSSL's CRYPTO_set_mem_functions, as found in the libcrypto just opened. */
typedef int (*libmem_crypto_set_fn)(void *(*m)(size_t, const char *, int),
				    void *(*r)(void *, size_t, const char *, int),
				    void (*f)(void *, const char *, int));

/* core/tlslib.c, once, right after opening libcrypto and before any other call into it:
 * routes OpenSSL's allocations here when libmem_install ran (else nothing). */
void libmem_crypto_opened(libmem_crypto_set_fn set);

/* The functions libmem_crypto_opened gives OpenSSL, for a program whose libcrypto allocates
 * before main and so before any install (a test harness linked with a library that
 * initialises OpenSSL in its start-up): it hands OpenSSL functions of its own early, which
 * pass each call here once libmem_installed(). A block OpenSSL took before then and frees
 * after comes off the counts without having been on them. */
void *libmem_crypto_malloc(size_t n, const char *file, int line);
void *libmem_crypto_realloc(void *p, size_t n, const char *file, int line);
void libmem_crypto_free(void *p, const char *file, int line);
bool libmem_installed(void);

/* The allocator for nghttp2_session_client_new3 (an nghttp2_mem *, valid for the process's
 * life), or NULL (nghttp2's own) before libmem_install. */
void *libmem_nghttp2(void);

#endif
