/* udp_assoc.c — the UDP path's SOCKS5 associations (RFC 1928 section 7): one per session and
 * socks5 outbound, its control connection watched, datagrams wrapped and unwrapped. Design and
 * contracts: udp.h. */
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/bufpool.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/netaddr.h"
#include "dispatch/udp_int.h"
#include "outbound/socks5_codec.h"

#define UDP_CTL_READS 16         /* control-connection reads per readiness edge */

/* Remember that k sends to name:port for the client's address `a` (family). */
static void s5_name_note(struct udp_path *up, struct usock *k, const char *name, size_t nlen,
			 int family, const uint8_t *a, uint16_t port_be)
{
	struct s5names *n = s5of(k)->names;

	if (!n && !(n = s5of(k)->names = budget_calloc(up->b, 1, sizeof(*n))))
		return; /* replies from this name will be dropped (s5_unknown_name) */
	for (int i = 0; i < S5_NAMES; i++)
		if (n->e[i].len == nlen && n->e[i].port_be == port_be &&
		    !memcmp(n->e[i].name, name, nlen) && n->e[i].family == family &&
		    !memcmp(n->e[i].addr, a, 16))
			return;
	n->e[n->next].len = (uint8_t)nlen;
	n->e[n->next].family = (uint8_t)family;
	n->e[n->next].port_be = port_be;
	memcpy(n->e[n->next].addr, a, 16);
	memcpy(n->e[n->next].name, name, nlen);
	n->next = (n->next + 1) % S5_NAMES;
}

/* The datagram to `to` (or to name:port when nlen > 0) with its SOCKS5 header, in up->s5buf:
 * its length or -errno. */
int udp_s5_wrap(struct udp_path *up, struct usock *k, const void *buf, size_t len,
		   const struct sockaddr_storage *to, const char *name, size_t nlen)
{
	struct socks5_addr dst;
	uint8_t a[16];
	uint16_t port_be;
	int family = netaddr_from_sockaddr(to, a, &port_be);

	if (nlen) {
		if (socks5_addr_domain(&dst, name, nlen, ntohs(port_be)) != 0)
			return -EINVAL;
		s5_name_note(up, k, name, nlen, family, a, port_be);
	} else if (socks5_addr_ip(&dst, family, a, ntohs(port_be)) != 0) {
		return -EINVAL;
	}
	return socks5_udp_build(up->s5buf, up->s5cap, &dst, buf, len);
}

/* ---- SOCKS5 associations ------------------------------------------------------------------ */

/* The control connection is readable: a server has nothing to say on it, so bytes are
 * discarded; its end (EOF or error) is the association's end, and the session's. */
static void ctl_cb(evutil_socket_t fd, short what, void *arg)
{
	struct usock *k = arg;
	struct udp_session *s = k->s;
	struct udp_path *up = s->up;
	uint8_t buf[256];

	for (int i = 0; i < UDP_CTL_READS; i++) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		ctr_inc(&up->ctr.assoc_control_closed);
		if (up->log)
			log_debug(up->log, "udp: outbound %s: the SOCKS5 control connection ended (%s); "
				  "its session ends", s->gen->cfg->outbounds[k->ob].tag,
				  n == 0 ? "closed by the server" : strerror(errno));
		udp_session_free(up, s);
		return;
	}
}

/* The association is up: its datagram socket (the relay's family, marked like every other),
 * the control connection watched, then what waited is sent. 0 or -errno (nothing kept; the
 * caller closes a->ctl_fd). */
static int assoc_ready(struct udp_path *up, struct usock *k, const struct outbound_assoc *a)
{
	struct s5sock *as = s5of(k);
	const struct ts_config *cfg = k->s->gen->cfg;
	uint16_t port_be;
	int fd, ret, family = a->relay.ss_family == AF_INET6 ? 6 : 4;

	as->relay = a->relay;
	as->relay_len = a->relay_len;
	as->relay_family = (uint8_t)netaddr_from_sockaddr(&a->relay, as->relay_ip, &port_be);
	as->server_family = (uint8_t)netaddr_from_sockaddr(&a->server, as->server_ip, &port_be);
	if ((ret = outbound_socket(&cfg->outbounds[k->ob], family, SOCK_DGRAM, &fd)) != 0)
		return ret;
	if ((ret = udp_sock_setup(up, k, fd)) != 0) {
		close(fd);
		return ret;
	}
	as->ctl_ev = event_new(up->base, a->ctl_fd, EV_READ | EV_PERSIST, ctl_cb, k);
	if (!as->ctl_ev || event_add(as->ctl_ev, NULL) != 0) {
		if (as->ctl_ev)
			event_free(as->ctl_ev);
		as->ctl_ev = NULL;
		event_del(k->rev);
		k->rev = NULL;
		close(fd);
		k->fd = -1;
		return -ENOMEM;
	}
	as->ctl_fd = a->ctl_fd;
	return 0;
}

