/* happy.h — Happy Eyeballs (RFC 8305 section 5) for an outbound's TCP connect to a server known
 * by several addresses: the first address is tried, the next one 250 ms later (the Connection
 * Attempt Delay) if no attempt has connected yet, or at once when an attempt fails; the first
 * to connect wins and the others are closed. Internal to outbound/ (the proxy outbounds use it
 * for a server given by name, direct for a destination given by name); the caller bounds the
 * whole thing with its own deadline.
 */
#ifndef TS_OUTBOUND_HAPPY_H
#define TS_OUTBOUND_HAPPY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/config.h"

struct event_base;
struct happy;

/* RFC 8305 section 8: the recommended Connection Attempt Delay. */
#define HAPPY_DELAY_MS 250
#define HAPPY_MAX_ADDRS 16

/* Called once, from the loop: err 0 and fd (a connected non-blocking socket, now the callee's),
 * or err < 0 (the last attempt's error) and fd -1. The handle is invalid once done starts. */
typedef void (*happy_fn)(void *arg, int err, int fd);

/* Connect to addrs[0..n) (in that order, already interleaved by family; at most
 * HAPPY_MAX_ADDRS used) with sockets from outbound_socket(ob); ob must outlive the attempt.
 * The caller holds one descriptor for the connection; each socket open beside the first takes
 * one of ob->fd_budget (when set) and gives it back when it closes, and with none left the
 * next address waits (the delay again, or an attempt's failure).
 * 0 and *out, or -EINVAL / -ENOMEM (done never called). */
int happy_start(struct event_base *base, const struct ts_outbound *ob,
		const struct sockaddr_storage *addrs, size_t n, uint32_t delay_ms, happy_fn done,
		void *arg, struct happy **out) __attribute__((warn_unused_result));

/* Abandon: every socket closed, done never called. NULL is ignored. */
void happy_cancel(struct happy *h);

#endif
