"""bench/perf_vs_vllm_bench.py runs in CI: its figures are produced and the prompts match
(the lm-eval comparison's agreement is tested by tests/e2e/test_lm_eval_tasks.py). Timings are
printed by the benchmarks, never asserted: they belong to benchmarks, not tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def test_perf_bench_runs_vllm_bench_on_the_same_engine(tmp_path: Path) -> None:
    """bench/perf_vs_vllm_bench.py: vLLM's own throughput and latency benchmarks and qeval's
    performance phase on one engine and workload, the same prompts token for token. (The 5%
    agreement is the benchmark's to print, docs/benchmarks.md; timings are not asserted here.)"""
    from qeval.backends import backend_entry
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.setups import Setup

    python = backend_entry("vllm").worker_python(
        RunConfig(name="b", model=ModelSpec(path="m"), backend="vllm", setups=[Setup(name="s")], tasks=["t"])
    )
    out = tmp_path / "perf.json"
    res = subprocess.run(
        [
            python,
            str(ROOT / "bench" / "perf_vs_vllm_bench.py"),
            "--num-prompts",
            "16",
            "--output-len",
            "16",
            "--repeats",
            "2",
            "--latency-iters",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["same_prompts"] is True
    assert [r["figure"] for r in figures["rows"]] == [
        "requests/s (all at once)",
        "output tokens/s (all at once)",
        "latency of a batch of 8 (s)",
    ]
    for r in figures["rows"]:
        for side in ("qeval", "vllm_bench"):
            assert len(r[side]["values"]) == 2 and r[side]["median"] > 0
        assert r["ratio"] == pytest.approx(r["qeval"]["median"] / r["vllm_bench"]["median"])
        assert r["verdict"] in ("agree", "inconclusive", "disagree")
    assert "qeval / bench" in res.stdout
