"""YAML loading for configs and task files: duplicate keys refused (PyYAML silently keeps the
last one), and bounded, because a YAML file is untrusted input.

Two bounds: the file's size, and the size of the document once aliases are expanded. An
alias costs nothing to parse (PyYAML shares the object), but everything downstream that walks
the document (the resume key's JSON dump, pydantic validation) expands it: nine levels of
nine aliases ("billion laughs") are 387 million nodes, and took the whole machine's memory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from qeval.errors import UserError

#: a config or task YAML larger than this is not a config (data belongs in data_files)
MAX_YAML_BYTES = 4 * 2**20
#: nodes of the document with every alias expanded; the largest shipped file has a few hundred
MAX_YAML_NODES = 200_000


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def expanded_size(obj: Any, limit: int = MAX_YAML_NODES) -> int:
    """Nodes of `obj` with shared (aliased) sub-objects counted once per use, computed in time
    proportional to the *distinct* objects; stops counting past `limit`."""
    memo: dict[int, int] = {}

    def size(o: Any) -> int:
        if isinstance(o, dict):
            children = [*o.keys(), *o.values()]
        elif isinstance(o, list):
            children = o
        else:
            return 1
        if id(o) in memo:
            return memo[id(o)]
        memo[id(o)] = limit + 1  # a cycle (a recursive alias) counts as too big
        total = 1
        for child in children:
            total += size(child)
            if total > limit:
                break
        memo[id(o)] = total
        return total

    return size(obj)


def load_yaml(path: Path) -> Any:
    """Parse a YAML file; a syntax error, duplicate key, non-UTF-8 byte, number of thousands of
    digits or oversized document becomes a one-line UserError."""
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise UserError(
            f"{path}: {path.stat().st_size:,} bytes, over the {MAX_YAML_BYTES:,}-byte limit for a YAML file"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{path}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise UserError(f"{path}: YAML nested too deeply") from None
    except ValueError:  # Python's int-max-str-digits, raised by PyYAML's int(): not a YAMLError
        raise UserError(
            f"{path}: invalid YAML: a number of more than {sys.get_int_max_str_digits():,} digits"
        ) from None
    if expanded_size(doc) > MAX_YAML_NODES:
        raise UserError(
            f"{path}: YAML expands to more than {MAX_YAML_NODES:,} nodes once its aliases are expanded (an alias bomb?)"
        )
    return doc
