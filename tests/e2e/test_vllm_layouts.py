"""vLLM's CPU build's own KV accounting, measured: for each attention layout it runs (full,
sliding everywhere, sliding + full, with sinks, chunked + full, MLA latent, linear attention +
full), on small dummy-weight models with a fixed KV pool, the maximum concurrency its log states
equals qeval's per-sequence prediction (bench/vllm_layouts.py).

CI starts the engine on the three layouts whose accounting differs most (the hybrid allocator's
grouping of sliding + full layers, here with a layer's KV kept at bf16 beside FP8 ones where the
CPU runs FP8, the MLA latent, a linear-attention state page); the other four
(full, sliding everywhere, sinks, chunked + full: grouped as sliding + full is) were measured by
the same script in one run (docs/memory.md) and share these code paths: each engine start is
about 28-38 s on the 2-core CI machines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def _ci_layouts() -> tuple[str, ...]:
    """Sliding + full layers as the hybrid allocator groups them: where the CPU runs an FP8 KV cache,
    with a sliding layer kept at bf16 beside FP8 ones (`kv_keep`: buckets by kind and dtype, the FP8
    layers' block doubled), which groups a uniform-dtype model's kinds the same way; else plain."""
    from qeval.backends.vllm.support import cpu_has_fp8

    return ("kv_keep:0" if cpu_has_fp8() else "gemma3_text", "deepseek_v3", "qwen3_next")


def test_vllm_states_the_concurrency_qeval_predicts(tmp_path: Path) -> None:
    out, layouts = tmp_path / "layouts.json", _ci_layouts()
    res = subprocess.run(
        [
            str(ROOT / ".venv-vllm" / "bin" / "python"),
            str(ROOT / "bench" / "vllm_layouts.py"),
            "--json",
            str(out),
            "--only",
            ",".join(layouts),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(layouts) and not [r for r in rows if "error" in r], rows
    for r in rows:
        assert r["vllm_concurrency"] == pytest.approx(r["qeval_concurrency"], abs=0.005), r
