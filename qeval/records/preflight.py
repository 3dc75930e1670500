"""The Preflight record: a run checked before any model loads (run/preflight.py makes it), what
every task must say of itself (TaskInfoLike), and the precision the setups compute in."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qeval.config import RunConfig
from qeval.config.setups import Setup
from qeval.model.shape import ModelShape


@dataclass(frozen=True)
class Precision:
    """What the model computes in, and why: recorded in results.json and the report."""

    requested: str  # the config's model.dtype: auto, bfloat16-if-native, bfloat16, float16 or float32
    dtype: str  # what the setups run in
    reason: str  # one line: why this dtype (auto) or what it costs here (an emulated 16-bit dtype)
    emulated: bool = False  # a 16-bit dtype this device emulates (slow)
    fallback: str = ""  # why `auto` fell back to float32 ("this CPU has no native bfloat16"), else ""

    @property
    def short(self) -> str:
        """`dtype float32 (auto: this CPU has no native bfloat16)`, `dtype bfloat16 (auto)`, `dtype float32`."""
        if self.requested not in ("auto", "bfloat16-if-native"):
            return f"dtype {self.dtype}" + (" (emulated here: slow)" if self.emulated else "")
        return f"dtype {self.dtype} ({self.requested}{': ' + self.fallback if self.fallback else ''})"


class TaskInfoLike(Protocol):
    """What the run, the keys and the assembly need of any task, native or lm-eval."""

    @property
    def name(self) -> str: ...

    @property
    def entry(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def output_type(self) -> str: ...

    @property
    def n_docs(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def sha256(self) -> str: ...

    @property
    def compared_metric(self) -> str: ...

    @property
    def num_fewshot(self) -> int | None: ...  # None: the kind has no few-shot prompts


@dataclass
class Preflight:
    """A run checked before any model loads: what `preflight` resolved and validated."""

    cfg: RunConfig
    device: str
    tasks: list[TaskInfoLike]  # every task of the config (lm-eval groups expanded): results cover them all
    setups: list[Setup]  # the ones this invocation runs (the baseline always)
    run_tasks: list[str]  # the ones this invocation scores (--tasks)
    model_sha256: str
    shape: ModelShape | None
    #: model.dtype as asked (cfg.model.dtype, never changed) and as resolved on this device:
    #: whatever computes in, keys on or predicts from the dtype reads `dtype` below
    precision: Precision
    #: optional setups this backend/device cannot run: name -> why (reported, not run)
    skipped: dict[str, str] = field(default_factory=dict)
    #: lm-eval groups of the config -> their tasks; suites -> their entries
    groups: dict[str, list[str]] = field(default_factory=dict)
    suites: dict[str, list[str]] = field(default_factory=dict)
    #: the local model folder whose every file the checksum covers (None: a hub id or a GGUF file)
    model_dir: Path | None = None
    #: resume-key parts the backend adds (backends/__init__.py `BackendEntry.key_parts`)
    backend_key_parts: dict[str, str] = field(default_factory=dict)
    #: an engine-parity control (the baseline on another backend) -> its backend and that backend's
    #: key parts, in place of the run's
    parity_key_parts: dict[str, dict[str, str]] = field(default_factory=dict)
    #: setup -> the content checksum of the checkpoint it serves (`checkpoint:`, or the folder
    #: `qeval quantize` made): a checkpoint remade at the same path is not served from stale results
    checkpoint_sha256: dict[str, str] = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        """The concrete dtype the setups compute in (bfloat16, float16 or float32)."""
        return self.precision.dtype

    def config_json(self) -> dict[str, Any]:
        """results.json's `config` block: the config as given, but for model.dtype, which it has
        always recorded resolved (so it, and `config_hash`, read as they did when preflight
        resolved the dtype in the config itself)."""
        out = self.cfg.as_json()
        out["model"]["dtype"] = self.dtype
        return out

    def config_hash(self) -> str:
        """results.json's `run.config_hash`: the hash of `config_json()` (RunConfig.config_hash's
        recipe on the recorded block)."""
        return hashlib.sha256(json.dumps(self.config_json(), sort_keys=True).encode()).hexdigest()

    @property
    def entries(self) -> list[str]:
        """The config's own tasks, groups unexpanded: what gates on `all` and the evidence rule cover."""
        return list(dict.fromkeys(t.entry for t in self.tasks))
