/* test_stats.c — the stats endpoint for real: an evhttp server on 127.0.0.1 port 0 runs its
 * event loop in a thread; the test is a plain-socket HTTP client. Status codes, headers, bodies
 * (JSON parsed with cJSON), freshness per request, 404/405/500, loopback-only binding. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#include "core/clock.h"
#include "core/evmem.h"
#include "core/rss.h"
#include "core/stats_http.h"
#include "failalloc.h"
#include "testutil.h"

struct server {
	struct event_base *base;
	struct stats_http *http;
	struct event *stop_ev;
	int stop_pipe[2];
	pthread_t thread;
	bool running;
	atomic_int calls;   /* provider invocations */
	atomic_bool bad;    /* make the provider add an invalid key */
};

static void provider(void *arg, struct stats_doc *d)
{
	struct server *s = arg;
	int n = atomic_fetch_add(&s->calls, 1) + 1;

	stats_doc_add_str(d, "stack", "system");
	stats_doc_gauge(d, "uptime_s", 7);
	stats_doc_counter(d, "tun.rx_packets", (uint64_t)n);
	stats_doc_counter(d, "drops.malformed", 0);
	stats_doc_gauge(d, "nat.active", 3);
	if (atomic_load(&s->bad))
		stats_doc_gauge(d, "bad key", 1);
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
	event_base_loopbreak(arg);
}

static void *loop_thread(void *arg)
{
	struct server *s = arg;

	event_base_dispatch(s->base);
	return NULL;
}

/* Start a server on addr (text, port 0). Returns stats_http_new's result; on success the loop
 * runs in a thread. */
static int server_start(struct server *s, const char *addr, char *err, size_t errlen)
{
	struct netaddr_ep ep = { .port = 0 };
	int ret;

	memset(s, 0, sizeof(*s));
	cr_assert_eq(netaddr_parse(addr, &ep.addr), 0);
	s->base = event_base_new();
	cr_assert_not_null(s->base);
	ret = stats_http_new(s->base, &ep, provider, s, &s->http, err, errlen);
	if (ret != 0) {
		cr_assert_null(s->http);
		event_base_free(s->base);
		return ret;
	}
	cr_assert_neq(stats_http_port(s->http), 0);
	cr_assert_eq(pipe(s->stop_pipe), 0);
	s->stop_ev = event_new(s->base, s->stop_pipe[0], EV_READ, on_stop, s->base);
	cr_assert_eq(event_add(s->stop_ev, NULL), 0);
	cr_assert_eq(pthread_create(&s->thread, NULL, loop_thread, s), 0);
	s->running = true;
	return 0;
}

static void server_stop(struct server *s)
{
	if (!s->running)
		return;
	cr_assert_eq(write(s->stop_pipe[1], "x", 1), 1);
	cr_assert_eq(pthread_join(s->thread, NULL), 0);
	stats_http_free(s->http);
	event_free(s->stop_ev);
	event_base_free(s->base);
	close(s->stop_pipe[0]);
	close(s->stop_pipe[1]);
	s->running = false;
}

struct resp {
	int status;
	char head[4096];     /* status line and headers, NUL-terminated */
	char *body;          /* points into raw */
	size_t body_len;
	char raw[1 << 16];
};

/* Value of header name (case-insensitive) in r->head, copied into buf; false if absent. */
static bool header(const struct resp *r, const char *name, char *buf, size_t len)
{
	size_t n = strlen(name);

	for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
		const char *line = p + 2, *end = strstr(line, "\r\n");
		if (!end)
			end = line + strlen(line);
		if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
			const char *v = line + n + 1;
			while (*v == ' ')
				v++;
			snprintf(buf, len, "%.*s", (int)(end - v), v);
			return true;
		}
	}
	return false;
}

static int connect_to(int family, uint16_t port)
{
	struct sockaddr_storage ss = { 0 };
	struct timeval tv = { 5, 0 };
	socklen_t len;
	int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	if (family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
		sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		len = sizeof(*sin);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(port);
		sin6->sin6_addr = in6addr_loopback;
		len = sizeof(*sin6);
	}
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&ss, len), 0, "connect: %s", strerror(errno));
	return fd;
}

