/* reflect.c — `twinstack reflect`: an address-swapping TUN reflector, the rig's "reflector"
 * baseline: the ceiling of one TCP connection through a TUN.
 *
 * Every packet read from the TUN is written back with its source and destination addresses
 * swapped; ports are untouched. No checksum changes: the IPv4 header checksum and the TCP/UDP
 * pseudo-header sums are one's complement sums, which do not depend on the order of the words,
 * so swapping two address fields leaves every checksum valid — including the partial
 * pseudo-header sum a NEEDS_CSUM packet carries in its L4 checksum field under offload.
 *
 * With offload (tun.offload "on", or "auto" where the kernel accepts it) every read starts with
 * a struct virtio_net_hdr (TUN_VNET_HDR_LEN bytes) and the packet after it may be a TCP/UDP GSO
 * super-packet of up to 64 KiB. The header describes offsets inside the packet (csum_start,
 * hdr_len, gso_size), which the swap does not move, so it is written back unchanged with the
 * swapped packet and the kernel segments and checksums on the way in, as it would for a NIC.
 *
 *   client  198.18.0.1:c -> 198.18.1.1:5201  --TUN--> reflect
 *   reflect 198.18.1.1:c -> 198.18.0.1:5201  --TUN--> kernel -> iperf3 -s on 198.18.0.1:5201
 * and the reply comes back the same way: each payload crosses the TUN once per direction.
 *
 * The TUN is opened exactly as `run` opens it (tun_open_config: name, MTU, addresses, offload),
 * except that the reflector reads one queue.
 */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/virtio_net.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "runtime/rps_auto.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/log.h"
#include "core/tun.h"

#define REFLECT_BATCH 64 /* reads per wakeup, then back to the loop */
/* The largest packet a read can hold: an IPv6 packet with a 65535-byte payload (a GSO
 * super-packet's limit under offload, the config's MTU limit without), after the vnet header.
 * Jumbograms (BIG TCP beyond 64 KiB) are dropped: the device's default GSO limit is 64 KiB. */
#define REFLECT_PKT_MAX (40u + 65535u)
#define REFLECT_BUF (TUN_VNET_HDR_LEN + REFLECT_PKT_MAX)

_Static_assert(sizeof(struct virtio_net_hdr) == TUN_VNET_HDR_LEN, "vnet header size");

struct reflect_counters {
	uint64_t packets, bytes;   /* reflected (written back); bytes of IP, without vnet headers */
	uint64_t gso;              /* of those, GSO super-packets (vnet header gso_type != NONE) */
	uint64_t csum_partial;     /* of those, NEEDS_CSUM (the kernel completes the L4 sum) */
	uint64_t drop_parse;       /* not IPv4/IPv6, lengths that do not add up, no vnet header */
	uint64_t drop_mcast;       /* multicast/broadcast/unspecified: no sense swapping */
	uint64_t drop_write;       /* the TUN refused the write (EAGAIN, ENOBUFS, ...) */
};

struct reflector {
	struct ts_config cfg;
	struct log log;
	struct event_base *base;
	struct tun *tun;
	struct event *ev_read, *sig_int, *sig_term;
	uint8_t *buf;      /* REFLECT_BUF bytes: [vnet header] IP packet */
	size_t hdr_len;    /* TUN_VNET_HDR_LEN with offload, else 0 */
	struct reflect_counters c;
	struct rps_auto rps;    /* tun.rps "auto", as in `run` */
	int exit_code;
};

void usage_reflect(FILE *out)
{
	fputs("usage: twinstack reflect --config FILE [--ready-fd N]\n"
	      "\n"
	      "Create the TUN device from FILE's \"tun\" section exactly as 'run' does (offload\n"
	      "included: \"auto\", \"on\" or \"off\"; one queue), then write every packet read\n"
	      "from it back with source and destination addresses swapped (ports, checksums and\n"
	      "the offload header untouched, GSO super-packets whole), IPv4 and IPv6; anything\n"
	      "else is dropped and counted. A client sending from the TUN address to a mirror\n"
	      "address inside the TUN prefix reaches a server on the TUN address: the ceiling of\n"
	      "one connection through a TUN (docs/benchmarks.md \"Reflector\"). Counters are\n"
	      "printed on exit.\n"
	      "Needs CAP_NET_ADMIN. Exit 0 after SIGINT/SIGTERM, 1 on a runtime failure, 2 on bad\n"
	      "usage or a bad config.\n"
	      "\n"
	      "options:\n"
	      "  -c, --config FILE   the config file (required)\n"
	      "      --ready-fd N    write one byte to fd N once the TUN is up\n"
	      "  -h, --help          this text\n",
	      out);
}

