/* api.c — the public C API (include/twinstack.h) over the runtime: a proxy's life cycle
 * (new → start → stop → wait → free), the loop thread, cross-thread stop and stats requests,
 * the log and socket hooks, and the optional process preparation. */
#include "twinstack.h"

#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"
#include "core/log.h"
#include "core/tun.h"
#include "runtime/privdrop.h"
#include "runtime/proxy.h"
#include "runtime/reload.h"
#include "stacks/netstack.h"

#define STATS_WAIT_NS (1000LL * 1000 * 1000) /* a stats request waits this long for the loop */

/* ---- the library ------------------------------------------------------------------------- */

const char *ts_version(void)
{
	return TS_VERSION;
}

const char *const *ts_stack_names(void)
{
	return netstack_names();
}

void ts_free(void *mem)
{
	free(mem);
}

int ts_process_prepare(char *err, size_t errlen)
{
	struct rlimit rl;
	int ret;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		goto fail;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			goto fail;
	}
	/* A peer that went away is an EPIPE, not a process exit. */
	signal(SIGPIPE, SIG_IGN);
	return 0;
fail:
	ret = -errno;
	if (err && errlen)
		snprintf(err, errlen, "RLIMIT_NOFILE: %s", strerror(-ret));
	return ret;
}

/* ---- create ------------------------------------------------------------------------------ */

static void write_err(char *err, size_t errlen, const char *msg)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", msg);
}

