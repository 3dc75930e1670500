"""What the advisor is asked and what it lowers, light enough for preflight: the options, the
target setup and the budget's allowance need no torch (qeval/advise/advisor.py runs the advisor)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qeval.config import RunConfig
from qeval.config.advise import AdviceBudget
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.ledger import predict_kv_bytes_per_token, predict_weights_bytes
from qeval.model.shape import ModelShape

__all__ = ["Options", "allowance_of", "budget_problem", "kv_target", "pick_target"]

#: a budget within this share of the uniform setup is that setup (a rounded 4.25bpw for INT4 g128)
_EQUAL = 1e-3


@dataclass(frozen=True)
class Options:
    """What `qeval advise` was asked (its command-line options)."""

    #: bits per weight or memory (the weight advisor); None for the KV advisor, which `kl_target` drives
    budget: AdviceBudget | None
    target: str | None = None
    text: Path | None = None
    calib_docs: int = 16
    heldout_docs: int = 32
    random_draws: int = 5
    seed: int = 0
    #: also measure whole blocks and module types (2 x (layers + 2) passes more), not only the cells
    unions: bool = True
    #: the advised setup's name (default `<target>-advised`)
    name: str | None = None
    #: the KV advisor (qeval/advise/kv.py): the cheapest per-layer KV assignment whose KL on the
    #: calibration slice stays within this; None: the weight advisor under `budget`
    kl_target: float | None = None

    @property
    def kv(self) -> bool:
        """Whether this is the KV advisor's request (per-layer KV precision) rather than the weights'."""
        return self.kl_target is not None


def pick_target(cfg: RunConfig, name: str | None, where: str = "--target") -> Setup:
    """The setup whose precision the advisor lowers: `name` (given as `where`: `--target` or a
    run's `advise.target`), else the config's first int4 (then int8) quanto setup without
    KV-cache quantization or keep list."""
    if name is not None:
        found = next((s for s in cfg.setups if s.name == name), None)
        if found is None:
            raise UserError(f"{where}: no setup {name!r} in the config's setups")
        if not (found.weights in ("int8", "int4") and found.method == "rtn") or found.keep or found.quantizes_kv:
            raise UserError(
                f"{where} {name}: the advisor lowers quanto's weights (weights int8/int4, method rtn, "
                "no keep list, no quantized KV cache); a GPTQ/AWQ checkpoint's weights differ"
            )
        return found
    for bits in ("int4", "int8"):
        for s in cfg.setups:
            if s.weights == bits and s.method == "rtn" and not s.quantizes_kv and not s.keep:
                return s
    raise UserError(f"advise: the config has no int4 or int8 setup (method rtn) to advise on; add one or name {where}")


def kv_target(cfg: RunConfig, name: str | None, where: str = "--target") -> Setup:
    """The KV setup whose cache the advisor lowers per layer: `name`, else the config's first setup
    that quantizes the KV cache alone (16-bit weights, no kept layers, no control)."""

    def usable(s: Setup) -> bool:
        return s.quantizes_kv and not s.quantizes_weights and not s.kv_keep and s.control is None and not s.baseline

    if name is not None:
        found = next((s for s in cfg.setups if s.name == name), None)
        if found is None:
            raise UserError(f"{where}: no setup {name!r} in the config's setups")
        if not usable(found):
            raise UserError(
                f"{where} {name}: the KV advisor lowers a quantized KV cache on the model's own weights "
                "(kv_cache set, no weights, no kv_keep)"
            )
        return found
    found = next((s for s in cfg.setups if usable(s)), None)
    if found is None:
        raise UserError(
            f"advise: the config has no setup with a quantized KV cache (and 16-bit weights); add one or name {where}"
        )
    return found


def allowance_of(
    budget: AdviceBudget, shape: ModelShape, target: Setup, dtype: str, context: int
) -> tuple[int, int, str]:
    """(allowance in bytes over the uniform target, the budget in bytes, what it counts)."""
    uniform = predict_weights_bytes(shape, target, dtype)
    if budget.kind == "bits":
        params = sum(o * i for o, i in shape.linear_shapes())
        linear = uniform - shape.other_params() * _bytes(dtype)
        allowed = int(budget.value * params / 8)
        return allowed - linear, allowed, f"decoder linear layers, {params:,} weights, scales included"
    kv = predict_kv_bytes_per_token(shape, target, dtype) * context
    return int(budget.value) - uniform - kv, int(budget.value), f"weights + one sequence's KV cache at {context} tokens"


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def budget_problem(
    budget: AdviceBudget, allowance: int, budget_bytes: int, target: str, where: str, keep_all: int | None = None
) -> str:
    """Why a budget leaves nothing to advise over the uniform `target` setup (`where` names it:
    `--budget 3 bits per weight`, `advise.budget 3bpw`), or '' where it leaves room: nothing to
    keep, or (`keep_all`: the bytes keeping every cell adds) room to keep every layer, which is
    the baseline itself. A budget that rounds to the uniform setup's own size (within 0.1%) is
    called equal to it, not below."""
    if keep_all is not None and allowance >= keep_all:
        return (
            f"{where}: room to keep every layer at the model's dtype, which is the baseline itself, not a "
            f"quantized setup: nothing to advise; give a budget below the model's own weights"
        )
    if allowance > 0:
        return ""
    uniform = budget_bytes - allowance
    relation = "equal to" if -allowance <= _EQUAL * uniform else "below"
    size = (
        f"{budget.value * uniform / budget_bytes:.4g} bits per weight"
        if budget.kind == "bits" and budget_bytes
        else f"{uniform / 2**20:.2f} MiB"
    )
    return f"{where}: {relation} the uniform {target} setup itself ({size} on the same basis): nothing to keep"
