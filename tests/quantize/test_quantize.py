"""`qeval quantize`: checkpoints keyed by what makes them, made atomically, refused clearly.
The slow tests run llm-compressor for real (.venv-quant) on the shipped model."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qeval.backends.device import dtype_for
from qeval.config import load_config
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.model.source import folder_checksum
from qeval.quantize.checkpoints import RECORD, check_group_divides, checkpoint_dir, needs_checkpoint, recipe_spec
from qeval.quantize.pipeline import quant_python
from tests.helpers import MODEL, ROOT, TASKS, demo_vllm_config, run_cli


def _one_line_exit_2(res: object, *needles: str) -> None:
    assert res.returncode == 2, res.stderr[-2000:]  # type: ignore[attr-defined]
    # an optional setup this CPU cannot run (the demo's FP8 KV cache on AVX2) is one notice line of
    # its own, before the error
    lines = [
        ln
        for ln in res.stderr.strip().splitlines()  # type: ignore[attr-defined]
        if not ln.startswith("qeval: optional setup ")
    ]
    err = "\n".join(lines)
    assert len(lines) == 1, err
    for n in needles:
        assert n in err, err


def test_key_covers_what_changes_a_checkpoint(tmp_path: Path) -> None:
    cfg = load_config(demo_vllm_config(tmp_path, tmp_path / "ck"))
    w4a8 = next(s for s in cfg.setups if s.name == "w4a8")
    base = checkpoint_dir(cfg, w4a8, "m" * 64, "c" * 64, "float32")
    assert base.parent == tmp_path / "ck" and base.name.startswith("qeval-tiny-w4a8-")
    assert checkpoint_dir(cfg, w4a8, "m" * 64, "c" * 64, "float32") == base  # stable
    renamed = w4a8.model_copy(update={"name": "other"})
    assert checkpoint_dir(cfg, renamed, "m" * 64, "c" * 64, "float32") == base  # names don't count
    changed = [
        checkpoint_dir(cfg, w4a8, "n" * 64, "c" * 64, "float32"),  # another model
        checkpoint_dir(cfg, w4a8, "m" * 64, "d" * 64, "float32"),  # other calibration text
        checkpoint_dir(cfg, w4a8.model_copy(update={"group_size": 64}), "m" * 64, "c" * 64, "float32"),
        checkpoint_dir(
            cfg.model_copy(update={"quantize": cfg.quantize.model_copy(update={"num_samples": 64})}),
            w4a8,
            "m" * 64,
            "c" * 64,
            "float32",
        ),
        checkpoint_dir(cfg, w4a8, "m" * 64, "c" * 64, "bfloat16"),  # another resolved model dtype
    ]
    assert len({base, *changed}) == 6


def test_a_recipe_without_calibration_is_keyed_without_its_text(tmp_path: Path) -> None:
    """FP8_DYNAMIC and the weight-only FP4 recipes read no calibration text: another text (or
    another number of samples) makes the same checkpoint, so its key stays; NVFP4's activation
    scale is calibrated, so its key moves with the text."""
    cfg = load_config(demo_vllm_config(tmp_path, tmp_path / "ck"))
    more = cfg.model_copy(update={"quantize": cfg.quantize.model_copy(update={"num_samples": 64})})
    for method, weights, calibrated in (
        ("fp8_dynamic", "fp8", False),
        ("mxfp4a16", "fp4", False),
        ("nvfp4", "fp4", True),
    ):
        setup = Setup(name="s", weights=weights, method=method)  # type: ignore[arg-type]
        assert needs_checkpoint(setup)
        spec = recipe_spec(cfg, setup, "float32")
        assert spec["rtn"] is True and ("num_samples" in spec) is calibrated
        base = checkpoint_dir(cfg, setup, "m" * 64, "c" * 64, "float32")
        others = {
            checkpoint_dir(cfg, setup, "m" * 64, "d" * 64, "float32"),
            checkpoint_dir(more, setup, "m" * 64, "c" * 64, "float32"),
        }
        assert (others == {base}) is not calibrated, method
        assert checkpoint_dir(cfg, setup, "n" * 64, "c" * 64, "float32") != base  # the model always counts


def test_a_group_that_does_not_divide_the_columns_is_refused_first() -> None:
    """SmolLM2's 576 columns: groups of 128 are refused in one line before llm-compressor loads
    (it would stop there after loading the model); 64, NVFP4's 16 and a row no longer than the
    group pass, and a kept layer is not checked."""
    linear = [("model.layers.0.self_attn.q_proj", 576, 576), ("model.layers.0.mlp.down_proj", 576, 1536)]
    with pytest.raises(
        UserError, match="groups of 128 do not divide the 576 columns of model.layers.0.self_attn.q_proj"
    ):
        check_group_divides(Setup(name="g", weights="int4", method="gptq"), linear)
    check_group_divides(Setup(name="g", weights="int4", method="gptq", group_size=64), linear)
    check_group_divides(Setup(name="n", weights="fp4", method="nvfp4"), linear)
    check_group_divides(Setup(name="t", weights="int4", method="gptq", group_size=1024), [("a", 8, 576)])
    check_group_divides(Setup(name="k", weights="int4", method="gptq", keep=("*.q_proj",)), linear)


def test_a_run_without_its_checkpoints_says_to_quantize(tmp_path: Path) -> None:
    res = run_cli("validate", str(demo_vllm_config(tmp_path, tmp_path / "empty")))
    _one_line_exit_2(res, "setup 'w8a8'", "W8A8 checkpoint", "run `qeval quantize`")


def test_bad_quantize_input_is_one_line_exit_2(tmp_path: Path) -> None:
    from tests.helpers import BASELINE, make_config

    plain = make_config(
        tmp_path,
        filename="plain.yaml",
        name="p",
        max_context=None,
        backend="vllm",
        setups=[BASELINE],
        device=None,
        batch_size=None,
        gates=None,
        performance=None,
    )
    _one_line_exit_2(run_cli("quantize", str(plain)), "no setup to quantize")

    missing = demo_vllm_config(tmp_path, tmp_path / "ck")
    missing.write_text(missing.read_text().replace("quantize:\n", "quantize:\n  calibration: {path: nowhere.jsonl}\n"))
    _one_line_exit_2(run_cli("quantize", str(missing)), "calibration file", "not found")

    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"text": "1 + 2 = 3"}\n{"text": "4 + 4 = 8"}\n{"text": "cut off\n')
    bad = demo_vllm_config(tmp_path, tmp_path / "ck")
    bad.write_text(bad.read_text().replace("quantize:\n", f"quantize:\n  calibration: {{path: {corrupt}}}\n"))
    _one_line_exit_2(run_cli("quantize", str(bad)), f"{corrupt}:3: corrupt dataset line")

    no_field = tmp_path / "nofield.jsonl"
    no_field.write_text('{"body": "x"}\n')
    bad.write_text(bad.read_text().replace(str(corrupt), str(no_field)))
    _one_line_exit_2(run_cli("quantize", str(bad)), "no string field 'text'")

    served = demo_vllm_config(tmp_path, tmp_path / "ck")  # a block its backend would ignore: refused first
    served.write_text(served.read_text() + "server: {mode: launch}\n")
    _one_line_exit_2(run_cli("quantize", str(served)), "server: applies to backend openai only")

    if shutil.which("nvidia-smi") is None:
        awq = demo_vllm_config(tmp_path, tmp_path / "ck", "  - {name: awq, weights: int4, method: awq}\n")
        _one_line_exit_2(run_cli("quantize", str(awq), "--setups", "awq"), "AWQ only on a GPU machine")

    env = os.environ | {"QEVAL_QUANT_PYTHON": sys.executable}  # qeval's own: no llm-compressor there
    res = subprocess_cli(["quantize", str(demo_vllm_config(tmp_path, tmp_path / "ck"))], env)
    _one_line_exit_2(res, "llm-compressor is not installed", "make quant")


def subprocess_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qeval.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def test_a_failed_quantize_leaves_no_checkpoint(tmp_path: Path) -> None:
    """llm-compressor dying half-way (here: an interpreter that passes the probe, then fails)
    leaves only a temporary folder: the run still refuses, and nothing looks complete."""
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = "-c" ]; then echo True; exit 0; fi\n'
        'echo "RuntimeError: calibration blew up" >&2\nexit 3\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cfg = demo_vllm_config(tmp_path, tmp_path / "ck")
    res = subprocess_cli(["quantize", str(cfg), "--setups", "w8a8"], os.environ | {"QEVAL_QUANT_PYTHON": str(fake)})
    assert res.returncode == 1, res.stderr
    assert "llm-compressor exited with 3: RuntimeError: calibration blew up" in res.stderr
    folders = list((tmp_path / "ck").iterdir())
    assert len(folders) == 1 and ".tmp-" in folders[0].name and not (folders[0] / RECORD).exists()
    _one_line_exit_2(run_cli("validate", str(cfg)), "run `qeval quantize`")


@pytest.mark.slow
def test_quantize_makes_w8a8_and_w4a8_checkpoints(quantized_demo: tuple[Path, Path, str]) -> None:
    from safetensors import safe_open

    cfg_path, ck, _ = quantized_demo
    cfg = load_config(cfg_path)
    dtype = dtype_for(cfg.model.dtype, MODEL)  # `auto`, as quantize resolves it
    want = {"w8a8": (8, "channel", None), "w4a8": (4, "group", 128)}
    train = (TASKS / "data" / "train.jsonl").read_bytes()
    for setup in (s for s in cfg.setups if needs_checkpoint(s)):
        folder = checkpoint_dir(cfg, setup, folder_checksum(MODEL), hashlib.sha256(train).hexdigest(), dtype)
        record = json.loads((folder / RECORD).read_text())
        assert record["model"]["sha256"] == folder_checksum(MODEL)
        assert record["calibration"]["sha256"] == hashlib.sha256(train).hexdigest()
        assert record["calibration"]["texts"] == 256 and record["calibration"]["tokens"] > 256 * 10
        assert record["made_by"]["libraries"]["llmcompressor"] == "0.14.0.1"
        qc = json.loads((folder / "config.json").read_text())["quantization_config"]
        group = qc["config_groups"]["group_0"]
        bits, strategy, group_size = want[setup.method]  # the mixed w4a8-kv-fp8 shares w4a8's checkpoint
        assert (group["weights"]["num_bits"], group["weights"]["strategy"], group["weights"]["group_size"]) == (
            bits,
            strategy,
            group_size,
        )
        acts = group["input_activations"]  # A8: INT8 activations, per token, computed at run time
        assert (acts["num_bits"], acts["strategy"], acts["dynamic"]) == (8, "token", True)
        assert qc["ignore"] == ["lm_head"]
        if setup.method == "w8a8":
            assert "SmoothQuantModifier" in (folder / "recipe.yaml").read_text()
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            q = f.get_tensor("model.layers.0.mlp.down_proj.weight")
            assert str(q.dtype) == "torch.int8" and int(q.abs().max()) <= 2 ** (bits - 1)
            assert int(q.abs().max()) >= 2 ** (bits - 1) - 1  # uses its range: really quantized to `bits`


@pytest.mark.slow
def test_a_second_quantize_is_a_cache_hit(quantized_demo: tuple[Path, Path, str]) -> None:
    cfg_path, ck, first = quantized_demo
    assert "quantizing to W8A8" in first and "quantizing to W4A8" in first
    before = {p.name: (p / RECORD).stat().st_mtime_ns for p in ck.iterdir()}
    t0 = time.time()
    res = run_cli("quantize", str(cfg_path))
    assert res.returncode == 0, res.stderr
    setups = [s for s in load_config(cfg_path).setups if needs_checkpoint(s)]
    assert len(setups) == 3  # w8a8, w4a8 and the mix that reuses w4a8's checkpoint
    assert res.stderr.count("checkpoint cached at") == len(setups) and "quantizing" not in res.stderr
    assert {p.name: (p / RECORD).stat().st_mtime_ns for p in ck.iterdir()} == before
    assert time.time() - t0 < 30  # no llm-compressor start (that alone takes longer)


@pytest.mark.slow
def test_gptq_w4a16_with_another_group_size_from_a_dataset(tmp_path: Path) -> None:
    """W4A16 (GPTQ) in groups of 64 (a scheme spelled out rather than a preset), calibrated
    through the `dataset:` path that hub datasets take, here on a local dataset folder."""
    data = tmp_path / "calib"
    data.mkdir()
    lines = (TASKS / "data" / "train.jsonl").read_text().splitlines()[:64]
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    extra = "  - {name: w4a16, weights: int4, method: gptq, group_size: 64}\n"
    cfg = demo_vllm_config(tmp_path, tmp_path / "ck", extra)
    calibration = f"quantize:\n  calibration: {{dataset: {data}, split: train}}\n"
    cfg.write_text(cfg.read_text().replace("quantize:\n", calibration))
    res = run_cli("quantize", str(cfg), "--setups", "w4a16")
    assert res.returncode == 0, res.stderr[-3000:]
    (folder,) = (tmp_path / "ck").iterdir()
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    group = qc["config_groups"]["group_0"]
    assert group["weights"]["num_bits"] == 4 and group["weights"]["group_size"] == 64
    assert group["input_activations"] is None and qc["format"] == "pack-quantized"
    record = json.loads((folder / RECORD).read_text())
    assert record["calibration"]["dataset"] == str(data) and record["calibration"]["texts"] == 64
    _served_on_hf(tmp_path, folder)


def _served_on_hf(tmp_path: Path, folder: Path) -> None:
    """The packed W4A16 checkpoint as a `checkpoint:` setup on the hf backend, in process
    (transformers' compressed-tensors quantizer; the whole-run path is in test_vllm_backend.py):
    described from its quantization_config, decompressed on load on CPU, scoring close to the
    16-bit model and not equal to it."""
    from qeval.backends.base import LoglikelihoodRequest
    from qeval.backends.hf.backend import HFBackend
    from qeval.config.setups import Setup
    from tests.helpers import make_config

    cfg = load_config(make_config(tmp_path, filename="hf.yaml", model={"dtype": "float32"}))
    reqs = [LoglikelihoodRequest(f"{a} + {b} =", f" {a + b}") for a, b in [(12, 34), (40, 2), (7, 68), (55, 23)]]
    scores = {}
    for setup in (Setup(name="bf16", baseline=True), Setup(name="w4a16", checkpoint=str(folder))):
        backend = HFBackend(cfg, setup, "cpu")
        backend.load()
        scores[setup.name] = [r.logprob for r in backend.loglikelihood(reqs, lambda n: None)]
        info = backend.quant_info
    assert "weights int4 sym per group of 64 (static), activations 16-bit" in info["description"]
    assert info["checkpoint_config"]["format"] == "pack-quantized" and info["decompressed_to"] == "float32"
    assert "emulated" not in info  # weight-only: nothing rounded at run time
    diffs = [abs(a - b) for a, b in zip(scores["bf16"], scores["w4a16"], strict=True)]
    # quantized (not the 16-bit weights), not broken: on the tiny model's narrow layers 4-bit moves
    # one answer's log-prob by up to ~1.5 nats (1.53 measured on an AVX2 CPU, where the quantize
    # worker computes in float32), the four on average by well under one
    assert 0 < max(diffs) < 2.5 and sum(diffs) / len(diffs) < 0.75, diffs


def test_quant_python_is_found_by_make_quant() -> None:
    """`make test` builds .venv-quant; the driver finds it beside the package."""
    assert Path(quant_python()).parent.parent.name == ".venv-quant"
