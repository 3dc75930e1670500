"""The prepared GPU check (scripts/gpu_check.py, configs/gpu-check.yaml), run on CPU: no GPU
was lent to this project's sessions, so its CUDA path is tested here with `--device cpu` on
the shipped tiny model (bitsandbytes NF4 is refused on CPU, and skipped: it is optional)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import MODEL, ROOT, assert_figures_carry_their_source, validate_results

pytestmark = pytest.mark.slow


def test_gpu_check_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_check.py"),
            "--device",
            "cpu",
            "--quick",
            "--model",
            str(MODEL),
            "--limit",
            "4",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "## Performance" in res.stdout and "gpu_check: cpu" in res.stdout
    validate_results(out / "results.json")
    r = json.loads((out / "results.json").read_text())
    assert "runs on CUDA here" in r["run"]["skipped_setups"]["nf4"]
    assert [s["name"] for s in r["setups"]] == ["bf16", "int8", "int4", "kv-int4", "kv-fp8"]
    for s in r["setups"]:
        assert s["status"] == "ok", s["error"]
        assert s["performance"]["status"] == "ok", s["performance"]
        assert_figures_carry_their_source(s["performance"])
        assert [x["concurrency"] for x in s["performance"]["levels"]] == [1, 4]  # capped by --quick
    assert r["ceilings"]["device"] == "cpu"
    assert (out / "report.html").is_file()


def test_gpu_check_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--output", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1 and "no nvidia-smi" in res.stderr