/* ---- the packet transform (pure) --------------------------------------------------------- */

static void swap_bytes(uint8_t *a, uint8_t *b, size_t n)
{
	uint8_t t[16];

	memcpy(t, a, n);
	memcpy(a, b, n);
	memcpy(b, t, n);
}

/* 224.0.0.0/4, 255.255.255.255, 0.0.0.0: not a unicast conversation. */
static bool v4_odd(const uint8_t *a)
{
	return (a[0] & 0xf0) == 0xe0 || (a[0] == 255 && a[1] == 255 && a[2] == 255 && a[3] == 255) ||
	       (a[0] | a[1] | a[2] | a[3]) == 0;
}

static bool v6_unspecified(const uint8_t *a)
{
	for (int i = 0; i < 16; i++)
		if (a[i])
			return false;
	return true;
}

/* Swap the addresses of the packet in buf[0..len). Returns the length to write back (the IP
 * total length: any trailing bytes are cut), -EINVAL for an unparsable packet, -EPERM for a
 * multicast/broadcast/unspecified address. A GSO super-packet's IP length covers the whole
 * super-packet (the kernel fixes each segment's up), so it is checked the same way. */
static long reflect_swap(uint8_t *buf, size_t len)
{
	size_t ihl, tot;

	if (len < 1)
		return -EINVAL;
	switch (buf[0] >> 4) {
	case 4:
		if (len < 20)
			return -EINVAL; /* shorter than the fixed header */
		ihl = (size_t)(buf[0] & 0x0f) * 4;
		tot = (size_t)buf[2] << 8 | buf[3];
		if (ihl < 20 || tot < ihl || tot > len)
			return -EINVAL; /* header or total length inconsistent with the read */
		if (v4_odd(buf + 12) || v4_odd(buf + 16))
			return -EPERM;
		swap_bytes(buf + 12, buf + 16, 4);
		return (long)tot;
	case 6:
		if (len < 40)
			return -EINVAL; /* shorter than the fixed header */
		tot = 40 + ((size_t)buf[4] << 8 | buf[5]);
		if (tot > len)
			return -EINVAL; /* payload length beyond the read */
		if (tot == 40 && len > 40)
			return -EINVAL; /* payload length 0 with a payload: a jumbogram (BIG TCP) */
		if (buf[8] == 0xff || buf[24] == 0xff || v6_unspecified(buf + 8))
			return -EPERM;
		swap_bytes(buf + 8, buf + 24, 16);
		return (long)tot;
	default:
		return -EINVAL;
	}
}

/* ---- the loop ----------------------------------------------------------------------------- */

/* One read of n bytes in r->buf: [vnet header] packet. The header goes back as it came: its
 * offsets are relative to the packet, and the swap moves nothing. */
static void reflect_one(struct reflector *r, int fd, size_t n)
{
	const struct virtio_net_hdr *vh = (const struct virtio_net_hdr *)r->buf;
	long out;
	ssize_t w;

	if (n < r->hdr_len) {
		r->c.drop_parse++; /* shorter than the vnet header */
		return;
	}
	out = reflect_swap(r->buf + r->hdr_len, n - r->hdr_len);
	if (out < 0) {
		if (out == -EPERM)
			r->c.drop_mcast++;
		else
			r->c.drop_parse++;
		return;
	}
	do
		w = write(fd, r->buf, r->hdr_len + (size_t)out);
	while (w < 0 && errno == EINTR);
	if (w < 0 || (size_t)w != r->hdr_len + (size_t)out) {
		r->c.drop_write++;
		return;
	}
	r->c.packets++;
	r->c.bytes += (uint64_t)out;
	if (r->hdr_len && vh->gso_type != VIRTIO_NET_HDR_GSO_NONE)
		r->c.gso++;
	if (r->hdr_len && (vh->flags & VIRTIO_NET_HDR_F_NEEDS_CSUM))
		r->c.csum_partial++;
}

