"""The memory ledger: analytic predictions from a model's config.json, and byte counting of
what a loaded model or cache really holds.

Predictions follow docs/memory.md. KV bytes per token use `num_key_value_heads` (grouped-
query attention), never `num_attention_heads`: the `hidden_size` form overstates a GQA
model's cache (Llama-3-8B fourfold).
"""

from __future__ import annotations

import math
from typing import Any

from qeval.config.setups import KV_BITS, TURBOQUANT, WEIGHT_BITS, Setup
from qeval.model.shape import ModelShape

_DTYPE_BITS = {"float32": 32, "bfloat16": 16, "float16": 16}
SCALE_BYTES = 2  # 16-bit scales and zero points, as quanto, GPTQ and AWQ store them


def _int4_group(in_features: int, group_size: int) -> int:
    """quanto's rule (optimum-quanto 0.2.7, QModuleMixin): shrink the group by 32 until it
    divides the row; rows no longer than the group are quantized per channel."""
    g = group_size
    if in_features <= g:
        return in_features
    while in_features % g and g > 32:
        g -= 32
    return g if in_features % g == 0 else in_features


def predict_weights_bytes(shape: ModelShape, setup: Setup, model_dtype: str) -> int:
    """Bytes of the served weights, scales and zero points included; the linear layers a
    setup's `keep` patterns match are counted at the model's dtype, without scales."""
    base_bits = _DTYPE_BITS[model_dtype] if setup.weights is None else WEIGHT_BITS[setup.weights]
    other_bits = base_bits if not setup.quantizes_weights else _DTYPE_BITS.get(model_dtype, 16)
    total = shape.other_params() * other_bits // 8
    for name, out_f, in_f in shape.linear_modules():
        if setup.keep and setup.keeps(name):
            total += out_f * in_f * other_bits // 8
        else:
            total += linear_weights_bytes(out_f, in_f, setup, model_dtype)
    return total


