"""The report's kernel-provenance section: what the engine actually ran for each setup (linear
modules and their kernels, attention, the KV cache), and where a setup ran on a fallback path
(docs/backends.md, "Kernel provenance")."""

from __future__ import annotations

from qeval.report.sections import table_section
from qeval.report.tables import Escape
from qeval.results.schema import Results

HEADER = ["setup", "linear modules (count)", "attention", "KV cache", "fallbacks"]
LEGEND = (
    "Read from the engine after scoring: on transformers each linear module's weight storage (quanto's "
    "qtype, a tensor subclass, or the dtype); on vLLM each module's quantization method / scheme / kernel, "
    "from the engine itself where it ran in the worker, else from its log (counts 0 there). A fallback is a "
    "path other than the format's own: its quality figures stand, its speed does not."
)


def rows(results: Results, esc: Escape) -> list[list[str]]:
    """One row per setup with a provenance block; nothing for results written before it."""
    out = []
    for s in results.setups:
        p = s.quantization.provenance
        if p is None:
            continue
        linear = "; ".join(f"{k} x {n}" if n else k for k, n in p.linear.items())
        kv = (p.kv_cache or "") + (f" (scales: {p.kv_scales})" if p.kv_scales else "")
        out.append([esc(s.name), esc(linear), esc(", ".join(p.attention)), esc(kv), esc("; ".join(p.fallbacks))])
    return out


SECTION = table_section("What each setup ran", "provenance", "Kernel provenance", HEADER, rows, LEGEND)
