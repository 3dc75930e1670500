"""The units the advisor measures and keeps: a decoder block's attention projections or its
MLP (the cells of the layer x module-type heatmap), and their unions by block and by type.

Embeddings and lm_head are not candidates: qeval's weight quantization keeps them at the
model's dtype already (backends/hf/quant.py), so quantizing "only" them changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

from qeval.config.setups import Setup
from qeval.memory.ledger import _DTYPE_BITS, linear_weights_bytes
from qeval.model.shape import ModelShape

#: module type -> the linear layers of one decoder block it covers (Llama-family names)
KINDS: dict[str, tuple[str, ...]] = {
    "attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
}
_PREFIX = {"attn": "self_attn", "mlp": "mlp"}


@dataclass(frozen=True)
class Unit:
    """A set of linear layers kept or quantized together. `layer` None: a union over layers."""

    name: str  # "L3.attn", "L3" (a block), "attn" (a type over all blocks)
    layer: int | None
    kind: str | None  # "attn" / "mlp"; None for a whole block
    modules: tuple[str, ...]
    extra_bytes: int  # what keeping it at the model dtype adds to the quantized setup's weights

    def keep_patterns(self) -> list[str]:
        """The `keep:` patterns that name this unit's layers (whole fused groups, vLLM-safe)."""
        layers = [self.layer] if self.layer is not None else None
        kinds = [self.kind] if self.kind else list(KINDS)
        if layers is None:
            return [f"*.{_PREFIX[k]}.*" for k in kinds]
        return [f"model.layers.{i}.{_PREFIX[k]}.*" for i in layers for k in kinds]


def cells(shape: ModelShape, target: Setup, dtype: str) -> list[Unit]:
    """One unit per (layer, module type), in layer order."""
    sizes = {name: (o, i) for name, o, i in shape.linear_modules()}
    bits = _DTYPE_BITS[dtype]
    out = []
    for layer in range(shape.num_layers):
        for kind, names in KINDS.items():
            modules = tuple(f"model.layers.{layer}.{n}" for n in names)
            extra = sum(
                sizes[m][0] * sizes[m][1] * bits // 8 - linear_weights_bytes(*sizes[m], target, dtype) for m in modules
            )
            out.append(Unit(f"L{layer}.{kind}", layer, kind, modules, extra))
    return out


def unions(cell_units: list[Unit]) -> list[Unit]:
    """The coarser units: each decoder block, and each module type over all blocks."""
    out = []
    for layer in sorted({c.layer for c in cell_units if c.layer is not None}):
        part = [c for c in cell_units if c.layer == layer]
        out.append(Unit(f"L{layer}", layer, None, sum((c.modules for c in part), ()), sum(c.extra_bytes for c in part)))
    for kind in KINDS:
        part = [c for c in cell_units if c.kind == kind]
        out.append(Unit(kind, None, kind, sum((c.modules for c in part), ()), sum(c.extra_bytes for c in part)))
    return out
