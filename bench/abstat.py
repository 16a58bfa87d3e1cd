"""abstat.py — the statistics of the A/B gate (`twinstack bench --ab`, bench/ab.py): one cell's
paired samples of the base and the candidate judged as REGRESSION, IMPROVED or ok.

Per round i where both sides have a value: d_i = ln(cand_i / base_i), the sign flipped for a
metric where lower is better, so d < 0 is always worse. n = the complete pairs, m = mean(d),
s = the sample standard deviation, se = s / sqrt(n). The tolerance is the run's own spread,
never below the smallest effect worth reporting:

    tol = max(min_effect, t(0.995, n - 1) * se),  min_effect = ln(1 / (1 - PCT / 100))

REGRESSION if m < -tol, IMPROVED if m > tol, else ok; a cell with fewer than MIN_PAIRS
complete pairs is INCOMPLETE (not judged: the run fails). With min_effect 5 % the floor is
exactly a 5 % drop (e^-tol = 0.95). Percentages shown: the mean change (e^m - 1) and the drop
the tolerance stands for (1 - e^-tol).

Pure: no process, no file. Python 3 standard library only.
"""

import math
import statistics

MIN_PAIRS = 3
DEFAULT_MIN_EFFECT_PCT = 5.0

# Student's t, two-sided 99 % (the 0.995 quantile), by degrees of freedom 1..30; above 30 the
# value at 30 (slightly wider than the exact quantile: the safe side for a gate).
T995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169,
        3.106, 3.055, 3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845,
        2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.750)


def t995(df):
    if df < 1:
        raise ValueError("t quantile: degrees of freedom must be >= 1")
    return T995[min(df, len(T995)) - 1]


def min_effect_ln(pct):
    """The smallest effect as a log ratio: a drop of pct percent."""
    return math.log(1.0 / (1.0 - pct / 100.0))


def pairs(base, cand):
    """[(round, base, cand)] for every round in both {round: value} maps with two positive
    values (a missing or non-positive value leaves a gap, never a shifted pair)."""
    return [(r, base[r], cand[r]) for r in sorted(set(base) & set(cand))
            if base[r] > 0 and cand[r] > 0]


def judge(base, cand, min_effect_pct=DEFAULT_MIN_EFFECT_PCT, lower_is_better=False):
    """One cell: base and cand are {round: value}. Returns a dict with the pairs, n, the
    medians, m, s, se, t, tol (log ratios), change_pct, tol_pct and verdict."""
    pr = pairs(base, cand)
    sign = -1.0 if lower_is_better else 1.0
    d = [sign * math.log(c / b) for _, b, c in pr]
    n = len(d)
    res = {"pairs": [list(p) for p in pr], "n": n,
           "base_median": statistics.median(base.values()) if base else None,
           "cand_median": statistics.median(cand.values()) if cand else None,
           "mean_ln": None, "sd_ln": None, "se_ln": None, "t": None, "tol_ln": None,
           "change_pct": None, "tol_pct": None, "min_effect_pct": min_effect_pct,
           "lower_is_better": lower_is_better}
    if n < MIN_PAIRS:
        res["verdict"] = "INCOMPLETE"
        return res
    m = statistics.fmean(d)
    s = statistics.stdev(d)
    se = s / math.sqrt(n)
    t = t995(n - 1)
    tol = max(min_effect_ln(min_effect_pct), t * se)
    res.update({"mean_ln": m, "sd_ln": s, "se_ln": se, "t": t, "tol_ln": tol,
                "change_pct": (math.exp(m) - 1.0) * 100.0,
                "tol_pct": (1.0 - math.exp(-tol)) * 100.0,
                "verdict": "REGRESSION" if m < -tol else "IMPROVED" if m > tol else "ok"})
    return res
