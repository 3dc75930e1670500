"""The one markdown table helper and the one escape every report section uses."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

#: makes text from the results safe for the output format: `md_text` for markdown, `str` for
#: report.html (Jinja2 autoescapes there)
Escape = Callable[[object], str]

# `*` and `_` are left alone: at worst they italicise, and names such as compare_mc stay readable.
# Brackets alone are harmless ("[-1.2, +0.4]"); a link needs `](`, `][` or `]:`, and those are broken.
_MD_SPECIAL = str.maketrans(
    {c: f"\\{c}" for c in "\\`|"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;", "\n": " ", "\r": " "}
)
_LINK = re.compile(r"\](?=[(\[:])")
# a comparison between spaces ("TTFT <= 8000 ms", "52.5 ms > 0.4 ms") opens no tag and starts no
# quote: written as it is, not as an entity the raw .md would show ("&lt;=")
_OPERATOR = re.compile(r"(?<= )&(lt|gt);(=?)(?= )")


def md_text(value: object) -> str:
    """Text from the results (names, errors, paths, reasons) made inert in markdown: no table
    cell is split by a `|`, no HTML or link passes through, no line is broken. `<` and `>` as a
    comparison between spaces stay as they are; anywhere else they are entities."""
    text = _LINK.sub(r"]\\", str(value).translate(_MD_SPECIAL))
    return _OPERATOR.sub(lambda m: ("<" if m[1] == "lt" else ">") + m[2], text)


def code_text(value: object) -> str:
    """Text inside a `code span`: only a backtick or a line break can escape it."""
    return str(value).replace("`", "'").replace("\n", " ").replace("\r", " ")


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table's lines: the header, its rule, one line per row (cells already escaped)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def flips_cell(c: Any) -> str:
    """ "3 / 2": a comparison's flips right→wrong / wrong→right ('' where it has none: bits per byte),
    and on a generation task how many generated texts differ at all ("0 / 0 (39 of 100 texts
    differ)": greedy continuations an engine's numerics changed without moving the score)."""
    flips = "" if c.flips_to_wrong is None else f"{c.flips_to_wrong} / {c.flips_to_right}"
    changed = getattr(c, "outputs_changed", None)
    if changed is None:
        return flips
    texts = f"{changed} of {c.n} texts differ"
    return f"{flips} ({texts})" if flips else texts


def kl_cell(c: Any, top1: bool = True) -> str:
    """ "0.00139 (97.3%)": a comparison's KL to the baseline with its top-1 agreement ('' where not measured)."""
    if c.kl is None:
        return ""
    return f"{c.kl:.5f} ({100 * (c.top1_agreement or 0):.1f}%)" if top1 else f"{c.kl:.5f}"
