/* test_dns_doh.c — dns/doh.c against a real DNS over HTTPS server: Debian's unbound (built with
 * nghttp2) on 127.0.0.1, with a certificate for doh.test from a CA made for the test.
 *
 *   test ──dns_doh_ask──► doh ──TLS 1.2+, ALPN h2, POST /dns-query──► unbound 127.0.0.1:<port>
 *                                                                     a.doh.test A 192.0.2.44
 *
 * The certificates (a CA, a server certificate for doh.test signed by it, and a second,
 * unrelated CA) are made with the openssl command in a temporary directory per test. Cases: an
 * answer; many asks on one connection (beyond the stream limit, and the server's own lower
 * limit); a certificate name mismatch; an unknown CA; a 404 path; no h2 by ALPN (openssl
 * s_server); a server that never answers (timeouts); one that refuses every stream (a GOAWAY
 * from a small Python server); the ask bound; a new detour; cancel; idle
 * close; free with asks pending and from inside a callback. Every wait is bounded by a guard timer;
 * counters are checked by exact amounts; every test checks that no descriptor stays open.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/dns_msg.h"
#include "core/budget.h"
#include "core/config.h"
#include "dns/doh.h"
#include "dns/server.h"
#include "core/evmem.h"
#include "core/libmem.h"
#include "failalloc.h"
#include "testutil.h"

#define WAIT_MS 10000             /* generous: the tests also run under valgrind */

/* ---- helpers ---- */

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int listen_lo(uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	cr_assert_geq(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 512) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static uint16_t local_port(int fd)
{
	struct sockaddr_in sa;
	socklen_t l = sizeof(sa);

	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &l), 0);
	return ntohs(sa.sin_port);
}

static uint16_t free_port(void)
{
	int fd = listen_lo(0);
	uint16_t p;

	cr_assert_geq(fd, 0);
	p = local_port(fd);
	close(fd);
	return p;
}

/* A child running argv (output to /dev/null), killed if the test process dies. */
static pid_t spawn(char *const argv[])
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		prctl(PR_SET_PDEATHSIG, SIGKILL);  /* a failed test leaves no server behind */
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	return pid;
}

static void reap(pid_t pid)
{
	int status;

	kill(pid, SIGTERM);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
}

static void wait_listening(pid_t pid, uint16_t port)
{
	int64_t until = mono_ms() + WAIT_MS;
	int status;

	while (!tu_lo_accepts(port)) {
		cr_assert_eq(waitpid(pid, &status, WNOHANG), 0, "the server exited at start");
		cr_assert_lt(mono_ms(), until, "the server does not listen on %u", port);
		usleep(20000);
	}
}

static struct dns_question question(const char *name, uint16_t type)
{
	struct dns_question q;

	memset(&q, 0, sizeof(q));
	snprintf(q.name, sizeof(q.name), "%s", name);
	q.name_len = strlen(q.name);
	q.nameable = true;
	q.qtype = type;
	q.qclass = 1;
	return q;
}

/* ---- results ---- */

struct res {
	int calls, err;
	uint16_t flags;
	uint8_t addr[4];
	struct dns_doh **free_me; /* free this upstream from the callback */
	int *counter;             /* shared count of calls, for many asks */
};

/* The first answer RR's A data (walking its owner name). */
static bool first_a(const uint8_t *m, size_t len, const struct dns_answer *a, uint8_t out[4])
{
	size_t off = a->rr_off;

	if (a->an == 0)
		return false;
	while (off < len && m[off] != 0 && (m[off] & 0xc0) != 0xc0)
		off += 1 + m[off];
	off += off < len && m[off] == 0 ? 1 : 2;
	if (off + 10 + 4 > len || tu_get16(m + off) != DNS_T_A || tu_get16(m + off + 8) != 4)
		return false;
	memcpy(out, m + off + 10, 4);
	return true;
}

