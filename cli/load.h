/* load.h — `twinstack load`: the benchmark's traffic generator and echo servers.
 *
 * One mode per file pair: load.c parses options and dispatches, load_serve.c is the echo
 * server, load_tcp.c the TCP clients (connrate, latency, hold), load_udp.c the UDP clients
 * (udp, udpflows). Every client mode is bounded by --duration or a timeout, prints exactly one
 * JSON object on stdout at the end and its progress and errors on stderr. Mode functions return
 * an exit code (EXIT_OK, EXIT_RUNTIME, EXIT_USAGE of cli/cli.h); helpers return 0 or -errno. */
#ifndef TS_CLI_LOAD_H
#define TS_CLI_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "core/netaddr.h"

#define LOAD_MAX_PORTS 64

/* Every option of every mode; each mode reads the ones its usage names. */
struct load_opts {
	struct netaddr addr;  /* --bind (serve), --target host part (all clients) */
	uint16_t port;        /* --target ADDR:PORT */
	bool has_addr, has_port;
	uint16_t ports[LOAD_MAX_PORTS]; /* --tcp-ports (serve), --ports (connrate) */
	unsigned n_ports;
	uint16_t udp_port;              /* serve: 0 = no UDP echo */
	struct netaddr source;          /* connrate --source */
	bool has_source;
	double duration_s;              /* 0 = serve until a signal */
	unsigned concurrency, req, size, conns, interval_ms, flows;
	unsigned timeout_ms;            /* udpflows: wait for echoes; connrate: one attempt */
	uint64_t count;                 /* connrate: stop after this many completed; 0 = none */
	uint64_t rate;                  /* udp: datagrams per second, 0 = windowed flat out */
	struct netaddr_ep socks5;       /* udp --socks5: send through this server's UDP relay */
	bool has_socks5;
};

/* ---- helpers shared by the modes (load.c) ----------------------------------------------- */

/* True once SIGINT or SIGTERM arrived (the one global: a signal flag). */
bool load_stopping(void);
/* Install the SIGINT/SIGTERM handlers (no SA_RESTART, so a blocked epoll_wait returns). */
int load_signals_install(void);
/* Fill ss and len for a + port. */
void load_sockaddr(const struct netaddr *a, uint16_t port, struct sockaddr_storage *ss,
		   socklen_t *len);
/* A non-blocking, close-on-exec socket of a's family. Returns the fd or -errno. */
int load_socket(const struct netaddr *a, int type);
/* Ask for bytes of receive and send buffer; the *FORCE options pass net.core.*mem_max when we
 * are root, the plain ones are the fallback (capped by the sysctl). Best effort. */
void load_sockbuf(int fd, int bytes);
/* Raise RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit. */
uint64_t load_raise_nofile(void);
/* Microseconds on the monotonic clock. */
int64_t load_now_us(void);
/* Sort v[0..n) in place, then v[ceil(q*n)-1] (nearest rank); 0 if n is 0. */
uint32_t load_percentile_sorted(const uint32_t *v, size_t n, double q);
void load_sort_u32(uint32_t *v, size_t n);

/* The payload a TCP client sends on connection idx (its number in the run): byte off of the
 * stream is byte off % 8 of a 64-bit mix of (idx, off / 8), so a byte of another connection,
 * another offset or a lost stretch differs from the expected one (but for chance: 1 in 256
 * per byte). The echo is checked against the same function. */
void load_pattern_fill(uint64_t idx, uint64_t off, uint8_t *buf, size_t n);
/* Is buf[0..n) connection idx's payload from stream offset off? */
bool load_pattern_ok(uint64_t idx, uint64_t off, const uint8_t *buf, size_t n);

/* A growable array of samples (microseconds). */
struct load_samples {
	uint32_t *v;
	size_t n, cap;
};
int load_samples_add(struct load_samples *s, int64_t us);
void load_samples_fini(struct load_samples *s);

/* A mode that cannot start still prints its one JSON object: {"error":"<strerror>"}, and the
 * reason on stderr. err is -errno. */
void load_json_error(const char *mode, int err);

/* ---- a SOCKS5 UDP association (load_socks5.c) --------------------------------------------- */

/* The client side of RFC 1928 section 7 for the udp mode: a TCP control connection to the
 * server (no authentication), UDP ASSOCIATE, and a UDP socket connected to the relay. Every
 * datagram to the relay carries the header naming the target; every one from it carries the
 * header naming its source. The association lives as long as ctl stays open. */
struct load_s5udp {
	int ctl;                  /* the control connection, -1 when none */
	int fd;                   /* UDP, connected to the relay, -1 when none */
	struct netaddr_ep relay;  /* where fd sends */
	size_t hdr_len;           /* bytes of header in front of each payload to the target */
};

/* Associate through o->socks5 for datagrams to o->addr:o->port, within timeout_ms. Returns 0
 * with *s open, or -errno with *s closed: the server's reply code mapped by
 * socks5_reply_errno, -EACCES when it wants authentication, -ETIMEDOUT, -ECONNRESET when it
 * closes early, -EPROTO for a relay given as a name or a broken reply. */
int load_s5udp_open(const struct load_opts *o, unsigned timeout_ms, struct load_s5udp *s);
/* Write the header to o's target into buf (at least hdr_len bytes). */
int load_s5udp_header(const struct load_opts *o, uint8_t *buf, size_t cap);
/* Is dgram (n bytes from the relay) a datagram from o's target with a payload of exactly size
 * bytes? Returns the payload, or NULL (a malformed header, another source, another size). */
const uint8_t *load_s5udp_payload(const struct load_opts *o, const uint8_t *dgram, size_t n,
				  size_t size);
/* Did the server close the control connection (which ends the association)? */
bool load_s5udp_ctl_closed(const struct load_s5udp *s);
void load_s5udp_close(struct load_s5udp *s);

/* ---- modes --------------------------------------------------------------------------------- */
int load_serve(const struct load_opts *o);
int load_connrate(const struct load_opts *o);
int load_latency(const struct load_opts *o);
int load_hold(const struct load_opts *o);
int load_udp(const struct load_opts *o);
int load_udpflows(const struct load_opts *o);

#endif
