/* redirect_lib.h — the pure parts of `twinstack redirect` (cli/redirect.c), apart from the
 * program so the unit tests can drive them: the values of its options, and what an accepted
 * connection's addresses make of it (the session's flow key, or why it is refused).
 *
 * No I/O, no clock, no shared state.
 */
#ifndef TS_CLI_REDIRECT_LIB_H
#define TS_CLI_REDIRECT_LIB_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/config.h"
#include "core/flow.h"
#include "core/netaddr.h"

/* What the command line asks for. */
struct redirect_opts {
	bool has_listen4, has_listen6, has_stats, has_socks5, has_udp_to;
	bool has_udp, has_udp6;      /* --udp-listen, --udp-listen6 */
	struct netaddr_ep listen4;   /* IPv4 listener (family 4) */
	struct netaddr_ep listen6;   /* IPv6 listener (family 6) */
	struct netaddr_ep stats;     /* the /stats endpoint, a loopback address */
	struct netaddr_ep socks5;    /* the SOCKS5 server, with has_socks5 (else direct) */
	struct netaddr_ep udp_listen; /* the UDP forwarder's IPv4 socket, with has_udp */
	struct netaddr_ep udp_listen6; /* its IPv6 socket, with has_udp6 */
	struct netaddr_ep udp_to;    /* where it forwards to, with has_udp_to */
	uint32_t udp_idle_ms;        /* a flow's idle time; 0: the configuration's default */
	uint32_t mark;               /* SO_MARK of the outbound sockets, 1..UINT32_MAX */
	enum ts_relay_mode relay;
};

/* A listener "ADDR:PORT" of the family (4 or 6; IPv6 as "[ADDR]:PORT"), or ":PORT" for the
 * family's loopback address (127.0.0.1, ::1: where nftables' redirect in the output hook
 * sends locally generated connections). 0 or -EINVAL (another family, a bad port, port 0). */
int redirect_parse_listen(const char *s, int family, struct netaddr_ep *out);

/* A routing mark: decimal or 0x-prefixed hexadecimal, 1..4294967295, nothing else (no sign,
 * no space). 0 is refused: an unmarked outbound socket would be redirected again. 0 or
 * -EINVAL. */
int redirect_parse_mark(const char *s, uint32_t *out);

/* "splice" or "copy". 0 or -EINVAL. */
int redirect_parse_relay(const char *s, enum ts_relay_mode *out);

/* The stats endpoint: "ADDR:PORT" or "[ADDR]:PORT" on a loopback address (the counters
 * describe the user's traffic). 0 or -EINVAL. */
int redirect_parse_stats(const char *s, struct netaddr_ep *out);

/* A SOCKS5 server "ADDR:PORT" or "[ADDR]:PORT", an address literal (no name: nothing here
 * resolves), neither the unspecified address nor a multicast one. 0 or -EINVAL. */
int redirect_parse_socks5(const char *s, struct netaddr_ep *out);

/* The UDP forwarder's two ends, checked together:
 *   -EINVAL  listen is the unspecified address: replies would leave from the address the route
 *            picks, not the one the datagram reached, and conntrack could not give them back
 *            their original source;
 *   -ELOOP   to is the forwarder itself (the same port, and the listen address or, when that
 *            is a loopback address, any loopback address): each hop would come back as a new
 *            flow until the budget ran out.
 * 0 otherwise. */
int redirect_udp_check(const struct netaddr_ep *listen, const struct netaddr_ep *to)
	__attribute__((warn_unused_result));

/* An accepted connection: peer is its source (accept), local the address it reached on our
 * listener (getsockname), orig the destination before the redirect (SO_ORIGINAL_DST /
 * IP6T_SO_ORIGINAL_DST). Returns 0 with *key (TCP, peer -> orig), or
 *   -EAFNOSUPPORT  an address that is not IPv4/IPv6, or families that differ;
 *   -ELOOP         orig is local itself: nothing was redirected (a client connected to the
 *                  listener directly, or a rule sent the listener's own address to it), so
 *                  connecting there would only come back to us. */
int redirect_session_key(const struct sockaddr_storage *peer, const struct sockaddr_storage *local,
			 const struct sockaddr_storage *orig, struct flow_key *key)
	__attribute__((warn_unused_result));

#endif
