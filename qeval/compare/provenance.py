"""What changed between two runs, from what each recorded about itself: qeval and its commit,
the engine and library versions each setup ran on, the model's and checkpoints' checksums,
the device, the config key by key, and the data each task was scored on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qeval.results.schema import Results

#: run fields that say where a run came from (results.json `run`)
_RUN_FIELDS = ("qeval_version", "git_commit", "backend", "device", "dtype", "model_sha256", "limit", "config_hash")
#: run fields that differ between any two runs and say nothing about what changed
_NOISE = {"started", "finished", "output"}


@dataclass(frozen=True)
class Change:
    """One recorded fact that differs: where it is, its value in the reference run and here
    (None: absent on that side)."""

    what: str
    a: str | None
    b: str | None


def provenance_diff(a: Results, b: Results) -> list[Change]:
    """Every recorded difference from `a` (the reference) to `b`, grouped run, config, setups,
    tasks, in a stable order."""
    out = _diff("run.", {k: getattr(a.run, k) for k in _RUN_FIELDS}, {k: getattr(b.run, k) for k in _RUN_FIELDS})
    out += _diff("run.hardware.", flatten(a.run.hardware.as_dict()), flatten(b.run.hardware.as_dict()))
    out += _diff("config.", flatten(a.config.as_dict()), flatten(b.config.as_dict()))
    out += _diff("setups.", _setup_facts(a), _setup_facts(b))
    out += _diff("tasks.", _task_facts(a), _task_facts(b))
    return out


def _setup_facts(results: Results) -> dict[str, str]:
    """Per setup: the versions it ran on, its spec id and what its quantizer or checkpoint was."""
    facts: dict[str, str] = {}
    for s in results.setups:
        facts[f"{s.name}.id"] = str(s.spec.id)
        facts |= {f"{s.name}.version.{lib}": v for lib, v in s.library_versions.items()}
        facts |= {f"{s.name}.quantization.{k}": v for k, v in flatten(s.quantization.as_dict()).items()}
    return facts


def _task_facts(results: Results) -> dict[str, str]:
    return {
        f"{t}.{k}": str(getattr(info, k))
        for t, info in results.tasks.items()
        for k in ("fingerprint", "sha256", "n", "metric", "num_fewshot")
        if getattr(info, k) is not None
    }


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested mapping as dotted keys and text values; a list of named mappings (setups) keyed
    by name, any other list as JSON."""
    out: dict[str, str] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out |= flatten(v, f"{prefix}{k}.")
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        for v in value:
            out |= flatten({k: x for k, x in v.items() if k != "name"}, f"{prefix}{v['name']}.")
    else:
        out[prefix.rstrip(".")] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return out


def _diff(prefix: str, a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    keys = list(dict.fromkeys([*a, *b]))
    return [
        Change(prefix + k, _text(a.get(k)) if k in a else None, _text(b.get(k)) if k in b else None)
        for k in keys
        if k not in _NOISE and _text(a.get(k)) != _text(b.get(k))
    ]


def _text(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else json.dumps(value, sort_keys=True)
