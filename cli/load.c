/* load.c — `twinstack load MODE [options]`: option parsing, dispatch to the modes, and the
 * small helpers they share (addresses, sockets, signals, samples, percentiles). */
#include "cli/load.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "outbound/socks5_codec.h"

/* The only process-wide state: set from the signal handler, read by every loop. */
static volatile sig_atomic_t load_stop_flag;

void usage_load(FILE *out)
{
	fputs("usage: twinstack load MODE [options]\n"
	      "\n"
	      "Benchmark traffic: echo servers and clients. Each mode prints exactly one JSON\n"
	      "object on stdout when it ends; progress and errors go to stderr. Addresses are\n"
	      "IPv4 (127.0.0.1:5000) or IPv6 ([::1]:5000). Exit 0 done, 1 runtime failure (no\n"
	      "sample at all, a socket that fails), 2 bad usage.\n"
	      "\n"
	      "modes:\n"
	      "  serve     --bind ADDR --tcp-ports P[,P...] [--udp-port P] [--duration S]\n"
	      "            TCP and UDP echo until SIGTERM/SIGINT (or S seconds)\n"
	      "            -> {\"served_conns\",\"udp_datagrams\"}\n"
	      "  connrate  --target ADDR --ports P[,P...] --duration S --concurrency C\n"
	      "            [--req BYTES (64)] [--count N] [--source ADDR]\n"
	      "            [--timeout-ms MS (2000)]\n"
	      "            connect, send, read the echo, close; C at a time, the ports in turn;\n"
	      "            N: stop after N completed connections (S still bounds the run); an\n"
	      "            attempt older than MS is abandoned (a timeout). Each request is its\n"
	      "            connection's own byte pattern and every echoed byte is checked\n"
	      "            -> {\"conn_per_s\",\"completed\",\"errors\",\"timeouts\",\n"
	      "                \"p50_connect_us\",\"p99_connect_us\",\"duration_s\",\"attempts\",\n"
	      "                \"error_causes\":{\"addrnotavail\",\"reset\",\"refused\",\"timeout\",\n"
	      "                \"mismatch\",\"other\"}}  (errors: their sum; timeouts: timeout)\n"
	      "  latency   --target ADDR:PORT --duration S [--size BYTES (64)] [--conns N (1)]\n"
	      "            ping-pong on persistent connections\n"
	      "            -> {\"latency_p50_us\",\"latency_p99_us\",\"latency_p999_us\",\"samples\",\n"
	      "                \"errors\"}\n"
	      "  hold      --target ADDR:PORT --conns N --duration S [--interval-ms MS (1000)]\n"
	      "            [--size BYTES (16)]; prints \"HELD n\" on stdout once connected;\n"
	      "            every interval BYTES of the connection's own pattern go out on each\n"
	      "            and the echo is checked byte for byte; at the end the owed echoes\n"
	      "            are awaited (10 s at most), then all are closed\n"
	      "            -> {\"held\",\"failed\",\"echo_errors\",\"alive\",\"echoed\",\n"
	      "                \"mismatch\",\"late\",\"unanswered\",\"bytes_verified\"}  (echoed:\n"
	      "                connections with a whole round checked; in echo_errors: mismatch,\n"
	      "                reads that differ; late, rounds that found the previous echo still\n"
	      "                owed; unanswered, connections still owed one at the end)\n"
	      "  udp       --target ADDR:PORT --duration S [--size BYTES (64)] [--rate PPS (0)]\n"
	      "            [--socks5 ADDR:PORT [--timeout-ms MS (2000)]]\n"
	      "            rate 0: as fast as possible with at most 64 datagrams outstanding;\n"
	      "            --socks5: through that SOCKS5 server's UDP ASSOCIATE relay (no\n"
	      "            authentication; MS bounds the handshake)\n"
	      "            -> {\"pps\",\"sent\",\"received\",\"loss_pct\",\"bad\",\"send_errors\",\"size\"}\n"
	      "               (--socks5 adds \"socks5_relay\")\n"
	      "  udpflows  --target ADDR:PORT --flows N [--timeout-ms MS (2000)]\n"
	      "            N sockets, one datagram each -> {\"flows\",\"answered\",\"sent\"}\n"
	      "A mode that cannot start prints {\"error\":\"...\"}. latency and hold also take\n"
	      "--source ADDR.\n",
	      out);
}