/* Send request text and read the whole response (the server closes after it). */
static void fetch(int family, uint16_t port, const char *request, struct resp *r)
{
	int fd = connect_to(family, port);
	size_t got = 0;
	char *sep;

	cr_assert_eq(write(fd, request, strlen(request)), (ssize_t)strlen(request));
	for (;;) {
		ssize_t n = read(fd, r->raw + got, sizeof(r->raw) - 1 - got);
		cr_assert_geq(n, 0, "read: %s", strerror(errno));
		if (n == 0)
			break;
		got += (size_t)n;
		cr_assert_lt(got, sizeof(r->raw) - 1, "response too large");
	}
	close(fd);
	r->raw[got] = '\0';
	sep = strstr(r->raw, "\r\n\r\n");
	cr_assert_not_null(sep, "no header end in: %s", r->raw);
	snprintf(r->head, sizeof(r->head), "%.*s", (int)(sep - r->raw), r->raw);
	r->body = sep + 4;
	r->body_len = got - (size_t)(r->body - r->raw);
	cr_assert_eq(sscanf(r->raw, "HTTP/1.%*d %d", &r->status), 1, "%s", r->head);
}

static void get(struct server *s, const char *path, struct resp *r)
{
	char req[256];

	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
	fetch(AF_INET, stats_http_port(s->http), req, r);
}

static void check_header(const struct resp *r, const char *name, const char *want)
{
	char v[256];

	cr_assert(header(r, name, v, sizeof(v)), "no %s header in:\n%s", name, r->head);
	cr_assert_str_eq(v, want, "%s", name);
}

static void check_content_length(const struct resp *r)
{
	char v[32];

	cr_assert(header(r, "Content-Length", v, sizeof(v)));
	cr_assert_eq(strtoull(v, NULL, 10), r->body_len);
}

static struct server srv;
static struct resp resp;

static void fini(void)
{
	server_stop(&srv);
}

TestSuite(stats_http, .fini = fini, .timeout = 30);

Test(stats_http, stats_is_json_with_fresh_counters)
{
	cJSON *j, *tun;
	char err[256];

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	for (int i = 1; i <= 3; i++) {
		get(&srv, "/stats", &resp);
		cr_assert_eq(resp.status, 200, "%s", resp.head);
		check_header(&resp, "Content-Type", "application/json");
		check_header(&resp, "Cache-Control", "no-store");
		check_content_length(&resp);
		j = cJSON_Parse(resp.body);
		cr_assert_not_null(j, "not JSON: %s", resp.body);
		cr_assert_str_eq(cJSON_GetObjectItem(j, "stack")->valuestring, "system");
		tun = cJSON_GetObjectItem(j, "tun");
		cr_assert(cJSON_IsObject(tun));
		/* The provider runs per request: the counter is fresh every time. */
		cr_assert_eq(cJSON_GetObjectItem(tun, "rx_packets")->valuedouble, i);
		cJSON_Delete(j);
	}
	cr_assert_str_eq(resp.body, "{\"stack\":\"system\",\"uptime_s\":7,"
				    "\"tun\":{\"rx_packets\":3},\"drops\":{\"malformed\":0},"
				    "\"nat\":{\"active\":3}}\n");
}

Test(stats_http, metrics_is_prometheus_text)
{
	char err[256];

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	get(&srv, "/metrics", &resp);
	cr_assert_eq(resp.status, 200, "%s", resp.head);
	check_header(&resp, "Content-Type", "text/plain; version=0.0.4");
	check_content_length(&resp);
	cr_assert_str_eq(resp.body, "# TYPE twinstack_info gauge\n"
				    "twinstack_info{stack=\"system\"} 1\n"
				    "# TYPE twinstack_uptime_s gauge\n"
				    "twinstack_uptime_s 7\n"
				    "# TYPE twinstack_tun_rx_packets counter\n"
				    "twinstack_tun_rx_packets 1\n"
				    "# TYPE twinstack_drops_malformed counter\n"
				    "twinstack_drops_malformed 0\n"
				    "# TYPE twinstack_nat_active gauge\n"
				    "twinstack_nat_active 3\n");
}

