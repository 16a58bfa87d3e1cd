/* test_privdrop.c — least privilege after start-up (runtime/privdrop.c): every scenario runs in
 * a forked child (the drop is irreversible) and reads the result back from the kernel
 * (/proc/self/status, /proc/self/task/<tid>/status) and by trying things the kept and the
 * dropped capabilities allow; tun.rps "auto" still switches after a drop to nobody, through the
 * rps_cpus files the TUN opened at start (core/tun_linux.c). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/capability.h>
#include <sys/stat.h>

#include "core/config.h"
#include "core/tun.h"
#include "runtime/privdrop.h"
#include "testutil.h"
#include "netns_child.h"

#define NOBODY 65534u
#define NET_ADMIN_RAW 0x3000ull   /* CAP_NET_ADMIN (12) | CAP_NET_RAW (13) */
#define BIND_SERVICE 0x0400ull    /* CAP_NET_BIND_SERVICE (10) */

/* Like run_in_netns (netns_child.h) without the namespaces: the scenario in a forked child,
 * CHECK failures and skips reported through the pipe. */
static void run_forked(void (*scenario)(void))
{
	char msg[1024] = "";
	size_t got = 0;
	ssize_t n;
	int pfd[2], st;
	pid_t pid;

	if (geteuid() != 0)
		cr_skip_test("needs root (the drop starts from root's capabilities)");
	cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		report_fd = pfd[1];
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		scenario();
		_exit(0);
	}
	close(pfd[1]);
	while (got < sizeof(msg) - 1 && (n = read(pfd[0], msg + got, sizeof(msg) - 1 - got)) > 0)
		got += (size_t)n;
	msg[got] = '\0';
	close(pfd[0]);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP_STATUS)
		cr_skip_test("%s", msg);
	cr_assert(WIFEXITED(st), "child died of signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	cr_assert_eq(WEXITSTATUS(st), 0, "%s", msg);
}

/* The text after "<key>:\t" in a /proc status file, up to the end of the line. */
static void status_field(const char *path, const char *key, char *out, size_t len)
{
	char text[4096] = "", pat[32];
	const char *p;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	CHECK(fd >= 0, "%s: %s", path, strerror(errno));
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	CHECK(n > 0, "%s: %s", path, strerror(errno));
	snprintf(pat, sizeof(pat), "\n%s:\t", key);
	CHECK((p = strstr(text, pat)) != NULL, "%s: no %s", path, key);
	p += strlen(pat);
	size_t k = strcspn(p, "\n");
	snprintf(out, len, "%.*s", (int)k, p);
}

static unsigned long long status_hex(const char *path, const char *key)
{
	char v[64];

	status_field(path, key, v, sizeof(v));
	return strtoull(v, NULL, 16);
}

#define SELF "/proc/self/status"

/* Only NET_ADMIN and NET_RAW (+ extra) anywhere: permitted, effective, bounding; nothing
 * inheritable or ambient; no_new_privs set. */
static void check_sets(const char *path, unsigned long long extra)
{
	unsigned long long want = NET_ADMIN_RAW | extra;

	CHECK(status_hex(path, "CapEff") == want, "CapEff %llx", status_hex(path, "CapEff"));
	CHECK(status_hex(path, "CapPrm") == want, "CapPrm %llx", status_hex(path, "CapPrm"));
	CHECK(status_hex(path, "CapBnd") == want, "CapBnd %llx", status_hex(path, "CapBnd"));
	CHECK(status_hex(path, "CapInh") == 0, "CapInh %llx", status_hex(path, "CapInh"));
	CHECK(status_hex(path, "CapAmb") == 0, "CapAmb %llx", status_hex(path, "CapAmb"));
	CHECK(status_hex(path, "NoNewPrivs") == 1, "NoNewPrivs");
}

static void check_ids(unsigned uid, unsigned gid)
{
	char v[128], want[128];

	status_field(SELF, "Uid", v, sizeof(v));
	snprintf(want, sizeof(want), "%u\t%u\t%u\t%u", uid, uid, uid, uid);
	CHECK(strcmp(v, want) == 0, "Uid \"%s\"", v);
	status_field(SELF, "Gid", v, sizeof(v));
	snprintf(want, sizeof(want), "%u\t%u\t%u\t%u", gid, gid, gid, gid);
	CHECK(strcmp(v, want) == 0, "Gid \"%s\"", v);
}

/* SO_MARK needs CAP_NET_ADMIN (or CAP_NET_RAW): set it and read it back. */
static void check_mark(void)
{
	uint32_t mark = 0x74000000, got = 0;
	socklen_t len = sizeof(got);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0, "socket: %s", strerror(errno));
	CHECK(setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) == 0, "SO_MARK: %s",
	      strerror(errno));
	CHECK(getsockopt(fd, SOL_SOCKET, SO_MARK, &got, &len) == 0 && got == mark, "mark %x", got);
	close(fd);
}

