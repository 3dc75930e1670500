"""The executor layer without a cluster: the `executor:` config piece, the cluster
address, what a job reserves, what a remote worker may send back, the order the runner gives
the jobs, and the node-side helpers. The real cluster runs are in test_ray_executor.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from qeval.config import load_config
from qeval.config.executor import ExecutorSpec
from qeval.errors import UserError
from qeval.run.executors.address import check_address, cluster_address
from qeval.run.executors.node import clear_stale_scratch, forwarded_env, verify_inputs
from qeval.run.executors.resources import JobResources, job_resources, unplaceable
from qeval.run.executors.worker_job import RefusedFile
from qeval.run.options import RunOptions
from qeval.run.preflight import preflight
from qeval.run.runner import PreparedRun, prepare
from tests.helpers import MODEL, TASKS, run_cli, seq_plan, write_config

SETUPS: list[dict[str, Any]] = [
    {"name": "bf16", "baseline": True},
    {"name": "int8", "weights": "int8"},
    {"name": "kv-int4", "kv_cache": "int4"},
]


def _config(tmp: Path, filename: str = "c.yaml", **keys: Any) -> Path:
    """The small run config (helpers.config_dict) with a KV-cache setup and a perplexity task, no gates."""
    from tests.helpers import config_dict

    return write_config(
        tmp / filename, config_dict(setups=SETUPS, tasks=["addition", "ppl"], gates=None, performance=None, **keys)
    )


def _one_line_exit_2(res: subprocess.CompletedProcess[str], expected: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], res.stderr[-2000:]


# -- the config piece -------------------------------------------------------------------------


def test_executor_defaults_to_local_and_is_validated(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path))
    assert cfg.executor == ExecutorSpec(
        kind="local", address=None, max_retries=2, max_parallel=None, num_cpus_per_job=1.0
    )
    ray = load_config(_config(tmp_path, "r.yaml", executor={"kind": "ray", "max_retries": 0}))
    assert ray.executor.kind == "ray" and ray.executor.max_retries == 0


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"kind": "local", "address": "10.0.0.1:6379"}, "executor: executor.address applies to kind: ray only"),
        ({"kind": "slurm"}, "executor.kind: Input should be 'local' or 'ray'"),
        ({"kind": "ray", "max_retries": -1}, "executor.max_retries: Input should be greater than or equal to 0"),
        ({"kind": "ray", "retries": 2}, "executor.retries: unknown key"),
    ],
)
def test_bad_executor_config_is_one_line(tmp_path: Path, block: dict, expected: str) -> None:
    cfg = _config(tmp_path, executor=block)
    _one_line_exit_2(run_cli("validate", str(cfg)), expected)


def test_unknown_executor_option_is_one_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    _one_line_exit_2(
        run_cli("run", str(cfg), "--output", str(tmp_path / "o"), "--executor", "slurm"),
        "--executor slurm: expected local or ray",
    )


# -- the cluster address ------------------------------------------------------------------------


def test_address_from_config_then_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) is None  # no address anywhere: a local Ray is started
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert cluster_address(None) == "10.0.0.2:6379"
    assert cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"  # the config wins


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("ray://head:10001", "Ray Client addresses (ray://) are not supported"),
        ("head", "expected host:port"),
    ],
)
def test_unusable_addresses_are_refused(address: str, expected: str) -> None:
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        check_address(address)


def test_a_dead_address_is_one_line_fast_and_writes_nothing(tmp_path: Path) -> None:
    """`ray.init` on an address where nothing listens retries for minutes: checked first."""
    from tests.ray_cluster import free_port

    cfg = _config(tmp_path, executor={"kind": "ray", "address": f"127.0.0.1:{free_port()}"})
    started = time.monotonic()
    res = run_cli("run", str(cfg), "--output", str(tmp_path / "out"))
    _one_line_exit_2(res, "nothing answers there")
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


# -- what a job reserves ---------------------------------------------------------------------------


def test_resources_follow_device_and_parallel_sizes(tmp_path: Path) -> None:
    # vLLM's parallel sizes: the engine (backend vllm) decides how one setup spreads over GPUs
    cfg = load_config(_config(tmp_path, backend="vllm", executor={"kind": "ray", "num_cpus_per_job": 2}))
    assert job_resources(cfg, "cpu") == JobResources(2.0)
    assert job_resources(cfg, "cpu").threads == 2 and job_resources(cfg, "cpu").bundle is None
    assert job_resources(cfg, "cuda") == JobResources(2.0, num_gpus=1)
    tp4 = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"tensor_parallel_size": 4})})
    res = job_resources(tp4, "cuda")
    assert res == JobResources(2.0, num_gpus=4) and res.bundle == {"CPU": 2.0, "GPU": 4.0}  # one bundle, one node
    pp = tp4.model_copy(update={"engine": tp4.engine.model_copy(update={"pipeline_parallel_size": 2})})
    assert job_resources(pp, "cuda") == JobResources(2.0, num_gpus=0, engine_gpus=8)  # vLLM places its workers


def test_a_request_no_node_can_hold_is_named() -> None:
    nodes = [
        {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}},
        {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}},
        {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
    ]  # a dead node does not count
    assert unplaceable(JobResources(1.0, num_gpus=2), nodes) is None
    assert unplaceable(JobResources(1.0, num_gpus=4), nodes) == (
        "needs 1 CPU and 4 GPUs on one node; the largest node of the cluster has 16 CPUs and 2 GPUs"
    )
    assert unplaceable(JobResources(1.0, engine_gpus=4), nodes) is None
    assert "needs 6 GPUs across the cluster" in (unplaceable(JobResources(1.0, engine_gpus=6), nodes) or "")


# -- the jobs the runner hands over -------------------------------------------------------------------


def _prepared(tmp_path: Path, tasks: list[str] | None = None) -> PreparedRun:
    tmp_path.mkdir(exist_ok=True)
    cfg = load_config(_config(tmp_path))
    opts = RunOptions(tmp_path / "run", tasks=tasks)
    (tmp_path / "run").mkdir(exist_ok=True)
    return prepare(preflight(cfg, None, tasks), opts)


def test_baseline_first_and_only_kl_users_wait_for_it(tmp_path: Path) -> None:
    from qeval.records.job import read_job

    jobs = _prepared(tmp_path).jobs
    assert [(j.id, j.after) for j in jobs] == [("bf16", ()), ("int8", ("bf16",)), ("kv-int4", ("bf16",))]
    assert read_job(jobs[1].job_path) == jobs[1].job  # the job file the worker reads, typed
    # without a perplexity task no setup needs the baseline's top-k: all may run at once
    assert [j.after for j in _prepared(tmp_path / "a", tasks=["addition"]).jobs] == [(), (), ()]


def test_a_parity_partner_runs_first_and_keeps_the_top_k_its_control_takes_its_kl_against(tmp_path: Path) -> None:
    """A parity control of a setup other than the baseline takes its KL against that setup's top-k:
    the partner runs right after the baseline whatever the config's order, keeps its top-k (its key
    says so, so a partner stored without one is scored again), and the control waits for it, its
    reference and key naming the partner; a remote control is sent the partner's top-k."""
    setups: list[dict[str, Any]] = [
        {"name": "bf16", "baseline": True},
        {"name": "copy-on-vllm", "control": {"backend": "vllm", "of": "copy"}},
        {"name": "int8", "weights": "int8"},
        {"name": "copy"},
    ]
    from tests.helpers import config_dict

    cfg = load_config(write_config(tmp_path / "c.yaml", config_dict(setups=setups, tasks=["addition", "ppl"])))
    (tmp_path / "run").mkdir()
    jobs = {j.id: j for j in prepare(preflight(cfg, None, None), RunOptions(tmp_path / "run")).jobs}
    assert [(i, j.after) for i, j in jobs.items()] == [
        ("bf16", ()),
        ("copy", ("bf16",)),
        ("copy-on-vllm", ("copy",)),
        ("int8", ("bf16",)),
    ]
    control, partner = jobs["copy-on-vllm"].job, jobs["copy"].job
    assert control.reference == {"ppl": ("copy", "ppl")} and jobs["int8"].job.reference == {"ppl": ("bf16", "ppl")}
    assert (
        control.task_key_parts["ppl"]["kl_reference"] == "copy"
        and "kl_reference" not in control.task_key_parts["addition"]
    )
    assert partner.task_key_parts["ppl"]["topk"] == "kept" and "topk" not in jobs["int8"].job.task_key_parts["ppl"]
    store = jobs["copy"].store
    store.topk_path("copy", "ppl").parent.mkdir(parents=True)
    store.topk_path("copy", "ppl").write_bytes(b"npz")
    assert jobs["copy-on-vllm"].inputs() == {"samples/copy/ppl.topk.npz": b"npz"}