static void on_res(void *arg, int err, const uint8_t *msg, size_t len,
		   const struct dns_answer *a)
{
	struct res *r = arg;

	r->calls++;
	r->err = err;
	if (r->counter)
		(*r->counter)++;
	cr_assert(err != 0 || (msg && a && len >= DNS_HDR_LEN));
	cr_assert(err == 0 || (!msg && !a));
	if (err == 0) {
		r->flags = a->flags;
		cr_assert_eq(tu_get16(msg), 0, "RFC 8484: the answer carries id 0");
		if (DNS_RCODE(a->flags) == DNS_R_NOERROR)
			cr_assert(first_a(msg, len, a, r->addr), "no A record in the answer");
	}
	if (r->free_me) {
		dns_doh_free(*r->free_me);
		*r->free_me = NULL;
	}
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

/* Run base until *calls reaches want or ms passed (want < 0: run exactly ms). */
static bool run_until(struct event_base *base, const int *calls, int want, int ms)
{
	bool expired = false;
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	struct event *guard;

	failalloc_hold(true); /* the test's guard, not the code under test */
	guard = evtimer_new(base, on_guard, &expired);
	cr_assert_not_null(guard);
	cr_assert_eq(evtimer_add(guard, &tv), 0);
	failalloc_hold(false);
	while (!expired && (want < 0 || *calls < want))
		event_base_loop(base, EVLOOP_ONCE);
	event_free(guard);
	return want < 0 || *calls >= want;
}

/* ---- a TCP relay in front of the server, to lose connections at will ---- */

#define RELAY_MAX 4

struct relay_pair {
	int cfd, sfd;                 /* from the upstream under test, to the server */
	struct event *cev, *sev;
};

struct relay {
	struct event_base *base;
	uint16_t to;                  /* the server's port */
	int lfd;
	struct event *lev;
	int accepted;
	struct relay_pair *p[RELAY_MAX];
};

static void pair_close(struct relay *rl, int i)
{
	struct relay_pair *p = rl->p[i];

	event_free(p->cev);
	event_free(p->sev);
	close(p->cfd);
	close(p->sfd);
	free(p);
	rl->p[i] = NULL;
}

static void on_relay_data(evutil_socket_t fd, short what, void *arg)
{
	struct relay *rl = arg;
	uint8_t buf[16384];
	ssize_t n = recv(fd, buf, sizeof(buf), 0);

	for (int i = 0; i < RELAY_MAX; i++) {
		struct relay_pair *p = rl->p[i];

		if (!p || (p->cfd != fd && p->sfd != fd))
			continue;
		if (n <= 0 || send(fd == p->cfd ? p->sfd : p->cfd, buf, (size_t)n, MSG_NOSIGNAL) != n)
			pair_close(rl, i);
		return;
	}
}

static void on_relay_accept(evutil_socket_t fd, short what, void *arg)
{
	struct relay *rl = arg;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(rl->to) };
	struct relay_pair *p;
	int i, cfd = accept(fd, NULL, NULL);

	if (cfd < 0)
		return;
	for (i = 0; i < RELAY_MAX && rl->p[i]; i++)
		;
	cr_assert_lt(i, RELAY_MAX, "too many relayed connections");
	cr_assert_not_null(p = calloc(1, sizeof(*p)));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	p->cfd = cfd;
	p->sfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(p->sfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	p->cev = event_new(rl->base, p->cfd, EV_READ | EV_PERSIST, on_relay_data, rl);
	p->sev = event_new(rl->base, p->sfd, EV_READ | EV_PERSIST, on_relay_data, rl);
	event_add(p->cev, NULL);
	event_add(p->sev, NULL);
	rl->p[i] = p;
	rl->accepted++;
}

static void relay_start(struct relay *rl, struct event_base *base, uint16_t to)
{
	memset(rl, 0, sizeof(*rl));
	rl->base = base;
	rl->to = to;
	cr_assert_geq(rl->lfd = listen_lo(0), 0);
	rl->lev = event_new(base, rl->lfd, EV_READ | EV_PERSIST, on_relay_accept, rl);
	event_add(rl->lev, NULL);
}

/* Stop passing what the upstream sends on the open connections (the server hears nothing). */
static void relay_hold(struct relay *rl)
{
	for (int i = 0; i < RELAY_MAX; i++)
		if (rl->p[i])
			event_del(rl->p[i]->cev);
}

static void relay_cut(struct relay *rl)
{
	for (int i = 0; i < RELAY_MAX; i++)
		if (rl->p[i])
			pair_close(rl, i);
}

static void relay_stop(struct relay *rl)
{
	relay_cut(rl);
	event_free(rl->lev);
	close(rl->lfd);
}

/* ---- the server ---- */

struct fx {
	int fds0;                  /* descriptors open before: all closed again at the end */
	char dir[64];              /* certificates and the server's configuration */
	char ca[128], ca_other[128];  /* PEM files */
	uint16_t port;
	pid_t pid;                 /* the server, 0 none */
	struct event_base *base;
	struct dns_doh_config cfg;
	struct dns_doh *d;
};

static bool unbound_has_doh(void)
{
	FILE *p = popen("unbound -V 2>/dev/null", "r");
	char line[1024];
	bool yes = false;

	if (!p)
		return false;
	while (fgets(line, sizeof(line), p))
		if (strstr(line, "--with-libnghttp2"))
			yes = true;
	pclose(p);
	return yes;
}

static void make_certs(struct fx *f)
{
	char cmd[2048];
	const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";

	snprintf(cmd, sizeof(cmd),
		 "(cd %s && "
		 "openssl req -x509 %s -days 2 -keyout ca.key -out ca.pem -subj /CN=doh-test-ca && "
		 "openssl req -x509 %s -days 2 -keyout ca2.key -out ca2.pem -subj /CN=other-ca && "
		 "openssl req %s -keyout srv.key -out srv.csr -subj /CN=doh.test && "
		 "printf 'subjectAltName=DNS:doh.test\\n' > ext.cnf && "
		 "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
		 "-out srv.pem -days 2 -extfile ext.cnf) >/dev/null 2>&1",
		 f->dir, ec, ec, ec);
	cr_assert_eq(system(cmd), 0, "openssl could not make the certificates");
	snprintf(f->ca, sizeof(f->ca), "%s/ca.pem", f->dir);
	snprintf(f->ca_other, sizeof(f->ca_other), "%s/ca2.pem", f->dir);
}

/* unbound answering DoH on 127.0.0.1:port; max_streams its SETTINGS_MAX_CONCURRENT_STREAMS. */
static void unbound_start(struct fx *f, int max_streams)
{
	char conf[160];
	char *argv[] = { "unbound", "-d", "-c", conf, NULL };
	FILE *c;

	snprintf(conf, sizeof(conf), "%s/unbound.conf", f->dir);
	cr_assert_not_null(c = fopen(conf, "w"));
	fprintf(c, "server:\n"
		   "  interface: 127.0.0.1@%u\n  port: %u\n  https-port: %u\n"
		   "  http-endpoint: \"/dns-query\"\n  http-max-streams: %d\n"
		   "  tls-service-key: \"%s/srv.key\"\n  tls-service-pem: \"%s/srv.pem\"\n"
		   "  do-ip6: no\n  do-udp: no\n  username: \"\"\n  chroot: \"\"\n"
		   "  directory: \"%s\"\n  pidfile: \"\"\n  use-syslog: no\n"
		   "  do-daemonize: no\n  num-threads: 1\n  module-config: \"iterator\"\n"
		   "  access-control: 127.0.0.0/8 allow\n"
		   "  local-zone: \"doh.test.\" static\n"
		   "  local-data: \"a.doh.test. A 192.0.2.44\"\n"
		   "remote-control:\n  control-enable: no\n",
		f->port, f->port, f->port, max_streams, f->dir, f->dir, f->dir);
	fclose(c);
	f->pid = spawn(argv);
	wait_listening(f->pid, f->port);
}

/* The temporary directory, removed at exit even when an assertion ends the test early. */
static char tmp_dir[64];

static void tmp_dir_remove(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmp_dir);
}

