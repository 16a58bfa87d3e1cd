/* udp.h — the UDP path both stacks share: datagrams from the TUN out through the outbounds,
 * replies back into the TUN.
 *
 * Sessions are keyed by the client's source (family, address, port): endpoint-independent
 * mapping (RFC 4787 section 4.1), so one client socket talking to many destinations is one session.
 * A session holds one unconnected outbound UDP socket per (outbound, family) it has used; each
 * datagram picks its outbound with route_select on its own destination and is sent with
 * sendto(2) to that destination. Any remote may answer on those sockets (endpoint-independent
 * filtering, fine for a proxy client); the reply is encoded as remote -> client and handed to
 * the driver's tx.
 *
 *   TUN --udp_path_input--> session(client src) --route_select(dst)--> usock(outbound, family)
 *                                                                        | sendto(dst)
 *   TUN <--------tx-------- encode(remote -> client) <----recvfrom-------'
 *
 * DNS hijack (cfg->dns.hijack): every datagram to port 53, whatever its destination (our own
 * gateway and NAT addresses included), goes to cfg->dns.upstream (the session's configuration,
 * see udp_path_set_config) instead, through a socket of
 * the `final` outbound (marked like every other). Each session has at most one such socket,
 * CONNECTED to the upstream (so the kernel only lets the upstream answer on it), and a small
 * ring of pending queries (DNS id, asked address and port; UDP_DNS_PENDING entries, the oldest
 * overwritten). An answer is matched by its DNS id and sent back to the client FROM the address
 * and port the client asked; an answer matching nothing is dropped (dns_unmatched).
 *
 * DNS sessions: resolvers ask each query from a fresh source port, so at tens of queries a
 * second, sessions held for timeouts.udp_idle_ms would exhaust budgets.udp_sessions and the
 * shared fd budget (and then TCP fails too). A session whose datagrams have all been DNS
 * queries (hijacked, or to port 53 with a DNS header with QR clear) and whose replies have all
 * been answers to them (hijacked: matched by id; otherwise QR set, an asked id, from the asked
 * server and port) is DNS only: it closes as soon as its last pending query is answered and
 * the answer is handed to the TUN (dns_done), or UDP_DNS_TIMEOUT_MS (never more than the idle
 * timeout) after its last datagram (dns_expired). So a DNS session holds one session and one
 * fd for one round trip: the budget needed is the query rate times the upstream's latency, or
 * times UDP_DNS_TIMEOUT_MS while the upstream does not answer. Any other datagram or reply
 * makes the session an ordinary one for good (another protocol on port 53 keeps its source
 * port and the idle timeout). DNS-only and ordinary sessions are on two idle-ordered lists,
 * each with one timeout and one timer; while sessions exist a spare timer holds a place in
 * libevent's timer heap for their re-arms (core/evspare.h).
 *
 * SOCKS5 (an outbound of type socks5 with "udp", RFC 1928 section 7): a session has one
 * association per such outbound it has used, whatever the destinations' families: a TCP
 * control connection (outbound_udp_associate: connect, greeting, RFC 1929 authentication,
 * UDP ASSOCIATE with DST 0.0.0.0:0) and a datagram socket in the relay's family. Datagrams
 * wait in the socket's queue (the same bounded FIFO as an EAGAIN) until the association is
 * up, and are sent with the RFC header (RSV 0, FRAG 0, ATYP 1 or 4 and the destination) to
 * the relay. Replies are taken from the relay's or the server's address on any port (relays
 * that answer from another port than BND.PORT, or from the server's address), their header
 * checked (one drop reason per fault: truncated, RSV, FRAG, ATYP, name, family), and the
 * remote in the header becomes the reply's source: endpoint-independent, like the direct
 * path. The control connection is watched: when it ends, the session ends
 * (assoc_control_closed). A failed attempt drops what waited (assoc_failed), and datagrams
 * for that outbound are dropped for UDP_ASSOC_RETRY_MS before the next attempt, so a dead
 * server costs one connection a second per session, not one per datagram. Hijacked DNS whose
 * `final` outbound is socks5 goes through an association to the upstream. An association
 * takes two descriptors from the fd budget; its session holds the session budget.
 *
 * Bounds: sessions come from budget_udp_acquire; each outbound socket's fd from
 * budget_fd_reserve; datagrams wait only within the batch that brought them (an uplink train,
 * udp_path_set_uptrains), or when the kernel says EAGAIN (sendto) or the driver does (tx), in
 * per-session FIFOs of at most budgets.udp_up_queue / udp_down_queue datagrams
 * whose buffers come from a bufpool. Every refusal is a counted drop; nothing ever blocks.
 * Sessions idle for timeouts.udp_idle_ms (no datagram either way) are closed by one timer over
 * an idle-ordered list (a touched session moves to the tail), never by a sweep.
 *
 * Loop safety: every socket comes from outbound_socket() (SO_MARK / SO_BINDTODEVICE), and
 * datagrams addressed to our own gateway or NAT addresses are dropped (own_address) unless
 * hijacked DNS.
 *
 * Threading: a path lives on one event base; call every function from that base's thread.
 * udp_path_stats may be read from any thread (relaxed counters).
 */