/* Up to REFLECT_BATCH reads per wakeup; the level-triggered event brings us back for more. */
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct reflector *r = arg;
	(void)what;

	if (rps_auto_active(&r->rps))
		rps_auto_tick(&r->rps, ts_now_ns(), r->c.bytes);
	for (int i = 0; i < REFLECT_BATCH; i++) {
		ssize_t n = read(fd, r->buf, REFLECT_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			log_error(&r->log, "reflect: read from the TUN: %s",
				  n < 0 ? strerror(errno) : "end of file");
			r->exit_code = EXIT_RUNTIME;
			event_base_loopbreak(r->base);
			return;
		}
		reflect_one(r, fd, (size_t)n);
	}
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct reflector *r = arg;
	(void)what;
	log_info(&r->log, "reflect: signal %d: stopping", (int)sig);
	event_base_loopbreak(r->base);
}

/* The TUN as `run` opens it, offload included ("on" fails with the kernel's reason, "auto"
 * falls back to per-packet with a note), but always one queue: the reflector is one loop on one
 * fd. Say so when the config asks for more, so a multi-queue measurement is never silently a
 * single-queue one. */
static int open_tun(struct reflector *r, char *err, size_t errlen)
{
	char msg[512];
	int ret;

	if (r->cfg.tun.queues > 1) {
		log_warn(&r->log, "reflect: tun.queues %u: the reflector reads one queue",
			 r->cfg.tun.queues);
	}
	r->cfg.tun.queues = 1; /* also for "auto" */
	if ((ret = tun_open_config(&r->cfg.tun, &r->tun, msg, sizeof(msg), err, errlen)) != 0)
		return ret;
	if (msg[0])
		log_warn(&r->log, "reflect: %s", msg);
	r->hdr_len = tun_vnet_hdr(r->tun) ? TUN_VNET_HDR_LEN : 0;
	if (tun_rp_filter_check(tun_name(r->tun), msg, sizeof(msg)) > 0)
		log_warn(&r->log, "reflect: %s", msg);
	return rps_auto_start(&r->rps, r->tun, &r->log, "reflect", r->c.bytes, err, errlen);
}

/* Everything after the config: 0, or -errno with err filled. */
static int reflector_start(struct reflector *r, char *err, size_t errlen)
{
	int ret;

	signal(SIGPIPE, SIG_IGN);
	if (!(r->buf = malloc(REFLECT_BUF)) || !(r->base = event_base_new())) {
		snprintf(err, errlen, "reflect: out of memory");
		return -ENOMEM;
	}
	r->sig_int = evsignal_new(r->base, SIGINT, on_signal, r);
	r->sig_term = evsignal_new(r->base, SIGTERM, on_signal, r);
	if (!r->sig_int || !r->sig_term || evsignal_add(r->sig_int, NULL) != 0 ||
	    evsignal_add(r->sig_term, NULL) != 0) {
		snprintf(err, errlen, "reflect: event loop: out of memory");
		return -ENOMEM;
	}
	if ((ret = open_tun(r, err, errlen)) != 0)
		return ret;
	r->ev_read = event_new(r->base, tun_fd(r->tun, 0), EV_READ | EV_PERSIST, on_readable, r);
	if (!r->ev_read || event_add(r->ev_read, NULL) != 0) {
		snprintf(err, errlen, "reflect: event loop: cannot watch the TUN");
		return -ENOMEM;
	}
	return 0;
}

static void reflector_free(struct reflector *r)
{
	if (r->ev_read)
		event_free(r->ev_read);
	rps_auto_stop(&r->rps);
	tun_close(r->tun);
	if (r->sig_int)
		event_free(r->sig_int);
	if (r->sig_term)
		event_free(r->sig_term);
	if (r->base)
		event_base_free(r->base);
	free(r->buf);
	config_fini(&r->cfg);
	memset(r, 0, sizeof(*r));
}

