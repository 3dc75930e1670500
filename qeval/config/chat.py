"""The chat-template keys of a run config, at the top level (every task) and per lm-eval task
(docs/tasks.md, "Chat templates"): lm-eval's `--apply_chat_template`, `--system_instruction`
and `--fewshot_as_multiturn`, under qeval's names; and `think_end_token` (lm-eval's model
argument of that name), which strips a reasoning block from a generation before it is scored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from qeval.strict import Strict

#: a template name as a tokenizer carries it (`tokenizer_config.json`'s list, `chat_templates/<name>.jinja`)
TEMPLATE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
#: on/off, or the name of one of the tokenizer's templates
ChatTemplateKey = bool | Annotated[str, Field(pattern=TEMPLATE_NAME)]
#: the keys, as results.json and the config hash leave them out while unset
CHAT_KEYS = ("chat_template", "system_prompt", "fewshot_as_multiturn", "think_end_token")


class ChatKeys(Strict):
    """The three keys, left unset (None) where the level above decides."""

    #: render prompts with the tokenizer's chat template: true (its default template), false, or
    #: the name of one of its templates
    chat_template: ChatTemplateKey | None = None
    #: a system message (lm-eval's `system_instruction`); without a chat template, plain text
    #: before the prompt
    system_prompt: str | None = Field(default=None, min_length=1, max_length=20_000)
    #: few-shot examples as alternating user/assistant turns (true, lm-eval's `simple_evaluate`
    #: default under a chat template) or folded into one user message (false)
    fewshot_as_multiturn: bool | None = None
    #: a generation is scored on the text after the last occurrence of this string (`</think>`),
    #: as lm-eval's `think_end_token`; its length in tokens still counts the whole generation
    think_end_token: str | None = Field(default=None, min_length=1, max_length=100)


@dataclass(frozen=True)
class ChatChoice:
    """The chat settings one task is prompted under, the levels merged."""

    #: None: no template; True: the tokenizer's default; a name: that template
    template: bool | str | None
    system_prompt: str | None
    fewshot_as_multiturn: bool

    @property
    def on(self) -> bool:
        return self.template is not None and self.template is not False

    @property
    def plain(self) -> bool:
        """Nothing to do: no template, no system prompt (the prompts as before these keys)."""
        return not self.on and self.system_prompt is None


def merge_chat(run: ChatKeys, task: ChatKeys | None = None) -> ChatChoice:
    """The task's own keys over the run's; `fewshot_as_multiturn` defaults to lm-eval's
    `simple_evaluate` (true) under a template and is meaningless without one."""

    def pick(name: str) -> object:
        value = getattr(task, name, None) if task is not None else None
        return value if value is not None else getattr(run, name)

    template = pick("chat_template")
    multiturn = pick("fewshot_as_multiturn")
    on = template is not None and template is not False
    if multiturn and not on:
        raise ValueError("fewshot_as_multiturn: true needs a chat template (chat_template: true or a template name)")
    return ChatChoice(
        template=template if on else None,  # type: ignore[arg-type]
        system_prompt=pick("system_prompt"),  # type: ignore[arg-type]
        fewshot_as_multiturn=bool(on if multiturn is None else multiturn),
    )


def merge_think_end(run: ChatKeys, task: ChatKeys | None = None) -> str | None:
    """The task's `think_end_token`, else the run's."""
    own = task.think_end_token if task is not None else None
    return own if own is not None else run.think_end_token


def strip_thinking(text: str, think_end_token: str | None) -> str:
    """lm-eval's `postprocess_generated_text`: the text after the last `think_end_token`, its
    leading whitespace dropped; the whole text where the token is absent (a block never closed)."""
    if not think_end_token:
        return text
    return text.split(think_end_token)[-1].lstrip()
