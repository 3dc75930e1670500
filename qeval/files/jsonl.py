"""JSON Lines input (task data, calibration text): one object per line, and one clear line
naming the file and line number when a line is not one."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qeval.errors import UserError


def read_objects(path: Path, raw: bytes | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of `path` (or of its bytes `raw`)."""
    try:
        text = (raw if raw is not None else path.read_bytes()).decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = (raw if raw is not None else path.read_bytes())[: exc.start].count(b"\n") + 1
        raise UserError(f"{path}:{bad_line}: corrupt dataset line (not UTF-8)") from None
    yield from json_lines(path, text, "corrupt dataset line")


def json_lines(path: Path, text: str, bad: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of `text` (read from `path`); one UserError,
    `path:line: <bad> (why)`, for a line that is not a JSON object."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: {bad} ({exc.msg})") from None
        except RecursionError:  # `[[[[...` thousands deep: json's decoder recurses (a hostile file)
            raise UserError(f"{path}:{lineno}: {bad} (nested too deeply)") from None
        except ValueError:  # Python's int-max-str-digits: a number of thousands of digits
            digits = sys.get_int_max_str_digits()
            raise UserError(f"{path}:{lineno}: {bad} (a number of more than {digits:,} digits)") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{lineno}: {bad} (expected a JSON object, got {type(obj).__name__})")
        yield lineno, obj
