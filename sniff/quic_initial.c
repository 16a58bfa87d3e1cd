/* quic_initial.c — sniff the SNI of a QUIC client from its Initial packets: parse long headers
 * (RFC 9000 §17.2, RFC 9369 §3.2), remove header and payload protection with the Initial keys
 * (RFC 9001 §5), collect CRYPTO frames into the start of the CRYPTO stream and hand it to the
 * ClientHello parser. One struct sniff_quic per UDP flow; every buffer lives in it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/tlslib.h"
#include "sniff/quic_initial.h"
#include "sniff/sniff.h"
#include "sniff/tls_hello.h"

#define TAG_LEN 16
#define SAMPLE_LEN 16

/* Initial salts: RFC 9001 §5.2 (v1) and RFC 9369 §3.3.1 (v2). */
static const uint8_t salt_v1[20] = {
	0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17,
	0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f, 0x0a,
};
static const uint8_t salt_v2[20] = {
	0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93,
	0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd, 0x2e, 0xd9,
};

struct sniff_quic {
	EVP_CIPHER_CTX *ecb, *gcm;
	struct quic_initial_keys keys;
	uint32_t version;
	uint8_t dcid[QUIC_CID_MAX];
	size_t dcid_len;
	int keyed;            /* keys, version and dcid are set (from the first Initial) */
	int opened;           /* some packet was authenticated */
	int64_t largest_pn;   /* of the packets opened; -1 before the first */
	unsigned dgrams;
	enum sniff_result verdict;
	size_t contig;        /* crypto[0..contig) is all received */
	char name[SNIFF_NAME_MAX + 1];
	uint8_t got[SNIFF_QUIC_CRYPTO_MAX / 8]; /* a bit per CRYPTO stream byte received */
	uint8_t crypto[SNIFF_QUIC_CRYPTO_MAX];
	uint8_t plain[SNIFF_QUIC_PKT_MAX];
};

/* ---- wire helpers ---------------------------------------------------------------------- */

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* RFC 9000 §16 variable-length integer at p[*pos], within n: 0, or -1 if it runs past n. */
static int varint(const uint8_t *p, size_t n, size_t *pos, uint64_t *v)
{
	size_t l, i;

	if (*pos >= n)
		return -1;
	l = (size_t)1 << (p[*pos] >> 6);
	if (l > n - *pos)
		return -1;
	*v = p[*pos] & 0x3f;
	for (i = 1; i < l; i++)
		*v = *v << 8 | p[*pos + i];
	*pos += l;
	return 0;
}

/* A long-header packet at d[off..len). */
struct lh {
	uint32_t version;
	int initial;
	const uint8_t *dcid;
	size_t dcid_len, token_len;
	size_t start, pn_off, end; /* offsets in the datagram */
};

/* 0 with *h filled for a v1/v2 long header whose Length fits the datagram, -1 otherwise (a
 * short header, another version, a Retry, or a truncated packet: nothing after it can be
 * delimited). */
static int long_header(const uint8_t *d, size_t len, size_t off, struct lh *h)
{
	const uint8_t *p = d + off;
	size_t n = len - off, pos = 5, l;
	uint64_t v;
	unsigned type, initial_type, retry_type;

	if (n < 7 || !(p[0] & 0x80) || !(p[0] & 0x40))
		return -1;
	h->version = be32(p + 1);
	if (h->version == QUIC_V1)
		initial_type = 0, retry_type = 3; /* RFC 9000 §17.2 */
	else if (h->version == QUIC_V2)
		initial_type = 1, retry_type = 0; /* RFC 9369 §3.2 */
	else
		return -1;
	type = (p[0] >> 4) & 3;
	if (type == retry_type)
		return -1;
	l = p[pos++];
	if (l > QUIC_CID_MAX || l + 1 > n - pos)
		return -1;
	h->dcid = p + pos;
	h->dcid_len = l;
	pos += l;
	l = p[pos++];
	if (l > QUIC_CID_MAX || l > n - pos)
		return -1;
	pos += l;
	h->initial = type == initial_type;
	h->token_len = 0;
	if (h->initial) {
		if (varint(p, n, &pos, &v) != 0 || v > n - pos)
			return -1;
		h->token_len = (size_t)v;
		pos += (size_t)v;
	}
	if (varint(p, n, &pos, &v) != 0 || v > n - pos)
		return -1;
	h->start = off;
	h->pn_off = off + pos;
	h->end = off + pos + (size_t)v;
	return 0;
}

