/* fuzz_dns_msg.c — libFuzzer target for the DNS codec (core/dns_msg.c).
 *
 * Input: a message. Parsed as a client's query, in an exactly-sized heap copy (ASan sees any
 * over-read). When it parses: a nameable name is a name the outbounds accept (letters, digits,
 * '-', '_', '.'), and the query built upstream from it parses back to the same question; a
 * reply made here parses as an answer to it and respects the client's limit; and the same
 * bytes with QR set, parsed as an upstream answer to that question, rebuild into a reply that
 * again parses and respects the limit. Nothing may crash, read or write out of bounds.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dns_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT 4096

static bool name_ok(const struct dns_question *q)
{
	for (size_t i = 0; i < q->name_len; i++) {
		char c = q->name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.'))
			return false;
	}
	return q->name_len > 0 && q->name_len <= DNS_NAME_MAX && strlen(q->name) == q->name_len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t addrs[2][16] = { { 198, 19, 0, 1 }, { 198, 19, 0, 2 } };
	struct dns_query q, back;
	struct dns_answer a;
	uint8_t out[2048], *copy;
	size_t limit;
	int n;

	if (size > MAX_INPUT)
		size = MAX_INPUT;
	copy = malloc(size ? size : 1);
	memcpy(copy, data, size);
	if (dns_parse_query(copy, size, &q) != 0) {
		if (size >= DNS_HDR_LEN &&
		    dns_build_header_error(out, sizeof(out), copy, size, DNS_R_FORMERR) != DNS_HDR_LEN)
			abort();
		goto out;
	}
	if (q.q.nameable) {
		if (!name_ok(&q.q))
			abort();
		n = dns_build_query(out, sizeof(out), 7, &q.q);
		if (n < 0 || dns_parse_query(out, (size_t)n, &back) != 0 ||
		    !dns_question_equal(&q.q, &back.q) || strcmp(q.q.name, back.q.name) != 0)
			abort();
	}
	limit = dns_reply_limit(&q, false, 1472);
	n = dns_build_synth(out, sizeof(out), limit, &q, copy, DNS_R_NOERROR, 4, addrs, 2, 1);
	if (n < 0 || (size_t)n > sizeof(out) ||
	    ((size_t)n > limit && (size_t)n > DNS_HDR_LEN + q.q.wire_len + DNS_OPT_LEN))
		abort();
	if (dns_parse_answer(out, (size_t)n, q.id, &q.q, &a) != 0)
		abort();
	/* The same bytes as an upstream's answer to that question. */
	copy[2] |= 0x80;
	if (dns_parse_answer(copy, size, q.id, &q.q, &a) == 0) {
		copy[2] &= 0x7f;
		n = dns_build_from_answer(out, sizeof(out), limit, &q, copy, copy, &a, 3);
		if (n == -ENOSPC || n == -EBADMSG)
			goto out; /* no room, or a name pointing into a TTL: the caller answers SERVFAIL */
		if (n < 0 || ((size_t)n > limit && (size_t)n > DNS_HDR_LEN + q.q.wire_len + DNS_OPT_LEN))
			abort();
		if (dns_parse_answer(out, (size_t)n, q.id, &q.q, &a) != 0)
			abort();
	}
out:
	free(copy);
	return 0;
}
