/* testutil.c — helpers shared by the unit tests.
 *
 * Nothing here calls core/csum.c or core/pkt.c: the reference sums are a plain loop over
 * big-endian 16-bit words (RFC 1071) and the reference parser is written separately, so the
 * tests compare two independent implementations.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/pkt.h"
#include "stacks/netstack.h"

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("testutil: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}

/* ---- PRNG ---- */

void tu_rng_seed(struct tu_rng *r, uint64_t seed)
{
	/* xorshift must not start at 0; mix it so nearby seeds diverge at once. */
	uint64_t z = seed + 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	r->s = z ? z : 0x2545f4914f6cdd1dull;
}

uint64_t tu_rand64(struct tu_rng *r)
{
	uint64_t x = r->s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	r->s = x;
	return x * 0x2545f4914f6cdd1dull;
}

uint32_t tu_rand32(struct tu_rng *r)
{
	return (uint32_t)(tu_rand64(r) >> 32);
}

uint32_t tu_rand_below(struct tu_rng *r, uint32_t n)
{
	return (uint32_t)(((uint64_t)tu_rand32(r) * n) >> 32);
}

uint32_t tu_rand_range(struct tu_rng *r, uint32_t lo, uint32_t hi)
{
	if (hi - lo == UINT32_MAX)
		return tu_rand32(r);
	return lo + tu_rand_below(r, hi - lo + 1);
}

bool tu_rand_chance(struct tu_rng *r, uint32_t one_in)
{
	return tu_rand_below(r, one_in) == 0;
}

void tu_rand_bytes(struct tu_rng *r, void *buf, size_t n)
{
	uint8_t *p = buf;
	while (n >= 8) {
		uint64_t x = tu_rand64(r);
		memcpy(p, &x, 8);
		p += 8;
		n -= 8;
	}
	if (n) {
		uint64_t x = tu_rand64(r);
		memcpy(p, &x, n);
	}
}

/* ---- byte helpers ---- */

uint16_t tu_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

uint32_t tu_get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void tu_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

void tu_put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

int tu_addr(uint8_t out[16], const char *text)
{
	memset(out, 0, 16);
	if (inet_pton(AF_INET, text, out) == 1)
		return 4;
	if (inet_pton(AF_INET6, text, out) == 1)
		return 6;
	die("bad address '%s'", text);
}

unsigned tu_sockaddr(struct sockaddr_storage *ss, const char *text, uint16_t port)
{
	uint8_t a[16];

	memset(ss, 0, sizeof(*ss));
	if (tu_addr(a, text) == 4) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
		memcpy(&sin->sin_addr, a, 4);
		return sizeof(*sin);
	}
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
	sin6->sin6_family = AF_INET6;
	sin6->sin6_port = htons(port);
	memcpy(&sin6->sin6_addr, a, 16);
	return sizeof(*sin6);
}

bool tu_lo_accepts(uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (fd < 0)
		return false;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

void tu_dump(const char *label, const uint8_t *buf, size_t len)
{
	fprintf(stderr, "%s (%zu bytes):", label, len);
	for (size_t i = 0; i < len; i++)
		fprintf(stderr, "%s%02x", i % 16 ? " " : "\n  ", buf[i]);
	fputc('\n', stderr);
}

/* ---- reference sums: RFC 1071, big-endian words, byte loads ---- */

static uint64_t ref_sum(const uint8_t *p, size_t len, uint64_t sum)
{
	for (size_t i = 0; i + 1 < len; i += 2)
		sum += (uint32_t)p[i] << 8 | p[i + 1];
	if (len & 1)
		sum += (uint32_t)p[len - 1] << 8;
	return sum;
}

static uint16_t ref_fold(uint64_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)sum;
}

static uint64_t ref_pseudo_any(const uint8_t *buf, const struct tu_layout *lo);
static uint64_t ref_pseudo(const uint8_t *buf, const struct tu_layout *lo);

/* ---- spec constructors ---- */

static void spec_base(struct tu_spec *s, const char *src, const char *dst)
{
	memset(s, 0, sizeof(*s));
	int f = tu_addr(s->src, src);
	if (tu_addr(s->dst, dst) != f)
		die("address families differ: %s %s", src, dst);
	s->family = (uint8_t)f;
	s->ttl = 64;
	s->ip_id = 0x1234;
}

