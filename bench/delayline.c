/* delayline.c — twinstack-delayline: a link delay without netem. Every packet the kernel
 * routes into a TUN device is held for a fixed one-way delay and then written back into the
 * same TUN, where policy routing sends it on.
 *
 *   ns A ---- veth ---- ns M ---- veth ---- ns B
 *                        | main table: A's and B's subnets -> dev <tun>
 *                        | rule "iif <tun> lookup T": T holds the veth routes
 *                        +--> <tun> --read--> [delay queue] --write--> <tun>
 *
 * A packet crosses the queue once per direction, so a round trip is delayed twice the set
 * delay (bench/linkbed.sh builds the testbed and calibrates it). Both directions share one
 * first-in first-out queue: the delay is one constant, so arrival order is departure order.
 *
 * I/O: one thread, one epoll set (the TUN, a timerfd, a signalfd). Each wakeup reads up to a
 * batch of packets straight into the queue (bench/delayq.c), each stamped with
 * CLOCK_MONOTONIC right after its read, writes back everything due, and arms the timerfd
 * (absolute, the same clock) for the next due packet. The timer slack is set to 1 ns: the
 * default 50 us would be added to every wakeup of an idle line. With --rt-priority the line
 * runs under SCHED_FIFO, so a busy machine does not make packets late (set_rt).
 *
 * Offload: the TUN is opened with IFF_VNET_HDR and TUNSETOFFLOAD(CSUM | TSO4 | TSO6) as the
 * proxy opens its TUN (core/tun_linux.c), so 64 KiB TCP super-packets (GSO) pass whole. The
 * virtio header is written back unchanged: nothing in the packet moves.
 *
 * Counters go out as one JSON line on SIGTERM/SIGINT (then exit 0) and on SIGUSR1 (and the line
 * keeps running), to stdout or --stats-fd.
 */
#include <errno.h>
#include <inttypes.h>
#include <linux/virtio_net.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "bench/delayq.h"
#include "core/clock.h"
#include "core/tun.h"

/* A read holds an IPv6 packet with a 65535-byte payload (a GSO super-packet's limit: the
 * devices' default GSO size is 64 KiB) after the virtio header. */
#define DL_PKT_MAX (40u + 65535u)
#define DL_FRAME_MAX (TUN_VNET_HDR_LEN + DL_PKT_MAX)
#define DL_BATCH 64                  /* reads per wakeup before the due packets go out */
#define DL_OFFLOAD 0x07u             /* TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 */
#define DL_RATE_BPS 1250000000ULL    /* 10 Gbit/s: what the default queue must hold a delay of */
#define DL_HEADROOM (4ULL << 20)
#define DL_QUEUE_CAP (256ULL << 20)
#define DL_TXQUEUELEN 10000u         /* the kernel's 500 drops bursts before we read them */

_Static_assert(sizeof(struct virtio_net_hdr) == TUN_VNET_HDR_LEN, "vnet header size");

struct dl_opts {
	const char *dev;
	int64_t delay_ns;
	uint64_t queue_bytes;    /* 0 = from the delay */
	uint32_t queue_packets;  /* 0 = from queue_bytes */
	int64_t late_ns;
	uint32_t txqueuelen;
	bool offload;
	int stats_fd;
	uint32_t rt_priority;    /* SCHED_FIFO priority; 0 = the default policy */
};

struct dl_counters {
	uint64_t gso_packets;      /* read with a GSO type in the virtio header */
	uint64_t max_packet_bytes; /* the longest IP packet read */
	uint64_t read_errors;      /* reads failing other than EAGAIN/EINTR */
	uint64_t short_reads;      /* shorter than the virtio header: dropped */
	uint64_t write_errors;     /* the TUN refused a write: the packet is lost */
};

struct delayline {
	struct dl_opts o;
	struct tun *tun;
	int fd, tfd, sfd, ep;
	uint32_t hdr_len;
	struct delayq *q;
	int64_t armed_ns;          /* the timerfd's deadline, INT64_MAX when disarmed */
	bool rt;                   /* running under SCHED_FIFO */
	struct dl_counters c;
};