#ifndef TS_DISPATCH_UDP_H
#define TS_DISPATCH_UDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/driver.h"
#include "core/flow.h"
#include "core/pkt.h"

struct event_base;
struct udp_path;

/* Pending DNS queries remembered per session. */
#define UDP_DNS_PENDING 16
/* A session that has carried only DNS queries ends this long after its last datagram. */
#define UDP_DNS_TIMEOUT_MS 5000

/* Named direct destinations a session keeps (udp_path_set_namer; the oldest is replaced). */
#define UDP_DNAMES_MAX 8
/* A failed SOCKS5 association, or a name that did not resolve, is tried again this long after
 * the failure, at the next datagram. */
#define UDP_ASSOC_RETRY_MS 1000

/* Drop reasons: one counter each. */
#define UDP_DROPS(X)                                                                           \
	X(malformed)            /* codec refused it; or a hijacked query without a DNS header */ \
	X(own_address)          /* to our gateway/NAT address and not hijacked DNS */           \
	X(rejected)             /* the route chose a reject outbound */                         \
	X(unsupported_outbound) /* an outbound without UDP: http, socks5 with "udp": false */   \
	X(no_session_budget)    /* budget_udp_acquire refused the session */                    \
	X(no_memory)            /* no room in the budget or allocator: session, socket, timer */ \
	X(fd_budget)            /* budget_fd_reserve refused the outbound socket */             \
	X(socket_error)         /* outbound_socket (or connect to the DNS upstream) failed */   \
	X(queue_full)           /* up or down FIFO at its budget depth */                       \
	X(no_buffer)            /* no buffer in the budget for a datagram that had to wait */   \
	X(oversize)             /* had to wait, and larger than a queue slot (TUN MTU + 48) */  \
	X(watch_failed)         /* its socket could not be watched for room to send */          \
	X(send_error)           /* sendto failed with anything but EAGAIN */                    \
	X(tx_error)             /* the driver's tx failed with anything but EAGAIN */           \
	X(too_big)              /* a reply larger than the client's family can carry */         \
	X(dns_unmatched)        /* an upstream answer with no pending query */                  \
	X(session_closed)       /* still queued when its session ended */                       \
	X(loop)                 /* from gateway:port of one of the proxy's own sockets */       \
	X(assoc_failed)         /* its SOCKS5 association failed (queued, or in the retry wait) */ \
	X(s5_truncated)         /* from the relay: shorter than its SOCKS5 header says */       \
	X(s5_rsv)               /* from the relay: RSV not 0 */                                 \
	X(s5_frag)              /* from the relay: FRAG not 0 (fragments are not reassembled) */ \
	X(s5_atyp)              /* from the relay: ATYP not 1, 3 or 4 */                        \
	X(s5_name)              /* from the relay: an empty source name or one holding a NUL */ \
	X(s5_foreign)           /* on an association's socket, from neither relay nor server */ \
	X(s5_family)            /* from the relay: a source of the other family than the client's */ \
	X(s5_unknown_name)      /* from the relay: a source name this association never sent to */ \
	X(bad_name)             /* the namer gave a name outbound_name_valid refuses */         \
	X(resolve_failed)       /* direct to a name that did not resolve (or in the retry wait) */ \
	X(dns_busy)             /* hijacked query the resolver refused: too many wait, no memory */ \
	X(fake_unmapped)        /* to a fake-IP address that stands for no name (never sent) */

