/* test_api.c — the public C API (include/twinstack.h), as an embedding program uses it:
 * create/start/stop/wait/free, bad configs, a caller's TUN fd with and without a virtio
 * header, the socket and log hooks, stats before/while/after running, the same /stats keys
 * for both stacks, one lwIP proxy per process, two system-stack proxies in one process
 * carrying traffic side by side with separate counters, and reloads (kept keys, refusals, the
 * file; the resolver's server moved to another SOCKS5 server with no restart). Last, a proxy
 * of each stack from its creation to its free with each allocation of any thread refused in
 * turn (failalloc.h).
 *
 * Topology of the traffic tests (the test's own namespaces; nothing leaves them):
 *
 *   proxy ns (this child)                                   server ns (a grandchild)
 *   client ─► tsa 198.18.0.1/16 ─► proxy A ┐               lo 10.77.1.2, 10.77.1.3: echo :7000
 *   client ─► tsb 198.19.0.1/16 ─► proxy B ┤ SO_MARK 1
 *             (10.77.1.2 via tsa,          └► va 10.77.0.1 ══ veth ══ vb 10.77.0.2
 *              10.77.1.3 via tsb)              (fwmark 1 → table 100 → via 10.77.0.2)
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "stacks/netstack.h"
#include "twinstack.h"
#include "failalloc.h"
#include "netns_child.h"
#include "testutil.h"

#define ECHO_PORT 7000
#define XFER_BYTES (512 * 1024)

/* ---- without root: the library's face ------------------------------------------------------ */

Test(api, version_and_stacks)
{
	const char *const *names = ts_stack_names();
	bool sys = false, lwip = false;
	size_t n = 0;

	cr_assert_str_eq(ts_version(), TS_VERSION);
	for (; names[n]; n++) {
		sys |= strcmp(names[n], "system") == 0;
		lwip |= strcmp(names[n], "lwip") == 0;
	}
	cr_assert(sys && lwip && n == 2, "stacks: %zu", n);
	cr_assert_eq(ts_stack_names(), names, "a static array");
	/* The constant table is the stacks this build really has, in order. */
	for (size_t i = 0; i < n; i++)
		cr_assert_str_eq(netstack_at(i)->name, names[i]);
	cr_assert_null(netstack_at(n));
}

Test(api, bad_config_names_the_path)
{
	struct ts_proxy *p = (struct ts_proxy *)0x1;
	char err[256] = "";
	const char *bad = "{\"tun\": {\"mtu\": 1}}";

	cr_assert_eq(ts_proxy_new_json(bad, strlen(bad), &p, err, sizeof(err)), -EINVAL);
	cr_assert_null(p);
	cr_assert(strstr(err, "$.tun.mtu") != NULL, "%s", err);
	cr_assert_eq(ts_proxy_new_json("{", 1, &p, err, sizeof(err)), -EINVAL);
	cr_assert(err[0] != '\0');
	/* Not NUL-terminated: only len bytes are read. */
	cr_assert_eq(ts_proxy_new_json("{}garbage", 2, &p, err, sizeof(err)), 0, "%s", err);
	ts_proxy_free(p);
	cr_assert_eq(ts_proxy_new_file("/nonexistent/twinstack.json", &p, err, sizeof(err)),
		     -ENOENT);
	cr_assert(strstr(err, "/nonexistent/twinstack.json") != NULL, "%s", err);
	cr_assert_eq(ts_proxy_new_json(NULL, 5, &p, NULL, 0), -EINVAL); /* errlen 0 is fine */
}

Test(api, not_started)
{
	struct ts_proxy *p;
	char err[256], *json;
	size_t len;

	cr_assert_eq(ts_proxy_new_json("{}", 2, &p, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ts_proxy_running(p), 0);
	cr_assert_eq(ts_proxy_wait(p), -EINVAL);
	ts_proxy_stop(p); /* a no-op, and forgotten */
	cr_assert_eq(ts_proxy_set_tun_fd(p, -1), -EBADF);
	cr_assert_eq(ts_proxy_stats_json(p, &json, &len), 0);
	cr_assert_eq(strlen(json), len);
	cJSON *doc = cJSON_Parse(json);
	cr_assert_not_null(doc);
	cr_assert_str_eq(cJSON_GetObjectItem(doc, "stack")->valuestring, "system");
	cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "tun"), "owner")->valuestring,
			 "none");
	cJSON_Delete(doc);
	ts_free(json);
	ts_proxy_free(p);
	ts_proxy_free(NULL);
}

/* ---- helpers for the namespace scenarios --------------------------------------------------- */

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
	char cmd[512];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	st = system(cmd);
	CHECK(st == 0, "'%s' exited %d", cmd, st);
}

static int reload_json(struct ts_proxy *p, const char *json, char *err, size_t errlen);

static struct ts_proxy *new_proxy(const char *json)
{
	struct ts_proxy *p = NULL;
	char err[512];
	int ret = ts_proxy_new_json(json, strlen(json), &p, err, sizeof(err));

	CHECK(ret == 0, "new: %s", err);
	return p;
}

static void start(struct ts_proxy *p)
{
	char err[512] = "";
	int ret = ts_proxy_start(p, err, sizeof(err));

	CHECK(ret == 0, "start: %d %s", ret, err);
}

static cJSON *stats(struct ts_proxy *p)
{
	char *json = NULL;
	size_t len = 0;
	int ret = ts_proxy_stats_json(p, &json, &len);
	cJSON *doc;

	CHECK(ret == 0, "stats: %d", ret);
	doc = cJSON_Parse(json);
	CHECK(doc != NULL, "stats JSON does not parse: %.200s", json);
	ts_free(json);
	return doc;
}

/* The value at a dotted key: the document nests by the dots ("tun.owner"). */
static cJSON *at(cJSON *doc, const char *key)
{
	char part[128];
	const char *dot;

	while (doc && (dot = strchr(key, '.')) != NULL) {
		snprintf(part, sizeof(part), "%.*s", (int)(dot - key), key);
		doc = cJSON_GetObjectItem(doc, part);
		key = dot + 1;
	}
	return doc ? cJSON_GetObjectItem(doc, key) : NULL;
}

static double num(cJSON *doc, const char *key)
{
	cJSON *v = at(doc, key);
	CHECK(cJSON_IsNumber(v), "no number %s", key);
	return v->valuedouble;
}

static const char *str(cJSON *doc, const char *key)
{
	cJSON *v = at(doc, key);
	CHECK(cJSON_IsString(v), "no string %s", key);
	return v->valuestring;
}

/* A TUN opened the way an embedding program (or Android's VpnService) does. vnet_sz 0: none. */
static int open_tun(const char *name, int vnet_sz)
{
	struct ifreq ifr;
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);

	CHECK(fd >= 0, "open /dev/net/tun: %s", strerror(errno));
	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	ifr.ifr_flags = IFF_TUN | IFF_NO_PI | (vnet_sz ? IFF_VNET_HDR : 0);
	CHECK(ioctl(fd, TUNSETIFF, &ifr) == 0, "TUNSETIFF: %s", strerror(errno));
	if (vnet_sz) {
		unsigned off = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
		CHECK(ioctl(fd, TUNSETVNETHDRSZ, &vnet_sz) == 0, "%s", strerror(errno));
		CHECK(ioctl(fd, TUNSETOFFLOAD, off) == 0, "TUNSETOFFLOAD: %s", strerror(errno));
	}
	return fd;
}

