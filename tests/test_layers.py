"""The layering of docs/architecture.md §2a holds: no import in qeval/ (function-level ones
included) runs from a package to one above it, and no packages import each other in a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

QEVAL = ROOT / "qeval"
#: §2a's order, lowest first; packages on one row are peers and may not import each other
LAYERS = [["errors", "strict", "version"], ["files"], ["config"], ["workload"], ["results"], ["records"], ["memory"],
          ["backends"], ["perf", "quantize"], ["analysis"], ["report"], ["tasks"], ["advise"], ["run"],
          ["sweep", "notebook"], ["tracking", "compare"], ["cli"], ["__init__"]]
#: (importing file, imported module) pairs that run up the order on purpose: each named in §2a
INTENDED: set[tuple[str, str]] = set()


def package_of(module: str) -> str:
    """qeval.tasks.kinds -> tasks; qeval -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(text: str, placed: Path) -> list[tuple[int, str]]:
    """(line, module) of every qeval import in `text`, the source of the file at `placed`
    (relative imports resolved against it)."""
    rel = placed.relative_to(ROOT).with_suffix("")
    here = list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "qeval"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == "qeval":
                # `from qeval import notebook`: the names may be modules themselves
                out += [(node.lineno, f"{module}.{a.name}" if module == "qeval" else module) for a in node.names]
    return out


def upward(files: list[tuple[str, Path]]) -> list[str]:
    """Every import, in (source text, where the file stands), from a package to one on its own
    row or above (peers included)."""
    order = {p: i for i, row in enumerate(LAYERS) for p in row}
    bad = []
    for text, placed in files:
        where = placed.relative_to(ROOT)
        src = package_of(".".join(where.with_suffix("").parts))
        for line, module in imports(text, placed):
            dst = package_of(module)
            if dst == src or (str(where), module) in INTENDED:
                continue
            if dst not in order or src not in order:
                bad.append(f"{where}:{line}: {module} (a package §2a does not place)")
            elif order[dst] >= order[src]:
                bad.append(f"{where}:{line}: {src} imports {module}, not below it")
    return bad


def test_no_import_runs_up_the_layers() -> None:
    bad = upward([(p.read_text(), p) for p in sorted(QEVAL.rglob("*.py"))])
    assert not bad, "imports against docs/architecture.md §2a:\n" + "\n".join(bad)


def test_the_check_can_fail() -> None:
    """A records module importing the runner, or a peer importing a peer, is reported."""
    probe = "from qeval.run.runner import finish\nfrom qeval.config import RunConfig\nfrom . import keys\n"
    assert upward([(probe, QEVAL / "records" / "probe.py")]) == [
        "qeval/records/probe.py:1: records imports qeval.run.runner, not below it"]
    assert upward([("import qeval.quantize.pipeline\n", QEVAL / "perf" / "probe.py")]) == [
        "qeval/perf/probe.py:1: perf imports qeval.quantize.pipeline, not below it"]


def test_the_documented_order_is_this_one() -> None:
    """§2a's order line and LAYERS say the same."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## §2a Layers"):]
    block = block[block.index("```") + 3:]
    block = block[: block.index("```")]
    rows = [re.findall(r"[\w/.]+", row) for row in block.replace("\n", " ").split("<")]
    names = [[w.removeprefix("qeval/").removesuffix(".py") for w in row] for row in rows]
    assert names == LAYERS