Test(stats_http, query_string_http11_and_head)
{
	char err[256], v[64];

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	get(&srv, "/stats?pretty=1", &resp);
	cr_assert_eq(resp.status, 200);
	fetch(AF_INET, stats_http_port(srv.http),
	      "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", &resp);
	cr_assert_eq(resp.status, 200);
	cr_assert_not_null(strstr(resp.body, "twinstack_tun_rx_packets 2\n"));
	fetch(AF_INET, stats_http_port(srv.http), "HEAD /stats HTTP/1.0\r\n\r\n", &resp);
	cr_assert_eq(resp.status, 200);
	check_header(&resp, "Content-Type", "application/json");
	cr_assert_eq(resp.body_len, 0, "HEAD has no body: %s", resp.body);
	cr_assert(!header(&resp, "Allow", v, sizeof(v)));
}

/* Read one response of a kept-alive connection: headers, then exactly Content-Length bytes. */
static void read_one(int fd, struct resp *r)
{
	size_t got = 0, need = 0;
	char *sep = NULL, v[32];

	for (;;) {
		ssize_t n;
		cr_assert_lt(got, sizeof(r->raw) - 1, "response too large");
		n = read(fd, r->raw + got, 1); /* byte by byte: never read into the next one */
		cr_assert_eq(n, 1, "read: %zd %s", n, strerror(errno));
		got++;
		r->raw[got] = '\0';
		if (!sep && (sep = strstr(r->raw, "\r\n\r\n")) != NULL) {
			snprintf(r->head, sizeof(r->head), "%.*s", (int)(sep - r->raw), r->raw);
			r->body = sep + 4;
			cr_assert(header(r, "Content-Length", v, sizeof(v)), "%s", r->head);
			need = (size_t)(r->body - r->raw) + strtoull(v, NULL, 10);
		}
		if (sep && got == need)
			break;
	}
	r->body_len = got - (size_t)(r->body - r->raw);
	cr_assert_eq(sscanf(r->raw, "HTTP/1.%*d %d", &r->status), 1, "%s", r->head);
}

/* Scrapers (Prometheus) keep the connection open between requests. */
Test(stats_http, keep_alive_serves_several_requests)
{
	static const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
	char err[256];
	int fd;

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	fd = connect_to(AF_INET, stats_http_port(srv.http));
	for (int i = 1; i <= 3; i++) {
		char want[64];
		cr_assert_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
		read_one(fd, &resp);
		cr_assert_eq(resp.status, 200, "%s", resp.head);
		snprintf(want, sizeof(want), "twinstack_tun_rx_packets %d\n", i);
		cr_assert_not_null(strstr(resp.body, want), "%s", resp.body);
	}
	close(fd);
}

/* Requests pipelined in one burst larger than a connection may buffer: reading pauses at the
 * bound and goes on after each answer, and every request is answered, in order. */
Test(stats_http, pipelined_requests_beyond_the_input_bound_are_all_served)
{
	enum { N = 24, PAD = 1024 };
	static char burst[N * (PAD + 128)];
	char err[256], pad[PAD + 1];
	size_t len = 0;
	int fd;

	memset(pad, 'a', PAD);
	pad[PAD] = '\0';
	for (int i = 0; i < N; i++)
		len += (size_t)snprintf(burst + len, sizeof(burst) - len,
					"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Pad: %s\r\n\r\n",
					pad);
	cr_assert_gt(len, (size_t)STATS_HTTP_MAX_HEADERS + 1024 + 4096, "not beyond the bound");
	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	fd = connect_to(AF_INET, stats_http_port(srv.http));
	cr_assert_eq(send(fd, burst, len, MSG_NOSIGNAL), (ssize_t)len);
	for (int i = 1; i <= N; i++) {
		char want[64];

		read_one(fd, &resp); /* the socket's 5 s receive timeout fails a stall */
		cr_assert_eq(resp.status, 200, "answer %d: %s", i, resp.head);
		snprintf(want, sizeof(want), "twinstack_tun_rx_packets %d\n", i);
		cr_assert_not_null(strstr(resp.body, want), "answer %d", i);
	}
	close(fd);
}