void tu_spec_tcp(struct tu_spec *s, const char *src, uint16_t sport, const char *dst,
		 uint16_t dport)
{
	spec_base(s, src, dst);
	s->proto = IPPROTO_TCP;
	s->sport = sport;
	s->dport = dport;
	s->seq = 1000;
	s->ack = 2000;
	s->tcp_flags = TCP_ACK;
	s->window = 65535;
}

void tu_spec_udp(struct tu_spec *s, const char *src, uint16_t sport, const char *dst,
		 uint16_t dport)
{
	spec_base(s, src, dst);
	s->proto = IPPROTO_UDP;
	s->sport = sport;
	s->dport = dport;
}

void tu_spec_icmp_echo(struct tu_spec *s, const char *src, const char *dst, uint16_t id,
		       uint16_t seq)
{
	spec_base(s, src, dst);
	s->proto = s->family == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6;
	s->icmp_type = s->family == 4 ? 8 : 128;
	s->icmp_id = id;
	s->icmp_seq = seq;
}

void tu_spec_raw(struct tu_spec *s, const char *src, const char *dst, uint8_t proto)
{
	spec_base(s, src, dst);
	s->proto = proto;
}

/* ---- builder ---- */

static size_t pad4(size_t n)
{
	return (n + 3) & ~(size_t)3;
}

static size_t ext_size(const struct tu_ext *e)
{
	switch (e->type) {
	case 51:
		return ((size_t)e->hdr_len + 2) * 4;
	case 44:
	case 50:
		return 8;
	default:
		return ((size_t)e->hdr_len + 1) * 8;
	}
}

static size_t l4_hdr_size(const struct tu_spec *s)
{
	switch (s->proto) {
	case IPPROTO_TCP:
		return 20 + pad4((s->mss ? 4u : 0u) + s->tcp_opts_len);
	case IPPROTO_UDP:
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		return 8;
	default:
		return 0;
	}
}

/* Write one extension header of e's size at p; next = the following header's number. */
static void write_ext(uint8_t *p, const struct tu_ext *e, uint8_t next)
{
	size_t n = ext_size(e);
	memset(p, 0, n);
	switch (e->type) {
	case 44: /* Fragment: next, reserved, offset 0 / M 0, identification */
		p[0] = next;
		tu_put32(p + 4, 0xabcd1234);
		return;
	case 50: /* ESP: SPI, sequence number; the next header is encrypted away */
		tu_put32(p, 0x100);
		tu_put32(p + 4, 1);
		return;
	case 51: /* AH: next, payload len, reserved, SPI, sequence, ICV */
		p[0] = next;
		p[1] = e->hdr_len;
		if (n >= 12) {
			tu_put32(p + 4, 0x200);
			tu_put32(p + 8, 7);
		}
		return;
	case 43: /* Routing: type 4 (SRH-like), segments left 0 (dst is final) */
		p[0] = next;
		p[1] = e->hdr_len;
		p[2] = 4;
		return;
	default: /* Hop-by-Hop / Destination Options (or anything): one PadN filling the rest */
		p[0] = next;
		p[1] = e->hdr_len;
		p[2] = 1;
		p[3] = (uint8_t)(n - 4);
		return;
	}
}

static void write_l4(const struct tu_spec *s, uint8_t *l4, size_t hlen)
{
	memset(l4, 0, hlen);
	switch (s->proto) {
	case IPPROTO_TCP: {
		tu_put16(l4, s->sport);
		tu_put16(l4 + 2, s->dport);
		tu_put32(l4 + 4, s->seq);
		tu_put32(l4 + 8, s->ack);
		l4[12] = (uint8_t)((hlen / 4) << 4);
		l4[13] = s->tcp_flags;
		tu_put16(l4 + 14, s->window);
		tu_put16(l4 + 18, s->urg);
		uint8_t *o = l4 + 20;
		if (s->mss) {
			o[0] = 2;
			o[1] = 4;
			tu_put16(o + 2, s->mss);
			o += 4;
		}
		memcpy(o, s->tcp_opts, s->tcp_opts_len);
		return;
	}
	case IPPROTO_UDP:
		tu_put16(l4, s->sport);
		tu_put16(l4 + 2, s->dport);
		return; /* length filled by the caller */
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		l4[0] = s->icmp_type;
		l4[1] = s->icmp_code;
		tu_put16(l4 + 4, s->icmp_id);
		tu_put16(l4 + 6, s->icmp_seq);
		return;
	default:
		return;
	}
}

