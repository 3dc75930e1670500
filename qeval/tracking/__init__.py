"""Experiment tracking: a finished run logged to the trackers its config names (docs/tracking.md).

Called once by `qeval run`, after results.json and the reports are written: a tracker that is
down or refuses the run costs one warning line, never the run's exit code or its files."""

from __future__ import annotations

import sys
from pathlib import Path

from qeval.config.tracking import TrackingSpec
from qeval.results.schema import Results
from qeval.tracking.uri import redact, scrub, shorten

__all__ = ["track_run"]


def track_run(run_dir: Path, results: Results, tracking: TrackingSpec, where: str = "") -> str | None:
    """Log the run in `run_dir` to MLflow when `tracking` names it; the parent run's id, or None
    when tracking is off or failed (then one warning line on stderr). `where` prefixes the
    lines (a sweep's model)."""
    spec = tracking.mlflow
    if spec is None:
        return None
    shown = redact(spec.tracking_uri)
    try:
        from qeval.tracking.mlflow_log import log_run

        run_id = log_run(spec, run_dir.resolve(), results)
    except Exception as exc:  # noqa: BLE001 - whatever the tracker raises, the run's files are complete
        first = (str(exc).strip().splitlines() or [""])[0]
        reason = shorten(scrub(f"{type(exc).__name__}: {first}", spec.tracking_uri))
        print(
            f"qeval: warning: {where}tracking: not logged to MLflow at {shown} ({reason}); the run's files "
            "are complete",
            file=sys.stderr,
        )
        return None
    print(f"{where}tracking: MLflow run {run_id} in experiment {spec.experiment!r} at {shown}", file=sys.stderr)
    return run_id
