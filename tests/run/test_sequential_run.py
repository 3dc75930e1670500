"""A sequential run's pieces without a model (qeval/config/sequential.py, qeval/analysis/sequential_run.py):
the switch stays out of the config hash while off, the order is seeded and independent of the other
tasks, the monitor stops a task where its gate is decided and not before the floor, and assembly
recomputes the same stopping point from the records. The scoring itself (real model, real lm-eval)
is tests/e2e/test_lm_eval_tasks.py::test_a_sequential_run_stops_decided_cells_and_reports_where."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from qeval.analysis.sequential import Trajectory
from qeval.analysis.sequential_run import (
    Monitor,
    cell,
    document_order,
    looks,
    not_sequential,
    plan,
    task_gate,
    task_order,
)
from qeval.config import RunConfig
from qeval.config.gates import Gate
from qeval.results.samples import SampleRecord
from tests.helpers import config_dict, sample_records, seq_plan


def _cfg(**extra: Any) -> RunConfig:
    return RunConfig.model_validate(config_dict(**extra))


def test_off_is_out_of_the_hash() -> None:
    """No block, or a block with enabled: false, hashes as before the block existed."""
    plain = _cfg()
    off = _cfg(sequential={"enabled": False, "seed": 7})
    on = _cfg(sequential={"enabled": True})
    assert "sequential" not in plain.as_json() and "sequential" not in off.as_json()
    assert plain.config_hash() == off.config_hash() != on.config_hash()
    assert not off.sequential_on and on.sequential_on


def test_bad_values_refused() -> None:
    from pydantic import ValidationError

    for bad in ({"level": 1.5}, {"min_docs": 3}, {"chunk_docs": 0}, {"max_docs": 0}, {"typo": 1}):
        with pytest.raises(ValidationError):
            _cfg(sequential={"enabled": True} | bad)


def test_order_is_seeded_capped_and_per_task() -> None:
    cfg = _cfg(sequential={"enabled": True, "seed": 3, "max_docs": 50, "chunk_docs": 10, "min_docs": 10})
    a = document_order(cfg, "arc_easy", 200)
    assert a == document_order(cfg, "arc_easy", 200)  # the same in every worker and at assembly
    assert len(a) == 50 and len(set(a)) == 50 and a != sorted(a)
    assert a != document_order(cfg, "piqa", 200)
    other = _cfg(sequential={"enabled": True, "seed": 4, "max_docs": 50, "chunk_docs": 10, "min_docs": 10})
    assert a != document_order(other, "arc_easy", 200)
    full = document_order(_cfg(sequential={"enabled": True, "seed": 3}), "arc_easy", 200)
    assert sorted(full) == list(range(200)) and full[:50] == a  # the cap is a prefix of the same order


def test_looks() -> None:
    assert looks(250, 100) == [100, 200, 250]
    assert looks(200, 100) == [100, 200]
    assert looks(0, 100) == []


def _pre(cfg: RunConfig, tasks: list[tuple[str, str, str, str]], n_docs: int = 400) -> Any:
    """A stand-in Preflight with tasks (name, kind, entry, metric) of `n_docs` documents; a task
    whose entry is another name is that lm-eval group's member."""
    infos = [SimpleNamespace(name=n, kind=k, entry=e, compared_metric=m, n_docs=n_docs) for n, k, e, m in tasks]
    groups: dict[str, list[str]] = {}
    for t in infos:
        if t.entry != t.name and t.kind == "lm_eval":  # (a long-context task's entry is its family)
            groups.setdefault(t.entry, []).append(t.name)
    return SimpleNamespace(cfg=cfg, tasks=infos, groups=groups, run_tasks=[t.name for t in infos])


def test_plan_cells_and_level() -> None:
    """Cells: lm-eval and native tasks outside groups and lm-eval groups, on bounded metrics, with a
    gate; the level split over (setups other than the baseline) x cells."""
    cfg = _cfg(
        sequential={"enabled": True, "level": 0.06},
        gates=[{"task": "all", "max_drop": 0.02}],
        setups=[{"name": "b", "baseline": True}, {"name": "x", "weights": "int8"}, {"name": "y", "weights": "int4"}],
    )
    pre = _pre(
        cfg,
        [
            ("arc", "lm_eval", "arc", "acc"),
            ("wiki", "lm_eval", "wiki", "bits_per_byte"),
            ("mmlu_a", "lm_eval", "mmlu", "acc"),
            ("piqa", "lm_eval", "piqa", "acc_norm"),
            ("addition", "native", "addition", "exact_match"),
            ("passkey_1024", "long_context", "passkey", "exact_match"),  # its entry is its family
            ("chat", "multi_turn", "chat", "exact_match"),
        ],
    )
    p = plan(pre)
    assert p is not None and set(p.tasks) == {"arc", "piqa", "addition", "mmlu", "passkey_1024"}
    assert p.tasks["mmlu"].members == ["mmlu_a"] and p.groups == {"mmlu": [("mmlu_a", 400)]}
    assert p.cells == 10 and p.alpha == pytest.approx(0.06 / 10)
    assert plan(_pre(_cfg(), [("arc", "lm_eval", "arc", "acc")])) is None


