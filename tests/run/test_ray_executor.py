"""The `ray` executor on a real local Ray cluster: a head and a worker node on
127.0.0.1, one CPU each, started and stopped by this module, so two jobs run at a time.

Each test runs the shipped demo config (a few of its setups, --limit 20) through `qeval run
--executor ray` and compares the per-sample records with a `local` run's, byte for byte:
undisturbed, with the Ray worker of a setup SIGKILLed in the middle of its scoring (retried),
with retries exhausted (recorded as failed with Ray's cause), and interrupted with Ctrl-C
(cancelled, then resumed). A two-model sweep runs on the same cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import MODEL, ROOT, TASKS, run_cli, validate_results
from tests.ray_cluster import ENV, LocalCluster, start_cluster

pytestmark = pytest.mark.slow
DEMO = ROOT / "configs" / "demo.yaml"
LIMIT = "20"
QUICK = ("--limit", LIMIT, "--no-performance")  # about where jobs run, not their speed
SETUPS = "int8,kv-int4"  # and the baseline, bf16: it runs first, then these two side by side
_SCRATCH = re.compile(r"^qeval-ray-(\d+)-")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    saved = {k: os.environ.get(k) for k in (*ENV, "RAY_ADDRESS")}
    c = start_cluster(ROOT, worker_nodes=1, cpus_per_node=1)
    os.environ.update(ENV | {"RAY_ADDRESS": c.address})  # the drivers `qeval run` starts join it
    try:
        yield c
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        c.stop()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("local") / "run"
    res = run_cli("run", str(DEMO), "--output", str(out), *QUICK, "--setups", SETUPS, "--executor", "local")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _samples(run: Path, setups: tuple[str, ...] = ("bf16", "int8", "kv-int4")) -> dict[str, bytes]:
    return {
        p.relative_to(run).as_posix(): p.read_bytes()
        for s in setups
        for p in sorted((run / "samples" / s).glob("*.jsonl"))
    }


def _same(a: dict[str, bytes], b: dict[str, bytes]) -> bool:
    """Two runs' sample files hold the same records: every field equal, floats to float32's noise.
    Not byte for byte: a Ray worker has the CPUs its job asked for and a local job may have more,
    and torch's float32 reductions over another thread count round differently in the last digits
    (seen, run alone: -0.0048737 against -0.0048736 on a log-likelihood, 0.0183074 against 0.0183079
    on a KL; a quantized setup moves them by 1e-2 and more)."""
    if a.keys() != b.keys():
        return False
    for name in a:
        left = [json.loads(x) for x in a[name].splitlines()]
        right = [json.loads(x) for x in b[name].splitlines()]
        if len(left) != len(right) or not all(_close(x, y) for x, y in zip(left, right, strict=True)):
            return False
    return True


def _close(x: object, y: object) -> bool:
    """JSON values equal, floats to float32 noise: 1e-4 relative or 1e-6 absolute (nested dicts and lists walked)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_close(a, b) for a, b in zip(x, y, strict=True))
    if isinstance(x, float) or isinstance(y, float):
        return isinstance(x, int | float) and isinstance(y, int | float) and x == pytest.approx(y, rel=1e-4, abs=1e-6)
    return x == y


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, T stopped, Z zombie…); None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


