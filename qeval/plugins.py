"""The one plugin loader behind qeval's registries (backends, task kinds): a `module:attribute`
reference imported and checked to be the registry's entry type, or one user error naming it."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Protocol, TypeVar

from qeval.errors import UserError

T = TypeVar("T")


def load_entry(ref: str, what: str, default_attr: str, cls: type[T]) -> T:
    """The object `ref` (`module` or `module:attribute`, `default_attr` when none) names, if it is
    a `cls`; otherwise one line: `what ref: cannot be loaded (...)` or `is a X, not a cls`."""
    module, _, attr = ref.partition(":")
    try:
        entry = getattr(importlib.import_module(module), attr or default_attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"{what} {ref}: cannot be loaded ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry, cls):
        raise UserError(f"{what} {ref}: is a {type(entry).__name__}, not a {cls.__module__}.{cls.__qualname__}")
    return entry


class Named(Protocol):
    """A registry entry: each has the name it is found by."""

    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


def load_registry(
    built_in: Sequence[str], group: str, env: str, what: str, default_attr: str, cls: type[E]
) -> dict[str, E]:
    """A registry's entries by name, in order: `built_in`'s references, then the installed
    packages' entry points of `group`, then `env`'s (`module:attribute`, comma-separated). One
    reference named twice loads once; two entries of one name are one user error."""
    refs = list(built_in)
    refs += [f"{ep.module}:{ep.attr}" for ep in entry_points(group=group)]
    refs += [r.strip() for r in env.split(",") if r.strip()]
    entries: dict[str, E] = {}
    for ref in dict.fromkeys(refs):
        entry = load_entry(ref, what, default_attr, cls)
        if entry.name in entries and entries[entry.name] is not entry:
            raise UserError(f"{what} {entry.name!r} is registered twice ({ref})")
        entries[entry.name] = entry
    return entries
