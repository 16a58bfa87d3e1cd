#!/usr/bin/env python3
"""Generate the seed corpus of fuzz_relay (input format: see tests/fuzz/fuzz_relay.c).

Usage: make_corpus_relay.py OUTDIR. Deterministic: the same files every run.
"""
import os
import sys

SEND, FIN, WIN_OPEN, WIN_CLOSE, CHUNK, EAGAIN, RESET, ERROR, SHUT_FAILS, ACK, ADVANCE, RUN, \
    CANCEL, BASE_BETWEEN, SEND_FIN, NOP = range(16)
A, B = 0, 0x80
# size(arg): 1 2 3 7 16 100 511 512 1000 1460 4096 8192 16383 16384 16385 30000
# dur(arg): 0 1ns 1ms-1 1ms 2ms 19ms 20ms 64ms 100ms 999ms 1s 5s 59s 60s 61s 300s
OPEN = 255


def header(idle=0, early=0, bufsz=2, budget=3, max_bufs=2, tiny_budget=False, order_ba=False,
           base_between=False, unacked_a=True, unacked_b=True, splice=False, counters=True,
           room_a=False, room_b=False, gather_up=False, gather_down=False):
    """idle: 0 ms, 1 ms, 50 ms, 5 s; early: 0, 1, 300, 20000 bytes; bufsz: 1, 7, 1460, 16384;
    budget: 1, 2, 3 or 1000 buffers besides the early bytes; gather_up: a lends its buffers
    and b takes iovecs, gather_down: the other way."""
    return bytes([
        idle | early << 2 | bufsz << 4,
        budget | (max_bufs - 1) << 2 | (0x80 if tiny_budget else 0),
        room_a | room_b << 1 | gather_up << 2 | gather_down << 3 | gather_down << 4 |
        gather_up << 5,
        order_ba | base_between << 1 | unacked_a << 2 | unacked_b << 3 | splice << 4 |
        counters << 5])


