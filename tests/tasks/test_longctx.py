"""Long-context tasks on the shipped character-level tokenizer and on SmolLM2's BPE
one: generated deterministically from their seed, sized to their length, each needle where
the task says (position in tokens, depth in the filler); lengths, buckets and gates resolved
as docs/tasks.md says."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qeval.config import ModelSpec, RunConfig
from qeval.config.budget import Budget
from qeval.config.gates import Gate
from qeval.config.long_context import LongContextSpec
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.results.samples import SampleRecord
from qeval.tasks.long_context import words
from qeval.tasks.long_context.buckets import bucket_sums
from qeval.tasks.long_context.kind import model_config_of
from qeval.tasks.long_context.results import position_buckets
from qeval.tasks.long_context.tasks import MAX_GEN, LongContextTask, build_tasks, load_tokenizer, plan, resolve_gates
from tests.helpers import MODEL, ROOT

SMOLLM2 = ROOT / "models" / "smollm2-135m"
# (model, lengths to generate at: the generators are checked past the tiny model's 256 tokens)
MODELS = [
    pytest.param(MODEL, [1024, 2048], id="qeval-tiny"),
    pytest.param(
        SMOLLM2,
        [1024, 4096],
        id="smollm2",
        marks=pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="make smollm2 first"),
    ),
]


@cache
def _tok(path: Path) -> Any:
    return load_tokenizer(str(path), None, False)


def _cfg(path: Path, max_context: int = 8192, budget: int = 4096, **lc: Any) -> RunConfig:
    return RunConfig(
        name="t",
        model=ModelSpec(path=str(path), max_context=max_context),
        setups=[Setup(name="b")],
        budget=Budget(context_len=budget),
        long_context=LongContextSpec(**lc),
    )


def _tasks(path: Path, lengths: list[int], seed: int = 7) -> dict[str, LongContextTask]:
    cfg = _cfg(path, lengths=lengths, seed=seed, samples=3, depths=[0.1, 0.5, 0.9])
    config = model_config_of(str(path)) | {"max_position_embeddings": 10**6}  # generation only: no model runs
    tok = _tok(path)
    return {t.name: t for t in build_tasks(cfg, config, lambda s: tok(s).input_ids)}


@pytest.mark.parametrize(("path", "lengths"), MODELS)
def test_generated_tasks_are_deterministic_under_their_seed(path: Path, lengths: list[int]) -> None:
    a, b, other = _tasks(path, lengths), _tasks(path, lengths), _tasks(path, lengths, seed=8)
    assert list(a) == [f"{f}_{n}" for f in ("passkey", "multikey", "position_ppl") for n in lengths]
    for name in a:
        assert a[name].docs == b[name].docs and a[name].sha256 == b[name].sha256
        assert a[name].fingerprint == b[name].fingerprint
        assert a[name].sha256 != other[name].sha256
        assert len({d["id"] for d in a[name].docs}) == 3


@pytest.mark.parametrize(("path", "lengths"), MODELS)
def test_every_document_fits_its_length(path: Path, lengths: list[int]) -> None:
    tok = _tok(path)
    for task in _tasks(path, lengths).values():
        room = task.length - MAX_GEN.get(task.family, 0)  # a prompt leaves room for its answer
        for doc in task.docs:
            n = len(tok(doc["text"]).input_ids)
            assert n <= room and n >= room - 64, (task.name, n, room)  # close to full: one sentence short at most


@pytest.mark.parametrize(("path", "lengths"), MODELS)
def test_the_passkey_sits_where_the_task_says(path: Path, lengths: list[int]) -> None:
    """At `needle_token` the encoded prompt holds the needle with this document's key, and the
    needle's depth in the filler, measured in tokens, is the configured depth."""
    tok = _tok(path)
    for length in lengths:
        task = _tasks(path, [length])[f"passkey_{length}"]
        for doc in task.docs:
            ids = tok(doc["text"]).input_ids
            at = doc["needle_token"]
            assert tok.decode(ids[at : at + 24]).strip().startswith(f"The pass key is {doc['answer']}.")
            assert doc["text"].count(doc["answer"]) == 2  # the needle says it twice, nothing else does
            needle = len(tok(words.PASSKEY_NEEDLE.format(key=doc["answer"])).input_ids)
            question = len(tok(" " + words.PASSKEY_QUESTION).input_ids)
            filler = len(ids) - doc["header_tokens"] - needle - question
            depth = (at - doc["header_tokens"]) / filler
            assert depth == pytest.approx(doc["depth"], abs=12 / filler + 0.01), (doc["id"], depth)


@pytest.mark.parametrize(("path", "lengths"), MODELS)
def test_the_asked_key_of_the_multikey_needle(path: Path, lengths: list[int]) -> None:
    tok = _tok(path)
    task = _tasks(path, lengths)[f"multikey_{lengths[-1]}"]
    for doc in task.docs:
        text = doc["text"]
        assert text.count("One of the special magic numbers for") == doc["keys"] == 4
        assert text.count(doc["answer"]) == 1 and text.endswith(f"for {doc['key']} mentioned in the provided text is")
        ids = tok(text).input_ids
        at = doc["needle_token"]
        assert tok.decode(ids[at : at + 60]).strip().startswith(f"One of the special magic numbers for {doc['key']}")
        # depth: the share of the prose (header, question and needles left out) before the asked needle
        body = text[len(words.MULTIKEY_HEADER) + 1 : text.rindex("\n")]
        needles = list(re.finditer(r"One of the special magic numbers for [a-z-]+ is: \d+\.", body))
        asked = next(m for m in needles if doc["key"] in m.group())
        before = asked.start() - sum(len(m.group()) for m in needles if m.start() < asked.start())
        prose = len(body) - sum(len(m.group()) for m in needles)
        assert before / prose == pytest.approx(doc["depth"], abs=0.05)