static int cpus_allowed(void)
{
	cpu_set_t set;

	return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

static const char sys_cfg_fmt[] =
	"{\"stack\": \"%s\", \"log\": {\"level\": \"warn\"},"
	" \"tun\": {\"name\": \"%s\", \"address\": \"%s\"%s},"
	" \"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\", \"routing_mark\": 1}]}";

/* A caller's TUN: no name in the config. */
static const char caller_cfg_fmt[] =
	"{\"log\": {\"level\": \"warn\"}, \"tun\": {\"address\": \"%s\"%s},"
	" \"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\", \"routing_mark\": 1}]}";

/* ---- lifecycle -------------------------------------------------------------------------- */

static _Atomic int log_lines, ready_lines, ready_device, stats_from_loop = 1;
static _Atomic int starting = 0, deadlk_while_starting, other_while_starting;
static struct ts_proxy *sig_proxy;

static void count_log(void *arg, int level, const char *line, size_t len)
{
	(void)arg;
	atomic_fetch_add(&log_lines, 1);
	/* Inside ts_proxy_start: from its own thread while it starts (or the loop's) -EDEADLK,
	 * not a wait for itself; once running, from the starting thread, the document. */
	if (atomic_load(&starting)) {
		char *json = NULL;
		int r = ts_proxy_stats_json(sig_proxy, &json, NULL);
		ts_free(json);
		atomic_fetch_add(r == -EDEADLK ? &deadlk_while_starting : r == 0 ? &log_lines
							  : &other_while_starting, r == 0 ? 0 : 1);
	}
	/* Logged on the loop thread: the loop cannot answer a stats request from itself. */
	if (strstr(line, "stop requested")) {
		char *json = NULL;
		atomic_store(&stats_from_loop, ts_proxy_stats_json(sig_proxy, &json, NULL));
		ts_free(json);
	}
	if (strstr(line, "ready") && strlen(line) == len && line[len - 1] != '\n' &&
	    level == TS_LOG_INFO) {
		atomic_fetch_add(&ready_lines, 1);
		if (strstr(line, "tun=tlc%d") && strstr(line, "(device tlc0)"))
			atomic_fetch_add(&ready_device, 1);
	}
}

static void on_usr1(int sig)
{
	(void)sig;
	ts_proxy_stop(sig_proxy);
}

static void lifecycle(void)
{
	char cfg[1024], err[256];
	struct ts_proxy *p;
	cJSON *doc;

	snprintf(cfg, sizeof(cfg),
		 "{\"log\": {\"level\": \"info\"}, \"tun\": {\"name\": \"tlc%%d\","
		 " \"address\": \"198.18.0.1/15\"}}");
	p = new_proxy(cfg);
	CHECK(ts_proxy_set_log(p, count_log, NULL) == 0, "set_log");
	/* A reload asked before start: a no-op, not one done once the loop runs. */
	ts_proxy_request_reload(p);
	sig_proxy = p;
	atomic_store(&starting, 1);
	start(p);
	atomic_store(&starting, 0);
	CHECK(atomic_load(&deadlk_while_starting) > 0 && atomic_load(&other_while_starting) == 0,
	      "stats from the log callback inside the start: %d -EDEADLK, %d other errors",
	      atomic_load(&deadlk_while_starting), atomic_load(&other_while_starting));
	CHECK(ts_proxy_running(p) == 1, "running");
	CHECK(atomic_load(&ready_lines) == 1, "one ready line through the callback (%d lines)",
	      atomic_load(&log_lines));
	CHECK(atomic_load(&ready_device) == 1, "the ready line names the device the template made");
	CHECK(ts_proxy_set_log(p, NULL, NULL) == -EBUSY, "set_log after start");
	CHECK(ts_proxy_set_socket_hook(p, NULL, NULL) == -EBUSY, "hook after start");
	CHECK(ts_proxy_set_tun_fd(p, 0) == -EBUSY, "fd after start");
	CHECK(ts_proxy_start(p, err, sizeof(err)) == -EALREADY, "second start");
	CHECK(access("/sys/class/net/tlc0", F_OK) == 0, "the proxy's TUN exists");
	usleep(200000);
	doc = stats(p);
	CHECK(strcmp(str(doc, "tun.owner"), "proxy") == 0, "owner");
	CHECK(strcmp(str(doc, "reload.last_result"), "none") == 0 && num(doc, "reload.refused") == 0,
	      "the reload asked before start was not done: %s, %g refused",
	      str(doc, "reload.last_result"), num(doc, "reload.refused"));
	/* "auto": the system stack takes a queue per CPU it may run on, up to two. */
	CHECK(num(doc, "tun.queues") == (cpus_allowed() >= 2 ? 2 : 1), "queues %g with %d CPUs",
	      num(doc, "tun.queues"), cpus_allowed());
	cJSON_Delete(doc);
	/* Stop from a signal handler, twice: idempotent. */
	sig_proxy = p;
	signal(SIGUSR1, on_usr1);
	raise(SIGUSR1);
	raise(SIGUSR1);
	CHECK(ts_proxy_wait(p) == 0, "stopped on request");
	CHECK(ts_proxy_wait(p) == 0, "wait again");
	CHECK(atomic_load(&stats_from_loop) == -EDEADLK, "stats from the loop: %d",
	      atomic_load(&stats_from_loop));
	CHECK(ts_proxy_running(p) == 0, "not running");
	ts_proxy_stop(p);
	doc = stats(p); /* the final figures */
	CHECK(strcmp(str(doc, "stack"), "system") == 0, "stack");
	cJSON_Delete(doc);
	ts_proxy_free(p);
	CHECK(access("/sys/class/net/tlc0", F_OK) != 0, "the TUN is gone after free");
}

Test(api, lifecycle, .timeout = 30)
{
	run_in_netns(lifecycle);
}

/* ---- a caller's TUN fd ---------------------------------------------------------------------- */

static void caller_fd(void)
{
	char cfg[1024], err[256], buf[64] = "";
	struct ts_proxy *p;
	cJSON *doc;
	int fd, sfd;

	/* Per-packet fd; the caller's txqueuelen must survive a config that asks for another. */
	fd = open_tun("tcf0", 0);
	sh("ip link set tcf0 txqueuelen 777 up && ip addr add 198.18.0.1/15 dev tcf0");
	snprintf(cfg, sizeof(cfg), caller_cfg_fmt, "198.18.0.1/15", ", \"txqueuelen\": 5000");
	p = new_proxy(cfg);
	CHECK(ts_proxy_set_tun_fd(p, fd) == 0, "set fd");
	start(p);
	doc = stats(p);
	CHECK(strcmp(str(doc, "tun.owner"), "caller") == 0, "owner");
	CHECK(strcmp(str(doc, "tun.io_mode"), "per-packet") == 0, "mode %s",
	      str(doc, "tun.io_mode"));
	CHECK(strstr(str(doc, "tun.unavailable"), "tun.txqueuelen") != NULL, "unavailable: %s",
	      str(doc, "tun.unavailable"));
	cJSON_Delete(doc);
	/* The same configuration again: nothing to keep (the device's name and MTU in the
	 * running values are not the config's to change). */
	CHECK(reload_json(p, cfg, err, sizeof(err)) == 0, "reload: %s", err);
	doc = stats(p);
	CHECK(strcmp(str(doc, "reload.kept"), "") == 0, "kept: %s", str(doc, "reload.kept"));
	cJSON_Delete(doc);
	ts_proxy_free(p);
	CHECK(fcntl(fd, F_GETFD) >= 0, "the caller's fd stays open");
	sfd = open("/sys/class/net/tcf0/tx_queue_len", O_RDONLY);
	CHECK(sfd >= 0 && read(sfd, buf, sizeof(buf) - 1) > 0, "tx_queue_len");
	close(sfd);
	CHECK(atoi(buf) == 777, "txqueuelen changed to %s", buf);

	/* offload "on" cannot be honoured on an fd without IFF_VNET_HDR. */
	snprintf(cfg, sizeof(cfg), caller_cfg_fmt, "198.18.0.1/15", ", \"offload\": \"on\"");
	p = new_proxy(cfg);
	CHECK(ts_proxy_set_tun_fd(p, fd) == 0, "set fd");
	CHECK(ts_proxy_start(p, err, sizeof(err)) == -EINVAL, "offload on, plain fd");
	CHECK(strstr(err, "IFF_VNET_HDR") != NULL, "%s", err);
	ts_proxy_free(p);
	close(fd);

	/* Not a TUN at all. */
	p = new_proxy("{}");
	CHECK(ts_proxy_set_tun_fd(p, STDERR_FILENO) == 0, "set fd");
	CHECK(ts_proxy_start(p, err, sizeof(err)) == -EBADF, "not a TUN: %s", err);
	ts_proxy_free(p);
}

Test(api, caller_fd, .timeout = 30)
{
	run_in_netns(caller_fd);
}

/* ---- the same /stats keys for both stacks; one lwIP proxy per process ------------------------ */

static cJSON *keys_of(const char *stack, const char *tun)
{
	char cfg[1024];
	struct ts_proxy *p;
	cJSON *doc;

	/* One queue each: more add per-queue counters (tun.qN.*) that lwIP cannot have. */
	snprintf(cfg, sizeof(cfg), sys_cfg_fmt, stack, tun, "198.18.0.1/15", ", \"queues\": 1");
	p = new_proxy(cfg);
	start(p);
	doc = stats(p);
	ts_proxy_free(p);
	return doc;
}

/* Every leaf key of doc, dotted, into keys (one string, each key followed by '\n'). */
static void leaves(cJSON *doc, const char *prefix, char *keys, size_t cap, int *n)
{
	cJSON *e;

	cJSON_ArrayForEach(e, doc) {
		char k[256];
		snprintf(k, sizeof(k), "%s%s%s", prefix, prefix[0] ? "." : "", e->string);
		/* Each stack's own detailed counters, for diagnosis (docs/config.md, "stats"). */
		if (strcmp(k, "stack_counters") == 0)
			continue;
		if (cJSON_IsObject(e)) {
			leaves(e, k, keys, cap, n);
		} else {
			size_t l = strlen(keys);
			snprintf(keys + l, cap - l, "%s\n", k);
			(*n)++;
		}
	}
}

static void same_keys(void)
{
	cJSON *a = keys_of("system", "tks0"), *b = keys_of("lwip", "tks1");
	static char ka[65536], kb[65536];
	int na = 0, nb = 0;

	leaves(a, "", ka, sizeof(ka), &na);
	leaves(b, "", kb, sizeof(kb), &nb);
	size_t i = 0;
	while (ka[i] && ka[i] == kb[i])
		i++;
	while (i > 0 && ka[i - 1] != '\n')
		i--;
	CHECK(strcmp(ka, kb) == 0, "the key lists differ: system has %.60s, lwip %.60s", ka + i,
	      kb + i);
	CHECK(na == nb && na > 50, "%d and %d keys", na, nb);
	CHECK(strcmp(str(b, "stack"), "lwip") == 0, "stack");
	cJSON_Delete(a);
	cJSON_Delete(b);
}

Test(api, same_stats_keys_for_both_stacks, .timeout = 30)
{
	run_in_netns(same_keys);
}

static void one_lwip(void)
{
	char cfg[1024], err[512] = "";
	struct ts_proxy *a, *b;

	snprintf(cfg, sizeof(cfg), sys_cfg_fmt, "lwip", "tlw0", "198.18.0.1/16", "");
	a = new_proxy(cfg);
	start(a);
	snprintf(cfg, sizeof(cfg), sys_cfg_fmt, "lwip", "tlw1", "198.19.0.1/16", "");
	b = new_proxy(cfg);
	CHECK(ts_proxy_start(b, err, sizeof(err)) == -EBUSY, "second lwIP proxy: %s", err);
	CHECK(strstr(err, "lwIP") != NULL || strstr(err, "lwip") != NULL, "%s", err);
	CHECK(access("/sys/class/net/tlw1", F_OK) != 0, "a refused proxy created its TUN");
	CHECK(ts_proxy_running(a) == 1, "the first one still runs");
	ts_proxy_free(b);
	ts_proxy_free(a);
	/* The first gone, a new one can start. */
	b = new_proxy(cfg);
	start(b);
	ts_proxy_free(b);
}

Test(api, one_lwip_proxy_per_process, .timeout = 30)
{
	run_in_netns(one_lwip);
}

/* ---- two system-stack proxies with traffic ------------------------------------------------- */

/* The server namespace: echo every connection back until EOF, and every UDP datagram to its
 * sender, on ECHO_PORT, forever (one poll over the listener, the UDP socket and up to
 * ECHO_CONNS connections). */
#define ECHO_CONNS 16
static void echo_server(int ready_fd, int go_fd)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(ECHO_PORT) };
	struct pollfd pf[2 + ECHO_CONNS];
	static char buf[65536];
	int one = 1, ls, us;
	nfds_t n = 2;
	char c;

	if (unshare(CLONE_NEWNET) != 0)
		_exit(3);
	(void)!write(ready_fd, "r", 1);
	if (read(go_fd, &c, 1) != 1)
		_exit(4);
	if (system("ip link set lo up && ip link set vb up && ip addr add 10.77.0.2/24 dev vb &&"
		   " ip addr add 10.77.1.2/32 dev lo && ip addr add 10.77.1.3/32 dev lo") != 0)
		_exit(5);
	ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	us = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(ls, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(ls, 16) != 0 ||
	    bind(us, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		_exit(6);
	(void)!write(ready_fd, "l", 1);
	pf[0] = (struct pollfd){ .fd = ls, .events = POLLIN };
	pf[1] = (struct pollfd){ .fd = us, .events = POLLIN };
	for (;;) {
		if (poll(pf, n, -1) <= 0)
			continue;
		if ((pf[0].revents & POLLIN) && n < 2 + ECHO_CONNS) {
			int c2 = accept(ls, NULL, NULL);
			if (c2 >= 0)
				pf[n++] = (struct pollfd){ .fd = c2, .events = POLLIN };
		}
		if (pf[1].revents & POLLIN) {
			struct sockaddr_storage from;
			socklen_t fl = sizeof(from);
			ssize_t got = recvfrom(us, buf, sizeof(buf), 0, (struct sockaddr *)&from, &fl);
			if (got >= 0)
				(void)!sendto(us, buf, (size_t)got, 0, (struct sockaddr *)&from, fl);
		}
		for (nfds_t i = 2; i < n; i++) {
			ssize_t got;
			if (!pf[i].revents)
				continue;
			got = read(pf[i].fd, buf, sizeof(buf));
			/* A blocking write: the client reads what it sends, both at once. */
			if (got > 0 && write(pf[i].fd, buf, (size_t)got) == got)
				continue;
			close(pf[i].fd);
			pf[i--] = pf[--n];
		}
	}
}

/* Send XFER_BYTES of a pattern to dst:ECHO_PORT and read them back, both at once. Returns
 * 0 when every byte came back intact, else -errno or -EPROTO. */
static int echo_through(const char *dst, uint8_t seed)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(ECHO_PORT) };
	static uint8_t out[XFER_BYTES], in[XFER_BYTES];
	size_t sent = 0, got = 0;
	int fd, ret = 0;

	for (size_t i = 0; i < sizeof(out); i++)
		out[i] = (uint8_t)(i * 31 + seed + (i >> 12));
	inet_pton(AF_INET, dst, &sa.sin_addr);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		ret = -errno;
		goto out;
	}
	fcntl(fd, F_SETFL, O_NONBLOCK);
	while (got < sizeof(in)) {
		struct pollfd pf = { .fd = fd, .events = POLLIN | (sent < sizeof(out) ? POLLOUT : 0) };
		if (poll(&pf, 1, 5000) <= 0) {
			ret = -ETIMEDOUT;
			goto out;
		}
		if (pf.revents & POLLOUT) {
			/* MSG_NOSIGNAL: a connection the proxy refused may be reset between the
			 * poll and the send; that is an error to report, not a SIGPIPE. */
			ssize_t n = send(fd, out + sent, sizeof(out) - sent, MSG_NOSIGNAL);
			if (n < 0 && errno != EAGAIN) {
				ret = -errno;
				goto out;
			}
			if (n > 0 && (sent += (size_t)n) == sizeof(out))
				shutdown(fd, SHUT_WR);
		}
		if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t n = read(fd, in + got, sizeof(in) - got);
			if (n == 0 || (n < 0 && errno != EAGAIN)) {
				ret = n == 0 ? -EPROTO : -errno;
				goto out;
			}
			if (n > 0)
				got += (size_t)n;
		}
	}
	ret = memcmp(in, out, sizeof(in)) == 0 ? 0 : -EPROTO;
