"""Spools (qeval/records/spool.py): a chunked task's records and top-k held on disk in the run
directory's scratch folder, then stored by RunStore.write_task exactly as the in-memory forms
would be: the same samples lines, and a `.topk.npz` numpy reads back to the joined packs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from qeval.records.spool import RecordSpool, TopkSpool, clear_scratch
from qeval.records.store import RunStore
from qeval.tasks.divergence import concat_topk
from tests.helpers import sample_records


def _packs(seed: int = 0, sizes: tuple[int, ...] = (3, 1, 4), k: int = 5) -> list[dict[str, np.ndarray]]:
    """pack_topk's form for chunks of `sizes` requests, of 1-6 tokens each."""
    rng = np.random.default_rng(seed)
    packs = []
    for n in sizes:
        lengths = rng.integers(1, 7, n)
        t = int(lengths.sum())
        packs.append(
            {
                "offsets": np.concatenate([[0], np.cumsum(lengths)]),
                "indices": rng.integers(0, 50_000, (t, k)).astype(np.int32),
                "logprobs": -rng.random((t, k)).astype(np.float32),
                "token_logprobs": -rng.random(t).astype(np.float32),
            }
        )
    return packs


def test_a_topk_spool_writes_the_joined_packs_as_numpy_does(tmp_path: Path) -> None:
    packs = _packs()
    spool = TopkSpool(tmp_path / "scratch", "t")
    assert not spool
    for p in packs:
        spool.append(p)
    assert spool
    buf = io.BytesIO()
    spool.write_npz(buf)
    buf.seek(0)
    want = concat_topk(packs)
    with np.load(buf) as z:
        assert sorted(z.files) == sorted(want)
        for key, arr in want.items():
            assert z[key].dtype == arr.dtype and np.array_equal(z[key], arr), key
    assert int(want["offsets"][-1]) == sum(int(p["offsets"][-1]) for p in packs) > 0
    spool.discard()
    assert not list((tmp_path / "scratch").iterdir())


def test_a_topk_spool_refuses_a_pack_of_another_shape(tmp_path: Path) -> None:
    spool = TopkSpool(tmp_path, "t")
    spool.append(_packs(k=5)[0])
    try:
        spool.append(_packs(k=4)[0])
    except ValueError as exc:
        assert "indices" in str(exc)
    else:
        raise AssertionError("a pack of k=4 after k=5 was accepted")


