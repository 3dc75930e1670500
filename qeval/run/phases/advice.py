"""The advisor's phase (`advise:`; docs/advisor.md): advice.json reused when stored under its
key, else the advisor in a fresh process (its job a typed `AdviseJob`); the advised setup joins
the run's setups before any key is computed, and results.json gets the `advice` block."""

from __future__ import annotations

from dataclasses import replace

from qeval.records.job import AdviseJob
from qeval.report.advice import SECTION
from qeval.results.schema import Results
from qeval.run.advice import advise_for_run, result_block
from qeval.run.phases import PreparedRun, RunPhase


def _prepare(p: PreparedRun) -> PreparedRun:
    return replace(p, advice=advise_for_run(p.pre, p.store, p.opts.setups, p.opts.force))


def _assembled(p: PreparedRun, results: Results) -> Results:
    if p.advice is None:
        return results
    return results.model_copy(update={"advice": result_block(p.advice)})


PHASE = RunPhase(
    name="advice",
    config_block="advise",
    wanted=lambda cfg: cfg.advise is not None,
    plan=AdviseJob,
    keyed_by="the model's checksum, the calibration text's checksum, the budget and the advisor's options",
    store="advice.json (+ advice.md, advice.html)",
    prepare=_prepare,
    assembled=_assembled,
    report=SECTION,
)
