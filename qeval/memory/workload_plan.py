"""`qeval plan --workload`: the concurrency each setup's KV pool holds for a workload's actual
lengths (paged attention), beside today's worst case of every request at max-model-len
(docs/performance.md, "The workload and the plan").

The pool is the one capacity formula's (memory.capacity, through `planner.plan` at a context of
max-model-len): its KV tokens, in whole blocks. Then

    worst case      = pool blocks / blocks of one max-model-len sequence   (today's figure)
    distribution    = pool blocks / mean blocks per admitted request
    at percentile   = pool blocks / the chosen percentile of blocks per request
    prefix caching  = pool blocks / mean blocks per request, shared blocks counted once

On a model whose layers keep different spans (sliding windows, chunks) or a state, the pool's
tokens are those of max-model-len sequences, so the distribution's figures are approximate there."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from qeval.config.run import RunConfig, first_error, load_config
from qeval.config.workload import WorkloadSpec
from qeval.errors import UserError
from qeval.files.yaml import load_yaml
from qeval.memory.planner import PlanRow
from qeval.workload.stats import WorkloadStats, blocks_of


@dataclass(frozen=True)
class ServingRow:
    """One setup's concurrency on the workload."""

    setup: str
    pool_blocks: int
    worst_case_concurrency: float
    concurrency_mean: float
    concurrency_at_percentile: float
    concurrency_with_prefix_cache: float | None


def serving_rows(rows: list[PlanRow], stats: WorkloadStats) -> list[ServingRow]:
    """The module docstring's figures per setup, from plan rows computed at a context of max-model-len."""
    bs = stats.block_size
    out = []
    for r in rows:
        pool = r.kv_cache_tokens // bs
        prefix = stats.prefix
        out.append(
            ServingRow(
                r.setup,
                pool,
                round(pool / blocks_of(stats.max_model_len, bs), 2),
                round(pool / stats.blocks.mean, 2),
                round(pool / stats.blocks.at_percentile, 2),
                round(pool / prefix.mean_blocks_with_cache, 2) if prefix and prefix.mean_blocks_with_cache else None,
            )
        )
    return out


def workload_json(
    stats: WorkloadStats,
    rows: list[ServingRow],
    source: str,
    fmt: str,
    skipped: int,
    arrivals: str,
    slo: dict[str, Any] | None,
) -> dict[str, Any]:
    """`qeval plan --workload --json`'s `workload` block."""
    return {
        "source": source,
        "format": fmt,
        "skipped": skipped,
        "arrivals": arrivals,
        "slo": slo,
        **stats.as_json(),
        "setups": [asdict(r) for r in rows],
    }


@dataclass(frozen=True)
class WorkloadSource:
    """What `--workload` names: the workload block, and the run config holding it where it is one."""

    spec: WorkloadSpec
    run: RunConfig | None


def workload_source(path: Path, fmt: str | None, custom_output_len: int | None) -> WorkloadSource:
    """A trace file (by its format, `fmt` or auto), a run config with a `workload:` block, or a YAML
    file that is a workload block alone; `fmt` and `custom_output_len` apply to a trace file only."""
    if path.suffix not in (".yaml", ".yml"):
        values: dict[str, Any] = {"trace": str(path), "format": fmt or "auto"}
        if custom_output_len is not None:
            values["custom_output_len"] = custom_output_len
        try:
            return WorkloadSource(WorkloadSpec.model_validate(values), None)
        except ValidationError as exc:
            raise UserError(f"--workload {path}: {first_error(exc)}") from None
    if fmt is not None or custom_output_len is not None:
        raise UserError(f"--workload {path}: a YAML file: set format and custom_output_len in its workload block")
    raw = load_yaml(path)
    if isinstance(raw, dict) and "model" in raw:
        cfg = load_config(path)
        if cfg.workload is None:
            raise UserError(f"{path}: has no workload: block")
        return WorkloadSource(cfg.workload, cfg)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a workload block (a mapping) or a run config")
    try:
        spec = WorkloadSpec.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"{path}: workload.{first_error(exc)}") from None
    if spec.trace is not None:  # resolved against the YAML's folder, as a run config's paths are
        spec.trace = str(path.parent / spec.trace) if not Path(spec.trace).is_absolute() else spec.trace
    return WorkloadSource(spec, None)


def model_context(config: dict[str, Any]) -> int | None:
    """The model's context from its config.json (`max_position_embeddings`, or its text model's)."""
    for piece in (config, config.get("text_config") or {}):
        value = piece.get("max_position_embeddings") if isinstance(piece, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def tokenizer_source(model: str) -> tuple[str | None, str]:
    """Where the model's tokenizer loads from (a folder or hub id), or None and why not."""
    path = Path(model)
    if path.is_dir():
        return str(path), ""
    if path.suffix == ".gguf":
        return None, f"--model {model} is a GGUF file"
    if path.is_file():
        if any((path.parent / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            return str(path.parent), ""
        return None, f"no tokenizer files beside {model}"
    return model, ""
