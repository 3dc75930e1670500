"""A setup's `performance` block at assembly: the worker's stored figures, typed, with the
achieved share of the device's ceilings (qeval/perf/ceilings.py), and the flags a reviewer
must see (a share over 1 means the ceiling measurement is wrong: flagged, not clipped)."""

from __future__ import annotations

from qeval.config.setups import Setup
from qeval.memory.ledger import ModelShape
from qeval.records.job import PhaseRecord
from qeval.results.performance import Ceilings, CeilingShare, PerfLevel, Performance
from qeval.results.schema import Memory

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: setups whose matmuls take 8-bit activations: their prefill is bound by the int8 peak
_INT8_ACTIVATIONS = ("w8a8", "w4a8")


def performance_block(
    setup: Setup,
    stored: PhaseRecord | None,
    key: str,
    memory: Memory,
    shape: ModelShape | None,
    dtype: str,
    ceilings: Ceilings | None,
) -> tuple[Performance | None, list[str]]:
    """The typed block and its flags; None when nothing was stored under this run's key."""
    if not stored:
        return None, []
    if stored.key != key:
        return None, [
            "performance_not_current: the stored performance figures were measured under another "
            "workload, budget or setup; rerun this setup to measure them again"
        ]
    if stored.status != "ok":
        return Performance(status="failed", error=stored.error or "unknown error"), []
    levels = [PerfLevel(concurrency=x.concurrency, requests=x.requests, **x.figures) for x in stored.levels]
    perf = Performance(
        status="ok",
        workload=stored.workload,
        levels=levels,
        notes=list(stored.notes),
        budget_concurrency=stored.budget_concurrency,
        seconds=stored.seconds,
    )
    if ceilings is None or shape is None:
        return perf, []
    decode = _decode_share(perf, memory, shape, dtype, ceilings)
    prefill = _prefill_share(setup, perf, shape, dtype, ceilings)
    perf = perf.model_copy(
        update={"decode": decode, "prefill": prefill, "notes": perf.notes + _cache_note(memory, shape, dtype, ceilings)}
    )
    flags = [
        f"ceiling_exceeded: {what} share of the ceiling is {s.share:.2f} (> 1): the ceiling measurement is "
        f"wrong for this setup (data served from a cache, or a faster kernel than the probe's)"
        for what, s in (("decode", decode), ("prefill", prefill))
        if s is not None and s.share > 1
    ]
    return perf, flags


def weights_read_per_token(memory: Memory, shape: ModelShape, dtype: str) -> int | None:
    """Weight bytes a decode step reads: every weight, less the input embedding table when it
    is not tied to the LM head (a step reads one row of it)."""
    w = memory.weights_bytes.measured or memory.weights_bytes.predicted
    if not w:
        return None
    embed = 0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size * _DTYPE_BYTES[dtype]
    return int(w) - embed


def _decode_share(
    perf: Performance, memory: Memory, shape: ModelShape, dtype: str, ceilings: Ceilings
) -> CeilingShare | None:
    one, wl = perf.level(1), perf.workload
    weights = weights_read_per_token(memory, shape, dtype)
    kv = memory.kv_bytes_per_token.measured or memory.kv_bytes_per_token.predicted
    if one is None or wl is None or weights is None or not kv:
        return None
    context = wl.input_len + wl.output_len / 2  # the mean context over the decode steps
    bytes_per_token = weights + kv * context
    bandwidth = ceilings.copy_bandwidth.max
    ceiling = bandwidth / bytes_per_token
    achieved = one.decode_tokens_per_s.median
    w_src = "measured" if memory.weights_bytes.measured else "predicted"
    if not shape.tie_word_embeddings:
        w_src += ", input embedding table excluded"
    return CeilingShare(
        achieved=achieved,
        concurrency=1,
        ceiling=ceiling,
        share=achieved / ceiling,
        source=(
            f"copy bandwidth {bandwidth / 1e9:.2f} GB/s (best of {ceilings.copy_bandwidth.repeats}) / "
            f"({weights:,} weight bytes read per token ({w_src}) + {int(kv):,} KV bytes/token x {context:g} "
            f"tokens, the mean context of the decode) = {ceiling:,.0f} tokens/s; achieved: decode tokens/s at "
            "concurrency 1 (median)"
        ),
    )


def matmul_params(shape: ModelShape) -> int:
    """Parameters every prompt token multiplies: the decoder's linear layers (the LM head runs
    on the last position only when prefilling; embeddings are looked up, not multiplied)."""
    return sum(o * i for o, i in shape.linear_shapes())


def _prefill_share(
    setup: Setup, perf: Performance, shape: ModelShape, dtype: str, ceilings: Ceilings
) -> CeilingShare | None:
    top = perf.top
    kind = "int8" if setup.method in _INT8_ACTIVATIONS and "int8" in ceilings.matmul_peak else dtype
    peak = ceilings.matmul_peak.get(kind)
    if top is None or peak is None:
        return None
    params = matmul_params(shape)
    ceiling = peak.max / (2 * params)
    achieved = top.prefill_tokens_per_s.median
    return CeilingShare(
        achieved=achieved,
        concurrency=top.concurrency,
        ceiling=ceiling,
        share=achieved / ceiling,
        source=(
            f"{kind} matmul peak {peak.max / 1e9:,.1f} G{peak.unit} (best of {peak.repeats}) / (2 x {params:,} "
            f"decoder linear parameters) = {ceiling:,.0f} tokens/s; achieved: prefill tokens/s at concurrency "
            f"{top.concurrency} (median)"
        ),
    )


def _cache_note(memory: Memory, shape: ModelShape, dtype: str, ceilings: Ceilings) -> list[str]:
    weights = weights_read_per_token(memory, shape, dtype)
    if weights is None or not ceilings.cache_bytes or weights >= ceilings.cache_bytes:
        return []
    return [
        f"the weights read per token ({weights / 2**20:.2f} MiB) fit in the device's "
        f"{ceilings.cache_bytes / 2**20:.0f} MiB cache: decode may read them faster than the memory bandwidth "
        "the decode ceiling assumes"
    ]
