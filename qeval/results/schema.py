"""The results schema: what `RUN_DIR/results.json` and `RUN_DIR/samples/<setup>/<task>.jsonl`
hold, as typed models. This is qeval's API for pipelines, reports and notebooks: every consumer
works on these objects, and `docs/results.schema.json` is exported from them.

Compatibility (docs/architecture.md, "The stable surface"): fields are added freely, and a
reader keeps fields it does not know (every model allows extra keys), so a results.json from a
newer qeval with the same `schema_version` still reads. Renaming or removing a field bumps
`SCHEMA_VERSION`, and `read_results` then refuses the other version with one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from qeval.config.gates import Gate
from qeval.errors import UserError
from qeval.results.advice import AdviceResult
from qeval.results.base import ResultModel, Verdict
from qeval.results.echo import ConfigEcho, Hardware, Quantization, SetupSpec
from qeval.results.generation import GenerationDivergence
from qeval.results.long_context import LongContextInfo, SetupLongContext
from qeval.results.multi_turn import MultiTurnInfo
from qeval.results.performance import Ceilings, Performance
from qeval.results.samples import SampledRepeat as SampledRepeat  # re-exported: the record models' home
from qeval.results.samples import SampleRecord
from qeval.results.sequential import SequentialRun
from qeval.results.serving import ServingResults

SCHEMA_VERSION = 1


class Figure(ResultModel):
    """One figure of the memory ledger: measured, predicted, and where the measurement came from."""

    measured: int | float | None = Field(None, description="the measured value (bytes), or null where not measured")
    predicted: int | None = Field(None, description="the analytic prediction from config.json (bytes), if any")
    source: str = Field("not measured", description="how the measured value was obtained, in words")


class EnginePool(ResultModel):
    """The KV-cache pool the vLLM engine reported for itself (parsed from its log)."""

    kv_cache_tokens: int = Field(description="tokens the engine's KV pool holds")
    max_concurrency: float | None = Field(None, description="sequences of max_concurrency_context tokens it fits")
    max_concurrency_context: int | None = Field(None, description="the sequence length the engine sized that for")
    pool: str = Field(description="what the pool was sized from (GPU memory x utilization, or host memory on CPU)")
    source: str = Field(description="the log lines the figures were read from")


class SequenceKV(ResultModel):
    """What one sequence of the budget's context holds on this backend: KV per layer kind and the
    state of state layers (docs/memory.md, "Attention layouts"). On a uniform model it is KV bytes
    per token x context; where layers keep different spans (sliding windows, chunks, a latent)
    or hold a state, this, not the per-token figure, sizes the deployment."""

    context: int = Field(description="tokens in the sequence (budget.context_len)")
    engine: str = Field(description="whose accounting: vllm (block rounding, the hybrid allocator's groups) or hf")
    predicted: int = Field(description="bytes, from config.json by the engine's rules")
    by_layer_type: dict[str, int] = Field(
        description="predicted bytes per layer kind: full, sliding, chunked, latent (MLA)"
    )
    state_bytes: int = Field(0, description="predicted constant state of the state layers (linear attention)")
    naive: int = Field(description="2 x layers x KV heads x head_dim x bytes x context: the textbook figure")
    measured: int | None = Field(
        None, description="bytes the engine's cache held for one sequence of this context, or null where not measured"
    )
    source: str = Field("not measured", description="how the measured value was obtained")


class Memory(ResultModel):
    """Where the memory goes, predicted and measured (docs/memory.md), and what fits the budget."""

    weights_bytes: Figure = Field(description="the served weights, quantization scales and zero points included")
    kv_bytes_per_token: Figure = Field(
        description="KV-cache bytes one token costs (K and V, every attention "
        "layer); where layers keep different spans of tokens, the "
        "cost below the shortest span (see kv_per_sequence)"
    )
    peak_bytes: Figure = Field(Figure(), description="the worker's peak memory while scoring")
    activations_bytes: Figure = Field(Figure(), description="growth over the loaded model while scoring")
    overhead_bytes: Figure | None = Field(None, description="allocator slack (CUDA only)")
    engine: EnginePool | None = Field(None, description="the vLLM engine's own KV pool, where it reported one")
    kv_cache_tokens: int | None = Field(None, description="KV tokens that fit the budget (capacity_source says how)")
    max_concurrency: float | None = Field(None, description="sequences of budget.context_len tokens that fit")
    capacity_source: str | None = Field(None, description="how kv_cache_tokens and max_concurrency were obtained")
    kv_per_sequence: SequenceKV | None = Field(
        None,
        description="one sequence of the budget's context: KV per "
        "layer kind and state (null in results written "
        "before it was recorded)",
    )


class MetricValue(ResultModel):
    """A task metric over the scored documents."""

    value: float
    stderr: float | None = Field(None, description="standard error over documents; null where undefined (n = 1)")

    @field_validator("stderr", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v


class TaskScore(ResultModel):
    """One setup's score on one task."""

    n: int = Field(description="documents scored")
    metrics: dict[str, MetricValue] = Field(description="metric name -> value (the task's metric_list)")
    generated_tokens: float | None = Field(
        None,
        description="generation tasks: the mean tokens generated per "
        "document, a reasoning block and the stop token "
        "included (what serving the answers costs); null "
        "for other tasks",
    )