/* The fixture: certificates, no server yet, a config for a.doh.test's server. */
static void fx_init(struct fx *f)
{
	memset(f, 0, sizeof(*f));
	if (access("/usr/bin/openssl", X_OK) != 0)
		cr_skip_test("no openssl command to make the test certificates");
	f->fds0 = tu_dir_entries("/proc/self/fd");
	strcpy(f->dir, "/tmp/ts-doh-XXXXXX");
	cr_assert_not_null(mkdtemp(f->dir));
	strcpy(tmp_dir, f->dir);
	atexit(tmp_dir_remove);
	make_certs(f);
	f->port = free_port();
	f->base = event_base_new();
	cr_assert_not_null(f->base);
	cr_assert_eq(netaddr_parse("127.0.0.1", &f->cfg.server.addr), 0);
	f->cfg.server.port = f->port;
	strcpy(f->cfg.host, "doh.test");
	strcpy(f->cfg.path, "/dns-query");
	f->cfg.ca = f->ca;
	f->cfg.timeout_ms = 4000;
	f->cfg.tries = 2;
}

/* fx_init and unbound (skipped without a DoH-capable unbound). */
static void fx_start(struct fx *f, int max_streams)
{
	if (!unbound_has_doh())
		cr_skip_test("unbound with DNS over HTTPS (built with libnghttp2) is not installed");
	fx_init(f);
	unbound_start(f, max_streams);
}

static void fx_new(struct fx *f)
{
	cr_assert_eq(dns_doh_new(f->base, &f->cfg, &f->d), 0);
}

static void fx_stop(struct fx *f)
{
	dns_doh_free(f->d);
	if (f->pid)
		reap(f->pid);
	event_base_free(f->base);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), f->fds0, "a descriptor left open");
	CHECK_LEAKS();
}

/* Ask name A; the callback must not run inside dns_doh_ask. */
static struct dns_doh_q *ask(struct fx *f, const char *name, struct res *r)
{
	struct dns_question q = question(name, DNS_T_A);
	struct dns_doh_q *h = NULL;

	cr_assert_eq(dns_doh_ask(f->d, &q, on_res, r, &h), 0);
	cr_assert_not_null(h);
	cr_assert_eq(r->calls, 0, "callback ran inside dns_doh_ask");
	return h;
}

static void assert_addr(const struct res *r, int a, int b, int c, int d)
{
	uint8_t want[4] = { (uint8_t)a, (uint8_t)b, (uint8_t)c, (uint8_t)d };

	cr_assert_eq(r->err, 0, "err %d (%s)", r->err, strerror(-r->err));
	cr_assert_arr_eq(r->addr, want, 4, "got %u.%u.%u.%u", r->addr[0], r->addr[1], r->addr[2],
			 r->addr[3]);
}

static struct dns_doh_stats stats(const struct fx *f)
{
	struct dns_doh_stats st;

	dns_doh_get_stats(f->d, &st);
	return st;
}

/* ---- answers ---- */

Test(dns_doh, answer_and_nxdomain)
{
	struct res r1 = { 0 }, r2 = { 0 };
	struct dns_doh_stats st;
	struct fx f;

	fx_start(&f, 100);
	fx_new(&f);
	ask(&f, "a.doh.test", &r1);
	cr_assert(run_until(f.base, &r1.calls, 1, WAIT_MS));
	assert_addr(&r1, 192, 0, 2, 44);
	cr_assert_eq(DNS_RCODE(r1.flags), DNS_R_NOERROR);
	ask(&f, "B.doh.TEST", &r2);  /* the case kept, compared case-insensitively */
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	cr_assert_eq(r2.err, 0, "err %d", r2.err);
	cr_assert_eq(DNS_RCODE(r2.flags), DNS_R_NXDOMAIN);
	st = stats(&f);
	cr_assert_eq(st.queries, 2);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(st.connects, 1, "the second ask reuses the connection");
	cr_assert_eq(st.timeouts + st.errors + st.bad_answers + st.http_errors + st.tls_failures, 0);
	cr_assert_eq(st.inflight, 0);
	fx_stop(&f);
}

Test(dns_doh, three_concurrent_asks_share_one_connection)
{
	struct res r[3] = { { 0 } };
	struct fx f;
	int n = 0;

	fx_start(&f, 100);
	fx_new(&f);
	for (int i = 0; i < 3; i++) {
		r[i].counter = &n;
		ask(&f, "a.doh.test", &r[i]);
	}
	cr_assert_eq(stats(&f).inflight, 3);
	cr_assert(run_until(f.base, &n, 3, WAIT_MS));
	for (int i = 0; i < 3; i++)
		assert_addr(&r[i], 192, 0, 2, 44);
	cr_assert_eq(stats(&f).connects, 1);
	cr_assert_eq(stats(&f).tries, 3);
	fx_stop(&f);
}

/* 200 asks at once: more than DNS_DOH_MAX_STREAMS, and a server allowing 8 streams. */
Test(dns_doh, many_asks_beyond_the_stream_limits)
{
	static struct res r[200];
	struct dns_doh_stats st;
	struct fx f;
	int n = 0;

	fx_start(&f, 8);
	fx_new(&f);
	memset(r, 0, sizeof(r));
	for (int i = 0; i < 200; i++) {
		r[i].counter = &n;
		ask(&f, "a.doh.test", &r[i]);
	}
	cr_assert(run_until(f.base, &n, 200, WAIT_MS * 2));
	for (int i = 0; i < 200; i++)
		assert_addr(&r[i], 192, 0, 2, 44);
	st = stats(&f);
	cr_assert_eq(st.connects, 1);
	/* Before the server's SETTINGS arrive, up to DNS_DOH_MAX_STREAMS streams may open; the
	 * server refuses those above its 8 (given back); after them, no more than 8. */
	cr_assert_leq(st.refused, DNS_DOH_MAX_STREAMS - 8, "refused %lu", (unsigned long)st.refused);
	cr_assert_eq(st.tries, 200 + st.refused, "no try lost or repeated");
	cr_assert_eq(st.errors + st.timeouts + st.http_errors + st.bad_answers, 0);
	cr_assert_eq(st.inflight, 0);
	fx_stop(&f);
}

