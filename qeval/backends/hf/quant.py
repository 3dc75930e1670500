"""Translate a Setup into transformers-side weight quantization (the KV caches: kv_cache.py)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from qeval.config.setups import CHECKPOINT_WEIGHTS, Setup
from qeval.errors import UserError
from qeval.model.checkpoint import checkpoint_config, describe, quantization_config, tensor_text


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def library_versions(setup: Setup) -> dict[str, str]:
    """The libraries that produced this setup's numbers (recorded in results.json)."""
    libs = {"torch": _version("torch"), "transformers": _version("transformers")}
    if (setup.quantizes_weights and setup.method == "rtn") or setup.kv_cache in ("int4", "int2"):
        libs["optimum-quanto"] = _version("optimum-quanto")
    if setup.method == "torchao":
        libs["torchao"] = _version("torchao")
    if setup.method == "bnb":
        libs["bitsandbytes"] = _version("bitsandbytes")
    if setup.kv_cache == "int8":
        libs["hqq"] = _version("hqq")
    if setup.checkpoint or setup.method in CHECKPOINT_WEIGHTS:
        libs["compressed-tensors"] = _version("compressed-tensors")
    return libs


def load_kwargs(setup: Setup, dtype: torch.dtype, device: str) -> dict[str, Any]:
    """Extra `from_pretrained` arguments: bitsandbytes quantizes while loading (NF4 for int4,
    LLM.int8 for int8), and places the model itself (a bnb model refuses `.to()`)."""
    if setup.method != "bnb" or setup.weights not in ("int8", "int4"):
        return {}
    from transformers import BitsAndBytesConfig

    config = (
        BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
        if setup.weights == "int4"
        else BitsAndBytesConfig(load_in_8bit=True)
    )
    return {"quantization_config": config, "device_map": device}


def quantize_weights(model: Any, setup: Setup) -> dict[str, Any]:
    """Quantize the decoder's linear layers in place (embeddings and lm_head stay 16-bit,
    as in transformers' own quanto integration; so do the linear layers the setup's `keep`
    patterns match). Returns what was done, for the results."""
    if setup.weights not in ("int8", "int4"):  # fp8 / fp4 weights come from checkpoints (checkpoint_info)
        return {"library": None}
    if setup.method == "bnb":  # quantized while loading (load_kwargs)
        scheme = "NF4, blocks of 64, compute in the model dtype" if setup.weights == "int4" else "LLM.int8()"
        return {"library": f"bitsandbytes {_version('bitsandbytes')}", "scheme": scheme}
    if setup.method == "torchao":
        return _torchao_int8(model)
    from optimum.quanto import freeze, qint4, qint8, quantize

    if setup.keep:  # on the real names: preflight checked Llama-family names only (hf/support.py)
        linear = [
            name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and name != "lm_head"
        ]
        problem = setup.keep_problem(linear)
        if problem:
            raise UserError(problem)
    # quanto matches `exclude` with fnmatch on every module name, as Setup.keeps does
    quantize(model, weights=qint8 if setup.weights == "int8" else qint4, exclude=["lm_head", *setup.keep])
    groups: set[int | None] = set()
    if setup.weights == "int4" and setup.group_size:
        for module in model.modules():
            if getattr(module, "weight_qtype", None) is qint4:
                in_f = module.weight.shape[1]
                # group_size must divide the row; a row no longer than it is per-channel
                divides = in_f > setup.group_size and in_f % setup.group_size == 0
                module.weight_group_size = setup.group_size if divides else None
    for module in model.modules():
        if getattr(module, "weight_qtype", None) is not None:
            groups.add(module.weight_group_size)
    freeze(model)
    scheme = "per-channel symmetric" if setup.weights == "int8" else "group-wise asymmetric (min-max)"
    extra: dict[str, Any] = {}
    if setup.keep:
        extra["kept_modules"] = sorted(
            name
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)
            and name != "lm_head"
            and getattr(module, "weight_qtype", None) is None
        )
    return extra | {
        "library": f"optimum-quanto {_version('optimum-quanto')}",
        "scheme": f"round-to-nearest, {scheme}",
        "group_sizes": sorted({"per-channel" if g is None else str(g) for g in groups}),
    }