class KLDistribution(ResultModel):
    """KL(baseline || setup) and Δp over every scored token of a perplexity task, as llama.cpp's
    `llama-perplexity --kl-divergence` reports them. KL is taken on the baseline's top-16 ids plus
    one tail bucket: a lower bound of the full KL (docs/statistics.md)."""

    tokens: int = Field(description="tokens the distribution is over")
    kl_mean: float = Field(description="mean KL(baseline || setup) per token, nats")
    kl_median: float = Field(description="the median token's KL")
    kl_p90: float = Field(description="the 90th percentile of KL over tokens")
    kl_p99: float = Field(description="the 99th percentile")
    kl_p99_9: float = Field(description="the 99.9th percentile")
    kl_max: float = Field(description="the largest token's KL")
    same_top1: float = Field(description="share of tokens whose top-1 prediction is the baseline's")
    dp_mean: float | None = Field(
        None,
        description="mean Δp: the setup's probability of the actual next token "
        "minus the baseline's (null: the baseline's reference predates it)",
    )
    dp_rms: float | None = Field(None, description="root mean square of Δp")
    dp_min: float | None = Field(None, description="the most negative Δp")
    dp_p1: float | None = Field(None, description="the 1st percentile of Δp")
    dp_p5: float | None = Field(None, description="the 5th percentile of Δp")
    dp_p25: float | None = Field(None, description="the 25th percentile of Δp")
    dp_median: float | None = Field(None, description="the median Δp")
    dp_p75: float | None = Field(None, description="the 75th percentile of Δp")
    dp_p95: float | None = Field(None, description="the 95th percentile of Δp")
    dp_p99: float | None = Field(None, description="the 99th percentile of Δp")
    dp_max: float | None = Field(None, description="the largest Δp")


class PairedChange(ResultModel):
    """What a setup changed against the baseline on one task, paired by document: a comparison's
    figures, which a noise floor repeats from its control's comparison (qeval/analysis/floor.py)."""

    delta: float = Field(description="setup minus baseline, in the metric's units")
    ci: tuple[float, float] = Field(description="95% confidence interval of delta")
    flips_to_wrong: int | None = Field(None, description="documents right under the baseline, wrong here")
    flips_to_right: int | None = Field(None, description="documents wrong under the baseline, right here")
    outputs_changed: int | None = Field(
        None,
        description="generation tasks: documents whose generated text differs from the baseline's, whether or "
        "not the answer's score moved (null: not a generation task)",
    )
    n: int = Field(description="documents paired")
    kl: float | None = Field(
        None,
        description="mean KL(baseline || setup) per scored token: perplexity texts, and "
        "the continuation tokens of every choice of log-likelihood and "
        "multiple-choice tasks; null: not measured",
    )


