"""The sweep's summary (sweep.json) from its models' assembled results: each model's
baseline and decision, and each model's baseline against the reference model's, paired by
document with the same statistics a setup gets against its baseline (docs/statistics.md)."""

from __future__ import annotations

from qeval.analysis.comparison import adjust_p_values, compare_task
from qeval.records.store import RunStore
from qeval.results.samples import SampleRecord
from qeval.results.schema import Comparison, Results
from qeval.sweep.config import Sweep
from qeval.sweep.schema import SWEEP_VERSION, SweepModelEntry, SweepResults


class _TwoBaselines(RunStore):
    """Two runs' baselines seen as the setups `reference` and `model` of one store, so that
    the paired comparison reads each from its own run directory."""

    def __init__(self, reference: tuple[RunStore, str], model: tuple[RunStore, str]) -> None:
        super().__init__(reference[0].root)
        self._sources = {"reference": reference, "model": model}

    def read_samples(self, setup: str, task: str) -> list[SampleRecord]:
        store, name = self._sources[setup]
        return store.read_samples(name, task)


def summarize(
    sweep: Sweep, runs: dict[str, Results], stores: dict[str, RunStore], executor: str, started: str, finished: str
) -> SweepResults:
    """sweep.json's content (see the module docstring)."""
    tasks: dict[str, str] = {}
    for results in runs.values():
        for t, info in results.tasks.items():
            tasks.setdefault(t, info.compared_metric)
    ref = sweep.reference
    compared = {
        name: _baseline_vs_reference(runs[ref], stores[ref], runs[name], stores[name], tasks, sweep.configs[name].seed)
        for name in runs
        if name != ref
    }
    return SweepResults(
        sweep_version=SWEEP_VERSION,
        name=sweep.name,
        started=started,
        finished=finished,
        executor=executor,
        reference_model=ref,
        tasks=tasks,
        models=[_entry(name, runs[name], tasks) for name in runs],
        baselines_vs_reference={n: c for n, c in compared.items() if c},
    )


def _entry(name: str, results: Results, tasks: dict[str, str]) -> SweepModelEntry:
    base = results.baseline
    scores = {
        t: (base.tasks[t].metrics.get(metric) if base is not None and t in base.tasks else None)
        for t, metric in tasks.items()
    }
    return SweepModelEntry(
        name=name,
        path=results.config.model.path,
        run_dir=f"models/{name}",
        model_sha256=results.run.model_sha256,
        baseline=base.name if base else None,
        baseline_status=base.status if base else "missing",
        baseline_scores=scores,
        recommendation=results.recommendation.setup,
        blocked=results.recommendation.blocked,
        failed_setups=[s.name for s in results.setups if s.status != "ok"],
    )


def _baseline_vs_reference(
    ref: Results, ref_store: RunStore, other: Results, other_store: RunStore, tasks: dict[str, str], seed: int
) -> dict[str, Comparison]:
    """`other`'s baseline against `ref`'s, task by task, where both scored the same data."""
    a, b = ref.baseline, other.baseline
    if a is None or b is None or a.status != "ok" or b.status != "ok":
        return {}
    pair = _TwoBaselines((ref_store, a.name), (other_store, b.name))
    block = {}
    for task, metric in tasks.items():
        same_data = (
            task in ref.tasks and task in other.tasks and ref.tasks[task].fingerprint == other.tasks[task].fingerprint
        )
        if same_data and task in a.tasks and task in b.tasks:
            cmp = compare_task(pair, "reference", "model", task, metric, seed, gates=[])
            if cmp is not None:
                block[task] = cmp
    return adjust_p_values(block)