out:
	close(fd);
	return ret;
}

static _Atomic int hook_calls, hook_refuse;

static int sock_hook(void *arg, int fd, int family, int type)
{
	int mark = 0;
	socklen_t len = sizeof(mark);

	(void)arg;
	/* Called after the mark was applied, before connect. */
	if (getsockopt(fd, SOL_SOCKET, SO_MARK, &mark, &len) != 0 || mark != 1 ||
	    family != AF_INET || type != SOCK_STREAM)
		return -EINVAL;
	atomic_fetch_add(&hook_calls, 1);
	return atomic_load(&hook_refuse) ? -EPERM : 0;
}

static _Atomic int namer_calls;

/* B's namer: counts, checks what it is given, names nothing (so B still goes by address). */
static const char *count_namer(void *arg, int family, const uint8_t *dst, uint16_t port)
{
	(void)arg;
	if (family == 4 && dst[0] == 10 && dst[1] == 77 && dst[2] == 1 && dst[3] == 3 &&
	    port == ECHO_PORT)
		atomic_fetch_add(&namer_calls, 1);
	return NULL;
}

static void two_proxies(void)
{
	int ready[2], go[2], tunfd, ret;
	char cfg[1024], c;
	struct ts_proxy *a, *b;
	cJSON *sa, *sb;
	pid_t srv;

	CHECK(pipe2(ready, O_CLOEXEC) == 0 && pipe2(go, O_CLOEXEC) == 0, "pipes");
	write_text("/proc/sys/net/ipv4/conf/all/rp_filter", "0");
	write_text("/proc/sys/net/ipv4/conf/default/rp_filter", "0");
	sh("ip link set lo up && ip link add va type veth peer name vb");
	if ((srv = fork()) == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		echo_server(ready[1], go[0]);
	}
	CHECK(read(ready[0], &c, 1) == 1, "server namespace");
	sh("ip link set vb netns %d", (int)srv);
	CHECK(write(go[1], "g", 1) == 1, "go");
	sh("ip link set va up && ip addr add 10.77.0.1/24 dev va && ip rule add fwmark 1 table 100"
	   " && ip route add 10.77.1.0/24 via 10.77.0.2 table 100");
	CHECK(read(ready[0], &c, 1) == 1 && c == 'l', "server listening");

	/* A: the library opens its TUN. B: the caller's fd, with a 12-byte virtio header. */
	snprintf(cfg, sizeof(cfg), sys_cfg_fmt, "system", "tsa", "198.18.0.1/16", "");
	a = new_proxy(cfg);
	CHECK(ts_proxy_set_socket_hook(a, sock_hook, NULL) == 0, "hook");
	start(a);
	tunfd = open_tun("tsb", 12);
	sh("ip link set tsb up && ip addr add 198.19.0.1/16 dev tsb");
	snprintf(cfg, sizeof(cfg), caller_cfg_fmt, "198.19.0.1/16", "");
	b = new_proxy(cfg);
	CHECK(ts_proxy_set_tun_fd(b, tunfd) == 0, "fd");
	CHECK(ts_proxy_set_namer(b, count_namer, NULL) == 0, "namer");
	start(b);
	CHECK(ts_proxy_set_namer(b, count_namer, NULL) == -EBUSY, "namer after start");
	sh("ip route add 10.77.1.2/32 dev tsa && ip route add 10.77.1.3/32 dev tsb");

	for (int i = 0; i < 3; i++)
		CHECK((ret = echo_through("10.77.1.2", (uint8_t)i)) == 0, "via A: %d", ret);
	for (int i = 0; i < 2; i++)
		CHECK((ret = echo_through("10.77.1.3", (uint8_t)(7 + i))) == 0, "via B: %d", ret);
	CHECK(atomic_load(&hook_calls) == 3, "hook called %d times", atomic_load(&hook_calls));
	CHECK(atomic_load(&namer_calls) == 2, "B's namer asked %d times for 2 connections",
	      atomic_load(&namer_calls));
	/* The hook says no: the session is refused, the app sees a reset, not a hang. */
	atomic_store(&hook_refuse, 1);
	ret = echo_through("10.77.1.2", 99);
	CHECK(ret == -ECONNRESET || ret == -EPROTO || ret == -ECONNREFUSED || ret == -EPIPE,
	      "a refused socket: %d", ret);

	sa = stats(a);
	sb = stats(b);
	CHECK(num(sa, "sessions.total") == 4, "A sessions %g", num(sa, "sessions.total"));
	CHECK(num(sb, "sessions.total") == 2, "B sessions %g", num(sb, "sessions.total"));
	CHECK(num(sa, "relay.bytes_up") == 3.0 * XFER_BYTES, "A up %g",
	      num(sa, "relay.bytes_up"));
	CHECK(num(sb, "relay.bytes_down") == 2.0 * XFER_BYTES, "B down %g",
	      num(sb, "relay.bytes_down"));
	/* A's first document: its rates are over the whole time since its start, so rate times
	 * window gives back the bytes counted (the window is whole milliseconds, rounded down:
	 * the bytes lie between rate x window and rate x (window + 1 ms)). */
	double win = num(sa, "throughput.window_ms") / 1000.0;
	double up = num(sa, "throughput.tcp_up_bps") / 8;
	CHECK(win > 0, "throughput.window_ms %g", win);
	CHECK(up * win <= 3.0 * XFER_BYTES * 1.001 &&
		      up * (win + 0.001) >= 3.0 * XFER_BYTES * 0.999,
	      "throughput.tcp_up_bps over %g s gives %g bytes, relay.bytes_up %g", win, up * win,
	      num(sa, "relay.bytes_up"));
	/* The same for what A read from its TUN and what its in-kernel fast path (on wherever it
	 * loads) rewrote; the uplink's bytes are in the two together (a connection joins the fast
	 * path some milliseconds after its accept), or all in the first without the fast path. */
	double rx = num(sa, "tun.rx_bytes"), rxr = num(sa, "throughput.tun_rx_bps") / 8;
	double fb = num(sa, "fast_path.bytes"), fbr = num(sa, "throughput.fast_path_bps") / 8;
	CHECK(rxr * win <= rx * 1.001 && rxr * (win + 0.001) >= rx * 0.999,
	      "throughput.tun_rx_bps over %g s gives %g bytes, tun.rx_bytes %g", win, rxr * win,
	      rx);
	CHECK(fbr * win <= fb * 1.001 && fbr * (win + 0.001) >= fb * 0.999,
	      "throughput.fast_path_bps over %g s gives %g bytes, fast_path.bytes %g", win,
	      fbr * win, fb);
	if (strcmp(str(sa, "fast_path.state"), "on") == 0)
		CHECK(rx + fb >= 3.0 * XFER_BYTES, "tun.rx_bytes %g + fast_path.bytes %g", rx, fb);
	else
		CHECK(rx >= 3.0 * XFER_BYTES, "tun.rx_bytes %g (fast_path.state %s)", rx,
		      str(sa, "fast_path.state"));
	CHECK(num(sa, "throughput.udp_up_bps") == 0, "no UDP");
	CHECK(strcmp(str(sb, "tun.io_mode"), "offload") == 0, "B mode");
	CHECK(strcmp(str(sb, "tun.owner"), "caller") == 0, "B owner");
	cJSON_Delete(sa);
	cJSON_Delete(sb);
	ts_proxy_stop(a);
	CHECK(ts_proxy_wait(a) == 0, "A stopped");
	/* B is untouched by A's stop. */
	CHECK((ret = echo_through("10.77.1.3", 42)) == 0, "via B after A stopped: %d", ret);
	ts_proxy_free(a);
	ts_proxy_free(b);
	close(tunfd);
	kill(srv, SIGKILL);
	waitpid(srv, NULL, 0);
}