class Watch(threading.Thread):
    """Watches the nodes' scratch folders (qeval-ray-<Ray worker pid>-*/run/…) while a run goes:
    how many jobs ran at once, which Ray worker ran each setup, and, when asked, SIGKILLs the Ray
    worker running `kill_setup` once its worker process has stored its first task there."""

    def __init__(
        self,
        scratch: Path,
        kill_setup: str | None = None,
        first_task: str = "compare_mc",
        freeze: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(daemon=True)
        self.scratch, self.kill_setup, self.first_task, self.freeze = scratch, kill_setup, first_task, freeze
        self.most_at_once = 0
        self.pids: dict[str, list[int]] = {}
        self.killed: int | None = None
        #: {setup: Ray worker pid} SIGSTOPped before its task returned (see `_freeze`)
        self.frozen: dict[str, int] = {}
        #: setups seen only once their task was returning: too late to freeze
        self.missed: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            running = []
            for d in self.scratch.glob("qeval-ray-*"):
                m = _SCRATCH.match(d.name)
                jobs = list((d / "run" / "jobs").glob("*.json")) if m else []
                if not m or not jobs or not _alive(int(m.group(1))):
                    continue
                pid, setup = int(m.group(1)), jobs[0].stem
                running.append(pid)
                if pid not in self.pids.setdefault(setup, []):
                    self.pids[setup].append(pid)
                stored = d / "run" / "samples" / setup / f"{self.first_task}.meta.json"
                if setup == self.kill_setup and self.killed is None and stored.is_file():
                    os.kill(pid, signal.SIGKILL)  # the Ray worker process; its worker process dies with it
                    self.killed = pid
                if setup in self.freeze and setup not in self.frozen and setup not in self.missed:
                    self._freeze(setup, pid, jobs[0])
            self.most_at_once = max(self.most_at_once, len(running))
            time.sleep(0.05)

    def _freeze(self, setup: str, pid: int, job_file: Path) -> None:
        """SIGSTOP the Ray worker running `setup`: its task cannot return, so the job is still
        running whenever the test looks. Frozen for sure only if its job file is still there once
        stopped: run_on_node removes its scratch folder before it returns."""
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            self.missed.add(setup)
            return
        deadline = time.monotonic() + 5
        while _state(pid) not in ("T", "t", None) and time.monotonic() < deadline:
            time.sleep(0.01)  # SIGSTOP takes effect asynchronously
        if _state(pid) in ("T", "t") and job_file.is_file():
            self.frozen[setup] = pid
        else:
            self.missed.add(setup)
            self.thaw([pid])

    @staticmethod
    def thaw(pids: list[int]) -> None:
        """SIGCONT: a stopped process handles no request to exit, and ignores every signal but SIGKILL."""
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def __enter__(self) -> Watch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join(5)


def _config(tmp: Path, executor: str) -> Path:
    """configs/demo.yaml with an absolute model path and an `executor:` block."""
    text = DEMO.read_text().replace("path: models/qeval-tiny", f"path: {MODEL}")
    path = tmp / "demo.yaml"
    path.write_text(text + f"tasks_dir: {TASKS}\nexecutor: {executor}\n")
    return path


def test_ray_two_at_a_time_matches_local(cluster: LocalCluster, local_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with Watch(cluster.scratch) as watch:
        res = run_cli("run", str(DEMO), "--output", str(out), *QUICK, "--setups", SETUPS, "--executor", "ray")
    assert res.returncode == 0, res.stderr[-3000:]
    assert watch.most_at_once == 2, watch.pids  # the two quantized setups side by side, never more
    assert set(watch.pids) == {"bf16", "int8", "kv-int4"}
    for setup in ("bf16", "int8", "kv-int4"):  # each task's progress, forwarded from the nodes as it happens
        assert f"{setup}: compare_mc done" in res.stderr and f"{setup}: loading model done" in res.stderr
    ray_samples = _samples(out)
    assert len(ray_samples) == 12 and _same(ray_samples, _samples(local_run))
    local, ray = (json.loads((r / "results.json").read_text()) for r in (local_run, out))
    assert [(s["name"], s["status"], s["tasks"]) for s in ray["setups"]] == [
        (s["name"], s["status"], s["tasks"]) for s in local["setups"]
    ]
    assert ray["recommendation"] == local["recommendation"]
    # the driver wrote the run directory; nothing of the nodes' scratch folders is in it
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in local_run.iterdir())
    assert not list(cluster.scratch.glob("qeval-ray-*"))  # each job removed its scratch folder


def test_a_killed_ray_worker_is_retried(cluster: LocalCluster, local_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with Watch(cluster.scratch, kill_setup="int8") as watch:
        res = run_cli("run", str(DEMO), "--output", str(out), *QUICK, "--setups", "int8", "--executor", "ray")
    assert res.returncode == 0, res.stderr[-3000:]
    assert watch.killed is not None, "the Ray worker running int8 was never seen scoring"
    assert watch.pids["int8"][0] == watch.killed and len(watch.pids["int8"]) == 2, watch.pids  # a fresh process
    assert _same(_samples(out, ("bf16", "int8")), _samples(local_run, ("bf16", "int8")))
    r = json.loads((out / "results.json").read_text())
    assert all(s["status"] == "ok" for s in r["setups"])


def test_exhausted_retries_record_the_cause(cluster: LocalCluster, tmp_path: Path) -> None:
    cfg = _config(tmp_path, f"{{kind: ray, max_retries: 0, address: '{cluster.address}'}}")  # the config's address
    out = tmp_path / "run"
    with Watch(cluster.scratch, kill_setup="int8") as watch:
        res = run_cli("run", str(cfg), "--output", str(out), *QUICK, "--setups", "int8")
    assert watch.killed is not None
    assert res.returncode == 1, res.stderr[-3000:]  # a setup failed: the run went on, and says so
    r = json.loads((out / "results.json").read_text())
    setups = {s["name"]: s for s in r["setups"]}
    assert setups["bf16"]["status"] == "ok"
    assert setups["int8"]["status"] == "failed"
    assert setups["int8"]["error"].startswith("WorkerCrashedError: The worker died unexpectedly"), setups["int8"]
    assert "int8: failed: WorkerCrashedError" in res.stderr
    assert "failed: WorkerCrashedError" in (out / "report.md").read_text()


def test_ctrl_c_cancels_the_jobs_and_the_run_resumes(cluster: LocalCluster, local_run: Path, tmp_path: Path) -> None:
    # Deterministic by construction. This test used to send Ctrl-C at the first sign of int8 or
    # kv-int4 running and retry when the run had finished first (exit 0): on a loaded 2-core
    # machine the signal could land after both jobs had returned (each job is seconds at --limit 20;
    # the watcher's sight of it and the driver's forwarded progress lines can both come late).
    # Now the watcher SIGSTOPs each of the two Ray workers when it first sees its job, before its
    # task can return (checked: its scratch job file is still there once stopped), and Ctrl-C is
    # sent only once both are frozen: the two jobs are running, and cannot finish, when it lands.
    out = tmp_path / "run"
    args = [sys.executable, "-m", "qeval.cli", "run", str(DEMO), "--output", str(out), *QUICK]
    args += ["--setups", SETUPS, "--executor", "ray"]
    with Watch(cluster.scratch, freeze=frozenset({"int8", "kv-int4"})) as watch:
        driver = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_shell
        )
        lines: list[str] = []
        reader = threading.Thread(target=_read_lines, args=(driver, lines), daemon=True)
        reader.start()
        deadline = time.monotonic() + 600
        try:
            while driver.poll() is None and time.monotonic() < deadline:
                if set(watch.frozen) == {"int8", "kv-int4"} or watch.missed:
                    break
                time.sleep(0.05)
            seen = (driver.poll(), dict(watch.frozen), sorted(watch.missed), dict(watch.pids), _sigblk())
            assert set(watch.frozen) == {"int8", "kv-int4"}, (seen, "".join(lines)[-3000:])
            driver.send_signal(signal.SIGINT)
            driver.wait(timeout=120)
        finally:
            # a cancelled task's worker may be asked to exit, which a stopped process never does
            Watch.thaw(list(watch.frozen.values()))
        reader.join(30)
    err = "".join(lines)
    assert driver.returncode == 130, (seen, err[-3000:])
    assert "rerun the same command to resume" in err
    running = list(watch.frozen.values())
    gone_by = time.monotonic() + 30  # force-cancelled: the Ray workers are killed, their worker processes with them
    while [p for p in running if _alive(p)] and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert not [p for p in running if _alive(p)]
    assert not list((out / "setups").glob("int8.json")) and not list((out / "setups").glob("kv-int4.json"))
    res = run_cli("run", str(DEMO), "--output", str(out), *QUICK, "--setups", SETUPS, "--executor", "ray")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "bf16: all 4 tasks stored, skipped" in res.stderr  # resumed: the baseline finished before Ctrl-C
    assert _same(_samples(out), _samples(local_run))


def _as_from_a_shell() -> None:
    """In the driver's child before exec: Ctrl-C deliverable and Python's own handler, as from a
    shell, whatever this pytest process carries (a blocked or ignored SIGINT is inherited across
    fork and exec, and Ray starts its own processes with SIGINT blocked)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sigblk() -> str:
    """This process's blocked-signal mask, as /proc shows it (for the failure message)."""
    text = Path("/proc/self/status").read_text()
    return next((line.split()[1] for line in text.splitlines() if line.startswith("SigBlk:")), "?")


def _read_lines(proc: subprocess.Popen[str], into: list[str]) -> None:
    """Append `proc`'s stderr lines to `into` as they come."""
    for line in proc.stderr or []:
        into.append(line)


def _float32_copy(dst: Path) -> Path:
    """The shipped model saved in float32: a second local model (its content checksum differs)."""
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).save_pretrained(dst)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODEL / name, dst / name)
    return dst


