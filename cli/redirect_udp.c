/* redirect_udp.c — the UDP forwarder of `twinstack redirect` (redirect_udp.h).
 *
 *   client --(nft: redirect to :PORT, or sent there)--> listening socket
 *     recvmmsg -> flow of the client's source (one connected, marked socket) -> sendmmsg -> to
 *   to --> the flow's socket: recvmmsg -> sendmmsg from the listening socket to the client
 *
 * One thread, the caller's libevent loop. Flows live in a chained hash table keyed by the
 * client's address and port, and on a list in order of their last datagram, so the idle sweep
 * (a timer once a second while any flow exists) ends the oldest first and stops at the first
 * flow still in use.
 */
#include "cli/redirect_udp.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "outbound/outbound.h"

#define RD_UDP_BUCKETS 4096         /* hash chains (a power of two) */
#define RD_UDP_SLOT 65536           /* bytes per receive slot: any datagram fits */
#define RD_UDP_SWEEP_MS 1000        /* the idle sweep's period while flows exist */
#define RD_UDP_READS_PER_WAKE 8     /* recvmmsg batches per readable event, then the loop */

struct rd_udp_counters {
	uint64_t flows_total;       /* flows made */
	uint64_t flows_idle;        /* flows ended by the idle time */
	uint64_t datagrams_up;      /* client -> upstream, sent */
	uint64_t datagrams_down;    /* upstream -> client, sent */
	uint64_t bytes_up, bytes_down;
	uint64_t drop_admission;    /* no flow: the budget's UDP admission said no */
	uint64_t drop_fd;           /* no flow: no descriptor in the budget */
	uint64_t drop_socket;       /* no flow: socket() failed */
	uint64_t drop_connect;      /* no flow: connect() to the upstream failed */
	uint64_t drop_event;        /* no flow: its read event or the sweep could not be armed */
	uint64_t drop_nomem;        /* no flow: out of memory */
	uint64_t drop_full_up;      /* the flow's socket had no room (EAGAIN, ENOBUFS) */
	uint64_t drop_error_up;     /* it refused a datagram otherwise */
	uint64_t drop_full_down;    /* the listening socket had no room for a reply */
	uint64_t drop_error_down;   /* it refused a reply otherwise */
	uint64_t drop_bad_source;   /* a source address that is neither IPv4 nor IPv6 */
	uint64_t upstream_errors;   /* ICMP errors (unreachable) a flow's socket reported, on a
				     * receive or in place of a send (that datagram is dropped) */
	uint64_t sweep_rearm_failed; /* the idle sweep could not re-arm (the next flow will) */
};

struct rd_flow {
	struct rd_udp *u;
	int fd;
	int lfd;                          /* the listening socket its datagrams came to */
	struct event *ev;
	struct sockaddr_storage client;
	socklen_t client_len;
	uint8_t addr[16];
	uint16_t port_be;
	uint8_t family;
	int64_t last_ns;
	struct rd_flow *chain;            /* hash bucket */
	struct rd_flow *older, *newer;    /* activity list */
};

struct rd_batch {
	struct mmsghdr m[RD_UDP_BATCH];
	struct iovec iov[RD_UDP_BATCH];
	struct sockaddr_storage name[RD_UDP_BATCH];
	char *slots;                      /* RD_UDP_BATCH * RD_UDP_SLOT */
};

struct rd_udp {
	struct event_base *base;
	const struct ts_outbound *ob;
	struct budget *budget;
	struct netaddr_ep to;
	struct sockaddr_storage to_ss;
	socklen_t to_len;
	int64_t idle_ns;
	int fd[2];                        /* the listening sockets, IPv4 and IPv6; -1: none */
	struct event *ev[2], *sweep;
	struct rd_flow *bucket[RD_UDP_BUCKETS];
	struct rd_flow *oldest, *newest;
	uint64_t active;
	struct rd_batch in, out;          /* received; to send */
	struct rd_flow *dest[RD_UDP_BATCH];
	struct rd_udp_counters c;
};