Test(stats_http, unknown_path_404_other_method_405)
{
	static const char *const paths[] = { "/", "/statsx", "/stats/", "/metrics.txt", "/STATS" };
	static const char *const methods[] = { "POST", "PUT", "DELETE", "OPTIONS", "PATCH" };
	char err[256], req[256];

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		get(&srv, paths[i], &resp);
		cr_assert_eq(resp.status, 404, "%s: %s", paths[i], resp.head);
	}
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
		snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
			 methods[i], i % 2 ? "/stats" : "/metrics");
		fetch(AF_INET, stats_http_port(srv.http), req, &resp);
		cr_assert_eq(resp.status, 405, "%s: %s", methods[i], resp.head);
		check_header(&resp, "Allow", "GET, HEAD");
	}
	cr_assert_eq(atomic_load(&srv.calls), 0, "refused requests never call the provider");
}

Test(stats_http, provider_error_is_500_with_reason)
{
	char err[256];

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	atomic_store(&srv.bad, true);
	get(&srv, "/stats", &resp);
	cr_assert_eq(resp.status, 500);
	cr_assert_not_null(strstr(resp.body, "\"bad key\""), "%s", resp.body);
	atomic_store(&srv.bad, false);
	get(&srv, "/metrics", &resp);
	cr_assert_eq(resp.status, 200, "the next request starts from a clean document");
}

Test(stats_http, refuses_non_loopback)
{
	static const char *const addrs[] = { "0.0.0.0", "10.0.0.1", "198.18.0.1", "::",
					     "fd00:7f::1", "::ffff:127.0.0.1" };
	struct event_base *base = event_base_new();
	struct stats_http *h = (struct stats_http *)&h;
	char err[256];

	for (size_t i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
		struct netaddr_ep ep = { .port = 0 };
		cr_assert_eq(netaddr_parse(addrs[i], &ep.addr), 0);
		err[0] = '\0';
		cr_assert_eq(stats_http_new(base, &ep, provider, NULL, &h, err, sizeof(err)),
			     -EINVAL, "%s", addrs[i]);
		cr_assert_null(h);
		cr_assert_not_null(strstr(err, "not a loopback address"), "%s", err);
	}
	event_base_free(base);
}

Test(stats_http, port_in_use_and_other_loopbacks)
{
	struct server other;
	struct netaddr_ep ep;
	struct stats_http *h = NULL;
	char err[256];
	int ret;

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(netaddr_parse("127.0.0.1", &ep.addr), 0);
	ep.port = stats_http_port(srv.http);
	cr_assert_eq(stats_http_new(srv.base, &ep, provider, NULL, &h, err, sizeof(err)),
		     -EADDRINUSE);
	cr_assert_not_null(strstr(err, "cannot listen on 127.0.0.1:"), "%s", err);
	cr_assert_null(h);

	/* All of 127.0.0.0/8 is loopback on Linux. */
	cr_assert_eq(server_start(&other, "127.0.0.2", err, sizeof(err)), 0, "%s", err);
	server_stop(&other);

	ret = server_start(&other, "::1", err, sizeof(err));
	if (ret == -EADDRNOTAVAIL || ret == -EAFNOSUPPORT) {
		cr_log_warn("no IPv6 loopback here (%s): the ::1 case is not run", err);
		return;
	}
	cr_assert_eq(ret, 0, "%s", err);
	fetch(AF_INET6, stats_http_port(other.http), "GET /stats HTTP/1.0\r\n\r\n", &resp);
	cr_assert_eq(resp.status, 200);
	server_stop(&other);
}

/* ---- bounds: connections, total request time, header size -------------------------------- */

