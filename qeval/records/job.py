"""The two files between the runner and a worker process, typed and validated on read: the job
(RUN_DIR/jobs/<setup>.json, what the runner asks) and the outcome (RUN_DIR/setups/<setup>.json,
what the worker did). A file that does not validate is one line naming it, not a KeyError deep
in a worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_serializer, model_validator
from pydantic.dataclasses import dataclass

from qeval.config import RunConfig
from qeval.config.sequential import SequentialPlan
from qeval.errors import UserError
from qeval.model.shape import ModelShape
from qeval.results.echo import Quantization
from qeval.results.performance import Measured, PerfWorkload


def _as_text(value: Any) -> Any:
    """Key parts are text; an outcome written by an older qeval may hold a number or null there
    (its key then differs: the setup is dropped, saying which part changed, not misread)."""
    if isinstance(value, dict):
        return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
    return value


#: a resume key's parts (qeval/records/keys.py), as stored beside the key
KeyParts = Annotated[dict[str, str], BeforeValidator(_as_text)]


class _CarriesConfig(BaseModel):
    """A job file holds the run config as a worker validates it: all of it but `tracking`, which
    only the driver uses, after the run (its URI may carry credentials)."""

    model_config = ConfigDict(extra="forbid")

    #: the run config, model.dtype as the user asked (`auto` stays `auto`)
    config: RunConfig

    @field_serializer("config")
    def _without_tracking(self, cfg: RunConfig) -> dict[str, Any]:
        return cfg.job_json()


class PerformanceJob(BaseModel):
    """The performance phase a job asks for (its figures are not stored under this key yet)."""

    model_config = ConfigDict(extra="forbid")

    key: str
    #: the model's shape: the budget's concurrency
    shape: ModelShape | None = None


class Job(_CarriesConfig):
    """One setup's job: what `python -m qeval.run.worker JOB.json` serves and scores."""

    #: model.dtype resolved on the device at preflight (records/preflight.py `Precision`): what
    #: the worker computes in
    dtype: str
    setup: str
    device: str
    #: the run directory the worker writes into
    run_dir: str
    #: the pending tasks: task -> the resume key its result is stored under
    tasks: dict[str, str]
    #: task -> the parts of that key (the `task` part is the data fingerprint)
    task_key_parts: dict[str, dict[str, str]]
    #: task -> its kind (qeval/tasks/kinds.py): which kind's scoring serves it
    task_kinds: dict[str, str] = {}
    #: task (one of results.metrics.KL_OUTPUT_TYPES) -> (setup, task) of the baseline's stored top-k: the KL reference
    reference: dict[str, tuple[str, str]] = {}
    baseline: str
    #: the setup's resume key and its parts
    key: str
    key_parts: KeyParts
    performance: PerformanceJob | None = None
    #: a sequential run's plan (qeval/analysis/sequential_run.py), None while the switch is off
    sequential: SequentialPlan | None = None


@dataclass
class MemoryFigure:
    """A measured number and where it came from: what a backend's memory() returns, stored as is
    in the outcome and read back by qeval/memory/figures.py (a pydantic dataclass: built
    positionally by the backends, validated when an outcome is read)."""

    measured: int | float | None
    source: str
    #: the CUDA allocator's reserved peak, beside an allocated `peak_bytes`
    reserved_peak: int | None = None
    #: the sequence length a per-sequence figure or an engine's concurrency is for
    context: int | None = None
    #: the engine log line (or /metrics sample) the figure was read from
    line: str | None = None
    #: the log lines a derived figure was computed from
    lines: list[str] | None = None
    #: where an engine's KV pool was read, when not its own log (a server's /metrics)
    pool_source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _flatten_extra(cls, data: Any) -> Any:
        """An outcome written before these fields were typed kept them under `extra`."""
        if isinstance(data, dict) and isinstance(data.get("extra"), dict):
            data = {k: v for k, v in data.items() if k != "extra"} | data["extra"]
        return data


class StoredLevel(BaseModel):
    """One concurrency level of the performance phase, as the worker stores it."""

    model_config = ConfigDict(extra="allow")

    concurrency: int
    requests: int
    #: figure name (qeval/perf/phase.py FIGURES) -> its repeats summarised
    figures: dict[str, Measured]


class PhaseRecord(BaseModel):
    """The performance phase's figures as the worker stores them (qeval/perf/phase.py), keyed to
    their own key; turned into results.json's `performance` block at assembly (qeval/perf/block.py)."""

    # extra="allow": as Outcome's
    model_config = ConfigDict(extra="allow")

    key: str
    status: Literal["ok", "failed"] = "failed"
    error: str | None = None
    traceback: str | None = None
    workload: PerfWorkload | None = None
    levels: list[StoredLevel] = []
    notes: list[str] = []
    #: the setup's memory.max_concurrency the `max` level came from
    budget_concurrency: float | None = None
    seconds: float | None = None


class Outcome(BaseModel):
    """What one worker did for its setup; failures included (`status`, `error`)."""

    # extra="allow": an outcome written by another qeval version still reads (its key then
    # differs, and the setup is listed as dropped, not misread)
    model_config = ConfigDict(extra="allow")

    name: str
    status: Literal["ok", "failed"] = "failed"
    error: str | None = None
    traceback: str | None = None
    #: seconds: load_s, <task>_s, performance_s, total_s
    timings: dict[str, float] = {}
    key: str | None = None
    key_parts: KeyParts | None = None
    #: the backend's memory figures by name (weights_bytes, kv_bytes_per_token, peak_bytes, ...)
    memory: dict[str, MemoryFigure] = {}
    #: the performance phase's figures (qeval/perf/phase.py), keyed to their own key
    performance: PhaseRecord | None = None
    #: what the quantizer or engine did (the backend's quant_info), as results.json's setup block holds it
    quantization: Quantization = Field(default_factory=Quantization)
    library_versions: dict[str, str] = Field(default_factory=dict)


class AdviseJob(_CarriesConfig):
    """The advisor's job (RUN_DIR/jobs/_advise.json): what `python -m qeval.run.advice JOB.json` runs."""

    #: model.dtype resolved at preflight: what the advisor computes in
    dtype: str
    run_dir: str
    #: the advice's resume key and its parts (qeval/run/advice.py)
    key: str
    key_parts: KeyParts
    #: where the process writes an AdviseOutcome when it fails
    outcome: str


class AdviseOutcome(BaseModel):
    """Why the advisor's process failed: bad input only the loaded model shows, or another error."""

    user_error: str | None = None
    error: str | None = None


def read_job(path: Path) -> Job:
    """A job file, validated; one UserError naming the file otherwise."""
    try:
        return Job.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a qeval job file ({_why(exc)})") from None


def outcome_of(raw: Any, where: Path) -> Outcome | None:
    """A stored outcome, validated; None (with one line on stderr) when it is not one: the
    setup is then rerun, as for a missing or corrupt file."""
    try:
        return Outcome.model_validate(raw)
    except ValidationError as exc:
        import sys

        print(f"qeval: {where}: not a qeval outcome ({_why(exc)}); setup will be rerun", file=sys.stderr)
        return None


def _why(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
