/* rss.h — resident-set sampling from /proc/self/status (VmRSS, VmHWM).
 *
 * rss_parse() is pure (text in, numbers out) so the parser is unit-tested on fixed texts;
 * rss_sample() does the I/O: open, one bounded read, close. The loop calls it on its stats tick
 * and feeds the result to budget_update_tier().
 */
#ifndef TS_CORE_RSS_H
#define TS_CORE_RSS_H

#include <stddef.h>
#include <stdint.h>

/* /proc/self/status is ~1.5 KiB; VmRSS and VmHWM sit in its first 30 lines. A larger file is
 * read only up to this many bytes. */
#define RSS_READ_MAX 8192

struct rss_info {
	uint64_t rss_bytes;  /* VmRSS: resident now */
	uint64_t hwm_bytes;  /* VmHWM: peak resident ("high water mark"); = rss_bytes if absent */
};

/* Parse the text of a /proc/<pid>/status file (len bytes, need not be NUL-terminated).
 * Fields are recognised only at the start of a line, as "Name:" + blanks + decimal + " kB".
 * Returns 0; -ENOENT if VmRSS is missing; -EINVAL if VmRSS or VmHWM is malformed (no digits,
 * another unit); -ERANGE if a value overflows 64 bits in bytes. */
int rss_parse(const char *text, size_t len, struct rss_info *out)
	__attribute__((warn_unused_result));

/* Sample this process. Returns 0 or -errno (open/read failure, or rss_parse's errors). */
int rss_sample(struct rss_info *out) __attribute__((warn_unused_result));

/* Same from another file (tests; other pids). */
int rss_sample_path(const char *path, struct rss_info *out) __attribute__((warn_unused_result));

/* Give the heap's free pages back to the system (malloc_trim(0): free pages inside every
 * arena, not only at the top). A no-op without glibc. */
void rss_heap_trim(void);

/* Give back the whole pages inside [p, p + len) (MADV_DONTNEED): they read as zero when next
 * touched, which faults them in again. For a buffer whose bytes do not matter between uses
 * (nothing in it is waiting), on a heap block or a mapping alike. Returns the bytes given. */
size_t rss_pages_release(void *p, size_t len);

/* glibc's per-thread cache of freed small blocks (tcache) keeps up to 7 blocks of each size for
 * the thread that freed them; malloc_trim leaves them in place, and after a load each one pins
 * the page it is on. The cache can be sized only when the process starts, through the
 * GLIBC_TUNABLES environment variable. rss_tunables_tcache_off writes into out (cap bytes)
 * the value of GLIBC_TUNABLES that keeps old's settings (old may be NULL) and switches the
 * cache off: 0. 1 when old already sets glibc.malloc.tcache_count (the caller's choice wins:
 * out untouched); -ENOSPC when out is too small. Pure. */
#define RSS_TCACHE_OFF "glibc.malloc.tcache_count=0"
int rss_tunables_tcache_off(const char *old, char *out, size_t cap)
	__attribute__((warn_unused_result));

#endif
