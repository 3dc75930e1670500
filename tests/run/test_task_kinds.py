"""The task-kind registry: a kind from a test-only folder (tests/kinds/toy_kind.py), registered
through QEVAL_TASK_KINDS alone, is validated, scored by the real tiny model in the worker,
assembled into results.json and reported; and a kind that is missing or misconfigured is one
line, exit code 2. The run is served by a backend from the same folder (tests/kinds/toy_backend.py,
QEVAL_BACKENDS alone): the backend registry's whole path, at no extra engine start."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, make_config, one_line_exit_2, run_cli

KINDS_DIR = ROOT / "tests" / "kinds"


@pytest.fixture
def toy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker processes inherit the environment: they find the kind the same way."""
    monkeypatch.setenv("PYTHONPATH", f"{KINDS_DIR}:{ROOT}")
    monkeypatch.setenv("QEVAL_TASK_KINDS", "toy_kind:KIND")
    monkeypatch.setenv("QEVAL_BACKENDS", "toy_backend:BACKEND")


def test_a_kind_from_outside_qeval_is_scored_assembled_and_reported(tmp_path: Path, toy_env: None) -> None:
    cfg = make_config(
        tmp_path, tasks=None, gates=[{"task": "toy_next", "max_drop": 0.5}], kinds={"toy": {"count": 8}}, backend="toy"
    )
    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["tasks"]["toy_next"]["kind"] == "toy" and results["tasks"]["toy_next"]["n"] == 8
    for s in results["setups"]:  # scored by the real model in each setup's worker
        assert s["status"] == "ok", s["error"]
        assert s["tasks"]["toy_next"]["n"] == 8 and 0 <= s["tasks"]["toy_next"]["metrics"]["acc"]["value"] <= 1
    int8 = next(s for s in results["setups"] if s["name"] == "int8")
    assert int8["vs_baseline"]["toy_next"]["n"] == 8  # compared, paired by document, like any task
    assert results["toy"] == {"samples_stored": {"bf16": 8, "int8": 8}}  # the kind's own results block
    # served by the toy backend: its resume-key part, and its KV accounting's rules in the memory block
    assert results["run"]["backend"] == "toy"
    for s in results["setups"]:
        assert json.loads((out / "setups" / f"{s['name']}.json").read_text())["key_parts"]["toy_backend"] == "1"
        assert s["memory"]["kv_per_sequence"]["engine"] == "hf"
    report = (out / "report.md").read_text()
    assert "## Toy kind" in report and "| int8 | 8 |" in report
    assert 'id="toy"' in (out / "report.html").read_text()
    # `qeval report` finds the section through the registry too: the same bytes
    (out / "report.md").unlink()
    assert run_cli("report", str(out)).returncode == 0
    assert (out / "report.md").read_text() == report
    # and nothing in qeval names the kind: it came in through the registry alone
    grep = subprocess.run(
        ["grep", "-rl", "toy_kind\\|toy_next\\|toy_backend", str(ROOT / "qeval")], capture_output=True, text=True
    )
    assert grep.stdout == ""


def test_a_bad_kind_piece_is_one_line(tmp_path: Path, toy_env: None) -> None:
    cfg = make_config(tmp_path, tasks=None, kinds={"toy": {"count": 0}})
    one_line_exit_2(run_cli("validate", str(cfg)), "kinds.toy.count: Input should be greater than 0")
    cfg = make_config(tmp_path, tasks=None, kinds={"nope": {}})
    one_line_exit_2(
        run_cli("validate", str(cfg)),
        "no task kind 'nope' (registered: native, lm_eval, long_context, multi_turn, generation, toy)",
    )


def test_a_kind_that_cannot_be_loaded_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QEVAL_TASK_KINDS", "no_such_module:KIND")
    one_line_exit_2(run_cli("validate", str(make_config(tmp_path))), "task kind no_such_module:KIND: cannot be loaded")
