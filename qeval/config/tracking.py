"""The `tracking:` piece of the run config: where a finished run is also logged (docs/tracking.md).

    tracking:
      mlflow:
        tracking_uri: http://127.0.0.1:5000   # a tracking server, sqlite:///mlflow.db, or file:///path/mlruns
        experiment: qeval-demo                # created when missing
        timeout_s: 30                         # per HTTP request
        max_retries: 1                        # per HTTP request, before the run's logging is given up

Off unless given. Tracking changes nothing a run computes, so it is never part of the config
hash, the resume keys, results.json or the workers' job files (`RunConfig.as_json`): turning it
on or pointing it elsewhere reuses every stored result, and a URI with credentials in it is
never written into the run directory."""

from __future__ import annotations

import importlib.util

from pydantic import Field, model_validator

from qeval.strict import Strict

#: the extra that installs MLflow's client (pyproject.toml)
INSTALL_HINT = "pip install 'qeval[tracking]'"


class MlflowSpec(Strict):
    """One MLflow tracking destination: a run becomes a parent run there, one child per setup."""

    tracking_uri: str = Field(
        min_length=1,
        description="http(s)://host:port of a tracking server, a database "
        "URI (sqlite:///mlflow.db), or a local file store "
        "(file:///path/mlruns)",
    )
    experiment: str = Field(
        default="qeval",
        min_length=1,
        max_length=500,
        description="the MLflow experiment the runs are logged under; created when missing",
    )
    #: one HTTP request's limit: a server that accepts and never answers must not hold the run
    timeout_s: int = Field(default=30, gt=0, le=600)
    #: retries of one HTTP request (MLflow's own default, 7 with exponential backoff, waits for
    #: minutes on a server that is down; the run's files are complete either way)
    max_retries: int = Field(default=1, ge=0, le=10)

    @model_validator(mode="after")
    def _installed(self) -> MlflowSpec:
        # checked here, at validation, so `qeval validate` says it before hours of scoring;
        # find_spec imports nothing (MLflow's import costs seconds)
        if importlib.util.find_spec("mlflow") is None:
            raise ValueError(f"MLflow is not installed in this environment: {INSTALL_HINT}")
        return self


class TrackingSpec(Strict):
    """Experiment trackers a finished run is logged to (none by default). Weights & Biases is
    not offered: docs/tracking.md says why."""

    mlflow: MlflowSpec | None = None

    @property
    def enabled(self) -> bool:
        return self.mlflow is not None
