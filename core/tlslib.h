/* tlslib.h — OpenSSL and nghttp2, opened only when something needs them.
 *
 * Mapping libcrypto costs a process a large share of an idle proxy's private memory at once
 * (docs/architecture.md, "What the libraries cost"): the loader writes its relocated tables,
 * and every page written is the process's own. Every configuration would pay it, while only
 * DNS over TLS or HTTPS servers and QUIC sniffing use these libraries. So the program does not
 * link them: tlslib_load opens them (dlopen) the first time one of those is set up and fills one
 * process-wide table of the functions used (the table is the libraries themselves, shared by
 * every proxy in the process as they would be, so it is not a context of its own).
 *
 * The modules that use the libraries include this header instead of the libraries' own: it
 * includes those and turns each function used into a call through the table. Such a module
 * calls tlslib_load for what it uses before any of those functions (and fails cleanly if it
 * fails), and includes no OpenSSL or nghttp2 header itself. A function not listed here fails
 * to link: add it to a list below. Code that only opens the libraries defines
 * TLSLIB_LOAD_ONLY before including this header, and gets tlslib_load alone.
 */
#ifndef TS_CORE_TLSLIB_H
#define TS_CORE_TLSLIB_H

#include <stddef.h>

/* What to open: libcrypto alone (QUIC's Initial keys), or TLS connections (libssl and
 * nghttp2, with libcrypto under them). */
#define TLSLIB_CRYPTO (1u << 0)
#define TLSLIB_TLS (1u << 1)

/* Open the libraries of what (TLSLIB_*) and resolve every function listed for them, once per
 * process (thread-safe; when already open, an atomic load). Returns 0, or -ENOENT (a library
 * could not be opened) or -ENOSYS (a function is missing from it), with the loader's message
 * in err (when err is not NULL); the libraries a failed attempt opened are closed again. A
 * failure is final: later calls for the same libraries return it again. The table is read-only
 * between fills where the pages allow (above); if it cannot be made writable for one, the call
 * returns mprotect's -errno (not final). */
int tlslib_load(unsigned what, char *err, size_t errlen);

#ifndef TLSLIB_LOAD_ONLY

#include <nghttp2/nghttp2.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

/* The functions used: libcrypto's (TLSLIB_CRYPTO), libssl's and nghttp2's (TLSLIB_TLS). */
#define TLSLIB_CRYPTO_FNS(X) \
	X(BIO_clear_flags) \
	X(BIO_get_data) \
	X(BIO_meth_free) \
	X(BIO_meth_new) \
	X(BIO_meth_set_ctrl) \
	X(BIO_meth_set_read) \
	X(BIO_meth_set_write) \
	X(BIO_new) \
	X(BIO_set_data) \
	X(BIO_set_flags) \
	X(BIO_set_init) \
	X(CRYPTO_set_mem_functions) \
	X(ERR_clear_error) \
	X(ERR_peek_error) \
	X(EVP_CIPHER_CTX_ctrl) \
	X(EVP_CIPHER_CTX_free) \
	X(EVP_CIPHER_CTX_new) \
	X(EVP_CIPHER_CTX_set_padding) \
	X(EVP_DecryptFinal_ex) \
	X(EVP_DecryptInit_ex) \
	X(EVP_DecryptUpdate) \
	X(EVP_EncryptFinal_ex) \
	X(EVP_EncryptInit_ex) \
	X(EVP_EncryptUpdate) \
	X(EVP_KDF_CTX_free) \
	X(EVP_KDF_CTX_new) \
	X(EVP_KDF_derive) \
	X(EVP_KDF_fetch) \
	X(EVP_KDF_free) \
	X(EVP_aes_128_ecb) \
	X(EVP_aes_128_gcm) \
	X(OSSL_PARAM_construct_end) \
	X(OSSL_PARAM_construct_int) \
	X(OSSL_PARAM_construct_octet_string) \
	X(OSSL_PARAM_construct_utf8_string) \
	X(PEM_read_X509) \
	X(X509_STORE_add_cert) \
	X(X509_VERIFY_PARAM_set1_ip_asc) \
	X(X509_free)

#define TLSLIB_SSL_FNS(X) \
	X(SSL_CTX_ctrl) \
	X(SSL_CTX_free) \
	X(SSL_CTX_get_cert_store) \
	X(SSL_CTX_load_verify_locations) \
	X(SSL_CTX_new) \
	X(SSL_CTX_set_alpn_protos) \
	X(SSL_CTX_set_default_verify_paths) \
	X(SSL_CTX_set_options) \
	X(SSL_CTX_set_verify) \
	X(SSL_connect) \
	X(SSL_ctrl) \
	X(SSL_do_handshake) \
	X(SSL_free) \
	X(SSL_get0_alpn_selected) \
	X(SSL_get0_param) \
	X(SSL_get_error) \
	X(SSL_get_verify_result) \
	X(SSL_new) \
	X(SSL_read) \
	X(SSL_set1_host) \
	X(SSL_set_bio) \
	X(SSL_set_connect_state) \
	X(SSL_set_fd) \
	X(SSL_set_hostflags) \
	X(SSL_shutdown) \
	X(SSL_write) \
	X(TLS_client_method)

