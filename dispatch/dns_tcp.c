/* dns_tcp.c — hijacked DNS over TCP: the length-prefix framer and one connection's loop
 * (dns_tcp.h).
 *
 * A connection runs one function, pump(), from every event that can change what it may do
 * (readable, writable, a reply arriving, the work event): write what is queued, take whole
 * queries from the framer while the bounds allow, read more while they still allow, then set
 * the stream's interest from the result. A reply that arrives from inside the resolver's query
 * call is only queued there; the work event writes it, so no path recurses into the resolver.
 *
 * Ending is deferred like the relay's: end() records the reason, drops interest and activates
 * the work event, which frees everything; never from deep inside a stream or resolver callback.
 *
 * Each query in flight owns a slot (its ticket, the reply callback's argument); free slots are
 * a stack of indices, so taking and giving back one costs O(1).
 */
#include "dispatch/dns_tcp.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include <event2/event.h>

#include "core/budget.h"

#define DNS_TCP_ROUNDS 16         /* reads per pump: one busy client cannot starve the loop */
#define DNS_TCP_REPLY_MAX 65535   /* a TCP message's length field */
#define DNS_RCODE_REFUSED 5

/* ---- the framer ---------------------------------------------------------------------------- */

void dns_tcp_framer_init(struct dns_tcp_framer *f)
{
	f->head = f->tail = 0;
}

uint8_t *dns_tcp_framer_space(struct dns_tcp_framer *f, size_t *room)
{
	if (f->head > 0) {
		memmove(f->buf, f->buf + f->head, f->tail - f->head);
		f->tail -= f->head;
		f->head = 0;
	}
	*room = sizeof(f->buf) - f->tail;
	return f->buf + f->tail;
}

void dns_tcp_framer_commit(struct dns_tcp_framer *f, size_t n)
{
	assert(n <= sizeof(f->buf) - f->tail);
	f->tail += (uint32_t)n;
}

size_t dns_tcp_framer_push(struct dns_tcp_framer *f, const void *in, size_t n)
{
	size_t room;
	uint8_t *p = dns_tcp_framer_space(f, &room);

	if (n > room)
		n = room;
	memcpy(p, in, n);
	dns_tcp_framer_commit(f, n);
	return n;
}

int dns_tcp_framer_next(struct dns_tcp_framer *f, const uint8_t **msg, size_t *len)
{
	size_t held = f->tail - f->head, n;
	const uint8_t *p = f->buf + f->head;

	if (held < 2)
		return 0;
	n = (size_t)p[0] << 8 | p[1];
	/* Shorter than a header is no message; longer than we hold is no query we take. Either
	 * way the next length prefix cannot be found: the caller closes. */
	if (n < DNS_TCP_HEADER_MIN || n > DNS_TCP_QUERY_MAX)
		return -EBADMSG;
	if (held < 2 + n)
		return 0;
	*msg = p + 2;
	*len = n;
	f->head += (uint32_t)(2 + n);
	return 1;
}

/* ---- a connection ------------------------------------------------------------------------- */

enum dns_tcp_end {
	END_DONE,       /* the app's FIN, every reply written: graceful close */
	END_IDLE,       /* idle: graceful close */
	END_BAD_LENGTH, /* abort */
	END_RESET,      /* the app reset, a read or write failed: abort */
	END_NOMEM,      /* abort */
	END_CANCELLED,  /* dns_tcp_cancel: abort */
	END_STALLED,    /* replies waited idle_ns with none of their bytes taken: abort */
};

/* A reply waiting to be written: the length prefix and the message, off bytes written. */
struct reply {
	STAILQ_ENTRY(reply) link;
	size_t len, off;
	uint8_t data[];
};

struct slot {
	struct dns_tcp *c;
	struct dns_ticket *ticket; /* while the reply is still to come */
	bool busy;
};

struct dns_tcp {
	struct stream *s;
	const struct dns_tcp_resolver *res;
	struct budget *budget;
	struct dns_tcp_counters *ctr;
	struct event *work_ev, *idle_ev;
	int64_t idle_ns, last_active_ns;
	int64_t out_moved_ns;      /* the last write that took bytes, or the queue's start */
	STAILQ_HEAD(, reply) out;
	size_t out_bytes;          /* unwritten bytes of out */
	uint32_t inflight;         /* busy slots */
	uint32_t n_free;
	uint8_t free_idx[DNS_TCP_MAX_INFLIGHT];
	bool eof;                  /* the app's FIN was read */
	bool nomem;                /* a reply could not be copied: end as soon as possible */
	bool ending;
	enum dns_tcp_end reason;
	dns_tcp_done_fn done;
	void *done_arg;
	struct slot slots[DNS_TCP_MAX_INFLIGHT];
	struct dns_tcp_framer fr;
};

