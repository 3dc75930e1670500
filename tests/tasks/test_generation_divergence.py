"""Divergence along the generation (qeval/tasks/generation/teacher.py) on the tiny model: the
baseline's own generations teacher-forced through a setup identical to it give KL 0 and top-1
agreement 1 at every generated position; through a 2-bit KV cache they diverge."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from qeval.backends.base import GenerateRequest
from qeval.backends.hf.backend import HFBackend
from qeval.config import ModelSpec, RunConfig
from qeval.config.generation import GenerationDivergenceSpec
from qeval.config.setups import Setup
from qeval.results.samples import GeneratedPositionSums, SampleRecord
from qeval.tasks.generation.teacher import TEXTS_KEY, position_sums, teacher_forcing
from tests.helpers import sample_records

EDGES = [0, 4, 8, 16]
PROMPTS = ["12 + 30 = ", "Largest of 37 82 15 64: ", "ISO code of France: ", "7 + 8 = 1", "abc abd abe ab"]


def _cfg(model_path: Path, setups: list[Setup]) -> RunConfig:
    return RunConfig(
        name="t",
        model=ModelSpec(path=str(model_path), dtype="float32", max_context=256),
        setups=setups,
        tasks=["x"],
        batch_size=8,
        generation_divergence=GenerationDivergenceSpec(position_buckets=EDGES),
    )


def _backend(cfg: RunConfig, setup: Setup) -> HFBackend:
    b = HFBackend(cfg, setup, "cpu")
    b.load()
    return b


def _bar(label: str, total: int | None) -> Any:
    return nullcontext(SimpleNamespace(advance=lambda n: None))


def _forced(
    cfg: RunConfig, backend: HFBackend, records: list[SampleRecord], baseline: bool, ref: dict[str, np.ndarray] | None
) -> tuple[list[SampleRecord], Any]:
    stored: dict[str, Any] = {}
    result = SimpleNamespace(records=[r.model_copy(deep=True) for r in records], topk={}, metrics={})
    wrapped = teacher_forcing(
        lambda name, res, s, sha: stored.update(res=res), backend, cfg, baseline, lambda task: ref, _bar
    )
    wrapped("gen", result, 0.0, "sha")
    return stored["res"].records, stored["res"].topk


@pytest.fixture(scope="module")
def baseline_run(model_path: Path) -> tuple[RunConfig, list[SampleRecord], dict[str, np.ndarray]]:
    base = Setup(name="base", baseline=True)
    cfg = _cfg(model_path, [base, Setup(name="same"), Setup(name="kv2", kv_cache="int2")])
    b = _backend(cfg, base)
    outs = b.generate([GenerateRequest(p, ("\n",), 24) for p in PROMPTS], lambda n: None)
    records = sample_records(
        {"sample_id": str(i), "prompt": p, "raw_output": str(o), "correct": True}
        for i, (p, o) in enumerate(zip(PROMPTS, outs, strict=True))
    )
    records, topk = _forced(cfg, b, records, True, None)
    b.close()
    return cfg, records, topk


def test_baseline_keeps_its_top_k_and_texts(baseline_run: Any) -> None:
    cfg, records, topk = baseline_run
    scored = [r.teacher_forced for r in records if r.teacher_forced]
    assert len(scored) >= 4  # the tiny model writes something after most prompts
    assert topk["offsets"][-1] == sum(t.tokens for t in scored)
    assert topk["indices"].shape == (topk["offsets"][-1], 16)
    assert bytes(topk[TEXTS_KEY]).decode().count('"') > 0
    for r in records:  # one char, one token on this model: the generation's tokens are its characters
        if r.teacher_forced:
            assert r.teacher_forced.tokens == len(r.raw_output or "")
            assert r.teacher_forced.buckets[0].kl is None


def test_identical_setup_has_no_divergence_anywhere(baseline_run: Any, model_path: Path) -> None:
    cfg, records, topk = baseline_run
    b = _backend(cfg, Setup(name="same"))
    mine, _ = _forced(cfg, b, records, False, topk)
    b.close()
    buckets = [bk for r in mine if r.teacher_forced for bk in r.teacher_forced.buckets]
    assert len(buckets) >= 4 and {bk.start for bk in buckets} >= {0, 4}
    for bk in buckets:
        assert bk.kl == pytest.approx(0, abs=1e-5)
        assert bk.top1 == bk.tokens
    base_lp = {r.sample_id: r.teacher_forced.buckets for r in records if r.teacher_forced}
    for r in mine:
        if r.teacher_forced:
            assert [bk.logprob for bk in r.teacher_forced.buckets] == pytest.approx(
                [bk.logprob for bk in base_lp[r.sample_id]], abs=1e-4
            )


def test_two_bit_kv_cache_diverges(baseline_run: Any) -> None:
    cfg, records, topk = baseline_run
    b = _backend(cfg, Setup(name="kv2", kv_cache="int2"))
    mine, _ = _forced(cfg, b, records, False, topk)
    b.close()
    kl = sum(bk.kl or 0.0 for r in mine if r.teacher_forced for bk in r.teacher_forced.buckets)
    tokens = sum(r.teacher_forced.tokens for r in mine if r.teacher_forced)
    assert tokens > 0 and kl / tokens > 1e-3


def test_position_sums_buckets() -> None:
    lp = -np.arange(10, dtype=float)
    out = position_sums([0, 4, 8, 16], lp, np.ones(10), np.ones(10, dtype=bool))
    assert [(b.start, b.end, b.tokens) for b in out] == [(0, 4, 4), (4, 8, 4), (8, 16, 2)]
    assert out[2].logprob == -17 and out[2].kl == 2
    short = position_sums([0, 4], lp[:3], None, None)
    assert short == [GeneratedPositionSums(start=0, end=4, tokens=3, logprob=-3.0)]
    assert short[0].model_dump(exclude_unset=True) == {"start": 0, "end": 4, "tokens": 3, "logprob": -3.0}


def _rec(sid: str, correct: bool, buckets: list[dict[str, Any]] | None) -> SampleRecord:
    tokens = sum(b["tokens"] for b in buckets or [])
    row: dict[str, Any] = {"sample_id": sid, "correct": correct}
    if buckets:
        row["teacher_forced"] = {"tokens": tokens, "buckets": buckets}
    return SampleRecord.model_validate(row)


def test_tables_pair_documents_by_bucket() -> None:
    from qeval.tasks.generation.results import length_table, position_table

    base = [
        _rec(
            str(i),
            True,
            [
                {"start": 0, "end": 4, "tokens": 4, "logprob": -0.4},
                {"start": 4, "end": None, "tokens": i + 1, "logprob": -0.1 * (i + 1)},
            ],
        )
        for i in range(8)
    ] + [_rec("short", False, [{"start": 0, "end": 4, "tokens": 2, "logprob": -0.2}])]
    mine = [
        _rec(
            r.sample_id,
            r.sample_id not in {"6", "7"},
            [
                b.model_dump(exclude_unset=True)
                | {"logprob": 2 * b.logprob, "kl": 0.5 * b.tokens, "top1": b.tokens - 1}
                for b in (r.teacher_forced.buckets if r.teacher_forced else [])
            ],
        )
        for r in base
    ]
    pos = position_table(mine, base, 1)
    assert [(b.start, b.end, b.documents) for b in pos] == [(0, 4, 9), (4, None, 8)]
    assert pos[0].kl == pytest.approx(0.5) and pos[0].tokens == 34
    assert pos[0].delta == pytest.approx(0.1) and pos[0].ci is not None and pos[0].ci[0] <= 0.1 <= pos[0].ci[1]
    assert position_table(base, None, 1)[0].kl is None
    lengths = length_table(mine, base, [0, 8], True, 1)
    # the baseline's answer lengths: 5..12 tokens and "short" 2
    assert [(b.start, b.end, b.documents) for b in lengths] == [(0, 8, 4), (8, None, 5)]
    assert lengths[1].accuracy == pytest.approx(0.6) and lengths[1].baseline_accuracy == 1
    assert lengths[1].delta == pytest.approx(-0.4) and lengths[0].delta == pytest.approx(0.25)
    assert lengths[1].p_value is not None and lengths[1].ci is not None


def test_unset_block_leaves_keys_and_config_hash_alone(model_path: Path) -> None:
    from qeval.records.keys import _teacher_part

    plain = RunConfig(name="t", model=ModelSpec(path=str(model_path)), setups=[Setup(name="a")], tasks=["x"])
    task = SimpleNamespace(output_type="generate_until")
    assert _teacher_part(plain, task) == {} and "generation_divergence" not in plain.as_json()
    on = plain.model_copy(update={"generation_divergence": GenerationDivergenceSpec()})
    assert _teacher_part(on, task) and _teacher_part(on, SimpleNamespace(output_type="multiple_choice")) == {}
    assert on.config_hash() != plain.config_hash()


def test_position_and_turn_gates_feed_the_recommendation() -> None:
    """A setup failing (or inconclusive at) a gate at a generated position or at a turn is not
    recommended, with one line saying which gate; the candidate check says so too."""
    from qeval.analysis.comparison import Paired, compare
    from qeval.analysis.recommend import candidate_problem, recommend
    from qeval.config.gates import Gate
    from qeval.results.generation import GeneratedPositionBucket, GenerationDivergence, TaskGeneration
    from qeval.results.schema import read_results
    from tests.helpers import ROOT

    results = read_results(ROOT / "tests" / "data" / "run-v1" / "results.json")
    assert recommend(results).setup == "int4"  # the stored run, no such gates

    def bucket(verdict: str | None, ci: tuple[float, float]) -> GeneratedPositionBucket:
        return GeneratedPositionBucket(
            start=64,
            end=128,
            documents=40,
            tokens=2000,
            nll=1.3,
            baseline_nll=1.1,
            delta=0.2,
            ci=ci,
            ci_method="t",
            max_drop=0.05,
            verdict=verdict,
        )

    def with_bucket(b: GeneratedPositionBucket) -> Any:
        block = GenerationDivergence(
            position_buckets=[0, 64, 128],
            length_buckets=[0],
            tasks=["gsm8k"],
            setups={"int4": {"gsm8k": TaskGeneration(positions=[b])}},
        )
        return results.model_copy(update={"generation_divergence": block})

    failing = with_bucket(bucket("fail", (0.12, 0.28)))
    rec = recommend(failing)
    assert rec.setup == "int8" and "int4" not in rec.candidates
    assert rec.reasons["int4"] == (
        "int4: gsm8k generated positions 64-128 Δ NLL +0.200 nats/token [+0.120, +0.280], "
        "fails the 0.05 nats/token gate at position 64"
    )
    problem = candidate_problem(
        failing.model_copy(
            update={"recommendation": rec, "config": failing.config.model_copy(update={"candidate": "int4"})}
        )
    )
    assert problem is not None and "gsm8k at position 64: fail" in problem
    unsure = recommend(with_bucket(bucket("inconclusive", (-0.01, 0.3))))
    assert (
        unsure.setup == "int8"
        and "inconclusive against the 0.05 nats/token gate at position 64" in unsure.reasons["int4"]
    )
    assert recommend(with_bucket(bucket("pass", (0.0, 0.03)))).setup == "int4"
    # a turn gate is a gate on that turn's task: its failure excludes the setup and the reason names the turn
    gate = Gate(task="multi_turn_t6", turn=6, max_drop=0.02)
    c = compare(Paired("acc", np.ones(60), np.r_[np.ones(30), np.zeros(30)]), "multi_turn_t6", 0, [gate])
    assert c.verdict == "fail"
    int4 = results.setup("int4")
    turned = results.model_copy(
        update={
            "setups": [
                s
                if s.name != "int4"
                else int4.model_copy(update={"vs_baseline": int4.vs_baseline | {"multi_turn_t6": c}})
                for s in results.setups
            ]
        }
    )
    rec = recommend(turned)
    assert (
        rec.setup == "int8"
        and rec.reasons["int4"].startswith("int4: multi_turn_t6 -50.0 pts")
        and rec.reasons["int4"].endswith("fails the 2 pt gate at turn 6")
    )
