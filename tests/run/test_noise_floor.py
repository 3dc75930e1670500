"""The noise floor end to end (docs/statistics.md, "The noise floor"), and each setup's kernel
provenance (docs/backends.md, "Kernel provenance"): an A/A control, the
baseline served again at another batch size, on a backend made deliberately batch-dependent
(tests/kinds/noisy_backend.py) shows a non-zero floor beside every gate, in results.json, the
report and load_run, and is never recommended; a control the backend or the config cannot stand
is one line, exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import qeval
from tests.helpers import BASELINE, INT8, ROOT, make_config, one_line_exit_2, run_cli

CONTROL = {"name": "bf16-b1", "control": {"batch_size": 1}}


def test_a_batch_dependent_engine_shows_its_floor_beside_every_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{ROOT / 'tests' / 'kinds'}:{ROOT}")
    monkeypatch.setenv("QEVAL_BACKENDS", "noisy_backend:BACKEND")
    cfg = make_config(tmp_path, backend="noisy", tasks=["compare_mc"], limit=60, setups=[BASELINE, CONTROL, INT8])
    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    by = {s["name"]: s for s in results["setups"]}
    floor = by["bf16-b1"]["vs_baseline"]["compare_mc"]
    assert by["bf16-b1"]["spec"]["control"] == {"batch_size": 1}
    assert floor["flips_to_wrong"] + floor["flips_to_right"] > 0  # the engine's own flips, measured
    # every gate of the quantized setup carries the floor, and says whether it is within it
    int8 = by["int8"]["vs_baseline"]["compare_mc"]
    assert int8["floor"]["setup"] == "bf16-b1" and int8["floor"]["conditions"] == "batch_size 1"
    assert int8["floor"]["flips_to_wrong"] == floor["flips_to_wrong"] and int8["floor"]["n"] == floor["n"]
    changed = int8["flips_to_wrong"] + int8["flips_to_right"]
    assert int8["within_floor"] == (
        changed <= floor["flips_to_wrong"] + floor["flips_to_right"]
        and abs(int8["delta"]) <= abs(floor["delta"])
        and (int8["kl"] is None or floor["kl"] is None or int8["kl"] <= floor["kl"])
    )
    assert "floor" not in by["bf16-b1"]["vs_baseline"]["compare_mc"] or floor["floor"] is None
    # never a candidate: it measures the engine
    rec = results["recommendation"]
    assert "bf16-b1" not in rec["candidates"] and "noise floor" in rec["reasons"]["bf16-b1"]
    assert "spec" in by["bf16"] and "control" not in by["bf16"]["spec"]  # a setup that is no control echoes as before
    report = (out / "report.md").read_text()
    assert "## Noise floor" in report and "noise floor: Δ, flips, KL (control)" in report
    assert ("within" if int8["within_floor"] else "beyond") in report
    assert 'id="noise-floor"' in (out / "report.html").read_text()
    # what transformers ran, read off each loaded model: quanto's int8 modules, the attention, the cache
    prov = {n: s["quantization"]["provenance"] for n, s in by.items()}
    assert prov["int8"]["linear"]["Linear (bfloat16)"] == 1 and prov["int8"]["linear"]["QLinear (qint8)"] > 0
    assert set(prov["bf16"]["linear"]) == {"Linear (bfloat16)"} and prov["bf16"]["attention"] == ["sdpa"]
    assert prov["bf16"]["kv_cache"].endswith("x DynamicLayer") and prov["int8"]["fallbacks"] == []
    assert "## What each setup ran" in report and "QLinear (qint8)" in report
    kernels = qeval.load_run(out).kernels()
    assert set(kernels.setup) == {"bf16", "bf16-b1", "int8"} and "QLinear (qint8)" in set(kernels.module)
    summary = qeval.load_run(out).summary()
    row = summary[(summary.setup == "int8") & (summary.task == "compare_mc")].iloc[0]
    assert row.floor_setup == "bf16-b1" and bool(row.within_floor) == int8["within_floor"]
    assert bool(summary[summary.setup == "bf16-b1"].iloc[0].control)


@pytest.mark.parametrize(
    ("setups", "backend", "candidate", "expected"),
    [
        ([BASELINE, {**CONTROL, "weights": "int8"}], "hf", None, "it differs from baseline bf16 in its quantization"),
        ([BASELINE, {**CONTROL, "control": {"max_num_seqs": 4}}], "hf", None, "control max_num_seqs: backend hf"),
        (
            [BASELINE, {**CONTROL, "control": {"max_num_batched_tokens": 512}}],
            "hf",
            None,
            "control max_num_batched_tokens: backend hf",
        ),
        ([{**CONTROL, "baseline": True}], "hf", None, "a control is the baseline served again"),
        ([BASELINE, CONTROL], "hf", "bf16-b1", "candidate bf16-b1 is a control"),
        ([BASELINE, {"name": "c", "control": {}}], "hf", None, "control: names no serving condition"),
        ([BASELINE, {**CONTROL, "control": {"batch_size": 1}}], "vllm", None, "control batch_size: backend vllm"),
    ],
)
def test_a_control_that_cannot_stand_is_one_line(
    tmp_path: Path, setups: list[dict], backend: str, candidate: str | None, expected: str
) -> None:
    keys = {"candidate": candidate} if candidate else {}
    cfg = make_config(tmp_path, setups=setups, backend=backend, **keys)
    one_line_exit_2(run_cli("validate", str(cfg)), expected)


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("vllm", "engine.batch_invariant: vLLM's CPU build has no batch-invariant mode"),
        ("hf", "engine.batch_invariant applies to backend vllm only (this config's backend is hf)"),
    ],
)
def test_batch_invariant_mode_where_the_engine_has_none_is_one_line(
    tmp_path: Path, backend: str, expected: str
) -> None:
    cfg = make_config(tmp_path, backend=backend, engine={"batch_invariant": True}, setups=[BASELINE, CONTROL])
    one_line_exit_2(run_cli("validate", str(cfg)), expected)


def test_batch_invariant_mode_keys_and_hashes_only_when_on(tmp_path: Path) -> None:
    """The option reaches vLLM's key parts and the config hash only when on: results stored before
    it existed still match their keys."""
    from qeval.backends import backend_entry
    from qeval.backends.vllm.support import validate_engine
    from qeval.config import load_config
    from qeval.config.setups import Setup

    off = load_config(make_config(tmp_path, filename="off.yaml", backend="vllm"))
    on = load_config(make_config(tmp_path, filename="on.yaml", backend="vllm", engine={"batch_invariant": True}))
    parts = backend_entry("vllm").key_parts
    assert "batch_invariant" not in parts(off)["engine"] and '"batch_invariant": true' in parts(on)["engine"]
    assert "batch_invariant" not in off.as_json()["engine"] and on.as_json()["engine"]["batch_invariant"] is True
    validate_engine(on, Setup(name="bf16"), "cuda")  # a GPU build takes it: passed through at engine start
