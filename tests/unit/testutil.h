/* testutil.h — helpers shared by the unit tests: packet builders, reference checksum verifiers,
 * a deterministic PRNG and a virtual clock.
 *
 * The verifiers (tu_verify_*, tu_l4_*, tu_partial_pseudo) deliberately share no code with
 * core/csum.c or core/pkt.c: they locate headers with their own minimal parser and sum 16-bit
 * big-endian words byte by byte (RFC 1071), so they can judge the code under test.
 * Builders abort (failing the Criterion test) on a spec that does not fit the buffer.
 * Multi-byte spec fields are in HOST order; the builders write network order.
 */
#ifndef TS_TESTS_TESTUTIL_H
#define TS_TESTS_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/flow.h"
#include "core/lsan.h"

/* Criterion's test processes exit without LeakSanitizer's final pass (a leak would not fail
 * the test): CHECK_LEAKS() runs it explicitly in ASan builds (a Criterion assertion). */
#ifdef TS_LSAN
#define CHECK_LEAKS() cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "memory leaked")
#else
#define CHECK_LEAKS() ((void)0)
#endif

/* Entries of a directory but "." and "..", as /proc/self/fd (open descriptors, the one
 * reading it included) or /proc/self/task (threads) list them; -1 if it cannot be read. */
int tu_dir_entries(const char *path);

#define MS(x) ((int64_t)(x) * 1000000LL)
#define SEC(x) ((int64_t)(x) * 1000000000LL)

/* Largest packet a builder can produce (IPv6 header + 65535 payload bytes). */
#define TU_PKT_MAX (40 + 65535)

/* ---- PRNG: xorshift64* (Vigna), deterministic and seedable ---- */

struct tu_rng {
	uint64_t s;
};

void tu_rng_seed(struct tu_rng *r, uint64_t seed);           /* any seed, 0 included */
uint64_t tu_rand64(struct tu_rng *r);                        /* next 64 random bits */
uint32_t tu_rand32(struct tu_rng *r);                        /* next 32 random bits */
uint32_t tu_rand_below(struct tu_rng *r, uint32_t n);        /* uniform in [0, n); n > 0 */
uint32_t tu_rand_range(struct tu_rng *r, uint32_t lo, uint32_t hi); /* uniform in [lo, hi] */
bool tu_rand_chance(struct tu_rng *r, uint32_t one_in);      /* true with probability 1/one_in */
void tu_rand_bytes(struct tu_rng *r, void *buf, size_t n);   /* fill buf with random bytes */

/* ---- byte helpers (network order) ---- */

uint16_t tu_get16(const uint8_t *p);          /* big-endian 16-bit load */
uint32_t tu_get32(const uint8_t *p);          /* big-endian 32-bit load */
void tu_put16(uint8_t *p, uint16_t v);        /* big-endian 16-bit store */
void tu_put32(uint8_t *p, uint32_t v);        /* big-endian 32-bit store */
/* Parse a textual IPv4/IPv6 address into out[16] (v4 in out[0..3], rest zero); returns the
 * family (4 or 6); aborts on malformed text. */
int tu_addr(uint8_t out[16], const char *text);
struct sockaddr_storage;
/* text (IPv4 or IPv6) and port (host order) as a socket address; returns its length. */
unsigned tu_sockaddr(struct sockaddr_storage *ss, const char *text, uint16_t port);
/* One TCP connect to 127.0.0.1:port (host order): did something accept it? */
bool tu_lo_accepts(uint16_t port);

/* A payload pattern that depends on the position and not periodic in any MSS, so a segment
 * put at the wrong offset is caught: byte i of the stream seed, and n bytes of it from 0. */
uint8_t tu_pattern_byte(uint32_t seed, size_t i);
void tu_fill_pattern(uint8_t *p, size_t n, uint32_t seed);
/* A minimal TLS 1.2 ClientHello whose only extension is server_name = name, into b: with
 * record true in a TLS handshake record (what a TCP client sends), else the bare handshake
 * message (what a QUIC Initial's CRYPTO frames carry). Returns its length; b needs
 * 64 + strlen(name) bytes. */
