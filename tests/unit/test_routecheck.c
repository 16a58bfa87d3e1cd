/* test_routecheck.c — the route check of the outbounds (runtime/routecheck.c), against the
 * kernel's own answers in a fresh network namespace: an outbound whose marked lookup leads into
 * the "TUN" (a veth link standing in for it) is a loop — refused at start with its JSON path,
 * counted and logged once at run time, and cleared when the route goes; a rule for the mark
 * makes the same config safe; a bound interface and a socks5 server are looked up as such. */
#include <criterion/criterion.h>

#include <errno.h>
#include <net/if.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"
#include "core/netlink.h"
#include "runtime/routecheck.h"
#include "netns_child.h"

static void sh(const char *cmd)
{
	CHECK(system(cmd) == 0, "%s", cmd);
}

static void load(struct ts_config *cfg, const char *json)
{
	char err[TS_ERRLEN];

	CHECK(config_load_string(json, cfg, err, sizeof(err)) == 0, "%s", err);
}

/* uplink "up0" (10.77.0.1/24, default via 10.77.0.2) and a stand-in TUN "tn0". */
static int setup(void)
{
	sh("ip link set lo up && ip link add up0 type veth peer name up1 && "
	   "ip link set up0 up && ip link set up1 up && "
	   "ip addr add 10.77.0.1/24 dev up0 && ip route add default via 10.77.0.2 && "
	   "ip link add tn0 type veth peer name tn1 && ip link set tn0 up && ip link set tn1 up && "
	   "ip addr add 198.18.0.1/15 dev tn0 && "
	   "ip link add side0 type veth peer name side1 && ip link set side0 up && "
	   "ip link set side1 up && ip addr add 10.78.0.1/24 dev side0");
	int idx = (int)if_nametoindex("tn0");
	CHECK(idx > 0, "tn0");
	return idx;
}

static void scenario(void)
{
	struct ts_config cfg;
	struct routecheck rc;
	struct netlink nl;
	struct log lg;
	char err[TS_ERRLEN];
	int tun = setup();

	log_init(&lg, LOG_LEVEL_ERROR, -1);
	CHECK(netlink_open(&nl) == 0, "netlink");
	load(&cfg, "{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},"
		   "{\"tag\":\"s\",\"type\":\"socks5\",\"server\":\"10.9.0.5:1080\"},"
		   "{\"tag\":\"b\",\"type\":\"direct\",\"bind_interface\":\"side0\"},"
		   "{\"tag\":\"r\",\"type\":\"reject\"}]}");
	CHECK(routecheck_init(&rc, &cfg, tun, err, sizeof(err)) == 0, "%s", err);
	struct netaddr srv[4];
	CHECK(routecheck_servers(&rc, srv, 4) == 1 && srv[0].family == 4 && srv[0].a[3] == 5,
	      "one server address");

	/* The uplink carries everything: nothing loops. */
	CHECK(routecheck_scan(&rc, &nl, &lg, true, err, sizeof(err)) == 0, "%s", err);

	/* A default route into the TUN (as a user might add): direct and socks5 loop; the
	 * interface-bound one does not (its lookup is bound to side0). */
	sh("ip route replace default dev tn0");
	int r = routecheck_scan(&rc, &nl, &lg, true, err, sizeof(err));
	CHECK(r == -ELOOP, "start refuses: %d", r);
	CHECK(strncmp(err, "config: $.outbounds[0]: ", 24) == 0, "names the path: %s", err);
	CHECK(strstr(err, "tn0") != NULL, "names the TUN: %s", err);
	r = routecheck_scan(&rc, &nl, &lg, false, NULL, 0);
	CHECK(r == 2, "run time: two outbounds loop, got %d", r);
	CHECK(rc.episodes == 2 && rc.looping_now == 2, "counted once each: %llu",
	      (unsigned long long)rc.episodes);
	r = routecheck_scan(&rc, &nl, &lg, false, NULL, 0);
	CHECK(r == 2 && rc.episodes == 2, "still looping: not counted again");

	/* A rule for the default mark sends the proxy's own traffic around the TUN. */
	sh("ip route add default via 10.77.0.2 table 50 && "
	   "ip rule add fwmark 0x74000000/0xff000000 lookup 50");
	r = routecheck_scan(&rc, &nl, &lg, false, NULL, 0);
	CHECK(r == 0 && rc.looping_now == 0, "the marked lookup avoids the TUN: %d", r);
	CHECK(rc.episodes == 2, "episodes stay counted");
	CHECK(routecheck_scan(&rc, &nl, &lg, true, err, sizeof(err)) == 0, "%s", err);

	/* No route at all is not a loop (connections fail, nothing comes back). */
	sh("ip rule del fwmark 0x74000000/0xff000000 lookup 50 && ip route del default");
	r = routecheck_scan(&rc, &nl, &lg, true, err, sizeof(err));
	CHECK(r == 0, "no route: %d %s", r, err);
	routecheck_fini(&rc);
	config_fini(&cfg);

	/* Without any mark (route.default_mark 0), the main table decides. */
	sh("ip route add default dev tn0");
	load(&cfg, "{\"route\":{\"default_mark\":0}}");
	CHECK(routecheck_init(&rc, &cfg, tun, err, sizeof(err)) == 0, "%s", err);
	CHECK(routecheck_scan(&rc, &nl, &lg, true, err, sizeof(err)) == -ELOOP, "unmarked loops");
	routecheck_fini(&rc);
	config_fini(&cfg);
	netlink_close(&nl);
}

Test(routecheck, loops_are_found_by_the_kernels_own_lookup, .timeout = 30)
{
	run_in_netns(scenario);
}

static void unresolvable(void)
{
	struct ts_config cfg;
	struct routecheck rc;
	char err[TS_ERRLEN];

	load(&cfg, "{\"outbounds\":[{\"tag\":\"s\",\"type\":\"socks5\","
		   "\"server\":\"no-such-host.invalid:1080\"}]}");
	int r = routecheck_init(&rc, &cfg, 1, err, sizeof(err));
	CHECK(r == -ENXIO || r == -EAGAIN, "an unresolvable server name: %d", r);
	CHECK(strstr(err, "no-such-host.invalid") != NULL, "%s", err);
	config_fini(&cfg);

	/* A name that resolves (from /etc/hosts): pinned, so connections use the address. */
	load(&cfg, "{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},"
		   "{\"tag\":\"s\",\"type\":\"socks5\",\"server\":\"localhost:1080\"},"
		   "{\"tag\":\"n\",\"type\":\"socks5\",\"server\":\"10.1.2.3:1080\"}]}");
	CHECK(routecheck_init(&rc, &cfg, 1, err, sizeof(err)) == 0, "%s", err);
	routecheck_pin(&rc, &cfg);
	const struct ts_hostport *hp = &cfg.outbounds[1].server;
	CHECK(hp->pinned && !hp->is_addr, "pinned");
	CHECK((hp->addr.family == 4 && hp->addr.a[0] == 127) ||
	      (hp->addr.family == 6 && hp->addr.a[15] == 1), "localhost's address");
	CHECK(!cfg.outbounds[2].server.pinned, "a literal needs no pin");
	CHECK(!cfg.outbounds[0].server.pinned, "direct has no server");
	struct netaddr srv[4];
	CHECK(routecheck_servers(&rc, srv, 4) == 2, "both servers are excluded by auto_route");
	routecheck_fini(&rc);
	config_fini(&cfg);
}

/* In a namespace with no network, resolving a name cannot leave the machine. */
Test(routecheck, server_names_are_resolved_once_or_refused, .timeout = 30)
{
	run_in_netns(unresolvable);
}
