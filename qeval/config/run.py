"""The run configuration: typed, strict (`extra="forbid"`), validated before any model loads.

RunConfig composes the pieces each package owns: the budget (memory.capacity), the gates
(analysis.gates), the vLLM engine settings (backends.vllm.config), the quantize settings
(quantize.config), the executor (run.executors.config), the setups (setups) and the experiment
trackers (tracking)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from qeval.config.advise import AdviseSpec
from qeval.config.budget import Budget
from qeval.config.chat import CHAT_KEYS, ChatKeys
from qeval.config.engine import EngineSpec
from qeval.config.executor import ExecutorSpec
from qeval.config.gates import Gate
from qeval.config.generation import GenerationDivergenceSpec
from qeval.config.lm_eval import LmEvalSpec
from qeval.config.long_context import LongContextSpec
from qeval.config.performance import PerfSpec, RecommendBy, ServingSpec
from qeval.config.quantize import QuantizeSpec
from qeval.config.sequential import SequentialSpec
from qeval.config.server import ServerSpec
from qeval.config.setups import Setup
from qeval.config.tracking import TrackingSpec
from qeval.config.workload import WorkloadSpec
from qeval.errors import UserError
from qeval.files.names import NAME_PATTERN
from qeval.files.yaml import load_yaml
from qeval.strict import Seed, Strict

#: what `model.dtype` may ask for (ModelSpec.dtype)
ModelDtype = Literal["auto", "bfloat16-if-native", "bfloat16", "float16", "float32"]


#: model.dtype values a user writes for what the field does not take, and what it means instead
DTYPE_SLIPS = {
    **{
        short: f"{short!r} is a setup's `weights:` spelling; model.dtype takes {full}"
        for short, full in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"))
    },
    **{
        q: f"{q!r} is a quantization: give it as a setup's `weights: {q}`; model.dtype is the dtype the model "
        "computes in (auto, bfloat16-if-native, bfloat16, float16, float32)"
        for q in ("int8", "int4", "fp8")
    },
}


class ModelSpec(Strict):
    """Where the model comes from: a local directory or a hub id (resolved by transformers)."""

    path: str
    #: `auto`: the model's own 16-bit dtype where the device runs it natively, float32 elsewhere
    #: (a CPU without avx512_bf16 / AMX emulates bfloat16 ~100x slower: qeval/backends/device.py).
    #: `bfloat16-if-native`: bfloat16 where the device runs it natively, float32 elsewhere, whatever the
    #: model's own dtype (a float32 folder such as the dequantized SmolLM2 served as its bf16 original).
    #: Resolved at preflight beside the config, which keeps what was asked (records/preflight.py
    #: `Precision`); results.json records both (`run.dtype_requested`, `run.dtype`)
    dtype: ModelDtype = "auto"
    max_context: int = Field(default=2048, gt=0)
    trust_remote_code: bool = False
    revision: str | None = None

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_hint(cls, value: object) -> object:
        # setups spell their weights bf16 / fp16 / fp32 (and int8, int4, fp8): the likeliest slips here
        if isinstance(value, str) and value in DTYPE_SLIPS:
            raise ValueError(DTYPE_SLIPS[value])
        return value


class RunConfig(ChatKeys):
    """One qeval run: a model, the setups to serve it under, and the tasks to score. Its chat keys
    (`chat_template`, `system_prompt`, `fewshot_as_multiturn`: qeval/config/chat.py) apply to
    every task; an lm-eval task's own override them."""

    name: str = Field(pattern=NAME_PATTERN)
    model: ModelSpec
    #: a backend of the registry (qeval/backends/__init__.py), checked there: one line if unknown
    backend: str = Field(default="hf", pattern=NAME_PATTERN)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    setups: list[Setup] = Field(min_length=1)
    #: qeval's own tasks (YAMLs in tasks_dir)
    tasks: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = []
    tasks_dir: str = "tasks"
    #: lm-evaluation-harness tasks, groups and suites (docs/tasks.md, "Standard benchmarks")
    lm_eval: LmEvalSpec | None = None
    #: long-context tasks generated at a list of lengths (docs/tasks.md, "Long-context tasks")
    long_context: LongContextSpec | None = None
    #: teacher-force the baseline's generations through each setup: divergence by generated position
    #: and accuracy by answer length (docs/tasks.md, "Divergence along the generation"); off unless set
    generation_divergence: GenerationDivergenceSpec | None = None
    #: the config pieces of task kinds registered from outside qeval (qeval/tasks/kinds.py):
    #: kind name -> its piece, validated at preflight against the kind's own spec
    kinds: dict[str, dict[str, Any]] = {}
    limit: int | None = Field(default=None, gt=0)
    #: sequences per forward pass when scoring (padding changes numerics: part of the resume key)
    batch_size: int = Field(default=32, gt=0)
    #: sequences decoded together by the hf backend (default 4 x batch_size): a decode step
    #: reads every weight once whatever the rows, so wider steps are nearly free
    generation_batch_size: int | None = Field(default=None, gt=0)
    seed: Seed = 1234
    budget: Budget = Budget()
    engine: EngineSpec = EngineSpec()
    #: the OpenAI-compatible server of the `openai` backend (qeval/config/server.py)
    server: ServerSpec | None = None
    quantize: QuantizeSpec = QuantizeSpec()
    executor: ExecutorSpec = ExecutorSpec()
    gates: list[Gate] = []
    #: the setup a release pipeline intends to ship; `run --fail-on-gate` checks it
    candidate: str | None = None
    #: the performance phase's workload (qeval/perf, docs/performance.md). Off unless the config
    #: has a `performance:` block (then `enabled` defaults to true): timing every setup costs
    #: minutes on a CPU, and a quality-only run should not pay for it unasked
    performance: PerfSpec = PerfSpec(enabled=False)
    #: what the recommendation optimises among setups passing every gate and fitting the budget
    recommend_by: RecommendBy = "concurrency"
    #: experiment trackers the finished run is logged to (docs/tracking.md); changes no number
    tracking: TrackingSpec = TrackingSpec()
    #: the mixed-precision advisor run first, its advised setup added to the run (docs/advisor.md,
    #: "In a run"); checked against the setups and the model at preflight (qeval/run/advice.py)
    advise: AdviseSpec | None = None
    #: the traffic the deployment will serve and its SLOs (docs/performance.md, "The workload and the
    #: plan"): read by `qeval plan --workload`; it changes no number a run computes today
    workload: WorkloadSpec | None = None
    #: gates decided sequentially, scoring stopped when the verdict is known (qeval/config/sequential.py)
    sequential: SequentialSpec | None = None
    #: how `qeval goodput` loads and tunes each setup on the workload (qeval/perf/serving.py)
    serving: ServingSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        names = [s.name for s in self.setups]
        problem = folder_names_problem(names, "setup")
        if problem:
            raise ValueError(problem)
        # a backend-specific block the backend would ignore: qeval/backends/__init__.py check_blocks
        baselines = [s.name for s in self.setups if s.baseline]
        if len(baselines) > 1:
            raise ValueError(f"more than one baseline setup: {', '.join(baselines)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError("a task is listed twice")
        lm_eval = [t.name for t in self.lm_eval.entries()] if self.lm_eval else []
        if not self.tasks and not lm_eval and not self.long_context and not self.kinds:
            raise ValueError("no task to score: give `tasks` (qeval's own) or `lm_eval.tasks` / `lm_eval.suites`")
        if set(self.tasks) & set(lm_eval):
            both = sorted(set(self.tasks) & set(lm_eval))[0]
            raise ValueError(f"task {both!r} is both a qeval task and an lm-eval one")
        if self.candidate is not None and self.candidate not in names:
            raise ValueError(f"candidate {self.candidate!r} is not a setup of this config")
        for gate in self.gates:  # lm-eval group members are known only once loaded: checked at preflight
            if (
                gate.task != "all"
                and gate.task not in self.tasks
                and not self.lm_eval
                and not self.long_context
                and not self.kinds
            ):
                raise ValueError(f"gate names task {gate.task!r}, which the run does not score")
        perf = self.performance
        if perf.enabled and perf.input_len + perf.output_len > self.model.max_context:
            raise ValueError(
                f"performance: input_len {perf.input_len} + output_len {perf.output_len} exceeds "
                f"model.max_context {self.model.max_context}"
            )
        if perf.enabled and perf.from_workload and self.workload is None:
            raise ValueError("performance.from_workload needs a workload: block (its request lengths)")
        if self.serving is not None and (self.workload is None or self.workload.slo is None):
            raise ValueError("serving: needs a workload: block with an slo: (the traffic and the targets)")
        if self.recommend_by == "goodput":
            if self.workload is None or self.workload.slo is None or self.serving is None:
                raise ValueError(
                    "recommend_by goodput needs a workload: block with an slo: and a serving: block "
                    "(the load levels and the engine settings to tune)"
                )
            # whether the backend serves it is its registry entry's to say (run/preflight.py)
        elif self.recommend_by != "concurrency" and not perf.enabled:
            raise ValueError(f"recommend_by {self.recommend_by} needs the performance phase (performance.enabled)")
        return self

    @model_validator(mode="after")
    def _check_controls(self) -> RunConfig:
        problem = _controls_problem(self.setups, self.baseline, self.candidate, self.backend, self.sequential_on)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def sequential_on(self) -> bool:
        """Whether gates are decided sequentially (a `sequential:` block with enabled: true)."""
        return self.sequential is not None and self.sequential.enabled

    @property
    def baseline(self) -> Setup:
        """The setup the others are compared with: the one marked, else the first."""
        return next((s for s in self.setups if s.baseline), self.setups[0])

    def for_engine(self, dtype: str) -> RunConfig:
        """A copy whose model.dtype is `dtype`, the concrete one resolved for the device
        (records/preflight.py `Precision`): what a backend is built from, since backends read the
        dtype off their config. `self` keeps what the user asked for."""
        return self.model_copy(update={"model": self.model.model_copy(update={"dtype": dtype})})

    def for_setup(self, setup: Setup) -> RunConfig:
        """The config `setup`'s engine is built from: the run's, with an A/A control's serving
        conditions in place of the run's (`Setup.control`: the batch size, vLLM's max_num_seqs, the
        server's concurrency). Any other setup gets `self`."""
        if setup.control is None:
            return self
        c = setup.control
        update: dict[str, Any] = {}
        if c.batch_size is not None:
            update["batch_size"] = c.batch_size
            if self.generation_batch_size is not None:  # the run's ratio kept: both batches change
                update["generation_batch_size"] = max(1, self.generation_batch_size * c.batch_size // self.batch_size)
        engine = {k: v for k, v in c.conditions().items() if k in ("max_num_seqs", "max_num_batched_tokens")}
        if engine:
            update["engine"] = self.engine.model_copy(update=engine)
        if c.concurrency is not None:
            update["server"] = (self.server or ServerSpec()).model_copy(update={"concurrency": c.concurrency})
        if c.backend is not None:
            update["backend"] = c.backend
        return self.model_copy(update=update)

    def paired_with(self, setup: Setup) -> str:
        """The setup `setup` is compared with: a parity control's `of`, else the baseline."""
        return setup.control.of if setup.control is not None and setup.control.of else self.baseline.name

    @property
    def kl_partners(self) -> set[str]:
        """The setups other than the baseline a parity control takes its KL against: they keep
        their top-k (qeval/run/worker.py), as the baseline does."""
        return {s.control.of for s in self.setups if s.control is not None and s.control.of}

    def keeps_topk(self, name: str) -> bool:
        """Whether setup `name` keeps its top-k: the baseline's is every setup's KL reference, and a
        parity control of another setup takes its KL against that setup's (qeval/run/jobs.py)."""
        return name == self.baseline.name or name in self.kl_partners

    def backend_of(self, setup: Setup) -> str:
        """The backend `setup` is served on: the run's, or an engine-parity control's own."""
        return setup.control.backend if setup.control is not None and setup.control.backend else self.backend

    def as_json(self) -> dict[str, Any]:
        """The config as results.json and the config hash hold it: `kinds` left out while empty,
        and the chat keys, `advise`, `server`, `workload` and `generation_divergence` while unset
        (`sequential` while off), so a config that uses none of them reads and hashes as before
        those keys existed, and
        `tracking` always (it changes no number, and its URI may carry credentials)."""
        unset = (
            ({"kinds"} if not self.kinds else set())
            | ({"advise"} if self.advise is None else set())
            | ({"server"} if self.server is None else set())
            | ({"workload"} if self.workload is None else set())
            | ({"serving"} if self.serving is None else set())
            | ({"generation_divergence"} if self.generation_divergence is None else set())
            | ({"sequential"} if not self.sequential_on else set())
        )
        out = self.model_dump(mode="json", exclude={"tracking"} | unset)
        for gate in out.get("gates") or []:  # a gate's turn and position likewise (multi_turn, generation_divergence)
            for key in ("turn", "position"):
                if gate.get(key, 0) is None:
                    del gate[key]
        # the chat keys likewise while unset, at the top and in each lm-eval task
        for piece in [out, *((out.get("lm_eval") or {}).get("tasks") or [])]:
            for key in CHAT_KEYS:
                if piece.get(key, 0) is None:
                    del piece[key]
        # options added later, at their defaults: a config that uses neither reads and hashes as before
        if out["performance"].get("from_workload") is False:
            del out["performance"]["from_workload"]
        if out["engine"].get("batch_invariant") is False:
            del out["engine"]["batch_invariant"]
        if out["engine"].get("max_num_batched_tokens", 0) is None:
            del out["engine"]["max_num_batched_tokens"]
        if (out.get("serving") or {}).get("arrivals") == "poisson":
            del out["serving"]["arrivals"]
        for setup in out["setups"]:  # per-layer KV precision, and the KV advisor's target, likewise
            if not setup.get("kv_keep", 1):
                del setup["kv_keep"]
        if (out.get("advise") or {}).get("kl_target", 0) is None:
            del out["advise"]["kl_target"]
        return out

    def job_json(self) -> dict[str, Any]:
        """The config as a worker's job file holds it: all of it but `tracking`, which only the
        driver uses, after the run (its URI may carry credentials)."""
        return self.model_dump(mode="json", exclude={"tracking"})

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode()).hexdigest()


def _controls_problem(
    setups: list[Setup], baseline: Setup, candidate: str | None, backend: str, sequential: bool
) -> str:
    """Why the config's A/A controls (`Setup.control`) cannot stand, else '': a control serves the
    model of the setup it is paired with (the baseline, or a parity control's `of`; else its flips
    would be the quantization's, not the engine's) and is no candidate for release."""
    by_name = {s.name: s for s in setups}
    for s in setups:
        if s.control is None:
            continue
        partner = by_name.get(s.control.of or baseline.name)
        if partner is None or partner.control is not None or partner is s:
            return f"setup {s.name}: control of {s.control.of} names no setup of this config other than a control"
        if not s.serves_as(partner):
            return (
                f"setup {s.name}: a control serves {partner.name}'s weights and KV cache under other conditions; "
                f"it differs from {'baseline ' if partner is baseline else ''}{partner.name} in its quantization"
            )
        if s.name == candidate:
            return f"candidate {s.name} is a control (a setup served again), not a setup to ship"
        if s.control.backend == backend:
            return f"setup {s.name}: control backend {backend} is the run's own; parity compares another engine"
        if sequential and partner is not baseline:
            return (
                f"setup {s.name}: a parity control of {partner.name} is paired with it, and a sequential run tests "
                "every cell against the baseline: pair it in a run without sequential:"
            )
    return ""


def folder_names_problem(names: list[str], what: str) -> str:
    """Why `names` (each names a folder: setups, sweep models) cannot all be used, else ''."""
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        return f"duplicate {what} names: {', '.join(dupes)}"
    folded = case_collisions(names)
    if folded:
        return (
            f"{what} names {folded} differ only in case: their folders would be one on a case-insensitive "
            "file system (macOS, Windows)"
        )
    return ""


def case_collisions(names: list[str]) -> str:
    """'A and a' for the first names that differ only in case (each names a folder), else ''."""
    first: dict[str, str] = {}
    for name in dict.fromkeys(names):
        if name.casefold() in first:
            return f"{first[name.casefold()]} and {name}"
        first[name.casefold()] = name
    return ""


def first_error(exc: ValidationError) -> str:
    """The first validation error as `where: what`, in words a user can act on."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "string_pattern_mismatch":
        shown = str(err.get("input"))
        msg = (
            f"{shown[:40] + '…' if len(shown) > 40 else shown!r} is not allowed as a name: use letters, digits, "
            "'.', '_' and '-', starting with a letter or digit, at most 100 characters"
        )
    return f"{where}: {msg}" if where else msg


def load_config(path: Path) -> RunConfig:
    """Read and validate a run config. Paths inside it are resolved against the config's folder
    first, then the working directory (so `make run` and a user's own folder both work)."""
    raw = load_yaml(path)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping at the top level")
    if "models" in raw:
        raise UserError(
            f"{path}: lists several models (a sweep): `qeval run` and `qeval validate` take it; "
            "this command takes a config of one model"
        )
    return config_from_dict(raw, path)


def config_from_dict(
    raw: dict[str, object], path: Path, where: str = "", own: frozenset[str] | None = None
) -> RunConfig:
    """A RunConfig from a config file's mapping. `where` prefixes errors (a sweep's model), those
    in the keys `own` names where given: a sweep's shared keys are written once, at the top."""
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        prefix = where if own is None or not loc or loc[0] in own else ""
        raise UserError(f"{path}: {prefix}{first_error(exc)}") from None
    cfg.model.path = _resolve(cfg.model.path, path.parent, must_exist=False)
    first = cfg.model.path.split("/", 1)[0]
    if (
        not Path(cfg.model.path).exists()
        and "/" in cfg.model.path
        and first
        and any((b / first).is_dir() for b in (Path.cwd(), path.parent, path.parent.parent))
    ):
        # `models/qeval-tinyy`: a typo of a local path, not a hub id (org/name) to try online
        raise UserError(f"{path}: model path {cfg.model.path} not found (a folder {first}/ exists, but not this one)")
    # only qeval's own tasks are read from tasks_dir: a config of lm-eval or long-context tasks needs none
    cfg.tasks_dir = _resolve(cfg.tasks_dir, path.parent, must_exist=bool(cfg.tasks), key="tasks_dir")
    if cfg.advise and cfg.advise.text:  # a file: its existence is checked at preflight, in one line
        cfg.advise.text = _resolve(cfg.advise.text, path.parent, must_exist=False)
    if cfg.workload and cfg.workload.trace:  # a file, read by `qeval plan --workload`: here only found
        cfg.workload.trace = _resolve(cfg.workload.trace, path.parent, must_exist=False)
        if not Path(cfg.workload.trace).is_file():
            raise UserError(f"{path}: workload.trace {cfg.workload.trace}: file not found")
    cal = cfg.quantize.calibration
    if cal.path:
        cal.path = _resolve(cal.path, path.parent, must_exist=False)
    if cfg.lm_eval:
        cfg.lm_eval.include_path = [
            _resolve(p, path.parent, must_exist=True, key="lm_eval.include_path") for p in cfg.lm_eval.include_path
        ]
        cfg.lm_eval.data_dirs = [
            _resolve(p, path.parent, must_exist=True, key="lm_eval.data_dirs") for p in cfg.lm_eval.data_dirs
        ]
        for t in cfg.lm_eval.tasks:
            if t.dataset_path:  # a local dataset folder, else a hub id left as it is
                t.dataset_path = _resolve(t.dataset_path, path.parent, must_exist=False)
    return cfg


def _resolve(value: str, base: Path, must_exist: bool, key: str = "") -> str:
    for candidate in (Path(value), base / value, base.parent / value):
        if candidate.exists():
            return str(candidate.resolve())
    if must_exist:
        raise UserError(f"{key + ' ' if key else ''}{value}: directory not found")
    return value  # not a local path: a hub id, checked by the backend's validation
