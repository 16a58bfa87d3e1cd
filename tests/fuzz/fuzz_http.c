/* fuzz_http.c — libFuzzer target for the HTTP CONNECT response parser (outbound/http_codec.c).
 *
 * Input: the proxy's bytes. Whatever they are, nothing may crash or read out of bounds, and the
 * parser must behave as an incremental parser: every prefix is parsed (each in an exactly-sized
 * heap copy, so ASan sees any over-read); once a prefix gives a verdict (a head length or an
 * error), every longer prefix gives the same one; a head length never exceeds what was given;
 * a status is 100..999 when a head is complete.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "outbound/http_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT (HTTP_RESP_MAX + 64)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int verdict = 0, status = 0;

	if (size > MAX_INPUT)
		size = MAX_INPUT;
	for (size_t i = 0; i <= size; i++) {
		uint8_t *copy = malloc(i ? i : 1);
		int st = -1, r;

		memcpy(copy, data, i);
		r = http_parse_response(copy, i, &st);
		free(copy);
		if (verdict != 0) {
			if (r != verdict || (r > 0 && st != status))
				abort(); /* a verdict changed with more bytes */
			continue;
		}
		if (r > 0) {
			if ((size_t)r > i || st < 100 || st > 999)
				abort();
			status = st;
		}
		verdict = r;
	}
	return 0;
}