class FloorFigures(PairedChange):
    """The noise floor on one task: an A/A control (the baseline served again under other conditions,
    `spec.control`) against the baseline, the figures a setup's own are read beside
    (docs/statistics.md, "The noise floor"); `setup` names the control."""

    setup: str = Field(description="the control setup these figures are from")
    conditions: str = Field(description="what the control changed (e.g. batch_size 1)")
    reaches_margin: bool | None = Field(
        None,
        description="whether the control's own drop reaches the gate's margin: the engine's noise alone "
        "would fail the gate (null: no gate)",
    )


class Comparison(PairedChange):
    """A setup against the baseline on one task, paired by document (docs/statistics.md)."""

    metric: str = Field(description="the metric compared (the task's primary metric)")
    higher_is_better: bool
    ci_method: Literal["newcombe", "t", "t_clustered", "bootstrap"] | None = Field(
        None,
        description="newcombe: Newcombe's paired score interval (accuracies); t: Student's t-interval on the "
        "paired per-document differences (bits per byte, linearised as a ratio; other scores); "
        "t_clustered: a sampled task's, paired by document and clustered over its repeats "
        "(the t-interval on the documents' mean differences over repeats); "
        "bootstrap: paired percentile bootstrap over documents (results written before the "
        "t-interval); null in results written before it was recorded (bootstrap)",
    )
    p_value: float | None = Field(None, description="McNemar's exact test (accuracies) or Wilcoxon (perplexity)")
    repeats: int | None = Field(None, description="sampled repeats per document (null: one, greedy)")
    p_adjusted: float | None = Field(None, description="Benjamini-Hochberg adjusted across the setup's tasks")
    verdict: Verdict | None = Field(None, description="the gate's verdict; null: no gate applies")
    verdict_reason: str | None = Field(
        None,
        description="why the verdict is inconclusive whatever the interval says (e.g. fewer paired documents "
        "than a verdict needs); null: the interval decided",
    )
    samples_to_decide: int | None = Field(
        None,
        description="for an inconclusive verdict: the documents at which this interval, the observed "
        "proportions or spread unchanged, would decide the gate; null: decided, or no estimate",
    )
    top1_agreement: float | None = Field(None, description="share of tokens whose top-1 prediction agrees")
    kl_distribution: KLDistribution | None = Field(
        None, description="the token-level KL and Δp distribution over the same tokens as `kl` (null: not measured)"
    )
    gate: Gate | None = Field(None, description="the gate applied")
    margin: float | None = Field(None, description="the gate's allowed drop, in the metric's units")
    recovery: float | None = Field(
        None, description="the setup's score as a share of the baseline's (higher-is-better metrics)"
    )
    floor: FloorFigures | None = Field(
        None,
        description="the noise floor on this task: the run's A/A control that moved furthest from the "
        "baseline (null: the run has no control, or this is the control)",
    )
    within_floor: bool | None = Field(
        None,
        description="whether this setup changed no more than the floor did: no more documents flipped "
        "(either way), no larger |delta|, and no larger KL where both were measured; its change is then "
        "within the engine's own noise (null: no floor)",
    )


class SuiteScore(ResultModel):
    """A setup on a suite: the average of its tasks' scores (each lm-eval group as one task),
    and recovery, the setup's average as a share of the baseline's (as Red Hat's and
    llm-compressor's model cards report it)."""

    tasks: list[str] = Field(description="the suite's tasks that both sides scored")
    score: float = Field(description="the setup's average of task scores")
    baseline: float = Field(description="the baseline's average of the same task scores")
    recovery: float | None = Field(None, description="score / baseline")
    ci: tuple[float, float] | None = Field(
        None, description="95% interval of recovery, from the tasks' own intervals combined (docs/statistics.md)"
    )
    verdict: Verdict | None = Field(None, description="a min_recovery gate's verdict")
    gate: Gate | None = Field(None, description="the recovery gate applied to the suite")


