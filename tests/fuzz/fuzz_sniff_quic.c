/* fuzz_sniff_quic.c — libFuzzer target for the QUIC Initial sniffer (sniff/quic_initial.c and
 * the ClientHello parser under it).
 *
 * Input: a mode byte, then records of a 2-byte big-endian length and that many bytes.
 *  - mode bit 0 clear ("raw"): each record is a client datagram, fed as is.
 *  - mode bit 0 set ("seal"): a DCID length byte (mod 21) and the DCID come first; each record
 *    is then the plaintext frames of one Initial, which the harness seals (packet number =
 *    record index; QUIC v2 if mode bit 1 is set) so that decryption succeeds and the frame,
 *    CRYPTO reassembly and ClientHello parsers run on fuzzed plaintext. With mode bit 2 set
 *    all the packets are coalesced into one datagram, else each is its own; with mode bit 3
 *    set each packet carries a token.
 * Nothing may crash or read out of bounds (each datagram is fed in an exactly-sized heap
 * copy); a verdict (FOUND or NONE), once given, is given again for every later datagram with
 * the same name; a name found is a lowercase host name; no decision takes more than
 * SNIFF_QUIC_MAX_DGRAMS datagrams.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sniff/quic_initial.h"
#include "sniff/sniff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_RECORDS 16
#define MAX_INPUT (64 * 1024)

struct state {
	struct sniff_quic *q;
	enum sniff_result verdict;
	char first[SNIFF_NAME_MAX + 1];
	unsigned fed;
};

static void check_name(const char *name)
{
	size_t n = strnlen(name, SNIFF_NAME_MAX + 1), label = 0;

	if (n == 0 || n > SNIFF_NAME_MAX || name[n - 1] == '.')
		abort();
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (c == '.') {
			if (label == 0)
				abort();
			label = 0;
		} else if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
			     c == '_') || ++label > 63) {
			abort();
		}
	}
}

static void feed(struct state *s, const uint8_t *d, size_t n)
{
	uint8_t *copy = malloc(n ? n : 1);
	char name[SNIFF_NAME_MAX + 1];
	enum sniff_result r;

	memcpy(copy, d, n);
	(void)sniff_quic_is_initial(copy, n);
	memset(name, 0x7f, sizeof(name));
	r = sniff_quic_feed(s->q, copy, n, name);
	free(copy);
	s->fed++;
	if (r == SNIFF_FOUND)
		check_name(name);
	if (s->verdict != SNIFF_NEED_MORE) {
		if (r != s->verdict || (r == SNIFF_FOUND && strcmp(name, s->first) != 0))
			abort(); /* a decided flow changed its mind */
		return;
	}
	if (r == SNIFF_NEED_MORE && s->fed >= SNIFF_QUIC_MAX_DGRAMS)
		abort(); /* unbounded */
	s->verdict = r;
	if (r == SNIFF_FOUND)
		memcpy(s->first, name, strlen(name) + 1);
}

/* The next record at data[*pos]: its bytes and length, or NULL at the end. */
static const uint8_t *record(const uint8_t *data, size_t size, size_t *pos, size_t *len)
{
	size_t l;

	if (size - *pos < 2)
		return NULL;
	l = (size_t)data[*pos] << 8 | data[*pos + 1];
	*pos += 2;
	if (l > size - *pos)
		l = size - *pos;
	*len = l;
	*pos += l;
	return data + *pos - l;
}

static void seal_mode(struct state *s, const uint8_t *data, size_t size, uint8_t mode)
{
	static const uint8_t token[] = "token";
	uint32_t version = mode & 2 ? QUIC_V2 : QUIC_V1;
	size_t pos = 0, dcid_len, n, cap = size + MAX_RECORDS * 64, used = 0;
	const uint8_t *dcid, *f;
	uint8_t *dgram;

	if (size < 1)
		return;
	dcid_len = data[pos++] % (QUIC_CID_MAX + 1);
	if (size - pos < dcid_len)
		return;
	dcid = data + pos;
	pos += dcid_len;
	dgram = malloc(cap);
	for (uint32_t pn = 0; pn < MAX_RECORDS && (f = record(data, size, &pos, &n)); pn++) {
		size_t out;

		if (n == 0 ||
		    quic_initial_seal(version, dcid, dcid_len, token, mode & 8 ? sizeof(token) - 1 : 0,
				      pn, f, n, dgram + used, cap - used, &out) != 0)
			continue;
		if (mode & 4) {
			used += out;
		} else {
			feed(s, dgram, out);
		}
	}
	if (mode & 4)
		feed(s, dgram, used);
	free(dgram);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct state s = { .verdict = SNIFF_NEED_MORE };
	size_t pos = 0, n;
	const uint8_t *d;

	if (size < 1 || size > MAX_INPUT)
		return 0;
	if (sniff_quic_new(&s.q) != 0)
		abort();
	if (data[0] & 1) {
		seal_mode(&s, data + 1, size - 1, data[0]);
	} else {
		for (int i = 0; i < MAX_RECORDS && (d = record(data + 1, size - 1, &pos, &n)); i++)
			feed(&s, d, n);
	}
	sniff_quic_free(s.q);
	return 0;
}
