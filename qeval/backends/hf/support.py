"""What the transformers backend can run, checked before any model loads.

Measured on the development machines (transformers 5.23, torch 2.13 CPU, optimum-quanto
0.2.7): quanto int8/int4 weights and quanto 2/4-bit `QuantizedCache` run on CPU and CUDA;
torchao int4 weight-only needs CUDA kernels (`mslk`) and fails even on the H200 image we
tried; transformers' `HqqConfig` is broken in 5.2x, so HQQ is only offered for the KV cache.
Pre-quantized checkpoints (`checkpoint:`, or the `qeval quantize` methods: w8a8 / w4a8 / gptq /
awq, fp8_dynamic / fp8_static, nvfp4 / nvfp4a16 / mxfp4 / mxfp4a16) load through transformers'
own quantizer for their `quant_method`; compressed-tensors 0.19 loads every one of them on CPU
and decompresses the weights to the load dtype at the first forward pass, exactly, while a
scheme with quantized activations (W8A8, W4A8, FP8, NVFP4, MXFP4) keeps rounding each linear
layer's input in software (fake quantization): hf/quant.py `checkpoint_info` records and flags both.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from qeval.config.setups import CHECKPOINT_WEIGHTS, TURBOQUANT, Setup
from qeval.errors import UserError
from qeval.model.checkpoint import CUDA_ONLY, PACKAGES, checkpoint_config, quantization_config
from qeval.model.shape import ModelShape, layer_kinds

if TYPE_CHECKING:
    from qeval.config import RunConfig

#: method -> (package that implements it on transformers, weight precisions it offers)
WEIGHT_METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rtn": ("optimum.quanto", ("int8", "int4")),
    "torchao": ("torchao", ("int8",)),
    "bnb": ("bitsandbytes", ("int8", "int4")),
}
#: KV-cache precision -> (QuantizedCache backend, package it needs, bits)
KV_BACKENDS: dict[str, tuple[str, str, int]] = {
    "int4": ("quanto", "optimum.quanto", 4),
    "int2": ("quanto", "optimum.quanto", 2),
    "int8": ("hqq", "hqq", 8),
    "fp8": ("fp8", "torch", 8),
    # vLLM's own formats, rounded in software as vLLM rounds them (kv_cache.py `EmulatedCodec`)
    "fp8_per_token_head": ("emulated", "torch", 8),
    "nvfp4": ("emulated", "torch", 4),
    # vLLM's TurboQuant caches (turboquant.py): the key's bits here, the value's in TURBOQUANT
    **{kind: ("emulated", "torch", key) for kind, (key, _, _) in TURBOQUANT.items()},
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def validate(setup: Setup, device: str) -> None:
    """Raise a one-line UserError for a setup the hf backend cannot run on `device`."""
    where = f"setup {setup.name!r} on hf/{device}"
    if (setup.weights == "fp8" and setup.method == "rtn") or setup.kv_cache == "fp8_e5m2":
        raise UserError(
            f"{where}: fp8 weights quantized on the fly and fp8_e5m2 KV are served by the vllm backend "
            "(method fp8_dynamic makes an FP8 checkpoint transformers serves)"
        )
    if setup.checkpoint:
        validate_checkpoint(setup, device)
    elif setup.quantizes_weights and setup.method in CHECKPOINT_WEIGHTS:
        _need_package("compressed-tensors", where)  # every `qeval quantize` checkpoint is in that format
    elif setup.quantizes_weights:
        package, precisions = WEIGHT_METHODS[setup.method]
        if setup.weights not in precisions:
            raise UserError(
                f"{where}: method {setup.method!r} offers {'/'.join(precisions)} weights, not {setup.weights}"
            )
        if setup.method == "torchao" and device == "cpu" and setup.weights == "int4":
            raise UserError(f"{where}: torchao int4 weight-only needs CUDA kernels; use method rtn")
        if setup.method == "bnb" and device != "cuda":
            raise UserError(
                f"{where}: method 'bnb' (bitsandbytes NF4 / LLM.int8) runs on CUDA here; its CPU "
                "backend is not tested by qeval: use method rtn"
            )
        if not _installed(package):
            raise UserError(f"{where}: method {setup.method!r} needs the {package} package, which is not installed")
    if setup.quantizes_kv:
        backend, package, _ = KV_BACKENDS[setup.kv_cache]
        if not _installed(package):
            raise UserError(
                f"{where}: {setup.kv_cache} KV cache needs the {package} package ({backend} backend), not installed"
            )
    if setup.kv_group_size is not None and not setup.quantizes_kv:
        raise UserError(f"{where}: kv_group_size needs a quantized kv_cache")
    if setup.quantizes_kv and KV_BACKENDS[setup.kv_cache][0] == "emulated":
        if setup.kv_group_size is not None or setup.kv_residual_length != 1:
            raise UserError(
                f"{where}: {setup.kv_cache} is vLLM's format, scaled as vLLM scales it; kv_group_size and "
                "kv_residual_length do not apply"
            )


def _need_package(quant_method: str, where: str) -> None:
    module, pip = PACKAGES.get(quant_method, (quant_method.replace("-", "_"), quant_method))
    if not _installed(module):
        raise UserError(
            f"{where}: a {quant_method} checkpoint needs the {pip} package on transformers, which is not installed"
        )


def validate_checkpoint(setup: Setup, device: str) -> None:
    """A `checkpoint:` setup on transformers: the checkpoint's own quantization_config decides
    which quantizer loads it; one line naming the missing package or kernel. A KV cache is
    quantized by qeval on top as on any setup; `weights:` must not claim a second quantizer."""
    where = f"setup {setup.name!r} on hf/{device}"
    assert setup.checkpoint is not None
    if setup.weights is not None and setup.method not in CHECKPOINT_WEIGHTS:
        raise UserError(
            f"{where}: a checkpoint brings its own quantization; drop weights/method "
            f"({setup.weights}/{setup.method}) or name a checkpoint method ({', '.join(CHECKPOINT_WEIGHTS)})"
        )
    qc = quantization_config(checkpoint_config(setup.checkpoint, setup.checkpoint_revision))
    if qc is None:  # a plain 16-bit folder: served as it is (another fine-tune, say)
        return
    method = str(qc.get("quant_method", ""))
    if method not in PACKAGES:
        raise UserError(
            f"{where}: checkpoint {setup.checkpoint} has quant_method {method!r}, which qeval does not "
            f"serve on transformers (offered: {', '.join(PACKAGES)})"
        )
    if method in CUDA_ONLY and device != "cuda":
        raise UserError(f"{where}: a {method} checkpoint needs {CUDA_ONLY[method]} (CUDA); this device is {device}")
    _need_package(method, where)


def attention_layer_types(config: dict[str, Any]) -> list[str]:
    """Each decoder layer's kind as transformers' config classes and cache resolve it
    (records.shape.layer_kinds: `layer_types`, else the model type's own pattern, else one kind
    for every layer). A multimodal config's text decoder (`text_config`) is the one that caches."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    n = int(text.get("num_hidden_layers") or 0)
    try:
        kinds = layer_kinds(text, n)
    except ValueError:
        kinds = ()
    return list(kinds) or ["full"] * n