static uint32_t flow_hash(int family, const uint8_t *addr, uint16_t port_be)
{
	uint32_t h = 2166136261u ^ (uint32_t)family;

	for (int i = 0; i < (family == 4 ? 4 : 16); i++)
		h = (h ^ addr[i]) * 16777619u;
	h = (h ^ port_be) * 16777619u;
	return h ^ (h >> 15);
}

static struct rd_flow **flow_slot(struct rd_udp *u, int family, const uint8_t *addr,
				  uint16_t port_be)
{
	struct rd_flow **p = &u->bucket[flow_hash(family, addr, port_be) & (RD_UDP_BUCKETS - 1)];

	while (*p && !((*p)->family == family && (*p)->port_be == port_be &&
		       memcmp((*p)->addr, addr, 16) == 0))
		p = &(*p)->chain;
	return p;
}

static void list_unlink(struct rd_udp *u, struct rd_flow *f)
{
	if (f->older)
		f->older->newer = f->newer;
	else
		u->oldest = f->newer;
	if (f->newer)
		f->newer->older = f->older;
	else
		u->newest = f->older;
	f->older = f->newer = NULL;
}

static void list_push_newest(struct rd_udp *u, struct rd_flow *f)
{
	f->older = u->newest;
	f->newer = NULL;
	if (u->newest)
		u->newest->newer = f;
	else
		u->oldest = f;
	u->newest = f;
}

static void flow_touch(struct rd_udp *u, struct rd_flow *f, int64_t now)
{
	f->last_ns = now;
	if (u->newest != f) {
		list_unlink(u, f);
		list_push_newest(u, f);
	}
}

static void flow_free(struct rd_udp *u, struct rd_flow *f)
{
	struct rd_flow **p = flow_slot(u, f->family, f->addr, f->port_be);

	*p = f->chain;
	list_unlink(u, f);
	if (f->ev)
		event_free(f->ev);
	close(f->fd);
	budget_fd_release(u->budget, 1);
	budget_udp_release(u->budget);
	u->active--;
	free(f);
}

/* Sends m[0..n) on fd, each datagram tried once: after a partial send the rest goes on from
 * where it stopped; no room (EAGAIN, ENOBUFS) drops what is left of the batch (counted in
 * *full); any other error drops the datagram it stopped at (an ICMP error the socket held:
 * *icmp, else *error) and the next is tried. Returns how many went out; their bytes are
 * added to *bytes. */
static int send_all(int fd, struct mmsghdr *m, int n, uint64_t *bytes, uint64_t *full,
		    uint64_t *error, uint64_t *icmp)
{
	int i = 0, sent = 0;

	while (i < n) {
		int k = sendmmsg(fd, m + i, (unsigned)(n - i), MSG_DONTWAIT);

		if (k > 0) {
			for (int j = i; j < i + k; j++)
				*bytes += m[j].msg_len;
			i += k;
			sent += k;
			continue;
		}
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
			*full += (uint64_t)(n - i);
			break;
		}
		if (k < 0 && (errno == ECONNREFUSED || errno == EHOSTUNREACH ||
			      errno == ENETUNREACH))
			(*icmp)++;
		else
			(*error)++;
		i++;
	}
	return sent;
}

/* ---- upstream -> client ---------------------------------------------------------------- */

static void on_flow_readable(evutil_socket_t fd, short what, void *arg)
{
	struct rd_flow *f = arg;
	struct rd_udp *u = f->u;
	struct rd_batch *b = &u->out;
	int64_t now = ts_now_ns();

	(void)what;
	for (int round = 0; round < RD_UDP_READS_PER_WAKE; round++) {
		int n, sent;

		for (int i = 0; i < RD_UDP_BATCH; i++) {
			b->iov[i].iov_len = RD_UDP_SLOT;
			b->m[i].msg_hdr.msg_name = NULL;
			b->m[i].msg_hdr.msg_namelen = 0;
		}
		n = recvmmsg(fd, b->m, RD_UDP_BATCH, MSG_DONTWAIT, NULL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			/* A queued error (ICMP unreachable) is reported once; the next read goes on. */
			u->c.upstream_errors++;
			continue;
		}
		if (n == 0)
			break;
		for (int i = 0; i < n; i++) {
			b->iov[i].iov_len = b->m[i].msg_len;
			b->m[i].msg_hdr.msg_name = &f->client;
			b->m[i].msg_hdr.msg_namelen = f->client_len;
		}
		flow_touch(u, f, now);
		sent = send_all(f->lfd, b->m, n, &u->c.bytes_down, &u->c.drop_full_down,
				&u->c.drop_error_down, &u->c.drop_error_down);
		u->c.datagrams_down += (uint64_t)sent;
		if (n < RD_UDP_BATCH)
			break;
	}
}

