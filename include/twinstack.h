/* twinstack.h — the public C API of libtwinstack: a TUN-mode proxy (two TCP/IP stacks, the
 * kernel-NAT "system" stack and the lwIP userspace stack, behind one interface) that an
 * application embeds.
 *
 * A proxy is created from a JSON config (the same document `twinstack run --config` reads; see
 * docs/config.md), optionally given a TUN fd its caller opened, started, stopped and freed:
 *
 *     struct ts_proxy *p;
 *     char err[256];
 *     if (ts_proxy_new_json(json, strlen(json), &p, err, sizeof(err)) != 0) { puts(err); ... }
 *     if (ts_proxy_start(p, err, sizeof(err)) != 0) { puts(err); ts_proxy_free(p); ... }
 *     ...                                  the proxy carries traffic on threads of its own
 *     ts_proxy_stop(p);                    from any thread, or a signal handler
 *     int why = ts_proxy_wait(p);          0, or the -errno that stopped it
 *     ts_proxy_free(p);
 *
 * Conventions, for every function below:
 * - Errors are returned as -errno; functions that take (err, errlen) also write one line of
 *   text there (NUL-terminated; errlen may be 0). Nothing here calls exit() or abort() on any
 *   input or resource failure.
 * - Strings passed in are copied unless a prototype says otherwise; pointers returned are
 *   owned by the library unless a prototype says "the caller frees it with ts_free()".
 * - The library installs no signal handlers and changes no process-wide state (RLIMIT_NOFILE,
 *   signal dispositions, user ids, capabilities) except through ts_process_prepare() and
 *   ts_proxy_set_least_privilege() (or a config's "user"), which the caller may choose. Threads the library starts have every signal blocked, so SIGPIPE from a peer that
 *   went away never reaches the process from them.
 * - Versioning: the major version is the SONAME's (libtwinstack.so.TS_API_MAJOR); a minor
 *   version adds functions and never changes an existing prototype or behaviour.
 */
#ifndef TWINSTACK_H
#define TWINSTACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TS_API __attribute__((visibility("default")))
#else
#define TS_API
#endif

#define TS_API_MAJOR 1
#define TS_API_MINOR 0

/* ---- the library ------------------------------------------------------------------------- */

/* The library's version, "MAJOR.MINOR.PATCH". A static string; any thread. */
TS_API const char *ts_version(void);

/* The stacks compiled in ("system", "lwip"): a static NULL-terminated array; any thread. */
TS_API const char *const *ts_stack_names(void);

/* Free memory the library returned with "the caller frees it with ts_free()". NULL is fine. */
TS_API void ts_free(void *mem);

/* Optional process-wide preparation for a program whose main purpose is the proxy (the
 * `twinstack` CLI calls it): raise the soft RLIMIT_NOFILE to the hard limit, so the session
 * fd budget can use it, and ignore SIGPIPE. Call before starting any proxy, from the main
 * thread, with no other thread changing these. 0, or -errno with err. */
TS_API int ts_process_prepare(char *err, size_t errlen);

/* ---- a proxy ----------------------------------------------------------------------------- */

struct ts_proxy;

/* Create a proxy from a JSON config of len bytes (need not be NUL-terminated). The config is
 * fully validated here: on a bad config -EINVAL with the same one-line message as
 * `twinstack check` (it names the JSON path, e.g. "$.tun.mtu: ..."); -ENOMEM. Nothing is
 * opened or started yet. On success *out is the caller's, freed with ts_proxy_free(). Any
 * thread; json is not retained. */
TS_API int ts_proxy_new_json(const char *json, size_t len, struct ts_proxy **out, char *err,
			     size_t errlen);

/* The same from a file: also -ENOENT, -EACCES, ... when the file cannot be read. */
TS_API int ts_proxy_new_file(const char *path, struct ts_proxy **out, char *err,
			     size_t errlen);

/* Log lines: level is one of TS_LOG_*; line is one formatted line without its newline,
 * NUL-terminated, len bytes, borrowed for the call. Called from the proxy's threads (and from
 * the caller's thread inside ts_proxy_start), possibly concurrently: the callback must be
 * thread-safe and should not call back into this proxy (ts_proxy_stats_json and
 * ts_proxy_reload from it return -EDEADLK, or -ESRCH before the proxy runs). */
enum ts_log_level {
	TS_LOG_ERROR = 0,
	TS_LOG_WARN = 1,
	TS_LOG_INFO = 2,
	TS_LOG_DEBUG = 3,
};
typedef void (*ts_log_fn)(void *arg, int level, const char *line, size_t len);

