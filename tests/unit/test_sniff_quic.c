/* test_sniff_quic.c — sniff/quic_initial.c: the Initial keys and packets of RFC 9001 Appendix A
 * (v1) and RFC 9369 Appendix A (v2), and sealed Initials built here: a ClientHello split over
 * packets and datagrams, CRYPTO frames out of order, coalesced packets, refusals (another
 * version, a forged first packet, CONNECTION_CLOSE, too many datagrams), a forged later packet
 * ignored, and a Retry's new DCID.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sniff/quic_initial.h"
#include "sniff/sniff.h"

/* RFC 9001 Appendix A.2: the client's first Initial, protected (SNI "example.com"). */
static const char rfc9001_a2[] =
	"c000000001088394c8f03e5157080000449e7b9aec34d1b1c98dd7689fb8ec11"
	"d242b123dc9bd8bab936b47d92ec356c0bab7df5976d27cd449f63300099f399"
	"1c260ec4c60d17b31f8429157bb35a1282a643a8d2262cad67500cadb8e7378c"
	"8eb7539ec4d4905fed1bee1fc8aafba17c750e2c7ace01e6005f80fcb7df6212"
	"30c83711b39343fa028cea7f7fb5ff89eac2308249a02252155e2347b63d58c5"
	"457afd84d05dfffdb20392844ae812154682e9cf012f9021a6f0be17ddd0c208"
	"4dce25ff9b06cde535d0f920a2db1bf362c23e596d11a4f5a6cf3948838a3aec"
	"4e15daf8500a6ef69ec4e3feb6b1d98e610ac8b7ec3faf6ad760b7bad1db4ba3"
	"485e8a94dc250ae3fdb41ed15fb6a8e5eba0fc3dd60bc8e30c5c4287e53805db"
	"059ae0648db2f64264ed5e39be2e20d82df566da8dd5998ccabdae053060ae6c"
	"7b4378e846d29f37ed7b4ea9ec5d82e7961b7f25a9323851f681d582363aa5f8"
	"9937f5a67258bf63ad6f1a0b1d96dbd4faddfcefc5266ba6611722395c906556"
	"be52afe3f565636ad1b17d508b73d8743eeb524be22b3dcbc2c7468d54119c74"
	"68449a13d8e3b95811a198f3491de3e7fe942b330407abf82a4ed7c1b311663a"
	"c69890f4157015853d91e923037c227a33cdd5ec281ca3f79c44546b9d90ca00"
	"f064c99e3dd97911d39fe9c5d0b23a229a234cb36186c4819e8b9c5927726632"
	"291d6a418211cc2962e20fe47feb3edf330f2c603a9d48c0fcb5699dbfe58964"
	"25c5bac4aee82e57a85aaf4e2513e4f05796b07ba2ee47d80506f8d2c25e50fd"
	"14de71e6c418559302f939b0e1abd576f279c4b2e0feb85c1f28ff18f58891ff"
	"ef132eef2fa09346aee33c28eb130ff28f5b766953334113211996d20011a198"
	"e3fc433f9f2541010ae17c1bf202580f6047472fb36857fe843b19f5984009dd"
	"c324044e847a4f4a0ab34f719595de37252d6235365e9b84392b061085349d73"
	"203a4a13e96f5432ec0fd4a1ee65accdd5e3904df54c1da510b0ff20dcc0c77f"
	"cb2c0e0eb605cb0504db87632cf3d8b4dae6e705769d1de354270123cb11450e"
	"fc60ac47683d7b8d0f811365565fd98c4c8eb936bcab8d069fc33bd801b03ade"
	"a2e1fbc5aa463d08ca19896d2bf59a071b851e6c239052172f296bfb5e724047"
	"90a2181014f3b94a4e97d117b438130368cc39dbb2d198065ae3986547926cd2"
	"162f40a29f0c3c8745c0f50fba3852e566d44575c29d39a03f0cda721984b6f4"
	"40591f355e12d439ff150aab7613499dbd49adabc8676eef023b15b65bfc5ca0"
	"6948109f23f350db82123535eb8a7433bdabcb909271a6ecbcb58b936a88cd4e"
	"8f2e6ff5800175f113253d8fa9ca8885c2f552e657dc603f252e1a8e308f76f0"
	"be79e2fb8f5d5fbbe2e30ecadd220723c8c0aea8078cdfcb3868263ff8f09400"
	"54da48781893a7e49ad5aff4af300cd804a6b6279ab3ff3afb64491c85194aab"
	"760d58a606654f9f4400e8b38591356fbf6425aca26dc85244259ff2b19c41b9"
	"f96f3ca9ec1dde434da7d2d392b905ddf3d1f9af93d1af5950bd493f5aa731b4"
	"056df31bd267b6b90a079831aaf579be0a39013137aac6d404f518cfd4684064"
	"7e78bfe706ca4cf5e9c5453e9f7cfd2b8b4c8d169a44e55c88d4a9a7f9474241"
	"e221af44860018ab0856972e194cd934";