/* Wait up to ms for fd to be closed by the server (EOF or reset): true if it was. */
static bool closed_within(int fd, int ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	char c;

	if (poll(&pfd, 1, ms) != 1)
		return false;
	return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

static struct stats_http_stats http_stats(struct server *s)
{
	struct stats_http_stats st;

	stats_http_stats(s->http, &st);
	return st;
}

/* One header byte every 100 ms keeps evhttp's inactivity timer from ever firing; the total
 * request time cap closes the connection anyway. */
Test(stats_http, trickled_request_is_cut_off_at_the_total_cap)
{
	static const char start[] = "GET /stats HTTP/1.1\r\nHost: localhost\r\nX-Pad: ";
	char err[256];
	int64_t t0, elapsed_ms = -1;
	int fd;

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	fd = connect_to(AF_INET, stats_http_port(srv.http));
	t0 = ts_now_ns();
	cr_assert_eq(write(fd, start, sizeof(start) - 1), (ssize_t)sizeof(start) - 1);
	/* Bounded: 3 x the cap, well under the 10 s x 8 KiB a per-byte timeout would allow. */
	while (ts_now_ns() - t0 < MS(3 * STATS_HTTP_REQUEST_MS)) {
		if (closed_within(fd, 100)) {
			elapsed_ms = (ts_now_ns() - t0) / 1000000;
			break;
		}
		if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) {
			elapsed_ms = (ts_now_ns() - t0) / 1000000;
			break;
		}
	}
	close(fd);
	cr_assert_geq(elapsed_ms, 0, "a trickled request was still open after %d ms",
		      3 * STATS_HTTP_REQUEST_MS);
	cr_assert_geq(elapsed_ms, STATS_HTTP_REQUEST_MS - 100, "closed too early: %lld ms",
		      (long long)elapsed_ms);
	cr_assert_leq(elapsed_ms, STATS_HTTP_REQUEST_MS + 1000, "closed too late: %lld ms",
		      (long long)elapsed_ms);
	cr_assert_eq(http_stats(&srv).timeouts, 1);
	cr_assert_eq(http_stats(&srv).connections, 0);
	get(&srv, "/stats", &resp);
	cr_assert_eq(resp.status, 200, "the endpoint still serves");
}

/* Stream an endless chunk-size line to the endpoint for ms: its reading pauses at the
 * connection's bound and the sends then find the socket buffers full. Returns the bytes sent. */
static uint64_t stream_endless_chunk(int fd, int ms)
{
	static const char req[] = "POST /stats HTTP/1.1\r\nHost: localhost\r\n"
				  "Transfer-Encoding: chunked\r\n\r\n";
	static char zeros[65536];
	uint64_t sent = 0;
	int64_t t0;

	memset(zeros, '0', sizeof(zeros));
	cr_assert_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
	t0 = ts_now_ns();
	while (ts_now_ns() - t0 < MS(ms)) {
		ssize_t n = send(fd, zeros, sizeof(zeros), MSG_NOSIGNAL | MSG_DONTWAIT);
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };

		if (n > 0)
			sent += (uint64_t)n;
		else if (n < 0 && errno != EAGAIN)
			break;
		else
			(void)poll(&pfd, 1, 50);
	}
	return sent;
}

/* CPU time of the whole process (the server's loop thread included), in ms. */
static int64_t process_cpu_ms(void)
{
	struct timespec ts;

	cr_assert_eq(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts), 0);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A chunked body whose chunk-size line never ends is not counted against evhttp's body limit
 * until the line is whole: a connection's input buffer must be bounded by itself, or a client
 * streaming such a line grows the process by megabytes a second until the request cap. While
 * its reading is paused the loop sleeps: it does not run the connection's callbacks again and
 * again until the cap. */
Test(stats_http, an_endless_chunk_size_line_is_not_buffered)
{
	struct rss_info r0, r1;
	int64_t cpu0, cpu_ms;
	uint64_t sent;
	char err[256];
	int fd;

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	rss_heap_trim();
	cr_assert_eq(rss_sample(&r0), 0);
	fd = connect_to(AF_INET, stats_http_port(srv.http));
	sent = stream_endless_chunk(fd, STATS_HTTP_REQUEST_MS / 2);
	cr_assert_eq(rss_sample(&r1), 0);
	cr_assert_lt(r1.rss_bytes, r0.rss_bytes + 8u * 1024 * 1024,
		     "RSS grew by %llu KiB while %llu KiB were sent",
		     (unsigned long long)(r1.rss_bytes - r0.rss_bytes) / 1024,
		     (unsigned long long)sent / 1024);
	get(&srv, "/stats", &resp);
	cr_assert_eq(resp.status, 200, "the endpoint still serves");
	/* Its reading stopped, the connection is ended by the request time cap. */
	cpu0 = process_cpu_ms();
	cr_assert(closed_within(fd, STATS_HTTP_REQUEST_MS + 1000), "still open past the cap");
	cpu_ms = process_cpu_ms() - cpu0;
	close(fd);
	cr_assert_eq(http_stats(&srv).timeouts, 1);
	cr_assert_lt(cpu_ms, STATS_HTTP_REQUEST_MS / 10,
		     "%lld ms of CPU while the paused connection waited for the cap",
		     (long long)cpu_ms);
}

