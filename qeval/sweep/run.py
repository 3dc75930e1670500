"""`qeval run` on a sweep: every model's run checked first, then all of their jobs handed to
one executor together (on `ray`, models and setups run side by side; each model's baseline
before the setups that need it), then each model's results and report, and the sweep's.

    RUN_DIR/sweep.json               the sweep's summary (qeval.sweep.schema)
    RUN_DIR/report.md                one report: the models side by side, then each model's own
    RUN_DIR/models/<model>/          an ordinary run directory per model (results.json, samples/…)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qeval.errors import UserError
from qeval.files.atomic import atomic_write_bytes
from qeval.records.preflight import Preflight
from qeval.records.provenance import now_iso
from qeval.results.schema import Results
from qeval.run.advice import advised_names
from qeval.run.options import RunOptions
from qeval.run.phases import report_sections
from qeval.run.runner import PreparedRun, check, execute
from qeval.sweep.config import Sweep
from qeval.sweep.report import write_sweep_report
from qeval.sweep.summary import summarize


def model_dir(root: Path, model: str) -> Path:
    return root / "models" / model


def run_sweep(sweep: Sweep, opts: RunOptions) -> dict[str, Results]:
    """Run every model of `sweep` into opts.output (see the module docstring); each model's
    results, in the config's order."""
    checked: dict[str, tuple[Preflight, RunOptions]] = {}
    for name, cfg in sweep.configs.items():  # every model validated before any directory is touched
        mopts = replace(opts, output=model_dir(opts.output, name), setups=_setups_of(sweep, name, opts.setups))
        checked[name] = (check(cfg, mopts), mopts)
    spec = next(iter(checked.values()))[0].cfg.executor

    def summary(prepared: list[PreparedRun], results: list[Results]) -> None:
        runs = dict(zip(checked, results, strict=True))
        stores = {name: p.store for name, p in zip(checked, prepared, strict=True)}
        done = summarize(sweep, runs, stores, spec.kind, prepared[0].started, now_iso())
        atomic_write_bytes(opts.output / "sweep.json", (done.model_dump_json(indent=2) + "\n").encode())
        write_sweep_report(opts.output, report_sections())

    runs = [(pre, mopts, f"{name}/") for name, (pre, mopts) in checked.items()]
    results = execute(runs, spec, opts.force, outer=(opts.output, sweep.name), after=summary)
    return dict(zip(checked, results, strict=True))


def _setups_of(sweep: Sweep, model: str, names: list[str] | None) -> list[str] | None:
    """--setups for one model of the sweep: the named setups it has (its baseline always runs)."""
    if not names:
        return None
    known = {s.name for cfg in sweep.configs.values() for s in cfg.setups} | {
        n for cfg in sweep.configs.values() for n in advised_names(cfg)
    }  # an advise: block's setup too
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"--setups: no model of the sweep has a setup {unknown[0]!r}")
    cfg = sweep.configs[model]
    own = [s.name for s in cfg.setups] + sorted(advised_names(cfg))
    return [n for n in own if n in names] or [cfg.baseline.name]


@dataclass(frozen=True)
class Ran:
    """What `qeval run CONFIG` ran: each model's results ("" for a config of one model), the run
    directory and tracking block of each, the output folder, and whether it was a sweep."""

    runs: dict[str, Results]
    tracked: dict[str, tuple[Path, Any]]
    out: Path
    sweep: bool


def run_config(config: Path, output: Path | None, opts: RunOptions) -> Ran:
    """`qeval run`: CONFIG as a sweep of several models (qeval/sweep/config.py) or as one run;
    `opts.output` is replaced by `output`, or reports/<name>."""
    from qeval.config import load_config
    from qeval.run.runner import run as run_one
    from qeval.sweep.config import load_sweep

    sweep = load_sweep(config)  # None: a config of one model
    if sweep is not None:
        out = output or Path("reports") / sweep.name
        runs = run_sweep(sweep, replace(opts, output=out))
        tracked = {m: (model_dir(out, m), c.tracking) for m, c in sweep.configs.items() if m in runs}
        return Ran(runs, tracked, out, True)
    cfg = load_config(config)
    out = output or Path("reports") / cfg.name
    return Ran({"": run_one(cfg, replace(opts, output=out))}, {"": (out, cfg.tracking)}, out, False)
