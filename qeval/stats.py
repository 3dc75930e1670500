"""Paired comparison of a setup with the baseline, from per-sample records (design §4)."""

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
    """Difference in accuracy with a paired-bootstrap 95% CI and McNemar's exact test."""
    base, other = base.astype(float), other.astype(float)
    diff = other - base
    lo, hi = _bootstrap_ci(lambda idx: diff[idx].mean(), len(diff), seed)
    to_wrong = int(((base == 1) & (other == 0)).sum())
    to_right = int(((base == 0) & (other == 1)).sum())
    discordant = to_wrong + to_right
    p = float(sps.binomtest(to_right, discordant, 0.5).pvalue) if discordant else 1.0
    return PairedComparison(metric, float(diff.mean()), (lo, hi), p, to_wrong, to_right, len(diff))


def paired_ratio(base_num: np.ndarray, other_num: np.ndarray, den: np.ndarray, metric: str, seed: int) -> PairedComparison:
    """Difference of a ratio metric (bits per byte: sum nll / sum bytes), bootstrapped by document."""
    def stat(idx: np.ndarray) -> float:
        return float((other_num[idx].sum() - base_num[idx].sum()) / den[idx].sum())

    lo, hi = _bootstrap_ci(stat, len(den), seed)
    delta = stat(np.arange(len(den)))
    p = float(sps.wilcoxon(other_num / den, base_num / den).pvalue) if np.any(other_num != base_num) else 1.0
    return PairedComparison(metric, delta, (lo, hi), p, None, None, len(den))


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