size_t tu_build(const struct tu_spec *s, uint8_t *buf, size_t cap)
{
	if (s->family != 4 && s->family != 6)
		die("family %u", s->family);
	if (s->ip4_opts_len > 40 || s->tcp_opts_len > 40 || s->ext_n > TU_EXT_MAX)
		die("option lengths out of range");
	size_t l3 = s->family == 4 ? 20 + pad4(s->ip4_opts_len) : 40;
	if (s->family == 6)
		for (unsigned i = 0; i < s->ext_n; i++)
			l3 += ext_size(&s->ext[i]);
	size_t l4h = l4_hdr_size(s);
	if (l4h > 60)
		die("TCP options too long");
	size_t tot = l3 + l4h + s->payload_len;
	if (tot > cap)
		die("packet of %zu bytes does not fit %zu", tot, cap);
	if (s->family == 4 ? tot > 0xffff : tot - 40 > 0xffff)
		die("packet of %zu bytes exceeds the IP length field", tot);
	memset(buf, 0, tot);

	uint8_t *ip = buf;
	if (s->family == 4) {
		ip[0] = (uint8_t)(0x40 | (l3 / 4));
		ip[1] = s->tos;
		tu_put16(ip + 2, (uint16_t)tot);
		tu_put16(ip + 4, s->ip_id);
		tu_put16(ip + 6, s->ip4_frag);
		ip[8] = s->ttl;
		ip[9] = s->proto;
		memcpy(ip + 12, s->src, 4);
		memcpy(ip + 16, s->dst, 4);
		memcpy(ip + 20, s->ip4_opts, s->ip4_opts_len);
	} else {
		ip[0] = (uint8_t)(0x60 | s->tos >> 4);
		ip[1] = (uint8_t)(s->tos << 4);
		tu_put16(ip + 4, (uint16_t)(tot - 40));
		ip[6] = s->ext_n ? s->ext[0].type : s->proto;
		ip[7] = s->ttl;
		memcpy(ip + 8, s->src, 16);
		memcpy(ip + 24, s->dst, 16);
		size_t off = 40;
		for (unsigned i = 0; i < s->ext_n; i++) {
			uint8_t next = i + 1 < s->ext_n ? s->ext[i + 1].type : s->proto;
			write_ext(ip + off, &s->ext[i], next);
			off += ext_size(&s->ext[i]);
		}
	}

	uint8_t *l4 = buf + l3;
	write_l4(s, l4, l4h);
	if (s->payload) {
		memcpy(l4 + l4h, s->payload, s->payload_len);
	} else {
		struct tu_rng r;
		tu_rng_seed(&r, s->payload_seed);
		tu_rand_bytes(&r, l4 + l4h, s->payload_len);
	}
	if (s->proto == IPPROTO_UDP)
		tu_put16(l4 + 4, (uint16_t)(l4h + s->payload_len));

	if (s->family == 4)
		tu_fix_ip4_header(buf);
	/* The layout is known here, even for chains (Fragment, ESP) the reference parser stops at. */
	struct tu_layout lo = { s->family, s->proto, l3, tot, tot - l3 };
	int co = tu_l4_csum_off(s->proto);
	if (co >= 0 && s->proto != (s->family == 4 ? IPPROTO_ICMPV6 : IPPROTO_ICMP)) {
		uint16_t c;
		if (s->partial_csum && (s->proto == IPPROTO_TCP || s->proto == IPPROTO_UDP))
			c = ref_fold(ref_pseudo_any(buf, &lo));
		else if (s->proto == IPPROTO_UDP && s->udp_no_csum)
			c = 0;
		else if ((c = (uint16_t)~ref_fold(ref_sum(l4, lo.l4_len, ref_pseudo(buf, &lo)))) == 0 &&
			 s->proto == IPPROTO_UDP)
			c = 0xffff;
		tu_put16(l4 + co, c);
	}
	return tot;
}

/* ---- reference parser and verifiers ---- */

