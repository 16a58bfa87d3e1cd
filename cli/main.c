/* main.c — the twinstack binary: global options and a table of subcommands.
 *
 * Exit codes, across every subcommand:
 *   0  success
 *   1  runtime failure (out of memory, a device or socket that fails at run time, ...)
 *   2  bad usage or bad config (unknown subcommand or option, missing/unreadable config file,
 *      a config value that is wrong or statically impossible)
 * A subcommand is one row of `subcommands[]`.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/config.h"
#include "core/evmem.h"
#include "core/libmem.h"
#include "core/rss.h"
#include "runtime/autoroute.h"
#include "runtime/privdrop.h"

struct subcommand {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv); /* argv[0] is the subcommand's name */
	void (*usage)(FILE *out);
};

/* ---- check -------------------------------------------------------------------------------- */

static void usage_check(FILE *out)
{
	fputs("usage: twinstack check --config FILE\n"
	      "\n"
	      "Parse and validate FILE (docs/config.md) without touching the system, then print\n"
	      "a one-line summary. Exit 0 if the config is valid, 2 with a message naming the\n"
	      "JSON path if it is not (or if FILE cannot be read), 1 on a runtime failure.\n"
	      "\n"
	      "options:\n"
	      "  -c, --config FILE   the config file to check (required)\n"
	      "  -h, --help          this text\n",
	      out);
}

int cli_take_option(int argc, char **argv, int *i, const char *lng, const char *shrt,
		    const char **value)
{
	const char *a = argv[*i];
	size_t n = strlen(lng);

	if (strncmp(a, lng, n) == 0 && a[n] == '=') {
		*value = a + n + 1;
		return 1;
	}
	if (strcmp(a, lng) != 0 && strcmp(a, shrt) != 0)
		return 0;
	if (*i + 1 >= argc)
		return -1;
	*value = argv[++*i];
	return 1;
}

int cli_parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (s[0] < '0' || s[0] > '9')
		return -EINVAL;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

static int cmd_check(int argc, char **argv)
{
	const char *path = NULL;
	char err[TS_ERRLEN], *summary;
	size_t summary_len;
	struct ts_config cfg;
	uid_t uid;
	gid_t gid;
	int ret;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_check(stdout);
			return EXIT_OK;
		}
		ret = cli_take_option(argc, argv, &i, "--config", "-c", &path);
		if (ret < 0) {
			fprintf(stderr, "twinstack check: %s needs a FILE argument\n", argv[i]);
			return EXIT_USAGE;
		}
		if (ret == 0) {
			fprintf(stderr, "twinstack check: unexpected argument '%s'\n", argv[i]);
			usage_check(stderr);
			return EXIT_USAGE;
		}
	}
	if (!path) {
		fprintf(stderr, "twinstack check: --config FILE is required\n");
		usage_check(stderr);
		return EXIT_USAGE;
	}
	ret = config_load_file(path, &cfg, err, sizeof(err));
	if (ret != 0) {
		fprintf(stderr, "%s\n", err[0] ? err : "config: failed");
		return ret == -ENOMEM ? EXIT_RUNTIME : EXIT_USAGE;
	}
	/* What `run` refuses as a config error before it touches anything, check refuses too. */
	if (cfg.user[0] && (ret = privdrop_resolve(cfg.user, &uid, &gid, err, sizeof(err))) != 0) {
		fprintf(stderr, "config: $.user: %s\n", err[0] ? err : strerror(-ret));
		config_fini(&cfg);
		return ret == -ENOENT || ret == -EINVAL ? EXIT_USAGE : EXIT_RUNTIME;
	}
	summary_len = config_summary_size(&cfg); /* the line is never cut */
	summary = malloc(summary_len);
	if (!summary) {
		fprintf(stderr, "twinstack check: out of memory\n");
		config_fini(&cfg);
		return EXIT_RUNTIME;
	}
	printf("config ok: %s\n", config_summary(&cfg, summary, summary_len));
	free(summary);
	config_fini(&cfg);
	return EXIT_OK;
}

/* ---- cleanup ------------------------------------------------------------------------------ */

static void usage_cleanup(FILE *out)
{
	fputs("usage: twinstack cleanup\n"
	      "\n"
	      "Remove the policy rules and routes tun.auto_route installed (routing protocol 116)\n"
	      "that a proxy killed without its own cleanup (SIGKILL, a crash, a power cut of its\n"
	      "container) left in this network namespace. Refused, touching nothing, while a\n"
	      "running proxy owns them (it holds @twinstack-autoroute). Every start of a proxy\n"
	      "does the same; this is for a namespace no proxy will start in again. Needs\n"
	      "CAP_NET_ADMIN. Exit 0 when nothing of the kind is left (removed or none found), 1\n"
	      "when a running proxy owns them or a removal failed.\n"
	      "\n"
	      "options:\n"
	      "  -h, --help          this text\n",
	      out);
}

static int cmd_cleanup(int argc, char **argv)
{
	char err[TS_ERRLEN];
	struct log lg;
	int ret;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_cleanup(stdout);
			return EXIT_OK;
		}
		fprintf(stderr, "twinstack cleanup: unexpected argument '%s'\n", argv[i]);
		usage_cleanup(stderr);
		return EXIT_USAGE;
	}
	log_init(&lg, LOG_LEVEL_WARN, STDERR_FILENO); /* what failed; the summary is ours */
	ret = autoroute_sweep(&lg, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "twinstack cleanup: %s%s\n", err[0] ? err : strerror(-ret),
			ret == -EBUSY ? "; nothing removed" : "");
		return EXIT_RUNTIME;
	}
	if (ret == 0)
		printf("auto_route: nothing to remove\n");
	else
		printf("auto_route: removed %d rules and routes a killed proxy left\n", ret);
	return EXIT_OK;
}