class SetupResult(ResultModel):
    """One setup of the run: its outcome, memory, scores and comparison with the baseline."""

    name: str
    baseline: bool
    status: Literal["ok", "failed"]
    error: str | None = Field(None, description="why it failed, one line")
    spec: SetupSpec = Field(description="the setup as configured, with its stable id")
    memory: Memory
    tasks: dict[str, TaskScore] = Field({}, description="task -> score (only results stored under this run's key)")
    vs_baseline: dict[str, Comparison] = Field(
        {}, description="task -> comparison with the baseline (empty for the baseline, and when either side failed)"
    )
    suites: dict[str, SuiteScore] = Field({}, description="suite -> average score and recovery against the baseline")
    flags: list[str] = Field([], description="warnings a reviewer must see (e.g. kv_cache_no_effect, memory_gap)")
    library_versions: dict[str, str] = {}
    quantization: Quantization = Field(
        Quantization(), description="what the quantizer or engine did (library, scheme, kernels)"
    )
    timings: dict[str, float] = {}
    performance: Performance | None = Field(
        None,
        description="serving speed on the configured workload and the "
        "share of the device's ceilings (null: not measured)",
    )
    long_context: SetupLongContext | None = Field(
        None, description="KV bytes and loss by token position at each long-context length (null: no long_context)"
    )

    @property
    def control(self) -> bool:
        """Whether this setup is a control: the baseline served again (docs/statistics.md), under
        other conditions (the noise floor) or on another engine (engine parity)."""
        return self.spec.control is not None

    @property
    def parity(self) -> bool:
        """Whether this setup is an engine-parity control: the baseline served on another backend."""
        return self.spec.served_on() is not None

    def sequence_bytes(self, context: int) -> int:
        """Weights plus the KV cache of one sequence of `context` tokens (measured, else
        predicted): what one replica needs."""
        m = self.memory
        w = m.weights_bytes.measured or m.weights_bytes.predicted or 0
        kv = m.kv_bytes_per_token.measured or m.kv_bytes_per_token.predicted or 0
        return int(w + kv * context)

    def worst_accuracy_delta(self) -> float:
        """The largest accuracy drop against the baseline, in points (0: none, or the baseline)."""
        from qeval.results.metrics import describe

        return 100 * min((c.delta for c in self.vs_baseline.values() if describe(c.metric).proportion), default=0.0)


class RunInfo(ResultModel):
    """Provenance of the run."""

    name: str
    config_hash: str
    qeval_version: str
    git_commit: str | None = None
    started: str | None = None
    finished: str | None = None
    device: str
    backend: str
    model_sha256: str = Field(description="sha256 over the model folder's content")
    limit: int | None = None
    output: str | None = None
    skipped_setups: dict[str, str] = Field({}, description="optional setups this device could not run, and why")
    hardware: Hardware = Hardware()
    dtype: str | None = Field(
        None,
        description="the dtype the setups computed in (model.dtype resolved on this "
        "device; null in results written before it was recorded)",
    )
    dtype_requested: str | None = Field(
        None, description="model.dtype as the config gave it (auto, bfloat16-if-native, bfloat16, float16 or float32)"
    )
    dtype_reason: str | None = Field(
        None,
        description="why that dtype: what `auto` chose and why, or what an emulated 16-bit dtype costs on this device",
    )
    partial_tasks: dict[str, str] = Field(
        {},
        description="config entries (tasks, lm-eval groups) with no complete "
        "result in this run, and why (e.g. not selected by "
        "--tasks): the run is judged on part of the config; "
        "empty: every entry was scored",
    )


class TaskInfo(ResultModel):
    """A task of the run and the data it was scored on."""

    output_type: str
    n: int
    sha256: str = Field(description="sha256 of the task's data")
    fingerprint: str = Field(description="hash of the data and of how it is prompted and scored")
    metric: str | None = Field(
        None,
        description="the metric setups are compared on (null in results written "
        "before it was recorded: the kind's default)",
    )
    kind: str = Field(
        "native",
        description="the task's kind (qeval/tasks/kinds.py): native, a qeval task YAML; "
        "lm_eval, an lm-evaluation-harness task; long_context, a generated "
        "long-context task; a registered plugin kind's name; or group, an "
        "lm-eval group of tasks scored pooled",
    )
    entry: str | None = Field(None, description="the config entry it belongs to: itself, or its lm-eval group")
    num_fewshot: int | None = Field(None, description="few-shot examples in each prompt (lm-eval tasks)")
    higher_is_better: bool | None = Field(
        None,
        description="the compared metric's direction as lm-eval declares it (null: qeval's metric descriptor decides)",
    )

    @property
    def is_group(self) -> bool:
        """An lm-eval group: its members' documents pooled, not a task of its own."""
        return self.kind == "group"

    @property
    def compared_metric(self) -> str:
        from qeval.results.metrics import default_compared_metric

        return self.metric or default_compared_metric(self.output_type)


