"""The base of every config model: unknown keys are errors (a typo must not be ignored)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A pydantic model that refuses keys it does not define."""

    model_config = ConfigDict(extra="forbid")
