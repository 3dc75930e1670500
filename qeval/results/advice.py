"""results.json's `advice` block: what a run's `advise:` block found (docs/advisor.md, "In a
run"): each unit's sensitivity, the chosen mix, and the held-out check against random mixes.
The advised setup itself is an ordinary entry of `setups`, scored and gated like the others."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_serializer

from qeval.config.setups import Setup
from qeval.results.base import ResultModel


class AdviceUnit(ResultModel):
    """One unit's sensitivity on the calibration slice (a layer x module-type cell, or a union)."""

    unit: str = Field(description="L<layer>.<attn|mlp> for a cell, L<layer> for a block, attn or mlp for a type")
    layer: int | None = Field(None, description="the decoder layer (null: a module type over every layer)")
    kind: str | None = Field(None, description="attn or mlp (null: a whole block)")
    extra_bytes: int = Field(description="the bytes keeping this unit at the model's dtype adds (predicted)")
    cost_kl: float = Field(description="KL(baseline || model) with only this unit quantized")
    gain_kl: float = Field(description="the uniform setup's KL minus the KL with only this unit kept")


class AdviceMix(ResultModel):
    """One mix on the held-out documents: the uniform target, the advisor's, or a random one of
    the same bytes."""

    name: str
    kept: list[str] = Field(description="the units kept at the model's dtype")
    weights_bytes: int = Field(description="predicted weights bytes (memory/ledger.py)")
    kv_bytes_per_token: int | None = Field(
        None, description="the KV advisor's mixes: predicted KV bytes per token, each layer at its own precision"
    )
    heldout_kl: float = Field(description="mean KL to the baseline per token on the held-out documents")


class HeldoutMix(AdviceMix):
    """A held-out mix as advice.json keeps it: with its per-document KLs (left out of results.json)."""

    per_doc: list[float] = Field([], repr=False, description="mean KL per held-out document, in their order")


class AdviceCalibration(ResultModel):
    """The calibration slice the sensitivity was measured on."""

    source: str = Field(description="the named text, or the config's perplexity task")
    documents: int = Field(description="calibration documents")
    tokens: int = Field(description="calibration tokens")
    heldout_documents: int = Field(description="held-out documents (the search never saw them)")
    top_k: int = Field(description="the baseline's top-k ids the KL is taken on (plus a tail bucket)")


class AdviceSearch(ResultModel):
    """The search under the budget (qeval/advise/search.py) and the chosen mix."""

    method: str = Field(description="exact or greedy")
    allowance_bytes: int = Field(description="the bytes the budget allows keeping above the uniform target")
    extra_bytes: int = Field(description="the bytes the kept units add")
    kept: list[str] = Field(description="the kept units")
    predicted_gain_kl: float = Field(description="the kept units' gains added")
    predicted_kl: float = Field(description="the uniform target's KL minus the predicted gain")
    measured_calib_kl: float = Field(description="the mix measured as a whole on the calibration slice")
    kl_target: float | None = Field(
        None, description="the KV advisor: the KL the cheapest assignment must stay within (null: a weight budget)"
    )


class RandomDraw(ResultModel):
    """One random mix against the advisor's, paired by held-out document."""

    mix: str = Field(description="the random mix's name")
    mean_diff: float = Field(description="random minus advisor, mean KL per document")
    ci95: list[float] = Field(description="its 95% t-interval [lower, upper]")


class VersusRandom(ResultModel):
    """The held-out check against random mixes of the same bytes; only `verdict` where there was
    none (no held-out documents, or nothing kept)."""

    verdict: str = Field("no held-out check", description="in words")
    documents: int | None = Field(None, description="held-out documents paired")
    draws: int | None = Field(None, description="random mixes drawn")
    mean_diff: float | None = Field(None, description="random (mean over the draws) minus advisor, mean KL")
    ci95: list[float] | None = Field(None, description="its 95% t-interval [lower, upper]")
    draws_beaten: int | None = Field(None, description="draws the advisor's mix beat beyond noise")
    per_draw: list[RandomDraw] = Field([], description="each draw against the advisor's mix")