/* ---- client -> upstream ---------------------------------------------------------------- */

static int sweep_arm(struct rd_udp *u)
{
	struct timeval tv = { RD_UDP_SWEEP_MS / 1000, (RD_UDP_SWEEP_MS % 1000) * 1000 };

	return evtimer_add(u->sweep, &tv) == 0 ? 0 : -ENOMEM;
}

/* A new flow for the client at ss, or NULL (counted). */
static struct rd_flow *flow_new(struct rd_udp *u, int lfd, const struct sockaddr_storage *ss,
				socklen_t len, int family, const uint8_t *addr, uint16_t port_be,
				struct rd_flow **slot)
{
	struct rd_flow *f;
	int fd = -1;

	if (budget_udp_acquire(u->budget) != 0) {
		u->c.drop_admission++;
		return NULL;
	}
	if (budget_fd_reserve(u->budget, 1) != 0) {
		budget_udp_release(u->budget);
		u->c.drop_fd++;
		return NULL;
	}
	if (outbound_socket(u->ob, u->to.addr.family, SOCK_DGRAM, &fd) != 0) {
		fd = -1;
		u->c.drop_socket++;
		goto fail;
	}
	if (connect(fd, (const struct sockaddr *)&u->to_ss, u->to_len) != 0) {
		u->c.drop_connect++;
		goto fail;
	}
	if (!(f = calloc(1, sizeof(*f)))) {
		u->c.drop_nomem++;
		goto fail;
	}
	f->u = u;
	f->fd = fd;
	f->lfd = lfd;
	f->client = *ss;
	f->client_len = len;
	f->family = (uint8_t)family;
	memcpy(f->addr, addr, 16);
	f->port_be = port_be;
	f->ev = event_new(u->base, fd, EV_READ | EV_PERSIST, on_flow_readable, f);
	if (!f->ev || event_add(f->ev, NULL) != 0 ||
	    (!evtimer_pending(u->sweep, NULL) && sweep_arm(u) != 0)) {
		if (f->ev)
			event_free(f->ev);
		free(f);
		u->c.drop_event++;
		goto fail;
	}
	*slot = f;
	list_push_newest(u, f);
	u->active++;
	u->c.flows_total++;
	return f;
fail:
	if (fd >= 0)
		close(fd);
	budget_fd_release(u->budget, 1);
	budget_udp_release(u->budget);
	return NULL;
}

/* The flow of the i-th received datagram, made if new; NULL: dropped (counted). */
static struct rd_flow *flow_of(struct rd_udp *u, int lfd, int i, int64_t now)
{
	const struct sockaddr_storage *ss = &u->in.name[i];
	struct rd_flow **slot, *f;
	uint8_t addr[16];
	uint16_t port_be;
	int family = netaddr_from_sockaddr(ss, addr, &port_be);

	if (family == 0) {
		u->c.drop_bad_source++;
		return NULL;
	}
	slot = flow_slot(u, family, addr, port_be);
	f = *slot ? *slot : flow_new(u, lfd, ss, u->in.m[i].msg_hdr.msg_namelen, family, addr,
				     port_be, slot);
	if (f)
		flow_touch(u, f, now);
	return f;
}

/* Sends received datagrams [i, j), all of flow f, in one sendmmsg on its socket. */
static void send_up(struct rd_udp *u, struct rd_flow *f, int i, int j)
{
	struct rd_batch *b = &u->in;
	int sent;

	for (int k = i; k < j; k++) {
		b->m[k].msg_hdr.msg_name = NULL;
		b->m[k].msg_hdr.msg_namelen = 0;
		b->iov[k].iov_len = b->m[k].msg_len;
	}
	sent = send_all(f->fd, &b->m[i], j - i, &u->c.bytes_up, &u->c.drop_full_up,
			&u->c.drop_error_up, &u->c.upstream_errors);
	u->c.datagrams_up += (uint64_t)sent;
}