/* Idle accounting only needs milliseconds; the coarse clock costs no syscall. */
static int64_t coarse_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void end(struct dns_tcp *c, enum dns_tcp_end reason)
{
	if (c->ending)
		return;
	c->ending = true;
	c->reason = reason;
	stream_set_interest(c->s, false, false);
	event_active(c->work_ev, EV_TIMEOUT, 0);
}

static void destroy(struct dns_tcp *c)
{
	ctr_t *closed[] = {
		[END_DONE] = &c->ctr->closed_done,
		[END_IDLE] = &c->ctr->closed_idle,
		[END_BAD_LENGTH] = &c->ctr->closed_bad_length,
		[END_RESET] = &c->ctr->closed_reset,
		[END_NOMEM] = &c->ctr->closed_nomem,
		[END_CANCELLED] = &c->ctr->closed_cancelled,
		[END_STALLED] = &c->ctr->closed_stalled,
	};
	dns_tcp_done_fn done = c->done;
	void *arg = c->done_arg;
	struct reply *r;

	for (size_t i = 0; i < DNS_TCP_MAX_INFLIGHT; i++) {
		if (c->slots[i].busy && c->slots[i].ticket)
			c->res->cancel(c->res->ctx, c->slots[i].ticket);
	}
	while ((r = STAILQ_FIRST(&c->out)) != NULL) {
		STAILQ_REMOVE_HEAD(&c->out, link);
		budget_mfree(c->budget, r);
	}
	if (c->reason == END_DONE || c->reason == END_IDLE)
		stream_close(c->s);
	else
		stream_abort(c->s);
	event_free(c->work_ev);
	event_free(c->idle_ev);
	ctr_inc(closed[c->reason]);
	ctr_add(&c->ctr->live, (uint64_t)0 - 1);
	budget_mfree(c->budget, c);
	done(arg);
}

void dns_tcp_cancel(struct dns_tcp *c)
{
	if (!c->ending) {
		c->ending = true;
		c->reason = END_CANCELLED;
	}
	destroy(c);
}

/* Queue msg framed. false when the budget refused the copy. */
static bool enqueue(struct dns_tcp *c, const uint8_t *msg, size_t len)
{
	struct reply *r = budget_malloc(c->budget, sizeof(*r) + 2 + len);

	if (!r)
		return false;
	r->len = 2 + len;
	r->off = 0;
	r->data[0] = (uint8_t)(len >> 8);
	r->data[1] = (uint8_t)len;
	memcpy(r->data + 2, msg, len);
	if (STAILQ_EMPTY(&c->out))
		c->out_moved_ns = coarse_now_ns();
	STAILQ_INSERT_TAIL(&c->out, r, link);
	c->out_bytes += r->len;
	return true;
}

static void on_reply(void *arg, const uint8_t *msg, size_t len)
{
	struct slot *sl = arg;
	struct dns_tcp *c = sl->c;

	assert(sl->busy);
	sl->busy = false;
	sl->ticket = NULL;
	c->free_idx[c->n_free++] = (uint8_t)(sl - c->slots);
	c->inflight--;
	/* len 0: the resolver dropped the query; nothing goes back for it. */
	if (!c->ending && len > 0 && len <= DNS_TCP_REPLY_MAX && !enqueue(c, msg, len))
		c->nomem = true;
	event_active(c->work_ev, EV_TIMEOUT, 0);
}

/* The resolver refused at once: answer REFUSED from the query's header (its id, opcode and
 * RD; no sections), so the client does not wait for an answer that never comes. */
static bool refuse(struct dns_tcp *c, const uint8_t *q)
{
	uint8_t h[DNS_TCP_HEADER_MIN] = { q[0], q[1] };

	h[2] = (uint8_t)(0x80 | (q[2] & 0x79)); /* QR, the query's opcode and RD */
	h[3] = DNS_RCODE_REFUSED;
	return enqueue(c, h, sizeof(h));
}