Test(api, two_system_proxies_in_one_process, .timeout = 60)
{
	run_in_netns(two_proxies);
}

/* ---- the TUN deleted under a running proxy ------------------------------------------------ */

/* `ip link del` while the proxy runs: it stops by itself within a second with the reason,
 * instead of spinning on a dead fd (which stays readable). */
static void removed_under(const char *stack, const char *dev, const char *extra)
{
	char cfg[1024];
	struct ts_proxy *p;
	int64_t t0, t1;
	struct timespec ts;
	int why;

	snprintf(cfg, sizeof(cfg), sys_cfg_fmt, stack, dev, "198.18.0.1/15", extra);
	p = new_proxy(cfg);
	start(p);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t0 = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
	sh("ip link del %s", dev);
	why = ts_proxy_wait(p);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t1 = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
	CHECK(why == -EBADFD || why == -ENODEV || why == -EIO, "%s%s: stopped with %d (%s)", stack,
	      extra, why, strerror(-why));
	CHECK(t1 - t0 < 1000, "%s%s: stopped after %lld ms", stack, extra, (long long)(t1 - t0));
	ts_proxy_free(p);
}

static void tun_removed(void)
{
	removed_under("system", "tdl0", "");
	removed_under("system", "tdl1", ", \"queues\": 2");
	removed_under("lwip", "tdl2", "");
}

Test(api, tun_removed_under_a_running_proxy, .timeout = 30)
{
	run_in_netns(tun_removed);
}

/* ---- reload ----------------------------------------------------------------------------- */

static const char reload_cfg_fmt[] =
	"{\"log\": {\"level\": \"warn\"}, \"tun\": {\"name\": \"trl0\", \"address\": "
	"\"198.18.0.1/15\", \"mtu\": %u}, \"timeouts\": {\"connect_ms\": %u},"
	" \"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\"%s}]}";

static int reload_json(struct ts_proxy *p, const char *json, char *err, size_t errlen)
{
	return ts_proxy_reload(p, json, json ? strlen(json) : 0, err, errlen);
}

/* A running proxy takes a new configuration: the generation moves, keys that need a restart
 * are reported and kept, a broken or looping configuration is refused and the old one goes
 * on; a file-made proxy reads its file again on request (the SIGHUP path). */
