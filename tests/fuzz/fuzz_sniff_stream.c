/* fuzz_sniff_stream.c — libFuzzer target for sniff_stream (sniff/stream.c and the TLS, HTTP and
 * name parsers under it).
 *
 * Input: the first bytes of a TCP stream. Nothing may crash or read out of bounds (each prefix
 * is sniffed in an exactly-sized heap copy), and sniffing must behave as the stateless
 * incremental sniffer it claims to be: prefixes are offered in growing steps and the full
 * input last; once a prefix gives a verdict (FOUND or NONE), every longer prefix gives the
 * same one, with the same name and protocol; NEED_MORE never comes at or past
 * SNIFF_STREAM_MAX; a name found is a lowercase host name of 1..253 bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sniff/sniff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT (SNIFF_STREAM_MAX + 64)
#define STEPS 48

/* A dumb restatement of what a found name must be. */
static void check_name(const char *name)
{
	size_t n = strnlen(name, SNIFF_NAME_MAX + 1), label = 0;

	if (n == 0 || n > SNIFF_NAME_MAX || name[0] == '.' || name[n - 1] == '.')
		abort();
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (c == '.') {
			if (label == 0)
				abort();
			label = 0;
		} else if (((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
			    c == '_') && ++label <= 63) {
			continue;
		} else {
			abort();
		}
	}
}

static enum sniff_result run(const uint8_t *data, size_t len, char *name, enum sniff_proto *proto)
{
	uint8_t *copy = malloc(len ? len : 1);
	enum sniff_result r;

	memcpy(copy, data, len);
	memset(name, 0x7f, SNIFF_NAME_MAX + 1);
	r = sniff_stream(copy, len, name, proto);
	free(copy);
	if (r == SNIFF_FOUND)
		check_name(name);
	if (r == SNIFF_NEED_MORE && len >= SNIFF_STREAM_MAX)
		abort(); /* unbounded */
	return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char name[SNIFF_NAME_MAX + 1], first[SNIFF_NAME_MAX + 1];
	enum sniff_result verdict = SNIFF_NEED_MORE;
	enum sniff_proto vproto = SNIFF_PROTO_NONE;
	size_t step;

	if (size > MAX_INPUT)
		size = MAX_INPUT;
	/* short inputs: every prefix; long ones: STEPS of them, then the whole */
	step = size <= 512 ? 1 : size / STEPS;
	for (size_t i = 0;; i = i + step < size ? i + step : size) {
		enum sniff_proto proto;
		enum sniff_result r = run(data, i, name, &proto);

		if (verdict != SNIFF_NEED_MORE) {
			if (r != verdict || proto != vproto ||
			    (r == SNIFF_FOUND && strcmp(name, first) != 0))
				abort(); /* a verdict changed with more bytes */
		} else if (r != SNIFF_NEED_MORE) {
			verdict = r;
			vproto = proto;
			if (r == SNIFF_FOUND)
				memcpy(first, name, strlen(name) + 1);
		}
		if (i == size)
			break;
	}
	return 0;
}