/* RFC 9369 Appendix A.2: the same ClientHello in a QUIC v2 Initial. */
static const char rfc9369_a2[] =
	"d76b3343cf088394c8f03e5157080000449ea0c95e82ffe67b6abcdb4298b485"
	"dd04de806071bf03dceebfa162e75d6c96058bdbfb127cdfcbf903388e99ad04"
	"9f9a3dd4425ae4d0992cfff18ecf0fdb5a842d09747052f17ac2053d21f57c5d"
	"250f2c4f0e0202b70785b7946e992e58a59ac52dea6774d4f03b55545243cf1a"
	"12834e3f249a78d395e0d18f4d766004f1a2674802a747eaa901c3f10cda5500"
	"cb9122faa9f1df66c392079a1b40f0de1c6054196a11cbea40afb6ef5253cd68"
	"18f6625efce3b6def6ba7e4b37a40f7732e093daa7d52190935b8da58976ff33"
	"12ae50b187c1433c0f028edcc4c2838b6a9bfc226ca4b4530e7a4ccee1bfa2a3"
	"d396ae5a3fb512384b2fdd851f784a65e03f2c4fbe11a53c7777c023462239dd"
	"6f7521a3f6c7d5dd3ec9b3f233773d4b46d23cc375eb198c63301c21801f6520"
	"bcfb7966fc49b393f0061d974a2706df8c4a9449f11d7f3d2dcbb90c6b877045"
	"636e7c0c0fe4eb0f697545460c806910d2c355f1d253bc9d2452aaa549e27a1f"
	"ac7cf4ed77f322e8fa894b6a83810a34b361901751a6f5eb65a0326e07de7c12"
	"16ccce2d0193f958bb3850a833f7ae432b65bc5a53975c155aa4bcb4f7b2c4e5"
	"4df16efaf6ddea94e2c50b4cd1dfe06017e0e9d02900cffe1935e0491d77ffb4"
	"fdf85290fdd893d577b1131a610ef6a5c32b2ee0293617a37cbb08b847741c3b"
	"8017c25ca9052ca1079d8b78aebd47876d330a30f6a8c6d61dd1ab5589329de7"
	"14d19d61370f8149748c72f132f0fc99f34d766c6938597040d8f9e2bb522ff9"
	"9c63a344d6a2ae8aa8e51b7b90a4a806105fcbca31506c446151adfeceb51b91"
	"abfe43960977c87471cf9ad4074d30e10d6a7f03c63bd5d4317f68ff325ba3bd"
	"80bf4dc8b52a0ba031758022eb025cdd770b44d6d6cf0670f4e990b22347a7db"
	"848265e3e5eb72dfe8299ad7481a408322cac55786e52f633b2fb6b614eaed18"
	"d703dd84045a274ae8bfa73379661388d6991fe39b0d93debb41700b41f90a15"
	"c4d526250235ddcd6776fc77bc97e7a417ebcb31600d01e57f32162a8560cacc"
	"7e27a096d37a1a86952ec71bd89a3e9a30a2a26162984d7740f81193e8238e61"
	"f6b5b984d4d3dfa033c1bb7e4f0037febf406d91c0dccf32acf423cfa1e70710"
	"10d3f270121b493ce85054ef58bada42310138fe081adb04e2bd901f2f13458b"
	"3d6758158197107c14ebb193230cd1157380aa79cae1374a7c1e5bbcb80ee23e"
	"06ebfde206bfb0fcbc0edc4ebec309661bdd908d532eb0c6adc38b7ca7331dce"
	"8dfce39ab71e7c32d318d136b6100671a1ae6a6600e3899f31f0eed19e3417d1"
	"34b90c9058f8632c798d4490da4987307cba922d61c39805d072b589bd52fdf1"
	"e86215c2d54e6670e07383a27bbffb5addf47d66aa85a0c6f9f32e59d85a44dd"
	"5d3b22dc2be80919b490437ae4f36a0ae55edf1d0b5cb4e9a3ecabee93dfc6e3"
	"8d209d0fa6536d27a5d6fbb17641cde27525d61093f1b28072d111b2b4ae5f89"
	"d5974ee12e5cf7d5da4d6a31123041f33e61407e76cffcdcfd7e19ba58cf4b53"
	"6f4c4938ae79324dc402894b44faf8afbab35282ab659d13c93f70412e85cb19"
	"9a37ddec600545473cfb5a05e08d0b209973b2172b4d21fb69745a262ccde96b"
	"a18b2faa745b6fe189cf772a9f84cbfc";
