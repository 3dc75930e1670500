"""A finished run logged to MLflow: a parent run for the run, one child run per setup, the run's
results.json, report.md and report.html as the parent's artifacts (docs/tracking.md).

MLflow is imported here only, when a config turns tracking on: qeval runs without it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from qeval.config.tracking import MlflowSpec
from qeval.results.schema import Results
from qeval.tracking.figures import Logged, child_run, parent_run

#: the run directory's files the parent run keeps as artifacts, where they exist
ARTIFACTS = ("results.json", "report.md", "report.html")
#: MLflow's limits per log_batch call (mlflow.utils.validation)
_PER_BATCH = {"metrics": 1000, "params": 100, "tags": 100}


def is_file_store(uri: str) -> bool:
    """A local file store: `file:` URIs and plain paths (MLflow 3 refuses them unless asked)."""
    scheme = urlsplit(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")  # C:\... on Windows


@contextmanager
def _client_settings(spec: MlflowSpec) -> Iterator[None]:
    """MLflow's HTTP settings for this call only (its defaults retry a dead server 7 times with
    exponential backoff: minutes), its run-URL printing off (the URL may carry credentials), its
    and urllib3's log lines held back (the caller prints one line), and the file store allowed
    where the config names one (MLflow 3 has it in maintenance mode, refused unless opted in)."""
    env = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(spec.max_retries),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(spec.timeout_s),
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    }
    if is_file_store(spec.tracking_uri):
        env["MLFLOW_ALLOW_FILE_STORE"] = "true"
    saved = {k: os.environ.get(k) for k in env}
    loggers = [logging.getLogger(name) for name in ("mlflow", "urllib3", "alembic")]
    levels = [lg.level for lg in loggers]
    os.environ.update(env)
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def log_run(spec: MlflowSpec, run_dir: Path, results: Results) -> str:
    """Log the finished run in `run_dir` to MLflow; the parent run's id. Raises whatever MLflow
    raises (the caller turns it into one warning)."""
    with _client_settings(spec):
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=spec.tracking_uri)
        experiment = client.get_experiment_by_name(spec.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(spec.experiment)
        parent = parent_run(results, str(run_dir))
        parent_id = _create(client, experiment_id, parent, {})
        open_ids = [parent_id]  # runs not yet terminated: failed, if logging breaks off
        try:
            for setup in results.setups:
                child = child_run(results, setup)
                child_id = _create(client, experiment_id, child, {"mlflow.parentRunId": parent_id}, open_ids)
                client.set_terminated(child_id, "FINISHED" if setup.status == "ok" else "FAILED")
                open_ids.remove(child_id)
            for name in ARTIFACTS:
                if (run_dir / name).is_file():
                    client.log_artifact(parent_id, str(run_dir / name))
        except BaseException:
            for run_id in reversed(open_ids):  # the child that broke off first, then the parent
                _give_up(client, run_id)
            raise
        client.set_terminated(parent_id, "FINISHED")
        return str(parent_id)


def _create(
    client: Any, experiment_id: str, logged: Logged, tags: dict[str, str], open_ids: list[str] | None = None
) -> str:
    """A run with `logged`'s params, metrics and tags, in as few requests as MLflow allows; its id
    is added to `open_ids` as soon as it exists, so a run whose logging breaks off is not left
    RUNNING."""
    from mlflow.entities import Metric, Param

    run = client.create_run(experiment_id, run_name=logged.name, tags=logged.tags | tags)
    run_id: str = run.info.run_id
    if open_ids is not None:
        open_ids.append(run_id)
    stamp = int(time.time() * 1000)
    metrics = [Metric(k, v, stamp, 0) for k, v in logged.metrics.items()]
    params = [Param(k, v) for k, v in logged.params.items()]
    for i in range(0, max(len(metrics), 1), _PER_BATCH["metrics"]):
        client.log_batch(run_id, metrics=metrics[i : i + _PER_BATCH["metrics"]])
    for i in range(0, len(params), _PER_BATCH["params"]):
        client.log_batch(run_id, params=params[i : i + _PER_BATCH["params"]])
    return run_id


def _give_up(client: Any, run_id: str) -> None:
    """Mark a run whose logging broke off as failed, if the tracker still answers."""
    try:
        client.set_terminated(run_id, "FAILED")
    except Exception:  # noqa: BLE001 - the first error is the one reported
        pass
