/* test_loopguard.c — the port record of the proxy's own sockets (core/loopguard.c): a datagram
 * socket is bound and found by its port while it lives, per protocol and family; a closed one
 * is not, and its entry is cleared; an fd number reused by another socket does not pass for the
 * old one; a stream socket is recorded only when connect() gave it the gateway as its source
 * (routed into the TUN), never when it leaves by another interface; checking packets from
 * every port faults no page in; a thousand sockets take a few pages, not a page per 512 ports
 * of the range they are spread over, and sockets closed long ago take none. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/loopguard.h"

static const uint8_t gw4[4] = { 127, 0, 0, 1 }; /* loopback stands in for the TUN */
static const uint8_t gw6[16] = { [15] = 1 };

static uint16_t port_of(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &sl), 0);
	return ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
					     : ((struct sockaddr_in6 *)&ss)->sin6_port);
}

Test(loopguard, datagram_sockets_are_found_while_they_live)
{
	struct loopguard *g;
	int a = socket(AF_INET, SOCK_DGRAM, 0), b = socket(AF_INET6, SOCK_DGRAM, 0);

	cr_assert_eq(loopguard_new(gw4, gw6, &g), 0);
	cr_assert_eq(loopguard_bind(g, a, 4, SOCK_DGRAM), 0);
	cr_assert_eq(loopguard_bind(g, b, 6, SOCK_DGRAM), 0);
	uint16_t pa = port_of(a), pb = port_of(b);
	cr_assert_neq(pa, 0, "bound to a real port");
	cr_assert(loopguard_hit(g, 1, 4, htons(pa)));
	cr_assert(loopguard_hit(g, 1, 6, htons(pb)));
	cr_assert_not(loopguard_hit(g, 0, 4, htons(pa)), "per protocol");
	if (pa != pb) {
		cr_assert_not(loopguard_hit(g, 1, 6, htons(pa)), "per family");
		cr_assert_not(loopguard_hit(g, 1, 4, htons(pb)));
	}
	/* The fd number comes back for another socket: still not the one on record. */
	int old = b;
	close(b);
	int again = socket(AF_INET6, SOCK_DGRAM, 0);
	cr_assert_eq(again, old, "the same fd number");
	cr_assert_not(loopguard_hit(g, 1, 6, htons(pb)));
	close(again);
	close(a);
	cr_assert_not(loopguard_hit(g, 1, 4, htons(pa)), "closed");
	cr_assert_eq(loopguard_entry(g, 1, 0, pa), 0, "stale entry cleared");
	loopguard_free(g);
}

Test(loopguard, a_socket_bound_by_a_hook_is_recorded_as_it_is)
{
	struct loopguard *g;
	int a = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

	cr_assert_eq(loopguard_new(gw4, NULL, &g), 0);
	cr_assert_eq(bind(a, (struct sockaddr *)&sa, sizeof(sa)), 0);
	uint16_t pa = port_of(a);
	cr_assert_eq(loopguard_bind(g, a, 4, SOCK_DGRAM), 0, "no second bind");
	cr_assert_eq(port_of(a), pa);
	cr_assert(loopguard_hit(g, 1, 4, htons(pa)));
	close(a);
	loopguard_free(g);
}

Test(loopguard, a_newer_socket_keeps_its_entry)
{
	struct loopguard *g;
	int a = socket(AF_INET, SOCK_DGRAM, 0);

	cr_assert_eq(loopguard_new(gw4, NULL, &g), 0);
	cr_assert_eq(loopguard_bind(g, a, 4, SOCK_DGRAM), 0);
	uint16_t pa = port_of(a);
	uint64_t stale = loopguard_entry(g, 1, 0, pa);
	/* A confirmation that raced with a newer record of the port must not erase it. */
	int b = socket(AF_INET, SOCK_DGRAM, 0);
	close(a);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(pa) };
	if (bind(b, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		cr_assert_eq(loopguard_bind(g, b, 4, SOCK_DGRAM), 0);
		uint64_t fresh = loopguard_entry(g, 1, 0, pa);
		cr_assert_neq(fresh, stale);
		cr_assert_not(loopguard_confirm(g, 1, 0, pa, stale));
		cr_assert_eq(loopguard_entry(g, 1, 0, pa), fresh, "the newer entry stays");
		cr_assert(loopguard_hit(g, 1, 4, htons(pa)));
	}
	close(b);
	loopguard_free(g);
}

