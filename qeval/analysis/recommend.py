"""The decision (docs/statistics.md, "The recommendation"): among setups that pass every gate
and fit the budget, recommend the one allowing the most concurrent sequences (ties: the smaller
worst drop), or, as the config's `recommend_by` says, the highest throughput or the lowest
latency measured by the performance phase (docs/performance.md); every other setup gets a
one-line reason.

No baseline result, no comparison, no recommendation: a setup is only ever recommended on
evidence, a paired comparison with a baseline that ran, on every task of the run."""

from __future__ import annotations

from qeval.memory.capacity import whole_sequences
from qeval.results.generation import GeneratedPositionBucket, GenerationDivergence
from qeval.results.metrics import describe
from qeval.results.schema import Comparison, Recommendation, Results, SetupResult


def describe_delta(task: str, c: Comparison) -> str:
    """ "facts -6.2 pts [-9.1 pts, -3.3 pts]": a task's difference with its interval."""
    m = describe(c.metric, c.higher_is_better)
    return f"{task} {m.fmt_delta(c.delta)} [{m.fmt_delta(c.ci[0])}, {m.fmt_delta(c.ci[1])}]"


def worst_drop(setup: SetupResult) -> float:
    """The largest drop against the baseline over the setup's tasks, in each metric's units."""
    drops = [-(c.delta if c.higher_is_better else -c.delta) for c in setup.vs_baseline.values()]
    return max(drops, default=0.0)


def recommend(results: Results) -> Recommendation:
    """The recommendation for `results` (see the module docstring)."""
    context = results.config.budget.context_len
    base = results.baseline
    if base is None or base.status != "ok":
        why = (
            "the baseline has no result in this run"
            if base is None
            else f"the baseline {base.name} failed: {base.error}"
        )
        return Recommendation(
            setup=None,
            candidates=[],
            blocked=why,
            reasons={s.name: f"{s.name}: not compared, so not recommended: {why}" for s in results.setups},
        )
    reasons: dict[str, str] = {}
    eligible: list[SetupResult] = []
    top_level = [t for t, info in results.tasks.items() if info.entry in (None, t)]
    for s in results.setups:
        reason = _exclusion(s, context, top_level, results.run.partial_tasks, results.generation_divergence)
        if reason:
            reasons[s.name] = reason
        else:
            eligible.append(s)
    by = results.config.recommend_by
    if by == "goodput":  # from the serving phase's figures (qeval/run/serving.py, qeval/perf/rank.py)
        best = _rank_by_goodput(results, eligible, reasons)
    elif by != "concurrency":  # throughput or latency, from the performance phase (qeval/perf/rank.py)
        best = _rank_by_performance(eligible, by, reasons)
    else:
        best = _rank_by_concurrency(eligible, context, reasons)
    if best is not None and results.run.partial_tasks:
        reasons[best.name] += f"; {partial_text(results.run.partial_tasks)}"
    order = [s.name for s in results.setups]
    return Recommendation(
        setup=best.name if best else None,
        reasons={n: reasons[n] for n in order if n in reasons},
        candidates=[s.name for s in eligible],
        blocked=None,
    )


def _rank_by_concurrency(eligible: list[SetupResult], context: int, reasons: dict[str, str]) -> SetupResult | None:
    """The passing setup allowing the most concurrent sequences (ties: the smaller worst drop),
    sorting `eligible` so; each other passing setup gets its reason."""
    eligible.sort(key=lambda s: (-(s.memory.max_concurrency or 0), worst_drop(s)))
    best = eligible[0] if eligible else None
    for s in eligible[1:]:
        assert best is not None
        mine = whole_sequences(s.memory.max_concurrency or 0)
        theirs = whole_sequences(best.memory.max_concurrency or 0)
        reasons[s.name] = (
            f"{s.name}: passes every gate, but allows {mine} sequences at {context} tokens against "
            f"{theirs} for {best.name}"
        )
    if best is not None:
        reasons[best.name] = (
            f"{best.name}: recommended: passes every gate and allows "
            f"{whole_sequences(best.memory.max_concurrency or 0)} sequences at {context} tokens, "
            "the most of any passing setup"
        )
    return best


def _rank_by_goodput(results: Results, eligible: list[SetupResult], reasons: dict[str, str]) -> SetupResult | None:
    """The passing setup with the highest goodput within the SLO at its tuned flags (results.serving);
    before the serving phase has run, or for a passing setup it did not serve, a reason instead."""
    from qeval.perf import rank

    if results.serving is None:
        for s in eligible:
            reasons[s.name] = rank.missing(s, "goodput") or ""
        return None
    names = {s.name for s in eligible}
    slo = results.serving.slo()
    by_name = {s.name: s for s in eligible}
    decided = rank.recommend_goodput(
        results.serving.setups, ([s.name for s in eligible], {}), slo, lambda name: _tiebreak(by_name[name])
    )
    for s in eligible:
        reasons[s.name] = decided.reasons.get(s.name) or f"{s.name}: passes every gate, but was not served"
    best = decided.setup
    return next((s for s in eligible if s.name == best), None) if best in names else None


