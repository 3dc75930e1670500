"""The docs check: what README.md, CONTRIBUTING.md, docs/*.md and the docstrings and comments of
qeval/, bench/ and scripts/ cite must exist: every repository path, every bare file name
(`runner.py`) and dotted module name (`qeval.run.runner`), every `§N` section, and every option
of a `qeval` command line shown in the Markdown pages; and docs/architecture.md §2 names every
module of qeval/ and none that does not exist.

Each check lists every stale reference it finds as `file:line: what`, so a change that moves a
module sees all the references it leaves behind at once. The unit tests at the end feed each
checker a small made-up repository and assert that it reports what is wrong there.
"""

from __future__ import annotations

import ast
import fnmatch
import io
import os
import posixpath
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: a cited path is checked when it starts with one of these folders, or is one of these files
TOP_DIRS = ("qeval", "tests", "docs", "configs", "tasks", "models", "bench", "scripts", "notebooks", ".ci")
TOP_FILES = ("Makefile", "pyproject.toml", "README.md", "CONTRIBUTING.md")


#: made-up paths that comments use as examples, not citations
EXAMPLES = frozenset(
    {
        "models/x",  # qeval/model/source.py: a local path that is not a hub id
        "models/qeval-tinyy",  # qeval/config/run.py: a typo of a local path
    }
)


@dataclass(frozen=True)
class Text:
    """Prose to check: a whole Markdown page, or one docstring or comment of a Python file."""

    file: str  # repo-relative, for the messages
    line: int  # the line `text` starts on
    text: str
    markdown: bool = False

    def line_of(self, offset: int) -> int:
        return self.line + self.text.count("\n", 0, offset)


# --- collecting the texts ---------------------------------------------------------------------


def markdown_texts(root: Path) -> list[Text]:
    pages = [root / name for name in ("README.md", "CONTRIBUTING.md")] + sorted((root / "docs").glob("*.md"))
    return [
        Text(str(p.relative_to(root)), 1, p.read_text(encoding="utf-8"), markdown=True) for p in pages if p.is_file()
    ]


def python_texts(path: Path, name: str) -> Iterator[Text]:
    """A Python file's docstrings (module, class, function) and comments."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield Text(name, first.lineno, first.value.value)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield Text(name, tok.start[0], tok.string)


def source_texts(root: Path) -> list[Text]:
    files = (
        sorted((root / "qeval").rglob("*.py"))
        + sorted((root / "bench").glob("*.py"))
        + sorted((root / "scripts").glob("*.py"))
    )
    return [t for f in files for t in python_texts(f, str(f.relative_to(root)))]


def all_texts(root: Path) -> list[Text]:
    return markdown_texts(root) + source_texts(root)


# --- a. repository paths ----------------------------------------------------------------------

_PATH = re.compile(
    r"(?<![\w./\\$~<>-])"  # not the tail of a longer path, an URL, ~/x or RUN_DIR/x
    r"((?:{})/[\w.*/<>+-]*|(?:{})(?![\w.-]))".format(
        "|".join(re.escape(d) for d in TOP_DIRS), "|".join(re.escape(f) for f in TOP_FILES)
    )
)
#: `python -m qeval.x.y`: a module path
_MODULE = re.compile(r"-m\s+(qeval(?:\.\w+)+)")
#: a Markdown link's target, relative to its page: `[cluster.md](cluster.md)`, `(../README.md#x)`
_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)#\s]+)")


def cited_paths(text: Text) -> Iterator[tuple[int, str]]:
    """(line, path) for each repo-relative path the text cites, trailing punctuation and
    `::name` / `:line` suffixes stripped (the pattern stops at ':'); on a Markdown page, also
    each link's target, relative to the page."""
    found: dict[tuple[int, str], None] = {}
    for m in _PATH.finditer(text.text):
        path = m.group(1).rstrip(".,;")
        if not path.endswith("..."):  # `qeval/...`: an ellipsis, not a path
            found[text.line_of(m.start()), path] = None
    for m in _MODULE.finditer(text.text):
        found[text.line_of(m.start()), m.group(1).replace(".", "/") + ".py"] = None
    if text.markdown:
        for m in _LINK.finditer(text.text):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(text.file), m.group(1)))
            found[text.line_of(m.start()), target + ("/" if m.group(1).endswith("/") else "")] = None
    yield from found


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether git ignores the path (a build output: .venv/, models/smollm2-135m/), going by
    the .gitignore patterns qeval's .gitignore uses: names, globs and anchored folders."""
    parts = path.strip("/").split("/")
    for pat in patterns:
        anchored = pat.startswith("/") or "/" in pat.rstrip("/")
        pat_parts = pat.strip("/").split("/")
        starts = [0] if anchored else range(len(parts))
        for i in starts:
            window = parts[i : i + len(pat_parts)]
            if len(window) == len(pat_parts) and all(
                fnmatch.fnmatchcase(a, b) for a, b in zip(window, pat_parts, strict=True)
            ):
                return True
    return False


