"""One evidence chain: each phase's stored outcome is reused only under its content key. A real run
on the shipped tiny model is stored once; then each key input is changed in turn, and the runner's
first pass (qeval/run/runner.py `prepare`, no worker started) must schedule exactly the work that
input invalidates: a setup's tasks, its performance phase, or everything under `--force`. (The
serving phase's rows: tests/perf/test_goodput.py::test_goodput_rows_are_keyed_by_content_not_the_traces_path;
the advisor's key: tests/advise/test_advise_run.py::test_advice_key_follows_its_inputs.)"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qeval.config import RunConfig
from qeval.run.options import RunOptions
from qeval.run.runner import check, prepare, run
from tests.helpers import MODEL, TASKS, config_dict

#: (setup -> (tasks it scores again, whether its performance phase runs again)) per changed input
Scheduled = dict[str, tuple[list[str], bool]]


def _config(root: Path, **changes: Any) -> RunConfig:
    perf = {"enabled": True, "input_len": 8, "output_len": 2, "num_requests": 2, "concurrency": [1], "repeats": 1}
    body = config_dict(
        model=str(root / "model"),
        tasks_dir=str(root / "tasks"),
        tasks=["addition"],
        limit=4,
        performance=perf | changes.pop("performance", {}),
    )
    return RunConfig.model_validate(body | changes)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of two setups (tasks scored, memory, the performance phase), in its own
    copies of the model and the task data, which the cases below change."""
    root = tmp_path_factory.mktemp("keys")
    shutil.copytree(MODEL, root / "model")
    (root / "tasks" / "data").mkdir(parents=True)
    shutil.copy(TASKS / "addition.yaml", root / "tasks")
    shutil.copy(TASKS / "data" / "addition.jsonl", root / "tasks" / "data")
    results = run(_config(root), RunOptions(output=root / "run"))
    assert [s.status for s in results.setups] == ["ok", "ok"]
    return root


def _scheduled(root: Path, cfg: RunConfig, force: bool = False) -> Scheduled:
    opts = RunOptions(output=root / "run", force=force)
    prepared = prepare(check(cfg, opts), opts)
    return {j.job.setup: (sorted(j.job.tasks), j.job.performance is not None) for j in prepared.jobs}


def _edit_task_data(root: Path) -> None:
    data = root / "tasks" / "data" / "addition.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[0]["answer"] = str(rows[0]["answer"]) + "0"  # one document's target changed
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = root / "tasks" / "addition.yaml"  # its checksum follows, as a maintainer's edit would
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    spec.write_text(re.sub(r"dataset_sha256: *\S+", f"dataset_sha256: {digest}", spec.read_text()))


def _edit_model(root: Path) -> None:
    weights = root / "model" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 1  # the last byte of the last tensor: the content checksum changes
    weights.write_bytes(bytes(raw))


EVERYTHING: Scheduled = {"bf16": (["addition"], True), "int8": (["addition"], True)}

CASES: dict[str, tuple[Callable[[Path], None] | None, dict[str, Any], bool, Scheduled]] = {
    "nothing changed": (None, {}, False, {}),
    "the model's content": (_edit_model, {}, False, EVERYTHING),
    "the task's data": (_edit_task_data, {}, False, {"bf16": (["addition"], False), "int8": (["addition"], False)}),
    "the sample limit": (None, {"limit": 3}, False, EVERYTHING),
    "the batch size": (None, {"batch_size": 8}, False, EVERYTHING),
    "the context": (None, {"model": {"max_context": 200}}, False, EVERYTHING),
    "one setup": (
        None,
        {"setups": [{"name": "bf16", "baseline": True}, {"name": "int8", "weights": "int4"}]},
        False,
        {"int8": (["addition"], True)},
    ),
    # a KV setup in the config: every setup decodes from the cache (hf/support.py decodes_from_cache)
    "a quantized KV cache": (
        None,
        {"setups": [{"name": "bf16", "baseline": True}, {"name": "int8", "weights": "int8", "kv_cache": "int4"}]},
        False,
        EVERYTHING,
    ),
    "the performance workload": (
        None,
        {"performance": {"output_len": 3}},
        False,
        {"bf16": ([], True), "int8": ([], True)},
    ),
    "--force": (None, {}, True, EVERYTHING),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_key_input_changed_runs_again_what_it_keys(stored: Path, tmp_path: Path, case: str) -> None:
    edit, changes, force, expected = CASES[case]
    root = tmp_path / "copy"
    shutil.copytree(stored, root)  # each case on its own copy: the stored run stays as it was
    if edit is not None:
        edit(root)
    if "model" in changes:
        changes = changes | {"model": {"path": str(root / "model")} | changes["model"]}
    assert _scheduled(root, _config(root, **changes), force) == expected