static void submit(struct dns_tcp *c, const uint8_t *msg, size_t len)
{
	struct slot *sl;
	int ret;

	assert(c->n_free > 0);
	sl = &c->slots[c->free_idx[--c->n_free]];
	sl->busy = true;
	sl->ticket = NULL;
	c->inflight++;
	ret = c->res->query(c->res->ctx, msg, len, true, DNS_TCP_REPLY_MAX, on_reply, sl,
			    &sl->ticket);
	if (ret == 0) {
		ctr_inc(&c->ctr->queries);
		if (!sl->busy) /* answered inside the call */
			sl->ticket = NULL;
		return;
	}
	sl->busy = false;
	c->free_idx[c->n_free++] = (uint8_t)(sl - c->slots);
	c->inflight--;
	ctr_inc(&c->ctr->queries_refused);
	if (!refuse(c, msg))
		c->nomem = true;
}

/* Write what is queued. -1 when the stream failed (the end is recorded). */
static int flush(struct dns_tcp *c)
{
	struct reply *r;
	ssize_t n;

	while ((r = STAILQ_FIRST(&c->out)) != NULL) {
		n = stream_write(c->s, r->data + r->off, r->len - r->off);
		if (n == -EAGAIN)
			return 0;
		if (n < 0) {
			end(c, END_RESET);
			return -1;
		}
		r->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		c->out_moved_ns = coarse_now_ns();
		if (r->off < r->len)
			return 0;
		STAILQ_REMOVE_HEAD(&c->out, link);
		budget_mfree(c->budget, r);
		ctr_inc(&c->ctr->replies);
		c->last_active_ns = coarse_now_ns();
	}
	return 0;
}

static bool may_take(const struct dns_tcp *c)
{
	return c->inflight < DNS_TCP_MAX_INFLIGHT && c->out_bytes < DNS_TCP_OUT_MAX && !c->nomem;
}

/* Hand whole queries to the resolver while the bounds allow. -1: a bad length (ended). */
static int take(struct dns_tcp *c)
{
	const uint8_t *msg;
	size_t len;
	int ret;

	while (may_take(c)) {
		if ((ret = dns_tcp_framer_next(&c->fr, &msg, &len)) < 0) {
			end(c, END_BAD_LENGTH);
			return -1;
		}
		if (ret == 0)
			break;
		c->last_active_ns = coarse_now_ns();
		submit(c, msg, len);
	}
	return 0;
}

/* Read and take queries, at most DNS_TCP_ROUNDS reads. -1: the connection ended. */
static int read_queries(struct dns_tcp *c)
{
	size_t room;
	uint8_t *p;
	ssize_t n;

	for (int i = 0; i < DNS_TCP_ROUNDS; i++) {
		if (take(c) != 0)
			return -1;
		if (c->eof || !may_take(c))
			return 0;
		p = dns_tcp_framer_space(&c->fr, &room);
		assert(room > 0); /* no whole message is held (take), and a partial one fits */
		n = stream_read(c->s, p, room);
		if (n == -EAGAIN)
			return 0;
		if (n < 0) {
			end(c, END_RESET);
			return -1;
		}
		if (n == 0)
			c->eof = true;
		else
			dns_tcp_framer_commit(&c->fr, (size_t)n);
	}
	return take(c);
}

static void pump(struct dns_tcp *c)
{
	if (c->ending)
		return;
	if (flush(c) != 0 || read_queries(c) != 0 || flush(c) != 0)
		return;
	if (c->nomem) {
		end(c, END_NOMEM);
		return;
	}
	/* After the app's FIN: done once every reply is out. A partial query left in the
	 * framer will never complete and is dropped with the connection. */
	if (c->eof && c->inflight == 0 && STAILQ_EMPTY(&c->out)) {
		end(c, END_DONE);
		return;
	}
	stream_set_interest(c->s, !c->eof && may_take(c), !STAILQ_EMPTY(&c->out));
}

static void on_work(evutil_socket_t fd, short what, void *arg)
{
	struct dns_tcp *c = arg;

	if (c->ending)
		destroy(c);
	else
		pump(c);
}

static void on_io(void *arg)
{
	pump(arg);
}

static void on_error(void *arg, int err)
{
	end(arg, END_RESET);
}

static int idle_arm(struct dns_tcp *c, int64_t ns)
{
	struct timeval tv = { (time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL) / 1000 };

	return evtimer_add(c->idle_ev, &tv) == 0 ? 0 : -ENOMEM;
}

