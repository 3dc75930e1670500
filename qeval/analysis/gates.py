"""Quality gates: the run config's `gates`, and the non-inferiority verdict they give."""

from __future__ import annotations

from pydantic import Field

from qeval.strict import Strict


class Gate(Strict):
    """Non-inferiority: the drop on `task` ("all" for every task) is at most `max_drop`."""

    task: str = "all"
    max_drop: float = Field(gt=0)
    relative: bool = False