def test_lengths_default_to_quarter_half_and_budget_capped_at_the_model() -> None:
    config = model_config_of(str(MODEL))  # max_position_embeddings 256
    p = plan(_cfg(MODEL, max_context=256, budget=4096), config)
    assert p.lengths == [256] and p.deployment_length == 256
    p = plan(_cfg(MODEL, max_context=256, budget=256), config)
    assert (p.lengths, p.deployment_length, p.edges) == ([64, 128, 256], 256, [16, 64, 128, 256])
    big = {"max_position_embeddings": 8192}
    p = plan(_cfg(MODEL, max_context=8192, budget=8192), big)
    assert (p.lengths, p.edges) == ([2048, 4096, 8192], [512, 2048, 4096, 8192])  # 0-512, 512-2k, 2k-4k, 4k-8k
    with pytest.raises(UserError, match="more than this model scores"):
        plan(_cfg(MODEL, max_context=256, lengths=[512]), config)


def test_gates_at_a_length_resolve_to_one_task() -> None:
    cfg = _cfg(MODEL, max_context=8192, budget=8192, tasks=["passkey", "position_ppl"])
    p = plan(cfg, {"max_position_embeddings": 8192})
    gates = [
        Gate(task="passkey", length="budget", max_drop=0.01),
        Gate(task="all", length=2048, max_drop=0.02),
        Gate(task="position_ppl", max_drop=0.05),
        Gate(task="all", max_drop=0.02),
    ]
    got = [(g.task, g.length) for g in resolve_gates(gates, cfg, p)]
    assert got == [
        ("passkey_8192", 8192),
        ("passkey_2048", 2048),
        ("position_ppl_2048", 2048),
        ("position_ppl_8192", 8192),
        ("all", None),
    ]
    with pytest.raises(UserError, match="not one of long_context's lengths"):
        resolve_gates([Gate(task="passkey", length=1000, max_drop=0.01)], cfg, p)
    with pytest.raises(UserError, match="not a long-context task"):
        resolve_gates([Gate(task="multikey", length=2048, max_drop=0.01)], cfg, p)


def test_bucket_sums_partition_the_document() -> None:
    logp = -np.arange(1, 11, dtype=float)
    kl, top1 = np.full(10, 0.5), np.array([1, 0] * 5, dtype=bool)
    got = bucket_sums([0, 2, 6, 8], logp, kl, top1)  # tokens past the last edge join the last bucket
    assert [(b.start, b.end, b.tokens) for b in got] == [(0, 2, 2), (2, 6, 4), (6, 10, 4)]
    assert sum(b.nll for b in got) == pytest.approx(55) and sum(b.kl or 0.0 for b in got) == pytest.approx(5)
    assert sum(b.top1 or 0 for b in got) == 5


def test_position_buckets_pair_documents_bucket_by_bucket() -> None:
    def rec(i: int, nlls: list[float], kl: float | None = None) -> SampleRecord:
        b = [
            {"start": s, "end": e, "tokens": 10, "nll": n} | ({"kl": kl, "top1": 9} if kl is not None else {})
            for (s, e), n in zip([(0, 10), (10, 20)], nlls, strict=True)
        ]
        return SampleRecord.model_validate({"sample_id": f"d{i}", "buckets": b})

    base = [rec(0, [10, 20]), rec(1, [12, 22])]
    other = [rec(0, [11, 25], kl=0.5), rec(1, [12, 27], kl=1.5)]
    got = position_buckets(other, base, seed=1)
    assert [b.start for b in got] == [0, 10]
    assert got[0].delta == pytest.approx((23 - 22) / 20) and got[1].delta == pytest.approx((52 - 42) / 20)
    assert got[1].baseline_nll == pytest.approx(2.1) and got[1].kl == pytest.approx(0.1)
    assert got[1].top1_agreement == pytest.approx(0.9) and got[1].ci is not None


def test_position_buckets_pair_only_shared_documents() -> None:
    """A document the baseline lacks is left out of the pairing (not compared with nothing);
    without a baseline (the baseline's own block) a bucket has its NLL and no comparison; an
    empty bucket is left out."""

    def rec(i: str, nlls: list[float], tokens: list[int], kl: float | None = None) -> SampleRecord:
        b = [
            {"start": s, "end": e, "tokens": t, "nll": n} | ({"kl": kl, "top1": t} if kl is not None else {})
            for (s, e), n, t in zip([(0, 10), (10, 20)], nlls, tokens, strict=True)
        ]
        return SampleRecord.model_validate({"sample_id": i, "buckets": b})

    base = [rec("a", [10, 0], [10, 0]), rec("b", [20, 0], [10, 0])]
    other = [rec("a", [12, 0], [10, 0], kl=1.0), rec("b", [21, 0], [10, 0], kl=3.0), rec("c", [99, 0], [10, 0], kl=9.0)]
    got = position_buckets(other, base, seed=1)
    assert len(got) == 1 and got[0].documents == 2 and got[0].tokens == 20  # "c" unpaired, bucket 10-20 empty
    assert got[0].delta == pytest.approx(3 / 20) and got[0].kl == pytest.approx(4 / 20)
    delta, ci = got[0].delta, got[0].ci
    assert ci is not None and delta is not None and ci[0] <= delta <= ci[1]
    own = position_buckets(base, None, seed=1)
    assert own[0].nll == pytest.approx(1.5) and own[0].delta is None and own[0].kl is None
