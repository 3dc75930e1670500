"""A run's `advise:` block (docs/advisor.md, "In a run"): checked at preflight, then, holding
the run directory, the advisor run in a process of its own (it loads the model twice: the
runner's process never holds a model) unless RUN_DIR/advice.json is stored under this run's
advice key, and the advised setup added to the run as an ordinary setup.

    python -m qeval.run.advice JOB.json      the advisor's process (what ensure_advice starts)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from qeval.advise.calibration import read_texts
from qeval.advise.target import Options, allowance_of, budget_problem, kv_target, pick_target
from qeval.advise.units import cells
from qeval.backends import backend_entry
from qeval.config import RunConfig
from qeval.config.advise import AdviseSpec
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_json, read_json
from qeval.files.names import inside
from qeval.files.processes import die_with_parent
from qeval.model.checkpoint import checkpoint_config
from qeval.records.job import AdviseJob, AdviseOutcome
from qeval.records.keys import key_of
from qeval.records.preflight import Preflight
from qeval.records.store import RunStore
from qeval.results.advice import Advice, AdviceFigures, AdviceMix, AdviceResult
from qeval.version import __version__


class AdviceFailed(Exception):
    """The advisor's process failed (not bad input): the run stops before any setup runs."""


def advice_path(store: RunStore) -> Path:
    return store.root / "advice.json"


def _job_path(store: RunStore) -> Path:
    # `_` cannot start a setup name (files/names.py): no setup's job file is this one
    return inside(store.root, "jobs", "_advise.json")


def advise_target(cfg: RunConfig, spec: AdviseSpec) -> Setup:
    """The setup whose precision the advisor lowers (`advise.target`, else the config's first
    int4, then int8, quanto setup without a quantized KV cache or a keep list; for the KV advisor,
    `kl_target` set, its first setup with a quantized KV cache on 16-bit weights)."""
    if spec.kl_target is not None:
        return kv_target(cfg, spec.target, "advise.target")
    return pick_target(cfg, spec.target, "advise.target")


def options(cfg: RunConfig, spec: AdviseSpec, target: Setup) -> Options:
    """The advisor's options from the block (the same as `qeval advise`'s command line)."""
    return Options(
        spec.parsed_budget(),
        target.name,
        Path(spec.text) if spec.text else None,
        spec.calib_docs,
        spec.heldout_docs,
        spec.random_draws,
        spec.seed,
        spec.unions,
        spec.setup_name(target.name),
        spec.kl_target,
    )


def check_advice(pre: Preflight) -> None:
    """The block against the setups, the model's shape and the calibration text, before any
    model loads: one UserError line at the first problem (qeval validate and qeval run)."""
    cfg, spec = pre.cfg, pre.cfg.advise
    if spec is None:
        return
    target = advise_target(cfg, spec)
    name = spec.setup_name(target.name)
    if name in {s.name for s in cfg.setups}:
        raise UserError(
            f"advise: the advised setup's name {name!r} is a setup of the config already; name it with advise.name"
        )
    parsed = spec.parsed_budget()
    if pre.shape is not None and parsed is not None:
        allowance, budget, _ = allowance_of(parsed, pre.shape, target, pre.dtype, cfg.budget.context_len)
        problem = budget_problem(
            parsed,
            allowance,
            budget,
            target.name,
            f"advise.budget {spec.budget}",
            sum(u.extra_bytes for u in cells(pre.shape, target, pre.dtype)),
        )
        if problem:
            raise UserError(problem)
    if spec.text and not Path(spec.text).is_file():
        raise UserError(f"advise.text: {spec.text} is not a file")
    try:
        source, texts = read_texts(cfg, Path(spec.text) if spec.text else None)
    except UserError as exc:
        raise UserError(str(exc).replace("--text", "advise.text")) from None
    if len(texts) < spec.calib_docs + spec.heldout_docs:
        raise UserError(
            f"advise: {source} has {len(texts)} documents, fewer than calib_docs {spec.calib_docs} + "
            f"heldout_docs {spec.heldout_docs}"
        )
    # the advised setup is the target with a keep list (a kv_keep list): this backend must serve that here
    kept = {"kv_keep": ("0",)} if spec.kl_target is not None else {"keep": ("model.layers.0.mlp.*",)}
    probe = target.model_copy(update={"name": name, "baseline": False} | kept)
    try:
        backend_entry(cfg.backend).validate_setup(probe, pre.device)
        if spec.kl_target is not None:  # per-layer KV precision on this model (vLLM: one attention kind)
            config = checkpoint_config(cfg.model.path, cfg.model.revision)
            backend_entry(cfg.backend).validate_model(probe, config, pre.device)
    except UserError as exc:
        raise UserError(f"advise: the advised setup {name}: {exc}") from None


