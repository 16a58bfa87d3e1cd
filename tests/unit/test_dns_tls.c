/* test_dns_tls.c — DNS over TLS (RFC 7858) upstreams of dns/upstream.c against a real unbound
 * serving TLS on 127.0.0.1, with certificates made for the test by the openssl command:
 *
 *   test ──dns_upstream_ask──► upstream ──TCP+TLS──► unbound 127.0.0.1:<port>
 *                                                    (tls-service-pem: CN/SAN dot.test,
 *                                                     signed by the test's own CA;
 *                                                     local-data a.dot.test. A 192.0.2.53)
 *
 * Cases: an answer with the right CA and name; pipelined asks on one TLS connection; a wrong
 * name and an untrusted CA fail verification (-EKEYREJECTED, tls_failures, no answer); a plain
 * TCP talker and a plain DNS server (dnsmasq) on the port never get a plaintext query through;
 * DoT through a SOCKS5 proxy (microsocks); bytes an HTTP proxy sends before our ClientHello
 * fail the connection; dns_upstream_new refuses a missing sni and a bad ca file. Every wait
 * is bounded.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/dns_msg.h"
#include "core/libmem.h"
#include "dns/server.h"
#include "dns/upstream.h"
#include "failalloc.h"
#include "testutil.h"

#define WAIT_MS 5000
#define UNBOUND "/usr/sbin/unbound"

/* ---- helpers ---- */

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int bind_lo(int type, uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0), one = 1;

	cr_assert_geq(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* A port free for both UDP and TCP on 127.0.0.1. */
static uint16_t free_port(void)
{
	for (int i = 0; i < 50; i++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int u = bind_lo(SOCK_DGRAM, 0), t;

		cr_assert_geq(u, 0);
		cr_assert_eq(getsockname(u, (struct sockaddr *)&sa, &sl), 0);
		t = bind_lo(SOCK_STREAM, ntohs(sa.sin_port));
		close(u);
		if (t >= 0) {
			close(t);
			return ntohs(sa.sin_port);
		}
	}
	cr_assert_fail("no free port");
	return 0;
}

/* A child running argv (output to /dev/null), killed if the test process dies. */
static pid_t spawn(char *const argv[])
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		prctl(PR_SET_PDEATHSIG, SIGKILL);  /* a failed test leaves no server behind */
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

	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
}

/* Until something accepts TCP connections on 127.0.0.1:port (bounded). */
static void wait_listening(uint16_t port)
{
	int64_t until = mono_ms() + WAIT_MS;

	while (!tu_lo_accepts(port)) {
		cr_assert_lt(mono_ms(), until, "nothing listens on port %u", port);
		usleep(20000);
	}
}

/* The child pid is the one that listens on port and stays up: it accepts, is still running
 * 200 ms later and accepts again. false, the child gone (reaped), when it exits first or the
 * port stops answering: the port was taken between free_port() and its bind, by a test
 * running beside this one. */
static bool child_serves(pid_t pid, uint16_t port)
{
	int64_t until = mono_ms() + WAIT_MS;
	int status;

	while (!tu_lo_accepts(port)) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return false;
		cr_assert_lt(mono_ms(), until, "nothing listens on port %u", port);
		usleep(20000);
	}
	usleep(200000);
	if (waitpid(pid, &status, WNOHANG) == pid)
		return false;
	if (tu_lo_accepts(port))
		return true;
	kill(pid, SIGTERM);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	return false;
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	cr_assert(n > 0 && (size_t)n < sizeof(cmd));
	cr_assert_eq(system(cmd), 0, "failed: %s", cmd);
}

/* ---- the fixture: certificates and unbound ---- */

struct dot {
	char dir[64];
	char ca[96], other_ca[96];
	uint16_t port;
	pid_t pid;
	struct event_base *base;
};

/* A CA, a server certificate for dot.test signed by it, and an unrelated second CA. */
static void make_certs(struct dot *d)
{
	const char *key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";

	sh("cd %s && openssl req -x509 %s -keyout ca.key -out ca.pem -days 2 "
	   "-subj /CN=twinstack-test-ca 2>/dev/null", d->dir, key);
	sh("cd %s && openssl req -x509 %s -keyout other.key -out other-ca.pem -days 2 "
	   "-subj /CN=twinstack-other-ca 2>/dev/null", d->dir, key);
	sh("cd %s && openssl req %s -keyout srv.key -out srv.csr -subj /CN=dot.test 2>/dev/null && "
	   "printf 'subjectAltName=DNS:dot.test\\n' >ext.cnf && "
	   "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem "
	   "-days 2 -extfile ext.cnf 2>/dev/null", d->dir, key);
	snprintf(d->ca, sizeof(d->ca), "%s/ca.pem", d->dir);
	snprintf(d->other_ca, sizeof(d->other_ca), "%s/other-ca.pem", d->dir);
}

