"""vLLM's CPU build's own KV accounting, measured: for each attention layout it runs (full,
sliding everywhere, sliding + full, with sinks, chunked + full, MLA latent, linear attention +
full), on small dummy-weight models with a fixed KV pool, the maximum concurrency its log states
equals qeval's per-sequence prediction (bench/vllm_layouts.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def test_vllm_states_the_concurrency_qeval_predicts(tmp_path: Path) -> None:
    out = tmp_path / "layouts.json"
    res = subprocess.run([str(ROOT / ".venv-vllm" / "bin" / "python"), str(ROOT / "bench" / "vllm_layouts.py"),
                          "--json", str(out)], capture_output=True, text=True, timeout=1200, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 7 and not [r for r in rows if "error" in r], rows
    for r in rows:
        assert r["vllm_concurrency"] == pytest.approx(r["qeval_concurrency"], abs=0.005), r
