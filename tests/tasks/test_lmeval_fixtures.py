"""The lm-eval fixture files under tasks/lm_eval/data are what scripts/make_lmeval_fixtures.py
writes from scripts/lmeval_items/: regenerated, byte for byte, and no other file there."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.helpers import ROOT

DATA = ROOT / "tasks" / "lm_eval" / "data"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_lmeval_fixtures", ROOT / "scripts" / "make_lmeval_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_gives_the_committed_files() -> None:
    script = _script()
    written = {name: script.render(rows).encode() for name, rows in script.files().items()}
    committed = {p.relative_to(DATA).as_posix(): p.read_bytes() for p in sorted(DATA.rglob("*.jsonl"))}
    assert sorted(written) == sorted(committed)
    differ = [name for name in written if written[name] != committed[name]]
    assert not differ, f"regenerate with scripts/make_lmeval_fixtures.py: {differ}"


def test_the_script_writes_what_it_renders(tmp_path: Path) -> None:
    """The command line writes the same bytes into --out (here a temporary folder)."""
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_lmeval_fixtures.py"), "--out", str(tmp_path)],
        check=True,
        timeout=120,
    )
    got = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in sorted(tmp_path.rglob("*.jsonl"))}
    committed = {p.relative_to(DATA).as_posix(): p.read_bytes() for p in sorted(DATA.rglob("*.jsonl"))}
    assert got == committed
