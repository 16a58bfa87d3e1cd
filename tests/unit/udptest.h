/* udptest.h — what the UDP path's tests share: turning the loop until a condition holds, a
 * datagram "from the TUN", the check of a reply packet the path handed to the TUN, and a
 * client's QUIC Initial to look at.
 * Header-only (static functions); include it after criterion, testutil.h and dispatch/udp.h.
 */
#ifndef TS_TESTS_UDPTEST_H
#define TS_TESTS_UDPTEST_H

#include <event2/event.h>
#include <netinet/in.h>
#include <string.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "dispatch/udp.h"
#include "sniff/quic_initial.h"
#include "testutil.h"

/* Run base's loop until cond holds (true) or timeout_ms passes (false). */
#define UT_PUMP_UNTIL(base, cond, timeout_ms)                                                  \
	({                                                                                     \
		int64_t end_ = ts_now_ns() + MS(timeout_ms);                                   \
		bool ok_;                                                                      \
		while (!(ok_ = (cond)) && ts_now_ns() < end_) {                                \
			event_base_loop((base), EVLOOP_NONBLOCK);                              \
			usleep(500);                                                           \
		}                                                                              \
		ok_;                                                                           \
	})

/* Run base's loop for ms, whatever happens. */
static inline void ut_pump_for(struct event_base *base, int ms)
{
	int64_t end = ts_now_ns() + MS(ms);

	while (ts_now_ns() < end) {
		event_base_loop(base, EVLOOP_NONBLOCK);
		usleep(500);
	}
}

/* Free up and prove it gave every session, fd and buffer byte back to b. */
static inline void ut_path_free_checked(struct udp_path *up, struct budget *b)
{
	struct budget_stats bs;

	udp_path_free(up);
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.udp_in_use, 0, "sessions leaked");
	cr_assert_eq(bs.fds_in_use, 0, "fds leaked");
	cr_assert_eq(bs.buffer_bytes_in_use, 0, "buffer bytes leaked");
}

/* A test's whole environment gone: the path (checked as above), its budget, its config and
 * its base. */
static inline void ut_env_free(struct udp_path *up, struct budget *b, struct ts_config *cfg,
			       struct event_base *base)
{
	ut_path_free_checked(up, b);
	budget_free(b);
	config_fini(cfg);
	event_base_free(base);
}

/* The budget's buffer bytes in use (pools, slabs and budget_malloc). */
static inline uint64_t ut_buffer_bytes(struct budget *b)
{
	struct budget_stats bs;

	budget_get_stats(b, &bs);
	return bs.buffer_bytes_in_use;
}

static inline struct udp_path_stats ut_stats(const struct udp_path *up)
{
	struct udp_path_stats st;

	udp_path_stats(up, &st);
	return st;
}

/* Every datagram up dropped so far, whatever the reason. */
static inline uint64_t ut_drops_total(const struct udp_path *up)
{
	struct udp_path_stats st = ut_stats(up);
	uint64_t sum = 0;

	for (int i = 0; i < UDP_DROP_MAX; i++)
		sum += st.drops[i];
	return sum;
}

/* A datagram src:sport -> dst:dport "from the TUN" into up, within a batch the caller ends
 * (udp_path_batch_end). */
static inline void ut_tun_input(struct udp_path *up, const char *src, uint16_t sport,
				const char *dst, uint16_t dport, const void *payload, size_t len)
{
	struct tu_spec s;
	uint8_t pkt[2048];
	size_t n;

	tu_spec_udp(&s, src, sport, dst, dport);
	s.payload = payload;
	s.payload_len = len;
	n = tu_build(&s, pkt, sizeof(pkt));
	udp_path_input(up, pkt, n, ts_now_ns());
}

/* The same datagram as a batch of its own (the driver's batch end after it). */
static inline void ut_tun_send(struct udp_path *up, const char *src, uint16_t sport,
			       const char *dst, uint16_t dport, const void *payload, size_t len)
{
	ut_tun_input(up, src, sport, dst, dport, payload, len);
	udp_path_batch_end(up);
}

/* The reply packet buf (len bytes) is src:sport -> dst:dport carrying payload, with valid
 * checksums. */
static inline void ut_check_reply(const uint8_t *buf, size_t len, const char *src, uint16_t sport,
				  const char *dst, uint16_t dport, const void *payload,
				  size_t plen)
{
	struct tu_layout lo;
	uint8_t a[16];
	int family;

	cr_assert(tu_layout(buf, len, &lo), "reply does not parse");
	cr_assert_eq(lo.proto, IPPROTO_UDP);
	cr_assert_eq(lo.len, len);
	family = tu_addr(a, src);
	cr_assert_eq(lo.family, family);
	if (family == 4)
		cr_assert(tu_verify_ip4_header(buf), "IPv4 header checksum");
	cr_assert(tu_verify_l4(buf, len), "UDP checksum");
	cr_assert_neq(tu_l4_field(buf, len), 0, "checksum present");
	cr_assert_arr_eq(buf + (family == 4 ? 12 : 8), a, family == 4 ? 4 : 16,
			 "reply source is not %s", src);
	tu_addr(a, dst);
	cr_assert_arr_eq(buf + (family == 4 ? 16 : 24), a, family == 4 ? 4 : 16,
			 "reply destination is not %s", dst);
	cr_assert_eq(tu_get16(buf + lo.l3_len), sport);
	cr_assert_eq(tu_get16(buf + lo.l3_len + 2), dport);
	cr_assert_eq(lo.l4_len, plen + 8);
	cr_assert_arr_eq(buf + lo.l3_len + 8, payload, plen, "payload differs");
}

/* A protected client Initial (RFC 9001 §5) whose payload is one CRYPTO frame (data at offset
 * off) padded to 1100 bytes of frames, into out; its length. */
static inline size_t ut_quic_initial(uint8_t *out, size_t cap, uint32_t pn, uint64_t off,
				     const uint8_t *data, size_t len)
{
	static const uint8_t dcid[8] = { 0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08 };
	uint8_t frames[1100];
	size_t i = 0, out_len = 0;

	memset(frames, 0, sizeof(frames)); /* PADDING */
	frames[i++] = 0x06;
	frames[i++] = (uint8_t)(0x40 | (off >> 8)), frames[i++] = (uint8_t)off;
	frames[i++] = (uint8_t)(0x40 | (len >> 8)), frames[i++] = (uint8_t)len;
	cr_assert_leq(i + len, sizeof(frames));
	memcpy(frames + i, data, len);
	cr_assert_eq(quic_initial_seal(QUIC_V1, dcid, sizeof(dcid), NULL, 0, pn, frames,
				       sizeof(frames), out, cap, &out_len), 0);
	return out_len;
}

#endif
