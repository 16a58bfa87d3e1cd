/* sysfile.h — read the small text files of /proc and /sys. */
#ifndef TS_CORE_SYSFILE_H
#define TS_CORE_SYSFILE_H

#include <stddef.h>

/* Read up to cap - 1 bytes of path into buf, NUL-terminated (one read: these files are small
 * and produced whole). 0, or -errno (buf untouched then). */
int sysfile_read_text(const char *path, char *buf, size_t cap);

#endif
