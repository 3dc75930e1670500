"""Engine parity end to end (docs/statistics.md, "Engine parity"): the baseline on transformers and,
in the same run, on vLLM's CPU build (a control with `backend: vllm`), paired per document: its own
worker interpreter, its own resume-key parts and KV accounting, never a floor and never a candidate;
and a parity control the config cannot stand is one line, exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import BASELINE, make_config, one_line_exit_2, run_cli

PARITY = {"name": "on-vllm", "control": {"backend": "vllm"}}


@pytest.mark.slow
def test_transformers_against_vllm_in_one_run(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, tasks=["compare_mc", "ppl"], limit=30, setups=[BASELINE, PARITY])
    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    by = {s["name"]: s for s in results["setups"]}
    vllm = by["on-vllm"]
    assert vllm["status"] == "ok", vllm["error"]
    # served by the engine: vLLM's engine arguments, its key parts, its paged KV accounting
    assert vllm["quantization"]["engine_args"]["model"].endswith("qeval-tiny")
    key = json.loads((out / "setups" / "on-vllm.json").read_text())["key_parts"]
    assert key["backend"] == "vllm" and "engine" in key
    assert json.loads((out / "setups" / "bf16.json").read_text())["key_parts"]["backend"] == "hf"
    assert (
        vllm["memory"]["kv_per_sequence"]["engine"] == "vllm"
        and by["bf16"]["memory"]["kv_per_sequence"]["engine"] == "hf"
    )
    # paired per document with the transformers baseline: every document, a KL on every scored token
    for task in ("compare_mc", "ppl"):
        c = vllm["vs_baseline"][task]
        assert c["n"] == 30 and c["kl"] is not None and c["kl"] >= 0 and c["kl"] < 0.05, (task, c)
    # never a candidate (nor a floor: tests/analysis/test_floor.py)
    assert "on-vllm" not in results["recommendation"]["candidates"]
    assert "engine parity (the baseline served on vllm)" in results["recommendation"]["reasons"]["on-vllm"]
    report = (out / "report.md").read_text()
    assert "## Engine parity" in report and "| on-vllm | vllm | compare_mc |" in report
    assert "## Noise floor" not in report  # its difference is the engines', not the engine's noise


@pytest.mark.parametrize(
    ("control", "expected"),
    [
        ({"backend": "hf"}, "control backend hf is the run's own"),
        ({"backend": "nope"}, "backend: 'nope' is not a backend qeval has"),
        ({"backend": "vllm", "batch_size": 1}, "control batch_size: backend vllm has no such serving condition"),
    ],
)
def test_a_parity_control_that_cannot_stand_is_one_line(tmp_path: Path, control: dict, expected: str) -> None:
    cfg = make_config(tmp_path, setups=[BASELINE, {"name": "other", "control": control}])
    one_line_exit_2(run_cli("validate", str(cfg)), expected)


def test_vllm_offline_against_the_endpoint_it_serves_is_one_config(tmp_path: Path) -> None:
    """A vLLM run whose parity control runs on the openai backend (a launched `vllm serve`) takes the
    `server:` block the control needs; a config whose no setup runs on a server backend still refuses it."""
    served = {"name": "endpoint", "control": {"backend": "openai", "concurrency": 4}}
    cfg = make_config(tmp_path, backend="vllm", setups=[BASELINE, served], server={"mode": "launch"})
    res = run_cli("validate", str(cfg))
    assert res.returncode == 0, res.stderr
    alone = make_config(tmp_path, filename="alone.yaml", backend="vllm", setups=[BASELINE], server={"mode": "launch"})
    one_line_exit_2(run_cli("validate", str(alone)), "server: applies to backend openai only")
