"""Names that become file names: setup and task names are parts of paths under the run
directory (samples/<setup>/<task>.jsonl), so they are held to one safe pattern, and every path
built from them is checked to stay inside the run directory."""

from __future__ import annotations

from pathlib import Path

from qeval.errors import UserError

#: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 100 characters:
#: no separators, no '..', no hidden files, and well under any file system's name limit
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
MAX_NAME = 100


def check_name(kind: str, name: str) -> str:
    """`name` if it is safe as a path component, else a one-line UserError."""
    import re

    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        shown = name if isinstance(name, str) and len(name) <= 60 else f"{str(name)[:60]}…"
        raise UserError(
            f"{kind} name {shown!r} is not allowed: use letters, digits, '.', '_' and '-' "
            f"(starting with a letter or digit, at most {MAX_NAME} characters)"
        )
    return name


def inside(root: Path, *parts: str) -> Path:
    """root/parts..., refused unless it resolves inside root (symlinks followed); used to read
    as well as to write, so the refusal names neither."""
    path = root.joinpath(*parts)
    base = root.resolve()
    if not path.resolve().is_relative_to(base):
        raise UserError(f"refusing {path}: it resolves outside the run directory {base} (a link out of it?)")
    return path
