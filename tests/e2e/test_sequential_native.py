"""Issue 42 on the native kind, end to end on the shipped tiny model (float32): a sequential run's
native multiple-choice and generation tasks are cells. Every setup scores them in the run's seeded
order (by the data's own ids), in passes (qeval/run/passes.py): the baseline as far as the furthest
undecided cell needs, INT8 until its gate is decided; the multiple-choice task's KL to the baseline
is computed against the baseline's top-k sliced to each chunk; the perplexity task (bits per byte,
no bound) is scored whole and named as judged by the fixed-n interval. A long-context passkey task
(generated at one length) is a cell the same way: its documents in the seeded order by their ids.
A rerun scores nothing again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from qeval.analysis.sequential_run import task_order
from qeval.tasks.native.tasks import load_task
from tests.helpers import TASKS, make_config, run_cli, seq_plan

pytestmark = pytest.mark.slow

N = 40


def _ids(run: Path, setup: str, task: str) -> list[str]:
    return [json.loads(x)["sample_id"] for x in (run / "samples" / setup / f"{task}.jsonl").read_text().splitlines()]


def test_native_cells_stop_where_decided_in_the_seeded_order(tmp_path: Path) -> None:
    """Pass 1's horizon is 4 x the first look at the floor, 32 of the 40 documents: the 50-point
    gate on addition decides before it, so the baseline scores addition no further than 32; the
    0.1-point gate on compare_mc (INT8 hardly changes an answer: the sequence straddles it) stays
    undecided, so pass 2 extends compare_mc alone: the baseline carries on from document 32 (its
    records and top-k), and so does INT8 against the baseline's extended top-k (its KL reference:
    its per-token divergence saved at the horizon carried on too)."""
    seq = {"enabled": True, "min_docs": 8, "chunk_docs": 4, "seed": 2}
    cfg = make_config(
        tmp_path,
        model={"dtype": "float32"},
        tasks=["compare_mc", "addition", "ppl"],
        limit=N,
        gates=[{"task": "all", "max_drop": 0.5}, {"task": "compare_mc", "max_drop": 0.001}],
        sequential=seq,
        long_context={"tasks": ["passkey"], "lengths": [256], "samples": 12, "depths": [0.5], "chunk_tokens": 64},
    )
    out = tmp_path / "out"
    res = run_cli("run", str(cfg), "--output", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    block = r["sequential"]
    cells = {(c["setup"], c["task"]): c for c in block["cells"]}
    assert set(cells) == {("int8", "compare_mc"), ("int8", "addition"), ("int8", "passkey_256")}
    assert set(block["not_sequential"]) == {"ppl"} and "bits_per_byte" in block["not_sequential"]["ppl"]
    plan = seq_plan(seed=2)
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
    # the long-context cell: its generated documents in the seeded order by their ids, INT8 a prefix
    passkey = _ids(out, "int8", "passkey_256")
    assert sorted(_ids(out, "bf16", "passkey_256")) == sorted(set(_ids(out, "bf16", "passkey_256")))
    assert len(_ids(out, "bf16", "passkey_256")) == 12 and passkey == _ids(out, "bf16", "passkey_256")[: len(passkey)]
    assert cells[("int8", "passkey_256")]["documents"] == len(passkey) and cells[("int8", "passkey_256")]["total"] == 12
    assert cells[("int8", "passkey_256")]["stopped_at"] is not None  # INT8 barely changes this model
    # INT8 barely changes this model: far inside a 50-point gate it stops before pass 1's horizon, and
    # the baseline scored addition that far only, a prefix of the same order
    add_order, _ = task_order(plan, load_task("addition", TASKS, N))
    assert cells[("int8", "addition")]["stopped_at"] is not None and cells[("int8", "addition")]["documents"] < 32
    assert _ids(out, "bf16", "addition") == add_order[:32]
    # ...but never decides a 0.1-point gate: scored to the cap, and the baseline with it, over two passes
    mc_order, _ = task_order(plan, load_task("compare_mc", TASKS, N))
    mc_cell = cells[("int8", "compare_mc")]
    assert mc_cell["stopped_at"] is None and mc_cell["verdict"] == "inconclusive"
    assert _ids(out, "bf16", "compare_mc") == _ids(out, "int8", "compare_mc") == mc_order  # each document once
    # pass 2 carried on from the 32 documents pass 1 stored, not from 0: the baseline with its top-k,
    # INT8 with its per-token divergence from the baseline (saved in its scratch folder at the horizon)
    for setup in ("bf16", "int8"):
        assert f"{setup}: compare_mc: carrying on from document 32 (scored by an earlier pass)" in res.stderr
    assert ": addition: carrying on" not in res.stderr  # decided in pass 1: not extended
    assert block["baseline"] == {
        "compare_mc": {"documents": N, "total": N},
        "addition": {"documents": 32, "total": N},
        "passkey_256": {"documents": 12, "total": 12},  # under pass 1's horizon: to the cap in pass 1
    }
    bf16 = next(s for s in r["setups"] if s["name"] == "bf16")
    assert bf16["tasks"]["compare_mc"]["n"] == N and bf16["tasks"]["addition"]["n"] == 32
    # the baseline's top-k: pass 1's 32 documents and pass 2's 8, one request per choice of each
    with np.load(out / "samples" / "bf16" / "compare_mc.topk.npz") as z:
        choices = [
            len(json.loads(x)["loglikelihoods"])
            for x in (out / "samples" / "bf16" / "compare_mc.jsonl").read_text().splitlines()
        ]
        assert len(z["offsets"]) == sum(choices) + 1
    # documents scored: the baseline's real ones (40 + 32), INT8's, and ppl's whole sets
    n_int8 = sum(c["documents"] for c in cells.values())
    assert block["documents"] == N + 32 + 12 + n_int8 + 2 * N and block["total"] == 6 * N + 2 * 12
    md = (out / "report.md").read_text()
    assert "compare_mc: baseline: 40 of 40 documents" in md and "addition: baseline: 32 of 40 documents" in md
    int8 = next(s for s in r["setups"] if s["name"] == "int8")
    assert int8["tasks"]["ppl"]["n"] == N  # not a cell: scored whole
    mc = [json.loads(x) for x in (out / "samples" / "int8" / "compare_mc.jsonl").read_text().splitlines()]
    # the KL reference followed the order over both passes: every record carries a finite KL, near 0 for INT8
    assert len(mc) == N and all(m["kl"] is not None and math.isfinite(m["kl"]) and m["kl"] >= 0 for m in mc)
    assert sum(m["top1_agreement"] for m in mc) / len(mc) > 0.9
    meta = json.loads((out / "samples" / "int8" / "compare_mc.meta.json").read_text())
    # the token-level KL distribution covers both passes' documents: every token of the baseline's top-k
    with np.load(out / "samples" / "bf16" / "compare_mc.topk.npz") as z:
        assert meta["kl_distribution"]["tokens"] == sum(m["kl_tokens"] for m in mc) == len(z["indices"])
    assert int8["vs_baseline"]["compare_mc"]["verdict_reason"] == f"sequential: not decided after {N} of {N} documents"

    again = run_cli("run", str(cfg), "--output", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("skipped") == 2 and "sequential pass 2" not in again.stderr  # nothing open
    assert json.loads((out / "results.json").read_text())["sequential"] == block
