"""Shared fixtures: the shipped tiny model and task suite, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "qeval-tiny"
TASKS = ROOT / "tasks"

# nothing in the tests may reach a model or dataset hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """Run `qeval ARGS` in a fresh interpreter, as a user would."""
    return subprocess.run([sys.executable, "-m", "qeval.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def write_config(path: Path, body: str) -> Path:
    path.write_text(body.replace("@MODEL@", str(MODEL)).replace("@TASKS@", str(TASKS)))
    return path


@pytest.fixture(scope="session")
def model_path() -> Path:
    assert (MODEL / "model.safetensors").is_file(), "the shipped model is missing"
    return MODEL


def demo_vllm_config(tmp: Path, checkpoints: Path, extra_setups: str = "") -> Path:
    """configs/demo-vllm.yaml with absolute paths, its checkpoints cached under `checkpoints`."""
    text = (ROOT / "configs" / "demo-vllm.yaml").read_text()
    text = text.replace("path: models/qeval-tiny", f"path: {MODEL}").replace("backend:", f"tasks_dir: {TASKS}\nbackend:")
    text = text.replace("quantize:\n", f"quantize:\n  output_dir: {checkpoints}\n")
    text = text.replace("tasks: [", extra_setups + "tasks: [")
    path = tmp / "demo-vllm.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def quantized_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """`qeval quantize` on the vLLM demo for real (llm-compressor in .venv-quant): the config,
    its checkpoint folder and what the command printed."""
    tmp = tmp_path_factory.mktemp("quantized")
    cfg = demo_vllm_config(tmp, tmp / "checkpoints")
    res = run_cli("quantize", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    return cfg, tmp / "checkpoints", res.stdout + res.stderr