static const uint8_t rfc_dcid[8] = { 0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08 };

static size_t unhex(const char *h, uint8_t *out, size_t cap)
{
	size_t n = strlen(h) / 2;

	cr_assert_leq(n, cap);
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		cr_assert_eq(sscanf(h + 2 * i, "%2x", &v), 1);
		out[i] = (uint8_t)v;
	}
	return n;
}

static void assert_hex(const uint8_t *b, size_t n, const char *h)
{
	uint8_t want[64];

	cr_assert_eq(unhex(h, want, sizeof(want)), n);
	cr_assert_arr_eq(b, want, n, "want %s", h);
}

/* ---- building ClientHellos and Initials (independent of the code under test but for the
 * sealing, which the RFC vectors check) ------------------------------------------------------ */

struct buf {
	uint8_t b[8192];
	size_t n;
};

static void put(struct buf *m, const void *p, size_t n)
{
	cr_assert_leq(m->n + n, sizeof(m->b));
	memcpy(m->b + m->n, p, n);
	m->n += n;
}

static void u8(struct buf *m, unsigned v) { uint8_t b = (uint8_t)v; put(m, &b, 1); }
static void u16(struct buf *m, unsigned v) { u8(m, v >> 8); u8(m, v); }
static void u24(struct buf *m, unsigned v) { u8(m, v >> 16); u16(m, v); }

static void zeros(struct buf *m, size_t n)
{
	for (size_t i = 0; i < n; i++)
		u8(m, 0);
}

static void varint(struct buf *m, uint64_t v)
{
	if (v < 64)
		u8(m, (unsigned)v);
	else if (v < 16384)
		u16(m, (unsigned)(0x4000 | v));
	else
		u16(m, (unsigned)(0x8000 | v >> 16)), u16(m, (unsigned)v);
}

/* A ClientHello handshake message with pad bytes of padding (as a large post-quantum key
 * share would be) before the server_name extension naming sni (none if NULL). */
static struct buf hello(const char *sni, size_t pad)
{
	struct buf ext = { .n = 0 }, body = { .n = 0 }, msg = { .n = 0 };