/* ---- shared helpers ------------------------------------------------------------------------ */

static void on_signal(int sig)
{
	(void)sig;
	load_stop_flag = 1;
}

bool load_stopping(void)
{
	return load_stop_flag != 0;
}

int load_signals_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
		return -errno;
	/* A peer that resets while we write must be an error return, not a dead process. */
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

void load_sockaddr(const struct netaddr *a, uint16_t port, struct sockaddr_storage *ss,
		   socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	if (a->family == 4) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		memcpy(&s4->sin_addr, a->a, 4);
		*len = sizeof(*s4);
	} else {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		memcpy(&s6->sin6_addr, a->a, 16);
		*len = sizeof(*s6);
	}
}

int load_socket(const struct netaddr *a, int type)
{
	int fd = socket(a->family == 4 ? AF_INET : AF_INET6, type | SOCK_NONBLOCK | SOCK_CLOEXEC,
			0);
	return fd < 0 ? -errno : fd;
}

void load_sockbuf(int fd, int bytes)
{
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes)) != 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof(bytes)) != 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

uint64_t load_raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return 1024;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	return (uint64_t)rl.rlim_cur;
}

void load_json_error(const char *mode, int err)
{
	fprintf(stderr, "load %s: %s\n", mode, strerror(-err));
	printf("{\"error\":\"%s\"}\n", strerror(-err));
}

int64_t load_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int cmp_u32(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
	return (a > b) - (a < b);
}

void load_sort_u32(uint32_t *v, size_t n)
{
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_u32);
}

uint32_t load_percentile_sorted(const uint32_t *v, size_t n, double q)
{
	size_t rank;

	if (n == 0)
		return 0;
	/* Nearest rank: the smallest sample with at least q of all samples at or below it. */
	rank = (size_t)(q * (double)n + 0.999999);
	if (rank < 1)
		rank = 1;
	return v[(rank > n ? n : rank) - 1];
}

int load_samples_add(struct load_samples *s, int64_t us)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 4096;
		uint32_t *v = realloc(s->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = us < 0 ? 0 : us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
	return 0;
}

void load_samples_fini(struct load_samples *s)
{
	free(s->v);
	s->v = NULL;
	s->n = s->cap = 0;
}

/* splitmix64's finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA 2014): every input bit changes about half the output bits. */
static uint64_t pattern_word(uint64_t idx, uint64_t word)
{
	uint64_t z = idx * 0x9e3779b97f4a7c15ULL + word * 0xd1b54a32d192ed03ULL + 1;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void load_pattern_fill(uint64_t idx, uint64_t off, uint8_t *buf, size_t n)
{
	uint64_t w = pattern_word(idx, off / 8);

	for (size_t i = 0; i < n; i++, off++) {
		if (i && off % 8 == 0)
			w = pattern_word(idx, off / 8);
		buf[i] = (uint8_t)(w >> (off % 8 * 8));
	}
}

bool load_pattern_ok(uint64_t idx, uint64_t off, const uint8_t *buf, size_t n)
{
	uint64_t w = pattern_word(idx, off / 8);

	for (size_t i = 0; i < n; i++, off++) {
		if (i && off % 8 == 0)
			w = pattern_word(idx, off / 8);
		if (buf[i] != (uint8_t)(w >> (off % 8 * 8)))
			return false;
	}
	return true;
}

/* ---- options ------------------------------------------------------------------------------- */

enum opt_kind {
	OPT_UINT, OPT_U64, OPT_SECONDS, OPT_ENDPOINT, OPT_ADDR, OPT_PORTS, OPT_PORT, OPT_SOCKS5
};

struct opt_spec {
	const char *name;
	enum opt_kind kind;
	size_t off; /* into struct load_opts */
};

static const struct opt_spec opt_specs[] = {
	{ "--bind", OPT_ADDR, offsetof(struct load_opts, addr) },
	{ "--target", OPT_ENDPOINT, 0 },
	{ "--source", OPT_ADDR, offsetof(struct load_opts, source) },
	{ "--tcp-ports", OPT_PORTS, 0 },
	{ "--ports", OPT_PORTS, 0 },
	{ "--udp-port", OPT_PORT, offsetof(struct load_opts, udp_port) },
	{ "--duration", OPT_SECONDS, offsetof(struct load_opts, duration_s) },
	{ "--concurrency", OPT_UINT, offsetof(struct load_opts, concurrency) },
	{ "--req", OPT_UINT, offsetof(struct load_opts, req) },
	{ "--size", OPT_UINT, offsetof(struct load_opts, size) },
	{ "--conns", OPT_UINT, offsetof(struct load_opts, conns) },
	{ "--interval-ms", OPT_UINT, offsetof(struct load_opts, interval_ms) },
	{ "--flows", OPT_UINT, offsetof(struct load_opts, flows) },
	{ "--timeout-ms", OPT_UINT, offsetof(struct load_opts, timeout_ms) },
	{ "--rate", OPT_U64, offsetof(struct load_opts, rate) },
	{ "--count", OPT_U64, offsetof(struct load_opts, count) },
	{ "--socks5", OPT_SOCKS5, offsetof(struct load_opts, socks5) },
};

static int parse_ports(const char *s, struct load_opts *o)
{
	char buf[512], *save = NULL;

	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	o->n_ports = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (o->n_ports == LOAD_MAX_PORTS ||
		    netaddr_parse_port(t, &o->ports[o->n_ports]) != 0)
			return -EINVAL;
		o->n_ports++;
	}
	return o->n_ports ? 0 : -EINVAL;
}

