"""Small samples: no verdict below the floor on n, intervals that stay honest at small n, the
"would decide it" figure from the interval's own formula, and runs that scored part of the
config (--tasks) saying so. No model is loaded."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from qeval.analysis.assemble import _compare, _group_scores, _task_infos, partial_tasks
from qeval.analysis.comparison import Paired, compare, compare_suite
from qeval.analysis.recommend import candidate_problem, recommend
from qeval.analysis.stats import (
    MIN_PAIRED_N,
    paired_accuracy,
    paired_mean,
    paired_ratio,
    samples_to_decide,
    verdict,
)
from qeval.config import ModelSpec, RunConfig, load_config
from qeval.config.gates import Gate
from qeval.config.setups import Setup
from qeval.records.store import RunStore
from qeval.report.html import render_html
from qeval.report.markdown import render_markdown
from qeval.results.schema import Figure, Memory, MetricValue, Results, SetupResult, TaskInfo, TaskScore, read_results
from qeval.run.preflight import preflight
from tests.helpers import ROOT, sample_records

V1 = ROOT / "tests" / "data" / "run-v1"
GATE = [Gate(max_drop=0.02)]


def _bpb(n: int, shift: float = -0.003, seed: int = 0) -> Paired:
    """n documents' NLLs in bits (numerators) and bytes (the shared denominator)."""
    rng = np.random.default_rng(seed)
    den = rng.integers(200, 400, n).astype(float)
    base = den * rng.uniform(1.1, 1.3, n)
    return Paired("bits_per_byte", base, base + den * (shift + rng.normal(0, 0.002, n)), den)


def test_a_perplexity_gate_on_one_document_is_inconclusive_and_says_why() -> None:
    c = compare(_bpb(1), "ppl", 0, GATE)
    # the percentile bootstrap gave [delta, delta] here, and the gate passed
    assert c.verdict == "inconclusive" and c.ci_method == "t"
    assert c.ci[1] - c.ci[0] > 1.0  # bits per byte: the change could be as large as the document's value
    assert c.verdict_reason is not None and "only 1 document paired" in c.verdict_reason
    assert str(MIN_PAIRED_N) in c.verdict_reason


def test_below_the_floor_nothing_passes_or_fails() -> None:
    for n in range(1, MIN_PAIRED_N):
        assert compare(_bpb(n), "ppl", 0, GATE).verdict == "inconclusive", n
        assert compare(_bpb(n, shift=-0.5), "ppl", 0, GATE).verdict == "inconclusive", n  # a big gain, too
    # 3 of 3 flipped right -> wrong: Newcombe's interval alone says fail, beside McNemar's p = 0.25
    wrong = Paired("acc", np.ones(3), np.zeros(3))
    c = compare(wrong, "facts", 0, GATE)
    assert verdict(c.ci, True, 0.02) == "fail" and c.p_value == 0.25
    assert c.verdict == "inconclusive" and "only 3 documents paired" in (c.verdict_reason or "")


def test_at_and_above_the_floor_the_interval_decides() -> None:
    assert compare(_bpb(200), "ppl", 0, GATE).verdict == "pass"
    assert compare(_bpb(200, shift=0.1), "ppl", 0, GATE).verdict == "fail"
    c = compare(Paired("acc", np.ones(MIN_PAIRED_N), np.zeros(MIN_PAIRED_N)), "facts", 0, GATE)
    assert c.verdict == "fail" and c.verdict_reason is None


def test_the_ratio_interval_at_three_documents_is_not_min_to_max() -> None:
    data = _bpb(3)
    assert data.den is not None
    per_doc = (data.other - data.base) / data.den
    lo, hi = paired_ratio(data.base, data.other, data.den, "bits_per_byte", 0).ci
    # the percentile bootstrap returned about [min, max] of the three documents' differences
    spread = per_doc.max() - per_doc.min()
    assert lo < per_doc.min() - spread / 2 and hi > per_doc.max() + spread / 2


def test_the_t_intervals_cover_at_small_n() -> None:
    rng = np.random.default_rng(7)
    covered_ratio = covered_mean = 0
    draws, n = 400, 8
    for _ in range(draws):
        den = rng.integers(100, 500, n).astype(float)
        base = den * rng.uniform(1.0, 1.4, n)
        other = base + den * rng.normal(0.01, 0.02, n)  # true difference of the ratios: 0.01 on average
        lo, hi = paired_ratio(base, other, den, "bits_per_byte", 0).ci
        covered_ratio += lo <= 0.01 <= hi
        b = rng.uniform(0, 1, n)
        lo, hi = paired_mean(b, b + rng.normal(0.05, 0.1, n), "acc", 0).ci
        covered_mean += lo <= 0.05 <= hi
    assert 0.91 <= covered_ratio / draws <= 0.99 and 0.91 <= covered_mean / draws <= 0.99


