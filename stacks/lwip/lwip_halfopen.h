/* lwip_halfopen.h — the handshakes lwIP holds half-open (SYN_RCVD) for a listener, indexed by
 * 4-tuple, so a SYN can be asked in O(1) whether it repeats one of them.
 *
 * A client whose SYN-ACK was lost sends its SYN again. lwIP answers such a SYN by sending its
 * SYN-ACK again (tcp_process, SYN_RCVD), but the stack refuses SYNs itself while the
 * listener's backlog is full (lwIP would drop them silently): it asks lwip_halfopen_holds
 * first and lets a repetition through, which needs no room. Under a SYN flood every SYN the
 * full backlog refuses asks, so the answer must not walk lwIP's pcb list. A repetition the
 * session budget refuses gets a RST, which ends its client's connection: the stack lets go of
 * the handshake through the index (lwip_halfopen_abandon), which keeps each one's pcb. The
 * SYN-flood eviction lists the handshakes from it too (lwip_halfopen_pcbs, in the order they
 * were opened), instead of walking lwIP's active pcbs, which are mostly established ones.
 *
 * lwIP reports every change through an extension argument (lwipopts.h): the listener's
 * passive-open callback enters each new handshake (before lwIP queues its SYN-ACK), the
 * handshake's pcb carries its entry, and the pcb's destroy callback removes the entry however
 * lwIP frees the pcb (the client's RST, lwIP's timeouts, an eviction's or
 * lwip_halfopen_abandon's tcp_abandon, a pcb lwIP kills for memory). lwip_halfopen_accepted
 * removes a completed one. Entries are found by a SipHash of the tuple under a key drawn at
 * start: the tuples are the sender's choice.
 *
 * Memory: one entry per handshake the listener's backlog admits, allocated with the index.
 * lwIP admits no more (it refuses a SYN while the backlog is full), so a new handshake always
 * finds a free entry. Nothing here touches a data segment: only a SYN, an accept and a freed
 * handshake's pcb cost anything.
 *
 * A handshake whose pcb lwIP frees before tcp_listen_input returns got no SYN-ACK: lwIP 2.1.3
 * abandons the new pcb when tcp_enqueue_flags fails, which on a new pcb only a failed
 * allocation makes it do. lwip_halfopen_input_end tells the stack, after each segment it fed, whether that
 * happened. Everything runs on the thread that owns lwIP (lwip_glue_claim). */
#ifndef TS_STACKS_LWIP_HALFOPEN_H
#define TS_STACKS_LWIP_HALFOPEN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/flow.h"

struct lwip_halfopen;
struct lwip_halfopen_entry;
struct tcp_pcb;

/* Allocate the extension argument slot (once per process, at the first claim of lwIP). */
void lwip_halfopen_init(void);

/* An index of cap entries, hashed under (k0, k1). Returns 0 or -ENOMEM (or -EINVAL: cap 0). */
int lwip_halfopen_new(unsigned cap, uint64_t k0, uint64_t k1, struct lwip_halfopen **out)
	__attribute__((warn_unused_result));
/* Free h. Every pcb it indexed must be gone first (their destroy callbacks write into h): the
 * stack frees it after aborting its pcbs. NULL is fine. */
void lwip_halfopen_free(struct lwip_halfopen *h);

/* Enter every handshake listener (in LISTEN, its backlog at most h's cap) opens from now on. */
void lwip_halfopen_watch(struct lwip_halfopen *h, struct tcp_pcb *listener);
/* Is k (as pkt_flow_key makes it from the client's SYN) a handshake h holds? */
bool lwip_halfopen_holds(const struct lwip_halfopen *h, const struct flow_key *k);
/* Let go of the handshake k that h holds, sending nothing (tcp_abandon(pcb, 0)): lwIP frees
 * its pcb, whose destroy callback removes it from h, and gives its place in the listener's
 * backlog back. Returns whether h held k. Not inside lwIP's input. */
bool lwip_halfopen_abandon(struct lwip_halfopen *h, const struct flow_key *k);
/* pcb completed its handshake (the accept callback): it leaves the index. No effect on a pcb
 * the index does not hold. */
void lwip_halfopen_accepted(struct lwip_halfopen *h, struct tcp_pcb *pcb);
/* After each segment fed to lwIP: true if it opened a handshake whose pcb lwIP freed before
 * queueing its SYN-ACK (the SYN was dropped for want of memory). Resets for the next. */
bool lwip_halfopen_input_end(struct lwip_halfopen *h);
/* Handshakes held now. */
unsigned lwip_halfopen_count(const struct lwip_halfopen *h);
/* The pcbs of the handshakes h holds, newest first (the order lwIP opened them), at most max
 * of them into pcbs; returns how many. Borrowed: valid until lwIP frees one. */
unsigned lwip_halfopen_pcbs(const struct lwip_halfopen *h, struct tcp_pcb **pcbs, unsigned max);

/* The key of pcb's connection as pkt_flow_key makes it from the client's segments: the
 * client (pcb's remote end) is src. */
void lwip_halfopen_key(const struct tcp_pcb *pcb, struct flow_key *k);

/* The index itself, as the callbacks use it (and the tests, without lwIP): enter k, returning
 * its entry (with no pcb: lwip_halfopen_abandon finds nothing to let go), or NULL when k is
 * there already or h is full; remove an entry. */
struct lwip_halfopen_entry *lwip_halfopen_add(struct lwip_halfopen *h, const struct flow_key *k);
void lwip_halfopen_remove(struct lwip_halfopen *h, struct lwip_halfopen_entry *e);

#endif