static void usage(FILE *out)
{
	fputs("usage: twinstack-delayline --dev NAME --delay-ms D [--queue-bytes B]\n"
	      "                           [--queue-packets N] [--late-ms L] [--txqueuelen N]\n"
	      "                           [--no-offload] [--rt-priority P] [--stats-fd FD]\n"
	      "\n"
	      "Create the TUN device NAME (it must not exist), then hold every packet routed into\n"
	      "it for D milliseconds (decimals allowed, 0 to 60000) and write it back into it.\n"
	      "  --queue-bytes B    the queue's byte bound (suffix K, M, G: powers of 1024);\n"
	      "                     default: 2 x 10 Gbit/s x D + 4 MiB, at most 256 MiB\n"
	      "  --queue-packets N  the queue's packet bound; default B / 256, at least 65536\n"
	      "  --late-ms L        a packet sent more than L ms after its due time counts as\n"
	      "                     late (default 1)\n"
	      "  --txqueuelen N     the TUN's transmit queue (default 10000)\n"
	      "  --no-offload       per-packet I/O: no virtio header, no GSO super-packets\n"
	      "  --rt-priority P    run under SCHED_FIFO priority P (1-99), so that busy CPUs\n"
	      "                     do not make packets late (a refusal is a warning)\n"
	      "  --stats-fd FD      write the counters there instead of stdout\n"
	      "Counters: one JSON line on SIGUSR1, and on SIGTERM/SIGINT before exiting 0.\n"
	      "Exit: 0 stopped by a signal, 1 runtime error, 2 bad arguments or no TUN.\n",
	      out);
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || s[0] == '-')
		return -EINVAL;
	if (*end == 'K' || *end == 'k')
		shift = 10, end++;
	else if (*end == 'M' || *end == 'm')
		shift = 20, end++;
	else if (*end == 'G' || *end == 'g')
		shift = 30, end++;
	if (*end != '\0' || v > (UINT64_MAX >> shift))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_ms(const char *s, double max, int64_t *out_ns)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end != '\0' || !(v >= 0.0 && v <= max))
		return -EINVAL;
	*out_ns = (int64_t)(v * 1e6 + 0.5);
	return 0;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t v;

	if (parse_size(s, &v) != 0 || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct dl_opts *o)
{
	bool have_delay = false;
	uint32_t fd;

	*o = (struct dl_opts){ .late_ns = TS_NS_PER_MS, .txqueuelen = DL_TXQUEUELEN,
			       .offload = true, .stats_fd = STDOUT_FILENO };
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;

		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			exit(0);
		} else if (strcmp(a, "--no-offload") == 0) {
			o->offload = false;
			continue;
		} else if (!v) {
			fprintf(stderr, "delayline: %s needs a value\n", a);
			return -EINVAL;
		} else if (strcmp(a, "--dev") == 0) {
			o->dev = v;
			bad = strlen(v) == 0 || strlen(v) > TUN_NAME_MAX;
		} else if (strcmp(a, "--delay-ms") == 0) {
			bad = parse_ms(v, 60000.0, &o->delay_ns) != 0;
			have_delay = true;
		} else if (strcmp(a, "--queue-bytes") == 0) {
			bad = parse_size(v, &o->queue_bytes) != 0 || o->queue_bytes < DL_FRAME_MAX ||
			      o->queue_bytes > DELAYQ_BYTES_MAX - 2ULL * DL_FRAME_MAX;
		} else if (strcmp(a, "--queue-packets") == 0) {
			bad = parse_u32(v, 1, DELAYQ_PACKETS_MAX, &o->queue_packets) != 0;
		} else if (strcmp(a, "--late-ms") == 0) {
			bad = parse_ms(v, 60000.0, &o->late_ns) != 0;
		} else if (strcmp(a, "--txqueuelen") == 0) {
			bad = parse_u32(v, 1, 1000000, &o->txqueuelen) != 0;
		} else if (strcmp(a, "--rt-priority") == 0) {
			bad = parse_u32(v, 1, 99, &o->rt_priority) != 0;
		} else if (strcmp(a, "--stats-fd") == 0) {
			bad = parse_u32(v, 0, 1 << 20, &fd) != 0;
			o->stats_fd = (int)fd;
		} else {
			fprintf(stderr, "delayline: unknown argument '%s'\n", a);
			return -EINVAL;
		}
		if (bad) {
			fprintf(stderr, "delayline: bad value for %s: '%s'\n", a, v);
			return -EINVAL;
		}
		i++;
	}
	if (!o->dev || !have_delay) {
		fprintf(stderr, "delayline: --dev and --delay-ms are required\n");
		return -EINVAL;
	}
	return 0;
}