/* ---- failures ---- */

static void expect_failure(struct fx *f, int err, uint64_t tls_failures)
{
	struct res r = { 0 };
	struct dns_doh_stats st;

	fx_new(f);
	ask(f, "a.doh.test", &r);
	cr_assert(run_until(f->base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, err, "err %d (%s), want %d", r.err, strerror(-r.err), err);
	st = stats(f);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(st.connects, 2, "each try on a new connection");
	cr_assert_eq(st.tls_failures, tls_failures);
	cr_assert_eq(st.errors, 2);
	cr_assert_eq(st.http_errors + st.bad_answers + st.timeouts, 0);
}

Test(dns_doh, certificate_for_another_name_fails)
{
	struct fx f;

	fx_start(&f, 100);
	strcpy(f.cfg.host, "other.test");
	expect_failure(&f, -EKEYREJECTED, 2);
	fx_stop(&f);
}

Test(dns_doh, unknown_ca_fails)
{
	struct fx f;

	fx_start(&f, 100);
	f.cfg.ca = f.ca_other;
	expect_failure(&f, -EKEYREJECTED, 2);
	fx_stop(&f);
}

Test(dns_doh, wrong_path_is_an_http_error)
{
	struct res r = { 0 };
	struct dns_doh_stats st;
	struct fx f;

	fx_start(&f, 100);
	strcpy(f.cfg.path, "/nope");
	fx_new(&f);
	ask(&f, "a.doh.test", &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -EBADMSG, "err %d", r.err);
	st = stats(&f);
	cr_assert_eq(st.http_errors, 2, "both tries answered 404");
	cr_assert_eq(st.connects, 1);
	cr_assert_eq(st.errors + st.tls_failures + st.timeouts + st.bad_answers, 0);
	fx_stop(&f);
}

/* A TLS server that offers no h2 (openssl s_server, ALPN http/1.1 only). */
Test(dns_doh, server_without_h2_fails)
{
	char port[8], cert[128], key[128];
	char *argv[] = { "openssl", "s_server", "-quiet", "-accept", port, "-cert", cert,
			 "-key", key, "-alpn", "http/1.1", NULL };
	struct fx f;

	fx_init(&f);
	snprintf(port, sizeof(port), "%u", f.port);
	snprintf(cert, sizeof(cert), "%s/srv.pem", f.dir);
	snprintf(key, sizeof(key), "%s/srv.key", f.dir);
	f.pid = spawn(argv);
	wait_listening(f.pid, f.port);
	expect_failure(&f, -EPROTO, 2);
	fx_stop(&f);
}

Test(dns_doh, nothing_listening_is_refused)
{
	struct res r = { 0 };
	struct dns_doh_stats st;
	struct fx f;

	fx_init(&f);
	fx_new(&f);
	ask(&f, "a.doh.test", &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -ECONNREFUSED, "err %d", r.err);
	st = stats(&f);
	cr_assert_eq(st.connects, 2);
	cr_assert_eq(st.errors, 2);
	cr_assert_eq(st.tls_failures + st.timeouts, 0);
	fx_stop(&f);
}

/* A server that accepts TCP and never speaks: each try times out. */
Test(dns_doh, silent_server_times_out)
{
	struct res r = { 0 };
	struct dns_doh_stats st;
	struct fx f;
	int lfd;
	int64_t t0;

	fx_init(&f);
	cr_assert_geq(lfd = listen_lo(f.port), 0);
	f.cfg.timeout_ms = 300;
	fx_new(&f);
	t0 = mono_ms();
	ask(&f, "a.doh.test", &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -ETIMEDOUT);
	cr_assert_geq(mono_ms() - t0, 550, "two tries of 300 ms");
	st = stats(&f);
	cr_assert_eq(st.timeouts, 2);
	cr_assert_eq(st.tries, 2);
	cr_assert_eq(st.connects, 2, "a silent connection is replaced");
	close(lfd);
	fx_stop(&f);
}

/* Eight asks on such a server: each fails by tries x timeout from when it was asked, however
 * often the dead connection is replaced and the others get their try back. */
Test(dns_doh, silent_server_fails_every_ask_within_its_tries)
{
	struct res r[8];
	struct fx f;
	int lfd, n = 0;
	int64_t t0, took;
	char name[32];

	memset(r, 0, sizeof(r));
	fx_init(&f);
	cr_assert_geq(lfd = listen_lo(f.port), 0);
	f.cfg.timeout_ms = 200;
	fx_new(&f);
	t0 = mono_ms();
	for (int i = 0; i < 8; i++) {
		snprintf(name, sizeof(name), "q%d.doh.test", i);
		r[i].counter = &n;
		ask(&f, name, &r[i]);
	}
	cr_assert(run_until(f.base, &n, 8, WAIT_MS), "%d of 8 failed in time", n);
	took = mono_ms() - t0;
	/* Before: up to 16 tries of 200 ms one after another (3.2 s). */
	cr_assert_lt(took, 2 * 200 + 400, "the last took %lld ms, want 400 (+ slack)",
		     (long long)took);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(r[i].err, -ETIMEDOUT, "ask %d: %d", i, r[i].err);
	cr_assert_leq(stats(&f).connects, 3, "%llu connections",
		      (unsigned long long)stats(&f).connects);
	close(lfd);
	fx_stop(&f);
}

/* Asks that arrive spread out over a silent server: a try cut short by its ask's deadline is no
 * proof that the connection is dead, so the stragglers finish on the connection that is open
 * instead of each voiding it and opening the next (one connection per deadline before). */
Test(dns_doh, silent_server_spread_asks_do_not_storm)
{
	struct res r[8];
	struct fx f;
	int lfd, n = 0;
	char name[32];

	memset(r, 0, sizeof(r));
	fx_init(&f);
	cr_assert_geq(lfd = listen_lo(f.port), 0);
	f.cfg.timeout_ms = 200;
	fx_new(&f);
	for (int i = 0; i < 8; i++) {
		snprintf(name, sizeof(name), "s%d.doh.test", i);
		r[i].counter = &n;
		ask(&f, name, &r[i]);
		run_until(f.base, NULL, -1, 12);
	}
	cr_assert(run_until(f.base, &n, 8, WAIT_MS), "%d of 8 failed in time", n);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(r[i].err, -ETIMEDOUT, "ask %d: %d", i, r[i].err);
	/* The first ask's two full tries void two connections; the rest end on the third. */
	cr_assert_eq(stats(&f).connects, 3, "%llu connections",
		     (unsigned long long)stats(&f).connects);
	close(lfd);
	fx_stop(&f);
}

/* A server that takes each connection, sends its SETTINGS and a GOAWAY with last stream id 0
 * (ENHANCE_YOUR_CALM), and reads until the client closes: every stream is refused unprocessed. */
static const char REFUSER_PY[] =
	"import socket, ssl, sys\n"
	"ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
	"ctx.load_cert_chain(sys.argv[2], sys.argv[3])\n"
	"ctx.set_alpn_protocols(['h2'])\n"
	"s = socket.socket()\n"
	"s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
	"s.bind(('127.0.0.1', int(sys.argv[1])))\n"
	"s.listen(16)\n"
	"while True:\n"
	"    c, _ = s.accept()\n"
	"    try:\n"
	"        t = ctx.wrap_socket(c, server_side=True)\n"
	"        t.sendall(bytes.fromhex('000000040000000000' '000008070000000000'\n"
	"                                '000000000000000b'))\n"
	"        t.settimeout(5)\n"
	"        while t.recv(65536):\n"
	"            pass\n"
	"    except Exception:\n"
	"        pass\n"
	"    c.close()\n";

/* A server that refuses every stream: an ask gets its try back for the first refusal of each
 * try only, so it ends by its tries (refused), promptly, instead of opening one connection
 * after another until its deadline and ending as a timeout. */
Test(dns_doh, server_refusing_every_stream_ends_the_ask_by_its_tries)
{
	struct res r = { 0 };
	struct dns_doh_stats st;
	struct fx f;
	char port[8], cert[128], key[128];
	char *argv[] = { "python3", "-c", (char *)REFUSER_PY, port, cert, key, NULL };
	int64_t t0;

	fx_init(&f);
	if (access("/usr/bin/python3", X_OK) != 0)
		cr_skip_test("no python3 for the refusing server");
	snprintf(port, sizeof(port), "%u", f.port);
	snprintf(cert, sizeof(cert), "%s/srv.pem", f.dir);
	snprintf(key, sizeof(key), "%s/srv.key", f.dir);
	f.pid = spawn(argv);
	wait_listening(f.pid, f.port);
	fx_new(&f);
	t0 = mono_ms();
	ask(&f, "a.doh.test", &r);
	cr_assert(run_until(f.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -ECONNREFUSED, "err %d", r.err);
	cr_assert_lt(mono_ms() - t0, f.cfg.timeout_ms, "ended by its tries, not a timeout");
	st = stats(&f);
	/* Two tries, each refused twice: the first refusal given back, the second counted. */
	cr_assert_eq(st.refused, 4);
	cr_assert_eq(st.tries, 4);
	cr_assert_eq(st.errors, 2);
	cr_assert_eq(st.connects, 4, "%llu connections", (unsigned long long)st.connects);
	cr_assert_eq(st.timeouts + st.http_errors + st.bad_answers + st.tls_failures, 0);
	fx_stop(&f);
}

Test(dns_doh, asks_are_bounded)
{
	static struct res r[DNS_DOH_MAX_ASKS + 1];
	struct dns_question q = question("a.doh.test", DNS_T_A);
	struct dns_doh_q *h;
	struct fx f;
	int lfd;

	fx_init(&f);
	cr_assert_geq(lfd = listen_lo(f.port), 0);
	fx_new(&f);
	memset(r, 0, sizeof(r));
	for (int i = 0; i < DNS_DOH_MAX_ASKS; i++)
		ask(&f, "a.doh.test", &r[i]);
	cr_assert_eq(dns_doh_ask(f.d, &q, on_res, &r[DNS_DOH_MAX_ASKS], &h), -ENOBUFS);
	q.nameable = false;
	cr_assert_eq(dns_doh_ask(f.d, &q, on_res, &r[0], &h), -EINVAL);
	cr_assert_eq(stats(&f).inflight, DNS_DOH_MAX_ASKS);
	run_until(f.base, NULL, -1, 100);
	close(lfd);
	fx_stop(&f);  /* frees with every ask pending */
	for (int i = 0; i <= DNS_DOH_MAX_ASKS; i++)
		cr_assert_eq(r[i].calls, 0);
}

Test(dns_doh, bad_config_is_refused)
{
	struct dns_doh_config c = { 0 };
	struct event_base *base = event_base_new();
	struct dns_doh *d = NULL;

	cr_assert_eq(netaddr_parse("127.0.0.1", &c.server.addr), 0);
	c.server.port = 443;
	strcpy(c.host, "doh.test");
	strcpy(c.path, "/dns-query");
	c.ca = "/nonexistent/ca.pem";
	cr_assert_eq(dns_doh_new(base, &c, &d), -ENOENT, "a ca file that is not there");
	c.ca = "/dev/null";
	cr_assert_eq(dns_doh_new(base, &c, &d), -EINVAL, "a ca file without a certificate");
	c.ca = NULL;
	strcpy(c.path, "dns-query");
	cr_assert_eq(dns_doh_new(base, &c, &d), -EINVAL, "a path without '/'");
	strcpy(c.path, "/dns query");
	cr_assert_eq(dns_doh_new(base, &c, &d), -EINVAL, "a space in the path");
	strcpy(c.path, "/dns-query");
	strcpy(c.host, "doh.test/x");
	cr_assert_eq(dns_doh_new(base, &c, &d), -EINVAL, "a host that is no name");
	strcpy(c.host, "");
	cr_assert_eq(dns_doh_new(base, &c, &d), -EINVAL, "no host");
	strcpy(c.host, "::1");
	cr_assert_eq(dns_doh_new(base, &c, &d), 0, "an address literal");
	dns_doh_free(d);
	event_base_free(base);
	CHECK_LEAKS();
}

/* The connection is lost with an ask on it: the ask takes its next try on a new connection. */
Test(dns_doh, lost_connection_retries_on_a_new_one)
{
	struct res r1 = { 0 }, r2 = { 0 };
	struct dns_doh_stats st;
	struct relay rl;
	struct fx f;

	fx_start(&f, 100);
	relay_start(&rl, f.base, f.port);
	f.cfg.server.port = local_port(rl.lfd);
	fx_new(&f);
	ask(&f, "a.doh.test", &r1);
	cr_assert(run_until(f.base, &r1.calls, 1, WAIT_MS));
	assert_addr(&r1, 192, 0, 2, 44);
	relay_hold(&rl);
	ask(&f, "a.doh.test", &r2);
	run_until(f.base, NULL, -1, 100);
	cr_assert_eq(r2.calls, 0, "answered though the server heard nothing");
	relay_cut(&rl);
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	assert_addr(&r2, 192, 0, 2, 44);
	st = stats(&f);
	cr_assert_eq(rl.accepted, 2);
	cr_assert_eq(st.connects, 2);
	cr_assert_eq(st.errors, 1, "the lost try");
	cr_assert_eq(st.tries, 3);
	cr_assert_eq(st.timeouts + st.http_errors + st.bad_answers + st.tls_failures, 0);
	dns_doh_free(f.d);
	f.d = NULL;
	relay_stop(&rl);
	fx_stop(&f);
}

static int count_sockets(void *arg, int fd, int family, int type)
{
	(void)fd;
	(void)family;
	(void)type;
	++*(int *)arg;
	return 0;
}

/* A new detour (a reload): the open connection, made through the old one, is closed and the
 * ask in flight on it is asked again on a new one through the new outbound, its try given
 * back; the same outbound again changes nothing. */
Test(dns_doh, new_detour_takes_the_asks_off_the_old_connection)
{
	struct ts_outbound a = { .type = TS_OUT_DIRECT }, b;
	struct res r1 = { 0 }, r2 = { 0 };
	struct dns_doh_stats st;
	struct relay rl;
	int na = 0, nb = 0;
	struct fx f;

	a.sock_hook.fn = count_sockets;
	a.sock_hook.arg = &na;
	b = a;
	b.sock_hook.arg = &nb;  /* which one opened a socket */
	b.domain_strategy = TS_DS_IPV4_ONLY;  /* configured otherwise (any field would do) */
	fx_start(&f, 100);
	relay_start(&rl, f.base, f.port);
	f.cfg.server.port = local_port(rl.lfd);
	f.cfg.detour = &a;
	fx_new(&f);
	ask(&f, "a.doh.test", &r1);
	cr_assert(run_until(f.base, &r1.calls, 1, WAIT_MS));
	cr_assert_eq(dns_doh_set_detour(f.d, &a), 0, "the same outbound");
	relay_hold(&rl);
	ask(&f, "a.doh.test", &r2);
	run_until(f.base, NULL, -1, 100);
	cr_assert_eq(r2.calls, 0, "answered though the server heard nothing");
	cr_assert_eq(dns_doh_set_detour(f.d, &b), 1);
	cr_assert_eq(r2.calls, 0, "no callback inside");
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	assert_addr(&r2, 192, 0, 2, 44);
	st = stats(&f);
	cr_assert_eq(na, 1, "the first connection through the old detour");
	cr_assert_eq(nb, 1, "the second through the new one");
	cr_assert_eq(rl.accepted, 2);
	cr_assert_eq(st.connects, 2);
	cr_assert_eq(st.tries, 3);
	cr_assert_eq(st.errors + st.timeouts + st.http_errors + st.bad_answers, 0);
	cr_assert_eq(st.tls_failures, 0);
	dns_doh_free(f.d);
	f.d = NULL;
	relay_stop(&rl);
	fx_stop(&f);
}

/* ---- cancel, idle, free ---- */

Test(dns_doh, cancel_before_and_on_a_stream)
{
	struct res r1 = { 0 }, r2 = { 0 }, r3 = { 0 }, r4 = { 0 };
	struct dns_doh_q *h;
	struct fx f;

	fx_start(&f, 100);
	fx_new(&f);
	ask(&f, "a.doh.test", &r1);
	h = ask(&f, "a.doh.test", &r2);
	dns_doh_cancel(f.d, h);          /* waiting for the connection */
	cr_assert(run_until(f.base, &r1.calls, 1, WAIT_MS));
	assert_addr(&r1, 192, 0, 2, 44);
	h = ask(&f, "a.doh.test", &r3);  /* the connection is up: a stream at once */
	event_base_loop(f.base, EVLOOP_NONBLOCK);
	dns_doh_cancel(f.d, h);          /* reset on its stream */
	cr_assert_eq(stats(&f).inflight, 0);
	ask(&f, "a.doh.test", &r4);
	cr_assert(run_until(f.base, &r4.calls, 1, WAIT_MS));
	assert_addr(&r4, 192, 0, 2, 44);
	run_until(f.base, NULL, -1, 100);
	cr_assert_eq(r2.calls + r3.calls, 0, "a cancelled ask's callback ran");
	cr_assert_eq(stats(&f).connects, 1, "a reset stream keeps the connection");
	fx_stop(&f);
}

Test(dns_doh, idle_connection_is_closed)
{
	struct res r1 = { 0 }, r2 = { 0 };
	struct fx f;
	int up;

	fx_start(&f, 100);
	f.cfg.idle_ms = 150;
	fx_new(&f);
	ask(&f, "a.doh.test", &r1);
	cr_assert(run_until(f.base, &r1.calls, 1, WAIT_MS));
	up = tu_dir_entries("/proc/self/fd");
	run_until(f.base, NULL, -1, 50);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), up, "the connection stays open while not idle");
	run_until(f.base, NULL, -1, 400);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), up - 1, "the idle connection is closed");
	ask(&f, "a.doh.test", &r2);
	cr_assert(run_until(f.base, &r2.calls, 1, WAIT_MS));
	assert_addr(&r2, 192, 0, 2, 44);
	cr_assert_eq(stats(&f).connects, 2);
	fx_stop(&f);
}