	u16(&ext, 21), u16(&ext, (unsigned)pad), zeros(&ext, pad);
	if (sni) {
		size_t l = strlen(sni);
		u16(&ext, 0), u16(&ext, (unsigned)(l + 5)), u16(&ext, (unsigned)(l + 3));
		u8(&ext, 0), u16(&ext, (unsigned)l), put(&ext, sni, l);
	}
	u16(&body, 0x0303), zeros(&body, 32), u8(&body, 0);
	u16(&body, 2), u16(&body, 0x1301), u8(&body, 1), u8(&body, 0);
	u16(&body, (unsigned)ext.n), put(&body, ext.b, ext.n);
	u8(&msg, 1), u24(&msg, (unsigned)body.n), put(&msg, body.b, body.n);
	return msg;
}

static void crypto(struct buf *f, const struct buf *msg, size_t off, size_t len)
{
	u8(f, 0x06), varint(f, off), varint(f, len), put(f, msg->b + off, len);
}

/* Seal frames f into one Initial of version v, padded (PADDING frames) to at least 1200 bytes
 * when pad is set, appended to dgram. */
static void seal_token(struct buf *dgram, uint32_t v, const uint8_t *dcid, size_t dcid_len,
		       const char *token, uint32_t pn, struct buf f, int pad)
{
	size_t tl = token ? strlen(token) : 0, hdr = 1 + 4 + 1 + dcid_len + 1 + 1 + tl + 2 + 4, n;

	if (pad && hdr + f.n + 16 < 1200)
		zeros(&f, 1200 - (hdr + f.n + 16));
	cr_assert_eq(quic_initial_seal(v, dcid, dcid_len, (const uint8_t *)token, tl, pn, f.b, f.n,
				       dgram->b + dgram->n, sizeof(dgram->b) - dgram->n, &n), 0);
	dgram->n += n;
}

static void seal(struct buf *dgram, uint32_t v, const uint8_t *dcid, size_t dcid_len,
		 uint32_t pn, struct buf f, int pad)
{
	seal_token(dgram, v, dcid, dcid_len, NULL, pn, f, pad);
}

static const uint8_t dcid_a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
static const uint8_t dcid_b[12] = { 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9 };

/* Two datagrams, each one Initial with a CRYPTO frame: the hello's first cut bytes (pn 0),
 * then the rest (pn 1). The name is in the second. */
static void two_halves(uint32_t v, const char *sni, struct buf *d0, struct buf *d1)
{
	struct buf m = hello(sni, 1500), f0 = { .n = 0 }, f1 = { .n = 0 };
	size_t cut = 1000;

	crypto(&f0, &m, 0, cut);
	crypto(&f1, &m, cut, m.n - cut);
	d0->n = d1->n = 0;
	seal(d0, v, dcid_a, sizeof(dcid_a), 0, f0, 1);
	seal(d1, v, dcid_a, sizeof(dcid_a), 1, f1, 1);
}

static enum sniff_result feed(struct sniff_quic *q, const struct buf *d, char *name)
{
	/* an exactly-sized heap copy, so that ASan sees any read past the datagram */
	uint8_t *c = calloc(1, d->n ? d->n : 1);
	enum sniff_result r;

	memcpy(c, d->b, d->n);
	r = sniff_quic_feed(q, c, d->n, name);
	free(c);
	return r;
}

static struct sniff_quic *mk(void)
{
	struct sniff_quic *q;

	cr_assert_eq(sniff_quic_new(&q), 0);
	return q;
}

/* ---- the RFC vectors ---------------------------------------------------------------------- */

Test(sniff_quic, keys_v1)
{
	struct quic_initial_keys k;

	cr_assert_eq(quic_initial_keys(QUIC_V1, rfc_dcid, sizeof(rfc_dcid), &k), 0);
	assert_hex(k.key, 16, "1f369613dd76d5467730efcbe3b1a22d");
	assert_hex(k.iv, 12, "fa044b2f42a3fd3b46fb255c");
	assert_hex(k.hp, 16, "9f50449e04a0e810283a1e9933adedd2");
}

