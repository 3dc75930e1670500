"""The full public benchmark sets (`make lm-eval-full`, scripts/prepare_lm_eval_full.py): every
file checked against its committed sha256, the task YAMLs listed by `qeval tasks`, and every
set scored offline by `qeval run` through lm-eval's own YAMLs (SmolLM2, one document each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, make_config, run_cli

pytestmark = pytest.mark.slow
FULL = ROOT / "tasks" / "lm_eval_full"
SMOLLM2 = ROOT / "models" / "smollm2-135m"
TASKS = [
    "arc_easy_full",
    "arc_challenge_full",
    "hellaswag_full",
    "piqa_full",
    "winogrande_full",
    "openbookqa_full",
    "sciq_full",
    "gsm8k_cot_full",
    "gsm8k_full",
    "lambada_openai_full",
    "mmlu_full",
]
#: documents scored per set, as the wheels ship them (ARC: the test sets)
SIZES = {
    "arc_easy_full": 2376,
    "arc_challenge_full": 1172,
    "hellaswag_full": 10042,
    "piqa_full": 1838,
    "winogrande_full": 1267,
    "openbookqa_full": 500,
    "sciq_full": 1000,
    "gsm8k_cot_full": 1319,
    "lambada_openai_full": 5153,
}


def test_the_sets_are_prepared_and_their_files_checked(tmp_path: Path) -> None:
    assert (FULL / ".prepared").is_file(), "run `make lm-eval-full` (make test does)"
    for task, n in SIZES.items():
        data = sorted(
            (FULL / "data" / task.removesuffix("_full").replace("_cot", "").replace("_openai", "")).glob("*.jsonl")
        )
        assert data, task
        test = next((d for d in data if d.stem == "test"), data[-1])
        assert sum(1 for _ in test.open()) == n, (task, test)
    mmlu = list((FULL / "data" / "mmlu").glob("*/test.jsonl"))
    assert len(mmlu) == 57 and sum(sum(1 for _ in p.open()) for p in mmlu) == 14042
    # a file that is not the one recorded is refused: exit 2, naming it, nothing moved into place
    sums = tmp_path / "sums"
    lines = (ROOT / "scripts" / "lm_eval_full.sha256").read_text().splitlines()
    sums.write_text("\n".join(["0" * 64 + lines[0][64:], *lines[1:]]) + "\n")
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "prepare_lm_eval_full.py"),
            "--out",
            str(tmp_path / "out"),
            "--checksums",
            str(sums),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "differ from" in res.stderr and lines[0][66:] in res.stderr
    assert not (tmp_path / "out").exists()


def test_qeval_tasks_lists_them() -> None:
    res = run_cli("tasks", "--lm-eval", str(FULL))
    assert res.returncode == 0, res.stderr[-2000:]
    for task in [*TASKS[:-1], "mmlu_full_anatomy"]:
        assert task in res.stdout, task


def test_qeval_run_scores_every_set_offline(tmp_path: Path) -> None:
    """One document of each set, through `qeval run` on SmolLM2: lm-eval's prompts, filters and
    metrics on the full sets' own schema; MMLU as its group of 57 subjects in 4 categories."""
    cfg = make_config(
        tmp_path,
        model={"path": str(SMOLLM2), "dtype": "float32", "max_context": 2048},
        setups=[{"name": "base", "baseline": True}],
        tasks=None,
        gates=None,
        limit=1,
        lm_eval={
            "include_path": [str(FULL)],
            "tasks": [{"name": t, **({"max_gen_toks": 48} if "gsm8k" in t else {})} for t in TASKS],
        },
    )
    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    base = results["setups"][0]
    assert base["status"] == "ok", base["error"]
    for task in TASKS:
        assert task in base["tasks"], task
    assert len(results["groups"]["mmlu_full"]) == 57 and base["tasks"]["mmlu_full"]["n"] == 57
    gsm8k = base["tasks"]["gsm8k_cot_full"]["metrics"]
    assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(gsm8k)
