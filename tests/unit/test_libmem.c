/* test_libmem.c — c-ares', OpenSSL's and nghttp2's allocations through core/libmem.c: each
 * library is routed once installed, its live blocks and bytes are counted and come back,
 * and an allocation refused inside it (failalloc.h) is counted, for the process and for the
 * thread that met it. */
#include <ares.h>
#include <criterion/criterion.h>
#include <stdint.h>

#include "core/libmem.h"
#include "core/tlslib.h"
#include "failalloc.h"

static struct libmem_stats stats(enum libmem_lib lib)
{
	struct libmem_stats st;

	libmem_get_stats(lib, &st);
	return st;
}

Test(libmem, nothing_is_routed_before_the_install)
{
	cr_assert_null(libmem_nghttp2());
	cr_assert_not(stats(LIBMEM_CARES).routed);
	cr_assert_not(stats(LIBMEM_NGHTTP2).routed);
}

/* A channel's blocks are counted while it lives and come back with it; a refused one fails
 * the init with ARES_ENOMEM and is counted. */
Test(libmem, cares_blocks_counted_and_refusals_seen)
{
	ares_channel ch;
	struct libmem_stats s0, s1;
	uint64_t here;

	cr_assert_eq(libmem_install(), 0);
	cr_assert_eq(libmem_install(), 0, "a second install returns the first's result");
	s0 = stats(LIBMEM_CARES);
	cr_assert(s0.routed);
	cr_assert_eq(ares_init(&ch), ARES_SUCCESS);
	s1 = stats(LIBMEM_CARES);
	cr_assert_gt(s1.blocks, s0.blocks, "the channel's blocks are counted");
	cr_assert_gt(s1.bytes, s0.bytes);
	ares_destroy(ch);
	s1 = stats(LIBMEM_CARES);
	cr_assert_eq(s1.blocks, s0.blocks, "and come back with it");
	cr_assert_eq(s1.bytes, s0.bytes);

	here = libmem_refusals();
	failalloc_arm(1);
	cr_assert_eq(ares_init(&ch), ARES_ENOMEM);
	cr_assert(failalloc_fired());
	failalloc_arm(0);
	s1 = stats(LIBMEM_CARES);
	cr_assert_eq(s1.refused, s0.refused + 1);
	cr_assert_eq(libmem_refusals(), here + 1, "the thread's count saw it");
	cr_assert_eq(s1.blocks, s0.blocks, "a failed init left nothing");
}

/* OpenSSL allocates here once installed: a context's blocks are counted and come back with
 * it, and a refusal inside OpenSSL is counted. (In a test executable libcrypto was initialised
 * before main, so the functions OpenSSL has are failalloc.c's, which pass to libmem's once it
 * is installed: routed stays false, the counts are libmem's all the same.) */
Test(libmem, openssl_blocks_counted_and_refusals_seen)
{
	struct libmem_stats s0, s1;
	SSL_CTX *ctx;

	cr_assert_eq(libmem_install(), 0);
	cr_assert_eq(tlslib_load(TLSLIB_TLS, NULL, 0), 0);
	s0 = stats(LIBMEM_OPENSSL);
	cr_assert_not_null(ctx = SSL_CTX_new(TLS_client_method()));
	s1 = stats(LIBMEM_OPENSSL);
	cr_assert_gt((int64_t)(s1.blocks - s0.blocks), 0, "the context's blocks are counted");
	cr_assert_gt((int64_t)(s1.bytes - s0.bytes), 0);
	SSL_CTX_free(ctx);
	/* OpenSSL keeps what the first context fetched (its method caches): a second context
	 * comes and goes without a trace. */
	s0 = stats(LIBMEM_OPENSSL);
	cr_assert_not_null(ctx = SSL_CTX_new(TLS_client_method()));
	SSL_CTX_free(ctx);
	s1 = stats(LIBMEM_OPENSSL);
	cr_assert_eq(s1.blocks, s0.blocks);
	cr_assert_eq(s1.bytes, s0.bytes);

	failalloc_arm(1);
	ctx = SSL_CTX_new(TLS_client_method());
	cr_assert(failalloc_fired());
	failalloc_arm(0);
	cr_assert_null(ctx, "the context's first allocation refused");
	cr_assert_eq(stats(LIBMEM_OPENSSL).refused, s1.refused + 1);
}

/* A session made with libmem_nghttp2() allocates here and gives everything back. */
Test(libmem, nghttp2_session_blocks_counted)
{
	nghttp2_session_callbacks *cbs;
	nghttp2_session *s;
	struct libmem_stats s0, s1;

	cr_assert_eq(libmem_install(), 0);
	cr_assert_eq(tlslib_load(TLSLIB_TLS, NULL, 0), 0);
	cr_assert_not_null(libmem_nghttp2());
	cr_assert_eq(nghttp2_session_callbacks_new(&cbs), 0);
	s0 = stats(LIBMEM_NGHTTP2);
	cr_assert(s0.routed);
	cr_assert_eq(nghttp2_session_client_new3(&s, cbs, NULL, NULL, libmem_nghttp2()), 0);
	s1 = stats(LIBMEM_NGHTTP2);
	cr_assert_gt(s1.blocks, s0.blocks);
	nghttp2_session_del(s);
	s1 = stats(LIBMEM_NGHTTP2);
	cr_assert_eq(s1.blocks, s0.blocks);
	cr_assert_eq(s1.bytes, s0.bytes);
	failalloc_arm(1);
	cr_assert_eq(nghttp2_session_client_new3(&s, cbs, NULL, NULL, libmem_nghttp2()),
		     NGHTTP2_ERR_NOMEM);
	failalloc_arm(0);
	cr_assert_eq(stats(LIBMEM_NGHTTP2).refused, s0.refused + 1);
	nghttp2_session_callbacks_del(cbs);
}
