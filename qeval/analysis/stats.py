"""Paired comparison of a setup with the baseline, from per-sample records (docs/statistics.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


def _sps() -> Any:
    """scipy.stats, imported at first use: a worker process imports this module through its task
    kinds and computes no statistic, and scipy.stats is 0.6 s of its start (measured, 2-core CI VM)."""
    from scipy import stats

    return stats


#: The fewest paired documents a gate verdict may rest on; below it the verdict is
#: "inconclusive" whatever the interval says (docs/statistics.md, "Small samples"). Why 6: on
#: fewer documents no outcome at all is significant at 5% on the paired tests reported beside
#: the interval (the exact sign test on flips and the exact signed-rank test reach at best
#: p = 2 / 2^n: 0.0625 at n = 5, 0.031 at n = 6), so a verdict would rest on the interval's
#: distributional assumptions alone, which so few documents cannot check.
MIN_PAIRED_N = 6

#: The largest sample size `samples_to_decide` reports; past it "would decide" means nothing.
MAX_SAMPLES_TO_DECIDE = 10_000_000

Interval = tuple[float, float]


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
    #: the same interval at n' documents, the observed proportions (accuracies) or spread
    #: (scores) unchanged: what `samples_to_decide` searches; None where it cannot be scaled
    interval_at: Callable[[float], Interval] | None = None


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
    table = (int((base & other).sum()), to_wrong, to_right, int((~base & ~other).sum()))
    lo, hi = newcombe_paired_ci(*table)
    discordant = to_wrong + to_right
    p = float(_sps().binomtest(to_right, discordant, 0.5).pvalue) if discordant else 1.0

    def interval_at(m: float) -> Interval:  # the 2x2 table's proportions kept, its counts scaled to m
        return newcombe_paired_ci(*(k * m / n for k in table))

    return PairedComparison(metric, (to_right - to_wrong) / n, (lo, hi), p, to_wrong, to_right, n, interval_at)


def wilson(k: float, n: float, z: float = 1.959963984540054) -> Interval:
    """Wilson score interval of a proportion k / n (fractional counts allowed: `samples_to_decide`
    scales a table)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def newcombe_paired_ci(both: float, to_wrong: float, to_right: float, neither: float) -> Interval:
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


def paired_ratio(
    base_num: np.ndarray, other_num: np.ndarray, den: np.ndarray, metric: str, seed: int
) -> PairedComparison:
    """Difference of a ratio metric (bits per byte: sum nll / sum bytes) with a t-interval on the
    documents' linearised differences, and a Wilcoxon signed-rank test.

    The difference of the ratios is sum(d) / sum(den), d a document's change in the numerator;
    its standard error is that of a ratio estimator, from the residuals d - delta * den (the
    delta method). Not a percentile bootstrap: on n documents it can only return values of
    n resamples, so at n = 1 its interval has zero width and at n = 2-3 it is about [min, max].
    `seed` is unused (kept for the call signature)."""
    d = other_num.astype(float) - base_num.astype(float)
    n, mean_den = len(den), float(den.mean())
    delta = float(d.sum() / den.sum())
    p = p_value(float(_sps().wilcoxon(other_num / den, base_num / den).pvalue)) if np.any(d != 0) else 1.0
    if n < 2:  # no spread to estimate: the change could be as large as the document's own value
        half = float(max(np.abs(base_num / den).max(), np.abs(other_num / den).max(), abs(delta)))
        return PairedComparison(metric, delta, (delta - half, delta + half), p, None, None, n)
    sd = float(np.std((d - delta * den) / mean_den, ddof=1))
    return PairedComparison(
        metric, delta, t_interval(delta, sd, n), p, None, None, n, lambda m: t_interval(delta, sd, m)
    )


def paired_mean(base: np.ndarray, other: np.ndarray, metric: str, seed: int) -> PairedComparison:
    """Difference of a per-document score that is not right/wrong (e.g. truthfulqa_mc2's
    probability mass on the true answers): a t-interval on the paired differences, a Wilcoxon
    signed-rank test. `seed` is unused (kept for the call signature)."""
    diff = other.astype(float) - base.astype(float)
    n = len(diff)
    scale = max(1.0, float(np.abs(np.concatenate([base, other])).max()))
    if not np.any(diff != 0):
        # no document changed: a t-interval would say [0, 0] however few they are; bound the
        # mean change instead as if up to 3/n of the documents could change by the scores' range
        # ("rule of three", as Newcombe's interval does for accuracies)
        def rule_of_three(m: float) -> Interval:
            return -min(1.0, 3 / m) * scale, min(1.0, 3 / m) * scale

        return PairedComparison(metric, 0.0, rule_of_three(n), 1.0, None, None, n, rule_of_three)
    mean = float(diff.mean())
    p = p_value(float(_sps().wilcoxon(other, base).pvalue))
    if n < 2:  # no spread to estimate: the change could span the scores' range
        return PairedComparison(metric, mean, (mean - scale, mean + scale), p, None, None, n)
    sd = float(np.std(diff, ddof=1))
    return PairedComparison(metric, mean, t_interval(mean, sd, n), p, None, None, n, lambda m: t_interval(mean, sd, m))


