/* udp_int.h — the UDP path's internals, shared by its files: udp.c (sessions, sockets,
 * replies, the TUN side), udp_uptrain.c (datagrams out in trains), udp_assoc.c (SOCKS5
 * associations) and udp_names.c (destinations by name). Not for use outside dispatch/udp*.c;
 * the contracts are in udp.h.
 */
#ifndef TS_DISPATCH_UDP_INT_H
#define TS_DISPATCH_UDP_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "core/counter.h"
#include "core/evspare.h"
#include "core/udp_codec.h"
#include "dispatch/cfg_gen.h"
#include "dispatch/udp.h"
#include "outbound/outbound.h"

struct bufpool;
struct resolver;
struct resolver_query;

/* A datagram that had to wait, at the start of a pool buffer; its bytes follow. Up: the
 * payload and where it goes (through an association: to a name, when namelen > 0, whose bytes
 * follow the payload's). Down: the encoded IP packet (to unused). */
struct qdgram {
	STAILQ_ENTRY(qdgram) link;
	uint32_t len;
	uint16_t namelen;
	socklen_t tolen;
	struct sockaddr_storage to;
};
STAILQ_HEAD(qdgram_list, qdgram);

static inline uint8_t *qdata(struct qdgram *q)
{
	return (uint8_t *)(q + 1);
}

/* The session key: the client's source. 20 bytes without holes, compared as memory. */
struct skey {
	uint8_t family;
	uint8_t zero;
	uint16_t port_be;
	uint8_t addr[16];
};

/* One hijacked query waiting for its answer: the answer will come FROM addr:port_be. */
struct dns_pending {
	bool used;
	uint16_t txid;    /* as on the wire */
	uint16_t port_be;
	uint8_t addr[16];
};

struct udp_session;
struct usniff;

/* A flow of a session the offload may carry (udp_path_set_offload): a candidate while its
 * datagrams have gone on for less than UDP_FAST_AGE_NS, then in the kernel (cookie) or
 * refused for good. */
enum ufast_state { UF_FREE, UF_CANDIDATE, UF_IN, UF_REFUSED };
struct ufast {
	uint8_t state;
	uint16_t dport_be;
	uint8_t dst[16];
	int64_t since_ns;        /* the first datagram seen to it */
	struct usock *k;         /* UF_IN: the socket whose port the kernel sends from */
	void *cookie;            /* UF_IN: the offload's */
};

/* A destination known by name through a direct outbound: the name resolved (outbound/
 * resolver.h), datagrams to it waiting meanwhile, then sent to the answer; replies from the
 * answer come back from the address the client sent to (vaddr). */
enum dname_state { DN_RESOLVING, DN_READY, DN_FAILED };
struct dname {
	TAILQ_ENTRY(dname) link;
	struct udp_session *s;
	uint32_t ob;
	uint16_t port_be;
	uint8_t vaddr[16];              /* the address the client sent to (its family) */
	enum dname_state state;
	int64_t retry_ns;               /* DN_FAILED: no new lookup before this */
	struct resolver_query *rq;      /* DN_RESOLVING */
	uint8_t rfamily;                /* DN_READY: the answer chosen */
	uint8_t raddr[16];
	struct qdgram_list q;           /* waiting for the answer (counted in s->up_queued) */
	uint32_t qlen;
	char name[];
};

/* An outbound socket of a session: (outbound, family) for ordinary traffic, the session's
 * DNS socket connected to the upstream, or a SOCKS5 association (s5: one per outbound, any
 * family; with dns, the hijacked queries go through it to the upstream), which is the first
 * member of a struct s5sock: a direct socket carries none of an association's state. */
struct usock {
	SLIST_ENTRY(usock) link;
	struct udp_session *s;
	uint32_t ob;
	uint8_t family;          /* 0 for an association */
	bool dns;
	bool s5;
	bool gro;                /* UDP_GRO on: a read may hold a run of datagrams (udp.c) */
	int fd;                  /* -1 while an association is not ready */
	uint16_t ut_max;         /* the largest datagram that may go in an uplink train (0:
				  * none: DNS, associations, trains off; lowered by EMSGSIZE) */
	struct event *rev;       /* EV_READ|EV_PERSIST: replies (NULL until fd); its memory
				  * follows the struct (udp_path ev_off / s5_ev_off) */
	struct event *wev;       /* EV_WRITE, made by the first queued datagram (udp.c) */
	struct qdgram_list q;    /* up: waiting for sendto (EAGAIN), or for the association */
	uint32_t qlen;
};

