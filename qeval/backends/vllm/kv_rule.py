"""vLLM's accounting of one sequence's KV cache and state (qeval/memory/layouts.py `KvRule`).

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
drawing blocks of that full width: padding slots are paid for. A linear-attention layer's state
(MambaStateShapeCalculator.gated_delta_net_state_shape) keeps kernel - 1 conv columns and the
recurrent state in the cache's state dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from qeval.memory.layouts import (
    DTYPE_BYTES,
    NO_LAYERS,
    LayerBytes,
    Layers,
    SequenceKV,
    attention_kind,
    cdiv,
    conv_dim,
    layer_counts,
    naive_bytes,
    recurrent_elements,
)
from qeval.model.shape import ModelShape


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
    #: whether the platform raises the block size where kept (`kv_keep`) layers share the pool
    #: with quantized ones (Platform._align_heterogeneous_kv_block_size: the GPU platforms; the
    #: CPU build's update_block_size_for_backend aligns hybrid state models only)
    aligns_kept_layers: bool = False


#: vLLM as `qeval plan` assumes it serves on a GPU: `vllm serve`'s defaults (block 16, 2,048
#: batched tokens, prefix caching on: two state pages per linear-attention group)
VLLM_SERVE_GPU = VllmCache(
    block_size=16, in_flight_tokens=2048, state_pages=2, kernel_block=16, aligns_kept_layers=True
)
#: vLLM as qeval's vllm backend runs it on this CPU build: the LLM class, prefix caching off
VLLM_QEVAL_CPU = VllmCache(block_size=128, in_flight_tokens=4096, state_pages=1, kernel_block=128)


def linear_state_bytes(shape: ModelShape, dtype: str, state_dtype: str | None = None) -> int:
    """One linear-attention layer's state per sequence: kernel - 1 conv columns in the model's
    dtype, the recurrent state in `state_dtype` (float32 on CPUs with avx512_bf16: cpu.py resets it)."""
    kernel = shape.linear_conv_kernel_dim or 4
    return (
        conv_dim(shape) * (kernel - 1) * DTYPE_BYTES[dtype]
        + recurrent_elements(shape) * DTYPE_BYTES[state_dtype or dtype]
    )


def group_width(counts: list[int]) -> int:
    """vLLM's group width over layer kinds (kv_cache_utils._get_kv_cache_groups_uniform_page_size)."""
    lo, hi = min(counts), max(counts)
    return hi if hi < lo * 1.5 else lo