bool tu_layout(const uint8_t *buf, size_t len, struct tu_layout *lo)
{
	memset(lo, 0, sizeof(*lo));
	if (len < 1)
		return false;
	if (buf[0] >> 4 == 4) {
		if (len < 20)
			return false;
		size_t ihl = (size_t)(buf[0] & 15) * 4, tot = tu_get16(buf + 2);
		if (ihl < 20 || tot < ihl || tot > len)
			return false;
		lo->family = 4;
		lo->proto = buf[9];
		lo->l3_len = ihl;
		lo->len = tot;
	} else if (buf[0] >> 4 == 6) {
		if (len < 40)
			return false;
		size_t tot = 40 + (size_t)tu_get16(buf + 4), off = 40;
		if (tot > len)
			return false;
		uint8_t nh = buf[6];
		while (nh == 0 || nh == 43 || nh == 60 || nh == 51) {
			if (off + 2 > tot)
				return false;
			size_t n = nh == 51 ? ((size_t)buf[off + 1] + 2) * 4 : ((size_t)buf[off + 1] + 1) * 8;
			if (off + n > tot)
				return false;
			nh = buf[off];
			off += n;
		}
		lo->family = 6;
		lo->proto = nh;
		lo->l3_len = off;
		lo->len = tot;
	} else {
		return false;
	}
	lo->l4_len = lo->len - lo->l3_len;
	return true;
}

int tu_l4_csum_off(uint8_t proto)
{
	switch (proto) {
	case IPPROTO_TCP:
		return 16;
	case IPPROTO_UDP:
		return 6;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		return 2;
	default:
		return -1;
	}
}

bool tu_verify_ip4_header(const uint8_t *buf)
{
	size_t ihl = (size_t)(buf[0] & 15) * 4;
	return ihl >= 20 && ref_fold(ref_sum(buf, ihl, 0)) == 0xffff;
}

/* Pseudo-header sum over src, dst, proto and L4 length (RFC 793 / RFC 8200 section 8.1). */
static uint64_t ref_pseudo_any(const uint8_t *buf, const struct tu_layout *lo)
{
	if (lo->family == 4) {
		uint64_t s = ref_sum(buf + 12, 8, 0);
		return s + lo->proto + lo->l4_len;
	}
	uint64_t s = ref_sum(buf + 8, 32, 0);
	return s + lo->proto + (lo->l4_len >> 16) + (lo->l4_len & 0xffff);
}

/* The pseudo-header sum entering the L4 checksum: none for ICMPv4. */
static uint64_t ref_pseudo(const uint8_t *buf, const struct tu_layout *lo)
{
	return lo->family == 4 && lo->proto == IPPROTO_ICMP ? 0 : ref_pseudo_any(buf, lo);
}

/* Layout of a packet whose L4 header (at least up to the checksum field) is present. */
static bool l4_layout(const uint8_t *buf, size_t len, struct tu_layout *lo)
{
	if (!tu_layout(buf, len, lo))
		return false;
	int co = tu_l4_csum_off(lo->proto);
	if (co < 0 || lo->l4_len < (size_t)co + 2)
		return false;
	/* ICMP belongs to IPv4, ICMPv6 to IPv6; the other pairing has no defined checksum. */
	return !(lo->family == 4 && lo->proto == IPPROTO_ICMPV6) &&
	       !(lo->family == 6 && lo->proto == IPPROTO_ICMP);
}

bool tu_verify_l4(const uint8_t *buf, size_t len)
{
	struct tu_layout lo;
	if (!l4_layout(buf, len, &lo))
		return false;
	const uint8_t *l4 = buf + lo.l3_len;
	if (lo.family == 4 && lo.proto == IPPROTO_UDP && tu_get16(l4 + 6) == 0)
		return true;
	return ref_fold(ref_sum(l4, lo.l4_len, ref_pseudo(buf, &lo))) == 0xffff;
}

uint16_t tu_l4_compute(const uint8_t *buf, size_t len)
{
	struct tu_layout lo;
	if (!l4_layout(buf, len, &lo))
		die("tu_l4_compute: not a TCP/UDP/ICMP packet");
	const uint8_t *l4 = buf + lo.l3_len;
	size_t co = (size_t)tu_l4_csum_off(lo.proto);
	uint64_t s = ref_pseudo(buf, &lo);
	s = ref_sum(l4, co, s);
	s = ref_sum(l4 + co + 2, lo.l4_len - co - 2, s); /* co is even: word alignment kept */
	return (uint16_t)~ref_fold(s);
}