/* unbound answering a.dot.test from local data only, DNS over TLS on port (plain UDP there
 * too, unused). */
static void start_unbound(struct dot *d)
{
	char conf[128];
	char *argv[] = { UNBOUND, "-d", "-c", conf, NULL };
	FILE *f;

	snprintf(conf, sizeof(conf), "%s/unbound.conf", d->dir);
	cr_assert_not_null(f = fopen(conf, "w"));
	fprintf(f, "server:\n"
		   "\tinterface: 127.0.0.1@%u\n\ttls-port: %u\n"
		   "\ttls-service-key: \"%s/srv.key\"\n\ttls-service-pem: \"%s/srv.pem\"\n"
		   "\tdo-daemonize: no\n\tchroot: \"\"\n\tusername: \"\"\n\tdirectory: \"%s\"\n"
		   "\tpidfile: \"\"\n\tuse-syslog: no\n\tlogfile: \"\"\n\tdo-ip6: no\n"
		   "\tnum-threads: 1\n\tmodule-config: \"iterator\"\n"
		   "\tauto-trust-anchor-file: \"\"\n\taccess-control: 127.0.0.0/8 allow\n"
		   "\tdo-not-query-localhost: yes\n"
		   "\tlocal-zone: \"dot.test.\" static\n"
		   "\tlocal-data: \"a.dot.test. A 192.0.2.53\"\n"
		   "remote-control:\n\tcontrol-enable: no\n",
		d->port, d->port, d->dir, d->dir, d->dir);
	cr_assert_eq(fclose(f), 0);
	d->pid = spawn(argv);
}

static void dot_start(struct dot *d, bool unbound)
{
	memset(d, 0, sizeof(*d));
	if (unbound && access(UNBOUND, X_OK) != 0)
		cr_skip_test("unbound not installed (Debian package unbound; scripts/setup.sh "
			     "installs it)");
	if (access("/usr/bin/openssl", X_OK) != 0)
		cr_skip_test("the openssl command is not installed");
	strcpy(d->dir, "/tmp/ts-dot-XXXXXX");
	cr_assert_not_null(mkdtemp(d->dir));
	make_certs(d);
	d->port = free_port();
	/* A port can be taken by a test running beside this one before unbound binds it: then
	 * unbound exits (or another listener answered), and a fresh port is tried. */
	for (int tries = 0; unbound; tries++) {
		start_unbound(d);
		if (child_serves(d->pid, d->port))
			break;
		d->pid = 0;
		cr_assert_lt(tries, 4, "unbound did not stay up on 5 ports in turn");
		d->port = free_port();
	}
	cr_assert_not_null(d->base = event_base_new());
}

static void dot_stop(struct dot *d)
{
	reap(d->pid);
	event_base_free(d->base);
	sh("rm -rf %s", d->dir);
	CHECK_LEAKS();
}

/* ---- asking ---- */

struct res {
	int calls, err;
	uint8_t addr[4];
	int *counter;
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
	cr_assert(err == 0 || (!msg && !a), "an error with an answer");
	if (err == 0)
		cr_assert(first_a(msg, len, a, r->addr), "no A record in the answer");
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

static bool run_until(struct event_base *base, const int *calls, int want, int ms)
{
	bool expired = false;
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	struct event *guard = evtimer_new(base, on_guard, &expired);

	evtimer_add(guard, &tv);
	while (!expired && *calls < want)
		event_base_loop(base, EVLOOP_ONCE);
	event_free(guard);
	return *calls >= want;
}

static struct dns_upstream *dot_upstream(struct dot *d, const char *sni, const char *ca,
					 uint32_t tries)
{
	struct dns_upstream_config cfg = { .kind = DNS_UP_TLS, .timeout_ms = 2000,
					   .tries = tries, .sni = sni, .ca = ca };
	struct dns_upstream *u = NULL;
	int ret;

	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cfg.server.port = d->port;
	ret = dns_upstream_new(d->base, &cfg, &u);
	cr_assert_eq(ret, 0, "dns_upstream_new: %s", strerror(-ret));
	return u;
}

static void ask(struct dns_upstream *u, const char *name, struct res *r)
{
	struct dns_question q;
	struct dns_uq *h;

	memset(&q, 0, sizeof(q));
	snprintf(q.name, sizeof(q.name), "%s", name);
	q.name_len = strlen(q.name);
	q.nameable = true;
	q.qtype = DNS_T_A;
	q.qclass = 1;
	cr_assert_eq(dns_upstream_ask(u, &q, on_res, r, &h), 0);
	cr_assert_eq(r->calls, 0, "callback ran inside dns_upstream_ask");
}

static struct dns_upstream_stats stats(const struct dns_upstream *u)
{
	struct dns_upstream_stats st;