/* A SOCKS5 association: the handshake in progress, or the control connection (watched: its
 * end ends the session) and where datagrams go and may come from. */
struct s5sock {
	struct usock k;
	struct outbound_conn *pending;
	bool failed;             /* the last attempt failed: datagrams dropped until retry_ns */
	int64_t retry_ns;
	int ctl_fd;
	struct event *ctl_ev;
	socklen_t relay_len;
	struct sockaddr_storage relay;
	uint8_t relay_family, server_family;
	uint8_t relay_ip[16], server_ip[16];
	struct s5names *names;   /* names sent to (for replies from a name), or NULL */
};

static inline struct s5sock *s5of(struct usock *k)
{
	return (struct s5sock *)k; /* k->s5: k is the first member */
}

/* The names an association has sent datagrams to, and the address and port the client knows
 * each by: a reply whose SOCKS5 source is one of these names comes from that address. */
#define S5_NAMES 8
struct s5names {
	uint32_t next;           /* the slot written next (oldest overwritten) */
	struct {
		uint8_t len;     /* 0: unused */
		uint8_t family;
		uint16_t port_be;
		uint8_t addr[16];
		char name[OUTBOUND_NAME_MAX];
	} e[S5_NAMES];
};

struct udp_session {
	struct udp_session *hnext;         /* hash chain */
	TAILQ_ENTRY(udp_session) idle;     /* idle-ordered: least recently active first */
	TAILQ_ENTRY(udp_session) down;     /* on up->down_list while dq is not empty */
	struct udp_path *up;
	struct cfg_gen *gen;               /* its configuration (held): outbounds, route, DNS */
	struct skey key;
	int64_t last_ns;
	SLIST_HEAD(, usock) socks;
	TAILQ_HEAD(dname_list_head, dname) dnames; /* named direct destinations, newest first */
	uint32_t n_dnames;
	uint32_t up_queued;                /* across socks; <= budget udp_up_queue */
	struct qdgram_list dq;             /* down: waiting for tx (EAGAIN) */
	uint32_t dq_len;                   /* <= budget udp_down_queue */
	bool in_down;
	/* The last destination's route: consecutive datagrams to one place skip route_select. */
	bool rc_valid;
	uint16_t rc_port_be;
	uint32_t rc_ob;
	uint8_t rc_dst[16];
	/* The namer's answer for the last destination sent through an association (nc_*), as a
	 * budget-memory copy (NULL: no name). */
	bool nc_valid;
	uint16_t nc_port_be;
	uint8_t nc_dst[16];
	char *rc_name;
	struct dns_pending *dns;           /* UDP_DNS_PENDING slots, made by the first query */
	uint32_t dns_next;                 /* ring cursor: the slot overwritten next */
	uint32_t dns_waiting;              /* used slots of dns[] */
	/* Every datagram so far was a DNS query and every reply an answer to one: the session
	 * is on the DNS list (short timeout) and closes when dns_waiting drops to 0. Cleared for
	 * good by anything else (then on the idle list). */
	bool dns_only;
	/* A QUIC Initial worth a look went out without one (udp_sniff.c): no look starts on the
	 * session again, since one could meet a handshake in its middle and never decide. */
	bool sniff_passed;
	struct usniff *sniff;              /* route.sniff's look at a QUIC flow, or NULL */
	struct ufast *fast;                /* UDP_FAST_MAX slots (budget memory), or NULL */
	uint8_t n_fast_in;                 /* slots UF_IN */
};
TAILQ_HEAD(session_list, udp_session);

/* A list of sessions ordered by last activity, all with one timeout, and its one timer. */
struct expiry {
	struct session_list list;
	struct event *ev;
	int64_t ns;
	bool unarmed;  /* sessions wait, and libevent had no memory for the timer: retried */
};

