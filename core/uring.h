/* uring.h — a small io_uring for batches of non-blocking reads and writes.
 *
 * A system call is the unit of cost on a loop that moves many small packets: each read() and
 * write() of a TUN pays the kernel entry and exit for a few dozen bytes. This ring queues
 * several reads and writes and hands them to the kernel in one io_uring_enter(2), and nothing
 * more: no thread, no polling, no waiting. Every operation carries RWF_NOWAIT, so the kernel
 * either completes it while it is being submitted or fails it with -EAGAIN; none is left
 * pending and none goes to an io-wq worker. Operations are issued in the order they were
 * queued, each completing before the next is issued, so a write from a buffer may be followed
 * by a read into the same buffer in one batch.
 *
 * Raw system calls, no library: the kernel's uapi header is all it needs. Single-threaded: one
 * ring per loop thread.
 *
 * See io_uring(7), io_uring_enter(2) and "Efficient IO with io_uring" by Jens Axboe
 * (https://kernel.dk/io_uring.pdf) for the ring protocol used here.
 */
#ifndef TS_CORE_URING_H
#define TS_CORE_URING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct uring;

/* Operations one batch may carry at most (the submission queue's size). */
#define URING_MAX_OPS 64

/* Set up a ring. 0, or -errno: -ENOSYS (no io_uring, or a kernel before 5.19), -EPERM
 * (forbidden by a seccomp filter or kernel.io_uring_disabled), -EMFILE, -ENFILE, -ENOMEM. */
int uring_new(struct uring **out) __attribute__((warn_unused_result));
void uring_free(struct uring *u);

/* Queue a read of up to len bytes from fd into buf, or a gathering write of iov[0..cnt) to
 * fd. The buffers (and the iovec array) must stay valid until uring_run returns. 0, or
 * -ENOSPC when URING_MAX_OPS are queued already. */
int uring_read(struct uring *u, int fd, void *buf, size_t len);
int uring_writev(struct uring *u, int fd, const struct iovec *iov, int cnt);

/* Operations queued and not yet run. */
unsigned uring_queued(const struct uring *u);

/* Run every queued operation in one io_uring_enter and store the result of the i-th one
 * queued in res[i] (res has room for uring_queued()): bytes moved, or -errno (-EAGAIN: nothing
 * to read, or no room to write; -ECANCELED: the kernel never took it). The queue is empty
 * afterwards. Returns the number of operations, or when the ring must not be used again:
 *   -EIO: io_uring_enter itself failed, or an operation did not complete during the
 *         submission (a kernel that does not honour RWF_NOWAIT for that file); the ring then
 *         cancelled it and waited up to 100 ms for it. Every buffer is the caller's again.
 *   -ETIMEDOUT: as -EIO, but an operation completed neither way: the buffers of this batch
 *         may still be written by the kernel, and the caller must never reuse them. */
int uring_run(struct uring *u, int32_t *res);

#endif