def _gitignore(root: Path) -> list[str]:
    f = root / ".gitignore"
    lines = f.read_text(encoding="utf-8").splitlines() if f.is_file() else []
    return [x.strip() for x in lines if x.strip() and not x.startswith(("#", "!"))]


def path_exists(root: Path, path: str) -> bool:
    pattern = re.sub(r"<[^>/]*>", "*", path)  # `qeval/backends/<name>/`: a placeholder
    if "*" in pattern:
        return any(True for _ in root.glob(pattern.rstrip("/")))
    target = root / pattern
    if path.endswith("/"):
        return target.is_dir()
    if target.exists():
        return True
    # `python -m qeval.x.y`: a module may be a package
    return path.endswith(".py") and (root / path[:-3] / "__init__.py").is_file()


def missing_paths(texts: Iterable[Text], root: Path, allowed: Iterable[str] = ()) -> list[str]:
    ignore = _gitignore(root)
    allowed = set(allowed)
    return [
        f"{t.file}:{line}: {path}"
        for t in texts
        for line, path in cited_paths(t)
        if path not in allowed and not _ignored(path, ignore) and not path_exists(root, path)
    ]


# --- a2. bare file names and dotted module names ----------------------------------------------

#: `runner.py`, not the tail of a path (`run/runner.py`) or of a longer name
_BARE = re.compile(r"(?<![\w./\\$~<>*-])(\w+\.py)(?![\w/])")
#: `qeval.run.runner`, `qeval.load_run`: a module, or a name a module defines
_DOTTED = re.compile(r"(?<![\w./-])(qeval(?:\.[A-Za-z_]\w*)+)(?![\w-])")
#: bare names of files that live in another project (engines, libraries) that comments cite
UPSTREAM = frozenset(
    {
        "cache_utils.py",  # transformers
        "latency.py",
        "amx_mla.py",
        "cpu.py",
        "arg_utils.py",  # vLLM
        "prepare_niah.py",
        "essays.py",  # lm-eval's RULER tasks
    }
)
#: dotted names that are not modules: entry-point groups
NOT_MODULES = frozenset(
    {
        "qeval.task_kinds",  # the task kinds' entry-point group (CONTRIBUTING.md)
        "qeval.run_phases",  # the run phases' entry-point group (qeval/run/phases/__init__.py)
        # MLflow tags (docs/tracking.md)
        "qeval.kind",
        "qeval.recommendation",
        "qeval.run_dir",
        "qeval.status",
        "qeval.baseline",
        "qeval.verdict",
        "qeval.flag",
        "qeval.error",
    }
)
#: folders whose files a bare name may name
_SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".venv",
    ".venv-vllm",
    ".venv-quant",
    "build",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "reports",
    "checkpoints",
}


def repo_files(root: Path) -> dict[str, list[str]]:
    """Each file name in the repository's own folders (not git-ignored) -> its repo-relative paths."""
    ignore = _gitignore(root)
    names: dict[str, list[str]] = {}
    for top in TOP_DIRS:
        for here, dirs, files in os.walk(root / top):
            rel = Path(here).relative_to(root).as_posix()
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not _ignored(f"{rel}/{d}/", ignore)]
            for f in files:
                names.setdefault(f, []).append(f"{rel}/{f}")
    for top_file in (root / name for name in TOP_FILES):
        if top_file.is_file():
            names.setdefault(top_file.name, []).append(top_file.name)
    return names


