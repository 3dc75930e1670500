"""The trainer is deterministic: the same steps give byte-identical weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def _train(out: Path) -> bytes:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train_tiny_model.py"),
            "--steps",
            "8",
            "--batch",
            "16",
            "--eval-every",
            "0",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return (out / "model.safetensors").read_bytes()


def test_training_is_deterministic(tmp_path: Path) -> None:
    a, b = _train(tmp_path / "a"), _train(tmp_path / "b")
    assert a == b
    shipped = (ROOT / "models" / "qeval-tiny" / "config.json").read_text()
    assert (tmp_path / "a" / "config.json").read_text() == shipped  # same architecture as shipped
