"""KV cache and state of one sequence at a context L, per layer kind and per engine, following
each engine's own accounting (docs/memory.md, "Attention layouts"):

    full       every token, every layer                         (Llama)
    sliding    the last `sliding_window` tokens                 (Gemma 2/3, GPT-OSS, Mistral-7B-v0.1)
    chunked    the current `attention_chunk_size` chunk         (Llama 4's RoPE layers)
    latent     kv_lora_rank + qk_rope_head_dim per token (MLA)  (DeepSeek-V2/V3, Kimi-K2)
    linear     a constant state per sequence                    (Qwen3-Next's Gated DeltaNet)

vLLM 0.32.0 (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py) sizes a request by
`max_memory_usage_bytes` of each layer's spec, in blocks of `block_size` tokens:
- FullAttentionSpec / MLAAttentionSpec: cdiv(L, bs) blocks;
- SlidingWindowSpec: cdiv(min(W - 1 + T, L), bs) + 1 blocks (T = max_num_batched_tokens x
  concurrent batches: the tokens in flight), the +1 always;
- ChunkedLocalAttentionSpec: cdiv(min(C + T, L), bs) blocks;
- MambaSpec (linear attention): 1 page (2 with prefix caching's "align" mode), its page padded to
  the attention page, whose block size is first raised to hold the state
  (Platform._align_hybrid_block_size);
and groups layers of different specs into groups of one width (_get_kv_cache_groups_uniform_page_size:
the smallest kind's count, or the largest's when it is under 1.5x the smallest), every group
drawing blocks of that full width: padding slots are paid for.

transformers 5.23.0 (cache_utils.py): DynamicLayer holds every token; DynamicSlidingWindowLayer
(sliding and chunked layers alike) keeps the last W - 1 tokens, in a slice of the last update's
tensor: min(L, W) tokens of storage once decoding runs (all L right after a prefill, until the
first decode step); under a quantized KV cache qeval's own QuantizedSlidingLayer
(backends/hf/kv_cache.py) keeps min(L, W - 1) tokens, quantized, in storage of its own;
LinearAttentionLayer holds a conv state of the full kernel width in the model dtype and the
recurrent state in float32; DeepSeek-V3's attention caches the latent
(kv_nope, k_rot) before expanding it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from qeval.config.setups import Setup
from qeval.memory.ledger import kv_bytes_per_layer_token
from qeval.model.shape import ModelShape

Engine = Literal["vllm", "hf"]
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class VllmCache:
    """The vLLM settings that enter its accounting. Defaults: the CPU build's (vllm/platforms/cpu.py:
    block_size 128; the LLM class's max_num_batched_tokens 4096; no async scheduling). On a GPU:
    block 16, and max_num_batched_tokens x 2 with async scheduling."""

    block_size: int = 128
    in_flight_tokens: int = 4096
    #: linear-attention (Mamba) state pages per sequence: 1, or 2 with prefix caching ("align")
    state_pages: int = 1
    #: the backend's smallest kernel block: hybrid state models raise the block size in its units
    kernel_block: int = 128
    #: the linear-attention recurrent state's dtype (None: the model's); the CPU build resets it to
    #: float32 on CPUs with avx512_bf16 (vllm/platforms/cpu.py: "Reset SSM cache type to float32")
    state_dtype: str | None = None
    #: the block size of latent (MLA) models, None: `block_size`. vLLM 0.32.0's CPU build picks it
    #: with the MLA backend (vllm/platforms/cpu.py, CpuPlatform.check_and_update_config and
    #: get_attn_backend_cls): on an x86 CPU with AMX tiles the AMX_MLA backend and the default 128;
    #: without AMX the reference CPU_MLA backend, whose decode kernel only compiles for 16, so
    #: block_size=16 is forced, a user's choice overridden (`cache_accounting` sets it)
    mla_block_size: int | None = None


@dataclass(frozen=True)
class KvAccounting:
    """Whose rules size one sequence's KV cache where a backend serves: an engine's (the module's
    docstring) and, for vLLM, the cache settings it runs with. A backend's registry entry gives it
    (qeval/backends/__init__.py `BackendEntry.kv_accounting`), None where qeval cannot know the engine."""

    engine: Engine
    vllm: VllmCache | None = None


@dataclass(frozen=True)
class SequenceKV:
    """What one sequence of `context` tokens holds, in bytes: KV per layer kind, and the constant
    state of state layers. `naive` is 2 x layers x KV heads x head_dim x bytes x L, as if every
    layer cached every token with full K/V heads."""

    engine: str
    context: int
    by_kind: dict[str, int] = field(default_factory=dict)
    state: int = 0
    naive: int = 0
    #: vLLM: the bytes of one block over a group's width (its pool is sized in these); 0 for hf
    block_bytes: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_kind.values()) + self.state


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def linear_state_bytes(shape: ModelShape, engine: Engine, dtype: str, state_dtype: str | None = None) -> int:
    """One linear-attention layer's state per sequence (Gated DeltaNet): a causal-conv state over
    the q, k and v channels, and a recurrent state of num_value_heads x key_dim x value_dim.
    vLLM (MambaStateShapeCalculator.gated_delta_net_state_shape) keeps kernel - 1 conv columns and
    the recurrent state in `state_dtype` (float32 on CPUs with avx512_bf16: cpu.py resets it);
    transformers keeps the full kernel width and a float32 recurrent state."""
    nk, nv = shape.linear_num_key_heads or 0, shape.linear_num_value_heads or 0
    dk, dv = shape.linear_key_head_dim or 0, shape.linear_value_head_dim or 0
    conv_dim = 2 * nk * dk + nv * dv
    kernel = shape.linear_conv_kernel_dim or 4
    b = _BYTES[dtype]
    if engine == "vllm":
        return conv_dim * (kernel - 1) * b + nv * dk * dv * _BYTES[state_dtype or dtype]
    return conv_dim * kernel * b + nv * dk * dv * 4


def naive_bytes(shape: ModelShape, dtype_bytes: float, context: int) -> int:
    """The textbook figure: every layer caches K and V of every KV head for every token (MLA:
    decompressed, heads x (qk_nope + qk_rope) for K and heads x v_head_dim for V)."""
    if shape.kv_lora_rank is not None:
        k = (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
        per_layer = shape.num_heads * (k + (shape.v_head_dim or 0))
    else:
        per_layer = 2 * shape.num_kv_heads * shape.head_dim
    return int(shape.num_layers * per_layer * dtype_bytes * context)


def sequence_kv(
    shape: ModelShape,
    layer_token_bytes: int,
    context: int,
    engine: Engine,
    dtype: str,
    vllm: VllmCache | None = None,
    state_dtype: str | None = None,
    quantized: bool = False,
) -> SequenceKV:
    """One sequence at `context` tokens on `engine` (the module docstring), from what one token
    costs in one attention layer (memory.ledger.kv_bytes_per_layer_token: the KV dtype,
    quantization scales included). `dtype` is the model's (state layers, the naive figure).
    `quantized`: a quantized KV cache, whose windowed layers on hf keep W - 1 tokens of their
    own storage (qeval's QuantizedSlidingLayer), not a slice of the last update's W."""
    kinds = shape.kinds()
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    naive = naive_bytes(shape, _BYTES[dtype], context)
    state_dtype = state_dtype or (vllm.state_dtype if vllm and engine == "vllm" else None)
    state_one = linear_state_bytes(shape, engine, dtype, state_dtype) if "linear" in counts else 0
    latent = "latent" if shape.kv_lora_rank is not None else "full"
    if engine == "hf":
        span = 1 if quantized else 0
        held = {
            "full": context,
            "sliding": min(context, (shape.sliding_window or context + span) - span),
            "chunked": min(context, (shape.attention_chunk_size or context + span) - span),
        }
        kept = {
            (latent if k == "full" else k): n * layer_token_bytes * held[k] for k, n in counts.items() if k != "linear"
        }
        return SequenceKV("hf", context, kept, counts.get("linear", 0) * state_one, naive)
    v = vllm or VllmCache()
    bs = v.mla_block_size if latent == "latent" and v.mla_block_size else v.block_size
    if "linear" in counts:  # the attention block grows until one attention page holds a state page
        bs = max(v.kernel_block * _cdiv(state_one, v.kernel_block * layer_token_bytes), bs)
    blocks = {
        "full": _cdiv(context, bs),
        "sliding": _cdiv(min((shape.sliding_window or context) - 1 + v.in_flight_tokens, context), bs) + 1,
        "chunked": _cdiv(min((shape.attention_chunk_size or context) + v.in_flight_tokens, context), bs),
        "linear": v.state_pages,
    }
    width = _group_width(list(counts.values()))
    page = bs * layer_token_bytes  # every layer's page, state layers padded up to it
    by_kind: dict[str, int] = {}
    state = 0
    for kind, n in counts.items():
        need = _cdiv(n, width) * width * page * blocks[kind]  # padding slots included
        if kind == "linear":
            state += need
        else:
            by_kind[latent if kind == "full" else kind] = need
    return SequenceKV("vllm", context, by_kind, state, naive, width * page)


def _group_width(counts: list[int]) -> int:
    """vLLM's group width over layer kinds (kv_cache_utils._get_kv_cache_groups_uniform_page_size)."""
    lo, hi = min(counts), max(counts)
    return hi if hi < lo * 1.5 else lo


#: vLLM as `qeval plan` assumes it serves on a GPU: `vllm serve`'s defaults (block 16, 2,048
#: batched tokens, prefix caching on: two state pages per linear-attention group)
VLLM_SERVE_GPU = VllmCache(block_size=16, in_flight_tokens=2048, state_pages=2, kernel_block=16)
#: vLLM as qeval's vllm backend runs it on this CPU build: the LLM class, prefix caching off
VLLM_QEVAL_CPU = VllmCache(block_size=128, in_flight_tokens=4096, state_pages=1, kernel_block=128)


def predict_sequence(
    shape: ModelShape,
    setup: Setup,
    model_dtype: str,
    context: int,
    engine: Engine,
    vllm: VllmCache | None = None,
    state_dtype: str | None = None,
) -> SequenceKV:
    """One sequence of `setup` at `context` tokens on `engine`: KV per layer kind (the setup's KV
    dtype, scales included) and the state of state layers."""
    return sequence_kv(
        shape,
        kv_bytes_per_layer_token(shape, setup, model_dtype),
        context,
        engine,
        model_dtype,
        vllm,
        state_dtype,
        quantized=setup.quantizes_kv,
    )
