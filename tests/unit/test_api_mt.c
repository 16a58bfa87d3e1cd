/* test_api_mt.c — the public API's cross-thread calls under concurrency (the TSan tree runs
 * this): stats documents asked from several threads while the proxy runs, a stop from yet
 * another thread in the middle of them, and waiters on two threads. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "mt.h"
#include "twinstack.h"

#define ASKERS 3
#define ASKS 40

static struct ts_proxy *proxy;
static atomic_int answered, failed;

static void *ask(void *arg)
{
	(void)arg;
	for (int i = 0; i < ASKS; i++) {
		char *json = NULL;
		size_t len = 0;
		int ret = ts_proxy_stats_json(proxy, &json, &len);

		if (ret != 0 || !json || strlen(json) != len || !strstr(json, "\"stack\"")) {
			atomic_fetch_add(&failed, 1);
		} else {
			atomic_fetch_add(&answered, 1);
		}
		ts_free(json);
	}
	return NULL;
}

static void *stop_midway(void *arg)
{
	(void)arg;
	while (atomic_load(&answered) < ASKERS * ASKS / 2)
		usleep(1000);
	ts_proxy_stop(proxy);
	ts_proxy_stop(proxy);
	return NULL;
}

static void *wait_for_it(void *arg)
{
	*(int *)arg = ts_proxy_wait(proxy);
	return NULL;
}

/* Fresh network and mount namespaces for this process (a test process of its own both under
 * Criterion and standalone under TSan), so the TUN vanishes with it. false: not possible here. */
static bool own_namespaces(void)
{
	if (geteuid() != 0 || access("/dev/net/tun", R_OK | W_OK) != 0 ||
	    unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) {
		fprintf(stderr, "skipped: needs root, /dev/net/tun and namespaces\n");
		return false;
	}
	return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
	       mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL) == 0;
}

MT_TEST(api_mt, stats_stop_and_wait_from_many_threads)
{
	const char *cfg = "{\"log\": {\"level\": \"warn\"}, \"tun\": {\"name\": \"tmt0\","
			  " \"address\": \"198.18.0.1/15\", \"queues\": 2}}";
	pthread_t askers[ASKERS], stopper, waiters[2];
	int why[2] = { 1, 1 };
	char err[512];

	if (!own_namespaces())
		return;
	CHECK_EQ(ts_proxy_new_json(cfg, strlen(cfg), &proxy, err, sizeof(err)), 0);
	if (ts_proxy_start(proxy, err, sizeof(err)) != 0)
		fprintf(stderr, "start: %s\n", err);
	CHECK(ts_proxy_running(proxy));
	for (int i = 0; i < 2; i++)
		pthread_create(&waiters[i], NULL, wait_for_it, &why[i]);
	for (int i = 0; i < ASKERS; i++)
		pthread_create(&askers[i], NULL, ask, NULL);
	pthread_create(&stopper, NULL, stop_midway, NULL);
	for (int i = 0; i < ASKERS; i++)
		pthread_join(askers[i], NULL);
	pthread_join(stopper, NULL);
	for (int i = 0; i < 2; i++)
		pthread_join(waiters[i], NULL);
	CHECK_EQ(atomic_load(&failed), 0);
	CHECK_EQ(atomic_load(&answered), ASKERS * ASKS);
	CHECK_EQ(why[0], 0); /* both waiters saw a requested stop */
	CHECK_EQ(why[1], 0);
	CHECK_EQ(ts_proxy_running(proxy), 0);
	ts_proxy_free(proxy);
}