/* Asks still pending at the free (their connection mid-handshake: the relay in front of the
 * server stops passing what the upstream sends once it accepted the connection, so no answer
 * can come however fast the machine) are never called back. */
Test(dns_doh, free_with_asks_pending)
{
	struct res r[3] = { { 0 } };
	struct relay rl;
	struct fx f;

	fx_start(&f, 100);
	relay_start(&rl, f.base, f.port);
	f.cfg.server.port = local_port(rl.lfd);
	fx_new(&f);
	for (int i = 0; i < 3; i++)
		ask(&f, "a.doh.test", &r[i]);
	cr_assert(run_until(f.base, &rl.accepted, 1, WAIT_MS), "no connection to the server");
	relay_hold(&rl);
	run_until(f.base, NULL, -1, 5);  /* mid-handshake */
	for (int i = 0; i < 3; i++)
		cr_assert_eq(r[i].calls, 0, "ask %d answered before the free", i);
	dns_doh_free(f.d);
	f.d = NULL;
	run_until(f.base, NULL, -1, 200);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(r[i].calls, 0, "a callback after free");
	relay_stop(&rl);
	fx_stop(&f);
}

Test(dns_doh, free_from_a_callback)
{
	struct res r[3] = { { 0 } };
	struct fx f;
	int n = 0;

	fx_start(&f, 100);
	fx_new(&f);
	for (int i = 0; i < 3; i++) {
		r[i].counter = &n;
		r[i].free_me = &f.d;
		ask(&f, "a.doh.test", &r[i]);
	}
	cr_assert(run_until(f.base, &n, 1, WAIT_MS));
	cr_assert_null(f.d);
	run_until(f.base, NULL, -1, 200);
	cr_assert_eq(n, 1, "no callback after the upstream was freed");
	assert_addr(r[0].calls ? &r[0] : r[1].calls ? &r[1] : &r[2], 192, 0, 2, 44);
	fx_stop(&f);
}