	dns_upstream_get_stats(u, &st);
	return st;
}

static void assert_answer(const struct res *r)
{
	static const uint8_t want[4] = { 192, 0, 2, 53 };

	cr_assert_eq(r->calls, 1);
	cr_assert_eq(r->err, 0, "err %d (%s)", r->err, strerror(-r->err));
	cr_assert_arr_eq(r->addr, want, 4);
}

/* An ask that must fail as a certificate that did not verify, on every try. */
static void assert_rejected(struct dot *d, const char *sni, const char *ca)
{
	struct dns_upstream *u = dot_upstream(d, sni, ca, 2);
	struct res r = { 0 };
	struct dns_upstream_stats st;

	ask(u, "a.dot.test", &r);
	cr_assert(run_until(d->base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -EKEYREJECTED, "err %d (%s)", r.err, strerror(-r.err));
	st = stats(u);
	cr_assert_eq(st.tls_failures, 2, "one failed handshake per try");
	cr_assert_eq(st.tcp_connects, 2);
	cr_assert_eq(st.errors, 2);
	cr_assert_eq(st.timeouts, 0);
	dns_upstream_free(u);
}

/* ---- cases ---- */

Test(dns_tls, answer_with_the_right_ca_and_name)
{
	struct dot d;
	struct dns_upstream *u;
	struct res r = { 0 };
	struct dns_upstream_stats st;

	dot_start(&d, true);
	u = dot_upstream(&d, "dot.test", d.ca, 2);
	ask(u, "a.dot.test", &r);
	cr_assert(run_until(d.base, &r.calls, 1, WAIT_MS), "no answer");
	assert_answer(&r);
	st = stats(u);
	cr_assert_eq(st.tls_failures, 0);
	cr_assert_eq(st.tcp_connects, 1);
	cr_assert_eq(st.tries, 1);
	cr_assert_eq(st.bad_answers, 0);
	dns_upstream_free(u);
	dot_stop(&d);
}

/* RFC 7858 section 3.3: queries pipelined on one connection; it stays up for the next ones. */
Test(dns_tls, pipelined_asks_share_one_tls_connection)
{
	struct dot d;
	struct dns_upstream *u;
	struct res r[4] = { 0 };
	int n = 0;

	dot_start(&d, true);
	u = dot_upstream(&d, "dot.test", d.ca, 1);
	for (int i = 0; i < 3; i++) {
		r[i].counter = &n;
		ask(u, "a.dot.test", &r[i]);
	}
	cr_assert(run_until(d.base, &n, 3, WAIT_MS), "%d of 3 answered", n);
	for (int i = 0; i < 3; i++)
		assert_answer(&r[i]);
	r[3].counter = &n;
	ask(u, "a.dot.test", &r[3]);
	cr_assert(run_until(d.base, &n, 4, WAIT_MS));
	assert_answer(&r[3]);
	cr_assert_eq(stats(u).tcp_connects, 1, "one TLS connection for all four");
	cr_assert_eq(stats(u).tls_failures, 0);
	dns_upstream_free(u);
	dot_stop(&d);
}

Test(dns_tls, wrong_name_is_rejected)
{
	struct dot d;

	dot_start(&d, true);
	assert_rejected(&d, "other.test", d.ca);
	dot_stop(&d);
}

Test(dns_tls, untrusted_ca_is_rejected)
{
	struct dot d;

	dot_start(&d, true);
	assert_rejected(&d, "dot.test", d.other_ca);
	dot_stop(&d);
}

/* The system's store does not hold the test's CA: rejected too. */
Test(dns_tls, system_store_does_not_trust_the_test_ca)
{
	struct dot d;

	dot_start(&d, true);
	assert_rejected(&d, "dot.test", NULL);
	dot_stop(&d);
}

/* A server that speaks plain DNS framing at once: the bytes are no TLS record, the handshake
 * fails with -EPROTO and nothing is taken as an answer. */
struct plain {
	int fds[4];
	int n;
};

static void on_plain_accept(evutil_socket_t fd, short what, void *arg)
{
	/* A framed DNS header: id 0, a response, no records. */
	static const uint8_t frame[14] = { 0, 12, 0, 0, 0x81, 0x80 };
	struct plain *p = arg;
	int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

	if (c < 0)
		return;
	cr_assert_lt(p->n, 4);
	p->fds[p->n++] = c;  /* kept open: the client reads the frame, not a reset */
	cr_assert_eq(send(c, frame, sizeof(frame), MSG_NOSIGNAL), (ssize_t)sizeof(frame));
}

Test(dns_tls, plain_tcp_server_is_never_taken_for_tls)
{
	struct dot d;
	struct dns_upstream *u;
	struct res r = { 0 };
	struct event *ev;
	struct plain p = { .n = 0 };
	int lfd;

	dot_start(&d, false);
	cr_assert_geq(lfd = bind_lo(SOCK_STREAM, d.port), 0);
	cr_assert_eq(listen(lfd, 8), 0);
	ev = event_new(d.base, lfd, EV_READ | EV_PERSIST, on_plain_accept, &p);
	event_add(ev, NULL);
	u = dot_upstream(&d, "dot.test", d.ca, 2);
	ask(u, "a.dot.test", &r);
	cr_assert(run_until(d.base, &r.calls, 1, WAIT_MS));
	cr_assert_neq(r.err, 0, "a plain server answered a TLS upstream");
	cr_assert_eq(r.err, -EPROTO, "err %d (%s)", r.err, strerror(-r.err));
	cr_assert_eq(p.n, 2, "one connection per try");
	cr_assert_eq(stats(u).tls_failures, 2);
	cr_assert_eq(stats(u).bad_answers + stats(u).late_answers, 0, "plain bytes read as DNS");
	dns_upstream_free(u);
	event_free(ev);
	close(lfd);
	for (int i = 0; i < p.n; i++)
		close(p.fds[i]);
	dot_stop(&d);
}

/* A real plain DNS server (dnsmasq, TCP on the port): it waits for a frame as long as the
 * ClientHello's first bytes say; the try times out, no plaintext query ever goes. */
Test(dns_tls, plain_dns_server_gets_no_plaintext_query)
{
	char portarg[32];
	char *argv[] = { "dnsmasq", "--no-daemon", portarg, "--listen-address=127.0.0.1",
			 "--bind-interfaces", "--no-resolv", "--no-hosts",
			 "--address=/dot.test/192.0.2.7", "-C", "/dev/null", NULL };
	struct dns_upstream_config cfg = { .kind = DNS_UP_TLS, .timeout_ms = 500, .tries = 1,
					   .sni = "dot.test" };
	struct dns_upstream *u;
	struct res r = { 0 };
	struct dot d;

	if (access("/usr/sbin/dnsmasq", X_OK) != 0)
		cr_skip_test("dnsmasq not installed");
	dot_start(&d, false);
	cfg.ca = d.ca;
	snprintf(portarg, sizeof(portarg), "--port=%u", d.port);
	d.pid = spawn(argv);
	wait_listening(d.port);
	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cfg.server.port = d.port;
	cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), 0);
	ask(u, "a.dot.test", &r);
	cr_assert(run_until(d.base, &r.calls, 1, WAIT_MS));
	cr_assert_neq(r.err, 0, "a plain DNS server answered a TLS upstream");
	cr_assert_eq(stats(u).bad_answers, 0);
	dns_upstream_free(u);
	dot_stop(&d);
}

