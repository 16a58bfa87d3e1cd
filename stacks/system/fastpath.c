/* fastpath.c — loads fastpath.bpf.c (built into the binary as an object image), attaches it to
 * the TUN's egress and keeps its flows map (fastpath.h). */
#include "stacks/system/fastpath.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stacks/system/fastpath_abi.h"

/* Our filter on the clsact egress hook: priority 1, handle "ts". */
#define FASTPATH_TC_PRIORITY 1
#define FASTPATH_TC_HANDLE 0x7473

/* The compiled program (generated at build time from fastpath.bpf.c). */
extern const unsigned char ts_fastpath_obj[];
extern const unsigned long ts_fastpath_obj_len;

struct fastpath {
	struct bpf_object *obj;
	int flows_fd, counts_fd;
	int ncpu;
	bool hook_created;  /* the clsact qdisc is ours: remove it on free */
	bool attached;
	int prog_fd;
	_Atomic uint64_t conns;
	struct bpf_tc_hook hook;
	struct bpf_tc_opts opts;
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

int fastpath_open(uint32_t max_conns, struct fastpath **out, char *err, size_t errlen)
{
	struct fastpath *fp = calloc(1, sizeof(*fp));
	struct bpf_program *prog;
	struct bpf_map *flows;
	libbpf_print_fn_t prev_print = NULL;
	bool printing = false;
	int ret;

	*out = NULL;
	if (!fp)
		return -ENOMEM;
	fp->flows_fd = fp->counts_fd = fp->prog_fd = -1;
	if (max_conns < 1 || max_conns > FASTPATH_MAX_CONNS) {
		ret = -EINVAL;
		snprintf(err, errlen, "room for %u connections asked, 1-%u possible", max_conns,
			 FASTPATH_MAX_CONNS);
		goto fail;
	}
	prev_print = print_begin(remember);
	printing = true;
	LIBBPF_OPTS(bpf_object_open_opts, oo, .object_name = "ts_fastpath");
	fp->obj = bpf_object__open_mem(ts_fastpath_obj, ts_fastpath_obj_len, &oo);
	if (!fp->obj) {
		ret = -errno;
		load_failed(err, errlen, "open", ret);
		goto fail;
	}
	prog = bpf_object__find_program_by_name(fp->obj, "fastpath_egress");
	flows = bpf_object__find_map_by_name(fp->obj, "flows");
	if (!prog || !flows) {
		ret = -EINVAL;
		snprintf(err, errlen, "program image incomplete");
		goto fail;
	}
	if ((ret = bpf_map__set_max_entries(flows, 2 * max_conns)) != 0) {
		snprintf(err, errlen, "map size: %s", strerror(-ret));
		goto fail;
	}
	if ((ret = bpf_object__load(fp->obj)) != 0) {
		load_failed(err, errlen, "load", ret);
		goto fail;
	}
	fp->prog_fd = bpf_program__fd(prog);
	fp->flows_fd = bpf_map__fd(flows);
	fp->counts_fd = bpf_object__find_map_fd_by_name(fp->obj, "counts");
	fp->ncpu = libbpf_num_possible_cpus();
	if (fp->prog_fd < 0 || fp->flows_fd < 0 || fp->counts_fd < 0 || fp->ncpu <= 0) {
		ret = -EINVAL;
		snprintf(err, errlen, "program image incomplete");
		goto fail;
	}
	print_end(prev_print);
	*out = fp;
	return 0;
fail:
	if (printing)
		print_end(prev_print);
	fastpath_free(fp);
	return ret;
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
	free(fp);
}

int fastpath_add(struct fastpath *fp, const struct flow_key *app, const uint8_t *nat_addr,
		 uint16_t nat_port_be, const uint8_t *gw, uint16_t lport_be)
{
	struct fastpath_key up, up_to, down, down_to;

	key_of(&up, app->family, app->src, app->sport_be, app->dst, app->dport_be);
	key_of(&up_to, app->family, nat_addr, nat_port_be, gw, lport_be);
	key_of(&down, app->family, gw, lport_be, nat_addr, nat_port_be);
	key_of(&down_to, app->family, app->dst, app->dport_be, app->src, app->sport_be);
	if (bpf_map_update_elem(fp->flows_fd, &up, &up_to, BPF_ANY) != 0)
		return -errno;
	if (bpf_map_update_elem(fp->flows_fd, &down, &down_to, BPF_ANY) != 0) {
		int ret = -errno;
		(void)bpf_map_delete_elem(fp->flows_fd, &up);
		return ret;
	}
	atomic_fetch_add_explicit(&fp->conns, 1, memory_order_relaxed);
	return 0;
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

void fastpath_totals(struct fastpath *fp, struct fastpath_totals *out)
{
	struct fastpath_counts *per = calloc((size_t)fp->ncpu, sizeof(*per));
	uint32_t zero = 0;

	memset(out, 0, sizeof(*out));
	if (!per || bpf_map_lookup_elem(fp->counts_fd, &zero, per) != 0) {
		free(per);
		return;
	}
	for (int i = 0; i < fp->ncpu; i++) {
		out->packets += per[i].packets;
		out->segments += per[i].segments;
		out->bytes += per[i].bytes;
		out->failed += per[i].failed;
	}
	free(per);
}
