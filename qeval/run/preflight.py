"""Everything decided before any model loads: device, tasks (checksums verified), the model
(resolved and content-checksummed once, here), its shape, and the setups validated against
the backend. Cheap: a typo costs a second."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from qeval.backends import backend_entry
from qeval.backends.device import (
    SIXTEEN_BIT,
    Precision,
    emulated_warning,
    native_16bit,
    resolve_device,
    resolve_precision,
)
from qeval.config import RunConfig
from qeval.errors import UserError
from qeval.memory.ledger import ModelShape
from qeval.quantize.checkpoints import resolve_checkpoints
from qeval.run.model_source import ModelSource, is_gguf, resolve_model
from qeval.setups import Setup
from qeval.tasks import TaskInfoLike, load_task
from qeval.tasks.harness.config import HarnessSpec
from qeval.tasks.harness.session import open_session
from qeval.tasks.longctx.hooks import add_to_preflight as add_long_context


@dataclass
class Preflight:
    """A run checked before any model loads: what `preflight` resolved and validated."""

    cfg: RunConfig
    device: str
    tasks: list[TaskInfoLike]  # every task of the config (lm-eval groups expanded): results cover them all
    setups: list[Setup]  # the ones this invocation runs (the baseline always)
    run_tasks: list[str]  # the ones this invocation scores (--tasks)
    model_sha256: str
    shape: ModelShape | None
    #: optional setups this backend/device cannot run: name -> why (reported, not run)
    skipped: dict[str, str] = field(default_factory=dict)
    #: lm-eval groups of the config -> their tasks; suites -> their entries
    groups: dict[str, list[str]] = field(default_factory=dict)
    suites: dict[str, list[str]] = field(default_factory=dict)
    #: model.dtype as asked and as resolved on this device (cfg.model.dtype holds the resolved one)
    precision: Precision | None = None
    #: the local model folder whose every file the checksum covers (None: a hub id or a GGUF file)
    model_dir: Path | None = None

    @property
    def entries(self) -> list[str]:
        """The config's own tasks, groups unexpanded: what gates on `all` and the evidence rule cover."""
        return list(dict.fromkeys(t.entry for t in self.tasks))


def model_shape(source: ModelSource) -> ModelShape:
    """The model's shape from its config, or one line naming the field qeval cannot use."""
    try:
        return ModelShape.from_config(source.config)
    except ValueError as exc:
        where = source.path if is_gguf(source.path) else source.local_dir / "config.json"
        raise UserError(f"{where}: not a decoder config qeval understands "
                        f"(it {exc})") from None


def preflight(cfg: RunConfig, only_setups: list[str] | None = None, only_tasks: list[str] | None = None) -> Preflight:
    """Validate the whole run (`qeval validate`, and the first step of `qeval run`); raise
    UserError with one line at the first problem."""
    device = resolve_device(cfg.device, on_cluster=cfg.executor.kind == "ray")
    setups = cfg.setups
    if only_setups:
        unknown = [s for s in only_setups if s not in {x.name for x in cfg.setups}]
        if unknown:
            raise UserError(f"--setups: unknown setup {unknown[0]!r}")
        setups = [s for s in cfg.setups if s.name in only_setups or s.name == cfg.baseline.name]
    skipped: dict[str, str] = {}
    for setup in setups:
        try:
            backend_entry(cfg.backend).validate_setup(setup, device)
        except UserError as exc:
            if not setup.optional or setup.baseline:
                raise
            skipped[setup.name] = str(exc)
            print(f"qeval: optional setup {setup.name} skipped: {exc}", file=sys.stderr)
    setups = [s for s in setups if s.name not in skipped]
    source = resolve_model(cfg.model.path, cfg.model.revision)
    shape = model_shape(source)
    precision = _resolve_dtype(cfg, source.config, device)
    setups = _against_model(cfg, setups, source.config, skipped)
    # vllm setups served from `qeval quantize` checkpoints: point them at their folders
    cfg = resolve_checkpoints(cfg, source.checksum, {s.name for s in setups})
    setups = [s for s in cfg.setups if s.name in {x.name for x in setups}]
    backend_entry(cfg.backend).check_install(cfg)
    native = [load_task(n, Path(cfg.tasks_dir), cfg.limit) for n in cfg.tasks]
    for t in native:
        _check_generation_room(cfg, t.name, t.output_type, t.spec.generation_kwargs.max_gen_toks)
    pre = Preflight(cfg, device, list(native), setups, [], source.checksum, shape, skipped, precision=precision,
                    model_dir=source.local_dir if Path(source.path).is_dir() else None)
    if cfg.lm_eval:
        _add_harness(pre, cfg.lm_eval)
    add_long_context(pre, source.config)  # generated tasks; gates written at a length resolved
    pre.run_tasks = _selected(pre, only_tasks)
    _check_gates(pre)
    return pre


