/* privdrop.c — least privilege after start-up (runtime/privdrop.h): user switch, capability
 * sets reduced with libcap, bounding set shrunk, no_new_privs.
 *
 * Order matters. Shrinking the bounding set needs CAP_SETPCAP and changing ids needs
 * CAP_SETUID/CAP_SETGID, so both happen while the full set is still effective; PR_SET_KEEPCAPS
 * keeps the permitted set across the uid change (the kernel clears the effective set when the
 * effective uid leaves 0, and the permitted set too without keepcaps); only then is the
 * permitted set cut to the kept capabilities, which also gives up CAP_SETPCAP and CAP_SETUID.
 * The result is read back and checked before the call returns.
 */
#include "runtime/privdrop.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <unistd.h>

#define KEEP_MAX 3
#define CAP_SCAN_MAX 64 /* capability numbers fit a 64-bit mask (CAP_LAST_CAP is 40 today) */

static int fail(char *err, size_t errlen, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!err || !errlen)
		return ret;
	n = snprintf(err, errlen, "privileges: ");
	if (n < 0 || (size_t)n >= errlen)
		return ret;
	va_start(ap, fmt);
	vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return ret;
}

/* getpw*_r: "not found" is a NULL result with 0 or one of these errors (getpwnam(3)). */
static bool not_found(int e)
{
	return e == 0 || e == ENOENT || e == ESRCH || e == EBADF || e == EPERM;
}

/* The passwd entry of user (a name or a decimal uid); its name copied to name. */
static int lookup(const char *user, uid_t *uid, gid_t *gid, char *name, size_t namelen,
		  char *err, size_t errlen)
{
	struct passwd pw, *res = NULL;
	char *end, *buf;
	long sz = sysconf(_SC_GETPW_R_SIZE_MAX);
	unsigned long n;
	int e;

	if (!user || !*user) {
		if (err && errlen)
			snprintf(err, errlen, "user \"\": empty name");
		return -EINVAL;
	}
	if (sz < 16384)
		sz = 16384;
	if (!(buf = malloc((size_t)sz)))
		return -ENOMEM;
	errno = 0;
	n = strtoul(user, &end, 10);
	if (*end == '\0' && user[0] >= '0' && user[0] <= '9' && errno == 0 && n <= (uid_t)-2)
		e = getpwuid_r((uid_t)n, &pw, buf, (size_t)sz, &res);
	else
		e = getpwnam_r(user, &pw, buf, (size_t)sz, &res);
	if (res) {
		*uid = pw.pw_uid;
		*gid = pw.pw_gid;
		if (name && namelen)
			snprintf(name, namelen, "%s", pw.pw_name);
	}
	free(buf);
	if (res)
		return 0;
	if (err && errlen)
		snprintf(err, errlen, not_found(e) ? "user \"%s\": no such user" : "user \"%s\": %s",
			 user, strerror(e));
	return not_found(e) ? -ENOENT : -e;
}

int privdrop_resolve(const char *user, uid_t *uid, gid_t *gid, char *err, size_t errlen)
{
	return lookup(user, uid, gid, NULL, 0, err, errlen);
}

static bool has_flag(cap_t caps, cap_value_t c, cap_flag_t set)
{
	cap_flag_value_t v = CAP_CLEAR;

	return cap_get_flag(caps, c, set, &v) == 0 && v == CAP_SET;
}

static const char *cap_label(cap_value_t c, char *buf, size_t len)
{
	char *s = cap_to_name(c);

	snprintf(buf, len, "%s", s ? s : "?");
	cap_free(s);
	return buf;
}

/* Everything the drop needs is there: CAP_SETPCAP (bounding set; without it, and without a
 * user switch, the bounding set is left as it is: *bnd false), CAP_SETUID and CAP_SETGID
 * (switch) effective, and the kept capabilities permitted (cap_set_proc cannot add any). A
 * program given only the kept capabilities as file capabilities (setcap) runs without
 * CAP_SETPCAP: it still loses everything else, and no_new_privs means no execve could use a
 * bounding set anyway. */