def test_the_store_moves_a_record_spool_into_place(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    scratch = store.scratch_dir("base")
    records = sample_records(
        {"sample_id": str(i), "doc_id": i, "prompt": f"q{i} é", "metrics": {"acc": float(i % 2)}} for i in range(7)
    )
    spool, topk = RecordSpool(scratch, "t"), TopkSpool(scratch, "t")
    packs = _packs(sizes=(4, 3))
    spool.extend(records[:4])
    topk.append(packs[0])
    spool.extend(records[4:])
    topk.append(packs[1])
    assert len(spool) == 7 and list(spool) == records  # read back from its file
    store.write_task("base", "t", "k1", spool, {"acc": {"value": 3 / 7}}, {}, topk)
    assert store.read_samples("base", "t") == records
    ref = store.read_topk("base", "t")
    assert ref is not None and all(np.array_equal(ref[k], v) for k, v in concat_topk(packs).items())
    assert store.is_done("base", "t", "k1") and (meta := store.read_meta("base", "t")) is not None and meta.n == 7
    # the records' file was renamed into place; the top-k's raw files are gone
    assert not list(scratch.glob("*.spool"))
    lines = store.samples_path("base", "t").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [r.model_dump(exclude_unset=True) for r in records]
    # the in-memory form stores the same lines
    store.write_task("base", "u", "k1", records, {}, {}, None)
    assert store.samples_path("base", "u").read_bytes() == store.samples_path("base", "t").read_bytes()


def test_clear_scratch_removes_what_a_dead_worker_left(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    scratch = store.scratch_dir("s")
    spool = RecordSpool(scratch, "t")
    spool.extend(sample_records([{"sample_id": "a"}]))
    spool.finish()
    TopkSpool(scratch, "t").append(_packs()[0])
    assert len(list(scratch.glob("*.spool"))) == 4  # records, indices, logprobs, token_logprobs
    clear_scratch(scratch)
    assert not scratch.exists()
    clear_scratch(scratch)  # nothing there: nothing to do


def test_a_topk_reader_hands_out_the_stored_references_in_order(tmp_path: Path) -> None:
    """What a setup reads of the baseline's stored top-k, chunk by chunk, is what the whole
    arrays split per request give (split_reference), request for request."""
    from qeval.records.spool import TopkReader
    from qeval.tasks.divergence import split_reference

    packs = _packs(sizes=(5, 2, 6))
    whole = concat_topk(packs)
    store = RunStore(tmp_path)
    spool = TopkSpool(store.scratch_dir("base"), "t")
    for p in packs:
        spool.append(p)
    store.write_task("base", "t", "k", [], {}, {}, spool)
    want = split_reference(whole, 13)
    assert want is not None
    with store.open_topk("base", "t") as reader:  # type: ignore[union-attr]
        assert isinstance(reader, TopkReader) and reader.n_requests == 13
        assert reader.keys() == set(whole)
        got = reader.take(4) + reader.take(0) + reader.take(6) + reader.take(100)  # the last: the 3 left
    assert len(got) == 13
    for a, b in zip(want, got, strict=True):
        assert len(a) == len(b) == 3 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert store.open_topk("base", "missing") is None


def test_spools_resumed_from_a_state_are_cut_back_to_it(tmp_path: Path) -> None:
    """A chunk written after the state was saved (a worker killed before its next state) is
    dropped: the reopened spools hold what the state says, and carry on from there."""
    scratch = tmp_path / "scratch"
    records, topk = RecordSpool(scratch, "t"), TopkSpool(scratch, "t")
    packs = _packs(sizes=(3, 2, 4))
    records.extend(sample_records([{"sample_id": "0"}, {"sample_id": "1"}]))
    topk.append(packs[0])
    rec_state, (topk_state, lengths) = records.state(), topk.state()
    records.extend(sample_records([{"sample_id": "2"}]))  # the chunk the worker died in
    topk.append(packs[1])
    records.finish()

    records2 = RecordSpool(scratch, "t", resume=json.loads(json.dumps(rec_state)))
    topk2 = TopkSpool(scratch, "t", resume=json.loads(json.dumps(topk_state)), lengths=lengths)
    assert len(records2) == 2 and records2.path == records.path
    records2.extend(sample_records([{"sample_id": "2", "again": True}]))
    topk2.append(packs[2])
    assert list(records2) == sample_records([{"sample_id": "0"}, {"sample_id": "1"}, {"sample_id": "2", "again": True}])
    buf = io.BytesIO()
    topk2.write_npz(buf)
    buf.seek(0)
    expected = concat_topk([packs[0], packs[2]])
    with np.load(buf) as z:
        assert sorted(z.files) == sorted(expected)
        for key, arr in expected.items():
            assert np.array_equal(z[key], arr), key


def test_a_state_keeps_its_spools_through_clear_scratch_and_names_no_other_file(tmp_path: Path) -> None:
    from qeval.records.spool import load_state, save_state

    scratch = tmp_path / "scratch"
    kept, other = RecordSpool(scratch, "t"), RecordSpool(scratch, "u")
    for s in (kept, other):
        s.extend(sample_records([{"sample_id": "a"}]))
        s.finish()
    save_state(scratch, "g", {"x": [1, 2]}, {"arr": np.arange(3)}, [kept.path.name])
    (scratch / "broken.state.npz").write_bytes(b"not a zip")  # a damaged state keeps nothing
    (scratch / ".half.tmp").write_bytes(b"")  # an atomic write the worker died in
    meta, arrays = load_state(scratch, "g") or ({}, {})
    assert meta == {"x": [1, 2]} and np.array_equal(arrays["arr"], np.arange(3))
    assert load_state(scratch, "broken") is None and load_state(scratch, "none") is None
    clear_scratch(scratch, keep_states=True)
    assert sorted(p.name for p in scratch.iterdir()) == sorted([kept.path.name, "g.state.npz"])
    clear_scratch(scratch)
    assert not scratch.exists()
    # a state's spool names are bare names in the folder: never a path elsewhere
    for name in ("../x.spool", "/etc/passwd", "t.json"):
        try:
            RecordSpool(scratch, "t", resume={"file": name, "n": 0, "bytes": 0})
        except ValueError as exc:
            assert "not a spool of its folder" in str(exc)
        else:
            raise AssertionError(name)


def test_a_spool_shorter_than_its_state_is_not_taken_up(tmp_path: Path) -> None:
    spool = RecordSpool(tmp_path, "t")
    spool.extend(sample_records([{"sample_id": "a"}, {"sample_id": "b"}]))
    state = spool.state()
    spool.finish()
    spool.path.write_bytes(spool.path.read_bytes()[:5])  # damaged after the state was saved
    try:
        RecordSpool(tmp_path, "t", resume=state)
    except ValueError as exc:
        assert "holds less than its saved state says" in str(exc)
    else:
        raise AssertionError("a damaged spool was taken up")


def test_a_spool_that_is_a_symlink_is_never_taken_up(tmp_path: Path) -> None:
    """A planted link in the scratch folder must not make a resume cut or append to its target."""
    scratch, victim = tmp_path / "scratch", tmp_path / "victim.txt"
    scratch.mkdir()
    victim.write_text("keep me\n")
    (scratch / "t.abc.spool").symlink_to(victim)
    for make in (
        lambda: RecordSpool(scratch, "t", resume={"file": "t.abc.spool", "n": 0, "bytes": 0}),
        lambda: TopkSpool(
            scratch,
            "t",
            resume={"arrays": {"indices": ["t.abc.spool", "<i4", [5], 0]}},
            lengths=np.zeros(0, dtype=np.int64),
        ),
    ):
        try:
            make()
        except ValueError as exc:
            assert "not a regular file" in str(exc)
        else:
            raise AssertionError("a symlinked spool was taken up")
    assert victim.read_text() == "keep me\n"


def test_a_state_holds_numpy_metric_values_and_a_damaged_one_is_no_state(tmp_path: Path) -> None:
    from qeval.records.spool import load_state, save_state
    from qeval.tasks.lm_eval import resume
    from qeval.tasks.lm_eval.scoring import _scalar

    # lm-eval's own tasks return numpy bools and integers (mutual's r@1 is np.argmax(...) == gold)
    save_state(tmp_path, "g", {"v": [np.bool_(True), np.int64(3), np.float32(0.5)]}, {}, [])
    meta, _ = load_state(tmp_path, "g") or ({}, {})
    assert meta["v"] == [True, 3, 0.5]
    assert [_scalar(v) for v in (np.bool_(True), np.int64(3), True, 3)] == [1.0, 3.0, 1.0, 3.0]
    # states that parse but hold the wrong shapes: no state, so the task is scored from document 0
    key = "k" * 24
    leaves: object
    for leaves in ([{"name": "x", "records": [1, 2]}], "leaves", [{"name": "x"}], [[]]):
        save_state(tmp_path, resume.state_name(key), {"key": key, "next_start": 4, "leaves": leaves}, {}, [])
        assert resume.load(tmp_path, key) is None, leaves
    (tmp_path / f"{resume.state_name(key)}.state.npz").write_bytes(b"[" * 100_000)  # not even a zip
    assert resume.load(tmp_path, key) is None
