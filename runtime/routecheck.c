/* routecheck.c — the route each outbound's sockets would take, checked against our TUN (see
 * routecheck.h). */
#include "runtime/routecheck.h"

#include <errno.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The server of outbounds[i], for messages that name the field. */
static int resolve(const struct ts_hostport *hp, size_t i, struct netaddr *out, char *err,
		   size_t errlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	int rc;

	if (hp->is_addr) {
		*out = hp->addr;
		return 0;
	}
	if ((rc = getaddrinfo(hp->host, NULL, &hints, &res)) != 0) {
		snprintf(err, errlen, "route check: $.outbounds[%zu].server: \"%s\": %s", i,
			 hp->host, gai_strerror(rc));
		return rc == EAI_AGAIN ? -EAGAIN : -ENXIO;
	}
	rc = -ENXIO;
	for (struct addrinfo *ai = res; ai && rc; ai = ai->ai_next) {
		if (ai->ai_family == AF_INET) {
			out->family = 4;
			memcpy(out->a, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, 4);
			rc = 0;
		} else if (ai->ai_family == AF_INET6) {
			out->family = 6;
			memcpy(out->a, &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, 16);
			rc = 0;
		}
	}
	freeaddrinfo(res);
	if (rc)
		snprintf(err, errlen,
			 "route check: $.outbounds[%zu].server: \"%s\": no IPv4 or IPv6 address", i,
			 hp->host);
	return rc;
}

static int target_init(struct routecheck_target *t, const struct ts_config *cfg, size_t i,
		       char *err, size_t errlen)
{
	const struct ts_outbound *ob = &cfg->outbounds[i];

	memset(t, 0, sizeof(*t));
	if (ob->type == TS_OUT_REJECT)
		return 0;
	t->active = true;
	t->mark = ob->has_routing_mark ? ob->routing_mark : 0;
	memcpy(t->oif_name, ob->bind_interface, sizeof(t->oif_name));
	if (ob->has_server) { /* a proxy outbound: its server */
		t->n_dst = 1;
		return resolve(&ob->server, i, &t->dst[0], err, errlen);
	}
	t->is_probe = true;
	(void)netaddr_parse("192.0.2.1", &t->dst[t->n_dst++]);
	if (cfg->tun.has_addr6)
		(void)netaddr_parse("2001:db8::1", &t->dst[t->n_dst++]);
	return 0;
}

int routecheck_init(struct routecheck *rc, const struct ts_config *cfg, int tun_ifindex,
		    char *err, size_t errlen)
{
	int ret;

	memset(rc, 0, sizeof(*rc));
	if (!(rc->t = calloc(cfg->n_outbounds ? cfg->n_outbounds : 1, sizeof(*rc->t)))) {
		snprintf(err, errlen, "route check: out of memory");
		return -ENOMEM;
	}
	rc->n = cfg->n_outbounds;
	rc->tun_ifindex = tun_ifindex;
	for (size_t i = 0; i < rc->n; i++) {
		if ((ret = target_init(&rc->t[i], cfg, i, err, errlen)) != 0) {
			routecheck_fini(rc);
			return ret;
		}
	}
	return 0;
}

void routecheck_fini(struct routecheck *rc)
{
	free(rc->t);
	rc->t = NULL;
	rc->n = 0;
}

/* 1: the lookup leads into our TUN (*dst_out the destination); 0: it does not (or there is
 * no route at all: connections fail, nothing loops); -errno: the lookup failed. */
static int target_loops(const struct routecheck *rc, const struct routecheck_target *t,
			struct netlink *nl, struct netaddr *dst_out)
{
	struct netlink_route r;
	int oif = 0, ret;

	if (t->oif_name[0] && !(oif = (int)if_nametoindex(t->oif_name)))
		return 0; /* its sockets cannot even bind: they fail, they do not loop */
	for (uint8_t i = 0; i < t->n_dst; i++) {
		ret = netlink_route_get_ex(nl, &t->dst[i], t->mark ? t->mark : rc->unmarked_mark,
					   oif, &r);
		if (ret == -ENETUNREACH || ret == -EHOSTUNREACH || ret == -ENOENT ||
		    ret == -EACCES || ret == -EINVAL)
			continue;
		if (ret != 0)
			return ret;
		if (r.type == RTN_UNICAST && r.oif == rc->tun_ifindex) {
			*dst_out = t->dst[i];
			return 1;
		}
	}
	return 0;
}

static void describe(const struct routecheck_target *t, const struct netaddr *dst, char *buf,
		     size_t len)
{
	char a[NETADDR_STRLEN];

	snprintf(buf, len, "%s %s with mark %#x%s%s", t->is_probe ? "a lookup of" : "its server",
		 netaddr_format(dst, a, sizeof(a)), t->mark, t->oif_name[0] ? " on " : "",
		 t->oif_name);
}

int routecheck_scan(struct routecheck *rc, struct netlink *nl, struct log *lg, bool start,
		    char *err, size_t errlen)
{
	char what[160], tun[IF_NAMESIZE] = "";
	struct netaddr dst;
	int ret;

	rc->looping_now = 0;
	if_indextoname((unsigned)rc->tun_ifindex, tun);
	for (size_t i = 0; i < rc->n; i++) {
		struct routecheck_target *t = &rc->t[i];
		if (!t->active)
			continue;
		if ((ret = target_loops(rc, t, nl, &dst)) < 0) {
			if (start) {
				snprintf(err, errlen, "route check: $.outbounds[%zu]: lookup: %s", i,
					 strerror(-ret));
				return ret;
			}
			continue;
		}
		if (ret == 1) {
			describe(t, &dst, what, sizeof(what));
			if (start) {
				snprintf(err, errlen,
					 "config: $.outbounds[%zu]: its traffic would be routed into "
					 "%s (%s): a loop; add a rule that routes this mark around "
					 "the TUN, or set \"tun\": {\"auto_route\": true}",
					 i, tun, what);
				return -ELOOP;
			}
			rc->looping_now++;
			if (!t->looping) {
				rc->episodes++;
				log_warn(lg, "route check: $.outbounds[%zu]: its traffic is now routed "
					     "into %s (%s): its connections loop and are dropped "
					     "(drops.loop)", i, tun, what);
			}
		} else if (t->looping && !start) {
			log_info(lg, "route check: $.outbounds[%zu]: no longer routed into %s", i,
				 tun);
		}
		t->looping = ret == 1;
	}
	return (int)rc->looping_now;
}

void routecheck_pin(const struct routecheck *rc, struct ts_config *cfg)
{
	for (size_t i = 0; i < rc->n && i < cfg->n_outbounds; i++) {
		struct ts_hostport *hp = &cfg->outbounds[i].server;
		if (rc->t[i].active && !rc->t[i].is_probe && !hp->is_addr) {
			hp->addr = rc->t[i].dst[0];
			hp->pinned = true;
		}
	}
}

size_t routecheck_servers(const struct routecheck *rc, struct netaddr *out, size_t cap)
{
	size_t n = 0;

	for (size_t i = 0; i < rc->n && n < cap; i++) {
		if (rc->t[i].active && !rc->t[i].is_probe)
			out[n++] = rc->t[i].dst[0];
	}
	return n;
}
