"""The benchmark's agreement half, in CI: qeval and lm-evaluation-harness give the same
per-sample log-likelihoods and accuracy on the same model and data. (Its speed ratio is
printed by `make bench`, not asserted: timings belong to benchmarks, not tests.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_qeval_agrees_with_lm_eval(tmp_path: Path, backend: str) -> None:
    """hf: qeval's transformers backend against lm-eval's HFLM; vllm: both on the vLLM engine
    (lm-eval's `vllm` model type, in .venv-vllm where `make vllm` installs lm-eval too)."""
    from qeval.backends import backend_entry
    from qeval.config import ModelSpec, RunConfig
    from qeval.setups import Setup

    python = sys.executable
    if backend == "vllm":
        python = backend_entry("vllm").worker_python(RunConfig(name="b", model=ModelSpec(path="m"), backend="vllm",
                                         setups=[Setup(name="s")], tasks=["t"]))
    out = tmp_path / "bench.json"
    res = subprocess.run([python, str(ROOT / "bench" / "compare_lm_eval.py"), "--backend", backend, "--limit", "120",
                          "--json", str(out)], capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert {t["task"] for t in figures["tasks"]} == {"compare_mc", "ppl"}
    for t in figures["tasks"]:
        assert t["max_abs_diff"] < 1e-3, t
        assert t["qeval"] == pytest.approx(t["lm_eval"], abs=1e-6), t
    assert "speed-up (lm-eval / qeval)" in res.stdout
