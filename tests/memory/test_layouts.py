"""Every attention layout's memory (docs/memory.md, "Attention layouts"): the layer kinds as
transformers' config classes resolve them, the per-sequence KV and state of six public shapes
(tests/data) at 4k and 128k against the values worked by hand from vLLM 0.32.0's and
transformers 5.23.0's rules, and the caches transformers really builds on small random-weight
instances of each architecture against the prediction."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from qeval.backends.hf.kv_rule import HeldKv
from qeval.backends.vllm.kv_rule import VLLM_QEVAL_CPU, VLLM_SERVE_GPU, PagedKv, VllmCache
from qeval.config.setups import KVCache, Setup
from qeval.memory.layouts import predict_sequence
from qeval.model.shape import ModelShape

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = ["gemma-3-27b", "gpt-oss-20b", "mistral-7b-v0.1", "deepseek-v3", "qwen3-next-80b-a3b", "llama-4-scout"]
BF16 = Setup(name="bf16", weights="bf16")
#: vLLM 0.32.0 on this CPU build as the LLM class sizes it (block 128, 4,096 batched tokens);
#: Qwen3-Next with prefix caching on (two state pages), its state in bfloat16
VLLM_CPU_PREFIX = VllmCache(block_size=128, in_flight_tokens=4096, state_pages=2, kernel_block=128)

#: (model, context) -> (vLLM bytes, transformers bytes once decoding), worked by hand in docs/memory.md
WORKED = {
    ("gemma-3-27b", 4096): (2_411_724_800, 771_751_936),
    ("gemma-3-27b", 131072): (13_316_915_200, 11_173_625_856),
    ("gpt-oss-20b", 4096): (204_472_320, 103_809_024),
    ("gpt-oss-20b", 131072): (3_328_180_224, 3_224_371_200),
    ("mistral-7b-v0.1", 4096): (553_648_128, 536_870_912),
    ("mistral-7b-v0.1", 131072): (1_090_519_040, 536_870_912),
    ("deepseek-v3", 4096): (287_834_112, 287_834_112),
    ("deepseek-v3", 131072): (9_210_691_584, 9_210_691_584),
    ("qwen3-next-80b-a3b", 4096): (204_472_320, 178_520_064),
    ("qwen3-next-80b-a3b", 131072): (3_318_743_040, 3_299_082_240),
    ("llama-4-scout", 4096): (805_306_368, 805_306_368),
    ("llama-4-scout", 131072): (8_254_390_272, 7_650_410_496),
}
NAIVE_128K = {
    "gemma-3-27b": 66_571_993_088,
    "gpt-oss-20b": 6_442_450_944,
    "mistral-7b-v0.1": 17_179_869_184,
    "deepseek-v3": 654_982_512_640,
    "qwen3-next-80b-a3b": 12_884_901_888,
    "llama-4-scout": 25_769_803_776,
}


def shape_of(name: str) -> ModelShape:
    return ModelShape.from_config(json.loads((DATA / f"{name}-config.json").read_text()))


@pytest.mark.parametrize("name", MODELS)
def test_layer_kinds_are_transformers_own(name: str) -> None:
    from transformers import AutoConfig

    raw = json.loads((DATA / f"{name}-config.json").read_text())
    text = raw.get("text_config", raw)
    hf = AutoConfig.for_model(text["model_type"], **{k: v for k, v in text.items() if k != "model_type"})
    expected = getattr(hf, "layer_types", None)
    kinds = {
        "full_attention": "full",
        "sliding_attention": "sliding",
        "chunked_attention": "chunked",
        "linear_attention": "linear",
    }
    ours = shape_of(name).kinds()
    if expected:
        assert ours == tuple(kinds[k] for k in expected)
    else:  # Mistral: no layer_types; the cache makes every layer sliding (get_layer_types_and_kwargs)
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=hf)
        assert ours == tuple(
            "sliding" if type(layer).__name__ == "DynamicSlidingWindowLayer" else "full" for layer in cache.layers
        )


def test_the_shapes_read() -> None:
    counts = {n: dict(Counter(shape_of(n).kinds())) for n in MODELS}
    assert counts == {
        "gemma-3-27b": {"sliding": 52, "full": 10},
        "gpt-oss-20b": {"sliding": 12, "full": 12},
        "mistral-7b-v0.1": {"sliding": 32},
        "deepseek-v3": {"full": 61},
        "qwen3-next-80b-a3b": {"linear": 36, "full": 12},
        "llama-4-scout": {"chunked": 36, "full": 12},
    }
    assert shape_of("deepseek-v3").kv_lora_rank == 512 and shape_of("llama-4-scout").attention_chunk_size == 8192


@pytest.mark.parametrize(("name", "context"), list(WORKED))
def test_per_sequence_kv_equals_the_hand_worked_value(name: str, context: int) -> None:
    shape = shape_of(name)
    vllm, hf = WORKED[(name, context)]
    assert predict_sequence(shape, BF16, "bfloat16", context, PagedKv(VLLM_CPU_PREFIX)).total == vllm
    assert predict_sequence(shape, BF16, "bfloat16", context, HeldKv()).total == hf
    if context == 131072:
        assert predict_sequence(shape, BF16, "bfloat16", context, HeldKv()).naive == NAIVE_128K[name]


def test_a_uniform_model_is_tokens_times_context_on_both_engines() -> None:
    shape = ModelShape.from_config(json.loads((DATA / "llama3-8b-config.json").read_text()))
    for rule in (PagedKv(VLLM_QEVAL_CPU), HeldKv()):
        seq = predict_sequence(shape, BF16, "bfloat16", 4096, rule)
        assert seq.by_kind == {"full": 131072 * 4096} and seq.state == 0 and seq.naive == seq.total


def test_an_fp8_latent_halves_deepseeks_cache() -> None:
    shape = shape_of("deepseek-v3")
    fp8 = predict_sequence(shape, Setup(name="f", kv_cache="fp8"), "bfloat16", 4096, PagedKv(VLLM_CPU_PREFIX))
    assert fp8.by_kind == {"latent": 287_834_112 // 2}


def test_an_mla_block_size_applies_to_latent_models_only() -> None:
    """vLLM's CPU build without AMX serves MLA with the CPU_MLA backend at block 16
    (vllm/platforms/cpu.py); other layouts keep block 128. A latent sequence rounds up to blocks
    of 16 tokens (4,097 tokens: 4,112, not 4,224)."""
    mla16 = VllmCache(block_size=128, in_flight_tokens=4096, state_pages=1, kernel_block=128, mla_block_size=16)
    ds = shape_of("deepseek-v3")
    llama = ModelShape.from_config(json.loads((DATA / "llama3-8b-config.json").read_text()))
    seq = predict_sequence(ds, BF16, "bfloat16", 4095, PagedKv(mla16))
    assert seq.block_bytes == 16 * 287_834_112 // 4096 and seq.total == 287_834_112
    assert predict_sequence(ds, BF16, "bfloat16", 4097, PagedKv(mla16)).total == 287_834_112 // 4096 * 4112
    assert predict_sequence(ds, BF16, "bfloat16", 4097, PagedKv(VLLM_QEVAL_CPU)).total == 287_834_112 // 4096 * 4224
    assert predict_sequence(llama, BF16, "bfloat16", 4097, PagedKv(mla16)) == predict_sequence(
        llama, BF16, "bfloat16", 4097, PagedKv(VLLM_QEVAL_CPU)
    )


def test_plan_splits_the_sequence_and_sizes_capacity_by_it() -> None:
    from qeval.memory.capacity import Budget
    from qeval.memory.planner import plan

    raw = json.loads((DATA / "gemma-3-27b-config.json").read_text())
    rows = {r.setup: r for r in plan(raw, Budget(gpu_memory_gib=80, context_len=32768), rule=PagedKv(VLLM_SERVE_GPU))}
    fp16 = rows["fp16"]
    assert set(fp16.kv_by_layer_type) == {"sliding", "full"} and fp16.state_bytes_per_sequence == 0
    assert fp16.kv_bytes_per_sequence == sum(fp16.kv_by_layer_type.values())
    assert fp16.kv_bytes_per_sequence < fp16.naive_kv_bytes_per_sequence / 3  # the windows' saving, not 5.6x lost
    assert fp16.max_concurrency == pytest.approx(fp16.kv_cache_tokens / 32768, abs=0.01)


# -- transformers' own caches, on small random-weight instances --------------------------------------

TINY: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 16},
    "gemma3_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
    },
    "gpt_oss": {
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
        "head_dim": 16,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
    },
    "llama4_text": {
        "attention_chunk_size": 16,
        "no_rope_layers": [1, 0],
        "head_dim": 16,
        "num_local_experts": 2,
        "intermediate_size_mlp": 64,
        "interleave_moe_layer_step": 1,
    },
    "deepseek_v3": {
        "num_key_value_heads": 4,
        "kv_lora_rank": 32,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "first_k_dense_replace": 2,
        "moe_intermediate_size": 32,
        "n_group": 1,
        "topk_group": 1,
    },
    "qwen3_next": {
        "layer_types": ["linear_attention", "full_attention"],
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
}


def _tiny(model_type: str) -> tuple[Any, Any]:
    """A 2-layer random-weight instance of `model_type` (TINY's layout) in float32: its config and model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type,
        **(
            {
                "vocab_size": 128,
                "hidden_size": 64,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 256,
            }
            | TINY[model_type]
        ),
    )
    return config, AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize("model_type", list(TINY))
