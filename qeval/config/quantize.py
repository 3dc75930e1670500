"""`qeval quantize`'s piece of the run config: the calibration text and the recipe settings."""

from __future__ import annotations

from pydantic import Field, model_validator

from qeval.strict import Strict


class Calibration(Strict):
    """The text `qeval quantize` calibrates on: a local JSONL / text file (`path`), or a hub
    dataset (`dataset`, loaded with `datasets.load_dataset`). Neither: the task suite's own
    training text, `<tasks_dir>/data/train.jsonl`."""

    path: str | None = None
    dataset: str | None = None
    dataset_config: str | None = None
    split: str = "train"
    revision: str | None = None
    text_field: str = "text"

    @model_validator(mode="after")
    def _one_source(self) -> Calibration:
        if self.path and self.dataset:
            raise ValueError("give calibration `path` or `dataset`, not both")
        return self


class QuantizeSpec(Strict):
    """How `qeval quantize` makes the checkpoints the vllm and hf backends serve (llm-compressor)."""

    calibration: Calibration = Calibration()
    num_samples: int = Field(default=256, gt=0)
    #: calibration sequences are cut to this many tokens (and to the model's max_context)
    max_seq_length: int = Field(default=512, gt=0)
    #: SmoothQuant's migration strength for W8A8-INT8 (llm-compressor's default)
    smoothing_strength: float = Field(default=0.8, ge=0, le=1)
    #: where checkpoints are cached, one folder per (model, scheme, calibration) key
    output_dir: str = "checkpoints"
