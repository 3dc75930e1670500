"""Translate a Setup into transformers-side weight quantization (the KV caches: kv_cache.py)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from qeval.config.setups import Setup


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
    return libs


def load_kwargs(setup: Setup, dtype: torch.dtype, device: str) -> dict[str, Any]:
    """Extra `from_pretrained` arguments: bitsandbytes quantizes while loading (NF4 for int4,
    LLM.int8 for int8), and places the model itself (a bnb model refuses `.to()`)."""
    if setup.method != "bnb" or setup.weights not in ("int8", "int4"):
        return {}
    from transformers import BitsAndBytesConfig

    config = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
              if setup.weights == "int4" else BitsAndBytesConfig(load_in_8bit=True))
    return {"quantization_config": config, "device_map": device}


def quantize_weights(model: Any, setup: Setup) -> dict[str, Any]:
    """Quantize the decoder's linear layers in place (embeddings and lm_head stay 16-bit,
    as in transformers' own quanto integration; so do the linear layers the setup's `keep`
    patterns match). Returns what was done, for the results."""
    if setup.weights not in ("int8", "int4"):  # fp8 weights are vLLM's, refused by hf_support
        return {"library": None}
    if setup.method == "bnb":  # quantized while loading (load_kwargs)
        scheme = "NF4, blocks of 64, compute in the model dtype" if setup.weights == "int4" else "LLM.int8()"
        return {"library": f"bitsandbytes {_version('bitsandbytes')}", "scheme": scheme}
    if setup.method == "torchao":
        return _torchao_int8(model)
    from optimum.quanto import freeze, qint4, qint8, quantize

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
        extra["kept_modules"] = sorted(name for name, module in model.named_modules()
                                       if isinstance(module, torch.nn.Linear) and name != "lm_head"
                                       and getattr(module, "weight_qtype", None) is None)
    return extra | {
        "library": f"optimum-quanto {_version('optimum-quanto')}",
        "scheme": f"round-to-nearest, {scheme}",
        "group_sizes": sorted({"per-channel" if g is None else str(g) for g in groups}),
    }


def _torchao_int8(model: Any) -> dict[str, Any]:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model.model, Int8WeightOnlyConfig())
    return {"library": f"torchao {_version('torchao')}", "scheme": "int8 weight-only, per-channel"}