static void reload(void)
{
	char cfg[1024], err[512] = "", path[] = "/tmp/ts-reload-XXXXXX";
	struct ts_proxy *p;
	cJSON *doc;

	snprintf(cfg, sizeof(cfg), reload_cfg_fmt, 1500, 5000, "");
	p = new_proxy(cfg);
	CHECK(reload_json(p, cfg, err, sizeof(err)) == -ESRCH, "not running yet: %s", err);
	start(p);
	doc = stats(p);
	CHECK(num(doc, "config.generation") == 0, "generation 0");
	CHECK(strcmp(str(doc, "reload.last_result"), "none") == 0, "no reload yet");
	cJSON_Delete(doc);

	/* A good one, with a key that needs a restart. */
	snprintf(cfg, sizeof(cfg), reload_cfg_fmt, 1400, 7000, "");
	CHECK(reload_json(p, cfg, err, sizeof(err)) == 0, "reload: %s", err);
	doc = stats(p);
	CHECK(num(doc, "config.generation") == 1, "generation 1");
	CHECK(strcmp(str(doc, "reload.last_result"), "ok") == 0, "ok");
	CHECK(strcmp(str(doc, "reload.kept"), "tun.mtu") == 0, "kept: %s", str(doc, "reload.kept"));
	cJSON_Delete(doc);
	int mtu = 0;
	char line[32] = "";
	FILE *f = fopen("/sys/class/net/trl0/mtu", "r");
	CHECK(f && fgets(line, sizeof(line), f), "mtu");
	fclose(f);
	mtu = atoi(line);
	CHECK(mtu == 1500, "the TUN's MTU is the running one: %d", mtu);

	/* A broken one: the message of check, and nothing changes. */
	CHECK(reload_json(p, "{\"tun\": {\"mtu\": 1}}", err, sizeof(err)) == -EINVAL, "bad");
	CHECK(strncmp(err, "config: $.tun.mtu: ", 19) == 0, "names the path: %s", err);
	CHECK(reload_json(p, "{\"user\": \"no-such-user-here\"}", err, sizeof(err)) == -EINVAL,
	      "unknown user");
	CHECK(strncmp(err, "config: $.user: ", 16) == 0, "%s", err);
	doc = stats(p);
	CHECK(num(doc, "config.generation") == 1, "still generation 1");
	CHECK(num(doc, "reload.refused") == 2 && num(doc, "reload.ok") == 1, "counted");
	CHECK(strcmp(str(doc, "reload.last_result"), "refused") == 0, "refused");
	CHECK(strstr(str(doc, "reload.last_error"), "$.user") != NULL, "last error");
	cJSON_Delete(doc);

	/* Its outbounds would loop: an unmarked socket with the default route into the TUN. */
	sh("ip route replace default dev trl0");
	snprintf(cfg, sizeof(cfg), reload_cfg_fmt, 1500, 5000, "");
	char unmarked[1024];
	snprintf(unmarked, sizeof(unmarked),
		 "{\"route\": {\"default_mark\": 0}, \"tun\": {\"name\": \"trl0\"}}");
	CHECK(reload_json(p, unmarked, err, sizeof(err)) == -ELOOP, "loop refused: %s", err);
	CHECK(strstr(err, "$.outbounds[0]") && strstr(err, "trl0"), "%s", err);
	CHECK(ts_proxy_running(p) == 1, "still running");
	/* No file behind a JSON-made proxy. */
	CHECK(reload_json(p, NULL, err, sizeof(err)) == -ENOENT, "no file: %s", err);
	ts_proxy_request_reload(p); /* the same, asynchronously: refused in the log */
	ts_proxy_stop(p);
	CHECK(ts_proxy_wait(p) == 0, "stopped");
	CHECK(reload_json(p, cfg, err, sizeof(err)) == -ESRCH, "stopped: %s", err);
	ts_proxy_free(p);

	/* From a file: the request re-reads it. */
	int fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");
	snprintf(cfg, sizeof(cfg), reload_cfg_fmt, 1500, 5000, "");
	CHECK(write(fd, cfg, strlen(cfg)) == (ssize_t)strlen(cfg), "write");
	close(fd);
	CHECK(ts_proxy_new_file(path, &p, err, sizeof(err)) == 0, "%s", err);
	start(p);
	snprintf(cfg, sizeof(cfg), reload_cfg_fmt, 1500, 9000, ", \"routing_mark\": 5");
	FILE *w = fopen(path, "w");
	CHECK(w && fputs(cfg, w) >= 0, "rewrite");
	fclose(w);
	ts_proxy_request_reload(p);
	double gen = 0;
	for (int i = 0; i < 100 && gen < 1; i++) {
		doc = stats(p);
		gen = num(doc, "config.generation");
		cJSON_Delete(doc);
		if (gen < 1)
			usleep(20000);
	}
	CHECK(gen == 1, "the file was read again");
	CHECK(reload_json(p, NULL, err, sizeof(err)) == 0, "%s", err);
	doc = stats(p);
	CHECK(num(doc, "config.generation") == 2, "generation 2");
	cJSON_Delete(doc);
	ts_proxy_stop(p);
	CHECK(ts_proxy_wait(p) == 0, "stopped");
	ts_proxy_free(p);
	unlink(path);
}

Test(api, reload, .timeout = 60)
{
	run_in_netns(reload);
}

/* ---- a reload that moves the resolver's upstream to another proxy -------------------------- */

/* A scripted SOCKS5 server that is also the DNS server behind it: it takes any CONNECT
 * (counted; RFC 1929 credentials when offered, the user name kept), then answers every query
 * framed on the connection (RFC 7766) with one A record, 192.0.2.<id>: an answer tells which
 * server carried it. plain: no SOCKS5, a DNS over TCP server only (each connection counted).
 * One thread, poll over the listener and up to 8 connections. */
struct socks_dns {
	int ls;
	uint16_t port;
	uint8_t id;
	bool plain;
	pthread_t th;
	atomic_bool stop;
	atomic_int connects, open, queries;
	char user[64];              /* written before connects moves */
};

/* n bytes, or false (EOF, error, 2 s without them). */
static bool read_n(int fd, uint8_t *b, size_t n)
{
	while (n) {
		ssize_t r = recv(fd, b, n, 0);
		if (r <= 0)
			return false;
		b += r;
		n -= (size_t)r;
	}
	return true;
}

static bool socks_handshake(struct socks_dns *sd, int fd)
{
	uint8_t b[512], method = 0x00;
	char user[64] = "";

	if (sd->plain) {
		atomic_fetch_add(&sd->connects, 1);
		return true;
	}
	if (!read_n(fd, b, 2) || b[0] != 5 || !read_n(fd, b + 2, b[1]))
		return false;
	for (int i = 0; i < b[1]; i++)
		if (b[2 + i] == 0x02)
			method = 0x02;
	if (send(fd, (uint8_t[]){ 5, method }, 2, MSG_NOSIGNAL) != 2)
		return false;
	if (method == 0x02) {
		if (!read_n(fd, b, 2) || !read_n(fd, b + 2, b[1] + 1u))
			return false;
		snprintf(user, sizeof(user), "%.*s", b[1], (const char *)b + 2);
		if (!read_n(fd, b + 3 + b[1], b[2 + b[1]]) ||
		    send(fd, (uint8_t[]){ 1, 0 }, 2, MSG_NOSIGNAL) != 2)
			return false;
	}
	if (!read_n(fd, b, 4) || b[0] != 5 || b[1] != 1)
		return false;
	if (b[3] == 1 ? !read_n(fd, b, 6) : b[3] == 4 ? !read_n(fd, b, 18) :
	    b[3] == 3 ? !read_n(fd, b, 1) || !read_n(fd, b + 1, b[0] + 2u) : true)
		return false;
	if (send(fd, (uint8_t[]){ 5, 0, 0, 1, 0, 0, 0, 0, 0, 0 }, 10, MSG_NOSIGNAL) != 10)
		return false;
	snprintf(sd->user, sizeof(sd->user), "%s", user);
	atomic_fetch_add(&sd->connects, 1);
	return true;
}

/* One framed query answered. false: the connection is over. */
static bool socks_dns_answer(struct socks_dns *sd, int fd)
{
	uint8_t b[600];
	size_t len, end = 12;

	if (!read_n(fd, b, 2) || (len = (size_t)b[0] << 8 | b[1]) < 17 || len > 512 ||
	    !read_n(fd, b + 2, len))
		return false;
	while (end < len && b[2 + end])
		end += b[2 + end] + 1u;
	end += 5; /* the root label, type, class */
	if (end > len)
		return false;
	tu_put16(b + 2 + 2, 0x8180);
	tu_put16(b + 2 + 6, 1);
	tu_put16(b + 2 + 8, 0);
	tu_put16(b + 2 + 10, 0);
	memcpy(b + 2 + end, (uint8_t[]){ 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2,
					  sd->id }, 16);
	end += 16;
	tu_put16(b, (uint16_t)end);
	if (send(fd, b, end + 2, MSG_NOSIGNAL) != (ssize_t)(end + 2))
		return false;
	atomic_fetch_add(&sd->queries, 1);
	return true;
}

static void *socks_dns_main(void *arg)
{
	struct socks_dns *sd = arg;
	struct pollfd pf[9] = { { .fd = sd->ls, .events = POLLIN } };
	struct timeval tv = { 2, 0 };
	int n = 1;

	while (!atomic_load(&sd->stop)) {
		if (poll(pf, (nfds_t)n, 50) <= 0)
			continue;
		for (int i = n - 1; i > 0; i--) {
			if (!pf[i].revents || socks_dns_answer(sd, pf[i].fd))
				continue;
			close(pf[i].fd);
			pf[i] = pf[--n];
			atomic_fetch_sub(&sd->open, 1);
		}
		if (pf[0].revents && n < 9) {
			int fd = accept4(sd->ls, NULL, NULL, SOCK_CLOEXEC);
			if (fd < 0)
				continue;
			setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
			if (!socks_handshake(sd, fd)) {
				close(fd);
				continue;
			}
			pf[n++] = (struct pollfd){ .fd = fd, .events = POLLIN };
			atomic_fetch_add(&sd->open, 1);
		}
	}
	for (int i = 1; i < n; i++)
		close(pf[i].fd);
	return NULL;
}

static void socks_dns_start(struct socks_dns *sd, uint8_t id, bool plain)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	memset(sd, 0, sizeof(*sd));
	sd->id = id;
	sd->plain = plain;
	sd->ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(sd->ls >= 0 && bind(sd->ls, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	      listen(sd->ls, 8) == 0 && getsockname(sd->ls, (struct sockaddr *)&sa, &len) == 0,
	      "listen: %s", strerror(errno));
	sd->port = ntohs(sa.sin_port);
	CHECK(pthread_create(&sd->th, NULL, socks_dns_main, sd) == 0, "thread");
}