bool sniff_quic_is_initial(const uint8_t *dgram, size_t len)
{
	struct lh h;

	return long_header(dgram, len, 0, &h) == 0 && h.initial;
}

/* ---- keys (RFC 9001 §5.2) ---------------------------------------------------------------- */

static int hkdf(EVP_KDF *kdf, int mode, const uint8_t *key, size_t key_len, const uint8_t *salt,
		size_t salt_len, const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len)
{
	EVP_KDF_CTX *ctx = EVP_KDF_CTX_new(kdf);
	OSSL_PARAM params[6], *p = params;
	int ret = -EIO;

	if (!ctx)
		return -ENOMEM;
	*p++ = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0);
	*p++ = OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode);
	*p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key, key_len);
	if (salt)
		*p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, salt_len);
	if (info)
		*p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, info_len);
	*p = OSSL_PARAM_construct_end();
	if (EVP_KDF_derive(ctx, out, out_len, params) == 1)
		ret = 0;
	EVP_KDF_CTX_free(ctx);
	return ret;
}

/* HKDF-Expand-Label(secret, label, "", len) of RFC 8446 §7.1. */
static int expand_label(EVP_KDF *kdf, const uint8_t secret[32], const char *label, uint8_t *out,
			size_t len)
{
	uint8_t info[2 + 1 + 6 + 32 + 1];
	size_t l = strlen(label), n = 0;

	info[n++] = (uint8_t)(len >> 8);
	info[n++] = (uint8_t)len;
	info[n++] = (uint8_t)(6 + l);
	memcpy(info + n, "tls13 ", 6);
	n += 6;
	memcpy(info + n, label, l);
	n += l;
	info[n++] = 0; /* empty context */
	return hkdf(kdf, EVP_KDF_HKDF_MODE_EXPAND_ONLY, secret, 32, NULL, 0, info, n, out, len);
}

int quic_initial_keys(uint32_t version, const uint8_t *dcid, size_t dcid_len,
		      struct quic_initial_keys *k)
{
	static const uint8_t none[1];
	const uint8_t *salt = version == QUIC_V1 ? salt_v1 : salt_v2;
	const char *lk = version == QUIC_V1 ? "quic key" : "quicv2 key";
	const char *li = version == QUIC_V1 ? "quic iv" : "quicv2 iv";
	const char *lh = version == QUIC_V1 ? "quic hp" : "quicv2 hp";
	uint8_t initial[32], client[32];
	EVP_KDF *kdf;
	int ret;

	if ((version != QUIC_V1 && version != QUIC_V2) || dcid_len > QUIC_CID_MAX)
		return -EINVAL;
	if ((ret = tlslib_load(TLSLIB_CRYPTO, NULL, 0)) != 0)
		return ret;
	if (!(kdf = EVP_KDF_fetch(NULL, "HKDF", NULL)))
		return -EIO;
	/* An empty DCID is an empty IKM; the pointer only has to be valid. */
	if ((ret = hkdf(kdf, EVP_KDF_HKDF_MODE_EXTRACT_ONLY, dcid_len ? dcid : none, dcid_len, salt,
			sizeof(salt_v1), NULL, 0, initial, sizeof(initial))) != 0)
		goto out;
	if ((ret = expand_label(kdf, initial, "client in", client, sizeof(client))) != 0 ||
	    (ret = expand_label(kdf, client, lk, k->key, sizeof(k->key))) != 0 ||
	    (ret = expand_label(kdf, client, li, k->iv, sizeof(k->iv))) != 0 ||
	    (ret = expand_label(kdf, client, lh, k->hp, sizeof(k->hp))) != 0)
		goto out;
out:
	EVP_KDF_free(kdf);
	return ret;
}

/* ---- packet protection (RFC 9001 §5.3, §5.4) -------------------------------------------- */

static int hp_mask(EVP_CIPHER_CTX *ecb, const uint8_t hp[16], const uint8_t *sample,
		   uint8_t mask[16])
{
	int outl = 0;

	if (EVP_EncryptInit_ex(ecb, EVP_aes_128_ecb(), NULL, hp, NULL) != 1 ||
	    EVP_CIPHER_CTX_set_padding(ecb, 0) != 1 ||
	    EVP_EncryptUpdate(ecb, mask, &outl, sample, SAMPLE_LEN) != 1 || outl != SAMPLE_LEN)
		return -EIO;
	return 0;
}

static void nonce(const uint8_t iv[12], uint64_t pn, uint8_t out[12])
{
	memcpy(out, iv, 12);
	for (int i = 0; i < 8; i++)
		out[11 - i] ^= (uint8_t)(pn >> (8 * i));
}

