/* socks5_codec.c — SOCKS5 client handshake messages (RFC 1928, RFC 1929) and the UDP ASSOCIATE
 * datagram header (RFC 1928 section 7), sans-IO.
 *
 * Parsers check every length before reading; the only state between calls is the caller's
 * buffer (and, for struct socks5_client, which message comes next).
 */
#include "outbound/socks5_codec.h"

#include <errno.h>
#include <string.h>

#include "core/netaddr.h"

int socks5_addr_ip(struct socks5_addr *dst, int family, const uint8_t *addr, uint16_t port)
{
	memset(dst, 0, sizeof(*dst));
	if (family == 4) {
		dst->atyp = SOCKS5_ATYP_IPV4;
		dst->len = 4;
	} else if (family == 6) {
		dst->atyp = SOCKS5_ATYP_IPV6;
		dst->len = 16;
	} else {
		return -EAFNOSUPPORT;
	}
	memcpy(dst->a, addr, dst->len);
	dst->port = port;
	return 0;
}

int socks5_addr_domain(struct socks5_addr *dst, const char *name, size_t len, uint16_t port)
{
	/* The length travels in one byte; an empty name or a NUL inside is never a host. */
	if (len == 0 || len > sizeof(dst->a) || memchr(name, '\0', len))
		return -EINVAL;
	memset(dst, 0, sizeof(*dst));
	dst->atyp = SOCKS5_ATYP_DOMAIN;
	dst->len = (uint8_t)len;
	memcpy(dst->a, name, len);
	dst->port = port;
	return 0;
}

int socks5_build_greeting(uint8_t *buf, size_t cap, bool offer_userpass)
{
	size_t n = offer_userpass ? 4 : 3;

	if (cap < n)
		return -ENOSPC;
	buf[0] = SOCKS5_VERSION;
	buf[1] = (uint8_t)(n - 2);
	buf[2] = SOCKS5_METHOD_NOAUTH;
	if (offer_userpass)
		buf[3] = SOCKS5_METHOD_USERPASS;
	return (int)n;
}

int socks5_build_auth(uint8_t *buf, size_t cap, const char *user, size_t ulen, const char *pass,
		      size_t plen)
{
	/* RFC 1929: ULEN and PLEN are one byte each and at least 1. */
	if (ulen == 0 || ulen > SOCKS5_CRED_MAX || plen == 0 || plen > SOCKS5_CRED_MAX)
		return -EINVAL;
	if (cap < 3 + ulen + plen)
		return -ENOSPC;
	buf[0] = SOCKS5_AUTH_VERSION;
	buf[1] = (uint8_t)ulen;
	memcpy(buf + 2, user, ulen);
	buf[2 + ulen] = (uint8_t)plen;
	memcpy(buf + 3 + ulen, pass, plen);
	return (int)(3 + ulen + plen);
}

/* Bytes of ATYP's address field, the domain's length octet included; 0 for an unknown ATYP. */
static size_t addr_field_len(uint8_t atyp, uint8_t domain_len)
{
	switch (atyp) {
	case SOCKS5_ATYP_IPV4:
		return 4;
	case SOCKS5_ATYP_IPV6:
		return 16;
	case SOCKS5_ATYP_DOMAIN:
		return 1 + (size_t)domain_len;
	default:
		return 0;
	}
}

/* The address field of dst (ATYP's body and the port) at p; returns the bytes written. The
 * caller has validated dst and checked the room. */
static size_t put_addr(uint8_t *p, const struct socks5_addr *dst)
{
	uint8_t *start = p;

	if (dst->atyp == SOCKS5_ATYP_DOMAIN)
		*p++ = dst->len;
	memcpy(p, dst->a, dst->len);
	p += dst->len;
	p[0] = (uint8_t)(dst->port >> 8);
	p[1] = (uint8_t)dst->port;
	return (size_t)(p + 2 - start);
}

/* Bytes of "ATYP DST.ADDR DST.PORT" for dst, or 0 if dst is not a valid address. */
static size_t addr_wire_len(const struct socks5_addr *dst)
{
	size_t alen;

	if ((dst->atyp == SOCKS5_ATYP_IPV4 && dst->len != 4) ||
	    (dst->atyp == SOCKS5_ATYP_IPV6 && dst->len != 16) ||
	    (dst->atyp == SOCKS5_ATYP_DOMAIN && dst->len == 0))
		return 0;
	alen = addr_field_len(dst->atyp, dst->len);
	return alen == 0 ? 0 : 1 + alen + 2;
}