static void socks_dns_stop(struct socks_dns *sd)
{
	atomic_store(&sd->stop, true);
	pthread_join(sd->th, NULL);
	close(sd->ls);
}

/* An A query for name over UDP to port 53 through the TUN (the proxy answers it): the answer's
 * last address byte (its server's id), or -errno / -rcode. */
static int resolve_via_tun(const char *name, uint16_t id)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(53) };
	uint8_t q[256], r[512];
	size_t n = 12;
	ssize_t got;
	int fd, ret;

	memset(q, 0, 12);
	tu_put16(q, id);
	tu_put16(q + 2, 0x0100);
	tu_put16(q + 4, 1);
	for (const char *p = name; *p;) {
		const char *dot = strchr(p, '.');
		size_t l = dot ? (size_t)(dot - p) : strlen(p);
		q[n++] = (uint8_t)l;
		memcpy(q + n, p, l);
		n += l;
		p += l + (dot ? 1 : 0);
	}
	q[n++] = 0;
	tu_put16(q + n, 1);
	tu_put16(q + n + 2, 1);
	n += 4;
	inet_pton(AF_INET, "198.18.9.9", &sa.sin_addr);
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    send(fd, q, n, 0) != (ssize_t)n) {
		ret = -errno;
		goto out;
	}
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	if (poll(&pf, 1, 5000) != 1) {
		ret = -ETIMEDOUT;
		goto out;
	}
	got = recv(fd, r, sizeof(r), 0);
	if (got < 12 || tu_get16(r) != id) {
		ret = -EPROTO;
		goto out;
	}
	if ((ret = -(tu_get16(r + 2) & 0xf)) == 0)
		ret = tu_get16(r + 6) == 1 ? r[got - 1] : -ENODATA;
out:
	close(fd);
	return ret;
}

static const char dns_detour_cfg_fmt[] =
	"{\"log\": {\"level\": \"warn\"}, \"tun\": {\"name\": \"trd0\", \"address\": "
	"\"198.18.0.1/15\"}, \"timeouts\": {\"connect_ms\": %u},"
	" \"outbounds\": [{\"tag\": \"p\", \"type\": \"socks5\", \"server\": \"127.0.0.1:%u\"},"
	" {\"tag\": \"q\", \"type\": \"socks5\", \"server\": \"127.0.0.1:%u\","
	" \"username\": \"u2\", \"password\": \"pw\"}, {\"tag\": \"direct\", \"type\": \"direct\"}],"
	" \"route\": {\"final\": \"%s\"},"
	" \"dns\": {\"hijack\": true, \"servers\": [{\"tag\": \"remote\","
	" \"address\": \"tcp://10.53.0.1\"}, {\"tag\": \"lan\", \"address\": \"tcp://127.0.0.1:%u\","
	" \"detour\": \"direct\"}], \"rules\": [{\"domain_suffix\": [\"lan.test\"],"
	" \"server\": \"lan\"}], \"final\": \"remote\"}}";

/* The resolver's server "remote" goes through route.final's outbound (no detour of its own),
 * "lan" through a direct one. A reload that changes remote's outbound (its server, then which
 * outbound route.final names, with credentials) sends the next query through the new one,
 * without a restart; a reload that leaves an outbound alone keeps its open connection. */
static void dns_detour_reload(void)
{
	struct socks_dns s1, s2, s3;
	char cfg[2048], err[512] = "";
	struct ts_proxy *p;
	cJSON *doc;
	int ret;

	sh("ip link set lo up");
	socks_dns_start(&s1, 1, false);
	socks_dns_start(&s2, 2, false);
	socks_dns_start(&s3, 3, true);
	snprintf(cfg, sizeof(cfg), dns_detour_cfg_fmt, 5000, s1.port, s2.port, "p", s3.port);
	p = new_proxy(cfg);
	start(p);
	CHECK((ret = resolve_via_tun("a.example", 1)) == 1, "through server 1: %d", ret);
	CHECK((ret = resolve_via_tun("a.lan.test", 2)) == 3, "direct to server 3: %d", ret);

	/* A reload that leaves both outbounds as they are: both connections stay. */
	snprintf(cfg, sizeof(cfg), dns_detour_cfg_fmt, 6000, s1.port, s2.port, "p", s3.port);
	CHECK(reload_json(p, cfg, err, sizeof(err)) == 0, "reload: %s", err);
	CHECK((ret = resolve_via_tun("b.example", 3)) == 1, "server 1: %d", ret);
	CHECK((ret = resolve_via_tun("b.lan.test", 4)) == 3, "server 3: %d", ret);
	CHECK(atomic_load(&s1.connects) == 1 && atomic_load(&s3.connects) == 1,
	      "the same connections: %d through server 1, %d to server 3",
	      atomic_load(&s1.connects), atomic_load(&s3.connects));

	/* remote's outbound moves to another server. */
	snprintf(cfg, sizeof(cfg), dns_detour_cfg_fmt, 6000, s2.port, s2.port, "p", s3.port);
	CHECK(reload_json(p, cfg, err, sizeof(err)) == 0, "reload: %s", err);
	doc = stats(p);
	CHECK(strcmp(str(doc, "reload.kept"), "") == 0, "kept: %s", str(doc, "reload.kept"));
	cJSON_Delete(doc);
	CHECK((ret = resolve_via_tun("c.example", 5)) == 2,
	      "after the reload, through server 2: %d (server 1: %d queries)", ret,
	      atomic_load(&s1.queries));
	CHECK(atomic_load(&s2.connects) == 1 && s2.user[0] == '\0', "server 2: %d connections",
	      atomic_load(&s2.connects));
	for (int i = 0; i < 100 && atomic_load(&s1.open) > 0; i++)
		usleep(20000);
	CHECK(atomic_load(&s1.open) == 0, "the connection through server 1 closed");
	CHECK((ret = resolve_via_tun("c.lan.test", 6)) == 3 && atomic_load(&s3.connects) == 1,
	      "lan untouched: %d, %d connections", ret, atomic_load(&s3.connects));

	/* route.final names another outbound (the same server, with credentials). */
	snprintf(cfg, sizeof(cfg), dns_detour_cfg_fmt, 6000, s2.port, s2.port, "q", s3.port);
	CHECK(reload_json(p, cfg, err, sizeof(err)) == 0, "reload: %s", err);
	CHECK((ret = resolve_via_tun("d.example", 7)) == 2, "server 2: %d", ret);
	CHECK(atomic_load(&s2.connects) == 2 && strcmp(s2.user, "u2") == 0,
	      "a new connection as u2: %d connections, user \"%s\"", atomic_load(&s2.connects),
	      s2.user);
	doc = stats(p);
	CHECK(strcmp(str(doc, "reload.kept"), "") == 0, "kept: %s", str(doc, "reload.kept"));
	CHECK(num(doc, "dns.answered.upstream") == 7, "answered %g",
	      num(doc, "dns.answered.upstream"));
	cJSON_Delete(doc);
	ts_proxy_stop(p);
	CHECK(ts_proxy_wait(p) == 0, "stopped");
	ts_proxy_free(p);
	socks_dns_stop(&s1);
	socks_dns_stop(&s2);
	socks_dns_stop(&s3);
}

Test(api, reload_sends_dns_through_the_new_detour, .timeout = 60)
{
	run_in_netns(dns_detour_reload);
}

/* ---- a reload being prepared when the proxy stops ------------------------------------------ */

struct slow_reload {
	struct ts_proxy *p;
	const char *json;
	_Atomic int started;
	int ret;
	char err[512];
};

static void *slow_reload_main(void *arg)
{
	struct slow_reload *r = arg;

	atomic_store(&r->started, 1);
	r->ret = reload_json(r->p, r->json, r->err, sizeof(r->err));
	return NULL;
}

/* A reload still reading a large rule set (on the caller's thread) when a stop comes: the stop
 * waits for it (it reads the TUN and the configuration the stop closes), and it answers
 * -ESRCH. Before, the stop freed them under it: a crash on the TUN's index. */
static void reload_during_stop(void)
{
	char cfg[1024], json[2048], path[] = "/tmp/ts-bigset-XXXXXX";
	struct slow_reload r = { 0 };
	struct ts_proxy *p;
	pthread_t t;
	FILE *f;
	int fd;

	CHECK((fd = mkstemp(path)) >= 0, "mkstemp");
	CHECK((f = fdopen(fd, "w")) != NULL, "fdopen");
	for (int i = 0; i < 1000000; i++)
		fprintf(f, "d%d.bigset.example\n", i);
	CHECK(fclose(f) == 0, "write %s", path);
	snprintf(cfg, sizeof(cfg), reload_cfg_fmt, 1500, 1000, "");
	snprintf(json, sizeof(json),
		 "{\"log\": {\"level\": \"warn\"}, \"tun\": {\"name\": \"trl0\", \"address\": "
		 "\"198.18.0.1/15\"}, \"rule_sets\": [{\"tag\": \"big\", \"format\": \"plain\","
		 " \"path\": \"%s\"}], \"route\": {\"rules\": [{\"rule_set\": [\"big\"],"
		 " \"outbound\": \"direct\"}]},"
		 " \"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\"}]}", path);
	p = new_proxy(cfg);
	start(p);
	r.p = p;
	r.json = json;
	CHECK(pthread_create(&t, NULL, slow_reload_main, &r) == 0, "thread");
	while (!atomic_load(&r.started))
		usleep(1000);
	usleep(50000);
	ts_proxy_stop(p);
	CHECK(ts_proxy_wait(p) == 0, "stopped");
	CHECK(pthread_join(t, NULL) == 0, "join");
	CHECK(r.ret == -ESRCH, "the reload: %d %s", r.ret, r.err);
	ts_proxy_free(p);
	unlink(path);
}

