"""The noise floor (docs/statistics.md, "The noise floor"): each setup's comparison with the
baseline read beside an A/A control's, the baseline served again under conditions that must not
change its answers (another batch size, max_num_seqs, concurrency: `Setup.control`).

The paired interval already counts every flipped document; the floor says whose flips they
are. A setup that changed no more than the control did is marked within the engine's own noise,
and a gate it fails where the control's own drop reaches the margin is not decided by this run
(inconclusive, saying why): the recommendation never rests on a difference the engine makes by
itself."""

from __future__ import annotations

from qeval.results.metrics import describe
from qeval.results.schema import Comparison, FloorFigures, PairedChange, Results, SetupResult


def floor_results(results: Results) -> Results:
    """`results` with each compared setup's tasks read against the run's controls (unchanged where
    the run has no control that ran)."""
    # the floor is the engine's own noise: an engine-parity control measures another engine, not it
    controls = [s for s in results.setups if s.control and not s.parity and s.status == "ok" and s.vs_baseline]
    if not controls:
        return results
    invariant = bool((results.config.as_dict().get("engine") or {}).get("batch_invariant"))
    setups = []
    for s in results.setups:
        if s.control and invariant and s in controls:
            s = s.model_copy(update={"flags": s.flags + broken_invariance(s)})
        elif not s.control and s.vs_baseline:
            vs = {
                t: against_floor(c, [(k, k.vs_baseline[t]) for k in controls if t in k.vs_baseline])
                for t, c in s.vs_baseline.items()
            }
            s = s.model_copy(update={"vs_baseline": vs})
        setups.append(s)
    return results.model_copy(update={"setups": setups})


def against_floor(c: Comparison, floors: list[tuple[SetupResult, Comparison]]) -> Comparison:
    """`c` with the floor of its task (the control that moved furthest, where several ran), whether
    it is within it, and a failed gate the floor itself reaches made inconclusive."""
    if not floors:
        return c
    control, f = max(floors, key=lambda kf: _spread(kf[1]))
    figures = FloorFigures.model_validate(
        f.model_dump(include=set(PairedChange.model_fields))
        | {
            "setup": control.name,
            "conditions": control.spec.conditions(),
            "reaches_margin": None if c.margin is None else _reaches(f, c.margin),
        }
    )
    update: dict[str, object] = {"floor": figures, "within_floor": within(c, f)}
    if c.verdict == "fail" and figures.reaches_margin:
        m = describe(c.metric, c.higher_is_better)
        update |= {
            "verdict": "inconclusive",
            "samples_to_decide": None,
            "verdict_reason": (
                f"the engine's own noise reaches the gate: {control.name}, the baseline served again "
                f"({figures.conditions}), moves {m.fmt_delta(f.delta)} against the {m.fmt_delta(c.margin or 0)} "
                "margin, so this run cannot tell the setup's drop from the engine's"
            ),
        }
    return c.model_copy(update=update)


def broken_invariance(control: SetupResult) -> list[str]:
    """With the engine's batch-invariant mode on, a control must change nothing: where it changed
    a task, what broke it (a flag a reviewer sees), else nothing."""
    moved = [
        f"{task}: {changed_documents(c) or 0} documents flipped, delta {c.delta:+.4g}"
        + (f", KL {c.kl:.3g}" if c.kl else "")
        + (f", {c.outputs_changed} generations differ" if c.outputs_changed else "")
        for task, c in control.vs_baseline.items()
        if _spread(c) != (0, 0.0, 0, 0.0)
    ]
    if not moved:
        return []
    return [
        f"batch_invariance_broken: engine.batch_invariant is on, yet the baseline served again "
        f"({control.spec.conditions()}) changed {'; '.join(moved)}"
    ]


def within(c: Comparison, floor: Comparison) -> bool:
    """Whether `c` changed no more than `floor`: no more documents flipped (either way) and no more
    generations changed, no larger |delta|, and no larger KL where both were measured."""
    for mine, theirs in ((changed_documents(c), changed_documents(floor)), (c.outputs_changed, floor.outputs_changed)):
        if mine is not None and theirs is not None and mine > theirs:
            return False
    if abs(c.delta) > abs(floor.delta):
        return False
    return not (c.kl is not None and floor.kl is not None and c.kl > floor.kl)


def changed_documents(c: Comparison) -> int | None:
    """Documents whose outcome the comparison's side changed, either way (None: not a right/wrong metric)."""
    if c.flips_to_wrong is None or c.flips_to_right is None:
        return None
    return c.flips_to_wrong + c.flips_to_right


def _spread(c: Comparison) -> tuple[int, float, int, float]:
    """How far a control moved: documents flipped, then |delta|, then generations changed, then KL."""
    return (changed_documents(c) or 0, abs(c.delta), c.outputs_changed or 0, c.kl or 0.0)


def _reaches(f: Comparison, margin: float) -> bool:
    """Whether the control's own drop (in the metric's bad direction) reaches the gate's margin."""
    drop = -f.delta if f.higher_is_better else f.delta
    return drop > 0 and drop >= margin