enum udp_drop {
#define UDP_DROP_ENUM(name) UDP_DROP_##name,
	UDP_DROPS(UDP_DROP_ENUM)
#undef UDP_DROP_ENUM
	UDP_DROP_MAX
};

const char *udp_drop_name(enum udp_drop d);

struct udp_path_stats {
	uint64_t sessions;          /* gauge: live sessions (stats key udp.sessions) */
	uint64_t sessions_total;    /* created */
	uint64_t sessions_expired;  /* closed by the idle timeout */
	uint64_t sockets;           /* gauge: open outbound sockets (each holds one budgeted fd) */
	uint64_t up_queued;         /* gauge: datagrams waiting for sendto */
	uint64_t down_queued;       /* gauge: packets waiting for tx */
	uint64_t up_datagrams, up_bytes;     /* sent to an outbound (payload bytes) */
	uint64_t down_datagrams, down_bytes; /* replies written to the TUN (payload bytes) */
	uint64_t dns_queries;       /* hijacked queries sent to the upstream */
	uint64_t dns_answers;       /* upstream answers delivered */
	uint64_t dns_done;          /* DNS-only sessions closed by their last answer */
	uint64_t dns_expired;       /* DNS-only sessions closed by the DNS timeout */
	uint64_t recv_errors;       /* recvfrom failures other than EAGAIN (e.g. ICMP refused) */
	uint64_t trains;            /* UDP GSO writes of replies (udp_path_set_trains) */
	uint64_t train_datagrams;   /* the replies they carried */
	uint64_t train_errors;      /* train writes that failed */
	uint64_t gro_datagrams;     /* replies read in runs (UDP GRO: several in one read) */
	uint64_t up_trains;         /* UDP GSO sends of datagrams (udp_path_set_uptrains) */
	uint64_t up_train_datagrams; /* the datagrams they carried */
	uint64_t up_train_errors;   /* train sends the kernel refused as such (no UDP GSO) */
	uint64_t assocs;            /* gauge: SOCKS5 associations up (control connection open) */
	uint64_t assocs_total;      /* associations established */
	uint64_t assoc_failures;    /* association attempts that failed (connect, auth, reply) */
	uint64_t assoc_control_closed; /* sessions ended because their control connection did */
	uint64_t resolve_failures;  /* names of direct destinations that did not resolve */
	/* route.sniff on QUIC flows: looks started, names found, looks without a name, looks
	 * that ran out of time, names that chose another outbound, names sent in the address's
	 * place (override_destination). */
	uint64_t sniff_started, sniff_quic, sniff_no_name, sniff_timeouts, sniff_route_changed,
		sniff_overridden;
	uint64_t sniff_active;      /* gauge: looks running (datagrams may be held) */
	/* Initials worth a look that went by address without one, and their sessions never
	 * looked at again: no memory (the heap or budgets.buffer_bytes), UDP_SNIFF_LOOKS looks
	 * already running, the session looking at or named by another flow. */
	uint64_t sniff_skipped_no_memory, sniff_skipped_busy, sniff_skipped_other_flow;
	/* The offload (udp_path_set_offload): flows in the kernel now (gauge), flows it took,
	 * flows it refused (they stay on this path), sessions its activity kept from expiring. */
	uint64_t fast_flows, fast_added, fast_refused, fast_kept;
	/* An idle expiry re-armed while its sessions wait (after it fired, at a reload, at a
	 * session's datagram) that libevent had no memory for: armed in the spare's place
	 * (core/evspare.h); not armed, no spare held (retried at the list's next datagram or new
	 * session). */
	uint64_t expiry_spare_used, expiry_unarmed;
	uint64_t drops[UDP_DROP_MAX];
	uint64_t queue_drops;       /* drops[queue_full] (stats key udp.queue_drops) */
};

/* Create a path on base. b and tx_arg are borrowed and must outlive it; cfg too unless
 * udp_path_set_config replaces it (then until it is released). tx sends a reply
 * packet to the TUN (plain IP, full checksums); -EAGAIN from it queues the packet and retries
 * within ~1 ms. Returns 0, -EINVAL (cfg has no outbounds), -ENOMEM or -ENOBUFS (no budget for
 * the receive buffer). */
int udp_path_new(struct event_base *base, const struct ts_config *cfg, struct budget *b,
		 tun_tx_fn tx, void *tx_arg, struct udp_path **out)
	__attribute__((warn_unused_result));