def advice_key(pre: Preflight) -> tuple[str, dict[str, str]]:
    """Everything that changes the advice: the model's content, dtype, device, the target
    setup, every knob of the block, the calibration text's content, the context and batching,
    and for a memory budget the context it is counted at."""
    cfg, spec = pre.cfg, pre.cfg.advise
    assert spec is not None
    target = advise_target(cfg, spec)
    budget = spec.parsed_budget()
    if spec.text:
        calibration = "file " + hashlib.sha256(Path(spec.text).read_bytes()).hexdigest()
    else:  # the config's first perplexity task, as calibration.read_texts picks it
        rolling = [t for n in cfg.tasks for t in pre.tasks if t.name == n and t.output_type == "loglikelihood_rolling"]
        calibration = f"task {rolling[0].name} {rolling[0].sha256}" if rolling else "none"
    parts = {
        "model_sha256": pre.model_sha256,
        "dtype": pre.dtype,
        "device": pre.device,
        "qeval": __version__,
        "target": target.id,
        "name": spec.setup_name(target.name),
        "budget": f"{budget.kind} {budget.value!r}" if budget is not None else f"kl {spec.kl_target!r}",
        "calibration": calibration,
        "calib_docs": str(spec.calib_docs),
        "heldout_docs": str(spec.heldout_docs),
        "random_draws": str(spec.random_draws),
        "seed": str(spec.seed),
        "unions": str(spec.unions),
        "max_context": str(cfg.model.max_context),
        "batch_size": str(cfg.batch_size),
    }
    if (
        budget is not None and budget.kind == "bytes"
    ):  # memory at the target context: the context sizes the KV cache counted
        parts["context_len"] = str(cfg.budget.context_len)
    return key_of(parts), parts


def stored_advice(store: RunStore, key: str) -> Advice | None:
    """RUN_DIR/advice.json when it is stored under `key`, else None."""
    path = advice_path(store)
    if not path.is_file():
        return None
    try:
        stored = Advice.model_validate(read_json(path))
    except (OSError, UserError, ValidationError):  # a torn or foreign file: computed anew
        return None
    return stored if stored.key == key else None


def ensure_advice(pre: Preflight, store: RunStore, force: bool, compute: bool = True) -> Advice | None:
    """advice.json's content under this run's key: stored (reused, unless `force`), else
    computed now in a fresh process (when `compute`; else None). AdviceFailed when it fails."""
    key, parts = advice_key(pre)
    stored = None if force else stored_advice(store, key)
    if stored is not None:
        print("advise: advice.json is stored under this run's key: reused (use --force to recompute)", file=sys.stderr)
        return stored.model_copy(update={"reused": True})
    if not compute:
        return None
    job = _job_path(store)
    job.parent.mkdir(parents=True, exist_ok=True)
    outcome = job.with_name("_advise.outcome.json")
    outcome.unlink(missing_ok=True)
    atomic_write_json(
        job,
        AdviseJob(
            config=pre.cfg,
            dtype=pre.dtype,
            run_dir=str(store.root),
            key=key,
            key_parts=parts,
            outcome=str(outcome),
        ).model_dump(mode="json"),
    )
    print(
        f"advise: measuring the sensitivity for {_criterion(pre.cfg.advise)} in a fresh process (docs/advisor.md)",
        file=sys.stderr,
    )
    t0 = time.time()
    # stderr is the terminal's: the advisor's progress lines show as they come
    proc = subprocess.run(
        [sys.executable, "-m", "qeval.run.advice", str(job)],
        check=False,
        stdout=subprocess.DEVNULL,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )
    said = _said(outcome)
    if proc.returncode == 2 and said.user_error:
        raise UserError(f"advise: {said.user_error}")
    stored = stored_advice(store, key)
    if proc.returncode != 0 or stored is None:
        why = said.error or f"the advisor's process exited with code {proc.returncode}"
        raise AdviceFailed(f"the advisor failed after {time.time() - t0:.0f} s: {why}")
    return stored


