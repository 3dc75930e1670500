"""The KV caches the transformers backend serves a setup with, on every attention layout.

transformers 5.23's `QuantizedCache` (cache_utils.py) builds one quantized layer per decoder
layer and refuses a model with any layer that is not full attention: its layers keep every
token. A sliding-window or chunked layer (Gemma 2/3, GPT-OSS, Mistral, Llama 4; transformers
keeps both in `DynamicSlidingWindowLayer`, the last W - 1 tokens) needs a quantized layer that
keeps only its window, so qeval builds the cache itself, per layer type
(`get_layer_types_and_kwargs`, as `DynamicCache(config=...)` does):

- full attention: transformers' own quantized layer (quanto, HQQ or FP8), as `QuantizedCache`;
- sliding window and chunked: `QuantizedSlidingLayer`, below: the same quantizer on the last
  W - 1 tokens, the same attention mask sizes as `DynamicSlidingWindowLayer`;
- anything else (state layers, shared-KV "dummy" layers): transformers' own unquantized layer,
  as `DynamicCache` builds it: there is no K/V there to quantize;
- a layer the setup keeps (`kv_keep`: by index or kind): transformers' own unquantized layer too,
  exactly the baseline's.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from qeval.backends.hf.support import KV_BACKENDS
from qeval.backends.hf.turboquant import round_keys, round_values
from qeval.config.setups import TURBOQUANT, Setup
from qeval.model.shape import LAYER_KINDS
from qeval.model.stack import enable_hqq_cache

#: transformers' layer types that cache tokens through K/V (the rest hold states or nothing)
_FULL = "full_attention"
_WINDOWED = ("sliding_attention", "chunked_attention")


def _quantizer(config: Any, setup: Setup) -> Any:
    """One of transformers' quantized layers, configured as the setup asks: used as the full
    layers' cache, and as the quantizer (`_quantize` / `_dequantize`) of the windowed ones.

    `residual_length` is the count of recent tokens a quantized layer keeps in full precision;
    with transformers' default (128) every short prompt would stay unquantized, so qeval
    defaults it to 1. The group defaults to one head vector (head_dim), so no group straddles
    two tokens: a sample's score then cannot depend on its neighbours' padding, and a window
    can drop its oldest tokens without re-grouping the rest."""
    from transformers.cache_utils import Fp8QuantizedLayer, HQQQuantizedLayer, QuantoQuantizedLayer

    backend, _, bits = KV_BACKENDS[setup.kv_cache]
    if backend == "fp8":
        return Fp8QuantizedLayer()
    if backend == "hqq":
        enable_hqq_cache()  # the worker imported cache_utils without it (qeval/model/stack.py)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layer = QuantoQuantizedLayer if backend == "quanto" else HQQQuantizedLayer
    return layer(
        nbits=bits,
        axis_key=0,
        axis_value=0,
        q_group_size=setup.kv_group_size or head_dim,
        residual_length=setup.kv_residual_length,
    )


class _Codec:
    """Quantize and dequantize one stream (K or V) of a layer with a transformers quantized
    layer's own methods. FP8's per-tensor scale is set by the first tensor and then frozen,
    as in transformers' Fp8QuantizedLayer."""

    def __init__(self, quantizer: Any, fp8: bool, axis: int) -> None:
        self.q, self.fp8, self.axis = quantizer, fp8, axis
        self.scale: Any = None

    def encode(self, t: torch.Tensor) -> Any:
        if self.fp8:
            self.q.dtype = t.dtype
            data, self.scale = self.q._quantize(t, scale=self.scale)
            return data, self.scale
        if getattr(self.q, "keys", None) is None:
            # HQQ's _quantize reads its device and compute dtype off the layer's own keys
            # (transformers 5.23 HQQQuantizedLayer), which a quantizer used on its own never has
            self.q.keys = t[..., :0]
        return self.q._quantize(t.contiguous(), axis=self.axis)

    def decode(self, stored: Any, dtype: torch.dtype) -> torch.Tensor:
        return self.q._dequantize(stored).to(dtype)

    def keep_last(self, stored: Any, n: int, dtype: torch.dtype) -> Any:
        """`stored` (group-wise) cut to its last n tokens, by a round trip of the kept tokens: each
        group is one token's head vector at the default group size, so re-quantizing them changes
        nothing but float rounding (transformers' QuantizedLayer re-quantizes everything it keeps too)."""
        return self.encode(self.decode(stored, dtype)[:, :, -n:, :])


#: E2M1's magnitudes (NVFP4's values) and E4M3's largest finite value
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E4M3_MAX = 448.0


def emulated(setup: Setup) -> bool:
    """Whether the setup's KV format is one of vLLM's that the hf backend rounds in software."""
    return setup.quantizes_kv and KV_BACKENDS[setup.kv_cache][0] == "emulated"