def validate_model(setup: Setup, config: dict[str, Any], device: str = "cpu") -> None:
    """What the model's own config rules out, before it loads. A quantized KV cache runs on full,
    sliding-window and chunked layers (kv_cache.py builds it per layer type; state layers hold no
    K/V and stay as transformers keeps them). Refused: a latent (MLA) cache, which transformers
    keeps as two tensors of other widths than a head, untested under qeval's quantizers."""
    if setup.keep:
        _check_keep(setup, config)
    if not setup.quantizes_kv:
        return
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    if text.get("kv_lora_rank") is not None:
        raise UserError(
            f"setup {setup.name!r} on hf: a {setup.kv_cache} KV cache on a latent-attention (MLA) model "
            "is not offered on transformers (its cache holds the latent, not K/V heads); "
            "drop the setup or serve its KV cache on the vllm backend"
        )
    head_dim = text.get("head_dim") or (text.get("hidden_size") or 0) // (text.get("num_attention_heads") or 1)
    if setup.kv_cache == "nvfp4" and head_dim % 16:
        raise UserError(f"setup {setup.name!r} on hf: an nvfp4 KV cache takes blocks of 16; head_dim {head_dim} is not")
    if setup.kv_cache in TURBOQUANT and (head_dim < 8 or head_dim & (head_dim - 1)):
        # vLLM 0.32 builds its Hadamard rotation by doubling: a head_dim that is not a power of two
        # gets a larger matrix than the keys it rotates
        raise UserError(
            f"setup {setup.name!r}: a {setup.kv_cache} KV cache rotates keys by a Hadamard matrix of the head's "
            f"size, which vLLM builds for powers of two only; head_dim {head_dim} is not one"
        )


#: model types whose decoder linear layers carry the Llama-family names ModelShape.linear_modules gives
_LLAMA_NAMED = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def _check_keep(setup: Setup, config: dict[str, Any]) -> None:
    """A `keep` list against the model's decoder linear layers (Llama-family names, as the
    advisor and `qeval quantize` name them): one that keeps nothing or everything is refused."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    if text.get("model_type") not in _LLAMA_NAMED:  # other names: checked on the loaded model (quant.py)
        return
    try:
        names = [n for n, _, _ in ModelShape.from_config(config).linear_modules()]
    except ValueError:  # a config qeval cannot read: preflight says so in its own words
        return
    problem = setup.keep_problem(names)
    if problem:
        raise UserError(f"{problem} (on hf)")


#: the resume-key part of a run whose every generation is decoded from the cache (`decodes_from_cache`)
FROM_CACHE = {"generation": "from the cache"}


def decodes_from_cache(cfg: RunConfig) -> bool:
    """Whether every setup of this run decodes as a quantized KV cache must: the prompt's last
    token fed from the cache, no prefix shared between rows, no finished row dropped from the
    batch. True where any setup of the config quantizes its KV cache, so that the baseline and the
    weight setups are decoded on the same path as the KV setups they are compared with: on the
    shorter path (the first token from the prefill's last position) a close call between two
    first tokens went one way on the baseline and the other on every KV setup, 5 of 24 answers of
    a multi-turn probe on SmolLM2 in bf16, a difference of paths, not of the quantizer
    (docs/benchmarks.md, "Which layers' KV cache"). The config's setups, not the invocation's
    (--setups): a baseline's numbers do not depend on which setups run beside it."""
    return any(s.quantizes_kv for s in cfg.setups)


def key_parts(cfg: RunConfig) -> dict[str, str]:
    """The hf backend's resume-key parts: the decoding path, where it is the cache's."""
    return dict(FROM_CACHE) if decodes_from_cache(cfg) else {}
