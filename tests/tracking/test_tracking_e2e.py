"""The demo twice with tracking on, against a real MLflow tracking server this test starts on
127.0.0.1 (sqlite backend, artifacts served by it): the runs, their child runs, metrics and
artifacts are in MLflow. Then `qeval compare` on the two runs, which differ only in qeval's
batch size: paired deltas and the provenance diff; the regression gate on the run against
itself and on a constructed regression; and a server that is down costs one warning."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import MODEL, ROOT, TASKS, run_cli

pytestmark = pytest.mark.slow
LIMIT = "8"  # cheap: the statistics need documents, not many; the regression below flips all of them
EXPERIMENT = "qeval-e2e"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1, sqlite store, its own artifact store; its URI."""
    tmp = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner processes: not used here
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp / 'mlflow.db'}",
            "--artifacts-destination",
            str(tmp / "artifacts"),
        ],
        stdout=(tmp / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )  # its own group: the uvicorn worker goes with it
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:  # noqa: S310 - our http://127.0.0.1 server
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def demo_config(tmp: Path, name: str, uri: str, **changes: Any) -> Path:
    """configs/demo.yaml with absolute paths, tracking on, and `changes` applied."""
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["model"]["path"] = str(MODEL)
    cfg |= {"tasks_dir": str(TASKS), "tracking": {"mlflow": {"tracking_uri": uri, "experiment": EXPERIMENT}}} | changes
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def demo_run(cfg: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "run", str(cfg), "--output", str(out), "--limit", LIMIT, "--setups", "int8", "--no-performance", timeout=600
    )


