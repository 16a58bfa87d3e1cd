/* udp_uptrain.c — datagrams out in trains, the parts off the per-datagram path: the UDP GSO
 * send of a train of two or more and its fallbacks, and turning trains on. Gathering a train
 * (sock_send_tun) and sending a train of one are in udp.c, inlined into the input. Design and
 * contracts: udp.h (udp_path_set_uptrains), docs/architecture.md "Datagrams out in trains".
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/counter.h"
#include "core/log.h"
#include "core/udp_codec.h"
#include "dispatch/udp_int.h"

/* One UDP GSO send: len bytes the kernel cuts every seg bytes into datagrams (the UDP_SEGMENT
 * control message; Documentation/networking/segmentation-offloads.rst, "UDP Fragmentation
 * Offload" and GSO). */
static ssize_t send_gso(int fd, const void *buf, size_t len, const struct sockaddr *to,
			socklen_t tolen, uint16_t seg)
{
	union {
		char buf[CMSG_SPACE(sizeof(uint16_t))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr mh = { .msg_name = (void *)to, .msg_namelen = tolen, .msg_iov = &iov,
			     .msg_iovlen = 1, .msg_control = ctl.buf,
			     .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	ssize_t n;

	c->cmsg_level = SOL_UDP;
	c->cmsg_type = UDP_SEGMENT;
	c->cmsg_len = CMSG_LEN(sizeof(seg));
	memcpy(CMSG_DATA(c), &seg, sizeof(seg));
	n = sendmsg(fd, &mh, MSG_DONTWAIT);
	return n < 0 ? -errno : n;
}

ssize_t udp_sendto_os(int fd, const void *buf, size_t len, const struct sockaddr *to,
		      socklen_t tolen, uint16_t seg)
{
	ssize_t n;

	if (seg)
		return send_gso(fd, buf, len, to, tolen, seg);
	n = sendto(fd, buf, len, 0, to, tolen);
	return n < 0 ? -errno : n;
}

/* No UDP GSO on this route or device (or kernel): trains off for the path, said once. */
static __attribute__((cold)) void uptrains_refused(struct udp_path *up, int err)
{
	up->ut_on = false;
	if (up->log && !up->ut_logged)
		log_info(up->log, "udp: datagrams out one by one: the kernel refused a UDP GSO "
			 "send (%s)", strerror(-err));
	up->ut_logged = true;
}

void udp_uptrain_send(struct udp_path *up)
{
	struct udp_uptrain *u = &up->ut;
	struct usock *k = u->k;
	uint32_t n = u->n;
	ssize_t r;

	u->n = 0;
	r = up->sendgso_fn ? up->sendgso_fn(up->sendgso_arg, k->fd, u->buf, u->bytes,
					    (const struct sockaddr *)&u->to, u->tolen,
					    (uint16_t)u->seg)
			   : send_gso(k->fd, u->buf, u->bytes, (const struct sockaddr *)&u->to,
				     u->tolen, (uint16_t)u->seg);
	if (r >= 0) {
		ctr_add(&up->ctr.up_datagrams, n);
		ctr_add(&up->ctr.up_bytes, u->bytes);
		ctr_inc(&up->ctr.up_trains);
		ctr_add(&up->ctr.up_train_datagrams, n);
		return;
	}
	switch (r) {
	case -EAGAIN:
		/* The socket buffer is full: they wait in its queue, in order, as n sendtos
		 * would have (the write event sends them; no train forms behind them). */
		for (uint32_t i = 0; i < n; i++) {
			size_t off = (size_t)i * u->seg;
			udp_up_enqueue(up, k, &u->to, u->tolen, NULL, u->buf + off,
				       i + 1 < n ? u->seg : u->bytes - off);
		}
		return;
	case -EINVAL:
	case -EOPNOTSUPP:
	case -EIO:
		ctr_inc(&up->ctr.up_train_errors);
		uptrains_refused(up, (int)r);
		break;
	case -EMSGSIZE:
		/* The segment is over what the route's MTU allows a GSO segment; a plain send
		 * fragments instead. This socket gathers only smaller ones from now on. */
		ctr_inc(&up->ctr.up_train_errors);
		k->ut_max = (uint16_t)(u->seg - 1);
		break;
	default:
		/* Anything else is the route's or the destination's, the same for every
		 * datagram of the train: n sendtos would fail alike (and cost n calls). */
		ctr_add(&up->ctr.drops[UDP_DROP_send_error], n);
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		size_t off = (size_t)i * u->seg;
		udp_sock_send_now(up, k, &u->to, u->tolen, NULL, u->buf + off,
				  i + 1 < n ? u->seg : u->bytes - off);
	}
}

/* Does this kernel know UDP_SEGMENT (4.18 and later)? An older one would ignore the control
 * message and send a train as one large datagram: asked once, on a socket of our own. */
static bool gso_supported(void)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), v = 0;
	bool ok;

	if (fd < 0)
		return false;
	ok = setsockopt(fd, SOL_UDP, UDP_SEGMENT, &v, sizeof(v)) == 0;
	close(fd);
	return ok;
}

int udp_path_set_uptrains(struct udp_path *up, bool on)
{
	struct udp_uptrain *u = &up->ut;
	size_t seg, cap;

	udp_path_batch_end(up);
	up->ut_on = false;
	if (!on) {
		if (u->buf)
			budget_mfree(up->b, u->buf);
		u->buf = NULL;
		u->cap = 0;
		return 0;
	}
	if (!gso_supported())
		return -EOPNOTSUPP;
	/* A datagram from the TUN is at most its MTU less the smallest IP and UDP headers: the
	 * largest segment; the buffer holds a whole train of them, up to one datagram's worth
	 * (the larger IPv6 one). */
	seg = up->mtu > 28 ? up->mtu - 28 : 1;
	if (seg > udp_codec_max_payload(4))
		seg = udp_codec_max_payload(4);
	cap = seg * UDP_CODEC_TRAIN_MAX;
	if (cap > udp_codec_max_payload(6))
		cap = udp_codec_max_payload(6);
	if (!u->buf) {
		if (!(u->buf = budget_malloc(up->b, cap)))
			return -ENOBUFS;
		u->cap = cap;
	}
	for (int i = 0; i < 2; i++) {
		size_t max = udp_codec_max_payload(i ? 6 : 4);
		up->ut_limit[i] = max < u->cap ? max : u->cap;
	}
	up->ut_segmax = (uint16_t)seg;
	up->ut_on = true;
	return 0;
}
