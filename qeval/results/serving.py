"""The typed results of the serving phase (`qeval goodput`, and `qeval run` under
`recommend_by: goodput`): RUN_DIR/serving.json (docs/performance.md, "Serving the workload"). A
file of its own, rewritten after every setup so that an interrupted phase resumes; `qeval run`
also copies it into results.json's `serving` block (null for a run that did not serve)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationError

from qeval.errors import UserError
from qeval.results.base import ResultModel
from qeval.results.echo import Echo

if TYPE_CHECKING:
    from qeval.config.workload import SloSpec

SERVING_VERSION = "1"
FILE = "serving.json"


class EngineRate(ResultModel):
    """An engine setting and a request rate offered to it."""

    max_num_seqs: int = Field(description="the server's --max-num-seqs")
    max_num_batched_tokens: int | None = Field(
        None, description="the server's --max-num-batched-tokens (null: vLLM's default)"
    )
    rate: float = Field(description="offered request rate, requests/s (seeded Poisson arrivals)")


class ServingLevel(EngineRate):
    """One load level: a request rate against one engine setting."""

    requests: int = Field(description="requests sent")
    completed: int = Field(description="requests answered in full")
    failed: int = Field(description="requests that ended in an error")
    duration_s: float = Field(description="the bench's duration: first send to last answer")
    goodput_rps: float = Field(description="requests within every per-request target per second (vLLM's goodput)")
    vllm_goodput_rps: float | None = Field(
        None, description="`vllm bench serve`'s own request_goodput for the same requests (a check on qeval's maths)"
    )
    throughput_rps: float = Field(description="completed requests per second")
    output_tokens_per_s: float = Field(description="generated tokens per second over the level's duration")
    percentiles_ms: dict[str, dict[str, float]] = Field(
        description="ttft, tpot, itl, e2e -> p50, p90, p99 (and the SLO's percentile), ms, np.percentile"
    )
    meets_slo: bool = Field(description="no failure and every target within at the SLO's percentile")
    violations: list[str] = Field([], description="which targets the level broke")
    kv_usage_peak: float | None = Field(None, description="highest vllm:kv_cache_usage_perc sampled (0..1)")
    kv_usage_mean: float | None = Field(None, description="mean of the samples while requests ran (steady state)")
    preemptions: int | None = Field(None, description="vllm:num_preemptions_total over the level")
    queue_time_mean_ms: float | None = Field(
        None, description="the server's mean time waiting to be scheduled (vllm:request_queue_time_seconds sum / count)"
    )
    kv_samples: int = Field(0, description="/metrics samples taken during the level")


class ServingPick(EngineRate):
    """The tuner's answer for a setup: the engine setting, at the level the pick is measured at."""

    goodput_rps: float = Field(description="its goodput, requests/s within the SLO")


class ServingSetup(ResultModel):
    """One setup served on the workload, tuned."""

    setup: str = Field(description="the setup's name in the run config")
    key: str = Field(description="what its figures depend on; a rerun with the same key reuses them")
    status: Literal["ok", "failed"] = Field(description="failed: the server or the load generator failed (error)")
    error: str | None = Field(None, description="the failure, one line")
    max_model_len: int = Field(description="from the workload's plan (its percentile, rounded up to blocks)")
    prefix_caching: bool = Field(description="served with --enable-prefix-caching (the workload shares prefixes)")
    levels: list[ServingLevel] = Field([], description="every level measured, in the order measured")
    pick: ServingPick | None = Field(
        None, description="highest goodput within the SLO with KV under the limit; null: no level met the SLO"
    )
    best_p99_ms: dict[str, float] = Field(
        {},
        description="where no level met it: each targeted figure's lowest "
        "value at the SLO's percentile over the levels",
    )
    serve_command: str = Field(description="`vllm serve` with the tuned flags (the pick's, else the first setting's)")
    restarts: int = Field(0, description="engine starts the search made")
    bound_restarts: int = Field(0, description="the most engine starts the grid allows")
    bound_levels: int = Field(0, description="the most levels the grid allows")
    seconds: float | None = Field(None, description="wall time of the setup's search")


class ServedWorkload(Echo):
    """serving.json's `workload` block: what was replayed, how, and its plan."""

    source: str | None = Field(None, description="the trace file, or the distribution drawn")
    requests_per_level: int | None = Field(None, description="requests sent at each load level")
    trace_requests: int | None = Field(None, description="requests in the workload")
    max_model_len: int | None = Field(None, description="the servers' max-model-len")
    percentile: float | None = Field(None, description="the percentile of prompt + output max-model-len covers")
    refused: int | None = Field(None, description="requests longer than max-model-len")
    refused_share: float | None = Field(None, description="their share of the workload")
    arrivals: str | None = Field(None, description="how requests arrive at each rate")
    rates: list[float] = Field([], description="the request rates offered, per second")
    prefix_caching: bool | None = Field(None, description="whether the servers cached shared prefixes")
    slo: dict[str, float] = Field({}, description="the SLO: its percentile and each latency's bound in ms")


class GoodputRecommendation(Echo):
    """serving.json's `recommendation`: the setup that serves the most within the SLO among those
    the scored run lets through, and a reason per setup."""

    setup: str | None = Field(None, description="the recommended setup (null: none meets the SLO)")
    by: str | None = Field(None, description="what it was ranked by: goodput")
    reasons: dict[str, str] = Field({}, description="setup -> why it is or is not recommended")
    gates_checked: bool = Field(False, description="whether a scored run's gates were checked")


class ServingResults(ResultModel):
    """RUN_DIR/serving.json."""

    version: str = Field(SERVING_VERSION, description="the serving file's format version")
    config: str = Field(description="the run config's name")
    workload: ServedWorkload = Field(description="source, requests per level, refused, arrivals, the SLO")
    load_generator: str = Field(description="the tool that sent the load, with its version and options")
    machine: str = Field(description="where the servers ran (the driver's machine)")
    kv_usage_limit: float = Field(description="the tuner's ceiling on a level's peak KV-cache usage (0..1)")
    setups: list[ServingSetup] = Field([], description="every setup served, in config order")
    recommendation: GoodputRecommendation = Field(
        default_factory=GoodputRecommendation, description="`setup` (or null) and a reason per setup"
    )
    notes: list[str] = Field([], description="what a reader must know (dtype, memory reserved)")

    def slo(self) -> SloSpec:
        """The SLO the setups were served against (the workload's, as recorded)."""
        from qeval.config.workload import SloSpec

        return SloSpec.model_validate(self.workload.slo)


def read_serving(path: Path) -> ServingResults:
    """RUN_DIR/serving.json (or the file itself); one UserError if it is missing or unreadable."""
    file = path / FILE if path.is_dir() else path
    try:
        return ServingResults.model_validate(json.loads(file.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UserError(f"{file}: not found (run `qeval goodput` on the config first)") from None
    except (json.JSONDecodeError, ValidationError, UnicodeDecodeError) as exc:
        raise UserError(f"{file}: not a serving.json ({type(exc).__name__})") from None
