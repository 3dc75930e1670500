"""Fixtures (the shipped tiny model, the vLLM demo's session runs) and pytest's hooks (the xdist
groups and their order). The helpers tests import are in tests/helpers.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    AGREEMENT_TASKS,
    DEMO_LIMIT,
    DEMO_RUN_LIMIT,
    MODEL,
    ROOT,
    agreement_limit,
    demo_vllm_config,
    run_cli,
)

# nothing in the tests may reach a model or dataset hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _xdist_worker_cores() -> list[int] | None:
    """Under pytest-xdist (`make test`: PYTEST_WORKERS), the cores this worker computes on: the
    allowed cores split evenly between the workers (at least one each); None outside xdist."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return None
    cores, n, i = sorted(os.sched_getaffinity(0)), int(count), int(worker.removeprefix("gw"))
    per = max(1, len(cores) // n)
    return cores[(i * per) % len(cores) :][:per]


# Two xdist workers each running torch on every core oversubscribe them (the quantized-KV-cache
# paths worst: CONTRIBUTING.md), so each worker takes its share of the cores: torch's and
# OpenMP's threads (every process a test starts inherits OMP_NUM_THREADS), and the cores vLLM's
# CPU engine binds its OpenMP threads to (left to itself, every engine binds to the last core).
if (_CORES := _xdist_worker_cores()) is not None:
    os.environ.setdefault("OMP_NUM_THREADS", str(len(_CORES)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, _CORES)))


@pytest.fixture(scope="session")
def model_path() -> Path:
    assert (MODEL / "model.safetensors").is_file(), "the shipped model is missing"
    return MODEL


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """`qeval run configs/demo.yaml` as `make run` runs it (every setup, the performance phase,
    the report), on DEMO_RUN_LIMIT documents a task: its folder and results.json. Shared by
    test_run_e2e and test_notebook (one xdist group, DEMO_GROUP: the run is made once)."""
    out = tmp_path_factory.mktemp("demo")
    res = run_cli("run", str(ROOT / "configs" / "demo.yaml"), "--output", str(out), "--limit", DEMO_RUN_LIMIT)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    # the terminal ends with the answer, one line, as report.md has it
    rec = results["recommendation"]["setup"]
    reason = results["recommendation"]["reasons"][rec].removeprefix(f"{rec}: recommended")
    assert res.stderr.strip().splitlines()[-1] == "Recommended: " + rec + reason
    return out, results