def _torchao_int8(model: Any) -> dict[str, Any]:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model.model, Int8WeightOnlyConfig())
    return {"library": f"torchao {_version('torchao')}", "scheme": "int8 weight-only, per-channel"}


def decompressed(model: Any) -> str | None:
    """The floating dtype transformers holds a quantized checkpoint's layers in, or None while
    they stay quantized. compressed-tensors on transformers 5.23 (dequantize=False) keeps int
    weights until the first forward pass, then decompresses every layer to the load dtype: a
    quantized layer carries `quantization_scheme`, and its `weight` turns from int8 (or packed
    int32 `weight_packed`) into float."""
    layers = [m for m in model.modules() if getattr(getattr(m, "quantization_scheme", None), "weights", None)]
    weights = [getattr(m, "weight", None) for m in layers]
    if (
        layers
        and not any(hasattr(m, "weight_packed") for m in layers)
        and all(isinstance(w, torch.Tensor) and w.is_floating_point() for w in weights)
    ):
        return str(weights[0].dtype).removeprefix("torch.")  # type: ignore[union-attr]
    return None


def cast_once_decompressed(model: Any, dtype: torch.dtype) -> list[str]:
    """Bring decompressed layers whose weights come out in another floating dtype than the model's
    (compressed-tensors 0.19's NVFP4 decompressor writes bfloat16 into a float32 model) to the
    model's dtype, exactly (bfloat16 values are float32 values). compressed-tensors decompresses in
    a forward pre-hook on the first forward pass; this one-shot pre-hook, registered after it, runs
    right after it and before any layer computes. The list it returns receives the dtype they came
    out in, if any did."""
    came: list[str] = []

    def cast(_module: Any, _args: Any) -> None:
        handle.remove()
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if (
                getattr(module, "quantization_scheme", None) is not None
                and isinstance(weight, torch.Tensor)
                and weight.is_floating_point()
                and weight.dtype != dtype
            ):
                came[:] = [str(weight.dtype).removeprefix("torch.")]
                module.to(dtype)

    handle = model.register_forward_pre_hook(cast)
    return came


def checkpoint_info(model: Any, checkpoint: str, revision: str | None = None, via: str | None = None) -> dict[str, Any]:
    """What the checkpoint is, from its own quantization_config (the report's description of the
    setup), and the dtype transformers decompressed it to, if it did (assemble flags that); `via`:
    the dtype the decompressor wrote before qeval cast it to the model's (cast_once_decompressed)."""
    qc = quantization_config(checkpoint_config(checkpoint, revision))
    if qc is None:
        return {"library": None, "checkpoint": checkpoint, "description": "unquantized checkpoint"}
    info: dict[str, Any] = describe(qc)
    method = info["quant_method"]
    info = {
        "library": f"transformers {_version('transformers')} ({method})",
        "checkpoint": checkpoint,
        "description": info.pop("text"),
        "checkpoint_config": info,
    }
    dtype = decompressed(model)
    if dtype is not None:
        info["decompressed_to"] = dtype if via is None else f"{dtype} (written as {via} by the decompressor)"
        emulated = emulated_activations(model)
        if emulated:
            info["emulated"] = f"activations {emulated}, rounded in software in {dtype} (weights exact)"
    return info


def emulated_activations(model: Any) -> str | None:
    """The input-activation format compressed-tensors rounds each quantized linear layer's input to
    in software once its weights are decompressed (its fake-quantizing forward stays on: measured
    with compressed-tensors 0.19, the W8A8 / FP8 / NVFP4 / MXFP4 logits move when it is switched
    off), e.g. `float8 sym per token (dynamic)`; None for weight-only schemes. No kernel of the
    format ran: the figure's activations are emulated."""
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        acts = getattr(scheme, "input_activations", None)
        if acts is not None and getattr(module, "quantization_enabled", True):
            return tensor_text(acts.model_dump())
    return None
