"""vLLM 0.32's TurboQuant KV caches, rounded in software as its CUDA store kernel rounds them.

Read from vLLM 0.32's source (vllm/model_executor/layers/quantization/turboquant/, its config and
centroids; vllm/v1/attention/backends/turboquant_attn.py; the store and decode kernels in
vllm/v1/attention/ops/), one token's head vector at a time:

- keys, 3 or 4 bits: rotated by the Sylvester Hadamard matrix H / sqrt(d) (no random signs, one
  for every layer and head), after dividing by their L2 norm; each coordinate replaced by the
  nearest centroid of a Lloyd-Max codebook for N(0, 1/d) (`lloyd_max`, ported as vLLM solves it);
  the norm kept in float16. With the norm correction (the `_nc` presets) the centroid vector is
  rescaled to unit length before the stored norm multiplies it. What attention reads back is
  fp16(norm) * (c @ H);
- keys, 8 bits (`k8v4`): cast to FP8 E4M3 without a scale (saturated at +-448 here; the Triton
  cast's overflow behaviour is not stated in vLLM's source);
- values: uniform over [min, max] of the head vector, 2^bits - 1 steps, rounded half up, read
  back with the float16 scale and zero point vLLM stores.

What differs from vLLM: the first prefill chunk on vLLM attends to its own K/V unrounded, while
the round-trip cache rounds a token's own K/V too (stricter, never more lenient: kv_cache.py
`round_trip_cache`); Triton's fp32 division and square root may differ by an ulp at a rounding
boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch

from qeval.config.setups import TURBOQUANT

_E4M3_MAX = 448.0


def _trapz(f: Callable[[float], float], a: float, b: float, n: int = 200) -> float:
    """vLLM's trapezoid rule (its centroids module's `_trapz`), kept step for step for the same float64 sums."""
    h = (b - a) / n
    total = 0.5 * (f(a) + f(b))
    for i in range(1, n):
        total += f(a + i * h)
    return total * h


@lru_cache(maxsize=16)
def lloyd_max(d: int, bits: int) -> torch.Tensor:
    """The 2^bits centroids vLLM 0.32 uses for a d-dimensional head (its centroids module's
    `solve_lloyd_max`: N(0, 1/d), starting evenly on +-3.5 sigma, outer edges at +-10.5 sigma, 200
    iterations at most, tolerance 1e-10), as float32, ascending."""
    levels, var = 2**bits, 1.0 / d
    sigma = math.sqrt(var)

    def pdf(x: float) -> float:
        return (1.0 / math.sqrt(2 * math.pi * var)) * math.exp(-x * x / (2 * var))

    lo, hi = -3.5 * sigma, 3.5 * sigma
    centroids = [lo + (hi - lo) * (i + 0.5) / levels for i in range(levels)]
    for _ in range(200):
        edges = [lo * 3] + [(centroids[i] + centroids[i + 1]) / 2.0 for i in range(levels - 1)] + [hi * 3]
        new = []
        for i in range(levels):
            a, b = edges[i], edges[i + 1]
            num, den = _trapz(lambda x: x * pdf(x), a, b), _trapz(pdf, a, b)
            new.append(num / den if den > 1e-15 else centroids[i])
        if max(abs(new[i] - centroids[i]) for i in range(levels)) < 1e-10:
            break
        centroids = new
    return torch.tensor(centroids, dtype=torch.float32)


@lru_cache(maxsize=8)
def hadamard(d: int) -> torch.Tensor:
    """H / sqrt(d) for a power-of-two d, float32 (`_build_hadamard_cached` of
    vllm/v1/attention/backends/turboquant_attn.py)."""
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def round_keys(k: torch.Tensor, kind: str) -> torch.Tensor:
    """Keys (..., head_dim) as a TurboQuant cache of `kind` gives them back to attention."""
    bits, _, correct = TURBOQUANT[kind]
    x = k.float()
    if bits == 8:
        return x.clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).float().to(k.dtype)
    d = x.shape[-1]
    h, c = hadamard(d).to(x.device), lloyd_max(d, bits).to(x.device)
    norm = x.norm(dim=-1, keepdim=True)
    y = (x / (norm + 1e-8)) @ h
    idx = torch.searchsorted((c[:-1] + c[1:]) / 2, y.contiguous(), right=True)  # y at a midpoint goes up
    chosen = c[idx]
    if correct:
        chosen = chosen / torch.sqrt((chosen * chosen).sum(dim=-1, keepdim=True) + 1e-16)
    return (norm.half().float() * (chosen @ h)).to(k.dtype)


def round_values(v: torch.Tensor, kind: str) -> torch.Tensor:
    """Values (..., head_dim) as a TurboQuant cache of `kind` gives them back: uniform over the head
    vector's [min, max], quantized with the float32 scale, read back with float16 scale and zero."""
    steps = 2 ** TURBOQUANT[kind][1] - 1
    x = v.float()
    lo = x.amin(dim=-1, keepdim=True)
    scale = ((x.amax(dim=-1, keepdim=True) - lo) / steps).clamp(min=1e-8)
    q = torch.floor((x - lo) / scale + 0.5).clamp(0, steps)
    return (q * scale.half().float() + lo.half().float()).to(v.dtype)