def _defines(path: Path) -> set[str]:
    """The top-level names a Python module defines or imports."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def module_exists(root: Path, dotted: str) -> bool:
    """`qeval.a.b` is a module or package, or `qeval.a.name` a name module `qeval.a` defines (one
    attribute deep, then any attribute of it: `qeval.load_run().drop`)."""
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        folder = root.joinpath(*parts[:i])
        if folder.is_dir() or folder.with_suffix(".py").is_file():  # a package (a namespace one too), a module
            continue
        if i == 1:
            return False
        parent = root.joinpath(*parts[: i - 1])
        module = parent / "__init__.py" if parent.is_dir() else parent.with_suffix(".py")
        return module.is_file() and parts[i - 1] in _defines(module)
    return True


def stale_names(texts: Iterable[Text], root: Path) -> list[str]:
    """Each bare file name (`runner.py`) that names no file in the repository (a Python file's
    comment may name one beside it or anywhere), and each dotted name (`qeval.run.runner`) that
    is neither a qeval module nor a name one defines."""
    files = repo_files(root)
    bad = []
    for t in texts:
        for m in _BARE.finditer(t.text):
            if m.group(1) not in files and m.group(1) not in UPSTREAM:
                bad.append(f"{t.file}:{t.line_of(m.start())}: {m.group(1)}")
        for m in _DOTTED.finditer(t.text):
            name = m.group(1).rstrip(".")
            if name not in NOT_MODULES and not module_exists(root, name):
                bad.append(f"{t.file}:{t.line_of(m.start())}: {name}")
    return bad


# --- a3. docs/architecture.md §2 lists every module ------------------------------------------

_CELL_TOKEN = re.compile(r"`([^`\n]+)`|\(|\)")


def listed_modules(md: str) -> set[str]:
    """The repo-relative paths of the files and folders §2's table names. A row's first cell
    names its package (`qeval/files/`, or files of `qeval/`); a name in the second cell is in
    that package, and a name inside the parentheses that follow a folder (`hf/` (`perf.py`))
    is in that folder."""
    m = re.search(r"^## §2 .*?(?=^## )", md, re.M | re.S)
    assert m, "docs/architecture.md has no §2"
    named: set[str] = set()
    for row in m.group(0).splitlines():
        cells = row.split(" | ")
        if not row.startswith("| `qeval") or len(cells) < 2:
            continue
        first = re.findall(r"`([^`]+)`", cells[0])
        base = first[0] if first[0].endswith("/") else "qeval/"
        named |= {base + f.removeprefix(base) for f in first}
        stack = [base]
        previous: re.Match[str] | None = None
        text = " | ".join(cells[1:])
        for tok in _CELL_TOKEN.finditer(text):
            if tok.group(0) == "(":
                follows_folder = (
                    previous is not None
                    and previous.group(1) is not None
                    and previous.group(1).endswith("/")
                    and not text[previous.end() : tok.start()].strip()
                )
                stack.append(stack[-1] + previous.group(1) if follows_folder and previous else stack[-1])
            elif tok.group(0) == ")":
                if len(stack) > 1:
                    stack.pop()
            elif re.fullmatch(r"[\w/]+(\.py|/)", tok.group(1)):
                named.add(stack[-1] + tok.group(1))
            previous = tok
    return named


def module_listing(root: Path) -> tuple[list[str], list[str]]:
    """(modules of qeval/ that §2 does not name, names in §2 that are no module or folder).
    Packages' `__init__.py` files need not be named."""
    named = listed_modules((root / "docs" / "architecture.md").read_text(encoding="utf-8"))
    files = {p.relative_to(root).as_posix() for p in (root / "qeval").rglob("*.py")}
    unnamed = sorted(f for f in files if f not in named and not f.endswith("/__init__.py"))
    absent = sorted(n for n in named if n not in files and not (n.endswith("/") and (root / n).is_dir()))
    return unnamed, absent


# --- b. `§N` sections -------------------------------------------------------------------------