int socks5_build_request(uint8_t *buf, size_t cap, uint8_t cmd, const struct socks5_addr *dst)
{
	size_t alen, n;

	if (cmd != SOCKS5_CMD_CONNECT && cmd != SOCKS5_CMD_UDP_ASSOCIATE)
		return -EINVAL;  /* BIND is never used by a client of this proxy */
	if ((alen = addr_wire_len(dst)) == 0)
		return -EINVAL;
	n = 3 + alen;
	if (cap < n)
		return -ENOSPC;
	buf[0] = SOCKS5_VERSION;
	buf[1] = cmd;
	buf[2] = 0x00;  /* RSV */
	buf[3] = dst->atyp;
	put_addr(buf + 4, dst);
	return (int)n;
}

int socks5_build_connect(uint8_t *buf, size_t cap, const struct socks5_addr *dst)
{
	return socks5_build_request(buf, cap, SOCKS5_CMD_CONNECT, dst);
}

int socks5_build_udp_associate(uint8_t *buf, size_t cap, const struct socks5_addr *src)
{
	static const uint8_t any[4];
	struct socks5_addr unknown;

	if (src == NULL) {
		socks5_addr_ip(&unknown, 4, any, 0);
		src = &unknown;
	}
	return socks5_build_request(buf, cap, SOCKS5_CMD_UDP_ASSOCIATE, src);
}

int socks5_parse_method(const uint8_t *buf, size_t len, bool offered_userpass, uint8_t *method)
{
	/* Judge the version as soon as it arrives: a non-SOCKS5 server is not worth waiting on. */
	if (len >= 1 && buf[0] != SOCKS5_VERSION)
		return -EPROTO;
	if (len < 2)
		return SOCKS5_NEED_MORE;
	switch (buf[1]) {
	case SOCKS5_METHOD_NOAUTH:
		break;
	case SOCKS5_METHOD_USERPASS:
		if (!offered_userpass)
			return -EPROTO;  /* a method we never offered */
		break;
	case SOCKS5_METHOD_NONE_ACCEPTABLE:
		return -EACCES;
	default:
		return -EPROTO;  /* GSSAPI or private methods: never offered */
	}
	if (method)
		*method = buf[1];
	return 2;
}

int socks5_parse_auth_reply(const uint8_t *buf, size_t len)
{
	/* 0x05 instead of 0x01: a well-known server bug, harmless to accept. */
	if (len >= 1 && buf[0] != SOCKS5_AUTH_VERSION && buf[0] != SOCKS5_VERSION)
		return -EPROTO;
	if (len < 2)
		return SOCKS5_NEED_MORE;
	return buf[1] == 0x00 ? 2 : -EACCES;
}

int socks5_reply_errno(uint8_t rep)
{
	switch (rep) {
	case 0x00:
		return 0;
	case 0x02:
		return -EACCES;
	case 0x03:
		return -ENETUNREACH;
	case 0x04:
		return -EHOSTUNREACH;
	case 0x05:
		return -ECONNREFUSED;
	case 0x06:
		return -ETIMEDOUT;
	default:  /* 0x01 general failure, 0x07 command / 0x08 ATYP not supported, unassigned */
		return -EPROTO;
	}
}

int socks5_parse_reply(const uint8_t *buf, size_t len, struct socks5_addr *bnd)
{
	size_t alen, n;
	const uint8_t *p;
	int err;

	if (len >= 1 && buf[0] != SOCKS5_VERSION)
		return -EPROTO;
	if (len < 2)
		return SOCKS5_NEED_MORE;
	if ((err = socks5_reply_errno(buf[1])) != 0)
		return err;
	if (len < 4)  /* RSV (ignored: some servers send garbage there) and ATYP */
		return SOCKS5_NEED_MORE;
	if (buf[3] == SOCKS5_ATYP_DOMAIN && len < 5)  /* the domain's length octet */
		return SOCKS5_NEED_MORE;
	alen = addr_field_len(buf[3], buf[3] == SOCKS5_ATYP_DOMAIN ? buf[4] : 0);
	if (alen == 0)
		return -EPROTO;
	n = 4 + alen + 2;
	if (len < n)
		return SOCKS5_NEED_MORE;
	if (bnd) {
		p = buf + 4;
		memset(bnd, 0, sizeof(*bnd));
		bnd->atyp = buf[3];
		if (bnd->atyp == SOCKS5_ATYP_DOMAIN)
			p++;
		bnd->len = (uint8_t)(alen - (bnd->atyp == SOCKS5_ATYP_DOMAIN));
		memcpy(bnd->a, p, bnd->len);
		bnd->port = (uint16_t)(p[bnd->len] << 8 | p[bnd->len + 1]);
	}
	return (int)n;
}

/* ---- the client sequence ---- */

static int copy_cred(char *dst, uint8_t *dlen, const char *src)
{
	size_t n = strlen(src);

	if (n == 0 || n > SOCKS5_CRED_MAX)
		return -EINVAL;
	memcpy(dst, src, n);
	*dlen = (uint8_t)n;
	return 0;
}

