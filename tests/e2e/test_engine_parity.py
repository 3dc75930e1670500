"""Engine parity's config (docs/statistics.md, "Engine parity"): a parity control the config cannot
stand is one line, exit code 2, and vLLM offline against the endpoint it serves is one config. The
run itself (the vLLM demo with the baseline on transformers beside it, paired per document) is
tests/backends/test_vllm_backend.py's `_floor_and_provenance`."""

from __future__ import annotations

from pathlib import Path

import pytest

from qeval.config import load_config
from tests.helpers import BASELINE, INT8, make_config, one_line_exit_2, run_cli

PARITY = {"name": "on-vllm", "control": {"backend": "vllm"}}


@pytest.mark.parametrize(
    ("control", "expected"),
    [
        ({"backend": "hf"}, "control backend hf is the run's own"),
        ({"backend": "nope"}, "backend: 'nope' is not a backend qeval has"),
        ({"backend": "vllm", "batch_size": 1}, "control batch_size: backend vllm has no such serving condition"),
        ({"of": "int8", "batch_size": 1}, "control: of int8 serves that setup again on another engine (parity); it"),
        ({"backend": "vllm", "of": "gone"}, "setup other: control of gone names no setup of this config other than"),
        ({"backend": "vllm", "of": "other"}, "setup other: control of other names no setup of this config other"),
        ({"backend": "vllm", "of": "int8"}, "setup other: a control serves int8's weights and KV cache under other"),
    ],
)
def test_a_parity_control_that_cannot_stand_is_one_line(tmp_path: Path, control: dict, expected: str) -> None:
    cfg = make_config(tmp_path, setups=[BASELINE, INT8, {"name": "other", "control": control}])
    one_line_exit_2(run_cli("validate", str(cfg)), expected)


def test_a_parity_control_of_another_setup_is_validated_on_its_engine(tmp_path: Path) -> None:
    """`control: {backend, of}` serves that setup's model on another engine: a checkpoint both
    engines load validates; a setup the other engine cannot serve (quanto on vLLM) is refused there in
    one line; a sequential run, which tests every cell against the baseline, refuses it in one line."""
    w8a8 = {"name": "w8a8", "weights": "int8", "method": "w8a8"}
    of = {**w8a8, "name": "w8a8-on-vllm", "control": {"backend": "vllm", "of": "w8a8"}}
    loaded = load_config(make_config(tmp_path, setups=[BASELINE, w8a8, of]))
    control = next(s for s in loaded.setups if s.control is not None)
    assert loaded.backend_of(control) == "vllm" and control.control is not None and control.control.of == "w8a8"
    assert control.id != loaded.setups[1].id  # its own records: the same model, another engine
    # (`qeval validate` wants the checkpoint made: tests/backends/test_vllm_backend.py runs one)
    rtn = {**INT8, "name": "int8-on-vllm", "control": {"backend": "vllm", "of": "int8"}}
    cfg = make_config(tmp_path, filename="rtn.yaml", setups=[BASELINE, INT8, rtn])
    one_line_exit_2(run_cli("validate", str(cfg)), "setup 'int8-on-vllm' on vllm/cpu: method 'rtn' is a transformers")
    seq = make_config(tmp_path, filename="seq.yaml", setups=[BASELINE, w8a8, of], sequential={"enabled": True})
    one_line_exit_2(run_cli("validate", str(seq)), "setup w8a8-on-vllm: a parity control of w8a8 is paired with it")


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
