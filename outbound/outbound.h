/* outbound.h — how sessions leave the machine: direct, SOCKS5 (CONNECT), HTTP CONNECT, reject.
 *
 * Every socket an outbound opens is marked (SO_MARK) and/or bound to an interface
 * (SO_BINDTODEVICE) as configured, so the proxy's own traffic never re-enters the TUN.
 * Connecting is asynchronous on the caller's libevent base; the result is a connected,
 * non-blocking kernel socket (plus any bytes a proxy server sent past its handshake reply, which
 * the relay must deliver before anything else). A failure is reported as -errno so the caller
 * can answer the app with a prompt RST instead of a hang. The destination is the address the app
 * connected to, or a name the session carries (outbound_connect_name).
 */
#ifndef TS_OUTBOUND_OUTBOUND_H
#define TS_OUTBOUND_OUTBOUND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/config.h"
#include "core/flow.h"

struct event_base;

/* A socket for an outbound's traffic: SOCK_NONBLOCK | SOCK_CLOEXEC (family 6: IPV6_V6ONLY,
 * so an IPv4-mapped destination never reaches IPv4 through it), SO_MARK and
 * SO_BINDTODEVICE applied from ob, then ob->sock_hook (if set) called on it, then (with
 * ob->loopguard, a datagram socket) bound to the wildcard address and port 0 unless the hook
 * bound it, and recorded (core/loopguard.h). family 4 or 6;
 * type SOCK_STREAM or SOCK_DGRAM. Returns 0 and *fd_out, or -errno (e.g. -EPERM for SO_MARK
 * without CAP_NET_ADMIN, or what the hook returned). */
int outbound_socket(const struct ts_outbound *ob, int family, int type, int *fd_out)
	__attribute__((warn_unused_result));

/* Called exactly once (never from inside outbound_connect itself) with:
 *   err == 0: fd is a connected non-blocking TCP socket now owned by the callee; early holds
 *             early_len bytes the server sent after its handshake reply (SOCKS5), usually 0;
 *             early is BORROWED: valid only during this call (copy what must outlive it);
 *             NULL when early_len is 0;
 *   err < 0:  -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH, -ENETUNREACH, -ECONNRESET,
 *             -EPROTO (a proxy server broke the protocol or refused), -EACCES (SOCKS5:
 *             credentials rejected or required, or REP 0x02 "not allowed"; HTTP: status 407 or 401),
 *             -EMSGSIZE (HTTP: a response head over 8 KiB), ...; fd is -1.
 *             An HTTP proxy's other non-2xx statuses are -ECONNREFUSED.
 * The attempt's handle is invalid once done starts: done must not cancel it. */
typedef void (*outbound_done_fn)(void *arg, int err, int fd, const uint8_t *early,
				 size_t early_len);

struct outbound_conn;

/* Start connecting through ob to the destination of key (key->dst, key->dport_be).
 * A reject outbound reports -ECONNREFUSED (deferred to the loop). timeout_ms (> 0) bounds the
 * whole attempt (TCP connect plus any proxy handshake). Returns 0 with *out (a handle valid
 * until done runs or outbound_conn_cancel is called), or -errno if nothing could be started
 * (then done is never called): -EINVAL bad arguments, -EAFNOSUPPORT, socket errors such as
 * -EMFILE or -EPERM (SO_MARK without CAP_NET_ADMIN). A SOCKS5 or HTTP server configured by host name
 * and not pinned is resolved asynchronously (outbound/resolver.h, ob->resolver or a resolver of
 * the attempt's own) within timeout_ms: done then gets -ENXIO (no such host), -EAGAIN
 * (temporary resolver failure) or -ETIMEDOUT. Single-threaded: call, cancel and the callback
 * all happen on the thread running base. */
int outbound_connect(struct event_base *base, const struct ts_outbound *ob,
		     const struct flow_key *key, uint32_t timeout_ms, outbound_done_fn done,
		     void *arg, struct outbound_conn **out) __attribute__((warn_unused_result));

/* a and b are configured to make the same connections: every field from the config that a
 * socket or a proxy server sees is equal (the tag is not one of them; a server name pinned in
 * both must be pinned to one address). The running proxy's wiring (socket hook, loop guard,
 * log, resolver, budget) is not compared: the proxy gives it to every configuration, and a
 * copy taken early in the start predates part of it. For a reload: whether what holds a copy
 * of an outbound (a DNS upstream's detour) must take the new one. */