class Dropped(ResultModel):
    """A stored result left out of the comparison: it belongs to another run's key."""

    setup: str
    task: str | None = Field(None, description="null: the whole setup")
    reason: str = Field(description="what differs from this run's key")


class Recommendation(ResultModel):
    """The decision (docs/statistics.md, "The recommendation")."""

    setup: str | None = Field(description="the recommended setup; null: none")
    reasons: dict[str, str] = Field(description="setup -> one line saying why it is or is not recommended")
    candidates: list[str] = Field([], description="setups that pass every gate and fit the budget")
    blocked: str | None = Field(None, description="why no setup could be judged at all (e.g. the baseline failed)")


class Results(ResultModel):
    """RUN_DIR/results.json."""

    schema_version: Literal[1]
    run: RunInfo
    config: ConfigEcho = Field(description="the resolved run config")
    tasks: dict[str, TaskInfo]
    setups: list[SetupResult]
    groups: dict[str, list[str]] = Field({}, description="lm-eval group -> its tasks (scored pooled, as one task)")
    suites: dict[str, list[str]] = Field({}, description="suite -> its tasks and groups")
    dropped: list[Dropped] = []
    recommendation: Recommendation
    ceilings: Ceilings | None = Field(
        None,
        description="the device's copy bandwidth and matmul peak, measured once per run (null: no performance phase)",
    )
    long_context: LongContextInfo | None = Field(None, description="the generated long-context tasks (null: none)")
    generation_divergence: GenerationDivergence | None = Field(
        None,
        description="divergence by generated position and accuracy by answer length per setup (null: the "
        "config has no generation_divergence)",
    )
    multi_turn: MultiTurnInfo | None = Field(
        None,
        description="the multi-turn probes: accuracy and answer divergence by question turn per setup (null: none)",
    )
    advice: AdviceResult | None = Field(
        None,
        description="the mixed-precision advice of the config's `advise:` "
        "block (null: none); its setup is one of `setups`",
    )
    sequential: SequentialRun | None = Field(
        None, description="a sequential run's cells, trajectories and documents scored (null: the switch is off)"
    )
    serving: ServingResults | None = Field(
        None,
        description="`recommend_by: goodput`: every setup served on the "
        "config's workload and tuned, as RUN_DIR/serving.json "
        "holds it (null: not served)",
    )

    def setup(self, name: str) -> SetupResult:
        return next(s for s in self.setups if s.name == name)

    @property
    def baseline(self) -> SetupResult | None:
        return next((s for s in self.setups if s.baseline), None)


def read_results(path: Path) -> Results:
    """RUN_DIR/results.json, typed; a missing, corrupt or other-version file is one UserError."""
    if not path.is_file():
        raise UserError(f"{path}: not found (is {path.parent} a qeval run directory?)")
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: corrupt JSON ({getattr(exc, 'msg', exc)})") from None
    except RecursionError:  # nested thousands deep: json's decoder recurses (a run compare is given)
        raise UserError(f"{path}: corrupt JSON (nested too deeply)") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise UserError(f"{path}: results schema_version {version}; this qeval reads schema_version {SCHEMA_VERSION}")
    try:
        return Results.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"{path}: not a qeval results file ({'.'.join(map(str, err['loc']))}: {err['msg']})") from None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of results.json (exported to docs/results.schema.json)."""
    schema = Results.model_json_schema()
    schema["title"] = f"qeval results.json (schema_version {SCHEMA_VERSION})"
    # a line of samples/<setup>/<task>.jsonl, documented beside it (its models share the $defs)
    record = SampleRecord.model_json_schema()
    schema["$defs"] |= record.pop("$defs", {})
    schema["$defs"]["SampleRecord"] = record
    return schema