/* Replies being gathered into a train (udp.c): their payloads back to back at rxbuf + header
 * room. Lives within one socket's read callback: written out before it returns. */
struct udp_train {
	struct udp_codec_hdr h;            /* the first datagram's addresses, ports and IPv4 ID */
	uint32_t n;                        /* datagrams gathered; 0: none */
	bool closed;                       /* the last was shorter than seg (or empty): no more */
	size_t seg;                        /* the first datagram's size: the GSO size */
	size_t bytes;                      /* payload bytes gathered */
};

/* Datagrams from the TUN being gathered into an uplink train (udp.c): their payloads back
 * to back in buf, all to one destination through one socket. Lives within one batch of input:
 * sent at the batch end at the latest, and before any other send on k (which keeps k's order:
 * nothing of k can be sent, or queued, while a train of k waits). Never forms behind k's
 * queue. */
struct udp_uptrain {
	struct usock *k;                   /* the socket (a direct one) */
	uint32_t n;                        /* datagrams gathered; 0: none */
	bool closed;                       /* the last was shorter than seg: no more */
	size_t seg;                        /* the first datagram's size: the GSO size */
	size_t bytes;                      /* payload bytes gathered */
	socklen_t tolen;
	struct sockaddr_storage to;        /* the destination */
	uint8_t *buf;                      /* cap bytes from the budget; NULL: trains off */
	size_t cap;
};

struct udp_counters {
	ctr_t sessions, sessions_total, sessions_expired, sockets, up_queued, down_queued;
	ctr_t up_datagrams, up_bytes, down_datagrams, down_bytes;
	ctr_t trains, train_datagrams, train_errors, gro_datagrams;
	ctr_t up_trains, up_train_datagrams, up_train_errors;
	ctr_t dns_queries, dns_answers, dns_done, dns_expired, recv_errors;
	ctr_t assocs, assocs_total, assoc_failures, assoc_control_closed, resolve_failures;
	ctr_t sniff_started, sniff_quic, sniff_no_name, sniff_timeouts, sniff_route_changed,
		sniff_overridden, sniff_active;
	ctr_t sniff_skipped_no_memory, sniff_skipped_busy, sniff_skipped_other_flow;
	ctr_t fast_flows, fast_added, fast_refused, fast_kept;
	ctr_t expiry_spare_used, expiry_unarmed;
	ctr_t drops[UDP_DROP_MAX];
};

struct udp_path {
	struct event_base *base;
	struct cfg_gens gens;              /* new sessions hold gens.cur */
	struct budget *b;
	/* Sessions and direct sockets (each with its read event inside, evsize bytes at
	 * ev_off): packed in slabs of their own, off the heap (core/slab.h). */
	struct slab *sess_slab, *sock_slab;
	size_t evsize, ev_off, s5_ev_off;
	tun_tx_fn tx;
	tun_tx_meta_fn tx_meta;            /* trains (UDP GSO writes), or NULL */
	void *tx_arg;
	bool train4, train6;               /* replies to clients of that family go in trains */
	struct udp_train tr;
	bool ut_on;                        /* datagrams from the TUN go in uplink trains */
	bool ut_logged;                    /* "trains off" was logged */
	uint16_t ut_segmax;                /* the largest datagram a train takes (TUN MTU) */
	size_t ut_limit[2];                /* payload bytes a train may hold: IPv4, IPv6 */
	struct udp_uptrain ut;
	udp_sendto_fn sendto_fn;           /* NULL: sendto(2) */
	void *sendto_arg;
	udp_sendgso_fn sendgso_fn;         /* NULL: sendmsg(2) with UDP_SEGMENT */
	void *sendgso_arg;
	struct loopguard *loopguard;       /* the proxy's own ports, or NULL */
	const struct udp_offload *off;     /* flows carried in the kernel, or NULL */
	void *off_arg;
	struct log *log;                   /* association and name failures at debug, or NULL */
	udp_namer_fn namer;                /* destination names, or NULL */
	void *namer_arg;
	udp_pin_fn pin, unpin;             /* a session's cached name held (fake-IP), or NULL */
	struct resolver *own_resolver;     /* for outbounds without ob->resolver; made on use */
	struct dns_server *dns;            /* hijacked queries answered here, or NULL */
	struct udp_dnsq *dnsq;             /* queries waiting for it */
	size_t mtu;                        /* the TUN's */

