"""MLflow tracking without a model run: the config piece (in no hash, key or job file), a stored
run (tests/data/run-v1) logged to a local file store and read back, a tracker that is down (one
warning, quickly), credentials kept out of every line, and the figures' names."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from qeval.config import load_config
from qeval.config.tracking import TrackingSpec
from qeval.errors import UserError
from qeval.results.performance import Performance
from qeval.results.schema import read_results
from qeval.tracking import track_run
from qeval.tracking.figures import child_run, safe_key
from qeval.tracking.uri import redact, scrub
from tests.helpers import ROOT, config_dict, make_config

V1 = ROOT / "tests" / "data" / "run-v1"
TRACKING = {"mlflow": {"tracking_uri": "http://127.0.0.1:5000", "experiment": "e"}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


def test_tracking_is_in_no_hash_key_or_job_file(tmp_path: Path) -> None:
    plain = load_config(make_config(tmp_path, filename="a.yaml"))
    tracked = load_config(make_config(tmp_path, filename="b.yaml", tracking=TRACKING))
    assert tracked.tracking.enabled and not plain.tracking.enabled
    assert tracked.config_hash() == plain.config_hash()
    assert "tracking" not in tracked.as_json() and tracked.as_json() == plain.as_json()
    assert "tracking" not in tracked.job_json() and "127.0.0.1:5000" not in json.dumps(tracked.job_json())


def test_tracking_keys_are_strict(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="tracking.wandb: unknown key"):
        load_config(make_config(tmp_path, tracking={"wandb": {"mode": "offline"}}))
    with pytest.raises(UserError, match="tracking.mlflow.tracking_uri: Field required"):
        load_config(make_config(tmp_path, tracking={"mlflow": {"experiment": "e"}}))


def test_mlflow_missing_is_one_line_at_validation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qeval.config.tracking as piece

    monkeypatch.setattr(piece.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError) as err:
        load_config(make_config(tmp_path, tracking=TRACKING))
    assert "MLflow is not installed" in str(err.value) and "qeval[tracking]" in str(err.value)
    assert "\n" not in str(err.value)


def test_redact_keeps_credentials_out() -> None:
    uri = "https://alice:s3cret@mlflow.example:443/x?token=abc&experiment=1"
    assert redact(uri) == "https://***@mlflow.example:443/x?token=***&experiment=***"
    assert redact("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert redact("file:///tmp/mlruns") == "file:///tmp/mlruns"
    message = f"Connection to {uri} refused; user alice, password s3cret"
    assert "s3cret" not in scrub(message, uri) and "abc" not in scrub(message, uri)


def test_hostile_names_become_safe_keys() -> None:
    assert safe_key("../../etc/passwd") == "__/__/etc/passwd"
    assert safe_key("/abs") == "abs" and safe_key("a<b>|c") == "a_b__c" and len(safe_key("x" * 400)) == 250
    assert safe_key("") == "_"


def test_performance_and_memory_figures_become_metrics() -> None:
    results = read_results(V1 / "results.json")
    setup = results.setup("int8")
    measured = {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "repeats": 3,
        "unit": "tokens/s",
        "source": "[workload: x]",
        "values": [1.0, 2.0, 3.0],
    }
    figures = (
        "requests_per_s",
        "output_tokens_per_s",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "ttft_p50_s",
        "ttft_p90_s",
        "tpot_p50_s",
        "tpot_p90_s",
        "e2e_p50_s",
        "e2e_p90_s",
    )
    perf = {
        "status": "ok",
        "levels": [
            {"concurrency": c, "requests": 4} | {f: measured | {"median": c * 1.5} for f in figures} for c in (1, 8)
        ],
        "decode": {"achieved": 1.0, "concurrency": 1, "ceiling": 4.0, "share": 0.25, "source": "s"},
    }
    setup = setup.model_copy(update={"performance": Performance.model_validate(perf)})
    logged = child_run(results, setup)
    assert logged.metrics["perf.c8.output_tokens_per_s"] == 12.0 and logged.metrics["perf.c1.ttft_p50_s"] == 1.5
    assert logged.metrics["perf.decode_share"] == 0.25
    assert logged.metrics["memory.weights_bytes"] == setup.memory.weights_bytes.measured
    assert logged.metrics["addition.delta"] == setup.vs_baseline["addition"].delta
    assert logged.metrics["addition.delta_ci_low"] == setup.vs_baseline["addition"].ci[0]
    assert logged.params["model_sha256"] == results.run.model_sha256
    assert json.loads(logged.params["setup.spec"]) == setup.spec.as_dict()
    assert logged.params["version.transformers"] == setup.library_versions["transformers"]


def _mlflow_client(uri: str) -> Any:
    import os

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # reading the file store back, as qeval wrote it
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_a_stored_run_logs_to_a_file_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(V1, run)
    (run / "report.html").write_text("<html></html>")
    results = read_results(run / "results.json")
    uri = (tmp_path / "mlruns").as_uri()
    spec = TrackingSpec.model_validate({"mlflow": {"tracking_uri": uri, "experiment": "qeval-file"}})
    run_id = track_run(run, results, spec)
    err = capsys.readouterr().err
    assert run_id and f"tracking: MLflow run {run_id}" in err and "warning" not in err
    client = _mlflow_client(uri)
    parent = client.get_run(run_id)
    assert parent.info.status == "FINISHED" and parent.data.params["config_hash"] == results.run.config_hash
    exp = client.get_experiment_by_name("qeval-file")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    assert sorted(c.data.tags["mlflow.runName"] for c in children) == sorted(s.name for s in results.setups)
    kv2 = next(c for c in children if c.data.tags["mlflow.runName"] == "kv-int2")
    assert kv2.data.metrics["compare_mc.delta"] == pytest.approx(
        results.setup("kv-int2").vs_baseline["compare_mc"].delta
    )
    assert {a.path for a in client.list_artifacts(run_id)} == {"results.json", "report.md", "report.html"}


@pytest.mark.parametrize("auth", ["", "alice:s3cret@"])
def test_a_tracker_that_is_down_is_one_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str], auth: str) -> None:
    results = read_results(V1 / "results.json")
    uri = f"http://{auth}127.0.0.1:{closed_port()}"
    spec = TrackingSpec.model_validate({"mlflow": {"tracking_uri": uri, "experiment": "x", "max_retries": 1}})
    started = time.monotonic()
    assert track_run(V1, results, spec) is None
    assert time.monotonic() - started < 30  # MLflow's own retries would wait for minutes
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qeval: warning: tracking: not logged to MLflow"), captured.err
    assert "the run's files are complete" in lines[0]
    assert "s3cret" not in captured.err + captured.out and "alice" not in captured.err + captured.out


HOSTILE_URI = "http://alice:hunter2@127.0.0.1:{port}/?token=tok123&credential=cred456#sig=frag789"
HOSTILE_SECRETS = ("alice", "hunter2", "tok123", "credential=cred456", "cred456", "frag789")


def test_every_query_value_and_the_fragment_are_redacted() -> None:
    """Issue 40 point 3: `credential=` and the fragment were shown as they are."""
    uri = HOSTILE_URI.format(port=9)
    assert redact(uri) == "http://***@127.0.0.1:9/?token=***&credential=***#***"
    # as a client may quote it back: in a request path, URL-encoded, or in pieces
    message = (
        "Max retries exceeded with url: /?token=tok123&credential=cred456/api/2.0/mlflow/x "
        "(fragment sig%3Dfrag789, user alice, password hunter2)"
    )
    assert not [s for s in HOSTILE_SECRETS if s in scrub(message, uri)], scrub(message, uri)


def test_a_tracker_that_is_down_shows_no_part_of_a_hostile_uri(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow's own message repeats the URI's query: the warning line shows none of its secrets."""
    results = read_results(V1 / "results.json")
    spec = TrackingSpec.model_validate(
        {"mlflow": {"tracking_uri": HOSTILE_URI.format(port=closed_port()), "experiment": "x", "max_retries": 1}}
    )
    assert track_run(V1, results, spec) is None
    captured = capsys.readouterr()
    assert "not logged to MLflow" in captured.err
    assert not [s for s in HOSTILE_SECRETS if s in captured.err + captured.out], captured.err


