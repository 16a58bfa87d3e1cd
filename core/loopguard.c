/* loopguard.c — the port record of the proxy's own outbound sockets (see loopguard.h). */
#include "core/loopguard.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SO_COOKIE
#define SO_COOKIE 57
#endif

#define TABLES 4 /* [udp][v6] */

static size_t page_size(void)
{
	long page = sysconf(_SC_PAGESIZE);

	return page > 0 ? (size_t)page : 4096;
}

static size_t round_page(size_t n)
{
	return (n + page_size() - 1) & ~(page_size() - 1);
}

/* The bytes a buffer of 1 << bits slots spans, to the end of its last page. */
static size_t span(uint32_t bits)
{
	return bits ? round_page(((size_t)1 << bits) * (sizeof(uint16_t) + sizeof(uint64_t))) : 0;
}

/* Zero the slots of a buffer and give its pages back. madvise cannot fail on a page-aligned
 * range of our own private anonymous mapping; if it did, the slots are zeroed by hand. */
static void zero(void *buf, uint32_t bits)
{
	uint32_t n = bits ? (uint32_t)1 << bits : 0;
	_Atomic uint16_t *keys = buf;
	_Atomic uint64_t *ents = (_Atomic uint64_t *)(keys + n);

	if (n == 0 || madvise(buf, span(bits), MADV_DONTNEED) == 0)
		return;
	for (uint32_t i = 0; i < n; i++) {
		atomic_store_explicit(&keys[i], 0, memory_order_release);
		atomic_store_explicit(&ents[i], 0, memory_order_release);
	}
}

int loopguard_new(const uint8_t gw4[4], const uint8_t gw6[16], struct loopguard **out)
{
	struct loopguard *lg = calloc(1, sizeof(*lg));
	size_t stride = round_page(LOOPGUARD_BUF_BYTES);

	if (!lg)
		return -ENOMEM;
	if (pthread_mutex_init(&lg->lock, NULL) != 0) {
		free(lg);
		return -ENOMEM;
	}
	/* Reserved, not committed: a page costs memory once a slot on it is written. */
	lg->map_len = TABLES * 2 * stride;
	lg->map = mmap(NULL, lg->map_len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (lg->map == MAP_FAILED) {
		lg->map = NULL;
		loopguard_free(lg);
		return -ENOMEM;
	}
	/* A huge page would bring 2 MiB in at the first record. */
	(void)madvise(lg->map, lg->map_len, MADV_NOHUGEPAGE);
	for (int t = 0; t < TABLES; t++)
		for (int b = 0; b < 2; b++)
			lg->tab[t / 2][t % 2].buf[b] = (char *)lg->map + (size_t)(t * 2 + b) * stride;
	if ((lg->has4 = gw4 != NULL))
		memcpy(lg->gw4, gw4, 4);
	if ((lg->has6 = gw6 != NULL))
		memcpy(lg->gw6, gw6, 16);
	*out = lg;
	return 0;
}

void loopguard_free(struct loopguard *lg)
{
	if (!lg)
		return;
	if (lg->map)
		munmap(lg->map, lg->map_len);
	pthread_mutex_destroy(&lg->lock);
	free(lg);
}

size_t loopguard_resident_bytes(const struct loopguard *lg)
{
	size_t page = page_size(), n = 0;
	unsigned char vec[256];

	/* A piece at a time: a vector for the whole mapping would take 2,560 bytes of stack. */
	for (size_t off = 0; off < lg->map_len; off += sizeof(vec) * page) {
		size_t len = lg->map_len - off < sizeof(vec) * page ? lg->map_len - off
								    : sizeof(vec) * page;

		if (mincore((char *)lg->map + off, len, vec) != 0)
			return 0;
		for (size_t i = 0; i < len / page; i++)
			n += vec[i] & 1;
	}
	return n * page;
}

static int cookie_of(int fd, uint64_t *cookie)
{
	socklen_t len = sizeof(*cookie);

	if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, cookie, &len) != 0)
		return -errno;
	return 0;
}

static uint64_t entry_of(int fd, uint64_t cookie)
{
	/* fd + 1 so that no entry is 0; a cookie is never 0 either. */
	return ((uint64_t)(uint32_t)(fd + 1) << 32) | (uint32_t)cookie;
}