class EmulatedCodec:
    """vLLM 0.32's own KV formats, rounded in software: `fp8_per_token_head` (each token's head
    vector scaled by its absolute maximum / 448 in float32, then cast to E4M3), `nvfp4` (blocks of
    16 values along the head, each scaled by an E4M3 scale of its maximum / 6, values rounded to
    E2M1; the per-layer global scale at vLLM's unit default) and the TurboQuant presets (keys and
    values each their own way: turboquant.py; `stream` says which). Token by token, as vLLM writes
    its cache, so a round trip is what attention reads back; `encode` returns the values read back."""

    def __init__(self, kind: str, stream: str = "key") -> None:
        self.kind, self.stream = kind, stream

    def encode(self, t: torch.Tensor) -> torch.Tensor:
        if self.kind in TURBOQUANT:  # keys and values rounded differently (turboquant.py)
            return round_keys(t, self.kind) if self.stream == "key" else round_values(t, self.kind)
        x = t.float()
        if self.kind == "fp8_per_token_head":
            scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / _E4M3_MAX
            return ((x / scale).to(torch.float8_e4m3fn).float() * scale).to(t.dtype)
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
        scale = (blocks.abs().amax(dim=-1, keepdim=True) / 6.0).to(torch.float8_e4m3fn).float()
        scaled = blocks / scale.clamp(min=2.0**-9)
        grid = torch.tensor(_E2M1, dtype=x.dtype, device=x.device)
        nearest = grid[(scaled.abs().unsqueeze(-1) - grid).abs().argmin(dim=-1)]
        return (torch.sign(scaled) * nearest * scale).reshape(x.shape).to(t.dtype)

    def decode(self, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return stored.to(dtype)


class QuantizedSlidingLayer(DynamicSlidingWindowLayer):
    """A sliding-window (or chunked) layer that keeps its last W - 1 tokens quantized.

    Attention sees what transformers' QuantizedLayer gives a full layer: the stored tokens
    dequantized, then the recent full-precision residual, then the new tokens as computed. What
    is kept afterwards is the last W - 1 of them, as `DynamicSlidingWindowLayer` keeps; the mask
    sizes are that class's. The residual (at most `residual_length` - 1 tokens) counts inside the
    window; once the residual and the new tokens reach `residual_length`, the kept window is
    quantized whole and the residual emptied, as QuantizedLayer flushes."""

    def __init__(self, sliding_window: int, quantizer: Any, fp8: bool, residual_length: int) -> None:
        super().__init__(sliding_window=sliding_window)
        self._keys = _Codec(quantizer, fp8, getattr(quantizer, "axis_key", 0))
        self._values = _Codec(quantizer, fp8, getattr(quantizer, "axis_value", 0))
        self._residual_length = 1 if fp8 else max(1, residual_length)  # FP8 appends as it goes: no residual
        self._quantized_keys: Any = None
        self._quantized_values: Any = None
        self._quantized_len = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        if self._keys.fp8:
            return self._update_fp8(key_states, value_states)
        dtype = key_states.dtype
        assert self.keys is not None and self.values is not None  # set by lazy_initialization
        past_k = [self._keys.decode(self._quantized_keys, dtype)] if self._quantized_len else []
        past_v = [self._values.decode(self._quantized_values, dtype)] if self._quantized_len else []
        full_k = torch.cat([*past_k, self.keys, key_states], dim=-2)
        full_v = torch.cat([*past_v, self.values, value_states], dim=-2)
        keep = self.sliding_window - 1
        kept_k, kept_v = full_k[:, :, -keep:, :], full_v[:, :, -keep:, :]
        residual = (self.keys.shape[-2] if self.keys.dim() == 4 else 0) + key_states.shape[-2]
        if residual >= self._residual_length:  # flush: the kept window quantized whole
            self._quantized_keys, self._quantized_values = self._keys.encode(kept_k), self._values.encode(kept_v)
            self._quantized_len = kept_k.shape[-2]
            self.keys = torch.tensor([], dtype=dtype, device=key_states.device)
            self.values = torch.tensor([], dtype=dtype, device=key_states.device)
        else:  # the new tokens join the residual; the quantized part loses what left the window
            self.keys = kept_k[:, :, -residual:, :].clone()
            self.values = kept_v[:, :, -residual:, :].clone()
            room = kept_k.shape[-2] - residual
            if room <= 0:
                self._quantized_keys = self._quantized_values = None
                self._quantized_len = 0
            elif room < self._quantized_len:
                self._quantized_keys = self._keys.keep_last(self._quantized_keys, room, dtype)
                self._quantized_values = self._values.keep_last(self._quantized_values, room, dtype)
                self._quantized_len = room
        return full_k, full_v

    def _update_fp8(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As transformers' Fp8QuantizedLayer: the first update calibrates each stream's scale on
        all of its tokens and attends to them fresh; later ones append with the frozen scale and
        attend to everything dequantized. Then the stored FP8 is cut to the window."""
        keep = self.sliding_window - 1
        first = not self._quantized_len
        streams = []
        for codec, stored, new in (
            (self._keys, self._quantized_keys, key_states),
            (self._values, self._quantized_values, value_states),
        ):
            data, scale = codec.encode(new)
            if not first:
                data = torch.cat([stored[0], data], dim=-2)
            full = new if first else codec.decode((data, scale), new.dtype)
            streams.append((full, (data[:, :, -keep:, :].clone(), scale)))
        (full_k, self._quantized_keys), (full_v, self._quantized_values) = streams
        self._quantized_len = self._quantized_keys[0].shape[-2]
        return full_k, full_v

    def reset(self) -> None:
        super().reset()
        self._quantized_keys = self._quantized_values = None
        self._quantized_len = 0
        self._keys.scale = self._values.scale = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a quantized sliding-window layer cannot be cropped (qeval never crops)")


def _layer_plan(config: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Each decoder layer's transformers type and init kwargs, as DynamicCache(config=...) gets them."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    return get_layer_types_and_kwargs(config.get_text_config(decoder=True))


def layer_kinds(config: Any) -> tuple[str, ...]:
    """Each decoder layer's kind in ModelShape's words (full, sliding, chunked, linear)."""
    return tuple(LAYER_KINDS.get(k, k) for k in _layer_plan(config)[0])


def _plan(config: Any, setup: Setup) -> list[tuple[str, dict[str, Any], bool]]:
    """Each decoder layer's transformers type, init kwargs, and whether the setup quantizes its
    K/V (a `kv_keep` layer, a TurboQuant cache's boundary layer, a state layer: not)."""
    kinds, kwargs = _layer_plan(config)
    kept = set(setup.kv_kept_layers(layer_kinds(config)))
    return [
        (k, kw, i not in kept and k in (_FULL, *_WINDOWED)) for i, (k, kw) in enumerate(zip(kinds, kwargs, strict=True))
    ]


def new_cache(config: Any, setup: Setup) -> Any:
    """A fresh cache for one batch: transformers' DynamicCache, or a quantized cache built per
    layer type for a quantized KV setup (the module docstring); a layer the setup keeps
    (`kv_keep`) is transformers' own unquantized layer, as DynamicCache builds it."""
    from transformers import DynamicCache
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache

    if not setup.quantizes_kv:
        return DynamicCache(config=config)
    if emulated(setup):  # rounded token by token: the round trip is exactly what is read back
        return round_trip_cache(config, setup)
    fp8 = KV_BACKENDS[setup.kv_cache][0] == "fp8"
    layers: list[Any] = []
    for kind, kwargs, quantized in _plan(config, setup):
        if not quantized:
            layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
        elif kind == _FULL:
            layers.append(_quantizer(config, setup))
        else:
            layers.append(
                QuantizedSlidingLayer(
                    kwargs["sliding_window"], _quantizer(config, setup), fp8, setup.kv_residual_length
                )
            )
    return Cache(layers=layers)


def cache_layer_classes(config: Any, setup: Setup) -> dict[str, int]:
    """The cache `new_cache` builds for `setup`, as its layers' class names with counts."""
    cache = new_cache(config, setup)
    out: dict[str, int] = {}
    for layer in cache.layers:
        name = type(layer).__name__
        out[name] = out.get(name, 0) + 1
    return out


def round_trip_cache(config: Any, setup: Setup) -> Any:
    """A cache for scoring whole texts in one forward pass under a quantized KV cache.

    Each layer passes every incoming K/V through the quantizer `new_cache` uses (quanto's,
    HQQ's, or transformers' FP8 one) and back before attention, so every token attends to
    quantized K/V of all tokens before it, as in token-by-token decoding, at the cost of one
    pass instead of one per token. With one group per head vector the round trip of a token
    does not depend on other tokens, so this equals decoding with `new_cache(...)` except
    that a token also sees its *own* K/V quantized (decoding attends to it fresh): slightly
    stricter, never more lenient. Sliding and chunked layers keep their window as
    transformers' DynamicSlidingWindowLayer does; their mask is that layer's.
    """
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, DynamicLayer

    fp8 = KV_BACKENDS[setup.kv_cache][0] == "fp8"

    def round_tripping(base: type) -> type:
        class _RoundTrip(base):
            def __init__(self, codec_k: Any, codec_v: Any, **kwargs: Any) -> None:
                super().__init__(**kwargs)
                self._codec_k, self._codec_v = codec_k, codec_v

            def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                dtype = key_states.dtype
                k = self._codec_k.decode(self._codec_k.encode(key_states), dtype)
                v = self._codec_v.decode(self._codec_v.encode(value_states), dtype)
                return super().update(k, v, *args, **kwargs)

        return _RoundTrip

    full, windowed = round_tripping(DynamicLayer), round_tripping(DynamicSlidingWindowLayer)
    layers: list[Any] = []
    for kind, kwargs, quantized in _plan(config, setup):
        if not quantized:
            layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
            continue
        codecs: tuple[Any, Any]
        if emulated(setup):
            codecs = (EmulatedCodec(setup.kv_cache, "key"), EmulatedCodec(setup.kv_cache, "value"))
        else:
            q = _quantizer(config, setup)
            codecs = (_Codec(q, fp8, getattr(q, "axis_key", 0)), _Codec(q, fp8, getattr(q, "axis_value", 0)))
        layers.append(full(*codecs) if kind == _FULL else windowed(*codecs, sliding_window=kwargs["sliding_window"]))
    return Cache(layers=layers)
