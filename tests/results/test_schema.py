"""The results schema (qeval.results.schema): exported to docs/, read by one reader, and
valid for every results.json qeval writes (helpers.run_cli checks each one the tests produce)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qeval.errors import UserError
from qeval.results.schema import SCHEMA_VERSION, Results, json_schema, read_results
from tests.helpers import ROOT, SCHEMA, run_cli, validate_results

V1 = ROOT / "tests" / "data" / "run-v1"  # written by qeval at 99128b6, before the typed schema


def test_the_exported_schema_is_current() -> None:
    """docs/results.schema.json is `qeval schema`'s output: regenerate it when the models change."""
    assert json.loads(SCHEMA.read_text()) == json_schema()
    res = run_cli("schema")
    assert res.returncode == 0 and json.loads(res.stdout) == json_schema()


def test_every_field_is_documented() -> None:
    """Each model's fields carry a description or are self-explanatory names listed here."""
    plain = {
        "name",
        "value",
        "n",
        "setup",
        "task",
        "output_type",
        "status",
        "baseline",
        "config_hash",
        "qeval_version",
        "git_commit",
        "started",
        "finished",
        "device",
        "backend",
        "limit",
        "output",
        "hardware",
        "max_drop",
        "relative",
        "higher_is_better",
        "memory",
        "tasks",
        "setups",
        "run",
        "config",
        "dropped",
        "recommendation",
        "schema_version",
        "library_versions",
        "timings",
        "n_tokens",
        "metrics",
    }
    undocumented = []
    for name, model in json_schema()["$defs"].items():
        for field, spec in model.get("properties", {}).items():
            if "description" not in spec and field not in plain:
                undocumented.append(f"{name}.{field}")
    assert not undocumented, undocumented


def test_a_results_file_from_before_the_typed_schema_reads() -> None:
    validate_results(V1 / "results.json")
    results = read_results(V1 / "results.json")
    assert isinstance(results, Results) and results.schema_version == SCHEMA_VERSION
    assert results.setup("int4").memory.weights_bytes.measured == 485744
    assert results.tasks["ppl"].compared_metric == "bits_per_byte"  # not recorded then: the kind's default


def test_report_of_a_run_made_before_the_change_is_unchanged(tmp_path: Path) -> None:
    """`qeval report` on a run directory an earlier qeval wrote (tests/data/run-v1) gives the same
    report.md."""
    run = tmp_path / "run"
    shutil.copytree(V1, run)
    expected = (V1 / "report.md").read_bytes()
    (run / "report.md").unlink()
    res = run_cli("report", str(run))
    assert res.returncode == 0, res.stderr
    assert (run / "report.md").read_bytes() == expected


def test_unknown_fields_are_kept_and_other_versions_refused(tmp_path: Path) -> None:
    data = json.loads((V1 / "results.json").read_text())
    data["added_by_a_newer_qeval"] = {"x": 1}
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert read_results(tmp_path / "results.json").model_dump()["added_by_a_newer_qeval"] == {"x": 1}
    data["schema_version"] = 2
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="schema_version 2; this qeval reads schema_version 1"):
        read_results(tmp_path / "results.json")
