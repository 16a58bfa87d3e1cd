/* fastpath.c — loads fastpath.bpf.c (built into the binary as an object image), attaches it to
 * the TUN's egress and its reply program to the uplinks' ingress, and keeps its maps
 * (fastpath.h). */
#include "stacks/system/fastpath.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "stacks/system/fastpath_abi.h"

/* Our filter on the clsact egress hook (the TUN) and ingress hook (the uplinks): priority 1,
 * handle "ts". */
#define FASTPATH_TC_PRIORITY 1
#define FASTPATH_TC_HANDLE 0x7473

/* The compiled program (generated at build time from fastpath.bpf.c). */
extern const unsigned char ts_fastpath_obj[];
extern const unsigned long ts_fastpath_obj_len;

/* The tcx hooks (Linux 6.6), by number: the system's kernel headers may predate them. */
#define TS_BPF_TCX_INGRESS 46

/* An uplink the reply program is attached to: a tcx link, which goes when its fd closes (at
 * fastpath_free, or with the process, however it ends). */
struct uplink {
	int ifindex;
	int link_fd;
};

struct fastpath {
	struct bpf_object *obj;
	int flows_fd, counts_fd, udp_out_fd, udp_in_fd;
	int ncpu;
	bool hook_created;  /* the clsact qdisc is ours: remove it on free */
	bool attached;
	bool udp;           /* room for UDP flows was asked */
	int prog_fd, uplink_fd;
	_Atomic uint64_t conns, udp_flows;
	struct bpf_tc_hook hook;
	struct bpf_tc_opts opts;
	struct uplink uplinks[FASTPATH_MAX_UPLINKS];
	int nuplinks;
	bool no_tcx;        /* the kernel refused a tcx link: no uplink will take one */
	char udp_off[160];  /* why room for UDP flows was asked and the kernel refused it */
	/* The counters' read: a buffer for one value per CPU, made with the rest, so that a read
	 * needs no memory; each slot's last sums, what a read that fails reports (a counter
	 * never goes back). */
	struct fastpath_counts *per;
	struct fastpath_totals last[FASTPATH_COUNT_SLOTS];
};

/* libbpf reports through one process-wide callback. While we load, it is ours: its first
 * warning (why the kernel refused) goes into the message of a load that failed; the embedding
 * application's callback is put back after. */
static _Thread_local char last_said[160];
/* Two proxies starting at once would each save the other's callback as the one to put back:
 * the swaps and what happens between them are serialised. */
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

static libbpf_print_fn_t print_begin(libbpf_print_fn_t fn)
{
	pthread_mutex_lock(&print_lock);
	last_said[0] = '\0';
	return libbpf_set_print(fn);
}

static void print_end(libbpf_print_fn_t prev)
{
	libbpf_set_print(prev);
	pthread_mutex_unlock(&print_lock);
}

static int remember(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	char line[sizeof(last_said)];
	size_t n;

	if (level == LIBBPF_DEBUG)
		return 0;
	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == ' '))
		line[--n] = '\0';
	/* The first warning says why (the ones after it, that the load failed). */
	if (n && !last_said[0])
		memcpy(last_said, line, n + 1);
	return 0;
}

static void load_failed(char *err, size_t errlen, const char *what, int ret)
{
	/* Refused for want of privilege, libbpf's first words are about RLIMIT_MEMLOCK, which
	 * kernels since 5.11 no longer apply to BPF: say what is missing instead. */
	const char *why = last_said;

	if (ret == -EPERM && strcmp(what, "load") == 0)
		why = "a tc program needs CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN";
	else if (ret == -EPERM && strcmp(what, "open") != 0)
		why = "needs CAP_NET_ADMIN";

	snprintf(err, errlen, "%s: %s%s%s%s", what, strerror(-ret), why[0] ? " (" : "", why,
		 why[0] ? ")" : "");
}

