"""The shipped task suite: checksums, sizes, formats, disjointness from training, bad data."""

from __future__ import annotations

import hashlib
import itertools
import shutil
import sys
from pathlib import Path

import pytest

from qeval.errors import UserError
from qeval.tasks import available_tasks, load_task
from tests.helpers import ROOT, TASKS

sys.path.insert(0, str(ROOT / "scripts"))
import tiny_corpus as tc

EXPECTED = {
    "compare_mc": "multiple_choice",
    "addition": "generate_until",
    "facts": "generate_until",
    "ppl": "loglikelihood_rolling",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_task_loads_with_matching_checksum(name: str) -> None:
    task = load_task(name, TASKS)
    assert task.spec.output_type == EXPECTED[name]
    assert len(task.docs) >= 300
    assert task.spec.data_files is not None
    data = (task.yaml_path.parent / task.spec.data_files).read_bytes()
    assert hashlib.sha256(data).hexdigest() == task.spec.dataset_sha256 == task.sha256


def test_every_kind_is_covered() -> None:
    assert set(available_tasks(TASKS)) >= set(EXPECTED)


def test_generator_reproduces_shipped_data() -> None:
    """make_tasks.py is deterministic: regenerating gives the shipped bytes."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_tasks

    for name, rows in make_tasks.documents().items():
        import json

        data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
        assert data == (TASKS / "data" / f"{name}.jsonl").read_bytes(), name


def test_scored_splits_are_disjoint_from_training() -> None:
    splits = tc.make_splits()
    add = load_task("addition", TASKS)
    held = {(d["a"], d["b"]) for d in add.docs}
    assert held <= set(splits.add_eval)
    docs = list(itertools.islice(tc.training_documents(splits), 50_000))
    lines = {line for d in docs for line in d.split("\n")}
    for a, b in held:
        assert f"{a} + {b} = {a + b}" not in lines
    cmp_questions = {d["question"] for d in load_task("compare_mc", TASKS).docs}
    questions = [line.rsplit(" ", 1)[0] for line in lines if line.startswith(("Largest", "Smallest"))]
    assert not any(q in cmp_questions for q in questions)
    ppl = {d["text"] for d in load_task("ppl", TASKS).docs}
    assert not ppl & set(docs)


def test_facts_are_memorised_on_purpose() -> None:
    facts = {(f.prompt, f.code) for f in tc.make_splits().facts}
    assert all((d["question"], d["answer"]) in facts for d in load_task("facts", TASKS).docs)


def _copy_task(tmp_path: Path, name: str) -> Path:
    shutil.copy(TASKS / f"{name}.yaml", tmp_path / f"{name}.yaml")
    (tmp_path / "data").mkdir(exist_ok=True)
    shutil.copy(TASKS / "data" / f"{name}.jsonl", tmp_path / "data" / f"{name}.jsonl")
    return tmp_path / "data" / f"{name}.jsonl"


def test_corrupt_line_is_named(tmp_path: Path) -> None:
    data = _copy_task(tmp_path, "addition")
    lines = data.read_text().splitlines()
    lines[6] = lines[6][:-3]
    data.write_text("\n".join(lines) + "\n")
    (tmp_path / "addition.yaml").write_text(
        "\n".join(x for x in (tmp_path / "addition.yaml").read_text().splitlines() if "dataset_sha256" not in x)
    )
    with pytest.raises(UserError, match=r"addition.jsonl:7: corrupt dataset line"):
        load_task("addition", tmp_path)


def test_checksum_mismatch_is_refused(tmp_path: Path) -> None:
    data = _copy_task(tmp_path, "addition")
    data.write_text(data.read_text().replace('"answer": "35"', '"answer": "36"', 1))
    with pytest.raises(UserError, match="checksum mismatch"):
        load_task("addition", tmp_path)


def test_unknown_task_lists_known_ones() -> None:
    with pytest.raises(UserError, match=r"unknown task 'nope'.*addition"):
        load_task("nope", TASKS)
