/* tun_linux.c — the Linux TUN device behind core/tun.h: /dev/net/tun + TUNSETIFF for the
 * queues, rtnetlink (core/netlink.c) for link settings and addresses, /proc and /sys for the
 * rp_filter check and the device counters.
 */
#include "core/tun.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/if_addr.h>
#include <linux/if_tun.h>
#include <linux/rtnetlink.h>

#include "core/config.h"
#include "core/netlink.h"
#include "core/sysfile.h"

/* Missing from older uapi headers (Debian bookworm); values from Linux 6.2. */
#ifndef TUN_F_USO4
#define TUN_F_USO4 0x20
#endif
#ifndef TUN_F_USO6
#define TUN_F_USO6 0x40
#endif
_Static_assert(TUN_OFFLOAD_ALL ==
		       (TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_USO4 | TUN_F_USO6),
	       "TUN_OFFLOAD_ALL matches the kernel's TUN_F_* bits");

#define TUN_DEV_PATH "/dev/net/tun"

struct tun {
	char name[IFNAMSIZ];
	int ifindex;
	bool created;
	bool vnet_hdr;
	uint32_t offload;
	bool has_addr4, has_addr6;
	struct netaddr_cidr addr4, addr6;
	uint32_t nqueues;  /* fds[0 .. nqueues) are open */
	bool offload_failed; /* the open failed at an offload step (IFF_VNET_HDR, TUNSET*) */
	bool rps;            /* rps_cpus set by tun_set_rps */
	bool rps_auto;       /* tun.rps "auto": the loop decides (tun_rps_auto) */
	/* rx-N/rps_cpus of every queue, opened by the first tun_set_rps (tun_open_config's, at
	 * start) and kept: the files are root's, and the proxy may have given up root since. */
	int *rps_fds;
	bool borrowed;       /* fds[0] is a caller's (tun_adopt_fd): never closed here */
	bool multi_queue;    /* the device has IFF_MULTI_QUEUE */
	uint32_t vnet_hdr_len; /* bytes of virtio header per frame when vnet_hdr */
	int fds[];
};

static int fail(char *err, size_t errlen, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Write "tun: " + the message into err and return ret (a negative errno). */
static int fail(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!err || errlen == 0)
		return ret;
	n = snprintf(err, errlen, "tun: ");
	if (n < 0 || (size_t)n >= errlen)
		return ret;
	va_start(ap, fmt);
	vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return ret;
}

/* The kernel's dev_valid_name(): it would refuse anything else, and the name also becomes a
 * path component under /proc and /sys here. */