static void key_of(struct fastpath_key *k, uint8_t family, const uint8_t *src, uint16_t sport_be,
		   const uint8_t *dst, uint16_t dport_be)
{
	size_t alen = family == 4 ? 4 : 16;

	memset(k, 0, sizeof(*k));
	k->family = family;
	k->sport_be = sport_be;
	k->dport_be = dport_be;
	memcpy(k->src, src, alen);
	memcpy(k->dst, dst, alen);
}

/* Open the program image and load it into fp: the egress program with UDP flows (max_udp >
 * 0) or the TCP-only one. 0, or -errno with err. */
static int load(struct fastpath *fp, uint32_t max_conns, uint32_t max_udp, char *err,
		size_t errlen)
{
	struct bpf_program *prog, *tcp, *uplink;
	struct bpf_map *flows, *udp_out, *udp_in;
	int ret;

	fp->udp = max_udp > 0;
	LIBBPF_OPTS(bpf_object_open_opts, oo, .object_name = "ts_fastpath");
	fp->obj = bpf_object__open_mem(ts_fastpath_obj, ts_fastpath_obj_len, &oo);
	if (!fp->obj) {
		ret = -errno;
		load_failed(err, errlen, "open", ret);
		return ret;
	}
	prog = bpf_object__find_program_by_name(fp->obj, "fastpath_egress");
	tcp = bpf_object__find_program_by_name(fp->obj, "fastpath_egress_tcp");
	uplink = bpf_object__find_program_by_name(fp->obj, "fastpath_uplink");
	flows = bpf_object__find_map_by_name(fp->obj, "flows");
	udp_out = bpf_object__find_map_by_name(fp->obj, "udp_out");
	udp_in = bpf_object__find_map_by_name(fp->obj, "udp_in");
	if (!prog || !tcp || !uplink || !flows || !udp_out || !udp_in) {
		snprintf(err, errlen, "program image incomplete");
		return -EINVAL;
	}
	/* Without UDP the maps keep one entry each (the egress program names them) and neither
	 * the UDP egress program nor the reply program is loaded. */
	if ((ret = bpf_map__set_max_entries(flows, 2 * max_conns)) != 0 ||
	    (ret = bpf_map__set_max_entries(udp_out, fp->udp ? max_udp : 1)) != 0 ||
	    (ret = bpf_map__set_max_entries(udp_in, fp->udp ? max_udp : 1)) != 0 ||
	    (ret = bpf_program__set_autoload(prog, fp->udp)) != 0 ||
	    (ret = bpf_program__set_autoload(tcp, !fp->udp)) != 0 ||
	    (ret = bpf_program__set_autoload(uplink, fp->udp)) != 0) {
		snprintf(err, errlen, "map size: %s", strerror(-ret));
		return ret;
	}
	if ((ret = bpf_object__load(fp->obj)) != 0) {
		load_failed(err, errlen, "load", ret);
		return ret;
	}
	fp->prog_fd = bpf_program__fd(fp->udp ? prog : tcp);
	fp->uplink_fd = fp->udp ? bpf_program__fd(uplink) : -1;
	fp->flows_fd = bpf_map__fd(flows);
	fp->udp_out_fd = bpf_map__fd(udp_out);
	fp->udp_in_fd = bpf_map__fd(udp_in);
	fp->counts_fd = bpf_object__find_map_fd_by_name(fp->obj, "counts");
	fp->ncpu = libbpf_num_possible_cpus();
	if (fp->prog_fd < 0 || (fp->udp && fp->uplink_fd < 0) || fp->flows_fd < 0 ||
	    fp->udp_out_fd < 0 || fp->udp_in_fd < 0 || fp->counts_fd < 0 || fp->ncpu <= 0) {
		snprintf(err, errlen, "program image incomplete");
		return -EINVAL;
	}
	if (!(fp->per = calloc((size_t)fp->ncpu, sizeof(*fp->per)))) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

int fastpath_open(uint32_t max_conns, uint32_t max_udp, struct fastpath **out, char *err,
		  size_t errlen)
{
	struct fastpath *fp = calloc(1, sizeof(*fp));
	libbpf_print_fn_t prev_print = NULL;
	bool printing = false;
	int ret;

	*out = NULL;
	if (!fp)
		return -ENOMEM;
	fp->flows_fd = fp->counts_fd = fp->udp_out_fd = fp->udp_in_fd = -1;
	fp->prog_fd = fp->uplink_fd = -1;
	if (max_conns < 1 || max_conns > FASTPATH_MAX_CONNS) {
		ret = -EINVAL;
		snprintf(err, errlen, "room for %u connections asked, 1-%u possible", max_conns,
			 FASTPATH_MAX_CONNS);
		goto fail;
	}
	if (max_udp > FASTPATH_MAX_UDP_FLOWS) {
		ret = -EINVAL;
		snprintf(err, errlen, "room for %u UDP flows asked, 0-%u possible", max_udp,
			 FASTPATH_MAX_UDP_FLOWS);
		goto fail;
	}
	prev_print = print_begin(remember);
	printing = true;
	ret = load(fp, max_conns, max_udp, err, errlen);
	/* A kernel that refuses what the UDP flows need (bpf_check_mtu: Linux 5.12) still takes
	 * the TCP-only program; refused for want of privilege, it would refuse that too. */
	if (ret != 0 && max_udp > 0 && ret != -EPERM) {
		snprintf(fp->udp_off, sizeof(fp->udp_off), "%s", err);
		bpf_object__close(fp->obj);
		fp->obj = NULL;
		fp->flows_fd = fp->counts_fd = fp->udp_out_fd = fp->udp_in_fd = -1;
		fp->prog_fd = fp->uplink_fd = -1;
		last_said[0] = '\0';
		ret = load(fp, max_conns, 0, err, errlen);
	}
	if (ret != 0)
		goto fail;
	print_end(prev_print);
	*out = fp;
	return 0;
fail:
	if (printing)
		print_end(prev_print);
	fastpath_free(fp);
	return ret;
}

const char *fastpath_udp_off(const struct fastpath *fp)
{
	return fp->udp_off[0] ? fp->udp_off : NULL;
}

int fastpath_attach(struct fastpath *fp, int ifindex, char *err, size_t errlen)
{
	libbpf_print_fn_t prev;
	int ret;

	if (fp->attached)
		return -EALREADY;
	prev = print_begin(remember);
	fp->hook = (struct bpf_tc_hook){ .sz = sizeof(fp->hook), .ifindex = ifindex,
					 .attach_point = BPF_TC_EGRESS };
	ret = bpf_tc_hook_create(&fp->hook);
	if (ret != 0 && ret != -EEXIST) {
		load_failed(err, errlen, "clsact qdisc", ret);
		goto out;
	}
	fp->hook_created = ret == 0;
	fp->opts = (struct bpf_tc_opts){ .sz = sizeof(fp->opts), .handle = FASTPATH_TC_HANDLE,
					 .priority = FASTPATH_TC_PRIORITY, .prog_fd = fp->prog_fd,
					 .flags = BPF_TC_F_REPLACE };
	if ((ret = bpf_tc_attach(&fp->hook, &fp->opts)) != 0) {
		load_failed(err, errlen, "tc filter", ret);
		if (fp->hook_created) {
			fp->hook.attach_point = BPF_TC_INGRESS | BPF_TC_EGRESS;
			(void)bpf_tc_hook_destroy(&fp->hook);
			fp->hook_created = false;
		}
		goto out;
	}
	fp->attached = true;
out:
	print_end(prev);
	return ret;
}

void fastpath_clear(int ifindex)
{
	struct bpf_tc_hook hook = { .sz = sizeof(hook), .ifindex = ifindex,
				    .attach_point = BPF_TC_EGRESS };
	struct bpf_tc_opts o = { .sz = sizeof(o), .handle = FASTPATH_TC_HANDLE,
				 .priority = FASTPATH_TC_PRIORITY };
	libbpf_print_fn_t prev = print_begin(NULL); /* "not found" is the usual answer */

	(void)bpf_tc_detach(&hook, &o);
	print_end(prev);
}

int fastpath_prog_fd(const struct fastpath *fp)
{
	return fp->prog_fd;
}

uint64_t fastpath_conns(const struct fastpath *fp)
{
	return atomic_load_explicit(&fp->conns, memory_order_relaxed);
}

void fastpath_free(struct fastpath *fp)
{
	libbpf_print_fn_t prev;

	if (!fp)
		return;
	prev = print_begin(NULL); /* the device may be gone already: nothing to say */
	for (int i = 0; i < fp->nuplinks; i++)
		close(fp->uplinks[i].link_fd);
	if (fp->attached) {
		struct bpf_tc_opts o = { .sz = sizeof(o), .handle = FASTPATH_TC_HANDLE,
					 .priority = FASTPATH_TC_PRIORITY };
		(void)bpf_tc_detach(&fp->hook, &o);
	}
	if (fp->hook_created) {
		fp->hook.attach_point = BPF_TC_INGRESS | BPF_TC_EGRESS;
		(void)bpf_tc_hook_destroy(&fp->hook);
	}
	bpf_object__close(fp->obj);
	print_end(prev);
	free(fp->per);
	free(fp);
}

/* Both entries in (flags: BPF_ANY or BPF_NOEXIST), or neither: a refused second one takes
 * the first out again. 0 or -errno. */
static int put_pair(int fd_a, const void *ka, const void *va, int fd_b, const void *kb,
		    const void *vb, uint64_t flags)
{
	int ret;

	if (bpf_map_update_elem(fd_a, ka, va, flags) != 0)
		return -errno;
	if (bpf_map_update_elem(fd_b, kb, vb, flags) != 0) {
		ret = -errno;
		(void)bpf_map_delete_elem(fd_a, ka);
		return ret;
	}
	return 0;
}

int fastpath_add(struct fastpath *fp, const struct flow_key *app, const uint8_t *nat_addr,
		 uint16_t nat_port_be, const uint8_t *gw, uint16_t lport_be)
{
	struct fastpath_key up, up_to, down, down_to;
	int ret;

	key_of(&up, app->family, app->src, app->sport_be, app->dst, app->dport_be);
	key_of(&up_to, app->family, nat_addr, nat_port_be, gw, lport_be);
	key_of(&down, app->family, gw, lport_be, nat_addr, nat_port_be);
	key_of(&down_to, app->family, app->dst, app->dport_be, app->src, app->sport_be);
	ret = put_pair(fp->flows_fd, &up, &up_to, fp->flows_fd, &down, &down_to, BPF_ANY);
	if (ret == 0)
		atomic_fetch_add_explicit(&fp->conns, 1, memory_order_relaxed);
	return ret;
}

void fastpath_del(struct fastpath *fp, const struct flow_key *app, const uint8_t *nat_addr,
		  uint16_t nat_port_be, const uint8_t *gw, uint16_t lport_be)
{
	struct fastpath_key up, down;

	key_of(&up, app->family, app->src, app->sport_be, app->dst, app->dport_be);
	key_of(&down, app->family, gw, lport_be, nat_addr, nat_port_be);
	int gone = bpf_map_delete_elem(fp->flows_fd, &up);

	(void)bpf_map_delete_elem(fp->flows_fd, &down);
	if (gone == 0) /* what fastpath_add counted */
		atomic_fetch_sub_explicit(&fp->conns, 1, memory_order_relaxed);
}

/* Counter slot `slot` summed over CPUs (zeros when it cannot be read). */
static void sum_slot(struct fastpath *fp, uint32_t slot, struct fastpath_totals *out)
{
	struct fastpath_totals *last = &fp->last[slot];

	if (bpf_map_lookup_elem(fp->counts_fd, &slot, fp->per) == 0) {
		memset(last, 0, sizeof(*last));
		for (int i = 0; i < fp->ncpu; i++) {
			last->packets += fp->per[i].packets;
			last->segments += fp->per[i].segments;
			last->bytes += fp->per[i].bytes;
			last->failed += fp->per[i].failed;
		}
	}
	*out = *last;
}

void fastpath_totals(struct fastpath *fp, struct fastpath_totals *out)
{
	sum_slot(fp, FASTPATH_COUNT_TCP, out);
}

/* ---- UDP flows ---- */

/* Is device ifindex an Ethernet device (ARPHRD_ETHER)? 0 (yes), -EOPNOTSUPP (no), or -errno
 * (no such device). Asked of the kernel through a socket of our network namespace, as the
 * program's filter will be. */
static int ethernet(int ifindex)
{
	struct ifreq ifr;
	int s, ret = 0;

	memset(&ifr, 0, sizeof(ifr));
	if (!if_indextoname((unsigned)ifindex, ifr.ifr_name))
		return -errno;
	s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (ioctl(s, SIOCGIFHWADDR, &ifr) != 0)
		ret = -errno;
	else if (ifr.ifr_hwaddr.sa_family != ARPHRD_ETHER)
		ret = -EOPNOTSUPP;
	close(s);
	return ret;
}

int fastpath_udp_uplink(struct fastpath *fp, int ifindex, char *err, size_t errlen)
{
	struct uplink *u;
	int ret, fd;

	if (!fp->udp) {
		snprintf(err, errlen, "uplink: no room for UDP flows was asked");
		return -EINVAL;
	}
	if (fp->no_tcx) {
		snprintf(err, errlen, "uplink: the kernel has no tcx (Linux 6.6 or later)");
		return -EOPNOTSUPP;
	}
	for (int i = 0; i < fp->nuplinks; i++)
		if (fp->uplinks[i].ifindex == ifindex)
			return 0;
	/* Devices that have gone (a USB or tethered uplink unplugged: it comes back with
	 * another index) give their slots back; their links went with them. */
	for (int i = 0; i < fp->nuplinks; i++) {
		char name[IF_NAMESIZE];

		if (!if_indextoname((unsigned)fp->uplinks[i].ifindex, name) && errno == ENXIO) {
			close(fp->uplinks[i].link_fd);
			fp->uplinks[i--] = fp->uplinks[--fp->nuplinks];
		}
	}
	if (fp->nuplinks == FASTPATH_MAX_UPLINKS) {
		snprintf(err, errlen, "uplink: %d devices already", FASTPATH_MAX_UPLINKS);
		return -ENOSPC;
	}
	if ((ret = ethernet(ifindex)) != 0) {
		snprintf(err, errlen, "uplink: %s", ret == -EOPNOTSUPP ? "not an Ethernet device"
									: strerror(-ret));
		return ret;
	}
	/* A tcx link: after whatever runs there already, beside any qdisc and filter, and gone
	 * with the process. A kernel without tcx (before 6.6) refuses the attach type. */
	fd = bpf_link_create(fp->uplink_fd, ifindex, (enum bpf_attach_type)TS_BPF_TCX_INGRESS,
			     NULL);
	if (fd < 0) {
		ret = fd;
		if (ret == -EINVAL || ret == -EOPNOTSUPP) {
			fp->no_tcx = true;
			snprintf(err, errlen, "uplink: the kernel has no tcx (Linux 6.6 or later): %s",
				 strerror(-ret));
		}
		else
			snprintf(err, errlen, "uplink: tcx link: %s%s", strerror(-ret),
				 ret == -EPERM ? " (needs CAP_BPF and CAP_NET_ADMIN)" : "");
		return ret == -EINVAL ? -EOPNOTSUPP : ret;
	}
	u = &fp->uplinks[fp->nuplinks++];
	u->ifindex = ifindex;
	u->link_fd = fd;
	return 0;
}

/* The keys of a flow's two directions: its datagrams out as the TUN sees them, its replies as
 * they arrive on the uplink. */
static void udp_keys(const struct fastpath_udp *f, struct fastpath_key *out,
		     struct fastpath_key *in)
{
	const struct flow_key *a = &f->app;

	key_of(out, a->family, a->src, a->sport_be, a->dst, a->dport_be);
	key_of(in, a->family, a->dst, a->dport_be, f->local, f->lport_be);
}

int fastpath_udp_add(struct fastpath *fp, const struct fastpath_udp *f)
{
	const struct flow_key *a = &f->app;
	struct fastpath_key kout, kin;
	struct fastpath_udp_out vout;
	struct fastpath_udp_in vin;
	struct timespec now;
	int ret;

	if (!fp->udp || (a->family != 4 && a->family != 6) || f->uplink <= 0 || f->tun <= 0)
		return -EINVAL;
	udp_keys(f, &kout, &kin);
	memset(&vout, 0, sizeof(vout));
	key_of(&vout.to, a->family, f->local, f->lport_be, a->dst, a->dport_be);
	memcpy(vout.nexthop, f->nexthop, a->family == 4 ? 4 : 16);
	vout.ifindex = (uint32_t)f->uplink;
	vout.mark = f->mark;
	vout.flags = (f->quic_handshakes ? FASTPATH_UDP_PASS_QUIC_LONG : 0) |
		     (f->sock_bound_dev ? 0 : FASTPATH_UDP_CHECK_SOCK);
	clock_gettime(CLOCK_MONOTONIC, &now);
	vout.seen_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
	memset(&vin, 0, sizeof(vin));
	key_of(&vin.to, a->family, a->dst, a->dport_be, a->src, a->sport_be);
	vin.ifindex = (uint32_t)f->tun;
	vin.seen_ns = vout.seen_ns;
	/* Neither may be there: a flow is added once, and a reply key taken means another flow
	 * holds the socket's port for that remote (the rollback then takes out only what this
	 * add put in). */
	ret = put_pair(fp->udp_out_fd, &kout, &vout, fp->udp_in_fd, &kin, &vin, BPF_NOEXIST);
	if (ret == 0)
		atomic_fetch_add_explicit(&fp->udp_flows, 1, memory_order_relaxed);
	return ret;
}

void fastpath_udp_del(struct fastpath *fp, const struct fastpath_udp *f)
{
	struct fastpath_key kout, kin;

	if (!fp->udp)
		return;
	udp_keys(f, &kout, &kin);
	int gone = bpf_map_delete_elem(fp->udp_out_fd, &kout);

	(void)bpf_map_delete_elem(fp->udp_in_fd, &kin);
	if (gone == 0) /* what fastpath_udp_add counted */
		atomic_fetch_sub_explicit(&fp->udp_flows, 1, memory_order_relaxed);
}

int64_t fastpath_udp_seen(struct fastpath *fp, const struct fastpath_udp *f)
{
	struct fastpath_key kout, kin;
	struct fastpath_udp_out vo;
	struct fastpath_udp_in vi;

	if (!fp->udp)
		return -ENOENT;
	udp_keys(f, &kout, &kin);
	if (bpf_map_lookup_elem(fp->udp_out_fd, &kout, &vo) != 0)
		return -errno;
	if (bpf_map_lookup_elem(fp->udp_in_fd, &kin, &vi) == 0 && vi.seen_ns > vo.seen_ns)
		return (int64_t)vi.seen_ns;
	return (int64_t)vo.seen_ns;
}

int fastpath_udp_uplinks(const struct fastpath *fp)
{
	return fp->nuplinks;
}

uint64_t fastpath_udp_flows(const struct fastpath *fp)
{
	return atomic_load_explicit(&fp->udp_flows, memory_order_relaxed);
}

void fastpath_udp_totals(struct fastpath *fp, struct fastpath_totals *out,
			 struct fastpath_totals *in)
{
	sum_slot(fp, FASTPATH_COUNT_UDP_OUT, out);
	sum_slot(fp, FASTPATH_COUNT_UDP_IN, in);
}