/* DNS over TLS through a SOCKS5 proxy (microsocks): the TLS session runs end to end. */
Test(dns_tls, through_a_socks5_outbound)
{
	struct ts_outbound ob = { .type = TS_OUT_SOCKS5, .has_server = true };
	struct dns_upstream_config cfg = { .kind = DNS_UP_TLS, .timeout_ms = 2000, .tries = 1,
					   .sni = "dot.test", .detour = &ob };
	char portarg[8];
	char *argv[] = { "microsocks", "-i", "127.0.0.1", "-p", portarg, NULL };
	struct dns_upstream *u;
	struct res r = { 0 };
	struct dot d;
	pid_t pid;

	if (access("/usr/bin/microsocks", X_OK) != 0)
		cr_skip_test("microsocks not installed");
	dot_start(&d, true);
	ob.server.is_addr = true;
	strcpy(ob.server.host, "127.0.0.1");
	cr_assert_eq(netaddr_parse("127.0.0.1", &ob.server.addr), 0);
	ob.server.port = free_port();
	snprintf(portarg, sizeof(portarg), "%u", ob.server.port);
	pid = spawn(argv);
	wait_listening(ob.server.port);
	cfg.ca = d.ca;
	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cfg.server.port = d.port;
	cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), 0);
	ask(u, "a.dot.test", &r);
	cr_assert(run_until(d.base, &r.calls, 1, WAIT_MS), "no answer");
	assert_answer(&r);
	cr_assert_eq(stats(u).tls_failures, 0);
	dns_upstream_free(u);
	reap(pid);
	dot_stop(&d);
}