def test_a_remote_worker_gets_what_it_reads_and_may_send_back_only_its_own_files(tmp_path: Path) -> None:
    jobs = {j.id: j for j in _prepared(tmp_path).jobs}
    int8, store = jobs["int8"], jobs["int8"].store
    assert int8.inputs() == {}  # nothing stored yet
    store.setup_path("int8").parent.mkdir(parents=True)
    store.setup_path("int8").write_text('{"timings": {}}')
    store.topk_path("bf16", "ppl").parent.mkdir(parents=True)
    store.topk_path("bf16", "ppl").write_bytes(b"npz")
    store.topk_path("bf16", "addition").write_bytes(b"not a reference")
    assert int8.inputs() == {"setups/int8.json": b'{"timings": {}}', "samples/bf16/ppl.topk.npz": b"npz"}
    for bad in [
        "../x.json",
        "setups/bf16.json",
        "samples/bf16/ppl.jsonl",
        "samples/int8/facts.jsonl",
        "samples/int8/ppl.jsonl/../../../x",
        "samples/int8/sub/ppl.jsonl",
        "/etc/passwd",
        "results.json",
    ]:
        with pytest.raises(RefusedFile):
            int8.allowed(bad)
    with pytest.raises(RefusedFile):  # one bad file: nothing written
        int8.accept({"samples/int8/ppl.jsonl": b"{}\n", "samples/kv-int4/ppl.jsonl": b"{}\n"})
    assert not store.samples_path("int8", "ppl").exists()
    int8.accept(
        {
            "samples/int8/ppl.meta.json": b"{}",
            "samples/int8/ppl.jsonl": b"{}\n",
            "setups/int8.json": b'{"name": "int8", "status": "ok"}',
        }
    )
    assert store.samples_path("int8", "ppl").read_bytes() == b"{}\n"
    outcome = store.read_outcome("int8")
    assert outcome is not None and outcome.status == "ok"
    # written in the order that keeps a half-accepted job not done: samples, then meta, then outcome
    order = [int8.allowed(p)[0] for p in ("samples/int8/ppl.jsonl", "samples/int8/ppl.meta.json", "setups/int8.json")]
    assert order == sorted(order)
    # records sent back under a new key: the earlier meta is removed before they are written, so a
    # kill before the new meta leaves the task not stored (docs/guarantees.md)
    int8.accept({"samples/int8/ppl.jsonl": b'{"new": 1}\n'})
    assert store.samples_path("int8", "ppl").read_bytes() == b'{"new": 1}\n'
    assert not store.meta_path("int8", "ppl").exists()


