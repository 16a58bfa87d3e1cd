/* cli.h — shared pieces of the twinstack subcommands. */
#ifndef TS_CLI_CLI_H
#define TS_CLI_CLI_H

#include <stdint.h>
#include <stdio.h>

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* Matches "--name VALUE", "--name=VALUE" or "-s VALUE" at argv[*i]; advances *i past it.
 * Returns 1 matched (*value set), 0 not this option, -1 value missing. */
int cli_take_option(int argc, char **argv, int *i, const char *lng, const char *shrt,
		    const char **value);

/* A decimal number, digits only (no sign, no space, nothing after). 0 or -EINVAL. */
int cli_parse_u64(const char *s, uint64_t *out);

int cmd_run(int argc, char **argv);
void usage_run(FILE *out);

int cmd_load(int argc, char **argv);
void usage_load(FILE *out);
int cmd_bench(int argc, char **argv);
void usage_bench(FILE *out);
int cmd_reflect(int argc, char **argv);
void usage_reflect(FILE *out);
int cmd_gate(int argc, char **argv);
void usage_gate(FILE *out);
int cmd_redirect(int argc, char **argv);
void usage_redirect(FILE *out);

#endif