/* An attempt failed, in its handshake or on the spot (no socket or memory for it, or the
 * socket hook refused): what waited is dropped, and datagrams for this outbound too until the
 * retry time. */
static void assoc_fail(struct udp_path *up, struct usock *k, int err)
{
	struct udp_session *s = k->s;
	struct qdgram *q;

	ctr_inc(&up->ctr.assoc_failures);
	if (up->log)
		log_debug(up->log, "udp: outbound %s: UDP ASSOCIATE failed: %s (retried in %d ms)",
			  s->gen->cfg->outbounds[k->ob].tag, strerror(-err), UDP_ASSOC_RETRY_MS);
	s5of(k)->failed = true;
	s5of(k)->retry_ns = ts_now_ns() + (int64_t)UDP_ASSOC_RETRY_MS * TS_NS_PER_MS;
	while ((q = STAILQ_FIRST(&k->q))) {
		STAILQ_REMOVE_HEAD(&k->q, link);
		k->qlen--;
		s->up_queued--;
		udp_gauge_dec(&up->ctr.up_queued);
		udp_count_drop(up, UDP_DROP_assoc_failed);
		bufpool_put(up->pool, q);
	}
}

static void assoc_done(void *arg, int err, const struct outbound_assoc *a)
{
	struct usock *k = arg;
	struct udp_path *up = k->s->up;

	s5of(k)->pending = NULL;
	if (err == 0 && (err = assoc_ready(up, k, a)) != 0)
		close(a->ctl_fd);
	if (err != 0) {
		assoc_fail(up, k, err);
		return;
	}
	ctr_inc(&up->ctr.assocs);
	ctr_inc(&up->ctr.assocs_total);
	udp_sock_flush(up, k);
}

int udp_assoc_start(struct udp_path *up, struct usock *k)
{
	const struct ts_config *cfg = k->s->gen->cfg;
	int ret = outbound_udp_associate(up->base, &cfg->outbounds[k->ob],
					 cfg->timeouts.connect_ms, assoc_done, k, &s5of(k)->pending);

	if (ret == 0)
		s5of(k)->failed = false;
	else
		assoc_fail(up, k, ret); /* no new attempt per datagram until the retry time */
	return ret;
}

/* A new association for s through t's outbound: two descriptors from the budget (the control
 * connection and the datagram socket), the handshake started; datagrams queue meanwhile. */
struct usock *udp_assoc_open(struct udp_path *up, struct udp_session *s,
				const struct target *t)
{
	struct s5sock *a;
	struct usock *k;

	if (!up->s5buf) {
		up->s5cap = SOCKS5_UDP_HDR_MAX + 65535;
		if (!(up->s5buf = budget_malloc(up->b, up->s5cap))) {
			udp_count_drop(up, UDP_DROP_no_buffer);
			return NULL;
		}
	}
	if (budget_fd_reserve(up->b, 2) != 0) {
		udp_count_drop(up, UDP_DROP_fd_budget);
		return NULL;
	}
	if (!(a = budget_calloc(up->b, 1, up->s5_ev_off + up->evsize))) {
		budget_fd_release(up->b, 2);
		udp_count_drop(up, UDP_DROP_no_memory);
		return NULL;
	}
	k = &a->k;
	k->s = s;
	k->ob = t->ob;
	k->dns = t->dns;
	k->s5 = true;
	k->fd = a->ctl_fd = -1;
	STAILQ_INIT(&k->q);
	SLIST_INSERT_HEAD(&s->socks, k, link);
	ctr_inc(&up->ctr.sockets);
	/* Refused on the spot, it stays as a failed association (assoc_fail), retried in time. */
	if (udp_assoc_start(up, k) != 0) {
		udp_count_drop(up, UDP_DROP_assoc_failed);
		return NULL;
	}
	return k;
}

