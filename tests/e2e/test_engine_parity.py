"""Engine parity's config (docs/statistics.md, "Engine parity"): a parity control the config cannot
stand is one line, exit code 2, and vLLM offline against the endpoint it serves is one config. The
run itself (the vLLM demo with the baseline on transformers beside it, paired per document) is
tests/backends/test_vllm_backend.py's `_floor_and_provenance`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import BASELINE, make_config, one_line_exit_2, run_cli

PARITY = {"name": "on-vllm", "control": {"backend": "vllm"}}


@pytest.mark.parametrize(
    ("control", "expected"),
    [
        ({"backend": "hf"}, "control backend hf is the run's own"),
        ({"backend": "nope"}, "backend: 'nope' is not a backend qeval has"),
        ({"backend": "vllm", "batch_size": 1}, "control batch_size: backend vllm has no such serving condition"),
    ],
)
def test_a_parity_control_that_cannot_stand_is_one_line(tmp_path: Path, control: dict, expected: str) -> None:
    cfg = make_config(tmp_path, setups=[BASELINE, {"name": "other", "control": control}])
    one_line_exit_2(run_cli("validate", str(cfg)), expected)


def test_vllm_offline_against_the_endpoint_it_serves_is_one_config(tmp_path: Path) -> None:
    """A vLLM run whose parity control runs on the openai backend (a launched `vllm serve`) takes the
    `server:` block the control needs; a config whose no setup runs on a server backend still refuses it."""
    served = {"name": "endpoint", "control": {"backend": "openai", "concurrency": 4}}
    cfg = make_config(tmp_path, backend="vllm", setups=[BASELINE, served], server={"mode": "launch"})
    res = run_cli("validate", str(cfg))
    assert res.returncode == 0, res.stderr
    alone = make_config(tmp_path, filename="alone.yaml", backend="vllm", setups=[BASELINE], server={"mode": "launch"})
    one_line_exit_2(run_cli("validate", str(alone)), "server: applies to backend openai only")


def test_a_parity_control_keeps_its_backends_key_when_another_setup_runs_alone(tmp_path: Path) -> None:
    """`--setups int8` runs int8 (and the baseline) only; the parity control stored by an earlier run
    is still checked at assembly under its own backend's key, not the run's (else it is dropped
    as stored under another run's key)."""
    from qeval.config import load_config
    from qeval.records.keys import setup_keys
    from qeval.run.preflight import preflight

    cfg = load_config(make_config(tmp_path, setups=[BASELINE, PARITY, {"name": "int8", "weights": "int8"}]))
    pre = preflight(cfg, only_setups=["int8"])
    parity = next(s for s in cfg.setups if s.name == "on-vllm")
    parts = setup_keys(pre, parity).parts
    assert parts["backend"] == "vllm" and "engine" in parts
    assert setup_keys(pre, cfg.baseline).parts["backend"] == "hf"
