"""Everything decided before any model loads: device, tasks (checksums verified), the model
(resolved and content-checksummed once, here), its shape, and the setups validated against
the backend. Cheap: a typo costs a second."""

from __future__ import annotations

import sys
from pathlib import Path

from qeval.analysis.sequential_run import check as check_sequential
from qeval.backends import backend_entry, check_blocks, check_control, serving_engine
from qeval.backends.device import (
    SIXTEEN_BIT,
    Precision,
    emulated_warning,
    native_16bit,
    resolve_device,
    resolve_precision,
)
from qeval.config import RunConfig
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.ledger import ModelShape
from qeval.model.checkpoint import check_identity, checkpoint_config
from qeval.model.source import ModelSource, is_gguf, resolve_model
from qeval.quantize.checkpoints import resolve_checkpoints
from qeval.records.preflight import Preflight
from qeval.run.advice import advised_names, check_advice
from qeval.tasks.kinds import check_plugin_pieces, task_kinds


def model_shape(source: ModelSource) -> ModelShape:
    """The model's shape from its config, or one line naming the field qeval cannot use."""
    try:
        return ModelShape.from_config(source.config)
    except ValueError as exc:
        where = source.path if is_gguf(source.path) else source.local_dir / "config.json"
        raise UserError(f"{where}: not a decoder config qeval understands (it {exc})") from None


#: why a config that ranks by goodput cannot be served (the backend's registry entry decides)
GOODPUT_BACKEND = (
    "recommend_by goodput serves each setup with `vllm serve`: backend vllm, or openai with server.mode "
    "launch and no command (the hf backend has no server to load)"
)


def preflight(cfg: RunConfig, only_setups: list[str] | None = None, only_tasks: list[str] | None = None) -> Preflight:
    """Validate the whole run (`qeval validate`, and the first step of `qeval run`); raise
    UserError with one line at the first problem."""
    device = resolve_device(cfg.device, on_cluster=cfg.executor.kind == "ray")
    check_blocks(cfg)
    if cfg.recommend_by == "goodput" and serving_engine(cfg) is None:
        raise UserError(GOODPUT_BACKEND)
    setups, skipped = _usable_setups(cfg, only_setups, device)
    source = resolve_model(cfg.model.path, cfg.model.revision)
    shape = model_shape(source)
    precision = _resolve_dtype(cfg, source.config, device)
    setups = _against_model(cfg, setups, source.config, shape, skipped, device)
    # vllm setups served from `qeval quantize` checkpoints: point them at their folders
    # (and a selected parity control's partner: the config checks the two serve one checkpoint)
    partners = {s.control.of for s in setups if s.control is not None and s.control.of}
    cfg = resolve_checkpoints(cfg, source.checksum, {s.name for s in setups} | partners, precision.dtype)
    setups = [s for s in cfg.setups if s.name in {x.name for x in setups}]
    _check_checkpoints(setups, source.config)
    for setup in {cfg.backend_of(s): s for s in setups}.values():  # each engine the setups are served on
        backend_entry(cfg.backend_of(setup)).check_install(cfg.for_setup(setup))
    check_plugin_pieces(cfg)
    pre = Preflight(
        cfg,
        device,
        [],
        setups,
        [],
        source.checksum,
        shape,
        precision,
        skipped,
        model_dir=source.local_dir if Path(source.path).is_dir() else None,
        backend_key_parts=backend_entry(cfg.backend).key_parts(cfg),
        # every parity control of the config, run now or not: assembly checks the stored ones' keys too
        parity_key_parts={
            s.name: {"backend": cfg.backend_of(s)} | backend_entry(cfg.backend_of(s)).key_parts(cfg.for_setup(s))
            for s in cfg.setups
            if s.parity
        },
        checkpoint_sha256={
            s.name: resolve_model(s.checkpoint, s.checkpoint_revision).checksum for s in setups if s.checkpoint
        },
    )
    for kind in task_kinds():  # each kind's tasks (lm-eval groups expanded, gates at a length resolved)
        kind.expand(pre, source.config)
    pre.run_tasks = _selected(pre, only_tasks)
    _check_gates(pre)
    for warning in check_sequential(pre):
        print(f"qeval: warning: {warning}", file=sys.stderr)
    check_advice(pre)
    backend_entry(cfg.backend).validate_tasks(pre)
    return pre