/* A stop while such a client streams: the endpoint is freed with the connection open and its
 * reading paused, and frees it all the same (LeakSanitizer checks) and closes its socket. */
Test(stats_http, free_with_a_paused_connection_open_frees_it)
{
	char err[256];
	uint64_t sent;
	int fd;

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	fd = connect_to(AF_INET, stats_http_port(srv.http));
	sent = stream_endless_chunk(fd, 500);
	cr_assert_gt(sent, (uint64_t)(STATS_HTTP_MAX_HEADERS + 8192), "the bound was not reached");
	cr_assert_eq(http_stats(&srv).connections, 1);
	cr_assert(!closed_within(fd, 0), "closed before the stop");
	server_stop(&srv);
	cr_assert(closed_within(fd, 1000), "the connection outlived the endpoint");
	close(fd);
	CHECK_LEAKS();
}

/* STATS_HTTP_MAX_CONNS idle connections fill the endpoint: one more is closed at once and
 * counted; once one of them goes, a normal request is served again. */
Test(stats_http, connection_cap_closes_the_extra_one)
{
	int fds[STATS_HTTP_MAX_CONNS], extra;
	char err[256];

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	for (int i = 0; i < STATS_HTTP_MAX_CONNS; i++)
		fds[i] = connect_to(AF_INET, stats_http_port(srv.http));
	for (int i = 0; i < 100 && http_stats(&srv).connections < STATS_HTTP_MAX_CONNS; i++)
		usleep(10000);
	cr_assert_eq(http_stats(&srv).connections, STATS_HTTP_MAX_CONNS);
	extra = connect_to(AF_INET, stats_http_port(srv.http));
	cr_assert(closed_within(extra, 1000), "the connection over the cap was kept open");
	close(extra);
	cr_assert_eq(http_stats(&srv).refused, 1);
	cr_assert_eq(http_stats(&srv).connections, STATS_HTTP_MAX_CONNS);
	for (int i = 0; i < STATS_HTTP_MAX_CONNS; i++)
		cr_assert(!closed_within(fds[i], 0), "an admitted connection was closed");

	close(fds[0]);
	for (int i = 0; i < 100 && http_stats(&srv).connections == STATS_HTTP_MAX_CONNS; i++)
		usleep(10000);
	get(&srv, "/stats", &resp);
	cr_assert_eq(resp.status, 200);
	cr_assert_eq(http_stats(&srv).refused, 1);
	for (int i = 1; i < STATS_HTTP_MAX_CONNS; i++)
		close(fds[i]);
}

/* Headers over the cap end the request (evhttp answers or closes) without a stats reply. */
Test(stats_http, oversized_headers_are_refused)
{
	static char req[3 * 4096];
	char err[256];
	int fd;

	cr_assert_eq(server_start(&srv, "127.0.0.1", err, sizeof(err)), 0, "%s", err);
	memset(req, 'a', sizeof(req));
	memcpy(req, "GET /stats HTTP/1.1\r\nX-Pad: ", 28);
	fd = connect_to(AF_INET, stats_http_port(srv.http));
	(void)send(fd, req, sizeof(req), MSG_NOSIGNAL);
	/* Whatever evhttp answers (an error status, or nothing), the connection ends. */
	char got[512] = "";
	size_t n = 0;
	int64_t end = ts_now_ns() + MS(2000);
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	bool ended = false;
	while (!ended && ts_now_ns() < end && poll(&pfd, 1, 100) >= 0) {
		ssize_t r = recv(fd, got + n, sizeof(got) - 1 - n, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN))
			ended = true;
		else if (r > 0 && n + (size_t)r < sizeof(got) - 1)
			n += (size_t)r;
	}
	close(fd);
	cr_assert(ended, "oversized headers left the connection open");
	cr_assert_null(strstr(got, " 200 "), "%s", got);
	cr_assert_eq(atomic_load(&srv.calls), 0, "the provider never saw the oversized request");
	cr_assert_geq(STATS_HTTP_MAX_HEADERS, 1024);
	cr_assert_lt(STATS_HTTP_MAX_HEADERS, (int)sizeof(req));
}