/* A fake HTTP proxy that answers CONNECT and sends bytes of its own right after the head: they
 * cannot be the server's TLS records (nothing was sent to it yet). */
struct fake_http {
	struct event_base *base;
	struct event *cev[2];
	int fds[2];
	int n;
};

static void on_http_read(evutil_socket_t fd, short what, void *arg)
{
	static const char reply[] = "HTTP/1.1 200 Connection established\r\n\r\n\x16\x03\x03";
	char buf[1024];
	ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);

	if (n <= 0)
		return;
	buf[n] = 0;
	if (strstr(buf, "\r\n\r\n"))
		cr_assert_eq(send(fd, reply, sizeof(reply) - 1, MSG_NOSIGNAL),
			     (ssize_t)sizeof(reply) - 1);
}

static void on_http_accept(evutil_socket_t fd, short what, void *arg)
{
	struct fake_http *h = arg;
	int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

	if (c < 0)
		return;
	cr_assert_lt(h->n, 2);
	h->fds[h->n] = c;
	h->cev[h->n] = event_new(h->base, c, EV_READ | EV_PERSIST, on_http_read, h);
	event_add(h->cev[h->n++], NULL);
}

Test(dns_tls, early_bytes_from_a_proxy_fail_the_connection)
{
	struct ts_outbound ob = { .type = TS_OUT_HTTP, .has_server = true };
	struct fake_http h = { .n = 0 };
	struct dns_upstream *u;
	struct res r = { 0 };
	struct event *lev;
	struct dot d;
	int lfd;

	dot_start(&d, false);
	h.base = d.base;
	ob.server.is_addr = true;
	strcpy(ob.server.host, "127.0.0.1");
	cr_assert_eq(netaddr_parse("127.0.0.1", &ob.server.addr), 0);
	ob.server.port = free_port();
	cr_assert_geq(lfd = bind_lo(SOCK_STREAM, ob.server.port), 0);
	cr_assert_eq(listen(lfd, 8), 0);
	lev = event_new(d.base, lfd, EV_READ | EV_PERSIST, on_http_accept, &h);
	event_add(lev, NULL);
	{
		struct dns_upstream_config cfg = { .kind = DNS_UP_TLS, .timeout_ms = 2000,
						   .tries = 2, .sni = "dot.test", .ca = d.ca,
						   .detour = &ob };

		cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
		cfg.server.port = d.port;
		cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), 0);
	}
	ask(u, "a.dot.test", &r);
	cr_assert(run_until(d.base, &r.calls, 1, WAIT_MS));
	cr_assert_eq(r.err, -EPROTO, "err %d (%s)", r.err, strerror(-r.err));
	cr_assert_eq(h.n, 2, "one proxied connection per try");
	cr_assert_eq(stats(u).tls_failures, 2);
	dns_upstream_free(u);
	for (int i = 0; i < h.n; i++) {
		event_free(h.cev[i]);
		close(h.fds[i]);
	}
	event_free(lev);
	close(lfd);
	dot_stop(&d);
}

/* ---- through the resolver: dns.servers with a tls:// address ---- */

