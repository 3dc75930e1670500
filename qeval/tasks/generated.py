"""What the kinds that generate their documents in memory (long_context/, multi_turn/) build
alike: a number-answer task's spec, and the documents a run scores under `limit` with the
checksum over all of them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from qeval.tasks.native import GenerationKwargs, TaskSpec


def number_answer_spec(name: str, max_gen_toks: int, metadata: dict[str, Any]) -> TaskSpec:
    """A generated task whose documents hold `text` and a number `answer`: greedy to the end of the
    line, the first number of the generation scored by exact match."""
    return TaskSpec(
        task=name,
        output_type="generate_until",
        doc_to_text="text",
        doc_to_target="answer",
        generation_kwargs=GenerationKwargs(until=["\n"], max_gen_toks=max_gen_toks),
        answer_regex=r"(\d+)",
        metadata=metadata,
    )


def limited_docs(docs: list[dict[str, Any]], limit: int | None) -> tuple[list[dict[str, Any]], str]:
    """The documents scored (`limit`: the first ones) and the sha256 over every document generated:
    the checksum, and so the task's keys, do not change with --limit."""
    digest = hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()
    return (docs[:limit] if limit else docs), digest
