"""A pre-quantized checkpoint as a setup: its own `quantization_config` (config.json), what it
needs to run on transformers, and the one-line description the report shows for it.

The description is read from the checkpoint, never from what the setup's name or `weights:`
claim: scheme, bits, group size, activations and the layers left unquantized.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qeval.errors import UserError
from qeval.records.model_source import read_model_config, resolve_model

#: transformers quant_method -> (module transformers' quantizer imports, pip package that has it).
#: Measured with transformers 5.23: compressed-tensors loads W8A8 / W4A8 / W4A16 on CPU (and
#: decompresses them to the load dtype at the first forward pass, see `decompressed`).
PACKAGES: dict[str, tuple[str, str]] = {
    "compressed-tensors": ("compressed_tensors", "compressed-tensors"),
    "gptq": ("gptqmodel", "gptqmodel"),
    "awq": ("gptqmodel", "gptqmodel"),
    "bitsandbytes": ("bitsandbytes", "bitsandbytes"),
    "torchao": ("torchao", "torchao"),
    "hqq": ("hqq", "hqq"),
    "quanto": ("optimum.quanto", "optimum-quanto"),
    "fp8": ("accelerate", "accelerate"),
}
#: quant_methods whose transformers kernels run on CUDA only (no CPU path in transformers 5.23)
CUDA_ONLY = {"bitsandbytes": "bitsandbytes' kernels", "awq": "AWQ's GEMM kernels"}


def checkpoint_config(ref: str, revision: str | None = None) -> dict[str, Any]:
    """config.json of a checkpoint: a local folder, or a hub id from the hub's cache (one line if
    neither). Cheap: no checksum (the run's checksum covers the folder, records/model_source)."""
    if Path(ref).is_dir():
        return read_model_config(Path(ref))
    if ref.startswith((".", "/", "~")) or ref.count("/") != 1:
        raise UserError(f"checkpoint {ref}: no such folder (a hub id has the form org/name)")
    return resolve_model(ref, revision).config


def quantization_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's own `quantization_config` (a multimodal config's text part included)."""
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("text_config"), dict):
        qc = config["text_config"].get("quantization_config")
    return qc if isinstance(qc, dict) else None


def _tensor(args: dict[str, Any] | None) -> str | None:
    """One compressed-tensors QuantizationArgs, e.g. `int4 sym per group of 128 (static)`."""
    if not args:
        return None
    kind = args.get("type", "int")
    strategy = args.get("strategy")
    where = f"per group of {args['group_size']}" if strategy == "group" and args.get("group_size") else \
        f"per {strategy}" if strategy else ""
    sym = "sym" if args.get("symmetric", True) else "asym"
    dyn = "dynamic" if args.get("dynamic") else "static"
    return " ".join(x for x in (f"{kind}{args.get('num_bits')}", sym, where, f"({dyn})") if x)


def describe(qc: dict[str, Any]) -> dict[str, Any]:
    """The setup's description from its `quantization_config`: `text` for the report, and the
    fields it was read from (scheme, bits, group size, ignored layers)."""
    method = str(qc.get("quant_method", "unknown"))
    out: dict[str, Any] = {"quant_method": method}
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        parts = []
        for name, g in sorted(groups.items()):
            w, a = _tensor(g.get("weights")), _tensor(g.get("input_activations"))
            parts.append(f"{'+'.join(g.get('targets') or [name])}: weights {w or 'unquantized'}, "
                         f"activations {a or '16-bit'}")
            weights = g.get("weights") or {}
            out.setdefault("bits", weights.get("num_bits"))
            out.setdefault("group_size", weights.get("group_size"))
            out.setdefault("activation_bits", (g.get("input_activations") or {}).get("num_bits"))
        out["format"] = qc.get("format")
        scheme = "; ".join(parts) or "no config groups"
    else:  # gptq, awq, bitsandbytes, fp8, torchao...: their flat fields
        out["bits"] = qc.get("bits") or qc.get("w_bit") or (4 if qc.get("load_in_4bit") else 8
                                                             if qc.get("load_in_8bit") else None)
        out["group_size"] = qc.get("group_size") or qc.get("q_group_size")
        block = qc.get("weight_block_size")
        scheme = ", ".join(x for x in (
            f"{out['bits']}-bit" if out["bits"] else None,
            f"group {out['group_size']}" if out["group_size"] else None,
            f"blocks {block}" if block else None,
            "asym" if qc.get("sym") is False or qc.get("zero_point") else None) if x) or "as configured"
    ignore = qc.get("ignore") or qc.get("modules_to_not_convert") or qc.get("llm_int8_skip_modules") or []
    out["ignore"] = list(ignore)
    kept = f"; unquantized: {', '.join(ignore)}" if ignore else ""
    out["text"] = f"{method}: {scheme}{kept}"
    return out