size_t tu_client_hello(uint8_t *b, const char *name, bool record);
/* Print buf as hex to stderr under a label (for failure diagnostics). */
void tu_dump(const char *label, const uint8_t *buf, size_t len);

/* ---- packet builder ---- */

/* One IPv6 extension header in a builder chain. hdr_len is the raw Hdr Ext Len field: the header
 * is (hdr_len + 1) * 8 bytes for Hop-by-Hop (0), Routing (43), Destination Options (60) and
 * (hdr_len + 2) * 4 bytes for AH (51). Fragment (44) is always 8 bytes; ESP (50) writes SPI and
 * sequence number (8 bytes) and everything after it is opaque; hdr_len is ignored for both. */
struct tu_ext {
	uint8_t type;
	uint8_t hdr_len;
};

enum { TU_EXT_MAX = 16 };

/* Description of one packet. Start from tu_spec_tcp/_udp/_icmp_echo/_raw, then adjust fields. */
struct tu_spec {
	uint8_t family;            /* 4 or 6 */
	uint8_t proto;             /* IPPROTO_TCP, _UDP, _ICMP, _ICMPV6 or anything else (raw L4) */
	uint8_t src[16], dst[16];  /* v4 addresses in [0..3] */
	uint8_t ttl;               /* TTL / hop limit */
	uint8_t tos;               /* IPv4 TOS / IPv6 traffic class */
	uint16_t ip_id;            /* IPv4 identification */
	uint16_t ip4_frag;         /* IPv4 flags+fragment offset word (0x4000 = DF, 0x2000 = MF) */
	uint8_t ip4_opts[40];      /* raw IPv4 options, zero-padded (EOL) to a multiple of 4 */
	uint8_t ip4_opts_len;
	struct tu_ext ext[TU_EXT_MAX]; /* IPv6 extension header chain, in order */
	uint8_t ext_n;
	uint16_t sport, dport;     /* TCP/UDP ports */
	uint32_t seq, ack;         /* TCP */
	uint8_t tcp_flags;         /* TCP_SYN | TCP_ACK ... */
	uint16_t window;           /* TCP */
	uint16_t urg;              /* TCP urgent pointer */
	uint16_t mss;              /* TCP: non-zero prepends an MSS option (kind 2, len 4) */
	uint8_t tcp_opts[40];      /* raw TCP options after the MSS one, zero-padded to 4 */
	uint8_t tcp_opts_len;
	uint8_t icmp_type, icmp_code; /* ICMP/ICMPv6 */
	uint16_t icmp_id, icmp_seq;   /* ICMP/ICMPv6 echo identifier and sequence */
	const uint8_t *payload;    /* L4 payload; NULL = payload_len bytes from payload_seed */
	size_t payload_len;
	uint64_t payload_seed;     /* PRNG seed of the generated payload when payload is NULL */
	bool udp_no_csum;          /* UDP: write checksum 0 ("none"; only meaningful over IPv4) */
	bool partial_csum;         /* TCP/UDP: L4 field holds the NEEDS_CSUM partial (as the kernel) */
};

/* TCP spec: addresses as text (family from the text), ports; ACK set, window 65535, ttl 64. */
void tu_spec_tcp(struct tu_spec *s, const char *src, uint16_t sport, const char *dst,
		 uint16_t dport);
/* UDP spec: addresses as text, ports. */
void tu_spec_udp(struct tu_spec *s, const char *src, uint16_t sport, const char *dst,
		 uint16_t dport);
/* ICMP echo request (type 8) for v4, ICMPv6 echo request (type 128) for v6 addresses. */
void tu_spec_icmp_echo(struct tu_spec *s, const char *src, const char *dst, uint16_t id,
		       uint16_t seq);
