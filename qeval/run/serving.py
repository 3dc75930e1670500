"""The serving phase of `qeval run` under `recommend_by: goodput` (docs/performance.md, "Serving
the workload"): after scoring, every setup that scored is served on the config's workload with
`vllm serve` and tuned (qeval/perf/serving.py, the same code as `qeval goodput`); the figures join
results.json as its `serving` block and the recommendation is decided on them, among the setups
that pass every gate and fit the budget.

It runs in the driver, on this machine, whatever the executor: the serving figures are the
driver machine's (results.json's `serving.machine` says which). RUN_DIR/serving.json is
rewritten after every setup, so an interrupted phase resumes with the setups already served
(under `qeval run --force`, none is reused)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.analysis.recommend import recommend
from qeval.errors import UserError
from qeval.perf.serving import goodput_run
from qeval.report.serving import write_report

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.records.preflight import Preflight
    from qeval.results.schema import Results


def _say(line: str) -> None:
    print(f"serving: {line.strip()}", file=sys.stderr)


def serve_workload(pre: Preflight, results: Results, out: Path, force: bool = False) -> Results:
    """`results` with its `serving` block (every setup that scored, served and tuned) and the
    recommendation decided by goodput; RUN_DIR/serving.json and serving.md written beside. Stored
    rows are keyed by the same content checksums as the scores (the model's, each checkpoint's);
    `force` (`qeval run --force`) measures every setup again."""
    # an A/A control is the baseline served again: the baseline's own serving answers for it
    scored = {s.name for s in results.setups if s.status == "ok" and not s.control}
    setups = [s for s in pre.cfg.setups if s.name in scored]
    if not setups:
        _say("no setup scored: nothing to serve")
        return results
    rec = results.recommendation
    # the run's own rule (every gate passed, the budget fitted) lets these through; the others keep their reason
    gated = (list(rec.candidates), {k: v for k, v in rec.reasons.items() if k not in rec.candidates})
    cfg = pre.cfg.model_copy(update={"setups": setups})
    served = goodput_run(
        cfg,
        out,
        gated,
        say=_say,
        model_sha256=pre.model_sha256,
        checkpoint_sha256=pre.checkpoint_sha256,
        force=force,
    )
    write_report(served, out)
    with_serving = results.model_copy(update={"serving": served})
    return with_serving.model_copy(update={"recommendation": recommend(with_serving)})


#: what a scored run's gates are to `qeval goodput`: the candidates and why each other setup is out
Gated = tuple[list[str], dict[str, str]]


def scored_gates(out: Path, cfg: RunConfig, model_sha256: str) -> tuple[Gated | None, str | None]:
    """For `qeval goodput`: the setups the scored run in `out` lets through (its
    recommendation's candidates: every gate passed, the budget fitted) and why each other one is
    out; used only when that results.json is a run of this config (`cfg` as loaded, model.dtype
    resolved: its `config` block, the advised setup and the checkpoint folders `qeval quantize`
    resolved aside) on this model (`model_sha256`, its content checksum). Otherwise (None, why
    not): the quality gates are not checked, and each reason says so. No results.json: (None, None)."""
    file = out / "results.json"
    if not file.is_file():
        return None, None
    try:
        from qeval.results.schema import read_results

        scored = read_results(file)
    except UserError as exc:
        return None, f"{file} is not used as quality evidence: {exc}"
    problem = None
    if scored.run.model_sha256 != model_sha256:
        problem = "it scored another model (its content checksum differs)"
    elif _comparable(scored.config.as_dict(), cfg) != _comparable(cfg.as_json(), cfg):
        problem = f"it is a run of another config ({scored.run.name}, or {cfg.name} as it was then)"
    if problem:
        return None, f"{file} is not used as quality evidence: {problem}; quality gates not checked"
    rec = recommend(scored)
    return (rec.candidates, {k: v for k, v in rec.reasons.items() if k not in rec.candidates}), None


def _comparable(config: dict[str, Any], cfg: RunConfig) -> dict[str, Any]:
    """A config block without what the run itself adds: the advised setup (advise:) and the
    checkpoint folders resolved for setups that name none (made by `qeval quantize` from the
    model, its calibration text and dtype, all in the block or the model's checksum)."""
    from qeval.run.advice import advised_names

    named = {s.name for s in cfg.setups if s.checkpoint}
    advised = advised_names(cfg)
    setups = []
    for s in config.get("setups") or []:
        if not isinstance(s, dict) or s.get("name") in advised:
            continue
        setups.append(s if s.get("name") in named else {k: v for k, v in s.items() if k != "checkpoint"})
    return config | {"setups": setups}