/* Replies in trains: consecutive replies of one session from one source and of one size (the
 * last may be shorter), read in one pass over its socket (up to UDP_CODEC_TRAIN_MAX), go to
 * the TUN as one UDP GSO super-datagram through tx_meta (called with udp_path_new's tx_arg);
 * the kernel cuts it into the datagrams. One write instead of one per datagram. v4 / v6: for
 * clients of that family; only for a TUN that takes UDP GSO writes (offload I/O with
 * TUN_F_USO4 / TUN_F_USO6). Replies through a SOCKS5 association, hijacked DNS answers, and
 * replies queued behind earlier ones go one by one, as before. A train the kernel refuses
 * (-EINVAL, -EOPNOTSUPP) turns trains off for that family (udp.train_errors). Grows the
 * receive buffer by 64 KiB (budget) so a train and the largest datagram after it fit; call it
 * before any traffic (the buffer is replaced). 0, -EINVAL (v4 or v6 without tx_meta),
 * -ENOBUFS (no budget: trains stay off, the path works as before) or -ENOMEM (out of memory:
 * the path has no receive buffer and must be freed). */
int udp_path_set_trains(struct udp_path *up, tun_tx_meta_fn tx_meta, bool v4, bool v6)
	__attribute__((warn_unused_result));

/* Datagrams out in trains: the datagrams one batch from the TUN carries through one direct
 * outbound socket to one destination, one after another, of one size (the last may be
 * shorter), are copied into the path's train buffer and leave in ONE sendmsg with UDP_SEGMENT
 * (UDP GSO, Linux 4.18): the kernel cuts it into the datagrams, and the per-datagram cost of
 * the send path is paid once. At most UDP_CODEC_TRAIN_MAX datagrams and one UDP datagram's
 * worth of payload per train. A train is sent when a datagram does not join it (another
 * socket or destination, a larger one, or after a shorter one), before any other send on its
 * socket (order kept), and at the latest at udp_path_batch_end: with trains on, the caller
 * MUST call udp_path_batch_end after every batch of udp_path_input / udp_path_input_view
 * calls, before returning to its loop. A train of one is a plain sendto. Only the input
 * entries gather: SOCKS5 associations, hijacked DNS, datagrams that waited (EAGAIN, a name,
 * an association, a QUIC look) and datagrams behind a queue go one by one as before.
 * A train refused with EAGAIN waits in its socket's queue in order (the usual bounded
 * queue); with EINVAL, EOPNOTSUPP or EIO (no UDP GSO on that route or device) trains are
 * turned off for the path (udp.up_train_errors, logged once at info) and its datagrams go one
 * by one; with EMSGSIZE (the segment over the route's MTU) they go one by one and the socket
 * no longer gathers datagrams that large; any other error drops them as that many sendto
 * failures would (send_error each). Call before any traffic (sockets opened before keep
 * their mode). Takes a buffer of up to 64 KiB from the budget (given back when turned off).
 * 0, -EOPNOTSUPP (this kernel has no UDP_SEGMENT: trains stay off) or -ENOBUFS (no budget:
 * trains stay off); the path works as before either way. */
int udp_path_set_uptrains(struct udp_path *up, bool on) __attribute__((warn_unused_result));

/* The end of a batch of input calls: a train still gathered is sent now. Cheap when none
 * is. */
void udp_path_batch_end(struct udp_path *up);

/* Close every session (queued datagrams counted as session_closed), release their budget and
 * free the path. NULL is fine. */
void udp_path_free(struct udp_path *up);

/* Give back the pages of the receive, SOCKS5 and uplink-train buffers (nothing waits in them
 * between callbacks and batches): for a quiet proxy; the next datagrams fault them in again. Bytes given. */
size_t udp_path_release_idle(struct udp_path *up);

/* One packet read from the TUN, untouched (the driver's DRIVER_UDP verdict). now_ns is the
 * driver's CLOCK_MONOTONIC reading (core/clock.h). Never blocks; a datagram that cannot go
 * out is dropped and counted. The packet is not retained. */
void udp_path_input(struct udp_path *up, const uint8_t *pkt, size_t len, int64_t now_ns);

/* The same datagram as the stack already parsed it (pv: a PKT_OK view from pkt_parse, the one
 * that came with the DRIVER_UDP verdict): the same checks, counters and result as
 * udp_path_input on pv->ip[0..pv->len), without parsing again. pv and the buffer it points
 * into are borrowed for the call only: the driver reuses that buffer for its next read, so
 * this must run before the driver's input returns to its loop (the driver calls it
 * synchronously). Nothing is retained. */
