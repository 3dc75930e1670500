"""The layering of docs/architecture.md §2a holds: no import in qeval/ (function-level ones
included) runs from a package to one above it, and no packages import each other in a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import ROOT

QEVAL = ROOT / "qeval"
#: §2a's order, lowest first; packages on one row are peers and may not import each other
LAYERS = [
    ["errors", "strict", "version"],
    ["plugins"],
    ["files"],
    ["model"],
    ["config"],
    ["workload"],
    ["results"],
    ["records"],
    ["memory"],
    ["backends"],
    ["perf", "quantize"],
    ["analysis"],
    ["report"],
    ["tasks"],
    ["advise"],
    ["run"],
    ["sweep", "notebook"],
    ["tracking", "compare"],
    ["cli"],
    ["__init__"],
]
#: (importing file, imported module) pairs that run up the order on purpose: each named in §2a
INTENDED: set[tuple[str, str]] = set()


def package_of(module: str) -> str:
    """qeval.tasks.kinds -> tasks; qeval -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(text: str, placed: Path, modules: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, module) of every qeval import in `text`, the source of the file at `placed`
    (relative imports resolved against it). With `modules` (every module's dotted name),
    `from qeval.report import plots` is an import of qeval.report.plots where that is a module."""
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
                for a in node.names:
                    sub = f"{module}.{a.name}"
                    named = sub if module == "qeval" or (modules is not None and sub in modules) else module
                    out.append((node.lineno, named))
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


def module_name(placed: Path) -> str:
    """qeval/report/html.py -> qeval.report.html; qeval/report/__init__.py -> qeval.report."""
    parts = placed.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def circles(files: list[tuple[str, Path]]) -> list[list[str]]:
    """Every circle of modules importing each other (function-level and TYPE_CHECKING imports
    included), as its modules sorted: the strongly connected components of the import graph with
    more than one module. `from pkg import mod` imports pkg.mod; a package's own `__init__` is
    an edge only where it is imported by name (`from qeval.report import write_report`)."""
    names = {module_name(placed): (text, placed) for text, placed in files}
    graph: dict[str, set[str]] = {}
    for name, (text, placed) in names.items():
        targets = set()
        for _, module in imports(text, placed, set(names)):
            while module and module not in names:  # `qeval.config.RunConfig`: the module qeval.config
                module = module.rpartition(".")[0]
            if module and module != name:
                targets.add(module)
        graph[name] = targets
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_runs_up_the_layers() -> None:
    bad = upward([(p.read_text(), p) for p in sorted(QEVAL.rglob("*.py"))])
    assert not bad, "imports against docs/architecture.md §2a:\n" + "\n".join(bad)


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = circles([(p.read_text(), p) for p in sorted(QEVAL.rglob("*.py"))])
    assert not found, "modules that import each other in a circle:\n" + "\n".join(" -> ".join(c) for c in found)


def test_a_circle_is_found() -> None:
    """A function-level import back, through a `from package import module`, is a circle."""
    a = ("def f():\n    from qeval.report import c\n", QEVAL / "report" / "a.py")
    b = ("from qeval.report.a import f\n", QEVAL / "report" / "b.py")
    c = ("from qeval.report import b\nfrom qeval.results.schema import Results\n", QEVAL / "report" / "c.py")
    assert circles([a, b, c]) == [["qeval.report.a", "qeval.report.b", "qeval.report.c"]]
    assert circles([a, b]) == []


def test_the_check_can_fail() -> None:
    """A records module importing the runner, or a peer importing a peer, is reported."""
    probe = "from qeval.run.runner import finish\nfrom qeval.config import RunConfig\nfrom . import keys\n"
    assert upward([(probe, QEVAL / "records" / "probe.py")]) == [
        "qeval/records/probe.py:1: records imports qeval.run.runner, not below it"
    ]
    assert upward([("import qeval.quantize.pipeline\n", QEVAL / "perf" / "probe.py")]) == [
        "qeval/perf/probe.py:1: perf imports qeval.quantize.pipeline, not below it"
    ]


def test_the_documented_order_is_this_one() -> None:
    """§2a's order line and LAYERS say the same."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## §2a Layers") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    rows = [re.findall(r"[\w/.]+", row) for row in block.replace("\n", " ").split("<")]
    names = [[w.removeprefix("qeval/").removesuffix(".py") for w in row] for row in rows]
    assert names == LAYERS


# -- engines own their engine code ------------------------------------------------------------


def backend_packages(root: Path = QEVAL) -> set[str]:
    """The backends qeval ships, by folder: every qeval/backends/<name>/ with an entry.py."""
    return {p.parent.name for p in (root / "backends").glob("*/entry.py")}


def _is_backends(placed: Path) -> bool:
    return placed.relative_to(ROOT).parts[:2] == ("qeval", "backends")


def engine_imports(files: list[tuple[str, Path]], engines: set[str]) -> list[str]:
    """Every import (function-level ones included) of a backend's own package
    (qeval.backends.<engine> or below) from a module outside qeval/backends/."""
    bad = []
    for text, placed in files:
        if _is_backends(placed):
            continue
        for line, module in imports(text, placed):
            parts = module.split(".")
            if parts[:2] == ["qeval", "backends"] and len(parts) > 2 and parts[2] in engines:
                bad.append(f"{placed.relative_to(ROOT)}:{line}: imports {module}")
    return sorted(set(bad))


def _names_in(node: ast.AST, engines: set[str]) -> list[str]:
    """Backend names among the string constants directly in `node` (a tuple, list or set of
    them included)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [x.value for x in items if isinstance(x, ast.Constant) and x.value in engines]


def _literal_names(node: ast.AST, engines: set[str]) -> list[str]:
    """Backend names inside `Literal[...]` (typing.Literal or a bare Literal)."""
    out: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript):
            head = sub.value
            name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", None)
            if name == "Literal":
                for c in ast.walk(sub.slice):
                    out += _names_in(c, engines)
    return out


def engine_name_tests(files: list[tuple[str, Path]], engines: set[str]) -> list[str]:
    """Every comparison (==, !=, in, not in, a match case) of a string constant that is a backend's
    name, and every `Literal[...]` naming one, in a module outside qeval/backends/."""
    bad = []
    for text, placed in files:
        if _is_backends(placed):
            continue
        where = placed.relative_to(ROOT)
        for node in ast.walk(ast.parse(text)):
            names: list[str] = []
            if isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
            ):
                for side in [node.left, *node.comparators]:
                    names += _names_in(side, engines)
            elif isinstance(node, ast.MatchValue):
                names += _names_in(node.value, engines)
            elif isinstance(node, ast.Subscript):
                names += _literal_names(node, engines)
            bad += [f"{where}:{node.lineno}: tests the backend name {n!r}" for n in names]  # type: ignore[attr-defined]
    return sorted(set(bad))


def test_the_backends_are_found_by_their_entries() -> None:
    assert {"hf", "vllm", "openai"} <= backend_packages()


def test_no_module_outside_the_backends_imports_an_engine() -> None:
    files = [(p.read_text(), p) for p in sorted(QEVAL.rglob("*.py"))]
    bad = engine_imports(files, backend_packages())
    assert not bad, "imports of a backend's own package outside qeval/backends/:\n" + "\n".join(bad)


def test_no_module_outside_the_backends_tests_a_backend_name() -> None:
    files = [(p.read_text(), p) for p in sorted(QEVAL.rglob("*.py"))]
    bad = engine_name_tests(files, backend_packages())
    assert not bad, "backend names tested outside qeval/backends/ (ask backend_entry):\n" + "\n".join(bad)


def test_the_engine_checks_can_fail() -> None:
    """A function-level import of an engine's module, a comparison, a match case and a Literal
    naming a backend are each reported; the same inside qeval/backends/ and a default are not."""
    engines = {"hf", "vllm", "openai"}
    probe = (
        "from qeval.backends import backend_entry\n"
        "def f(x: str = 'vllm'):\n"
        "    from qeval.backends.hf.quant import q\n"
        "    if x == 'vllm' or x in ('hf', 'other'):\n"
        "        pass\n"
        "    match x:\n"
        "        case 'openai':\n"
        "            pass\n"
        "E = Literal['vllm', 'x']\n"
        "import qeval.backends.openai\n"
    )
    outside, inside = QEVAL / "perf" / "probe.py", QEVAL / "backends" / "vllm" / "probe.py"
    assert sorted(engine_imports([(probe, outside), (probe, inside)], engines)) == [
        "qeval/perf/probe.py:10: imports qeval.backends.openai",
        "qeval/perf/probe.py:3: imports qeval.backends.hf.quant",
    ]
    assert engine_name_tests([(probe, outside), (probe, inside)], engines) == [
        "qeval/perf/probe.py:4: tests the backend name 'hf'",
        "qeval/perf/probe.py:4: tests the backend name 'vllm'",
        "qeval/perf/probe.py:7: tests the backend name 'openai'",
        "qeval/perf/probe.py:9: tests the backend name 'vllm'",
    ]