def test_a_sequential_remote_worker_gets_the_baseline_records_it_stops_on(tmp_path: Path) -> None:
    """Under Ray a sequential setup's worker tests its gates against the baseline's records after
    each chunk (qeval/analysis/sequential_run.py Monitor): they travel with its job, for its
    sequential tasks only; without them the monitor sees no pairs and never stops, so its
    verdicts would differ from the local executor's. The baseline's own job gets none."""
    from dataclasses import replace

    jobs = {j.id: j for j in _prepared(tmp_path).jobs}
    plan = seq_plan(tasks={"addition": {}})
    int8 = replace(jobs["int8"], job=jobs["int8"].job.model_copy(update={"sequential": plan}))
    base = replace(jobs["bf16"], job=jobs["bf16"].job.model_copy(update={"sequential": plan}))
    store = int8.store
    store.samples_path("bf16", "addition").parent.mkdir(parents=True)
    store.samples_path("bf16", "addition").write_bytes(b'{"sample_id": "0"}\n')
    store.samples_path("bf16", "ppl").write_bytes(b'{"sample_id": "0"}\n')  # not a sequential task: stays
    assert int8.inputs() == {"samples/bf16/addition.jsonl": b'{"sample_id": "0"}\n'}
    assert base.inputs() == {} and jobs["int8"].inputs() == {}  # the switch off: as before
    # a native cell the baseline stored at a pass's horizon travels with its next pass's job, to carry on from
    store.meta_path("bf16", "addition").write_text('{"key": "k"}')
    assert set(base.inputs()) == {"samples/bf16/addition.jsonl", "samples/bf16/addition.meta.json"}
    assert jobs["bf16"].inputs() == {}  # the switch off: as before
    with pytest.raises(RefusedFile):  # and it may not send them back
        int8.allowed("samples/bf16/addition.jsonl")
    # a group cell: its members' records (here a stand-in group of one member, ppl)
    grouped = seq_plan(tasks={"addition": {}, "grp": {"members": ["ppl"]}})
    int8 = replace(jobs["int8"], job=jobs["int8"].job.model_copy(update={"sequential": grouped}))
    assert set(int8.inputs()) == {"samples/bf16/addition.jsonl", "samples/bf16/ppl.jsonl"}


