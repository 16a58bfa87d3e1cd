/* test_sysfile.c — reading small /proc and /sys text files (core/sysfile.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/sysfile.h"

static void write_tmp(char *path, const char *text)
{
	int fd = mkstemp(path);

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

Test(sysfile, reads_whole_file)
{
	char path[] = "/tmp/ts_sysfile_XXXXXX", buf[64];

	write_tmp(path, "reno bbr\n");
	cr_assert_eq(sysfile_read_text(path, buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "reno bbr\n");
	unlink(path);
}

Test(sysfile, truncates_to_capacity)
{
	char path[] = "/tmp/ts_sysfile_XXXXXX", buf[5];

	write_tmp(path, "0123456789");
	cr_assert_eq(sysfile_read_text(path, buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "0123"); /* cap - 1 bytes and the NUL */
	unlink(path);
}

Test(sysfile, proc_file)
{
	char buf[256];

	cr_assert_eq(sysfile_read_text("/proc/sys/net/ipv4/tcp_available_congestion_control", buf,
				       sizeof(buf)), 0);
	cr_assert_not_null(strstr(buf, "reno"), "reno is built into every kernel: '%s'", buf);
}

Test(sysfile, missing_file_leaves_buf)
{
	char buf[8] = "keep";

	cr_assert_eq(sysfile_read_text("/nonexistent/ts_sysfile", buf, sizeof(buf)), -ENOENT);
	cr_assert_str_eq(buf, "keep");
}
