"""The noise floor read beside each gate (qeval/analysis/floor.py): a setup that changed no more
than the A/A control is within it, and a gate it fails where the control's own drop reaches the
margin is inconclusive, never a fail the run cannot attribute."""

from __future__ import annotations

from typing import Any

from qeval.analysis.floor import against_floor, broken_invariance, floor_results, within
from qeval.config.gates import Gate
from qeval.results.echo import SetupSpec
from qeval.results.schema import Comparison, Memory, Results, SetupResult

GATE = Gate(task="all", max_drop=0.02)


def cmp(delta: float, to_wrong: int, to_right: int, kl: float | None = None, **more: Any) -> Comparison:
    return Comparison(
        metric="acc",
        higher_is_better=True,
        delta=delta,
        ci=(delta - 0.01, delta + 0.01),
        flips_to_wrong=to_wrong,
        flips_to_right=to_right,
        n=400,
        kl=kl,
        **more,
    )


def control(name: str = "bf16-b1") -> SetupResult:
    spec = SetupSpec.model_validate({"name": name, "control": {"batch_size": 1}})
    return SetupResult(name=name, baseline=False, status="ok", spec=spec, memory=Memory.model_validate(_memory()))


def _memory() -> dict[str, Any]:
    return {"weights_bytes": {}, "kv_bytes_per_token": {}}


def test_a_setup_that_changed_no_more_than_the_control_is_within_its_floor() -> None:
    floor = cmp(-0.01, 5, 1, kl=0.002)
    assert within(cmp(-0.005, 3, 1, kl=0.001), floor)
    assert not within(cmp(-0.005, 6, 1, kl=0.001), floor)  # more documents flipped
    assert not within(cmp(-0.02, 3, 1, kl=0.001), floor)  # a larger difference
    assert not within(cmp(-0.005, 3, 1, kl=0.01), floor)  # a larger KL
    # a deterministic engine's floor (nothing changed) holds only a setup that changed nothing
    zero = cmp(0.0, 0, 0, kl=0.0)
    assert within(cmp(0.0, 0, 0, kl=0.0), zero) and not within(cmp(0.0, 1, 1, kl=0.0), zero)


def test_a_failed_gate_the_floor_reaches_is_inconclusive_and_says_why() -> None:
    failing = cmp(-0.05, 25, 5, kl=0.01, gate=GATE, margin=0.02, verdict="fail")
    noisy = cmp(-0.03, 20, 8, kl=0.002)  # the baseline served again drops beyond the margin itself
    out = against_floor(failing, [(control(), noisy)])
    assert out.verdict == "inconclusive"
    assert out.verdict_reason is not None and "bf16-b1" in out.verdict_reason and "batch_size 1" in out.verdict_reason
    assert out.floor is not None and out.floor.reaches_margin is True and out.within_floor is False
    # a floor within the margin leaves the fail standing: the drop is the quantization's
    quiet = cmp(-0.005, 2, 0, kl=0.0001)
    kept = against_floor(failing, [(control(), quiet)])
    assert kept.verdict == "fail" and kept.floor is not None and kept.floor.reaches_margin is False
    # a floor that moved up, however far, never excuses a drop
    assert against_floor(failing, [(control(), cmp(0.05, 2, 22))]).verdict == "fail"


def test_the_widest_of_several_controls_is_the_floor() -> None:
    setup = cmp(-0.005, 3, 1, kl=0.001, gate=GATE, margin=0.02, verdict="pass")
    out = against_floor(setup, [(control("b1"), cmp(0.0, 1, 1)), (control("b64"), cmp(-0.01, 6, 2, kl=0.002))])
    assert out.floor is not None and out.floor.setup == "b64" and out.within_floor is True
    assert out.verdict == "pass"  # a pass is a pass: the floor only explains what changed
    assert against_floor(setup, []) == setup  # no control: nothing added