/* Send log lines to fn instead of standard error (the default). fn NULL: back to standard
 * error. Lines less severe than the config's log.level are not formatted. Before
 * ts_proxy_start only: -EBUSY afterwards. */
TS_API int ts_proxy_set_log(struct ts_proxy *p, ts_log_fn fn, void *arg);

/* Called on every socket the proxy opens toward the network (outbound TCP and UDP sockets,
 * DNS upstream sockets, proxy servers' control sockets) after the config's routing mark and
 * interface binding were applied and before it connects or sends: family is AF_INET or
 * AF_INET6, type SOCK_STREAM or SOCK_DGRAM. Return 0 to go on; a negative -errno fails that
 * socket (the session is refused with a RST, or the datagram dropped and counted). For
 * Android's VpnService.protect(), where no routing mark works. Called on the proxy's threads;
 * fd stays owned by the proxy. Before ts_proxy_start only: -EBUSY afterwards. */
typedef int (*ts_socket_fn)(void *arg, int fd, int family, int type);
TS_API int ts_proxy_set_socket_hook(struct ts_proxy *p, ts_socket_fn fn, void *arg);

/* Destination names: for a program that knows which name an address stands for (its own DNS,
 * a fake-IP table). Called once per new TCP session, and for UDP once per new destination of a
 * session, with the destination the app sent to: family 4 or 6, dst its 4 or 16 bytes in
 * network order, port in host order. Return a name (borrowed: copied before the call returns;
 * 1-255 bytes of letters, digits, '-', '_' and '.'; anything else refuses the connection with
 * a RST or drops the datagram, counted) or NULL to go by address. A named destination is
 * reached by name: a socks5 outbound sends it to the server (ATYP 3, TCP and UDP), an http
 * outbound sends "CONNECT name:port", a direct outbound resolves it (without blocking, with the
 * outbound's domain_strategy) and replies come back from the address the app used. Routing
 * rules still match the address. Called on the proxy's loop thread; must not call into the
 * proxy. Before ts_proxy_start only: -EBUSY afterwards. */
typedef const char *(*ts_namer_fn)(void *arg, int family, const uint8_t *dst, uint16_t port);
TS_API int ts_proxy_set_namer(struct ts_proxy *p, ts_namer_fn fn, void *arg);

/* Least privilege (on != 0): once ts_proxy_start has done what needs more (opening the TUN,
 * auto_route's rules, the stats listener), the process keeps only CAP_NET_ADMIN and
 * CAP_NET_RAW (plus CAP_NET_BIND_SERVICE for a stats port below 1024), sets no_new_privs, and
 * runs as the config's "user" if one is given ("user" alone implies this). This changes the
 * whole PROCESS, not just the proxy: the user and group ids of every thread, and the
 * capabilities of the calling thread and of every thread created after it, the proxy's
 * included; threads that already exist keep theirs. For programs that are the proxy (the CLI
 * does this); a program that needs its privileges later must not. A config loaded from a file
 * must stay readable as the new user (reload reads it again): checked at start. Before
 * ts_proxy_start only: -EBUSY afterwards. */
TS_API int ts_proxy_set_least_privilege(struct ts_proxy *p, int on);

/* Run on a TUN device the caller opened and configured (as Android's VpnService or a sandbox
 * hands one over) instead of creating one from the config's "tun" section. fd stays the
 * caller's: the proxy makes it non-blocking and never closes it; close it after
 * ts_proxy_free(). The config's tun.address / tun.address6 must be the addresses the caller
 * gave the device (the system stack binds its listeners on them and checks they are there).
 * The proxy asks the fd for IFF_VNET_HDR, IFF_MULTI_QUEUE (TUNGETIFF) and the virtio header
 * size (TUNGETVNETHDRSZ) instead of assuming them, and never changes addresses, routes, MTU,
 * txqueuelen, offload settings or receive packet steering of a device it did not create: the
 * config's settings for those are ignored, and ts_proxy_start logs one warning naming each
 * one that was set and cannot be honoured (also in /stats as "tun.unavailable"). The fd is
 * examined at start: ts_proxy_start fails with -EBADF when it is not a TUN device, -EINVAL
 * for a TAP device, an fd without IFF_NO_PI, or a config whose "tun.offload" is "on" on an fd
 * without IFF_VNET_HDR. Here: -EBADF for a negative fd; -EBUSY once started. */
TS_API int ts_proxy_set_tun_fd(struct ts_proxy *p, int fd);