struct reply {
	int calls;
	uint8_t msg[512];
	size_t len;
};

static void on_reply(void *arg, const uint8_t *msg, size_t len)
{
	struct reply *g = arg;

	g->calls++;
	g->len = len < sizeof(g->msg) ? len : sizeof(g->msg);
	memcpy(g->msg, msg, g->len);
}

/* A client's query for a.dot.test A (id 0x1234, RD). */
static size_t client_query(uint8_t *b)
{
	static const uint8_t q[] = { 0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0,
				     1, 'a', 3, 'd', 'o', 't', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1 };

	memcpy(b, q, sizeof(q));
	return sizeof(q);
}

/* The resolver built from a config naming sni; the reply's rcode and the server's stats. */
static void resolve_via_config(struct dot *d, const char *sni, struct reply *g,
			       struct dns_server_stats *st)
{
	struct budget_limits lim;
	struct budget *b;
	struct ts_config cfg;
	struct dns_server *s;
	struct dns_ticket *t;
	char json[1024], err[256];
	uint8_t q[64];
	size_t n = client_query(q);

	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&lim, &b), 0);
	snprintf(json, sizeof(json),
		 "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"dot\","
		 "\"address\":\"tls://127.0.0.1:%u\",\"sni\":\"%s\",\"ca\":\"%s\"}]}}",
		 d->port, sni, d->ca);
	config_init(&cfg);
	cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(dns_server_new(d->base, &cfg, b, &s), 0);
	cr_assert_eq(dns_server_query(s, q, n, false, 1472, on_reply, g, &t), 0);
	cr_assert(run_until(d->base, &g->calls, 1, 3 * WAIT_MS), "no reply");
	dns_server_get_stats(s, st);
	dns_server_free(s);
	config_fini(&cfg);
	budget_free(b);
}

Test(dns_tls, resolver_answers_through_a_tls_server)
{
	static const uint8_t want[4] = { 192, 0, 2, 53 };
	struct dns_server_stats st;
	struct reply g = { 0 };
	struct dot d;

	dot_start(&d, true);
	resolve_via_config(&d, "dot.test", &g, &st);
	cr_assert_geq(g.len, 12 + 16 + 16);
	cr_assert_eq(tu_get16(g.msg), 0x1234);
	cr_assert_eq(tu_get16(g.msg + 2) & 0xf, DNS_R_NOERROR);
	cr_assert_eq(tu_get16(g.msg + 6), 1, "one answer");
	cr_assert_arr_eq(g.msg + g.len - 4, want, 4, "the A record's address");
	cr_assert_eq(st.answered_upstream, 1);
	cr_assert_eq(st.upstream_tls_failures, 0);
	dot_stop(&d);
}

Test(dns_tls, resolver_servfails_when_the_certificate_is_for_another_name)
{
	struct dns_server_stats st;
	struct reply g = { 0 };
	struct dot d;

	dot_start(&d, true);
	resolve_via_config(&d, "other.test", &g, &st);
	cr_assert_geq(g.len, 12);
	cr_assert_eq(tu_get16(g.msg + 2) & 0xf, DNS_R_SERVFAIL);
	cr_assert_eq(tu_get16(g.msg + 6), 0, "no answer");
	cr_assert_eq(st.answered_upstream, 0);
	cr_assert_eq(st.upstream_tls_failures, 2, "one failed handshake per try");
	dot_stop(&d);
}

