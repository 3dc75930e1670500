"""Scores that are not numbers (docs/guarantees.md, "Non-finite scores"): the statistics treat a
NaN as no evidence instead of crashing, a task's NaN is named in one line, and the results
written hold no NaN (a setup holding one fails; a baseline holding one leaves no verdict). No
model is loaded."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from qeval.analysis.comparison import NON_FINITE_REASON, Paired, adjust_p_values, compare
from qeval.analysis.finite import finite_results, task_problem
from qeval.analysis.recommend import candidate_problem, recommend
from qeval.analysis.stats import paired_mean, paired_ratio, unpaired_difference, verdict
from qeval.config.gates import Gate
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_bytes
from qeval.results.schema import Comparison, MetricValue, Results, TaskScore, read_results
from tests.helpers import ROOT, sample_records

V1 = ROOT / "tests" / "data" / "run-v1"
NAN = float("nan")


def _cmp(p: float | None) -> Comparison:
    return Comparison(metric="acc", higher_is_better=True, delta=0.0, ci=(-0.1, 0.1), p_value=p, n=10)


def test_a_nan_p_value_is_no_evidence_and_does_not_stop_the_adjustment() -> None:
    out = adjust_p_values({"ppl": _cmp(NAN), "mc": _cmp(0.01), "gen": _cmp(0.04), "inf": _cmp(math.inf)})
    assert out["ppl"].p_value is None and out["ppl"].p_adjusted is None
    assert out["inf"].p_value is None and out["inf"].p_adjusted is None
    # the others adjusted among themselves (BH over 2 p-values), as if the NaN one were absent
    assert out["mc"].p_adjusted == pytest.approx(0.02) and out["gen"].p_adjusted == pytest.approx(0.04)


def test_tests_on_nan_scores_return_no_p_value_and_no_verdict() -> None:
    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    other = base.copy()
    other[2] = NAN
    den = np.full(8, 10.0)
    assert paired_ratio(base, other, den, "bits_per_byte", 0).p_value is None
    assert paired_mean(base / 10, other / 10, "mc2", 0).p_value is None
    assert unpaired_difference(base, other, "score").p_value is None
    assert verdict((NAN, NAN), True, 0.02) == "inconclusive"
    assert verdict((-0.01, 0.01), True, NAN) == "inconclusive"
    c = compare(Paired("bits_per_byte", base, other, den), "ppl", 0, [Gate(max_drop=0.02)])
    assert c.verdict == "inconclusive" and c.verdict_reason == NON_FINITE_REASON
    assert c.p_value is None and c.samples_to_decide is None


def test_a_tasks_non_finite_scores_are_named_in_one_line() -> None:
    good = [{"sample_id": str(i), "nll": 2.0, "n_tokens": 3, "target": "a"} for i in range(3)]
    metrics = {"bits_per_byte": {"value": 1.2, "stderr": NAN}}  # an undefined stderr (n = 1) is no problem
    assert task_problem("ppl", sample_records(good), metrics) is None
    # a NaN in the data (a target) is data, not a score
    assert task_problem("ppl", sample_records([good[0] | {"target": NAN}]), metrics) is None
    bad = [r | {"nll": NAN} for r in good[:2]] + good[2:]
    why = task_problem(
        "ppl", sample_records(bad), {"bits_per_byte": {"value": NAN}, "token_perplexity": {"value": NAN}}
    )
    assert why == "task ppl: metrics bits_per_byte, token_perplexity are NaN, nll is NaN on 2 of 3 documents"
    lls = [good[0] | {"loglikelihoods": [-1.0, -math.inf]}]
    assert task_problem("mc", sample_records(lls), {}) == "task mc: loglikelihoods is infinite on 1 of 1 document"
    # NaN log-probs turned into a first-choice pick: `correct` and acc look fine, the scores are not
    picked = [good[0] | {"correct": True, "loglikelihoods": [NAN, NAN, NAN], "nll": NAN}]
    assert (
        task_problem("mc", sample_records(picked), {"acc": {"value": 1.0}})
        == "task mc: nll is NaN on 1 of 1 document, loglikelihoods is NaN on 1 of 1 document"
    )
    lm_eval = [good[0] | {"metrics": {"acc": 1.0, "word_perplexity": NAN}}]
    assert task_problem("arc", sample_records(lm_eval), {}) == "task arc: metrics is NaN on 1 of 1 document"
    assert "KL distribution is NaN" in (task_problem("ppl", sample_records(good), metrics, {"kl_mean": NAN}) or "")


def _with(results: Results, name: str, **update: object) -> Results:
    return results.model_copy(
        update={"setups": [s.model_copy(update=update) if s.name == name else s for s in results.setups]}
    )


def test_a_setup_holding_a_nan_fails_and_the_file_reads_back(tmp_path: Path) -> None:
    results = read_results(V1 / "results.json")
    int8 = results.setup("int8")
    broken = _with(
        results,
        "int8",
        vs_baseline=int8.vs_baseline | {"ppl": int8.vs_baseline["ppl"].model_copy(update={"delta": NAN})},
    )
    path = tmp_path / "results.json"
    atomic_write_bytes(path, broken.model_dump_json().encode())
    with pytest.raises(UserError, match="not a qeval results file"):  # what the backstop prevents
        read_results(path)
    fixed = finite_results(broken)
    out = fixed.setup("int8")
    assert out.status == "failed" and out.error == "non-finite values in results: vs_baseline.ppl.delta"
    assert out.vs_baseline == {} and out.tasks == int8.tasks  # its finite scores are still shown
    assert fixed.setup("int4").vs_baseline == results.setup("int4").vs_baseline  # the others untouched
    rec = recommend(fixed)
    assert rec.setup != "int8" and rec.reasons["int8"].startswith("int8: failed: non-finite values")
    atomic_write_bytes(path, fixed.model_copy(update={"recommendation": rec}).model_dump_json().encode())
    assert read_results(path).setup("int8").status == "failed"


def test_a_baseline_holding_a_nan_leaves_no_verdict() -> None:
    results = read_results(V1 / "results.json")
    base = results.baseline
    assert base is not None and any(c.verdict == "pass" for s in results.setups for c in s.vs_baseline.values())
    tasks = base.tasks | {"ppl": TaskScore(n=base.tasks["ppl"].n, metrics={"bits_per_byte": MetricValue(value=NAN)})}
    fixed = finite_results(_with(results, base.name, tasks=tasks))
    assert fixed.setup(base.name).status == "failed" and "ppl" not in fixed.setup(base.name).tasks
    assert "tasks.ppl.metrics.bits_per_byte.value" in (fixed.setup(base.name).error or "")
    assert all(s.vs_baseline == {} and s.suites == {} for s in fixed.setups)  # nothing compared with it
    rec = recommend(fixed)
    assert rec.setup is None and rec.candidates == [] and rec.blocked is not None
    assert all("not compared, so not recommended" in why for why in rec.reasons.values())
    assert candidate_problem(fixed.model_copy(update={"recommendation": rec})) is not None


def test_a_perplexity_past_a_float_is_infinite_and_named_not_an_overflow() -> None:
    """Finite log-probs of -10,000 a token (a broken model, or a server: each passes the answer's
    checks) give a perplexity past the largest float: a non-finite score named in one line, not
    an OverflowError with a traceback as the setup's reason (issue 40 review, point 1)."""
    from qeval.tasks.scoring import _perplexity_metrics

    records = sample_records(
        [
            {"sample_id": "0", "nll": 5e4, "n_tokens": 5, "n_bytes": 20},
            {"sample_id": "1", "nll": 4e4, "n_tokens": 4, "n_bytes": 16},
        ]
    )
    metrics = _perplexity_metrics(records)
    assert metrics["token_perplexity"]["value"] == math.inf
    assert task_problem("ppl", records, metrics) == "task ppl: metric token_perplexity is infinite"
    one = sample_records([{"sample_id": "0", "nll": NAN, "n_tokens": 5, "n_bytes": 20}])
    nan = _perplexity_metrics(one)  # NaN stays NaN, not inf
    value = nan["token_perplexity"]["value"]
    assert value is not None and math.isnan(value)