bool tu_steer_l4_csum(uint8_t *buf, size_t len, size_t l4_word, uint16_t want)
{
	struct tu_layout lo;
	if (!l4_layout(buf, len, &lo) || (l4_word & 1) || l4_word + 2 > lo.l4_len ||
	    (l4_word + 2 > (size_t)tu_l4_csum_off(lo.proto) && l4_word < (size_t)tu_l4_csum_off(lo.proto) + 2))
		die("tu_steer_l4_csum: bad word offset %zu", l4_word);
	uint8_t *w = buf + lo.l3_len + l4_word;
	/* c = ~S; we want S' = ~want, so add d = S' - S (one's complement) to the word. */
	uint16_t s_now = (uint16_t)~tu_l4_compute(buf, len);
	uint16_t d = ref_fold((uint64_t)(uint16_t)~want + (uint16_t)~s_now);
	tu_put16(w, ref_fold((uint64_t)tu_get16(w) + d));
	return tu_l4_compute(buf, len) == want;
}

uint16_t tu_l4_field(const uint8_t *buf, size_t len)
{
	struct tu_layout lo;
	if (!l4_layout(buf, len, &lo))
		die("tu_l4_field: not a TCP/UDP/ICMP packet");
	return tu_get16(buf + lo.l3_len + tu_l4_csum_off(lo.proto));
}

uint16_t tu_partial_pseudo(const uint8_t *buf, size_t len)
{
	struct tu_layout lo;
	if (!tu_layout(buf, len, &lo))
		die("tu_partial_pseudo: malformed packet");
	return ref_fold(ref_pseudo_any(buf, &lo));
}

bool tu_verify_partial(const uint8_t *buf, size_t len)
{
	return tu_l4_field(buf, len) == tu_partial_pseudo(buf, len);
}

void tu_complete_partial(uint8_t *buf, size_t len)
{
	struct tu_layout lo;
	if (!l4_layout(buf, len, &lo))
		die("tu_complete_partial: not a TCP/UDP packet");
	uint8_t *l4 = buf + lo.l3_len;
	uint16_t c = (uint16_t)~ref_fold(ref_sum(l4, lo.l4_len, 0));
	if (c == 0 && lo.proto == IPPROTO_UDP)
		c = 0xffff;
	tu_put16(l4 + tu_l4_csum_off(lo.proto), c);
}

void tu_fix_ip4_header(uint8_t *buf)
{
	size_t ihl = (size_t)(buf[0] & 15) * 4;
	buf[10] = buf[11] = 0;
	tu_put16(buf + 10, (uint16_t)~ref_fold(ref_sum(buf, ihl, 0)));
}

void tu_fix_checksums(uint8_t *buf, size_t len)
{
	struct tu_layout lo;
	if (!tu_layout(buf, len, &lo))
		die("tu_fix_checksums: malformed packet");
	if (lo.family == 4)
		tu_fix_ip4_header(buf);
	if (!l4_layout(buf, len, &lo))
		return;
	uint16_t c = tu_l4_compute(buf, len);
	if (c == 0 && lo.proto == IPPROTO_UDP)
		c = 0xffff;
	tu_put16(buf + lo.l3_len + tu_l4_csum_off(lo.proto), c);
}

void tu_set_addrs(uint8_t *buf, size_t len, const uint8_t src[16], const uint8_t dst[16])
{
	if (len >= 20 && buf[0] >> 4 == 4) {
		memcpy(buf + 12, src, 4);
		memcpy(buf + 16, dst, 4);
	} else if (len >= 40 && buf[0] >> 4 == 6) {
		memcpy(buf + 8, src, 16);
		memcpy(buf + 24, dst, 16);
	} else {
		die("tu_set_addrs: not an IP packet");
	}
}

void tu_set_ports(uint8_t *buf, size_t len, uint16_t sport, uint16_t dport)
{
	struct tu_layout lo;
	if (!tu_layout(buf, len, &lo) || lo.l4_len < 4 ||
	    (lo.proto != IPPROTO_TCP && lo.proto != IPPROTO_UDP))
		die("tu_set_ports: not a TCP/UDP packet");
	tu_put16(buf + lo.l3_len, sport);
	tu_put16(buf + lo.l3_len + 2, dport);
}