@pytest.mark.parametrize("context", [12, 40])
def test_transformers_caches_what_the_ledger_predicts(model_type: str, context: int) -> None:
    """A prefill of context - 1 tokens and one decode step (the step that trims a sliding layer's
    storage to its window) on a 2-layer random-weight instance in float32: the storage the
    cache pins equals the hf prediction, inside and past the 16-token windows and chunks."""
    import torch
    from transformers.cache_utils import DynamicCache

    from qeval.memory.ledger import cache_storage_bytes

    config, model = _tiny(model_type)
    cache = DynamicCache(config=config)
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 128, (1, context - 1)), past_key_values=cache, use_cache=True)
        model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)
    shape = ModelShape.from_config(config.to_dict())
    predicted = predict_sequence(shape, Setup(name="f", weights="fp32"), "float32", context, HeldKv())
    assert cache_storage_bytes(cache) == predicted.total, (model_type, predicted)


@pytest.mark.parametrize("model_type", [m for m in TINY if m != "deepseek_v3"])  # MLA: refused on hf
@pytest.mark.parametrize("kv", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("context", [12, 40])
def test_a_quantized_cache_on_every_layout_holds_what_the_ledger_predicts(
    model_type: str, kv: KVCache, context: int
) -> None:
    """The same, under a quantized KV cache (backends/hf/kv_cache.py): full layers in transformers'
    quantized layers, windowed ones in qeval's QuantizedSlidingLayer (W - 1 tokens), state layers
    as transformers keeps them; int4 scales in the model's float32."""
    import torch

    from qeval.backends.hf.kv_cache import new_cache
    from qeval.memory.ledger import cache_storage_bytes

    config, model = _tiny(model_type)
    setup = Setup(name="k", weights="fp32", kv_cache=kv)
    cache = new_cache(config, setup)
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 128, (1, context - 1)), past_key_values=cache, use_cache=True)
        model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)
    shape = ModelShape.from_config(config.to_dict())
    predicted = predict_sequence(shape, setup, "float32", context, HeldKv())
    # FP8's per-tensor scale is a 0-d tensor per stream: bookkeeping, not tokens (cache_storage_bytes)
    assert cache_storage_bytes(cache) == predicted.total, (model_type, predicted)