/* ---- through the resolver, from a config ---- */

struct sreply {
	int calls;
	uint8_t msg[1024];
	size_t len;
};

static void on_sreply(void *arg, const uint8_t *msg, size_t len)
{
	struct sreply *g = arg;

	g->calls++;
	g->len = len < sizeof(g->msg) ? len : sizeof(g->msg);
	memcpy(g->msg, msg, g->len);
}

/* A client's query for a.doh.test A (id 0x4242, RD). */
static size_t client_query(uint8_t *b)
{
	static const uint8_t q[] = { 0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
				     1, 'a', 3, 'd', 'o', 'h', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1 };

	memcpy(b, q, sizeof(q));
	return sizeof(q);
}

/* dns.servers with an https:// address (a name and address_ip): the resolver asks through
 * DoH, and the client gets its own id back with the server's answer. */
Test(dns_doh, resolver_answers_through_an_https_server)
{
	struct budget_limits lim;
	struct budget *b;
	struct ts_config cfg;
	struct dns_server *s;
	struct dns_ticket *t;
	struct dns_server_stats st;
	struct sreply g = { 0 };
	struct fx f;
	char json[1024], err[256];
	uint8_t q[64];
	size_t n = client_query(q);

	fx_start(&f, 64);
	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&lim, &b), 0);
	snprintf(json, sizeof(json),
		 "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"doh\","
		 "\"address\":\"https://doh.test:%u/dns-query\",\"address_ip\":\"127.0.0.1\","
		 "\"ca\":\"%s\"}]}}", f.port, f.ca);
	config_init(&cfg);
	cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(dns_server_new(f.base, &cfg, b, &s), 0);
	cr_assert_eq(dns_server_query(s, q, n, false, 1472, on_sreply, &g, &t), 0);
	cr_assert(run_until(f.base, &g.calls, 1, 8000), "no reply");
	cr_assert_eq(tu_get16(g.msg), 0x4242, "the client's id (the DoH query had id 0)");
	cr_assert_eq(tu_get16(g.msg + 2) & 0xf, DNS_R_NOERROR);
	cr_assert_eq(tu_get16(g.msg + 6), 1, "one answer");
	cr_assert_eq(memcmp(g.msg + g.len - 4, "\xc0\x00\x02\x2c", 4), 0, "192.0.2.44");
	dns_server_get_stats(s, &st);
	cr_assert_eq(st.answered_upstream, 1);
	cr_assert_eq(st.upstream_queries, 1);
	dns_server_free(s);
	config_fini(&cfg);
	budget_free(b);
	fx_stop(&f);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* One DoH upstream's life: three asks answered in turn as streams of one connection, each
 * called back once with its answer, or refused at once (-ENOMEM: nothing called), or failed
 * for memory on its last try (never counted as a bad answer); one ask pending at the free is
 * never called; every descriptor comes back. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct fx *f = arg;
	struct dns_question q = question("a.doh.test", DNS_T_A);
	struct dns_doh_stats st;
	struct res pend = { 0 };
	struct dns_doh_q *h;
	int fds = tu_dir_entries("/proc/self/fd"), rc, answered = 0;

	f->d = NULL;
	if ((rc = dns_doh_new(f->base, &f->cfg, &f->d)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_doh_new: %d", rc);
		cr_assert_null(f->d);
		return;
	}
	for (int k = 0; k < 3; k++) {
		struct res r = { 0 };

		if ((rc = dns_doh_ask(f->d, &q, on_res, &r, &h)) != 0) {
			cr_assert(sweep && rc == -ENOMEM, "ask %d: %d", k, rc);
			continue;
		}
		cr_assert(run_until(f->base, &r.calls, 1, WAIT_MS), "ask %d: no callback", k);
		run_until(f->base, NULL, -1, 1); /* a second callback would show here */
		cr_assert_eq(r.calls, 1);
		if (r.err != 0) {
			cr_assert(sweep && r.err == -ENOMEM, "ask %d: %d", k, r.err);
			continue;
		}
		assert_addr(&r, 192, 0, 2, 44);
		answered++;
	}
	st = stats(f);
	cr_assert(sweep || answered == 3);
	cr_assert_eq(st.inflight, 0);
	cr_assert_eq(st.timeouts + st.http_errors + st.tls_failures + st.refused, 0);
	cr_assert_eq(st.bad_answers, 0, "an answer without memory is no bad answer");
	cr_assert(sweep || (st.connects == 1 && st.errors == 0), "one connection, reused");
	rc = dns_doh_ask(f->d, &q, on_res, &pend, &h);
	cr_assert(rc == 0 || (sweep && rc == -ENOMEM), "the pending ask: %d", rc);
	dns_doh_free(f->d);
	f->d = NULL;
	run_until(f->base, NULL, -1, 20);
	cr_assert_eq(pend.calls, 0, "an ask pending at the free was called");
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds, "a descriptor left open");
}