void tu_meta_partial(const uint8_t *buf, size_t len, uint16_t gso_size, struct pkt_meta *m)
{
	struct tu_layout lo;
	if (!l4_layout(buf, len, &lo) || (lo.proto != IPPROTO_TCP && lo.proto != IPPROTO_UDP))
		die("tu_meta_partial: not a TCP/UDP packet");
	memset(m, 0, sizeof(*m));
	m->flags = PKT_META_NEEDS_CSUM;
	m->csum_start = (uint16_t)lo.l3_len;
	m->csum_offset = (uint16_t)tu_l4_csum_off(lo.proto);
	size_t l4h = lo.proto == IPPROTO_TCP ? (size_t)(buf[lo.l3_len + 12] >> 4) * 4 : 8;
	m->hdr_len = (uint16_t)(lo.l3_len + l4h);
	if (gso_size) {
		m->gso_size = gso_size;
		if (lo.proto == IPPROTO_UDP)
			m->gso_type = PKT_GSO_UDP_L4;
		else
			m->gso_type = lo.family == 4 ? PKT_GSO_TCPV4 : PKT_GSO_TCPV6;
	}
}

/* ---- random packets ---- */

static void rand_addr(struct tu_rng *r, uint8_t a[16], int family)
{
	memset(a, 0, 16);
	tu_rand_bytes(r, a, family == 4 ? 4 : 16);
}

static void rand_tcp_opts(struct tu_rng *r, struct tu_spec *s)
{
	if (tu_rand_chance(r, 2))
		s->mss = (uint16_t)tu_rand_range(r, 1, 0xffff);
	size_t n = 0;
	uint8_t *o = s->tcp_opts;
	if (tu_rand_chance(r, 2)) { /* NOP, window scale */
		o[n++] = 1;
		o[n++] = 3;
		o[n++] = 3;
		o[n++] = (uint8_t)tu_rand_below(r, 15);
	}
	if (tu_rand_chance(r, 2)) { /* SACK permitted */
		o[n++] = 4;
		o[n++] = 2;
	}
	if (tu_rand_chance(r, 2)) { /* timestamps */
		o[n++] = 8;
		o[n++] = 10;
		tu_rand_bytes(r, o + n, 8);
		n += 8;
	}
	s->tcp_opts_len = (uint8_t)n;
}

static void rand_v6_chain(struct tu_rng *r, struct tu_spec *s)
{
	static const uint8_t kinds[] = { 0, 43, 60, 51 };
	unsigned n = tu_rand_below(r, 5);
	for (unsigned i = 0; i < n; i++) {
		uint8_t t = kinds[tu_rand_below(r, 4)];
		if (t == 0 && i) /* Hop-by-Hop only first, as RFC 8200 requires */
			t = 60;
		s->ext[i].type = t;
		s->ext[i].hdr_len = (uint8_t)(t == 51 ? 2 * tu_rand_below(r, 4) + 1 : tu_rand_below(r, 4));
	}
	s->ext_n = (uint8_t)n;
}

void tu_rand_spec(struct tu_rng *r, struct tu_spec *s, int family, uint8_t proto,
		  size_t max_payload)
{
	memset(s, 0, sizeof(*s));
	s->family = (uint8_t)(family ? family : tu_rand_chance(r, 2) ? 4 : 6);
	if (!proto) {
		static const uint8_t p[] = { IPPROTO_TCP, IPPROTO_UDP, 0 };
		proto = p[tu_rand_below(r, 3)];
		if (!proto)
			proto = s->family == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6;
	}
	s->proto = proto;
	rand_addr(r, s->src, s->family);
	rand_addr(r, s->dst, s->family);
	s->ttl = (uint8_t)tu_rand_range(r, 1, 255);
	s->tos = (uint8_t)tu_rand32(r);
	s->ip_id = (uint16_t)tu_rand32(r);
	s->ip4_frag = tu_rand_chance(r, 2) ? 0x4000 : 0;
	if (s->family == 4 && tu_rand_chance(r, 4)) {
		s->ip4_opts_len = (uint8_t)(4 * tu_rand_range(r, 1, 10));
		memset(s->ip4_opts, 1, s->ip4_opts_len); /* NOPs */
	}
	if (s->family == 6 && tu_rand_chance(r, 3))
		rand_v6_chain(r, s);
	s->sport = (uint16_t)tu_rand32(r);
	s->dport = (uint16_t)tu_rand32(r);
	s->seq = tu_rand32(r);
	s->ack = tu_rand32(r);
	s->tcp_flags = (uint8_t)tu_rand32(r);
	s->window = (uint16_t)tu_rand32(r);
	if (proto == IPPROTO_TCP)
		rand_tcp_opts(r, s);
	s->icmp_type = proto == IPPROTO_ICMPV6 ? 128 : 8;
	s->icmp_id = (uint16_t)tu_rand32(r);
	s->icmp_seq = (uint16_t)tu_rand32(r);
	s->payload_len = max_payload ? tu_rand_below(r, (uint32_t)max_payload + 1) : 0;
	s->payload_seed = tu_rand64(r);
}