def ops(*pairs):
    return b''.join(bytes([op, arg]) for op, arg in pairs)


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
    windows = ops((WIN_OPEN | A, OPEN), (WIN_OPEN | B, OPEN))
    seeds = {
        'clean_both_ways': header() + windows +
                           ops((SEND | A, 8), (SEND | B, 10), (SEND_FIN | B, 4), (FIN | A, 0)),
        'early_then_half_close': header(early=2) + windows +
                                 ops((SEND_FIN | A, 5), (RUN, 3), (SEND | B, 9), (FIN | B, 0)),
        'back_pressure': header(bufsz=1) +
                         ops((SEND | A, 10), (WIN_OPEN | B, 2), (WIN_OPEN | B, 3),
                             (CHUNK | A, 1), (SEND | B, 5), (WIN_OPEN | A, 4), (EAGAIN | A, 0),
                             (WIN_CLOSE | B, 0), (WIN_OPEN | B, 10), (FIN | A, 0)),
        'reset_before_fin': header() + windows +
                            ops((SEND | B, 10), (RESET | B, 0), (SEND | A, 6)),
        'reset_seen_by_write': header() +
                               ops((WIN_OPEN | A, OPEN), (SEND | B, 8), (RESET | B, 1),
                                   (SEND | A, 6), (WIN_OPEN | B, OPEN), (RUN, 2)),
        'fin_then_reset': header() +
                          ops((WIN_OPEN | A, 9), (SEND_FIN | B, 10), (SEND | A, 11),
                              (WIN_OPEN | B, 5), (RESET | B, 0), (RUN, 3), (WIN_OPEN | A, OPEN),
                              (ACK | A, 9), (ADVANCE, 3), (ACK | A, 0x80), (ADVANCE, 7)),
        'lwip_error': header(unacked_a=False) + windows +
                      ops((SEND | A, 8), (ERROR | A, 1), (SEND_FIN | B, 8)),
        'lwip_error_after_fin': header() + windows +
                                ops((SEND_FIN | A, 8), (RUN, 2), (ERROR | A, 0),
                                    (SEND_FIN | B, 6), (ADVANCE, 4)),
        'idle_timeout': header(idle=2) + windows +
                        ops((SEND | A, 5), (ADVANCE, 5), (SEND | B, 5), (ADVANCE, 7),
                            (ADVANCE, 7)),
        'pool_exhausted': header(bufsz=2, budget=0, max_bufs=1) +
                          ops((SEND | A, 12), (WIN_OPEN | A, OPEN), (SEND | B, 11), (RUN, 3),
                              (ADVANCE, 6), (WIN_OPEN | B, 10), (ADVANCE, 6), (FIN | A, 0)),
        'shutdown_fails': header() + windows +
                          ops((SHUT_FAILS | B, 0), (SEND_FIN | A, 5), (SEND_FIN | B, 5)),
        'cancel': header(base_between=True) + windows + ops((SEND | A, 9), (CANCEL, 15)),
        'early_refused': header(early=3, budget=0, tiny_budget=True),
        'gather_both_ways': header(gather_up=True, gather_down=True) + windows +
                            ops((SEND | A, 12), (SEND | B, 13), (SEND_FIN | B, 4), (FIN | A, 0)),
        'gather_back_pressure': header(gather_up=True, room_b=True) +
                                ops((SEND | A, 12), (WIN_OPEN | B, 2), (CHUNK | A, 9),
                                    (WIN_OPEN | B, 8), (EAGAIN | A, 0), (WIN_CLOSE | B, 0),
                                    (WIN_OPEN | A, OPEN), (WIN_OPEN | B, 10), (FIN | A, 0)),
        'gather_reset': header(gather_up=True) + windows +
                        ops((SEND | A, 12), (RESET | B, 1), (SEND | A, 6), (SEND_FIN | B, 3)),
        'gather_error': header(gather_up=True, unacked_a=False) + windows +
                        ops((SEND | A, 8), (ERROR | A, 1), (SEND_FIN | B, 8)),
        'gather_window_closed': header(gather_up=True) +
                                ops((WIN_OPEN | A, OPEN), (SEND | A, 12), (RUN, 2),
                                    (WIN_OPEN | B, 4), (RUN, 2), (WIN_OPEN | B, 9),
                                    (SEND_FIN | A, 3), (WIN_OPEN | B, OPEN), (FIN | B, 0)),
        # b's bytes wait for a's closed window, so nothing reads b: its reset goes to the
        # gather's writev
        'gather_reset_on_write': header(gather_up=True) +
                                 ops((SEND | B, 9), (RUN, 2), (WIN_OPEN | B, 5), (SEND | A, 12),
                                     (RUN, 2), (RESET | B, 1), (RUN, 3), (WIN_OPEN | A, OPEN)),
        'gather_reset_on_write_ba': header(gather_up=True, order_ba=True) +
                                    ops((SEND | B, 9), (RUN, 2), (WIN_OPEN | B, 5),
                                        (SEND | A, 12), (RUN, 2), (RESET | B, 1), (RUN, 3),
                                        (WIN_OPEN | A, OPEN)),
        'tiny_buffers_order': header(bufsz=0, order_ba=True, base_between=True, early=1) +
                              windows + ops((SEND_FIN | A, 6), (SEND_FIN | B, 5)),
    }
    # Long mixed scripts (a fixed-seed generator): libFuzzer grows inputs from the longest
    # seed, and back-pressure, partial writes and the linger need many steps to meet.
    rng = Lcg(0x72656c)
    for n, hdr in enumerate((header(bufsz=1, max_bufs=2, budget=1, idle=2),
                             header(bufsz=2, early=2, order_ba=True, base_between=True),
                             header(bufsz=1, budget=1, gather_up=True, room_b=True, idle=2))):
        body = []
        for _ in range(200):
            side = rng.pick([A, B])
            kind = rng.pick([SEND] * 6 + [WIN_OPEN] * 5 + [WIN_CLOSE, CHUNK, EAGAIN, ACK, ACK,
                                                             ADVANCE, ADVANCE, RUN, NOP])
            arg = rng.next() & 0xff
            if kind == ADVANCE:
                arg &= 7
            elif kind == WIN_OPEN and arg == OPEN:
                arg = 3
            body.append((side | kind, arg))
        if n != 1:
            body += [(FIN | A, 0), (FIN | B, 0)]
        else:  # the server's FIN, then its reset while the app still uploads
            body += [(FIN | B, 0), (RESET | B, 0), (SEND | A, 9), (ACK | A, 0x80), (FIN | A, 0)]
        seeds['long_mix_%d' % n] = hdr + ops(*body)
    for name, body in seeds.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(body)


if __name__ == '__main__':
    main()
