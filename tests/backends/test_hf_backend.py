"""The transformers backend on the shipped tiny model: scoring conventions and the
quantized-KV paths, checked against plain transformers calls in float32 (where the two
must agree to rounding)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qeval.backends.base import GenerateRequest, LoglikelihoodRequest, RollingRequest
from qeval.backends.hf.backend import HFBackend
from qeval.backends.tokens import rolling_windows as _rolling_windows
from qeval.config import ModelSpec, RunConfig
from qeval.config.run import ModelDtype
from qeval.config.setups import KVCache, Setup

REQS = [
    LoglikelihoodRequest("Largest of 37 82 15 64:", " 82"),
    LoglikelihoodRequest("12 + 30 =", " 42"),
    LoglikelihoodRequest("ISO code of France:", " FR"),
    LoglikelihoodRequest("ISO code of Zulu language: ", "zul"),
    LoglikelihoodRequest("7", "0 + 10 = 80"),
]
noop = lambda n: None  # noqa: E731


def _backend(model_path: Path, setup: Setup, dtype: ModelDtype = "float32", batch_size: int = 8) -> HFBackend:
    cfg = RunConfig(
        name="t",
        model=ModelSpec(path=str(model_path), dtype=dtype, max_context=256),
        setups=[setup],
        tasks=["x"],
        batch_size=batch_size,
    )
    b = HFBackend(cfg, setup, "cpu")
    b.load()
    return b


@pytest.fixture(scope="module")
def fp32(model_path: Path) -> HFBackend:
    return _backend(model_path, Setup(name="fp32"))


def _reference_logprob(b: HFBackend, context: str, continuation: str) -> float:
    """Plain transformers: one forward over BOS + context + continuation."""
    ctx = b.tok(context.rstrip(" ")).input_ids
    whole = b.tok(context + continuation).input_ids
    with torch.inference_mode():
        logp = torch.log_softmax(b.model(torch.tensor([whole])).logits[0].float(), -1)
    return float(sum(logp[i - 1, whole[i]] for i in range(len(ctx), len(whole))))


def test_loglikelihood_matches_plain_transformers(fp32: HFBackend) -> None:
    got = fp32.loglikelihood(REQS, noop)
    for req, res in zip(REQS, got, strict=True):
        assert res.logprob == pytest.approx(_reference_logprob(fp32, req.context, req.continuation), abs=1e-4)
    assert got[3].n_tokens == 4  # the trailing space moved into the continuation (lm-eval)


def test_shared_context_prefill_is_exact(fp32: HFBackend) -> None:
    """Four choices of one question share one prefill of the context: same scores as
    scoring each choice alone, to float32 rounding."""
    ctx = "Largest of 37 82 15 64:"
    reqs = [LoglikelihoodRequest(ctx, " " + c) for c in ("37", "82", "15", "64")]
    together = [r.logprob for r in fp32.loglikelihood(reqs, noop)]
    alone = [_reference_logprob(fp32, r.context, r.continuation) for r in reqs]
    np.testing.assert_allclose(together, alone, atol=1e-4)
    assert int(np.argmax(together)) == 1


@pytest.mark.parametrize("kv", [None, "int4"])
def test_continuation_top_k_and_reference_log_probs(model_path: Path, fp32: HFBackend, kv: KVCache | None) -> None:
    """Each scored continuation token carries the model's top-k and, asked with a reference's
    ids, the log-probs there: the baseline against its own top-k gives KL exactly 0, a quantized
    KV cache a positive KL; a reference of the wrong length is not used."""
    from qeval.tasks.divergence import as_rolling, kl_top1

    base = fp32.loglikelihood(REQS, noop)
    for res in base:
        assert res.topk_indices is not None and res.topk_indices.shape == (res.n_tokens, 16)
        assert res.token_logprobs is not None and res.token_logprobs.sum() == pytest.approx(res.logprob, abs=1e-5)
        assert res.ref_logprobs is None
    b = fp32 if kv is None else _backend(model_path, Setup(name="kv", kv_cache=kv))
    asked = [
        LoglikelihoodRequest(r.context, r.continuation, res.topk_indices) for r, res in zip(REQS, base, strict=True)
    ]
    assert base[1].topk_indices is not None
    wrong = LoglikelihoodRequest(REQS[0].context, REQS[0].continuation, base[1].topk_indices[:0])
    got = b.loglikelihood([*asked, wrong], noop)
    assert got[-1].ref_logprobs is None  # 0 rows for a 1-token continuation: no KL, never a wrong one
    kls = []
    for res, ref in zip(got, base, strict=False):
        rolled = as_rolling(res)
        assert rolled is not None and res.ref_logprobs is not None
        assert ref.topk_indices is not None and ref.topk_logprobs is not None
        kl, top1 = kl_top1((ref.topk_indices, ref.topk_logprobs), rolled)
        kls.append(kl)
    total = float(np.concatenate(kls).sum())
    if kv is None:
        assert total == pytest.approx(0.0, abs=1e-6)
    else:
        assert total > 1e-4


def test_batch_composition_does_not_change_scores(model_path: Path) -> None:
    kv = _backend(model_path, Setup(name="kv4", kv_cache="int4"), batch_size=8)
    together = [r.logprob for r in kv.loglikelihood(REQS, noop)]
    alone = [kv.loglikelihood([r], noop)[0].logprob for r in REQS]
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_quantized_kv_changes_scores_and_int2_more_than_int4(model_path: Path, fp32: HFBackend) -> None:
    base = np.array([r.logprob for r in fp32.loglikelihood(REQS, noop)])
    err = {}
    for bits in ("int4", "int2"):
        b = _backend(model_path, Setup(name=bits, kv_cache=bits))
        err[bits] = np.abs(np.array([r.logprob for r in b.loglikelihood(REQS, noop)]) - base).mean()
    assert 0 < err["int4"] < err["int2"]


def test_greedy_generation_matches_transformers_generate(fp32: HFBackend) -> None:
    prompts = ["12 + 30 =", "ISO code of France:", "Smallest of 23 32 38 87:", "55 + 57 ="]
    got = fp32.generate([GenerateRequest(p, ("\n",), 6) for p in prompts], noop)
    for p, g in zip(prompts, got, strict=True):
        enc = fp32.tok(p, return_tensors="pt")
        out = fp32.model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=fp32.tok.pad_token_id)
        ref = fp32.tok.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True).split("\n")[0]
        assert g == ref


def test_rolling_loglikelihood_matches_direct_sum(fp32: HFBackend) -> None:
    """Every token of the document is scored, the first one given the prefix token (BOS
    here), as lm-eval does: its tokenizer adds BOS, which is then scored given BOS too."""
    text = "ISO code of Ethiopia: ET\n91 + 85 = 176\nLargest of 79 61 84 48: 84"
    res = fp32.loglikelihood_rolling([RollingRequest(text)], noop)[0]
    ids = [fp32.tok.bos_token_id] + fp32.tok(text).input_ids
    with torch.inference_mode():
        logp = torch.log_softmax(fp32.model(torch.tensor([ids])).logits[0].float(), -1)
    direct = float(sum(logp[i - 1, ids[i]] for i in range(1, len(ids))))
    assert res.n_tokens == len(ids) - 1
    assert res.logprob == pytest.approx(direct, abs=1e-3)
    assert res.topk_indices.shape == (len(ids) - 1, 16)


def test_rolling_windows_cover_every_token_once() -> None:
    """lm-eval's windows: every token predicted once, the first from the prefix token."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = list(range(100, 137))
    for max_len in (1, 4, 8, 37, 64):
        windows = _rolling_windows(tokens, 7, max_len)
        preds = [t for _, p in windows for t in p]
        assert preds == tokens
        assert windows[0][0] == [7]
        for ctx, pred in windows:
            assert len(ctx) + len(pred) - 1 <= max_len
            assert ctx  # every prediction is conditioned on something
        reference = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 7, max_len, 1)]
        assert windows == [(list(c), list(p)) for c, p in reference]