/* Bind a loopback TCP socket to a free port below 1024: 0, or the errno. */
static int bind_low_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int ret = EADDRINUSE;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (uint16_t port = 1010; port > 900 && ret == EADDRINUSE; port--) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		CHECK(fd >= 0, "socket: %s", strerror(errno));
		a.sin_port = htons(port);
		ret = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 ? 0 : errno;
		close(fd);
	}
	return ret;
}

static bool low_ports_privileged(void)
{
	char v[32] = "";
	int fd = open("/proc/sys/net/ipv4/ip_unprivileged_port_start", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	(void)!read(fd, v, sizeof(v) - 1);
	close(fd);
	return atoi(v) > 1010;
}

static void apply_ok(const char *user, bool bind_service, const char *config_path)
{
	struct privdrop_opts o = { .user = user, .keep_bind_service = bind_service,
				   .config_path = config_path };
	char err[256] = "";

	CHECK(privdrop_apply(&o, err, sizeof(err)) == 0, "%s", err);
}

/* Without a user: uid 0 stays, the capabilities go. */
static void no_user(void)
{
	char text[128];

	CHECK(status_hex(SELF, "CapEff") != NET_ADMIN_RAW, "the child starts with more");
	apply_ok(NULL, false, NULL);
	check_sets(SELF, 0);
	check_ids(0, 0);
	CHECK(privdrop_caps_text(text, sizeof(text)) == 0 &&
		      strcmp(text, "cap_net_admin,cap_net_raw") == 0, "caps \"%s\"", text);
	CHECK(privdrop_caps_text(text, 10) == -ENOSPC, "a short buffer is refused");
	check_mark();
	/* Gone: CAP_SETUID (even uid 0 cannot become someone else). */
	CHECK(setuid(NOBODY) != 0 && errno == EPERM, "setuid without CAP_SETUID: %s",
	      strerror(errno));
	/* Already applied: a second call changes nothing (no CAP_SETPCAP left: the bounding set,
	 * already reduced, stays), and a user switch says what is missing. */
	struct privdrop_opts o = { 0 };
	char err[256] = "";
	CHECK(privdrop_apply(&o, err, sizeof(err)) == 0, "again: %s", err);
	check_sets(SELF, 0);
	o.user = "nobody";
	CHECK(privdrop_apply(&o, err, sizeof(err)) == -EPERM, "switch: %s", err);
	CHECK(strncmp(err, "privileges: ", 12) == 0 && strstr(err, "cap_setgid"), "%s", err);
#ifdef TS_LSAN
	CHECK(__lsan_do_recoverable_leak_check() == 0, "memory leaked");
#endif
}

Test(privdrop, no_user_keeps_uid_and_only_net_caps, .timeout = 30)
{
	run_forked(no_user);
}

static void to_nobody(void)
{
	char text[128];
	gid_t groups[8];

	apply_ok("nobody", false, NULL);
	check_ids(NOBODY, NOBODY);
	check_sets(SELF, 0);
	CHECK(getgroups(8, groups) == 1 && groups[0] == NOBODY, "groups: nobody's own (%d)",
	      getgroups(0, NULL));
	CHECK(privdrop_caps_text(text, sizeof(text)) == 0 &&
		      strcmp(text, "cap_net_admin,cap_net_raw") == 0, "caps \"%s\"", text);
	check_mark();
	CHECK(setuid(0) != 0, "no way back to root");
	CHECK(open("/etc/shadow", O_RDONLY | O_CLOEXEC) < 0 && errno == EACCES,
	      "root's files are closed: %s", strerror(errno));
	if (low_ports_privileged())
		CHECK(bind_low_port() == EACCES, "no port below 1024 without the option");
}

Test(privdrop, user_nobody, .timeout = 30)
{
	run_forked(to_nobody);
}

static void to_numeric_uid(void)
{
	apply_ok("65534", false, NULL);
	check_ids(NOBODY, NOBODY);
	check_sets(SELF, 0);
}

Test(privdrop, numeric_uid, .timeout = 30)
{
	run_forked(to_numeric_uid);
}

static void bind_service(void)
{
	char text[128];

	apply_ok("nobody", true, NULL);
	check_ids(NOBODY, NOBODY);
	check_sets(SELF, BIND_SERVICE);
	CHECK(status_hex(SELF, "CapEff") == 0x3400, "CapEff %llx", status_hex(SELF, "CapEff"));
	CHECK(privdrop_caps_text(text, sizeof(text)) == 0 &&
		      strcmp(text, "cap_net_bind_service,cap_net_admin,cap_net_raw") == 0,
	      "caps \"%s\"", text);
	CHECK(bind_low_port() == 0, "a port below 1024: %s", strerror(bind_low_port()));
}

Test(privdrop, keep_bind_service, .timeout = 30)
{
	run_forked(bind_service);
}

/* Config files made by the test process (root), removed after the child. */
static char cfg_closed[64], cfg_open[64];

static void make_file(char *path, size_t len, mode_t mode)
{
	snprintf(path, len, "/tmp/ts_privdrop_XXXXXX");
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0, "mkstemp: %s", strerror(errno));
	cr_assert_eq(write(fd, "{}\n", 3), 3);
	cr_assert_eq(fchmod(fd, mode), 0);
	close(fd);
}

