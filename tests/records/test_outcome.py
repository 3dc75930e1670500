"""The worker's outcome file reads back typed, including one written before its memory figures'
extra keys were typed (they sat under `extra`)."""

from __future__ import annotations

from pathlib import Path

from qeval.records.job import MemoryFigure, Outcome, outcome_of


def test_memory_figures_round_trip_typed() -> None:
    out = Outcome(
        name="s",
        status="ok",
        memory={
            "max_concurrency": MemoryFigure(3.5, "vLLM log", line="Maximum concurrency 3.5x", context=2048),
            "peak_bytes": MemoryFigure(10, "torch.cuda.max_memory_allocated", reserved_peak=12),
        },
    )
    back = outcome_of(out.model_dump(mode="json"), Path("setups/s.json"))
    assert back is not None
    assert back.memory["max_concurrency"].context == 2048
    assert back.memory["max_concurrency"].line == "Maximum concurrency 3.5x"
    assert back.memory["peak_bytes"].reserved_peak == 12
    assert back.memory["peak_bytes"].pool_source is None


def test_an_outcome_with_the_old_extra_dict_still_reads() -> None:
    raw = {
        "name": "s",
        "status": "ok",
        "memory": {
            "kv_cache_tokens": {
                "measured": 4096,
                "source": "server /metrics",
                "extra": {"line": "tokens 4096", "pool_source": "server /metrics"},
            },
            "weights_bytes": {"measured": 1, "source": "bytes", "extra": {}},
        },
    }
    back = outcome_of(raw, Path("setups/s.json"))
    assert back is not None
    assert back.memory["kv_cache_tokens"].pool_source == "server /metrics"
    assert back.memory["kv_cache_tokens"].line == "tokens 4096"
    assert back.memory["weights_bytes"].measured == 1
