"""The run phases as plug-ins (qeval/run/phases/): the registry loads qeval's phases in order
through the plug-in loader, a run goes on with a phase unregistered (what deleting its folder and
its registry line leaves), a results.json holding that phase's block still loads and reports
(without the phase's section), and a phase from outside qeval joins through the environment."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from qeval.config import RunConfig
from qeval.errors import UserError
from qeval.records.job import AdviseJob, Job
from qeval.report.write import write_report
from qeval.results.schema import read_results
from qeval.run import phases
from qeval.run.options import RunOptions
from qeval.run.runner import run
from tests.helpers import MODEL, SMALL_CONFIG, TASKS, config_dict, empty_sequential_block


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The registry read afresh, and again after the test (it is cached per environment)."""
    phases._registered.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    phases._registered.cache_clear()


def test_qevals_phases_load_in_order_each_with_its_contract() -> None:
    loaded = phases.run_phases()
    assert [p.name for p in loaded] == ["advice", "scoring", "sequential", "performance", "serving"]
    for p in loaded:
        assert p.config_block and p.keyed_by and p.store, p.name
        # a plan a phase carries to the worker is a typed model, and a field of the job
        if p.plan is not None:
            assert issubclass(p.plan, BaseModel)
            on_job = p.plan is Job or any(p.plan.__name__ in str(f.annotation) for f in Job.model_fields.values())
            assert on_job or p.plan is AdviseJob, p.name  # the advisor's job is its own file
    plain = RunConfig.model_validate(config_dict(performance={"enabled": False}))
    assert [p.name for p in phases.active(plain)] == ["scoring"]
    both = RunConfig.model_validate(
        config_dict(sequential={"enabled": True, "min_docs": 6, "chunk_docs": 4}, performance={"enabled": False})
    )
    assert [p.name for p in phases.active(both)] == ["scoring", "sequential"]


def test_a_bad_phase_reference_is_one_line(registry: pytest.MonkeyPatch) -> None:
    registry.setenv(phases.ENV_VAR, "no_such_module:PHASE")
    with pytest.raises(UserError, match=r"run phase no_such_module:PHASE: cannot be loaded"):
        phases.run_phases()
    phases._registered.cache_clear()
    registry.setenv(phases.ENV_VAR, "qeval.run.phases.scoring:_prepare")
    with pytest.raises(UserError, match=r"is a function, not a qeval.run.phases.RunPhase"):
        phases.run_phases()


PROBE = """
from qeval.run.phases import RunPhase


def _finish(p, results):
    (p.store.root / "probe.txt").write_text(",".join(s.name for s in results.setups))
    return results


PHASE = RunPhase(name="probe", config_block="-", keyed_by="-", store="probe.txt", finish=_finish)
"""


def test_a_run_with_the_sequential_and_serving_phases_unregistered(
    registry: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Deleting a phase is its folder and its registry line: with the sequential and serving
    phases out of the registry (and a phase from outside qeval in, through the environment) a run
    scores, assembles and reports; a results.json carrying a sequential block still loads and
    reports, without the section the unregistered phase would add."""
    kept = tuple(r for r in phases.BUILT_IN if ".sequential:" not in r and ".serving:" not in r)
    registry.setattr(phases, "BUILT_IN", kept)
    (tmp_path / "probe_phase.py").write_text(textwrap.dedent(PROBE))
    registry.syspath_prepend(str(tmp_path))
    registry.setenv(phases.ENV_VAR, "probe_phase:PHASE")
    assert [p.name for p in phases.run_phases()] == ["advice", "scoring", "performance", "probe"]

    text = SMALL_CONFIG.replace("@MODEL@", str(MODEL)).replace("@TASKS@", str(TASKS))
    cfg = RunConfig.model_validate(yaml.safe_load(text) | {"limit": 6})
    out = tmp_path / "run"
    results = run(cfg, RunOptions(output=out))
    assert [s.status for s in results.setups] == ["ok", "ok"]
    assert (out / "probe.txt").read_text() == "bf16,int8"  # the outside phase finished the run
    assert "## Sequential gates" not in (out / "report.md").read_text()

    # a run directory written with the sequential phase registered: its block loads and reports
    block = empty_sequential_block()
    written = read_results(out / "results.json").model_copy(update={"sequential": block})
    (out / "results.json").write_text(written.model_dump_json(indent=2) + "\n")
    again = read_results(out / "results.json")
    assert again.sequential == block
    md, _ = write_report(out, again, phases.report_sections())
    assert "## Sequential gates" not in md.read_text() and "| int8 |" in md.read_text()
    registry.undo()
    phases._registered.cache_clear()
    md, _ = write_report(out, again, phases.report_sections())
    assert "## Sequential gates" in md.read_text()  # registered again: the phase's section is back