def _said(outcome: Path) -> AdviseOutcome:
    """What the advisor's process said of its failure (nothing when it wrote no valid outcome)."""
    try:
        return AdviseOutcome.model_validate(read_json(outcome)) if outcome.is_file() else AdviseOutcome()
    except (OSError, UserError, ValidationError):
        return AdviseOutcome()


def _criterion(spec: AdviseSpec | None) -> str:
    """What the advice is sized by, in words: the budget, or the KV advisor's KL target."""
    if spec is None:
        return ""
    return spec.budget if spec.budget is not None else f"the KV cache within KL {spec.kl_target:g}"


def advised_setup(advice: Advice) -> Setup:
    """The advised setup as advice.json holds it."""
    return advice.setup


def with_advised(pre: Preflight, setup: Setup, run_it: bool) -> None:
    """Add the advised setup to the run, in place: to the config (its job file, the results) and,
    when this invocation runs it (`run_it`: no --setups, or --setups names it), to the setups run."""
    backend_entry(pre.cfg.backend).validate_setup(setup, pre.device)
    pre.cfg = pre.cfg.model_copy(update={"setups": [*pre.cfg.setups, setup]})
    if run_it:
        pre.setups.append(setup)


def result_block(advice: Advice) -> AdviceResult:
    """results.json's `advice` block from advice.json (the held-out per-document KLs left out)."""
    figures = {name: getattr(advice, name) for name in AdviceFigures.model_fields}
    return AdviceResult(
        **figures,
        setup=advice.setup.name,
        target=advice.target.name,
        keep=list(advice.setup.keep),
        kv_keep=list(advice.setup.kv_keep),
        units=advice.rows,
        heldout=[AdviceMix.model_validate(m.model_dump(exclude={"per_doc"})) for m in advice.mixes],
        timing=advice.timing,
        key=advice.key,
        reused=advice.reused,
    )


def _work(job: AdviseJob) -> None:
    """The advisor's process: advise, then advice.md, advice.html and advice.json (last, atomic:
    its key marks the advice done) into the run directory."""
    from qeval.advise.advisor import advise
    from qeval.advise.output import write

    cfg = job.config
    assert cfg.advise is not None
    target = advise_target(cfg, cfg.advise)
    advice = advise(
        cfg, Path(cfg.name), options(cfg, cfg.advise, target), log=lambda m: print(m, file=sys.stderr), dtype=job.dtype
    )
    advice.key, advice.key_parts = job.key, job.key_parts
    write(advice, Path(job.run_dir) / "advice.md")


def main() -> None:
    job = AdviseJob.model_validate(json.loads(Path(sys.argv[1]).read_text()))
    outcome = Path(job.outcome)
    try:
        _work(job)
    except UserError as exc:  # what only the loaded model shows (a layer name the advisor does not know)
        atomic_write_json(outcome, AdviseOutcome(user_error=str(exc)).model_dump(mode="json", exclude_none=True))
        sys.exit(2)
    except Exception as exc:  # any failure is reported to the runner in one line, then raised
        first = (str(exc).strip().splitlines() or [""])[0]
        atomic_write_json(
            outcome, AdviseOutcome(error=f"{type(exc).__name__}: {first}").model_dump(mode="json", exclude_none=True)
        )
        raise


def advised_names(cfg: RunConfig) -> set[str]:
    """The name the advised setup will have (advise:), where the block names a setup to lower."""
    if cfg.advise is None:
        return set()
    try:
        return {cfg.advise.setup_name(advise_target(cfg, cfg.advise).name)}
    except UserError:  # no target: check_advice says so in its own words
        return set()


def advise_for_run(pre: Preflight, store: RunStore, only: list[str] | None, force: bool) -> Advice | None:
    """The config's advice (advise:), stored or computed now, with its setup added to the run
    (in place); None without the block. Under --setups (`only`) that leaves the advised setup out, only
    stored advice is used (the advisor is not run for a setup this invocation does not run)."""
    if pre.cfg.advise is None:
        return None
    name = next(iter(advised_names(pre.cfg)))
    run_it = not only or name in only
    advice = ensure_advice(pre, store, force, compute=run_it)
    if advice is not None:
        with_advised(pre, advised_setup(advice), run_it)
    return advice


if __name__ == "__main__":
    main()