def _rank_by_performance(eligible: list[SetupResult], by: str, reasons: dict[str, str]) -> SetupResult | None:
    """The passing setup with the highest throughput or lowest latency (ties: the smaller worst
    drop); a passing setup without that figure gets a reason instead of a rank."""
    from qeval.perf import rank

    for s in eligible:
        why = rank.missing(s, by)
        if why:
            reasons[s.name] = why
    ranked = sorted(
        (s for s in eligible if s.name not in reasons), key=lambda s: (rank.sort_value(s, by), worst_drop(s))
    )
    if not ranked:
        return None
    # setups whose repeats overlap the best's are tied: the speed cannot tell them apart
    best, tied = rank.tied_best(ranked, lambda a, b: rank.overlaps(a, b, by), _tiebreak)
    most = "the most" if by == "throughput" else "the lowest"
    for s in (s for s in ranked if s is not best):
        reasons[s.name] = (
            f"{s.name}: passes every gate, but serves {rank.describe(s, by)} against "
            f"{rank.describe(best, by)} for {best.name}"
        ) + (f"; tied within the measured spread, {best.name} chosen: {rank.TIE_RULE}" if s in tied else "")
    noise = f"; within the measured spread of {', '.join(s.name for s in tied)}: {rank.TIE_RULE}" if tied else ""
    lead = f"{most} of any passing setup" if best is ranked[0] else f"tied with {ranked[0].name}'s"
    reasons[best.name] = (
        f"{best.name}: recommended (by {by}): passes every gate and serves {rank.describe(best, by)}, {lead}{noise}"
    )
    return best


def _tiebreak(s: SetupResult) -> tuple[float, float]:
    """Among setups a speed ranking cannot tell apart: quality first (the smaller worst drop), then
    memory (more concurrent sequences at the budget's context)."""
    return worst_drop(s), -(s.memory.max_concurrency or 0)


def partial_text(partial: dict[str, str]) -> str:
    """ "judged on part of the config only (not scored: arc_easy: not selected by --tasks)"."""
    return "judged on part of the config only (not scored: " + "; ".join(f"{t}: {w}" for t, w in partial.items()) + ")"


def position_gates(block: GenerationDivergence | None, setup: str) -> list[tuple[str, GeneratedPositionBucket]]:
    """(task, bucket) for each generated-position bucket of `setup` a gate judged (a gate with
    `position:`, judged in the generation block by qeval/tasks/generation/results.py)."""
    if block is None:
        return []
    return [(t, b) for t, tg in block.setups.get(setup, {}).items() for b in tg.positions if b.verdict is not None]


def describe_position(task: str, b: GeneratedPositionBucket) -> str:
    """ "gsm8k generated positions 64-128 Δ NLL +0.210 nats/token [+0.12, +0.30]"."""
    span = f"{b.start}-{b.end}" if b.end is not None else f"{b.start}+"
    ci = f" [{b.ci[0]:+.3f}, {b.ci[1]:+.3f}]" if b.ci is not None else ""
    return f"{task} generated positions {span} Δ NLL {b.delta or 0.0:+.3f} nats/token{ci}"


def _exclusion(
    s: SetupResult,
    context: int,
    tasks: list[str],
    partial: dict[str, str],
    generation: GenerationDivergence | None = None,
) -> str | None:
    """Why `s` cannot be recommended, or None. A gate at a turn is a gate on that turn's task
    (in vs_baseline, said with its turn); a gate at a generated position is judged on its bucket
    of the generation block and excludes the setup as any other gate (fail first, then
    inconclusive)."""
    name = s.name
    if s.control:  # the baseline served again: it measures the engine, it is no candidate
        conditions = s.spec.conditions()
        if s.parity:
            at = f" at {conditions}" if conditions else ""
            return f"{name}: engine parity (the baseline served on {s.spec.served_on()}{at}), not a candidate"
        return f"{name}: the noise floor (the baseline served again at {conditions}), not a candidate"
    if s.status != "ok":
        return f"{name}: failed: {s.error}"
    if not s.baseline:
        missing = [t for t in tasks if t not in s.vs_baseline or not s.vs_baseline[t].n]
        if missing:  # e.g. a group with some of its tasks scored: say which
            what = ", ".join(f"{t} ({partial[t]})" if t in partial else t for t in missing)
            return f"{name}: no paired comparison with the baseline on {what}: no evidence, no pass"
    for task, c in s.vs_baseline.items():
        if c.verdict == "fail":
            return f"{name}: {describe_delta(task, c)}, fails the {_margin(c)}"
    positions = [] if s.baseline else position_gates(generation, name)
    for task, b in positions:
        if b.verdict == "fail":
            return (
                f"{name}: {describe_position(task, b)}, fails the {b.max_drop:g} nats/token gate at position {b.start}"
            )
    reason = _suite_gates(s) or _inconclusive(s, positions)
    if reason:
        return reason
    conc = s.memory.max_concurrency
    if conc is None:
        return f"{name}: no memory figures to size it against the budget"
    if conc < 1:
        return f"{name}: fits only {whole_sequences(conc)} sequences of {context} tokens in the budget"
    return None