static int check_caps(const cap_value_t *keep, int nkeep, bool sw, bool *bnd, char *err,
		      size_t errlen)
{
	const cap_value_t need[] = { CAP_SETPCAP, CAP_SETGID, CAP_SETUID };
	cap_t caps = cap_get_proc();
	char name[32];
	int ret = 0;

	if (!caps)
		return fail(err, errlen, -errno, "cap_get_proc: %s", strerror(errno));
	*bnd = has_flag(caps, CAP_SETPCAP, CAP_EFFECTIVE);
	for (int i = 1; i < (sw ? 3 : 1) && ret == 0; i++)
		if (!has_flag(caps, need[i], CAP_EFFECTIVE))
			ret = fail(err, errlen, -EPERM, "the process lacks %s (needed to %s): start "
				   "it as root", cap_label(need[i], name, sizeof(name)),
				   i == 0 ? "limit the capability bounding set" :
					    "switch to the configured user");
	for (int i = 0; i < nkeep && ret == 0; i++)
		if (!has_flag(caps, keep[i], CAP_PERMITTED))
			ret = fail(err, errlen, -EPERM, "the process lacks %s, which the proxy needs "
				   "while it runs: start it as root",
				   cap_label(keep[i], name, sizeof(name)));
	cap_free(caps);
	return ret;
}

static bool kept(const cap_value_t *keep, int nkeep, cap_value_t c)
{
	for (int i = 0; i < nkeep; i++)
		if (keep[i] == c)
			return true;
	return false;
}

/* Remove every capability but the kept ones from the bounding set (needs CAP_SETPCAP). */
static int drop_bounding(const cap_value_t *keep, int nkeep, char *err, size_t errlen)
{
	char name[32];

	for (cap_value_t c = 0; c < CAP_SCAN_MAX; c++) {
		int in = cap_get_bound(c);
		if (in < 0)
			break; /* past the kernel's last capability */
		if (in == 0 || kept(keep, nkeep, c))
			continue;
		if (cap_drop_bound(c) != 0)
			return fail(err, errlen, -errno, "dropping %s from the bounding set: %s",
				    cap_label(c, name, sizeof(name)), strerror(errno));
	}
	return 0;
}

/* Groups, gid, uid: in this order, since each step needs the privilege the next one drops.
 * PR_SET_KEEPCAPS keeps the permitted set across the uid change. */
static int switch_user(const char *name, uid_t uid, gid_t gid, char *err, size_t errlen)
{
	uid_t r, e, s;
	gid_t rg, eg, sg;

	if (prctl(PR_SET_KEEPCAPS, 1L, 0L, 0L, 0L) != 0)
		return fail(err, errlen, -errno, "PR_SET_KEEPCAPS: %s", strerror(errno));
	if (initgroups(name, gid) != 0)
		return fail(err, errlen, -errno, "groups of user \"%s\": %s", name,
			    strerror(errno));
	if (setresgid(gid, gid, gid) != 0)
		return fail(err, errlen, -errno, "setresgid(%u): %s", (unsigned)gid,
			    strerror(errno));
	if (setresuid(uid, uid, uid) != 0)
		return fail(err, errlen, -errno, "setresuid(%u): %s", (unsigned)uid,
			    strerror(errno));
	if (getresuid(&r, &e, &s) != 0 || getresgid(&rg, &eg, &sg) != 0 || r != uid || e != uid ||
	    s != uid || rg != gid || eg != gid || sg != gid)
		return fail(err, errlen, -EPERM, "user \"%s\": ids did not change", name);
	return 0;
}

/* permitted = effective = keep, inheritable empty. */
static int set_caps(const cap_value_t *keep, int nkeep, char *err, size_t errlen)
{
	cap_t caps = cap_init();
	int ret = 0;

	if (!caps)
		return fail(err, errlen, -errno, "cap_init: %s", strerror(errno));
	if (cap_set_flag(caps, CAP_PERMITTED, nkeep, keep, CAP_SET) != 0 ||
	    cap_set_flag(caps, CAP_EFFECTIVE, nkeep, keep, CAP_SET) != 0 || cap_set_proc(caps) != 0)
		ret = fail(err, errlen, -errno, "cap_set_proc: %s", strerror(errno));
	cap_free(caps);
	return ret;
}

/* Read the result back: exactly keep in permitted and effective, nothing inheritable, the
 * bounding set keep or less, and (after a switch) no way back to uid 0. */
static int verify(const cap_value_t *keep, int nkeep, bool sw, bool bnd, char *err,
		  size_t errlen)
{
	cap_t want = cap_init(), have = cap_get_proc();
	int ret = 0;

	if (!want || !have) {
		ret = fail(err, errlen, -ENOMEM, "reading capabilities back: %s", strerror(errno));
		goto out;
	}
	if (cap_set_flag(want, CAP_PERMITTED, nkeep, keep, CAP_SET) != 0 ||
	    cap_set_flag(want, CAP_EFFECTIVE, nkeep, keep, CAP_SET) != 0 ||
	    cap_compare(want, have) != 0) {
		ret = fail(err, errlen, -EPERM, "capabilities did not come out as asked");
		goto out;
	}
	for (cap_value_t c = 0; bnd && c < CAP_SCAN_MAX && cap_get_bound(c) >= 0; c++)
		if (cap_get_bound(c) == 1 && !kept(keep, nkeep, c)) {
			ret = fail(err, errlen, -EPERM, "bounding set still holds capability %d",
				   (int)c);
			goto out;
		}
	if (sw && getuid() != 0 && setuid(0) == 0)
		ret = fail(err, errlen, -EPERM, "uid 0 could be regained after the switch");
out:
	cap_free(want);
	cap_free(have);
	return ret;
}

