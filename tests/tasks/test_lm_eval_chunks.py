"""lm-eval tasks scored in document chunks (qeval/tasks/lm_eval/scoring.py, CHUNK_DOCS) give what
one `evaluate()` call over every document gives: the same prompts (the few-shot sampler carries
on from chunk to chunk instead of being re-seeded), the same per-document scores and metrics
(aggregated once, by lm-eval's own aggregation, over every chunk), the same top-k reference and
the same KL distribution against the baseline. Real parts: SmolLM2 on the transformers backend,
lm-eval's own task YAMLs on the offline fixtures; chunks of 4 documents, so that the last chunk
is short and tasks of different sizes drop out of the calls at different chunks. The chunked runs
keep their records and top-k in spools on disk, as the worker's do (qeval/records/spool.py)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qeval.results.samples import SampleRecord
from tests.helpers import ROOT, TASKS, make_config, seq_plan

pytestmark = pytest.mark.slow
SMOLLM2 = ROOT / "models" / "smollm2-135m"
#: multiple choice with random few-shot (the sampler's state matters), perplexity, generation
ENTRIES: list[dict[str, Any]] = [
    {"name": "arc_easy_local", "num_fewshot": 3, "limit": 10},
    {"name": "wikitext_local", "limit": 6},
    {"name": "gsm8k_local", "num_fewshot": 1, "limit": 3, "max_gen_toks": 12},
]
CHUNK, WHOLE = 4, 10_000


@pytest.fixture(scope="module")
def score(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(chunk_docs, references) -> score_lm_eval's results for every entry, on one loaded backend."""
    from qeval.backends.hf.backend import HFBackend
    from qeval.config import load_config
    from qeval.tasks.lm_eval.kind import _session
    from qeval.tasks.lm_eval.scoring import score_lm_eval

    assert (SMOLLM2 / ".prepared").is_file(), "run `make smollm2` (make test does)"
    path = make_config(
        tmp_path_factory.mktemp("cfg"),
        model={"path": str(SMOLLM2), "dtype": "float32", "max_context": 2048},
        setups=[{"name": "base", "baseline": True}],
        tasks=None,
        gates=None,
        batch_size=8,
        lm_eval={"include_path": [str(TASKS / "lm_eval")], "tasks": ENTRIES},
    )
    cfg = load_config(path)
    backend = HFBackend(cfg, cfg.baseline, "cpu")
    backend.load()

    def run(
        chunk_docs: int,
        references: dict[str, Any] | None = None,
        names: list[str] | None = None,
        scratch: Path | None = None,
        keep_topk: bool = True,
        resume_keys: dict[str, str] | None = None,
        wrap: Any = None,
        progress: Any = None,
        order: dict[str, list[list[int]]] | None = None,
        stop: Any = None,
        until: dict[str, int] | None = None,
        together: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        session = _session(cfg)
        try:
            return score_lm_eval(
                wrap(backend) if wrap else backend,
                session,
                names or list(session.infos),
                progress or (lambda n: None),
                references,
                chunk_docs=chunk_docs,
                scratch=scratch,
                keep_topk=keep_topk,
                resume_keys=resume_keys,
                order=order,
                stop=stop,
                until=until,
                together=together,
            )
        finally:
            session.close()

    yield run
    backend.close()


@pytest.fixture(scope="module")
def whole(score: Any) -> dict[str, Any]:
    """Every entry in one evaluate() call: the reference the chunked runs are held to."""
    return score(WHOLE)


def _unspooled(result: Any) -> tuple[list[SampleRecord], dict[str, np.ndarray]]:
    """A result's records and top-k read back from its spools (the store's forms of them)."""
    from qeval.records.spool import RecordSpool, TopkSpool

    assert isinstance(result.records, RecordSpool), type(result.records)
    topk = result.topk
    if isinstance(topk, TopkSpool):
        buf = io.BytesIO()
        topk.write_npz(buf)
        buf.seek(0)
        with np.load(buf) as z:
            topk = {k: z[k] for k in z.files}
    return list(result.records), topk


def _same_records(one: list[SampleRecord], chunked: list[SampleRecord]) -> None:
    assert [r.doc_id for r in chunked] == [r.doc_id for r in one] == list(range(len(one)))
    for a, b in zip(one, chunked, strict=True):
        assert b.prompt == a.prompt and b.prompt_hash == a.prompt_hash, a.doc_id
        assert b.prediction == a.prediction and b.correct == a.correct, a.doc_id
        assert b.n_tokens == a.n_tokens
        for key in ("loglikelihoods", "nll", "kl"):
            if getattr(a, key) is not None:  # batches differ between the two: float32 rounding only
                assert np.allclose(getattr(b, key), getattr(a, key), atol=1e-4, rtol=0), (key, a.doc_id)
        am, bm = a.metrics or {}, b.metrics or {}
        assert bm.keys() == am.keys()
        assert np.allclose([bm[k] for k in am], list(am.values()), atol=1e-4)


def _same_metrics(one: dict[str, Any], chunked: dict[str, Any]) -> None:
    assert chunked.keys() == one.keys() and one
    for name, m in one.items():
        assert chunked[name]["value"] == pytest.approx(m["value"], rel=1e-4, abs=1e-6), name
        assert (chunked[name]["stderr"] is None) == (m["stderr"] is None), name


def test_chunks_score_as_one_call(score: Any, whole: dict[str, Any], tmp_path: Path) -> None:
    one, chunked = whole, score(CHUNK, scratch=tmp_path / "scratch")
    assert one.keys() == chunked.keys() == {e["name"] for e in ENTRIES}
    for name, entry in ((e["name"], e) for e in ENTRIES):
        a = one[name]
        records, topk = _unspooled(chunked[name])
        assert len(a.records) == len(records) == len(chunked[name].records) == entry["limit"], name
        _same_records(a.records, records)
        _same_metrics(a.metrics, chunked[name].metrics)
        assert a.topk.keys() == topk.keys()
        if a.topk:
            assert np.array_equal(a.topk["offsets"], topk["offsets"]), name
            assert np.array_equal(a.topk["indices"][:, 0], topk["indices"][:, 0]), name
            assert np.allclose(a.topk["token_logprobs"], topk["token_logprobs"], atol=1e-4), name
    # the few-shot examples vary by document: a sampler re-seeded per chunk would repeat chunk 1's
    arc = [r.prompt for r in one["arc_easy_local"].records]
    assert arc[CHUNK] != arc[0] and len(set(arc)) == len(arc)
    assert next(iter(one["gsm8k_local"].records)).raw_output is not None  # the generation task ran
    assert "bits_per_byte" in one["wikitext_local"].metrics and "acc" in one["arc_easy_local"].metrics


def test_chunks_keep_the_kl_reference_request_by_request(score: Any, whole: dict[str, Any], tmp_path: Path) -> None:
    """The baseline's top-k handed out chunk by chunk: each request against its own reference,
    so the KL of a model against itself is ~0 on every token (a shifted reference is not)."""
    refs = {n: r.topk for n, r in whole.items() if r.topk}
    assert set(refs) == {"arc_easy_local", "wikitext_local"}
    from qeval.records.spool import TopkReader

    one = score(WHOLE, refs, list(refs))
    for name, ref in refs.items():
        np.savez_compressed(tmp_path / f"{name}.npz", **ref)
    readers = {name: TopkReader(tmp_path / f"{name}.npz") for name in refs}  # read chunk by chunk, as a setup does
    chunked = score(CHUNK, readers, list(refs), scratch=tmp_path / "scratch", keep_topk=False)
    for reader in readers.values():
        reader.close()
    for name in refs:
        a, b = one[name].kl_distribution, chunked[name].kl_distribution
        assert a is not None and b is not None and a["tokens"] == b["tokens"] > 0, name
        assert b["kl_max"] < 1e-3 and b["same_top1"] == 1.0, (name, b)
        assert b["kl_mean"] == pytest.approx(a["kl_mean"], abs=1e-5)
        records, topk = _unspooled(chunked[name])
        assert topk == {}, name  # not the baseline: nothing kept
        assert all(r.kl is not None for r in records)
        _same_records(one[name].records, records)


class _Interrupted(Exception):
    pass


class _Watched:
    """The backend, its calls counted (request type, number of requests); the call numbered
    `fail_at` raises instead, as a worker killed there would stop."""

    def __init__(self, backend: Any, fail_at: int | None = None) -> None:
        self.backend, self.fail_at = backend, fail_at
        self.calls: list[tuple[str, int]] = []

    def _call(self, kind: str, requests: list[Any], progress: Any) -> Any:
        if self.fail_at is not None and len(self.calls) + 1 == self.fail_at:
            raise _Interrupted(kind)
        self.calls.append((kind, len(requests)))
        return getattr(self.backend, kind)(requests, progress)

    def loglikelihood(self, requests: list[Any], progress: Any) -> Any:
        return self._call("loglikelihood", requests, progress)

    def loglikelihood_rolling(self, requests: list[Any], progress: Any) -> Any:
        return self._call("loglikelihood_rolling", requests, progress)

    def generate(self, requests: list[Any], progress: Any) -> Any:
        return self._call("generate", requests, progress)


def _wrap(watched: _Watched, fail_at: int | None = None) -> Callable[[Any], _Watched]:
    """score()'s `wrap=`: `watched` takes the backend it is given, failing at call `fail_at`."""

    def wrap(backend: Any) -> _Watched:
        watched.backend, watched.fail_at = backend, fail_at
        return watched

    return wrap


def test_an_interrupted_scoring_carries_on_from_its_last_chunk(
    score: Any, whole: dict[str, Any], tmp_path: Path
) -> None:
    """Stopped in its third chunk, a scoring under the same resume keys scores only that chunk
    again, and ends where one uninterrupted call ends: records, metrics, top-k, the KL against
    the baseline's reference (read through to where the stop left it) and the progress bar."""
    from qeval.records.spool import TopkReader

    refs = {n: r.topk for n, r in whole.items() if r.topk}
    for name, ref in refs.items():
        np.savez_compressed(tmp_path / f"{name}.npz", **ref)
    scratch, keys = tmp_path / "scratch", {e["name"]: f"key-{e['name']}" for e in ENTRIES}

    def readers() -> dict[str, TopkReader]:
        return {name: TopkReader(tmp_path / f"{name}.npz") for name in refs}

    # chunk 0 (documents 0-3): all three request types; chunk 1 (4-7): arc and wikitext; chunk 2: arc
    first = _Watched(None)
    opened = readers()
    with pytest.raises(_Interrupted):
        score(CHUNK, opened, scratch=scratch, resume_keys=keys, wrap=_wrap(first, fail_at=6))
    for r in opened.values():
        r.close()
    assert [k for k, _ in first.calls] == [
        "loglikelihood",
        "loglikelihood_rolling",
        "generate",
        "loglikelihood",
        "loglikelihood_rolling",
    ]
    assert list(scratch.glob("*.state.npz")), "no state saved after the finished chunks"

    again = _Watched(None)
    advanced: list[int] = []
    opened = readers()
    resumed = score(CHUNK, opened, scratch=scratch, resume_keys=keys, progress=advanced.append, wrap=_wrap(again))
    for r in opened.values():
        r.close()
    # only the third chunk's arc documents were scored again
    arc = whole["arc_easy_local"].records
    assert again.calls == [("loglikelihood", sum(len(r.loglikelihoods) for r in arc[2 * CHUNK :]))]
    # the bar ends full: the saved chunks' requests counted once on resume, the rest as scored
    assert sum(advanced) == sum(len(r.loglikelihoods) for r in arc) + sum(
        e["limit"] for e in ENTRIES if e["name"] != "arc_easy_local"
    )
    for entry in ENTRIES:
        name = entry["name"]
        a = whole[name]
        records, topk = _unspooled(resumed[name])
        assert len(records) == entry["limit"], name
        _same_records(a.records, records)
        _same_metrics(a.metrics, resumed[name].metrics)
        assert a.topk.keys() == topk.keys(), name
        if a.topk:
            assert np.array_equal(a.topk["offsets"], topk["offsets"]), name
            assert np.allclose(a.topk["token_logprobs"], topk["token_logprobs"], atol=1e-4), name
            kl = resumed[name].kl_distribution
            assert kl is not None and kl["tokens"] == len(a.topk["indices"]), (name, kl)
            assert kl["kl_max"] < 1e-3 and kl["same_top1"] == 1.0, (name, kl)  # each token against its own reference
    prompts = [r.prompt for r in _unspooled(resumed["arc_easy_local"])[0]]
    assert prompts == [r.prompt for r in arc]  # the few-shot sampler carried on where it stopped


def test_a_damaged_state_is_scored_again_from_the_first_document(
    score: Any, whole: dict[str, Any], tmp_path: Path
) -> None:
    """A state that reads but cannot be taken up (here: its top-k spool's files listed wrongly)
    is no state: every chunk is scored again, with the samplers seeded as new."""
    from qeval.records.spool import load_state, save_state

    scratch, keys = tmp_path / "scratch", {e["name"]: f"key-{e['name']}" for e in ENTRIES}
    first = _Watched(None)
    with pytest.raises(_Interrupted):
        score(CHUNK, scratch=scratch, resume_keys=keys, wrap=_wrap(first, fail_at=4))
    (state,) = scratch.glob("*.state.npz")
    name = state.name.removesuffix(".state.npz")
    meta, arrays = load_state(scratch, name) or ({}, {})
    for leaf in meta["leaves"]:
        if leaf.get("topk"):
            leaf["topk"]["arrays"] = ["not", "a", "mapping"]
    save_state(scratch, name, meta, arrays, [])
    again = _Watched(None)
    out = score(CHUNK, scratch=scratch, resume_keys=keys, wrap=_wrap(again))
    assert [k for k, _ in again.calls][:3] == ["loglikelihood", "loglikelihood_rolling", "generate"]
    records, _ = _unspooled(out["arc_easy_local"])
    _same_records(whole["arc_easy_local"].records, records)


def test_a_killed_sequential_scoring_resumes_at_its_last_look(
    score: Any, whole: dict[str, Any], tmp_path: Path
) -> None:
    """A sequential run's scoring (issue 42: the seeded order, a look after each chunk) killed in
    its third chunk carries on from its last look: the same order, the monitor replayed over the
    records saved so far, and it stops at the same look with the same records and verdict as an
    uninterrupted one. The baseline is the same model scored in the same order and the gate a
    0.9-point drop, so that the floor (6 documents) is where it passes, whatever the model answers:
    control flow, not a level (tests/analysis/test_sequential.py has the level)."""
    from qeval.analysis.sequential_run import Monitor, cell, document_order, leaf_chunks
    from qeval.config import RunConfig
    from tests.helpers import config_dict

    task, chunk = "arc_easy_local", 2
    seq_cfg = RunConfig.model_validate(config_dict(sequential={"enabled": True, "seed": 5}))
    flat = document_order(seq_cfg, task, 10)
    plan = seq_plan(
        alpha=0.05, min_docs=6, chunk_docs=chunk, seed=5, tasks={task: {"gate": {"max_drop": 0.9}, "n_docs": 10}}
    )
    order = leaf_chunks(plan, {task: 10})
    assert [i for c in order[task] for i in c] == flat  # the run's order, cut into chunks
    # the baseline scores in the same order (its few-shot draws, so its prompts, follow the order)
    base = list(score(chunk, names=[task], order=order)[task].records)
    assert sorted(r.doc_id or 0 for r in base) == list(range(10))

    def monitor() -> Monitor:
        return Monitor.for_leaves(plan, [task], lambda t: base)

    straight = score(chunk, names=[task], order=order, stop=monitor().chunk)[task]
    expected = list(straight.records)
    assert 6 <= len(expected) < 10, "the cell was not decided before the cap: no stop to resume to"
    # a prefix of the order, chunk by chunk (each chunk's ids ascending, as lm-eval's)
    assert [r.doc_id for r in expected] == [i for c in order[task][: len(expected) // chunk] for i in sorted(c)]
    verdict = cell(plan, task, flat, base, expected)
    assert verdict is not None and verdict.verdict == "pass" and verdict.stopped_at == len(verdict.looks) - 1

    scratch, keys = tmp_path / "scratch", {task: "key-seq"}
    killed = _Watched(None)

    def kill_at_3(b: Any) -> _Watched:
        killed.backend, killed.fail_at = b, 3
        return killed

    with pytest.raises(_Interrupted):
        score(chunk, names=[task], order=order, stop=monitor().chunk, scratch=scratch, resume_keys=keys, wrap=kill_at_3)
    again = _Watched(None)

    def watch(b: Any) -> _Watched:
        again.backend = b
        return again

    resumed = score(
        chunk, names=[task], order=order, stop=monitor().chunk, scratch=scratch, resume_keys=keys, wrap=watch
    )[task]
    records, _ = _unspooled(resumed)
    # only the chunks from the third on were scored again, and no further than the uninterrupted run
    assert len(again.calls) == len(expected) // chunk - 2
    assert [r.doc_id for r in records] == [r.doc_id for r in expected]
    assert [(r.metrics or {})["acc"] for r in records] == [(r.metrics or {})["acc"] for r in expected]
    again_verdict = cell(plan, task, flat, base, records)
    assert again_verdict == verdict


def test_a_sequential_task_carries_on_across_pass_horizons(score: Any, tmp_path: Path) -> None:
    """A sequential run's tasks scored in passes (qeval/run/passes.py), here a group cell's members
    (a group is a pass unit; a task outside groups is the same loop with a unit of one): their
    chunks are shares of the group's pooled order (`leaf_chunks`), scored in one `evaluate()` loop
    (`cell_units`), and the horizon (`pass_horizons`, counted in pooled documents) stops all of them
    at the same look, stored as they stand. The next pass carries every member on from the saved
    state, never scoring a chunk twice (the backend's calls counted), and ends with what one call to
    the cap gives: the same documents, prompts (the few-shot sampler carried on), scores and
    top-k. A setup scored against the baseline's top-k stored at a horizon (a prefix of the order)
    gets its KL, request by request. (Two fixture tasks stand in for a group's members: the loop
    does not look at their metrics.)"""
    from qeval.analysis.sequential_run import cell_units, leaf_chunks, pass_horizons
    from qeval.records.spool import TopkReader, clear_scratch
    from qeval.records.store import RunStore

    members, chunk = {"arc_easy_local": 6, "wikitext_local": 2}, 2
    plan = seq_plan(
        seed=2,
        chunk_docs=chunk,
        groups={"g": list(members.items())},
        tasks={"g": {"members": list(members), "n_docs": sum(members.values())}},
    )
    names = list(members)
    order = leaf_chunks(plan, members)
    assert {len(c) for c in order.values()} == {4}  # 8 pooled documents: every member has the group's 4 chunks
    together = cell_units(plan, names)
    once = _Watched(None)
    straight = score(chunk, names=names, order=order, together=together, wrap=_wrap(once))
    store = RunStore(tmp_path / "run")
    scratch = store.scratch_dir("base")  # as the worker's: inside the run directory, spools moved into it
    keys = {m: f"key-{m}" for m in names}
    held: list[int] = []
    calls: list[int] = []
    for horizon in (4, 12):  # pass 1 to 4 pooled documents; pass 2 past the cap (8): to it
        until = pass_horizons(plan.for_pass(horizon, carry=True, number=1), names)
        assert until == {m: horizon for m in names}  # a group cell's members take the horizon
        watched = _Watched(None)
        got = score(
            chunk,
            names=names,
            order=order,
            scratch=scratch,
            resume_keys=keys,
            until=until,
            together=together,
            wrap=_wrap(watched),
        )
        calls.append(len(watched.calls))
        for m in names:
            store.write_task("base", m, keys[m], got[m].records, got[m].metrics, {}, got[m].topk)
        clear_scratch(scratch, keep_states=True)  # what the worker leaves at the end of a sequential job
        held.append(sum(len(store.read_samples("base", m)) for m in names))
        for m in names:  # each member: its share of the pooled order up to the horizon, and those prompts
            want = [i for c in order[m][: min(horizon, 8) // chunk] for i in sorted(c)]
            part = store.read_samples("base", m)
            assert [r.doc_id for r in part] == want, (horizon, m)
            assert [r.prompt for r in part] == [r.prompt for r in straight[m].records[: len(part)]]
        if horizon == 4:  # the baseline's top-k at pass 1's horizon: what a setup pairs with in pass 1
            (tmp_path / "four.npz").write_bytes(store.topk_path("base", "arc_easy_local").read_bytes())
    assert held == [4, 8]
    assert all(calls) and sum(calls) == len(once.calls)  # each pass scored its chunks, no chunk twice
    for m in names:  # carried on, not rescored: the same records and top-k as one call to the cap
        final = store.read_samples("base", m)
        expected = list(straight[m].records)
        assert [r.doc_id for r in final] == [r.doc_id for r in expected]
        for a, b in zip(expected, final, strict=True):
            assert b.prompt == a.prompt and b.prediction == a.prediction and b.metrics == a.metrics, (m, a.doc_id)
            assert np.allclose(b.loglikelihoods or [], a.loglikelihoods or [], atol=1e-4), (m, a.doc_id)
        topk, want_topk = store.read_topk("base", m), straight[m].topk  # (held in memory: no scratch folder)
        assert topk is not None and np.array_equal(topk["offsets"], want_topk["offsets"])
        assert np.allclose(topk["token_logprobs"], want_topk["token_logprobs"], atol=1e-4)
        for name, value in straight[m].metrics.items():  # aggregated once, over every chunk of both passes
            assert got[m].metrics[name]["value"] == pytest.approx(value["value"], rel=1e-4), (m, name)

    # a setup against the baseline's top-k stored at a horizon (its first documents): KL on each record
    arc = "arc_easy_local"
    with TopkReader(tmp_path / "four.npz") as ref:
        against = score(chunk, {arc: ref}, names=[arc], order={arc: order[arc]}, keep_topk=False, until={arc: 4})[arc]
    got_arc = list(against.records)
    assert len(got_arc) == sum(len(c) for c in order[arc][:2]) > 0
    assert all(r.kl is not None and r.kl < 1e-3 for r in got_arc)