Test(sniff_quic, keys_v2)
{
	struct quic_initial_keys k;

	cr_assert_eq(quic_initial_keys(QUIC_V2, rfc_dcid, sizeof(rfc_dcid), &k), 0);
	assert_hex(k.key, 16, "8b1a0bc121284290a29e0971b5cd045d");
	assert_hex(k.iv, 12, "91f73e2351d8fa91660e909f");
	assert_hex(k.hp, 16, "45b95e15235d6f45a6b19cbcb0294ba9");
	cr_assert_eq(quic_initial_keys(0xff00001d, rfc_dcid, sizeof(rfc_dcid), &k), -EINVAL);
}

static void rfc_packet(const char *hex)
{
	struct buf d;
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	d.n = unhex(hex, d.b, sizeof(d.b));
	cr_assert_eq(d.n, 1200);
	cr_assert(sniff_quic_is_initial(d.b, d.n));
	cr_assert_eq(feed(q, &d, name), SNIFF_FOUND);
	cr_assert_str_eq(name, "example.com");
	strcpy(name, "x");
	cr_assert_eq(feed(q, &d, name), SNIFF_FOUND, "decided: the same answer");
	cr_assert_str_eq(name, "example.com");
	sniff_quic_free(q);
}

Test(sniff_quic, rfc9001_client_initial)
{
	rfc_packet(rfc9001_a2);
}

Test(sniff_quic, rfc9369_client_initial)
{
	rfc_packet(rfc9369_a2);
}

/* RFC 9001 Appendix A.2 (and RFC 9369 Appendix A.2): the CRYPTO frame of the client's first
 * Initial, padded with 917 zeros to 1162 bytes; packet number 2. */
static const char rfc_crypto_frame[] =
	"060040f1010000ed0303ebf8fa56f12939b9584a3896472ec40bb863cfd3e868"
	"04fe3a47f06a2b69484c00000413011302010000c000000010000e00000b6578"
	"616d706c652e636f6dff01000100000a00080006001d00170018001000070005"
	"04616c706e000500050100000000003300260024001d00209370b2c9caa47fba"
	"baf4559fedba753de171fa71f50f1ce15d43e994ec74d748002b000302030400"
	"0d0010000e0403050306030203080408050806002d00020101001c0002400100"
	"3900320408ffffffffffffffff05048000ffff07048000ffff08011001048000"
	"75300901100f088394c8f03e51570806048000ffff";

static void rfc_seal(uint32_t v, const char *hex)
{
	uint8_t plain[1162] = { 0 }, want[1200], got[1300];
	size_t n;

	cr_assert_eq(unhex(rfc_crypto_frame, plain, sizeof(plain)), 245);
	cr_assert_eq(unhex(hex, want, sizeof(want)), 1200);
	cr_assert_eq(quic_initial_seal(v, rfc_dcid, sizeof(rfc_dcid), NULL, 0, 2, plain,
				       sizeof(plain), got, sizeof(got), &n), 0);
	cr_assert_eq(n, 1200);
	cr_assert_arr_eq(got, want, 1200, "sealed here, the RFC's packet byte for byte");
	cr_assert_eq(quic_initial_seal(v, rfc_dcid, sizeof(rfc_dcid), NULL, 0, 2, plain,
				       sizeof(plain), got, 1199, &n), -ENOSPC);
}

Test(sniff_quic, seal_matches_the_rfcs)
{
	rfc_seal(QUIC_V1, rfc9001_a2);
	rfc_seal(QUIC_V2, rfc9369_a2);
}