# MLA: refused on hf; Qwen3-Next's 2-layer instance has one attention layer (keeping it keeps all: refused)
@pytest.mark.parametrize("model_type", [m for m in TINY if m not in ("deepseek_v3", "qwen3_next")])
@pytest.mark.parametrize("kv", ["int4", "fp8"])
def test_a_cache_that_keeps_a_layer_is_the_baselines_there_and_the_ledgers_in_bytes(
    model_type: str, kv: KVCache
) -> None:
    """Per-layer KV precision (`kv_keep`): the kept layer is transformers' own unquantized layer,
    holding exactly the baseline's K/V; the other attention layers are the quantizer's, as in the
    all-quantized cache; and the storage equals the ledger's prediction (the kept layer at the
    model's dtype), past the 16-token windows."""
    import torch
    from transformers.cache_utils import DynamicCache

    from qeval.backends.hf.kv_cache import new_cache
    from qeval.memory.ledger import cache_storage_bytes, predict_kv_bytes_per_token

    config, model = _tiny(model_type)
    shape = ModelShape.from_config(config.to_dict())
    first = next(i for i, k in enumerate(shape.kinds()) if k != "linear")
    setup = Setup(name="k", weights="fp32", kv_cache=kv, kv_keep=(str(first),))
    every = Setup(name="q", weights="fp32", kv_cache=kv)
    assert setup.kv_keep_problem(shape.kinds()) == ""
    ids = torch.randint(0, 128, (1, 39))
    caches = {"kept": new_cache(config, setup), "base": DynamicCache(config=config), "all": new_cache(config, every)}
    with torch.no_grad():
        for cache in caches.values():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
            model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)
    kept, base, quantized = (caches[k].layers for k in ("kept", "base", "all"))
    assert type(kept[first]) is type(base[first]) and torch.equal(kept[first].keys, base[first].keys)
    assert torch.equal(kept[first].values, base[first].values)
    others = [i for i in range(len(kept)) if i != first]
    assert [type(kept[i]) for i in others] == [type(quantized[i]) for i in others]
    predicted = predict_sequence(shape, setup, "float32", 40, HeldKv())
    assert cache_storage_bytes(caches["kept"]) == predicted.total, (model_type, predicted)
    # a kept layer costs what the baseline's does, the rest what the quantized cache's do
    per_token = predict_kv_bytes_per_token(shape, setup, "float32")
    plain, q = (predict_kv_bytes_per_token(shape, s, "float32") for s in (Setup(name="b", weights="fp32"), every))
    layers = sum(1 for k in shape.kinds() if k != "linear")
    assert per_token == plain // layers + q // layers * (layers - 1)


