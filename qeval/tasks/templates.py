"""Task templates (`doc_to_text`, `doc_to_target`, `doc_to_choice`) rendered in a sandbox.

Templates come from task files, which are untrusted: jinja2's ImmutableSandboxedEnvironment
refuses attribute access to internals (`cycler.__init__.__globals__.os`) and calls that
mutate. qeval bounds what a template may build on top, at three depths:

- before an operation allocates: `*` and `**`, printf widths (`'%0100000000d' % a`, the
  `format` filter, `str.format`), and a width past the bound to a padding method or filter
  (`'a'|center(100000000)`) are refused;
- while rendering: the output is streamed and refused past `_MAX_RENDERED` characters
  (nested `range` loops), past `_MAX_ITERATIONS` range() items (loops that print nothing),
  and past `_MAX_SECONDS` (a SIGALRM timer in the main thread; elsewhere at each output piece);
- every Template this environment makes renders that way, lm-eval's included, and so does a
  model's own chat template, compiled in an overlay of transformers' sandbox (`bounded_overlay`,
  qeval/tasks/chat.py).

(lm-evaluation-harness renders its own task templates with a plain Environment; qeval's are not.)
"""

from __future__ import annotations

import functools
import re
import signal
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment, SecurityError

_MAX_RENDERED = 1_000_000  # characters: a template that builds more is refused, not rendered
_MAX_SECONDS = 5.0  # per render: a prompt template takes microseconds
#: a printf (`%08d`) or format-spec (`{:>8}`) width or precision
_PRINTF_WIDTH = re.compile(r"%[-+ #0*]*(\d+)(?:\.(\d+))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*:[^{}]*?(\d+)(?:\.(\d+))?[^{}]*\}")


def _check_widths(fmt: object, pattern: re.Pattern[str]) -> None:
    if isinstance(fmt, str):
        for match in pattern.finditer(fmt):
            if any(g and int(g) > _MAX_RENDERED for g in match.groups()):
                raise SecurityError("format width too large")


#: str methods and filters whose integer arguments are output widths: a width past the output
#: bound only ever builds an oversized string (other integers, a 7-digit sum, pass as they are)
_WIDTH_TAKERS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "indent", "wordwrap", "do_center",
                           "do_indent", "do_wordwrap", "do_truncate", "truncate", "do_batch", "do_slice"})


def _check_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if name not in _WIDTH_TAKERS:
        return
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_RENDERED:
            raise SecurityError("width argument too large")


def _bounded(result: Any) -> Any:
    if isinstance(result, (str, list, tuple)) and len(result) > _MAX_RENDERED:
        raise SecurityError("result too large")
    return result


def _bounded_filter(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _check_args(f.__name__, args[1:], kwargs)  # args[0]: the filtered value (or the context)
        if f.__name__ == "do_format" and args:
            _check_widths(next((a for a in args if isinstance(a, str)), None), _PRINTF_WIDTH)
        return _bounded(f(*args, **kwargs))

    return wrapper


_MAX_ITERATIONS = 1_000_000  # range() items per render, nested loops together
_iterations = threading.local()


def _counted_range(*args: int) -> range:
    """`range` in a template: a real range, whose length counts against the render's budget when
    it is made, so nested loops that print nothing cannot spin for hours (an inner range is made
    once per outer item)."""
    r = range(*args)
    _iterations.n = getattr(_iterations, "n", 0) + len(r)
    if _iterations.n > _MAX_ITERATIONS:
        raise SecurityError(f"the template makes more than {_MAX_ITERATIONS:,} range() items")
    return r


class _Alarm:
    """A wall-clock bound on one render where it can interrupt anything (the main thread of a
    Unix process, where qeval validates and scores): loops over a long string, `lipsum(10**6)`
    or a tower of `**` produce no output to check between. Elsewhere the streamed check alone."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.armed = seconds, False
        self.previous: Any = None

    def __enter__(self) -> _Alarm:
        if (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
                and signal.getitimer(signal.ITIMER_REAL)[0] == 0):  # never displace a caller's alarm
            self.previous = signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self.armed = True
        return self

    def _expired(self, signum: int, frame: Any) -> None:
        raise SecurityError(f"rendering took over {self.seconds:g} s")

    def __exit__(self, *exc: object) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


class _BoundedTemplate(jinja2.Template):
    """Renders by streaming, refused past `_MAX_RENDERED` characters or `_MAX_SECONDS`."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        deadline = time.monotonic() + _MAX_SECONDS
        _iterations.n = 0
        out: list[str] = []
        size = 0
        with _Alarm(_MAX_SECONDS):
            for piece in self.generate(*args, **kwargs):
                size += len(piece)
                if size > _MAX_RENDERED:
                    raise SecurityError(f"the rendered text exceeds {_MAX_RENDERED:,} characters")
                if time.monotonic() > deadline:
                    raise SecurityError(f"rendering took over {_MAX_SECONDS:g} s")
                out.append(piece)
        return "".join(out)


class _Bounds(SandboxedEnvironment):
    """The bounds on what a template may build (the module docstring), on top of a sandbox:
    `{{ 'a' * 10**10 }}` would otherwise try to allocate 10 GB while validating a task file.
    Intercepting the operators also keeps jinja from folding them at compile time (`7**10**9`
    would hang there)."""

    intercepted_binops = frozenset(["*", "**", "%"])
    template_class = _BoundedTemplate

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise SecurityError("exponent too large")
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > _MAX_RENDERED:
                raise SecurityError("repetition too large")
        if operator == "%":
            _check_widths(left, _PRINTF_WIDTH)
        return _bounded(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
        # jinja wraps str.format in its own safe formatter; the string is the wrapped method's
        method = getattr(__obj, "__wrapped__", __obj)
        _check_args(getattr(method, "__name__", ""), args, kwargs)
        if getattr(method, "__name__", None) in ("format", "format_map"):
            _check_widths(getattr(method, "__self__", None), _FORMAT_WIDTH)
        return _bounded(super().call(__context, __obj, *args, **kwargs))


class _Sandbox(_Bounds, ImmutableSandboxedEnvironment):
    """qeval's own sandbox for task templates: jinja's immutable sandbox with the bounds."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters = {name: _bounded_filter(f) for name, f in self.filters.items()}
        self.globals["range"] = _counted_range


def bounded_overlay(env: SandboxedEnvironment) -> SandboxedEnvironment:
    """An overlay of another library's sandboxed `env` (transformers' chat templates: its
    filters, globals and extensions kept) with qeval's bounds: its operators and calls checked
    before they allocate, its filters bounded, `range` counted, its templates rendered by
    streaming. `env` itself is left as it was."""
    out = env.overlay()
    out.__class__ = type(f"Bounded{type(env).__name__}", (_Bounds, type(env)), {})
    out.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    out.globals = dict(env.globals) | {"range": _counted_range}
    return out


def sandbox_environment() -> jinja2.Environment:
    """A sandboxed Environment with qeval's bounds (also swapped into lm-eval's renderer;
    filters added to it later are bounded by the streamed output alone)."""
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
