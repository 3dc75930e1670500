"""The template sandbox computes what a size-multiplying call would build before building it
(issue 54 point 10): `expandtabs` and `translate` multiply their string, and a width or
precision taken from an argument (`{:>{}}`, `%*d`, `%.*f`) or written after a mapping key
(`%(a)100000000s`) was only caught once the string was built (200 MB here; 1.4 GB for 1,000 tabs
at width 1,000,000). Each is refused with no more than a few MB allocated."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from tests.helpers import one_line_exit_2, run_cli
from tests.run.test_trust_round3 import _model_with_template, make_config

WIDE = 200_000_000


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ ('\\t' * 200).expandtabs(1000000)|length }}", "expandtabs would build"),
        ("{{ ('\\t' * 200).expandtabs(tabsize=1000000)|length }}", "expandtabs would build"),
        ("{{ ('a' * 1000).translate({97: 'x' * 200000})|length }}", "translate would build"),
        (f"{{{{ '{{:>{{}}}}'.format('a', {WIDE})|length }}}}", "format width too large"),
        (f"{{{{ '{{:>{{w}}}}'.format('a', w={WIDE})|length }}}}", "format width too large"),
        (f"{{{{ '{{:>{{}}}}'.format('a', '{WIDE}')|length }}}}", "format width too large"),
        (f"{{{{ '{{0:>{{1[0]}}}}'.format('a', [{WIDE}])|length }}}}", "format width too large"),
        (f"{{{{ '{{w:>{{n}}}}'.format_map({{'w': 'a', 'n': {WIDE}}})|length }}}}", "format width too large"),
        (f"{{{{ ('%*d' % ({WIDE}, 1))|length }}}}", "format width too large"),
        (f"{{{{ ('%.*f' % ({WIDE}, 1.5))|length }}}}", "format width too large"),
        (f"{{{{ ('%.{WIDE}f' % 1.5)|length }}}}", "format width too large"),
        (f"{{{{ ('%(a){WIDE}s' % {{'a': 1}})|length }}}}", "format width too large"),
        (f"{{{{ '%*d'|format({WIDE}, 1)|length }}}}", "format width too large"),
        (f"{{{{ '%.{WIDE}f'|format(1.5)|length }}}}", "format width too large"),
        (f"{{{{ '%d %*d'|format(1, {WIDE}, 1)|length }}}}", "format width too large"),
        (f"{{{{ ('%% %d %.*f' % (1, {WIDE}, 1.5))|length }}}}", "format width too large"),
        (f"{{{{ '{{}} {{:>{{}}}}'.format('a', 'b', {WIDE})|length }}}}", "format width too large"),
        (f"{{{{ '{{[0]:>{{[1]}}}}'.format(['a'], [0, {WIDE}])|length }}}}", "format width too large"),
        ("{{ ('%' + '9' * 5000 + 'd') % 1 }}", "format width too large"),  # no int-max-str-digits error
        # every field's width under the bound, their sum (what is built) far past it
        ("{{ (('%(a)999999d' * 80000) % {'a': 1})|length }}", "widths add up"),
        ("{{ (('{0:>999999}' * 80000).format(1))|length }}", "widths add up"),
        ("{{ ('%999999d' * 3)|format(1, 2, 3)|length }}", "widths add up"),
        ("{{ ('{:>{}}' * 3).format('a', 999999, 'b', 999999, 'c', 999999)|length }}", "widths add up"),
    ],
)
def test_a_multiplying_call_is_refused_before_it_allocates(template: str, says: str) -> None:
    from jinja2.sandbox import SecurityError

    from qeval.tasks.templates import render

    tracemalloc.start()
    try:
        with pytest.raises(SecurityError, match=says):
            render(template, {})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB allocated before the refusal"


def test_ordinary_widths_and_tables_still_render() -> None:
    from qeval.tasks.templates import render

    template = (
        "{{ '{:>{}}'.format('a', 4) }}|{{ '%*d' % (3, 7) }}|{{ '%(a)5s' % {'a': 'x'} }}|{{ '%.2f'|format(1.234) }}|"
        "{{ 'a\\tb'.expandtabs(4) }}|{{ 'abc'.translate({97: 'xy', 98: none}) }}|{{ '{} {}'.format(12345678, n) }}"
    )
    assert render(template, {"n": 10**12}) == "   a|  7|    x|1.23|a   b|xyc|12345678 1000000000000"
    # a large value beside a width taken from an argument is a value, not a width
    values = (
        "{{ '%*d' % (9, n) }}|{{ '%%%-*d%%' % (3, 1) }}|{{ '{:>{}} {}'.format('a', 2, n) }}|"
        "{{ '{0:>{1}} {2}'.format('a', 2, n) }}|{{ '{x:>{w}} {n}'.format(x='a', w=2, n=n) }}|"
        "{{ '{x:>{w[0]}}'.format_map({'x': 'a', 'w': [2]}) }}"
    )
    assert render(values, {"n": 10**8}) == "100000000|%1  %| a 100000000| a 100000000| a 100000000| a"


def test_the_chat_templates_expandtabs_is_refused_at_validate(tmp_path: Path) -> None:
    """The model's own chat template (transformers' sandbox under qeval's bounds) alike."""
    template = "{{ ('\\t' * 1000).expandtabs(1000000)|length }}{% for m in messages %}{{ m.content }}{% endfor %}"
    cfg = make_config(tmp_path, model={"path": _model_with_template(tmp_path, template)}, chat_template=True)
    one_line_exit_2(run_cli("validate", str(cfg), timeout=120), "expandtabs would build")