static void on_listener_readable(evutil_socket_t fd, short what, void *arg)
{
	struct rd_udp *u = arg;
	struct rd_batch *b = &u->in;
	int64_t now = ts_now_ns();

	(void)what;
	for (int round = 0; round < RD_UDP_READS_PER_WAKE; round++) {
		int n, i, j;

		for (i = 0; i < RD_UDP_BATCH; i++) {
			b->iov[i].iov_len = RD_UDP_SLOT;
			b->m[i].msg_hdr.msg_name = &b->name[i];
			b->m[i].msg_hdr.msg_namelen = sizeof(b->name[i]);
		}
		n = recvmmsg(fd, b->m, RD_UDP_BATCH, MSG_DONTWAIT, NULL);
		if (n <= 0)
			break;
		for (i = 0; i < n; i++)
			u->dest[i] = flow_of(u, fd, i, now);
		/* Runs of one flow go out in one call each. */
		for (i = 0; i < n; i = j) {
			for (j = i + 1; j < n && u->dest[j] == u->dest[i]; j++)
				;
			if (u->dest[i])
				send_up(u, u->dest[i], i, j);
		}
		if (n < RD_UDP_BATCH)
			break;
	}
}

/* ---- the idle sweep ---------------------------------------------------------------------- */

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
	struct rd_udp *u = arg;
	int64_t now = ts_now_ns();

	(void)fd;
	(void)what;
	while (u->oldest && now - u->oldest->last_ns >= u->idle_ns) {
		flow_free(u, u->oldest);
		u->c.flows_idle++;
	}
	if (u->oldest && sweep_arm(u) != 0)
		u->c.sweep_rearm_failed++; /* the next new flow arms it again */
}

/* ---- life -------------------------------------------------------------------------------- */

static void batch_init(struct rd_batch *b)
{
	memset(b->m, 0, sizeof(b->m));
	for (int i = 0; i < RD_UDP_BATCH; i++) {
		b->iov[i].iov_base = b->slots + (size_t)i * RD_UDP_SLOT;
		b->m[i].msg_hdr.msg_iov = &b->iov[i];
		b->m[i].msg_hdr.msg_iovlen = 1;
	}
}

