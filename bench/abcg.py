"""abcg.py — a CPU cgroup with a CFS bandwidth limit, for the A/B gate's injected slowdown
(`twinstack bench --ab BASE --ab-throttle PCT`, bench/ab.py): a test aid that slows the
candidate's proxy down from outside the product, so the gate's own test can check that a
real slowdown is caught. Nothing in the product knows about it.

cgroup v2 (cpu listed in /sys/fs/cgroup/cgroup.controllers): a child group
/sys/fs/cgroup/tsab-TOKEN with cpu.max "QUOTA PERIOD" (cpu enabled in the root's
cgroup.subtree_control first, when it was not). cgroup v1: the cpu controller's hierarchy
(/sys/fs/cgroup/cpu), a child group tsab-TOKEN with cpu.cfs_period_us and cpu.cfs_quota_us.
A process written to cgroup.procs moves with all its threads, and threads it starts later are
born in the group. remove() moves anything left back to the parent and removes the group; the
caller removes it at exit, on signals and on errors. Once the group is gone, remove() also
disables the cpu controller in the root's subtree_control again if this group enabled it and
nothing else there uses it (another group with a CPU limit or weight, another run's group);
best effort: a refusal (EBUSY: some group enabled it for its own children) leaves it on, said
through log.

Python 3 standard library only.
"""

import os
import time

ROOT = "/sys/fs/cgroup"
# A short period spreads the limit evenly over a bulk run of a few seconds (the default 100 ms
# period lets a multi-threaded proxy spend its quota in a burst and then stall for the rest).
PERIOD_US = 10000
MIN_QUOTA_US = 1000     # the kernel's floor


class CgroupError(RuntimeError):
    pass


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def _read(path):
    with open(path) as f:
        return f.read()


