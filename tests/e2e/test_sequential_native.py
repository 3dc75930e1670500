"""Issue 42 on the native kind, end to end on the shipped tiny model (float32): a sequential run's
native multiple-choice and generation tasks are cells. Every setup scores them in the run's seeded
order (by the data's own ids), the baseline to the cap and INT8 until its gate is decided; the
multiple-choice task's KL to the baseline is computed against the baseline's top-k sliced to each
chunk; the perplexity task (bits per byte, no bound) is scored whole and named as judged by the
fixed-n interval. A long-context passkey task (generated at one length) is a cell the same way:
its documents in the seeded order by their ids, INT8 stopping where decided. A rerun scores
nothing again."""

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
    seq = {"enabled": True, "min_docs": 8, "chunk_docs": 4, "seed": 2}
    cfg = make_config(
        tmp_path,
        model={"dtype": "float32"},
        tasks=["compare_mc", "addition", "ppl"],
        limit=N,
        gates=[{"task": "all", "max_drop": 0.5}],
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
    plan = {"seed": 2, "max_docs": None}
    for task in ("compare_mc", "addition"):
        expected, _ = task_order(plan, load_task(task, TASKS, N))
        assert expected != sorted(expected)  # a shuffled order, by the data's ids ("cmp-0017", ...)
        assert _ids(out, "bf16", task) == expected  # the baseline: the whole (capped) set, in that order
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
    # INT8 barely changes this model: far inside a 50-point gate, every cell stops early
    assert all(c["stopped_at"] is not None for c in cells.values()) and block["documents"] < block["total"]
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
