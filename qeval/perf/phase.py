"""The performance phase inside a setup's worker (docs/performance.md): after scoring and
the memory measurement, resolve the workload's concurrency levels from the setup's memory
budget, let the backend time it, and summarise every figure over the repeats.

Stored under `performance` in RUN_DIR/setups/<setup>.json, keyed (`perf_key`) so that a rerun
measures again only when something that changes the figures changed."""

from __future__ import annotations

import json
import time
import traceback
from typing import TYPE_CHECKING

from qeval.backends.workload import Measurement, Workload, resolve_levels, workload_for
from qeval.perf.stats import measured, percentile
from qeval.records.job import PhaseRecord, StoredLevel

if TYPE_CHECKING:
    from qeval.backends.base import Backend
    from qeval.config import RunConfig
    from qeval.config.setups import Setup
    from qeval.model.shape import ModelShape
    from qeval.records.job import MemoryFigure, PerformanceJob

#: bump when the measurement changes what a stored figure means
PERF_VERSION = "1"
#: where a figure's source turns from how it was timed to the workload it was timed on
WORKLOAD_MARK = "[workload: "

#: figure name -> (unit, source key in the backend's sources, how a repeat's value is taken)
FIGURES: dict[str, tuple[str, str]] = {
    "requests_per_s": ("requests/s", "requests_per_s"),
    "output_tokens_per_s": ("tokens/s", "output_tokens_per_s"),
    "prefill_tokens_per_s": ("tokens/s", "prefill_tokens_per_s"),
    "decode_tokens_per_s": ("tokens/s", "decode_tokens_per_s"),
    "ttft_p50_s": ("s", "ttft"),
    "ttft_p90_s": ("s", "ttft"),
    "tpot_p50_s": ("s", "tpot"),
    "tpot_p90_s": ("s", "tpot"),
    "e2e_p50_s": ("s", "e2e"),
    "e2e_p90_s": ("s", "e2e"),
}


def perf_key(setup_parts: dict[str, str], cfg: RunConfig) -> str:
    """What changes a setup's performance figures: the setup's own resume key parts (model,
    setup, backend, device, engine...), the workload, the budget (it sizes `max`) and the seed."""
    from qeval.records.keys import key_of

    perf = cfg.performance.model_dump(mode="json")
    lengths = {}
    if perf.pop("from_workload"):  # off: the key of a run from before the option existed
        perf["from_workload"] = True
        lengths = {"workload": cfg.workload.model_dump_json() if cfg.workload else ""}
    return key_of(
        setup_parts
        | {
            "performance": json.dumps(perf, sort_keys=True),
            "budget": json.dumps(cfg.budget.model_dump(mode="json"), sort_keys=True),
            "seed": str(cfg.seed),
            "perf_version": PERF_VERSION,
        }
        | lengths
    )


def budget_concurrency(
    cfg: RunConfig,
    setup: Setup,
    device: str,
    dtype: str,
    memory: dict[str, MemoryFigure],
    shape: ModelShape | None,
) -> float | None:
    """The setup's memory.max_concurrency, computed here exactly as the results will report it
    (qeval.memory.figures.memory_block on the same measured figures, as stored, and model shape;
    `dtype`: the resolved model dtype, the job's)."""
    from qeval.backends import backend_entry
    from qeval.memory.figures import memory_block

    block = memory_block(
        setup,
        memory,
        shape,
        dtype,
        device,
        cfg.budget,
        "",
        backend_entry(cfg.backend_of(setup)).kv_accounting(cfg.for_setup(setup), device),
    )
    return block.max_concurrency


