"""One multi-turn conversation, generated from a random stream: a system message, facts in the
first user turn, `turn - 2` exchanges of filler (a question and a few sentences of generated
prose, qeval/tasks/long_context/prose.py), then the question about one fact at user turn `turn`."""

from __future__ import annotations

import random
from typing import Any

from qeval.tasks.long_context.prose import chronicle

ENTITIES = (
    "locker",
    "room",
    "badge",
    "parcel",
    "ticket",
    "table",
    "gate",
    "seat",
    "order",
    "account",
    "bus",
    "case",
    "cabin",
    "desk",
    "bike",
    "box",
)
FILLER_ASKS = (
    "Tell me a bit more of the story.",
    "What happened next?",
    "Go on, please.",
    "And then?",
    "Tell me something else from the chronicle.",
)
ACK = "Noted."


def conversation(
    rng: random.Random, turn: int, facts: int, filler_words: int, system_prompt: str
) -> tuple[list[dict[str, str]], list[dict[str, str]], str]:
    """(the messages up to the question, the same conversation without filler, the answer)."""
    entities = rng.sample(ENTITIES, facts)
    values = [str(v) for v in rng.sample(range(100, 1000), facts)]
    ask = rng.randrange(facts)
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    given = "Please remember: " + " ".join(f"My {e} number is {v}." for e, v in zip(entities, values, strict=True))
    head = [*system, {"role": "user", "content": given}, {"role": "assistant", "content": ACK}]
    story = chronicle(rng)
    filler: list[dict[str, Any]] = []
    for _ in range(turn - 2):
        words: list[str] = []
        while len(words) < filler_words:
            words += next(story).split()
        filler += [
            {"role": "user", "content": rng.choice(FILLER_ASKS)},
            {"role": "assistant", "content": " ".join(words) if words else "Sure."},
        ]
    question = [{"role": "user", "content": f"What is my {entities[ask]} number? Answer with the number only."}]
    return head + filler + question, head + question, values[ask]