static int check_config(const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return fail(err, errlen, -errno, "config file %s would not be readable for a "
			    "reload as uid %u: %s", path, (unsigned)geteuid(), strerror(errno));
	close(fd);
	return 0;
}

int privdrop_apply(const struct privdrop_opts *o, char *err, size_t errlen)
{
	cap_value_t keep[KEEP_MAX] = { CAP_NET_ADMIN, CAP_NET_RAW };
	int nkeep = 2, ret;
	char name[256] = "", lerr[192];
	uid_t uid = 0, r, e, s;
	gid_t gid = 0, rg, eg, sg;
	bool sw = false, bnd = false;

	if (err && errlen)
		err[0] = '\0';
	if (o->keep_bind_service)
		keep[nkeep++] = CAP_NET_BIND_SERVICE;
	if (o->user && *o->user) {
		if ((ret = lookup(o->user, &uid, &gid, name, sizeof(name), lerr, sizeof(lerr))) != 0)
			return fail(err, errlen, ret, "%s", lerr);
		if (getresuid(&r, &e, &s) != 0 || getresgid(&rg, &eg, &sg) != 0)
			return fail(err, errlen, -errno, "getresuid: %s", strerror(errno));
		sw = !(r == uid && e == uid && s == uid && rg == gid && eg == gid && sg == gid);
	}
	if ((ret = check_caps(keep, nkeep, sw, &bnd, err, errlen)) != 0 ||
	    (bnd && (ret = drop_bounding(keep, nkeep, err, errlen)) != 0))
		return ret;
	if (cap_reset_ambient() != 0 && errno != EINVAL) /* EINVAL: no ambient set (< 4.3) */
		return fail(err, errlen, -errno, "clearing the ambient set: %s", strerror(errno));
	if (sw && (ret = switch_user(name, uid, gid, err, errlen)) != 0)
		return ret;
	if ((ret = set_caps(keep, nkeep, err, errlen)) != 0)
		return ret;
	if (prctl(PR_SET_KEEPCAPS, 0L, 0L, 0L, 0L) != 0 ||
	    prctl(PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L) != 0)
		return fail(err, errlen, -errno, "prctl: %s", strerror(errno));
	if ((ret = verify(keep, nkeep, sw, bnd, err, errlen)) != 0)
		return ret;
	if (o->config_path && (ret = check_config(o->config_path, err, errlen)) != 0)
		return ret;
	for (size_t i = 0; o->config_path && i < o->n_more_paths; i++)
		if ((ret = check_config(o->more_paths[i], err, errlen)) != 0)
			return ret;
	return 0;
}

void privdrop_raise_effective(void)
{
	cap_t c = cap_get_proc();
	cap_flag_value_t v;

	if (!c)
		return;
	for (cap_value_t i = 0; i <= CAP_LAST_CAP; i++) {
		if (cap_get_flag(c, i, CAP_PERMITTED, &v) == 0 && v == CAP_SET)
			cap_set_flag(c, CAP_EFFECTIVE, 1, &i, CAP_SET);
	}
	(void)cap_set_proc(c);
	cap_free(c);
}

int privdrop_caps_text(char *buf, size_t len)
{
	cap_t caps = cap_get_proc();
	size_t pos = 0;
	int ret = 0;

	if (!caps)
		return -errno;
	if (len)
		buf[0] = '\0';
	for (cap_value_t c = 0; c < CAP_SCAN_MAX && ret == 0; c++) {
		cap_flag_value_t v;
		if (cap_get_flag(caps, c, CAP_EFFECTIVE, &v) != 0)
			break; /* past libcap's last capability */
		if (v != CAP_SET)
			continue;
		char *s = cap_to_name(c);
		int n = s ? snprintf(buf + pos, len - pos, "%s%s", pos ? "," : "", s) : -1;
		if (!s)
			ret = -ENOMEM;
		else if (n < 0 || (size_t)n >= len - pos)
			ret = -ENOSPC;
		else
			pos += (size_t)n;
		cap_free(s);
	}
	cap_free(caps);
	return ret;
}