/* The default byte bound: twice what 10 Gbit/s puts in flight during the delay (TCP's slow
 * start doubles its window every round trip, so its last round can burst twice the
 * bandwidth-delay product into the line) and room for a few dozen super-packets; capped. */
static uint64_t default_queue_bytes(int64_t delay_ns)
{
	uint64_t inflight = (uint64_t)((double)DL_RATE_BPS * (double)delay_ns / 1e9);
	uint64_t b = 2 * inflight + DL_HEADROOM;

	return b > DL_QUEUE_CAP ? DL_QUEUE_CAP : b;
}

static int open_queue(struct delayline *dl)
{
	uint64_t bytes = dl->o.queue_bytes ? dl->o.queue_bytes : default_queue_bytes(dl->o.delay_ns);
	uint32_t pkts = dl->o.queue_packets;
	struct delayq_params p;

	if (!pkts)
		pkts = bytes / 256 > 65536 ? (uint32_t)(bytes / 256) : 65536;
	p = (struct delayq_params){ .delay_ns = dl->o.delay_ns, .max_bytes = bytes,
				    .max_packets = pkts, .max_packet = DL_FRAME_MAX,
				    .late_ns = dl->o.late_ns };
	dl->o.queue_bytes = bytes;
	dl->o.queue_packets = pkts;
	return delayq_new(&p, &dl->q);
}

static int open_tun(struct delayline *dl)
{
	struct tun_params p;
	char err[256];
	int ret;

	tun_params_init(&p);
	snprintf(p.name, sizeof(p.name), "%s", dl->o.dev);
	p.txqueuelen = dl->o.txqueuelen;
	p.vnet_hdr = dl->o.offload;
	p.offload = dl->o.offload ? DL_OFFLOAD : 0;
	if ((ret = tun_open(&p, &dl->tun, err, sizeof(err))) != 0) {
		fprintf(stderr, "delayline: %s\n", err);
		return ret;
	}
	if (dl->o.offload && (tun_offload(dl->tun) & DL_OFFLOAD) != DL_OFFLOAD) {
		fprintf(stderr, "delayline: %s: the kernel took offload 0x%x, not 0x%x\n",
			tun_name(dl->tun), tun_offload(dl->tun), DL_OFFLOAD);
		return -EOPNOTSUPP;
	}
	dl->fd = tun_fd(dl->tun, 0);
	dl->hdr_len = tun_vnet_hdr_len(dl->tun);
	return 0;
}

static int watch(int ep, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

	return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : -errno;
}

static int open_loop(struct delayline *dl)
{
	sigset_t set;
	int ret;

	/* A reader of the counters that went away must not kill the line. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGUSR1);
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
		return -errno;
	if ((dl->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
	    (dl->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0 ||
	    (dl->ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
		return -errno;
	if ((ret = watch(dl->ep, dl->sfd)) != 0 || (ret = watch(dl->ep, dl->tfd)) != 0)
		return ret;
	/* Timers fire up to the slack late; 1 ns is the least the kernel takes. */
	(void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
	dl->armed_ns = INT64_MAX;
	return 0;
}

/* A link does not wait for a CPU: under SCHED_FIFO the line runs as soon as a packet or its
 * timer is ready, ahead of every ordinary process (the kernel's real-time throttling still
 * leaves them 5 % of each CPU by default). The receive work of the packets it writes back runs
 * in its system calls, so at the same priority. */
static void set_rt(struct delayline *dl)
{
	struct sched_param sp = { .sched_priority = (int)dl->o.rt_priority };

	if (!dl->o.rt_priority)
		return;
	if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
		fprintf(stderr, "delayline: warning: SCHED_FIFO %u refused (%s): running under the "
			"default policy\n", dl->o.rt_priority, strerror(errno));
		return;
	}
	dl->rt = true;
}

