/* sniff.h — sans-IO sniffing of the host name a client is about to talk to: the SNI of a TLS
 * ClientHello (RFC 8446 §4.1.2, RFC 6066 §3), the Host header of an HTTP/1.x request
 * (RFC 9112 §3.2) and the SNI inside a QUIC client Initial (RFC 9000 §17.2.2, RFC 9001 §5).
 * Nothing here touches a socket or the clock; callers feed the bytes they already hold.
 */
#ifndef TS_SNIFF_SNIFF_H
#define TS_SNIFF_SNIFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SNIFF_NAME_MAX 253
enum sniff_proto { SNIFF_PROTO_NONE = 0, SNIFF_PROTO_TLS, SNIFF_PROTO_HTTP, SNIFF_PROTO_QUIC };
enum sniff_result {
	SNIFF_NEED_MORE = 0, /* a prefix of something that may still name a host: give more bytes */
	SNIFF_FOUND,         /* name filled (lowercase, NUL-terminated, a valid DNS host name) */
	SNIFF_NONE,          /* no name will come: not TLS/HTTP/QUIC, no SNI, malformed, IP literal */
};

/* The first len bytes a TCP client sent (the whole prefix so far, re-offered from the start
 * each time more arrives; stateless). Tries a TLS ClientHello (SNI, RFC 6066 server_name type
 * host_name; the ClientHello may span several TLS records and any number of segments), then an
 * HTTP/1.x request (Host header, port stripped, "[v6]" or IP literal => SNIFF_NONE).
 * *proto says which matched (NONE if neither). Bounded work: never reads beyond len, and
 * gives SNIFF_NONE once len >= SNIFF_STREAM_MAX (16 KiB + 5) without a decision.
 * A verdict, once given for a prefix, is the same for every longer prefix of the same stream.
 * FOUND comes as soon as the server_name extension (or the Host line) is complete, which may
 * be before the end of the ClientHello (or of the header block). name is written only on
 * FOUND. Uses about SNIFF_STREAM_MAX bytes of stack (the handshake message reassembled). */
enum sniff_result sniff_stream(const uint8_t *buf, size_t len, char name[SNIFF_NAME_MAX + 1],
			       enum sniff_proto *proto);
#define SNIFF_STREAM_MAX (16384 + 5)

/* Does this UDP payload look like a QUIC v1 (RFC 9000) or v2 (RFC 9369) client Initial
 * (long header, Initial type, fixed bit, known version, len >= 1200 not required but DCID
 * len <= 20)? Cheap, no allocation. */
bool sniff_quic_is_initial(const uint8_t *dgram, size_t len);

#define SNIFF_QUIC_CRYPTO_MAX 16384 /* bytes of CRYPTO stream kept (the ClientHello) */
#define SNIFF_QUIC_MAX_DGRAMS 8     /* datagrams fed without a decision before NONE */
#define SNIFF_QUIC_PKT_MAX 4096     /* larger Initial packets are skipped (NONE if first) */

/* Stateful QUIC Initial sniffer for one UDP flow: fed each client datagram in order until it
 * returns FOUND or NONE. Handles coalesced packets in one datagram, several Initial packets
 * (CRYPTO frames at any offsets, out of order, split across packets), decryption per RFC 9001
 * §5 (initial keys from the DCID of the client's first Initial). The CRYPTO stream is
 * reassembled into a bounded buffer (SNIFF_QUIC_CRYPTO_MAX) and parsed as a TLS handshake
 * ClientHello message (no record layer) for SNI. Gives NONE after SNIFF_QUIC_MAX_DGRAMS
 * datagrams without a decision, on a first datagram that is not an Initial, a decryption
 * failure of the first packet, or a CONNECTION_CLOSE. Later packets that do not authenticate
 * are skipped; a new DCID gets keys of its own only on a packet with a token (a client
 * answering a Retry). Once decided, further calls return the same verdict (and name). About
 * 23 KiB per sniffer. Not thread-safe: one flow, one caller at a time. */
struct sniff_quic;
int sniff_quic_new(struct sniff_quic **out); /* 0, -ENOMEM, or tlslib_load's error */
void sniff_quic_free(struct sniff_quic *q);             /* NULL ok */
enum sniff_result sniff_quic_feed(struct sniff_quic *q, const uint8_t *dgram, size_t len,
				  char name[SNIFF_NAME_MAX + 1]);

#endif