static bool valid_ifname(const char *name)
{
	size_t len = strnlen(name, IFNAMSIZ);

	if (len == 0 || len >= IFNAMSIZ || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return false;
	for (size_t i = 0; i < len; i++)
		if (name[i] == '/' || name[i] == ':' || name[i] == ' ' ||
		    (name[i] >= '\t' && name[i] <= '\r'))
			return false;
	return true;
}

void tun_params_init(struct tun_params *p)
{
	memset(p, 0, sizeof(*p));
}

void tun_params_from_config(struct tun_params *p, const struct ts_tun *cfg)
{
	tun_params_init(p);
	memcpy(p->name, cfg->name, sizeof(p->name));
	p->name[TUN_NAME_MAX] = '\0';
	p->mtu = cfg->mtu;
	p->txqueuelen = cfg->txqueuelen;
	p->has_addr4 = cfg->addr4.addr.family == 4;
	p->addr4 = cfg->addr4;
	p->has_addr6 = cfg->has_addr6;
	p->addr6 = cfg->addr6;
	p->queues = cfg->queues;
}

static int check_params(const struct tun_params *p, char *err, size_t errlen)
{
	const char *name = p->name[0] ? p->name : "(new)";

	if (strnlen(p->name, sizeof(p->name)) > TUN_NAME_MAX ||
	    (p->name[0] && !valid_ifname(p->name)))
		return fail(err, errlen, -EINVAL, "invalid interface name \"%.*s\"",
			    TUN_NAME_MAX, p->name);
	if (p->mtu && (p->mtu < 68 || p->mtu > 65535))
		return fail(err, errlen, -EINVAL, "%s: MTU %u outside 68..65535", name, p->mtu);
	/* Below 1280 the kernel silently disables IPv6 on the device (RFC 8200 section 5). */
	if (p->has_addr6 && p->mtu && p->mtu < 1280)
		return fail(err, errlen, -EINVAL, "%s: MTU %u is below 1280, the IPv6 minimum",
			    name, p->mtu);
	if (p->has_addr4 && (p->addr4.addr.family != 4 || p->addr4.prefix > 32))
		return fail(err, errlen, -EINVAL, "%s: bad IPv4 address or prefix", name);
	if (p->has_addr6 && (p->addr6.addr.family != 6 || p->addr6.prefix > 128))
		return fail(err, errlen, -EINVAL, "%s: bad IPv6 address or prefix", name);
	if (p->queues > TUN_QUEUES_MAX)
		return fail(err, errlen, -EINVAL, "%s: %u queues, at most %u", name, p->queues,
			    TUN_QUEUES_MAX);
	if (p->offload && !p->vnet_hdr)
		return fail(err, errlen, -EINVAL, "%s: offload flags need vnet_hdr", name);
	return 0;
}

static const char *open_hint(int e)
{
	switch (e) {
	case ENOENT:
		return " (no TUN device node: load the tun module with 'modprobe tun'; in a "
		       "container, pass /dev/net/tun in)";
	case ENODEV:
	case ENXIO:
		return " (the tun module is not loaded: 'modprobe tun')";
	case EACCES:
	case EPERM:
		return " (run as root, or grant access to /dev/net/tun and CAP_NET_ADMIN)";
	default:
		return "";
	}
}

/* TUNSETIFF on a fresh fd. *name is the wanted name in, the kernel's name out. */
static int set_iff(int fd, char name[IFNAMSIZ], short flags)
{
	struct ifreq ifr;

	memset(&ifr, 0, sizeof(ifr));
	memcpy(ifr.ifr_name, name, IFNAMSIZ);
	ifr.ifr_flags = flags;
	if (ioctl(fd, TUNSETIFF, &ifr) != 0)
		return -errno;
	memcpy(name, ifr.ifr_name, IFNAMSIZ);
	name[IFNAMSIZ - 1] = '\0';
	return 0;
}

static int iff_error(const struct tun *t, int ret, char *err, size_t errlen)
{
	const char *name = t->name[0] ? t->name : "(new)";

	switch (ret) {
	case -EBUSY:
		return fail(err, errlen, ret, "%s: name taken: a TUN device of that name is open "
			    "in another process (pick another tun.name or stop that process)",
			    name);
	case -EINVAL:
		return fail(err, errlen, ret, "%s: an interface of that name exists and is not a "
			    "TUN device we can attach to (a TAP or another kind of device, or a "
			    "different multi-queue setting)", name);
	case -EPERM:
		return fail(err, errlen, ret, "%s: not permitted to create or attach a TUN device "
			    "(needs CAP_NET_ADMIN, or to own the persistent device)", name);
	default:
		return fail(err, errlen, ret, "%s: TUNSETIFF: %s", name, strerror(-ret));
	}
}

/* Open one fd per queue and attach each to the device. The first attempt is exclusive
 * (IFF_TUN_EXCL): success means we created the device, atomically; EBUSY means it exists, and
 * the retry attaches to it (EBUSY again: another process has it open). */
static int open_queues(struct tun *t, uint32_t nq, bool vnet, char *err, size_t errlen)
{
	short flags = IFF_TUN | IFF_NO_PI;
	int ret;

	if (vnet)
		flags |= IFF_VNET_HDR;
	if (nq > 1)
		flags |= IFF_MULTI_QUEUE;
	t->multi_queue = nq > 1;
	for (uint32_t q = 0; q < nq; q++) {
		int fd = open(TUN_DEV_PATH, O_RDWR | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0) {
			ret = -errno;
			return fail(err, errlen, ret, "cannot open %s: %s%s", TUN_DEV_PATH,
				    strerror(-ret), open_hint(-ret));
		}
		if (q == 0) {
			ret = set_iff(fd, t->name, (short)(flags | IFF_TUN_EXCL));
			t->created = ret == 0;
			if (ret == -EBUSY)
				ret = set_iff(fd, t->name, flags);
		} else {
			ret = set_iff(fd, t->name, flags);
		}
		if (ret != 0) {
			close(fd);
			/* EINVAL with IFF_VNET_HDR: this kernel or this (persistent) device does
			 * not take the flag. */
			t->offload_failed = vnet && ret == -EINVAL;
			return iff_error(t, ret, err, errlen);
		}
		t->fds[q] = fd;
		t->nqueues = q + 1;
	}
	return 0;
}

/* Offload settings are per device, so queue 0 sets them for all. Without vnet_hdr we still
 * clear them: a persistent device may keep TSO from an earlier user, and GSO packets without
 * a header to describe them would reach us as unreadable 64 KiB blobs. */
static int setup_offload(struct tun *t, const struct tun_params *p, char *err, size_t errlen)
{
	unsigned long off = p->vnet_hdr ? p->offload : 0;
	int sz = TUN_VNET_HDR_LEN, ret;

	int le = 1;

	/* Little-endian header fields on every host (virtio 1.0); a no-op on x86. */
	if (p->vnet_hdr && ioctl(t->fds[0], TUNSETVNETLE, &le) != 0) {
		ret = -errno;
		t->offload_failed = true;
		return fail(err, errlen, ret, "%s: TUNSETVNETLE: %s", t->name, strerror(-ret));
	}
	if (p->vnet_hdr && ioctl(t->fds[0], TUNSETVNETHDRSZ, &sz) != 0) {
		ret = -errno;
		t->offload_failed = true;
		return fail(err, errlen, ret, "%s: TUNSETVNETHDRSZ %d: %s", t->name, sz,
			    strerror(-ret));
	}
	ret = ioctl(t->fds[0], TUNSETOFFLOAD, off) == 0 ? 0 : -errno;
	/* Kernels before 6.2 do not know UDP segmentation offload: go on without it. */
	if (ret == -EINVAL && (off & (TUN_F_USO4 | TUN_F_USO6))) {
		off &= ~(unsigned long)(TUN_F_USO4 | TUN_F_USO6);
		ret = ioctl(t->fds[0], TUNSETOFFLOAD, off) == 0 ? 0 : -errno;
	}
	if (ret != 0) {
		t->offload_failed = p->vnet_hdr;
		return fail(err, errlen, ret, "%s: TUNSETOFFLOAD 0x%lx: %s", t->name, off,
			    strerror(-ret));
	}
	t->vnet_hdr = p->vnet_hdr;
	t->offload = (uint32_t)off;
	return 0;
}

/* Append the kernel's extended-ack explanation, if it gave one. */
static const char *kmsg(const struct netlink *nl, char *buf, size_t len)
{
	if (nl->ext_msg[0])
		snprintf(buf, len, " (kernel: %s)", nl->ext_msg);
	else
		buf[0] = '\0';
	return buf;
}

static int add_addr(struct netlink *nl, const struct tun *t, const struct netaddr_cidr *c,
		    uint32_t flags, char *err, size_t errlen)
{
	char a[NETADDR_CIDR_STRLEN], k[NETLINK_EXT_MSG_MAX + 16];
	int ret = netlink_addr_add(nl, t->ifindex, c, flags);

	if (ret != 0)
		return fail(err, errlen, ret, "%s: adding address %s: %s%s", t->name,
			    netaddr_cidr_format(c, a, sizeof(a)), strerror(-ret),
			    kmsg(nl, k, sizeof(k)));
	return 0;
}

/* MTU and txqueuelen, link up, then the addresses: on a link that is already up the kernel
 * sets an address to work at once instead of at the up event (IPv6 still installs its local
 * route a moment later; tun_verify waits for that). */
static int configure(struct tun *t, const struct tun_params *p, char *err, size_t errlen)
{
	struct netlink nl;
	struct netlink_link_req lr = { p->mtu, p->txqueuelen, -1 };
	char k[NETLINK_EXT_MSG_MAX + 16];
	int ret;

	if ((ret = netlink_open(&nl)) != 0)
		return fail(err, errlen, ret, "%s: rtnetlink socket: %s", t->name, strerror(-ret));
	if ((lr.mtu || lr.txqlen) && (ret = netlink_link_set(&nl, t->ifindex, &lr)) != 0) {
		fail(err, errlen, ret, "%s: setting MTU %u / txqueuelen %u: %s%s", t->name, p->mtu,
		     p->txqueuelen, strerror(-ret), kmsg(&nl, k, sizeof(k)));
		goto out;
	}
	lr = (struct netlink_link_req){ 0, 0, 1 };
	if ((ret = netlink_link_set(&nl, t->ifindex, &lr)) != 0) {
		fail(err, errlen, ret, "%s: setting the link up: %s%s", t->name, strerror(-ret),
		     kmsg(&nl, k, sizeof(k)));
		goto out;
	}
	if (p->has_addr4 && (ret = add_addr(&nl, t, &p->addr4, 0, err, errlen)) != 0)
		goto out;
	/* NODAD: nothing else can own an address on our point-to-point TUN, and DAD would only
	 * delay the listeners' bind (EADDRNOTAVAIL while tentative). */
	if (p->has_addr6 && (ret = add_addr(&nl, t, &p->addr6, IFA_F_NODAD, err, errlen)) != 0)
		goto out;
out:
	netlink_close(&nl);
	return ret;
}

static int open_impl(const struct tun_params *p, struct tun **out, bool *offload_failed,
		     char *err, size_t errlen)
{
	uint32_t nq = p->queues ? p->queues : 1;
	struct tun *t;
	int ret;

	*out = NULL;
	if (err && errlen)
		err[0] = '\0';
	if ((ret = check_params(p, err, errlen)) != 0)
		return ret;
	t = calloc(1, sizeof(*t) + nq * sizeof(int));
	if (!t)
		return fail(err, errlen, -ENOMEM, "out of memory");
	memcpy(t->name, p->name, sizeof(p->name));
	t->has_addr4 = p->has_addr4;
	t->addr4 = p->addr4;
	t->has_addr6 = p->has_addr6;
	t->addr6 = p->addr6;
	if ((ret = open_queues(t, nq, p->vnet_hdr, err, errlen)) != 0)
		goto fail;
	if ((t->ifindex = (int)if_nametoindex(t->name)) == 0) {
		ret = -errno;
		fail(err, errlen, ret, "%s: no interface index: %s", t->name, strerror(-ret));
		goto fail;
	}
	if ((ret = setup_offload(t, p, err, errlen)) != 0 ||
	    (ret = configure(t, p, err, errlen)) != 0 ||
	    (ret = tun_verify(t, TUN_VERIFY_TRIES, TUN_VERIFY_INTERVAL_MS, err, errlen)) != 0)
		goto fail;
	*out = t;
	return 0;
fail:
	*offload_failed = t->offload_failed;
	tun_close(t);
	return ret;
}

int tun_open(const struct tun_params *p, struct tun **out, char *err, size_t errlen)
{
	bool offload_failed = false;
	return open_impl(p, out, &offload_failed, err, errlen);
}

/* Open with cfg->offload applied (see tun_open_config). */
static int open_offload(const struct ts_tun *cfg, struct tun **out, char *note, size_t notelen,
			char *err, size_t errlen)
{
	struct tun_params p;
	bool offload_failed = false;
	int ret;

	tun_params_from_config(&p, cfg);
	if (cfg->offload == TS_OFFLOAD_OFF)
		return tun_open(&p, out, err, errlen);
	p.vnet_hdr = true;
	p.offload = TUN_OFFLOAD_ALL;
	ret = open_impl(&p, out, &offload_failed, err, errlen);
	/* "auto" falls back only when an offload step was refused; any other failure (name
	 * taken, no permission, an address that never verified) is the answer as it is. */
	if (ret == 0 || cfg->offload == TS_OFFLOAD_ON || !offload_failed)
		return ret;
	if (note && notelen)
		snprintf(note, notelen, "offload refused (%s): using per-packet I/O", err);
	p.vnet_hdr = false;
	p.offload = 0;
	ret = tun_open(&p, out, err, errlen);
	if (ret != 0 && note && notelen)
		note[0] = '\0';
	return ret;
}

/* How many CPUs this process may run on (1 when that cannot be told). */
static int affinity_cpus(void)
{
	cpu_set_t set;

	return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

/* True if rx-0/rps_cpus of t holds a non-zero mask (false when unreadable). */
static bool rps_was_set(const struct tun *t)
{
	char path[128], text[CPU_SETSIZE / 4 + CPU_SETSIZE / 32 + 2] = { 0 };
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/sys/class/net/%s/queues/rx-0/rps_cpus", t->name);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return false;
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	for (ssize_t i = 0; i < n; i++)
		if (text[i] != '0' && text[i] != ',' && text[i] != '\n')
			return true;
	return false;
}

int tun_open_config(const struct ts_tun *cfg, struct tun **out, char *note, size_t notelen,
		    char *err, size_t errlen)
{
	char rerr[256];
	int ret;

	if (note && notelen)
		note[0] = '\0';
	if ((ret = open_offload(cfg, out, note, notelen, err, errlen)) != 0)
		return ret;
	/* "auto" with one queue and more than one CPU to steer to: steering starts off and the
	 * loop turns it on and off (core/rps_policy.h); clearing rps_cpus now proves it can. A
	 * persistent device someone set steering on is theirs: "auto" leaves it as "off" does. */
	bool aut = cfg->rps == TS_RPS_AUTO && (*out)->nqueues == 1 && affinity_cpus() > 1 &&
		   ((*out)->created || !rps_was_set(*out));
	if (cfg->rps == TS_RPS_OFF || (cfg->rps == TS_RPS_AUTO && !aut))
		return 0;
	if ((ret = tun_set_rps(*out, cfg->rps == TS_RPS_ON, rerr, sizeof(rerr))) == 0) {
		(*out)->rps_auto = aut;
		return 0;
	}
	if (cfg->rps == TS_RPS_ON) {
		snprintf(err, errlen, "%s", rerr);
		tun_close(*out);
		*out = NULL;
		return ret;
	}
	if (note && notelen) {
		size_t n = strlen(note);
		snprintf(note + n, notelen - n, "%s%s (receive packet steering left off)",
			 n ? "; " : "", rerr);
	}
	return 0;
}

/* The CPUs this process may run on, as the hex mask sysfs takes ("ff,ffffffff"). */
static int cpu_mask(char *buf, size_t len, int *ncpu)
{
	cpu_set_t set;
	int hi = -1, pos = 0;

	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return -errno;
	*ncpu = CPU_COUNT(&set);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set))
			hi = c;
	if (hi < 0)
		return -EINVAL;
	for (int w = hi / 32; w >= 0; w--) {
		uint32_t bits = 0;
		for (int b = 0; b < 32; b++)
			if (CPU_ISSET(w * 32 + b, &set))
				bits |= 1u << b;
		int n = snprintf(buf + pos, len - (size_t)pos, w == hi / 32 ? "%x" : ",%08x", bits);
		if (n < 0 || (size_t)n >= len - (size_t)pos)
			return -ENOSPC;
		pos += n;
	}
	return 0;
}