def test_a_control_that_moved_under_batch_invariant_mode_says_what_broke_it() -> None:
    moved = control().model_copy(update={"vs_baseline": {"arc_easy": cmp(-0.0025, 1, 0, kl=0.0001)}})
    (flag,) = broken_invariance(moved)
    assert flag.startswith("batch_invariance_broken:") and "arc_easy: 1 documents flipped" in flag
    assert "batch_size 1" in flag
    still = control().model_copy(update={"vs_baseline": {"arc_easy": cmp(0.0, 0, 0, kl=0.0)}})
    assert broken_invariance(still) == []  # zero, as the mode promises: nothing to flag


def test_an_engine_parity_control_is_never_a_floor() -> None:
    """The baseline on another engine differs by the engines, not by the run's engine's noise."""
    spec = SetupSpec.model_validate({"name": "on-vllm", "control": {"backend": "vllm"}})
    parity = SetupResult(
        name="on-vllm",
        baseline=False,
        status="ok",
        spec=spec,
        memory=Memory.model_validate(_memory()),
        vs_baseline={"t": cmp(-0.05, 20, 0, kl=0.1)},
    )
    int8 = control("int8").model_copy(
        update={"spec": SetupSpec.model_validate({"name": "int8"}), "vs_baseline": {"t": cmp(-0.01, 4, 0)}}
    )
    base = control("bf16").model_copy(update={"baseline": True, "spec": SetupSpec.model_validate({"name": "bf16"})})
    results = Results.model_validate(
        {
            "schema_version": 1,
            "run": _run(),
            "config": {"model": {"path": "m"}, "budget": {"gpu_memory_gib": 1, "utilization": 0.9, "context_len": 8}},
            "tasks": {},
            "setups": [base.model_dump(), parity.model_dump(), int8.model_dump()],
            "recommendation": {"setup": None, "reasons": {}},
        }
    )
    assert parity.parity and not int8.parity
    out = floor_results(results)
    assert out.setup("int8").vs_baseline["t"].floor is None


def _run() -> dict[str, Any]:
    return {
        "name": "t",
        "config_hash": "0",
        "qeval_version": "0",
        "device": "cpu",
        "backend": "hf",
        "model_sha256": "0",
    }


def test_generation_tasks_count_the_texts_that_changed() -> None:
    """On a generation task the engine's numerics can change a greedy continuation without moving
    its score: the comparison counts those texts, the floor carries the count, a setup that changed
    more texts than the control is beyond it, and the report's cell says so."""
    from qeval.analysis.comparison import outputs_changed
    from qeval.report.tables import flips_cell
    from qeval.results.samples import SampleRecord

    def recs(*texts: str | None) -> list[SampleRecord]:
        return [SampleRecord(sample_id=str(i), prompt_hash="p", raw_output=t) for i, t in enumerate(texts)]

    assert outputs_changed(recs("a", "b", "c"), recs("a", "x", "y")) == 2
    assert outputs_changed(recs("a", "b"), recs("a", "b")) == 0
    assert outputs_changed(recs(None, None), recs(None, None)) is None  # not a generation task
    other_prompt = [SampleRecord(sample_id="0", prompt_hash="q", raw_output="z")]
    assert outputs_changed(recs("a"), other_prompt) is None  # no pair: another prompt is no evidence
    floor = cmp(0.0, 0, 0, outputs_changed=39)
    assert within(cmp(0.0, 0, 0, outputs_changed=39), floor)
    assert not within(cmp(0.0, 0, 0, outputs_changed=41), floor)
    read = against_floor(cmp(0.0, 0, 0, outputs_changed=41, margin=0.02), [(control(), floor)])
    assert read.floor is not None and read.floor.outputs_changed == 39 and read.within_floor is False
    assert (
        flips_cell(read) == "0 / 0 (41 of 400 texts differ)"
        and flips_cell(read.floor) == "0 / 0 (39 of 400 texts differ)"
    )
    assert broken_invariance(control().model_copy(update={"vs_baseline": {"gsm8k": floor}}))[0].endswith(
        "39 generations differ"
    )
