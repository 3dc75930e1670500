"""Task templates (`doc_to_text`, `doc_to_target`, `doc_to_choice`) rendered in a sandbox.

Templates come from task files, which are untrusted: jinja2's ImmutableSandboxedEnvironment
refuses attribute access to internals (`cycler.__init__.__globals__.os`) and calls that
mutate. qeval bounds what a template may build on top, at three depths:

- before an operation allocates: `*` and `**`, printf widths and precisions (`'%0100000000d' % a`,
  `'%*d' % (n, a)`, the `format` filter, `str.format` and `format_map`, a nested `{:>{}}` taking
  its width from an argument), a width past the bound to a padding method or filter
  (`'a'|center(100000000)`), and what `replace`, `join`, `indent`, `expandtabs` and `translate`
  would build (computed from their arguments) are refused;
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
import string
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment, SecurityError

_MAX_RENDERED = 1_000_000  # characters: a template that builds more is refused, not rendered
_MAX_SECONDS = 5.0  # per render: a prompt template takes microseconds
#: a printf conversion: its mapping key, width and precision (`*`: taken from the operand), and
#: its type (`%%` is a literal percent sign)
_PRINTF_SPEC = re.compile(r"%(\([^()]*\))?[-+ #0]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.DOTALL)
#: the digits of a format spec (`{:>8}`, `{:.3f}`)
_DIGITS = re.compile(r"\d+")
#: a format field's name: its first part, then `[index]` parts (attribute parts are not followed)
_FIELD = re.compile(r"([^.\[]*)((?:\[[^\]]*\])*)")


def _too_wide(value: object) -> bool:
    """An integer, or a string of digits, past the output bound: a width or precision that only
    ever builds an oversized string. Never converts more than 18 digits (a 5,000-digit string
    would be Python's int-max-str-digits ValueError)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > _MAX_RENDERED
    if isinstance(value, str):
        digits = value.strip().lstrip("+-")
        return digits.isdigit() and (len(digits) > 18 or int(digits) > _MAX_RENDERED)
    return False


def _width(value: object) -> int:
    """A width or precision's size (a field builds at least this many characters); 0 where it is
    not a plain number (a nested field's value, say: bounded on its own)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return abs(value)
    if isinstance(value, str):
        digits = value.strip().lstrip("+-")
        return int(digits) if digits.isdigit() and len(digits) <= 18 else 0
    return 0


class _Widths:
    """The widths of a format's fields added up: each field may be under the bound while their sum,
    the string the format builds (`'%999999d' * 80000`), is far past it."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, value: object) -> None:
        if _too_wide(value):
            raise SecurityError("format width too large")
        self.total += _width(value)
        if self.total > _MAX_RENDERED:
            raise SecurityError(f"format widths add up to more than {_MAX_RENDERED:,} characters")


def _any_too_wide(values: object) -> bool:
    """Whether `values` (a call's arguments: nested lists, tuples and dicts) hold a width past the
    bound anywhere: where a field's value cannot be followed, any of them might be its width."""
    stack, seen = [values], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > _MAX_RENDERED:
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif _too_wide(v):
            return True
    return False


def _check_printf(fmt: object, operand: object) -> None:
    """Refuse `fmt % operand` (or `fmt|format(...)`) whose width or precision is past the bound:
    written in the format (`%0100000000d`, `%(a)100000000s`), or taken from the operand by a `*`
    (`'%*d' % (width, value)`: the arguments are consumed in order, as printf consumes them)."""
    if not isinstance(fmt, str) or "%" not in fmt:
        return
    values = list(operand) if isinstance(operand, tuple) else [operand]
    at, widths = 0, _Widths()
    for match in _PRINTF_SPEC.finditer(fmt):
        key, width, precision, kind = match.groups()
        if kind == "%" and key is None and width is None and precision is None:
            continue  # `%%`
        for part in (width, precision):
            if part == "*":
                if at < len(values):
                    widths.add(values[at])
                at += 1
            elif part:
                widths.add(part)
        at += key is None


def _check_format(fmt: object, args: tuple[Any, ...], kwargs: Any) -> None:
    """Refuse `fmt.format(*args, **kwargs)` (or `fmt.format_map(kwargs)`) whose width or
    precision is past the bound: written in a field's spec (`{:>100000000}`), or taken from an
    argument by a nested field (`{:>{}}`, `{:.{w}f}`, `{0:{1[0]}}`), numbered as str.format
    numbers them."""
    if not isinstance(fmt, str) or "{" not in fmt:
        return
    auto, widths = 0, _Widths()

    def value(name: str) -> tuple[bool, Any]:
        """(whether the field could be followed, its value)."""
        nonlocal auto
        match = _FIELD.fullmatch(name)
        if match is None:  # an attribute (`{0.x}`): not followed, as the sandbox decides on it
            return False, None
        first, rest = match.groups()
        if first == "":
            first, auto = str(auto), auto + 1
        try:
            obj = args[int(first)] if first.isdigit() and len(first) < 19 else kwargs[first]
            for index in re.findall(r"\[([^\]]*)\]", rest):
                obj = obj[int(index)] if index.isdigit() and len(index) < 19 else obj[index]
        except (LookupError, TypeError):  # str.format refuses it itself
            return True, None
        return True, obj

    def walk(text: str, depth: int) -> None:
        nonlocal auto
        try:
            fields = list(string.Formatter().parse(text))
        except ValueError:  # malformed: str.format refuses it itself
            return
        for _, name, spec, _ in fields:
            if name is None:
                continue
            if depth:  # a nested field: its value is written into the enclosing spec
                known, obj = value(name)
                if not known and _any_too_wide((args, kwargs)):
                    raise SecurityError("format width too large")
                widths.add(obj)
            elif name == "" or name.startswith(("[", ".")):
                auto += 1
            for digits in _DIGITS.findall(spec or ""):
                widths.add(digits)
            if spec and "{" in spec and depth < 3:
                walk(spec, depth + 1)

    walk(fmt, 0)


#: str methods and filters whose integer arguments are output widths: a width past the output
#: bound only ever builds an oversized string (other integers, a 7-digit sum, pass as they are)
_WIDTH_TAKERS = frozenset(
    {
        "center",
        "ljust",
        "rjust",
        "zfill",
        "expandtabs",
        "indent",
        "wordwrap",
        "do_center",
        "do_indent",
        "do_wordwrap",
        "do_truncate",
        "truncate",
        "do_batch",
        "do_slice",
    }
)


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


#: the largest integer a template may build, in bits (about 30,000 digits): arithmetic on larger
#: ones runs in C for as long as it takes, where no timer interrupts it
_MAX_INT_BITS = 100_000


def _size(value: Any) -> int:
    """About how many characters `value` prints as, counted without building it: a list counts
    each item as often as it holds it (`[a, a, a, a]` nested ten deep is 4**10 copies of `a`),
    each distinct object walked once; saturates just past `_MAX_RENDERED`."""
    cap = _MAX_RENDERED + 1
    memo: dict[int, int] = {}
    alive: list[Any] = []  # keeps every walked object, so no id() is reused while walking
    stack: list[tuple[Any, list[Any] | None]] = [(value, None)]
    while stack:
        v, kids = stack.pop()
        if kids is not None:  # its items are counted: the container itself
            memo[id(v)] = min(cap, 2 * len(kids) + 2 + sum(memo.get(id(k), 1) for k in kids))
        elif id(v) in memo:
            continue
        elif isinstance(v, (str, bytes)):
            memo[id(v)] = len(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            memo[id(v)] = v.bit_length() * 3 // 10 + 1
        elif isinstance(v, (list, tuple, set, frozenset, dict)):
            kids = [*v.keys(), *v.values()] if isinstance(v, dict) else list(v)
            alive.append((v, kids))
            stack.append((v, kids))
            stack.extend((k, None) for k in kids if id(k) not in memo)
        else:
            memo[id(v)] = 1
    return memo.get(id(value), 1)


def _check_sizes(name: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call (a str method on `target`, a filter, a macro) whose arguments, or what it
    would build from them, are past the output bound: what multiplies (`s.replace('', s)`,
    `items|join(s)`, `s|indent(n)` over many lines) is estimated before it is built, and a
    macro called on an oversized value (doubling its argument at each recursion) never runs."""
    values = [target, *args, *kwargs.values()]
    if any(_size(v) > _MAX_RENDERED for v in values if isinstance(v, (str, bytes, list, tuple, dict, set, int))):
        raise SecurityError("an argument too large")
    name = name.removeprefix("do_")
    strings = [v for v in values if isinstance(v, str)]
    grown = 0
    if name == "replace" and len(strings) >= 3:  # (s, old, new): the method's target, or the filter's value
        text, old, new = strings[:3]
        grown = len(text) + (text.count(old) if old else len(text) + 1) * max(0, len(new) - len(old))
    elif name == "join":  # sep.join(items), or items|join(sep)
        items = (
            args[0]
            if isinstance(target, str) and args
            else next((v for v in values if isinstance(v, (list, tuple))), None)
        )
        sep = target if isinstance(target, str) else next(iter(strings), kwargs.get("d", ""))
        if isinstance(items, (list, tuple)) and isinstance(sep, str):
            grown = _size(items) + len(sep) * len(items)
    elif name == "indent" and strings:
        width = next((v for v in (*args, *kwargs.values()) if isinstance(v, (int, str)) and v is not strings[0]), 4)
        grown = len(strings[0]) + (strings[0].count("\n") + 1) * (
            len(width) if isinstance(width, str) else abs(int(width))
        )
    elif name == "expandtabs" and isinstance(target, str):  # each tab becomes at most tabsize spaces
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            grown = len(target) + target.count("\t") * max(size, 0)
    elif name == "translate" and isinstance(target, str) and args:  # each character becomes its table entry
        grown = sum(n * _translated(args[0], ch) for ch, n in Counter(target).items())
    if grown > _MAX_RENDERED:
        raise SecurityError(f"{name} would build more than {_MAX_RENDERED:,} characters")


def _translated(table: Any, ch: str) -> int:
    """The characters `ch` becomes under str.translate's `table`."""
    try:
        value = table[ord(ch)]
    except (LookupError, TypeError):
        return 1
    return len(value) if isinstance(value, str) else 0 if value is None else 1


def _bounded_filter(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _check_args(f.__name__, args[1:], kwargs)  # args[0]: the filtered value (or the context)
        _check_sizes(f.__name__, None, args, kwargs)
        if f.__name__ == "do_format" and args:  # value|format(*args, **kwargs): value % (kwargs or args)
            _check_printf(args[0], kwargs or tuple(args[1:]))
        return _bounded(f(*args, **kwargs))

    return wrapper


def _finalize(value: Any) -> Any:
    """Every value a template prints passes here, also inside a macro or a `{% set %}` block,
    whose output is built before anything streams: counted against the render's output bound
    before it is turned into text."""
    if getattr(_iterations, "rendering", False):
        _iterations.printed = getattr(_iterations, "printed", 0) + _size(value)
        if _iterations.printed > _MAX_RENDERED:
            raise SecurityError(
                f"the template prints more than {_MAX_RENDERED:,} characters (macros and blocks included)"
            )
    return value


def _bounded_namespace(cls: Any) -> type:
    """`namespace()` whose attributes a template sets (`{% set ns.s = ns.s ~ ns.s %}` in a loop
    doubles a string each time, with no call or operator to check) hold no oversized value."""
    setitem = cls.__setitem__

    def __setitem__(self: Any, name: str, value: Any) -> None:  # noqa: N807 - the method it bounds
        if _size(value) > _MAX_RENDERED:
            raise SecurityError(f"namespace value {name!r} too large")
        setitem(self, name, value)

    return type(f"Bounded{cls.__name__}", (cls,), {"__setitem__": __setitem__})


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
        if (
            hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0
        ):  # never displace a caller's alarm
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
        _iterations.n = _iterations.printed = 0
        out: list[str] = []
        size = 0
        rendering, _iterations.rendering = getattr(_iterations, "rendering", False), True
        with _Alarm(_MAX_SECONDS):
            for piece in self.generate(*args, **kwargs):
                size += len(piece)
                if size > _MAX_RENDERED:
                    raise SecurityError(f"the rendered text exceeds {_MAX_RENDERED:,} characters")
                if time.monotonic() > deadline:
                    raise SecurityError(f"rendering took over {_MAX_SECONDS:g} s")
                out.append(piece)
        _iterations.rendering = rendering
        return "".join(out)


class _Bounds(SandboxedEnvironment):
    """The bounds on what a template may build (the module docstring), on top of a sandbox:
    `{{ 'a' * 10**10 }}` would otherwise try to allocate 10 GB while validating a task file.
    Intercepting the operators also keeps jinja from folding them at compile time (`7**10**9`
    would hang there)."""

    intercepted_binops = frozenset(["*", "**", "%", "+"])
    template_class = _BoundedTemplate

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise SecurityError("exponent too large")
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
        if (
            ints
            and operator in ("*", "**")
            and left.bit_length() * (right if operator == "**" else 1) + (right.bit_length() if operator == "*" else 0)
            > _MAX_INT_BITS
        ):
            raise SecurityError("integer too large")  # squaring a huge one again and again (a namespace)
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and _size(seq) * n > _MAX_RENDERED:
                raise SecurityError("repetition too large")  # [s] * n counts s n times
        if operator == "+" and not ints and _size(left) + _size(right) > _MAX_RENDERED:
            raise SecurityError("concatenation too large")  # s + s in a recursing macro doubles it
        if operator == "%":
            _check_printf(left, right)
        return _bounded(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
        # jinja wraps str.format in its own safe formatter; the string is the wrapped method's
        method = getattr(__obj, "__wrapped__", __obj)
        _check_args(getattr(method, "__name__", ""), args, kwargs)
        _check_sizes(getattr(method, "__name__", ""), getattr(method, "__self__", None), args, kwargs)
        if getattr(method, "__name__", None) == "format":
            _check_format(getattr(method, "__self__", None), args, kwargs)
        elif getattr(method, "__name__", None) == "format_map":
            _check_format(getattr(method, "__self__", None), (), args[0] if args else {})
        return _bounded(super().call(__context, __obj, *args, **kwargs))


class _Sandbox(_Bounds, ImmutableSandboxedEnvironment):
    """qeval's own sandbox for task templates: jinja's immutable sandbox with the bounds."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters = {name: _bounded_filter(f) for name, f in self.filters.items()}
        self.globals["range"] = _counted_range
        self.globals["namespace"] = _bounded_namespace(self.globals["namespace"])
        self.finalize = _finalize


def bounded_overlay(env: SandboxedEnvironment) -> SandboxedEnvironment:
    """An overlay of another library's sandboxed `env` (transformers' chat templates: its
    filters, globals and extensions kept) with qeval's bounds: its operators and calls checked
    before they allocate, its filters bounded, `range` counted, its templates rendered by
    streaming. `env` itself is left as it was."""
    out = env.overlay()
    out.__class__ = type(f"Bounded{type(env).__name__}", (_Bounds, type(env)), {})
    out.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    out.globals = dict(env.globals) | {"range": _counted_range}
    if isinstance(out.globals.get("namespace"), type):
        out.globals["namespace"] = _bounded_namespace(out.globals["namespace"])
    out.finalize = _finalize
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
