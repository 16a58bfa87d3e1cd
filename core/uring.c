/* uring.c — the ring of uring.h over the raw io_uring system calls.
 *
 * The submission queue entries are filled in place and published (the tail moved) only by
 * uring_run, so an operation queued is never seen by the kernel before the batch is run. The
 * user_data of each entry is its position in the batch, which is how results find their slot
 * in res[] whatever order the completions are posted in.
 */
#include "core/uring.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef RWF_NOWAIT
#define RWF_NOWAIT 0x00000008
#endif

struct uring {
	int fd;
	/* submission queue */
	unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
	struct io_uring_sqe *sqes;
	unsigned sq_entries;
	/* completion queue */
	unsigned *cq_head, *cq_tail, *cq_mask;
	struct io_uring_cqe *cqes;
	/* mappings */
	void *sq_map, *cq_map;
	size_t sq_map_len, cq_map_len, sqes_len;
	/* the batch being built */
	unsigned queued;
	unsigned sq_local_tail; /* the tail the kernel will see when the batch is run */
};

static int sys_setup(unsigned entries, struct io_uring_params *p)
{
	return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int sys_enter(int fd, unsigned submit, unsigned min_complete, unsigned flags,
		     const void *arg, size_t argsz)
{
	return (int)syscall(__NR_io_uring_enter, fd, submit, min_complete, flags, arg, argsz);
}

/* SUBMIT_ALL (5.18): an entry that fails does not stop the submission; without it the entries
 * after it would be submitted by the next call, long after their buffers moved on.
 * COOP_TASKRUN (5.19): no interrupt of the task to run completion work it runs anyway; it also
 * stands for the 5.19 this ring needs for IORING_ASYNC_CANCEL_ANY (cancel_missing). A kernel
 * that knows neither refuses them with EINVAL. Not SINGLE_ISSUER: the ring is set up on the
 * thread that starts the proxy (before privileges are dropped) and used by the queue's own
 * thread, which such a ring refuses (EEXIST). */
#define URING_SETUP_FLAGS (IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN)

int uring_new(struct uring **out)
{
	struct io_uring_params p;
	struct uring *u;
	int fd = -1, ret;

	*out = NULL;
	memset(&p, 0, sizeof(p));
	p.flags = URING_SETUP_FLAGS;
	if ((fd = sys_setup(URING_MAX_OPS, &p)) < 0)
		return errno == EINVAL ? -ENOSYS : -errno;
	/* A kernel without one mapping for both queues (before 5.4) also lacks RWF_NOWAIT
	 * semantics this ring relies on for reads: not worth supporting. */
	if (!(p.features & IORING_FEAT_SINGLE_MMAP) || !(p.features & IORING_FEAT_NODROP) ||
	    p.sq_entries < URING_MAX_OPS || p.cq_entries < URING_MAX_OPS) {
		close(fd);
		return -ENOSYS;
	}
	u = calloc(1, sizeof(*u));
	if (!u) {
		close(fd);
		return -ENOMEM;
	}
	u->fd = fd;
	u->sq_map_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	u->cq_map_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	if (u->cq_map_len > u->sq_map_len)
		u->sq_map_len = u->cq_map_len;
	u->sq_map = mmap(NULL, u->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
			 fd, IORING_OFF_SQ_RING);
	if (u->sq_map == MAP_FAILED) {
		u->sq_map = NULL;
		ret = -ENOMEM;
		goto fail;
	}
	u->cq_map = u->sq_map;
	u->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
	u->sqes = mmap(NULL, u->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
		       IORING_OFF_SQES);
	if (u->sqes == MAP_FAILED) {
		u->sqes = NULL;
		ret = -ENOMEM;
		goto fail;
	}
	u->sq_head = (unsigned *)((char *)u->sq_map + p.sq_off.head);
	u->sq_tail = (unsigned *)((char *)u->sq_map + p.sq_off.tail);
	u->sq_mask = (unsigned *)((char *)u->sq_map + p.sq_off.ring_mask);
	u->sq_array = (unsigned *)((char *)u->sq_map + p.sq_off.array);
	u->sq_entries = p.sq_entries;
	u->cq_head = (unsigned *)((char *)u->cq_map + p.cq_off.head);
	u->cq_tail = (unsigned *)((char *)u->cq_map + p.cq_off.tail);
	u->cq_mask = (unsigned *)((char *)u->cq_map + p.cq_off.ring_mask);
	u->cqes = (struct io_uring_cqe *)((char *)u->cq_map + p.cq_off.cqes);
	u->sq_local_tail = *u->sq_tail;
	*out = u;
	return 0;
fail:
	uring_free(u);
	return ret;
}

void uring_free(struct uring *u)
{
	if (!u)
		return;
	if (u->sqes)
		munmap(u->sqes, u->sqes_len);
	if (u->sq_map)
		munmap(u->sq_map, u->sq_map_len);
	close(u->fd);
	free(u);
}

unsigned uring_queued(const struct uring *u)
{
	return u->queued;
}

static struct io_uring_sqe *next_sqe(struct uring *u)
{
	unsigned idx;
	struct io_uring_sqe *s;

	if (u->queued >= URING_MAX_OPS)
		return NULL;
	idx = u->sq_local_tail & *u->sq_mask;
	s = &u->sqes[idx];
	memset(s, 0, sizeof(*s));
	u->sq_array[idx] = idx;
	s->user_data = u->queued;
	s->rw_flags = RWF_NOWAIT;
	s->off = (__u64)-1; /* the file's position: a stream, like read(2) and write(2) */
	u->sq_local_tail++;
	u->queued++;
	return s;
}

int uring_read(struct uring *u, int fd, void *buf, size_t len)
{
	struct io_uring_sqe *s = next_sqe(u);

	if (!s)
		return -ENOSPC;
	s->opcode = IORING_OP_READ;
	s->fd = fd;
	s->addr = (uintptr_t)buf;
	s->len = len > UINT32_MAX ? UINT32_MAX : (uint32_t)len;
	return 0;
}

int uring_writev(struct uring *u, int fd, const struct iovec *iov, int cnt)
{
	struct io_uring_sqe *s;

	if (cnt <= 0)
		return -EINVAL;
	if (!(s = next_sqe(u)))
		return -ENOSPC;
	s->opcode = IORING_OP_WRITEV;
	s->fd = fd;
	s->addr = (uintptr_t)iov;
	s->len = (uint32_t)cnt;
	return 0;
}

/* Move the completions posted so far into res; returns how many were found. */
static unsigned reap(struct uring *u, int32_t *res, unsigned n)
{
	unsigned head = *u->cq_head;
	unsigned tail = __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE);
	unsigned found = 0;

	for (; head != tail; head++) {
		const struct io_uring_cqe *c = &u->cqes[head & *u->cq_mask];

		if (c->user_data < n) { /* not the cancel of cancel_missing */
			res[c->user_data] = c->res;
			found++;
		}
	}
	__atomic_store_n(u->cq_head, head, __ATOMIC_RELEASE);
	return found;
}