/* Read up to DL_BATCH packets straight into the queue, each stamped after its read. */
static int read_batch(struct delayline *dl)
{
	for (int i = 0; i < DL_BATCH; i++) {
		uint8_t *room = delayq_reserve(dl->q);
		ssize_t n = read(dl->fd, room, DL_FRAME_MAX);

		if (n < 0) {
			if (errno == EAGAIN)
				return 0;
			if (errno == EINTR)
				continue;
			dl->c.read_errors++;
			return errno == EBADFD || errno == EIO ? -errno : 0;
		}
		int64_t now = ts_now_ns();
		if ((size_t)n <= dl->hdr_len) {
			dl->c.short_reads++;
			continue;
		}
		if (dl->hdr_len && ((const struct virtio_net_hdr *)room)->gso_type !=
					   VIRTIO_NET_HDR_GSO_NONE)
			dl->c.gso_packets++;
		if ((uint64_t)n - dl->hdr_len > dl->c.max_packet_bytes)
			dl->c.max_packet_bytes = (uint64_t)n - dl->hdr_len;
		/* A refusal is counted by the queue (drops_bytes / drops_packets). */
		(void)delayq_commit(dl->q, (size_t)n, now);
	}
	return 0;
}

/* Write back every packet due by now (the clock read again before each write). */
static void send_due(struct delayline *dl)
{
	const uint8_t *p;
	size_t len;
	int64_t now = ts_now_ns();

	while ((p = delayq_peek(dl->q, now, &len))) {
		while (write(dl->fd, p, len) < 0) {
			if (errno == EINTR)
				continue;
			dl->c.write_errors++;
			break;
		}
		delayq_pop(dl->q, now);
		now = ts_now_ns();
	}
}

static int arm_timer(struct delayline *dl)
{
	int64_t due = delayq_next_due(dl->q);
	struct itimerspec its = { { 0, 0 }, { 0, 0 } };

	if (due == dl->armed_ns)
		return 0;
	if (due != INT64_MAX) {
		its.it_value.tv_sec = due / TS_NS_PER_SEC;
		its.it_value.tv_nsec = due % TS_NS_PER_SEC;
		if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
			its.it_value.tv_nsec = 1; /* all zero would disarm */
	}
	if (timerfd_settime(dl->tfd, TFD_TIMER_ABSTIME, &its, NULL) != 0)
		return -errno;
	dl->armed_ns = due;
	return 0;
}

static void print_stats(const struct delayline *dl, const char *event)
{
	struct delayq_stats s;
	struct tun_dev_stats ds = { 0 };
	uint64_t hdr = dl->hdr_len;

	delayq_get_stats(dl->q, &s);
	/* The device's own drop counter: packets the kernel dropped because we read too slowly. */
	bool has_ds = tun_dev_stats(tun_name(dl->tun), &ds) == 0;
	dprintf(dl->o.stats_fd,
		"{\"event\":\"%s\",\"dev\":\"%s\",\"delay_ns\":%" PRId64 ",\"offload\":%s,"
		"\"rt\":%s,"
		"\"queue_bytes_limit\":%" PRIu64 ",\"queue_packets_limit\":%u,"
		"\"packets\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"packets_out\":%" PRIu64
		",\"bytes_out\":%" PRIu64 ",\"queue_drops\":%" PRIu64
		",\"drops_queue_bytes\":%" PRIu64 ",\"drops_queue_packets\":%" PRIu64
		",\"max_queue_bytes\":%" PRIu64 ",\"max_queue_packets\":%" PRIu64
		",\"queued_packets\":%" PRIu64 ",\"late_sends\":%" PRIu64 ",\"max_late_us\":%" PRId64
		",\"gso_packets\":%" PRIu64 ",\"max_packet_bytes\":%" PRIu64
		",\"read_errors\":%" PRIu64 ",\"short_reads\":%" PRIu64 ",\"write_errors\":%" PRIu64
		",\"tun_tx_dropped\":%" PRId64 "}\n",
		event, tun_name(dl->tun), dl->o.delay_ns, dl->hdr_len ? "true" : "false",
		dl->rt ? "true" : "false",
		dl->o.queue_bytes, dl->o.queue_packets, s.packets_in, s.bytes_in - s.packets_in * hdr,
		s.packets_out, s.bytes_out - s.packets_out * hdr, s.drops_bytes + s.drops_packets,
		s.drops_bytes, s.drops_packets, s.max_queued_bytes, s.max_queued_packets,
		s.queued_packets, s.late, s.max_late_ns / 1000, dl->c.gso_packets,
		dl->c.max_packet_bytes, dl->c.read_errors, dl->c.short_reads, dl->c.write_errors,
		has_ds ? (int64_t)ds.tx_dropped : (int64_t)-1);
}