/* ---- the table ---------------------------------------------------------------------------- */

static const struct subcommand subcommands[] = {
	{ "check", "validate a config file and print a one-line summary", cmd_check, usage_check },
	{ "run", "run the proxy: TUN device, stack, dispatcher, outbounds, stats", cmd_run,
	  usage_run },
	{ "cleanup", "remove auto_route's rules and routes a killed proxy left behind",
	  cmd_cleanup, usage_cleanup },
	{ "load", "benchmark traffic: echo servers and load clients, JSON out", cmd_load,
	  usage_load },
	{ "bench", "measure both stacks and two baselines in a namespace testbed", cmd_bench,
	  usage_bench },
	{ "reflect", "address-swapping TUN reflector: the one-TUN-crossing ceiling", cmd_reflect,
	  usage_reflect },
	{ "gate", "compare results against a baseline; exit 1 on a regression", cmd_gate,
	  usage_gate },
	{ "redirect", "nftables-redirect baseline: kernel listener, dispatcher, relay",
	  cmd_redirect, usage_redirect },
};

#define N_SUBCOMMANDS (sizeof(subcommands) / sizeof(subcommands[0]))

static void usage(FILE *out)
{
	fputs("usage: twinstack [--help | --version] <command> [options]\n"
	      "\n"
	      "twinstack is a TUN-mode proxy client with two TCP/IP stacks (system, lwip).\n"
	      "\n"
	      "commands:\n",
	      out);
	for (size_t i = 0; i < N_SUBCOMMANDS; i++)
		fprintf(out, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
	fputs("\n"
	      "Run 'twinstack <command> --help' for a command's options.\n"
	      "Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad config.\n",
	      out);
}

static const struct subcommand *find_subcommand(const char *name)
{
	for (size_t i = 0; i < N_SUBCOMMANDS; i++)
		if (strcmp(subcommands[i].name, name) == 0)
			return &subcommands[i];
	return NULL;
}

/* "twinstack help [command]" */
static int cmd_help(int argc, char **argv)
{
	const struct subcommand *sc;

	if (argc < 2) {
		usage(stdout);
		return EXIT_OK;
	}
	if (!(sc = find_subcommand(argv[1]))) {
		fprintf(stderr, "twinstack: unknown command '%s' (see 'twinstack --help')\n",
			argv[1]);
		return EXIT_USAGE;
	}
	sc->usage(stdout);
	return EXIT_OK;
}

/* The proxy runs without glibc's per-thread cache of freed small blocks (core/rss.h): after a
 * load its blocks pinned a page each, and the cache can only be switched off when the process
 * starts. So `run` executes itself again, once, with the setting added to GLIBC_TUNABLES,
 * unless the environment already sizes the cache (that choice is kept; it also ends the
 * recursion). If anything fails the proxy runs as it is, with the cache. */
static void reexec_without_tcache(char **argv)
{
	char val[1024];

	if (rss_tunables_tcache_off(getenv("GLIBC_TUNABLES"), val, sizeof(val)) != 0 ||
	    setenv("GLIBC_TUNABLES", val, 1) != 0)
		return;
	execv("/proc/self/exe", argv);
	/* exec failed: the proxy runs with the cache (the variable, left set, only sizes the
	 * caches of programs it may start) */
}

/* The kernel names a process after the file it executes, "exe" after /proc/self/exe: give
 * the proxy a name again, argv[0]'s last part (the file's name when started the usual way),
 * which ps, top and pkill show and match. */
static void keep_name(const char *argv0)
{
	const char *base = strrchr(argv0, '/');

	base = base ? base + 1 : argv0;
	if (*base)
		(void)prctl(PR_SET_NAME, base, 0, 0, 0);
}

int main(int argc, char **argv)
{
	const struct subcommand *sc;

	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
		return cmd_help(1, argv + 1);
	if (strcmp(argv[1], "help") == 0)
		return cmd_help(argc - 1, argv + 1);
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
		printf("twinstack %s\n", TS_VERSION);
		return EXIT_OK;
	}
	if (!(sc = find_subcommand(argv[1]))) {
		fprintf(stderr, "twinstack: unknown %s '%s' (see 'twinstack --help')\n",
			argv[1][0] == '-' ? "option" : "command", argv[1]);
		return EXIT_USAGE;
	}
	if (strcmp(argv[1], "run") == 0) {
		reexec_without_tcache(argv);
		keep_name(argv[0]);
	}
	/* libevent's per-descriptor records off the heap (core/evmem.h). */
	if (evmem_install() != 0) {
		/* no region: libevent keeps malloc, which costs memory after a load, nothing else */
	}
	/* c-ares', OpenSSL's and nghttp2's allocations counted (core/libmem.h). */
	if (libmem_install() != 0) {
		/* c-ares refused its init: the libraries keep their own allocators */
	}
	int ret = sc->run(argc - 1, argv + 1);
	/* Output that never reached its destination (a full disk, a closed pipe) is a failure. */
	if (fflush(stdout) != 0 && ret == EXIT_OK)
		ret = EXIT_RUNTIME;
	return ret;
}