void udp_path_input_view(struct udp_path *up, const struct pkt_view *pv, int64_t now_ns);

/* Reload: sessions created from now on use cfg: its route rules and outbounds, and its
 * dns.upstream for hijacked DNS. A live session keeps the configuration it was created with,
 * for every datagram until it ends: its routing (each socket's outbound is an index into that
 * configuration's outbounds), its sockets and its DNS upstream (its DNS socket, opened or not
 * yet, talks to that configuration's upstream). The idle timeout is the one exception:
 * cfg's timeouts.udp_idle_ms applies to every session from this call on, live ones included
 * (one idle-ordered list, one timer), and a shorter one takes effect at once.
 *
 * What the caller guarantees equal between the current configuration and cfg (fixed at
 * udp_path_new, or the same in every configuration): tun.mtu, the budget, dns.hijack and the
 * address roles. cfg must have outbounds, must not be the current configuration, and must
 * stay alive until it is itself replaced and released, or until udp_path_free returns.
 *
 * Release rule: the configuration this call replaces is passed to release(arg, old) exactly
 * once, as soon as no session of this path holds it: inside this call when none does, else
 * when its last session closes (idle expiry), at the latest inside udp_path_free. A
 * configuration still current at udp_path_free (the one given to udp_path_new if it was never
 * replaced) is never released: its owner frees it. release (NULL: nothing to call) must not
 * call into the path; freeing old is what it is for. Each call's release and arg apply to the
 * configuration that call replaces (A -> B -> C: A with the first call's, B with the
 * second's, in whatever order their sessions close).
 *
 * Never fails: if no memory is left for the small per-configuration record, cfg waits and new
 * sessions keep the previous configuration until a later datagram's new session gets one (the
 * release rule is unchanged). */
void udp_path_set_config(struct udp_path *up, const struct ts_config *cfg,
			 void (*release)(void *arg, const struct ts_config *old), void *arg);

void udp_path_stats(const struct udp_path *up, struct udp_path_stats *out);

/* Test seam: replace sendto(2) on the outbound sockets (to make EAGAIN deterministic). fn
 * returns the bytes sent or -errno; to is NULL for the connected DNS socket. NULL restores the
 * real sendto. */
typedef ssize_t (*udp_sendto_fn)(void *arg, int fd, const void *buf, size_t len,
				 const struct sockaddr *to, socklen_t tolen);
void udp_path_set_sendto(struct udp_path *up, udp_sendto_fn fn, void *arg);
/* Test seam: replace the UDP GSO sends of uplink trains (udp_path_set_uptrains): buf holds
 * datagrams of seg bytes each (the last may be shorter). The same contract as
 * udp_sendto_fn; NULL restores the real send. A train of one goes through the sendto seam. */
typedef ssize_t (*udp_sendgso_fn)(void *arg, int fd, const void *buf, size_t len,
				  const struct sockaddr *to, socklen_t tolen, uint16_t seg);
void udp_path_set_sendgso(struct udp_path *up, udp_sendgso_fn fn, void *arg);
/* The real send, for seams that pass a send on: sendto(2), or with seg > 0 sendmsg(2) with a
 * UDP_SEGMENT control message of seg. Bytes sent or -errno. */
ssize_t udp_sendto_os(int fd, const void *buf, size_t len, const struct sockaddr *to,
		      socklen_t tolen, uint16_t seg);

/* The DNS timeout (UDP_DNS_TIMEOUT_MS unless set; never longer than the idle timeout). For
 * tests and embedders; before the first datagram. */
void udp_path_set_dns_timeout(struct udp_path *up, uint32_t ms);

/* Flows carried in the kernel (the system stack's fast path). A flow is one client source and
 * one remote, sent to by address (not a name, not hijacked DNS) through a direct outbound's
 * socket. Once datagrams to that remote have gone on for UDP_FAST_AGE_NS, the path offers the
 * flow to add: on success its datagrams and the remote's replies no longer reach this path
 * (so neither do its counters), and its session's idle time is read with seen. The path takes
 * a flow out (del) before its socket closes. All three are called on the path's thread. */
