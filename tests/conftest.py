"""Shared fixtures: the shipped tiny model and task suite, and a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "qeval-tiny"
TASKS = ROOT / "tasks"

# nothing in the tests may reach a model or dataset hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


SCHEMA = ROOT / "docs" / "results.schema.json"


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """Run `qeval ARGS` in a fresh interpreter, as a user would. Every results.json a `run` or
    `report` writes is checked against the exported JSON Schema (docs/results.schema.json)."""
    started = time.time()
    res = subprocess.run([sys.executable, "-m", "qeval.cli", *args], cwd=cwd, capture_output=True,
                         text=True, timeout=timeout, check=False)
    out = _output_dir(args, cwd)
    if out is not None and (out / "results.json").is_file() and (out / "results.json").stat().st_mtime >= started:
        validate_results(out / "results.json")
    return res


def _output_dir(args: tuple[str, ...], cwd: Path) -> Path | None:
    if args and args[0] == "report" and len(args) > 1:
        return cwd / args[1]
    if args and args[0] == "run" and "--output" in args:
        return cwd / args[args.index("--output") + 1]
    return None


def validate_results(path: Path) -> None:
    """Validate a results.json against the committed JSON Schema (jsonschema, draft 2020-12)."""
    import jsonschema

    jsonschema.validate(json.loads(path.read_text()), json.loads(SCHEMA.read_text()))


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
    text = text.replace("path: models/qeval-tiny", f"path: {MODEL}")
    text = text.replace("backend:", f"tasks_dir: {TASKS}\nbackend:")
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