size_t tu_rand_packet(struct tu_rng *r, uint8_t *buf, size_t cap, int family, uint8_t proto,
		      size_t max_payload)
{
	struct tu_spec s;
	tu_rand_spec(r, &s, family, proto, max_payload);
	return tu_build(&s, buf, cap);
}

void tu_mutate(struct tu_rng *r, uint8_t *buf, size_t len, unsigned n)
{
	if (!len)
		return;
	for (unsigned i = 0; i < n; i++) {
		size_t at = tu_rand_chance(r, 4) || len <= 80 ? tu_rand_below(r, (uint32_t)len)
							       : tu_rand_below(r, 80);
		switch (tu_rand_below(r, 4)) {
		case 0:
			buf[at] = (uint8_t)tu_rand32(r);
			break;
		case 1:
			buf[at] ^= (uint8_t)(1u << tu_rand_below(r, 8));
			break;
		case 2:
			buf[at] = (uint8_t)(buf[at] + tu_rand_range(r, 1, 4));
			break;
		default:
			buf[at] = (uint8_t)(buf[at] - tu_rand_range(r, 1, 4));
			break;
		}
	}
}

/* ---- GSO segmentation ---- */

/* Header length of the super-packet's L4 (TCP data offset or 8 for UDP); aborts if malformed. */
static size_t gso_l4_hdr(const uint8_t *sp, const struct tu_layout *lo)
{
	const uint8_t *l4 = sp + lo->l3_len;
	size_t h;

	if (lo->proto == IPPROTO_UDP) {
		if (lo->l4_len < 8)
			die("tu_gso_segment: UDP header truncated");
		return 8;
	}
	if (lo->proto != IPPROTO_TCP || lo->l4_len < 20)
		die("tu_gso_segment: not a TCP/UDP packet");
	h = (size_t)(l4[12] >> 4) * 4;
	if (h < 20 || h > lo->l4_len)
		die("tu_gso_segment: bad TCP data offset");
	return h;
}

/* Fix segment i of n (slen bytes at s) after its headers and payload were copied. */
static void gso_fix_headers(uint8_t *s, size_t slen, const struct tu_layout *lo, size_t i,
			    size_t n, size_t pay_off)
{
	uint8_t *l4 = s + lo->l3_len;

	if (lo->family == 4) {
		tu_put16(s + 2, (uint16_t)slen);
		tu_put16(s + 4, (uint16_t)(tu_get16(s + 4) + i));
		tu_fix_ip4_header(s);
	} else {
		tu_put16(s + 4, (uint16_t)(slen - 40));
	}
	if (lo->proto == IPPROTO_UDP) {
		tu_put16(l4 + 4, (uint16_t)(slen - lo->l3_len));
		return;
	}
	tu_put32(l4 + 4, tu_get32(l4 + 4) + (uint32_t)pay_off);
	if (i + 1 < n)
		l4[13] &= (uint8_t) ~(TCP_FIN | TCP_PSH);
	if (i > 0)
		l4[13] &= (uint8_t)~TU_TCP_CWR;
}

/* Complete segment s's checksum: the NEEDS_CSUM way from the super-packet's partial field
 * (returns the adjusted partial), or from scratch (returns 0). */
static uint16_t gso_fix_csum(uint8_t *s, size_t slen, const struct tu_layout *lo,
			     const struct pkt_meta *m, uint16_t super_field)
{
	if (!(m->flags & PKT_META_NEEDS_CSUM)) {
		tu_fix_checksums(s, slen);
		return 0;
	}
	uint8_t *field = s + m->csum_start + m->csum_offset;
	size_t l4len = slen - lo->l3_len;
	/* tcp_gso_segment: delta = ~oldlen + newlen, added to the un-inverted partial. */
	uint16_t adj = ref_fold((uint64_t)super_field + (uint16_t) ~(uint16_t)lo->l4_len + l4len);
	tu_put16(field, adj);
	uint16_t c = (uint16_t)~ref_fold(ref_sum(s + m->csum_start, slen - m->csum_start, 0));
	if (c == 0 && lo->proto == IPPROTO_UDP)
		c = 0xffff;
	tu_put16(field, c);
	return adj;
}

