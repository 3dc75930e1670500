"""The one per-document record type (qeval/results/samples.py SampleRecord): what a scorer builds
is what the run store writes and reads back, typed; lines an earlier qeval wrote read and write
back unchanged (issue 45)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qeval.errors import UserError
from qeval.records.store import RunStore
from qeval.results.samples import PositionSums, SampledRepeat, SampleRecord, TeacherForced
from tests.helpers import ROOT

V1 = ROOT / "tests" / "data" / "run-v1"  # written by qeval at 99128b6, before the typed schema


def test_a_record_round_trips_store_write_and_read_as_the_model(tmp_path: Path) -> None:
    records = [
        SampleRecord(sample_id="0", prompt="2+2=", target="4", prediction="4", correct=True, nll=None),
        SampleRecord(
            sample_id="1",
            prompt="p",
            correct=2 / 3,
            repeats=[SampledRepeat(seed=s, raw_output=o, prediction=o, correct=o == "4") for s, o in enumerate("445")],
            teacher_forced=TeacherForced.model_validate(
                {
                    "tokens": 3,
                    "buckets": [{"start": 0, "end": None, "tokens": 3, "logprob": -1.5, "kl": 0.1, "top1": 2}],
                }
            ),
        ),
        SampleRecord(
            sample_id="2", nll=3.5, n_tokens=[2, 3], buckets=[PositionSums(start=0, end=4, tokens=4, nll=2.0)]
        ),
    ]
    records[2].kl = 0.25  # set after construction, as the KL pass does: written too
    store = RunStore(tmp_path)
    store.write_task("s", "t", "k", records, {}, {}, None)
    back = store.read_samples("s", "t")
    assert back == records and all(type(r) is SampleRecord for r in back)
    assert back[1].repeats is not None and back[1].repeats[2].correct is False
    assert back[1].teacher_forced is not None and back[1].teacher_forced.buckets[0].end is None
    assert back[2].buckets is not None and back[2].buckets[0].kl is None and back[2].kl == 0.25
    lines = store.samples_path("s", "t").read_bytes().splitlines(keepends=True)
    # only the fields set: an explicit null stays, an unset field is not written
    assert (
        lines[0]
        == b'{"sample_id": "0", "prompt": "2+2=", "target": "4", "prediction": "4", "correct": true, "nll": null}\n'
    )
    assert [r.to_line() for r in back] == lines


def test_lines_an_earlier_qeval_wrote_read_typed_and_write_back_unchanged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(V1 / "samples", run / "samples")
    store = RunStore(run)
    for path in sorted((run / "samples").glob("*/*.jsonl")):
        setup, task = path.parent.name, path.stem
        records = store.read_samples(setup, task)
        assert records and all(isinstance(r, SampleRecord) for r in records), path
        assert b"".join(r.to_line() for r in records) == path.read_bytes(), path
    ppl = store.read_samples("int8", "ppl")
    assert ppl[0].n_bytes and ppl[0].kl is not None and ppl[0].kl_tokens and ppl[0].correct is None


def test_unknown_keys_are_kept_and_a_line_that_is_no_record_is_one_line(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = store.samples_path("s", "t")
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"sample_id": 7, "from_a_plugin": [1, 2]}\n')
    (rec,) = store.read_samples("s", "t")
    assert rec.sample_id == "7" and rec.model_extra == {"from_a_plugin": [1, 2]}
    path.write_bytes(b'{"sample_id": "a"}\n{"sample_id": "b", "nll": "high"}\n')
    with pytest.raises(UserError, match=r"t\.jsonl:2: malformed record: nll: "):
        store.read_samples("s", "t")
    path.write_bytes(b'{"prompt": "no id"}\n')
    with pytest.raises(UserError, match=r"t\.jsonl:1: malformed record: sample_id: Field required"):
        store.read_samples("s", "t")
