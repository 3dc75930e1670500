"""Generated prose: a chronicle of one invented town, for perplexity by position and as the
multi-key needle's haystack.

Each document draws its own cast (names, trades, home towns, ages, belongings) and then tells
of them sentence by sentence. A person keeps their trade, town and belongings throughout, so a
later sentence is easier to predict for a model that still sees the sentence, thousands of
tokens back, where that person was introduced: the text has the long-range dependence a
quantized KV cache can damage. No hub and no download: only `random.Random(seed)`."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from qeval.tasks.long_context import words as w


@dataclass(frozen=True)
class Person:
    name: str
    job: str
    town: str
    age: int
    thing: str
    colour: str


_INTRO = "{p.name} was a {p.job} from {p.town}, {p.age} years old, who owned a {p.colour} {p.thing}."
_EVENTS = (
    "{p.name}, the {p.job}, walked from {p.town} to {town} with the {p.colour} {p.thing}.",
    "In {town}, {weather}, and {p.name} stayed indoors mending the {p.colour} {p.thing}.",
    "{p.name} and {q.name} met at the market in {town} and spoke about the {q.colour} {q.thing}.",
    "Everyone in {p.town} knew that {p.name} the {p.job} never lent the {p.colour} {p.thing} to anyone.",
    "{q.name}, who was {q.age}, asked {p.name} the {p.job} for help with a broken {thing}.",
    "On the road to {town}, {p.name} counted {n} carts and thought of {q.name} the {q.job}.",
    "{p.name} wrote in the ledger that {n} people had visited {p.town} that week.",
    "When {weather}, {q.name} the {q.job} and {p.name} sat together by the fire in {q.town}.",
    "The {p.colour} {p.thing} of {p.name} was older than the {q.colour} {q.thing} of {q.name}.",
    "{p.name} of {p.town} sold {n} loaves to {q.name} of {q.town}, and both were pleased.",
    "Some said that {q.name} the {q.job} had once lived in {town}, but {p.name} did not believe it.",
    "At the age of {p.age}, {p.name} was still the best {p.job} between {p.town} and {town}.",
)


def cast(rng: random.Random, n: int = 8) -> list[Person]:
    """`n` people with distinct names and fixed attributes."""
    names = rng.sample([f"{f} {s}" for f in w.FIRST_NAMES for s in w.SURNAMES], n)
    return [
        Person(
            name,
            rng.choice(w.JOBS),
            rng.choice(w.TOWNS),
            rng.randint(19, 78),
            rng.choice(w.OBJECTS),
            rng.choice(w.COLOURS),
        )
        for name in names
    ]


def chronicle(rng: random.Random) -> Iterator[str]:
    """An endless chronicle: each person's introduction, then events about them; each call
    of `next` gives one sentence."""
    people = cast(rng)
    for p in people:
        yield _INTRO.format(p=p)
    while True:
        p, q = rng.sample(people, 2)
        yield rng.choice(_EVENTS).format(
            p=p,
            q=q,
            town=rng.choice(w.TOWNS),
            weather=rng.choice(w.WEATHER),
            thing=rng.choice(w.OBJECTS),
            n=rng.randint(2, 40),
        )