Test(sniff_quic, forged_first_packet)
{
	struct buf d;
	char name[SNIFF_NAME_MAX + 1];

	/* the tag, the ciphertext, the protected packet number, the protected first byte */
	static const size_t spots[] = { 1199, 800, 400, 30, 20, 0 };

	for (size_t i = 0; i < sizeof(spots) / sizeof(spots[0]); i++) {
		struct sniff_quic *q = mk();
		size_t at = spots[i];

		d.n = unhex(rfc9001_a2, d.b, sizeof(d.b));
		d.b[at] ^= 0x01;
		cr_assert_eq(feed(q, &d, name), SNIFF_NONE, "byte %zu flipped", at);
		sniff_quic_free(q);
	}
}

Test(sniff_quic, is_initial)
{
	struct buf d;

	d.n = unhex(rfc9001_a2, d.b, sizeof(d.b));
	cr_assert(sniff_quic_is_initial(d.b, d.n));
	cr_assert_not(sniff_quic_is_initial(d.b, 0));
	cr_assert_not(sniff_quic_is_initial(d.b, 6));
	cr_assert_not(sniff_quic_is_initial(d.b, 1199), "Length past the datagram");
	d.b[0] = 0xc0 | 0x20; /* v1 Handshake */
	cr_assert_not(sniff_quic_is_initial(d.b, d.n));
	d.b[0] = 0x80; /* no fixed bit */
	cr_assert_not(sniff_quic_is_initial(d.b, d.n));
	d.b[0] = 0x40; /* short header */
	cr_assert_not(sniff_quic_is_initial(d.b, d.n));
	d.n = unhex(rfc9001_a2, d.b, sizeof(d.b));
	d.b[5] = 21; /* DCID length over 20 */
	cr_assert_not(sniff_quic_is_initial(d.b, d.n));
	d.n = unhex(rfc9369_a2, d.b, sizeof(d.b));
	cr_assert(sniff_quic_is_initial(d.b, d.n));
	d.b[0] &= 0xcf; /* v2 type 0 is a Retry */
	cr_assert_not(sniff_quic_is_initial(d.b, d.n));
}

Test(sniff_quic, wrong_version)
{
	struct buf d;
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1];

	d.n = unhex(rfc9001_a2, d.b, sizeof(d.b));
	d.b[1] = 0xff, d.b[2] = 0x00, d.b[3] = 0x00, d.b[4] = 0x1d; /* draft 29 */
	cr_assert_not(sniff_quic_is_initial(d.b, d.n));
	cr_assert_eq(feed(q, &d, name), SNIFF_NONE);
	sniff_quic_free(q);
}

/* ---- Initials built here ------------------------------------------------------------------ */

Test(sniff_quic, hello_split_over_two_datagrams)
{
	uint32_t versions[] = { QUIC_V1, QUIC_V2 };

	for (size_t i = 0; i < 2; i++) {
		struct buf d0, d1;
		struct sniff_quic *q = mk();
		char name[SNIFF_NAME_MAX + 1] = "";

		two_halves(versions[i], "Split.Example", &d0, &d1);
		cr_assert(sniff_quic_is_initial(d0.b, d0.n));
		cr_assert_eq(feed(q, &d0, name), SNIFF_NEED_MORE);
		cr_assert_eq(feed(q, &d1, name), SNIFF_FOUND);
		cr_assert_str_eq(name, "split.example");
		sniff_quic_free(q);
	}
}

Test(sniff_quic, halves_out_of_order)
{
	struct buf d0, d1;
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	two_halves(QUIC_V1, "late.example", &d0, &d1);
	cr_assert_eq(feed(q, &d1, name), SNIFF_NEED_MORE);
	cr_assert_eq(feed(q, &d0, name), SNIFF_FOUND);
	cr_assert_str_eq(name, "late.example");
	sniff_quic_free(q);
}