def _against_model(cfg: RunConfig, setups: list[Setup], config: dict[str, object],
                   skipped: dict[str, str]) -> list[Setup]:
    """Setups checked against the model's own config.json (a quantized KV cache on a sliding-window
    model): refused in one line, or skipped and said so where the setup is optional."""
    entry = backend_entry(cfg.backend)
    kept = []
    for setup in setups:
        try:
            entry.validate_model(setup, config)
        except UserError as exc:
            if not setup.optional or setup.baseline:
                raise
            skipped[setup.name] = str(exc)
            print(f"qeval: optional setup {setup.name} skipped: {exc}", file=sys.stderr)
            continue
        kept.append(setup)
    return kept


def _resolve_dtype(cfg: RunConfig, config: dict[str, object], device: str) -> Precision:
    """Resolve `model.dtype: auto` for this device, in place: workers, resume keys, the memory
    prediction and the ceilings probe all see the dtype the setups really run in. An explicit
    16-bit dtype this device only emulates is kept, with one warning line (it costs ~100x)."""
    precision = resolve_precision(cfg.model.dtype, config, device)
    cfg.model.dtype = precision.dtype  # type: ignore[assignment]  # one of the three concrete dtypes
    if precision.emulated:
        print(f"qeval: warning: {precision.reason}", file=sys.stderr)
    for setup in cfg.setups:
        explicit = {"bf16": "bfloat16", "fp16": "float16"}.get(setup.weights or "")
        if explicit and explicit in SIXTEEN_BIT and explicit not in native_16bit(device):
            print(f"qeval: warning: setup {setup.name}: weights {setup.weights}: {emulated_warning(explicit)}",
                  file=sys.stderr)
    return precision


def _add_harness(pre: Preflight, spec: HarnessSpec) -> None:
    """Load the lm-eval tasks once here (names, data, few-shot pools): a typo costs seconds."""
    session = open_session(spec, Path.cwd(), pre.cfg.limit)
    try:
        for name, info in session.infos.items():
            max_gen = (session.tasks[name].config.generation_kwargs or {}).get("max_gen_toks", 256)
            _check_generation_room(pre.cfg, name, info.output_type, int(max_gen))
            pre.tasks.append(info)
        pre.groups = session.groups
        pre.suites = spec.suite_members()
    finally:
        session.close()


def _selected(pre: Preflight, only: list[str] | None) -> list[str]:
    """The tasks this invocation scores: --tasks names tasks, lm-eval groups or their members."""
    if not only:
        return [t.name for t in pre.tasks]
    names = {t.name for t in pre.tasks}
    out: list[str] = []
    for n in only:
        if n in pre.groups:
            out += pre.groups[n]
        elif n in names:
            out.append(n)
        else:
            raise UserError(f"--tasks: task {n!r} is not in the config")
    return list(dict.fromkeys(out))


def _check_gates(pre: Preflight) -> None:
    known = {t.name for t in pre.tasks} | set(pre.groups) | set(pre.suites) | {"all"}
    for gate in pre.cfg.gates:
        if gate.task not in known:
            raise UserError(f"gate names task {gate.task!r}, which the run does not score")


def _check_generation_room(cfg: RunConfig, name: str, output_type: str, max_gen_toks: int) -> None:
    """A generation task must leave room for a prompt inside the model's context."""
    if output_type == "generate_until" and max_gen_toks >= cfg.model.max_context:
        raise UserError(f"task {name}: max_gen_toks {max_gen_toks} leaves no room for the prompt in "
                        f"model.max_context {cfg.model.max_context} (lm-eval tasks: set max_gen_toks in lm_eval.tasks)")