def linear_weights_bytes(out_f: int, in_f: int, setup: Setup, model_dtype: str) -> int:
    """Bytes of one decoder linear layer served as `setup` quantizes it (keep aside)."""
    base_bits = _DTYPE_BITS[model_dtype] if setup.weights is None else WEIGHT_BITS[setup.weights]
    total = out_f * in_f * base_bits // 8
    if setup.method == "bnb":  # bitsandbytes keeps float32 scales: per row (int8), per block of 64 (NF4)
        total += out_f * 4 if setup.weights == "int8" else out_f * in_f // 64 * 4
    elif setup.method in FLOAT_SCALES:
        total += float_format_scales(out_f, in_f, setup.method, _DTYPE_BITS.get(model_dtype, 16) // 8)
    elif setup.weights == "int8":
        total += out_f * SCALE_BYTES  # per output channel, symmetric
    elif setup.weights == "int4":
        groups = in_f // _int4_group(in_f, weight_group(setup) or 128)
        # quanto (rtn) and AWQ are asymmetric: a zero point beside each scale; GPTQ / W4A8 are symmetric
        per_group = 1 if setup.method in ("gptq", "w4a8") else 2
        total += out_f * groups * per_group * SCALE_BYTES
    if setup.quantizes_weights and setup.method == "rtn":
        # quanto keeps an input_scale and an output_scale scalar per module, in the model dtype
        total += 2 * _DTYPE_BITS[model_dtype] // 8
    return total


#: the llm-compressor FP8 / FP4 formats' scales, as compressed-tensors 0.19 stores them (read off
#: SmolLM2's checkpoints): (values per weight scale: None per output channel, 0 none; that scale's
#: bytes; per-tensor scalars; their bytes), a byte count of 0 meaning the model dtype's
FLOAT_SCALES: dict[str, tuple[int | None, int, int, int]] = {
    "fp8_dynamic": (None, 0, 0, 0),  # a scale per output channel; activations' scales are dynamic
    "fp8_static": (0, 0, 2, 0),  # one weight scale and one input scale per tensor
    "nvfp4": (16, 1, 2, 4),  # an FP8 (E4M3) scale per 16 values; float32 weight and input global scales
    "nvfp4a16": (16, 1, 1, 4),  # the same, without the input's
    "mxfp4": (32, 1, 0, 0),  # an E8M0 (uint8) scale per 32 values; activations' scales are dynamic
    "mxfp4a16": (32, 1, 0, 0),
}


def weight_group(setup: Setup) -> int | None:
    """Values per weight scale where a setup quantizes in groups: INT4's `group_size` (128 by
    default), the FP4 formats' fixed blocks (FLOAT_SCALES); None per channel or per tensor."""
    if setup.weights == "int4":
        return setup.group_size or 128
    return FLOAT_SCALES.get(setup.method, (None, 0, 0, 0))[0] or None


def float_format_scales(out_f: int, in_f: int, method: str, dtype_bytes: int) -> int:
    """The scale bytes of one linear layer in an FP8 / FP4 format (FLOAT_SCALES)."""
    block, scale_bytes, scalars, scalar_bytes = FLOAT_SCALES[method]
    scales = 0 if block == 0 else out_f if block is None else out_f * (in_f // block)
    return scales * (scale_bytes or dtype_bytes) + scalars * (scalar_bytes or dtype_bytes)


def predict_kv_bytes_per_token(shape: ModelShape, setup: Setup, model_dtype: str) -> int:
    """KV bytes one token costs over the attention layers (state layers hold none per token):
    each layer 2 (K and V) x KV heads x head_dim x bytes, or one latent vector for MLA, plus
    per-group scales when quantized. Where layers keep different spans of tokens (sliding
    windows, chunks) this is the cost below the shortest span: memory.layouts has the sequence."""
    return sum(kv_layer_bytes(shape, setup, model_dtype))


def kv_layer_bytes(shape: ModelShape, setup: Setup, model_dtype: str) -> tuple[int, ...]:
    """What one token costs in each decoder layer (0 in a state layer): the setup's KV dtype, scales
    included, and the model's dtype in a layer the setup keeps (`kv_keep`)."""
    quantized = kv_bytes_per_layer_token(shape, setup, model_dtype)
    kept = set(setup.kv_kept_layers(shape.kinds()))
    if kept:  # the unquantized cache's figure, as the baseline's
        plain = kv_bytes_per_layer_token(
            shape, setup.model_copy(update={"kv_cache": "auto", "kv_keep": ()}), model_dtype
        )
    return tuple(0 if kind == "linear" else plain if i in kept else quantized for i, kind in enumerate(shape.kinds()))


def attention_layers(shape: ModelShape) -> int:
    """Layers that cache tokens (every kind but the linear-attention state layers)."""
    return sum(1 for k in shape.kinds() if k != "linear")


def kv_bytes_per_layer_token(shape: ModelShape, setup: Setup, model_dtype: str) -> int:
    """One token in one attention layer (see predict_kv_bytes_per_token)."""
    if shape.kv_lora_rank is not None and shape.qk_rope_head_dim is not None:
        elems = shape.kv_lora_rank + shape.qk_rope_head_dim  # MLA: vLLM's head_size, transformers' two tensors
        group_dim = elems
    else:
        elems = 2 * shape.num_kv_heads * shape.head_dim
        group_dim = shape.head_dim
    if not setup.quantizes_kv:
        return elems * _DTYPE_BITS[model_dtype] // 8
    data = elems * KV_BITS[setup.kv_cache] // 8
    if setup.kv_cache in ("fp8", "fp8_e5m2"):
        return data  # one per-tensor scale per layer: nothing per token
    if setup.kv_cache == "fp8_per_token_head":  # a float32 scale per token and head, K and V each
        return data + (elems // group_dim) * 4
    if setup.kv_cache == "nvfp4":  # vLLM's page: head_size / 2 data + head_size / 16 FP8 scales per head
        return data + elems // 16
    if setup.kv_cache in TURBOQUANT:  # one slot per KV head: K and V packed with their norm / scale / zero
        return shape.num_kv_heads * turboquant_slot_bytes(setup.kv_cache, shape.head_dim)
    group = setup.kv_group_size or group_dim
    # a scale and a zero point per group, in the dtype of the K/V they quantize (quanto's
    # MaxOptimizer and HQQ keep the input's dtype): 4 bytes each when the model computes in float32
    return data + (elems // group) * 2 * max(SCALE_BYTES, _DTYPE_BITS[model_dtype] // 8)


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by a tensor, a quantized tensor subclass (counted through its inner
    tensors: packed data, scales, zero points) or a container of them; shared storage once."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(x, seen) for x in obj)
    if isinstance(obj, dict):  # HQQ keeps a quantized K/V's scale and zero point in a meta dict
        return sum(tensor_bytes(x, seen) for x in obj.values())
    if not isinstance(obj, torch.Tensor) or id(obj) in seen:
        return 0
    seen.add(id(obj))
    if hasattr(obj, "__tensor_flatten__") and type(obj) is not torch.nn.Parameter:
        names, _ = obj.__tensor_flatten__()
        return sum(tensor_bytes(getattr(obj, n), seen) for n in names)
    if isinstance(obj, torch.nn.Parameter) and hasattr(obj.data, "__tensor_flatten__"):
        return tensor_bytes(obj.data, seen)
    return obj.numel() * obj.element_size()


def model_weights_bytes(model: Any) -> int:
    """Bytes of every parameter and buffer of a loaded torch model (tied weights once)."""
    seen: set[int] = set()
    tensors = [p for _, p in model.named_parameters(remove_duplicate=True)]
    tensors += [b for _, b in model.named_buffers(remove_duplicate=True) if not _is_rope_cache(b, model)]
    return sum(tensor_bytes(t, seen) for t in tensors)


def _is_rope_cache(buf: Any, model: Any) -> bool:
    # rotary inv_freq is a recomputable buffer, not a weight; a few hundred bytes either way
    return any(buf is b for n, b in model.named_buffers() if n.endswith("inv_freq"))


def cache_storage_bytes(cache: Any) -> int:
    """Bytes of storage a transformers Cache pins across its layers: a sliding layer's kept
    tokens are a slice of its last update's tensor (cache_utils.DynamicSlidingWindowLayer), so
    the storage behind the slice is what is resident, each storage once."""
    import torch

    seen: set[int] = set()

    def walk(obj: Any) -> int:
        if isinstance(obj, (list, tuple)):
            return sum(walk(x) for x in obj)
        if isinstance(obj, dict):  # LinearAttentionLayer keeps its states by index
            return sum(walk(x) for x in obj.values())
        if not isinstance(obj, torch.Tensor):
            return 0
        if hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            return sum(walk(getattr(obj, n)) for n in names)
        if obj.dim() < 2:  # bookkeeping (a layer's sliding_window, cumulative_length), not cached tokens
            return 0
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return int(storage.nbytes())

    return sum(walk(list(vars(layer).values())) for layer in cache.layers)


def cache_bytes(cache: Any) -> int:
    """Bytes held by a transformers Cache (DynamicCache, QuantizedCache) across its layers."""
    seen: set[int] = set()
    return sum(tensor_bytes(list(vars(layer).values()), seen) for layer in cache.layers)


def turboquant_slot_bytes(kind: str, head_dim: int) -> int:
    """Bytes one token's K and V of one KV head take in vLLM 0.32's TurboQuant page (turboquant/config.py
    `slot_size_aligned`): the key's packed codebook indices and a float16 norm (k8v4: one FP8 byte an
    element), the value's packed levels with a float16 scale and zero point, rounded up to even."""
    kbits, vbits, _ = TURBOQUANT[kind]
    key = head_dim if kbits == 8 else math.ceil(head_dim * kbits / 8) + 2
    slot = key + math.ceil(head_dim * vbits / 8) + 4
    return slot + slot % 2
