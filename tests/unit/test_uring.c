/* test_uring.c — the ring of core/uring.c on a socketpair(AF_UNIX, SOCK_SEQPACKET), the
 * stand-in for a TUN queue fd the driver tests use too (one packet per read and write):
 * results land in queue order; a read of an empty socket completes with -EAGAIN inside the
 * call instead of waiting; a write out of a buffer followed by a read into the same buffer in
 * one batch sends the old bytes and receives the new ones (the driver relies on it to reuse
 * a read slot in the round that writes it back); an operation that fails does not stop the
 * ones after it; the queue is bounded. */
#include <criterion/criterion.h>

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/uring.h"

struct pair {
	int a, b; /* a: the ring's end */
	struct uring *u;
};

static void pair_open(struct pair *p)
{
	int sv[2];
	int ret;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	p->a = sv[0];
	p->b = sv[1];
	ret = uring_new(&p->u);
	cr_assert_eq(ret, 0, "uring_new: %s (the test machine has io_uring)", strerror(-ret));
}

static void pair_close(struct pair *p)
{
	uring_free(p->u);
	close(p->a);
	close(p->b);
}

TestSuite(uring, .timeout = 10);

/* Reads complete in queue order, each with its own packet; the one that finds the socket
 * empty says -EAGAIN at once; gathering writes send one packet each. */
Test(uring, reads_and_writes_in_queue_order)
{
	char in[4][64], got[64];
	struct iovec iov[2][2] = {
		{ { .iov_base = "ab", .iov_len = 2 }, { .iov_base = "cde", .iov_len = 3 } },
		{ { .iov_base = "fgh", .iov_len = 3 }, { .iov_base = "i", .iov_len = 1 } },
	};
	int32_t res[8];
	struct pair p;

	pair_open(&p);
	cr_assert_eq(send(p.b, "one", 3, 0), 3);
	cr_assert_eq(send(p.b, "second", 6, 0), 6);
	cr_assert_eq(send(p.b, "3", 1, 0), 1);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(uring_read(p.u, p.a, in[i], sizeof(in[i])), 0);
	cr_assert_eq(uring_writev(p.u, p.a, iov[0], 2), 0);
	cr_assert_eq(uring_writev(p.u, p.a, iov[1], 2), 0);
	cr_assert_eq(uring_queued(p.u), 6);
	cr_assert_eq(uring_run(p.u, res), 6);
	cr_assert_eq(uring_queued(p.u), 0);
	cr_assert_eq(res[0], 3);
	cr_assert_eq(memcmp(in[0], "one", 3), 0);
	cr_assert_eq(res[1], 6);
	cr_assert_eq(memcmp(in[1], "second", 6), 0);
	cr_assert_eq(res[2], 1);
	cr_assert_eq(in[2][0], '3');
	cr_assert_eq(res[3], -EAGAIN, "an empty socket: %d", res[3]);
	cr_assert_eq(res[4], 5);
	cr_assert_eq(res[5], 4);
	cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), 5);
	cr_assert_eq(memcmp(got, "abcde", 5), 0);
	cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), 4);
	cr_assert_eq(memcmp(got, "fghi", 4), 0);
	cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), -1, "two packets, no more");
	cr_assert_eq(uring_run(p.u, res), 0, "an empty batch");
	pair_close(&p);
}

/* The driver writes a packet back from a read buffer and reads the next packet into that same
 * buffer in one batch: the peer must get the old bytes, the buffer must hold the new ones. */
Test(uring, write_then_read_into_the_same_buffer)
{
	char buf[32][256], got[256];
	struct iovec iov[32];
	int32_t res[64];
	struct pair p;

	pair_open(&p);
	for (int i = 0; i < 32; i++) {
		memset(buf[i], 'a' + i % 26, sizeof(buf[i]));
		cr_assert_eq(send(p.b, (char[200]){ [0 ... 199] = (char)('A' + i % 26) }, 200, 0),
			     200);
		iov[i] = (struct iovec){ .iov_base = buf[i], .iov_len = 100 };
		cr_assert_eq(uring_writev(p.u, p.a, &iov[i], 1), 0);
		cr_assert_eq(uring_read(p.u, p.a, buf[i], sizeof(buf[i])), 0);
	}
	cr_assert_eq(uring_run(p.u, res), 64);
	for (int i = 0; i < 32; i++) {
		cr_assert_eq(res[2 * i], 100);
		cr_assert_eq(res[2 * i + 1], 200);
		cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), 100);
		for (int j = 0; j < 100; j++)
			cr_assert_eq(got[j], 'a' + i % 26, "packet %d byte %d: the old bytes", i, j);
		for (int j = 0; j < 200; j++)
			cr_assert_eq(buf[i][j], 'A' + i % 26, "buffer %d byte %d: the new bytes", i,
				     j);
	}
	pair_close(&p);
}

