"""A run on small sliding-window models (random weights: this is about memory): the hf backend
scores them, measures the storage its cache pins for one sequence of budget.context_len, and
that equals the prediction by transformers' rules; the capacity is sized by it, the report
shows it. Under a quantized KV cache (which transformers' own QuantizedCache refuses on a
sliding layer) the windowed layers are qeval's QuantizedSlidingLayer: it scores, and its
measured storage equals the prediction too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import MODEL, make_config, run_cli

pytestmark = pytest.mark.slow
LAYOUTS: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 16},  # every layer sliding, as Mistral-7B-v0.1
    "gemma3_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
    },  # Gemma 3's mix
}


def _tiny(tmp: Path, model_type: str) -> Path:
    """A 2-layer random-weight model of `model_type` with the shipped model's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type,
        **(
            {
                "vocab_size": 128,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 512,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "pad_token_id": 0,
            }
            | LAYOUTS[model_type]
        ),
    )
    folder = tmp / model_type
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODEL / name, folder / name)
    return folder


@pytest.mark.parametrize("model_type", list(LAYOUTS))
def test_a_sliding_window_model_runs_and_its_sequence_is_measured_as_predicted(tmp_path: Path, model_type: str) -> None:
    folder = _tiny(tmp_path, model_type)
    cfg = make_config(
        tmp_path,
        model={"path": str(folder), "dtype": "float32", "max_context": 256},
        setups=[
            {"name": "base", "baseline": True},
            {"name": "int8", "weights": "int8"},
            {"name": "kv-int4", "kv_cache": "int4"},
        ],
        limit=12,
        budget={"gpu_memory_gib": 0.01, "utilization": 0.9, "context_len": 64, "overhead_gib": 0.001},
    )
    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), timeout=900)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert not results["run"].get("skipped_setups"), results["run"]["skipped_setups"]
    assert [s["name"] for s in results["setups"]] == ["base", "int8", "kv-int4"]
    sliding_layers = 2 if model_type == "mistral" else 1
    for s in results["setups"]:
        assert s["status"] == "ok", s["error"]
        assert s["tasks"]["addition"]["n"] == 12  # scored
        seq = s["memory"]["kv_per_sequence"]
        assert seq["measured"] == seq["predicted"], (s["name"], seq)
        if s["name"] == "kv-int4":  # W - 1 tokens x (2 x 2 heads x 16 dims / 2 + 4 groups x 2 x 4-byte scales)
            assert seq["by_layer_type"]["sliding"] == 15 * (32 + 4 * 2 * 4) * sliding_layers
        else:  # W tokens (a slice of the last update's tensor) x 2 x 2 heads x 16 dims x 4 bytes
            assert seq["by_layer_type"]["sliding"] == 16 * 2 * 2 * 16 * 4 * sliding_layers
        assert seq["predicted"] < seq["naive"]  # 64 tokens, a 16-token window: less than tokens x context
        assert "kv_per_sequence" in s["memory"]["capacity_source"]
    assert "## KV cache per sequence" in (out / "report.md").read_text()
