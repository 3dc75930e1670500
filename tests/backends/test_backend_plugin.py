"""The backend registry: a backend from a test-only folder (tests/kinds/toy_backend.py),
registered through QEVAL_BACKENDS alone, is checked at preflight by its own entry; one that is
missing or unknown is one line, exit code 2. (tests/run/test_task_kinds.py runs a whole run on it.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qeval.backends import backend_entry, backends
from qeval.errors import UserError
from tests.helpers import BASELINE, ROOT, make_config, one_line_exit_2, run_cli

PLUGINS = ROOT / "tests" / "kinds"


def test_a_backend_from_outside_qeval_is_checked_by_its_own_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{PLUGINS}:{ROOT}")
    monkeypatch.setenv("QEVAL_BACKENDS", "toy_backend:BACKEND")
    res = run_cli("validate", str(make_config(tmp_path, backend="toy")))
    assert res.returncode == 0, res.stderr
    kv = make_config(tmp_path, backend="toy", setups=[BASELINE, {"name": "kv4", "kv_cache": "int4"}])
    one_line_exit_2(run_cli("validate", str(kv)), "the toy backend keeps its KV cache at the model's dtype")
    # and nothing in qeval names it: it came in through the registry alone
    grep = subprocess.run(["grep", "-rl", "toy_backend", str(ROOT / "qeval")], capture_output=True, text=True)
    assert grep.stdout == ""


def test_an_unknown_or_unloadable_backend_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("QEVAL_BACKENDS", "toy_backend:BACKEND")
    assert list(backends()) == ["hf", "vllm", "openai", "toy"]
    with pytest.raises(
        UserError,
        match=r"^backend: 'nope' is not a backend qeval has \(registered: hf, vllm, "
        r"openai, toy\)$",
    ):
        backend_entry("nope")
    monkeypatch.setenv("QEVAL_BACKENDS", "no_such_module:BACKEND")
    with pytest.raises(UserError, match=r"^backend no_such_module:BACKEND: cannot be loaded \(ModuleNotFoundError"):
        backends()
    monkeypatch.setenv("QEVAL_BACKENDS", "toy_backend:_validate")
    with pytest.raises(UserError, match="is a function, not a qeval.backends.BackendEntry"):
        backends()
