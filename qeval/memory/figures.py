"""One setup's memory block of the results: each figure predicted beside measured (with the
measurement's source), the engine's own KV pool where vLLM reported one, and the capacity at
the budget (docs/memory.md)."""

from __future__ import annotations

from qeval.config.setups import Setup
from qeval.memory.capacity import Budget, kv_capacity
from qeval.memory.layouts import KvAccounting, predict_sequence
from qeval.memory.ledger import ModelShape, predict_kv_bytes_per_token, predict_weights_bytes
from qeval.records.job import MemoryFigure
from qeval.results.schema import EnginePool, Figure, Memory, SequenceKV

#: predicted and measured weights or KV bytes further apart than this are flagged
GAP_FLAG = 0.10


#: a figure the worker did not store
_NOT_MEASURED = MemoryFigure(None, "not measured")


def memory_block(
    setup: Setup,
    measured: dict[str, MemoryFigure],
    shape: ModelShape | None,
    dtype: str,
    device: str,
    budget: Budget,
    engine_share: str,
    accounting: KvAccounting | None,
) -> Memory:
    """The memory block from the worker's measured figures (`measured`, as stored) and the
    model's shape. `engine_share` says what a vLLM engine's pool was sized from; `accounting` is the
    backend's KV accounting (its registry entry's), None where the engine is not known: then no
    sequence is predicted."""

    def fig(name: str, predicted: int | None = None) -> Figure:
        return _figure(measured, name, predicted)

    mem = Memory(
        weights_bytes=fig("weights_bytes", predict_weights_bytes(shape, setup, dtype) if shape else None),
        kv_bytes_per_token=fig(
            "kv_bytes_per_token", predict_kv_bytes_per_token(shape, setup, dtype) if shape else None
        ),
        peak_bytes=fig("peak_bytes"),
        activations_bytes=fig("activations_bytes"),
        overhead_bytes=fig("overhead_bytes") if "overhead_bytes" in measured else None,
        engine=_engine_pool(measured, engine_share),
        kv_per_sequence=_sequence(setup, measured, shape, dtype, device, budget, accounting)
        if shape and accounting
        else None,
    )
    if mem.engine and device == "cuda":  # vLLM sized its KV pool on the GPU itself: that, not a prediction
        ctx = budget.context_len
        return mem.model_copy(
            update={
                "kv_cache_tokens": mem.engine.kv_cache_tokens,
                "max_concurrency": round(mem.engine.kv_cache_tokens / ctx, 2),
                "capacity_source": f"vLLM engine on this GPU ({mem.engine.source}); concurrency = tokens / {ctx}",
            }
        )
    return _with_capacity(mem, shape, budget)


def _figure(measured: dict[str, MemoryFigure], name: str, predicted: int | None = None) -> Figure:
    """One figure: the worker's measurement of `name` (with its source) beside the prediction."""
    m = measured.get(name, _NOT_MEASURED)
    return Figure(
        measured=m.measured,
        predicted=predicted,
        source=m.source,
        **({"reserved_peak": m.reserved_peak} if name == "peak_bytes" and m.reserved_peak is not None else {}),
    )


def _with_capacity(mem: Memory, shape: ModelShape | None, budget: Budget) -> Memory:
    """`mem` with the KV tokens and concurrency the budget holds, predicted from the weights and
    the KV bytes (measured where measured); as it is where either is unknown."""
    w = mem.weights_bytes.measured or mem.weights_bytes.predicted
    kv = mem.kv_bytes_per_token.measured or mem.kv_bytes_per_token.predicted
    if not w or not kv:
        return mem
    seq, what = int(kv) * budget.context_len, "KV bytes per token above x context_len"
    if shape is not None and not shape.uniform and mem.kv_per_sequence is not None:
        s = mem.kv_per_sequence  # layers keep different spans: the sequence, not tokens x context
        seq, what = int(s.measured or s.predicted), "KV bytes of one sequence (kv_per_sequence)"
    cap = kv_capacity(int(w), seq, budget)
    return mem.model_copy(
        update={
            "kv_cache_tokens": cap.kv_cache_tokens,
            "max_concurrency": cap.max_concurrency,
            "capacity_source": f"predicted for the budget ({budget.describe()}) from the weights and {what} "
            "(measured where measured, else predicted); the same formula as `qeval plan`",
        }
    )


def _sequence(
    setup: Setup,
    measured: dict[str, MemoryFigure],
    shape: ModelShape,
    dtype: str,
    device: str,
    budget: Budget,
    accounting: KvAccounting,
) -> SequenceKV:
    """One sequence of the budget's context on this backend, predicted by its engine's rules, and
    measured where the worker measured it at that context."""
    engine = accounting.engine
    p = predict_sequence(shape, setup, dtype, budget.context_len, accounting)
    m = measured.get("kv_bytes_per_sequence", _NOT_MEASURED)
    ok = m.measured is not None and m.context == budget.context_len
    return SequenceKV(
        context=budget.context_len,
        engine=engine,
        predicted=p.total,
        by_layer_type=p.by_kind,
        state_bytes=p.state,
        naive=p.naive,
        measured=m.measured if ok else None,
        source=m.source if ok else "not measured",
    )


def _engine_pool(measured: dict[str, MemoryFigure], share: str) -> EnginePool | None:
    """The KV pool the vLLM engine reported: tokens, and sequences at its max_model_len as it
    logged them. On the CPU build the pool is a share of host memory, so it says nothing about
    the budget: the capacity then comes from the formula, and this stays a record."""
    tokens = measured.get("kv_cache_tokens", _NOT_MEASURED)
    if tokens.measured is None:
        return None
    conc = measured.get("max_concurrency", _NOT_MEASURED)
    lines = [tokens.line, conc.line]
    # the engine's log (in-process vLLM), or where a backend read the pool from (a server's /metrics)
    where = tokens.pool_source or "vLLM engine log"
    return EnginePool(
        kv_cache_tokens=tokens.measured,
        max_concurrency=conc.measured,
        max_concurrency_context=conc.context,
        pool=share,
        source=f"{where}: " + "; ".join(x for x in lines if x),
    )


def gap_flags(mem: Memory) -> list[str]:
    """Predicted next to measured: a gap over GAP_FLAG is a flag a reviewer sees."""
    flags = []
    for name in ("weights_bytes", "kv_bytes_per_token"):
        f: Figure = getattr(mem, name)
        m, p = f.measured, f.predicted
        if m and p and abs(m - p) / p > GAP_FLAG:
            flags.append(f"memory_gap: {name} measured {m:,} vs predicted {p:,} ({(m - p) / p:+.0%})")
    return flags
