/* tlslib.c — opens OpenSSL and nghttp2 on first need and fills the table of their functions.
 *
 * The libraries are opened by their sonames, taken at build time from the libraries the build
 * found (TS_CRYPTO_SONAME, TS_SSL_SONAME, TS_NGHTTP2_SONAME), as the dynamic loader would have
 * looked them up had the program linked them. Once opened they stay open.
 */
#include "core/tlslib.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/libmem.h"

struct tlslib_fns tlslib;
_Static_assert(_Alignof(struct tlslib_fns) == 4096 && sizeof(struct tlslib_fns) % 4096 == 0,
	       "the table must fill whole 4 KiB pages of its own");

enum { G_CRYPTO, G_TLS, G_MAX };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned opened; /* TLSLIB_* whose functions are in the table */
/* Under lock: a group's failure, final. */
static int fail_ret[G_MAX];
static char fail_err[G_MAX][256];

/* One library of group g; on failure the group's error. */
static void *open_lib(int g, const char *name)
{
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		const char *e = dlerror();
		snprintf(fail_err[g], sizeof(fail_err[g]), "%s", e ? e : name);
		fail_ret[g] = -ENOENT;
	}
	return h;
}

/* One function of lib into *slot; the first one missing is the group's error. */
static void resolve(int g, void *h, const char *lib, const char *name, void **slot)
{
	if (fail_ret[g])
		return;
	*slot = dlsym(h, name);
	if (!*slot) {
		snprintf(fail_err[g], sizeof(fail_err[g]), "%s: no function %s", lib, name);
		fail_ret[g] = -ENOSYS;
	}
}

/* #f is the function's name (a stringified argument is not macro-expanded), p_##f its member
 * (nor is a pasted one). */
#define R_CRYPTO(f) resolve(G_CRYPTO, crypto, TS_CRYPTO_SONAME, #f, (void **)&tlslib.p_##f);
#define R_SSL(f) resolve(G_TLS, ssl, TS_SSL_SONAME, #f, (void **)&tlslib.p_##f);
#define R_H2(f) resolve(G_TLS, h2, TS_NGHTTP2_SONAME, #f, (void **)&tlslib.p_##f);

#define NULLED(f) tlslib.p_##f = NULL;

/* Under lock. Only the group's own members are written, and only while none of them is in
 * use (a caller calls a function only after tlslib_load returned 0 for it); a failure leaves
 * them NULL and closes what it opened. */
static int open_crypto(void)
{
	void *crypto;

	if (fail_ret[G_CRYPTO] || !(crypto = open_lib(G_CRYPTO, TS_CRYPTO_SONAME)))
		return fail_ret[G_CRYPTO];
	TLSLIB_CRYPTO_FNS(R_CRYPTO)
	if (fail_ret[G_CRYPTO]) {
		TLSLIB_CRYPTO_FNS(NULLED)
		dlclose(crypto);
		return fail_ret[G_CRYPTO];
	}
	/* Before any other call into libcrypto: OpenSSL takes an allocator only before its
	 * first allocation (core/libmem.h). */
	libmem_crypto_opened(CRYPTO_set_mem_functions);
	return 0;
}

static int open_tls(void)
{
	void *ssl = NULL, *h2 = NULL;

	if (fail_ret[G_TLS] || !(ssl = open_lib(G_TLS, TS_SSL_SONAME)) ||
	    !(h2 = open_lib(G_TLS, TS_NGHTTP2_SONAME)))
		goto out;
	TLSLIB_SSL_FNS(R_SSL)
	TLSLIB_H2_FNS(R_H2)
	if (fail_ret[G_TLS] == 0)
		return 0;
	TLSLIB_SSL_FNS(NULLED)
	TLSLIB_H2_FNS(NULLED)
out:
	if (h2)
		dlclose(h2);
	if (ssl)
		dlclose(ssl);
	return fail_ret[G_TLS];
}

/* Under lock: is the table read-only now? */
static bool guarded;

/* Under lock: can the table be guarded at all? Only where it fills whole pages of this
 * system's size (4 KiB, as laid out; not on a kernel with larger pages, where mprotect would
 * take its neighbours along or refuse the address). */
static bool guardable(void)
{
	long pg = sysconf(_SC_PAGESIZE);

	return pg > 0 && sizeof(tlslib) % (size_t)pg == 0 && (uintptr_t)&tlslib % (size_t)pg == 0;
}

/* Under lock: make the table writable for a fill (0, or mprotect's -errno: it stays
 * read-only), or read-only after one (a failure leaves it writable: unguarded, working). */
static int table_writable(void)
{
	if (guarded && mprotect(&tlslib, sizeof(tlslib), PROT_READ | PROT_WRITE) != 0)
		return -errno;
	guarded = false;
	return 0;
}

static void table_read_only(void)
{
	guarded = guardable() && mprotect(&tlslib, sizeof(tlslib), PROT_READ) == 0;
}

int tlslib_load(unsigned what, char *err, size_t errlen)
{
	unsigned have;
	int ret = 0, g = G_CRYPTO;

	if (what & TLSLIB_TLS)
		what |= TLSLIB_CRYPTO;
	if ((atomic_load_explicit(&opened, memory_order_acquire) & what) == what)
		return 0;
	pthread_mutex_lock(&lock);
	have = atomic_load_explicit(&opened, memory_order_relaxed);
	if ((have & what) == what)
		goto out;
	/* Readers of a group already filled go on reading while the other group is filled. */
	if ((ret = table_writable()) != 0) {
		if (err && errlen)
			snprintf(err, errlen, "function table: mprotect: %s", strerror(-ret));
		goto out;
	}
	if (!(have & TLSLIB_CRYPTO) && (ret = open_crypto()) == 0)
		have |= TLSLIB_CRYPTO;
	if (ret == 0 && (what & TLSLIB_TLS) && !(have & TLSLIB_TLS)) {
		g = G_TLS;
		if ((ret = open_tls()) == 0)
			have |= TLSLIB_TLS;
	}
	table_read_only();
	atomic_store_explicit(&opened, have, memory_order_release);
	if (ret && err && errlen)
		snprintf(err, errlen, "%s", fail_err[g]);
out:
	pthread_mutex_unlock(&lock);
	return ret;
}