bool outbound_same(const struct ts_outbound *a, const struct ts_outbound *b);

/* The longest destination name, in bytes (RFC 1928's DOMAINNAME length octet). */
#define OUTBOUND_NAME_MAX 255

/* A name outbound_connect_name accepts: 1..OUTBOUND_NAME_MAX bytes of ASCII letters, digits,
 * '-', '_' and '.' (a DNS name in its ASCII form, internationalized names as A-labels). Nothing
 * else, so that a name can never change the meaning of a proxy request (no space, CR, LF, ':',
 * '/', '@' or control character). */
bool outbound_name_valid(const char *name);

/* outbound_connect to the destination known by name (NULL: by address, exactly
 * outbound_connect), at key->dport_be; key->dst is the address the app connected to and is not
 * dialled. Per type:
 *   socks5  CONNECT with ATYP 3 (DOMAINNAME) and the name: the server resolves it;
 *   http    "CONNECT name:port HTTP/1.1" and "Host: name:port": the proxy resolves it;
 *   direct  the name resolved without blocking (ob->resolver, or a resolver of the attempt's
 *           own), the families and order given by ob->domain_strategy (prefer_ipv6: both, IPv6
 *           first as RFC 8305 section 4; prefer_ipv4; ipv4_only; ipv6_only), then connected with
 *           Happy Eyeballs; timeout_ms bounds lookup and connects together. done gets -ENXIO
 *           (no such name, or no address of the allowed families), -EAGAIN (a temporary
 *           resolver failure), -ETIMEDOUT, or the connect error of the last address tried;
 *   reject  -ECONNREFUSED, as always.
 * A name that is not outbound_name_valid is -EINVAL (nothing started). name is borrowed for
 * the call only. Otherwise as outbound_connect. */
int outbound_connect_name(struct event_base *base, const struct ts_outbound *ob,
			  const struct flow_key *key, const char *name, uint32_t timeout_ms,
			  outbound_done_fn done, void *arg, struct outbound_conn **out)
	__attribute__((warn_unused_result));

/* Abandon an attempt before done ran: closes its socket; done is never called. */
void outbound_conn_cancel(struct outbound_conn *c);

/* A SOCKS5 UDP association (RFC 1928 section 7), established. */
struct outbound_assoc {
	int ctl_fd;                       /* the control connection, owned by the callee: the
	                                   * association lives exactly as long as it stays open */
	struct sockaddr_storage relay;    /* where datagrams go (socks5_udp_relay_endpoint) */
	socklen_t relay_len;
	struct sockaddr_storage server;   /* the server the control connection reached */
	socklen_t server_len;
};

/* Called exactly once, like outbound_done_fn: err 0 with *a (borrowed for the call; ctl_fd
 * then belongs to the callee), or -errno with a NULL (the codes of outbound_done_fn, -EPROTO
 * also for a relay endpoint no datagram can be sent to). */
typedef void (*outbound_assoc_fn)(void *arg, int err, const struct outbound_assoc *a);

/* Start a UDP ASSOCIATE through ob (type socks5): connect to its server (by address, pinned
 * name or asynchronous lookup, as outbound_connect), greeting, RFC 1929 authentication when
 * ob has credentials, then UDP ASSOCIATE with DST 0.0.0.0:0 (the datagrams' source is not
 * known: they come from a socket opened after the reply, possibly behind a NAT). The relay is
 * the reply's BND after socks5_udp_relay_endpoint's rules; a BND given as a domain name is
 * taken as the server's own address with BND.PORT (servers name themselves; the control
 * connection already reached that host). timeout_ms bounds the whole attempt. Returns 0 with
 * *out (cancel with outbound_conn_cancel until done runs), or -errno as outbound_connect
 * (-EINVAL for another type). */
int outbound_udp_associate(struct event_base *base, const struct ts_outbound *ob,
			   uint32_t timeout_ms, outbound_assoc_fn done, void *arg,
			   struct outbound_conn **out) __attribute__((warn_unused_result));

#endif
