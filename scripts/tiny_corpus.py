"""Deterministic generators for qeval's shipped task suite and the tiny model's training text.

Everything here is a pure function of a seed, so `scripts/make_tasks.py` and
`scripts/train_tiny_model.py` regenerate byte-identical data on any machine.

The scored splits are disjoint from the training text (addition pairs and comparison
questions are held out); facts are the exception: they are memorised on purpose.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

SEED = 1234
N_EVAL = 400  # per scored split: enough to see a ~3-point drop
N_LANGUAGE_FACTS = 1000  # sized to load the tiny model near capacity (see model card)


@dataclass(frozen=True)
class Fact:
    """One memorised fact: a prompt and the code it must be completed with."""

    kind: str
    name: str
    code: str

    @property
    def prompt(self) -> str:
        if self.kind == "country":
            return f"ISO code of {self.name}:"
        return f"ISO code of {self.name} language:"


def all_facts(n_languages: int = N_LANGUAGE_FACTS) -> list[Fact]:
    """Countries (name -> alpha-2) and a seeded sample of languages (name -> alpha-3)."""
    import pycountry  # the fact source ships inside the package: no download

    facts: list[Fact] = []
    for c in sorted(pycountry.countries, key=lambda c: c.alpha_2):
        if re.fullmatch(r"[A-Za-z ,.()'-]+", c.name):
            facts.append(Fact("country", c.name, c.alpha_2))
    seen: set[str] = set()
    langs = []
    for lang in sorted(pycountry.languages, key=lambda x: x.alpha_3):
        name = lang.name
        if re.fullmatch(r"[A-Za-z ]{3,24}", name) and name not in seen:
            seen.add(name)
            langs.append(Fact("language", name, lang.alpha_3))
    rng = random.Random(SEED)
    facts += sorted(rng.sample(langs, n_languages), key=lambda f: f.code)
    return facts


def addition_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(10, 100) for b in range(10, 100)]


def addition_text(a: int, b: int) -> str:
    return f"{a} + {b} ="


def compare_question(rng: random.Random) -> tuple[str, list[int]]:
    word = rng.choice(["Largest", "Smallest"])
    nums = rng.sample(range(10, 100), 4)
    return word, nums


def compare_answer(word: str, nums: list[int]) -> int:
    return max(nums) if word == "Largest" else min(nums)


def compare_text(word: str, nums: list[int]) -> str:
    return f"{word} of {' '.join(map(str, nums))}:"


@dataclass
class Splits:
    """The held-out material: scored splits and what training must avoid."""

    add_eval: list[tuple[int, int]]
    add_ppl: list[tuple[int, int]]  # held-out pairs used only inside perplexity docs
    compare_eval: list[tuple[str, list[int]]]
    fact_eval: list[Fact]
    facts: list[Fact]

    @property
    def held_out_pairs(self) -> set[tuple[int, int]]:
        return set(self.add_eval) | set(self.add_ppl)

    @property
    def held_out_compare(self) -> set[str]:
        return {compare_text(w, n) for w, n in self.compare_eval}


def make_splits(seed: int = SEED) -> Splits:
    rng = random.Random(seed)
    pairs = addition_pairs()
    rng.shuffle(pairs)
    compare: list[tuple[str, list[int]]] = []
    seen: set[str] = set()
    while len(compare) < N_EVAL:
        w, n = compare_question(rng)
        if compare_text(w, n) not in seen:
            seen.add(compare_text(w, n))
            compare.append((w, n))
    facts = all_facts()
    return Splits(
        add_eval=pairs[:N_EVAL],
        add_ppl=pairs[N_EVAL : 2 * N_EVAL],
        compare_eval=compare,
        fact_eval=rng.sample(facts, N_EVAL),
        facts=facts,
    )


def _train_line(rng: random.Random, splits: Splits, pairs: list[tuple[int, int]]) -> str:
    r = rng.random()
    if r < 0.30:
        a, b = rng.choice(pairs)
        return f"{addition_text(a, b)} {a + b}"
    if r < 0.55:
        while True:
            w, n = compare_question(rng)
            if compare_text(w, n) not in splits.held_out_compare:
                return f"{compare_text(w, n)} {compare_answer(w, n)}"
    f = rng.choice(splits.facts)
    return f"{f.prompt} {f.code}"


def training_documents(splits: Splits, seed: int = SEED + 1) -> Iterator[str]:
    """An endless, seeded stream of training documents of 1-4 lines."""
    rng = random.Random(seed)
    held = splits.held_out_pairs
    pairs = [p for p in addition_pairs() if p not in held]
    while True:
        yield "\n".join(_train_line(rng, splits, pairs) for _ in range(rng.randint(1, 4)))


def perplexity_documents(splits: Splits, seed: int = SEED + 2) -> list[str]:
    """Held-out documents of the training distribution: unseen sums and comparisons."""
    rng = random.Random(seed)
    docs = []
    pairs = list(splits.add_ppl)
    for i in range(N_EVAL):
        lines = []
        for _ in range(rng.randint(3, 6)):
            r = rng.random()
            if r < 0.30:
                a, b = pairs[(i * 7 + len(lines)) % len(pairs)]
                lines.append(f"{addition_text(a, b)} {a + b}")
            elif r < 0.55:
                while True:
                    w, n = compare_question(rng)
                    t = compare_text(w, n)
                    if t not in splits.held_out_compare:
                        lines.append(f"{t} {compare_answer(w, n)}")
                        break
            else:
                f = rng.choice(splits.facts)
                lines.append(f"{f.prompt} {f.code}")
        docs.append("\n".join(lines))
    return docs