#: a password with `/` in it (AWS's documented example key): `urlsplit` ends the authority there
SLASHED_URI = "http://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@127.0.0.1:{port}"
SLASHED_SECRETS = ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "K7MDENG", "bPxRfiCYEXAMPLEKEY")


def test_the_userinfo_ends_at_the_last_at_sign() -> None:
    """Issue 54 point 4: a password holding `/`, `?` or `#` was shown whole."""
    assert redact(SLASHED_URI.format(port=9)) == "http://***@127.0.0.1:9"
    assert redact("http://alice:s3cr#et@host/") == "http://***@host/"
    assert redact("http://alice:pa?ss=1@host:5000/x?token=t") == "http://***@host:5000/x?token=***"
    assert redact("sqlite:///mlflow.db") == "sqlite:///mlflow.db"
    # a client that parses it as urlsplit does quotes the pieces: none of them is shown
    message = "Invalid port 'wJalrXUtnFEMI' for host AKIAIOSFODNN7EXAMPLE, path /K7MDENG/bPxRfiCYEXAMPLEKEY@127.0.0.1:9"
    assert not [s for s in SLASHED_SECRETS if s in scrub(message, SLASHED_URI.format(port=9))]


def test_a_tracker_that_is_down_shows_no_part_of_a_slashed_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = read_results(V1 / "results.json")
    uri = SLASHED_URI.format(port=closed_port())
    spec = TrackingSpec.model_validate({"mlflow": {"tracking_uri": uri, "experiment": "x", "max_retries": 0}})
    assert track_run(V1, results, spec) is None
    captured = capsys.readouterr()
    assert "not logged to MLflow at http://***@127.0.0.1:" in captured.err
    assert not [s for s in SLASHED_SECRETS if s in captured.err + captured.out], captured.err