Test(sniff_quic, crypto_frames_shuffled_in_one_packet)
{
	struct buf m = hello("shuffle.example", 200), f = { .n = 0 }, d = { .n = 0 };
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";
	size_t a = m.n / 3, b = 2 * m.n / 3;

	/* ACK and PING before, overlapping and repeated pieces, the start last */
	u8(&f, 0x03), varint(&f, 5), varint(&f, 0), varint(&f, 1), varint(&f, 1);
	varint(&f, 0), varint(&f, 1), varint(&f, 0), varint(&f, 0), varint(&f, 0);
	u8(&f, 0x01);
	crypto(&f, &m, b, m.n - b);
	crypto(&f, &m, a - 10, b - a + 20);
	crypto(&f, &m, b, m.n - b);
	crypto(&f, &m, 0, a);
	seal(&d, QUIC_V1, dcid_a, sizeof(dcid_a), 7, f, 1);
	cr_assert_eq(feed(q, &d, name), SNIFF_FOUND);
	cr_assert_str_eq(name, "shuffle.example");
	sniff_quic_free(q);
}

Test(sniff_quic, coalesced_in_one_datagram)
{
	struct buf d0, d1, d = { .n = 0 }, junk = { .n = 0 };
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	two_halves(QUIC_V1, "two.example", &d0, &d1);
	put(&d, d0.b, d0.n);
	/* a v1 0-RTT packet between them: skipped by its Length */
	u8(&junk, 0xd0), u16(&junk, 0), u16(&junk, 1), u8(&junk, 8), put(&junk, dcid_a, 8);
	u8(&junk, 0), varint(&junk, 40), zeros(&junk, 40);
	put(&d, junk.b, junk.n);
	put(&d, d1.b, d1.n);
	zeros(&d, 30); /* trailing zeros, as some clients pad datagrams */
	cr_assert_eq(feed(q, &d, name), SNIFF_FOUND);
	cr_assert_str_eq(name, "two.example");
	sniff_quic_free(q);
}

Test(sniff_quic, forged_later_packet_is_ignored)
{
	struct buf d0, d1, bad;
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	two_halves(QUIC_V1, "ok.example", &d0, &d1);
	bad = d1;
	bad.b[bad.n - 1] ^= 0x80; /* the tag */
	cr_assert_eq(feed(q, &d0, name), SNIFF_NEED_MORE);
	cr_assert_eq(feed(q, &bad, name), SNIFF_NEED_MORE);
	cr_assert_eq(feed(q, &d1, name), SNIFF_FOUND);
	cr_assert_str_eq(name, "ok.example");
	sniff_quic_free(q);
}

Test(sniff_quic, retry_changes_the_dcid)
{
	struct buf m = hello("retry.example", 1500), f0 = { .n = 0 }, f1 = { .n = 0 };
	struct buf d0 = { .n = 0 }, d1 = { .n = 0 };
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	/* The first half under the first DCID; after a Retry the client goes on under the
	 * server's new DCID (keys from it) with the Retry's token, and the stream keeps its
	 * bytes. */
	crypto(&f0, &m, 0, 1000);
	crypto(&f1, &m, 1000, m.n - 1000);
	seal(&d0, QUIC_V1, dcid_a, sizeof(dcid_a), 0, f0, 1);
	seal(&d1, QUIC_V1, dcid_b, sizeof(dcid_b), 1, f1, 1);
	cr_assert_eq(feed(q, &d0, name), SNIFF_NEED_MORE);
	cr_assert_eq(feed(q, &d1, name), SNIFF_NEED_MORE, "a new DCID without a token: ignored");
	d1.n = 0;
	seal_token(&d1, QUIC_V1, dcid_b, sizeof(dcid_b), "retry-token", 1, f1, 1);
	cr_assert_eq(feed(q, &d1, name), SNIFF_FOUND);
	cr_assert_str_eq(name, "retry.example");
	sniff_quic_free(q);
}

Test(sniff_quic, version_change_is_ignored)
{
	struct buf a0, a1, b0, b1;
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	two_halves(QUIC_V1, "v.example", &a0, &a1);
	two_halves(QUIC_V2, "v.example", &b0, &b1);
	cr_assert_eq(feed(q, &a0, name), SNIFF_NEED_MORE);
	cr_assert_eq(feed(q, &b1, name), SNIFF_NEED_MORE);
	cr_assert_eq(feed(q, &a1, name), SNIFF_FOUND);
	sniff_quic_free(q);
}

