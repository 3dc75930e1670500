"""Task templates (`doc_to_text`, `doc_to_target`, `doc_to_choice`) rendered in a sandbox.

Templates come from task files, which are untrusted: jinja2's ImmutableSandboxedEnvironment
refuses attribute access to internals (`cycler.__init__.__globals__.os`) and calls that
mutate, and qeval bounds `*` and `**` on top. (lm-evaluation-harness renders its own task
templates with a plain Environment; qeval's are not.)
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

_MAX_RENDERED = 1_000_000  # characters: a template that builds more is refused, not rendered


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox, plus a bound on `*` and `**`: `{{ 'a' * 10**10 }}` would otherwise try to
    allocate 10 GB while validating a task file."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise SecurityError("exponent too large")
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > _MAX_RENDERED:
                raise SecurityError("repetition too large")
        return super().call_binop(context, operator, left, right)


def sandbox_environment() -> jinja2.Environment:
    """A sandboxed Environment with qeval's bounds (also swapped into lm-eval's renderer)."""
    return _Sandbox(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


_JINJA = sandbox_environment()


def render(template: str, doc: dict[str, Any]) -> str:
    """A document field (when `template` names one, as lm-eval allows) or the rendered template."""
    if template in doc:
        return str(doc[template])
    return _compiled(template).render(**doc)


@lru_cache(maxsize=512)
def _compiled(template: str) -> jinja2.Template:
    """Compiling a template costs far more than rendering it: once per distinct template."""
    return _JINJA.from_string(template)