Test(dns_doh, each_allocation_refused_in_turn)
{
	struct fx f;

	fx_start(&f, 100);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &f, 4, 200));
	fx_stop(&f);
}

/* The same with OpenSSL and nghttp2 allocating through the project's allocator
 * (core/libmem.h), as twinstack runs them: the context, each handshake and record, the HTTP/2
 * session's frames, streams and header tables. Too many to refuse each in turn: about 1000
 * runs (a third of them under AddressSanitizer) refuse one each, spread evenly over the scenario, the project's own among them (those
 * are refused each in turn above), nghttp2's few at least once. A refusal inside a library
 * must end as one of the project's does: -ENOMEM, never a TLS failure, a bad answer or a
 * hang. */
Test(dns_doh, allocations_inside_openssl_and_nghttp2_refused_spread)
{
	struct libmem_stats ls;
	struct fx f;

	cr_assert_eq(libmem_install(), 0);
	fx_start(&f, 100);
	cr_log_info("%ld allocations, about %d refused",
		    failalloc_sweep_stride(nomem_scenario, &f, 500, FAILALLOC_SPREAD_RUNS(1000)),
		    FAILALLOC_SPREAD_RUNS(1000));
	libmem_get_stats(LIBMEM_OPENSSL, &ls);
	cr_assert_gt(ls.refused, 0, "no refusal reached OpenSSL");
	libmem_get_stats(LIBMEM_NGHTTP2, &ls);
	cr_log_info("%llu of nghttp2's refused", (unsigned long long)ls.refused);
	cr_assert_gt(ls.refused, 0, "no refusal reached nghttp2");
	fx_stop(&f);
}