/* --target is ADDR:PORT for most modes and a bare ADDR for connrate (which takes --ports). */
static int parse_target(const char *s, struct load_opts *o)
{
	struct netaddr_ep ep;

	if (netaddr_parse_ep(s, &ep) == 0) {
		o->addr = ep.addr;
		o->port = ep.port;
		o->has_port = true;
	} else if (netaddr_parse(s, &o->addr) != 0) {
		return -EINVAL;
	}
	o->has_addr = true;
	return 0;
}

static int apply_opt(const struct opt_spec *sp, const char *v, struct load_opts *o)
{
	char *field = (char *)o + sp->off;
	uint64_t u;
	char *end;

	switch (sp->kind) {
	case OPT_UINT:
		if (cli_parse_u64(v, &u) != 0 || u > 100000000)
			return -EINVAL;
		*(unsigned *)field = (unsigned)u;
		return 0;
	case OPT_U64:
		return cli_parse_u64(v, (uint64_t *)field);
	case OPT_SECONDS:
		*(double *)field = strtod(v, &end);
		return *end || end == v || *(double *)field < 0 || *(double *)field > 86400
			       ? -EINVAL : 0;
	case OPT_ENDPOINT:
		return parse_target(v, o);
	case OPT_ADDR:
		if (netaddr_parse(v, (struct netaddr *)field) != 0)
			return -EINVAL;
		if (sp->off == offsetof(struct load_opts, source))
			o->has_source = true;
		else
			o->has_addr = true;
		return 0;
	case OPT_PORTS:
		return parse_ports(v, o);
	case OPT_PORT:
		return netaddr_parse_port(v, (uint16_t *)field);
	case OPT_SOCKS5:
		o->has_socks5 = true;
		return netaddr_parse_ep(v, (struct netaddr_ep *)field);
	}
	return -EINVAL;
}

static void opts_defaults(struct load_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->concurrency = 16;
	o->req = 64;
	o->size = 0; /* per-mode default, see mode_defaults() */
	o->conns = 0;
	o->interval_ms = 1000;
	o->timeout_ms = 2000;
}

