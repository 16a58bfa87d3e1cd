/* dispatcher.h — the dispatcher: a stack hands it an accepted TCP connection, it picks an
 * outbound, connects, and relays until the connection is over.
 *
 * A session = the original 5-tuple + the stack-side stream (a kernel socket for the system
 * stack, an lwIP tcp_pcb for the lwIP stack) + optionally the destination's name, from the
 * namer the embedder installed (dispatcher_set_namer): the outbound then connects to the name
 * instead of the address (outbound_connect_name), and the route sees the name too. Its
 * life:
 *
 *   dispatcher_start_tcp ──> CONNECTING ──outbound ok──> RELAYING ──relay done──> ended, on_end
 *                              │   └──outbound failed / client reset──> abort client (RST), on_end
 *                              └── refused before connecting (reject, fd budget, own address):
 *                                  deferred to the loop, then abort client (RST), on_end
 *   dispatcher_start_tcp (port 53, DNS hijack: dispatcher_set_dns) ──> DNS (dispatch/dns_tcp.h:
 *                              answered by the proxy's resolver) ──connection over──> on_end
 *
 * on_end is the stack's guard (mark the NAT entry Closing, release the admission permit and the
 * client's fd reservation): it runs exactly once per accepted session however the session ends,
 * dispatcher_free included, always after the client stream has been closed or aborted, and
 * never from inside dispatcher_start_tcp.
 *
 * Descriptors: the caller reserved the client's fd; the dispatcher reserves one for the
 * outbound socket BEFORE connecting (refused -> RST, counted as fd_budget) and releases it when
 * that socket is closed; splice pipes reserve theirs through the pipe pool.
 *
 * Single-threaded: one dispatcher per event loop; every call on that loop's thread.
 */
#ifndef TS_DISPATCH_DISPATCHER_H
#define TS_DISPATCH_DISPATCHER_H

#include <stdint.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/flow.h"
#include "dispatch/dns_tcp.h"
#include "dispatch/relay.h"
#include "dispatch/stream.h"

struct event_base;
struct dispatcher;

/* Why a session never reached the relay (one counter each). */
enum dispatcher_fail {
	DISPATCHER_FAIL_REFUSED,     /* the server (or a proxy's target) refused: ECONNREFUSED */
	DISPATCHER_FAIL_TIMEOUT,     /* connect (+ handshake) exceeded timeouts.connect_ms */
	DISPATCHER_FAIL_UNREACHABLE, /* EHOSTUNREACH, ENETUNREACH, ENETDOWN, EHOSTDOWN */
	DISPATCHER_FAIL_RESET,       /* ECONNRESET during connect or handshake */
	DISPATCHER_FAIL_PROTO,       /* EPROTO: a proxy server broke the protocol or said no */
	DISPATCHER_FAIL_DENIED,      /* EACCES: a proxy server refused our credentials or access
				      * (SOCKS5 auth or REP 0x02, HTTP 407) */
	DISPATCHER_FAIL_REJECT,      /* the route chose a reject outbound */
	DISPATCHER_FAIL_FD_BUDGET,   /* no descriptor for the outbound socket (budget or EMFILE) */
	DISPATCHER_FAIL_OWN_ADDRESS, /* destined to our gateway/NAT address (the stack drops these) */
	DISPATCHER_FAIL_CLIENT,      /* the app's side failed while connecting */
	DISPATCHER_FAIL_RESOURCE,    /* ENOMEM, ENOBUFS */
	DISPATCHER_FAIL_RESOLVE,     /* a name did not resolve: ENXIO (no such name or no address
				      * of the allowed families), EAGAIN (temporary failure) */
	DISPATCHER_FAIL_BAD_NAME,    /* the namer gave a name that is not outbound_name_valid */
	DISPATCHER_FAIL_FAKE_UNMAPPED, /* the namer gave "": a fake-IP address that stands for no
				      * name any more (never connected to) */
	DISPATCHER_FAIL_OTHER,       /* anything else (e.g. EPERM setting SO_MARK) */
	DISPATCHER_FAIL_MAX
};

const char *dispatcher_fail_name(enum dispatcher_fail f);