static int proxy_alloc(struct ts_proxy **out, char *err, size_t errlen)
{
	struct ts_proxy *p = calloc(1, sizeof(*p));

	*out = NULL;
	if (!p) {
		write_err(err, errlen, "out of memory");
		return -ENOMEM;
	}
	config_init(&p->cfg);
	log_init(&p->log, LOG_LEVEL_INFO, STDERR_FILENO);
	p->caller_fd = p->worker_died_fd = p->lock_keep = -1;
	p->live = &p->cfg;
	p->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	p->stats_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	p->reload_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	pthread_mutex_init(&p->lock, NULL);
	pthread_mutex_init(&p->stats_req_lock, NULL);
	pthread_mutex_init(&p->reload_req_lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (p->stop_fd < 0 || p->stats_fd < 0 || p->reload_fd < 0) {
		int ret = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		ts_proxy_free(p);
		return ret;
	}
	*out = p;
	return 0;
}

/* "user" must name a user of this machine (it is a config error, reported like one). */
static int check_user(struct ts_proxy *p, char *err, size_t errlen)
{
	char why[256];
	uid_t uid;
	gid_t gid;

	if (!p->cfg.user[0] || privdrop_resolve(p->cfg.user, &uid, &gid, why, sizeof(why)) == 0)
		return 0;
	if (err && errlen)
		snprintf(err, errlen, "config: $.user: %s", why);
	return -EINVAL;
}

/* load(cfg) filled p->cfg: take its log level, or free p on failure. */
static int proxy_created(struct ts_proxy *p, int ret, struct ts_proxy **out, char *err,
			 size_t errlen)
{
	if (ret == 0)
		ret = check_user(p, err, errlen);
	if (ret != 0) {
		ts_proxy_free(p);
		return ret;
	}
	p->log.level = p->cfg.log_level;
	*out = p;
	return 0;
}

int ts_proxy_new_json(const char *json, size_t len, struct ts_proxy **out, char *err,
		      size_t errlen)
{
	struct ts_proxy *p;
	int ret;

	if (out)
		*out = NULL;
	if (!out || (!json && len)) {
		write_err(err, errlen, "ts_proxy_new_json: no config");
		return -EINVAL;
	}
	if ((ret = proxy_alloc(&p, err, errlen)) != 0)
		return ret;
	ret = config_load_buffer(json ? json : "", len, &p->cfg, err, errlen);
	return proxy_created(p, ret, out, err, errlen);
}

int ts_proxy_new_file(const char *path, struct ts_proxy **out, char *err, size_t errlen)
{
	struct ts_proxy *p;
	int ret;

	if (out)
		*out = NULL;
	if (!out || !path) {
		write_err(err, errlen, "ts_proxy_new_file: no path");
		return -EINVAL;
	}
	if ((ret = proxy_alloc(&p, err, errlen)) != 0)
		return ret;
	ret = config_load_file(path, &p->cfg, err, errlen);
	if (ret == 0 && !(p->config_path = strdup(path))) {
		write_err(err, errlen, "out of memory");
		ret = -ENOMEM;
	}
	return proxy_created(p, ret, out, err, errlen);
}

/* ---- settings before start ------------------------------------------------------------- */

static bool is_new(struct ts_proxy *p)
{
	bool ret;

	pthread_mutex_lock(&p->lock);
	ret = p->state == PROXY_NEW;
	pthread_mutex_unlock(&p->lock);
	return ret;
}

/* struct log's sink: the line without its newline, NUL-terminated, to the caller's function. */
static void log_to_caller(void *arg, enum log_level level, const char *line, size_t len)
{
	struct ts_proxy *p = arg;
	char buf[LOG_LINE_MAX + 1];

	if (len > 0 && line[len - 1] == '\n')
		len--;
	if (len > LOG_LINE_MAX)
		len = LOG_LINE_MAX;
	memcpy(buf, line, len);
	buf[len] = '\0';
	p->log_fn(p->log_arg, (int)level, buf, len);
}

int ts_proxy_set_log(struct ts_proxy *p, ts_log_fn fn, void *arg)
{
	if (!is_new(p))
		return -EBUSY;
	p->log_fn = fn;
	p->log_arg = arg;
	p->log.sink = fn ? log_to_caller : NULL;
	p->log.sink_arg = fn ? p : NULL;
	return 0;
}

int ts_proxy_set_socket_hook(struct ts_proxy *p, ts_socket_fn fn, void *arg)
{
	if (!is_new(p))
		return -EBUSY;
	p->sock_hook.fn = fn;
	p->sock_hook.arg = fn ? arg : NULL;
	return 0;
}

int ts_proxy_set_namer(struct ts_proxy *p, ts_namer_fn fn, void *arg)
{
	if (!is_new(p))
		return -EBUSY;
	p->namer = fn;
	p->namer_arg = fn ? arg : NULL;
	return 0;
}

int ts_proxy_set_least_privilege(struct ts_proxy *p, int on)
{
	if (!is_new(p))
		return -EBUSY;
	p->least_privilege = on != 0;
	return 0;
}

int ts_proxy_set_tun_fd(struct ts_proxy *p, int fd)
{
	if (!is_new(p))
		return -EBUSY;
	if (fd < 0)
		return -EBADF;
	p->caller_fd = fd;
	return 0;
}

/* ---- the loop thread --------------------------------------------------------------------- */

static void drain(int fd)
{
	uint64_t v;

	if (read(fd, &v, sizeof(v)) < 0) {
		/* nothing pending: a spurious wakeup */
	}
}

/* Async-signal-safe: one write to an eventfd we own. */
static void wake(int fd)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) < 0) {
		/* an eventfd cannot be full short of 2^64 - 1 writes */
	}
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
	struct ts_proxy *p = arg;

	(void)what;
	drain(fd);
	log_info(&p->log, "proxy: stop requested");
	proxy_stop_loop(p, 0);
}

/* Answer the stats request waiting in ts_proxy_stats_json (on the loop: the counters are
 * read where they are written, as /stats does). */