def test_which_kinds_are_sequential_and_why_not() -> None:
    """Only lm-eval, native and long-context tasks outside groups and lm-eval groups on bounded
    metrics are cells; multi-turn tasks (their scoring loop takes no order), group members (their
    group is the cell) and bits per byte (unbounded) are judged by the fixed-n interval, each with
    its reason for the report."""
    cfg = _cfg(sequential={"enabled": True}, gates=[{"task": "all", "max_drop": 0.02}])
    pre = _pre(
        cfg,
        [
            ("arc", "lm_eval", "arc", "acc"),
            ("needle_1k", "long_context", "needle", "acc"),
            ("chat", "multi_turn", "chat", "acc"),
            ("addition", "native", "addition", "exact_match"),
            ("mmlu_a", "lm_eval", "mmlu", "acc"),
            ("wiki", "lm_eval", "wiki", "bits_per_byte"),
        ],
    )
    p = plan(pre)
    assert p is not None and set(p.tasks) == {"arc", "addition", "mmlu", "needle_1k"} and p.cells == 4
    assert not_sequential("lm_eval", False, "acc") is None
    assert not_sequential("long_context", False, "acc") is None  # passkey, multikey: cells too
    assert "multi_turn task" in str(not_sequential("multi_turn", False, "acc"))
    assert not_sequential("native", False, "exact_match") is None  # native tasks are cells (issue 42)
    assert "group" in str(not_sequential("lm_eval", True, "acc"))
    assert "not bounded" in str(not_sequential("lm_eval", False, "bits_per_byte"))


def test_task_gate_prefers_the_named_gate() -> None:
    gates = [Gate(task="all", max_drop=0.02), Gate(task="arc", max_drop=0.05)]
    assert task_gate(gates, "arc") == gates[1] and task_gate(gates, "piqa") == gates[0]
    # a gate at a generated position judges that bucket's divergence (nats), not the task's score:
    # the comparison skips it (qeval/analysis/comparison.py), and so does the sequential cell
    at_position = Gate(task="gsm8k", max_drop=0.3, position=0)
    assert task_gate([at_position, gates[0]], "gsm8k") == gates[0]
    assert task_gate([at_position], "gsm8k") is None


def _records(values: np.ndarray, ids: list[int]) -> list[SampleRecord]:
    return sample_records({"sample_id": str(i), "metrics": {"acc": float(values[i])}, "prompt_hash": "p"} for i in ids)


@pytest.mark.parametrize("broken", [True, False])
def test_monitor_stops_where_assembly_says(broken: bool) -> None:
    """Chunk by chunk, the monitor stops a broken setup early (fail) and an unchanged one (pass),
    never before the floor; assembly's trajectory from the same records stops at the same look."""
    rng = np.random.default_rng(0)
    n = 400
    base = (rng.random(n) < 0.7).astype(float)
    other = np.where(rng.random(n) < 0.5, 0.0, base) if broken else base.copy()
    cfg = _cfg(sequential={"enabled": True, "chunk_docs": 20, "min_docs": 60})
    p = plan(_pre(cfg, [("arc", "lm_eval", "arc", "acc")]))
    assert p is not None
    order = document_order(cfg, "arc", n)
    base_records = _records(base, list(range(n)))
    monitor = Monitor(p, {"arc": order}, {"arc": base_records})
    scored: list[SampleRecord] = []
    for start in range(0, n, 20):
        chunk = _records(other, sorted(order[start : start + 20]))  # a chunk's ids come ascending, as lm-eval's
        scored += chunk
        if monitor.add("arc", chunk):
            break
    assert len(scored) >= 60
    assert len(scored) < n
    traj = cell(p, "arc", order, base_records, scored)
    assert traj is not None and traj.stopped_at == len(traj.looks) - 1 and traj.looks[-1].n == len(scored)
    assert traj.verdict == ("fail" if broken else "pass")


