/* uring_lose.h — io_uring rounds that are lost, faked for the driver's tests: what uring_run
 * reports as -ETIMEDOUT (core/uring.h), operations that neither completed nor could be
 * cancelled, so the kernel may still touch their buffers at any time.
 *
 * A seccomp filter hands every io_uring_enter to a thread that answers for the kernel as if it
 * took the operations, then found none complete. The kernel never sees them, so it never
 * touches their buffers; in its place the thread notes where the first round's writes read
 * from (the ring's submission entries, mapped in this process, and their iovecs, valid while
 * the call waits), so a test can look at those buffers later, as the kernel still might.
 * Header-only (static functions, like netns_child.h): include it once, in the test file that
 * uses it. Criterion runs each test in a process of its own, which the filter stays on.
 */
#ifndef TS_TESTS_URING_LOSE_H
#define TS_TESTS_URING_LOSE_H

#include <criterion/criterion.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define URING_LOST_BUFS 64

/* The buffers the writes of the first lost round read from, in the order queued (a fresh
 * ring's first round: its submission entries are the round's, in order). */
struct uring_lost_seen {
	struct iovec buf[URING_LOST_BUFS];
	unsigned writes;       /* writev operations */
	atomic_uint n;         /* buffers in buf, set once the round is noted */
};

struct uring_lose_ctx {
	int fd; /* the seccomp listener */
	struct uring_lost_seen *seen;
};

/* The ring's submission entries (IORING_OFF_SQES of an io_uring fd mapped in this process):
 * where, and how many; NULL when there is no such mapping. */
static struct io_uring_sqe *uring_lose_sqes(size_t *n)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	void *at = NULL;

	if (!f)
		return NULL;
	while (!at && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi, off;

		if (strstr(line, "io_uring") && sscanf(line, "%lx-%lx %*s %lx", &lo, &hi, &off) == 3 &&
		    off == IORING_OFF_SQES) {
			at = (void *)lo;
			*n = (hi - lo) / sizeof(struct io_uring_sqe);
		}
	}
	fclose(f);
	return at;
}

/* The writes' buffers of the round io_uring_enter is submitting now. */
static void uring_lose_note(struct uring_lost_seen *seen)
{
	size_t n = 0, k = 0;
	struct io_uring_sqe *sqe = uring_lose_sqes(&n);

	for (size_t i = 0; sqe && i < n; i++) {
		const struct iovec *iov = (const struct iovec *)(uintptr_t)sqe[i].addr;

		if (sqe[i].opcode != IORING_OP_WRITEV)
			continue;
		seen->writes++;
		for (unsigned j = 0; j < sqe[i].len && k < URING_LOST_BUFS; j++)
			seen->buf[k++] = iov[j];
	}
	atomic_store(&seen->n, (unsigned)k);
}

/* Answers every io_uring_enter for the kernel without running it: a submission took all its
 * entries, a wait found nothing. The first submission's writes are noted when asked. */
static void *uring_lose_answer(void *arg)
{
	struct uring_lose_ctx *c = arg;
	bool noted = false;

	for (;;) {
		struct seccomp_notif req;
		struct seccomp_notif_resp resp;
		bool wait;

		memset(&req, 0, sizeof(req));
		if (ioctl(c->fd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
			if (errno == EINTR)
				continue;
			return NULL;
		}
		wait = req.data.args[3] & IORING_ENTER_GETEVENTS;
		if (c->seen && !noted && !wait) {
			uring_lose_note(c->seen); /* the caller waits in io_uring_enter meanwhile */
			noted = true;
		}
		resp = (struct seccomp_notif_resp){
			.id = req.id,
			.val = wait ? 0 : (int64_t)req.data.args[1],
		};
		(void)ioctl(c->fd, SECCOMP_IOCTL_NOTIF_SEND, &resp);
	}
}

/* From now on every io_uring round is lost (uring_run's -ETIMEDOUT). seen (or NULL): where the
 * first lost round's writes read from is noted there. */
static void lose_io_uring_rounds(struct uring_lost_seen *seen)
{
	static struct uring_lose_ctx ctx;
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_enter, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };
	pthread_t t;
	long fd;

	if (seen)
		memset(seen, 0, sizeof(*seen));
	cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
	fd = syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
	cr_assert_geq(fd, 0, "seccomp listener: %s", strerror(errno));
	ctx = (struct uring_lose_ctx){ .fd = (int)fd, .seen = seen };
	cr_assert_eq(pthread_create(&t, NULL, uring_lose_answer, &ctx), 0);
	cr_assert_eq(pthread_detach(t), 0);
}

#endif
