/* socks5_codec.c — SOCKS5 client handshake messages (RFC 1928, RFC 1929), sans-IO.
 *
 * Parsers check every length before reading; the only state between calls is the caller's
 * buffer (and, for struct socks5_client, which message comes next).
 */
#include "outbound/socks5_codec.h"

#include <errno.h>
#include <string.h>

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

int socks5_build_connect(uint8_t *buf, size_t cap, const struct socks5_addr *dst)
{
	size_t alen, n;
	uint8_t *p;

	if ((dst->atyp == SOCKS5_ATYP_IPV4 && dst->len != 4) ||
	    (dst->atyp == SOCKS5_ATYP_IPV6 && dst->len != 16) ||
	    (dst->atyp == SOCKS5_ATYP_DOMAIN && dst->len == 0))
		return -EINVAL;
	alen = addr_field_len(dst->atyp, dst->len);
	if (alen == 0)
		return -EINVAL;
	n = 4 + alen + 2;
	if (cap < n)
		return -ENOSPC;
	buf[0] = SOCKS5_VERSION;
	buf[1] = SOCKS5_CMD_CONNECT;
	buf[2] = 0x00;  /* RSV */
	buf[3] = dst->atyp;
	p = buf + 4;
	if (dst->atyp == SOCKS5_ATYP_DOMAIN)
		*p++ = dst->len;
	memcpy(p, dst->a, dst->len);
	p += dst->len;
	p[0] = (uint8_t)(dst->port >> 8);
	p[1] = (uint8_t)dst->port;
	return (int)n;
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
	uint8_t probe[SOCKS5_REQUEST_MAX];
	int ret;

	memset(c, 0, sizeof(*c));
	c->state = SOCKS5_CL_FAILED;
	c->err = -EINVAL;
	if ((user == NULL) != (pass == NULL))
		return -EINVAL;
	if (user) {
		if (copy_cred(c->user, &c->ulen, user) || copy_cred(c->pass, &c->plen, pass))
			return -EINVAL;
		c->has_auth = true;
	}
	/* Validate dst now, so a bad destination fails before any byte goes out. */
	if ((ret = socks5_build_connect(probe, sizeof(probe), dst)) < 0)
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
	return socks5_build_connect(out, cap, &c->dst);
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
