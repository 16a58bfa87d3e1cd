/* socks5_codec.h — the client side of a SOCKS5 CONNECT or UDP ASSOCIATE handshake (RFC 1928)
 * with username/password authentication (RFC 1929), and the UDP ASSOCIATE datagram header and
 * relay endpoint rules (RFC 1928 section 7), sans-IO.
 *
 * Nothing here touches a socket or the clock: builders write into caller buffers, parsers read
 * from caller buffers. Every parser is incremental and has one return convention:
 *   > 0               the message is complete; that many bytes belong to it (consumed);
 *   SOCKS5_NEED_MORE  (0) the bytes so far are a valid prefix: call again with more;
 *   < 0               -errno: the server refused or broke the protocol.
 * A parser never reads past len, whatever the bytes say (a domain length of 255 in a 10-byte
 * buffer is NEED_MORE, not an over-read). Bytes after a complete message are not looked at:
 * after the CONNECT reply they are the first bytes of the relayed stream ("early" bytes).
 *
 * struct socks5_client sequences the stages (greeting -> method -> [auth] -> CONNECT -> reply)
 * so the connector only moves bytes; the same machine is what the fuzzer drives.
 */
#ifndef TS_OUTBOUND_SOCKS5_CODEC_H
#define TS_OUTBOUND_SOCKS5_CODEC_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SOCKS5_VERSION 0x05
#define SOCKS5_AUTH_VERSION 0x01   /* RFC 1929 sub-negotiation version */
#define SOCKS5_NEED_MORE 0

enum socks5_method {
	SOCKS5_METHOD_NOAUTH = 0x00,
	SOCKS5_METHOD_USERPASS = 0x02,
	SOCKS5_METHOD_NONE_ACCEPTABLE = 0xFF,
};

enum socks5_atyp {
	SOCKS5_ATYP_IPV4 = 0x01,
	SOCKS5_ATYP_DOMAIN = 0x03,
	SOCKS5_ATYP_IPV6 = 0x04,
};

enum { SOCKS5_CMD_CONNECT = 0x01, SOCKS5_CMD_UDP_ASSOCIATE = 0x03 };

/* Largest messages, for sizing buffers. */
#define SOCKS5_GREETING_MAX 4                  /* VER NMETHODS 0x00 0x02 */
#define SOCKS5_AUTH_MAX (3 + 255 + 255)        /* VER ULEN UNAME PLEN PASSWD */
#define SOCKS5_REQUEST_MAX (4 + 1 + 255 + 2)   /* VER CMD RSV ATYP (LEN NAME) PORT */
#define SOCKS5_REPLY_MAX SOCKS5_REQUEST_MAX    /* the reply has the request's layout */
#define SOCKS5_CRED_MAX 255

/* A SOCKS5 address (DST.ADDR/BND.ADDR) with its port. */
struct socks5_addr {
	uint8_t atyp;     /* enum socks5_atyp */
	uint8_t len;      /* bytes used in a: 4, 16, or the domain length (0..255) */
	uint8_t a[255];   /* network order address, or the domain without a terminating NUL */
	uint16_t port;    /* host byte order */
};

/* dst from raw address bytes (family 4: 4 bytes, 6: 16 bytes, network order) and a port in
 * host order. 0, or -EAFNOSUPPORT for another family. */
int socks5_addr_ip(struct socks5_addr *dst, int family, const uint8_t *addr, uint16_t port);
/* dst from a domain of len bytes (1..255, no NUL inside). 0 or -EINVAL. */
int socks5_addr_domain(struct socks5_addr *dst, const char *name, size_t len, uint16_t port);

/* Builders: return the message length, -ENOSPC if cap is too small, -EINVAL on bad input. */

/* Method selection request: NO AUTHENTICATION, plus USERNAME/PASSWORD when offer_userpass
 * (a server that needs no credentials may still pick 0x00). */
int socks5_build_greeting(uint8_t *buf, size_t cap, bool offer_userpass);
/* RFC 1929 request; ulen and plen must be 1..255. */
int socks5_build_auth(uint8_t *buf, size_t cap, const char *user, size_t ulen, const char *pass,
		      size_t plen);
/* Request "VER CMD RSV ATYP DST.ADDR DST.PORT" for cmd (CONNECT or UDP ASSOCIATE) to dst
 * (ATYP 1, 3 or 4; a domain needs len >= 1). -EINVAL for another cmd. */
int socks5_build_request(uint8_t *buf, size_t cap, uint8_t cmd, const struct socks5_addr *dst);
/* CONNECT request to dst: socks5_build_request(buf, cap, SOCKS5_CMD_CONNECT, dst). */
int socks5_build_connect(uint8_t *buf, size_t cap, const struct socks5_addr *dst);
/* UDP ASSOCIATE request (RFC 1928 section 7). src is the address and port the client will
 * send its datagrams from, or NULL for 0.0.0.0:0 ("not known yet": the usual choice, since
 * the relay socket is often bound after the reply and a NATed client cannot know its source). */
int socks5_build_udp_associate(uint8_t *buf, size_t cap, const struct socks5_addr *src);