/* RFC 9000 §A.3: the full packet number nearest to the next expected one. */
static uint64_t pn_decode(int64_t largest, uint64_t truncated, unsigned bits)
{
	uint64_t expected = (uint64_t)(largest + 1), win = (uint64_t)1 << bits;
	uint64_t hwin = win / 2, cand = (expected & ~(win - 1)) | truncated;

	if (cand + hwin <= expected && cand < ((uint64_t)1 << 62) - win)
		return cand + win;
	if (cand > expected + hwin && cand >= win)
		return cand - win;
	return cand;
}

/* Remove the protection of the Initial h in d with keys k: the payload to q->plain, 0 with *n
 * and *pn set, or -1 if it does not authenticate (or does not fit). */
static int open_packet(struct sniff_quic *q, const struct quic_initial_keys *k, const uint8_t *d,
		       const struct lh *h, size_t *n, uint64_t *pn)
{
	uint8_t mask[16], b0, pnb[4], nc[12];
	size_t pn_len, ct, i;
	uint64_t trunc = 0;
	int outl;

	if (h->end - h->pn_off < 4 + SAMPLE_LEN || h->end - h->start > SNIFF_QUIC_PKT_MAX)
		return -1;
	if (hp_mask(q->ecb, k->hp, d + h->pn_off + 4, mask) != 0)
		return -1;
	b0 = d[h->start] ^ (mask[0] & 0x0f);
	pn_len = (size_t)(b0 & 3) + 1;
	for (i = 0; i < pn_len; i++) {
		pnb[i] = d[h->pn_off + i] ^ mask[1 + i];
		trunc = trunc << 8 | pnb[i];
	}
	*pn = pn_decode(q->largest_pn, trunc, (unsigned)(8 * pn_len));
	nonce(k->iv, *pn, nc);
	ct = h->end - h->pn_off - pn_len - TAG_LEN;
	/* The AAD is the header as sent, less its protection: three pieces. */
	if (EVP_DecryptInit_ex(q->gcm, EVP_aes_128_gcm(), NULL, k->key, nc) != 1 ||
	    EVP_DecryptUpdate(q->gcm, NULL, &outl, &b0, 1) != 1 ||
	    EVP_DecryptUpdate(q->gcm, NULL, &outl, d + h->start + 1, h->pn_off - h->start - 1) != 1 ||
	    EVP_DecryptUpdate(q->gcm, NULL, &outl, pnb, (int)pn_len) != 1)
		return -1;
	if (EVP_DecryptUpdate(q->gcm, q->plain, &outl, d + h->pn_off + pn_len, (int)ct) != 1 ||
	    EVP_CIPHER_CTX_ctrl(q->gcm, EVP_CTRL_GCM_SET_TAG, TAG_LEN,
				(void *)(d + h->end - TAG_LEN)) != 1 ||
	    EVP_DecryptFinal_ex(q->gcm, q->plain + outl, &outl) != 1)
		return -1;
	*n = ct;
	return 0;
}

