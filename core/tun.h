/* tun.h — the TUN device: create or attach, configure, verify; the facade in front of the
 * platform code (core/tun_linux.c).
 *
 * tun_open() does the whole start-up sequence (docs/architecture.md, "TUN start-up"):
 * open the queue fd(s) non-blocking, set MTU and txqueuelen, set the link up, add the
 * addresses, then VERIFY against the real interface — the link up, the configured
 * gateway/prefix present, the IPv6 address present, no longer tentative (DAD) and already routed
 * as local (Linux installs that route from a workqueue a moment after listing the address) —
 * retrying TUN_VERIFY_TRIES times TUN_VERIFY_INTERVAL_MS apart, because addresses can become
 * usable some time after the fd exists. Only then does the caller bind listeners. It blocks for
 * at most ~TUN_VERIFY_TRIES * TUN_VERIFY_INTERVAL_MS plus bounded netlink round trips: call it
 * at start, never from a running loop.
 *
 * Lifetime: a device that tun_open() created is not persistent, so the kernel removes it (and
 * its addresses and routes) when its last queue fd closes; tun_close() therefore deletes nothing
 * explicitly. A persistent device we merely attached to stays after tun_close(), with the
 * addresses and link settings we gave it (we do not know what was there before).
 *
 * Error messages: one line starting with "tun: ", naming the device and the fix when there is
 * one (e.g. "tun: tun0: name taken: ...").
 */
#ifndef TS_CORE_TUN_H
#define TS_CORE_TUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/netaddr.h"

struct ts_tun;
struct tun;

#define TUN_WUR __attribute__((warn_unused_result))

#define TUN_NAME_MAX 15          /* IFNAMSIZ - 1 */
#define TUN_QUEUES_MAX 256       /* the kernel's MAX_TAP_QUEUES */
#define TUN_VERIFY_TRIES 10      /* addresses may appear after the fd: 10 tries ... */
#define TUN_VERIFY_INTERVAL_MS 50 /* ... 50 ms apart */
#define TUN_VNET_HDR_LEN 10      /* struct virtio_net_hdr, no num_buffers */
#define TUN_VNET_HDR_MAX 64      /* the longest virtio header a caller's fd may carry */

struct tun_params {
	char name[TUN_NAME_MAX + 1]; /* "" = let the kernel pick ("tunN") */
	uint32_t mtu;                /* 0 = leave as is; else 68..65535 (>= 1280 with IPv6) */
	uint32_t txqueuelen;         /* 0 = leave as is (the kernel default 500 drops bursts) */
	bool has_addr4;
	struct netaddr_cidr addr4;   /* the gateway and its prefix */
	bool has_addr6;
	struct netaddr_cidr addr6;   /* added with IFA_F_NODAD */
	uint32_t queues;             /* 0 or 1: one queue; > 1: IFF_MULTI_QUEUE, one fd per queue */
	bool vnet_hdr;               /* IFF_VNET_HDR, header length TUN_VNET_HDR_LEN */
	uint32_t offload;            /* TUN_F_* for TUNSETOFFLOAD when vnet_hdr (0 = none) */
};

/* All zero: kernel-picked name, no addresses, one queue, no offload, nothing changed. */
void tun_params_init(struct tun_params *p);
/* name, mtu, txqueuelen, addresses and queues from the config. Offload is left off: which
 * TUN_F_* bits "offload": "auto" means is the driver's decision. */
void tun_params_from_config(struct tun_params *p, const struct ts_tun *cfg);

/* The TUN_F_* bits "offload" asks for: CSUM | TSO4 | TSO6 | USO4 | USO6 (USO4 = 0x20 and
 * USO6 = 0x40 are missing from bookworm's headers). */
#define TUN_OFFLOAD_USO4 0x20u
#define TUN_OFFLOAD_USO6 0x40u
#define TUN_OFFLOAD_ALL (0x01u | 0x02u | 0x04u | TUN_OFFLOAD_USO4 | TUN_OFFLOAD_USO6)