/* Parsers (convention above). */

/* Method selection reply (2 bytes). *method receives the chosen method. Errors: -EPROTO for a
 * bad version or a method we did not offer (USERPASS is offered only with offered_userpass),
 * -EACCES for 0xFF (the server accepts none of our methods: credentials missing). */
int socks5_parse_method(const uint8_t *buf, size_t len, bool offered_userpass, uint8_t *method);
/* RFC 1929 status reply (2 bytes). -EACCES for a non-zero status, -EPROTO for a version other
 * than 0x01 — except 0x05, which some servers echo by mistake and which is tolerated. */
int socks5_parse_auth_reply(const uint8_t *buf, size_t len);
/* CONNECT or UDP ASSOCIATE reply (same layout). On success the whole reply (BND.ADDR included) is consumed and *bnd (if not
 * NULL) receives BND; BND is never judged: 0.0.0.0, 127.0.0.1, an empty or odd domain are all
 * fine, a CONNECT client has no use for it; an ASSOCIATE client turns it into the relay
 * endpoint with socks5_udp_relay_endpoint. A failure code is reported as soon as byte 2 arrives,
 * mapped by socks5_reply_errno (servers often close right after a short failure reply).
 * A bad version or an unknown ATYP is -EPROTO; RSV is ignored (tolerance). */
int socks5_parse_reply(const uint8_t *buf, size_t len, struct socks5_addr *bnd);
/* REP -> -errno (RFC 1928 section 6): 0x01 -EPROTO, 0x02 -EACCES, 0x03 -ENETUNREACH,
 * 0x04 -EHOSTUNREACH, 0x05 -ECONNREFUSED, 0x06 -ETIMEDOUT, anything else -EPROTO; 0x00 -> 0. */
int socks5_reply_errno(uint8_t rep);

/* ---- UDP ASSOCIATE: the relay endpoint and the datagram header (RFC 1928 section 7) ---- */

/* Where to send datagrams, from the reply's BND and the address the control connection reached
 * (server: ATYP 1 or 4 with a port). An IPv4-mapped IPv6 address (::ffff:a.b.c.d), as a
 * dual-stack server may print its relay socket, stands for the IPv4 address it carries, for BND
 * and server alike: the outbound's IPv6 sockets are IPv6-only, so a mapped relay kept as IPv6
 * could never be reached. Rules, in order:
 *  1. BND is a domain: kept as given (the caller resolves it); an empty one is -EPROTO.
 *  2. BND.PORT 0: -EPROTO (no datagram can be sent to port 0).
 *  3. BND.ADDR unspecified (0.0.0.0 or ::, of either family): the server's address with
 *     BND.PORT. Servers bound to the wildcard report it; RFC 1928 leaves the case open and
 *     common clients (curl, Firefox, Dante) all fall back to the server's address.
 *  4. BND.ADDR loopback (127/8, ::1) while the server is not on loopback: the
 *     server's address with BND.PORT. Such a server reports its relay socket's local address
 *     from behind a port forward or a container; loopback from afar can never be right. A
 *     server that is itself on loopback keeps its loopback BND (possibly another address of
 *     127/8).
 *  5. Otherwise BND as given, even when its family differs from the server's (a server reached
 *     over IPv6 may relay on IPv4: a dual-stack host then sends from the other family).
 * Returns 0 with *relay set, -EPROTO as above, -EINVAL for a server that is not an IP. */
int socks5_udp_relay_endpoint(const struct socks5_addr *bnd, const struct socks5_addr *server,
			      struct socks5_addr *relay);

/* Datagram header "RSV(2) FRAG ATYP DST.ADDR DST.PORT" sizes. */
#define SOCKS5_UDP_HDR_MIN (3 + 1 + 4 + 2)           /* an IPv4 address */
#define SOCKS5_UDP_HDR_MAX (3 + 1 + 1 + 255 + 2)     /* a 255-byte name */
#define SOCKS5_UDP_DGRAM_MAX 65507                   /* header + payload: the largest UDP
                                                      * payload over IPv4 */

/* Header length for dst (ATYP 1, 3 or 4 as in socks5_build_request), or -EINVAL. Lets the
 * caller receive a payload at buf + header length and build the header in front of it. */
int socks5_udp_header_len(const struct socks5_addr *dst);
/* Header to dst (RSV 0, FRAG 0: this side never fragments) followed by plen payload bytes.
 * payload may lie anywhere, inside buf included (it is moved, not copied); NULL if plen is 0.
 * Returns the datagram length, -EINVAL for a bad dst, -EMSGSIZE if header + payload exceed
 * SOCKS5_UDP_DGRAM_MAX, -ENOSPC if cap is too small. */
int socks5_udp_build(uint8_t *buf, size_t cap, const struct socks5_addr *dst,
		     const uint8_t *payload, size_t plen);

/* Why a datagram from the relay was refused: each is a distinct -errno, so the caller can keep
 * one counter per reason (socks5_udp_drop_reason gives the counter index). */
