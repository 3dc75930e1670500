"""CPUs without native 16-bit arithmetic, and the ceilings probe's time bound.

The CPU kind changes between machines (AVX-512 with avx512_bf16, or AVX2 only, where torch
emulates bfloat16 about 116x slower than float32). These tests simulate the CPU the machine
does not have by mocking the detection, so both branches run on either kind."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from qeval.backends import device as precision
from tests.helpers import MODEL, ROOT, TASKS

AVX2 = frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_bf16", "avx512_vnni"}


@pytest.fixture
def no_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees an x86 CPU with AVX2 and FMA only."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX2)
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(precision.platform, "system", lambda: "Linux")


@pytest.fixture
def bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX512_BF16)
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(precision.platform, "system", lambda: "Linux")


def test_auto_is_float32_without_native_bf16(no_bf16: None) -> None:
    p = precision.resolve_precision("auto", {"dtype": "bfloat16"}, "cpu")
    assert p.dtype == "float32" and not p.emulated
    assert "no native bfloat16" in p.reason and "avx512_bf16" in p.reason


def test_auto_is_the_models_own_dtype_where_native(bf16: None) -> None:
    assert precision.resolve_precision("auto", {"dtype": "bfloat16"}, "cpu").dtype == "bfloat16"
    assert precision.resolve_precision("auto", {"torch_dtype": "bfloat16"}, "cpu").dtype == "bfloat16"
    # float16 is not native on an AVX-512 CPU without avx512_fp16: float32, not an emulated half
    assert precision.resolve_precision("auto", {"dtype": "float16"}, "cpu").dtype == "float32"
    assert precision.resolve_precision("auto", {"dtype": "float32"}, "cpu").dtype == "float32"
    assert precision.resolve_precision("auto", {"dtype": "float16"}, "cuda").dtype == "float16"


def test_bfloat16_if_native_follows_the_cpu_not_the_models_dtype(bf16: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real demo's baseline: a float32 folder (dequantized SmolLM2) served as its bf16 original
    where the CPU has native bf16, and in float32, flagged with why, where it has not."""
    p = precision.resolve_precision("bfloat16-if-native", {"dtype": "float32"}, "cpu")
    assert (p.dtype, p.emulated, p.fallback) == ("bfloat16", False, "")
    assert p.short == "dtype bfloat16 (bfloat16-if-native)"
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX2)
    p = precision.resolve_precision("bfloat16-if-native", {"dtype": "float32"}, "cpu")
    assert p.dtype == "float32" and not p.emulated and "no native bfloat16" in p.reason
    assert p.short == "dtype float32 (bfloat16-if-native: this CPU has no native bfloat16)"


def test_explicit_16bit_on_an_emulating_cpu_is_kept_and_flagged(no_bf16: None) -> None:
    p = precision.resolve_precision("bfloat16", {"dtype": "bfloat16"}, "cpu")
    assert p.dtype == "bfloat16" and p.emulated
    assert "116x slower" in p.reason and "dtype: auto" in p.reason


def test_arm_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(precision.platform, "system", lambda: "Linux")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"fp", "asimd", "asimdhp", "bf16"}))
    assert precision.native_16bit("cpu") == {"bfloat16", "float16"}
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"fp", "asimd"}))
    assert precision.native_16bit("cpu") == frozenset()


def _config(tmp: Path, dtype: str) -> Path:
    """The small run config on `dtype` and device auto (the default both resolve here)."""
    from tests.helpers import INT8, make_config

    return make_config(
        tmp,
        name="c",
        model={"path": MODEL, "dtype": dtype},
        tasks_dir=TASKS,
        tasks=["facts"],
        setups=[{"name": "base", "baseline": True}, INT8],
        device=None,
        batch_size=None,
        gates=None,
        performance=None,
    )