/* Open the TUN cfg describes (tun_params_from_config) with cfg->offload and cfg->rps applied:
 *   "off"  per-packet I/O (no vnet header);
 *   "on"   IFF_VNET_HDR + TUNSETOFFLOAD(TUN_OFFLOAD_ALL) or fail with the kernel's reason;
 *   "auto" as "on", and if the kernel refuses, open per-packet instead and say so in note
 *          (one line; note[0] == '\0' when there was nothing to say).
 * rps (receive packet steering of the packets we write into the TUN, i.e. the kernel's TCP
 * receive work for them, over every CPU we may run on; sysfs rx-N/rps_cpus):
 *   "on"   set it or fail (-errno, e.g. no sysfs of this network namespace, no CONFIG_RPS);
 *   "auto" with one queue on a machine with more than one CPU: cleared now, and then the
 *          loop's to turn on and off (tun_rps_auto, core/rps_policy.h); if it cannot be
 *          written, a note and steering stays off; with more queues: as "off";
 *   "off"  leave the device's setting alone (the kernel default: none).
 * Same return values as tun_open. */
int tun_open_config(const struct ts_tun *cfg, struct tun **out, char *note, size_t notelen,
		    char *err, size_t errlen) TUN_WUR;

/* Create the TUN p->name, or attach to an existing TUN of that name that no process has open
 * (a persistent one), configure and verify it. On success *out owns the fd(s). Returns 0 or
 * -errno with one line in err (errlen may be 0):
 *   -EINVAL     bad parameters, or the name belongs to a non-TUN device or a TUN with other
 *               flags (TAP, multi-queue mismatch)
 *   -EBUSY      "name taken": a TUN of that name is open in another process
 *   -EPERM      no CAP_NET_ADMIN
 *   -ENOENT/-ENODEV/-EACCES  /dev/net/tun unusable (see tun_available)
 *   -EADDRNOTAVAIL  an address is missing or still tentative after the verification tries
 *   -EADDRINUSE     IPv6 duplicate address detection failed
 *   other -errno    from the kernel (netlink), with its own explanation when it gives one
 * Multi-queue caveat: the kernel lets any process attach more queues to a multi-queue device,
 * so "name taken" is detected only for single-queue devices. */
int tun_open(const struct tun_params *p, struct tun **out, char *err, size_t errlen) TUN_WUR;

/* Close every queue fd and free t (the kernel then removes a device we created). NULL is a
 * no-op, so a failed start can always call it; set your pointer to NULL afterwards. */
void tun_close(struct tun *t);

/* Take a TUN fd the caller opened and configured (one queue). Nothing about the device is
 * changed: its IFF_VNET_HDR and IFF_MULTI_QUEUE flags (TUNGETIFF) and its virtio header size
 * (TUNGETVNETHDRSZ) are read, the fd is made non-blocking, and tun_close() will not close it.
 * 0, or -errno with one line in err: -EBADF not a TUN fd, -EINVAL a TAP device, an fd without
 * IFF_NO_PI, or a header size outside TUN_VNET_HDR_LEN..TUN_VNET_HDR_MAX. */
int tun_adopt_fd(int fd, struct tun **out, char *err, size_t errlen) TUN_WUR;
/* The device's MTU as the kernel has it now (SIOCGIFMTU). 0 or -errno. */
int tun_get_mtu(const struct tun *t, uint32_t *mtu) TUN_WUR;
/* True for a tun_adopt_fd() device: its settings are the caller's. */
bool tun_borrowed(const struct tun *t);
/* The device has IFF_MULTI_QUEUE (tun_adopt_fd; tun_open's devices: queues > 1). */
bool tun_multi_queue(const struct tun *t);
/* Bytes of virtio header in front of every frame: 0 without vnet_hdr. */
uint32_t tun_vnet_hdr_len(const struct tun *t);