/* ---- libevent's allocations refused in turn, a silent server (failalloc.h, evmem.h) ---- */

/* With evmem installed libevent allocates through the project's allocator: a try's timer
 * may find no room in the timer heap, which grows when its count reaches 8, 16, ... pending
 * timers. Each run has a fresh loop with `pad` far timers of the test's already pending, so
 * that the upstream's first timers (the connect's, then the try's) meet the heap's growth in
 * turn. The server accepts and never speaks: each of two asks, one after the other, must end
 * with -ETIMEDOUT within its tries (or, a refusal, -ENOMEM), never wait for good; every
 * descriptor comes back. */
struct silent_fx {
	struct fx *f;
	int pad;
};

static void silent_scenario(void *arg, bool sweep)
{
	const struct silent_fx *o = arg;
	struct dns_question q = question("a.doh.test", DNS_T_A);
	struct event *pads[16];
	struct dns_doh *d = NULL;
	struct event_base *base;
	struct res r[2] = { { 0 }, { 0 } };
	struct dns_doh_q *h;
	int fds = tu_dir_entries("/proc/self/fd"), rc, calls = 0;

	failalloc_hold(true); /* the loop */
	cr_assert_not_null(base = event_base_new());
	failalloc_hold(false);
	failalloc_pad_timers(base, pads, o->pad);
	if ((rc = dns_doh_new(base, &o->f->cfg, &d)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_doh_new: %d", rc);
		goto out;
	}
	/* One after the other: a second ask's timer would rescue a first one without. */
	for (int k = 0; k < 2; k++) {
		r[k].counter = &calls;
		if ((rc = dns_doh_ask(d, &q, on_res, &r[k], &h)) != 0) {
			cr_assert(sweep && rc == -ENOMEM, "ask %d: %d", k, rc);
			r[k].calls = 1;
			r[k].err = -ENOMEM;
			calls++;
		}
		cr_assert(run_until(base, &calls, k + 1, 2000), "ask %d never ended (pad %d)", k,
			  o->pad);
	}
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(r[k].calls, 1);
		cr_assert(r[k].err == -ETIMEDOUT || (sweep && r[k].err == -ENOMEM),
			  "ask %d: %d", k, r[k].err);
	}
	dns_doh_free(d);
out:
	failalloc_unpad(pads, o->pad);
	failalloc_hold(true);
	event_base_free(base);
	failalloc_hold(false);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds, "a descriptor left open");
}

Test(dns_doh, silent_with_libevent_allocations_refused_in_turn)
{
	static const int pads[] = { 0, 7, 8 };
	struct fx f;
	int lfd;

	fx_init(&f);
	cr_assert_geq(lfd = listen_lo(f.port), 0);
	f.cfg.timeout_ms = 30;
	cr_assert_eq(evmem_install(), 0);
	for (size_t i = 0; i < sizeof(pads) / sizeof(pads[0]); i++) {
		struct silent_fx o = { &f, pads[i] };

		cr_log_info("pad %d: %ld allocations refused in turn", pads[i],
			    failalloc_sweep(silent_scenario, &o, 3, 300));
	}
	close(lfd);
	fx_stop(&f);
}
