/* rss.c — VmRSS / VmHWM from /proc/self/status. */
#include "core/rss.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Parse "<blanks><digits><blanks>kB" starting at p (end = one past the line's last byte) into
 * bytes. */
static int parse_kb(const char *p, const char *end, uint64_t *bytes)
{
	uint64_t kb = 0;
	bool digits = false;

	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	for (; p < end && *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');
		if (kb > (UINT64_MAX - d) / 10)
			return -ERANGE;
		kb = kb * 10 + d;
		digits = true;
	}
	if (!digits)
		return -EINVAL;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	/* The kernel always prints kB (fs/proc/task_mmu.c); anything else is not what we think. */
	if (end - p < 2 || p[0] != 'k' || p[1] != 'B')
		return -EINVAL;
	for (p += 2; p < end; p++)
		if (*p != ' ' && *p != '\t' && *p != '\r')
			return -EINVAL;
	if (kb > UINT64_MAX / 1024)
		return -ERANGE;
	*bytes = kb * 1024;
	return 0;
}

/* If the line [p, end) starts with key (which includes the colon), parse its value. Returns 1
 * if parsed, 0 if the line is another field, or a negative errno. */
static int match_field(const char *p, const char *end, const char *key, uint64_t *bytes)
{
	size_t klen = strlen(key);
	int ret;

	if ((size_t)(end - p) < klen || memcmp(p, key, klen) != 0)
		return 0;
	if ((ret = parse_kb(p + klen, end, bytes)) != 0)
		return ret;
	return 1;
}

int rss_parse(const char *text, size_t len, struct rss_info *out)
{
	const char *p = text, *end = text + len;
	bool have_rss = false, have_hwm = false;
	uint64_t rss = 0, hwm = 0;
	int ret;

	while (p < end && !(have_rss && have_hwm)) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *eol = nl ? nl : end;

		/* The first occurrence of a field wins; a later duplicate is not ours to judge. */
		if (!have_rss && (ret = match_field(p, eol, "VmRSS:", &rss)) != 0) {
			if (ret < 0)
				return ret;
			have_rss = true;
		} else if (!have_hwm && (ret = match_field(p, eol, "VmHWM:", &hwm)) != 0) {
			if (ret < 0)
				return ret;
			have_hwm = true;
		}
		p = nl ? nl + 1 : end;
	}
	if (!have_rss)
		return -ENOENT;
	out->rss_bytes = rss;
	/* HWM >= RSS by definition; a kernel without VmHWM gets the only lower bound we know. */
	out->hwm_bytes = have_hwm && hwm >= rss ? hwm : rss;
	return 0;
}

int rss_sample_path(const char *path, struct rss_info *out)
{
	char buf[RSS_READ_MAX];
	size_t len = 0;
	int fd, ret;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	/* procfs may return the file in pieces; read until EOF or the buffer is full. */
	while (len < sizeof(buf)) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - len);
		if (n > 0) {
			len += (size_t)n;
		} else if (n == 0) {
			break;
		} else if (errno != EINTR) {
			ret = -errno;
			goto out_close;
		}
	}
	ret = rss_parse(buf, len, out);
out_close:
	close(fd);
	return ret;
}

int rss_sample(struct rss_info *out)
{
	return rss_sample_path("/proc/self/status", out);
}

void rss_heap_trim(void)
{
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}

size_t rss_pages_release(void *p, size_t len)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
	uintptr_t b = ((uintptr_t)p + len) & ~(page - 1);

	if (!p || b <= a || madvise((void *)a, b - a, MADV_DONTNEED) != 0)
		return 0;
	return b - a;
}

int rss_tunables_tcache_off(const char *old, char *out, size_t cap)
{
	int n;

	if (old && strstr(old, "glibc.malloc.tcache_count=") != NULL)
		return 1;
	if (old && *old)
		n = snprintf(out, cap, "%s:%s", old, RSS_TCACHE_OFF);
	else
		n = snprintf(out, cap, "%s", RSS_TCACHE_OFF);
	return n < 0 || (size_t)n >= cap ? -ENOSPC : 0;
}
