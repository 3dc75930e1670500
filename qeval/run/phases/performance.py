"""The performance phase (`performance: {enabled: true}`; docs/performance.md): the device's
ceilings once per run, here on the driver before any setup; each setup's timing in its worker
after scoring, through the job's `PerformanceJob` (qeval/perf/phase.py), keyed by its own key."""

from __future__ import annotations

from qeval.backends import backend_entry
from qeval.perf.ceilings import ensure_ceilings
from qeval.records.job import PerformanceJob
from qeval.run.executors.address import cluster_address
from qeval.run.phases import PreparedRun, RunPhase


def _prepare(p: PreparedRun) -> PreparedRun:
    cfg = p.pre.cfg
    remote = cluster_address(cfg.executor.address) if cfg.executor.kind == "ray" else None
    ensure_ceilings(p.pre, p.store, backend_entry(cfg.backend).worker_python(cfg), remote)
    return p


PHASE = RunPhase(
    name="performance",
    config_block="performance",
    wanted=lambda cfg: cfg.performance.enabled,
    plan=PerformanceJob,
    keyed_by="the setup's key, the device, the workload's lengths, levels and repeats, the seed",
    store="ceilings.json, setups/<setup>.json's `performance`",
    prepare=_prepare,
)