/* ---- libevent's allocations refused in turn (failalloc.h, evmem.h) ---- */

/* The loop in this thread (allocations count only on the thread that makes them). A client
 * connects, asks for /stats over HTTP/1.0 and reads to the end; on a fresh loop the
 * connection's timer is the one that makes libevent's timer heap. Each allocation while the
 * server takes the connection is refused in turn: the answer comes whole, or the connection
 * is closed, or (evhttp's own refusals) it waits; whichever, once the client has gone, the
 * endpoint counts no connection open (a connection counted and never looked at again would
 * hold one of the 8 places for good). */
static void accept_scenario(void *arg, bool sweep)
{
	static const char req[] = "GET /stats HTTP/1.0\r\nHost: localhost\r\n\r\n";
	struct netaddr_ep ep = { .port = 0 };
	struct stats_http_stats st;
	struct event_base *base;
	struct stats_http *http;
	struct server dummy = { 0 };
	char err[256], buf[4096];
	int64_t end;
	size_t got = 0;
	bool eof = false;
	int fd, rc;

	(void)arg;
	failalloc_hold(true); /* the loop, the endpoint, the client */
	cr_assert_eq(netaddr_parse("127.0.0.1", &ep.addr), 0);
	cr_assert_not_null(base = event_base_new());
	rc = stats_http_new(base, &ep, provider, &dummy, &http, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	fd = connect_to(AF_INET, stats_http_port(http));
	cr_assert_eq(write(fd, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
	failalloc_hold(false);
	for (int i = 0; i < 5; i++) /* the accept and the first look at it */
		event_base_loop(base, EVLOOP_NONBLOCK);
	failalloc_hold(true);
	end = ts_now_ns() + 500 * TS_NS_PER_MS;
	while (!eof && ts_now_ns() < end) {
		struct pollfd pf = { fd, POLLIN, 0 };
		ssize_t n;

		event_base_loop(base, EVLOOP_NONBLOCK);
		if (poll(&pf, 1, 1) == 1 && (n = recv(fd, buf + got, sizeof(buf) - 1 - got, 0)) >= 0) {
			got += (size_t)n;
			eof = n == 0;
		}
	}
	/* evhttp takes a line it had no memory to read as one not yet whole: such a request
	 * waits for the rest, bounded by the request cap (not waited for here). */
	cr_assert(eof || sweep, "the connection neither answered nor closed");
	buf[got] = '\0';
	cr_assert(sweep || strncmp(buf, "HTTP/1.0 200", 12) == 0 || strncmp(buf, "HTTP/1.1 200", 12) == 0,
		  "%s", buf);
	/* A document goes with all of its headers, or a 500 (counted) goes instead. */
	if (strstr(buf, " 200 "))
		cr_assert(strstr(buf, "Content-Type: " STATS_HTTP_CT_JSON "\r\n") &&
			  strstr(buf, "Content-Length: ") && strstr(buf, "Cache-Control: no-store\r\n"),
			  "a document without one of its headers: %s", buf);
	stats_http_stats(http, &st);
	cr_assert_eq(st.no_memory, strstr(buf, " 500 ") ? 1u : 0u, "%s", buf);
	close(fd);
	end = ts_now_ns() + 1000 * TS_NS_PER_MS;
	do {
		event_base_loop(base, EVLOOP_NONBLOCK);
		stats_http_stats(http, &st);
	} while (st.connections && ts_now_ns() < end && usleep(1000) == 0);
	cr_assert_eq(st.connections, 0, "a connection counted open after the client left");
	stats_http_free(http);
	event_base_free(base);
	failalloc_hold(false);
}

Test(stats_http, accept_with_libevent_allocations_refused_in_turn)
{
	cr_assert_eq(evmem_install(), 0);
	cr_log_info("%ld allocations refused in turn",
		    failalloc_sweep(accept_scenario, NULL, 2, 500));
}
