"""The token-level KL and Δp distribution (llama.cpp's --kl-divergence figures), on arrays whose
answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from qeval.backends.base import RollingResult
from qeval.results.samples import SampleRecord
from qeval.tasks.divergence import TokenDivergence, delta_p, document_divergence, kl_top1


def test_quantiles_and_shares_over_every_token_of_every_document() -> None:
    t = TokenDivergence()
    t.add(np.arange(0, 500) / 1000, np.array([True] * 400 + [False] * 100), np.full(500, -0.01))
    t.add(np.arange(500, 1000) / 1000, np.array([True] * 500), np.full(500, 0.03))
    d = t.summary()
    assert d is not None and d["tokens"] == 1000
    assert d["kl_mean"] == pytest.approx(0.4995) and d["kl_max"] == pytest.approx(0.999)
    assert d["kl_median"] == pytest.approx(np.quantile(np.arange(1000) / 1000, 0.5))
    assert d["kl_p99_9"] == pytest.approx(np.quantile(np.arange(1000) / 1000, 0.999))
    assert d["same_top1"] == pytest.approx(0.9)
    assert d["dp_mean"] == pytest.approx(0.01) and d["dp_rms"] == pytest.approx(np.sqrt((0.01**2 + 0.03**2) / 2))
    assert d["dp_p1"] == pytest.approx(-0.01) and d["dp_p99"] == pytest.approx(0.03)


def test_a_reference_without_the_actual_tokens_gives_no_delta_p() -> None:
    t = TokenDivergence()
    t.add(np.array([0.1, 0.2]), np.array([True, True]), None)
    d = t.summary()
    assert d is not None and "dp_mean" not in d and d["kl_mean"] == pytest.approx(0.15)
    assert TokenDivergence().summary() is None


def test_delta_p_is_the_change_in_the_actual_tokens_probability() -> None:
    ref_idx = np.array([[1, 2], [3, 4]])
    ref_logp = np.log(np.array([[0.6, 0.3], [0.5, 0.4]]))
    ref_tok = np.log(np.array([0.6, 0.4]))  # the baseline's probability of the actual tokens
    res = RollingResult(
        token_logprobs=np.log(np.array([0.5, 0.6])),
        topk_indices=np.array([[1, 2], [4, 3]]),
        topk_logprobs=np.log(np.array([[0.5, 0.2], [0.6, 0.3]])),
        ref_logprobs=np.log(np.array([[0.5, 0.2], [0.3, 0.6]])),
    )
    assert delta_p((ref_idx, ref_logp, ref_tok), res) == pytest.approx([-0.1, 0.2])
    assert delta_p((ref_idx, ref_logp), res) is None
    kl, top1 = kl_top1((ref_idx, ref_logp, ref_tok), res)
    p = np.array([0.6, 0.3, 0.1])
    q = np.array([0.5, 0.2, 0.3])
    assert kl[0] == pytest.approx(float((p * np.log(p / q)).sum()))
    assert list(top1) == [True, False]

    rec = SampleRecord(sample_id="0", prompt="p", target=None, prediction=None, correct=None)
    tokens = TokenDivergence()
    got = document_divergence(rec, (ref_idx, ref_logp, ref_tok), res, tokens)
    assert got[0] == pytest.approx(kl) and list(got[1]) == [True, False]
    assert rec.kl == pytest.approx(float(kl.mean())) and rec.top1_agreement == 0.5 and rec.kl_tokens == 2
    d = tokens.summary()
    assert d is not None and d["tokens"] == 2 and d["dp_mean"] == pytest.approx(0.05)


def test_joining_the_held_arrays_changes_no_figure() -> None:
    """TokenDivergence joins its per-request arrays every COMPACT_EVERY; the summary over more
    than that must be the one over every token, untouched by where the joins fell."""
    from qeval.tasks import divergence

    rng = np.random.default_rng(3)
    n = divergence.COMPACT_EVERY * 2 + 37
    kls = [rng.exponential(0.05, size=rng.integers(1, 6)) for _ in range(n)]
    top1s = [rng.random(k.size) < 0.9 for k in kls]
    dps = [rng.normal(0, 0.02, size=k.size) for k in kls]
    acc = TokenDivergence()
    for kl, t, dp in zip(kls, top1s, dps, strict=True):
        acc.add(kl, t, dp)
    assert len(acc.kl) < divergence.COMPACT_EVERY  # it did join: what is held is bounded
    got = acc.summary()
    assert got is not None
    kl_all, dp_all = np.concatenate(kls), np.concatenate(dps)
    assert got["tokens"] == kl_all.size
    assert got["kl_p99_9"] == pytest.approx(float(np.quantile(kl_all, 0.999)))
    assert got["kl_max"] == pytest.approx(float(kl_all.max()))
    assert got["same_top1"] == pytest.approx(float(np.concatenate(top1s).mean()))
    assert got["dp_p1"] == pytest.approx(float(np.quantile(dp_all, 0.01)))
    assert got["dp_rms"] == pytest.approx(float(np.sqrt((dp_all**2).mean())))
