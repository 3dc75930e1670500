"""One setup that scores NaN (a checkpoint with one NaN weight) is that setup's failure, with its
reason; the others are reported, results.json reads back and `qeval report` works; a rerun
scores it again and says the same; a baseline stored with NaN scores (before the check) leaves
no verdict (docs/guarantees.md, "Non-finite scores"). The tiny model, --limit 3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qeval.results.schema import Results, read_results
from tests.helpers import BASELINE, INT8, MODEL, make_config, run_cli

TASKS = ("ppl", "compare_mc")


def _nan_checkpoint(folder: Path) -> Path:
    """A copy of the tiny model with one weight set to NaN (every document's scores turn NaN)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shutil.copytree(MODEL, folder)
    path = folder / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
    save_file(tensors, str(path), metadata=meta)
    return folder


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, run directory) of bf16, int8 and the NaN checkpoint, run once."""
    tmp = tmp_path_factory.mktemp("nan")
    nanck = {"name": "nanck", "checkpoint": _nan_checkpoint(tmp / "nanck")}
    cfg = make_config(tmp, setups=[BASELINE, INT8, nanck], tasks=list(TASKS))
    out = tmp / "out"
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "3")
    assert res.returncode == 1, res.stderr[-3000:]  # a setup failed; not a crash
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return cfg, out


def _check_reported(results: Results) -> None:
    nan = results.setup("nanck")
    assert nan.status == "failed" and nan.error is not None, nan
    assert nan.error.startswith("non-finite scores: task ppl: metrics bits_per_byte"), nan.error
    assert "nll is NaN on 3 of 3 documents" in nan.error and "task compare_mc: " in nan.error
    assert nan.tasks == {} and nan.vs_baseline == {}
    for name in ("bf16", "int8"):
        assert results.setup(name).status == "ok" and set(results.setup(name).tasks) == set(TASKS)
    assert set(results.setup("int8").vs_baseline) == set(TASKS)
    rec = results.recommendation
    assert rec.setup is not None and rec.setup != "nanck" and "nanck" not in rec.candidates
    assert rec.reasons["nanck"] == f"nanck: failed: {nan.error}"


def test_a_nan_setup_fails_alone_with_its_reason(nan_run: tuple[Path, Path]) -> None:
    _, out = nan_run
    _check_reported(read_results(out / "results.json"))
    # decided by the worker: stored as failed, its non-finite tasks not stored (a rerun scores them again)
    stored = json.loads((out / "setups" / "nanck.json").read_text())
    assert stored["status"] == "failed" and stored["error"].startswith("non-finite scores: ")
    assert not (out / "samples" / "nanck" / "ppl.meta.json").exists()
    report = run_cli("report", str(out))
    assert report.returncode == 0, report.stderr[-2000:]
    assert "non-finite scores: task ppl" in (out / "report.md").read_text()


def test_a_rerun_scores_the_nan_setup_again_and_says_the_same(nan_run: tuple[Path, Path], tmp_path: Path) -> None:
    cfg, first = nan_run
    out = tmp_path / "out"
    shutil.copytree(first, out)
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "3")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "bf16: all 2 tasks stored, skipped" in res.stderr and "nanck: ppl" in res.stderr
    results = read_results(out / "results.json")
    _check_reported(results)
    assert results.setup("nanck").error == read_results(first / "results.json").setup("nanck").error


def test_a_baseline_stored_with_nan_scores_leaves_no_verdict(nan_run: tuple[Path, Path], tmp_path: Path) -> None:
    """A store written before the worker's check: the baseline's ppl records and metrics NaN,
    stored as ok. Assembly fails it; nothing is compared with it; the run is still reported."""
    cfg, first = nan_run
    out = tmp_path / "out"
    shutil.copytree(first, out)
    samples = out / "samples" / "bf16" / "ppl.jsonl"
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    samples.write_text("".join(json.dumps(r | {"nll": float("nan")}) + "\n" for r in rows))
    meta_path = out / "samples" / "bf16" / "ppl.meta.json"
    meta = json.loads(meta_path.read_text())
    meta["metrics"]["bits_per_byte"]["value"] = float("nan")
    meta_path.write_text(json.dumps(meta))
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "3", "--setups", "bf16,int8")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    results = read_results(out / "results.json")
    base = results.setup("bf16")
    assert base.status == "failed" and base.error is not None
    assert base.error.startswith("non-finite scores: task ppl: metric bits_per_byte is NaN, nll is NaN on 3 of 3")
    assert all(s.vs_baseline == {} for s in results.setups)  # no verdict, so no pass
    rec = results.recommendation
    assert rec.setup is None and rec.blocked is not None and "non-finite scores" in rec.blocked
    assert run_cli("report", str(out)).returncode == 0