def _validate_in_process(cfg: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from typer.testing import CliRunner

    from qeval.cli import app

    res = CliRunner().invoke(app, ["validate", str(cfg)])
    return res.exit_code, res.stdout, res.stderr


def test_validate_says_what_bf16_costs_here_and_what_to_use(
    no_bf16: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _validate_in_process(_config(tmp_path, "bfloat16"), capsys)
    assert code == 0, out + err
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1, err
    assert "no native bfloat16" in warning[0] and "116x slower" in warning[0] and "dtype: auto" in warning[0]
    code, out, err = _validate_in_process(_config(tmp_path, "auto"), capsys)
    assert code == 0 and "warning" not in err, err
    assert "dtype float32 (auto: this CPU has no native bfloat16)" in out


def test_auto_is_resolved_before_keys_memory_and_workers(no_bf16: None, tmp_path: Path) -> None:
    """What `auto` chose is what the setups run in: the resume key, the memory prediction and
    the worker's job all see float32 on this (simulated) CPU, and bfloat16 on the other kind."""
    from qeval.config import load_config
    from qeval.records.keys import setup_keys
    from qeval.run.preflight import preflight

    pre = preflight(load_config(_config(tmp_path, "auto")))
    assert pre.dtype == "float32" and pre.precision.requested == "auto"
    assert setup_keys(pre, pre.cfg.setups[0]).parts["dtype"] == "float32"


@pytest.mark.parametrize("requested", ["auto", "bfloat16-if-native"])
def test_preflight_keeps_the_asked_dtype_and_the_run_the_resolved_one(
    no_bf16: None, tmp_path: Path, requested: str
) -> None:
    """The config stays what the user asked; the resolved dtype lives beside it (pre.precision)
    and everything stored reads as it did when preflight wrote it into the config: the resume
    keys, results.json's config block and hash are those of the same run asking float32 (what
    both resolve to here), and the worker's job carries the config as asked plus the dtype."""
    from qeval.config import RunConfig, load_config
    from qeval.records.job import read_job
    from qeval.records.keys import setup_keys
    from qeval.records.store import RunStore
    from qeval.run.jobs import one_job
    from qeval.run.preflight import preflight

    cfg = load_config(_config(tmp_path / "asked", requested))
    pre = preflight(cfg)
    explicit = preflight(load_config(_config(tmp_path / "explicit", "float32")))
    assert cfg.model.dtype == pre.cfg.model.dtype == requested  # not changed in place
    assert (pre.dtype, pre.precision.requested) == ("float32", requested)
    for setup in pre.setups:
        keys, want = setup_keys(pre, setup), setup_keys(explicit, setup)
        assert keys.parts["dtype"] == "float32"
        assert keys.key == want.key and keys.tasks == want.tasks and keys.tasks
    assert pre.config_json()["model"]["dtype"] == "float32"
    assert pre.config_json() == explicit.config_json() == explicit.cfg.as_json()
    assert pre.config_hash() == explicit.cfg.config_hash() != pre.cfg.config_hash()
    keys = setup_keys(pre, pre.setups[1])
    worker = one_job(pre, RunStore(tmp_path / "run"), pre.setups[1], {"facts": "k"}, keys, "base", "", None)
    job = read_job(worker.job_path)
    assert job.dtype == "float32"
    asked = RunConfig.model_validate(job.config)  # what the worker re-validates: `auto` round-trips
    assert asked.model.dtype == requested and asked.for_engine(job.dtype).model.dtype == "float32"
    # results.json's run block: the dtype computed in, the one asked for, and why (schema-valid)
    from qeval.records.provenance import run_info
    from qeval.results.schema import RunInfo

    info = RunInfo.model_validate(run_info(pre, tmp_path / "run"))
    assert (info.dtype, info.dtype_requested) == ("float32", requested) and info.dtype_reason
    assert info.dtype_reason.startswith(f"dtype {requested}: float32, because")


def test_auto_keys_differ_between_cpu_kinds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from qeval.config import load_config
    from qeval.records.keys import setup_keys
    from qeval.run.preflight import preflight

    keys = {}
    for name, flags in (("avx2", AVX2), ("avx512", AVX512_BF16)):
        monkeypatch.setattr(precision, "cpu_flags", lambda f=flags: f)
        monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
        pre = preflight(load_config(_config(tmp_path, "auto")))
        keys[name] = setup_keys(pre, pre.cfg.setups[0])
    assert keys["avx2"].parts["dtype"] == "float32" and keys["avx512"].parts["dtype"] == "bfloat16"
    assert keys["avx2"].key != keys["avx512"].key


def test_the_shipped_demo_configs_use_auto() -> None:
    """So the same two README commands are fast on both CPU kinds."""
    import yaml

    for name in (
        "demo.yaml",
        "demo-vllm.yaml",
        "smollm2-longctx.yaml",
        "smollm2-longctx-vllm.yaml",
        "smollm2-openllm.yaml",
    ):
        cfg = yaml.safe_load((ROOT / "configs" / name).read_text())
        assert cfg["model"]["dtype"] == "auto", name
    real = yaml.safe_load((ROOT / "configs" / "smollm2-real.yaml").read_text())
    assert real["model"]["dtype"] == "bfloat16-if-native"


# -- the ceilings probe ---------------------------------------------------------------------------


def test_probe_is_bounded_on_a_slow_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """A matmul as slow as bfloat16 on an AVX2 CPU (0.3 GFLOP/s, as measured there: the
    fixed-size probe took 785 s): the probe sizes it by time and ends inside its budget,
    and its figure is the slow rate, with the size it was measured at in its source."""
    import torch

    from qeval.perf import ceilings

    real_mm, real_int = torch.matmul, torch._int_mm
    rate = 0.3e9

    def slow(real: Any) -> Any:
        def op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            out = real(a, b)
            time.sleep(2 * a.shape[0] * a.shape[1] * b.shape[1] / rate)
            return out

        return op

    monkeypatch.setattr(torch, "matmul", slow(real_mm))
    monkeypatch.setattr(torch, "_int_mm", slow(real_int))
    t0 = time.perf_counter()
    result = ceilings.probe("cpu", "bfloat16")
    elapsed = time.perf_counter() - t0
    assert elapsed <= ceilings.BUDGET_S + 1.0, elapsed
    assert result["probe_s"] <= ceilings.BUDGET_S + 1.0
    for kind in ("bfloat16", "int8"):
        peak = result["matmul_peak"][kind]
        assert 0.1e9 < peak["max"] <= rate * 1.01, (kind, peak)
        assert "x" in peak["source"] and "size grown until one call took 50 ms" in peak["source"]
        assert "2048x2048" not in peak["source"]  # not the fixed 2048^3 problem


def test_probe_on_this_cpu_is_within_its_budget() -> None:
    """The real probe, as the runner starts it (a fresh process)."""
    import subprocess
    import sys
    import tempfile

    from qeval.perf import ceilings

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "c.json"
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "qeval.perf.ceilings", str(out), "cpu", "float32"], check=True, timeout=120
        )
        wall = time.perf_counter() - t0
        result = json.loads(out.read_text())
    assert result["probe_s"] <= ceilings.BUDGET_S, result["probe_s"]
    assert wall <= ceilings.BUDGET_S + 20, wall  # torch's import on top
    assert result["copy_bandwidth"]["max"] > 1e8 and result["matmul_peak"]["float32"]["max"] > 1e8


