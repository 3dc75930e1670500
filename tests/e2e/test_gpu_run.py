"""The prepared GPU run (scripts/gpu_run.py) and its bundle (scripts/gpu_bundle.py), on CPU.

No GPU was lent to this project's sessions: the command a GPU call would run is run here with
`--device cpu --shape small` (the same entry point, phases and qeval code, a 2-layer shape of the
same architecture), its wheel bundle installed from a stand-in wheel, and the imports the GPU
image lacks (lm-eval, vLLM, ...) blocked in every process it starts. The bundle's checks run on
made-up wheel files: the real download needs PyPI (`make gpu-bundle`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import gpu_bundle

#: what the GPU machine's image lacks and the bundle does not carry: the path must not import them
ABSENT_THERE = (
    "lm_eval",
    "vllm",
    "compressed_tensors",
    "ray",
    "mlflow",
    "datasets",
    "gguf",
    "llmcompressor",
    "torchao",
    "bitsandbytes",
    "hqq",
)
PINS = {"pydantic": "2.14.4", "pydantic-core": "2.50.5", "transformers": "5.23.0"}


def touch(folder: Path, name: str, size: int = 10) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"x" * size)
    return path


def good_bundle(folder: Path) -> Path:
    touch(folder, "pydantic-2.14.4-py3-none-any.whl")
    touch(folder, "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
    touch(folder, "transformers-5.23.0-py3-none-any.whl")
    return folder


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "-5", "soon"])
def test_a_time_budget_that_is_not_a_finite_number_of_seconds_is_refused(
    budget: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--time-budget nan` turned the deadline off (no comparison with nan is true) and wrote NaN
    into gpu_run.json (issue 54)."""
    import gpu_run

    with pytest.raises(SystemExit) as exc:
        gpu_run.parse_args(["--out", str(tmp_path), "--time-budget", budget])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --time-budget:" in err and "Traceback" not in err
    assert gpu_run.parse_args(["--out", str(tmp_path), "--time-budget", "60"]).time_budget == 60.0


def test_bundle_check_accepts_the_pinned_wheels(tmp_path: Path) -> None:
    assert gpu_bundle.check_bundle(good_bundle(tmp_path / "b"), PINS) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda b: (b / "transformers-5.23.0-py3-none-any.whl").unlink(), "transformers==5.23.0: missing"),
        (lambda b: touch(b, "transformers-5.17.0-py3-none-any.whl"), "transformers: 2 wheels"),
        (
            lambda b: (b / "pydantic-2.14.4-py3-none-any.whl").rename(b / "pydantic-2.13.0-py3-none-any.whl"),
            "pydantic: 2.13.0 where .venv has 2.14.4",
        ),
        (
            lambda b: (b / "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl").rename(
                b / "pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.whl"
            ),
            "not installable on CPython 3.12",
        ),
        (
            lambda b: (b / "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl").rename(
                b / "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_aarch64.whl"
            ),
            "not installable on CPython 3.12",
        ),
        (lambda b: touch(b, "numpy-2.0.0-cp312-cp312-manylinux_2_17_x86_64.whl"), "numpy: not in the bundle's list"),
        (lambda b: touch(b, "notes.txt"), "notes.txt: not a wheel"),
        (lambda b: touch(b, "pad-1.0-py3-none-any.whl", 3 * 2**20), "over its limit of 2 MiB"),
    ],
)
def test_bundle_check_names_what_is_wrong(tmp_path: Path, change: Any, expected: str) -> None:
    bundle = good_bundle(tmp_path / "b")
    change(bundle)
    problems = gpu_bundle.check_bundle(bundle, PINS, limit_mib=2)
    assert any(expected in p for p in problems), problems


