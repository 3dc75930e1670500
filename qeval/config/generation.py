"""The `generation_divergence:` piece of the run config: teacher-force the baseline's own
generation of every generation task through each setup, and report the divergence by
generated-token position and the accuracy by answer length (docs/tasks.md, "Divergence along
the generation"). Unset (the default), nothing changes: no extra pass, no key part."""

from __future__ import annotations

from pydantic import Field, model_validator

from qeval.strict import Strict


class GenerationDivergenceSpec(Strict):
    """Bucket edges of the generated-token positions (0 = the first generated token) and of the
    baseline's answer lengths in tokens: each list is the buckets' lower edges, ascending from
    0; the last bucket is open-ended."""

    position_buckets: list[int] = Field(default=[0, 16, 32, 64, 128, 256], min_length=1, max_length=64)
    length_buckets: list[int] = Field(default=[0, 32, 64, 128, 256], min_length=1, max_length=64)

    @model_validator(mode="after")
    def _check(self) -> GenerationDivergenceSpec:
        for name in ("position_buckets", "length_buckets"):
            edges = getattr(self, name)
            if edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
                raise ValueError(f"{name} must start at 0 and rise strictly (lower edges of the buckets)")
        return self

    def key_part(self) -> str:
        """What a generation task's resume key adds while the block is set: its records carry
        the teacher-forced divergence in these buckets."""
        return f"positions={self.position_buckets};lengths={self.length_buckets}"
