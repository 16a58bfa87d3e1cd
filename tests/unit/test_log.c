/* test_log.c — levels, line format, fd output, and the rate limiter on a virtual clock. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "testutil.h"

/* A sink that keeps the lines it receives. */
struct capture {
	char lines[16][LOG_LINE_MAX + 1];
	enum log_level levels[16];
	size_t lens[16];
	int n;
};

static void capture_sink(void *arg, enum log_level level, const char *line, size_t len)
{
	struct capture *c = arg;

	cr_assert_lt(c->n, 16);
	cr_assert_leq(len, LOG_LINE_MAX);
	memcpy(c->lines[c->n], line, len);
	c->lines[c->n][len] = '\0';
	c->levels[c->n] = level;
	c->lens[c->n] = len;
	c->n++;
}

static int64_t fixed_clock(void *arg)
{
	return *(int64_t *)arg;
}

static void mk(struct log *lg, struct capture *c, enum log_level level)
{
	memset(c, 0, sizeof(*c));
	log_init(lg, level, -1);
	lg->clock = NULL; /* no timestamp: lines compare exactly */
	lg->sink = capture_sink;
	lg->sink_arg = c;
}

Test(log, levels_filter_and_count)
{
	struct log lg;
	struct capture c;

	mk(&lg, &c, LOG_LEVEL_WARN);
	log_error(&lg, "disk %s", "gone");
	log_warn(&lg, "queue %d full", 7);
	log_info(&lg, "not shown");
	log_debug(&lg, "not shown");
	cr_assert_eq(c.n, 2);
	cr_assert_str_eq(c.lines[0], "ERROR disk gone\n");
	cr_assert_str_eq(c.lines[1], "WARN  queue 7 full\n");
	cr_assert_eq(c.levels[0], LOG_LEVEL_ERROR);
	cr_assert_eq(ctr_get(&lg.lines[LOG_LEVEL_ERROR]), 1);
	cr_assert_eq(ctr_get(&lg.lines[LOG_LEVEL_WARN]), 1);
	cr_assert_eq(ctr_get(&lg.lines[LOG_LEVEL_INFO]), 0);

	lg.level = LOG_LEVEL_DEBUG;
	log_debug(&lg, "now %s", "shown");
	cr_assert_eq(c.n, 3);
	cr_assert_str_eq(c.lines[2], "DEBUG now shown\n");
}

Test(log, timestamp_from_the_injected_clock)
{
	struct log lg;
	struct capture c;
	int64_t now = SEC(1700000000) + MS(42); /* 2023-11-14T22:13:20.042Z */

	mk(&lg, &c, LOG_LEVEL_INFO);
	lg.clock = fixed_clock;
	lg.clock_arg = &now;
	log_info(&lg, "hello");
	cr_assert_str_eq(c.lines[0], "2023-11-14T22:13:20.042Z INFO  hello\n");
}

Test(log, long_messages_are_truncated_and_marked)
{
	struct log lg;
	struct capture c;
	static char big[4 * LOG_LINE_MAX];

	memset(big, 'x', sizeof(big) - 1);
	mk(&lg, &c, LOG_LEVEL_INFO);
	log_info(&lg, "%s", big);
	cr_assert_eq(c.n, 1);
	cr_assert_lt(c.lens[0], (size_t)LOG_LINE_MAX);
	cr_assert_eq(c.lines[0][c.lens[0] - 1], '\n');
	cr_assert_eq(memcmp(c.lines[0] + c.lens[0] - 4, "...\n", 4), 0);
}

Test(log, writes_one_line_per_message_to_the_fd)
{
	struct log lg;
	int fds[2];
	char buf[256];

	cr_assert_eq(pipe(fds), 0);
	log_init(&lg, LOG_LEVEL_INFO, fds[1]);
	lg.clock = NULL;
	log_warn(&lg, "a=%d", 1);
	log_info(&lg, "b");
	close(fds[1]);
	ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
	cr_assert_gt(n, 0);
	buf[n] = '\0';
	cr_assert_str_eq(buf, "WARN  a=1\nINFO  b\n");
	close(fds[0]);

	/* A dead fd loses the line and counts it; it never blocks or crashes. */
	lg.fd = fds[1];
	log_info(&lg, "lost");
	cr_assert_eq(ctr_get(&lg.write_errors), 1);
}

Test(log, level_names_parse)
{
	enum log_level l = LOG_LEVEL_ERROR;

	cr_assert_eq(log_level_parse("debug", &l), 0);
	cr_assert_eq(l, LOG_LEVEL_DEBUG);
	cr_assert_eq(log_level_parse("warn", &l), 0);
	cr_assert_eq(l, LOG_LEVEL_WARN);
	cr_assert_eq(log_level_parse("warning", &l), -EINVAL);
	cr_assert_eq(log_level_parse(NULL, &l), -EINVAL);
	cr_assert_str_eq(log_level_name(LOG_LEVEL_INFO), "info");
	cr_assert_str_eq(log_level_name(LOG_LEVEL_MAX), "unknown");
}

