"""A sequential run's passes without a model (qeval/run/passes.py): the horizons, and what each pass
still has to score, read from a real run store the way the runner reads it. The scoring is
stood in for by writing each pass's records (a prefix of the seeded order, the monitor stopping a
setup where the worker's would): control flow only. The real scoring across passes is
tests/e2e/test_sequential_native.py (native cells) and
tests/tasks/test_lm_eval_chunks.py::test_a_sequential_task_carries_on_across_pass_horizons (lm-eval)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from qeval.analysis.sequential_run import Monitor, cell, cell_caps, group_ids, leaf_chunks, plan, pooled, task_order
from qeval.config import RunConfig
from qeval.config.sequential import SequentialPlan
from qeval.records.store import RunStore
from qeval.results.samples import SampleRecord
from qeval.run.passes import PassState, first_horizon, next_horizon, pass_line
from tests.helpers import config_dict, sample_records

N = 400


def test_horizons_fall_at_looks_and_grow_fourfold() -> None:
    assert first_horizon(min_docs=8, chunk_docs=4) == 32  # the first look at the floor is 8
    assert first_horizon(min_docs=50, chunk_docs=100) == 400  # the first look past it is 100
    assert first_horizon(min_docs=150, chunk_docs=100) == 800
    assert next_horizon(400) == 1600 and next_horizon(32) % 4 == 0
    assert pass_line(2, 1600, 3) == "sequential pass 2: horizon 1,600 documents; 3 setups still undecided"
    assert pass_line(1, 32, 1).endswith("; 1 setup still undecided")


def _setup(base: np.ndarray, setups: dict[str, np.ndarray], tmp_path: Path) -> tuple[Any, SequentialPlan, RunStore]:
    names = ["b", *setups]
    cfg = RunConfig.model_validate(
        config_dict(
            sequential={"enabled": True, "chunk_docs": 20, "min_docs": 40, "seed": 3},
            gates=[{"task": "all", "max_drop": 0.2}],
            setups=[{"name": "b", "baseline": True}] + [{"name": s, "weights": "int8"} for s in setups],
        )
    )
    info = SimpleNamespace(name="arc", kind="lm_eval", entry="arc", compared_metric="acc", n_docs=N)
    pre = SimpleNamespace(
        cfg=cfg, tasks=[info], run_tasks=["arc"], groups={}, setups=[SimpleNamespace(name=n) for n in names]
    )
    p = plan(pre)  # type: ignore[arg-type]
    assert p is not None
    return pre, p, RunStore(tmp_path / "run")


def _keys(names: list[str]) -> dict[str, Any]:
    return {n: SimpleNamespace(task_key=lambda t, n=n: f"key-{n}-{t}") for n in names}


def _records(values: np.ndarray, ids: list[str]) -> list[SampleRecord]:
    return sample_records({"sample_id": i, "metrics": {"acc": float(values[int(i)])}, "prompt_hash": "p"} for i in ids)


def _run(pre: Any, p: SequentialPlan, store: RunStore, values: dict[str, np.ndarray]) -> dict[str, list[list[str]]]:
    """The runner's passes, each setup's scoring stood in for: the documents each pass scored, per setup."""
    keys = _keys(list(values))
    ids, _ = task_order(p, pre.tasks[0])
    scored: dict[str, list[list[str]]] = {n: [] for n in values}
    horizon = first_horizon(p.min_docs, p.chunk_docs)
    state = PassState(pre, store, keys, p)
    setups = list(values)
    while True:
        pending = state.pending(setups, horizon)
        for name in setups:  # the baseline first, as its job runs first
            if "arc" not in pending[name]:
                continue
            before = store.read_samples(name, "arc")
            end = min(horizon, N)
            new: list[SampleRecord] = []
            if name == "b":
                new = _records(values[name], ids[len(before) : end])
            else:  # chunk by chunk, the monitor replayed over what is stored, as the worker's
                monitor = Monitor(p, {"arc": ids}, {"arc": store.read_samples("b", "arc")})
                monitor.add("arc", list(before))
                for start in range(len(before), end, p.chunk_docs):
                    chunk = _records(values[name], ids[start : start + p.chunk_docs])
                    new += chunk
                    if monitor.add("arc", chunk):
                        break
            scored[name].append([r.sample_id for r in new])
            store.write_task(name, "arc", keys[name].task_key("arc"), before + new, {}, {}, None)
        if horizon >= max(cell_caps(p).values()):
            break
        state = PassState(pre, store, keys, p)
        if not state.open_cells(setups):
            break
        horizon = next_horizon(horizon)
    return scored


def test_every_setup_decided_early_the_baseline_stops_at_the_first_horizon(tmp_path: Path) -> None:
    """A setup identical to the baseline decides far inside a 20-point gate, before pass 1's horizon
    (4 x the first look past the floor, 40: 160 of 400): the baseline scored 160 documents, and the
    verdict is the one a baseline scored to the cap gives (the same prefix of the same order)."""
    rng = np.random.default_rng(1)
    base = (rng.random(N) < 0.7).astype(float)
    pre, p, store = _setup(base, {"same": base}, tmp_path)
    scored = _run(pre, p, store, {"b": base, "same": base.copy()})
    assert [len(x) for x in scored["b"]] == [160]  # one pass, to its horizon
    mine = store.read_samples("same", "arc")
    assert len(mine) < 160 and len(scored["same"]) == 1
    ids, _ = task_order(p, pre.tasks[0])
    full = _records(base, ids)
    prefix = cell(p, "arc", ids, store.read_samples("b", "arc"), mine)
    assert prefix is not None and prefix.verdict == "pass"
    assert prefix == cell(p, "arc", ids, full, mine)  # the baseline to the cap: the same trajectory
    # a rerun: nothing open, nothing to score
    again = PassState(pre, store, _keys(["b", "same"]), p)
    assert again.open_cells(["b", "same"]) == {} and again.pending(["b", "same"], 160) == {"b": set(), "same": set()}


def test_one_undecided_setup_extends_the_baseline_pass_by_pass_never_twice(tmp_path: Path) -> None:
    """A setup at the gate's edge (20 points down) never decides: each pass extends the task, for
    the baseline and that setup alone (the decided one gets nothing), each document scored once,
    up to the cap (160, 640 -> 400); a rerun then has nothing to score."""
    rng = np.random.default_rng(2)
    base = np.ones(N)
    edge = np.where(rng.random(N) < 0.2, 0.0, 1.0)
    pre, p, store = _setup(base, {"same": base, "edge": edge}, tmp_path)
    scored = _run(pre, p, store, {"b": base, "same": base.copy(), "edge": edge})
    assert [len(x) for x in scored["b"]] == [160, 240]
    assert len(scored["same"]) == 1  # decided in pass 1: no job after it
    assert [len(x) for x in scored["edge"]] == [160, 240]
    ids, _ = task_order(p, pre.tasks[0])
    for name in ("b", "edge"):  # each document once, in the order
        flat = [i for part in scored[name] for i in part]
        assert flat == ids and len(set(flat)) == N
    traj = cell(p, "arc", ids, store.read_samples("b", "arc"), store.read_samples("edge", "arc"))
    assert traj is not None and traj.stopped_at is None
    state = PassState(pre, store, _keys(["b", "same", "edge"]), p)
    assert state.open_cells(["b", "same", "edge"]) == {}  # at the cap: done
    assert all(not t for t in state.pending(["b", "same", "edge"], 1600).values())


def test_an_interrupted_pass_resumes_where_the_store_stands(tmp_path: Path) -> None:
    """The store says what a pass still has to score: a setup not stored, or stored undecided short
    of the horizon; the baseline, short of what an open cell needs. A setup stored undecided
    at a later pass's horizon than this one's is not scored again at this one."""
    base = np.ones(N)
    pre, p, store = _setup(base, {"x": base, "y": base}, tmp_path)
    keys = _keys(["b", "x", "y"])
    ids, _ = task_order(p, pre.tasks[0])
    store.write_task("b", "arc", "key-b-arc", _records(base, ids), {}, {}, None)  # to the cap, an earlier run
    store.write_task("x", "arc", "key-x-arc", _records(np.zeros(N), ids[:160]), {}, {}, None)
    state = PassState(pre, store, keys, p)
    # x lost every answer: its cell failed (decided) inside 160 documents; y: not stored yet
    assert state.open_cells(["b", "x", "y"]) == {"y": ["arc"]}
    assert state.pending(["b", "x", "y"], 160) == {"b": set(), "x": set(), "y": {"arc"}}
    store.write_task(
        "y", "arc", "key-y-arc", _records(np.where(np.arange(N) % 5 == 0, 0.0, 1.0), ids[:160]), {}, {}, None
    )
    state = PassState(pre, store, keys, p)
    assert state.open_cells(["b", "x", "y"]) == {"y": ["arc"]}  # undecided at 160 of 400
    assert state.pending(["b", "x", "y"], 160) == {"b": set(), "x": set(), "y": set()}
    assert state.pending(["b", "x", "y"], 640) == {"b": set(), "x": set(), "y": {"arc"}}  # the baseline holds the cap
    # another key (a changed config): not stored under this run's, scored again
    other = PassState(pre, store, _keys(["b", "x", "y"]) | {"b": SimpleNamespace(task_key=lambda t: "new")}, p)
    assert other.pending(["b", "x", "y"], 160)["b"] == {"arc"}


def test_a_task_no_longer_a_cell_is_carried_on_to_the_cap_and_a_failed_setup_extends_nothing(tmp_path: Path) -> None:
    """The baseline's task stored at an earlier run's horizon (160 of 400) and no cell now (its gate
    removed: the baseline's key holds the order, not the gate) is not read as whole: the baseline
    carries it on to the cap. The baseline extends a cell only for the setups that score this pass:
    a setup that failed (nothing stored) and is left out asks for nothing. And a setup's records
    that outrun the baseline's (the baseline scored again, shorter) keep its cell open until the
    baseline holds them all."""
    base = np.ones(N)
    pre, p, store = _setup(base, {"x": base}, tmp_path)
    ids, _ = task_order(p, pre.tasks[0])
    store.write_task("b", "arc", "key-b-arc", _records(base, ids[:160]), {}, {}, None)  # pass 1, an earlier run
    ungated: Any = SimpleNamespace(**vars(pre))
    ungated.cfg = pre.cfg.model_copy(update={"gates": []})
    q = plan(ungated)
    assert q is not None and q.tasks == {}
    state = PassState(ungated, store, _keys(["b", "x"]), q)
    assert state.short == {"arc"} and state.pending(["b", "x"], 160)["b"] == {"arc"}
    store.write_task("b", "arc", "key-b-arc", _records(base, ids), {}, {}, None)  # carried on to the cap
    assert PassState(ungated, store, _keys(["b", "x"]), q).pending(["b", "x"], 160)["b"] == set()
    # gated again: x decided inside 160 (identical), y failed in pass 1 with nothing stored
    store.write_task("b", "arc", "key-b-arc", _records(base, ids[:160]), {}, {}, None)
    store.write_task("x", "arc", "key-x-arc", _records(base, ids[:60]), {}, {}, None)
    pre3, p3, _ = _setup(base, {"x": base, "y": base}, tmp_path / "three")
    state = PassState(pre3, store, _keys(["b", "x", "y"]), p3)
    assert state.short == set()  # a cell: its horizon is the passes' business
    assert state.pending(["b", "x"], 640)["b"] == set()  # the setups that ran ok: nothing open
    assert state.pending(["b", "x", "y"], 640)["b"] == {"arc"}  # (y counted: what the runner no longer asks)

    # the baseline scored again to a shorter horizon (an interrupted --force) than x's stored records:
    # x's cell is open until the baseline holds them all, and the baseline extends, never x
    store.write_task("x", "arc", "key-x-arc", _records(np.where(np.arange(N) % 5 == 0, 0.0, 1.0), ids), {}, {}, None)
    state = PassState(pre3, store, _keys(["b", "x", "y"]), p3)
    assert not state.stored[("x", "arc")].paired and state.open_cells(["b", "x"]) == {"x": ["arc"]}
    assert state.pending(["b", "x"], 640) == {"b": {"arc"}, "x": set()}
    store.write_task("b", "arc", "key-b-arc", _records(base, ids), {}, {}, None)
    state = PassState(pre3, store, _keys(["b", "x", "y"]), p3)
    assert state.stored[("x", "arc")].paired and state.open_cells(["b", "x"]) == {}


MEMBERS = {"m_a": 150, "m_b": 90, "m_c": 60}  # a group of 300 pooled documents


def _group_setup(setups: list[str], tmp_path: Path) -> tuple[Any, SequentialPlan, RunStore]:
    cfg = RunConfig.model_validate(
        config_dict(
            sequential={"enabled": True, "chunk_docs": 20, "min_docs": 20, "seed": 3},
            gates=[{"task": "all", "max_drop": 0.2}],
            setups=[{"name": "b", "baseline": True}] + [{"name": s, "weights": "int8"} for s in setups],
            lm_eval={"tasks": [{"name": "grp"}], "suites": []},
        )
    )
    infos = [
        SimpleNamespace(name=m, kind="lm_eval", entry="grp", compared_metric="acc", n_docs=n)
        for m, n in MEMBERS.items()
    ]
    pre = SimpleNamespace(
        cfg=cfg,
        tasks=infos,
        run_tasks=list(MEMBERS),
        groups={"grp": list(MEMBERS)},
        setups=[SimpleNamespace(name=n) for n in ["b", *setups]],
    )
    p = plan(pre)  # type: ignore[arg-type]
    assert p is not None and p.tasks["grp"].members == list(MEMBERS)
    return pre, p, RunStore(tmp_path / "run")


def _run_group(pre: Any, p: SequentialPlan, store: RunStore, values: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """The runner's passes over a group cell, each setup's scoring stood in for as the lm-eval loop
    scores a group (qeval/tasks/lm_eval/scoring.py): its members' shares of the pooled chunks
    (`leaf_chunks`) up to the horizon, the monitor asked once a chunk with every member's records.
    `values`: per setup, a value per pooled document in the group's order. Returns, per setup, the
    pooled documents each pass scored."""
    keys = _keys(list(values))
    ids = group_ids(p, "grp")
    chunks = leaf_chunks(p, MEMBERS)
    n_chunks = len(chunks["m_a"])
    scored: dict[str, list[int]] = {n: [] for n in values}
    horizon = first_horizon(p.min_docs, p.chunk_docs)
    state = PassState(pre, store, keys, p)
    assert pass_line(1, horizon, len(state.open_cells(values))) == (
        "sequential pass 1: horizon 80 documents; 2 setups still undecided"  # the group cell counts
    )
    while True:
        pending = state.pending(list(values), horizon)
        for name in values:
            if not pending[name]:
                continue
            assert pending[name] == set(MEMBERS)  # a group's members together, or none
            held = {m: store.read_samples(name, m) for m in MEMBERS}
            monitor = Monitor.for_leaves(p, list(MEMBERS), lambda m: store.read_samples("b", m))
            if name != "b":
                monitor.chunk(held)  # on resume: all each has so far
            start = sum(len(r) for r in held.values()) // p.chunk_docs
            new = 0
            for j in range(start, min(horizon // p.chunk_docs, n_chunks)):
                added = {}
                for m in MEMBERS:
                    docs = chunks[m][j]
                    added[m] = _records(values[name], [str(ids.index(f"{m}/{i}")) for i in docs])
                    added[m] = [r.model_copy(update={"sample_id": str(i)}) for r, i in zip(added[m], docs, strict=True)]
                    held[m] += added[m]
                new += sum(len(a) for a in added.values())
                if name != "b" and monitor.chunk(added):
                    break
            scored[name].append(new)
            for m in MEMBERS:
                store.write_task(name, m, keys[name].task_key(m), held[m], {}, {}, None)
        if horizon >= max(cell_caps(p).values()):
            break
        state = PassState(pre, store, keys, p)
        if not state.open_cells(values):
            break
        horizon = next_horizon(horizon)
    return scored


def test_a_group_cell_is_a_pass_unit_its_horizon_in_pooled_documents(tmp_path: Path) -> None:
    """A gated lm-eval group is one pass unit: the baseline scores its members' shares of the
    group's pooled order up to each pass's horizon (80, then 300 of 300), never to the cap when the
    setups decide before it, and an undecided setup extends it pass by pass, each pooled document
    once; a rerun finds nothing open."""
    n = sum(MEMBERS.values())
    rng = np.random.default_rng(4)
    base = np.ones(n)
    edge = np.where(rng.random(n) < 0.2, 0.0, 1.0)
    pre, p, store = _group_setup(["same", "edge"], tmp_path)
    assert cell_caps(p) == {"grp": 300}
    # both decided early: the baseline stops at pass 1's horizon, 80 of 300 pooled documents
    scored = _run_group(pre, p, store, {"b": base, "same": base.copy(), "edge": base.copy()})
    assert scored["b"] == [80] and all(len(scored[s]) == 1 and scored[s][0] < 80 for s in ("same", "edge"))
    assert sum(len(store.read_samples("b", m)) for m in MEMBERS) == 80
    held = pooled({m: store.read_samples("b", m) for m in MEMBERS})
    assert sorted(r.sample_id for r in held) == sorted(group_ids(p, "grp")[:80])  # the pooled order's prefix
    again = PassState(pre, store, _keys(["b", "same", "edge"]), p)
    assert again.open_cells(["b", "same", "edge"]) == {}

    # one setup at the gate's edge: the group extends pass by pass for it and the baseline alone
    pre, p, store = _group_setup(["same", "edge"], tmp_path / "two")
    scored = _run_group(pre, p, store, {"b": base, "same": base.copy(), "edge": edge})
    assert scored["b"] == [80, 220] and scored["edge"] == [80, 220] and len(scored["same"]) == 1
    ids = group_ids(p, "grp")
    for name in ("b", "edge"):  # each pooled document once
        got = sorted(r.sample_id for r in pooled({m: store.read_samples(name, m) for m in MEMBERS}))
        assert got == sorted(ids)
    state = PassState(pre, store, _keys(["b", "same", "edge"]), p)
    assert state.open_cells(["b", "same", "edge"]) == {} and state.stored[("b", "grp")].n == 300


def test_a_later_pass_adds_its_times_and_keeps_the_first_pass_memory() -> None:
    """A later pass's worker scored only some tasks' extensions: the setup's times are the passes'
    together (loading, the whole job, each task it carried on; the others as they were) and its
    memory the first pass's (which scored every task), not this pass's smaller peak."""
    from qeval.records.job import MemoryFigure, Outcome
    from qeval.run.worker import _after_a_pass

    first = Outcome(
        name="int8",
        timings={"load_s": 2.0, "total_s": 10.0, "arc_s": 5.0, "ppl_s": 3.0, "performance_s": 4.0},
        memory={"peak_bytes": MemoryFigure(900, "measured")},
    )
    second = Outcome(
        name="int8",
        timings=dict(first.timings) | {"load_s": 2.5, "total_s": 4.0, "arc_s": 1.25},
        memory={"peak_bytes": MemoryFigure(500, "measured")},
    )
    _after_a_pass(second, first, ["arc"])
    assert second.timings == {"load_s": 4.5, "total_s": 14.0, "arc_s": 6.25, "ppl_s": 3.0, "performance_s": 4.0}
    assert second.memory == first.memory
