/* local.c — the resolver on 127.0.0.1 for the proxy's own lookups (contracts: local.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dns/local.h"
#include "dns/server.h"

#define RX_BATCH 32
#define RX_CAP 4096   /* a query is far smaller; a larger datagram is cut and so malformed */

struct lq {
	struct dns_local *l;
	struct dns_ticket *t;
	struct lq *next, *prev;
	bool listed;
	struct sockaddr_in from;
};

struct dns_local {
	struct dns_server *s;
	int fd;
	struct event *ev;
	struct lq *pending;
	size_t n_pending;
	uint8_t buf[RX_CAP];
};

static void lq_unlink(struct dns_local *l, struct lq *q)
{
	if (!q->listed)
		return;
	if (q->prev)
		q->prev->next = q->next;
	else
		l->pending = q->next;
	if (q->next)
		q->next->prev = q->prev;
	q->listed = false;
	l->n_pending--;
}

static void on_reply(void *arg, const uint8_t *msg, size_t len)
{
	struct lq *q = arg;
	struct dns_local *l = q->l;

	lq_unlink(l, q);
	if (len)
		(void)sendto(l->fd, msg, len, MSG_DONTWAIT, (struct sockaddr *)&q->from,
			     sizeof(q->from));
	free(q);
}

static void one(struct dns_local *l, size_t n, const struct sockaddr_in *from)
{
	struct dns_ticket *t;
	struct lq *q;

	if (l->n_pending >= DNS_LOCAL_MAX_PENDING || !(q = calloc(1, sizeof(*q))))
		return;
	q->l = l;
	q->from = *from;
	if (dns_server_query_real(l->s, l->buf, n, on_reply, q, &t) != 0) {
		free(q);
		return;
	}
	if (!t)
		return; /* answered already */
	q->t = t;
	q->listed = true;
	q->next = l->pending;
	if (l->pending)
		l->pending->prev = q;
	l->pending = q;
	l->n_pending++;
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	struct dns_local *l = arg;

	(void)what;
	for (int i = 0; i < RX_BATCH; i++) {
		struct sockaddr_in from;
		socklen_t fl = sizeof(from);
		ssize_t n = recvfrom(fd, l->buf, sizeof(l->buf), MSG_DONTWAIT,
				     (struct sockaddr *)&from, &fl);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			continue;
		}
		if (fl == sizeof(from) && from.sin_family == AF_INET)
			one(l, (size_t)n, &from);
	}
}

int dns_local_new(struct event_base *base, struct dns_server *s, struct dns_local **out,
		  uint16_t *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	struct dns_local *l = calloc(1, sizeof(*l));
	int ret;

	if (!l)
		return -ENOMEM;
	l->s = s;
	l->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    getsockname(l->fd, (struct sockaddr *)&sa, &sl) != 0) {
		ret = -errno;
		goto fail;
	}
	if (!(l->ev = event_new(base, l->fd, EV_READ | EV_PERSIST, on_read, l)) ||
	    event_add(l->ev, NULL) != 0) {
		ret = -ENOMEM;
		goto fail;
	}
	*port = ntohs(sa.sin_port);
	*out = l;
	return 0;
fail:
	dns_local_free(l);
	return ret;
}

void dns_local_free(struct dns_local *l)
{
	struct lq *q;

	if (!l)
		return;
	while ((q = l->pending)) {
		lq_unlink(l, q);
		dns_server_cancel(l->s, q->t);
		free(q);
	}
	if (l->ev)
		event_free(l->ev);
	if (l->fd >= 0)
		close(l->fd);
	free(l);
}