/* An operation the kernel refuses (a closed fd) fails alone: the ones queued after it run,
 * and nothing of the batch is left for a later call. A full socket: -EAGAIN, at once. */
Test(uring, a_failed_operation_does_not_stop_the_rest)
{
	char in[64], got[64];
	struct iovec iov = { .iov_base = "x", .iov_len = 1 };
	int32_t res[4];
	int small = 1;
	struct pair p;

	pair_open(&p);
	cr_assert_eq(send(p.b, "hello", 5, 0), 5);
	cr_assert_eq(uring_read(p.u, -1, in, sizeof(in)), 0);
	cr_assert_eq(uring_read(p.u, p.a, in, sizeof(in)), 0);
	cr_assert_eq(uring_writev(p.u, p.a, &iov, 1), 0);
	cr_assert_eq(uring_run(p.u, res), 3);
	cr_assert_eq(res[0], -EBADF);
	cr_assert_eq(res[1], 5);
	cr_assert_eq(res[2], 1);
	cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), 1);
	cr_assert_eq(uring_run(p.u, res), 0, "nothing left over");
	cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), -1);

	cr_assert_eq(setsockopt(p.a, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	while (send(p.a, "fill", 4, MSG_DONTWAIT) == 4)
		;
	cr_assert_eq(uring_writev(p.u, p.a, &iov, 1), 0);
	cr_assert_eq(uring_run(p.u, res), 1);
	cr_assert_eq(res[0], -EAGAIN, "a full socket: %d", res[0]);
	pair_close(&p);
}

Test(uring, queue_bounded)
{
	char in[URING_MAX_OPS][8], x[8];
	int32_t res[URING_MAX_OPS];
	struct pair p;

	pair_open(&p);
	for (int i = 0; i < URING_MAX_OPS; i++)
		cr_assert_eq(uring_read(p.u, p.a, in[i], sizeof(in[i])), 0);
	cr_assert_eq(uring_read(p.u, p.a, x, sizeof(x)), -ENOSPC);
	cr_assert_eq(uring_writev(p.u, p.a, &(struct iovec){ x, 1 }, 1), -ENOSPC);
	cr_assert_eq(uring_run(p.u, res), URING_MAX_OPS);
	for (int i = 0; i < URING_MAX_OPS; i++)
		cr_assert_eq(res[i], -EAGAIN);
	/* Many batches through the same ring (its indexes wrap). */
	for (int round = 0; round < 10; round++) {
		cr_assert_eq(send(p.b, "r", 1, 0), 1);
		for (int i = 0; i < 40; i++)
			cr_assert_eq(uring_read(p.u, p.a, in[i], sizeof(in[i])), 0);
		cr_assert_eq(uring_run(p.u, res), 40);
		cr_assert_eq(res[0], 1);
		cr_assert_eq(res[1], -EAGAIN);
	}
	pair_close(&p);
}

/* io_uring_enter refused for a batch of exactly three (a seccomp filter on its to_submit
 * argument, EAGAIN): uring_run says the ring must not be used again (-EIO) and every result is
 * -ECANCELED; the entries are dropped from the queue, so a later batch (of one) runs only its
 * own operation and the refused write never reaches the peer. */
Test(uring, a_refused_batch_is_dropped_not_resubmitted)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_enter, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 3, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAGAIN),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };
	struct iovec a = { .iov_base = "refused", .iov_len = 7 };
	struct iovec b = { .iov_base = "taken", .iov_len = 5 };
	char in[2][16], got[16];
	int32_t res[3];
	struct pair p;

	pair_open(&p);
	cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
	cr_assert_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0);
	cr_assert_eq(send(p.b, "waiting", 7, 0), 7);
	cr_assert_eq(uring_writev(p.u, p.a, &a, 1), 0);
	cr_assert_eq(uring_read(p.u, p.a, in[0], sizeof(in[0])), 0);
	cr_assert_eq(uring_read(p.u, p.a, in[1], sizeof(in[1])), 0);
	cr_assert_eq(uring_run(p.u, res), -EIO);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(res[i], -ECANCELED, "operation %d: %d", i, res[i]);
	cr_assert_eq(uring_queued(p.u), 0);
	cr_assert_eq(uring_writev(p.u, p.a, &b, 1), 0);
	cr_assert_eq(uring_run(p.u, res), 1);
	cr_assert_eq(res[0], 5);
	cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), 5);
	cr_assert_eq(memcmp(got, "taken", 5), 0);
	cr_assert_eq(recv(p.b, got, sizeof(got), MSG_DONTWAIT), -1, "the refused write never went");
	cr_assert_eq(recv(p.a, got, sizeof(got), MSG_DONTWAIT), 7, "the refused reads never read");
	pair_close(&p);
}