@dataclass(frozen=True)
class PagedKv:
    """vLLM's rule (the module docstring) with the cache settings it runs with."""

    cache: VllmCache = VllmCache()
    engine: str = "vllm"

    def _configured_block_size(self, shape: ModelShape) -> int:
        """The block size before any alignment: a latent (MLA) model's where the platform forces one."""
        v = self.cache
        return v.mla_block_size if shape.kv_lora_rank is not None and v.mla_block_size else v.block_size

    def _block_size(self, shape: ModelShape, layer_token_bytes: int, state_one: int, linear: bool) -> int:
        v = self.cache
        bs = self._configured_block_size(shape)
        if linear:  # the attention block grows until one attention page holds a state page
            bs = max(v.kernel_block * cdiv(state_one, v.kernel_block * layer_token_bytes), bs)
        return bs

    def _blocks(self, shape: ModelShape, context: int, bs: int) -> dict[str, int]:
        """Blocks per layer of each kind for one sequence."""
        t = self.cache.in_flight_tokens
        return {
            "full": cdiv(context, bs),
            "sliding": cdiv(min((shape.sliding_window or context) - 1 + t, context), bs) + 1,
            "chunked": cdiv(min((shape.attention_chunk_size or context) + t, context), bs),
            "linear": self.cache.state_pages,
        }

    def sequence(
        self, shape: ModelShape, layer_bytes: LayerBytes, context: int, dtype: str, quantized: Layers = NO_LAYERS
    ) -> SequenceKV:
        """One sequence at `context` tokens in vLLM's paged blocks, padding slots included."""
        attention = sorted({b for k, b in zip(shape.kinds(), layer_bytes, strict=True) if k != "linear"})
        if len(attention) > 1:  # layers kept at 16 bits beside quantized ones (`kv_keep`)
            return self._mixed(shape, layer_bytes, context, dtype)
        layer_token_bytes = attention[0] if attention else 0
        counts = layer_counts(shape)
        state_one = linear_state_bytes(shape, dtype, self.cache.state_dtype) if "linear" in counts else 0
        bs = self._block_size(shape, layer_token_bytes, state_one, "linear" in counts)
        blocks = self._blocks(shape, context, bs)
        width = group_width(list(counts.values()))
        page = bs * layer_token_bytes  # every layer's page, state layers padded up to it
        by_kind: dict[str, int] = {}
        state = 0
        for kind, n in counts.items():
            need = cdiv(n, width) * width * page * blocks[kind]  # padding slots included
            if kind == "linear":
                state += need
            else:
                by_kind[attention_kind(shape, kind)] = need
        naive = naive_bytes(shape, DTYPE_BYTES[dtype], context)
        return SequenceKV(self.engine, context, by_kind, state, naive, width * page)

    def _mixed(self, shape: ModelShape, layer_bytes: tuple[int, ...], context: int, dtype: str) -> SequenceKV:
        """Quantized and kept layers of one attention kind (every layer full attention): vLLM
        0.32 puts them in one group (kv_cache_utils.UniformTypeKVCacheSpecs: the same token slots
        in every layer, each layer's page at its own dtype), so a block of `bs` tokens costs every
        layer's bytes per token times bs. Measured on the CPU build (an FP8 cache, layer 0 kept on a
        4-layer model): 679,808 pool tokens against 850,560 with none kept, 640 / 512 bytes per token
        to 0.01%. Several kinds (a sliding model): `_mixed_kinds` on the CPU build; a GPU pads
        pages across kinds and dtypes, which qeval does not model (validate_model refuses it)."""
        kinds = set(shape.kinds())
        if len(kinds) != 1 and not self.cache.aligns_kept_layers:
            return self._mixed_kinds(shape, layer_bytes, context, dtype)
        if len(kinds) != 1:
            raise ValueError(f"kv_keep on a model with layers of kinds {sorted(kinds)}: vLLM's pool is not modelled")
        kind = next(iter(kinds))
        bs = self._configured_block_size(shape)
        primary, kept = min(layer_bytes), max(layer_bytes)
        if self.cache.aligns_kept_layers and kept > primary:
            # Platform._align_heterogeneous_kv_block_size: the quantized page must cover a kept
            # layer's page at the smallest kernel block
            align = max(self.cache.kernel_block, bs)
            bs = max(bs, align * cdiv(kept * self.cache.kernel_block, align * primary))
        block = sum(layer_bytes) * bs
        need = block * self._blocks(shape, context, bs)[kind]
        naive = naive_bytes(shape, DTYPE_BYTES[dtype], context)
        return SequenceKV(self.engine, context, {attention_kind(shape, kind): need}, 0, naive, block)

    def _mixed_kinds(self, shape: ModelShape, layer_bytes: tuple[int, ...], context: int, dtype: str) -> SequenceKV:
        """Kept and quantized layers of several attention kinds on the CPU build (vLLM 0.32,
        v1/core/kv_cache_utils.py): unify_kv_cache_spec_page_size brings every page to the largest
        (a kept layer's) by scaling a smaller page's block size (an FP8 layer's `bs` doubles beside
        16-bit ones; nothing is padded where the pages divide), layers of one (kind, dtype) form a
        bucket, and _get_kv_cache_groups_uniform_page_size splits the buckets into groups of the
        width `group_width` gives, each group's block one page per layer of the width. A sequence
        holds each group's blocks at its own block size."""
        if "linear" in shape.kinds() or shape.kv_lora_rank is not None:
            raise ValueError("kv_keep beside state or latent layers: vLLM's pool is not modelled")
        bs, top = self._configured_block_size(shape), max(layer_bytes)
        if any(top % b for b in layer_bytes):  # a page that does not divide the largest is padded
            raise ValueError("kv_keep with pages that do not divide the largest: vLLM pads them, not modelled")
        buckets: dict[tuple[str, int], int] = {}
        for kind, b in zip(shape.kinds(), layer_bytes, strict=True):
            buckets[(kind, b)] = buckets.get((kind, b), 0) + 1
        width = group_width(list(buckets.values()))
        page = bs * top
        by_kind: dict[str, int] = {}
        for (kind, b), n in buckets.items():
            blocks = self._blocks(shape, context, bs * top // b)[kind]  # the block scaled to the page
            label = attention_kind(shape, kind)
            by_kind[label] = by_kind.get(label, 0) + cdiv(n, width) * width * page * blocks
        naive = naive_bytes(shape, DTYPE_BYTES[dtype], context)
        return SequenceKV(self.engine, context, by_kind, 0, naive, width * page)


def plan_rule(block_size: int, in_flight_tokens: int) -> PagedKv:
    """vLLM as `qeval plan` assumes it serves on a GPU: `vllm serve` with prefix caching on (two
    state pages per linear-attention group), at the block size and tokens in flight given."""
    return PagedKv(
        VllmCache(
            block_size=block_size,
            in_flight_tokens=in_flight_tokens,
            state_pages=2,
            kernel_block=block_size,
            aligns_kept_layers=True,
        )
    )
