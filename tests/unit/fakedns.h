/* fakedns.h — a tiny fake DNS server for the unit tests: a UDP socket on 127.0.0.1 answering A
 * and AAAA queries from a table (chosen TTLs), NXDOMAIN for unknown or nx names, nothing at all
 * for silent ones. Served either by the test's own libevent loop (dns_start) or by a thread
 * that answers after a delay (dns_thread_start), for code that may block its loop.
 * Header-only (static functions): include it once, in the test file that uses it.
 */
#ifndef TS_TESTS_FAKEDNS_H
#define TS_TESTS_FAKEDNS_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "testutil.h"

struct rr {
	const char *name;
	bool nx;            /* NXDOMAIN */
	bool silent;        /* never answers */
	/* A: a forged answer of two RRs, a[0] and a[1], whose second name points into the first
	 * one's TTL bytes (TTL 0x00010100: from its second byte they read as the name "\x01").
	 * It parses as sent; aged by a second it no longer would (so a cache does not keep it). */
	bool ttl_pointer;
	uint32_t ttl;
	const char *a[4];
	const char *aaaa[4];
};

struct dns {
	int fd;
	uint16_t port;
	struct event *ev;
	const struct rr *table;
	int queries;        /* every query received */
	int q_a, q_aaaa;
	char servers[64];   /* "127.0.0.1:port" for resolver_config */
	/* thread mode: */
	pthread_t th;
	int delay_ms;       /* before each answer */
	atomic_bool stop;
};

/* The question's name as dotted text; its end offset in *end. false if malformed. */
static bool read_qname(const uint8_t *p, size_t len, char *out, size_t cap, size_t *end)
{
	size_t off = 12, o = 0;

	while (off < len && p[off]) {
		size_t l = p[off++];

		if (l > 63 || off + l > len || o + l + 2 > cap)
			return false;
		if (o)
			out[o++] = '.';
		memcpy(out + o, p + off, l);
		o += l;
		off += l;
	}
	if (off + 5 > len)
		return false;
	out[o] = '\0';
	*end = off + 1;
	return true;
}

static size_t add_answer(uint8_t *r, size_t n, int type, uint32_t ttl, const char *text)
{
	int len = type == 28 ? 16 : 4;

	tu_put16(r + n, 0xc00c);  /* the question's name */
	tu_put16(r + n + 2, (uint16_t)type);
	tu_put16(r + n + 4, 1);
	tu_put32(r + n + 6, ttl);
	tu_put16(r + n + 10, (uint16_t)len);
	cr_assert_eq(inet_pton(type == 28 ? AF_INET6 : AF_INET, text, r + n + 12), 1);
	return n + 12 + (size_t)len;
}

static void dns_on_query(evutil_socket_t fd, short what, void *arg)
{
	struct dns *d = arg;
	uint8_t q[512], r[1024];
	struct sockaddr_storage from;
	socklen_t fl = sizeof(from);
	char name[256];
	size_t qend, n, an = 0;
	const struct rr *e;
	ssize_t len = recvfrom(fd, q, sizeof(q), 0, (struct sockaddr *)&from, &fl);
	int type;

	if (len < 12 || !read_qname(q, (size_t)len, name, sizeof(name), &qend))
		return;
	type = tu_get16(q + qend);
	d->queries++;
	d->q_a += type == 1;
	d->q_aaaa += type == 28;
	for (e = d->table; e->name && strcasecmp(e->name, name) != 0; e++)
		;
	if (e->name && e->silent)
		return;
	memcpy(r, q, qend + 4);
	tu_put16(r + 2, (uint16_t)(0x8180 | (!e->name || e->nx ? 3 : 0)));
	tu_put16(r + 4, 1);
	tu_put16(r + 8, 0);
	tu_put16(r + 10, 0);  /* no additional records, whatever the query carried */
	n = qend + 4;
	if (e->name && e->ttl_pointer && type == 1) {
		size_t ttl_at = n + 6, second;

		n = add_answer(r, n, type, 0x00010100, e->a[0]);
		second = n;
		n = add_answer(r, n, type, e->ttl, e->a[1]);
		tu_put16(r + second, (uint16_t)(0xc000 | (ttl_at + 1)));
		an = 2;
	}
	for (int i = 0; e->name && !e->nx && !e->ttl_pointer && i < 4; i++) {
		const char *t = type == 28 ? e->aaaa[i] : type == 1 ? e->a[i] : NULL;

		if (!t)
			break;
		n = add_answer(r, n, type, e->ttl, t);
		an++;
	}
	tu_put16(r + 6, (uint16_t)an);
	sendto(fd, r, n, 0, (struct sockaddr *)&from, fl);
}

/* The socket on 127.0.0.1:port (0: the kernel picks). */
static void dns_open(struct dns *d, const struct rr *table, uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				  .sin_port = htons(port) };
	socklen_t len = sizeof(sa);

	memset(d, 0, sizeof(*d));
	d->table = table;
	d->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(d->fd, 0);
	cr_assert_eq(bind(d->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(getsockname(d->fd, (struct sockaddr *)&sa, &len), 0);
	d->port = ntohs(sa.sin_port);
	snprintf(d->servers, sizeof(d->servers), "127.0.0.1:%u", d->port);
}

/* Served by base, the test's own loop. */
static void dns_start(struct dns *d, struct event_base *base, const struct rr *table)
{
	dns_open(d, table, 0);
	d->ev = event_new(base, d->fd, EV_READ | EV_PERSIST, dns_on_query, d);
	cr_assert_not_null(d->ev);
	event_add(d->ev, NULL);
}

static void dns_stop(struct dns *d)
{
	event_free(d->ev);
	close(d->fd);
}

static void *dns_thread_main(void *arg)
{
	struct dns *d = arg;

	while (!atomic_load(&d->stop)) {
		struct pollfd p = { .fd = d->fd, .events = POLLIN };

		if (poll(&p, 1, 50) != 1)
			continue;
		usleep((useconds_t)d->delay_ms * 1000);
		dns_on_query(d->fd, EV_READ, d);
	}
	return NULL;
}

/* Served by a thread of its own on 127.0.0.1:port, each answer delay_ms late. */
static __attribute__((unused)) void dns_thread_start(struct dns *d, const struct rr *table,
						   uint16_t port, int delay_ms)
{
	dns_open(d, table, port);
	d->delay_ms = delay_ms;
	cr_assert_eq(pthread_create(&d->th, NULL, dns_thread_main, d), 0);
}

static __attribute__((unused)) void dns_thread_stop(struct dns *d)
{
	atomic_store(&d->stop, true);
	pthread_join(d->th, NULL);
	close(d->fd);
}

#endif