int quic_initial_seal(uint32_t version, const uint8_t *dcid, size_t dcid_len,
		      const uint8_t *token, size_t token_len, uint32_t pn, const uint8_t *frames,
		      size_t frames_len, uint8_t *out, size_t cap, size_t *out_len)
{
	struct quic_initial_keys k;
	EVP_CIPHER_CTX *c = NULL;
	uint8_t mask[16], nc[12];
	size_t tl = token_len < 64 ? 1 : 2, len = 4 + frames_len + TAG_LEN, i;
	size_t pn_off = 1 + 4 + 1 + dcid_len + 1 + tl + token_len + 2;
	int ret, outl;

	if (frames_len == 0 || len > 0x3fff || token_len > 0x3fff)
		return -EINVAL;
	if (pn_off + len > cap)
		return -ENOSPC;
	if ((ret = quic_initial_keys(version, dcid, dcid_len, &k)) != 0)
		return ret;
	i = 0;
	out[i++] = (uint8_t)(0xc0 | (version == QUIC_V1 ? 0 : 1) << 4 | 3); /* 4-byte pn */
	out[i++] = (uint8_t)(version >> 24), out[i++] = (uint8_t)(version >> 16);
	out[i++] = (uint8_t)(version >> 8), out[i++] = (uint8_t)version;
	out[i++] = (uint8_t)dcid_len;
	memcpy(out + i, dcid, dcid_len);
	i += dcid_len;
	out[i++] = 0; /* SCID */
	if (tl == 2)
		out[i++] = (uint8_t)(0x40 | token_len >> 8);
	out[i++] = (uint8_t)token_len;
	if (token_len)
		memcpy(out + i, token, token_len);
	i += token_len;
	out[i++] = (uint8_t)(0x40 | len >> 8), out[i++] = (uint8_t)len;
	out[i++] = (uint8_t)(pn >> 24), out[i++] = (uint8_t)(pn >> 16);
	out[i++] = (uint8_t)(pn >> 8), out[i++] = (uint8_t)pn;
	nonce(k.iv, pn, nc);
	ret = -EIO;
	if (!(c = EVP_CIPHER_CTX_new()))
		return -ENOMEM;
	if (EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, k.key, nc) != 1 ||
	    EVP_EncryptUpdate(c, NULL, &outl, out, (int)(pn_off + 4)) != 1 ||
	    EVP_EncryptUpdate(c, out + pn_off + 4, &outl, frames, (int)frames_len) != 1 ||
	    EVP_EncryptFinal_ex(c, out + pn_off + 4 + outl, &outl) != 1 ||
	    EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG_LEN, out + pn_off + 4 + frames_len) != 1)
		goto out;
	if (hp_mask(c, k.hp, out + pn_off + 4, mask) != 0)
		goto out;
	out[0] ^= mask[0] & 0x0f;
	for (i = 0; i < 4; i++)
		out[pn_off + i] ^= mask[1 + i];
	*out_len = pn_off + len;
	ret = 0;
out:
	EVP_CIPHER_CTX_free(c);
	return ret;
}

/* ---- frames and the CRYPTO stream ------------------------------------------------------- */

static void crypto_data(struct sniff_quic *q, uint64_t off, const uint8_t *p, size_t n)
{
	if (off >= SNIFF_QUIC_CRYPTO_MAX)
		return; /* past the bytes the ClientHello may use */
	if (n > SNIFF_QUIC_CRYPTO_MAX - off)
		n = SNIFF_QUIC_CRYPTO_MAX - (size_t)off;
	memcpy(q->crypto + off, p, n);
	for (size_t i = (size_t)off; i < off + n; i++)
		q->got[i / 8] |= (uint8_t)(1u << (i % 8));
	while (q->contig < SNIFF_QUIC_CRYPTO_MAX && (q->got[q->contig / 8] >> (q->contig % 8)) & 1)
		q->contig++;
}

/* RFC 9000 §19.3 ACK frame after its type: skipped. */
static int skip_ack(const uint8_t *p, size_t n, size_t *pos, int ecn)
{
	uint64_t v, ranges;

	if (varint(p, n, pos, &v) || varint(p, n, pos, &v) || varint(p, n, pos, &ranges) ||
	    varint(p, n, pos, &v))
		return -1;
	for (uint64_t r = 0; r < ranges; r++) /* each takes >= 2 bytes: bounded by n */
		if (varint(p, n, pos, &v) || varint(p, n, pos, &v))
			return -1;
	if (ecn && (varint(p, n, pos, &v) || varint(p, n, pos, &v) || varint(p, n, pos, &v)))
		return -1;
	return 0;
}

/* The frames of an opened Initial (RFC 9000 §12.4: only PADDING, PING, ACK, CRYPTO and
 * CONNECTION_CLOSE may appear). Stops at the first frame it cannot walk. */
static void frames(struct sniff_quic *q, const uint8_t *p, size_t n)
{
	size_t pos = 0;

	while (pos < n) {
		uint64_t type, off, len;

		if (varint(p, n, &pos, &type) != 0)
			return;
		switch (type) {
		case 0x00: /* PADDING */
		case 0x01: /* PING */
			break;
		case 0x02: /* ACK */
		case 0x03:
			if (skip_ack(p, n, &pos, type == 0x03) != 0)
				return;
			break;
		case 0x06: /* CRYPTO */
			if (varint(p, n, &pos, &off) || varint(p, n, &pos, &len) || len > n - pos)
				return;
			crypto_data(q, off, p + pos, (size_t)len);
			pos += (size_t)len;
			break;
		case 0x1c: /* CONNECTION_CLOSE: the client gave up */
			q->verdict = SNIFF_NONE;
			return;
		default:
			return;
		}
	}
}

/* ---- the sniffer -------------------------------------------------------------------------- */

