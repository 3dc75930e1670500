"""An `advise:` block in a run config (docs/advisor.md, "In a run"): bad input is one line and
exit 2 before any model loads; the advice key follows the advice's inputs; and, on the shipped
tiny model, a run computes the advice in its own process, stores advice.json, scores and gates the
advised setup beside the uniform INT4 one, reports the heatmaps and the verification table, and
a rerun reuses the stored advice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from qeval.cli import app
from qeval.config import load_config
from qeval.run.advice import advice_key
from qeval.run.preflight import preflight
from tests.helpers import TASKS, make_config, validate_results

SETUPS = (
    {"name": "bf16", "baseline": True},
    {"name": "int4", "weights": "int4", "group_size": 128},
    {"name": "kv4", "kv_cache": "int4"},
)
#: 6 bits per weight leaves room for one attention cell of the tiny model over uniform INT4 (4.25)
ADVISE = {"budget": "6bpw", "calib_docs": 3, "heldout_docs": 3, "random_draws": 1, "unions": False}


def _config(tmp: Path, advise: dict[str, Any], setups: tuple[dict[str, Any], ...] = SETUPS, **keys: Any) -> Path:
    return make_config(
        tmp, model={"dtype": "float32"}, setups=setups, tasks=["ppl"], tasks_dir=TASKS, advise=advise, **keys
    )


@pytest.mark.parametrize(
    ("advise", "says"),
    [
        ({"budget": "lots"}, "advise.budget: 'lots': give average bits per weight"),
        ({"budget": "5bpw", "target": "nope"}, "advise.target: no setup 'nope'"),
        ({"budget": "5bpw", "target": "kv4"}, "advise.target kv4: the advisor lowers quanto's weights"),
        ({"budget": "3bpw"}, "advise.budget 3bpw: below the uniform int4 setup itself"),
        ({"budget": "5bpw", "name": "bf16"}, "advise: the advised setup's name 'bf16' is a setup of the config"),
        ({"budget": "5bpw", "text": "none.txt"}, "advise.text:"),
        ({"budget": "5bpw", "calib_docs": 390, "heldout_docs": 20}, "fewer than calib_docs 390 + heldout_docs 20"),
        ({"budget": "5bpw", "heldout_docs": 1}, "advise.heldout_docs: 1: a paired interval"),
        ({"budget": "5bpw", "calib": 3}, "advise.calib: unknown key"),
    ],
)
def test_bad_advise_block_is_one_line_exit_2(tmp_path: Path, advise: dict[str, Any], says: str) -> None:
    cfg = _config(tmp_path, advise)
    for command in (["validate", str(cfg)], ["run", str(cfg), "--output", str(tmp_path / "out")]):
        res = CliRunner().invoke(app, command)
        assert res.exit_code == 2, (command, res.output)
        assert len(res.stderr.strip().splitlines()) == 1 and says in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()  # refused before the run directory was taken


def test_no_uniform_setup_to_advise_on(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"budget": "5bpw"}, setups=(SETUPS[0], SETUPS[2]))
    res = CliRunner().invoke(app, ["validate", str(cfg)])
    assert res.exit_code == 2 and "advise: the config has no int4 or int8 setup" in res.stderr


def test_advice_key_follows_its_inputs(tmp_path: Path) -> None:
    """A changed budget, slice or seed is another key (the advice is recomputed); the same block
    is the same key (reused); the deployment context counts for a memory budget only."""

    def key(budget_block: dict[str, Any] | None = None, **change: Any) -> str:
        path = _config(tmp_path, ADVISE | change, budget=budget_block or None)
        return advice_key(preflight(load_config(path)))[0]

    same = key()
    assert key() == same
    assert {key(budget="5.5bpw"), key(calib_docs=4), key(seed=1), key(unions=True), key(name="mix")}.isdisjoint({same})
    assert len({key(budget="5.5bpw"), key(budget="5.50bpw")}) == 1  # the budget as read, not as written
    assert key({"context_len": 512}) == same  # bits per weight: no context in it
    mib = key(budget="10.5MiB")  # room for some cells, not all of them, at 4096 and at 4000 tokens
    assert key({"context_len": 4000}, budget="10.5MiB") != mib and key(budget="10752KiB") == mib


@pytest.fixture(scope="module")
def advised_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("advise-run")
    cfg, out = _config(tmp, ADVISE, setups=SETUPS[:2], limit=8), tmp / "run"
    res = _run(cfg, out)
    assert "in a fresh process" in res.stderr and (out / "jobs" / "_advise.json").is_file()  # the advisor's job
    return cfg, out, json.loads((out / "results.json").read_text())


def _run(cfg: Path, out: Path) -> Any:
    """`qeval run` in this process (the advisor and the setups still run in processes of their
    own), saving an interpreter start per run; results.json checked against the JSON Schema."""
    res = CliRunner().invoke(app, ["run", str(cfg), "--output", str(out)])
    assert res.exit_code == 0, (res.stderr or res.output)[-3000:]
    validate_results(out / "results.json")
    return res


@pytest.mark.slow
def test_advised_setup_is_scored_gated_and_reported(advised_run: tuple[Path, Path, dict[str, Any]]) -> None:
    _, out, r = advised_run
    advice = json.loads((out / "advice.json").read_text())
    setups = {s["name"]: s for s in r["setups"]}
    advised = setups["int4-advised"]
    assert advised["status"] == "ok" and advised["spec"]["keep"] == advice["setup"]["keep"] != []
    assert advised["tasks"]["ppl"]["n"] == 8 and advised["vs_baseline"]["ppl"]["verdict"] in ("pass", "fail")
    assert advised["vs_baseline"]["ppl"]["kl"] is not None
    # the kept cells cost what the advisor predicted, and the measured weights grow by about that
    a = r["advice"]
    assert a["setup"] == "int4-advised" and a["target"] == "int4" and not a["reused"]
    assert (
        advised["memory"]["weights_bytes"]["predicted"] - setups["int4"]["memory"]["weights_bytes"]["predicted"]
        == a["search"]["extra_bytes"]
        > 0
    )
    assert advised["memory"]["weights_bytes"]["measured"] > setups["int4"]["memory"]["weights_bytes"]["measured"]
    assert len(a["units"]) == 8 and {m["name"] for m in a["heldout"]} >= {"int4", "int4-advised", "random-1"}
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    verification = md[md.index("### Verification") : md.index("### Held-out")]
    rows = [line for line in verification.splitlines() if line.startswith("| int4")]
    assert [row.split(" | ")[0] for row in rows] == ["| int4-advised", "| int4"]
    assert all(row.rstrip(" |").endswith(("pass", "fail", "inconclusive")) for row in rows)
    assert "### Sensitivity (layer x module type)" in md and "| 3 |" in md
    assert html.count("Advisor sensitivity") == 2 and html.count("<svg") >= 5  # two heatmaps beside the plots
    import qeval

    table = qeval.load_run(out).advice()
    assert len(table) == 8 and table["kept"].sum() == len(a["search"]["kept"])


@pytest.mark.slow
def test_rerun_reuses_the_stored_advice(advised_run: tuple[Path, Path, dict[str, Any]]) -> None:
    cfg, out, _ = advised_run
    stamp = (out / "advice.json").stat().st_mtime_ns
    res = _run(cfg, out)
    assert "advice.json is stored under this run's key: reused" in res.stderr
    assert "in a fresh process" not in res.stderr and "int4-advised: all 1 tasks stored, skipped" in res.stderr
    assert (out / "advice.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "results.json").read_text())["advice"]["reused"] is True


def test_qeval_advise_reads_the_block(tmp_path: Path) -> None:
    """`qeval advise CONFIG` takes the block's values where no option is given (here refused
    before any model loads, naming what it read); an option given overrides the block's."""

    def advise(block: dict[str, Any], *options: str) -> str:
        res = CliRunner().invoke(
            app, ["advise", str(_config(tmp_path, block)), *options, "--output", str(tmp_path / "a.md")]
        )
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
        return res.stderr

    assert "--budget 3 bits per weight: below the uniform int4" in advise({"budget": "3bpw"})
    assert "--target kv4" in advise({"budget": "6bpw", "target": "kv4"})
    assert "below the uniform int4" in advise(
        {"budget": "6bpw", "target": "kv4"}, "--target", "int4", "--budget", "3bpw"
    )
