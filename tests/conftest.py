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