static void print_counters(const struct reflector *r)
{
	printf("reflect: packets=%" PRIu64 " bytes=%" PRIu64 " drops_parse=%" PRIu64
	       " drops_mcast=%" PRIu64 " drops_write=%" PRIu64 " gso=%" PRIu64
	       " csum_partial=%" PRIu64 " io=%s rps_switches=%" PRIu64 "\n",
	       r->c.packets, r->c.bytes, r->c.drop_parse, r->c.drop_mcast, r->c.drop_write,
	       r->c.gso, r->c.csum_partial, r->hdr_len ? "offload" : "per-packet",
	       rps_auto_switches(&r->rps));
}

static int parse_fd(const char *v, int *out)
{
	char *end;
	long fd = strtol(v, &end, 10);

	if (!*v || *end || fd < 0 || fd > 65535 || fcntl((int)fd, F_GETFD) < 0) {
		fprintf(stderr, "twinstack reflect: --ready-fd '%s' is not an open fd\n", v);
		return -EBADF;
	}
	*out = (int)fd;
	return 0;
}

/* 0 parsed, 1 --help shown, -1 bad usage (message printed). */
static int parse_args(int argc, char **argv, const char **path, int *ready_fd)
{
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		int r;
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_reflect(stdout);
			return 1;
		}
		if ((r = cli_take_option(argc, argv, &i, "--config", "-c", path)) == 0 &&
		    (r = cli_take_option(argc, argv, &i, "--ready-fd", "--ready-fd", &v)) > 0) {
			if (parse_fd(v, ready_fd) != 0)
				return -1;
			continue;
		}
		if (r < 0) {
			fprintf(stderr, "twinstack reflect: %s needs a value\n", argv[i]);
			return -1;
		}
		if (r == 0) {
			fprintf(stderr, "twinstack reflect: unexpected argument '%s'\n", argv[i]);
			usage_reflect(stderr);
			return -1;
		}
	}
	if (!*path) {
		fprintf(stderr, "twinstack reflect: --config FILE is required\n");
		usage_reflect(stderr);
		return -1;
	}
	return 0;
}

static void signal_ready(int ready_fd)
{
	ssize_t n;

	do
		n = write(ready_fd, "R", 1);
	while (n < 0 && errno == EINTR);
	close(ready_fd);
}

int cmd_reflect(int argc, char **argv)
{
	struct reflector r;
	const char *path = NULL;
	char err[TS_ERRLEN];
	int ready_fd = -1, ret;

	if ((ret = parse_args(argc, argv, &path, &ready_fd)) != 0)
		return ret > 0 ? EXIT_OK : EXIT_USAGE;
	memset(&r, 0, sizeof(r));
	config_init(&r.cfg);
	log_init(&r.log, LOG_LEVEL_INFO, STDERR_FILENO);
	if ((ret = config_load_file(path, &r.cfg, err, sizeof(err))) != 0) {
		fprintf(stderr, "%s\n", err);
		ret = ret == -ENOMEM ? EXIT_RUNTIME : EXIT_USAGE;
		goto fail;
	}
	r.log.level = r.cfg.log_level;
	if ((ret = reflector_start(&r, err, sizeof(err))) != 0) {
		log_error(&r.log, "%s", err);
		ret = EXIT_RUNTIME;
		goto fail;
	}
	if (r.hdr_len)
		log_info(&r.log, "reflect: ready on %s (offload I/O, TUN_F 0x%x)", tun_name(r.tun),
			 tun_offload(r.tun));
	else
		log_info(&r.log, "reflect: ready on %s (per-packet I/O)", tun_name(r.tun));
	if (ready_fd >= 0)
		signal_ready(ready_fd);
	event_base_dispatch(r.base);
	ret = r.exit_code;
	print_counters(&r);
	reflector_free(&r);
	return ret;
fail:
	if (ready_fd >= 0)
		close(ready_fd);
	reflector_free(&r);
	return ret;
}
