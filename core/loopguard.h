/* loopguard.h — the last line against routing loops: a record of the local ports of the
 * proxy's own outbound sockets, so that a packet one of them sends which comes back in through
 * the TUN (because a route sends it there: a default route into the TUN added by hand, a
 * missing rule for the proxy's routing mark) is recognised and dropped instead of becoming a
 * new session that opens a new outbound socket that loops again.
 *
 * How a socket is recorded: before its first packet can leave (before connect or the first
 * sendto), loopguard_bind binds it to the wildcard address and port 0 and stores
 * (fd, SO_COOKIE) under the port the kernel picked. A port held by an explicit bind is never
 * handed to another socket's connect() or autobind, so while the socket lives no other
 * local socket can send from that port.
 *
 * How a packet is checked (any thread, lock-free): the TUN side sees a looping packet with the
 * TUN's own address as source (the kernel picks the address of the interface a route leads
 * to) and our port. loopguard_hit looks the port up — one relaxed atomic load; only when an
 * entry exists does loopguard_confirm ask the kernel whether that fd is still the same socket
 * (SO_COOKIE compared). Entries are not removed when a socket closes: a stale one is found out
 * by that comparison and cleared then (compare-and-swap, so a newer entry for the port stays),
 * so each stale entry costs at most one getsockopt.
 *
 * Memory: two tables (TCP, UDP) of 65536 eight-byte entries, allocated zeroed and touched page
 * by page as ports are used.
 */
#ifndef TS_CORE_LOOPGUARD_H
#define TS_CORE_LOOPGUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct loopguard {
	_Atomic uint64_t *tab[2]; /* [0] TCP, [1] UDP: (fd + 1) << 32 | low 32 bits of the cookie */
};

/* 0 or -ENOMEM. */
int loopguard_new(struct loopguard **out) __attribute__((warn_unused_result));
void loopguard_free(struct loopguard *lg);

/* Bind fd (a fresh, unbound socket of family 4 or 6 and type SOCK_STREAM or SOCK_DGRAM) to
 * the wildcard address, port 0, and record the port it got. 0 or -errno (-EADDRINUSE when the
 * ephemeral ports are exhausted). */
int loopguard_bind(struct loopguard *lg, int fd, int family, int type)
	__attribute__((warn_unused_result));

/* The slow half of loopguard_hit: is the entry still a live socket of ours? Clears it if not. */
bool loopguard_confirm(struct loopguard *lg, int udp, uint16_t port, uint64_t entry);

/* Does a packet of proto (IPPROTO_TCP or IPPROTO_UDP) from local port sport_be (network order)
 * come from one of our own live sockets? */
static inline bool loopguard_hit(struct loopguard *lg, int udp, uint16_t sport_be)
{
	uint16_t port = (uint16_t)((sport_be >> 8) | (sport_be << 8));
	uint64_t e = atomic_load_explicit(&lg->tab[udp != 0][port], memory_order_relaxed);

	return e != 0 && loopguard_confirm(lg, udp, port, e);
}

#endif
