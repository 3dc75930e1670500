"""Paired statistics and the KV-cache flag, on stored records (no model needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qeval.analysis.comparison import compare_task, outputs_identical, weights_twin
from qeval.analysis.stats import paired_accuracy, verdict
from qeval.config import ModelSpec, RunConfig
from qeval.config.gates import Gate
from qeval.config.setups import Setup
from qeval.records.store import RunStore
from qeval.results.samples import SampleRecord
from tests.helpers import sample_records


def _records(correct: list[bool], nll: float = 1.0) -> list[SampleRecord]:
    return sample_records(
        {
            "sample_id": str(i),
            "target": "a",
            "prediction": "a" if c else "b",
            "correct": c,
            "loglikelihoods": None,
            "nll": nll,
            "n_tokens": 3,
        }
        for i, c in enumerate(correct)
    )


def test_planted_drop_is_detected_and_null_is_not() -> None:
    rng = np.random.default_rng(0)
    base = rng.random(400) < 0.9
    worse = base.copy()
    worse[np.flatnonzero(base)[:40]] = False  # 10 points worse
    cmp = paired_accuracy(base, worse, "acc", seed=1)
    assert cmp.delta == -0.1 and cmp.ci[1] < 0 and cmp.p_value is not None and cmp.p_value < 1e-6
    assert cmp.flips_to_wrong == 40 and cmp.flips_to_right == 0
    false_alarms = 0
    for seed in range(40):
        r = np.random.default_rng(seed)
        a, b = r.random(400) < 0.8, r.random(400) < 0.8
        p = paired_accuracy(a, b, "acc", seed=seed).p_value
        assert p is not None
        false_alarms += p < 0.05
    assert false_alarms <= 6  # 5% of 40 expected; a generous bound


def test_verdicts() -> None:
    assert verdict((-0.004, 0.002), True, 0.01) == "pass"
    assert verdict((-0.05, -0.02), True, 0.01) == "fail"
    assert verdict((-0.03, 0.01), True, 0.01) == "inconclusive"
    assert verdict((0.001, 0.004), False, 0.01) == "pass"  # lower is better: a small increase


def test_identical_kv_outputs_are_flagged(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    recs = _records([True, False, True])
    for name in ("bf16", "kv4", "kv2"):
        store.write_task(name, "t", "k", recs if name != "kv2" else _records([True, True, True], 1.5), {}, {}, None)
    assert outputs_identical(store, "kv4", "bf16", ["t"])
    assert not outputs_identical(store, "kv2", "bf16", ["t"])
    cfg = RunConfig(
        name="x",
        model=ModelSpec(path="m"),
        tasks=["t"],
        setups=[Setup(name="bf16", baseline=True), Setup(name="kv4", kv_cache="int4")],
    )
    twin = weights_twin(cfg, cfg.setups[1])
    assert twin is not None and twin.name == "bf16"


def test_compare_task_applies_the_gate(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write_task("b", "t", "k", _records([True] * 300), {}, {}, None)
    store.write_task("q", "t", "k", _records([True] * 240 + [False] * 60), {}, {}, None)
    out = compare_task(store, "b", "q", "t", "exact_match", 0, [Gate(max_drop=0.01)])
    assert out is not None
    assert out.delta == -0.2 and out.verdict == "fail" and out.flips_to_wrong == 60


def test_reasons_and_reports_count_whole_sequences() -> None:
    """Issue 40, minor: "5009.55 sequences" was printed; a fraction of a sequence is not served."""
    import re

    from qeval.analysis.recommend import recommend
    from qeval.memory.capacity import whole_sequences
    from qeval.report.markdown import render_markdown
    from qeval.results.schema import read_results
    from tests.helpers import ROOT

    assert whole_sequences(5009.55) == "5,009" and whole_sequences(0.99) == "0"
    results = read_results(ROOT / "tests" / "data" / "run-v1" / "results.json")
    rec = recommend(results)
    reasons = " ".join(rec.reasons.values())
    report = render_markdown(results.model_copy(update={"recommendation": rec}))  # not the stored old text
    assert "sequences" in reasons and not re.findall(r"\d\.\d+ sequences", reasons + report)