/* 1: stop; 0: go on. */
static int on_signals(struct delayline *dl)
{
	struct signalfd_siginfo si;

	while (read(dl->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGUSR1) {
			print_stats(dl, "stats");
			continue;
		}
		print_stats(dl, "exit");
		return 1;
	}
	return 0;
}

static int run(struct delayline *dl)
{
	struct epoll_event ev[3];
	uint64_t expirations;
	int n, ret;

	for (;;) {
		if ((n = epoll_wait(dl->ep, ev, 3, -1)) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (int i = 0; i < n; i++) {
			if (ev[i].data.fd == dl->sfd && on_signals(dl))
				return 0;
			if (ev[i].data.fd == dl->tfd &&
			    read(dl->tfd, &expirations, sizeof(expirations)) < 0 && errno != EAGAIN)
				return -errno;
		}
		/* Due packets first: a read batch would only make them later. */
		send_due(dl);
		if ((ret = read_batch(dl)) != 0)
			return ret;
		send_due(dl);
		if ((ret = arm_timer(dl)) != 0)
			return ret;
	}
}

static void close_all(struct delayline *dl)
{
	if (dl->ep >= 0)
		close(dl->ep);
	if (dl->tfd >= 0)
		close(dl->tfd);
	if (dl->sfd >= 0)
		close(dl->sfd);
	tun_close(dl->tun);
	delayq_free(dl->q);
}

int main(int argc, char **argv)
{
	struct delayline dl = { .fd = -1, .tfd = -1, .sfd = -1, .ep = -1 };
	int ret, code = 1;

	if (parse_args(argc, argv, &dl.o) != 0) {
		usage(stderr);
		return 2;
	}
	if ((ret = open_queue(&dl)) != 0) {
		fprintf(stderr, "delayline: queue of %" PRIu64 " bytes: %s\n", dl.o.queue_bytes,
			strerror(-ret));
		goto out;
	}
	if ((ret = open_tun(&dl)) != 0) {
		code = 2;
		goto out;
	}
	if ((ret = open_loop(&dl)) != 0 || (ret = watch(dl.ep, dl.fd)) != 0) {
		fprintf(stderr, "delayline: event loop: %s\n", strerror(-ret));
		goto out;
	}
	set_rt(&dl);
	fprintf(stderr, "delayline: %s up: delay %.3f ms, queue %" PRIu64 " bytes / %u packets, "
		"%s%s\n", tun_name(dl.tun), (double)dl.o.delay_ns / 1e6, dl.o.queue_bytes,
		dl.o.queue_packets, dl.hdr_len ? "offload csum,tso4,tso6" : "per-packet",
		dl.rt ? ", SCHED_FIFO" : "");
	if ((ret = run(&dl)) != 0) {
		fprintf(stderr, "delayline: %s: %s\n", tun_name(dl.tun), strerror(-ret));
		print_stats(&dl, "error");
		goto out;
	}
	code = 0;
out:
	close_all(&dl);
	return code;
}