def _usable_setups(cfg: RunConfig, only_setups: list[str] | None, device: str) -> tuple[list[Setup], dict[str, str]]:
    """The setups the run takes (those of --setups and the baseline, where given) that the
    backend can serve on `device`, and the optional ones skipped (name -> why); UserError for an
    unknown name or a setup that is not optional and cannot be served."""
    setups = cfg.setups
    if only_setups:  # the advised setup (advise:) joins the run once the advisor named its keep list
        unknown = [s for s in only_setups if s not in {x.name for x in cfg.setups} | advised_names(cfg)]
        if unknown:
            raise UserError(f"--setups: unknown setup {unknown[0]!r}")
        setups = [s for s in cfg.setups if s.name in only_setups or s.name == cfg.baseline.name]
    skipped: dict[str, str] = {}
    for setup in setups:
        try:
            entry = backend_entry(cfg.backend_of(setup))  # an engine-parity control's own backend
            check_control(entry, setup)
            entry.validate_setup(setup, device)
            entry.validate_served(cfg.for_setup(setup), setup, device)
        except UserError as exc:
            if not setup.optional or setup.baseline:
                raise
            skipped[setup.name] = str(exc)
            print(f"qeval: optional setup {setup.name} skipped: {exc}", file=sys.stderr)
    return [s for s in setups if s.name not in skipped], skipped


def _check_checkpoints(setups: list[Setup], config: dict[str, object]) -> None:
    """Each setup's checkpoint must be a checkpoint of the model (model/checkpoint.py): the
    same architecture, vocabulary and sizes; one line naming the first that differs."""
    for setup in setups:
        if setup.checkpoint:
            ref = setup.checkpoint
            check_identity(setup.name, ref, checkpoint_config(ref, setup.checkpoint_revision), dict(config))


def _against_model(
    cfg: RunConfig,
    setups: list[Setup],
    config: dict[str, object],
    shape: ModelShape,
    skipped: dict[str, str],
    device: str,
) -> list[Setup]:
    """Setups checked against the model's own config.json (a quantized KV cache on a sliding-window
    model, a `kv_keep` layer it lacks): refused in one line, or skipped and said so where the setup
    is optional."""
    kept = []
    for setup in setups:
        try:
            problem = setup.kv_keep_problem(shape.kinds())
            if problem:
                raise UserError(problem)
            backend_entry(cfg.backend_of(setup)).validate_model(setup, config, device)
        except UserError as exc:
            if not setup.optional or setup.baseline:
                raise
            skipped[setup.name] = str(exc)
            print(f"qeval: optional setup {setup.name} skipped: {exc}", file=sys.stderr)
            continue
        kept.append(setup)
    return kept


def _resolve_dtype(cfg: RunConfig, config: dict[str, object], device: str) -> Precision:
    """Resolve `model.dtype: auto` for this device, beside the config (which keeps what was
    asked): the Preflight record carries it, and workers (their job's `dtype`), resume keys, the
    memory prediction and the ceilings probe read the dtype the setups really run in from there.
    An explicit 16-bit dtype this device only emulates is kept, with one warning line (~100x)."""
    precision = resolve_precision(cfg.model.dtype, config, device)
    if precision.emulated:
        print(f"qeval: warning: {precision.reason}", file=sys.stderr)
    for setup in cfg.setups:
        explicit = {"bf16": "bfloat16", "fp16": "float16"}.get(setup.weights or "")
        if explicit and explicit in SIXTEEN_BIT and explicit not in native_16bit(device):
            print(
                f"qeval: warning: setup {setup.name}: weights {setup.weights}: {emulated_warning(explicit)}",
                file=sys.stderr,
            )
    return precision


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
