"""Long-context runs end to end: on the shipped model (every hf KV setup), on
SmolLM2-135M (INT4 and INT2 KV caches, all three task families) and on vLLM's FP8 KV cache
where the CPU runs it; and the benchmark's bound on the long-context path's cost. Short
lengths (256-1024 tokens): the 2k/4k/8k run is configs/smollm2-longctx.yaml (docs/tasks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import MODEL, ROOT, TASKS, run_cli

pytestmark = pytest.mark.slow
SMOLLM2 = ROOT / "models" / "smollm2-135m"
needs_smollm2 = pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="make smollm2 first")


def _run(tmp: Path, name: str, **keys: Any) -> tuple[Path, dict[str, Any]]:
    """A long-context run of helpers.make_config(**keys), written to tmp/NAME.yaml: no native
    tasks, no batch size or performance block, gates only where `keys` give them."""
    from tests.helpers import make_config

    keys = {"tasks": None, "batch_size": None, "gates": None, "performance": None} | keys
    cfg = make_config(tmp, filename=f"{name}.yaml", name=name, tasks_dir=TASKS, **keys)
    out = tmp / name
    res = run_cli("run", str(cfg), "--output", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


def _kl_above_zero_in_every_bucket(out: Path, results: dict[str, Any], setups: list[str]) -> None:
    """Every quantized-KV setup: each bucket of each length carries a KL to the baseline above
    zero, and the buckets of a length cover its documents' tokens exactly."""
    by_name = {s["name"]: s for s in results["setups"]}
    for name in setups:
        s = by_name[name]
        assert s["status"] == "ok", s["error"]
        for point in s["long_context"]["lengths"]:
            assert point["buckets"], (name, point["length"])
            for b in point["buckets"]:
                assert b["kl"] > 0, (name, point["length"], b)
                assert 0 < b["top1_agreement"] <= 1 and b["ci"][0] <= b["delta"] <= b["ci"][1]
            ppl = point["tasks"]["position_ppl"]
            records = [json.loads(x) for x in (out / "samples" / name / f"{ppl}.jsonl").read_text().splitlines()]
            assert sum(b["tokens"] for b in point["buckets"]) == sum(x["n_tokens"] for x in records)
            assert point["kv_bytes"] == s["memory"]["kv_bytes_per_token"]["measured"] * point["length"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from tests.helpers import BASELINE

    setups = [BASELINE, *({"name": f"kv-{kv}", "kv_cache": kv} for kv in ("int4", "int2", "fp8"))]
    return _run(
        tmp_path_factory.mktemp("lc"),
        "tiny-longctx",
        model={"path": MODEL, "dtype": "float32"},
        backend="hf",
        setups=setups,
        long_context={"tasks": ["position_ppl"], "samples": 3, "chunk_tokens": 64},
        budget={"gpu_memory_gib": 0.01, "utilization": 0.9, "context_len": 256, "overhead_gib": 0.001},
        gates=[
            {"task": "position_ppl", "length": "budget", "max_drop": 0.5},
            {"task": "position_ppl", "length": 128, "max_drop": 0.5},
        ],
    )


def test_tiny_model_lengths_buckets_and_gates(tiny: tuple[Path, dict[str, Any]]) -> None:
    out, r = tiny
    info = r["long_context"]
    assert info["lengths"] == [64, 128, 256] and info["deployment_length"] == 256
    assert info["bucket_edges"] == [0, 16, 64, 128, 256]
    _kl_above_zero_in_every_bucket(out, r, ["kv-int4", "kv-int2", "kv-fp8"])
    assert {t: r["tasks"][t]["entry"] for t in info["families"]["position_ppl"].values()} == {
        "position_ppl_64": "position_ppl",
        "position_ppl_128": "position_ppl",
        "position_ppl_256": "position_ppl_256",
    }
    for s in r["setups"][1:]:  # gated at the deployment length and at the length a gate names, not at 64
        vs = s["vs_baseline"]
        assert vs["position_ppl_64"]["verdict"] is None
        assert vs["position_ppl_128"]["gate"]["length"] == 128 and vs["position_ppl_256"]["gate"]["length"] == 256
    md = (out / "report.md").read_text()
    assert "## Long context" in md and "### Loss by token position" in md and "256 (deployment)" in md
    assert (out / "report.html").read_text().count('<figure class="plot">') == 5
    res = run_cli("run", str(out.parent / "tiny-longctx.yaml"), "--output", str(out))
    assert res.returncode == 0 and res.stderr.count("skipped") == 4  # resumed: the same generated tasks, same keys


@needs_smollm2
def test_smollm2_kv_caches_at_short_lengths(tmp_path: Path) -> None:
    """SmolLM2 at 512 tokens, in buckets of 256: passkey and position perplexity under INT4 and
    INT2 KV caches; the INT2 cache's KL exceeds the INT4 one's (multi-key retrieval is the tiny
    model's test's: a third of this one's CI minutes; a second length, 256, took a third more)."""
    from tests.helpers import BASELINE

    out, r = _run(
        tmp_path,
        "smollm2-lc",
        model={"path": SMOLLM2, "dtype": "auto", "max_context": 512},
        backend="hf",
        setups=[BASELINE, {"name": "kv-int4", "kv_cache": "int4"}, {"name": "kv-int2", "kv_cache": "int2"}],
        long_context={
            "lengths": [512],
            "tasks": ["passkey", "position_ppl"],
            "samples": 2,
            "depths": [0.5],
            "chunk_tokens": 128,
            "buckets": [256, 512],
        },
        budget={"gpu_memory_gib": 4, "context_len": 512, "overhead_gib": 0.5},
    )
    _kl_above_zero_in_every_bucket(out, r, ["kv-int4", "kv-int2"])
    assert set(r["tasks"]) == {"passkey_512", "position_ppl_512"}
    kl = {s["name"]: s["vs_baseline"]["position_ppl_512"]["kl"] for s in r["setups"][1:]}
    assert kl["kv-int2"] > kl["kv-int4"] > 0


@needs_smollm2
def test_vllm_fp8_kv_cache_at_a_long_prompt(tmp_path: Path) -> None:
    """vLLM's FP8 KV cache on a 512-token prompt (two buckets; 1k took 116 s of CI's time, the
    long-context path's cost is bench's and test_long_context_path_cost_is_bounded's): every
    bucket's KL to the baseline above zero where the CPU runs it (AVX-512 or AMX); refused before
    any engine starts elsewhere."""
    from qeval.backends.vllm.support import cpu_has_fp8

    if not cpu_has_fp8():
        pytest.skip("this CPU has neither AVX-512 nor AMX: vLLM's FP8 KV cache is refused (tested in test_vllm)")
    from tests.helpers import BASELINE

    out, r = _run(
        tmp_path,
        "vllm-lc",
        model={"path": SMOLLM2, "dtype": "auto", "max_context": 512},
        backend="vllm",
        setups=[BASELINE, {"name": "kv-fp8", "kv_cache": "fp8"}],
        long_context={
            "lengths": [512],
            "tasks": ["passkey", "position_ppl"],
            "samples": 2,
            "depths": [0.5],
            "buckets": [256, 512],
        },
        budget={"gpu_memory_gib": 4, "context_len": 512, "overhead_gib": 0.5},
    )
    _kl_above_zero_in_every_bucket(out, r, ["kv-fp8"])
    assert [b["start"] for b in r["setups"][1]["long_context"]["lengths"][0]["buckets"]] == [0, 256]


@needs_smollm2
def test_long_context_path_cost_is_bounded(tmp_path: Path) -> None:
    """bench/longctx_prefill.py on SmolLM2 at 1024 tokens in 256-token chunks, one thread:
    scoring and generation under an INT4 KV cache within x3 of plain prefill (measured on the
    2-core dev machine: x1.30 and x2.19; the 10 decoded tokens weigh more at 1k than at 8k,
    where the bound is x2 and the measured figures x1.27 and x1.44: docs/benchmarks.md)."""
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "longctx_prefill.py"),
            "--model",
            str(SMOLLM2),
            "--tokens",
            "1024",
            "--chunk",
            "256",
            "--threads",
            "1",
            "--max-ratio",
            "3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["tokens"] == 1024 and figures["threads"] == 1 and figures["max_ratio"] == 3
    assert max(figures["scoring_ratio"], figures["generation_ratio"]) <= 3
