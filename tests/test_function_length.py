"""Function length limits of qeval/ (issue 55): no function over 100 lines, at most 12 over 50.
ruff's complexity rules (pyproject.toml: C901, PLR0912, PLR0915) count branches and statements;
this counts lines, from a function's first decorator to its last line, nested functions and
methods included."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

QEVAL = Path(__file__).resolve().parents[1] / "qeval"

#: no function may be longer
MAX_LINES = 100
#: functions may be longer than this, at most MAX_LONG of them
LONG_LINES = 50
MAX_LONG = 12


def function_lengths(root: Path) -> list[tuple[int, str]]:
    """(lines, "path:line:name") of every function under `root`, longest first."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                assert node.end_lineno is not None
                where = f"{path.relative_to(root.parent)}:{node.lineno}:{node.name}"
                out.append((node.end_lineno - start + 1, where))
    return sorted(out, reverse=True)


@functools.cache
def _qeval() -> list[tuple[int, str]]:
    return function_lengths(QEVAL)  # parsed once for both limits


def test_the_count_starts_at_the_first_decorator(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "@a\n@b(\n    1,\n)\ndef f() -> None:\n    pass\n\n\nclass C:\n    def g(self) -> None:\n        x = 1\n"
    )
    assert function_lengths(tmp_path) == [(6, f"{tmp_path.name}/m.py:5:f"), (2, f"{tmp_path.name}/m.py:10:g")]


def test_no_function_over_100_lines() -> None:
    over = [f"{n} {where}" for n, where in _qeval() if n > MAX_LINES]
    assert not over, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(over)


def test_at_most_12_functions_over_50_lines() -> None:
    long = [f"{n} {where}" for n, where in _qeval() if n > LONG_LINES]
    assert len(long) <= MAX_LONG, (
        f"{len(long)} functions over {LONG_LINES} lines, at most {MAX_LONG} may be:\n" + "\n".join(long)
    )
