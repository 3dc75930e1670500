"""Issue 42 on the native kind, end to end on the shipped tiny model (float32): a sequential run's
native multiple-choice and generation tasks are cells. Every setup scores them in the run's seeded
order (by the data's own ids), in passes (qeval/run/passes.py): the baseline as far as the furthest
undecided cell needs, INT8 until its gate is decided; the multiple-choice task's KL to the baseline
is computed against the baseline's top-k sliced to each chunk; the perplexity task (bits per byte,
no bound) is scored whole and named as judged by the fixed-n interval; a rerun scores nothing
again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from qeval.analysis.sequential_run import task_order
from qeval.tasks.native.tasks import load_task
from tests.helpers import TASKS, make_config, run_cli

pytestmark = pytest.mark.slow

N = 40


def _ids(run: Path, setup: str, task: str) -> list[str]:
    return [json.loads(x)["sample_id"] for x in (run / "samples" / setup / f"{task}.jsonl").read_text().splitlines()]


def test_native_cells_stop_where_decided_in_the_seeded_order(tmp_path: Path) -> None:
    """Pass 1's horizon is 4 x the first look at the floor, 32 of the 40 documents: the 50-point
    gate on compare_mc decides before it, so the baseline scores compare_mc no further than 32;
    the 0.1-point gate on addition (INT8 hardly changes an answer: the sequence straddles it) stays
    undecided, so pass 2 extends addition alone, baseline and INT8 carrying on from document 32."""
    seq = {"enabled": True, "min_docs": 8, "chunk_docs": 4, "seed": 2}
    cfg = make_config(
        tmp_path,
        model={"dtype": "float32"},
        tasks=["compare_mc", "addition", "ppl"],
        limit=N,
        gates=[{"task": "all", "max_drop": 0.5}, {"task": "addition", "max_drop": 0.001}],
        sequential=seq,
    )
    out = tmp_path / "out"
    res = run_cli("run", str(cfg), "--output", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    block = r["sequential"]
    cells = {(c["setup"], c["task"]): c for c in block["cells"]}
    assert set(cells) == {("int8", "compare_mc"), ("int8", "addition")}
    assert set(block["not_sequential"]) == {"ppl"} and "bits_per_byte" in block["not_sequential"]["ppl"]
    plan = {"seed": 2, "max_docs": None}
    # the passes: 32 documents (4 x the first look at the floor, 8), then the cap
    assert "sequential pass 1: horizon 32 documents; 1 setup still undecided" in res.stderr
    assert "sequential pass 2: horizon 40 documents; 1 setup still undecided" in res.stderr
    assert "sequential pass 3" not in res.stderr
    for task in ("compare_mc", "addition"):
        expected, _ = task_order(plan, load_task(task, TASKS, N))
        assert expected != sorted(expected)  # a shuffled order, by the data's ids ("cmp-0017", ...)
        scored = _ids(out, "int8", task)
        assert scored == expected[: len(scored)]  # INT8: a prefix of the same order
        c = cells[("int8", task)]
        assert c["documents"] == len(scored) and c["total"] == N
        if c["stopped_at"] is not None:
            assert c["verdict"] == "pass" and len(scored) < N and len(scored) % 4 == 0 and len(scored) >= 8
    # INT8 barely changes this model: far inside a 50-point gate it stops before pass 1's horizon, and
    # the baseline scored compare_mc that far only, a prefix of the same order
    mc_order, _ = task_order(plan, load_task("compare_mc", TASKS, N))
    assert cells[("int8", "compare_mc")]["stopped_at"] is not None and cells[("int8", "compare_mc")]["documents"] < 32
    assert _ids(out, "bf16", "compare_mc") == mc_order[:32]
    # ...but never decides a 0.1-point gate: scored to the cap, and the baseline with it, over two passes
    add_order, _ = task_order(plan, load_task("addition", TASKS, N))
    assert (
        cells[("int8", "addition")]["stopped_at"] is None and cells[("int8", "addition")]["verdict"] == "inconclusive"
    )
    assert _ids(out, "bf16", "addition") == _ids(out, "int8", "addition") == add_order  # each document once
    for setup in ("bf16", "int8"):  # pass 2 carried on from the 32 documents pass 1 stored, not from 0
        assert f"{setup}: addition: carrying on from document 32 (scored by an earlier pass)" in res.stderr
        assert f"{setup}: compare_mc: carrying on" not in res.stderr  # decided: not extended
    assert block["baseline"] == {"compare_mc": {"documents": 32, "total": N}, "addition": {"documents": N, "total": N}}
    bf16 = next(s for s in r["setups"] if s["name"] == "bf16")
    assert bf16["tasks"]["compare_mc"]["n"] == 32 and bf16["tasks"]["addition"]["n"] == N
    # documents scored: the baseline's real ones (32 + 40), INT8's, and ppl's whole sets
    n_int8 = sum(c["documents"] for c in cells.values())
    assert block["documents"] == 32 + N + n_int8 + 2 * N and block["total"] == 6 * N
    md = (out / "report.md").read_text()
    assert "compare_mc: baseline: 32 of 40 documents" in md and "addition: baseline: 40 of 40 documents" in md
    int8 = next(s for s in r["setups"] if s["name"] == "int8")
    assert int8["tasks"]["ppl"]["n"] == N  # not a cell: scored whole
    mc = [json.loads(x) for x in (out / "samples" / "int8" / "compare_mc.jsonl").read_text().splitlines()]
    # the KL reference followed the order: every chunk's records carry a finite KL, near 0 for INT8
    assert all(m["kl"] is not None and math.isfinite(m["kl"]) and m["kl"] >= 0 for m in mc)
    assert sum(m["top1_agreement"] for m in mc) / len(mc) > 0.9
    assert int8["vs_baseline"]["compare_mc"]["verdict_reason"].startswith(f"sequential: decided after {len(mc)} of {N}")

    again = run_cli("run", str(cfg), "--output", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("skipped") == 2
    assert json.loads((out / "results.json").read_text())["sequential"] == block
