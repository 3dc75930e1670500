"""Multi-turn tasks as ordinary qeval Tasks (`multi_turn_t2`, `multi_turn_t6`, ...): one per
question turn, generated in memory from the config's seed, rendered with the model's chat
template, checksummed over their documents (the rendered prompts: a change of template or
tokenizer changes the checksum); keys, store, comparison and notebook treat them like any task.
A gate written at a turn (`{task: multi_turn, turn: 6, max_drop: 0.02}`) becomes a gate on that
turn's task, with the paired statistics of every task (docs/statistics.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.config.chat import ChatChoice
from qeval.errors import UserError
from qeval.tasks.generated import limited_docs, number_answer_spec
from qeval.tasks.multi_turn.generate import conversation
from qeval.tasks.multi_turn.spec import MultiTurnSpec
from qeval.tasks.native import Task

if TYPE_CHECKING:
    from collections.abc import Callable

    from qeval.config import RunConfig
    from qeval.config.gates import Gate
    from qeval.tasks.chat import Chat

NAME = "multi_turn"
#: bump when the generator's output changes: it is part of every task's fingerprint
GENERATOR_VERSION = 1


@dataclass
class MultiTurnTask(Task):
    """The conversations whose question comes at user turn `turn`."""

    turn: int = 0

    @property
    def kind(self) -> str:
        return NAME


def spec_of(cfg: RunConfig) -> MultiTurnSpec | None:
    """The config's `kinds: {multi_turn: ...}` piece, validated; None without one."""
    from qeval.tasks.kinds import plugin_spec

    return plugin_spec(cfg, NAME) if NAME in cfg.kinds else None


def task_name(turn: int) -> str:
    return f"{NAME}_t{turn}"


def build_tasks(cfg: RunConfig, spec: MultiTurnSpec) -> list[MultiTurnTask]:
    """Every multi-turn task of the config, rendered with the model's chat template (one line
    and exit 2 where the tokenizer has none)."""
    from qeval.backends.tokens import conventions
    from qeval.tasks.chat import ChatResolver

    resolver = ChatResolver(cfg.model)
    chat = resolver(
        ChatChoice(template=spec.chat_template, system_prompt=None, fewshot_as_multiturn=False), f"kinds.{NAME}"
    )
    assert chat is not None and chat.template is not None
    count = conventions(resolver.tokenizer()).prompt
    out = []
    for turn in spec.turns:
        docs = _turn_docs(spec, turn, chat, count)
        longest = max(len(count(d["text"])) for d in docs)
        if longest + spec.max_gen_toks > cfg.model.max_context:
            raise UserError(
                f"kinds.{NAME}: a conversation at turn {turn} takes {longest} tokens, more than "
                f"model.max_context {cfg.model.max_context} leaves with max_gen_toks {spec.max_gen_toks} "
                "(fewer turns or filler_words)"
            )
        out.append(_turn_task(cfg, spec, turn, docs))
    return out


def _turn_docs(spec: MultiTurnSpec, turn: int, chat: Chat, count: Callable[[str], list[int]]) -> list[dict[str, Any]]:
    """The conversations of one turn count, each rendered with the chat template."""
    # one stream per turn: adding a turn leaves the other turns' conversations alone
    rng = random.Random(f"{spec.seed}/{NAME}/{turn}")
    docs: list[dict[str, Any]] = []
    for i in range(spec.samples):
        messages, bare, answer = conversation(rng, turn, spec.facts, spec.filler_words, spec.system_prompt)
        prompt = chat.apply(messages)
        docs.append(
            {
                "id": f"t{turn}-{i:03d}",
                "text": prompt,
                "answer": answer,
                "turn": turn,
                "gap_tokens": len(count(prompt)) - len(count(chat.apply(bare))),
            }
        )
    return docs


def _turn_task(cfg: RunConfig, spec: MultiTurnSpec, turn: int, docs: list[dict[str, Any]]) -> MultiTurnTask:
    """One turn count's task over its conversations (the checksum covers all; `limit` keeps the first)."""
    name = task_name(turn)
    meta = {
        "turn": turn,
        "seed": spec.seed,
        "generator": GENERATOR_VERSION,
        "facts": spec.facts,
        "filler_words": spec.filler_words,
    }
    task_spec = number_answer_spec(name, spec.max_gen_toks, meta)
    docs, digest = limited_docs(docs, cfg.limit)
    return MultiTurnTask(spec=task_spec, yaml_path=Path(f"<{NAME}>/{name}"), docs=docs, sha256=digest, turn=turn)


def resolve_gates(gates: list[Gate], spec: MultiTurnSpec | None) -> list[Gate]:
    """Gates written at a turn become gates on that turn's task (`task: multi_turn` or `all`);
    any other gate is kept as it is. A turn the config does not generate is one line."""
    out = []
    for gate in gates:
        if gate.turn is None:
            out.append(gate)
            continue
        if spec is None:
            raise UserError(f"a gate is written at turn {gate.turn}, but the config has no kinds.{NAME}")
        if gate.task not in (NAME, "all"):
            raise UserError(f"gate at turn {gate.turn}: its task must be {NAME!r} (or all), not {gate.task!r}")
        if gate.turn not in spec.turns:
            raise UserError(f"gate at turn {gate.turn}: not one of kinds.{NAME}.turns {spec.turns}")
        out.append(gate.model_copy(update={"task": task_name(gate.turn)}))
    return out
