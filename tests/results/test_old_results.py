"""A results.json written by an older qeval (commit f24d008: `qeval run configs/demo.yaml --limit 8
--no-performance`, its samples kept, the top-k files left out) still loads, reports, drills
down and compares: the schema gains fields, it never loses them. Its typed echoes (a setup's
spec and quantization, the machine, the config) are read from it, and written back as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import qeval
from qeval.results.schema import read_results
from tests.helpers import ROOT, run_cli

OLD = ROOT / "tests" / "data" / "results_f24d008"


def test_typed_fields_are_read_from_the_old_file() -> None:
    r = read_results(OLD / "results.json")
    assert r.run.git_commit is not None and r.run.git_commit.startswith("f24d008")
    assert r.config.model.path.endswith("/models/qeval-tiny") and r.config.budget.context_len == 256
    assert r.config.budget.gpu_memory_gib == 0.01 and r.config.recommend_by == "concurrency"
    assert r.config.seed == 1234 and r.config.batch_size == 64
    assert r.run.hardware.cpus is not None and r.run.hardware.cpus > 0 and r.run.hardware.machine
    int8 = r.setup("int8")
    assert int8.spec.id == "88e7f5152ddaaeaf" and int8.spec.weights == "int8" and int8.spec.method == "rtn"
    assert r.setup("bf16").spec.baseline and r.setup("kv-int4").spec.kv_cache == "int4"
    assert int8.quantization.library is not None and int8.quantization.library.startswith("optimum-quanto")
    assert int8.quantization.as_dict()["scheme"]  # a backend's own key, kept beside the typed ones


def test_the_echoes_write_back_exactly_the_keys_they_were_given() -> None:
    raw = json.loads((OLD / "results.json").read_text())
    again = json.loads(read_results(OLD / "results.json").model_dump_json())
    assert again["config"] == raw["config"]
    assert again["run"]["hardware"] == raw["run"]["hardware"]
    for before, after in zip(raw["setups"], again["setups"], strict=True):
        assert after["spec"] == before["spec"] and after["quantization"] == before["quantization"]


def test_the_old_run_reports_drills_down_and_compares(tmp_path: Path) -> None:
    run = tmp_path / "old"
    shutil.copytree(OLD, run)
    res = run_cli("report", str(run), timeout=300)
    assert res.returncode == 0, res.stderr
    md = (run / "report.md").read_text()
    assert "/models/qeval-tiny` (sha256" in md and "0.01 GiB x 0.9 utilization" in md
    assert "models/qeval-tiny" in (run / "report.html").read_text()

    loaded = qeval.load_run(run)
    assert loaded.config.budget.context_len == 256 and loaded.baseline == "bf16"
    summary = loaded.summary()
    assert len(summary) > 0 and set(loaded.setups) >= {"bf16", "int8", "int4"}
    assert len(loaded.samples("int8", "addition")) == 8

    out = tmp_path / "cmp"
    res = run_cli("compare", str(OLD), str(run), "--output", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "compare.json").read_text())
    pairs = report["comparisons"][0]["setups"]
    assert {p["setup"] for p in pairs} >= {"bf16", "int8"}
    assert all(t["paired"] and t["delta"] == 0 for p in pairs for t in p["tasks"])
    assert report["comparisons"][0]["changes"] == []
