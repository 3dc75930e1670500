"""Careless and hostile input, round three (issue 40: points 9, 11, 14): a task's sampling seeds,
a checkpoint that is not a checkpoint of the model, and the model's own chat template. Each is
refused at `qeval validate` in one line with exit 2, before any model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import GEN_ROWS, GEN_YAML, MODEL, config_for, make_config, one_line_exit_2, run_cli, task_dir

SAMPLED = GEN_YAML.replace("max_gen_toks: 6}", "max_gen_toks: 6, do_sample: true, temperature: 0.7}")


@pytest.mark.parametrize(
    ("seeds", "says"),
    [("[99999999999999999999]", "less than or equal to 4294967295"), ("[-3]", "greater than or equal to 0")],
)
def test_task_seeds_are_bounded(tmp_path: Path, seeds: str, says: str) -> None:
    """`seeds: [99999999999999999999]` passed validate, then every setup failed in torch."""
    folder = task_dir(tmp_path, SAMPLED + f"seeds: {seeds}\n", GEN_ROWS)
    one_line_exit_2(run_cli("validate", str(config_for(tmp_path, folder))), says)


# -- a checkpoint must be a checkpoint of the model (point 11) -------------------------------------


def _checkpoint_config(tmp: Path, config: dict[str, object]) -> Path:
    folder = tmp / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return make_config(tmp, setups=[{"name": "bf16", "baseline": True}, {"name": "ck", "checkpoint": str(folder)}])


def _tiny(**changes: object) -> dict[str, object]:
    return json.loads((MODEL / "config.json").read_text()) | changes


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"hello": 1}, "config.json is not a model config qeval understands (it lacks 'num_attention_heads')"),
        (_tiny(vocab_size=49152), "config.json has vocab_size 49,152, the model 128: not a checkpoint of this model"),
        (_tiny(num_hidden_layers=30), "has num_hidden_layers 30, the model 4"),
        (_tiny(model_type="qwen2"), "has model_type 'qwen2', the model 'llama'"),
        ({k: v for k, v in _tiny().items() if k != "model_type"}, "has no model_type"),
    ],
)
def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path, config: dict[str, object], says: str) -> None:
    """`{"hello": 1}` passed validate; a checkpoint of another model (SmolLM2's vocabulary beside
    the tiny model's) was compared as if it were a quantization of the baseline."""
    one_line_exit_2(run_cli("validate", str(_checkpoint_config(tmp_path, config))), says)


def test_a_checkpoint_of_the_model_validates(tmp_path: Path) -> None:
    res = run_cli("validate", str(_checkpoint_config(tmp_path, _tiny())))
    assert res.returncode == 0 and "ok (2 setups" in res.stdout, res.stderr


def test_a_checkpoint_description_is_bounded() -> None:
    """A quantization_config with 20,000 modules_to_not_convert was copied whole into report.md."""
    from qeval.model.checkpoint import describe

    names = [f"model.layers.{i}.mlp.down_proj" for i in range(20_000)]
    out = describe({"quant_method": "gptq", "bits": 4, "group_size": 128, "modules_to_not_convert": names})
    assert out["text"].startswith("gptq: 4-bit, group 128; unquantized: model.layers.0.mlp.down_proj, ")
    assert out["text"].endswith(" and 19,990 more") and len(out["text"]) < 1000
    assert out["ignore_count"] == 20_000 and out["ignore"] == names[:10]
    groups = {f"g{i}": {"targets": ["Linear"] * 5000, "weights": {"num_bits": 4}} for i in range(50)}
    text = describe({"quant_method": "compressed-tensors", "config_groups": groups, "ignore": "x" * 10**6})["text"]
    assert "and 40 more groups" in text and len(text) < 3000


# -- the model's own chat template: checked at validate, bounded at every render (point 9) ----------


def _model_with_template(tmp: Path, template: str) -> Path:
    model = tmp / "model"
    shutil.copytree(MODEL, model)
    tok = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps(tok | {"chat_template": template}))
    return model


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ cycler.__init__.__globals__.os.system('id') }}", "refused by the sandbox"),
        ("{% for m in messages %}{{ 'x' * 90000000 }}{% endfor %}", "repetition too large"),
        # building without printing (10 GB here), or folding a constant at compile time, never starts
        (
            "{% set s = 'x' * 10**10 %}{{ s|length }}{% for m in messages %}{{ m.content }}{% endfor %}",
            "repetition too large",
        ),
        ("{% set x = 7**(10**9) %}{% for m in messages %}{{ m.content }}{% endfor %}", "exponent too large"),
        ("{% for m in messages %}{{ m.nope.nope }}{% endfor %}", "cannot render: UndefinedError"),
        # failing when compiled: one line, not a traceback
        ("{% for m in messages %}{{ m.content }}", "cannot render: TemplateSyntaxError"),
    ],
)
def test_a_hostile_chat_template_is_refused_at_validate(tmp_path: Path, template: str, says: str) -> None:
    """A template reaching `__globals__` passed validate and ended the run in a traceback; one
    rendering 90 million characters hung the driver. Both are one line at validate now, and so
    are templates that build without printing or fold a huge constant when compiled."""
    cfg = make_config(tmp_path, model={"path": _model_with_template(tmp_path, template)}, chat_template=True)
    one_line_exit_2(run_cli("validate", str(cfg), timeout=120), says)


