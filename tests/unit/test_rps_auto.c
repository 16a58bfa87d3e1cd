/* test_rps_auto.c — tun.rps "auto" on a loop (runtime/rps_auto.c): the policy's decisions
 * applied to a real TUN's rps_cpus in a namespace, driven with a virtual CPU clock and byte
 * count; and a sysfs write that fails ends the policy with the figures kept. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "core/clock.h"
#include "core/config.h"
#include "core/log.h"
#include "core/tun.h"
#include "runtime/rps_auto.h"
#include "netns_child.h"

#define WINDOW_NS (250 * TS_NS_PER_MS) /* rps_policy_defaults' window */

static int64_t fake_cpu; /* the loop thread's CPU time, as the test says */

static int64_t cpu_clock(void)
{
	return fake_cpu;
}

/* rx-0/rps_cpus holds a non-zero mask. */
static bool steering_on(const char *dev)
{
	char path[128], text[64] = "";
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), "/sys/class/net/%s/queues/rx-0/rps_cpus", dev);
	fd = open(path, O_RDONLY);
	CHECK(fd >= 0, "%s: %s", path, strerror(errno));
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	CHECK(n > 0, "read %s", path);
	for (ssize_t i = 0; i < n; i++)
		if (text[i] != '0' && text[i] != ',' && text[i] != '\n')
			return true;
	return false;
}

/* One window: the thread busy busy_pct percent of it, bytes_per_window moved. */
static void window(struct rps_auto *ra, int64_t *now, uint64_t *bytes, unsigned busy_pct,
		   uint64_t bytes_per_window)
{
	*now += WINDOW_NS;
	fake_cpu += WINDOW_NS * busy_pct / 100;
	*bytes += bytes_per_window;
	rps_auto_tick(ra, *now, *bytes);
}

static void follows_the_load(void)
{
	struct ts_config cfg;
	struct rps_auto ra;
	struct tun *t = NULL;
	struct log lg;
	char err[256], note[256];
	int64_t now;
	uint64_t bytes = 0;

	config_init(&cfg);
	snprintf(cfg.tun.name, sizeof(cfg.tun.name), "tra0");
	cfg.tun.offload = TS_OFFLOAD_OFF;
	cfg.tun.rps = TS_RPS_AUTO;
	CHECK(tun_open_config(&cfg.tun, &t, note, sizeof(note), err, sizeof(err)) == 0, "%s", err);
	if (!tun_rps_auto(t))
		child_report(SKIP_STATUS, "one CPU or no rps_cpus: nothing to steer (%s)", note);
	CHECK(!steering_on("tra0"), "auto starts with steering off");
	log_init(&lg, LOG_LEVEL_DEBUG, -1);
	fake_cpu = 1;
	CHECK(rps_auto_start_clock(&ra, t, &lg, "test", 0, cpu_clock, err, sizeof(err)) == 0,
	      "%s", err);
	CHECK(rps_auto_active(&ra), "following the load");
	now = ts_now_ns();

	/* Quiet: nothing happens. */
	for (int i = 0; i < 4; i++)
		window(&ra, &now, &bytes, 20, 1000000);
	CHECK(!steering_on("tra0") && rps_auto_switches(&ra) == 0, "quiet: off");
	CHECK(rps_auto_busy_pct(&ra) == 20, "busy %u", rps_auto_busy_pct(&ra));
	/* Saturated for two windows: a trial turns steering on... */
	window(&ra, &now, &bytes, 100, 1000000);
	window(&ra, &now, &bytes, 100, 1000000);
	CHECK(steering_on("tra0"), "trial: on");
	CHECK(rps_auto_switches(&ra) == 1, "switches %llu",
	      (unsigned long long)rps_auto_switches(&ra));
	/* ...and 20 % more bytes per second during it: kept. */
	for (int i = 0; i < 5; i++)
		window(&ra, &now, &bytes, 100, 1200000);
	CHECK(steering_on("tra0"), "a trial that paid keeps steering on");
	CHECK(rps_auto_last_trial_pct(&ra) >= 15, "gain %d", rps_auto_last_trial_pct(&ra));
	/* The load goes away: off after the hold and four quiet windows. */
	for (int i = 0; i < 8; i++)
		window(&ra, &now, &bytes, 5, 1000);
	CHECK(!steering_on("tra0"), "quiet again: off");
	CHECK(rps_auto_switches(&ra) == 2, "switches %llu",
	      (unsigned long long)rps_auto_switches(&ra));

	/* The device goes away under it: the next switch fails, the policy ends, figures kept.
	 * (The TUN keeps rps_cpus open from the start, so unmounting /sys would not do: the
	 * file's node has to go, as when an administrator deletes the link.) */
	uint64_t warns = ctr_get(&lg.lines[LOG_LEVEL_WARN]);
	CHECK(system("ip link del tra0") == 0, "ip link del tra0 failed");
	for (int i = 0; i < 3 && rps_auto_active(&ra); i++)
		window(&ra, &now, &bytes, 100, 1000000);
	CHECK(!rps_auto_active(&ra), "a failed write ends the policy");
	CHECK(ctr_get(&lg.lines[LOG_LEVEL_WARN]) == warns + 1, "one warning");
	CHECK(rps_auto_switches(&ra) == 2, "switches kept: %llu",
	      (unsigned long long)rps_auto_switches(&ra));
	window(&ra, &now, &bytes, 100, 1000000); /* ticks after the end are no-ops */
	rps_auto_stop(&ra);
	tun_close(t);
	config_fini(&cfg);
}

Test(rps_auto, follows_the_load_on_a_real_tun, .timeout = 30)
{
	run_in_netns(follows_the_load);
}

/* Without "auto" there is nothing to follow: start does nothing, ticks are free. */
static void not_auto(void)
{
	struct ts_config cfg;
	struct rps_auto ra;
	struct tun *t = NULL;
	struct log lg;
	char err[256], note[256];

	config_init(&cfg);
	snprintf(cfg.tun.name, sizeof(cfg.tun.name), "trb0");
	cfg.tun.offload = TS_OFFLOAD_OFF;
	cfg.tun.rps = TS_RPS_OFF;
	CHECK(tun_open_config(&cfg.tun, &t, note, sizeof(note), err, sizeof(err)) == 0, "%s", err);
	log_init(&lg, LOG_LEVEL_DEBUG, -1);
	CHECK(rps_auto_start_clock(&ra, t, &lg, "test", 0, cpu_clock, err, sizeof(err)) == 0,
	      "%s", err);
	CHECK(!rps_auto_active(&ra), "not following");
	rps_auto_tick(&ra, ts_now_ns() + TS_NS_PER_SEC, 1);
	CHECK(rps_auto_switches(&ra) == 0 && rps_auto_busy_pct(&ra) == 0, "nothing");
	tun_close(t);
	config_fini(&cfg);
}

Test(rps_auto, off_means_nothing_to_follow, .timeout = 30)
{
	run_in_netns(not_auto);
}
