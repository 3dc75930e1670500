"""The base of every config model: unknown keys are errors (a typo must not be ignored), and
values are taken as the type they are written in: `batch_size: true`, `limit: "5"` or
`enabled: "yes"` are refused, not read as 1, 5 and true. An integer where a number is expected
(`utilization: 1`) is still a number; inf and nan are not. No integer is larger than a signed
64-bit one (`batch_size: 99999999999999999999` is refused at validation, not overflowed in torch
or a float conversion later), and a seed is one that numpy, torch and Python all take."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: the largest integer a config value may hold: torch's and numpy's int64
INT_MAX = 2**63 - 1
#: seeds: numpy's RandomState takes 0..2**32-1 (torch.manual_seed and random.seed take more)
SEED_MAX = 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


def check_int_bound(value: Any) -> Any:
    """`value`, or ValueError where it (or an item of it) is an integer past INT_MAX either way."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX:
        digits = len(str(abs(value)))
        raise ValueError(f"an integer of {digits} digits is too large (at most {INT_MAX:,})")
    if isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            check_int_bound(item)
    elif isinstance(value, dict):
        for item in value.values():
            check_int_bound(item)
    return value


class Strict(BaseModel):
    """A pydantic model that refuses keys it does not define, values of another type, and
    integers past INT_MAX."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _int_bound(cls, value: Any) -> Any:
        return check_int_bound(value)