/* A stream socket: recorded after connect() only with the gateway as its source. Loopback
 * plays the TUN: a connection to 127.0.0.1 gets 127.0.0.1 as its source. */
Test(loopguard, stream_sockets_are_recorded_only_when_routed_to_the_gateway)
{
	struct loopguard *g, *other;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	const uint8_t elsewhere[4] = { 192, 0, 2, 1 };

	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 4), 0);
	cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	cr_assert_eq(loopguard_new(gw4, NULL, &g), 0);
	cr_assert_eq(loopguard_new(elsewhere, NULL, &other), 0);
	int c = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(loopguard_connected(g, c, 4), 1, "its source is the gateway");
	cr_assert_eq(loopguard_connected(other, c, 4), 0, "not routed to this gateway");
	cr_assert_eq(loopguard_connected(g, c, 6), 0, "no IPv6 gateway");
	uint16_t pc = port_of(c);
	cr_assert(loopguard_hit(g, 0, 4, htons(pc)));
	cr_assert_not(loopguard_hit(other, 0, 4, htons(pc)));
	cr_assert_not(loopguard_hit(g, 1, 4, htons(pc)), "TCP only");
	close(c);
	cr_assert_not(loopguard_hit(g, 0, 4, htons(pc)));
	close(l);
	loopguard_free(g);
	loopguard_free(other);
}

Test(loopguard, refusals)
{
	struct loopguard *g;
	int fd = socket(AF_INET, SOCK_DGRAM, 0);

	cr_assert_eq(loopguard_new(NULL, NULL, &g), 0);
	cr_assert_eq(loopguard_bind(g, fd, 5, SOCK_DGRAM), -EAFNOSUPPORT);
	cr_assert_eq(loopguard_bind(g, fd, 4, SOCK_RAW), -EINVAL);
	cr_assert_eq(loopguard_bind(g, -1, 4, SOCK_DGRAM), -EBADF);
	cr_assert_eq(loopguard_connected(g, -1, 4), -EBADF);
	close(fd);
	loopguard_free(g);
	loopguard_free(NULL);
}

Test(loopguard, checks_touch_only_the_pages_of_recorded_ports)
{
	/* Every source port of every table checked, as an app's packets would be: no page is
	 * faulted in. Then one datagram socket recorded: one page (the smallest table), and
	 * checks still find it and still fault nothing in. */
	struct loopguard *lg;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	int fd;
	uint16_t port;

	cr_assert_eq(loopguard_new(gw4, gw6, &lg), 0);
	for (int u = 0; u < 2; u++)
		for (int f = 4; f <= 6; f += 2)
			for (uint32_t p = 0; p < 65536; p++)
				cr_assert(!loopguard_hit(lg, u, f, htons((uint16_t)p)));
	cr_expect_eq(loopguard_resident_bytes(lg), 0, "pages after checks alone");
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(loopguard_bind(lg, fd, 4, SOCK_DGRAM), 0);
	port = port_of(fd);
	cr_expect(loopguard_hit(lg, 1, 4, htons(port)));
	cr_expect_eq(loopguard_resident_bytes(lg), page);
	for (int u = 0; u < 2; u++)
		for (int f = 4; f <= 6; f += 2)
			for (uint32_t p = 0; p < 65536; p++)
				cr_assert_eq(loopguard_hit(lg, u, f, htons((uint16_t)p)),
					     u == 1 && f == 4 && p == port);
	cr_expect_eq(loopguard_resident_bytes(lg), page, "no page of the checks' own");
	close(fd);
	loopguard_free(lg);
}