#define UDP_FAST_AGE_NS 10000000
#define UDP_FAST_MAX 4 /* flows of one session in the kernel at most */
struct udp_fast_flow {
	struct flow_key app;              /* src = the client, dst = the remote, proto UDP */
	int fd;                           /* the outbound socket carrying it now */
	const struct ts_outbound *ob;     /* that socket's outbound (mark, interface) */
	uint64_t idle_ns;                 /* the session's idle timeout */
	bool quic_handshakes;             /* QUIC handshake datagrams (long header) must still
					   * come to the path: route.sniff looks at them */
};
struct udp_offload {
	/* 0 with *cookie set (handed to del and seen), or -errno: the flow stays here. */
	int (*add)(void *arg, const struct udp_fast_flow *f, void **cookie);
	void (*del)(void *arg, void *cookie);
	/* When the flow's last datagram went out through the kernel (CLOCK_MONOTONIC ns), or
	 * -errno (then the session's own last activity counts). */
	int64_t (*seen)(void *arg, void *cookie);
};
/* ops (static) and arg stay in use until replaced: another call (NULL: no offload) first takes
 * every flow out of the old one (del), and so does udp_path_free. */
void udp_path_set_offload(struct udp_path *up, const struct udp_offload *ops, void *arg);
/* Take every flow out of the offload; they go on here and may join again (after
 * UDP_FAST_AGE_NS). For a change of routes: a flow in the kernel keeps the uplink it joined
 * with, a socket follows the routes. */
void udp_path_offload_reset(struct udp_path *up);

/* The loop check (core/loopguard.h): a datagram that would start a session although it comes
 * from the TUN's own address (gateway) and a port of one of the proxy's own live sockets is
 * the proxy's traffic routed back into the TUN: dropped (loop), never a session. Checked once
 * per would-be session, not per datagram. NULL: no check. Before the first datagram. */
struct loopguard;
void udp_path_set_loopguard(struct udp_path *up, struct loopguard *lg);

/* Log association failures, control connections that ended and names that did not resolve at
 * debug level to lg (NULL: none, the default); lg must outlive the path. */
struct log;
void udp_path_set_log(struct udp_path *up, struct log *lg);

/* Destination names (the same contract as the dispatcher's namer): called with a datagram's
 * destination (family 4 or 6, its 4 or 16 bytes, the port in host order) when it goes to a
 * socks5 or direct outbound and differs from the session's previous destination; returns a
 * name (borrowed: copied before the call returns) or NULL (by address). A name
 * outbound_name_valid refuses drops the datagram (bad_name).
 *   socks5: the datagram carries ATYP 3 and the name; a reply whose source is that name comes
 *           back from the address the client sent to.
 *   direct: the name is resolved (the outbound's resolver, or one of the path's own, with the
 *           outbound's domain_strategy; at most UDP_DNAMES_MAX named destinations per session,
 *           the oldest replaced); datagrams wait for the answer in the session's bounded queue
 *           and then go to it; replies from it come back from the address the client sent to,
 *           whatever the answer's family. A name that does not resolve drops what waited and
 *           the datagrams to it for UDP_ASSOC_RETRY_MS (resolve_failed).
 * Hijacked DNS goes to the upstream as always. NULL fn: none (the default). */
typedef const char *(*udp_namer_fn)(void *arg, int family, const uint8_t *dst, uint16_t dport);
void udp_path_set_namer(struct udp_path *up, udp_namer_fn fn, void *arg);
/* A session holds the name of the destination it last sent to (its name cache): pin(arg,
 * family, dst) when the name is kept, unpin when the session moves on to another destination
 * or ends (arg: the namer's). NULL: none. */
typedef void (*udp_pin_fn)(void *arg, int family, const uint8_t *dst);
void udp_path_set_name_pins(struct udp_path *up, udp_pin_fn pin, udp_pin_fn unpin);

/* Hijacked DNS answered by the proxy's own resolver (dns/server.h): with a server set, every
 * datagram to port 53 from the TUN (any destination) is a query for it, never a session; the
 * reply goes back from the address and port the client asked. NULL: hijacked queries are
 * forwarded to dns.upstream (when hijack is on). The server must outlive the path, or be
 * unset first; queries still waiting are cancelled by unsetting it or by udp_path_free. */
struct dns_server;
void udp_path_set_dns(struct udp_path *up, struct dns_server *dns);

#endif