SWEEP = """\
name: two-models
models:
  - {name: tiny, path: "@MODEL@", dtype: auto, max_context: 256}
  - name: tiny-f32
    path: "@F32@"
    dtype: float32
    max_context: 256
    setups:                          # its own setups; tiny takes the sweep's
      - {name: fp32, baseline: true}
      - {name: int8, weights: int8}
tasks_dir: "@TASKS@"
device: cpu
batch_size: 64
setups:
  - {name: bf16, baseline: true}
  - {name: int8, weights: int8}
tasks: [addition, ppl]
budget: {gpu_memory_gib: 0.01, utilization: 0.9, context_len: 256, overhead_gib: 0.001, margin: 0.05}
gates: [{task: all, max_drop: 0.02}]
executor: {kind: ray}
"""


def test_two_model_sweep_gives_the_cross_model_table(cluster: LocalCluster, tmp_path: Path) -> None:
    f32 = _float32_copy(tmp_path / "tiny-f32")
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(SWEEP.replace("@MODEL@", str(MODEL)).replace("@F32@", str(f32)).replace("@TASKS@", str(TASKS)))
    out = tmp_path / "run"
    with Watch(cluster.scratch) as watch:
        res = run_cli("run", str(cfg), "--output", str(out), *QUICK)
    assert res.returncode == 0, res.stderr[-3000:]
    assert watch.most_at_once == 2  # the two models' baselines side by side
    sweep = json.loads((out / "sweep.json").read_text())
    assert [m["name"] for m in sweep["models"]] == ["tiny", "tiny-f32"]
    assert [m["baseline"] for m in sweep["models"]] == ["bf16", "fp32"]
    assert sweep["models"][0]["model_sha256"] != sweep["models"][1]["model_sha256"]
    vs = sweep["baselines_vs_reference"]["tiny-f32"]
    assert set(vs) == {"addition", "ppl"} and vs["ppl"]["n"] == int(LIMIT)
    for m in sweep["models"]:
        validate_results(out / m["run_dir"] / "results.json")
        r = json.loads((out / m["run_dir"] / "results.json").read_text())
        assert all(s["status"] == "ok" for s in r["setups"])
        assert "ppl" in next(s for s in r["setups"] if s["name"] == "int8")["vs_baseline"]  # vs its own baseline
    md = (out / "report.md").read_text()
    table = md.split("## The models' baselines", 1)[1].split("##", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| tiny")]
    assert len(rows) == 2 and rows[0].startswith("| tiny (reference) |") and "| fp32 |" in rows[1]
    assert md.count("## Model ") == 2 and "## Recommendation per model" in md
    before = md
    res = run_cli("report", str(out))
    assert res.returncode == 0 and (out / "report.md").read_text() == before  # from the stored files alone


def test_a_job_no_node_can_hold_fails_at_once(cluster: LocalCluster, tmp_path: Path) -> None:
    """device: cuda on a cluster without GPUs: every setup asks for a GPU no node has. Each is
    failed with what it needed instead of waiting in Ray's queue for ever (the driver itself
    needs no GPU under the ray executor)."""
    cfg = _config(tmp_path, "{kind: ray}")
    cfg.write_text(cfg.read_text().replace("device: auto", "device: cuda"))
    started = time.monotonic()
    res = run_cli("run", str(cfg), "--output", str(tmp_path / "run"), *QUICK, "--setups", "int8")
    assert res.returncode == 1, res.stderr[-3000:]
    assert time.monotonic() - started < 120
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    for s in r["setups"]:
        assert s["status"] == "failed"
        assert s["error"] == (
            "cannot be placed on this cluster: needs 1 CPU and 1 GPU on one node; the largest node "
            "of the cluster has 1 CPUs and 0 GPUs"
        ), s["error"]