/* Create a dispatcher on base. cfg and b are borrowed: b must outlive it, cfg too unless
 * dispatcher_set_config replaces it (then until it is released). Creates the relay
 * buffer pool (relay.buffer_bytes per buffer, bounded by the budget) and, for relay.mode
 * "splice", the pipe pool (pipe capacity relay.buffer_bytes). Returns 0, -EINVAL, -ENOMEM. */
int dispatcher_new(struct event_base *base, const struct ts_config *cfg, struct budget *b,
		   struct dispatcher **out) __attribute__((warn_unused_result));

/* End every live session (connecting ones are cancelled, relays aborted: RST to the apps; each
 * on_end runs once, from inside this call) and free the dispatcher. on_end must not call
 * dispatcher_start_tcp. NULL is fine. */
void dispatcher_free(struct dispatcher *d);

/* Start a session for client, an accepted connection whose original destination is orig.
 * Whatever happens, the dispatcher takes client and on_end(end_arg) runs exactly once: every
 * failure (routing to reject, fd budget, connect errors) ends with client aborted (a prompt
 * RST), counted by reason, then on_end. Returns 0, with on_end deferred to the loop (never run
 * inside this call); or, when no session could even be created (-ENOMEM, or -ESHUTDOWN while
 * dispatcher_free runs), client was aborted and on_end already ran before the return: the
 * value is informational, the caller's cleanup is the same either way. orig must not be
 * addressed to one of our own addresses (asserted; refused as own_address in release), except
 * a DNS session (dispatcher_set_dns). */
int dispatcher_start_tcp(struct dispatcher *d, const struct flow_key *orig, struct stream *client,
		 void (*on_end)(void *arg), void *end_arg);

/* Names a new session's destination. Called once per session by dispatcher_start_tcp, before
 * the route and the outbound connect, with the destination the app connected to: family 4 or
 * 6, dst its 4 or 16 bytes (network order), dport in host order. Returns the name (borrowed:
 * read before the call returns, copied into the session) or NULL for none. A name that is not
 * outbound_name_valid (outbound/outbound.h: at most 255 bytes of letters, digits, '-', '_',
 * '.') refuses the session with a prompt RST, counted as bad_name ("" as fake_unmapped: the
 * address stands for a name no more). Runs on the loop's thread;
 * it must not call into the dispatcher. */
typedef const char *(*dispatcher_namer_fn)(void *arg, int family, const uint8_t *dst,
					   uint16_t dport);

/* Log each outbound failure (destination, outbound, reason) at debug level to lg (NULL:
 * none, the default); lg must outlive the dispatcher. */
struct log;
void dispatcher_set_log(struct dispatcher *d, struct log *lg);

/* Install the namer (fn NULL: none, the default) for sessions started from now on. */
void dispatcher_set_namer(struct dispatcher *d, dispatcher_namer_fn fn, void *arg);

/* A session that took a name from the namer holds it while it lives: pin(arg, family, dst) once
 * the name is kept, unpin at the session's end (arg: the namer's). Fake-IP uses it so that an
 * address a live session stands on is never handed to another name. NULL: none. */
typedef void (*dispatcher_pin_fn)(void *arg, int family, const uint8_t *dst);
void dispatcher_set_name_pins(struct dispatcher *d, dispatcher_pin_fn pin, dispatcher_pin_fn unpin);

/* Hijacked DNS over TCP (dispatch/dns_tcp.h). With a resolver set and dns.hijack on in the
 * current configuration, a session started from now on whose destination port is 53 (any
 * address, our gateway included) is not routed or connected out: the proxy answers its
 * queries with r. It is admitted like every session (the stack's TCP permit and the client's
 * fd reservation; no outbound fd) and ends likewise: on_end once, after the client stream was
 * closed (the app's FIN and every reply written, or idle) or aborted (a reset, a bad length,
 * dispatcher_free), every outstanding ticket cancelled. The namer is not asked for it.
 * r is copied; what it points to must outlive every DNS session. NULL: off for new sessions
 * (live ones finish with the resolver they have). Another resolver only while no DNS session
 * lives (asserted). The stack must let TCP to gateway:53 in (netstack_env.dns_tcp) exactly
 * when this is set. */
void dispatcher_set_dns(struct dispatcher *d, const struct dns_tcp_resolver *r);

