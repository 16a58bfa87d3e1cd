/* privdrop.h — least privilege after start-up: switch to the configured user (if any) and
 * keep only the capabilities a running proxy uses.
 *
 * Kept: CAP_NET_ADMIN (routing rules and routes, SO_MARK, SO_SNDBUFFORCE, sysctls of the
 * network namespace) and CAP_NET_RAW, plus CAP_NET_BIND_SERVICE when asked (a stats port below
 * 1024 that is listened on again). Everything else leaves the permitted, effective and
 * bounding sets; the inheritable and ambient sets are emptied and no_new_privs is set, so no
 * execve (setuid binary, file capabilities) can give anything back.
 *
 * Threads: capabilities (and the bounding set, securebits, keepcaps) are per thread. Call
 * privdrop_apply on the thread that goes on to create every other thread of the proxy, before
 * any of them exists: threads created after the call inherit the reduced sets. A thread that
 * already exists keeps its capabilities. The uid and gid changes are process-wide (glibc
 * applies setresuid/setresgid/setgroups to every thread).
 *
 * Everything that needs more than the kept set (opening the TUN, /sys rps_cpus files, the
 * autoroute lock, listening on the stats port) must be done before the call; what must be
 * re-opened later must be reachable as the new user.
 */
#ifndef TS_RUNTIME_PRIVDROP_H
#define TS_RUNTIME_PRIVDROP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct privdrop_opts {
	const char *user;        /* name or numeric uid; NULL or "" = keep the uid */
	bool keep_bind_service;  /* also keep CAP_NET_BIND_SERVICE (stats port < 1024) */
	const char *config_path; /* NULL: none; else must be readable after the drop (reload) */
	const char *const *more_paths; /* files the config names (rule sets): the same check */
	size_t n_more_paths;
};

/* Look user up (a name, or a decimal uid) in the passwd database: its uid and primary gid.
 * 0, or -errno with one line in err (errlen may be 0): -ENOENT "user \"x\": no such user",
 * -EINVAL empty name, other -errno from the lookup. */
int privdrop_resolve(const char *user, uid_t *uid, gid_t *gid, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/* Drop to o->user (its groups from the group database, then gid, then uid: real, effective
 * and saved) keeping the capabilities named above; then check o->config_path opens for
 * reading as the new identity. Irreversible. 0, or -errno with one line starting with
 * "privileges: " in err:
 *   -ENOENT  no such user
 *   -EPERM   the process lacks a capability it needs for this (CAP_SETUID/CAP_SETGID to
 *            change user, the kept ones themselves): run as root, or without "user" and
 *            with those capabilities. Without CAP_SETPCAP (a program given only the kept
 *            capabilities with setcap) the bounding set is left as it is; everything else
 *            happens, and no_new_privs makes the bounding set moot for any execve
 *   -EACCES  the config file would not be readable for a reload (the drop has happened)
 *   other -errno from the kernel
 * On failure the process may be partly reduced: the caller must not go on running. */
int privdrop_apply(const struct privdrop_opts *o, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/* After a failed privdrop_apply: make effective whatever is still permitted, so that the
 * teardown that follows can undo what the start did (remove auto_route's rules, put sysctls
 * back). Best effort, no error. */
void privdrop_raise_effective(void);

/* The calling thread's effective capabilities as "cap_net_admin,cap_net_raw" (libcap names,
 * in capability number order; "" when empty). 0, -ENOSPC when len is too short, or -errno. */
int privdrop_caps_text(char *buf, size_t len) __attribute__((warn_unused_result));

#endif