/* Any other protocol: the L4 part is just the payload, no checksum. */
void tu_spec_raw(struct tu_spec *s, const char *src, const char *dst, uint8_t proto);

/* Build s into buf[0..cap): correct IPv4 header checksum and (unless udp_no_csum/partial_csum)
 * correct L4 checksum. Returns the packet length; aborts if it does not fit cap or 64 KiB. */
size_t tu_build(const struct tu_spec *s, uint8_t *buf, size_t cap);

/* ---- reference parsing, verifying and fixing (independent of core/) ---- */

/* Where the headers of a packet are, found by the reference parser. */
struct tu_layout {
	int family;        /* 4 or 6 */
	uint8_t proto;     /* final upper-layer protocol (44/50 when the chain stops there) */
	size_t l3_len;     /* IP header + extension headers */
	size_t len;        /* IP datagram length from the header */
	size_t l4_len;     /* len - l3_len */
};

/* Locate the headers of buf (v4 IHL/total length, v6 chain of 0/43/60/51); false if malformed. */
bool tu_layout(const uint8_t *buf, size_t len, struct tu_layout *lo);
/* Offset of the L4 checksum field from the L4 header (TCP 16, UDP 6, ICMP/ICMPv6 2), or -1. */
int tu_l4_csum_off(uint8_t proto);
/* True iff the IPv4 header checksum over IHL*4 bytes is correct. */
bool tu_verify_ip4_header(const uint8_t *buf);
/* True iff the L4 (TCP/UDP/ICMP/ICMPv6) checksum is correct, summed from scratch over the
 * pseudo-header and segment. IPv4 UDP with checksum 0 ("none") counts as correct. */
bool tu_verify_l4(const uint8_t *buf, size_t len);
/* The full L4 checksum the packet should carry (~sum, field taken as zero; 0 is NOT mapped). */
uint16_t tu_l4_compute(const uint8_t *buf, size_t len);
/* Adjust the 16-bit word at even offset l4_word from the L4 header (not the checksum field) so
 * that the from-scratch L4 checksum becomes want; the field itself is not touched. Returns
 * whether it worked (0xFFFF is unreachable: a computed checksum is never 0xFFFF). */
bool tu_steer_l4_csum(uint8_t *buf, size_t len, size_t l4_word, uint16_t want);
/* The L4 checksum field as stored (host order value of the big-endian field). */
uint16_t tu_l4_field(const uint8_t *buf, size_t len);
/* The un-inverted, folded pseudo-header sum (src, dst, proto, L4 length) that a NEEDS_CSUM
 * packet carries in its L4 field, as the Linux kernel writes it. */
uint16_t tu_partial_pseudo(const uint8_t *buf, size_t len);
/* True iff the L4 field equals tu_partial_pseudo (a correct NEEDS_CSUM packet). */
bool tu_verify_partial(const uint8_t *buf, size_t len);
/* Complete a NEEDS_CSUM packet as the kernel does (sum L4 from its start with the partial in
 * place, store the inverted fold; UDP 0 -> 0xFFFF). Afterwards tu_verify_l4 must hold. */
void tu_complete_partial(uint8_t *buf, size_t len);
/* Recompute the IPv4 header checksum in place (v4 only). */
void tu_fix_ip4_header(uint8_t *buf);
/* Recompute the IPv4 header and full L4 checksums in place (UDP 0 -> 0xFFFF). */
void tu_fix_checksums(uint8_t *buf, size_t len);
/* Overwrite source and destination addresses (16 bytes each, v4 uses [0..3]); no checksums. */
void tu_set_addrs(uint8_t *buf, size_t len, const uint8_t src[16], const uint8_t dst[16]);
/* Overwrite TCP/UDP ports (host order); no checksums. */
void tu_set_ports(uint8_t *buf, size_t len, uint16_t sport, uint16_t dport);
/* Offload metadata for a NEEDS_CSUM TCP/UDP packet: csum_start/offset, hdr_len and, when
 * gso_size is non-zero, the GSO type (TCPV4/TCPV6/UDP_L4) and size. */
