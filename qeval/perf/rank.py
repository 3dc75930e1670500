"""What the recommendation optimises when the config says `recommend_by: throughput` or
`latency` (qeval/analysis/recommend.py keeps `concurrency`, its original rule): the figure
each setup is ranked on, and how a reason states it, with its spread.

`recommend_by: goodput` is decided on the serving phase's figures (qeval/perf/serving.py, which
serves the workload; `qeval run` runs it after scoring, qeval/run/serving.py, and `qeval goodput`
alone): `recommend_goodput` below, among the setups the run's own rule lets through (every gate
passed, the budget fitted)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from qeval.results.serving import GoodputRecommendation

if TYPE_CHECKING:
    from qeval.config.workload import SloSpec
    from qeval.results.performance import Measured
    from qeval.results.schema import SetupResult
    from qeval.results.serving import ServingSetup

GOODPUT_ELSEWHERE = (
    "its goodput is measured by the serving phase (RUN_DIR/serving.json), which has not run: "
    "`qeval run` serves the workload after scoring, or `qeval goodput` alone"
)


def figure(s: SetupResult, by: str) -> tuple[Measured, int] | None:
    """The ranked figure and the concurrency it was measured at: output tokens/s at the top
    level (the budget's concurrency by default), or request latency p50 at concurrency 1."""
    perf = s.performance
    if by == "goodput" or perf is None or perf.status != "ok":
        return None
    level = perf.top if by == "throughput" else perf.level(1)
    if level is None:
        return None
    return (level.output_tokens_per_s if by == "throughput" else level.e2e_p50_s), level.concurrency


def sort_value(s: SetupResult, by: str) -> float:
    """Smaller ranks first: minus throughput, or latency."""
    found = figure(s, by)
    assert found is not None
    return -found[0].median if by == "throughput" else found[0].median


def missing(s: SetupResult, by: str) -> str | None:
    """Why `s` cannot be ranked by `by`, or None."""
    if by == "goodput":
        return f"{s.name}: passes every gate; {GOODPUT_ELSEWHERE}"
    if figure(s, by) is not None:
        return None
    perf = s.performance
    why = (
        "no performance figures"
        if perf is None
        else f"its performance phase failed ({perf.error})"
        if perf.status != "ok"
        else "concurrency 1 was not timed"
    )
    return f"{s.name}: passes every gate, but cannot be ranked by {by}: {why}"


def describe(s: SetupResult, by: str) -> str:
    """ "1,234 output tokens/s at concurrency 24 (median of 3, 1,180-1,290)"."""
    found = figure(s, by)
    assert found is not None
    f, level = found
    if by == "throughput":
        return (
            f"{f.median:,.0f} output tokens/s at concurrency {level} (median of {f.repeats}, {f.min:,.0f}-{f.max:,.0f})"
        )
    return (
        f"a request latency of {f.median * 1e3:,.1f} ms at concurrency 1 (p50, median of {f.repeats}, "
        f"{f.min * 1e3:,.1f}-{f.max * 1e3:,.1f})"
    )


def overlaps(best: SetupResult, other: SetupResult, by: str) -> bool:
    """The two setups' repeats overlap: the ranking between them is within the noise."""
    a, b = figure(best, by), figure(other, by)
    assert a is not None and b is not None
    return a[0].min <= b[0].max and b[0].min <= a[0].max


#: the tie rule's words, where a ranking is within its measurement's spread
TIE_RULE = "the tie is broken by quality (the smaller worst drop), then memory (more sequences)"


def goodput_interval(r: ServingSetup) -> tuple[float, float]:
    """The 95% interval of a pick's goodput from its own count: the requests within the SLO over the
    level's duration, counted as a Poisson rate (one run of each level: this is the spread the count
    alone gives; a machine's run-to-run spread comes on top)."""
    assert r.pick is not None
    pick = r.pick
    level = next(
        (
            lv
            for lv in r.levels
            if (lv.max_num_seqs, lv.max_num_batched_tokens, lv.rate)
            == (pick.max_num_seqs, pick.max_num_batched_tokens, pick.rate)
        ),
        None,
    )
    if level is None or level.duration_s <= 0:
        return pick.goodput_rps, pick.goodput_rps
    good = pick.goodput_rps * level.duration_s
    half = 1.96 * math.sqrt(max(good, 1.0)) / level.duration_s
    return max(0.0, pick.goodput_rps - half), pick.goodput_rps + half


def tied_best(
    ranked: list[Any], overlap: Callable[[Any, Any], bool], tiebreak: Callable[[Any], Any] | None
) -> tuple[Any, list[Any]]:
    """The best of `ranked` (best first) and the others tied with it (within the spread, `overlap`):
    among the tied, `tiebreak` (quality, then memory) decides where given, else the ranking's order."""
    tied = [r for r in ranked if overlap(ranked[0], r)]
    best = min(tied, key=tiebreak) if tiebreak is not None and len(tied) > 1 else ranked[0]
    return best, [r for r in tied if r is not best]


def recommend_goodput(
    rows: list[ServingSetup],
    gated: tuple[list[str], dict[str, str]] | None,
    slo: SloSpec,
    tiebreak: Callable[[str], Any] | None = None,
) -> GoodputRecommendation:
    """`recommend_by: goodput`: among the setups `gated` lets through (the run's candidates and
    why each other one is out; None: no scored run, so no gate was checked, said in each reason),
    the one with the highest goodput within the SLO at its tuned flags; ties: fewer max-num-seqs.
    Setups whose goodput intervals (`goodput_interval`) overlap the highest's are tied: `tiebreak`
    (a setup's name -> its key, quality then memory) picks among them where given, and the
    reasons say so. A setup that met the SLO at no level says so with its best percentile figures."""
    p = f"p{slo.percentile:g}"
    reasons: dict[str, str] = {}
    ranked = []
    for r in rows:
        if gated is not None and r.setup not in gated[0]:
            reasons[r.setup] = gated[1].get(r.setup, f"{r.setup}: does not pass every gate or fit the budget")
        elif r.status != "ok":
            reasons[r.setup] = f"{r.setup}: not served: {r.error}"
        elif r.pick is None:
            lows = ", ".join(f"{k.removesuffix('_ms').upper()} {v:,.1f} ms" for k, v in r.best_p99_ms.items())
            reasons[r.setup] = (
                f"{r.setup}: cannot meet the SLO at any level measured (best {p}: {lows}; targets {_targets(slo)})"
            )
        else:
            ranked.append(r)
    ranked.sort(key=lambda r: (-(r.pick.goodput_rps if r.pick else 0), r.pick.max_num_seqs if r.pick else 0))
    unchecked = (
        "" if gated is not None else "; quality gates not checked: no scored run of this config and model in RUN_DIR"
    )
    top: ServingSetup | None = None
    tied: list[ServingSetup] = []
    spans = {r.setup: goodput_interval(r) for r in ranked}
    if ranked:
        top, tied = tied_best(
            ranked,
            lambda a, b: spans[a.setup][0] <= spans[b.setup][1] and spans[b.setup][0] <= spans[a.setup][1],
            (lambda r: tiebreak(r.setup)) if tiebreak is not None else None,
        )
    reasons |= _ranked_reasons(ranked, top, tied, spans, (slo, unchecked, tiebreak is not None))
    return GoodputRecommendation(
        setup=top.setup if top else None,
        by="goodput",
        reasons={r.setup: reasons[r.setup] for r in rows if r.setup in reasons},
        gates_checked=gated is not None,
    )


def _ranked_reasons(
    ranked: list[ServingSetup],
    top: ServingSetup | None,
    tied: list[ServingSetup],
    spans: dict[str, tuple[float, float]],
    how: tuple[SloSpec, str, bool],
) -> dict[str, str]:
    """Each ranked setup's reason: its goodput at its pick, against the recommended one's, and the
    tie where the two are within the measurement's spread (`how`: the SLO, the unchecked-gates
    note, whether a tie rule decided)."""
    slo, unchecked, ruled = how
    reasons: dict[str, str] = {}
    for r in ranked:
        assert r.pick is not None  # ranked only with a pick
        at = (
            f"{r.pick.goodput_rps:.3f} requests/s within the SLO ({_targets(slo)}) at {r.pick.rate:g} requests/s "
            f"offered, max-num-seqs {r.pick.max_num_seqs}"
        )
        if r is top:
            most = "the most of any setup" if r is ranked[0] else f"tied with {ranked[0].setup}'s"
            reasons[r.setup] = f"{r.setup}: recommended (by goodput): serves {at}, {most}{unchecked}"
            if tied:
                lo, hi = spans[r.setup]
                reasons[r.setup] += (
                    f"; within the measurement's spread ([{lo:.3f}, {hi:.3f}] requests/s) of "
                    f"{', '.join(t.setup for t in tied)}: {TIE_RULE if ruled else 'not a clear win'}"
                )
        else:
            assert top is not None and top.pick is not None
            ratio = r.pick.goodput_rps / top.pick.goodput_rps if top.pick.goodput_rps else float("nan")
            reasons[r.setup] = f"{r.setup}: serves {at}, {ratio:.2f}x {top.setup}'s goodput{unchecked}"
            if r in tied:
                reasons[r.setup] += f"; tied with {top.setup} within the measurement's spread"
    return reasons


def _targets(slo: SloSpec) -> str:
    from qeval.perf.slo import ms

    return ", ".join(
        f"{slo.percentile:g}th-percentile {k.removesuffix('_ms').upper()} <= {ms(v)} ms"
        for k, v in slo.targets().items()
    )