static int local_of(int fd, struct sockaddr_storage *ss)
{
	socklen_t len = sizeof(*ss);

	memset(ss, 0, sizeof(*ss));
	return getsockname(fd, (struct sockaddr *)ss, &len) == 0 ? 0 : -errno;
}

static uint16_t port_of(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
					       : ((const struct sockaddr_in *)ss)->sin_port);
}

static bool alive(uint64_t entry)
{
	int fd = (int)(entry >> 32) - 1;
	uint64_t cookie;

	return cookie_of(fd, &cookie) == 0 && entry_of(fd, cookie) == entry;
}

/* Into a free slot of a buffer (there is one: at most half are used). The entry first, then
 * the key. Both with release, paired with the readers' acquire: a reader that sees the key sees
 * the entry, and one that sees either in a buffer being filled sees its odd sequence number
 * after (the seqlock without fences, which ThreadSanitizer does not model). */
static void put(void *buf, uint32_t bits, uint16_t port, uint64_t entry)
{
	_Atomic uint16_t *keys = buf;
	_Atomic uint64_t *ents = (_Atomic uint64_t *)(keys + ((uint32_t)1 << bits));
	uint32_t mask = ((uint32_t)1 << bits) - 1;
	uint32_t i = ((uint32_t)port * 2654435761u) >> (32 - bits); /* as loopguard_slot */

	while (atomic_load_explicit(&keys[i], memory_order_relaxed) != 0)
		i = (i + 1) & mask;
	atomic_store_explicit(&ents[i], entry, memory_order_release);
	atomic_store_explicit(&keys[i], port, memory_order_release);
}

/* Clear the stale entries of the buffer in use; how many live ones stay. Caller holds the
 * lock. */
static uint32_t purge(struct loopguard_table *t, unsigned b)
{
	uint32_t bits = atomic_load_explicit(&t->bits[b], memory_order_relaxed), live = 0;
	uint32_t n = bits ? (uint32_t)1 << bits : 0;
	_Atomic uint64_t *ents = (_Atomic uint64_t *)((_Atomic uint16_t *)t->buf[b] + n);

	for (uint32_t i = 0; i < n; i++) {
		uint64_t e = atomic_load_explicit(&ents[i], memory_order_relaxed);

		if (e == 0)
			continue;
		if (alive(e))
			live++;
		else /* as loopguard_confirm: a newer entry for the port stays */
			atomic_compare_exchange_strong_explicit(&ents[i], &e, 0, memory_order_relaxed,
								memory_order_relaxed);
	}
	return live;
}

/* The smallest buffer with at least three slots per port: it has room for half as many
 * ports again before the next rebuild. */
static uint32_t bits_for(uint32_t ports)
{
	uint32_t bits = LOOPGUARD_MIN_BITS;

	while (bits < LOOPGUARD_MAX_BITS && ((uint32_t)1 << bits) < 3 * ports)
		bits++;
	return bits;
}

/* Move the live entries of the buffer in use, with room for one more port, into the other
 * buffer, publish it and retire the old one. Caller holds the lock. */
static void rebuild(struct loopguard_table *t)
{
	unsigned b = atomic_load_explicit(&t->cur, memory_order_relaxed), o = !b;
	uint32_t obits = atomic_load_explicit(&t->bits[b], memory_order_relaxed);
	uint32_t bits = bits_for(purge(t, b) + 1);
	uint32_t seq = atomic_load_explicit(&t->seq[o], memory_order_relaxed);
	uint32_t n = obits ? (uint32_t)1 << obits : 0;
	_Atomic uint16_t *keys = t->buf[b];
	_Atomic uint64_t *ents = (_Atomic uint64_t *)(keys + n);

	/* The other buffer is zero: never used, or retired (given back, and since then only ever
	 * compare-and-swapped to 0 by a late loopguard_confirm). Odd while it is filled. */
	if (!(seq & 1))
		atomic_store_explicit(&t->seq[o], ++seq, memory_order_relaxed);
	/* Release, as put's stores: a reader that sees the new size sees the odd number. */
	atomic_store_explicit(&t->bits[o], bits, memory_order_release);
	t->used = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t e = atomic_load_explicit(&ents[i], memory_order_relaxed);

		if (e != 0) {
			put(t->buf[o], bits, atomic_load_explicit(&keys[i], memory_order_relaxed), e);
			t->used++;
		}
	}
	atomic_store_explicit(&t->seq[o], seq + 1, memory_order_release);
	atomic_store_explicit(&t->cur, o, memory_order_release);
	/* Retire the old buffer: odd first, so that a reader still in it retries. The zeroing is
	 * a system call after the store, and a reader's next load after the pages went (its CPU
	 * interrupted to flush them, or off it meanwhile) sees the store. */
	seq = atomic_load_explicit(&t->seq[b], memory_order_relaxed);
	atomic_store_explicit(&t->seq[b], seq + 1, memory_order_seq_cst);
	zero(t->buf[b], obits);
}

