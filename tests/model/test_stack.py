"""A worker's import of transformers' model stack (qeval/model/stack.py): HQQ is left out of the
import and comes back for the setup that asks for the 8-bit KV cache, in a fresh process as a
worker is."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

PROBE = """
import sys
from qeval.model.stack import import_model_stack
import_model_stack()
assert "hqq" not in sys.modules, "hqq imported with the stack"
import transformers.utils as tu
assert tu.is_hqq_available(), "the true answer was not restored"
import torch
from qeval.backends.hf.kv_cache import round_trip_cache
from qeval.config.setups import Setup
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 64, (1, 24))
with torch.no_grad():
    base = model(input_ids=ids).logits.log_softmax(-1)
    cache = round_trip_cache(cfg, Setup(name="kv-int8", weights="fp32", kv_cache="int8"))
    lp = model(input_ids=ids, past_key_values=cache, use_cache=True).logits.log_softmax(-1)
assert "hqq" in sys.modules
kl = float((base.exp() * (base - lp)).sum(-1).mean())
assert 0 < kl < 1e-2, kl
print("ok", kl)
"""


def test_hqq_is_deferred_to_the_int8_kv_cache() -> None:
    res = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr[-3000:]
