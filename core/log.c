/* log.c — line formatting, the one-write output and the lock-free rate limiter. */
#include "core/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[LOG_LEVEL_MAX] = { "error", "warn", "info", "debug" };
static const char *const level_tags[LOG_LEVEL_MAX] = { "ERROR", "WARN ", "INFO ", "DEBUG" };

/* Room kept at the end of every line for the longest suppression suffix and the newline, so a
 * truncated message still reports how many messages it stands for. */
#define SUFFIX_ROOM 64

static struct log default_log = {
	.level = LOG_LEVEL_INFO,
	.fd = STDERR_FILENO,
	.clock = log_clock_realtime,
};

struct log *log_default(void)
{
	return &default_log;
}

int64_t log_clock_realtime(void *arg)
{
	struct timespec ts;

	(void)arg;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void log_init(struct log *lg, enum log_level level, int fd)
{
	memset(lg, 0, sizeof(*lg));
	lg->level = level;
	lg->fd = fd;
	lg->clock = log_clock_realtime;
	for (int i = 0; i < LOG_LEVEL_MAX; i++)
		ctr_set(&lg->lines[i], 0);
	ctr_set(&lg->suppressed, 0);
	ctr_set(&lg->write_errors, 0);
}

const char *log_level_name(enum log_level level)
{
	return (unsigned)level < LOG_LEVEL_MAX ? level_names[level] : "unknown";
}

int log_level_parse(const char *s, enum log_level *out)
{
	for (int i = 0; s && i < LOG_LEVEL_MAX; i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

/* "2025-01-31T12:34:56.789Z " (UTC, so lines from different hosts sort together). */
static size_t format_time(char *buf, size_t cap, int64_t ns)
{
	struct tm tm;
	time_t sec;
	size_t n;

	if (ns < 0)
		ns = 0;
	sec = (time_t)(ns / 1000000000LL);
	if (!gmtime_r(&sec, &tm))
		return 0;
	n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
	if (n == 0)
		return 0;
	n += (size_t)snprintf(buf + n, cap - n, ".%03dZ ", (int)(ns / 1000000 % 1000));
	return n < cap ? n : cap - 1;
}

static void emit(struct log *lg, enum log_level level, const char *line, size_t len)
{
	size_t off = 0;

	ctr_add_shared(&lg->lines[level], 1);
	if (lg->sink) {
		lg->sink(lg->sink_arg, level, line, len);
		return;
	}
	if (lg->fd < 0)
		return;
	/* Bounded: a short write advances; EINTR retries; anything else (EAGAIN on a non-blocking
	 * stderr included) drops the rest of the line rather than stall a packet path. */
	while (off < len) {
		ssize_t w = write(lg->fd, line + off, len - off);
		if (w > 0) {
			off += (size_t)w;
		} else if (w < 0 && errno == EINTR) {
			continue;
		} else {
			ctr_add_shared(&lg->write_errors, 1);
			return;
		}
	}
}

/* Format "<time> <LEVEL> <message>[ (N similar messages suppressed)]\n" and emit it. */
static void format_and_emit(struct log *lg, enum log_level level, uint64_t suppressed,
			    const char *fmt, va_list ap)
{
	char line[LOG_LINE_MAX];
	const size_t body_cap = sizeof(line) - SUFFIX_ROOM;
	size_t n = 0;
	int m;

	if (lg->clock)
		n = format_time(line, body_cap, lg->clock(lg->clock_arg));
	n += (size_t)snprintf(line + n, body_cap - n, "%s ", level_tags[level]);
	m = vsnprintf(line + n, body_cap - n, fmt, ap);
	if (m < 0) {
		n += (size_t)snprintf(line + n, body_cap - n, "(bad log format: %s)", fmt);
	} else if ((size_t)m >= body_cap - n) {
		/* Truncated: mark it so nobody mistakes the cut for the end of the message. */
		n = body_cap - 1;
		memcpy(line + n - 3, "...", 3);
	} else {
		n += (size_t)m;
	}
	if (n >= body_cap)
		n = body_cap - 1;
	if (suppressed)
		n += (size_t)snprintf(line + n, sizeof(line) - n,
				      " (%" PRIu64 " similar messages suppressed)", suppressed);
	line[n++] = '\n';
	emit(lg, level, line, n);
}

void log_vmsg(struct log *lg, enum log_level level, const char *fmt, va_list ap)
{
	if (!lg)
		lg = log_default();
	if ((unsigned)level >= LOG_LEVEL_MAX || !log_enabled(lg, level))
		return;
	format_and_emit(lg, level, 0, fmt, ap);
}

void log_msg(struct log *lg, enum log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vmsg(lg, level, fmt, ap);
	va_end(ap);
}

void log_ratelimit_init(struct log_ratelimit *rl, int64_t interval_ns)
{
	atomic_init(&rl->next_ns, 0);
	atomic_init(&rl->suppressed, 0);
	rl->interval_ns = interval_ns;
}

/* Claim the right to emit at now_ns. The CAS on next_ns makes exactly one of several racing
 * workers the emitter; the losers count themselves as suppressed. The emitter takes the count
 * with an exchange, so each suppressed message is reported exactly once. */
static bool rl_claim(struct log_ratelimit *rl, int64_t now_ns, uint64_t *suppressed)
{
	int64_t iv = rl->interval_ns > 0 ? rl->interval_ns : LOG_RL_INTERVAL_NS;
	int64_t next = atomic_load_explicit(&rl->next_ns, memory_order_relaxed);
	int64_t want = now_ns > INT64_MAX - iv ? INT64_MAX : now_ns + iv;

	do {
		if (now_ns < next) {
			atomic_fetch_add_explicit(&rl->suppressed, 1, memory_order_relaxed);
			return false;
		}
	} while (!atomic_compare_exchange_weak_explicit(&rl->next_ns, &next, want,
							memory_order_relaxed,
							memory_order_relaxed));
	*suppressed = atomic_exchange_explicit(&rl->suppressed, 0, memory_order_relaxed);
	return true;
}

static bool vmsg_rl(struct log *lg, enum log_level level, struct log_ratelimit *rl,
		    int64_t now_ns, const char *fmt, va_list ap)
{
	uint64_t suppressed;

	if (!lg)
		lg = log_default();
	if ((unsigned)level >= LOG_LEVEL_MAX || !log_enabled(lg, level))
		return false;
	if (!rl_claim(rl, now_ns, &suppressed)) {
		ctr_add_shared(&lg->suppressed, 1);
		return false;
	}
	format_and_emit(lg, level, suppressed, fmt, ap);
	return true;
}

bool log_msg_rl(struct log *lg, enum log_level level, struct log_ratelimit *rl, int64_t now_ns,
		const char *fmt, ...)
{
	va_list ap;
	bool ret;

	va_start(ap, fmt);
	ret = vmsg_rl(lg, level, rl, now_ns, fmt, ap);
	va_end(ap);
	return ret;
}

bool log_warn_rl(struct log *lg, struct log_ratelimit *rl, int64_t now_ns, const char *fmt, ...)
{
	va_list ap;
	bool ret;

	va_start(ap, fmt);
	ret = vmsg_rl(lg, LOG_LEVEL_WARN, rl, now_ns, fmt, ap);
	va_end(ap);
	return ret;
}
