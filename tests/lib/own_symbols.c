/* own_symbols.c — linked into the example by tests/lib/example.sh: a program with its own
 * functions named like lwIP's (tcp_new) and twinstack's internals (log_init). The library keeps
 * its internals local, so both links succeed (no duplicate definition with libtwinstack.a) and
 * both sides call their own functions (nothing interposed into libtwinstack.so). A constructor
 * calls them and reports on stderr, which the test reads. */
#include <stdio.h>

int tcp_new(int x);
int log_init(int x);
void own_symbols_check(void);

int tcp_new(int x)
{
	return x + 1;
}

int log_init(int x)
{
	return x * 2;
}

__attribute__((constructor)) void own_symbols_check(void)
{
	if (tcp_new(41) == 42 && log_init(21) == 42)
		fprintf(stderr, "own_symbols: tcp_new and log_init are the program's\n");
}