static void on_stats(evutil_socket_t fd, short what, void *arg)
{
	struct ts_proxy *p = arg;
	char *json = NULL;
	size_t len = 0;
	int ret;

	(void)what;
	drain(fd);
	ret = proxy_stats_json(p, &json, &len);
	pthread_mutex_lock(&p->lock);
	free(p->stats_json);
	p->stats_json = json;
	p->stats_len = len;
	p->stats_ret = ret;
	p->stats_answered = p->stats_asked;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

static void *reload_thread_main(void *arg);

/* Reloads asked for: a prepared one from ts_proxy_reload (applied here, on the loop, where the
 * dispatcher and the UDP path live), or the signal handler's request, which a thread of its
 * own prepares (reading and resolving may block) and hands back the same way. */
static void on_reload(evutil_socket_t fd, short what, void *arg)
{
	struct ts_proxy *p = arg;
	struct reload_prep *prep;
	char err[TS_ERRLEN], prep_err[TS_ERRLEN];
	bool asked;
	int ret, prep_ret;

	(void)what;
	drain(fd);
	if (atomic_exchange(&p->reload_file_pending, false)) {
		if (atomic_exchange(&p->reload_thread_busy, true)) {
			atomic_store(&p->reload_again, true); /* the running one goes round again */
		} else {
			if (p->reload_thread_made)
				pthread_join(p->reload_thread, NULL); /* it has ended: busy was false */
			p->reload_thread_made = pthread_create(&p->reload_thread, NULL,
							       reload_thread_main, p) == 0;
			if (!p->reload_thread_made) {
				atomic_store(&p->reload_thread_busy, false);
				log_error(&p->log, "reload: no thread to read the config: ignored");
			}
		}
	}
	pthread_mutex_lock(&p->lock);
	asked = p->rl_asked != p->rl_answered;
	prep = p->rl_prep;
	prep_ret = p->rl_prep_ret;
	snprintf(prep_err, sizeof(prep_err), "%s", p->rl_err);
	p->rl_prep = NULL;
	pthread_mutex_unlock(&p->lock);
	if (!asked)
		return;
	err[0] = '\0';
	ret = proxy_reload(p, prep, prep_ret, prep_err, err, sizeof(err));
	pthread_mutex_lock(&p->lock);
	p->rl_ret = ret;
	snprintf(p->rl_err, sizeof(p->rl_err), "%s", err);
	p->rl_answered = p->rl_asked;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

static void *loop_main(void *arg)
{
	struct ts_proxy *p = arg;
	char *json = NULL, err[256];
	size_t len = 0;

	/* tun.rps "auto" reads the CPU clock of the thread that runs the loop: this one. */
	if (rps_auto_start(&p->rps, p->tun, &p->log, "proxy", 0, err, sizeof(err)) != 0)
		log_warn(&p->log, "%s: receive packet steering stays off", err);
	if (event_base_dispatch(p->base) < 0 && !p->stopping) {
		log_error(&p->log, "proxy: the event loop failed");
		p->exit_err = -EIO;
	}
	/* Nobody answers reloads from here on: wake whoever waits for one (a reload thread,
	 * or a queue worker's callback, which proxy_close is about to join). */
	pthread_mutex_lock(&p->lock);
	p->loop_ended = true;
	pthread_cond_broadcast(&p->cond);
	/* A reload being prepared reads the TUN, the resolver and the configuration that
	 * proxy_close frees: it ends first (it then finds the loop ended: -ESRCH). */
	while (p->rl_preparing)
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
	/* The last figures stay readable after the stop (the CLI's exit line, embedders). */
	if (proxy_stats_json(p, &json, &len) != 0)
		json = NULL;
	proxy_close(p);
	if (p->exit_err)
		log_error(&p->log, "proxy: stopped: %s", strerror(-p->exit_err));
	else
		log_info(&p->log, "proxy: stopped");
	pthread_mutex_lock(&p->lock);
	free(p->stats_json);
	p->stats_json = json;
	p->stats_len = json ? len : 0;
	p->stats_ret = json ? 0 : -ENOMEM;
	p->state = PROXY_STOPPED;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void set_state(struct ts_proxy *p, enum proxy_state st)
{
	pthread_mutex_lock(&p->lock);
	p->state = st;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/* The loop's own events, then its thread (every signal blocked, as for the queue workers:
 * signals are the program's, and SIGPIPE must never reach the process from here). */
static int launch(struct ts_proxy *p, char *err, size_t errlen)
{
	sigset_t all, old;
	int ret;

	p->stop_ev = event_new(p->base, p->stop_fd, EV_READ | EV_PERSIST, on_stop, p);
	p->stats_ev = event_new(p->base, p->stats_fd, EV_READ | EV_PERSIST, on_stats, p);
	p->reload_ev = event_new(p->base, p->reload_fd, EV_READ | EV_PERSIST, on_reload, p);
	if (!p->stop_ev || !p->stats_ev || !p->reload_ev || event_add(p->stop_ev, NULL) != 0 ||
	    event_add(p->stats_ev, NULL) != 0 || event_add(p->reload_ev, NULL) != 0) {
		snprintf(err, errlen, "proxy: event loop: out of memory");
		return -ENOMEM;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	/* RUNNING before the thread exists: the loop may stop (and say so) at once. */
	set_state(p, PROXY_RUNNING);
	ret = pthread_create(&p->loop_thread, NULL, loop_main, p);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret != 0) {
		set_state(p, PROXY_STARTING);
		snprintf(err, errlen, "proxy: loop thread: %s", strerror(ret));
		return -ret;
	}
	return 0;
}

int ts_proxy_start(struct ts_proxy *p, char *err, size_t errlen)
{
	char *summary, dev[TS_IFNAME_MAX + 1] = "";
	size_t summary_len;
	int ret;

	pthread_mutex_lock(&p->lock);
	ret = p->state == PROXY_NEW ? 0 : p->state == PROXY_STARTING ? -EBUSY : -EALREADY;
	if (ret == 0) {
		p->state = PROXY_STARTING;
		p->start_thread = pthread_self();
	}
	pthread_mutex_unlock(&p->lock);
	if (ret != 0) {
		write_err(err, errlen, ret == -EBUSY ? "proxy: a start is under way"
						     : "proxy: already started once");
		return ret;
	}
	/* A stop asked before start is forgotten; one asked from now on stops the loop as soon
	 * as it runs. So is a reload asked before start (a no-op while not running). */
	drain(p->stop_fd);
	atomic_store(&p->stop_requested, false);
	drain(p->reload_fd);
	atomic_store(&p->reload_file_pending, false);
	ret = proxy_open(p, err, errlen);
	if (ret == 0) {
		/* The device's own name: tun.name may be a template ("ts%d") the kernel numbered. */
		snprintf(dev, sizeof(dev), "%s", tun_name(p->tun));
		ret = launch(p, err, errlen);
	}
	if (ret != 0) {
		log_error(&p->log, "%s", err && errlen ? err : "proxy: start failed");
		proxy_close(p);
		set_state(p, PROXY_FAILED);
		return ret;
	}
	/* From here the loop thread owns the state: it may already have stopped. */
	summary_len = config_summary_size(&p->cfg); /* the line is never cut */
	if ((summary = malloc(summary_len)) != NULL)
		config_summary(&p->cfg, summary, summary_len);
	if (strcmp(dev, p->cfg.tun.name) != 0)
		log_info(&p->log, "proxy: ready: %s (device %s)", summary ? summary : "", dev);
	else
		log_info(&p->log, "proxy: ready: %s", summary ? summary : "");
	free(summary);
	config_log_rule_sets(&p->cfg, &p->log);
	return 0;
}

/* ---- stop, wait, stats, free --------------------------------------------------------------- */

void ts_proxy_stop(struct ts_proxy *p)
{
	uint64_t one = 1;

	if (!p || atomic_exchange(&p->stop_requested, true))
		return;
	if (write(p->stop_fd, &one, sizeof(one)) < 0) {
		/* an eventfd we own cannot be full short of 2^64 - 1 writes */
	}
}

int ts_proxy_wait(struct ts_proxy *p)
{
	bool join;

	pthread_mutex_lock(&p->lock);
	while (p->state == PROXY_STARTING || p->state == PROXY_RUNNING)
		pthread_cond_wait(&p->cond, &p->lock);
	if (p->state == PROXY_NEW || p->state == PROXY_FAILED) {
		pthread_mutex_unlock(&p->lock);
		return -EINVAL;
	}
	join = !p->joined;
	p->joined = true;
	pthread_mutex_unlock(&p->lock);
	if (join) {
		pthread_join(p->loop_thread, NULL);
		/* A signal's reload thread ends once the loop has (it is answered -ESRCH). */
		if (p->reload_thread_made)
			pthread_join(p->reload_thread, NULL);
		p->reload_thread_made = false;
	}
	return p->exit_err;
}

int ts_proxy_running(const struct ts_proxy *p)
{
	struct ts_proxy *mp = (struct ts_proxy *)p; /* the lock only */
	int ret;

	pthread_mutex_lock(&mp->lock);
	ret = p->state == PROXY_RUNNING;
	pthread_mutex_unlock(&mp->lock);
	return ret;
}

/* After the stop: a copy of the document the loop left (p->lock held). */
static int final_doc(struct ts_proxy *p, char **out, size_t *outlen)
{
	char *c;

	if (!p->stats_json)
		return p->stats_ret;
	if (!(c = malloc(p->stats_len + 1)))
		return -ENOMEM;
	memcpy(c, p->stats_json, p->stats_len + 1);
	*out = c;
	if (outlen)
		*outlen = p->stats_len;
	return 0;
}

/* While running: ask the loop and wait for its answer (or its stop). Called with p->lock. */
static int ask_loop(struct ts_proxy *p, char **out, size_t *len)
{
	uint64_t one = 1, seq = ++p->stats_asked;
	struct timespec deadline;

	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += STATS_WAIT_NS / 1000000000LL;
	if (write(p->stats_fd, &one, sizeof(one)) < 0) {
		/* cannot be full; the loop reads it */
	}
	while (p->stats_answered < seq && p->state == PROXY_RUNNING)
		if (pthread_cond_timedwait(&p->cond, &p->lock, &deadline) == ETIMEDOUT)
			return -ETIMEDOUT;
	if (p->stats_answered < seq || p->state != PROXY_RUNNING) /* stopped: the final one */
		return final_doc(p, out, len);
	if (p->stats_ret != 0)
		return p->stats_ret;
	*out = p->stats_json; /* the answer is the caller's now */
	if (len)
		*len = p->stats_len;
	p->stats_json = NULL;
	return 0;
}

int ts_proxy_stats_json(struct ts_proxy *p, char **out, size_t *len)
{
	int ret;

	*out = NULL;
	/* From the proxy's own loop (its log callback): the loop cannot answer itself. */
	if (ts_proxy_running(p) && pthread_equal(pthread_self(), p->loop_thread))
		return -EDEADLK;
	pthread_mutex_lock(&p->stats_req_lock);
	pthread_mutex_lock(&p->lock);
	/* The parts are being built: wait for the outcome, unless this is the starting thread
	 * itself (its log callback): it would wait for itself. */
	while (p->state == PROXY_STARTING) {
		if (pthread_equal(pthread_self(), p->start_thread)) {
			pthread_mutex_unlock(&p->lock);
			pthread_mutex_unlock(&p->stats_req_lock);
			return -EDEADLK;
		}
		pthread_cond_wait(&p->cond, &p->lock);
	}
	if (p->state == PROXY_RUNNING) {
		ret = ask_loop(p, out, len);
	} else if (p->state == PROXY_STOPPED) {
		ret = final_doc(p, out, len);
	} else {
		/* Nothing runs (new, or a failed start took everything down): a document of
		 * zeros and the config, read under the lock. */
		ret = proxy_stats_json(p, out, len);
	}
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&p->stats_req_lock);
	return ret;
}

void ts_proxy_free(struct ts_proxy *p)
{
	if (!p)
		return;
	if (ts_proxy_running(p))
		ts_proxy_stop(p);
	pthread_mutex_lock(&p->lock);
	bool started = p->state == PROXY_RUNNING || p->state == PROXY_STOPPED;
	pthread_mutex_unlock(&p->lock);
	/* wait joins the loop thread, whoever calls it first; free must not race a wait. */
	if (started)
		ts_proxy_wait(p);
	proxy_close(p); /* a no-op unless nothing ever ran it */
	free(p->stats_json);
	free(p->config_path);
	config_fini(&p->cfg);
	if (p->stop_fd >= 0)
		close(p->stop_fd);
	if (p->stats_fd >= 0)
		close(p->stats_fd);
	if (p->reload_fd >= 0)
		close(p->reload_fd);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->stats_req_lock);
	pthread_mutex_destroy(&p->reload_req_lock);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

/* ---- reload ------------------------------------------------------------------------------ */

int ts_proxy_reload(struct ts_proxy *p, const char *json, size_t len, char *err, size_t errlen)
{
	struct reload_prep *prep = NULL;
	char perr[TS_ERRLEN] = "";
	uint64_t ticket;
	int ret, pret;

	if (!p)
		return -EINVAL;
	/* From the proxy's own loop (its log callback): the loop cannot answer itself. */
	if (ts_proxy_running(p) && pthread_equal(pthread_self(), p->loop_thread)) {
		write_err(err, errlen, "proxy: a reload cannot be asked for from the proxy's thread");
		return -EDEADLK;
	}
	/* Reading and resolving here, on the caller's thread: the loop stays free. The prepare
	 * reads what the proxy closes when it stops: counted, so that the stop waits for it. */
	pthread_mutex_lock(&p->lock);
	if (p->state != PROXY_RUNNING || p->loop_ended) {
		pthread_mutex_unlock(&p->lock);
		write_err(err, errlen, "proxy: not running");
		return -ESRCH;
	}
	p->rl_preparing++;
	pthread_mutex_unlock(&p->lock);
	pret = reload_prepare(p, json, len, &prep, perr, sizeof(perr));
	pthread_mutex_lock(&p->reload_req_lock);
	pthread_mutex_lock(&p->lock);
	p->rl_preparing--;
	pthread_cond_broadcast(&p->cond);
	if (p->state != PROXY_RUNNING || p->loop_ended) {
		pthread_mutex_unlock(&p->lock);
		pthread_mutex_unlock(&p->reload_req_lock);
		reload_prep_free(prep);
		write_err(err, errlen, "proxy: not running");
		return -ESRCH;
	}
	p->rl_prep = prep;
	p->rl_prep_ret = pret;
	snprintf(p->rl_err, sizeof(p->rl_err), "%s", perr);
	ticket = ++p->rl_asked;
	pthread_mutex_unlock(&p->lock);
	wake(p->reload_fd);
	pthread_mutex_lock(&p->lock);
	while (p->rl_answered < ticket && p->state == PROXY_RUNNING && !p->loop_ended)
		pthread_cond_wait(&p->cond, &p->lock);
	if (p->rl_answered >= ticket) {
		ret = p->rl_ret;
		write_err(err, errlen, p->rl_err);
	} else {
		p->rl_answered = ticket;
		ret = -ESRCH;
		write_err(err, errlen, "proxy: stopped before the reload was done");
	}
	prep = p->rl_prep; /* not taken if the loop ended first */
	p->rl_prep = NULL;
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&p->reload_req_lock);
	reload_prep_free(prep);
	return ret;
}

/* The signal handler's reload: prepared here, applied on the loop; requests that came
 * meanwhile are folded into one more round. */
static void *reload_thread_main(void *arg)
{
	struct ts_proxy *p = arg;
	char err[TS_ERRLEN];

	for (;;) {
		do {
			atomic_store(&p->reload_again, false);
			log_info(&p->log, "reload: requested: reading %s",
				 p->config_path ? p->config_path : "(no file)");
			(void)ts_proxy_reload(p, NULL, 0, err, sizeof(err));
		} while (atomic_load(&p->reload_again) && !atomic_load(&p->stop_requested));
		atomic_store(&p->reload_thread_busy, false);
		/* A request between the last look and the store saw this thread busy and only set
		 * reload_again: taken here, unless the loop has started a thread since (then busy
		 * is already taken, and that thread reads the file). */
		if (!atomic_load(&p->reload_again) || atomic_load(&p->stop_requested) ||
		    atomic_exchange(&p->reload_thread_busy, true))
			break;
	}
	return NULL;
}

void ts_proxy_request_reload(struct ts_proxy *p)
{
	if (!p)
		return;
	atomic_store(&p->reload_file_pending, true);
	wake(p->reload_fd);
}