static void config_unreadable(void)
{
	struct privdrop_opts o = { .user = "nobody", .config_path = cfg_closed };
	char err[256] = "";

	CHECK(privdrop_apply(&o, err, sizeof(err)) == -EACCES, "%s", err);
	CHECK(strncmp(err, "privileges: config file ", 24) == 0 && strstr(err, cfg_closed) &&
		      strstr(err, "reload"), "%s", err);
}

static void config_readable(void)
{
	apply_ok("nobody", false, cfg_open);
	check_ids(NOBODY, NOBODY);
}

/* Without a user, root still owns its 0600 file: readable. */
static void config_root_only_without_user(void)
{
	apply_ok(NULL, false, cfg_closed);
}

static void remove_files(void)
{
	if (cfg_closed[0])
		unlink(cfg_closed);
	if (cfg_open[0])
		unlink(cfg_open);
}

Test(privdrop, config_must_stay_readable, .timeout = 30, .fini = remove_files)
{
	if (geteuid() != 0)
		cr_skip_test("needs root");
	make_file(cfg_closed, sizeof(cfg_closed), 0600);
	make_file(cfg_open, sizeof(cfg_open), 0644);
	run_forked(config_unreadable);
	run_forked(config_readable);
	run_forked(config_root_only_without_user);
}

static void unknown_user(void)
{
	struct privdrop_opts o = { .user = "ts-no-such-user" };
	char err[256] = "";
	unsigned long long before = status_hex(SELF, "CapEff");

	CHECK(privdrop_apply(&o, err, sizeof(err)) == -ENOENT, "%s", err);
	CHECK(strcmp(err, "privileges: user \"ts-no-such-user\": no such user") == 0, "%s", err);
	CHECK(status_hex(SELF, "CapEff") == before, "nothing changed before the lookup failed");
}

Test(privdrop, unknown_user, .timeout = 30)
{
	uid_t uid = 1;
	gid_t gid = 1;
	char err[128] = "";

	cr_assert_eq(privdrop_resolve("ts-no-such-user", &uid, &gid, err, sizeof(err)), -ENOENT);
	cr_assert_str_eq(err, "user \"ts-no-such-user\": no such user");
	cr_assert_eq(privdrop_resolve("4000000000", &uid, &gid, err, sizeof(err)), -ENOENT);
	cr_assert_eq(privdrop_resolve("nobody", &uid, &gid, err, sizeof(err)), 0, "%s", err);
	cr_assert(uid == NOBODY && gid == NOBODY);
	cr_assert_eq(privdrop_resolve("0", &uid, &gid, err, sizeof(err)), 0, "%s", err);
	cr_assert(uid == 0 && gid == 0);
	cr_assert_eq(privdrop_resolve("", &uid, &gid, err, sizeof(err)), -EINVAL);
	run_forked(unknown_user);
}

/* Missing privileges are named: no CAP_SETUID for a user switch. Without CAP_SETPCAP (a
 * program given its capabilities with setcap) the drop still happens, the bounding set left
 * as it is. */
static void lacking(cap_value_t which, const char *user, const char *name)
{
	struct privdrop_opts o = { .user = user };
	char err[256] = "";
	cap_t caps = cap_get_proc();

	CHECK(caps && cap_set_flag(caps, CAP_EFFECTIVE, 1, &which, CAP_CLEAR) == 0 &&
		      cap_set_proc(caps) == 0, "cap_set_proc: %s", strerror(errno));
	cap_free(caps);
	CHECK(privdrop_apply(&o, err, sizeof(err)) == -EPERM, "%s", err);
	CHECK(strncmp(err, "privileges: the process lacks ", 30) == 0 && strstr(err, name),
	      "%s", err);
	check_ids(0, 0);
}