def _suite_gates(s: SetupResult) -> str | None:
    """Why `s` fails a suite's recovery gate or is inconclusive against it, or None."""
    for suite, sc in s.suites.items():
        if sc.verdict in ("fail", "inconclusive") and sc.gate is not None:
            rec = f"{100 * sc.recovery:.1f}%" if sc.recovery is not None else "unknown"
            ci = f" [{100 * sc.ci[0]:.1f}%, {100 * sc.ci[1]:.1f}%]" if sc.ci else ""
            word = "fails" if sc.verdict == "fail" else "inconclusive against"
            gate = f"{100 * (sc.gate.min_recovery or 0):g}%"
            return f"{s.name}: {suite} recovery {rec}{ci}, {word} the {gate} recovery gate"
    return None


def _inconclusive(s: SetupResult, positions: list[tuple[str, GeneratedPositionBucket]]) -> str | None:
    """The first task gate, then generated-position gate, that `s` is inconclusive against, or None."""
    for task, c in s.vs_baseline.items():
        if c.verdict == "inconclusive":
            # the figure is the comparison's own (stats.samples_to_decide); results written before it have none
            why = f" ({c.verdict_reason})" if c.verdict_reason else ""
            more = f"; about {c.samples_to_decide} samples would decide it" if c.samples_to_decide else ""
            return f"{s.name}: {describe_delta(task, c)}, inconclusive against the {_margin(c)}{why}{more}"
    for task, b in positions:
        if b.verdict == "inconclusive":
            why = f" ({b.verdict_reason})" if b.verdict_reason else ""
            return (
                f"{s.name}: {describe_position(task, b)}, inconclusive against the {b.max_drop:g} nats/token gate "
                f"at position {b.start}{why}"
            )
    return None


def _margin(c: Comparison) -> str:
    assert c.gate is not None
    if c.gate.min_recovery is not None:
        return f"{100 * c.gate.min_recovery:g}% recovery gate{_at(c)}"
    assert c.gate.max_drop is not None
    return describe(c.metric).fmt_margin(c.gate.max_drop, c.gate.relative) + f" gate{_at(c)}"


def _at(c: Comparison) -> str:
    """ " at turn 6" for a gate written at a turn (it became a gate on that turn's task)."""
    return f" at turn {c.gate.turn}" if c.gate is not None and c.gate.turn is not None else ""


def _slo_problem(results: Results, target: str) -> str | None:
    """Why `target` does not meet the SLO at any level the serving phase measured, or None."""
    if results.serving is None:
        return "has no goodput measured: the serving phase has not run (rerun the same command)"
    row = next((r for r in results.serving.setups if r.setup == target), None)
    if row is None:
        return "was not served"
    if row.status != "ok":
        return f"could not be served: {row.error}"
    if row.pick is None:
        p = f"p{results.serving.slo().percentile:g}"
        best = ", ".join(f"{k.removesuffix('_ms').upper()} {v:,.1f} ms" for k, v in row.best_p99_ms.items())
        return "meets the SLO at no level measured" + (f" (best {p}: {best})" if best else "")
    return None


def candidate_problem(results: Results) -> str | None:
    """Why a release pipeline should stop (`run --fail-on-gate`): no recommendation at all, or
    the candidate (the config's `candidate`, else the recommended setup) does not pass every
    gate, or cannot be recommended, or (`recommend_by: goodput`) meets the SLO at no level
    measured, or the run scored only part of the config; None when it may ship."""
    rec = results.recommendation
    if rec.blocked:
        return f"no recommendation: {rec.blocked}"
    target = results.config.candidate or rec.setup
    by_goodput = results.config.recommend_by == "goodput"
    if target is None:
        if by_goodput and rec.candidates:  # some pass every gate: it is the SLO none of them meets
            if results.serving is None:
                return "no goodput measured: the serving phase has not run (rerun the same command)"
            return f"no setup that passes every gate meets the SLO ({', '.join(rec.candidates)} pass every gate)"
        return "no setup passes every gate and fits the budget"
    setup = next((s for s in results.setups if s.name == target), None)
    if setup is None:
        return f"candidate {target} has no result in this run"
    if setup.status != "ok":
        return f"candidate {target} failed: {setup.error}"
    bad = [f"{t}: {c.verdict}" for t, c in setup.vs_baseline.items() if c.verdict not in ("pass", None)]
    bad += [
        f"{t} at position {b.start}: {b.verdict}"
        for t, b in position_gates(results.generation_divergence, target)
        if b.verdict != "pass"
    ]
    if bad:
        return f"candidate {target} does not pass every gate ({', '.join(bad)})"
    if target not in rec.candidates:  # e.g. no comparison on some task, or no room in the budget
        return f"candidate {target} is not recommendable: {rec.reasons.get(target, '')}"
    if by_goodput:  # ranked on goodput: it must serve the workload within the SLO at some level
        why = _slo_problem(results, target)
        if why:
            return f"candidate {target} {why}"
    if results.run.partial_tasks:  # a release is judged on the whole config, not on the tasks one run chose
        return f"candidate {target} was {partial_text(results.run.partial_tasks)}"
    return None