def test_the_chat_template_is_bounded_at_every_render(tmp_path: Path) -> None:
    """A template that renders the probe conversation at validate but explodes on a real document
    (its output grows with the content) is stopped at the document, in one UserError line; an
    ordinary template renders as transformers renders it."""
    from qeval.config import ModelSpec
    from qeval.config.chat import ChatChoice
    from qeval.errors import UserError
    from qeval.tasks.chat import ChatResolver

    growing = "{% for m in messages %}{% for c in m.content %}{{ m.content }}{% endfor %}{% endfor %}"
    chat = ChatResolver(ModelSpec(path=str(_model_with_template(tmp_path, growing))))(
        ChatChoice(True, None, True), "task t"
    )
    assert chat is not None and chat.prompt("ab") == "abab"
    with pytest.raises(UserError, match="(exceeds|prints more than) 1,000,000 characters"):
        chat.prompt("y" * 2000)  # 2,000 x 2,000 characters (counted as printed, before they stream)
    plain = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    )
    shutil.rmtree(tmp_path / "model")
    chat = ChatResolver(ModelSpec(path=str(_model_with_template(tmp_path, plain))))(
        ChatChoice(True, "S", True), "task t"
    )
    assert chat is not None and chat.prompt("hi") == "<system>S<user>hi<a>"


def test_a_checkpoint_with_another_mlp_width_is_not_the_model() -> None:
    """A checkpoint with the model's vocabulary, hidden size, layers and heads but another MLP
    width is another model (no quantizer changes it): refused, not compared as a quantization
    of the baseline (issue 40 review, point 11)."""
    from qeval.model.checkpoint import identity_problem

    assert identity_problem(_tiny(intermediate_size=512), _tiny()) == "has intermediate_size 512, the model 384"
    assert identity_problem(_tiny(), _tiny()) == ""


@pytest.mark.parametrize(
    ("template", "says"),
    [
        (
            "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ 1 }}",
            "namespace value 's' too large",
        ),
        (
            "{% macro d(s, n) %}{% if n %}{{ d(s + s, n - 1) }}{% endif %}{% endmacro %}{{ d('x', 40) }}",
            "concatenation too large",
        ),
        (
            "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ d('x', 40) }}",
            "an argument too large",
        ),
        ("{{ (('x' * 999999)|replace('', 'y' * 999999))|length }}", "replace would build"),
        ("{{ ('x' * 999999).replace('x', 'y' * 999999)|length }}", "replace would build"),
        ("{{ (['x' * 99] * 999)|join('y' * 999999)|length }}", "join would build"),
        ("{{ ('y' * 999999).join(['x'] * 999)|length }}", "join would build"),
        ("{{ ('a\\n' * 400000)|indent(999999)|length }}", "indent would build"),
        ("{{ (['x' * 9999] * 999)|string|length }}", "repetition too large"),
        (
            "{% set a = ['x' * 99999] * 9 %}{% set b = [a, a, a, a, a, a, a, a, a] %}"
            "{% set c = [b, b, b, b, b, b, b, b, b] %}"
            "{{ c|string|length }}",
            "an argument too large",
        ),
        (
            "{% macro f() %}{% for i in range(999) %}{{ 'x' * 99999 }}{% endfor %}{% endmacro %}{{ f()|length }}",
            "prints more than 1,000,000 characters",
        ),
    ],
)
def test_a_template_that_grows_without_printing_is_refused_before_it_builds(template: str, says: str) -> None:
    """Growth no output piece shows, stopped only by the 5 s clock between steps (2 GB or more
    built by then; none of it where the render runs outside the main thread): a namespace or a
    recursing macro doubling a string, replace / join / indent multiplying their arguments, a
    list printed as text holding a string thousands of times, a macro's output built whole.
    Each is refused before it allocates (issue 40 review, point 9)."""
    import time

    from jinja2.sandbox import SecurityError

    from qeval.tasks.templates import render

    t0 = time.monotonic()
    with pytest.raises(SecurityError, match=says):
        render(template, {})
    assert time.monotonic() - t0 < 2


def test_the_bounds_leave_ordinary_templates_alone(tmp_path: Path) -> None:
    from qeval.config import ModelSpec
    from qeval.config.chat import ChatChoice
    from qeval.errors import UserError
    from qeval.tasks.chat import ChatResolver
    from qeval.tasks.templates import render

    ordinary = (
        "{{ 'Hello' + ' ' + name|upper }} {{ [1, 2] + [3] }} {{ 3 + 4 }} {{ 'a b'.replace(' ', '_') }} "
        "{{ ['a', 'b']|join(', ') }} {{ 'x\\ny'|indent(2) }}{% set ns = namespace(n=0) %}"
        "{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %} {{ ns.n }}"
    )
    assert render(ordinary, {"name": "bob"}) == "Hello BOB [1, 2, 3] 7 a_b a, b x\n  y 3"
    # the chat template's own namespace (transformers') is bounded too
    doubling = (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    chat = ChatResolver(ModelSpec(path=str(_model_with_template(tmp_path, doubling))))
    with pytest.raises(UserError, match="namespace value 's' too large"):
        chat(ChatChoice(True, None, True), "task t")