/* Idle: nothing in flight, nothing to write, and idle_ns since the last query or reply.
 * Stalled: replies wait and the app has taken none of their bytes for idle_ns (it stopped
 * reading; its window stays shut): without this end such a connection would hold its session
 * and its replies' memory for as long as the app keeps it open. */
static void on_idle(evutil_socket_t fd, short what, void *arg)
{
	struct dns_tcp *c = arg;
	int64_t now = coarse_now_ns(), quiet = now - c->last_active_ns;

	if (c->ending)
		return;
	if (!STAILQ_EMPTY(&c->out) && now - c->out_moved_ns >= c->idle_ns) {
		end(c, END_STALLED);
		return;
	}
	if (c->inflight > 0 || !STAILQ_EMPTY(&c->out) || quiet < c->idle_ns) {
		int64_t next = c->inflight > 0 || quiet >= c->idle_ns ? c->idle_ns
								      : c->idle_ns - quiet;

		/* Waiting replies: no later than their stall deadline. A connection its timer
		 * can no longer bound ends (no memory for the timer). */
		if (!STAILQ_EMPTY(&c->out) && c->idle_ns - (now - c->out_moved_ns) < next)
			next = c->idle_ns - (now - c->out_moved_ns);
		if (idle_arm(c, next > 1000000 ? next : 1000000) != 0)
			end(c, END_NOMEM);
		return;
	}
	end(c, END_IDLE);
}

int dns_tcp_new(struct event_base *base, struct stream *s, const struct dns_tcp_params *p,
		dns_tcp_done_fn done, void *arg, struct dns_tcp **out)
{
	static const struct stream_cbs cbs = { on_io, on_io, on_error };
	struct dns_tcp *c;

	if (out)
		*out = NULL;
	if (!base || !s || !p || !p->resolver || !p->budget || !p->counters || p->idle_ms == 0 ||
	    !done)
		return -EINVAL;
	if (!(c = budget_calloc(p->budget, 1, sizeof(*c))))
		return -ENOMEM;
	c->work_ev = event_new(base, -1, 0, on_work, c);
	c->idle_ev = evtimer_new(base, on_idle, c);
	c->idle_ns = (int64_t)p->idle_ms * 1000000LL;
	/* A connection its idle timer cannot bound is not taken. */
	if (!c->work_ev || !c->idle_ev || idle_arm(c, c->idle_ns) != 0) {
		if (c->work_ev)
			event_free(c->work_ev);
		if (c->idle_ev)
			event_free(c->idle_ev);
		budget_mfree(p->budget, c);
		return -ENOMEM;
	}
	c->s = s;
	c->res = p->resolver;
	c->budget = p->budget;
	c->ctr = p->counters;
	c->done = done;
	c->done_arg = arg;
	c->last_active_ns = coarse_now_ns();
	STAILQ_INIT(&c->out);
	dns_tcp_framer_init(&c->fr);
	for (uint32_t i = 0; i < DNS_TCP_MAX_INFLIGHT; i++) {
		c->slots[i].c = c;
		c->free_idx[i] = (uint8_t)(DNS_TCP_MAX_INFLIGHT - 1 - i);
	}
	c->n_free = DNS_TCP_MAX_INFLIGHT;
	ctr_inc(&c->ctr->connections);
	ctr_inc(&c->ctr->live);
	stream_set_callbacks(s, &cbs, c);
	stream_set_interest(s, true, false);
	if (out)
		*out = c;
	return 0;
}

void dns_tcp_counters_read(const struct dns_tcp_counters *c, struct dns_tcp_stats *out)
{
	out->connections = ctr_get(&c->connections);
	out->queries = ctr_get(&c->queries);
	out->queries_refused = ctr_get(&c->queries_refused);
	out->replies = ctr_get(&c->replies);
	out->closed_done = ctr_get(&c->closed_done);
	out->closed_idle = ctr_get(&c->closed_idle);
	out->closed_bad_length = ctr_get(&c->closed_bad_length);
	out->closed_reset = ctr_get(&c->closed_reset);
	out->closed_nomem = ctr_get(&c->closed_nomem);
	out->closed_cancelled = ctr_get(&c->closed_cancelled);
	out->closed_stalled = ctr_get(&c->closed_stalled);
	out->live = ctr_get(&c->live);
}
