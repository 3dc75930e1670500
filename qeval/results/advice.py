"""results.json's `advice` block: what a run's `advise:` block found (docs/advisor.md, "In a
run"): each unit's sensitivity, the chosen mix, and the held-out check against random mixes.
The advised setup itself is an ordinary entry of `setups`, scored and gated like the others."""

from __future__ import annotations

from typing import Any

from pydantic import Field

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
    heldout_kl: float = Field(description="mean KL to the baseline per token on the held-out documents")


class AdviceResult(ResultModel):
    """The advice a run computed (or reused from RUN_DIR/advice.json) before its setups ran."""

    setup: str = Field(description="the advised setup's name (one of `setups`)")
    target: str = Field(description="the setup whose precision it lowers (uniform int4 or int8)")
    keep: list[str] = Field(description="the advised setup's keep patterns")
    budget: str = Field(description="the budget as the advisor read it")
    budget_bytes: int = Field(description="the budget in bytes on its basis")
    budget_basis: str = Field(description="what the budget counts")
    calibration: dict[str, Any] = Field(description="source, documents, tokens, heldout_documents, top_k")
    uniform_kl: float = Field(description="the uniform target's KL on the calibration slice")
    units: list[AdviceUnit] = Field(description="each unit's sensitivity: the cells, then the unions when measured")
    search: dict[str, Any] = Field(description="method (exact or greedy), allowance_bytes, extra_bytes, kept, "
                                               "predicted_gain_kl, predicted_kl (gains added), measured_calib_kl "
                                               "(the mix measured as a whole on the calibration slice)")
    heldout: list[AdviceMix] = Field([], description="the held-out check (empty: heldout_docs 0)")
    versus_random: dict[str, Any] = Field({}, description="random minus advisor, paired by document: mean_diff, "
                                                          "ci95, draws, draws_beaten, verdict")
    timing: dict[str, float] = Field({}, description="seconds: load_s, baseline_pass_s, sensitivity_s, passes, "
                                                     "seconds_per_pass, total_s")
    key: str = Field(description="the advice's resume key (qeval/run/advice.py)")
    reused: bool = Field(False, description="this run reused the stored advice.json (its key unchanged)")
