/* log.h — leveled logging with a per-call-site rate limiter.
 *
 * A logger is a plain context struct (level, output fd or sink, clock); nothing is global except
 * the convenience logger log_default() for the CLI. Each message becomes one line formatted into
 * a bounded stack buffer and written with ONE write(2), so lines from several threads never
 * interleave and no stdio buffer can be lost on a crash.
 *
 * Rate limiting (e.g. a warning at most once per 5 s, so a resource running out cannot flood the
 * log): a struct log_ratelimit is embedded per call site or per key. The caller passes now_ns (its
 * monotonic loop clock), so the limiter is sans-IO and tests drive it with a virtual clock.
 * Suppressed messages are counted and the next emitted one ends with "(N similar messages
 * suppressed)".
 */
#ifndef TS_CORE_LOG_H
#define TS_CORE_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"

/* LOG_LEVEL_ prefix: <syslog.h> already defines LOG_INFO and LOG_DEBUG. */
enum log_level {
	LOG_LEVEL_ERROR,
	LOG_LEVEL_WARN,
	LOG_LEVEL_INFO,
	LOG_LEVEL_DEBUG,
	LOG_LEVEL_MAX
};

#define LOG_LINE_MAX 1024                        /* bytes per line, newline included */
#define LOG_RL_INTERVAL_NS (5LL * 1000000000LL)  /* default rate-limit interval */

#define LOG_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Returns wall-clock nanoseconds since the epoch for line timestamps. */
typedef int64_t (*log_clock_fn)(void *arg);
/* Receives each finished line (newline included, not NUL-counted) instead of the fd. */
typedef void (*log_sink_fn)(void *arg, enum log_level level, const char *line, size_t len);

struct log {
	enum log_level level;    /* messages less severe than this are dropped unformatted */
	int fd;                  /* output when sink is NULL; -1 discards */
	log_clock_fn clock;      /* NULL: lines carry no timestamp */
	void *clock_arg;
	log_sink_fn sink;        /* NULL: write to fd */
	void *sink_arg;

	/* Set level/fd/clock/sink before other threads log; the counters are thread-safe. */
	ctr_t lines[LOG_LEVEL_MAX];  /* emitted, per level */
	ctr_t suppressed;            /* dropped by a rate limiter */
	ctr_t write_errors;          /* lines lost to a failed or short write */
};

/* level, fd, the real-time clock, no sink, counters zeroed. */
void log_init(struct log *lg, enum log_level level, int fd);

/* The process-wide convenience logger (stderr, info, real-time clock) for the CLI. Library code
 * takes a struct log * in its context instead; passing NULL to log_msg means this one. */
struct log *log_default(void);

/* CLOCK_REALTIME in ns; the default clock. */
int64_t log_clock_realtime(void *arg);

static inline bool log_enabled(const struct log *lg, enum log_level level)
{
	/* Relaxed atomic: a reload changes the level while other threads log. */
	return level <= (enum log_level)__atomic_load_n(&lg->level, __ATOMIC_RELAXED);
}

void log_msg(struct log *lg, enum log_level level, const char *fmt, ...) LOG_PRINTF(3, 4);
void log_vmsg(struct log *lg, enum log_level level, const char *fmt, va_list ap)
	LOG_PRINTF(3, 0);

#define log_error(lg, ...) log_msg((lg), LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(lg, ...) log_msg((lg), LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(lg, ...) log_msg((lg), LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(lg, ...) log_msg((lg), LOG_LEVEL_DEBUG, __VA_ARGS__)

/* One rate limiter per call site or key. A zeroed struct is ready to use (interval 5 s, first
 * message at any now_ns >= 0 goes out); lock-free, so several workers may share one. */
struct log_ratelimit {
	_Atomic int64_t next_ns;      /* the earliest now_ns at which a message may go out */
	_Atomic uint64_t suppressed;  /* since the last emitted message */
	int64_t interval_ns;          /* 0 = LOG_RL_INTERVAL_NS; set before first use */
};

#define LOG_RATELIMIT_INIT { 0, 0, 0 }

void log_ratelimit_init(struct log_ratelimit *rl, int64_t interval_ns);

/* Emit at most one message per rl per interval; the others are counted (in rl and in
 * lg->suppressed) and reported by the next emitted one. A level that is filtered out touches
 * nothing. Returns true if a line was emitted. */
bool log_msg_rl(struct log *lg, enum log_level level, struct log_ratelimit *rl, int64_t now_ns,
		const char *fmt, ...) LOG_PRINTF(5, 6);
bool log_warn_rl(struct log *lg, struct log_ratelimit *rl, int64_t now_ns, const char *fmt, ...)
	LOG_PRINTF(4, 5);

/* "error" / "warn" / "info" / "debug". */
const char *log_level_name(enum log_level level);
int log_level_parse(const char *s, enum log_level *out);

#endif
