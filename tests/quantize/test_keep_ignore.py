"""`keep:` translated into llm-compressor's `ignore` list: compressed-tensors (run in
.venv-quant, the library that reads it) keeps exactly the layers quanto's fnmatch keeps."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.model.shape import ModelShape
from qeval.quantize.checkpoints import check_keep_fused, ignore_list
from qeval.quantize.pipeline import quant_python

PATTERNS = (
    "model.layers.1.mlp.*",
    "model.layers.[02].self_attn.*",
    "model.layers.3.mlp.down_proj",
    "*.o_proj",
    "model.layers.?.mlp.up_proj",
)


def test_ignore_list_matches_as_keep_does(model_path: Path) -> None:
    names = [n for n, _, _ in ModelShape.from_model_dir(model_path).linear_modules()] + ["lm_head"]
    cases = {p: ignore_list(Setup(name="s", weights="int4", method="gptq", keep=(p,)))[1:] for p in PATTERNS}
    script = (
        "import json, sys\nfrom compressed_tensors.utils.match import match_name\n"
        "names, cases = json.load(sys.stdin)\n"
        "print(json.dumps({p: [n for n in names if any(match_name(n, t) for t in ts)]\n"
        "                  for p, ts in cases.items()}))"
    )
    try:
        python = quant_python()
    except UserError:
        pytest.skip(".venv-quant is not installed")
    out = subprocess.run(
        [python, "-c", script],
        input=json.dumps([names, cases]),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    ignored = json.loads(out.stdout)
    for p in PATTERNS:
        expected = [n for n in names if Setup(name="s", weights="int4", keep=(p,)).keeps(n)]
        assert expected and ignored[p] == expected, p
    assert ignore_list(Setup(name="s", weights="int4", method="gptq"))[0] == "lm_head"


def test_keep_that_splits_a_fused_layer_is_refused(model_path: Path) -> None:
    names = [n for n, _, _ in ModelShape.from_model_dir(model_path).linear_modules()]
    check_keep_fused(Setup(name="ok", weights="int4", method="gptq", keep=("model.layers.1.self_attn.*",)), names)
    check_keep_fused(Setup(name="ok", weights="int4", method="gptq", keep=("*.down_proj",)), names)
    for bad in ("model.layers.1.self_attn.q_proj", "model.layers.0.mlp.up_proj", "nothing.here"):
        with pytest.raises(UserError):
            check_keep_fused(Setup(name="bad", weights="int4", method="gptq", keep=(bad,)), names)
