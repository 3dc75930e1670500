"""The base of every results model (results.json, its performance and long-context blocks,
sweep.json): in a module of its own so those modules share it without importing each other."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

#: a gate's verdict, wherever results.json gives one
Verdict = Literal["pass", "fail", "inconclusive"]


class ResultModel(BaseModel):
    # No docstring: pydantic would give it to every subclass without one, in the JSON Schema.
    # extra="allow": a reader keeps (and writes back) fields a newer qeval added, so a file of
    # the same schema version from a newer qeval still reads (docs/architecture.md).
    model_config = ConfigDict(extra="allow")
