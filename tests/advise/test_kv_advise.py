"""The KV advisor (docs/advisor.md, "Which layers' KV cache to quantize"): bad input is one line
and exit 2 before any model loads; the search keeps the most KL per byte first; and, on the
shipped tiny model, a run with `advise: {kl_target}` measures each layer's KV sensitivity through
transformers' per-layer cache, keeps the cheapest layers within the target, scores and gates the
advised setup beside the uniform KV caches (its KV bytes per token measured against the plan),
and reports the assignment with the `vllm serve` line that serves it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from qeval.advise.kv import cheapest_order
from qeval.cli import app
from tests.helpers import TASKS, make_config, validate_results

SETUPS = (
    {"name": "bf16", "baseline": True},
    {"name": "kv4", "kv_cache": "int4"},
    {"name": "kv2", "kv_cache": "int2"},
    {"name": "int4", "weights": "int4", "group_size": 128},
)
#: the tiny model's uniform INT4 cache is 0.00063 from the baseline in float32 (3 documents of ppl),
#: its layers' gains 0.00006 to 0.00034: a target between keeps a layer or two
ADVISE = {"kl_target": 0.0004, "target": "kv4", "calib_docs": 3, "heldout_docs": 3, "random_draws": 1}


def _config(tmp: Path, advise: dict[str, Any], setups: tuple[dict[str, Any], ...] = SETUPS, **keys: Any) -> Path:
    return make_config(
        tmp, model={"dtype": "float32"}, setups=setups, tasks=["ppl"], tasks_dir=TASKS, advise=advise, **keys
    )


@pytest.mark.parametrize(
    ("advise", "says"),
    [
        ({"kl_target": 0.01, "budget": "5bpw"}, "give budget (the weight advisor: 5bpw, 350MiB) or kl_target"),
        ({"calib_docs": 3}, "give budget (the weight advisor: 5bpw, 350MiB) or kl_target"),
        ({"kl_target": 0}, "advise.kl_target: "),
        ({"kl_target": 0.01, "target": "int4"}, "advise.target int4: the KV advisor lowers a quantized KV cache"),
        ({"kl_target": 0.01, "target": "nope"}, "advise.target: no setup 'nope'"),
    ],
)
def test_bad_kv_advise_block_is_one_line_exit_2(tmp_path: Path, advise: dict[str, Any], says: str) -> None:
    res = CliRunner().invoke(app, ["validate", str(_config(tmp_path, advise))])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and says in res.stderr, res.stderr


def test_no_kv_setup_to_advise_on_and_one_criterion_on_the_command_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"kl_target": 0.01}, setups=(SETUPS[0], SETUPS[3]))
    res = CliRunner().invoke(app, ["validate", str(cfg)])
    assert res.exit_code == 2 and "advise: the config has no setup with a quantized KV cache" in res.stderr
    plain = make_config(tmp_path, filename="p.yaml", setups=SETUPS, tasks=["ppl"], tasks_dir=TASKS)
    for options, says in (
        (["--kl-target", "0.01", "--budget", "5bpw"], "--kl-target and --budget"),
        (["--kl-target", "-1"], "--kl-target -1.0: a KL in nats, above 0"),
    ):
        res = CliRunner().invoke(app, ["advise", str(plain), *options, "--output", str(tmp_path / "a.md")])
        assert res.exit_code == 2 and says in res.stderr, res.stderr


def test_the_cheapest_layers_are_kept_first_until_the_target() -> None:
    """Gain per byte decides the order; the prediction keeps layers until the uniform KL less the
    gains is within the target; a layer that gains nothing is never a candidate."""
    choice = cheapest_order([0.05, 0.20, 0.0, 0.10], [100, 100, 100, 100], uniform=0.30, kl_target=0.08)
    assert choice.order == (1, 3, 0) and choice.kept == 2 and choice.predicted_kl == pytest.approx(0.0)
    assert cheapest_order([0.05], [100], uniform=0.01, kl_target=0.02).kept == 0  # already within it
    never = cheapest_order([0.01, 0.01], [1, 1], uniform=1.0, kl_target=0.02)
    assert never.kept == 2 and never.predicted_kl == pytest.approx(0.98)  # all of them, and it says how far off


@pytest.mark.slow
def test_kv_advice_is_scored_gated_and_reported(tmp_path: Path) -> None:
    cfg, out = _config(tmp_path, ADVISE, setups=SETUPS[:2], limit=8), tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(cfg), "--output", str(out)])
    assert res.exit_code == 0, (res.stderr or res.output)[-3000:]
    validate_results(out / "results.json")
    advice = json.loads((out / "advice.json").read_text())
    setups = {s["name"]: s for s in json.loads((out / "results.json").read_text())["setups"]}
    advised = setups["kv4-advised"]
    kept = advice["setup"]["kv_keep"]
    assert advised["status"] == "ok" and advised["spec"]["kv_keep"] == kept != [] and len(kept) < 4
    assert advice["search"]["kl_target"] == 0.0004 and len(advice["rows"]) == 4  # one unit per layer
    assert all(r["unit"] == f"L{r['layer']}.kv" and r["kind"] == "full" for r in advice["rows"])
    # each kept layer at float32, the rest at int4: predicted and measured by the cache's own bytes
    mem = {n: setups[n]["memory"]["kv_bytes_per_token"] for n in ("bf16", "kv4", "kv4-advised")}
    per_layer = (mem["bf16"]["predicted"] - mem["kv4"]["predicted"]) // 4
    assert mem["kv4-advised"]["predicted"] == mem["kv4"]["predicted"] + per_layer * len(kept)
    assert mem["kv4-advised"]["measured"] == pytest.approx(mem["kv4-advised"]["predicted"], rel=0.02)
    assert advised["vs_baseline"]["ppl"]["verdict"] in ("pass", "fail", "inconclusive")
    # the advice's memory rows and the line that serves it on vLLM
    plan = {r["setup"]: r for r in advice["kv_plan"]}
    assert set(plan) == {"bf16", "kv4", "kv4-advised"} and plan["kv4-advised"]["kv_keep"] == kept
    assert (
        plan["kv4"]["sequences"]["4096"] > plan["kv4-advised"]["sequences"]["4096"] > plan["bf16"]["sequences"]["4096"]
    )
    skip = " ".join(kept)
    assert f"--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers {skip}" in advice["serve_line"]
    md = (out / "report.md").read_text()
    verification = md[md.index("### Verification") : md.index("### Held-out")]
    assert "KV bytes per token predicted" in verification
    assert [line.split(" | ")[0] for line in verification.splitlines() if line.startswith("| kv")] == [
        "| kv4-advised",
        "| kv4",
    ]
    assert "vllm serve" in (out / "advice.md").read_text() and "kv_keep: [" in (out / "advice.md").read_text()
