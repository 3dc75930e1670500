"""The sequential gates' confidence sequence (qeval/analysis/sequential.py), by simulation: paired
outcomes with a known true difference at and around the gate, 5,000 runs each, looked at after
every chunk. The rate of wrong verdicts must stay at or under the level at every look; the fixed-n
interval looked at the same way must not (which is why it is not what a sequential run uses)."""

from __future__ import annotations

import numpy as np
import pytest

from qeval.analysis.sequential import (
    bounds,
    cell_level,
    first_decision,
    gate_score,
    sequential_metric,
    to_unit,
    trajectory,
)
from qeval.analysis.stats import newcombe_paired_ci, verdict

RUNS = 5000
LEVEL = 0.05
MARGIN = 0.02  # a 2-point gate
CHUNK = 50
N = 1000
LOOKS = np.arange(CHUNK, N + 1, CHUNK)


def paired_binary(
    rng: np.random.Generator, runs: int, n: int, base_acc: float, to_wrong: float, to_right: float
) -> tuple[np.ndarray, np.ndarray]:
    """Right/wrong outcomes of a baseline and a setup on the same documents: the setup flips a
    right answer to wrong with chance to_wrong / base_acc (a wrong one to right: to_right /
    (1 - base_acc)), so the true difference is to_right - to_wrong."""
    base = rng.random((runs, n)) < base_acc
    u = rng.random((runs, n))
    other = np.where(base, u >= to_wrong / base_acc, u < to_right / (1 - base_acc))
    return base.astype(float), other.astype(float)


def sequential_wrong_rate(
    base: np.ndarray, other: np.ndarray, wrong: int, alpha: float = LEVEL, min_docs: int = 6
) -> tuple[np.ndarray, np.ndarray]:
    """Per look, the share of runs that have given the wrong verdict (+1 pass, -1 fail) by then,
    and the share decided by then, the cells stopped at their first decision."""
    score = gate_score(base[0], other[0], True, MARGIN)
    y, m0 = to_unit(gate_score(base, other, True, MARGIN))
    assert score.threshold == -MARGIN
    first, sign = first_decision(y, m0, alpha, LOOKS, min_docs)
    by_look = np.arange(len(LOOKS))[None, :]
    decided = (first[:, None] >= 0) & (first[:, None] <= by_look)
    wrong_by = decided & (sign[:, None] == wrong)
    return wrong_by.mean(axis=0), decided.mean(axis=0)


def fixed_n_wrong_rate(base: np.ndarray, other: np.ndarray, wrong: int) -> np.ndarray:
    """The same, with today's fixed-n 95% interval (Newcombe's paired interval) looked at after
    every chunk and the run stopped at the first decided look."""
    b, o = base.astype(bool), other.astype(bool)
    stopped = np.zeros(len(base), dtype=bool)
    wrong_now = np.zeros(len(base), dtype=bool)
    out = []
    for n in LOOKS:
        bb, oo = b[:, :n], o[:, :n]
        tables = np.stack([(bb & oo).sum(1), (bb & ~oo).sum(1), (~bb & oo).sum(1), (~bb & ~oo).sum(1)], axis=1)
        for r in np.flatnonzero(~stopped):
            v = verdict(newcombe_paired_ci(*tables[r].tolist()), True, MARGIN)
            if v != "inconclusive":
                stopped[r] = True
                wrong_now[r] = v == ("pass" if wrong == 1 else "fail")
        out.append(wrong_now.mean())
    return np.array(out)


def test_at_the_gate_wrong_fails_stay_under_the_level_and_fixed_n_exceeds_it() -> None:
    """True difference exactly -2 points on a 2-point gate: passing is right, failing is wrong.
    The sequence's wrong fails stay at or under 5% at every look; Newcombe's interval looked at
    after every chunk goes past 5%."""
    rng = np.random.default_rng(1)
    base, other = paired_binary(rng, RUNS, N, 0.7, 0.06, 0.04)
    wrong, _ = sequential_wrong_rate(base, other, wrong=-1)
    assert (wrong <= LEVEL).all(), wrong
    naive = fixed_n_wrong_rate(base, other, wrong=-1)
    assert naive[-1] > LEVEL, naive  # 20 looks at a 95% interval: well past 5%
    assert naive[0] <= LEVEL  # one look alone is a valid test; the looks together are not


