/* loopguard.c — the port record of the proxy's own outbound sockets (see loopguard.h). */
#include "core/loopguard.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#ifndef SO_COOKIE
#define SO_COOKIE 57
#endif

#define TAB_BYTES (LOOPGUARD_PORTS * sizeof(uint64_t))

int loopguard_new(const uint8_t gw4[4], const uint8_t gw6[16], struct loopguard **out)
{
	struct loopguard *lg = calloc(1, sizeof(*lg));

	if (!lg)
		return -ENOMEM;
	for (int u = 0; u < 2; u++) {
		for (int f = 0; f < 2; f++) {
			/* Page-aligned and zero without a touch: a page costs memory only once a
			 * port on it is recorded. */
			void *m = mmap(NULL, TAB_BYTES, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

			if (m == MAP_FAILED) {
				loopguard_free(lg);
				return -ENOMEM;
			}
			/* A huge page would bring 2 MiB in at the first record. */
			(void)madvise(m, TAB_BYTES, MADV_NOHUGEPAGE);
			lg->tab[u][f] = m;
		}
	}
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
	for (int u = 0; u < 2; u++)
		for (int f = 0; f < 2; f++)
			if (lg->tab[u][f])
				munmap((void *)lg->tab[u][f], TAB_BYTES);
	free(lg);
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

static int record(struct loopguard *lg, int fd, int udp, int family, uint16_t port)
{
	uint64_t cookie;
	int ret;

	unsigned pg = port / LOOPGUARD_PAGE_PORTS;

	if ((ret = cookie_of(fd, &cookie)) != 0)
		return ret;
	atomic_fetch_or_explicit(&lg->pages[udp][family == 6][pg / 64], 1ULL << (pg % 64),
				 memory_order_relaxed);
	atomic_store_explicit(&lg->tab[udp][family == 6][port], entry_of(fd, cookie),
			      memory_order_release);
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
	int fd = (int)(entry >> 32) - 1;
	uint64_t cookie;

	if (cookie_of(fd, &cookie) == 0 && entry_of(fd, cookie) == entry)
		return true;
	/* Closed (or the fd now holds another socket): forget it, unless a newer socket has
	 * taken the port meanwhile. */
	atomic_compare_exchange_strong_explicit(&lg->tab[udp != 0][v6][port], &entry, 0,
						memory_order_relaxed, memory_order_relaxed);
	return false;
}