int socks5_client_start(struct socks5_client *c, const struct socks5_addr *dst, const char *user,
			const char *pass, uint8_t *out, size_t cap)
{
	return socks5_client_start_cmd(c, SOCKS5_CMD_CONNECT, dst, user, pass, out, cap);
}

int socks5_client_start_cmd(struct socks5_client *c, uint8_t cmd, const struct socks5_addr *dst,
			    const char *user, const char *pass, uint8_t *out, size_t cap)
{
	uint8_t probe[SOCKS5_REQUEST_MAX];
	int ret;

	memset(c, 0, sizeof(*c));
	c->state = SOCKS5_CL_FAILED;
	c->err = -EINVAL;
	c->cmd = cmd;
	if ((user == NULL) != (pass == NULL))
		return -EINVAL;
	if (user) {
		if (copy_cred(c->user, &c->ulen, user) || copy_cred(c->pass, &c->plen, pass))
			return -EINVAL;
		c->has_auth = true;
	}
	/* Validate cmd and dst now, so a bad request fails before any byte goes out. */
	if ((ret = socks5_build_request(probe, sizeof(probe), cmd, dst)) < 0)
		return ret;
	c->dst = *dst;
	if ((ret = socks5_build_greeting(out, cap, c->has_auth)) < 0)
		return ret;
	c->state = SOCKS5_CL_METHOD;
	c->err = 0;
	return ret;
}

static int fail(struct socks5_client *c, int err)
{
	c->state = SOCKS5_CL_FAILED;
	c->err = err;
	return err;
}

/* Write the request that follows a completed stage; returns its length or -errno. */
static int next_request(struct socks5_client *c, uint8_t *out, size_t cap)
{
	if (c->state == SOCKS5_CL_AUTH)
		return socks5_build_auth(out, cap, c->user, c->ulen, c->pass, c->plen);
	return socks5_build_request(out, cap, c->cmd, &c->dst);
}

int socks5_client_input(struct socks5_client *c, const uint8_t *in, size_t len, uint8_t *out,
			size_t cap, size_t *out_len)
{
	int n, w;

	*out_len = 0;
	switch (c->state) {
	case SOCKS5_CL_METHOD:
		n = socks5_parse_method(in, len, c->has_auth, &c->method);
		break;
	case SOCKS5_CL_AUTH:
		n = socks5_parse_auth_reply(in, len);
		break;
	case SOCKS5_CL_REPLY:
		n = socks5_parse_reply(in, len, &c->bnd);
		break;
	case SOCKS5_CL_DONE:
		return -EALREADY;  /* caller bug: stream bytes are not handshake bytes */
	default:
		return c->err;
	}
	if (n <= 0)
		return n == SOCKS5_NEED_MORE ? n : fail(c, n);
	if (c->state == SOCKS5_CL_REPLY) {
		c->state = SOCKS5_CL_DONE;
		return n;
	}
	if (c->state == SOCKS5_CL_METHOD && c->method == SOCKS5_METHOD_USERPASS)
		c->state = SOCKS5_CL_AUTH;
	else
		c->state = SOCKS5_CL_REPLY;
	if ((w = next_request(c, out, cap)) < 0)
		return fail(c, w);
	*out_len = (size_t)w;
	return n;
}

/* ---- UDP ASSOCIATE: the relay endpoint and the datagram header ---- */

static bool is_unspecified(const struct socks5_addr *a)
{
	static const uint8_t zero[16];

	return a->atyp != SOCKS5_ATYP_DOMAIN && memcmp(a->a, zero, a->len) == 0;
}

/* 127/8 and ::1 (an IPv4-mapped address is unmapped before this is asked). */
static bool is_loopback(const struct socks5_addr *a)
{
	static const uint8_t v6_lo[16] = { [15] = 1 };

	if (a->atyp == SOCKS5_ATYP_IPV4)
		return a->a[0] == 127;
	return a->atyp == SOCKS5_ATYP_IPV6 && memcmp(a->a, v6_lo, 16) == 0;
}

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4 address it carries; any other
 * address as it is. */
static struct socks5_addr unmapped(const struct socks5_addr *a)
{
	struct socks5_addr r = *a;

	if (a->atyp == SOCKS5_ATYP_IPV6 && a->len == 16 && netaddr_v6_is_v4mapped(a->a)) {
		r.atyp = SOCKS5_ATYP_IPV4;
		r.len = 4;
		memmove(r.a, a->a + 12, 4);
	}
	return r;
}

int socks5_udp_relay_endpoint(const struct socks5_addr *bnd_in, const struct socks5_addr *server_in,
			      struct socks5_addr *relay)
{
	struct socks5_addr bnd, server;