@pytest.mark.parametrize("true_diff", [-0.025, -0.03, -0.04])
def test_below_the_gate_wrong_passes_stay_under_the_level(true_diff: float) -> None:
    """True drop beyond the gate (2.5, 3 and 4 points against 2): a pass is wrong."""
    rng = np.random.default_rng(int(-true_diff * 1000))
    to_wrong = 0.05
    base, other = paired_binary(rng, RUNS, N, 0.7, to_wrong, to_wrong + true_diff)
    wrong, decided = sequential_wrong_rate(base, other, wrong=1)
    assert (wrong <= LEVEL).all(), wrong
    assert decided[-1] > 0  # it does decide (fail) in some runs: the level is not met by never deciding


def test_no_change_passes_early_without_wrong_fails() -> None:
    """A setup that changes nothing (an INT8 that agrees on every document): no wrong fails, and
    the gate passes in every run well before the full set."""
    rng = np.random.default_rng(3)
    base, other = paired_binary(rng, RUNS, N, 0.6, 0.0, 0.0)
    wrong, decided = sequential_wrong_rate(base, other, wrong=-1)
    assert wrong[-1] == 0
    assert decided[-1] == 1.0
    first_full = int(np.argmax(decided == 1.0))
    assert LOOKS[first_full] < N / 2  # the verdict is known at a fraction of the documents


def test_a_broken_setup_fails_early() -> None:
    """A setup 20 points worse fails in 99% of runs by 300 documents, in every run by 500."""
    rng = np.random.default_rng(4)
    base, other = paired_binary(rng, RUNS, N, 0.7, 0.25, 0.05)
    wrong, decided = sequential_wrong_rate(base, other, wrong=1)
    assert wrong[-1] == 0
    assert decided[LOOKS.tolist().index(300)] >= 0.99
    assert decided[LOOKS.tolist().index(500)] == 1.0


def test_bounded_scores_at_the_gate() -> None:
    """Per-document scores in [0, 1] that are not right/wrong (truthfulqa_mc2's probability
    mass): the setup's score is the baseline's times w ~ U(0.92, 1), a true drop of exactly
    0.04 x 0.5 = 2 points, at the gate: wrong fails stay under the level at every look."""
    rng = np.random.default_rng(5)
    base = rng.beta(2, 2, (RUNS, N))
    other = base * rng.uniform(0.92, 1.0, (RUNS, N))
    wrong, _ = sequential_wrong_rate(base, other, wrong=-1)
    assert (wrong <= LEVEL).all(), wrong


def test_relative_and_recovery_gates_keep_their_meaning() -> None:
    """relative: true and min_recovery gates are a mean of o - kappa b against 0: at the
    boundary (setup exactly 95% of the baseline, a 5% relative gate) wrong fails stay under the level."""
    rng = np.random.default_rng(6)
    base = rng.beta(2, 2, (RUNS, N))
    other = base * rng.uniform(0.90, 1.0, (RUNS, N))  # 95% of the baseline on average
    for kwargs in ({"max_drop": 0.05, "relative": True}, {"max_drop": None, "min_recovery": 0.95}):
        score = gate_score(base, other, True, **kwargs)
        assert score.threshold == 0.0 and score.low == pytest.approx(-0.95)
        y, m0 = to_unit(score)
        first, sign = first_decision(y, m0, LEVEL, LOOKS, 6)
        assert ((first >= 0) & (sign == -1)).mean() <= LEVEL


