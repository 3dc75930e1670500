"""The KV advisor (docs/advisor.md, "Which layers' KV cache to quantize"): per-layer KV
sensitivity and the cheapest per-layer assignment within a KL target.

A unit is one attention layer's KV cache (`L5.kv`; a union: every layer of one attention kind,
`sliding`, `full`). A candidate is the model scored with its KV cache quantized on some layers
and kept at the model's dtype on the rest, through the serving backend's own per-layer cache
(`BackendEntry.kv_cache_for`: transformers' round-trip cache, which quantizes every token's K/V
as decoding would; qeval/backends/hf/kv_cache.py). The measures are the weight advisor's (cost:
only this layer quantized; gain: what keeping only this layer recovers from the uniform cache),
and the search keeps the layers with the most gain per byte until the KL is within the target,
then measures the whole mix and keeps more while it is not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qeval.advise.sensitivity import Scorer
from qeval.advise.units import Unit
from qeval.backends import plan_kv_rule
from qeval.config import RunConfig
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.capacity import kv_capacity
from qeval.memory.layouts import predict_sequence
from qeval.memory.ledger import kv_bytes_per_layer_token, predict_kv_bytes_per_token, predict_weights_bytes
from qeval.model.shape import ModelShape
from qeval.results.advice import KvPlanRow

__all__ = ["PLAN_CONTEXTS", "KvProbe", "cheapest_order", "kv_plan", "kv_unions", "kv_units"]


def kv_units(shape: ModelShape, target: Setup, dtype: str) -> list[Unit]:
    """One unit per attention layer, in layer order: its kind, and the bytes per token keeping
    its KV cache at the model's dtype adds to the uniform target's."""
    plain = kv_bytes_per_layer_token(shape, target.model_copy(update={"kv_cache": "auto"}), dtype)
    extra = plain - kv_bytes_per_layer_token(shape, target, dtype)
    return [Unit(f"L{i}.kv", i, kind, (str(i),), extra) for i, kind in enumerate(shape.kinds()) if kind != "linear"]


def kv_unions(cell_units: list[Unit]) -> list[Unit]:
    """Every layer of one attention kind (sliding, full, chunked), where the model has several."""
    kinds = list(dict.fromkeys(u.kind for u in cell_units if u.kind))
    if len(kinds) < 2:
        return []
    out = []
    for kind in kinds:
        part = [u for u in cell_units if u.kind == kind]
        out.append(Unit(kind, None, kind, sum((u.modules for u in part), ()), sum(u.extra_bytes for u in part)))
    return out


class KvProbe(Scorer):
    """A loaded model scored with its KV cache quantized on the layers asked (`use`) and kept at the
    model's dtype on the others, by the backend's own per-layer cache."""

    def __init__(
        self, model: Any, target: Setup, layers: list[str], cache_for: Callable[[Any, Setup], Any], batch_size: int = 8
    ) -> None:
        super().__init__(model, batch_size)
        self._target, self._layers, self._cache_for = target, layers, cache_for
        self._quantized: set[str] = set()

    def use(self, quantized: set[str]) -> None:
        self._quantized = set(quantized)

    def _cache(self) -> Any:
        if not self._quantized:  # nothing quantized: the model's own cache (the baseline)
            return None
        kept = tuple(layer for layer in self._layers if layer not in self._quantized)
        return self._cache_for(self.model.config, self._target.model_copy(update={"kv_keep": kept}))


@dataclass(frozen=True)
class KvChoice:
    """Layers to keep, in the order they were added, and the KL the gains predict."""

    order: tuple[int, ...]  # candidate indices, best gain per byte first
    kept: int  # how many of `order` the prediction keeps
    predicted_kl: float


def cheapest_order(gains: list[float], costs: list[int], uniform: float, kl_target: float) -> KvChoice:
    """The layers worth keeping, best KL gain per byte first, and how many of them the additive
    prediction needs for the uniform cache's KL to fall within `kl_target` (all of them where it
    never does: the measured mix then says how far off it stays)."""
    order = tuple(sorted((i for i, g in enumerate(gains) if g > 0), key=lambda i: (-gains[i] / max(costs[i], 1), i)))
    predicted, kept = uniform, 0
    while predicted > kl_target and kept < len(order):
        predicted -= gains[order[kept]]
        kept += 1
    return KvChoice(order, kept, predicted)


#: the contexts the KV advisor sizes sequences at (a chat turn's, a long document's)
PLAN_CONTEXTS = (4096, 32768)


def kv_plan(cfg: RunConfig, shape: ModelShape, setups: list[Setup], dtype: str) -> list[KvPlanRow]:
    """Each setup's KV bytes per token, and at PLAN_CONTEXTS one sequence's KV cache and the
    sequences the config's budget holds, by the config's engine's accounting (`qeval plan`'s
    defaults: vLLM's GPU blocks of 16), transformers' where vLLM's is not modelled (several
    attention kinds with mixed precision)."""
    rows = []
    for setup in setups:
        try:  # the config's engine (vLLM where the backend has no plan rule of its own: openai)
            rule = plan_kv_rule(cfg.backend, 16, 2048)
        except UserError:
            rule = plan_kv_rule("vllm", 16, 2048)
        try:
            seqs = {c: predict_sequence(shape, setup, dtype, c, rule) for c in PLAN_CONTEXTS}
        except ValueError:  # mixed precision across attention kinds: vLLM's pool is not modelled
            rule = plan_kv_rule("hf", 16, 2048)
            seqs = {c: predict_sequence(shape, setup, dtype, c, rule) for c in PLAN_CONTEXTS}
        weights = predict_weights_bytes(shape, setup, dtype)
        rows.append(
            KvPlanRow(
                setup=setup.name,
                kv_cache=setup.kv_cache,
                kv_keep=list(setup.kv_keep),
                kv_bytes_per_token=predict_kv_bytes_per_token(shape, setup, dtype),
                engine=rule.engine,
                sequence_bytes={c: q.total for c, q in seqs.items()},
                sequences={
                    c: kv_capacity(weights, q.total, cfg.budget.model_copy(update={"context_len": c})).max_concurrency
                    for c, q in seqs.items()
                },
            )
        )
    return rows