def test_samples_to_decide_with_no_flip_comes_from_newcombes_interval() -> None:
    cmp = paired_accuracy(np.ones(8, bool), np.ones(8, bool), "acc", 0)
    need = samples_to_decide(cmp, True, 0.02)
    assert need == 189  # a 1/sqrt(n) extrapolation said 2,105: the interval shrinks as 1/n here
    assert cmp.interval_at is not None
    assert verdict(cmp.interval_at(need), True, 0.02) == "pass"
    assert verdict(cmp.interval_at(need - 1), True, 0.02) == "inconclusive"
    c = compare(Paired("acc", np.ones(8), np.ones(8)), "facts", 0, GATE)
    assert c.verdict == "inconclusive" and c.samples_to_decide == 189


def test_samples_to_decide_is_searched_for_every_kind_and_in_the_reason() -> None:
    data = _bpb(8, shift=0.0005)
    c = compare(data, "ppl", 0, [Gate(max_drop=0.001)])
    assert data.den is not None
    cmp = paired_ratio(data.base, data.other, data.den, "bits_per_byte", 0)
    assert c.verdict == "inconclusive" and c.samples_to_decide is not None and cmp.interval_at is not None
    assert verdict(cmp.interval_at(c.samples_to_decide), False, 0.001) == "pass"
    assert verdict(cmp.interval_at(c.samples_to_decide - 1), False, 0.001) == "inconclusive"
    assert compare(_bpb(1), "ppl", 0, GATE).samples_to_decide is None  # no spread at n = 1: no estimate
    results = read_results(V1 / "results.json")
    kv4 = results.setup("kv-int4")
    facts = compare(Paired("acc", np.ones(8), np.ones(8)), "addition", 0, GATE)
    results.setups[results.setups.index(kv4)] = kv4.model_copy(
        update={"vs_baseline": kv4.vs_baseline | {"addition": facts}}
    )
    reason = recommend(results).reasons["kv-int4"]
    assert "inconclusive against the 2 pt gate" in reason and "about 189 samples would decide it" in reason


def test_a_suite_with_a_task_below_the_floor_is_inconclusive() -> None:
    gate = [Gate(task="s", min_recovery=0.5)]
    small = Paired("acc", np.ones(3), np.ones(3))
    big = Paired("acc", np.ones(400), np.ones(400))
    parts = {"a": (small, compare(small, "a", 0, [])), "b": (big, compare(big, "b", 0, []))}
    assert compare_suite(parts, gate, "s").verdict == "inconclusive"
    parts["a"] = parts["b"]
    assert compare_suite(parts, gate, "s").verdict == "pass"


def _entry(name: str, baseline: bool, scores: dict[str, float]) -> SetupResult:
    return SetupResult(
        name=name,
        baseline=baseline,
        status="ok",
        spec={},
        memory=Memory(weights_bytes=Figure(), kv_bytes_per_token=Figure()),
        tasks={t: TaskScore(n=8, metrics={"acc": MetricValue(value=v)}) for t, v in scores.items()},
    )


