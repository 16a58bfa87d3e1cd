/* loopguard.h — the last line against routing loops: a record of the local ports of the
 * proxy's own outbound sockets whose packets can come back in through the TUN (because a
 * route sends them there: a default route into the TUN added by hand, a missing rule for the
 * proxy's routing mark), so that such a packet is recognised and dropped instead of becoming a
 * new session that opens a new outbound socket that loops again.
 *
 * A packet of ours that comes back through the TUN has the TUN's own address (the gateway) as
 * its source: the kernel gives a socket the address of the interface its route leads to.
 *
 * TCP: loopguard_connected, right after connect() (which picks the local address and port and
 * sends the SYN), records the socket only if its local address is the gateway — only then can
 * its packets come back to us. A socket recorded there holds a 4-tuple no other socket can
 * have, so no application's connection can be mistaken for it, and sockets that leave by the
 * uplink (all of them, normally) cost one getsockname and no record. Outbound connects run on
 * the loop that reads TUN queue 0, so with one queue the SYN is read only after the record;
 * with several queues a worker can, rarely, read it first: that SYN then becomes one more
 * session, whose own outbound socket is recorded in time.
 *
 * UDP: unconnected sockets have no fixed source address, so loopguard_bind binds each one to
 * the wildcard address and port 0 before its first datagram and records it. A port bound that
 * way is the socket's alone for its family (no autobind or connect of another socket of the
 * family takes it), and the tables are per family, so only our own socket can send from it.
 *
 * How a packet is checked (any thread, lock-free): loopguard_hit looks the source port up in
 * the table of its protocol and family — one relaxed atomic load; only when an entry exists
 * does loopguard_confirm ask the kernel whether that fd is still the same socket (SO_COOKIE
 * compared). Entries are not removed when a socket closes: a stale one is found out by that
 * comparison and cleared then (compare-and-swap, so a newer entry for the port stays), so each
 * stale entry costs at most one getsockopt.
 *
 * Memory: four tables (TCP, UDP × IPv4, IPv6) of 65536 eight-byte entries, mapped zeroed and
 * touched page by page as ports are recorded. A bit per page (512 ports) says whether any port
 * of it was ever recorded, and loopguard_hit reads an entry only behind a set bit: the check of
 * every SYN and datagram (source ports the apps choose, all over the range) never faults in a
 * page of its own, so the tables hold only the pages of the ports our sockets were given.
 */
#ifndef TS_CORE_LOOPGUARD_H
#define TS_CORE_LOOPGUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define LOOPGUARD_PORTS 65536
#define LOOPGUARD_PAGE_PORTS 512 /* entries in a 4 KiB page */
#define LOOPGUARD_PAGE_WORDS (LOOPGUARD_PORTS / LOOPGUARD_PAGE_PORTS / 64)

struct loopguard {
	/* [udp][family == 6]: (fd + 1) << 32 | low 32 bits of the socket's cookie */
	_Atomic uint64_t *tab[2][2];
	/* [udp][family == 6]: bit p set once a port of page p of that table was recorded */
	_Atomic uint64_t pages[2][2][LOOPGUARD_PAGE_WORDS];
	uint8_t gw4[4], gw6[16];  /* the TUN's addresses (the gateways) */
	bool has4, has6;
};

/* gw4 / gw6: the TUN's IPv4 / IPv6 address (NULL: the TUN has none of that family).
 * 0 or -ENOMEM. */
int loopguard_new(const uint8_t gw4[4], const uint8_t gw6[16], struct loopguard **out)
	__attribute__((warn_unused_result));
void loopguard_free(struct loopguard *lg);

/* A fresh datagram socket (family 4 or 6): bind it to the wildcard address, port 0, unless it
 * is bound already (a socket hook may have), and record its port. 0 or -errno. */
int loopguard_bind(struct loopguard *lg, int fd, int family, int type)
	__attribute__((warn_unused_result));

/* A stream socket right after connect() (in progress or done): record it if its local address
 * is the gateway of its family. 1 recorded, 0 not ours to record, -errno. */
int loopguard_connected(struct loopguard *lg, int fd, int family)
	__attribute__((warn_unused_result));

/* The slow half of loopguard_hit: is the entry still a live socket of ours? Clears it if not. */
bool loopguard_confirm(struct loopguard *lg, int udp, int v6, uint16_t port, uint64_t entry);

/* Does a packet of the protocol (udp 0: TCP) and family (4 or 6) from local port sport_be
 * (network order) come from one of our own live sockets? */
static inline bool loopguard_hit(struct loopguard *lg, int udp, int family, uint16_t sport_be)
{
	uint16_t port = (uint16_t)((sport_be >> 8) | (sport_be << 8));
	int v6 = family == 6;
	unsigned pg = port / LOOPGUARD_PAGE_PORTS;
	uint64_t e;

	if (!(atomic_load_explicit(&lg->pages[udp != 0][v6][pg / 64], memory_order_relaxed) >>
	      (pg % 64) & 1))
		return false;
	e = atomic_load_explicit(&lg->tab[udp != 0][v6][port], memory_order_relaxed);
	return e != 0 && loopguard_confirm(lg, udp, v6, port, e);
}

#endif
