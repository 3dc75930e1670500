"""Resume keys: a (setup, task) result is reused only when everything that changes its numbers
is what this run would use. The key hashes named parts; the parts are stored beside it, so a
mismatch can say what changed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qeval.results.metrics import KL_OUTPUT_TYPES
from qeval.version import __version__

if TYPE_CHECKING:
    from qeval.config.setups import Setup
    from qeval.records.preflight import Preflight


def key_of(parts: dict[str, str]) -> str:
    """The resume key of a (setup, task) or a setup: any change in its parts recomputes it."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def key_difference(stored: dict[str, Any] | None, expected: dict[str, str]) -> str:
    """Why a stored result does not belong to this run, in words: the parts that differ."""
    if not stored:
        return "written by an older qeval (no key parts stored)"
    diff = [f"{k} {stored.get(k)!s:.16} -> {v!s:.16}" for k, v in expected.items() if stored.get(k) != v]
    return ", ".join(diff) or "a different key"


@dataclass(frozen=True)
class SetupKeys:
    """The resume keys of one setup in this run: its outcome's, and each task's, with the
    parts they hash (stored beside them, so a mismatch can say what changed)."""

    parts: dict[str, str]
    tasks: dict[str, dict[str, str]]

    @property
    def key(self) -> str:
        return key_of(self.parts)

    def task_key(self, task: str) -> str:
        return key_of(self.tasks[task])


def setup_keys(pre: Preflight, setup: Setup) -> SetupKeys:
    """Everything that changes a setup's numbers: the model's content, the setup, qeval, the
    backend and device, the dtype and context, the sample limit, and how requests are batched
    (padding changes the numerics: up to 0.067 nats per document under a quantized KV cache)."""
    cfg, m = pre.cfg, pre.cfg.model
    parts = {
        "model_sha256": pre.model_sha256,
        "setup": setup.id,
        "qeval": __version__,
        "backend": cfg.backend,
        "device": pre.device,
        "dtype": pre.dtype,  # resolved (the config keeps `auto`): the key of what really ran
        "max_context": str(m.max_context),
        "limit": str(cfg.limit),
        "batch_size": str(cfg.batch_size),
        "generation_batch_size": str(cfg.generation_batch_size or 4 * cfg.batch_size),
    }
    # the backend's own (vLLM: its engine settings); an engine-parity control's, its backend's
    parts |= pre.parity_key_parts.get(setup.name, pre.backend_key_parts)
    if setup.name in pre.checkpoint_sha256:  # only checkpoint setups: every other key stays as it was
        parts["checkpoint_sha256"] = pre.checkpoint_sha256[setup.name]
    return SetupKeys(
        parts,
        {
            t.name: parts | {"task": t.fingerprint} | _chat_part(t) | _teacher_part(cfg, t) | _kl_part(cfg, setup, t)
            for t in pre.tasks
        },
    )


def _kl_part(cfg: Any, setup: Setup, task: Any) -> dict[str, str]:
    """A parity control of a setup other than the baseline takes its KL against that setup's
    top-k, which that setup keeps for it: on a task scored with a KL, the control's key names its
    reference and the partner's says it kept its top-k. Only then, so every other key is what it
    was before partners kept theirs (a partner stored without its top-k is scored again)."""
    if getattr(task, "output_type", None) not in KL_OUTPUT_TYPES:
        return {}
    if setup.name in cfg.kl_partners:
        return {"topk": "kept"}
    partner = cfg.paired_with(setup)
    return {"kl_reference": partner} if partner != cfg.baseline.name else {}


def _teacher_part(cfg: Any, task: Any) -> dict[str, str]:
    """A generation task scored while `generation_divergence:` is set carries its buckets (its
    records hold the teacher-forced divergence, qeval/tasks/generation/teacher.py); only then, so
    every other key is what it was before the block existed."""
    spec = getattr(cfg, "generation_divergence", None)
    if spec is None or getattr(task, "output_type", None) != "generate_until":
        return {}
    return {"generation_divergence": spec.key_part()}


def _chat_part(task: object) -> dict[str, str]:
    """A task prompted under a chat template or system prompt carries the hash of its rendered
    template (qeval/tasks/chat.py), so a change of template re-runs it, and one whose reasoning
    block is stripped carries the token that ends it. Only then: a plain task's key is what it
    was before these keys existed (no part, not an empty one), and a kind that knows nothing of
    them needs no such attribute."""
    out = {}
    for part, attr in (("chat_template", "chat_template_sha256"), ("think_end_token", "think_end_token")):
        value = getattr(task, attr, None)
        if isinstance(value, str):
            out[part] = value
    return out
