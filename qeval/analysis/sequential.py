"""Anytime-valid gates: a confidence sequence for the mean paired difference of a bounded score,
valid at every look at once, so a run may look after every chunk of documents and stop a cell as
soon as its gate is decided (docs/statistics.md, "Sequential gates").

The method: the betting confidence sequence of Waudby-Smith & Ramdas (2023), "Estimating means
of bounded random variables by betting", JRSS-B 86(1), section 4: the hedged capital process
with predictable plug-in bets (their PrPl bets, truncated at c / m and c / (1 - m) with c = 1/2).
Values are mapped to [0, 1]; for a candidate mean m,

    K+_t(m) = prod_{i<=t} (1 + l+_i(m) (y_i - m)),   K-_t(m) = prod_{i<=t} (1 - l-_i(m) (y_i - m)),

l+_i(m) = min(l_i, c / m), l-_i(m) = min(l_i, c / (1 - m)), l_i = sqrt(2 log(1 / alpha) /
(s2_{i-1} i log(1 + i))) from the documents before i only (predictable), s2 the running variance
with a prior of 1/4. Where E[y] = m each is a nonnegative martingale (where E[y] lies on the other
side of m, a supermartingale), so by Ville's inequality it passes 1 / alpha with probability at
most alpha, at any time.

One-sided, because a gate can be wrong on one side only: where the true mean is at or above the
threshold m0 only a fail is wrong, and a fail needs K-_t(m0) >= 1 / alpha (a supermartingale
there); below it only a pass is wrong, and a pass needs K+_t(m0) >= 1 / alpha. So each side is
run at the whole alpha, not alpha / 2, and P(wrong verdict) <= alpha still holds at any stopping
time (simulated: docs/statistics.md). The reported ends are L_t = inf{m : K+_t(m) < 1 / alpha}, a
(1 - alpha) lower confidence sequence, and U_t = sup{m : K-_t(m) < 1 / alpha}, a (1 - alpha)
upper one (together a (1 - 2 alpha) interval): each factor is decreasing in m for K+ (increasing
for K-), and "the lower end lies above m0" is exactly K+_t(m0) >= 1 / alpha. The running
intersection over looks is reported (still valid).

Assumption: the paired differences of the documents, in the run's seeded random order, are
independent draws with one mean (the documents an i.i.d. sample of the task's population, the
assumption today's fixed-n intervals make too), bounded in a known range. That is why the order
is random: a set stored sorted by difficulty is no random sample prefix by prefix, and why both
sides' records are put in that order before they are paired (qeval/analysis/sequential_run.py).

A gate in any of its forms is a mean of one bounded paired score z_i against a threshold
(`gate_score`): `max_drop: D` is mean(o - b) >= -D; `relative: true` is mean(o - (1 - D) b) >= 0;
`min_recovery: r` is mean(o - r b) >= 0 (o, b the setup's and the baseline's value on document
i; lower-is-better metrics negated). Accuracies and other scores in [0, 1] give z in [-1, 1].
Bits per byte has no bound: a cell on it is not decided sequentially (`sequential_metric`).

Error over a run's cells: each cell is run at level alpha / k, k the run's (setup, task, gate)
cells (Bonferroni; `cell_level`), so the chance that any cell of the run gives a wrong verdict at
any look is at most alpha."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the capital a side must reach to decide is 1 / alpha: one-sided (the module's docstring)
_SIDES = 1.0

#: the bet's truncation (Waudby-Smith & Ramdas 2023 use c = 1/2 or 3/4 for the hedged process)
C_TRUNCATION = 0.5

#: the metrics a sequential cell can be run on: bounded per-document values in [0, 1]
BOUNDED_METRICS = frozenset({"acc", "acc_norm", "exact_match", "pass_at_k", "maj_at_k", "mc2"})

#: bisection steps for the interval's ends (2^-40 of the range: far below any figure reported)
_BISECT_STEPS = 40


def sequential_metric(metric: str, values: np.ndarray | None = None) -> bool:
    """Whether a cell on `metric` can be decided sequentially: a metric whose per-document values
    are bounded in [0, 1] (checked on `values` when given); never bits per byte (unbounded)."""
    if metric == "bits_per_byte":
        return False
    if values is not None:
        return bool(values.size == 0 or (np.isfinite(values).all() and values.min() >= 0 and values.max() <= 1))
    return metric in BOUNDED_METRICS


def cell_level(level: float, n_cells: int) -> float:
    """Each cell's level so that the run's chance of any wrong verdict is at most `level`
    (union bound over the run's (setup, task, gate) cells)."""
    return level / max(n_cells, 1)


def predictable_bets(y: np.ndarray, alpha: float) -> np.ndarray:
    """Waudby-Smith & Ramdas's predictable plug-in bet l_i for each position of `y` (values in
    [0, 1] along the last axis), before truncation: from the documents before i only."""
    t = np.arange(1, y.shape[-1] + 1, dtype=float)
    mu = (0.5 + np.cumsum(y, axis=-1)) / (t + 1)  # running mean with a prior of 1/2
    prev_mu = np.concatenate([np.full(y.shape[:-1] + (1,), 0.5), mu[..., :-1]], axis=-1)
    s2 = (0.25 + np.cumsum((y - prev_mu) ** 2, axis=-1)) / (t + 1)  # running variance, prior 1/4
    s2_prev = np.concatenate([np.full(y.shape[:-1] + (1,), 0.25), s2[..., :-1]], axis=-1)
    bets: np.ndarray = np.sqrt(2 * math.log(_SIDES / alpha) / (s2_prev * t * np.log1p(t)))
    return bets


def log_capital(
    y: np.ndarray, m: np.ndarray | float, alpha: float, bets: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """log K+_t(m) and log K-_t(m) at every t (cumulative along the last axis of `y`, values in
    [0, 1]); `m` in (0, 1), broadcast against `y`'s leading axes (shape [..., 1])."""
    lam = predictable_bets(y, alpha) if bets is None else bets
    m = np.asarray(m, dtype=float)
    with np.errstate(divide="ignore"):
        up = np.minimum(lam, C_TRUNCATION / m)
        down = np.minimum(lam, C_TRUNCATION / (1 - m))
    return (np.cumsum(np.log1p(up * (y - m)), axis=-1), np.cumsum(np.log1p(-down * (y - m)), axis=-1))


def decisions(y: np.ndarray, m0: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """At every t: whether the (1 - alpha) lower sequence lies above m0 (K+_t(m0) >= 1 / alpha)
    and whether the (1 - alpha) upper one lies below it (K-_t(m0) >= 1 / alpha); `y` in [0, 1]
    along the last axis."""
    up, down = log_capital(y, min(max(m0, 1e-12), 1 - 1e-12), alpha)
    bar = math.log(_SIDES / alpha)
    return up >= bar, down >= bar


def bounds(y: np.ndarray, alpha: float, at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The one-sided (1 - alpha) sequences' ends (L_t, U_t) in [0, 1] at the positions `at` (0-based
    indices into the last axis; every t if None), as the running intersection over those looks.
    Found by bisection on m (K+ decreases in m, K- increases), vectorised over the looks."""
    n = y.shape[-1]
    idx = np.arange(n) if at is None else np.asarray(at, dtype=int)
    lam = predictable_bets(y, alpha)
    bar = math.log(_SIDES / alpha)

    def capital_at(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # each look's own m: the whole path at that m, read at the look
        up, down = log_capital(y, m[:, None], alpha, lam)
        rows = np.arange(len(idx))
        return up[rows, idx], down[rows, idx]

    lo_a, lo_b = np.zeros(len(idx)), np.ones(len(idx))  # K+ >= bar at lo_a (or lo_a = 0), < bar at lo_b
    hi_a, hi_b = np.zeros(len(idx)), np.ones(len(idx))  # K- < bar at hi_a, >= bar at hi_b (or hi_b = 1)
    for _ in range(_BISECT_STEPS):
        mid_lo, mid_hi = (lo_a + lo_b) / 2, (hi_a + hi_b) / 2
        up, _ = capital_at(mid_lo)
        _, down = capital_at(mid_hi)
        rejected_lo = up >= bar
        lo_a, lo_b = np.where(rejected_lo, mid_lo, lo_a), np.where(rejected_lo, lo_b, mid_lo)
        rejected_hi = down >= bar
        hi_a, hi_b = np.where(rejected_hi, hi_a, mid_hi), np.where(rejected_hi, mid_hi, hi_b)
    lower, upper = np.maximum.accumulate(lo_a), np.minimum.accumulate(hi_b)
    return lower, np.maximum(upper, lower)  # an empty intersection (a rare, valid event) as a point


@dataclass(frozen=True)
class GateScore:
    """A gate as a mean of one bounded paired score against a threshold: pass when the mean of
    `z` is at least `threshold` (z = o - kappa b, lower-is-better metrics negated)."""

    z: np.ndarray
    threshold: float
    #: the range z can take (the map to [0, 1])
    low: float
    high: float


def gate_score(
    base: np.ndarray,
    other: np.ndarray,
    higher_is_better: bool,
    max_drop: float | None,
    relative: bool = False,
    min_recovery: float | None = None,
) -> GateScore:
    """The gate (qeval/config/gates.py: max_drop, relative, min_recovery) over per-document values
    in [0, 1] as one score z in [-1, 1] and its threshold, with the same meaning as the fixed-n
    verdict (the drop is at most the margin)."""
    b, o = (base, other) if higher_is_better else (1 - base, 1 - other)
    if min_recovery is not None:
        kappa, threshold = min_recovery, 0.0
    elif relative:
        assert max_drop is not None
        kappa, threshold = 1 - max_drop, 0.0
    else:
        assert max_drop is not None
        kappa, threshold = 1.0, -max_drop
    return GateScore(o - kappa * b, threshold, -kappa, 1.0)


def to_unit(score: GateScore) -> tuple[np.ndarray, float]:
    """z and its threshold mapped to [0, 1]."""
    span = score.high - score.low
    return (score.z - score.low) / span, (score.threshold - score.low) / span


@dataclass(frozen=True)
class Look:
    """One look at a cell: documents paired so far, the sequence there (in z units: for a plain
    max_drop gate the difference in the metric's units) and the verdict then."""

    n: int
    lower: float
    upper: float
    verdict: str


@dataclass(frozen=True)
class Trajectory:
    """A cell's looks up to its stopping point, and that point (None: not decided)."""

    looks: list[Look]
    stopped_at: int | None

    @property
    def verdict(self) -> str:
        return self.looks[-1].verdict if self.looks else "inconclusive"


def trajectory(score: GateScore, looks: list[int], alpha: float, min_docs: int) -> Trajectory:
    """The cell's sequence at each look (document counts, increasing, at most len(z)), stopping
    at the first look at or past `min_docs` where the gate is decided: where the sequence at that
    look or an earlier one lay wholly on one side of the threshold (`decided_looks`)."""
    y, m0 = to_unit(score)
    looks = [n for n in looks if 0 < n <= len(y)]
    if not looks:
        return Trajectory([], None)
    passed, failed = decided_looks(y, m0, alpha, np.array(looks))
    lo, hi = bounds(y, alpha, np.array(looks) - 1)
    span = score.high - score.low
    out: list[Look] = []
    for k, n in enumerate(looks):
        v = "inconclusive"
        if n >= min_docs:
            v = "pass" if passed[k] else "fail" if failed[k] else "inconclusive"
        out.append(Look(n, float(score.low + span * lo[k]), float(score.low + span * hi[k]), v))
        if v != "inconclusive":
            return Trajectory(out, k)
    return Trajectory(out, None)


def decided_looks(y: np.ndarray, m0: float, alpha: float, looks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per look (document counts), whether the sequence at it or at an earlier look lay wholly
    above m0 (pass) or wholly below (fail): the exact tests K+(m0), K-(m0) >= 1 / alpha at the looks,
    carried forward (the running intersection's ends say the same, to bisection's precision).
    Vectorised over the leading axes of `y`."""
    ups, downs = decisions(y, m0, alpha)
    cols = np.asarray(looks) - 1
    up = np.logical_or.accumulate(ups[..., cols], axis=-1)
    down = np.logical_or.accumulate(downs[..., cols], axis=-1)
    return up, down & ~up


def first_decision(
    y: np.ndarray, m0: float, alpha: float, looks: np.ndarray, min_docs: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised over runs (rows of `y`, values in [0, 1]): each run's first look (index into
    `looks`, document counts) at or past `min_docs` where the gate is decided, or -1, and the
    verdict there (+1 pass, -1 fail, 0 none), as `trajectory` decides. For simulations."""
    up, down = decided_looks(y, m0, alpha, looks)
    ok = (np.asarray(looks) >= min_docs)[None, :]
    decided = (up | down) & ok
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), -1)
    rows = np.arange(len(y))
    at = np.maximum(first, 0)
    sign = np.where(first < 0, 0, np.where(up[rows, at], 1, -1))
    return first, sign
