"""Assemble results.json (qeval.results.schema) from what the workers stored, keeping only the
results whose keys match this run: a result stored under another model, data, setup, option or
qeval version is dropped from the comparison and listed under `dropped`, with what differs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qeval.analysis.comparison import adjust_p_values, compare_task, compared_metric, outputs_identical, weights_twin
from qeval.analysis.recommend import recommend
from qeval.memory.figures import gap_flags, memory_block
from qeval.perf.block import performance_block
from qeval.perf.ceilings import read_ceilings
from qeval.perf.phase import perf_key
from qeval.perf.schema import Ceilings
from qeval.results.schema import SCHEMA_VERSION, Dropped, Results, RunInfo, SetupResult, TaskInfo, TaskScore
from qeval.run.keys import key_difference
from qeval.run.preflight import Preflight
from qeval.run.provenance import hardware
from qeval.run.store import RunStore
from qeval.setups import Setup

if TYPE_CHECKING:
    from qeval.run.keys import SetupKeys

KV_NO_EFFECT = ("kv_cache_no_effect: outputs identical to weights-only twin {twin!r}; the quantized KV cache "
                "was not exercised, do not read this as lossless")


def assemble_results(pre: Preflight, store: RunStore, keys: dict[str, SetupKeys], run_info: dict[str, Any]) -> Results:
    """The run's results from its directory (see the module docstring)."""
    cfg = pre.cfg
    dropped: list[Dropped] = []
    entries: dict[str, SetupResult] = {}
    stored_ceilings = read_ceilings(store) if cfg.performance.enabled else None
    ceilings = Ceilings.model_validate(stored_ceilings) if stored_ceilings else None
    for s in cfg.setups:
        if s.name in pre.skipped:
            continue
        outcome = store.read_outcome(s.name)
        if outcome is None and s not in pre.setups:
            continue  # never run into this directory: nothing to show
        if outcome is not None and outcome.get("key") != keys[s.name].key:
            dropped.append(Dropped(setup=s.name, reason=key_difference(outcome.get("key_parts"), keys[s.name].parts)))
            continue
        entries[s.name] = _setup_entry(pre, store, s, outcome, keys[s.name], dropped, ceilings)
    tasks = {t.name: TaskInfo(output_type=t.spec.output_type, n=len(t.docs), sha256=t.sha256,
                              fingerprint=t.fingerprint, metric=compared_metric(t.spec.output_type, t.metrics))
             for t in pre.tasks if t.name in pre.run_tasks or any(t.name in e.tasks for e in entries.values())}
    entries = _compare(pre, store, entries, tasks)
    results = Results(schema_version=SCHEMA_VERSION, run=RunInfo(**run_info, hardware=hardware()),
                      config=cfg.model_dump(mode="json"), tasks=tasks, setups=list(entries.values()),
                      dropped=dropped, recommendation={"setup": None, "reasons": {}}, ceilings=ceilings)
    return results.model_copy(update={"recommendation": recommend(results)})


def _compare(pre: Preflight, store: RunStore, entries: dict[str, SetupResult],
             tasks: dict[str, TaskInfo]) -> dict[str, SetupResult]:
    """Each ok setup against an ok baseline, task by task; and the KV-cache no-effect flag."""
    cfg, base = pre.cfg, pre.cfg.baseline.name
    ok = {n for n, e in entries.items() if e.status == "ok"}
    out = {}
    for name, entry in entries.items():
        setup = next(s for s in cfg.setups if s.name == name)
        vs = {}
        if name != base and name in ok and base in ok:
            for t, info in tasks.items():
                if t in entry.tasks and t in entries[base].tasks:
                    cmp = compare_task(store, base, name, t, info.compared_metric, cfg.seed, cfg.gates)
                    if cmp is not None:
                        vs[t] = cmp
        flags = gap_flags(entry.memory)
        twin = weights_twin(cfg, setup) if setup.quantizes_kv else None
        if twin is not None and name in ok and twin.name in ok:
            shared = [t for t in entry.tasks if t in entries[twin.name].tasks]
            if shared and outputs_identical(store, name, twin.name, shared):
                flags.append(KV_NO_EFFECT.format(twin=twin.name))
        out[name] = entry.model_copy(update={"vs_baseline": adjust_p_values(vs), "flags": entry.flags + flags})
    return out


def _setup_entry(pre: Preflight, store: RunStore, setup: Setup, outcome: dict[str, Any] | None,
                 keys: SetupKeys, dropped: list[Dropped], ceilings: Ceilings | None = None) -> SetupResult:
    outcome = outcome or {"status": "failed", "error": "not run"}
    scores: dict[str, TaskScore] = {}
    for t in pre.tasks:
        meta = store.read_meta(setup.name, t.name)
        if meta is None:
            continue
        if meta.get("key") != keys.task_key(t.name):
            dropped.append(Dropped(setup=setup.name, task=t.name,
                                   reason=key_difference(meta.get("key_parts"), keys.tasks[t.name])))
            continue
        scores[t.name] = TaskScore(n=meta["n"], metrics=meta["metrics"])
    status, error = outcome["status"], outcome.get("error")
    missing = [t for t in pre.run_tasks if t not in scores]
    if status == "ok" and setup in pre.setups and missing:
        status, error = "failed", f"no stored results for {', '.join(missing)}"
    cfg = pre.cfg
    share = (f"GPU memory x {cfg.budget.utilization} (budget.utilization)" if pre.device == "cuda"
             else f"host memory x {cfg.engine.cpu_memory_utilization} (engine.cpu_memory_utilization)")
    memory = memory_block(setup, outcome.get("memory") or {}, pre.shape, cfg.model.dtype, pre.device, cfg.budget, share)
    perf, perf_flags = performance_block(setup, outcome.get("performance") if cfg.performance.enabled else None,
                                         perf_key(keys.parts, cfg), memory, pre.shape, cfg.model.dtype, ceilings)
    return SetupResult(name=setup.name, baseline=setup.name == cfg.baseline.name, status=status, error=error,
                       spec=setup.model_dump(mode="json") | {"id": setup.id}, memory=memory, tasks=scores,
                       library_versions=outcome.get("library_versions", {}),
                       quantization=outcome.get("quantization", {}), timings=outcome.get("timings", {}),
                       performance=perf, flags=perf_flags)
