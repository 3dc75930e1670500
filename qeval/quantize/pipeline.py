"""`qeval quantize`: make the quantized checkpoints a config's vllm setups serve.

    for each setup that serves a checkpoint (an llm-compressor method, no `checkpoint:`):
        skip it if its folder (keyed by model + recipe + calibration text) is complete
        else run llm-compressor in the quantize environment into a temporary folder,
             write the record of how it was made, and rename the folder into place

The rename is the commit: a folder under its final name is always complete, so an
interrupted quantize leaves nothing `qeval run` could mistake for a checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qeval.backends.device import resolve_device, resolve_precision
from qeval.backends.interpreter import has_module
from qeval.config import RunConfig
from qeval.config.quantize import Calibration
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_json
from qeval.files.processes import die_with_parent, pid_alive
from qeval.model.shape import ModelShape
from qeval.model.source import resolve_model
from qeval.quantize.checkpoints import (
    RECORD,
    SCHEMES,
    calibration_checksum,
    calibration_source,
    check_group_divides,
    check_keep_fused,
    checkpoint_dir,
    checkpoint_key,
    needs_checkpoint,
    read_calibration_texts,
    recipe_spec,
)
from qeval.records.provenance import git_commit, hardware, now_iso
from qeval.version import __version__

WORKER = Path(__file__).resolve().parent / "worker.py"
SCHEMA_VERSION = 1


class QuantizeFailed(Exception):
    """llm-compressor failed on a setup (exit code 1: the input was fine, the step was not)."""


@dataclass
class Made:
    setup: str
    scheme: str
    path: Path
    cached: bool
    seconds: float | None


def quant_python() -> str:
    """The interpreter with llm-compressor: QEVAL_QUANT_PYTHON, else .venv-quant beside qeval."""
    beside = Path(__file__).resolve().parents[2] / ".venv-quant" / "bin" / "python"
    python = os.environ.get("QEVAL_QUANT_PYTHON") or str(beside)
    if not has_module(python, "llmcompressor"):
        raise UserError(
            f"llm-compressor is not installed for {python} (`make quant` creates .venv-quant; "
            "or set QEVAL_QUANT_PYTHON to an interpreter that has it)"
        )
    return python


def quantize(
    cfg: RunConfig,
    *,
    only: list[str] | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> list[Made]:
    """Make (or find cached) every checkpoint `cfg` needs; returns where each one is."""
    from qeval.backends import check_blocks

    check_blocks(cfg)  # a config `qeval run` / `qeval goodput` would refuse: before minutes of quantizing
    todo = _todo(cfg, only)
    source = resolve_model(cfg.model.path, cfg.model.revision)  # one clear line for a bad model path, early
    # `dtype: auto` as the run will resolve it on this device (the checkpoint's key holds the dtype)
    dtype = resolve_precision(cfg.model.dtype, source.config, resolve_device(cfg.device)).dtype
    cal = calibration_source(cfg)
    cal_sha = calibration_checksum(cal)
    texts = read_calibration_texts(cal, cfg.quantize.num_samples) if cal.path else None
    model_sha = source.checksum
    made: list[Made] = []
    python: str | None = None
    linear = ModelShape.from_config(source.config).linear_modules()
    for setup in todo:  # every setup's layers checked before any of them is quantized
        check_keep_fused(setup, [n for n, _, _ in linear])
        check_group_divides(setup, linear)
    for setup in todo:
        dest = checkpoint_dir(cfg, setup, model_sha, cal_sha, dtype)
        scheme = SCHEMES[setup.method]
        if (dest / RECORD).is_file() and not force:
            log(f"{setup.name}: {scheme.preset} checkpoint cached at {dest}")
            made.append(Made(setup.name, scheme.preset, dest, True, None))
            continue
        python = python or quant_python()
        n = len(texts) if texts is not None else cfg.quantize.num_samples
        on = f"on {n} calibration texts" if scheme.calibrated else "(no calibration text)"
        log(f"{setup.name}: quantizing to {scheme.preset} ({scheme.algorithm}) {on} -> {dest}")
        record = _make(cfg, setup, dtype, dest, python, cal, texts, model_sha, cal_sha)
        log(f"{setup.name}: done in {record['made_by']['seconds']:.0f} s")
        made.append(Made(setup.name, scheme.preset, dest, False, record["made_by"]["seconds"]))
    return made


def _todo(cfg: RunConfig, only: list[str] | None) -> list[Setup]:
    """The setups to quantize (those of `only`, where given): UserError for an unknown name, for
    none to quantize, and for AWQ on a machine without a GPU."""
    todo = [s for s in cfg.setups if needs_checkpoint(s) and not s.checkpoint]
    if only:
        unknown = [n for n in only if n not in {s.name for s in cfg.setups}]
        if unknown:
            raise UserError(f"--setups: unknown setup {unknown[0]!r}")
        todo = [s for s in todo if s.name in only]
    if not todo:
        raise UserError(
            "no setup to quantize: that takes quantized weights with method "
            f"{' / '.join(SCHEMES)} and no `checkpoint:` of its own"
        )
    if any(s.method == "awq" for s in todo) and shutil.which("nvidia-smi") is None:
        # measured: llmcompressor 0.14's AWQ pipeline pins calibration tensors, which needs an accelerator
        raise UserError(
            "method awq: llm-compressor 0.14 runs AWQ only on a GPU machine (on CPU it fails with "
            "'Cannot access accelerator device'); use method gptq here"
        )
    return todo


def _remove_stale(dest: Path) -> None:
    """Temporary folders of earlier attempts at `dest` whose process is gone (failed or killed)."""
    for old in dest.parent.glob(f"{dest.name}.tmp-*") if dest.parent.is_dir() else []:
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue  # another quantize is making this very checkpoint right now
        shutil.rmtree(old, ignore_errors=True)


def _make(
    cfg: RunConfig,
    setup: Setup,
    dtype: str,
    dest: Path,
    python: str,
    cal: Calibration,
    texts: list[str] | None,
    model_sha: str,
    cal_sha: str,
) -> dict[str, Any]:
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    _remove_stale(dest)
    tmp.mkdir(parents=True)
    recipe = recipe_spec(cfg, setup, dtype)
    calibrated = SCHEMES[setup.method].calibrated  # else the recipe reads no text (checkpoint_key)
    texts = texts if calibrated else []
    m = cfg.model
    model = {"path": m.path, "revision": m.revision, "dtype": dtype, "trust_remote_code": m.trust_remote_code}
    job = {
        "model": model,
        "recipe": recipe,
        "texts": texts,
        "calibration": cal.model_dump(),
        "seed": cfg.seed,
        "output": str(tmp),
    }
    job_path = tmp / "qeval-job.json"
    atomic_write_json(job_path, job)
    started = now_iso()
    log_path = tmp / "quantize.log"
    info = _run_worker(python, job_path, log_path, setup.name)
    job_path.unlink()  # the calibration texts are in the source file; the record says which
    record = {
        "schema_version": SCHEMA_VERSION,
        "key": checkpoint_key(model_sha, recipe, cal_sha),
        "setup": setup.name,
        "scheme": SCHEMES[setup.method].preset,
        "algorithm": SCHEMES[setup.method].algorithm,
        "recipe": recipe,
        "model": {"path": m.path, "sha256": model_sha, "revision": m.revision},
        "calibration": {
            **cal.model_dump(exclude_none=True),
            "sha256": cal_sha,
            "texts": info["calibration_texts"],
            "tokens": info["calibration_tokens"],
        }
        if calibrated
        else {"texts": 0, "tokens": 0, "note": "the recipe reads no calibration text"},
        "made_by": _made_by(started, info),
    }
    atomic_write_json(tmp / RECORD, record)
    _install(tmp, dest)
    return record


def _run_worker(python: str, job_path: Path, log_path: Path, setup: str) -> dict[str, Any]:
    """The quantizing worker run on `job_path` under `python`, its output in `log_path`; what it
    reports (worker-info.json, read and removed). QuantizeFailed where it exits non-zero."""
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log_file:
        # -P: the worker's own folder (qeval/) stays off sys.path, so no qeval module shadows another
        proc = subprocess.run(
            [python, "-P", str(WORKER), str(job_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )  # no orphan quantizer
    if proc.returncode != 0:
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        raise QuantizeFailed(
            f"setup {setup!r}: llm-compressor exited with {proc.returncode}: "
            f"{tail[0] if tail else 'no output'} (log: {log_path})"
        )
    info_path = job_path.parent / "worker-info.json"
    info: dict[str, Any] = json.loads(info_path.read_text())
    info_path.unlink()
    return info


def _made_by(started: str, info: dict[str, Any]) -> dict[str, Any]:
    """The record's `made_by`: qeval, the commit, when, and the worker's libraries and seconds."""
    return {
        "qeval": __version__,
        "git_commit": git_commit(),
        "started": started,
        "finished": now_iso(),
        "seconds": info["seconds"],
        "libraries": info["libraries"],
        "hardware": hardware(),
    }


def _install(tmp: Path, dest: Path) -> None:
    """The finished checkpoint folder moved into place (replacing an older one only once the new one is complete)."""
    if dest.exists():  # --force: the old folder goes only once the new one is complete
        old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)
