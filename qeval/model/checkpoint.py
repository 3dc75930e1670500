"""A pre-quantized checkpoint as a setup: its own `quantization_config` (config.json), what it
needs to run on transformers, and the one-line description the report shows for it.

The description is read from the checkpoint, never from what the setup's name or `weights:`
claim: scheme, bits, group size, activations and the layers left unquantized.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qeval.errors import UserError
from qeval.model.shape import ModelShape
from qeval.model.source import read_model_config, resolve_model

#: names shown in a report's description before the rest are counted ("and 19,990 more")
SHOWN = 10
#: characters of any one name or value read from a checkpoint's config into a description
_CHARS = 120

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


def _text_part(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def identity_problem(checkpoint: dict[str, Any], baseline: dict[str, Any]) -> str:
    """Why a checkpoint's config.json is not a checkpoint of the baseline model, else '': it must
    be a decoder config qeval reads (model/shape.py), with the baseline's model_type, vocabulary,
    hidden and MLP sizes, layers and attention heads (no quantizer changes any of them). A
    checkpoint of another model would be compared as if it were a quantization of this one (a
    vocabulary of 49,152 against 128)."""
    ck, base = _text_part(checkpoint), _text_part(baseline)
    try:
        mine = ModelShape.from_config(checkpoint)
    except ValueError as exc:
        return f"is not a model config qeval understands (it {exc})"
    if not isinstance(ck.get("model_type"), str) or not ck["model_type"]:
        return "has no model_type: not a model config"
    if isinstance(base.get("model_type"), str) and ck["model_type"] != base["model_type"]:
        return f"has model_type {_short(ck['model_type'])!r}, the model {base['model_type']!r}"
    theirs = ModelShape.from_config(baseline)
    for field, name in (
        ("vocab_size", "vocab_size"),
        ("hidden_size", "hidden_size"),
        ("intermediate_size", "intermediate_size"),
        ("num_layers", "num_hidden_layers"),
        ("num_heads", "num_attention_heads"),
        ("num_kv_heads", "num_key_value_heads"),
        ("head_dim", "head_dim"),
    ):
        if getattr(mine, field) != getattr(theirs, field):
            return f"has {name} {getattr(mine, field):,}, the model {getattr(theirs, field):,}"
    return ""


def check_identity(name: str, ref: str, checkpoint: dict[str, Any], baseline: dict[str, Any]) -> None:
    """One UserError line where setup `name`'s checkpoint `ref` is not a checkpoint of the model."""
    problem = identity_problem(checkpoint, baseline)
    if problem:
        raise UserError(
            f"setup {name}: checkpoint {ref}: config.json {problem}: not a checkpoint of this model "
            "(a setup's checkpoint must be the baseline model, quantized)"
        )


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= _CHARS else text[:_CHARS] + "…"


def _names(values: list[Any]) -> str:
    """At most SHOWN names, each shortened, then how many more: a config with 20,000 entries
    stays one short line."""
    shown = ", ".join(_short(v) for v in values[:SHOWN])
    return shown + (f" and {len(values) - SHOWN:,} more" if len(values) > SHOWN else "")


def tensor_text(args: dict[str, Any] | None) -> str | None:
    """One compressed-tensors QuantizationArgs, e.g. `int4 sym per group of 128 (static)`."""
    if not args:
        return None
    kind = args.get("type", "int")
    strategy = args.get("strategy")
    where = (
        f"per group of {args['group_size']}"
        if strategy == "group" and args.get("group_size")
        else f"per {strategy}"
        if strategy
        else ""
    )
    sym = "sym" if args.get("symmetric", True) else "asym"
    dyn = "dynamic" if args.get("dynamic") else "static"
    return " ".join(x for x in (f"{kind}{args.get('num_bits')}", sym, where, f"({dyn})") if x)


def describe(qc: dict[str, Any]) -> dict[str, Any]:
    """The setup's description from its `quantization_config`: `text` for the report, and the
    fields it was read from (scheme, bits, group size, ignored layers)."""
    method = _short(qc.get("quant_method", "unknown"))
    out: dict[str, Any] = {"quant_method": method}
    scheme = _compressed_tensors(qc, out) if method == "compressed-tensors" else _flat(qc, out)
    ignore = qc.get("ignore") or qc.get("modules_to_not_convert") or qc.get("llm_int8_skip_modules") or []
    ignore = list(ignore) if isinstance(ignore, (list, tuple)) else [ignore]
    # results.json and the reports carry a bounded part: the first names and how many there are
    out["ignore"] = [_short(n) for n in ignore[:SHOWN]]
    out["ignore_count"] = len(ignore)
    kept = f"; unquantized: {_names(ignore)}" if ignore else ""
    out["text"] = f"{method}: {scheme}{kept}"
    return out


def checkpoint_description(checkpoint: str, revision: str | None = None) -> dict[str, Any]:
    """A pre-quantized checkpoint's part of a setup's quant_info, described from its own
    quantization_config: the checkpoint, the description and the fields it was read from (empty
    where the checkpoint has no quantization_config)."""
    qc = quantization_config(checkpoint_config(checkpoint, revision))
    if qc is None:
        return {}
    described = describe(qc)
    return {"checkpoint": checkpoint, "description": described.pop("text"), "checkpoint_config": described}


def _compressed_tensors(qc: dict[str, Any], out: dict[str, Any]) -> str:
    """A compressed-tensors config's scheme text: each config group's targets, weights and
    activations (the first SHOWN); its bits, group size and format go into `out`."""
    groups = qc.get("config_groups") or {}
    groups = groups if isinstance(groups, dict) else {}
    parts = []
    for name, g in sorted(groups.items()):
        if not isinstance(g, dict):
            continue
        targets: list[Any] = g["targets"] if isinstance(g.get("targets"), list) else [name]
        w, a = tensor_text(g.get("weights")), tensor_text(g.get("input_activations"))
        parts.append(
            f"{_short('+'.join(map(str, targets)))}: weights {_short(w or 'unquantized')}, "
            f"activations {_short(a or '16-bit')}"
        )
        weights = g.get("weights") or {}
        out.setdefault("bits", weights.get("num_bits"))
        out.setdefault("group_size", weights.get("group_size"))
        out.setdefault("activation_bits", (g.get("input_activations") or {}).get("num_bits"))
    out["format"] = qc.get("format")
    scheme = (
        "; ".join(parts[:SHOWN]) + (f"; and {len(parts) - SHOWN:,} more groups" if len(parts) > SHOWN else "")
        or "no config groups"
    )
    return scheme


def _flat(qc: dict[str, Any], out: dict[str, Any]) -> str:
    """The scheme text of a config with flat fields (gptq, awq, bitsandbytes, fp8, torchao...);
    its bits and group size go into `out`."""
    out["bits"] = (
        qc.get("bits") or qc.get("w_bit") or (4 if qc.get("load_in_4bit") else 8 if qc.get("load_in_8bit") else None)
    )
    out["group_size"] = qc.get("group_size") or qc.get("q_group_size")
    block = qc.get("weight_block_size")
    scheme = (
        ", ".join(
            x
            for x in (
                f"{out['bits']}-bit" if out["bits"] else None,
                f"group {out['group_size']}" if out["group_size"] else None,
                f"blocks {block}" if block else None,
                "asym" if qc.get("sym") is False or qc.get("zero_point") else None,
            )
            if x
        )
        or "as configured"
    )
    return scheme
