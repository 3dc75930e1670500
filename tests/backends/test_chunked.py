"""The long-sequence path of the transformers backend (qeval/backends/hf/chunked.py) on the
shipped model: chunked prefill gives the numbers of one whole pass, under an unquantized KV
cache and under the round-trip cache alike, and chunked greedy decoding the same tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qeval.backends.base import GenerateRequest, RollingRequest
from qeval.backends.hf.backend import HFBackend
from qeval.config import ModelSpec, RunConfig
from qeval.config.long_context import LongContextSpec
from qeval.config.setups import Setup

TEXT = (
    "Alice Marsh was a baker from Thornbury, 34 years old, who owned a red lantern. Everyone in Thornbury "
    "knew that Alice Marsh the baker never lent the red lantern to anyone. 12 + 30 = 42"
)
noop = lambda n: None  # noqa: E731


def _backend(model_path: Path, setup: Setup, chunk: int | None) -> HFBackend:
    lc = LongContextSpec(chunk_tokens=chunk) if chunk else None
    cfg = RunConfig(
        name="t",
        model=ModelSpec(path=str(model_path), dtype="float32", max_context=256),
        setups=[setup],
        tasks=["x"],
        batch_size=4,
        long_context=lc,
    )
    b = HFBackend(cfg, setup, "cpu")
    b.load()
    return b


@pytest.mark.parametrize("kv", ["auto", "int4", "int2"])
def test_chunked_scoring_equals_one_pass(model_path: Path, kv: str) -> None:
    """16-token chunks through one cache: the same per-token log-probs, top-k and KL inputs as
    one forward pass over the window (the round-trip cache quantizes each head vector on its
    own). Not FP8: its per-tensor scale is set by the first update (the first chunk), as in
    transformers' Fp8QuantizedLayer under a chunked prefill."""
    setup = Setup(name="s", kv_cache=kv)  # type: ignore[arg-type]
    whole, chunked = _backend(model_path, setup, None), _backend(model_path, setup, 16)
    ref = np.tile(np.arange(16, dtype=np.int64), (len(whole.tok(TEXT).input_ids), 1))
    a = whole.loglikelihood_rolling([RollingRequest(TEXT, ref)], noop)[0]
    b = chunked.loglikelihood_rolling([RollingRequest(TEXT, ref)], noop)[0]
    assert a.n_tokens == b.n_tokens > 16 * 5
    np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=1e-4)
    np.testing.assert_allclose(a.ref_logprobs, b.ref_logprobs, atol=1e-4)  # type: ignore[arg-type]
    assert (a.topk_indices[:, 0] == b.topk_indices[:, 0]).mean() > 0.99


@pytest.mark.parametrize("kv", ["int2", "fp8"])
def test_quantized_kv_still_changes_chunked_scores(model_path: Path, kv: str) -> None:
    base = _backend(model_path, Setup(name="b"), 16).loglikelihood_rolling([RollingRequest(TEXT)], noop)[0]
    setup = Setup(name="k", kv_cache=kv)  # type: ignore[arg-type]
    got = _backend(model_path, setup, 16).loglikelihood_rolling([RollingRequest(TEXT)], noop)[0]
    assert np.abs(base.token_logprobs - got.token_logprobs).max() > 1e-3


def test_chunked_generation_equals_batched(model_path: Path) -> None:
    """A prompt longer than the chunk is decoded alone from a chunked prefill: the same text as
    the batched path, unquantized; under an INT4 cache it runs and is deterministic."""
    reqs = [GenerateRequest(TEXT[:150] + " 55 + 21 =", ("\n",), 6), GenerateRequest("12 + 30 =", ("\n",), 6)]
    whole = _backend(model_path, Setup(name="b"), None).generate(reqs, noop)
    assert _backend(model_path, Setup(name="b"), 32).generate(reqs, noop) == whole
    kv = _backend(model_path, Setup(name="k", kv_cache="int4"), 32)
    assert kv.generate(reqs, noop) == kv.generate(reqs, noop)