#: a numbered heading: `## §2 The packages` or `## 2. The packages`
_HEADING = re.compile(r"^#{1,6}[ \t]+(?:§[ \t]*(\d+)|(\d+)\.)[ \t]", re.M)
#: `docs/architecture.md §2`, `[architecture.md](architecture.md) §2`, or a bare `§2`
_SECTION_REF = re.compile(r"(?:(?P<doc>[\w./-]*[\w-]\.md)[`\])]*[ \t]*)?§(?P<n>\d+)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _blank_fences(md: str) -> str:
    """The page with its fenced code blocks blanked, line count kept."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), md)


def sections(md: str) -> set[str]:
    return {a or b for a, b in _HEADING.findall(_blank_fences(md))}


def bad_sections(texts: Iterable[Text], root: Path) -> list[str]:
    """A `§N` names section N of the page it follows; a bare `§N` names a section of its own page
    in docs/, and elsewhere (code, README) one of docs/architecture.md, which code cites so."""
    cache: dict[Path, set[str] | None] = {}
    bad = []
    for t in texts:
        here = (root / t.file).parent
        for m in _SECTION_REF.finditer(t.text):
            doc = m.group("doc")
            if doc is None:
                page = root / t.file if t.markdown and t.file.startswith("docs/") else root / "docs/architecture.md"
            else:
                page = root / doc if "/" in doc and (root / doc).is_file() else here / doc
            page = page.resolve()
            if page not in cache:
                cache[page] = sections(page.read_text(encoding="utf-8")) if page.is_file() else None
            found = cache[page]
            where = page.relative_to(root.resolve()) if page.is_relative_to(root.resolve()) else page
            if found is None:
                bad.append(f"{t.file}:{t.line_of(m.start())}: §{m.group('n')} of {doc}: no such page")
            elif m.group("n") not in found:
                bad.append(
                    f"{t.file}:{t.line_of(m.start())}: §{m.group('n')}: {where} has no such section"
                    f" (it has {', '.join('§' + s for s in sorted(found, key=int))})"
                )
    return bad


# --- c. options of `qeval` command lines ------------------------------------------------------

#: `qeval run`, `.venv/bin/qeval plan`, `X=1 qeval tasks`, as a command: at the start of the code or
#: after `&&`, `;`, `|` or `$(`; not `qeval.load_run`, `qeval/cli.py` or `ruff check qeval tests`
_COMMAND = re.compile(r"(?:^|&&|;|\||\$\()[ \t]*(?:\w+=\S*[ \t]+)*(?:\S*/)?qeval[ \t\n]+([a-z][\w-]*)", re.M)
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_SPAN = re.compile(r"`((?:[^`\n]|\n(?![ \t]*\n))+)`")  # an inline code span, within a paragraph


def command_lines(md: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each piece of code in a Markdown page that may hold a command line: each
    line of a fenced block (with its continuation lines, `  [--opt ...]`, and without its
    `# comment`), and each inline code span."""
    for m in _FENCE.finditer(md):
        first = md.count("\n", 0, m.start()) + 1
        block = m.group(0).split("\n")
        merged: list[tuple[int, str]] = []
        for i, raw in enumerate(block[1:-1], start=first + 1):
            code = re.sub(r"(^|[ \t])#.*", "", raw)
            if merged and re.match(r"[ \t]+[\[-]", code):
                merged[-1] = (merged[-1][0], merged[-1][1] + "\n" + code)
            else:
                merged.append((i, code))
        yield from merged
    prose = _blank_fences(md)
    for m in _SPAN.finditer(prose):
        yield prose.count("\n", 0, m.start()) + 1, m.group(1)


def bad_options(texts: Iterable[Text], cli: Any) -> list[str]:
    """Each `--option` after `qeval SUBCOMMAND` in a Markdown page's code must be one the
    subcommand accepts (its params' opts and secondary opts, or --help)."""
    bad = []
    for t in texts:
        if not t.markdown:
            continue
        for line, code in command_lines(t.text):
            commands = list(_COMMAND.finditer(code))
            for k, m in enumerate(commands):
                name = m.group(1)
                end = commands[k + 1].start() if k + 1 < len(commands) else len(code)
                rest = re.split(r"&&|\|\||;|\|(?![\w-])", code[m.end() : end])[0]
                cmd = cli.commands.get(name)
                if cmd is None:
                    where = t.line + line - 1 + code.count("\n", 0, m.start())
                    bad.append(f"{t.file}:{where}: qeval {name}: no such command")
                    continue
                accepted = {"--help"} | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
                for opt in _OPTION.finditer(rest):
                    if opt.group(0) not in accepted:
                        where = t.line + line - 1 + code.count("\n", 0, m.end() + opt.start())
                        bad.append(f"{t.file}:{where}: qeval {name} {opt.group(0)}: no such option")
    return bad


def _cli() -> Any:
    """qeval's command group (typer's click group: `.commands`, each with `.params`)."""
    import typer.main

    from qeval.cli import app

    return typer.main.get_command(app)


# --- the checks on this repository ------------------------------------------------------------


@pytest.fixture(scope="module")
def texts() -> list[Text]:
    return all_texts(ROOT)


def _report(what: str, found: list[str]) -> str:
    return f"{len(found)} {what}:\n" + "\n".join(found)


def test_cited_paths_exist(texts: list[Text]) -> None:
    missing = missing_paths(texts, ROOT, allowed=EXAMPLES)
    assert not missing, _report("cited paths that do not exist (file:line: path)", missing)


def test_cited_names_exist(texts: list[Text]) -> None:
    stale = stale_names(texts, ROOT)
    assert not stale, _report("bare file names or dotted module names that name nothing (file:line: name)", stale)


def test_architecture_lists_every_module() -> None:
    unnamed, absent = module_listing(ROOT)
    assert not unnamed, _report("modules docs/architecture.md §2 does not name", unnamed)
    assert not absent, _report("names in docs/architecture.md §2 that are no module", absent)


def test_section_references_exist(texts: list[Text]) -> None:
    bad = bad_sections(texts, ROOT)
    assert not bad, _report("§ references to sections that do not exist", bad)


def test_command_line_options_exist(texts: list[Text]) -> None:
    bad = bad_options(texts, _cli())
    assert not bad, _report("options the docs show that the command does not take", bad)


def test_readme_is_short_and_opens_with_the_two_commands() -> None:
    """README.md stays within 12,000 bytes (the detail lives in docs/) and its first code block is
    `make run` and `make test`."""
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 12_000, f"README.md is {len(readme):,} bytes: move detail into docs/"
    first = _FENCE.search(readme.decode())
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(0).splitlines()[1:-1]]
    assert commands == ["make run", "make test"], commands


