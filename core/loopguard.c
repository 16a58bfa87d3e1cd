/* loopguard.c — the port record of the proxy's own outbound sockets (see loopguard.h). */
#include "core/loopguard.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#ifndef SO_COOKIE
#define SO_COOKIE 57
#endif

#define PORTS 65536

int loopguard_new(struct loopguard **out)
{
	struct loopguard *lg = calloc(1, sizeof(*lg));

	if (!lg)
		return -ENOMEM;
	for (int i = 0; i < 2; i++) {
		if (!(lg->tab[i] = calloc(PORTS, sizeof(*lg->tab[i])))) {
			loopguard_free(lg);
			return -ENOMEM;
		}
	}
	*out = lg;
	return 0;
}

void loopguard_free(struct loopguard *lg)
{
	if (!lg)
		return;
	free(lg->tab[0]);
	free(lg->tab[1]);
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

int loopguard_bind(struct loopguard *lg, int fd, int family, int type)
{
	struct sockaddr_storage ss;
	socklen_t len;
	uint64_t cookie;
	uint16_t port;
	int ret;

	memset(&ss, 0, sizeof(ss));
	if (family == 4) {
		((struct sockaddr_in *)&ss)->sin_family = AF_INET;
		len = sizeof(struct sockaddr_in);
	} else if (family == 6) {
		((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
		len = sizeof(struct sockaddr_in6);
	} else {
		return -EAFNOSUPPORT;
	}
	if (type != SOCK_STREAM && type != SOCK_DGRAM)
		return -EINVAL;
	if (bind(fd, (struct sockaddr *)&ss, len) != 0)
		return -errno;
	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
		return -errno;
	if ((ret = cookie_of(fd, &cookie)) != 0)
		return ret;
	port = ntohs(family == 4 ? ((struct sockaddr_in *)&ss)->sin_port
				 : ((struct sockaddr_in6 *)&ss)->sin6_port);
	atomic_store_explicit(&lg->tab[type == SOCK_DGRAM][port], entry_of(fd, cookie),
			      memory_order_release);
	return 0;
}

bool loopguard_confirm(struct loopguard *lg, int udp, uint16_t port, uint64_t entry)
{
	int fd = (int)(entry >> 32) - 1;
	uint64_t cookie;

	if (cookie_of(fd, &cookie) == 0 && entry_of(fd, cookie) == entry)
		return true;
	/* Closed (or the fd now holds another socket): forget it, unless a newer socket has
	 * taken the port meanwhile. */
	atomic_compare_exchange_strong_explicit(&lg->tab[udp != 0][port], &entry, 0,
						memory_order_relaxed, memory_order_relaxed);
	return false;
}
