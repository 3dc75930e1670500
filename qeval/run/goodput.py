"""`qeval goodput`: the serving phase on its own (docs/performance.md, "Serving the workload"):
the config's checks, the run directory taken as `qeval run` takes it, each setup served on the
workload with `vllm serve` and tuned (qeval/perf/serving.py, the code the serving phase of a run
uses), RUN_DIR/serving.json and serving.md, and the command's exit code. The command line
(qeval/cli.py) parses the options and maps errors to exit codes."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qeval.errors import UserError
from qeval.run.exits import EXIT_NONE_MEETS_SLO, EXIT_OK, EXIT_SETUP_FAILED

if TYPE_CHECKING:
    from qeval.results.serving import ServingResults


@dataclass(frozen=True)
class GoodputRequest:
    """`qeval goodput`'s options."""

    config: Path
    output: Path | None = None
    setups: list[str] | None = None
    exhaustive: bool = False
    force: bool = False


def goodput(req: GoodputRequest) -> tuple[ServingResults, Path]:
    """Serve and tune every setup `req` names; its results and report's path. UserError (one line)
    before anything is served for a config, setup or output folder it cannot take."""
    from qeval.backends.device import dtype_for, resolve_device
    from qeval.config import load_config
    from qeval.model.source import resolve_model
    from qeval.perf.serving import check_goodput, check_vllm, goodput_run
    from qeval.quantize.checkpoints import resolve_checkpoints
    from qeval.report.serving import write_report
    from qeval.run.rundir import take_run_dir
    from qeval.run.serving import scored_gates

    cfg = load_config(req.config)
    out = req.output or Path("reports") / cfg.name
    if cfg.workload is None or cfg.workload.slo is None or cfg.serving is None:
        raise UserError(f"{req.config}: qeval goodput needs a workload: block with an slo: and a serving: block")
    # the backend's blocks and the vLLM that will serve, before checkpoints are looked for
    # (`qeval quantize` first) and before anything loads
    check_goodput(cfg)
    check_vllm(cfg)
    serving = cfg.serving
    if req.setups is not None:
        unknown = sorted(set(req.setups) - {s.name for s in cfg.setups})
        if unknown:
            raise UserError(f"--setups: {unknown[0]!r} is not a setup of {req.config}")
    # the run directory as `run` takes it (its owner, its lock: no `qeval run` writes beside)
    lock = take_run_dir(out, cfg.name, req.force, goodput_files(out, cfg.name))
    try:
        # the dtype as `qeval quantize` resolved it: part of a checkpoint's key
        dtype = dtype_for(cfg.model.dtype, Path(cfg.model.path), resolve_device(cfg.device))
        asked = cfg.for_engine(dtype)  # the config as a scored run records it: its results.json is matched on it
        if req.setups is not None:
            cfg = cfg.model_copy(update={"setups": [s for s in cfg.setups if s.name in (req.setups or [])]})
        if req.exhaustive:
            cfg = cfg.model_copy(update={"serving": serving.model_copy(update={"exhaustive": True})})
        cfg = cfg.for_engine(dtype)  # goodput's engines and serving.json: the resolved dtype, as before
        source = resolve_model(cfg.model.path, cfg.model.revision)
        cfg = resolve_checkpoints(cfg, source.checksum, {s.name for s in cfg.setups}, dtype)
        checkpoints = {
            s.name: resolve_model(s.checkpoint, s.checkpoint_revision).checksum for s in cfg.setups if s.checkpoint
        }  # as preflight keys the scores: the served content, not its path
        gated, unused = scored_gates(out, asked, source.checksum)
        if unused:
            print(f"qeval: {unused}", file=sys.stderr)
        results = goodput_run(
            cfg, out, gated, model_sha256=source.checksum, checkpoint_sha256=checkpoints, force=req.force
        )
        return results, write_report(results, out)
    finally:
        lock.release()


def goodput_files(out: Path, name: str) -> frozenset[str]:
    """`qeval goodput`'s own files in `out` where its serving.json is of config `name`: written
    before goodput took the run directory as `run` does (no marker), they are this config's."""
    from qeval.report.serving import FIGURES
    from qeval.results.serving import FILE

    try:
        if json.loads((out / FILE).read_text(encoding="utf-8")).get("config") != name:
            return frozenset()
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset({FILE, "serving.md", "serving", *FIGURES})


def goodput_exit_code(results: ServingResults) -> int:
    """`qeval goodput`'s exit code for a finished run (2 and 130 are decided before it finishes):
    3 with no recommendation (no setup meets the SLO, or none was served), else 1 when a setup
    could not be served, else 0."""
    if not results.recommendation.setup:
        return EXIT_NONE_MEETS_SLO
    if any(r.status != "ok" for r in results.setups):
        return EXIT_SETUP_FAILED
    return EXIT_OK


def announce(results: ServingResults, report: Path) -> int:
    """The recommendation, each setup's `vllm serve` line and the report's path on stdout, why on
    stderr where no setup is recommended or one could not be served; the exit code."""
    print(f"recommended (by goodput): {results.recommendation.setup or 'none'}")
    for reason in results.recommendation.reasons.values():
        print(f"  {reason}")
    for r in results.setups:
        print(f"{r.setup}: {r.serve_command}")
    print(f"report: {report}")
    code = goodput_exit_code(results)
    if code == EXIT_NONE_MEETS_SLO:
        if all(r.status != "ok" for r in results.setups):
            why = "no setup could be served (see serving.json)"
        else:
            gates = " and passes every gate" if results.recommendation.gates_checked else ""
            why = f"no setup meets the SLO{gates} (serving.md says why)"
        print(f"qeval: goodput: {why}", file=sys.stderr)
    elif code == EXIT_SETUP_FAILED:
        failed = ", ".join(r.setup for r in results.setups if r.status != "ok")
        print(f"qeval: goodput: setups that could not be served: {failed} (see serving.json)", file=sys.stderr)
    return code
