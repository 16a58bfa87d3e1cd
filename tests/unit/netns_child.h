/* netns_child.h — run a test scenario in a forked child inside fresh network and mount
 * namespaces (its own sysfs, so the TUN it creates and every address it adds vanish with it).
 *
 * The child reports through a pipe: CHECK(cond, fmt, ...) fails the test with the line and
 * message; child_report(SKIP_STATUS, ...) skips it (no namespaces here). The parent skips
 * without root or a usable /dev/net/tun. Header-only (static functions, like mt.h): include it
 * once, in the test file that uses it.
 */
#ifndef TS_TESTS_NETNS_CHILD_H
#define TS_TESTS_NETNS_CHILD_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define SKIP_STATUS 77

static int report_fd = -1; /* the child's end of the pipe to the test process */

static void child_report(int status, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 2, 3)));

static void child_report(int status, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n > 0)
		(void)!write(report_fd, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
	_exit(status);
}

/* Assertion inside the child: on failure the message goes to the parent, which fails. */
#define CHECK(cond, ...)                                                                        \
	do {                                                                                    \
		if (!(cond)) {                                                                  \
			char m_[768];                                                           \
			snprintf(m_, sizeof(m_), __VA_ARGS__);                                  \
			child_report(1, "line %d: %s: %s", __LINE__, #cond, m_);                \
		}                                                                               \
	} while (0)

/* Write text to a /proc or /sys file in the child; any failure fails the scenario. */
static inline void write_text(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);

	CHECK(fd >= 0, "%s: %s", path, strerror(errno));
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "%s: %s", path,
	      strerror(errno));
	close(fd);
}

static void enter_namespaces(void)
{
	if (unshare(CLONE_NEWNET | CLONE_NEWNS) != 0)
		child_report(SKIP_STATUS, "cannot create namespaces (unshare: %s)",
			     strerror(errno));
	/* Keep our mounts (the new sysfs, a tmpfs on /dev/net) out of the host's mount table. */
	CHECK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0, "%s", strerror(errno));
	CHECK(mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL) == 0,
	      "sysfs: %s", strerror(errno));
}

static void run_in_netns(void (*scenario)(void))
{
	char msg[1024] = "";
	size_t got = 0;
	ssize_t n;
	int pfd[2], st;
	pid_t pid;

	if (geteuid() != 0)
		cr_skip_test("needs root (network namespaces, TUN devices)");
	if (access("/dev/net/tun", R_OK | W_OK) != 0)
		cr_skip_test("/dev/net/tun not usable: %s", strerror(errno));
	cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		report_fd = pfd[1];
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* Criterion's timeout kills the parent */
		enter_namespaces();
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

#endif
