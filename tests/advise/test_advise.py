"""The mixed-precision advisor on the shipped tiny model: the probe's swapped weights are the
served quanto model's, the sensitivity table is self-consistent, the search respects the
budget, and bad input is one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qeval.advise.advisor import Options, advise
from qeval.advise.output import write
from qeval.advise.search import choose, parse_budget
from qeval.advise.sensitivity import Probe
from qeval.advise.units import KINDS, cells
from qeval.backends.hf import quant as hf_quant
from qeval.config import load_config
from qeval.config.advise import AdviceBudget
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.ledger import predict_weights_bytes
from qeval.model.shape import ModelShape
from tests.helpers import ROOT

DEMO = ROOT / "configs" / "demo.yaml"


def test_probe_swaps_in_exactly_the_served_weights(model_path: Path) -> None:
    """A kept-L1.mlp candidate in the probe gives the logits of the model quanto serves with
    `keep: [model.layers.1.mlp.*]`: the sensitivity measures the setup that will run."""
    from transformers import AutoModelForCausalLM

    target = Setup(name="i4", weights="int4", group_size=128)
    units = cells(ModelShape.from_model_dir(model_path), target, "float32")
    names = [m for u in units for m in u.modules]
    probe = Probe(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), target, names)
    served = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    hf_quant.quantize_weights(served, target.model_copy(update={"keep": ("model.layers.1.mlp.*",)}))
    doc = [[1, 40, 41, 42, 43, 50, 60, 70, 12, 13]]
    kept = {f"model.layers.1.{n}" for n in KINDS["mlp"]}
    probe.use(set(names) - kept)
    got = next(iter(probe._logprobs(doc)))
    with torch.no_grad():
        want = torch.log_softmax(served(input_ids=torch.tensor(doc)).logits[0, :-1].float(), -1)
    assert torch.allclose(got, want, atol=1e-5)
    probe.use(set())  # and back to the model's own weights: a different model
    assert not torch.allclose(next(iter(probe._logprobs(doc))), want, atol=1e-3)


def test_search_exact_and_greedy() -> None:
    assert choose([0.5, 0.4, 0.3], [10, 6, 5], 11).kept == (1, 2)  # exact beats greedy-by-ratio here
    assert choose([0.5, 0.4, 0.3], [10, 6, 5], 11).method == "exact"
    assert choose([0.5, -0.1, 0.3], [10, 1, 5], 100).kept == (0, 2)  # a negative gain is never kept
    gains, costs = [float(i % 7) + 0.1 for i in range(20)], [3 + i % 5 for i in range(20)]
    greedy = choose(gains, costs, 25)
    assert greedy.method == "greedy" and greedy.extra_bytes <= 25
    with pytest.raises(UserError):
        choose([0.1], [1], -1)
    assert parse_budget("4.5bpw") == AdviceBudget("bits", 4.5)
    assert parse_budget("2MiB") == AdviceBudget("bytes", 2 * 2**20)
    for bad in ("4.5", "lots", "-3MiB", "0bpw"):
        with pytest.raises(UserError):
            parse_budget(bad)


def test_advise_on_the_tiny_model(tmp_path: Path) -> None:
    opts = Options(parse_budget("6bpw"), calib_docs=3, heldout_docs=4, random_draws=2)
    cfg = load_config(DEMO)
    cfg.model.dtype = "float32"  # bfloat16 matmuls this small are slower on a CPU, even a native one
    advice = advise(cfg, DEMO, opts, log=lambda m: None)
    rows = {r.unit: r for r in advice.rows}
    assert len(rows) == 4 * 2 + 4 + 2  # cells, blocks, types
    # keeping every MLP is quantizing only the attention: the two directions meet exactly
    assert rows["mlp"].gain_kl == pytest.approx(advice.uniform_kl - rows["attn"].cost_kl, abs=1e-9)
    assert advice.uniform_kl > 0 and all(r.cost_kl >= 0 for r in advice.rows)
    setup = advice.setup
    shape = ModelShape.from_model_dir(Path(cfg.model.path))
    linear_params = sum(o * i for o, i in shape.linear_shapes())
    linear_bytes = predict_weights_bytes(shape, setup, "float32") - shape.other_params() * 4
    assert advice.search.kept and linear_bytes * 8 / linear_params <= 6
    for unit in advice.search.kept:
        layer, kind = unit[1:].split(".")
        assert all(setup.keeps(f"model.layers.{layer}.{n}") for n in KINDS[kind])
    assert advice.mixes[0].weights_bytes < advice.mixes[1].weights_bytes == advice.mixes[2].weights_bytes
    assert advice.versus_random.ci95 is not None and advice.timing.passes == 1 + 2 * len(rows)
    paths = write(advice, tmp_path / "advice.md")
    assert "<svg" in paths[1].read_text() and "keep:" in paths[0].read_text()


def test_bad_advise_input_is_one_line_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from qeval.cli import app

    for args, says in (
        (["--budget", "lots"], "--budget"),
        ([], "--budget is required"),
        (["--budget", "5bpw", "--target", "nope"], "--target"),
        (["--budget", "5bpw", "--target", "kv-int4"], "--target"),
        (["--budget", "3bpw"], "below the uniform"),
        (["--budget", "5bpw", "--text", str(tmp_path / "none.txt")], "--text"),
    ):
        res = CliRunner().invoke(app, ["advise", str(DEMO), *args, "--output", str(tmp_path / "a.md")])
        assert res.exit_code == 2, (args, res.output)
        assert len(res.stderr.strip().splitlines()) == 1 and says in res.stderr, (args, res.stderr)
    assert not (tmp_path / "a.md").exists()