def paired_clustered(base: np.ndarray, other: np.ndarray, metric: str, seed: int) -> PairedComparison:
    """Difference of a sampled task's score, [n documents, k repeats] a side, paired by document
    and clustered over the repeats: the k draws of one document share its difficulty, so they are
    not k independent samples. The cluster-robust (Liang-Zeger) standard error of the mean over
    n equal clusters is that of the n documents' mean differences over their repeats: a t-interval
    with n - 1 degrees of freedom on those means, and a Wilcoxon test on them (paired_mean).
    With independent repeats it equals `naive_interval` (k x n independent differences); with
    correlated ones (the usual case) it is wider, as it must be. `seed` is unused."""
    return paired_mean(base.mean(1), other.mean(1), metric, seed)


def naive_interval(base: np.ndarray, other: np.ndarray, level: float = 0.95) -> Interval:
    """The interval that treats a sampled task's k x n (document, repeat) differences as
    independent: what `paired_clustered` is not, kept to show (and test) the difference."""
    d = (other.astype(float) - base.astype(float)).ravel()
    return t_interval(float(d.mean()), float(np.std(d, ddof=1)), len(d), level)


def t_interval(mean: float, sd: float, n: float, level: float = 0.95) -> Interval:
    """Student's t-interval of a mean from n >= 2 paired differences with standard deviation sd
    (n fractional allowed: `samples_to_decide` asks it at other sizes)."""
    half = float(_sps().t.ppf(1 - (1 - level) / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def samples_to_decide(cmp: PairedComparison, higher_is_better: bool, max_drop: float) -> int | None:
    """For an inconclusive verdict: the fewest documents (at least MIN_PAIRED_N) at which the
    comparison's own interval, its observed proportions or spread unchanged, would decide the
    gate; None when it cannot be scaled or would need more than MAX_SAMPLES_TO_DECIDE.

    Searched, not extrapolated as 1/sqrt(n): Newcombe's interval shrinks as 1/n when nothing
    flipped, so a square-root rule overstates the figure there about tenfold."""
    interval_at = cmp.interval_at
    if interval_at is None:
        return None

    def decided(m: int) -> bool:
        return verdict(interval_at(m), higher_is_better, max_drop) != "inconclusive"

    lo = max(cmp.n, MIN_PAIRED_N)
    if decided(lo):
        return lo
    hi = 2 * lo
    while not decided(hi):  # doubling, then bisection: `decided` is monotone as the interval shrinks
        if hi >= MAX_SAMPLES_TO_DECIDE:
            return None
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # invariant: undecided at lo, decided at hi
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    return hi


@dataclass
class UnpairedDifference:
    """b minus a on one metric, where the two sides scored different documents (no pairing):
    `qeval compare` across runs whose task data changed."""

    metric: str
    delta: float
    ci: Interval
    p_value: float | None
    n_a: int
    n_b: int
    #: newcombe: Newcombe's hybrid score interval for independent proportions; welch: Welch's
    #: t-interval (for a ratio metric, on each side's linearised ratio estimator)
    method: str


def newcombe_unpaired_ci(k_a: float, n_a: float, k_b: float, n_b: float) -> Interval:
    """95% interval of (k_b / n_b - k_a / n_a) for independent samples: Newcombe (1998),
    "Interval estimation for the difference between independent proportions", method 10 (the
    Wilson score limits of each side combined); the paired interval with no correlation."""
    p_a, p_b = k_a / n_a, k_b / n_b
    l_a, u_a = wilson(k_a, n_a)
    l_b, u_b = wilson(k_b, n_b)
    diff = p_b - p_a
    return diff - math.sqrt((p_b - l_b) ** 2 + (u_a - p_a) ** 2), diff + math.sqrt((u_b - p_b) ** 2 + (p_a - l_a) ** 2)


def unpaired_difference(
    a: np.ndarray, b: np.ndarray, metric: str, den_a: np.ndarray | None = None, den_b: np.ndarray | None = None
) -> UnpairedDifference:
    """b minus a from two independent sets of per-document values: right/wrong values with
    Newcombe's independent interval and Fisher's exact test; a ratio metric (numerators with
    their denominators: bits per byte) or any other score with Welch's t-interval and test."""
    n_a, n_b = len(a), len(b)
    if den_a is None and den_b is None and np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all():
        k_a, k_b = float(a.sum()), float(b.sum())
        p = p_value(float(_sps().fisher_exact([[k_b, n_b - k_b], [k_a, n_a - k_a]]).pvalue))
        return UnpairedDifference(
            metric, k_b / n_b - k_a / n_a, newcombe_unpaired_ci(k_a, n_a, k_b, n_b), p, n_a, n_b, "newcombe"
        )
    est_a, se_a = _estimate(a, den_a)
    est_b, se_b = _estimate(b, den_b)
    delta = est_b - est_a
    se = math.sqrt(se_a**2 + se_b**2)
    if n_a < 2 or n_b < 2 or se == 0:  # no spread to estimate: as wide as the values themselves
        half = float(max(abs(est_a), abs(est_b), abs(delta)))
        return UnpairedDifference(metric, delta, (delta - half, delta + half), None, n_a, n_b, "welch")
    # Welch-Satterthwaite degrees of freedom
    df = se**4 / (se_a**4 / (n_a - 1) + se_b**4 / (n_b - 1)) if se_a or se_b else float(n_a + n_b - 2)
    half = float(_sps().t.ppf(0.975, df)) * se
    p = p_value(float(2 * _sps().t.sf(abs(delta) / se, df)))
    return UnpairedDifference(metric, delta, (delta - half, delta + half), p, n_a, n_b, "welch")


def _estimate(values: np.ndarray, den: np.ndarray | None) -> tuple[float, float]:
    """A side's estimate and its standard error: the mean, or for a ratio sum(values) / sum(den)
    with the ratio estimator's standard error (the delta method, as paired_ratio uses)."""
    n = len(values)
    if den is None:
        return float(values.mean()), float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    ratio = float(values.sum() / den.sum())
    if n < 2:
        return ratio, 0.0
    return ratio, float(np.std((values - ratio * den) / den.mean(), ddof=1) / math.sqrt(n))


def average_difference_ci(
    diffs: list[float], cis: list[tuple[float, float]], level: float = 0.95
) -> tuple[float, float, float]:
    """The average of several tasks' differences and its interval, the tasks taken as
    independent: each task's standard error read off its own interval (Newcombe's for
    accuracies, which stays honest when nothing flipped), combined in quadrature.
    Returns (average difference, CI low, CI high)."""
    z = float(_sps().norm.ppf(1 - (1 - level) / 2))
    se = math.sqrt(sum(((hi - lo) / (2 * z)) ** 2 for lo, hi in cis)) / len(cis)
    mean = float(np.mean(diffs))
    return mean, mean - z * se, mean + z * se


def verdict(drop_ci: Interval, higher_is_better: bool, max_drop: float) -> str:
    """Non-inferiority: pass when the CI's worst end is within the margin, fail when the
    whole CI is beyond it, inconclusive otherwise."""
    if not all(math.isfinite(x) for x in (*drop_ci, max_drop)):
        return "inconclusive"  # an interval of NaN is no evidence: never a pass (nor a fail)
    worst, best = (drop_ci[0], drop_ci[1]) if higher_is_better else (-drop_ci[1], -drop_ci[0])
    if worst >= -max_drop:
        return "pass"
    if best < -max_drop:
        return "fail"
    return "inconclusive"


def finite(x: float | None) -> float | None:
    """`x`, or None where it is not a finite number (a p-value of NaN is no evidence either way)."""
    return None if x is None or not math.isfinite(x) else x


def p_value(x: float | None) -> float | None:
    """A test's p-value as evidence: None (no evidence) where it is missing, not finite or not
    a probability, as a test on NaN scores returns."""
    x = finite(x)
    return x if x is not None and 0.0 <= x <= 1.0 else None


def small_sample_reason(n: int) -> str | None:
    """Why a gate cannot be decided on `n` paired documents whatever the interval says (fewer
    than MIN_PAIRED_N), or None."""
    if n >= MIN_PAIRED_N:
        return None
    return f"only {n} document{'' if n == 1 else 's'} paired, fewer than the {MIN_PAIRED_N} a verdict needs"