class CpuLimit:
    """A per-run CPU cgroup named by token, under root (the cgroup filesystem's mount; a test
    passes a directory of its own); log(message) says what remove() left as it was and why.
    Raises CgroupError when no cpu controller is usable (not root, no cgroup filesystem, no cpu
    controller)."""

    def __init__(self, token, root=ROOT, log=None):
        self.root = root
        self.log = log or (lambda msg: None)
        self.enabled_cpu = False    # v2: this group turned cpu on in root's subtree_control
        self.v2 = False
        try:
            self.v2 = "cpu" in _read(os.path.join(root, "cgroup.controllers")).split()
        except OSError:
            pass
        if self.v2:
            self.parent = root
            try:
                if "cpu" not in _read(os.path.join(root, "cgroup.subtree_control")).split():
                    _write(os.path.join(root, "cgroup.subtree_control"), "+cpu")
                    self.enabled_cpu = True
            except OSError as e:
                raise CgroupError("cgroup v2: cannot enable the cpu controller: %s" % e)
        else:
            self.parent = next((p for p in (os.path.join(root, "cpu"),
                                            os.path.join(root, "cpu,cpuacct"))
                                if os.path.exists(os.path.join(p, "cpu.cfs_quota_us"))), None)
            if self.parent is None:
                raise CgroupError("no cgroup cpu controller (neither cgroup v2 with cpu nor "
                                  "v1 %s/cpu with cpu.cfs_quota_us)" % root)
        self.path = os.path.join(self.parent, "tsab-" + token)
        try:
            os.mkdir(self.path)
        except OSError as e:
            self.path = None
            self.restore_controller()
            raise CgroupError("mkdir %s: %s" % (os.path.join(self.parent, "tsab-" + token), e))
        self.quota_us = None
        try:
            if not self.v2:
                _write(os.path.join(self.path, "cpu.cfs_period_us"), PERIOD_US)
            self.unlimit()
        except OSError as e:
            path = self.path
            try:
                self.remove()
            except OSError as e2:
                raise CgroupError("%s: %s (and its removal: %s)" % (path, e, e2))
            raise CgroupError("%s: %s" % (path, e))

    @property
    def kind(self):
        return "cgroup v2 cpu.max" if self.v2 else "cgroup v1 cpu.cfs_quota_us"

    def add(self, pid):
        """Move process pid (all its threads) into the group."""
        try:
            _write(os.path.join(self.path, "cgroup.procs"), pid)
        except OSError as e:
            raise CgroupError("move pid %d into %s: %s" % (pid, self.path, e))

    def limit(self, cpus):
        """Allow the group cpus CPUs (a fraction of one or more) per period."""
        q = max(MIN_QUOTA_US, int(round(cpus * PERIOD_US)))
        if self.v2:
            _write(os.path.join(self.path, "cpu.max"), "%d %d" % (q, PERIOD_US))
        else:
            _write(os.path.join(self.path, "cpu.cfs_quota_us"), q)
        self.quota_us = q
        return q / PERIOD_US

    def unlimit(self):
        if self.v2:
            _write(os.path.join(self.path, "cpu.max"), "max %d" % PERIOD_US)
        else:
            _write(os.path.join(self.path, "cpu.cfs_quota_us"), -1)
        self.quota_us = None

    def throttled_s(self):
        """Seconds the group spent throttled so far, or None."""
        try:
            for line in _read(os.path.join(self.path, "cpu.stat")).splitlines():
                k, _, v = line.partition(" ")
                if k == "throttled_time":        # v1: nanoseconds
                    return int(v) / 1e9
                if k == "throttled_usec":        # v2: microseconds
                    return int(v) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def remove(self):
        """Move what is left to the parent and remove the group (bounded: 2 s), then give the
        root's cpu controller back as it was (restore_controller). Raises OSError when the
        group cannot be removed; the controller then stays on (the group still uses it)."""
        self.remove_group()
        self.restore_controller()

    def remove_group(self):
        if self.path is None or not os.path.isdir(self.path):
            self.path = None
            return
        deadline = time.monotonic() + 2
        while True:
            try:
                for pid in _read(os.path.join(self.path, "cgroup.procs")).split():
                    try:
                        _write(os.path.join(self.parent, "cgroup.procs"), pid)
                    except OSError:
                        pass    # exited meanwhile
                os.rmdir(self.path)
                self.path = None
                return
            except FileNotFoundError:
                self.path = None
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def cpu_user(self):
        """A group of the root (other than this one) that uses the cpu controller, with why,
        or None: another run's group, or one whose CPU limit or weight is not the default."""
        defaults = {"cpu.max": lambda v: v.split()[:1] == ["max"],
                    "cpu.weight": lambda v: v == "100", "cpu.weight.nice": lambda v: v == "0",
                    "cpu.idle": lambda v: v == "0"}
        try:
            entries = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        except OSError as e:
            return "%s: %s" % (self.root, e)
        for name in entries:
            d = os.path.join(self.root, name)
            if d == self.path:
                continue
            if name.startswith("tsab-"):
                return "%s (another A/B run's group)" % d
            for f, is_default in defaults.items():
                try:
                    v = _read(os.path.join(d, f)).strip()
                except OSError:
                    continue
                if not is_default(v):
                    return "%s (%s %s)" % (d, f, v)
        return None

    def restore_controller(self):
        """cgroup v2: disable the cpu controller in the root's subtree_control again if this
        group enabled it, it is gone, and no other group uses the controller. Best effort:
        whatever stops it is logged, never raised."""
        if not self.enabled_cpu or self.path is not None:
            return
        self.enabled_cpu = False
        ctl = os.path.join(self.root, "cgroup.subtree_control")
        user = self.cpu_user()
        if user:
            self.log("abcg: the cpu controller stays enabled in %s (this run enabled it): used "
                     "by %s" % (ctl, user))
            return
        try:
            _write(ctl, "-cpu")
        except OSError as e:
            self.log("abcg: the cpu controller stays enabled in %s (this run enabled it): "
                     "disabling it failed: %s" % (ctl, e.strerror or e))
