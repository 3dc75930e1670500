"""One setup's memory block of the results: each figure predicted beside measured (with the
measurement's source), the engine's own KV pool where vLLM reported one, and the capacity at
the budget (docs/memory.md)."""

from __future__ import annotations

from typing import Any

from qeval.config.setups import Setup
from qeval.memory.capacity import Budget, kv_capacity
from qeval.memory.ledger import ModelShape, predict_kv_bytes_per_token, predict_weights_bytes
from qeval.results.schema import EnginePool, Figure, Memory

#: predicted and measured weights or KV bytes further apart than this are flagged
GAP_FLAG = 0.10


def memory_block(setup: Setup, measured: dict[str, Any], shape: ModelShape | None, dtype: str, device: str,
                 budget: Budget, engine_share: str) -> Memory:
    """The memory block from the worker's measured figures (`measured`, as stored) and the
    model's shape. `engine_share` says what a vLLM engine's pool was sized from."""
    def fig(name: str, predicted: int | None = None) -> Figure:
        m = measured.get(name) or {}
        return Figure(measured=m.get("measured"), predicted=predicted, source=m.get("source", "not measured"),
                      **(m.get("extra") or {}) if name == "peak_bytes" else {})

    mem = Memory(
        weights_bytes=fig("weights_bytes", predict_weights_bytes(shape, setup, dtype) if shape else None),
        kv_bytes_per_token=fig("kv_bytes_per_token",
                               predict_kv_bytes_per_token(shape, setup, dtype) if shape else None),
        peak_bytes=fig("peak_bytes"), activations_bytes=fig("activations_bytes"),
        overhead_bytes=fig("overhead_bytes") if "overhead_bytes" in measured else None,
        engine=_engine_pool(measured, engine_share),
    )
    if mem.engine and device == "cuda":  # vLLM sized its KV pool on the GPU itself: that, not a prediction
        ctx = budget.context_len
        return mem.model_copy(update={
            "kv_cache_tokens": mem.engine.kv_cache_tokens,
            "max_concurrency": round(mem.engine.kv_cache_tokens / ctx, 2),
            "capacity_source": f"vLLM engine on this GPU ({mem.engine.source}); concurrency = tokens / {ctx}"})
    w = mem.weights_bytes.measured or mem.weights_bytes.predicted
    kv = mem.kv_bytes_per_token.measured or mem.kv_bytes_per_token.predicted
    if not w or not kv:
        return mem
    cap = kv_capacity(int(w), int(kv), budget)
    return mem.model_copy(update={
        "kv_cache_tokens": cap.kv_cache_tokens, "max_concurrency": cap.max_concurrency,
        "capacity_source": f"predicted for the budget ({budget.describe()}) from the weights and KV bytes above "
                           "(measured where measured, else predicted); the same formula as `qeval plan`"})


def _engine_pool(measured: dict[str, Any], share: str) -> EnginePool | None:
    """The KV pool the vLLM engine reported: tokens, and sequences at its max_model_len as it
    logged them. On the CPU build the pool is a share of host memory, so it says nothing about
    the budget: the capacity then comes from the formula, and this stays a record."""
    tokens = measured.get("kv_cache_tokens") or {}
    if tokens.get("measured") is None:
        return None
    conc = measured.get("max_concurrency") or {}
    lines = [tokens.get("extra", {}).get("line"), conc.get("extra", {}).get("line")]
    return EnginePool(kv_cache_tokens=tokens["measured"], max_concurrency=conc.get("measured"),
                      max_concurrency_context=conc.get("extra", {}).get("context"), pool=share,
                      source="vLLM engine log: " + "; ".join(x for x in lines if x))


def gap_flags(mem: Memory) -> list[str]:
    """Predicted next to measured: a gap over GAP_FLAG is a flag a reviewer sees."""
    flags = []
    for name in ("weights_bytes", "kv_bytes_per_token"):
        f: Figure = getattr(mem, name)
        m, p = f.measured, f.predicted
        if m and p and abs(m - p) / p > GAP_FLAG:
            flags.append(f"memory_gap: {name} measured {m:,} vs predicted {p:,} ({(m - p) / p:+.0%})")
    return flags
