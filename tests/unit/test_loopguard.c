/* test_loopguard.c — the port record of the proxy's own sockets (core/loopguard.c): a bound
 * socket is found by its port while it lives, per protocol; a closed one is not, and its entry
 * is cleared; an fd number reused by another socket does not pass for the old one. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/loopguard.h"

static uint16_t port_of(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &sl), 0);
	return ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
					     : ((struct sockaddr_in6 *)&ss)->sin6_port);
}

Test(loopguard, bound_sockets_are_found_while_they_live)
{
	struct loopguard *g;
	int t = socket(AF_INET, SOCK_STREAM, 0), u = socket(AF_INET6, SOCK_DGRAM, 0);

	cr_assert_eq(loopguard_new(&g), 0);
	cr_assert_eq(loopguard_bind(g, t, 4, SOCK_STREAM), 0);
	cr_assert_eq(loopguard_bind(g, u, 6, SOCK_DGRAM), 0);
	uint16_t tp = port_of(t), up = port_of(u);
	cr_assert_neq(tp, 0, "bound to a real port");
	cr_assert(loopguard_hit(g, 0, htons(tp)));
	cr_assert(loopguard_hit(g, 1, htons(up)));
	if (tp != up) {
		cr_assert_not(loopguard_hit(g, 1, htons(tp)), "per protocol");
		cr_assert_not(loopguard_hit(g, 0, htons(up)));
	}
	/* The fd number comes back for another socket: still not the one on record. */
	cr_assert_neq(atomic_load(&g->tab[1][up]), 0);
	int old = u;
	close(u);
	int again = socket(AF_INET6, SOCK_DGRAM, 0);
	cr_assert_eq(again, old, "the same fd number");
	cr_assert_not(loopguard_hit(g, 1, htons(up)));
	close(again);
	close(t);
	cr_assert_not(loopguard_hit(g, 0, htons(tp)), "closed");
	cr_assert_eq(atomic_load(&g->tab[0][tp]), 0, "stale entry cleared");
	loopguard_free(g);
}

Test(loopguard, a_newer_socket_keeps_its_entry)
{
	struct loopguard *g;
	int a = socket(AF_INET, SOCK_DGRAM, 0);

	cr_assert_eq(loopguard_new(&g), 0);
	cr_assert_eq(loopguard_bind(g, a, 4, SOCK_DGRAM), 0);
	uint16_t pa = port_of(a);
	uint64_t stale = atomic_load(&g->tab[1][pa]);
	/* A confirmation that raced with a newer record of the port must not erase it. */
	int b = socket(AF_INET, SOCK_DGRAM, 0);
	close(a);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(pa) };
	if (bind(b, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		uint64_t cookie;
		socklen_t l = sizeof(cookie);
		cr_assert_eq(getsockopt(b, SOL_SOCKET, SO_COOKIE, &cookie, &l), 0);
		uint64_t fresh = ((uint64_t)(uint32_t)(b + 1) << 32) | (uint32_t)cookie;
		atomic_store(&g->tab[1][pa], fresh);
		cr_assert_not(loopguard_confirm(g, 1, pa, stale));
		cr_assert_eq(atomic_load(&g->tab[1][pa]), fresh, "the newer entry stays");
		cr_assert(loopguard_hit(g, 1, htons(pa)));
	}
	close(b);
	loopguard_free(g);
}

Test(loopguard, refusals)
{
	struct loopguard *g;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_eq(loopguard_new(&g), 0);
	cr_assert_eq(loopguard_bind(g, fd, 5, SOCK_STREAM), -EAFNOSUPPORT);
	cr_assert_eq(loopguard_bind(g, fd, 4, SOCK_RAW), -EINVAL);
	cr_assert_eq(loopguard_bind(g, fd, 4, SOCK_STREAM), 0);
	cr_assert_eq(loopguard_bind(g, fd, 4, SOCK_STREAM), -EINVAL, "already bound");
	cr_assert_eq(loopguard_bind(g, -1, 4, SOCK_STREAM), -EBADF);
	close(fd);
	loopguard_free(g);
	loopguard_free(NULL);
}