class AdviceTiming(ResultModel):
    """What the advice cost, in seconds (passes: forward passes over the calibration slice)."""

    load_s: float = Field(description="loading the model and the slice")
    baseline_pass_s: float = Field(description="the baseline's pass (its top-k kept)")
    sensitivity_s: float = Field(description="every pass of the sensitivity, the baseline's included")
    passes: float = Field(description="forward passes over the calibration slice")
    seconds_per_pass: float = Field(description="a candidate's pass, on average")
    total_s: float = Field(description="the whole advice, the held-out check included")


class KvPlanRow(ResultModel):
    """The KV advisor's memory figures for one setup: bytes per token and, at each context, one
    sequence's KV cache and the sequences the budget holds (qeval/memory; `engine` names the rule)."""

    setup: str
    kv_cache: str = Field(description="the setup's KV dtype (auto: the model's)")
    kv_keep: list[str] = Field([], description="the layers kept at the model's dtype")
    kv_bytes_per_token: int
    engine: str = Field(description="whose accounting the sequences follow (vllm's paged blocks or hf's layers)")
    sequence_bytes: dict[int, int] = Field(description="context -> one sequence's KV cache and state, bytes")
    sequences: dict[int, float] = Field(description="context -> concurrent sequences the budget's KV pool holds")


class AdviceFigures(ResultModel):
    """What the advisor read, measured and chose that advice.json keeps and results.json's `advice`
    block copies as it is (qeval/run/advice.py `result_block`)."""

    budget: str = Field(description="the budget as the advisor read it")
    budget_bytes: int = Field(description="the budget in bytes on its basis")
    budget_basis: str = Field(description="what the budget counts")
    calibration: AdviceCalibration = Field(description="the calibration slice")
    uniform_kl: float = Field(description="the uniform target's KL on the calibration slice")
    search: AdviceSearch = Field(description="the search and the chosen mix")
    versus_random: VersusRandom = Field(VersusRandom(), description="random minus advisor, paired by document")


class Advice(AdviceFigures):
    """RUN_DIR/advice.json (and `qeval advise`'s advice.json): everything the advisor found,
    written by qeval/advise/advisor.py, read back by qeval/run/advice.py and qeval/advise/output.py."""

    config: str
    model: str
    dtype: str
    device: str
    #: the uniform setup whose precision the advice lowers
    target: Setup
    rows: list[AdviceUnit]
    #: the advised setup
    setup: Setup
    mixes: list[HeldoutMix]
    timing: AdviceTiming
    #: the KV advisor: memory per setup at 4k and 32k tokens, and the `vllm serve` line of the advice
    kv_plan: list[KvPlanRow] = []
    serve_line: str | None = None
    #: a run's resume key for this advice and its parts (qeval/run/advice.py); empty from `qeval advise`
    key: str = ""
    key_parts: dict[str, str] = {}
    #: this run reused the stored file (set on read, never written)
    reused: bool = Field(False, exclude=True)

    @field_serializer("target", "setup")
    def _spec(self, setup: Setup) -> dict[str, Any]:
        # the setup as a config names it: its non-default keys (the YAML snippet pastes these)
        return setup.model_dump(mode="json", exclude_defaults=True) | {"name": setup.name}


class AdviceResult(AdviceFigures):
    """The advice a run computed (or reused from RUN_DIR/advice.json) before its setups ran."""

    setup: str = Field(description="the advised setup's name (one of `setups`)")
    target: str = Field(description="the setup whose precision it lowers (uniform int4 or int8)")
    keep: list[str] = Field(description="the advised setup's keep patterns")
    kv_keep: list[str] = Field([], description="the KV advisor's: the layers whose KV cache the advised setup keeps")
    units: list[AdviceUnit] = Field(description="each unit's sensitivity: the cells, then the unions when measured")
    heldout: list[AdviceMix] = Field([], description="the held-out check (empty: heldout_docs 0)")
    timing: AdviceTiming | None = Field(None, description="what computing the advice cost")
    key: str = Field(description="the advice's resume key (qeval/run/advice.py)")
    reused: bool = Field(False, description="this run reused the stored advice.json (its key unchanged)")