void tu_meta_partial(const uint8_t *buf, size_t len, uint16_t gso_size, struct pkt_meta *m);

/* ---- random packets ---- */

/* Random but valid spec: family 0 = either, proto 0 = TCP/UDP/ICMP(v6) at random; random
 * addresses, ports, seq/ack, flags, sometimes MSS and other TCP options, sometimes IPv4 options
 * or an IPv6 extension chain (only accepted kinds), payload of 0..max_payload bytes. */
void tu_rand_spec(struct tu_rng *r, struct tu_spec *s, int family, uint8_t proto,
		  size_t max_payload);
/* tu_rand_spec + tu_build into buf; returns the length. */
size_t tu_rand_packet(struct tu_rng *r, uint8_t *buf, size_t cap, int family, uint8_t proto,
		      size_t max_payload);
/* Apply n random mutations (byte overwrite, bit flip, small +-delta), biased to the first 80
 * bytes where the headers live. */
void tu_mutate(struct tu_rng *r, uint8_t *buf, size_t len, unsigned n);

/* ---- virtual clock ---- */

struct tu_clock {
	int64_t now_ns;
};

static inline int64_t tu_now(const struct tu_clock *c)
{
	return c->now_ns;
}

static inline void tu_advance(struct tu_clock *c, int64_t ns)
{
	c->now_ns += ns;
}

/* ---- GSO segmentation (what the kernel does with a super-packet we write back) ---- */

/* One segment of tu_gso_segment's output: out[off .. off + len). partial: with NEEDS_CSUM, the
 * segment's L4 field after the per-segment length adjustment and before completion (what the
 * pseudo-header sum of the segment must be); 0 otherwise. */
struct tu_seg {
	size_t off;
	size_t len;
	uint16_t partial;
};

/* TCP flag missing from core/pkt.h's list: Congestion Window Reduced. */
#define TU_TCP_CWR 0x80

/* Segment a TCP or UDP super-packet (IPv4 with options, IPv6 with an extension chain) the way
 * Linux's software GSO does (inet_gso_segment / ipv6_gso_segment, tcp_gso_segment,
 * __udp_gso_segment): the payload is split every m->gso_size bytes (a packet that fits is one
 * segment); each segment gets the headers with its own IPv4 total length, ID (+ index) and
 * header checksum or IPv6 payload length; TCP: sequence number + payload offset, FIN and PSH
 * only on the last segment, CWR only on the first; UDP: its own length field.
 * Checksums: with PKT_META_NEEDS_CSUM the super-packet's field (at csum_start + csum_offset)
 * must hold the partial pseudo-header sum over the WHOLE L4 length L; each segment's becomes
 * C + ~L + l (its own L4 length l, one's complement, un-inverted: tcp_gso_segment's delta) and
 * is then completed as the kernel does: ones' sum from csum_start with that field as seed,
 * inverted and stored (UDP 0 -> 0xFFFF). Nothing else is recomputed, so a wrong field in the
 * super-packet gives segments whose tu_verify_l4 fails. Without NEEDS_CSUM the kernel throws
 * the field away and computes each segment's checksum from scratch; so does this.
 * Returns the number of segments; aborts on a malformed packet, gso_size 0, a checksum field
 * outside the headers, or out/segs too small. */
size_t tu_gso_segment(const uint8_t *sp, size_t len, const struct pkt_meta *m, uint8_t *out,
		      size_t cap, struct tu_seg *segs, size_t max_segs);

/* ---- a stack's detailed counters ---- */

/* The value of the counter called name, as the stack's counters() gives it; *found false (and
 * 0) when it gives none of that name. */
struct netstack;
struct netstack_ops;
uint64_t tu_stack_counter(const struct netstack_ops *ops, struct netstack *ns, const char *name,
			  bool *found);

#endif