static void lacking_setpcap(void)
{
	struct privdrop_opts o = { 0 };
	char err[256] = "";
	cap_value_t which = CAP_SETPCAP;
	cap_t caps = cap_get_proc();

	CHECK(caps && cap_set_flag(caps, CAP_EFFECTIVE, 1, &which, CAP_CLEAR) == 0 &&
		      cap_set_proc(caps) == 0, "cap_set_proc: %s", strerror(errno));
	cap_free(caps);
	unsigned long long bnd = status_hex(SELF, "CapBnd");
	CHECK(privdrop_apply(&o, err, sizeof(err)) == 0, "%s", err);
	CHECK(status_hex(SELF, "CapEff") == NET_ADMIN_RAW, "CapEff %llx", status_hex(SELF, "CapEff"));
	CHECK(status_hex(SELF, "CapPrm") == NET_ADMIN_RAW, "CapPrm %llx", status_hex(SELF, "CapPrm"));
	CHECK(status_hex(SELF, "CapBnd") == bnd, "the bounding set is left as it was");
	CHECK(status_hex(SELF, "NoNewPrivs") == 1, "NoNewPrivs");
	check_ids(0, 0);
}

static void lacking_setuid(void)
{
	lacking(CAP_SETUID, "nobody", "cap_setuid");
}

Test(privdrop, missing_privilege_is_named, .timeout = 30)
{
	run_forked(lacking_setpcap);
	run_forked(lacking_setuid);
}

static void *thread_status(void *arg)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)gettid());
	check_sets(path, 0);
	*(unsigned long long *)arg = status_hex(path, "CapEff");
	return NULL;
}

/* A thread created after the call inherits the reduced sets. */
static void later_thread(void)
{
	unsigned long long eff = 0;
	pthread_t th;

	apply_ok("nobody", false, NULL);
	CHECK(pthread_create(&th, NULL, thread_status, &eff) == 0, "pthread_create");
	CHECK(pthread_join(th, NULL) == 0, "pthread_join");
	CHECK(eff == NET_ADMIN_RAW && eff == status_hex(SELF, "CapEff"), "thread CapEff %llx",
	      eff);
}

Test(privdrop, later_threads_inherit, .timeout = 30)
{
	run_forked(later_thread);
}

/* rx-0/rps_cpus, parsed as a hex mask. */
static unsigned long long rps_mask(const char *dev)
{
	char path[128], text[256] = "", digits[256];
	size_t k = 0;
	int fd;

	snprintf(path, sizeof(path), "/sys/class/net/%s/queues/rx-0/rps_cpus", dev);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0, "%s: %s", path, strerror(errno));
	CHECK(read(fd, text, sizeof(text) - 1) > 0, "%s", path);
	close(fd);
	for (const char *c = text; *c && *c != '\n' && k < sizeof(digits) - 1; c++)
		if (*c != ',')
			digits[k++] = *c;
	digits[k] = '\0';
	return strtoull(digits, NULL, 16);
}

/* tun.rps "auto": the TUN opens rps_cpus at start, so the loop's switches still work after
 * the drop to nobody, who could not open the root-owned file any more. */
static void rps_after_drop(void)
{
	struct ts_config cfg;
	struct tun *t = NULL;
	char err[256], note[256];

	config_init(&cfg);
	snprintf(cfg.tun.name, sizeof(cfg.tun.name), "tpd0");
	cfg.tun.offload = TS_OFFLOAD_OFF;
	cfg.tun.rps = TS_RPS_AUTO;
	CHECK(tun_open_config(&cfg.tun, &t, note, sizeof(note), err, sizeof(err)) == 0, "%s", err);
	if (!tun_rps_auto(t))
		child_report(SKIP_STATUS, "one CPU or no rps_cpus: nothing to steer (%s)", note);
	CHECK(rps_mask("tpd0") == 0, "auto starts with steering off");
	apply_ok("nobody", false, NULL);
	check_ids(NOBODY, NOBODY);
	CHECK(open("/sys/class/net/tpd0/queues/rx-0/rps_cpus", O_WRONLY | O_CLOEXEC) < 0 &&
		      errno == EACCES, "nobody cannot open rps_cpus: %s", strerror(errno));
	CHECK(tun_set_rps(t, true, err, sizeof(err)) == 0, "%s", err);
	CHECK(tun_rps(t) && rps_mask("tpd0") != 0, "on after the drop: %llx", rps_mask("tpd0"));
	CHECK(tun_set_rps(t, false, err, sizeof(err)) == 0, "%s", err);
	CHECK(!tun_rps(t) && rps_mask("tpd0") == 0, "off again: %llx", rps_mask("tpd0"));
	CHECK(tun_set_rps(t, true, err, sizeof(err)) == 0, "%s", err);
	CHECK(rps_mask("tpd0") != 0, "and on: %llx", rps_mask("tpd0"));
	tun_close(t);
	config_fini(&cfg);
}

Test(privdrop, rps_auto_switches_after_drop, .timeout = 30)
{
	run_in_netns(rps_after_drop);
}
