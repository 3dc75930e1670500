"""The serving phase (`recommend_by: goodput` with a `workload:`; docs/performance.md, "Serving
the workload"): after scoring, every setup that scored is served on the workload and tuned, on
this machine; results.json gets its `serving` block and the goodput recommendation. Rows are
keyed by content (RUN_DIR/serving.json: qeval/run/serving.py)."""

from __future__ import annotations

from qeval.report.serving import SECTION
from qeval.results.schema import Results
from qeval.run.phases import PreparedRun, RunPhase
from qeval.run.serving import serve_workload


def _finish(p: PreparedRun, results: Results) -> Results:
    return serve_workload(p.pre, results, p.store.root, force=p.opts.force)


PHASE = RunPhase(
    name="serving",
    config_block="workload",
    wanted=lambda cfg: cfg.recommend_by == "goodput",
    keyed_by="the model's and checkpoints' checksums, the trace's bytes, vLLM's version, the setup, "
    "its engine arguments, the workload, the SLO and the serving block",
    store="serving.json (+ serving.md and its figures)",
    finish=_finish,
    report=SECTION,
)
