"""Sweeps of several models, without running one: the `models:` config and its refusals, and the
sweep's summary and report from stored runs (tests/data/run-v1 as two models)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from qeval.config import RunConfig
from qeval.errors import UserError
from qeval.records.store import RunStore
from qeval.results.schema import read_results
from qeval.sweep.config import Sweep, load_sweep
from qeval.sweep.report import render_sweep, write_sweep_report
from qeval.sweep.schema import read_sweep
from qeval.sweep.summary import summarize
from tests.helpers import MODEL, ROOT, TASKS, cpu_dtype, run_cli

SWEEP = f"""\
name: s
models:
  - {{name: a, path: "{MODEL}", max_context: 256}}
  - name: b
    path: "{MODEL}"
    dtype: float32
    max_context: 256
    setups: [{{name: fp32, baseline: true}}, {{name: kv-int4, kv_cache: int4}}]
tasks_dir: "{TASKS}"
device: cpu
setups: [{{name: bf16, baseline: true}}, {{name: int8, weights: int8}}]
tasks: [addition]
executor: {{kind: ray, max_parallel: 4}}
"""


def _one_line_exit_2(res: subprocess.CompletedProcess[str], expected: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], res.stderr[-2000:]


def test_each_model_is_a_run_config_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SWEEP)
    sweep = load_sweep(tmp_path / "s.yaml")
    assert sweep is not None and sweep.name == "s" and sweep.reference == "a"
    a, b = sweep.configs["a"], sweep.configs["b"]
    # dtype: the default, auto (resolved per device at preflight)
    assert (a.name, a.model.dtype, [s.name for s in a.setups]) == ("a", "auto", ["bf16", "int8"])
    assert (b.name, b.model.dtype, [s.name for s in b.setups]) == ("b", "float32", ["fp32", "kv-int4"])
    assert a.executor == b.executor and a.executor.max_parallel == 4  # one executor runs both models' jobs
    assert a.tasks == b.tasks == ["addition"] and a.model.path == str(MODEL)
    (tmp_path / "one.yaml").write_text((ROOT / "configs" / "demo.yaml").read_text())
    assert load_sweep(tmp_path / "one.yaml") is None  # one `model:`: an ordinary run


def test_validate_checks_every_model(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SWEEP)
    res = run_cli("validate", str(tmp_path / "s.yaml"))
    assert res.returncode == 0, res.stderr
    auto = (
        "dtype bfloat16 (auto)"
        if cpu_dtype() == "bfloat16"
        else "dtype float32 (auto: this CPU has no native bfloat16)"
    )  # model a leaves dtype to its default, auto
    assert res.stdout.splitlines() == [
        f"{tmp_path / 's.yaml'} model a: ok (2 setups, 1 tasks, device cpu, {auto})",
        f"{tmp_path / 's.yaml'} model b: ok (2 setups, 1 tasks, device cpu, dtype float32)",
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda t: t.replace("name: b\n", "name: a\n"), "models: duplicate model names: a"),
        (
            lambda t: t.replace("tasks_dir:", f"model: {{path: {MODEL}}}\ntasks_dir:"),
            "give `model` (one model) or `models` (a sweep), not both",
        ),
        (lambda t: t.replace("name: b\n", "name: ../b\n"), "models.1.name: '../b' is not allowed as a name"),
        (lambda t: t.replace("    dtype: float32\n", "    dtype: int3\n"), "models.1.dtype: Input should be"),
        (lambda t: t.replace("setups: [{name: bf16", "oops: [{name: bf16"), "models.a: no setups: give the model its"),
        (lambda t: t + "candidate: int8\n", "models.b: candidate 'int8' is not a setup of this config"),
        (lambda t: t.replace("models:\n", "models: []\nx_models:\n"), "models: expected a list of models"),
    ],
)
def test_bad_sweeps_are_one_line(tmp_path: Path, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "s.yaml").write_text(change(SWEEP))
    _one_line_exit_2(run_cli("validate", str(tmp_path / "s.yaml")), expected)


def test_commands_of_one_model_refuse_a_sweep(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SWEEP)
    _one_line_exit_2(run_cli("quantize", str(tmp_path / "s.yaml")), "lists several models (a sweep)")


def _two_runs(tmp_path: Path) -> tuple[Sweep, dict, dict]:
    """tests/data/run-v1 as model `a`, and a copy as model `b` whose baseline got one addition
    sample wrong that `a` got right."""
    runs = {}
    for name in ("a", "b"):
        shutil.copytree(ROOT / "tests" / "data" / "run-v1", tmp_path / "models" / name)
        runs[name] = read_results(tmp_path / "models" / name / "results.json")
    path = tmp_path / "models" / "b" / "samples" / "bf16" / "addition.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    first = next(i for i, r in enumerate(records) if r["correct"])
    records[first]["correct"] = False
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = RunConfig.model_validate(runs["a"].config.as_dict())
    sweep = Sweep("s", {"a": cfg.model_copy(update={"name": "a"}), "b": cfg.model_copy(update={"name": "b"})})
    stores = {n: RunStore(tmp_path / "models" / n) for n in runs}
    return sweep, runs, stores


def test_baselines_are_compared_with_the_reference_models_paired_by_document(tmp_path: Path) -> None:
    sweep, runs, stores = _two_runs(tmp_path)
    summary = summarize(sweep, runs, stores, "ray", "t0", "t1")
    assert summary.reference_model == "a" and [m.name for m in summary.models] == ["a", "b"]
    assert summary.models[0].recommendation == runs["a"].recommendation.setup
    assert set(summary.baselines_vs_reference) == {"b"}
    vs = summary.baselines_vs_reference["b"]
    assert set(vs) == set(runs["a"].tasks)
    assert vs["addition"].flips_to_wrong == 1 and vs["addition"].flips_to_right == 0
    assert vs["addition"].delta == pytest.approx(-1 / vs["addition"].n)
    assert vs["compare_mc"].delta == 0 and vs["addition"].verdict is None  # models are compared, not gated


def test_the_report_puts_the_models_side_by_side(tmp_path: Path) -> None:
    sweep, runs, stores = _two_runs(tmp_path)
    summary = summarize(sweep, runs, stores, "local", "t0", "t1")
    (tmp_path / "sweep.json").write_text(summary.model_dump_json(indent=2))
    md = write_sweep_report(tmp_path).read_text()
    assert md == render_sweep(read_sweep(tmp_path / "sweep.json"), runs)
    baselines = md.split("## The models' baselines", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in baselines.splitlines() if line.startswith("| a") or line.startswith("| b")]
    assert len(rows) == 2 and rows[0].startswith("| a (reference) |")
    assert "-4.2 pts [" in rows[1]  # 1 of 24 documents flipped to wrong
    across = md.split("## Setups across models", 1)[1].split("\n## ", 1)[0]
    assert "| kv-int2 |" in across and across.count("sequences") >= 2
    assert md.count("- **a**:") == 1 and md.count("- **b**:") == 1
    assert "## Model a" in md and "### Recommendation" in md  # each model's own report, nested


def test_a_sweep_file_cannot_point_outside_its_directory(tmp_path: Path) -> None:
    sweep, runs, stores = _two_runs(tmp_path)
    data = json.loads(summarize(sweep, runs, stores, "local", "t0", "t1").model_dump_json())
    data["models"][1]["run_dir"] = "../elsewhere"
    (tmp_path / "sweep.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="outside the run directory"):
        write_sweep_report(tmp_path)
