/* embed.c — libtwinstack embedded in a program: a proxy created from a JSON config, running on
 * a TUN device this program opened, stopped by SIGINT or SIGTERM; prints its stats at exit.
 *
 *   cc embed.c $(pkg-config --cflags --libs twinstack) -o embed
 *   ./embed [--tun-fd-from NAME] CONFIG_JSON
 *
 * CONFIG_JSON is the config document itself (docs/config.md). With --tun-fd-from NAME the
 * program attaches to the persistent TUN device NAME, which its creator already configured
 * (`ip tuntap add dev NAME mode tun`, the config's tun.address on it, up, routes into it), and
 * hands the fd to the proxy, as an Android VpnService hands one over; without it the proxy
 * creates the TUN from the config's "tun" section. Prints "ready" once the proxy carries
 * traffic. Exit: 0 after a requested stop, 1 on a failure, 2 on a usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <twinstack.h>

/* The signal handler's way to the proxy (ts_proxy_stop is async-signal-safe). */
static struct ts_proxy *volatile the_proxy;

static void on_signal(int sig)
{
	(void)sig;
	if (the_proxy)
		ts_proxy_stop(the_proxy);
}

/* Attach to the existing TUN device name: its fd, or -errno. */
static int tun_attach(const char *name)
{
	struct ifreq ifr = { .ifr_flags = IFF_TUN | IFF_NO_PI };
	int fd, ret;

	if (if_nametoindex(name) == 0) /* TUNSETIFF would create a new, unconfigured one */
		return -ENODEV;
	if ((fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC)) < 0)
		return -errno;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	return fd;
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_signal };
	struct ts_proxy *p = NULL;
	const char *tun_name = NULL, *json;
	sigset_t stop_signals;
	char err[256] = "", *stats;
	int tun_fd = -1, ret;

	if (argc == 4 && strcmp(argv[1], "--tun-fd-from") == 0) {
		tun_name = argv[2];
	} else if (argc != 2) {
		fprintf(stderr, "usage: %s [--tun-fd-from NAME] CONFIG_JSON\n", argv[0]);
		return 2;
	}
	json = argv[argc - 1];

	if ((ret = ts_proxy_new_json(json, strlen(json), &p, err, sizeof(err))) != 0)
		goto out;
	if (tun_name) {
		if ((tun_fd = ret = tun_attach(tun_name)) < 0) {
			snprintf(err, sizeof(err), "%s: %s", tun_name, strerror(-ret));
			goto out;
		}
		if ((ret = ts_proxy_set_tun_fd(p, tun_fd)) != 0) {
			snprintf(err, sizeof(err), "%s: not usable: %s", tun_name, strerror(-ret));
			goto out;
		}
	}

	/* A stop before the start would be a no-op and then lost: hold SIGINT/SIGTERM back
	 * until the proxy runs. (The library's own threads block every signal.) */
	sigemptyset(&stop_signals);
	sigaddset(&stop_signals, SIGINT);
	sigaddset(&stop_signals, SIGTERM);
	sigprocmask(SIG_BLOCK, &stop_signals, NULL);
	the_proxy = p;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if ((ret = ts_proxy_start(p, err, sizeof(err))) != 0)
		goto out;
	printf("ready: twinstack %s\n", ts_version());
	fflush(stdout);
	sigprocmask(SIG_UNBLOCK, &stop_signals, NULL);

	ret = ts_proxy_wait(p); /* until on_signal's stop (0), or a failure (-errno) */
	if (ret != 0)
		snprintf(err, sizeof(err), "proxy failed: %s", strerror(-ret));
	if (ts_proxy_stats_json(p, &stats, NULL) == 0) {
		puts(stats);
		ts_free(stats);
	}
out:
	the_proxy = NULL; /* before the free: a late signal finds no proxy */
	ts_proxy_free(p);
	if (tun_fd >= 0)
		close(tun_fd); /* the caller's fd: closed only after ts_proxy_free */
	if (ret != 0)
		fprintf(stderr, "embed: %s\n", err);
	return ret != 0;
}
