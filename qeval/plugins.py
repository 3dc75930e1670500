"""The one plugin loader behind qeval's registries (backends, task kinds): a `module:attribute`
reference imported and checked to be the registry's entry type, or one user error naming it."""

from __future__ import annotations

import importlib
from typing import TypeVar

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
