"""The run config's `advise:` block: the mixed-precision advisor run inside `qeval run`, its
advised setup then scored as an ordinary setup of the same run (docs/advisor.md, "In a run").
Also the advisor's budget and its parser, which `qeval advise --budget` shares."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pydantic import Field, field_validator, model_validator

from qeval.errors import UserError
from qeval.files.names import NAME_PATTERN
from qeval.strict import Seed, Strict

_BUDGET = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(bpw|bits|b|kib|mib|gib)?\s*", re.IGNORECASE)
_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
#: above the model's own 16-bit weights there is nothing to advise (every layer kept)
MAX_BITS = 16.0
#: a memory budget past 1 PiB is a typo, not a device (and past 2**63 bytes an overflow later)
MAX_BYTES = 2**50


@dataclass(frozen=True)
class AdviceBudget:
    """Average bits per decoder-linear weight (scales included), or memory bytes at the target
    context (the weights plus one sequence's KV cache at `budget.context_len`)."""

    kind: str  # "bits" or "bytes"
    value: float

    def __str__(self) -> str:
        return f"{self.value:g} bits per weight" if self.kind == "bits" else f"{self.value / 2**20:.2f} MiB"


def parse_advice_budget(text: str, where: str = "--budget") -> AdviceBudget:
    """`4.5bpw` (or `4.5bits`), `350MiB`, `2GiB`, `123456B`; anything else is a UserError
    naming `where` (the option or the config key)."""
    m = _BUDGET.fullmatch(text)
    if not m or m.group(2) is None:
        raise UserError(
            f"{where} {text!r}: give average bits per weight (e.g. 4.5bpw) or memory "
            "at the target context (e.g. 350MiB, 2GiB, 123456B)"
        )
    unit = m.group(2).lower()
    value = float(m.group(1))  # a 400-digit number is inf here: refused below, not overflowed later
    shown = text if len(text) <= 40 else text[:20] + "…" + text[-10:]
    if value <= 0:
        raise UserError(f"{where} {shown!r}: must be positive")
    if unit in ("bpw", "bits"):
        if not math.isfinite(value) or value > MAX_BITS:
            raise UserError(
                f"{where} {shown!r}: at most {MAX_BITS:g} bits per weight (the model's own 16-bit "
                "weights: every layer kept)"
            )
        return AdviceBudget("bits", value)
    size = value * _UNITS[unit]
    if not math.isfinite(size) or size > MAX_BYTES:
        raise UserError(f"{where} {shown!r}: at most {MAX_BYTES // 2**30:,} GiB")
    return AdviceBudget("bytes", size)


class AdviseSpec(Strict):
    """`advise:` in a run config: before the setups run, the advisor measures each unit's
    sensitivity for `target`, chooses the units to keep under `budget`, and the run adds the
    advised setup (named `name`) to its setups. The same knobs as `qeval advise`'s options."""

    budget: str | None = Field(
        default=None,
        description="average bits per decoder-linear weight (5bpw) or memory at budget.context_len (350MiB); "
        "the weight advisor's (required unless kl_target)",
    )
    #: the KV advisor: the cheapest per-layer KV assignment whose calibration KL stays within this
    #: (nats per token); its target is a quantized-KV setup (docs/advisor.md)
    kl_target: float | None = Field(default=None, gt=0, lt=100)
    #: the setup whose precision is lowered; default the config's first int4 (then int8) quanto setup
    target: str | None = Field(default=None, pattern=NAME_PATTERN)
    #: calibration text (plain paragraphs, or JSON Lines with `text`); default the run's perplexity task
    text: str | None = None
    calib_docs: int = Field(default=16, ge=1)
    heldout_docs: int = Field(default=32, ge=0)
    random_draws: int = Field(default=5, ge=0)
    seed: Seed = 0
    #: also measure whole blocks and module types (the search needs only the cells)
    unions: bool = True
    #: the advised setup's name in the run; default `<target>-advised`
    name: str | None = Field(default=None, pattern=NAME_PATTERN)

    @model_validator(mode="after")
    def _one_criterion(self) -> AdviseSpec:
        if (self.budget is None) == (self.kl_target is None):
            raise ValueError(
                "give budget (the weight advisor: 5bpw, 350MiB) or kl_target (the KV advisor: 0.02), one of them"
            )
        return self

    @field_validator("budget")
    @classmethod
    def _budget(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            parse_advice_budget(value, "")
        except UserError as exc:  # first_error names the key: advise.budget
            raise ValueError(str(exc).strip()) from None
        return value

    @field_validator("heldout_docs")
    @classmethod
    def _heldout(cls, value: int) -> int:
        if value == 1:
            raise ValueError("1: a paired interval needs at least 2 documents (or 0 for no held-out check)")
        return value

    def parsed_budget(self) -> AdviceBudget | None:
        """The weight advisor's budget as read (None: the KV advisor's block)."""
        return None if self.budget is None else parse_advice_budget(self.budget, "advise.budget")

    def setup_name(self, target: str) -> str:
        """The advised setup's name for the target setup `target`."""
        return self.name or f"{target}-advised"