/* Operations that did not complete during the submission: cancel them all, then wait up to
 * 100 ms for their completions and the cancel's own (a cancelled read that waited for data
 * completes at once). Returns how many of the batch's were found. */
static unsigned cancel_missing(struct uring *u, int32_t *res, unsigned n, unsigned missing)
{
	struct __kernel_timespec ts = { .tv_nsec = 100 * 1000 * 1000 };
	struct io_uring_getevents_arg arg = { .ts = (uintptr_t)&ts };
	unsigned idx = u->sq_local_tail & *u->sq_mask, found = 0;
	struct io_uring_sqe *s = &u->sqes[idx];

	memset(s, 0, sizeof(*s));
	s->opcode = IORING_OP_ASYNC_CANCEL;
	s->fd = -1;
	s->cancel_flags = IORING_ASYNC_CANCEL_ANY;
	s->user_data = URING_MAX_OPS; /* not an operation of the batch: reap skips it */
	u->sq_array[idx] = idx;
	u->sq_local_tail++;
	__atomic_store_n(u->sq_tail, u->sq_local_tail, __ATOMIC_RELEASE);
	int r;

	do
		r = sys_enter(u->fd, 1, missing + 1, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
			      &arg, sizeof(arg));
	while (r < 0 && errno == EINTR);
	found += reap(u, res, n);
	return found;
}

int uring_run(struct uring *u, int32_t *res)
{
	unsigned n = u->queued, done = 0, found;
	int r;

	if (n == 0)
		return 0;
	for (unsigned i = 0; i < n; i++)
		res[i] = -ECANCELED;
	__atomic_store_n(u->sq_tail, u->sq_local_tail, __ATOMIC_RELEASE);
	u->queued = 0;
	/* With SUBMIT_ALL the kernel takes every entry in one call, unless the call fails as a
	 * whole (-EAGAIN, -ENOMEM, -EBUSY: then it took fewer, or none). */
	do
		r = sys_enter(u->fd, n, 0, 0, NULL, 0);
	while (r < 0 && errno == EINTR);
	done = r > 0 ? (unsigned)r : 0;
	if (done > n)
		done = n;
	found = reap(u, res, n);
	if (done < n) {
		/* The rest stay in the submission queue, where the next call would find them with
		 * their buffers long gone. Drop them: move the tail back over them, which is
		 * allowed for entries the kernel has not consumed (it only reads the tail when it
		 * is called). */
		u->sq_local_tail -= n - done;
		__atomic_store_n(u->sq_tail, u->sq_local_tail, __ATOMIC_RELEASE);
	}
	if (found < done)
		return found + cancel_missing(u, res, n, done - found) < done ? -ETIMEDOUT
										   : -EIO;
	return done < n ? -EIO : (int)n;
}
