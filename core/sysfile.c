/* sysfile.c — read the small text files of /proc and /sys. */
#include "core/sysfile.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int sysfile_read_text(const char *path, char *buf, size_t cap)
{
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret;

	if (fd < 0)
		return -errno;
	do {
		n = read(fd, buf, cap - 1);
	} while (n < 0 && errno == EINTR);
	ret = n < 0 ? -errno : 0;
	close(fd);
	if (ret == 0)
		buf[n] = '\0';
	return ret;
}
