"""Quantized checkpoints made by `qeval quantize`: which llm-compressor scheme a setup asks
for, the text it is calibrated on, and the cache key that names its folder.

A checkpoint's folder is `<quantize.output_dir>/<model>-<method>-<key>`, where the key hashes
everything that changes the checkpoint: the model's checksum, the scheme and its knobs, the
calibration text's checksum and how much of it is used. `qeval run` finds the folder by the
same key, so a changed model or calibration set can never be served from a stale checkpoint.
This module runs in qeval's own environment; llm-compressor runs in worker.py (this package).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from fnmatch import translate
from pathlib import Path
from typing import Any

from qeval.backends import backend_entry
from qeval.config import RunConfig
from qeval.config.quantize import Calibration
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.files.jsonl import read_objects
from qeval.memory.ledger import weight_group

RECORD = "qeval-quantize.json"  # the record of how a checkpoint was made (written last)
DEFAULT_CALIBRATION = "data/train.jsonl"  # under tasks_dir: the shipped suite's training text


@dataclass(frozen=True)
class Scheme:
    """An llm-compressor recipe for one setup method."""

    preset: str  # compressed-tensors preset scheme name
    algorithm: str  # what the recipe runs, for people
    weights: str  # the Setup.weights it makes
    smoothquant: bool = False
    awq: bool = False
    #: round to nearest (llm-compressor's QuantizationModifier) instead of GPTQ: the FP8 and FP4
    #: presets, as llm-compressor's own examples make them
    rtn: bool = False
    #: whether the recipe reads calibration text: GPTQ and AWQ do, and so do static activation
    #: scales (FP8 per tensor, NVFP4's global input scale); dynamic and weight-only round-to-nearest
    #: recipes do not, so their key leaves the calibration text out
    calibrated: bool = True


#: setup method -> the checkpoint `qeval quantize` makes for it (llmcompressor 0.14)
SCHEMES: dict[str, Scheme] = {
    "w8a8": Scheme(
        "W8A8",
        "SmoothQuant + GPTQ, INT8 weights per channel, INT8 activations per token (dynamic)",
        "int8",
        smoothquant=True,
    ),
    "w4a8": Scheme("W4A8", "GPTQ, INT4 weights per group, INT8 activations per token (dynamic)", "int4"),
    "gptq": Scheme("W4A16", "GPTQ, INT4 weights per group, 16-bit activations", "int4"),
    "awq": Scheme("W4A16_ASYM", "AWQ, asymmetric INT4 weights per group, 16-bit activations", "int4", awq=True),
    "fp8_dynamic": Scheme(
        "FP8_DYNAMIC",
        "FP8 (E4M3) weights per channel, FP8 activations per token (dynamic)",
        "fp8",
        rtn=True,
        calibrated=False,
    ),
    "fp8_static": Scheme(
        "FP8", "FP8 (E4M3) weights per tensor, FP8 activations per tensor (static, calibrated)", "fp8", rtn=True
    ),
    "nvfp4": Scheme(
        "NVFP4",
        "NVFP4 weights and activations (E2M1, an FP8 scale per 16 values, a global scale per tensor; the "
        "activations' global scale calibrated)",
        "fp4",
        rtn=True,
    ),
    "nvfp4a16": Scheme(
        "NVFP4A16",
        "NVFP4 weights (E2M1, an FP8 scale per 16 values), 16-bit activations",
        "fp4",
        rtn=True,
        calibrated=False,
    ),
    "mxfp4": Scheme(
        "MXFP4",
        "MXFP4 weights and activations (E2M1, a power-of-two scale per 32 values; activations dynamic)",
        "fp4",
        rtn=True,
        calibrated=False,
    ),
    "mxfp4a16": Scheme(
        "MXFP4A16",
        "MXFP4 weights (E2M1, a power-of-two scale per 32 values), 16-bit activations",
        "fp4",
        rtn=True,
        calibrated=False,
    ),
}


def needs_checkpoint(setup: Setup) -> bool:
    """Setups served from a `qeval quantize` checkpoint folder (vllm and hf backends)."""
    return setup.quantizes_weights and setup.method in SCHEMES


def recipe_spec(cfg: RunConfig, setup: Setup, dtype: str) -> dict[str, Any]:
    """Everything about the recipe that changes the checkpoint (part of the cache key); `dtype`
    is model.dtype resolved on this device (records/preflight.py `Precision`), never `auto`."""
    scheme = SCHEMES[setup.method]
    q = cfg.quantize
    spec: dict[str, Any] = {
        "method": setup.method,
        "scheme": scheme.preset,
        "targets": "Linear",
        "ignore": ignore_list(setup),
        "dtype": dtype,
    }
    if scheme.calibrated:
        spec |= {"num_samples": q.num_samples, "max_seq_length": min(q.max_seq_length, cfg.model.max_context)}
    if scheme.rtn:
        spec["rtn"] = True
    if scheme.weights == "int4":
        spec["group_size"] = weight_group(setup)
    if scheme.smoothquant:
        spec["smoothing_strength"] = q.smoothing_strength
    return spec


#: linear layers vLLM serves as one fused layer (its Llama `packed_modules_mapping`): one
#: quantization scheme per fused layer, so a keep list takes all of a group or none of it
FUSED_GROUPS: tuple[tuple[str, ...], ...] = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)


def ignore_list(setup: Setup) -> list[str]:
    """llm-compressor's `ignore` for a setup: lm_head (never quantized, as on the hf backend)
    and each `keep` pattern. compressed-tensors matches an entry by exact name, or, prefixed
    `re:`, by `re.match`; fnmatch.translate's regex ends in `\\Z`, so a shell pattern matches
    the same names there as in quanto's and Setup.keeps' fnmatch."""
    return ["lm_head", *(p if _is_literal(p) else "re:" + translate(p) for p in setup.keep)]


def check_group_divides(setup: Setup, linear: list[tuple[str, int, int]]) -> None:
    """Refuse, in one line and before minutes of calibration, a group size that does not divide a
    quantized layer's columns: llm-compressor 0.14 stops on it only once the model is loaded
    (`validate_group_size_divisibility`). `linear`: ModelShape.linear_modules()."""
    group = weight_group(setup)
    if group is None:
        return
    # llm-compressor's own condition (modifiers/quantization/group_size_validation.py): a row no
    # longer than the group is one group
    bad = [(name, cols) for name, _, cols in linear if cols > group and cols % group and not setup.keeps(name)]
    if bad:
        name, cols = bad[0]
        raise UserError(
            f"setup {setup.name}: groups of {group} do not divide the {cols} columns of {name} "
            f"({len(bad)} layers like it); set group_size to a divisor of {cols}, or keep those layers"
        )


def _is_literal(pattern: str) -> bool:
    return not any(c in pattern for c in "*?[")


def check_keep_fused(setup: Setup, module_names: list[str]) -> None:
    """Refuse a keep list that keeps part of a layer vLLM fuses (q/k/v, gate/up): vLLM loads
    one scheme per fused layer, so such a checkpoint would not load."""
    kept = {n for n in module_names if setup.keeps(n)}
    for name in module_names:
        for group in FUSED_GROUPS:
            if name.endswith("." + group[0]):
                prefix = name[: -len(group[0])]
                members = {prefix + g for g in group}
                if kept & members and not members <= kept:
                    raise UserError(
                        f"setup {setup.name}: keep takes part of {prefix}{{{','.join(group)}}}, which "
                        "vLLM serves as one fused layer; keep all of them or none"
                    )
    if setup.keep and not kept:
        raise UserError(
            f"setup {setup.name}: no keep pattern matches a linear layer of this model "
            f"(names look like {module_names[0]})"
        )


# -- calibration text ---------------------------------------------------------------------


def calibration_source(cfg: RunConfig) -> Calibration:
    """The config's calibration source, with the default (the suite's training text) filled in."""
    cal = cfg.quantize.calibration
    if cal.path or cal.dataset:
        return cal
    return cal.model_copy(update={"path": str(Path(cfg.tasks_dir) / DEFAULT_CALIBRATION)})


def calibration_checksum(cal: Calibration) -> str:
    """sha256 of a local calibration file; for a hub dataset, of its id, config, split and
    revision (the hub's contents are pinned only by `revision`: set it for reproducibility)."""
    if cal.path:
        path = Path(cal.path)
        if not path.is_file():
            raise UserError(f"calibration file {path} not found (set quantize.calibration.path or .dataset)")
        return hashlib.sha256(path.read_bytes()).hexdigest()
    ident = f"hub:{cal.dataset}:{cal.dataset_config}:{cal.split}:{cal.revision}:{cal.text_field}"
    return hashlib.sha256(ident.encode()).hexdigest()


def read_calibration_texts(cal: Calibration, limit: int) -> list[str]:
    """The first `limit` documents of a local calibration file: JSONL (`text_field` of each
    line) or plain text (documents separated by blank lines). One clear line on bad input."""
    assert cal.path is not None
    path = Path(cal.path)
    texts: list[str] = []
    if path.suffix in (".jsonl", ".json"):
        for n, row in read_objects(path):
            if not isinstance(row.get(cal.text_field), str):
                raise UserError(f"{path}:{n}: no string field {cal.text_field!r} (quantize.calibration.text_field)")
            texts.append(row[cal.text_field])
            if len(texts) == limit:
                break
    else:
        texts = [d.strip() for d in path.read_text(encoding="utf-8").split("\n\n") if d.strip()][:limit]
    if not texts:
        raise UserError(f"{path}: no calibration text in it")
    return texts


# -- where a checkpoint lives -------------------------------------------------------------


def checkpoint_key(model_sha256: str, recipe: dict[str, Any], calibration_sha256: str) -> str:
    """The hash that names a checkpoint's folder. A recipe that reads no calibration text (no
    `num_samples` in it: recipe_spec) leaves the text's checksum out: another calibration set makes
    the same checkpoint."""
    calibration = calibration_sha256 if "num_samples" in recipe else None
    blob = json.dumps({"model": model_sha256, "recipe": recipe, "calibration": calibration}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def checkpoint_dir(cfg: RunConfig, setup: Setup, model_sha256: str, calibration_sha256: str, dtype: str) -> Path:
    """Where `qeval quantize` puts `setup`'s checkpoint: keyed by model, recipe (`dtype`, the
    resolved model dtype, included) and calibration text."""
    model_name = Path(cfg.model.path.rstrip("/")).name or "model"
    key = checkpoint_key(model_sha256, recipe_spec(cfg, setup, dtype), calibration_sha256)
    return Path(cfg.quantize.output_dir) / f"{model_name}-{setup.method}-{key}"


def resolve_checkpoints(cfg: RunConfig, model_sha256: str, names: set[str], dtype: str) -> RunConfig:
    """`cfg` with each setup in `names` that serves a quantized checkpoint, and names
    none, pointed at the folder `qeval quantize` made for it (`dtype`: model.dtype resolved on
    this device, part of its key). One line if it is missing."""
    wanted = [s for s in cfg.setups if s.name in names and needs_checkpoint(s) and not s.checkpoint]
    if not backend_entry(cfg.backend).serves_checkpoints or not wanted:
        return cfg
    cal_sha = calibration_checksum(calibration_source(cfg))
    setups = []
    for s in cfg.setups:
        if s in wanted:
            where = checkpoint_dir(cfg, s, model_sha256, cal_sha, dtype)
            if not (where / RECORD).is_file():
                raise UserError(
                    f"setup {s.name!r}: no {SCHEMES[s.method].preset} checkpoint of this model and "
                    f"calibration text yet (expected {where}); run `qeval quantize` on this config first"
                )
            s = s.model_copy(update={"checkpoint": str(where.resolve())})
        setups.append(s)
    return cfg.model_copy(update={"setups": setups})
