"""Chat templates: the tokenizer's own template, chosen and rendered as lm-evaluation-harness
0.4.13's `HFLM` does (`LM.chat_template` picks it, `HFLM.apply_chat_template` renders it with
transformers' `apply_chat_template`, whose Jinja environment is sandboxed), for the lm_eval kind
(handed to lm-eval's `evaluate`) and the native one (a system message and one user turn).

A template is part of what a task's numbers depend on: `Chat.sha256` covers the template's
source, the system prompt, the few-shot layout and a probe conversation rendered with it, and
enters each task's resume key (qeval/records/keys.py)."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.config.chat import ChatChoice, ChatKeys, merge_chat
from qeval.errors import UserError
from qeval.tasks.templates import bounded_overlay

if TYPE_CHECKING:
    from qeval.config import ModelSpec

#: rendered into the hash: what a template makes of a system, user, assistant, user exchange
_PROBE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U1"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "U2"},
]


@dataclass(frozen=True)
class Chat:
    """One task's chat settings, resolved against the model's tokenizer."""

    choice: ChatChoice
    #: the template's Jinja source (None: no template, only a plain-text system prompt)
    template: str | None
    #: the tokenizer's name for the chosen template (None: its only or default one)
    name: str | None = None
    tokenizer: Any = field(default=None, compare=False, repr=False)

    @property
    def system_prompt(self) -> str | None:
        return self.choice.system_prompt

    @property
    def fewshot_as_multiturn(self) -> bool:
        return self.choice.fewshot_as_multiturn

    def apply(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation rendered as `HFLM.apply_chat_template` does: the generation prompt
        appended, or the last (assistant) message continued; a template that refuses a system
        role is retried without it, as HFLM does."""
        import jinja2

        assert self.template is not None, "apply() needs a template"
        kw = {
            "tokenize": False,
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": not add_generation_prompt,
            "chat_template": self.template,
        }
        try:  # compiling is inside: a syntax error, or one in folding its constants, is one line too
            _bound(self.template)
            try:
                return str(self.tokenizer.apply_chat_template(messages, **kw))
            except jinja2.exceptions.SecurityError:
                raise
            except jinja2.exceptions.TemplateError:
                kept = [m for m in messages if m["role"] != "system"]
                return str(self.tokenizer.apply_chat_template(kept, **kw))
        except jinja2.exceptions.SecurityError as exc:  # the sandbox held, or a bound was reached
            raise UserError(
                f"the model's chat template{self._named}: refused by the sandbox: {_first_line(exc)}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - a template is a program from the model folder: one line
            raise UserError(
                f"the model's chat template{self._named}: cannot render: {type(exc).__name__}: {_first_line(exc)}"
            ) from None

    @property
    def _named(self) -> str:
        return f" {self.name!r}" if self.name else ""

    def prompt(self, text: str) -> str:
        """A native task's prompt: the system message and the document as one user turn,
        rendered with the generation prompt; without a template, the system prompt before the
        text as plain text (lm-eval's `maybe_delimit` with its few-shot delimiter)."""
        if self.template is None:
            return _delimit(self.system_prompt, text, "\n\n")
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return self.apply([*system, {"role": "user", "content": text}])

    @cached_property
    def sha256(self) -> str:
        """What the prompts depend on, by content: the template, the system prompt, the few-shot
        layout, and the probe conversation as this transformers renders it."""
        body: dict[str, Any] = {
            "template": self.template,
            "system_prompt": self.system_prompt,
            "fewshot_as_multiturn": self.fewshot_as_multiturn,
        }
        if self.template is not None:
            body["probe"] = self.apply(_PROBE)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if len(text) <= 300 else text[:300] + "…"


def _bound(source: str) -> None:
    """Make transformers compile `source` (the template its `apply_chat_template` renders) in an
    overlay of its own environment with qeval's bounds (qeval/tasks/templates.py): operators,
    calls and filters checked before they allocate (`{% set s = 'x' * 10**10 %}` builds 10 GB
    without printing a character; `7**10**9` hangs in jinja's constant folding at compile time),
    and the output streamed under 1,000,000 characters and 5 s. Its sandbox is transformers'
    own; the bounds are what it lacks: a template that renders 90 million characters hung the run.
    Installed once, in place of transformers' compile function (transformers 5.23:
    `chat_template_utils._compile_jinja_template`, looked up at each render)."""
    from transformers.utils import chat_template_utils

    original = getattr(chat_template_utils, "_compile_jinja_template", None)
    if original is None:  # pragma: no cover - another transformers: the rendered size is checked after
        return
    if not getattr(original, "_qeval_bounded", False):
        base = original("").environment  # transformers' environment (its filters and extensions)

        @functools.lru_cache(maxsize=64)
        def compile_bounded(chat_template: str) -> Any:
            return bounded_overlay(base).from_string(chat_template)

        compile_bounded._qeval_bounded = True  # type: ignore[attr-defined]
        chat_template_utils._compile_jinja_template = compile_bounded
    chat_template_utils._compile_jinja_template(source)  # compiled here: its errors are the caller's one line


def _delimit(prefix: str | None, suffix: str, delimiter: str) -> str:
    """lm-eval's `maybe_delimit`: the delimiter only where neither side brings whitespace."""
    if not prefix:
        return suffix
    if not suffix:
        return prefix
    return prefix + suffix if prefix[-1].isspace() or suffix[0].isspace() else prefix + delimiter + suffix


class ChatResolver:
    """Resolves `ChatChoice`s against one model's tokenizer, loaded once, on first need."""

    def __init__(self, model: ModelSpec) -> None:
        self.model = model
        self._tok: Any = None

    def tokenizer(self) -> Any:
        if self._tok is None:
            self._tok = load_tokenizer(self.model)
        return self._tok

    def __call__(self, choice: ChatChoice, where: str) -> Chat | None:
        """The task's Chat, or None where it has neither template nor system prompt; one line
        (`where`: the task) when the tokenizer has no such template."""
        if choice.plain:
            return None
        if not choice.on:
            return Chat(choice, None)
        tok = self.tokenizer()
        source, name = select_template(tok, choice.template, where)
        chat = Chat(choice, source, name, tok)
        try:  # compiled and rendered once on the probe conversation, here at preflight (its hash)
            _ = chat.sha256
        except UserError as exc:
            raise UserError(f"{where}: chat_template: {exc}") from None
        return chat


def load_tokenizer(model: ModelSpec) -> Any:
    """The model's tokenizer as the backends load it (revision, remote code), offline or not as
    the environment says."""
    from transformers import AutoTokenizer

    if model.path.endswith(".gguf") and Path(model.path).is_file():
        raise UserError(
            f"chat_template: {model.path} is a GGUF file; chat templates are read from a model "
            "folder's tokenizer (give the folder it was converted from)"
        )
    return AutoTokenizer.from_pretrained(model.path, revision=model.revision, trust_remote_code=model.trust_remote_code)


def select_template(tok: Any, wanted: bool | str | None, where: str) -> tuple[str, str | None]:
    """The template `LM.chat_template` (lm-eval 0.4.13) selects: a named one from the
    tokenizer's set, else its "default"; a tokenizer's only template for `true`. A name the
    tokenizer does not carry is one line naming those it does (lm-eval instead falls back to
    the single template with a warning: qeval refuses rather than score under another one)."""
    templates = getattr(tok, "chat_template", None)
    if not templates:
        raise UserError(f"{where}: chat_template: the model's tokenizer carries no chat template")
    if isinstance(templates, dict):
        key = wanted if isinstance(wanted, str) else "default"
        if key not in templates:
            raise UserError(
                f"{where}: chat_template: the tokenizer has no template {key!r} "
                f"(it has: {', '.join(sorted(templates))})"
            )
        return str(templates[key]), key
    if isinstance(wanted, str) and wanted != "default":
        raise UserError(
            f"{where}: chat_template: {wanted!r}: the tokenizer carries one unnamed template; use chat_template: true"
        )
    return str(templates), None


def task_chat(resolver: ChatResolver, run: ChatKeys, task: ChatKeys | None, where: str) -> Chat | None:
    """A task's Chat: its own chat keys over the run's (qeval/config/chat.py), resolved; a
    combination that means nothing (few-shot turns without a template) is one line."""
    try:
        choice = merge_chat(run, task)
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None
    return resolver(choice, where)
