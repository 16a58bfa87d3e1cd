/* quic_initial.h — the QUIC Initial packet protection of RFC 9001 §5 (v1) and RFC 9369 §3 (v2)
 * as the sniffer uses it, exposed for the unit tests and the fuzz harness. Internal to sniff/.
 */
#ifndef TS_SNIFF_QUIC_INITIAL_H
#define TS_SNIFF_QUIC_INITIAL_H

#include <stddef.h>
#include <stdint.h>

#define QUIC_V1 0x00000001u
#define QUIC_V2 0x6b3343cfu
#define QUIC_CID_MAX 20

/* The client's Initial packet protection keys (AEAD_AES_128_GCM). */
struct quic_initial_keys {
	uint8_t key[16], iv[12], hp[16];
};

/* Derive the client keys for version (QUIC_V1 or QUIC_V2) from the DCID of the client's first
 * Initial (RFC 9001 §5.2). 0, -EINVAL for another version or a DCID over 20 bytes, -EIO if
 * libcrypto fails, or tlslib_load's error if libcrypto cannot be opened (core/tlslib.h). */
int quic_initial_keys(uint32_t version, const uint8_t *dcid, size_t dcid_len,
		      struct quic_initial_keys *k);

/* Build one protected client Initial for tests and fuzzing: long header with version, dcid,
 * an empty SCID, the token (token_len < 16384, NULL if 0), a 2-byte Length, a 4-byte packet
 * number pn; frames as the payload (at least 1 byte). Written to out (cap bytes); 0 with
 * *out_len set, -EINVAL on bad arguments, -ENOSPC if out is too small, -EIO if libcrypto
 * fails (or cannot be opened: as quic_initial_keys). */
int quic_initial_seal(uint32_t version, const uint8_t *dcid, size_t dcid_len,
		      const uint8_t *token, size_t token_len, uint32_t pn, const uint8_t *frames,
		      size_t frames_len, uint8_t *out, size_t cap, size_t *out_len);

#endif