def test_a_long_tracker_error_is_cut_at_a_word(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import qeval.tracking.mlflow_log as mlflow_log

    def refuse(*_: Any) -> str:
        raise RuntimeError(" ".join(["unavailable"] * 100))

    monkeypatch.setattr(mlflow_log, "log_run", refuse)
    spec = TrackingSpec.model_validate(TRACKING)
    assert track_run(V1, read_results(V1 / "results.json"), spec) is None
    line = capsys.readouterr().err.strip()
    assert "unavailable…);" in line and "unavailable unavailabl…" not in line
    assert line.endswith("the run's files are complete")


def test_a_logging_that_breaks_off_leaves_no_run_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40, minor: a child run whose logging broke off was left RUNNING."""
    from mlflow import MlflowClient

    seen: list[str] = []
    original = MlflowClient.log_batch

    def break_on_the_first_child(self: Any, run_id: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(run_id)
        if run_id != seen[0]:  # the parent logs first; the first child's batch breaks off
            raise ConnectionError("tracker went away")
        return original(self, run_id, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", break_on_the_first_child)
    uri = (tmp_path / "mlruns").as_uri()
    spec = TrackingSpec.model_validate({"mlflow": {"tracking_uri": uri, "experiment": "broken"}})
    assert track_run(V1, read_results(V1 / "results.json"), spec) is None
    assert "tracker went away" in capsys.readouterr().err
    client = _mlflow_client(uri)
    runs = client.search_runs([client.get_experiment_by_name("broken").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FAILED"}, [r.info.status for r in runs]


def test_config_dict_takes_tracking() -> None:
    """The shared fixture passes the block through as given (what the tests above rely on)."""
    assert config_dict(tracking=TRACKING)["tracking"] == TRACKING