def run_phase(
    backend: Backend,
    cfg: RunConfig,
    setup: Setup,
    device: str,
    dtype: str,
    memory: dict[str, MemoryFigure],
    job: PerformanceJob,
) -> PhaseRecord:
    """Time the workload on the loaded backend; a failure here is recorded, never raised
    (the setup's scores stand without its performance)."""
    t0 = time.time()
    out = PhaseRecord(key=job.key)
    try:
        conc = budget_concurrency(cfg, setup, device, dtype, memory, job.shape)
        levels, why = resolve_levels(cfg.performance, conc, backend.concurrency_limit)
        lengths, lengths_source = workload_lengths(cfg)
        workload = workload_for(cfg.performance, levels, why, cfg.seed, lengths, lengths_source)
        m = backend.performance(workload)
        out = PhaseRecord(
            key=job.key,
            status="ok",
            workload=workload.as_dict(),
            levels=summarize(m, workload),
            notes=m.notes,
            budget_concurrency=conc,
        )
    except Exception as exc:  # noqa: BLE001 - any failure (out of memory included) is this phase's result
        msg = str(exc).strip().splitlines()
        out.error = f"{type(exc).__name__}: {msg[0] if msg else ''}"
        out.traceback = traceback.format_exc(limit=8)
    out.seconds = round(time.time() - t0, 2)
    return out


def workload_lengths(cfg: RunConfig) -> tuple[tuple[tuple[int, int], ...], str]:
    """(prompt, output) tokens per request of the config's workload, in order, under
    `performance.from_workload` (outputs of one token timed as two: time per output token needs
    a second); else none. Read in the worker: a trace's prompt text is counted by the model's
    tokenizer."""
    if not cfg.performance.from_workload or cfg.workload is None:
        return (), ""
    from qeval.workload.draw import requests_of
    from qeval.workload.tokens import TokenCounter

    trace = requests_of(cfg.workload, TokenCounter(cfg.model.path), cfg.model.max_context)
    return tuple((r.input_tokens, max(r.output_tokens, 2)) for r in trace.requests), trace.source


def summarize(m: Measurement, workload: Workload) -> list[StoredLevel]:
    """Per level: each figure's value per timed repeat, then median, spread and repeat count."""
    levels = []
    for level, repeats in m.waves.items():
        per_repeat: dict[str, list[float]] = {name: [] for name in FIGURES}
        for waves in repeats:
            wall = sum(w.elapsed_s for w in waves)
            ttft = [t for w in waves for t in w.ttft_s]
            tpot = [t for w in waves for t in w.tpot_s]
            e2e = [t for w in waves for t in w.e2e_s]
            values = {
                "requests_per_s": len(ttft) / wall,
                "output_tokens_per_s": sum(w.output_tokens for w in waves) / wall,
                "prefill_tokens_per_s": sum(w.prompt_tokens for w in waves) / sum(w.prefill_s for w in waves),
                "decode_tokens_per_s": sum(w.decode_tokens_per_s for w in waves) / len(waves),
                "ttft_p50_s": percentile(ttft, 50),
                "ttft_p90_s": percentile(ttft, 90),
                "tpot_p50_s": percentile(tpot, 50),
                "tpot_p90_s": percentile(tpot, 90),
                "e2e_p50_s": percentile(e2e, 50),
                "e2e_p90_s": percentile(e2e, 90),
            }
            for name, v in values.items():
                per_repeat[name].append(v)
        figures = {
            name: measured(per_repeat[name], unit, _source(m, key, workload)) for name, (unit, key) in FIGURES.items()
        }
        levels.append(StoredLevel(concurrency=level, requests=workload.requests_at(level), figures=figures))
    return sorted(levels, key=lambda x: x.concurrency)


def _source(m: Measurement, key: str, workload: Workload) -> str:
    lengths = (
        f"the lengths of the workload's requests in order ({workload.lengths_source})"
        if workload.lengths
        else f"{workload.input_len}-token prompts, {workload.output_len} output tokens"
    )
    return (
        f"{m.sources[key]} {WORKLOAD_MARK}{lengths}; median of {workload.repeats} timed repeat(s) after "
        f"{workload.warmup} warm-up pass(es)]"
    )