@pytest.fixture(scope="module")
def runs(server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """The demo (baseline and int8) at its own batch size, and again at batch size 16; both tracked."""
    tmp = tmp_path_factory.mktemp("runs")
    a, b = tmp / "a", tmp / "b"
    messages = []
    for cfg, out in ((demo_config(tmp, "a", server), a), (demo_config(tmp, "b", server, batch_size=16), b)):
        res = demo_run(cfg, out)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "warning: tracking" not in res.stderr, res.stderr[-3000:]
        messages.append(res.stderr)
    return a, b, messages


def test_runs_children_metrics_and_artifacts_are_in_mlflow(
    server: str, runs: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    import mlflow
    from mlflow import MlflowClient

    a, b, messages = runs
    mlflow.set_tracking_uri(server)
    df = mlflow.search_runs(experiment_names=[EXPERIMENT])
    parents = df[df["tags.qeval.kind"] == "run"]
    children = df[df["tags.qeval.kind"] == "setup"]
    assert len(parents) == 2 and len(children) == 4
    client = MlflowClient(tracking_uri=server)
    for run_dir, stderr in zip((a, b), messages, strict=True):
        results = json.loads((run_dir / "results.json").read_text())
        parent = parents[parents["params.config_hash"] == results["run"]["config_hash"]]
        assert len(parent) == 1
        run_id = parent["run_id"].iloc[0]
        assert f"tracking: MLflow run {run_id}" in stderr
        assert (
            parent["status"].iloc[0] == "FINISHED"
            and parent["params.model_sha256"].iloc[0] == results["run"]["model_sha256"]
        )
        assert json.loads(parent["params.config.batch_size"].iloc[0]) == results["config"]["batch_size"]
        mine = children[children["tags.mlflow.parentRunId"] == run_id]
        assert sorted(mine["tags.mlflow.runName"]) == ["bf16", "int8"]
        for s in results["setups"]:
            row = mine[mine["tags.mlflow.runName"] == s["name"]].iloc[0]
            assert row["params.version.transformers"] == s["library_versions"]["transformers"]
            assert json.loads(row["params.setup.spec"]) == s["spec"]
            assert row["metrics.memory.weights_bytes"] == s["memory"]["weights_bytes"]["measured"]
            for task, score in s["tasks"].items():
                for metric, value in score["metrics"].items():
                    assert row[f"metrics.{task}.{metric}"] == pytest.approx(value["value"])
            for task, cmp in s["vs_baseline"].items():
                assert row[f"metrics.{task}.delta"] == pytest.approx(cmp["delta"])
                assert row[f"metrics.{task}.delta_ci_low"] == pytest.approx(cmp["ci"][0])
                assert row[f"metrics.{task}.delta_ci_high"] == pytest.approx(cmp["ci"][1])
        assert {f.path for f in client.list_artifacts(run_id)} == {"results.json", "report.md", "report.html"}
        got = client.download_artifacts(run_id, "results.json", str(tmp_path))
        assert Path(got).read_bytes() == (run_dir / "results.json").read_bytes()


def test_compare_shows_paired_deltas_and_what_changed(runs: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    a, b, _ = runs
    res = run_cli("compare", str(a), str(b), "--output", str(tmp_path / "cmp"))
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    tasks = [t for p in report["comparisons"][0]["setups"] for t in p["tasks"]]
    assert {(t["setup"], t["task"]) for t in tasks} == {
        (s, t) for s in ("bf16", "int8") for t in ("compare_mc", "addition", "facts", "ppl")
    }
    assert all(t["paired"] and t["n_paired"] == int(LIMIT) and t["ci"][0] <= t["delta"] <= t["ci"][1] for t in tasks)
    changes = {c["what"]: (c["a"], c["b"]) for c in report["comparisons"][0]["changes"]}
    assert changes["config.batch_size"] == ("64", "16")
    assert "run.config_hash" in changes and "run.model_sha256" not in changes and "run.qeval_version" not in changes
    assert not [w for w in changes if w.startswith(("tasks.", "setups."))], changes  # same data, setups, versions
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| config.batch_size | 64 | 16 |" in md and "paired, newcombe" in md and "paired, t" in md


def test_the_regression_gate(runs: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    a, _, _ = runs
    res = run_cli("compare", str(a), str(a), "--output", str(tmp_path / "same"), "--fail-on-regression", "0.02")
    assert res.returncode == 0, res.stderr[-3000:]
    worse = tmp_path / "worse"
    shutil.copytree(a, worse)
    path = worse / "samples" / "int8" / "compare_mc.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(r["correct"] for r in rows) >= 7, "the regression below needs int8 right on most documents"
    path.write_text("".join(json.dumps(r | {"correct": False}) + "\n" for r in rows))
    # the meta and results.json report what the records hold, as a run that scored them would
    # (compare refuses records that disagree with them: tests/tracking/test_compare_trust.py)
    meta_path = path.with_name("compare_mc.meta.json")
    meta = json.loads(meta_path.read_text())
    meta["metrics"]["acc"]["value"] = 0.0
    meta_path.write_text(json.dumps(meta))
    results = json.loads((worse / "results.json").read_text())
    next(s for s in results["setups"] if s["name"] == "int8")["tasks"]["compare_mc"]["metrics"]["acc"]["value"] = 0.0
    (worse / "results.json").write_text(json.dumps(results))
    res = run_cli("compare", str(a), str(worse), "--output", str(tmp_path / "gate"), "--fail-on-regression", "0.02")
    assert res.returncode == 3, res.stderr[-3000:]
    assert "regression: worse: int8 · compare_mc" in res.stderr


def test_a_server_that_is_down_costs_one_warning(runs: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    """Resuming run A with the tracker pointed at a closed port: tracking is in no resume key, so
    everything is reused; the run exits 0 with its files complete and one warning."""
    a, _, _ = runs
    before = (a / "results.json").read_text()
    cfg = demo_config(tmp_path, "a", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    res = demo_run(cfg, a)
    assert res.returncode == 0, res.stderr[-3000:]
    assert time.monotonic() - started < 120
    warnings = [line for line in res.stderr.splitlines() if "tracking" in line]
    assert len(warnings) == 1 and warnings[0].startswith("qeval: warning: tracking: not logged"), res.stderr[-3000:]
    assert res.stderr.count("skipped (use --force to recompute)") == 2
    after = json.loads((a / "results.json").read_text())
    assert json.loads(before)["run"]["config_hash"] == after["run"]["config_hash"]
    assert (a / "report.md").is_file() and (a / "report.html").is_file()