def test_vllm_pools_kept_full_attention_layers_in_one_group() -> None:
    """vLLM 0.32 with kept layers on an all-full-attention model: one group, each layer's page at
    its own dtype, so a sequence costs the layers' bytes per token summed, in blocks of 128 on this
    CPU build; on a GPU the block is raised until the FP8 page covers a kept layer's 16-token page
    (Platform._align_heterogeneous_kv_block_size: 16 -> 32)."""
    shape = ModelShape.from_config(
        json.loads((DATA / "mistral-7b-v0.1-config.json").read_text()) | {"sliding_window": None}
    )
    assert set(shape.kinds()) == {"full"}
    setup = Setup(name="k", weights="bf16", kv_cache="fp8", kv_keep=("0", "31"))
    cpu = predict_sequence(shape, setup, "bfloat16", 1000, PagedKv(VLLM_QEVAL_CPU))
    per_token = 2 * 8 * 128 * (2 * 2 + 30 * 1)  # K and V, 8 KV heads of 128: two layers bf16, 30 fp8
    assert cpu.total == per_token * 1024 and cpu.block_bytes == per_token * 128  # 8 blocks of 128
    gpu = predict_sequence(shape, setup, "bfloat16", 1000, PagedKv(VLLM_SERVE_GPU))
    assert gpu.total == per_token * 1024 and gpu.block_bytes == per_token * 32  # 32 blocks of 32
    assert predict_sequence(shape, setup, "bfloat16", 1000, HeldKv()).total == per_token * 1000


GEMMA3_270M = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 18,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    "sliding_window": 512,
    "hidden_size": 640,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "intermediate_size": 2048,
    "vocab_size": 262144,
}


@pytest.mark.parametrize(
    ("keep", "blocks_2k", "blocks_32k", "block_kib"),
    [
        ((), 16 + 5 * 17, 256 + 5 * 37, 192),  # one dtype: 6 groups of 3 layers, block 128
        (("5", "11", "17"), 16 + 5 * 9, 256 + 5 * 19, 384),  # global layers bf16: FP8 blocks of 256
        (("0",), 17 + 14 * 9 + 3 * 8, 37 + 14 * 19 + 3 * 128, 128),  # a bucket of one: 18 groups of 1
    ],
)
def test_vllm_pools_kept_layers_of_several_kinds_on_its_cpu_build(
    keep: tuple[str, ...], blocks_2k: int, blocks_32k: int, block_kib: int
) -> None:
    """vLLM 0.32's CPU build with kept layers on Gemma 3 (sliding and global layers): every page
    brought to the largest (a bf16 layer's) by doubling an FP8 layer's block size, layers bucketed
    by (kind, dtype), the buckets grouped at `group_width`'s width (kv_cache_utils.py). Blocks per
    sequence at 2k and 32k tokens (a sliding layer reserves min(W - 1 + 4,096, L) tokens), as
    derived from the source; the same rule's concurrency equals the engine's own log on a 6-layer
    instance (bench/vllm_layouts.py --only kv_keep, 2026-12-07: 20.28x, 16.79x, 16.79x). A GPU pads
    pages instead: refused there."""
    shape = ModelShape.from_config(GEMMA3_270M)
    setup = Setup(name="k", kv_cache="fp8", kv_keep=keep)
    for context, blocks in ((2048, blocks_2k), (32768, blocks_32k)):
        seq = predict_sequence(shape, setup, "bfloat16", context, PagedKv(VLLM_QEVAL_CPU))
        assert seq.block_bytes == block_kib * 1024 and seq.total == blocks * seq.block_bytes, (keep, context)
    if keep:
        with pytest.raises(ValueError, match="not modelled"):
            predict_sequence(shape, setup, "bfloat16", 2048, PagedKv(VLLM_SERVE_GPU))
    six = ModelShape.from_config(
        GEMMA3_270M
        | {"num_hidden_layers": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "head_dim": 64}
        | {"sliding_window": 256, "num_key_value_heads": 2, "hidden_size": 256}
    )
    # the engine's log (64 MiB pool, 2,048 tokens) for the same keep on the 6-layer instance (its full layer: 5)
    six_keep, measured = {(): ((), 20.28), ("0",): (("0",), 16.79)}.get(keep, (("5",), 16.79))
    seq = predict_sequence(
        six, Setup(name="k", kv_cache="fp8", kv_keep=six_keep), "bfloat16", 2048, PagedKv(VLLM_QEVAL_CPU)
    )
    assert round((64 * 2**20 // seq.block_bytes) / (seq.total // seq.block_bytes), 2) == measured