Test(log, default_logger_exists)
{
	struct log *d = log_default();

	cr_assert_not_null(d);
	cr_assert_eq(d, log_default());
	cr_assert_eq(d->level, LOG_LEVEL_INFO);
	cr_assert_eq(d->fd, STDERR_FILENO);
	cr_assert_not_null(d->clock);
	cr_assert_gt(d->clock(NULL), SEC(1600000000));
}

Test(ratelimit, one_per_5s_and_reports_the_suppressed_count)
{
	struct log lg;
	struct capture c;
	struct log_ratelimit rl = LOG_RATELIMIT_INIT;
	int64_t t0 = SEC(100);

	mk(&lg, &c, LOG_LEVEL_INFO);
	cr_assert(log_warn_rl(&lg, &rl, t0, "accept: %s", "EMFILE"));
	cr_assert_not(log_warn_rl(&lg, &rl, t0, "accept: %s", "EMFILE"));
	cr_assert_not(log_warn_rl(&lg, &rl, t0 + SEC(1), "accept: %s", "EMFILE"));
	cr_assert_not(log_warn_rl(&lg, &rl, t0 + SEC(5) - 1, "accept: %s", "EMFILE"));
	cr_assert_eq(c.n, 1);
	cr_assert_str_eq(c.lines[0], "WARN  accept: EMFILE\n");
	cr_assert_eq(ctr_get(&lg.suppressed), 3);

	cr_assert(log_warn_rl(&lg, &rl, t0 + SEC(5), "accept: %s", "ENFILE"));
	cr_assert_eq(c.n, 2);
	cr_assert_str_eq(c.lines[1], "WARN  accept: ENFILE (3 similar messages suppressed)\n");

	/* The window restarts at the emitted message: next one at t0 + 10 s. */
	cr_assert_not(log_warn_rl(&lg, &rl, t0 + SEC(9), "x"));
	cr_assert(log_warn_rl(&lg, &rl, t0 + SEC(10), "x"));
	cr_assert_str_eq(c.lines[2], "WARN  x (1 similar messages suppressed)\n");

	/* Nothing suppressed since: no suffix. */
	cr_assert(log_warn_rl(&lg, &rl, t0 + SEC(60), "y"));
	cr_assert_str_eq(c.lines[3], "WARN  y\n");
	cr_assert_eq(ctr_get(&lg.lines[LOG_LEVEL_WARN]), 4);
	cr_assert_eq(ctr_get(&lg.suppressed), 4);
}

Test(ratelimit, emits_once_per_window_over_a_long_virtual_run)
{
	struct log lg;
	struct capture c;
	struct log_ratelimit rl = LOG_RATELIMIT_INIT;
	int emitted = 0;

	mk(&lg, &c, LOG_LEVEL_INFO);
	/* One attempt every 100 ms for 60 s from t = 0 (a zeroed limiter admits now >= 0). */
	for (int64_t t = 0; t < SEC(60); t += MS(100)) {
		if (log_warn_rl(&lg, &rl, t, "tick"))
			emitted++;
		if (c.n == 16)
			c.n = 0; /* keep the capture bounded; the count is what matters */
	}
	cr_assert_eq(emitted, 12);
	cr_assert_eq(ctr_get(&lg.suppressed), 600 - 12);
	cr_assert_eq(atomic_load(&rl.suppressed), 49); /* since the last emission at 55 s */
}

Test(ratelimit, keys_are_independent_and_filtered_levels_touch_nothing)
{
	struct log lg;
	struct capture c;
	struct log_ratelimit a = LOG_RATELIMIT_INIT, b;

	mk(&lg, &c, LOG_LEVEL_WARN);
	log_ratelimit_init(&b, SEC(1));
	cr_assert(log_warn_rl(&lg, &a, 0, "a"));
	cr_assert(log_warn_rl(&lg, &b, 0, "b"));
	cr_assert_not(log_warn_rl(&lg, &a, SEC(1), "a"));
	cr_assert(log_warn_rl(&lg, &b, SEC(1), "b")); /* its own 1 s interval */

	cr_assert_not(log_msg_rl(&lg, LOG_LEVEL_INFO, &a, SEC(100), "info is filtered"));
	cr_assert_eq(atomic_load(&a.suppressed), 1, "a filtered level is not a suppression");
	cr_assert(log_msg_rl(&lg, LOG_LEVEL_ERROR, &a, SEC(100), "e"));
	cr_assert_str_eq(c.lines[c.n - 1], "ERROR e (1 similar messages suppressed)\n");
}
