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
 * with several queues a worker can read it first, and the system stack checks again when it
 * accepts the connection, on that same loop, after the record (stacks/system/sys_stack.c).
 *
 * UDP: unconnected sockets have no fixed source address, so loopguard_bind binds each one to
 * the wildcard address and port 0 before its first datagram and records it. A port bound that
 * way is the socket's alone for its family (no autobind or connect of another socket of the
 * family takes it), and the tables are per family, so only our own socket can send from it.
 *
 * How a packet is checked (any thread, lock-free): loopguard_hit looks the source port up in
 * the table of its protocol and family (a few atomic loads, below); only when an entry exists
 * does loopguard_confirm ask the kernel whether that fd is still the same socket (SO_COOKIE
 * compared). Entries are not removed when a socket closes: a stale one is found out by that
 * comparison and cleared then (compare-and-swap, so a newer entry for the port stays), so each
 * stale entry costs at most one getsockopt. A table about to grow drops its stale entries too
 * (below), so what it holds follows the sockets alive, not every socket ever recorded.
 *
 * Memory: each table (TCP, UDP × IPv4, IPv6) is a hash of the ports recorded, open addressing
 * with linear probing: an array of 16-bit keys (the port; 0: a free slot) and after it the
 * array of their entries, 10 bytes a slot, never more than half the slots used. 1,000 live
 * ports take 2,048 or 4,096 slots, 20 or 40 KiB, wherever they are in the range; a table
 * indexed by port touched a page for every 512 ports of the range that held one of them (all of
 * them, with the kernel's ephemeral ports spread over it: 224 KiB for the default range). The
 * slots live in one mapping reserved at the start (MAP_NORESERVE, no huge pages): two buffers
 * per table, each big enough for the largest table (2^17 slots, so that all 65,535 ports fit),
 * of which only the slots of the one in use are ever written and resident. No slot is on the
 * heap, whose pages a long-lived small block would pin. A check reads keys, and an entry only
 * behind its key; a buffer of more than one page of keys (2,048) was sized for at least one
 * key in six slots, so the recorded ports have written on every page of its keys: checks
 * fault in no page of their own. Above about 11,000 live ports a table takes more than the
 * port-indexed one's 512 KiB: 640 KiB, and 1.25 MiB above about 21,800.
 *
 * Writers (loopguard_bind, loopguard_connected) are serialised by a mutex. A new port goes into
 * a free slot of the buffer in use (the entry first, then its key with release). A port that
 * would fill more than half the slots makes the writer rebuild: it checks every entry's socket
 * and clears the stale ones (one getsockopt each; since the last rebuild the table has taken at
 * least a sixth of its slots in new ports, so that is at most three per port recorded), fills
 * the other buffer with the live ones, sized to at least three slots per port, publishes it,
 * and retires the old one (MADV_DONTNEED: its memory is given back, and it is zero when it is
 * used again). A check may still be reading a buffer that is retired or filled again, so each
 * buffer has a sequence number, odd while it is retired or being filled, read before and after
 * the check; a check that sees it change retries on the buffer in use (a seqlock: H.-J. Boehm,
 * "Can Seqlocks Get Along With Programming Language Memory Models?", MSPC 2012, without fences:
 * every load of a check is an acquire and every store into a buffer a release). So a check
 * never misses a port recorded before it began, never reads a mix of two buffers, and never
 * waits for a writer.
 */
#ifndef TS_CORE_LOOPGUARD_H
#define TS_CORE_LOOPGUARD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LOOPGUARD_MIN_BITS 8  /* 256 slots: 2.5 KiB, one page */
#define LOOPGUARD_MAX_BITS 17 /* 131,072 slots: all 65,535 ports in at most half of them */
/* One buffer: the keys, then the entries (8-byte aligned: the key array is a multiple of 8). */
#define LOOPGUARD_BUF_BYTES                                                                     \
	(((size_t)1 << LOOPGUARD_MAX_BITS) * (sizeof(uint16_t) + sizeof(uint64_t)))

/* The hash of one protocol and family. Readers use buf[cur], sized 1 << bits[cur] slots
 * (bits 0: no slot yet, nothing recorded). */
struct loopguard_table {
	_Atomic unsigned cur;      /* the buffer in use, 0 or 1 */
	_Atomic uint32_t seq[2];   /* per buffer: odd while it is written or retired */
	_Atomic uint32_t bits[2];  /* per buffer: log2 of its slots, 0 for none */
	void *buf[2];              /* per buffer: its place in the mapping */
	uint32_t used;             /* keys in buf[cur] (stale ones included); under the lock */
};

struct loopguard {
	/* [udp][family == 6]; an entry is (fd + 1) << 32 | low 32 bits of the socket's cookie */
	struct loopguard_table tab[2][2];
	pthread_mutex_t lock; /* serialises writers: records, rebuilds */
	void *map;            /* the eight buffers, LOOPGUARD_BUF_BYTES each (to a page) */
	size_t map_len;
	uint8_t gw4[4], gw6[16]; /* the TUN's addresses (the gateways) */
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

/* Bytes of the tables' mapping resident in memory (mincore): what the record costs. */
size_t loopguard_resident_bytes(const struct loopguard *lg);

/* The slot of port in a buffer of 1 << bits slots (NULL: none). Keys are read with acquire:
 * a key seen means its entry is seen. Never more than one pass over the slots, whatever a
 * buffer being rewritten holds. */
static inline _Atomic uint64_t *loopguard_slot(void *buf, uint32_t bits, uint16_t port)
{
	_Atomic uint16_t *keys = buf;
	uint32_t n = bits ? (uint32_t)1 << bits : 0, i;

	if (n == 0 || port == 0)
		return NULL;
	i = ((uint32_t)port * 2654435761u) >> (32 - bits); /* Knuth's multiplicative hash */
	for (uint32_t k = 0; k < n; k++, i = (i + 1) & (n - 1)) {
		uint16_t key = atomic_load_explicit(&keys[i], memory_order_acquire);

		if (key == port)
			return (_Atomic uint64_t *)(keys + n) + i;
		if (key == 0)
			break;
	}
	return NULL;
}

/* The entry recorded for port in table [udp][v6], 0 if none: read from one buffer left
 * unchanged while it was read (retried otherwise), lock-free. */
static inline uint64_t loopguard_entry(struct loopguard *lg, int udp, int v6, uint16_t port)
{
	struct loopguard_table *t = &lg->tab[udp != 0][v6 != 0];

	for (;;) {
		unsigned b = atomic_load_explicit(&t->cur, memory_order_acquire);
		uint32_t seq = atomic_load_explicit(&t->seq[b], memory_order_acquire);
		uint32_t bits = atomic_load_explicit(&t->bits[b], memory_order_acquire);
		_Atomic uint64_t *slot;
		uint64_t e = 0;

		if (seq & 1)
			continue; /* retired meanwhile: cur has moved on */
		if ((slot = loopguard_slot(t->buf[b], bits, port)) != NULL)
			e = atomic_load_explicit(slot, memory_order_acquire);
		/* Every load above is an acquire: this one cannot come before them. */
		if (atomic_load_explicit(&t->seq[b], memory_order_relaxed) == seq)
			return e;
	}
}

/* Does a packet of the protocol (udp 0: TCP) and family (4 or 6) from local port sport_be
 * (network order) come from one of our own live sockets? */
static inline bool loopguard_hit(struct loopguard *lg, int udp, int family, uint16_t sport_be)
{
	uint16_t port = (uint16_t)((sport_be >> 8) | (sport_be << 8));
	uint64_t e = loopguard_entry(lg, udp, family == 6, port);

	return e != 0 && loopguard_confirm(lg, udp, family == 6, port, e);
}

#endif