	struct udp_session **buckets;      /* chained hash on skey; power-of-two size */
	size_t nbuckets;
	size_t nsessions;
	uint64_t seed;

	/* [0]: ordinary sessions, timeouts.udp_idle_ms (the newest configuration's, for every
	 * session); [1]: DNS-only sessions, min(dns_timeout_ns, that). Each session is on one. */
	struct expiry exp[2];
	struct evspare spare;              /* held while sessions exist: for exp's re-arms */
	int64_t dns_timeout_ns;
	struct session_list down_list;
	struct event *down_ev;             /* retries down queues after EAGAIN */
	uint32_t up_limit, down_limit;

	struct bufpool *pool;              /* queued datagrams */
	size_t qcap;                       /* bytes a queued datagram may have */
	uint8_t *rxbuf;                    /* one reply, or a train's payloads back to back
	                                    * (udp_path_set_trains), encoded in place */
	size_t rxcap;
	uint8_t *s5buf;                    /* one datagram at a time with its SOCKS5 header;
	                                    * allocated with the first association */
	size_t s5cap;
	uint16_t ip_id;
	bool sniff_quic;                   /* the newest configuration sniffs QUIC (route.sniff) */
	bool name_work;                    /* namer, sniff_quic or sniff_live: names before the
	                                    * route (udp_name_work_update) */
	uint32_t sniff_live;               /* sessions with a look's state (udp_sniff.c) */
	struct udp_counters ctr;
};

/* What a datagram needs: which outbound, which socket family, hijacked or not, and (not
 * hijacked) where sendto sends it. */
struct target {
	uint32_t ob;
	uint8_t family;
	bool dns;
	bool s5;                 /* through a SOCKS5 association (to: the destination) */
	const char *name;        /* through an association: the destination's name, or NULL */
	socklen_t tolen;
	struct sockaddr_storage to;
};

/* ---- udp.c -------------------------------------------------------------------------------- */

void udp_count_drop(struct udp_path *up, enum udp_drop d);
void udp_gauge_dec(ctr_t *c);
/* k's datagram socket fd, with its read and write events (the write one not added). 0 or
 * -ENOMEM (then fd is not kept: the caller closes it). */
int udp_sock_setup(struct udp_path *up, struct usock *k, int fd);
/* The socket of s for t (opened, or an association started, when s has none yet). NULL:
 * dropped and counted. */
struct usock *udp_sock_get(struct udp_path *up, struct udp_session *s, const struct target *t,
			   int64_t now);
/* Send now, or queue (order kept, bounded; counted when refused). */
void udp_sock_send(struct udp_path *up, struct usock *k, const struct target *t,
		   const uint8_t *payload, size_t len);
/* Send what waits in k's queue until the kernel says EAGAIN. */
void udp_sock_flush(struct udp_path *up, struct usock *k);
/* One datagram to `to` (name: through an association, or NULL) now, or into k's queue behind
 * what waits (order kept); with no train of k waiting (udp_sock_send sends that first). */
void udp_sock_send_now(struct udp_path *up, struct usock *k, const struct sockaddr_storage *to,
		       socklen_t tolen, const char *name, const uint8_t *payload, size_t len);
/* One datagram into k's queue (the write event sends it), or dropped and counted
 * (queue_full, no_buffer). */
void udp_up_enqueue(struct udp_path *up, struct usock *k, const struct sockaddr_storage *to,
		    socklen_t tolen, const char *name, const uint8_t *payload, size_t len);
void udp_session_free(struct udp_path *up, struct udp_session *s);
/* name_work again after the namer, the configuration or sniff_live changed. */
void udp_name_work_update(struct udp_path *up);
/* v's flow as the route sees it. */
void udp_flow_key(const struct udp_view *v, struct flow_key *fk);
/* A datagram the codec accepted: its session, its target, out. */
void udp_input(struct udp_path *up, const struct udp_view *v, int64_t now_ns);

