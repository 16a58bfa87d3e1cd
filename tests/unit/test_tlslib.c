/* test_tlslib.c — OpenSSL and nghttp2 opened on demand: what each use opens (and what it leaves
 * closed), every function of an opened library resolved, the calls reaching the libraries.
 * Each test runs in a fresh process (Criterion forks), so each starts with nothing opened.
 * (Criterion itself maps libcrypto into every test binary, through its own dependencies: the
 * tests look at libssl and nghttp2, which it does not.) */
#include <criterion/criterion.h>

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/tlslib.h"
#include "dns/upstream.h"

/* Is a library whose file name starts with name mapped into this process? */
static bool mapped(const char *name)
{
	char line[512];
	bool found = false;
	FILE *f = fopen("/proc/self/maps", "re");

	cr_assert_not_null(f, "/proc/self/maps");
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, name) != NULL;
	fclose(f);
	return found;
}

/* Members of the group left unresolved. */
#define UNSET(f) n += tlslib.p_##f == NULL;
static size_t crypto_unset(void)
{
	size_t n = 0;
	TLSLIB_CRYPTO_FNS(UNSET)
	return n;
}

static size_t tls_unset(void)
{
	size_t n = 0;
	TLSLIB_SSL_FNS(UNSET)
	TLSLIB_H2_FNS(UNSET)
	return n;
}
#undef UNSET

#define ONE(f) +1
#define N_ALL (0 TLSLIB_CRYPTO_FNS(ONE) TLSLIB_SSL_FNS(ONE) TLSLIB_H2_FNS(ONE))
#define N_TLS (0 TLSLIB_SSL_FNS(ONE) TLSLIB_H2_FNS(ONE))

Test(tlslib, nothing_opened_until_asked)
{
	cr_assert(!mapped("/libssl.so") && !mapped("/libnghttp2.so"));
	cr_assert_eq(crypto_unset() + tls_unset(), N_ALL);
}

/* QUIC sniffing needs libcrypto only: libssl and nghttp2 stay closed. */
Test(tlslib, crypto_alone_leaves_tls_closed)
{
	char err[256] = "";

	cr_assert_eq(tlslib_load(TLSLIB_CRYPTO, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(crypto_unset(), 0);
	cr_assert_eq(tls_unset(), N_TLS);
	cr_assert(!mapped("/libssl.so") && !mapped("/libnghttp2.so"), "TLS libraries not opened");
	cr_assert_null(tlslib.p_SSL_CTX_new);
	cr_assert_null(tlslib.p_nghttp2_session_client_new3);
	cr_assert_eq(tlslib_load(TLSLIB_CRYPTO, NULL, 0), 0, "again");
}

Test(tlslib, tls_opens_all_three)
{
	char err[256] = "";

	cr_assert_eq(tlslib_load(TLSLIB_TLS, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(crypto_unset() + tls_unset(), 0, "every function resolved");
	cr_assert(mapped("/libssl.so") && mapped("/libnghttp2.so") && mapped("/libcrypto.so"));
}

/* A DNS server over UDP or TCP never opens TLS, from its creation to its end. */
Test(tlslib, plain_dns_servers_open_nothing)
{
	struct event_base *base = event_base_new();
	struct dns_upstream_config c = { .kind = DNS_UP_UDP };
	struct dns_upstream *u;

	cr_assert_not_null(base);
	cr_assert_eq(netaddr_parse_ep("127.0.0.1:53", &c.server), 0);
	cr_assert_eq(dns_upstream_new(base, &c, &u), 0);
	dns_upstream_free(u);
	c.kind = DNS_UP_TCP;
	cr_assert_eq(dns_upstream_new(base, &c, &u), 0);
	dns_upstream_free(u);
	event_base_free(base);
	cr_assert(!mapped("/libssl.so"));
	cr_assert_null(tlslib.p_SSL_CTX_new);
}

/* The calls reach the libraries: one of each, a macro of OpenSSL's over a listed function, and
 * a known answer from libcrypto. */
Test(tlslib, calls_reach_each_library)
{
	SSL_CTX *ctx;
	nghttp2_session_callbacks *cbs = NULL;
	EVP_CIPHER_CTX *c;
	uint8_t key[16] = { 0 }, iv[12] = { 0 }, out[32], tag[16];
	int n = 0;

	cr_assert_eq(tlslib_load(TLSLIB_TLS, NULL, 0), 0);
	cr_assert_not_null(ctx = SSL_CTX_new(TLS_client_method()));
	cr_assert_eq(SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION), 1, "a macro over SSL_CTX_ctrl");
	SSL_CTX_free(ctx);
	cr_assert_eq(nghttp2_session_callbacks_new(&cbs), 0);
	nghttp2_session_callbacks_del(cbs);
	/* AES-128-GCM, zero key and IV, empty plaintext: the tag is 58e2fccefa7e3061367f1d57a4e7455a
	 * (the first test case of McGrew and Viega, "The Galois/Counter Mode of Operation"). */
	cr_assert_not_null(c = EVP_CIPHER_CTX_new());
	cr_assert_eq(EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, key, iv), 1);
	cr_assert_eq(EVP_EncryptFinal_ex(c, out, &n), 1);
	cr_assert_eq(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag), 1);
	EVP_CIPHER_CTX_free(c);
	cr_assert_eq(memcmp(tag, "\x58\xe2\xfc\xce\xfa\x7e\x30\x61\x36\x7f\x1d\x57\xa4\xe7\x45\x5a", 16), 0);
}

/* A write into the filled table faults (its page is read-only), in a child of its own; after
 * the TLS group was filled too, the table is read-only again (on 4 KiB pages). Without the
 * protection the child writes, exits 0 and the test fails. */
static void write_faults(void)
{
	int status = 0;
	pid_t pid = fork();

	cr_assert_geq(pid, 0, "fork");
	if (pid == 0) {
		/* The kernel's own end for the fault, not a sanitizer's report of it. */
		int null = open("/dev/null", O_WRONLY);

		signal(SIGSEGV, SIG_DFL);
		if (null >= 0)
			dup2(null, STDERR_FILENO);
		*(void *volatile *)&tlslib.p_EVP_CIPHER_CTX_new = NULL;
		_exit(0);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(!(WIFEXITED(status) && WEXITSTATUS(status) == 0),
		  "the child wrote into the function table");
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
		  "the child's write should fault (status 0x%x)", status);
}

Test(tlslib, table_read_only_between_fills)
{
	char err[256] = "";

	if (sysconf(_SC_PAGESIZE) != 4096)
		cr_skip_test("the table is guarded on 4 KiB pages only");
	cr_assert_eq(tlslib_load(TLSLIB_CRYPTO, err, sizeof(err)), 0, "%s", err);
	write_faults();
	cr_assert_eq(tlslib_load(TLSLIB_TLS, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(crypto_unset() + tls_unset(), 0, "the second fill went in");
	write_faults();
}
