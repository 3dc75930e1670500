"""The same setup on the same task in two runs: paired by document where both runs scored the
same data (the statistics a setup gets against its baseline, docs/statistics.md), unpaired and
said so where they did not, and whether the later run got worse beyond a margin."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qeval.analysis.comparison import compare, document_values, paired_records
from qeval.analysis.stats import small_sample_reason, unpaired_difference, verdict
from qeval.compare.runs import LoadedRun
from qeval.results.metrics import metric as describe
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
    #: (within it), "inconclusive"; None without a margin
    verdict: str | None = None


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
        out = [f"{self.setup}: ok in the reference run, failed in this one"] \
            if self.status_a == "ok" and self.status_b == "failed" else []
        return out + [f"{self.setup} · {t.task}: {t.metric} {_fmt_delta(t)} ({t.method})"
                      for t in self.tasks if t.verdict == "worse"]


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
            pairs.append(SetupPair(name, sa.status if sa else None, sb.status if sb else None, [],
                                   note=f"only in {'the reference run' if sb is None else 'this run'}"))
            continue
        note = None
        if sa.spec.get("id") != sb.spec.get("id"):
            note = f"the setup's spec changed (id {sa.spec.get('id')} -> {sb.spec.get('id')})"
        tasks = [_task(a, b, sa, sb, t, margin) for t in _common_tasks(a.results, b.results, sa, sb)]
        pairs.append(SetupPair(name, sa.status, sb.status, tasks, note))
    return pairs


def _setup(results: Results, name: str) -> SetupResult | None:
    return next((s for s in results.setups if s.name == name), None)


def _common_tasks(a: Results, b: Results, sa: SetupResult, sb: SetupResult) -> list[str]:
    """Tasks both runs scored for this setup: the config's own and lm-eval groups, each once
    (a group's members are in the group)."""
    return [t for t, info in a.tasks.items()
            if t in b.tasks and t in sa.tasks and t in sb.tasks and info.entry in (None, t)]


def _task(a: LoadedRun, b: LoadedRun, sa: SetupResult, sb: SetupResult, task: str,
          margin: float | None) -> TaskDelta:
    info_a, info_b = a.results.tasks[task], b.results.tasks[task]
    metric = info_a.compared_metric
    desc = describe(metric, info_a.higher_is_better)
    hib = desc.higher_is_better
    if info_b.compared_metric != metric:
        return TaskDelta(sa.name, task, metric, hib, None, None, None, None, "", False,
                         f"compared on {metric} in the reference run, on {info_b.compared_metric} here",
                         sa.tasks[task].n, sb.tasks[task].n, None)
    ra, rb = a.records(sa.name, task), b.records(sb.name, task)
    same_data = info_a.fingerprint == info_b.fingerprint
    reason = None if same_data else (f"different documents or prompting (data fingerprint {info_a.fingerprint[:12]} "
                                     f"-> {info_b.fingerprint[:12]})")
    if not ra or not rb:
        return _from_scores(sa, sb, task, metric, hib, "no per-document records", margin)
    if same_data:
        data = paired_records(ra, rb, metric)
        if data is not None:
            seed = int(a.results.config.get("seed", 0))
            c = compare(data, task, seed, gates=[], higher_is_better=info_a.higher_is_better)
            return TaskDelta(sa.name, task, metric, hib, data.base_value(), data.other_value(), c.delta, c.ci,
                             f"paired, {c.ci_method}", True, None, len(ra), len(rb), c.n, c.p_value,
                             c.flips_to_wrong, c.flips_to_right, _verdict(c.ci, hib, margin, c.n))
        reason = "no document pairs (ids or prompts differ)"
    va, da = document_values(ra, metric)
    vb, db = document_values(rb, metric)
    d = unpaired_difference(va, vb, metric, da, db)
    value_a = float(va.sum() / da.sum()) if da is not None else float(va.mean())
    value_b = float(vb.sum() / db.sum()) if db is not None else float(vb.mean())
    return TaskDelta(sa.name, task, metric, hib, value_a, value_b, d.delta, d.ci, f"unpaired, {d.method}", False,
                     reason, d.n_a, d.n_b, None, d.p_value, verdict=_verdict(d.ci, hib, margin, min(d.n_a, d.n_b)))


def _from_scores(sa: SetupResult, sb: SetupResult, task: str, metric: str, hib: bool, reason: str,
                 margin: float | None) -> TaskDelta:
    """No per-document records on a side: the difference of the two reported scores, with a
    normal interval from their standard errors where both have one."""
    ma, mb = sa.tasks[task].metrics.get(metric), sb.tasks[task].metrics.get(metric)
    na, nb = sa.tasks[task].n, sb.tasks[task].n
    if ma is None or mb is None:
        return TaskDelta(sa.name, task, metric, hib, None, None, None, None, "", False, reason, na, nb, None)
    delta = mb.value - ma.value
    ci = None
    if ma.stderr is not None and mb.stderr is not None:
        half = 1.959963984540054 * float(np.hypot(ma.stderr, mb.stderr))
        ci = (delta - half, delta + half)
    return TaskDelta(sa.name, task, metric, hib, ma.value, mb.value, delta, ci,
                     "unpaired, normal (reported standard errors)" if ci else "", False, reason, na, nb, None,
                     verdict=_verdict(ci, hib, margin, min(na, nb)) if ci else None)


def _verdict(ci: tuple[float, float], higher_is_better: bool, margin: float | None, n: int) -> str | None:
    """The non-inferiority verdict of the later run against the reference, in words; on fewer
    than MIN_PAIRED_N documents inconclusive whatever the interval says, as a gate is."""
    if margin is None:
        return None
    if small_sample_reason(n) is not None:
        return "inconclusive"
    return {"pass": "not worse", "fail": "worse", "inconclusive": "inconclusive"}[verdict(ci, higher_is_better, margin)]
