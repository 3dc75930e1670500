"""Paired comparison of a setup with the baseline, from per-sample records (docs/statistics.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

N_BOOTSTRAP = 2000


@dataclass
class PairedComparison:
    """setup minus baseline on one task's primary metric (positive = better for `higher_is_better`)."""

    metric: str
    delta: float
    ci: tuple[float, float]
    p_value: float | None
    flips_to_wrong: int | None
    flips_to_right: int | None
    n: int


def paired_accuracy(base: np.ndarray, other: np.ndarray, metric: str, seed: int) -> PairedComparison:
    """Difference in accuracy with Newcombe's paired score interval (95%) and McNemar's exact test.

    Not a bootstrap: with no discordant pair every bootstrap resample has difference 0, so the
    bootstrap CI collapses to [0, 0] and 24 samples would "prove" a drop below one point.
    Newcombe's interval (1998, method 10: Wilson score limits of each accuracy, combined with
    the pairs' correlation) stays honest there: 24 of 24 right on both sides gives about
    ±14 points, 400 of 400 about ±1. `seed` is unused (kept for the call signature)."""
    base, other = base.astype(bool), other.astype(bool)
    to_wrong = int((base & ~other).sum())
    to_right = int((~base & other).sum())
    n = len(base)
    lo, hi = newcombe_paired_ci(int((base & other).sum()), to_wrong, to_right, int((~base & ~other).sum()))
    discordant = to_wrong + to_right
    p = float(sps.binomtest(to_right, discordant, 0.5).pvalue) if discordant else 1.0
    return PairedComparison(metric, (to_right - to_wrong) / n, (lo, hi), p, to_wrong, to_right, n)


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def newcombe_paired_ci(both: int, to_wrong: int, to_right: int, neither: int) -> tuple[float, float]:
    """95% interval of (setup accuracy - baseline accuracy) from the 2x2 table of paired
    outcomes: Newcombe (1998), "Improved confidence intervals for the difference between
    binomial proportions based on paired data", method 10, with its continuity-corrected
    correlation."""
    n = both + to_wrong + to_right + neither
    p1, p2 = (both + to_wrong) / n, (both + to_right) / n  # baseline, setup
    l1, u1 = wilson(both + to_wrong, n)
    l2, u2 = wilson(both + to_right, n)
    denom = (both + to_wrong) * (to_right + neither) * (both + to_right) * (to_wrong + neither)
    # the pairs' correlation, with Newcombe's correction: without it, a table with no discordant
    # pair (4 right and 4 wrong on both sides) has correlation 1 and a zero-width interval
    ad_bc = float(both * neither - to_wrong * to_right)
    if ad_bc > 0:
        ad_bc = max(ad_bc - n / 2, 0.0)
    phi = ad_bc / math.sqrt(denom) if denom else 0.0
    diff = p2 - p1
    lower = diff - math.sqrt(max((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0.0))
    upper = diff + math.sqrt(max((u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2, 0.0))
    return lower, upper


def paired_ratio(base_num: np.ndarray, other_num: np.ndarray, den: np.ndarray, metric: str,
                 seed: int) -> PairedComparison:
    """Difference of a ratio metric (bits per byte: sum nll / sum bytes), bootstrapped by document."""
    def stat(idx: np.ndarray) -> float:
        return float((other_num[idx].sum() - base_num[idx].sum()) / den[idx].sum())

    lo, hi = _bootstrap_ci(stat, len(den), seed)
    delta = stat(np.arange(len(den)))
    p = float(sps.wilcoxon(other_num / den, base_num / den).pvalue) if np.any(other_num != base_num) else 1.0
    return PairedComparison(metric, delta, (lo, hi), p, None, None, len(den))


def paired_mean(base: np.ndarray, other: np.ndarray, metric: str, seed: int) -> PairedComparison:
    """Difference of a per-document score that is not right/wrong (e.g. truthfulqa_mc2's
    probability mass on the true answers): paired bootstrap CI, Wilcoxon signed-rank test."""
    diff = other.astype(float) - base.astype(float)
    n = len(diff)
    if not np.any(diff != 0):
        # no document changed: the bootstrap would say [0, 0] however few they are; bound the
        # mean change instead as if up to 3/n of the documents could change by the scores' range
        # ("rule of three", as Newcombe's interval does for accuracies)
        scale = max(1.0, float(np.abs(np.concatenate([base, other])).max()))
        half = min(1.0, 3 / n) * scale
        return PairedComparison(metric, 0.0, (-half, half), 1.0, None, None, n)
    lo, hi = _bootstrap_ci(lambda idx: float(diff[idx].mean()), n, seed)
    p = float(sps.wilcoxon(other, base).pvalue)
    return PairedComparison(metric, float(diff.mean()), (lo, hi), p, None, None, n)


def average_difference_ci(diffs: list[float], cis: list[tuple[float, float]],
                          level: float = 0.95) -> tuple[float, float, float]:
    """The average of several tasks' differences and its interval, the tasks taken as
    independent: each task's standard error read off its own interval (Newcombe's for
    accuracies, which stays honest when nothing flipped), combined in quadrature.
    Returns (average difference, CI low, CI high)."""
    z = float(sps.norm.ppf(1 - (1 - level) / 2))
    se = math.sqrt(sum(((hi - lo) / (2 * z)) ** 2 for lo, hi in cis)) / len(cis)
    mean = float(np.mean(diffs))
    return mean, mean - z * se, mean + z * se


def _bootstrap_ci(stat, n: int, seed: int, level: float = 0.95) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    draws = np.array([stat(rng.integers(0, n, n)) for _ in range(N_BOOTSTRAP)])
    a = (1 - level) / 2
    return float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a))


def verdict(drop_ci: tuple[float, float], higher_is_better: bool, max_drop: float) -> str:
    """Non-inferiority: pass when the CI's worst end is within the margin, fail when the
    whole CI is beyond it, inconclusive otherwise."""
    worst, best = (drop_ci[0], drop_ci[1]) if higher_is_better else (-drop_ci[1], -drop_ci[0])
    if worst >= -max_drop:
        return "pass"
    if best < -max_drop:
        return "fail"
    return "inconclusive"


def finite(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x
