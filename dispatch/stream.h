/* stream.h — one end of a relayed TCP connection, whatever carries it.
 *
 * The relay moves bytes between two streams and never knows what is behind them: a kernel
 * socket (stream_sock.c: the system stack's accepted socket, every outbound socket) or, with the
 * lwIP stack, a tcp_pcb that has no fd at all. The interface is therefore callback-driven and
 * readiness-based, like a non-blocking socket on an event loop, and a stream exposes its fd only
 * as an optional fast path (splice) that the relay may take when BOTH ends have one.
 *
 * Contracts every implementation keeps (the relay relies on them):
 *  - Single-threaded: every op and every callback runs on the stream's event loop thread.
 *  - Callbacks are never invoked from inside an op (no re-entrancy); they run from the loop.
 *  - Level-triggered: while read interest is on and the stream has data, EOF or an error to
 *    report, `readable` keeps firing (once per loop iteration at most); likewise `writable`
 *    while write interest is on and write() would accept at least one byte (or fail).
 *  - A callback may call any op, including close()/abort() of its own stream; the
 *    implementation must not touch the stream after the callback returns.
 *  - `error` is for failures the stream learns asynchronously (lwIP's tcp_err: the pcb is
 *    already gone). A kernel socket never calls it: its errors come back from read/write.
 *    After `error`, read/write return the error; the owner still calls abort() or close()
 *    exactly once, which then only frees.
 *  - EOF means the peer's FIN: read() returns 0 only when the peer finished sending, never
 *    for a reset. (A kernel socket reports a reset once, to whichever call comes first; a
 *    read after a write that got -ECONNRESET sees 0. The relay, which also splices on the
 *    fd behind the stream's back, keeps that record itself: see relay.c.)
 *  - close() and abort() free the stream; exactly one of them is called, exactly once.
 *    Neither touches the fd budget: the owner that reserved a descriptor releases it. The
 *    relay calls them from its own event (never from inside a stream callback), so an lwIP
 *    stream can tcp_abort there without the ERR_ABRT dance of a recv callback.
 *  - Flow control: read() hands bytes over for good. The relay reads a direction only when
 *    everything it read before was accepted by the other stream, so a stream that opens its
 *    receive window in read() (lwIP: tcp_recved) runs at most one relay buffer ahead of what
 *    the destination accepted (gather: not at all ahead; skip() takes only what it took); write() accepting only what fits (lwIP: tcp_sndbuf) closes
 *    the loop the other way. A destination that can tell how much a write would take now
 *    (write_room) is read for no more than that: the bytes it cannot take yet stay in the
 *    source (a kernel socket's receive buffer, whose window then holds the sender back)
 *    instead of waiting in a relay buffer.
 */
#ifndef TS_DISPATCH_STREAM_H
#define TS_DISPATCH_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

struct event_base;
struct stream;

struct stream_cbs {
	void (*readable)(void *arg);
	void (*writable)(void *arg);
	/* err is -errno (e.g. -ECONNRESET, -ECONNABORTED). May be NULL for sockets. */
	void (*error)(void *arg, int err);
};

struct stream_ops {
	/* > 0 bytes read, 0 at EOF (the peer shut down its sending side; repeats), -EAGAIN when
	 * nothing is available yet, or -errno (-ECONNRESET ...). n > 0. */
	ssize_t (*read)(struct stream *s, void *buf, size_t n);
	/* Bytes accepted (1..n, may be short), -EAGAIN when none fit now, or -errno (-EPIPE,
	 * -ECONNRESET ...). Accepted bytes are the stream's to deliver; a copy is made if needed,
	 * buf is not referenced after return. n > 0. */
	ssize_t (*write)(struct stream *s, const void *buf, size_t n);
	/* Send FIN after the bytes already accepted. 0 or -errno. Called at most once. */
	int (*shutdown_write)(struct stream *s);
	/* Which of readable/writable should fire. Cheap when nothing changes. A stream that
	 * cannot watch what is asked (no memory) fails: the callback asked for runs from the
	 * loop, and its calls return the error (-ENOMEM). */
	void (*set_interest)(struct stream *s, bool read, bool write);
	/* The kernel socket for splice(2), or -1 (then only the copy relay applies). A stream
	 * that returns an fd must also accept splice on it: the relay reads and writes the fd
	 * directly and uses read/write/shutdown_write of this table for everything else. */
	int (*fd)(const struct stream *s);
	/* Reset the connection (RST to the peer: SO_LINGER {1, 0} then close for a socket;
	 * tcp_abort for lwIP) and free the stream. */
	void (*abort)(struct stream *s);
	/* Graceful close (FIN after pending data) and free the stream. */
	void (*close)(struct stream *s);
	/* How much of what write() accepted, and the FIN of shutdown_write(), the peer has not
	 * acknowledged yet: > 0 still on its way, 0 delivered (or the stack will finish the
	 * delivery on its own after close()), -errno the connection failed and it never will.
	 * A stream that cannot tell returns 0. May be NULL (same as 0). The relay polls it
	 * before a close that must not cost the peer its last bytes: a TCP endpoint closed with
	 * unread input, or receiving more after close, answers with RST and discards what it
	 * had not yet delivered. */
	ssize_t (*unacked)(const struct stream *s);
	/* Copy up to n of the bytes read() would return next without taking them: > 0 bytes,
	 * 0 at EOF with nothing queued, -EAGAIN when nothing has arrived, or -errno. May be NULL
	 * (the stream cannot be looked into: nothing is sniffed). */
	ssize_t (*peek)(struct stream *s, void *buf, size_t n);
	/* readable fires only once at least lowat bytes are queued (or at EOF or an error);
	 * 1 is the normal behaviour, and what the relay expects. Lets an owner that peeked
	 * k bytes wait for more without being woken for the same k (SO_RCVLOWAT on a socket).
	 * May be NULL when peek is. */
	void (*set_lowat)(struct stream *s, size_t lowat);
	/* How many bytes write() would accept now: 0 exactly when writable would not fire
	 * (write interest then waits for room), SIZE_MAX when the stream cannot tell or a
	 * write would fail. A write of at most that many bytes may still be short (the stack
	 * ran out of memory meanwhile). May be NULL (same as SIZE_MAX). */
	size_t (*write_room)(const struct stream *s);
	/* Views of up to n of the bytes read() would return next, without taking them (the
	 * stream's own buffers, no copy): fills at most *cnt iovecs and sets *cnt to the number
	 * filled. > 0 bytes, 0 at EOF with nothing queued, -EAGAIN when nothing has arrived, or
	 * -errno. The views stay valid until the next call on the stream or the return to the
	 * event loop (lwIP may drop its queue from its own callbacks then). May be NULL. */
	ssize_t (*peekv)(struct stream *s, struct iovec *iov, int *cnt, size_t n);
	/* Take the next n bytes as read() would, without copying them anywhere: n is at most
	 * what the last peekv returned. May be NULL when peekv is. */
	void (*skip)(struct stream *s, size_t n);
	/* write() from cnt iovecs (cnt >= 1, their total > 0): the same returns. May be NULL. */
	ssize_t (*writev)(struct stream *s, const struct iovec *iov, int cnt);
};