/* The parse errors of socks5_udp_parse, by socks5_udp_drop_reason. */
static const enum udp_drop s5_drops[SOCKS5_UDP_DROP_MAX] = {
	[SOCKS5_UDP_DROP_TRUNCATED] = UDP_DROP_s5_truncated,
	[SOCKS5_UDP_DROP_RSV] = UDP_DROP_s5_rsv,
	[SOCKS5_UDP_DROP_FRAG] = UDP_DROP_s5_frag,
	[SOCKS5_UDP_DROP_ATYP] = UDP_DROP_s5_atyp,
	[SOCKS5_UDP_DROP_NAME] = UDP_DROP_s5_name,
};

/* Is d's SOCKS5 source the DNS upstream of k's session's configuration (address, family and
 * port)? */
static bool from_upstream(const struct usock *k, const struct socks5_udp_dgram *d)
{
	const struct netaddr_ep *u = &k->s->gen->cfg->dns.upstream;
	uint8_t a[16] = { 0 };

	if ((d->src.atyp == SOCKS5_ATYP_IPV4 ? 4 : d->src.atyp == SOCKS5_ATYP_IPV6 ? 6 : 0) !=
	    u->addr.family || d->src.port != u->port)
		return false;
	memcpy(a, d->src.a, u->addr.family == 4 ? 4 : 16);
	return memcmp(a, u->addr.a, u->addr.family == 4 ? 4 : 16) == 0;
}

/* A datagram on an association's socket (at rxbuf + header room, n bytes): only the relay or
 * the server may send (from any port: some relays answer from another one); its SOCKS5
 * header gives the remote (h->src, h->sport_be), and the payload is moved to where a plain
 * reply's would be. false: dropped and counted. */
bool udp_s5_unwrap(struct udp_path *up, struct usock *k, const struct sockaddr_storage *from,
		      size_t *n, struct udp_codec_hdr *h)
{
	uint8_t *buf = up->rxbuf + udp_codec_hdr_len(k->s->key.family), a[16];
	const struct s5sock *as = s5of(k);
	struct socks5_udp_dgram d;
	uint16_t port_be;
	int family = netaddr_from_sockaddr(from, a, &port_be), ret;

	if (!(family == as->relay_family && !memcmp(a, as->relay_ip, 16)) &&
	    !(family == as->server_family && !memcmp(a, as->server_ip, 16))) {
		udp_count_drop(up, UDP_DROP_s5_foreign);
		return false;
	}
	if ((ret = socks5_udp_parse(buf, *n, &d)) != 0) {
		enum socks5_udp_drop r = socks5_udp_drop_reason(ret);
		udp_count_drop(up, r < SOCKS5_UDP_DROP_MAX ? s5_drops[r] : UDP_DROP_malformed);
		return false;
	}
	if (d.src.atyp == SOCKS5_ATYP_DOMAIN) {
		/* A name as the source: one this association sent to, from the address the
		 * client knows it by. */
		const struct s5names *nm = as->names;
		int i = 0;
		for (; nm && i < S5_NAMES; i++)
			if (nm->e[i].len == d.src.len && nm->e[i].port_be == htons(d.src.port) &&
			    nm->e[i].family == k->s->key.family &&
			    !strncasecmp(nm->e[i].name, (const char *)d.src.a, d.src.len))
				break;
		if (!nm || i == S5_NAMES) {
			udp_count_drop(up, UDP_DROP_s5_unknown_name);
			return false;
		}
		memcpy(h->src, nm->e[i].addr, 16);
		h->sport_be = nm->e[i].port_be;
	} else if (k->dns && !from_upstream(k, &d)) {
		/* A relay passes on what any host sends to the association's port: a hijacked
		 * query's answer must come from the upstream asked (on a connected socket the
		 * kernel sees to that). */
		udp_count_drop(up, UDP_DROP_dns_unmatched);
		return false;
	} else if (!k->dns && (d.src.atyp == SOCKS5_ATYP_IPV4 ? 4 : 6) != k->s->key.family) {
		/* (The hijacked DNS answer's source is replaced by the address asked.) */
		udp_count_drop(up, UDP_DROP_s5_family);
		return false;
	} else {
		memset(h->src, 0, 16);
		memcpy(h->src, d.src.a, d.src.len);
		h->sport_be = htons(d.src.port);
	}
	memmove(buf, d.payload, d.payload_len);
	*n = d.payload_len;
	return true;
}