int sniff_quic_new(struct sniff_quic **out)
{
	struct sniff_quic *q;
	int ret;

	*out = NULL;
	if ((ret = tlslib_load(TLSLIB_CRYPTO, NULL, 0)) != 0)
		return ret;
	if (!(q = calloc(1, sizeof(*q))))
		return -ENOMEM;
	q->ecb = EVP_CIPHER_CTX_new();
	q->gcm = EVP_CIPHER_CTX_new();
	if (!q->ecb || !q->gcm) {
		sniff_quic_free(q);
		return -ENOMEM;
	}
	q->largest_pn = -1;
	q->verdict = SNIFF_NEED_MORE;
	*out = q;
	return 0;
}

void sniff_quic_free(struct sniff_quic *q)
{
	if (!q)
		return;
	EVP_CIPHER_CTX_free(q->ecb);
	EVP_CIPHER_CTX_free(q->gcm);
	free(q);
}

/* One Initial: 0 opened (frames taken), -1 not. The first one keys the flow. A packet whose
 * DCID differs from the first one's is tried with the flow's keys (a client that has heard
 * the server keeps them, RFC 9001 §5.2) and then, if it carries a token, with keys from its
 * own DCID (a client answering a Retry, RFC 9000 §17.2.5.2; those keys then become the
 * flow's). *rekeyed limits that second derivation to one per datagram, so that a datagram of
 * many tiny forged packets cannot buy many key derivations. */
static int initial(struct sniff_quic *q, const uint8_t *d, const struct lh *h, int *rekeyed)
{
	struct quic_initial_keys k;
	size_t n;
	uint64_t pn;

	if (!q->keyed) {
		if (quic_initial_keys(h->version, h->dcid, h->dcid_len, &q->keys) != 0)
			return -1;
		q->version = h->version;
		memcpy(q->dcid, h->dcid, h->dcid_len);
		q->dcid_len = h->dcid_len;
		q->keyed = 1;
	}
	if (h->version != q->version)
		return -1;
	if (open_packet(q, &q->keys, d, h, &n, &pn) != 0) {
		if (!q->opened || h->token_len == 0 || *rekeyed ||
		    (h->dcid_len == q->dcid_len && !memcmp(h->dcid, q->dcid, q->dcid_len)))
			return -1;
		*rekeyed = 1;
		if (quic_initial_keys(h->version, h->dcid, h->dcid_len, &k) != 0 ||
		    open_packet(q, &k, d, h, &n, &pn) != 0)
			return -1;
		q->keys = k;
		memcpy(q->dcid, h->dcid, h->dcid_len);
		q->dcid_len = h->dcid_len;
	}
	q->opened = 1;
	if ((int64_t)pn > q->largest_pn)
		q->largest_pn = (int64_t)pn;
	frames(q, q->plain, n);
	return 0;
}

static void decide(struct sniff_quic *q)
{
	char name[SNIFF_NAME_MAX + 1];
	enum sniff_result r;

	if (q->verdict != SNIFF_NEED_MORE || q->contig == 0)
		return;
	r = tls_hello_parse(q->crypto, q->contig, name);
	if (r == SNIFF_NEED_MORE && q->contig == SNIFF_QUIC_CRYPTO_MAX)
		r = SNIFF_NONE; /* a ClientHello too long to keep */
	if (r == SNIFF_FOUND)
		memcpy(q->name, name, strlen(name) + 1);
	q->verdict = r;
}

enum sniff_result sniff_quic_feed(struct sniff_quic *q, const uint8_t *dgram, size_t len,
				  char name[SNIFF_NAME_MAX + 1])
{
	size_t off = 0;
	struct lh h;
	int rekeyed = 0;

	if (q->verdict != SNIFF_NEED_MORE)
		goto out;
	q->dgrams++;
	if (!q->opened && !sniff_quic_is_initial(dgram, len)) {
		q->verdict = SNIFF_NONE;
		goto out;
	}
	/* Coalesced packets (RFC 9000 §12.2): each long header delimits the next. */
	while (off < len && q->verdict == SNIFF_NEED_MORE &&
	       long_header(dgram, len, off, &h) == 0) {
		if (h.initial && initial(q, dgram, &h, &rekeyed) != 0 && !q->opened) {
			q->verdict = SNIFF_NONE; /* the first Initial does not authenticate */
			break;
		}
		off = h.end;
		decide(q);
	}
	if (q->verdict == SNIFF_NEED_MORE && q->dgrams >= SNIFF_QUIC_MAX_DGRAMS)
		q->verdict = SNIFF_NONE;
out:
	if (q->verdict == SNIFF_FOUND)
		memcpy(name, q->name, strlen(q->name) + 1);
	return q->verdict;
}