/* Returns 0, or -EINVAL after printing what is wrong. */
static int parse_opts(int argc, char **argv, struct load_opts *o)
{
	for (int i = 2; i < argc; i++) {
		const struct opt_spec *sp = NULL;
		const char *v = NULL;
		int ret = 0;

		for (size_t k = 0; k < sizeof(opt_specs) / sizeof(opt_specs[0]) && !sp; k++) {
			ret = cli_take_option(argc, argv, &i, opt_specs[k].name, opt_specs[k].name, &v);
			if (ret != 0)
				sp = &opt_specs[k];
		}
		if (!sp) {
			fprintf(stderr, "twinstack load: unexpected argument '%s'\n", argv[i]);
			return -EINVAL;
		}
		if (ret < 0) {
			fprintf(stderr, "twinstack load: %s needs a value\n", sp->name);
			return -EINVAL;
		}
		if (apply_opt(sp, v, o) != 0) {
			fprintf(stderr, "twinstack load: bad value '%s' for %s\n", v, sp->name);
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- modes --------------------------------------------------------------------------------- */

enum {
	NEED_ADDR = 1 << 0,     /* --target ADDR or --bind ADDR */
	NEED_PORT = 1 << 1,     /* --target ADDR:PORT */
	NEED_PORTS = 1 << 2,    /* --ports / --tcp-ports */
	NEED_DURATION = 1 << 3, /* a client must end on its own */
	NEED_CONNS = 1 << 4,
	NEED_FLOWS = 1 << 5,
};

struct load_mode {
	const char *name;
	int (*run)(const struct load_opts *o);
	unsigned needs;
	unsigned default_size;
};

static const struct load_mode load_modes[] = {
	{ "serve", load_serve, NEED_ADDR | NEED_PORTS, 0 },
	{ "connrate", load_connrate, NEED_ADDR | NEED_PORTS | NEED_DURATION, 0 },
	{ "latency", load_latency, NEED_ADDR | NEED_PORT | NEED_DURATION, 64 },
	{ "hold", load_hold, NEED_ADDR | NEED_PORT | NEED_DURATION | NEED_CONNS, 16 },
	{ "udp", load_udp, NEED_ADDR | NEED_PORT | NEED_DURATION, 64 },
	{ "udpflows", load_udpflows, NEED_ADDR | NEED_PORT | NEED_FLOWS, 0 },
};

static const char *missing(const struct load_mode *m, const struct load_opts *o)
{
	if ((m->needs & NEED_ADDR) && !o->has_addr)
		return strcmp(m->name, "serve") == 0 ? "--bind ADDR" : "--target";
	if ((m->needs & NEED_PORT) && !o->has_port)
		return "--target ADDR:PORT";
	if ((m->needs & NEED_PORTS) && !o->n_ports)
		return strcmp(m->name, "serve") == 0 ? "--tcp-ports P[,P...]" : "--ports P[,P...]";
	if ((m->needs & NEED_DURATION) && !(o->duration_s > 0))
		return "--duration S (> 0)";
	if ((m->needs & NEED_CONNS) && !o->conns)
		return "--conns N (> 0)";
	if ((m->needs & NEED_FLOWS) && !o->flows)
		return "--flows N (> 0)";
	if (o->has_source && o->source.family != o->addr.family)
		return "--source of the target's address family";
	if (!o->concurrency || !o->req)
		return "--concurrency and --req > 0";
	if (o->size > 65000)
		return "--size at most 65000";
	if (o->count && strcmp(m->name, "connrate") != 0)
		return "no --count (only the connrate mode takes it)";
	if (o->has_socks5 && strcmp(m->name, "udp") != 0)
		return "no --socks5 (only the udp mode takes it)";
	if (o->has_socks5 && o->size > 65000 - SOCKS5_UDP_HDR_MAX)
		return "--size at most 64738 with --socks5 (the relay's header)";
	return NULL;
}

int cmd_load(int argc, char **argv)
{
	const struct load_mode *m = NULL;
	struct load_opts o;
	const char *what;

	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage_load(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : EXIT_OK;
	}
	for (size_t k = 0; k < sizeof(load_modes) / sizeof(load_modes[0]); k++)
		if (strcmp(argv[1], load_modes[k].name) == 0)
			m = &load_modes[k];
	if (!m) {
		fprintf(stderr, "twinstack load: unknown mode '%s'\n", argv[1]);
		usage_load(stderr);
		return EXIT_USAGE;
	}
	for (int i = 2; i < argc; i++)
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_load(stdout);
			return EXIT_OK;
		}
	opts_defaults(&o);
	if (parse_opts(argc, argv, &o) != 0)
		return EXIT_USAGE;
	if (!o.size)
		o.size = m->default_size;
	if (!o.conns && strcmp(m->name, "latency") == 0)
		o.conns = 1;
	if ((what = missing(m, &o))) {
		fprintf(stderr, "twinstack load %s: needs %s\n", m->name, what);
		return EXIT_USAGE;
	}
	if (load_signals_install() != 0) {
		fprintf(stderr, "twinstack load: sigaction: %s\n", strerror(errno));
		return EXIT_RUNTIME;
	}
	return m->run(&o);
}