#define SOCKS5_UDP_ETRUNC (-EBADMSG)     /* shorter than its header says */
#define SOCKS5_UDP_ERSV (-EPROTO)        /* RSV not 0: RFC 1928 fixes it to X'0000' */
#define SOCKS5_UDP_EFRAG (-ENOTSUP)      /* FRAG not 0: fragments are not reassembled */
#define SOCKS5_UDP_EATYP (-EAFNOSUPPORT) /* ATYP not 1, 3 or 4 */
#define SOCKS5_UDP_ENAME (-EINVAL)       /* a domain source that is empty or holds a NUL */

enum socks5_udp_drop {
	SOCKS5_UDP_DROP_TRUNCATED,
	SOCKS5_UDP_DROP_RSV,
	SOCKS5_UDP_DROP_FRAG,
	SOCKS5_UDP_DROP_ATYP,
	SOCKS5_UDP_DROP_NAME,
	SOCKS5_UDP_DROP_MAX,  /* number of reasons; also the answer for an unknown code */
};

/* A datagram from the relay, parsed. payload points into the caller's buffer. */
struct socks5_udp_dgram {
	struct socks5_addr src;   /* the remote host the payload came from (or its name) */
	size_t hdr_len;           /* bytes of header: payload == buf + hdr_len */
	const uint8_t *payload;
	size_t payload_len;       /* may be 0 */
};

/* Parse one whole datagram (UDP keeps message boundaries: no NEED_MORE here). Returns 0 and
 * fills *d, or one of the SOCKS5_UDP_E* codes: ETRUNC if shorter than the 4 fixed bytes, then
 * in wire order RSV, FRAG, ATYP, ETRUNC if shorter than the address says, the name. A
 * domain source is returned in d->src as it came (atyp 3, 1..255 bytes). RSV is strict: every relay we
 * know of sends 0 and a non-zero RSV means the bytes are not a SOCKS5 UDP header at all (a
 * stray datagram to the client's port). Never reads past len. */
int socks5_udp_parse(const uint8_t *buf, size_t len, struct socks5_udp_dgram *d);
/* The counter index for a socks5_udp_parse error (SOCKS5_UDP_DROP_MAX for anything else). */
enum socks5_udp_drop socks5_udp_drop_reason(int err);

/* ---- the client sequence ---- */

enum socks5_client_state {
	SOCKS5_CL_METHOD,  /* greeting sent, waiting for the method selection */
	SOCKS5_CL_AUTH,    /* RFC 1929 request sent, waiting for its status */
	SOCKS5_CL_REPLY,   /* CONNECT sent, waiting for the reply */
	SOCKS5_CL_DONE,    /* tunnel established: further bytes belong to the stream */
	SOCKS5_CL_FAILED,  /* err holds the -errno; the machine accepts no more input */
};

struct socks5_client {
	enum socks5_client_state state;
	int err;                          /* valid in SOCKS5_CL_FAILED */
	bool has_auth;
	uint8_t ulen, plen;
	char user[SOCKS5_CRED_MAX];       /* copies: the machine owns everything it needs */
	char pass[SOCKS5_CRED_MAX];
	uint8_t cmd;                      /* SOCKS5_CMD_CONNECT or SOCKS5_CMD_UDP_ASSOCIATE */
	struct socks5_addr dst;
	struct socks5_addr bnd;           /* from the reply, valid in SOCKS5_CL_DONE */
	uint8_t method;                   /* chosen by the server */
};

/* Prepare a handshake to dst; user/pass NULL for no authentication, otherwise both 1..255
 * bytes (NUL-terminated). Writes the greeting to out and returns its length, or -errno
 * (-EINVAL bad credentials or dst, -ENOSPC small out). */
int socks5_client_start(struct socks5_client *c, const struct socks5_addr *dst, const char *user,
			const char *pass, uint8_t *out, size_t cap);

/* The same for another command: SOCKS5_CMD_CONNECT, or SOCKS5_CMD_UDP_ASSOCIATE with dst the
 * address the datagrams will come from (0.0.0.0:0 when not known, see
 * socks5_build_udp_associate). The sequence is the same; in DONE, bnd is the relay's BND
 * (socks5_udp_relay_endpoint). -EINVAL for another cmd. */
int socks5_client_start_cmd(struct socks5_client *c, uint8_t cmd, const struct socks5_addr *dst,
			    const char *user, const char *pass, uint8_t *out, size_t cap);

/* Feed server bytes. Parses at most ONE message, so the caller sends what this returns before
 * feeding the rest (the order on the wire stays request, reply, request...). Returns consumed
 * (> 0), SOCKS5_NEED_MORE or -errno (the state is then FAILED with err set; calling again
 * returns err). *out_len receives the length of the next request written to out (0 if none).
 * When the state becomes DONE, in[consumed..len) are early stream bytes.
 * Out needs room for SOCKS5_AUTH_MAX bytes (or -ENOSPC). */
int socks5_client_input(struct socks5_client *c, const uint8_t *in, size_t len, uint8_t *out,
			size_t cap, size_t *out_len);

#endif
