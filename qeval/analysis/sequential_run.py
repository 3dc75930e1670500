"""A sequential run's plan and its cells (docs/statistics.md, "Sequential gates"; docs/architecture.md,
"Sequential runs"): which (setup, task, gate) cells are decided sequentially, the documents' seeded
order, the monitor a worker asks after each chunk whether a task is decided, and the trajectory
assembly reads back from the stored records.

The design: the run goes in passes, each with a document horizon (qeval/run/passes.py; its
`horizon` travels in the plan of each pass's jobs, in no resume key). In a pass the baseline scores
each sequential task in the seeded order up to the horizon (at most the cap: `max_docs`, else the
whole set), carrying on from the pass before, before any other setup (their jobs wait for it);
each other setup scores in the same order and chunks, and after each chunk tests each of its
undecided cells against the baseline's stored records; a task whose cell is decided stops, an
undecided one at the horizon. The next pass extends only the tasks of cells still undecided below
the cap, so the baseline scores each task only as far as the furthest undecided setup needs.
Assembly recomputes each cell's trajectory from the stored records (the same numbers, no state to
keep) and says how far the baseline scored each task.

Which cells: tasks of the lm_eval and native kinds (not part of an lm-eval group) and lm-eval
groups (MMLU's 57 subjects) whose compared metric is bounded in [0, 1]
(qeval/analysis/sequential.py `sequential_metric`) and that a gate covers: native multiple-choice
and generation tasks are scored in the same order and chunks (qeval/tasks/sequential.py). A group
is decided on its pooled documents, as the fixed run judges it: its members' documents are put in
one seeded order over the pooled set (`group_order`), cut at the cap, so every chunk is a random
sample of the group with each member in proportion, and the group's sequence runs over the pooled
paired differences. Long-context tasks (passkey, multikey at each length) are cells as native
tasks are, scored by the same loop. Bits per byte is judged by the fixed-n interval at the end, as
without the switch (native and long-context perplexity tasks scored whole); multi-turn tasks are
scored whole, as without the switch."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from qeval.analysis.comparison import paired_records
from qeval.analysis.sequential import Trajectory, cell_level, decided_looks, gate_score, sequential_metric, to_unit
from qeval.analysis.sequential import trajectory as cell_trajectory
from qeval.config.gates import Gate
from qeval.config.sequential import CellPlan, SequentialPlan
from qeval.errors import UserError
from qeval.records.keys import SetupKeys
from qeval.results.metrics import describe
from qeval.results.samples import SampleRecord
from qeval.results.sequential import SequentialBaseline, SequentialCell, SequentialLook, SequentialRun

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.records.preflight import Preflight
    from qeval.records.store import RunStore
    from qeval.results.schema import Comparison, Results, SetupResult

#: the task kinds whose scoring loops take the order and stop (lm-eval's chunked loop;
#: qeval/tasks/sequential.py for the native and long-context kinds, qeval-form tasks both)
SEQUENTIAL_KINDS = ("lm_eval", "native", "long_context")


def not_sequential(kind: str, in_group: bool, metric: str) -> str | None:
    """Why a gated task is judged by the fixed-n interval at the end even in a sequential run
    (docs/statistics.md, "Sequential gates", "What is not sequential"), or None: it is a cell."""
    if kind not in SEQUENTIAL_KINDS:
        return (
            f"a {kind} task: its scoring loop takes no seeded order and no looks; scored whole "
            "(or to `limit`), judged by the fixed-n interval"
        )
    if in_group:
        return (
            "an lm-eval group member: scored in its group's seeded order (the group, gated, is decided on its "
            "pooled documents); its own gate is judged by the fixed-n interval on the documents scored"
        )
    if not sequential_metric(metric.split(",", 1)[0]):
        return f"{metric}: not bounded in [0, 1], no confidence sequence; judged by the fixed-n interval at the cap"
    return None


def _member(task: Any) -> bool:
    """Whether `task` is an lm-eval group's member (a long-context task's entry is its family)."""
    return bool(task.kind == "lm_eval" and task.entry != task.name)


def task_gate(gates: list[Gate], task: str) -> Gate | None:
    """The gate that covers `task`, as the comparison picks it (qeval/analysis/comparison.py): a
    gate at a generated position judges its bucket's divergence, not the task's score (a gate at a
    length is one on that length's long-context task: qeval/tasks/long_context/tasks.py)."""
    score_gates = [g for g in gates if g.position is None]
    return next((g for g in score_gates if g.task == task), None) or next(
        (g for g in score_gates if g.task == "all"), None
    )


def plan(pre: Preflight) -> SequentialPlan | None:
    """The run's sequential plan (the worker's job carries it), or None when the switch is
    off: the level each cell runs at (`cell_level` over every (setup, task, gate) cell), each
    sequential task's (or group's) gate, metric and direction, and every lm-eval group's members
    with their document counts (what its pooled order is drawn over)."""
    cfg = pre.cfg
    if not cfg.sequential_on or cfg.sequential is None:
        return None
    tasks: dict[str, CellPlan] = {}

    def add(name: str, gate: Gate, metric: str, n_docs: int, members: list[str] | None = None) -> None:
        hib = describe(metric).higher_is_better
        tasks[name] = CellPlan(gate=gate, metric=metric, n_docs=n_docs, higher_is_better=hib, members=members)

    for t in pre.tasks:
        gate = task_gate(cfg.gates, t.name)
        if gate is not None and not_sequential(t.kind, _member(t), t.compared_metric) is None:
            add(t.name, gate, t.compared_metric, t.n_docs)
    infos = {t.name: t for t in pre.tasks}
    groups: dict[str, list[tuple[str, int]]] = {
        g: [(m, infos[m].n_docs) for m in members if m in infos] for g, members in (pre.groups or {}).items()
    }
    for group, members in groups.items():
        gate = task_gate(cfg.gates, group)
        metric = group_metric(pre, group)
        if gate is not None and metric is not None and members:
            add(group, gate, metric, sum(n for _, n in members), members=[m for m, _ in members])
    others = [s for s in cfg.setups if s.name != cfg.baseline.name]
    cells = len(others) * len(tasks)
    spec = cfg.sequential
    return SequentialPlan(
        alpha=cell_level(spec.level, cells),
        cells=cells,
        **spec.settings(),
        tasks=tasks,
        groups=groups,
    )


def group_metric(pre: Preflight, group: str) -> str | None:
    """The metric a group's cell is decided on (its first member's, as assembly judges the group:
    qeval/analysis/assemble.py), or None where the group cannot be a cell: a member of another
    kind or metric, or a metric not bounded in [0, 1]."""
    infos = {t.name: t for t in pre.tasks}
    members = [infos[m] for m in (pre.groups or {}).get(group, []) if m in infos]
    if not members:
        return None
    metric = members[0].compared_metric
    same = all(m.kind == "lm_eval" and m.compared_metric == metric for m in members)
    return metric if same and sequential_metric(metric.split(",", 1)[0]) else None


def check(pre: Preflight) -> list[str]:
    """At preflight: a config that switches the block on but has no task a gate could decide
    sequentially is refused in one line (with what the run would have judged by the fixed-n
    interval instead), rather than run as a fixed run the results call sequential. Returns the
    warnings to print: cells with fewer documents (`limit`, the set) than the floor, which no look
    can decide (scored whole and reported "not decided after 6 of 6 documents")."""
    p = plan(pre)
    if p is None:
        return []
    run = set(pre.run_tasks)
    for group, spec in p.tasks.items():  # a group cell is scored and decided whole, or not at all
        some = [m for m in spec.members or [] if m in run]
        if some and len(some) < len(spec.members or []):
            raise UserError(
                f"--tasks: {some[0]} is a member of the lm-eval group {group}, which a sequential run decides "
                f"as one cell on its pooled documents: name {group} in --tasks (all its members), or switch "
                "sequential off"
            )
    if p.tasks:
        return [
            f"sequential: {t} has {n} documents, under min_docs {p.min_docs}: its cells cannot be decided "
            "(inconclusive at the end)"
            for t, n in cell_caps(p).items()
            if n < p.min_docs
        ]
    why: dict[str, str] = {}
    for t in pre.tasks:
        if _member(t):  # a group's member: named where a gate names it, else its group (below)
            if any(g.task == t.name for g in pre.cfg.gates):
                why[t.name] = f"a member of the lm-eval group {t.entry}"
            continue
        if task_gate(pre.cfg.gates, t.name) is None:
            continue
        kind_ok = t.kind in SEQUENTIAL_KINDS
        why[t.name] = f"{t.compared_metric} is not bounded in [0, 1]" if kind_ok else f"a {t.kind} task"
    for group in pre.groups or {}:
        if task_gate(pre.cfg.gates, group) is not None:
            why[group] = "an lm-eval group whose members' metric is not one bounded in [0, 1]"
    found = "; ".join(f"{name}: {reason}" for name, reason in why.items()) or "no gate covers any task"
    raise UserError(
        f"sequential: enabled, but no task can be decided sequentially ({found}); only lm-eval tasks and "
        "groups, native tasks and long-context ones (passkey, multikey), on a metric in [0, 1], with a gate, can: "
        "gate one, or remove the block"
    )


def with_keys(pre: Preflight, keys: dict[str, SetupKeys], plan_json: SequentialPlan) -> dict[str, SetupKeys]:
    """The run's resume keys with the sequential parts (only while the switch is on): every task's
    the order, chunks and cap (a group member's also its group: its documents are drawn from the
    group's pooled order); a setup other than the baseline's also the level over the run's cells
    and the floor, and for each of its cells the gate and the baseline's key of the task (of every
    member, for a group), which change where it stops."""
    spec, base = pre.cfg.sequential, pre.cfg.baseline.name
    assert spec is not None

    def with_part(k: SetupKeys, part: Callable[[str], str]) -> SetupKeys:
        return SetupKeys(k.parts, {t: p | {"sequential": part(t)} for t, p in k.tasks.items()})

    group_of = plan_json.group_of()
    order = spec.order_part()

    def ordered(t: str) -> str:
        return order + (f",group={group_of[t]}" if t in group_of else "")

    base_keys = with_part(keys[base], ordered)
    stop = "," + spec.stop_part(plan_json.cells)
    return {
        name: base_keys
        if name == base
        else with_part(k, lambda t: ordered(t) + stop + _cell_part(plan_json, group_of.get(t, t), base_keys))
        for name, k in keys.items()
    }


def _cell_part(plan_json: SequentialPlan, cell_name: str, base_keys: SetupKeys) -> str:
    """What else changes where a setup other than the baseline stops a cell: the gate it is tested
    against and the baseline's records it is paired with (records that stopped at a 50-point gate,
    or against another baseline, are no run at a 5-point one: they would be read back as "not
    decided after 8 of 24 documents", never scored further). Empty for a task that is no cell."""
    spec = plan_json.tasks.get(cell_name)
    if spec is None:
        return ""
    gate = ",".join(f"{k}={v!r}" for k, v in sorted(spec.gate.model_dump(mode="json").items()) if v is not None)
    members = spec.members
    if members is None:
        return f",gate=({gate}),baseline={base_keys.task_key(cell_name)}"
    pooled = hashlib.sha256(",".join(base_keys.task_key(m) for m in members).encode()).hexdigest()[:16]
    return f",gate=({gate}),baseline={pooled}"


def widen(plan_json: SequentialPlan | None, pending: Mapping[str, str], key: Callable[[str], str]) -> dict[str, str]:
    """The tasks a setup other than the baseline scores (task -> key): a group cell's members all
    together, or none, since its monitor pools them chunk by chunk (a member stored and another
    not, by a worker killed between the two, are scored again together: the saved chunks carry
    both on, and the stop comes at the same look)."""
    out = dict(pending)
    for spec in (plan_json.tasks if plan_json is not None else {}).values():
        members = spec.members or []
        if any(m in pending for m in members):
            out |= {m: key(m) for m in members if m not in out}
    return out


def group_order(
    seed: int, group: str, members: Sequence[Sequence[Any]], cap: int | None = None
) -> list[tuple[str, int]]:
    """A group's documents, (member, index), in one seeded random order over the pooled set (the
    seed and the group's name), cut at the cap: every prefix is a random sample of the group, each
    member in proportion, which the group's pooled sequence needs. `members`: [member, n_docs]."""
    pooled = [(str(m), i) for m, n in members for i in range(int(n))]
    return [pooled[i] for i in seeded_order(seed, group, len(pooled), cap)]


def group_ids(plan_json: SequentialPlan, group: str) -> list[str]:
    """A group's pooled order as ids `member/index`: what its members' records are paired and
    ordered by once pooled (`pooled`)."""
    members = plan_json.groups[group]
    return [f"{m}/{i}" for m, i in group_order(plan_json.seed, group, members, plan_json.max_docs)]


def pooled(records: Mapping[str, list[SampleRecord]]) -> list[SampleRecord]:
    """Members' records as one task's: ids made `member/id`, unique across the group."""
    return [r.model_copy(update={"sample_id": f"{m}/{r.sample_id}"}) for m, recs in records.items() for r in recs]


def cell_records(
    plan_json: SequentialPlan,
    cell_name: str,
    read: Callable[[str], list[SampleRecord]],
    order: Sequence[int | str] | None = None,
) -> list[SampleRecord]:
    """The one reader of a cell's records: a task's as `read` gives them, a group's members pooled
    (ids `member/id`, as its order's); with `order`, sorted in that seeded order (ids outside it
    last), the order the cell's sequence consumes its pairs in."""
    members = plan_json.tasks[cell_name].members
    records = read(cell_name) if members is None else pooled({m: read(m) for m in members})
    if order is None:
        return records
    rank = {str(d): i for i, d in enumerate(order)}
    return sorted(records, key=lambda r: rank.get(r.sample_id, len(rank)))


def leaf_chunks(plan_json: SequentialPlan, n_docs: Mapping[str, int]) -> dict[str, list[list[int]]]:
    """Per lm-eval leaf (its document count), its documents chunk by chunk in the run's order: a
    leaf outside groups, the next `chunk_docs` of its own seeded order (`document_order`); a group
    member, its share of each chunk of its group's pooled order (`group_order`: possibly none), so
    every member of a group has the group's number of chunks."""
    c, cap, seed = plan_json.chunk_docs, plan_json.max_docs, plan_json.seed
    out: dict[str, list[list[int]]] = {}
    for group, members in plan_json.groups.items():
        if not any(m in n_docs for m, _ in members):
            continue
        order = group_order(seed, group, members, cap)
        shares: dict[str, list[list[int]]] = {m: [[] for _ in range(0, len(order), c)] for m, _ in members}
        for k, (m, i) in enumerate(order):
            shares[m][k // c].append(i)
        out |= {m: shares[m] for m in shares if m in n_docs}
    for leaf, n in n_docs.items():
        if leaf not in out:
            order_ = seeded_order(seed, leaf, n, cap)
            out[leaf] = [order_[k : k + c] for k in range(0, len(order_), c)]
    return out


def capped_docs(plan_json: SequentialPlan, n_docs: Mapping[str, int]) -> dict[str, int]:
    """Per lm-eval leaf (or task), the documents a setup scores of it at most: the cap, or a group
    member's share of its group's capped pooled order. Per cell: `cell_caps`."""
    return {t: sum(len(c) for c in chunks) for t, chunks in leaf_chunks(plan_json, n_docs).items()}


def cell_caps(plan_json: SequentialPlan) -> dict[str, int]:
    """Per cell (a task, or a group over its pooled set), the documents it is scored to at most:
    `max_docs`, else the whole set (what `seeded_order` and `group_order` cut at)."""
    cap = plan_json.max_docs
    return {t: min(spec.n_docs, cap or spec.n_docs) for t, spec in plan_json.tasks.items()}


def cell_members(plan_json: SequentialPlan, cell_name: str) -> list[str]:
    """The tasks a cell's records are stored under: a group's members, or the task itself."""
    return plan_json.tasks[cell_name].units(cell_name)


def document_order(cfg: RunConfig, task: str, n_docs: int) -> list[int]:
    """The task's documents (their indices) in the run's seeded random order, cut at the cap: what
    every setup scores, in this order. Seeded by the seed and the task's name, so a task's order
    does not depend on which other tasks the run has."""
    assert cfg.sequential is not None
    return seeded_order(cfg.sequential.seed, task, n_docs, cfg.sequential.max_docs)


def seeded_order(seed: int, task: str, n_docs: int, cap: int | None = None) -> list[int]:
    """`document_order` from its parts: the permutation of the task's `n_docs` documents that the
    seed and the task's name fix, cut at `cap` (bench/sequential_replay.py replays a fixed run's
    whole set in it: exactly the documents, in the order, a sequential run would score)."""
    digest = hashlib.sha256(task.encode()).digest()
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    order = rng.permutation(n_docs)
    return [int(i) for i in (order[:cap] if cap else order)]


def task_order(plan_json: SequentialPlan, task: Any) -> tuple[list[str], list[int]]:
    """A task's documents in the run's seeded order, cut at the cap: their sample ids (what the
    records are paired and ordered by) and their indices in the set. An lm-eval document's id is
    its index; a native task's is its `doc_id` (the data's id field, else its index)."""
    order = seeded_order(plan_json.seed, task.name, task.n_docs, plan_json.max_docs)
    doc_id = getattr(task, "doc_id", None)
    return ([str(doc_id(i)) for i in order] if callable(doc_id) else [str(i) for i in order]), order


def looks(n_scored: int, chunk_docs: int) -> list[int]:
    """The document counts a cell was looked at: after each chunk, and at the last document."""
    out = list(range(chunk_docs, n_scored + 1, chunk_docs))
    return out + [n_scored] if n_scored and (not out or out[-1] != n_scored) else out


def _cell_score(spec: CellPlan, base: np.ndarray, other: np.ndarray) -> Any:
    gate = spec.gate
    return gate_score(base, other, spec.higher_is_better, gate.max_drop, gate.relative, gate.min_recovery)


def _ordered(
    base_records: list[SampleRecord], other_records: list[SampleRecord], metric: str, order: Sequence[int | str]
) -> tuple[np.ndarray, np.ndarray] | None:
    """The two sides' values on the documents the setup scored, in the run's order (the order the
    sequence is computed in), or None where some document does not pair.

    Both sides are put in the seeded order: `paired_records` walks the baseline's records, and a
    baseline stored in another order (a group pooled member after member, an lm-eval chunk sorted
    by id) would feed the capital process its pairs subject by subject, which breaks the
    sequence's exchangeability assumption (P(any wrong verdict) <= level no longer holds)."""
    rank = {str(d): i for i, d in enumerate(order)}
    unranked = len(rank)

    def seeded(records: list[SampleRecord]) -> list[SampleRecord]:
        return sorted(records, key=lambda r: rank.get(r.sample_id, unranked))

    data = paired_records(seeded(base_records), seeded(other_records), metric)
    if data is None or len(data.base) != len(other_records):
        return None
    return data.base, data.other


def _bounded(metric: str, values: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether both sides' values lie in [0, 1], as the sequence's bet needs (the plan checked
    the metric's name only: a task's metric named `acc` could still hold 0-100 values)."""
    return all(sequential_metric(metric, v) for v in values)


def unbounded(metric: str, base_records: list[SampleRecord], other_records: list[SampleRecord]) -> bool:
    """Whether the two sides' stored values of `metric` leave [0, 1]: such a cell is never stopped
    early and is judged by the fixed-n interval at the cap."""
    values = _ordered(base_records, other_records, metric, [r.sample_id for r in other_records])
    return values is not None and not _bounded(metric, values)


def cell(
    plan_json: SequentialPlan,
    task: str,
    order: Sequence[int | str],
    base_records: list[SampleRecord],
    other_records: list[SampleRecord],
) -> Trajectory | None:
    """The cell's trajectory from the stored records: its sequence at every look and where it
    stopped; None where the documents do not pair."""
    spec = plan_json.tasks[task]
    values = _ordered(base_records, other_records, spec.metric, order)
    if values is None or not _bounded(spec.metric, values):
        return None
    score = _cell_score(spec, *values)
    return cell_trajectory(score, looks(len(values[0]), plan_json.chunk_docs), plan_json.alpha, plan_json.min_docs)


class Monitor:
    """What a worker asks after each chunk: is this task's cell decided? It holds the baseline's
    records, each cell's order (a group's: its pooled ids, `group_ids`; its records `pooled`), and
    the setup's records so far."""

    def __init__(
        self,
        plan_json: SequentialPlan,
        orders: Mapping[str, Sequence[int | str]],
        baseline_records: dict[str, list[SampleRecord]],
    ) -> None:
        self.plan = plan_json
        self.orders = orders
        self.base = baseline_records
        self.seen: dict[str, list[SampleRecord]] = {}

    @classmethod
    def for_leaves(
        cls, plan_json: SequentialPlan, leaves: Sequence[str], baseline: Callable[[str], list[SampleRecord]]
    ) -> Monitor:
        """The monitor of an lm-eval scoring of `leaves`: each cell among them (a leaf, or a group
        whose members are all there), its order's ids and the baseline's stored records."""
        orders: dict[str, Sequence[int | str]] = {}
        base: dict[str, list[SampleRecord]] = {}
        for name, spec in plan_json.tasks.items():
            members = spec.members
            if members is None and name in leaves:
                orders[name] = [str(i) for i in seeded_order(plan_json.seed, name, spec.n_docs, plan_json.max_docs)]
            elif members is not None and all(m in leaves for m in members):
                orders[name] = group_ids(plan_json, name)
            else:
                continue
            base[name] = cell_records(plan_json, name, baseline, orders[name])
        return cls(plan_json, orders, base)

    def chunk(self, added: Mapping[str, list[SampleRecord]]) -> set[str]:
        """A chunk's new records per lm-eval leaf (or, on resume, all each has so far); the leaves
        that stop: each whose cell is decided (a group's: all its members, on the pooled records)."""
        group_of = self.plan.group_of()
        by_cell: dict[str, list[SampleRecord]] = {}
        for leaf, records in added.items():
            group = group_of.get(leaf)
            if group is not None and group in self.plan.tasks:
                by_cell.setdefault(group, []).extend(pooled({leaf: records}))
            else:
                by_cell.setdefault(leaf, []).extend(records)
        done: set[str] = set()
        for name, records in by_cell.items():
            if self.add(name, records):
                done |= set(self.plan.tasks[name].units(name))
        return done

    def sequential(self, task: str) -> bool:
        """Whether the task's cell is decided sequentially (else it scores to the cap)."""
        return task in self.plan.tasks and task in self.base and task in self.orders

    def add(self, task: str, records: list[SampleRecord]) -> bool:
        """The chunk's records of `task` (or, on resume, every record scored before); True once its
        cell is decided: the task stops."""
        if not self.sequential(task):
            return False
        seen = self.seen.setdefault(task, [])
        seen.extend(records)
        spec = self.plan.tasks[task]
        # the sequence runs in the order's own sequence (records within a chunk come sorted by id)
        values = _ordered(self.base[task], seen, spec.metric, self.orders[task])
        if values is None or not _bounded(spec.metric, values):  # out of [0, 1]: scored to the cap
            return False
        y, m0 = to_unit(_cell_score(spec, *values))
        at = np.array(looks(len(y), self.plan.chunk_docs))
        up, down = decided_looks(y, m0, self.plan.alpha, at)
        return bool(((up | down) & (at >= self.plan.min_docs)).any())


_UNBOUNDED = (
    "sequential: its {metric} values leave [0, 1], so no confidence sequence runs on them; scored to the "
    "cap and judged by the fixed-n interval there"
)


def results_block(results: Results, pre: Preflight, store: RunStore) -> Results:
    """results.json's `sequential` block, and each sequential cell's verdict in `vs_baseline` made the
    confidence sequence's (the comparison's `ci` stays the fixed-n interval on the documents scored,
    for reading; its verdict is not that interval's: after stopping on the data that interval is
    no longer a 95% one). Nothing changes while the switch is off."""
    plan_json = plan(pre)
    spec = pre.cfg.sequential
    if plan_json is None or spec is None:
        return results
    judge = _CellJudge(plan_json, pre, store)
    setups = [judge.setup(entry) for entry in results.setups]
    caps = capped_docs(plan_json, {t.name: t.n_docs for t in pre.tasks})
    scored, full = documents_scored(results.setups, caps, {t: i.n_docs for t, i in judge.infos.items()})
    block = SequentialRun(
        method="betting confidence sequence (Waudby-Smith & Ramdas 2023)",
        cell_level=plan_json.alpha,
        **spec.settings(),
        cells=judge.cells,
        documents=scored,
        total=full,
        not_sequential=_fixed_n(results, pre, plan_json, judge.off_range),
        baseline=_baseline_documents(results, plan_json, judge.base),
    )
    return results.model_copy(update={"setups": setups, "sequential": block})


class _CellJudge:
    """Each setup's sequential cells judged by their confidence sequences, the cells collected
    for the block, and the cells whose values left [0, 1] (judged at the cap by the fixed-n test)."""

    def __init__(self, plan_json: SequentialPlan, pre: Preflight, store: RunStore) -> None:
        self.plan, self.store = plan_json, store
        self.base = pre.cfg.baseline.name
        self.infos = {t.name: t for t in pre.tasks}
        self.cells: list[SequentialCell] = []
        self.off_range: dict[str, str] = {}

    def records(self, setup: str, name: str) -> list[SampleRecord]:
        return cell_records(self.plan, name, lambda t: self.store.read_samples(setup, t))

    def setup(self, entry: SetupResult) -> SetupResult:
        """`entry` with each sequential cell's verdict the confidence sequence's."""
        vs = dict(entry.vs_baseline)
        for task, cmp in entry.vs_baseline.items():
            if entry.name != self.base and task in self.plan.tasks and cmp.verdict is not None:
                vs[task] = self.comparison(entry.name, task, cmp)
        return entry.model_copy(update={"vs_baseline": vs})

    def comparison(self, setup: str, task: str, cmp: Comparison) -> Comparison:
        """One cell's comparison, its verdict the sequence's (its cell kept for the block)."""
        score_spec = self.plan.tasks[task]
        order = (
            group_ids(self.plan, task) if score_spec.members is not None else task_order(self.plan, self.infos[task])[0]
        )
        other, theirs = self.records(setup, task), self.records(self.base, task)
        traj = cell(self.plan, task, order, theirs, other)
        if traj is None and unbounded(score_spec.metric, theirs, other):
            # never stopped early (the monitor skips it): one look at the cap, a valid fixed-n test
            self.off_range[task] = _UNBOUNDED.format(metric=cmp.metric).removeprefix("sequential: ")
            return cmp.model_copy(update={"verdict_reason": _UNBOUNDED.format(metric=cmp.metric)})
        if traj is None:  # no sequence on these records: the fixed-n verdict is no sequential one
            return cmp.model_copy(
                update={"verdict": "inconclusive", "samples_to_decide": None} | unpaired(other, theirs)
            )
        n, total = len(other), len(order)
        state = "decided" if traj.stopped_at is not None else "not decided"
        reason = f"sequential: {state} after {n:,} of {total:,} documents"
        self.cells.append(_cell_entry(setup, task, score_spec, traj, n, total))
        return cmp.model_copy(update={"verdict": traj.verdict, "verdict_reason": reason, "samples_to_decide": None})


def _cell_entry(setup: str, task: str, score_spec: CellPlan, traj: Trajectory, n: int, total: int) -> SequentialCell:
    """The block's entry of one cell: its gate's threshold, documents, looks and verdict."""
    gate = score_spec.gate
    last = traj.looks[-1] if traj.looks else None
    return SequentialCell(
        setup=setup,
        task=task,
        metric=score_spec.metric,
        threshold=-gate.max_drop if gate.max_drop is not None and not gate.relative else 0.0,
        documents=n,
        total=total,
        stopped_at=traj.stopped_at,
        ci=(last.lower, last.upper) if last else None,
        verdict=traj.verdict,
        looks=[SequentialLook(n=k.n, ci=(k.lower, k.upper), verdict=k.verdict) for k in traj.looks],
    )


def _fixed_n(results: Results, pre: Preflight, plan_json: SequentialPlan, off_range: dict[str, str]) -> dict[str, str]:
    """The gated tasks judged by the fixed-n interval, and why: named in the block and the
    report, not silently mixed in."""

    def judged(name: str) -> bool:
        return task_gate(pre.cfg.gates, name) is not None and any(
            (c := e.vs_baseline.get(name)) is not None and c.verdict is not None for e in results.setups
        )

    fixed = dict(off_range)
    for info in pre.tasks:
        why = not_sequential(info.kind, _member(info), info.compared_metric)
        if why is not None and judged(info.name):
            fixed[info.name] = why
    for group, members in (pre.groups or {}).items():
        if group not in plan_json.tasks and judged(group):
            fixed[group] = (
                f"an lm-eval group of {len(members)} tasks on a metric that is not bounded in [0, 1] (or mixed): "
                "judged on its pooled documents (as without the switch) by the fixed-n interval at the cap"
            )
    return fixed


def _baseline_documents(results: Results, plan_json: SequentialPlan, base: str) -> dict[str, SequentialBaseline]:
    """How far the baseline scored each sequential task: the last pass's horizon, at most the cap."""
    base_entry = next((e for e in results.setups if e.name == base), None)
    if base_entry is None:
        return {}
    cell_cap = cell_caps(plan_json)
    return {
        t: SequentialBaseline(documents=base_entry.tasks[t].n, total=cell_cap[t])
        for t in plan_json.tasks
        if t in base_entry.tasks
    }


def unpaired(other: list[SampleRecord], base: list[SampleRecord]) -> dict[str, str]:
    """The verdict reason of a cell whose documents do not all pair with the baseline's (by id and
    prompt: qeval/analysis/comparison.py `paired_records`): the baseline scored again to a shorter
    horizon than the setup's stored records reach (a `--force` run interrupted after the baseline,
    or limited to it by --setups), so no sequence runs on them and no verdict is given (no
    evidence, no pass)."""
    theirs = {r.sample_id: r.prompt_hash for r in base}
    lone = sum(1 for r in other if r.sample_id not in theirs or theirs[r.sample_id] != r.prompt_hash)
    return {
        "verdict_reason": f"sequential: no verdict: {lone:,} of this setup's {len(other):,} documents do not pair "
        f"with the baseline's {len(base):,} (the baseline scored again, to a shorter horizon, or prompted "
        "otherwise): rerun with --force"
    }


def documents_scored(
    setups: Sequence[SetupResult], caps: Mapping[str, int], n_docs: Mapping[str, int]
) -> tuple[int, int]:
    """The documents the run scored and those a fixed run scores (each task to its cap), over the
    setups that ran ok: a setup that failed (at load, or in a later pass) stopped for no verdict,
    and counting it would call its unscored documents a saving."""
    ok = [e for e in setups if e.status == "ok"]
    scored = sum(e.tasks[t].n for e in ok for t in e.tasks if t in n_docs)
    full = sum(caps.get(t, n_docs[t]) for e in ok for t in e.tasks if t in n_docs)
    return scored, full


def cell_units(plan_json: SequentialPlan | None, names: Sequence[str]) -> dict[str, str] | None:
    """Per lm-eval leaf of `names` scored in the run's order, the unit it is scored with in one
    `evaluate()` loop: a group's members their group (its monitor pools them chunk by chunk), any
    other leaf itself (its saved state then does not depend on which other tasks a pass scores)."""
    if plan_json is None:
        return None
    group_of = plan_json.group_of()
    return {n: group_of.get(n, n) for n in names}


def pass_horizons(plan_json: SequentialPlan | None, names: Sequence[str]) -> dict[str, int] | None:
    """Per sequential task of `names`, the horizon of the pass in progress (qeval/run/passes.py):
    where its scoring stops this pass, undecided or not. None outside a sequential run's pass. A
    group cell's members get the horizon too: their chunks are shares of the group's pooled chunks
    (`leaf_chunks`), so the horizon counts the group's pooled documents and all its members pause at
    the same look."""
    if plan_json is None or plan_json.horizon is None:
        return None
    group_of, cells, horizon = plan_json.group_of(), plan_json.tasks, plan_json.horizon
    return {n: horizon for n in names if n in cells or group_of.get(n) in cells}