Test(api, reload_being_prepared_when_the_proxy_stops, .timeout = 60)
{
	run_in_netns(reload_during_stop);
}

/* ---- every allocation refused in turn (failalloc.h) ----------------------------------------- */

/* The whole proxy through the API with the nth allocation of any thread refused
 * (failalloc_arm_all: the proxy assembles itself on this thread, but its loop thread answers
 * the stats and the reload, carries the traffic and takes it apart), for n = 1, 2, ... until
 * a run that never reaches n. One step at a time, each waited for, so one thread allocates at
 * a time and the order is the same on every run: created, started, one TCP connection, one
 * UDP datagram, the stats, a reload, stopped, freed. A step may fail only for want of memory;
 * a start that fails leaves nothing: no thread, no descriptor, no TUN device, no rule or
 * route. The system stack opens its own TUN and installs auto_route's rules and a stats
 * endpoint; the lwIP stack runs on a TUN fd the test opened. */

#define NOMEM_MAX 4000

static long nomem_at; /* the allocation refused now (0: none) */
static int nomem_keys; /* the stats' keys when nothing is refused */
static pthread_mutex_t nomem_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char nomem_log_last[256]; /* the last error the proxy logged: for the messages */
static _Atomic int nomem_reloads;  /* reloads the proxy logged as done or refused */

static void nomem_log(void *arg, int level, const char *line, size_t len)
{
	(void)arg;
	(void)len;
	if (strstr(line, "reload: configuration ") || strstr(line, "reload: refused"))
		atomic_fetch_add(&nomem_reloads, 1);
	if (level != TS_LOG_ERROR)
		return;
	pthread_mutex_lock(&nomem_log_lock);
	snprintf(nomem_log_last, sizeof(nomem_log_last), "%s", line);
	pthread_mutex_unlock(&nomem_log_lock);
}

/* The namespace's links, rules and routes, as text. */
static void ip_state(char *out, size_t cap)
{
	FILE *f = popen("ip -o link show; ip rule show; ip -6 rule show; ip route show table all;"
			" ip -6 route show table all", "r");
	size_t got;

	CHECK(f != NULL, "popen");
	got = fread(out, 1, cap - 1, f);
	out[got] = '\0';
	CHECK(pclose(f) == 0 && got < cap - 1, "ip: %zu bytes", got);
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Wait until fd has events, at most until the deadline: whether it does. A wait interrupted
 * goes on (the leak checker of the ASan tree stops every thread for a moment). */
static bool wait_fd(int fd, short events, int64_t deadline)
{
	struct pollfd pf = { .fd = fd, .events = events };
	int64_t left;

	while ((left = deadline - mono_ms()) > 0) {
		int n = poll(&pf, 1, (int)left);
		if (n > 0)
			return true;
		if (n < 0 && errno != EINTR)
			return false;
	}
	return false;
}

/* One TCP connection to the echo server through the TUN: 0 echoed, -errno refused or reset,
 * -ETIMEDOUT neither within 4 s (a SYN dropped is sent again after 1 s, and again 2 s later). */
static int nomem_tcp(const char *dst)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(ECHO_PORT) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), ret = 0;
	int64_t deadline = mono_ms() + 4000;
	socklen_t sl = sizeof(ret);
	size_t got = 0;
	char buf[5];

	inet_pton(AF_INET, dst, &sa.sin_addr);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS) {
		ret = -errno;
		goto out;
	}
	if (!wait_fd(fd, POLLOUT, deadline)) {
		ret = -ETIMEDOUT;
		goto out;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &ret, &sl) != 0 || ret != 0) {
		ret = -ret;
		goto out;
	}
	if (send(fd, "hello", 5, MSG_NOSIGNAL) != 5) {
		ret = -errno;
		goto out;
	}
	while (got < sizeof(buf)) {
		ssize_t n;
		if (!wait_fd(fd, POLLIN, deadline)) {
			ret = -ETIMEDOUT;
			goto out;
		}
		if ((n = recv(fd, buf + got, sizeof(buf) - got, 0)) <= 0) {
			ret = n == 0 ? -EPROTO : -errno;
			goto out;
		}
		got += (size_t)n;
	}
	ret = memcmp(buf, "hello", 5) == 0 ? 0 : -EPROTO;
out:
	close(fd);
	return ret;
}

/* One UDP datagram to the echo server through the TUN: echoed within a second? */
static bool nomem_udp(const char *dst)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(ECHO_PORT) };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	char buf[8];
	ssize_t n;

	inet_pton(AF_INET, dst, &sa.sin_addr);
	n = sendto(fd, "ping", 4, 0, (struct sockaddr *)&sa, sizeof(sa));
	if (n == 4)
		n = wait_fd(fd, POLLIN, mono_ms() + 1000) ? recv(fd, buf, sizeof(buf), 0) : -1;
	close(fd);
	return n == 4 && memcmp(buf, "ping", 4) == 0;
}

/* The sum of every counter whose key says it counts a loss (a drop, no memory, a failure). */
static double losses(cJSON *doc)
{
	double sum = 0;
	cJSON *e;

	cJSON_ArrayForEach(e, doc) {
		if (cJSON_IsObject(e))
			sum += losses(e);
		else if (cJSON_IsNumber(e) &&
			 (strstr(e->string, "drop") || strstr(e->string, "nomem") ||
			  strstr(e->string, "no_memory") || strstr(e->string, "fail")))
			sum += e->valuedouble;
	}
	return sum;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "%s: %s", path, strerror(errno));
}

struct nomem_case {
	const char *stack;
	const char *path;      /* the proxy's configuration file */
	const char *reloaded;  /* the same with another connect timeout */
	const char *dev;       /* the TUN device */
	const char *dst;       /* the echo server's address through it */
	int tunfd;             /* the caller's TUN fd, or -1: the proxy opens the device */
};

#define NOMEM_OK(sweep, ret) ((ret) == 0 || ((sweep) && ((ret) == -ENOMEM || (ret) == -ENOBUFS)))

