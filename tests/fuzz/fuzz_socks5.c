/* fuzz_socks5.c — libFuzzer target for the SOCKS5 client codec (outbound/socks5_codec.c).
 *
 * Input: one header byte, then server bytes.
 *   header bits 0-1  what to drive: 0 method reply, 1 auth reply, 2 CONNECT reply parser,
 *                    3 the whole client sequence (greeting .. reply .. early bytes)
 *   header bit 2     credentials configured (USERPASS offered)
 *   header bits 3-7  delivery chunk size - 1 for mode 3 (1..32 bytes per "recv")
 * Whatever the bytes, nothing may crash or read out of bounds, and the parsers must behave as
 * incremental parsers: every prefix shorter than a verdict is NEED_MORE, a verdict never
 * changes as more bytes arrive, and a consumed count never exceeds what was given.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "outbound/socks5_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT 2048

static int parse_stage(int stage, bool auth, const uint8_t *b, size_t n)
{
	uint8_t method;
	struct socks5_addr bnd;

	switch (stage) {
	case 0:
		return socks5_parse_method(b, n, auth, &method);
	case 1:
		return socks5_parse_auth_reply(b, n);
	default:
		return socks5_parse_reply(b, n, &bnd);
	}
}

/* Every prefix, each in an exactly-sized heap copy so ASan sees any over-read. */
static void check_parser(int stage, bool auth, const uint8_t *b, size_t n)
{
	int verdict = SOCKS5_NEED_MORE;

	for (size_t i = 0; i <= n; i++) {
		uint8_t *copy = malloc(i ? i : 1);
		int r;

		memcpy(copy, b, i);
		r = parse_stage(stage, auth, copy, i);
		free(copy);
		if (r > 0 && (size_t)r > i)
			abort();  /* consumed more than it was given */
		if (verdict != SOCKS5_NEED_MORE && r != verdict)
			abort();  /* a verdict changed with more bytes */
		verdict = r;
	}
}

/* Drive the sequence as the connector does: bytes arrive in chunks, one message is parsed at
 * a time, consumed bytes leave the buffer, requests are "sent". */
static void check_client(bool auth, size_t chunk, const uint8_t *b, size_t n)
{
	static const uint8_t ip[16] = { 127, 0, 0, 1 };
	struct socks5_client c;
	struct socks5_addr dst;
	uint8_t buf[MAX_INPUT], out[SOCKS5_AUTH_MAX];
	size_t have = 0, pos = 0, out_len;
	int r;

	if (socks5_addr_ip(&dst, 4, ip, 80) != 0 ||
	    socks5_client_start(&c, &dst, auth ? "user" : NULL, auth ? "pass" : NULL, out,
				sizeof(out)) <= 0)
		abort();
	while (pos < n) {
		size_t take = n - pos < chunk ? n - pos : chunk;

		memcpy(buf + have, b + pos, take);
		have += take;
		pos += take;
		while (have > 0 && c.state != SOCKS5_CL_DONE) {
			enum socks5_client_state before = c.state;

			r = socks5_client_input(&c, buf, have, out, sizeof(out), &out_len);
			if (r < 0) {
				if (c.state != SOCKS5_CL_FAILED || c.err != r ||
				    socks5_client_input(&c, buf, have, out, sizeof(out), &out_len) != r)
					abort();  /* failures are sticky */
				return;
			}
			if (r == SOCKS5_NEED_MORE) {
				if (c.state != before || out_len != 0)
					abort();
				break;
			}
			if ((size_t)r > have || out_len > sizeof(out) || c.state <= before)
				abort();  /* progress only forward, never past the input */
			have -= (size_t)r;
			memmove(buf, buf + r, have);
		}
		if (c.state == SOCKS5_CL_DONE)
			return;  /* buf[0..have) and the rest of b would be early bytes */
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int mode;
	bool auth;
	size_t chunk;

	if (size < 1 || size > MAX_INPUT)
		return 0;
	mode = data[0] & 3;
	auth = (data[0] & 4) != 0;
	chunk = (size_t)(data[0] >> 3) + 1;
	if (mode == 3)
		check_client(auth, chunk, data + 1, size - 1);
	else if (size - 1 <= 600)  /* every prefix is checked: keep it quadratic but small */
		check_parser(mode, auth, data + 1, size - 1);
	return 0;
}