Test(sniff_quic, too_many_datagrams)
{
	struct buf d0, d1, ping = { .n = 0 }, f = { .n = 0 };
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	two_halves(QUIC_V1, "never.example", &d0, &d1);
	u8(&f, 0x01);
	seal(&ping, QUIC_V1, dcid_a, sizeof(dcid_a), 9, f, 1);
	cr_assert_eq(feed(q, &d0, name), SNIFF_NEED_MORE);
	for (int i = 2; i < SNIFF_QUIC_MAX_DGRAMS; i++)
		cr_assert_eq(feed(q, &ping, name), SNIFF_NEED_MORE, "datagram %d", i);
	cr_assert_eq(feed(q, &ping, name), SNIFF_NONE);
	cr_assert_eq(feed(q, &d1, name), SNIFF_NONE, "decided");
	sniff_quic_free(q);
}

Test(sniff_quic, connection_close)
{
	struct buf d0, d1, cc = { .n = 0 }, f = { .n = 0 };
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	two_halves(QUIC_V1, "closed.example", &d0, &d1);
	u8(&f, 0x1c), varint(&f, 0x0a), varint(&f, 0), varint(&f, 0);
	seal(&cc, QUIC_V1, dcid_a, sizeof(dcid_a), 2, f, 0);
	cr_assert_eq(feed(q, &d0, name), SNIFF_NEED_MORE);
	cr_assert_eq(feed(q, &cc, name), SNIFF_NONE);
	sniff_quic_free(q);
}

Test(sniff_quic, no_sni_and_bad_names)
{
	static const char *const names[] = { NULL, "10.1.2.3", "bad name.example" };

	for (size_t i = 0; i < 3; i++) {
		struct buf m = hello(names[i], 10), f = { .n = 0 }, d = { .n = 0 };
		struct sniff_quic *q = mk();
		char name[SNIFF_NAME_MAX + 1] = "";

		crypto(&f, &m, 0, m.n);
		seal(&d, QUIC_V1, dcid_a, sizeof(dcid_a), 0, f, 1);
		cr_assert_eq(feed(q, &d, name), SNIFF_NONE, "%s", names[i] ? names[i] : "no SNI");
		sniff_quic_free(q);
	}
}

Test(sniff_quic, not_a_hello_and_first_not_initial)
{
	struct buf f = { .n = 0 }, d = { .n = 0 };
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";
	static const uint8_t server_hello[] = { 2, 0, 0, 4, 3, 3, 0, 0 };
	static const uint8_t short_hdr[40] = { 0x41 };

	u8(&f, 0x06), varint(&f, 0), varint(&f, sizeof(server_hello));
	put(&f, server_hello, sizeof(server_hello));
	seal(&d, QUIC_V1, dcid_a, sizeof(dcid_a), 0, f, 1);
	cr_assert_eq(feed(q, &d, name), SNIFF_NONE);
	sniff_quic_free(q);

	q = mk();
	d.n = 0;
	put(&d, short_hdr, sizeof(short_hdr));
	cr_assert_eq(feed(q, &d, name), SNIFF_NONE);
	sniff_quic_free(q);
	sniff_quic_free(NULL);
}

Test(sniff_quic, empty_dcid)
{
	struct buf m = hello("empty.example", 10), f = { .n = 0 }, d = { .n = 0 };
	struct sniff_quic *q = mk();
	char name[SNIFF_NAME_MAX + 1] = "";

	crypto(&f, &m, 0, m.n);
	seal(&d, QUIC_V1, dcid_a, 0, 0, f, 1);
	cr_assert_eq(feed(q, &d, name), SNIFF_FOUND);
	cr_assert_str_eq(name, "empty.example");
	sniff_quic_free(q);
}