def test_a_lost_job_is_recorded_like_a_crashed_worker(tmp_path: Path) -> None:
    job = _prepared(tmp_path).jobs[1]
    job.record_failure("WorkerCrashedError: The worker died unexpectedly while executing this task.")
    outcome = job.store.read_outcome("int8")
    assert outcome is not None
    assert outcome.status == "failed" and outcome.key == job.keys.key
    assert (outcome.error or "").startswith("WorkerCrashedError")
    job.record_crash(-9)
    crashed = job.store.read_outcome("int8")
    assert crashed is not None and "SIGKILL" in (crashed.error or "")


def test_ray_errors_are_one_line_with_their_type() -> None:
    from ray.exceptions import OutOfMemoryError, RayTaskError, WorkerCrashedError

    from qeval.run.executors.ray_executor import error_text

    assert error_text(WorkerCrashedError()).startswith("WorkerCrashedError: The worker died unexpectedly")
    wrapped = RayTaskError("_job_task", "Traceback …", RuntimeError("node n1 runs qeval 0.0.9\nmore"))
    assert error_text(wrapped) == "RuntimeError: node n1 runs qeval 0.0.9"
    assert (
        error_text(OutOfMemoryError("1 worker(s) were killed\nMemory on the node…"))
        == "out of memory: OutOfMemoryError: 1 worker(s) were killed"
    )


# -- the node side -------------------------------------------------------------------------------------


def test_only_settings_a_worker_needs_are_forwarded() -> None:
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": "/h",
        "QEVAL_VLLM_PYTHON": "/p",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_CACHE": "/c",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "x",
        "PATH": "/bin",
    }
    assert forwarded_env(env) == {
        k: env[k]
        for k in ("HF_HUB_OFFLINE", "HF_HOME", "QEVAL_VLLM_PYTHON", "TOKENIZERS_PARALLELISM", "TRANSFORMERS_CACHE")
    }


def test_a_node_with_other_model_files_refuses_the_job(tmp_path: Path) -> None:
    job = _prepared(tmp_path).jobs[1]
    verify_inputs(job.cfg, job.job)  # the same files: fine
    copy = tmp_path / "model"
    shutil.copytree(MODEL, copy)
    (copy / "generation_config.json").write_text("{}")
    other = job.cfg.model_copy(update={"model": job.cfg.model.model_copy(update={"path": str(copy)})})
    with pytest.raises(RuntimeError, match="differs from the driver's"):
        verify_inputs(other, job.job)
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS, tasks)
    (tasks / "addition.yaml").write_text((tasks / "addition.yaml").read_text().replace("{{a}}", "{{ a }}"))
    moved = job.cfg.model_copy(update={"tasks_dir": str(tasks)})
    with pytest.raises(RuntimeError, match="task addition on node .* differs from the driver's copy"):
        verify_inputs(moved, job.job)


def test_scratch_of_dead_ray_workers_is_cleared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    proc = subprocess.Popen(["true"])
    proc.wait()  # its pid is gone: a Ray worker that died without cleaning up
    (tmp_path / f"qeval-ray-{proc.pid}-abc").mkdir()
    (tmp_path / f"qeval-ray-{os.getpid()}-def").mkdir()
    (tmp_path / "qeval-other").mkdir()
    clear_stale_scratch()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"qeval-ray-{os.getpid()}-def", "qeval-other"])
