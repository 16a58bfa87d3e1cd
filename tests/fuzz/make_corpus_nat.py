#!/usr/bin/env python3
"""Generate the seed corpus of fuzz_nat (input format: see tests/fuzz/fuzz_nat.c).

Usage: make_corpus_nat.py OUTDIR. Deterministic: the same files every run.
"""
import os
import sys

UP_SYN, UP, DOWN, ACCEPT, CLOSE, ADVANCE, PURGE, COLLECT, REMOVE, SKEW, BAD, SYN_DATA = range(12)


def header(addrs=2, listeners=2, ports=8, max_entries=16, ho_max=8, per_host=2, per_net=4,
           quiet=0, half_open=5, linger=4, quarantine=3, seed=0x1234, start=2):
    """Indices of half_open/linger/quarantine: 0 (none), 1 ns, tick-1, tick, 5 ms, 1 s, 30 s,
    24 h; start: 0, 1 ns, 5 s, 2^40 ns."""
    return bytes([
        (addrs - 1) | (listeners - 1) << 1 | (ports - 1) << 2 | start << 6,
        max_entries - 1, ho_max - 1, (per_host - 1) | (per_net - 1) << 3, quiet,
        half_open, linger, quarantine, seed >> 8, seed & 0xff])


def ops(*pairs):
    return b''.join(bytes([op, arg]) for op, arg in pairs)


def lifecycle(key):
    """SYN, accept, data both ways, close, the kernel's FIN after close."""
    return ops((UP_SYN, key), (ACCEPT, 0), (UP, key), (DOWN, 0), (CLOSE, 0), (DOWN, 0),
               (UP, key))


class Lcg:
    """A tiny deterministic generator (Knuth's MMIX LCG), so the corpus never changes."""

    def __init__(self, seed):
        self.x = seed

    def next(self):
        self.x = (self.x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return self.x >> 33

    def pick(self, seq):
        return seq[self.next() % len(seq)]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {
        'lifecycle': header() + lifecycle(0) + ops((ADVANCE, 4), (ADVANCE, 9), (PURGE, 255)),
        'budget_full': header(max_entries=4, ho_max=48) +
                       ops(*[(UP_SYN, k) for k in range(6)]),
        'half_open_share': header(max_entries=32, ho_max=3, quiet=0, per_host=8, per_net=16) +
                           ops(*[(UP_SYN, k) for k in range(5)]) + ops((ACCEPT, 0), (UP_SYN, 9)),
        'per_host': header(max_entries=32, ho_max=32, quiet=0, per_host=1, per_net=2) +
                    ops((UP_SYN, 0), (UP_SYN, 5), (UP_SYN, 1), (UP_SYN, 10), (UP_SYN, 3)),
        'ports_exhausted': header(addrs=1, listeners=1, ports=2, max_entries=8, ho_max=8) +
                           ops(*[(UP_SYN, k) for k in range(4)]),
        'quarantine_reuse': header(addrs=1, listeners=1, ports=1, max_entries=4, ho_max=4,
                                   half_open=4, quarantine=5) +
                            ops((UP_SYN, 0), (ADVANCE, 7), (PURGE, 255), (UP_SYN, 1),
                                (ADVANCE, 11), (UP_SYN, 1), (ADVANCE, 12), (UP_SYN, 1)),
        'replace_closing': header(addrs=1, listeners=1, ports=3) +
                           ops((UP_SYN, 2), (ACCEPT, 0), (CLOSE, 0), (UP_SYN, 2), (UP, 2),
                               (ACCEPT, 0), (CLOSE, 0x10), (CLOSE, 0)),
        'two_phase': header(linger=3) +
                     ops((UP_SYN, 0), (UP_SYN, 1), (ACCEPT, 0), (CLOSE, 0), (ADVANCE, 14),
                         (COLLECT, 15), (UP, 0), (ACCEPT, 1), (REMOVE, 0), (REMOVE, 0),
                         (REMOVE | 0x10, 3), (REMOVE | 0x10, 4), (PURGE, 1)),
        'skewed_clocks': header(linger=4, quarantine=2) +
                         ops((UP_SYN, 7), (ACCEPT, 0), (SKEW, 3), (CLOSE, 0), (SKEW, 0),
                             (ADVANCE, 5), (SKEW, 2), (PURGE, 255), (SKEW, 0), (ADVANCE, 2),
                             (UP_SYN, 7)),
        'ipv6_mix': header(ports=4) + ops((UP_SYN, 36), (UP_SYN, 37), (UP_SYN, 40),
                                           (SYN_DATA, 41), (ACCEPT, 1), (DOWN, 0x41),
                                           (BAD, 0), (BAD, 0x81)),
        'zero_timeouts': header(linger=0, quarantine=0, start=0) +
                         lifecycle(3) + ops((PURGE, 0), (PURGE, 1), (ADVANCE, 3),
                                            (PURGE, 255), (UP_SYN, 3)),
        'long_timeouts': header(half_open=7, linger=7, quarantine=7, start=3) +
                         lifecycle(1) + ops((ADVANCE, 15), (PURGE, 255)),
    }
    # Long mixed runs (a fixed-seed generator): libFuzzer grows inputs from the longest seed,
    # and tables only fill, churn and recycle their quarantine over hundreds of operations.
    rng = Lcg(0x6e6174)
    for n, hdr in enumerate((header(addrs=1, listeners=2, ports=4, max_entries=12, ho_max=6,
                                    quiet=2, half_open=3, linger=3, quarantine=3),
                             header(max_entries=40, ho_max=20, per_host=3, per_net=5,
                                    quiet=4, half_open=4, linger=0, quarantine=4, start=1))):
        body = []
        for _ in range(400):
            op = rng.pick([UP_SYN] * 5 + [UP] * 3 + [DOWN] * 2 + [ACCEPT] * 4 + [CLOSE] * 3 +
                          [ADVANCE] * 4 + [PURGE] * 2 + [COLLECT, REMOVE, SKEW, BAD, SYN_DATA])
            arg = rng.next() & 0xff
            if op == CLOSE:
                op |= rng.pick([0, 0, 0, 0x10, 0x20, 0x30])
            elif op == ADVANCE:
                arg &= 0x3f
            body.append((op, arg))
        seeds['long_mix_%d' % n] = hdr + ops(*body)
    for name, body in seeds.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(body)


if __name__ == '__main__':
    main()
