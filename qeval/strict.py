"""The base of every config model: unknown keys are errors (a typo must not be ignored), and
values are taken as the type they are written in: `batch_size: true`, `limit: "5"` or
`enabled: "yes"` are refused, not read as 1, 5 and true. An integer where a number is expected
(`utilization: 1`) is still a number; inf and nan are not."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A pydantic model that refuses keys it does not define and values of another type."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
