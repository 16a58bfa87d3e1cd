/* oldkernel.c — an LD_PRELOAD library that makes this kernel refuse, to the process it is
 * loaded into, what older kernels lack, so that the integration suite can run the program's
 * fallbacks for them here. TS_OLDKERNEL names what is refused (comma-separated):
 *
 *   tcx        bpf(BPF_LINK_CREATE) of a tcx attach type (Linux 6.6) fails with EINVAL, as
 *              a kernel that does not know the attach type answers;
 *   check_mtu  bpf(BPF_PROG_LOAD) of a program that calls bpf_check_mtu (Linux 5.12) fails
 *              with EINVAL, as the verifier of a kernel without the helper answers.
 *
 * libbpf makes every bpf() call through libc's syscall(), which this library replaces for the
 * whole process; everything it does not refuse goes on to libc's. Test code only: never built
 * into the program. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/bpf.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The tcx attach types and the helper, by number: the system's headers may predate them. */
#define OK_BPF_TCX_INGRESS 46
#define OK_BPF_TCX_EGRESS 47
#define OK_BPF_FUNC_check_mtu 163

static bool refusing(const char *what)
{
	const char *list = getenv("TS_OLDKERNEL");
	size_t n = strlen(what);

	for (const char *p = list; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len == n && memcmp(p, what, n) == 0)
			return true;
		p = end ? end + 1 : NULL;
	}
	return false;
}

static bool calls_check_mtu(const union bpf_attr *a)
{
	const struct bpf_insn *insn = (const struct bpf_insn *)(uintptr_t)a->insns;

	for (uint32_t i = 0; insn && i < a->insn_cnt; i++)
		if (insn[i].code == (BPF_JMP | BPF_CALL) && insn[i].src_reg == 0 &&
		    insn[i].imm == OK_BPF_FUNC_check_mtu)
			return true;
	return false;
}

static bool refused(long cmd, const union bpf_attr *a)
{
	if (!a)
		return false;
	if (cmd == BPF_LINK_CREATE && refusing("tcx"))
		return a->link_create.attach_type == OK_BPF_TCX_INGRESS ||
		       a->link_create.attach_type == OK_BPF_TCX_EGRESS;
	if (cmd == BPF_PROG_LOAD && refusing("check_mtu"))
		return calls_check_mtu(a);
	return false;
}

/* libc's syscall(), found once before the program runs (its threads call syscall() too). */
static long (*next)(long, ...);

__attribute__((constructor)) static void find_next(void)
{
	next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
}

/* syscall() takes up to six arguments after the number and, as libc's own does, this one
 * reads six whatever the call passed: on x86-64 and arm64 the extra ones are whatever the
 * registers held, and the kernel ignores them. */
long syscall(long nr, ...)
{
	long a[6];
	va_list ap;

	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_bpf && refused(a[0], (const union bpf_attr *)a[1])) {
		errno = EINVAL;
		return -1;
	}
	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	return next(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