#define TLSLIB_H2_FNS(X) \
	X(nghttp2_option_del) \
	X(nghttp2_option_new) \
	X(nghttp2_option_set_peer_max_concurrent_streams) \
	X(nghttp2_session_callbacks_del) \
	X(nghttp2_session_callbacks_new) \
	X(nghttp2_session_callbacks_set_on_data_chunk_recv_callback) \
	X(nghttp2_session_callbacks_set_on_frame_recv_callback) \
	X(nghttp2_session_callbacks_set_on_header_callback) \
	X(nghttp2_session_callbacks_set_on_stream_close_callback) \
	X(nghttp2_session_callbacks_set_send_callback) \
	X(nghttp2_session_client_new3) \
	X(nghttp2_session_del) \
	X(nghttp2_session_get_remote_settings) \
	X(nghttp2_session_mem_recv) \
	X(nghttp2_session_send) \
	X(nghttp2_session_want_read) \
	X(nghttp2_session_want_write) \
	X(nghttp2_submit_request) \
	X(nghttp2_submit_rst_stream) \
	X(nghttp2_submit_settings)

#define TLSLIB_MEMBER(f) __typeof__(f) *p_##f;
#define TLSLIB_MEMBERS                        \
	TLSLIB_CRYPTO_FNS(TLSLIB_MEMBER)      \
	TLSLIB_SSL_FNS(TLSLIB_MEMBER)         \
	TLSLIB_H2_FNS(TLSLIB_MEMBER)

/* The table alone on its own 4 KiB page(s) (the alignment pads its size to whole pages), so
 * that tlslib_load can make them read-only between its fills: a stray write can then not turn
 * into a call through a pointer it chose. On a system with larger pages it stays writable. */
struct tlslib_fns {
	_Alignas(4096) struct {
		TLSLIB_MEMBERS
	};
};
#undef TLSLIB_MEMBERS
#undef TLSLIB_MEMBER

/* Filled by tlslib_load; read-only afterwards (mprotect once a load has finished, on 4 KiB
 * pages). */
extern struct tlslib_fns tlslib;