def test_stable_surface_lists_every_option() -> None:
    """docs/architecture.md §7 (the stable surface) names every option of every command."""
    page = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    m = re.search(r"^## §7 .*?(?=^## |\Z)", page, re.M | re.S)
    assert m, "docs/architecture.md has no §7"
    listed: dict[str, set[str]] = {}
    for _, code in command_lines(m.group(0)):
        commands = list(_COMMAND.finditer(code))
        for k, c in enumerate(commands):
            end = commands[k + 1].start() if k + 1 < len(commands) else len(code)
            listed.setdefault(c.group(1), set()).update(_OPTION.findall(code[c.end() : end]))
    unlisted = [
        f"qeval {name} {p.opts[0]}"
        for name, cmd in _cli().commands.items()
        for p in cmd.params
        if p.opts[0].startswith("--") and p.opts[0] not in listed.get(name, ())
    ]
    assert not unlisted, _report("options missing from docs/architecture.md §7", unlisted)


# --- each checker reports what is wrong -------------------------------------------------------


def _fake_repo(tmp_path: Path) -> Path:
    (tmp_path / "qeval" / "run").mkdir(parents=True)
    (tmp_path / "qeval" / "run" / "store.py").write_text('"""The store (docs/architecture.md §1)."""\n')
    (tmp_path / "qeval" / "run" / "keys.py").write_text(
        '"""Keys: qeval/run/gone.py and docs/architecture.md §9."""\n\n\ndef f():  # see tests/nowhere.py\n'
        '    """From qeval/run/store.py::f, qeval/run/store.py:12."""\n'
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text(
        "# Architecture\n\n## §1 The data flow\n\nAs §1 says; §3 does not exist. [x](gone.md), [r](../README.md),"
        " [w](https://example.com/x.md), [s](#1-the-data-flow).\n\n"
        "## 2. The packages\n\n```\n## 4. in a code block is no heading\n```\n"
    )
    (tmp_path / ".gitignore").write_text("models/big/\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.yaml").write_text("name: x\n")
    (tmp_path / "README.md").write_text(
        "# x\n\nSee `qeval/run/store.py`, qeval/run/missing.py, [a](docs/nope.md), `tests/test_*.py`,\n"
        "`qeval/<name>/` and models/big/config.json (generated), RUN_DIR/models/x.\n\n"
        "docs/architecture.md §2 and [architecture.md](docs/architecture.md) §5, and §4.\n\n"
        "```bash\nqeval run configs/x.yaml --output DIR --frobnicate  # not --commented\n"
        "qeval plan --model M\n      [--gpu-gib 24 --bogus]\n```\n\n"
        "Or `qeval run\n--no-performance --limt 5`, `qeval report RUN_DIR` and `qeval frob`.\n"
        "`ruff check qeval tests`, `make x && HF_HUB_OFFLINE=1 .venv/bin/qeval tasks --nope`.\n"
        "`python -m qeval.run.keys` and `python -m qeval.run.absent`.\n"
        "`keys.py`, `runner.py`, qeval.run.keys.f(), qeval.run.keys.g and `qeval.run.runner`.\n"
    )
    return tmp_path


def test_missing_paths_are_each_reported(tmp_path: Path) -> None:
    root = _fake_repo(tmp_path)
    found = missing_paths(all_texts(root), root)
    assert found == [
        "README.md:3: qeval/run/missing.py",
        "README.md:3: docs/nope.md",
        "README.md:3: tests/test_*.py",
        "README.md:17: qeval/run/absent.py",
        "docs/architecture.md:5: docs/gone.md",
        "qeval/run/keys.py:1: qeval/run/gone.py",
        "qeval/run/keys.py:4: tests/nowhere.py",
    ]
    assert missing_paths(all_texts(root), root, allowed={"qeval/run/gone.py"}) == [
        x for x in found if "gone.py" not in x
    ]


def test_stale_names_are_each_reported(tmp_path: Path) -> None:
    root = _fake_repo(tmp_path)
    assert stale_names(all_texts(root), root) == [
        "README.md:18: runner.py",
        "README.md:17: qeval.run.absent",
        "README.md:18: qeval.run.keys.g",
        "README.md:18: qeval.run.runner",
    ]


def test_module_listing_is_checked(tmp_path: Path) -> None:
    """A module §2 does not name and a name that is no module are each reported; a name inside
    the parentheses after a folder is in that folder."""
    for f in (
        "qeval/errors.py",
        "qeval/run/__init__.py",
        "qeval/run/runner.py",
        "qeval/run/hf/perf.py",
        "qeval/run/hf/backend.py",
        "qeval/run/worker.py",
    ):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text(
        "## §2 The packages\n\n| package | one job |\n| --- | --- |\n| `qeval/errors.py` | the error |\n"
        "| `qeval/run/` | the run (`runner.py`), `hf/` (the engine: `perf.py` (its measurement), `gone.py`),"
        " `worker.py` |\n\n## §3 Next\n"
    )
    assert module_listing(tmp_path) == (["qeval/run/hf/backend.py"], ["qeval/run/hf/gone.py"])


def test_bad_sections_are_each_reported(tmp_path: Path) -> None:
    root = _fake_repo(tmp_path)
    found = bad_sections(all_texts(root), root)
    assert [x.split(" (it has")[0] for x in found] == [
        "README.md:6: §5: docs/architecture.md has no such section",
        "README.md:6: §4: docs/architecture.md has no such section",
        "docs/architecture.md:5: §3: docs/architecture.md has no such section",
        "qeval/run/keys.py:1: §9: docs/architecture.md has no such section",
    ]
    assert found[0].endswith("(it has §1, §2)")


def test_unknown_options_are_each_reported(tmp_path: Path) -> None:
    root = _fake_repo(tmp_path)
    assert bad_options(all_texts(root), _cli()) == [
        "README.md:9: qeval run --frobnicate: no such option",
        "README.md:11: qeval plan --bogus: no such option",
        "README.md:15: qeval run --limt: no such option",
        "README.md:15: qeval frob: no such command",
        "README.md:16: qeval tasks --nope: no such option",
    ]


def test_ignored_paths() -> None:
    patterns = ["__pycache__/", "/build/", "models/smollm2-135m/", "*.egg-info/"]
    assert _ignored("models/smollm2-135m/config.json", patterns)
    assert _ignored("qeval/__pycache__/x.pyc", patterns)
    assert _ignored("qeval.egg-info/", patterns)
    assert not _ignored("qeval/build/x.py", patterns)
    assert not _ignored("models/qeval-tiny/config.json", patterns)
