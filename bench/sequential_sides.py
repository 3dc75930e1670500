"""One-sided against two-sided sequential gates, by simulation (docs/statistics.md, "The level").

    .venv/bin/python bench/sequential_sides.py [--runs 5000] [--n 1000] [--chunk 50] [--seed 1]

A gate can be wrong on one side only (a fail where the true change is within the gate, a pass
where it is beyond), so qeval's sequence runs each side at the whole level (capital 1 / alpha:
qeval/analysis/sequential.py `_SIDES`). This prints, for paired right/wrong outcomes at a 2-point
gate (baseline 70% right, 5,000 runs, looked at every 50 documents up to 1,000, no verdict before
6), the share of runs with a wrong verdict and the mean documents scored (a run undecided at the
end counts its 1,000), one-sided beside the two-sided sequence (capital 2 / alpha, the form
before), at a cell level of 0.05 and 0.0125 (four cells of a 5% run). Nothing is timed; seconds.
"""

from __future__ import annotations

import argparse

import numpy as np

import qeval.analysis.sequential as seq

#: (name, chance a right answer flips to wrong, a wrong one to right, the wrong verdict: -1 fail, +1 pass)
CASES = [
    ("no change", 0.0, 0.0, -1),
    ("1-point drop", 0.03, 0.02, -1),
    ("at the 2-point gate", 0.06, 0.04, -1),
    ("2.5 points beyond", 0.05, 0.025, 1),
    ("3 points beyond", 0.05, 0.02, 1),
    ("20-point drop", 0.2, 0.0, 1),
]


def outcomes(rng: np.random.Generator, runs: int, n: int, to_wrong: float, to_right: float) -> tuple[np.ndarray, ...]:
    """A baseline 70% right and a setup that flips right to wrong at `to_wrong` (of all documents)
    and wrong to right at `to_right`: the true change is to_right - to_wrong."""
    base = rng.random((runs, n)) < 0.7
    u = rng.random((runs, n))
    other = np.where(base, u >= to_wrong / 0.7, u < to_right / 0.3)
    return base.astype(float), other.astype(float)


def measure(base: np.ndarray, other: np.ndarray, wrong: int, alpha: float, looks: np.ndarray) -> tuple[float, float]:
    """The share of runs with a wrong verdict, and the mean documents scored."""
    y, m0 = seq.to_unit(seq.gate_score(base, other, True, 0.02))
    first, sign = seq.first_decision(y, m0, alpha, looks, 6)
    docs = np.where(first >= 0, looks[np.maximum(first, 0)], looks[-1])
    return float((sign == wrong).mean()), float(docs.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    looks = np.arange(args.chunk, args.n + 1, args.chunk)
    print("| case | level | wrong, one-sided | wrong, two-sided | documents, one-sided | two-sided | saved |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, to_wrong, to_right, wrong in CASES:
        base, other = outcomes(np.random.default_rng(args.seed), args.runs, args.n, to_wrong, to_right)
        for alpha in (0.05, 0.0125):
            got = {}
            for sides in (1.0, 2.0):
                seq._SIDES = sides  # the two forms differ in this constant only
                got[sides] = measure(base, other, wrong, alpha, looks)
            seq._SIDES = 1.0
            (w1, d1), (w2, d2) = got[1.0], got[2.0]
            print(f"| {name} | {alpha} | {w1:.2%} | {w2:.2%} | {d1:.0f} | {d2:.0f} | {1 - d1 / d2:.1%} |")


if __name__ == "__main__":
    main()