def test_a_group_with_a_missing_member_has_no_score_and_no_verdict(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for name in ("b", "q"):
        store.write_task(
            name, "g_one", "k", sample_records({"sample_id": str(i), "correct": True} for i in range(400)), {}, {}, None
        )
    cfg = RunConfig(
        name="x",
        model=ModelSpec(path="m"),
        tasks=["t"],
        gates=GATE,
        setups=[Setup(name="b", baseline=True), Setup(name="q", weights="int8")],
    )
    pre = SimpleNamespace(cfg=cfg, groups={"g": ["g_one", "g_two", "g_three"]}, suites={})
    info = {"output_type": "multiple_choice", "n": 400, "sha256": "", "fingerprint": "", "metric": "acc"}
    tasks = {"g_one": TaskInfo(**info, kind="lm_eval", entry="g"), "g": TaskInfo(**info, kind="group", entry="g")}
    entries = {n: _entry(n, n == "b", {"g_one": 1.0}) for n in ("b", "q")}
    out = _compare(pre, store, entries, tasks)  # type: ignore[arg-type]
    # it passed on 1 of 3 subjects
    assert "g" not in out["q"].vs_baseline and "g" not in out["q"].tasks
    assert out["q"].vs_baseline["g_one"].n == 400  # the member itself is still compared
    full = _group_scores(_entry("q", False, {"g_one": 1.0, "g_two": 0.5, "g_three": 0.0}), tasks, pre.groups)
    assert full["g"].metrics["acc"].value == 0.5


def test_a_run_limited_by_tasks_says_so(tmp_path: Path) -> None:
    pre = preflight(load_config(ROOT / "configs" / "demo.yaml"), only_tasks=["compare_mc"])
    partial = partial_tasks(pre, _task_infos(pre, {}))
    assert partial == {t: "not selected by --tasks" for t in ("addition", "facts", "ppl")}
    assert partial_tasks(preflight(load_config(ROOT / "configs" / "demo.yaml")), _task_infos(pre, {})) == partial
    # the old run scored every task: mark it as scored on compare_mc alone
    results = read_results(V1 / "results.json")
    results = results.model_copy(update={"run": results.run.model_copy(update={"partial_tasks": partial})})
    rec = recommend(results)
    assert (
        rec.setup == "int4"
        and "judged on part of the config only (not scored: addition: not selected by --tasks; facts"
        in rec.reasons["int4"]
    )
    problem = candidate_problem(results.model_copy(update={"recommendation": rec}))
    assert problem is not None and "judged on part of the config" in problem
    assert "This run scored part of the config" in render_markdown(results)
    run = tmp_path / "run"
    shutil.copytree(V1, run)
    assert 'id="partial"' in render_html(run, results)
    assert "scored part of the config" not in render_markdown(read_results(V1 / "results.json"))


def test_a_group_member_alone_gets_no_group_verdict_or_recommendation() -> None:
    results = read_results(V1 / "results.json")
    info = results.tasks["facts"]
    tasks = {
        "g_one": info.model_copy(update={"entry": "g"}),
        "g": info.model_copy(update={"kind": "group", "entry": "g"}),
    }
    why = "1 of its 3 tasks scored (missing: g_two, g_three: not selected by --tasks), so no group score or verdict"
    run = results.run.model_copy(update={"partial_tasks": {"g": why}})
    setups = [s.model_copy(update={"vs_baseline": {}}) for s in results.setups]
    results = results.model_copy(update={"tasks": tasks, "setups": setups, "run": run, "groups": {"g": ["g_one"]}})
    rec = recommend(results)
    assert rec.reasons["int8"] == f"int8: no paired comparison with the baseline on g ({why}): no evidence, no pass"
    assert rec.setup == "bf16"  # the baseline, never a quantized setup, on no evidence
    assert Results.model_validate(results.model_dump(mode="json")).run.partial_tasks == {"g": why}


def test_a_member_only_other_setups_hold_leaves_its_group_partial() -> None:
    """A sequential run limited by --tasks to one group member scores the group's other members for
    the setups that are not the baseline (its cell's members go together), never for the baseline:
    the group has no score or verdict, so the run says it scored part of the config (measured: the
    recommendation had dropped "judged on part of the config" and --fail-on-gate exited 0)."""
    tiny = {"output_type": "multiple_choice", "n": 12, "sha256": "", "fingerprint": "", "metric": "acc"}
    pre = SimpleNamespace(
        entries=["g", "t"],
        tasks=[SimpleNamespace(name=n, entry="g") for n in ("g_one", "g_two")] + [SimpleNamespace(name="t", entry="t")],
        run_tasks=["g_one", "t"],
        groups={"g": ["g_one", "g_two"]},
    )
    tasks = {n: TaskInfo(**tiny, kind="lm_eval", entry=e) for n, e in (("g_one", "g"), ("g_two", "g"), ("t", "t"))}
    why = "1 of its 2 tasks scored (missing: g_two: not selected by --tasks), so no group score or verdict"
    assert partial_tasks(pre, tasks, {"g_one", "t"}) == {"g": why}  # type: ignore[arg-type]
    assert partial_tasks(pre, tasks, {"g_one", "g_two", "t"}) == {}  # type: ignore[arg-type]  # stored before
    assert partial_tasks(pre, tasks) == {}  # type: ignore[arg-type]  # no baseline that ran ok: as before
