/* lwip_isn.h — TCP initial sequence numbers for the lwIP stack, as RFC 6528 ("Defending against
 * Sequence Number Attacks") specifies: ISN = M + F(localip, localport, remoteip, remoteport,
 * secretkey), M a timer ticking every 4 microseconds, F SipHash-2-4 under a 128-bit key drawn
 * from the kernel's random source when the stack starts. An off-path attacker who knows the
 * 4-tuple cannot guess the ISN without the key; one tuple's successive ISNs still increase with
 * time (M), so a new incarnation of a connection starts beyond the old one's sequence space.
 * Sans-IO but for lwip_isn_init (getrandom): the caller passes the clock. */
#ifndef TS_STACKS_LWIP_ISN_H
#define TS_STACKS_LWIP_ISN_H

#include <stddef.h>
#include <stdint.h>

struct lwip_isn {
	uint64_t k0, k1; /* the secret key */
};

/* Draw a fresh key. Returns 0, or -errno when the kernel's random source fails (it blocks only
 * before the kernel has gathered its first entropy, early in boot). */
int lwip_isn_init(struct lwip_isn *isn) __attribute__((warn_unused_result));

/* The ISN for a connection between local and remote (family 4: 4-byte addresses, 6: 16-byte),
 * ports in host order, at now_ns (monotonic). */
uint32_t lwip_isn_get(const struct lwip_isn *isn, int family, const uint8_t *local,
		      uint16_t lport, const uint8_t *remote, uint16_t rport, int64_t now_ns);

/* How long ago iss was handed out to this tuple, at now_ns: the ISN the tuple would get now
 * less iss is the timer's advance since (RFC 6528: F is the same for the same tuple and key).
 * Exact to 4 microseconds for ages under 2^32 ticks (about 4.8 hours); what a wrapped timer
 * says beyond that is meaningless. */
int64_t lwip_isn_age_ns(const struct lwip_isn *isn, int family, const uint8_t *local,
			uint16_t lport, const uint8_t *remote, uint16_t rport, uint32_t iss,
			int64_t now_ns);

/* A keyed hash of len bytes (SipHash-2-4, "SipHash: a fast short-input PRF", Aumasson and
 * Bernstein, https://www.aumasson.jp/siphash/siphash.pdf). Exposed for its test vectors. */
uint64_t lwip_siphash24(uint64_t k0, uint64_t k1, const uint8_t *m, size_t len);

/* 32 bits from the kernel's random source (lwIP's LWIP_RAND). */
uint32_t lwip_isn_rand32(void);

#endif
