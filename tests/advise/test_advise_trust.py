"""Careless input to the advisor (issue 40, points 8 and the budget's minor ones): a path the
advice cannot be written to is refused before the work, not after it; a budget past what a
weight can hold, or a number too large to be one, is one line and exit 2; a budget equal to the
uniform setup is called equal to it. Each is refused in one line with exit 2 (CliRunner: no
model loads before the refusal)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from qeval.cli import app
from tests.helpers import MODEL, TASKS, make_config

SETUPS = ({"name": "bf16", "baseline": True}, {"name": "int4", "weights": "int4", "group_size": 128})
HUGE = "9" * 400


def _config(tmp: Path, advise: dict[str, Any] | None = None, model: Path = MODEL) -> Path:
    return make_config(
        tmp,
        model={"path": model, "dtype": "float32"},
        setups=SETUPS,
        tasks=["ppl"],
        tasks_dir=TASKS,
        advise=advise or None,
    )


def _one_line_exit_2(args: list[str], says: str) -> None:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, (args, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert "advise: " not in res.stderr  # the advisor's first progress line: no work was done


@pytest.mark.parametrize("where", ["folder", "html_folder", "under_a_file", "unwritable"])
def test_advise_output_it_cannot_write_is_refused_before_the_work(tmp_path: Path, where: str) -> None:
    """A folder as --output (or where advice.html would go), or a file on the way: before this,
    every pass ran and the advice was lost to an IsADirectoryError at the end (exit 1)."""
    cfg = _config(tmp_path)
    out = {
        "folder": tmp_path / "outdir",
        "html_folder": tmp_path / "advice.md",
        "under_a_file": cfg / "advice.md",
        "unwritable": Path("/proc/qeval-advice/advice.md"),
    }[where]  # a folder nothing is written in
    (tmp_path / "outdir").mkdir()
    (tmp_path / "advice.html").mkdir()
    _one_line_exit_2(["advise", str(cfg), "--budget", "6bpw", "--output", str(out)], f"--output {out}")
    assert not (tmp_path / "advice.json").exists() and not any((tmp_path / "outdir").iterdir())


def test_advise_output_inside_the_model_folder_is_refused(tmp_path: Path) -> None:
    """`qeval run` refuses a run directory inside the model folder (its checksum would change):
    `qeval advise --output` there is refused by the same check, and nothing is written."""
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    before = sorted(p.name for p in model.iterdir())
    cfg = _config(tmp_path, model=model)
    _one_line_exit_2(
        ["advise", str(cfg), "--budget", "6bpw", "--output", str(model / "sub" / "advice.md")],
        "inside the model folder",
    )
    assert sorted(p.name for p in model.iterdir()) == before


@pytest.mark.parametrize(
    ("budget", "says"),
    [
        (HUGE + "bpw", "at most 16 bits per weight"),
        (HUGE + "MiB", "at most 1,048,576 GiB"),
        ("17bpw", "at most 16 bits per weight"),
        ("4.25bpw", "equal to the uniform int4 setup itself"),
    ],
)
def test_budget_bounds_in_validate_and_advise(tmp_path: Path, budget: str, says: str) -> None:
    """A 400-digit budget ended both commands in an OverflowError (exit 1); a budget above the
    model's own 16 bits was accepted; INT4 with group 128 at 4.25 bits was called "below" itself."""
    _one_line_exit_2(["validate", str(_config(tmp_path, {"budget": budget}))], says)
    _one_line_exit_2(["advise", str(_config(tmp_path)), "--budget", budget, "--output", str(tmp_path / "a.md")], says)
    assert not (tmp_path / "a.md").exists()


def test_advise_seed_is_bounded(tmp_path: Path) -> None:
    _one_line_exit_2(["validate", str(_config(tmp_path, {"budget": "6bpw", "seed": 2**32}))], "advise.seed")
    _one_line_exit_2(
        [
            "advise",
            str(_config(tmp_path)),
            "--budget",
            "6bpw",
            "--seed",
            str(2**64),
            "--output",
            str(tmp_path / "a.md"),
        ],
        "--seed",
    )


def test_plan_prints_whole_sequences() -> None:
    """`qeval plan` printed "5009.55 sequences": the table counts whole sequences (floor); --json
    keeps the exact figure."""
    import json
    import math
    import re

    from tests.helpers import run_cli

    args = ("plan", "--model", str(MODEL), "--gpu-gib", "1", "--context-len", "100", "--overhead-gib", "0")
    rows = json.loads(run_cli(*args, "--json").stdout)["setups"]
    assert any(r["max_concurrency"] != int(r["max_concurrency"]) for r in rows)  # a fraction to floor
    table = run_cli(*args).stdout
    checked = 0
    for r in rows:  # a narrow terminal cuts the longest names: the rows whose name shows whole
        line = next((x for x in table.splitlines() if re.search(rf"[│|] {re.escape(r['setup'])} ", x)), None)
        if line is not None:
            assert f" {math.floor(r['max_concurrency']):,} " in line and f"{r['max_concurrency']:g}" not in line, line
            checked += 1
    assert checked >= 3, table
