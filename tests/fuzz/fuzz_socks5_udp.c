/* fuzz_socks5_udp.c — libFuzzer target for the SOCKS5 UDP ASSOCIATE codec
 * (outbound/socks5_codec.c: socks5_udp_parse, socks5_udp_build, socks5_udp_relay_endpoint).
 *
 * Input: one header byte, then bytes.
 *   header bit 0  0: the bytes are a datagram from the relay: parse it (exactly-sized heap copy,
 *                 so ASan sees any over-read); a datagram that parses must build back to the
 *                 same bytes and its error must map to a drop reason.
 *                 1: the bytes describe a destination (ATYP, length, address, port) and a
 *                 payload: build, parse, and get the destination and payload back; the same
 *                 bytes also feed the relay endpoint rules as BND and server.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "outbound/socks5_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT 4096

static void same_addr(const struct socks5_addr *a, const struct socks5_addr *b)
{
	if (a->atyp != b->atyp || a->len != b->len || a->port != b->port ||
	    memcmp(a->a, b->a, a->len) != 0)
		abort();
}

static void check_parse(const uint8_t *b, size_t n)
{
	static uint8_t out[SOCKS5_UDP_DGRAM_MAX];
	struct socks5_udp_dgram d;
	uint8_t *copy = malloc(n ? n : 1);
	int r;

	memcpy(copy, b, n);
	r = socks5_udp_parse(copy, n, &d);
	if (r < 0) {
		if (socks5_udp_drop_reason(r) == SOCKS5_UDP_DROP_MAX)
			abort();  /* an error no counter exists for */
	} else {
		if (r != 0 || d.hdr_len > n || d.payload != copy + d.hdr_len ||
		    d.payload_len != n - d.hdr_len)
			abort();
		if (socks5_udp_build(out, sizeof(out), &d.src, d.payload, d.payload_len) != (int)n ||
		    memcmp(out, copy, n) != 0)
			abort();  /* a valid datagram is exactly what the builder writes */
	}
	free(copy);
}

/* Bytes -> an address: b[0] & 3 selects IPv4, IPv6, domain or ATYP b[1] (anything); b[1] is
 * the domain length; b[2..3] the port; then the address bytes (cut short if the input ends).
 * Returns the bytes used. */
static size_t take_addr(const uint8_t *b, size_t n, struct socks5_addr *a)
{
	size_t len;

	memset(a, 0, sizeof(*a));
	if (n < 4)
		return n;
	a->atyp = (uint8_t[]){ SOCKS5_ATYP_IPV4, SOCKS5_ATYP_IPV6, SOCKS5_ATYP_DOMAIN, b[1] }[b[0] & 3];
	len = a->atyp == SOCKS5_ATYP_IPV4 ? 4 : a->atyp == SOCKS5_ATYP_IPV6 ? 16 : b[1];
	a->port = (uint16_t)(b[2] << 8 | b[3]);
	if (len > n - 4)
		len = n - 4;
	a->len = (uint8_t)len;
	memcpy(a->a, b + 4, len);
	return 4 + len;
}

static void check_build(const uint8_t *b, size_t n)
{
	static uint8_t out[SOCKS5_UDP_HDR_MAX + MAX_INPUT];
	struct socks5_addr dst, srv, relay;
	struct socks5_udp_dgram d;
	size_t used = take_addr(b, n, &dst);
	int hlen = socks5_udp_header_len(&dst), w, r;

	w = socks5_udp_build(out, sizeof(out), &dst, b + used, n - used);
	if ((hlen < 0) != (w < 0))
		abort();
	if (w >= 0) {
		if (w != hlen + (int)(n - used))
			abort();
		r = socks5_udp_parse(out, (size_t)w, &d);
		/* Only a name with a NUL may fail to come back (the builder does not judge names). */
		if (r == SOCKS5_UDP_ENAME && dst.atyp == SOCKS5_ATYP_DOMAIN &&
		    memchr(dst.a, '\0', dst.len))
			return;
		if (r != 0 || d.hdr_len != (size_t)hlen || d.payload_len != n - used ||
		    memcmp(d.payload, b + used, n - used) != 0)
			abort();
		same_addr(&d.src, &dst);
	}
	take_addr(b + used, n - used, &srv);
	r = socks5_udp_relay_endpoint(&dst, &srv, &relay);
	if (r == 0 && relay.port != dst.port)
		abort();  /* the port is always BND's */
	if (r != 0 && r != -EPROTO && r != -EINVAL)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > MAX_INPUT)
		return 0;
	if (data[0] & 1)
		check_build(data + 1, size - 1);
	else
		check_parse(data + 1, size - 1);
	return 0;
}
