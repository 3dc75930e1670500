"""RUN_DIR/sweep.json: what a sweep of several models decided, model by model, and how the
models' baselines compare. Each model's own results are an ordinary run directory,
RUN_DIR/models/<model>/ (results.json: qeval.results.schema)."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import Field, ValidationError

from qeval.errors import UserError
from qeval.files.names import inside
from qeval.results.base import ResultModel
from qeval.results.schema import Comparison, MetricValue

SWEEP_VERSION = 1


class SweepModelEntry(ResultModel):
    """One model of the sweep: where its run lives and what it decided."""

    name: str
    path: str = Field(description="the model's folder or hub id")
    run_dir: str = Field(description="its run directory, relative to the sweep's: models/<name>")
    model_sha256: str
    baseline: str | None = Field(description="its baseline setup")
    baseline_status: Literal["ok", "failed", "missing"]
    baseline_scores: dict[str, MetricValue | None] = Field(
        description="task -> the baseline's score on the task's compared metric (null: not scored)"
    )
    recommendation: str | None = Field(description="the setup recommended for this model; null: none")
    blocked: str | None = Field(None, description="why no setup of this model could be judged")
    failed_setups: list[str] = []


class SweepResults(ResultModel):
    """RUN_DIR/sweep.json."""

    sweep_version: Literal[1]
    name: str
    started: str | None = None
    finished: str | None = None
    executor: str = Field(description="local or ray")
    reference_model: str = Field(description="the model the others' baselines are compared with (the first)")
    tasks: dict[str, str] = Field(description="task -> the metric models and setups are compared on")
    models: list[SweepModelEntry]
    baselines_vs_reference: dict[str, dict[str, Comparison]] = Field(
        {},
        description="model -> task -> its baseline against the reference model's baseline, paired by document "
        "(delta: this model minus the reference); only tasks scored on the same data",
    )


def read_sweep(path: Path) -> SweepResults:
    """RUN_DIR/sweep.json, typed; a missing or corrupt file is one UserError."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: corrupt JSON ({getattr(exc, 'msg', exc)})") from None
    try:
        return SweepResults.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"{path}: not a qeval sweep file ({'.'.join(map(str, err['loc']))}: {err['msg']})") from None


def model_run_dir(root: Path, model: SweepModelEntry) -> Path:
    """A model's run directory, checked to stay inside the sweep's (sweep.json is a file)."""
    return inside(root, *PurePosixPath(model.run_dir).parts)