/* The proxy's life, once; with sweep, allocation nomem_at refused (armed by the caller). */
static void nomem_life(const struct nomem_case *c, bool sweep)
{
	char err[512] = "", *json = NULL;
	struct ts_proxy *p = NULL;
	int ret;

	nomem_log_last[0] = '\0';
	err[0] = '\0';
	ret = ts_proxy_new_file(c->path, &p, err, sizeof(err));
	CHECK(NOMEM_OK(sweep, ret), "%s: new: %d %s (allocation %ld refused)", c->stack, ret, err,
	      nomem_at);
	if (ret != 0) {
		CHECK(p == NULL, "a failed new returned a proxy");
		CHECK(err[0] != '\0', "%s: new: %d without a message (allocation %ld refused)",
		      c->stack, ret, nomem_at);
		return;
	}
	CHECK(ts_proxy_set_log(p, nomem_log, NULL) == 0, "set_log");
	if (c->tunfd >= 0)
		CHECK(ts_proxy_set_tun_fd(p, c->tunfd) == 0, "set fd");
	err[0] = '\0';
	ret = ts_proxy_start(p, err, sizeof(err));
	CHECK(NOMEM_OK(sweep, ret), "%s: start: %d %s (allocation %ld refused)", c->stack, ret,
	      err, nomem_at);
	if (ret != 0) {
		CHECK(err[0] != '\0', "%s: start: %d without a message (allocation %ld refused)",
		      c->stack, ret, nomem_at);
		CHECK(ts_proxy_running(p) == 0 && ts_proxy_wait(p) == -EINVAL,
		      "%s: a failed start left the proxy running", c->stack);
		CHECK(c->tunfd >= 0 || access(c->dev, F_OK) != 0,
		      "%s: a failed start left %s (allocation %ld refused)", c->stack, c->dev,
		      nomem_at);
		ts_proxy_free(p);
		return;
	}
	/* Traffic: each connection and datagram answered, refused, or dropped and counted. */
	ret = nomem_tcp(c->dst);
	CHECK(ret == 0 || (sweep && (ret == -ECONNRESET || ret == -ECONNREFUSED || ret == -EPIPE)),
	      "%s: TCP: %d (allocation %ld refused; %s)", c->stack, ret, nomem_at, nomem_log_last);
	if (!nomem_udp(c->dst)) {
		cJSON *doc;
		CHECK(sweep, "%s: the datagram was not echoed", c->stack);
		CHECK(ts_proxy_stats_json(p, &json, NULL) == 0, "stats");
		doc = cJSON_Parse(json);
		ts_free(json);
		CHECK(doc && losses(doc) > 0,
		      "%s: a datagram neither echoed nor counted (allocation %ld refused; %s)",
		      c->stack, nomem_at, nomem_log_last);
		cJSON_Delete(doc);
	}
	/* The document whole, or none: never one missing a part. */
	json = NULL;
	ret = ts_proxy_stats_json(p, &json, NULL);
	CHECK(NOMEM_OK(sweep, ret), "%s: stats: %d", c->stack, ret);
	CHECK((ret == 0) == (json != NULL), "stats: %d with %p", ret, (void *)json);
	if (json) {
		static char keys[65536];
		cJSON *doc = cJSON_Parse(json);
		int n = 0;
		keys[0] = '\0';
		CHECK(doc != NULL, "%s: the stats do not parse (allocation %ld refused)", c->stack,
		      nomem_at);
		leaves(doc, "", keys, sizeof(keys), &n);
		cJSON_Delete(doc);
		if (!sweep)
			nomem_keys = n;
		CHECK(n == nomem_keys, "%s: %d stats keys, not %d (allocation %ld refused)",
		      c->stack, n, nomem_keys, nomem_at);
	}
	ts_free(json);
	err[0] = '\0';
	ret = reload_json(p, c->reloaded, err, sizeof(err));
	CHECK(NOMEM_OK(sweep, ret), "%s: reload: %d %s (allocation %ld refused)", c->stack, ret,
	      err, nomem_at);
	CHECK(ret == 0 || err[0] != '\0', "%s: reload: %d without a message (allocation %ld "
	      "refused)", c->stack, ret, nomem_at);
	/* As SIGHUP asks: the file read again on a thread of the proxy's, done or refused. The
	 * wait allocates nothing, so that thread allocates alone. */
	int reloads = atomic_load(&nomem_reloads);
	ts_proxy_request_reload(p);
	for (int i = 0; i < 2000 && atomic_load(&nomem_reloads) == reloads; i++)
		usleep(1000);
	CHECK(atomic_load(&nomem_reloads) > reloads,
	      "%s: a requested reload neither done nor refused (allocation %ld refused)", c->stack,
	      nomem_at);
	CHECK(ts_proxy_running(p) == 1, "%s: stopped by itself (allocation %ld refused; %s)",
	      c->stack, nomem_at, nomem_log_last);
	ts_proxy_stop(p);
	ret = ts_proxy_wait(p);
	CHECK(ret == 0, "%s: stopped with %d (allocation %ld refused; %s)", c->stack, ret, nomem_at,
	      nomem_log_last);
	/* The final figures, or the want of memory that kept the loop from taking them. */
	json = NULL;
	ret = ts_proxy_stats_json(p, &json, NULL);
	CHECK(NOMEM_OK(sweep, ret) && (ret == 0) == (json != NULL), "%s: final stats: %d",
	      c->stack, ret);
	ts_free(json);
	ts_proxy_free(p);
}

static void nomem_sweep(const struct nomem_case *c)
{
	static char before[16384], after[16384];
	int fds = tu_dir_entries("/proc/self/fd"), threads = tu_dir_entries("/proc/self/task");
	long n;

	ip_state(before, sizeof(before));
	nomem_at = 0;
	nomem_life(c, false);
	for (n = 1; n <= NOMEM_MAX; n++) {
		nomem_at = n;
		failalloc_arm_all(n);
		nomem_life(c, true);
		failalloc_arm_all(0);
		CHECK(tu_dir_entries("/proc/self/task") == threads,
		      "%s: a thread outlived the proxy (allocation %ld refused)", c->stack, n);
		CHECK(tu_dir_entries("/proc/self/fd") == fds,
		      "%s: %d descriptors left (allocation %ld refused)", c->stack,
		      tu_dir_entries("/proc/self/fd") - fds, n);
		ip_state(after, sizeof(after));
		CHECK(strcmp(before, after) == 0,
		      "%s: links, rules or routes left (allocation %ld refused):\n%.600s", c->stack,
		      n, after);
#ifdef TS_LSAN
		CHECK(__lsan_do_recoverable_leak_check() == 0, "%s: leaked with allocation %ld refused",
		      c->stack, n);
#endif
		if (!failalloc_fired())
			break;
	}
	CHECK(n > 50 && n <= NOMEM_MAX, "%s: %ld allocations", c->stack, n - 1);
}

/* The server namespace behind a veth, as two_proxies has it; IPv6 off, so that the
 * namespace's links and routes change only with what the proxy does. */
static pid_t nomem_server(void)
{
	int ready[2], go[2];
	pid_t srv;
	char c;

	CHECK(pipe2(ready, O_CLOEXEC) == 0 && pipe2(go, O_CLOEXEC) == 0, "pipes");
	write_text("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1");
	write_text("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
	write_text("/proc/sys/net/ipv4/conf/all/rp_filter", "0");
	write_text("/proc/sys/net/ipv4/conf/default/rp_filter", "0");
	sh("ip link set lo up && ip link add va type veth peer name vb");
	if ((srv = fork()) == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		echo_server(ready[1], go[0]);
	}
	CHECK(read(ready[0], &c, 1) == 1, "server namespace");
	sh("ip link set vb netns %d", (int)srv);
	CHECK(write(go[1], "g", 1) == 1, "go");
	sh("ip link set va up && ip addr add 10.77.0.1/24 dev va");
	CHECK(read(ready[0], &c, 1) == 1 && c == 'l', "server listening");
	/* Straight to the server, not through a TUN: the veth carries packets only once the
	 * kernel has activated it (up to a second after it came up). */
	for (int i = 0; i < 3 && nomem_tcp("10.77.0.2") != 0; i++)
		;
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
	return srv;
}

#define NOMEM_SYS_CFG                                                                         \
	"{\"stack\": \"system\", \"log\": {\"level\": \"info\"},"                              \
	" \"tun\": {\"name\": \"tnm0\", \"address\": \"198.18.0.1/15\", \"queues\": 1,"         \
	" \"auto_route\": true},"                                                               \
	" \"stats\": {\"listen\": \"127.0.0.1:19191\"}, \"timeouts\": {\"connect_ms\": %u},"    \
	" \"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\"}]}"

static void nomem_system(void)
{
	char cfg[1024], reloaded[1024];
	struct nomem_case c = { .stack = "system", .path = "/tmp/ts-nomem-system.json",
				.reloaded = reloaded,
				.dev = "/sys/class/net/tnm0", .dst = "10.77.1.2", .tunfd = -1 };
	pid_t srv = nomem_server();

	/* auto_route sends the namespace's traffic into the TUN; the proxy's own (marked) goes
	 * by the main table to the server. */
	sh("ip route add 10.77.1.0/24 via 10.77.0.2");
	snprintf(cfg, sizeof(cfg), NOMEM_SYS_CFG, 5000);
	snprintf(reloaded, sizeof(reloaded), NOMEM_SYS_CFG, 6000);
	write_file(c.path, cfg);
	nomem_sweep(&c);
	unlink(c.path);
	kill(srv, SIGKILL);
	waitpid(srv, NULL, 0);
}

#define NOMEM_LWIP_CFG                                                                        \
	"{\"stack\": \"lwip\", \"log\": {\"level\": \"info\"},"                                \
	" \"tun\": {\"address\": \"198.19.0.1/16\"}, \"timeouts\": {\"connect_ms\": %u},"       \
	" \"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\", \"routing_mark\": 1}]}"

static void nomem_lwip(void)
{
	char cfg[1024], reloaded[1024];
	struct nomem_case c = { .stack = "lwip", .path = "/tmp/ts-nomem-lwip.json",
				.reloaded = reloaded,
				.dev = "/sys/class/net/tnl0", .dst = "10.77.1.3" };
	pid_t srv = nomem_server();

	c.tunfd = open_tun("tnl0", 0);
	sh("ip link set tnl0 up && ip addr add 198.19.0.1/16 dev tnl0 &&"
	   " ip route add 10.77.1.3/32 dev tnl0 && ip rule add fwmark 1 table 100 &&"
	   " ip route add 10.77.1.0/24 via 10.77.0.2 table 100");
	snprintf(cfg, sizeof(cfg), NOMEM_LWIP_CFG, 5000);
	snprintf(reloaded, sizeof(reloaded), NOMEM_LWIP_CFG, 6000);
	write_file(c.path, cfg);
	nomem_sweep(&c);
	unlink(c.path);
	close(c.tunfd);
	kill(srv, SIGKILL);
	waitpid(srv, NULL, 0);
}

TestSuite(api_nomem, .timeout = 300);

Test(api_nomem, system_each_allocation_refused_in_turn)
{
	run_in_netns(nomem_system);
}

Test(api_nomem, lwip_each_allocation_refused_in_turn)
{
	run_in_netns(nomem_lwip);
}