/* ---- udp_uptrain.c: datagrams out in trains --------------------------------------------- */

/* Send the uplink train of two or more datagrams (one UDP GSO send, or its fallbacks) and
 * empty it. */
void udp_uptrain_send(struct udp_path *up);

/* ---- udp_assoc.c: SOCKS5 associations --------------------------------------------------- */

/* A new association of s for t's outbound, its handshake started. NULL: dropped, counted. */
struct usock *udp_assoc_open(struct udp_path *up, struct udp_session *s, const struct target *t);
/* (Re)start k's handshake. 0 or -errno. */
int udp_assoc_start(struct udp_path *up, struct usock *k);
/* The datagram to `to` (or to name:port when nlen > 0) with its SOCKS5 header, in up->s5buf:
 * its length or -errno. */
int udp_s5_wrap(struct udp_path *up, struct usock *k, const void *buf, size_t len,
		const struct sockaddr_storage *to, const char *name, size_t nlen);
/* A datagram on k's socket: checked, its remote into h, its payload moved to where a plain
 * reply's is. false: dropped and counted. */
bool udp_s5_unwrap(struct udp_path *up, struct usock *k, const struct sockaddr_storage *from,
		   size_t *n, struct udp_codec_hdr *h);

/* ---- udp_dns.c: hijacked queries to the proxy's resolver -------------------------------- */

struct udp_dnsq;
/* v (to port 53) handed to up->dns; its reply, if any, sent from where v went. */
void udp_dns_input(struct udp_path *up, const struct udp_view *v);
/* Cancel every waiting query (the path or the server goes). */
void udp_dns_cancel_all(struct udp_path *up);

/* ---- udp_sniff.c: route.sniff for QUIC ---------------------------------------------------- */

/* Is v (to port 443) a client Initial whose flow a look is worth under cfg (QUIC sniffing on,
 * and a name could change the route, or override_destination)? */
bool udp_sniff_wanted(const struct ts_config *cfg, const struct udp_view *v);
/* v of s, to port 443 (wanted: udp_sniff_wanted said so). 0: route v now, *name the name its
 * flow announced (NULL: none, or not looked at: a wanted v a look could not be started for is
 * counted by why, and s is not looked at again); 1: v waits for the look's decision, or was
 * dropped (counted). Datagrams that waited go out (through udp_input) before 0 is returned for
 * the one that decided. */
int udp_sniff_input(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
		    int64_t now, bool wanted, const char **name);
/* Is a look of s running (datagrams may be held)? */
bool udp_sniff_looking(const struct udp_session *s);
/* The name v's flow announced, if s looked at that flow and found one; else NULL. */
const char *udp_sniff_name(const struct udp_session *s, const struct udp_view *v);
/* Does a sniffed name replace s's destination address (route.sniff.override_destination)? */
bool udp_sniff_override(const struct udp_session *s);
/* s's look ended: what waited is dropped (session_closed). */
void udp_sniff_free(struct udp_path *up, struct udp_session *s);

/* ---- udp_names.c: destinations by name ---------------------------------------------------- */

/* The namer's name for v's destination (cached per session); *bad: 0, or the drop reason of a
 * refused name (bad_name; fake_unmapped for "", an address that stands for no name; no_buffer
 * when it cannot be kept). */
const char *udp_name_for(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
			 int *bad);
/* A new session's name cache seeded with name (the namer's answer for v's destination, asked
 * before the session existed). */
void udp_name_seed(struct udp_path *up, struct udp_session *s, const struct udp_view *v,
		   const char *name);
/* v goes direct to name: true with t aimed at the answer; false when v waits or was dropped. */
bool udp_dname_route(struct udp_path *up, struct udp_session *s, struct target *t,
		     const struct udp_view *v, const char *name, int64_t now);
/* A reply from a named destination's answer: h->src becomes the address the client used. */
bool udp_dname_unmap(const struct udp_session *s, int family, struct udp_codec_hdr *h);
void udp_dname_free(struct udp_path *up, struct dname *d, enum udp_drop why);
/* s's name cache emptied (its name let go: unpin). */
void udp_name_forget(struct udp_path *up, struct udp_session *s);

#endif