/* Calls through the table. */
#define BIO_clear_flags (tlslib.p_BIO_clear_flags)
#define BIO_get_data (tlslib.p_BIO_get_data)
#define BIO_meth_free (tlslib.p_BIO_meth_free)
#define BIO_meth_new (tlslib.p_BIO_meth_new)
#define BIO_meth_set_ctrl (tlslib.p_BIO_meth_set_ctrl)
#define BIO_meth_set_read (tlslib.p_BIO_meth_set_read)
#define BIO_meth_set_write (tlslib.p_BIO_meth_set_write)
#define BIO_new (tlslib.p_BIO_new)
#define BIO_set_data (tlslib.p_BIO_set_data)
#define BIO_set_flags (tlslib.p_BIO_set_flags)
#define BIO_set_init (tlslib.p_BIO_set_init)
#define CRYPTO_set_mem_functions (tlslib.p_CRYPTO_set_mem_functions)
#define ERR_clear_error (tlslib.p_ERR_clear_error)
#define ERR_peek_error (tlslib.p_ERR_peek_error)
#define EVP_CIPHER_CTX_ctrl (tlslib.p_EVP_CIPHER_CTX_ctrl)
#define EVP_CIPHER_CTX_free (tlslib.p_EVP_CIPHER_CTX_free)
#define EVP_CIPHER_CTX_new (tlslib.p_EVP_CIPHER_CTX_new)
#define EVP_CIPHER_CTX_set_padding (tlslib.p_EVP_CIPHER_CTX_set_padding)
#define EVP_DecryptFinal_ex (tlslib.p_EVP_DecryptFinal_ex)
#define EVP_DecryptInit_ex (tlslib.p_EVP_DecryptInit_ex)
#define EVP_DecryptUpdate (tlslib.p_EVP_DecryptUpdate)
#define EVP_EncryptFinal_ex (tlslib.p_EVP_EncryptFinal_ex)
#define EVP_EncryptInit_ex (tlslib.p_EVP_EncryptInit_ex)
#define EVP_EncryptUpdate (tlslib.p_EVP_EncryptUpdate)
#define EVP_KDF_CTX_free (tlslib.p_EVP_KDF_CTX_free)
#define EVP_KDF_CTX_new (tlslib.p_EVP_KDF_CTX_new)
#define EVP_KDF_derive (tlslib.p_EVP_KDF_derive)
#define EVP_KDF_fetch (tlslib.p_EVP_KDF_fetch)
#define EVP_KDF_free (tlslib.p_EVP_KDF_free)
#define EVP_aes_128_ecb (tlslib.p_EVP_aes_128_ecb)
#define EVP_aes_128_gcm (tlslib.p_EVP_aes_128_gcm)
#define OSSL_PARAM_construct_end (tlslib.p_OSSL_PARAM_construct_end)
#define OSSL_PARAM_construct_int (tlslib.p_OSSL_PARAM_construct_int)
#define OSSL_PARAM_construct_octet_string (tlslib.p_OSSL_PARAM_construct_octet_string)
#define OSSL_PARAM_construct_utf8_string (tlslib.p_OSSL_PARAM_construct_utf8_string)
#define PEM_read_X509 (tlslib.p_PEM_read_X509)
#define X509_STORE_add_cert (tlslib.p_X509_STORE_add_cert)
#define X509_VERIFY_PARAM_set1_ip_asc (tlslib.p_X509_VERIFY_PARAM_set1_ip_asc)
#define X509_free (tlslib.p_X509_free)
#define SSL_CTX_ctrl (tlslib.p_SSL_CTX_ctrl)
#define SSL_CTX_free (tlslib.p_SSL_CTX_free)
#define SSL_CTX_get_cert_store (tlslib.p_SSL_CTX_get_cert_store)
#define SSL_CTX_load_verify_locations (tlslib.p_SSL_CTX_load_verify_locations)
#define SSL_CTX_new (tlslib.p_SSL_CTX_new)
#define SSL_CTX_set_alpn_protos (tlslib.p_SSL_CTX_set_alpn_protos)
#define SSL_CTX_set_default_verify_paths (tlslib.p_SSL_CTX_set_default_verify_paths)
#define SSL_CTX_set_options (tlslib.p_SSL_CTX_set_options)
#define SSL_CTX_set_verify (tlslib.p_SSL_CTX_set_verify)
#define SSL_connect (tlslib.p_SSL_connect)
#define SSL_ctrl (tlslib.p_SSL_ctrl)
#define SSL_do_handshake (tlslib.p_SSL_do_handshake)
#define SSL_free (tlslib.p_SSL_free)
#define SSL_get0_alpn_selected (tlslib.p_SSL_get0_alpn_selected)
#define SSL_get0_param (tlslib.p_SSL_get0_param)
#define SSL_get_error (tlslib.p_SSL_get_error)
#define SSL_get_verify_result (tlslib.p_SSL_get_verify_result)
#define SSL_new (tlslib.p_SSL_new)
#define SSL_read (tlslib.p_SSL_read)
#define SSL_set1_host (tlslib.p_SSL_set1_host)
#define SSL_set_bio (tlslib.p_SSL_set_bio)
#define SSL_set_connect_state (tlslib.p_SSL_set_connect_state)
#define SSL_set_fd (tlslib.p_SSL_set_fd)
#define SSL_set_hostflags (tlslib.p_SSL_set_hostflags)
#define SSL_shutdown (tlslib.p_SSL_shutdown)
#define SSL_write (tlslib.p_SSL_write)
#define TLS_client_method (tlslib.p_TLS_client_method)
#define nghttp2_option_del (tlslib.p_nghttp2_option_del)
#define nghttp2_option_new (tlslib.p_nghttp2_option_new)
#define nghttp2_option_set_peer_max_concurrent_streams (tlslib.p_nghttp2_option_set_peer_max_concurrent_streams)
#define nghttp2_session_callbacks_del (tlslib.p_nghttp2_session_callbacks_del)
#define nghttp2_session_callbacks_new (tlslib.p_nghttp2_session_callbacks_new)
#define nghttp2_session_callbacks_set_on_data_chunk_recv_callback (tlslib.p_nghttp2_session_callbacks_set_on_data_chunk_recv_callback)
#define nghttp2_session_callbacks_set_on_frame_recv_callback (tlslib.p_nghttp2_session_callbacks_set_on_frame_recv_callback)
#define nghttp2_session_callbacks_set_on_header_callback (tlslib.p_nghttp2_session_callbacks_set_on_header_callback)
#define nghttp2_session_callbacks_set_on_stream_close_callback (tlslib.p_nghttp2_session_callbacks_set_on_stream_close_callback)
#define nghttp2_session_callbacks_set_send_callback (tlslib.p_nghttp2_session_callbacks_set_send_callback)
#define nghttp2_session_client_new3 (tlslib.p_nghttp2_session_client_new3)
#define nghttp2_session_del (tlslib.p_nghttp2_session_del)
#define nghttp2_session_get_remote_settings (tlslib.p_nghttp2_session_get_remote_settings)
#define nghttp2_session_mem_recv (tlslib.p_nghttp2_session_mem_recv)
#define nghttp2_session_send (tlslib.p_nghttp2_session_send)
#define nghttp2_session_want_read (tlslib.p_nghttp2_session_want_read)
#define nghttp2_session_want_write (tlslib.p_nghttp2_session_want_write)
#define nghttp2_submit_request (tlslib.p_nghttp2_submit_request)
#define nghttp2_submit_rst_stream (tlslib.p_nghttp2_submit_rst_stream)
#define nghttp2_submit_settings (tlslib.p_nghttp2_submit_settings)

#endif /* TLSLIB_LOAD_ONLY */

#endif