/* The common head of every implementation; implementations embed it first. */
struct stream {
	const struct stream_ops *ops;
	struct stream_cbs cb;
	void *cb_arg;
};

static inline void stream_set_callbacks(struct stream *s, const struct stream_cbs *cbs,
					void *arg)
{
	s->cb = *cbs;
	s->cb_arg = arg;
}

static inline ssize_t stream_read(struct stream *s, void *buf, size_t n)
{
	return s->ops->read(s, buf, n);
}

static inline ssize_t stream_write(struct stream *s, const void *buf, size_t n)
{
	return s->ops->write(s, buf, n);
}

static inline int stream_shutdown_write(struct stream *s)
{
	return s->ops->shutdown_write(s);
}

static inline void stream_set_interest(struct stream *s, bool read, bool write)
{
	s->ops->set_interest(s, read, write);
}

static inline int stream_fd(const struct stream *s)
{
	return s->ops->fd(s);
}

static inline void stream_abort(struct stream *s)
{
	s->ops->abort(s);
}

static inline void stream_close(struct stream *s)
{
	s->ops->close(s);
}

static inline bool stream_can_peek(const struct stream *s)
{
	return s->ops->peek && s->ops->set_lowat;
}

static inline ssize_t stream_peek(struct stream *s, void *buf, size_t n)
{
	return s->ops->peek(s, buf, n);
}

static inline void stream_set_lowat(struct stream *s, size_t lowat)
{
	s->ops->set_lowat(s, lowat);
}

static inline size_t stream_write_room(const struct stream *s)
{
	return s->ops->write_room ? s->ops->write_room(s) : SIZE_MAX;
}

/* src's queued bytes can be handed to dst without a copy of the relay's own: src lends views
 * of its buffers (peekv, skip) and dst takes them in one call (writev). */
static inline bool stream_can_gather(const struct stream *src, const struct stream *dst)
{
	return src->ops->peekv && src->ops->skip && dst->ops->writev;
}

static inline ssize_t stream_peekv(struct stream *s, struct iovec *iov, int *cnt, size_t n)
{
	return s->ops->peekv(s, iov, cnt, n);
}

static inline void stream_skip(struct stream *s, size_t n)
{
	s->ops->skip(s, n);
}

static inline ssize_t stream_writev(struct stream *s, const struct iovec *iov, int cnt)
{
	return s->ops->writev(s, iov, cnt);
}

static inline ssize_t stream_unacked(const struct stream *s)
{
	return s->ops->unacked ? s->ops->unacked(s) : 0;
}

/* ---- the kernel-socket stream (stream_sock.c) ------------------------------------------ */

/* Wrap a connected TCP (or AF_UNIX stream) socket. The socket is made O_NONBLOCK here (splice
 * needs it: SPLICE_F_NONBLOCK only covers the pipe). On success the stream owns fd (close and
 * abort close it); on failure (-ENOMEM, -errno from fcntl) the caller still owns it. No
 * callbacks fire until set_interest asks for them. */
int stream_sock_new(struct event_base *base, int fd, struct stream **out)
	__attribute__((warn_unused_result));

#endif
