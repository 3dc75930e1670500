"""`qeval plan`: predict, from a model's config.json alone, how each setup fits a GPU."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.capacity import Budget, kv_capacity
from qeval.memory.layouts import KvRule, predict_sequence
from qeval.memory.ledger import ModelShape, predict_kv_bytes_per_token, predict_weights_bytes

#: the setups a plan compares; the 16-bit, automatic-KV row is named fp16 (the stable surface: docs/architecture.md)
PLAN_SETUPS = [
    Setup(name="fp16", weights="fp16"),
    Setup(name="int8", weights="int8"),
    Setup(name="int4", weights="int4", group_size=128),
    Setup(name="fp16-kv-fp8", weights="fp16", kv_cache="fp8"),
    Setup(name="int8-kv-fp8", weights="int8", kv_cache="fp8"),
    Setup(name="int4-kv-fp8", weights="int4", group_size=128, kv_cache="fp8"),
    Setup(name="int4-kv-int4", weights="int4", group_size=128, kv_cache="int4"),
]


@dataclass
class PlanRow:
    """One setup of `qeval plan`."""

    setup: str
    weights_bytes: int
    #: KV bytes one token costs over the attention layers; on a model whose layers keep different
    #: spans (sliding windows, chunks) or that has state layers, only below the shortest span
    kv_bytes_per_token: int
    kv_cache_tokens: int
    max_concurrency: float
    fits: bool
    #: what one sequence of the budget's context holds on the engine: the capacity's input
    kv_bytes_per_sequence: int = 0
    #: that, per layer kind (full, sliding, chunked, latent), and the state layers' constant state
    kv_by_layer_type: dict[str, int] = field(default_factory=dict)
    state_bytes_per_sequence: int = 0
    #: the textbook 2 x layers x KV heads x head_dim x bytes x context, for comparison
    naive_kv_bytes_per_sequence: int = 0


def load_model_config(model: str) -> dict[str, Any]:
    """config.json from a local folder or file, the config a GGUF file describes, or config.json
    from the hub where it is reachable; one line for anything else (as `qeval run` reads them:
    qeval/model/source.py)."""
    from qeval.model.source import gguf_config, read_config_file, read_model_config

    path = Path(model)
    if path.is_dir():
        return read_model_config(path)
    if path.is_file():
        return gguf_config(path) if path.suffix == ".gguf" else read_config_file(path)
    if model.endswith((".gguf", ".json")):  # a file name, not a hub id: don't ask the hub for it
        raise UserError(f"--model {model}: no such file")
    try:
        from huggingface_hub import hf_hub_download

        local = Path(hf_hub_download(model, "config.json"))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated: all one line for the user
        raise UserError(f"cannot read config.json for {model!r}: {type(exc).__name__}".strip()) from None
    return read_config_file(local)


def model_shape(config: dict[str, Any]) -> ModelShape:
    """The shape the predictions need, from a config.json; one line for a model qeval cannot plan."""
    try:
        return ModelShape.from_config(config)
    except ValueError as exc:
        raise UserError(f"config.json: not a decoder model qeval can plan (it {exc})") from None


def plan(
    config: dict[str, Any],
    budget: Budget,
    dtype: str = "float16",
    *,
    rule: KvRule,
    setups: list[Setup] | None = None,
) -> list[PlanRow]:
    """Weights, KV bytes per token and per sequence (per layer kind, and the state), KV tokens
    that fit and concurrent sequences, per setup, on the engine's accounting `rule` (memory.layouts), by
    the same formula a run's recommendation uses (memory.capacity). `setups`: a run config's, planned
    after PLAN_SETUPS (a `kv_keep` setup with each layer at its own precision); one whose pool the
    rule does not model (vLLM, mixed precision across attention kinds) is left out."""
    shape = model_shape(config)
    rows = []
    for setup in PLAN_SETUPS + [s for s in setups or [] if s.name not in {p.name for p in PLAN_SETUPS}]:
        w = predict_weights_bytes(shape, setup, dtype)
        kv = predict_kv_bytes_per_token(shape, setup, dtype)
        try:
            seq = predict_sequence(shape, setup, dtype, budget.context_len, rule)
        except ValueError:
            continue
        cap = kv_capacity(w, seq.total, budget)
        rows.append(
            PlanRow(
                setup.name,
                w,
                kv,
                cap.kv_cache_tokens,
                cap.max_concurrency,
                cap.kv_cache_tokens >= budget.context_len,
                seq.total,
                seq.by_kind,
                seq.state,
                seq.naive,
            )
        )
    return rows


def plan_json(rows: list[PlanRow]) -> dict[str, Any]:
    return {"setups": [asdict(r) for r in rows]}