def test_weight_quantization_shrinks_weights_as_predicted(model_path: Path) -> None:
    from qeval.memory.ledger import ModelShape, predict_weights_bytes

    shape = ModelShape.from_model_dir(model_path)
    setups = (Setup(name="bf16"), Setup(name="i8", weights="int8"), Setup(name="i4", weights="int4", group_size=128))
    for setup in setups:
        b = _backend(model_path, setup, dtype="bfloat16")
        measured = b.memory()["weights_bytes"].measured
        assert measured == pytest.approx(predict_weights_bytes(shape, setup, "bfloat16"), rel=0.02), setup.name


def test_fp8_kv_cache_runs_and_changes_scores(model_path: Path, fp32: HFBackend) -> None:
    base = np.array([r.logprob for r in fp32.loglikelihood(REQS, noop)])
    b = _backend(model_path, Setup(name="kv8", kv_cache="fp8"))
    got = np.array([r.logprob for r in b.loglikelihood(REQS, noop)])
    assert np.abs(got - base).max() > 0
    assert b.memory()["kv_bytes_per_token"].measured == 2 * 4 * 2 * 32  # 1 byte per element


def test_a_shared_prompt_prefix_is_run_once_and_scores_the_same(
    fp32: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few-shot prompts that share their examples (lm-eval's first_n sampler): the shared
    prefix is prefilled once; scores and generations equal those without sharing."""
    from qeval.backends.hf import backend as hf

    shots = "Largest of 37 82 15 64: 82\nSmallest of 23 32 38 87: 23\n12 + 30 = 42\n"
    reqs = [
        LoglikelihoodRequest(shots + q, " " + a)
        for q, a in [
            ("Largest of 11 95 40 22:", "95"),
            ("Largest of 11 95 40 22:", "40"),
            ("31 + 12 =", "43"),
            ("ISO code of France:", "FR"),
        ]
    ]
    gens = [GenerateRequest(shots + q, ("\n",), 6) for q in ("55 + 21 =", "Smallest of 50 41 77 63:")]
    calls: list[int] = []
    real = fp32.model.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["input_ids"].shape[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(fp32.model, "forward", spy)
    shared = [r.logprob for r in fp32.loglikelihood(reqs, noop)]
    # the shared prefix ran once (one call of its length), the questions' own tokens after it
    assert calls[0] >= len(shots) and calls[1] < 30, calls
    shared_gen = fp32.generate(gens, noop)
    monkeypatch.setattr(hf, "MIN_SHARED_PREFIX", 10**9)
    alone = [r.logprob for r in fp32.loglikelihood(reqs, noop)]
    np.testing.assert_allclose(shared, alone, atol=1e-4)
    assert fp32.generate(gens, noop) == shared_gen


def test_sub_batches_stay_within_the_logits_budget() -> None:
    """Second passes are grouped by like length at the least padded cost; with a budget no group
    pads past it (a row alone over it is its own pass), and every row is in exactly one group."""
    from qeval.backends.hf.backend import _sub_batches

    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(1, 41, size=64)]
    free = _sub_batches(lengths, 64)
    capped = _sub_batches(lengths, 64, max_tokens=200)
    for groups in (free, capped):
        assert sorted(i for g in groups for i in g) == list(range(64))
    assert max(len(g) * max(lengths[i] for i in g) for g in free) > 200  # the cap is what bounds it
    assert all(len(g) * max(lengths[i] for i in g) <= 200 for g in capped)
    assert _sub_batches([500, 3, 2], 64, max_tokens=100)[0] == [0]  # too long for the budget alone


def test_a_small_logits_budget_scores_the_same(fp32: HFBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capping the logits a pass returns splits the second pass into more passes; the scores are
    those of the uncapped passes, to float32 rounding."""
    from qeval.backends.hf import backend as hf

    ctx = "Largest of 37 82 15 64:"
    reqs = [LoglikelihoodRequest(ctx, c) for c in (" 82", " 37 is the largest", " 15, then 64", " 64 of them all")]
    passes: list[list[list[int]]] = []
    sub_batches = hf._sub_batches

    def recorded(*a: Any) -> list[list[int]]:
        passes.append(sub_batches(*a))
        return passes[-1]

    monkeypatch.setattr(hf, "_sub_batches", recorded)
    whole = fp32.loglikelihood(reqs, noop)
    assert len(passes[-1]) < 4
    monkeypatch.setattr(hf, "LOGITS_BUDGET_BYTES", 4 * fp32.model.config.vocab_size * 3)  # three positions a pass
    capped = fp32.loglikelihood(reqs, noop)
    assert len(passes[-1]) == 4  # each row over the budget alone: a pass each
    # float32 sums over padded and unpadded rows round differently: 3e-5 nats at -170 is 1.8e-7
    # relative, the float32 epsilon's order. The bound is the issue's own per-document 1e-4 nats.
    np.testing.assert_allclose([r.logprob for r in capped], [r.logprob for r in whole], atol=1e-4, rtol=0)
    assert [r.is_greedy for r in capped] == [r.is_greedy for r in whole]


def test_a_run_with_a_kv_setup_decodes_every_setup_from_the_cache(model_path: Path) -> None:
    """Where any setup of the config quantizes its KV cache, the baseline is decoded on the KV
    setups' path: all but the last prompt token prefilled, no prefix shared between rows, the
    last token fed from the cache; the resume key says so. Without one, the shorter path (the
    first token from the prefill's last position) and no key part. Both paths give transformers'
    own greedy tokens in float32; in bf16 they may part on a close call, which is why a run
    compares its setups on one path (hf/support.py decodes_from_cache)."""
    from qeval.backends.hf.support import FROM_CACHE, key_parts

    base = Setup(name="bf16", baseline=True)
    prompts = ["12 + 30 =", "12 + 31 =", "ISO code of France:", "55 + 57 ="]
    seen: dict[bool, list[tuple[list[list[int]], bool, bool]]] = {}
    outs = {}
    for with_kv in (False, True):
        cfg = RunConfig(
            name="t",
            model=ModelSpec(path=str(model_path), dtype="float32", max_context=256),
            setups=[base, Setup(name="kv4", kv_cache="int4")] if with_kv else [base],
            tasks=["x"],
        )
        assert key_parts(cfg) == (FROM_CACHE if with_kv else {})
        b = HFBackend(cfg, base, "cpu")
        b.load()
        calls = seen.setdefault(with_kv, [])
        real = b._prefill

        def spy(
            prefixes: list[list[int]], keep_last: bool = False, share: bool = True, real: Any = real, calls: Any = calls
        ) -> Any:
            calls.append((prefixes, keep_last, share))
            return real(prefixes, keep_last=keep_last, share=share)

        b._prefill = spy  # type: ignore[method-assign]
        outs[with_kv] = b.generate([GenerateRequest(p, ("\n",), 6) for p in prompts], noop)
    encoded = sorted((b.conv.prompt(p) for p in prompts), key=len, reverse=True)
    (short,), (cached,) = seen[False], seen[True]
    assert short[1:] == (True, True) and sorted(map(len, short[0])) == sorted(map(len, encoded))
    assert cached[1:] == (False, False) and sorted(map(len, cached[0])) == sorted(len(e) - 1 for e in encoded)
    assert outs[True] == outs[False]  # float32: one answer either way
