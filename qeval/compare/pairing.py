"""The same setup on the same task in two runs: paired by document where both runs scored the
same data (the statistics a setup gets against its baseline, docs/statistics.md), unpaired and
said so where they did not, and whether the later run got worse beyond a margin."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from qeval.analysis.comparison import Comparison, Paired, compare, document_values, paired_records
from qeval.analysis.stats import small_sample_reason, unpaired_difference, verdict
from qeval.compare.evidence import chat_difference, chat_settings, stored_problems
from qeval.compare.runs import LoadedRun
from qeval.results.metrics import describe
from qeval.results.samples import SampleRecord
from qeval.results.schema import Results, SetupResult


@dataclass
class TaskDelta:
    """One setup on one task: the later run (b) minus the reference run (a)."""

    setup: str
    task: str
    metric: str
    higher_is_better: bool
    value_a: float | None
    value_b: float | None
    delta: float | None
    ci: tuple[float, float] | None
    #: e.g. "paired, newcombe", "unpaired, welch"; "" when nothing could be computed
    method: str
    paired: bool
    #: why the documents were not paired (different data, no common document, no records)
    unpaired_reason: str | None
    n_a: int
    n_b: int
    n_paired: int | None
    p_value: float | None = None
    flips_to_wrong: int | None = None
    flips_to_right: int | None = None
    #: `--fail-on-regression`: "worse" (the whole 95% interval beyond the margin), "not worse"
    #: (within it), "inconclusive", "unchecked" (no evidence to decide: `problem`); None without
    #: a margin
    verdict: str | None = None
    #: why this setup and task could not be checked (not scored in this run, records that are
    #: not what results.json reports, too few documents...): a gate counts it as not checked
    problem: str | None = None


@dataclass
class SetupPair:
    """One setup in both runs, or in one of them only."""

    setup: str
    status_a: str | None
    status_b: str | None
    tasks: list[TaskDelta]
    note: str | None = None

    def regressions(self) -> list[str]:
        """What got worse beyond the margin, one line each (a setup that stopped working too)."""
        out = (
            [f"{self.setup}: ok in the reference run, failed in this one"]
            if self.status_a == "ok" and self.status_b == "failed"
            else []
        )
        return out + [
            f"{self.setup} · {t.task}: {t.metric} {_fmt_delta(t)} ({t.method})"
            for t in self.tasks
            if t.verdict == "worse"
        ]

    def unchecked(self) -> list[str]:
        """What the reference run holds that could not be checked here, one line each: a setup
        ok in the reference and absent here, and each task without the evidence to decide."""
        if self.status_a == "ok" and self.status_b is None:
            return [f"{self.setup}: ok in the reference run, not scored in this one"]
        return [f"{self.setup} · {t.task}: {t.problem}" for t in self.tasks if t.problem and t.verdict != "worse"]


def _fmt_delta(t: TaskDelta) -> str:
    m = describe(t.metric, t.higher_is_better)
    if t.delta is None or t.ci is None:
        return "—"
    return f"{m.fmt_delta(t.delta)} [{m.fmt_delta(t.ci[0], unit=False)}, {m.fmt_delta(t.ci[1], unit=False)}]"


def compare_setups(a: LoadedRun, b: LoadedRun, margin: float | None) -> list[SetupPair]:
    """Every setup of either run, by name: its tasks compared where it scored in both."""
    names = list(dict.fromkeys([s.name for s in a.results.setups] + [s.name for s in b.results.setups]))
    pairs = []
    for name in names:
        sa, sb = _setup(a.results, name), _setup(b.results, name)
        if sa is None or sb is None:
            pairs.append(
                SetupPair(
                    name,
                    sa.status if sa else None,
                    sb.status if sb else None,
                    [],
                    note=f"only in {'the reference run' if sb is None else 'this run'}",
                )
            )
            continue
        note = None
        if sa.spec.id != sb.spec.id:
            note = f"the setup's spec changed (id {sa.spec.id} → {sb.spec.id})"
        tasks = [_task(a, b, sa, sb, t, margin) for t in _common_tasks(a.results, b.results, sa, sb)]
        if sa.status == "ok" and sb.status == "ok":
            tasks += [_missing(a, b, sa, t, margin) for t in _reference_only(a.results, b.results, sa, sb)]
        pairs.append(SetupPair(name, sa.status, sb.status, tasks, note))
    return pairs


def _setup(results: Results, name: str) -> SetupResult | None:
    return next((s for s in results.setups if s.name == name), None)


def _common_tasks(a: Results, b: Results, sa: SetupResult, sb: SetupResult) -> list[str]:
    """Tasks both runs scored for this setup: the config's own and lm-eval groups, each once
    (a group's members are in the group)."""
    return [
        t for t, info in a.tasks.items() if t in b.tasks and t in sa.tasks and t in sb.tasks and info.entry in (None, t)
    ]


def _reference_only(a: Results, b: Results, sa: SetupResult, sb: SetupResult) -> list[str]:
    """Config entries the reference scored for this setup that this run did not."""
    common = set(_common_tasks(a, b, sa, sb))
    return [t for t, info in a.tasks.items() if t in sa.tasks and info.entry in (None, t) and t not in common]


def _missing(a: LoadedRun, b: LoadedRun, sa: SetupResult, task: str, margin: float | None) -> TaskDelta:
    """A row for a task the reference scored and this run did not: nothing checked it."""
    info = a.results.tasks[task]
    metric = info.compared_metric
    value = sa.tasks[task].metrics.get(metric)
    why = "not scored for this setup in this run" if task in b.results.tasks else "not among this run's tasks"
    return _unchecked(
        _uncomputed(
            sa.name,
            task,
            metric,
            describe(metric, info.higher_is_better).higher_is_better,
            (value.value if value else None, None),
            (sa.tasks[task].n, 0),
        ),
        why,
        margin,
    )


def _uncomputed(
    setup: str,
    task: str,
    metric: str,
    hib: bool,
    values: tuple[float | None, float | None],
    ns: tuple[int, int],
    reason: str | None = None,
) -> TaskDelta:
    """A row with nothing computed from the records: the two sides' values (where reported) and
    document counts, no difference, no interval, not paired (what a computed row starts from)."""
    return TaskDelta(setup, task, metric, hib, *values, None, None, "", False, reason, *ns, None)


def _unchecked(t: TaskDelta, problem: str, margin: float | None) -> TaskDelta:
    t.problem, t.verdict = problem, None if margin is None else "unchecked"
    return t


def _task(a: LoadedRun, b: LoadedRun, sa: SetupResult, sb: SetupResult, task: str, margin: float | None) -> TaskDelta:
    info_a, info_b = a.results.tasks[task], b.results.tasks[task]
    metric = info_a.compared_metric
    desc = describe(metric, info_a.higher_is_better)
    hib = desc.higher_is_better
    if info_b.compared_metric != metric:
        return _other_metric(sa, sb, task, metric, hib, info_b.compared_metric, margin)
    problems = [f"reference run: {p}" for p in stored_problems(a, sa, task)] + [
        f"this run: {p}" for p in stored_problems(b, sb, task)
    ]
    if problems:  # the records are not what results.json reports: no number is taken from them
        return _unchecked(_reported(sa, sb, task, metric, hib), "; ".join(problems), margin)
    ra, rb = a.records(sa.name, task, metric), b.records(sb.name, task, metric)
    reason = None
    if info_a.fingerprint != info_b.fingerprint:
        reason = (
            f"different documents or prompting (data fingerprint {info_a.fingerprint[:12]} → {info_b.fingerprint[:12]})"
        )
    else:  # the fingerprint leaves the chat template and system prompt out: compared here
        reason = chat_difference(chat_settings(a, sa.name, task), chat_settings(b, sb.name, task))
    if not ra or not rb:
        return _from_scores(sa, sb, task, metric, hib, "no per-document records", margin)
    if reason is None:
        data = paired_records(ra, rb, metric)
        if data is not None:
            seed = a.results.config.seed
            c = compare(data, task, seed or 0, gates=[], higher_is_better=info_a.higher_is_better)
            return _paired(sa, task, metric, hib, data, c, (len(ra), len(rb)), margin)
        reason = "no document pairs (ids or prompts differ)"
    return _unpaired(sa, task, metric, hib, ra, rb, reason, margin)


def _other_metric(
    sa: SetupResult, sb: SetupResult, task: str, metric: str, hib: bool, other: str, margin: float | None
) -> TaskDelta:
    """A row left unchecked: the two runs compared the task on different metrics."""
    return _unchecked(
        _uncomputed(sa.name, task, metric, hib, (None, None), (sa.tasks[task].n, sb.tasks[task].n)),
        f"compared on {metric} in the reference run, on {other} here",
        margin,
    )


def _paired(
    sa: SetupResult,
    task: str,
    metric: str,
    hib: bool,
    data: Paired,
    c: Comparison,
    n_records: tuple[int, int],
    margin: float | None,
) -> TaskDelta:
    """A row compared document by document (`data`: the pairs, `c`: their comparison)."""
    row = replace(
        _uncomputed(sa.name, task, metric, hib, (data.base_value(), data.other_value()), n_records),
        delta=c.delta,
        ci=c.ci,
        method=f"paired, {c.ci_method}",
        paired=True,
        n_paired=c.n,
        p_value=c.p_value,
        flips_to_wrong=c.flips_to_wrong,
        flips_to_right=c.flips_to_right,
    )
    return _decided(row, margin, c.n)


def _unpaired(
    sa: SetupResult,
    task: str,
    metric: str,
    hib: bool,
    ra: list[SampleRecord],
    rb: list[SampleRecord],
    reason: str,
    margin: float | None,
) -> TaskDelta:
    """A row compared as two independent samples, and why they could not be paired."""
    va, da = document_values(ra, metric)
    vb, db = document_values(rb, metric)
    d = unpaired_difference(va, vb, metric, da, db)
    value_a = float(va.sum() / da.sum()) if da is not None else float(va.mean())
    value_b = float(vb.sum() / db.sum()) if db is not None else float(vb.mean())
    row = replace(
        _uncomputed(sa.name, task, metric, hib, (value_a, value_b), (d.n_a, d.n_b), reason),
        delta=d.delta,
        ci=d.ci,
        method=f"unpaired, {d.method}",
        p_value=d.p_value,
    )
    return _decided(row, margin, min(d.n_a, d.n_b))


def _reported(sa: SetupResult, sb: SetupResult, task: str, metric: str, hib: bool) -> TaskDelta:
    """A row with the two reported scores and nothing computed from the records."""
    ma, mb = sa.tasks[task].metrics.get(metric), sb.tasks[task].metrics.get(metric)
    values = (ma.value if ma else None, mb.value if mb else None)
    return _uncomputed(sa.name, task, metric, hib, values, (sa.tasks[task].n, sb.tasks[task].n))


def _from_scores(
    sa: SetupResult, sb: SetupResult, task: str, metric: str, hib: bool, reason: str, margin: float | None
) -> TaskDelta:
    """No per-document records on a side: the difference of the two reported scores, with a
    normal interval from their standard errors where both have one."""
    ma, mb = sa.tasks[task].metrics.get(metric), sb.tasks[task].metrics.get(metric)
    na, nb = sa.tasks[task].n, sb.tasks[task].n
    if ma is None or mb is None:
        return _unchecked(
            _uncomputed(sa.name, task, metric, hib, (None, None), (na, nb), reason),
            f"{metric} not reported on both sides",
            margin,
        )
    delta = mb.value - ma.value
    row = replace(_uncomputed(sa.name, task, metric, hib, (ma.value, mb.value), (na, nb), reason), delta=delta)
    if ma.stderr is None or mb.stderr is None or not all(map(math.isfinite, (delta, ma.stderr, mb.stderr))):
        return _unchecked(
            row,
            "no per-document records and no standard errors to compare",
            margin,
        )
    half = 1.959963984540054 * float(np.hypot(ma.stderr, mb.stderr))
    row = replace(row, ci=(delta - half, delta + half), method="unpaired, normal (reported standard errors)")
    return _decided(row, margin, min(na, nb))


def _decided(t: TaskDelta, margin: float | None, n: int) -> TaskDelta:
    """The row with the non-inferiority verdict of the later run against the reference, in words;
    on fewer than MIN_PAIRED_N documents nothing is decided: not checked, as a gate is not."""
    few = small_sample_reason(n)
    if few is not None:
        return _unchecked(t, few, margin)
    if margin is not None and t.ci is not None:
        t.verdict = {"pass": "not worse", "fail": "worse", "inconclusive": "inconclusive"}[
            verdict(t.ci, t.higher_is_better, margin)
        ]
    return t