/* The listening socket of one family, bound and watched. 0 or -errno with err. */
static int listen_on(struct rd_udp *u, int k, const struct netaddr_ep *listen, char *err,
		     size_t errlen)
{
	struct sockaddr_storage ss;
	char name[NETADDR_EP_STRLEN];
	unsigned len = netaddr_sockaddr(listen->addr.family, listen->addr.a, htons(listen->port),
					&ss);
	int one = 1, ret;

	u->fd[k] = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (u->fd[k] < 0 || (listen->addr.family == 6 &&
			     setsockopt(u->fd[k], IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
	    bind(u->fd[k], (struct sockaddr *)&ss, len) != 0) {
		ret = -errno;
		snprintf(err, errlen, "redirect: udp listen on %s: %s",
			 netaddr_ep_format(listen, name, sizeof(name)), strerror(-ret));
		return ret;
	}
	u->ev[k] = event_new(u->base, u->fd[k], EV_READ | EV_PERSIST, on_listener_readable, u);
	if (!u->ev[k] || event_add(u->ev[k], NULL) != 0) {
		snprintf(err, errlen, "redirect: udp: event loop: out of memory");
		return -ENOMEM;
	}
	return 0;
}

int rd_udp_new(struct event_base *base, const struct netaddr_ep *listen4,
	       const struct netaddr_ep *listen6, const struct netaddr_ep *to,
	       const struct ts_outbound *ob, struct budget *b, uint32_t idle_ms,
	       struct rd_udp **out, char *err, size_t errlen)
{
	struct rd_udp *u;
	int probe, ret;

	*out = NULL;
	if (!(u = calloc(1, sizeof(*u)))) {
		snprintf(err, errlen, "redirect: udp: out of memory");
		return -ENOMEM;
	}
	u->fd[0] = u->fd[1] = -1;
	if (!(u->in.slots = malloc((size_t)RD_UDP_BATCH * RD_UDP_SLOT)) ||
	    !(u->out.slots = malloc((size_t)RD_UDP_BATCH * RD_UDP_SLOT)) ||
	    !(u->sweep = evtimer_new(base, on_sweep, u))) {
		ret = -ENOMEM;
		snprintf(err, errlen, "redirect: udp: out of memory");
		goto fail;
	}
	u->base = base;
	u->ob = ob;
	u->budget = b;
	u->to = *to;
	u->to_len = netaddr_sockaddr(to->addr.family, to->addr.a, htons(to->port), &u->to_ss);
	u->idle_ns = (int64_t)idle_ms * TS_NS_PER_MS;
	batch_init(&u->in);
	batch_init(&u->out);
	/* A probe now, so that a missing CAP_NET_ADMIN (SO_MARK) fails the start, not each flow. */
	if ((ret = outbound_socket(ob, to->addr.family, SOCK_DGRAM, &probe)) != 0) {
		snprintf(err, errlen, "redirect: udp: a socket marked %u: %s", ob->routing_mark,
			 strerror(-ret));
		goto fail;
	}
	close(probe);
	if ((listen4 && (ret = listen_on(u, 0, listen4, err, errlen)) != 0) ||
	    (listen6 && (ret = listen_on(u, 1, listen6, err, errlen)) != 0))
		goto fail;
	*out = u;
	return 0;
fail:
	rd_udp_free(u);
	return ret;
}

void rd_udp_free(struct rd_udp *u)
{
	if (!u)
		return;
	while (u->oldest)
		flow_free(u, u->oldest);
	for (int k = 0; k < 2; k++) {
		if (u->ev[k])
			event_free(u->ev[k]);
		if (u->fd[k] >= 0)
			close(u->fd[k]);
	}
	if (u->sweep)
		event_free(u->sweep);
	free(u->in.slots);
	free(u->out.slots);
	free(u);
}

void rd_udp_stats(const struct rd_udp *u, struct stats_doc *d)
{
	const struct rd_udp_counters *c = &u->c;

	stats_doc_gauge(d, "redirect.udp.flows_active", u->active);
	stats_doc_counter(d, "redirect.udp.flows_total", c->flows_total);
	stats_doc_counter(d, "redirect.udp.flows_idle", c->flows_idle);
	stats_doc_counter(d, "redirect.udp.datagrams_up", c->datagrams_up);
	stats_doc_counter(d, "redirect.udp.datagrams_down", c->datagrams_down);
	stats_doc_counter(d, "redirect.udp.bytes_up", c->bytes_up);
	stats_doc_counter(d, "redirect.udp.bytes_down", c->bytes_down);
	stats_doc_counter(d, "redirect.udp.drops.admission", c->drop_admission);
	stats_doc_counter(d, "redirect.udp.drops.fd", c->drop_fd);
	stats_doc_counter(d, "redirect.udp.drops.socket", c->drop_socket);
	stats_doc_counter(d, "redirect.udp.drops.connect", c->drop_connect);
	stats_doc_counter(d, "redirect.udp.drops.event", c->drop_event);
	stats_doc_counter(d, "redirect.udp.drops.nomem", c->drop_nomem);
	stats_doc_counter(d, "redirect.udp.drops.full_up", c->drop_full_up);
	stats_doc_counter(d, "redirect.udp.drops.error_up", c->drop_error_up);
	stats_doc_counter(d, "redirect.udp.drops.full_down", c->drop_full_down);
	stats_doc_counter(d, "redirect.udp.drops.error_down", c->drop_error_down);
	stats_doc_counter(d, "redirect.udp.drops.bad_source", c->drop_bad_source);
	stats_doc_counter(d, "redirect.udp.upstream_errors", c->upstream_errors);
	stats_doc_counter(d, "redirect.udp.sweep_rearm_failed", c->sweep_rearm_failed);
}