/* Room for n descriptors and a few more (the soft limit raised if need be). */
static void want_fds(rlim_t n)
{
	struct rlimit rl;

	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < n + 64) {
		if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < n + 64)
			cr_skip_test("%llu descriptors at most", (unsigned long long)rl.rlim_max);
		rl.rlim_cur = n + 64;
		cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
}

#define MANY 1000
/* A table indexed by port took a page per 512 ports of the range they are spread over: 224 KiB
 * for MANY over the default ephemeral range (32768-60999). */
#define SMALL (64 * 1024)

/* MANY IPv4 datagram sockets, recorded: the kernel picks their ports, spread over its
 * ephemeral range. in[p] set for each port. */
static void record_many(struct loopguard *lg, int fds[MANY], uint16_t ports[MANY], bool in[65536])
{
	for (int i = 0; i < MANY; i++) {
		fds[i] = socket(AF_INET, SOCK_DGRAM, 0);
		cr_assert_geq(fds[i], 0);
		cr_assert_eq(loopguard_bind(lg, fds[i], 4, SOCK_DGRAM), 0);
		ports[i] = port_of(fds[i]);
		in[ports[i]] = true;
	}
}

Test(loopguard, a_thousand_sockets_take_a_few_pages)
{
	/* The table follows the ports recorded, not the range they are spread over; every one
	 * is found, no other port is, checking every port adds no page, and once the sockets are
	 * closed their entries are cleared on sight. */
	static bool in[65536];
	struct loopguard *lg;
	int fds[MANY];
	uint16_t ports[MANY];
	size_t used;

	want_fds(MANY);
	cr_assert_eq(loopguard_new(gw4, gw6, &lg), 0);
	record_many(lg, fds, ports, in);
	used = loopguard_resident_bytes(lg);
	cr_log_info("%d sockets: %zu bytes resident", MANY, used);
	cr_expect_leq(used, SMALL, "%d sockets: %zu bytes resident", MANY, used);
	for (uint32_t p = 0; p < 65536; p++)
		cr_assert_eq(loopguard_hit(lg, 1, 4, htons((uint16_t)p)), in[p], "port %u", p);
	cr_expect_eq(loopguard_resident_bytes(lg), used, "no page of the checks' own");
	for (int i = 0; i < MANY; i++)
		close(fds[i]);
	for (int i = 0; i < MANY; i++) {
		cr_assert_not(loopguard_hit(lg, 1, 4, htons(ports[i])), "port %u closed", ports[i]);
		cr_assert_eq(loopguard_entry(lg, 1, 0, ports[i]), 0, "cleared");
	}
	loopguard_free(lg);
}

Test(loopguard, memory_follows_the_live_sockets)
{
	/* Rounds of MANY sockets opened, recorded and closed, so that most ports of the range
	 * are recorded at one time or another: the stale entries are dropped as the table would
	 * grow, the buffers it leaves are given back, and it stays the size of one round on a
	 * fresh record. The last round is still found. */
	static bool in[65536];
	struct loopguard *lg;
	int fds[MANY];
	uint16_t ports[MANY];
	size_t used, one;

	want_fds(MANY);
	cr_assert_eq(loopguard_new(gw4, NULL, &lg), 0);
	record_many(lg, fds, ports, in);
	one = loopguard_resident_bytes(lg);
	for (int i = 0; i < MANY; i++)
		close(fds[i]);
	loopguard_free(lg);
	cr_assert_eq(loopguard_new(gw4, NULL, &lg), 0);
	for (int round = 0; round < 8; round++) {
		for (int i = 0; round > 0 && i < MANY; i++)
			close(fds[i]);
		record_many(lg, fds, ports, in);
	}
	used = loopguard_resident_bytes(lg);
	cr_log_info("%d rounds of %d sockets: %zu bytes resident", 8, MANY, used);
	cr_expect_leq(used, one, "%zu bytes resident, %zu for one round", used, one);
	cr_expect_leq(used, SMALL);
	for (int i = 0; i < MANY; i++) {
		cr_assert(loopguard_hit(lg, 1, 4, htons(ports[i])), "port %u", ports[i]);
		close(fds[i]);
	}
	loopguard_free(lg);
}
