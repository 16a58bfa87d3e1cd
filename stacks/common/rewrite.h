/* rewrite.h — in-place address/port rewriting of parsed TCP and UDP packets (the system
 * stack's NAT), and the packets both stacks answer with by themselves (TCP RST, ICMP echo
 * reply, ICMP port unreachable).
 *
 * Checksums are updated incrementally (RFC 1624): all replaced 32-bit words are accumulated and
 * folded once. For offload packets whose L4 field is a NEEDS_CSUM partial sum, only the address
 * words enter that field's update (the kernel adds ports and payload when it completes it).
 */
#ifndef TS_STACKS_COMMON_REWRITE_H
#define TS_STACKS_COMMON_REWRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/csum.h"
#include "core/pkt.h"

/* rewrite_l4 for everything but plain IPv4 TCP; use rewrite_l4. */
void rewrite_l4_slow(const struct pkt_view *v, const uint8_t *src, uint16_t sport_be,
		     const uint8_t *dst, uint16_t dport_be, bool partial);

/* Replace source and destination address and port of a parsed TCP or UDP packet.
 * src/dst: 4 or 16 bytes (the packet's family); ports in network byte order.
 * partial: the L4 checksum field is a NEEDS_CSUM partial sum. A UDP/IPv4 checksum of 0 (none)
 * stays 0. IPv4 TCP, the common case, is inline: 3 replaced 32-bit words (2 addresses, the
 * port pair), 2 folds. */
static inline void rewrite_l4(const struct pkt_view *v, const uint8_t *src, uint16_t sport_be,
			      const uint8_t *dst, uint16_t dport_be, bool partial)
{
	if (v->family != 4 || v->proto != 6 || partial) {
		rewrite_l4_slow(v, src, sport_be, dst, dport_be, partial);
		return;
	}
	uint8_t *ip = v->ip, *tcp = v->l4;
	uint32_t os, od, ns, nd, op, np;
	uint16_t ports[2] = { sport_be, dport_be };

	memcpy(&os, ip + PKT_V4_SRC, 4);
	memcpy(&od, ip + PKT_V4_DST, 4);
	memcpy(&ns, src, 4);
	memcpy(&nd, dst, 4);
	memcpy(&op, tcp, 4);
	memcpy(&np, ports, 4);
	uint64_t acc = (uint64_t)(uint32_t)~os + (uint32_t)~od + ns + nd;
	/* The IPv4 header checksum covers the addresses; TCP's covers ports too. */
	csum_store16(ip + 10, csum_apply(csum_load16(ip + 10), acc));
	acc += (uint64_t)(uint32_t)~op + np;
	csum_store16(tcp + TCP_OFF_CSUM, csum_apply_l4(csum_load16(tcp + TCP_OFF_CSUM), acc));
	memcpy(ip + PKT_V4_SRC, &ns, 4);
	memcpy(ip + PKT_V4_DST, &nd, 4);
	memcpy(tcp, &np, 4);
}

/* Turn a parsed TCP segment into the RST that answers it (RFC 793 section 3.4, "Reset Generation"):
 * addresses and ports swapped; if the segment had ACK, <SEQ=SEG.ACK><CTL=RST>, otherwise
 * <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>. Built in place over the packet (IP options and
 * IPv6 extension headers dropped); returns the new length (40 for IPv4, 60 for IPv6).
 * Caller: the segment must not itself carry RST. */
size_t rewrite_tcp_rst(const struct pkt_view *v);

/* Room an answer built by rewrite_icmp_unreach may take in the buffer of the packet it
 * answers: the 576 bytes RFC 1812 section 4.3.2.3 caps an ICMP error at (the driver's read
 * buffers hold at least that much: core/driver.h, DRIVER_INPUT_ROOM). */
#define REWRITE_ANSWER_ROOM 576u

/* Turn a parsed TCP segment into the ICMP destination unreachable, code port unreachable
 * (ICMP 3/3, RFC 792; ICMPv6 1/4, RFC 4443 section 3.1), that refuses it, from src (4 or 16
 * bytes of the segment's family) to the segment's source. It quotes the segment's IP header
 * (options and extension headers included) and its TCP header, no payload (RFC 1122 section
 * 3.2.2 asks for the header and 8 bytes of data; the receiving TCP finds its connection by the
 * quoted addresses, ports and sequence number). Built in place: buf (v->ip) must have room
 * for REWRITE_ANSWER_ROOM bytes, and the answer never exceeds them, whatever the segment's
 * length (the quote is cut). Returns the new length, or 0 (buf untouched) when not even the IP header and 8 bytes
 * of TCP fit. Port unreachable is one of the hard errors of RFC 1122 section 4.2.3.9, on which
 * a TCP aborts a connection being opened: the app's connect fails with ECONNREFUSED. */
size_t rewrite_icmp_unreach(const struct pkt_view *v, const uint8_t *src);

/* Turn a parsed ICMP echo request (v4 type 8 / v6 type 128) into the echo reply in place:
 * addresses swapped, type changed, TTL/hop limit 64, checksums updated. Returns the length. */
size_t rewrite_icmp_echo_reply(const struct pkt_view *v);

#endif
