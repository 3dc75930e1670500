"""One `qeval run` end to end on the tiny model (a chat template added to a copy of its folder):
a native generation task with `generation_divergence:` and the multi-turn probes, a 16-bit
baseline and a 2-bit KV cache, gates at a turn and at a generated position. results.json (checked
against the schema by run_cli), report.md / report.html and load_run carry the tables; the rerun
resumes everything."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import qeval
from tests.helpers import TASKS, config_dict, cpu_dtype, run_cli, write_config
from tests.tasks.test_multi_turn import TEMPLATE


@pytest.mark.slow
def test_generation_divergence_and_multi_turn_run(model_path: Path, tmp_path: Path) -> None:
    model = tmp_path / "qeval-tiny-chat"
    shutil.copytree(model_path, model)
    (model / "chat_template.jinja").write_text(TEMPLATE)
    cfg = write_config(
        tmp_path / "c.yaml",
        config_dict(
            model={"path": model, "dtype": cpu_dtype()},
            tasks_dir=TASKS,
            tasks=["addition"],
            setups=[{"name": "base", "baseline": True}, {"name": "kv2", "kv_cache": "int2"}],
            gates=[
                {"task": "multi_turn", "turn": 3, "max_drop": 0.5},
                {"task": "addition", "position": 2, "max_drop": 0.05},
            ],
            kinds={
                "multi_turn": {"turns": [2, 3], "samples": 8, "filler_words": 0, "system_prompt": "", "max_gen_toks": 4}
            },
            generation_divergence={"position_buckets": [0, 2, 4], "length_buckets": [0, 3]},
        ),
    )
    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "6", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    gen = results["generation_divergence"]
    assert gen["tasks"] == ["addition", "multi_turn_t2", "multi_turn_t3"]
    base = gen["setups"]["base"]["addition"]["positions"]
    kv2 = gen["setups"]["kv2"]["addition"]["positions"]
    assert base and all(b["kl"] is None and b["delta"] is None for b in base)
    assert [b["start"] for b in kv2] == [b["start"] for b in base] and all(b["kl"] > 0 for b in kv2)
    gated = [b for b in kv2 if b["start"] == 2][0]
    assert gated["max_drop"] == 0.05 and gated["verdict"] in ("pass", "fail", "inconclusive")
    assert all(b["verdict"] is None for b in kv2 if b["start"] != 2)
    assert sum(b["documents"] for b in gen["setups"]["kv2"]["addition"]["answer_lengths"]) == 6
    turns = results["multi_turn"]
    assert turns["turns"] == [2, 3] and turns["tasks"] == {"2": "multi_turn_t2", "3": "multi_turn_t3"}
    points = {p["turn"]: p for p in turns["setups"]["kv2"]}
    assert points[3]["verdict"] in ("pass", "fail", "inconclusive") and points[2]["verdict"] is None
    assert points[2]["kl"] > 0 and points[3]["gap_tokens"] > points[2]["gap_tokens"] == 0
    kv2_scores = next(s for s in results["setups"] if s["name"] == "kv2")["vs_baseline"]
    assert kv2_scores["multi_turn_t3"]["verdict"] == points[3]["verdict"]  # the ordinary comparison's
    assert kv2_scores["addition"]["gate"] is None  # a position gate is not the task's own gate
    md = (out / "report.md").read_text()
    assert "## Divergence along the generation" in md and "## Multi-turn probes" in md
    assert "6 of the 8 generated conversations per turn" in md  # --limit: what was scored, not generated
    html = (out / "report.html").read_text()
    assert "KL against generated position" in html and "accuracy against question turn" in html
    run = qeval.load_run(out)
    assert set(run.generation_positions()["setup"]) == {"base", "kv2"}
    assert len(run.multi_turn()) == 4 and len(run.generation_lengths()) > 0
    again = run_cli("run", str(cfg), "--output", str(out), "--limit", "6", timeout=300)
    assert again.returncode == 0 and again.stderr.count("skipped") == 2, again.stderr[-1500:]
    assert json.loads((out / "results.json").read_text())["generation_divergence"] == gen
