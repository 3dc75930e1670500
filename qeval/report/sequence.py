"""The report's KV-per-sequence section, for models whose layers keep different spans of tokens
or hold a state (sliding windows, chunks, a latent, linear attention): what one sequence of the
budget's context holds per layer kind, the state, predicted beside measured, against the naive
per-token x context figure. Empty for a uniform model (KV bytes per token x context says it all)
and for results written before it was recorded."""

from __future__ import annotations

from qeval.report.sections import table_section
from qeval.report.tables import Escape
from qeval.results.schema import Results

HEADER = ["setup", "context", "per layer kind (predicted)", "state", "predicted", "measured", "naive"]


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.2f} MiB"


def rows(results: Results, esc: Escape) -> list[list[str]]:
    out = []
    for s in results.setups:
        q = s.memory.kv_per_sequence
        if q is None or (set(q.by_layer_type) == {"full"} and not q.state_bytes):
            continue
        kinds = ", ".join(f"{esc(k)} {_mib(b)}" for k, b in q.by_layer_type.items())
        out.append(
            [
                esc(s.name),
                f"{q.context:,}",
                kinds,
                _mib(q.state_bytes) if q.state_bytes else "—",
                f"{_mib(q.predicted)} ({esc(q.engine)})",
                _mib(q.measured),
                _mib(q.naive),
            ]
        )
    return out


LEGEND = (
    "This model's layers keep different spans of tokens or hold a state, so KV bytes per token x context "
    'is not what one sequence holds: this is (docs/memory.md, "Attention layouts"), and the capacity is '
    "sized by it. Predicted by the engine's own rules; measured: the storage the hf backend's cache pinned "
    "for one sequence; naive: 2 x layers x KV heads x head_dim x bytes x context."
)


SECTION = table_section(
    "KV cache per sequence", "kv-sequence", "One sequence of the budget's context, per layer kind", HEADER, rows, LEGEND
)