/* Open the TUN (or take the caller's), start the stack, its workers and the stats endpoint,
 * and return once the proxy is ready to carry traffic (every listener bound), with the proxy
 * running on threads of its own. 0, or -errno with one line in err; after a failure the proxy
 * holds nothing but its config: free it (a second start is -EALREADY, as is a start after a
 * successful one; -EBUSY while another thread's start is under way). -EBUSY also when the
 * config asks for the lwIP stack and another lwIP proxy runs in this process (lwIP keeps its
 * state in globals): then nothing was opened or changed. ts_proxy_stop may be called
 * meanwhile from any thread or a signal handler: the proxy then stops as soon as it runs (a
 * stop requested before ts_proxy_start was called is forgotten); ts_proxy_wait and
 * ts_proxy_stats_json called meanwhile wait for the start's outcome. */
TS_API int ts_proxy_start(struct ts_proxy *p, char *err, size_t errlen);

/* Give a running proxy a new configuration: json (len bytes, copied) or, with json NULL, the
 * file it was created from, read again. Outbounds, route rules, DNS upstream, timeouts, the
 * log level and the auto_route options change; live sessions keep the outbound they were
 * routed to and go on undisturbed. Keys that only change with a restart (stack, the TUN's
 * settings, nat, relay, budgets, stats.listen, dns.hijack, user) keep their running values
 * and are listed in the log and in the stats ("reload.kept"). A config that does not load, or
 * whose outbounds would be routed into the TUN, is refused: -EINVAL / -ELOOP (-ENOENT: json
 * NULL and no file) with the one-line message of `twinstack check` in err, and the running
 * configuration goes on. -ESRCH if the proxy is not running. The file is read and proxy
 * servers' names are resolved on the calling thread, so the proxy goes on carrying traffic
 * (its own lookups included) meanwhile. Any thread but the proxy's loop (from its log callback
 * there: -EDEADLK); blocks until the proxy has answered, or has stopped (-ESRCH).
 * The stats show "config.generation" and the last result ("reload.last_result",
 * "reload.last_error"). */
TS_API int ts_proxy_reload(struct ts_proxy *p, const char *json, size_t len, char *err,
			   size_t errlen);

/* Ask a running proxy to read its config file again, as ts_proxy_reload(p, NULL, 0, ...)
 * does (on a thread the proxy starts for it), without waiting for the result (it is logged
 * and shown in the stats); requests that come while one is under way are folded into one more.
 * Async-signal-safe: for a SIGHUP handler. A no-op if the proxy is not running. */
TS_API void ts_proxy_request_reload(struct ts_proxy *p);

/* Ask a running proxy to stop: stop accepting, end every session, leave its loops. Returns at
 * once; idempotent; a no-op before start or after the proxy stopped. Any thread, and
 * async-signal-safe (it stores an atomic flag and writes an eventfd), so a SIGINT handler may
 * call it. */
TS_API void ts_proxy_stop(struct ts_proxy *p);

/* Wait until a started proxy has stopped — on ts_proxy_stop() or on a runtime failure — and
 * return why: 0 for a requested stop, else the -errno of the failure (logged at error level).
 * Returns at once with the same value once stopped, and -EINVAL if never (successfully)
 * started. Any number of threads may wait; not from the proxy's own threads (its log
 * callback), and never concurrently with ts_proxy_free. */
TS_API int ts_proxy_wait(struct ts_proxy *p);

/* Is the proxy running (started, not yet stopped)? Any thread. */
TS_API int ts_proxy_running(const struct ts_proxy *p);

/* The stats document: the same JSON object the /stats endpoint serves (docs/config.md, "stats"),
 * built from live counters. *out is NUL-terminated, *len bytes without the NUL (len may be
 * NULL); the caller frees it with ts_free(). Any thread but the proxy's own (from its log
 * callback, on the loop or inside ts_proxy_start: -EDEADLK): while the proxy runs the document
 * is built on its loop thread and this
 * call waits for it (at most ~1 s: -ETIMEDOUT). After a stop it returns the final figures,
 * taken as the loop stopped; before start, a document of zeros. 0, -ENOMEM. */
TS_API int ts_proxy_stats_json(struct ts_proxy *p, char **out, size_t *len);

/* Stop (if running), wait, release everything: the TUN the proxy created vanishes, a caller's
 * fd is left open. NULL is fine. Not from the proxy's own threads; nothing else may use p
 * during or after this call. */
TS_API void ts_proxy_free(struct ts_proxy *p);

#ifdef __cplusplus
}
#endif

#endif