@pytest.fixture(scope="session")
def quantized_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """`qeval quantize` on the vLLM demo for real (llm-compressor in .venv-quant): the config,
    its checkpoint folder and what the command printed."""
    tmp = tmp_path_factory.mktemp("quantized")
    cfg = demo_vllm_config(tmp, tmp / "checkpoints")
    res = run_cli("quantize", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    return cfg, tmp / "checkpoints", res.stdout + res.stderr


@pytest.fixture(scope="session")
def vllm_demo(quantized_demo: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`qeval run` on the vLLM demo as shipped (the quantize fixture's config and checkpoints), on
    its first DEMO_LIMIT samples a task, without the performance phase (untimed, each engine runs
    inside its worker: 125 s against 352 s timed on one core; test_vllm_backend times W8A8 in a run
    of its own): its output folder and the dtype `dtype: auto` resolved to. Once a session, because
    engine starts are the cost:
    test_vllm_backend checks the run whole and takes its bf16 setup as the vllm agreement run in
    that dtype (the same config, limit and tasks, and more); test_openai_backend takes its W8A8
    setup as the in-process reference where that dtype is W8A8's (bfloat16)."""
    # with two controls beside the shipped setups: the baseline and the W8A8 checkpoint on
    # transformers (engine parity; vLLM's own floor, an engine start more, is
    # test_vllm_translation's max_num_seqs control and test_noise_floor's floor on transformers)
    cfg = quantized_demo[0].with_name("demo-vllm-controls.yaml")
    text = quantized_demo[0].read_text()
    controls = "".join(f"  - {c}\n" for c in VLLM_CONTROLS)
    cfg.write_text(text.replace("  - name: w8a8\n", f"{controls}  - name: w8a8\n", 1))
    out = tmp_path_factory.mktemp("demo-vllm") / "out"
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", str(DEMO_LIMIT), "--no-performance")
    assert res.returncode == 0, res.stderr[-3000:]
    setups = {s["name"]: s for s in json.loads((out / "results.json").read_text())["setups"]}
    return out, setups["bf16"]["quantization"]["engine_args"]["dtype"]


#: the controls the vLLM demo fixture runs beside the shipped setups (docs/statistics.md, "The noise
#: floor", "Engine parity")
VLLM_CONTROLS = (
    "{name: bf16-on-hf, control: {backend: hf}}",
    # the W8A8 checkpoint on transformers, paired with its vLLM setup (W8A8 parity)
    "{name: w8a8-on-hf, weights: int8, method: w8a8, control: {backend: hf, of: w8a8}}",
)


@pytest.fixture(scope="session")
def vllm_bf16_runs(vllm_demo: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """configs/demo-vllm.yaml's bf16 setup on the vllm backend in float32 and in bfloat16, without
    the performance phase, on AGREEMENT_TASKS (agreement_limit samples): {dtype: output folder}.
    The dtype `auto` resolves to is the demo's own run (vllm_demo: one engine start fewer), the
    other a run of its own. Where the CPU runs an FP8 KV cache, that run also serves a
    `kv-fp8-keep0` setup (an FP8 cache with layer 0 kept at the model's dtype; test_vllm_backend's
    per-layer check: its baseline is that run's bf16, in the same pool), under the key "kv-keep"
    (the all-FP8 cache is the demo's `w4a8-kv-fp8`, against its `w4a8` twin: no engine start of its own).
    test_openai_backend takes the float32 run as its in-process bf16 reference."""
    from qeval.backends.vllm.support import cpu_has_fp8

    demo, auto = vllm_demo
    (other,) = {"float32", "bfloat16"} - {auto}
    tmp = tmp_path_factory.mktemp("vllm-bf16")
    text = (ROOT / "configs" / "demo-vllm.yaml").read_text()
    text = text.replace("path: models/qeval-tiny", f"path: {MODEL}")
    text = re.sub(r"dtype: auto.*", f"dtype: {other}", text)
    setups = "bf16"
    if cpu_has_fp8():
        # and per-layer KV precision: layer 0 kept at 16 bits (--kv-cache-dtype-skip-layers 0)
        keep = "  - {name: kv-fp8-keep0, kv_cache: fp8, kv_keep: [0]}\n"
        text = text.replace("tasks: [", f"{keep}tasks: [")
        setups += ",kv-fp8-keep0"
    cfg, out = tmp / f"vllm-{other}.yaml", tmp / f"vllm-{other}"
    cfg.write_text(text)
    res = run_cli(
        "run",
        str(cfg),
        "--output",
        str(out),
        "--limit",
        str(agreement_limit(other)),
        "--setups",
        setups,
        "--tasks",
        AGREEMENT_TASKS,
        "--no-performance",
    )  # agreement, not speed
    assert res.returncode == 0, res.stderr[-3000:]
    return {auto: demo, other: out} | ({"kv-keep": out} if "kv-fp8-keep0" in setups else {})


#: tests that start vLLM engines or servers run in two xdist groups, one per pytest worker:
#: `make test` runs two workers (pytest-xdist, PYTEST_WORKERS), and each engine claims its share
#: of host memory for the KV pool, so at most two engine tests run at once. The files whose tests
#: use the `quantized_demo` checkpoints (a session fixture: once per worker), so the session's
#: vLLM runs of them (`vllm_demo`, `vllm_bf16_runs`) as well, form one group, so that they are
#: made once; the other engine tests form the second. Every other test is grouped by its file,
#: so a module fixture runs once.
CHECKPOINT_GROUP, ENGINE_GROUP = "vllm-checkpoints", "vllm-engines"
#: node ids naming one of these start an engine or a server (the openai backend launches `vllm serve`)
ENGINE_WORDS = ("vllm", "openai")
CHECKPOINT_FILES = (
    "tests/backends/test_vllm_backend.py",
    "tests/backends/test_openai_backend.py",
    "tests/quantize/test_quantize.py",
)
#: files whose names hold an engine word but which start no engine (their own 127.0.0.1 stand-in
#: servers): grouped by file, so they do not lengthen the engine group
NO_ENGINE_FILES = ("tests/backends/test_openai_hostile.py",)
#: Ray's `address: auto` joins any Ray cluster running on the machine (it finds one from the
#: processes' command lines too): the test that no cluster is there runs after test_ray_executor's
#: module cluster is stopped, in its group, not beside it on the other worker (seen in CI: exit 0)
RAY_GROUP = "tests/run/test_ray_executor.py"
NO_RAY_CLUSTER = ("tests/run/test_trust_inputs.py::test_a_ray_cluster_that_is_not_there",)


#: the files whose tests read the shipped demo's session run (`demo_run`): one group, so it is made once
DEMO_GROUP = "tests/e2e/test_run_e2e.py"
DEMO_FILES = (DEMO_GROUP, "tests/report/test_notebook.py")


def xdist_group(nodeid: str) -> str:
    """The xdist group of a test, from its node id alone (the controller schedules by node id)."""
    node = nodeid.lower()
    if node.startswith(DEMO_FILES):
        return DEMO_GROUP
    if node.startswith(CHECKPOINT_FILES):
        return CHECKPOINT_GROUP
    if any(w in node for w in ENGINE_WORDS) and not node.startswith(NO_ENGINE_FILES):
        return ENGINE_GROUP
    if node.startswith(NO_RAY_CLUSTER):
        return RAY_GROUP
    return nodeid.split("::")[0]


#: the longest groups, longest first (measured, 2026-12-02: the two engine groups about 15 and
#: 12 minutes): under xdist they are scheduled first, so that no
#: worker is left alone with a long one at the end (the rest follow in collection order)
LONG_FIRST = (
    CHECKPOINT_GROUP,
    ENGINE_GROUP,
    "tests/e2e/test_lm_eval_tasks.py",
    "tests/e2e/test_longctx_e2e.py",
    "tests/run/test_trust.py",
    "tests/e2e/test_run_e2e.py",
    "tests/run/test_ray_executor.py",
    "tests/e2e/test_full_sets.py",
    "tests/run/test_trust_inputs.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the longest groups first (LONG_FIRST; a stable sort: each group keeps its
    tests' order). Every worker collects the same order, as xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {g: i for i, g in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: rank.get(xdist_group(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadgroup`, schedule by xdist_group. xdist 3.8's own loadgroup reads
    `xdist_group` marks by rewriting each item's node id, which pytest 9.2's node ids no longer
    allow (they are derived, not stored): every test became its own group, and each worker made
    the vLLM checkpoints and runs again. Scheduling by scope, with xdist's own LoadScopeScheduling
    and our grouping as its scope, needs neither. Groups are handed out in collection order."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection's order (LONG_FIRST), not the groups' sizes

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return GroupScheduling(config, log)