static void close_rps_fds(struct tun *t)
{
	for (uint32_t q = 0; t->rps_fds && q < t->nqueues; q++)
		close(t->rps_fds[q]);
	free(t->rps_fds);
	t->rps_fds = NULL;
}

/* Open rx-N/rps_cpus of every queue for writing, all or none. */
static int open_rps_fds(struct tun *t, char *err, size_t errlen)
{
	char path[128];
	int ret;

	if (!(t->rps_fds = calloc(t->nqueues ? t->nqueues : 1, sizeof(int))))
		return fail(err, errlen, -ENOMEM, "%s: rps: out of memory", t->name);
	for (uint32_t q = 0; q < t->nqueues; q++)
		t->rps_fds[q] = -1;
	for (uint32_t q = 0; q < t->nqueues; q++) {
		snprintf(path, sizeof(path), "/sys/class/net/%s/queues/rx-%u/rps_cpus", t->name, q);
		if ((t->rps_fds[q] = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
			ret = -errno;
			close_rps_fds(t);
			return fail(err, errlen, ret, "%s: rps: %s: %s", t->name, path,
				    strerror(-ret));
		}
	}
	return 0;
}

int tun_set_rps(struct tun *t, bool on, char *err, size_t errlen)
{
	char mask[CPU_SETSIZE / 4 + CPU_SETSIZE / 32 + 2];
	int ncpu, ret;

	if (!on)
		snprintf(mask, sizeof(mask), "0");
	else if ((ret = cpu_mask(mask, sizeof(mask), &ncpu)) != 0)
		return fail(err, errlen, ret, "%s: rps: CPU mask: %s", t->name, strerror(-ret));
	if (!t->rps_fds && (ret = open_rps_fds(t, err, errlen)) != 0)
		return ret;
	for (uint32_t q = 0; q < t->nqueues; q++) {
		/* sysfs takes the whole value in one write at offset 0. */
		if (pwrite(t->rps_fds[q], mask, strlen(mask), 0) < 0) {
			ret = -errno;
			return fail(err, errlen, ret, "%s: rps: /sys/class/net/%s/queues/rx-%u/"
				    "rps_cpus: %s", t->name, t->name, q, strerror(-ret));
		}
	}
	t->rps = on;
	return 0;
}

bool tun_rps(const struct tun *t)
{
	return t->rps;
}

bool tun_rps_auto(const struct tun *t)
{
	return t->rps_auto;
}

void tun_close(struct tun *t)
{
	if (!t)
		return;
	/* A persistent device outlives us: leave it without the steering "auto" turned on. */
	if (t->rps_auto && t->rps && !t->created && tun_set_rps(t, false, NULL, 0) != 0) {
		/* nothing more to do on the way out */
	}
	close_rps_fds(t);
	for (uint32_t q = 0; q < t->nqueues && !t->borrowed; q++)
		close(t->fds[q]);
	free(t);
}

int tun_adopt_fd(int fd, struct tun **out, char *err, size_t errlen)
{
	struct ifreq ifr;
	struct tun *t;
	int hdr = 0, fl;

	*out = NULL;
	memset(&ifr, 0, sizeof(ifr));
	if (ioctl(fd, TUNGETIFF, &ifr) != 0)
		return fail(err, errlen, -EBADF,
			    "fd %d is not a TUN device (TUNGETIFF: %s)", fd, strerror(errno));
	if ((ifr.ifr_flags & (IFF_TUN | IFF_TAP)) != IFF_TUN)
		return fail(err, errlen, -EINVAL, "%.*s: a TAP device, not a TUN", IFNAMSIZ,
			    ifr.ifr_name);
	if (!(ifr.ifr_flags & IFF_NO_PI))
		return fail(err, errlen, -EINVAL,
			    "%.*s: opened without IFF_NO_PI (packet information headers are not "
			    "supported)", IFNAMSIZ, ifr.ifr_name);
	if ((ifr.ifr_flags & IFF_VNET_HDR) && ioctl(fd, TUNGETVNETHDRSZ, &hdr) != 0)
		return fail(err, errlen, -errno, "%.*s: TUNGETVNETHDRSZ: %s", IFNAMSIZ,
			    ifr.ifr_name, strerror(errno));
	if ((ifr.ifr_flags & IFF_VNET_HDR) &&
	    (hdr < TUN_VNET_HDR_LEN || hdr > TUN_VNET_HDR_MAX))
		return fail(err, errlen, -EINVAL, "%.*s: virtio header of %d bytes (supported: "
			    "%d to %d)", IFNAMSIZ, ifr.ifr_name, hdr, TUN_VNET_HDR_LEN,
			    TUN_VNET_HDR_MAX);
	if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
		return fail(err, errlen, -errno, "%.*s: fcntl: %s", IFNAMSIZ, ifr.ifr_name,
			    strerror(errno));
	if (!(t = calloc(1, sizeof(*t) + sizeof(int))))
		return fail(err, errlen, -ENOMEM, "out of memory");
	memcpy(t->name, ifr.ifr_name, IFNAMSIZ);
	t->name[IFNAMSIZ - 1] = '\0';
	t->ifindex = (int)if_nametoindex(t->name); /* 0: the device is not in our namespace */
	t->borrowed = true;
	t->vnet_hdr = (ifr.ifr_flags & IFF_VNET_HDR) != 0;
	t->vnet_hdr_len = t->vnet_hdr ? (uint32_t)hdr : 0;
	t->multi_queue = (ifr.ifr_flags & IFF_MULTI_QUEUE) != 0;
	t->nqueues = 1;
	t->fds[0] = fd;
	*out = t;
	return 0;
}

int tun_get_mtu(const struct tun *t, uint32_t *mtu)
{
	struct ifreq ifr;
	int fd, ret = 0;

	memset(&ifr, 0, sizeof(ifr));
	memcpy(ifr.ifr_name, t->name, IFNAMSIZ);
	if ((fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
		return -errno;
	if (ioctl(fd, SIOCGIFMTU, &ifr) != 0)
		ret = -errno;
	else
		*mtu = (uint32_t)ifr.ifr_mtu;
	close(fd);
	return ret;
}

bool tun_borrowed(const struct tun *t)
{
	return t->borrowed;
}

bool tun_multi_queue(const struct tun *t)
{
	return t->multi_queue;
}

uint32_t tun_vnet_hdr_len(const struct tun *t)
{
	return t->vnet_hdr ? (t->vnet_hdr_len ? t->vnet_hdr_len : TUN_VNET_HDR_LEN) : 0;
}

int tun_fd(const struct tun *t, uint32_t q)
{
	assert(q < t->nqueues);
	return q < t->nqueues ? t->fds[q] : -1;
}

uint32_t tun_queues(const struct tun *t)
{
	return t->nqueues;
}

const char *tun_name(const struct tun *t)
{
	return t->name;
}

int tun_ifindex(const struct tun *t)
{
	return t->ifindex;
}

bool tun_created(const struct tun *t)
{
	return t->created;
}

bool tun_vnet_hdr(const struct tun *t)
{
	return t->vnet_hdr;
}

uint32_t tun_offload(const struct tun *t)
{
	return t->offload;
}

/* ---- verification against the real interface (tun.h) ---- */

struct addr_scan {
	const struct netaddr_cidr *want4, *want6;
	bool found4, found6;
	uint32_t flags6;
	char seen[200];  /* "a/p, b/q, ..." for the message */
	size_t seen_len;
};

static bool cidr_is(const struct netlink_addr *a, const struct netaddr_cidr *c)
{
	return c && netaddr_eq(&a->addr, &c->addr) && a->prefix == c->prefix;
}

static void on_addr(void *arg, const struct netlink_addr *a)
{
	struct addr_scan *s = arg;
	char buf[NETADDR_CIDR_STRLEN];
	struct netaddr_cidr c = { a->addr, a->prefix };
	int n;

	if (cidr_is(a, s->want4))
		s->found4 = true;
	if (cidr_is(a, s->want6)) {
		s->found6 = true;
		s->flags6 = a->flags;
	}
	if (s->seen_len + 1 >= sizeof(s->seen))
		return;
	n = snprintf(s->seen + s->seen_len, sizeof(s->seen) - s->seen_len, "%s%s",
		     s->seen_len ? ", " : "", netaddr_cidr_format(&c, buf, sizeof(buf)));
	if (n > 0)
		s->seen_len += (size_t)n;
	if (s->seen_len >= sizeof(s->seen))
		s->seen_len = sizeof(s->seen) - 1;
}

/* IPv6 installs an address's local route from a workqueue after the address is listed (even
 * with NODAD, which is never tentative): until then packets to it are dropped as address
 * errors. So "usable" means the kernel's own route lookup says local. (IPv4 adds the local
 * route synchronously with the address.) */
static int check_local6(struct netlink *nl, const char *ifname, const struct netaddr_cidr *want6,
			char *err, size_t errlen)
{
	struct netlink_route rt;
	char a[NETADDR_CIDR_STRLEN];
	int ret = netlink_route_get(nl, &want6->addr, &rt);

	if (ret != 0 && ret != -ENETUNREACH && ret != -EHOSTUNREACH && ret != -ENOENT)
		return fail(err, errlen, ret, "%s: route lookup for %s: %s", ifname,
			    netaddr_cidr_format(want6, a, sizeof(a)), strerror(-ret));
	if (ret != 0 || rt.type != RTN_LOCAL)
		return fail(err, errlen, -EADDRNOTAVAIL, "%s: IPv6 address %s is listed but not "
			    "yet a local address (no local route)", ifname,
			    netaddr_cidr_format(want6, a, sizeof(a)));
	return 0;
}

/* One look at the interface. -EADDRNOTAVAIL, -ENETDOWN and -EAGAIN may pass with time. */
static int verify_once(struct netlink *nl, int ifindex, const char *ifname,
		       const struct netaddr_cidr *want4, const struct netaddr_cidr *want6,
		       char *err, size_t errlen)
{
	struct addr_scan s = { .want4 = want4, .want6 = want6 };
	struct netlink_link link;
	char a[NETADDR_CIDR_STRLEN];
	int ret;

	if ((ret = netlink_link_get(nl, ifindex, &link)) != 0)
		return fail(err, errlen, ret, "%s: reading the link: %s", ifname, strerror(-ret));
	if (!(link.flags & IFF_UP))
		return fail(err, errlen, -ENETDOWN, "%s: the link is not up", ifname);
	if ((ret = netlink_addr_dump(nl, ifindex, on_addr, &s)) != 0)
		return fail(err, errlen, ret, "%s: reading the addresses: %s", ifname,
			    strerror(-ret));
	if (want4 && !s.found4)
		return fail(err, errlen, -EADDRNOTAVAIL, "%s: address %s is not on the interface "
			    "(it has: %s)", ifname, netaddr_cidr_format(want4, a, sizeof(a)),
			    s.seen_len ? s.seen : "none");
	if (want6 && !s.found6)
		return fail(err, errlen, -EADDRNOTAVAIL, "%s: address %s is not on the interface "
			    "(it has: %s)", ifname, netaddr_cidr_format(want6, a, sizeof(a)),
			    s.seen_len ? s.seen : "none");
	if (want6 && (s.flags6 & IFA_F_DADFAILED))
		return fail(err, errlen, -EADDRINUSE, "%s: IPv6 address %s failed duplicate "
			    "address detection", ifname, netaddr_cidr_format(want6, a, sizeof(a)));
	if (want6 && (s.flags6 & IFA_F_TENTATIVE))
		return fail(err, errlen, -EADDRNOTAVAIL, "%s: IPv6 address %s is still tentative "
			    "(duplicate address detection not finished)", ifname,
			    netaddr_cidr_format(want6, a, sizeof(a)));
	if (want6)
		return check_local6(nl, ifname, want6, err, errlen);
	return 0;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

int tun_verify_addrs(int ifindex, const char *ifname, const struct netaddr_cidr *want4,
		     const struct netaddr_cidr *want6, unsigned tries, unsigned interval_ms,
		     char *err, size_t errlen)
{
	struct netlink nl;
	int ret;

	if (tries == 0)
		tries = 1;
	if ((ret = netlink_open(&nl)) != 0)
		return fail(err, errlen, ret, "%s: rtnetlink socket: %s", ifname, strerror(-ret));
	for (unsigned i = 0; i < tries; i++) {
		if (i > 0)
			sleep_ms(interval_ms);
		ret = verify_once(&nl, ifindex, ifname, want4, want6, err, errlen);
		if (ret != -EADDRNOTAVAIL && ret != -ENETDOWN && ret != -EAGAIN)
			break;
	}
	netlink_close(&nl);
	if ((ret == -EADDRNOTAVAIL || ret == -ENETDOWN || ret == -EAGAIN) && err && errlen) {
		size_t n = strnlen(err, errlen);
		snprintf(err + n, errlen - n, " after %u tries %u ms apart", tries, interval_ms);
	}
	return ret;
}

int tun_verify(const struct tun *t, unsigned tries, unsigned interval_ms, char *err,
	       size_t errlen)
{
	return tun_verify_addrs(t->ifindex, t->name, t->has_addr4 ? &t->addr4 : NULL,
				t->has_addr6 ? &t->addr6 : NULL, tries, interval_ms, err, errlen);
}

/* ---- /proc and /sys ---- */

/* A decimal number followed by at most a newline. */
static int read_u64(const char *path, uint64_t *out)
{
	char buf[32], *end;
	unsigned long long v;
	int ret;

	if ((ret = sysfile_read_text(path, buf, sizeof(buf))) != 0)
		return ret;
	if (buf[0] < '0' || buf[0] > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(buf, &end, 10);
	if (errno != 0 || (*end != '\0' && strcmp(end, "\n") != 0))
		return -EINVAL;
	*out = v;
	return 0;
}

int tun_rp_filter_eval(int all, int dev, const char *ifname, char *msg, size_t len)
{
	int eff = all > dev ? all : dev;

	if (eff != 1) {
		if (msg && len)
			msg[0] = '\0';
		return 0;
	}
	if (msg && len)
		snprintf(msg, len, "tun: %s: strict reverse-path filtering (rp_filter: all=%d, "
			 "%s=%d; the kernel uses the larger): packets written back into the TUN "
			 "may be dropped silently; use loose mode with 'sysctl -w "
			 "net/ipv4/conf/all/rp_filter=2', or turn it off by setting both "
			 "net/ipv4/conf/all/rp_filter and net/ipv4/conf/%s/rp_filter to 0",
			 ifname, all, ifname, dev, ifname);
	return 1;
}

int tun_rp_filter_check(const char *ifname, char *msg, size_t len)
{
	char path[96];
	uint64_t all, dev;
	int ret;

	if (!valid_ifname(ifname))
		return fail(msg, len, -EINVAL, "rp_filter: invalid interface name");
	snprintf(path, sizeof(path), "/proc/sys/net/ipv4/conf/all/rp_filter");
	if ((ret = read_u64(path, &all)) != 0)
		return fail(msg, len, ret, "rp_filter: cannot read %s: %s", path, strerror(-ret));
	snprintf(path, sizeof(path), "/proc/sys/net/ipv4/conf/%s/rp_filter", ifname);
	if ((ret = read_u64(path, &dev)) != 0)
		return fail(msg, len, ret, "rp_filter: cannot read %s: %s", path, strerror(-ret));
	return tun_rp_filter_eval(all > 2 ? 2 : (int)all, dev > 2 ? 2 : (int)dev, ifname, msg,
				  len);
}

int tun_dev_stats(const char *ifname, struct tun_dev_stats *out)
{
	static const char *const names[] = { "rx_packets", "tx_packets", "rx_dropped",
					     "tx_dropped" };
	uint64_t *const fields[] = { &out->rx_packets, &out->tx_packets, &out->rx_dropped,
				     &out->tx_dropped };
	char path[96];
	int ret;

	if (!valid_ifname(ifname))
		return -EINVAL;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(path, sizeof(path), "/sys/class/net/%s/statistics/%s", ifname, names[i]);
		if ((ret = read_u64(path, fields[i])) != 0)
			return ret;
	}
	return 0;
}

int tun_available(char *err, size_t errlen)
{
	int fd = open(TUN_DEV_PATH, O_RDWR | O_CLOEXEC), ret;

	if (fd < 0) {
		ret = -errno;
		return fail(err, errlen, ret, "no TUN support: cannot open %s: %s%s", TUN_DEV_PATH,
			    strerror(-ret), open_hint(-ret));
	}
	close(fd);
	if (err && errlen)
		err[0] = '\0';
	return 0;
}