def test_run_level_error_over_cells() -> None:
    """Three cells of a run, each at the gate, each at level 0.05 / 3 (Bonferroni): the chance that
    any of them gives a wrong verdict is at most 0.05."""
    rng = np.random.default_rng(7)
    alpha = cell_level(LEVEL, 3)
    any_wrong = np.zeros(RUNS, dtype=bool)
    for _ in range(3):
        base, other = paired_binary(rng, RUNS, N, 0.7, 0.06, 0.04)
        y, m0 = to_unit(gate_score(base, other, True, MARGIN))
        first, sign = first_decision(y, m0, alpha, LOOKS, 6)
        any_wrong |= (first >= 0) & (sign == -1)
    assert any_wrong.mean() <= LEVEL


def test_lower_is_better_metric_negated() -> None:
    """A lower-is-better score (an error rate in [0, 1]): a setup whose error rose 30 points fails."""
    rng = np.random.default_rng(8)
    base = (rng.random(400) < 0.2).astype(float)
    other = np.maximum(base, (rng.random(400) < 0.3).astype(float))
    traj = trajectory(gate_score(base, other, False, MARGIN), list(range(50, 401, 50)), LEVEL, 6)
    assert traj.verdict == "fail" and traj.stopped_at is not None
    assert traj.looks[-1].upper < -MARGIN  # in the drop's units: the whole sequence past the gate


def test_trajectory_intervals_nest_and_cover_and_respect_the_floor() -> None:
    """The reported sequence is the running intersection: each look's interval inside the one
    before; the truth inside it; no verdict before min_docs."""
    rng = np.random.default_rng(9)
    base, other = paired_binary(rng, 1, 600, 0.6, 0.0, 0.0)
    traj = trajectory(gate_score(base[0], other[0], True, MARGIN), list(range(20, 601, 20)), LEVEL, 200)
    assert traj.stopped_at is not None and traj.looks[traj.stopped_at].n >= 200
    assert all(look.verdict == "inconclusive" for look in traj.looks[:-1])
    for a, b in zip(traj.looks, traj.looks[1:], strict=False):
        assert b.lower >= a.lower and b.upper <= a.upper
    assert all(look.lower <= 0.0 <= look.upper for look in traj.looks)


def test_bounds_cover_the_mean_at_every_look() -> None:
    """Coverage of the sequence itself, every look at once, on bounded scores: each end is a
    one-sided (1 - alpha) bound (the lower end above the mean at most alpha of the time, the upper
    end below it likewise), so both together miss at most 2 alpha."""
    rng = np.random.default_rng(10)
    low_misses = high_misses = 0
    for _ in range(100):
        y = rng.beta(2, 5, 300)
        lo, hi = bounds(y, LEVEL, np.arange(29, 300, 30))
        low_misses += bool((lo > 2 / 7).any())
        high_misses += bool((hi < 2 / 7).any())
    assert low_misses / 100 <= LEVEL and high_misses / 100 <= LEVEL


def test_unbounded_metrics_are_not_sequential() -> None:
    assert not sequential_metric("bits_per_byte")
    assert sequential_metric("acc") and sequential_metric("acc", np.array([0.0, 1.0]))
    assert not sequential_metric("mc2", np.array([0.5, 1.2]))
    assert not sequential_metric("acc", np.array([0.5, np.nan]))


@pytest.mark.parametrize(("gate", "floor"), [(0.05, 143), (0.02, 364)])
def test_each_side_runs_at_the_whole_level(gate: float, floor: int) -> None:
    """One-sided: with nothing changed, a pass needs log(1/alpha) / log(1 + D / (2 (1 - D)))
    documents (143 at a 5-point gate, 364 at a 2-point one, alpha 0.025; docs/statistics.md), not
    the two-sided log(2/alpha) / ... (169 and 432)."""
    import math

    from qeval.analysis.sequential import decided_looks

    alpha = 0.025
    assert floor == math.ceil(math.log(1 / alpha) / math.log(1 + gate / (2 * (1 - gate))))
    y, m0 = to_unit(gate_score(np.ones(1000), np.ones(1000), True, gate))
    up, down = decided_looks(y, m0, alpha, np.arange(1, 1001))
    assert int(np.argmax(up)) + 1 == floor and not down.any()