/* Takes the lock: one writer at a time. */
static int record(struct loopguard *lg, int fd, int udp, int family, uint16_t port)
{
	struct loopguard_table *t = &lg->tab[udp][family == 6];
	_Atomic uint64_t *slot;
	uint64_t cookie, entry;
	unsigned b;
	uint32_t bits;
	int ret;

	if ((ret = cookie_of(fd, &cookie)) != 0)
		return ret;
	if (port == 0)
		return 0; /* no port (key 0 is a free slot): no packet comes from it */
	entry = entry_of(fd, cookie);
	pthread_mutex_lock(&lg->lock);
	b = atomic_load_explicit(&t->cur, memory_order_relaxed);
	bits = atomic_load_explicit(&t->bits[b], memory_order_relaxed);
	if ((slot = loopguard_slot(t->buf[b], bits, port)) != NULL) {
		atomic_store_explicit(slot, entry, memory_order_release);
	} else {
		if (bits == 0 || t->used + 1 > ((uint32_t)1 << bits) / 2) {
			rebuild(t);
			b = atomic_load_explicit(&t->cur, memory_order_relaxed);
			bits = atomic_load_explicit(&t->bits[b], memory_order_relaxed);
		}
		put(t->buf[b], bits, port, entry);
		t->used++;
	}
	pthread_mutex_unlock(&lg->lock);
	return 0;
}

int loopguard_bind(struct loopguard *lg, int fd, int family, int type)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int ret;

	if (family != 4 && family != 6)
		return -EAFNOSUPPORT;
	if (type != SOCK_DGRAM && type != SOCK_STREAM)
		return -EINVAL;
	if ((ret = local_of(fd, &ss)) != 0)
		return ret;
	if (port_of(&ss) == 0) {
		memset(&ss, 0, sizeof(ss));
		ss.ss_family = family == 4 ? AF_INET : AF_INET6;
		len = family == 4 ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
		if (bind(fd, (struct sockaddr *)&ss, len) != 0)
			return -errno;
		if ((ret = local_of(fd, &ss)) != 0)
			return ret;
	}
	return record(lg, fd, type == SOCK_DGRAM, family, port_of(&ss));
}

int loopguard_connected(struct loopguard *lg, int fd, int family)
{
	struct sockaddr_storage ss;
	int ret;

	if ((ret = local_of(fd, &ss)) != 0)
		return ret;
	if (family == 4) {
		if (!lg->has4 || ss.ss_family != AF_INET ||
		    memcmp(&((struct sockaddr_in *)&ss)->sin_addr, lg->gw4, 4) != 0)
			return 0;
	} else {
		if (!lg->has6 || ss.ss_family != AF_INET6 ||
		    memcmp(&((struct sockaddr_in6 *)&ss)->sin6_addr, lg->gw6, 16) != 0)
			return 0;
	}
	if ((ret = record(lg, fd, 0, family, port_of(&ss))) != 0)
		return ret;
	return 1;
}

bool loopguard_confirm(struct loopguard *lg, int udp, int v6, uint16_t port, uint64_t entry)
{
	struct loopguard_table *t = &lg->tab[udp != 0][v6 != 0];
	unsigned b;
	_Atomic uint64_t *slot;

	if (alive(entry))
		return true;
	/* Closed (or the fd now holds another socket): forget it, unless a newer socket has
	 * taken the port meanwhile. No seqlock here: an entry names one socket, which had one
	 * port, so wherever this finds it, it is that port's stale entry (and if a rebuild moved
	 * it, the next check clears it). */
	b = atomic_load_explicit(&t->cur, memory_order_acquire);
	slot = loopguard_slot(t->buf[b], atomic_load_explicit(&t->bits[b], memory_order_relaxed),
			      port);
	if (slot)
		atomic_compare_exchange_strong_explicit(slot, &entry, 0, memory_order_relaxed,
							memory_order_relaxed);
	return false;
}