	if ((server_in->atyp != SOCKS5_ATYP_IPV4 || server_in->len != 4) &&
	    (server_in->atyp != SOCKS5_ATYP_IPV6 || server_in->len != 16))
		return -EINVAL;
	if (addr_wire_len(bnd_in) == 0)
		return -EPROTO;  /* an empty domain, or an address of the wrong length */
	if (bnd_in->port == 0)
		return -EPROTO;
	bnd = unmapped(bnd_in);
	server = unmapped(server_in);
	if (bnd.atyp != SOCKS5_ATYP_DOMAIN &&
	    (is_unspecified(&bnd) || (is_loopback(&bnd) && !is_loopback(&server)))) {
		*relay = server;
		relay->port = bnd.port;
		return 0;
	}
	*relay = bnd;
	return 0;
}

int socks5_udp_header_len(const struct socks5_addr *dst)
{
	size_t alen = addr_wire_len(dst);

	return alen == 0 ? -EINVAL : (int)(3 + alen);
}

int socks5_udp_build(uint8_t *buf, size_t cap, const struct socks5_addr *dst,
		     const uint8_t *payload, size_t plen)
{
	int hlen = socks5_udp_header_len(dst);

	if (hlen < 0)
		return hlen;
	if (plen > SOCKS5_UDP_DGRAM_MAX - (size_t)hlen)
		return -EMSGSIZE;
	if (cap < (size_t)hlen + plen)
		return -ENOSPC;
	if (plen > 0)
		memmove(buf + hlen, payload, plen);  /* first: the payload may sit where the header goes */
	buf[0] = 0x00;  /* RSV */
	buf[1] = 0x00;
	buf[2] = 0x00;  /* FRAG: a whole datagram */
	buf[3] = dst->atyp;
	put_addr(buf + 4, dst);
	return hlen + (int)plen;
}

/* The source address at p (ATYP's body and the port) into *a; avail bytes follow p. Returns the
 * bytes it took, or a SOCKS5_UDP_E* code. */
static int get_addr(const uint8_t *p, size_t avail, uint8_t atyp, struct socks5_addr *a)
{
	size_t alen;

	if (atyp != SOCKS5_ATYP_IPV4 && atyp != SOCKS5_ATYP_IPV6 && atyp != SOCKS5_ATYP_DOMAIN)
		return SOCKS5_UDP_EATYP;
	if (atyp == SOCKS5_ATYP_DOMAIN && avail < 1)
		return SOCKS5_UDP_ETRUNC;
	alen = addr_field_len(atyp, atyp == SOCKS5_ATYP_DOMAIN ? p[0] : 0);
	if (avail < alen + 2)
		return SOCKS5_UDP_ETRUNC;
	memset(a, 0, sizeof(*a));
	a->atyp = atyp;
	if (atyp == SOCKS5_ATYP_DOMAIN) {
		p++;
		alen--;
		/* Same rule as socks5_addr_domain: what parses here can be sent back. */
		if (alen == 0 || memchr(p, '\0', alen))
			return SOCKS5_UDP_ENAME;
	}
	a->len = (uint8_t)alen;
	memcpy(a->a, p, alen);
	a->port = (uint16_t)(p[alen] << 8 | p[alen + 1]);
	return (int)(alen + 2 + (atyp == SOCKS5_ATYP_DOMAIN));
}

int socks5_udp_parse(const uint8_t *buf, size_t len, struct socks5_udp_dgram *d)
{
	int n;

	if (len < 4)
		return SOCKS5_UDP_ETRUNC;
	if (buf[0] != 0 || buf[1] != 0)
		return SOCKS5_UDP_ERSV;
	if (buf[2] != 0)
		return SOCKS5_UDP_EFRAG;
	if ((n = get_addr(buf + 4, len - 4, buf[3], &d->src)) < 0)
		return n;
	d->hdr_len = 4 + (size_t)n;
	d->payload = buf + d->hdr_len;
	d->payload_len = len - d->hdr_len;
	return 0;
}

enum socks5_udp_drop socks5_udp_drop_reason(int err)
{
	switch (err) {
	case SOCKS5_UDP_ETRUNC:
		return SOCKS5_UDP_DROP_TRUNCATED;
	case SOCKS5_UDP_ERSV:
		return SOCKS5_UDP_DROP_RSV;
	case SOCKS5_UDP_EFRAG:
		return SOCKS5_UDP_DROP_FRAG;
	case SOCKS5_UDP_EATYP:
		return SOCKS5_UDP_DROP_ATYP;
	case SOCKS5_UDP_ENAME:
		return SOCKS5_UDP_DROP_NAME;
	default:
		return SOCKS5_UDP_DROP_MAX;
	}
}
