/* fuzz_process.c — libFuzzer target for the system stack's packet processor.
 *
 * The input is a sequence of records driving a fresh NAT table + processor:
 *   [op:1][flags:1][len:2 big-endian][len bytes]
 * op % 6: 0 process the bytes as a packet read from the TUN (flags&1: mark NEEDS_CSUM with
 *   plausible offsets); 1 the same after forcing the downlink shape (gateway:listener ->
 *   NAT address:port from the record) so reverse lookups and recovery run; 2 advance the
 *   virtual clock by len ms and purge; 3 accept the tuple named by the first bytes; 4 mark that
 *   tuple closing with the generation of the last accept; 5 collect, then process, then remove.
 * Invariants checked: a write never exceeds the packet's length or, for an answer the stack
 * builds in its place, REWRITE_ANSWER_ROOM; a rewritten packet still parses; a RST or ICMP
 * error we built has a valid IPv4 header checksum and a valid ICMP checksum; a UDP verdict's view gives the UDP codec the
 * same answer as parsing the bytes again, and the counters account for every packet.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "core/csum.h"
#include "core/pkt.h"
#include "core/udp_codec.h"
#include "stacks/common/rewrite.h"
#include "stacks/system/nat.h"
#include "stacks/system/sysproc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t buf[65536 + 64];

static void check(int cond)
{
	if (!cond)
		abort();
}

static void make_downlink(uint8_t *b, size_t len, const uint8_t *rec)
{
	struct pkt_view v;
	if (pkt_parse(&v, b, len) != PKT_OK || v.proto != 6)
		return;
	/* gateway 198.18.0.1 / fd00:7f::1, NAT address gateway+1+(rec[0]&3), listener rec[1]&1. */
	uint8_t *s = pkt_src(&v), *d = pkt_dst(&v);
	if (v.family == 4) {
		const uint8_t gw[4] = { 198, 18, 0, 1 };
		memcpy(s, gw, 4);
		memcpy(d, gw, 4);
		d[3] = (uint8_t)(2 + (rec[0] & 3));
	} else {
		uint8_t gw[16] = { 0xfd, 0, 0, 0x7f };
		gw[15] = 1;
		memcpy(s, gw, 16);
		memcpy(d, gw, 16);
		d[15] = (uint8_t)(2 + (rec[0] & 3));
	}
	uint16_t lp = htons((uint16_t)(40000 + (rec[1] & 1)));
	memcpy(v.l4, &lp, 2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct nat_config nc;
	struct sysproc_config pc;
	struct nat_table *nat = NULL;
	struct sysproc *proc = NULL;
	struct sys_counters ctr;
	int64_t now = 1000000000LL;
	uint64_t last_gen = 0;
	uint64_t packets = 0;

	nat_config_default(&nc);
	nc.max_entries = 64;
	nc.port_min = 1024;
	nc.port_max = 1024 + 63; /* small space: exhaustion and quarantine get exercised */
	nc.seed = 1;
	if (nat_table_new(&nc, &nat) != 0)
		abort();
	memset(&pc, 0, sizeof(pc));
	pc.n_addrs = nc.n_addrs;
	pc.n_listeners = nc.n_listeners;
	pc.dns_hijack = size & 1;
	pc.v4.enabled = pc.v6.enabled = true;
	const uint8_t gw4[4] = { 198, 18, 0, 1 };
	memcpy(pc.v4.gateway, gw4, 4);
	pc.v6.gateway[0] = 0xfd;
	pc.v6.gateway[3] = 0x7f;
	pc.v6.gateway[15] = 1;
	for (uint32_t i = 0; i < nc.n_listeners; i++)
		pc.v4.listener_ports_be[i] = pc.v6.listener_ports_be[i] = htons((uint16_t)(40000 + i));
	if (sysproc_new(&pc, nat, &proc) != 0)
		abort();
	memset(&ctr, 0, sizeof(ctr));

	while (size >= 4) {
		uint8_t op = data[0] % 6, flags = data[1];
		size_t len = (size_t)data[2] << 8 | data[3];
		data += 4;
		size -= 4;
		if (len > size)
			len = size;
		const uint8_t *rec = data;
		data += len;
		size -= len;

		struct nat_tuple t = { .family = (flags & 2) ? 6 : 4 };
		if (len >= 4) {
			t.addr = rec[0] % nc.n_addrs;
			t.listener = rec[1] % nc.n_listeners;
			t.port = (uint16_t)(1024 + (rec[2] << 8 | rec[3]) % 64);
		}
		struct flow_key k;
		struct nat_candidate cands[8];
		size_t nc_found = 0;
		switch (op) {
		case 2:
			now += (int64_t)len * 1000000LL;
			nat_purge(nat, now, 64);
			continue;
		case 3:
			nat_accept(nat, &t, now, &k, &last_gen);
			continue;
		case 4:
			nat_mark_closing(nat, &t, last_gen, now);
			continue;
		case 5:
			nc_found = nat_collect_expired(nat, now + 40000000000LL, cands, 8);
			break;
		default:
			break;
		}
		memcpy(buf, rec, len);
		if (op == 1 && len >= 4)
			make_downlink(buf, len, rec);
		struct pkt_meta m = { 0 };
		struct pkt_view v;
		if ((flags & 1) && pkt_parse(&v, buf, len) == PKT_OK) {
			m.flags = PKT_META_NEEDS_CSUM;
			m.csum_start = v.l3_len;
			m.csum_offset = v.proto == 6 ? 16 : 6;
		}
		struct pkt_view uv;
		struct sys_disp d = sysproc_process(proc, buf, len, &m, now, &ctr, &uv);
		packets++;
		if (d.action == SYS_UDP) {
			struct udp_view a, b;
			enum udp_codec_reason ra = udp_codec_from_view(&a, &uv);
			check(uv.ip == buf && uv.len <= len);
			check(udp_codec_parse(&b, buf, len) == ra);
			check(ra != UDP_CODEC_OK ||
			      (a.payload == b.payload && a.payload_len == b.payload_len &&
			       a.sport_be == b.sport_be && memcmp(a.src, b.src, 16) == 0));
		}
		if (d.action == SYS_WRITE) {
			/* An answer built in place may be longer than what it answers, within
			 * the room every driver buffer has. */
			check(d.len <= (len > REWRITE_ANSWER_ROOM ? len : REWRITE_ANSWER_ROOM));
			check(pkt_parse(&v, buf, d.len) == PKT_OK);
			/* A RST is built from scratch: its IPv4 header checksum must verify (an
			 * echo reply is updated incrementally and keeps whatever the input had). */
			if (d.plain && v.family == 4 && v.proto == 6)
				check(csum_fold(csum_partial(buf, v.l3_len, 0)) == 0xffff);
			/* An ICMP error we built (not an echo reply): both checksums verify from
			 * scratch. */
			if (d.plain && v.family == 4 && v.proto == 1 && v.l4[0] == 3) {
				check(csum_fold(csum_partial(buf, v.l3_len, 0)) == 0xffff);
				check(csum_fold(csum_partial(v.l4, d.len - v.l3_len, 0)) == 0xffff);
			}
			if (d.plain && v.family == 6 && v.proto == 58 && v.l4[0] == 1)
				check(csum_fold(csum_partial(v.l4, d.len - v.l3_len,
							     csum_pseudo6(buf + 8, buf + 24, 58,
									  (uint32_t)(d.len -
										     v.l3_len)))) ==
				      0xffff);
		}
		for (size_t i = 0; i < nc_found; i++)
			nat_remove_if_expired(nat, &cands[i], now + 40000000000LL);
	}
	check(ctr_get(&ctr.rx_packets) == packets);
	sysproc_free(proc);
	nat_table_free(nat);
	return 0;
}
