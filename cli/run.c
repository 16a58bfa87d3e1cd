/* run.c — `twinstack run`: the proxy of the library (include/twinstack.h) as a program:
 * arguments, the process preparation, signals, the ready fd and exit codes. Exit 2 for bad
 * usage or a bad config, 1 for a start or runtime failure (the ready fd is then closed
 * without a byte), 0 after SIGINT or SIGTERM. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "twinstack.h"

void usage_run(FILE *out)
{
	fputs("usage: twinstack run --config FILE [--ready-fd N]\n"
	      "\n"
	      "Create the TUN device from FILE, start the configured stack and carry traffic until\n"
	      "SIGINT or SIGTERM; SIGHUP reads the config file again (live sessions go on).\n"
	      "'ready' is logged once every listener is bound; with --ready-fd N\n"
	      "one byte is also written to fd N then (N is closed without a byte if start fails).\n"
	      "Needs CAP_NET_ADMIN (root). Exit 0 after a signal, 1 on a runtime failure, 2 on bad\n"
	      "usage or a bad config.\n"
	      "\n"
	      "options:\n"
	      "  -c, --config FILE   the config file (required)\n"
	      "      --ready-fd N    write one byte to fd N when ready\n"
	      "  -h, --help          this text\n",
	      out);
}

/* The proxy the signal handlers stop: the one process-wide object of this program, set before
 * the handlers are installed. ts_proxy_stop is async-signal-safe. */
static struct ts_proxy *volatile signalled_proxy;

static void on_signal(int sig)
{
	if (sig == SIGHUP)
		ts_proxy_request_reload(signalled_proxy); /* the config file again */
	else
		ts_proxy_stop(signalled_proxy); /* NULL: a no-op */
}

static int handle_signals(struct ts_proxy *p)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	signalled_proxy = p;
	if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ||
	    sigaction(SIGHUP, &sa, NULL) != 0)
		return -errno;
	return 0;
}

static void ready(int ready_fd)
{
	ssize_t n;

	if (ready_fd < 0)
		return;
	do
		n = write(ready_fd, "R", 1);
	while (n < 0 && errno == EINTR);
	close(ready_fd);
}

static int parse_args(int argc, char **argv, const char **path, int *ready_fd)
{
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		int r;
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_run(stdout);
			return 1;
		}
		if ((r = cli_take_option(argc, argv, &i, "--config", "-c", path)) != 0) {
			if (r < 0)
				goto missing;
			continue;
		}
		if ((r = cli_take_option(argc, argv, &i, "--ready-fd", "--ready-fd", &v)) != 0) {
			char *end;
			if (r < 0)
				goto missing;
			long fd = strtol(v, &end, 10);
			/* Digits only: strtol would take "", " 1" or "+1" too ("" as fd 0). */
			if (v[0] < '0' || v[0] > '9' || *end || fd < 0 || fd > 65535 ||
			    fcntl((int)fd, F_GETFD) < 0) {
				fprintf(stderr, "twinstack run: --ready-fd '%s' is not an open fd\n", v);
				return -1;
			}
			*ready_fd = (int)fd;
			continue;
		}
		fprintf(stderr, "twinstack run: unexpected argument '%s'\n", argv[i]);
		usage_run(stderr);
		return -1;
missing:
		fprintf(stderr, "twinstack run: %s needs a value\n", argv[i]);
		return -1;
	}
	if (!*path) {
		fprintf(stderr, "twinstack run: --config FILE is required\n");
		usage_run(stderr);
		return -1;
	}
	return 0;
}

int cmd_run(int argc, char **argv)
{
	struct ts_proxy *p = NULL;
	const char *path = NULL;
	sigset_t stop_signals;
	char err[512];
	int ready_fd = -1, ret;

	if ((ret = parse_args(argc, argv, &path, &ready_fd)) != 0)
		return ret > 0 ? EXIT_OK : EXIT_USAGE;
	if ((ret = ts_proxy_new_file(path, &p, err, sizeof(err))) != 0) {
		fprintf(stderr, "%s\n", err);
		ret = ret == -ENOMEM ? EXIT_RUNTIME : EXIT_USAGE;
		goto out;
	}
	if (ts_process_prepare(err, sizeof(err)) != 0)
		fprintf(stderr, "twinstack run: %s (going on with the limits as they are)\n", err);
	/* SIGINT/SIGTERM are held back until the proxy runs, then stop it: a signal during
	 * the start (which can take a while: the TUN's addresses are verified) is not lost. */
	sigemptyset(&stop_signals);
	sigaddset(&stop_signals, SIGINT);
	sigaddset(&stop_signals, SIGTERM);
	sigaddset(&stop_signals, SIGHUP);
	sigprocmask(SIG_BLOCK, &stop_signals, NULL);
	if ((ret = handle_signals(p)) != 0) {
		fprintf(stderr, "twinstack run: sigaction: %s\n", strerror(-ret));
		ret = EXIT_RUNTIME;
		goto out;
	}
	/* A program that is only the proxy keeps only what the proxy needs. */
	(void)ts_proxy_set_least_privilege(p, 1);
	/* The library logs the reason of a failed start. -ELOOP: the config routes the proxy's
	 * own traffic into its TUN (a config error, named in the message). */
	ret = ts_proxy_start(p, err, sizeof(err));
	sigprocmask(SIG_UNBLOCK, &stop_signals, NULL);
	if (ret != 0) {
		ret = ret == -ELOOP ? EXIT_USAGE : EXIT_RUNTIME;
		goto out;
	}
	ready(ready_fd);
	ready_fd = -1;
	ret = ts_proxy_wait(p) == 0 ? EXIT_OK : EXIT_RUNTIME;
out:
	if (ready_fd >= 0)
		close(ready_fd);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	signalled_proxy = NULL;
	ts_proxy_free(p);
	return ret;
}