def test_rates_print_in_a_unit_that_shows_them() -> None:
    from qeval.report.performance import rate_text

    assert rate_text(2.8e8, "FLOP/s") == "280 MFLOP/s"
    assert rate_text(2.772e12, "FLOP/s") == "2.77 TFLOP/s"
    assert rate_text(5.1e10, "OP/s") == "51 GOP/s"


@pytest.mark.parametrize(
    ("env", "native"),
    [
        ({}, {"bfloat16"}),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, set()),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, set()),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, {"bfloat16"}),
        ({"ATEN_CPU_CAPABILITY": "avx2"}, set()),
    ],
)
def test_isa_caps_in_the_environment_count(
    bf16: None, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], native: set[str]
) -> None:
    """torch computes like an AVX2 machine under these caps (how docs/benchmarks.md measures the
    AVX2 case on an AVX-512 machine), so `auto` must see them."""
    for key in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert precision.native_16bit("cpu") == native


@pytest.mark.parametrize(
    ("config", "dtype"),
    [
        ({}, "float32"),  # no dtype at all: float32, as transformers loads it, not an invented bfloat16
        ({"dtype": 16, "torch_dtype": "bfloat16"}, "bfloat16"),  # a malformed dtype: the older key still counts
        ({"dtype": ["bfloat16"]}, "float32"),
        ({"dtype": "torch.bfloat16"}, "bfloat16"),
        ({"dtype": "float64"}, "float32"),
        ({"text_config": {"dtype": "bfloat16"}}, "bfloat16"),  # a multimodal config's decoder
    ],
)
def test_auto_reads_only_a_dtype_the_config_really_names(bf16: None, config: dict, dtype: str) -> None:
    p = precision.resolve_precision("auto", config, "cpu")
    assert p.dtype == dtype, p
    if not config:
        assert "names no dtype" in p.reason


def test_an_isa_cap_is_named_as_the_cause(bf16: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    p = precision.resolve_precision("auto", {"dtype": "bfloat16"}, "cpu")
    assert p.dtype == "float32" and "ONEDNN_MAX_CPU_ISA=AVX2" in p.reason, p.reason


@pytest.mark.parametrize(
    ("isa", "native"),
    [("AVX512_CORE_FP16", {"bfloat16", "float16"}), ("AVX512_CORE_AMX", {"bfloat16", "float16"}), ("AVX2_VNNI", set())],
)
def test_onednn_isa_caps_are_ordered(bf16: None, monkeypatch: pytest.MonkeyPatch, isa: str, native: set) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX512_BF16 | {"avx512_fp16"})
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert precision.native_16bit("cpu") == native


@pytest.mark.parametrize(
    ("junk", "said"),
    [
        ("bf16", "'bf16' is a setup's `weights:` spelling; model.dtype takes bfloat16"),
        ("fp32", "'fp32' is a setup's `weights:` spelling; model.dtype takes float32"),
        ("int8", "'int8' is a quantization: give it as a setup's `weights: int8`"),
        ("Auto", "Input should be 'auto', 'bfloat16-if-native', 'bfloat16', 'float16' or 'float32'"),
    ],
)
def test_a_model_dtype_it_does_not_take_is_one_line_saying_what_it_takes(junk: str, said: str) -> None:
    """model.dtype spelled as a setup's weights (bf16, fp32) or given a quantization (int8): the
    line says what was meant (the field takes bfloat16 / float32; quantizing is a setup's job)."""
    from pydantic import ValidationError

    from qeval.config import RunConfig
    from tests.helpers import config_dict

    with pytest.raises(ValidationError, match="model.dtype") as exc:
        RunConfig.model_validate(config_dict(model={"dtype": junk}))
    assert said in str(exc.value)