def test_a_fixed_run_replayed_in_the_seeded_order_stops_where_the_run_would(tmp_path: Any) -> None:
    """bench/sequential_replay.py --order-seed puts a fixed run's records (stored in the set's own
    order) in the sequential run's order, so its stop is the run's: the same documents, looks and
    verdict as `cell` gives on that order, and the totals line counts what it scored."""
    import json
    import subprocess
    import sys

    from qeval.analysis.sequential_run import seeded_order
    from tests.helpers import ROOT

    cfg = _cfg(sequential={"enabled": True, "seed": 3, "max_docs": 50, "chunk_docs": 10, "min_docs": 10})
    assert seeded_order(3, "arc_easy", 200, 50) == document_order(cfg, "arc_easy", 200)
    rng = np.random.default_rng(0)
    n = 1500
    base = rng.random(n) < 0.6
    other = base.copy()
    other[rng.choice(n, 12, replace=False)] ^= True  # a few flips either way: a clear pass at 10 points
    for setup, values in (("baseline", base), ("int8", other)):
        folder = tmp_path / "samples" / setup
        folder.mkdir(parents=True)
        lines = [json.dumps({"sample_id": str(i), "metrics": {"acc": float(v)}}) for i, v in enumerate(values)]
        (folder / "arc_easy.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "replay.json"
    args = ["--gates", "0.10", "--chunk", "100", "--min-docs", "50", "--alpha", "0.025", "--json", str(out)]
    res = subprocess.run(
        [sys.executable, "bench/sequential_replay.py", str(tmp_path), *args, "--order-seed", "7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    (row,) = json.loads(out.read_text())
    order = seeded_order(7, "arc_easy", n)
    records = sample_records({"sample_id": str(i), "metrics": {"acc": float(v)}} for i, v in enumerate(base))
    others = sample_records({"sample_id": str(i), "metrics": {"acc": float(v)}} for i, v in enumerate(other))
    plan_json = seq_plan(
        tasks={"arc_easy": {"gate": {"task": "all", "max_drop": 0.10}, "n_docs": n}},
        chunk_docs=100,
        alpha=0.025,
        min_docs=50,
    )
    rank = {d: i for i, d in enumerate(order)}
    others_in_order = sorted(others, key=lambda r: rank[int(r.sample_id)])
    traj = cell(plan_json, "arc_easy", order, records, others_in_order)
    assert traj is not None and traj.verdict == row["sequential"] == "pass" and row["fixed"] == "pass"
    assert row["scored"] == row["stopped_at_n"] < n  # stopped early, where the run's own monitor stops
    assert traj.stopped_at is not None and traj.looks[traj.stopped_at].n == row["scored"]
    assert others_in_order[0].sample_id == str(order[0])
    assert f"{row['scored']:,} of {n:,} paired documents scored" in res.stdout
    assert "the same verdict in 1 of the 1 cells" in res.stdout


def test_a_reference_sliced_to_a_chunk_is_that_chunk_s_requests() -> None:
    """qeval/tasks/sequential.py hands each chunk the baseline's top-k of its own requests: the
    slice of a pack is the pack of those requests (split_reference agrees request by request)."""
    from qeval.tasks.divergence import split_reference
    from qeval.tasks.sequential import _slice_reference

    lengths = [3, 1, 4, 2, 5]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    total = int(offsets[-1])
    pack = {
        "offsets": offsets,
        "indices": np.arange(total * 2, dtype=np.int32).reshape(total, 2),
        "logprobs": -np.arange(total * 2, dtype=np.float32).reshape(total, 2),
        "token_logprobs": -np.arange(total, dtype=np.float32),
    }
    whole = split_reference(pack, 5)
    part = split_reference(_slice_reference(pack, 1, 4), 3)
    assert whole is not None and part is not None
    for a, b in zip(whole[1:4], part, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert _slice_reference(pack, 3, 6) is None and _slice_reference(None, 0, 1) is None


def test_no_sequential_task_and_a_cap_under_the_floor_are_refused() -> None:
    """A config that switches the block on with nothing to decide sequentially (no gate; a gate on
    bits per byte, a long-context task or an lm-eval group only) is refused at preflight in one line that
    names why each gated task is not a cell; so is a cap under the floor (no look could decide), and
    a task with fewer documents than the floor is warned of."""
    from pydantic import ValidationError

    from qeval.analysis.sequential_run import check
    from qeval.errors import UserError

    def pre(gates: list[dict[str, Any]], tasks: list[tuple[str, str, str, str]]) -> Any:
        lm_eval = {"tasks": [{"name": "arc"}, {"name": "mmlu"}], "suites": []}  # gates may name lm-eval groups
        return _pre(_cfg(sequential={"enabled": True}, gates=gates, lm_eval=lm_eval), tasks)

    arc, wiki = ("arc", "lm_eval", "arc", "acc"), ("wiki", "lm_eval", "wiki", "bits_per_byte")
    needle, mmlu_a = ("needle", "multi_turn", "needle", "acc"), ("mmlu_a", "lm_eval", "mmlu", "acc")
    mmlu_b = ("mmlu_b", "lm_eval", "mmlu", "bits_per_byte")
    everything = [{"task": "all", "max_drop": 0.02}]
    assert check(pre(everything, [arc, wiki])) == []  # one cell on 400 documents: runs, nothing to say
    assert check(_pre(_cfg(gates=[]), [wiki])) == []  # the switch off: nothing to check
    few = pre(everything, [arc, wiki])
    few.tasks[0].n_docs = 30  # `limit: 30`, under the floor of 50: no look can decide it
    assert check(few) == [
        "sequential: arc has 30 documents, under min_docs 50: its cells cannot be decided (inconclusive at the end)"
    ]
    cases = [
        ([], [arc], "(no gate covers any task)"),
        (everything, [wiki, needle], "(wiki: bits_per_byte is not bounded in [0, 1]; needle: a multi_turn task)"),
        ([{"task": "mmlu", "max_drop": 0.02}], [arc, mmlu_b], "(mmlu: an lm-eval group whose members' metric is not"),
        ([{"task": "mmlu_a", "max_drop": 0.02}], [arc, mmlu_a], "(mmlu_a: a member of the lm-eval group mmlu)"),
    ]
    for gates, tasks, why in cases:
        with pytest.raises(UserError, match="^sequential: enabled, but no task can be decided") as exc:
            check(pre(gates, tasks))
        assert why in str(exc.value) and "\n" not in str(exc.value)
        assert "native tasks and long-context ones (passkey, multikey)" in str(exc.value)  # every cell kind named
    assert check(pre([{"task": "mmlu", "max_drop": 0.02}], [arc, mmlu_a])) == []  # a gated group is a cell
    # --tasks naming one member of a group cell: the cell is the group's pooled documents, refused in one line
    mmlu_c = ("mmlu_c", "lm_eval", "mmlu", "acc")
    one = pre([{"task": "mmlu", "max_drop": 0.02}], [arc, mmlu_a, mmlu_c])
    one.run_tasks = ["arc", "mmlu_c"]
    with pytest.raises(UserError, match="^--tasks: mmlu_c is a member of the lm-eval group mmlu, .* name mmlu in"):
        check(one)
    one.run_tasks = ["arc"]  # the group left out whole: fine
    assert check(one) == []
    with pytest.raises(ValidationError, match=r"max_docs \(40\) is under min_docs \(50\)"):
        _cfg(sequential={"enabled": True, "max_docs": 40})
    assert _cfg(sequential={"enabled": True, "max_docs": 51, "chunk_docs": 10}).sequential is not None


def test_a_first_look_at_or_past_the_cap_is_refused() -> None:
    """Looks fall after each chunk: where the first one at or past the floor is at or past the cap
    (a chunk as large as the cap; the floor at the cap), no setup could stop before the cap, and the
    run would be a fixed run judged by the wider sequence: refused in one line."""
    from pydantic import ValidationError

    cases = [
        ({"chunk_docs": 500, "max_docs": 40, "min_docs": 8}, "after 500 documents", "max_docs (40)"),
        ({"chunk_docs": 3, "max_docs": 8, "min_docs": 8}, "after 9 documents", "max_docs (8)"),
        ({"chunk_docs": 4, "max_docs": 8, "min_docs": 8}, "after 8 documents", "max_docs (8)"),
        ({"max_docs": 100}, "after 100 documents", "max_docs (100)"),  # the default chunk, 100
    ]
    for spec, first, cap in cases:
        with pytest.raises(ValidationError, match="no setup could stop before the cap") as exc:
            _cfg(sequential={"enabled": True} | spec)
        assert first in str(exc.value) and cap in str(exc.value)
    ok = _cfg(sequential={"enabled": True, "chunk_docs": 4, "max_docs": 9, "min_docs": 8}).sequential
    assert ok is not None and ok.first_look() == 8  # a look at 8 may decide before the cap, 9
    assert _cfg(sequential={"enabled": True, "chunk_docs": 500}).sequential is not None  # no cap: the set decides


def test_settings_without_the_switch_are_refused() -> None:
    """`sequential: {level: 0.01}` (no `enabled:`) would run a fixed run the user took for a
    sequential one: refused; an empty block, or `enabled: false` with settings, stays off."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="no `enabled:`; the block is off unless `enabled: true`"):
        _cfg(sequential={"level": 0.01, "max_docs": 400})
    assert not _cfg(sequential={}).sequential_on and not _cfg(sequential={"enabled": False, "seed": 3}).sequential_on


def test_a_changed_gate_rescores_the_stopped_setups_not_the_baseline() -> None:
    """Where a setup stops depends on its cell's gate: records that stopped at a 50-point gate are
    not a run at a 5-point one (they were read back as "not decided after 8 of 24", never scored
    further). So a sequential task's key holds its gate for the setups other than the baseline;
    the baseline's keys, and a task that is no cell (bits per byte), stay as they were."""
    from qeval.analysis.sequential_run import with_keys
    from qeval.records.keys import SetupKeys

    tasks = [("arc", "lm_eval", "arc", "acc"), ("wiki", "lm_eval", "wiki", "bits_per_byte")]
    setups = [{"name": "b", "baseline": True}, {"name": "x", "weights": "int8"}]

    def keys(max_drop: float, baseline: str = "b", **seq: Any) -> dict[str, SetupKeys]:
        gates = [{"task": "all", "max_drop": max_drop}]
        cfg = _cfg(sequential={"enabled": True} | seq, gates=gates, setups=setups)
        pre = _pre(cfg, tasks)
        p = plan(pre)
        assert p is not None
        plain = {s: SetupKeys({"setup": s}, {"arc": {"task": "arc"}, "wiki": {"task": "wiki"}}) for s in ("b", "x")}
        plain["b"] = SetupKeys({"setup": baseline}, {t: {"task": t, "setup": baseline} for t in ("arc", "wiki")})
        return with_keys(pre, plain, p)

    wide, narrow = keys(0.5), keys(0.05)
    assert list(wide) == ["b", "x"]
    assert wide["x"].task_key("arc") != narrow["x"].task_key("arc")
    assert wide["x"].task_key("wiki") == narrow["x"].task_key("wiki")
    assert all(wide["b"].task_key(t) == narrow["b"].task_key(t) for t in ("arc", "wiki"))
    assert wide["x"].task_key("arc") == keys(0.5)["x"].task_key("arc")  # stable: a rerun resumes
    # another baseline (its setup changed): the cells it pairs with are rescored, the rest kept
    other = keys(0.5, baseline="b-int8")
    assert other["x"].task_key("arc") != wide["x"].task_key("arc")
    assert other["x"].task_key("wiki") == wide["x"].task_key("wiki")
    # the level: the baseline (scored to the cap whatever the level) is reused; the seed: rescored
    level, seed = keys(0.5, level=0.1), keys(0.5, seed=1)
    assert level["b"].tasks == wide["b"].tasks and level["x"].task_key("arc") != wide["x"].task_key("arc")
    assert all(seed[s].task_key(t) != wide[s].task_key(t) for s in ("b", "x") for t in ("arc", "wiki"))


def _group_plan(chunk_docs: int = 10, max_docs: int | None = None, sizes: tuple[int, ...] = (30, 60, 90)) -> Any:
    cfg = _cfg(
        sequential={"enabled": True, "seed": 2, "chunk_docs": chunk_docs, "min_docs": 20, "max_docs": max_docs},
        gates=[{"task": "all", "max_drop": 0.05}],
        lm_eval={"tasks": [{"name": "arc"}, {"name": "mmlu"}], "suites": []},
    )
    pre = _pre(cfg, [("arc", "lm_eval", "arc", "acc")] + [(f"mmlu_{i}", "lm_eval", "mmlu", "acc") for i in range(3)])
    for t, n in zip(pre.tasks[1:], sizes, strict=True):
        t.n_docs = n
    p = plan(pre)
    assert p is not None
    return pre, p


def test_a_group_is_one_pooled_order_cut_into_chunks_each_member_in_proportion() -> None:
    """A group's members are drawn from one seeded order over the pooled documents (MMLU's
    subjects as one set), cut at the cap over the pool: every member has the group's number of
    chunks, each chunk's shares add up to `chunk_docs`, and the members' shares of a long prefix
    are in proportion to their sizes; a task outside the group keeps its own order."""
    from qeval.analysis.sequential_run import capped_docs, group_ids, group_order, leaf_chunks

    _, p = _group_plan()
    sizes = {"arc": 400, "mmlu_0": 30, "mmlu_1": 60, "mmlu_2": 90}
    chunks = leaf_chunks(p, sizes)
    members = ["mmlu_0", "mmlu_1", "mmlu_2"]
    assert all(len(chunks[m]) == 18 for m in members)  # 180 pooled documents, 10 a chunk
    assert all(sum(len(chunks[m][j]) for m in members) == 10 for j in range(18))
    for m in members:  # every document once
        assert sorted(i for c in chunks[m] for i in c) == list(range(sizes[m]))
    assert [i for c in chunks["arc"] for i in c] == seeded_order_of(p, "arc", 400)
    order = group_order(2, "mmlu", p.groups["mmlu"])
    half = [m for m, _ in order[:90]]
    assert 5 <= half.count("mmlu_0") <= 25 and 35 <= half.count("mmlu_2") <= 55  # about 15 and 45
    ids = group_ids(p, "mmlu")
    assert ids[:3] == [f"{m}/{i}" for m, i in order[:3]] and len(set(ids)) == 180
    # the cap counts the pool; a member alone gets its share of the group's chunks
    _, capped = _group_plan(max_docs=50)
    assert sum(capped_docs(capped, sizes)[m] for m in members) == 50 and capped_docs(capped, sizes)["arc"] == 50
    assert (
        set(leaf_chunks(capped, {"mmlu_1": 60})) == {"mmlu_1"}
        and len(leaf_chunks(capped, {"mmlu_1": 60})["mmlu_1"]) == 5
    )


def seeded_order_of(p: Any, task: str, n: int) -> list[int]:
    from qeval.analysis.sequential_run import seeded_order

    return seeded_order(p.seed, task, n, p.max_docs)


@pytest.mark.parametrize("broken", [True, False])
def test_a_group_cell_stops_all_its_members_on_the_pooled_sequence(broken: bool) -> None:
    """The monitor pools a group's members chunk by chunk and stops every member at once where the
    group's sequence decides (a broken setup fails, an unchanged one passes), never before the
    floor; assembly's trajectory from the same pooled records stops at the same look."""
    from qeval.analysis.sequential_run import group_ids, leaf_chunks, pooled

    _, p = _group_plan()
    sizes = {"mmlu_0": 30, "mmlu_1": 60, "mmlu_2": 90}
    rng = np.random.default_rng(1)
    base = {m: (rng.random(n) < 0.7).astype(float) for m, n in sizes.items()}
    other = {m: np.where(rng.random(len(v)) < 0.5, 0.0, v) if broken else v.copy() for m, v in base.items()}
    base_records = {m: _records(v, list(range(len(v)))) for m, v in base.items()}
    monitor = Monitor.for_leaves(p, list(sizes), lambda m: base_records[m])
    assert set(monitor.orders) == {"mmlu"}  # the group is the cell; its members are none
    chunks = leaf_chunks(p, sizes)
    scored: dict[str, list[SampleRecord]] = {m: [] for m in sizes}
    stopped: set[str] = set()
    for j in range(18):
        added = {m: _records(other[m], sorted(chunks[m][j])) for m in sizes if chunks[m][j]}
        for m, recs in added.items():
            scored[m] += recs
        stopped = monitor.chunk(added)
        if stopped:
            break
    assert stopped == set(sizes)  # all members at once
    n = sum(len(v) for v in scored.values())
    assert 20 <= n < 180 and n % 10 == 0
    traj = cell(p, "mmlu", group_ids(p, "mmlu"), pooled(base_records), pooled(scored))
    assert traj is not None and traj.stopped_at == len(traj.looks) - 1 and traj.looks[-1].n == n
    assert traj.verdict == ("fail" if broken else "pass")


def test_a_group_cell_s_keys_and_its_members_scored_together() -> None:
    """A group member's key holds its group (its documents come from the group's pooled order) and,
    for a setup other than the baseline, the group's gate and the baseline's keys of every member;
    a rerun that finds one member stored and another not scores the whole group again (its
    monitor pools them)."""
    from qeval.analysis.sequential_run import widen, with_keys
    from qeval.records.keys import SetupKeys

    pre, p = _group_plan()
    names = ["arc", "mmlu_0", "mmlu_1", "mmlu_2"]

    b = pre.cfg.baseline.name
    x = next(s.name for s in pre.cfg.setups if s.name != b)

    def keys(base_tag: str = "b") -> dict[str, SetupKeys]:
        tag = {b: base_tag, x: x}
        plain = {s: SetupKeys({"setup": s}, {t: {"task": t, "tag": tag[s]} for t in names}) for s in (b, x)}
        return with_keys(pre, plain, p)

    k = keys()
    assert ",group=mmlu" in k[b].tasks["mmlu_1"]["sequential"] and "group=" not in k[b].tasks["arc"]["sequential"]
    assert ",gate=(" in k[x].tasks["mmlu_1"]["sequential"]
    # another baseline for the group's members: every member's key changes, arc's too (its own cell)
    other = keys("b2")
    assert all(other[x].task_key(m) != k[x].task_key(m) for m in names)
    assert all(keys()[x].task_key(m) == k[x].task_key(m) for m in names)  # stable: a rerun resumes
    assert widen(p, {"mmlu_1": "k1"}, lambda t: f"key-{t}") == {
        "mmlu_0": "key-mmlu_0",
        "mmlu_1": "k1",
        "mmlu_2": "key-mmlu_2",
    }
    assert widen(p, {"arc": "a"}, lambda t: t) == {"arc": "a"} and widen(None, {"arc": "a"}, str) == {"arc": "a"}


def test_a_group_member_with_no_document_in_the_stopped_prefix_weighs_nothing() -> None:
    """Measured on MMLU (57 subjects): a group decided after 200 pooled documents leaves subjects
    with none in that prefix, stored with n = 0 and no metric. The group's score is the size-weighted
    mean of the members that have documents (so the pooled mean), not withheld; a member missing
    altogether (a partial run) still withholds it."""
    from qeval.analysis.assemble import _group_scores
    from qeval.results.schema import MetricValue, TaskScore

    def score(n: int, acc: float | None) -> TaskScore:
        return TaskScore(n=n, metrics={} if acc is None else {"acc": MetricValue(value=acc)})

    tasks = {"g": SimpleNamespace(is_group=True, compared_metric="acc")}
    groups = {"g": ["a", "b", "c"]}
    entry = SimpleNamespace(tasks={"a": score(3, 1.0), "b": score(1, 0.0), "c": score(0, None)})
    got = _group_scores(entry, tasks, groups)  # type: ignore[arg-type]
    assert got["g"].n == 4 and got["g"].metrics["acc"].value == pytest.approx(0.75)
    partial = SimpleNamespace(tasks={"a": score(3, 1.0), "b": score(1, 0.0)})
    assert _group_scores(partial, tasks, groups) == {}  # type: ignore[arg-type]
    nothing = SimpleNamespace(tasks={"a": score(0, None), "b": score(0, None), "c": score(0, None)})
    assert _group_scores(nothing, tasks, groups) == {}  # type: ignore[arg-type]


def test_a_cell_whose_documents_outrun_the_baseline_s_gets_no_verdict(tmp_path: Any) -> None:
    """Measured: `qeval run --force` interrupted once the baseline had scored pass 1 (24 of 30
    documents), then a plain rerun: INT8's stored 30 documents (its key unchanged) no longer all pair
    with the baseline's 24, no sequence runs on them, and the fixed-n verdict on the 24 stood in
    results.json as if sequential, with no reason. It is made inconclusive, saying why (no
    evidence, no pass); where they pair, the cell is the sequence's as before."""
    from qeval.analysis.sequential_run import results_block
    from qeval.records.store import RunStore
    from qeval.results.schema import read_results
    from tests.helpers import ROOT

    results = read_results(ROOT / "tests" / "data" / "run-v1" / "results.json")
    results = results.model_copy(update={"setups": [s for s in results.setups if s.name in ("bf16", "int8")]})
    assert results.setups[1].vs_baseline["compare_mc"].verdict == "pass"  # the fixed-n verdict stored
    info = SimpleNamespace(name="compare_mc", kind="native", entry="compare_mc", compared_metric="acc", n_docs=30)
    pre = SimpleNamespace(
        cfg=_cfg(
            sequential={"enabled": True, "min_docs": 6, "chunk_docs": 2}, gates=[{"task": "all", "max_drop": 0.5}]
        ),
        tasks=[info],
        groups={},
    )
    p = plan(pre)  # type: ignore[arg-type]
    assert p is not None
    ids, _ = task_order(p, info)

    def stored(n_base: int, n_int8: int) -> Any:
        store = RunStore(tmp_path / f"run-{n_base}-{n_int8}")
        for setup, n in (("bf16", n_base), ("int8", n_int8)):
            rows = ({"sample_id": i, "metrics": {"acc": 1.0}, "prompt_hash": "p"} for i in ids[:n])
            store.write_task(setup, "compare_mc", "k", sample_records(rows), {}, {}, None)
        return results_block(results, pre, store)  # type: ignore[arg-type]

    short = stored(24, 30).setups[1].vs_baseline["compare_mc"]
    assert short.verdict == "inconclusive" and short.samples_to_decide is None
    assert short.verdict_reason is not None and "6 of this setup's 30 documents do not pair with the baseline's 24" in (
        short.verdict_reason
    )
    paired = stored(30, 14)
    assert paired.setups[1].vs_baseline["compare_mc"].verdict == "pass"  # identical answers, far inside 50 points
    assert [c.documents for c in paired.sequential.cells] == [14]


def _pairs_in_seeded_order(
    p: Any, cell_name: str, order: list[str], base: dict[str, float], other: dict[str, float]
) -> Trajectory:
    """The cell's trajectory computed straight from the values in the seeded order: what `cell`
    must give whatever order the records are stored in."""
    from qeval.analysis.sequential import gate_score
    from qeval.analysis.sequential import trajectory as cell_trajectory

    ids = [i for i in order if i in other]
    gate = p.tasks[cell_name].gate
    score = gate_score(np.array([base[i] for i in ids]), np.array([other[i] for i in ids]), True, gate.max_drop)
    return cell_trajectory(score, looks(len(ids), p.chunk_docs), p.alpha, p.min_docs)


@pytest.mark.parametrize("stored", ["by_member", "reversed", "shuffled"])
def test_a_cell_consumes_its_pairs_in_the_seeded_order_whatever_the_storage_order(stored: str) -> None:
    """The capital process is fed the pairs in the run's seeded order, on both sides: a group's
    pooled baseline (stored member after member), or either side stored in any other order, gives
    exactly the trajectory of the values taken in the seeded order (look for look, bounds and
    verdict), in assembly (`cell`) and in the worker's monitor alike."""
    from qeval.analysis.sequential_run import group_ids, pooled

    _, p = _group_plan()
    sizes = {"mmlu_0": 30, "mmlu_1": 60, "mmlu_2": 90}
    rng = np.random.default_rng(5)
    # the drop differs across members: the order the pairs come in changes the sequence
    drop = {"mmlu_0": 0.6, "mmlu_1": 0.0, "mmlu_2": 0.1}
    base = {m: (rng.random(n) < 0.7).astype(float) for m, n in sizes.items()}
    other = {m: np.where(rng.random(len(v)) < drop[m], 0.0, v) for m, v in base.items()}
    base_records = pooled({m: _records(v, list(range(len(v)))) for m, v in base.items()})
    other_records = pooled({m: _records(v, list(range(len(v)))) for m, v in other.items()})
    if stored == "reversed":
        base_records, other_records = base_records[::-1], other_records[::-1]
    elif stored == "shuffled":
        perm_b, perm_o = rng.permutation(len(base_records)), rng.permutation(len(other_records))
        base_records = [base_records[i] for i in perm_b]
        other_records = [other_records[i] for i in perm_o]
    order = group_ids(p, "mmlu")

    def values(recs: list[SampleRecord]) -> dict[str, float]:
        return {r.sample_id: float((r.metrics or {})["acc"]) for r in recs}

    want = _pairs_in_seeded_order(p, "mmlu", order, values(base_records), values(other_records))
    got = cell(p, "mmlu", order, base_records, other_records)
    assert got is not None
    assert got.looks == want.looks and got.stopped_at == want.stopped_at
    # the worker's monitor, holding the baseline in that storage order and fed the setup's records
    # chunk by chunk as a run scores them (the seeded order), decides at the same look
    monitor = Monitor(p, {"mmlu": order}, {"mmlu": base_records})
    by_id = {r.sample_id: r for r in other_records}
    seeded = [by_id[i] for i in order]
    decided_at = next((k + 10 for k in range(0, len(seeded), 10) if monitor.add("mmlu", seeded[k : k + 10])), None)
    assert want.stopped_at is not None and decided_at == want.looks[want.stopped_at].n


def test_a_group_cell_whose_drop_differs_across_members_stays_within_the_level() -> None:
    """Simulation with the real `cell` on a group of three subjects whose drops differ (one -20
    points, two +10: the pool's mean change is 0 on a 5-point gate, so a fail is wrong). The
    baseline's records are stored member after member, as `pooled` gives them. Wrong verdicts
    stay at or under the level; fed subject by subject (the order storage gives) they would be
    most paths."""
    from qeval.analysis.sequential_run import group_ids, pooled

    _, p = _group_plan(sizes=(100, 100, 100))
    order = group_ids(p, "mmlu")
    members = ["mmlu_0", "mmlu_1", "mmlu_2"]
    rng = np.random.default_rng(11)
    paths, wrong, wrong_by_member = 200, 0, 0
    for _ in range(paths):
        base: dict[str, np.ndarray] = {}
        other: dict[str, np.ndarray] = {}
        for m, change in zip(members, (-0.2, 0.1, 0.1), strict=True):
            b = np.zeros(100)
            b[rng.permutation(100)[:60]] = 1.0  # 60 right of 100
            o = b.copy()
            k = int(abs(change) * 100)  # exactly that many flips: the pool's change is exactly 0
            flips = rng.permutation(np.flatnonzero(b == (1.0 if change < 0 else 0.0)))[:k]
            o[flips] = 1.0 - o[flips]
            base[m], other[m] = b, o
        base_records = pooled({m: _records(v, list(range(100))) for m, v in base.items()})
        other_records = pooled({m: _records(v, list(range(100))) for m, v in other.items()})
        traj = cell(p, "mmlu", order, base_records, other_records)
        assert traj is not None
        wrong += traj.verdict == "fail"
        # the same pairs taken member after member: what storage order alone would decide
        by_member = cell(p, "mmlu", [r.sample_id for r in base_records], base_records, other_records)
        assert by_member is not None
        wrong_by_member += by_member.verdict == "fail"
    assert wrong / paths <= p.alpha, (wrong, paths)
    assert wrong_by_member / paths > 0.5  # the check has teeth: the storage order is far off


def test_a_metric_whose_values_leave_0_1_is_never_stopped_and_judged_at_the_cap(tmp_path: Any) -> None:
    """The plan checks the metric's name; the values are checked too: `acc` stored as 0-100 runs no
    confidence sequence (the monitor never stops it, `cell` gives none), and assembly keeps the
    fixed-n verdict at the cap, saying why, in the cell's reason and the block's not_sequential."""
    from qeval.analysis.sequential_run import results_block
    from qeval.records.store import RunStore
    from qeval.results.schema import read_results
    from tests.helpers import ROOT

    results = read_results(ROOT / "tests" / "data" / "run-v1" / "results.json")
    results = results.model_copy(update={"setups": [s for s in results.setups if s.name in ("bf16", "int8")]})
    info = SimpleNamespace(name="compare_mc", kind="native", entry="compare_mc", compared_metric="acc", n_docs=30)
    cfg = _cfg(sequential={"enabled": True, "min_docs": 6, "chunk_docs": 2}, gates=[{"task": "all", "max_drop": 0.5}])
    pre = SimpleNamespace(cfg=cfg, tasks=[info], groups={})
    p = plan(pre)  # type: ignore[arg-type]
    assert p is not None
    ids, _ = task_order(p, info)
    rows = [{"sample_id": i, "metrics": {"acc": 100.0 * (k % 2)}, "prompt_hash": "p"} for k, i in enumerate(ids)]
    base = sample_records(rows)
    monitor = Monitor(p, {"compare_mc": ids}, {"compare_mc": base})
    assert not any(monitor.add("compare_mc", base[k : k + 2]) for k in range(0, 30, 2))
    assert cell(p, "compare_mc", ids, base, base) is None
    store = RunStore(tmp_path / "run")
    for setup in ("bf16", "int8"):
        store.write_task(setup, "compare_mc", "k", sample_records(rows), {}, {}, None)
    out = results_block(results, pre, store)  # type: ignore[arg-type]
    cmp = out.setups[1].vs_baseline["compare_mc"]
    assert cmp.verdict == results.setups[1].vs_baseline["compare_mc"].verdict  # the fixed-n verdict kept
    assert cmp.verdict_reason is not None and "leave [0, 1]" in cmp.verdict_reason
    assert out.sequential is not None and out.sequential.cells == []
    assert "compare_mc" in out.sequential.not_sequential