/* The fd of queue q (0 <= q < tun_queues(t)): O_RDWR | O_NONBLOCK | O_CLOEXEC, owned by t. */
int tun_fd(const struct tun *t, uint32_t q);
uint32_t tun_queues(const struct tun *t);
/* The device name (the kernel's choice when p->name was ""). Borrowed, valid until tun_close. */
const char *tun_name(const struct tun *t);
int tun_ifindex(const struct tun *t);
/* True while receive packet steering is on (tun_open_config or tun_set_rps set it). */
bool tun_rps(const struct tun *t);
/* True when tun.rps "auto" left the decision to the loop (and rps_cpus could be written). */
bool tun_rps_auto(const struct tun *t);
/* Set rps_cpus of every rx queue of t to the CPUs this process may run on (on) or to none
 * (off). 0 or -errno with one line in err. The first call (tun_open_config's, for rps "on" and
 * "auto") opens the rx-N/rps_cpus files and t keeps them open until tun_close, so later calls
 * work after the process gave up the privilege to open them (runtime/privdrop.h). */
int tun_set_rps(struct tun *t, bool on, char *err, size_t errlen) TUN_WUR;
/* True if tun_open created the device (it vanishes at tun_close), false if it attached. */
bool tun_created(const struct tun *t);
bool tun_vnet_hdr(const struct tun *t);
/* The TUN_F_* bits the kernel accepted. tun_open asks for p->offload; if the kernel refuses
 * the UDP segmentation bits (USO4/USO6, kernel < 6.2) it retries without them. */
uint32_t tun_offload(const struct tun *t);

/* Re-run the verification on t: tries attempts interval_ms apart (0 counts as 1). 0, or with a
 * message in err: -EADDRNOTAVAIL (missing, tentative or not yet local; the message lists the
 * addresses the interface has), -EADDRINUSE (DAD failed: not retried), -ENETDOWN (link not
 * up), other -errno (netlink). */
int tun_verify(const struct tun *t, unsigned tries, unsigned interval_ms, char *err,
	       size_t errlen) TUN_WUR;
/* The same check for any interface: want4/want6 may be NULL (not checked). */
int tun_verify_addrs(int ifindex, const char *ifname, const struct netaddr_cidr *want4,
		     const struct netaddr_cidr *want6, unsigned tries, unsigned interval_ms,
		     char *err, size_t errlen) TUN_WUR;

/* Strict reverse-path filtering drops packets we write back into the TUN whose source the
 * kernel would not route out through it (sing-box #809, #4101). Reads
 * /proc/sys/net/ipv4/conf/{all,<ifname>}/rp_filter of the caller's network namespace; the
 * kernel applies max(all, dev). Returns 1 with a warning (naming the sysctl to change) in msg
 * when the effective value is 1 (strict), 0 with msg "" otherwise, -errno with the reason in
 * msg when a file cannot be read or ifname is not a valid interface name. */
int tun_rp_filter_check(const char *ifname, char *msg, size_t len);
/* The pure part: the verdict and text for the two values (tests, other platforms' callers). */
int tun_rp_filter_eval(int all, int dev, const char *ifname, char *msg, size_t len);

struct tun_dev_stats {
	uint64_t rx_packets;  /* packets the kernel received from us (our writes) */
	uint64_t tx_packets;  /* packets the kernel queued for us to read */
	uint64_t rx_dropped;
	uint64_t tx_dropped;  /* e.g. our reader too slow: the txqueue overflowed */
};
/* Read /sys/class/net/<ifname>/statistics/{rx,tx}_{packets,dropped}. sysfs shows the network
 * namespace it was mounted in (ip netns exec remounts it; a bare setns() does not). 0 or
 * -errno (-ENOENT: no such device in this sysfs; -EINVAL: bad name or unparsable file). */
int tun_dev_stats(const char *ifname, struct tun_dev_stats *out) TUN_WUR;

/* Can /dev/net/tun be opened? 0, or -errno with a one-line reason and hint in err (for the
 * CLI's "exit 1: no TUN support" message). Opening it does not need CAP_NET_ADMIN; creating a
 * device does (tun_open reports -EPERM). */
int tun_available(char *err, size_t errlen) TUN_WUR;

#endif