size_t tu_gso_segment(const uint8_t *sp, size_t len, const struct pkt_meta *m, uint8_t *out,
		      size_t cap, struct tu_seg *segs, size_t max_segs)
{
	struct tu_layout lo;

	if (!tu_layout(sp, len, &lo))
		die("tu_gso_segment: malformed packet");
	size_t l4h = gso_l4_hdr(sp, &lo), hdr = lo.l3_len + l4h, pay = lo.len - hdr;
	size_t gso = m->gso_size;
	if (gso == 0)
		die("tu_gso_segment: gso_size 0");
	bool partial = m->flags & PKT_META_NEEDS_CSUM;
	if (partial && (size_t)m->csum_start + m->csum_offset + 2 > hdr)
		die("tu_gso_segment: checksum field at %u+%u outside the %zu header bytes",
		    m->csum_start, m->csum_offset, hdr);
	uint16_t super_field = partial ? tu_get16(sp + m->csum_start + m->csum_offset) : 0;
	size_t n = pay ? (pay + gso - 1) / gso : 1, off = 0;
	if (n > max_segs)
		die("tu_gso_segment: %zu segments, room for %zu", n, max_segs);
	for (size_t i = 0; i < n; i++) {
		size_t chunk = pay - i * gso < gso ? pay - i * gso : gso, slen = hdr + chunk;
		uint8_t *s = out + off;
		if (slen > cap - off)
			die("tu_gso_segment: output full after %zu segments", i);
		memcpy(s, sp, hdr);
		memcpy(s + hdr, sp + hdr + i * gso, chunk);
		gso_fix_headers(s, slen, &lo, i, n, i * gso);
		segs[i].partial = gso_fix_csum(s, slen, &lo, m, super_field);
		segs[i].off = off;
		segs[i].len = slen;
		off += slen;
	}
	return n;
}

uint8_t tu_pattern_byte(uint32_t seed, size_t i)
{
	uint32_t x = (uint32_t)i + seed * 7919u;
	return (uint8_t)(x * 131u + (x >> 8) * 17u + (x >> 16));
}

void tu_fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = tu_pattern_byte(seed, i);
}

size_t tu_client_hello(uint8_t *b, const char *name, bool record)
{
	size_t n = strlen(name), ext = 2 + 2 + 2 + 1 + 2 + n, body = 2 + 32 + 1 + 4 + 2 + 2 + ext;
	size_t i = 0;

	if (record) {
		b[i++] = 22, b[i++] = 3, b[i++] = 1;             /* handshake, TLS 1.0 record */
		tu_put16(b + i, (uint16_t)(body + 4)), i += 2;
	}
	b[i++] = 1, b[i++] = 0;                                  /* ClientHello */
	tu_put16(b + i, (uint16_t)body), i += 2;
	b[i++] = 3, b[i++] = 3;                                  /* TLS 1.2 */
	memset(b + i, 0x5a, 32), i += 32;                        /* random */
	b[i++] = 0;                                              /* no session id */
	b[i++] = 0, b[i++] = 2, b[i++] = 0x13, b[i++] = 0x01;   /* one cipher suite */
	b[i++] = 1, b[i++] = 0;                                  /* null compression */
	tu_put16(b + i, (uint16_t)ext), i += 2;                  /* extensions */
	b[i++] = 0, b[i++] = 0;                                  /* server_name */
	tu_put16(b + i, (uint16_t)(ext - 4)), i += 2;
	tu_put16(b + i, (uint16_t)(n + 3)), i += 2;
	b[i++] = 0;                                              /* host_name */
	tu_put16(b + i, (uint16_t)n), i += 2;
	memcpy(b + i, name, n);
	return i + n;
}

struct tu_counter_query {
	const char *name;
	uint64_t v;
	bool found;
};

static void tu_counter_visit(void *arg, const char *n, uint64_t v)
{
	struct tu_counter_query *q = arg;

	if (strcmp(n, q->name) == 0) {
		q->v = v;
		q->found = true;
	}
}

uint64_t tu_stack_counter(const struct netstack_ops *ops, struct netstack *ns, const char *name,
			  bool *found)
{
	struct tu_counter_query q = { name, 0, false };

	ops->counters(ns, tu_counter_visit, &q);
	*found = q.found;
	return q.v;
}

int tu_dir_entries(const char *path)
{
	DIR *d = opendir(path);
	int n = 0;

	if (!d)
		return -1;
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}