/* Reload: sessions started from now on use cfg (route rules, outbounds, timeouts.connect_ms
 * and timeouts.relay_idle_ms). Live sessions are untouched: each keeps the configuration it
 * was created with, its outbound (a pointer into that configuration's outbounds, borrowed by a
 * connect or SOCKS5 handshake in flight) and its timeouts, until it ends.
 *
 * What the caller guarantees equal between the current configuration and cfg (fixed at
 * dispatcher_new, never re-read): relay.mode, relay.buffer_bytes, relay.pipe_bytes, the budget
 * and the address roles (own-address refusal). cfg must have outbounds, must not be the
 * current configuration, and must stay alive until it is itself replaced and released, or
 * until dispatcher_free returns.
 *
 * Release rule: the configuration this call replaces is passed to release(arg, old) exactly
 * once, as soon as no session of this dispatcher holds it: inside this call when none does,
 * else when its last session ends (from the loop), at the latest inside dispatcher_free. A
 * configuration still current at dispatcher_free (the one given to dispatcher_new if it was
 * never replaced) is never released: its owner frees it. release (NULL: nothing to call) must
 * not call into the dispatcher; freeing old is what it is for. Each call's release and arg
 * apply to the configuration that call replaces, so A -> B -> C releases A with the first
 * call's and B with the second's, in whatever order their sessions end.
 *
 * Never fails: if no memory is left for the small per-configuration record, cfg waits and new
 * sessions keep the previous configuration until a later dispatcher_start_tcp gets one (the
 * release rule is unchanged). Not during dispatcher_free. */
void dispatcher_set_config(struct dispatcher *d, const struct ts_config *cfg,
			   void (*release)(void *arg, const struct ts_config *old), void *arg);

/* Everything the stats endpoint shows about sessions, relays, pipes and relay buffers. */
/* route.sniff on TCP sessions. */
struct dispatcher_sniff_stats {
	uint64_t active;         /* sessions waiting for their first bytes now */
	uint64_t started;        /* sessions looked at */
	uint64_t found[2];       /* names found: [0] TLS SNI, [1] HTTP Host */
	uint64_t no_name;        /* looked at, no name: another protocol, no SNI, EOF, too long */
	uint64_t timeouts;       /* no decision within timeout_ms: routed by address */
	uint64_t route_changed;  /* the name chose another outbound than the address alone */
	uint64_t overridden;     /* override_destination: the name went to the outbound */
	uint64_t skipped_no_memory; /* no memory for the look (its buffer, its timer): by address */
};

struct dispatcher_stats {
	uint64_t sessions_active;      /* connecting + relaying + DNS (dns_tcp.live) */
	uint64_t sessions_connecting;
	uint64_t sessions_total;       /* accepted by dispatcher_start_tcp since start */
	uint64_t sessions_refused;     /* sum of fail[] */
	uint64_t fail[DISPATCHER_FAIL_MAX];
	uint64_t relay_ends[RELAY_END_MAX];
	uint64_t bytes_up, bytes_down; /* app -> server, server -> app */
	uint64_t splice_bytes, copy_bytes;
	uint64_t gather_bytes;         /* of copy_bytes: from the source's buffers, one writev */
	uint64_t pipe_fallbacks, buf_waits;
	uint64_t pipes_in_use, pipes_idle, pipes_reclaimed;
	uint64_t pipes_refused;         /* pipes the fd budget had no room for (the relay copied) */
	uint64_t pipe_bytes;           /* kernel capacity of all open pipes */
	uint64_t pipe_bytes_inflight;  /* bytes now inside pipes */
	uint64_t buffer_bytes_in_use, buffer_bytes_peak, buffer_bytes_cached; /* relay bufpool */
	uint64_t buffer_bytes_inflight; /* bytes now inside relay buffers (+ early bytes) */
	uint64_t heap_trims;           /* memory given back after a load fell (dispatcher.c) */
	struct dns_tcp_stats dns_tcp;  /* TCP/53 sessions answered by the resolver */
	struct dispatcher_sniff_stats sniff;
};
void dispatcher_get_stats(const struct dispatcher *d, struct dispatcher_stats *out);

#endif
