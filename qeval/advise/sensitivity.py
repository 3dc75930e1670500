"""Per-unit sensitivity: KL(baseline || candidate) on the calibration slice.

The baseline's top-k log-probabilities (and its tail mass) are computed once; each candidate
is one forward pass over the slice with some linear layers swapped for their quantized
weights. The quantized weights are quanto's own (backends/hf/quant.py quantizes a copy of
the model, and each QLinear's weight is dequantized once): a QLinear computes exactly
`x @ dequantize(W)^T` for weight-only quantization (checked in tests/advise), so swapping
weight tensors reproduces the served model without re-quantizing per candidate."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from qeval.backends import backend_entry
from qeval.config.setups import Setup

TOP_K = 32
#: the backend whose models the advisor loads and probes in its own process (transformers')
ADVISOR_BACKEND = "hf"


@dataclass
class _Ref:
    idx: torch.Tensor  # [n_tokens, k] the baseline's top-k token ids
    logp: torch.Tensor  # [n_tokens, k] their log-probs
    tail: torch.Tensor  # [n_tokens] log of the baseline's mass outside the top k


class Scorer:
    """A loaded model scored against its baseline by KL on the calibration documents; what a
    candidate changes (weights swapped, a KV cache quantized per layer) is a subclass's `use`."""

    def __init__(self, model: Any, batch_size: int = 8) -> None:
        self.model = model
        self.batch_size = batch_size
        self._refs: dict[int, list[_Ref]] = {}
        self.passes = 0
        self.seconds = 0.0

    def use(self, quantized: set[str]) -> None:
        """Serve the units in `quantized` at the target precision and the rest at the model's."""
        raise NotImplementedError

    def _cache(self) -> Any:
        """A fresh KV cache for one batch's forward pass (None: the model's own)."""
        return None

    def _logprobs(self, docs: list[list[int]]) -> Iterable[torch.Tensor]:
        """Log-probs [len(doc) - 1, vocab] per document (each token predicted from the ones before)."""
        order = sorted(range(len(docs)), key=lambda i: -len(docs[i]))  # similar lengths share a batch
        out: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for s in range(0, len(order), self.batch_size):
                batch = [docs[i] for i in order[s : s + self.batch_size]]
                width = max(len(d) for d in batch)
                ids = torch.zeros(len(batch), width, dtype=torch.long)
                mask = torch.zeros(len(batch), width, dtype=torch.long)
                for r, d in enumerate(batch):  # right padding: a causal model's real tokens never see it
                    ids[r, : len(d)] = torch.tensor(d)
                    mask[r, : len(d)] = 1
                cache = self._cache()
                extra = {} if cache is None else {"past_key_values": cache, "use_cache": True}
                logits = self.model(input_ids=ids, attention_mask=mask, **extra).logits.float()
                for r, i in enumerate(order[s : s + self.batch_size]):
                    out[i] = torch.log_softmax(logits[r, : len(docs[i]) - 1], dim=-1)
        return [out[i] for i in range(len(docs))]

    def baseline(self, docs: list[list[int]]) -> None:
        """Cache the baseline's top-k distribution on `docs` (every unit at the model's precision)."""
        self.use(set())
        refs = []
        for lp in self._logprobs(docs):
            v, i = lp.topk(TOP_K, dim=-1)
            tail = torch.log1p(-v.exp().sum(-1).clamp(max=1 - 1e-7))
            refs.append(_Ref(i, v, tail))
        self._refs[id(docs)] = refs

    def kl(self, docs: list[list[int]], quantized: set[str]) -> np.ndarray:
        """Per document, mean KL(baseline || candidate) per token, on the baseline's top-k ids
        plus one tail bucket (as qeval/tasks/divergence.py's kl_top1: a lower bound of the full KL)."""
        refs = self._refs[id(docs)]
        start = time.perf_counter()
        self.use(quantized)
        out = []
        for ref, lp in zip(refs, self._logprobs(docs), strict=True):
            q = lp.gather(-1, ref.idx).double()
            p = ref.logp.double()
            q_tail = torch.log1p(-q.exp().sum(-1).clamp(max=1 - 1e-12))
            kl = (p.exp() * (p - q)).sum(-1) + ref.tail.double().exp() * (ref.tail.double() - q_tail)
            out.append(float(kl.clamp(min=0).mean()))
        self.use(set())
        self.passes += 1
        self.seconds += time.perf_counter() - start
        return np.array(out)


class Probe(Scorer):
    """A loaded model whose linear layers can be switched between the model's own weights
    and the target setup's quantized weights, and scored against the baseline by KL."""

    def __init__(self, model: Any, target: Setup, modules: Iterable[str], batch_size: int = 8) -> None:
        super().__init__(model, batch_size)
        named = dict(model.named_modules())
        self._layers = {n: named[n] for n in modules}
        self._orig = {n: m.weight.data for n, m in self._layers.items()}
        twin = copy.deepcopy(model)  # quantized once, as the hf backend would, then dequantized
        quantize = backend_entry(ADVISOR_BACKEND).quantize_weights
        assert quantize is not None  # the advisor's backend quantizes a loaded model's weights
        self.quant_info = quantize(twin, target)
        twin_named = dict(twin.named_modules())
        self._quant = {n: twin_named[n].qweight.dequantize().to(self._orig[n].dtype).detach() for n in self._layers}
        del twin

    def use(self, quantized: set[str]) -> None:
        """Serve the layers in `quantized` at the target precision and the rest at the model's."""
        for n, m in self._layers.items():
            m.weight.data = self._quant[n] if n in quantized else self._orig[n]
