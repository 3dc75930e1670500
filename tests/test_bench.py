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


def test_qeval_agrees_with_lm_eval(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "compare_lm_eval.py"), "--limit", "120",
                          "--json", str(out)], capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert {t["task"] for t in figures["tasks"]} == {"compare_mc", "ppl"}
    for t in figures["tasks"]:
        assert t["max_abs_diff"] < 1e-3, t
        assert t["qeval"] == pytest.approx(t["lm_eval"], abs=1e-6), t
    assert "speed-up (lm-eval / qeval)" in res.stdout
