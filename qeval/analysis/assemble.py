"""Assemble results.json (qeval.results.schema) from what the workers stored, keeping only the
results whose keys match this run: a result stored under another model, data, setup, option or
qeval version is dropped from the comparison and listed under `dropped`, with what differs.

Each setup is compared with the baseline task by task, over each lm-eval group's tasks pooled
(a group's size-weighted mean is its documents' mean), and over each suite's average."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from qeval.analysis.comparison import (
    Paired,
    adjust_p_values,
    compare,
    compare_suite,
    kl_summary,
    outputs_changed,
    outputs_identical,
    paired,
    weights_twin,
)
from qeval.analysis.finite import failure_reason, finite_results, task_problem
from qeval.analysis.floor import floor_results
from qeval.analysis.recommend import recommend
from qeval.backends import backend_entry
from qeval.config.setups import Setup
from qeval.memory.figures import gap_flags, memory_block
from qeval.perf.block import performance_block
from qeval.perf.ceilings import read_ceilings
from qeval.perf.phase import perf_key
from qeval.records.job import Outcome
from qeval.records.keys import key_difference
from qeval.records.preflight import Preflight
from qeval.records.provenance import hardware
from qeval.records.store import RunStore
from qeval.results.echo import ConfigEcho, Hardware, Quantization, SetupSpec
from qeval.results.performance import Ceilings
from qeval.results.schema import (
    SCHEMA_VERSION,
    Comparison,
    Dropped,
    Memory,
    MetricValue,
    Results,
    RunInfo,
    SetupResult,
    SuiteScore,
    TaskInfo,
    TaskScore,
)

if TYPE_CHECKING:
    from qeval.records.keys import SetupKeys

#: a task kind's results block: the results with its own block added
ResultsBlock = Callable[[Results, Preflight, RunStore], Results]

KV_NO_EFFECT = (
    "kv_cache_no_effect: outputs identical to weights-only twin {twin!r}; the quantized KV cache "
    "was not exercised, do not read this as lossless"
)


def assemble_results(
    pre: Preflight,
    store: RunStore,
    keys: dict[str, SetupKeys],
    run_info: dict[str, Any],
    blocks: Sequence[ResultsBlock] = (),
) -> Results:
    """The run's results from its directory (see the module docstring). `blocks` add the run
    phases' and the task kinds' own blocks (qeval/run/phases/__init__.py `results_blocks()`: a
    sequential run's verdicts first), before the recommendation."""
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
        if outcome is not None and outcome.key != keys[s.name].key:
            dropped.append(Dropped(setup=s.name, reason=key_difference(outcome.key_parts, keys[s.name].parts)))
            continue
        entries[s.name] = _setup_entry(pre, store, s, outcome, keys[s.name], dropped, ceilings)
    tasks = _task_infos(pre, entries)
    entries = _compare(pre, store, entries, tasks)
    base = entries.get(cfg.baseline.name)
    held = set(base.tasks) if base is not None and base.status == "ok" else None
    run = RunInfo(
        **run_info, hardware=Hardware.model_validate(hardware()), partial_tasks=partial_tasks(pre, tasks, held)
    )
    results = Results(
        schema_version=SCHEMA_VERSION,
        run=run,
        config=ConfigEcho.model_validate(pre.config_json()),  # model.dtype resolved, as results.json always recorded it
        tasks=tasks,
        setups=list(entries.values()),
        groups={g: m for g, m in pre.groups.items() if g in tasks},
        suites=pre.suites,
        dropped=dropped,
        recommendation={"setup": None, "reasons": {}},
        ceilings=ceilings,
    )
    for block in blocks:  # e.g. long context: KV bytes and loss by token position at each length
        results = block(results, pre, store)
    # after the blocks: a sequential run's verdicts are read against the floor as the fixed run's
    results = finite_results(floor_results(results))
    return results.model_copy(update={"recommendation": recommend(results)})


def _task_infos(pre: Preflight, entries: dict[str, SetupResult]) -> dict[str, TaskInfo]:
    """Every task scored in this run (or stored under its key), then each lm-eval group."""
    tasks: dict[str, TaskInfo] = {}
    for t in pre.tasks:
        if t.name in pre.run_tasks or any(t.name in e.tasks for e in entries.values()):
            tasks[t.name] = TaskInfo(
                output_type=t.output_type,
                n=t.n_docs,
                sha256=t.sha256,
                fingerprint=t.fingerprint,
                metric=t.compared_metric,
                kind=t.kind,
                entry=t.entry,
                num_fewshot=t.num_fewshot,
                higher_is_better=_direction(t),
            )
    for group, members in pre.groups.items():
        present = [m for m in members if m in tasks]
        if present:
            first = tasks[present[0]]
            tasks[group] = TaskInfo(
                output_type="group",
                n=sum(tasks[m].n for m in present),
                sha256="",
                fingerprint="",
                metric=first.metric,
                kind="group",
                entry=group,
                num_fewshot=first.num_fewshot,
                higher_is_better=first.higher_is_better,
            )
    return tasks


def partial_tasks(pre: Preflight, tasks: dict[str, TaskInfo], baseline: set[str] | None = None) -> dict[str, str]:
    """The config's entries (tasks, lm-eval groups) this run has no complete result for, and
    why: a run limited by --tasks is judged on part of the config, and must say so. `baseline`:
    the tasks the baseline holds where it ran ok; a task outside --tasks that only other setups
    hold (a sequential run scores a group cell's members together: qeval/analysis/sequential_run.py
    `widen`) is no result either, since nothing is compared on it."""
    out: dict[str, str] = {}
    for entry in pre.entries:
        # an lm-eval group's tasks, a long-context family's other lengths, or the task itself
        members = [t.name for t in pre.tasks if t.entry == entry]
        missing = [  # every task this invocation scores is in `tasks`
            m
            for m in members
            if m not in tasks or (baseline is not None and m not in baseline and m not in pre.run_tasks)
        ]
        if not missing:
            continue
        why = "not selected by --tasks"
        if members != [entry]:
            scored = f"{len(members) - len(missing)} of its {len(members)} tasks scored"
            why = f"{scored} (missing: {', '.join(missing)}: {why})"
            why += ", so no group score or verdict" if entry in pre.groups else ""
        out[entry] = why
    return out


def _compare(
    pre: Preflight, store: RunStore, entries: dict[str, SetupResult], tasks: dict[str, TaskInfo]
) -> dict[str, SetupResult]:
    """Each ok setup against an ok baseline: tasks, groups, suites; and the KV no-effect flag."""
    cfg, base = pre.cfg, pre.cfg.baseline.name
    ok = {n for n, e in entries.items() if e.status == "ok"}
    out = {}
    for name, entry in entries.items():
        setup = next(s for s in cfg.setups if s.name == name)
        vs: dict[str, Comparison] = {}
        suites: dict[str, SuiteScore] = {}
        scores = dict(entry.tasks)
        # a parity control of another setup (`control.of`) is paired with that setup, not the baseline
        ref = cfg.paired_with(setup)
        if name != base and name in ok and ref in ok and base in ok:
            data = _paired_tasks(store, ref, name, tasks, entries)
            for t, d in data.items():
                # a group's member is gated only by a gate that names it: `all` means the config's entries
                gates = cfg.gates if tasks[t].entry in (None, t) else [g for g in cfg.gates if g.task == t]
                c = compare(d, t, cfg.seed, gates, tasks[t].higher_is_better)
                # the worker's KL is to its partner's top-k (qeval/run/jobs.py): the baseline's, a
                # parity control's `of`; a control stored before partners kept theirs has none
                changed = outputs_changed(store.read_samples(ref, t), store.read_samples(name, t))
                kl = kl_summary(store, name, t) if _kl_against(store, name, t, ref, base) else {}
                vs[t] = c.model_copy(update=kl | ({"outputs_changed": changed} if changed is not None else {}))
            for group in (g for g in tasks if tasks[g].is_group):
                parts = [data[m] for m in pre.groups[group] if m in data]
                # a group is judged on every member or not at all: each stored on both sides (a
                # sequential run's member may have no document in the prefix its group stopped at)
                members = pre.groups[group]
                whole = all(m in entries[s].tasks for s in (ref, name) for m in members)
                if parts and whole and all(m in data or entries[name].tasks[m].n == 0 for m in members):
                    vs[group] = compare(Paired.pool(parts), group, cfg.seed, cfg.gates, tasks[group].higher_is_better)
            suites = _suites(pre, data, vs)
        scores |= _group_scores(entry, tasks, pre.groups)
        flags = gap_flags(entry.memory) + _kv_flag(store, cfg, setup, entries, ok)
        out[name] = entry.model_copy(
            update={"vs_baseline": adjust_p_values(vs), "tasks": scores, "suites": suites, "flags": entry.flags + flags}
        )
    return out


def _kl_against(store: RunStore, name: str, task: str, ref: str, base: str) -> bool:
    """Whether `name`'s stored KL on `task` is to `ref`'s top-k: always the baseline's, but for a
    parity control of another setup stored with its reference in its key (qeval/records/keys.py)."""
    meta = store.read_meta(name, task)
    parts = meta.key_parts if meta is not None else None
    return (parts or {}).get("kl_reference", base) == ref


def _direction(t: Any) -> bool | None:
    """Whether the compared metric is better higher, as lm-eval declares it (None: qeval's own
    descriptor decides)."""
    hib = getattr(t, "higher_is_better", None)
    return hib.get(t.compared_metric.split(",")[0]) if isinstance(hib, dict) else None


def _paired_tasks(
    store: RunStore, base: str, other: str, tasks: dict[str, TaskInfo], entries: dict[str, SetupResult]
) -> dict[str, Paired]:
    out = {}
    for t, info in tasks.items():
        if not info.is_group and t in entries[other].tasks and t in entries[base].tasks:
            d = paired(store, base, other, t, info.compared_metric)
            if d is not None:
                out[t] = d
    return out


def _group_scores(entry: SetupResult, tasks: dict[str, TaskInfo], groups: dict[str, list[str]]) -> dict[str, TaskScore]:
    """A group's score: its tasks' scores weighted by their sizes (lm-eval's weight_by_size);
    none unless every task of the group was scored (a member stored with no document, in a
    sequential run that stopped the group before it, weighs nothing)."""
    out = {}
    for group in (g for g in tasks if tasks[g].is_group):
        metric = tasks[group].compared_metric
        members = [
            (entry.tasks[m].n, entry.tasks[m].metrics[metric].value)
            for m in groups[group]
            if m in entry.tasks and metric in entry.tasks[m].metrics and entry.tasks[m].n > 0
        ]
        empty = [m for m in groups[group] if m in entry.tasks and entry.tasks[m].n == 0]
        if members and len(members) + len(empty) == len(groups[group]):  # part of a group is not the group's score
            n = sum(k for k, _ in members)
            out[group] = TaskScore(n=n, metrics={metric: MetricValue(value=sum(k * v for k, v in members) / n)})
    return out


def _suites(pre: Preflight, data: dict[str, Paired], vs: dict[str, Comparison]) -> dict[str, SuiteScore]:
    """Each suite over the tasks and groups both sides scored (perplexity tasks are not averaged)."""
    out = {}
    for suite, names in pre.suites.items():
        parts: dict[str, tuple[Paired, Comparison]] = {}
        for n in names:
            members = [data[m] for m in pre.groups.get(n, [n]) if m in data]
            if members and n in vs and members[0].den is None:
                parts[n] = (Paired.pool(members), vs[n])
        if parts:
            out[suite] = compare_suite(parts, pre.cfg.gates, suite)
    return out


def _kv_flag(store: RunStore, cfg: Any, setup: Setup, entries: dict[str, SetupResult], ok: set[str]) -> list[str]:
    twin = weights_twin(cfg, setup) if setup.quantizes_kv else None
    if twin is None or setup.name not in ok or twin.name not in ok:
        return []
    shared = [t for t in entries[setup.name].tasks if t in entries[twin.name].tasks]
    return (
        [KV_NO_EFFECT.format(twin=twin.name)]
        if shared and outputs_identical(store, setup.name, twin.name, shared)
        else []
    )


def _setup_entry(
    pre: Preflight,
    store: RunStore,
    setup: Setup,
    outcome: Outcome | None,
    keys: SetupKeys,
    dropped: list[Dropped],
    ceilings: Ceilings | None = None,
) -> SetupResult:
    outcome = outcome or Outcome(name=setup.name, status="failed", error="not run")
    scores, non_finite = _stored_scores(pre, store, setup, keys, dropped)
    status, error = outcome.status, outcome.error
    missing = [t for t in pre.run_tasks if t not in scores]
    if status == "ok" and non_finite:
        status, error = "failed", failure_reason(non_finite)
    elif status == "ok" and setup in pre.setups and missing:
        status, error = "failed", f"no stored results for {', '.join(missing)}"
    cfg = pre.cfg
    memory = _memory(pre, setup, outcome)
    perf, perf_flags = performance_block(
        setup,
        outcome.performance if cfg.performance.enabled else None,
        perf_key(keys.parts, cfg),
        memory,
        pre.shape,
        pre.dtype,
        ceilings,
    )
    return SetupResult(
        name=setup.name,
        baseline=setup.name == cfg.baseline.name,
        status=status,
        error=error,
        spec=_spec(setup),
        memory=memory,
        tasks=scores,
        library_versions=outcome.library_versions,
        quantization=outcome.quantization,
        timings=outcome.timings,
        performance=perf,
        flags=perf_flags + checkpoint_flags(outcome.quantization) + fallback_flags(outcome.quantization),
    )


def _spec(setup: Setup) -> SetupSpec:
    """The setup as results.json echoes it, with its id: a control's conditions as given, and no
    `control` key for a setup that is none (it echoes as before controls existed)."""
    # a setup that keeps no layer's KV cache echoes as before kv_keep existed
    spec = setup.model_dump(mode="json", exclude={"control"} | ({"kv_keep"} if not setup.kv_keep else set()))
    spec |= {"id": setup.id}
    if setup.control is not None:
        spec["control"] = setup.control.fields()
    return SetupSpec.model_validate(spec)


def _stored_scores(
    pre: Preflight, store: RunStore, setup: Setup, keys: SetupKeys, dropped: list[Dropped]
) -> tuple[dict[str, TaskScore], list[str]]:
    """`setup`'s scores stored under this run's keys (the others appended to `dropped`), and the
    problems of those whose figures are not numbers."""
    scores: dict[str, TaskScore] = {}
    non_finite: list[str] = []
    for t in pre.tasks:
        meta = store.read_meta(setup.name, t.name)
        if meta is None:
            continue
        if meta.key != keys.task_key(t.name):
            dropped.append(
                Dropped(setup=setup.name, task=t.name, reason=key_difference(meta.key_parts, keys.tasks[t.name]))
            )
            continue
        # stored before the worker checked (or by another path): not numbers, not a score
        problem = task_problem(
            t.name, store.read_samples(setup.name, t.name), meta.metric_values(), meta.kl_distribution
        )
        if problem is not None:
            non_finite.append(problem)
            continue
        scores[t.name] = TaskScore(n=meta.n, metrics=meta.metric_values(), generated_tokens=meta.generated_tokens)
    return scores, non_finite


def _memory(pre: Preflight, setup: Setup, outcome: Outcome) -> Memory:
    """`setup`'s memory block: predicted from the shape beside what its worker measured."""
    cfg = pre.cfg
    share = (
        f"GPU memory x {cfg.budget.utilization} (budget.utilization)"
        if pre.device == "cuda"
        else f"host memory x {cfg.engine.cpu_memory_utilization} (engine.cpu_memory_utilization)"
    )
    return memory_block(
        setup,
        outcome.memory,
        pre.shape,
        pre.dtype,
        pre.device,
        cfg.budget,
        share,
        backend_entry(cfg.backend_of(setup)).kv_accounting(cfg.for_setup(setup), pre.device),
    )


def fallback_flags(quantization: Quantization) -> list[str]:
    """Where the engine ran a setup on another path than its format's own (its provenance's
    fallbacks): compared for quality, but flagged, never silently."""
    p = quantization.provenance
    return [f"kernel_fallback: {f}" for f in p.fallbacks] if p is not None else []


def checkpoint_flags(quantization: Quantization) -> list[str]:
    """A pre-quantized checkpoint the engine decompressed to a floating dtype on load (transformers
    does for compressed-tensors on CPU): scored as the checkpoint, but not resident as one; and
    where activations or a KV format were rounded in software, that its quality is emulated."""
    dtype = quantization.decompressed_to
    flags = []
    if dtype:
        flags.append(
            f"checkpoint_decompressed: the engine decompressed the checkpoint to {dtype} on load: its quality is "
            "the checkpoint's, its memory is not (weights_bytes is what is resident)"
        )
    # no kernel of the format ran: its arithmetic is the emulation's, its speed is no one's
    for what, part in quantization.emulated_parts().items():
        flag = what.lower().replace(" ", "_") + "_emulated"  # activations_emulated, kv_cache_emulated
        flags.append(f"{flag}: {part}; quality emulated, no speed figure of the format")
    return flags