Test(dns_tls, bad_configs_are_refused)
{
	struct dns_upstream_config cfg = { .kind = DNS_UP_TLS, .sni = "dot.test" };
	struct dns_upstream *u = NULL;
	struct dot d;
	char path[128];
	FILE *f;

	dot_start(&d, false);
	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cfg.server.port = 853;
	cfg.sni = NULL;
	cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), -EINVAL, "no sni");
	cfg.sni = "";
	cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), -EINVAL, "an empty sni");
	cfg.sni = "dot.test";
	snprintf(path, sizeof(path), "%s/missing.pem", d.dir);
	cfg.ca = path;
	cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), -ENOENT, "a missing ca file");
	snprintf(path, sizeof(path), "%s/junk.pem", d.dir);
	cr_assert_not_null(f = fopen(path, "w"));
	fputs("not a certificate\n", f);
	fclose(f);
	cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), -EINVAL, "a ca file without a cert");
	cr_assert_null(u);
	cfg.ca = d.ca;
	cr_assert_eq(dns_upstream_new(d.base, &cfg, &u), 0);
	dns_upstream_free(u);
	dot_stop(&d);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* One DoT upstream's life: three asks answered in turn on one TLS connection, each called
 * back once with its answer, or refused at once (-ENOMEM: nothing called), or failed for
 * memory on its last try; one ask pending at the free is never called; every descriptor
 * comes back. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct dot *d = arg;
	struct dns_upstream_config cfg = { .kind = DNS_UP_TLS, .timeout_ms = 2000, .tries = 2,
					   .sni = "dot.test", .ca = d->ca };
	static const uint8_t want[4] = { 192, 0, 2, 53 };
	struct dns_upstream_stats st;
	struct dns_upstream *u = NULL;
	struct res pend = { 0 };
	struct dns_question q;
	struct dns_uq *h;
	int fds = tu_dir_entries("/proc/self/fd"), rc, answered = 0, never = 0;

	cr_assert_eq(netaddr_parse("127.0.0.1", &cfg.server.addr), 0);
	cfg.server.port = d->port;
	if ((rc = dns_upstream_new(d->base, &cfg, &u)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_upstream_new: %d", rc);
		cr_assert_null(u);
		return;
	}
	memset(&q, 0, sizeof(q));
	strcpy(q.name, "a.dot.test");
	q.name_len = strlen(q.name);
	q.nameable = true;
	q.qtype = DNS_T_A;
	q.qclass = 1;
	for (int k = 0; k < 3; k++) {
		struct res r = { 0 };

		if ((rc = dns_upstream_ask(u, &q, on_res, &r, &h)) != 0) {
			cr_assert(sweep && rc == -ENOMEM, "ask %d: %d", k, rc);
			continue;
		}
		cr_assert(run_until(d->base, &r.calls, 1, WAIT_MS), "ask %d: no callback", k);
		run_until(d->base, &never, 1, 1); /* a second callback would show here */
		cr_assert_eq(r.calls, 1);
		if (r.err != 0) {
			cr_assert(sweep && r.err == -ENOMEM, "ask %d: %d", k, r.err);
			continue;
		}
		cr_assert_arr_eq(r.addr, want, 4);
		answered++;
	}
	st = stats(u);
	cr_assert(sweep || answered == 3);
	cr_assert_eq(st.inflight, 0);
	cr_assert_eq(st.timeouts + st.bad_answers + st.late_answers + st.tls_failures, 0);
	cr_assert(sweep || (st.tcp_connects == 1 && st.errors == 0), "one connection, reused");
	rc = dns_upstream_ask(u, &q, on_res, &pend, &h);
	cr_assert(rc == 0 || (sweep && rc == -ENOMEM), "the pending ask: %d", rc);
	dns_upstream_free(u);
	run_until(d->base, &never, 1, 20);
	cr_assert_eq(pend.calls, 0, "an ask pending at the free was called");
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds, "a descriptor left open");
}

Test(dns_tls, each_allocation_refused_in_turn)
{
	struct dot d;

	dot_start(&d, true);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &d, 4, 200));
	dot_stop(&d);
}

/* The same with OpenSSL allocating through the project's allocator (core/libmem.h), as
 * twinstack runs it: the context, its trust anchors, each handshake and record. Too many to
 * refuse each in turn (the context's and the certificate checks' most of them): about 1000
 * runs (a third of them under AddressSanitizer) refuse one each, spread evenly over the scenario, the project's own among them (those
 * are refused each in turn above). A refusal inside OpenSSL must end as one of the project's
 * does: -ENOMEM, never a TLS failure of the server's (tls_failures) or a hang, and must not
 * break later handshakes. */
Test(dns_tls, allocations_inside_openssl_refused_spread)
{
	struct libmem_stats ls;
	struct dot d;

	cr_assert_eq(libmem_install(), 0);
	dot_start(&d, true);
	cr_log_info("%ld allocations, about %d refused",
		    failalloc_sweep_stride(nomem_scenario, &d, 500, FAILALLOC_SPREAD_RUNS(1000)),
		    FAILALLOC_SPREAD_RUNS(1000));
	libmem_get_stats(LIBMEM_OPENSSL, &ls);
	cr_assert_gt(ls.refused, 0, "no refusal reached OpenSSL");
	dot_stop(&d);
}
