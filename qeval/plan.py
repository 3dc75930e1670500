"""Everything decided before any model loads: device, tasks (checksums verified), model
checksum and shape, setups validated against the backend. Cheap: a typo costs a second."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from qeval.backends import validate_backend, validate_setup
from qeval.checkpoints import resolve_checkpoints
from qeval.config import RunConfig
from qeval.errors import UserError
from qeval.memory import ModelShape
from qeval.setups import Setup
from qeval.tasks import Task, load_task

_HASH_FULL_LIMIT = 256 * 2**20  # files above this are keyed by size and mtime, not content


@dataclass
class RunPlan:
    cfg: RunConfig
    device: str
    tasks: list[Task]  # every task of the config: results cover them all
    setups: list[Setup]
    run_tasks: list[str]  # the ones this invocation scores (--tasks)
    model_sha256: str
    shape: ModelShape | None


def resolve_device(requested: str) -> str:
    """`auto` picks CUDA when an NVIDIA GPU is present (nvidia-smi on PATH, as the set-up does)."""
    has_gpu = shutil.which("nvidia-smi") is not None
    if requested == "cuda" and not has_gpu:
        raise UserError("device cuda requested, but no NVIDIA GPU is present on this machine (no nvidia-smi)")
    if requested == "auto":
        return "cuda" if has_gpu else "cpu"
    return requested


def model_checksum(path: str) -> str:
    """sha256 over the model folder's files (config, tokenizer, weights); for a hub id,
    over the id and revision, since the files are not local until the worker loads them."""
    root = Path(path)
    if not root.is_dir():
        return hashlib.sha256(f"hub:{path}".encode()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        h.update(str(f.relative_to(root)).encode())
        st = f.stat()
        if st.st_size <= _HASH_FULL_LIMIT:
            h.update(f.read_bytes())
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def model_shape(cfg: RunConfig) -> ModelShape | None:
    root = Path(cfg.model.path)
    if root.is_dir():
        if not (root / "config.json").is_file():
            raise UserError(f"model path {root} has no config.json")
        try:
            return ModelShape.from_config(json.loads((root / "config.json").read_text()))
        except (KeyError, json.JSONDecodeError) as exc:
            raise UserError(f"{root / 'config.json'}: not a decoder config qeval understands ({exc})") from None
    if "/" not in cfg.model.path or cfg.model.path.startswith((".", "/")):
        raise UserError(f"model path {cfg.model.path} not found (and it is not a hub id like org/name)")
    return None  # a hub id: the shape is read by the worker once transformers resolves it


def make_plan(cfg: RunConfig, only_setups: list[str] | None = None, only_tasks: list[str] | None = None) -> RunPlan:
    """Validate the whole run; raise UserError with one line at the first problem."""
    device = resolve_device(cfg.device)
    setups = cfg.setups
    if only_setups:
        unknown = [s for s in only_setups if s not in {x.name for x in cfg.setups}]
        if unknown:
            raise UserError(f"--setups: unknown setup {unknown[0]!r}")
        setups = [s for s in cfg.setups if s.name in only_setups or s.name == cfg.baseline.name]
    for setup in setups:
        validate_setup(cfg, setup, device)
    shape = model_shape(cfg)
    model_sha = model_checksum(cfg.model.path)
    # vllm setups served from `qeval quantize` checkpoints: point them at their folders
    cfg = resolve_checkpoints(cfg, model_sha, {s.name for s in setups})
    setups = [s for s in cfg.setups if s.name in {x.name for x in setups}]
    validate_backend(cfg)
    if only_tasks:
        unknown = [t for t in only_tasks if t not in cfg.tasks]
        if unknown:
            raise UserError(f"--tasks: task {unknown[0]!r} is not in the config")
    tasks = [load_task(n, Path(cfg.tasks_dir), cfg.limit) for n in cfg.tasks]
    return RunPlan(cfg, device, tasks, setups, only_tasks or list(cfg.tasks), model_sha, shape)
