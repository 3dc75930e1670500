"""The notebook drill-down: load_run on a real run, the worked notebook executed top to
bottom, and a clear refusal of another schema version."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

import qeval
from qeval.notebook import SchemaVersionError
from tests.helpers import DEMO_RUN_LIMIT, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(demo_run: tuple[Path, dict[str, Any]]) -> Path:
    """The shipped demo's session run (tests/conftest.py), every setup on DEMO_RUN_LIMIT documents."""
    return demo_run[0]


def test_load_run_tables(run_dir: Path) -> None:
    run = qeval.load_run(run_dir)
    summary = run.summary()
    assert len(summary) == len(run.setups) * len(run.tasks)
    assert set(summary.columns) >= {"setup", "task", "score", "delta", "ci_low", "ci_high", "verdict"}
    samples = run.samples()
    assert len(samples) == len(run.setups) * len(run.tasks) * int(DEMO_RUN_LIMIT)
    assert samples["sample_id"].map(type).eq(str).all()
    flips = run.flips("kv-int2", "addition")
    row = next(s for s in run.results.setups if s.name == "kv-int2").vs_baseline["addition"]
    assert row.flips_to_wrong is not None and row.flips_to_right is not None
    assert len(flips) == row.flips_to_wrong + row.flips_to_right
    assert (flips["prediction"] != flips["prediction_baseline"]).all()
    mem = run.memory()
    assert {"weights_bytes", "kv_bytes_per_token", "peak_bytes"} <= set(mem["figure"])
    assert run.plot_task_deltas().axes


def test_notebook_runs_top_to_bottom(run_dir: Path) -> None:
    nb = nbformat.read(ROOT / "notebooks" / "drilldown.ipynb", as_version=4)
    cleared = all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert cleared, "commit the notebook with outputs cleared"
    os.environ["QEVAL_RUN"] = str(run_dir)
    try:
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
        ).execute()
    finally:
        del os.environ["QEVAL_RUN"]
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"].get("text/html", "") for o in outputs if o.output_type == "execute_result"]
    assert any("verdict" in h and "kv-int2" in h for h in html)  # the summary table
    assert any("right → wrong" in h or "wrong → right" in h or "direction" in h for h in html)  # the flips
    streams = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "facts wrong under kv-int2" in streams
    assert any("image/png" in o.get("data", {}) for o in outputs if o.output_type == "display_data")


def test_other_schema_version_is_refused_by_name(run_dir: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    results = json.loads((old / "results.json").read_text())
    results["schema_version"] = 0
    (old / "results.json").write_text(json.dumps(results))
    with pytest.raises(SchemaVersionError, match=r"schema_version 0; this qeval reads schema_version 1"):
        qeval.load_run(old)