def test_bundle_lists_every_import_the_image_lacks() -> None:
    """Each distribution the bundle carries is installed here at the version it pins (the CPU run
    below imports them), and none of them is one the path must do without."""
    pins = gpu_bundle.pins()
    assert {"pydantic", "pydantic-core", "optimum-quanto", "transformers"} <= set(pins)
    constraints = dict(
        line.split("==")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for name in ("transformers", "optimum-quanto"):
        assert pins[name] == constraints[name]
    assert not {gpu_bundle.normalize(n) for n in ABSENT_THERE} & set(pins)


def test_tree_size_counts_what_travels(tmp_path: Path) -> None:
    """Tracked files and untracked ones git does not ignore count; ignored ones do not."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("build/\n")
    touch(tmp_path / "src", "a.py", 1000)
    touch(tmp_path / "build", "big.whl", 10**6)
    sizes = gpu_bundle.tree_sizes(tmp_path)
    assert sizes == {".gitignore": 7, "src": 1000}
    assert gpu_bundle.largest(sizes, 1) == "src 0.0 MiB"


def stand_in_wheel(folder: Path) -> Path:
    """A one-module wheel: what the bundle's installation does with any wheel, done offline."""
    folder.mkdir(parents=True)
    path = folder / "qeval_gpu_probe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("qeval_gpu_probe/__init__.py", "INSTALLED = True\n")
        z.writestr(
            "qeval_gpu_probe-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: qeval-gpu-probe\nVersion: 0.1\n"
        )
        z.writestr(
            "qeval_gpu_probe-0.1.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr("qeval_gpu_probe-0.1.dist-info/RECORD", "")
    return folder


def blocker(folder: Path) -> Path:
    """A sitecustomize that makes each of ABSENT_THERE look not installed (None in sys.modules:
    `import` raises ModuleNotFoundError, importlib.util.find_spec answers None, as transformers'
    availability checks ask), in every process that has `folder` on PYTHONPATH (the `qeval run`
    workers inherit it)."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({ABSENT_THERE!r}))\n")
    return folder


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], str]:
    tmp = tmp_path_factory.mktemp("gpu-run")
    out = tmp / "out"
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(blocker(tmp / "block"))}
    env.pop("QEVAL_GPU_RUN_SITE", None)
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_run.py"),
            "--device",
            "cpu",
            "--shape",
            "small",
            "--bundle",
            str(stand_in_wheel(tmp / "bundle")),
            "--out",
            str(out),
            "--weights",
            "16,int4",
            "--contexts",
            "256",
            "--tiny-limit",
            "2",
            "--time-budget",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    data = json.loads((out / "gpu-run.json").read_text()) if (out / "gpu-run.json").is_file() else {}
    md = (out / "gpu-run.md").read_text() if (out / "gpu-run.md").is_file() else ""
    return res, data, md


@pytest.mark.slow
def test_gpu_run_on_cpu_runs_every_phase(cpu_run: tuple[subprocess.CompletedProcess[str], dict[str, Any], str]) -> None:
    res, data, md = cpu_run
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert data["errors"] == [] and data["skipped"] == []
    assert set(data["phases"]) == {"tiny", "ceilings", "memory+perf w16", "memory+perf int4", "tiny-cpu"}
    env = data["environment"]
    assert env["bundle_site"] and "installed 1 wheels" in res.stdout  # the bundle went in, then the rerun
    assert env["forbidden_imports_loaded"] == []
    assert data["seconds"] <= data["time_budget_s"]
    for heading in (
        "## Memory: predicted / measured",
        "## Concurrency: the formula against what fit",
        "## Performance against the ceilings",
        "## The tiny model",
    ):
        assert heading in md


@pytest.mark.slow
def test_gpu_run_memory_figures_are_sane(cpu_run: tuple[subprocess.CompletedProcess[str], dict[str, Any], str]) -> None:
    _, data, _ = cpu_run
    cells = {(c["setup"], c["context"]): c for c in data["memory"]}
    assert set(cells) == {("w16", 256), ("w16-kv-int4", 256), ("int4", 256), ("int4-kv-int4", 256)}
    for (name, _), c in cells.items():
        p, w, one, s = c["predicted"], c["weights_measured"], c["one_sequence"], c["search"]
        if not name.startswith("int4"):  # 16-bit weights: the prediction is exact but for rounding
            assert abs(w["measured"] - p["weights_bytes"]) <= 0.02 * p["weights_bytes"]
        else:  # quanto's float32 scales on this CPU run are 4 bytes, not the 2 predicted: within 5%
            assert abs(w["measured"] - p["weights_bytes"]) <= 0.05 * p["weights_bytes"]
        assert one["kv_bytes_per_sequence"] == pytest.approx(p["kv_bytes_per_sequence"], rel=0.02)
        assert s["fit"] >= 1 and s["trials"]
        fits = [t["batch"] for t in s["trials"] if t["fit"]]
        fails = [t["batch"] for t in s["trials"] if not t["fit"]]
        assert max(fits) == s["fit"] and (not fails or min(fails) > s["fit"])  # monotone: nothing fit above a failure
        raw = c["formula"]["raw"]["max_concurrency"]
        assert s["fit"] <= raw + 1  # nothing fits past the theoretical concurrency
        pool = s["at_fit"]["kv_pool_bytes"]
        assert pool == pytest.approx(s["fit"] * p["kv_bytes_per_sequence"], rel=0.05)
    # a 16-bit KV cache is bounded by its pool and the fill's transient: on 2 layers, one layer's random
    # K/V is half the pool, so at least 1 / 1.5 of the formula's raw figure fits (less a bisection step)
    w16 = cells[("w16", 256)]
    assert w16["search"]["fit"] >= 0.5 * w16["formula"]["raw"]["max_concurrency"]


@pytest.mark.slow
def test_gpu_run_performance_and_tiny_scores(
    cpu_run: tuple[subprocess.CompletedProcess[str], dict[str, Any], str],
) -> None:
    _, data, _ = cpu_run
    assert [p["setup"] for p in data["performance"]] == ["w16", "int4"]
    for p in data["performance"]:
        perf = p["performance"]
        assert perf["status"] == "ok" and [x["concurrency"] for x in perf["levels"]] == [1, 4]
        assert perf["decode"]["ceiling"] > 0 and perf["prefill"]["ceiling"] > 0
        assert perf["decode"]["achieved"] == perf["levels"][0]["decode_tokens_per_s"]["median"]
    assert data["ceilings"]["copy_bandwidth"]["max"] > 0
    tiny = data["tiny"]
    assert tiny["device_run"]["exit_code"] == 0 and tiny["cpu_run"]["exit_code"] == 0
    rows = tiny["comparison"]
    assert {(r["task"], r["metric"]) for r in rows} >= {("compare_mc", "acc"), ("ppl", "bits_per_byte")}
    # both runs are on this CPU here, same dtype and samples: the scores agree exactly
    assert all(r["diff"] == 0 for r in rows), rows


@pytest.mark.parametrize(
    ("limit", "start", "fit", "failed_at", "capped"),
    [
        (37, 20, 37, 38, False),  # up by 25% from the formula's figure, then bisected to the sequence
        (37, 90, 37, 38, False),  # down from a figure that does not fit
        (500, 20, 100, 101, True),  # everything fits: capped, not bracketed
        (0, 5, 0, 1, False),  # nothing fits, not even one sequence
    ],
)
def test_search_finds_the_largest_batch(limit: int, start: int, fit: int, failed_at: int | None, capped: bool) -> None:
    import time

    from gpu_memory import search

    res = search(lambda b: {"batch": b} if b <= limit else None, start, 100, time.monotonic() + 60)
    got_failed = res["failed_at"] if not capped else None
    assert (res["fit"], res["capped"]) == (fit, capped)
    assert got_failed == (None if capped else failed_at)
    assert res["at_fit"] == ({"batch": fit} if fit else None)
    assert len(res["trials"]) <= 12


def test_search_stops_at_its_deadline() -> None:
    import time

    from gpu_memory import search

    res = search(lambda b: {"batch": b}, 1, 10**6, time.monotonic() - 1)
    assert res["trials"] == [] and res["fit"] == 0 and not res["converged"]


def test_a_sliding_window_pool_is_counted_after_the_decode_step() -> None:
    """Mistral-7B's architecture, shrunk (window 128, context 256): the synthetic fill pins every
    token until the first decode step trims each sliding layer to its window, as a prefill does;
    the pool after the step is what qeval predicts for the batch."""
    import torch
    from gpu_memory import Meter, build_model, fill_and_step, model_config, predictions

    from qeval.config.setups import Setup
    from qeval.model.shape import ModelShape

    cfg = model_config(ROOT / "tests" / "data" / "mistral-7b-v0.1-config.json", shrink=True, max_context=256)
    assert cfg["sliding_window"] == 128 and cfg["model_type"] == "mistral"
    setup = Setup(name="w16")
    model, _ = build_model(cfg, setup, torch.float32, "cpu")
    trial = fill_and_step(model, setup, 3, 256, Meter("cpu", 2**30), "cpu")
    per_sequence = predictions(ModelShape.from_config(cfg), setup, "float32", 256)["kv_bytes_per_sequence"]
    assert trial["kv_pool_bytes"] == 3 * per_sequence
    assert trial["kv_pool_after_fill_bytes"] > 1.9 * trial["kv_pool_bytes"]  # 255 tokens pinned, not 128


def test_gpu_run_starts_nothing_past_its_time_budget(tmp_path: Path) -> None:
    """With no time left every phase is skipped, and said so, and the files are still written."""
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_run.py"),
            "--device",
            "cpu",
            "--shape",
            "small",
            "--out",
            str(tmp_path),
            "--time-budget",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads((tmp_path / "gpu-run.json").read_text())
    assert [s.split(":")[0] for s in data["skipped"]] == [
        "tiny",
        "ceilings",
        "memory+perf w16",
        "memory+perf int8",
        "memory+perf int4",
    ]
    assert data["phases"] == {} and "- skipped: tiny" in (tmp_path / "gpu-run.md").read_text()


def test_gpu_run_refuses_bad_input(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_run.py"),
            "--out",
            str(tmp_path),
            "--weights",
            "16,int3",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "unknown value(s): int3" in res.stderr
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_run.py"),
            "--out",
            str(tmp_path),
            "--bundle",
            str(tmp_path),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "no wheels there" in res.stderr
