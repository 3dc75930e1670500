"""Which file marks a task as stored (issue 40 point 16, docs/guarantees.md): the meta file,
written last; a kill between a task's records and its meta leaves the task to be scored again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import qeval.records.store as store_module
from qeval.records.store import RunStore
from tests.helpers import sample_records

RECORDS = sample_records({"sample_id": str(i), "doc_id": i, "metrics": {"acc": float(i % 2)}} for i in range(4))


class Killed(BaseException):
    """Stands for a kill -9 landing at one write (a BaseException, as nothing may catch it)."""


def _kill_at_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    def die(path: Path, *_: Any, **__: Any) -> None:
        if path.name.endswith(".meta.json"):
            raise Killed(path.name)

    monkeypatch.setattr(store_module, "atomic_write_json", die)


def test_a_kill_between_records_and_meta_leaves_the_task_not_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        _kill_at_meta(m)
        with pytest.raises(Killed):
            RunStore(tmp_path).write_task("int8", "ppl", "k1", RECORDS, {}, {}, None)
    store = RunStore(tmp_path)  # the rerun
    assert store.samples_path("int8", "ppl").is_file() and not store.is_done("int8", "ppl", "k1")
    store.write_task("int8", "ppl", "k1", RECORDS, {}, {}, None)
    assert store.is_done("int8", "ppl", "k1") and store.read_samples("int8", "ppl") == RECORDS


def test_records_rewritten_under_a_new_key_never_pass_for_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored under k1; a config change (k2) rewrites the records and is killed before its meta;
    the config changed back (k1) must not take k2's records for its own."""
    RunStore(tmp_path).write_task("int8", "ppl", "k1", RECORDS, {}, {}, None)
    newer = sample_records({"sample_id": str(i), "doc_id": i, "metrics": {"acc": 1.0}} for i in range(4))
    with monkeypatch.context() as m:
        _kill_at_meta(m)
        with pytest.raises(Killed):
            RunStore(tmp_path).write_task("int8", "ppl", "k2", newer, {}, {}, None)
    store = RunStore(tmp_path)
    assert store.read_samples("int8", "ppl") == newer
    assert not store.is_done("int8", "ppl", "k1") and not store.is_done("int8", "ppl", "k2")
